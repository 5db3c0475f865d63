//! The stream decoder, fed the same bytes three ways; and the encoder → decoder round trip.
//!
//! Input layout:
//!
//! - byte 0: bits 0–2 pick the decoder's initial capacity, bits 3–4 its limits (raw mode);
//!   bit 7 set selects the encoder mode below, where bit 6 allows large tensors.
//! - byte 1: for the direct-placement run, the most bytes placed per step (`k`) and the
//!   pattern of direct placements vs. buffered reads.
//! - bytes 2–5: four piece sizes, used in turn to split the stream.
//! - the rest: the byte stream (raw mode), or a script of frames (encoder mode).
//!
//! **Raw mode.** The stream (possibly several frames, valid or not) is decoded (1) fed in
//! the largest pieces `feed` accepts, (2) fed in pieces of the chosen sizes, (3) with
//! payload bytes placed directly (`next_read` / `payload_received`) in steps of at most
//! `k` bytes, alternating with buffered reads. The three runs must agree exactly: the same
//! frames (header repr, `Debug` of the body), the same payload bytes per frame as runs of
//! (target, offset, bytes), the same `FrameEnd`s, and the same final error at the same
//! frame (or none). In every run, each frame's payload pieces must be exactly the bytes
//! of its payload section, each frame's header and body must be what `wire` parses at
//! that stream position, `feed` must accept bytes whenever `poll` asks for more, and the
//! decoder must never hold more than `max(capacity, the largest meta_len announced so
//! far)` bytes.
//!
//! **Encoder mode.** The script drives an `Encoder` (max_frame 65536, a small chunk
//! size): pings, pongs, recvs, fused recvs, pulls, pushes and responses with dead, empty,
//! small and large tensors, errors, hellos, and partial drains of the output between
//! frames (so chunks interleave with later frames). The output is serialized through
//! `fill` / `pieces` / `advance`, tensor pieces resolved from the target's own token map.
//! The stream then goes through the three raw-mode runs, and what the decoder yields must
//! be exactly what went in: every frame's fields, keys, ids and entries, and every
//! tensor's bytes, reassembled from inline payloads and chunks.
#![no_main]

use libfuzzer_sys::fuzz_target;
use starwire::proto::{
    Decoder, EncodeError, Encoder, EncoderConfig, Error, Event, NextRead, OutTensor, PayloadTarget,
    Piece, PushItem, ResponseItem,
};
use starwire::wire::{
    Body, DType, Dims, Header, HeaderRepr, HelloRepr, FrameKind, Limits, Status, TensorMeta, HEADER_LEN,
};

const CAPACITIES: [usize; 8] = [0, 32, 33, 40, 64, 100, 256, 4096];

fn limits_for(sel: u8) -> Limits {
    let d = Limits::default();
    match sel & 3 {
        0 => d,
        1 => Limits {
            max_frame: Limits::MIN_FRAME,
            max_key: 8,
            max_tensors: 2,
            max_rank: 2,
            max_tensor_bytes: 4096,
            max_tables: 2,
            max_rows: 16,
            max_row_bytes: 64,
        },
        2 => Limits {
            max_tensors: 1,
            max_rank: 0,
            max_tensor_bytes: 16,
            ..d
        },
        _ => Limits {
            max_frame: Limits::MAX_FRAME,
            max_key: u16::MAX,
            max_tensors: Limits::MAX_TENSORS,
            max_rank: 32,
            max_tensor_bytes: i64::MAX as u64,
            max_tables: Limits::MAX_TABLES,
            max_rows: Limits::MAX_ROWS,
            max_row_bytes: Limits::MAX_ROW_BYTES,
        },
    }
}

fn piece_size(b: u8) -> usize {
    if b < 0xc0 {
        b as usize + 1
    } else {
        (b - 0xbf) as usize * 1024
    }
}

// ---------------------------------------------------------------------------------------
// Native forms of a frame body (as in frame_roundtrip).

#[derive(Debug, Clone, PartialEq, Eq)]
struct NTensor {
    dtype: u8,
    dead: bool,
    chunked: bool,
    byte_len: u64,
    dims: Vec<u64>,
}

impl NTensor {
    fn of(m: &TensorMeta<'_>) -> NTensor {
        NTensor {
            dtype: m.dtype.into(),
            dead: m.dead,
            chunked: m.chunked,
            byte_len: m.byte_len,
            dims: m.dims.iter().collect(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum NBody {
    Hello {
        ack: bool,
        cluster_id: u64,
        task_index: u32,
        limits: Limits,
        job: Vec<u8>,
        token: Vec<u8>,
    },
    Ping,
    Pong,
    Stats,
    Recv {
        fused: bool,
        step_id: u64,
        keys: Vec<Vec<u8>>,
    },
    Pull(Vec<u64>),
    Push(Vec<(u64, NTensor)>),
    Response(Vec<(u32, u16, Option<NTensor>)>),
    Rows {
        push: bool,
        tables: Vec<(u32, NTensor, Vec<u64>)>,
    },
    Error(Vec<u8>),
    Chunk {
        index: u32,
        offset: u64,
    },
    Cancel(Vec<u32>),
}

impl NBody {
    fn of(body: &Body<'_>) -> NBody {
        let hello = |h: &HelloRepr<'_>, ack| NBody::Hello {
            ack,
            cluster_id: h.cluster_id,
            task_index: h.task_index,
            limits: h.limits,
            job: h.job.to_vec(),
            token: h.token.to_vec(),
        };
        match body {
            Body::Hello(h) => hello(h, false),
            Body::HelloAck(h) => hello(h, true),
            Body::Ping => NBody::Ping,
            Body::Pong => NBody::Pong,
            Body::Stats => NBody::Stats,
            Body::Recv(r) | Body::FusedRecv(r) => NBody::Recv {
                fused: matches!(body, Body::FusedRecv(_)),
                step_id: r.step_id,
                keys: r.keys.map(<[u8]>::to_vec).collect(),
            },
            Body::Pull(ids) => NBody::Pull(ids.iter().collect()),
            Body::Push(p) => NBody::Push(p.map(|e| (e.var_id, NTensor::of(&e.meta))).collect()),
            Body::Response(r) => NBody::Response(
                r.map(|e| (e.index, e.status.into(), e.tensor.as_ref().map(NTensor::of)))
                    .collect(),
            ),
            Body::Error(e) => NBody::Error(e.message.to_vec()),
            Body::Chunk(c) => NBody::Chunk {
                index: c.index,
                offset: c.offset,
            },
            Body::PullRows(t) | Body::PushRows(t) => NBody::Rows {
                push: matches!(body, Body::PushRows(_)),
                tables: t
                    .map(|t| (t.table, NTensor::of(&t.block), t.ids().collect()))
                    .collect(),
            },
            Body::Cancel(items) => NBody::Cancel(items.iter().collect()),
        }
    }

    /// The tensors in payload order with their item index.
    fn tensors(&self) -> Vec<(u32, &NTensor)> {
        match self {
            NBody::Push(e) => e
                .iter()
                .enumerate()
                .map(|(i, (_, t))| (i as u32, t))
                .collect(),
            NBody::Response(e) => e
                .iter()
                .filter_map(|(i, _, t)| t.as_ref().map(|t| (*i, t)))
                .collect(),
            NBody::Rows { push: true, tables } => tables
                .iter()
                .enumerate()
                .map(|(i, (_, t, _))| (i as u32, t))
                .collect(),
            _ => Vec::new(),
        }
    }

    /// This body with every `chunked` flag cleared (the encoder decides them).
    fn unchunked(&self) -> NBody {
        let mut b = self.clone();
        match &mut b {
            NBody::Push(e) => e.iter_mut().for_each(|(_, t)| t.chunked = false),
            NBody::Rows { tables, .. } => tables.iter_mut().for_each(|(_, t, _)| t.chunked = false),
            NBody::Response(e) => e.iter_mut().for_each(|(_, _, t)| {
                if let Some(t) = t {
                    t.chunked = false
                }
            }),
            _ => {}
        }
        b
    }
}

// ---------------------------------------------------------------------------------------
// Recording what a decoder yields.

/// `PayloadTarget` as a plain tuple: kind, handle, index.
type TargetKey = (u8, u64, u32);

/// `PayloadTarget` as an orderable, comparable key.
fn target_key(t: PayloadTarget) -> TargetKey {
    match t {
        PayloadTarget::Tensor { index } => (0, 0, index),
        PayloadTarget::Chunk { handle, index } => (1, handle, index),
        PayloadTarget::Opaque => (2, 0, 0),
    }
}

/// One frame as the decoder reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FrameRec {
    header: HeaderRepr,
    body_dbg: String,
    body: NBody,
    /// Payload bytes as runs: (target, offset of the first byte, bytes). Consecutive
    /// pieces for the same target at the following offset are merged.
    runs: Vec<(TargetKey, u64, Vec<u8>)>,
    ended: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Outcome {
    frames: Vec<FrameRec>,
    /// The error and the number of frames started before it.
    error: Option<(usize, Error)>,
    idle: bool,
    chunks_pending: usize,
}

struct Recorder<'s> {
    stream: &'s [u8],
    limits: Limits,
    capacity: usize,
    frames: Vec<FrameRec>,
    /// Stream offset of the current (or next) frame.
    frame_start: usize,
    /// Largest meta_len of any header the decoder may have read.
    max_meta: usize,
    /// Payload bytes of the current frame, in arrival order.
    payload: Vec<u8>,
    payload_total: u64,
}

impl<'s> Recorder<'s> {
    fn new(stream: &'s [u8], limits: Limits, capacity: usize) -> Self {
        let mut r = Recorder {
            stream,
            limits,
            capacity: capacity.max(HEADER_LEN),
            frames: Vec::new(),
            frame_start: 0,
            max_meta: 0,
            payload: Vec::new(),
            payload_total: 0,
        };
        r.note_next_header();
        r
    }

    /// The decoder may grow its buffer for the meta section of the header at
    /// `frame_start` as soon as it has parsed it.
    fn note_next_header(&mut self) {
        if let Some(h) = self
            .stream
            .get(self.frame_start..self.frame_start + HEADER_LEN)
        {
            let meta_len = Header::new_unchecked(h).meta_len() as usize;
            self.max_meta = self.max_meta.max(meta_len);
        }
    }

    fn current(&mut self) -> &mut FrameRec {
        let f = self
            .frames
            .last_mut()
            .expect("payload or end before any frame");
        assert!(!f.ended, "event after FrameEnd of {:?}", f.header);
        f
    }

    fn event(&mut self, ev: Event<'_>) {
        match ev {
            Event::Frame(f) => {
                if let Some(last) = self.frames.last() {
                    assert!(last.ended, "frame before the previous one ended");
                }
                // What `wire` parses at this stream position.
                let at = &self.stream[self.frame_start..];
                let h = HeaderRepr::parse(&Header::new_checked(at).unwrap(), &self.limits)
                    .expect("decoder accepted a header wire rejects");
                assert_eq!(h, f.header);
                let meta = &at[HEADER_LEN..HEADER_LEN + h.meta_len as usize];
                let body = Body::parse(&h, meta, &self.limits).expect("wire rejects the meta");
                assert_eq!(body, f.body);
                self.payload.clear();
                self.frames.push(FrameRec {
                    header: f.header,
                    body_dbg: format!("{:?}", f.body),
                    body: NBody::of(&f.body),
                    runs: Vec::new(),
                    ended: false,
                });
            }
            Event::Payload {
                target,
                offset,
                data,
            } => self.payload(target, offset, data),
            Event::FrameEnd(h) => {
                let start = self.frame_start;
                let f = self.current();
                assert_eq!(f.header, h, "FrameEnd for another header");
                f.ended = true;
                let meta_end = start + HEADER_LEN + h.meta_len as usize;
                let section = &self.stream[meta_end..meta_end + h.payload_len as usize];
                assert!(
                    self.payload == section,
                    "payload pieces are not the payload section"
                );
                self.frame_start += h.frame_len() as usize;
                self.note_next_header();
            }
        }
    }

    fn payload(&mut self, target: PayloadTarget, offset: u64, data: &[u8]) {
        assert!(!data.is_empty(), "empty payload piece");
        let key = target_key(target);
        let f = self.current();
        match f.runs.last_mut() {
            Some((k, start, bytes)) if *k == key && *start + bytes.len() as u64 == offset => {
                bytes.extend_from_slice(data)
            }
            _ => f.runs.push((key, offset, data.to_vec())),
        }
        self.payload.extend_from_slice(data);
        self.payload_total += data.len() as u64;
        let plen = self.frames.last().unwrap().header.payload_len as usize;
        assert!(self.payload.len() <= plen, "more payload than payload_len");
    }

    fn check_bound(&self, dec: &Decoder) {
        let bound = self.capacity.max(self.max_meta);
        assert!(
            dec.buffered() <= bound,
            "decoder buffers {} bytes, bound {bound}",
            dec.buffered()
        );
    }
}

#[derive(Clone, Copy)]
enum Mode<'a> {
    Whole,
    Pieces(&'a [usize]),
    Direct {
        k: usize,
        pattern: u8,
        pieces: &'a [usize],
    },
}

fn run(stream: &[u8], limits: Limits, capacity: usize, mode: Mode<'_>) -> Outcome {
    let mut dec = Decoder::new(limits, capacity);
    assert_eq!(dec.limits(), &limits);
    let mut rec = Recorder::new(stream, limits, capacity);
    let (mut pos, mut step) = (0usize, 0usize);
    let mut error = None;
    'outer: loop {
        loop {
            match dec.poll() {
                Ok(Some(ev)) => rec.event(ev),
                Ok(None) => break,
                Err(e) => {
                    assert_ne!(e, Error::Poisoned);
                    error = Some((rec.frames.len(), e));
                    assert_eq!(dec.poll(), Err(Error::Poisoned));
                    assert_eq!(dec.next_read(), NextRead::Buffer);
                    break 'outer;
                }
            }
            rec.check_bound(&dec);
        }
        if pos == stream.len() {
            break;
        }
        step += 1;
        let rest = stream.len() - pos;
        let direct = match (mode, dec.next_read()) {
            (
                Mode::Direct { k, pattern, .. },
                NextRead::Payload {
                    target,
                    offset,
                    len,
                },
            ) if pattern & (1 << (step % 8)) != 0 => Some((k, target, offset, len)),
            (Mode::Direct { .. }, NextRead::Payload { .. }) | (_, NextRead::Buffer) => None,
            (_, NextRead::Payload { .. }) => None,
        };
        if let Some((k, target, offset, len)) = direct {
            assert!(len > 0);
            let m = (k as u64).min(len).min(rest as u64) as usize;
            rec.payload(target, offset, &stream[pos..pos + m]);
            let (copied, direct) = (dec.bytes_copied(), dec.bytes_direct());
            // Reporting more than announced is clamped.
            let report = if m as u64 == len && step % 3 == 0 {
                len + 7
            } else {
                m as u64
            };
            dec.payload_received(report);
            assert_eq!(dec.bytes_direct(), direct + m as u64);
            assert_eq!(dec.bytes_copied(), copied);
            pos += m;
        } else {
            let want = match mode {
                Mode::Whole => rest,
                Mode::Pieces(p) | Mode::Direct { pieces: p, .. } => p[step % p.len()].min(rest),
            };
            let mut fed = 0;
            // `feed` may take less than offered; keep offering until the piece is in or the
            // decoder asks to be polled.
            while fed < want {
                let n = dec.feed(&stream[pos + fed..pos + want]);
                if n == 0 {
                    break;
                }
                fed += n;
            }
            assert!(
                fed > 0,
                "decoder stalled: poll wants bytes, feed takes none"
            );
            pos += fed;
        }
        rec.check_bound(&dec);
    }
    assert_eq!(
        dec.bytes_copied() + dec.bytes_direct(),
        rec.payload_total,
        "payload accounting"
    );
    if let Mode::Whole | Mode::Pieces(_) = mode {
        assert_eq!(dec.bytes_direct(), 0);
    }
    let complete = error.is_none() && rec.frame_start == stream.len();
    if error.is_none() {
        assert_eq!(dec.is_idle(), complete, "is_idle at stream end");
    }
    Outcome {
        frames: rec.frames,
        error,
        idle: error.is_none() && dec.is_idle(),
        chunks_pending: dec.chunks_pending(),
    }
}

/// Decodes `stream` the three ways; returns the (common) outcome. Piece sizes and `k` are
/// multiplied by `scale`, which keeps long encoder-mode streams to a few thousand steps.
fn run_all(
    stream: &[u8],
    limits: Limits,
    capacity: usize,
    k: u8,
    pieces: &[usize],
    scale: usize,
) -> Outcome {
    let pieces: Vec<usize> = pieces.iter().map(|p| p * scale).collect();
    let pieces = &pieces[..];
    let whole = run(stream, limits, capacity, Mode::Whole);
    let split = run(stream, limits, capacity, Mode::Pieces(pieces));
    assert_eq!(whole, split, "whole vs split feeding");
    let direct = run(
        stream,
        limits,
        capacity,
        Mode::Direct {
            k: (1 + (k as usize & 0x0f) * (k as usize & 0x0f) * 37) * scale,
            pattern: k.rotate_left(3) | 1,
            pieces,
        },
    );
    assert_eq!(whole, direct, "whole vs direct placement");
    whole
}

// ---------------------------------------------------------------------------------------
// Encoder mode.

struct Input<'a> {
    bytes: &'a [u8],
}

impl Input<'_> {
    fn byte(&mut self) -> u8 {
        match self.bytes.split_first() {
            Some((&b, rest)) => {
                self.bytes = rest;
                b
            }
            None => 0,
        }
    }

    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.byte(), self.byte()])
    }

    fn u64(&mut self) -> u64 {
        let mut a = [0; 8];
        a.iter_mut().for_each(|b| *b = self.byte());
        u64::from_le_bytes(a)
    }
}

const MAX_FRAME: u32 = 65_536;
/// Tensor bytes one input may generate in total (further cut to 256 chunks' worth): small
/// unless bit 6 of byte 0 asks for tensors large enough to exceed a frame.
const TENSOR_BUDGET: [u64; 2] = [16_384, 200_000];

/// Deterministic contents for tensor `token`.
fn contents(token: u64, len: usize) -> Vec<u8> {
    let mut x = token.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// A tensor described by native values, with contents stored under its token.
struct GenTensor {
    token: u64,
    meta: NTensor,
}

struct Gen<'a> {
    input: Input<'a>,
    store: Vec<Vec<u8>>,
    budget: u64,
    next_handle: u64,
}

impl Gen<'_> {
    fn handle(&mut self) -> u64 {
        self.next_handle += 1 + (self.input.byte() as u64 & 3);
        ((self.next_handle & 0xffff) << 32) | (self.next_handle >> 16) | 1
    }

    fn tensor(&mut self) -> GenTensor {
        let dtype = 1 + self.input.byte() % 15;
        let elem = DType::from(dtype).size().unwrap();
        let shape = self.input.byte();
        let (dead, dims): (bool, Vec<u64>) = match shape % 8 {
            0 => (true, vec![]),
            1 => (false, vec![]),
            2 => (false, vec![0, 1 + shape as u64 / 8]),
            3..=5 => (false, vec![1 + self.input.byte() as u64]),
            6 => {
                let a = 1 + self.input.byte() as u64 % 16;
                (false, vec![a, 1 + self.input.byte() as u64, 1])
            }
            _ => {
                let n = self.input.u16() as u64 % (70_000 / elem + 1);
                (false, vec![n])
            }
        };
        let mut byte_len = if dead {
            0
        } else {
            dims.iter().product::<u64>() * elem
        };
        let dims = if byte_len > self.budget {
            byte_len = elem;
            vec![]
        } else {
            dims
        };
        self.budget = self.budget.saturating_sub(byte_len);
        let token = self.store.len() as u64;
        self.store.push(contents(token, byte_len as usize));
        GenTensor {
            token,
            meta: NTensor {
                dtype,
                dead,
                chunked: false,
                byte_len,
                dims,
            },
        }
    }
}

fn out_tensor<'a>(store: &'a [Vec<u8>], t: &'a GenTensor) -> OutTensor<'a> {
    OutTensor {
        meta: TensorMeta {
            dtype: DType::from(t.meta.dtype),
            dead: t.meta.dead,
            chunked: false,
            byte_len: t.meta.byte_len,
            dims: Dims::Native(&t.meta.dims),
        },
        bytes: &store[t.token as usize],
        token: t.token,
    }
}

/// A frame the encoder accepted: header fields, body (chunked flags cleared) and the
/// token of each tensor in payload order.
struct Expected {
    kind: FrameKind,
    handle: u64,
    end: bool,
    status: Status,
    timeout_ms: u32,
    body: NBody,
    tokens: Vec<u64>,
    payload: Vec<u8>,
}

/// Writes up to `max` bytes of the encoder's ready output into `out`.
fn drain(enc: &mut Encoder, store: &[Vec<u8>], coalesce: u64, max: u64, out: &mut Vec<u8>) {
    enc.fill(coalesce);
    let mut written = 0u64;
    for p in enc.pieces() {
        if written == max {
            break;
        }
        let bytes: &[u8] = match p {
            Piece::Bytes(b) => b,
            Piece::Tensor { token, offset, len } => {
                &store[token as usize][offset as usize..(offset + len) as usize]
            }
        };
        assert!(!bytes.is_empty(), "empty piece");
        let n = bytes.len().min((max - written) as usize);
        out.extend_from_slice(&bytes[..n]);
        written += n as u64;
    }
    let before = enc.ready_bytes();
    enc.advance(written);
    assert_eq!(enc.ready_bytes(), before - written);
}

fn encoder_mode(cfg_byte: u8, k: u8, pieces: &[usize], script: &[u8]) {
    let mut input = Input { bytes: script };
    let chunk_size = [1, 16, 100, 1000, 4096, 30_000, 65_000, u32::MAX][input.byte() as usize % 8];
    let inline_threshold = [0, 1, 8, 256, 4096][input.byte() as usize % 5];
    let block_size = [64, 300, 4096, 65_536][input.byte() as usize % 4];
    let coalesce = [1, 100, 4096, 1 << 20][input.byte() as usize % 4];
    let cfg = EncoderConfig {
        max_frame: MAX_FRAME,
        chunk_size,
        inline_threshold,
        block_size,
    };
    let mut enc = Encoder::new(cfg);
    let chunk_limit = chunk_size.min(MAX_FRAME - 48) as u64;
    let mut g = Gen {
        input,
        store: Vec::new(),
        budget: TENSOR_BUDGET[(cfg_byte >> 6 & 1) as usize].min(chunk_limit * 256),
        next_handle: 0,
    };
    let mut expected: Vec<Expected> = Vec::new();
    let mut stream = Vec::new();

    for _ in 0..32 {
        if g.input.bytes.is_empty() {
            break;
        }
        let op = g.input.byte();
        let mut exp = Expected {
            kind: FrameKind::Ping,
            handle: 0,
            end: false,
            status: Status::Ok,
            timeout_ms: 0,
            body: NBody::Ping,
            tokens: Vec::new(),
            payload: Vec::new(),
        };
        let kind = (op & 0x0f) % 11;
        let result: Result<(), EncodeError> = match kind {
            0 | 1 => {
                let n = g.input.byte() as usize * (1 + (op as usize >> 4));
                let payload = contents(g.next_handle + 7, n);
                let handle = g.handle();
                exp.handle = handle;
                exp.payload = payload.clone();
                if kind == 0 {
                    enc.ping(handle, &payload)
                } else {
                    exp.kind = FrameKind::Pong;
                    exp.body = NBody::Pong;
                    exp.end = true;
                    if op & 0x10 != 0 {
                        let region = enc.pong_with(handle, n).expect("pong_with");
                        region.copy_from_slice(&payload);
                        Ok(())
                    } else {
                        enc.pong(handle, &payload)
                    }
                }
            }
            2 | 3 => {
                let fused = kind == 3;
                let n = if fused {
                    1 + g.input.byte() as usize % 6
                } else {
                    1
                };
                let keys: Vec<Vec<u8>> = (0..n)
                    .map(|i| {
                        let len = 1 + g.input.byte() as usize % 40;
                        (0..len).map(|j| b'a' + ((i + j) % 26) as u8).collect()
                    })
                    .collect();
                let step_id = g.input.u64();
                exp.kind = if fused { FrameKind::FusedRecv } else { FrameKind::Recv };
                exp.handle = g.handle();
                exp.body = NBody::Recv {
                    fused,
                    step_id,
                    keys: keys.clone(),
                };
                enc.recv(exp.handle, step_id, &keys, fused)
            }
            4 => {
                let n = 1 + g.input.byte() as usize % 8;
                let ids: Vec<u64> = (0..n).map(|_| g.input.u64()).collect();
                exp.kind = FrameKind::Pull;
                exp.handle = g.handle();
                exp.body = NBody::Pull(ids.clone());
                // A deadline on the request, written in its header only.
                exp.timeout_ms = u32::from(g.input.u16()) << (op >> 4);
                enc.set_request_timeout(exp.timeout_ms);
                let r = enc.pull(exp.handle, &ids);
                enc.set_request_timeout(0);
                r
            }
            9 => {
                let n = g.input.byte() as usize % 4;
                let items: Vec<u32> = (0..n).map(|_| g.input.u16().into()).collect();
                exp.kind = FrameKind::Cancel;
                exp.handle = g.handle();
                exp.body = NBody::Cancel(items.clone());
                enc.cancel(exp.handle, &items)
            }
            5 => {
                let n = 1 + g.input.byte() as usize % 4;
                let entries: Vec<(u64, GenTensor)> =
                    (0..n).map(|_| (g.input.u64(), g.tensor())).collect();
                exp.kind = FrameKind::Push;
                exp.handle = g.handle();
                exp.body = NBody::Push(entries.iter().map(|(v, t)| (*v, t.meta.clone())).collect());
                exp.tokens = entries.iter().map(|(_, t)| t.token).collect();
                let items: Vec<PushItem<'_>> = entries
                    .iter()
                    .map(|(var_id, t)| PushItem {
                        var_id: *var_id,
                        tensor: out_tensor(&g.store, t),
                    })
                    .collect();
                enc.push(exp.handle, &items)
            }
            6 => {
                let n = g.input.byte() as usize % 5;
                let entries: Vec<(u32, u16, Option<GenTensor>)> = (0..n)
                    .map(|i| {
                        let b = g.input.byte();
                        let status = if b & 1 == 0 { 0 } else { (b >> 1) as u16 % 20 };
                        let tensor = (status == 0 && b & 2 == 0).then(|| g.tensor());
                        // Distinct indices, not in order.
                        ((n - i) as u32 * 3 + (b as u32 >> 6), status, tensor)
                    })
                    .collect();
                exp.kind = FrameKind::Response;
                exp.handle = g.handle();
                exp.end = op & 0x10 != 0;
                exp.body = NBody::Response(
                    entries
                        .iter()
                        .map(|(i, s, t)| (*i, *s, t.as_ref().map(|t| t.meta.clone())))
                        .collect(),
                );
                exp.tokens = entries
                    .iter()
                    .filter_map(|(_, _, t)| t.as_ref().map(|t| t.token))
                    .collect();
                let items: Vec<ResponseItem<'_>> = entries
                    .iter()
                    .map(|(index, status, t)| ResponseItem {
                        index: *index,
                        status: Status::from(*status),
                        tensor: t.as_ref().map(|t| out_tensor(&g.store, t)),
                        missing: Default::default(),
                    })
                    .collect();
                enc.response(exp.handle, exp.end, &items)
            }
            7 => {
                let status = Status::from(g.input.byte() as u16 % 20);
                let len = g.input.u16() as usize % 1100;
                let message: String = (0..len).map(|i| (b' ' + (i % 90) as u8) as char).collect();
                let handle = if op & 0x10 != 0 { 0 } else { g.handle() };
                exp.kind = FrameKind::Error;
                exp.handle = handle;
                exp.end = handle != 0;
                exp.status = if status.is_ok() {
                    Status::Internal
                } else {
                    status
                };
                exp.body = NBody::Error(message.as_bytes()[..len.min(1024)].to_vec());
                enc.error(handle, status, &message)
            }
            8 => {
                let ack = op & 0x10 != 0;
                let job: Vec<u8> = (0..1 + g.input.byte() as usize % 64)
                    .map(|i| b"abcXYZ019_-"[i % 11])
                    .collect();
                let token: Vec<u8> = if ack {
                    Vec::new()
                } else {
                    (0..g.input.byte() as usize % 65).map(|i| i as u8).collect()
                };
                let hello = HelloRepr {
                    cluster_id: g.input.u64(),
                    task_index: g.input.u16() as u32,
                    limits: Limits {
                        max_frame: Limits::MIN_FRAME + g.input.u16() as u32,
                        ..Limits::default()
                    },
                    job: &job,
                    token: &token,
                };
                exp.kind = if ack { FrameKind::HelloAck } else { FrameKind::Hello };
                exp.body = NBody::Hello {
                    ack,
                    cluster_id: hello.cluster_id,
                    task_index: hello.task_index,
                    limits: hello.limits,
                    job: job.clone(),
                    token: token.clone(),
                };
                enc.hello(&hello, ack)
            }
            _ => {
                let max = g.input.u16() as u64 * (1 + (op as u64 >> 4));
                drain(&mut enc, &g.store, coalesce, max, &mut stream);
                continue;
            }
        };
        match result {
            Ok(()) => expected.push(exp),
            Err(e) => panic!("encoder refused a valid frame: {e:?}"),
        }
    }
    let mut rounds = 0;
    while !enc.is_empty() {
        drain(&mut enc, &g.store, coalesce, u64::MAX, &mut stream);
        rounds += 1;
        assert!(rounds < 1_000_000, "encoder never drains");
    }
    assert_eq!(enc.ready_bytes(), 0);
    assert_eq!(enc.chunks_pending(), 0);

    let limits = Limits {
        max_frame: MAX_FRAME,
        ..Limits::default()
    };
    let capacity = CAPACITIES[cfg_byte as usize & 7];
    let out = run_all(
        &stream,
        limits,
        capacity,
        k,
        pieces,
        1 + stream.len() / 8192,
    );
    assert_eq!(out.error, None, "decoding the encoder's output failed");
    assert!(out.idle);
    assert_eq!(out.chunks_pending, 0);

    // What came out is what went in.
    let mut expected = expected.into_iter();
    let mut fifo: std::collections::VecDeque<(u64, u32, u64, u64)> = Default::default();
    for f in &out.frames {
        assert!(f.ended);
        if let NBody::Chunk { index, offset } = f.body {
            assert!(
                f.header.payload_len as u64 <= chunk_limit,
                "chunk over chunk limit"
            );
            let Some(&(handle, idx, token, next)) = fifo.front() else {
                panic!("chunk without a chunked tensor");
            };
            assert_eq!((f.header.handle, index, offset), (handle, idx, next));
            assert_eq!(f.runs.len(), 1);
            let (target, at, bytes) = &f.runs[0];
            assert_eq!(*target, target_key(PayloadTarget::Chunk { handle, index }));
            assert_eq!(*at, offset);
            let full = &g.store[token as usize];
            assert!(bytes[..] == full[offset as usize..offset as usize + bytes.len()]);
            let next = next + bytes.len() as u64;
            if next == full.len() as u64 {
                fifo.pop_front();
            } else {
                fifo.front_mut().unwrap().3 = next;
            }
            continue;
        }
        let exp = expected
            .next()
            .expect("decoder yields a frame nobody encoded");
        let h = f.header;
        assert_eq!(
            (h.kind, h.handle, h.end, h.status, h.timeout_ms),
            (exp.kind, exp.handle, exp.end, exp.status, exp.timeout_ms)
        );
        assert_eq!(f.body.unchunked(), exp.body);
        match exp.kind {
            FrameKind::Ping | FrameKind::Pong => {
                let got: Vec<u8> = f.runs.iter().flat_map(|r| r.2.clone()).collect();
                assert_eq!(got, exp.payload);
            }
            FrameKind::Push | FrameKind::Response => {
                let tensors = f.body.tensors();
                assert_eq!(tensors.len(), exp.tokens.len());
                let mut runs = f.runs.iter();
                for ((index, t), token) in tensors.into_iter().zip(&exp.tokens) {
                    let bytes = &g.store[*token as usize];
                    if t.chunked {
                        assert!(t.byte_len > 0 && !t.dead);
                        fifo.push_back((h.handle, index, *token, 0));
                    } else {
                        // Not chunked: it fit the chunk size.
                        assert!(t.byte_len <= chunk_limit, "{t:?} not chunked");
                        if t.byte_len > 0 && !t.dead {
                            let (target, at, got) = runs.next().expect("inline tensor missing");
                            assert_eq!(*target, target_key(PayloadTarget::Tensor { index }));
                            assert_eq!(*at, 0);
                            assert!(got == bytes, "inline tensor bytes differ");
                        }
                    }
                }
                assert!(runs.next().is_none());
            }
            _ => assert!(f.runs.is_empty()),
        }
    }
    assert!(expected.next().is_none(), "encoded frame never decoded");
    assert!(fifo.is_empty(), "chunked tensor incomplete");
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 6 {
        return;
    }
    let (cfg, k) = (data[0], data[1]);
    let pieces: Vec<usize> = data[2..6].iter().map(|&b| piece_size(b)).collect();
    let rest = &data[6..];
    if cfg & 0x80 != 0 {
        encoder_mode(cfg, k, &pieces, rest);
    } else {
        let limits = limits_for(cfg >> 3);
        run_all(rest, limits, CAPACITIES[cfg as usize & 7], k, &pieces, 1);
    }
});
