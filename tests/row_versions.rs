//! Row versions over real sockets: versioned pulls of a `PsTable` (answered on the loop
//! and with handler threads) and of a `MemTable`, rows not sent when unchanged and sent
//! with their new versions after a push, a PS restarted from a checkpoint or from empty
//! (and a row evicted and created again) never answering a held version unchanged, and
//! peers without the feature (a worker or a PS announcing none, as with
//! `STARWIRE_WIRE_FEATURES=none`) served with plain pulls, every row changed, version 0.

mod common;

use common::*;
use starwire::rows::ps::{Init as PsInit, Optimizer as PsOptimizer, PsTable, PsTableBuilder};
use starwire::rows::{Init, MemTable, Optimizer, PulledRows, Rows, Tables};
use starwire::{DType, Options, Peer, Runtime, Status, Table, WireFeatures};
use std::path::PathBuf;
use std::sync::Arc;

const DIM: usize = 8;
const TABLE: u32 = 5;

fn ps(table: Arc<dyn Table>, features: WireFeatures, handler_threads: usize) -> Runtime {
    let options = Options {
        service: Some(Arc::new(Tables::new().with(TABLE, table))),
        handler_threads: Some(handler_threads),
        ..Options::listen("127.0.0.1:0".parse().unwrap())
    };
    let cfg = config("ps", 1).wire_features(features).build().unwrap();
    Runtime::start_with(cfg, options).expect("ps starts")
}

fn worker(features: WireFeatures) -> Runtime {
    let cfg = config("worker", 1).wire_features(features).build().unwrap();
    Runtime::start(cfg, None).expect("worker starts")
}

fn ps_table() -> PsTableBuilder {
    PsTable::builder(DIM)
        .table_id(TABLE)
        .init(PsInit::Uniform {
            scale: 0.5,
            seed: 9,
        })
        .optimizer(PsOptimizer::Sgd { lr: 1.0 })
        .huge_pages(false)
}

fn le(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// A versioned pull of `ids` of the table with `held`, waited for.
fn pull(h: &mut starwire::Handle, peer: Peer, ids: &[u64], held: &[u64]) -> PulledRows {
    let dims = [DIM as u64];
    let rows = Rows::new(TABLE, DType::F32, &dims, ids);
    let t = h
        .pull_rows_versioned(peer, &[rows], held, secs(10))
        .unwrap();
    h.wait(t).unwrap()
}

/// Pushes a gradient of `g` on every element of `ids`' rows, waited for.
fn push(h: &mut starwire::Handle, peer: Peer, ids: &[u64], g: f32) {
    let dims = [DIM as u64];
    let grads = le(&vec![g; ids.len() * DIM]);
    let rows = Rows::new(TABLE, DType::F32, &dims, ids);
    let t = h.push_rows(peer, &[(rows, &grads[..])], secs(10)).unwrap();
    assert_eq!(h.wait(t).unwrap(), [Status::Ok]);
}

/// A worker's cache of the rows of `ids`: their bytes and versions, updated from each
/// versioned pull as a cache would be.
struct Cache {
    ids: Vec<u64>,
    rows: Vec<u8>,
    versions: Vec<u64>,
}

impl Cache {
    fn new(ids: &[u64]) -> Cache {
        Cache {
            ids: ids.to_vec(),
            rows: vec![0; ids.len() * DIM * 4],
            versions: vec![0; ids.len()],
        }
    }

    /// Pulls with the versions held; the positions that came unchanged.
    fn refresh(&mut self, h: &mut starwire::Handle, peer: Peer) -> Vec<usize> {
        let got = pull(h, peer, &self.ids, &self.versions);
        got.write_changed(0, &mut self.rows).unwrap();
        self.versions.copy_from_slice(got.versions(0));
        (0..self.ids.len())
            .filter(|&i| got.unchanged(0, i))
            .collect()
    }

    /// Whether the cached rows are the table's.
    fn matches(&self, table: &dyn Table) -> bool {
        let mut want = vec![0u8; self.rows.len()];
        let mut missing = Vec::new();
        assert_eq!(table.pull(&self.ids, &mut want, &mut missing), Status::Ok);
        want == self.rows
    }
}

#[test]
fn a_ps_table_sends_only_the_rows_that_changed() {
    for handler_threads in [0, 2] {
        let table = Arc::new(ps_table().build().unwrap());
        let server = ps(table.clone(), WireFeatures::ALL, handler_threads);
        let peer = Peer::from(server.local_addr().unwrap());
        let w = worker(WireFeatures::ALL);
        let mut h = w.handle(8);
        let ids = [1u64, 2, 3, 4, 5, 6];
        let mut cache = Cache::new(&ids);
        assert!(cache.refresh(&mut h, peer).is_empty(), "nothing held yet");
        assert!(cache.versions.iter().all(|&v| v != 0));
        assert!(cache.matches(&*table));
        // Nothing pushed: everything unchanged, no row sent.
        assert_eq!(cache.refresh(&mut h, peer), [0, 1, 2, 3, 4, 5]);
        let before = cache.versions.clone();
        // Rows 2 and 5 pushed: they alone are sent, with newer versions.
        push(&mut h, peer, &[2, 5], 0.25);
        assert_eq!(cache.refresh(&mut h, peer), [0, 2, 3, 5]);
        assert!(cache.versions[1] > before[1] && cache.versions[4] > before[4]);
        assert_eq!(cache.versions[0], before[0]);
        assert!(cache.matches(&*table), "threads {handler_threads}");
        let m = table.metrics();
        assert_eq!(m.unchanged_rows, 6 + 4, "threads {handler_threads}");
    }
}

#[test]
fn a_mem_table_sends_only_the_rows_that_changed() {
    let uniform = Init::Uniform {
        scale: 1.0,
        seed: 2,
    };
    let table = Arc::new(MemTable::new(DIM, uniform, Optimizer::Sgd { lr: 1.0 }));
    let server = ps(table.clone(), WireFeatures::ALL, 0);
    let peer = Peer::from(server.local_addr().unwrap());
    let w = worker(WireFeatures::ALL);
    let mut h = w.handle(8);
    let ids = [10u64, 20, 30];
    let mut cache = Cache::new(&ids);
    assert!(cache.refresh(&mut h, peer).is_empty());
    push(&mut h, peer, &[30], -1.0);
    assert_eq!(cache.refresh(&mut h, peer), [0, 1]);
    assert!(cache.matches(&*table));
    assert_eq!(cache.versions[2], table.version(30).unwrap());
}

/// A fresh directory for one test, removed when dropped.
struct Dir(PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn a_restarted_ps_never_answers_a_held_version_unchanged() {
    let dir = Dir(std::env::temp_dir().join(format!("starwire-versions-{}", std::process::id())));
    let ids = [7u64, 8, 9];
    let w = worker(WireFeatures::ALL);
    let mut h = w.handle(8);
    let mut cache = Cache::new(&ids);
    {
        let table = Arc::new(ps_table().build().unwrap());
        let server = ps(table.clone(), WireFeatures::ALL, 0);
        let peer = Peer::from(server.local_addr().unwrap());
        cache.refresh(&mut h, peer);
        push(&mut h, peer, &ids, 0.5);
        assert!(cache.refresh(&mut h, peer).is_empty(), "all pushed");
        table.save(&dir.0).unwrap();
        // Pushed after the checkpoint: the cache holds rows the checkpoint does not.
        push(&mut h, peer, &[8], 0.5);
        assert_eq!(cache.refresh(&mut h, peer), [0, 2]);
    }
    // Restored from the checkpoint: same rows for 7 and 9, an older row for 8; no held
    // version matches, so every row is sent, and the cache ends as the restored table.
    let restored = Arc::new(ps_table().load(&dir.0).unwrap());
    let server = ps(restored.clone(), WireFeatures::ALL, 0);
    let peer = Peer::from(server.local_addr().unwrap());
    assert!(
        cache.refresh(&mut h, peer).is_empty(),
        "nothing unchanged after a restore"
    );
    assert!(cache.matches(&*restored));
    assert_eq!(cache.refresh(&mut h, peer), [0, 1, 2]);
    drop(server);
    // Restarted from empty: rows made again at their initial values; nothing unchanged.
    let fresh = Arc::new(ps_table().build().unwrap());
    let server = ps(fresh.clone(), WireFeatures::ALL, 0);
    let peer = Peer::from(server.local_addr().unwrap());
    assert!(
        cache.refresh(&mut h, peer).is_empty(),
        "nothing unchanged after a restart"
    );
    assert!(cache.matches(&*fresh));
}

#[test]
fn a_row_evicted_and_created_again_is_not_unchanged() {
    let table = Arc::new(ps_table().evict_untouched(1).build().unwrap());
    let server = ps(table.clone(), WireFeatures::ALL, 0);
    let peer = Peer::from(server.local_addr().unwrap());
    let w = worker(WireFeatures::ALL);
    let mut h = w.handle(8);
    let mut cache = Cache::new(&[3]);
    cache.refresh(&mut h, peer);
    let held = cache.versions[0];
    // Untouched for two ticks: evicted.
    for _ in 0..3 {
        table.advance_clock();
        table.maintain();
    }
    assert_eq!(table.version(3), None, "evicted");
    assert!(
        cache.refresh(&mut h, peer).is_empty(),
        "created again: sent"
    );
    assert_ne!(cache.versions[0], held);
    assert_eq!(Some(cache.versions[0]), table.version(3));
}

#[test]
fn peers_without_the_feature_get_plain_pulls_every_row_changed() {
    let uniform = Init::Uniform {
        scale: 1.0,
        seed: 4,
    };
    let table = Arc::new(MemTable::new(DIM, uniform, Optimizer::Sgd { lr: 1.0 }));
    // A worker announcing none (`STARWIRE_WIRE_FEATURES=none`), and a PS announcing only
    // row formats.
    for (client, server) in [
        (WireFeatures::NONE, WireFeatures::ALL),
        (WireFeatures::ALL, WireFeatures::ROW_FORMATS),
        (WireFeatures::ALL, WireFeatures::NONE),
    ] {
        let server_rt = ps(table.clone(), server, 0);
        let peer = Peer::from(server_rt.local_addr().unwrap());
        let w = worker(client);
        let mut h = w.handle(8);
        let ids = [1u64, 2];
        let versions = [table.version(1).unwrap_or(1), table.version(2).unwrap_or(1)];
        let got = pull(&mut h, peer, &ids, &versions);
        assert_eq!(got.versions(0), [0, 0], "{client} {server}");
        assert_eq!(got.unchanged_count(0), 0);
        let mut cache = Cache::new(&ids);
        assert_eq!(got.write_changed(0, &mut cache.rows), Ok(2));
        assert!(cache.matches(&*table));
    }
}

#[test]
fn held_versions_of_another_count_fail_at_once() {
    let w = worker(WireFeatures::ALL);
    let mut h = w.handle(8);
    let peer = Peer::from("127.0.0.1:9".parse::<std::net::SocketAddr>().unwrap());
    let dims = [DIM as u64];
    let rows = Rows::new(TABLE, DType::F32, &dims, &[1, 2]);
    let e = h
        .pull_rows_versioned(peer, &[rows], &[0], secs(1))
        .unwrap_err();
    assert_eq!(e.kind(), starwire::ErrorKind::InvalidArgument);
}
