//! The runtime over real loopback sockets: ping, many connections, handshake refusals,
//! deadlines, shutdown with requests in flight, callbacks and embedded mode.

mod common;

use common::*;
use starwire::Status;
use starwire::{Completion, Embedded, ErrorKind, Options, Reply, Runtime, Tensor};
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[test]
fn ping_returns_the_payload_size_and_a_round_trip_time() {
    let server = server(2);
    let client = client(2);
    let addr = server.local_addr().unwrap();
    let mut h = client.handle(16);
    for size in [0u32, 1, 100, 4096, 60_000] {
        let t = h.ping(addr, size, secs(10)).unwrap();
        // The echoed size is a detail of the reply; the typed result is the rtt alone.
        match h.wait_tag(t.tag()).unwrap().result {
            Ok(Reply::Pong { rtt, payload }) => {
                assert_eq!(payload, size);
                assert!(rtt > Duration::ZERO && rtt < Duration::from_secs(10));
            }
            other => panic!("ping of {size} bytes: {other:?}"),
        }
    }
    let stats = client.stats();
    assert_eq!(stats.completed[0], 5);
    assert_eq!(stats.failed[0], 0);
}

#[test]
fn many_loops_and_256_connections() {
    let server = server(2);
    let addr = server.local_addr().unwrap();
    let client = Runtime::start(
        config("worker", 2)
            .connections_per_peer(256)
            .build()
            .unwrap(),
        None,
    )
    .unwrap();
    let mut h = client.handle(1024);
    // Four rounds over all 256 lanes, 512 requests in flight at a time.
    let mut ok = 0;
    for _round in 0..4 {
        let tickets: Vec<_> = (0..512)
            .map(|_| h.ping(addr, 64, secs(20)).expect("submit"))
            .collect();
        for t in tickets {
            match h.wait_tag(t.tag()).unwrap().result {
                Ok(Reply::Pong { payload: 64, .. }) => ok += 1,
                other => panic!("{other:?}"),
            }
        }
    }
    assert_eq!(ok, 2048);
    assert_eq!(client.stats().connections_opened, 256);
    assert_eq!(server.stats().connections_accepted, 256);
    // Connections spread over both server loops (SO_REUSEPORT) and both client loops.
    assert_eq!(client.loops(), 2);
}

#[test]
fn cluster_mismatch_is_refused() {
    let server = server_with(config("ps", 1).cluster_id(2).build().unwrap());
    let client = Runtime::start(config("worker", 1).cluster_id(1).build().unwrap(), None).unwrap();
    let r = ping_once(&client, server.local_addr().unwrap(), secs(10));
    assert_eq!(
        (r).map_err(|e| e.kind()),
        Err(ErrorKind::Refused(Status::ClusterMismatch))
    );
    // The server stays healthy for a client of the right cluster.
    let good = Runtime::start(config("worker", 1).cluster_id(2).build().unwrap(), None).unwrap();
    assert!(ping_once(&good, server.local_addr().unwrap(), secs(10)).is_ok());
}

#[test]
fn wrong_token_is_refused() {
    let server = server_with(
        config("ps", 1)
            .cluster_token(b"right".to_vec())
            .build()
            .unwrap(),
    );
    let addr = server.local_addr().unwrap();
    let wrong = Runtime::start(
        config("worker", 1)
            .cluster_token(b"wrong".to_vec())
            .build()
            .unwrap(),
        None,
    )
    .unwrap();
    assert_eq!(
        (ping_once(&wrong, addr, secs(10))).map_err(|e| e.kind()),
        Err(ErrorKind::Refused(Status::Unauthenticated))
    );
    let right = Runtime::start(
        config("worker", 1)
            .cluster_token(b"right".to_vec())
            .build()
            .unwrap(),
        None,
    )
    .unwrap();
    assert!(ping_once(&right, addr, secs(10)).is_ok());
}

/// A listener that accepts and never answers.
fn silent_peer() -> (TcpListener, SocketAddr) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let a = l.local_addr().unwrap();
    (l, a)
}

#[test]
fn deadline_expires_with_a_timeout() {
    let (_silent, addr) = silent_peer();
    let client = client(1);
    let mut h = client.handle(8);
    let start = Instant::now();
    let t = h
        .ping(addr, 8, Some(start + Duration::from_millis(200)))
        .unwrap();
    // A second request with a far later deadline: the first must end by its own deadline,
    // so before this one.
    let later = h
        .ping(addr, 8, Some(start + Duration::from_secs(600)))
        .unwrap();
    let first = h.wait_any().unwrap();
    assert_eq!(first.tag, t.tag(), "the earlier deadline ends first");
    assert_eq!(
        first.result.map(|_| ()).map_err(|e| e.kind()),
        Err(ErrorKind::Timeout)
    );
    // Not before the deadline.
    let took = start.elapsed();
    assert!(took >= Duration::from_millis(200), "{took:?}");
    assert_eq!(h.outstanding(), 1);
    drop(later);
}

#[test]
fn nothing_listening_fails_after_bounded_retries() {
    let addr = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let client = Runtime::start(
        config("worker", 1)
            .connect_retries(3)
            .connect_backoff(Duration::from_millis(5))
            .build()
            .unwrap(),
        None,
    )
    .unwrap();
    let start = Instant::now();
    assert_eq!(
        (ping_once(&client, addr, secs(30))).map_err(|e| e.kind()),
        Err(ErrorKind::ConnectFailed)
    );
    assert!(
        start.elapsed() < Duration::from_secs(29),
        "failed only at its deadline"
    );
    assert_eq!(client.stats().reconnects, 3);
}

#[test]
fn shutdown_completes_requests_in_flight() {
    let (_silent, addr) = silent_peer();
    let client = client(2);
    let mut h = client.handle(64);
    let tickets: Vec<_> = (0..20).map(|_| h.ping(addr, 8, None).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(50));
    client.shutdown();
    for t in tickets {
        assert_eq!((h.wait(t)).map_err(|e| e.kind()), Err(ErrorKind::Shutdown));
    }
    assert_eq!(
        h.ping(addr, 8, None).err().map(|e| e.kind()),
        Some(ErrorKind::Shutdown)
    );
}

#[test]
fn callbacks_run_for_every_completion() {
    let server = server(1);
    let addr = server.local_addr().unwrap();
    let client = client(2);
    let count = Arc::new(AtomicUsize::new(0));
    let seen = count.clone();
    let cb: starwire::Callback = Arc::new(move |c: Completion| {
        assert!(c.into_pong().is_ok());
        seen.fetch_add(1, Ordering::SeqCst);
    });
    let mut h = client.handle_with_callback(256, cb);
    for _ in 0..200 {
        while h.ping(addr, 8, secs(10)).err().map(|e| e.kind()) == Some(ErrorKind::Backpressure) {
            std::thread::yield_now();
        }
    }
    let start = Instant::now();
    while count.load(Ordering::SeqCst) < 200 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "callbacks missing"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn backpressure_when_the_handle_is_full() {
    let (_silent, addr) = silent_peer();
    let client = client(1);
    let mut h = client.handle(4);
    for _ in 0..4 {
        let _queued = h.ping(addr, 8, None).unwrap();
    }
    assert_eq!(
        h.ping(addr, 8, None).err().map(|e| e.kind()),
        Some(ErrorKind::Backpressure)
    );
}

#[test]
fn embedded_loops_drive_both_ends_on_one_thread() {
    let mut server = Embedded::new(
        config("ps", 1).build().unwrap(),
        Some("127.0.0.1:0".parse().unwrap()),
    )
    .unwrap();
    let addr = server.local_addr().unwrap();
    let mut client = Embedded::new(config("worker", 1).build().unwrap(), None).unwrap();
    let mut done = 0;
    let tags: Vec<_> = (0..50)
        .map(|_| client.ping(addr, 32, secs(10)).unwrap().tag())
        .collect();
    let start = Instant::now();
    while done < tags.len() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "embedded pings stuck"
        );
        server.drive(Some(Duration::ZERO));
        while let Some(c) = client.poll() {
            assert!(tags.contains(&c.tag));
            assert!(matches!(c.result, Ok(Reply::Pong { payload: 32, .. })));
            done += 1;
        }
    }
    assert_eq!(client.stats().completed[0], 50);
}

#[test]
fn a_lost_server_fails_requests_and_a_new_one_is_reached() {
    let server = server(1);
    let addr = server.local_addr().unwrap();
    let client = client(1);
    assert!(ping_once(&client, addr, secs(10)).is_ok());
    server.shutdown();
    // The connection is gone; a request now fails instead of hanging.
    let r = ping_once(&client, addr, secs(10));
    assert!(
        matches!(
            r.as_ref().map_err(|e| e.kind()),
            Err(ErrorKind::ConnectionLost | ErrorKind::ConnectFailed | ErrorKind::Refused(_))
        ),
        "{r:?}"
    );
    // A new server on the same address is reconnected to.
    let again = Runtime::start(config("ps", 1).build().unwrap(), Some(addr)).unwrap();
    assert_eq!(again.local_addr(), Some(addr));
    let start = Instant::now();
    loop {
        match ping_once(&client, addr, secs(10)) {
            Ok(_) => break,
            Err(e) => assert!(start.elapsed() < Duration::from_secs(30), "{e:?}"),
        }
    }
}

#[test]
fn default_loop_count_follows_connections_and_cpus() {
    // The CPUs in this process's affinity set, as the runtime counts them.
    let cpus = {
        // SAFETY: a zeroed cpu_set_t is valid; sched_getaffinity fills it.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        let rc = unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) };
        assert_eq!(rc, 0);
        // SAFETY: `set` was filled by the kernel above.
        unsafe { libc::CPU_COUNT(&set) as usize }
    };
    let cfg = || {
        starwire::config::ConfigBuilder::from_env("worker", 0)
            .unwrap()
            .build()
            .unwrap()
    };
    let one = starwire::Options {
        connections: Some(1),
        ..starwire::Options::default()
    };
    assert_eq!(Runtime::start_with(cfg(), one).unwrap().loops(), 1);
    let many = starwire::Options {
        connections: Some(100),
        ..starwire::Options::default()
    };
    assert_eq!(
        Runtime::start_with(cfg(), many).unwrap().loops(),
        cpus.min(16)
    );
}

/// Records the name of the thread each pull ran on.
#[derive(Default)]
struct WhereRun(std::sync::Mutex<Vec<String>>);

impl starwire::Service for WhereRun {
    fn pull(&self, ids: &[u64], out: &mut Vec<Result<Arc<Tensor>, Status>>) {
        let name = std::thread::current().name().unwrap_or("").to_string();
        self.0.lock().unwrap().push(name);
        out.extend(ids.iter().map(|_| Err(Status::NotFound)));
    }
}

#[test]
fn handler_threads_from_the_config_run_handlers_on_a_pool() {
    for (threads, on_pool) in [(0, false), (2, true)] {
        let service = Arc::new(WhereRun::default());
        let cfg = config("ps", 1).handler_threads(threads).build().unwrap();
        let options = Options {
            listen: Some("127.0.0.1:0".parse().unwrap()),
            service: Some(service.clone()),
            ..Options::default()
        };
        let server = Runtime::start_with(cfg, options).unwrap();
        let worker = client(1);
        let mut h = worker.handle(8);
        let t = h
            .pull(server.local_addr().unwrap(), vec![1], secs(10))
            .unwrap();
        assert!(h.wait(t).is_ok());
        let names = service.0.lock().unwrap().clone();
        assert_eq!(names.len(), 1);
        assert_eq!(
            names[0].starts_with("starwire-handler"),
            on_pool,
            "{names:?}"
        );
    }
}
