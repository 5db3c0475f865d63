//! `sw_service`: a PS task's service as C callbacks, and the trampolines that call them.

use std::ffi::c_void;
use std::sync::Arc;

use starwire::rows::Tables;
use starwire::{Service, Status, Table, Tensor};

use crate::cast::{box_from, lend, Castable, Plain};
use crate::tensor::{sw_tensor, TensorHandle};

/// A PS task's service, as C callbacks. They run on a loop thread (or a handler thread when
/// `handler_threads > 0`), possibly several at once: they must be thread-safe.
///
/// `pull` gets `n` variable ids and fills, for each `i`, `out_tensors[i]` with a tensor
/// handle whose ownership passes to starwire (from `sw_tensor_new` or `sw_tensor_clone`),
/// or leaves it NULL and sets `out_statuses[i]` to why there is none (wire status codes:
/// 1 `NOT_FOUND`, 7 `INVALID_ARGUMENT`, 8 `INTERNAL`, as in `docs/wire-format.md`).
/// `out_tensors` starts all NULL and `out_statuses` all 0 (`OK`).
///
/// `push` gets `n` pushed tensors, borrowed for the call (`sw_tensor_clone` keeps one), and
/// sets `out_statuses[i]` per item (it starts all 0, `OK`).
///
/// A NULL callback answers its requests with `UNIMPLEMENTED`. Rendezvous recvs are not a
/// callback: they are answered from what the task publishes (`sw_runtime_publish`); rows
/// requests are not either: they are answered by the tables given in `sw_runtime_options`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct sw_service {
    /// Passed to both callbacks.
    pub user_data: *mut c_void,
    /// Answers a pull.
    pub pull: Option<
        unsafe extern "C" fn(
            user_data: *mut c_void,
            ids: *const u64,
            n: usize,
            out_tensors: *mut *mut sw_tensor,
            out_statuses: *mut u32,
        ),
    >,
    /// Applies a push.
    pub push: Option<
        unsafe extern "C" fn(
            user_data: *mut c_void,
            ids: *const u64,
            tensors: *const *const sw_tensor,
            n: usize,
            out_statuses: *mut u32,
        ),
    >,
}

impl Castable for sw_service {
    type Ownership = Plain;
    type RustType = sw_service;
}

/// A C service and the tables of rows served with it.
pub(crate) struct CService(pub(crate) sw_service, pub(crate) Tables);

// SAFETY: `sw_service`'s contract requires thread-safe callbacks and user data; tables are
// `Send + Sync`.
unsafe impl Send for CService {}
// SAFETY: several loop or handler threads may call the callbacks at once, which
// `sw_service`'s contract allows (thread-safe callbacks); the copied callbacks are never
// written, and the tables are `Sync`.
unsafe impl Sync for CService {}

/// A wire status code from C (codes above `u16::MAX` saturate).
fn status(code: u32) -> Status {
    Status::from(code.min(u16::MAX as u32) as u16)
}

impl Service for CService {
    fn table(&self, table: u32) -> Option<&dyn Table> {
        self.1.get(table)
    }

    fn table_ids(&self) -> Vec<u32> {
        self.1.ids().collect()
    }

    fn pull(&self, ids: &[u64], out: &mut Vec<Result<Arc<Tensor>, Status>>) {
        let Some(pull) = self.0.pull else {
            out.extend(ids.iter().map(|_| Err(Status::Unimplemented)));
            return;
        };
        let mut tensors: Vec<*mut sw_tensor> = vec![std::ptr::null_mut(); ids.len()];
        let mut statuses = vec![0u32; ids.len()];
        // SAFETY: the service's callback, thread-safe by `sw_service`'s contract, called with
        // its own user data and three arrays of `ids.len()` elements each that live for the
        // call (the outputs initialized as the contract says: NULL and 0).
        unsafe {
            pull(
                self.0.user_data,
                ids.as_ptr(),
                ids.len(),
                tensors.as_mut_ptr(),
                statuses.as_mut_ptr(),
            )
        };
        for (t, s) in tensors.into_iter().zip(statuses) {
            // A handle left there passes to starwire (`sw_service`'s contract).
            out.push(match box_from::<sw_tensor>(t) {
                Some(handle) => Ok(handle.tensor),
                None => {
                    let s = status(s);
                    Err(if s.is_ok() { Status::NotFound } else { s })
                }
            });
        }
    }

    fn push(&self, items: &mut Vec<(u64, Tensor)>, statuses: &mut Vec<Status>) {
        let Some(push) = self.0.push else {
            statuses.extend(items.iter().map(|_| Status::Unimplemented));
            return;
        };
        let ids: Vec<u64> = items.iter().map(|(id, _)| *id).collect();
        let handles: Vec<TensorHandle> = items
            .drain(..)
            .map(|(_, t)| TensorHandle::owned(Arc::new(t)))
            .collect();
        let ptrs: Vec<*const sw_tensor> = handles.iter().map(lend::<sw_tensor>).collect();
        let mut out = vec![0u32; ids.len()];
        // SAFETY: the service's callback, thread-safe by `sw_service`'s contract, called with
        // its own user data and arrays of `ids.len()` elements each that live for the call;
        // the tensor pointers are lent from `handles`, which outlives the call.
        unsafe {
            push(
                self.0.user_data,
                ids.as_ptr(),
                ptrs.as_ptr(),
                ids.len(),
                out.as_mut_ptr(),
            )
        };
        statuses.extend(out.into_iter().map(status));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use starwire::rows::PsTable;

    #[test]
    fn a_c_service_lists_the_tables_it_serves() {
        // What a checkpoint, the tables' upkeep and STATS go through.
        let none = sw_service {
            user_data: std::ptr::null_mut(),
            pull: None,
            push: None,
        };
        let table =
            |id| Arc::new(PsTable::builder(2).table_id(id).build().unwrap()) as Arc<dyn Table>;
        let tables = Tables::new().with(9, table(9)).with(4, table(4));
        let service = CService(none, tables);
        assert_eq!(service.table_ids(), [4, 9]);
        assert!(service.table(4).is_some() && service.table(5).is_none());
    }
}
