//! The rows table of `commctl serve`: starwire's [`PsTable`] (the default) or its small
//! [`MemTable`] (`--table-kind mem`, to compare with); its settings and how they read on
//! the command line; the rows it starts with, made at start (`--rows N`: ids `0..N`, their
//! initializer's values) or loaded from a checkpoint (`--checkpoint-dir`); what it served;
//! and its bytes per row, which `bench` compares with the CPU's caches.

use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use starwire::rows::ps::{self, checkpoint_file, Create, Float};
use starwire::rows::{Init, MemTable, Optimizer, PsTable, PsTableBuilder};
use starwire::{DType, Status, Table};

use crate::cpu;

/// Default `--table` of serve and bench: the id of the rows table.
pub const DEFAULT_TABLE: u32 = 1;
/// Default `--dim`: f32 per row (64-byte rows).
pub const DEFAULT_DIM: usize = 16;
/// Default `--rows` of serve and bench: the rows serve makes at start, ids `0..N`, and the
/// ids bench draws from. (What the table grew to under bench's default load before serve
/// made its rows at start.)
pub const DEFAULT_ROWS: u64 = 100_000;
/// Largest `--dim`: rows of 1 MiB, the default `max_row_bytes`.
pub const MAX_DIM: usize = 1 << 18;
/// Most `--rows`: the most rows a `PsTable` holds.
pub const MAX_ROWS: u64 = u32::MAX as u64 - 2;
/// Rows written per call when the table is filled at start.
const FILL_CHUNK: u64 = 4096;

/// Which table serve serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableKind {
    /// starwire's PS table.
    Ps,
    /// The small in-memory table, kept to compare with.
    Mem,
}

impl fmt::Display for TableKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TableKind::Ps => "PsTable",
            TableKind::Mem => "MemTable",
        })
    }
}

/// `ps` or `mem`.
pub fn parse_table_kind(text: &str) -> Result<TableKind, String> {
    match text {
        "ps" => Ok(TableKind::Ps),
        "mem" => Ok(TableKind::Mem),
        _ => Err(format!(
            "{text:?}: expected ps (starwire's PS table) or mem (the small MemTable)"
        )),
    }
}

/// How the table applies pushed gradients (its settings are options of their own).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptimizerKind {
    /// `w -= lr * g`.
    Sgd,
    /// `acc += g * g; w -= lr * g / sqrt(acc)`.
    Adagrad,
    /// Adam with PyTorch's betas and epsilon (0.9, 0.999, 1e-8), a step count per row
    /// (`--table-kind ps` only).
    Adam,
}

impl fmt::Display for OptimizerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OptimizerKind::Sgd => "sgd",
            OptimizerKind::Adagrad => "adagrad",
            OptimizerKind::Adam => "adam",
        })
    }
}

/// `sgd`, `adagrad` or `adam`.
pub fn parse_optimizer(text: &str) -> Result<OptimizerKind, String> {
    match text {
        "sgd" | "SGD" => Ok(OptimizerKind::Sgd),
        "adagrad" | "Adagrad" => Ok(OptimizerKind::Adagrad),
        "adam" | "Adam" => Ok(OptimizerKind::Adam),
        _ => Err(format!("{text:?}: expected sgd, adagrad or adam")),
    }
}

/// The values of a new row.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum InitSpec {
    /// Zeros; a pull of an unknown id creates its row.
    Zeros,
    /// Zeros, and a pull of an unknown id creates nothing: it is answered missing.
    Missing,
    /// Uniform in `[-scale, scale]`.
    Uniform { scale: f32, seed: u64 },
    /// Normal, standard deviation `std` (`--table-kind ps` only).
    Normal { std: f32, seed: u64 },
    /// Normal, standard deviation `std`, redrawn beyond two (`--table-kind ps` only).
    TruncatedNormal { std: f32, seed: u64 },
}

impl fmt::Display for InitSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            InitSpec::Zeros => f.write_str("zeros"),
            InitSpec::Missing => f.write_str("missing"),
            InitSpec::Uniform { scale, seed } => write!(f, "uniform:{scale}:{seed}"),
            InitSpec::Normal { std, seed } => write!(f, "normal:{std}:{seed}"),
            InitSpec::TruncatedNormal { std, seed } => {
                write!(f, "truncated-normal:{std}:{seed}")
            }
        }
    }
}

/// `zeros`, `missing`, or `uniform`, `normal`, `truncated-normal`, each optionally with
/// `:SCALE` and `:SEED` (scale finite and 0 or more, default 0.01; seed default 0).
pub fn parse_init(text: &str) -> Result<InitSpec, String> {
    let bad = || {
        format!(
            "{text:?}: expected zeros, missing, or uniform, normal or truncated-normal, each \
             with :SCALE[:SEED] or not"
        )
    };
    let mut parts = text.split(':');
    let kind = parts.next().unwrap_or_default();
    if matches!(kind, "zeros" | "missing") {
        if parts.next().is_some() {
            return Err(bad());
        }
        return Ok(if kind == "zeros" {
            InitSpec::Zeros
        } else {
            InitSpec::Missing
        });
    }
    let scale = match parts.next() {
        Some(s) => s
            .parse::<f32>()
            .ok()
            .filter(|x| x.is_finite() && *x >= 0.0)
            .ok_or_else(bad)?,
        None => 0.01,
    };
    let seed = match parts.next() {
        Some(s) => s.parse::<u64>().map_err(|_| bad())?,
        None => 0,
    };
    if parts.next().is_some() {
        return Err(bad());
    }
    match kind {
        "uniform" => Ok(InitSpec::Uniform { scale, seed }),
        "normal" => Ok(InitSpec::Normal { std: scale, seed }),
        "truncated-normal" | "truncated_normal" => {
            Ok(InitSpec::TruncatedNormal { std: scale, seed })
        }
        _ => Err(bad()),
    }
}

/// `f32`, `bf16` or `f16`.
pub fn parse_stored(text: &str) -> Result<Float, String> {
    match text {
        "f32" => Ok(Float::F32),
        "bf16" => Ok(Float::Bf16),
        "f16" => Ok(Float::F16),
        _ => Err(format!("{text:?}: expected f32, bf16 or f16")),
    }
}

/// The name [`parse_stored`] reads.
pub fn float_name(f: Float) -> &'static str {
    match f {
        Float::F32 => "f32",
        Float::Bf16 => "bf16",
        Float::F16 => "f16",
    }
}

/// A learning rate or an accumulator: a finite number more than 0.
pub fn parse_rate(text: &str) -> Result<f32, String> {
    match text.parse::<f32>() {
        Ok(x) if x.is_finite() && x > 0.0 => Ok(x),
        _ => Err(format!("{text:?}: expected a number more than 0")),
    }
}

/// The rows table of a server: its id, kind, row shape, values and optimizer, the rows it
/// starts with, and where its checkpoints are.
#[derive(Debug, Clone, PartialEq)]
pub struct TableSpec {
    /// The table's id.
    pub id: u32,
    /// Which table.
    pub kind: TableKind,
    /// f32 per row, as served.
    pub dim: usize,
    /// How elements are stored (`--table-kind ps`).
    pub stored: Float,
    /// How a new row starts.
    pub init: InitSpec,
    /// How gradients apply.
    pub optimizer: OptimizerKind,
    /// The optimizer's learning rate.
    pub lr: f32,
    /// Adagrad's squared-gradient sum of a new row.
    pub initial_accumulator: f32,
    /// Rows made at start: ids `0..rows`.
    pub rows: u64,
    /// Where the table's checkpoint is loaded from, when there is one.
    pub checkpoint_dir: Option<PathBuf>,
}

impl Default for TableSpec {
    /// Table 1: a `PsTable` of rows of 16 f32 starting at zero, SGD with learning rate
    /// 0.01, [`DEFAULT_ROWS`] rows made at start.
    fn default() -> TableSpec {
        TableSpec {
            id: DEFAULT_TABLE,
            kind: TableKind::Ps,
            dim: DEFAULT_DIM,
            stored: Float::F32,
            init: InitSpec::Zeros,
            optimizer: OptimizerKind::Sgd,
            lr: 0.01,
            initial_accumulator: 0.1,
            rows: DEFAULT_ROWS,
            checkpoint_dir: None,
        }
    }
}

impl fmt::Display for TableSpec {
    /// `table 1: PsTable, rows of 16 f32 (64 B), zeros, sgd lr 0.01`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "table {}: {}, rows of {} f32 ({} B",
            self.id,
            self.kind,
            self.dim,
            self.dim * 4
        )?;
        if self.stored != Float::F32 {
            write!(f, "; stored as {}", float_name(self.stored))?;
        }
        write!(f, "), {}, {} lr {}", self.init, self.optimizer, self.lr)?;
        match self.optimizer {
            OptimizerKind::Adagrad => {
                write!(f, " initial accumulator {}", self.initial_accumulator)
            }
            OptimizerKind::Adam => f.write_str(" betas 0.9 0.999"),
            OptimizerKind::Sgd => Ok(()),
        }
    }
}

impl TableSpec {
    /// What is wrong with these settings, naming the option.
    pub fn check(&self) -> Result<(), String> {
        if !(1..=MAX_DIM).contains(&self.dim) {
            return Err(format!(
                "--dim {}: expected 1 to {MAX_DIM} f32 per row",
                self.dim
            ));
        }
        if self.rows > MAX_ROWS {
            return Err(format!("--rows {}: expected at most {MAX_ROWS}", self.rows));
        }
        if self.kind == TableKind::Mem {
            let ps_only = if self.stored != Float::F32 {
                Some(format!("--stored {}", float_name(self.stored)))
            } else if self.optimizer == OptimizerKind::Adam {
                Some("--optimizer adam".to_owned())
            } else if matches!(
                self.init,
                InitSpec::Normal { .. } | InitSpec::TruncatedNormal { .. }
            ) {
                Some(format!("--init {}", self.init))
            } else if self.checkpoint_dir.is_some() {
                Some("--checkpoint-dir (a MemTable has no checkpoints)".to_owned())
            } else {
                None
            };
            if let Some(what) = ps_only {
                return Err(format!("{what} needs --table-kind ps"));
            }
        }
        Ok(())
    }

    /// The `PsTable` of these settings (rows served as f32; the index sized for the rows
    /// made at start).
    pub fn ps_builder(&self) -> PsTableBuilder {
        let init = match self.init {
            InitSpec::Zeros | InitSpec::Missing => ps::Init::Zeros,
            InitSpec::Uniform { scale, seed } => ps::Init::Uniform { scale, seed },
            InitSpec::Normal { std, seed } => ps::Init::Normal { std, seed },
            InitSpec::TruncatedNormal { std, seed } => ps::Init::TruncatedNormal { std, seed },
        };
        let optimizer = match self.optimizer {
            OptimizerKind::Sgd => ps::Optimizer::Sgd { lr: self.lr },
            OptimizerKind::Adagrad => ps::Optimizer::Adagrad {
                lr: self.lr,
                initial_accumulator: self.initial_accumulator,
            },
            OptimizerKind::Adam => ps::Optimizer::adam(self.lr),
        };
        let create = match self.init {
            InitSpec::Missing => Create::OnPush,
            _ => Create::OnPullOrPush,
        };
        PsTable::builder(self.dim)
            .table_id(self.id)
            .stored_as(self.stored)
            .init(init)
            .optimizer(optimizer)
            .create(create)
            .capacity(self.rows)
    }

    /// The `MemTable` of these settings (checked: no PS-only setting).
    fn mem_table(&self) -> MemTable {
        let init = match self.init {
            InitSpec::Uniform { scale, seed } => Init::Uniform { scale, seed },
            InitSpec::Missing => Init::Missing,
            _ => Init::Zeros,
        };
        let optimizer = match self.optimizer {
            OptimizerKind::Adagrad => Optimizer::Adagrad {
                lr: self.lr,
                initial_accumulator: self.initial_accumulator,
            },
            _ => Optimizer::Sgd { lr: self.lr },
        };
        MemTable::new(self.dim, init, optimizer)
    }

    /// Bytes the table holds per row: a `PsTable`'s slot and index share (exact), a
    /// `MemTable`'s values, Adagrad sums and hash-map entry (about).
    pub fn bytes_per_row(&self) -> u64 {
        match self.kind {
            TableKind::Ps => {
                let probe = self.ps_builder().capacity(0).max_rows(1).huge_pages(false);
                probe.build().map_or(0, |t| t.bytes_per_row() as u64)
            }
            TableKind::Mem => {
                let values = self.dim as u64 * 4;
                let sums = if self.optimizer == OptimizerKind::Adagrad {
                    values
                } else {
                    0
                };
                values + sums + 16
            }
        }
    }

    /// The path of the table's checkpoint in `--checkpoint-dir`.
    pub fn checkpoint_path(&self) -> Option<PathBuf> {
        self.checkpoint_dir
            .as_ref()
            .map(|d| d.join(checkpoint_file(self.id)))
    }
}

/// A `MemTable` and counters of what it served (a `PsTable` counts for itself).
pub struct CountedMem {
    table: MemTable,
    pulled: AtomicU64,
    missing: AtomicU64,
    pushed: AtomicU64,
}

impl Table for CountedMem {
    fn dtype(&self) -> DType {
        self.table.dtype()
    }

    fn row_dims(&self) -> &[u64] {
        self.table.row_dims()
    }

    fn row_bytes(&self) -> usize {
        self.table.row_bytes()
    }

    fn pull(&self, ids: &[u64], out: &mut [u8], missing: &mut Vec<u32>) -> Status {
        let before = missing.len();
        let status = self.table.pull(ids, out, missing);
        self.count_pull(status, ids.len(), missing.len() - before);
        status
    }

    fn pull_versioned(
        &self,
        ids: &[u64],
        held: &[u64],
        out: &mut [u8],
        versions: &mut [u64],
        missing: &mut Vec<u32>,
    ) -> Status {
        let before = missing.len();
        let status = self.table.pull_versioned(ids, held, out, versions, missing);
        self.count_pull(status, ids.len(), missing.len() - before);
        status
    }

    fn push(&self, ids: &[u64], grads: &[u8]) -> Status {
        let status = self.table.push(ids, grads);
        if status == Status::Ok {
            self.pushed.fetch_add(ids.len() as u64, Ordering::Relaxed);
        }
        status
    }
}

impl CountedMem {
    /// Counts a pull of `rows` rows, `missing` of them missing, that ended with `status`.
    fn count_pull(&self, status: Status, rows: usize, missing: usize) {
        if status == Status::Ok {
            self.pulled.fetch_add(rows as u64, Ordering::Relaxed);
            if missing > 0 {
                self.missing.fetch_add(missing as u64, Ordering::Relaxed);
            }
        }
    }
}

/// What a rows table served so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RowsServed {
    /// Rows answered to pulls (missing ones included).
    pub pulled: u64,
    /// Rows pulls found missing.
    pub missing: u64,
    /// Gradient rows applied.
    pub pushed: u64,
    /// Rows the table holds.
    pub stored: u64,
}

/// The rows table a server serves.
pub enum RowsTable {
    /// starwire's PS table (boxed: its counters sit on cache lines of their own).
    Ps(Box<PsTable>),
    /// The small in-memory table, with counters.
    Mem(CountedMem),
}

impl RowsTable {
    /// The table to serve.
    pub fn table(&self) -> &dyn Table {
        match self {
            RowsTable::Ps(t) => &**t,
            RowsTable::Mem(t) => t,
        }
    }

    /// What it served so far.
    pub fn served(&self) -> RowsServed {
        match self {
            RowsTable::Ps(t) => {
                let m = t.metrics();
                RowsServed {
                    pulled: m.pulled_rows,
                    missing: m.missing,
                    pushed: m.pushed_rows - m.dropped_pushes,
                    stored: m.rows,
                }
            }
            RowsTable::Mem(t) => RowsServed {
                pulled: t.pulled.load(Ordering::Relaxed),
                missing: t.missing.load(Ordering::Relaxed),
                pushed: t.pushed.load(Ordering::Relaxed),
                stored: t.table.len() as u64,
            },
        }
    }

    /// The row of `id`, if the table has one.
    pub fn get(&self, id: u64) -> Option<Vec<f32>> {
        match self {
            RowsTable::Ps(t) => t.get(id),
            RowsTable::Mem(t) => t.table.get(id),
        }
    }
}

/// The table of `spec`, with its rows: loaded from its checkpoint in `--checkpoint-dir`
/// when there is one, else made at start (ids `0..spec.rows`, their initializer's values).
/// Also a line saying which, with the table's bytes and where they fit among the caches.
pub fn start(spec: &TableSpec) -> Result<(RowsTable, String), String> {
    spec.check()?;
    let began = Instant::now();
    let path = spec.checkpoint_path();
    if let (Some(dir), Some(path)) = (&spec.checkpoint_dir, &path) {
        if path.exists() {
            let table = spec.ps_builder().load(dir).map_err(|e| e.to_string())?;
            let line = format!(
                "table {}: {} rows loaded from {} in {:.2} s; {}",
                spec.id,
                table.len(),
                path.display(),
                began.elapsed().as_secs_f64(),
                bytes_line(table.metrics().memory_bytes, "")
            );
            return Ok((RowsTable::Ps(Box::new(table)), line));
        }
    }
    let table = match spec.kind {
        TableKind::Ps => {
            let t = spec.ps_builder().build().map_err(|e| e.to_string())?;
            fill_ps(&t, spec)?;
            RowsTable::Ps(Box::new(t))
        }
        TableKind::Mem => {
            let t = spec.mem_table();
            fill_mem(&t, spec)?;
            RowsTable::Mem(CountedMem {
                table: t,
                pulled: AtomicU64::new(0),
                missing: AtomicU64::new(0),
                pushed: AtomicU64::new(0),
            })
        }
    };
    let bytes = match &table {
        RowsTable::Ps(t) => bytes_line(t.metrics().memory_bytes, ""),
        RowsTable::Mem(_) => bytes_line(spec.rows * spec.bytes_per_row(), "about "),
    };
    let none_yet = match &path {
        Some(p) => format!(" (no checkpoint {} yet)", p.display()),
        None => String::new(),
    };
    let line = format!(
        "table {}: {} rows made at start{none_yet}: ids 0..{}, init {}, in {:.2} s; {bytes}",
        spec.id,
        spec.rows,
        spec.rows,
        spec.init,
        began.elapsed().as_secs_f64()
    );
    Ok((table, line))
}

/// `N MiB in memory: fits in ...`.
fn bytes_line(bytes: u64, about: &str) -> String {
    format!(
        "{about}{} in memory: {}",
        cpu::fmt_bytes(bytes),
        cpu::describe_fit(bytes, &cpu::caches())
    )
}

/// Writes rows `0..spec.rows` of a `PsTable` with its initializer's values.
fn fill_ps(t: &PsTable, spec: &TableSpec) -> Result<(), String> {
    let init = t.init();
    let dim = spec.dim;
    let (mut ids, mut values) = (Vec::new(), Vec::new());
    let mut first = 0;
    while first < spec.rows {
        let last = (first + FILL_CHUNK).min(spec.rows);
        ids.clear();
        ids.extend(first..last);
        values.clear();
        for &id in &ids {
            values.extend((0..dim).map(|k| init.value(spec.id, id, k)));
        }
        t.load_rows(&ids, &values, None)
            .map_err(|e| format!("--rows {}: {e}", spec.rows))?;
        first = last;
    }
    Ok(())
}

/// Writes rows `0..spec.rows` of a `MemTable` with its initializer's values.
fn fill_mem(t: &MemTable, spec: &TableSpec) -> Result<(), String> {
    let init = t.init();
    let mut row = vec![0f32; spec.dim];
    for id in 0..spec.rows {
        for (k, v) in row.iter_mut().enumerate() {
            *v = init.value(id, k);
        }
        t.insert(id, &row)
            .map_err(|e| format!("--rows {}: {e}", spec.rows))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_read() {
        assert_eq!(parse_init("zeros"), Ok(InitSpec::Zeros));
        assert_eq!(parse_init("missing"), Ok(InitSpec::Missing));
        assert_eq!(
            parse_init("uniform"),
            Ok(InitSpec::Uniform {
                scale: 0.01,
                seed: 0
            })
        );
        assert_eq!(
            parse_init("normal:0.5:7"),
            Ok(InitSpec::Normal { std: 0.5, seed: 7 })
        );
        assert_eq!(
            parse_init("truncated-normal:0.2"),
            Ok(InitSpec::TruncatedNormal { std: 0.2, seed: 0 })
        );
        for bad in [
            "",
            "zeros:1",
            "uniform:x",
            "uniform:-1",
            "uniform:1:2:3",
            "uniform:inf",
            "gaussian",
        ] {
            assert!(parse_init(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_optimizer("adam"), Ok(OptimizerKind::Adam));
        assert_eq!(OptimizerKind::Adagrad.to_string(), "adagrad");
        assert!(parse_optimizer("rmsprop").is_err());
        assert_eq!(parse_rate("0.5"), Ok(0.5));
        for bad in ["0", "-1", "NaN", "inf", "x"] {
            assert!(parse_rate(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_stored("bf16"), Ok(Float::Bf16));
        assert!(parse_stored("f64").is_err());
        assert_eq!(parse_table_kind("mem"), Ok(TableKind::Mem));
        assert!(parse_table_kind("hash").is_err());
    }

    #[test]
    fn a_spec_says_what_it_is_and_what_it_refuses() {
        assert_eq!(
            TableSpec::default().to_string(),
            "table 1: PsTable, rows of 16 f32 (64 B), zeros, sgd lr 0.01"
        );
        let spec = TableSpec {
            id: 2,
            dim: 8,
            stored: Float::Bf16,
            init: InitSpec::Uniform {
                scale: 0.5,
                seed: 3,
            },
            optimizer: OptimizerKind::Adagrad,
            lr: 0.05,
            ..TableSpec::default()
        };
        assert_eq!(
            spec.to_string(),
            "table 2: PsTable, rows of 8 f32 (32 B; stored as bf16), uniform:0.5:3, adagrad lr \
             0.05 initial accumulator 0.1"
        );
        let mem = |f: fn(&mut TableSpec)| {
            let mut s = TableSpec {
                kind: TableKind::Mem,
                ..TableSpec::default()
            };
            f(&mut s);
            s.check()
        };
        assert_eq!(mem(|_| {}), Ok(()));
        assert!(mem(|s| s.stored = Float::F16)
            .unwrap_err()
            .contains("--stored f16 needs --table-kind ps"));
        assert!(mem(|s| s.optimizer = OptimizerKind::Adam)
            .unwrap_err()
            .contains("--optimizer adam"));
        assert!(mem(|s| s.checkpoint_dir = Some("/tmp".into()))
            .unwrap_err()
            .contains("--checkpoint-dir"));
        // 16 f32 with SGD: an 80-byte slot (id, version, row) and 10 bytes of index; bf16
        // halves the row.
        assert_eq!(TableSpec::default().bytes_per_row(), 90);
        let half = TableSpec {
            stored: Float::Bf16,
            ..TableSpec::default()
        };
        assert_eq!(half.bytes_per_row(), 58);
    }

    #[test]
    fn rows_are_made_at_start_with_their_initial_values() {
        for kind in [TableKind::Ps, TableKind::Mem] {
            let spec = TableSpec {
                kind,
                dim: 4,
                rows: 10_000,
                init: InitSpec::Uniform {
                    scale: 0.5,
                    seed: 9,
                },
                ..TableSpec::default()
            };
            let (table, line) = start(&spec).unwrap();
            assert_eq!(table.served().stored, 10_000, "{kind}");
            assert!(
                line.starts_with("table 1: 10000 rows made at start: ids 0..10000, init uniform"),
                "{line}"
            );
            assert!(line.contains(" in memory: "), "{line}");
            let row = table.get(9_999).unwrap();
            let want: Vec<f32> = match kind {
                TableKind::Ps => (0..4)
                    .map(|k| {
                        ps::Init::Uniform {
                            scale: 0.5,
                            seed: 9,
                        }
                        .value(1, 9_999, k)
                    })
                    .collect(),
                TableKind::Mem => (0..4)
                    .map(|k| {
                        Init::Uniform {
                            scale: 0.5,
                            seed: 9,
                        }
                        .value(9_999, k)
                    })
                    .collect(),
            };
            assert_eq!(row, want);
            assert!(row.iter().any(|&v| v != 0.0));
            assert!(table.get(10_000).is_none());
        }
    }

    #[test]
    fn a_checkpoint_in_the_folder_is_loaded_instead() {
        let dir = std::env::temp_dir().join(format!("commctl-table-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let spec = TableSpec {
            rows: 5,
            checkpoint_dir: Some(dir.clone()),
            ..TableSpec::default()
        };
        let (table, line) = start(&spec).unwrap();
        assert!(
            line.contains("5 rows made at start (no checkpoint "),
            "{line}"
        );
        let RowsTable::Ps(ps) = &table else {
            panic!("a PsTable")
        };
        ps.load_rows(&[77], &[1.0; 16], None).unwrap();
        ps.save(&dir).unwrap();
        // The next start loads the 6 rows, and makes none.
        let (again, line) = start(&TableSpec {
            rows: 1000,
            ..spec.clone()
        })
        .unwrap();
        assert!(line.starts_with("table 1: 6 rows loaded from "), "{line}");
        assert!(line.contains("table-1.swrows"), "{line}");
        assert_eq!(again.get(77), Some(vec![1.0; 16]));
        // A file of another shape is an error that names it.
        let err = start(&TableSpec { dim: 8, ..spec }).err().unwrap();
        assert!(err.contains("wrong shape"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
