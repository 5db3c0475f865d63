//! The pipeline's row cache refreshed by versioned pulls, over real sockets, two PS tasks
//! with `MemTable`s (which keep row versions): at staleness 0 every row is asked for, each
//! cached one named with its version, and the PS answers the rows nobody pushed unchanged
//! (their bytes do not travel: the cache's copy is used) and sends the pushed ones; the
//! rows are those a plain `Sharded` pull returns, bit for bit. A worker that does not
//! announce `row_versions` gets every row sent, the same rows.

mod common;

use common::*;
use starwire::rows::{Init, MemTable, Optimizer, Partition, PipelineSettings, Tables};
use starwire::{DType, Options, Peer, Pipeline, Runtime, Sharded, Table, WireFeatures};
use std::sync::Arc;
use std::time::Duration;

const DIM: usize = 4;
const ROW_BYTES: usize = DIM * 4;
const TABLE: u32 = 6;

fn ps() -> Runtime {
    let init = Init::Uniform {
        scale: 0.5,
        seed: 3,
    };
    let table: Arc<dyn Table> = Arc::new(MemTable::new(DIM, init, Optimizer::Sgd { lr: 0.5 }));
    let options = Options {
        service: Some(Arc::new(Tables::new().with(TABLE, table))),
        ..Options::listen("127.0.0.1:0".parse().unwrap())
    };
    // Announces every feature whatever STARWIRE_WIRE_FEATURES says: the workers choose.
    let cfg = config("ps", 1)
        .wire_features(WireFeatures::ALL)
        .build()
        .unwrap();
    Runtime::start_with(cfg, options).expect("ps starts")
}

fn worker(features: WireFeatures) -> Runtime {
    let cfg = config("worker", 1).wire_features(features).build().unwrap();
    Runtime::start(cfg, None).expect("worker starts")
}

/// A pipeline at staleness 0 with a row cache of `cache_bytes`, and a plain sharded
/// client to compare with, over `peers`.
fn clients(peers: &[Peer], cache_bytes: usize) -> (Pipeline, Sharded) {
    let settings = PipelineSettings::default()
        .staleness(0)
        .cache_bytes(cache_bytes)
        .timeout(Some(Duration::from_secs(20)));
    let dims = [DIM as u64];
    let pipe = Pipeline::new(
        peers.to_vec(),
        Partition::Mod,
        TABLE,
        DType::F32,
        &dims,
        settings,
    )
    .unwrap();
    let plain = Sharded::new(peers.to_vec(), Partition::Mod, TABLE, DType::F32, &dims).unwrap();
    (pipe, plain)
}

/// Runs six steps of pull, check against `Sharded`, push of a few ids; returns per step
/// the report's (rows received, rows unchanged, cache misses).
fn steps(features: WireFeatures) -> Vec<(usize, usize, usize)> {
    let rts = [ps(), ps()];
    let peers: Vec<Peer> = rts
        .iter()
        .map(|r| Peer::from(r.local_addr().unwrap()))
        .collect();
    let worker = worker(features);
    let mut h = worker.handle(64);
    let (mut pipe, mut plain) = clients(&peers, 1 << 16);
    // 40 ids, 8 of them twice; the pushes touch ids 3, 10 and 21 (on both PS tasks).
    let ids: Vec<u64> = (0..40).chain(0..8).collect();
    let pushed = [3u64, 10, 21];
    let mut seen = Vec::new();
    for step in 0..6 {
        let mut got = vec![0xaau8; ids.len() * ROW_BYTES];
        let r = pipe.pull(&mut h, &ids, &mut got).unwrap().clone();
        let mut want = vec![0u8; ids.len() * ROW_BYTES];
        let t = plain.pull(&mut h, &ids, &mut want, secs(10)).unwrap();
        assert!(t.is_ok(), "step {step}: {t:?}");
        assert_eq!(got, want, "step {step}: rows differ from a plain pull");
        assert_eq!(
            (r.unique, r.cache_hits, r.missing),
            (40, 0, 0),
            "step {step}"
        );
        seen.push((r.rows_received, r.rows_unchanged, r.cache_misses));
        let grads = vec![0.25f32; pushed.len() * DIM];
        pipe.push_typed(&mut h, &pushed, &grads).unwrap();
        pipe.flush(&mut h).unwrap();
    }
    seen
}

#[test]
fn rows_nobody_pushed_come_back_unchanged_without_their_bytes() {
    let seen = steps(WireFeatures::ALL);
    // The first pull finds the cache empty: every row travels.
    assert_eq!(seen[0], (40, 0, 40));
    // Then only the three rows pushed since the last pull travel; the others are the
    // cache's copies, answered unchanged.
    for (step, &s) in seen.iter().enumerate().skip(1) {
        assert_eq!(s, (3, 37, 40), "step {step}");
    }
}

#[test]
fn a_worker_without_row_versions_gets_every_row_sent() {
    let seen = steps(WireFeatures::ROW_FORMATS);
    for (step, &s) in seen.iter().enumerate() {
        assert_eq!(s, (40, 0, 40), "step {step}");
    }
}

#[test]
fn versions_that_save_nothing_are_paused_and_tried_again_the_rows_unchanged() {
    let rts = [ps(), ps()];
    let peers: Vec<Peer> = rts
        .iter()
        .map(|r| Peer::from(r.local_addr().unwrap()))
        .collect();
    let worker = worker(WireFeatures::ALL);
    let mut h = worker.handle(64);
    let (mut pipe, mut plain) = clients(&peers, 1 << 20);
    // As a trainer does: every row pulled is pushed, so no cached row is ever unchanged.
    let ids: Vec<u64> = (0..1024).collect();
    let grads = vec![0u8; ids.len() * ROW_BYTES];
    let grads: Vec<u8> = grads
        .chunks(4)
        .flat_map(|_| 0.01f32.to_le_bytes())
        .collect();
    // Pull bytes sent per step: 8 per id, 8 more per id when versions are named.
    let mut pull_bytes = Vec::new();
    let mut pauses = Vec::new();
    for step in 0..80 {
        let mut got = vec![0u8; ids.len() * ROW_BYTES];
        let r = pipe.pull(&mut h, &ids, &mut got).unwrap().clone();
        assert_eq!(r.rows_unchanged, 0, "step {step}");
        assert_eq!(r.rows_received, ids.len(), "step {step}");
        pull_bytes.push(r.bytes_sent);
        if step % 16 == 0 {
            let mut want = vec![0u8; got.len()];
            assert!(plain
                .pull(&mut h, &ids, &mut want, secs(10))
                .unwrap()
                .is_ok());
            assert_eq!(got, want, "step {step}: rows differ from a plain pull");
        }
        pipe.push(&mut h, &ids, &grads).unwrap();
        pipe.flush(&mut h).unwrap();
        pauses.push(pipe.versioned_pauses());
    }
    let (versioned, plain_pull) = (16 * ids.len() as u64, 8 * ids.len() as u64);
    // Step 0 names nothing yet but asks for versions; from step 1 every id is named. The
    // window of 4,096 named rows closes at step 4; plain pulls follow for 64 steps.
    assert_eq!(&pull_bytes[..5], &[versioned; 5]);
    assert_eq!(pauses[3], 0);
    assert_eq!(pauses[4], 1);
    assert!(
        pull_bytes[5..69].iter().all(|&b| b == plain_pull),
        "{pull_bytes:?}"
    );
    // Then versions are tried again (the rows fetched plain hold none: named after one
    // more step), and paused once more.
    assert_eq!(pull_bytes[69], versioned);
    assert_eq!(pipe.versioned_pauses(), 2);
    assert!(
        pull_bytes[75..].iter().all(|&b| b == plain_pull),
        "{pull_bytes:?}"
    );
}
