//! Membership changes: requests to retired addresses fail at once, and connections to them
//! are drained (their requests finish, nothing new is sent) and then closed.

use std::net::SocketAddr;
use std::sync::Arc;

use crate::cluster::Retirements;
use crate::error::Error;

use super::conn::Phase;
use super::conns::Conns;
use super::requests::Requests;

/// The addresses this loop no longer sends to, and its connections to them still draining.
#[derive(Default)]
pub(crate) struct Members {
    retired: Arc<Retirements>,
    /// Connections to retired addresses, closed once no request is left on them.
    draining: Vec<u32>,
}

impl Members {
    /// Takes `retired` as the addresses not to send to: later requests to them fail, and
    /// the connections to them in `conns` are drained and closed.
    pub(crate) fn retire(&mut self, retired: Arc<Retirements>, conns: &mut Conns) {
        self.retired = retired;
        let to_drain: Vec<u32> = conns
            .slab
            .iter()
            .filter(|(_, c)| c.phase != Phase::Closing)
            .filter(|(_, c)| c.peer_addr().is_some_and(|a| self.is_retired(a)))
            .map(|(slot, _)| slot as u32)
            .collect();
        for slot in to_drain {
            // Nothing new goes to it: later requests to its address are refused, and the
            // routing table forgets it.
            conns.unroute(slot);
            if !self.draining.contains(&slot) {
                self.draining.push(slot);
            }
        }
    }

    /// Whether `addr` is retired.
    fn is_retired(&self, addr: SocketAddr) -> bool {
        !self.retired.is_empty() && self.retired.contains_key(&addr)
    }

    /// The error of a request to `peer` when its address is retired.
    pub(crate) fn error_for(&self, peer: SocketAddr) -> Option<Error> {
        if self.retired.is_empty() {
            return None;
        }
        self.retired.get(&peer).map(|r| r.error(peer))
    }

    /// Closes the draining connections no request is left on; returns whether it closed
    /// any.
    pub(crate) fn close_drained(&mut self, conns: &mut Conns, requests: &Requests) -> bool {
        let mut closed = false;
        let mut i = 0;
        while i < self.draining.len() {
            let slot = self.draining[i];
            let live = conns.get(slot).filter(|c| c.phase != Phase::Closing);
            if live.is_some_and(|c| requests.any_on(slot, c)) {
                i += 1;
                continue;
            }
            self.draining.swap_remove(i);
            let Some(conn) = conns.get_mut(slot).filter(|c| c.phase != Phase::Closing) else {
                continue;
            };
            if let Some(why) = conn.peer_addr().and_then(|a| self.error_for(a)) {
                conn.failure = why;
            }
            log::debug!("connection {slot} to a retired address drained; closing");
            conns.close(slot);
            closed = true;
        }
        closed
    }
}
