//! The ring's own descriptor registered with the kernel (`IORING_REGISTER_RING_FDS`, Linux
//! 5.18): `io_uring_enter` then names the ring by its index in the calling thread's table
//! of registered rings, and the kernel skips looking the descriptor up on each enter.
//!
//! The table is the registering thread's own: another thread that passed the index would
//! name whatever ring it registered there itself, if any. So a [`RingFd`] is used only on
//! the thread that registered it (others enter by descriptor, as without it), and it is
//! unregistered there; a ring dropped on another thread leaves its registration to the end
//! of the registering thread, which holds the ring until then.

use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering};

use io_uring::{types, EnterFlags};
use nix::libc;

/// `IORING_REGISTER_RING_FDS` and `IORING_UNREGISTER_RING_FDS` (include/uapi/linux/io_uring.h).
const REGISTER_RING_FDS: libc::c_uint = 20;
const UNREGISTER_RING_FDS: libc::c_uint = 21;

/// `struct io_uring_rsrc_update`.
#[repr(C)]
struct RsrcUpdate {
    offset: u32,
    resv: u32,
    data: u64,
}

/// A number no other thread of the process has (thread-local addresses can be reused by a
/// later thread; these are not).
fn this_thread() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local! {
        static ID: u64 = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    ID.with(|id| *id)
}

/// A ring descriptor registered by one thread.
#[derive(Debug)]
pub(super) struct RingFd {
    index: u32,
    thread: u64,
}

impl RingFd {
    /// Registers ring descriptor `fd` in the calling thread's table.
    pub(super) fn register(fd: RawFd) -> io::Result<RingFd> {
        let mut up = RsrcUpdate {
            offset: u32::MAX, // any free index; the kernel writes the one it took
            resv: 0,
            data: fd as u64,
        };
        // SAFETY: io_uring_register with a pointer to one initialized `io_uring_rsrc_update`
        // that lives across the call, and a count of 1.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_io_uring_register,
                fd,
                REGISTER_RING_FDS,
                &mut up as *mut RsrcUpdate,
                1u32,
            )
        };
        match rc {
            1 => Ok(RingFd {
                index: up.offset,
                thread: this_thread(),
            }),
            -1 => Err(io::Error::last_os_error()),
            n => Err(io::Error::other(format!(
                "io_uring_register(RING_FDS) registered {n} descriptors, not 1"
            ))),
        }
    }

    /// Whether the calling thread registered it (and may enter by index).
    pub(super) fn usable(&self) -> bool {
        self.thread == this_thread()
    }

    /// `io_uring_enter` by index, with `args` as `EXT_ARG` when given. Call only where
    /// [`usable`](Self::usable).
    pub(super) fn enter(
        &self,
        to_submit: u32,
        want: u32,
        flags: EnterFlags,
        args: Option<&types::SubmitArgs<'_, '_>>,
    ) -> io::Result<usize> {
        debug_assert!(self.usable());
        let flags = flags | EnterFlags::REGISTERED_RING;
        let (arg, size) = match args {
            Some(a) => (
                (a as *const types::SubmitArgs<'_, '_>).cast::<libc::c_void>(),
                std::mem::size_of::<types::SubmitArgs<'_, '_>>(),
            ),
            None => (std::ptr::null(), 0),
        };
        // SAFETY: the index names this ring in this thread's table (checked by the
        // caller through `usable`); `arg` is null or points to an `io_uring_getevents_arg`
        // (`SubmitArgs` is a transparent wrapper of one) that outlives the call, with
        // its size, as EXT_ARG requires; the flags are the caller's enter flags.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_io_uring_enter,
                self.index,
                to_submit,
                want,
                flags.bits(),
                arg,
                size,
            )
        };
        if rc < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(rc as usize)
        }
    }

    /// Unregisters it (`fd`: the ring's descriptor, still open). Call on the registering
    /// thread.
    pub(super) fn unregister(&self, fd: RawFd) {
        let up = RsrcUpdate {
            offset: self.index,
            resv: 0,
            data: 0,
        };
        // SAFETY: io_uring_register on the open ring descriptor with a pointer to one
        // initialized update naming the index this thread registered, and a count of 1.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_io_uring_register,
                fd,
                UNREGISTER_RING_FDS,
                &up as *const RsrcUpdate,
                1u32,
            )
        };
        match rc {
            1 => {}
            -1 => log::warn!(
                "unregistering the io_uring ring descriptor: {}",
                io::Error::last_os_error()
            ),
            _ => log::warn!("unregistering the io_uring ring descriptor: not registered here"),
        }
    }
}
