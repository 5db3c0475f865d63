//! Golden fixtures of the `ROW_FORMATS` feature (4.1 `features`, 4.9 row formats and
//! `loss_scale`), written by hand from the specification's tables, and their rejections.
//! The fixtures of the other files are unchanged by the feature: they announce none.

use super::*;
use crate::float;

/// 4.1 `HELLO` announcing `ROW_FORMATS`: `HELLO` of `mod.rs` with `features` = 1.
#[rustfmt::skip]
const HELLO_ROW_FORMATS: &[u8] = &[
    0x53, 0x57, 0x52, 0x45,                         // magic "SWRE"
    0x02,                                           // version 2
    0x01,                                           // kind HELLO
    0x00, 0x00,                                     // flags
    0x00, 0x00,                                     // status
    0x00, 0x00,                                     // reserved
    0x00, 0x00, 0x00, 0x00,                         // count 0
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // handle 0
    0x3a, 0x00, 0x00, 0x00,                         // meta_len 58 = 48 + 6 + 4
    0x00, 0x00, 0x00, 0x00,                         // payload_len 0
    // hello body
    0xef, 0xcd, 0xab, 0x89, 0x67, 0x45, 0x23, 0x01, // cluster_id
    0x02, 0x00, 0x00, 0x00,                         // task_index 2
    0x00, 0x00, 0x00, 0x01,                         // max_frame 0x0100_0000
    0x06,                                           // job_len 6
    0x04,                                           // token_len 4
    0x10,                                           // max_rank 16
    0x00,                                           // reserved
    0x00, 0x10,                                     // max_key 4096
    0x01, 0x00,                                     // features: bit 0 ROW_FORMATS
    0x00, 0x00, 0x01, 0x00,                         // max_tensors 65536
    0x00, 0x04, 0x00, 0x00,                         // max_tables 1024
    0x00, 0x00, 0x10, 0x00,                         // max_rows 2^20
    0x00, 0x00, 0x10, 0x00,                         // max_row_bytes 2^20
    0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, // max_tensor_bytes 2^32
    0x77, 0x6f, 0x72, 0x6b, 0x65, 0x72,             // job "worker"
    0x73, 0x33, 0x63, 0x72,                         // token "s3cr"
];

/// `PULL_ROWS`, handle 0x0000000100000005: table 7, bf16 rows of 4, ids 42 and 7.
#[rustfmt::skip]
const PULL_ROWS_BF16: &[u8] = &[
    0x53, 0x57, 0x52, 0x45, 0x02,                   // magic, version 2
    0x0c,                                           // kind PULL_ROWS
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00,             // flags, status, reserved
    0x01, 0x00, 0x00, 0x00,                         // count 1 table
    0x05, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, // handle
    0x38, 0x00, 0x00, 0x00,                         // meta_len 56 = 8 + 32 + 16
    0x00, 0x00, 0x00, 0x00,                         // payload_len 0
    0x07, 0x00, 0x00, 0x00,                         // table 7
    0x00, 0x00, 0x00, 0x00,                         // loss_scale 0 (a pull has none)
    0x07, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // block: bf16, rank 2
    0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // byte_len 16 = 2 x 4 x 2
    0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // dims[0] = n = 2
    0x04, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // dims[1] = 4
    0x2a, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // id 42
    0x07, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // id 7
];

/// The f32 rows the answers below carry, as an f32 table holds them.
const ROWS_F32: [f32; 8] = [
    1.0,
    -2.5,
    1.0 + 3.0 / 256.0, // halfway between two bf16, rounded to the even one
    0.1,          // 0x3dcccccd
    65504.0,      // f16's largest; between two bf16, rounded up to 65536
    -0.0,
    f32::MAX,     // past bf16's largest plus half an ulp: infinity
    1e-40,        // subnormal, kept (not flushed)
];

/// The answer to `PULL_ROWS_BF16` with `END`: the rows of `ROWS_F32`, rounded to bf16.
#[rustfmt::skip]
const ROWS_ANSWER_BF16: &[u8] = &[
    0x53, 0x57, 0x52, 0x45, 0x02,
    0x09,                                           // kind RESPONSE
    0x01, 0x00, 0x00, 0x00, 0x00, 0x00,             // flags END
    0x01, 0x00, 0x00, 0x00,                         // count 1
    0x05, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00,
    0x28, 0x00, 0x00, 0x00,                         // meta_len 40 = 8 + 32
    0x10, 0x00, 0x00, 0x00,                         // payload_len 16
    0x00, 0x00, 0x00, 0x00,                         // index 0
    0x00, 0x00,                                     // status OK
    0x01, 0x00,                                     // HAS_TENSOR
    0x07, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // bf16, rank 2
    0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // byte_len 16
    0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x04, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x80, 0x3f,                                     // 1.0      0x3f80
    0x20, 0xc0,                                     // -2.5     0xc020
    0x82, 0x3f,                                     // 1.0117   0x3f82 (tie, to even)
    0xcd, 0x3d,                                     // 0.1      0x3dcd (up)
    0x80, 0x47,                                     // 65504    0x4780 = 65536
    0x00, 0x80,                                     // -0.0     0x8000
    0x80, 0x7f,                                     // f32::MAX 0x7f80 = infinity
    0x01, 0x00,                                     // 1e-40    0x0001
];

/// The same answer for rows asked as f16: `ROWS_F32` rounded to binary16.
#[rustfmt::skip]
const ROWS_ANSWER_F16: &[u8] = &[
    0x53, 0x57, 0x52, 0x45, 0x02,
    0x09,                                           // kind RESPONSE
    0x01, 0x00, 0x00, 0x00, 0x00, 0x00,             // flags END
    0x01, 0x00, 0x00, 0x00,                         // count 1
    0x05, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00,
    0x28, 0x00, 0x00, 0x00,                         // meta_len 40
    0x10, 0x00, 0x00, 0x00,                         // payload_len 16
    0x00, 0x00, 0x00, 0x00,                         // index 0
    0x00, 0x00,                                     // status OK
    0x01, 0x00,                                     // HAS_TENSOR
    0x06, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // f16, rank 2
    0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // byte_len 16
    0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x04, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x3c,                                     // 1.0      0x3c00
    0x00, 0xc1,                                     // -2.5     0xc100
    0x0c, 0x3c,                                     // 1.0117   0x3c0c (exact)
    0x66, 0x2e,                                     // 0.1      0x2e66
    0xff, 0x7b,                                     // 65504    0x7bff (exact)
    0x00, 0x80,                                     // -0.0     0x8000
    0x00, 0x7c,                                     // f32::MAX 0x7c00 = infinity
    0x00, 0x00,                                     // 1e-40    0x0000 (below half of 2^-24)
];

/// `PUSH_ROWS`, same handle: table 7, bf16 gradients of 2 per row for ids 1 and 2,
/// multiplied by the loss scale 1024: 512, -1024, 1, 2048 (that is 0.5, -1, 2^-10, 2).
#[rustfmt::skip]
const PUSH_ROWS_BF16_SCALED: &[u8] = &[
    0x53, 0x57, 0x52, 0x45, 0x02,
    0x0d,                                           // kind PUSH_ROWS
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x01, 0x00, 0x00, 0x00,                         // count 1
    0x05, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00,
    0x38, 0x00, 0x00, 0x00,                         // meta_len 56
    0x08, 0x00, 0x00, 0x00,                         // payload_len 8
    0x07, 0x00, 0x00, 0x00,                         // table 7
    0x00, 0x00, 0x80, 0x44,                         // loss_scale 1024.0 (0x44800000)
    0x07, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // block: bf16, rank 2
    0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // byte_len 8
    0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // n = 2
    0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // row of 2
    0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // id 1
    0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // id 2
    0x00, 0x44, 0x80, 0xc4,                         // 512 (0x4400), -1024 (0xc480)
    0x80, 0x3f, 0x00, 0x45,                         // 1 (0x3f80), 2048 (0x4500)
];

const H5: u64 = 0x0000_0001_0000_0005;

/// [`try_parse`] on a connection that negotiated `features`.
fn parse_on(frame: &[u8], features: WireFeatures) -> Result<(HeaderRepr, Body<'_>)> {
    let limits = lim();
    let header = HeaderRepr::parse(&Header::new_checked(frame)?, &limits)?;
    let meta_end = HEADER_LEN + header.meta_len as usize;
    let meta = frame.get(HEADER_LEN..meta_end).ok_or(Error::Truncated)?;
    let body = Body::parse_with(&header, meta, &limits, features)?;
    if (frame.len() - meta_end) as u64 != header.payload_len as u64 {
        return Err(Error::Truncated);
    }
    Ok((header, body))
}

#[test]
fn fixture_hello_announcing_row_formats() {
    let (h, body, _) = parse_ok(HELLO_ROW_FORMATS);
    let Body::Hello(r) = body else {
        panic!("{body:?}")
    };
    assert_eq!(r.features, WireFeatures::ROW_FORMATS);
    assert_eq!((r.job, r.token), (&b"worker"[..], &b"s3cr"[..]));
    let repr = HelloRepr {
        cluster_id: 0x0123_4567_89ab_cdef,
        task_index: 2,
        limits: Limits::default(),
        job: b"worker",
        token: b"s3cr",
        features: WireFeatures::ROW_FORMATS,
    };
    assert_eq!(
        emit_frame(&h, repr.buffer_len(), |b| repr.emit(b), &[]),
        HELLO_ROW_FORMATS
    );
    round_trip(HELLO_ROW_FORMATS);
    // The fixture of a peer that announces nothing differs in those two bytes alone, and
    // reads as no feature: what a peer of an earlier release sends.
    let differ: Vec<usize> = (0..HELLO.len())
        .filter(|&i| HELLO[i] != HELLO_ROW_FORMATS[i])
        .collect();
    assert_eq!(differ, [M + 22]);
    let Body::Hello(old) = parse_ok(HELLO).1 else {
        panic!("not a HELLO")
    };
    assert_eq!(old.features, WireFeatures::NONE);
    // Bits this version does not implement are kept as sent, and negotiate to nothing.
    let later = patch(HELLO_ROW_FORMATS, |v| set16(v, M + 22, 0x8003));
    let Body::Hello(r) = parse_ok(&later).1 else {
        panic!("not a HELLO")
    };
    assert_eq!(r.features.bits(), 0x8003);
    assert_eq!(WireFeatures::ALL.negotiate(r.features), WireFeatures::ALL);
    assert_eq!(
        WireFeatures::ROW_FORMATS.negotiate(r.features),
        WireFeatures::ROW_FORMATS
    );
}

#[test]
fn fixture_pull_rows_bf16_and_its_answers() {
    let (h, body, payload) = parse_ok(PULL_ROWS_BF16);
    assert_eq!(h, hdr(FrameKind::PullRows, false, Status::Ok, 1, H5, 56, 0));
    assert!(payload.is_empty());
    let Body::PullRows(mut tables) = body else {
        panic!("{body:?}")
    };
    let t = tables.next().unwrap();
    assert_eq!((t.table, t.block.dtype, t.loss_scale), (7, DType::BF16, None));
    assert_eq!((t.len(), t.row_bytes()), (2, 8));
    let block = TensorMeta::new(DType::BF16, &[2, 4]).unwrap();
    let emitted = emit_frame(
        &h,
        pull_rows_meta_len(2, 2),
        |b| emit_rows_meta(7, None, &block, &[42, 7], b),
        &[],
    );
    assert_eq!(emitted, PULL_ROWS_BF16);
    round_trip(PULL_ROWS_BF16);

    let f32_bytes: Vec<u8> = ROWS_F32.iter().flat_map(|v| v.to_le_bytes()).collect();
    for (answer, dtype) in [(ROWS_ANSWER_BF16, DType::BF16), (ROWS_ANSWER_F16, DType::F16)] {
        let (h, body, payload) = parse_ok(answer);
        assert_eq!(h, hdr(FrameKind::Response, true, Status::Ok, 1, H5, 40, 16));
        let Body::Response(mut entries) = body else {
            panic!("{body:?}")
        };
        let e = entries.next().unwrap();
        let block = TensorMeta::new(dtype, &[2, 4]).unwrap();
        assert_eq!(e.tensor, Some(block));
        // The library's conversion gives the bytes written by hand from the rules of 4.9.
        let mut converted = vec![0u8; 16];
        float::convert(DType::F32, &f32_bytes, dtype, &mut converted, None).unwrap();
        assert_eq!(converted, payload, "{dtype:?}");
        let entry = ResponseEntry {
            versions: Default::default(),
            index: 0,
            status: Status::Ok,
            tensor: Some(block),
            missing: Missing::default(),
        };
        assert_eq!(emit_frame(&h, 40, |b| entry.emit(b), payload), answer);
        round_trip(answer);
    }
}

#[test]
fn fixture_push_rows_bf16_with_a_loss_scale() {
    // Only a connection that negotiated ROW_FORMATS reads the word as a loss scale.
    assert_eq!(
        try_parse(PUSH_ROWS_BF16_SCALED).map(|_| ()),
        Err(Error::ReservedNotZero)
    );
    let (h, body) = parse_on(PUSH_ROWS_BF16_SCALED, WireFeatures::ROW_FORMATS).unwrap();
    assert_eq!(h, hdr(FrameKind::PushRows, false, Status::Ok, 1, H5, 56, 8));
    let Body::PushRows(mut tables) = body else {
        panic!("{body:?}")
    };
    let t = tables.next().unwrap();
    let scale = t.loss_scale.expect("a loss scale");
    assert_eq!((scale.get(), scale.reciprocal()), (1024.0, 1.0 / 1024.0));
    assert_eq!(t.ids().collect::<Vec<_>>(), [1, 2]);
    // What the PS applies: the gradients divided by the scale.
    let payload = &PUSH_ROWS_BF16_SCALED[M + 56..];
    let mut applied = [0f32; 4];
    float::widen_into(DType::BF16, payload, &mut applied).unwrap();
    let applied: Vec<f32> = applied.iter().map(|g| g * scale.reciprocal()).collect();
    assert_eq!(applied, [0.5, -1.0, 1.0 / 1024.0, 2.0]);

    let block = TensorMeta::new(DType::BF16, &[2, 2]).unwrap();
    let emitted = emit_frame(
        &h,
        pull_rows_meta_len(2, 2),
        |b| emit_rows_meta(7, LossScale::new(1024.0), &block, &[1, 2], b),
        payload,
    );
    assert_eq!(emitted, PUSH_ROWS_BF16_SCALED);
    // Without a scale the same push is a valid frame of any connection.
    let unscaled = patch(PUSH_ROWS_BF16_SCALED, |v| set32(v, M + 4, 0));
    assert!(try_parse(&unscaled).is_ok());
}

#[test]
fn reject_bad_loss_scales() {
    let on = WireFeatures::ROW_FORMATS;
    let bad = |bits: u32| {
        let frame = patch(PUSH_ROWS_BF16_SCALED, |v| set32(v, M + 4, bits));
        parse_on(&frame, on).map(|_| ())
    };
    for bits in [
        (-2.0f32).to_bits(),
        f32::NAN.to_bits(),
        f32::INFINITY.to_bits(),
        1,           // subnormal
        0x7e80_0001, // above 2^126
        0x007f_ffff, // below 2^-126
    ] {
        assert_eq!(bad(bits), Err(Error::BadLossScale), "{bits:#x}");
    }
    for bits in [0x0080_0000, 0x7e80_0000, 1.0f32.to_bits(), 3.0f32.to_bits()] {
        assert_eq!(bad(bits), Ok(()), "{bits:#x}");
    }
    // A pull has no loss scale, with the feature or without.
    let scaled_pull = patch(PULL_ROWS_BF16, |v| set32(v, M + 4, 1.0f32.to_bits()));
    assert_eq!(
        parse_on(&scaled_pull, on).map(|_| ()),
        Err(Error::BadLossScale)
    );
    assert_eq!(
        try_parse(&scaled_pull).map(|_| ()),
        Err(Error::ReservedNotZero)
    );
}
