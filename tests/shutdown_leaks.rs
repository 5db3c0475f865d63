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
    assert_eq!(fds(), fd0, "file descriptors leaked");
    assert_eq!(threads(), th0, "threads leaked");
}
