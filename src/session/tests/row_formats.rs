//! Rows in another float format than their table's, in memory: the handshake's feature
//! negotiation, bf16 and f16 pulls answered from an f32 table, bf16 pushes with a loss
//! scale, and the fall-back to the tables' dtype when a peer does not announce the feature.

use super::*;
use crate::float;
use crate::rows::{Init, MemTable, Optimizer, Tables};
use crate::service::Table as _;
use crate::wire::{LossScale, WireFeatures};

/// Table 1: rows of 4 floats created at a fixed function of their id by a pull; table 2:
/// rows of 4 floats a pull does not create, SGD with rate 1 (a push subtracts its
/// gradient from a row created at zero).
fn tables() -> (Arc<MemTable>, Arc<MemTable>, SharedService) {
    let uniform = Init::Uniform {
        scale: 3.0,
        seed: 11,
    };
    let one = Arc::new(MemTable::new(4, uniform, Optimizer::Sgd { lr: 1.0 }));
    let two = Arc::new(MemTable::new(4, Init::Missing, Optimizer::Sgd { lr: 1.0 }));
    let service = Tables::new().with(1, one.clone()).with(2, two.clone());
    (one, two, Arc::new(service))
}

fn pair(client: WireFeatures, server: WireFeatures, service: SharedService) -> Pair {
    Pair::serving(
        Config::builder("worker", 0).wire_features(client),
        Config::builder("ps", 0).wire_features(server),
        service,
    )
}

/// Opens the connection (a ping answered).
fn open(p: &mut Pair) {
    p.submit(RequestOp::Ping { payload: 0 }, None);
    p.drain();
    p.pump();
    assert_eq!(p.completions().len(), 1);
}

/// The features each end's connection uses: (client's, server's).
fn used(p: &Pair) -> (WireFeatures, WireFeatures) {
    let c = p.client.conns.get(p.c.unwrap()).unwrap();
    let s = p.server.conns.get(p.s.unwrap()).unwrap();
    (c.proto.features(), s.proto.features())
}

fn spec(table: u32, wire: DType, ids: &[u64]) -> RowsSpec {
    RowsSpec::of(&Rows::new(table, DType::F32, &[4], ids).travel_as(wire)).unwrap()
}

fn pull_as(table: u32, wire: DType, ids: &[u64]) -> RequestOp {
    RequestOp::PullRows {
        held: Vec::new(),
        tables: vec![spec(table, wire, ids)],
        ids: ids.to_vec(),
        alloc: None,
    }
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

/// The bytes of `values` converted into `to`, by the library's conversion.
fn narrowed(values: &[f32], to: DType) -> Vec<u8> {
    let mut out = vec![0u8; values.len() * to.size().unwrap() as usize];
    float::narrow_from(values, to, &mut out, None).unwrap();
    out
}

#[test]
fn ends_that_both_announce_row_formats_use_it_and_others_use_nothing() {
    let all = WireFeatures::ALL;
    let none = WireFeatures::NONE;
    let (_, _, service) = tables();
    for (client, server, want) in [
        (all, all, all),
        (none, all, none),
        (all, none, none),
        (none, none, none),
    ] {
        let mut p = pair(client, server, service.clone());
        open(&mut p);
        assert_eq!(used(&p), (want, want), "client {client}, server {server}");
        // What the server announced: its own features to a client that announced some,
        // none to one that announced none (a peer of an earlier release rejects others).
        let ack_features = u16::from_le_bytes([p.to_client[32 + 22], p.to_client[32 + 23]]);
        let announced = if client.is_empty() { none } else { server };
        assert_eq!(
            ack_features,
            announced.bits(),
            "client {client}, server {server}"
        );
        let c = p.client.conns.get(p.c.unwrap()).unwrap();
        assert_eq!(c.proto.peer().unwrap().features, announced);
    }
}

#[test]
fn a_bf16_or_f16_pull_of_an_f32_table_gets_its_rows_rounded() {
    let (one, two, service) = tables();
    two.push(&[5], &le(&[-1.5, 1e-3, 70000.0, 0.1]));
    let mut p = pair(WireFeatures::ALL, WireFeatures::ALL, service);
    open(&mut p);
    let ids = [3u64, 9, 3, 12];
    for wire in [DType::BF16, DType::F16] {
        p.submit(pull_as(1, wire, &ids), None);
        p.submit(pull_as(2, wire, &[7, 5]), None);
        p.drain();
        p.pump();
        let done = p.completions();
        assert_eq!(done.len(), 2);
        let rows = rows_of(&done[0]);
        let block = rows.block(0).unwrap();
        assert_eq!((block.dtype(), block.dims()), (wire, &[4u64, 4][..]));
        // Exactly the table's f32 values as the conversion rounds them.
        let held: Vec<f32> = ids.iter().flat_map(|&id| one.get(id).unwrap()).collect();
        assert_eq!(block.bytes(), narrowed(&held, wire), "{wire:?}");
        let mut values = vec![0f32; 16];
        rows.read_f32(0, &mut values).unwrap();
        let mut want = vec![0f32; 16];
        float::widen_into(wire, &narrowed(&held, wire), &mut want).unwrap();
        assert_eq!(values, want);
        let differs = values.iter().zip(&held).any(|(a, b)| a != b);
        assert!(differs, "random rows lose bits in {wire:?}");
        // A missing row is zeros in the format asked for; the row that is there rounds.
        let rows = rows_of(&done[1]);
        assert_eq!(rows.missing(0), [0]);
        let mut values = [0f32; 8];
        rows.read_f32(0, &mut values).unwrap();
        let row5 = [1.5, -1e-3, -70000.0, -0.1];
        let mut want = [0f32; 4];
        float::widen_into(wire, &narrowed(&row5, wire), &mut want).unwrap();
        assert_eq!(values[..4], [0.0; 4]);
        assert_eq!(values[4..], want);
        if wire == DType::F16 {
            assert_eq!(values[6], f32::NEG_INFINITY, "past f16's range");
        }
    }
}

#[test]
fn a_bf16_push_with_a_loss_scale_is_applied_as_f32_gradients_over_the_scale() {
    let (_, two, service) = tables();
    let mut p = pair(WireFeatures::ALL, WireFeatures::ALL, service);
    open(&mut p);
    // Gradients as a trainer has them after a scaled loss: the true gradients x 1024.
    let scale = 1024.0f32;
    let truth = [0.3f32, -0.002, 1.5e-5, 7.25, 0.0, -3.0, 1e-9, 0.125];
    let scaled: Vec<f32> = truth.iter().map(|g| g * scale).collect();
    let mut t = spec(2, DType::BF16, &[40, 41]);
    t.loss_scale = LossScale::new(scale);
    p.submit(
        RequestOp::PushRows {
            tables: vec![t],
            ids: vec![40, 41],
            grads: le(&scaled),
            shared: Vec::new(),
        },
        None,
    );
    p.drain();
    p.pump();
    let done = p.completions();
    assert_eq!(done[0].result, Ok(Reply::Pushed(vec![Status::Ok])));
    // SGD from zero: each row is minus its gradient, the gradient being the bf16 of the
    // scaled one, widened and divided by the scale (a power of two: exact).
    let mut travelled = [0f32; 8];
    float::widen_into(DType::BF16, &narrowed(&scaled, DType::BF16), &mut travelled).unwrap();
    let got: Vec<f32> = [40, 41]
        .iter()
        .flat_map(|&id| two.get(id).unwrap())
        .collect();
    for k in 0..8 {
        assert_eq!(got[k], -(travelled[k] / scale), "element {k}");
        // Within bf16's rounding of the true gradient (8 significant bits).
        let err = (got[k] + truth[k]).abs();
        assert!(
            err <= truth[k].abs() / 256.0,
            "element {k}: {} vs {}",
            got[k],
            truth[k]
        );
    }
}

#[test]
fn a_peer_without_row_formats_gets_and_sends_rows_in_the_tables_dtype() {
    let (one, two, service) = tables();
    let mut p = pair(WireFeatures::ALL, WireFeatures::NONE, service);
    open(&mut p);
    assert_eq!(used(&p), (WireFeatures::NONE, WireFeatures::NONE));
    // A bf16 pull travels as f32: the rows come exactly as the table holds them.
    p.submit(pull_as(1, DType::BF16, &[3, 8]), None);
    // A bf16 push with a loss scale travels as f32 gradients divided by the scale here.
    let mut t = spec(2, DType::BF16, &[50]);
    t.loss_scale = LossScale::new(4.0);
    p.submit(
        RequestOp::PushRows {
            tables: vec![t],
            ids: vec![50],
            grads: le(&[4.0, -0.4, 1e-3, 12.0]),
            shared: Vec::new(),
        },
        None,
    );
    p.drain();
    p.pump();
    let done = p.completions();
    assert_eq!(done.len(), 2);
    let rows = rows_of(&done[0]);
    let block = rows.block(0).unwrap();
    assert_eq!(block.dtype(), DType::F32, "the table's dtype");
    let held: Vec<f32> = [3, 8].iter().flat_map(|&id| one.get(id).unwrap()).collect();
    assert_eq!(block.bytes(), le(&held));
    let mut values = vec![0f32; 8];
    rows.read_f32(0, &mut values).unwrap();
    assert_eq!(values, held);
    assert_eq!(done[1].result, Ok(Reply::Pushed(vec![Status::Ok])));
    let want: Vec<f32> = [4.0f32, -0.4, 1e-3, 12.0]
        .iter()
        .map(|g| -(g * 0.25))
        .collect();
    assert_eq!(two.get(50).unwrap(), want);
    // Nothing the server could not read went up: the connection is still open.
    open(&mut p);
}

#[test]
fn a_server_refuses_rows_of_another_format_on_a_connection_without_the_feature() {
    let (_, _, service) = tables();
    // A client that announces nothing and asks for bf16 rows anyway (it cannot expect
    // them converted): the answer says why.
    let mut p = pair(WireFeatures::NONE, WireFeatures::ALL, service);
    open(&mut p);
    let mut t = spec(1, DType::BF16, &[3]);
    // Bypass the fall-back: the request's spec already says bf16 is the rows' own dtype.
    t.dtype = DType::BF16;
    p.submit(
        RequestOp::PullRows {
            held: Vec::new(),
            tables: vec![t],
            ids: vec![3],
            alloc: None,
        },
        None,
    );
    p.drain();
    p.pump();
    let done = p.completions();
    let Err(e) = &done[0].result else {
        panic!("not refused")
    };
    let why = e.remote_message().unwrap_or_default();
    assert!(why.contains("holds f32 [4] rows"), "{why}");
    assert!(why.contains("row_formats"), "{why}");
}

/// What a server of an earlier release answers a `HELLO` whose `features` are not zero
/// (a reserved field then): `ERROR`, handle 0, `PROTOCOL`, and it closes.
fn old_server_refusal() -> Vec<u8> {
    let msg = b"reserved field is not zero";
    let mut f = vec![0x53, 0x57, 0x52, 0x45, 2, 10, 0, 0, 11, 0, 0, 0, 0, 0, 0, 0];
    f.extend_from_slice(&[0; 8]); // handle 0
    f.extend_from_slice(&(2 + msg.len() as u32).to_le_bytes()); // meta_len
    f.extend_from_slice(&[0; 4]); // payload_len
    f.extend_from_slice(&(msg.len() as u16).to_le_bytes());
    f.extend_from_slice(msg);
    f
}

#[test]
fn a_server_that_refuses_a_hello_with_features_is_connected_to_again_without() {
    let (_, _, service) = tables();
    let mut p = pair(WireFeatures::ALL, WireFeatures::ALL, service);
    p.submit(RequestOp::Ping { payload: 0 }, None);
    p.drain();
    let hello = Pair::output(&mut p.client, &mut p.dirty, p.c);
    assert_eq!(hello[5], 1, "a HELLO");
    assert_eq!(
        u16::from_le_bytes([hello[32 + 22], hello[32 + 23]]),
        WireFeatures::ALL.bits()
    );
    // Instead of the server, one of an earlier release answers.
    Pair::input(&mut p.client, p.c, &old_server_refusal(), p.now);
    p.actions();
    assert!(
        p.completions().is_empty(),
        "the ping waits for the next connection"
    );
    // The refused connection lingers, closes, and its ping goes to a new connection
    // (accepted by the test's server) that announces nothing.
    p.advance(Duration::from_secs(2));
    p.pump();
    let done = p.completions();
    assert_eq!(done.len(), 1);
    assert!(done[0].result.is_ok(), "{:?}", done[0].result);
    let c = p.client.conns.get(p.c.unwrap()).unwrap();
    assert!(c.proto.announced().is_empty());
    assert_eq!(used(&p), (WireFeatures::NONE, WireFeatures::NONE));
    // Later connections to it announce nothing either: no second refusal.
    p.submit(pull_as(1, DType::BF16, &[3]), None);
    p.drain();
    p.pump();
    let done = p.completions();
    let rows = rows_of(&done[0]);
    assert_eq!(rows.block(0).unwrap().dtype(), DType::F32, "served in f32");
}
