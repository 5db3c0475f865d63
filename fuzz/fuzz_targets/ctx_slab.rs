//! Operation sequences against `CtxSlab<u64>`, checked against a simple model.
//!
//! Byte 0 picks the capacity (1..=16); every following byte is an opcode, some
//! taking argument bytes. Missing argument bytes read as 0. After every operation
//! the slab must agree with the model: same length, every live handle resolves to
//! its value, every completed handle is rejected, `iter` yields exactly the live
//! set.
#![no_main]

use libfuzzer_sys::fuzz_target;
use starwire::ctx::{CtxError, CtxSlab, CtxKey};

/// Completed handles re-checked after every operation (the most recent ones);
/// older ones are still picked by the "complete twice" operations.
const RECHECK_DEAD: usize = 32;

struct Input<'a> {
    bytes: &'a [u8],
}

impl Input<'_> {
    fn byte(&mut self) -> u8 {
        match self.bytes.split_first() {
            Some((&b, rest)) => {
                self.bytes = rest;
                b
            }
            None => 0,
        }
    }

    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.byte(), self.byte(), self.byte(), self.byte()])
    }

    /// An index into a non-empty list of `len` entries.
    fn pick(&mut self, len: usize) -> usize {
        usize::from(self.byte()) % len
    }
}

struct Model {
    capacity: usize,
    /// Live contexts: handle and value.
    live: Vec<(CtxKey, u64)>,
    /// Every handle ever completed, in completion order.
    dead: Vec<CtxKey>,
    /// Per slot: the generation of its live context, or of the next one if
    /// vacant. Starts at 1, bumped by every completion (no wrap in a fuzz run).
    generations: Vec<u32>,
    next_value: u64,
}

impl Model {
    fn live_value(&self, h: CtxKey) -> Option<u64> {
        self.live.iter().find(|&&(l, _)| l == h).map(|&(_, v)| v)
    }

    fn complete(&mut self, h: CtxKey) -> u64 {
        let at = self.live.iter().position(|&(l, _)| l == h).unwrap();
        let (_, v) = self.live.swap_remove(at);
        self.dead.push(h);
        self.generations[h.index() as usize] += 1;
        v
    }

    /// The error a lookup of a handle that is not live may give.
    fn check_rejected(&self, h: CtxKey, err: CtxError) {
        assert!(self.live_value(h).is_none(), "{h:?} is live, got {err:?}");
        let expected_ok = if h.generation() == 0 {
            err == CtxError::Reserved
        } else if h.index() as usize >= self.capacity {
            err == CtxError::OutOfRange
        } else if self.generations[h.index() as usize] != h.generation() {
            // Completed, or never issued for this slot's current generation.
            err == CtxError::Stale
        } else {
            // Right generation, not live: the slot is free.
            assert!(self.live.iter().all(|&(l, _)| l.index() != h.index()));
            err == CtxError::Vacant
        };
        if self.dead.contains(&h) {
            assert_eq!(err, CtxError::Stale, "completed {h:?}");
        }
        assert!(expected_ok, "{h:?} rejected with {err:?}");
    }

    /// `slab.get(h)` and `contains(h)` agree with the model.
    fn check_get(&self, slab: &CtxSlab<u64>, h: CtxKey) {
        match (slab.get(h), self.live_value(h)) {
            (Ok(&got), Some(want)) => assert_eq!(got, want, "{h:?}"),
            (Ok(got), None) => panic!("{h:?} not live in the model, slab gave {got}"),
            (Err(e), Some(_)) => panic!("{h:?} live in the model, slab gave {e:?}"),
            (Err(e), None) => self.check_rejected(h, e),
        }
        assert_eq!(slab.contains(h), self.live_value(h).is_some());
    }

    /// `slab.remove(h)` agrees with the model, which is updated.
    fn check_remove(&mut self, slab: &mut CtxSlab<u64>, h: CtxKey) {
        match (slab.remove(h), self.live_value(h)) {
            (Ok(got), Some(want)) => {
                assert_eq!(got, want, "{h:?}");
                self.complete(h);
            }
            (Ok(got), None) => panic!("{h:?} not live in the model, slab removed {got}"),
            (Err(e), Some(_)) => panic!("{h:?} live in the model, slab gave {e:?}"),
            (Err(e), None) => self.check_rejected(h, e),
        }
    }

    fn check_all(&self, slab: &CtxSlab<u64>) {
        assert_eq!(slab.capacity(), self.capacity);
        assert_eq!(slab.len(), self.live.len());
        assert_eq!(slab.is_empty(), self.live.is_empty());
        assert_eq!(slab.is_full(), self.live.len() == self.capacity);
        for &(h, _) in &self.live {
            self.check_get(slab, h);
        }
        for &h in self.dead.iter().rev().take(RECHECK_DEAD) {
            self.check_get(slab, h);
        }
        let iter = slab.iter();
        assert_eq!(iter.len(), self.live.len());
        let mut seen = 0;
        for (h, &v) in iter {
            assert_eq!(self.live_value(h), Some(v), "iter yielded {h:?}");
            seen += 1;
        }
        assert_eq!(seen, self.live.len());
    }
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input { bytes: data };
    let capacity = usize::from(input.byte() % 16) + 1;
    let mut slab = CtxSlab::<u64>::with_capacity(capacity);
    let mut model = Model {
        capacity,
        live: Vec::new(),
        dead: Vec::new(),
        generations: vec![1; capacity],
        next_value: 0,
    };

    while !input.bytes.is_empty() {
        match input.byte() % 10 {
            // Insert.
            0 | 1 => {
                let value = model.next_value;
                model.next_value += 1;
                match slab.insert(value) {
                    Ok(h) => {
                        assert!(model.live.len() < capacity, "insert past capacity");
                        assert_ne!(h.generation(), 0);
                        assert!((h.index() as usize) < capacity);
                        assert!(model.live.iter().all(|&(l, _)| l.index() != h.index()));
                        // A handle is never issued twice.
                        assert!(!model.dead.contains(&h), "{h:?} reissued");
                        assert_eq!(h.generation(), model.generations[h.index() as usize]);
                        model.live.push((h, value));
                    }
                    Err(full) => {
                        assert_eq!(model.live.len(), capacity, "refused while not full");
                        assert_eq!(full.into_inner(), value);
                    }
                }
            }
            // Complete a live context.
            2 | 3 => {
                if !model.live.is_empty() {
                    let h = model.live[input.pick(model.live.len())].0;
                    model.check_remove(&mut slab, h);
                }
            }
            // Complete twice.
            4 => {
                if !model.dead.is_empty() {
                    let h = model.dead[input.pick(model.dead.len())];
                    model.check_remove(&mut slab, h);
                }
            }
            // Late response: look up a completed handle.
            5 => {
                if !model.dead.is_empty() {
                    let h = model.dead[input.pick(model.dead.len())];
                    model.check_get(&slab, h);
                }
            }
            // Mutate a live context through get_mut.
            6 => {
                if !model.live.is_empty() {
                    let at = input.pick(model.live.len());
                    let (h, ref mut v) = model.live[at];
                    let got = slab.get_mut(h).unwrap();
                    assert_eq!(*got, *v);
                    *got ^= u64::from(input.byte()) << 8;
                    *v = *got;
                }
            }
            // Forged raw handle from input bytes: get, then maybe remove.
            7 => {
                let index = input.u32();
                let generation = input.u32();
                let h = CtxKey::from_raw((u64::from(generation) << 32) | u64::from(index));
                assert_eq!((h.index(), h.generation()), (index, generation));
                assert_eq!(slab.get_mut(h).is_ok(), model.live_value(h).is_some());
                model.check_get(&slab, h);
                if input.byte() & 1 == 1 {
                    model.check_remove(&mut slab, h);
                }
            }
            // Near miss: a live or completed handle with its generation nudged
            // (including to 0) or its index moved.
            8 => {
                let all: Vec<CtxKey> = model.live.iter().map(|&(h, _)| h).collect();
                let base = if !all.is_empty() && input.byte() & 1 == 0 {
                    Some(all[input.pick(all.len())])
                } else if !model.dead.is_empty() {
                    Some(model.dead[input.pick(model.dead.len())])
                } else {
                    None
                };
                if let Some(base) = base {
                    let delta = u32::from(input.byte());
                    let h = if delta & 0x80 == 0 {
                        CtxKey::from_raw(
                            (u64::from(base.generation().wrapping_add(delta)) << 32)
                                | u64::from(base.index()),
                        )
                    } else {
                        CtxKey::from_raw(
                            (u64::from(base.generation()) << 32)
                                | u64::from(base.index().wrapping_add(delta & 0x7f)),
                        )
                    };
                    model.check_get(&slab, h);
                    model.check_remove(&mut slab, h);
                }
            }
            // Connection lost: drain, possibly dropping the iterator early.
            _ => {
                let stop_after = usize::from(input.byte() % 20);
                let mut drained = Vec::new();
                {
                    let mut drain = slab.drain();
                    assert_eq!(drain.len(), model.live.len());
                    for item in drain.by_ref().take(stop_after) {
                        drained.push(item);
                    }
                    // Dropping `drain` removes the rest.
                }
                assert!(slab.is_empty(), "drain left contexts behind");
                assert!(drained.len() <= model.live.len());
                for &(h, v) in &drained {
                    assert_eq!(model.live_value(h), Some(v), "drain yielded {h:?}");
                }
                let handles: Vec<CtxKey> = model.live.iter().map(|&(h, _)| h).collect();
                for h in handles {
                    model.complete(h);
                }
            }
        }
        model.check_all(&slab);
    }
});
