//! Checkpoints of a [`PsTable`]: [`PsTable::save`] writes its rows and optimizer state to
//! a directory while loops keep serving it; [`PsTableBuilder::load`] builds a table from
//! one, or fails naming the file and what is wrong, having loaded nothing.
//!
//! **A fuzzy snapshot**, as PS systems take them: the slots are read in order, a few
//! thousand at a time, with no lock and no pause for the loops (the only cost to them is
//! the memory bandwidth the save uses). Each row is read as a pull would read it (whole
//! under [`Consistency::PerRow`](super::ps::Consistency::PerRow); under `Hogwild`, words of a
//! row being pushed may be from before or after that push); rows pushed during the save
//! may be saved before or after those pushes, and rows created or evicted during it may or
//! may not be in it.
//!
//! **Atomic**: written to `.table-<id>.swrows.tmp-<pid>` in the directory, flushed to disk
//! (`fsync`), renamed over `table-<id>.swrows`, and the directory flushed: a reader sees
//! the old complete file or the new complete file. Rows go to the disk around the page
//! cache (`O_DIRECT`, from a page-aligned buffer) where the file system allows it (a
//! setting, [`checkpoint_direct_io`](super::PsTableBuilder::checkpoint_direct_io)); else
//! through it, and every 64 MiB the save asks the kernel to start writing what it has
//! (`POSIX_FADV_DONTNEED`), so the disk works while rows are still being read and the page
//! cache does not fill with the checkpoint.
//!
//! # Format, version 1
//!
//! One file per table, `table-<id>.swrows`; integers little-endian.
//!
//! | bytes | header (128 bytes) |
//! |---|---|
//! | 0–7 | magic `93 53 57 52 4f 57 53 0a` (`\x93SWROWS\n`) |
//! | 8–11 | version: 1 |
//! | 12–15 | header length: 128 |
//! | 16–19 | table id |
//! | 20–23 | `dim`: elements per row |
//! | 24 | stored format: the wire dtype code (10 f32, 7 bf16, 6 f16) |
//! | 25 | optimizer state: 0 none (SGD), 1 Adagrad, 2 Adam |
//! | 26–27 | zero |
//! | 28–31 | record length `R`: `8 × (1 + row_words + state_words)` (the slot without its version) |
//! | 32–39 | rows |
//! | 40–47 | blocks |
//! | 48–55 | the table's clock |
//! | 56–59 | rows per block (every block but the last is full) |
//! | 60–119 | zero |
//! | 120–127 | XXH64 (seed 0) of bytes 0–119 |
//!
//! Then `blocks` blocks, each a 16-byte header — rows in the block (`u32`), zero (`u32`),
//! XXH64 of the payload (`u64`) — and a payload of that many records of `R` bytes: the
//! slot's words as the table holds them (see [`PsTable`](super::ps)'s slots) but the row's
//! version, which is not saved (a loaded row gets a version of the loading table's, so no
//! version a worker holds matches it): the id (`u64`), the
//! row's elements packed into 64-bit words in the stored format, the optimizer state's f32
//! packed two to a word (Adagrad: the sums; Adam: `beta1^t` and `beta2^t`, the first
//! moments, the second moments; each list padded to a whole word with zero).
//!
//! Then a 32-byte trailer: magic `SWROWEND`, rows (`u64`), blocks (`u64`), XXH64 of its
//! first 24 bytes. A reader checks the magic, the version, the header's checksum, the
//! shape (table id, `dim`, stored format, optimizer state, record length) against the
//! table it builds, the file's length against the header's counts, every block's checksum
//! and count, and the trailer. Optimizer parameters (learning rate, ...) are the loading
//! table's, not the file's.

use std::fmt;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use nix::fcntl::{fcntl, posix_fadvise, FcntlArg, OFlag, PosixFadviseAdvice};
use nix::libc;

use super::config::{BuildError, PsTableBuilder};
use super::elem::Float;
use super::ps_table::{Origin, PsTable, Tally};
use super::slots::{ROW_WORD, VERSION_WORD};
use super::xxh64::xxh64;
use crate::service::SaveReport;
use crate::sys::arena::Arena;

/// The version of the format this build writes and reads.
pub const CHECKPOINT_VERSION: u32 = 1;

const MAGIC: [u8; 8] = *b"\x93SWROWS\n";
const TRAILER_MAGIC: [u8; 8] = *b"SWROWEND";
const HEADER_LEN: usize = 128;
const BLOCK_HEADER_LEN: usize = 16;
const TRAILER_LEN: usize = 32;
/// Bytes of records per block (about).
const BLOCK_BYTES: usize = 4 << 20;
/// Bytes written between two writeback hints.
const WRITEBACK_BYTES: u64 = 64 << 20;

/// The file name of table `table_id`'s checkpoint in a checkpoint directory.
pub fn checkpoint_file(table_id: u32) -> String {
    format!("table-{table_id}.swrows")
}

/// Why a checkpoint was not written or not loaded.
#[derive(Debug)]
pub struct CheckpointError {
    path: PathBuf,
    kind: CheckpointErrorKind,
}

/// What is wrong with a checkpoint, or with writing it.
#[derive(Debug)]
#[non_exhaustive]
pub enum CheckpointErrorKind {
    /// A system call failed (`doing` says which step).
    Io {
        /// The step: "opening", "writing", ...
        doing: &'static str,
        /// The error.
        source: io::Error,
    },
    /// The file does not start with the magic: not a table checkpoint.
    NotACheckpoint,
    /// A format version this build does not read.
    Version {
        /// The file's version.
        found: u32,
        /// The version this build reads.
        supported: u32,
    },
    /// The file ends early.
    Truncated {
        /// Where, and what was expected.
        what: String,
    },
    /// A checksum or a count does not match: the file was damaged.
    Corrupted {
        /// What does not match.
        what: String,
    },
    /// The file holds rows of another shape than the table's (or another table's).
    Shape {
        /// What differs: the file's value and the table's.
        what: String,
    },
    /// The table could not be built, or refused rows (its row cap is below the file's rows).
    Table {
        /// Why.
        what: String,
    },
}

impl CheckpointError {
    /// The file (or directory) concerned.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What went wrong.
    pub fn kind(&self) -> &CheckpointErrorKind {
        &self.kind
    }
}

impl fmt::Display for CheckpointError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "checkpoint {}: ", self.path.display())?;
        match &self.kind {
            CheckpointErrorKind::Io { doing, source } => write!(f, "{doing}: {source}"),
            CheckpointErrorKind::NotACheckpoint => {
                f.write_str("not a table checkpoint (no starwire rows header)")
            }
            CheckpointErrorKind::Version { found, supported } => write!(
                f,
                "format version {found}, this build reads version {supported}"
            ),
            CheckpointErrorKind::Truncated { what } => write!(f, "truncated: {what}"),
            CheckpointErrorKind::Corrupted { what } => write!(f, "corrupted: {what}"),
            CheckpointErrorKind::Shape { what } => write!(f, "wrong shape: {what}"),
            CheckpointErrorKind::Table { what } => write!(f, "{what}"),
        }
    }
}

impl std::error::Error for CheckpointError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            CheckpointErrorKind::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// The header's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Header {
    table_id: u32,
    dim: u32,
    stored: u8,
    optimizer: u8,
    record: u32,
    rows: u64,
    blocks: u64,
    clock: u64,
    block_rows: u32,
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut le = [0u8; 4];
    le.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(le)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut le = [0u8; 8];
    le.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(le)
}

impl Header {
    fn emit(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&CHECKPOINT_VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&(HEADER_LEN as u32).to_le_bytes());
        b[16..20].copy_from_slice(&self.table_id.to_le_bytes());
        b[20..24].copy_from_slice(&self.dim.to_le_bytes());
        b[24] = self.stored;
        b[25] = self.optimizer;
        b[28..32].copy_from_slice(&self.record.to_le_bytes());
        b[32..40].copy_from_slice(&self.rows.to_le_bytes());
        b[40..48].copy_from_slice(&self.blocks.to_le_bytes());
        b[48..56].copy_from_slice(&self.clock.to_le_bytes());
        b[56..60].copy_from_slice(&self.block_rows.to_le_bytes());
        let sum = xxh64(&b[..120], 0);
        b[120..].copy_from_slice(&sum.to_le_bytes());
        b
    }

    fn parse(b: &[u8; HEADER_LEN]) -> Result<Header, CheckpointErrorKind> {
        if b[..8] != MAGIC {
            return Err(CheckpointErrorKind::NotACheckpoint);
        }
        let version = u32_at(b, 8);
        if version != CHECKPOINT_VERSION {
            return Err(CheckpointErrorKind::Version {
                found: version,
                supported: CHECKPOINT_VERSION,
            });
        }
        if u64_at(b, 120) != xxh64(&b[..120], 0) || u32_at(b, 12) != HEADER_LEN as u32 {
            return Err(CheckpointErrorKind::Corrupted {
                what: "the header's checksum does not match".into(),
            });
        }
        Ok(Header {
            table_id: u32_at(b, 16),
            dim: u32_at(b, 20),
            stored: b[24],
            optimizer: b[25],
            record: u32_at(b, 28),
            rows: u64_at(b, 32),
            blocks: u64_at(b, 40),
            clock: u64_at(b, 48),
            block_rows: u32_at(b, 56),
        })
    }
}

/// The header a table of these settings writes, without counts.
fn shape_of(s: &PsTableBuilder) -> Header {
    let layout = super::slots::Layout::new(s.dim, s.stored, &s.optimizer);
    Header {
        table_id: s.table_id,
        dim: s.dim as u32,
        stored: s.stored.dtype().into(),
        optimizer: s.optimizer.code(),
        record: layout.record_bytes() as u32,
        rows: 0,
        blocks: 0,
        clock: 0,
        block_rows: (BLOCK_BYTES / layout.record_bytes()).max(1) as u32,
    }
}

/// A stored-format code's name.
fn format_name(code: u8) -> String {
    match Float::from_dtype(crate::wire::DType::from(code)) {
        Some(f) => format!("{f:?}"),
        None => format!("unknown format {code}"),
    }
}

/// An optimizer-state code's name.
fn optimizer_name(code: u8) -> String {
    match code {
        0 => "none (sgd)".into(),
        1 => "adagrad".into(),
        2 => "adam".into(),
        c => format!("unknown optimizer state {c}"),
    }
}

impl PsTable {
    /// Writes the table to `dir` (created if missing) as `table-<id>.swrows`, atomically;
    /// see the module documentation. Loops may pull and push meanwhile.
    pub fn save(&self, dir: impl AsRef<Path>) -> Result<SaveReport, CheckpointError> {
        let dir = dir.as_ref();
        let path = dir.join(checkpoint_file(self.settings.table_id));
        let io_err = |doing, source| CheckpointError {
            path: path.clone(),
            kind: CheckpointErrorKind::Io { doing, source },
        };
        let start = Instant::now();
        fs::create_dir_all(dir).map_err(|e| io_err("creating the directory", e))?;
        let tmp = dir.join(format!(
            ".{}.tmp-{}",
            checkpoint_file(self.settings.table_id),
            std::process::id()
        ));
        let written = match self.write_file(&tmp) {
            Ok(w) => w,
            Err((doing, e)) => {
                let _ = fs::remove_file(&tmp);
                return Err(io_err(doing, e));
            }
        };
        fs::rename(&tmp, &path).map_err(|e| {
            let _ = fs::remove_file(&tmp);
            io_err("renaming the temporary file into place", e)
        })?;
        let synced = Instant::now();
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| io_err("flushing the directory", e))?;
        Ok(SaveReport {
            path,
            rows: written.rows,
            bytes: written.bytes,
            elapsed: start.elapsed(),
            writing: written.writing,
            syncing: written.syncing + synced.elapsed(),
            direct_io: written.direct,
        })
    }

    /// Writes the checkpoint to `tmp`.
    fn write_file(&self, tmp: &Path) -> Result<Written, (&'static str, io::Error)> {
        let mut sink = Sink::create(tmp, self.settings.direct_io)
            .map_err(|e| ("creating the temporary file", e))?;
        let w = |e| ("writing", e);
        let mut header = shape_of(&self.settings);
        header.clock = self.clock();
        let record = header.record as usize;
        // Room for the header, which is written last.
        sink.len = HEADER_LEN;
        let (mut rows, mut blocks, mut in_block) = (0u64, 0u64, 0u32);
        let mut block_start = 0;
        let mut failed = None;
        self.walk_slots(|id, slot| {
            if failed.is_some() {
                return;
            }
            if in_block == 0 {
                block_start = sink.len;
                sink.len += BLOCK_HEADER_LEN;
            }
            let at = sink.len;
            let stage = sink.stage();
            // The id and the row's words; not its version (a restored table gives its rows
            // versions of its own, see `PsTable`'s row versions).
            let words = slot[..VERSION_WORD].iter().chain(&slot[VERSION_WORD + 1..]);
            self.read_row(id, || {
                for (word, b) in words
                    .clone()
                    .zip(stage[at..at + record].chunks_exact_mut(8))
                {
                    b.copy_from_slice(&word.load(Ordering::Relaxed).to_le_bytes());
                }
            });
            sink.len += record;
            in_block += 1;
            if in_block == header.block_rows {
                sink.end_block(block_start, in_block);
                (rows, blocks, in_block) = (rows + u64::from(in_block), blocks + 1, 0);
                if let Err(e) = sink.drain(false) {
                    failed = Some(e);
                }
            }
        });
        if let Some(e) = failed {
            return Err(w(e));
        }
        if in_block > 0 {
            sink.end_block(block_start, in_block);
            (rows, blocks) = (rows + u64::from(in_block), blocks + 1);
        }
        let mut trailer = [0u8; TRAILER_LEN];
        trailer[..8].copy_from_slice(&TRAILER_MAGIC);
        trailer[8..16].copy_from_slice(&rows.to_le_bytes());
        trailer[16..24].copy_from_slice(&blocks.to_le_bytes());
        let sum = xxh64(&trailer[..24], 0);
        trailer[24..].copy_from_slice(&sum.to_le_bytes());
        let at = sink.len;
        sink.stage()[at..at + TRAILER_LEN].copy_from_slice(&trailer);
        sink.len += TRAILER_LEN;
        sink.drain(true).map_err(w)?;
        header.rows = rows;
        header.blocks = blocks;
        sink.file.write_all_at(&header.emit(), 0).map_err(w)?;
        let synced = Instant::now();
        sink.file.sync_all().map_err(|e| ("flushing the file", e))?;
        Ok(Written {
            rows,
            bytes: sink.written,
            writing: sink.writing,
            syncing: synced.elapsed(),
            direct: sink.direct_used,
        })
    }
}

/// What [`PsTable::write_file`] wrote.
struct Written {
    rows: u64,
    bytes: u64,
    writing: Duration,
    syncing: Duration,
    direct: bool,
}

/// Bytes staged before a write: a block and its header, the unaligned rest of the last
/// write, the file's header.
const STAGE_BYTES: usize = BLOCK_BYTES + BLOCK_HEADER_LEN + 2 * DIRECT_ALIGN + HEADER_LEN;
/// Direct I/O writes whole pages from page-aligned memory (a logical block is at most
/// this).
const DIRECT_ALIGN: usize = 4096;

/// The file being written and the page-aligned buffer bytes are staged in. Writes go
/// around the page cache (`O_DIRECT`) where the file system allows it: no copy into the
/// cache, and the disk's speed rather than the cache's. The last partial page, and the
/// header written at the end, go through the cache.
struct Sink {
    file: File,
    stage: Arena,
    /// Bytes staged.
    len: usize,
    /// Whether the file is open for direct I/O now, and whether it ever was.
    direct: bool,
    direct_used: bool,
    /// Bytes written to the file, and handed to writeback (buffered writes only).
    written: u64,
    hinted: u64,
    /// Time in write calls.
    writing: Duration,
}

impl Sink {
    fn create(path: &Path, direct: bool) -> io::Result<Sink> {
        let open = |flags| {
            fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .custom_flags(flags)
                .open(path)
        };
        let (file, direct) = match direct.then(|| open(libc::O_DIRECT)) {
            Some(Ok(file)) => (file, true),
            // Some file systems refuse O_DIRECT.
            Some(Err(_)) | None => (open(0)?, false),
        };
        let stage = Arena::reserve(STAGE_BYTES, false)?;
        stage.commit(STAGE_BYTES)?;
        Ok(Sink {
            file,
            stage,
            len: 0,
            direct,
            direct_used: direct,
            written: 0,
            hinted: 0,
            writing: Duration::ZERO,
        })
    }

    fn stage(&mut self) -> &mut [u8] {
        self.stage.bytes_mut()
    }

    /// Fills in the header of the block staged from `start`, of `rows` records.
    fn end_block(&mut self, start: usize, rows: u32) {
        let len = self.len;
        let stage = self.stage();
        let sum = xxh64(&stage[start + BLOCK_HEADER_LEN..len], 0);
        stage[start..start + 4].copy_from_slice(&rows.to_le_bytes());
        stage[start + 4..start + 8].fill(0);
        stage[start + 8..start + BLOCK_HEADER_LEN].copy_from_slice(&sum.to_le_bytes());
    }

    /// Writes what is staged: whole pages (the rest moves to the start of the buffer), or
    /// with `all` everything, the last partial page through the page cache.
    fn drain(&mut self, all: bool) -> io::Result<()> {
        let pages = if self.direct {
            self.len / DIRECT_ALIGN * DIRECT_ALIGN
        } else {
            self.len
        };
        self.write_staged(pages)?;
        if all {
            if self.direct {
                self.set_direct(false)?;
            }
            self.write_staged(self.len)?;
        }
        Ok(())
    }

    /// Writes the first `n` staged bytes and moves the rest to the start.
    fn write_staged(&mut self, n: usize) -> io::Result<()> {
        if n == 0 {
            return Ok(());
        }
        let t = Instant::now();
        let mut result = self.file.write_all(&self.stage.bytes_mut()[..n]);
        if self.direct && matches!(&result, Err(e) if e.raw_os_error() == Some(libc::EINVAL)) {
            // The file system took O_DIRECT at open but not at write: through the cache.
            self.set_direct(false)?;
            self.direct_used = self.written > 0;
            result = self.file.write_all(&self.stage.bytes_mut()[..n]);
        }
        self.writing += t.elapsed();
        result?;
        self.written += n as u64;
        let len = self.len;
        self.stage.bytes_mut().copy_within(n..len, 0);
        self.len -= n;
        if !self.direct && self.written - self.hinted >= WRITEBACK_BYTES {
            // Starts the disk writing what is written so far (and lets the cache drop it
            // once written), so the final fsync waits for the tail only. A hint: its
            // failure changes nothing.
            let _ = posix_fadvise(
                &self.file,
                self.hinted as i64,
                (self.written - self.hinted) as i64,
                PosixFadviseAdvice::POSIX_FADV_DONTNEED,
            );
            self.hinted = self.written;
        }
        Ok(())
    }

    fn set_direct(&mut self, on: bool) -> io::Result<()> {
        let flags = OFlag::from_bits_truncate(fcntl(&self.file, FcntlArg::F_GETFL)?);
        let flags = if on {
            flags | OFlag::O_DIRECT
        } else {
            flags - OFlag::O_DIRECT
        };
        fcntl(&self.file, FcntlArg::F_SETFL(flags))?;
        self.direct = on;
        Ok(())
    }
}

impl PsTableBuilder {
    /// A table of these settings holding the rows of its checkpoint in `dir`
    /// (`table-<id>.swrows`), and its clock. An error names the file and what is wrong
    /// with it (truncated, corrupted, another version, another shape); no table is built
    /// then.
    pub fn load(self, dir: impl AsRef<Path>) -> Result<PsTable, CheckpointError> {
        let path = dir.as_ref().join(checkpoint_file(self.table_id));
        let fail = |kind| CheckpointError {
            path: path.clone(),
            kind,
        };
        let io_err = |doing, source| fail(CheckpointErrorKind::Io { doing, source });
        let mut file = File::open(&path).map_err(|e| io_err("opening", e))?;
        let len = file
            .metadata()
            .map_err(|e| io_err("reading the length", e))?
            .len();
        let mut hb = [0u8; HEADER_LEN];
        if len < HEADER_LEN as u64 {
            // Short of a header: still say it is not a checkpoint if the magic is wrong.
            let mut start = Vec::new();
            file.read_to_end(&mut start)
                .map_err(|e| io_err("reading", e))?;
            if start.len() < 8 || start[..8] != MAGIC {
                return Err(fail(CheckpointErrorKind::NotACheckpoint));
            }
            return Err(fail(CheckpointErrorKind::Truncated {
                what: format!("{len} bytes, shorter than the {HEADER_LEN}-byte header"),
            }));
        }
        file.read_exact(&mut hb)
            .map_err(|e| io_err("reading the header", e))?;
        let header = Header::parse(&hb).map_err(&fail)?;
        check_shape(&header, &shape_of(&self)).map_err(&fail)?;
        let record = header.record as u64;
        if header.rows > self.max_rows {
            return Err(fail(CheckpointErrorKind::Table {
                what: format!(
                    "{} rows, more than the table's max_rows {}",
                    header.rows, self.max_rows
                ),
            }));
        }
        let full_blocks = header.rows / u64::from(header.block_rows.max(1));
        let expect_blocks =
            full_blocks + u64::from(header.rows % u64::from(header.block_rows.max(1)) != 0);
        if header.blocks != expect_blocks || header.block_rows == 0 {
            return Err(fail(CheckpointErrorKind::Corrupted {
                what: format!(
                    "the header counts {} blocks for {} rows of {} per block",
                    header.blocks, header.rows, header.block_rows
                ),
            }));
        }
        let expected = HEADER_LEN as u64
            + header.blocks * BLOCK_HEADER_LEN as u64
            + header.rows * record
            + TRAILER_LEN as u64;
        if len < expected {
            return Err(fail(CheckpointErrorKind::Truncated {
                what: format!(
                    "{len} bytes, the header's {} rows in {} blocks take {expected}",
                    header.rows, header.blocks
                ),
            }));
        }
        if len > expected {
            return Err(fail(CheckpointErrorKind::Corrupted {
                what: format!(
                    "{len} bytes, {} more than the header's {} rows in {} blocks take",
                    len - expected,
                    header.rows,
                    header.blocks
                ),
            }));
        }
        let capacity = self.capacity.max(header.rows);
        let table = self.capacity(capacity).build().map_err(|e: BuildError| {
            fail(CheckpointErrorKind::Table {
                what: e.to_string(),
            })
        })?;
        let mut payload = Vec::new();
        let mut block_header = [0u8; BLOCK_HEADER_LEN];
        let mut left = header.rows;
        for b in 0..header.blocks {
            file.read_exact(&mut block_header)
                .map_err(|e| io_err("reading a block header", e))?;
            let n = u64::from(u32_at(&block_header, 0));
            let want = left.min(u64::from(header.block_rows));
            if n != want {
                return Err(fail(CheckpointErrorKind::Corrupted {
                    what: format!("block {b} holds {n} rows, the header says {want}"),
                }));
            }
            payload.resize((n * record) as usize, 0);
            file.read_exact(&mut payload)
                .map_err(|e| io_err("reading a block", e))?;
            if xxh64(&payload, 0) != u64_at(&block_header, 8) {
                return Err(fail(CheckpointErrorKind::Corrupted {
                    what: format!(
                        "block {b} of {}: its checksum does not match",
                        header.blocks
                    ),
                }));
            }
            table
                .load_records(&payload)
                .map_err(|what| fail(CheckpointErrorKind::Table { what }))?;
            left -= n;
        }
        let mut trailer = [0u8; TRAILER_LEN];
        file.read_exact(&mut trailer)
            .map_err(|e| io_err("reading the trailer", e))?;
        if trailer[..8] != TRAILER_MAGIC
            || u64_at(&trailer, 24) != xxh64(&trailer[..24], 0)
            || u64_at(&trailer, 8) != header.rows
            || u64_at(&trailer, 16) != header.blocks
        {
            return Err(fail(CheckpointErrorKind::Corrupted {
                what: "the trailer does not match the header".into(),
            }));
        }
        table.set_clock(header.clock);
        Ok(table)
    }
}

/// Whether a file's shape is the table's.
fn check_shape(file: &Header, table: &Header) -> Result<(), CheckpointErrorKind> {
    let differ = |what: &str, f: String, t: String| {
        Err(CheckpointErrorKind::Shape {
            what: format!("{what} {f} in the file, {t} in the table"),
        })
    };
    if file.table_id != table.table_id {
        return differ(
            "table",
            file.table_id.to_string(),
            table.table_id.to_string(),
        );
    }
    if file.dim != table.dim {
        return differ("dim", file.dim.to_string(), table.dim.to_string());
    }
    if file.stored != table.stored {
        return differ(
            "rows stored as",
            format_name(file.stored),
            format_name(table.stored),
        );
    }
    if file.optimizer != table.optimizer {
        return differ(
            "optimizer state",
            optimizer_name(file.optimizer),
            optimizer_name(table.optimizer),
        );
    }
    if file.record != table.record {
        return differ(
            "record length",
            file.record.to_string(),
            table.record.to_string(),
        );
    }
    Ok(())
}

impl PsTable {
    /// Writes checkpoint records (see the module documentation) into the table.
    fn load_records(&self, payload: &[u8]) -> Result<(), String> {
        let record = self.layout.record_bytes();
        let mut tally = Tally::default();
        let _guard = self.epoch.enter();
        let mut view = self.index.view();
        let store = |words: &[AtomicU64], bytes: &[u8]| {
            for (w, b) in words.iter().zip(bytes.chunks_exact(8)) {
                w.store(u64_at(b, 0), Ordering::Relaxed);
            }
        };
        for r in payload.chunks_exact(record) {
            let id = u64_at(r, 0);
            let data = &r[8..];
            let row_bytes = self.layout.row_words * 8;
            let fill = |row: &[AtomicU64], state: &[AtomicU64]| {
                store(row, &data[..row_bytes]);
                store(state, &data[row_bytes..]);
            };
            match self.find_or_create(&mut view, id, Origin::Load, &mut tally, fill) {
                Some((_, true)) => {}
                Some((slot, false)) => {
                    // The same id twice: the later record wins.
                    let s = self.layout.slot(self.slots.words(), slot);
                    self.write_row(id, || {
                        store(&s[ROW_WORD..], data);
                        self.renew_version(s);
                    });
                }
                None => return Err(format!("the table refused row {id} (out of memory?)")),
            }
        }
        super::metrics::add(&self.counters.loaded, (payload.len() / record) as u64);
        Ok(())
    }
}
