//! Work of one index build split into pieces that any thread may take, none waiting for
//! another: faulting in the new level's memory, copying the old level's buckets.
//!
//! Claims go round and round (claim `i` is piece `i % pieces`), so a piece whose thread is
//! preempted is taken again by another: the work must be idempotent. Each piece has a mark,
//! the number of the last build that finished it (marks only grow, so there is nothing to
//! reset between builds); the first thread to mark a piece for this build counts it, and the
//! one that counts the last piece learns that the work is done, exactly once. The claim and
//! count words carry the build's number, so a thread that read an older build takes and
//! counts nothing of a newer one.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::sys::arena::Arena;

/// Bits of a claim or count word below the build number.
const COUNT_BITS: u32 = 40;

/// Claims a thread makes in one go before it gives up (every piece it met was done).
const TRIES: u32 = 64;

/// Pieces of one kind of work; see the module documentation.
pub(super) struct Pieces {
    /// `build << 40 | claims made`.
    cursor: AtomicU64,
    /// `build << 40 | pieces counted`.
    done: AtomicU64,
    /// Per piece, the last build that finished it.
    marks: Arena,
}

impl Pieces {
    /// Room for up to `most` pieces per build.
    pub(super) fn new(most: u64) -> io::Result<Pieces> {
        Ok(Pieces {
            cursor: AtomicU64::new(0),
            done: AtomicU64::new(0),
            marks: Arena::reserve(most.max(1) as usize * 8, false)?,
        })
    }

    /// Starts the work of build `build` (at least 1, above any before) in `pieces` pieces.
    /// Any number of threads may call it for one build: the first start stands.
    pub(super) fn start(&self, build: u64, pieces: u64) -> io::Result<()> {
        if self.cursor.load(Ordering::Acquire) >> COUNT_BITS >= build {
            return Ok(());
        }
        self.marks.commit(pieces as usize * 8)?;
        let newer = |word: u64| (word >> COUNT_BITS < build).then_some(build << COUNT_BITS);
        // The count first: a claim (which needs the cursor) comes after it.
        let _ = self
            .done
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, newer);
        let _ = self
            .cursor
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, newer);
        Ok(())
    }

    /// A piece of build `build`'s work not finished yet, if any (out of `pieces`).
    pub(super) fn claim(&self, build: u64, pieces: u64) -> Option<u64> {
        let marks = self.marks.words();
        let mut claim = self.cursor.load(Ordering::Acquire);
        for _ in 0..TRIES {
            if claim >> COUNT_BITS != build || pieces == 0 {
                return None;
            }
            match self.cursor.compare_exchange(
                claim,
                claim + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    let piece = (claim & ((1 << COUNT_BITS) - 1)) % pieces;
                    if marks.get(piece as usize)?.load(Ordering::Acquire) < build {
                        return Some(piece);
                    }
                    claim += 1;
                }
                Err(now) => claim = now,
            }
        }
        None
    }

    /// Marks `piece` finished for build `build`; whether this finished the work (true for
    /// exactly one call per build).
    pub(super) fn finish(&self, build: u64, piece: u64, pieces: u64) -> bool {
        let Some(mark) = self.marks.words().get(piece as usize) else {
            return false;
        };
        if mark.fetch_max(build, Ordering::AcqRel) >= build {
            // Finished meanwhile by another thread, which counted it.
            return false;
        }
        self.done.fetch_add(1, Ordering::AcqRel) + 1 == (build << COUNT_BITS) | pieces
    }

    /// Bytes of marks committed.
    pub(super) fn committed(&self) -> usize {
        self.marks.committed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_piece_once_and_done_once() {
        let p = Pieces::new(100).unwrap();
        p.start(1, 5).unwrap();
        let mut got = Vec::new();
        let mut finished = 0;
        while let Some(piece) = p.claim(1, 5) {
            got.push(piece);
            finished += u32::from(p.finish(1, piece, 5));
        }
        assert_eq!(got, [0, 1, 2, 3, 4]);
        assert_eq!(finished, 1);
        // A claim of another build takes nothing.
        assert_eq!(p.claim(2, 5), None);
    }

    #[test]
    fn a_stalled_piece_is_taken_again() {
        let p = Pieces::new(100).unwrap();
        p.start(3, 3).unwrap();
        let stalled = p.claim(3, 3).unwrap();
        let (a, b) = (p.claim(3, 3).unwrap(), p.claim(3, 3).unwrap());
        assert!(!p.finish(3, a, 3) && !p.finish(3, b, 3));
        // Claims wrap round to the piece not finished.
        assert_eq!(p.claim(3, 3), Some(stalled));
        assert!(p.finish(3, stalled, 3));
        // The stalled thread finishes late: counted by no one twice.
        assert!(!p.finish(3, stalled, 3));
        assert_eq!(p.claim(3, 3), None);
        // The next build reuses the marks without a reset; a second start of it changes
        // nothing.
        p.start(4, 2).unwrap();
        assert_eq!(p.claim(4, 2), Some(0));
        p.start(4, 2).unwrap();
        assert_eq!(p.claim(4, 2), Some(1));
    }
}
