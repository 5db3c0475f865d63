//! The bytes of a connection, in and out: the memory the next receive writes into, lent
//! to the I/O layer until the receive completes, and the output handed to a writer with
//! the memory it is in.

use std::sync::Arc;
use std::time::Instant;

use super::conn::{direct_place, mark_dirty, tensor_for, Conn, DirectPlace, Lent, Phase};
use super::{Session, CHUNK_HEAD};
use crate::error::{Error, ErrorKind};
use crate::proto::OutPiece;
use crate::stats::{add, Counters};
use crate::tensor::{Tensor, TensorMemory};
use crate::wire::HEADER_LEN;

/// The memory the next receive of a connection writes into, lent by the session until the
/// receive has completed ([`Session::lend_recv`], [`Session::received`]).
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

/// Where [`Session::transmit`] puts a connection's output: the memory each piece is in,
/// lent or shared, and the range of it to write, in order.
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

impl Session {
    /// Lends out the memory the next bytes of connection `slot` must land in, or `None`
    /// when nothing is to be received on it (closed; or its buffer is full, which closes
    /// it). Until the memory comes back through [`received`](Self::received), the
    /// connection's buffer or the tensor is empty here: the session neither reads nor
    /// frees it, whatever happens to the request meanwhile.
    pub(crate) fn lend_recv(&mut self, slot: u32) -> Option<RecvPlace> {
        let conn = self.conns.get_mut(slot as usize)?;
        if conn.phase == Phase::Closing || conn.proto.is_closed() || conn.lent.is_some() {
            return None;
        }
        let alloc = &*self.allocator;
        let min = self.zero_copy_min;
        if let Some(place) = direct_place(conn, &mut self.ctxs, min, alloc, slot) {
            if let Some(loan) = self.lend_direct(slot, place) {
                return Some(loan);
            }
        }
        let conn = &mut self.conns[slot as usize];
        let decoder = conn.proto.decoder();
        let limit = if decoder.chunks_pending() > 0 && decoder.is_idle() {
            // A chunk is most likely next: read just its header and meta, so that its
            // payload is received in place rather than read ahead into the buffer.
            CHUNK_HEAD
        } else if let Some(missing) = decoder.meta_missing().filter(|&m| m > 0) {
            // The rest of a meta section: payload after it may go straight into place.
            missing
        } else if decoder.is_idle() && !matches!(decoder.last_payload_max(), Some(m) if m < min) {
            // Large frames are arriving (or none has since the handshake): read the next
            // header on its own, then its meta section (above), so that a large payload
            // goes straight into place from its first byte. Connections carrying small
            // frames keep reading as much as the buffer holds.
            HEADER_LEN
        } else {
            usize::MAX
        };
        let Some((buf, start, len)) = decoder.lend(limit.min(u32::MAX as usize)) else {
            // Buffered bytes are decoded after every receive; this means the decoder is
            // stuck on a frame it cannot finish.
            log::error!("connection {slot}: receive buffer full; closing");
            self.lose(slot, Error::new(ErrorKind::Protocol));
            return None;
        };
        conn.lent = Some(Lent::Buffer);
        Some(RecvPlace {
            mem: RecvLoan::Buffer(buf),
            start,
            len,
            ahead: limit == usize::MAX,
        })
    }

    /// Lends the memory of the tensor `place` names (just found by `direct_place`, so it is
    /// there); `None` when its contents are not separate memory.
    fn lend_direct(&mut self, slot: u32, place: DirectPlace) -> Option<RecvPlace> {
        let conn = self.conns.get_mut(slot as usize)?;
        let alloc = &*self.allocator;
        let incoming = &mut conn.incoming;
        let Some(t) = tensor_for(
            &mut self.ctxs,
            incoming,
            slot,
            place.route,
            alloc,
            &conn.budget,
        ) else {
            log::error!("connection {slot}: receive target vanished");
            return None;
        };
        let mem = t.lend_memory()?;
        conn.lent = Some(Lent::Tensor(place.route));
        Some(RecvPlace {
            mem: RecvLoan::Tensor(mem),
            start: place.offset,
            len: place.len,
            ahead: false,
        })
    }

    /// The memory [`lend_recv`](Self::lend_recv) lent for connection `slot` is back, with
    /// `n` bytes written at the start of the range it named (0 when the receive failed or
    /// the stream ended). Puts it back; then, unless the connection is closing or `n` is 0,
    /// decodes the bytes and acts on what they complete. Memory of a tensor whose request
    /// was given up meanwhile is dropped.
    pub(crate) fn received(&mut self, slot: u32, mem: RecvLoan, n: usize, now: Instant) {
        let Some(conn) = self.conns.get_mut(slot as usize) else {
            return;
        };
        match (conn.lent.take(), mem) {
            (Some(Lent::Buffer), RecvLoan::Buffer(buf)) => {
                conn.proto.decoder().restore(buf, n);
            }
            (Some(Lent::Tensor(route)), RecvLoan::Tensor(m)) => {
                let alloc = &*self.allocator;
                let t = tensor_for(
                    &mut self.ctxs,
                    &mut conn.incoming,
                    slot,
                    route,
                    alloc,
                    &conn.budget,
                );
                if let Some(t) = t {
                    // Given up and replaced meanwhile: not this memory's tensor.
                    drop(t.restore_memory(m));
                }
                conn.proto.decoder().payload_received(n as u64);
            }
            (lent, _) => {
                log::error!("connection {slot}: received into memory it did not lend");
                conn.lent = lent;
                return;
            }
        }
        if conn.phase == Phase::Closing || n == 0 {
            return;
        }
        conn.last_heard = now;
        self.process(slot, now);
        self.watch_frame_head(slot, now);
        self.watch_progress(slot, n as u64, now);
        self.sweep_timers();
    }

    /// Hands the output of connection `slot` to `sink`, piece by piece with the memory it
    /// is in, while the sink has room and holds less than `max` bytes; arena blocks are
    /// lent out (once each) until [`restore_block`](Self::restore_block), tensors shared.
    /// Returns whether it gave any. A connection closed by its protocol with nothing left
    /// to say is closed here.
    pub(crate) fn transmit(&mut self, slot: u32, max: u64, sink: &mut impl SendSink) -> bool {
        let Some(conn) = self.conns.get_mut(slot as usize) else {
            return false;
        };
        if !matches!(conn.phase, Phase::Open | Phase::Handshaking) {
            return false;
        }
        let enc = conn.proto.encoder();
        enc.fill(max);
        count_arena(&self.counters, conn);
        let enc = conn.proto.encoder();
        if enc.ready_bytes() == 0 {
            if conn.proto.is_closed() {
                // Nothing more to say: close.
                let failure = conn.failure.clone();
                self.lose(slot, failure);
            }
            return false;
        }
        let Conn {
            proto, out_tensors, ..
        } = conn;
        let enc = proto.encoder();
        let mut any = false;
        let mut bad = false;
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
                        None => {
                            bad = true;
                            break;
                        }
                    }
                }
            }
            any = true;
        }
        if bad {
            log::error!("connection {slot}: output names a tensor it does not hold");
            self.lose(slot, Error::new(ErrorKind::Protocol));
            return false;
        }
        any
    }

    /// Arena block `block` of connection `slot`'s output, lent by
    /// [`transmit`](Self::transmit), is back: the write that read it has completed. Call
    /// before [`sent`](Self::sent).
    pub(crate) fn restore_block(&mut self, slot: u32, block: u32, buf: Box<[u8]>) {
        if let Some(conn) = self.conns.get_mut(slot as usize) {
            conn.proto.encoder().restore_block(block, buf);
            count_arena(&self.counters, conn);
        }
    }

    /// `n` bytes of connection `slot`'s output were written.
    pub(crate) fn sent(&mut self, slot: u32, n: usize) {
        let Some(conn) = self.conns.get_mut(slot as usize) else {
            return;
        };
        if conn.phase == Phase::Closing {
            return;
        }
        conn.proto.encoder().advance(n as u64);
        count_arena(&self.counters, conn);
        conn.release_tokens();
        mark_dirty(&mut self.dirty, conn, slot);
    }
}

/// Brings the loop's `send_arena_bytes` up to date with connection `conn`'s encoder.
fn count_arena(counters: &Counters, conn: &mut Conn) {
    let now = conn.proto.encoder().arena_bytes();
    if now != conn.arena_counted {
        let delta = (now as u64).wrapping_sub(conn.arena_counted as u64);
        add(&counters.send_arena_bytes, delta);
        conn.arena_counted = now;
    }
}
