//! Large anonymous memory arenas for the PS table's rows and index.
//!
//! An [`Arena`] reserves a range of address space once (`PROT_NONE`, `MAP_NORESERVE`: no
//! memory is charged for it), commits a growing prefix of it (readable and writable, advised
//! `MADV_HUGEPAGE` so the kernel backs it with 2 MiB pages where transparent huge pages are
//! enabled) and hands the committed prefix out as `&[AtomicU64]`: the only way the table
//! reads and writes it, so concurrent loops never race on plain memory. The range never
//! moves, so an index into it stays valid for the arena's life; committing more extends
//! the slice, never invalidates it. [`Arena::release`] gives pages back to the kernel (they
//! read as zero afterwards); the arena is unmapped when dropped.

use std::ffi::c_void;
use std::fmt;
use std::io;
use std::num::NonZeroUsize;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

use nix::sys::mman::{self, MapFlags, MmapAdvise, ProtFlags};

/// Granularity of commits and of the arena's alignment: one x86-64 huge page.
pub const HUGE_PAGE: usize = 2 << 20;

/// The base page size the kernel releases by.
const PAGE: usize = 4096;

/// What became of the `MADV_HUGEPAGE` advice on an arena's memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HugePages {
    /// Not asked for (the setting is off), or nothing committed yet.
    NotAsked,
    /// The kernel took the advice: faults in the arena get 2 MiB pages while the kernel
    /// has them (see [`thp_mode`] for whether it is enabled at all).
    Advised,
    /// The kernel refused the advice (`EINVAL`: transparent huge pages are not built in or
    /// are disabled): the arena is on base pages.
    Refused(nix::errno::Errno),
}

impl fmt::Display for HugePages {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HugePages::NotAsked => f.write_str("not asked"),
            HugePages::Advised => f.write_str("advised (MADV_HUGEPAGE)"),
            HugePages::Refused(e) => write!(f, "refused ({e})"),
        }
    }
}

/// The kernel's transparent-huge-page mode (`always`, `madvise` or `never`, from
/// `/sys/kernel/mm/transparent_hugepage/enabled`), or `None` when it cannot be read.
pub fn thp_mode() -> Option<String> {
    let text = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").ok()?;
    let start = text.find('[')? + 1;
    let end = start + text[start..].find(']')?;
    Some(text[start..end].to_string())
}

/// A reserved range of address space with a committed prefix; see the module documentation.
pub struct Arena {
    /// Start of the usable range: `HUGE_PAGE`-aligned, inside the mapping.
    base: NonNull<u8>,
    /// The whole mapping, as `mmap` returned it (unmapped on drop).
    map: NonNull<c_void>,
    map_len: usize,
    /// Usable bytes from `base`.
    reserved: usize,
    /// Bytes from `base` that are readable and writable; only grows.
    committed: AtomicUsize,
    /// Serializes commits (not the readers of the committed prefix).
    commit_lock: Mutex<()>,
    /// Whether to advise `MADV_HUGEPAGE`.
    want_huge: bool,
    /// 0: not asked; 1: advised; 2 + errno: refused.
    huge: AtomicU8,
}

// SAFETY: the arena owns its mapping; the only access to its memory it hands out is
// `&[AtomicU64]`, which is `Sync`, and its own fields are atomics or behind a mutex.
unsafe impl Send for Arena {}
// SAFETY: as for `Send`.
unsafe impl Sync for Arena {}

impl Arena {
    /// Reserves `bytes` of address space (rounded up to [`HUGE_PAGE`]); nothing is
    /// committed. `huge`: advise `MADV_HUGEPAGE` on what is committed.
    pub fn reserve(bytes: usize, huge: bool) -> io::Result<Arena> {
        let reserved = round_up(bytes.max(1), HUGE_PAGE)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "arena too large"))?;
        // One huge page more, so the usable range can start on a huge-page boundary.
        let map_len = reserved
            .checked_add(HUGE_PAGE)
            .and_then(NonZeroUsize::new)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "arena too large"))?;
        // SAFETY: a new private anonymous mapping at an address the kernel chooses; it
        // overlaps nothing and nothing refers to it yet.
        let map = unsafe {
            mman::mmap_anonymous(
                None,
                map_len,
                ProtFlags::PROT_NONE,
                MapFlags::MAP_PRIVATE | MapFlags::MAP_NORESERVE,
            )
        }
        .map_err(io::Error::from)?;
        let start = map.as_ptr() as usize;
        let offset = round_up(start, HUGE_PAGE).map_or(0, |a| a - start);
        let base = NonNull::new(map.as_ptr().cast::<u8>().wrapping_add(offset))
            .expect("inside a non-null mapping");
        Ok(Arena {
            base,
            map,
            map_len: map_len.get(),
            reserved,
            committed: AtomicUsize::new(0),
            commit_lock: Mutex::new(()),
            want_huge: huge,
            huge: AtomicU8::new(0),
        })
    }

    /// Bytes of address space reserved.
    pub fn reserved(&self) -> usize {
        self.reserved
    }

    /// Bytes committed (readable and writable).
    pub fn committed(&self) -> usize {
        self.committed.load(Ordering::Acquire)
    }

    /// Makes at least the first `bytes` readable and writable (rounded up to
    /// [`HUGE_PAGE`]); the new memory reads as zero. An error (`ENOMEM` under strict
    /// overcommit, `bytes` beyond the reservation: `InvalidInput`) commits nothing.
    pub fn commit(&self, bytes: usize) -> io::Result<()> {
        if bytes <= self.committed() {
            return Ok(());
        }
        if bytes > self.reserved {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{bytes} bytes asked of an arena of {} reserved",
                    self.reserved
                ),
            ));
        }
        let _serial = self
            .commit_lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let from = self.committed();
        if bytes <= from {
            return Ok(());
        }
        let to = round_up(bytes, HUGE_PAGE).map_or(self.reserved, |b| b.min(self.reserved));
        let start = self.at(from);
        // SAFETY: `[from, to)` lies inside the reservation, which this arena owns and no
        // reference covers yet (references cover only `[0, from)`).
        unsafe {
            mman::mprotect(
                start,
                to - from,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
            )
        }
        .map_err(io::Error::from)?;
        if self.want_huge {
            // SAFETY: advice only; the range is this arena's own.
            let outcome = unsafe { mman::madvise(start, to - from, MmapAdvise::MADV_HUGEPAGE) };
            let code = match outcome {
                Ok(()) => 1,
                Err(e) => 2u8.saturating_add(e as i32 as u8),
            };
            // The first outcome is the arena's (later commits are advised the same way).
            let _ = self
                .huge
                .compare_exchange(0, code, Ordering::Relaxed, Ordering::Relaxed);
        }
        self.committed.store(to, Ordering::Release);
        Ok(())
    }

    /// The committed prefix as 64-bit words. A later commit does not change what this
    /// slice covers: ask again for the longer one.
    pub fn words(&self) -> &[AtomicU64] {
        let len = self.committed() / 8;
        // SAFETY: `base` is aligned to `HUGE_PAGE` (so to `AtomicU64`); `[0, committed)` is
        // mapped readable and writable for as long as `self` lives (commits only grow it,
        // `release` keeps it mapped, only drop unmaps it); fresh anonymous memory is zero,
        // a valid `AtomicU64`; and the arena never hands out a non-atomic or `&mut` view of
        // it, so shared access through atomics is the only access.
        unsafe { std::slice::from_raw_parts(self.base.as_ptr().cast::<AtomicU64>(), len) }
    }

    /// The committed prefix as bytes, for I/O that needs page-aligned memory (direct I/O).
    /// `&mut self`: no atomic view of the memory is alive meanwhile.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        let len = *self.committed.get_mut();
        // SAFETY: `base` and `[0, committed)` as in `words`; `&mut self` borrows the arena
        // exclusively, so no slice `words` handed out (borrowing `&self`) is alive, and the
        // returned slice keeps it borrowed for as long as it lives. Any byte is a valid `u8`.
        unsafe { std::slice::from_raw_parts_mut(self.base.as_ptr(), len) }
    }

    /// Gives the pages of `[offset, offset + len)` (shrunk to whole base pages) back to
    /// the kernel; they stay committed and read as zero from then on. The caller makes
    /// sure nothing still uses them: a thread that did would read zeros, a defined value
    /// of an atomic, not stale memory.
    pub fn release(&self, offset: usize, len: usize) -> io::Result<()> {
        let end = offset.saturating_add(len).min(self.committed());
        let start = match round_up(offset, PAGE) {
            Some(s) => s,
            None => return Ok(()),
        };
        let end = end / PAGE * PAGE;
        if end <= start {
            return Ok(());
        }
        // SAFETY: a committed range of this arena's own mapping; `MADV_DONTNEED` on private
        // anonymous memory replaces its pages with zero pages and keeps the mapping, so the
        // slices `words` handed out stay valid.
        unsafe { mman::madvise(self.at(start), end - start, MmapAdvise::MADV_DONTNEED) }
            .map_err(io::Error::from)
    }

    /// What became of the huge-page advice.
    pub fn huge_pages(&self) -> HugePages {
        match self.huge.load(Ordering::Relaxed) {
            0 => HugePages::NotAsked,
            1 => HugePages::Advised,
            c => HugePages::Refused(nix::errno::Errno::from_raw(i32::from(c - 2))),
        }
    }

    /// Bytes of this arena backed by huge pages now (`AnonHugePages` of its mappings in
    /// `/proc/self/smaps`); `None` when that cannot be read. Reads a file of the whole
    /// process: for reports, not for a loop.
    pub fn huge_resident(&self) -> Option<u64> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
        let (lo, hi) = (
            self.base.as_ptr() as usize,
            self.base.as_ptr() as usize + self.reserved,
        );
        let mut inside = false;
        let mut total = 0u64;
        for line in smaps.lines() {
            if let Some((range, _)) = line.split_once(' ') {
                if let Some((a, b)) = range.split_once('-') {
                    if let (Ok(a), Ok(b)) =
                        (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
                    {
                        inside = a < hi && b > lo;
                        continue;
                    }
                }
            }
            if inside {
                if let Some(rest) = line.strip_prefix("AnonHugePages:") {
                    let kb: u64 = rest.trim().trim_end_matches("kB").trim().parse().ok()?;
                    total += kb * 1024;
                }
            }
        }
        Some(total)
    }

    /// The address `offset` bytes into the usable range.
    fn at(&self, offset: usize) -> NonNull<c_void> {
        NonNull::new(self.base.as_ptr().wrapping_add(offset).cast::<c_void>())
            .expect("inside a non-null mapping")
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: the mapping is this arena's; with `&mut self` no slice of it is alive.
        if let Err(e) = unsafe { mman::munmap(self.map, self.map_len) } {
            log::error!("unmapping an arena of {} bytes: {e}", self.map_len);
        }
    }
}

impl fmt::Debug for Arena {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Arena")
            .field("reserved", &self.reserved)
            .field("committed", &self.committed())
            .field("huge_pages", &self.huge_pages())
            .finish()
    }
}

/// `n` rounded up to a multiple of `to` (a power of two); `None` on overflow.
fn round_up(n: usize, to: usize) -> Option<usize> {
    n.checked_add(to - 1).map(|m| m & !(to - 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commit_grows_and_reads_zero() {
        let arena = Arena::reserve(3 * HUGE_PAGE + 5, true).unwrap();
        assert_eq!(arena.reserved(), 4 * HUGE_PAGE);
        assert!(arena.words().is_empty());
        arena.commit(10).unwrap();
        assert_eq!(arena.committed(), HUGE_PAGE);
        let words = arena.words();
        assert_eq!(words.len(), HUGE_PAGE / 8);
        assert!(words
            .iter()
            .step_by(512)
            .all(|w| w.load(Ordering::Relaxed) == 0));
        words[7].store(42, Ordering::Relaxed);
        // A longer commit keeps what is there and leaves the old slice valid.
        arena.commit(HUGE_PAGE + 1).unwrap();
        assert_eq!(arena.words().len(), HUGE_PAGE / 4);
        assert_eq!(words[7].load(Ordering::Relaxed), 42);
        assert_eq!(arena.words()[7].load(Ordering::Relaxed), 42);
        // Smaller asks are no-ops; beyond the reservation is an error that commits nothing.
        arena.commit(8).unwrap();
        assert_eq!(arena.committed(), 2 * HUGE_PAGE);
        assert!(arena.commit(5 * HUGE_PAGE).is_err());
        assert_eq!(arena.committed(), 2 * HUGE_PAGE);
        assert_ne!(arena.huge_pages(), HugePages::NotAsked);
    }

    #[test]
    fn release_zeroes_whole_pages_only() {
        let arena = Arena::reserve(HUGE_PAGE, false).unwrap();
        arena.commit(HUGE_PAGE).unwrap();
        let words = arena.words();
        for w in &words[..2048] {
            w.store(7, Ordering::Relaxed);
        }
        // Bytes 100..12388: only the page [4096, 8192) and [8192, 12288) lie wholly inside.
        arena.release(100, 12288).unwrap();
        assert_eq!(words[511].load(Ordering::Relaxed), 7);
        assert_eq!(words[512].load(Ordering::Relaxed), 0);
        assert_eq!(words[1535].load(Ordering::Relaxed), 0);
        assert_eq!(words[1536].load(Ordering::Relaxed), 7);
        // Released memory is still usable.
        words[600].store(1, Ordering::Relaxed);
        assert_eq!(words[600].load(Ordering::Relaxed), 1);
        assert_eq!(arena.huge_pages(), HugePages::NotAsked);
    }

    #[test]
    fn bytes_of_the_committed_memory() {
        let mut arena = Arena::reserve(HUGE_PAGE, false).unwrap();
        arena.commit(100).unwrap();
        let bytes = arena.bytes_mut();
        assert_eq!(bytes.len(), HUGE_PAGE);
        assert_eq!(bytes.as_ptr() as usize % HUGE_PAGE, 0);
        bytes[8] = 3;
        assert_eq!(arena.words()[1].load(Ordering::Relaxed), 3);
    }

    #[test]
    fn a_large_reservation_costs_nothing_until_committed() {
        // 64 GiB of address space: more than this machine class has memory.
        let arena = Arena::reserve(64 << 30, true).unwrap();
        assert_eq!(arena.committed(), 0);
        arena.commit(HUGE_PAGE).unwrap();
        arena.words()[0].store(1, Ordering::Relaxed);
        assert!(arena.huge_resident().is_some());
    }
}
