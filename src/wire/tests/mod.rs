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

/// 4.1 `HELLO`: cluster 0x0123456789abcdef, task 2, job "worker", token "s3cr"; limits:
/// max_frame 16 MiB, max_rank 16, max_key 4,096, max_tensors 65,536, max_tables 1,024,
/// max_rows 2^20, max_row_bytes 2^20, max_tensor_bytes 4 GiB.
#[rustfmt::skip]
const HELLO: &[u8] = &[
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
    0x00, 0x00,                                     // reserved
    0x00, 0x00, 0x01, 0x00,                         // max_tensors 65536
    0x00, 0x04, 0x00, 0x00,                         // max_tables 1024
    0x00, 0x00, 0x10, 0x00,                         // max_rows 2^20
    0x00, 0x00, 0x10, 0x00,                         // max_row_bytes 2^20
    0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, // max_tensor_bytes 2^32
    0x77, 0x6f, 0x72, 0x6b, 0x65, 0x72,             // job "worker"
    0x73, 0x33, 0x63, 0x72,                         // token "s3cr"
];

/// 4.1 `HELLO_ACK`: same cluster, task 0, job "ps", no token; every limit at its minimum:
/// max_frame 65,536, max_rank 0, max_key 1, max_tensors 1, max_tables 1, max_rows 1,
/// max_row_bytes 1, max_tensor_bytes 0.
#[rustfmt::skip]
const HELLO_ACK: &[u8] = &[
    0x53, 0x57, 0x52, 0x45, 0x02,
    0x02,                                           // kind HELLO_ACK
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00,             // flags, status, reserved
    0x00, 0x00, 0x00, 0x00,                         // count 0
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // handle 0
    0x32, 0x00, 0x00, 0x00,                         // meta_len 50 = 48 + 2
    0x00, 0x00, 0x00, 0x00,                         // payload_len 0
    0xef, 0xcd, 0xab, 0x89, 0x67, 0x45, 0x23, 0x01, // cluster_id
    0x00, 0x00, 0x00, 0x00,                         // task_index 0
    0x00, 0x00, 0x01, 0x00,                         // max_frame 65536
    0x02, 0x00,                                     // job_len 2, token_len 0
    0x00, 0x00,                                     // max_rank 0, reserved
    0x01, 0x00, 0x00, 0x00,                         // max_key 1, reserved
    0x01, 0x00, 0x00, 0x00,                         // max_tensors 1
    0x01, 0x00, 0x00, 0x00,                         // max_tables 1
    0x01, 0x00, 0x00, 0x00,                         // max_rows 1
    0x01, 0x00, 0x00, 0x00,                         // max_row_bytes 1
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // max_tensor_bytes 0
    0x70, 0x73,                                     // job "ps"
];

/// Section 7, verbatim: `PING`, handle 0x0000000100000003, payload `de ad be ef`.
#[rustfmt::skip]
const PING: &[u8] = &[
    0x53, 0x57, 0x52, 0x45,  0x02,  0x03,  0x00, 0x00,  0x00, 0x00,  0x00, 0x00,  0x00, 0x00, 0x00, 0x00,
    0x03, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00,   0x00, 0x00, 0x00, 0x00,   0x04, 0x00, 0x00, 0x00,
    0xde, 0xad, 0xbe, 0xef,
];

/// Section 7, verbatim: the `PONG` with `END`.
#[rustfmt::skip]
const PONG: &[u8] = &[
    0x53, 0x57, 0x52, 0x45,  0x02,  0x04,  0x01, 0x00,  0x00, 0x00,  0x00, 0x00,  0x00, 0x00, 0x00, 0x00,
    0x03, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00,   0x00, 0x00, 0x00, 0x00,   0x04, 0x00, 0x00, 0x00,
    0xde, 0xad, 0xbe, 0xef,
];

/// 4.2 `RECV`: handle 0x0000000100000004, step 42, key "w:0".
#[rustfmt::skip]
const RECV: &[u8] = &[
    0x53, 0x57, 0x52, 0x45, 0x02,
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
    0x53, 0x57, 0x52, 0x45, 0x02,
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
    0x53, 0x57, 0x52, 0x45, 0x02,
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
    0x53, 0x57, 0x52, 0x45, 0x02,
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
    0x53, 0x57, 0x52, 0x45, 0x02,
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
    0x53, 0x57, 0x52, 0x45, 0x02,
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
    0x53, 0x57, 0x52, 0x45, 0x02, 0x09, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x05, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
];

/// 4.5 + 4.8 `RESPONSE` without `END` declaring one chunked u8 [100000] tensor for item 2:
/// handle 0x0000000200000001.
#[rustfmt::skip]
const RESPONSE_CHUNKED: &[u8] = &[
    0x53, 0x57, 0x52, 0x45, 0x02,
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
    0x53, 0x57, 0x52, 0x45, 0x02,
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
    0x53, 0x57, 0x52, 0x45, 0x02,
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
    0x53, 0x57, 0x52, 0x45, 0x02,
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

/// 4.10 `CANCEL` of items 2 and 5 of the request 0x0000000200000001.
#[rustfmt::skip]
const CANCEL: &[u8] = &[
    0x53, 0x57, 0x52, 0x45, 0x02,
    0x0e,                                           // kind CANCEL
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00,             // flags, status, reserved
    0x02, 0x00, 0x00, 0x00,                         // count 2
    0x01, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, // handle
    0x08, 0x00, 0x00, 0x00,                         // meta_len 8
    0x00, 0x00, 0x00, 0x00,                         // payload_len 0
    0x02, 0x00, 0x00, 0x00,                         // item 2
    0x05, 0x00, 0x00, 0x00,                         // item 5
];

/// 4.10 `CANCEL` of the whole request 0x0000000100000004.
#[rustfmt::skip]
const CANCEL_ALL: &[u8] = &[
    0x53, 0x57, 0x52, 0x45, 0x02,
    0x0e,                                           // kind CANCEL
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00,                         // count 0
    0x04, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, // handle
    0x00, 0x00, 0x00, 0x00,                         // meta_len 0
    0x00, 0x00, 0x00, 0x00,
];

/// 2.1 the `RECV` above with a deadline: `timeout_ms` 1500 (0x5dc) in bytes 8-11.
#[rustfmt::skip]
const RECV_TIMEOUT: &[u8] = &[
    0x53, 0x57, 0x52, 0x45, 0x02,
    0x05,                                           // kind RECV
    0x00, 0x00,                                     // flags
    0xdc, 0x05, 0x00, 0x00,                         // timeout_ms 1500
    0x01, 0x00, 0x00, 0x00,                         // count 1
    0x04, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, // handle
    0x0d, 0x00, 0x00, 0x00,                         // meta_len 13
    0x00, 0x00, 0x00, 0x00,                         // payload_len 0
    0x2a, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // step_id 42
    0x03, 0x00, 0x77, 0x3a, 0x30,                   // key "w:0"
];

/// 4.11 `STATS` request 0x0000000100000005 with `timeout_ms` 2000 (0x7d0).
#[rustfmt::skip]
const STATS: &[u8] = &[
    0x53, 0x57, 0x52, 0x45, 0x02,
    0x0f,                                           // kind STATS
    0x00, 0x00,                                     // flags
    0xd0, 0x07, 0x00, 0x00,                         // timeout_ms 2000
    0x00, 0x00, 0x00, 0x00,                         // count 0
    0x05, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, // handle
    0x00, 0x00, 0x00, 0x00,                         // meta_len 0
    0x00, 0x00, 0x00, 0x00,                         // payload_len 0
];

/// Whether frame bytes are of a request kind (bytes 8-11 are then `timeout_ms`).
fn is_request(frame: &[u8]) -> bool {
    FrameKind::from(frame[H_KIND]).is_request()
}

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
    ("CANCEL", CANCEL),
    ("CANCEL_ALL", CANCEL_ALL),
    ("RECV_TIMEOUT", RECV_TIMEOUT),
    ("STATS", STATS),
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
        Body::Ping | Body::Pong | Body::Stats | Body::Checkpoint => Vec::new(),
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
        Body::PullRows(tables) | Body::PushRows(tables) => tables
            .flat_map(|t| fill(t.buffer_len(), |b| t.emit(b)))
            .collect(),
        Body::Response(entries) => entries
            .flat_map(|e| fill(e.buffer_len(), |b| e.emit(b)))
            .collect(),
        Body::Error(e) => fill(e.buffer_len(), |b| e.emit(b)),
        Body::Chunk(c) => fill(c.buffer_len(), |b| c.emit(b)),
        Body::Cancel(items) => {
            let items: Vec<u32> = items.iter().collect();
            fill(cancel_meta_len(items.len()), |b| emit_cancel_meta(&items, b))
        }
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
    kind: FrameKind,
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
        timeout_ms: 0,
        count,
        handle,
        meta_len,
        payload_len,
    }
}

mod fixtures;
mod rejections;
mod row_formats;
mod row_versions;
mod rows;
