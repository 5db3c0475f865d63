//! `sw_table`: a table of embedding rows a PS task serves. The small in-memory table is
//! made here (`sw_mem_table_new`), the PS table in `ps_table.rs` (`sw_ps_table_as_table`
//! gives its `sw_table`), a table of C callbacks in `callback_table.rs`; all are served by
//! giving them to `sw_runtime_options.tables`.

use std::sync::Arc;

use starwire::rows::{Init, MemTable, Optimizer, Tables};
use starwire::Table;

use crate::boundary::boundary;
use crate::cast::{free_box, to_boxed, try_out, try_ref, try_slice, Boxed, Castable};
use crate::result::{sw_result, Failure};

/// How the small in-memory table (`sw_mem_table_new`) creates rows: the `kind` of `sw_init`.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum sw_init_kind {
    /// Rows start at zero; a pull of an unknown id creates its row.
    SW_INIT_ZEROS = 0,
    /// A pull creates no row: unknown ids are reported missing (their bytes are zero). A
    /// push to an unknown id creates its row at zero.
    SW_INIT_MISSING = 1,
    /// Each element uniform in `[-scale, scale]`, a fixed function of (id, element, seed),
    /// so every PS task and every run agree; a pull of an unknown id creates its row.
    SW_INIT_UNIFORM = 2,
}

/// How the small in-memory table creates rows.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct sw_init {
    /// A `sw_init_kind`.
    pub kind: u32,
    /// `SW_INIT_UNIFORM`: half-width of the range (finite, at least 0). Otherwise unused.
    pub scale: f32,
    /// `SW_INIT_UNIFORM`: selects the values. Otherwise unused.
    pub seed: u64,
}

/// How the small in-memory table applies a gradient row `g` to a row `w`: the `kind` of
/// `sw_optimizer`.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum sw_optimizer_kind {
    /// `w -= lr * g`, element by element.
    SW_OPTIMIZER_SGD = 0,
    /// `acc += g * g; w -= lr * g / sqrt(acc)`, element by element, `acc` starting at
    /// `initial_accumulator`.
    SW_OPTIMIZER_ADAGRAD = 1,
}

/// How the small in-memory table applies gradients.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct sw_optimizer {
    /// A `sw_optimizer_kind`.
    pub kind: u32,
    /// Learning rate (finite).
    pub lr: f32,
    /// `SW_OPTIMIZER_ADAGRAD`: each element's squared-gradient sum when its row is created
    /// (finite, greater than 0). Otherwise unused.
    pub initial_accumulator: f32,
}

/// A table of embedding rows a PS task serves (shared: a runtime serving it keeps its own
/// reference, and freeing a handle drops one).
pub struct sw_table {
    _private: [u8; 0],
}

/// What a `sw_table` handle is: one reference to a shared table.
impl Castable for sw_table {
    type Ownership = Boxed;
    type RustType = Arc<dyn Table>;
}

fn init_of(init: sw_init) -> Result<Init, Failure> {
    match init.kind {
        k if k == sw_init_kind::SW_INIT_ZEROS as u32 => Ok(Init::Zeros),
        k if k == sw_init_kind::SW_INIT_MISSING as u32 => Ok(Init::Missing),
        k if k == sw_init_kind::SW_INIT_UNIFORM as u32 => {
            if !(init.scale.is_finite() && init.scale >= 0.0) {
                return Err(Failure::invalid(format!(
                    "init.scale {} is not a finite value of at least 0",
                    init.scale
                )));
            }
            Ok(Init::Uniform {
                scale: init.scale,
                seed: init.seed,
            })
        }
        k => Err(Failure::invalid(format!(
            "init.kind {k} is not a sw_init_kind"
        ))),
    }
}

fn optimizer_of(o: sw_optimizer) -> Result<Optimizer, Failure> {
    if !o.lr.is_finite() {
        return Err(Failure::invalid(format!(
            "optimizer.lr {} is not finite",
            o.lr
        )));
    }
    match o.kind {
        k if k == sw_optimizer_kind::SW_OPTIMIZER_SGD as u32 => Ok(Optimizer::Sgd { lr: o.lr }),
        k if k == sw_optimizer_kind::SW_OPTIMIZER_ADAGRAD as u32 => {
            let acc = o.initial_accumulator;
            if !(acc.is_finite() && acc > 0.0) {
                return Err(Failure::invalid(format!(
                    "optimizer.initial_accumulator {acc} is not a finite value above 0"
                )));
            }
            Ok(Optimizer::Adagrad {
                lr: o.lr,
                initial_accumulator: acc,
            })
        }
        k => Err(Failure::invalid(format!(
            "optimizer.kind {k} is not a sw_optimizer_kind"
        ))),
    }
}

/// Creates the small in-memory table: rows of `dim` float32 (dtype 10, row shape `{dim}`)
/// in mutex-guarded shards of a hash map, created as `init` says and updated by
/// `optimizer`; safe to serve from every loop at once. A simple table, kept to compare
/// with: a PS serves the PS table (`sw_ps_table_new`), which is faster, bounds its memory
/// and saves checkpoints. Serve it by giving it to `sw_runtime_options.tables`. On `SW_OK`,
/// `*out` is a new handle the caller frees with `sw_table_free`.
///
/// Fails with `SW_ERR_INVALID_ARGUMENT` for a `dim` of 0 or above 2^32 - 1, an unknown
/// kind, or a parameter out of range (see `sw_init` and `sw_optimizer`).
///
/// # Safety
/// `out` is writable.
#[no_mangle]
pub extern "C" fn sw_mem_table_new(
    dim: usize,
    init: sw_init,
    optimizer: sw_optimizer,
    out: *mut *mut sw_table,
) -> sw_result {
    boundary!({
        let out = try_out!(out);
        if dim == 0 || dim > u32::MAX as usize {
            return Err(Failure::invalid(format!("dim {dim} is not 1 to 2^32 - 1")));
        }
        let table = MemTable::new(dim, init_of(init)?, optimizer_of(optimizer)?);
        out.write(to_boxed(Arc::new(table) as Arc<dyn Table>));
        Ok(())
    })
}

/// Releases a table handle (a runtime serving the table keeps serving it). NULL is ignored.
///
/// # Safety
/// `t` is NULL or a handle from starwire not freed before.
#[no_mangle]
pub extern "C" fn sw_table_free(t: *mut sw_table) {
    boundary!((), { free_box(t) })
}

/// The registry of `options`' tables: `tables[i]` served as table `ids[i]`, `n` of each.
pub(crate) fn tables_of(
    ids: *const u32,
    tables: *const *const sw_table,
    n: usize,
) -> Result<Tables, Failure> {
    let ids = try_slice!(ids, n, "options.table_ids");
    let ts = try_slice!(tables, n, "options.tables");
    let mut registry = Tables::new();
    for (i, (&id, &t)) in ids.iter().zip(ts).enumerate() {
        let t = try_ref!(t, format!("options.tables[{i}]"));
        if registry.get(id).is_some() {
            return Err(Failure::invalid(format!("table id {id} given twice")));
        }
        registry = registry.with(id, t.clone());
    }
    Ok(registry)
}
