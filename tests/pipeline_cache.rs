//! The pipelined rows client with its row cache, over real sockets, two PS tasks: a row
//! served from the cache never misses more of the worker's own pushes than the staleness
//! bound (SGD with lr 1 and unit gradients, so a row's value counts the pushes it
//! reflects), also when a small cache evicts all the time; repeated ids take fewer rows
//! off the wire (counted at the PS tasks); rows from the cache are the PS's bytes (in any
//! wire dtype); with staleness 0 the cache serves nothing and the rows are `Sharded`'s,
//! bit for bit, as without a cache; a cache too small for one row is refused.

mod common;

use common::*;
use starwire::rows::{Init, MemTable, Optimizer, Partition, PipelineSettings, Tables};
use starwire::{
    DType, ErrorKind, Options, Peer, Pipeline, PipelineReport, Runtime, Sharded, Status, Table,
};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

const DIM: usize = 4;
const ROW_BYTES: usize = DIM * 4;
const TABLE: u32 = 5;

/// A PS table that counts the rows it serves, and can slow its pushes down.
struct Counted {
    inner: MemTable,
    rows_pulled: AtomicU64,
    push_delay: Duration,
}

impl Counted {
    fn new(init: Init, optimizer: Optimizer) -> Counted {
        Counted {
            inner: MemTable::new(DIM, init, optimizer),
            rows_pulled: AtomicU64::new(0),
            push_delay: Duration::ZERO,
        }
    }
}

impl Table for Counted {
    fn dtype(&self) -> DType {
        self.inner.dtype()
    }
    fn row_dims(&self) -> &[u64] {
        self.inner.row_dims()
    }
    fn pull(&self, ids: &[u64], out: &mut [u8], missing: &mut Vec<u32>) -> Status {
        self.rows_pulled
            .fetch_add(ids.len() as u64, Ordering::SeqCst);
        self.inner.pull(ids, out, missing)
    }
    fn push(&self, ids: &[u64], grads: &[u8]) -> Status {
        if !self.push_delay.is_zero() {
            std::thread::sleep(self.push_delay);
        }
        self.inner.push(ids, grads)
    }
}

/// Two PS tasks over `tables`, handlers on two pool threads (a pull may overtake a push
/// that arrived before it); their runtimes and peers.
fn cluster(tables: &[Arc<Counted>]) -> (Vec<Runtime>, Vec<Peer>) {
    let rts: Vec<Runtime> = tables
        .iter()
        .map(|t| {
            let table: Arc<dyn Table> = t.clone();
            let options = Options {
                service: Some(Arc::new(Tables::new().with(TABLE, table))),
                handler_threads: Some(2),
                ..Options::listen("127.0.0.1:0".parse().unwrap())
            };
            Runtime::start_with(config("ps", 1).build().unwrap(), options).expect("ps starts")
        })
        .collect();
    let peers = rts
        .iter()
        .map(|r| Peer::from(r.local_addr().unwrap()))
        .collect();
    (rts, peers)
}

fn tables(n: usize, init: Init, optimizer: Optimizer, push_delay: Duration) -> Vec<Arc<Counted>> {
    (0..n)
        .map(|_| {
            let mut t = Counted::new(init, optimizer);
            t.push_delay = push_delay;
            Arc::new(t)
        })
        .collect()
}

fn pipeline(peers: Vec<Peer>, settings: PipelineSettings) -> Pipeline {
    let settings = settings.timeout(Some(Duration::from_secs(20)));
    Pipeline::new(
        peers,
        Partition::Mod,
        TABLE,
        DType::F32,
        &[DIM as u64],
        settings,
    )
    .unwrap()
}

/// `n` batches of `len` ids in `0..universe`, with repeats, from a fixed xorshift; ids
/// below `hot` are drawn half the time, so they come back step after step.
fn batches(n: usize, len: usize, universe: u64, hot: u64, seed: u64) -> Vec<Vec<u64>> {
    let mut x = seed | 1;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    (0..n)
        .map(|_| {
            (0..len)
                .map(|_| {
                    let r = next();
                    if r & 1 == 0 {
                        (r >> 1) % hot
                    } else {
                        (r >> 1) % universe
                    }
                })
                .collect()
        })
        .collect()
}

/// Unit gradients: 1 in every element at the first position of each id, 0 at its
/// repeats, so that the summed gradient of every distinct id is exactly 1.
fn unit_grads(ids: &[u64]) -> Vec<f32> {
    let mut seen = HashSet::new();
    ids.iter()
        .flat_map(|id| [if seen.insert(*id) { 1.0 } else { 0.0 }; DIM])
        .collect()
}

fn distinct(ids: &[u64]) -> usize {
    ids.iter().collect::<HashSet<_>>().len()
}

/// What a run of [`bounded`] saw.
#[derive(Debug, Default)]
struct Seen {
    /// The most pushes a row was seen to miss.
    worst: u64,
    hits: usize,
    evictions: u64,
    /// Rows pulled, as the worker counted them and as the PS tasks served them.
    received: usize,
    served: u64,
    /// Distinct rows of all steps.
    unique: usize,
}

/// Runs `steps` steps at staleness `s` with a cache of `cache` bytes against two PS tasks
/// whose pushes are slow, checking each row against the pushes it must and may reflect
/// and each step's counts.
fn bounded(s: u32, cache: usize, steps: usize) -> Seen {
    let tables = tables(
        2,
        Init::Zeros,
        Optimizer::Sgd { lr: 1.0 },
        Duration::from_micros(300),
    );
    let (_rts, peers) = cluster(&tables);
    let worker = client(1);
    let mut h = worker.handle(64);
    let settings = PipelineSettings::default()
        .staleness(s)
        .max_pushes_in_flight(3)
        .cache_bytes(cache);
    let mut pipe = pipeline(peers, settings);
    let all = batches(steps, 24, 60, 6, 5 + u64::from(s));
    // Per id, the numbers of the pushes that carried it.
    let mut carried: HashMap<u64, Vec<u64>> = HashMap::new();
    let mut seen = Seen::default();
    pipe.prefetch(&mut h, &all[0]).unwrap();
    for (t, ids) in all.iter().enumerate() {
        let mut rows = vec![f32::NAN; ids.len() * DIM];
        let r: PipelineReport = pipe.pull_typed(&mut h, ids, &mut rows).unwrap().clone();
        let sent = pipe.pushes();
        assert!(r.may_miss <= u64::from(s), "step {t}: {r:?}");
        assert_eq!(r.cache_hits + r.rows_received, r.unique, "step {t}: {r:?}");
        assert_eq!(r.cache_misses, r.rows_received, "step {t}: {r:?}");
        assert_eq!(r.bytes_received, (r.rows_received * ROW_BYTES) as u64);
        seen.hits += r.cache_hits;
        seen.received += r.rows_received;
        seen.unique += r.unique;
        for (pos, id) in ids.iter().enumerate() {
            let row = &rows[pos * DIM..][..DIM];
            assert!(
                row.iter().all(|&v| v == row[0]),
                "step {t}: torn row {row:?}"
            );
            let reflected = -row[0] as u64;
            let pushes = carried.get(id).map_or(&[][..], |v| &v[..]);
            let must = pushes.iter().filter(|&&n| n + u64::from(s) <= sent).count() as u64;
            let may = pushes.len() as u64;
            assert!(
                (must..=may).contains(&reflected),
                "step {t}, id {id}: the row reflects {reflected} pushes; it must reflect \
                 {must} and may reflect {may} (pushes {pushes:?}, {sent} sent, s = {s})"
            );
            seen.worst = seen.worst.max(may - reflected);
        }
        if let Some(next) = all.get(t + 1) {
            pipe.prefetch(&mut h, next).unwrap();
        }
        let r = pipe.push_typed(&mut h, ids, &unit_grads(ids)).unwrap();
        seen.evictions += r.cache_evictions;
        assert!(r.cache_bytes as usize <= cache);
        let n = pipe.pushes();
        let mut d: Vec<u64> = ids.clone();
        d.sort_unstable();
        d.dedup();
        for id in d {
            carried.entry(id).or_default().push(n);
        }
    }
    pipe.flush(&mut h).unwrap();
    assert_eq!((pipe.pushes_in_flight(), h.outstanding()), (0, 0));
    // Every push applied once.
    for (id, pushes) in &carried {
        let row = tables[(*id % 2) as usize].inner.get(*id).unwrap();
        assert_eq!(row, vec![-(pushes.len() as f32); DIM], "id {id}");
    }
    seen.served = tables
        .iter()
        .map(|t| t.rows_pulled.load(Ordering::SeqCst))
        .sum();
    let c = pipe.cache().expect("a cache");
    assert_eq!(c.hits() as usize, seen.hits);
    assert!(c.footprint() <= cache);
    seen
}

#[test]
fn cached_rows_never_miss_more_own_pushes_than_the_bound() {
    for s in [1u32, 2, 4] {
        let seen = bounded(s, 1 << 20, 80);
        eprintln!("staleness {s}: {seen:?}");
        assert!(seen.worst <= u64::from(s), "s = {s}: {seen:?}");
        // The PS tasks served exactly the rows the worker counted as pulled.
        assert_eq!(seen.served, seen.received as u64, "s = {s}");
        assert_eq!(seen.evictions, 0, "s = {s}: the cache holds the universe");
    }
    // With room for every row and a bound of 4, hot rows come from the cache.
    let seen = bounded(4, 1 << 20, 80);
    assert!(seen.hits > 0, "{seen:?}");
    assert!(seen.received < seen.unique, "{seen:?}");
}

#[test]
fn a_small_cache_evicts_and_rows_stay_within_the_bound() {
    // Room for about 10 rows of the 60; every step has about 20 distinct ids.
    let cap = 10 * (ROW_BYTES + 41);
    for s in [2u32, 4] {
        let seen = bounded(s, cap, 80);
        eprintln!("staleness {s}, {cap} bytes: {seen:?}");
        assert!(seen.worst <= u64::from(s), "{seen:?}");
        assert!(seen.evictions > 0, "{seen:?}");
        assert_eq!(seen.served, seen.received as u64);
    }
}

/// The same batch step after step: with staleness 4 and at most 2 pushes in flight, a row
/// is fetched sure to reflect all but 3 of the pushes its step will have sent, so it is
/// served by the cache the step after (at least): at most about half the steps pull it.
#[test]
fn repeated_ids_take_fewer_rows_off_the_wire() {
    let batch: Vec<u64> = (0..30u64).chain(0..30).collect();
    let steps = 40;
    let mut served = Vec::new();
    for cache in [0, 1 << 20] {
        let tables = tables(2, Init::Zeros, Optimizer::Sgd { lr: 0.5 }, Duration::ZERO);
        let (_rts, peers) = cluster(&tables);
        let worker = client(1);
        let mut h = worker.handle(64);
        let settings = PipelineSettings::default()
            .staleness(4)
            .max_pushes_in_flight(2)
            .cache_bytes(cache);
        let mut pipe = pipeline(peers, settings);
        let (mut rows, grads) = (vec![0f32; 60 * DIM], vec![0.25f32; 60 * DIM]);
        let (mut received, mut hits) = (0, 0);
        pipe.prefetch(&mut h, &batch).unwrap();
        for _ in 0..steps {
            let r = pipe.pull_typed(&mut h, &batch, &mut rows).unwrap();
            received += r.rows_received;
            hits += r.cache_hits;
            pipe.prefetch(&mut h, &batch).unwrap();
            pipe.push_typed(&mut h, &batch, &grads).unwrap();
        }
        pipe.flush(&mut h).unwrap();
        let at_ps: u64 = tables
            .iter()
            .map(|t| t.rows_pulled.load(Ordering::SeqCst))
            .sum();
        // The last prefetch's rows were pulled too (when not served by the cache).
        assert!(at_ps >= received as u64 && at_ps <= received as u64 + 30);
        assert_eq!(received + hits, 30 * steps);
        if cache == 0 {
            assert_eq!((received, hits), (30 * steps, 0));
        }
        served.push(received);
    }
    eprintln!("rows pulled over {steps} steps: {served:?} (no cache, cache)");
    assert!(
        served[1] <= 30 * (steps / 2 + 1),
        "with the cache {} rows pulled; at most {} expected",
        served[1],
        30 * (steps / 2 + 1)
    );
}

/// A table that does not change (lr 0): rows from the cache and from the wire must be
/// the PS's rows, as the wire dtype rounds them, at every position of every step.
#[test]
fn rows_from_the_cache_are_the_ps_rows_in_any_wire_dtype() {
    let init = Init::Uniform {
        scale: 2.0,
        seed: 9,
    };
    for wire in [None, Some(DType::BF16)] {
        let tables = tables(2, init, Optimizer::Sgd { lr: 0.0 }, Duration::ZERO);
        let (_rts, peers) = cluster(&tables);
        let worker = client(1);
        let mut h = worker.handle(64);
        let settings = |cache| {
            PipelineSettings::default()
                .staleness(3)
                .wire_dtype(wire)
                .cache_bytes(cache)
        };
        let mut plain = pipeline(peers.clone(), settings(0));
        let mut cached = pipeline(peers, settings(1 << 16));
        let all = batches(30, 40, 200, 10, 17);
        let mut hits = 0;
        for ids in &all {
            let mut want = vec![0u8; ids.len() * ROW_BYTES];
            plain.pull(&mut h, ids, &mut want).unwrap();
            let mut got = vec![0xaau8; ids.len() * ROW_BYTES];
            let r = cached.pull(&mut h, ids, &mut got).unwrap();
            hits += r.cache_hits;
            assert_eq!(r.unique, distinct(ids));
            assert_eq!(got, want, "wire {wire:?}");
            let zeros = vec![0f32; ids.len() * DIM];
            plain.push_typed(&mut h, ids, &zeros).unwrap();
            cached.push_typed(&mut h, ids, &zeros).unwrap();
        }
        plain.flush(&mut h).unwrap();
        cached.flush(&mut h).unwrap();
        assert!(hits > 0, "wire {wire:?}: no row came from the cache");
    }
}

/// Rows the PS does not have are left zero and counted, and not cached: asked again.
#[test]
fn missing_rows_are_not_cached() {
    let tables = tables(2, Init::Missing, Optimizer::Sgd { lr: 1.0 }, Duration::ZERO);
    let (_rts, peers) = cluster(&tables);
    let worker = client(1);
    let mut h = worker.handle(64);
    let mut pipe = pipeline(
        peers,
        PipelineSettings::default()
            .staleness(4)
            .cache_bytes(1 << 16),
    );
    // Ids 0..4 get rows by a push; 10 and 11 never do.
    let mut ids: Vec<u64> = vec![0, 1, 2, 3];
    pipe.push_typed(&mut h, &ids, &[1f32; 4 * DIM]).unwrap();
    pipe.flush(&mut h).unwrap();
    ids.extend([10, 11, 0]);
    for step in 0..3 {
        let mut rows = vec![7f32; ids.len() * DIM];
        let r = pipe.pull_typed(&mut h, &ids, &mut rows).unwrap().clone();
        assert_eq!(r.missing, 2, "step {step}: {r:?}");
        for (pos, id) in ids.iter().enumerate() {
            let want = if *id >= 10 { 0.0 } else { -1.0 };
            assert_eq!(
                rows[pos * DIM..][..DIM],
                [want; DIM],
                "step {step}, id {id}"
            );
        }
        if step > 0 {
            // The present rows come from the cache; the missing ones are asked again.
            assert_eq!(
                (r.cache_hits, r.rows_received),
                (4, 2),
                "step {step}: {r:?}"
            );
        }
    }
    assert_eq!(pipe.cache().unwrap().len(), 4);
}

/// Staleness 0: the cache serves nothing, and the rows equal `Sharded`'s and those of a
/// pipeline without a cache, bit for bit, step after step, with gradients that depend on
/// the rows; the three clusters' tables end equal.
#[test]
fn staleness_0_with_a_cache_gives_the_rows_of_sharded_bit_for_bit() {
    let init = Init::Uniform {
        scale: 0.1,
        seed: 3,
    };
    let adagrad = Optimizer::Adagrad {
        lr: 0.1,
        initial_accumulator: 0.1,
    };
    let sets: Vec<Vec<Arc<Counted>>> = (0..3)
        .map(|_| tables(2, init, adagrad, Duration::ZERO))
        .collect();
    let clusters: Vec<_> = sets.iter().map(|t| cluster(t)).collect();
    let worker = client(1);
    let mut h = worker.handle(64);
    let mut sharded = Sharded::new(
        clusters[0].1.clone(),
        Partition::Mod,
        TABLE,
        DType::F32,
        &[DIM as u64],
    )
    .unwrap();
    let s0 = PipelineSettings::default().staleness(0);
    let mut plain = pipeline(clusters[1].1.clone(), s0);
    let mut cached = pipeline(clusters[2].1.clone(), s0.cache_bytes(1 << 16));
    let steps = batches(25, 40, 30, 5, 11);
    let grad = |rows: &[f32]| -> Vec<f32> {
        rows.iter()
            .enumerate()
            .map(|(i, r)| r * 0.5 + (i % 7) as f32 * 0.01 - 0.02)
            .collect()
    };
    for (t, ids) in steps.iter().enumerate() {
        let mut want = vec![0f32; ids.len() * DIM];
        assert!(sharded
            .pull_typed(&mut h, ids, &mut want, secs(20))
            .unwrap()
            .is_ok());
        let mut a = vec![0f32; ids.len() * DIM];
        let mut b = vec![0f32; ids.len() * DIM];
        plain.pull_typed(&mut h, ids, &mut a).unwrap();
        let r = cached.pull_typed(&mut h, ids, &mut b).unwrap();
        assert_eq!((r.cache_hits, r.rows_received), (0, r.unique), "step {t}");
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&a), bits(&want), "step {t}: without a cache");
        assert_eq!(bits(&b), bits(&want), "step {t}: with a cache");
        if let Some(next) = steps.get(t + 1) {
            plain.prefetch(&mut h, next).unwrap();
            cached.prefetch(&mut h, next).unwrap();
        }
        let g = grad(&want);
        assert!(sharded
            .push_typed(&mut h, ids, &g, secs(20))
            .unwrap()
            .is_ok());
        plain.push_typed(&mut h, ids, &g).unwrap();
        cached.push_typed(&mut h, ids, &g).unwrap();
    }
    plain.flush(&mut h).unwrap();
    cached.flush(&mut h).unwrap();
    // The cache held the rows it pulled (it costs memory), and served none.
    let c = cached.cache().unwrap();
    assert_eq!(c.hits(), 0);
    assert!(!c.is_empty());
    for id in 0..30u64 {
        let s = (id % 2) as usize;
        let rows: Vec<_> = sets.iter().map(|t| t[s].inner.get(id)).collect();
        assert_eq!(rows[0], rows[1], "id {id}");
        assert_eq!(rows[0], rows[2], "id {id}");
    }
    assert_eq!(h.outstanding(), 0);
}

#[test]
fn a_cache_that_holds_no_row_is_refused_naming_the_setting() {
    let peer = Peer::from("127.0.0.1:9".parse::<std::net::SocketAddr>().unwrap());
    let settings = PipelineSettings::default().cache_bytes(20);
    let e = Pipeline::new(
        vec![peer],
        Partition::Mod,
        TABLE,
        DType::F32,
        &[DIM as u64],
        settings,
    )
    .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(e.to_string().contains("cache_bytes"), "{e}");
    assert_eq!(PipelineSettings::default().cache_capacity(), 0);
}
