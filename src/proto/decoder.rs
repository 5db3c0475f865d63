//! Incremental frame decoder.

use super::Error;
use crate::wire::{Body, Header, HeaderRepr, Limits, WireFeatures, HEADER_LEN};
use std::collections::VecDeque;

/// Where a piece of payload belongs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PayloadTarget {
    /// Contents of the inline tensor with this item index in the current frame.
    Tensor {
        /// Item index (position in a push, `index` field of a response entry).
        index: u32,
    },
    /// Contents of the chunked tensor declared under `handle` with item `index`.
    Chunk {
        /// Handle of the frame that declared the tensor.
        handle: u64,
        /// Item index of the tensor.
        index: u32,
    },
    /// The opaque payload of a `PING` or `PONG`.
    Opaque,
}

/// What the decoder hands out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event<'a> {
    /// A frame's header and validated meta section. Its payload, if any, follows as
    /// [`Event::Payload`] pieces or is read directly into place (see [`NextRead`]).
    Frame(Frame<'a>),
    /// Payload bytes copied out of the receive buffer: bytes `offset..offset + data.len()`
    /// of `target`.
    Payload {
        /// Where the bytes belong.
        target: PayloadTarget,
        /// Offset of `data` within the target.
        offset: u64,
        /// The bytes, valid until the next call on the decoder.
        data: &'a [u8],
    },
    /// The frame with this header has been received completely.
    FrameEnd(HeaderRepr),
}

/// A frame's header and meta section.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame<'a> {
    /// The validated header.
    pub header: HeaderRepr,
    /// The validated meta section.
    pub body: Body<'a>,
}

/// Where the next bytes read from the socket must go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NextRead {
    /// Into the receive buffer ([`Decoder::spare`], then [`Decoder::filled`]).
    Buffer,
    /// The next `len` bytes of the stream are bytes `offset..offset + len` of `target`.
    /// The I/O layer may read them straight into the target's memory and report them with
    /// [`Decoder::payload_received`], or read them into the buffer as usual.
    Payload {
        /// Where the bytes belong.
        target: PayloadTarget,
        /// Offset within the target.
        offset: u64,
        /// Bytes of the target still to come in this frame.
        len: u64,
    },
}

#[derive(Debug, Clone, Copy)]
enum State {
    Header,
    Meta(HeaderRepr),
    Payload(HeaderRepr),
    Failed,
}

#[derive(Debug, Clone, Copy)]
struct Segment {
    target: PayloadTarget,
    offset: u64,
    len: u64,
}

#[derive(Debug, Clone, Copy)]
struct ChunkState {
    handle: u64,
    index: u32,
    byte_len: u64,
    next: u64,
}

/// Incremental decoder of one direction of a connection.
///
/// Feed it with [`spare`](Self::spare) + [`filled`](Self::filled) (or [`feed`](Self::feed)),
/// then call [`poll`](Self::poll) until it returns `Ok(None)`.
///
/// Memory: the receive buffer starts at the configured capacity and grows, by doubling and
/// only while bytes are actually arriving, up to what the current frame's header and meta
/// section need — at most `max_frame`, a limit checked before any growth — and returns to
/// its initial capacity between frames. Payload bytes never need buffer space beyond the
/// initial capacity.
#[derive(Debug)]
pub struct Decoder {
    limits: Limits,
    /// The optional features the connection negotiated (none until its handshake).
    features: WireFeatures,
    /// Capacity to return to once a large meta section has been decoded.
    initial: usize,
    buf: Vec<u8>,
    /// The initial buffer while a large meta section is received in a larger one. The
    /// initial buffer never moves or reallocates, so memory registered with the kernel
    /// (io_uring fixed buffers) stays the buffer after any growth.
    home: Vec<u8>,
    /// Longest payload piece (or chunked tensor) of the last frame decoded after the
    /// handshake; `None` before the first one.
    last_payload_max: Option<u64>,
    head: usize,
    tail: usize,
    consume: usize,
    state: State,
    segments: Vec<Segment>,
    seg_at: usize,
    seg_done: u64,
    chunks: VecDeque<ChunkState>,
    bytes_copied: u64,
    bytes_direct: u64,
    /// Payload bytes received so far: of chunks, and of other frames.
    chunk_bytes_in: u64,
    frame_bytes_in: u64,
    /// Frames decoded so far (their header and meta section whole).
    frames_in: u64,
}

/// What a stream owes: bytes it began or declared and has not delivered yet.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Owed {
    /// Of chunked tensors declared and not complete (the chunk being received included).
    pub chunked: u64,
    /// Of the payload of the frame being received that are not chunk bytes.
    pub frame: u64,
}

impl Decoder {
    /// A decoder enforcing `limits`, with a receive buffer of `capacity` bytes
    /// (at least the header length).
    pub fn new(limits: Limits, capacity: usize) -> Decoder {
        Decoder::with_buffer(limits, vec![0; capacity.max(HEADER_LEN)])
    }

    /// A decoder whose receive buffer is `buf` (its length is the capacity; grown to the
    /// header length if shorter). The buffer is used in place and never reallocated; a
    /// frame that needs more room gets a separate, temporary one.
    /// [`swap_buffer`](Self::swap_buffer) gives it back.
    pub fn with_buffer(limits: Limits, mut buf: Vec<u8>) -> Decoder {
        if buf.len() < HEADER_LEN {
            buf.resize(HEADER_LEN, 0);
        }
        Decoder {
            limits,
            features: WireFeatures::NONE,
            initial: buf.len(),
            buf,
            home: Vec::new(),
            last_payload_max: None,
            head: 0,
            tail: 0,
            consume: 0,
            state: State::Header,
            segments: Vec::new(),
            seg_at: 0,
            seg_done: 0,
            chunks: VecDeque::new(),
            bytes_copied: 0,
            bytes_direct: 0,
            chunk_bytes_in: 0,
            frame_bytes_in: 0,
            frames_in: 0,
        }
    }

    /// The limits this decoder enforces.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Frames decoded from now on may use `features` (what the handshake negotiated).
    pub fn set_features(&mut self, features: WireFeatures) {
        self.features = features;
    }

    /// The optional features frames may use.
    pub fn features(&self) -> WireFeatures {
        self.features
    }

    /// Payload bytes handed out by copy from the receive buffer.
    pub fn bytes_copied(&self) -> u64 {
        self.bytes_copied
    }

    /// Payload bytes the I/O layer placed directly ([`payload_received`](Self::payload_received)).
    pub fn bytes_direct(&self) -> u64 {
        self.bytes_direct
    }

    /// Payload bytes of `CHUNK` frames received so far (copied or placed directly).
    pub fn chunk_bytes_in(&self) -> u64 {
        self.chunk_bytes_in
    }

    /// Payload bytes of frames other than `CHUNK` received so far.
    pub fn frame_bytes_in(&self) -> u64 {
        self.frame_bytes_in
    }

    /// Frames decoded so far: each counted once its header and meta section are whole.
    pub fn frames_in(&self) -> u64 {
        self.frames_in
    }

    /// What the stream owes now: the rest of the chunked tensors declared (the chunk
    /// being received included), and the rest of the current frame's other payload. A
    /// frame's header and meta section are not counted (they are watched on their own).
    pub fn owed(&self) -> Owed {
        let mut owed = Owed {
            chunked: self.chunks.iter().map(|c| c.byte_len - c.next).sum(),
            frame: 0,
        };
        if let State::Payload(_) = self.state {
            for (i, seg) in self.segments.iter().enumerate().skip(self.seg_at) {
                let left = seg.len - if i == self.seg_at { self.seg_done } else { 0 };
                match seg.target {
                    PayloadTarget::Chunk { .. } => owed.chunked += left,
                    _ => owed.frame += left,
                }
            }
        }
        owed
    }

    /// Counts `n` payload bytes of segment `seg` received.
    #[inline(always)]
    fn count_payload(&mut self, target: PayloadTarget, n: u64) {
        match target {
            PayloadTarget::Chunk { .. } => self.chunk_bytes_in += n,
            _ => self.frame_bytes_in += n,
        }
    }

    /// Replaces the receive buffer with `buf` and returns the one given at creation (by
    /// [`new`](Self::new), [`with_buffer`](Self::with_buffer) or an earlier call). Bytes
    /// buffered and not decoded are lost: call it when the connection is done, or before
    /// its first byte arrives.
    pub fn swap_buffer(&mut self, mut buf: Vec<u8>) -> Vec<u8> {
        if buf.len() < HEADER_LEN {
            buf.resize(HEADER_LEN, 0);
        }
        if !self.home.is_empty() {
            self.buf = std::mem::take(&mut self.home);
        }
        self.head = 0;
        self.tail = 0;
        self.consume = 0;
        self.initial = buf.len();
        std::mem::replace(&mut self.buf, buf)
    }

    /// Whether the next read lands in the buffer given at creation (or by
    /// [`swap_buffer`](Self::swap_buffer)), rather than in a temporary larger one.
    pub fn in_home_buffer(&self) -> bool {
        self.home.is_empty()
    }

    /// Longest payload piece of the last frame decoded after the handshake (`HELLO` and
    /// `HELLO_ACK` do not count): an inline tensor, a chunk, or a ping's payload; a
    /// chunked tensor a `PUSH` or `RESPONSE` declares counts with its whole length. 0 for
    /// frames without payload; `None` until such a frame has been decoded. The I/O layer
    /// uses it to guess whether the next frame is large enough to read its header on its
    /// own.
    pub fn last_payload_max(&self) -> Option<u64> {
        self.last_payload_max
    }

    /// Bytes received but not yet decoded.
    pub fn buffered(&self) -> usize {
        self.tail - self.head - self.consume
    }

    /// Whether the decoder sits between frames (bytes of the next one may be buffered).
    pub fn at_frame_start(&self) -> bool {
        matches!(self.state, State::Header)
    }

    /// Whether the decoder sits between frames with nothing buffered.
    pub fn is_idle(&self) -> bool {
        matches!(self.state, State::Header) && self.buffered() == 0
    }

    /// Whether a frame's header or meta section has started to arrive and is not complete:
    /// the part of a frame the receiver cannot act on until it is whole.
    pub fn in_frame_head(&self) -> bool {
        match self.state {
            State::Header => self.buffered() > 0,
            State::Meta(_) => true,
            State::Payload(_) | State::Failed => false,
        }
    }

    /// Bytes still missing from the meta section being received, if the decoder is in one.
    /// Reading exactly that much keeps the payload that follows out of the buffer, so it
    /// can be received in place.
    pub fn meta_missing(&self) -> Option<usize> {
        match self.state {
            State::Meta(h) => Some((h.meta_len as usize).saturating_sub(self.buffered())),
            _ => None,
        }
    }

    /// Chunked tensors declared whose chunks have not all arrived.
    pub fn chunks_pending(&self) -> usize {
        self.chunks.len()
    }

    fn apply_consume(&mut self) {
        self.head += core::mem::take(&mut self.consume);
        if self.head == self.tail {
            self.head = 0;
            self.tail = 0;
        }
    }

    /// How many buffered bytes the current state needs before it can move on.
    fn wanted(&self) -> usize {
        match self.state {
            State::Header => HEADER_LEN,
            State::Meta(h) => h.meta_len as usize,
            State::Payload(_) | State::Failed => 1,
        }
    }

    /// Free space at the end of the receive buffer for the next read. Empty when the
    /// buffered bytes must be decoded first (call [`poll`](Self::poll)).
    pub fn spare(&mut self) -> &mut [u8] {
        self.apply_consume();
        if self.head == self.tail && !self.home.is_empty() && self.is_idle() {
            // A large meta section needed a larger buffer; between frames, return to the
            // initial one and free the other, so a peer cannot keep it for the life of the
            // connection.
            self.buf = std::mem::take(&mut self.home);
            self.head = 0;
            self.tail = 0;
        }
        if self.tail == self.buf.len() {
            let unread = self.tail - self.head;
            if self.head > 0 {
                self.buf.copy_within(self.head..self.tail, 0);
                self.head = 0;
                self.tail = unread;
            } else if unread < self.wanted() {
                // Bounded: `wanted` is at most a meta length that passed the max_frame check.
                let grown = (self.buf.len() * 2).min(self.wanted().max(self.buf.len()));
                if self.home.is_empty() {
                    // Keep the initial buffer where it is; grow a separate one.
                    let mut bigger = Vec::with_capacity(grown);
                    bigger.extend_from_slice(&self.buf);
                    bigger.resize(grown, 0);
                    self.home = std::mem::replace(&mut self.buf, bigger);
                } else {
                    self.buf.resize(grown, 0);
                }
            }
        }
        &mut self.buf[self.tail..]
    }

    /// Lends the receive buffer out for a read into its free space: returns the buffer
    /// and the range `start..start + len` the next bytes may be written to (`len` at most
    /// `limit`), or `None` when there is no free space (decode first). Until
    /// [`restore`](Self::restore) the decoder holds no buffer and must not be used.
    pub fn lend(&mut self, limit: usize) -> Option<(Vec<u8>, usize, usize)> {
        let len = self.spare().len().min(limit);
        if len == 0 {
            return None;
        }
        Some((std::mem::take(&mut self.buf), self.tail, len))
    }

    /// Takes back the buffer [`lend`](Self::lend) gave, with `n` bytes written at the start
    /// of the range it named.
    pub fn restore(&mut self, buf: Vec<u8>, n: usize) {
        self.buf = buf;
        self.filled(n);
    }

    /// Whether the buffer is lent out ([`lend`](Self::lend)).
    pub fn is_lent(&self) -> bool {
        self.buf.is_empty()
    }

    /// Records that `n` bytes were written at the start of [`spare`](Self::spare).
    pub fn filled(&mut self, n: usize) {
        self.tail = (self.tail + n).min(self.buf.len());
    }

    /// Copies as much of `data` as fits into the receive buffer; returns how much.
    pub fn feed(&mut self, data: &[u8]) -> usize {
        let spare = self.spare();
        let n = spare.len().min(data.len());
        spare[..n].copy_from_slice(&data[..n]);
        self.filled(n);
        n
    }

    /// Where the next bytes from the stream must land.
    pub fn next_read(&self) -> NextRead {
        match self.state {
            State::Payload(_) if self.buffered() == 0 => match self.segments.get(self.seg_at) {
                Some(seg) => NextRead::Payload {
                    target: seg.target,
                    offset: seg.offset + self.seg_done,
                    len: seg.len - self.seg_done,
                },
                None => NextRead::Buffer,
            },
            _ => NextRead::Buffer,
        }
    }

    /// Records that `n` payload bytes announced by [`NextRead::Payload`] were placed
    /// directly by the I/O layer. `n` beyond what was announced is ignored.
    pub fn payload_received(&mut self, n: u64) {
        if let NextRead::Payload { target, len, .. } = self.next_read() {
            let n = n.min(len);
            self.seg_done += n;
            self.bytes_direct += n;
            self.count_payload(target, n);
            if self.seg_done == self.segments[self.seg_at].len {
                self.seg_at += 1;
                self.seg_done = 0;
            }
        }
    }

    fn fail(&mut self, e: Error) -> Error {
        self.state = State::Failed;
        e
    }

    /// Decodes what the buffer holds: the next event, `Ok(None)` when more bytes are
    /// needed, or the error that makes the stream undecodable (then the decoder is
    /// poisoned and the connection must be closed).
    ///
    /// Inlined into the session's receive loop: it runs three times per small frame, and
    /// a call would move each event through memory.
    #[inline(always)]
    pub fn poll(&mut self) -> Result<Option<Event<'_>>, Error> {
        self.apply_consume();
        loop {
            let avail = self.tail - self.head;
            match self.state {
                State::Failed => return Err(Error::Poisoned),
                State::Header => {
                    if avail < HEADER_LEN {
                        return Ok(None);
                    }
                    let header = Header::new_unchecked(&self.buf[self.head..self.tail]);
                    let repr = match HeaderRepr::parse(&header, &self.limits) {
                        Ok(r) => r,
                        Err(e) => return Err(self.fail(e.into())),
                    };
                    self.head += HEADER_LEN;
                    self.state = State::Meta(repr);
                }
                State::Meta(h) => {
                    let meta_len = h.meta_len as usize;
                    if avail < meta_len {
                        return Ok(None);
                    }
                    let meta = &self.buf[self.head..self.head + meta_len];
                    let body = match Body::parse_with(&h, meta, &self.limits, self.features) {
                        Ok(b) => b,
                        Err(e) => {
                            self.state = State::Failed;
                            return Err(e.into());
                        }
                    };
                    self.segments.clear();
                    self.seg_at = 0;
                    self.seg_done = 0;
                    let largest = match plan_payload(
                        &h,
                        &body,
                        &self.limits,
                        &mut self.segments,
                        &mut self.chunks,
                    ) {
                        Ok(largest) => largest,
                        Err(e) => {
                            self.state = State::Failed;
                            return Err(e);
                        }
                    };
                    if !matches!(body, Body::Hello(_) | Body::HelloAck(_)) {
                        self.last_payload_max = Some(largest);
                    }
                    self.consume = meta_len;
                    self.state = State::Payload(h);
                    self.frames_in += 1;
                    return Ok(Some(Event::Frame(Frame { header: h, body })));
                }
                State::Payload(h) => {
                    let Some(seg) = self.segments.get(self.seg_at).copied() else {
                        self.state = State::Header;
                        return Ok(Some(Event::FrameEnd(h)));
                    };
                    if avail == 0 {
                        return Ok(None);
                    }
                    let left = seg.len - self.seg_done;
                    let n = (avail as u64).min(left) as usize;
                    let offset = seg.offset + self.seg_done;
                    self.seg_done += n as u64;
                    if self.seg_done == seg.len {
                        self.seg_at += 1;
                        self.seg_done = 0;
                    }
                    self.bytes_copied += n as u64;
                    self.count_payload(seg.target, n as u64);
                    self.consume = n;
                    let data = &self.buf[self.head..self.head + n];
                    return Ok(Some(Event::Payload {
                        target: seg.target,
                        offset,
                        data,
                    }));
                }
            }
        }
    }
}

/// Lays out the payload section of a frame whose meta was validated, and applies the
/// chunked-tensor sequencing rules (specification 4.8). Returns the longest payload piece,
/// counting a chunked tensor the frame declares with its whole length.
#[inline(always)]
fn plan_payload(
    h: &HeaderRepr,
    body: &Body<'_>,
    limits: &Limits,
    segments: &mut Vec<Segment>,
    chunks: &mut VecDeque<ChunkState>,
) -> Result<u64, Error> {
    let mut largest = 0u64;
    match body {
        Body::Ping | Body::Pong if h.payload_len > 0 => {
            largest = h.payload_len as u64;
            segments.push(Segment {
                target: PayloadTarget::Opaque,
                offset: 0,
                len: h.payload_len as u64,
            })
        }
        Body::Push(_) | Body::PushRows(_) | Body::Response(_) => {
            for t in body.tensors() {
                largest = largest.max(t.meta.byte_len);
                if t.meta.chunked {
                    if chunks.len() >= limits.max_tensors as usize {
                        return Err(Error::TooManyChunked);
                    }
                    chunks.push_back(ChunkState {
                        handle: h.handle,
                        index: t.index,
                        byte_len: t.meta.byte_len,
                        next: 0,
                    });
                } else if t.meta.is_inline() && t.meta.byte_len > 0 {
                    segments.push(Segment {
                        target: PayloadTarget::Tensor { index: t.index },
                        offset: 0,
                        len: t.meta.byte_len,
                    });
                }
            }
        }
        Body::Chunk(c) => {
            let Some(state) = chunks.front_mut() else {
                return Err(Error::UnexpectedChunk);
            };
            let len = h.payload_len as u64;
            let fits = state.byte_len - state.next >= len;
            if state.handle != h.handle || state.index != c.index || state.next != c.offset || !fits
            {
                return Err(Error::ChunkMismatch);
            }
            state.next += len;
            if state.next == state.byte_len {
                chunks.pop_front();
            }
            largest = len;
            segments.push(Segment {
                target: PayloadTarget::Chunk {
                    handle: h.handle,
                    index: c.index,
                },
                offset: c.offset,
                len,
            });
        }
        _ => {}
    }
    Ok(largest)
}
