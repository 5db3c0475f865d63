//! One io_uring instance, owned by one loop thread.
//!
//! [`Ring`] is the only place that puts entries on a submission queue ([`Ring::push`]). Ring
//! pressure is handled here, not by callers: a full submission queue is submitted and the
//! push retried; `EBUSY`/`EAGAIN` from the kernel moves ready completions into a small stash
//! (sized once, at creation) and retries; an overflowed completion queue is flushed with an
//! `io_uring_enter(GETEVENTS)` while reaping. Nothing here allocates after [`Ring::new`].
//!
//! `user_data` values at or above [`USER_DATA_RESERVED_MIN`] are reserved: the ring uses
//! [`USER_DATA_PARK_TIMEOUT`] and [`USER_DATA_PARK_TIMEOUT_REMOVE`] itself (their
//! completions are swallowed by [`Ring::reap`]); [`USER_DATA_DOORBELL`] is for the loop's
//! own doorbell read and is delivered like any other completion.

use std::cell::Cell;
use std::io;
use std::marker::PhantomData;
use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

use io_uring::{opcode, squeue, types, EnterFlags, IoUring, Probe};
use nix::libc;
use nix::sys::resource::{getrlimit, Resource};

/// `user_data` of the timeout entry used to bound a park when `FEAT_EXT_ARG` is missing.
/// Internal: never passed to the [`Ring::reap`] callback.
pub const USER_DATA_PARK_TIMEOUT: u64 = u64::MAX;
/// `user_data` the loop gives its doorbell read / poll. Delivered to the reap callback.
pub const USER_DATA_DOORBELL: u64 = u64::MAX - 1;
/// `user_data` of the entry that cancels a stale park timeout. Internal, swallowed by reap.
pub const USER_DATA_PARK_TIMEOUT_REMOVE: u64 = u64::MAX - 2;
/// Every `user_data` at or above this value is reserved for internal operations; the loop's
/// slab handles must stay below it.
pub const USER_DATA_RESERVED_MIN: u64 = u64::MAX - 15;

/// How many times [`Ring::push`] submits to make room before it gives up. Each submission
/// normally frees the whole queue, so a second failure already means the kernel is not
/// consuming entries.
const PUSH_ATTEMPTS: usize = 4;

/// What the kernel's io_uring offers, probed once per ring.
///
/// Opcode fields are true when `IORING_REGISTER_PROBE` says the opcode is supported (false
/// for all when the probe itself is unsupported, i.e. before Linux 5.6).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Capabilities {
    /// `IORING_OP_NOP`.
    pub nop: bool,
    /// `IORING_OP_ACCEPT`.
    pub accept: bool,
    /// `IORING_OP_CONNECT`.
    pub connect: bool,
    /// `IORING_OP_RECV`.
    pub recv: bool,
    /// `IORING_OP_SEND`.
    pub send: bool,
    /// `IORING_OP_SENDMSG`.
    pub send_msg: bool,
    /// `IORING_OP_RECVMSG`.
    pub recv_msg: bool,
    /// `IORING_OP_READV`.
    pub readv: bool,
    /// `IORING_OP_WRITEV`.
    pub writev: bool,
    /// `IORING_OP_READ` (a doorbell eventfd read).
    pub read: bool,
    /// `IORING_OP_POLL_ADD`.
    pub poll_add: bool,
    /// `IORING_OP_ASYNC_CANCEL`.
    pub async_cancel: bool,
    /// `IORING_OP_TIMEOUT`.
    pub timeout: bool,
    /// `IORING_OP_LINK_TIMEOUT`.
    pub link_timeout: bool,
    /// `IORING_OP_MSG_RING` (ring-to-ring doorbell, Linux 5.18).
    pub msg_ring_data: bool,
    /// `IORING_FEAT_NODROP`: overflowed completions are kept, not dropped.
    pub feat_nodrop: bool,
    /// `IORING_FEAT_FAST_POLL`: socket ops poll internally instead of using a worker thread.
    pub feat_fast_poll: bool,
    /// `IORING_FEAT_SUBMIT_STABLE`: entry data is consumed at submission.
    pub feat_submit_stable: bool,
    /// `IORING_FEAT_EXT_ARG`: `io_uring_enter` takes a timeout (park without a timer entry).
    pub feat_ext_arg: bool,
    /// Submission queue size the kernel granted.
    pub sq_entries: u32,
    /// Completion queue size the kernel granted.
    pub cq_entries: u32,
}

type Check = fn(&Capabilities) -> bool;

/// What the per-core loop cannot work without. `LinkTimeout`, `MsgRingData`, `Read` and the
/// other features are used when present.
const REQUIRED: [(&str, Check); 13] = [
    ("Nop", |c| c.nop),
    ("Accept", |c| c.accept),
    ("Connect", |c| c.connect),
    ("Recv", |c| c.recv),
    ("Send", |c| c.send),
    ("SendMsg", |c| c.send_msg),
    ("RecvMsg", |c| c.recv_msg),
    ("Readv", |c| c.readv),
    ("Writev", |c| c.writev),
    ("PollAdd", |c| c.poll_add),
    ("AsyncCancel", |c| c.async_cancel),
    ("Timeout", |c| c.timeout),
    ("FEAT_NODROP", |c| c.feat_nodrop),
];

impl Capabilities {
    /// Probes an existing ring.
    fn probe(ring: &IoUring) -> Capabilities {
        let mut probe = Probe::new();
        let probed = match ring.submitter().register_probe(&mut probe) {
            Ok(()) => true,
            Err(err) => {
                log::warn!("io_uring opcode probe failed ({err}); treating all opcodes as missing");
                false
            }
        };
        let op = |code: u8| probed && probe.is_supported(code);
        let params = ring.params();
        Capabilities {
            nop: op(opcode::Nop::CODE),
            accept: op(opcode::Accept::CODE),
            connect: op(opcode::Connect::CODE),
            recv: op(opcode::Recv::CODE),
            send: op(opcode::Send::CODE),
            send_msg: op(opcode::SendMsg::CODE),
            recv_msg: op(opcode::RecvMsg::CODE),
            readv: op(opcode::Readv::CODE),
            writev: op(opcode::Writev::CODE),
            read: op(opcode::Read::CODE),
            poll_add: op(opcode::PollAdd::CODE),
            async_cancel: op(opcode::AsyncCancel::CODE),
            timeout: op(opcode::Timeout::CODE),
            link_timeout: op(opcode::LinkTimeout::CODE),
            msg_ring_data: op(opcode::MsgRingData::CODE),
            feat_nodrop: params.is_feature_nodrop(),
            feat_fast_poll: params.is_feature_fast_poll(),
            feat_submit_stable: params.is_feature_submit_stable(),
            feat_ext_arg: params.is_feature_ext_arg(),
            sq_entries: params.sq_entries(),
            cq_entries: params.cq_entries(),
        }
    }

    /// Names of the required opcodes/features this kernel lacks; empty when the io_uring
    /// backend can run.
    pub fn missing_required(&self) -> impl Iterator<Item = &'static str> + '_ {
        REQUIRED
            .iter()
            .filter(move |(_, has)| !has(self))
            .map(|(name, _)| *name)
    }
}

/// A completion copied out of the completion queue ahead of [`Ring::reap`] (EBUSY path).
#[derive(Clone, Copy, Debug)]
struct Stashed {
    user_data: u64,
    result: i32,
    flags: u32,
}

/// An io_uring instance owned by one loop thread (`Send`, not `Sync`).
///
/// Create it on the loop thread after pinning, so the kernel allocates its rings on the
/// right NUMA node.
///
/// Dropping a `Ring` closes the ring fd; the kernel then cancels in-flight requests
/// asynchronously. The loop must cancel and reap every request that points at its buffers
/// before it frees them (see [`Ring::push`]).
pub struct Ring {
    ring: IoUring,
    caps: Capabilities,
    /// Park with `submit_with_args` (false: park with a timeout entry). Starts as
    /// `caps.feat_ext_arg`; tests clear it to exercise the fallback.
    use_ext_arg: bool,
    /// Completions taken out of the CQ on EBUSY, delivered first by `reap`. Capacity fixed
    /// at `cq_entries`; never grows.
    stash: Vec<Stashed>,
    /// Timespec read by the fallback park timeout entry; boxed so its address does not move
    /// with the `Ring`.
    park_ts: Box<types::Timespec>,
    /// Park timeout entries submitted whose completion has not been reaped.
    park_timers_live: u32,
    /// Kernel's dropped-completion counter as last seen, to log each new drop once.
    dropped_seen: u32,
    _not_sync: PhantomData<Cell<()>>,
}

impl std::fmt::Debug for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring")
            .field("fd", &self.ring.as_raw_fd())
            .field("caps", &self.caps)
            .field("stashed", &self.stash.len())
            .finish()
    }
}

impl Ring {
    /// Creates a ring with `entries` submission slots (the kernel rounds up to a power of two
    /// and gives twice as many completion slots) and probes its [`Capabilities`].
    ///
    /// Errors are those of `io_uring_setup`, with the raw errno kept: ENOSYS (not built in),
    /// EPERM (seccomp or the `kernel.io_uring_disabled` sysctl), EINVAL (bad size or old
    /// kernel), EMFILE. ENOMEM (before Linux 5.12 ring memory counted against
    /// `RLIMIT_MEMLOCK`) is reported with the limits and the entries asked; its kind stays
    /// `OutOfMemory`.
    pub fn new(entries: u32) -> io::Result<Ring> {
        let mut ring = IoUring::new(entries).map_err(|err| setup_error(err, entries))?;
        let caps = Capabilities::probe(&ring);
        let dropped_seen = ring.completion().overflow();
        Ok(Ring {
            ring,
            caps,
            use_ext_arg: caps.feat_ext_arg,
            stash: Vec::with_capacity(caps.cq_entries as usize),
            park_ts: Box::new(types::Timespec::new()),
            park_timers_live: 0,
            dropped_seen,
            _not_sync: PhantomData,
        })
    }

    /// What the kernel offers.
    pub fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    #[cfg(test)]
    pub(crate) fn capabilities_mut_for_test(&mut self) -> &mut Capabilities {
        &mut self.caps
    }

    /// Queues one entry. The only submission site of the crate.
    ///
    /// A full submission queue is submitted and the push retried. `Err` only for a real
    /// failure, or for pressure the ring cannot absorb: `raw_os_error() == Some(EBUSY)` or
    /// `Some(EAGAIN)` means "reap completions, then push again" (the entry was *not* queued).
    ///
    /// # Safety
    ///
    /// Every buffer, iovec array, msghdr, sockaddr, timespec or other memory the entry points
    /// at must stay valid (and not be moved, and for reads not be otherwise accessed) until
    /// the entry's completion has been delivered by [`Ring::reap`], also when the request is
    /// abandoned or cancelled. Any fd it names must stay open until then. Its `user_data`
    /// must be below [`USER_DATA_RESERVED_MIN`] unless it is [`USER_DATA_DOORBELL`].
    pub unsafe fn push(&mut self, entry: &squeue::Entry) -> io::Result<()> {
        for _ in 0..PUSH_ATTEMPTS {
            // SAFETY: the memory `entry` references stays valid until its completion is
            // reaped; that is this function's own contract, passed on to the caller.
            let pushed = unsafe { self.ring.submission().push(entry) };
            if pushed.is_ok() {
                return Ok(());
            }
            self.submit()?;
        }
        Err(io::Error::new(
            io::ErrorKind::WouldBlock,
            "io_uring submission queue stays full after submitting",
        ))
    }

    /// Submits queued entries without waiting; returns how many the kernel took.
    ///
    /// Retries on EINTR. On EBUSY/EAGAIN, moves ready completions into the stash and
    /// retries; returns that error only when nothing could be moved (the caller must reap).
    pub fn submit(&mut self) -> io::Result<usize> {
        loop {
            match self.ring.submit() {
                Ok(n) => return Ok(n),
                Err(err) => match err.raw_os_error() {
                    Some(libc::EINTR) => continue,
                    Some(libc::EBUSY) | Some(libc::EAGAIN) => {
                        if self.stash_completions() == 0 {
                            return Err(err);
                        }
                    }
                    Some(libc::EBADR) => return Err(self.dropped_error()),
                    _ => return Err(err),
                },
            }
        }
    }

    /// Submits queued entries and parks until at least `want` completions are ready, or
    /// `timeout` passes (`None`: no limit). Returns how many entries were submitted.
    ///
    /// Returns early, with `Ok`, on a timeout (ETIME), a signal (EINTR), or when completions
    /// are already stashed; the caller reaps and decides again. `want == 0` only submits.
    /// `Err` with EBUSY/EAGAIN only when the stash is full: reap, then call again (queued
    /// entries stay queued).
    ///
    /// With `FEAT_EXT_ARG` (Linux 5.11) the timeout is passed to `io_uring_enter` and is
    /// exact. Without it, a timeout entry (`USER_DATA_PARK_TIMEOUT`) is queued and the call
    /// returns at the first completion or the timer, whichever comes first, whatever `want`.
    pub fn submit_and_wait(&mut self, want: usize, timeout: Option<Duration>) -> io::Result<usize> {
        if want == 0 || !self.stash.is_empty() {
            return self.submit();
        }
        match timeout {
            None => self.enter_wait(want, false),
            Some(limit) if self.use_ext_arg => {
                *self.park_ts = timespec(limit);
                self.enter_wait(want, true)
            }
            Some(limit) => {
                self.arm_park_timer(limit)?;
                self.enter_wait(1, false)
            }
        }
    }

    /// One `io_uring_enter` with GETEVENTS; `with_timeout` passes `park_ts` as EXT_ARG.
    fn enter_wait(&mut self, want: usize, with_timeout: bool) -> io::Result<usize> {
        let res = if with_timeout {
            let args = types::SubmitArgs::new().timespec(&self.park_ts);
            self.ring.submitter().submit_with_args(want, &args)
        } else {
            self.ring.submitter().submit_and_wait(want)
        };
        match res {
            Ok(n) => Ok(n),
            Err(err) => match err.raw_os_error() {
                // Timed out or interrupted: a wakeup like any other; the loop re-checks.
                Some(libc::ETIME) | Some(libc::EINTR) => Ok(0),
                Some(libc::EBUSY) | Some(libc::EAGAIN) => {
                    if self.stash_completions() > 0 {
                        Ok(0)
                    } else {
                        Err(err)
                    }
                }
                Some(libc::EBADR) => Err(self.dropped_error()),
                _ => Err(err),
            },
        }
    }

    /// Queues a timeout entry that bounds the next park (no `FEAT_EXT_ARG`), removing the
    /// previous one if it may still be pending so timers do not pile up.
    fn arm_park_timer(&mut self, limit: Duration) -> io::Result<()> {
        if self.park_timers_live > 0 {
            let remove = opcode::TimeoutRemove::new(USER_DATA_PARK_TIMEOUT)
                .build()
                .user_data(USER_DATA_PARK_TIMEOUT_REMOVE);
            // SAFETY: TimeoutRemove references no memory; it names the timer by user_data.
            unsafe { self.push(&remove)? };
        }
        *self.park_ts = timespec(limit);
        let timer = opcode::Timeout::new(&*self.park_ts as *const types::Timespec)
            .build()
            .user_data(USER_DATA_PARK_TIMEOUT);
        // SAFETY: the timespec is boxed and owned by `self`, so it stays at this address for
        // as long as the ring exists (the kernel copies it at submission anyway).
        unsafe { self.push(&timer)? };
        self.park_timers_live += 1;
        Ok(())
    }

    /// Delivers every ready completion to `f(user_data, result, flags)`: the stashed ones
    /// first, then the completion queue, flushing the kernel's overflow list
    /// (`IORING_SQ_CQ_OVERFLOW`) as many times as needed. Returns how many were delivered.
    ///
    /// Internal completions (park timers) are not delivered. Does not allocate. `f` cannot
    /// touch the ring; record follow-up work and push it after `reap` returns.
    pub fn reap(&mut self, mut f: impl FnMut(u64, i32, u32)) -> usize {
        let mut delivered = 0;
        let park_timers_live = &mut self.park_timers_live;
        let mut deliver = |user_data: u64, result: i32, flags: u32| match user_data {
            USER_DATA_PARK_TIMEOUT => *park_timers_live = park_timers_live.saturating_sub(1),
            USER_DATA_PARK_TIMEOUT_REMOVE => {}
            _ => {
                delivered += 1;
                f(user_data, result, flags);
            }
        };
        for c in self.stash.drain(..) {
            deliver(c.user_data, c.result, c.flags);
        }
        loop {
            for cqe in self.ring.completion() {
                deliver(cqe.user_data(), cqe.result(), cqe.flags());
            }
            if !self.ring.submission().cq_overflow() {
                break;
            }
            // The kernel holds completions that did not fit; an enter with GETEVENTS moves
            // them into the (now drained) completion queue. Nothing is submitted here.
            // SAFETY: no argument pointer is passed (None), so there is nothing to keep valid.
            let flushed = unsafe {
                self.ring.submitter().enter::<libc::sigset_t>(
                    0,
                    0,
                    EnterFlags::GETEVENTS.bits(),
                    None,
                )
            };
            match flushed {
                Ok(_) => {}
                Err(err) if err.raw_os_error() == Some(libc::EINTR) => {}
                Err(err) => {
                    log::error!("io_uring: flushing overflowed completions failed: {err}");
                    break;
                }
            }
        }
        self.note_dropped();
        delivered
    }

    /// Whether [`reap`](Self::reap) would deliver something now (for spin-then-park).
    pub fn has_completions(&mut self) -> bool {
        !self.stash.is_empty()
            || !self.ring.completion().is_empty()
            || self.ring.submission().cq_overflow()
    }

    /// Entries queued but not yet submitted.
    pub fn pending_submissions(&mut self) -> usize {
        self.ring.submission().len()
    }

    /// Completions the kernel reports as dropped (CQ overflow without room to keep them)
    /// since this ring was created. Non-zero means some request will never complete: fatal
    /// for the loop that owns the ring.
    pub fn dropped_completions(&mut self) -> u32 {
        self.ring.completion().overflow()
    }

    /// Registers fixed buffers (`IORING_REGISTER_BUFFERS`).
    ///
    /// ENOMEM usually means the pinned memory exceeds `RLIMIT_MEMLOCK`; the error then says
    /// how many bytes were asked and the current soft/hard limits.
    ///
    /// # Safety
    ///
    /// Each iovec must describe memory that stays valid and allocated until
    /// [`unregister_buffers`](Self::unregister_buffers) returns or the ring is dropped, and
    /// must not be freed while any fixed-buffer request using it is in flight.
    pub unsafe fn register_buffers(&mut self, bufs: &[libc::iovec]) -> io::Result<()> {
        // SAFETY: the caller keeps every iovec's memory valid until unregistered (this
        // function's contract).
        let res = unsafe { self.ring.submitter().register_buffers(bufs) };
        res.map_err(|err| register_error(err, bufs))
    }

    /// Unregisters all fixed buffers.
    pub fn unregister_buffers(&mut self) -> io::Result<()> {
        self.ring.submitter().unregister_buffers()
    }

    /// Moves ready completions into the stash, up to its fixed capacity. Returns how many.
    fn stash_completions(&mut self) -> usize {
        let room = self.stash.capacity() - self.stash.len();
        let mut moved = 0;
        let mut cq = self.ring.completion();
        while moved < room {
            let Some(cqe) = cq.next() else { break };
            self.stash.push(Stashed {
                user_data: cqe.user_data(),
                result: cqe.result(),
                flags: cqe.flags(),
            });
            moved += 1;
        }
        moved
    }

    fn note_dropped(&mut self) {
        let dropped = self.ring.completion().overflow();
        if dropped != self.dropped_seen {
            log::error!(
                "io_uring dropped {} completions (total {dropped}): requests will never complete",
                dropped.wrapping_sub(self.dropped_seen)
            );
            self.dropped_seen = dropped;
        }
    }

    fn dropped_error(&mut self) -> io::Error {
        self.note_dropped();
        io::Error::other(format!(
            "io_uring dropped completions (EBADR, {} so far): the completion queue overflowed",
            self.dropped_seen
        ))
    }
}

impl AsRawFd for Ring {
    /// The ring fd, e.g. as the target of another ring's `MsgRingData`.
    fn as_raw_fd(&self) -> RawFd {
        self.ring.as_raw_fd()
    }
}

fn timespec(d: Duration) -> types::Timespec {
    types::Timespec::new()
        .sec(d.as_secs())
        .nsec(d.subsec_nanos())
}

fn format_limit(v: libc::rlim_t) -> String {
    if v == libc::RLIM_INFINITY {
        "unlimited".to_owned()
    } else {
        format!("{v} bytes")
    }
}

/// `RLIMIT_MEMLOCK soft=... hard=...`, for ENOMEM messages.
fn memlock_limits() -> String {
    match getrlimit(Resource::RLIMIT_MEMLOCK) {
        Ok((soft, hard)) => format!(
            "RLIMIT_MEMLOCK soft={} hard={}",
            format_limit(soft),
            format_limit(hard)
        ),
        Err(e) => format!("RLIMIT_MEMLOCK unknown ({e})"),
    }
}

/// Keeps every setup error as it is (callers match on the raw errno) except ENOMEM, which
/// gets the numbers an operator needs.
fn setup_error(err: io::Error, entries: u32) -> io::Error {
    if err.raw_os_error() != Some(libc::ENOMEM) {
        return err;
    }
    io::Error::new(
        err.kind(),
        format!(
            "io_uring_setup({entries} entries): out of memory (ENOMEM); {}; raise the limit \
             (ulimit -l, systemd LimitMEMLOCK=) or grant CAP_IPC_LOCK, or use fewer entries",
            memlock_limits()
        ),
    )
}

/// Adds what was asked, and for ENOMEM the memlock limits, to a register_buffers error.
fn register_error(err: io::Error, bufs: &[libc::iovec]) -> io::Error {
    let bytes: u64 = bufs.iter().map(|b| b.iov_len as u64).sum();
    let count = bufs.len();
    let msg = if matches!(err.raw_os_error(), Some(libc::ENOMEM) | Some(libc::EPERM)) {
        let name = if err.raw_os_error() == Some(libc::EPERM) {
            "EPERM"
        } else {
            "ENOMEM"
        };
        format!(
            "io_uring register_buffers: cannot pin {count} buffers totalling {bytes} bytes \
             ({name}); {}; raise the limit (ulimit -l, systemd LimitMEMLOCK=) or grant \
             CAP_IPC_LOCK, or register fewer bytes",
            memlock_limits()
        )
    } else {
        format!("io_uring register_buffers ({count} buffers, {bytes} bytes): {err}")
    };
    io::Error::new(err.kind(), msg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::doorbell::Doorbell;
    use std::io::Write;
    use std::os::unix::net::UnixStream;
    use std::time::Instant;

    fn nop(user_data: u64) -> squeue::Entry {
        opcode::Nop::new().build().user_data(user_data)
    }

    fn reap_all(ring: &mut Ring, want: usize) -> Vec<(u64, i32)> {
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(5);
        while got.len() < want && Instant::now() < deadline {
            ring.submit_and_wait(1, Some(Duration::from_millis(100)))
                .unwrap();
            ring.reap(|ud, res, _| got.push((ud, res)));
        }
        got
    }

    #[test]
    fn ring_is_send() {
        fn check<T: Send>() {}
        check::<Ring>();
    }

    #[test]
    fn probe_finds_what_the_loop_needs() {
        let ring = Ring::new(8).unwrap();
        let caps = ring.capabilities();
        assert!(
            caps.nop && caps.recv && caps.send && caps.poll_add,
            "{caps:?}"
        );
        assert_eq!(caps.missing_required().count(), 0, "{caps:?}");
        assert!(caps.sq_entries >= 8 && caps.cq_entries >= caps.sq_entries);
    }

    #[test]
    fn nop_round_trips_user_data() {
        let mut ring = Ring::new(8).unwrap();
        // SAFETY: Nop references no memory.
        unsafe { ring.push(&nop(42)).unwrap() };
        assert_eq!(ring.pending_submissions(), 1);
        ring.submit_and_wait(1, None).unwrap();
        let mut got = Vec::new();
        assert_eq!(ring.reap(|ud, res, flags| got.push((ud, res, flags))), 1);
        assert_eq!(got, vec![(42, 0, 0)]);
        assert!(!ring.has_completions());
    }

    #[test]
    fn push_more_than_the_submission_queue_holds() {
        let mut ring = Ring::new(4).unwrap();
        assert_eq!(ring.capabilities().sq_entries, 4);
        let mut seen = Vec::new();
        for i in 0..64 {
            // SAFETY: Nop references no memory.
            unsafe { ring.push(&nop(i)).unwrap() };
            // Reap as we go so this test is about the full submission queue, not the CQ.
            ring.reap(|ud, _, _| seen.push(ud));
        }
        ring.submit().unwrap();
        seen.extend(
            reap_all(&mut ring, 64 - seen.len())
                .into_iter()
                .map(|(ud, _)| ud),
        );
        seen.sort_unstable();
        assert_eq!(seen, (0..64).collect::<Vec<u64>>());
        assert_eq!(ring.pending_submissions(), 0);
    }

    #[test]
    fn completion_overflow_is_flushed_and_nothing_is_lost() {
        let mut ring = Ring::new(4).unwrap();
        let cq = ring.capabilities().cq_entries as u64;
        let total = 64u64;
        assert!(total > cq * 4);
        for i in 0..total {
            // SAFETY: Nop references no memory.
            unsafe { ring.push(&nop(i)).unwrap() };
        }
        ring.submit().unwrap();
        // 64 inline NOP completions cannot fit in the CQ: the kernel (NODROP) keeps the rest
        // on its overflow list and raises IORING_SQ_CQ_OVERFLOW.
        assert!(ring.ring.submission().cq_overflow());
        let mut seen = vec![false; total as usize];
        let mut count = 0u64;
        let deadline = Instant::now() + Duration::from_secs(5);
        while count < total && Instant::now() < deadline {
            count += ring.reap(|ud, res, _| {
                assert_eq!(res, 0);
                assert!(!seen[ud as usize], "user_data {ud} delivered twice");
                seen[ud as usize] = true;
            }) as u64;
            if count < total {
                ring.submit_and_wait(1, Some(Duration::from_millis(50)))
                    .unwrap();
            }
        }
        assert_eq!(count, total);
        assert_eq!(ring.dropped_completions(), 0);
        assert!(!ring.has_completions());
    }

    #[test]
    fn stashed_completions_are_delivered_first() {
        // The EBUSY path cannot be provoked on a modern kernel; exercise its mechanics.
        let mut ring = Ring::new(4).unwrap();
        for i in 0..3 {
            // SAFETY: Nop references no memory.
            unsafe { ring.push(&nop(i)).unwrap() };
        }
        ring.submit_and_wait(3, None).unwrap();
        assert_eq!(ring.stash_completions(), 3);
        assert!(ring.has_completions());
        // With something stashed, a park must not block.
        let t = Instant::now();
        ring.submit_and_wait(1, None).unwrap();
        assert!(t.elapsed() < Duration::from_secs(1));
        // SAFETY: Nop references no memory.
        unsafe { ring.push(&nop(3)).unwrap() };
        ring.submit().unwrap();
        let got = reap_all(&mut ring, 4);
        let order: Vec<u64> = got.iter().map(|&(ud, _)| ud).collect();
        assert_eq!(order, vec![0, 1, 2, 3]);
    }

    #[test]
    fn park_with_timeout_and_no_work_returns_after_timeout() {
        let mut ring = Ring::new(8).unwrap();
        for ext_arg in [true, false] {
            ring.use_ext_arg = ext_arg && ring.caps.feat_ext_arg;
            let t = Instant::now();
            ring.submit_and_wait(1, Some(Duration::from_millis(50)))
                .unwrap();
            let took = t.elapsed();
            assert!(took >= Duration::from_millis(45), "{ext_arg}: {took:?}");
            assert!(took < Duration::from_secs(2), "{ext_arg}: {took:?}");
            assert_eq!(
                ring.reap(|ud, _, _| panic!("unexpected completion {ud}")),
                0
            );
        }
        // Fallback timers do not pile up: park again, then a NOP arrives first.
        ring.use_ext_arg = false;
        // SAFETY: Nop references no memory.
        unsafe { ring.push(&nop(7)).unwrap() };
        ring.submit_and_wait(1, Some(Duration::from_secs(10)))
            .unwrap();
        let mut got = Vec::new();
        ring.reap(|ud, _, _| got.push(ud));
        assert_eq!(got, vec![7]);
        assert_eq!(ring.park_timers_live, 1, "the 10 s timer is still armed");
        // Parking again removes the stale 10 s timer (its ECANCELED completion and the
        // remove's own are swallowed) and arms a 20 ms one.
        ring.submit_and_wait(1, Some(Duration::from_millis(20)))
            .unwrap();
        assert_eq!(
            ring.reap(|ud, _, _| panic!("unexpected completion {ud}")),
            0
        );
        assert!(ring.park_timers_live <= 2);
        // Only the 20 ms timer is left: an unbounded park ends when it fires, and then no
        // timer is live (had the 10 s one survived, one would still be counted).
        let t = Instant::now();
        while ring.park_timers_live > 0 && t.elapsed() < Duration::from_secs(2) {
            ring.submit_and_wait(1, None).unwrap();
            assert_eq!(
                ring.reap(|ud, _, _| panic!("unexpected completion {ud}")),
                0
            );
        }
        assert_eq!(ring.park_timers_live, 0);
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    }

    #[test]
    fn recv_on_a_unix_stream_pair_completes_with_the_bytes() {
        let (mut a, b) = UnixStream::pair().unwrap();
        let mut ring = Ring::new(8).unwrap();
        let mut buf = vec![0u8; 64];
        let entry = opcode::Recv::new(types::Fd(b.as_raw_fd()), buf.as_mut_ptr(), buf.len() as u32)
            .build()
            .user_data(5);
        // SAFETY: `buf` and `b` outlive the completion, which is reaped below before either
        // is dropped.
        unsafe { ring.push(&entry).unwrap() };
        ring.submit().unwrap();
        a.write_all(b"tensor bytes").unwrap();
        let got = reap_all(&mut ring, 1);
        assert_eq!(got, vec![(5, 12)]);
        assert_eq!(&buf[..12], b"tensor bytes");
    }

    #[test]
    fn doorbell_wakes_a_poll_and_a_read() {
        let bell = std::sync::Arc::new(Doorbell::new().unwrap());
        let mut ring = Ring::new(8).unwrap();
        let poll = opcode::PollAdd::new(types::Fd(bell.as_raw_fd()), libc::POLLIN as u32)
            .build()
            .user_data(USER_DATA_DOORBELL);
        // SAFETY: PollAdd references no memory; the eventfd outlives the completion.
        unsafe { ring.push(&poll).unwrap() };
        ring.submit().unwrap();
        let producer = {
            let bell = bell.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                bell.ring();
            })
        };
        let got = reap_all(&mut ring, 1);
        producer.join().unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].0, USER_DATA_DOORBELL);
        assert!(got[0].1 & libc::POLLIN as i32 != 0);
        assert_eq!(bell.drain(), 1);

        // The same through a Read of the counter into a buffer owned by the test.
        let mut counter = Box::new([0u8; 8]);
        let read = opcode::Read::new(types::Fd(bell.as_raw_fd()), counter.as_mut_ptr(), 8)
            .build()
            .user_data(USER_DATA_DOORBELL);
        // SAFETY: `counter` is boxed and outlives the completion, reaped below.
        unsafe { ring.push(&read).unwrap() };
        ring.submit().unwrap();
        let producer = {
            let bell = bell.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                bell.ring();
            })
        };
        let got = reap_all(&mut ring, 1);
        producer.join().unwrap();
        assert_eq!(got, vec![(USER_DATA_DOORBELL, 8)]);
        assert_eq!(u64::from_ne_bytes(*counter), 1);
    }

    #[test]
    fn read_fixed_receives_from_a_stream_socket_into_a_registered_buffer() {
        let (mut a, b) = UnixStream::pair().unwrap();
        let mut ring = Ring::new(8).unwrap();
        let mut buf = vec![0u8; 4096];
        let iov = [libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        }];
        // SAFETY: `buf` outlives the registration, which ends when `ring` is dropped first.
        if let Err(err) = unsafe { ring.register_buffers(&iov) } {
            // Only a memlock limit too low for one page may refuse it.
            assert!(err.to_string().contains("RLIMIT_MEMLOCK"), "{err}");
            return;
        }
        let at = buf[100..].as_mut_ptr();
        let read = opcode::ReadFixed::new(types::Fd(b.as_raw_fd()), at, 64, 0)
            .build()
            .user_data(9);
        // SAFETY: `buf[100..164]` is registered buffer 0, and it and `b` outlive the
        // completion, reaped below.
        unsafe { ring.push(&read).unwrap() };
        ring.submit().unwrap();
        a.write_all(b"fixed bytes").unwrap();
        assert_eq!(reap_all(&mut ring, 1), vec![(9, 11)]);
        // A range outside the registered buffer is refused by the kernel, not written.
        let mut other = vec![0u8; 64];
        let read = opcode::ReadFixed::new(types::Fd(b.as_raw_fd()), other.as_mut_ptr(), 64, 0)
            .build()
            .user_data(10);
        // SAFETY: the kernel rejects the range before touching memory; `other` outlives
        // the completion anyway.
        unsafe { ring.push(&read).unwrap() };
        ring.submit().unwrap();
        a.write_all(b"more").unwrap();
        assert_eq!(reap_all(&mut ring, 1), vec![(10, -libc::EFAULT)]);
        drop(ring);
        assert_eq!(&buf[100..111], b"fixed bytes");
        assert!(other.iter().all(|&x| x == 0));
    }

    #[test]
    fn register_buffers_small_works_and_errors_carry_numbers() {
        let mut ring = Ring::new(8).unwrap();
        let mut buf = vec![0u8; 4096];
        let iov = [libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        }];
        // SAFETY: `buf` outlives the registration, undone below.
        match unsafe { ring.register_buffers(&iov) } {
            Ok(()) => ring.unregister_buffers().unwrap(),
            // A tiny memlock limit without CAP_IPC_LOCK: the message must say so.
            Err(err) => assert!(err.to_string().contains("RLIMIT_MEMLOCK"), "{err}"),
        }
        let err = register_error(io::Error::from_raw_os_error(libc::ENOMEM), &iov);
        let msg = err.to_string();
        assert_eq!(err.kind(), io::ErrorKind::OutOfMemory);
        assert!(
            msg.contains("4096 bytes") && msg.contains("RLIMIT_MEMLOCK soft="),
            "{msg}"
        );
        let err = setup_error(io::Error::from_raw_os_error(libc::ENOMEM), 256);
        assert_eq!(err.kind(), io::ErrorKind::OutOfMemory);
        assert!(err.to_string().contains("256 entries"), "{err}");
        let err = setup_error(io::Error::from_raw_os_error(libc::EPERM), 256);
        assert_eq!(err.raw_os_error(), Some(libc::EPERM));
        drop(buf);
    }
}
