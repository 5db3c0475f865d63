//! The ring's table of registered files ("direct descriptors"): each connection's socket
//! is entered in it at the connection's slot, and its operations name it by that index, so
//! the kernel does not look the descriptor up and take a reference to its file on every
//! operation. The descriptor stays open in the process (options are set on it, `shutdown`
//! and `close` act on it); the table holds a second reference to the file, which is
//! dropped when the entry is emptied, so an entry must be emptied before the descriptor is
//! closed or the socket stays open.

use std::io;
use std::os::fd::RawFd;

use nix::sys::resource::{getrlimit, Resource};

use super::Ring;

/// Entries of an io_uring loop's file table: the sockets of slots `0..FILE_TABLE` are
/// entered in it (`RLIMIT_NOFILE` permitting), those of later slots named by descriptor.
pub const FILE_TABLE: u32 = 4096;

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

/// Which slots have their socket in the ring's file table.
#[derive(Debug, Default)]
pub struct FixedFiles {
    /// One per table entry: the descriptor entered there, or -1; empty when the ring has
    /// no table.
    entered: Vec<RawFd>,
}

impl FixedFiles {
    /// No table: every socket is named by its descriptor.
    pub fn off() -> FixedFiles {
        FixedFiles::default()
    }

    /// A table of `want` entries on `ring`, fewer if `RLIMIT_NOFILE` is lower (the kernel
    /// refuses a larger one); none when the kernel refuses the table (logged), and then
    /// every socket is named by its descriptor.
    pub fn new(ring: &mut Ring, want: u32) -> FixedFiles {
        let limit = getrlimit(Resource::RLIMIT_NOFILE).map_or(1024, |(soft, _)| soft);
        let n = u64::from(want).min(limit) as u32;
        match ring.register_files_sparse(n) {
            Ok(()) => FixedFiles {
                entered: vec![-1; n as usize],
            },
            Err(e) => {
                log::debug!("io_uring file table of {n} entries refused ({e}); descriptors used");
                FixedFiles::off()
            }
        }
    }

    /// Whether the ring has a table.
    pub fn is_on(&self) -> bool {
        !self.entered.is_empty()
    }

    /// Enters `fd` at `slot`. A slot past the table, or a refusal (logged), leaves the
    /// socket named by its descriptor.
    pub fn enter(&mut self, ring: &mut Ring, slot: u32, fd: RawFd) {
        let Some(entered) = self.entered.get_mut(slot as usize) else {
            return;
        };
        match ring.update_file(slot, fd) {
            Ok(()) => *entered = fd,
            Err(e) => log::debug!("io_uring file table entry {slot}: {e}; descriptor used"),
        }
    }

    /// Empties `slot`'s entry, if it has one, for a socket about to be closed: it is shut
    /// down first (so the peer sees the end of the stream now, whenever the kernel lets go
    /// of the table's reference: before Linux 6.13 that waits for earlier operations on
    /// other connections), then the table lets go of it. Call once no operation on it is
    /// in flight, while its descriptor is still open.
    pub fn remove(&mut self, ring: &mut Ring, slot: u32) -> io::Result<()> {
        match self.entered.get_mut(slot as usize) {
            Some(entered) if *entered >= 0 => {
                // SAFETY: shutdown(2) on the descriptor entered at this slot, which the
                // caller still holds open; no memory is passed.
                unsafe { nix::libc::shutdown(*entered, nix::libc::SHUT_RDWR) };
                *entered = -1;
                ring.update_file(slot, -1)
            }
            _ => Ok(()),
        }
    }

    /// Empties every entry (the table's references to the sockets go; nothing is shut
    /// down: their descriptors may be closed already). Each update returns at once,
    /// whatever is in flight, unlike unregistering the table, which waits for it.
    pub fn clear(&mut self, ring: &mut Ring) {
        for slot in 0..self.entered.len() {
            if self.entered[slot] >= 0 {
                self.entered[slot] = -1;
                if let Err(e) = ring.update_file(slot as u32, -1) {
                    log::warn!("emptying io_uring file table entry {slot}: {e}");
                }
            }
        }
    }

    /// The table index that names `slot`'s socket, if it is entered.
    pub fn index(&self, slot: u32) -> Option<u32> {
        self.entered
            .get(slot as usize)
            .is_some_and(|&fd| fd >= 0)
            .then_some(slot)
    }
}
