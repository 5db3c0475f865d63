//! What a [`Pipeline`](super::Pipeline) step did ([`PipelineReport`]), and the pushes that
//! failed after their call had returned ([`PushFailure`]).

use std::fmt::Write;
use std::time::Duration;

use crate::cluster::Peer;
use crate::error::Error;

/// What a step of a [`Pipeline`](super::Pipeline) did, the counterpart of
/// [`StepReport`](crate::StepReport). A step is the calls from the
/// [`pull`](super::Pipeline::pull) that delivers its rows to the next `pull`: the pull,
/// the [`prefetch`](super::Pipeline::prefetch) of the next batch and the
/// [`push`](super::Pipeline::push) of its gradients. Each call returns the report of the
/// step so far, so the one `push` returns covers the whole step in the usual order.
///
/// Bytes are payload: 8 per id sent, and per row each way its bytes as it travelled
/// (`row_bytes`, or fewer with a narrower wire dtype); frame headers are not counted. Requests and answers are counted in the step whose call sent or took them: the
/// rows of step `t + 1` requested by the prefetch of step `t` count as sent in step `t`
/// and received in step `t + 1`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PipelineReport {
    /// The step, counted from 0: the number of pulls that delivered rows before it.
    pub step: u64,
    /// Time spent in the step's calls: the time the caller's computation could not run
    /// because of communication ("visible communication": waiting, and the planning,
    /// summing and copying around the wire).
    pub visible: Duration,
    /// The part of `visible` spent waiting for answers (rows, or acknowledgements of
    /// pushes).
    pub waited: Duration,
    /// Distinct ids of the step's batch.
    pub unique: usize,
    /// Positions of the batch whose row no PS had (left zero).
    pub missing: usize,
    /// Rows received (distinct rows, as the PS tasks sent them).
    pub rows_received: usize,
    /// Gradient rows sent (distinct rows, duplicates summed).
    pub rows_sent: usize,
    /// Payload bytes received.
    pub bytes_received: u64,
    /// Payload bytes sent: ids of pulls, ids and gradient rows of pushes.
    pub bytes_sent: u64,
    /// Pushes in flight when the last call of the step returned.
    pub pushes_in_flight: usize,
    /// PS parts of the step's pull whose request had been sent before the pull was
    /// called (by [`prefetch`](super::Pipeline::prefetch)).
    pub prefetched: usize,
    /// PS parts of the step's pull sent again at the pull because more pushes had been
    /// issued since the prefetch than the staleness bound allows its rows to miss.
    pub refetched: usize,
    /// PS parts of the step's pull whose rows travelled in the table's dtype although
    /// another wire dtype was set: the PS did not announce `row_formats`.
    pub fallbacks: usize,
    /// The most of this worker's pushes the step's rows may miss: pushes issued before
    /// the pull returned that some PS part's request was sent without waiting for (or
    /// that a row served from the cache was fetched before). Never above the staleness
    /// bound.
    pub may_miss: u64,
    /// Distinct rows of the step served from the row cache, not pulled (0 without a
    /// cache).
    pub cache_hits: usize,
    /// Distinct rows of the step the row cache could not serve (absent, or too old), so
    /// pulled: `rows_received` of the step (0 without a cache).
    pub cache_misses: usize,
    /// Bytes of the rows the cache held when the step's last call returned.
    pub cache_bytes: u64,
    /// Rows the cache evicted during the step's calls.
    pub cache_evictions: u64,
    /// Distinct rows of the step the cache held too old to serve, which a versioned pull
    /// named and the PS answered unchanged: their bytes did not travel, the cache's copy
    /// was used and its clock renewed (0 without a cache, or when a PS does not announce
    /// `row_versions`). Counted in `cache_misses`, not in `rows_received`.
    pub rows_unchanged: usize,
}

impl PipelineReport {
    /// Resets the report for step `step`, keeping nothing of the last.
    pub(crate) fn begin(&mut self, step: u64) {
        *self = PipelineReport {
            step,
            ..PipelineReport::default()
        };
    }
}

/// A push whose part at one PS failed after the call that sent it had returned: refused
/// by the PS, timed out, or lost with its connection. Reported by the
/// [`Pipeline`](super::Pipeline)'s next call, listed by
/// [`failed_pushes`](super::Pipeline::failed_pushes) until the call after.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushFailure {
    /// The step whose push it was.
    pub step: u64,
    /// The PS, by its position in the list the pipeline was made with.
    pub shard: usize,
    /// Its address.
    pub peer: Peer,
    /// What went wrong.
    pub error: Error,
}

/// The error a call returns for the push failures it found, `failures` in the order found
/// (at least one): the first one's kind and peer, a message naming each step and PS.
pub(crate) fn failures_error(failures: &[PushFailure]) -> Error {
    let first = &failures[0];
    let mut msg = String::new();
    for (i, f) in failures.iter().enumerate() {
        let sep = if i == 0 { "" } else { "; " };
        let _ = write!(
            msg,
            "{sep}asynchronous push of step {} to PS {} ({}) failed: {}",
            f.step,
            f.shard,
            f.peer.addr(),
            f.error
        );
    }
    Error::new(first.error.kind())
        .with_peer(first.peer.addr())
        .with_message(msg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;
    use crate::wire::Status;

    #[test]
    fn the_error_names_every_failed_step_and_ps() {
        let a: std::net::SocketAddr = "10.0.0.1:7000".parse().unwrap();
        let b: std::net::SocketAddr = "10.0.0.2:7000".parse().unwrap();
        let failures = [
            PushFailure {
                step: 7,
                shard: 1,
                peer: Peer::from(b),
                error: Error::new(ErrorKind::Remote(Status::InvalidArgument)).with_peer(b),
            },
            PushFailure {
                step: 8,
                shard: 0,
                peer: Peer::from(a),
                error: Error::new(ErrorKind::ConnectionLost).with_peer(a),
            },
        ];
        let e = failures_error(&failures);
        assert_eq!(e.kind(), ErrorKind::Remote(Status::InvalidArgument));
        assert_eq!(e.peer(), Some(b));
        let m = e.remote_message().unwrap();
        assert!(m.contains("step 7 to PS 1 (10.0.0.2:7000)"), "{m}");
        assert!(m.contains("step 8 to PS 0 (10.0.0.1:7000)"), "{m}");
        assert!(m.contains("connection to 10.0.0.1:7000 lost"), "{m}");
    }
}
