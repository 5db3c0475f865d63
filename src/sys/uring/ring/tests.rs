//! Tests of [`Ring`](super::Ring) against the running kernel.

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
fn setup_flags_are_probed_and_can_be_turned_off() {
    let ring = Ring::new(8).unwrap();
    let caps = *ring.capabilities();
    // Exactly one of the three modes.
    assert_eq!(caps.single_issuer, caps.defer_taskrun, "{caps:?}");
    assert!(!(caps.defer_taskrun && caps.coop_taskrun), "{caps:?}");
    assert_eq!(caps.taskrun_flag, caps.defer_taskrun || caps.coop_taskrun);
    let off = Ring::with_flags(8, SetupFlags::Off).unwrap();
    let c = off.capabilities();
    assert!(!c.single_issuer && !c.defer_taskrun && !c.coop_taskrun && !c.taskrun_flag);
}

/// A spinning loop that never waits in the kernel still sees a socket completion: on a
/// ring with a task-work flag, `needs_enter` turns true and `submit` posts it.
#[test]
fn spinning_without_waiting_sees_completions_in_every_mode() {
    for flags in [SetupFlags::Auto, SetupFlags::Off] {
        let (mut a, b) = UnixStream::pair().unwrap();
        let mut ring = Ring::with_flags(8, flags).unwrap();
        let mut buf = vec![0u8; 16];
        let entry = opcode::Recv::new(types::Fd(b.as_raw_fd()), buf.as_mut_ptr(), buf.len() as u32)
            .build()
            .user_data(3);
        // SAFETY: `buf` and `b` outlive the completion, reaped below before either is
        // dropped.
        unsafe { ring.push(&entry).unwrap() };
        assert!(ring.needs_enter());
        ring.submit().unwrap();
        a.write_all(b"ping").unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut got = Vec::new();
        while got.is_empty() && Instant::now() < deadline {
            if ring.needs_enter() {
                ring.submit().unwrap();
            }
            ring.reap(|ud, res, _| got.push((ud, res)));
        }
        assert_eq!(got, vec![(3, 4)], "{flags:?}");
        assert!(ring.enters() >= 1);
    }
}

#[test]
fn a_ring_belongs_to_the_first_thread_that_enters_it() {
    let mut ring = Ring::new(8).unwrap();
    // SAFETY: Nop references no memory.
    unsafe { ring.push(&nop(1)).unwrap() };
    // Created here, first used on another thread: that thread becomes the issuer.
    let mut ring = std::thread::spawn(move || {
        ring.submit_and_wait(1, None).unwrap();
        let mut got = Vec::new();
        ring.reap(|ud, _, _| got.push(ud));
        assert_eq!(got, vec![1]);
        ring
    })
    .join()
    .unwrap();
    // SAFETY: Nop references no memory.
    unsafe { ring.push(&nop(2)).unwrap() };
    let res = ring.submit();
    if ring.capabilities().single_issuer {
        let err = res.unwrap_err();
        assert_eq!(err.raw_os_error(), None, "{err}");
        assert!(err.to_string().contains("STARWIRE_URING_FLAGS"), "{err}");
    } else {
        res.unwrap();
    }
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

/// The thread that first enters a ring registers its descriptor then and enters by index
/// from then on, with and without a wait timeout (`EXT_ARG`); dropping the ring
/// unregisters it, or the thread's table (16 rings) would be full long before the 40th.
#[test]
fn the_ring_descriptor_is_registered_used_and_given_back() {
    for i in 0..40u64 {
        let mut ring = Ring::new(8).unwrap();
        assert!(ring.capabilities().registered_ring_fd, "ring {i}");
        assert!(
            !ring.ring_fd_registered(),
            "ring {i}: registered before its first enter"
        );
        // Nothing to complete: a park bounded by the timeout; the first enter registers.
        assert_eq!(
            ring.submit_and_wait(1, Some(Duration::from_millis(1)))
                .unwrap(),
            0
        );
        assert!(ring.ring_fd_registered(), "ring {i}: not registered");
        // SAFETY: Nop references no memory.
        unsafe { ring.push(&nop(i)).unwrap() };
        assert_eq!(reap_all(&mut ring, 1), vec![(i, 0)], "ring {i}");
    }
    let mut off = Ring::with_flags(8, SetupFlags::Off).unwrap();
    assert!(!off.capabilities().registered_ring_fd);
    off.submit().unwrap();
    assert!(!off.ring_fd_registered());
}

/// A ring created on one thread and first entered on another is registered by the one
/// that enters it, which is the one that may (its issuer, on a SINGLE_ISSUER ring).
#[test]
fn the_ring_descriptor_is_registered_by_the_thread_that_enters_first() {
    let ring = Ring::new(8).unwrap();
    let ring = std::thread::spawn(move || {
        let mut ring = ring;
        // SAFETY: Nop references no memory.
        unsafe { ring.push(&nop(5)).unwrap() };
        assert_eq!(reap_all(&mut ring, 1), vec![(5, 0)]);
        assert!(ring.ring_fd_registered());
        ring
    })
    .join()
    .unwrap();
    // Back here it is not entered by index (this thread's table does not have it).
    assert!(ring.ring_fd.as_ref().is_some_and(|r| !r.usable()));
}
