//! The io_uring half of the I/O driver ([`Driver`](crate::sys::driver::Driver)): a ring,
//! the armed doorbell poll, and multishot receives into a ring of provided buffers.
//!
//! Entries are submitted lazily, to need one `io_uring_enter` per loop turn or fewer: a
//! send, connect or cancel (something a peer or a closing connection waits for) is
//! *urgent* and goes out at the next `complete`; a receive, accept or doorbell poll
//! re-armed after its completion waits for the next enter that happens anyway (an urgent
//! entry, completions to collect, a park), or for `submit_pending`, which the loop calls
//! when a turn found nothing to do. Data that arrives meanwhile waits in the socket and
//! completes the receive as soon as it is submitted.
//!
//! **Multishot receives.** With a buffer ring ([`BufRing`]), a receive that may read ahead
//! (into the buffer of a connection carrying small frames) arms one multishot receive on
//! its socket, which stays in the kernel: each arrival of data completes with a buffer of
//! the ring, with no re-arming (a one-shot receive costs the kernel a poll arm per
//! receive). The data is copied into the connection's buffer when a receive is waiting
//! for it, and kept in the slot's *stash* (the ring buffer, held) until one is; a receive
//! that finds stashed data completes without the kernel. Where the kernel has them (Linux
//! 6.10) the multishot receives take bundles: one completion fills as many consecutive
//! buffers of the ring as the data needs ([`BufRing::take`]). Without bundles, where the
//! kernel has it (Linux 6.12), the ring may be consumed incrementally: the kernel packs
//! the data of successive receives, of any connections, into one buffer until it is full,
//! and a buffer goes back to the kernel once the last piece of it is copied out.
//!
//! A receive that must not read ahead (a header read on its own before a large payload,
//! or the payload received in place) cancels the slot's multishot receive, takes what the
//! stash holds, and then reads exactly what it asks for, straight into its memory, with a
//! one-shot receive. The next receive that may read ahead arms a new multishot receive.
//!
//! A slot that holds a quarter of the ring unread (at least [`STASH_MIN`] buffers) has its
//! multishot receive cancelled:
//! the socket's buffer and TCP flow control hold the rest. The kernel keeps filling
//! buffers until the cancel takes effect, and a sender faster than the loop can take the
//! whole ring in one go; the ring then ends the other slots' multishot receives (the
//! kernel reports it empty) and, while it is nearly empty, receives that may read ahead
//! are one-shot reads into the connection's buffer, counted in
//! [`RecvRing::exhausted`]; all come back to multishot receives at a later receive. Memory
//! stays the ring's fixed size whatever peers send. A slot's multishot receive still in
//! the kernel when the slot is released is shut down and its completions recycled (they
//! carry a generation).

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

use io_uring::{cqueue, opcode, squeue, types};
use nix::libc;

use super::USER_DATA_RESERVED_MIN;
use super::{
    on_socket, BufRing, FixedFiles, Ring, SetupFlags, BUF_GROUP, DIRECT_TABLE, FILE_TABLE,
};
use crate::sys::doorbell::Doorbell;
use crate::sys::ops::{decode, user_data, IoCompletion, Op, ACCEPT_DIRECT, USER_DATA_DOORBELL};

/// Most stash entries a slot has room for from the start (12 bytes each: 3 KiB per
/// connection), whatever the ring's size.
const STASH_ROOM_MAX: usize = 256;

/// The operation kind of a multishot receive in `user_data` (next to [`Op`]'s).
const MULTI_RECV: u64 = 5;

/// `user_data` of the driver's operations whose completions are ignored (operation byte 0:
/// `decode` knows none).
pub(super) const USER_DATA_IGNORED: u64 = 0;

/// The low byte of the `user_data` of a direct socket's shutdown whose completion queues
/// its close; the file table index is above it.
pub(super) const CLOSE_AFTER: u64 = 7;

/// The low byte of the `user_data` of a direct socket's shutdown made while it stays open
/// (see [`UringDriver::shutdown_direct`]); the file table index is above it.
pub(super) const SHUTDOWN_ONLY: u64 = 8;

/// Ring buffers a slot may hold unread before its multishot receive is cancelled, at
/// least: a quarter of the ring when that is more (a bundle can bring a burst of many
/// buffers at once to a connection that is read, and cancelling it then only costs a
/// re-arm).
pub const STASH_MIN: usize = 8;

/// The most ring buffers a slot may hold unread in a ring of `count`.
fn stash_max(count: u16) -> usize {
    (usize::from(count) / 4).max(STASH_MIN)
}

/// `user_data` of generation `gen` of `slot`'s multishot receive.
fn multi_user_data(slot: u32, gen: u16) -> u64 {
    (u64::from(gen) << 40) | (u64::from(slot) << 8) | MULTI_RECV
}

/// Where a slot's multishot receive is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Armed {
    /// None in the kernel.
    Off,
    /// In the kernel.
    On,
    /// In the kernel, cancelled: its last completion has not come yet.
    Cancelling,
}

/// A slot's multishot receive.
#[derive(Debug)]
struct MultiSlot {
    /// Generation of the current multishot receive; bumped when the slot is released.
    gen: u16,
    armed: Armed,
    fd: RawFd,
    /// A receive waiting for data: where to copy it, how much fits, and whether it is to
    /// be read in place (straight into this memory) once the stash is empty.
    waiting: Option<(*mut u8, u32, bool)>,
    /// Ring buffers received and not yet copied out: (buffer id, start, bytes left).
    stash: VecDeque<(u16, u32, u32)>,
    /// How the stream ended (0, or `-errno`), reported once the stash is empty.
    end: Option<i32>,
}

impl MultiSlot {
    /// A slot whose stash has room for one entry per buffer of a ring of `buffers` (up to
    /// [`STASH_ROOM_MAX`]): the most it can hold with whole buffers (a burst can fill the
    /// ring before its cancel takes effect), so that a connection's receives do not grow
    /// it (with a larger ring, or incremental consumption, whose pieces can outnumber the
    /// buffers, they may).
    fn new(buffers: usize) -> MultiSlot {
        MultiSlot {
            gen: 0,
            armed: Armed::Off,
            fd: -1,
            waiting: None,
            stash: VecDeque::with_capacity(buffers.clamp(STASH_MIN, STASH_ROOM_MAX)),
            end: None,
        }
    }
}

/// Multishot receives into a buffer ring.
#[derive(Debug)]
struct Multi {
    bufs: BufRing,
    slots: Vec<MultiSlot>,
    /// Receive completions produced here (`user_data`, result): served from a stash or
    /// filled by a multishot completion. Delivered by the next `complete`.
    ready: VecDeque<(u64, i32)>,
    /// Multishot completions reaped, handled after the reap.
    cqes: Vec<(u64, i32, u32)>,
    /// Multishot receives in the kernel for live slots, and for released ones.
    armed: usize,
    orphans: Vec<(u32, u16)>,
    /// The kernel refused a multishot receive (`EINVAL`: before Linux 6.0): every receive
    /// is one-shot from then on.
    refused: bool,
    /// Multishot receives are bundles: one completion may fill several buffers.
    bundles: bool,
    /// The pieces of buffers of the completion being handled (buffer, start, length;
    /// reused).
    pieces: Vec<(u16, usize, usize)>,
    /// Times a receive found the ring (nearly) empty, or a multishot ended for that.
    exhausted: u64,
    /// Bytes copied out of ring buffers.
    copied: u64,
    /// Completions with data, and the buffers they filled.
    completions: u64,
    filled: u64,
    /// The driver is going: receives are cancelled, none is started.
    draining: bool,
}

/// A loop's ring of provided buffers, as [`Driver::recv_ring`](crate::sys::driver::Driver::recv_ring)
/// reports it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecvRing {
    /// Buffers in the ring.
    pub buffers: u16,
    /// Bytes of memory it holds.
    pub bytes: usize,
    /// Buffers out of the kernel now: holding data not yet copied to a receive.
    pub held: u16,
    /// Times a receive found the ring (nearly) empty and read on its own, or a multishot
    /// receive ended for that.
    pub exhausted: u64,
    /// Bytes copied out of ring buffers into receives.
    pub copied: u64,
    /// Multishot receive completions that carried data.
    pub completions: u64,
    /// Buffers those completions filled (more than completions with bundles, fewer with
    /// incremental consumption: a buffer counts when the kernel is done with it).
    pub filled: u64,
    /// The kernel consumes the buffers incrementally (several receives per buffer).
    pub incremental: bool,
    /// Multishot receives take bundles.
    pub bundles: bool,
    /// Buffers a connection may hold unread before its multishot receive is cancelled.
    pub stash_max: usize,
}

/// How a slot's waiting receive goes on once no multishot receive of the slot is in the
/// kernel and its stash is empty.
enum Next {
    /// It completes with this result: the end of the stream, an error, or cancelled.
    Complete(i32),
    /// A one-shot read into its memory.
    Once,
    /// A new multishot receive.
    Arm,
}

impl Multi {
    /// How `slot`'s waiting receive goes on (see [`Next`]): one read in place, a kernel
    /// without multishot receives or a ring nearly empty take a one-shot read.
    fn next(&self, slot: u32) -> Next {
        let s = &self.slots[slot as usize];
        if let Some(end) = s.end.or(self.draining.then_some(-libc::ECANCELED)) {
            return Next::Complete(end);
        }
        let direct = s.waiting.is_some_and(|(_, _, direct)| direct);
        let low = self.bufs.in_kernel() <= self.bufs.count() / 8;
        if direct || self.refused || low {
            Next::Once
        } else {
            Next::Arm
        }
    }

    fn slot(&mut self, slot: u32) -> &mut MultiSlot {
        let i = slot as usize;
        if i >= self.slots.len() {
            let buffers = usize::from(self.bufs.count());
            self.slots.resize_with(i + 1, || MultiSlot::new(buffers));
        }
        &mut self.slots[i]
    }

    /// Copies stashed bytes of `slot` to its waiting receive and completes it; false when
    /// there is none or nothing is stashed.
    fn fill(&mut self, slot: u32) -> bool {
        let Some(s) = self.slots.get_mut(slot as usize) else {
            return false;
        };
        let Some((dst, room, _)) = s.waiting else {
            return false;
        };
        if s.stash.is_empty() {
            return false;
        }
        let mut n = 0u32;
        while let Some(front) = s.stash.front_mut() {
            if n == room {
                break;
            }
            let want = front.2.min(room - n);
            let src = self.bufs.data(front.0, front.1 as usize, want as usize);
            let take = src.len() as u32;
            if take == 0 {
                // Not a range of the buffer (a stash entry is checked when made): dropped.
                let bid = front.0;
                s.stash.pop_front();
                self.bufs.release(bid);
                continue;
            }
            // SAFETY: `dst..dst + room` is the waiting receive's memory, which the driver
            // holds until this receive's completion is reaped; `n + take <= room`, and the
            // ring buffer `src` is ours (a completion named it), separate from `dst`.
            unsafe {
                std::ptr::copy_nonoverlapping(src.as_ptr(), dst.add(n as usize), src.len());
            }
            n += take;
            front.1 += take;
            front.2 -= take;
            if front.2 == 0 {
                let bid = front.0;
                s.stash.pop_front();
                self.bufs.release(bid);
            }
        }
        if n == 0 {
            return false;
        }
        s.waiting = None;
        self.copied += u64::from(n);
        self.ready.push_back((user_data(slot, Op::Recv), n as i32));
        true
    }
}

/// io_uring half: a ring, the armed doorbell poll and, with a buffer ring, multishot
/// receives.
pub struct UringDriver {
    pub(in crate::sys) ring: Ring,
    /// An urgent entry is queued.
    urgent: bool,
    doorbell_fd: RawFd,
    doorbell_armed: bool,
    /// Completions taken out of the ring to make room for a submission; delivered first.
    overflow: Vec<(u64, i32, u32)>,
    /// An accept is in the kernel (a one-shot one until its completion, a multishot one
    /// until its last).
    pub(in crate::sys) accept_armed: bool,
    /// The sockets entered in the ring's file table.
    pub(in crate::sys) files: FixedFiles,
    /// Emptying a file table entry drops its reference to the file at once (Linux 6.13).
    pub(super) prompt_close: bool,
    /// `user_data` of the accept last armed.
    pub(in crate::sys) accept_user_data: u64,
    /// Direct sockets with a shutdown in the kernel ([`shutdown_direct`]), and whether
    /// their close waits for it.
    ///
    /// [`shutdown_direct`]: Self::shutdown_direct
    pub(super) shutting: Vec<(u32, bool)>,
    /// Multishot receives, when the ring has a buffer ring. Declared after `ring`: dropped
    /// after it (the driver leaks it instead when operations did not drain).
    multi: Option<Multi>,
}

/// How an io_uring driver sets up its ring: the optional kernel features it asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UringOptions {
    /// Setup flags (see [`Ring::with_flags`]).
    pub flags: SetupFlags,
    /// A table of registered files that sockets are entered in (see [`FixedFiles`]).
    pub fixed_files: bool,
    /// With the file table and multishot accepts: accepts put sockets straight in the
    /// table, with no descriptor (see [`FixedFiles`]).
    pub direct_accept: bool,
    /// Buffers in the ring of provided buffers that multishot receives take data from; 0
    /// for none (every receive one-shot).
    pub recv_bufs: u32,
    /// Multishot receives as bundles where the kernel has them (Linux 6.10): one
    /// completion may fill several buffers.
    pub recv_bundles: bool,
    /// The ring consumed incrementally where the kernel has it (Linux 6.12) and bundles
    /// are not taken: several receives fill one buffer.
    pub recv_incremental: bool,
}

impl Default for UringOptions {
    /// As the settings' defaults: the setup flags, the file table and a ring of 256
    /// buffers, without bundles.
    fn default() -> UringOptions {
        UringOptions {
            flags: SetupFlags::Auto,
            fixed_files: true,
            direct_accept: true,
            recv_bufs: 256,
            recv_bundles: false,
            recv_incremental: false,
        }
    }
}

impl UringDriver {
    /// A ring of `entries` set up as `opts` asks: a file table, and a ring of provided
    /// buffers for multishot receives when the ring has `DEFER_TASKRUN` (refused by the
    /// kernel: logged, and receives are one-shot).
    pub(in crate::sys) fn new(
        entries: u32,
        doorbell: &Doorbell,
        opts: UringOptions,
    ) -> io::Result<UringDriver> {
        let UringOptions {
            flags,
            fixed_files,
            direct_accept,
            recv_bufs,
            recv_bundles,
            recv_incremental,
        } = opts;
        let mut ring = Ring::with_flags(entries, flags)?;
        let caps = *ring.capabilities();
        // Direct accepts are multishot ones, which need a task-work flag (as `accept`).
        let direct = direct_accept && (caps.defer_taskrun || caps.coop_taskrun);
        let files = if fixed_files {
            FixedFiles::new(&mut ring, FILE_TABLE, if direct { DIRECT_TABLE } else { 0 })
        } else {
            FixedFiles::off()
        };
        log::debug!(
            "io_uring ring: single_issuer {} defer_taskrun {} coop_taskrun {} taskrun_flag {}",
            caps.single_issuer,
            caps.defer_taskrun,
            caps.coop_taskrun,
            caps.taskrun_flag
        );
        // Multishot receives need Linux 6.0; DEFER_TASKRUN (6.1) stands for a
        // kernel recent enough, as for multishot accepts.
        let multi = if recv_bufs > 0 && caps.defer_taskrun {
            let bundles = recv_bundles && caps.feat_recvsend_bundle;
            match BufRing::new(&mut ring, recv_bufs, recv_incremental && !bundles) {
                Ok(bufs) => Some(Multi {
                    pieces: Vec::with_capacity(bufs.count().into()),
                    bufs,
                    slots: Vec::new(),
                    ready: VecDeque::with_capacity(1024),
                    cqes: Vec::with_capacity(caps.cq_entries as usize),
                    armed: 0,
                    orphans: Vec::new(),
                    refused: false,
                    bundles,
                    exhausted: 0,
                    copied: 0,
                    completions: 0,
                    filled: 0,
                    draining: false,
                }),
                Err(e) => {
                    log::warn!(
                        "io_uring: no ring of provided buffers ({e}); receives are one-shot"
                    );
                    None
                }
            }
        } else {
            None
        };
        let mut d = UringDriver {
            ring,
            urgent: false,
            doorbell_fd: doorbell.as_raw_fd(),
            doorbell_armed: false,
            overflow: Vec::new(),
            accept_armed: false,
            files,
            prompt_close: super::kernel_at_least(6, 13),
            accept_user_data: 0,
            shutting: Vec::new(),
            multi,
        };
        d.arm_doorbell()?;
        Ok(d)
    }

    /// The buffer ring's state and counts, when there is one.
    pub(in crate::sys) fn recv_ring(&self) -> Option<RecvRing> {
        let m = self.multi.as_ref()?;
        Some(RecvRing {
            buffers: m.bufs.count(),
            bytes: m.bufs.bytes(),
            held: m.bufs.count() - m.bufs.in_kernel(),
            exhausted: m.exhausted,
            copied: m.copied,
            completions: m.completions,
            filled: m.filled,
            incremental: m.bufs.incremental(),
            bundles: m.bundles,
            stash_max: stash_max(m.bufs.count()),
        })
    }

    /// Multishot receives in the kernel (their memory is the buffer ring's).
    pub(in crate::sys) fn multishots_in_flight(&self) -> usize {
        self.multi.as_ref().map_or(0, |m| m.armed + m.orphans.len())
    }

    fn arm_doorbell(&mut self) -> io::Result<()> {
        if self.doorbell_armed {
            return Ok(());
        }
        // A poll, not a read: no buffer is handed to the kernel, so nothing can be written
        // after the driver is gone. The eventfd is drained in user space on completion.
        let entry = opcode::PollAdd::new(types::Fd(self.doorbell_fd), libc::POLLIN as u32)
            .build()
            .user_data(USER_DATA_DOORBELL);
        // SAFETY: the entry references no memory; the eventfd outlives the driver (it is
        // owned by the loop's shared state).
        unsafe { self.push(&entry)? };
        self.doorbell_armed = true;
        Ok(())
    }

    /// Starts a receive of up to `len` bytes into `buf` on `slot`: with `ahead`, into a
    /// connection's buffer from a multishot receive that may read ahead (bytes past `len`
    /// are kept for the next receives); else exactly `len` bytes at most, read straight
    /// into `buf` once the bytes kept are used up. `fixed` is the registered pool buffer
    /// `buf` lies in, if any. Returns whether the read is a `READ_FIXED` entry.
    ///
    /// # Safety
    /// `buf..buf + len` must stay valid, and not be otherwise accessed, until this
    /// receive's completion (`user_data(slot, Op::Recv)`) has been delivered; a `fixed`
    /// index must name a registered buffer that contains it.
    pub(in crate::sys) unsafe fn recv(
        &mut self,
        slot: u32,
        fd: RawFd,
        buf: *mut u8,
        len: u32,
        ahead: bool,
        fixed: Option<u16>,
    ) -> io::Result<bool> {
        let Some(m) = self.multi.as_mut() else {
            // SAFETY: passed on from the caller.
            return unsafe { self.recv_once(slot, fd, buf, len, fixed) };
        };
        let s = m.slot(slot);
        s.fd = fd;
        // `direct`: once the multishot receive has ended, a one-shot read into `buf`.
        s.waiting = Some((buf, len, !ahead));
        if !ahead && s.armed == Armed::On {
            // Exact reads from here (a header before a large payload, or the payload in
            // place): no more reading ahead.
            s.armed = Armed::Cancelling;
            let gen = s.gen;
            if let Err(e) = self.cancel_multi(slot, gen) {
                let s = &mut self.multi.as_mut().expect("checked above").slots[slot as usize];
                (s.armed, s.waiting) = (Armed::On, None);
                return Err(e);
            }
        }
        let m = self.multi.as_mut().expect("checked above");
        // Data (or the end) completes the waiting receive; after a cancel, a one-shot read
        // does if no data does.
        if m.fill(slot) || m.slots[slot as usize].armed != Armed::Off {
            return Ok(false);
        }
        // A receive that could read ahead and reads on its own: the ring is nearly empty.
        if ahead && !m.refused && matches!(m.next(slot), Next::Once) {
            m.exhausted += 1;
        }
        // SAFETY: passed on from the caller.
        let r = unsafe { self.start_waiting(slot, fixed) };
        if r.is_err() {
            // Not started: the caller takes `buf` back.
            self.multi.as_mut().expect("checked above").slots[slot as usize].waiting = None;
        }
        r
    }

    /// Starts `slot`'s waiting receive as [`Multi::next`] says, once no multishot receive
    /// of the slot is in the kernel and its stash is empty; `fixed` as for
    /// [`recv`](Self::recv). Returns whether a one-shot read is a `READ_FIXED` entry.
    ///
    /// # Safety
    /// The waiting receive's memory is held as [`recv`](Self::recv) requires, and `fixed`
    /// names a registered buffer that contains it.
    unsafe fn start_waiting(&mut self, slot: u32, fixed: Option<u16>) -> io::Result<bool> {
        let m = self.multi.as_mut().expect("called with multishot receives");
        let next = m.next(slot);
        let s = &mut m.slots[slot as usize];
        let Some((buf, len, _)) = s.waiting else {
            return Ok(false);
        };
        match next {
            Next::Complete(end) => {
                s.waiting = None;
                m.ready.push_back((user_data(slot, Op::Recv), end));
                Ok(false)
            }
            Next::Once => {
                s.waiting = None;
                let fd = s.fd;
                // SAFETY: passed on from the caller; the one-shot read now carries the
                // waiting receive's completion.
                unsafe { self.recv_once(slot, fd, buf, len, fixed) }
            }
            Next::Arm => self.arm_multi(slot).map(|()| false),
        }
    }

    /// A one-shot receive into `buf`.
    ///
    /// # Safety
    /// As [`recv`](Self::recv).
    unsafe fn recv_once(
        &mut self,
        slot: u32,
        fd: RawFd,
        buf: *mut u8,
        len: u32,
        fixed: Option<u16>,
    ) -> io::Result<bool> {
        let d = self;
        let entry = match fixed {
            // Offset 0 on a socket (not seekable): the kernel reads at the stream's current
            // position.
            Some(index) => {
                on_socket!(d, slot, fd, |s| opcode::ReadFixed::new(s, buf, len, index)
                    .build())
            }
            None => on_socket!(d, slot, fd, |s| opcode::Recv::new(s, buf, len).build()),
        }
        .user_data(user_data(slot, Op::Recv));
        // SAFETY: the caller keeps the memory valid until the completion is delivered.
        unsafe { d.push(&entry)? };
        Ok(fixed.is_some())
    }

    /// Arms a multishot receive on `slot` (its `fd` noted by `recv`).
    fn arm_multi(&mut self, slot: u32) -> io::Result<()> {
        let Some(m) = self.multi.as_mut() else {
            return Ok(());
        };
        let bundles = m.bundles;
        let s = m.slot(slot);
        let (fd, gen) = (s.fd, s.gen);
        let d = &mut *self;
        let entry = if bundles {
            on_socket!(d, slot, fd, |s| opcode::RecvMultiBundle::new(s, BUF_GROUP)
                .build())
        } else {
            on_socket!(d, slot, fd, |s| opcode::RecvMulti::new(s, BUF_GROUP)
                .build())
        }
        .user_data(multi_user_data(slot, gen));
        // SAFETY: the entry's memory is the buffer ring's, which the driver keeps while
        // any multishot receive is in the kernel (`multishots_in_flight`).
        unsafe { d.push(&entry)? };
        let m = d.multi.as_mut().expect("checked above");
        m.slots[slot as usize].armed = Armed::On;
        m.armed += 1;
        Ok(())
    }

    /// Cancels generation `gen` of `slot`'s multishot receive.
    fn cancel_multi(&mut self, slot: u32, gen: u16) -> io::Result<()> {
        let entry = opcode::AsyncCancel::new(multi_user_data(slot, gen))
            .build()
            .user_data(u64::from(slot) << 8);
        // SAFETY: the cancel entry references no memory.
        unsafe { self.push_urgent(&entry) }
    }

    /// Handles a multishot receive's completion.
    fn on_multi(&mut self, data: u64, result: i32, flags: u32) -> io::Result<()> {
        let Some(m) = self.multi.as_mut() else {
            return Ok(());
        };
        let (slot, gen) = ((data >> 8) as u32, (data >> 40) as u16);
        // The buffers it filled: one, or several for a bundle.
        let mut pieces = std::mem::take(&mut m.pieces);
        pieces.clear();
        let first = cqueue::buffer_select(flags);
        let bytes = result.max(0) as usize;
        let taken = first.map_or(0, |b| {
            m.bufs
                .take(b, bytes, cqueue::buffer_more(flags), |bid, start, len| {
                    pieces.push((bid, start, len))
                })
        });
        let more = cqueue::buffer_more(flags);
        if result > 0 {
            m.completions += 1;
            // Buffers this completion finished: with incremental consumption, the one it
            // named once the kernel is done with it.
            m.filled += if m.bufs.incremental() {
                u64::from(taken > 0 && !more)
            } else {
                u64::from(taken)
            };
        }
        let last = !cqueue::more(flags);
        let live = m
            .slots
            .get(slot as usize)
            .is_some_and(|s| s.gen == gen && s.armed != Armed::Off);
        if !live {
            // A released slot's receive: its data goes nowhere.
            for &(bid, _, _) in &pieces {
                m.bufs.release(bid);
            }
            m.pieces = pieces;
            if last {
                m.orphans.retain(|&o| o != (slot, gen));
            }
            return Ok(());
        }
        let s = &mut m.slots[slot as usize];
        for &(bid, start, len) in &pieces {
            if len > 0 {
                s.stash.push_back((bid, start as u32, len as u32));
            } else {
                m.bufs.release(bid);
            }
        }
        m.pieces = pieces;
        if result > 0 && taken == 0 {
            log::error!(
                "io_uring: slot {slot}: {result} bytes received in a buffer out of the ring's \
                 order ({first:?})"
            );
            s.end = Some(-libc::EIO);
        }
        if last {
            s.armed = Armed::Off;
            m.armed = m.armed.saturating_sub(1);
            match result {
                0 => s.end = Some(0),
                r if r == -libc::ENOBUFS => m.exhausted += 1,
                r if r == -libc::EINVAL && !m.refused => {
                    // Not a socket error: this kernel has no multishot receive.
                    log::warn!(
                        "io_uring: multishot receive refused (EINVAL); receives are one-shot"
                    );
                    m.refused = true;
                }
                r if r == -libc::ECANCELED || r > 0 => {}
                r => s.end = Some(r),
            }
        }
        if m.fill(slot) {
            return Ok(());
        }
        let s = &mut m.slots[slot as usize];
        if s.armed == Armed::Off {
            // SAFETY: the waiting receive's memory is held by the driver until its
            // completion is reaped (`Driver::recv`); no fixed buffer is named.
            let r = unsafe { self.start_waiting(slot, None) }.map(drop);
            if let Err(e) = &r {
                // The waiting receive completes with the error.
                let m = self.multi.as_mut().expect("checked above");
                m.slots[slot as usize].waiting = None;
                let errno = -e.raw_os_error().unwrap_or(libc::EIO);
                m.ready.push_back((user_data(slot, Op::Recv), errno));
            }
            return r;
        }
        if s.armed == Armed::On && s.stash.len() >= stash_max(m.bufs.count()) {
            // Nobody reads this connection: leave the rest in its socket.
            s.armed = Armed::Cancelling;
            let gen = s.gen;
            if let Err(e) = self.cancel_multi(slot, gen) {
                self.multi.as_mut().expect("checked above").slots[slot as usize].armed = Armed::On;
                return Err(e);
            }
        }
        Ok(())
    }

    /// `slot` is being released: its stash goes back to the ring, and a multishot receive
    /// still in the kernel is shut down (its completions are recycled; a direct socket's
    /// by the caller, see [`close_direct`](Self::close_direct)). Returns whether there was
    /// one.
    pub(in crate::sys) fn release(&mut self, slot: u32) -> bool {
        let Some(m) = self.multi.as_mut() else {
            return false;
        };
        let Some(s) = m.slots.get_mut(slot as usize) else {
            return false;
        };
        while let Some((bid, _, _)) = s.stash.pop_front() {
            m.bufs.release(bid);
        }
        s.waiting = None;
        s.end = None;
        if s.armed != Armed::Off {
            m.armed = m.armed.saturating_sub(1);
            m.orphans.push((slot, s.gen));
            // A direct socket (no descriptor) is shut down by the ring operations that
            // close it, which the caller queues next (`Driver::deregister`).
            // SAFETY: shutdown(2) on the slot's socket, still open (the loop closes it
            // after releasing the slot); no memory is passed.
            if s.fd >= 0 && unsafe { libc::shutdown(s.fd, libc::SHUT_RDWR) } < 0 {
                let e = io::Error::last_os_error();
                log::warn!("slot {slot}: shutting down for its multishot receive: {e}");
            }
        }
        let orphaned = s.armed != Armed::Off;
        s.armed = Armed::Off;
        s.gen = s.gen.wrapping_add(1);
        s.fd = -1;
        orphaned
    }

    /// Cancels every multishot receive in the kernel (the driver is going).
    pub(in crate::sys) fn cancel_all_multi(&mut self) {
        let Some(m) = self.multi.as_mut() else {
            return;
        };
        // A receive waiting on a cancelled multishot receive then completes cancelled
        // instead of starting another.
        m.draining = true;
        let live: Vec<(u32, u16)> = (m.slots.iter().enumerate())
            .filter(|(_, s)| s.armed != Armed::Off)
            .map(|(i, s)| (i as u32, s.gen))
            .chain(m.orphans.iter().copied())
            .collect();
        for (slot, gen) in live {
            if let Err(e) = self.cancel_multi(slot, gen) {
                log::warn!("cancelling the multishot receive of slot {slot}: {e}");
            }
        }
    }

    /// Takes the buffer ring out to be leaked (operations on it did not drain).
    pub(in crate::sys) fn leak_multi(&mut self) {
        if let Some(m) = self.multi.take() {
            std::mem::forget(m.bufs);
        }
    }

    /// [`push`](Self::push), for an entry to submit at the next `complete`.
    ///
    /// # Safety
    /// As [`Ring::push`].
    pub(in crate::sys) unsafe fn push_urgent(&mut self, entry: &squeue::Entry) -> io::Result<()> {
        // SAFETY: passed on from the caller.
        unsafe { self.push(entry)? };
        self.urgent = true;
        Ok(())
    }

    /// Submits what is queued, urgent or not (no wait).
    pub(in crate::sys) fn submit_pending(&mut self) -> io::Result<()> {
        if self.ring.pending_submissions() > 0 {
            self.ring.submit()?;
            self.urgent = false;
        }
        Ok(())
    }

    /// # Safety
    /// As [`Ring::push`].
    pub(in crate::sys) unsafe fn push(&mut self, entry: &squeue::Entry) -> io::Result<()> {
        loop {
            // SAFETY: passed on from the caller.
            match unsafe { self.ring.push(entry) } {
                Err(e) if matches!(e.raw_os_error(), Some(libc::EBUSY) | Some(libc::EAGAIN)) => {
                    // The kernel has no room for more completions: take them out (they are
                    // delivered first by the next `complete`), then submit again.
                    let overflow = &mut self.overflow;
                    self.ring.reap(|ud, res, fl| overflow.push((ud, res, fl)));
                }
                other => return other,
            }
        }
    }

    /// Submits what is queued and delivers ready completions to `f`, waiting up to
    /// `timeout` for the first one when `wait` is true. Returns how many were delivered.
    pub(in crate::sys) fn complete(
        &mut self,
        wait: bool,
        timeout: Option<Duration>,
        f: &mut dyn FnMut(IoCompletion),
    ) -> io::Result<usize> {
        let ready = self.multi.as_ref().is_some_and(|m| !m.ready.is_empty());
        // One enter at most: it submits everything queued since the last one and, when the
        // ring defers task work, posts the completions waiting for it.
        if wait && !ready && self.overflow.is_empty() && !self.ring.has_completions() {
            self.ring.submit_and_wait(1, timeout)?;
            self.urgent = false;
        } else if self.ring.completions_held()
            || (self.urgent || wait) && self.ring.pending_submissions() > 0
        {
            self.ring.submit()?;
            self.urgent = false;
        }
        // Otherwise no syscall: completions are read from the shared ring. A ring with a
        // task-work flag raises IORING_SQ_TASKRUN when completions wait for an enter, which
        // `needs_enter` sees; one without has them posted by the kernel on its own.
        let mut rearm = false;
        let mut accept_ended = false;
        let mut direct_full = false;
        // Direct sockets shut down, to be closed now, and those shut down to stay open
        // (rare: no allocation otherwise).
        let mut closes: Vec<u32> = Vec::new();
        let mut shut: Vec<u32> = Vec::new();
        let mut n = 0;
        let mut multi = self.multi.as_mut().map(|m| std::mem::take(&mut m.cqes));
        let mut deliver = |user_data: u64, result: i32, flags: u32| {
            if user_data & 0xff == MULTI_RECV && user_data != USER_DATA_DOORBELL {
                if let Some(cqes) = multi.as_mut() {
                    cqes.push((user_data, result, flags));
                }
                return 0;
            }
            // The kernel's part of the file table is full (the connection is closed).
            direct_full |= user_data & 0xff == ACCEPT_DIRECT && result == -libc::ENFILE;
            if user_data < USER_DATA_RESERVED_MIN {
                match user_data & 0xff {
                    CLOSE_AFTER => closes.push((user_data >> 8) as u32),
                    SHUTDOWN_ONLY => shut.push((user_data >> 8) as u32),
                    _ => {}
                }
            }
            let Some(c) = decode(user_data, result) else {
                return 0;
            };
            rearm |= matches!(c, IoCompletion::Doorbell);
            // The last completion of an accept: none follows without a new one.
            accept_ended |= matches!(c, IoCompletion::Accepted(_)) && !cqueue::more(flags);
            f(c);
            1
        };
        for (user_data, result, flags) in self.overflow.drain(..) {
            n += deliver(user_data, result, flags);
        }
        self.ring.reap(|user_data, result, flags| {
            n += deliver(user_data, result, flags);
        });
        if let Some(mut cqes) = multi {
            for &(user_data, result, flags) in &cqes {
                if let Err(e) = self.on_multi(user_data, result, flags) {
                    log::error!(
                        "io_uring: multishot receive of slot {}: {e}",
                        (user_data >> 8) as u32
                    );
                }
            }
            cqes.clear();
            let m = self.multi.as_mut().expect("taken from it above");
            m.cqes = cqes;
            while let Some((user_data, result)) = m.ready.pop_front() {
                if let Some(c) = decode(user_data, result) {
                    f(c);
                    n += 1;
                }
            }
        }
        if accept_ended {
            self.accept_armed = false;
        }
        for index in shut {
            if let Some(i) = self.shutting.iter().position(|s| s.0 == index) {
                if self.shutting.swap_remove(i).1 {
                    closes.push(index);
                }
            }
        }
        for index in closes {
            self.close_index(index);
        }
        if direct_full {
            log::warn!(
                "io_uring: the file table has no free entry for a direct accept ({} direct \
                 sockets open); the kernel closed that connection, and connections are \
                 accepted into descriptors until a quarter of the entries are free",
                self.files.direct_open()
            );
            self.files.direct_ran_out();
        }
        if rearm {
            let mut v = 0u64;
            // SAFETY: reads 8 bytes into a local from the non-blocking eventfd.
            unsafe { libc::read(self.doorbell_fd, (&mut v as *mut u64).cast(), 8) };
            self.doorbell_armed = false;
            self.arm_doorbell()?;
        }
        Ok(n)
    }
}
