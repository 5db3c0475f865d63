//! Metrics through the client: this loop's per-peer metrics (embedded mode), and a peer's
//! counters asked over the wire with a `STATS` request.

use std::time::Instant;

use super::ticket::RemoteStats;
use super::{Client, Local, Mode, Ticket};
use crate::cluster::Peer;
use crate::error::{Error, ErrorKind};
use crate::session::{Completion, Reply, RequestOp};
use crate::stats::Metrics;

impl<M: Mode> Client<M> {
    /// Asks `peer` for its counters and latencies (a `STATS` request, behind the handshake
    /// like any other): its result is the peer's JSON document (`docs/wire-format.md`,
    /// section 4.11). A peer with the stats endpoint off (`STARWIRE_STATS_ENDPOINT=0`)
    /// answers [`ErrorKind::Remote`]`(`[`Status::Unimplemented`](crate::Status::Unimplemented)`)`.
    pub fn remote_stats(
        &mut self,
        peer: impl Into<Peer>,
        deadline: Option<Instant>,
    ) -> Result<Ticket<RemoteStats>, Error> {
        let spare = self.spare();
        self.submit_with(RequestOp::Stats, peer.into(), deadline, spare)
    }
}

impl Client<Local> {
    /// This loop's per-peer, per-operation metrics.
    pub fn metrics(&self) -> Metrics {
        Metrics::of(&[&self.mode.shared.counters])
    }
}

impl Completion {
    /// A stats request's answer: the peer's JSON document.
    pub fn into_stats_document(self) -> Result<String, Error> {
        match self.result? {
            Reply::Pulled(mut items) if items.len() == 1 => match items.pop() {
                Some(Ok(t)) => String::from_utf8(t.bytes().to_vec())
                    .map_err(|_| Error::new(ErrorKind::Protocol)),
                Some(Err(s)) => Err(Error::new(ErrorKind::Remote(s))),
                None => Err(Error::new(ErrorKind::Protocol)),
            },
            _ => Err(Error::new(ErrorKind::OtherKind)),
        }
    }
}
