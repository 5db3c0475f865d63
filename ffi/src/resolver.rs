//! Task names over the C ABI: `ps:0`, `/job:ps/task:0` or a `host:port`, turned into the
//! address every request function takes.

use std::ffi::c_char;

use starwire::cluster::endpoint_map::EndpointMap;
use starwire::cluster::Resolver;
use starwire::cluster::TfConfig;

use crate::boundary::boundary;
use crate::cast::{free_box, peer_text, to_boxed, try_out, try_out_slice, try_ref, try_str};
use crate::cast::{Boxed, Castable};
use crate::result::{sw_result, Failure};

/// Turns task names into addresses: through a cluster spec (`TF_CONFIG`) and an endpoint
/// map (`.endpoint_map`), as `docs/tuning.md` describes. Shared between threads freely.
pub struct sw_resolver {
    _private: [u8; 0],
}

impl Castable for sw_resolver {
    type Ownership = Boxed;
    type RustType = Resolver;
}

fn resolve_error(e: impl std::fmt::Display) -> Failure {
    Failure::invalid(e.to_string())
}

/// Creates a resolver. `tf_config`: the `TF_CONFIG` JSON text, or NULL to read the
/// `TF_CONFIG` environment variable (unset or empty: a resolver of `host:port` texts only).
/// `endpoint_map`: the text of the endpoint map (`control_host:port=data_host:port` lines),
/// or NULL to load `.endpoint_map` from the folder in `TF_SEASTAR_ENDPOINT_MAP_PATH`, else
/// the current folder (read only when there is a cluster spec). On `SW_OK`, `*out` is a new
/// handle the caller frees with `sw_resolver_free`.
///
/// Fails with `SW_ERR_INVALID_ARGUMENT` naming every problem of the spec or the map.
///
/// # Safety
/// `tf_config` and `endpoint_map` are NULL or NUL-terminated strings; `out` is writable.
#[no_mangle]
pub extern "C" fn sw_resolver_new(
    tf_config: *const c_char,
    endpoint_map: *const c_char,
    out: *mut *mut sw_resolver,
) -> sw_result {
    boundary!({
        let out = try_out!(out);
        let text = |p: *const c_char, what: &str| -> Result<Option<&str>, Failure> {
            if p.is_null() {
                return Ok(None);
            }
            Ok(Some(try_str!(p, what)))
        };
        let (spec, map) = (
            text(tf_config, "tf_config")?,
            text(endpoint_map, "endpoint_map")?,
        );
        let resolver = match (spec, map) {
            (None, None) => Resolver::from_env().map_err(resolve_error)?,
            (spec, map) => {
                let (source, spec) = match spec {
                    Some(s) => ("tf_config", Some(s.to_owned())),
                    None => ("TF_CONFIG", std::env::var("TF_CONFIG").ok()),
                };
                match spec.filter(|s| !s.is_empty()) {
                    None => Resolver::addresses_only(),
                    Some(spec) => {
                        let tf = TfConfig::parse_all(&spec).map_err(|errors| {
                            let all: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
                            Failure::invalid(format!("{source}: {}", all.join("; ")))
                        })?;
                        let r = Resolver::for_spec(&tf.cluster).with_source(source);
                        match map {
                            Some(m) => {
                                let map = EndpointMap::parse("endpoint_map", m.as_bytes())
                                    .map_err(|problems| {
                                        let all: Vec<String> =
                                            problems.iter().map(|p| p.to_string()).collect();
                                        Failure::invalid(all.join("; "))
                                    })?;
                                r.with_map(&map)
                            }
                            None => r.load_map(None).map_err(resolve_error)?,
                        }
                    }
                }
            }
        };
        out.write(to_boxed(resolver));
        Ok(())
    })
}

/// Releases a resolver. NULL is ignored.
///
/// # Safety
/// `r` is NULL or a handle from `sw_resolver_new` not freed before.
#[no_mangle]
pub extern "C" fn sw_resolver_free(r: *mut sw_resolver) {
    boundary!((), { free_box(r) })
}

/// The address of `target` (`ps:0`, `/job:ps/task:0`, `/job:ps/replica:0/task:0`, or a
/// `host:port`, a host name looked up now), written to `out` as a NUL-terminated
/// `host:port` the request functions take (`sw_resolver_peer` writes one that also names
/// the task, for the requests' errors). `out` has room for `capacity` bytes (64 always
/// suffice). Fails with `SW_ERR_INVALID_ARGUMENT` saying why the target does not
/// resolve, or when `capacity` is too small.
///
/// # Safety
/// `r` is a live resolver; `target` a NUL-terminated string; `out` has room for `capacity`
/// bytes.
#[no_mangle]
pub extern "C" fn sw_resolver_resolve(
    r: *const sw_resolver,
    target: *const c_char,
    out: *mut c_char,
    capacity: usize,
) -> sw_result {
    boundary!({
        let r = try_ref!(r, "resolver");
        let target = try_str!(target);
        let out = try_out_slice!(out, capacity);
        let peer = r.resolve(target).map_err(resolve_error)?;
        let text = peer.addr().to_string();
        write_text(&text, out, capacity)
    })
}

/// The peer `target` names (as for `sw_resolver_resolve`), written to `out` as the
/// NUL-terminated string the request functions take: `task@host:port`
/// (`ps:1@10.0.0.2:5555`) when the target is a task name or an address the cluster has a
/// task at, so that the requests' errors name the task; else `host:port`. `out` has room
/// for `capacity` bytes (128 always suffice for a task name of up to 60 bytes). Fails as
/// `sw_resolver_resolve` does.
///
/// # Safety
/// `r` is a live resolver; `target` a NUL-terminated string; `out` has room for `capacity`
/// bytes.
#[no_mangle]
pub extern "C" fn sw_resolver_peer(
    r: *const sw_resolver,
    target: *const c_char,
    out: *mut c_char,
    capacity: usize,
) -> sw_result {
    boundary!({
        let r = try_ref!(r, "resolver");
        let target = try_str!(target);
        let out = try_out_slice!(out, capacity);
        let peer = r.resolve(target).map_err(resolve_error)?;
        write_text(&peer_text(&peer), out, capacity)
    })
}

/// Writes `text` and its NUL into `out` (`capacity` bytes), or fails naming the room it
/// needs.
fn write_text(
    text: &str,
    out: &mut [std::mem::MaybeUninit<c_char>],
    capacity: usize,
) -> Result<(), Failure> {
    if text.len() >= capacity {
        return Err(Failure::invalid(format!(
            "{text} needs {} bytes and out has {capacity}",
            text.len() + 1
        )));
    }
    // The text and its NUL: `text.len() + 1 <= capacity` bytes.
    let bytes = text.bytes().chain([0]);
    for (o, b) in out.iter_mut().zip(bytes) {
        o.write(b as c_char);
    }
    Ok(())
}

/// The number of tasks of `job` in the cluster spec, each of which resolves (`job:0` to
/// `job:<count - 1>`). Fails with `SW_ERR_INVALID_ARGUMENT` when there is no cluster spec,
/// no such job, or a task of it does not resolve.
///
/// # Safety
/// `r` is a live resolver; `job` a NUL-terminated string; `count` is writable.
#[no_mangle]
pub extern "C" fn sw_resolver_tasks(
    r: *const sw_resolver,
    job: *const c_char,
    count: *mut usize,
) -> sw_result {
    boundary!({
        let r = try_ref!(r, "resolver");
        let job = try_str!(job);
        let count = try_out!(count);
        let peers = r.peers(job).map_err(resolve_error)?;
        count.write(peers.len());
        Ok(())
    })
}
