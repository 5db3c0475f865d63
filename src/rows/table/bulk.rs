//! Rows of a [`PsTable`] by id, as f32 values: bulk load (warm start, tests, benchmark
//! harnesses that need given values), export, and a walk over every row.
//!
//! Values are converted to and from the stored format; optimizer state is a list of
//! [`state_len`](PsTable::state_len) f32 per row (see [`Optimizer`](super::ps::Optimizer)).
//! These calls take the same care as a pull and a push ([`Consistency`](super::ps::Consistency)),
//! allocate only what they return, and may run while loops serve the table.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use super::elem::{self, Bf16, Float, Format, F16, F32};
use super::metrics;
use super::ps_table::{Origin, PsTable, Tally};
use super::slots;

/// Slots read under one epoch guard by [`PsTable::for_each_row`].
const WALK_SLOTS: u64 = 4096;

/// What [`PsTable::load_rows`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LoadReport {
    /// Rows created.
    pub created: u64,
    /// Rows that existed and were overwritten.
    pub overwritten: u64,
}

/// Why a bulk call of a [`PsTable`] did nothing, or not everything.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RowsError {
    /// A buffer of the wrong length (nothing was done).
    Length {
        /// Which buffer.
        what: &'static str,
        /// The length it must have, in f32.
        expected: usize,
        /// Its length.
        got: usize,
    },
    /// Rows could not be created: the table is at its row cap or out of memory. The rows
    /// before the first refused one were loaded.
    Refused {
        /// Rows loaded before the refusal.
        loaded: usize,
    },
}

impl fmt::Display for RowsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RowsError::Length {
                what,
                expected,
                got,
            } => write!(f, "{what} holds {got} f32, not {expected}"),
            RowsError::Refused { loaded } => write!(
                f,
                "the table refused a new row (at its row cap, or out of memory) after {loaded} rows"
            ),
        }
    }
}

impl std::error::Error for RowsError {}

fn check_len(what: &'static str, got: usize, expected: usize) -> Result<(), RowsError> {
    if got == expected {
        Ok(())
    } else {
        Err(RowsError::Length {
            what,
            expected,
            got,
        })
    }
}

impl PsTable {
    /// f32 of optimizer state per row.
    pub fn state_len(&self) -> usize {
        self.settings.optimizer.state_len(self.layout.dim)
    }

    /// Writes rows by id: row `i` of `values` (`dim` f32 each) becomes the row of `ids[i]`,
    /// created if absent (whatever the [`Create`](super::ps::Create) and admission settings)
    /// or overwritten. With `state` (`state_len` f32 per row) the optimizer state is set
    /// too; without, a created row gets the initial state and an existing row keeps its
    /// own. A created row is published with its values in place: no pull sees it before.
    pub fn load_rows(
        &self,
        ids: &[u64],
        values: &[f32],
        state: Option<&[f32]>,
    ) -> Result<LoadReport, RowsError> {
        let (dim, state_len) = (self.layout.dim, self.state_len());
        check_len("values", values.len(), ids.len() * dim)?;
        if let Some(state) = state {
            check_len("state", state.len(), ids.len() * state_len)?;
        }
        let optimizer = self.settings.optimizer;
        let mut report = LoadReport::default();
        let mut tally = Tally::default();
        let result = {
            let _guard = self.epoch.enter();
            let mut view = self.index.view();
            let mut result = Ok(());
            for (i, &id) in ids.iter().enumerate() {
                let vals = &values[i * dim..(i + 1) * dim];
                let st = state.map(|s| &s[i * state_len..(i + 1) * state_len]);
                let write = |row: &[AtomicU64], state_words: &[AtomicU64], new: bool| {
                    self.store_values(row, vals);
                    match st {
                        Some(st) => optimizer.state_in(dim, st, state_words),
                        None if new => optimizer.init_state(dim, state_words),
                        None => {}
                    }
                };
                let created =
                    self.find_or_create(&mut view, id, Origin::Load, &mut tally, |row, st| {
                        write(row, st, true)
                    });
                match created {
                    Some((_, true)) => report.created += 1,
                    Some((slot, false)) => {
                        let s = self.layout.slot(self.slots.words(), slot);
                        let (row, st) = self.layout.row_and_state(s);
                        self.write_row(id, || {
                            write(row, st, false);
                            self.renew_version(s);
                        });
                        report.overwritten += 1;
                    }
                    None => {
                        result = Err(RowsError::Refused { loaded: i });
                        break;
                    }
                }
            }
            result
        };
        metrics::add(&self.counters.loaded, report.created + report.overwritten);
        self.count(&tally);
        self.upkeep_step();
        result.map(|()| report)
    }

    /// Reads rows by id, creating nothing: row `i` of `values` (`dim` f32 each) gets the row
    /// of `ids[i]`, and with `state`, its optimizer state; an id without a row gets zeros
    /// and its position appended to `missing`.
    pub fn export_rows(
        &self,
        ids: &[u64],
        values: &mut [f32],
        mut state: Option<&mut [f32]>,
        missing: &mut Vec<u32>,
    ) -> Result<(), RowsError> {
        let (dim, state_len) = (self.layout.dim, self.state_len());
        check_len("values", values.len(), ids.len() * dim)?;
        if let Some(state) = &state {
            check_len("state", state.len(), ids.len() * state_len)?;
        }
        let optimizer = self.settings.optimizer;
        let _guard = self.epoch.enter();
        let view = self.index.view();
        let key_of = |s| self.key_of(s);
        for (i, &id) in ids.iter().enumerate() {
            let vals = &mut values[i * dim..(i + 1) * dim];
            let mut st = state
                .as_deref_mut()
                .map(|s| &mut s[i * state_len..(i + 1) * state_len]);
            let Some(hit) = self.index.find(&view, id, super::index::hash(id), &key_of) else {
                vals.fill(0.0);
                if let Some(st) = st {
                    st.fill(0.0);
                }
                missing.push(i as u32);
                continue;
            };
            let s = self.layout.slot(self.slots.words(), hit.slot());
            let (row, state_words) = self.layout.row_and_state(s);
            self.read_row(id, || {
                self.load_values(row, vals);
                if let Some(st) = st.as_deref_mut() {
                    optimizer.state_out(dim, state_words, st);
                }
            });
        }
        Ok(())
    }

    /// The row of `id` as f32, if it has one. Creates nothing.
    pub fn get(&self, id: u64) -> Option<Vec<f32>> {
        let mut values = vec![0f32; self.layout.dim];
        let mut missing = Vec::new();
        self.export_rows(&[id], &mut values, None, &mut missing)
            .ok()?;
        missing.is_empty().then_some(values)
    }

    /// The version of `id`'s row (see the [module documentation](super::ps)'s row
    /// versions), if it has a row. Creates nothing.
    pub fn version(&self, id: u64) -> Option<u64> {
        let _guard = self.epoch.enter();
        let view = self.index.view();
        let key_of = |s| self.key_of(s);
        let hit = self
            .index
            .find(&view, id, super::index::hash(id), &key_of)?;
        let s = self.layout.slot(self.slots.words(), hit.slot());
        Some(s[super::slots::VERSION_WORD].load(Ordering::Acquire))
    }

    /// The optimizer state of `id`'s row ([`state_len`](Self::state_len) f32), if it has a
    /// row. Creates nothing.
    pub fn state(&self, id: u64) -> Option<Vec<f32>> {
        let mut values = vec![0f32; self.layout.dim];
        let mut state = vec![0f32; self.state_len()];
        let mut missing = Vec::new();
        self.export_rows(&[id], &mut values, Some(&mut state), &mut missing)
            .ok()?;
        missing.is_empty().then_some(state)
    }

    /// Calls `f(id, values, state)` for every row, in slot order (not id order). Rows
    /// created or evicted meanwhile may or may not be seen; each row is read as a pull
    /// would read it.
    pub fn for_each_row(&self, mut f: impl FnMut(u64, &[f32], &[f32])) {
        let (dim, optimizer) = (self.layout.dim, self.settings.optimizer);
        let mut values = vec![0f32; dim];
        let mut state = vec![0f32; self.state_len()];
        self.walk_slots(|id, s| {
            let (row, state_words) = self.layout.row_and_state(s);
            self.read_row(id, || {
                self.load_values(row, &mut values);
                optimizer.state_out(dim, state_words, &mut state);
            });
            f(id, &values, &state);
        });
    }

    /// Calls `f(id, slot words)` for every slot that holds a row, in slot order, a few
    /// thousand slots per epoch guard.
    pub(super) fn walk_slots(&self, mut f: impl FnMut(u64, &[AtomicU64])) {
        let end = self.slots.high_water();
        let mut first = 0;
        while first < end {
            let last = (first + WALK_SLOTS).min(end);
            let _guard = self.epoch.enter();
            let (mut words, bits) = (self.slots.words(), self.slots.live_words());
            for slot in first..last {
                if slots::is_live(bits, slot) {
                    // A slot in use is committed; perhaps after `words` was read.
                    if (slot as usize + 1) * self.layout.stride > words.len() {
                        words = self.slots.words();
                    }
                    let s = self.layout.slot(words, slot as u32);
                    f(s[0].load(Ordering::Relaxed), s);
                }
            }
            first = last;
        }
    }

    /// Stores f32 `vals` as the row in `row`.
    fn store_values(&self, row: &[AtomicU64], vals: &[f32]) {
        match self.layout.stored {
            Float::F32 => elem::store::<F32>(row, 0, vals),
            Float::Bf16 => elem::store::<Bf16>(row, 0, vals),
            Float::F16 => elem::store::<F16>(row, 0, vals),
        }
    }

    /// Loads the row in `row` as f32 into `vals`.
    fn load_values(&self, row: &[AtomicU64], vals: &mut [f32]) {
        fn load<S: Format>(row: &[AtomicU64], vals: &mut [f32]) {
            elem::load::<S>(row, 0, vals);
        }
        match self.layout.stored {
            Float::F32 => load::<F32>(row, vals),
            Float::Bf16 => load::<Bf16>(row, vals),
            Float::F16 => load::<F16>(row, vals),
        }
    }
}
