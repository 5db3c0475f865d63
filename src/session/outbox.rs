//! Where finished requests go: the handles' rings (or their callbacks) and the embedding
//! thread.

use std::collections::VecDeque;
use std::sync::Arc;

use crate::error::Error;
use crate::spsc::{Consumer, Producer, ThreadWaker};

use super::reply::{Callback, Completion, Reply, Spare};
use super::request::{Request, Submitter};

/// A submitting handle's rings, as the loop sees them.
pub(crate) struct HandleRings {
    pub requests: Consumer<Request>,
    pub completions: Producer<Completion>,
    pub callback: Option<Callback>,
    pub waker: Arc<ThreadWaker>,
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
    /// Takes a new handle's rings into a free entry.
    pub fn add(&mut self, rings: HandleRings) {
        match self.handles.iter().position(Option::is_none) {
            Some(i) => {
                self.handles[i] = Some(rings);
                self.generations[i] = self.generations[i].wrapping_add(1);
            }
            None => {
                self.handles.push(Some(rings));
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

    /// The submitter of the requests in handle entry `i`'s ring.
    pub fn submitter(&self, i: usize) -> Submitter {
        Submitter::Handle(i as u32, self.generations[i])
    }

    /// Hands one completion to whoever submitted the request.
    pub fn deliver(
        &mut self,
        submitter: Submitter,
        tag: u64,
        result: Result<Reply, Error>,
        spare: Spare,
    ) {
        let completion = Completion { tag, result, spare };
        match submitter {
            Submitter::Local => self.local.push_back(completion),
            Submitter::Handle(i, generation) => {
                if self.generations.get(i as usize) != Some(&generation) {
                    return;
                }
                let Some(Some(h)) = self.handles.get_mut(i as usize) else {
                    return;
                };
                if let Some(cb) = &h.callback {
                    crate::panic::guarded("completion callback", || cb(completion));
                } else if h.completions.push(completion).is_err() {
                    // The handle bounds its outstanding requests by the ring's capacity, so
                    // this cannot happen while the handle lives.
                    log::error!("completion ring full; completion {tag} dropped");
                }
                h.waker.wake();
            }
        }
    }
}
