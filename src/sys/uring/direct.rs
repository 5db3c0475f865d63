//! Direct sockets (accepted straight into the ring's file table, with no descriptor):
//! their shutdown and close by ring operations, and the way back to direct accepts after
//! the kernel's part of the table ran out.

use io_uring::{opcode, types};
use nix::libc;

use super::driver::{UringDriver, CLOSE_AFTER, SHUTDOWN_ONLY, USER_DATA_IGNORED};
use crate::sys::ops::ACCEPT_DIRECT;

impl UringDriver {
    /// Closes the direct socket at `index` of the file table, which no slot names any
    /// more, with ring operations (their completions are not delivered), queued as urgent:
    /// the close empties the entry, and the kernel may then give it to another accept.
    ///
    /// A shutdown comes first when `busy` (a multishot receive may still be in the kernel
    /// on the socket: the shutdown ends it) and always before Linux 6.13 (the kernel then
    /// lets go of a removed file only once earlier operations on the ring have completed,
    /// so the shutdown is what lets the peer see the end of the stream at once, as for a
    /// descriptor's entry, see [`FixedFiles::remove`](super::FixedFiles::remove)). The
    /// close is queued when the shutdown's completion is reaped, so the entry stays the
    /// socket's until then and no later connection given it can be shut down. Otherwise
    /// the close alone does: it drops the last reference to the socket. (The kernel runs a
    /// shutdown in a worker thread, which a close of every connection would pay for.)
    pub(in crate::sys) fn close_direct(&mut self, index: u32, busy: bool) {
        if let Some(s) = self.shutting.iter_mut().find(|s| s.0 == index) {
            // Shut down already: closed when that completes.
            s.1 = true;
            return;
        }
        if (busy || !self.prompt_close) && self.push_shutdown(index, CLOSE_AFTER) {
            return;
        }
        self.close_index(index);
    }

    /// Queues (urgent) a shutdown of the direct socket at `index` whose completion is
    /// tagged `tag`; false if it could not be queued (logged).
    fn push_shutdown(&mut self, index: u32, tag: u64) -> bool {
        let entry = opcode::Shutdown::new(types::Fixed(index), libc::SHUT_RDWR)
            .build()
            .user_data(((index as u64) << 8) | tag);
        // SAFETY: the entry references no memory.
        match unsafe { self.push_urgent(&entry) } {
            Ok(()) => true,
            Err(e) => {
                log::warn!("io_uring: queueing the shutdown of direct socket {index}: {e}");
                false
            }
        }
    }

    /// Shuts down the direct socket at `index` so that the operations in flight on it
    /// complete (a connection being closed). The kernel runs a shutdown in a worker thread,
    /// where it looks the entry up: until it has, the entry must stay the socket's, so a
    /// [`close_direct`](Self::close_direct) meanwhile waits for its completion.
    pub(in crate::sys) fn shutdown_direct(&mut self, index: u32) {
        if !self.shutting.iter().any(|s| s.0 == index) && self.push_shutdown(index, SHUTDOWN_ONLY) {
            self.shutting.push((index, false));
        }
    }

    /// Queues the close of the file table's entry `index` (urgent); empties it now if that
    /// fails (the socket closes when nothing holds it any more).
    pub(super) fn close_index(&mut self, index: u32) {
        let close = opcode::Close::new(types::Fixed(index))
            .build()
            .user_data(USER_DATA_IGNORED);
        // SAFETY: the entry references no memory.
        if let Err(e) = unsafe { self.push_urgent(&close) } {
            log::warn!("io_uring: queueing the close of direct socket {index}: {e}");
            if let Err(e) = self.ring.update_file(index, -1) {
                log::error!("io_uring: emptying file table entry {index}: {e}");
            }
        }
    }

    /// Whether direct accepts ran out of table entries and the accept in the kernel takes
    /// connections into descriptors.
    pub(in crate::sys) fn direct_accept_full(&self) -> bool {
        self.files.direct_accept() && !self.files.accept_direct_now()
    }

    /// After a direct socket was closed: once the kernel's part of the table has room
    /// again, ends an accept into descriptors still in the kernel (it completes with
    /// `ECANCELED`), so that the next one is direct.
    pub(in crate::sys) fn maybe_back_to_direct(&mut self) {
        if self.files.back_to_direct()
            && self.accept_armed
            && self.accept_user_data & 0xff != ACCEPT_DIRECT
        {
            let entry = opcode::AsyncCancel::new(self.accept_user_data)
                .build()
                .user_data(USER_DATA_IGNORED);
            // SAFETY: the entry references no memory.
            if let Err(e) = unsafe { self.push_urgent(&entry) } {
                log::warn!("io_uring: cancelling the accept into descriptors: {e}");
            }
        }
    }
}
