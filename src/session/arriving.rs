//! Tensors arriving: the value an item takes when its meta is announced, and the chunked
//! tensors whose memory is taken (and reserved against the receive budget) only when their
//! first chunk arrives. Shared by the answers a client assembles and the pushes a server
//! receives.

use super::budget::{ConnBudget, Refused, Reservation};
use crate::tensor::{OwnedMeta, Tensor, TensorAllocator, TensorMemory};
use crate::wire::{Status, TensorMeta};

/// What an item holds until its value is in. Never read as a value while the item is
/// open or its chunks are arriving (its state says so); an item a responder never
/// answers finishes with it, `PROTOCOL`.
pub(crate) fn not_in_yet() -> Result<Tensor, Status> {
    Err(Status::Protocol)
}

/// A chunked tensor still arriving.
struct Chunked {
    index: u32,
    byte_len: u64,
    /// Its meta until its first chunk arrives: memory is taken only then, so a peer cannot
    /// make us commit memory for contents it has not started to send.
    deferred: Option<Box<OwnedMeta>>,
    /// Its bytes, reserved against the receive budget from its first chunk until it is
    /// whole or dropped.
    reserved: Option<Reservation>,
}

/// The chunked tensors of one request (or push) still arriving.
#[derive(Default)]
pub(crate) struct Arriving {
    chunks: Vec<Chunked>,
}

impl Arriving {
    /// The first value of item `index`, announced with `meta`: its tensor, received now;
    /// or, for a chunked tensor, [`not_in_yet`], with the meta kept until the first chunk
    /// arrives.
    pub(crate) fn announce(
        &mut self,
        index: u32,
        meta: &TensorMeta<'_>,
        alloc: &dyn TensorAllocator,
        reuse: &mut Vec<Box<dyn TensorMemory>>,
    ) -> Result<Tensor, Status> {
        if meta.chunked {
            if let Some(m) = OwnedMeta::of(meta) {
                self.chunks.push(Chunked {
                    index,
                    byte_len: meta.byte_len,
                    deferred: Some(Box::new(m)),
                    reserved: None,
                });
                return not_in_yet();
            }
        }
        Tensor::receive_reusing(meta, alloc, reuse).ok_or(Status::ResourceExhausted)
    }

    /// The tensor receiving item `index`'s contents (in `results`), allocated now if it
    /// was deferred: its bytes are reserved against `budget` first, and it fails with
    /// `RESOURCE_EXHAUSTED` (its chunks read and dropped) when they do not fit.
    pub(crate) fn tensor_mut<'r>(
        &mut self,
        results: &'r mut [Result<Tensor, Status>],
        index: u32,
        alloc: &dyn TensorAllocator,
        budget: &ConnBudget,
        reuse: &mut Vec<Box<dyn TensorMemory>>,
    ) -> Option<&'r mut Tensor> {
        let slot = results.get_mut(index as usize)?;
        if let Some(c) = self.chunks.iter_mut().find(|c| c.index == index) {
            if let Some(meta) = c.deferred.take() {
                match budget.reserve(meta.byte_len) {
                    Ok(r) => {
                        c.reserved = Some(r);
                        *slot = Tensor::receive_owned_reusing(&meta, alloc, reuse)
                            .ok_or(Status::ResourceExhausted);
                    }
                    Err(why) => {
                        let which = match why {
                            Refused::Connection => "the connection's (STARWIRE_CONN_RECV_BUDGET)",
                            Refused::Task => "the task's (STARWIRE_RECV_BUDGET)",
                        };
                        log::warn!(
                            "a chunked tensor of {} bytes does not fit {which} receive budget; \
                             it fails with RESOURCE_EXHAUSTED",
                            meta.byte_len
                        );
                        *slot = Err(Status::ResourceExhausted);
                    }
                }
            }
        }
        slot.as_mut().ok()
    }

    /// Notes that chunk bytes of item `index` up to `end_offset` arrived: the tensor is
    /// whole when they reach its length (its reservation is given back).
    pub(crate) fn progress(&mut self, index: u32, end_offset: u64) {
        self.chunks
            .retain(|c| !(c.index == index && end_offset == c.byte_len));
    }

    /// Whether item `index` is still arriving in chunks.
    pub(crate) fn contains(&self, index: u32) -> bool {
        self.chunks.iter().any(|c| c.index == index)
    }

    /// Whether nothing is arriving.
    pub(crate) fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }

    /// Every tensor still arriving fails with `status` in `results` (cut short), and is
    /// forgotten.
    pub(crate) fn fail(&mut self, results: &mut [Result<Tensor, Status>], status: Status) {
        for c in self.chunks.drain(..) {
            if let Some(r) = results.get_mut(c.index as usize) {
                *r = Err(status);
            }
        }
    }
}
