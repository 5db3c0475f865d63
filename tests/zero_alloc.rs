//! No heap allocation per request in steady state: a pull of 100 small tensors and a push of
//! 100 small tensors, over real sockets, counted by this test binary's global allocator
//! across the whole process (client and server loops both run here). Contents are checked
//! on every request, so the allocation-free path is also the correct one.

mod common;

use common::*;
use starwire::client::Mode;
use starwire::{Client, Completion, Embedded, Options, Runtime, Service, Tensor};
use starwire::{DType, Status};
use std::sync::{Arc, Mutex};

#[path = "common/counting.rs"]
mod counting;

#[global_allocator]
static GLOBAL: counting::Counting = counting::Counting;

/// Allocation-counting tests must not overlap: the count is per process.
static SERIAL: Mutex<()> = Mutex::new(());

const N: usize = 100;
const LEN: usize = 64;

/// Variable `i` holds 64 bytes of value `i`; a push is accepted when each byte equals the
/// low byte of its id plus one.
struct Table {
    vars: Vec<Arc<Tensor>>,
}

impl Table {
    fn new() -> Table {
        let vars = (0..N as u64)
            .map(|i| {
                Arc::new(Tensor::from_slice(DType::U8, &[LEN as u64], &[i as u8; LEN]).unwrap())
            })
            .collect();
        Table { vars }
    }
}

impl Service for Table {
    fn pull(&self, ids: &[u64], out: &mut Vec<Result<Arc<Tensor>, Status>>) {
        out.extend(
            ids.iter()
                .map(|&i| self.vars.get(i as usize).cloned().ok_or(Status::NotFound)),
        );
    }

    fn push(&self, items: &mut Vec<(u64, Tensor)>, statuses: &mut Vec<Status>) {
        statuses.extend(items.iter().map(|(id, t)| {
            if t.bytes().iter().all(|&b| b == (*id as u8).wrapping_add(1)) {
                Status::Ok
            } else {
                Status::InvalidArgument
            }
        }));
    }
}

fn serve() -> Runtime {
    let options = Options {
        service: Some(Arc::new(Table::new())),
        ..Options::listen("127.0.0.1:0".parse().unwrap())
    };
    Runtime::start_with(config("ps", 1).build().unwrap(), options).expect("server starts")
}

fn ids() -> Vec<u64> {
    (0..N as u64).rev().collect()
}

fn grads() -> Vec<(u64, Arc<Tensor>)> {
    (0..N as u64)
        .map(|i| {
            let t = Tensor::from_slice(DType::U8, &[LEN as u64], &[(i as u8).wrapping_add(1); LEN]);
            (i, Arc::new(t.unwrap()))
        })
        .collect()
}

fn check_pulled(c: &Completion, ids: &[u64]) {
    let ts = c.pulled().expect("pull");
    assert_eq!(ts.len(), ids.len());
    for (t, &id) in ts.iter().zip(ids) {
        let t = t.as_ref().expect("pulled");
        assert_eq!(t.dims(), [LEN as u64]);
        assert_eq!(t.bytes(), [id as u8; LEN]);
    }
}

fn check_pushed(c: &Completion) {
    let s = c.pushed().expect("push");
    // Compared without building an expected vector: the check itself must not allocate.
    assert_eq!(s.len(), N);
    assert!(s.iter().all(|&st| st == Status::Ok), "{s:?}");
}

/// Runs `step` 200 times to warm up, then counts the allocations of 500 more.
fn allocations_per_request(mut step: impl FnMut()) -> u64 {
    for _ in 0..200 {
        step();
    }
    let before = counting::allocations();
    for _ in 0..500 {
        step();
    }
    counting::allocations() - before
}

/// Allocations over 500 steady-state pulls and 500 pushes through `client`, whichever
/// mode drives it: `pull_slice` / `wait_tag` / `recycle`.
fn steady_state<M: Mode>(client: &mut Client<M>, peer: std::net::SocketAddr) -> (u64, u64) {
    let ids = ids();
    let grads = grads();
    let pulls = allocations_per_request(|| {
        let t = client.pull_slice(peer, &ids, secs(10)).unwrap();
        let c = client.wait_tag(t.tag()).unwrap();
        check_pulled(&c, &ids);
        client.recycle(c);
    });
    let pushes = allocations_per_request(|| {
        let t = client.push_slice(peer, &grads, secs(10)).unwrap();
        let c = client.wait_tag(t.tag()).unwrap();
        check_pushed(&c);
        client.recycle(c);
    });
    (pulls, pushes)
}

#[test]
fn embedded_pull_and_push_allocate_nothing_in_steady_state() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let server = serve();
    let peer = server.local_addr().unwrap();
    let mut e = Embedded::new(config("worker", 1).build().unwrap(), None).unwrap();
    assert_eq!(
        steady_state(&mut e, peer),
        (0, 0),
        "allocations over 500 pulls, 500 pushes"
    );
}

#[test]
fn handle_pull_and_push_allocate_nothing_in_steady_state() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let server = serve();
    let peer = server.local_addr().unwrap();
    let rt = client(1);
    let mut h = rt.handle(64);
    assert_eq!(
        steady_state(&mut h, peer),
        (0, 0),
        "allocations over 500 pulls, 500 pushes"
    );
}

#[test]
fn without_recycling_a_pull_allocates_only_its_vectors() {
    // The plain calls still work and still keep tensors inline: what a pull allocates is
    // the vectors that cross the API (ids in, results out), not per-tensor memory.
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let server = serve();
    let peer = server.local_addr().unwrap();
    let mut e = Embedded::new(config("worker", 1).build().unwrap(), None).unwrap();
    let ids = ids();
    let pulls = allocations_per_request(|| {
        let t = e.pull(peer, ids.clone(), secs(10)).unwrap();
        let c = e.wait_tag(t.tag()).unwrap();
        check_pulled(&c, &ids);
    });
    assert!(pulls > 0, "the ids clone allocates");
    assert!(
        pulls <= 3 * 500,
        "{pulls} allocations over 500 pulls: more than the vectors crossing the API"
    );
}

/// What a sharded rows step allocates in steady state, across the whole process: nothing.
/// The client's vectors, the plan, the encoding and the serving allocate nothing, and the
/// blocks land in memory kept from earlier ones: a pulled block's memory comes back with
/// the recycled completion, a pushed gradient block's stays with the PS's loop once
/// applied.
/// With the request trace on, a request is a copy into the loop's ring, allocated at
/// start: still nothing per request.
#[test]
fn with_the_trace_on_pull_and_push_allocate_nothing_in_steady_state() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let server = serve();
    let peer = server.local_addr().unwrap();
    let cfg = config("worker", 1).trace(true).trace_events(4096);
    let rt = Runtime::start(cfg.build().unwrap(), None).unwrap();
    let mut h = rt.handle(64);
    assert_eq!(
        steady_state(&mut h, peer),
        (0, 0),
        "allocations over 500 pulls, 500 pushes, traced"
    );
}

#[test]
fn a_sharded_rows_step_allocates_nothing() {
    use starwire::rows::Partition;
    use starwire::rows::{Init, MemTable, Optimizer, Tables};
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let table = Arc::new(MemTable::new(16, Init::Zeros, Optimizer::Sgd { lr: 0.5 }));
    let options = Options {
        service: Some(Arc::new(Tables::new().with(1, table))),
        ..Options::listen("127.0.0.1:0".parse().unwrap())
    };
    let ps = Runtime::start_with(config("ps", 1).build().unwrap(), options).unwrap();
    let worker = client(1);
    let mut h = worker.handle(16);
    let peer = starwire::Peer::from(ps.local_addr().unwrap());
    let mut sharded =
        starwire::Sharded::new(vec![peer], Partition::Mod, 1, DType::F32, &[16]).unwrap();
    let ids: Vec<u64> = (0..100).map(|i| i * 7 % 64).collect();
    let mut out = vec![0u8; ids.len() * 64];
    let grads = vec![0u8; ids.len() * 64];
    let pulls = allocations_per_request(|| {
        let r = sharded.pull(&mut h, &ids, &mut out, secs(10)).unwrap();
        assert!(r.is_ok(), "{r:?}");
    });
    let pushes = allocations_per_request(|| {
        let r = sharded.push(&mut h, &ids, &grads, secs(10)).unwrap();
        assert!(r.is_ok(), "{r:?}");
    });
    eprintln!("500 sharded steps: {pulls} allocations for pulls, {pushes} for pushes");
    assert_eq!(pulls, 0, "allocations over 500 sharded pulls");
    assert_eq!(pushes, 0, "allocations over 500 sharded pushes");
    // The same steps with f32 rows: converted through a buffer the client keeps.
    let mut rows = vec![0f32; ids.len() * 16];
    let grads = vec![0.5f32; ids.len() * 16];
    let pulls = allocations_per_request(|| {
        let r = sharded
            .pull_typed(&mut h, &ids, &mut rows, secs(10))
            .unwrap();
        assert!(r.is_ok(), "{r:?}");
    });
    let pushes = allocations_per_request(|| {
        let r = sharded.push_typed(&mut h, &ids, &grads, secs(10)).unwrap();
        assert!(r.is_ok(), "{r:?}");
    });
    assert_eq!(pulls, 0, "allocations over 500 typed sharded pulls");
    assert_eq!(pushes, 0, "allocations over 500 typed sharded pushes");
}

#[test]
fn a_sharded_tables_step_allocates_nothing() {
    use starwire::rows::{Init, MemTable, Optimizer, Partition, ShardedTables, TableShape, Tables};
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let table = |dim| Arc::new(MemTable::new(dim, Init::Zeros, Optimizer::Sgd { lr: 0.5 }));
    let options = Options {
        service: Some(Arc::new(Tables::new().with(1, table(16)).with(2, table(4)))),
        ..Options::listen("127.0.0.1:0".parse().unwrap())
    };
    let ps = [0, 1]
        .map(|_| Runtime::start_with(config("ps", 1).build().unwrap(), options.clone()).unwrap());
    let worker = client(1);
    let mut h = worker.handle(16);
    let peers = ps
        .iter()
        .map(|p| starwire::Peer::from(p.local_addr().unwrap()))
        .collect();
    let (d1, d2) = ([16u64], [4u64]);
    let shape = |table, row_dims| TableShape {
        table,
        dtype: DType::F32,
        row_dims,
        partition: Partition::Mod,
    };
    let mut tables = ShardedTables::new(peers, &[shape(1, &d1), shape(2, &d2)]).unwrap();
    let a: Vec<u64> = (0..100).map(|i| i * 7 % 64).collect();
    let b: Vec<u64> = (0..30).map(|i| i * 3 % 20).collect();
    let (mut out_a, mut out_b) = (vec![0u8; a.len() * 64], vec![0u8; b.len() * 16]);
    let (grads_a, grads_b) = (vec![0u8; a.len() * 64], vec![0u8; b.len() * 16]);
    let ids = [a.as_slice(), b.as_slice()];
    let pulls = allocations_per_request(|| {
        let mut out = [out_a.as_mut_slice(), out_b.as_mut_slice()];
        let r = tables.pull(&mut h, &ids, &mut out, secs(10)).unwrap();
        assert!(r.is_ok(), "{r:?}");
    });
    let pushes = allocations_per_request(|| {
        let grads = [grads_a.as_slice(), grads_b.as_slice()];
        let r = tables.push(&mut h, &ids, &grads, secs(10)).unwrap();
        assert!(r.is_ok(), "{r:?}");
    });
    assert_eq!(
        pulls, 0,
        "allocations over 500 pulls of two tables from two PS tasks"
    );
    assert_eq!(
        pushes, 0,
        "allocations over 500 pushes of two tables to two PS tasks"
    );
}

/// `pull_rows` and `push_rows` to one PS, several tables per request, with completions
/// recycled: no allocation per request in steady state, on either end.
#[test]
fn rows_pulls_and_pushes_allocate_nothing_in_steady_state() {
    use starwire::rows::Rows;
    use starwire::rows::{Init, MemTable, Optimizer, Tables};
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let small = Arc::new(MemTable::new(16, Init::Zeros, Optimizer::Sgd { lr: 0.5 }));
    let large = Arc::new(MemTable::new(256, Init::Zeros, Optimizer::Sgd { lr: 0.5 }));
    let options = Options {
        service: Some(Arc::new(Tables::new().with(1, small).with(2, large))),
        ..Options::listen("127.0.0.1:0".parse().unwrap())
    };
    let ps = Runtime::start_with(config("ps", 1).build().unwrap(), options).unwrap();
    let addr = ps.local_addr().unwrap();
    let worker = client(1);
    let mut h = worker.handle(16);
    // 100 rows of 64 B and 100 rows of 1 KiB (a 100 KiB block, received in place).
    let ids: Vec<u64> = (0..100).collect();
    let g_small = vec![0u8; 100 * 64];
    let g_large = vec![0u8; 100 * 1024];
    let tables = [
        Rows::new(1, DType::F32, &[16], &ids),
        Rows::new(2, DType::F32, &[256], &ids),
    ];
    let pulls = allocations_per_request(|| {
        let t = h.pull_rows(addr, &tables, secs(10)).unwrap();
        let done = h.wait_tag(t.tag()).unwrap();
        let rows = done.rows().unwrap();
        assert_eq!(rows.block(1).unwrap().byte_len(), 100 * 1024);
        h.recycle(done);
    });
    let pushes = allocations_per_request(|| {
        let t = h
            .push_rows(
                addr,
                &[(tables[0], &g_small[..]), (tables[1], &g_large[..])],
                secs(10),
            )
            .unwrap();
        let done = h.wait_tag(t.tag()).unwrap();
        assert_eq!(done.pushed().unwrap(), [Status::Ok, Status::Ok]);
        h.recycle(done);
    });
    // The same blocks in shared tensors, sent from their own memory.
    let shared = [
        (
            tables[0],
            Arc::new(Tensor::from_slice(DType::U8, &[6400], &g_small).unwrap()),
        ),
        (
            tables[1],
            Arc::new(Tensor::zeros(DType::U8, &[100 * 1024]).unwrap()),
        ),
    ];
    let shared_pushes = allocations_per_request(|| {
        let t = h.push_rows_shared(addr, &shared, secs(10)).unwrap();
        let done = h.wait_tag(t.tag()).unwrap();
        assert_eq!(done.pushed().unwrap(), [Status::Ok; 2]);
        h.recycle(done);
    });
    eprintln!(
        "500 rows requests: {pulls} allocations for pulls, {pushes} for pushes, \
         {shared_pushes} for pushes of shared blocks"
    );
    assert_eq!(pulls, 0, "allocations over 500 rows pulls");
    assert_eq!(pushes, 0, "allocations over 500 rows pushes");
    assert_eq!(
        shared_pushes, 0,
        "allocations over 500 pushes of shared blocks"
    );
}

/// Versioned rows pulls (`pull_rows_versioned`) to one PS, with completions recycled: a
/// step pushes 10 of 100 rows, then pulls the 100 with the versions held, 10 rows sent
/// and 90 unchanged, written into the caller's rows; and a pull of rows that all came
/// unchanged. No allocation per request in steady state, on either end.
#[test]
fn versioned_rows_pulls_allocate_nothing_in_steady_state() {
    use starwire::rows::Rows;
    use starwire::rows::{Init, MemTable, Optimizer, Tables};
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let table = Arc::new(MemTable::new(16, Init::Zeros, Optimizer::Sgd { lr: 0.5 }));
    let options = Options {
        service: Some(Arc::new(Tables::new().with(1, table))),
        ..Options::listen("127.0.0.1:0".parse().unwrap())
    };
    // Both ends announce row versions whatever STARWIRE_WIRE_FEATURES says.
    let all = starwire::WireFeatures::ALL;
    let ps_cfg = config("ps", 1).wire_features(all).build().unwrap();
    let ps = Runtime::start_with(ps_cfg, options).unwrap();
    let addr = ps.local_addr().unwrap();
    let worker_cfg = config("worker", 1).wire_features(all).build().unwrap();
    let worker = Runtime::start(worker_cfg, None).unwrap();
    let mut h = worker.handle(16);
    let ids: Vec<u64> = (0..100).collect();
    let pushed: Vec<u64> = (0..10).collect();
    let grads = vec![0u8; 10 * 64];
    let rows = [Rows::new(1, DType::F32, &[16], &ids)];
    let pushed_rows = [(Rows::new(1, DType::F32, &[16], &pushed), &grads[..])];
    let mut held = vec![0u64; 100];
    let mut cache = vec![0u8; 100 * 64];
    // Every row held at its version.
    let t = h.pull_rows_versioned(addr, &rows, &held, secs(10)).unwrap();
    let done = h.wait_tag(t.tag()).unwrap();
    held.copy_from_slice(done.rows().unwrap().versions(0));
    h.recycle(done);
    let pulls = allocations_per_request(|| {
        let t = h.push_rows(addr, &pushed_rows, secs(10)).unwrap();
        let done = h.wait_tag(t.tag()).unwrap();
        h.recycle(done);
        let t = h.pull_rows_versioned(addr, &rows, &held, secs(10)).unwrap();
        let done = h.wait_tag(t.tag()).unwrap();
        let got = done.rows().unwrap();
        assert_eq!(got.unchanged_count(0), 90);
        assert_eq!(got.write_changed(0, &mut cache), Ok(10));
        held.copy_from_slice(got.versions(0));
        h.recycle(done);
    });
    let unchanged = allocations_per_request(|| {
        let t = h.pull_rows_versioned(addr, &rows, &held, secs(10)).unwrap();
        let done = h.wait_tag(t.tag()).unwrap();
        assert_eq!(done.rows().unwrap().unchanged_count(0), 100);
        h.recycle(done);
    });
    eprintln!(
        "500 versioned steps: {pulls} allocations (push and pull); 500 pulls all unchanged: \
         {unchanged}"
    );
    assert_eq!(pulls, 0, "allocations over 500 pushes and versioned pulls");
    assert_eq!(
        unchanged, 0,
        "allocations over 500 versioned pulls, nothing sent"
    );
}
