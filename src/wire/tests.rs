//! An independent check of `docs/wire-format.md` against this module.
//!
//! The golden fixtures below were written by hand from the specification's tables (not
//! produced by the emit code). For every fixture the tests (a) parse it and check every
//! field, (b) emit the same frame with the emit API and compare byte for byte, and (c) run
//! parse -> emit -> parse. Then every rejection the specification lists is exercised, and a
//! small mutation loop checks that parsing never panics on damaged frames.

use super::*;

// ---------------------------------------------------------------------------------------
// Header offsets, from the table in section 2.1 (deliberately not taken from the code).
// ---------------------------------------------------------------------------------------

const H_VERSION: usize = 4;
const H_KIND: usize = 5;
const H_FLAGS: usize = 6;
const H_STATUS: usize = 8;
const H_RESERVED: usize = 10;
const H_COUNT: usize = 12;
const H_HANDLE: usize = 16;
const H_META_LEN: usize = 24;
const H_PAYLOAD_LEN: usize = 28;
/// Start of the meta section in a frame.
const M: usize = 32;

// ---------------------------------------------------------------------------------------
// Golden fixtures, one per frame kind (plus variants), written from the specification.
// ---------------------------------------------------------------------------------------

/// 4.1 `HELLO`: cluster 0x0123456789abcdef, task 2, max_frame 16 MiB, job "worker",
/// token "s3cr".
#[rustfmt::skip]
const HELLO: &[u8] = &[
    0x53, 0x57, 0x52, 0x45,                         // magic "SWRE"
    0x01,                                           // version 1
    0x01,                                           // kind HELLO
    0x00, 0x00,                                     // flags
    0x00, 0x00,                                     // status
    0x00, 0x00,                                     // reserved
    0x00, 0x00, 0x00, 0x00,                         // count 0
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // handle 0
    0x1e, 0x00, 0x00, 0x00,                         // meta_len 30 = 20 + 6 + 4
    0x00, 0x00, 0x00, 0x00,                         // payload_len 0
    // hello body
    0xef, 0xcd, 0xab, 0x89, 0x67, 0x45, 0x23, 0x01, // cluster_id
    0x02, 0x00, 0x00, 0x00,                         // task_index 2
    0x00, 0x00, 0x00, 0x01,                         // max_frame 0x0100_0000
    0x06,                                           // job_len 6
    0x04,                                           // token_len 4
    0x00, 0x00,                                     // reserved
    0x77, 0x6f, 0x72, 0x6b, 0x65, 0x72,             // job "worker"
    0x73, 0x33, 0x63, 0x72,                         // token "s3cr"
];

/// 4.1 `HELLO_ACK`: same cluster, task 0, max_frame 65,536 (the minimum), job "ps",
/// no token.
#[rustfmt::skip]
const HELLO_ACK: &[u8] = &[
    0x53, 0x57, 0x52, 0x45, 0x01,
    0x02,                                           // kind HELLO_ACK
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00,             // flags, status, reserved
    0x00, 0x00, 0x00, 0x00,                         // count 0
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // handle 0
    0x16, 0x00, 0x00, 0x00,                         // meta_len 22 = 20 + 2
    0x00, 0x00, 0x00, 0x00,                         // payload_len 0
    0xef, 0xcd, 0xab, 0x89, 0x67, 0x45, 0x23, 0x01, // cluster_id
    0x00, 0x00, 0x00, 0x00,                         // task_index 0
    0x00, 0x00, 0x01, 0x00,                         // max_frame 65536
    0x02, 0x00,                                     // job_len 2, token_len 0
    0x00, 0x00,                                     // reserved
    0x70, 0x73,                                     // job "ps"
];

/// Section 7, verbatim: `PING`, handle 0x0000000100000003, payload `de ad be ef`.
#[rustfmt::skip]
const PING: &[u8] = &[
    0x53, 0x57, 0x52, 0x45,  0x01,  0x03,  0x00, 0x00,  0x00, 0x00,  0x00, 0x00,  0x00, 0x00, 0x00, 0x00,
    0x03, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00,   0x00, 0x00, 0x00, 0x00,   0x04, 0x00, 0x00, 0x00,
    0xde, 0xad, 0xbe, 0xef,
];

/// Section 7, verbatim: the `PONG` with `END`.
#[rustfmt::skip]
const PONG: &[u8] = &[
    0x53, 0x57, 0x52, 0x45,  0x01,  0x04,  0x01, 0x00,  0x00, 0x00,  0x00, 0x00,  0x00, 0x00, 0x00, 0x00,
    0x03, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00,   0x00, 0x00, 0x00, 0x00,   0x04, 0x00, 0x00, 0x00,
    0xde, 0xad, 0xbe, 0xef,
];

/// 4.2 `RECV`: handle 0x0000000100000004, step 42, key "w:0".
#[rustfmt::skip]
const RECV: &[u8] = &[
    0x53, 0x57, 0x52, 0x45, 0x01,
    0x05,                                           // kind RECV
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00,             // flags, status, reserved
    0x01, 0x00, 0x00, 0x00,                         // count 1
    0x04, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, // handle
    0x0d, 0x00, 0x00, 0x00,                         // meta_len 13 = 8 + 2 + 3
    0x00, 0x00, 0x00, 0x00,                         // payload_len 0
    0x2a, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // step_id 42
    0x03, 0x00, 0x77, 0x3a, 0x30,                   // key "w:0"
];

/// 4.2 `FUSED_RECV`: handle 0x0000000200000001, step 7, keys "a", "bb", "ccc".
#[rustfmt::skip]
const FUSED_RECV: &[u8] = &[
    0x53, 0x57, 0x52, 0x45, 0x01,
    0x06,                                           // kind FUSED_RECV
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x03, 0x00, 0x00, 0x00,                         // count 3
    0x01, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, // handle
    0x14, 0x00, 0x00, 0x00,                         // meta_len 20 = 8 + 3 + 4 + 5
    0x00, 0x00, 0x00, 0x00,
    0x07, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // step_id 7
    0x01, 0x00, 0x61,                               // "a"
    0x02, 0x00, 0x62, 0x62,                         // "bb"
    0x03, 0x00, 0x63, 0x63, 0x63,                   // "ccc"
];

/// 4.3 `PULL`: handle 0x0000000100000005, ids 1, 0x1122334455667788, u64::MAX.
#[rustfmt::skip]
const PULL: &[u8] = &[
    0x53, 0x57, 0x52, 0x45, 0x01,
    0x07,                                           // kind PULL
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x03, 0x00, 0x00, 0x00,                         // count 3
    0x05, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, // handle
    0x18, 0x00, 0x00, 0x00,                         // meta_len 24
    0x00, 0x00, 0x00, 0x00,
    0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11,
    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
];

/// 4.4 `PUSH`: handle 0x0000000100000006; var 10 = f32 [2, 3] (1.0 ..= 6.0), var 11 = a dead
/// f32 tensor.
#[rustfmt::skip]
const PUSH: &[u8] = &[
    0x53, 0x57, 0x52, 0x45, 0x01,
    0x08,                                           // kind PUSH
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x02, 0x00, 0x00, 0x00,                         // count 2
    0x06, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, // handle
    0x40, 0x00, 0x00, 0x00,                         // meta_len 64 = (8 + 16 + 16) + (8 + 16)
    0x18, 0x00, 0x00, 0x00,                         // payload_len 24
    // entry 0 (meta offset 0)
    0x0a, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // var_id 10
    0x0a,                                           // dtype f32
    0x02,                                           // rank 2
    0x00, 0x00,                                     // tensor_flags
    0x00, 0x00, 0x00, 0x00,                         // reserved
    0x18, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // byte_len 24
    0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // dim 2
    0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // dim 3
    // entry 1 (meta offset 40)
    0x0b, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // var_id 11
    0x0a, 0x00,                                     // dtype f32, rank 0
    0x01, 0x00,                                     // DEAD
    0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // byte_len 0
    // payload: f32 1.0, 2.0, 3.0, 4.0, 5.0, 6.0
    0x00, 0x00, 0x80, 0x3f,  0x00, 0x00, 0x00, 0x40,  0x00, 0x00, 0x40, 0x40,
    0x00, 0x00, 0x80, 0x40,  0x00, 0x00, 0xa0, 0x40,  0x00, 0x00, 0xc0, 0x40,
];

/// 4.4 + 4.8 `PUSH` with a chunked entry: handle 0x0000000100000007; var 20 = u8 [4] inline,
/// var 21 = f64 [1_000_000] CHUNKED (8_000_000 bytes, not in this payload).
#[rustfmt::skip]
const PUSH_CHUNKED: &[u8] = &[
    0x53, 0x57, 0x52, 0x45, 0x01,
    0x08,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x02, 0x00, 0x00, 0x00,                         // count 2
    0x07, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, // handle
    0x40, 0x00, 0x00, 0x00,                         // meta_len 64 = 32 + 32
    0x04, 0x00, 0x00, 0x00,                         // payload_len 4 (inline tensor only)
    0x14, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // var_id 20
    0x02, 0x01, 0x00, 0x00,                         // u8, rank 1, no flags
    0x00, 0x00, 0x00, 0x00,
    0x04, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // byte_len 4
    0x04, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // dim 4
    0x15, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // var_id 21
    0x0d, 0x01, 0x02, 0x00,                         // f64, rank 1, CHUNKED
    0x00, 0x00, 0x00, 0x00,
    0x00, 0x12, 0x7a, 0x00, 0x00, 0x00, 0x00, 0x00, // byte_len 8_000_000
    0x40, 0x42, 0x0f, 0x00, 0x00, 0x00, 0x00, 0x00, // dim 1_000_000
    0x01, 0x02, 0x03, 0x04,                         // payload: var 20's contents
];

/// 4.5 `RESPONSE` with `END`: handle 0x0000000100000004; entry 0 OK with an i32 [2]
/// tensor (-1, 7), entry 1 NOT_FOUND, entry 2 OK without tensor (the shape of a push ack).
#[rustfmt::skip]
const RESPONSE: &[u8] = &[
    0x53, 0x57, 0x52, 0x45, 0x01,
    0x09,                                           // kind RESPONSE
    0x01, 0x00,                                     // flags END
    0x00, 0x00, 0x00, 0x00,
    0x03, 0x00, 0x00, 0x00,                         // count 3
    0x04, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, // handle
    0x30, 0x00, 0x00, 0x00,                         // meta_len 48 = (8 + 24) + 8 + 8
    0x08, 0x00, 0x00, 0x00,                         // payload_len 8
    // entry 0 (meta offset 0)
    0x00, 0x00, 0x00, 0x00,                         // index 0
    0x00, 0x00,                                     // status OK
    0x01, 0x00,                                     // HAS_TENSOR
    0x09, 0x01, 0x00, 0x00,                         // i32, rank 1
    0x00, 0x00, 0x00, 0x00,
    0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // byte_len 8
    0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // dim 2
    // entry 1 (meta offset 32)
    0x01, 0x00, 0x00, 0x00,  0x01, 0x00,  0x00, 0x00, // index 1, NOT_FOUND
    // entry 2 (meta offset 40)
    0x02, 0x00, 0x00, 0x00,  0x00, 0x00,  0x00, 0x00, // index 2, OK, no tensor
    // payload
    0xff, 0xff, 0xff, 0xff,  0x07, 0x00, 0x00, 0x00,
];

/// 4.5 `RESPONSE` with no entries, only `END`: handle 0x0000000100000005.
#[rustfmt::skip]
const RESPONSE_EMPTY: &[u8] = &[
    0x53, 0x57, 0x52, 0x45, 0x01, 0x09, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x05, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
];

/// 4.5 + 4.8 `RESPONSE` without `END` declaring one chunked u8 [100000] tensor for item 2:
/// handle 0x0000000200000001.
#[rustfmt::skip]
const RESPONSE_CHUNKED: &[u8] = &[
    0x53, 0x57, 0x52, 0x45, 0x01,
    0x09,
    0x00, 0x00,                                     // no END
    0x00, 0x00, 0x00, 0x00,
    0x01, 0x00, 0x00, 0x00,                         // count 1
    0x01, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, // handle
    0x20, 0x00, 0x00, 0x00,                         // meta_len 32
    0x00, 0x00, 0x00, 0x00,                         // payload_len 0
    0x02, 0x00, 0x00, 0x00,  0x00, 0x00,  0x01, 0x00, // index 2, OK, HAS_TENSOR
    0x02, 0x01, 0x02, 0x00,                         // u8, rank 1, CHUNKED
    0x00, 0x00, 0x00, 0x00,
    0xa0, 0x86, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, // byte_len 100000
    0xa0, 0x86, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, // dim 100000
];

/// 4.6 `ERROR` about the connection: handle 0, no END, CLUSTER_MISMATCH, "cluster".
#[rustfmt::skip]
const ERROR_CONN: &[u8] = &[
    0x53, 0x57, 0x52, 0x45, 0x01,
    0x0a,                                           // kind ERROR
    0x00, 0x00,                                     // no END
    0x0d, 0x00,                                     // status 13
    0x00, 0x00,
    0x00, 0x00, 0x00, 0x00,                         // count 0
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // handle 0
    0x09, 0x00, 0x00, 0x00,                         // meta_len 9
    0x00, 0x00, 0x00, 0x00,
    0x07, 0x00,                                     // msg_len 7
    0x63, 0x6c, 0x75, 0x73, 0x74, 0x65, 0x72,       // "cluster"
];

/// 4.6 `ERROR` failing a request: handle 0x0000000100000006, END, UNIMPLEMENTED, "no".
#[rustfmt::skip]
const ERROR_REQ: &[u8] = &[
    0x53, 0x57, 0x52, 0x45, 0x01,
    0x0a,
    0x01, 0x00,                                     // END
    0x09, 0x00,                                     // status 9
    0x00, 0x00,
    0x00, 0x00, 0x00, 0x00,
    0x06, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, // handle
    0x04, 0x00, 0x00, 0x00,                         // meta_len 4
    0x00, 0x00, 0x00, 0x00,
    0x02, 0x00, 0x6e, 0x6f,                         // "no"
];

/// 4.8 `CHUNK`: handle 0x0000000100000007, index 1, offset 4096, 5 bytes.
#[rustfmt::skip]
const CHUNK: &[u8] = &[
    0x53, 0x57, 0x52, 0x45, 0x01,
    0x0b,                                           // kind CHUNK
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x01, 0x00, 0x00, 0x00,                         // count 1
    0x07, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, // handle
    0x10, 0x00, 0x00, 0x00,                         // meta_len 16
    0x05, 0x00, 0x00, 0x00,                         // payload_len 5
    0x01, 0x00, 0x00, 0x00,                         // index 1
    0x00, 0x00, 0x00, 0x00,                         // reserved
    0x00, 0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // offset 4096
    0x01, 0x02, 0x03, 0x04, 0x05,
];

const ALL: &[(&str, &[u8])] = &[
    ("HELLO", HELLO),
    ("HELLO_ACK", HELLO_ACK),
    ("PING", PING),
    ("PONG", PONG),
    ("RECV", RECV),
    ("FUSED_RECV", FUSED_RECV),
    ("PULL", PULL),
    ("PUSH", PUSH),
    ("PUSH_CHUNKED", PUSH_CHUNKED),
    ("RESPONSE", RESPONSE),
    ("RESPONSE_EMPTY", RESPONSE_EMPTY),
    ("RESPONSE_CHUNKED", RESPONSE_CHUNKED),
    ("ERROR_CONN", ERROR_CONN),
    ("ERROR_REQ", ERROR_REQ),
    ("CHUNK", CHUNK),
];

// ---------------------------------------------------------------------------------------
// Helpers.
// ---------------------------------------------------------------------------------------

fn lim() -> Limits {
    Limits::default()
}

/// Parses a whole frame (header, meta, and a payload of exactly `payload_len` bytes).
fn try_parse_with<'a>(frame: &'a [u8], limits: &Limits) -> Result<(HeaderRepr, Body<'a>)> {
    let header = HeaderRepr::parse(&Header::new_checked(frame)?, limits)?;
    let meta_end = HEADER_LEN + header.meta_len as usize;
    let meta = frame.get(HEADER_LEN..meta_end).ok_or(Error::Truncated)?;
    let body = Body::parse(&header, meta, limits)?;
    if (frame.len() - meta_end) as u64 != header.payload_len as u64 {
        return Err(Error::Truncated);
    }
    Ok((header, body))
}

fn try_parse(frame: &[u8]) -> Result<(HeaderRepr, Body<'_>)> {
    try_parse_with(frame, &lim())
}

fn parse_ok(frame: &[u8]) -> (HeaderRepr, Body<'_>, &[u8]) {
    let (h, b) = try_parse(frame).unwrap_or_else(|e| panic!("fixture rejected: {e:?}"));
    let payload = &frame[HEADER_LEN + h.meta_len as usize..];
    (h, b, payload)
}

/// Asserts the frame is rejected with `want` under `limits`.
#[track_caller]
fn rejects_with(frame: &[u8], limits: &Limits, want: Error) {
    match try_parse_with(frame, limits) {
        Ok((h, _)) => panic!("accepted, wanted {want:?}: {h:?}"),
        Err(e) => assert_eq!(e, want),
    }
}

#[track_caller]
fn rejects(frame: &[u8], want: Error) {
    rejects_with(frame, &lim(), want)
}

fn set16(v: &mut [u8], at: usize, x: u16) {
    v[at..at + 2].copy_from_slice(&x.to_le_bytes());
}

fn set32(v: &mut [u8], at: usize, x: u32) {
    v[at..at + 4].copy_from_slice(&x.to_le_bytes());
}

fn set64(v: &mut [u8], at: usize, x: u64) {
    v[at..at + 8].copy_from_slice(&x.to_le_bytes());
}

fn rd32(v: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(v[at..at + 4].try_into().unwrap())
}

/// A copy of `frame` with `f` applied.
fn patch(frame: &[u8], f: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut v = frame.to_vec();
    f(&mut v);
    v
}

fn meta_of(frame: &[u8]) -> &[u8] {
    &frame[M..M + rd32(frame, H_META_LEN) as usize]
}

fn payload_of(frame: &[u8]) -> &[u8] {
    &frame[M + rd32(frame, H_META_LEN) as usize..]
}

/// `frame`'s header with a new meta section (meta_len updated), payload kept.
fn with_meta(frame: &[u8], meta: &[u8]) -> Vec<u8> {
    let mut v = frame[..M].to_vec();
    set32(&mut v, H_META_LEN, meta.len() as u32);
    v.extend_from_slice(meta);
    v.extend_from_slice(payload_of(frame));
    v
}

/// `frame`'s header and meta with a new payload (payload_len updated).
fn with_payload(frame: &[u8], payload: &[u8]) -> Vec<u8> {
    let mut v = frame[..M + rd32(frame, H_META_LEN) as usize].to_vec();
    set32(&mut v, H_PAYLOAD_LEN, payload.len() as u32);
    v.extend_from_slice(payload);
    v
}

/// A tensor meta built by hand from the table of 4.7.
fn tmeta(dtype: u8, flags: u16, byte_len: u64, dims: &[u64]) -> Vec<u8> {
    let mut v = vec![dtype, dims.len() as u8];
    v.extend_from_slice(&flags.to_le_bytes());
    v.extend_from_slice(&[0; 4]);
    v.extend_from_slice(&byte_len.to_le_bytes());
    for d in dims {
        v.extend_from_slice(&d.to_le_bytes());
    }
    v
}

/// A one-entry `PUSH` (var 1) with the given tensor meta and a payload of `payload` bytes.
fn push1(tensor_meta: &[u8], payload: usize) -> Vec<u8> {
    let mut meta = 1u64.to_le_bytes().to_vec();
    meta.extend_from_slice(tensor_meta);
    let f = patch(PUSH, |v| set32(v, H_COUNT, 1));
    with_payload(&with_meta(&f, &meta), &vec![0; payload])
}

/// Emits a whole frame with the emit API into a buffer pre-filled with 0xAA (so a byte the
/// emit code forgets to write shows up).
fn emit_frame(
    h: &HeaderRepr,
    meta_len: usize,
    emit_meta: impl FnOnce(&mut [u8]),
    payload: &[u8],
) -> Vec<u8> {
    assert_eq!(h.buffer_len(), HEADER_LEN);
    let mut buf = vec![0xAA; HEADER_LEN + meta_len + payload.len()];
    h.emit(&mut Header::new_unchecked(&mut buf[..HEADER_LEN]));
    emit_meta(&mut buf[HEADER_LEN..HEADER_LEN + meta_len]);
    buf[HEADER_LEN + meta_len..].copy_from_slice(payload);
    buf
}

/// Emits a parsed body's meta section with the emit API.
fn emit_body(body: &Body<'_>) -> Vec<u8> {
    fn fill(len: usize, f: impl FnOnce(&mut [u8])) -> Vec<u8> {
        let mut v = vec![0xAA; len];
        f(&mut v);
        v
    }
    match *body {
        Body::Hello(r) | Body::HelloAck(r) => fill(r.buffer_len(), |b| r.emit(b)),
        Body::Ping | Body::Pong => Vec::new(),
        Body::Recv(r) | Body::FusedRecv(r) => {
            let keys: Vec<&[u8]> = r.keys.collect();
            fill(recv_meta_len(&keys), |b| {
                emit_recv_meta(r.step_id, &keys, b)
            })
        }
        Body::Pull(ids) => {
            let ids: Vec<u64> = ids.iter().collect();
            fill(pull_meta_len(ids.len()), |b| emit_pull_meta(&ids, b))
        }
        Body::Push(entries) => entries
            .flat_map(|e| fill(e.buffer_len(), |b| e.emit(b)))
            .collect(),
        Body::Response(entries) => entries
            .flat_map(|e| fill(e.buffer_len(), |b| e.emit(b)))
            .collect(),
        Body::Error(e) => fill(e.buffer_len(), |b| e.emit(b)),
        Body::Chunk(c) => fill(c.buffer_len(), |b| c.emit(b)),
    }
}

/// (c): parse -> emit -> parse gives the same bytes and the same reprs.
fn round_trip(frame: &[u8]) {
    let (h, body, payload) = parse_ok(frame);
    let meta = emit_body(&body);
    let again = emit_frame(&h, meta.len(), |b| b.copy_from_slice(&meta), payload);
    assert_eq!(again, frame);
    let (h2, body2, payload2) = parse_ok(&again);
    assert_eq!(h2, h);
    assert_eq!(body2, body);
    assert_eq!(payload2, payload);
}

fn hdr(
    kind: Kind,
    end: bool,
    status: Status,
    count: u32,
    handle: u64,
    meta_len: u32,
    payload_len: u32,
) -> HeaderRepr {
    HeaderRepr {
        kind,
        end,
        status,
        count,
        handle,
        meta_len,
        payload_len,
    }
}

// ---------------------------------------------------------------------------------------
// Fixtures: parse, emit, round trip.
// ---------------------------------------------------------------------------------------

#[test]
fn fixture_hello() {
    let (h, body, payload) = parse_ok(HELLO);
    let want_h = hdr(Kind::Hello, false, Status::Ok, 0, 0, 30, 0);
    assert_eq!(h, want_h);
    assert!(payload.is_empty());
    let Body::Hello(r) = body else {
        panic!("{body:?}")
    };
    assert_eq!(r.cluster_id, 0x0123_4567_89ab_cdef);
    assert_eq!(r.task_index, 2);
    assert_eq!(r.max_frame, 16 << 20);
    assert_eq!(r.job, b"worker");
    assert_eq!(r.token, b"s3cr");

    let repr = HelloRepr {
        cluster_id: 0x0123_4567_89ab_cdef,
        task_index: 2,
        max_frame: 16 << 20,
        job: b"worker",
        token: b"s3cr",
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
    let want_h = hdr(Kind::HelloAck, false, Status::Ok, 0, 0, 22, 0);
    assert_eq!(h, want_h);
    assert!(payload.is_empty());
    let Body::HelloAck(r) = body else {
        panic!("{body:?}")
    };
    assert_eq!(r.cluster_id, 0x0123_4567_89ab_cdef);
    assert_eq!(r.task_index, 0);
    assert_eq!(r.max_frame, 65_536);
    assert_eq!(r.job, b"ps");
    assert!(r.token.is_empty());

    let repr = HelloRepr {
        cluster_id: 0x0123_4567_89ab_cdef,
        task_index: 0,
        max_frame: 65_536,
        job: b"ps",
        token: b"",
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
        Kind::Ping,
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
        kind: Kind::Pong,
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
        Kind::Recv,
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
        Kind::FusedRecv,
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
        Kind::Pull,
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
        Kind::Push,
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
        Kind::Push,
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
        Kind::Response,
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
            index: 0,
            status: Status::Ok,
            tensor: TensorMeta::new(DType::I32, &[2]),
        },
        ResponseEntry {
            index: 1,
            status: Status::NotFound,
            tensor: None,
        },
        ResponseEntry {
            index: 2,
            status: Status::Ok,
            tensor: None,
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
        Kind::Response,
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
        Kind::Response,
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
        index: 2,
        status: Status::Ok,
        tensor: Some(TensorMeta {
            chunked: true,
            ..TensorMeta::new(DType::U8, &[100_000]).unwrap()
        }),
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
    let want_h = hdr(Kind::Error, false, Status::ClusterMismatch, 0, 0, 9, 0);
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
        Kind::Error,
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
        Kind::Chunk,
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
    assert_eq!((VERSION, HEADER_LEN, FLAG_END), (1, 32, 1));
    let kinds = [
        Kind::Hello,
        Kind::HelloAck,
        Kind::Ping,
        Kind::Pong,
        Kind::Recv,
        Kind::FusedRecv,
        Kind::Pull,
        Kind::Push,
        Kind::Response,
        Kind::Error,
        Kind::Chunk,
    ];
    for (i, k) in kinds.iter().enumerate() {
        assert_eq!(Kind::from(i as u8 + 1), *k);
        assert_eq!(u8::from(*k), i as u8 + 1);
    }
    let requests: Vec<Kind> = kinds.iter().copied().filter(|k| k.is_request()).collect();
    assert_eq!(
        requests,
        [
            Kind::Ping,
            Kind::Recv,
            Kind::FusedRecv,
            Kind::Pull,
            Kind::Push
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

// ---------------------------------------------------------------------------------------
// Rejections of section 2.1 (header).
// ---------------------------------------------------------------------------------------

#[test]
fn reject_bad_magic() {
    for at in 0..4 {
        rejects(&patch(PING, |v| v[at] ^= 0x20), Error::BadMagic);
    }
    assert_eq!(Error::BadMagic.status(), Status::Protocol);
}

#[test]
fn reject_bad_version() {
    for ver in [0u8, 2, 255] {
        let f = patch(PING, |v| v[H_VERSION] = ver);
        rejects(&f, Error::BadVersion(ver));
        assert_eq!(Error::BadVersion(ver).status(), Status::VersionMismatch);
    }
}

#[test]
fn reject_unknown_kind() {
    for k in [0u8, 12, 13, 128, 255] {
        rejects(&patch(PING, |v| v[H_KIND] = k), Error::UnknownKind(k));
    }
}

#[test]
fn reject_reserved_nonzero() {
    for (name, frame) in ALL {
        for x in [1u16, 0x8000] {
            let f = patch(frame, |v| set16(v, H_RESERVED, x));
            assert_eq!(try_parse(&f).unwrap_err(), Error::ReservedNotZero, "{name}");
        }
    }
}

#[test]
fn reject_undefined_flag_bits() {
    for (name, frame) in ALL {
        for bit in 1..16 {
            let f = patch(frame, |v| v[H_FLAGS + bit / 8] ^= 1 << (bit % 8));
            assert_eq!(
                try_parse(&f).unwrap_err(),
                Error::BadFlags,
                "{name} bit {bit}"
            );
        }
    }
}

#[test]
fn reject_end_where_forbidden_or_missing() {
    // END must be zero on every kind but PONG, RESPONSE and ERROR.
    for frame in [HELLO, HELLO_ACK, PING, RECV, FUSED_RECV, PULL, PUSH, CHUNK] {
        rejects(&patch(frame, |v| v[H_FLAGS] |= 1), Error::BadFlags);
    }
    // PONG without END.
    rejects(&patch(PONG, |v| v[H_FLAGS] = 0), Error::BadFlags);
    // ERROR with handle != 0 without END; ERROR with handle 0 with END.
    rejects(&patch(ERROR_REQ, |v| v[H_FLAGS] = 0), Error::BadFlags);
    rejects(&patch(ERROR_CONN, |v| v[H_FLAGS] = 1), Error::BadFlags);
    // RESPONSE: END optional.
    assert!(try_parse(&patch(RESPONSE, |v| v[H_FLAGS] = 0)).is_ok());
    assert!(try_parse(&patch(RESPONSE_CHUNKED, |v| v[H_FLAGS] = 1)).is_ok());
}

#[test]
fn reject_status_rules() {
    for (name, frame) in ALL {
        if frame[H_KIND] == 10 {
            continue;
        }
        for s in [1u16, 11, 0xffff] {
            let f = patch(frame, |v| set16(v, H_STATUS, s));
            assert_eq!(try_parse(&f).unwrap_err(), Error::BadStatus, "{name}");
        }
    }
    rejects(
        &patch(ERROR_CONN, |v| set16(v, H_STATUS, 0)),
        Error::BadStatus,
    );
    rejects(
        &patch(ERROR_REQ, |v| set16(v, H_STATUS, 0)),
        Error::BadStatus,
    );
}

#[test]
fn reject_handle_rules() {
    // Requests need a nonzero handle (2.3, 3).
    for frame in [PING, RECV, FUSED_RECV, PULL, PUSH, PUSH_CHUNKED] {
        rejects(&patch(frame, |v| set64(v, H_HANDLE, 0)), Error::BadHandle);
    }
    // HELLO and HELLO_ACK carry handle 0 (3).
    for frame in [HELLO, HELLO_ACK] {
        for hd in [1u64, 1 << 32, u64::MAX] {
            rejects(&patch(frame, |v| set64(v, H_HANDLE, hd)), Error::BadHandle);
        }
    }
    // Answers with handle 0 can never name a request in flight (2.3); the code rejects them
    // already at the header (see the report: the specification does not say where).
    for frame in [PONG, RESPONSE, RESPONSE_EMPTY, CHUNK] {
        rejects(&patch(frame, |v| set64(v, H_HANDLE, 0)), Error::BadHandle);
    }
}

#[test]
fn reject_frame_over_max_frame_from_header_alone() {
    let limits = lim();
    // Only the 32 header bytes are available.
    let huge = patch(&PING[..HEADER_LEN], |v| set32(v, H_PAYLOAD_LEN, u32::MAX));
    let h = Header::new_checked(&huge[..]).unwrap();
    assert_eq!(
        HeaderRepr::parse(&h, &limits),
        Err(Error::FrameTooLarge {
            len: 32 + u32::MAX as u64,
            max: limits.max_frame,
        })
    );
    // meta_len and payload_len both at u32::MAX: no overflow in the sum.
    let both = patch(&huge, |v| set32(v, H_META_LEN, u32::MAX));
    assert_eq!(
        HeaderRepr::parse(&Header::new_checked(&both[..]).unwrap(), &limits),
        Err(Error::FrameTooLarge {
            len: 32 + 2 * u32::MAX as u64,
            max: limits.max_frame,
        })
    );
    // Exactly max_frame is allowed, one more byte is not.
    let exact = patch(&huge, |v| set32(v, H_PAYLOAD_LEN, limits.max_frame - 32));
    assert!(HeaderRepr::parse(&Header::new_checked(&exact[..]).unwrap(), &limits).is_ok());
    let over = patch(&huge, |v| set32(v, H_PAYLOAD_LEN, limits.max_frame - 31));
    assert!(matches!(
        HeaderRepr::parse(&Header::new_checked(&over[..]).unwrap(), &limits),
        Err(Error::FrameTooLarge { .. })
    ));
    // With a small receiver limit, a whole valid frame is rejected too.
    let small = Limits {
        max_frame: PUSH.len() as u32 - 1,
        ..limits
    };
    assert!(matches!(
        try_parse_with(PUSH, &small),
        Err(Error::FrameTooLarge { .. })
    ));
    assert!(try_parse_with(
        PUSH,
        &Limits {
            max_frame: PUSH.len() as u32,
            ..limits
        }
    )
    .is_ok());
}

#[test]
fn reject_count_rules() {
    let c = |frame: &[u8], n: u32| patch(frame, |v| set32(v, H_COUNT, n));
    // count 0 on HELLO, HELLO_ACK, PING, PONG, ERROR.
    for frame in [HELLO, HELLO_ACK, PING, PONG, ERROR_CONN, ERROR_REQ] {
        rejects(&c(frame, 1), Error::BadCount);
    }
    // count 1 on RECV and CHUNK.
    rejects(&c(RECV, 2), Error::BadCount);
    rejects(&c(RECV, 0), Error::BadCount);
    rejects(&c(CHUNK, 0), Error::BadCount);
    rejects(&c(CHUNK, 2), Error::BadCount);
    // >= 1 on FUSED_RECV, PULL, PUSH.
    for frame in [FUSED_RECV, PULL, PUSH] {
        rejects(&c(frame, 0), Error::BadCount);
        rejects(&c(frame, u32::MAX), Error::BadCount);
    }
    // Over max_tensors (3 items each).
    let two = Limits {
        max_tensors: 2,
        ..lim()
    };
    for frame in [FUSED_RECV, PULL, RESPONSE] {
        rejects_with(frame, &two, Error::BadCount);
    }
    let one = Limits {
        max_tensors: 1,
        ..lim()
    };
    rejects_with(PUSH, &one, Error::BadCount);
    let three = Limits {
        max_tensors: 3,
        ..lim()
    };
    assert!(try_parse_with(FUSED_RECV, &three).is_ok());
    assert!(try_parse_with(RESPONSE, &three).is_ok());
    rejects(&c(RESPONSE_EMPTY, 65_537), Error::BadCount);
}

#[test]
fn reject_count_not_matching_items() {
    // More items announced than present, or fewer: the meta section does not match.
    rejects(
        &patch(FUSED_RECV, |v| set32(v, H_COUNT, 4)),
        Error::BadMetaLen,
    );
    rejects(
        &patch(FUSED_RECV, |v| set32(v, H_COUNT, 2)),
        Error::BadMetaLen,
    );
    rejects(&patch(PULL, |v| set32(v, H_COUNT, 2)), Error::BadMetaLen);
    rejects(&patch(PULL, |v| set32(v, H_COUNT, 4)), Error::BadMetaLen);
    rejects(&patch(PUSH, |v| set32(v, H_COUNT, 1)), Error::BadMetaLen);
    rejects(&patch(PUSH, |v| set32(v, H_COUNT, 3)), Error::BadMetaLen);
    rejects(
        &patch(RESPONSE, |v| set32(v, H_COUNT, 2)),
        Error::BadMetaLen,
    );
    rejects(
        &patch(RESPONSE, |v| set32(v, H_COUNT, 4)),
        Error::BadMetaLen,
    );
}

// ---------------------------------------------------------------------------------------
// meta_len / payload_len per kind (section 3, 4.x).
// ---------------------------------------------------------------------------------------

#[test]
fn reject_section_lengths_fixed_by_kind() {
    // PING and PONG: empty meta.
    rejects(&with_meta(PING, &[0]), Error::BadMetaLen);
    rejects(&with_meta(PONG, &[0]), Error::BadMetaLen);
    // CHUNK: meta_len 16.
    rejects(&with_meta(CHUNK, &meta_of(CHUNK)[..15]), Error::BadMetaLen);
    rejects(
        &with_meta(CHUNK, &[meta_of(CHUNK), &[0]].concat()),
        Error::BadMetaLen,
    );
    // Empty payload on HELLO, HELLO_ACK, RECV, FUSED_RECV, PULL, ERROR.
    for frame in [
        HELLO, HELLO_ACK, RECV, FUSED_RECV, PULL, ERROR_CONN, ERROR_REQ,
    ] {
        rejects(&with_payload(frame, &[0]), Error::BadPayloadLen);
    }
    // CHUNK payload >= 1.
    rejects(&with_payload(CHUNK, &[]), Error::BadPayloadLen);
    assert!(try_parse(&with_payload(CHUNK, &[9])).is_ok());
}

#[test]
fn reject_hello_meta_len() {
    let m = meta_of(HELLO);
    rejects(&with_meta(HELLO, &m[..m.len() - 1]), Error::BadMetaLen);
    rejects(&with_meta(HELLO, &[m, &[0]].concat()), Error::BadMetaLen);
    rejects(&with_meta(HELLO, &m[..19]), Error::BadMetaLen);
    rejects(&with_meta(HELLO, &[]), Error::BadMetaLen);
    // token_len larger than what is there.
    rejects(&patch(HELLO, |v| v[M + 17] = 5), Error::BadMetaLen);
}

#[test]
fn reject_recv_meta_len() {
    let m = meta_of(RECV);
    // Short: the key runs past the end.
    rejects(&with_meta(RECV, &m[..m.len() - 1]), Error::BadMetaLen);
    // Long: trailing byte.
    rejects(&with_meta(RECV, &[m, &[0]].concat()), Error::BadMetaLen);
    // Shorter than step_id, or no key at all.
    rejects(&with_meta(RECV, &m[..7]), Error::BadMetaLen);
    rejects(&with_meta(RECV, &m[..8]), Error::BadMetaLen);
    rejects(&with_meta(RECV, &m[..9]), Error::BadMetaLen);
    // key_len running past the end of the section.
    rejects(&patch(RECV, |v| set16(v, M + 8, 4)), Error::BadMetaLen);
    rejects(
        &patch(FUSED_RECV, |v| set16(v, M + 11, 0xff)),
        Error::BadMetaLen,
    );
    // key_len shorter than the bytes present: leftover bytes.
    rejects(&patch(RECV, |v| set16(v, M + 8, 2)), Error::BadMetaLen);
}

#[test]
fn reject_pull_meta_len() {
    let m = meta_of(PULL);
    rejects(&with_meta(PULL, &m[..23]), Error::BadMetaLen);
    rejects(&with_meta(PULL, &[m, &[0]].concat()), Error::BadMetaLen);
    rejects(&with_meta(PULL, &[]), Error::BadMetaLen);
}

#[test]
fn reject_push_and_response_meta_len() {
    for frame in [PUSH, PUSH_CHUNKED, RESPONSE, RESPONSE_CHUNKED] {
        let m = meta_of(frame);
        rejects(&with_meta(frame, &m[..m.len() - 1]), Error::BadMetaLen);
        rejects(&with_meta(frame, &m[..m.len() - 8]), Error::BadMetaLen);
        rejects(&with_meta(frame, &[m, &[0]].concat()), Error::BadMetaLen);
        rejects(&with_meta(frame, &[m, &[0; 8]].concat()), Error::BadMetaLen);
    }
    // A rank that makes the tensor meta run past the section.
    rejects(&patch(PUSH, |v| v[M + 49] = 1), Error::BadMetaLen);
    rejects(&patch(RESPONSE, |v| v[M + 9] = 4), Error::BadMetaLen);
    // An entry flag that announces a tensor meta that is not there.
    rejects(&patch(RESPONSE, |v| set16(v, M + 46, 1)), Error::BadMetaLen);
    // Response with count 0 and a nonempty meta.
    rejects(&with_meta(RESPONSE_EMPTY, &[0; 8]), Error::BadMetaLen);
}

#[test]
fn reject_error_meta_len_and_message() {
    let m = meta_of(ERROR_CONN);
    rejects(&with_meta(ERROR_CONN, &m[..m.len() - 1]), Error::BadMetaLen);
    rejects(
        &with_meta(ERROR_CONN, &[m, &[0]].concat()),
        Error::BadMetaLen,
    );
    rejects(&with_meta(ERROR_CONN, &m[..1]), Error::BadMetaLen);
    rejects(&with_meta(ERROR_CONN, &[]), Error::BadMetaLen);
    // Message of 1024 bytes is fine, 1025 is not.
    let mut ok = 1024u16.to_le_bytes().to_vec();
    ok.extend_from_slice(&[b'x'; 1024]);
    assert!(try_parse(&with_meta(ERROR_CONN, &ok)).is_ok());
    let mut long = 1025u16.to_le_bytes().to_vec();
    long.extend_from_slice(&[b'x'; 1025]);
    rejects(&with_meta(ERROR_CONN, &long), Error::BadString);
    // An empty message is fine.
    assert!(try_parse(&with_meta(ERROR_CONN, &[0, 0])).is_ok());
    // ErrorRepr::new cuts to 1024.
    assert_eq!(ErrorRepr::new(&[b'y'; 2000]).message.len(), 1024);
}

#[test]
fn body_parse_rejects_meta_slice_of_wrong_length() {
    let (h, _, _) = parse_ok(FUSED_RECV);
    let meta = meta_of(FUSED_RECV);
    for n in 0..meta.len() {
        assert_eq!(Body::parse(&h, &meta[..n], &lim()), Err(Error::Truncated));
    }
    let longer = [meta, &[0]].concat();
    assert_eq!(Body::parse(&h, &longer, &lim()), Err(Error::BadMetaLen));
}

// ---------------------------------------------------------------------------------------
// Keys (4.2).
// ---------------------------------------------------------------------------------------

#[test]
fn reject_bad_keys() {
    // Empty key.
    let mut m = 9u64.to_le_bytes().to_vec();
    m.extend_from_slice(&[0, 0]);
    rejects(&with_meta(RECV, &m), Error::BadKey);
    // Empty key in the middle of a fused recv (count 3: "a", "", "ccc" + filler).
    let mut m = meta_of(FUSED_RECV)[..11].to_vec();
    m.extend_from_slice(&[0, 0, 3, 0, b'c', b'c', b'c']);
    rejects(&with_meta(FUSED_RECV, &m), Error::BadKey);
    // Over max_key.
    let two = Limits {
        max_key: 2,
        ..lim()
    };
    rejects_with(FUSED_RECV, &two, Error::BadKey);
    rejects_with(RECV, &two, Error::BadKey);
    let three = Limits {
        max_key: 3,
        ..lim()
    };
    assert!(try_parse_with(FUSED_RECV, &three).is_ok());
    // Default max_key is 4096: 4096 ok, 4097 rejected.
    for (len, ok) in [(4096usize, true), (4097, false)] {
        let mut m = 1u64.to_le_bytes().to_vec();
        m.extend_from_slice(&(len as u16).to_le_bytes());
        m.extend(std::iter::repeat(b'k').take(len));
        let f = with_meta(RECV, &m);
        assert_eq!(try_parse(&f).is_ok(), ok, "{len}");
        if !ok {
            rejects(&f, Error::BadKey);
        }
    }
}

// ---------------------------------------------------------------------------------------
// Tensor meta (4.7).
// ---------------------------------------------------------------------------------------

#[test]
fn reject_rank_over_max_rank() {
    let one = Limits {
        max_rank: 1,
        ..lim()
    };
    rejects_with(PUSH, &one, Error::RankTooLarge);
    let two = Limits {
        max_rank: 2,
        ..lim()
    };
    assert!(try_parse_with(PUSH, &two).is_ok());
    // Rank 17 with the default 16; rank 33 and 255 over the hard maximum, even though the
    // dims would not fit.
    rejects(&push1(&tmeta(2, 0, 1, &[1; 17]), 1), Error::RankTooLarge);
    assert!(try_parse(&push1(&tmeta(2, 0, 1, &[1; 16]), 1)).is_ok());
    for rank in [33u8, 255] {
        let f = patch(PUSH, |v| v[M + 9] = rank);
        rejects(&f, Error::RankTooLarge);
    }
    // In a response too.
    let zero = Limits {
        max_rank: 0,
        ..lim()
    };
    rejects_with(RESPONSE, &zero, Error::RankTooLarge);
}

#[test]
fn reject_bad_dim() {
    let big = 1u64 << 63;
    rejects(&patch(PUSH, |v| set64(v, M + 24, big)), Error::BadDim);
    rejects(&patch(PUSH, |v| set64(v, M + 32, u64::MAX)), Error::BadDim);
    rejects(&patch(RESPONSE, |v| set64(v, M + 24, big)), Error::BadDim);
    // 2^63 - 1 is a legal dimension; this one then fails the byte_len/limit checks instead.
    let max_dim = push1(&tmeta(2, 0, i64::MAX as u64, &[i64::MAX as u64]), 0);
    let unlimited = Limits {
        max_tensor_bytes: i64::MAX as u64,
        ..lim()
    };
    rejects_with(&max_dim, &unlimited, Error::BadPayloadLen);
    rejects(&max_dim, Error::TensorTooLarge);
}

#[test]
fn reject_unknown_dtype() {
    for d in [0u8, 16, 255] {
        rejects(&patch(PUSH, |v| v[M + 8] = d), Error::UnknownDType(d));
        rejects(&patch(RESPONSE, |v| v[M + 8] = d), Error::UnknownDType(d));
        // A dead tensor needs a known dtype too.
        rejects(&patch(PUSH, |v| v[M + 48] = d), Error::UnknownDType(d));
    }
}

#[test]
fn reject_byte_len_mismatch_and_overflow() {
    rejects(
        &patch(PUSH, |v| set64(v, M + 16, 23)),
        Error::ByteLenMismatch,
    );
    rejects(
        &patch(PUSH, |v| set64(v, M + 16, 25)),
        Error::ByteLenMismatch,
    );
    rejects(
        &patch(PUSH, |v| set64(v, M + 16, 0)),
        Error::ByteLenMismatch,
    );
    rejects(&patch(PUSH, |v| v[M + 8] = 13), Error::ByteLenMismatch); // f64 [2,3] != 24
    rejects(
        &patch(RESPONSE, |v| set64(v, M + 16, 4)),
        Error::ByteLenMismatch,
    );
    // Product of the dims overflows u64.
    let over = tmeta(2, 0, 0, &[1 << 62, 8]);
    rejects(&push1(&over, 0), Error::ByteLenMismatch);
    // Product fits, times the element size overflows.
    let over = tmeta(13, 0, 0, &[1 << 61, 2]);
    rejects(&push1(&over, 0), Error::ByteLenMismatch);
    // Shape with a zero dimension: zero bytes.
    assert!(try_parse(&push1(&tmeta(10, 0, 0, &[5, 0, 7]), 0)).is_ok());
}

#[test]
fn reject_tensor_over_max_tensor_bytes() {
    let limits = Limits {
        max_tensor_bytes: 23,
        ..lim()
    };
    rejects_with(PUSH, &limits, Error::TensorTooLarge);
    let limits = Limits {
        max_tensor_bytes: 24,
        ..lim()
    };
    assert!(try_parse_with(PUSH, &limits).is_ok());
    // A chunked tensor counts in full (byte_len 8_000_000).
    let limits = Limits {
        max_tensor_bytes: 7_999_999,
        ..lim()
    };
    rejects_with(PUSH_CHUNKED, &limits, Error::TensorTooLarge);
    let limits = Limits {
        max_tensor_bytes: 7,
        ..lim()
    };
    rejects_with(RESPONSE, &limits, Error::TensorTooLarge);
}

#[test]
fn reject_bad_dead_tensors() {
    // Dead with byte_len.
    rejects(&push1(&tmeta(10, 1, 4, &[]), 4), Error::BadDeadTensor);
    rejects(&patch(PUSH, |v| set64(v, M + 56, 4)), Error::BadDeadTensor);
    // Dead with a rank (even a zero-sized shape).
    rejects(&push1(&tmeta(10, 1, 0, &[0]), 0), Error::BadDeadTensor);
    rejects(&push1(&tmeta(10, 1, 4, &[1]), 4), Error::BadDeadTensor);
    // Dead and chunked.
    rejects(&push1(&tmeta(10, 3, 0, &[]), 0), Error::BadDeadTensor);
    rejects(&patch(PUSH, |v| v[M + 50] = 3), Error::BadDeadTensor);
    // Dead in a response.
    let mut m = vec![0, 0, 0, 0, 0, 0, 1, 0];
    m.extend_from_slice(&tmeta(10, 1, 0, &[]));
    let f = patch(&with_payload(&with_meta(RESPONSE, &m), &[]), |v| {
        set32(v, H_COUNT, 1)
    });
    assert!(try_parse(&f).is_ok());
    m[8 + 8] = 1; // byte_len 1
    let f = patch(&with_payload(&with_meta(RESPONSE, &m), &[]), |v| {
        set32(v, H_COUNT, 1)
    });
    rejects(&f, Error::BadDeadTensor);
}

#[test]
fn reject_bad_chunked() {
    // CHUNKED with byte_len 0 (a zero-sized shape).
    rejects(&push1(&tmeta(10, 2, 0, &[0]), 0), Error::BadChunked);
    // Several CHUNKED entries in one frame are allowed (their chunks follow in entry
    // order, specification 4.8): in a PUSH ...
    let two = patch(PUSH_CHUNKED, |v| {
        v[M + 10] = 2;
        set32(v, H_PAYLOAD_LEN, 0);
        v.truncate(v.len() - 4);
    });
    assert!(try_parse_with(&two, &lim()).is_ok());
    // ... and in a RESPONSE.
    let m = meta_of(RESPONSE_CHUNKED);
    let mut second = m.to_vec();
    second[0] = 3;
    let f = patch(&with_meta(RESPONSE_CHUNKED, &[m, &second].concat()), |v| {
        set32(v, H_COUNT, 2)
    });
    assert!(try_parse_with(&f, &lim()).is_ok());
}

#[test]
fn reject_tensor_flags_and_reserved() {
    for bit in 2..16 {
        let flags = 1u16 << bit;
        rejects(&patch(PUSH, |v| set16(v, M + 10, flags)), Error::BadFlags);
        rejects(
            &patch(RESPONSE, |v| set16(v, M + 10, flags)),
            Error::BadFlags,
        );
    }
    for at in 12..16 {
        rejects(&patch(PUSH, |v| v[M + at] = 1), Error::ReservedNotZero);
        rejects(&patch(PUSH, |v| v[M + 40 + at] = 1), Error::ReservedNotZero);
    }
}

#[test]
fn tensor_meta_parse_direct() {
    let m = tmeta(10, 0, 24, &[2, 3]);
    let (t, len) = TensorMeta::parse(&m, &lim()).unwrap();
    assert_eq!(len, 32);
    assert_eq!(t, TensorMeta::new(DType::F32, &[2, 3]).unwrap());
    for n in 0..m.len() {
        assert_eq!(
            TensorMeta::parse(&m[..n], &lim()),
            Err(Error::Truncated),
            "{n}"
        );
        assert_eq!(
            TensorMetaView::new_checked(&m[..n]).err(),
            Some(Error::Truncated)
        );
    }
    let v = TensorMetaView::new_checked(&m[..]).unwrap();
    assert_eq!(
        (v.dtype(), v.rank(), v.flags(), v.reserved()),
        (DType::F32, 2, 0, 0)
    );
    assert_eq!(
        (v.byte_len(), v.dim(0), v.dim(1), v.dim(2)),
        (24, Some(2), Some(3), None)
    );
    assert_eq!(v.total_len(), 32);
    let mut out = [0xAA; 32];
    t.emit(&mut out);
    assert_eq!(out[..], m[..]);
}

// ---------------------------------------------------------------------------------------
// Payload (4.7).
// ---------------------------------------------------------------------------------------

#[test]
fn reject_payload_len_mismatch() {
    for frame in [PUSH, PUSH_CHUNKED, RESPONSE] {
        let p = payload_of(frame);
        rejects(
            &with_payload(frame, &p[..p.len() - 1]),
            Error::BadPayloadLen,
        );
        rejects(
            &with_payload(frame, &[p, &[0]].concat()),
            Error::BadPayloadLen,
        );
        rejects(&with_payload(frame, &[]), Error::BadPayloadLen);
    }
    // Dead and chunked tensors contribute nothing.
    for frame in [RESPONSE_CHUNKED, RESPONSE_EMPTY] {
        rejects(&with_payload(frame, &[0]), Error::BadPayloadLen);
    }
    // A chunked tensor's bytes are not in the declaring frame.
    let with_chunked_bytes = with_payload(PUSH_CHUNKED, &[0; 12]);
    rejects(&with_chunked_bytes, Error::BadPayloadLen);
}

// ---------------------------------------------------------------------------------------
// Response entries (4.5).
// ---------------------------------------------------------------------------------------

#[test]
fn reject_bad_response_entries() {
    // HAS_TENSOR with a nonzero status.
    for s in [1u16, 8, 999] {
        rejects(&patch(RESPONSE, |v| set16(v, M + 4, s)), Error::BadEntry);
    }
    // Undefined entry flags, with and without HAS_TENSOR.
    for bit in 1..16 {
        let flag = 1u16 << bit;
        rejects(
            &patch(RESPONSE, |v| set16(v, M + 6, 1 | flag)),
            Error::BadFlags,
        );
        rejects(
            &patch(RESPONSE, |v| set16(v, M + 38, flag)),
            Error::BadFlags,
        );
        rejects(
            &patch(RESPONSE, |v| set16(v, M + 46, flag)),
            Error::BadFlags,
        );
    }
    // A nonzero status without a tensor is fine at the wire level.
    assert!(try_parse(&patch(RESPONSE, |v| set16(v, M + 44, 6))).is_ok());
}

// ---------------------------------------------------------------------------------------
// Hello (4.1).
// ---------------------------------------------------------------------------------------

fn hello_with(job: &[u8], token: &[u8], max_frame: u32, ack: bool) -> Vec<u8> {
    let base = if ack { HELLO_ACK } else { HELLO };
    let mut m = meta_of(base)[..20].to_vec();
    set32(&mut m, 12, max_frame);
    m[16] = job.len() as u8;
    m[17] = token.len() as u8;
    m.extend_from_slice(job);
    m.extend_from_slice(token);
    with_meta(base, &m)
}

#[test]
fn reject_bad_hello() {
    let mf = 1 << 20;
    assert!(try_parse(&hello_with(b"a", b"", mf, false)).is_ok());
    assert!(try_parse(&hello_with(&[b'z'; 64], &[0xff; 64], mf, false)).is_ok());
    assert!(try_parse(&hello_with(b"Az09_-", b"", mf, true)).is_ok());
    // Job name empty, too long, bad characters.
    for ack in [false, true] {
        rejects(&hello_with(b"", b"", mf, ack), Error::BadString);
        rejects(&hello_with(&[b'a'; 65], b"", mf, ack), Error::BadString);
        for bad in [b'.', b' ', b'/', b':', 0, 0x80, 0xff] {
            rejects(&hello_with(&[b'a', bad], b"", mf, ack), Error::BadString);
        }
    }
    // Token too long.
    rejects(&hello_with(b"w", &[1; 65], mf, false), Error::BadString);
    // Token in HELLO_ACK.
    rejects(&hello_with(b"ps", b"t", mf, true), Error::BadString);
    // max_frame below 65536.
    for ack in [false, true] {
        rejects(&hello_with(b"w", b"", 65_535, ack), Error::BadMaxFrame);
        rejects(&hello_with(b"w", b"", 0, ack), Error::BadMaxFrame);
        assert!(try_parse(&hello_with(b"w", b"", 65_536, ack)).is_ok());
    }
    // Reserved.
    rejects(&patch(HELLO, |v| v[M + 18] = 1), Error::ReservedNotZero);
    rejects(&patch(HELLO_ACK, |v| v[M + 19] = 1), Error::ReservedNotZero);
    // HelloRepr::check agrees.
    let r = HelloRepr {
        cluster_id: 1,
        task_index: 0,
        max_frame: 65_535,
        job: b"w",
        token: b"",
    };
    assert_eq!(r.check(), Err(Error::BadMaxFrame));
    assert_eq!(HelloRepr { job: b"", ..r }.check(), Err(Error::BadString));
}

// ---------------------------------------------------------------------------------------
// Chunk (4.8).
// ---------------------------------------------------------------------------------------

#[test]
fn reject_bad_chunk() {
    for at in 4..8 {
        rejects(&patch(CHUNK, |v| v[M + at] = 1), Error::ReservedNotZero);
    }
    rejects(&with_payload(CHUNK, &[]), Error::BadPayloadLen);
}

// ---------------------------------------------------------------------------------------
// Truncation.
// ---------------------------------------------------------------------------------------

#[test]
fn every_header_prefix_is_truncated() {
    for (name, frame) in ALL {
        for n in 0..HEADER_LEN {
            let prefix = &frame[..n];
            assert_eq!(
                Header::new_checked(prefix).err(),
                Some(Error::Truncated),
                "{name} {n}"
            );
            let view = Header::new_unchecked(prefix);
            assert_eq!(view.check_len(), Err(Error::Truncated));
            assert_eq!(
                HeaderRepr::parse(&view, &lim()),
                Err(Error::Truncated),
                "{name} {n}"
            );
            assert_eq!(
                try_parse(prefix).unwrap_err(),
                Error::Truncated,
                "{name} {n}"
            );
        }
        // Any shorter prefix of the whole frame is rejected (the frame is incomplete).
        for n in HEADER_LEN..frame.len() {
            assert!(try_parse(&frame[..n]).is_err(), "{name} {n}");
        }
    }
}

// ---------------------------------------------------------------------------------------
// Mutation loop: parsing never panics; whatever is accepted re-emits byte for byte.
// ---------------------------------------------------------------------------------------

struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Parses like a receiver would, touching every accessor; returns whether it was accepted.
fn exercise(frame: &[u8], limits: &Limits) -> bool {
    let view = Header::new_unchecked(frame);
    if view.check_len().is_ok() {
        let _ = (
            view.magic(),
            view.version(),
            view.kind(),
            view.flags(),
            view.status(),
        );
        let _ = (
            view.count(),
            view.handle(),
            view.meta_len(),
            view.payload_len(),
        );
    }
    let Ok(header) = HeaderRepr::parse(&view, limits) else {
        return false;
    };
    // Feed Body::parse whatever meta bytes there are, even a short slice.
    let end = (HEADER_LEN + header.meta_len as usize).min(frame.len());
    let meta = &frame[HEADER_LEN..end];
    let Ok(body) = Body::parse(&header, meta, limits) else {
        return false;
    };
    match body {
        Body::Recv(r) | Body::FusedRecv(r) => assert_eq!(r.keys.count(), header.count as usize),
        Body::Pull(ids) => assert_eq!(ids.iter().count(), header.count as usize),
        Body::Push(e) => assert_eq!(e.count(), header.count as usize),
        Body::Response(e) => assert_eq!(e.count(), header.count as usize),
        _ => {}
    }
    let mut inline = 0u64;
    for t in body.tensors() {
        let _ = t.meta.dims.iter().count();
        if t.meta.is_inline() {
            inline += t.meta.byte_len;
        }
    }
    if matches!(header.kind, Kind::Push | Kind::Response) {
        assert_eq!(inline, header.payload_len as u64);
    }
    // Accepted encodings are canonical: the emit code reproduces them exactly.
    let again = emit_frame(
        &header,
        meta.len(),
        |b| b.copy_from_slice(&emit_body(&body)),
        &[],
    );
    assert_eq!(
        &again[..HEADER_LEN + meta.len()],
        &frame[..HEADER_LEN + meta.len()]
    );
    true
}

#[test]
fn mutations_never_panic() {
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    let tight = Limits {
        max_frame: 65_536,
        max_key: 2,
        max_tensors: 2,
        max_rank: 1,
        max_tensor_bytes: 16,
    };
    let mut accepted = 0usize;
    let mut total = 0usize;
    for (_, frame) in ALL {
        for _ in 0..4000 {
            let mut f = frame.to_vec();
            let ops = 1 + rng.below(3);
            for _ in 0..ops {
                match rng.below(6) {
                    0 if !f.is_empty() => {
                        let at = rng.below(f.len());
                        f[at] ^= 1 << rng.below(8);
                    }
                    1 if !f.is_empty() => {
                        let at = rng.below(f.len());
                        f[at] = rng.next() as u8;
                    }
                    2 => {
                        let n = rng.below(f.len() + 1);
                        f.truncate(n);
                    }
                    3 => {
                        for _ in 0..rng.below(40) {
                            f.push(rng.next() as u8);
                        }
                    }
                    4 if f.len() >= 4 => {
                        // A length-like field set to an edge value.
                        let at = rng.below(f.len() - 3);
                        let vals = [0, 1, 2, 0xff, 0xffff, u32::MAX, u32::MAX / 2, 0x8000_0000];
                        f[at..at + 4].copy_from_slice(&vals[rng.below(vals.len())].to_le_bytes());
                    }
                    _ if f.len() > 1 => {
                        let at = rng.below(f.len());
                        f.remove(at);
                    }
                    _ => {}
                }
            }
            total += 1;
            if exercise(&f, &lim()) {
                accepted += 1;
            }
            exercise(&f, &tight);
        }
    }
    // Sanity: the loop did not reject everything (e.g. a broken harness).
    assert!(accepted > 0 && accepted < total, "{accepted}/{total}");
}

#[test]
fn zero_dimension_means_zero_elements_whatever_the_order() {
    let big = 1u64 << 62;
    for dims in [[big, 8, 0], [0, big, 8], [big, 0, 8]] {
        let meta = TensorMeta::new(DType::U8, &dims).expect("0 elements, no overflow");
        assert_eq!(meta.byte_len, 0);
        assert_eq!(meta.check(&lim()), Ok(()));
    }
    assert!(TensorMeta::new(DType::U8, &[big, 8]).is_none());
}

#[test]
fn error_message_is_cut_on_a_character_boundary() {
    let msg = "é".repeat(600); // 1200 bytes of two-byte characters
    let repr = ErrorRepr::new(msg.as_bytes());
    assert_eq!(repr.message.len(), 1024);
    assert!(std::str::from_utf8(repr.message).is_ok());
    let msg = format!("a{}", "é".repeat(600)); // boundary falls inside a character
    let repr = ErrorRepr::new(msg.as_bytes());
    assert_eq!(repr.message.len(), 1023);
    assert!(std::str::from_utf8(repr.message).is_ok());
}
