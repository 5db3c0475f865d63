//! A request in flight: what the loop keeps of it from submit to completion, and its
//! answer as assembled so far, by the kind of answer it expects.

use std::time::Instant;

use crate::error::{Error, ErrorKind};
use crate::stats::RequestKind;
use crate::tensor::{SharedAllocator, Tensor, TensorAllocator};
use crate::wire::{FrameKind, ResponseEntries, Status};

use super::super::assemble::{Statuses, Tensors};
use super::super::budget::ConnBudget;
use super::super::observer::Marks;
use super::super::reply::{Reply, Spare};
use super::super::request::{FusedMember, RequestOp, Submitter};
use super::super::rows::RowsReply;
use super::super::violation::Violation;

/// An in-flight request.
pub(crate) struct InFlight {
    pub tag: u64,
    pub submitter: Submitter,
    pub kind: RequestKind,
    /// What to send; taken when the request is encoded.
    pub op: Option<RequestOp>,
    /// The answer so far.
    pub state: ReplyState,
    /// Memory for received tensors, when the request brings its own.
    pub alloc: Option<SharedAllocator>,
    /// The connection it goes out on.
    pub conn: u32,
    /// When it was queued on the connection.
    pub sent: Option<Instant>,
    /// For recvs fused by the session: the original requests, one per key, in key order.
    pub fused: Vec<FusedMember>,
    /// The deadline sent with the request (`timeout_ms`): its own, or for a fused group
    /// the latest of its members' (none when one of them has none).
    pub wire_deadline: Option<Instant>,
    /// Its deadline passed and a `CANCEL` was sent: the responder's verdict is awaited.
    pub cancel_sent: bool,
    /// The submitter's vectors, returned with the completion.
    pub spare: Spare,
    /// Its times for the trace.
    pub marks: Marks,
}

impl InFlight {
    /// The kind its metrics count it under: recvs the session fused count one by one.
    pub(crate) fn metered_kind(&self) -> RequestKind {
        if self.fused.is_empty() {
            self.kind
        } else {
            RequestKind::Recv
        }
    }
}

/// What the client knows of a request's answer so far, by the answer it expects.
pub(crate) enum ReplyState {
    /// A ping: answered by one `PONG`.
    Ping,
    /// A pull (one tensor per id) or a stats request (one document).
    Pulled(Tensors),
    /// A recv: one tensor per key.
    Received(Tensors),
    /// A push or a rows push: one status per item.
    Pushed(Statuses),
    /// A rows pull: one block per table.
    Rows(RowsReply),
}

impl ReplyState {
    /// The state the answer to `op` is assembled in, in `spare`'s vectors.
    pub(crate) fn of(op: &RequestOp, spare: &mut Spare) -> ReplyState {
        match op {
            RequestOp::Ping { .. } => ReplyState::Ping,
            RequestOp::Pull { ids, .. } => {
                ReplyState::Pulled(Tensors::new(ids.len(), spare, false))
            }
            RequestOp::Stats | RequestOp::Checkpoint => {
                ReplyState::Pulled(Tensors::new(1, spare, false))
            }
            RequestOp::Recv { keys, .. } => {
                ReplyState::Received(Tensors::new(keys.len(), spare, false))
            }
            RequestOp::Push { items } => ReplyState::Pushed(Statuses::new(items.len(), spare)),
            RequestOp::PushRows { tables, .. } => {
                ReplyState::Pushed(Statuses::new(tables.len(), spare))
            }
            // Memory kept from earlier answers serves only requests that use the runtime's
            // allocator: one that brings its own gets its blocks from it.
            RequestOp::PullRows {
                tables,
                alloc,
                held,
                ..
            } => ReplyState::Rows(RowsReply::new(tables, held, spare, alloc.is_none())),
        }
    }

    /// What the request is, for a violation's text.
    fn what(&self) -> &'static str {
        match self {
            ReplyState::Ping => "ping",
            ReplyState::Pulled(_) => "pull",
            ReplyState::Received(_) => "recv",
            ReplyState::Pushed(_) => "push",
            ReplyState::Rows(_) => "rows pull",
        }
    }

    /// The violation of answering this request with a frame of `kind`.
    pub(crate) fn wrong(&self, handle: u64, kind: FrameKind) -> Violation {
        Violation::WrongAnswer {
            handle,
            kind,
            request: self.what(),
        }
    }

    /// Takes the entries of a `RESPONSE` to request `handle`. Tensors get memory from
    /// `alloc`.
    pub(crate) fn accept(
        &mut self,
        handle: u64,
        entries: ResponseEntries<'_>,
        end: bool,
        alloc: &dyn TensorAllocator,
    ) -> Result<(), Violation> {
        let t = match self {
            ReplyState::Ping => return Err(self.wrong(handle, FrameKind::Response)),
            ReplyState::Rows(r) => return r.accept(handle, entries, end, alloc),
            ReplyState::Pushed(s) => {
                for entry in entries {
                    s.accept(handle, &entry)?;
                }
                s.end(end);
                return Ok(());
            }
            ReplyState::Pulled(t) | ReplyState::Received(t) => t,
        };
        for entry in entries {
            let index = entry.index;
            t.answer(handle, index)?;
            if !entry.missing.is_empty() {
                let why = "missing rows in the answer to a request without rows";
                return Err(Violation::BadItem { handle, index, why });
            }
            t.accept(handle, &entry, alloc)?;
        }
        t.end(end);
        Ok(())
    }

    /// Fails every item not answered yet with `status` (an `ERROR` for the request). Returns
    /// whether any item had been answered: then the request completes with the items it got.
    pub(crate) fn fail_open(&mut self, status: Status) -> bool {
        match self {
            ReplyState::Ping => false,
            ReplyState::Pulled(t) | ReplyState::Received(t) => t.fail_open(status),
            ReplyState::Rows(r) => r.blocks().fail_open(status),
            ReplyState::Pushed(s) => s.fail_open(status),
        }
    }

    /// Memory for item `index`'s contents, if it has any.
    pub(crate) fn tensor_mut(
        &mut self,
        index: u32,
        alloc: &dyn TensorAllocator,
        budget: &ConnBudget,
    ) -> Option<&mut Tensor> {
        match self {
            ReplyState::Pulled(t) | ReplyState::Received(t) => t.tensor_mut(index, alloc, budget),
            ReplyState::Rows(r) => r.tensor_mut(index, alloc, budget),
            ReplyState::Ping | ReplyState::Pushed(_) => None,
        }
    }

    /// Takes a recv's item `index` out if it is completely received (for fused recvs, whose
    /// members complete one by one).
    pub(crate) fn take_ready(&mut self, index: u32) -> Option<Result<Tensor, Status>> {
        match self {
            ReplyState::Received(t) => t.take_ready(index),
            _ => None,
        }
    }

    /// Chunk bytes of item `index` up to `end_offset` arrived.
    pub(crate) fn chunk_progress(&mut self, index: u32, end_offset: u64) {
        match self {
            ReplyState::Pulled(t) | ReplyState::Received(t) => t.chunk_progress(index, end_offset),
            ReplyState::Rows(r) => r.blocks().chunk_progress(index, end_offset),
            ReplyState::Ping | ReplyState::Pushed(_) => {}
        }
    }

    /// Whether everything the answer announced has arrived.
    pub(crate) fn is_complete(&self) -> bool {
        match self {
            ReplyState::Ping => false,
            ReplyState::Pulled(t) | ReplyState::Received(t) => t.is_complete(),
            ReplyState::Rows(r) => r.is_complete(),
            ReplyState::Pushed(s) => s.is_complete(),
        }
    }

    /// The finished answer (items the responder never answered fail with `PROTOCOL`); the
    /// vectors it does not hand out go back to `spare`. A ping completes with its `PONG`,
    /// never here: finishing one is an error.
    pub(crate) fn finish(self, spare: &mut Spare) -> Result<Reply, Error> {
        Ok(match self {
            ReplyState::Pulled(t) => Reply::Pulled(t.finish(spare)),
            ReplyState::Received(t) => Reply::Received(t.finish(spare)),
            ReplyState::Pushed(s) => Reply::Pushed(s.finish(spare)),
            ReplyState::Rows(r) => Reply::Rows(r.finish(spare)),
            ReplyState::Ping => {
                let e = Error::new(ErrorKind::Protocol).with_message("a ping ended without a pong");
                return Err(e);
            }
        })
    }
}
