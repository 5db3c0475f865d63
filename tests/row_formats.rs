//! Rows in another float format on the wire, over real sockets: bf16 and f16 pulls of f32
//! tables (the rows rounded exactly as the conversion rounds them), bf16 pushes with a
//! loss scale, the bytes a row costs each way, and peers without the feature (a PS that
//! announces none, a worker that announces none) served in f32.

mod common;

use common::*;
use starwire::float;
use starwire::rows::{Init, MemTable, Optimizer, Partition, PipelineSettings, Rows, Tables};
use starwire::{DType, Options, Peer, Pipeline, Runtime, Sharded, WireFeatures};
use std::sync::Arc;

const DIM: usize = 64;
const TABLE: u32 = 3;

/// A PS serving `table` as table 3, announcing `features`, with `handler_threads` (0:
/// handlers inline on the loop).
fn ps(table: Arc<MemTable>, features: WireFeatures, handler_threads: usize) -> Runtime {
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

/// Rows created at random by a pull (values up to ±4), SGD with rate 1.
fn random_table() -> Arc<MemTable> {
    let init = Init::Uniform {
        scale: 4.0,
        seed: 5,
    };
    Arc::new(MemTable::new(DIM, init, Optimizer::Sgd { lr: 1.0 }))
}

/// Rows a pull does not create, SGD with rate 1: a push subtracts from zero.
fn empty_table() -> Arc<MemTable> {
    Arc::new(MemTable::new(
        DIM,
        Init::Missing,
        Optimizer::Sgd { lr: 1.0 },
    ))
}

/// `values` as they travel in `wire` and come back as f32: the conversion's rounding.
fn through(values: &[f32], wire: DType) -> Vec<f32> {
    values
        .iter()
        .map(|&v| match wire {
            DType::BF16 => float::bf16_to_f32(float::f32_to_bf16(v)),
            DType::F16 => float::f16_to_f32(float::f32_to_f16(v)),
            _ => v,
        })
        .collect()
}

#[test]
fn a_bf16_or_f16_pull_returns_the_table_s_rows_rounded_as_the_format_rounds_them() {
    // Two PS tasks: one answers on its loop, one on handler threads.
    let tables = [random_table(), random_table()];
    let _ps0 = ps(tables[0].clone(), WireFeatures::ALL, 0);
    let _ps1 = ps(tables[1].clone(), WireFeatures::ALL, 2);
    let peers: Vec<Peer> = [&_ps0, &_ps1]
        .iter()
        .map(|r| Peer::from(r.local_addr().unwrap()))
        .collect();
    let w = worker(WireFeatures::ALL);
    let mut h = w.handle(16);
    let ids: Vec<u64> = vec![10, 11, 12, 13, 10, 7, 11, 200];
    for wire in [DType::BF16, DType::F16] {
        let mut table = Sharded::new(
            peers.clone(),
            Partition::Mod,
            TABLE,
            DType::F32,
            &[DIM as u64],
        )
        .unwrap();
        table.set_wire_dtype(wire).unwrap();
        let mut out = vec![0f32; ids.len() * DIM];
        let report = table.pull_typed(&mut h, &ids, &mut out, secs(10)).unwrap();
        assert!(report.is_ok(), "{report:?}");
        assert_eq!(report.fallbacks, 0);
        for (i, &id) in ids.iter().enumerate() {
            let held = tables[(id % 2) as usize].get(id).unwrap();
            let row = &out[i * DIM..(i + 1) * DIM];
            assert_eq!(row, &through(&held, wire)[..], "{wire:?} row of id {id}");
            assert!(row != &held[..], "random rows lose bits in {wire:?}");
        }
    }
    // The request as it travels: a block of bf16 rows, half the bytes of f32.
    let dims = [DIM as u64];
    let rows = Rows::new(TABLE, DType::F32, &dims, &[10, 12]).travel_as(DType::BF16);
    let t = h.pull_rows(peers[0], &[rows], secs(10)).unwrap();
    let pulled = h.wait(t).unwrap();
    let block = pulled.block(0).unwrap();
    assert_eq!(block.dtype(), DType::BF16);
    assert_eq!(block.byte_len(), 2 * DIM * 2, "128 bytes per 64-dim row");
    let mut values = vec![0f32; 2 * DIM];
    pulled.read_f32(0, &mut values).unwrap();
    let mut held = tables[0].get(10).unwrap();
    held.extend(tables[0].get(12).unwrap());
    assert_eq!(values, through(&held, DType::BF16));
}

#[test]
fn a_bf16_push_with_a_loss_scale_updates_the_table_as_f32_gradients_over_the_scale() {
    let tables = [empty_table(), empty_table()];
    let _ps0 = ps(tables[0].clone(), WireFeatures::ALL, 0);
    let _ps1 = ps(tables[1].clone(), WireFeatures::ALL, 2);
    let peers: Vec<Peer> = [&_ps0, &_ps1]
        .iter()
        .map(|r| Peer::from(r.local_addr().unwrap()))
        .collect();
    let w = worker(WireFeatures::ALL);
    let mut h = w.handle(16);
    let mut table = Sharded::new(peers, Partition::Mod, TABLE, DType::F32, &[DIM as u64]).unwrap();
    table.set_wire_dtype(DType::BF16).unwrap();
    table.set_loss_scale(Some(512.0)).unwrap();
    assert!(table.set_loss_scale(Some(0.0)).is_err());
    assert_eq!(table.loss_scale(), Some(512.0));
    // True gradients, and as a scaled loss gives them: x 512. Id 5 twice: summed (in f32)
    // before it travels.
    let ids = [4u64, 5, 5, 9];
    let truth: Vec<f32> = (0..ids.len() * DIM)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) * 1.37e-3)
        .collect();
    let scaled: Vec<f32> = truth.iter().map(|g| g * 512.0).collect();
    let report = table.push_typed(&mut h, &ids, &scaled, secs(10)).unwrap();
    assert!(report.is_ok(), "{report:?}");
    let summed = |id: u64| -> (Vec<f32>, Vec<f32>) {
        let (mut s, mut t) = (vec![0f32; DIM], vec![0f32; DIM]);
        for (i, _) in ids.iter().enumerate().filter(|(_, &x)| x == id) {
            for k in 0..DIM {
                s[k] += scaled[i * DIM + k];
                t[k] += truth[i * DIM + k];
            }
        }
        (s, t)
    };
    for id in [4u64, 5, 9] {
        let (scaled_sum, true_sum) = summed(id);
        let got = tables[(id % 2) as usize].get(id).unwrap();
        // Exactly what the PS computes: the bf16 gradient, widened, times 1/512 (exact).
        let want: Vec<f32> = through(&scaled_sum, DType::BF16)
            .iter()
            .map(|g| -(g / 512.0))
            .collect();
        assert_eq!(got, want, "row of id {id}");
        // Which is the true gradient within bf16's rounding.
        for k in 0..DIM {
            let err = (got[k] + true_sum[k]).abs();
            assert!(err <= true_sum[k].abs() / 256.0, "id {id} element {k}");
        }
    }
}

#[test]
fn peers_without_the_feature_are_served_in_f32() {
    // A PS that announces nothing (as one of an earlier release does)...
    let old_ps = empty_table();
    let _ps = ps(old_ps.clone(), WireFeatures::NONE, 0);
    let peer = Peer::from(_ps.local_addr().unwrap());
    let w = worker(WireFeatures::ALL);
    let mut h = w.handle(16);
    let mut table =
        Sharded::new(vec![peer], Partition::Mod, TABLE, DType::F32, &[DIM as u64]).unwrap();
    table.set_wire_dtype(DType::BF16).unwrap();
    table.set_loss_scale(Some(4.0)).unwrap();
    let grads: Vec<f32> = (0..2 * DIM).map(|i| i as f32 * 0.0123 - 0.7).collect();
    let report = table.push_typed(&mut h, &[1, 2], &grads, secs(10)).unwrap();
    assert!(report.is_ok(), "{report:?}");
    // ...got f32 gradients, divided by the scale before they were sent (exact: 1/4).
    let mut got = old_ps.get(1).unwrap();
    got.extend(old_ps.get(2).unwrap());
    let want: Vec<f32> = grads.iter().map(|g| -(g * 0.25)).collect();
    assert_eq!(got, want);
    // ...and answers f32 rows, exactly as it holds them; the report says so.
    let mut out = vec![0f32; 2 * DIM];
    let report = table
        .pull_typed(&mut h, &[1, 2], &mut out, secs(10))
        .unwrap();
    assert!(report.is_ok(), "{report:?}");
    assert_eq!(report.fallbacks, 1);
    assert_eq!(out, want);

    // A worker that announces nothing asks a PS with the feature as before: f32 rows.
    let table_new = random_table();
    let _new_ps = ps(table_new.clone(), WireFeatures::ALL, 0);
    let new_peer = Peer::from(_new_ps.local_addr().unwrap());
    let old_worker = worker(WireFeatures::NONE);
    let mut h = old_worker.handle(16);
    let mut table = Sharded::new(
        vec![new_peer],
        Partition::Mod,
        TABLE,
        DType::F32,
        &[DIM as u64],
    )
    .unwrap();
    table.set_wire_dtype(DType::BF16).unwrap();
    let mut out = vec![0f32; DIM];
    let report = table.pull_typed(&mut h, &[8], &mut out, secs(10)).unwrap();
    assert_eq!(report.fallbacks, 1);
    assert_eq!(out, table_new.get(8).unwrap());
}

#[test]
fn a_pipeline_moves_half_the_row_bytes_as_bf16() {
    let table = random_table();
    let _ps = ps(table.clone(), WireFeatures::ALL, 0);
    let peers = vec![Peer::from(_ps.local_addr().unwrap())];
    let w = worker(WireFeatures::ALL);
    let mut h = w.handle(16);
    let ids: Vec<u64> = (100..132).collect();
    let mut bytes_per_row = Vec::new();
    for wire in [None, Some(DType::BF16)] {
        let settings = PipelineSettings::default().staleness(0).wire_dtype(wire);
        let dims = [DIM as u64];
        let mut p = Pipeline::new(
            peers.clone(),
            Partition::Mod,
            TABLE,
            DType::F32,
            &dims,
            settings,
        )
        .unwrap();
        let mut out = vec![0f32; ids.len() * DIM];
        let r = p.pull_typed(&mut h, &ids, &mut out).unwrap();
        bytes_per_row.push(r.bytes_received / r.rows_received as u64);
        let held: Vec<f32> = ids.iter().flat_map(|&id| table.get(id).unwrap()).collect();
        assert_eq!(out, through(&held, wire.unwrap_or(DType::F32)));
        // Gradients of zero: the rows stay; the push travels as the pull did.
        let r = p
            .push_typed(&mut h, &ids, &vec![0f32; ids.len() * DIM])
            .unwrap();
        assert_eq!(
            r.bytes_sent,
            (8 + bytes_per_row[bytes_per_row.len() - 1]) * 32 + 8 * 32
        );
        p.flush(&mut h).unwrap();
    }
    assert_eq!(
        bytes_per_row,
        [256, 128],
        "bytes of a 64-dim row: f32, bf16"
    );
    // A wire dtype the table's rows do not convert into is refused, naming the setting.
    let bad = PipelineSettings::default().wire_dtype(Some(DType::I32));
    let e =
        Pipeline::new(peers, Partition::Mod, TABLE, DType::F32, &[DIM as u64], bad).unwrap_err();
    assert!(e.to_string().contains("wire_dtype"), "{e}");
}
