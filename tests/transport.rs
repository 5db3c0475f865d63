//! Pull and push over real sockets: contents preserved exactly, zero-copy receive of large
//! tensors, allocator hooks (failing ones too), chunked transfers with pings interleaved.

mod common;

use common::*;
use starwire::{DType, Status};
use starwire::{
    ErrorKind, Options, Runtime, Service, Tensor, TensorAllocator, TensorDesc, TensorMemory, Ticket,
};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A parameter store: pull reads, push adds (f32) element-wise.
#[derive(Default)]
struct Store {
    vars: Mutex<HashMap<u64, Arc<Tensor>>>,
}

impl Service for Store {
    fn pull(&self, ids: &[u64], out: &mut Vec<Result<Arc<Tensor>, Status>>) {
        let vars = self.vars.lock().unwrap();
        out.extend(
            ids.iter()
                .map(|id| vars.get(id).cloned().ok_or(Status::NotFound)),
        );
    }

    fn push(&self, items: &mut Vec<(u64, Tensor)>, statuses: &mut Vec<Status>) {
        let mut vars = self.vars.lock().unwrap();
        for (id, grad) in items.drain(..) {
            let status = match vars.get(&id).cloned() {
                None => {
                    vars.insert(id, Arc::new(grad));
                    Status::Ok
                }
                Some(old) if old.dims() != grad.dims() || old.dtype() != DType::F32 => {
                    Status::InvalidArgument
                }
                Some(old) => {
                    let sum: Vec<f32> = old
                        .to_f32()
                        .iter()
                        .zip(grad.to_f32())
                        .map(|(a, b)| a + b)
                        .collect();
                    vars.insert(id, Arc::new(Tensor::from_f32(old.dims(), &sum).unwrap()));
                    Status::Ok
                }
            };
            statuses.push(status);
        }
    }
}

fn serve(store: Arc<Store>) -> Runtime {
    Runtime::start_with(
        config("ps", 2).build().unwrap(),
        Options {
            service: Some(store),
            ..Options::listen("127.0.0.1:0".parse().unwrap())
        },
    )
    .unwrap()
}

fn wait_ok<K: starwire::client::Kind>(h: &mut starwire::Handle, t: Ticket<K>) -> K::Output {
    h.wait(t).unwrap_or_else(|e| panic!("request failed: {e}"))
}

/// Deterministic contents for tensor `id` of `len` bytes.
fn pattern(id: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u64).wrapping_mul(2654435761).wrapping_add(id) as u8)
        .collect()
}

#[test]
fn push_then_pull_sees_the_update() {
    let store = Arc::new(Store::default());
    let server = serve(store.clone());
    let addr = server.local_addr().unwrap();
    let client = client(1);
    let mut h = client.handle(16);
    let w = Arc::new(Tensor::from_f32(&[2, 2], &[1.0, 2.0, 3.0, 4.0]).unwrap());
    let t = h.push(addr, vec![(7, w)], secs(10)).unwrap();
    assert_eq!(wait_ok(&mut h, t), vec![Status::Ok]);
    let g = Arc::new(Tensor::from_f32(&[2, 2], &[0.5, 0.5, 0.5, 0.5]).unwrap());
    let bad = Arc::new(Tensor::from_f32(&[3], &[1.0, 1.0, 1.0]).unwrap());
    let t = h.push(addr, vec![(7, g), (7, bad)], secs(10)).unwrap();
    assert_eq!(
        wait_ok(&mut h, t),
        vec![Status::Ok, Status::InvalidArgument]
    );
    let t = h.pull(addr, vec![7, 8], secs(10)).unwrap();
    let v = wait_ok(&mut h, t);
    assert_eq!(v.len(), 2);
    let t7 = v[0].as_ref().unwrap();
    assert_eq!(t7.dims(), [2, 2]);
    assert_eq!(t7.to_f32(), [1.5, 2.5, 3.5, 4.5]);
    assert_eq!(v[1].as_ref().unwrap_err(), &Status::NotFound);
}

/// Sizes from 0 B to 64 MiB, with several dtypes and shapes.
fn mixed_tensors() -> Vec<(u64, Tensor)> {
    let specs: &[(DType, &[u64])] = &[
        (DType::F32, &[0]),
        (DType::U8, &[1]),
        (DType::BF16, &[3, 5]),
        (DType::I64, &[2, 3, 4]),
        (DType::F16, &[1000]),
        (DType::F64, &[64, 64]),
        (DType::Bool, &[]),
        (DType::F32, &[1 << 20]),      // 4 MiB: exactly one chunk
        (DType::U8, &[(4 << 20) + 1]), // just over a chunk
        (DType::F32, &[16 << 20]),     // 64 MiB
    ];
    specs
        .iter()
        .enumerate()
        .map(|(i, (dtype, dims))| {
            let len = dtype.size().unwrap() * dims.iter().product::<u64>();
            let t = Tensor::from_bytes(*dtype, dims, pattern(i as u64, len as usize)).unwrap();
            (i as u64, t)
        })
        .collect()
}

#[test]
fn pull_preserves_dtype_shape_and_contents_from_0_bytes_to_64_mib() {
    let store = Arc::new(Store::default());
    let originals = mixed_tensors();
    {
        let mut vars = store.vars.lock().unwrap();
        for (id, t) in &originals {
            let copy = Tensor::from_bytes(t.dtype(), t.dims(), t.bytes().to_vec()).unwrap();
            vars.insert(*id, Arc::new(copy));
        }
    }
    let server = serve(store);
    let addr = server.local_addr().unwrap();
    let client = client(1);
    let mut h = client.handle(16);
    let ids: Vec<u64> = originals.iter().map(|(id, _)| *id).collect();
    let t = h.pull(addr, ids, secs(60)).unwrap();
    let v = wait_ok(&mut h, t);
    assert_eq!(v.len(), originals.len());
    for ((_, want), got) in originals.iter().zip(&v) {
        let got = got.as_ref().expect("tensor");
        assert_eq!(got.dtype(), want.dtype());
        assert_eq!(got.dims(), want.dims());
        assert!(got.bytes() == want.bytes(), "contents of {:?}", want.dims());
    }
    let stats = client.stats();
    let total: u64 = originals.iter().map(|(_, t)| t.byte_len() as u64).sum();
    assert_eq!(stats.payload_direct + stats.payload_copied, total);
    // Large tensors land in place; at most a receive buffer's read-ahead per frame is copied.
    assert!(stats.payload_direct > total * 9 / 10, "{stats:?}");
}

#[test]
fn push_of_large_tensors_lands_in_the_server_allocator_memory() {
    struct Counting(AtomicUsize);
    impl TensorAllocator for Counting {
        fn allocate(&self, d: &TensorDesc<'_>) -> Option<Box<dyn TensorMemory>> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Some(Box::new(vec![0u8; d.byte_len as usize]))
        }
    }
    let store = Arc::new(Store::default());
    let alloc = Arc::new(Counting(AtomicUsize::new(0)));
    let server = Runtime::start_with(
        config("ps", 1).build().unwrap(),
        Options {
            service: Some(store.clone()),
            allocator: Some(alloc.clone()),
            ..Options::listen("127.0.0.1:0".parse().unwrap())
        },
    )
    .unwrap();
    let addr = server.local_addr().unwrap();
    let client = client(1);
    let mut h = client.handle(4);
    let items: Vec<(u64, Arc<Tensor>)> = mixed_tensors()
        .into_iter()
        .map(|(id, t)| (id + 100, Arc::new(t)))
        .collect();
    let n = items.len();
    let t = h.push(addr, items, secs(60)).unwrap();
    assert_eq!(wait_ok(&mut h, t), vec![Status::Ok; n]);
    // One allocation per live tensor (the dead-free set here has no dead ones).
    assert_eq!(alloc.0.load(Ordering::SeqCst), n);
    let vars = store.vars.lock().unwrap();
    for (id, want) in mixed_tensors() {
        let got = &vars[&(id + 100)];
        assert!(got.bytes() == want.bytes() && got.dims() == want.dims());
    }
    let total: u64 = mixed_tensors()
        .iter()
        .map(|(_, t)| t.byte_len() as u64)
        .sum();
    let stats = server.stats();
    assert_eq!(stats.payload_direct + stats.payload_copied, total);
    assert!(stats.payload_direct > total * 9 / 10, "{stats:?}");
}

/// Hands out the caller's own buffers, in order.
struct Preallocated(Mutex<Vec<Vec<u8>>>);

impl TensorAllocator for Preallocated {
    fn allocate(&self, d: &TensorDesc<'_>) -> Option<Box<dyn TensorMemory>> {
        let buf = self.0.lock().unwrap().pop()?;
        (buf.len() as u64 >= d.byte_len).then(|| Box::new(buf) as Box<dyn TensorMemory>)
    }
}

#[test]
fn allocator_hook_is_called_once_per_tensor_and_failures_fail_only_that_tensor() {
    let store = Arc::new(Store::default());
    {
        let mut vars = store.vars.lock().unwrap();
        for id in 0..3u64 {
            let t = Tensor::from_bytes(DType::U8, &[100_000], pattern(id, 100_000)).unwrap();
            vars.insert(id, Arc::new(t));
        }
    }
    let server = serve(store);
    let addr = server.local_addr().unwrap();
    let client = client(1);
    let mut h = client.handle(4);
    // Two buffers for three tensors: the third allocation fails.
    let alloc = Arc::new(Preallocated(Mutex::new(vec![
        vec![0; 100_000],
        vec![0; 100_000],
    ])));
    let t = h
        .pull_into(addr, vec![0, 1, 2], alloc.clone(), secs(10))
        .unwrap();
    let v = wait_ok(&mut h, t);
    assert_eq!(v[0].as_ref().unwrap().bytes(), &pattern(0, 100_000)[..]);
    assert_eq!(v[1].as_ref().unwrap().bytes(), &pattern(1, 100_000)[..]);
    assert_eq!(v[2].as_ref().unwrap_err(), &Status::ResourceExhausted);
    assert!(alloc.0.lock().unwrap().is_empty());
    // The connection goes on.
    assert!(ping_once(&client, addr, secs(10)).is_ok());
    let t = h.pull(addr, vec![2], secs(10)).unwrap();
    assert!(wait_ok(&mut h, t)[0].is_ok());
}

/// `len` bytes, cheap to make in a debug build: a constant with a marker every 4 KiB.
fn marked(len: usize) -> Vec<u8> {
    let mut v = vec![0xA5u8; len];
    for (i, at) in (0..len).step_by(4096).enumerate() {
        v[at] = i as u8;
    }
    v
}

#[test]
fn a_64_mib_tensor_is_received_in_place() {
    let store = Arc::new(Store::default());
    let t = Tensor::from_bytes(DType::U8, &[64 << 20], marked(64 << 20)).unwrap();
    store.vars.lock().unwrap().insert(1, Arc::new(t));
    let server = serve(store);
    let addr = server.local_addr().unwrap();
    let client = client(1);
    let mut h = client.handle(2);
    let t = h.pull(addr, vec![1], secs(60)).unwrap();
    let v = wait_ok(&mut h, t);
    assert!(v[0].as_ref().unwrap().bytes() == &marked(64 << 20)[..]);
    let stats = client.stats();
    eprintln!(
        "64 MiB pull: {} bytes in place, {} copied",
        stats.payload_direct, stats.payload_copied
    );
    // Every payload byte went from the socket straight into the tensor: the response's
    // header and meta were read on their own, so no payload was read ahead into the
    // receive buffer.
    assert_eq!(stats.payload_direct, 64 << 20, "{stats:?}");
    assert_eq!(stats.payload_copied, 0, "{stats:?}");
}

#[test]
fn pings_interleave_with_a_1_gib_chunked_transfer() {
    let store = Arc::new(Store::default());
    let big = Tensor::from_bytes(DType::U8, &[1 << 30], marked(1 << 30)).unwrap();
    store.vars.lock().unwrap().insert(9, Arc::new(big));
    let server = serve(store);
    let addr = server.local_addr().unwrap();
    let client = Runtime::start(config("worker", 2).build().unwrap(), None).unwrap();
    let mut bulk = client.handle(2);
    assert!(ping_once(&client, addr, secs(10)).is_ok());
    let start = Instant::now();
    let t = bulk.pull(addr, vec![9], secs(300)).unwrap();
    // Pings on the same connection while the 1 GiB answer streams in.
    let mut h = client.handle(4);
    let mut rtts = Vec::new();
    let done = loop {
        if let Some(c) = bulk.poll() {
            break c;
        }
        let p = h.ping(addr, 16, secs(30)).unwrap();
        rtts.push(h.wait(p).unwrap());
        assert!(
            start.elapsed() < Duration::from_secs(240),
            "transfer did not finish"
        );
    };
    assert_eq!(done.tag, t.tag());
    match done.into_pulled() {
        Ok(v) => {
            let got = v[0].as_ref().unwrap();
            assert_eq!(got.byte_len(), 1 << 30);
            assert!(got.bytes() == &marked(1 << 30)[..]);
        }
        other => panic!("{other:?}"),
    }
    let took = start.elapsed();
    rtts.sort();
    let (pings, median, worst) = (rtts.len(), rtts[rtts.len() / 2], rtts[rtts.len() - 1]);
    eprintln!(
        "{pings} pings during a 1 GiB chunked pull of {took:?}; median {median:?}, worst {worst:?}"
    );
    // Counts and relative timing, not a wall-clock bound: pings went on all through the
    // transfer, a typical one taking a small part of it.
    assert!(pings >= 10, "pings were not interleaved: {pings}");
    assert!(
        median * 20 < took,
        "median ping {median:?} of a {took:?} transfer"
    );
}

#[test]
fn a_request_to_a_peer_without_service_fails_cleanly() {
    let server = server(1);
    let addr = server.local_addr().unwrap();
    let client = client(1);
    let mut h = client.handle(4);
    let t = h.pull(addr, vec![1], secs(10)).unwrap();
    assert_eq!(
        h.wait(t).err().map(|e| e.kind()),
        Some(ErrorKind::Remote(Status::Unimplemented))
    );
    assert!(ping_once(&client, addr, secs(10)).is_ok());
}

#[test]
fn peer_lost_mid_transfer_fails_the_request() {
    // A raw server that answers the handshake, declares a huge chunked tensor, sends part
    // of it and disconnects.
    use starwire::proto::{Encoder, EncoderConfig, OutTensor, ResponseItem};
    use starwire::wire::{Header, HeaderRepr, HelloRepr, Limits, TensorMeta, HEADER_LEN};
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        // Read HELLO (header + meta), answer HELLO_ACK.
        let mut hdr = [0u8; HEADER_LEN];
        s.read_exact(&mut hdr).unwrap();
        let h = HeaderRepr::parse(&Header::new_unchecked(&hdr[..]), &Limits::default()).unwrap();
        let mut meta = vec![0u8; h.meta_len as usize];
        s.read_exact(&mut meta).unwrap();
        let mut enc = Encoder::new(EncoderConfig {
            chunk_size: 1 << 20,
            ..EncoderConfig::default()
        });
        let ack = HelloRepr {
            cluster_id: 0,
            task_index: 0,
            limits: starwire::Limits {
                max_frame: 1 << 24,
                ..Default::default()
            },
            job: b"ps",
            token: b"",
            features: starwire::wire::WireFeatures::NONE,
        };
        enc.hello(&ack, true).unwrap();
        let data = vec![1u8; 64 << 20];
        // Writes what the encoder holds, at most `limit` bytes; returns the bytes written.
        let flush = |enc: &mut Encoder, s: &mut std::net::TcpStream, limit: u64| -> usize {
            enc.fill(limit);
            let mut out = Vec::new();
            for p in enc.pieces() {
                if out.len() as u64 >= limit {
                    break;
                }
                match p {
                    starwire::proto::Piece::Bytes(b) => out.extend_from_slice(b),
                    starwire::proto::Piece::Tensor { offset, len, .. } => {
                        out.extend_from_slice(&data[offset as usize..(offset + len) as usize])
                    }
                }
            }
            s.write_all(&out).unwrap();
            enc.advance(out.len() as u64);
            out.len()
        };
        flush(&mut enc, &mut s, u64::MAX);
        // Read the PULL.
        s.read_exact(&mut hdr).unwrap();
        let h = HeaderRepr::parse(&Header::new_unchecked(&hdr[..]), &Limits::default()).unwrap();
        let mut meta = vec![0u8; h.meta_len as usize];
        s.read_exact(&mut meta).unwrap();
        let dims = [64u64 << 20];
        let item = ResponseItem {
            versions: Default::default(),
            index: 0,
            status: Status::Ok,
            tensor: Some(OutTensor {
                meta: TensorMeta::new(DType::U8, &dims).unwrap(),
                bytes: &data,
                token: 1,
            }),
            missing: Default::default(),
        };
        enc.response(h.handle, true, &[item]).unwrap();
        // Send the response and about 3 MiB of chunks, then vanish.
        let mut sent = 0usize;
        while sent < 3 << 20 {
            sent += flush(&mut enc, &mut s, 1 << 20);
        }
        drop(s);
    });
    let client = client(1);
    let mut h = client.handle(4);
    let start = Instant::now();
    let t = h.pull(addr, vec![5], secs(30)).unwrap();
    assert_eq!(
        h.wait(t).err().map(|e| e.kind()),
        Some(ErrorKind::ConnectionLost)
    );
    assert!(
        start.elapsed() < Duration::from_secs(29),
        "failed only at its deadline"
    );
    server.join().unwrap();
}

/// A service whose pull blocks until the test opens its gate.
#[derive(Default)]
struct Gated {
    started: AtomicBool,
    open: std::sync::Mutex<bool>,
    opened: std::sync::Condvar,
}

impl Gated {
    fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.opened.notify_all();
    }
}

impl Service for Gated {
    fn pull(&self, ids: &[u64], out: &mut Vec<Result<Arc<Tensor>, Status>>) {
        self.started.store(true, Ordering::SeqCst);
        let mut open = self.open.lock().unwrap();
        while !*open {
            open = self.opened.wait(open).unwrap();
        }
        out.extend(
            ids.iter()
                .map(|&id| Ok(Arc::new(Tensor::from_f32(&[1], &[id as f32]).unwrap()))),
        );
    }
}

/// Whether a ping to a 1-loop server is answered while a pull's handler is blocked.
fn ping_answered_while_a_handler_blocks(handler_threads: usize) -> bool {
    let service = Arc::new(Gated::default());
    let server = Runtime::start_with(
        config("ps", 1).build().unwrap(),
        Options {
            service: Some(service.clone()),
            handler_threads: Some(handler_threads),
            ..Options::listen("127.0.0.1:0".parse().unwrap())
        },
    )
    .unwrap();
    let addr = server.local_addr().unwrap();
    let client = Runtime::start(
        config("worker", 1).connections_per_peer(2).build().unwrap(),
        None,
    )
    .unwrap();
    let mut h = client.handle(8);
    // Open both lanes first.
    for _ in 0..2 {
        let t = h.ping(addr, 8, secs(10)).unwrap();
        assert!(h.wait(t).is_ok());
    }
    let pull = h.pull(addr, vec![3, 4], secs(30)).unwrap();
    while !service.started.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(1));
    }
    let ping = h.ping(addr, 8, secs(30)).unwrap();
    let answered = if handler_threads > 0 {
        // The loop is free: the ping comes back while the handler is still blocked.
        assert!(h.wait(ping).is_ok());
        true
    } else {
        // The loop runs the handler: nothing can come back until the gate opens.
        std::thread::sleep(Duration::from_millis(50));
        let early = h.poll().is_some();
        service.open();
        assert!(h.wait(ping).is_ok());
        early
    };
    service.open();
    match h.wait(pull) {
        Ok(v) => {
            assert_eq!(v[0].as_ref().unwrap().to_f32(), [3.0]);
            assert_eq!(v[1].as_ref().unwrap().to_f32(), [4.0]);
        }
        other => panic!("{other:?}"),
    }
    answered
}

#[test]
fn heavy_handlers_on_the_pool_do_not_stall_the_loop() {
    assert!(ping_answered_while_a_handler_blocks(2), "pooled");
    assert!(!ping_answered_while_a_handler_blocks(0), "inline");
}

#[test]
fn declared_chunked_tensors_get_no_memory_before_their_bytes_arrive() {
    use starwire::proto::{Encoder, EncoderConfig, OutTensor, PushItem};
    use starwire::wire::{HelloRepr, TensorMeta};
    use std::io::{Read, Write};
    struct Counting(AtomicUsize);
    impl TensorAllocator for Counting {
        fn allocate(&self, d: &TensorDesc<'_>) -> Option<Box<dyn TensorMemory>> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Some(Box::new(vec![0u8; d.byte_len as usize]))
        }
    }
    let alloc = Arc::new(Counting(AtomicUsize::new(0)));
    let server = Runtime::start_with(
        config("ps", 1).build().unwrap(),
        Options {
            service: Some(Arc::new(Store::default())),
            allocator: Some(alloc.clone()),
            ..Options::listen("127.0.0.1:0".parse().unwrap())
        },
    )
    .unwrap();
    let addr = server.local_addr().unwrap();
    // A raw client: HELLO, then a PUSH announcing 1,000 chunked tensors of 1 GiB each,
    // and not one chunk.
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    let mut enc = Encoder::new(EncoderConfig::default());
    let hello = HelloRepr {
        cluster_id: 0,
        task_index: 0,
        limits: starwire::Limits {
            max_frame: 1 << 24,
            ..Default::default()
        },
        job: b"worker",
        token: b"",
        features: starwire::wire::WireFeatures::NONE,
    };
    enc.hello(&hello, false).unwrap();
    let dims = [1u64 << 30];
    let items: Vec<PushItem<'_>> = (0..1000)
        .map(|i| PushItem {
            var_id: i,
            tensor: OutTensor {
                meta: TensorMeta::new(DType::U8, &dims).unwrap(),
                bytes: &[],
                token: i,
            },
        })
        .collect();
    enc.push(1 << 32 | 1, &items).unwrap();
    let mut out = Vec::new();
    for p in enc.pieces() {
        if let starwire::proto::Piece::Bytes(b) = p {
            out.extend_from_slice(b);
        }
    }
    s.write_all(&out).unwrap();
    let mut ack = [0u8; 32];
    s.read_exact(&mut ack).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        alloc.0.load(Ordering::SeqCst),
        0,
        "memory taken before any chunk"
    );
    // The server is fine and serves others.
    let client = client(1);
    assert!(ping_once(&client, addr, secs(10)).is_ok());
}

#[test]
fn a_peer_reusing_our_handle_for_its_push_cannot_redirect_our_answer() {
    use starwire::proto::{Encoder, EncoderConfig, OutTensor, Piece, PushItem, ResponseItem};
    use starwire::wire::{Header, HeaderRepr, HelloRepr, Limits, TensorMeta, HEADER_LEN};
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let read_frame = |s: &mut std::net::TcpStream| {
            let mut hdr = [0u8; HEADER_LEN];
            s.read_exact(&mut hdr).unwrap();
            let h =
                HeaderRepr::parse(&Header::new_unchecked(&hdr[..]), &Limits::default()).unwrap();
            let mut rest = vec![0u8; (h.meta_len + h.payload_len) as usize];
            s.read_exact(&mut rest).unwrap();
            h
        };
        // The answer is sent inline (under the chunk size, over the zero-copy threshold);
        // the decoy push is chunked, so its tensor is still incomplete when the answer comes.
        let answer = vec![0x11u8; 32_000];
        let decoy = vec![0xEEu8; 100_000];
        let send = |enc: &mut Encoder, s: &mut std::net::TcpStream| {
            enc.fill(u64::MAX);
            let mut out = Vec::new();
            for p in enc.pieces() {
                match p {
                    Piece::Bytes(b) => out.extend_from_slice(b),
                    Piece::Tensor { token, offset, len } => {
                        let src = if token == 1 { &answer } else { &decoy };
                        out.extend_from_slice(&src[offset as usize..(offset + len) as usize]);
                    }
                }
            }
            s.write_all(&out).unwrap();
            enc.advance(out.len() as u64);
        };
        read_frame(&mut s); // HELLO
        let mut enc = Encoder::new(EncoderConfig {
            chunk_size: 64 << 10,
            ..EncoderConfig::default()
        });
        let ack = HelloRepr {
            cluster_id: 0,
            task_index: 0,
            limits: starwire::Limits {
                max_frame: 1 << 24,
                ..Default::default()
            },
            job: b"ps",
            token: b"",
            features: starwire::wire::WireFeatures::NONE,
        };
        enc.hello(&ack, true).unwrap();
        send(&mut enc, &mut s);
        let pull = read_frame(&mut s); // our PULL: its handle is H
        let (decoy_dims, answer_dims) = ([100_000u64], [32_000u64]);
        // A PUSH with the same handle H, declaring a chunked tensor; its chunks come later.
        let push = PushItem {
            var_id: 1,
            tensor: OutTensor {
                meta: TensorMeta::new(DType::U8, &decoy_dims).unwrap(),
                bytes: &decoy,
                token: 2,
            },
        };
        enc.push(pull.handle, &[push]).unwrap();
        // The real answer to H, inline, sent before the push's chunks.
        let item = ResponseItem {
            versions: Default::default(),
            index: 0,
            status: Status::Ok,
            tensor: Some(OutTensor {
                meta: TensorMeta::new(DType::U8, &answer_dims).unwrap(),
                bytes: &answer,
                token: 1,
            }),
            missing: Default::default(),
        };
        // Frame order on the wire: PUSH header, RESPONSE, then the push's chunks.
        enc.fill(0);
        let mut out = Vec::new();
        let first: Vec<u8> = enc
            .pieces()
            .flat_map(|p| match p {
                Piece::Bytes(b) => b.to_vec(),
                Piece::Tensor { .. } => Vec::new(),
            })
            .collect();
        enc.advance(first.len() as u64);
        out.extend_from_slice(&first);
        s.write_all(&out).unwrap();
        enc.response(pull.handle, true, &[item]).unwrap();
        send(&mut enc, &mut s);
        // Keep the connection open until the client is done.
        let mut sink = [0u8; 1024];
        while let Ok(n) = s.read(&mut sink) {
            if n == 0 {
                break;
            }
        }
    });
    let client = client(1);
    let mut h = client.handle(4);
    let t = h.pull(addr, vec![1], secs(10)).unwrap();
    match h.wait(t) {
        Ok(v) => {
            let got = v[0].as_ref().unwrap();
            assert_eq!(got.byte_len(), 32_000);
            assert!(
                got.bytes().iter().all(|&b| b == 0x11),
                "answer was misrouted"
            );
        }
        other => panic!("{other:?}"),
    }
    client.shutdown();
    server.join().unwrap();
}

#[test]
fn tensors_over_the_receive_budget_fail_alone_and_the_connection_goes_on() {
    const MIB: u64 = 1 << 20;
    let f32s = |n_mib: u64| {
        let n = (n_mib * MIB / 4) as usize;
        Arc::new(Tensor::from_f32(&[n as u64], &vec![1.0; n]).unwrap())
    };
    // The server may hold 3 MiB of chunked tensors being received, 2 MiB per connection;
    // the client 2 MiB. Chunks of 256 KiB both ways.
    let store = Arc::new(Store::default());
    let server = Runtime::start_with(
        config("ps", 1)
            .recv_budget(3 * MIB)
            .conn_recv_budget(2 * MIB)
            .chunk_size(256 << 10)
            .build()
            .unwrap(),
        Options {
            service: Some(store.clone()),
            ..Options::listen("127.0.0.1:0".parse().unwrap())
        },
    )
    .unwrap();
    let addr = server.local_addr().unwrap();
    let client = Runtime::start(
        config("worker", 1)
            .recv_budget(2 * MIB)
            .chunk_size(256 << 10)
            .build()
            .unwrap(),
        None,
    )
    .unwrap();
    let mut h = client.handle(4);
    // A push of 3 MiB (over the connection's 2 MiB) and of 1 MiB: the first fails alone.
    let t = h
        .push(addr, vec![(1, f32s(3)), (2, f32s(1))], secs(30))
        .unwrap();
    assert_eq!(
        wait_ok(&mut h, t),
        vec![Status::ResourceExhausted, Status::Ok]
    );
    assert!(!store.vars.lock().unwrap().contains_key(&1));
    // The same connection goes on: a ping, and a push that fits.
    assert!(ping_once(&client, addr, secs(10)).is_ok());
    let t = h.push(addr, vec![(3, f32s(2))], secs(30)).unwrap();
    assert_eq!(wait_ok(&mut h, t), vec![Status::Ok]);
    let s = server.stats();
    assert_eq!((s.budget_refused, s.recv_reserved), (1, 0), "{s:?}");
    // Pulls: the client's own budget (2 MiB) refuses a 3 MiB answer, not the 1 MiB one.
    store.vars.lock().unwrap().insert(1, f32s(3));
    let t = h.pull(addr, vec![1, 2], secs(30)).unwrap();
    let v = wait_ok(&mut h, t);
    assert_eq!(v[0].as_ref().unwrap_err(), &Status::ResourceExhausted);
    assert_eq!(v[1].as_ref().unwrap().byte_len(), MIB as usize);
    let c = client.stats();
    assert_eq!((c.budget_refused, c.recv_reserved), (1, 0), "{c:?}");
    assert_eq!(c.connections_lost, 0);
}

#[test]
fn heartbeats_keep_an_idle_connection_open() {
    let beat = |job| {
        config(job, 1)
            .heartbeat_interval(Duration::from_millis(20))
            .heartbeat_timeout(Duration::from_secs(10))
    };
    let server = Runtime::start_with(
        beat("ps").build().unwrap(),
        Options::listen("127.0.0.1:0".parse().unwrap()),
    )
    .unwrap();
    let addr = server.local_addr().unwrap();
    let client = Runtime::start(beat("worker").build().unwrap(), None).unwrap();
    assert!(ping_once(&client, addr, secs(10)).is_ok());
    // Idle: both ends probe every 20 ms of silence and each answers the other's probes.
    let start = Instant::now();
    while client.stats().heartbeats_sent < 10 || server.stats().heartbeats_sent < 10 {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{:?}",
            client.stats()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(ping_once(&client, addr, secs(10)).is_ok());
    let (c, s) = (client.stats(), server.stats());
    assert_eq!((c.connections_lost, c.heartbeat_losses), (0, 0), "{c:?}");
    assert_eq!((s.connections_lost, s.heartbeat_losses), (0, 0), "{s:?}");
    assert_eq!((c.connections_opened, s.connections_accepted), (1, 1));
}
