//! One io_uring instance, owned by one loop thread, and what the kernel's io_uring offers.
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

use super::ring_fd;
use crate::sys::ops::USER_DATA_DOORBELL;

/// Environment variable that turns the io_uring setup flags off (`false`/`0`); the
/// configuration reads it (named here for error messages).
pub const URING_FLAGS_ENV: &str = "STARWIRE_URING_FLAGS";

/// `user_data` of the timeout entry used to bound a park when `FEAT_EXT_ARG` is missing.
/// Internal: never passed to the [`Ring::reap`] callback.
pub const USER_DATA_PARK_TIMEOUT: u64 = u64::MAX;
/// `user_data` of the entry that cancels a stale park timeout. Internal, swallowed by reap.
pub const USER_DATA_PARK_TIMEOUT_REMOVE: u64 = u64::MAX - 2;
/// Every `user_data` at or above this value is reserved for internal operations; the loop's
/// slab handles must stay below it.
pub const USER_DATA_RESERVED_MIN: u64 = u64::MAX - 15;

// The doorbell's `user_data` (delivered to the reap callback) is one of the reserved values.
const _: () = assert!(USER_DATA_DOORBELL >= USER_DATA_RESERVED_MIN);

/// How many times [`Ring::push`] submits to make room before it gives up. Each submission
/// normally frees the whole queue, so a second failure already means the kernel is not
/// consuming entries.
const PUSH_ATTEMPTS: usize = 4;

/// The running kernel's major and minor version (`uname -r`), if it can be read.
pub fn kernel_release() -> Option<(u32, u32)> {
    let u = nix::sys::utsname::uname().ok()?;
    let release = u.release().to_string_lossy();
    let mut parts = release
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u32>().ok());
    Some((parts.next()??, parts.next()??))
}

/// Whether the running kernel's version is at least `major.minor`; false when it cannot be
/// read.
pub fn kernel_at_least(major: u32, minor: u32) -> bool {
    kernel_release().is_some_and(|v| v >= (major, minor))
}

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
    /// `IORING_FEAT_RECVSEND_BUNDLE`: one receive completion may fill several provided
    /// buffers (Linux 6.10).
    pub feat_recvsend_bundle: bool,
    /// Submission queue size the kernel granted.
    pub sq_entries: u32,
    /// IoCompletion queue size the kernel granted.
    pub cq_entries: u32,
    /// The ring was set up with `IORING_SETUP_SINGLE_ISSUER` (Linux 6.0): only its loop
    /// thread submits.
    pub single_issuer: bool,
    /// The ring was set up with `IORING_SETUP_DEFER_TASKRUN` (Linux 6.1): completions are
    /// posted only when the loop enters the kernel with GETEVENTS.
    pub defer_taskrun: bool,
    /// The ring was set up with `IORING_SETUP_COOP_TASKRUN` (Linux 5.19): no interrupt of
    /// the loop thread to post completions.
    pub coop_taskrun: bool,
    /// The ring was set up with `IORING_SETUP_TASKRUN_FLAG`: the kernel raises
    /// `IORING_SQ_TASKRUN` when completions wait for an enter.
    pub taskrun_flag: bool,
    /// The ring fd is registered (`IORING_REGISTER_RING_FDS`, Linux 5.18) by the thread that
    /// first enters the ring, at that enter: that thread's `io_uring_enter` names the ring
    /// by index and skips the fd lookup (unless the thread has 16 rings registered already;
    /// [`Ring::ring_fd_registered`] tells).
    pub registered_ring_fd: bool,
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

/// Which task-work setup flags [`Ring::with_flags`] tries.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SetupFlags {
    /// The best this kernel accepts, tried in order: `SINGLE_ISSUER` + `DEFER_TASKRUN` +
    /// `TASKRUN_FLAG`, then `COOP_TASKRUN` + `TASKRUN_FLAG`, then none.
    #[default]
    Auto,
    /// No setup flags (the ring as `io_uring_setup` makes it by default).
    Off,
}

/// One set of setup flags to try.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TaskRun {
    /// `SINGLE_ISSUER | DEFER_TASKRUN | TASKRUN_FLAG`, created disabled (`R_DISABLED`) and
    /// enabled by the first thread that enters it, which becomes its only issuer.
    Deferred,
    /// `COOP_TASKRUN | TASKRUN_FLAG`.
    Coop,
    /// No flags.
    Plain,
}

impl TaskRun {
    fn build(self, entries: u32) -> io::Result<IoUring> {
        let mut b = IoUring::builder();
        match self {
            TaskRun::Deferred => {
                b.setup_single_issuer()
                    .setup_defer_taskrun()
                    .setup_taskrun_flag()
                    .setup_r_disabled();
            }
            TaskRun::Coop => {
                b.setup_coop_taskrun().setup_taskrun_flag();
            }
            TaskRun::Plain => {}
        }
        b.build(entries)
    }
}

/// Creates the ring with the first flags in `flags`' order that the kernel accepts. Only
/// EINVAL (a flag this kernel does not know) moves on to the next; any other error is
/// returned as it is.
fn build_ring(entries: u32, flags: SetupFlags) -> io::Result<(IoUring, TaskRun)> {
    let order: &[TaskRun] = match flags {
        SetupFlags::Auto => &[TaskRun::Deferred, TaskRun::Coop, TaskRun::Plain],
        SetupFlags::Off => &[TaskRun::Plain],
    };
    let mut last = None;
    for &mode in order {
        match mode.build(entries) {
            Ok(ring) => return Ok((ring, mode)),
            Err(err) if err.raw_os_error() == Some(libc::EINVAL) && mode != TaskRun::Plain => {
                log::debug!("io_uring setup with {mode:?} flags refused ({err}); trying fewer");
                last = Some(err);
            }
            Err(err) => return Err(err),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::from_raw_os_error(libc::EINVAL)))
}

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
            feat_recvsend_bundle: params.is_feature_recvsend_bundle(),
            sq_entries: params.sq_entries(),
            cq_entries: params.cq_entries(),
            // Filled in by `Ring::with_flags`, which knows what it asked for.
            single_issuer: false,
            defer_taskrun: false,
            coop_taskrun: false,
            taskrun_flag: false,
            registered_ring_fd: false,
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
    /// False while a `SINGLE_ISSUER` ring created disabled waits for its first enter, which
    /// enables it and makes the entering thread its issuer.
    enabled: bool,
    /// `io_uring_enter` calls made on this ring.
    enters: u64,
    /// The ring's descriptor registered by the thread that first entered it (with
    /// [`SetupFlags::Auto`]), which then enters by index.
    ring_fd: Option<ring_fd::RingFd>,
    /// The registration is yet to be tried, at the first enter.
    ring_fd_wanted: bool,
    _not_sync: PhantomData<Cell<()>>,
}

impl Drop for Ring {
    fn drop(&mut self) {
        if let Some(r) = &self.ring_fd {
            if r.usable() {
                r.unregister(self.ring.as_raw_fd());
            } else {
                log::warn!(
                    "io_uring ring dropped on another thread than the one that first entered \
                     it: its descriptor stays registered, and the ring held, until that thread \
                     ends"
                );
            }
        }
    }
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
    ///
    /// The ring gets the best task-work setup flags the kernel accepts
    /// ([`SetupFlags::Auto`]); see [`with_flags`](Self::with_flags).
    pub fn new(entries: u32) -> io::Result<Ring> {
        Ring::with_flags(entries, SetupFlags::Auto)
    }

    /// As [`new`](Self::new), choosing the setup flags.
    ///
    /// With [`SetupFlags::Auto`] on Linux 6.1 or later the ring is `SINGLE_ISSUER` +
    /// `DEFER_TASKRUN`: the first thread that submits to it (or waits on it) becomes the only
    /// one that may; another thread's `io_uring_enter` then fails (`EEXIST`, reported with
    /// an explanation). Create it anywhere, but drive it from one thread.
    ///
    /// With `Auto` the ring's descriptor is also registered, at the first enter, in the
    /// table of the thread that makes it (Linux 5.18; see
    /// [`Capabilities::registered_ring_fd`]): that thread enters it by index, others by
    /// descriptor. Drop it on that thread too, or its registration (and the ring with it)
    /// lasts until that thread ends.
    pub fn with_flags(entries: u32, flags: SetupFlags) -> io::Result<Ring> {
        let (mut ring, mode) =
            build_ring(entries, flags).map_err(|err| setup_error(err, entries))?;
        let mut caps = Capabilities::probe(&ring);
        caps.single_issuer = mode == TaskRun::Deferred;
        caps.defer_taskrun = mode == TaskRun::Deferred;
        caps.coop_taskrun = mode == TaskRun::Coop;
        caps.taskrun_flag = mode != TaskRun::Plain;
        // Registered by the thread that first enters the ring (its issuer, on a
        // SINGLE_ISSUER ring), at that first enter; Linux 5.18, implied by the task-work
        // flags (5.19).
        caps.registered_ring_fd =
            flags == SetupFlags::Auto && (caps.defer_taskrun || caps.coop_taskrun);
        let dropped_seen = ring.completion().overflow();
        Ok(Ring {
            ring,
            caps,
            use_ext_arg: caps.feat_ext_arg,
            stash: Vec::with_capacity(caps.cq_entries as usize),
            park_ts: Box::new(types::Timespec::new()),
            park_timers_live: 0,
            dropped_seen,
            enabled: mode != TaskRun::Deferred,
            enters: 0,
            ring_fd: None,
            ring_fd_wanted: caps.registered_ring_fd,
            _not_sync: PhantomData,
        })
    }

    /// Whether the ring's descriptor is registered now (see
    /// [`Capabilities::registered_ring_fd`]).
    pub fn ring_fd_registered(&self) -> bool {
        self.ring_fd.is_some()
    }

    /// What the kernel offers.
    pub fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    /// Registers an empty table of `n` files (`IORING_REGISTER_FILES2` with the sparse
    /// flag, Linux 5.19): entries are filled by [`update_file`](Self::update_file).
    pub fn register_files_sparse(&mut self, n: u32) -> io::Result<()> {
        self.ring.submitter().register_files_sparse(n)
    }

    /// Unregisters the file table (which waits for operations on its files).
    #[cfg(test)]
    pub fn unregister_files(&mut self) -> io::Result<()> {
        self.ring.submitter().unregister_files()
    }

    /// Has the kernel put the files it allocates entries for (`IORING_FILE_INDEX_ALLOC`: a
    /// direct accept's sockets) at `off..off + len` of the table only
    /// (`IORING_REGISTER_FILE_ALLOC_RANGE`, Linux 6.0).
    pub fn file_alloc_range(&mut self, off: u32, len: u32) -> io::Result<()> {
        /// `struct io_uring_file_index_range`.
        #[repr(C)]
        struct Range {
            off: u32,
            len: u32,
            resv: u64,
        }
        /// `IORING_REGISTER_FILE_ALLOC_RANGE` (include/uapi/linux/io_uring.h).
        const REGISTER_FILE_ALLOC_RANGE: libc::c_uint = 25;
        let range = Range { off, len, resv: 0 };
        // SAFETY: io_uring_register on this ring with a pointer to one initialized
        // `io_uring_file_index_range` that lives across the call, and a count of 0.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_io_uring_register,
                self.ring.as_raw_fd(),
                REGISTER_FILE_ALLOC_RANGE,
                std::ptr::addr_of!(range),
                0,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Puts `fd` at `index` of the file table (-1 empties the entry: the kernel drops its
    /// reference to the file).
    pub fn update_file(&mut self, index: u32, fd: RawFd) -> io::Result<()> {
        self.ring
            .submitter()
            .register_files_update(index, &[fd])
            .map(drop)
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
    ///
    /// Also posts completions whose task work waits for an enter (`IORING_SQ_TASKRUN`, or
    /// always on a `DEFER_TASKRUN` ring), so it is the call to make when
    /// [`needs_enter`](Self::needs_enter) says so, even with nothing queued.
    pub fn submit(&mut self) -> io::Result<usize> {
        loop {
            match self.enter(0, false) {
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
        match self.enter(want, with_timeout) {
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
        let mut timers_done = 0u32;
        let mut deliver = |user_data: u64, result: i32, flags: u32| match user_data {
            USER_DATA_PARK_TIMEOUT => timers_done += 1,
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
            match self.enter_raw(0, 0, EnterFlags::GETEVENTS, false) {
                Ok(_) => {}
                Err(err) if err.raw_os_error() == Some(libc::EINTR) => {}
                Err(err) => {
                    log::error!("io_uring: flushing overflowed completions failed: {err}");
                    break;
                }
            }
        }
        self.park_timers_live = self.park_timers_live.saturating_sub(timers_done);
        self.note_dropped();
        delivered
    }

    /// The one caller of `io_uring_enter` besides [`reap`](Self::reap)'s overflow flush:
    /// submits every queued entry, waits for `want` completions (bounded by `park_ts` when
    /// `with_timeout`), and asks for GETEVENTS whenever the kernel may hold completions
    /// back: when waiting, on a `DEFER_TASKRUN` ring (whose completions are only posted
    /// by such an enter), on a flagged `IORING_SQ_TASKRUN`, or on a CQ overflow.
    fn enter(&mut self, want: usize, with_timeout: bool) -> io::Result<usize> {
        let to_submit = self.ring.submission().len() as u32;
        let mut flags = EnterFlags::empty();
        if want > 0 || self.caps.defer_taskrun || self.completions_held() {
            flags |= EnterFlags::GETEVENTS;
        }
        self.enter_raw(to_submit, want as u32, flags, with_timeout)
    }

    fn enter_raw(
        &mut self,
        to_submit: u32,
        want: u32,
        mut flags: EnterFlags,
        with_timeout: bool,
    ) -> io::Result<usize> {
        if !self.enabled {
            // A SINGLE_ISSUER ring created disabled: this thread becomes its issuer.
            self.ring.submitter().register_enable_rings()?;
            self.enabled = true;
        }
        if self.ring_fd_wanted {
            self.ring_fd_wanted = false;
            match ring_fd::RingFd::register(self.ring.as_raw_fd()) {
                Ok(r) => self.ring_fd = Some(r),
                Err(e) => {
                    log::debug!("io_uring ring descriptor not registered ({e}); entered by fd")
                }
            }
        }
        self.enters += 1;
        let res = if let Some(r) = self.ring_fd.as_ref().filter(|r| r.usable()) {
            if with_timeout {
                let args = types::SubmitArgs::new().timespec(&self.park_ts);
                r.enter(to_submit, want, flags | EnterFlags::EXT_ARG, Some(&args))
            } else {
                r.enter(to_submit, want, flags, None)
            }
        } else if with_timeout {
            flags |= EnterFlags::EXT_ARG;
            let args = types::SubmitArgs::new().timespec(&self.park_ts);
            // SAFETY: `args` (and the boxed timespec it points at) outlive the call; EXT_ARG
            // tells the kernel the argument is an `io_uring_getevents_arg` of this size.
            unsafe {
                self.ring
                    .submitter()
                    .enter(to_submit, want, flags.bits(), Some(&args))
            }
        } else {
            // SAFETY: no argument pointer is passed (None), so there is nothing to keep valid.
            unsafe {
                self.ring
                    .submitter()
                    .enter::<libc::sigset_t>(to_submit, want, flags.bits(), None)
            }
        };
        res.map_err(|err| {
            if err.raw_os_error() == Some(libc::EEXIST) && self.caps.single_issuer {
                io::Error::new(
                    err.kind(),
                    format!(
                        "io_uring_enter: {err}: this SINGLE_ISSUER ring belongs to the thread \
                         that first used it; drive a loop from one thread (or create rings \
                         without setup flags: {}=false)",
                        URING_FLAGS_ENV
                    ),
                )
            } else {
                err
            }
        })
    }

    /// Whether the kernel has completions that only an enter with GETEVENTS posts: an
    /// overflowed CQ, or task work flagged with `IORING_SQ_TASKRUN`. A load of the shared
    /// SQ flags, no syscall.
    pub fn completions_held(&mut self) -> bool {
        let sq = self.ring.submission();
        sq.cq_overflow() || (self.caps.taskrun_flag && sq.taskrun())
    }

    /// Whether [`submit`](Self::submit) has something to do: entries are queued, or the
    /// kernel holds completions back until the loop enters. When false, a spinning loop
    /// reads the completion queue without a syscall.
    pub fn needs_enter(&mut self) -> bool {
        self.pending_submissions() > 0 || self.completions_held()
    }

    /// `io_uring_enter` calls made on this ring so far.
    pub fn enters(&self) -> u64 {
        self.enters
    }

    /// Whether [`reap`](Self::reap) would deliver something now (for spin-then-park), or an
    /// enter would post some without waiting.
    pub fn has_completions(&mut self) -> bool {
        !self.stash.is_empty() || !self.ring.completion().is_empty() || self.completions_held()
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

    /// Registers a ring of provided buffers of `entries` entries at `addr` under buffer
    /// group `group` (`IORING_REGISTER_PBUF_RING`, Linux 5.19).
    ///
    /// # Safety
    ///
    /// `addr` must point at `entries` page-aligned `io_uring_buf` entries that stay valid
    /// until the ring is dropped, as must every buffer an entry names while the kernel may
    /// write into it (from the entry's publication to the completion that names it).
    ///
    /// `incremental` asks for incremental consumption (`IOU_PBUF_RING_INC`, Linux 6.12):
    /// the kernel then fills a buffer across several receives before it moves on to the
    /// next.
    pub unsafe fn register_buf_ring(
        &mut self,
        addr: u64,
        entries: u16,
        group: u16,
        incremental: bool,
    ) -> io::Result<()> {
        /// `IOU_PBUF_RING_INC` of the kernel's `io_uring.h`.
        const PBUF_RING_INC: u16 = 2;
        let flags = if incremental { PBUF_RING_INC } else { 0 };
        // SAFETY: passed on from the caller.
        unsafe {
            self.ring
                .submitter()
                .register_buf_ring_with_flags(addr, entries, group, flags)
        }
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
mod tests;
