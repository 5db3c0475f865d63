//! Metrics through the client: this loop's per-peer metrics (embedded mode), and a peer's
//! counters asked over the wire with a `STATS` request.

use std::time::Instant;

use super::ticket::{Checkpoint, RemoteStats};
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

    /// Asks `peer` to save its tables (a `CHECKPOINT` request, behind the handshake like any
    /// other): it writes one file per table into its own checkpoint directory
    /// (`STARWIRE_CHECKPOINT_DIR`, never named by the requester), each atomically, then the
    /// manifest `checkpoint.json`; the result is the manifest, a JSON document naming each
    /// table's file, rows and bytes (`docs/wire-format.md`, section 4.12). The snapshot is
    /// fuzzy: pushes the peer applies while a table is being written may or may not be in
    /// it; every push acknowledged before this request was sent is.
    ///
    /// Saving takes as long as writing the tables (about a second per GB): give a deadline
    /// to match, or none. A peer without a checkpoint directory, or that serves no table
    /// that can be saved, answers [`ErrorKind::Remote`]`(`[`Status::Unimplemented`](crate::Status::Unimplemented)`)`;
    /// one already saving with two more checkpoints queued answers
    /// [`Status::Unavailable`](crate::Status::Unavailable); a table that failed to save,
    /// [`Status::Internal`](crate::Status::Internal) with the peer's message naming the table,
    /// its file and what went wrong ([`Error::remote_message`]).
    pub fn checkpoint(
        &mut self,
        peer: impl Into<Peer>,
        deadline: Option<Instant>,
    ) -> Result<Ticket<Checkpoint>, Error> {
        let spare = self.spare();
        self.submit_with(RequestOp::Checkpoint, peer.into(), deadline, spare)
    }
}

impl Client<Local> {
    /// This loop's per-peer, per-operation metrics.
    pub fn metrics(&self) -> Metrics {
        Metrics::of(&[&self.mode.shared.counters])
    }
}

impl Completion {
    /// A checkpoint request's answer: the peer's manifest (JSON).
    pub fn into_checkpoint_manifest(self) -> Result<String, Error> {
        self.into_stats_document()
    }

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
