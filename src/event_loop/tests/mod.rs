//! The loop and its driver without a runtime: memory lent to operations, dropping.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::atomic::AtomicUsize;

use super::*;
use crate::tensor::{DropCounted, HeapAllocator};

fn driver(backend: Backend) -> (LoopDriver, LoopShared) {
    let shared = LoopShared::new().unwrap();
    let d = LoopDriver::new(backend, 64, &shared.doorbell, UringOptions::default()).unwrap();
    (d, shared)
}

fn backends() -> Vec<Backend> {
    let mut b = vec![Backend::Epoll];
    if crate::sys::select(crate::sys::BackendChoice::Uring).is_ok() {
        b.push(Backend::Uring);
    }
    b
}

/// Reaps completions until one of `op` arrives; its byte count.
fn reap(d: &mut LoopDriver, op: Op) -> u32 {
    let mut got = None;
    let give_up = Instant::now() + Duration::from_secs(30);
    while got.is_none() {
        assert!(Instant::now() < give_up, "no {op:?} completed");
        d.complete(true, Some(Duration::from_secs(5)), |c| {
            if let IoCompletion::Op { op: o, result, .. } = c {
                if o == op {
                    got = Some(result.unwrap());
                }
            }
        })
        .unwrap();
    }
    got.unwrap()
}

fn counted(len: usize, drops: &Arc<AtomicUsize>) -> Box<dyn TensorMemory> {
    Box::new(DropCounted {
        buf: vec![0; len],
        drops: drops.clone(),
    })
}

#[test]
fn a_receive_holds_its_memory_until_its_completion_is_reaped() {
    for backend in backends() {
        let (mut d, _shared) = driver(backend);
        let (a, mut b) = UnixStream::pair().unwrap();
        a.set_nonblocking(true).unwrap();
        let fd = a.as_raw_fd();
        d.register(0, fd).unwrap();
        let drops = Arc::new(AtomicUsize::new(0));
        let mem = RecvMem::Memory(counted(64, &drops));
        // Out of range: refused, and the memory comes back.
        let Err((_, mem)) = d.recv(0, fd, mem, 60, 8, false, None) else {
            panic!("{backend}: a range past the end was accepted");
        };
        d.recv(0, fd, mem, 16, 8, false, None).unwrap();
        assert!(d.recv_in_flight(0), "{backend}");
        assert!(d.take_recv(0).is_none(), "{backend}: taken while in flight");
        b.write_all(b"abcdefgh").unwrap();
        assert_eq!(reap(&mut d, Op::Recv), 8, "{backend}");
        let Some(RecvMem::Memory(mut m)) = d.take_recv(0) else {
            panic!("{backend}: memory not given back");
        };
        assert_eq!(&m.bytes_mut()[16..24], b"abcdefgh", "{backend}");
        assert_eq!(drops.load(Ordering::SeqCst), 0);
        drop(m);
        assert_eq!(drops.load(Ordering::SeqCst), 1);
        d.deregister(0);
    }
}

#[test]
fn a_driver_dropped_with_a_receive_in_flight_cancels_it_and_frees_its_memory() {
    for backend in backends() {
        let (mut d, _shared) = driver(backend);
        let (a, _b) = UnixStream::pair().unwrap();
        a.set_nonblocking(true).unwrap();
        let fd = a.as_raw_fd();
        d.register(0, fd).unwrap();
        let drops = Arc::new(AtomicUsize::new(0));
        d.recv(
            0,
            fd,
            RecvMem::Memory(counted(64, &drops)),
            0,
            64,
            false,
            None,
        )
        .unwrap();
        d.submit_pending().unwrap();
        assert_eq!(d.in_flight(), 1, "{backend}");
        // Nothing arrives; the socket stays open. Dropping the driver cancels the
        // receive, reaps it, and frees the memory rather than leaking it.
        drop(d);
        assert_eq!(drops.load(Ordering::SeqCst), 1, "{backend}");
    }
}

#[test]
fn a_send_keeps_its_blocks_and_shared_tensors_until_its_completion_is_reaped() {
    for backend in backends() {
        let (mut d, _shared) = driver(backend);
        let (a, mut b) = UnixStream::pair().unwrap();
        a.set_nonblocking(true).unwrap();
        let fd = a.as_raw_fd();
        d.register(0, fd).unwrap();
        let tensor =
            Arc::new(Tensor::from_bytes(crate::wire::DType::U8, &[4], b"wxyz".to_vec()).unwrap());
        let block: Box<[u8]> = b"head".to_vec().into_boxed_slice();
        let mut g = d.gather(0).unwrap();
        let blk = g.own(SendMem::Block { tag: 7, buf: block }).unwrap();
        let shared = g.own(SendMem::Shared(tensor.clone())).unwrap();
        assert!(g.piece(blk, 0, 4));
        assert!(!g.piece(blk, 2, 4), "a range past the block's end");
        assert!(g.piece(shared, 1, 3));
        assert_eq!(g.bytes(), 7);
        d.send(0, fd).unwrap();
        assert!(d.gather(0).is_none() || backend == Backend::Epoll);
        // Before the completion is reaped the driver still holds the tensor.
        assert_eq!(Arc::strong_count(&tensor), 2, "{backend}");
        assert_eq!(reap(&mut d, Op::Send), 7, "{backend}");
        let mut back = Vec::new();
        d.take_sent(0, |m| {
            if let SendMem::Block { tag, buf } = m {
                back.push((tag, buf));
            }
        });
        assert_eq!(back.len(), 1);
        assert_eq!((back[0].0, &*back[0].1), (7, &b"head"[..]));
        assert_eq!(
            Arc::strong_count(&tensor),
            1,
            "{backend}: shared tensor released"
        );
        let mut out = [0u8; 7];
        b.read_exact(&mut out).unwrap();
        assert_eq!(&out, b"headxyz");
        d.deregister(0);
    }
}

#[test]
fn dropping_a_loop_with_receives_in_flight_drains_them_and_closes_its_sockets() {
    let cfg = Arc::new(Config::builder("ps", 0).build().unwrap());
    let shared = Arc::new(LoopShared::new().unwrap());
    let (backend, _) = crate::sys::select(cfg.backend).unwrap();
    let listener = socket::listen_tcp("127.0.0.1:0".parse().unwrap(), 16).unwrap();
    let parts = LoopParts {
        session: SessionParts {
            service: None,
            rendezvous: None,
            jobs: None,
            index: 0,
            allocator: Arc::new(HeapAllocator::default()),
            zero_copy_min: 16 << 10,
            budget: crate::session::Budget::of(&cfg),
            checkpoints: None,
            no_checkpoints: "no tables",
        },
        accepted: Arc::new(AtomicUsize::new(0)),
    };
    let mut lp = Loop::new(cfg, shared, backend, Some(listener), parts).unwrap();
    let mut client = std::net::TcpStream::connect(lp.local_addr().unwrap()).unwrap();
    // Turn until the accepted connection has a receive in flight (it waits for HELLO).
    while !lp.io_in_flight() {
        lp.poll_local(Some(Duration::from_millis(10)));
    }
    drop(lp);
    // The loop's socket was closed, not leaked: the client reads the end of the stream.
    // (The timeout only bounds a failing run.)
    client
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut buf = [0u8; 64];
    match read_through_signals(&mut client, &mut buf) {
        Ok(n) => assert_eq!(n, 0, "unexpected bytes"),
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
    }
}

#[test]
fn a_socket_in_the_io_uring_file_table_closes_once_deregistered() {
    if !backends().contains(&Backend::Uring) {
        return;
    }
    let (mut d, _shared) = driver(Backend::Uring);
    assert!(d.features().fixed_files, "{}", d.features());
    // Entered at slot 3: a receive names it by index and works.
    let (a, mut b) = UnixStream::pair().unwrap();
    a.set_nonblocking(true).unwrap();
    d.register(3, a.as_raw_fd()).unwrap();
    d.recv(
        3,
        a.as_raw_fd(),
        RecvMem::Buffer(vec![0; 16]),
        0,
        16,
        true,
        None,
    )
    .unwrap();
    b.write_all(b"hi").unwrap();
    assert_eq!(reap(&mut d, Op::Recv), 2);
    drop(d.take_recv(3));
    // While the table holds it, closing the descriptor alone leaves the socket open: the
    // peer reads no end of stream.
    let (c, mut e) = UnixStream::pair().unwrap();
    d.register(4, c.as_raw_fd()).unwrap();
    drop(c);
    e.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    let mut buf = [0u8; 8];
    let err = read_through_signals(&mut e, &mut buf).expect_err("the table keeps it open");
    assert!(
        matches!(
            err.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
        "{err}"
    );
    // Deregistered, then closed: the peer reads the end of the stream at once.
    d.deregister(3);
    drop(a);
    b.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    assert_eq!(read_through_signals(&mut b, &mut buf).unwrap(), 0);
    // And the socket left behind in the table goes with the driver.
    drop(d);
    e.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    assert_eq!(read_through_signals(&mut e, &mut buf).unwrap(), 0);
}

/// `read`, again when interrupted: a socket read with a timeout on a thread that drives
/// a ring may be interrupted once by the ring's task work.
fn read_through_signals(s: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    loop {
        match s.read(buf) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            r => return r,
        }
    }
}

/// On io_uring with task-work flags one accept takes every connection that arrives (a
/// multishot accept) and calling again while it is in the kernel changes nothing; with
/// one-shot accepts, calling again after each completion takes them all.
#[test]
fn accepts_take_every_connection_on_both_backends() {
    for backend in backends() {
        let (mut d, _shared) = driver(backend);
        let listener = socket::listen_tcp("127.0.0.1:0".parse().unwrap(), 16).unwrap();
        let addr = socket::local_addr(&listener).unwrap();
        let fd = listener.as_raw_fd();
        d.register(LISTENER, fd).unwrap();
        d.accept(LISTENER, fd).unwrap();
        let f = d.features();
        let multishot = backend == Backend::Uring && (f.defer_taskrun || f.coop_taskrun);
        if multishot {
            d.accept(LISTENER, fd).unwrap(); // a no-op: one is in the kernel
        }
        let clients: Vec<_> = (0..5)
            .map(|_| std::net::TcpStream::connect(addr).unwrap())
            .collect();
        let mut accepted = Vec::new();
        let give_up = Instant::now() + Duration::from_secs(30);
        while accepted.len() < clients.len() {
            assert!(
                Instant::now() < give_up,
                "{backend}: {} of 5 accepted",
                accepted.len()
            );
            let mut done = 0;
            d.complete(true, Some(Duration::from_secs(5)), |c| {
                if let IoCompletion::Accepted(r) = c {
                    accepted.push(r.expect("accepted"));
                    done += 1;
                }
            })
            .unwrap();
            if !multishot {
                for _ in 0..done {
                    d.accept(LISTENER, fd).unwrap();
                }
            }
        }
        assert_eq!(accepted.len(), 5, "{backend}");
        d.shutdown(LISTENER, fd);
        drop(clients);
    }
}

/// Reaps completions until an accept's arrives; its result.
fn next_accept(d: &mut LoopDriver) -> std::io::Result<Socket> {
    let mut got = None;
    let give_up = Instant::now() + Duration::from_secs(30);
    while got.is_none() {
        assert!(Instant::now() < give_up, "no accept completed");
        d.complete(true, Some(Duration::from_secs(5)), |c| {
            if let IoCompletion::Accepted(r) = c {
                got = Some(r);
            }
        })
        .unwrap();
    }
    got.unwrap()
}

/// With direct accept, the kernel puts accepted sockets in its part of the file table, with
/// no descriptor: operations name them by index, and closing one is seen by its peer. When
/// that part is full the accept fails with ENFILE (the kernel closes the connection it
/// took), and the next accepts are into descriptors.
#[test]
fn direct_accepts_fill_the_kernels_part_of_the_file_table_then_fall_back_to_descriptors() {
    if !backends().contains(&Backend::Uring) {
        return;
    }
    let (mut d, _shared) = driver(Backend::Uring);
    if !d.features().direct_accept {
        // A kernel without the task-work flags, the file table or its allocation range
        // (Linux 6.0): nothing to test.
        return;
    }
    d.file_table_for_test(2, 2);
    let listener = socket::listen_tcp("127.0.0.1:0".parse().unwrap(), 16).unwrap();
    let addr = socket::local_addr(&listener).unwrap();
    let fd = listener.as_raw_fd();
    d.register(LISTENER, fd).unwrap();
    d.accept(LISTENER, fd).unwrap();
    let accept_one = |d: &mut LoopDriver, client: &mut Vec<std::net::TcpStream>| {
        client.push(std::net::TcpStream::connect(addr).unwrap());
        next_accept(d)
    };
    let mut clients = Vec::new();
    let mut direct = Vec::new();
    for slot in 0..2 {
        match accept_one(&mut d, &mut clients) {
            Ok(Socket::Direct(index)) => {
                // The kernel's part is after the loop's two entries.
                assert!((2..4).contains(&index), "index {index}");
                d.adopt_direct(slot, index).unwrap();
                direct.push(index);
            }
            other => panic!("accept {slot}: {other:?}"),
        }
    }
    assert_ne!(direct[0], direct[1]);
    assert!(d.accepting(), "the multishot accept goes on");

    // A receive on slot 1 names its socket by index (the fd given is -1).
    let drops = Arc::new(AtomicUsize::new(0));
    let mem = RecvMem::Memory(counted(16, &drops));
    d.recv(1, -1, mem, 0, 5, false, None).unwrap();
    clients[1].write_all(b"hello").unwrap();
    assert_eq!(reap(&mut d, Op::Recv), 5);
    let Some(RecvMem::Memory(mut m)) = d.take_recv(1) else {
        panic!("memory not given back");
    };
    assert_eq!(&m.bytes_mut()[..5], b"hello");

    // The third finds the kernel's part full: the accept ends with ENFILE and the kernel
    // closes that connection.
    let err = accept_one(&mut d, &mut clients).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENFILE), "{err}");
    assert!(!d.accepting(), "an error ends the multishot accept");
    clients[2]
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut buf = [0u8; 8];
    match clients[2].read(&mut buf) {
        Ok(0) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("the refused connection read {other:?}"),
    }

    // Then accepts are into descriptors, and the loop may re-arm at once.
    assert!(d.direct_accept_full());
    d.accept(LISTENER, fd).unwrap();
    match accept_one(&mut d, &mut clients) {
        Ok(Socket::Fd(_)) => {}
        other => panic!("after ENFILE: {other:?}"),
    }

    // Closing a direct socket: its peer sees the end of the stream.
    d.deregister(0);
    d.submit_pending().unwrap();
    clients[0]
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    assert_eq!(
        clients[0].read(&mut buf).unwrap(),
        0,
        "closed by the driver"
    );
    // The other one is still open.
    clients[1].set_nonblocking(true).unwrap();
    assert_eq!(
        clients[1].read(&mut buf).unwrap_err().kind(),
        std::io::ErrorKind::WouldBlock
    );

    // With a quarter of the kernel's part free again (here: one of two entries), the
    // accept into descriptors is cancelled, and the next accept is direct again, into the
    // freed entry.
    assert!(!d.direct_accept_full());
    let err = next_accept(&mut d).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ECANCELED), "{err}");
    assert!(!d.accepting());
    d.accept(LISTENER, fd).unwrap();
    match accept_one(&mut d, &mut clients) {
        Ok(Socket::Direct(index)) => {
            assert_eq!(index, direct[0], "the freed entry");
            d.adopt_direct(0, index).unwrap();
        }
        other => panic!("after an entry was freed: {other:?}"),
    }

    // A direct socket closed with a multishot receive in the kernel on it: the shutdown
    // before the close ends the receive (the driver drains it), and the peer sees the end.
    if d.features().multishot_recv {
        let last = clients.len() - 1;
        clients[last].write_all(b"one").unwrap();
        d.recv(0, -1, RecvMem::Buffer(vec![0; 64]), 0, 64, true, None)
            .unwrap();
        assert_eq!(reap(&mut d, Op::Recv), 3);
        drop(d.take_recv(0));
        assert_eq!(
            d.in_flight(),
            1,
            "the multishot receive stays in the kernel"
        );
        d.deregister(0);
        d.submit_pending().unwrap();
        clients[last]
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        assert_eq!(
            clients[last].read(&mut buf).unwrap(),
            0,
            "closed by the driver"
        );
    }
    d.deregister(1);
    d.shutdown(LISTENER, fd);
    assert!(d.drain(), "operations left in the kernel");
}

mod multishot;
