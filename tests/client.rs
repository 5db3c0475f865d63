//! The one client API over real sockets: the same bodies run against a `Handle` (loop
//! threads) and an `Embedded` loop (the caller's thread); typed results; waits that keep
//! other requests' completions; errors, not hangs, for tags that are not outstanding;
//! lanes over `connections_per_peer`; the embedded driving call; the start-up report.

mod common;

use common::*;
use starwire::client::Mode;
use starwire::{
    Client, Embedded, ErrorKind, Options, Rendezvous, Runtime, Service, StartError, StartNote,
    Tensor,
};
use starwire::{DType, Status};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

/// Variable `i` (below 100) holds 8 bytes of value `i`; pushes are recorded and accepted
/// when 8 bytes long.
#[derive(Default)]
struct Table {
    pushed: Mutex<Vec<(u64, Vec<u8>)>>,
}

impl Service for Table {
    fn pull(&self, ids: &[u64], out: &mut Vec<Result<Arc<Tensor>, Status>>) {
        for &id in ids {
            out.push(if id < 100 {
                Ok(Arc::new(
                    Tensor::from_slice(DType::U8, &[8], &[id as u8; 8]).unwrap(),
                ))
            } else {
                Err(Status::NotFound)
            });
        }
    }

    fn push(&self, items: &mut Vec<(u64, Tensor)>, statuses: &mut Vec<Status>) {
        let mut pushed = self.pushed.lock().unwrap();
        for (id, t) in items.iter() {
            if t.byte_len() == 8 {
                pushed.push((*id, t.bytes().to_vec()));
                statuses.push(Status::Ok);
            } else {
                statuses.push(Status::InvalidArgument);
            }
        }
    }
}

fn serve(table: Arc<Table>, rv: Option<Arc<Rendezvous>>) -> Runtime {
    Runtime::start_with(
        config("ps", 1).build().unwrap(),
        Options {
            service: Some(table),
            rendezvous: rv,
            ..Options::listen("127.0.0.1:0".parse().unwrap())
        },
    )
    .expect("server starts")
}

fn bytes8(v: u8) -> Arc<Tensor> {
    Arc::new(Tensor::from_slice(DType::U8, &[8], &[v; 8]).unwrap())
}

/// Every request kind, with typed results, through whichever driver.
fn every_kind<M: Mode>(c: &mut Client<M>, peer: SocketAddr, rv: &Rendezvous) {
    let t = c.ping(peer, 16, secs(10)).unwrap();
    let rtt = c.wait(t).unwrap();
    assert!(rtt > std::time::Duration::ZERO);

    let t = c.pull(peer, vec![3, 200, 7], secs(10)).unwrap();
    let pulled = c.wait(t).unwrap();
    assert_eq!(pulled.len(), 3);
    assert_eq!(pulled[0].as_ref().unwrap().bytes(), [3u8; 8]);
    assert_eq!(pulled[1].as_ref().unwrap_err(), &Status::NotFound);
    assert_eq!(pulled[2].as_ref().unwrap().bytes(), [7u8; 8]);

    // A request and its wait in one line.
    let pulled = c.pull_slice(peer, &[9], secs(10)).unwrap().wait(c).unwrap();
    assert_eq!(pulled[0].as_ref().unwrap().bytes(), [9u8; 8]);

    let short = Arc::new(Tensor::from_slice(DType::U8, &[1], &[1]).unwrap());
    let t = c.push(peer, vec![(1, bytes8(5)), (2, short)], secs(10));
    let statuses = c.wait(t.unwrap());
    assert_eq!(statuses, Ok(vec![Status::Ok, Status::InvalidArgument]));
    let t = c.push_slice(peer, &[(4, bytes8(6))], secs(10)).unwrap();
    assert_eq!(c.wait(t), Ok(vec![Status::Ok]));

    rv.publish(b"a", bytes8(10)).unwrap();
    rv.publish(b"b", bytes8(11)).unwrap();
    rv.publish(b"c", bytes8(12)).unwrap();
    let t = c.recv(peer, 0, b"a", secs(10)).unwrap();
    let got = c.wait(t).unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].as_ref().unwrap().bytes(), [10u8; 8]);
    let keys = vec![b"b".to_vec(), b"c".to_vec()];
    let t = c.recv_many(peer, 0, keys, secs(10)).unwrap();
    let got = c.wait(t).unwrap();
    assert_eq!(got[0].as_ref().unwrap().bytes(), [11u8; 8]);
    assert_eq!(got[1].as_ref().unwrap().bytes(), [12u8; 8]);
    assert_eq!(
        c.recv_many(peer, 0, Vec::new(), None)
            .err()
            .map(|e| e.kind()),
        Some(ErrorKind::InvalidArgument)
    );
    assert_eq!(c.outstanding(), 0);
}

#[test]
fn every_request_kind_gives_its_typed_result_through_both_drivers() {
    let table = Arc::new(Table::default());
    let rv = Rendezvous::new();
    let server = serve(table.clone(), Some(rv.clone()));
    let peer = server.local_addr().unwrap();

    let rt = client(1);
    let mut h = rt.handle(16);
    every_kind(&mut h, peer, &rv);
    let mut e = Embedded::new(config("worker", 1).build().unwrap(), None).unwrap();
    every_kind(&mut e, peer, &rv);

    // Each run pushed id 1 and id 4, with the bytes given.
    let pushed = table.pushed.lock().unwrap().clone();
    let want = vec![(1, vec![5u8; 8]), (4, vec![6u8; 8])];
    assert_eq!(pushed, [want.clone(), want].concat());
}

/// Three requests in flight, waited for last first: the other two completions are kept
/// and given to later waits, then `wait_any`; nothing is lost or given twice.
fn pipelined<M: Mode>(c: &mut Client<M>, peer: SocketAddr) {
    let a = c.pull(peer, vec![1], secs(10)).unwrap();
    let b = c.ping(peer, 24, secs(10)).unwrap();
    let d = c.pull(peer, vec![2], secs(10)).unwrap();
    let e = c.pull(peer, vec![3], secs(10)).unwrap();
    let e_tag = e.tag();
    assert_eq!(c.outstanding(), 4);
    // The last one first: the earlier answers arrive meanwhile and must stay.
    let last = c.wait(d).unwrap();
    assert_eq!(last[0].as_ref().unwrap().bytes(), [2u8; 8]);
    let first = c.wait(a).unwrap();
    assert_eq!(first[0].as_ref().unwrap().bytes(), [1u8; 8]);
    assert_eq!(c.outstanding(), 2);
    // The rest in any order, through the completion path and its typed accessors.
    let mut seen = Vec::new();
    while c.outstanding() > 0 {
        let done = c.wait_any().unwrap();
        seen.push(done.tag);
        if done.tag == e_tag {
            let v = done.into_pulled().unwrap();
            assert_eq!(v[0].as_ref().unwrap().bytes(), [3u8; 8]);
        } else {
            assert_eq!(done.tag, b.tag());
            // The typed answer: the round trip and the payload the peer echoed.
            let pong = done.pong().unwrap();
            assert_eq!(pong.payload, 24);
            assert_eq!(done.into_pong(), Ok(pong.rtt));
        }
    }
    seen.sort_unstable();
    assert_eq!(seen, vec![b.tag(), e_tag]);
    // The ticket of a completion taken by wait_any is no longer outstanding.
    assert_eq!(
        (c.wait(b)).map_err(|e| e.kind()),
        Err(ErrorKind::NotOutstanding)
    );
    assert!(c.poll().is_none());
}

#[test]
fn waits_keep_the_completions_of_other_requests() {
    let server = serve(Arc::new(Table::default()), None);
    let peer = server.local_addr().unwrap();
    let rt = client(1);
    pipelined(&mut rt.handle(16), peer);
    let mut e = Embedded::new(config("worker", 1).build().unwrap(), None).unwrap();
    pipelined(&mut e, peer);
}

/// Waiting on what is not outstanding returns at once (a hang would fail the test by
/// never finishing it).
fn not_outstanding<M: Mode>(c: &mut Client<M>, peer: SocketAddr) {
    assert_eq!(
        c.wait_tag(12345).err().map(|e| e.kind()),
        Some(ErrorKind::NotOutstanding)
    );
    assert_eq!(
        c.wait_any().err().map(|e| e.kind()),
        Some(ErrorKind::NotOutstanding)
    );
    // With another request in flight, an unknown tag still does not wait for it.
    let t = c.ping(peer, 8, secs(10)).unwrap();
    assert_eq!(
        c.wait_tag(t.tag() + 1).err().map(|e| e.kind()),
        Some(ErrorKind::NotOutstanding)
    );
    let tag = t.tag();
    assert!(c.wait(t).is_ok());
    // Already taken.
    assert_eq!(
        c.wait_tag(tag).err().map(|e| e.kind()),
        Some(ErrorKind::NotOutstanding)
    );
}

#[test]
fn waiting_on_a_tag_that_is_not_outstanding_is_an_error() {
    let server = serve(Arc::new(Table::default()), None);
    let peer = server.local_addr().unwrap();
    let rt = client(1);
    not_outstanding(&mut rt.handle(4), peer);
    let mut e = Embedded::new(config("worker", 1).build().unwrap(), None).unwrap();
    not_outstanding(&mut e, peer);

    // A callback handle's completions go to the callback: nothing to wait for.
    let (tx, rx) = mpsc::channel();
    let tx = Mutex::new(tx);
    let cb: starwire::Callback = Arc::new(move |c: starwire::Completion| {
        let _ = tx.lock().unwrap().send(c.into_pulled());
    });
    let mut h = rt.handle_with_callback(4, cb);
    let t = h.pull(peer, vec![5], secs(10)).unwrap();
    assert_eq!(
        h.wait_tag(t.tag()).err().map(|e| e.kind()),
        Some(ErrorKind::NotOutstanding)
    );
    let v = rx.recv().unwrap().unwrap();
    assert_eq!(v[0].as_ref().unwrap().bytes(), [5u8; 8]);
}

#[test]
fn an_error_names_its_peer_and_says_what_the_peer_said() {
    // A task with no service: pulls are answered with UNIMPLEMENTED and a reason.
    let bare = server(1);
    let peer = bare.local_addr().unwrap();
    let mut e = Embedded::new(config("worker", 1).build().unwrap(), None).unwrap();
    let t = e.pull(peer, vec![1], secs(10)).unwrap();
    let err = e.wait(t).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Remote(Status::Unimplemented));
    assert_eq!(err.peer(), Some(peer));
    assert_eq!(err.remote_message(), Some("no pull service"));
    assert!(err.to_string().contains(&peer.to_string()), "{err}");
    // A request that times out names the peer it was waiting for.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let quiet = silent.local_addr().unwrap();
    let t = e.ping(quiet, 8, Some(std::time::Instant::now())).unwrap();
    let err = e.wait(t).unwrap_err();
    assert!(err.is_timeout(), "{err}");
    assert_eq!(err.peer(), Some(quiet));
    assert_eq!(err.remote_message(), None);
}

#[test]
fn a_typed_accessor_of_another_kind_is_an_error() {
    let server = serve(Arc::new(Table::default()), None);
    let peer = server.local_addr().unwrap();
    let mut e = Embedded::new(config("worker", 1).build().unwrap(), None).unwrap();
    let t = e.ping(peer, 8, secs(10)).unwrap();
    let done = e.wait_tag(t.tag()).unwrap();
    assert_eq!(
        done.pulled().err().map(|e| e.kind()),
        Some(ErrorKind::OtherKind)
    );
    assert_eq!(
        done.pushed().err().map(|e| e.kind()),
        Some(ErrorKind::OtherKind)
    );
    assert!(done.into_pulled().is_err());
    let t = e.pull(peer, vec![1], secs(10)).unwrap();
    let done = e.wait_tag(t.tag()).unwrap();
    assert!(done.pulled().is_ok());
    assert_eq!(
        (done.into_pong()).map_err(|e| e.kind()),
        Err(ErrorKind::OtherKind)
    );
}

#[test]
fn embedded_spreads_requests_over_connections_per_peer() {
    let server = serve(Arc::new(Table::default()), None);
    let peer = server.local_addr().unwrap();
    let cfg = config("worker", 1).connections_per_peer(2).build().unwrap();
    let mut e = Embedded::new(cfg, None).unwrap();
    for _ in 0..6 {
        let t = e.ping(peer, 8, secs(10)).unwrap();
        e.wait(t).unwrap();
    }
    assert_eq!(e.stats().connections_opened, 2);
    assert_eq!(server.stats().connections_accepted, 2);

    // One lane: one connection, however many requests.
    let cfg = config("worker", 1).connections_per_peer(1).build().unwrap();
    let mut one = Embedded::new(cfg, None).unwrap();
    for _ in 0..6 {
        let t = one.ping(peer, 8, secs(10)).unwrap();
        one.wait(t).unwrap();
    }
    assert_eq!(one.stats().connections_opened, 1);
    assert_eq!(server.stats().connections_accepted, 3);
}

#[test]
fn an_embedded_server_is_run_by_its_driving_call() {
    let stop = Arc::new(AtomicBool::new(false));
    let (addr_tx, addr_rx) = mpsc::channel();
    let serving = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let options = Options {
                service: Some(Arc::new(Table::default())),
                ..Options::listen("127.0.0.1:0".parse().unwrap())
            };
            let mut server = Embedded::with_options(config("ps", 1).build().unwrap(), options)
                .expect("embedded server starts");
            addr_tx.send(server.local_addr().unwrap()).unwrap();
            server.run_until(|_| stop.load(Ordering::Acquire));
            server.stats()
        })
    };
    let peer = addr_rx.recv().unwrap();
    let cfg = config("worker", 1).connections_per_peer(1).build().unwrap();
    let rt = Runtime::start(cfg, None).unwrap();
    let mut h = rt.handle(8);
    for i in 0..20u64 {
        let t = h.pull(peer, vec![i], secs(10)).unwrap();
        let v = h.wait(t).unwrap();
        assert_eq!(v[0].as_ref().unwrap().bytes(), [i as u8; 8]);
    }
    stop.store(true, Ordering::Release);
    let stats = serving.join().unwrap();
    assert_eq!(stats.connections_accepted, 1);
    assert!(stats.frames_in >= 20, "{stats:?}");
}

#[test]
fn more_loops_than_allowed_cpus_is_reported() {
    // The CPUs in this process's affinity set, as the runtime counts them.
    let cpus = {
        // SAFETY: a zeroed cpu_set_t is valid; sched_getaffinity fills it.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        let rc = unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) };
        assert_eq!(rc, 0);
        // SAFETY: `set` was filled by the kernel above.
        unsafe { libc::CPU_COUNT(&set) as usize }
    };
    let cfg = config("worker", cpus + 3).build().unwrap();
    let rt = Runtime::start(cfg, None).unwrap();
    assert_eq!(rt.loops(), cpus);
    let report = rt.report();
    assert_eq!(report.loops(), cpus);
    assert_eq!(report.backend(), rt.backend());
    assert!(
        report.notes().contains(&StartNote::LoopsClamped {
            asked: cpus + 3,
            allowed_cpus: cpus,
        }),
        "{report}"
    );
    let text = report.to_string();
    assert!(
        text.contains(&format!("{} event loops asked for", cpus + 3)),
        "{text}"
    );

    // The kernel features the loops use: on io_uring the deferred task-work setup this
    // kernel grants (unless turned off), with the ring sizes; nothing on epoll. Embedded
    // loops report the same.
    let env = starwire::Config::from_env("worker", 0).unwrap();
    let (flags_on, files_on) = (env.uring_flags(), env.uring_fixed_files());
    for (backend, features) in [(report.backend(), report.features()), {
        let e = Embedded::new(config("worker", 1).build().unwrap(), None).unwrap();
        (e.report().backend(), e.report().features())
    }] {
        match backend {
            starwire::config::Backend::Uring => {
                assert_eq!(features.defer_taskrun, flags_on, "{features}");
                assert_eq!(features.single_issuer, flags_on, "{features}");
                assert_eq!(features.fixed_files, files_on, "{features}");
                assert_eq!(features.registered_ring_fd, flags_on, "{features}");
                assert_eq!(features.multishot_accept, flags_on, "{features}");
                let direct = flags_on && files_on && env.uring_direct_accept();
                assert_eq!(features.direct_accept, direct, "{features}");
                let multishot_recv = flags_on && env.uring_recv_bufs() > 0;
                assert_eq!(features.multishot_recv, multishot_recv, "{features}");
                let bundles = multishot_recv && env.uring_recv_bundles();
                assert_eq!(features.recv_bundles, bundles, "{features}");
                let incremental = multishot_recv && !bundles && env.uring_recv_incremental();
                assert_eq!(features.recv_incremental, incremental, "{features}");
                assert!(features.sq_entries > 0 && features.cq_entries > 0);
            }
            starwire::config::Backend::Epoll => {
                assert_eq!(features, starwire::IoFeatures::default())
            }
        }
    }
    if report.backend() == starwire::config::Backend::Uring {
        assert!(text.contains("rings of"), "{text}");
    }

    // As asked: nothing to report.
    let rt = Runtime::start(config("worker", 1).build().unwrap(), None).unwrap();
    assert!(
        !rt.report()
            .notes()
            .iter()
            .any(|n| matches!(n, StartNote::LoopsClamped { .. })),
        "{}",
        rt.report()
    );
}

#[test]
fn a_listen_address_in_use_names_the_address() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let err = Runtime::start(config("ps", 1).build().unwrap(), Some(addr))
        .err()
        .expect("the address is taken");
    assert!(
        matches!(err, StartError::Listen { addr: a, .. } if a == addr),
        "{err:?}"
    );
    assert_eq!(err.kind(), std::io::ErrorKind::AddrInUse);
    assert!(err.to_string().contains(&addr.to_string()), "{err}");
    let err = Embedded::new(config("ps", 1).build().unwrap(), Some(addr))
        .err()
        .expect("the address is taken");
    assert!(matches!(err, StartError::Listen { .. }), "{err:?}");
}

#[test]
fn a_second_task_on_a_port_in_use_is_refused_though_its_listeners_share_ports() {
    // A task with two loops listens on one port (SO_REUSEPORT). A second task on that port,
    // such as one started while a stale one still runs, would otherwise join the group
    // and take a share of the connections; it is refused.
    let first = Runtime::start(
        config("ps", 2).build().unwrap(),
        Some("127.0.0.1:0".parse().unwrap()),
    )
    .unwrap();
    let addr = first.local_addr().unwrap();
    let err = Runtime::start(config("ps", 1).build().unwrap(), Some(addr))
        .err()
        .expect("the port is the first task's");
    assert!(
        matches!(err, StartError::Listen { addr: a, .. } if a == addr),
        "{err:?}"
    );
    assert_eq!(err.kind(), std::io::ErrorKind::AddrInUse);
    assert!(
        err.to_string().contains("in use by another socket"),
        "{err}"
    );
    let err = Embedded::new(config("ps", 1).build().unwrap(), Some(addr))
        .err()
        .expect("the port is the first task's");
    assert_eq!(err.kind(), std::io::ErrorKind::AddrInUse, "{err}");
    // Once the first task is gone the port is free again.
    drop(first);
    let again = Runtime::start(config("ps", 2).build().unwrap(), Some(addr)).unwrap();
    assert_eq!(again.local_addr(), Some(addr));
}

#[test]
fn a_handle_may_move_to_another_thread() {
    fn send<T: Send>(_: &T) {}
    let server = serve(Arc::new(Table::default()), None);
    let peer = server.local_addr().unwrap();
    let rt = client(1);
    let h = rt.handle(4);
    send(&h);
    // Made here, first used on another thread: that thread is the one woken.
    let (got, mut h) = std::thread::scope(|s| {
        s.spawn(move || {
            let mut h = h;
            let got = h.pull(peer, vec![4], secs(10)).unwrap().wait(&mut h);
            (got, h)
        })
        .join()
        .unwrap()
    });
    assert_eq!(got.unwrap()[0].as_ref().unwrap().bytes(), [4u8; 8]);
    // Moved back after use: its waits still complete.
    for i in 0..5u64 {
        let v = h
            .pull(peer, vec![i], secs(10))
            .unwrap()
            .wait(&mut h)
            .unwrap();
        assert_eq!(v[0].as_ref().unwrap().bytes(), [i as u8; 8]);
    }
}

#[test]
fn wait_for_peers_names_the_peers_that_never_came_up_and_waits_for_late_ones() {
    let up = server(1);
    let up_addr = up.local_addr().unwrap();
    // Free ports nobody listens on (yet).
    let free = || {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let (never, late) = (free(), free());
    let cfg = config("worker", 1)
        .connect_retries(1)
        .connect_backoff(Duration::from_millis(10))
        .build()
        .unwrap();
    let rt = starwire::Runtime::start(cfg, None).unwrap();
    let mut h = rt.handle(4);
    let e = h
        .wait_for_peers([up_addr, never], Duration::from_millis(500))
        .expect_err("one peer is not up");
    assert_eq!(e.peers.len(), 1, "{e}");
    assert_eq!(e.peers[0].0, starwire::Peer::from(never));
    assert!(e.to_string().contains(&never.to_string()), "{e}");
    // A peer that comes up while we wait is waited for.
    let starter = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        starwire::Runtime::start(config("ps", 1).build().unwrap(), Some(late)).unwrap()
    });
    h.wait_for_peers([up_addr, late], Duration::from_secs(30))
        .expect("the late peer is reached");
    starter.join().unwrap().shutdown();
}
