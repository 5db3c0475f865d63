//! Membership changes: requests to retired addresses fail at once, and connections to them
//! are drained (their requests finish, nothing new is sent) and then closed.

use std::net::SocketAddr;
use std::sync::Arc;

use super::conn::Phase;
use super::Session;
use crate::cluster::Retirements;
use crate::error::Error;

impl Session {
    /// Takes `retired` as the addresses not to send to: later requests to them fail, and
    /// this loop's connections to them are drained and closed.
    pub(crate) fn set_retired(&mut self, retired: Arc<Retirements>) {
        self.retired = retired;
        let to_drain: Vec<u32> = self
            .conns
            .iter()
            .filter(|(_, c)| c.phase != Phase::Closing)
            .filter(|(_, c)| {
                c.outgoing
                    .is_some_and(|(a, _)| self.retired.contains_key(&a))
            })
            .map(|(slot, _)| slot as u32)
            .collect();
        for slot in to_drain {
            // Nothing new goes to it: later requests to its address are refused, and the
            // routing table forgets it.
            self.unroute(slot);
            if !self.draining.contains(&slot) {
                self.draining.push(slot);
            }
        }
        self.close_drained();
    }

    /// The error of a request to `peer` when its address is retired.
    pub(super) fn retired_error(&self, peer: SocketAddr) -> Option<Error> {
        if self.retired.is_empty() {
            return None;
        }
        self.retired.get(&peer).map(|r| r.error(peer))
    }

    /// Closes the draining connections no request is left on; returns whether it closed
    /// any.
    pub(super) fn close_drained(&mut self) -> bool {
        if self.draining.is_empty() {
            return false;
        }
        let mut closed = false;
        let mut i = 0;
        while i < self.draining.len() {
            let slot = self.draining[i];
            let live = self
                .conns
                .get(slot as usize)
                .is_some_and(|c| c.phase != Phase::Closing);
            if live && self.requests_on(slot) {
                i += 1;
                continue;
            }
            self.draining.swap_remove(i);
            if live {
                let addr = self.conns[slot as usize].outgoing.map(|(a, _)| a);
                let why = addr.and_then(|a| self.retired_error(a));
                if let Some(why) = why {
                    self.conns[slot as usize].failure = why;
                }
                log::debug!("connection {slot} to a retired address drained; closing");
                self.finish_close(slot);
                closed = true;
            }
        }
        closed
    }

    /// Whether requests are waiting for or in flight on connection `slot`.
    fn requests_on(&self, slot: u32) -> bool {
        let conn = &self.conns[slot as usize];
        !conn.waiting.is_empty() || self.ctxs.iter().any(|(_, p)| p.conn == slot)
    }
}
