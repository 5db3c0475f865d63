//! Answers being assembled on the client: per item of a request, its tensor (pulls, recvs,
//! and the blocks of a rows pull) or its status (pushes), and where the item stands. Pure
//! bookkeeping: the loop feeds it `RESPONSE` entries and payload; it says where payload
//! goes and when the answer is complete. Every vector comes from the request's [`Spare`]
//! and goes back to it.

use crate::tensor::{Tensor, TensorAllocator, TensorMemory};
use crate::wire::{ResponseEntry, Status};

use super::arriving::{not_in_yet, Arriving};
use super::budget::ConnBudget;
use super::reply::{Item, Spare};
use super::violation::Violation;

/// `v`, emptied, with room for `n` items set to `fill`.
fn filled<T: Clone>(mut v: Vec<T>, n: usize, fill: T) -> Vec<T> {
    v.clear();
    v.resize(n, fill);
    v
}

/// An answer of one tensor per item.
pub(crate) struct Tensors {
    /// Per item, its tensor or status; meaningful once the item is answered.
    results: Vec<Result<Tensor, Status>>,
    items: Vec<Item>,
    arriving: Arriving,
    /// Memory kept from earlier answers, for this one's tensors.
    reuse: Vec<Box<dyn TensorMemory>>,
    /// The responder said it sent its last item.
    end: bool,
}

impl Tensors {
    /// The answer to `n` items, in `spare`'s vectors; with `reuse`, tensors land in the
    /// memory `spare` kept from earlier answers when it fits.
    pub(crate) fn new(n: usize, spare: &mut Spare, reuse: bool) -> Tensors {
        let mut results = std::mem::take(&mut spare.results);
        results.clear();
        results.resize_with(n, not_in_yet);
        Tensors {
            results,
            items: filled(std::mem::take(&mut spare.item_states), n, Item::Open),
            arriving: Arriving::default(),
            reuse: if reuse {
                std::mem::take(&mut spare.memory)
            } else {
                Vec::new()
            },
            end: false,
        }
    }

    /// Marks item `index` of request `handle` answered; a second answer, or an item the
    /// request does not have, is the peer's violation.
    pub(crate) fn answer(&mut self, handle: u64, index: u32) -> Result<(), Violation> {
        let item = self
            .items
            .get_mut(index as usize)
            .ok_or(Violation::NoSuchItem { handle, index })?;
        if *item != Item::Open {
            return Err(Violation::DuplicateAnswer { handle, index });
        }
        *item = Item::Answered;
        Ok(())
    }

    /// Takes `entry` (already marked answered) as item `entry.index`'s value: its tensor
    /// (memory from `alloc`), or its status.
    pub(crate) fn accept(
        &mut self,
        handle: u64,
        entry: &ResponseEntry<'_>,
        alloc: &dyn TensorAllocator,
    ) -> Result<(), Violation> {
        let i = entry.index;
        self.results[i as usize] = match &entry.tensor {
            None if entry.status.is_ok() => {
                let why = "OK without a tensor";
                return Err(Violation::BadItem {
                    handle,
                    index: i,
                    why,
                });
            }
            None => Err(entry.status),
            Some(meta) => self.arriving.announce(i, meta, alloc, &mut self.reuse),
        };
        Ok(())
    }

    /// The responder sent its last item (`END`).
    pub(crate) fn end(&mut self, end: bool) {
        self.end |= end;
    }

    /// Fails every item not answered yet with `status` (an `ERROR` for the request).
    /// Returns whether any item had been answered: then the request completes with the
    /// items it got.
    pub(crate) fn fail_open(&mut self, status: Status) -> bool {
        let mut any = false;
        for (r, item) in self.results.iter_mut().zip(self.items.iter_mut()) {
            if *item == Item::Open {
                *item = Item::Answered;
                *r = Err(status);
            } else {
                any = true;
            }
        }
        // A chunked tensor cut short fails too.
        self.arriving.fail(&mut self.results, status);
        self.end = true;
        any
    }

    /// Memory for item `index`'s contents, if it has any (allocated from `alloc` now for a
    /// chunked tensor whose first chunk is arriving).
    pub(crate) fn tensor_mut(
        &mut self,
        index: u32,
        alloc: &dyn TensorAllocator,
        budget: &ConnBudget,
    ) -> Option<&mut Tensor> {
        self.arriving
            .tensor_mut(&mut self.results, index, alloc, budget, &mut self.reuse)
    }

    /// Takes item `index` out if it is completely received (for fused recvs, whose members
    /// complete one by one).
    pub(crate) fn take_ready(&mut self, index: u32) -> Option<Result<Tensor, Status>> {
        if self.arriving.contains(index) {
            return None;
        }
        let item = self.items.get_mut(index as usize)?;
        if *item != Item::Answered {
            return None;
        }
        *item = Item::Taken;
        Some(std::mem::replace(
            &mut self.results[index as usize],
            not_in_yet(),
        ))
    }

    /// Chunk bytes of item `index` up to `end_offset` arrived.
    pub(crate) fn chunk_progress(&mut self, index: u32, end_offset: u64) {
        self.arriving.progress(index, end_offset);
    }

    /// Whether everything the answer announced has arrived.
    pub(crate) fn is_complete(&self) -> bool {
        self.end && self.arriving.is_empty()
    }

    /// The items' values (an item the responder never answered fails with `PROTOCOL`); the
    /// vectors not handed out go back to `spare`.
    pub(crate) fn finish(self, spare: &mut Spare) -> Vec<Result<Tensor, Status>> {
        let Tensors {
            mut results,
            items,
            reuse,
            ..
        } = self;
        for (r, item) in results.iter_mut().zip(&items) {
            if *item == Item::Open {
                *r = Err(Status::Protocol);
            }
        }
        spare.item_states = items;
        if spare.memory.is_empty() {
            spare.memory = reuse;
        }
        results
    }
}

/// An answer of one status per item (a push, a rows push).
pub(crate) struct Statuses {
    statuses: Vec<Status>,
    items: Vec<Item>,
    end: bool,
}

impl Statuses {
    /// The answer to `n` items, in `spare`'s vectors.
    pub(crate) fn new(n: usize, spare: &mut Spare) -> Statuses {
        Statuses {
            statuses: filled(std::mem::take(&mut spare.statuses), n, Status::Protocol),
            items: filled(std::mem::take(&mut spare.item_states), n, Item::Open),
            end: false,
        }
    }

    /// Takes `entry` of the answer to `handle`.
    pub(crate) fn accept(
        &mut self,
        handle: u64,
        entry: &ResponseEntry<'_>,
    ) -> Result<(), Violation> {
        let index = entry.index;
        if entry.tensor.is_some() || !entry.missing.is_empty() {
            let why = "a tensor in the answer to a push";
            return Err(Violation::BadItem { handle, index, why });
        }
        let item = self
            .items
            .get_mut(index as usize)
            .ok_or(Violation::NoSuchItem { handle, index })?;
        if *item != Item::Open {
            return Err(Violation::DuplicateAnswer { handle, index });
        }
        *item = Item::Answered;
        self.statuses[index as usize] = entry.status;
        Ok(())
    }

    /// The responder sent its last item (`END`).
    pub(crate) fn end(&mut self, end: bool) {
        self.end |= end;
    }

    /// As [`Tensors::fail_open`].
    pub(crate) fn fail_open(&mut self, status: Status) -> bool {
        let mut any = false;
        for (s, item) in self.statuses.iter_mut().zip(self.items.iter_mut()) {
            if *item == Item::Open {
                *item = Item::Answered;
                *s = status;
            } else {
                any = true;
            }
        }
        self.end = true;
        any
    }

    /// Whether the last item came.
    pub(crate) fn is_complete(&self) -> bool {
        self.end
    }

    /// The statuses (an item never answered: `PROTOCOL`); the item states go back to
    /// `spare`.
    pub(crate) fn finish(self, spare: &mut Spare) -> Vec<Status> {
        spare.item_states = self.items;
        self.statuses
    }
}
