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
    let settings = PipelineSettings::default()
        .staleness(0)
        .cache_bytes(1 << 16)
        .timeout(Some(Duration::from_secs(20)));
    let mut pipe = Pipeline::new(
        peers.clone(),
        Partition::Mod,
        TABLE,
        DType::F32,
        &[DIM as u64],
        settings,
    )
    .unwrap();
    let mut plain = Sharded::new(peers, Partition::Mod, TABLE, DType::F32, &[DIM as u64]).unwrap();
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
