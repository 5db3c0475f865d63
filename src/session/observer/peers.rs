//! The loop's table of per-peer metric blocks (`stats::PeerBlock`), by the index each
//! connection keeps: assigned when a connection to a new address is opened or a handshake
//! names a new task; the request path only follows that index.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use crate::stats::{Counters, PeerBlock, Side};

/// A connection whose peer has no block (yet).
pub(crate) const NO_PEER: u32 = u32::MAX;

/// The loop's peer blocks, by the index connections keep.
#[derive(Default)]
pub(crate) struct PeerTable {
    blocks: Vec<Arc<PeerBlock>>,
    by_addr: HashMap<SocketAddr, u32>,
    by_task: HashMap<(String, u32), u32>,
}

impl PeerTable {
    /// The block of peer `index`.
    #[inline]
    pub(crate) fn get(&self, index: u32) -> Option<&PeerBlock> {
        self.blocks.get(index as usize).map(|b| &**b)
    }

    fn insert(&mut self, counters: &Counters, block: PeerBlock) -> u32 {
        let block = Arc::new(block);
        counters.peers.register(block.clone());
        self.blocks.push(block);
        (self.blocks.len() - 1) as u32
    }

    /// The index of the block of requests sent to `addr`, made when it is first seen.
    pub(crate) fn client(&mut self, counters: &Counters, addr: SocketAddr) -> u32 {
        if let Some(&i) = self.by_addr.get(&addr) {
            return i;
        }
        let i = self.insert(counters, PeerBlock::new(Side::Client, Some(addr)));
        self.by_addr.insert(addr, i);
        i
    }

    /// The index of the block of requests sent to `addr` ([`NO_PEER`] if none).
    pub(crate) fn index_of(&self, addr: Option<SocketAddr>) -> u32 {
        addr.and_then(|a| self.by_addr.get(&a).copied())
            .unwrap_or(NO_PEER)
    }

    /// The index of the block of requests served to task `job:index`.
    pub(crate) fn server(&mut self, counters: &Counters, job: &str, index: u32) -> u32 {
        let key = (job.to_string(), index);
        if let Some(&i) = self.by_task.get(&key) {
            return i;
        }
        let block = PeerBlock::new(Side::Server, None);
        block.task.set(key.clone()).ok();
        let i = self.insert(counters, block);
        self.by_task.insert(key, i);
        i
    }

    /// The names of the peers by index: task and address, as far as known.
    pub(crate) fn names(&self) -> Vec<String> {
        self.blocks
            .iter()
            .map(|b| {
                let task = b.task.get().map(|(job, i)| format!("{job}:{i}"));
                match (task, b.addr) {
                    (Some(t), Some(a)) => format!("{t} {a}"),
                    (Some(t), None) => t,
                    (None, Some(a)) => a.to_string(),
                    (None, None) => "(unknown peer)".to_string(),
                }
            })
            .collect()
    }
}
