//! The bytes of a connection, in and out: the memory the next receive writes into, lent
//! to the I/O layer until the receive completes (the connection's buffer, or a large
//! tensor's own memory, where its payload lands in place), and the output handed to a
//! writer with the memory it is in.

use std::sync::Arc;

use crate::proto::{NextRead, OutPiece};
use crate::stats::{add, Counters};
use crate::tensor::{Tensor, TensorAllocator, TensorMemory};
use crate::wire::HEADER_LEN;

use super::budget::ConnBudget;
use super::conn::{Conn, Lent, Phase, Route, Whose};
use super::push::Served;
use super::requests::Requests;

/// Header and meta of a `CHUNK` frame.
const CHUNK_HEAD: usize = HEADER_LEN + 16;

/// The memory the next receive of a connection writes into, lent by the session until the
/// receive has completed ([`Session::lend_recv`](super::Session::lend_recv),
/// [`Session::received`](super::Session::received)).
pub(crate) enum RecvLoan {
    /// The connection's receive buffer.
    Buffer(Vec<u8>),
    /// A tensor's memory (payload of a large tensor, received in place).
    Tensor(Box<dyn TensorMemory>),
}

/// A [`RecvLoan`] and where in it the bytes go: `start..start + len`; `ahead` when the
/// connection carries small frames and bytes past `len` may be read ahead and kept for
/// the next receives (false for a header or meta section read on its own, so that a large
/// payload after it can go straight into place, and for a payload received in place).
pub(crate) struct RecvPlace {
    pub mem: RecvLoan,
    pub start: usize,
    pub len: usize,
    pub ahead: bool,
}

/// Where [`Session::transmit`](super::Session::transmit) puts a connection's output: the
/// memory each piece is in, lent or shared, and the range of it to write, in order.
pub(crate) trait SendSink {
    /// Whether another piece fits.
    fn has_room(&self) -> bool;
    /// Bytes taken so far.
    fn bytes(&self) -> u64;
    /// Bytes `start..start + len` of arena block `block`, lent here (`buf`).
    fn block(&mut self, block: u32, buf: Box<[u8]>, start: usize, len: usize);
    /// Bytes `start..start + len` of arena block `block`, lent earlier in this write.
    fn in_block(&mut self, block: u32, start: usize, len: usize);
    /// Bytes `start..start + len` of the contents of `tensor`.
    fn tensor(&mut self, tensor: Arc<Tensor>, start: usize, len: usize);
}

/// The tensor the payload `route` of connection `slot` (with the peer's requests `served`)
/// leads to: an item of one of our requests, or of a push of the peer; memory for a chunked
/// tensor is taken when its first bytes arrive.
pub(crate) fn tensor_for<'a>(
    requests: &'a mut Requests,
    served: &'a mut Served,
    slot: u32,
    route: Route,
    alloc: &dyn TensorAllocator,
    budget: &ConnBudget,
) -> Option<&'a mut Tensor> {
    match route.whose {
        Whose::Peers => served
            .push_mut(route.handle)?
            .tensor_mut(route.index, alloc, budget),
        Whose::Ours => requests.tensor_mut(route.handle, route.index, slot, alloc, budget),
    }
}

/// Why a connection cannot receive.
pub(crate) struct BufferFull;

/// The memory the next bytes of connection `slot` (`conn`) must land in, lent out; `None`
/// when nothing is to be received on it (closing, closed, or a receive is in flight).
/// Payload of a tensor of at least `zero_copy_min` bytes with memory of its own lands in
/// that memory.
pub(crate) fn lend(
    conn: &mut Conn,
    slot: u32,
    requests: &mut Requests,
    alloc: &dyn TensorAllocator,
    zero_copy_min: u64,
) -> Result<Option<RecvPlace>, BufferFull> {
    if conn.phase == Phase::Closing || conn.proto.is_closed() || conn.lent.is_some() || conn.paused
    {
        return Ok(None);
    }
    if let Some(place) = lend_direct(conn, slot, requests, alloc, zero_copy_min) {
        return Ok(Some(place));
    }
    let decoder = conn.proto.decoder();
    let limit = if decoder.chunks_pending() > 0 && decoder.is_idle() {
        // A chunk is most likely next: read just its header and meta, so that its payload
        // is received in place rather than read ahead into the buffer.
        CHUNK_HEAD
    } else if let Some(missing) = decoder.meta_missing().filter(|&m| m > 0) {
        // The rest of a meta section: payload after it may go straight into place.
        missing
    } else if decoder.is_idle()
        && !matches!(decoder.last_payload_max(), Some(m) if m < zero_copy_min)
    {
        // Large frames are arriving (or none has since the handshake): read the next
        // header on its own, then its meta section (above), so that a large payload goes
        // straight into place from its first byte. Connections carrying small frames keep
        // reading as much as the buffer holds.
        HEADER_LEN
    } else {
        usize::MAX
    };
    let Some((buf, start, len)) = decoder.lend(limit.min(u32::MAX as usize)) else {
        // Buffered bytes are decoded after every receive; this means the decoder is stuck
        // on a frame it cannot finish.
        return Err(BufferFull);
    };
    conn.lent = Some(Lent::Buffer);
    Ok(Some(RecvPlace {
        mem: RecvLoan::Buffer(buf),
        start,
        len,
        ahead: limit == usize::MAX,
    }))
}

/// Lends the memory of the tensor the decoder's next payload bytes belong to, when it is
/// at least `min` bytes and has memory of its own (allocated now, for a chunked tensor's
/// first bytes).
fn lend_direct(
    conn: &mut Conn,
    slot: u32,
    requests: &mut Requests,
    alloc: &dyn TensorAllocator,
    min: u64,
) -> Option<RecvPlace> {
    let NextRead::Payload {
        target,
        offset,
        len,
    } = conn.proto.next_read()
    else {
        return None;
    };
    let route = conn.route(target)?;
    let t = tensor_for(requests, &mut conn.served, slot, route, alloc, &conn.budget)?;
    // The tensor's size decides, not what is left of it: once a large tensor is being
    // received in place, its tail is too (a buffered read would also pull in what follows).
    if (t.byte_len() as u64) < min || t.is_inline() {
        return None;
    }
    let room = t.byte_len().checked_sub(offset as usize)?;
    let n = (len.min(u32::MAX as u64) as usize).min(room);
    if n == 0 {
        return None;
    }
    let mem = t.lend_memory()?;
    conn.lent = Some(Lent::Tensor(route));
    Some(RecvPlace {
        mem: RecvLoan::Tensor(mem),
        start: offset as usize,
        len: n,
        ahead: false,
    })
}

/// The memory lent for connection `slot` is back with `n` bytes written: puts it back.
/// Memory of a tensor whose request was given up meanwhile is dropped. Returns whether it
/// was the memory the connection lent.
pub(crate) fn restore(
    conn: &mut Conn,
    slot: u32,
    requests: &mut Requests,
    alloc: &dyn TensorAllocator,
    mem: RecvLoan,
    n: usize,
) -> bool {
    match (conn.lent.take(), mem) {
        (Some(Lent::Buffer), RecvLoan::Buffer(buf)) => {
            conn.proto.decoder().restore(buf, n);
        }
        (Some(Lent::Tensor(route)), RecvLoan::Tensor(m)) => {
            let t = tensor_for(requests, &mut conn.served, slot, route, alloc, &conn.budget);
            if let Some(t) = t {
                // Given up and replaced meanwhile: not this memory's tensor.
                drop(t.restore_memory(m));
            }
            conn.proto.decoder().payload_received(n as u64);
        }
        (lent, _) => {
            log::error!("connection {slot}: received into memory it did not lend");
            conn.lent = lent;
            return false;
        }
    }
    true
}

/// What [`transmit`] did.
pub(crate) enum Transmitted {
    /// Whether it gave the sink any output.
    Gave(bool),
    /// Nothing is left to say and the protocol has closed: close the connection.
    Done,
    /// The output names a tensor the connection does not hold (a bug): close it.
    Broken,
}

/// Hands the output of connection `conn` to `sink`, piece by piece with the memory it is
/// in, while the sink has room and holds less than `max` bytes; arena blocks are lent out
/// (once each) until given back, tensors shared.
pub(crate) fn transmit(
    conn: &mut Conn,
    max: u64,
    sink: &mut impl SendSink,
    counters: &Counters,
) -> Transmitted {
    if !matches!(conn.phase, Phase::Open | Phase::Handshaking) {
        return Transmitted::Gave(false);
    }
    conn.proto.encoder().fill(max);
    count_arena(counters, conn);
    if conn.proto.encoder().ready_bytes() == 0 {
        return match conn.proto.is_closed() {
            true => Transmitted::Done,
            false => Transmitted::Gave(false),
        };
    }
    let Conn {
        proto, out_tensors, ..
    } = conn;
    let enc = proto.encoder();
    let mut any = false;
    let mut i = 0;
    while sink.has_room() && sink.bytes() < max {
        let Some(piece) = enc.out_piece(i) else {
            break;
        };
        i += 1;
        match piece {
            OutPiece::Arena { block, start, len } => match enc.lend_block(block) {
                Some(buf) => sink.block(block, buf, start, len),
                None => sink.in_block(block, start, len),
            },
            OutPiece::Tensor { token, offset, len } => {
                let t = out_tensors.get(token as usize).filter(|t| {
                    offset
                        .checked_add(len)
                        .is_some_and(|end| end <= t.byte_len() as u64)
                });
                match t {
                    Some(t) => sink.tensor(t.clone(), offset as usize, len as usize),
                    None => return Transmitted::Broken,
                }
            }
        }
        any = true;
    }
    Transmitted::Gave(any)
}

/// Brings the loop's `send_arena_bytes`, `send_blocks_allocated` and `frames_out` up to
/// date with connection `conn`'s encoder.
pub(crate) fn count_arena(counters: &Counters, conn: &mut Conn) {
    let frames = conn.proto.encoder().frames_out();
    if frames != conn.counted.frames_out {
        add(&counters.frames_out, frames - conn.counted.frames_out);
        conn.counted.frames_out = frames;
    }
    let blocks = conn.proto.encoder().blocks_allocated();
    if blocks != conn.counted.blocks_allocated {
        add(
            &counters.send_blocks_allocated,
            blocks - conn.counted.blocks_allocated,
        );
        conn.counted.blocks_allocated = blocks;
    }
    let now = conn.proto.encoder().arena_bytes();
    if now != conn.arena_counted {
        let delta = (now as u64).wrapping_sub(conn.arena_counted as u64);
        add(&counters.send_arena_bytes, delta);
        conn.arena_counted = now;
    }
}
