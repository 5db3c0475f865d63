//! The receiver's parse-time limits, and the format's own bounds they may only lower.

/// Hard upper bound on tensor rank; `Limits::max_rank` may only lower it.
pub const MAX_RANK: usize = 32;

/// The receiver's parse-time limits (section 6 of the specification).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest frame accepted, header included.
    pub max_frame: u32,
    /// Longest rendezvous key.
    pub max_key: u16,
    /// Most items in one `FUSED_RECV`, `PULL`, `PUSH` or `RESPONSE`.
    pub max_tensors: u32,
    /// Highest tensor rank.
    pub max_rank: u8,
    /// Largest tensor, in bytes.
    pub max_tensor_bytes: u64,
    /// Most tables in one `PULL_ROWS` or `PUSH_ROWS`.
    pub max_tables: u32,
    /// Most row ids in one frame (over all its tables), and most missing rows reported in
    /// one `RESPONSE` entry.
    pub max_rows: u32,
    /// Largest row, in bytes.
    pub max_row_bytes: u32,
}

impl Limits {
    /// Smallest `max_frame` a peer may announce or be configured with.
    pub const MIN_FRAME: u32 = 64 * 1024;
    /// Largest configurable `max_frame`.
    pub const MAX_FRAME: u32 = 1 << 30;
    /// Largest configurable `max_tensors`.
    pub const MAX_TENSORS: u32 = 1 << 24;
    /// Largest configurable `max_tables`.
    pub const MAX_TABLES: u32 = 1 << 16;
    /// Largest configurable `max_rows`.
    pub const MAX_ROWS: u32 = 1 << 26;
    /// Largest configurable `max_row_bytes`.
    pub const MAX_ROW_BYTES: u32 = 1 << 30;

    /// Checks every limit against its allowed range; the error names the field.
    pub fn validate(&self) -> core::result::Result<(), &'static str> {
        if !(Self::MIN_FRAME..=Self::MAX_FRAME).contains(&self.max_frame) {
            return Err("max_frame must be between 65536 and 1073741824");
        }
        if self.max_key == 0 {
            return Err("max_key must be between 1 and 65535");
        }
        if !(1..=Self::MAX_TENSORS).contains(&self.max_tensors) {
            return Err("max_tensors must be between 1 and 16777216");
        }
        if self.max_rank as usize > MAX_RANK {
            return Err("max_rank must be at most 32");
        }
        if self.max_tensor_bytes > i64::MAX as u64 {
            return Err("max_tensor_bytes must be at most 2^63-1");
        }
        if !(1..=Self::MAX_TABLES).contains(&self.max_tables) {
            return Err("max_tables must be between 1 and 65536");
        }
        if !(1..=Self::MAX_ROWS).contains(&self.max_rows) {
            return Err("max_rows must be between 1 and 67108864");
        }
        if !(1..=Self::MAX_ROW_BYTES).contains(&self.max_row_bytes) {
            return Err("max_row_bytes must be between 1 and 1073741824");
        }
        Ok(())
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_frame: 16 << 20,
            max_key: 4096,
            max_tensors: 65_536,
            max_rank: 16,
            max_tensor_bytes: 4 << 30,
            max_tables: 1024,
            max_rows: 1 << 20,
            max_row_bytes: 1 << 20,
        }
    }
}
