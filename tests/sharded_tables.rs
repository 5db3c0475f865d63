//! Several tables partitioned over the same PS tasks (`rows::ShardedTables`) over real
//! sockets: a step is one rows request per PS for all tables, not one per table and PS, and
//! gives what the per-table client (`Sharded`) gives.

mod common;

use common::*;
use starwire::rows::{Init, MemTable, Optimizer, Partition, ShardedTables, TableShape, Tables};
use starwire::{DType, ErrorKind, Options, Peer, Runtime, Sharded};
use std::sync::Arc;

/// Table id and row size of the three tables.
const TABLES: [(u32, usize); 3] = [(3, 4), (5, 2), (8, 3)];

fn ps(tables: &[Arc<MemTable>]) -> Runtime {
    let mut service = Tables::new();
    for (&(id, _), t) in TABLES.iter().zip(tables) {
        service = service.with(id, t.clone());
    }
    let options = Options {
        service: Some(Arc::new(service)),
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

/// Two PS tasks, each serving the three tables (MemTables with SGD, lr 1, rows made at
/// their first pull from a uniform draw).
fn cluster() -> (Vec<Runtime>, Vec<Peer>) {
    let rts: Vec<Runtime> = (0..2)
        .map(|_| {
            let tables: Vec<Arc<MemTable>> = TABLES
                .iter()
                .map(|&(_, dim)| {
                    Arc::new(MemTable::new(
                        dim,
                        Init::Uniform {
                            scale: 0.5,
                            seed: 3,
                        },
                        Optimizer::Sgd { lr: 1.0 },
                    ))
                })
                .collect();
            ps(&tables)
        })
        .collect();
    let peers = rts
        .iter()
        .map(|r| Peer::from(r.local_addr().unwrap()))
        .collect();
    (rts, peers)
}

/// Connects the worker to every PS (the handshake is a frame of its own) with a pull of
/// one id at each.
fn connect(sharded: &mut Sharded, h: &mut starwire::Handle) {
    let mut out = vec![0u8; 2 * sharded.row_bytes()];
    let report = sharded.pull(h, &[0, 1], &mut out, secs(10)).unwrap();
    assert!(report.is_ok(), "{report:?}");
}

/// The shapes of `TABLES` (f32 rows of `dims`, split by id mod the PS tasks).
fn shapes(dims: &[[u64; 1]]) -> Vec<TableShape<'_>> {
    TABLES
        .iter()
        .zip(dims)
        .map(|(&(table, _), row_dims)| TableShape {
            table,
            dtype: DType::F32,
            row_dims,
            partition: Partition::Mod,
        })
        .collect()
}

/// Frames the PS tasks received.
fn frames_in(rts: &[Runtime]) -> u64 {
    rts.iter().map(|r| r.stats().frames_in).sum()
}

#[test]
fn a_step_is_one_request_per_ps_and_gives_what_the_per_table_client_gives() {
    let (rts, peers) = cluster();
    let worker = client(1);
    let mut h = worker.handle(16);
    let dims: Vec<[u64; 1]> = TABLES.iter().map(|&(_, d)| [d as u64]).collect();
    let shapes = shapes(&dims);
    let mut multi = ShardedTables::new(peers.clone(), &shapes).unwrap();
    let mut single: Vec<Sharded> = TABLES
        .iter()
        .zip(&dims)
        .map(|(&(t, _), d)| Sharded::new(peers.clone(), Partition::Mod, t, DType::F32, d).unwrap())
        .collect();
    let ids: [&[u64]; 3] = [&[1, 2, 3, 1, 4], &[7, 7, 10], &[5, 2, 6, 9, 2]];
    let row_bytes = |i: usize| TABLES[i].1 * 4;
    connect(&mut single[0], &mut h);

    for step in 0..3 {
        let before = frames_in(&rts);
        let mut outs: Vec<Vec<u8>> = (0..3)
            .map(|i| vec![0xff; ids[i].len() * row_bytes(i)])
            .collect();
        let mut views: Vec<&mut [u8]> = outs.iter_mut().map(|o| o.as_mut_slice()).collect();
        let report = multi.pull(&mut h, &ids, &mut views, secs(10)).unwrap();
        assert!(report.is_ok(), "{report:?}");
        assert_eq!(report.unique, 4 + 2 + 4);
        assert_eq!(report.shards, [Ok(5), Ok(5)], "rows per PS");
        // Every table's ids went to both PS tasks: one frame to each, not one per table.
        assert_eq!(frames_in(&rts) - before, 2, "step {step}");
        for i in 0..3 {
            let mut want = vec![0u8; outs[i].len()];
            single[i].pull(&mut h, ids[i], &mut want, secs(10)).unwrap();
            assert_eq!(
                f32s(&outs[i]),
                f32s(&want),
                "table {} step {step}",
                TABLES[i].0
            );
        }
        // A push: position j's gradient is j + 1 in every element (duplicates summed).
        let grads: Vec<Vec<u8>> = (0..3)
            .map(|i| {
                let g: Vec<f32> = (0..ids[i].len())
                    .flat_map(|j| vec![j as f32 + 1.0; TABLES[i].1])
                    .collect();
                bytes(&g)
            })
            .collect();
        let views: Vec<&[u8]> = grads.iter().map(|g| g.as_slice()).collect();
        let before = frames_in(&rts);
        let report = multi.push(&mut h, &ids, &views, secs(10)).unwrap();
        assert!(report.is_ok(), "{report:?}");
        assert_eq!(frames_in(&rts) - before, 2);
        // The rows moved by the summed gradients: id 1 of table 3 by 1 + 4.
        let mut after = vec![0u8; ids[0].len() * row_bytes(0)];
        single[0]
            .pull(&mut h, ids[0], &mut after, secs(10))
            .unwrap();
        let (was, now) = (f32s(&outs[0]), f32s(&after));
        assert_eq!(now[0], was[0] - 5.0);
        assert_eq!(now[4], was[4] - 2.0);
    }
}

#[test]
fn a_table_at_one_ps_only_sends_nothing_to_the_other() {
    let (rts, peers) = cluster();
    let worker = client(1);
    let mut h = worker.handle(16);
    let dims = [[4u64], [2]];
    let shapes = [
        TableShape {
            table: 3,
            dtype: DType::F32,
            row_dims: &dims[0],
            partition: Partition::Mod,
        },
        TableShape {
            table: 5,
            dtype: DType::F32,
            row_dims: &dims[1],
            partition: Partition::Mod,
        },
    ];
    let mut multi = ShardedTables::new(peers.clone(), &shapes).unwrap();
    connect(
        &mut Sharded::new(peers, Partition::Mod, 5, DType::F32, &[2]).unwrap(),
        &mut h,
    );
    // Even ids only: all at PS 0; the second table's batch is empty.
    let ids: [&[u64]; 2] = [&[2, 4, 2], &[]];
    let mut a = vec![0u8; 3 * 16];
    let mut b = vec![0u8; 0];
    let before: Vec<u64> = rts.iter().map(|r| r.stats().frames_in).collect();
    let report = multi
        .pull(&mut h, &ids, &mut [&mut a, &mut b], secs(10))
        .unwrap();
    assert_eq!(report.shards, [Ok(2), Ok(0)]);
    let after: Vec<u64> = rts.iter().map(|r| r.stats().frames_in).collect();
    assert_eq!((after[0] - before[0], after[1] - before[1]), (1, 0));
    assert_eq!(f32s(&a)[..4], f32s(&a)[8..]);
}

#[test]
fn bad_arguments_are_refused_naming_what_is_wrong() {
    let (_rts, peers) = cluster();
    let worker = client(1);
    let mut h = worker.handle(16);
    let dims = [4u64];
    let shape = TableShape {
        table: 3,
        dtype: DType::F32,
        row_dims: &dims,
        partition: Partition::Mod,
    };
    let e = ShardedTables::new(peers.clone(), &[]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    let e = ShardedTables::new(peers.clone(), &[shape, shape]).unwrap_err();
    assert!(e.to_string().contains("table 3 is named twice"), "{e}");
    let mut multi = ShardedTables::new(peers, &[shape]).unwrap();
    let mut out = vec![0u8; 15];
    let e = multi
        .pull(&mut h, &[&[1]], &mut [&mut out], secs(10))
        .unwrap_err();
    assert!(e.to_string().contains("15 bytes of rows for 1 ids"), "{e}");
    let e = multi.pull(&mut h, &[], &mut [], secs(10)).unwrap_err();
    assert!(
        e.to_string().contains("0 batches of ids for 1 tables"),
        "{e}"
    );
    let e = multi.set_wire_dtype(DType::U8).unwrap_err();
    assert!(e.to_string().contains("not as u8"), "{e}");
    let e = multi.set_loss_scale(Some(-1.0)).unwrap_err();
    assert!(e.to_string().contains("loss scale"), "{e}");
    assert_eq!(multi.wire_dtype(0), Some(DType::F32));
}

#[test]
fn a_unique_pull_of_every_table_is_one_request_per_ps_and_gives_each_distinct_row_once() {
    let (rts, peers) = cluster();
    let worker = client(1);
    let mut h = worker.handle(16);
    let dims: Vec<[u64; 1]> = TABLES.iter().map(|&(_, d)| [d as u64]).collect();
    let shapes = shapes(&dims);
    let mut multi = ShardedTables::new(peers, &shapes).unwrap();
    let ids: [&[u64]; 3] = [&[1, 2, 3, 1, 4], &[7, 7, 10], &[5, 2, 6, 9, 2]];
    let row_bytes = |i: usize| TABLES[i].1 * 4;
    // The plain pull of the same batches, to compare with.
    let mut plain: Vec<Vec<u8>> = (0..3)
        .map(|i| vec![0; ids[i].len() * row_bytes(i)])
        .collect();
    let mut views: Vec<&mut [u8]> = plain.iter_mut().map(|o| o.as_mut_slice()).collect();
    assert!(multi
        .pull(&mut h, &ids, &mut views, secs(10))
        .unwrap()
        .is_ok());

    let mut inverse: Vec<Vec<i64>> = (0..3).map(|i| vec![-1; ids[i].len()]).collect();
    let mut unique: Vec<Vec<u64>> = (0..3).map(|i| vec![0; ids[i].len()]).collect();
    let mut outs: Vec<Vec<u8>> = (0..3)
        .map(|i| vec![0xff; ids[i].len() * row_bytes(i)])
        .collect();
    let before = frames_in(&rts);
    {
        let mut inv: Vec<&mut [i64]> = inverse.iter_mut().map(|v| v.as_mut_slice()).collect();
        let mut uniq: Vec<&mut [u64]> = unique.iter_mut().map(|v| v.as_mut_slice()).collect();
        let mut out: Vec<&mut [u8]> = outs.iter_mut().map(|v| v.as_mut_slice()).collect();
        let report = multi
            .pull_unique(&mut h, &ids, &mut inv, &mut uniq, &mut out, secs(10))
            .unwrap();
        assert!(report.is_ok(), "{report:?}");
        assert_eq!(report.unique, 4 + 2 + 4);
    }
    assert_eq!(
        frames_in(&rts) - before,
        2,
        "one request per PS for all tables"
    );
    assert_eq!(
        (0..3).map(|i| multi.unique_len(i)).collect::<Vec<_>>(),
        [4, 2, 4]
    );
    // By PS (id mod 2: even ids at PS 0), each PS's in the order first seen.
    assert_eq!(&unique[0][..4], &[2, 4, 1, 3]);
    assert_eq!(&unique[1][..2], &[10, 7]);
    assert_eq!(&unique[2][..4], &[2, 6, 5, 9]);
    for i in 0..3 {
        let rb = row_bytes(i);
        for (pos, &id) in ids[i].iter().enumerate() {
            let j = inverse[i][pos] as usize;
            assert_eq!(unique[i][j], id, "table {i} position {pos}");
            assert_eq!(
                f32s(&outs[i][j * rb..(j + 1) * rb]),
                f32s(&plain[i][pos * rb..(pos + 1) * rb]),
                "table {i} position {pos}"
            );
        }
        let n = multi.unique_len(i);
        assert!(outs[i][n * rb..].iter().all(|&b| b == 0xff), "table {i}");
    }

    // One table's buffers too small: refused before anything is sent.
    let before = frames_in(&rts);
    let mut short = vec![0i64; 2];
    let mut inv: Vec<&mut [i64]> = inverse.iter_mut().map(|v| v.as_mut_slice()).collect();
    inv[1] = &mut short;
    let mut uniq: Vec<&mut [u64]> = unique.iter_mut().map(|v| v.as_mut_slice()).collect();
    let mut out: Vec<&mut [u8]> = outs.iter_mut().map(|v| v.as_mut_slice()).collect();
    let e = multi
        .pull_unique(&mut h, &ids, &mut inv, &mut uniq, &mut out, secs(10))
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    assert!(e.to_string().contains("inverse of 3 (is 2)"), "{e}");
    assert_eq!(frames_in(&rts), before);
}
