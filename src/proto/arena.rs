//! The encoder's arena: the fixed blocks headers, metas and small tensors are written into,
//! and the rule for how many idle blocks it keeps.
//!
//! A block never moves or shrinks while a queued segment refers to it, and it may be lent
//! to a write in flight. When its last segment is written it becomes idle, and it is kept
//! for the next frames or freed:
//!
//! - a block larger than the standard size (a frame with a very large meta section) is
//!   freed at once;
//! - up to [`FREE_BLOCKS_KEPT`] idle blocks are always kept;
//! - above that, idle blocks are kept while the arena holds no more bytes than recent
//!   output needed at once plus one standard block, and no more than the encoder's
//!   `keep_bytes`. "Recent" is the current period and the one before, a period being
//!   [`DRAINS_PER_PERIOD`] drains (the times the output was written out completely); what
//!   it needed is the most bytes of blocks some queued segment referred to at once.
//!
//! So a connection whose every loop turn fills several blocks (a PS answering 64 pulls of
//! 100 small tensors fills 4 or 5) reuses them turn after turn and allocates nothing in
//! steady state, while the memory of a burst (a peer slow to read, a one-off large answer)
//! is given back, at a drain, once the output has drained 16 to 32 times with less in use.
//! An idle connection drains only when it sends something (a heartbeat); until then the
//! cap bounds what it keeps.

/// Idle arena blocks always kept for the next frames, whatever recent output needed.
pub(crate) const FREE_BLOCKS_KEPT: usize = 2;

/// The times the output drains completely that make one period of the keep rule: the most
/// bytes in use is remembered for one to two periods.
pub(crate) const DRAINS_PER_PERIOD: u32 = 16;

/// Size of a block taken while the current one is lent to a write in flight, when the frame
/// fits it: frames queued during a write then take small blocks.
const SIDE_BLOCK: usize = 16 << 10;

#[derive(Debug)]
struct Block {
    buf: Box<[u8]>,
    /// `buf`'s length, also while it is lent.
    size: usize,
    used: usize,
    refs: usize,
    /// `buf` is lent out to a write in flight ([`Arena::lend`]): nothing is written into
    /// the block until it is back.
    lent: bool,
}

impl Block {
    /// Whether the block holds memory (its own, or lent out).
    fn held(&self) -> bool {
        !self.buf.is_empty() || self.lent
    }
}

/// The blocks of one encoder.
#[derive(Debug)]
pub(crate) struct Arena {
    blocks: Vec<Block>,
    current: usize,
    /// Standard block size.
    block_size: usize,
    /// Most bytes of blocks kept when idle blocks above [`FREE_BLOCKS_KEPT`] are kept.
    keep_bytes: usize,
    /// Bytes of the blocks allocated and not freed, lent ones included.
    bytes: usize,
    /// Blocks allocated and not freed, lent ones included.
    held: usize,
    /// Bytes of the blocks some queued segment refers to.
    in_use: usize,
    /// The most bytes of blocks in use in the current period and in the one before.
    peak: usize,
    peak_before: usize,
    /// Drains in the current period.
    drains: u32,
    /// Blocks allocated since the arena was made.
    allocated: u64,
}

impl Arena {
    /// An arena with one block of `block_size` and one small block (the one frames go into
    /// while the first is out with a write: made now, so a connection's memory is set from
    /// its start).
    pub(crate) fn new(block_size: usize, keep_bytes: usize) -> Arena {
        let mut a = Arena {
            blocks: Vec::new(),
            current: 0,
            block_size,
            keep_bytes,
            bytes: 0,
            held: 0,
            in_use: 0,
            peak: 0,
            peak_before: 0,
            drains: 0,
            allocated: 0,
        };
        a.new_block(block_size);
        a.new_block(SIDE_BLOCK.min(block_size));
        a
    }

    /// Blocks holding memory (in use, lent, or idle and kept).
    pub(crate) fn block_count(&self) -> usize {
        self.held
    }

    /// Bytes of the blocks held.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Blocks allocated since the arena was made (the first two included).
    pub(crate) fn allocated(&self) -> u64 {
        self.allocated
    }

    /// The bytes kept at most above the floor: the most in use recently, and one block of
    /// headroom (the small blocks taken during writes, a turn one block larger).
    fn keep_target(&self) -> usize {
        self.peak.max(self.peak_before).saturating_add(self.block_size)
    }

    fn new_block(&mut self, size: usize) -> usize {
        let block = Block {
            buf: vec![0; size].into_boxed_slice(),
            size,
            used: 0,
            refs: 0,
            lent: false,
        };
        self.bytes += size;
        self.held += 1;
        self.allocated += 1;
        // The slot of a freed block, if any: segments name blocks by index.
        match self.blocks.iter().position(|b| !b.held()) {
            Some(i) => {
                self.blocks[i] = block;
                i
            }
            None => {
                self.blocks.push(block);
                self.blocks.len() - 1
            }
        }
    }

    fn free(&mut self, i: usize) {
        self.bytes -= self.blocks[i].size;
        self.blocks[i].size = 0;
        self.held -= 1;
        self.blocks[i].buf = Box::default();
        self.blocks[i].used = 0;
    }

    /// Whether block `i` is idle: holds its memory, not the current block, no segment on it.
    fn idle(&self, i: usize) -> bool {
        let b = &self.blocks[i];
        i != self.current && b.refs == 0 && !b.buf.is_empty()
    }

    fn idle_count(&self) -> usize {
        (0..self.blocks.len()).filter(|&i| self.idle(i)).count()
    }

    /// Whether the arena holds more than the keep rule allows beyond the floor.
    fn over(&self) -> bool {
        self.bytes > self.keep_target().min(self.keep_bytes)
    }

    /// Frees idle block `i` when the keep rule does not keep it.
    fn trim(&mut self, i: usize) {
        if !self.idle(i) {
            return;
        }
        let oversized = self.blocks[i].size > self.block_size;
        if oversized || (self.idle_count() > FREE_BLOCKS_KEPT && self.over()) {
            self.free(i);
        }
    }

    /// The output was written out completely: one drain of the period. Idle blocks the
    /// keep rule no longer keeps (the period holding a burst has passed) are freed.
    pub(crate) fn drained(&mut self) {
        self.drains += 1;
        if self.drains >= DRAINS_PER_PERIOD {
            self.drains = 0;
            self.peak_before = self.peak;
            self.peak = self.in_use;
        }
        if self.held <= 1 + FREE_BLOCKS_KEPT || !self.over() {
            return;
        }
        let mut idle = self.idle_count();
        for i in 0..self.blocks.len() {
            if idle <= FREE_BLOCKS_KEPT || !self.over() {
                break;
            }
            if self.idle(i) {
                self.free(i);
                idle -= 1;
            }
        }
    }

    /// Reserves `len` contiguous bytes; returns block and start.
    pub(crate) fn alloc(&mut self, len: usize) -> (usize, usize) {
        let cur = &mut self.blocks[self.current];
        if cur.refs == 0 {
            cur.used = 0;
        }
        let cur_lent = cur.lent;
        if cur_lent || cur.buf.len() - cur.used < len {
            let free = self
                .blocks
                .iter()
                .position(|b| b.refs == 0 && !b.lent && b.buf.len() >= len);
            // A block wanted while blocks are out with a write gets the small size when the
            // frame fits: frames queued during a write then take 16 KiB blocks, and a
            // connection holds one standard block and a few small ones, not several
            // standard ones.
            let lent = cur_lent || self.blocks.iter().any(|b| b.lent);
            let size = if lent && len <= SIDE_BLOCK {
                SIDE_BLOCK
            } else {
                len.max(self.block_size)
            };
            self.current = match free {
                Some(i) => i,
                None => self.new_block(size),
            };
            self.blocks[self.current].used = 0;
        }
        let b = &mut self.blocks[self.current];
        let start = b.used;
        b.used += len;
        (self.current, start)
    }

    /// Gives back what [`alloc`](Self::alloc) reserved in `block` from `start` on (nothing
    /// after it was reserved).
    pub(crate) fn unreserve(&mut self, block: usize, start: usize) {
        self.blocks[block].used = start;
    }

    /// The bytes of block `block` (empty while it is lent).
    pub(crate) fn buf(&self, block: usize) -> &[u8] {
        &self.blocks[block].buf
    }

    /// The bytes of block `block`, to write into (empty while it is lent).
    pub(crate) fn buf_mut(&mut self, block: usize) -> &mut [u8] {
        &mut self.blocks[block].buf
    }

    /// A segment on block `block` was queued.
    pub(crate) fn hold(&mut self, block: usize) {
        let b = &mut self.blocks[block];
        b.refs += 1;
        if b.refs == 1 {
            self.in_use += b.size;
            self.peak = self.peak.max(self.in_use);
        }
    }

    /// A segment on block `block` was written: the block is idle when it was the last.
    pub(crate) fn release(&mut self, block: usize) {
        let b = &mut self.blocks[block];
        b.refs -= 1;
        if b.refs == 0 {
            self.in_use -= b.size;
            if !b.lent {
                b.used = 0;
                self.trim(block);
            }
        }
    }

    /// Takes block `block` out for a write in flight; `None` when it is lent already (or
    /// no such block).
    pub(crate) fn lend(&mut self, block: usize) -> Option<Box<[u8]>> {
        let b = self.blocks.get_mut(block)?;
        if b.lent {
            return None;
        }
        b.lent = true;
        Some(std::mem::take(&mut b.buf))
    }

    /// Takes back a block [`lend`](Self::lend) gave out.
    pub(crate) fn restore(&mut self, block: usize, buf: Box<[u8]>) {
        if let Some(b) = self.blocks.get_mut(block).filter(|b| b.lent) {
            b.buf = buf;
            b.lent = false;
            if b.refs == 0 {
                b.used = 0;
                self.trim(block);
            }
        }
    }
}
