//! Rows pulls with row versions, in memory: rows whose version the client holds are not
//! sent, changed rows come with their new versions, missing rows stay missing, a bf16 pull
//! composes with versions, and a peer without the feature gets a plain pull whose rows all
//! come as changed with version 0.

use super::*;
use crate::float;
use crate::rows::{Init, MemTable, Optimizer, Tables};
use crate::service::Table as _;
use crate::wire::{FrameKind, Limits, WireFeatures};

/// Table 1: rows of 4 floats a pull creates (at a fixed function of the id); table 2: rows
/// a pull does not create; table 3: a table that keeps no versions; SGD with rate 1.
fn tables() -> (Arc<MemTable>, Arc<MemTable>, SharedService) {
    let uniform = Init::Uniform {
        scale: 3.0,
        seed: 11,
    };
    let one = Arc::new(MemTable::new(4, uniform, Optimizer::Sgd { lr: 1.0 }));
    let two = Arc::new(MemTable::new(4, Init::Missing, Optimizer::Sgd { lr: 1.0 }));
    let service = Tables::new()
        .with(1, one.clone())
        .with(2, two.clone())
        .with(3, Arc::new(Unversioned(one.clone())));
    (one, two, Arc::new(service))
}

/// A table that keeps no versions: `Table::pull_versioned`'s default.
struct Unversioned(Arc<MemTable>);

impl crate::service::Table for Unversioned {
    fn dtype(&self) -> DType {
        DType::F32
    }
    fn row_dims(&self) -> &[u64] {
        self.0.row_dims()
    }
    fn pull(&self, ids: &[u64], out: &mut [u8], missing: &mut Vec<u32>) -> Status {
        self.0.pull(ids, out, missing)
    }
    fn push(&self, ids: &[u64], grads: &[u8]) -> Status {
        self.0.push(ids, grads)
    }
}

fn pair(client: WireFeatures, server: WireFeatures, service: SharedService) -> Pair {
    Pair::serving(
        Config::builder("worker", 0).wire_features(client),
        Config::builder("ps", 0).wire_features(server),
        service,
    )
}

fn pull(table: u32, wire: DType, ids: &[u64], held: &[u64]) -> RequestOp {
    let rows = Rows::new(table, DType::F32, &[4], ids).travel_as(wire);
    RequestOp::PullRows {
        tables: vec![RowsSpec::of(&rows).unwrap()],
        ids: ids.to_vec(),
        alloc: None,
        held: held.to_vec(),
    }
}

fn le(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// The answer to one pull.
fn answer(p: &mut Pair, op: RequestOp) -> PulledRows {
    p.submit(op, None);
    p.drain();
    p.pump();
    let mut done = p.completions();
    assert_eq!(done.len(), 1);
    match done.remove(0).result {
        Ok(Reply::Rows(r)) => r,
        other => panic!("not a rows answer: {other:?}"),
    }
}

/// The table's rows of `ids`, as f32 bytes.
fn rows_of(table: &MemTable, ids: &[u64]) -> Vec<u8> {
    ids.iter()
        .flat_map(|&id| le(&table.get(id).unwrap()))
        .collect()
}

/// The payload bytes of the `RESPONSE` frames the server sent since `from`.
fn answer_payload(p: &Pair, from: usize) -> u64 {
    let mut at = from;
    let mut payload = 0;
    let bytes = &p.to_client;
    while at + HEADER_LEN <= bytes.len() {
        let h = crate::wire::Header::new_checked(&bytes[at..]).unwrap();
        let h = crate::wire::HeaderRepr::parse(&h, &Limits::default()).unwrap();
        if h.kind == FrameKind::Response {
            payload += u64::from(h.payload_len);
        }
        at += HEADER_LEN + h.meta_len as usize + h.payload_len as usize;
    }
    payload
}

#[test]
fn unchanged_rows_are_not_sent_and_changed_ones_come_with_their_new_versions() {
    let (one, _, service) = tables();
    let mut p = pair(WireFeatures::ALL, WireFeatures::ALL, service);
    let ids = [3u64, 9, 12];
    // Holding nothing: every row sent, with its version.
    let first = answer(&mut p, pull(1, DType::F32, &ids, &[0, 0, 0]));
    let v = first.versions(0).to_vec();
    assert_eq!(v.len(), 3);
    assert!(v.iter().all(|&x| x != 0), "{v:?}");
    assert_eq!(v, ids.map(|id| one.version(id).unwrap()));
    assert_eq!(first.unchanged_count(0), 0);
    assert_eq!(first.block(0).unwrap().bytes(), rows_of(&one, &ids));
    // Holding every row at its version: nothing sent.
    let seen = p.to_client.len();
    let again = answer(&mut p, pull(1, DType::F32, &ids, &v));
    assert_eq!(again.versions(0), v);
    assert!((0..3).all(|i| again.unchanged(0, i)));
    assert_eq!(again.block(0).unwrap().dims(), [0, 4]);
    assert_eq!(answer_payload(&p, seen), 0, "no row bytes on the wire");
    // A push changes row 9: it alone comes, with a newer version.
    assert_eq!(one.push(&[9], &le(&[1.0, 1.0, 1.0, 1.0])), Status::Ok);
    let seen = p.to_client.len();
    let after = answer(&mut p, pull(1, DType::F32, &ids, &v));
    let w = after.versions(0);
    assert_eq!((w[0], w[2]), (v[0], v[2]));
    assert!(w[1] > v[1], "{w:?} after {v:?}");
    assert_eq!(w[1], one.version(9).unwrap());
    assert_eq!(
        (0..3).map(|i| after.unchanged(0, i)).collect::<Vec<_>>(),
        [true, false, true]
    );
    assert_eq!(after.block(0).unwrap().bytes(), rows_of(&one, &[9]));
    assert_eq!(answer_payload(&p, seen), 16, "one row of 4 f32");
    let changed: Vec<usize> = after.changed_rows(0).map(|(i, _)| i).collect();
    assert_eq!(changed, [1]);
    // Written into the caller's rows: row 9 replaced, the others left as they were.
    let mut mine = vec![0xeeu8; 48];
    assert_eq!(after.write_changed(0, &mut mine), Ok(1));
    assert_eq!(&mine[16..32], rows_of(&one, &[9]));
    assert!(mine[..16].iter().chain(&mine[32..]).all(|&b| b == 0xee));
    assert_eq!(
        after.write_changed(0, &mut [0u8; 47]),
        Err(Status::InvalidArgument)
    );
}

#[test]
fn missing_rows_stay_missing_with_version_0() {
    let (_, two, service) = tables();
    assert_eq!(two.push(&[5], &le(&[1.0, 2.0, 3.0, 4.0])), Status::Ok);
    let v5 = two.version(5).unwrap();
    let mut p = pair(WireFeatures::ALL, WireFeatures::ALL, service);
    let got = answer(&mut p, pull(2, DType::F32, &[7, 5], &[0, 0]));
    assert_eq!(got.missing(0), [0]);
    assert_eq!(got.versions(0), [0, v5]);
    // A version held of a row that is now missing does not make it unchanged.
    let got = answer(&mut p, pull(2, DType::F32, &[7, 5], &[v5, v5]));
    assert_eq!(got.missing(0), [0]);
    assert_eq!(got.versions(0), [0, v5]);
    assert!(!got.unchanged(0, 0) && got.unchanged(0, 1));
    assert_eq!(
        got.block(0).unwrap().bytes(),
        [0u8; 16],
        "the missing row, as zeros"
    );
}

#[test]
fn a_bf16_pull_with_versions_sends_the_changed_rows_rounded() {
    let (one, _, service) = tables();
    let mut p = pair(WireFeatures::ALL, WireFeatures::ALL, service);
    let ids = [4u64, 8];
    let first = answer(&mut p, pull(1, DType::BF16, &ids, &[0, 0]));
    let v = first.versions(0).to_vec();
    assert_eq!(first.block(0).unwrap().dtype(), DType::BF16);
    assert_eq!(one.push(&[4], &le(&[0.5, 0.5, 0.5, 0.5])), Status::Ok);
    let got = answer(&mut p, pull(1, DType::BF16, &ids, &v));
    assert!(!got.unchanged(0, 0) && got.unchanged(0, 1));
    let block = got.block(0).unwrap();
    assert_eq!((block.dtype(), block.dims()), (DType::BF16, &[1u64, 4][..]));
    let row = one.get(4).unwrap();
    let mut want = vec![0u8; 8];
    float::narrow_from(&row, DType::BF16, &mut want, None).unwrap();
    assert_eq!(block.bytes(), want);
}

#[test]
fn a_table_without_versions_answers_every_row_changed() {
    let (_, _, service) = tables();
    let mut p = pair(WireFeatures::ALL, WireFeatures::ALL, service);
    let got = answer(&mut p, pull(3, DType::F32, &[1, 2], &[0, 0]));
    assert_eq!(got.versions(0), [0, 0]);
    // Held versions match nothing: 0 is never a version.
    let got = answer(&mut p, pull(3, DType::F32, &[1, 2], &[0, 0]));
    assert_eq!(got.unchanged_count(0), 0);
    assert_eq!(got.block(0).unwrap().dims(), [2, 4]);
}

#[test]
fn a_peer_without_the_feature_gets_a_plain_pull_and_every_row_comes_changed() {
    let (one, _, service) = tables();
    let ids = [3u64, 9];
    let held = [one.version(3).unwrap_or(1), 5];
    for (client, server) in [
        (WireFeatures::ALL, WireFeatures::ROW_FORMATS),
        (WireFeatures::ROW_FORMATS, WireFeatures::ALL),
        (WireFeatures::NONE, WireFeatures::ALL),
    ] {
        let mut p = pair(client, server, service.clone());
        let got = answer(&mut p, pull(1, DType::F32, &ids, &held));
        assert_eq!(got.versions(0), [0, 0], "{client} {server}");
        assert_eq!(got.unchanged_count(0), 0);
        assert_eq!(got.block(0).unwrap().bytes(), rows_of(&one, &ids));
        // Held versions sent to a server without the feature would be a reserved word
        // that is not zero: it would close the connection and fail the pull.
        assert!(
            p.client.conns.get(p.c.unwrap()).is_some(),
            "the connection stays"
        );
    }
}

#[test]
fn a_server_counts_unchanged_rows_of_a_ps_table() {
    let table = Arc::new(
        crate::rows::PsTable::builder(4)
            .table_id(1)
            .build()
            .unwrap(),
    );
    let service: SharedService = Arc::new(Tables::new().with(1, table.clone()));
    let mut p = pair(WireFeatures::ALL, WireFeatures::ALL, service);
    let ids = [1u64, 2, 3, 4];
    let first = answer(&mut p, pull(1, DType::F32, &ids, &[0; 4]));
    let v = first.versions(0).to_vec();
    assert!(v.iter().all(|&x| x != 0));
    assert_eq!(table.push(&[2], &le(&[1.0; 4])), Status::Ok);
    let got = answer(&mut p, pull(1, DType::F32, &ids, &v));
    assert_eq!(got.unchanged_count(0), 3);
    assert!(!got.unchanged(0, 1));
    let m = table.metrics();
    assert_eq!((m.pulled_rows, m.unchanged_rows), (8, 3));
}
