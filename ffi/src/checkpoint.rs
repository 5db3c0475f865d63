//! Checkpoints through the C ABI: a `CHECKPOINT` request to a peer, which saves the tables
//! it serves into its own checkpoint directory and answers with the manifest
//! (`docs/wire-format.md`, section 4.12), submitted like any request or submitted and
//! waited for in one call.

use std::ffi::c_char;

use crate::boundary::boundary;
use crate::cast::{to_c_string, try_addr, try_out};
use crate::client::{client_mut, deadline, submit, sw_client, with_client};
use crate::result::{c_string, sw_result, Failure};

/// Asks `peer` (`host:port`) to save the tables it serves (a `CHECKPOINT` request): it
/// writes one file per table into its own checkpoint directory (its setting
/// `STARWIRE_CHECKPOINT_DIR`, never named by the requester), each atomically while the
/// table serves, then the manifest `checkpoint.json`. The reply has one tensor (dtype `U8`,
/// rank 1) holding the manifest, a JSON document naming each table's file, rows and bytes,
/// not NUL-terminated (`sw_client_checkpoint_wait` gives it as a string).
///
/// The request fails with `SW_ERR_REMOTE` and, in `sw_last_error_status` and
/// `sw_last_error_remote`, the peer's status and words: `UNIMPLEMENTED` (9) when the peer
/// has no checkpoint directory or nothing it can save, `UNAVAILABLE` (10) when it is saving
/// already with two more checkpoints queued (retry later), `INTERNAL` (8) naming each
/// table that failed to save and why (its previous manifest stays in place). Saving takes
/// about a second per GB of table: give a `timeout_ms` to match (0: no deadline).
///
/// # Safety
/// `c` is a live client used by this thread only; `peer` a NUL-terminated string; `tag`
/// writable.
#[no_mangle]
pub extern "C" fn sw_client_checkpoint(
    c: *mut sw_client,
    peer: *const c_char,
    timeout_ms: u64,
    tag: *mut u64,
) -> sw_result {
    boundary!({
        submit(c, peer, tag, |client, p| {
            with_client!(client, |h| h
                .checkpoint(p, deadline(timeout_ms))
                .map(|t| t.tag()))
        })
    })
}

/// `sw_client_checkpoint`, submitted and waited for in one call: on `SW_OK`, `*manifest`
/// is the peer's manifest as a NUL-terminated JSON document, which the caller frees with
/// `sw_string_free`. Fails as the request does (`SW_ERR_REMOTE` with the peer's status and
/// words, `SW_ERR_TIMEOUT`, `SW_ERR_CONNECT_FAILED`, ...); `*manifest` is then untouched.
/// Not for clients made with a callback (`SW_ERR_INVALID_ARGUMENT`).
///
/// This is the blocking call of language bindings: one foreign call, and a waiting thread
/// that holds no lock of the caller's runtime (a Python binding releases the GIL around
/// it).
///
/// # Safety
/// `c` is a live client used by this thread only; `peer` a NUL-terminated string;
/// `manifest` writable.
#[no_mangle]
pub extern "C" fn sw_client_checkpoint_wait(
    c: *mut sw_client,
    peer: *const c_char,
    timeout_ms: u64,
    manifest: *mut *mut c_char,
) -> sw_result {
    boundary!({
        let client = client_mut(c)?;
        let peer = try_addr!(peer);
        let manifest = try_out!(manifest);
        if client.callback {
            return Err(Failure::invalid(
                "a checkpoint is waited for with sw_client_wait: not for a client with a \
                 callback",
            ));
        }
        let text = with_client!(client, |h| h
            .checkpoint(peer, deadline(timeout_ms))
            .and_then(|t| h.wait(t)))?;
        manifest.write(to_c_string(c_string(&text)));
        Ok(())
    })
}
