//! Send/recv rendezvous: a task publishes `(key, tensor)`; a peer's `recv` of that key
//! completes when the tensor is there — published before or after the request arrived —
//! and each published tensor is received exactly once.
//!
//! The table is sharded by key hash, each shard behind its own short lock: publishing
//! happens on trainer threads and receiving on loop threads, so they must meet somewhere.
//! A recv that finds its key not yet published leaves a waiter; the publisher hands the
//! tensor to the waiter's loop through that loop's delivery queue and rings its doorbell.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use crate::tensor::Tensor;
use crate::wire::Status;

const SHARDS: usize = 16;

/// A recv waiting for its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Waiter {
    /// Loop owning the connection the recv came on.
    pub loop_index: usize,
    /// Connection slot and generation in that loop.
    pub conn: u32,
    pub generation: u32,
    /// The requester's handle and the item within its request.
    pub handle: u64,
    pub index: u32,
    /// Step the recv belongs to.
    pub step: u64,
}

/// A tensor (or a failure) on its way to a waiter's loop.
pub(crate) struct Delivery {
    pub waiter: Waiter,
    pub key: Box<[u8]>,
    pub result: Result<Arc<Tensor>, Status>,
}

enum Entry {
    Ready(Arc<Tensor>),
    Waiting(Vec<Waiter>),
}

/// Why a publish was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PublishError {
    /// A tensor for this key is already published and not yet received.
    AlreadyPublished,
}

impl std::fmt::Display for PublishError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a tensor for this key is already published and not yet received")
    }
}

impl std::error::Error for PublishError {}

/// Where the table hands a tensor for a waiting recv: the loop serving its connection.
pub(crate) trait DeliverySink: Send + Sync {
    /// Hands `d` to the loop and wakes it.
    fn post(&self, d: Delivery);
}

/// The local rendezvous table of a task.
pub struct Rendezvous {
    shards: Vec<Mutex<HashMap<Box<[u8]>, Entry>>>,
    loops: OnceLock<Vec<Arc<dyn DeliverySink>>>,
}

impl Default for Rendezvous {
    fn default() -> Self {
        Rendezvous {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            loops: OnceLock::new(),
        }
    }
}

impl std::fmt::Debug for Rendezvous {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rendezvous").finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding a shard cannot leave a half-updated entry (each update is one
    // insert or remove), so a poisoned lock is still usable.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Rendezvous {
    /// An empty table.
    pub fn new() -> Arc<Rendezvous> {
        Arc::new(Rendezvous::default())
    }

    fn shard(&self, key: &[u8]) -> &Mutex<HashMap<Box<[u8]>, Entry>> {
        let mut h = DefaultHasher::new();
        key.hash(&mut h);
        &self.shards[(h.finish() as usize) % SHARDS]
    }

    /// Connects the table to the loops that serve it (once, at start).
    pub(crate) fn attach<S: DeliverySink + 'static>(&self, loops: Vec<Arc<S>>) {
        let loops = loops
            .into_iter()
            .map(|l| l as Arc<dyn DeliverySink>)
            .collect();
        if self.loops.set(loops).is_err() {
            log::warn!("rendezvous attached to a second runtime; keeping the first");
        }
    }

    /// Publishes `tensor` under `key`. A recv already waiting gets it now; otherwise the
    /// first recv of `key` will.
    pub fn publish(&self, key: &[u8], tensor: Arc<Tensor>) -> Result<(), PublishError> {
        let waiter = {
            let mut shard = lock(self.shard(key));
            match shard.get_mut(key) {
                Some(Entry::Ready(_)) => return Err(PublishError::AlreadyPublished),
                Some(Entry::Waiting(waiters)) => {
                    let w = waiters.remove(0);
                    if waiters.is_empty() {
                        shard.remove(key);
                    }
                    w
                }
                None => {
                    shard.insert(key.into(), Entry::Ready(tensor));
                    return Ok(());
                }
            }
        };
        self.deliver(Delivery {
            waiter,
            key: key.into(),
            result: Ok(tensor),
        });
        Ok(())
    }

    /// Fails every recv of `step` still waiting, with `ABORTED`.
    pub fn abort_step(&self, step: u64) {
        let mut aborted = Vec::new();
        for shard in &self.shards {
            let mut shard = lock(shard);
            shard.retain(|key, entry| {
                if let Entry::Waiting(waiters) = entry {
                    waiters.retain(|w| {
                        if w.step == step {
                            aborted.push((*w, key.clone()));
                            false
                        } else {
                            true
                        }
                    });
                    return !waiters.is_empty();
                }
                true
            });
        }
        for (waiter, key) in aborted {
            self.deliver(Delivery {
                waiter,
                key,
                result: Err(Status::Aborted),
            });
        }
    }

    /// Takes the tensor of `key` if published; otherwise leaves `waiter` for it.
    pub(crate) fn take_or_wait(&self, key: &[u8], waiter: Waiter) -> Option<Arc<Tensor>> {
        let mut shard = lock(self.shard(key));
        match shard.get_mut(key) {
            Some(Entry::Ready(_)) => match shard.remove(key) {
                Some(Entry::Ready(t)) => Some(t),
                _ => None,
            },
            Some(Entry::Waiting(waiters)) => {
                waiters.push(waiter);
                None
            }
            None => {
                shard.insert(key.into(), Entry::Waiting(vec![waiter]));
                None
            }
        }
    }

    /// Removes the waiters of request `handle` of a connection (`waiter`: loop, slot and
    /// generation) for `key`, its item `index` (every item of it waiting for `key`, when
    /// `None`): the requester cancelled it, its deadline passed, or its connection closed.
    /// Looks at that key's entry only. Returns how many there were.
    pub(crate) fn forget(
        &self,
        waiter: (usize, u32, u32),
        handle: u64,
        key: &[u8],
        index: Option<u32>,
    ) -> usize {
        let (loop_index, conn, generation) = waiter;
        let mut shard = lock(self.shard(key));
        let Some(Entry::Waiting(waiters)) = shard.get_mut(key) else {
            return 0;
        };
        let before = waiters.len();
        waiters.retain(|w| {
            !(w.loop_index == loop_index
                && w.conn == conn
                && w.generation == generation
                && w.handle == handle
                && index.map_or(true, |i| w.index == i))
        });
        let removed = before - waiters.len();
        if waiters.is_empty() {
            shard.remove(key);
        }
        removed
    }

    /// Waiters left for keys, over all shards (for tests and diagnostics).
    pub fn waiting_count(&self) -> usize {
        self.shards
            .iter()
            .map(|s| {
                lock(s)
                    .values()
                    .map(|e| match e {
                        Entry::Waiting(w) => w.len(),
                        Entry::Ready(_) => 0,
                    })
                    .sum::<usize>()
            })
            .sum()
    }

    /// Puts back a tensor whose receiver went away, so the next recv of `key` gets it.
    pub(crate) fn restore(&self, key: &[u8], tensor: Arc<Tensor>) {
        if self.publish(key, tensor).is_err() {
            log::warn!("rendezvous: a tensor was published again while one was returned");
        }
    }

    fn deliver(&self, d: Delivery) {
        let Some(loops) = self.loops.get() else {
            log::error!("rendezvous used before its runtime started; delivery dropped");
            return;
        };
        match loops.get(d.waiter.loop_index) {
            Some(l) => l.post(d),
            None => log::error!("rendezvous: no loop {}", d.waiter.loop_index),
        }
    }

    /// Tensors published and not yet received (for tests and diagnostics).
    pub fn ready_count(&self) -> usize {
        self.shards
            .iter()
            .map(|s| {
                lock(s)
                    .values()
                    .filter(|e| matches!(e, Entry::Ready(_)))
                    .count()
            })
            .sum()
    }
}
