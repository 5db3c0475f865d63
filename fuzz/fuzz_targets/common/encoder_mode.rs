//! The encoder mode of the `stream_decoder` target (see its documentation): a script of
//! frames through an `Encoder`, its output decoded the raw mode's three ways, and what came
//! out compared with what went in; the encoder's accounting checked along the way.

use starwire::proto::{
    EncodeError, Encoder, EncoderConfig, OutTensor, PayloadTarget, Piece, PushItem, ResponseItem,
};
use starwire::wire::{DType, Dims, FrameKind, HelloRepr, Limits, Status, TensorMeta, WireFeatures};

use super::native::{limits_for, target_key, NBody, NTensor, CAPACITIES};
use super::run_all;

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
    /// What encoding it added to `queued_bytes`, `copied_bytes` and `frames_out`.
    queued: u64,
    copied: u64,
    frames: u64,
}

/// Checks the encoder's accounting against its output pieces; `front_done` is how much of
/// the segment of the first piece earlier writes took (the piece is trimmed by it).
fn check_accounting(enc: &Encoder, front_done: u64) {
    let (mut arena, mut all, mut front_is_arena) = (0u64, 0u64, false);
    for (i, p) in enc.pieces().enumerate() {
        let len = match p {
            Piece::Bytes(b) => {
                arena += b.len() as u64;
                front_is_arena |= i == 0;
                b.len() as u64
            }
            Piece::Tensor { len, .. } => len,
        };
        all += len;
    }
    assert_eq!(enc.ready_bytes(), all, "ready bytes are the pieces");
    if all == 0 {
        assert_eq!(front_done, 0);
    }
    // A segment counts whole until it is completely written.
    let front_arena = if front_is_arena { front_done } else { 0 };
    assert_eq!(enc.copied_bytes(), arena + front_arena, "copied bytes");
    let queued = enc.queued_bytes();
    let ready = enc.ready_bytes() + front_done;
    match enc.chunks_pending() {
        0 => assert_eq!(queued, ready, "queued bytes without chunks pending"),
        n => assert!(
            queued >= ready + n as u64,
            "queued bytes with {n} chunked tensors"
        ),
    }
}

/// Writes up to `max` bytes of the encoder's ready output into `out`.
/// `front_done` is how much of the first piece's segment was written before, and is kept up
/// to date.
fn drain(
    enc: &mut Encoder,
    store: &[Vec<u8>],
    coalesce: u64,
    max: u64,
    out: &mut Vec<u8>,
    front_done: &mut u64,
) {
    let (queued, frames) = (enc.queued_bytes(), enc.frames_out());
    let chunks_before = enc.chunks_pending();
    enc.fill(coalesce);
    // Filling cuts chunks: each adds a CHUNK frame's header and meta section, nothing else.
    let cut = enc.frames_out() - frames;
    assert_eq!(
        enc.queued_bytes(),
        queued + cut * 48,
        "fill changed the queued bytes"
    );
    assert!(enc.chunks_pending() <= chunks_before);
    check_accounting(enc, *front_done);
    let mut written = 0u64;
    let mut front = *front_done;
    for (i, p) in enc.pieces().enumerate() {
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
        if n < bytes.len() {
            front = if i == 0 { front + n as u64 } else { n as u64 };
            break;
        }
        front = 0;
    }
    let (before, queued) = (enc.ready_bytes(), enc.queued_bytes());
    enc.advance(written);
    *front_done = front;
    assert_eq!(enc.ready_bytes(), before - written);
    // Written bytes leave the queue when their segment is done.
    assert!(enc.queued_bytes() <= queued);
    check_accounting(enc, *front_done);
}

pub fn encoder_mode(cfg_byte: u8, k: u8, pieces: &[usize], script: &[u8]) {
    let mut input = Input { bytes: script };
    let chunk_size = [1, 16, 100, 1000, 4096, 30_000, 65_000, u32::MAX][input.byte() as usize % 8];
    let inline_threshold = [0, 1, 8, 256, 4096][input.byte() as usize % 5];
    let block_size = [64, 300, 4096, 65_536][input.byte() as usize % 4];
    let coalesce_pick = input.byte() as usize % 4;
    let coalesce = [1, 100, 4096, 1 << 20][coalesce_pick];
    // The arena's keep cap varies with it (no byte of its own, so the seeds keep their
    // meaning): none kept beyond the floor, the default, a few small blocks, no cap.
    let keep_bytes = [0, 1 << 20, 4096, usize::MAX][coalesce_pick];
    // Before the peer's hello a connection's encoder keeps to the smallest frame; then it
    // adopts the limits the peer announced (bits 3–4 of byte 0 pick the others).
    let cfg = EncoderConfig {
        max_frame: Limits::MIN_FRAME,
        chunk_size,
        inline_threshold,
        block_size,
        keep_bytes,
    };
    let mut enc = Encoder::new(cfg);
    assert_eq!(enc.peer_limits(), &Limits::default());
    let peer = Limits {
        max_frame: MAX_FRAME,
        ..limits_for(cfg_byte >> 3)
    };
    enc.set_peer_limits(peer);
    assert_eq!(enc.peer_limits(), &peer);
    assert_eq!(enc.config().max_frame, MAX_FRAME);
    let chunk_limit = chunk_size.min(MAX_FRAME - 48) as u64;
    assert_eq!(enc.chunk_limit(), chunk_limit);
    assert_eq!(
        (enc.queued_bytes(), enc.copied_bytes(), enc.frames_out()),
        (0, 0, 0)
    );
    let mut front_done = 0u64;
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
            queued: 0,
            copied: 0,
            frames: 0,
        };
        let before = (enc.queued_bytes(), enc.copied_bytes(), enc.frames_out());
        let kind = (op & 0x0f) % 12;
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
                exp.kind = if fused {
                    FrameKind::FusedRecv
                } else {
                    FrameKind::Recv
                };
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
            10 => {
                // STATS or CHECKPOINT: a handle, nothing else.
                exp.handle = g.handle();
                if op & 0x10 == 0 {
                    exp.kind = FrameKind::Stats;
                    exp.body = NBody::Stats;
                    enc.stats(exp.handle)
                } else {
                    exp.kind = FrameKind::Checkpoint;
                    exp.body = NBody::Checkpoint;
                    enc.checkpoint(exp.handle)
                }
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
                        versions: Default::default(),
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
                    features: WireFeatures::from_bits(g.input.u16()),
                };
                exp.kind = if ack {
                    FrameKind::HelloAck
                } else {
                    FrameKind::Hello
                };
                exp.body = NBody::Hello {
                    ack,
                    cluster_id: hello.cluster_id,
                    task_index: hello.task_index,
                    limits: hello.limits,
                    job: job.clone(),
                    token: token.clone(),
                    features: hello.features.bits(),
                };
                enc.hello(&hello, ack)
            }
            _ => {
                let max = g.input.u16() as u64 * (1 + (op as u64 >> 4));
                drain(
                    &mut enc,
                    &g.store,
                    coalesce,
                    max,
                    &mut stream,
                    &mut front_done,
                );
                continue;
            }
        };
        match result {
            Ok(()) => {
                exp.queued = enc.queued_bytes() - before.0;
                exp.copied = enc.copied_bytes() - before.1;
                exp.frames = enc.frames_out() - before.2;
                check_accounting(&enc, front_done);
                expected.push(exp)
            }
            Err(e) => panic!("encoder refused a valid frame: {e:?}"),
        }
    }
    let mut rounds = 0;
    while !enc.is_empty() {
        drain(
            &mut enc,
            &g.store,
            coalesce,
            u64::MAX,
            &mut stream,
            &mut front_done,
        );
        rounds += 1;
        assert!(rounds < 1_000_000, "encoder never drains");
    }
    assert_eq!(enc.ready_bytes(), 0);
    assert_eq!(enc.chunks_pending(), 0);
    assert_eq!(
        (enc.queued_bytes(), enc.copied_bytes(), front_done),
        (0, 0, 0)
    );

    let limits = Limits {
        max_frame: MAX_FRAME,
        ..Limits::default()
    };
    let capacity = CAPACITIES[cfg_byte as usize & 7];
    let out = run_all(
        &stream,
        limits,
        starwire::wire::WireFeatures::NONE,
        capacity,
        k,
        pieces,
        1 + stream.len() / 8192,
    );
    assert_eq!(out.error, None, "decoding the encoder's output failed");
    assert!(out.idle);
    assert_eq!(out.chunks_pending, 0);
    assert_eq!(enc.frames_out(), out.frames.len() as u64, "frames counted");
    for f in &out.frames {
        assert!(
            f.header.frame_len() <= u64::from(peer.max_frame),
            "frame over max_frame"
        );
    }

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
        // What the frame added to the encoder's counts: all of it queued (chunked contents
        // included), its header, meta section and copied tensors to the arena.
        let head = 32 + u64::from(h.meta_len);
        let chunked: u64 = f
            .body
            .tensors()
            .iter()
            .filter(|(_, t)| t.chunked)
            .map(|(_, t)| t.byte_len)
            .sum();
        assert_eq!(exp.frames, 1);
        assert_eq!(
            exp.queued,
            head + u64::from(h.payload_len) + chunked,
            "queued bytes of {:?}",
            h.kind
        );
        let copied: u64 = match exp.kind {
            FrameKind::Push | FrameKind::Response => f
                .body
                .tensors()
                .iter()
                .filter(|(_, t)| !t.chunked && t.byte_len <= inline_threshold as u64)
                .map(|(_, t)| t.byte_len)
                .sum(),
            _ => u64::from(h.payload_len),
        };
        assert_eq!(exp.copied, head + copied, "copied bytes of {:?}", h.kind);
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
