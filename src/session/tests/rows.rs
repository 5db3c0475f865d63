//! Rows in memory: packed pulls and pushes between a client and a server session, with
//! the server's tables behind its service, and simulated time.

use super::*;
use crate::rows::{Init, MemTable, Optimizer, Tables};
use crate::service::Table as _;

/// Table 1: rows of 2 floats, created at a fixed function of their id by a pull; table 2:
/// rows of 3 floats that a pull does not create (unknown ids are reported missing).
fn tables() -> (Arc<MemTable>, Arc<MemTable>, SharedService) {
    let uniform = Init::Uniform {
        scale: 1.0,
        seed: 7,
    };
    let one = Arc::new(MemTable::new(2, uniform, Optimizer::Sgd { lr: 1.0 }));
    let two = Arc::new(MemTable::new(3, Init::Missing, Optimizer::Sgd { lr: 1.0 }));
    let service = Tables::new().with(1, one.clone()).with(2, two.clone());
    (one, two, Arc::new(service))
}

fn spec(table: u32, dim: u64, ids: &[u64]) -> RowsSpec {
    RowsSpec::of(&Rows::new(table, DType::F32, &[dim], ids)).unwrap()
}

/// A pull of `tables` (table, row length, ids).
fn pull_rows(tables: &[(u32, u64, &[u64])]) -> RequestOp {
    RequestOp::PullRows {
        held: Vec::new(),
        tables: tables.iter().map(|&(t, d, ids)| spec(t, d, ids)).collect(),
        ids: tables.iter().flat_map(|t| t.2.iter().copied()).collect(),
        alloc: None,
    }
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn le(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn rows_of(c: &Completion) -> &PulledRows {
    match &c.result {
        Ok(Reply::Rows(r)) => r,
        other => panic!("not a rows answer: {other:?}"),
    }
}

/// The frames (kind and handle) in `bytes`, a stream of whole frames.
fn frames(mut bytes: &[u8]) -> Vec<crate::wire::FrameKind> {
    let mut out = Vec::new();
    while bytes.len() >= HEADER_LEN {
        let h = crate::wire::Header::new_unchecked(&bytes[..HEADER_LEN]);
        let len = HEADER_LEN + h.meta_len() as usize + h.payload_len() as usize;
        out.push(h.kind());
        bytes = &bytes[len.min(bytes.len())..];
    }
    out
}

#[test]
fn two_tables_travel_in_one_frame_and_each_gets_its_block() {
    let (one, _, service) = tables();
    let mut p = Pair::serving(
        Config::builder("worker", 0),
        Config::builder("ps", 0),
        service,
    );
    // Open the connection first, so that what the pull sends is its frame alone.
    p.submit(RequestOp::Ping { payload: 0 }, None);
    p.drain();
    p.pump();
    assert_eq!(p.completions().len(), 1);

    let (a, b): (&[u64], &[u64]) = (&[5, 3, 5], &[9]);
    p.submit(pull_rows(&[(1, 2, a), (2, 3, b)]), None);
    p.drain();
    let up = Pair::output(&mut p.client, &mut p.dirty, p.c);
    assert_eq!(frames(&up), [crate::wire::FrameKind::PullRows], "one frame");
    Pair::input(&mut p.server, p.s, &up, p.now);
    p.pump();
    let done = p.completions();
    assert_eq!(done.len(), 1);
    let rows = rows_of(&done[0]);
    assert_eq!(rows.len(), 2);
    let block = f32s(rows.block(0).unwrap().bytes());
    let want: Vec<f32> = a.iter().flat_map(|&id| one.get(id).unwrap()).collect();
    assert_eq!(
        block, want,
        "rows in the order of the ids, duplicates included"
    );
    assert!(rows.missing(0).is_empty());
    assert_eq!(rows.block(1).unwrap().dims(), [1, 3]);
}

#[test]
fn missing_rows_are_reported_per_table_and_read_as_zeros() {
    let (_, two, service) = tables();
    two.push(&[1, 2], &le(&[-1.0, -2.0, -3.0, -4.0, -5.0, -6.0]));
    let mut p = Pair::serving(
        Config::builder("worker", 0),
        Config::builder("ps", 0),
        service,
    );
    p.submit(pull_rows(&[(1, 2, &[8]), (2, 3, &[1, 5, 2, 9])]), None);
    p.drain();
    p.pump();
    let done = p.completions();
    let rows = rows_of(&done[0]);
    assert!(rows.missing(0).is_empty());
    assert_eq!(rows.missing(1), [1, 3]);
    let block = f32s(rows.block(1).unwrap().bytes());
    assert_eq!(
        block,
        [1.0, 2.0, 3.0, 0.0, 0.0, 0.0, 4.0, 5.0, 6.0, 0.0, 0.0, 0.0]
    );
    // A table the server does not have, or asked for in another shape, fails alone.
    p.submit(pull_rows(&[(3, 2, &[1]), (1, 4, &[1]), (1, 2, &[1])]), None);
    p.drain();
    p.pump();
    let done = p.completions();
    let rows = rows_of(&done[0]);
    assert_eq!(rows.block(0).err(), Some(Status::NotFound));
    assert_eq!(rows.block(1).err(), Some(Status::InvalidArgument));
    assert!(rows.block(2).is_ok());
}

#[test]
fn a_chunked_block_over_the_receive_budget_fails_alone() {
    let (_, _, service) = tables();
    let mut p = Pair::serving(
        Config::builder("worker", 0)
            .recv_budget(4 << 20)
            .conn_recv_budget(1 << 20),
        Config::builder("ps", 0).chunk_size(64 << 10),
        service,
    );
    // 2 MiB of rows (over the client connection's 1 MiB) and 512 KiB (fits).
    let big: Vec<u64> = (0..(1 << 18)).collect();
    let fits: Vec<u64> = (0..(1 << 16)).collect();
    p.submit(
        pull_rows(&[(1, 2, &big), (1, 2, &fits), (1, 2, &[1])]),
        None,
    );
    p.drain();
    p.pump();
    let done = p.completions();
    let rows = rows_of(&done[0]);
    assert_eq!(rows.block(0).err(), Some(Status::ResourceExhausted));
    assert_eq!(rows.block(1).unwrap().byte_len(), 512 << 10);
    assert!(rows.block(2).is_ok());
    assert_eq!(p.client.conns.budget().used(), 0, "nothing stays reserved");
    assert_eq!(p.client.conns.budget().refused(), 1);
    // The connection goes on.
    p.submit(RequestOp::Ping { payload: 0 }, None);
    p.drain();
    p.pump();
    assert!(p.completions()[0].result.is_ok());
}

#[test]
fn packed_and_shared_rows_pushes_reach_the_tables() {
    let (one, two, service) = tables();
    let mut p = Pair::serving(
        Config::builder("worker", 0),
        Config::builder("ps", 0),
        service,
    );
    let before = one.get(4).unwrap_or_else(|| {
        let (mut out, mut missing) = (vec![0u8; 8], Vec::new());
        one.pull(&[4], &mut out, &mut missing);
        f32s(&out)
    });
    // Packed: the gradients of both tables one after the other.
    let mut grads = le(&[0.5, 0.25]);
    grads.extend(le(&[1.0, 2.0, 3.0]));
    p.submit(
        RequestOp::PushRows {
            tables: vec![spec(1, 2, &[4]), spec(2, 3, &[6])],
            ids: vec![4, 6],
            grads,
            shared: Vec::new(),
        },
        None,
    );
    p.drain();
    p.pump();
    let done = p.completions();
    assert_eq!(
        done[0].result,
        Ok(Reply::Pushed(vec![Status::Ok, Status::Ok]))
    );
    assert_eq!(one.get(4).unwrap(), [before[0] - 0.5, before[1] - 0.25]);
    assert_eq!(
        two.get(6).unwrap(),
        [-1.0, -2.0, -3.0],
        "created at zero by the push"
    );

    // Shared: one block per table, sent from its own memory (large enough not to be
    // copied into the frame).
    let n = 100u64;
    let ids: Vec<u64> = (100..100 + n).collect();
    let block = Tensor::from_f32(&[n, 3], &vec![1.0; 3 * n as usize]).unwrap();
    p.submit(
        RequestOp::PushRows {
            tables: vec![spec(2, 3, &ids)],
            ids: ids.clone(),
            grads: Vec::new(),
            shared: vec![(0, Arc::new(block))],
        },
        None,
    );
    p.drain();
    p.pump();
    let done = p.completions();
    assert_eq!(done[0].result, Ok(Reply::Pushed(vec![Status::Ok])));
    for id in ids {
        assert_eq!(two.get(id).unwrap(), [-1.0, -1.0, -1.0]);
    }
}

#[test]
fn a_rows_pull_given_up_mid_block_fails_by_its_deadline_and_the_connection_goes_on() {
    let (_, _, service) = tables();
    let mut p = Pair::serving(
        Config::builder("worker", 0),
        Config::builder("ps", 0).chunk_size(64 << 10),
        service,
    );
    p.submit(RequestOp::Ping { payload: 0 }, None);
    p.drain();
    p.pump();
    assert_eq!(p.completions().len(), 1, "the connection is open");
    let ids: Vec<u64> = (0..(1 << 17)).collect(); // 1 MiB of rows: chunked
    p.submit(pull_rows(&[(1, 2, &ids)]), Some(Duration::from_millis(50)));
    p.drain();
    // The request reaches the server; a third of its answer reaches the client.
    let up = Pair::output(&mut p.client, &mut p.dirty, p.c);
    Pair::input(&mut p.server, p.s, &up, p.now);
    let down = Pair::output(&mut p.server, &mut p.dirty, p.s);
    assert!(down.len() > 1 << 20, "{}", down.len());
    let third = down.len() / 3;
    Pair::input(&mut p.client, p.c, &down[..third], p.now);
    assert!(p.completions().is_empty());
    p.advance(Duration::from_millis(60));
    let done = p.completions();
    assert_eq!(done.len(), 1);
    assert_eq!(
        done[0].result.as_ref().map_err(|e| e.kind()).err(),
        Some(ErrorKind::Timeout)
    );
    // The rest of the answer arrives and is dropped; the connection stays open.
    Pair::input(&mut p.client, p.c, &down[third..], p.now);
    p.pump();
    assert!(p.completions().is_empty(), "no second completion");
    p.submit(RequestOp::Ping { payload: 0 }, None);
    p.drain();
    p.pump();
    let done = p.completions();
    assert!(done[0].result.is_ok(), "{:?}", done[0].result);
    assert!(p.c.is_some(), "the same connection");
}
