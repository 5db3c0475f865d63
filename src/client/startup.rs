//! The start-up check: wait until the given peers answer, or name the ones that do not.

use std::fmt;
use std::time::{Duration, Instant};

use super::{Client, Mode};
use crate::cluster::Peer;
use crate::error::Error;

/// Peers that did not answer within the time [`Client::wait_for_peers`] was given, each
/// with the error of its last attempt.
#[derive(Debug, Clone)]
pub struct Unreachable {
    /// The peers that never answered, in the order they were given, and why.
    pub peers: Vec<(Peer, Error)>,
    /// How long they were tried.
    pub waited: Duration,
}

impl fmt::Display for Unreachable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.peers.len();
        write!(f, "{n} peer(s) unreachable after {:?}:", self.waited)?;
        for (peer, e) in &self.peers {
            write!(f, " {peer} ({e});")?;
        }
        Ok(())
    }
}

impl std::error::Error for Unreachable {}

/// Pause between rounds of attempts at peers that have not answered yet.
const ROUND_PAUSE: Duration = Duration::from_millis(100);

impl<M: Mode> Client<M> {
    /// Waits until every peer of `peers` has answered a ping, trying those that have not
    /// (connect, handshake, ping) again and again until `timeout` has passed; then names
    /// the ones that never answered, each with its last error. For a task starting up: it
    /// tells which peers never came up, instead of a first request hanging or failing
    /// without saying which.
    pub fn wait_for_peers<P: Into<Peer>>(
        &mut self,
        peers: impl IntoIterator<Item = P>,
        timeout: Duration,
    ) -> Result<(), Unreachable> {
        let start = Instant::now();
        let end = start + timeout;
        let mut waiting: Vec<(Peer, Option<Error>)> =
            peers.into_iter().map(|p| (p.into(), None)).collect();
        let mut tickets = Vec::with_capacity(waiting.len());
        loop {
            tickets.clear();
            for (i, (peer, last)) in waiting.iter_mut().enumerate() {
                match self.ping(*peer, 0, Some(end)) {
                    Ok(t) => tickets.push((i, t)),
                    Err(e) => *last = Some(e),
                }
            }
            let mut answered = vec![false; waiting.len()];
            for (i, t) in tickets.drain(..) {
                match self.wait(t) {
                    Ok(_) => answered[i] = true,
                    Err(e) => waiting[i].1 = Some(e),
                }
            }
            let mut i = 0;
            waiting.retain(|_| {
                i += 1;
                !answered[i - 1]
            });
            let now = Instant::now();
            if waiting.is_empty() {
                return Ok(());
            }
            if now >= end {
                let timeout_error = || Error::new(crate::ErrorKind::Timeout);
                let peers = waiting
                    .into_iter()
                    .map(|(p, e)| (p, e.unwrap_or_else(timeout_error)))
                    .collect();
                return Err(Unreachable {
                    peers,
                    waited: now - start,
                });
            }
            std::thread::sleep(ROUND_PAUSE.min(end - now));
        }
    }
}
