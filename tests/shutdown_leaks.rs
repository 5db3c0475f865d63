//! Starting and stopping runtimes leaves no thread and no file descriptor behind. Alone in
//! its test binary so that no other test opens descriptors meanwhile.

mod common;

use common::*;
use std::net::TcpListener;
use std::time::Duration;

fn fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

/// Names of this process's threads, to say which one outlived its runtime.
fn thread_names() -> Vec<String> {
    let names = std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("comm")).ok());
    names.map(|n| n.trim().to_owned()).collect()
}

/// Waits until `count()` is back to `want`. A joined thread can stay listed in
/// `/proc/self/task` for a moment after `join` returns: the kernel wakes the joiner when the
/// thread releases its memory, before it removes the thread, and on a loaded machine the
/// gap is long enough to be seen (as are io_uring workers, which the kernel reaps on its
/// own). Anything still there after 30 s is a leak.
fn settles(count: fn() -> usize, want: usize) -> bool {
    for _ in 0..3000 {
        if count() == want {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

fn round() {
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_addr = silent.local_addr().unwrap();
    let server = server(2);
    let client = client(2);
    let addr = server.local_addr().unwrap();
    let mut h = client.handle(128);
    for _ in 0..100 {
        let t = h.ping(addr, 64, secs(10)).unwrap();
        assert!(h.wait(t).is_ok());
    }
    // Requests in flight (to a peer that never answers) when the client stops.
    let pending: Vec<_> = (0..20)
        .map(|_| h.ping(silent_addr, 8, None).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(20));
    client.shutdown();
    server.shutdown();
    for t in pending {
        let e = h.wait(t).err().map(|e| e.kind());
        assert_eq!(e, Some(starwire::ErrorKind::Shutdown));
    }
    drop(h);
    drop(silent);
}

#[test]
fn no_thread_or_descriptor_outlives_its_runtime() {
    round(); // warm-up: anything created once per process
    let (fd0, th0) = (fds(), threads());
    for _ in 0..3 {
        round();
    }
    assert!(
        settles(fds, fd0),
        "file descriptors leaked: {} now, {fd0} before",
        fds()
    );
    assert!(
        settles(threads, th0),
        "threads leaked: {:?}, {th0} before",
        thread_names()
    );
}
