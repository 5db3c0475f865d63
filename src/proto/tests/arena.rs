//! The encoder's arena: blocks reused in steady state, kept as recent output needed, and
//! given back after a burst.

use std::collections::HashMap;

use super::drain;
use crate::proto::arena::{DRAINS_PER_PERIOD, FREE_BLOCKS_KEPT};
use crate::proto::{Encoder, EncoderConfig, OutPiece, OutTensor, ResponseItem};
use crate::wire::{DType, Missing, Status, TensorMeta};

/// The bytes one write takes at most (`STARWIRE_ACC_SIZE`'s default).
const ACC: u64 = 256 << 10;

const BLOCK: usize = 128 << 10;

/// One write as a connection makes it: the pieces up to `max` bytes handed over, their
/// blocks lent; `during` runs while they are out (frames queued meanwhile go elsewhere);
/// then the write completes: the blocks come back and the bytes are advanced over.
fn write_once(enc: &mut Encoder, max: u64, during: impl FnOnce(&mut Encoder)) {
    enc.fill(max);
    let mut lent: Vec<(u32, Box<[u8]>)> = Vec::new();
    let (mut i, mut taken) = (0, 0u64);
    while taken < max {
        let Some(p) = enc.out_piece(i) else { break };
        i += 1;
        let len = match p {
            OutPiece::Arena { block, len, .. } => {
                if let Some(buf) = enc.lend_block(block) {
                    lent.push((block, buf));
                }
                len as u64
            }
            OutPiece::Tensor { len, .. } => len,
        };
        taken += len.min(max - taken);
    }
    during(enc);
    for (block, buf) in lent {
        enc.restore_block(block, buf);
    }
    enc.advance(taken);
}

/// Queues `answers` answers of `tensors` tensors of 64 bytes each (copied into the arena,
/// as tensors this small are).
fn answer(enc: &mut Encoder, first_handle: u64, answers: usize, tensors: usize) {
    let dims = [64u64];
    let bytes = [7u8; 64];
    let items: Vec<ResponseItem<'_>> = (0..tensors as u32)
        .map(|index| ResponseItem {
            versions: Default::default(),
            index,
            status: Status::Ok,
            tensor: Some(OutTensor {
                meta: TensorMeta::new(DType::U8, &dims).unwrap(),
                bytes: &bytes,
                token: u64::from(index),
            }),
            missing: Missing::default(),
        })
        .collect();
    for a in 0..answers as u64 {
        enc.response(first_handle + a, true, &items).unwrap();
    }
    enc.take_released(|_| {});
}

/// A PS's loop turn under 64 pulls of 100 tensors of 64 B: half the answers queued, a
/// write started, the other half queued while it is out, then writes until all is written.
fn bursty_turn(enc: &mut Encoder, turn: u64) {
    answer(enc, turn * 64, 32, 100);
    write_once(enc, ACC, |enc| answer(enc, turn * 64 + 32, 32, 100));
    while !enc.is_empty() {
        write_once(enc, ACC, |_| {});
    }
}

/// A quiet turn: one small answer, written at once.
fn small_turn(enc: &mut Encoder, turn: u64) {
    answer(enc, turn, 1, 2);
    while !enc.is_empty() {
        write_once(enc, ACC, |_| {});
    }
}

#[test]
fn turns_that_fill_several_blocks_allocate_none_after_warm_up() {
    let mut enc = Encoder::new(EncoderConfig::default());
    for turn in 0..3 {
        bursty_turn(&mut enc, turn);
    }
    let warm = enc.blocks_allocated();
    // A turn fills several blocks, more than the two idle ones always kept.
    assert!(warm > 2 + FREE_BLOCKS_KEPT as u64, "allocated in warm-up: {warm}");
    assert!(enc.block_count() > 1 + FREE_BLOCKS_KEPT, "{}", enc.block_count());
    for turn in 3..500 {
        bursty_turn(&mut enc, turn);
        assert_eq!(enc.blocks_allocated(), warm, "turn {turn} allocated");
    }
    assert!(enc.is_empty());
    assert!(enc.arena_bytes() <= EncoderConfig::default().keep_bytes);
}

#[test]
fn with_no_bytes_to_keep_the_same_turns_allocate_every_time() {
    // The rule before the keep rule: only two idle blocks kept. The same load frees and
    // allocates blocks turn after turn.
    let mut enc = Encoder::new(EncoderConfig {
        keep_bytes: 0,
        ..EncoderConfig::default()
    });
    for turn in 0..3 {
        bursty_turn(&mut enc, turn);
    }
    let warm = enc.blocks_allocated();
    for turn in 3..103 {
        bursty_turn(&mut enc, turn);
        assert!(enc.block_count() <= 1 + FREE_BLOCKS_KEPT, "turn {turn}");
    }
    assert!(
        enc.blocks_allocated() - warm >= 100,
        "allocated in 100 turns: {}",
        enc.blocks_allocated() - warm
    );
}

#[test]
fn the_byte_cap_bounds_what_is_kept() {
    let keep_bytes = 2 * BLOCK;
    let mut enc = Encoder::new(EncoderConfig {
        keep_bytes,
        ..EncoderConfig::default()
    });
    for turn in 0..50 {
        bursty_turn(&mut enc, turn);
        assert!(
            enc.arena_bytes() <= keep_bytes.max((1 + FREE_BLOCKS_KEPT) * BLOCK),
            "turn {turn}: {} bytes kept",
            enc.arena_bytes()
        );
    }
}

#[test]
fn idle_blocks_go_back_to_the_floor_after_the_burst_stops() {
    let mut enc = Encoder::new(EncoderConfig::default());
    for turn in 0..20 {
        bursty_turn(&mut enc, turn);
    }
    let busy = (enc.block_count(), enc.arena_bytes());
    assert!(busy.0 > 1 + FREE_BLOCKS_KEPT, "blocks kept under load: {}", busy.0);
    assert!(busy.1 > (1 + FREE_BLOCKS_KEPT) * BLOCK, "bytes kept under load: {}", busy.1);
    // A few quiet turns keep the burst's blocks: it may come back.
    for turn in 0..DRAINS_PER_PERIOD as u64 / 2 {
        small_turn(&mut enc, turn);
    }
    assert_eq!((enc.block_count(), enc.arena_bytes()), busy);
    // Two periods of quiet turns later they are given back, down to the floor: the memory
    // of the current block and the two idle ones always kept.
    for turn in 0..2 * DRAINS_PER_PERIOD as u64 {
        small_turn(&mut enc, turn);
    }
    assert!(
        enc.arena_bytes() <= (1 + FREE_BLOCKS_KEPT) * BLOCK,
        "bytes after the burst: {} (under load {})",
        enc.arena_bytes(),
        busy.1
    );
    assert!(enc.block_count() < busy.0);
    // And a burst again is served from new blocks, then from those.
    let before = enc.blocks_allocated();
    for turn in 0..3 {
        bursty_turn(&mut enc, turn);
    }
    let warm = enc.blocks_allocated();
    assert!(warm > before);
    for turn in 3..50 {
        bursty_turn(&mut enc, turn);
    }
    assert_eq!(enc.blocks_allocated(), warm);
}

#[test]
fn encoder_arena_is_reused_in_steady_state() {
    let mut enc = Encoder::new(EncoderConfig::default());
    let store = HashMap::new();
    let keys: Vec<Vec<u8>> = (0..100).map(|i| format!("key-{i}").into_bytes()).collect();
    for round in 0..1000u64 {
        enc.recv(round + 1, round, &keys, true).unwrap();
        enc.ping(round + 1, &[0u8; 64]).unwrap();
        let _ = drain(&mut enc, &store, 1500);
    }
    assert!(enc.is_empty());
    assert!(enc.block_count() <= 2, "blocks: {}", enc.block_count());
    assert_eq!(enc.blocks_allocated(), 2, "the first two blocks only");
}

#[test]
fn encoder_returns_the_memory_of_a_backlog_once_written() {
    let mut enc = Encoder::new(EncoderConfig::default());
    let store = HashMap::new();
    let keys: Vec<Vec<u8>> = (0..1000)
        .map(|i| format!("key-{i:06}").into_bytes())
        .collect();
    // About 12 KB of meta per frame, 200 frames queued before anything is written: a
    // backlog of dozens of blocks. One frame with a meta section larger than a block.
    for round in 0..200u64 {
        enc.recv(round + 1, round, &keys, true).unwrap();
    }
    let many: Vec<Vec<u8>> = (0..20_000)
        .map(|i| format!("key-{i:06}").into_bytes())
        .collect();
    enc.recv(1000, 0, &many, true).unwrap();
    let backlog = enc.block_count();
    assert!(backlog > 20, "blocks: {backlog}");
    let _ = drain(&mut enc, &store, u64::MAX);
    assert!(enc.is_empty());
    // Once written, at most the cap is kept (the large block is not).
    let cap = EncoderConfig::default().keep_bytes;
    assert!(
        enc.arena_bytes() <= cap,
        "bytes after the backlog: {} (cap {cap})",
        enc.arena_bytes()
    );
    // Encoding goes on normally in the blocks kept; the output drains with less in use
    // and the rest is given back.
    for round in 0..2 * u64::from(DRAINS_PER_PERIOD) {
        enc.recv(round + 1, round, &keys, true).unwrap();
        let _ = drain(&mut enc, &store, 1500);
    }
    assert!(enc.is_empty());
    assert!(
        enc.block_count() <= 1 + FREE_BLOCKS_KEPT,
        "blocks after the backlog: {} (was {backlog})",
        enc.block_count()
    );
}
