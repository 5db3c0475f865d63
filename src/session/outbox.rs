//! Where finished requests go: the answer types a submitter sees, and the outbox that hands
//! each completion to the handle's ring, its callback, or the embedding thread.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use crate::error::{Error, ErrorKind};
use crate::spsc::{Consumer, Producer, ThreadWaker};
use crate::stats::{add, Counters, RequestKind};
use crate::tensor::Tensor;
use crate::wire::Status;

use super::metrics::Meter;
use super::reply::Spare;
use super::request::Request;

/// The answer to a request.
#[derive(Debug, PartialEq)]
#[non_exhaustive]
pub enum Reply {
    /// A pull's answer: per id, its tensor or why there is none.
    Pulled(Vec<Result<Tensor, Status>>),
    /// A push's answer: per item, how the service took it.
    Pushed(Vec<Status>),
    /// A recv's answer: per key, its tensor (possibly dead) or why there is none.
    Received(Vec<Result<Tensor, Status>>),
    /// A rows pull's answer: per table, its block of rows or why there is none.
    Rows(super::reply::PulledRows),
    /// A ping's answer: the round-trip time measured by the loop, from the request being
    /// queued on the connection to the pong being decoded, and the echoed payload size.
    Pong {
        /// Round-trip time.
        rtt: Duration,
        /// Payload bytes echoed.
        payload: u32,
    },
}

/// A finished request.
#[derive(Debug, PartialEq)]
pub struct Completion {
    /// The tag given when the request was submitted.
    pub tag: u64,
    /// The answer, or why there is none.
    pub result: Result<Reply, Error>,
    /// Vectors the request used, for the submitter's next requests.
    pub(crate) spare: Spare,
}

impl Completion {
    pub(crate) fn new(tag: u64, result: Result<Reply, Error>) -> Completion {
        Completion {
            tag,
            result,
            spare: Spare::default(),
        }
    }

    /// Every vector this completion holds, emptied, for reuse by later requests.
    pub(crate) fn into_spare(self) -> Spare {
        let mut spare = self.spare;
        if let Ok(reply) = self.result {
            spare.reclaim(reply);
        }
        spare
    }
}

/// Callback run on the loop thread for every completion of a handle.
pub type Callback = Arc<dyn Fn(Completion) + Send + Sync>;

/// A submitting handle's end, as the loop sees it.
pub(crate) struct HandleRings {
    pub requests: Consumer<Request>,
    pub completions: Producer<Completion>,
    pub callback: Option<Callback>,
    pub waker: Arc<ThreadWaker>,
}

/// Who gets a completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Submitter {
    /// A handle: its number in the outbox's table, and the generation of that entry
    /// (entries are reused once a handle is gone; a completion owed to the old handle is
    /// dropped).
    Handle(u32, u32),
    /// The embedding thread (embedded mode).
    Local,
}

/// One of the recvs the session fused into a request; each keeps its own deadline.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Member {
    pub origin: Submitter,
    pub tag: u64,
    pub deadline: Option<std::time::Instant>,
    /// Already completed (its deadline passed, or its tensor arrived).
    pub done: bool,
    /// Its deadline passed and a `CANCEL` of its item was sent: its answer (the tensor, if
    /// it was on its way, or `CANCELLED`) is awaited.
    pub cancel_sent: bool,
}

/// Where completions go: the handles' rings (or callbacks) and the embedding thread.
#[derive(Default)]
pub(crate) struct Outbox {
    pub handles: Vec<Option<HandleRings>>,
    /// Generation of each `handles` entry, bumped when the entry is reused.
    pub generations: Vec<u32>,
    pub local: VecDeque<Completion>,
}

impl Outbox {
    /// Takes a new handle's end into a free entry.
    pub fn add(&mut self, ep: HandleRings) {
        match self.handles.iter().position(Option::is_none) {
            Some(i) => {
                self.handles[i] = Some(ep);
                self.generations[i] = self.generations[i].wrapping_add(1);
            }
            None => {
                self.handles.push(Some(ep));
                self.generations.push(0);
            }
        }
    }

    /// Whether a handle has requests waiting in its ring.
    pub fn requests_waiting(&self) -> bool {
        self.handles
            .iter()
            .flatten()
            .any(|e| !e.requests.is_empty())
    }

    /// Hands one completion to whoever submitted the request.
    #[allow(clippy::too_many_arguments)]
    pub fn deliver(
        &mut self,
        counters: &Counters,
        meter: Meter<'_>,
        origin: Submitter,
        tag: u64,
        kind: RequestKind,
        result: Result<Reply, Error>,
        spare: Spare,
    ) {
        let counter = if result.is_ok() {
            &counters.completed[kind as usize]
        } else {
            &counters.failed[kind as usize]
        };
        add(counter, 1);
        meter.ended(kind, &result);
        let completion = Completion { tag, result, spare };
        match origin {
            Submitter::Local => self.local.push_back(completion),
            Submitter::Handle(i, generation) => {
                if self.generations.get(i as usize) != Some(&generation) {
                    return;
                }
                let Some(Some(ep)) = self.handles.get_mut(i as usize) else {
                    return;
                };
                if let Some(cb) = &ep.callback {
                    crate::panic::guarded("completion callback", || cb(completion));
                } else if ep.completions.push(completion).is_err() {
                    // The handle bounds its outstanding requests by the ring's capacity, so
                    // this cannot happen while the handle lives.
                    log::error!("completion ring full; completion {tag} dropped");
                }
                ep.waker.wake();
            }
        }
    }

    /// Completes a request: its own completion, or, for recvs the session fused, one
    /// completion per original recv with its entry of the answer.
    #[allow(clippy::too_many_arguments)]
    pub fn notify(
        &mut self,
        counters: &Counters,
        meter: Meter<'_>,
        origin: Submitter,
        tag: u64,
        kind: RequestKind,
        fused: &[Member],
        result: Result<Reply, Error>,
        spare: Spare,
    ) {
        if fused.is_empty() {
            return self.deliver(counters, meter, origin, tag, kind, result, spare);
        }
        // Members whose own deadline already passed got their completion then.
        match result {
            Ok(Reply::Received(results)) => {
                for (m, r) in fused.iter().zip(results).filter(|(m, _)| !m.done) {
                    let one = Ok(Reply::Received(vec![r]));
                    let kind = RequestKind::Recv;
                    let spare = Spare::default();
                    self.deliver(counters, meter, m.origin, m.tag, kind, one, spare);
                }
            }
            other => {
                // A fused recv answered as something else is the peer's protocol error.
                let e = other.err().unwrap_or(Error::new(ErrorKind::Protocol));
                for m in fused.iter().filter(|m| !m.done) {
                    let kind = RequestKind::Recv;
                    self.deliver(
                        counters,
                        meter,
                        m.origin,
                        m.tag,
                        kind,
                        Err(e.clone()),
                        Spare::default(),
                    );
                }
            }
        }
    }
}
