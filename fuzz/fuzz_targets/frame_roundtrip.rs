//! One frame: parse → native values → emit → parse again, and compare.
//!
//! Input layout: byte 0 picks the receiver's limits. Below 0x80 they are the defaults and
//! the frame starts at byte 1; from 0x80 on, bytes 0 and 1 pick small limits (so the
//! limit checks are reachable) and the frame starts at byte 2. Bytes past the frame's
//! `32 + meta_len + payload_len` are ignored.
//!
//! A frame the header or meta parser rejects ends the run: not panicking is the property.
//! An accepted frame is turned into plain Rust values (keys as `Vec<Vec<u8>>`, ids as
//! `Vec<u64>`, entries with their dims as `Vec<u64>`, ...), the header is rebuilt from
//! those values (count and meta_len recomputed, not copied) and the frame re-emitted with
//! the `wire` emitters into buffers of exactly `buffer_len()` bytes, twice over different
//! fill bytes so an emitter that skips a byte is caught. The result must be the original
//! bytes (the encoding is canonical), and must parse to the same header, body and native
//! values. Frames the `Encoder` can produce are also encoded with it and must come out
//! byte-identical.
//!
//! Each input is parsed twice: on a connection that negotiated no optional feature, and on
//! one that negotiated every feature (`ROW_FORMATS`: loss scales of rows pushes;
//! `ROW_VERSIONS`: held versions of rows pulls, row-versions reports of answers); each
//! accepted parse is checked as above, the encoder set to the same features.
#![no_main]

use libfuzzer_sys::fuzz_target;
use starwire::proto::{
    Encoder, EncoderConfig, OutTensor, Piece, PushItem, ResponseItem, RowsItem, RowsQuery,
};
use starwire::wire::{
    cancel_meta_len, emit_cancel_meta, emit_pull_meta, emit_pull_rows_versioned_meta,
    emit_recv_meta, emit_rows_meta, pull_meta_len, pull_rows_versioned_meta_len, recv_meta_len,
    Body, ChunkRepr, DType, Dims, ErrorRepr, FrameKind, Header, HeaderRepr, HelloRepr, Limits,
    LossScale, Missing, PushEntry, ResponseEntry, Status, TensorMeta, Versions, WireFeatures,
    HEADER_LEN,
};

/// A row-versions report as plain values: `n`, the bitmap, the versions sent.
type NVersions = (u32, Vec<u8>, Vec<u64>);

/// The loss scale whose bits travel as `bits` (0: none); the bits were accepted.
fn scale_of(bits: u32) -> Option<LossScale> {
    (bits != 0).then(|| LossScale::new(f32::from_bits(bits)).expect("parsed scale in range"))
}

/// Limits chosen by the first input bytes; `None` when they are not a valid configuration.
fn limits_from(data: &[u8]) -> Option<(Limits, &[u8])> {
    let (&sel, rest) = data.split_first()?;
    if sel < 0x80 {
        return Some((Limits::default(), rest));
    }
    let (&sel2, rest) = rest.split_first()?;
    let limits = Limits {
        max_frame: [Limits::MIN_FRAME, 70_000, 1 << 20, Limits::MAX_FRAME][(sel & 3) as usize],
        max_key: [1, 2, 16, u16::MAX][(sel >> 2 & 3) as usize],
        max_rank: [0, 1, 4, 32][(sel >> 4 & 3) as usize],
        max_tensors: [1, 2, 3, Limits::MAX_TENSORS][(sel2 & 3) as usize],
        max_tensor_bytes: [0, 1, 16, 1000, 4096, 1 << 20, 4 << 30, i64::MAX as u64]
            [(sel2 >> 2 & 7) as usize],
        max_tables: [1, 2, 16, Limits::MAX_TABLES][(sel2 >> 5 & 3) as usize],
        max_rows: [2, Limits::MAX_ROWS][(sel2 >> 7) as usize],
        max_row_bytes: [64, Limits::MAX_ROW_BYTES][(sel >> 6 & 1) as usize],
    };
    limits.validate().expect("selector builds valid limits");
    Some((limits, rest))
}

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

    fn meta(&self) -> TensorMeta<'_> {
        TensorMeta {
            dtype: DType::from(self.dtype),
            dead: self.dead,
            chunked: self.chunked,
            byte_len: self.byte_len,
            dims: Dims::Native(&self.dims),
        }
    }

    fn inline(&self) -> bool {
        !self.dead && !self.chunked
    }
}

/// A meta section as plain values.
#[derive(Debug, Clone, PartialEq, Eq)]
enum NBody {
    Hello {
        ack: bool,
        cluster_id: u64,
        task_index: u32,
        limits: Limits,
        job: Vec<u8>,
        token: Vec<u8>,
        features: u16,
    },
    Ping,
    Pong,
    Stats,
    Checkpoint,
    Recv {
        fused: bool,
        step_id: u64,
        keys: Vec<Vec<u8>>,
    },
    Pull(Vec<u64>),
    Push(Vec<(u64, NTensor)>),
    Response(Vec<(u32, u16, Option<NTensor>, Vec<u32>, Option<NVersions>)>),
    Rows {
        push: bool,
        /// Per table: its number, block, ids, held versions (a pull's; may be empty) and
        /// loss scale bits (a push's; 0 for none).
        tables: Vec<(u32, NTensor, Vec<u64>, Vec<u64>, u32)>,
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
            features: h.features.bits(),
        };
        match body {
            Body::Hello(h) => hello(h, false),
            Body::HelloAck(h) => hello(h, true),
            Body::Ping => NBody::Ping,
            Body::Pong => NBody::Pong,
            Body::Stats => NBody::Stats,
            Body::Checkpoint => NBody::Checkpoint,
            Body::Recv(r) | Body::FusedRecv(r) => {
                let keys = r.keys;
                assert_eq!(keys.len(), keys.count(), "Keys: size_hint vs items");
                NBody::Recv {
                    fused: matches!(body, Body::FusedRecv(_)),
                    step_id: r.step_id,
                    keys: keys.map(<[u8]>::to_vec).collect(),
                }
            }
            Body::Pull(ids) => {
                let v: Vec<u64> = ids.iter().collect();
                assert_eq!(v.len(), ids.len());
                assert_eq!(v.is_empty(), ids.is_empty());
                for (i, id) in v.iter().enumerate() {
                    assert_eq!(ids.get(i), Some(*id));
                }
                assert_eq!(ids.get(v.len()), None);
                NBody::Pull(v)
            }
            Body::Push(p) => {
                assert_eq!(
                    p.size_hint().0,
                    p.count(),
                    "PushEntries: size_hint vs items"
                );
                NBody::Push(p.map(|e| (e.var_id, NTensor::of(&e.meta))).collect())
            }
            Body::Response(r) => {
                assert_eq!(
                    r.size_hint().0,
                    r.count(),
                    "ResponseEntries: size_hint vs items"
                );
                NBody::Response(
                    r.map(|e| {
                        let missing: Vec<u32> = e.missing.iter().collect();
                        assert_eq!(missing.len(), e.missing.len());
                        let t = e.tensor.as_ref().map(NTensor::of);
                        let v = &e.versions;
                        let versions = (!v.is_empty()).then(|| {
                            let sent: Vec<u64> =
                                (0..v.sent()).map(|k| v.sent_version(k).unwrap()).collect();
                            assert_eq!(v.sent_version(v.sent()), None);
                            assert_eq!(v.sent() + v.unchanged_count(), v.rows());
                            (v.rows() as u32, v.unchanged_bitmap().to_vec(), sent)
                        });
                        if let (Some((_, _, sent)), Some(t)) = (&versions, &t) {
                            assert_eq!(t.dims.first(), Some(&(sent.len() as u64)));
                        }
                        (e.index, e.status.into(), t, missing, versions)
                    })
                    .collect(),
                )
            }
            Body::PullRows(t) | Body::PushRows(t) => {
                assert_eq!(t.size_hint().0, t.count(), "RowsTables: size_hint vs items");
                let tables = t
                    .map(|t| {
                        let ids: Vec<u64> = t.ids().collect();
                        assert_eq!(ids.len(), t.len());
                        assert_eq!(t.block.dims.get(0), Some(ids.len() as u64));
                        let held: Vec<u64> = t.held().collect();
                        assert_eq!(held.is_empty(), !t.has_held());
                        assert!(held.is_empty() || held.len() == ids.len());
                        let scale = t.loss_scale.map_or(0, |s| s.get().to_bits());
                        (t.table, NTensor::of(&t.block), ids, held, scale)
                    })
                    .collect();
                NBody::Rows {
                    push: matches!(body, Body::PushRows(_)),
                    tables,
                }
            }
            Body::Error(e) => NBody::Error(e.message.to_vec()),
            Body::Chunk(c) => NBody::Chunk {
                index: c.index,
                offset: c.offset,
            },
            Body::Cancel(items) => {
                let v: Vec<u32> = items.iter().collect();
                assert_eq!(v.len(), items.len());
                assert_eq!(v.is_empty(), items.is_empty());
                NBody::Cancel(v)
            }
        }
    }

    fn kind(&self) -> FrameKind {
        match self {
            NBody::Hello { ack: false, .. } => FrameKind::Hello,
            NBody::Hello { ack: true, .. } => FrameKind::HelloAck,
            NBody::Ping => FrameKind::Ping,
            NBody::Pong => FrameKind::Pong,
            NBody::Stats => FrameKind::Stats,
            NBody::Checkpoint => FrameKind::Checkpoint,
            NBody::Recv { fused: false, .. } => FrameKind::Recv,
            NBody::Recv { fused: true, .. } => FrameKind::FusedRecv,
            NBody::Pull(_) => FrameKind::Pull,
            NBody::Push(_) => FrameKind::Push,
            NBody::Response(_) => FrameKind::Response,
            NBody::Error(_) => FrameKind::Error,
            NBody::Chunk { .. } => FrameKind::Chunk,
            NBody::Rows { push: false, .. } => FrameKind::PullRows,
            NBody::Rows { push: true, .. } => FrameKind::PushRows,
            NBody::Cancel(_) => FrameKind::Cancel,
        }
    }

    fn count(&self) -> u32 {
        match self {
            NBody::Recv { keys, .. } => keys.len() as u32,
            NBody::Pull(ids) => ids.len() as u32,
            NBody::Push(e) => e.len() as u32,
            NBody::Response(e) => e.len() as u32,
            NBody::Rows { tables, .. } => tables.len() as u32,
            NBody::Chunk { .. } => 1,
            NBody::Cancel(items) => items.len() as u32,
            _ => 0,
        }
    }

    fn hello(&self) -> Option<HelloRepr<'_>> {
        match self {
            NBody::Hello {
                cluster_id,
                task_index,
                limits,
                job,
                token,
                features,
                ..
            } => Some(HelloRepr {
                cluster_id: *cluster_id,
                task_index: *task_index,
                limits: *limits,
                job,
                token,
                features: WireFeatures::from_bits(*features),
            }),
            _ => None,
        }
    }

    /// Inline payload bytes the tensors declare.
    fn inline_bytes(&self) -> Option<u64> {
        let sizes: Vec<&NTensor> = match self {
            NBody::Push(e) => e.iter().map(|(_, t)| t).collect(),
            NBody::Response(e) => e.iter().filter_map(|(_, _, t, ..)| t.as_ref()).collect(),
            NBody::Rows { push: true, tables } => tables.iter().map(|(_, t, ..)| t).collect(),
            NBody::Rows { push: false, .. } => Vec::new(),
            _ => return None,
        };
        Some(
            sizes
                .iter()
                .filter(|t| t.inline())
                .map(|t| t.byte_len)
                .sum(),
        )
    }

    /// The meta section, each part written into exactly its `buffer_len()` bytes of a
    /// buffer pre-filled with `fill`.
    fn emit_meta(&self, fill: u8) -> Vec<u8> {
        // Each emitter gets a slice of exactly its length: writing past it panics.
        fn put(out: &mut Vec<u8>, fill: u8, len: usize, emit: impl FnOnce(&mut [u8])) {
            let at = out.len();
            out.resize(at + len, fill);
            emit(&mut out[at..]);
        }
        let mut out = Vec::new();
        match self {
            NBody::Hello { .. } => {
                let h = self.hello().unwrap();
                put(&mut out, fill, h.buffer_len(), |b| h.emit(b));
            }
            NBody::Ping | NBody::Pong | NBody::Stats | NBody::Checkpoint => {}
            NBody::Recv { step_id, keys, .. } => {
                put(&mut out, fill, recv_meta_len(keys), |b| {
                    emit_recv_meta(*step_id, keys, b)
                });
            }
            NBody::Pull(ids) => put(&mut out, fill, pull_meta_len(ids.len()), |b| {
                emit_pull_meta(ids, b)
            }),
            NBody::Push(entries) => {
                for (var_id, t) in entries {
                    let e = PushEntry {
                        var_id: *var_id,
                        meta: t.meta(),
                    };
                    put(&mut out, fill, e.buffer_len(), |b| e.emit(b));
                }
            }
            NBody::Response(entries) => {
                for (index, status, t, missing, versions) in entries {
                    let e = ResponseEntry {
                        index: *index,
                        status: Status::from(*status),
                        tensor: t.as_ref().map(NTensor::meta),
                        missing: Missing::Native(missing),
                        versions: versions.as_ref().map_or(Versions::default(), |(n, b, v)| {
                            Versions::new(*n, b, v).expect("a parsed report adds up")
                        }),
                    };
                    put(&mut out, fill, e.buffer_len(), |b| e.emit(b));
                }
            }
            NBody::Rows { tables, .. } => {
                for (table, t, ids, held, scale) in tables {
                    let meta = t.meta();
                    let len = pull_rows_versioned_meta_len(t.dims.len(), ids.len(), !held.is_empty());
                    put(&mut out, fill, len, |b| {
                        if held.is_empty() {
                            emit_rows_meta(*table, scale_of(*scale), &meta, ids, b)
                        } else {
                            emit_pull_rows_versioned_meta(*table, &meta, ids, held, b)
                        }
                    });
                }
            }
            NBody::Error(message) => {
                let e = ErrorRepr { message };
                assert_eq!(ErrorRepr::new(message), e, "message within bounds is kept");
                put(&mut out, fill, e.buffer_len(), |b| e.emit(b));
            }
            NBody::Chunk { index, offset } => {
                let c = ChunkRepr {
                    index: *index,
                    offset: *offset,
                };
                put(&mut out, fill, c.buffer_len(), |b| c.emit(b));
            }
            NBody::Cancel(items) => put(&mut out, fill, cancel_meta_len(items.len()), |b| {
                emit_cancel_meta(items, b)
            }),
        }
        out
    }
}

/// Parses one frame at the start of `frame`; `None` when rejected or truncated.
fn parse<'a>(
    frame: &'a [u8],
    limits: &Limits,
    features: WireFeatures,
) -> Option<(HeaderRepr, Body<'a>, &'a [u8])> {
    let header = Header::new_checked(frame).ok()?;
    let repr = HeaderRepr::parse(&header, limits).ok()?;
    assert!(repr.frame_len() <= limits.max_frame as u64);
    let meta_end = HEADER_LEN + repr.meta_len as usize;
    let meta = frame.get(HEADER_LEN..meta_end)?;
    let body = Body::parse_with(&repr, meta, limits, features).ok()?;
    let payload = frame.get(meta_end..meta_end + repr.payload_len as usize)?;
    Some((repr, body, payload))
}

/// The frame the `Encoder` produces for these values, when it can produce it.
fn encoder_frame(
    h: &HeaderRepr,
    nb: &NBody,
    payload: &[u8],
    features: WireFeatures,
) -> Option<Vec<u8>> {
    let mut enc = Encoder::new(EncoderConfig {
        max_frame: u32::MAX,
        chunk_size: u32::MAX,
        inline_threshold: 64,
        block_size: 512,
        keep_bytes: EncoderConfig::default().keep_bytes,
    });
    enc.set_features(features);
    let mut tensors: Vec<&[u8]> = Vec::new();
    // Written into request headers only.
    enc.set_request_timeout(h.timeout_ms);
    let r = match nb {
        NBody::Hello { ack, .. } => enc.hello(&nb.hello().unwrap(), *ack),
        NBody::Ping => enc.ping(h.handle, payload),
        NBody::Pong => enc.pong(h.handle, payload),
        NBody::Stats => enc.stats(h.handle),
        NBody::Checkpoint => enc.checkpoint(h.handle),
        NBody::Recv {
            fused,
            step_id,
            keys,
        } => enc.recv(h.handle, *step_id, keys, *fused),
        NBody::Pull(ids) => enc.pull(h.handle, ids),
        NBody::Cancel(items) => enc.cancel(h.handle, items),
        NBody::Error(m) => enc.error(h.handle, h.status, core::str::from_utf8(m).ok()?),
        NBody::Rows {
            push: false,
            tables,
        } => {
            let queries: Vec<RowsQuery<'_>> = tables
                .iter()
                .map(|(table, t, ids, held, _)| RowsQuery {
                    table: *table,
                    block: t.meta(),
                    ids,
                    held,
                })
                .collect();
            enc.pull_rows(h.handle, &queries)
        }
        NBody::Push(_) | NBody::Response(_) | NBody::Rows { push: true, .. } => {
            let metas: Vec<&NTensor> = match nb {
                NBody::Push(e) => e.iter().map(|(_, t)| t).collect(),
                NBody::Response(e) => e.iter().filter_map(|(_, _, t, _, _)| t.as_ref()).collect(),
                NBody::Rows { tables, .. } => tables.iter().map(|(_, t, ..)| t).collect(),
                _ => unreachable!(),
            };
            // The encoder decides chunking itself and never chunks here.
            if metas.iter().any(|t| t.chunked) {
                return None;
            }
            let mut at = 0usize;
            for t in &metas {
                let n = if t.inline() { t.byte_len as usize } else { 0 };
                tensors.push(&payload[at..at + n]);
                at += n;
            }
            fn out<'t>(t: &'t NTensor, tensors: &[&'t [u8]], i: usize) -> OutTensor<'t> {
                OutTensor {
                    meta: t.meta(),
                    bytes: tensors[i],
                    token: i as u64,
                }
            }
            match nb {
                NBody::Push(e) => {
                    let items: Vec<PushItem<'_>> = e
                        .iter()
                        .enumerate()
                        .map(|(i, (var_id, t))| PushItem {
                            var_id: *var_id,
                            tensor: out(t, &tensors, i),
                        })
                        .collect();
                    enc.push(h.handle, &items)
                }
                NBody::Response(e) => {
                    let mut i = 0;
                    let items: Vec<ResponseItem<'_>> = e
                        .iter()
                        .map(|(index, status, t, missing, versions)| ResponseItem {
                            index: *index,
                            status: Status::from(*status),
                            tensor: t.as_ref().map(|t| {
                                i += 1;
                                out(t, &tensors, i - 1)
                            }),
                            missing: Missing::Native(missing),
                            versions: versions.as_ref().map_or(Versions::default(), |(n, b, v)| {
                                Versions::new(*n, b, v).unwrap()
                            }),
                        })
                        .collect();
                    enc.response(h.handle, h.end, &items)
                }
                NBody::Rows { tables, .. } => {
                    let items: Vec<RowsItem<'_>> = tables
                        .iter()
                        .enumerate()
                        .map(|(i, (table, t, ids, _, scale))| RowsItem {
                            table: *table,
                            ids,
                            block: out(t, &tensors, i),
                            loss_scale: scale_of(*scale),
                        })
                        .collect();
                    enc.push_rows(h.handle, &items)
                }
                _ => unreachable!(),
            }
        }
        NBody::Chunk { .. } => return None,
    };
    r.unwrap_or_else(|e| panic!("encoder refused a valid frame: {e:?}"));
    enc.fill(u64::MAX);
    let mut out = Vec::new();
    for p in enc.pieces() {
        match p {
            Piece::Bytes(b) => out.extend_from_slice(b),
            Piece::Tensor { token, offset, len } => {
                let t = tensors[token as usize];
                out.extend_from_slice(&t[offset as usize..(offset + len) as usize]);
            }
        }
    }
    enc.advance(out.len() as u64);
    assert!(enc.is_empty());
    Some(out)
}

fuzz_target!(|data: &[u8]| {
    let Some((limits, input)) = limits_from(data) else {
        return;
    };
    for features in [WireFeatures::NONE, WireFeatures::ALL] {
        check(input, &limits, features);
    }
});

/// The checks of the module documentation for `input` parsed on a connection with
/// `features`.
fn check(input: &[u8], limits: &Limits, features: WireFeatures) {
    let limits = *limits;
    let Some((repr, body, payload)) = parse(input, &limits, features) else {
        return;
    };
    let frame = &input[..repr.frame_len() as usize];
    let nb = NBody::of(&body);

    // The native values agree with the header.
    assert_eq!(nb.kind(), repr.kind);
    assert_eq!(nb.count(), repr.count, "{nb:?}");
    if let Some(inline) = nb.inline_bytes() {
        assert_eq!(inline, repr.payload_len as u64);
    }
    // `Body::tensors` lists the tensors in payload order, with their item index.
    let listed: Vec<(u32, NTensor)> = body
        .tensors()
        .map(|t| (t.index, NTensor::of(&t.meta)))
        .collect();
    let expected: Vec<(u32, NTensor)> = match &nb {
        NBody::Push(e) => e
            .iter()
            .enumerate()
            .map(|(i, (_, t))| (i as u32, t.clone()))
            .collect(),
        NBody::Response(e) => e
            .iter()
            .filter_map(|(i, _, t, ..)| t.clone().map(|t| (*i, t)))
            .collect(),
        NBody::Rows { push: true, tables } => tables
            .iter()
            .enumerate()
            .map(|(i, (_, t, ..))| (i as u32, t.clone()))
            .collect(),
        _ => Vec::new(),
    };
    assert_eq!(listed, expected);
    // Every tensor passes its checks again from native values, and the parsed meta equals
    // the native-built one (wire dims vs native dims).
    let parsed: Vec<TensorMeta<'_>> = body.tensors().map(|t| t.meta).collect();
    for (t, (_, n)) in parsed.iter().zip(&expected) {
        assert_eq!(n.meta().check(&limits), Ok(()));
        assert_eq!(*t, n.meta());
    }
    if let Some(h) = nb.hello() {
        assert_eq!(h.check(), Ok(()));
    }

    // Rebuild the header from the native values.
    let meta0 = nb.emit_meta(0x00);
    let meta1 = nb.emit_meta(0xff);
    assert_eq!(meta0, meta1, "an emitter left a byte unwritten");
    let rebuilt = HeaderRepr {
        kind: nb.kind(),
        count: nb.count(),
        meta_len: meta0.len() as u32,
        ..repr
    };
    assert_eq!(rebuilt, repr);
    let mut out = vec![0xa5; rebuilt.buffer_len()];
    rebuilt.emit(&mut Header::new_unchecked(&mut out[..]));
    out.extend_from_slice(&meta0);
    out.extend_from_slice(payload);

    assert!(
        out == frame,
        "re-emitted frame differs:\n in  {frame:02x?}\n out {out:02x?}"
    );
    let (repr2, body2, payload2) =
        parse(&out, &limits, features).expect("re-emitted frame rejected");
    assert_eq!(repr2, repr);
    assert_eq!(body2, body);
    assert_eq!(NBody::of(&body2), nb);
    assert_eq!(payload2, payload);

    if let Some(enc) = encoder_frame(&repr, &nb, payload, features) {
        assert!(
            enc == frame,
            "encoder frame differs:\n in  {frame:02x?}\n enc {enc:02x?}"
        );
    }
}
