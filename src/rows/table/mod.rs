//! Tables of embedding rows a PS task serves: [`MemTable`], the reference table, and
//! [`Tables`], the registry that names them by id.
//!
//! A [`Table`](crate::Table) answers a pull of ids with one packed block of rows and
//! applies a push of gradient rows. Rows travel as raw little-endian bytes with no
//! alignment, `row_bytes` each, in the order of the ids.

mod mem;
mod registry;

pub use mem::{Init, MemTable, Optimizer};
pub use registry::Tables;
