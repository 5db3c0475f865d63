//! Encoder → bytes → decoder, split at every point, with direct placement and chunking.

use super::*;
use crate::wire::{DType, FrameKind, Limits, Status, TensorMeta, HEADER_LEN};
use std::collections::HashMap;

mod arena;

/// Serializes everything the encoder holds, resolving tensor tokens from `store`,
/// writing at most `max_write` bytes per "syscall".
fn drain(enc: &mut Encoder, store: &HashMap<u64, Vec<u8>>, max_write: u64) -> Vec<u8> {
    let mut out = Vec::new();
    while !enc.is_empty() {
        enc.fill(max_write);
        let mut written = 0u64;
        for piece in enc.pieces() {
            let bytes: &[u8] = match piece {
                Piece::Bytes(b) => b,
                Piece::Tensor { token, offset, len } => {
                    &store[&token][offset as usize..(offset + len) as usize]
                }
            };
            let take = (max_write - written).min(bytes.len() as u64) as usize;
            out.extend_from_slice(&bytes[..take]);
            written += take as u64;
            if written == max_write {
                break;
            }
        }
        enc.advance(written);
    }
    out
}

/// A decoded event with owned contents; payload pieces are merged per target.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Ev {
    Frame(FrameKind, u64, String),
    Payload(PayloadTarget, u64, Vec<u8>),
    End(FrameKind),
}

fn push_payload(evs: &mut Vec<Ev>, target: PayloadTarget, offset: u64, data: &[u8]) {
    if let Some(Ev::Payload(t, o, d)) = evs.last_mut() {
        if *t == target && *o + d.len() as u64 == offset {
            d.extend_from_slice(data);
            return;
        }
    }
    evs.push(Ev::Payload(target, offset, data.to_vec()));
}

/// Decodes `bytes` fed in pieces of the given sizes (cycled); returns events and the error.
fn decode(bytes: &[u8], pieces: &[usize], limits: Limits) -> (Vec<Ev>, Option<Error>) {
    let mut dec = Decoder::new(limits, 64);
    let mut evs = Vec::new();
    let mut at = 0;
    let mut i = 0;
    loop {
        loop {
            match dec.poll() {
                Ok(Some(Event::Frame(f))) => evs.push(Ev::Frame(
                    f.header.kind,
                    f.header.handle,
                    format!("{:?}", f.body),
                )),
                Ok(Some(Event::Payload {
                    target,
                    offset,
                    data,
                })) => push_payload(&mut evs, target, offset, data),
                Ok(Some(Event::FrameEnd(h))) => evs.push(Ev::End(h.kind)),
                Ok(None) => break,
                Err(e) => return (evs, Some(e)),
            }
        }
        if at == bytes.len() {
            return (evs, None);
        }
        let want = pieces[i % pieces.len()].max(1);
        i += 1;
        let end = at.saturating_add(want).min(bytes.len());
        at += dec.feed(&bytes[at..end]);
    }
}

fn sample_stream() -> (Vec<u8>, HashMap<u64, Vec<u8>>) {
    let mut store = HashMap::new();
    let big: Vec<u8> = (0..3000u32).map(|i| (i * 7) as u8).collect();
    let tiny = vec![1u8, 2, 3, 4, 5, 6, 7, 8];
    store.insert(1, big.clone());
    store.insert(2, tiny.clone());
    let mut enc = Encoder::new(EncoderConfig {
        inline_threshold: 16,
        ..EncoderConfig::default()
    });
    let hello = crate::wire::HelloRepr {
        cluster_id: 9,
        task_index: 2,
        limits: Limits { max_frame: 1 << 20, ..Limits::default() },
        job: b"worker",
        token: b"t",
        features: crate::wire::WireFeatures::NONE,
    };
    enc.hello(&hello, false).unwrap();
    enc.ping(0x1_0000_0001, b"abc").unwrap();
    enc.recv(0x1_0000_0002, 5, &[b"key-a".as_slice()], false)
        .unwrap();
    enc.recv(0x1_0000_0003, 5, &[b"k1".as_slice(), b"k2", b"k3"], true)
        .unwrap();
    enc.pull(0x1_0000_0004, &[10, 20, 30]).unwrap();
    let dims_big = [750u64];
    let dims_tiny = [2u64];
    let t_big = OutTensor {
        meta: TensorMeta::new(DType::F32, &dims_big).unwrap(),
        bytes: &big,
        token: 1,
    };
    let t_tiny = OutTensor {
        meta: TensorMeta::new(DType::I32, &dims_tiny).unwrap(),
        bytes: &tiny,
        token: 2,
    };
    enc.push(
        0x1_0000_0005,
        &[
            PushItem {
                var_id: 7,
                tensor: t_tiny,
            },
            PushItem {
                var_id: 8,
                tensor: t_big,
            },
        ],
    )
    .unwrap();
    enc.response(
        0x2_0000_0001,
        true,
        &[
            ResponseItem {
                versions: Default::default(),
                index: 1,
                status: Status::Ok,
                tensor: Some(t_big),
                missing: crate::wire::Missing::default(),
            },
            ResponseItem {
                versions: Default::default(),
                index: 0,
                status: Status::NotFound,
                tensor: None,
                missing: crate::wire::Missing::default(),
            },
            ResponseItem {
                versions: Default::default(),
                index: 2,
                status: Status::Ok,
                tensor: Some(OutTensor {
                    meta: TensorMeta::dead(DType::F32),
                    bytes: &[],
                    token: 0,
                }),
                missing: crate::wire::Missing::default(),
            },
        ],
    )
    .unwrap();
    enc.error(0x2_0000_0002, Status::NotFound, "no such key")
        .unwrap();
    let bytes = drain(&mut enc, &store, u64::MAX);
    (bytes, store)
}

#[test]
fn every_kind_round_trips_through_encoder_and_decoder() {
    let (bytes, store) = sample_stream();
    let (evs, err) = decode(&bytes, &[usize::MAX], Limits::default());
    assert_eq!(err, None);
    let kinds: Vec<FrameKind> = evs
        .iter()
        .filter_map(|e| match e {
            Ev::Frame(k, _, _) => Some(*k),
            _ => None,
        })
        .collect();
    use FrameKind::*;
    assert_eq!(
        kinds,
        [Hello, Ping, Recv, FusedRecv, Pull, Push, Response, Error]
    );
    let payloads: Vec<&Ev> = evs
        .iter()
        .filter(|e| matches!(e, Ev::Payload(..)))
        .collect();
    assert_eq!(
        payloads,
        [
            &Ev::Payload(PayloadTarget::Opaque, 0, b"abc".to_vec()),
            &Ev::Payload(PayloadTarget::Tensor { index: 0 }, 0, store[&2].clone()),
            &Ev::Payload(PayloadTarget::Tensor { index: 1 }, 0, store[&1].clone()),
            &Ev::Payload(PayloadTarget::Tensor { index: 1 }, 0, store[&1].clone()),
        ]
    );
    assert_eq!(evs.iter().filter(|e| matches!(e, Ev::End(_))).count(), 8);
}

#[test]
fn any_split_yields_the_same_events() {
    let (bytes, _) = sample_stream();
    let whole = decode(&bytes, &[usize::MAX], Limits::default());
    for piece in [1, 2, 3, 7, 31, 32, 33, 100, 4096] {
        assert_eq!(
            decode(&bytes, &[piece], Limits::default()),
            whole,
            "piece {piece}"
        );
    }
    // Every single split point.
    for cut in 1..bytes.len() {
        let got = decode(&bytes, &[cut, usize::MAX], Limits::default());
        assert_eq!(got, whole, "cut at {cut}");
    }
}

#[test]
fn large_payload_is_offered_for_direct_placement() {
    let payload: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    let dims = [100_000u64];
    let mut store = HashMap::new();
    store.insert(5, payload.clone());
    let mut enc = Encoder::new(EncoderConfig::default());
    let t = OutTensor {
        meta: TensorMeta::new(DType::U8, &dims).unwrap(),
        bytes: &payload,
        token: 5,
    };
    enc.push(
        0x1_0000_0009,
        &[PushItem {
            var_id: 1,
            tensor: t,
        }],
    )
    .unwrap();
    let bytes = drain(&mut enc, &store, u64::MAX);
    let meta_end = bytes.len() - payload.len();

    let mut dec = Decoder::new(Limits::default(), 4096);
    // Header and meta arrive, plus the first 10 payload bytes in the same read.
    assert_eq!(dec.feed(&bytes[..meta_end + 10]), meta_end + 10);
    assert!(matches!(dec.poll(), Ok(Some(Event::Frame(_)))));
    // The 10 buffered bytes are handed out by copy first.
    match dec.poll() {
        Ok(Some(Event::Payload { offset, data, .. })) => {
            assert_eq!((offset, data), (0, &payload[..10]));
        }
        other => panic!("expected payload, got {other:?}"),
    }
    assert_eq!(dec.poll(), Ok(None));
    // Then the decoder says the rest may go straight to its destination.
    let mut dest = vec![0u8; payload.len()];
    dest[..10].copy_from_slice(&payload[..10]);
    let mut at = meta_end + 10;
    while let NextRead::Payload {
        target,
        offset,
        len,
    } = dec.next_read()
    {
        assert_eq!(target, PayloadTarget::Tensor { index: 0 });
        let n = (len as usize).min(7777);
        dest[offset as usize..offset as usize + n].copy_from_slice(&bytes[at..at + n]);
        at += n;
        dec.payload_received(n as u64);
    }
    assert_eq!(at, bytes.len());
    assert!(matches!(dec.poll(), Ok(Some(Event::FrameEnd(_)))));
    assert_eq!(dest, payload);
    assert_eq!(dec.bytes_copied(), 10);
    assert_eq!(dec.bytes_direct(), payload.len() as u64 - 10);
    assert!(dec.is_idle());
}

#[test]
fn large_tensor_is_chunked_and_small_frames_interleave() {
    let big: Vec<u8> = (0..1_000_000u32).map(|i| (i % 253) as u8).collect();
    let dims = [1_000_000u64];
    let mut store = HashMap::new();
    store.insert(3, big.clone());
    let mut enc = Encoder::new(EncoderConfig {
        chunk_size: 64 << 10,
        max_frame: 1 << 20,
        ..EncoderConfig::default()
    });
    let t = OutTensor {
        meta: TensorMeta::new(DType::U8, &dims).unwrap(),
        bytes: &big,
        token: 3,
    };
    enc.response(
        0x1_0000_0001,
        true,
        &[ResponseItem {
            versions: Default::default(),
            index: 0,
            status: Status::Ok,
            tensor: Some(t),
            missing: crate::wire::Missing::default(),
        }],
    )
    .unwrap();
    // Write one chunk's worth, then a ping is queued: it must go out before the next chunk.
    let mut out = Vec::new();
    for _ in 0..2 {
        enc.fill(1);
        let written: Vec<u8> = pieces_bytes(&enc, &store);
        enc.advance(written.len() as u64);
        out.extend_from_slice(&written);
    }
    enc.ping(0x1_0000_0002, b"hi").unwrap();
    out.extend(drain(&mut enc, &store, 100_000));

    let (evs, err) = decode(&out, &[9000], Limits::default());
    assert_eq!(err, None);
    let frames: Vec<FrameKind> = evs
        .iter()
        .filter_map(|e| match e {
            Ev::Frame(k, _, _) => Some(*k),
            _ => None,
        })
        .collect();
    assert_eq!(frames[0], FrameKind::Response);
    assert_eq!(frames[1], FrameKind::Chunk);
    assert_eq!(
        frames[2],
        FrameKind::Ping,
        "ping interleaves after the first chunk"
    );
    assert_eq!(frames.iter().filter(|k| **k == FrameKind::Chunk).count(), 16);
    let mut got = vec![0u8; big.len()];
    for e in &evs {
        if let Ev::Payload(PayloadTarget::Chunk { handle, index }, off, d) = e {
            assert_eq!((*handle, *index), (0x1_0000_0001, 0));
            got[*off as usize..*off as usize + d.len()].copy_from_slice(d);
        }
    }
    assert_eq!(got, big);
}

fn pieces_bytes(enc: &Encoder, store: &HashMap<u64, Vec<u8>>) -> Vec<u8> {
    let mut v = Vec::new();
    for p in enc.pieces() {
        match p {
            Piece::Bytes(b) => v.extend_from_slice(b),
            Piece::Tensor { token, offset, len } => {
                v.extend_from_slice(&store[&token][offset as usize..(offset + len) as usize])
            }
        }
    }
    v
}

#[test]
fn tensors_over_the_frame_room_are_chunked() {
    // Three 30 KiB tensors against a 64 KiB frame limit: two fit inline, one is chunked.
    let data = vec![7u8; 30 << 10];
    let dims = [30u64 << 10];
    let mut store = HashMap::new();
    store.insert(1, data.clone());
    let mut enc = Encoder::new(EncoderConfig {
        max_frame: Limits::MIN_FRAME,
        ..EncoderConfig::default()
    });
    let t = OutTensor {
        meta: TensorMeta::new(DType::U8, &dims).unwrap(),
        bytes: &data,
        token: 1,
    };
    let items: Vec<PushItem> = (0..3)
        .map(|i| PushItem {
            var_id: i,
            tensor: t,
        })
        .collect();
    enc.push(0x1_0000_0001, &items).unwrap();
    let bytes = drain(&mut enc, &store, u64::MAX);
    let limits = Limits {
        max_frame: Limits::MIN_FRAME,
        ..Limits::default()
    };
    let (evs, err) = decode(&bytes, &[5000], limits);
    assert_eq!(err, None);
    assert!(evs.iter().any(|e| matches!(e, Ev::Frame(FrameKind::Chunk, ..))));
    let total: usize = evs
        .iter()
        .map(|e| match e {
            Ev::Payload(_, _, d) => d.len(),
            _ => 0,
        })
        .sum();
    assert_eq!(total, 3 * data.len());
}

#[test]
fn errors_are_precise_and_poison_the_decoder() {
    let (mut bytes, _) = sample_stream();
    bytes[0] = b'X';
    let (evs, err) = decode(&bytes, &[usize::MAX], Limits::default());
    assert!(evs.is_empty());
    assert_eq!(err, Some(Error::Wire(crate::wire::Error::BadMagic)));

    let mut dec = Decoder::new(Limits::default(), 64);
    dec.feed(&bytes);
    assert!(dec.poll().is_err());
    assert_eq!(dec.poll(), Err(Error::Poisoned));
}

fn chunk_frame(handle: u64, index: u32, offset: u64, payload: &[u8]) -> Vec<u8> {
    let h = crate::wire::HeaderRepr {
        kind: FrameKind::Chunk,
        end: false,
        status: Status::Ok,
        timeout_ms: 0,
        count: 1,
        handle,
        meta_len: 16,
        payload_len: payload.len() as u32,
    };
    let mut v = vec![0u8; HEADER_LEN + 16];
    h.emit(&mut crate::wire::Header::new_unchecked(&mut v[..]));
    crate::wire::ChunkRepr { index, offset }.emit(&mut v[HEADER_LEN..]);
    v.extend_from_slice(payload);
    v
}

#[test]
fn chunk_sequencing_is_enforced() {
    // A chunk with nothing declared.
    let (_, err) = decode(
        &chunk_frame(1, 0, 0, b"x"),
        &[usize::MAX],
        Limits::default(),
    );
    assert_eq!(err, Some(Error::UnexpectedChunk));

    // Declare a 4-byte chunked tensor, then send chunks with wrong handle, index, offset, length.
    let mut enc = Encoder::new(EncoderConfig {
        chunk_size: 1,
        ..EncoderConfig::default()
    });
    let data = [1u8, 2, 3, 4];
    let dims = [4u64];
    let t = OutTensor {
        meta: TensorMeta::new(DType::U8, &dims).unwrap(),
        bytes: &data,
        token: 1,
    };
    enc.push(
        0x1_0000_0001,
        &[PushItem {
            var_id: 0,
            tensor: t,
        }],
    )
    .unwrap();
    enc.fill(0);
    let decl = pieces_bytes(&enc, &HashMap::new());
    assert_eq!(enc.chunks_pending(), 1);
    let cases = [
        (chunk_frame(2, 0, 0, b"a"), Error::ChunkMismatch),
        (chunk_frame(0x1_0000_0001, 1, 0, b"a"), Error::ChunkMismatch),
        (chunk_frame(0x1_0000_0001, 0, 1, b"a"), Error::ChunkMismatch),
        (
            chunk_frame(0x1_0000_0001, 0, 0, b"abcde"),
            Error::ChunkMismatch,
        ),
    ];
    for (frame, want) in cases {
        let mut bytes = decl.clone();
        bytes.extend_from_slice(&frame);
        let (_, err) = decode(&bytes, &[usize::MAX], Limits::default());
        assert_eq!(err, Some(want));
    }
    // The right sequence is accepted.
    let mut bytes = decl.clone();
    for i in 0..4u64 {
        bytes.extend(chunk_frame(
            0x1_0000_0001,
            0,
            i,
            &data[i as usize..i as usize + 1],
        ));
    }
    let (_, err) = decode(&bytes, &[3], Limits::default());
    assert_eq!(err, None);
}

#[test]
fn buffer_grows_only_with_arriving_bytes() {
    // A header announcing a 1 MiB meta section, followed by only 100 bytes.
    let h = crate::wire::HeaderRepr {
        kind: FrameKind::FusedRecv,
        end: false,
        status: Status::Ok,
        timeout_ms: 0,
        count: 1,
        handle: 1,
        meta_len: 1 << 20,
        payload_len: 0,
    };
    let mut v = vec![0u8; HEADER_LEN];
    h.emit(&mut crate::wire::Header::new_unchecked(&mut v[..]));
    v.extend_from_slice(&[0u8; 100]);
    let mut dec = Decoder::new(Limits::default(), 64);
    let mut at = 0;
    while at < v.len() {
        at += dec.feed(&v[at..]);
        assert_eq!(dec.poll(), Ok(None));
    }
    assert!(dec.spare().len() < 1024, "no allocation ahead of the bytes");
}

#[test]
fn frame_over_limit_is_rejected_from_the_header() {
    let h = crate::wire::HeaderRepr {
        kind: FrameKind::Ping,
        end: false,
        status: Status::Ok,
        timeout_ms: 0,
        count: 0,
        handle: 1,
        meta_len: 0,
        payload_len: u32::MAX,
    };
    let mut v = vec![0u8; HEADER_LEN];
    h.emit(&mut crate::wire::Header::new_unchecked(&mut v[..]));
    let (_, err) = decode(&v, &[usize::MAX], Limits::default());
    assert!(matches!(
        err,
        Some(Error::Wire(crate::wire::Error::FrameTooLarge { .. }))
    ));
}

#[test]
fn encoder_rejects_what_the_peer_cannot_take() {
    let mut enc = Encoder::new(EncoderConfig {
        max_frame: Limits::MIN_FRAME,
        ..EncoderConfig::default()
    });
    assert!(matches!(
        enc.ping(1, &vec![0u8; 70_000]),
        Err(EncodeError::FrameTooLarge { .. })
    ));
    assert_eq!(
        enc.recv::<&[u8]>(1, 0, &[], true),
        Err(EncodeError::BadCount)
    );
    assert_eq!(
        enc.recv(1, 0, &[b"".as_slice()], true),
        Err(EncodeError::BadKey)
    );
    let dims = [4u64];
    let t = OutTensor {
        meta: TensorMeta::new(DType::U8, &dims).unwrap(),
        bytes: &[1, 2, 3],
        token: 0,
    };
    assert_eq!(
        enc.push(
            1,
            &[PushItem {
                var_id: 0,
                tensor: t
            }]
        ),
        Err(EncodeError::BadTensor)
    );
    assert!(enc.is_empty(), "nothing queued by failed calls");
}

#[test]
fn buffer_returns_to_its_capacity_after_a_large_meta() {
    let keys: Vec<Vec<u8>> = (0..2000)
        .map(|i| format!("key-{i:06}").into_bytes())
        .collect();
    let mut enc = Encoder::new(EncoderConfig::default());
    enc.recv(1, 0, &keys, true).unwrap();
    enc.ping(2, b"x").unwrap();
    let bytes = drain(&mut enc, &HashMap::new(), u64::MAX);
    let mut dec = Decoder::new(Limits::default(), 4096);
    let mut at = 0;
    let mut largest = 0;
    while at < bytes.len() {
        let spare = dec.spare();
        largest = largest.max(spare.len());
        let n = spare.len().min(bytes.len() - at);
        spare[..n].copy_from_slice(&bytes[at..at + n]);
        dec.filled(n);
        at += n;
        while let Ok(Some(_)) = dec.poll() {}
    }
    assert!(largest > 4096, "the meta section needed a larger buffer");
    assert!(dec.is_idle());
    assert_eq!(dec.spare().len(), 4096, "back to the initial capacity");
}

#[test]
fn a_given_buffer_stays_in_place_through_growth_and_comes_back() {
    let keys: Vec<Vec<u8>> = (0..2000)
        .map(|i| format!("key-{i:06}").into_bytes())
        .collect();
    let mut enc = Encoder::new(EncoderConfig::default());
    enc.ping(1, b"first").unwrap();
    enc.recv(2, 0, &keys, true).unwrap();
    enc.ping(3, b"x").unwrap();
    let bytes = drain(&mut enc, &HashMap::new(), u64::MAX);
    let mut given = vec![0u8; 4096];
    let home = given.as_mut_ptr() as usize;
    let mut dec = Decoder::with_buffer(Limits::default(), given);
    assert_eq!(dec.last_payload_max(), None);
    let (mut at, mut grew, mut frames) = (0, false, 0);
    while at < bytes.len() {
        let spare = dec.spare();
        let (start, len) = (spare.as_ptr() as usize, spare.len());
        // Every read lands in the given buffer, unless a larger one holds a large meta.
        let inside = start >= home && start + len <= home + 4096;
        assert_eq!(dec.in_home_buffer(), inside);
        grew |= !dec.in_home_buffer();
        let spare = dec.spare();
        let n = spare.len().min(bytes.len() - at).min(1000);
        spare[..n].copy_from_slice(&bytes[at..at + n]);
        dec.filled(n);
        at += n;
        while let Ok(Some(ev)) = dec.poll() {
            if let Event::Frame(f) = ev {
                frames += 1;
                let expect = match f.header.kind {
                    FrameKind::Ping => 5,
                    _ => 0,
                };
                if frames == 1 {
                    assert_eq!(f.header.kind, FrameKind::Ping);
                    assert_eq!(dec.last_payload_max(), Some(expect));
                }
            }
        }
    }
    assert!(grew, "the meta section needed a larger buffer");
    assert_eq!(frames, 3);
    assert_eq!(dec.last_payload_max(), Some(1), "the last ping's payload");
    assert!(dec.in_home_buffer());
    assert_eq!(dec.spare().as_ptr() as usize, home);
    let back = dec.swap_buffer(vec![0; 64]);
    assert_eq!((back.as_ptr() as usize, back.len()), (home, 4096));
}

#[test]
fn tokens_are_released_once_their_bytes_are_no_longer_needed() {
    fn t<'a>(dims: &'a [u64], bytes: &'a [u8], token: u64) -> OutTensor<'a> {
        OutTensor {
            meta: TensorMeta::new(DType::U8, dims).unwrap(),
            bytes,
            token,
        }
    }
    let (tiny, big, huge) = (vec![1u8; 8], vec![2u8; 10_000], vec![3u8; 200_000]);
    let (d_tiny, d_big, d_huge) = ([8u64], [10_000u64], [200_000u64]);
    let mut store = HashMap::new();
    store.insert(2, big.clone());
    store.insert(3, huge.clone());
    let mut enc = Encoder::new(EncoderConfig {
        chunk_size: 64 << 10,
        ..EncoderConfig::default()
    });
    let dead = OutTensor {
        meta: TensorMeta::dead(DType::F32),
        bytes: &[],
        token: 4,
    };
    let items = [
        PushItem {
            var_id: 1,
            tensor: t(&d_tiny, &tiny, 1),
        },
        PushItem {
            var_id: 2,
            tensor: t(&d_big, &big, 2),
        },
        PushItem {
            var_id: 3,
            tensor: t(&d_huge, &huge, 3),
        },
        PushItem {
            var_id: 4,
            tensor: dead,
        },
    ];
    enc.push(1, &items).unwrap();
    let mut released = Vec::new();
    enc.take_released(|t| released.push(t));
    assert_eq!(
        released,
        [1, 4],
        "copied and dead tensors are released at once"
    );
    let _ = drain(&mut enc, &store, 4096);
    enc.take_released(|t| released.push(t));
    assert_eq!(
        released,
        [1, 4, 2, 3],
        "referenced ones once written, each once"
    );
}

/// Writes like the event loop: the blocks pieces are in are lent out for the write, partial
/// writes included, and come back before `advance`.
fn drain_lent(enc: &mut Encoder, max_write: u64) -> Vec<u8> {
    let mut out = Vec::new();
    while !enc.is_empty() {
        enc.fill(max_write);
        let mut lent: Vec<(u32, Box<[u8]>)> = Vec::new();
        let mut pieces = Vec::new();
        let mut i = 0;
        while let Some(p) = enc.out_piece(i) {
            i += 1;
            if let OutPiece::Arena { block, start, len } = p {
                if let Some(buf) = enc.lend_block(block) {
                    lent.push((block, buf));
                }
                pieces.push((block, start, len));
            }
        }
        // A lent block is written into no more: a frame queued now goes elsewhere.
        let mut written = 0u64;
        for &(block, start, len) in &pieces {
            let buf = &lent.iter().find(|(b, _)| *b == block).expect("lent").1;
            let take = (max_write - written).min(len as u64) as usize;
            out.extend_from_slice(&buf[start..start + take]);
            written += take as u64;
            if written == max_write {
                break;
            }
        }
        for (block, buf) in lent {
            enc.restore_block(block, buf);
        }
        enc.advance(written);
    }
    out
}

#[test]
fn lent_blocks_are_not_written_while_out_and_are_reused_once_back() {
    let mut enc = Encoder::new(EncoderConfig::default());
    let mut expected = Vec::new();
    for round in 0..1000u64 {
        enc.ping(round + 1, &[round as u8; 40]).unwrap();
        // Lend the block holding the ping, then queue a pong while it is out.
        let Some(OutPiece::Arena { block, start, len }) = enc.out_piece(0) else {
            panic!("no arena piece");
        };
        let buf = enc.lend_block(block).expect("not lent yet");
        assert!(enc.lend_block(block).is_none(), "lent twice");
        enc.pong(round + 1, &[0xEE; 24]).unwrap();
        let ping = buf[start..start + len].to_vec();
        // The pong went into another block: the lent bytes are unchanged.
        assert_eq!(ping.len(), HEADER_LEN + 40);
        assert_eq!(&ping[HEADER_LEN..], &[round as u8; 40][..]);
        enc.restore_block(block, buf);
        expected.extend_from_slice(&ping);
        let rest = drain_lent(&mut enc, 1 << 20);
        // The ping's bytes are first again (nothing was advanced), then the pong.
        assert_eq!(&rest[..ping.len()], &ping[..]);
        assert_eq!(rest.len(), ping.len() + HEADER_LEN + 24);
        // Steady state: two blocks, reused round after round (no allocation).
        assert!(enc.block_count() <= 2, "round {round}: {} blocks", enc.block_count());
    }
    assert!(enc.is_empty());
}

#[test]
fn partial_writes_from_lent_blocks_deliver_every_byte_once() {
    let mut plain = Encoder::new(EncoderConfig::default());
    let mut lent = Encoder::new(EncoderConfig::default());
    for i in 0..300u64 {
        let payload = vec![(i % 251) as u8; (i as usize * 37) % 900];
        plain.ping(i + 1, &payload).unwrap();
        lent.ping(i + 1, &payload).unwrap();
    }
    let want = drain(&mut plain, &HashMap::new(), 777);
    assert_eq!(drain_lent(&mut lent, 777), want);
    assert!(lent.block_count() <= 1 + super::arena::FREE_BLOCKS_KEPT);
}

/// A stream of rows frames: a `PULL_ROWS` of two tables, a `PUSH_ROWS` of two tables (one
/// block copied into the frame, one sent from its own memory), an answer whose block the
/// table writes straight into the frame with a report of missing rows, and an answer whose
/// block is too large for one frame and travels in chunks.
fn rows_stream() -> (Vec<u8>, HashMap<u64, Vec<u8>>) {
    let mut store = HashMap::new();
    let mut enc = Encoder::new(EncoderConfig {
        inline_threshold: 16,
        chunk_size: 1024,
        ..EncoderConfig::default()
    });
    let (a, b) = ([3u64, 1, 4], [1u64, 5]);
    let (dims_a, dims_b) = ([3u64, 2], [2u64, 3]);
    let meta_a = TensorMeta::new(DType::F32, &dims_a).unwrap();
    let meta_b = TensorMeta::new(DType::F32, &dims_b).unwrap();
    let queries = [
        RowsQuery {
            held: &[],
            table: 7,
            block: meta_a,
            ids: &a,
        },
        RowsQuery {
            held: &[],
            table: 9,
            block: meta_b,
            ids: &b,
        },
    ];
    enc.pull_rows(0x1_0000_0001, &queries).unwrap();
    let copied: Vec<u8> = (0..24u8).collect();
    let referenced: Vec<u8> = (100..124u8).collect();
    store.insert(5, referenced.clone());
    let rows = [
        RowsItem {
            table: 7,
            ids: &a,
            block: OutTensor {
                meta: meta_a,
                bytes: &copied,
                token: COPY_TOKEN,
            },
            loss_scale: None,
        },
        RowsItem {
            table: 9,
            ids: &b,
            block: OutTensor {
                meta: meta_b,
                bytes: &referenced,
                token: 5,
            },
            loss_scale: None,
        },
    ];
    enc.push_rows(0x1_0000_0002, &rows).unwrap();
    let (mut missing, mut spill) = (Vec::new(), Vec::new());
    let direct = enc.response_block(
        0x1_0000_0001,
        false,
        0,
        &meta_a,
        &mut missing,
        &mut spill,
        |out, missing| {
            out.iter_mut().enumerate().for_each(|(i, b)| *b = i as u8);
            missing.push(1);
            Status::Ok
        },
    );
    // Rows are missing: the block and the report go in an answer of their own.
    let status = direct.unwrap().expect("missing rows are not answered in place");
    assert_eq!(status, Status::Ok);
    enc.response(
        0x1_0000_0001,
        false,
        &[ResponseItem {
            versions: Default::default(),
            index: 0,
            status,
            tensor: Some(OutTensor {
                meta: meta_a,
                bytes: &spill,
                token: COPY_TOKEN,
            }),
            missing: crate::wire::Missing::Native(&missing),
        }],
    )
    .unwrap();
    let dims_big = [1000u64, 3];
    let big: Vec<u8> = (0..12_000u32).map(|i| (i % 241) as u8).collect();
    store.insert(6, big.clone());
    enc.response(
        0x1_0000_0001,
        true,
        &[ResponseItem {
            versions: Default::default(),
            index: 1,
            status: Status::Ok,
            tensor: Some(OutTensor {
                meta: TensorMeta::new(DType::F32, &dims_big).unwrap(),
                bytes: &big,
                token: 6,
            }),
            missing: crate::wire::Missing::default(),
        }],
    )
    .unwrap();
    (drain(&mut enc, &store, u64::MAX), store)
}

#[test]
fn a_rows_stream_survives_every_split_point() {
    let (bytes, store) = rows_stream();
    let whole = decode(&bytes, &[usize::MAX], Limits::default());
    assert_eq!(whole.1, None);
    let kinds: Vec<FrameKind> = whole
        .0
        .iter()
        .filter_map(|e| match e {
            Ev::Frame(k, _, _) => Some(*k),
            _ => None,
        })
        .collect();
    use FrameKind::*;
    assert_eq!(kinds[..4], [PullRows, PushRows, Response, Response]);
    assert!(
        kinds[4..].iter().all(|k| *k == Chunk) && kinds.len() > 5,
        "the large block travels in chunks: {kinds:?}"
    );
    // The referenced block and the chunked one arrive intact.
    let payload_of = |target: PayloadTarget| -> Vec<u8> {
        whole
            .0
            .iter()
            .filter_map(|e| match e {
                Ev::Payload(t, _, d) if *t == target => Some(d.clone()),
                _ => None,
            })
            .flatten()
            .collect()
    };
    let pushed = payload_of(PayloadTarget::Tensor { index: 1 });
    assert!(pushed.ends_with(&store[&5]), "the referenced block follows the copied one");
    let chunked = payload_of(PayloadTarget::Chunk {
        handle: 0x1_0000_0001,
        index: 1,
    });
    assert_eq!(chunked, store[&6]);
    for cut in 1..bytes.len() {
        let got = decode(&bytes, &[cut, usize::MAX], Limits::default());
        assert_eq!(got, whole, "cut at {cut}");
    }
    for piece in [1, 2, 3, 7, 31, 100, 1000] {
        let got = decode(&bytes, &[piece], Limits::default());
        assert_eq!(got, whole, "pieces of {piece}");
    }
}
