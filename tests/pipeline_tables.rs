//! A pipeline of several tables (`Pipeline::new_tables`) over real sockets, two PS tasks
//! serving three tables: each step is one request per PS each way for all the tables; at
//! staleness 0 it gives `ShardedTables`'s rows and tables bit for bit; with staleness 2,
//! with and without row caches, no row of any table misses more of the worker's own
//! pushes than the bound allows; a versioned pull names every table's cached rows in one
//! request, and a worker without row versions gets every row; a table with no ids at a
//! PS, or none at all, sends nothing there; bad arguments are refused before anything is
//! sent. (That a step of several tables allocates nothing in steady state is in
//! `tests/pipeline_alloc.rs`, whose tests all count allocations.)

mod common;

use common::*;
use starwire::rows::{
    Init, MemTable, Optimizer, Partition, PipelineSettings, ShardedTables, TableShape, Tables,
};
use starwire::{DType, ErrorKind, Handle, Options, Peer, Pipeline, Runtime, WireFeatures};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// Table id and row length (f32 elements) of the three tables.
const TABLES: [(u32, usize); 3] = [(3, 4), (5, 2), (8, 3)];
const DIMS: [[u64; 1]; 3] = [[4], [2], [3]];

/// The shapes of [`TABLES`], split by id mod the PS tasks.
fn shapes() -> Vec<TableShape<'static>> {
    TABLES
        .iter()
        .zip(&DIMS)
        .map(|(&(table, _), row_dims)| TableShape {
            table,
            dtype: DType::F32,
            row_dims,
            partition: Partition::Mod,
        })
        .collect()
}

fn row_bytes(i: usize) -> usize {
    TABLES[i].1 * 4
}

/// Two PS tasks, each serving the three tables as `MemTable`s made by `table` (given the
/// row length); both announce every wire feature (the workers choose).
fn cluster(
    table: impl Fn(usize) -> MemTable,
) -> (Vec<Runtime>, Vec<Peer>, Vec<Vec<Arc<MemTable>>>) {
    let mut rts = Vec::new();
    let mut held = Vec::new();
    for _ in 0..2 {
        let tables: Vec<Arc<MemTable>> = TABLES.iter().map(|&(_, d)| Arc::new(table(d))).collect();
        let mut service = Tables::new();
        for (&(id, _), t) in TABLES.iter().zip(&tables) {
            service = service.with(id, t.clone());
        }
        let options = Options {
            service: Some(Arc::new(service)),
            ..Options::listen("127.0.0.1:0".parse().unwrap())
        };
        let cfg = config("ps", 1)
            .wire_features(WireFeatures::ALL)
            .build()
            .unwrap();
        rts.push(Runtime::start_with(cfg, options).expect("ps starts"));
        held.push(tables);
    }
    let peers = rts
        .iter()
        .map(|r| Peer::from(r.local_addr().unwrap()))
        .collect();
    (rts, peers, held)
}

/// Rows of `dim` made at their first pull, Adagrad: gradients that depend on the rows show
/// any difference in them.
fn adagrad(dim: usize) -> MemTable {
    let init = Init::Uniform {
        scale: 0.1,
        seed: 3,
    };
    let opt = Optimizer::Adagrad {
        lr: 0.1,
        initial_accumulator: 0.1,
    };
    MemTable::new(dim, init, opt)
}

/// Rows of `dim` zeros, SGD with lr 1: a row's value counts the gradients applied to it.
fn sgd(dim: usize) -> MemTable {
    MemTable::new(dim, Init::Zeros, Optimizer::Sgd { lr: 1.0 })
}

/// A pipeline of table 3 (the first of [`TABLES`]) and `other`, default settings.
fn with_table_3(peers: &[Peer], other: TableShape<'static>) -> Pipeline {
    let settings = PipelineSettings::default().timeout(Some(Duration::from_secs(20)));
    Pipeline::new_tables(peers.to_vec(), &[shapes()[0], other], settings).unwrap()
}

fn worker(features: WireFeatures) -> Runtime {
    let cfg = config("worker", 1).wire_features(features).build().unwrap();
    Runtime::start(cfg, None).expect("worker starts")
}

fn pipeline(peers: &[Peer], settings: PipelineSettings) -> Pipeline {
    let settings = settings.timeout(Some(Duration::from_secs(20)));
    Pipeline::new_tables(peers.to_vec(), &shapes(), settings).unwrap()
}

/// Frames the PS tasks received.
fn frames_in(rts: &[Runtime]) -> u64 {
    rts.iter().map(|r| r.stats().frames_in).sum()
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

fn to_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// `n` steps of a batch per table, `len` ids each in `0..universe` with repeats, from a
/// fixed xorshift.
fn batches(n: usize, len: usize, universe: u64, seed: u64) -> Vec<[Vec<u64>; 3]> {
    let mut x = seed | 1;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % universe
    };
    (0..n)
        .map(|_| std::array::from_fn(|_| (0..len).map(|_| next()).collect()))
        .collect()
}

/// Connects the worker to both PS tasks (the handshake is a frame of its own) with a
/// plain pull of one id at each.
fn connect(h: &mut Handle, peers: &[Peer]) {
    let mut plain = ShardedTables::new(peers.to_vec(), &shapes()).unwrap();
    let ids: [&[u64]; 3] = [&[0, 1], &[], &[]];
    let mut out = vec![0u8; 2 * row_bytes(0)];
    let report = plain
        .pull(h, &ids, &mut [&mut out, &mut [], &mut []], secs(10))
        .unwrap();
    assert!(report.is_ok(), "{report:?}");
}

/// The PS tasks that hold an id of one of `step`'s batches (`Mod` over two).
fn ps_reached(step: &[Vec<u64>; 3]) -> u64 {
    (0..2u64)
        .filter(|&k| step.iter().flatten().any(|id| id % 2 == k))
        .count() as u64
}

/// A buffer of rows per table for `ids`' batches, every byte `fill`.
fn buffers(ids: &[&[u64]; 3], fill: u8) -> Vec<Vec<u8>> {
    (0..3)
        .map(|i| vec![fill; ids[i].len() * row_bytes(i)])
        .collect()
}

fn views(outs: &mut [Vec<u8>]) -> Vec<&mut [u8]> {
    outs.iter_mut().map(|o| o.as_mut_slice()).collect()
}

fn refs(step: &[Vec<u64>; 3]) -> [&[u64]; 3] {
    std::array::from_fn(|i| step[i].as_slice())
}

#[test]
fn staleness_0_gives_sharded_tables_bit_for_bit_in_one_request_per_ps_each_way() {
    let (_ra, peers_a, a) = cluster(adagrad);
    let (rb, peers_b, b) = cluster(adagrad);
    let w = worker(WireFeatures::ALL);
    let mut h = w.handle(64);
    connect(&mut h, &peers_b);
    let mut plain = ShardedTables::new(peers_a, &shapes()).unwrap();
    let mut pipe = pipeline(&peers_b, PipelineSettings::default().staleness(0));
    // Table 8's batch is sometimes all even (at PS 0 only) or empty.
    let mut steps = batches(20, 12, 30, 11);
    steps[4][2] = vec![2, 4, 2];
    steps[7][2].clear();
    let grad = |rows: &[f32]| -> Vec<f32> {
        rows.iter()
            .enumerate()
            .map(|(i, r)| r * 0.5 + (i % 7) as f32 * 0.01 - 0.02)
            .collect()
    };
    let before = frames_in(&rb);
    let mut expected_frames = 0;
    pipe.prefetch_tables(&mut h, &refs(&steps[0])).unwrap();
    for (t, step) in steps.iter().enumerate() {
        let ids = refs(step);
        let mut want = buffers(&ids, 0);
        let r = plain
            .pull(&mut h, &ids, &mut views(&mut want), secs(20))
            .unwrap();
        assert!(r.is_ok(), "{r:?}");
        let mut got = buffers(&ids, 0xaa);
        let report = pipe
            .pull_tables(&mut h, &ids, &mut views(&mut got))
            .unwrap();
        assert_eq!((report.step, report.may_miss), (t as u64, 0));
        let unique: usize = (0..3)
            .map(|i| {
                let mut u = ids[i].to_vec();
                u.sort_unstable();
                u.dedup();
                u.len()
            })
            .sum();
        assert_eq!(report.unique, unique, "step {t}");
        assert_eq!(got, want, "step {t}: rows differ");
        if let Some(next) = steps.get(t + 1) {
            pipe.prefetch_tables(&mut h, &refs(next)).unwrap();
        }
        let grads: Vec<Vec<u8>> = got.iter().map(|g| to_bytes(&grad(&f32s(g)))).collect();
        let gviews: Vec<&[u8]> = grads.iter().map(|g| g.as_slice()).collect();
        assert!(plain.push(&mut h, &ids, &gviews, secs(20)).unwrap().is_ok());
        let report = pipe.push_tables(&mut h, &ids, &gviews).unwrap();
        assert_eq!(report.rows_sent, unique);
        expected_frames += 2 * ps_reached(step);
    }
    pipe.flush(&mut h).unwrap();
    // One pull and one push per PS holding any of a step's ids: not one per table.
    assert_eq!(frames_in(&rb) - before, expected_frames);
    // The tables end equal, bit for bit.
    let bits = |v: Option<Vec<f32>>| v.map(|v| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>());
    for i in 0..3 {
        for id in 0..30u64 {
            let s = (id % 2) as usize;
            let (x, y) = (a[s][i].get(id), b[s][i].get(id));
            assert!(x.is_some(), "table {i} id {id}");
            assert_eq!(bits(x), bits(y), "table {i} id {id}");
        }
    }
    assert_eq!(h.outstanding(), 0);
}

/// Runs 30 steps at staleness 2 (SGD with lr 1 on rows of zeros, a gradient of 1 per
/// distinct id, so a row's value counts the pushes it reflects), checking every table's
/// every row against the pushes it must and may reflect. Returns the rows served from the
/// caches and the PS frames of the steps.
fn bounded(cache_bytes: usize) -> (usize, u64) {
    let (rts, peers, _tables) = cluster(sgd);
    let w = worker(WireFeatures::ALL);
    let mut h = w.handle(64);
    connect(&mut h, &peers);
    let s = 2u64;
    let settings = PipelineSettings::default()
        .staleness(s as u32)
        .cache_bytes(cache_bytes);
    let mut pipe = pipeline(&peers, settings);
    let steps = batches(30, 10, 12, 5);
    // Per table: the pushes (numbered from 1) that held each id.
    let mut pushed: [HashMap<u64, Vec<u64>>; 3] = Default::default();
    let (mut hits, before) = (0, frames_in(&rts));
    pipe.prefetch_tables(&mut h, &refs(&steps[0])).unwrap();
    for (t, step) in steps.iter().enumerate() {
        let ids = refs(step);
        let mut got = buffers(&ids, 0xaa);
        let report = pipe
            .pull_tables(&mut h, &ids, &mut views(&mut got))
            .unwrap()
            .clone();
        assert!(report.may_miss <= s, "step {t}: {report:?}");
        hits += report.cache_hits;
        let p = pipe.pushes();
        for i in 0..3 {
            for (j, row) in f32s(&got[i]).chunks_exact(TABLES[i].1).enumerate() {
                let id = ids[i][j];
                let of = pushed[i].get(&id).map_or(&[][..], |v| v.as_slice());
                let must = of.iter().filter(|&&n| n + s <= p).count() as f32;
                let may = of.len() as f32;
                for &v in row {
                    assert!(
                        -v >= must && -v <= may,
                        "step {t} table {} id {id}: reflects {} pushes, must {must}, may {may}",
                        TABLES[i].0,
                        -v
                    );
                }
            }
        }
        if let Some(next) = steps.get(t + 1) {
            pipe.prefetch_tables(&mut h, &refs(next)).unwrap();
        }
        let grads: Vec<Vec<u8>> = (0..3)
            .map(|i| {
                let mut seen = std::collections::HashSet::new();
                let g: Vec<f32> = ids[i]
                    .iter()
                    .flat_map(|id| vec![if seen.insert(*id) { 1.0 } else { 0.0 }; TABLES[i].1])
                    .collect();
                to_bytes(&g)
            })
            .collect();
        let gviews: Vec<&[u8]> = grads.iter().map(|g| g.as_slice()).collect();
        pipe.push_tables(&mut h, &ids, &gviews).unwrap();
        let n = pipe.pushes();
        for i in 0..3 {
            let mut distinct = ids[i].to_vec();
            distinct.sort_unstable();
            distinct.dedup();
            for id in distinct {
                pushed[i].entry(id).or_default().push(n);
            }
        }
    }
    pipe.flush(&mut h).unwrap();
    assert_eq!(h.outstanding(), 0);
    (hits, frames_in(&rts) - before)
}

#[test]
fn staleness_2_bounds_every_tables_rows_in_one_request_per_ps() {
    let (hits, frames) = bounded(0);
    assert_eq!(hits, 0);
    // 30 steps; every step's batches reach both PS tasks: a pull and a push to each.
    assert_eq!(frames, 30 * 2 * 2);
}

#[test]
fn staleness_2_with_row_caches_serves_rows_and_keeps_the_bound() {
    let (hits, frames) = bounded(1 << 16);
    assert!(hits > 0, "no row served from the caches");
    // The pushes still go (one per PS and step); some pulls are served whole by the
    // caches, and none is split into a request per table.
    assert!((30 * 2..=30 * 2 * 2).contains(&frames), "{frames} frames");
}

/// Six steps at staleness 0 with row caches: pull the same batches, check them against a
/// plain pull, push three ids of table 3; per step (rows received, rows unchanged).
fn versioned(features: WireFeatures) -> Vec<(usize, usize)> {
    let init = Init::Uniform {
        scale: 0.5,
        seed: 3,
    };
    let (rts, peers, _tables) = cluster(|d| MemTable::new(d, init, Optimizer::Sgd { lr: 0.5 }));
    let w = worker(features);
    let mut h = w.handle(64);
    connect(&mut h, &peers);
    let mut plain = ShardedTables::new(peers.clone(), &shapes()).unwrap();
    let mut pipe = pipeline(
        &peers,
        PipelineSettings::default()
            .staleness(0)
            .cache_bytes(1 << 16),
    );
    let step = [
        (0..20).collect::<Vec<u64>>(),
        (10..30).collect(),
        (0..8).chain(0..4).collect(),
    ];
    let ids = refs(&step);
    let mut seen = Vec::new();
    for t in 0..6 {
        let before = frames_in(&rts);
        let mut got = buffers(&ids, 0xaa);
        let r = pipe
            .pull_tables(&mut h, &ids, &mut views(&mut got))
            .unwrap()
            .clone();
        // One request per PS for the three tables, versioned or not.
        assert_eq!(frames_in(&rts) - before, 2, "step {t}");
        let mut want = buffers(&ids, 0);
        assert!(plain
            .pull(&mut h, &ids, &mut views(&mut want), secs(10))
            .unwrap()
            .is_ok());
        assert_eq!(got, want, "step {t}: rows differ from a plain pull");
        assert_eq!(
            (r.unique, r.cache_hits, r.cache_misses),
            (48, 0, 48),
            "step {t}"
        );
        seen.push((r.rows_received, r.rows_unchanged));
        let pushed: [&[u64]; 3] = [&[3, 10, 11], &[], &[]];
        let grads = to_bytes(&[0.25f32; 3 * 4]);
        pipe.push_tables(&mut h, &pushed, &[&grads, &[], &[]])
            .unwrap();
        pipe.flush(&mut h).unwrap();
    }
    seen
}

#[test]
fn a_versioned_pull_names_every_tables_cached_rows_in_one_request() {
    let seen = versioned(WireFeatures::ALL);
    assert_eq!(seen[0], (48, 0));
    // Then only the three rows of table 3 pushed since travel.
    for (t, &s) in seen.iter().enumerate().skip(1) {
        assert_eq!(s, (3, 45), "step {t}");
    }
}

#[test]
fn a_worker_without_row_versions_gets_every_tables_rows() {
    for (t, &s) in versioned(WireFeatures::ROW_FORMATS).iter().enumerate() {
        assert_eq!(s, (48, 0), "step {t}");
    }
}

#[test]
fn a_table_with_no_ids_at_a_ps_sends_nothing_there() {
    let (rts, peers, _tables) = cluster(sgd);
    let w = worker(WireFeatures::ALL);
    let mut h = w.handle(64);
    connect(&mut h, &peers);
    let mut pipe = pipeline(&peers, PipelineSettings::default().staleness(1));
    // Even ids only, and table 5 takes no part: PS 0 alone gets a request, once each way.
    let ids: [&[u64]; 3] = [&[2, 4, 2], &[], &[6]];
    let at = |rts: &[Runtime]| -> Vec<u64> { rts.iter().map(|r| r.stats().frames_in).collect() };
    let before = at(&rts);
    let mut outs = vec![vec![0xaau8; 3 * 16], vec![], vec![0xaau8; 12]];
    let r = pipe
        .pull_tables(&mut h, &ids, &mut views(&mut outs))
        .unwrap();
    assert_eq!((r.unique, r.rows_received, r.missing), (3, 3, 0));
    assert!(outs.iter().flatten().all(|&b| b == 0), "rows of zeros");
    let grads = [to_bytes(&[1.0; 12]), vec![], to_bytes(&[2.0; 3])];
    let r = pipe
        .push_tables(&mut h, &ids, &[&grads[0], &grads[1], &grads[2]])
        .unwrap();
    assert_eq!(r.rows_sent, 3);
    pipe.flush(&mut h).unwrap();
    let after = at(&rts);
    assert_eq!((after[0] - before[0], after[1] - before[1]), (2, 0));
    // The push was applied: id 2 of table 3 summed twice, id 6 of table 8 once.
    let r = pipe
        .pull_tables(&mut h, &ids, &mut views(&mut outs))
        .unwrap();
    assert!(r.may_miss <= 1);
    assert_eq!(f32s(&outs[0])[..4], [-2.0; 4]);
    assert_eq!(f32s(&outs[0])[4..8], [-1.0; 4]);
    assert_eq!(f32s(&outs[2]), [-2.0; 3]);
}

#[test]
fn bad_arguments_are_refused_before_anything_is_sent() {
    let (rts, peers, _tables) = cluster(sgd);
    let w = worker(WireFeatures::ALL);
    let mut h = w.handle(64);
    connect(&mut h, &peers);
    let settings = PipelineSettings::default();
    let invalid = |r: Result<Pipeline, starwire::Error>| r.unwrap_err();
    let e = invalid(Pipeline::new_tables(peers.clone(), &[], settings));
    assert!(e.to_string().contains("0 tables"), "{e}");
    let twice = [shapes()[0], shapes()[0]];
    let e = invalid(Pipeline::new_tables(peers.clone(), &twice, settings));
    assert!(e.to_string().contains("table 3 is named twice"), "{e}");
    let mut bf16 = shapes();
    bf16[1].dtype = DType::U8;
    let e = invalid(Pipeline::new_tables(
        peers.clone(),
        &bf16,
        settings.wire_dtype(Some(DType::BF16)),
    ));
    assert!(e.to_string().contains("table 5"), "{e}");

    let mut pipe = pipeline(&peers, settings);
    assert_eq!(pipe.tables(), 3);
    assert_eq!(pipe.table_row_bytes(1), Some(8));
    assert_eq!(pipe.table_row_bytes(3), None);
    let before = frames_in(&rts);
    let mut out = vec![0u8; 16];
    // A one-table call on a pipeline of three names the calls to use.
    let e = pipe.pull(&mut h, &[1], &mut out).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(e.to_string().contains("pull_tables"), "{e}");
    let e = pipe.prefetch(&mut h, &[1]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    let e = pipe.push(&mut h, &[1], &out).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    // Two batches for three tables.
    let e = pipe
        .pull_tables(&mut h, &[&[1], &[2]], &mut [&mut out, &mut []])
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("2 batches and 2 buffers for 3 tables"),
        "{e}"
    );
    // A buffer of the wrong length names its table.
    let mut short = vec![0u8; 7];
    let e = pipe
        .pull_tables(
            &mut h,
            &[&[1], &[2], &[]],
            &mut [&mut out, &mut short, &mut []],
        )
        .unwrap_err();
    assert!(e.to_string().contains("table 5: out is 7 bytes"), "{e}");
    let e = pipe
        .push_tables(&mut h, &[&[1], &[2], &[]], &[&out, &short, &[]])
        .unwrap_err();
    assert!(e.to_string().contains("table 5: grads is 7 bytes"), "{e}");
    assert_eq!(frames_in(&rts), before, "nothing sent");
    assert_eq!((pipe.steps(), pipe.pushes()), (0, 0));
}

/// One table's part of a unique pull: its distinct ids, their rows, each position's index.
type UniquePart = (Vec<u64>, Vec<u8>, Vec<i64>);

/// A unique pull of `ids`' batches: each table's part, and the report.
fn pull_unique(
    pipe: &mut Pipeline,
    h: &mut Handle,
    ids: &[&[u64]; 3],
) -> (Vec<UniquePart>, starwire::rows::PipelineReport) {
    let mut inverse: Vec<Vec<i64>> = ids.iter().map(|i| vec![-1; i.len()]).collect();
    let mut unique: Vec<Vec<u64>> = ids.iter().map(|i| vec![u64::MAX; i.len()]).collect();
    let mut rows = buffers(ids, 0xaa);
    let report = {
        let mut inv: Vec<&mut [i64]> = inverse.iter_mut().map(|v| v.as_mut_slice()).collect();
        let mut uni: Vec<&mut [u64]> = unique.iter_mut().map(|v| v.as_mut_slice()).collect();
        pipe.pull_tables_unique(h, ids, &mut inv, &mut uni, &mut views(&mut rows))
            .unwrap()
            .clone()
    };
    let parts = (0..3)
        .map(|t| {
            let n = pipe.unique_len(t);
            let (mut u, mut r, inv) = (unique[t].clone(), rows[t].clone(), inverse[t].clone());
            u.truncate(n);
            r.truncate(n * row_bytes(t));
            (u, r, inv)
        })
        .collect();
    (parts, report)
}

#[test]
fn a_unique_pull_gives_each_distinct_row_once_in_the_plans_order() {
    let (_ra, peers_a, a) = cluster(adagrad);
    let (_rb, peers_b, b) = cluster(adagrad);
    let w = worker(WireFeatures::ALL);
    let mut h = w.handle(64);
    let mut plain = ShardedTables::new(peers_a, &shapes()).unwrap();
    let mut pipe = pipeline(&peers_b, PipelineSettings::default().staleness(0));
    let steps = batches(10, 12, 30, 21);
    pipe.prefetch_tables(&mut h, &refs(&steps[0])).unwrap();
    for (t, step) in steps.iter().enumerate() {
        let ids = refs(step);
        let (parts, report) = pull_unique(&mut pipe, &mut h, &ids);
        assert_eq!(report.step, t as u64);
        // At staleness 0 a prefetch waits for the push before it: only the first goes out
        // before its pull.
        assert_eq!(report.prefetched, if t == 0 { 2 } else { 0 }, "step {t}");
        // What the synchronous client's unique pull gives: the same distinct ids in the
        // same order, the same inverse, the same rows.
        let mut inverse: Vec<Vec<i64>> = ids.iter().map(|i| vec![0; i.len()]).collect();
        let mut unique: Vec<Vec<u64>> = ids.iter().map(|i| vec![0; i.len()]).collect();
        let mut rows = buffers(&ids, 0);
        {
            let mut inv: Vec<&mut [i64]> = inverse.iter_mut().map(|v| v.as_mut_slice()).collect();
            let mut uni: Vec<&mut [u64]> = unique.iter_mut().map(|v| v.as_mut_slice()).collect();
            let r = plain
                .pull_unique(
                    &mut h,
                    &ids,
                    &mut inv,
                    &mut uni,
                    &mut views(&mut rows),
                    secs(20),
                )
                .unwrap();
            assert!(r.is_ok(), "{r:?}");
        }
        let mut unique_total = 0;
        for i in 0..3 {
            let n = plain.unique_len(i);
            unique_total += n;
            assert_eq!(parts[i].0, unique[i][..n], "step {t} table {i}: unique ids");
            assert_eq!(parts[i].2, inverse[i], "step {t} table {i}: inverse");
            assert_eq!(
                parts[i].1,
                rows[i][..n * row_bytes(i)],
                "step {t} table {i}: rows"
            );
        }
        assert_eq!(report.unique, unique_total);
        if let Some(next) = steps.get(t + 1) {
            pipe.prefetch_tables(&mut h, &refs(next)).unwrap();
        }
        // Gradients of the distinct rows, pushed by the distinct ids.
        let grads: Vec<Vec<u8>> = parts
            .iter()
            .map(|(_, r, _)| to_bytes(&f32s(r).iter().map(|x| x * 0.5 + 0.01).collect::<Vec<_>>()))
            .collect();
        let gviews: Vec<&[u8]> = grads.iter().map(|g| g.as_slice()).collect();
        let uniques: Vec<&[u64]> = parts.iter().map(|(u, _, _)| u.as_slice()).collect();
        assert!(plain
            .push(&mut h, &uniques, &gviews, secs(20))
            .unwrap()
            .is_ok());
        let r = pipe.push_tables(&mut h, &uniques, &gviews).unwrap();
        assert_eq!(r.rows_sent, unique_total);
    }
    pipe.flush(&mut h).unwrap();
    let bits = |v: Option<Vec<f32>>| v.map(|v| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>());
    for i in 0..3 {
        for id in 0..30u64 {
            let s = (id % 2) as usize;
            assert_eq!(
                bits(a[s][i].get(id)),
                bits(b[s][i].get(id)),
                "table {i} id {id}"
            );
        }
    }
}

#[test]
fn a_unique_pull_lands_cached_rows_and_checks_its_buffers() {
    // Rows that never change (lr 0): whatever the timing, every row is the PS's.
    let (rts, peers, _tables) = cluster(|d| {
        let init = Init::Uniform {
            scale: 0.5,
            seed: 4,
        };
        MemTable::new(d, init, Optimizer::Sgd { lr: 0.0 })
    });
    let w = worker(WireFeatures::ALL);
    let mut h = w.handle(64);
    let mut plain = ShardedTables::new(peers.clone(), &shapes()).unwrap();
    let settings = PipelineSettings::default()
        .staleness(2)
        .cache_bytes(1 << 14);
    let mut pipe = pipeline(&peers, settings);
    let steps = batches(12, 10, 16, 9);
    let mut hits = 0;
    for step in &steps {
        let ids = refs(step);
        let (parts, report) = pull_unique(&mut pipe, &mut h, &ids);
        hits += report.cache_hits;
        let mut want = buffers(&ids, 0);
        assert!(plain
            .pull(&mut h, &ids, &mut views(&mut want), secs(10))
            .unwrap()
            .is_ok());
        for i in 0..3 {
            let rb = row_bytes(i);
            let (unique, rows, inverse) = &parts[i];
            for (pos, &j) in inverse.iter().enumerate() {
                let j = j as usize;
                assert_eq!(unique[j], ids[i][pos]);
                assert_eq!(
                    rows[j * rb..(j + 1) * rb],
                    want[i][pos * rb..(pos + 1) * rb]
                );
            }
        }
        let grads: Vec<Vec<u8>> = parts
            .iter()
            .enumerate()
            .map(|(i, p)| vec![0; p.0.len() * row_bytes(i)])
            .collect();
        let gviews: Vec<&[u8]> = grads.iter().map(|g| g.as_slice()).collect();
        let uniques: Vec<&[u64]> = parts.iter().map(|(u, _, _)| u.as_slice()).collect();
        pipe.push_tables(&mut h, &uniques, &gviews).unwrap();
    }
    assert!(hits > 0, "no row served from the caches");
    pipe.flush(&mut h).unwrap();
    // Buffers too short are refused before anything is sent, naming the table.
    let before = frames_in(&rts);
    let ids: [&[u64]; 3] = [&[1, 2], &[3], &[]];
    let (mut inv0, mut inv1) = (vec![0i64; 2], vec![0i64; 1]);
    let (mut u0, mut u1) = (vec![0u64; 2], vec![0u64; 0]);
    let (mut o0, mut o1) = (vec![0u8; 32], vec![0u8; 8]);
    let e = pipe
        .pull_tables_unique(
            &mut h,
            &ids,
            &mut [&mut inv0, &mut inv1, &mut []],
            &mut [&mut u0, &mut u1, &mut []],
            &mut [&mut o0, &mut o1, &mut []],
        )
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(e.to_string().contains("table 5: a unique pull of 1 ids needs an inverse of 1 (is 1), room for 1 unique ids (is 0)"), "{e}");
    assert_eq!(frames_in(&rts), before);
}

#[test]
fn a_table_whose_rows_are_only_read_does_not_stop_a_push() {
    let (_rts, peers, tables) = cluster(sgd);
    let w = worker(WireFeatures::ALL);
    let mut h = w.handle(64);
    // Table 3 of f32 rows, and table 9 of u8 rows (read only: gradients of u8 rows do not
    // sum).
    let u8_rows = TableShape {
        table: 9,
        dtype: DType::U8,
        ..shapes()[0]
    };
    let mut pipe = with_table_3(&peers, u8_rows);
    let grads = to_bytes(&[0.5; 8]);
    pipe.push_tables(&mut h, &[&[2, 3], &[]], &[&grads, &[]])
        .unwrap();
    pipe.flush(&mut h).unwrap();
    assert_eq!(tables[0][0].get(2), Some(vec![-0.5; 4]));
    assert_eq!(tables[1][0].get(3), Some(vec![-0.5; 4]));
    // With ids of the u8 table: refused, naming it, nothing sent.
    let e = pipe
        .push_tables(&mut h, &[&[2], &[4]], &[&grads[..16], &[0u8; 4]])
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(e.to_string().contains("table 9's U8 rows"), "{e}");
    assert_eq!(pipe.pushes(), 1);
}

#[test]
fn a_push_one_table_of_which_is_refused_names_that_table() {
    let (_rts, peers, tables) = cluster(sgd);
    let w = worker(WireFeatures::ALL);
    let mut h = w.handle(64);
    // Table 3 is served; table 7 is on no PS task.
    let mut pipe = with_table_3(
        &peers,
        TableShape {
            table: 7,
            ..shapes()[0]
        },
    );
    let grads = to_bytes(&[0.5; 4]);
    pipe.push_tables(&mut h, &[&[2], &[4]], &[&grads, &grads])
        .unwrap();
    let e = pipe.flush(&mut h).unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::Remote(_)), "{e:?}");
    assert!(e.to_string().contains("table 7 refused the push"), "{e}");
    let failed = pipe.failed_pushes();
    assert_eq!((failed.len(), failed[0].step, failed[0].shard), (1, 0, 0));
    // The PS applied what it could: table 3's row.
    assert_eq!(tables[0][0].get(2), Some(vec![-0.5; 4]));
}
