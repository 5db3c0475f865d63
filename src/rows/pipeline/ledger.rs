//! This worker's pushes in flight and, per PS, which of them that PS has answered: what a
//! pull sent now is sure to reflect, and which push to wait for to be sure of more.
//! Numbers only (no requests, no clock), so the staleness rules are tested in memory.

/// A push held in a slot: its number (pushes are numbered from 1 in the order issued),
/// the step it belongs to, and how many of its PS parts are not answered yet.
#[derive(Debug, Clone, Copy, Default)]
struct Held {
    number: u64,
    step: u64,
    left: usize,
}

/// The pushes in flight, at most one per slot, and per slot and PS whether that PS's part
/// is still waiting for its answer. Sized once: nothing here allocates after [`new`].
///
/// [`new`]: Ledger::new
#[derive(Debug)]
pub(crate) struct Ledger {
    peers: usize,
    issued: u64,
    slots: Vec<Held>,
    /// `pending[slot * peers + k]`: the part of the push in `slot` at PS `k` is unanswered.
    pending: Vec<bool>,
}

impl Ledger {
    /// A ledger for `peers` PS tasks and at most `slots` pushes in flight.
    pub(crate) fn new(peers: usize, slots: usize) -> Ledger {
        Ledger {
            peers,
            issued: 0,
            slots: vec![Held::default(); slots],
            pending: vec![false; slots * peers],
        }
    }

    /// Pushes issued so far.
    pub(crate) fn issued(&self) -> u64 {
        self.issued
    }

    /// Number of slots: the most pushes in flight.
    pub(crate) fn slots(&self) -> usize {
        self.slots.len()
    }

    /// Pushes with at least one part unanswered.
    pub(crate) fn in_flight(&self) -> usize {
        self.slots.iter().filter(|h| h.left > 0).count()
    }

    /// The slot of the next push: slots are used in turn, so push `n` takes the slot of
    /// push `n - slots`, and waits for it to be answered when it is not yet (then as many
    /// pushes as there are slots are in flight, or fewer when later ones were answered
    /// first). Used in turn, every slot is in use after the first `slots` pushes, so the
    /// memory kept per slot is all there from then on.
    pub(crate) fn next_slot(&self) -> usize {
        (self.issued % self.slots.len() as u64) as usize
    }

    /// Whether the push in `slot` has a part unanswered.
    pub(crate) fn is_busy(&self, slot: usize) -> bool {
        self.slots[slot].left > 0
    }

    /// Issues the next push, of step `step`, in [`next_slot`](Self::next_slot) (which
    /// must not be busy): its slot. Its parts are added with [`add_part`](Self::add_part).
    pub(crate) fn issue(&mut self, step: u64) -> usize {
        let slot = self.next_slot();
        debug_assert_eq!(self.slots[slot].left, 0, "slot {slot} is in use");
        self.issued += 1;
        self.slots[slot] = Held {
            number: self.issued,
            step,
            left: 0,
        };
        slot
    }

    /// The push in `slot` has a part at PS `k`, waiting for its answer.
    pub(crate) fn add_part(&mut self, slot: usize, k: usize) {
        let p = &mut self.pending[slot * self.peers + k];
        if !*p {
            *p = true;
            self.slots[slot].left += 1;
        }
    }

    /// The part of the push in `slot` at PS `k` was answered (or failed): it no longer
    /// holds anything back.
    pub(crate) fn complete(&mut self, slot: usize, k: usize) {
        let p = &mut self.pending[slot * self.peers + k];
        if *p {
            *p = false;
            self.slots[slot].left -= 1;
        }
    }

    /// Whether the part of the push in `slot` at PS `k` is unanswered.
    pub(crate) fn is_pending(&self, slot: usize, k: usize) -> bool {
        self.pending[slot * self.peers + k]
    }

    /// The step of the push in `slot`.
    pub(crate) fn step_of(&self, slot: usize) -> u64 {
        self.slots[slot].step
    }

    /// The largest `c` such that every push numbered `c` or less has no part unanswered
    /// at PS `k`: a pull sent to `k` now is answered after all of them were applied.
    pub(crate) fn covered(&self, k: usize) -> u64 {
        let mut c = self.issued;
        for (i, h) in self.slots.iter().enumerate() {
            if self.pending[i * self.peers + k] {
                c = c.min(h.number - 1);
            }
        }
        c
    }

    /// Whether a pull sent to PS `k` now keeps within `staleness` when its rows are used
    /// after `target` pushes have been issued: at most `staleness` of them may be missing.
    pub(crate) fn may_send(&self, k: usize, target: u64, staleness: u64) -> bool {
        self.covered(k).saturating_add(staleness) >= target
    }

    /// The slot of the oldest push with a part unanswered at PS `k`.
    pub(crate) fn oldest_at(&self, k: usize) -> Option<usize> {
        (0..self.slots.len())
            .filter(|&i| self.pending[i * self.peers + k])
            .min_by_key(|&i| self.slots[i].number)
    }

    /// The slot of the oldest push in flight.
    pub(crate) fn oldest(&self) -> Option<usize> {
        (0..self.slots.len())
            .filter(|&i| self.slots[i].left > 0)
            .min_by_key(|&i| self.slots[i].number)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issues a push of `step` with parts at `at`; its slot.
    fn push(l: &mut Ledger, step: u64, at: &[usize]) -> usize {
        assert!(!l.is_busy(l.next_slot()), "the next slot is busy");
        let slot = l.issue(step);
        for &k in at {
            l.add_part(slot, k);
        }
        slot
    }

    #[test]
    fn nothing_issued_covers_everything() {
        let l = Ledger::new(2, 3);
        assert_eq!((l.issued(), l.in_flight(), l.slots()), (0, 0, 3));
        assert_eq!((l.covered(0), l.covered(1)), (0, 0));
        assert!(l.may_send(0, 0, 0));
        // A pull to be used after one more push, with no staleness allowed: not yet.
        assert!(!l.may_send(0, 1, 0));
        assert!(l.may_send(0, 1, 1));
        assert_eq!((l.oldest(), l.oldest_at(1)), (None, None));
    }

    #[test]
    fn covered_stops_below_the_oldest_unanswered_part_of_each_ps() {
        let mut l = Ledger::new(2, 4);
        let a = push(&mut l, 0, &[0, 1]);
        let b = push(&mut l, 1, &[0]);
        let c = push(&mut l, 2, &[0, 1]);
        assert_eq!((l.issued(), l.in_flight()), (3, 3));
        assert_eq!((l.covered(0), l.covered(1)), (0, 0));
        // PS 1 answers push 1: push 2 has no part there, push 3 is unanswered.
        l.complete(a, 1);
        assert_eq!((l.covered(0), l.covered(1)), (0, 2));
        // Answers out of order at PS 0: push 2 first; push 1 still holds PS 0 at 0.
        l.complete(b, 0);
        assert_eq!(l.covered(0), 0);
        assert_eq!(l.oldest_at(0), Some(a));
        l.complete(a, 0);
        assert_eq!(l.covered(0), 2);
        assert_eq!(l.in_flight(), 1);
        assert_eq!(
            (l.oldest(), l.oldest_at(0), l.oldest_at(1)),
            (Some(c), Some(c), Some(c))
        );
        assert_eq!(l.step_of(c), 2);
        l.complete(c, 0);
        l.complete(c, 1);
        // Completing twice changes nothing.
        l.complete(c, 1);
        assert_eq!((l.covered(0), l.covered(1), l.in_flight()), (3, 3, 0));
    }

    #[test]
    fn staleness_allows_the_most_recent_pushes_to_be_missing() {
        let mut l = Ledger::new(1, 4);
        for step in 0..3 {
            push(&mut l, step, &[0]);
        }
        // Pushes 1..=3 unanswered: rows used after 3 pushes may miss 3 of them.
        assert!(!l.may_send(0, 3, 2));
        assert!(l.may_send(0, 3, 3));
        l.complete(l.oldest().unwrap(), 0);
        assert!(l.may_send(0, 3, 2));
        // Used after a fourth push (the step's own, still to come): one more is allowed
        // to be missing only with staleness 3.
        assert!(!l.may_send(0, 4, 2));
        assert!(l.may_send(0, 4, 3));
    }

    #[test]
    fn slots_are_used_in_turn_and_bound_the_pushes_in_flight() {
        let mut l = Ledger::new(2, 2);
        let a = push(&mut l, 0, &[0]);
        let b = push(&mut l, 1, &[1]);
        assert_eq!((a, b), (0, 1));
        // The third push takes the first's slot: busy until the first is answered.
        assert_eq!(l.next_slot(), a);
        assert!(l.is_busy(a));
        assert_eq!(l.oldest(), Some(a));
        l.complete(a, 0);
        assert!(!l.is_busy(a));
        // A push with no part (no ids) is complete when issued.
        let e = push(&mut l, 2, &[]);
        assert_eq!(e, a);
        assert_eq!((l.issued(), l.in_flight()), (3, 1));
        assert_eq!(l.next_slot(), b);
        assert!(l.is_busy(b));
        assert_eq!(l.covered(0), 3);
        assert_eq!(l.covered(1), 1);
    }
}
