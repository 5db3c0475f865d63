//! Tensor requests in flight: the answers a pull or push is assembling on the client, and
//! the pushes a server is receiving. Pure bookkeeping: the loop feeds it frames and
//! payload, it says where payload goes and when a request is complete.

use crate::tensor::{OwnedMeta, Tensor, TensorAllocator};

/// One item of an answer or of an incoming push.
pub(crate) enum Item {
    /// Not answered yet.
    Open,
    /// A chunked tensor announced, whose memory is taken when its first chunk arrives: a
    /// peer cannot make us commit memory for contents it has not started to send.
    Deferred(OwnedMeta),
    /// Answered: a tensor (in memory) or why there is none.
    Done(Result<Tensor, Status>),
    /// Answered and already handed to its requester.
    Taken,
}

impl Item {
    /// The tensor receiving this item's contents, allocated now if it was deferred.
    fn tensor_mut(&mut self, alloc: &dyn TensorAllocator) -> Option<&mut Tensor> {
        if let Item::Deferred(meta) = self {
            let t = Tensor::receive_owned(meta, alloc).ok_or(Status::ResourceExhausted);
            *self = Item::Done(t);
        }
        match self {
            Item::Done(Ok(t)) => Some(t),
            _ => None,
        }
    }

    /// For a tensor entry: deferred when chunked, received now otherwise.
    fn of(meta: &crate::wire::TensorMeta<'_>, alloc: &dyn TensorAllocator) -> Item {
        if meta.chunked {
            if let Some(m) = OwnedMeta::of(meta) {
                return Item::Deferred(m);
            }
        }
        Item::Done(Tensor::receive(meta, alloc).ok_or(Status::ResourceExhausted))
    }

    fn finish(self) -> Result<Tensor, Status> {
        match self {
            Item::Done(r) => r,
            Item::Open | Item::Deferred(_) | Item::Taken => Err(Status::Protocol),
        }
    }
}
use crate::wire::{PushEntries, ResponseEntries, Status};

/// What the client knows of a request's answer so far.
pub(crate) enum ReplyState {
    /// A ping: answered by one `PONG`.
    Ping,
    /// A pull (one tensor per id) or a recv (one tensor per key).
    Pull {
        /// A recv: dead tensors are allowed and the reply is `Received`.
        recv: bool,
        results: Vec<Item>,
        /// Chunked tensors still arriving: item index and byte length.
        chunks: Vec<(u32, u64)>,
        end: bool,
    },
    /// A push: one status per item.
    Push {
        statuses: Vec<Option<Status>>,
        end: bool,
    },
}

/// Why an answer is a protocol violation.
pub(crate) type Violation = &'static str;

impl ReplyState {
    pub(crate) fn pull(n: usize) -> ReplyState {
        ReplyState::Pull {
            recv: false,
            results: (0..n).map(|_| Item::Open).collect(),
            chunks: Vec::new(),
            end: false,
        }
    }

    pub(crate) fn recv(n: usize) -> ReplyState {
        ReplyState::Pull {
            recv: true,
            results: (0..n).map(|_| Item::Open).collect(),
            chunks: Vec::new(),
            end: false,
        }
    }

    pub(crate) fn push(n: usize) -> ReplyState {
        ReplyState::Push {
            statuses: vec![None; n],
            end: false,
        }
    }

    /// Takes the entries of a `RESPONSE`. Tensors get memory from `alloc`.
    pub(crate) fn accept(
        &mut self,
        entries: ResponseEntries<'_>,
        end: bool,
        alloc: &dyn TensorAllocator,
    ) -> Result<(), Violation> {
        match self {
            ReplyState::Ping => return Err("response to a ping"),
            ReplyState::Pull {
                results,
                chunks,
                end: e,
                ..
            } => {
                for entry in entries {
                    let slot = results
                        .get_mut(entry.index as usize)
                        .ok_or("response item out of range")?;
                    if !matches!(slot, Item::Open) {
                        return Err("response item answered twice");
                    }
                    *slot = match entry.tensor {
                        None if entry.status.is_ok() => return Err("pull answer without a tensor"),
                        None => Item::Done(Err(entry.status)),
                        Some(meta) => {
                            if meta.chunked {
                                chunks.push((entry.index, meta.byte_len));
                            }
                            Item::of(&meta, alloc)
                        }
                    };
                }
                *e |= end;
            }
            ReplyState::Push { statuses, end: e } => {
                for entry in entries {
                    if entry.tensor.is_some() {
                        return Err("push answer with a tensor");
                    }
                    let slot = statuses
                        .get_mut(entry.index as usize)
                        .ok_or("response item out of range")?;
                    if slot.replace(entry.status).is_some() {
                        return Err("response item answered twice");
                    }
                }
                *e |= end;
            }
        }
        Ok(())
    }

    /// Fails every item not answered yet with `status` (an `ERROR` for the request). Returns
    /// whether any item had been answered: then the request completes with the items it got.
    pub(crate) fn fail_open(&mut self, status: Status) -> bool {
        match self {
            ReplyState::Ping => false,
            ReplyState::Pull {
                results,
                chunks,
                end,
                ..
            } => {
                let mut any = false;
                for item in results.iter_mut() {
                    match item {
                        Item::Open | Item::Deferred(_) => *item = Item::Done(Err(status)),
                        _ => any = true,
                    }
                }
                // A chunked tensor cut short fails too.
                for &(i, _) in chunks.iter() {
                    if let Some(item) = results.get_mut(i as usize) {
                        *item = Item::Done(Err(status));
                    }
                }
                chunks.clear();
                *end = true;
                any
            }
            ReplyState::Push { statuses, end } => {
                let any = statuses.iter().any(Option::is_some);
                for s in statuses.iter_mut().filter(|s| s.is_none()) {
                    *s = Some(status);
                }
                *end = true;
                any
            }
        }
    }

    /// Memory for item `index`'s contents, if it has any (allocated from `alloc` now for
    /// a chunked tensor whose first chunk is arriving).
    pub(crate) fn tensor_mut(
        &mut self,
        index: u32,
        alloc: &dyn TensorAllocator,
    ) -> Option<&mut Tensor> {
        match self {
            ReplyState::Pull { results, .. } => results.get_mut(index as usize)?.tensor_mut(alloc),
            _ => None,
        }
    }

    /// Takes item `index` out if it is completely received (for fused recvs, whose members
    /// complete one by one).
    pub(crate) fn take_ready(&mut self, index: u32) -> Option<Result<Tensor, Status>> {
        let ReplyState::Pull {
            results, chunks, ..
        } = self
        else {
            return None;
        };
        if chunks.iter().any(|&(i, _)| i == index) {
            return None;
        }
        let item = results.get_mut(index as usize)?;
        if !matches!(item, Item::Done(_)) {
            return None;
        }
        match std::mem::replace(item, Item::Taken) {
            Item::Done(r) => Some(r),
            _ => None,
        }
    }

    /// Notes that chunk bytes of item `index` up to `end_offset` arrived.
    pub(crate) fn chunk_progress(&mut self, index: u32, end_offset: u64) {
        if let ReplyState::Pull { chunks, .. } = self {
            chunks.retain(|&(i, len)| !(i == index && end_offset == len));
        }
    }

    /// Whether everything the answer announced has arrived.
    pub(crate) fn is_complete(&self) -> bool {
        match self {
            ReplyState::Ping => false,
            ReplyState::Pull { chunks, end, .. } => *end && chunks.is_empty(),
            ReplyState::Push { end, .. } => *end,
        }
    }

    /// The finished answer; items the responder never answered fail with `PROTOCOL`.
    pub(crate) fn finish(self) -> crate::core::Reply {
        match self {
            ReplyState::Pull { results, recv, .. } => {
                let results = results.into_iter().map(Item::finish).collect();
                if recv {
                    crate::core::Reply::Received(results)
                } else {
                    crate::core::Reply::Pulled(results)
                }
            }
            ReplyState::Push { statuses, .. } => crate::core::Reply::Pushed(
                statuses
                    .into_iter()
                    .map(|s| s.unwrap_or(Status::Protocol))
                    .collect(),
            ),
            ReplyState::Ping => crate::core::Reply::Pushed(Vec::new()),
        }
    }
}

/// A push a server is receiving.
pub(crate) struct IncomingPush {
    pub handle: u64,
    items: Vec<(u64, Item)>,
    chunks: Vec<(u32, u64)>,
    frame_done: bool,
}

impl IncomingPush {
    pub(crate) fn new(handle: u64, entries: PushEntries<'_>, alloc: &dyn TensorAllocator) -> Self {
        let mut chunks = Vec::new();
        let items = entries
            .enumerate()
            .map(|(i, e)| {
                if e.meta.chunked {
                    chunks.push((i as u32, e.meta.byte_len));
                }
                (e.var_id, Item::of(&e.meta, alloc))
            })
            .collect();
        IncomingPush {
            handle,
            items,
            chunks,
            frame_done: false,
        }
    }

    pub(crate) fn tensor_mut(
        &mut self,
        index: u32,
        alloc: &dyn TensorAllocator,
    ) -> Option<&mut Tensor> {
        self.items.get_mut(index as usize)?.1.tensor_mut(alloc)
    }

    /// The received items, each a tensor or why it failed to arrive.
    pub(crate) fn into_items(self) -> Vec<(u64, Result<Tensor, Status>)> {
        self.items
            .into_iter()
            .map(|(id, item)| (id, item.finish()))
            .collect()
    }

    /// Number of items.
    pub(crate) fn len(&self) -> usize {
        self.items.len()
    }

    pub(crate) fn chunk_progress(&mut self, index: u32, end_offset: u64) {
        self.chunks
            .retain(|&(i, len)| !(i == index && end_offset == len));
    }

    pub(crate) fn frame_done(&mut self) {
        self.frame_done = true;
    }

    pub(crate) fn is_complete(&self) -> bool {
        self.frame_done && self.chunks.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_fails_only_the_items_not_answered() {
        let mut s = ReplyState::push(3);
        if let ReplyState::Push { statuses, .. } = &mut s {
            statuses[1] = Some(Status::Ok);
        }
        assert!(s.fail_open(Status::Aborted), "one item was answered");
        assert!(s.is_complete());
        match s.finish() {
            crate::core::Reply::Pushed(v) => {
                assert_eq!(v, [Status::Aborted, Status::Ok, Status::Aborted])
            }
            other => panic!("{other:?}"),
        }
        let mut none = ReplyState::recv(2);
        assert!(
            !none.fail_open(Status::Aborted),
            "nothing answered: the request fails"
        );
    }
}
