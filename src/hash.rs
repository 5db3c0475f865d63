//! Fast hashing of 64-bit ids: splitmix64, and a hash map keyed by ids that uses it.

use core::hash::{BuildHasherDefault, Hasher};
use std::collections::HashMap;

/// The golden-ratio increment of splitmix64.
const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

/// The finalizer of splitmix64: a bijection of `u64` whose every output bit depends on every
/// input bit.
pub(crate) fn mix64(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// splitmix64's output for state `x`: the finalizer of `x` plus the golden-ratio increment
/// (so 0 does not map to 0).
pub(crate) fn splitmix64(x: u64) -> u64 {
    mix64(x.wrapping_add(GOLDEN))
}

/// A hasher for `u64` keys: one splitmix64 round instead of SipHash. Not DoS-resistant, which
/// is fine for ids of one's own model. It differs from [`Partition::Hash`]'s function, so a
/// PS holding one residue class of `Partition::Hash` still gets well-spread buckets.
#[derive(Default, Clone, Copy)]
pub(crate) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        // Only reached for keys other than u64; correct, not fast.
        for &b in bytes {
            self.0 = splitmix64(self.0 ^ u64::from(b));
        }
    }

    fn write_u64(&mut self, v: u64) {
        self.0 = splitmix64(self.0 ^ v);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// A map keyed by id with [`IdHasher`].
pub(crate) type IdMap<V> = HashMap<u64, V, BuildHasherDefault<IdHasher>>;
