//! The golden fixtures parsed, emitted and round-tripped; the tables of sections 2.1, 3,
//! 4.7 and 5.

use super::*;

// ---------------------------------------------------------------------------------------
// Fixtures: parse, emit, round trip.
// ---------------------------------------------------------------------------------------

/// Every limit at the smallest value section 6 allows.
const SMALLEST: Limits = Limits {
    max_frame: 65_536,
    max_key: 1,
    max_tensors: 1,
    max_rank: 0,
    max_tensor_bytes: 0,
    max_tables: 1,
    max_rows: 1,
    max_row_bytes: 1,
};

#[test]
fn fixture_hello() {
    let (h, body, payload) = parse_ok(HELLO);
    let want_h = hdr(FrameKind::Hello, false, Status::Ok, 0, 0, 58, 0);
    assert_eq!(h, want_h);
    assert!(payload.is_empty());
    let Body::Hello(r) = body else {
        panic!("{body:?}")
    };
    assert_eq!(r.cluster_id, 0x0123_4567_89ab_cdef);
    assert_eq!(r.task_index, 2);
    assert_eq!(r.limits, Limits::default());
    assert_eq!(r.job, b"worker");
    assert_eq!(r.token, b"s3cr");

    let repr = HelloRepr {
        cluster_id: 0x0123_4567_89ab_cdef,
        task_index: 2,
        limits: Limits::default(),
        job: b"worker",
        token: b"s3cr",
        features: crate::wire::WireFeatures::NONE,
    };
    assert_eq!(repr.check(), Ok(()));
    assert_eq!(
        emit_frame(&want_h, repr.buffer_len(), |b| repr.emit(b), &[]),
        HELLO
    );
    round_trip(HELLO);
}

#[test]
fn fixture_hello_ack() {
    let (h, body, payload) = parse_ok(HELLO_ACK);
    let want_h = hdr(FrameKind::HelloAck, false, Status::Ok, 0, 0, 50, 0);
    assert_eq!(h, want_h);
    assert!(payload.is_empty());
    let Body::HelloAck(r) = body else {
        panic!("{body:?}")
    };
    assert_eq!(r.cluster_id, 0x0123_4567_89ab_cdef);
    assert_eq!(r.task_index, 0);
    assert_eq!(r.limits, SMALLEST);
    assert_eq!(r.job, b"ps");
    assert!(r.token.is_empty());

    let repr = HelloRepr {
        cluster_id: 0x0123_4567_89ab_cdef,
        task_index: 0,
        limits: SMALLEST,
        job: b"ps",
        token: b"",
        features: crate::wire::WireFeatures::NONE,
    };
    assert_eq!(
        emit_frame(&want_h, repr.buffer_len(), |b| repr.emit(b), &[]),
        HELLO_ACK
    );
    round_trip(HELLO_ACK);
}

#[test]
fn fixture_ping_pong_section_7() {
    let (h, body, payload) = parse_ok(PING);
    let want_ping = hdr(
        FrameKind::Ping,
        false,
        Status::Ok,
        0,
        0x0000_0001_0000_0003,
        0,
        4,
    );
    assert_eq!(h, want_ping);
    assert_eq!(body, Body::Ping);
    assert_eq!(payload, [0xde, 0xad, 0xbe, 0xef]);
    assert_eq!(h.frame_len(), 36);
    assert_eq!(
        emit_frame(&want_ping, 0, |_| {}, &[0xde, 0xad, 0xbe, 0xef]),
        PING
    );
    round_trip(PING);

    let (h, body, payload) = parse_ok(PONG);
    let want_pong = HeaderRepr {
        kind: FrameKind::Pong,
        end: true,
        ..want_ping
    };
    assert_eq!(h, want_pong);
    assert_eq!(body, Body::Pong);
    assert_eq!(payload, [0xde, 0xad, 0xbe, 0xef]);
    assert_eq!(emit_frame(&want_pong, 0, |_| {}, payload), PONG);
    round_trip(PONG);

    // An empty ping is fine too ("any bytes").
    let empty = with_payload(PING, &[]);
    assert_eq!(parse_ok(&empty).0.payload_len, 0);
}

#[test]
fn fixture_recv() {
    let (h, body, payload) = parse_ok(RECV);
    let want_h = hdr(
        FrameKind::Recv,
        false,
        Status::Ok,
        1,
        0x0000_0001_0000_0004,
        13,
        0,
    );
    assert_eq!(h, want_h);
    assert!(payload.is_empty());
    let Body::Recv(r) = body else {
        panic!("{body:?}")
    };
    assert_eq!(r.step_id, 42);
    assert_eq!(r.keys.len(), 1);
    assert_eq!(r.keys.collect::<Vec<_>>(), [b"w:0"]);

    let keys = [b"w:0"];
    assert_eq!(recv_meta_len(&keys), 13);
    assert_eq!(
        emit_frame(&want_h, 13, |b| emit_recv_meta(42, &keys, b), &[]),
        RECV
    );
    round_trip(RECV);
}

#[test]
fn fixture_fused_recv() {
    let (h, body, payload) = parse_ok(FUSED_RECV);
    let want_h = hdr(
        FrameKind::FusedRecv,
        false,
        Status::Ok,
        3,
        0x0000_0002_0000_0001,
        20,
        0,
    );
    assert_eq!(h, want_h);
    assert!(payload.is_empty());
    let Body::FusedRecv(r) = body else {
        panic!("{body:?}")
    };
    assert_eq!(r.step_id, 7);
    let keys: Vec<&[u8]> = r.keys.collect();
    assert_eq!(keys, [&b"a"[..], b"bb", b"ccc"]);

    assert_eq!(recv_meta_len(&keys), 20);
    assert_eq!(
        emit_frame(&want_h, 20, |b| emit_recv_meta(7, &keys, b), &[]),
        FUSED_RECV
    );
    round_trip(FUSED_RECV);
}

#[test]
fn fixture_pull() {
    let (h, body, payload) = parse_ok(PULL);
    let want_h = hdr(
        FrameKind::Pull,
        false,
        Status::Ok,
        3,
        0x0000_0001_0000_0005,
        24,
        0,
    );
    assert_eq!(h, want_h);
    assert!(payload.is_empty());
    let Body::Pull(ids) = body else {
        panic!("{body:?}")
    };
    let want = [1, 0x1122_3344_5566_7788, u64::MAX];
    assert_eq!(ids.len(), 3);
    assert!(!ids.is_empty());
    assert_eq!(ids.iter().collect::<Vec<_>>(), want);
    assert_eq!(ids.get(1), Some(0x1122_3344_5566_7788));
    assert_eq!(ids.get(3), None);

    assert_eq!(pull_meta_len(3), 24);
    assert_eq!(
        emit_frame(&want_h, 24, |b| emit_pull_meta(&want, b), &[]),
        PULL
    );
    round_trip(PULL);
}

#[test]
fn fixture_push() {
    let (h, body, payload) = parse_ok(PUSH);
    let want_h = hdr(
        FrameKind::Push,
        false,
        Status::Ok,
        2,
        0x0000_0001_0000_0006,
        64,
        24,
    );
    assert_eq!(h, want_h);
    let Body::Push(entries) = body else {
        panic!("{body:?}")
    };
    let entries: Vec<PushEntry<'_>> = entries.collect();
    assert_eq!(entries.len(), 2);
    assert_eq!(entries[0].var_id, 10);
    let t = entries[0].meta;
    assert_eq!(t.dtype, DType::F32);
    assert!(!t.dead && !t.chunked && t.is_inline());
    assert_eq!(t.byte_len, 24);
    assert_eq!(t.dims.iter().collect::<Vec<_>>(), [2, 3]);
    assert_eq!(t.dims.elements(), Some(6));
    assert_eq!(entries[1].var_id, 11);
    let d = entries[1].meta;
    assert_eq!(d.dtype, DType::F32);
    assert!(d.dead && !d.chunked && !d.is_inline());
    assert_eq!(d.byte_len, 0);
    assert!(d.dims.is_empty());
    let floats: Vec<f32> = payload
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(floats, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    // The payload-order tensor view.
    let tensors: Vec<TensorEntry<'_>> = body.tensors().collect();
    assert_eq!(tensors.len(), 2);
    assert_eq!((tensors[0].index, tensors[1].index), (0, 1));

    let e0 = PushEntry {
        var_id: 10,
        meta: TensorMeta::new(DType::F32, &[2, 3]).unwrap(),
    };
    let e1 = PushEntry {
        var_id: 11,
        meta: TensorMeta::dead(DType::F32),
    };
    assert_eq!((e0.buffer_len(), e1.buffer_len()), (40, 24));
    assert_eq!(e0, entries[0]);
    assert_eq!(e1, entries[1]);
    let bytes = emit_frame(
        &want_h,
        64,
        |b| {
            e0.emit(&mut b[..40]);
            e1.emit(&mut b[40..]);
        },
        payload,
    );
    assert_eq!(bytes, PUSH);
    round_trip(PUSH);
}

#[test]
fn fixture_push_chunked() {
    let (h, body, payload) = parse_ok(PUSH_CHUNKED);
    let want_h = hdr(
        FrameKind::Push,
        false,
        Status::Ok,
        2,
        0x0000_0001_0000_0007,
        64,
        4,
    );
    assert_eq!(h, want_h);
    assert_eq!(payload, [1, 2, 3, 4]);
    let Body::Push(entries) = body else {
        panic!("{body:?}")
    };
    let entries: Vec<PushEntry<'_>> = entries.collect();
    assert_eq!(entries[0].var_id, 20);
    assert_eq!(entries[0].meta, TensorMeta::new(DType::U8, &[4]).unwrap());
    assert_eq!(entries[1].var_id, 21);
    let c = entries[1].meta;
    assert_eq!(c.dtype, DType::F64);
    assert!(c.chunked && !c.dead && !c.is_inline());
    assert_eq!(c.byte_len, 8_000_000);
    assert_eq!(c.dims.iter().collect::<Vec<_>>(), [1_000_000]);

    let e0 = PushEntry {
        var_id: 20,
        meta: TensorMeta::new(DType::U8, &[4]).unwrap(),
    };
    let e1 = PushEntry {
        var_id: 21,
        meta: TensorMeta {
            chunked: true,
            ..TensorMeta::new(DType::F64, &[1_000_000]).unwrap()
        },
    };
    let bytes = emit_frame(
        &want_h,
        64,
        |b| {
            e0.emit(&mut b[..32]);
            e1.emit(&mut b[32..]);
        },
        &[1, 2, 3, 4],
    );
    assert_eq!(bytes, PUSH_CHUNKED);
    round_trip(PUSH_CHUNKED);
}

#[test]
fn fixture_response() {
    let (h, body, payload) = parse_ok(RESPONSE);
    let want_h = hdr(
        FrameKind::Response,
        true,
        Status::Ok,
        3,
        0x0000_0001_0000_0004,
        48,
        8,
    );
    assert_eq!(h, want_h);
    assert_eq!(payload, [0xff, 0xff, 0xff, 0xff, 0x07, 0, 0, 0]);
    let Body::Response(entries) = body else {
        panic!("{body:?}")
    };
    let entries: Vec<ResponseEntry<'_>> = entries.collect();
    assert_eq!(entries.len(), 3);
    assert_eq!((entries[0].index, entries[0].status), (0, Status::Ok));
    let t = entries[0].tensor.expect("entry 0 has a tensor");
    assert_eq!(t.dtype, DType::I32);
    assert_eq!(t.byte_len, 8);
    assert_eq!(t.dims.iter().collect::<Vec<_>>(), [2]);
    assert!(t.is_inline());
    assert_eq!((entries[1].index, entries[1].status), (1, Status::NotFound));
    assert!(entries[1].tensor.is_none());
    assert_eq!((entries[2].index, entries[2].status), (2, Status::Ok));
    assert!(entries[2].tensor.is_none());
    let tensors: Vec<TensorEntry<'_>> = body.tensors().collect();
    assert_eq!(tensors.len(), 1);
    assert_eq!(tensors[0].index, 0);

    let es = [
        ResponseEntry {
            versions: Default::default(),
            index: 0,
            status: Status::Ok,
            tensor: TensorMeta::new(DType::I32, &[2]),
            missing: Missing::default(),
        },
        ResponseEntry {
            versions: Default::default(),
            index: 1,
            status: Status::NotFound,
            tensor: None,
            missing: Missing::default(),
        },
        ResponseEntry {
            versions: Default::default(),
            index: 2,
            status: Status::Ok,
            tensor: None,
            missing: Missing::default(),
        },
    ];
    assert_eq!(es, entries[..]);
    let bytes = emit_frame(
        &want_h,
        48,
        |b| {
            es[0].emit(&mut b[..32]);
            es[1].emit(&mut b[32..40]);
            es[2].emit(&mut b[40..]);
        },
        payload,
    );
    assert_eq!(bytes, RESPONSE);
    round_trip(RESPONSE);
}

#[test]
fn fixture_response_empty_and_chunked() {
    let (h, body, payload) = parse_ok(RESPONSE_EMPTY);
    let want_h = hdr(
        FrameKind::Response,
        true,
        Status::Ok,
        0,
        0x0000_0001_0000_0005,
        0,
        0,
    );
    assert_eq!(h, want_h);
    assert!(payload.is_empty());
    let Body::Response(entries) = body else {
        panic!("{body:?}")
    };
    assert_eq!(entries.count(), 0);
    assert_eq!(emit_frame(&want_h, 0, |_| {}, &[]), RESPONSE_EMPTY);
    round_trip(RESPONSE_EMPTY);

    let (h, body, payload) = parse_ok(RESPONSE_CHUNKED);
    let want_h = hdr(
        FrameKind::Response,
        false,
        Status::Ok,
        1,
        0x0000_0002_0000_0001,
        32,
        0,
    );
    assert_eq!(h, want_h);
    assert!(payload.is_empty());
    let Body::Response(mut entries) = body else {
        panic!("{body:?}")
    };
    let e = entries.next().unwrap();
    assert!(entries.next().is_none());
    assert_eq!((e.index, e.status), (2, Status::Ok));
    let t = e.tensor.unwrap();
    assert!(t.chunked);
    assert_eq!((t.dtype, t.byte_len), (DType::U8, 100_000));
    let want_e = ResponseEntry {
        versions: Default::default(),
        index: 2,
        status: Status::Ok,
        tensor: Some(TensorMeta {
            chunked: true,
            ..TensorMeta::new(DType::U8, &[100_000]).unwrap()
        }),
        missing: Missing::default(),
    };
    assert_eq!(want_e, e);
    assert_eq!(
        emit_frame(&want_h, 32, |b| want_e.emit(b), &[]),
        RESPONSE_CHUNKED
    );
    round_trip(RESPONSE_CHUNKED);
}

#[test]
fn fixture_errors() {
    let (h, body, payload) = parse_ok(ERROR_CONN);
    let want_h = hdr(FrameKind::Error, false, Status::ClusterMismatch, 0, 0, 9, 0);
    assert_eq!(h, want_h);
    assert!(payload.is_empty());
    let Body::Error(e) = body else {
        panic!("{body:?}")
    };
    assert_eq!(e.message, b"cluster");
    let repr = ErrorRepr::new(b"cluster");
    assert_eq!(
        emit_frame(&want_h, repr.buffer_len(), |b| repr.emit(b), &[]),
        ERROR_CONN
    );
    round_trip(ERROR_CONN);

    let (h, body, _) = parse_ok(ERROR_REQ);
    let want_h = hdr(
        FrameKind::Error,
        true,
        Status::Unimplemented,
        0,
        0x0000_0001_0000_0006,
        4,
        0,
    );
    assert_eq!(h, want_h);
    let Body::Error(e) = body else {
        panic!("{body:?}")
    };
    assert_eq!(e.message, b"no");
    let repr = ErrorRepr::new(b"no");
    assert_eq!(emit_frame(&want_h, 4, |b| repr.emit(b), &[]), ERROR_REQ);
    round_trip(ERROR_REQ);

    // An unknown nonzero status is a failure with a number (section 5), not a rejection.
    let odd = patch(ERROR_REQ, |v| set16(v, H_STATUS, 999));
    assert_eq!(parse_ok(&odd).0.status, Status::Unknown(999));
    // Invalid UTF-8 must be tolerated (4.6).
    let bad_utf8 = with_meta(ERROR_REQ, &[2, 0, 0xff, 0xfe]);
    let (_, body, _) = parse_ok(&bad_utf8);
    assert_eq!(
        body,
        Body::Error(ErrorRepr {
            message: &[0xff, 0xfe]
        })
    );
}

#[test]
fn fixture_chunk() {
    let (h, body, payload) = parse_ok(CHUNK);
    let want_h = hdr(
        FrameKind::Chunk,
        false,
        Status::Ok,
        1,
        0x0000_0001_0000_0007,
        16,
        5,
    );
    assert_eq!(h, want_h);
    assert_eq!(payload, [1, 2, 3, 4, 5]);
    let repr = ChunkRepr {
        index: 1,
        offset: 4096,
    };
    assert_eq!(body, Body::Chunk(repr));
    assert_eq!(
        emit_frame(&want_h, repr.buffer_len(), |b| repr.emit(b), payload),
        CHUNK
    );
    round_trip(CHUNK);
}

#[test]
fn every_fixture_round_trips_and_matches_header_view() {
    for (name, frame) in ALL {
        round_trip(frame);
        let view = Header::new_checked(*frame).unwrap();
        assert_eq!(view.magic(), MAGIC, "{name}");
        assert_eq!(view.version(), VERSION, "{name}");
        assert_eq!(view.reserved(), 0, "{name}");
        let (h, _, _) = parse_ok(frame);
        assert_eq!(h.frame_len(), frame.len() as u64, "{name}");
        assert_eq!(view.kind(), h.kind, "{name}");
        assert_eq!(view.handle(), h.handle, "{name}");
    }
}

// ---------------------------------------------------------------------------------------
// Tables of sections 2.1, 3, 4.7 and 5.
// ---------------------------------------------------------------------------------------

#[test]
fn tables_match_spec() {
    assert_eq!(MAGIC, [0x53, 0x57, 0x52, 0x45]);
    assert_eq!((VERSION, HEADER_LEN, FLAG_END), (2, 32, 1));
    let kinds = [
        FrameKind::Hello,
        FrameKind::HelloAck,
        FrameKind::Ping,
        FrameKind::Pong,
        FrameKind::Recv,
        FrameKind::FusedRecv,
        FrameKind::Pull,
        FrameKind::Push,
        FrameKind::Response,
        FrameKind::Error,
        FrameKind::Chunk,
        FrameKind::PullRows,
        FrameKind::PushRows,
        FrameKind::Cancel,
        FrameKind::Stats,
    ];
    for (i, k) in kinds.iter().enumerate() {
        assert_eq!(FrameKind::from(i as u8 + 1), *k);
        assert_eq!(u8::from(*k), i as u8 + 1);
    }
    let requests: Vec<FrameKind> = kinds.iter().copied().filter(|k| k.is_request()).collect();
    assert_eq!(
        requests,
        [
            FrameKind::Ping,
            FrameKind::Recv,
            FrameKind::FusedRecv,
            FrameKind::Pull,
            FrameKind::Push,
            FrameKind::PullRows,
            FrameKind::PushRows,
            FrameKind::Stats
        ]
    );

    let sizes = [1, 1, 1, 2, 2, 2, 2, 4, 4, 4, 8, 8, 8, 8, 16];
    for (i, s) in sizes.iter().enumerate() {
        assert_eq!(DType::from(i as u8 + 1).size(), Some(*s));
    }
    assert_eq!(DType::from(0).size(), None);
    assert_eq!(DType::from(16).size(), None);

    let statuses = [
        Status::Ok,
        Status::NotFound,
        Status::Aborted,
        Status::Cancelled,
        Status::DeadlineExceeded,
        Status::Shutdown,
        Status::ResourceExhausted,
        Status::InvalidArgument,
        Status::Internal,
        Status::Unimplemented,
        Status::Unavailable,
        Status::Protocol,
        Status::VersionMismatch,
        Status::ClusterMismatch,
        Status::Unauthenticated,
        Status::TaskRejected,
    ];
    for (i, s) in statuses.iter().enumerate() {
        assert_eq!(Status::from(i as u16), *s);
        assert_eq!(u16::from(*s), i as u16);
    }
    assert_eq!(Status::from(16), Status::Unknown(16));

    let d = Limits::default();
    assert_eq!(d.max_frame, 16 << 20);
    assert_eq!(d.max_key, 4096);
    assert_eq!(d.max_tensors, 65_536);
    assert_eq!(d.max_rank, 16);
    assert_eq!(d.max_tensor_bytes, 4 << 30);
    assert!(d.validate().is_ok());
    assert_eq!((MAX_JOB_NAME, MAX_TOKEN, MAX_ERROR_MESSAGE), (64, 64, 1024));
}

#[test]
fn every_dtype_size_checked() {
    for dtype in 1u8..=15 {
        let size = DType::from(dtype).size().unwrap();
        assert!(try_parse(&push1(&tmeta(dtype, 0, 3 * size, &[3]), 3 * size as usize)).is_ok());
        let off_by_one = push1(&tmeta(dtype, 0, 3 * size + 1, &[3]), 3 * size as usize + 1);
        rejects(&off_by_one, Error::ByteLenMismatch);
        // Rank 0: the product is 1.
        assert!(try_parse(&push1(&tmeta(dtype, 0, size, &[]), size as usize)).is_ok());
        // Dead tensors take any known dtype.
        assert!(try_parse(&push1(&tmeta(dtype, 1, 0, &[]), 0)).is_ok());
    }
}

#[test]
fn fixture_cancel() {
    let (h, body, payload) = parse_ok(CANCEL);
    let want = hdr(FrameKind::Cancel, false, Status::Ok, 2, 0x0000_0002_0000_0001, 8, 0);
    assert_eq!(h, want);
    assert!(payload.is_empty());
    let Body::Cancel(items) = body else {
        panic!("{body:?}")
    };
    assert_eq!(items.iter().collect::<Vec<_>>(), [2, 5]);
    assert_eq!(emit_frame(&want, 8, |b| emit_cancel_meta(&[2, 5], b), &[]), CANCEL);
    round_trip(CANCEL);
    let (h, body, _) = parse_ok(CANCEL_ALL);
    assert_eq!(h, hdr(FrameKind::Cancel, false, Status::Ok, 0, 0x0000_0001_0000_0004, 0, 0));
    assert!(matches!(body, Body::Cancel(items) if items.is_empty()));
    round_trip(CANCEL_ALL);
}

#[test]
fn fixture_stats() {
    let (h, body, payload) = parse_ok(STATS);
    let want = HeaderRepr {
        timeout_ms: 2000,
        ..hdr(FrameKind::Stats, false, Status::Ok, 0, 0x0000_0001_0000_0005, 0, 0)
    };
    assert_eq!(h, want);
    assert_eq!(body, Body::Stats);
    assert!(payload.is_empty());
    assert_eq!(emit_frame(&want, 0, |_| {}, &[]), STATS);
    round_trip(STATS);
}

#[test]
fn fixture_request_with_a_timeout() {
    let (h, body, _) = parse_ok(RECV_TIMEOUT);
    let want = HeaderRepr {
        timeout_ms: 1500,
        ..hdr(FrameKind::Recv, false, Status::Ok, 1, 0x0000_0001_0000_0004, 13, 0)
    };
    assert_eq!(h, want);
    assert_eq!(body, parse_ok(RECV).1, "the same body as without a timeout");
    let meta = &RECV_TIMEOUT[HEADER_LEN..];
    assert_eq!(emit_frame(&want, 13, |b| b.copy_from_slice(meta), &[]), RECV_TIMEOUT);
    round_trip(RECV_TIMEOUT);
}
