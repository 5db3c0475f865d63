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
//! **What the stream owes.** After every event, feed and direct placement (until an
//! error), the decoder's accounting must match a model kept from the events alone:
//! `owed().chunked` is the bytes of the chunked tensors declared so far that have not
//! arrived (the chunk being received included), `owed().frame` the rest of the payload of
//! the frame in progress when it is not a `CHUNK` (never more than its `payload_len`, 0
//! between frames and while a header or meta section is incomplete); `chunk_bytes_in` and
//! `frame_bytes_in` add up the payload delivered of each sort, `frames_in` the frames;
//! `at_frame_start` is false while a frame is in progress and `in_frame_head` false once
//! its meta section is out.
//!
//! **Encoder mode** (`common/encoder_mode.rs`). The script drives an `Encoder` (max_frame
//! 65536 adopted with `set_peer_limits`, a small chunk size): pings, pongs, recvs, fused
//! recvs, pulls, pushes and responses with dead, empty, small and large tensors, errors,
//! hellos, cancels, stats and checkpoint requests, and partial drains of the output between frames (so chunks interleave with
//! later frames). The output is serialized through `fill` / `pieces` / `advance`, tensor
//! pieces resolved from the target's own token map. The stream then goes through the three
//! raw-mode runs, and what the decoder yields must be exactly what went in: every frame's
//! fields, keys, ids and entries, and every tensor's bytes, reassembled from inline
//! payloads and chunks. Along the way the encoder's own accounting is checked: each frame
//! adds its whole length to `queued_bytes` and its header, meta section and copied tensors
//! to `copied_bytes` (which stays the arena part of what is queued and not written, the
//! front segment counted whole until it is), `frames_out` counts every frame and chunk, and
//! no frame exceeds the peer's `max_frame`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use starwire::proto::{Decoder, Error, Event, NextRead, Owed, PayloadTarget};
use starwire::wire::{Body, FrameKind, Header, HeaderRepr, Limits, WireFeatures, HEADER_LEN};
use std::collections::VecDeque;

#[path = "common/encoder_mode.rs"]
mod encoder_mode;
#[path = "common/native.rs"]
mod native;

use encoder_mode::encoder_mode;
use native::{limits_for, piece_size, target_key, NBody, TargetKey, CAPACITIES};

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
    /// The model of what the stream owes: the bytes still to come of each chunked tensor
    /// declared, in declaration order; payload bytes delivered so far of chunks and of
    /// other frames.
    declared: VecDeque<u64>,
    chunk_in: u64,
    frame_in: u64,
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
            declared: VecDeque::new(),
            chunk_in: 0,
            frame_in: 0,
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
                let body = NBody::of(&f.body);
                if f.header.kind != FrameKind::Chunk {
                    let chunked = body.tensors().into_iter().filter(|(_, t)| t.chunked);
                    self.declared.extend(chunked.map(|(_, t)| t.byte_len));
                }
                self.frames.push(FrameRec {
                    header: f.header,
                    body_dbg: format!("{:?}", f.body),
                    body,
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
        let n = data.len() as u64;
        if let PayloadTarget::Chunk { .. } = target {
            self.chunk_in += n;
            let front = self
                .declared
                .front_mut()
                .expect("chunk bytes, no tensor owed");
            assert!(*front >= n, "chunk bytes beyond the tensor");
            *front -= n;
            if *front == 0 {
                self.declared.pop_front();
            }
        } else {
            self.frame_in += n;
        }
        let plen = self.frames.last().unwrap().header.payload_len as usize;
        assert!(self.payload.len() <= plen, "more payload than payload_len");
    }

    /// The frame in progress: its header has been handed out, its end not yet.
    fn in_frame(&self) -> Option<&FrameRec> {
        self.frames.last().filter(|f| !f.ended)
    }

    /// What the model says the stream owes.
    fn owed(&self) -> Owed {
        let frame = match self.in_frame() {
            Some(f) if f.header.kind != FrameKind::Chunk => {
                f.header.payload_len as u64 - self.payload.len() as u64
            }
            _ => 0,
        };
        Owed {
            chunked: self.declared.iter().sum(),
            frame,
        }
    }

    /// The decoder's accounting of what is owed and what arrived against the model.
    fn check_owed(&self, dec: &Decoder) {
        let owed = dec.owed();
        assert_eq!(owed, self.owed(), "owed bytes differ from the model");
        if let Some(f) = self.in_frame() {
            assert!(
                owed.frame <= f.header.payload_len as u64,
                "owes more than declared"
            );
            assert!(!dec.at_frame_start(), "at a frame start inside a frame");
            assert!(
                !dec.in_frame_head(),
                "in a frame head after its meta section"
            );
        } else {
            assert_eq!(owed.frame, 0, "frame bytes owed between frames");
        }
        assert_eq!(dec.chunk_bytes_in(), self.chunk_in, "chunk bytes received");
        assert_eq!(
            dec.frame_bytes_in(),
            self.frame_in,
            "frame payload bytes received"
        );
        assert_eq!(dec.frames_in(), self.frames.len() as u64, "frames counted");
        // The decoder lets go of a chunked tensor when the header of its last chunk is in,
        // the model when that chunk's bytes are.
        let (pending, declared) = (dec.chunks_pending(), self.declared.len());
        assert!(
            pending == declared || pending + 1 == declared,
            "{pending} vs {declared}"
        );
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

fn run(
    stream: &[u8],
    limits: Limits,
    features: WireFeatures,
    capacity: usize,
    mode: Mode<'_>,
) -> Outcome {
    let mut dec = Decoder::new(limits, capacity);
    dec.set_features(features);
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
            rec.check_owed(&dec);
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
        rec.check_owed(&dec);
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
    features: WireFeatures,
    capacity: usize,
    k: u8,
    pieces: &[usize],
    scale: usize,
) -> Outcome {
    let pieces: Vec<usize> = pieces.iter().map(|p| p * scale).collect();
    let pieces = &pieces[..];
    let whole = run(stream, limits, features, capacity, Mode::Whole);
    let split = run(stream, limits, features, capacity, Mode::Pieces(pieces));
    assert_eq!(whole, split, "whole vs split feeding");
    let direct = run(
        stream,
        limits,
        features,
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
        // Streams of odd length are decoded with every optional feature negotiated (rows
        // in other float formats, loss scales, held versions and versions reports), the
        // others with none.
        let features = if rest.len() % 2 == 1 {
            WireFeatures::ALL
        } else {
            WireFeatures::NONE
        };
        run_all(rest, limits, features, CAPACITIES[cfg as usize & 7], k, &pieces, 1);
    }
});
