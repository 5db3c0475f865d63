//! No heap allocation per step of the pipelined sharded rows client in steady state: pull,
//! prefetch of the next batch, push not waited for, two PS tasks, without and with a row
//! cache (serving rows, and evicting), counted by this test binary's global allocator
//! across the whole process (the worker's loops and both PS tasks' run here too). The rows
//! are checked on every step, so the allocation-free path is also the correct one. The
//! row cache alone allocates nothing after it is made, and neither does a step of three
//! tables pipelined together.

mod common;

use common::*;
use starwire::client::Mode;
use starwire::rows::{
    Init, MemTable, Optimizer, Partition, PipelineSettings, RowCache, TableShape, Tables,
};
use starwire::{Client, DType, Embedded, Options, Peer, Pipeline, Runtime};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[path = "common/counting.rs"]
mod counting;

#[global_allocator]
static GLOBAL: counting::Counting = counting::Counting;

/// Allocation-counting tests must not overlap: the count is per process.
static SERIAL: Mutex<()> = Mutex::new(());

const DIM: usize = 16;
const UNIVERSE: u64 = 1000;
const TABLE: u32 = 1;

/// Step `t`'s batch: 100 distinct ids (50 on each PS under `Mod`), each twice.
fn batch(t: u64, out: &mut [u64; 200]) {
    for i in 0..100u64 {
        let id = (t * 37 + i * 7) % UNIVERSE;
        out[i as usize] = id;
        out[199 - i as usize] = id;
    }
}

/// Step `t`'s batch with hot ids: 50 distinct ids of `0..50` (the same every step) and 50
/// that change, each twice.
fn hot_batch(t: u64, out: &mut [u64; 200]) {
    batch(t, out);
    for i in 0..50u64 {
        out[i as usize] = i;
        out[199 - i as usize] = i;
    }
    for i in 50..100usize {
        // The changing half, moved out of the hot range.
        out[i] = 50 + out[i] % (UNIVERSE - 50);
        out[199 - i] = out[i];
    }
}

/// Two PS tasks whose tables hold every id of the universe at zero; SGD with lr 0, so
/// every row stays zero and each pull can be checked.
fn cluster() -> (Vec<Runtime>, Vec<Peer>) {
    two_ps(|| {
        let table = Arc::new(MemTable::new(DIM, Init::Zeros, Optimizer::Sgd { lr: 0.0 }));
        Tables::new().with(TABLE, table)
    })
}

/// Two PS tasks, each serving the tables `service` makes.
fn two_ps(service: impl Fn() -> Tables) -> (Vec<Runtime>, Vec<Peer>) {
    let rts: Vec<Runtime> = (0..2)
        .map(|_| {
            let options = Options {
                service: Some(Arc::new(service())),
                ..Options::listen("127.0.0.1:0".parse().unwrap())
            };
            Runtime::start_with(config("ps", 1).build().unwrap(), options).unwrap()
        })
        .collect();
    let peers = rts
        .iter()
        .map(|r| Peer::from(r.local_addr().unwrap()))
        .collect();
    (rts, peers)
}

/// What [`steps`] counted over its measured steps.
#[derive(Debug)]
struct Counted {
    allocations: u64,
    cache_hits: usize,
    cache_evictions: u64,
}

/// Allocations over 500 steps of `batch` with `settings` (after 200 to warm up), through
/// `client`.
fn steps<M: Mode>(
    client: &mut Client<M>,
    peers: Vec<Peer>,
    settings: PipelineSettings,
    batch: fn(u64, &mut [u64; 200]),
) -> Counted {
    let settings = settings
        .max_pushes_in_flight(2)
        .timeout(Some(Duration::from_secs(20)));
    let mut pipe = Pipeline::new(
        peers,
        Partition::Mod,
        TABLE,
        DType::F32,
        &[DIM as u64],
        settings,
    )
    .unwrap();
    // Every row created (a pull of an id the table does not have creates its row).
    let all: Vec<u64> = (0..UNIVERSE).collect();
    let mut rows = vec![1f32; all.len() * DIM];
    pipe.pull_typed(client, &all, &mut rows).unwrap();
    let mut rows = vec![1f32; 200 * DIM];
    let grads = vec![0.25f32; 200 * DIM];
    let (mut ids, mut next) = ([0u64; 200], [0u64; 200]);
    let mut most_in_flight = 0;
    let (mut hits, mut evictions) = (0, 0);
    let mut run = |from: u64, n: u64, hits: &mut usize, evictions: &mut u64| {
        batch(from, &mut ids);
        pipe.prefetch(client, &ids).unwrap();
        for t in from..from + n {
            rows.fill(1.0);
            let r = pipe.pull_typed(client, &ids, &mut rows).unwrap();
            assert_eq!((r.unique, r.missing), (100, 0));
            assert_eq!(r.cache_hits + r.rows_received + r.rows_unchanged, 100);
            *hits += r.cache_hits;
            assert!(rows.iter().all(|&v| v == 0.0));
            batch(t + 1, &mut next);
            pipe.prefetch(client, &next).unwrap();
            let r = pipe.push_typed(client, &ids, &grads).unwrap();
            assert_eq!(r.rows_sent, 100);
            *evictions += r.cache_evictions;
            most_in_flight = most_in_flight.max(r.pushes_in_flight);
            ids = next;
        }
    };
    let (mut warm_hits, mut warm_evictions) = (0, 0);
    run(0, 200, &mut warm_hits, &mut warm_evictions);
    let before = counting::allocations();
    run(200, 500, &mut hits, &mut evictions);
    let n = counting::allocations() - before;
    pipe.flush(client).unwrap();
    assert!(most_in_flight >= 1);
    Counted {
        allocations: n,
        cache_hits: hits,
        cache_evictions: evictions,
    }
}

#[test]
fn handle_steps_allocate_nothing_in_steady_state() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    for s in [0, 1, 2] {
        let (_rts, peers) = cluster();
        let worker = client(1);
        let mut h = worker.handle(64);
        let n = steps(
            &mut h,
            peers,
            PipelineSettings::default().staleness(s),
            batch,
        );
        assert_eq!(
            n.allocations, 0,
            "allocations over 500 steps at staleness {s}"
        );
        assert_eq!(h.outstanding(), 0);
    }
}

#[test]
fn embedded_steps_allocate_nothing_in_steady_state() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let (_rts, peers) = cluster();
    let mut e = Embedded::new(config("worker", 1).build().unwrap(), None).unwrap();
    let n = steps(
        &mut e,
        peers,
        PipelineSettings::default().staleness(1),
        batch,
    );
    assert_eq!(n.allocations, 0, "allocations over 500 embedded steps");
    assert_eq!(e.outstanding(), 0);
}

/// With a row cache: one that holds every row (hot rows served, none evicted), one that
/// holds about 60 of the 1000 (evicting on every step), and one at staleness 0 (serving
/// nothing, inserting everything).
#[test]
fn steps_with_a_row_cache_allocate_nothing_in_steady_state() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let row = DIM * 4;
    for (s, cache) in [(3, 1 << 20), (3, 60 * (row + 41)), (0, 1 << 20)] {
        let (_rts, peers) = cluster();
        let worker = client(1);
        let mut h = worker.handle(64);
        let settings = PipelineSettings::default().staleness(s).cache_bytes(cache);
        let n = steps(&mut h, peers, settings, hot_batch);
        eprintln!("staleness {s}, cache of {cache} bytes: {n:?}");
        assert_eq!(n.allocations, 0, "staleness {s}, cache of {cache} bytes");
        if s == 0 {
            assert_eq!(n.cache_hits, 0);
        } else {
            assert!(n.cache_hits > 0, "staleness {s}, cache of {cache} bytes");
        }
        if cache < 1 << 20 {
            assert!(n.cache_evictions > 0, "a cache of {cache} bytes");
        } else {
            assert_eq!(n.cache_evictions, 0);
        }
        assert_eq!(h.outstanding(), 0);
    }
}

/// The row cache alone: made once, then 100,000 inserts, refreshes, lookups and
/// evictions without an allocation.
#[test]
fn the_row_cache_allocates_nothing_after_it_is_made() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let mut cache = RowCache::new(64 << 10, 64).unwrap();
    let row = [3u8; 64];
    // This thread's: the harness's own threads allocate when other tests finish.
    let before = counting::thread_allocations();
    let mut x = 99u64;
    for i in 0..100_000u64 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let id = x % 4000;
        if cache.lookup(id, i.saturating_sub(50)).is_none() {
            cache.insert(id, &row, i, 0);
        }
    }
    assert_eq!(counting::thread_allocations() - before, 0);
    assert!(cache.evictions() > 0 && cache.hits() > 0 && cache.refreshes() > 0);
    assert_eq!(cache.len(), cache.capacity());
}

/// Three tables (f32 rows of 4, 2 and 3) at each of two PS tasks, rows of zeros, SGD with
/// lr 0.
const THREE: [(u32, [u64; 1]); 3] = [(3, [4]), (5, [2]), (8, [3])];

fn three_tables() -> (Vec<Runtime>, Vec<Peer>) {
    two_ps(|| {
        let mut service = Tables::new();
        for (id, dims) in THREE {
            let t = MemTable::new(dims[0] as usize, Init::Zeros, Optimizer::Sgd { lr: 0.0 });
            service = service.with(id, Arc::new(t));
        }
        service
    })
}

#[test]
fn steps_of_three_tables_allocate_nothing_in_steady_state() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let (_rts, peers) = three_tables();
    let w = client(1);
    let mut h = w.handle(64);
    for (s, cache) in [(0, 0), (1, 0), (2, 1 << 14)] {
        let settings = PipelineSettings::default()
            .staleness(s)
            .cache_bytes(cache)
            .max_pushes_in_flight(2);
        let shapes: Vec<TableShape<'_>> = THREE
            .iter()
            .map(|(table, dims)| TableShape {
                table: *table,
                dtype: DType::F32,
                row_dims: dims,
                partition: Partition::Mod,
            })
            .collect();
        let settings = settings.timeout(Some(Duration::from_secs(20)));
        let mut pipe = Pipeline::new_tables(peers.clone(), &shapes, settings).unwrap();
        // Step `t`'s batches: 40 distinct ids per table, each twice, moving over 0..400.
        let batch = |t: u64, out: &mut [[u64; 80]; 3]| {
            for (i, b) in out.iter_mut().enumerate() {
                for j in 0..40u64 {
                    let id = (t * 13 + j * 7 + i as u64) % 400;
                    b[j as usize] = id;
                    b[79 - j as usize] = id;
                }
            }
        };
        let mut rows: Vec<Vec<u8>> = (0..3)
            .map(|i| vec![0u8; 80 * (THREE[i].1[0] as usize * 4)])
            .collect();
        let grads: Vec<Vec<u8>> = (0..3)
            .map(|i| vec![0u8; 80 * (THREE[i].1[0] as usize * 4)])
            .collect();
        let (mut ids, mut next) = ([[0u64; 80]; 3], [[0u64; 80]; 3]);
        let mut run = |from: u64, n: u64, pipe: &mut Pipeline| {
            batch(from, &mut ids);
            pipe.prefetch_tables(&mut h, &[&ids[0], &ids[1], &ids[2]])
                .unwrap();
            for t in from..from + n {
                let [a, b, c] = &mut rows[..] else {
                    unreachable!()
                };
                let mut outs = [a.as_mut_slice(), b.as_mut_slice(), c.as_mut_slice()];
                let r = pipe
                    .pull_tables(&mut h, &[&ids[0], &ids[1], &ids[2]], &mut outs)
                    .unwrap();
                assert_eq!((r.unique, r.missing), (120, 0));
                batch(t + 1, &mut next);
                pipe.prefetch_tables(&mut h, &[&next[0], &next[1], &next[2]])
                    .unwrap();
                let g = [&grads[0][..], &grads[1][..], &grads[2][..]];
                let r = pipe
                    .push_tables(&mut h, &[&ids[0], &ids[1], &ids[2]], &g)
                    .unwrap();
                assert_eq!(r.rows_sent, 120);
                ids = next;
            }
            assert!(rows.iter().flatten().all(|&b| b == 0));
        };
        run(0, 200, &mut pipe);
        let before = counting::allocations();
        run(200, 300, &mut pipe);
        let n = counting::allocations() - before;
        pipe.flush(&mut h).unwrap();
        assert_eq!(
            n, 0,
            "allocations over 300 steps at staleness {s}, cache {cache}"
        );
    }
}
