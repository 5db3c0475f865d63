//! With io_uring refused by the kernel (a seccomp filter makes `io_uring_setup` fail with
//! EPERM, as container runtimes do), `auto` falls back to epoll and everything works; a
//! forced `uring` is a clear error. With pinning refused the same way, the loops run
//! unpinned. Both are in the start-up report. Each runs in a child process so the filter
//! stays there.

mod common;

use common::*;
use starwire::config::{Backend, BackendChoice};
use starwire::{Embedded, Runtime, StartError, StartNote};
use std::process::Command;

const CHILD_ENV: &str = "STARWIRE_TEST_NO_URING";

/// Makes the system call `nr` fail with EPERM for this process from now on.
fn refuse_syscall(nr: u32) {
    let filter = [
        // A = seccomp_data.nr
        libc::sock_filter {
            code: 0x20,
            jt: 0,
            jf: 0,
            k: 0,
        },
        // if A == nr: next, else skip one
        libc::sock_filter {
            code: 0x15,
            jt: 0,
            jf: 1,
            k: nr,
        },
        libc::sock_filter {
            code: 0x06,
            jt: 0,
            jf: 0,
            k: libc::SECCOMP_RET_ERRNO | libc::EPERM as u32,
        },
        libc::sock_filter {
            code: 0x06,
            jt: 0,
            jf: 0,
            k: libc::SECCOMP_RET_ALLOW,
        },
    ];
    let prog = libc::sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: plain prctl calls; `prog` and `filter` outlive the call that copies them.
    unsafe {
        assert_eq!(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 0);
        assert_eq!(
            libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER,
                &prog as *const _
            ),
            0,
            "seccomp: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// Makes `io_uring_setup` fail with EPERM for this process from now on.
fn refuse_io_uring() {
    const SYS_IO_URING_SETUP: u32 = 425; // same number on x86_64 and aarch64
    refuse_syscall(SYS_IO_URING_SETUP);
}

/// Runs test `name` again in a child process with `env` set; true in that child.
fn in_child(name: &str, env: &str) -> bool {
    if std::env::var_os(env).is_some() {
        return true;
    }
    let status = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(env, "1")
        .status()
        .unwrap();
    assert!(status.success(), "child failed: {status}");
    false
}

#[test]
fn auto_falls_back_to_epoll_when_io_uring_is_refused() {
    if !in_child(
        "auto_falls_back_to_epoll_when_io_uring_is_refused",
        CHILD_ENV,
    ) {
        return;
    }
    refuse_io_uring();
    let auto = |job| config(job, 1).backend(BackendChoice::Auto).build().unwrap();
    let server = Runtime::start(auto("ps"), Some("127.0.0.1:0".parse().unwrap())).unwrap();
    assert_eq!(server.backend(), Backend::Epoll);
    // The fallback and its reason are in the start-up report, not only in the log.
    let report = server.report();
    assert_eq!(report.backend(), Backend::Epoll);
    let reason = report
        .notes()
        .iter()
        .find_map(|n| match n {
            StartNote::BackendFallback { reason } => Some(reason.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no fallback in the report: {report}"));
    assert!(reason.contains("io_uring unavailable"), "{reason}");
    assert!(
        report.to_string().contains("epoll instead of io_uring"),
        "{report}"
    );
    let embedded = Embedded::new(auto("worker"), None).unwrap();
    assert!(
        matches!(
            embedded.report().notes(),
            [StartNote::BackendFallback { .. }]
        ),
        "{}",
        embedded.report()
    );
    let client = Runtime::start(auto("worker"), None).unwrap();
    assert_eq!(client.backend(), Backend::Epoll);
    assert!(ping_once(&client, server.local_addr().unwrap(), secs(10)).is_ok());

    let forced = config("worker", 1)
        .backend(BackendChoice::Uring)
        .build()
        .unwrap();
    let err = Runtime::start(forced, None)
        .err()
        .expect("forced uring must fail");
    assert!(matches!(err, StartError::Backend(_)), "{err:?}");
    assert!(err.to_string().contains("STARWIRE_BACKEND"), "{err}");
}

#[test]
fn refused_pinning_leaves_the_loops_running_unpinned_and_is_reported() {
    if !in_child(
        "refused_pinning_leaves_the_loops_running_unpinned_and_is_reported",
        "STARWIRE_TEST_NO_PINNING",
    ) {
        return;
    }
    refuse_syscall(libc::SYS_sched_setaffinity as u32);
    let server = Runtime::start(
        config("ps", 1).pin(true).build().unwrap(),
        Some("127.0.0.1:0".parse().unwrap()),
    )
    .expect("a refused pin is not fatal");
    let report = server.report();
    // (An io_uring fallback may be reported too, where the kernel has none.)
    let reason = report
        .notes()
        .iter()
        .find_map(|n| match n {
            StartNote::NotPinned {
                index: 0, reason, ..
            } => Some(reason.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no refused pin in the report: {report}"));
    assert!(
        reason.contains("EPERM") || reason.contains("not permitted"),
        "{reason}"
    );
    assert!(report.to_string().contains("loop 0 not pinned"), "{report}");
    // The unpinned loop serves.
    let client = Runtime::start(config("worker", 1).build().unwrap(), None).unwrap();
    assert!(ping_once(&client, server.local_addr().unwrap(), secs(10)).is_ok());
}
