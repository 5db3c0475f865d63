//! The panic boundary: every exported function's body runs inside [`boundary!`], so that a
//! panic (a bug in starwire) becomes the function's failure value instead of unwinding into
//! C, which is undefined behaviour.
//!
//! A body that can fail gives an [`Outcome`] (the crate's `Result<(), Failure>`, which
//! `result.rs` turns into a `sw_result` and the thread's last error); a getter that cannot
//! fail gives its value, and names the value C gets should it panic.

use std::panic::{catch_unwind, AssertUnwindSafe};

/// What a body that can fail gives, and the value C gets for it.
pub(crate) trait Outcome {
    /// What the exported function returns.
    type C;
    /// C's value for this outcome.
    fn into_c(self) -> Self::C;
    /// C's value when the body panicked.
    fn panicked() -> Self::C;
}

/// Runs `body`, giving C the value of its outcome, or [`Outcome::panicked`] on a panic.
pub(crate) fn fallible<O: Outcome>(body: impl FnOnce() -> O) -> O::C {
    // The body's state is dropped with the panic: nothing it touched is used afterwards, so
    // asserting unwind safety is sound.
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(outcome) => outcome.into_c(),
        Err(_) => O::panicked(),
    }
}

/// Runs `body`, a getter that cannot fail, giving `default` on a panic.
pub(crate) fn or_default<T>(default: T, body: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(body)).unwrap_or(default)
}

/// Runs an exported function's body inside the panic boundary.
///
/// - `boundary!({ ... })`: a body that can fail, giving an [`Outcome`]; `return Err(..)` and
///   `?` leave the body, not the function around it (the cast macros rely on that).
/// - `boundary!(default, { ... })`: a getter that cannot fail; `default` on a panic.
macro_rules! boundary {
    ($body:block) => {
        $crate::boundary::fallible(|| $body)
    };
    ($default:expr, $body:block) => {
        $crate::boundary::or_default($default, || $body)
    };
}
pub(crate) use boundary;
