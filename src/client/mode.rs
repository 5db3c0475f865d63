//! The two ways a [`Client`](super::Client)'s requests reach a loop, [`Threads`](super::Threads)
//! and [`Local`](super::Local): the sealed trait each implements.

use std::time::{Duration, Instant};

use crate::session::{Completion, Request};

// A full ring hands the request back by value, as the ring itself does: boxing it would
// allocate on every submission.
#[allow(clippy::result_large_err)]
pub(super) mod sealed {
    use super::*;

    /// A request on its way to a mode (a wrapper: the request type is the crate's own).
    pub struct Outgoing(pub(crate) Request);

    /// What a mode does for its [`Client`]; not implementable outside the crate.
    pub trait Drive {
        /// Queues `req` on the loop that owns its `(peer, lane)`; gives it back when that
        /// loop's ring is full.
        fn send(&mut self, req: Outgoing) -> Result<(), Outgoing>;
        /// The next delivered completion, if any.
        fn next(&mut self) -> Option<Completion>;
        /// Runs the loop once if this thread drives it, without waiting.
        fn turn(&mut self);
        /// One step of waiting for something to arrive: spin or park, as the configured
        /// spin and polling settings say. `idle_since` is when waiting began, reset when
        /// anything happens.
        fn idle(&mut self, idle_since: &mut Instant);
        /// The loops are gone: whatever they did not complete never will be.
        fn stopped(&self) -> bool;
        /// A wait is about to idle for the first time.
        fn wait_begins(&mut self) {}
        /// A wait that had to idle ended after `took` (from its first idle step).
        fn waited(&mut self, _took: Duration) {}
    }
}

/// The two ways a [`Client`](super::Client)'s requests reach a loop:
/// [`Threads`](super::Threads) and [`Local`](super::Local). Sealed.
pub trait Mode: sealed::Drive {}
