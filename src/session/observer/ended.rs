//! What the observer is fed: a request that ended, with its trace times. Data only.

use std::time::{Duration, Instant};

use crate::stats::{Outcome, RequestKind};

use super::super::request::Stamp;

/// A request of this task that ended: answered, failed, or given up.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ended {
    /// The submitter's tag.
    pub tag: u64,
    pub kind: RequestKind,
    /// Its peer's index in the loop's table ([`NO_PEER`] if none).
    pub peer: u32,
    pub outcome: Outcome,
    /// From being queued on the connection to its answer, when its peer answered.
    pub latency: Option<Duration>,
    /// When it was queued on its connection, if it was.
    pub sent: Option<Instant>,
    /// Its trace times, when it got as far as the loop's table of requests.
    pub marks: Option<Marks>,
}

/// The trace times of a request in flight.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Marks {
    pub submitted: Instant,
    /// The first frame of its answer decoded.
    pub answered: Option<Instant>,
    pub step: u64,
    /// Bytes its frames queued.
    pub bytes: u64,
}

impl Marks {
    /// The marks of a request the loop took at `now`.
    #[inline]
    pub(crate) fn taken(stamp: Stamp, now: Instant) -> Marks {
        Marks {
            submitted: stamp.submitted.unwrap_or(now),
            answered: None,
            step: stamp.step,
            bytes: 0,
        }
    }
}
