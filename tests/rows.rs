//! Embedding rows over real sockets: packed blocks pulled and pushed, several tables per
//! request, rows missing, tables unknown or of another shape, blocks large enough to be
//! chunked, and requests refused before they are sent.

mod common;

use common::*;
use starwire::rows::Rows;
use starwire::{DType, ErrorKind, Options, Runtime, Service, Status, Table, Tensor};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// A table of u8 rows of `dim` bytes: row `id` is `id as u8` repeated, for ids below
/// `rows`; pushes add the gradient bytes (wrapping) into a kept copy.
struct Bytes {
    dims: [u64; 1],
    rows: u64,
    pushed: Mutex<HashMap<u64, Vec<u8>>>,
}

impl Table for Bytes {
    fn dtype(&self) -> DType {
        DType::U8
    }
    fn row_dims(&self) -> &[u64] {
        &self.dims
    }
    fn pull(&self, ids: &[u64], out: &mut [u8], missing: &mut Vec<u32>) -> Status {
        let dim = self.dims[0] as usize;
        let pushed = self.pushed.lock().unwrap();
        for (i, (&id, row)) in ids.iter().zip(out.chunks_exact_mut(dim)).enumerate() {
            match pushed.get(&id) {
                Some(p) => row.copy_from_slice(p),
                None if id < self.rows => row.fill(id as u8),
                None => {
                    row.fill(0);
                    missing.push(i as u32);
                }
            }
        }
        Status::Ok
    }
    fn push(&self, ids: &[u64], grads: &[u8]) -> Status {
        let dim = self.dims[0] as usize;
        let mut pushed = self.pushed.lock().unwrap();
        for (&id, g) in ids.iter().zip(grads.chunks_exact(dim)) {
            let row = pushed.entry(id).or_insert_with(|| vec![id as u8; dim]);
            for (r, g) in row.iter_mut().zip(g) {
                *r = r.wrapping_add(*g);
            }
        }
        Status::Ok
    }
}

/// Table 1: 64-byte rows, ids below 1,000; table 2: 4,096-byte rows, ids below 10,000.
struct Ps {
    small: Bytes,
    large: Bytes,
}

impl Service for Ps {
    fn table(&self, table: u32) -> Option<&dyn Table> {
        match table {
            1 => Some(&self.small),
            2 => Some(&self.large),
            _ => None,
        }
    }

    fn table_ids(&self) -> Vec<u32> {
        vec![1, 2]
    }
}

fn bytes(dim: u64, rows: u64) -> Bytes {
    Bytes {
        dims: [dim],
        rows,
        pushed: Mutex::new(HashMap::new()),
    }
}

fn ps() -> (Runtime, std::net::SocketAddr) {
    let service = Ps {
        small: bytes(64, 1000),
        large: bytes(4096, 10_000),
    };
    let options = Options {
        service: Some(Arc::new(service)),
        ..Options::listen("127.0.0.1:0".parse().unwrap())
    };
    let rt = Runtime::start_with(config("ps", 1).build().unwrap(), options).expect("ps starts");
    let addr = rt.local_addr().unwrap();
    (rt, addr)
}

#[test]
fn rows_of_two_tables_come_back_as_one_block_each_in_request_order() {
    let (_ps, addr) = ps();
    let worker = client(1);
    let mut h = worker.handle(16);
    let small_ids = [5u64, 999, 1000, 5, 3, 123_456];
    let large_ids = [7u64, 9_999];
    let tables = [
        Rows::new(1, DType::U8, &[64], &small_ids),
        Rows::new(2, DType::U8, &[4096], &large_ids),
    ];
    let t = h.pull_rows(addr, &tables, secs(10)).unwrap();
    let rows = h.wait(t).unwrap();
    assert_eq!(rows.len(), 2);
    let small = rows.block(0).unwrap();
    assert_eq!(small.dims(), [6, 64]);
    assert_eq!(small.dtype(), DType::U8);
    for (i, &id) in small_ids.iter().enumerate() {
        let want = if id < 1000 { id as u8 } else { 0 };
        assert!(
            rows.row(0, i).unwrap().iter().all(|&b| b == want),
            "row {i}"
        );
    }
    assert_eq!(
        rows.missing(0),
        [2, 5],
        "ids 1000 and 123456 are not in the table"
    );
    let large = rows.block(1).unwrap();
    assert_eq!(large.dims(), [2, 4096]);
    assert!(rows.row(1, 1).unwrap().iter().all(|&b| b == 9_999u64 as u8));
    assert!(rows.missing(1).is_empty());
    assert_eq!(
        large.bytes().as_ptr() as usize % 64,
        0,
        "blocks are 64-byte aligned"
    );
}

#[test]
fn pushed_gradients_are_applied_and_read_back() {
    let (_ps, addr) = ps();
    let worker = client(1);
    let mut h = worker.handle(16);
    let ids = [1u64, 2, 3];
    let grads: Vec<u8> = (0..3 * 64).map(|i| (i / 64) as u8 + 1).collect();
    let t = h
        .push_rows(
            addr,
            &[(Rows::new(1, DType::U8, &[64], &ids), &grads[..])],
            secs(10),
        )
        .unwrap();
    assert_eq!(h.wait(t).unwrap(), [Status::Ok]);
    let t = h
        .pull_rows(addr, &[Rows::new(1, DType::U8, &[64], &ids)], secs(10))
        .unwrap();
    let rows = h.wait(t).unwrap();
    for (i, id) in ids.iter().enumerate() {
        let want = (*id as u8).wrapping_add(i as u8 + 1);
        assert!(
            rows.row(0, i).unwrap().iter().all(|&b| b == want),
            "row {i}"
        );
    }
}

#[test]
fn blocks_larger_than_a_frame_travel_in_chunks_both_ways() {
    let (_ps, addr) = ps();
    let worker = client(1);
    let mut h = worker.handle(16);
    // 2,000 rows of 4 KiB: an 8 MiB block each way, above the chunk size.
    let ids: Vec<u64> = (0..2000).map(|i| i * 3).collect();
    let grads: Vec<u8> = (0..ids.len() * 4096)
        .map(|i| (i / 4096 % 7) as u8)
        .collect();
    let table = Rows::new(2, DType::U8, &[4096], &ids);
    let t = h.push_rows(addr, &[(table, &grads[..])], secs(30)).unwrap();
    assert_eq!(h.wait(t).unwrap(), [Status::Ok]);
    let t = h.pull_rows(addr, &[table], secs(30)).unwrap();
    let rows = h.wait(t).unwrap();
    assert_eq!(rows.block(0).unwrap().byte_len(), 2000 * 4096);
    for (i, id) in ids.iter().enumerate() {
        let want = (*id as u8).wrapping_add((i % 7) as u8);
        assert!(
            rows.row(0, i).unwrap().iter().all(|&b| b == want),
            "row {i}"
        );
    }
}

/// Gradient blocks in shared tensors, sent from their own memory: a tiny one (copied into
/// the frame), one referenced by the frame and one large enough to travel in chunks, in one
/// request. The connection holds each block until written, then lets go of it: the
/// caller's `Arc` is the only one again and its memory can be written for the next step.
#[test]
fn shared_gradient_blocks_are_applied_and_given_back() {
    let (_ps, addr) = ps();
    let worker = client(1);
    let mut h = worker.handle(16);
    let tiny_ids = [4u64, 5];
    let mid_ids: Vec<u64> = (100..400).collect();
    let big_ids: Vec<u64> = (0..2000).map(|i| i * 3).collect();
    let block = |n: usize, dim: usize| {
        let bytes: Vec<u8> = (0..n * dim).map(|i| (i / dim % 5) as u8 + 1).collect();
        Arc::new(Tensor::from_bytes(DType::U8, &[bytes.len() as u64], bytes).unwrap())
    };
    let (tiny, mid, big) = (block(2, 64), block(300, 64), block(2000, 4096));
    let mut tables = [
        (Rows::new(1, DType::U8, &[64], &tiny_ids), tiny.clone()),
        (Rows::new(1, DType::U8, &[64], &mid_ids), mid.clone()),
        (Rows::new(2, DType::U8, &[4096], &big_ids), big.clone()),
    ];
    let t = h.push_rows_shared(addr, &tables, secs(30)).unwrap();
    assert_eq!(h.wait(t).unwrap(), [Status::Ok; 3]);
    drop(tables);
    for (what, b) in [("tiny", &tiny), ("mid", &mid), ("big", &big)] {
        // Let go of once written (the loop may report the write just after the answer).
        while Arc::strong_count(b) > 1 {
            std::thread::yield_now();
        }
        assert_eq!(Arc::strong_count(b), 1, "{what}");
    }
    let check = |h: &mut starwire::Handle, table: u32, dim: u64, ids: &[u64]| {
        let t = h
            .pull_rows(addr, &[Rows::new(table, DType::U8, &[dim], ids)], secs(30))
            .unwrap();
        let rows = h.wait(t).unwrap();
        for (i, id) in ids.iter().enumerate() {
            let want = (*id as u8).wrapping_add((i % 5) as u8 + 1);
            assert!(
                rows.row(0, i).unwrap().iter().all(|&b| b == want),
                "table {table} row {i}"
            );
        }
    };
    check(&mut h, 1, 64, &tiny_ids);
    check(&mut h, 1, 64, &mid_ids);
    check(&mut h, 2, 4096, &big_ids);
    // A block of another length than the rows' is refused before anything is sent.
    tables = [
        (Rows::new(1, DType::U8, &[64], &tiny_ids), mid.clone()),
        (Rows::new(1, DType::U8, &[64], &mid_ids), mid.clone()),
        (Rows::new(2, DType::U8, &[4096], &big_ids), big.clone()),
    ];
    let e = h.push_rows_shared(addr, &tables, secs(30)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    drop(tables);
    assert_eq!(
        Arc::strong_count(&mid),
        1,
        "a refused push keeps no reference"
    );
}

#[test]
fn unknown_tables_and_other_shapes_fail_alone() {
    let (_ps, addr) = ps();
    let worker = client(1);
    let mut h = worker.handle(16);
    let ids = [1u64, 2];
    let tables = [
        Rows::new(9, DType::U8, &[64], &ids),
        Rows::new(1, DType::F32, &[16], &ids),
        Rows::new(1, DType::U8, &[32], &ids),
        Rows::new(1, DType::U8, &[64], &ids),
    ];
    let t = h.pull_rows(addr, &tables, secs(10)).unwrap();
    let rows = h.wait(t).unwrap();
    assert_eq!(rows.block(0).err(), Some(Status::NotFound));
    assert_eq!(rows.block(1).err(), Some(Status::InvalidArgument));
    assert_eq!(rows.block(2).err(), Some(Status::InvalidArgument));
    assert!(rows.block(3).is_ok());
    // The PS says why, for each refused table.
    assert_eq!(
        rows.refusal(),
        Some(
            "no table 9 on this task (this task serves tables 1, 2); table 1 holds u8 [64] \
             rows; the request asked for f32 [16]; table 1 holds u8 [64] rows; the request \
             asked for u8 [32]"
        )
    );
    // A request whose only table is refused fails with the words.
    let t = h.pull_rows(addr, &tables[2..3], secs(10)).unwrap();
    let e = h.wait(t).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Remote(Status::InvalidArgument));
    assert_eq!(
        e.remote_message(),
        Some("table 1 holds u8 [64] rows; the request asked for u8 [32]")
    );
    assert!(
        e.to_string().contains("the request asked for u8 [32]"),
        "{e}"
    );
    let f32_grads = [0u8; 2 * 16 * 4];
    let t = h
        .push_rows(addr, &[(tables[1], &f32_grads[..])], secs(10))
        .unwrap();
    let e = h.wait(t).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Remote(Status::InvalidArgument));
    assert_eq!(
        e.remote_message(),
        Some("table 1 holds u8 [64] rows; the push sent f32 [16] gradients")
    );
    let grads = [0u8; 2 * 64];
    let t = h
        .push_rows(
            addr,
            &[(tables[0], &grads[..]), (tables[3], &grads[..])],
            secs(10),
        )
        .unwrap();
    assert_eq!(h.wait(t).unwrap(), [Status::NotFound, Status::Ok]);
}

#[test]
fn invalid_rows_requests_fail_before_they_are_sent() {
    let (_ps, addr) = ps();
    let worker = client(1);
    let mut h = worker.handle(16);
    let ids = [1u64];
    fn kind<T>(r: Result<T, starwire::Error>) -> Option<ErrorKind> {
        r.err().map(|e| e.kind())
    }
    let none: [Rows<'_>; 0] = [];
    assert_eq!(
        kind(h.pull_rows(addr, &none, None)),
        Some(ErrorKind::InvalidArgument)
    );
    let no_ids = Rows::new(1, DType::U8, &[64], &[]);
    assert_eq!(
        kind(h.pull_rows(addr, &[no_ids], None)),
        Some(ErrorKind::InvalidArgument)
    );
    let empty_row = Rows::new(1, DType::U8, &[0], &ids);
    assert_eq!(
        kind(h.pull_rows(addr, &[empty_row], None)),
        Some(ErrorKind::InvalidArgument)
    );
    let ok = Rows::new(1, DType::U8, &[64], &ids);
    let short = [0u8; 63];
    assert_eq!(
        kind(h.push_rows(addr, &[(ok, &short[..])], None)),
        Some(ErrorKind::InvalidArgument)
    );
    assert_eq!(h.outstanding(), 0);
    // The handle still works.
    let t = h.pull_rows(addr, &[ok], secs(10)).unwrap();
    assert!(h.wait(t).unwrap().block(0).is_ok());
}

#[test]
fn a_request_over_the_peers_announced_limits_fails_alone_before_it_is_sent() {
    let service = Ps {
        small: bytes(64, 1000),
        large: bytes(4096, 10_000),
    };
    let limits = starwire::Limits {
        max_rows: 100,
        max_tensors: 10,
        ..Default::default()
    };
    let options = Options {
        service: Some(Arc::new(service)),
        ..Options::listen("127.0.0.1:0".parse().unwrap())
    };
    let cfg = config("ps", 1).limits(limits).build().unwrap();
    let ps = Runtime::start_with(cfg, options).unwrap();
    let addr = ps.local_addr().unwrap();
    let worker = client(1);
    let mut h = worker.handle(16);
    let ids: Vec<u64> = (0..101).collect();
    // In flight on the same connection while the oversized requests fail.
    let fine = h
        .pull_rows(
            addr,
            &[Rows::new(1, DType::U8, &[64], &ids[..100])],
            secs(10),
        )
        .unwrap();
    let over = h
        .pull_rows(addr, &[Rows::new(1, DType::U8, &[64], &ids)], secs(10))
        .unwrap();
    let e = h.wait(over).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    assert!(
        e.to_string().contains("rows 101 over the peer's limit 100"),
        "{e}"
    );
    let many = h.pull(addr, (0..11).collect(), secs(10)).unwrap();
    assert_eq!(h.wait(many).unwrap_err().kind(), ErrorKind::InvalidArgument);
    let rows = h.wait(fine).unwrap();
    assert_eq!(rows.block(0).unwrap().dims(), [100, 64]);
    // The connection is still up: nothing was sent that the peer would have refused.
    let t = h.ping(addr, 8, secs(10)).unwrap();
    assert!(h.wait(t).is_ok());
    assert_eq!(ps.stats().connections_lost, 0);
    assert_eq!(worker.stats().connections_lost, 0);
}
