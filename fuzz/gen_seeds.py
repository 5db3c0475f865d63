#!/usr/bin/env python3
"""Writes the seed corpora of the frame_roundtrip, stream_decoder and conn_flow fuzz targets.

Frames are built by hand from docs/wire-format.md (independently of src/), so a seed the
targets reject points at a disagreement between the spec and the code. Run from fuzz/:

    python3 gen_seeds.py

It rewrites corpus/{frame_roundtrip,stream_decoder,conn_flow}/seed_* (files found by
fuzzing, without the seed_ prefix, are left alone).
"""

import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))

# Kinds (spec section 3).
(HELLO, HELLO_ACK, PING, PONG, RECV, FUSED_RECV, PULL, PUSH, RESPONSE, ERROR, CHUNK, PULL_ROWS,
 PUSH_ROWS, CANCEL, STATS, CHECKPOINT) = range(1, 17)
END = 1
DEAD, CHUNKED = 1, 2
ELEM = {1: 1, 2: 1, 3: 1, 4: 2, 5: 2, 6: 2, 7: 2, 8: 4, 9: 4, 10: 4, 11: 8, 12: 8, 13: 8, 14: 8, 15: 16}
F32, U8, I64, C128 = 10, 2, 12, 15


def header(kind, meta, payload=b"", count=0, handle=0, flags=0, status=0,
           magic=b"SWRE", version=2, reserved=0, meta_len=None, payload_len=None):
    """Header (2.1) followed by the meta and payload sections."""
    meta_len = len(meta) if meta_len is None else meta_len
    payload_len = len(payload) if payload_len is None else payload_len
    h = magic + struct.pack("<BBHHHIQII", version, kind, flags, status, reserved, count,
                            handle, meta_len, payload_len)
    assert len(h) == 32
    return h + meta + payload


def hello_body(cluster_id, task_index, max_frame, job, token=b""):
    """Hello body (4.1): the limits of section 6 at their defaults but max_frame."""
    return struct.pack("<QIIBBBBHHIIIIQ", cluster_id, task_index, max_frame, len(job), len(token),
                       16, 0, 4096, 0, 65536, 1024, 1 << 20, 1 << 20, 4 << 30) + job + token


def tensor_meta(dtype, dims, dead=False, chunked=False, byte_len=None):
    if byte_len is None:
        byte_len = 0 if dead else ELEM[dtype]
        for d in dims:
            byte_len *= d
    flags = (DEAD if dead else 0) | (CHUNKED if chunked else 0)
    return struct.pack("<BBHIQ", dtype, len(dims), flags, 0, byte_len) + b"".join(
        struct.pack("<Q", d) for d in dims)


def tbytes(n, seed=1):
    return bytes((seed * 7 + i * 13) & 0xFF for i in range(n))


def hello(ack=False, token=b"secret"):
    body = hello_body(0xC1A5_7E12, 3, 16 << 20, b"worker_0-a", b"" if ack else token)
    return header(HELLO_ACK if ack else HELLO, body)


def ping(handle=0x0000000100000003, payload=bytes.fromhex("deadbeef")):
    return header(PING, b"", payload, handle=handle)


def pong(handle=0x0000000100000003, payload=bytes.fromhex("deadbeef")):
    return header(PONG, b"", payload, handle=handle, flags=END)


def recv_body(step, keys):
    return struct.pack("<Q", step) + b"".join(struct.pack("<H", len(k)) + k for k in keys)


def recv(handle=0x100000001, step=42, key=b"/job:worker/replica:0/task:1/cpu:0;edge_7_x;0:0"):
    return header(RECV, recv_body(step, [key]), count=1, handle=handle)


def fused_recv(handle=0x100000002, keys=(b"a", b"edge_1;0:0", b"k" * 300)):
    return header(FUSED_RECV, recv_body(9, keys), count=len(keys), handle=handle)


def pull(handle=0x200000001, ids=(1, 2, 0xFFFF_FFFF_FFFF_FFFF)):
    return header(PULL, b"".join(struct.pack("<Q", i) for i in ids), count=len(ids), handle=handle)


def push(handle, entries):
    """entries: (var_id, meta bytes, inline contents or None)."""
    meta = b"".join(struct.pack("<Q", v) + m for v, m, _ in entries)
    payload = b"".join(c for _, _, c in entries if c)
    return header(PUSH, meta, payload, count=len(entries), handle=handle)


def response(handle, entries, end=True):
    """entries: (index, status, meta bytes or None, inline contents or None)."""
    meta = b"".join(struct.pack("<IHH", i, s, 1 if m is not None else 0) + (m or b"")
                    for i, s, m, _ in entries)
    payload = b"".join(c for _, _, _, c in entries if c)
    return header(RESPONSE, meta, payload, count=len(entries), handle=handle,
                  flags=END if end else 0)


def error(handle, status, message):
    return header(ERROR, struct.pack("<H", len(message)) + message, handle=handle,
                  status=status, flags=END if handle else 0)


def chunk(handle, index, offset, data):
    return header(CHUNK, struct.pack("<IIQ", index, 0, offset), data, count=1, handle=handle)


def rows_tables(tables):
    """Rows table sections (4.9): (table, block meta bytes, ids)."""
    return b"".join(struct.pack("<II", t, 0) + m + b"".join(struct.pack("<Q", i) for i in ids)
                    for t, m, ids in tables)


def pull_rows(handle, tables):
    """tables: (table, dtype, block dims, ids)."""
    meta = rows_tables([(t, tensor_meta(d, dims), ids) for t, d, dims, ids in tables])
    return header(PULL_ROWS, meta, count=len(tables), handle=handle)


def push_rows(handle, tables):
    """tables: (table, block meta bytes, ids, inline contents or None)."""
    meta = rows_tables([(t, m, ids) for t, m, ids, _ in tables])
    payload = b"".join(c for _, _, _, c in tables if c)
    return header(PUSH_ROWS, meta, payload, count=len(tables), handle=handle)


def cancel(handle, items):
    return header(CANCEL, b"".join(struct.pack("<I", i) for i in items), count=len(items),
                  handle=handle)


def stats(handle):
    return header(STATS, b"", handle=handle)


def checkpoint(handle, timeout_ms=0):
    """timeout_ms is bytes 8-11 of a request's header (2.1): status and reserved together."""
    return header(CHECKPOINT, b"", handle=handle, status=timeout_ms & 0xFFFF,
                  reserved=timeout_ms >> 16)


def rows_response(handle):
    """The answer to a PULL_ROWS of an f32 [3, 4] block with row 1 missing, and a refused table."""
    meta = (struct.pack("<IHH", 0, 0, 3) + tensor_meta(F32, [3, 4]) + struct.pack("<II", 1, 1)
            + struct.pack("<IHH", 1, 1, 0))
    return header(RESPONSE, meta, tbytes(48, 8), count=2, handle=handle, flags=END)


H = 0x0000000500000007  # a handle
BF16 = 7


def pull_rows_held(handle, tables):
    """PULL_ROWS with ROW_VERSIONS (4.9): tables (table, dtype, block dims, ids, held
    versions); pull_flags HELD_VERSIONS, the held versions after the ids."""
    meta = b"".join(struct.pack("<II", t, 1) + tensor_meta(d, dims)
                    + b"".join(struct.pack("<Q", i) for i in ids)
                    + b"".join(struct.pack("<Q", v) for v in held)
                    for t, d, dims, ids, held in tables)
    return header(PULL_ROWS, meta, count=len(tables), handle=handle)


def versions_report(n, unchanged, versions):
    """Row-versions report (4.9): n, the bitmap of the unchanged positions, the versions of
    the others."""
    bitmap = bytearray((n + 7) // 8)
    for p in unchanged:
        bitmap[p // 8] |= 1 << (p % 8)
    return struct.pack("<I", n) + bytes(bitmap) + b"".join(struct.pack("<Q", v) for v in versions)


def versioned_response(handle):
    """The answer to a pull of 4 bf16 rows of 4 with held versions: positions 0 and 2
    unchanged, 1 sent (version 0x1001), 3 missing (version 0); then a table where every row
    came unchanged (an empty block)."""
    meta = (struct.pack("<IHH", 0, 0, 7) + tensor_meta(BF16, [2, 4])
            + versions_report(4, [0, 2], [0x1001, 0]) + struct.pack("<II", 1, 3)
            + struct.pack("<IHH", 1, 0, 5) + tensor_meta(BF16, [0, 4])
            + versions_report(9, range(9), []))
    return header(RESPONSE, meta, tbytes(16, 9), count=2, handle=handle, flags=END)


def push_mixed():
    return push(H, [
        (11, tensor_meta(F32, [2, 2]), tbytes(16)),
        (12, tensor_meta(F32, [], dead=True), None),
        (13, tensor_meta(U8, [300], chunked=True), None),
        (14, tensor_meta(I64, []), tbytes(8, 2)),
        (15, tensor_meta(F32, [0, 5]), None),
    ])


def response_mixed(end=True):
    return response(H + 1, [
        (2, 0, tensor_meta(C128, [1, 2]), tbytes(32, 3)),
        (0, 1, None, None),  # NOT_FOUND
        (1, 0, tensor_meta(U8, [100], chunked=True), None),
        (3, 0, tensor_meta(F32, [], dead=True), None),
        (4, 0, None, None),  # push acknowledgement
    ], end)


def timed_recv():
    """A RECV whose header carries timeout_ms 1,500 (bytes 8-11)."""
    return header(RECV, recv_body(42, [b"w:0"]), count=1, handle=0x100000004, status=1500)


def frame_seeds():
    d = b"\x00"  # default limits
    small = b"\x80\x00"  # max_frame 64K, max_key 1, max_rank 0, max_tensors 1, tensor bytes 0
    mid = bytes([0x80 | 1 | 2 << 2 | 2 << 4, 2 | 3 << 2])  # 70000, key 16, rank 4, 3 tensors, 1000 B
    return {
        "hello": d + hello(),
        "hello_ack": d + hello(ack=True),
        "hello_no_token": d + header(HELLO, hello_body(1, 0, 65536, b"ps")),
        "ping": d + ping(),
        "ping_empty": d + ping(payload=b""),
        "pong": d + pong(),
        "recv": d + recv(),
        "fused_recv": d + fused_recv(),
        "pull": d + pull(),
        "push_mixed": d + push_mixed(),
        "response_mixed": d + response_mixed(),
        "response_empty": d + response(H, [], end=True),
        "error_conn": d + error(0, 11, b"malformed frame"),
        "error_request": d + error(H, 1, "n\u00e9ant".encode()),
        "error_not_utf8": d + error(H, 300, b"\xff\xfe bad"),
        "chunk": d + chunk(H, 2, 4096, tbytes(64)),
        "cancel": d + cancel(0x200000001, [2, 5]),
        "cancel_all": d + cancel(0x100000004, []),
        "recv_timeout": d + timed_recv(),
        "stats": d + stats(H),
        "checkpoint": d + checkpoint(H),
        "checkpoint_timeout": d + checkpoint(H, timeout_ms=600_000),
        "pull_rows": d + pull_rows(H, [(1, F32, [3, 4], [5, 6, 5]), (2, U8, [2, 8], [1, 2])]),
        "push_rows": d + push_rows(H, [(1, tensor_meta(F32, [2, 4]), [7, 8], tbytes(32)),
                                       (2, tensor_meta(U8, [1, 300], chunked=True), [9], None)]),
        "response_missing": d + rows_response(H),
        # ROW_VERSIONS (parsed on a connection with every feature).
        "pull_rows_held": d + pull_rows_held(H, [(1, BF16, [3, 4], [5, 6, 5], [0x10, 0, 0x10]),
                                                 (2, F32, [1, 2], [9], [7])]),
        "response_versions": d + versioned_response(H),
        "small_limits_push": small + push(H, [(1, tensor_meta(U8, [], dead=True), None)]),
        "mid_limits_push": mid + push(H, [(1, tensor_meta(F32, [2, 3, 4, 5], chunked=True), None),
                                          (2, tensor_meta(U8, [10]), tbytes(10))]),
        "mid_limits_recv": mid + fused_recv(keys=(b"0123456789abcdef", b"x")),
        # Invalid frames.
        "bad_magic": d + header(PING, b"", b"x", handle=1, magic=b"SWRF"),
        "bad_version": d + header(PING, b"", b"", handle=1, version=1),
        "reserved": d + header(PING, b"", b"", handle=1, reserved=1),
        "push_payload_len": d + header(PUSH, struct.pack("<Q", 1) + tensor_meta(U8, [4]), tbytes(3),
                                       count=1, handle=H),
        "response_tensor_on_error": d + response(H, [(0, 2, tensor_meta(U8, [1]), b"\x01")]),
        "dead_with_shape": d + push(H, [(1, tensor_meta(F32, [1], dead=True, byte_len=0), None)]),
        "byte_len_overflow": d + push(H, [(1, tensor_meta(C128, [1 << 62, 4], byte_len=0), None)]),
        "truncated": d + push_mixed()[:60],
        "checkpoint_with_count": d + header(CHECKPOINT, b"", count=1, handle=H),
        "checkpoint_with_meta": d + header(CHECKPOINT, b"\0\0\0\0", handle=H),
        "checkpoint_no_handle": d + header(CHECKPOINT, b"", handle=0),
    }


def stream_prefix(cfg=0, k=0, pieces=(0, 0, 0, 0)):
    return bytes([cfg, k]) + bytes(pieces)


def chunked_push_and_chunks():
    """A push declaring two chunked tensors, and their chunks with other frames between."""
    chunked_push = push(H, [
        (1, tensor_meta(U8, [10]), tbytes(10)),
        (2, tensor_meta(U8, [300], chunked=True), None),
        (3, tensor_meta(F32, [64], chunked=True), None),
    ])
    t2, t3 = tbytes(300, 5), tbytes(256, 6)
    chunks = (chunk(H, 1, 0, t2[:100]) + ping() + chunk(H, 1, 100, t2[100:])
              + recv() + chunk(H, 2, 0, t3[:1]) + chunk(H, 2, 1, t3[1:]))
    return chunked_push, chunks


def stream_seeds():
    chunked_push, chunks = chunked_push_and_chunks()
    resp = response_mixed(end=False) + chunk(H + 1, 1, 0, tbytes(100, 9)) + response(H + 1, [], True)
    everything = (hello() + hello(ack=True) + ping() + pong() + recv() + fused_recv() + pull()
                  + chunked_push + chunks + resp + stats(H + 2) + checkpoint(H + 3, 1000)
                  + rows_response(H + 4) + error(H, 9, b"no service") + error(0, 5, b""))
    big_meta = fused_recv(keys=tuple(bytes([65 + i % 26]) * 1000 for i in range(5)))
    # Encoder-mode scripts (see the E* helpers below).
    all_ops = (e_config(chunk=2, inline=3, block=1, coalesce=2)
               + e_hello() + e_hello(ack=True) + e_ping(20) + e_pong(9, with_=True)
               + e_recv() + e_fused([1, 7, 40]) + e_pull(3)
               + e_push([t_u8(41), t_dead(), t_large(0x0210), t_scalar(C128)])
               + e_drain(50)
               + e_response([(0, t_f32_2d(3, 7)), (1, None), (0, None), (0, t_u8(200))], end=True)
               + e_ping(0) + e_error(30, status=1) + e_error(1100, status=0, conn=True)
               + e_push([t_zero_size()]) + e_pong(3) + e_stats() + e_checkpoint())
    large = (e_config(chunk=6, inline=3, block=3, coalesce=3)
             + e_push([t_large(0x1170)]) + e_push([t_large(0xffff)]) + e_ping(4)
             + e_drain(70000) + e_response([(0, t_large(40000)), (0, t_large(30000))], end=True))
    tiny_chunks = (e_config(chunk=0, inline=0, block=0, coalesce=0)
                   + e_push([t_u8(6), t_u8(3)]) + e_drain(3) + e_response([(0, t_u8(2))], end=True)
                   + e_drain(100) + e_ping(3) + e_recv())
    interleave = (e_config(chunk=2, inline=2, block=2, coalesce=1)
                  + e_push([t_u8(250), t_f32_2d(4, 40)]) + e_drain(200) + e_ping(5)
                  + e_drain(10) + e_pull(1) + e_response([(0, t_u8(250))], end=False)
                  + e_drain(300) + e_fused([3, 3]) + e_response([(1, None)], end=True))
    return {
        "spec_ping_pong": stream_prefix() + ping() + pong(),
        "everything_whole": stream_prefix(cfg=6, k=0xff, pieces=(0xff, 0xff, 0xff, 0xff)) + everything,
        "everything_bytewise": stream_prefix(cfg=1, k=0x10, pieces=(0, 0, 0, 0)) + everything,
        "everything_mixed": stream_prefix(cfg=4, k=0x35, pieces=(3, 40, 0, 0xc1)) + everything,
        "chunked_push": stream_prefix(cfg=2, k=0x21, pieces=(7, 1, 31, 100)) + chunked_push + chunks,
        "response_chunks": stream_prefix(cfg=5, k=0x44, pieces=(5, 5, 5, 5)) + resp,
        "big_meta_growth": stream_prefix(cfg=1, k=1, pieces=(63, 200, 0xc3, 17)) + ping() + big_meta + pong(),
        "truncated_payload": stream_prefix(cfg=3, k=0x23, pieces=(9, 9, 9, 9)) + chunked_push[:-4],
        "chunk_wrong_offset": stream_prefix(cfg=2) + chunked_push + chunk(H, 1, 1, b"x"),
        "chunk_wrong_handle": stream_prefix(cfg=2) + chunked_push + chunk(H + 1, 1, 0, b"x"),
        "chunk_past_end": stream_prefix(cfg=2) + chunked_push + chunk(H, 1, 0, tbytes(301)),
        "unexpected_chunk": stream_prefix(cfg=2) + ping() + chunk(H, 0, 0, b"x"),
        "too_many_chunked": stream_prefix(cfg=1 << 3) + b"".join(
            push(H, [(1, tensor_meta(U8, [9], chunked=True), None),
                     (2, tensor_meta(U8, [9], chunked=True), None)]) for _ in range(2)),
        "bad_header_after_frames": stream_prefix(cfg=3, k=2, pieces=(1, 2, 3, 4)) + ping() + pull()
            + header(PING, b"", b"", handle=0),
        "version_mismatch": stream_prefix() + ping() + header(PING, b"", b"", handle=1, version=9),
        "frame_too_large": stream_prefix(cfg=1 << 3) + header(PING, b"", b"", handle=1, payload_len=70000),
        "cancel": stream_prefix(cfg=1, k=0x10, pieces=(7, 13, 32, 64)) + cancel(0x200000001, [2, 5]) * 2,
        "cancel_all": stream_prefix(cfg=1, k=0x10, pieces=(7, 13, 32, 64)) + cancel(0x100000004, []) * 2,
        "recv_timeout": stream_prefix(cfg=1, k=0x10, pieces=(7, 13, 32, 64)) + timed_recv() * 2,
        "enc_all_ops": stream_prefix(cfg=0x80 | 1, k=0x33, pieces=(10, 100, 0xc0, 1)) + all_ops,
        "enc_large": stream_prefix(cfg=0xC0 | 7, k=0xff, pieces=(0xff, 0xe0, 0xff, 0xff)) + large,
        "enc_tiny_chunks": stream_prefix(cfg=0x80 | 2, k=0x12, pieces=(1, 3, 5, 7)) + tiny_chunks,
        "enc_interleave": stream_prefix(cfg=0x80 | 4, k=0x70, pieces=(20, 30, 40, 50)) + interleave,
        "enc_small_inline": stream_prefix(cfg=0x80 | 5, k=0x05, pieces=(0xc2, 1, 0xc4, 2))
            + e_config(chunk=3, inline=1, block=0, coalesce=1) + all_ops[4:],
    }


def conn_seeds():
    """Streams for conn_flow: what follows the HELLO the target writes itself. The prefix is
    stream_decoder's; piece bytes 0 and 1 also pick the backlog ([1, 64, 300, 4096, 65536],
    by value mod 5) and the bytes written between reads ([0, 1, 7, 100, 4096, all], mod 6)."""
    chunked_push, chunks = chunked_push_and_chunks()
    rows_pull = pull_rows(H + 2, [(1, F32, [3, 4], [5, 6, 5]), (2, U8, [2, 8], [1, 2])])
    rows_push = (push_rows(H + 3, [(1, tensor_meta(F32, [2, 4]), [7, 8], tbytes(32)),
                                   (2, tensor_meta(U8, [1, 300], chunked=True), [9], None)])
                 + chunk(H + 3, 1, 0, tbytes(300, 4)))
    requests = (ping() + recv() + fused_recv() + pull(ids=tuple(range(40))) + stats(H + 4)
                + rows_pull + cancel(H + 2, [0, 7]) + chunked_push + chunks + rows_push
                + checkpoint(H + 6) + ping(handle=5, payload=b"") + error(H + 5, 1, b"not ours"))
    pings = b"".join(ping(handle=0x100000000 | i, payload=tbytes(i * 7)) for i in range(1, 40))
    many = b"".join(stats(0x100000000 | i) for i in range(1, 60))
    return {
        "requests_whole": stream_prefix(cfg=7, k=0, pieces=(0xfe, 0xfb, 0xff, 0xff)) + requests,
        "requests_backlog_1": stream_prefix(cfg=6, k=0, pieces=(5, 1, 13, 2)) + requests,
        "requests_backlog_300": stream_prefix(cfg=4, k=0x11, pieces=(2, 2, 64, 3)) + requests,
        "requests_pattern": stream_prefix(cfg=5, k=0xff, pieces=(3, 3, 1, 40)) + requests,
        "requests_small_limits": stream_prefix(cfg=1 | 1 << 3, k=0x24, pieces=(1, 4, 9, 9)) + requests,
        "requests_peer_small": stream_prefix(cfg=7 | 4 << 5, k=0x80, pieces=(3, 2, 0xc1, 7)) + requests,
        "requests_peer_min_frame": stream_prefix(cfg=2 | 5 << 5, k=0x03, pieces=(1, 1, 1, 1)) + requests,
        "pings_backlog_64": stream_prefix(cfg=3, k=0, pieces=(1, 3, 50, 0xc0)) + pings,
        "stats_backlog_1": stream_prefix(cfg=7, k=0, pieces=(0, 1, 32, 32)) + many,
        # A PING counted when its header is in and answered when its payload is, reads later.
        "ping_across_reads": stream_prefix(cfg=7, k=0, pieces=(2, 0, 0x40, 0x40))
            + ping(payload=tbytes(1024)) + stats(H) + stats(H + 1) + stats(H + 2),
        "second_hello": stream_prefix(cfg=7, k=1, pieces=(1, 2, 3, 4)) + ping() + hello(),
        "conn_error": stream_prefix(cfg=7, k=2, pieces=(1, 2, 3, 4)) + pull() + error(0, 5, b"bye") + ping(),
        "bad_frame_after": stream_prefix(cfg=7, k=4, pieces=(2, 4, 6, 8)) + requests
            + header(PING, b"", b"", handle=0),
    }


# Encoder-mode script builders. They mirror how stream_decoder.rs reads its script:
# 4 config bytes, then ops ((op & 15) % 12: 0 ping, 1 pong, 2 recv, 3 fused recv, 4 pull,
# 5 push, 6 response, 7 error, 8 hello, 9 cancel, 10 stats (checkpoint with bit 4), 11 drain),
# each followed by its argument bytes.
HB = b"\x01"  # the byte each g.handle() consumes


def u16(v):
    return struct.pack("<H", v)


def u64(v):
    return struct.pack("<Q", v)


def e_config(chunk, inline, block, coalesce):
    """Indices into the chunk size, inline threshold, block size and coalesce tables."""
    return bytes([chunk, inline, block, coalesce])


def e_ping(n):
    return bytes([0, n]) + HB


def e_pong(n, with_=False):
    return bytes([0x11 if with_ else 1, n]) + HB


def e_recv(key_len=12):
    return bytes([2, key_len - 1]) + u64(77) + HB


def e_fused(key_lens):
    return bytes([3, len(key_lens) - 1] + [k - 1 for k in key_lens]) + u64(78) + HB


def e_pull(n):
    return bytes([4, n - 1]) + b"".join(u64(0x1000 + i) for i in range(n)) + HB


# Tensors: dtype byte (dtype - 1), shape byte (shape % 8 picks the form), arguments.
def t_dead():
    return bytes([F32 - 1, 0])


def t_scalar(dtype):
    return bytes([dtype - 1, 1])


def t_zero_size():
    return bytes([F32 - 1, 2])


def t_u8(n):
    return bytes([U8 - 1, 3, n - 1])


def t_f32_2d(a, b):
    return bytes([F32 - 1, 6, a - 1, b - 1])


def t_large(n):
    return bytes([U8 - 1, 7]) + u16(n)


def e_push(tensors):
    return bytes([5, len(tensors) - 1]) + b"".join(u64(0x2000 + i) + t for i, t in enumerate(tensors)) + HB


def e_response(entries, end):
    """entries: (status, tensor or None); status 0 without tensor is an acknowledgement."""
    out = bytes([0x16 if end else 6, len(entries)])
    for i, (status, t) in enumerate(entries):
        if status == 0:
            out += bytes([(i % 4) << 6 | (0 if t else 2)]) + (t or b"")
        else:
            out += bytes([(i % 4) << 6 | status << 1 | 1])
    return out + HB


def e_error(msg_len, status, conn=False):
    return bytes([0x17 if conn else 7, status]) + u16(msg_len) + (b"" if conn else HB)


def e_hello(ack=False):
    token = b"" if ack else bytes([16])
    return bytes([0x18 if ack else 8, 9]) + token + u64(0xC1A5) + u16(4) + u16(100)


def e_stats():
    return bytes([10]) + HB


def e_checkpoint():
    return bytes([0x1A]) + HB


def e_drain(n):
    mult = (n - 1) // 0xFFFF if n > 0 else 0
    return bytes([11 | mult << 4]) + u16(n // (mult + 1))


def write(target, seeds):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    for name in os.listdir(d):
        if name.startswith("seed_"):
            os.remove(os.path.join(d, name))
    for name, data in seeds.items():
        with open(os.path.join(d, "seed_" + name), "wb") as f:
            f.write(data)
    print(f"{target}: {len(seeds)} seeds")


if __name__ == "__main__":
    write("frame_roundtrip", frame_seeds())
    write("stream_decoder", stream_seeds())
    write("conn_flow", conn_seeds())
