//! Frame encoder: frames in, an ordered list of byte segments out.
//!
//! Header and meta bytes (and the contents of tiny tensors, where a copy is cheaper than
//! an extra `iovec`) are written into an arena of fixed blocks; tensor contents above the
//! inline threshold are referenced by a caller-chosen `token` and never copied. The I/O
//! layer turns [`Piece`]s into `iovec`s, resolving tokens to the tensors it keeps alive,
//! writes them, and reports the bytes written with [`Encoder::advance`].
//!
//! Arena blocks never move or shrink while a segment refers to them, so an `iovec` built
//! from [`Encoder::pieces`] stays valid while more frames are encoded — as an io_uring
//! write in flight requires. A block returns to the free list when its last segment has
//! been written; after warm-up, encoding allocates nothing. An encoder keeps as many idle
//! blocks as its recent output needed at once, within
//! [`keep_bytes`](EncoderConfig::keep_bytes), and no idle block larger than the standard
//! size: the memory of a burst of output (a peer slow to read, a frame with a very large
//! meta section) is returned once it is written and the output has drained a few times
//! with less in use, so a task with many connections does not hold each one's largest
//! backlog for its whole life (the rule is in `arena.rs`).
//!
//! Large tensors are cut into `CHUNK` frames (specification 4.8). Chunks are added to the
//! output only as it drains ([`Encoder::fill`]), so frames encoded during a large transfer
//! are written between its chunks.

use crate::wire::{
    self, emit_pull_meta, emit_pull_rows_meta, emit_pull_rows_versioned_meta, emit_recv_meta,
    pull_meta_len, pull_rows_versioned_meta_len, recv_meta_len, ChunkRepr, ErrorRepr, Header,
    HeaderRepr, HelloRepr, FrameKind, Missing, ResponseEntry, Status, TensorMeta, Versions,
    HEADER_LEN,
};
use std::collections::VecDeque;

use super::arena::Arena;
use super::items::{is_rows_block, TensorItem};
pub use super::items::{OutTensor, PushItem, ResponseItem, RowsItem, RowsQuery, COPY_TOKEN};

/// Encoder settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EncoderConfig {
    /// Largest frame the peer accepts: its announced `max_frame`, or
    /// [`wire::Limits::MIN_FRAME`] before the handshake.
    pub max_frame: u32,
    /// Tensors above this many bytes are sent as chunks of at most this size.
    pub chunk_size: u32,
    /// Tensors up to this many bytes are copied into the arena; larger ones are referenced.
    pub inline_threshold: usize,
    /// Size of an arena block; a frame whose header and meta are larger gets a block of
    /// its own.
    pub block_size: usize,
    /// Most bytes of arena blocks kept once the output that needed them is written, beyond
    /// the two idle blocks always kept: up to what recent output needed at once.
    pub keep_bytes: usize,
}

/// Default [`EncoderConfig::keep_bytes`]: eight blocks of the standard size.
pub const DEFAULT_KEEP_BYTES: usize = 1 << 20;

impl Default for EncoderConfig {
    fn default() -> Self {
        EncoderConfig {
            max_frame: wire::Limits::default().max_frame,
            chunk_size: 4 << 20,
            inline_threshold: 256,
            block_size: 128 << 10,
            keep_bytes: DEFAULT_KEEP_BYTES,
        }
    }
}

pub use super::output::{OutPiece, Piece, Segment};

pub use super::error::EncodeError;

#[derive(Debug, Clone, Copy)]
struct ChunkJob {
    handle: u64,
    index: u32,
    token: u64,
    byte_len: u64,
    next: u64,
}

/// How one tensor of a frame travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Placement {
    None,
    Copy,
    Reference,
    Chunked,
}


/// Encoder of one direction of a connection.
#[derive(Debug)]
pub struct Encoder {
    cfg: EncoderConfig,
    arena: Arena,
    ready: VecDeque<Segment>,
    ready_bytes: u64,
    front_done: u64,
    jobs: VecDeque<ChunkJob>,
    /// Tokens whose bytes the encoder no longer needs (copied, or fully written).
    released: Vec<u64>,
    /// `timeout_ms` of the requests queued next (see [`Encoder::set_request_timeout`]).
    request_timeout_ms: u32,
    /// Frames queued so far.
    frames_out: u64,
    /// Bytes of arena segments queued and not written: what the queued frames copied.
    copied_bytes: u64,
    /// The limits the peer announced (the defaults until its hello).
    peer_limits: wire::Limits,
    /// The optional features the handshake negotiated.
    features: wire::WireFeatures,
}

const CHUNK_FRAME_OVERHEAD: u32 = (HEADER_LEN + 16) as u32;

impl Encoder {
    /// An encoder with one arena block (and a small one for frames queued while the
    /// first is out with a write).
    pub fn new(cfg: EncoderConfig) -> Encoder {
        Encoder {
            cfg,
            arena: Arena::new(cfg.block_size, cfg.keep_bytes),
            ready: VecDeque::new(),
            ready_bytes: 0,
            front_done: 0,
            jobs: VecDeque::new(),
            released: Vec::new(),
            request_timeout_ms: 0,
            frames_out: 0,
            copied_bytes: 0,
            peer_limits: wire::Limits::default(),
            features: wire::WireFeatures::NONE,
        }
    }

    /// The settings in force.
    pub fn config(&self) -> &EncoderConfig {
        &self.cfg
    }

    /// Sets the `timeout_ms` written into the requests queued from now on (the time the
    /// requester still waits for the answer; 0 for none), until it is set again.
    pub fn set_request_timeout(&mut self, ms: u32) {
        self.request_timeout_ms = ms;
    }

    /// Adopts the `max_frame` the peer announced in its hello.
    pub fn set_peer_max_frame(&mut self, max_frame: u32) {
        self.cfg.max_frame = max_frame;
    }

    /// Adopts the limits the peer announced in its hello: what it accepts, which answers
    /// queued from now on must respect ([`wire::Limits`]; its `max_frame` as
    /// [`set_peer_max_frame`](Self::set_peer_max_frame)).
    pub fn set_peer_limits(&mut self, limits: wire::Limits) {
        self.cfg.max_frame = limits.max_frame;
        self.peer_limits = limits;
    }

    /// The limits the peer announced (the defaults before its hello).
    pub fn peer_limits(&self) -> &wire::Limits {
        &self.peer_limits
    }

    /// Adopts the optional features the handshake negotiated: frames queued from now on
    /// may use them.
    pub fn set_features(&mut self, features: wire::WireFeatures) {
        self.features = features;
    }

    /// The optional features frames may use (none before the handshake).
    pub fn features(&self) -> wire::WireFeatures {
        self.features
    }

    /// Frames queued so far.
    pub fn frames_out(&self) -> u64 {
        self.frames_out
    }

    /// Bytes the queued frames copied into the arena (headers, metas, small tensors,
    /// blocks written in place) and that are not written yet: the memory queued output
    /// holds beyond the tensors it references.
    pub fn copied_bytes(&self) -> u64 {
        self.copied_bytes
    }

    /// Bytes queued and not written yet: the frames ready to write and the contents of the
    /// chunked tensors still to be cut into `CHUNK` frames.
    pub fn queued_bytes(&self) -> u64 {
        let jobs: u64 = self.jobs.iter().map(|j| j.byte_len - j.next).sum();
        self.ready_bytes + jobs
    }

    /// Largest chunk that fits both the chunk size and the peer's frame limit.
    pub fn chunk_limit(&self) -> u64 {
        let frame_room = self.cfg.max_frame.saturating_sub(CHUNK_FRAME_OVERHEAD);
        self.cfg.chunk_size.min(frame_room).max(1) as u64
    }

    /// Whether everything encoded has been written.
    pub fn is_empty(&self) -> bool {
        self.ready.is_empty() && self.jobs.is_empty()
    }

    /// Bytes queued and ready to write (chunks not yet added by [`fill`](Self::fill) excluded).
    pub fn ready_bytes(&self) -> u64 {
        self.ready_bytes - self.front_done
    }

    /// Hands every released token to `f`: tokens of tensors passed to
    /// [`push`](Self::push) or [`response`](Self::response) whose bytes were copied into a
    /// frame or have been completely written. Each token is released once.
    pub fn take_released(&mut self, mut f: impl FnMut(u64)) {
        for t in self.released.drain(..) {
            f(t);
        }
    }

    /// Arena blocks holding memory (in use, or idle and kept for reuse).
    pub fn block_count(&self) -> usize {
        self.arena.block_count()
    }

    /// Arena blocks allocated since the encoder was made (its first two included): after
    /// warm-up, a steady load allocates none.
    pub fn blocks_allocated(&self) -> u64 {
        self.arena.allocated()
    }

    /// Bytes of the arena blocks this encoder holds: in use, lent to a write, or idle and
    /// kept. Changes only when a block is allocated or freed.
    pub fn arena_bytes(&self) -> usize {
        self.arena.bytes()
    }

    /// Chunked tensors whose chunks are not all queued yet.
    pub fn chunks_pending(&self) -> usize {
        self.jobs.len()
    }

    fn queue(&mut self, seg: Segment) {
        if seg.len() == 0 {
            return;
        }
        if let Segment::Arena { block, start, len } = seg {
            // Merge with the previous segment when it ends where this one starts.
            if let Some(Segment::Arena {
                block: pb,
                start: ps,
                len: pl,
            }) = self.ready.back_mut()
            {
                if *pb == block && *ps + *pl == start {
                    *pl += len;
                    self.ready_bytes += len as u64;
                    self.copied_bytes += len as u64;
                    return;
                }
            }
            self.arena.hold(block as usize);
            self.copied_bytes += len as u64;
        }
        self.ready_bytes += seg.len();
        self.ready.push_back(seg);
    }

    /// Writes a header plus `body_len` arena bytes (meta and copied payload) and returns
    /// the block, its start and the body region to fill.
    fn frame(&mut self, header: HeaderRepr, body_len: usize) -> (usize, usize, &mut [u8]) {
        let (block, start) = self.arena.alloc(HEADER_LEN + body_len);
        let region = &mut self.arena.buf_mut(block)[start..start + HEADER_LEN + body_len];
        let (h, body) = region.split_at_mut(HEADER_LEN);
        header.emit(&mut Header::new_unchecked(h));
        self.frames_out += 1;
        (block, start, body)
    }

    fn check_size(&self, meta_len: usize, payload_len: u64) -> Result<(), EncodeError> {
        let len = HEADER_LEN as u64 + meta_len as u64 + payload_len;
        if len > self.cfg.max_frame as u64 || meta_len > u32::MAX as usize {
            return Err(EncodeError::FrameTooLarge {
                len,
                max: self.cfg.max_frame,
            });
        }
        Ok(())
    }

    /// Queues a frame whose meta (`header.meta_len` bytes) is written by `emit`, followed
    /// by a copy of `payload` (`header.payload_len` bytes).
    fn simple(
        &mut self,
        header: HeaderRepr,
        payload: &[u8],
        emit: impl FnOnce(&mut [u8]),
    ) -> Result<(), EncodeError> {
        let meta_len = header.meta_len as usize;
        let (block, start, body) = self.frame(header, meta_len + payload.len());
        emit(&mut body[..meta_len]);
        body[meta_len..].copy_from_slice(payload);
        self.queue(Segment::Arena {
            block: block as u32,
            start: start as u32,
            len: (HEADER_LEN + meta_len + payload.len()) as u32,
        });
        Ok(())
    }

    /// The `timeout_ms` of a frame of `kind`: the one set for requests, 0 otherwise.
    fn timeout_for(&self, kind: FrameKind) -> u32 {
        if kind.is_request() {
            self.request_timeout_ms
        } else {
            0
        }
    }

    /// Queues a `CANCEL` of request `handle`: of the items `items`, or of the whole request
    /// when `items` is empty.
    pub fn cancel(&mut self, handle: u64, items: &[u32]) -> Result<(), EncodeError> {
        let len = wire::cancel_meta_len(items.len());
        let header = self.header(FrameKind::Cancel, handle, items.len() as u32, len, 0)?;
        self.simple(header, &[], |meta| wire::emit_cancel_meta(items, meta))
    }

    /// Queues a `STATS` request (no meta, no payload).
    pub fn stats(&mut self, handle: u64) -> Result<(), EncodeError> {
        let header = self.header(FrameKind::Stats, handle, 0, 0, 0)?;
        self.simple(header, &[], |_| {})
    }

    /// Queues a `CHECKPOINT` request (no meta, no payload).
    pub fn checkpoint(&mut self, handle: u64) -> Result<(), EncodeError> {
        let header = self.header(FrameKind::Checkpoint, handle, 0, 0, 0)?;
        self.simple(header, &[], |_| {})
    }

    /// A header for `kind` after checking the frame fits the peer's limit.
    fn header(
        &self,
        kind: FrameKind,
        handle: u64,
        count: u32,
        meta_len: usize,
        payload_len: usize,
    ) -> Result<HeaderRepr, EncodeError> {
        self.check_size(meta_len, payload_len as u64)?;
        Ok(HeaderRepr {
            kind,
            end: kind == FrameKind::Pong,
            status: Status::Ok,
            timeout_ms: self.timeout_for(kind),
            count,
            handle,
            meta_len: meta_len as u32,
            payload_len: payload_len as u32,
        })
    }

    /// Queues a `HELLO` (`ack` false) or `HELLO_ACK` (`ack` true).
    pub fn hello(&mut self, hello: &HelloRepr<'_>, ack: bool) -> Result<(), EncodeError> {
        if hello.check().is_err() || (ack && !hello.token.is_empty()) {
            return Err(EncodeError::BadHello);
        }
        let kind = if ack { FrameKind::HelloAck } else { FrameKind::Hello };
        let len = hello.buffer_len();
        let header = self.header(kind, 0, 0, len, 0)?;
        self.simple(header, &[], |b| hello.emit(b))
    }

    /// Queues a `PING` carrying `payload` (copied).
    pub fn ping(&mut self, handle: u64, payload: &[u8]) -> Result<(), EncodeError> {
        let header = self.header(FrameKind::Ping, handle, 0, 0, payload.len())?;
        self.simple(header, payload, |_| {})
    }

    /// Queues a `PONG` echoing `payload` (copied).
    pub fn pong(&mut self, handle: u64, payload: &[u8]) -> Result<(), EncodeError> {
        let header = self.header(FrameKind::Pong, handle, 0, 0, payload.len())?;
        self.simple(header, payload, |_| {})
    }

    /// Queues a `PONG` of `len` payload bytes and returns the region to fill with them.
    pub fn pong_with(&mut self, handle: u64, len: usize) -> Result<&mut [u8], EncodeError> {
        let header = self.header(FrameKind::Pong, handle, 0, 0, len)?;
        let (block, start, _) = self.frame(header, len);
        self.queue(Segment::Arena {
            block: block as u32,
            start: start as u32,
            len: (HEADER_LEN + len) as u32,
        });
        let at = start + HEADER_LEN;
        Ok(&mut self.arena.buf_mut(block)[at..at + len])
    }

    /// Queues a `RECV` (one key) or `FUSED_RECV` (`fused`, one or more keys).
    pub fn recv<K: AsRef<[u8]>>(
        &mut self,
        handle: u64,
        step_id: u64,
        keys: &[K],
        fused: bool,
    ) -> Result<(), EncodeError> {
        let count_ok = if fused {
            !keys.is_empty()
        } else {
            keys.len() == 1
        };
        if !count_ok || keys.len() > u32::MAX as usize {
            return Err(EncodeError::BadCount);
        }
        if keys
            .iter()
            .any(|k| k.as_ref().is_empty() || k.as_ref().len() > u16::MAX as usize)
        {
            return Err(EncodeError::BadKey);
        }
        let kind = if fused { FrameKind::FusedRecv } else { FrameKind::Recv };
        let len = recv_meta_len(keys);
        let header = self.header(kind, handle, keys.len() as u32, len, 0)?;
        self.simple(header, &[], |b| emit_recv_meta(step_id, keys, b))
    }

    /// Queues a `PULL` of `ids`.
    pub fn pull(&mut self, handle: u64, ids: &[u64]) -> Result<(), EncodeError> {
        if ids.is_empty() || ids.len() > u32::MAX as usize {
            return Err(EncodeError::BadCount);
        }
        let len = pull_meta_len(ids.len());
        let header = self.header(FrameKind::Pull, handle, ids.len() as u32, len, 0)?;
        self.simple(header, &[], |b| emit_pull_meta(ids, b))
    }

    /// Queues a `RESPONSE` of one entry, item `index` with the rows block `block` (live,
    /// unchunked), whose contents `fill` writes straight into the frame. `fill` returns
    /// the item's status and pushes into `missing` the positions of rows it did not have.
    /// When the status is `OK` and no row is missing, the frame is queued and `Ok(None)`
    /// returned; otherwise nothing is queued and what `fill` wrote is copied into
    /// `spill` (cleared first) for the caller to answer another way: `Ok(Some(status))`.
    /// Fails with [`EncodeError::FrameTooLarge`] (before calling `fill`) when the frame
    /// would not fit the peer's `max_frame` or the chunk size.
    #[allow(clippy::too_many_arguments)]
    pub fn response_block(
        &mut self,
        handle: u64,
        end: bool,
        index: u32,
        block: &TensorMeta<'_>,
        missing: &mut Vec<u32>,
        spill: &mut Vec<u8>,
        fill: impl FnOnce(&mut [u8], &mut Vec<u32>) -> Status,
    ) -> Result<Option<Status>, EncodeError> {
        let block = TensorMeta {
            chunked: false,
            ..*block
        };
        if block.dead || block.check(&UNLIMITED).is_err() {
            return Err(EncodeError::BadTensor);
        }
        let entry = ResponseEntry {
            index,
            status: Status::Ok,
            tensor: Some(block),
            missing: Missing::default(),
            versions: Versions::default(),
        };
        let meta_len = entry.buffer_len();
        self.check_size(meta_len, block.byte_len)?;
        if block.byte_len > self.chunk_limit() {
            return Err(EncodeError::FrameTooLarge {
                len: block.byte_len,
                max: self.chunk_limit() as u32,
            });
        }
        let body = meta_len + block.byte_len as usize;
        let (b, start) = self.arena.alloc(HEADER_LEN + body);
        let at = start + HEADER_LEN + meta_len;
        let out = &mut self.arena.buf_mut(b)[at..at + block.byte_len as usize];
        let from = missing.len();
        let status = fill(out, missing);
        if !status.is_ok() || missing.len() > from {
            spill.clear();
            spill.extend_from_slice(out);
            // Nothing after this frame was reserved in the block: take it back.
            self.arena.unreserve(b, start);
            return Ok(Some(status));
        }
        let header = HeaderRepr {
            kind: FrameKind::Response,
            end,
            status: Status::Ok,
            timeout_ms: 0,
            count: 1,
            handle,
            meta_len: meta_len as u32,
            payload_len: block.byte_len as u32,
        };
        let region = &mut self.arena.buf_mut(b)[start..start + HEADER_LEN + meta_len];
        let (h, meta) = region.split_at_mut(HEADER_LEN);
        header.emit(&mut Header::new_unchecked(h));
        entry.emit(meta);
        self.frames_out += 1;
        self.queue(Segment::Arena {
            block: b as u32,
            start: start as u32,
            len: (HEADER_LEN + body) as u32,
        });
        Ok(None)
    }

    /// Queues a `PULL_ROWS` of `tables`. Held versions need `ROW_VERSIONS` negotiated
    /// ([`EncodeError::NotNegotiated`] otherwise), as many as the ids.
    pub fn pull_rows(&mut self, handle: u64, tables: &[RowsQuery<'_>]) -> Result<(), EncodeError> {
        if tables.is_empty() || tables.len() > u32::MAX as usize {
            return Err(EncodeError::BadCount);
        }
        let versions = self.features.contains(wire::WireFeatures::ROW_VERSIONS);
        let mut len = 0;
        for t in tables {
            let block = TensorMeta {
                chunked: false,
                ..t.block
            };
            if !is_rows_block(&block, t.ids.len()) || block.check(&UNLIMITED).is_err() {
                return Err(EncodeError::BadTensor);
            }
            let held = !t.held.is_empty();
            if held && !versions {
                return Err(EncodeError::NotNegotiated);
            }
            if held && t.held.len() != t.ids.len() {
                return Err(EncodeError::BadCount);
            }
            len += pull_rows_versioned_meta_len(block.dims.len(), t.ids.len(), held);
        }
        let header = self.header(FrameKind::PullRows, handle, tables.len() as u32, len, 0)?;
        self.simple(header, &[], |b| {
            let mut at = 0;
            for t in tables {
                let block = TensorMeta {
                    chunked: false,
                    ..t.block
                };
                let held = !t.held.is_empty();
                if held {
                    emit_pull_rows_versioned_meta(t.table, &block, t.ids, t.held, &mut b[at..]);
                } else {
                    emit_pull_rows_meta(t.table, &block, t.ids, &mut b[at..]);
                }
                at += pull_rows_versioned_meta_len(block.dims.len(), t.ids.len(), held);
            }
        })
    }

    /// Queues a `PUSH_ROWS` of `tables`.
    pub fn push_rows(&mut self, handle: u64, tables: &[RowsItem<'_>]) -> Result<(), EncodeError> {
        if tables.is_empty() {
            return Err(EncodeError::BadCount);
        }
        if !tables
            .iter()
            .all(|t| is_rows_block(&t.block.meta, t.ids.len()))
        {
            return Err(EncodeError::BadTensor);
        }
        let scales = self.features.contains(wire::WireFeatures::ROW_FORMATS);
        if !scales && tables.iter().any(|t| t.loss_scale.is_some()) {
            return Err(EncodeError::NotNegotiated);
        }
        self.tensor_frame(FrameKind::PushRows, handle, false, tables, |pos, _| pos)
    }

    /// Queues an `ERROR` failing request `handle` (0: the connection) with `status`.
    pub fn error(&mut self, handle: u64, status: Status, message: &str) -> Result<(), EncodeError> {
        let status = if status.is_ok() {
            Status::Internal
        } else {
            status
        };
        let repr = ErrorRepr::new(message.as_bytes());
        let len = repr.buffer_len();
        let header = HeaderRepr {
            end: handle != 0,
            status,
            ..self.header(FrameKind::Error, handle, 0, len, 0)?
        };
        self.simple(header, &[], |b| repr.emit(b))
    }

    /// Queues a `PUSH`.
    pub fn push(&mut self, handle: u64, items: &[PushItem<'_>]) -> Result<(), EncodeError> {
        if items.is_empty() {
            return Err(EncodeError::BadCount);
        }
        self.tensor_frame(FrameKind::Push, handle, false, items, |pos, _| pos)
    }

    /// Queues a `RESPONSE`; `end` marks the last frame answering `handle`.
    pub fn response(
        &mut self,
        handle: u64,
        end: bool,
        items: &[ResponseItem<'_>],
    ) -> Result<(), EncodeError> {
        self.tensor_frame(FrameKind::Response, handle, end, items, |_, item| item.index)
    }

    fn tensor_frame<'a, I: TensorItem<'a>>(
        &mut self,
        kind: FrameKind,
        handle: u64,
        end: bool,
        items: &[I],
        index_of: impl Fn(u32, &I) -> u32,
    ) -> Result<(), EncodeError> {
        if items.len() > u32::MAX as usize {
            return Err(EncodeError::BadCount);
        }
        let mut meta_len = 0usize;
        for item in items {
            if let Some(t) = item.tensor() {
                let len_ok = t.meta.dead || t.meta.byte_len == 0 || {
                    let placed_by_copy = t.meta.byte_len as usize <= self.cfg.inline_threshold
                        || t.token == COPY_TOKEN;
                    !placed_by_copy || t.bytes.len() as u64 == t.meta.byte_len
                };
                let meta = TensorMeta {
                    chunked: false,
                    ..t.meta
                };
                if !len_ok || meta.check(&UNLIMITED).is_err() {
                    return Err(EncodeError::BadTensor);
                }
            }
            meta_len += item.meta_len();
        }
        self.check_size(meta_len, 0)?;
        let room = self.cfg.max_frame as u64 - (HEADER_LEN + meta_len) as u64;
        // First pass: sizes.
        let (cfg, limit) = (self.cfg, self.chunk_limit());
        let (mut payload, mut copied, mut used) = (0u64, 0usize, 0u64);
        for item in items {
            let len = item.tensor().map_or(0, |t| t.meta.byte_len);
            match place(&cfg, limit, item.tensor(), &mut used, room) {
                Placement::Copy => {
                    payload += len;
                    copied += len as usize;
                }
                Placement::Chunked if item.tensor().is_some_and(|t| t.token == COPY_TOKEN) => {
                    return Err(EncodeError::BadTensor);
                }
                Placement::Reference => payload += len,
                Placement::None | Placement::Chunked => {}
            }
        }
        let header = HeaderRepr {
            kind,
            end,
            status: Status::Ok,
            timeout_ms: self.timeout_for(kind),
            count: items.len() as u32,
            handle,
            meta_len: meta_len as u32,
            payload_len: payload as u32,
        };
        // Second pass: the metas, then the payload pieces in entry order.
        let (block, start, body) = self.frame(header, meta_len + copied);
        let (mut at, mut used) = (0usize, 0u64);
        for item in items {
            let chunked = place(&cfg, limit, item.tensor(), &mut used, room) == Placement::Chunked;
            item.emit(&mut body[at..], chunked);
            at += item.meta_len();
        }
        self.queue(Segment::Arena {
            block: block as u32,
            start: start as u32,
            len: (HEADER_LEN + meta_len) as u32,
        });
        let (mut copy_at, mut used) = (start + HEADER_LEN + meta_len, 0u64);
        for (pos, item) in items.iter().enumerate() {
            let placement = place(&cfg, limit, item.tensor(), &mut used, room);
            let Some(t) = item.tensor() else { continue };
            match placement {
                Placement::Copy => {
                    let n = t.meta.byte_len as usize;
                    self.arena.buf_mut(block)[copy_at..copy_at + n].copy_from_slice(&t.bytes[..n]);
                    if t.token != COPY_TOKEN {
                        self.released.push(t.token);
                    }
                    self.queue(Segment::Arena {
                        block: block as u32,
                        start: copy_at as u32,
                        len: n as u32,
                    });
                    copy_at += n;
                }
                Placement::Reference => self.queue(Segment::Tensor {
                    token: t.token,
                    offset: 0,
                    len: t.meta.byte_len,
                    last: true,
                }),
                Placement::Chunked => self.jobs.push_back(ChunkJob {
                    handle,
                    index: index_of(pos as u32, item),
                    token: t.token,
                    byte_len: t.meta.byte_len,
                    next: 0,
                }),
                Placement::None => self.released.push(t.token),
            }
        }
        Ok(())
    }

    /// Adds chunks of pending chunked tensors until `max_bytes` are ready (or no chunk is
    /// pending). Call before [`pieces`](Self::pieces) with the coalescing limit.
    pub fn fill(&mut self, max_bytes: u64) {
        let limit = self.chunk_limit();
        while self.ready_bytes() < max_bytes {
            let Some(job) = self.jobs.front().copied() else {
                return;
            };
            let len = limit.min(job.byte_len - job.next);
            let header = HeaderRepr {
                kind: FrameKind::Chunk,
                end: false,
                status: Status::Ok,
                timeout_ms: 0,
                count: 1,
                handle: job.handle,
                meta_len: 16,
                payload_len: len as u32,
            };
            let (block, start, body) = self.frame(header, 16);
            ChunkRepr {
                index: job.index,
                offset: job.next,
            }
            .emit(body);
            self.queue(Segment::Arena {
                block: block as u32,
                start: start as u32,
                len: CHUNK_FRAME_OVERHEAD,
            });
            self.queue(Segment::Tensor {
                token: job.token,
                offset: job.next,
                len,
                last: job.next + len == job.byte_len,
            });
            let front = self.jobs.front_mut().expect("job checked above");
            front.next += len;
            if front.next == front.byte_len {
                self.jobs.pop_front();
            }
        }
    }

    /// The queued output in write order, the first piece trimmed by what was already
    /// written.
    pub fn pieces(&self) -> impl Iterator<Item = Piece<'_>> + '_ {
        (0..self.ready.len()).filter_map(move |i| {
            Some(match self.out_piece(i)? {
                OutPiece::Arena { block, start, len } => {
                    Piece::Bytes(&self.arena.buf(block as usize)[start..start + len])
                }
                OutPiece::Tensor { token, offset, len } => Piece::Tensor { token, offset, len },
            })
        })
    }

    /// Output piece `i` in write order (the first trimmed by what was already written),
    /// naming arena bytes by block, for a writer that borrows the blocks
    /// ([`lend_block`](Self::lend_block)); `None` past the last.
    pub fn out_piece(&self, i: usize) -> Option<OutPiece> {
        let seg = self.ready.get(i)?;
        let skip = if i == 0 { self.front_done } else { 0 };
        Some(match *seg {
            Segment::Arena { block, start, len } => OutPiece::Arena {
                block,
                start: start as usize + skip as usize,
                len: len as usize - skip as usize,
            },
            Segment::Tensor {
                token, offset, len, ..
            } => OutPiece::Tensor {
                token,
                offset: offset + skip,
                len: len - skip,
            },
        })
    }

    /// Takes arena block `block` out, for a write in flight to read; `None` when it is
    /// lent already (or no such block). Nothing is written into it until
    /// [`restore_block`](Self::restore_block) brings it back; later frames go into other
    /// blocks.
    pub fn lend_block(&mut self, block: u32) -> Option<Box<[u8]>> {
        self.arena.lend(block as usize)
    }

    /// Takes back a block [`lend_block`](Self::lend_block) gave out. Call before
    /// [`advance`](Self::advance) for the write that read it.
    pub fn restore_block(&mut self, block: u32, buf: Box<[u8]>) {
        self.arena.restore(block as usize, buf);
    }

    /// Records that the first `n` bytes of [`pieces`](Self::pieces) were written.
    pub fn advance(&mut self, mut n: u64) {
        while n > 0 {
            let Some(seg) = self.ready.front().copied() else {
                return;
            };
            let left = seg.len() - self.front_done;
            if n < left {
                self.front_done += n;
                return;
            }
            n -= left;
            self.front_done = 0;
            self.ready_bytes -= seg.len();
            self.ready.pop_front();
            if let Segment::Arena { len, .. } = seg {
                self.copied_bytes -= u64::from(len);
            }
            match seg {
                Segment::Arena { block, .. } => self.arena.release(block as usize),
                Segment::Tensor {
                    token, last: true, ..
                } => self.released.push(token),
                Segment::Tensor { .. } => {}
            }
            if self.is_empty() {
                // Everything encoded is written: a drain, for the arena's keep rule.
                self.arena.drained();
            }
        }
    }
}

/// Decides how one tensor of a frame travels. Deterministic, so the sizing pass and the
/// writing pass agree; `used` accumulates the payload bytes placed in the frame.
fn place(
    cfg: &EncoderConfig,
    chunk_limit: u64,
    t: Option<&OutTensor<'_>>,
    used: &mut u64,
    room: u64,
) -> Placement {
    let Some(t) = t else {
        return Placement::None;
    };
    if t.meta.dead || t.meta.byte_len == 0 {
        return Placement::None;
    }
    let len = t.meta.byte_len;
    if len > chunk_limit || *used + len > room {
        return Placement::Chunked;
    }
    *used += len;
    if len as usize <= cfg.inline_threshold || t.token == COPY_TOKEN {
        Placement::Copy
    } else {
        Placement::Reference
    }
}

/// Tensor metas the caller builds are checked for consistency only, not against limits.
const UNLIMITED: wire::Limits = wire::Limits {
    max_frame: u32::MAX,
    max_key: u16::MAX,
    max_tensors: u32::MAX,
    max_rank: wire::MAX_RANK as u8,
    max_tensor_bytes: i64::MAX as u64,
    max_tables: wire::Limits::MAX_TABLES,
    max_rows: wire::Limits::MAX_ROWS,
    max_row_bytes: wire::Limits::MAX_ROW_BYTES,
};
