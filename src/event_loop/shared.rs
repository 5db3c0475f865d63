//! What a loop shares with other threads: its doorbell and parked flag, the stop request,
//! new handles' ends, tensors published for its waiting recvs, pool handlers' answers, and
//! its counters.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crossbeam_utils::CachePadded;

use crate::pool::{Answer, AnswerSink};
use crate::rendezvous::{Delivery, DeliverySink};
use crate::session::HandleRings;
use crate::stats::Counters;
use crate::sys::doorbell::Doorbell;

/// Work other threads hand to a loop.
pub(crate) enum Posted {
    Recv(Delivery),
    Answer(Answer),
    /// The addresses of tasks that moved or left the cluster.
    Retired(Arc<crate::cluster::Retirements>),
}

/// State a loop shares with the runtime and the handles.
pub(crate) struct LoopShared {
    pub doorbell: Doorbell,
    /// Set by the loop just before it parks; a producer that swaps it to false rings.
    pub parked: CachePadded<AtomicBool>,
    pub stop: AtomicBool,
    pub new_handles: Mutex<Vec<HandleRings>>,
    pub has_new_endpoints: AtomicBool,
    /// Rendezvous tensors for recvs waiting on this loop's connections, and answers of
    /// handlers run on the pool.
    deliveries: Mutex<Vec<Posted>>,
    pub(super) has_deliveries: AtomicBool,
    pub counters: Arc<CachePadded<Counters>>,
}

impl LoopShared {
    pub(crate) fn new() -> std::io::Result<LoopShared> {
        Ok(LoopShared {
            doorbell: Doorbell::new()?,
            parked: CachePadded::new(AtomicBool::new(false)),
            stop: AtomicBool::new(false),
            new_handles: Mutex::new(Vec::new()),
            has_new_endpoints: AtomicBool::new(false),
            deliveries: Mutex::new(Vec::new()),
            has_deliveries: AtomicBool::new(false),
            counters: Arc::new(CachePadded::new(Counters::default())),
        })
    }

    /// Hands the loop the addresses it must no longer send to.
    pub(crate) fn post_retired(&self, retired: Arc<crate::cluster::Retirements>) {
        self.post_any(Posted::Retired(retired));
    }

    fn post_any(&self, p: Posted) {
        self.deliveries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(p);
        self.has_deliveries.store(true, Ordering::Release);
        self.wake();
    }

    /// Swaps the queue of posted work with `batch` (empty), so neither is reallocated.
    pub(super) fn take_posted(&self, batch: &mut Vec<Posted>) {
        let mut q = self.deliveries.lock().unwrap_or_else(|p| p.into_inner());
        self.has_deliveries.store(false, Ordering::Release);
        std::mem::swap(&mut *q, batch);
    }

    /// Wakes the loop if it is parked: once per parked period, not once per message.
    ///
    /// Called after publishing a request. The producer stores the ring's tail and then
    /// loads `parked`; the loop stores `parked` and then loads the tail. Each side puts a
    /// SeqCst fence between its store and its load, so at least one sees the other's
    /// store: either the loop finds the request before it parks, or the producer finds
    /// the loop parked and rings. Without the fences both loads could miss (store-load
    /// reordering) and the request would sit until the next timer.
    pub(crate) fn wake(&self) {
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.parked.load(Ordering::Relaxed) && self.parked.swap(false, Ordering::SeqCst) {
            self.doorbell.ring();
        }
    }
}

impl DeliverySink for LoopShared {
    fn post(&self, d: Delivery) {
        self.post_any(Posted::Recv(d));
    }
}

impl AnswerSink for LoopShared {
    fn post_answer(&self, a: Answer) {
        self.post_any(Posted::Answer(a));
    }
}
