//! The receive-buffer pool (`STARWIRE_BUF_SIZE`): registered as io_uring fixed buffers and
//! read into with `READ_FIXED` on io_uring, used unregistered on epoll, and used
//! unregistered, with one warning carrying the numbers, when the locked-memory limit is too
//! low to register it (checked in a child process that lowers `RLIMIT_MEMLOCK` and drops
//! `CAP_IPC_LOCK`, which would otherwise exempt root from the limit).

mod common;

use common::*;
use starwire::config::Backend;
use starwire::{DType, Status};
use starwire::{Options, Reply, Runtime, Service, Tensor};
use std::process::Command;
use std::sync::{Arc, Mutex};

const CHILD_ENV: &str = "STARWIRE_TEST_LOW_MEMLOCK";
/// 16 receive buffers of the default 64 KiB per loop.
const POOL: u64 = 1 << 20;

/// Variable `id` is a tensor of `id` bytes of value `id as u8`.
struct Sized;

impl Service for Sized {
    fn pull(&self, ids: &[u64], out: &mut Vec<Result<Arc<Tensor>, Status>>) {
        out.extend(ids.iter().map(|&id| {
            let n = id as usize;
            Tensor::from_bytes(DType::U8, &[id], vec![id as u8; n])
                .map(Arc::new)
                .map_err(|_| Status::InvalidArgument)
        }));
    }
}

fn start_pair(pool: u64) -> (Runtime, Runtime) {
    start_pair_with(pool, starwire::config::DEFAULT_URING_RECV_BUFS)
}

/// A server and a client with receive-buffer pools of `pool` bytes and io_uring rings of
/// `recv_bufs` provided buffers.
fn start_pair_with(pool: u64, recv_bufs: u32) -> (Runtime, Runtime) {
    let server = Runtime::start_with(
        config("ps", 1)
            .buf_size(pool)
            .uring_recv_bufs(recv_bufs)
            .build()
            .unwrap(),
        Options {
            service: Some(Arc::new(Sized)),
            ..Options::listen("127.0.0.1:0".parse().unwrap())
        },
    )
    .unwrap();
    let client = config("worker", 1)
        .buf_size(pool)
        .uring_recv_bufs(recv_bufs)
        .build()
        .unwrap();
    let client = Runtime::start(client, None).unwrap();
    (server, client)
}

/// Pings and pulls of small and large tensors; checks every byte.
fn traffic(server: &Runtime, client: &Runtime) {
    let addr = server.local_addr().unwrap();
    let mut h = client.handle(64);
    for _ in 0..20 {
        let t = h.ping(addr, 100, secs(10)).unwrap();
        assert!(matches!(
            h.wait_tag(t.tag()).unwrap().result,
            Ok(Reply::Pong { payload: 100, .. })
        ));
    }
    for id in [1u64, 64, 4096, 100_000, 3 << 20] {
        let t = h.pull(addr, vec![id, 7], secs(30)).unwrap();
        match h.wait(t) {
            Ok(v) => {
                let a = v[0].as_ref().unwrap();
                assert_eq!(a.byte_len(), id as usize);
                assert!(a.bytes().iter().all(|&b| b == id as u8), "id {id}");
                assert_eq!(v[1].as_ref().unwrap().bytes(), &[7u8; 7]);
            }
            other => panic!("{other:?}"),
        }
    }
}

/// With one-shot receives (no ring of provided buffers), every receive into a connection
/// buffer is a `READ_FIXED` on io_uring.
#[test]
fn the_pool_is_registered_on_io_uring_and_used_unregistered_on_epoll() {
    let (server, client) = start_pair_with(POOL, 0);
    traffic(&server, &client);
    for rt in [&client, &server] {
        let s = rt.stats();
        assert_eq!(s.buf_pool_bytes, POOL, "{s:?}");
        assert_eq!(s.recv_ring_bytes, 0, "{s:?}");
        match rt.backend() {
            Backend::Uring => {
                assert_eq!(s.buf_registered_bytes, POOL, "{s:?}");
                assert!(s.fixed_reads > 20, "{s:?}");
            }
            Backend::Epoll => {
                assert_eq!(s.buf_registered_bytes, 0, "{s:?}");
                assert_eq!(s.fixed_reads, 0, "{s:?}");
            }
        }
    }
}

/// With multishot receives, data read ahead reaches connection buffers from the ring of
/// provided buffers: fixed reads are left to exact reads, and the traffic is intact.
#[test]
fn multishot_receives_fill_the_pool_buffers_from_the_ring() {
    let (server, client) = start_pair(POOL);
    traffic(&server, &client);
    for rt in [&client, &server] {
        let s = rt.stats();
        assert_eq!(s.buf_pool_bytes, POOL, "{s:?}");
        match rt.backend() {
            // Multishot receives need the task-work setup flags.
            Backend::Uring if !starwire::Config::from_env("ps", 0).unwrap().uring_flags() => {
                assert_eq!(s.recv_ring_bytes, 0, "{s:?}")
            }
            Backend::Uring => {
                assert_eq!(s.recv_ring_bytes, 256 * ((16 << 10) + 16), "{s:?}");
                assert_eq!(s.buf_registered_bytes, POOL, "{s:?}");
                assert_eq!(s.recv_ring_exhausted, 0, "{s:?}");
                // Reads ahead come from the ring; only exact ones (a header before a large
                // payload) are one-shot reads, `READ_FIXED` into the pool buffer.
                assert!(s.fixed_reads > 0 && s.fixed_reads * 4 < s.reads, "{s:?}");
            }
            Backend::Epoll => assert_eq!(s.recv_ring_bytes, 0, "{s:?}"),
        }
    }
}

#[test]
fn without_a_pool_nothing_is_registered() {
    let (server, client) = start_pair(0);
    traffic(&server, &client);
    let s = client.stats();
    assert_eq!(
        (s.buf_pool_bytes, s.buf_registered_bytes, s.fixed_reads),
        (0, 0, 0),
        "{s:?}"
    );
}

#[test]
fn more_connections_than_pool_buffers() {
    // One buffer per loop: the second and later connections use heap buffers; a closed
    // connection's buffer goes back to the pool and is lent again.
    let server = Runtime::start_with(
        config("ps", 1).buf_size(64 << 10).build().unwrap(),
        Options {
            service: Some(Arc::new(Sized)),
            ..Options::listen("127.0.0.1:0".parse().unwrap())
        },
    )
    .unwrap();
    for round in 0..3 {
        let client = Runtime::start(
            config("worker", 1)
                .buf_size(64 << 10)
                .connections_per_peer(3)
                .build()
                .unwrap(),
            None,
        )
        .unwrap();
        let mut h = client.handle(64);
        let addr = server.local_addr().unwrap();
        let tags: Vec<_> = (0..12)
            .map(|i| h.pull(addr, vec![1000 + i], secs(10)).unwrap())
            .collect();
        for (i, t) in tags.into_iter().enumerate() {
            match h.wait(t) {
                Ok(v) => {
                    assert_eq!(v[0].as_ref().unwrap().byte_len(), 1000 + i, "round {round}")
                }
                other => panic!("round {round}: {other:?}"),
            }
        }
        client.shutdown();
    }
    assert!(ping_once(&server, server.local_addr().unwrap(), secs(10)).is_ok());
}

#[test]
fn small_frames_take_one_read_each_and_large_ones_arrive_uncopied() {
    let (server, client) = start_pair(0);
    let addr = server.local_addr().unwrap();
    let mut h = client.handle(8);
    let mut ping = |n: usize| {
        for _ in 0..n {
            let t = h.ping(addr, 64, secs(10)).unwrap();
            assert!(matches!(
                h.wait_tag(t.tag()).unwrap().result,
                Ok(Reply::Pong { payload: 64, .. })
            ));
        }
    };
    ping(5);
    // Sequential pings: each frame arrives alone and is read whole by one receive (a
    // header read on its own would make it two). The receive for the next frame is
    // started just after a completion is handed out, so a snapshot may miss one.
    let (s0, c0) = (server.stats(), client.stats());
    ping(200);
    let (s1, c1) = (server.stats(), client.stats());
    let (server_reads, client_reads) = (s1.reads - s0.reads, c1.reads - c0.reads);
    assert!((199..=203).contains(&server_reads), "{server_reads}");
    assert!((199..=203).contains(&client_reads), "{client_reads}");

    // A large tensor after small frames: its first bytes come with the header's read and
    // are copied. The next one is read header-first: nothing copied.
    let mut h = client.handle(8);
    let mut pull_1mib = || {
        let before = client.stats();
        let t = h.pull(addr, vec![1 << 20], secs(10)).unwrap();
        match h.wait(t) {
            Ok(v) => assert!(v[0].as_ref().unwrap().bytes() == [0u8; 1 << 20]),
            other => panic!("{other:?}"),
        }
        let after = client.stats();
        (
            after.payload_copied - before.payload_copied,
            after.payload_direct - before.payload_direct,
        )
    };
    let (copied, direct) = pull_1mib();
    // A pong completes at its header; its 64 payload bytes may be counted (as copied)
    // just after, inside this pull's window.
    let pong = (copied + direct).saturating_sub(1 << 20);
    assert!(pong == 0 || pong == 64, "{copied} + {direct}");
    let copied = copied - pong;
    assert!(
        copied > 0 && copied <= 64 << 10,
        "at most one receive buffer: {copied}"
    );
    assert_eq!(copied + direct, 1 << 20);
    assert_eq!(pull_1mib(), (0, 1 << 20));
    assert_eq!(pull_1mib(), (0, 1 << 20));

    // Back to small frames: after the first pong, one read per pong again.
    let mut h = client.handle(8);
    let mut ping = |n: usize| {
        for _ in 0..n {
            let t = h.ping(addr, 64, secs(10)).unwrap();
            assert!(matches!(
                h.wait_tag(t.tag()).unwrap().result,
                Ok(Reply::Pong { payload: 64, .. })
            ));
        }
    };
    ping(1);
    let c0 = client.stats();
    ping(100);
    let client_reads = client.stats().reads - c0.reads;
    assert!((99..=102).contains(&client_reads), "{client_reads}");
}

/// Keeps the warnings logged, for the child process.
struct Warnings(Mutex<Vec<String>>);

impl log::Log for Warnings {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= log::Level::Warn
    }
    fn log(&self, r: &log::Record<'_>) {
        if self.enabled(r.metadata()) {
            self.0.lock().unwrap().push(r.args().to_string());
        }
    }
    fn flush(&self) {}
}

/// Drops `CAP_IPC_LOCK` from this thread's effective and permitted sets (threads started
/// later inherit that) and sets `RLIMIT_MEMLOCK` to `limit` bytes.
fn lower_memlock(limit: u64) {
    const CAP_IPC_LOCK: u32 = 14;
    const VERSION_3: u32 = 0x2008_0522;
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let mut header = Header {
        version: VERSION_3,
        pid: 0,
    };
    let mut data = [Data::default(); 2];
    // SAFETY: capget/capset with a version 3 header and two data structs, as the ABI asks;
    // both outlive the calls.
    unsafe {
        assert_eq!(
            libc::syscall(
                libc::SYS_capget,
                &mut header as *mut Header,
                data.as_mut_ptr()
            ),
            0
        );
        data[0].effective &= !(1 << CAP_IPC_LOCK);
        data[0].permitted &= !(1 << CAP_IPC_LOCK);
        assert_eq!(
            libc::syscall(libc::SYS_capset, &mut header as *mut Header, data.as_ptr()),
            0,
            "capset: {}",
            std::io::Error::last_os_error()
        );
    }
    let lim = libc::rlimit {
        rlim_cur: limit,
        rlim_max: limit,
    };
    // SAFETY: setrlimit reads the struct, which outlives the call.
    let rc = unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &lim) };
    assert_eq!(rc, 0, "setrlimit: {}", std::io::Error::last_os_error());
}

#[test]
fn a_memlock_limit_too_low_falls_back_to_unregistered_buffers() {
    if std::env::var_os(CHILD_ENV).is_none() {
        let status = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "a_memlock_limit_too_low_falls_back_to_unregistered_buffers",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, "1")
            .status()
            .unwrap();
        assert!(status.success(), "child failed: {status}");
        return;
    }
    let warnings: &'static Warnings = Box::leak(Box::new(Warnings(Mutex::new(Vec::new()))));
    log::set_logger(warnings).unwrap();
    log::set_max_level(log::LevelFilter::Warn);
    // Room for the two loops' rings (since Linux 6.x ring memory counts against the limit
    // again, about 100 KiB for a loop's ring), not for a 1 MiB pool.
    lower_memlock(512 << 10);

    let (server, client) = start_pair(POOL);
    traffic(&server, &client);
    for rt in [&client, &server] {
        let s = rt.stats();
        assert_eq!(s.buf_pool_bytes, POOL, "{s:?}");
        assert_eq!(s.buf_registered_bytes, 0, "{s:?}");
        assert_eq!(s.fixed_reads, 0, "{s:?}");
    }
    let logged = warnings.0.lock().unwrap().clone();
    eprintln!("{logged:#?}");
    if client.backend() == Backend::Uring {
        // One warning per loop (two loops), each with what was asked and the limit.
        let about: Vec<&String> = logged
            .iter()
            .filter(|w| w.contains("register_buffers"))
            .collect();
        assert_eq!(about.len(), 2, "{logged:#?}");
        for w in about {
            assert!(w.contains(&format!("{POOL} bytes")), "{w}");
            assert!(w.contains("RLIMIT_MEMLOCK soft=524288 bytes"), "{w}");
            assert!(w.contains("unregistered"), "{w}");
        }
    } else {
        assert!(logged.iter().all(|w| !w.contains("register_buffers")));
    }
}
