//! A server `Connection` decoding a peer's stream while its owner pauses it, as the session
//! does when a peer's answers pile up: what it decodes, answers and counts must be exactly
//! what it does when it is never paused.
//!
//! Input layout (the first six bytes as in `stream_decoder`, so its raw seeds serve here):
//!
//! - byte 0: bits 0–2 pick the receive buffer's initial capacity, bits 3–4 the server's
//!   limits, bits 5–7 the limits the peer announces in its `HELLO`.
//! - byte 1: the pattern of `Flow::Pause` the owner returns besides the backlog's.
//! - bytes 2–5: piece sizes the stream is fed in; bytes 2 and 3 also pick the answer
//!   backlog and how much output is written between two reads.
//! - the rest: the stream after the peer's `HELLO` (which the target writes itself).
//!
//! The stream is decoded twice. The **reference** run feeds it whole and never pauses. The
//! **paused** run feeds it in pieces and writes the server's output a little at a time; its
//! owner answers each request it is handed (an `ERROR`, or a `RESPONSE` of status items,
//! both copied into the encoder's arena) and returns `Flow::Pause` by the pattern and
//! whenever the encoder's `copied_bytes` reach the backlog, which it also does not call
//! `process` over (the session's rule: it stops reading, the kernel takes output). Checked:
//!
//! - once the owner asked to pause, no frame begins in that call (no `Frame`, no `Opened`,
//!   no `PING` answered): the call ends at a frame boundary (`at_frame_start`, nothing of a
//!   frame's payload owed), or inside the frame the pause came in when its buffered bytes
//!   ran out (nothing buffered, payload awaited), unless the connection closed;
//! - what is queued when a frame is handed out stays within the backlog plus what the
//!   connection queued itself in that call (`PONG`s, its `HELLO_ACK`), so what is queued
//!   when the call returns is at most that plus the last frame's answers;
//! - the handshake adopts the peer's announced limits (`set_peer_limits`: the encoder's
//!   `peer_limits` and `max_frame`);
//! - both runs hand out the same events (frames, payload as runs of bytes, frame ends),
//!   end the same way, answer the same `PING`s, write byte for byte the same output,
//!   count the same frames in and out and the same payload of each sort, and end owing
//!   the same bytes (`owed()`, chunked tensors pending);
//! - the output is what the peer accepts: decoded by a `Decoder` with the limits the peer
//!   announced, every frame passes them (4.1: a `PONG` over the peer's `max_frame` becomes
//!   an `ERROR`, error messages are cut to 1,024 bytes, the owner splits its answers by
//!   the peer's `max_tensors` as the session does), the output ends at a frame boundary,
//!   and it holds exactly the frames the encoder counted.
#![no_main]

use libfuzzer_sys::fuzz_target;
use starwire::proto::{
    CloseReason, ConnEvent, Connection, Decoder, Encoder, EncoderConfig, Flow, Identity, NextRead,
    Owed, Piece, ResponseItem,
};
use starwire::wire::{FrameKind, HeaderRepr, HelloRepr, Limits, Side, Status, WireFeatures};

#[path = "common/native.rs"]
mod native;

use native::{limits_for, piece_size, target_key, NBody, TargetKey, CAPACITIES};

const CLUSTER: u64 = 0x5eed;

/// What the owner of the connection was handed, payload merged into runs.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    Opened,
    Frame(HeaderRepr, NBody),
    Payload(TargetKey, u64, Vec<u8>),
    End(HeaderRepr),
}

#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    seen: Vec<Seen>,
    closed: Option<CloseReason>,
    pings: (u64, u64),
    out: Vec<u8>,
    /// The decoder's frames and payload bytes (chunks, other), the encoder's frames.
    counts: (u64, u64, u64, u64),
    /// What the stream still owed at the end, and the chunked tensors still pending.
    owed: (Owed, usize),
}

/// How the paused run behaves.
#[derive(Clone, Copy)]
struct Policy {
    /// Pause when `copied_bytes` reach this (and do not decode over it).
    backlog: u64,
    /// Pause after event `i` when bit `i % 8` is set.
    pattern: u8,
    /// Output bytes written between two reads (0: none while input remains).
    write: u64,
}

fn record(seen: &mut Vec<Seen>, ev: &ConnEvent<'_>) {
    match ev {
        ConnEvent::Opened => seen.push(Seen::Opened),
        ConnEvent::Frame(f) => seen.push(Seen::Frame(f.header, NBody::of(&f.body))),
        ConnEvent::Payload {
            target,
            offset,
            data,
        } => {
            let key = target_key(*target);
            if let Some(Seen::Payload(k, at, bytes)) = seen.last_mut() {
                if *k == key && *at + bytes.len() as u64 == *offset {
                    bytes.extend_from_slice(data);
                    return;
                }
            }
            seen.push(Seen::Payload(key, *offset, data.to_vec()));
        }
        ConnEvent::FrameEnd(h) => seen.push(Seen::End(*h)),
    }
}

/// The owner's answer to a request frame: deterministic, copied into the arena.
fn answer(enc: &mut Encoder, h: &HeaderRepr) {
    let request = matches!(
        h.kind,
        FrameKind::Recv
            | FrameKind::FusedRecv
            | FrameKind::Pull
            | FrameKind::Push
            | FrameKind::PullRows
            | FrameKind::PushRows
            | FrameKind::Stats
            | FrameKind::Checkpoint
    );
    if !request {
        return;
    }
    if h.handle & 1 == 0 {
        let items: Vec<ResponseItem<'_>> = (0..h.count.clamp(1, 300))
            .map(|index| ResponseItem {
                index,
                status: Status::NotFound,
                tensor: None,
                missing: Default::default(),
                versions: Default::default(),
            })
            .collect();
        // As the session does: no more entries in a frame than the peer takes (4.5).
        let most = (enc.peer_limits().max_tensors as usize).max(1);
        for (i, part) in items.chunks(most).enumerate() {
            let last = (i + 1) * most >= items.len();
            let _ = enc.response(h.handle, last, part);
        }
    } else {
        let message = "x".repeat((h.handle >> 8) as usize % 1025);
        let _ = enc.error(h.handle, Status::Internal, &message);
    }
}

/// Writes up to `max` bytes of the connection's output into `out`.
fn write(conn: &mut Connection, max: u64, out: &mut Vec<u8>) {
    let enc = conn.encoder();
    enc.fill(1 << 20);
    let mut written = 0u64;
    for p in enc.pieces() {
        if written == max {
            break;
        }
        let Piece::Bytes(b) = p else {
            panic!("the server's answers reference no tensor");
        };
        let n = b.len().min((max - written) as usize);
        out.extend_from_slice(&b[..n]);
        written += n as u64;
    }
    enc.advance(written);
}

fn server(limits: Limits, capacity: usize) -> Connection {
    let identity = Identity {
        cluster_id: CLUSTER,
        job: b"ps".iter().copied().collect(),
        task_index: 0,
        token: None,
        // The server announces every feature; whether it is used is the peer's HELLO's.
        features: WireFeatures::ALL,
    };
    let cfg = EncoderConfig {
        chunk_size: 4096,
        ..EncoderConfig::default()
    };
    Connection::new(Side::Server, identity, limits, capacity, cfg)
}

/// Decodes `stream` on a new server connection: fed in `pieces` (whole when empty), paused
/// and written out as `policy` says (never paused, written at the end when `None`).
fn run(
    stream: &[u8],
    limits: Limits,
    capacity: usize,
    peer: Limits,
    pieces: &[usize],
    policy: Option<Policy>,
) -> Outcome {
    let mut conn = server(limits, capacity);
    let (mut seen, mut out) = (Vec::new(), Vec::new());
    let (mut pos, mut step, mut events) = (0usize, 0usize, 0usize);
    let mut rounds = 0u32;
    loop {
        rounds += 1;
        assert!(rounds < 1_000_000, "the connection never finishes");
        let enc_copied = conn.encoder().copied_bytes();
        if let Some(p) = policy.filter(|p| enc_copied >= p.backlog) {
            // Over the backlog: not read until the kernel takes output.
            write(&mut conn, p.write.max(16), &mut out);
            continue;
        }
        // Whether the owner asked to pause in this call; the encoder's frame count after its
        // last call; what was queued when the last frame handed out began; what the
        // connection queued itself in this call (PONGs, the HELLO_ACK), between the owner's
        // events, and the count after the owner's last event.
        let mut paused = false;
        let mut frames_out = conn.encoder().frames_out();
        let mut last_frame_from = conn.encoder().copied_bytes();
        let (mut own, mut copied_after) = (0u64, conn.encoder().copied_bytes());
        let mut opened = false;
        let progressed = conn.process(|ev, enc| {
            assert!(
                !paused || !matches!(ev, ConnEvent::Frame(_) | ConnEvent::Opened),
                "a frame began after the owner paused"
            );
            own += enc.copied_bytes() - copied_after;
            record(&mut seen, &ev);
            match &ev {
                ConnEvent::Opened => opened = true,
                ConnEvent::Frame(f) => {
                    last_frame_from = enc.copied_bytes();
                    answer(enc, &f.header);
                }
                _ => {}
            }
            events += 1;
            frames_out = enc.frames_out();
            copied_after = enc.copied_bytes();
            let Some(p) = policy else {
                return Flow::Continue;
            };
            paused |= p.pattern & (1 << (events % 8)) != 0 || enc.copied_bytes() >= p.backlog;
            if paused {
                Flow::Pause
            } else {
                Flow::Continue
            }
        });
        if opened {
            // The handshake adopted what the peer announced.
            assert_eq!(conn.peer().map(|p| p.limits), Some(peer));
            assert_eq!(conn.encoder().peer_limits(), &peer);
            assert_eq!(conn.encoder().config().max_frame, peer.max_frame);
        }
        if let (Some(p), true) = (policy, paused) {
            if !conn.is_closed() {
                // Stopped at a frame boundary, or inside the frame the pause came in when its
                // bytes ran out; no frame begun past it (not even a PING: it would have
                // queued its PONG).
                let dec = conn.decoder();
                let starved =
                    dec.buffered() == 0 && matches!(dec.next_read(), NextRead::Payload { .. });
                assert!(
                    dec.at_frame_start() || starved,
                    "paused inside a frame with its bytes at hand"
                );
                if dec.at_frame_start() {
                    assert_eq!(
                        dec.owed().frame,
                        0,
                        "between frames owing a frame's payload"
                    );
                }
                assert_eq!(
                    conn.encoder().frames_out(),
                    frames_out,
                    "a PING answered after the pause"
                );
            }
            // Within the backlog, but for what the connection queued itself in this call
            // (PONGs as long as their PINGs) and the last frame's answers: the owner was
            // asked before every frame it was handed.
            assert!(
                last_frame_from <= p.backlog + own,
                "{last_frame_from} queued when a frame began: backlog {}, the connection's own {own}",
                p.backlog
            );
        }
        if let Some(p) = policy {
            write(&mut conn, p.write, &mut out);
        }
        if conn.is_closed() {
            break;
        }
        if paused {
            continue; // resumed by the next call
        }
        if pos < stream.len() {
            step += 1;
            let want = match pieces {
                [] => stream.len() - pos,
                p => p[step % p.len()].min(stream.len() - pos),
            };
            let mut fed = 0;
            while fed < want {
                let n = conn.decoder().feed(&stream[pos + fed..pos + want]);
                if n == 0 {
                    break;
                }
                fed += n;
            }
            assert!(
                fed > 0 || progressed,
                "the decoder takes no bytes and decodes none"
            );
            pos += fed;
            continue;
        }
        if !progressed {
            break;
        }
    }
    while !conn.encoder().is_empty() {
        write(&mut conn, u64::MAX, &mut out);
    }
    let frames_out = conn.encoder().frames_out();
    let dec = conn.decoder();
    let counts = (
        dec.frames_in(),
        dec.chunk_bytes_in(),
        dec.frame_bytes_in(),
        frames_out,
    );
    let owed = (dec.owed(), dec.chunks_pending());
    Outcome {
        seen,
        closed: conn.close_reason().cloned(),
        pings: conn.pings(),
        out,
        counts,
        owed,
    }
}

/// Decodes what the server wrote as its peer would, with the limits the peer announced:
/// every frame must pass them, the output must end at a frame boundary, and it must hold
/// the `frames` frames the encoder counted.
fn check_output(out: &[u8], peer: Limits, frames: u64) {
    let mut dec = Decoder::new(peer, 4096);
    let mut at = 0;
    loop {
        match dec.poll() {
            Ok(Some(_)) => continue,
            Ok(None) => {}
            Err(e) => panic!("the server wrote what its peer rejects: {e}"),
        }
        if at == out.len() {
            break;
        }
        let n = dec.feed(&out[at..]);
        assert!(n > 0, "the peer's decoder takes no bytes and decodes none");
        at += n;
    }
    assert!(
        dec.at_frame_start() && dec.buffered() == 0,
        "the output ends inside a frame"
    );
    assert_eq!(dec.frames_in(), frames, "frames written vs frames counted");
}

/// The limits a peer announces, by `sel`: valid ones, all within the allowed ranges.
fn announced(sel: u8) -> Limits {
    match sel & 7 {
        0..=3 => limits_for(sel),
        4 => Limits {
            max_tensors: 3,
            max_rows: 5,
            ..Limits::default()
        },
        5 => Limits {
            max_frame: Limits::MIN_FRAME + 1,
            max_rank: 1,
            ..Limits::default()
        },
        6 => Limits {
            max_frame: 1 << 20,
            max_tensor_bytes: 0,
            ..Limits::default()
        },
        _ => Limits {
            max_key: 1,
            max_tables: 1,
            max_row_bytes: 1,
            ..Limits::default()
        },
    }
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 6 {
        return;
    }
    let (cfg, pattern) = (data[0], data[1]);
    let pieces: Vec<usize> = data[2..6].iter().map(|&b| piece_size(b)).collect();
    let limits = limits_for(cfg >> 3);
    let capacity = CAPACITIES[cfg as usize & 7];
    let peer = announced(cfg >> 5);
    assert!(peer.validate().is_ok());

    // The peer's HELLO, then the fuzzed stream.
    let mut enc = Encoder::new(EncoderConfig::default());
    let hello = HelloRepr {
        cluster_id: CLUSTER,
        task_index: 7,
        limits: peer,
        job: b"worker",
        token: b"",
        // An odd-length input's peer announces ROW_FORMATS (loss scales in rows tables),
        // an even one's nothing, so both decoders are driven.
        features: if data.len() % 2 == 1 {
            WireFeatures::ROW_FORMATS
        } else {
            WireFeatures::NONE
        },
    };
    enc.hello(&hello, false).unwrap();
    let mut stream = Vec::new();
    for p in enc.pieces() {
        let Piece::Bytes(b) = p else { unreachable!() };
        stream.extend_from_slice(b);
    }
    stream.extend_from_slice(&data[6..]);

    let reference = run(&stream, limits, capacity, peer, &[], None);
    let policy = Policy {
        backlog: [1, 64, 300, 4096, 65_536][data[2] as usize % 5],
        pattern,
        write: [0, 1, 7, 100, 4096, u64::MAX][data[3] as usize % 6],
    };
    let paused = run(&stream, limits, capacity, peer, &pieces, Some(policy));
    assert_eq!(reference, paused, "pausing changed what the connection did");
    check_output(&reference.out, peer, reference.counts.3);
});
