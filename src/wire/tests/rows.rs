//! Golden fixtures of the rows frames (4.9) and the missing-rows report (4.5), written by
//! hand from the specification's tables, and their rejections.

use super::*;

/// `PULL_ROWS`, handle 0x0000000100000005: table 7, f32 rows of 4, ids 42 and 7.
#[rustfmt::skip]
const PULL_ROWS: &[u8] = &[
    0x53, 0x57, 0x52, 0x45, 0x02,                   // magic, version 2
    0x0c,                                           // kind PULL_ROWS
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00,             // flags, status, reserved
    0x01, 0x00, 0x00, 0x00,                         // count 1 table
    0x05, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, // handle
    0x38, 0x00, 0x00, 0x00,                         // meta_len 56 = 8 + 32 + 16
    0x00, 0x00, 0x00, 0x00,                         // payload_len 0
    0x07, 0x00, 0x00, 0x00,                         // table 7
    0x00, 0x00, 0x00, 0x00,                         // reserved
    0x0a, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // block: f32, rank 2, flags 0, reserved
    0x20, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // byte_len 32
    0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // dims[0] = n = 2
    0x04, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // dims[1] = 4
    0x2a, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // id 42
    0x07, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // id 7
];

/// `PUSH_ROWS`, same handle: table 7, u8 rows of 3, ids 1 and 2, gradients 1 1 1 2 2 2.
#[rustfmt::skip]
const PUSH_ROWS: &[u8] = &[
    0x53, 0x57, 0x52, 0x45, 0x02,
    0x0d,                                           // kind PUSH_ROWS
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x01, 0x00, 0x00, 0x00,                         // count 1
    0x05, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00,
    0x38, 0x00, 0x00, 0x00,                         // meta_len 56
    0x06, 0x00, 0x00, 0x00,                         // payload_len 6
    0x07, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // table 7, reserved
    0x02, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // block: u8, rank 2
    0x06, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // byte_len 6
    0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // n = 2
    0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // row of 3
    0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // id 1
    0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // id 2
    0x01, 0x01, 0x01, 0x02, 0x02, 0x02,             // the gradient block
];

/// The answer to `PULL_ROWS` with `END`: table 0's block, row 1 (id 7) missing.
#[rustfmt::skip]
const ROWS_ANSWER: &[u8] = &[
    0x53, 0x57, 0x52, 0x45, 0x02,
    0x09,                                           // kind RESPONSE
    0x01, 0x00, 0x00, 0x00, 0x00, 0x00,             // flags END
    0x01, 0x00, 0x00, 0x00,                         // count 1
    0x05, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00,
    0x30, 0x00, 0x00, 0x00,                         // meta_len 48 = 8 + 32 + 8
    0x20, 0x00, 0x00, 0x00,                         // payload_len 32
    0x00, 0x00, 0x00, 0x00,                         // index 0
    0x00, 0x00,                                     // status OK
    0x03, 0x00,                                     // HAS_TENSOR | HAS_MISSING
    0x0a, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // f32, rank 2
    0x20, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // byte_len 32
    0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x04, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x01, 0x00, 0x00, 0x00,                         // m = 1 missing row
    0x01, 0x00, 0x00, 0x00,                         // position 1
    0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x80, 0x3f, // row 0: 1.0 x 4
    0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x80, 0x3f,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // row 1: zeros
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
];

const H5: u64 = 0x0000_0001_0000_0005;

#[test]
fn fixture_pull_rows() {
    let (h, body, payload) = parse_ok(PULL_ROWS);
    let want_h = hdr(FrameKind::PullRows, false, Status::Ok, 1, H5, 56, 0);
    assert_eq!(h, want_h);
    assert!(payload.is_empty());
    let Body::PullRows(mut tables) = body else {
        panic!("{body:?}")
    };
    let t = tables.next().unwrap();
    assert!(tables.next().is_none());
    assert_eq!(t.table, 7);
    assert_eq!(t.block.dtype, DType::F32);
    assert_eq!(t.block.dims.iter().collect::<Vec<_>>(), [2, 4]);
    assert_eq!(t.ids().collect::<Vec<_>>(), [42, 7]);
    assert_eq!((t.len(), t.row_bytes()), (2, 16));
    let block = TensorMeta::new(DType::F32, &[2, 4]).unwrap();
    let emitted = emit_frame(
        &want_h,
        pull_rows_meta_len(2, 2),
        |b| emit_pull_rows_meta(7, &block, &[42, 7], b),
        &[],
    );
    assert_eq!(emitted, PULL_ROWS);
    round_trip(PULL_ROWS);
}

#[test]
fn fixture_push_rows() {
    let (h, body, payload) = parse_ok(PUSH_ROWS);
    let want_h = hdr(FrameKind::PushRows, false, Status::Ok, 1, H5, 56, 6);
    assert_eq!(h, want_h);
    assert_eq!(payload, [1, 1, 1, 2, 2, 2]);
    let tensors: Vec<_> = body.tensors().collect();
    assert_eq!(tensors.len(), 1);
    assert_eq!((tensors[0].index, tensors[0].meta.byte_len), (0, 6));
    let block = TensorMeta::new(DType::U8, &[2, 3]).unwrap();
    let emitted = emit_frame(
        &want_h,
        pull_rows_meta_len(2, 2),
        |b| emit_pull_rows_meta(7, &block, &[1, 2], b),
        payload,
    );
    assert_eq!(emitted, PUSH_ROWS);
    round_trip(PUSH_ROWS);
}

#[test]
fn fixture_rows_answer_with_a_missing_row() {
    let (h, body, payload) = parse_ok(ROWS_ANSWER);
    let want_h = hdr(FrameKind::Response, true, Status::Ok, 1, H5, 48, 32);
    assert_eq!(h, want_h);
    let Body::Response(mut entries) = body else {
        panic!("{body:?}")
    };
    let e = entries.next().unwrap();
    assert_eq!(e.missing.iter().collect::<Vec<_>>(), [1]);
    let missing = [1u32];
    let entry = ResponseEntry {
        versions: Default::default(),
        index: 0,
        status: Status::Ok,
        tensor: Some(TensorMeta::new(DType::F32, &[2, 4]).unwrap()),
        missing: Missing::Native(&missing),
    };
    assert_eq!(entry.buffer_len(), 48);
    let emitted = emit_frame(&want_h, 48, |b| entry.emit(b), payload);
    assert_eq!(emitted, ROWS_ANSWER);
    round_trip(ROWS_ANSWER);
}

#[test]
fn reject_bad_rows_tables() {
    // Offsets in the meta section of PULL_ROWS: block at 8 (flags at 10, dims at 24),
    // ids from 40.
    rejects(&patch(PULL_ROWS, |v| v[M + 4] = 1), Error::ReservedNotZero);
    // CHUNKED in a pull; DEAD anywhere.
    rejects(&patch(PULL_ROWS, |v| v[M + 10] = 2), Error::BadRows);
    rejects(&patch(PUSH_ROWS, |v| v[M + 10] = 1), Error::BadDeadTensor);
    // n = 0 (the byte_len then mismatches first, so keep it consistent: both zero).
    let empty = patch(PULL_ROWS, |v| {
        v[M + 16..M + 24].copy_from_slice(&0u64.to_le_bytes());
        v[M + 24..M + 32].copy_from_slice(&0u64.to_le_bytes());
    });
    rejects(&empty, Error::BadRows);
    // No table.
    rejects(&patch(PUSH_ROWS, |v| set32(v, H_COUNT, 0)), Error::BadCount);
    // Fewer id bytes than n says.
    rejects(&patch(PULL_ROWS, |v| set32(v, H_META_LEN, 48)), Error::BadMetaLen);
    // Over max_rows, over max_row_bytes, over max_tables.
    let tight = Limits {
        max_rows: 1,
        ..Limits::default()
    };
    rejects_with(PULL_ROWS, &tight, Error::TooManyRows);
    let narrow = Limits {
        max_row_bytes: 15,
        ..Limits::default()
    };
    rejects_with(PULL_ROWS, &narrow, Error::RowTooLarge);
    rejects(&patch(PULL_ROWS, |v| set32(v, H_COUNT, 1025)), Error::BadCount);
    // Payload of a push other than its blocks; payload on a pull.
    rejects(&with_payload(PUSH_ROWS, &[0; 5]), Error::BadPayloadLen);
    rejects(&with_payload(PULL_ROWS, &[0; 1]), Error::BadPayloadLen);
    // Handle 0.
    rejects(&patch(PULL_ROWS, |v| v[H_HANDLE..H_HANDLE + 8].fill(0)), Error::BadHandle);
}

#[test]
fn reject_bad_missing_reports() {
    // Entry meta at M: flags at 6, report count at 40, position at 44.
    rejects(&patch(ROWS_ANSWER, |v| set32(v, M + 40, 0)), Error::BadMissing);
    rejects(&patch(ROWS_ANSWER, |v| set32(v, M + 44, 2)), Error::BadMissing);
    rejects(&patch(ROWS_ANSWER, |v| set32(v, M + 40, 3)), Error::BadMissing);
    // HAS_MISSING without HAS_TENSOR (on a failed entry).
    let failed = patch(ROWS_ANSWER, |v| {
        set16(v, M + 4, 1);
        set16(v, M + 6, 2);
    });
    assert!(try_parse(&failed).is_err());
}
