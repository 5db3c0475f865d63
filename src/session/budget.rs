//! The receive budget: bytes of chunked tensors being received, reserved against a total
//! for the task and a part for each connection before their memory is taken, and given
//! back when the tensor has arrived whole or is dropped.
//!
//! A chunked tensor is the only thing a peer can declare beyond one frame: everything else
//! a receiver holds for a connection is bounded by `max_frame`. Its memory is taken when its
//! first chunk arrives; with the budget, a peer that declares tensors it never sends can
//! hold at most its connection's part, and all peers together at most the total. A tensor
//! that does not fit fails alone with `RESOURCE_EXHAUSTED`: its chunks are read and
//! dropped, the rest of its request and the connection go on.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The task's budget, shared by its loops.
#[derive(Debug)]
pub(crate) struct Budget {
    used: AtomicU64,
    refused: AtomicU64,
    max: u64,
    conn_max: u64,
}

impl Budget {
    pub(crate) fn new(max: u64, conn_max: u64) -> Arc<Budget> {
        Arc::new(Budget {
            used: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            max,
            conn_max: conn_max.min(max),
        })
    }

    /// For a config: its computed budget and part per connection.
    pub(crate) fn of(cfg: &crate::Config) -> Arc<Budget> {
        Budget::new(cfg.recv_budget_bytes(), cfg.conn_recv_budget_bytes())
    }

    /// Bytes reserved now, over all connections.
    pub(crate) fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// Reservations refused so far.
    pub(crate) fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
}

/// Why a reservation was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The connection's part is spent.
    Connection,
    /// The task's total is spent.
    Task,
}

/// One connection's account of the budget.
#[derive(Debug, Clone)]
pub(crate) struct ConnBudget {
    budget: Arc<Budget>,
    used: Arc<AtomicU64>,
}

impl ConnBudget {
    pub(crate) fn new(budget: &Arc<Budget>) -> ConnBudget {
        ConnBudget {
            budget: budget.clone(),
            used: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Reserves `n` bytes, held until the returned value is dropped.
    pub(crate) fn reserve(&self, n: u64) -> Result<Reservation, Refused> {
        let b = &*self.budget;
        // The connection's count is only changed by its own loop (here and on drop of its
        // reservations, which may happen on other threads; those only subtract).
        let mine = self.used.load(Ordering::Relaxed);
        let refuse = |why| {
            b.refused.fetch_add(1, Ordering::Relaxed);
            Err(why)
        };
        if mine.checked_add(n).map_or(true, |t| t > b.conn_max) {
            return refuse(Refused::Connection);
        }
        let taken = b
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                u.checked_add(n).filter(|&t| t <= b.max)
            });
        if taken.is_err() {
            return refuse(Refused::Task);
        }
        self.used.fetch_add(n, Ordering::AcqRel);
        Ok(Reservation {
            budget: self.budget.clone(),
            conn: self.used.clone(),
            n,
        })
    }

    /// Bytes this connection has reserved now.
    #[cfg(test)]
    pub(crate) fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }
}

/// Bytes reserved for one tensor being received; given back on drop.
#[derive(Debug)]
pub(crate) struct Reservation {
    budget: Arc<Budget>,
    conn: Arc<AtomicU64>,
    n: u64,
}

impl Reservation {
    /// Bytes reserved.
    pub(crate) fn bytes(&self) -> u64 {
        self.n
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.n, Ordering::AcqRel);
        self.conn.fetch_sub(self.n, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_count_against_the_connection_and_the_task() {
        let budget = Budget::new(100, 60);
        let (a, b) = (ConnBudget::new(&budget), ConnBudget::new(&budget));
        let r1 = a.reserve(50).unwrap();
        assert_eq!(a.reserve(11).unwrap_err(), Refused::Connection);
        let r2 = b.reserve(40).unwrap();
        assert_eq!(b.reserve(11).unwrap_err(), Refused::Task, "90 of 100 used");
        assert_eq!((budget.used(), a.used(), b.used()), (90, 50, 40));
        drop(r1);
        assert_eq!((budget.used(), a.used()), (40, 0));
        let r3 = b.reserve(20).unwrap();
        assert_eq!(b.used(), 60);
        drop((r2, r3));
        assert_eq!((budget.used(), b.used()), (0, 0));
        assert_eq!(budget.refused(), 2);
    }

    #[test]
    fn the_connection_part_never_exceeds_the_total() {
        let budget = Budget::new(10, 1_000);
        let a = ConnBudget::new(&budget);
        assert_eq!(a.reserve(11).unwrap_err(), Refused::Connection);
        assert!(a.reserve(u64::MAX).is_err(), "no overflow");
        let _r = a.reserve(10).unwrap();
    }

    #[test]
    fn a_reservation_may_be_dropped_on_another_thread() {
        let budget = Budget::new(100, 100);
        let a = ConnBudget::new(&budget);
        let r = a.reserve(30).unwrap();
        std::thread::spawn(move || drop(r)).join().unwrap();
        assert_eq!((budget.used(), a.used()), (0, 0));
    }
}
