//! `sw_ps_table_config`: the settings of a PS table (`sw_ps_table`) as a plain struct, its
//! defaults (`sw_ps_table_config_default`), and its conversion to the table's builder.

use starwire::rows::ps::{Consistency, Create, Float, Init, Optimizer, MAX_DIM, MAX_EVICT_TICKS};
use starwire::rows::{PsTable, PsTableBuilder};
use starwire::DType;

use crate::boundary::boundary;
use crate::cast::{Castable, Plain};
use crate::result::Failure;

/// The values a PS table gives the rows it creates: the `kind` of `sw_ps_init`. Every value
/// is a fixed function of (table id, row id, element, seed), so every PS task, every run
/// and every re-creation of a row agree.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum sw_ps_init_kind {
    /// Zero.
    SW_PS_INIT_ZEROS = 0,
    /// Uniform in `[-scale, scale]`.
    SW_PS_INIT_UNIFORM = 1,
    /// Normal, mean 0, standard deviation `scale`.
    SW_PS_INIT_NORMAL = 2,
    /// Normal, mean 0, standard deviation `scale`, values beyond two standard deviations
    /// drawn again (TensorFlow's `truncated_normal`).
    SW_PS_INIT_TRUNCATED_NORMAL = 3,
}

/// The values of a PS table's new rows.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct sw_ps_init {
    /// A `sw_ps_init_kind`.
    pub kind: u32,
    /// Half-width of the uniform range, or the normal's standard deviation (finite, at
    /// least 0). Unused for zeros.
    pub scale: f32,
    /// Selects the values. Unused for zeros.
    pub seed: u64,
}

/// How a PS table applies a gradient row `g` to a row `w`: the `kind` of
/// `sw_ps_optimizer`.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum sw_ps_optimizer_kind {
    /// `w -= lr * g`. No state.
    SW_PS_OPTIMIZER_SGD = 0,
    /// `acc += g * g; w -= lr * g / sqrt(acc)`, `acc` starting at `initial_accumulator`.
    /// State: `acc`, one f32 per element.
    SW_PS_OPTIMIZER_ADAGRAD = 1,
    /// Adam with a step count per row (`beta1`, `beta2`, `epsilon`). State: `beta1^t`,
    /// `beta2^t`, the first moments, the second moments (`2 + 2 * dim` f32).
    SW_PS_OPTIMIZER_ADAM = 2,
}

/// How a PS table applies gradients.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct sw_ps_optimizer {
    /// A `sw_ps_optimizer_kind`.
    pub kind: u32,
    /// Learning rate (finite).
    pub lr: f32,
    /// Adagrad: each element's squared-gradient sum when its row is created (finite, above
    /// 0). Otherwise unused.
    pub initial_accumulator: f32,
    /// Adam: decay of the first moment, in `[0, 1)`. Otherwise unused.
    pub beta1: f32,
    /// Adam: decay of the second moment, in `[0, 1)`. Otherwise unused.
    pub beta2: f32,
    /// Adam: added to the denominator (finite, above 0). Otherwise unused.
    pub epsilon: f32,
}

/// Which calls create the row of an id a PS table does not have: its `create`.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum sw_ps_create {
    /// A pull or a push creates it (a push then applies its gradient).
    SW_PS_CREATE_ON_PULL_OR_PUSH = 0,
    /// Only a push; a pull of an unknown id answers it missing (zeros).
    SW_PS_CREATE_ON_PUSH = 1,
    /// Neither: rows come from `sw_ps_table_load_rows` and checkpoints only; pushes to
    /// unknown ids are dropped.
    SW_PS_CREATE_NEVER = 2,
}

/// What concurrent calls on the same row of a PS table may observe: its `consistency`.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum sw_ps_consistency {
    /// No lock: a pull concurrent with a push of the row may see it partly updated (each
    /// 8-byte word from before or after), two concurrent pushes may lose updates.
    SW_PS_HOGWILD = 0,
    /// A lock per row for pushes and a sequence count for pulls: no lost update, whole
    /// rows.
    SW_PS_PER_ROW = 1,
}

/// The settings of a PS table (`sw_ps_table_new`, `sw_ps_table_load`). Start from
/// `sw_ps_table_config_default(dim)` and change what differs: every field has a meaning at
/// 0, but not always the default one.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct sw_ps_table_config {
    /// The table's number: it selects the initializer's values (two tables with one seed
    /// start with different rows) and names its checkpoint file (`sw_checkpoint_file`).
    /// Serve the table under the same id. Default 0.
    pub table_id: u32,
    /// Elements per row, 1 to 2^20.
    pub dim: usize,
    /// Element format in memory, as a wire dtype code: 10 float32 (default), 7 bfloat16,
    /// 6 float16 (both halve the rows' memory; optimizer state stays float32).
    pub stored: u8,
    /// Element format of pulled rows and pushed gradients (the dtype clients use): 10
    /// float32 (default), or the `stored` code (a pull is then a plain copy).
    pub served: u8,
    /// Values of new rows. Default zeros.
    pub init: sw_ps_init,
    /// How gradients apply. Default SGD with `lr` 0.01 (and, should the kind be changed,
    /// Adagrad's `initial_accumulator` 0.1, Adam's 0.9, 0.999 and 1e-8).
    pub optimizer: sw_ps_optimizer,
    /// Which calls create rows, a `sw_ps_create`. Default on pull or push.
    pub create: u32,
    /// Sightings of an id by calls that may create its row before the row is created, 1
    /// to 255 (1: at once, the default). Before that a pull answers it missing and a
    /// push's gradient is dropped.
    pub admit_after: u32,
    /// Counters (bytes) of the sketch that counts sightings, at least 128 when
    /// `admit_after` is above 1. Default 2^20.
    pub admission_counters: usize,
    /// Evicts rows untouched for this many ticks of the table's clock
    /// (`sw_ps_table_advance_clock`), 1 to 32767, in `sw_ps_table_maintain`; 0: never (the
    /// default).
    pub evict_untouched: u32,
    /// Row cap: at it new rows are refused, over 95 % of it `sw_ps_table_maintain` evicts
    /// the least recently touched down to 90 %; also bounds the address space reserved. 0:
    /// no cap but the table's largest, 2^32 - 3 rows (the default).
    pub max_rows: u64,
    /// Rows expected: the index is sized for them from the start (growth past it works the
    /// same). Default 0.
    pub capacity: u64,
    /// A `sw_ps_consistency`. Default Hogwild.
    pub consistency: u32,
    /// Locks of `SW_PS_PER_ROW` (rounded up to a power of two). Default 16384.
    pub row_locks: usize,
    /// Whether to advise transparent huge pages on the table's memory (what the kernel did
    /// is in `sw_ps_table_report`). Default true.
    pub huge_pages: bool,
    /// One row in this many pulled or pushed is sampled for the hottest ids
    /// (`sw_ps_table_metrics`); 0: no sampling. Default 128.
    pub hot_sample_every: u32,
    /// Whether `sw_ps_table_save` writes around the page cache (`O_DIRECT`) where the file
    /// system allows it. Default true.
    pub checkpoint_direct_io: bool,
}

impl Castable for sw_ps_table_config {
    type Ownership = Plain;
    type RustType = sw_ps_table_config;
}

/// The defaults of every setting (`PsTableBuilder`'s), rows of `dim` elements.
fn defaults(dim: usize) -> sw_ps_table_config {
    sw_ps_table_config {
        table_id: 0,
        dim,
        stored: u8::from(DType::F32),
        served: u8::from(DType::F32),
        init: sw_ps_init {
            kind: sw_ps_init_kind::SW_PS_INIT_ZEROS as u32,
            scale: 0.0,
            seed: 0,
        },
        optimizer: sw_ps_optimizer {
            kind: sw_ps_optimizer_kind::SW_PS_OPTIMIZER_SGD as u32,
            lr: 0.01,
            initial_accumulator: 0.1,
            beta1: 0.9,
            beta2: 0.999,
            epsilon: 1e-8,
        },
        create: sw_ps_create::SW_PS_CREATE_ON_PULL_OR_PUSH as u32,
        admit_after: 1,
        admission_counters: 1 << 20,
        evict_untouched: 0,
        max_rows: 0,
        capacity: 0,
        consistency: sw_ps_consistency::SW_PS_HOGWILD as u32,
        row_locks: 1 << 14,
        huge_pages: true,
        hot_sample_every: 128,
        checkpoint_direct_io: true,
    }
}

/// The default settings of a PS table of rows of `dim` elements (see each field of
/// `sw_ps_table_config`): float32 stored and served, zeros, SGD with learning rate 0.01,
/// rows created by pulls and pushes at their first sighting, no eviction, no row cap,
/// Hogwild, huge pages advised, one row in 128 sampled for the hottest ids, checkpoints
/// written around the page cache; table id 0.
#[no_mangle]
pub extern "C" fn sw_ps_table_config_default(dim: usize) -> sw_ps_table_config {
    boundary!(defaults(dim), { defaults(dim) })
}

/// A wire dtype code as an element format of a PS table; `what` names the field.
fn float_of(code: u8, what: &str) -> Result<Float, Failure> {
    Float::from_dtype(DType::from(code)).ok_or_else(|| {
        Failure::invalid(format!(
            "config.{what} {code} is not 10 (float32), 7 (bfloat16) or 6 (float16)"
        ))
    })
}

fn init_of(i: sw_ps_init) -> Result<Init, Failure> {
    let (scale, seed) = (i.scale, i.seed);
    if i.kind != sw_ps_init_kind::SW_PS_INIT_ZEROS as u32 && !(scale.is_finite() && scale >= 0.0) {
        return Err(Failure::invalid(format!(
            "config.init.scale {scale} is not a finite value of at least 0"
        )));
    }
    Ok(match i.kind {
        k if k == sw_ps_init_kind::SW_PS_INIT_ZEROS as u32 => Init::Zeros,
        k if k == sw_ps_init_kind::SW_PS_INIT_UNIFORM as u32 => Init::Uniform { scale, seed },
        k if k == sw_ps_init_kind::SW_PS_INIT_NORMAL as u32 => Init::Normal { std: scale, seed },
        k if k == sw_ps_init_kind::SW_PS_INIT_TRUNCATED_NORMAL as u32 => {
            Init::TruncatedNormal { std: scale, seed }
        }
        k => {
            return Err(Failure::invalid(format!(
                "config.init.kind {k} is not a sw_ps_init_kind"
            )))
        }
    })
}

fn optimizer_of(o: sw_ps_optimizer) -> Result<Optimizer, Failure> {
    // The table checks the parameters and names the one out of range.
    Ok(match o.kind {
        k if k == sw_ps_optimizer_kind::SW_PS_OPTIMIZER_SGD as u32 => Optimizer::Sgd { lr: o.lr },
        k if k == sw_ps_optimizer_kind::SW_PS_OPTIMIZER_ADAGRAD as u32 => Optimizer::Adagrad {
            lr: o.lr,
            initial_accumulator: o.initial_accumulator,
        },
        k if k == sw_ps_optimizer_kind::SW_PS_OPTIMIZER_ADAM as u32 => Optimizer::Adam {
            lr: o.lr,
            beta1: o.beta1,
            beta2: o.beta2,
            epsilon: o.epsilon,
        },
        k => {
            return Err(Failure::invalid(format!(
                "config.optimizer.kind {k} is not a sw_ps_optimizer_kind"
            )))
        }
    })
}

/// The builder of `c`'s settings; an error names the field out of range (the table's own
/// checks, at build, name the rest).
pub(crate) fn builder_of(c: &sw_ps_table_config) -> Result<PsTableBuilder, Failure> {
    if c.dim == 0 || c.dim > MAX_DIM {
        return Err(Failure::invalid(format!(
            "config.dim {} is not 1 to {MAX_DIM}",
            c.dim
        )));
    }
    let create = match c.create {
        k if k == sw_ps_create::SW_PS_CREATE_ON_PULL_OR_PUSH as u32 => Create::OnPullOrPush,
        k if k == sw_ps_create::SW_PS_CREATE_ON_PUSH as u32 => Create::OnPush,
        k if k == sw_ps_create::SW_PS_CREATE_NEVER as u32 => Create::Never,
        k => {
            return Err(Failure::invalid(format!(
                "config.create {k} is not a sw_ps_create"
            )))
        }
    };
    let consistency = match c.consistency {
        k if k == sw_ps_consistency::SW_PS_HOGWILD as u32 => Consistency::Hogwild,
        k if k == sw_ps_consistency::SW_PS_PER_ROW as u32 => Consistency::PerRow,
        k => {
            return Err(Failure::invalid(format!(
                "config.consistency {k} is not a sw_ps_consistency"
            )))
        }
    };
    let admit_after = match u8::try_from(c.admit_after) {
        Ok(n) if n >= 1 => n,
        _ => {
            return Err(Failure::invalid(format!(
                "config.admit_after {} is not 1 to 255",
                c.admit_after
            )))
        }
    };
    let mut b = PsTable::builder(c.dim)
        .table_id(c.table_id)
        .stored_as(float_of(c.stored, "stored")?)
        .served_as(float_of(c.served, "served")?)
        .init(init_of(c.init)?)
        .optimizer(optimizer_of(c.optimizer)?)
        .create(create)
        .admit_after(admit_after)
        .admission_counters(c.admission_counters)
        .capacity(c.capacity)
        .consistency(consistency)
        .row_locks(c.row_locks)
        .huge_pages(c.huge_pages)
        .hot_sample_every(c.hot_sample_every)
        .checkpoint_direct_io(c.checkpoint_direct_io);
    if c.evict_untouched != 0 {
        match u16::try_from(c.evict_untouched) {
            Ok(ticks) if ticks <= MAX_EVICT_TICKS => b = b.evict_untouched(ticks),
            _ => {
                return Err(Failure::invalid(format!(
                    "config.evict_untouched {} is not 0 (off) or 1 to {MAX_EVICT_TICKS} ticks",
                    c.evict_untouched
                )))
            }
        }
    }
    if c.max_rows != 0 {
        b = b.max_rows(c.max_rows);
    }
    Ok(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_the_builders() {
        // Every setting, field by field (the builder's Debug shows them all).
        let Ok(ours) = builder_of(&sw_ps_table_config_default(8)) else {
            panic!("the defaults are valid")
        };
        assert_eq!(format!("{ours:?}"), format!("{:?}", PsTable::builder(8)));
    }

    #[test]
    fn fields_out_of_range_are_named() {
        let bad = |f: fn(&mut sw_ps_table_config)| {
            let mut c = sw_ps_table_config_default(4);
            f(&mut c);
            match builder_of(&c) {
                Err(f) => f.msg,
                Ok(_) => panic!("{c:?} is refused"),
            }
        };
        assert!(bad(|c| c.dim = 0).contains("config.dim 0"));
        assert!(bad(|c| c.stored = 12).contains("config.stored 12"));
        assert!(bad(|c| c.init.kind = 9).contains("config.init.kind 9"));
        assert!(bad(|c| {
            c.init.kind = sw_ps_init_kind::SW_PS_INIT_NORMAL as u32;
            c.init.scale = f32::NAN;
        })
        .contains("config.init.scale"));
        assert!(bad(|c| c.optimizer.kind = 3).contains("config.optimizer.kind 3"));
        assert!(bad(|c| c.create = 3).contains("config.create 3"));
        assert!(bad(|c| c.consistency = 2).contains("config.consistency 2"));
        assert!(bad(|c| c.admit_after = 0).contains("config.admit_after 0"));
        assert!(bad(|c| c.admit_after = 256).contains("config.admit_after 256"));
        assert!(bad(|c| c.evict_untouched = 40_000).contains("config.evict_untouched"));
        // What the table checks itself comes back from the build.
        let mut c = sw_ps_table_config_default(4);
        c.optimizer.kind = sw_ps_optimizer_kind::SW_PS_OPTIMIZER_ADAM as u32;
        c.optimizer.beta1 = 1.5;
        let Ok(b) = builder_of(&c) else {
            panic!("the table checks beta1")
        };
        let err = b.build().unwrap_err().to_string();
        assert!(err.contains("beta1"), "{err}");
    }
}
