//! One connection's protocol state: its codec, its phase, the requests waiting for it to
//! open, the tensors its output references, and what is being received on it.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use slab::Slab;

use crate::ctx::{CtxKey, CtxSlab};
use crate::error::{Error, ErrorKind};
use crate::proto::{Connection, NextRead, PayloadTarget};
use crate::tensor::{Tensor, TensorAllocator};

use super::budget::ConnBudget;
use super::reply::IncomingPush;
use super::request::Pending;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Waiting to retry a failed connect.
    Backoff,
    /// Waiting for the connect to complete.
    Connecting,
    /// Connected, handshake in progress.
    Handshaking,
    /// Usable.
    Open,
    /// Closed: waiting for the loop to finish its operations and release it.
    Closing,
}

pub(crate) struct Conn {
    pub proto: Connection,
    pub phase: Phase,
    /// Unique per connection and per connect attempt, so a timer never acts on a later
    /// connection that reuses its slot.
    pub generation: u32,
    /// `Some` for connections this task opened: the peer and lane they serve.
    pub outgoing: Option<(SocketAddr, u32)>,
    pub attempts: u32,
    /// Requests waiting for the handshake (context handles).
    pub waiting: VecDeque<u64>,
    /// Whether the connection is in the session's list of connections with output.
    pub dirty: bool,
    /// Set when the connection is being closed for an error; what in-flight requests get.
    pub failure: Error,
    /// Tensors whose bytes the encoder references, by token, until written.
    pub out_tensors: Slab<Arc<Tensor>>,
    /// Handle of the last frame decoded: payload of inline tensors belongs to it.
    pub cur_handle: u64,
    /// Whether the last frame decoded is a `PUSH` (the peer's request) rather than a
    /// `RESPONSE` (an answer to ours): the peer's handles and ours are separate namespaces.
    pub cur_is_push: bool,
    /// The last `CHUNK` decoded: handle, item index, and where its bytes end.
    pub cur_chunk: (u64, u32, u64),
    /// Chunked tensors declared and not complete, in the decoder's order: whether each was
    /// declared by a `PUSH`, and its length.
    pub chunk_owners: VecDeque<(bool, u64)>,
    /// Pushes being received (server side).
    pub incoming: Vec<IncomingPush>,
    /// Recvs being answered (server side): handle and items still owed.
    pub recvs: Vec<(u64, u32)>,
    /// When the frame head being received (partly) started to arrive.
    pub head_since: Option<Instant>,
    /// Whether a `FrameHead` timer is pending for this connection.
    pub head_timer: bool,
    /// What the receive in flight writes into, lent out until it completes.
    pub lent: Option<Lent>,
    /// The encoder's arena bytes as last added to the loop's `send_arena_bytes`.
    pub arena_counted: usize,
    /// Its account of the receive budget.
    pub budget: ConnBudget,
    /// Progress of bytes the peer owes (a frame begun, chunked tensors announced).
    pub progress: Progress,
    /// When bytes last arrived (or the connection opened): for the heartbeat.
    pub last_heard: Instant,
    /// Whether a `Heartbeat` timer is pending for this connection.
    pub heartbeat_timer: bool,
    /// Index of its peer's metric block in the session's table (`metrics::NO_PEER`: none).
    pub metrics: u32,
}

/// A window in which a connection that owes bytes must deliver some of them.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Progress {
    /// When the window started; `None` while nothing is owed.
    pub since: Option<Instant>,
    /// Bytes received in the window.
    pub bytes: u64,
    /// Whether a `Progress` timer is pending.
    pub timer: bool,
}

impl Conn {
    pub fn new(
        proto: Connection,
        phase: Phase,
        generation: u32,
        budget: ConnBudget,
        now: Instant,
    ) -> Conn {
        Conn {
            proto,
            phase,
            generation,
            outgoing: None,
            attempts: 0,
            waiting: VecDeque::new(),
            dirty: false,
            failure: Error::new(ErrorKind::ConnectionLost),
            out_tensors: Slab::new(),
            cur_handle: 0,
            cur_is_push: false,
            cur_chunk: (0, 0, 0),
            chunk_owners: VecDeque::new(),
            incoming: Vec::new(),
            recvs: Vec::new(),
            head_since: None,
            head_timer: false,
            lent: None,
            arena_counted: 0,
            budget,
            progress: Progress::default(),
            last_heard: now,
            heartbeat_timer: false,
            metrics: super::metrics::NO_PEER,
        }
    }

    /// Drops the references the encoder no longer needs.
    pub fn release_tokens(&mut self) {
        let Conn {
            proto, out_tensors, ..
        } = self;
        proto.encoder().take_released(|t| {
            out_tensors.try_remove(t as usize);
        });
    }
}

/// Adds connection `slot` to the list of connections with output, once.
pub(crate) fn mark_dirty(dirty: &mut Vec<u32>, conn: &mut Conn, slot: u32) {
    if !conn.dirty {
        conn.dirty = true;
        dirty.push(slot);
    }
}

/// Where payload goes: the item of a push the peer sent, or of an answer to our request.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Route {
    handle: u64,
    index: u32,
    is_push: bool,
}

/// The route of payload for `target`, from the current frame (inline tensors) or the
/// oldest incomplete chunked tensor (chunks).
pub(crate) fn route(
    target: PayloadTarget,
    cur_handle: u64,
    cur_is_push: bool,
    chunk_owners: &VecDeque<(bool, u64)>,
) -> Option<Route> {
    match target {
        PayloadTarget::Tensor { index } => Some(Route {
            handle: cur_handle,
            index,
            is_push: cur_is_push,
        }),
        PayloadTarget::Chunk { handle, index } => Some(Route {
            handle,
            index,
            is_push: chunk_owners.front()?.0,
        }),
        PayloadTarget::Opaque => None,
    }
}

/// The tensor receiving payload for item `index` of the request or push `handle`;
/// memory for a chunked tensor is taken from the request's allocator (or `default`) when its
/// first bytes arrive.
pub(crate) fn tensor_for<'a>(
    ctxs: &'a mut CtxSlab<Pending>,
    incoming: &'a mut [IncomingPush],
    slot: u32,
    route: Route,
    default: &dyn TensorAllocator,
    budget: &ConnBudget,
) -> Option<&'a mut Tensor> {
    let Route {
        handle,
        index,
        is_push,
    } = route;
    if is_push {
        let p = incoming.iter_mut().find(|p| p.handle == handle)?;
        return p.tensor_mut(index, default, budget);
    }
    let p = ctxs.get_mut(CtxKey::from_raw(handle)).ok()?;
    if p.conn != slot {
        return None;
    }
    let alloc: &dyn TensorAllocator = match &p.alloc {
        Some(a) => &**a,
        None => default,
    };
    p.state.tensor_mut(index, alloc, budget)
}

/// What a connection lent to its receive in flight ([`Session::lend_recv`](super::Session::lend_recv)).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Lent {
    /// Its receive buffer.
    Buffer,
    /// The memory of the tensor `route` leads to.
    Tensor(Route),
}

/// Where the next payload bytes of a connection may be received directly.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DirectPlace {
    pub route: Route,
    /// Where in the tensor, and how many bytes.
    pub offset: usize,
    pub len: usize,
}

/// Where the next payload bytes of `conn` may be received directly: when the decoder offers
/// bytes of a tensor of at least `min` bytes that has memory of its own (allocated now, for
/// a chunked tensor's first bytes).
pub(crate) fn direct_place(
    conn: &mut Conn,
    ctxs: &mut CtxSlab<Pending>,
    min: u64,
    alloc: &dyn TensorAllocator,
    slot: u32,
) -> Option<DirectPlace> {
    let NextRead::Payload {
        target,
        offset,
        len,
    } = conn.proto.next_read()
    else {
        return None;
    };
    let route = route(
        target,
        conn.cur_handle,
        conn.cur_is_push,
        &conn.chunk_owners,
    )?;
    let tensor = tensor_for(ctxs, &mut conn.incoming, slot, route, alloc, &conn.budget)?;
    // The tensor's size decides, not what is left of it: once a large tensor is being
    // received in place, its tail is too (a buffered read would also pull in what follows).
    if (tensor.byte_len() as u64) < min || tensor.is_inline() {
        return None;
    }
    let room = tensor.byte_len().checked_sub(offset as usize)?;
    let n = (len.min(u32::MAX as u64) as usize).min(room);
    if n == 0 {
        return None;
    }
    Some(DirectPlace {
        route,
        offset: offset as usize,
        len: n,
    })
}
