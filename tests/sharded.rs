//! The sharded rows client over real sockets: a table partitioned over three PS tasks,
//! batches with duplicates and unknown ids, gradients of duplicates summed, and one PS
//! failing while the others answer.

mod common;

use common::*;
use starwire::rows::Partition;
use starwire::rows::{Init, MemTable, Optimizer, Tables};
use starwire::{DType, ErrorKind, Options, Peer, Runtime, Sharded, Status};
use std::sync::Arc;

const DIM: usize = 4;

fn ps(table: Arc<MemTable>) -> Runtime {
    let options = Options {
        service: Some(Arc::new(Tables::new().with(3, table))),
        ..Options::listen("127.0.0.1:0".parse().unwrap())
    };
    Runtime::start_with(config("ps", 1).build().unwrap(), options).expect("ps starts")
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

fn bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Three PS tasks, each a MemTable with SGD (lr 1) whose rows start missing.
fn cluster() -> (Vec<Runtime>, Vec<Arc<MemTable>>, Vec<Peer>) {
    let tables: Vec<Arc<MemTable>> = (0..3)
        .map(|_| {
            Arc::new(MemTable::new(
                DIM,
                Init::Missing,
                Optimizer::Sgd { lr: 1.0 },
            ))
        })
        .collect();
    let rts: Vec<Runtime> = tables.iter().map(|t| ps(t.clone())).collect();
    let peers = rts
        .iter()
        .map(|r| Peer::from(r.local_addr().unwrap()))
        .collect();
    (rts, tables, peers)
}

#[test]
fn a_step_pushes_summed_gradients_and_pulls_them_back_with_duplicates_filled() {
    let (_rts, tables, peers) = cluster();
    let worker = client(1);
    let mut h = worker.handle(16);
    let mut sharded = Sharded::new(peers, Partition::Mod, 3, DType::F32, &[DIM as u64]).unwrap();
    assert_eq!(sharded.row_bytes(), 16);
    let ids = [1u64, 2, 3, 1, 4, 1, 9];
    // Before any push every row is missing: zeros, counted per batch position.
    let mut out = vec![0xffu8; ids.len() * 16];
    let report = h_pull(&mut sharded, &mut h, &ids, &mut out);
    assert!(report.is_ok(), "{report:?}");
    assert_eq!((report.unique, report.missing), (5, 7));
    assert!(out.iter().all(|&b| b == 0));
    // Gradient of position i: i + 1 in every element; SGD with lr 1 subtracts it from 0.
    let grads: Vec<f32> = (0..ids.len()).flat_map(|i| [i as f32 + 1.0; DIM]).collect();
    let report = sharded
        .push(&mut h, &ids, &bytes(&grads), secs(10))
        .unwrap();
    assert!(report.is_ok(), "{report:?}");
    // Id 1 is at positions 0, 3 and 5: its gradients summed to 1 + 4 + 6 = 11.
    assert_eq!(tables[1].get(1), Some(vec![-11.0; DIM]));
    assert_eq!(tables[0].get(3), Some(vec![-3.0; DIM]));
    assert_eq!(tables[0].get(9), Some(vec![-7.0; DIM]));
    let report = h_pull(&mut sharded, &mut h, &ids, &mut out);
    assert_eq!((report.unique, report.missing), (5, 0));
    let rows = f32s(&out);
    let want = [-11.0, -2.0, -3.0, -11.0, -5.0, -11.0, -7.0];
    for (i, w) in want.iter().enumerate() {
        assert_eq!(&rows[i * DIM..(i + 1) * DIM], &[*w; DIM], "position {i}");
    }
    assert_eq!(h.outstanding(), 0);
}

#[test]
fn typed_rows_go_through_without_a_byte_conversion_by_the_caller() {
    let (_rts, tables, peers) = cluster();
    let worker = client(1);
    let mut h = worker.handle(16);
    let mut sharded = Sharded::new(peers, Partition::Mod, 3, DType::F32, &[DIM as u64]).unwrap();
    let ids = [1u64, 2, 1, 5];
    // Gradient of position i: i + 1 in every element; id 1 is at positions 0 and 2.
    let grads: Vec<f32> = (0..ids.len()).flat_map(|i| [i as f32 + 1.0; DIM]).collect();
    let report = sharded.push_typed(&mut h, &ids, &grads, secs(10)).unwrap();
    assert!(report.is_ok(), "{report:?}");
    assert_eq!(report.unique, 3);
    assert_eq!(tables[1].get(1), Some(vec![-4.0; DIM]));
    assert_eq!(tables[2].get(5), Some(vec![-4.0; DIM]));
    let mut rows = vec![f32::NAN; ids.len() * DIM];
    let report = sharded
        .pull_typed(&mut h, &ids, &mut rows, secs(10))
        .unwrap()
        .clone();
    assert!(report.is_ok(), "{report:?}");
    assert_eq!((report.unique, report.missing), (3, 0));
    for (i, w) in [-4.0, -2.0, -4.0, -4.0].iter().enumerate() {
        assert_eq!(&rows[i * DIM..(i + 1) * DIM], &[*w; DIM], "position {i}");
    }
    // The same rows as the byte call gives.
    let mut out = vec![0u8; ids.len() * 16];
    h_pull(&mut sharded, &mut h, &ids, &mut out);
    assert_eq!(f32s(&out), rows);

    // Another element type, or a buffer that is not whole rows: refused, nothing sent.
    let mut wide = vec![0f64; ids.len() * DIM];
    let e = sharded
        .pull_typed(&mut h, &ids, &mut wide, secs(10))
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(
        e.remote_message().is_some_and(|m| m.contains("F32")),
        "{e:?}"
    );
    let e = sharded
        .push_typed(&mut h, &ids, &[1i32; 16], secs(10))
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    let e = sharded
        .push_typed(&mut h, &ids, &grads[..DIM], secs(10))
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert_eq!(h.outstanding(), 0);
    assert_eq!(tables[1].get(1), Some(vec![-4.0; DIM]));
}

fn h_pull(
    sharded: &mut Sharded,
    h: &mut starwire::Handle,
    ids: &[u64],
    out: &mut [u8],
) -> starwire::StepReport {
    sharded.pull(h, ids, out, secs(10)).unwrap().clone()
}

#[test]
fn one_ps_failing_fails_its_part_alone() {
    let (mut rts, _tables, peers) = cluster();
    let worker = client(1);
    let mut h = worker.handle(16);
    let mut sharded = Sharded::new(peers, Partition::Mod, 3, DType::F32, &[DIM as u64]).unwrap();
    let ids: Vec<u64> = (0..30).collect();
    let grads = bytes(&vec![1.0; ids.len() * DIM]);
    assert!(sharded
        .push(&mut h, &ids, &grads, secs(10))
        .unwrap()
        .is_ok());
    // PS 1 goes away.
    rts.remove(1).shutdown();
    let mut out = vec![0u8; ids.len() * 16];
    let report = sharded
        .pull(&mut h, &ids, &mut out, secs(10))
        .unwrap()
        .clone();
    let (failed, e) = report.first_error().expect("PS 1 failed");
    assert_eq!(failed, 1);
    assert!(e.is_connection(), "{e:?}");
    assert!(
        report.shards[0].is_ok() && report.shards[2].is_ok(),
        "{report:?}"
    );
    let rows = f32s(&out);
    for id in ids.iter().filter(|&&id| id % 3 != 1) {
        let i = *id as usize;
        assert_eq!(&rows[i * DIM..(i + 1) * DIM], &[-1.0; DIM], "id {id}");
    }
    assert_eq!(h.outstanding(), 0);
}

#[test]
fn a_table_of_another_shape_and_bad_buffers_are_errors() {
    let (_rts, _tables, peers) = cluster();
    let worker = client(1);
    let mut h = worker.handle(16);
    let mut wrong = Sharded::new(peers.clone(), Partition::Hash, 3, DType::F32, &[8]).unwrap();
    let ids = [1u64, 2, 3];
    let mut out = vec![0u8; 3 * 32];
    let report = wrong
        .pull(&mut h, &ids, &mut out, secs(10))
        .unwrap()
        .clone();
    let (_, e) = report.first_error().unwrap();
    assert_eq!(e.kind(), ErrorKind::Remote(Status::InvalidArgument));
    let mut right = Sharded::new(peers, Partition::Hash, 3, DType::F32, &[DIM as u64]).unwrap();
    let mut short = vec![0u8; 3 * 16 - 1];
    let e = right.pull(&mut h, &ids, &mut short, None).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(Sharded::new(vec![], Partition::Mod, 3, DType::F32, &[4]).is_err());
    assert_eq!(h.outstanding(), 0);
}

#[test]
fn a_unique_pull_gives_each_distinct_row_once_and_where_each_position_s_id_is() {
    let (mut rts, _tables, peers) = cluster();
    let worker = client(1);
    let mut h = worker.handle(16);
    let mut sharded = Sharded::new(peers, Partition::Mod, 3, DType::F32, &[DIM as u64]).unwrap();
    let ids = [1u64, 2, 3, 1, 4, 1, 9, 2];
    // Each id's row made distinct: -(position + 1) summed over its positions.
    let grads: Vec<f32> = (0..ids.len()).flat_map(|i| [i as f32 + 1.0; DIM]).collect();
    assert!(sharded
        .push(&mut h, &ids, &bytes(&grads), secs(10))
        .unwrap()
        .is_ok());
    let mut plain = vec![0u8; ids.len() * 16];
    h_pull(&mut sharded, &mut h, &ids, &mut plain);
    let plain = f32s(&plain);

    let mut inverse = vec![-1i64; ids.len()];
    let mut unique = vec![0u64; ids.len()];
    let mut out = vec![0xffu8; ids.len() * 16];
    let report = sharded
        .pull_unique(&mut h, &ids, &mut inverse, &mut unique, &mut out, secs(10))
        .unwrap()
        .clone();
    assert!(report.is_ok(), "{report:?}");
    assert_eq!((report.unique, report.missing), (5, 0));
    // By PS (id mod 3), each PS's ids in the order first seen.
    assert_eq!(&unique[..5], &[3, 9, 1, 4, 2]);
    let rows = f32s(&out);
    for (pos, &id) in ids.iter().enumerate() {
        let j = inverse[pos] as usize;
        assert_eq!(unique[j], id, "position {pos}");
        assert_eq!(
            &rows[j * DIM..(j + 1) * DIM],
            &plain[pos * DIM..(pos + 1) * DIM],
            "position {pos}"
        );
    }
    // Past the distinct rows, `out` is as it was.
    assert!(out[5 * 16..].iter().all(|&b| b == 0xff));

    // Buffers of the wrong size are refused before anything is sent.
    let frames = worker.stats().frames_out;
    for (inv, uniq, bytes) in [(7, 8, 8 * 16), (8, 7, 8 * 16), (8, 8, 8 * 16 - 1)] {
        let (mut inverse, mut unique, mut out) =
            (vec![0i64; inv], vec![0u64; uniq], vec![0u8; bytes]);
        let e = sharded
            .pull_unique(&mut h, &ids, &mut inverse, &mut unique, &mut out, secs(10))
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    }
    assert_eq!(worker.stats().frames_out, frames);
    assert_eq!(h.outstanding(), 0);

    // PS 2 gone: its part fails alone, and its row (id 2, the last distinct one) is zero,
    // not the buffer's old bytes; the others are written.
    drop(rts.pop());
    let mut out = vec![0xffu8; ids.len() * 16];
    let report = sharded
        .pull_unique(&mut h, &ids, &mut inverse, &mut unique, &mut out, secs(10))
        .unwrap()
        .clone();
    assert!(report.shards[2].is_err(), "{report:?}");
    assert!(
        report.shards[0].is_ok() && report.shards[1].is_ok(),
        "{report:?}"
    );
    assert_eq!(&unique[..5], &[3, 9, 1, 4, 2]);
    assert!(out[4 * 16..5 * 16].iter().all(|&b| b == 0));
    let rows = f32s(&out);
    for (pos, &id) in ids.iter().enumerate().filter(|&(_, &id)| id != 2) {
        let j = inverse[pos] as usize;
        assert_eq!(unique[j], id);
        assert_eq!(
            &rows[j * DIM..(j + 1) * DIM],
            &plain[pos * DIM..(pos + 1) * DIM]
        );
    }
}
