//! No heap allocation per step of the pipelined sharded rows client in steady state: pull,
//! prefetch of the next batch, push not waited for, two PS tasks, counted by this test
//! binary's global allocator across the whole process (the worker's loops and both PS
//! tasks' run here too). The rows are checked on every step, so the allocation-free path is
//! also the correct one.

mod common;

use common::*;
use starwire::client::Mode;
use starwire::rows::{Init, MemTable, Optimizer, Partition, PipelineSettings, Tables};
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

/// Two PS tasks whose tables hold every id of the universe at zero; SGD with lr 0, so
/// every row stays zero and each pull can be checked.
fn cluster() -> (Vec<Runtime>, Vec<Peer>) {
    let rts: Vec<Runtime> = (0..2)
        .map(|_| {
            let table = Arc::new(MemTable::new(DIM, Init::Zeros, Optimizer::Sgd { lr: 0.0 }));
            let options = Options {
                service: Some(Arc::new(Tables::new().with(TABLE, table))),
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

/// Allocations over 500 steps at staleness `s` (after 200 to warm up), through `client`.
fn steps<M: Mode>(client: &mut Client<M>, peers: Vec<Peer>, s: u32) -> u64 {
    let settings = PipelineSettings::default()
        .staleness(s)
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
    let mut run = |from: u64, n: u64| {
        batch(from, &mut ids);
        pipe.prefetch(client, &ids).unwrap();
        for t in from..from + n {
            rows.fill(1.0);
            let r = pipe.pull_typed(client, &ids, &mut rows).unwrap();
            assert_eq!((r.unique, r.missing), (100, 0));
            assert!(rows.iter().all(|&v| v == 0.0));
            batch(t + 1, &mut next);
            pipe.prefetch(client, &next).unwrap();
            let r = pipe.push_typed(client, &ids, &grads).unwrap();
            assert_eq!(r.rows_sent, 100);
            most_in_flight = most_in_flight.max(r.pushes_in_flight);
            ids = next;
        }
    };
    run(0, 200);
    let before = counting::allocations();
    run(200, 500);
    let n = counting::allocations() - before;
    pipe.flush(client).unwrap();
    assert!(most_in_flight >= 1);
    n
}

#[test]
fn handle_steps_allocate_nothing_in_steady_state() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    for s in [0, 1, 2] {
        let (_rts, peers) = cluster();
        let worker = client(1);
        let mut h = worker.handle(64);
        let n = steps(&mut h, peers, s);
        assert_eq!(n, 0, "allocations over 500 steps at staleness {s}");
        assert_eq!(h.outstanding(), 0);
    }
}

#[test]
fn embedded_steps_allocate_nothing_in_steady_state() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let (_rts, peers) = cluster();
    let mut e = Embedded::new(config("worker", 1).build().unwrap(), None).unwrap();
    let n = steps(&mut e, peers, 1);
    assert_eq!(n, 0, "allocations over 500 embedded steps");
    assert_eq!(e.outstanding(), 0);
}
