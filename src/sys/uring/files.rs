//! The ring's table of registered files ("direct descriptors"): each connection's socket
//! is entered in it, and its operations name it by its index, so the kernel does not look
//! the descriptor up and take a reference to its file on every operation.
//!
//! The table has two parts:
//! - The loop's own part, where the loop enters sockets that have a descriptor (those it
//!   connects, and accepted ones without direct accept). The descriptor stays open in the
//!   process (options are set on it, `shutdown` and `close` act on it); the table holds a
//!   second reference to the file, which is dropped when the entry is emptied, so an entry
//!   must be emptied before the descriptor is closed or the socket stays open.
//! - With direct accept, the kernel's part: a multishot accept puts each connection it
//!   takes in a free entry of it (`IORING_FILE_INDEX_ALLOC` in the range set by
//!   `IORING_REGISTER_FILE_ALLOC_RANGE`, Linux 6.0), and the socket
//!   has no descriptor at all. Its options come from the listener (Linux accepted sockets
//!   inherit `TCP_NODELAY`), and it is shut down and closed by ring operations on the
//!   entry. That saves the accept's descriptor, the `setsockopt` and the table update of
//!   every accepted connection.

use std::io;
use std::os::fd::RawFd;

use nix::sys::resource::{getrlimit, Resource};

use super::Ring;

/// Entries of the loop's own part of the table: the sockets it enters are put in it
/// (`RLIMIT_NOFILE` permitting); when it is full, later ones are named by descriptor.
pub const FILE_TABLE: u32 = 4096;

/// Entries of the kernel's part of the table, with direct accept: when it is full a direct
/// accept fails with `ENFILE` (the kernel closes the connection it took) and the loop
/// accepts into descriptors until a quarter of the entries are free again.
pub const DIRECT_TABLE: u32 = 4096;

/// `$build` with `$s` naming `$slot`'s socket: by its index in `$d`'s file table when it is
/// entered there, else by descriptor `$fd`.
macro_rules! on_socket {
    ($d:expr, $slot:expr, $fd:expr, |$s:ident| $build:expr) => {
        match $d.files.index($slot) {
            Some(i) => {
                let $s = io_uring::types::Fixed(i);
                $build
            }
            None => {
                let $s = io_uring::types::Fd($fd);
                $build
            }
        }
    };
}
pub(crate) use on_socket;

/// Slots past this one are never entered (the listener's is `u32::MAX`); a direct socket
/// of such a slot is refused. Session slots stay far below.
const MAX_SLOTS: u32 = 1 << 22;

/// A slot's entry: none.
const NONE: u32 = u32::MAX;

/// A slot's socket in the table.
#[derive(Debug, Clone, Copy)]
struct Entry {
    /// Its index, or [`NONE`].
    index: u32,
    /// Its descriptor, or -1 for a direct one.
    fd: RawFd,
}

const EMPTY: Entry = Entry {
    index: NONE,
    fd: -1,
};

/// An entry [`FixedFiles::remove`] emptied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removed {
    /// The slot had none, or a descriptor's entry, emptied already (the socket was shut
    /// down first).
    Done,
    /// A direct socket's entry at this index: the caller shuts it down and closes it with
    /// ring operations.
    Direct(u32),
}

/// Which slots have their socket in the ring's file table, and where.
#[derive(Debug, Default)]
pub struct FixedFiles {
    /// Per slot (grown as slots are used): its socket's entry.
    at: Vec<Entry>,
    /// Free entries of the loop's own part, taken from the end.
    free: Vec<u32>,
    /// The table's size; 0 when the ring has none.
    len: u32,
    /// Entries of the kernel's part, after the loop's; 0 without direct accept.
    direct: u32,
    /// Direct sockets in the table.
    direct_open: u32,
    /// A direct accept failed with `ENFILE`: accept into descriptors until an entry of the
    /// kernel's part is freed.
    direct_full: bool,
}

impl FixedFiles {
    /// No table: every socket is named by its descriptor.
    pub fn off() -> FixedFiles {
        FixedFiles::default()
    }

    /// A table of `own` entries for the loop, plus `direct` for the kernel to put accepted
    /// sockets in (0: no direct accept). Fewer if `RLIMIT_NOFILE` is lower (the kernel
    /// refuses a larger table): then half each. None when the kernel refuses the table
    /// (logged), and then every socket is named by its descriptor; no direct accept when
    /// it refuses the kernel's part (logged).
    pub fn new(ring: &mut Ring, own: u32, direct: u32) -> FixedFiles {
        let limit = getrlimit(Resource::RLIMIT_NOFILE).map_or(1024, |(soft, _)| soft);
        let want = u64::from(own) + u64::from(direct);
        let n = want.min(limit).min(u64::from(u32::MAX - 1)) as u32;
        let (own, direct) = if u64::from(n) == want {
            (own, direct)
        } else if direct == 0 {
            (n, 0)
        } else {
            (n / 2, n - n / 2)
        };
        if let Err(e) = ring.register_files_sparse(n) {
            log::debug!("io_uring file table of {n} entries refused ({e}); descriptors used");
            return FixedFiles::off();
        }
        let direct = if direct == 0 {
            0
        } else {
            match ring.file_alloc_range(own, direct) {
                Ok(()) => direct,
                Err(e) => {
                    log::debug!("io_uring file allocation range refused ({e}); no direct accept");
                    0
                }
            }
        };
        FixedFiles {
            at: Vec::new(),
            free: (0..own).rev().collect(),
            len: n,
            direct,
            direct_open: 0,
            direct_full: false,
        }
    }

    /// Whether the ring has a table.
    pub fn is_on(&self) -> bool {
        self.len > 0
    }

    /// Whether accepts put sockets in the kernel's part of the table.
    pub fn direct_accept(&self) -> bool {
        self.direct > 0
    }

    /// Whether the next accept should be direct: the ring has direct accept and its part
    /// of the table did not run out.
    pub fn accept_direct_now(&self) -> bool {
        self.direct > 0 && !self.direct_full
    }

    /// A direct accept failed with `ENFILE`: the kernel's part of the table is full.
    pub fn direct_ran_out(&mut self) {
        self.direct_full = true;
    }

    /// After direct accepts ran out of entries: true, once, when a quarter of the
    /// kernel's part is free again (then accepts should be direct again; the margin keeps
    /// a server at the limit from losing a connection to `ENFILE` at every close).
    pub fn back_to_direct(&mut self) -> bool {
        if self.direct_full && self.direct_open <= self.direct - self.direct / 4 {
            self.direct_full = false;
            return true;
        }
        false
    }

    /// Direct sockets in the table.
    pub fn direct_open(&self) -> u32 {
        self.direct_open
    }

    fn entry_mut(&mut self, slot: u32) -> &mut Entry {
        let i = slot as usize;
        if self.at.len() <= i {
            self.at.resize(i + 1, EMPTY);
        }
        &mut self.at[i]
    }

    /// Enters `fd` at a free entry of the loop's part for `slot`. A full part, or a
    /// refusal (logged), leaves the socket named by its descriptor.
    pub fn enter(&mut self, ring: &mut Ring, slot: u32, fd: RawFd) {
        if slot >= MAX_SLOTS {
            return;
        }
        let Some(index) = self.free.pop() else {
            return;
        };
        match ring.update_file(index, fd) {
            Ok(()) => *self.entry_mut(slot) = Entry { index, fd },
            Err(e) => {
                self.free.push(index);
                log::debug!("io_uring file table entry {index}: {e}; descriptor used");
            }
        }
    }

    /// Takes a socket a direct accept put at `index` as `slot`'s; false for a slot past
    /// those this table keeps (the caller closes the socket).
    pub fn adopt_direct(&mut self, slot: u32, index: u32) -> bool {
        if slot >= MAX_SLOTS {
            return false;
        }
        *self.entry_mut(slot) = Entry { index, fd: -1 };
        self.direct_open += 1;
        true
    }

    /// Empties `slot`'s entry, if it has one, for a socket about to be closed. Call once no
    /// operation on it is in flight.
    /// - A descriptor's: the socket is shut down first (so the peer sees the end of the
    ///   stream now, whenever the kernel lets go of the table's reference: before Linux
    ///   6.13 that waits for earlier operations on other connections), then the table lets
    ///   go of it. Call while its descriptor is still open.
    /// - A direct socket's: returned, for the caller to shut down and close by ring
    ///   operations; the entry is no longer the slot's, and the kernel frees it when the
    ///   close runs.
    pub fn remove(&mut self, ring: &mut Ring, slot: u32) -> io::Result<Removed> {
        let Some(entry) = self.at.get_mut(slot as usize) else {
            return Ok(Removed::Done);
        };
        let Entry { index, fd } = std::mem::replace(entry, EMPTY);
        if index == NONE {
            return Ok(Removed::Done);
        }
        if fd < 0 {
            self.direct_open -= 1;
            return Ok(Removed::Direct(index));
        }
        // SAFETY: shutdown(2) on the descriptor entered at this slot, which the caller
        // still holds open; no memory is passed.
        unsafe { nix::libc::shutdown(fd, nix::libc::SHUT_RDWR) };
        let r = ring.update_file(index, -1);
        self.free.push(index);
        r.map(|()| Removed::Done)
    }

    /// Empties every entry (the table's references to the sockets go, which closes the
    /// direct ones; nothing is shut down: descriptors may be closed already). Each update
    /// returns at once, whatever is in flight, unlike unregistering the table, which waits
    /// for it.
    pub fn clear(&mut self, ring: &mut Ring) {
        for slot in 0..self.at.len() {
            let Entry { index, fd } = std::mem::replace(&mut self.at[slot], EMPTY);
            if index == NONE {
                continue;
            }
            if fd >= 0 {
                self.free.push(index);
            } else {
                self.direct_open -= 1;
            }
            if let Err(e) = ring.update_file(index, -1) {
                log::warn!("emptying io_uring file table entry {index}: {e}");
            }
        }
    }

    /// The table index that names `slot`'s socket, if it is entered.
    #[inline]
    pub fn index(&self, slot: u32) -> Option<u32> {
        self.at
            .get(slot as usize)
            .map(|e| e.index)
            .filter(|&i| i != NONE)
    }
}
