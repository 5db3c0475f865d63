//! Containing panics of code the caller supplies (services, allocators, callbacks).

/// Runs user code (a handler, an allocator hook, a callback) so that a panic in it becomes
/// `None` and a log line, instead of unwinding through a loop that has buffers in flight.
pub(crate) fn guarded<T>(what: &str, f: impl FnOnce() -> T) -> Option<T> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(v) => Some(v),
        Err(_) => {
            log::error!("{what} panicked; the request fails with INTERNAL");
            None
        }
    }
}
