//! `sw_client`: a thread's way to submit requests, driven by the runtime's loops or by a
//! loop of its own (an embedded client), with its completions waited for, polled, or
//! given to a callback. Every `sw_client_*` request goes through [`submit`]; the rows
//! requests are in `rows.rs`.

use std::collections::HashMap;
use std::ffi::{c_char, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use starwire::{Completion, Embedded, Error, ErrorKind, Handle, Options, Peer};

use crate::allocator::{allocator_of, sw_allocator};
use crate::boundary::boundary;
use crate::buffers::{lock, Deferred, RowsTargets};
use crate::cast::{box_from, mut_from, to_boxed, Boxed, Castable};
use crate::cast::{try_mut, try_out, try_peer, try_ref, try_slice};
use crate::reply::{answer, sw_reply};
use crate::result::sw_result::{self, *};
use crate::result::{record, Failure};
use crate::runtime::{settings_of, sw_runtime, sw_stats, RuntimeHandle};
use crate::tensor::sw_tensor;

/// A thread's way to submit requests. Used by one thread at a time (a client of the
/// runtime's loops may move between threads; an embedded one stays on the thread that made
/// it); make one per submitting thread.
///
/// Every request function takes its peer as a string: `host:port`, or `task@host:port`
/// (`ps:1@10.0.0.2:5555`, as `sw_resolver_peer` writes it) so that its errors name the task
/// (`sw_last_error_task`) even when no connection to it was ever made.
///
/// A peer that cannot be reached: a connect attempt, and after a failed one (refused, no
/// route to host) another, `STARWIRE_CONNECT_RETRIES` times (default 8), retry n (from 0)
/// after `STARWIRE_CONNECT_BACKOFF_MS` (default 10) doubled n times, at most 2 s: with the
/// defaults 10, 20, 40, ... 1280 ms, 2.55 s in all. An attempt the peer does not answer at
/// all is given up after `STARWIRE_HANDSHAKE_TIMEOUT_MS` (default 5000), without more
/// retries. So a request with `timeout_ms` 0 (no deadline) to a peer that cannot be
/// reached fails with `SW_ERR_CONNECT_FAILED` after about 2.55 s when nothing listens at
/// its address, 5 s when its host does not answer, and within 47.55 s in any case (2.55 s
/// plus 5 s for each of the 9 attempts); its message says where, how often, for how long
/// and why (`could not connect to ps:1 (10.0.0.2:5555) after 9 attempts over 2.6 s:
/// connection refused`; the reason's `errno` is `sw_last_error_os_error`). A `timeout_ms`
/// cuts it short: `SW_ERR_TIMEOUT`, saying it was still connecting and why the last attempt
/// failed (`deadline exceeded while connecting to ps:1 (10.0.0.2:5555): connection refused
/// (attempt 3)`).
pub struct sw_client {
    _private: [u8; 0],
}

/// What a `sw_client` handle is.
pub(crate) struct ClientHandle {
    pub(crate) driven: Driven,
    /// Whether completions go to a callback (no `sw_client_wait`).
    pub(crate) callback: bool,
    /// Rows pulls not yet waited for, by tag: the caller's buffers their blocks go to.
    pub(crate) rows: HashMap<u64, Arc<RowsTargets>>,
    /// For a client with a callback: its rows pulls in flight, shared with the callback.
    pub(crate) callback_rows: Option<Arc<CallbackRows>>,
    /// Completions reported by `sw_client_poll` or `sw_client_wait_any`, kept for
    /// `sw_client_wait`.
    ready: HashMap<u64, Completion>,
}

impl Castable for sw_client {
    type Ownership = Boxed;
    type RustType = ClientHandle;
}

/// What moves a client's requests.
// The common kind stays inline (no pointer to follow per call); the embedded one, larger
// still, is boxed.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Driven {
    /// The runtime's loop threads; the caller's thread only waits.
    Threads(Handle),
    /// A loop of the client's own, run by the thread that made it (`sw_client_new_embedded`).
    Caller(Box<CallerDriven>),
}

/// An embedded client, and the thread that made it: its only driver (an io_uring ring
/// made for a single issuer refuses any other thread).
pub(crate) struct CallerDriven {
    pub(crate) client: Embedded,
    owner: ThreadId,
}

/// Runs `$body` with `$h` bound to the client's [`starwire::Client`], whatever drives it.
macro_rules! with_client {
    ($client:expr, |$h:ident| $body:expr) => {
        match &mut $client.driven {
            $crate::client::Driven::Threads($h) => $body,
            $crate::client::Driven::Caller(caller) => {
                let $h = &mut caller.client;
                $body
            }
        }
    };
}
pub(crate) use with_client;

/// `c` as a client this thread may use: `SW_ERR_NULL` for NULL, `SW_ERR_INVALID_ARGUMENT`
/// for an embedded client made by another thread.
pub(crate) fn client_mut<'a>(c: *mut sw_client) -> Result<&'a mut ClientHandle, Failure> {
    let client = try_mut!(c, "client");
    if let Driven::Caller(caller) = &client.driven {
        if caller.owner != std::thread::current().id() {
            return Err(Failure::invalid(
                "an embedded client is used only by the thread that made it",
            ));
        }
    }
    Ok(client)
}

/// `c` for a sharded step, which waits for its requests: refused for a client whose
/// completions go to a callback.
pub(crate) fn stepping_client<'a>(c: *mut sw_client) -> Result<&'a mut ClientHandle, Failure> {
    let client = client_mut(c)?;
    if client.callback {
        return Err(Failure::invalid(
            "a sharded step waits for its requests: not for a client with a callback",
        ));
    }
    Ok(client)
}

impl ClientHandle {
    fn new(driven: Driven, callback: bool) -> ClientHandle {
        ClientHandle {
            driven,
            callback,
            rows: HashMap::new(),
            callback_rows: None,
            ready: HashMap::new(),
        }
    }

    /// After a submission: an embedded client's loop turned once, so that the request goes
    /// out now, not at the next wait (the caller may compute meanwhile).
    pub(crate) fn submitted(&mut self) {
        if let Driven::Caller(caller) = &mut self.driven {
            caller.client.drive(Some(Duration::ZERO));
        }
    }

    /// Waits until starwire holds none of `targets`' buffers (a rows pull given up
    /// mid-transfer may still be receiving into them). An embedded client runs its loop
    /// meanwhile: nothing else would.
    pub(crate) fn wait_released(&mut self, targets: &RowsTargets) {
        match &mut self.driven {
            Driven::Threads(_) => targets.wait_released(),
            Driven::Caller(caller) => {
                while targets.held() {
                    caller.client.drive(Some(Duration::from_millis(1)));
                }
            }
        }
    }
}

/// The rows pulls in flight of a client with a callback, by tag, for the callback to find
/// the caller's buffers of each (`count` spares it the lock for other completions).
#[derive(Default)]
pub(crate) struct CallbackRows {
    pub(crate) pending: Mutex<HashMap<u64, Arc<RowsTargets>>>,
    pub(crate) count: AtomicUsize,
}

/// A request's deadline: `timeout_ms` from now, or none for 0.
pub(crate) fn deadline(timeout_ms: u64) -> Option<Instant> {
    (timeout_ms > 0).then(|| Instant::now() + Duration::from_millis(timeout_ms))
}

/// A client of `rt` with room for `capacity` requests in flight, whose completions are
/// taken with `sw_client_wait`. Free it with `sw_client_free` before its runtime.
///
/// # Safety
/// `rt` is a live runtime; `out` is writable.
#[no_mangle]
pub extern "C" fn sw_client_new(
    rt: *const sw_runtime,
    capacity: u32,
    out: *mut *mut sw_client,
) -> sw_result {
    boundary!({
        new_client(rt, out, |rt| {
            let handle = rt.runtime.handle(capacity.max(1) as usize);
            Ok(ClientHandle::new(Driven::Threads(handle), false))
        })
    })
}

/// The common part of making a client: checks `rt` and `out`, makes the client with
/// `make`, and writes it to `out`.
fn new_client(
    rt: *const sw_runtime,
    out: *mut *mut sw_client,
    make: impl FnOnce(&RuntimeHandle) -> Result<ClientHandle, Failure>,
) -> Result<(), Failure> {
    let rt = try_ref!(rt);
    let out = try_out!(out);
    out.write(to_boxed(make(rt)?));
    Ok(())
}

/// A client that runs an event loop of its own on the calling thread, instead of handing
/// its requests to the runtime's loops: an *embedded* client. No thread hop on either
/// side of a request, and no loop thread to share a CPU with; in exchange the client moves
/// only while its thread is inside one of its calls (a wait, a poll, a submission), and
/// only the thread that made it may use it (`SW_ERR_INVALID_ARGUMENT` on any other) and
/// free it (`sw_client_free` on another frees nothing).
///
/// A submission turns the loop once, which sends the request at once on a connection that
/// is up; connecting, and taking in the answer, happen during the calls that wait or poll.
/// Its settings are those `rt` was made with (its
/// job, task and settings, and, with `use_env`, the environment as it is now), with the
/// `settings` given here on top: `WORKER_ENABLE_POLLING=true` (or the PS's) makes its waits
/// busy-poll; otherwise they spin for `STARWIRE_SPIN_US`, or twice the client's recent
/// average wait when longer (up to 250 µs), before they sleep in the kernel. It uses the runtime's allocator hooks, called on this thread during its calls
/// (not on a loop thread); it has no limit on requests in flight and no callback form. It
/// is a client only: it does not listen, and it does not serve. Free it before its
/// runtime.
///
/// # Safety
/// `rt` is a live runtime; `setting_names` and `setting_values` point at `settings`
/// NUL-terminated strings each (NULL allowed when `settings` is 0); `out` is writable.
#[no_mangle]
pub extern "C" fn sw_client_new_embedded(
    rt: *const sw_runtime,
    setting_names: *const *const c_char,
    setting_values: *const *const c_char,
    settings: usize,
    out: *mut *mut sw_client,
) -> sw_result {
    boundary!({
        new_client(rt, out, |rt| {
            let more = settings_of(setting_names, setting_values, settings)?;
            let config = rt.source.config(&more)?;
            let options = Options {
                allocator: rt.allocator.clone(),
                ..Options::default()
            };
            let client = Embedded::with_options(config, options).map_err(|e| {
                Failure::new(SW_ERR_IO, format!("starting an embedded client: {e}"))
            })?;
            let driven = Driven::Caller(Box::new(CallerDriven {
                client,
                owner: std::thread::current().id(),
            }));
            Ok(ClientHandle::new(driven, false))
        })
    })
}

/// Callback and user data, callable from loop threads (the callback's contract says so).
struct CCallback(
    unsafe extern "C" fn(*mut c_void, u64, sw_result, *mut sw_reply),
    *mut c_void,
);
// SAFETY: `sw_client_new_with_callback`'s contract makes the callback and its user data
// safe to use from loop threads.
unsafe impl Send for CCallback {}
// SAFETY: several loop threads may call the callback at once, which the same contract
// allows (it makes the callback safe to use from any loop thread); the pair is never
// written.
unsafe impl Sync for CCallback {}

impl CCallback {
    fn call(&self, tag: u64, code: sw_result, reply: *mut sw_reply) {
        // SAFETY: the caller's callback, safe to call from loop threads with its own user
        // data by `sw_client_new_with_callback`'s contract (until the runtime is freed,
        // which joins the loops first); `reply` is NULL or a handle whose ownership passes
        // to it, as that contract says.
        unsafe { (self.0)(self.1, tag, code, reply) };
    }
}

/// A reply handle on its way to a callback, maybe on another thread.
struct ReplyPtr(*mut sw_reply);

// SAFETY: the reply is owned by this value alone until the callback takes it.
unsafe impl Send for ReplyPtr {}

/// A client whose completions are delivered to `callback` (with `user_data`) instead of
/// through `sw_client_wait`: it is called once per completed request, on a loop thread
/// (keep it short; it must not wait on a client). `result` is the request's outcome;
/// `reply` is its answer when `result` is `SW_OK` (owned by the callback: free it with
/// `sw_reply_free`), NULL otherwise.
///
/// # Safety
/// `rt` is a live runtime; `callback` and `user_data` are safe to use from loop threads
/// until the client's runtime is freed; `out` is writable.
#[no_mangle]
pub extern "C" fn sw_client_new_with_callback(
    rt: *const sw_runtime,
    capacity: u32,
    callback: Option<
        unsafe extern "C" fn(
            user_data: *mut c_void,
            tag: u64,
            result: sw_result,
            reply: *mut sw_reply,
        ),
    >,
    user_data: *mut c_void,
    out: *mut *mut sw_client,
) -> sw_result {
    boundary!({
        new_client(rt, out, |rt| {
            let callback = callback.ok_or_else(|| Failure::null("callback"))?;
            let cb = Arc::new(CCallback(callback, user_data));
            let rows = Arc::new(CallbackRows::default());
            let shared = rows.clone();
            let handle = rt.runtime.handle_with_callback(
                capacity.max(1) as usize,
                Arc::new(move |c: Completion| {
                    let tag = c.tag;
                    let targets = if shared.count.load(Ordering::Acquire) > 0 {
                        let t = lock(&shared.pending).remove(&tag);
                        if t.is_some() {
                            shared.count.fetch_sub(1, Ordering::AcqRel);
                        }
                        t
                    } else {
                        None
                    };
                    let (code, reply) = match answer(c.result, targets.as_deref()) {
                        Ok(reply) => (SW_OK, to_boxed(reply)),
                        Err(failure) => {
                            record(&failure);
                            (failure.code, std::ptr::null_mut())
                        }
                    };
                    let reply = ReplyPtr(reply);
                    let cb = cb.clone();
                    let call = move || {
                        let reply = reply;
                        cb.call(tag, code, reply.0)
                    };
                    match targets {
                        // The reply waits until starwire holds none of the caller's buffers (a
                        // pull given up mid-transfer may still be receiving into them).
                        Some(t) => t.when_released(Deferred(Box::new(call))),
                        None => call(),
                    }
                }),
            );
            let mut client = ClientHandle::new(Driven::Threads(handle), true);
            client.callback_rows = Some(rows);
            Ok(client)
        })
    })
}

/// Releases a client. Its rows pulls still in flight are waited for first (they write into
/// the caller's buffers); its other requests still in flight complete unobserved. NULL is
/// ignored.
///
/// An embedded client is freed only by the thread that made it: on another thread this
/// frees nothing and `sw_last_error` says so (this function returns nothing). The client
/// is left as it was, for its own thread to use and free; until then its buffers and
/// tensors in flight stay in use, as for any request not waited for.
///
/// # Safety
/// `c` is NULL or a client from starwire not freed before, and no other thread is inside
/// a call with it.
#[no_mangle]
pub extern "C" fn sw_client_free(c: *mut sw_client) {
    boundary!((), {
        let Some(client) = mut_from(c) else {
            return;
        };
        if let Driven::Caller(caller) = &client.driven {
            if caller.owner != std::thread::current().id() {
                // Only its own thread can run its loop, which may still be receiving into
                // the caller's buffers, or hold requests in the kernel: it is left for that
                // thread.
                let f = Failure::invalid(
                    "sw_client_free: an embedded client is freed only by the thread that \
                     made it; nothing was freed",
                );
                log::error!("{}", f.msg);
                record(&f);
                return;
            }
        }
        let Some(mut client) = box_from(c) else {
            return;
        };
        // Completions already reported (`sw_client_poll`, `sw_client_wait_any`) and not
        // waited for: dropped, giving back the buffers their rows hold.
        client.ready.clear();
        for (tag, targets) in std::mem::take(&mut client.rows) {
            drop(with_client!(client, |h| h.wait_tag(tag)));
            client.wait_released(&targets);
        }
        if let Some(cb) = &client.callback_rows {
            // A callback client's rows pulls: until each has been handed to the callback
            // (which happens once the caller's buffers are back).
            while cb.count.load(Ordering::Acquire) > 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    })
}

/// The steps every `sw_client_*` request takes: the client this thread may use, the peer's
/// address and the room for the tag are checked (in that order); `send` submits the
/// request and gives its tag; an embedded client's loop turns once, so that the request
/// goes out now; the tag is written.
pub(crate) fn submit<E: Into<Failure>>(
    c: *mut sw_client,
    peer: *const c_char,
    tag: *mut u64,
    send: impl FnOnce(&mut ClientHandle, Peer) -> Result<u64, E>,
) -> Result<(), Failure> {
    let client = client_mut(c)?;
    let peer = try_peer!(peer);
    let tag = try_out!(tag);
    let t = send(client, peer).map_err(Into::into)?;
    client.submitted();
    tag.write(t);
    Ok(())
}

/// Pings `peer` (`host:port` or `task@host:port`) with `payload` bytes. `timeout_ms` 0: no
/// deadline (a peer that cannot be reached fails after the connect retries: see
/// `sw_client`). On `SW_OK`,
/// `*tag` names the request.
///
/// # Safety
/// `c` is a live client used by this thread only; `peer` a NUL-terminated string; `tag`
/// writable.
#[no_mangle]
pub extern "C" fn sw_client_ping(
    c: *mut sw_client,
    peer: *const c_char,
    payload: u32,
    timeout_ms: u64,
    tag: *mut u64,
) -> sw_result {
    boundary!({
        submit(c, peer, tag, |client, p| {
            with_client!(client, |h| h
                .ping(p, payload, deadline(timeout_ms))
                .map(|t| t.tag()))
        })
    })
}

/// Pulls variables `ids[0..n]` from `peer`: the reply has one tensor (or status) per id,
/// in memory from the runtime's allocator.
///
/// # Safety
/// As `sw_client_ping`; `ids` points at `n` values.
#[no_mangle]
pub extern "C" fn sw_client_pull(
    c: *mut sw_client,
    peer: *const c_char,
    ids: *const u64,
    n: usize,
    timeout_ms: u64,
    tag: *mut u64,
) -> sw_result {
    boundary!({
        let ids = try_slice!(ids, n);
        submit(c, peer, tag, |client, p| {
            with_client!(client, |h| h
                .pull_slice(p, ids, deadline(timeout_ms))
                .map(|t| t.tag()))
        })
    })
}

/// Like `sw_client_pull`, with the received tensors in memory from `alloc` (for instance
/// buffers the caller already owns).
///
/// # Safety
/// As `sw_client_pull`; `alloc` points at a valid allocator that outlives the reply's
/// tensors.
#[no_mangle]
pub extern "C" fn sw_client_pull_into(
    c: *mut sw_client,
    peer: *const c_char,
    ids: *const u64,
    n: usize,
    alloc: *const sw_allocator,
    timeout_ms: u64,
    tag: *mut u64,
) -> sw_result {
    boundary!({
        let ids = try_slice!(ids, n).to_vec();
        let Some(alloc) = allocator_of(alloc)? else {
            return Err(Failure::null("alloc"));
        };
        submit(c, peer, tag, |client, p| {
            with_client!(client, |h| h
                .pull_into(p, ids, alloc, deadline(timeout_ms))
                .map(|t| t.tag()))
        })
    })
}

/// Pushes `tensors[i]` for variable `ids[i]`, `i < n`, to `peer`. The tensors are shared
/// with the runtime until sent (not copied); the caller keeps its handles.
///
/// # Safety
/// As `sw_client_ping`; `ids` and `tensors` point at `n` values, each tensor a live handle.
#[no_mangle]
pub extern "C" fn sw_client_push(
    c: *mut sw_client,
    peer: *const c_char,
    ids: *const u64,
    tensors: *const *const sw_tensor,
    n: usize,
    timeout_ms: u64,
    tag: *mut u64,
) -> sw_result {
    boundary!({
        let ids = try_slice!(ids, n);
        let ts = try_slice!(tensors, n);
        let items = ids
            .iter()
            .zip(ts)
            .map(|(&id, &t)| Ok((id, try_ref!(t, "tensors[i]").tensor.clone())))
            .collect::<Result<Vec<_>, Failure>>()?;
        submit(c, peer, tag, |client, p| {
            with_client!(client, |h| h
                .push(p, items, deadline(timeout_ms))
                .map(|t| t.tag()))
        })
    })
}

/// Receives the tensor `peer` publishes under `key` (`key_len` bytes) for `step`: completes
/// when it is published there, before or after this request arrives.
///
/// # Safety
/// As `sw_client_ping`; `key` points at `key_len` bytes.
#[no_mangle]
pub extern "C" fn sw_client_recv(
    c: *mut sw_client,
    peer: *const c_char,
    step: u64,
    key: *const u8,
    key_len: usize,
    timeout_ms: u64,
    tag: *mut u64,
) -> sw_result {
    boundary!({
        let key = try_slice!(key, key_len);
        submit(c, peer, tag, |client, p| {
            with_client!(client, |h| h
                .recv(p, step, key, deadline(timeout_ms))
                .map(|t| t.tag()))
        })
    })
}

/// Receives `n` keys (`keys[i]`, `key_lens[i]` bytes) in one round trip (one fused frame);
/// each tensor is sent as soon as it is published, and the reply has one entry per key.
///
/// # Safety
/// As `sw_client_ping`; `keys` and `key_lens` point at `n` values, `keys[i]` at
/// `key_lens[i]` bytes.
#[no_mangle]
pub extern "C" fn sw_client_recv_many(
    c: *mut sw_client,
    peer: *const c_char,
    step: u64,
    keys: *const *const u8,
    key_lens: *const usize,
    n: usize,
    timeout_ms: u64,
    tag: *mut u64,
) -> sw_result {
    boundary!({
        let ks = try_slice!(keys, n);
        let lens = try_slice!(key_lens, n);
        let keys = ks
            .iter()
            .zip(lens)
            .map(|(&k, &len)| Ok(try_slice!(k, len, "keys[i]").to_vec()))
            .collect::<Result<Vec<_>, Failure>>()?;
        submit(c, peer, tag, |client, p| {
            with_client!(client, |h| h
                .recv_many(p, step, keys, deadline(timeout_ms))
                .map(|t| t.tag()))
        })
    })
}

/// Waits for request `tag` of this client (spins briefly, then parks). Returns the
/// request's outcome; on `SW_OK`, `*reply` is its answer, which the caller frees with
/// `sw_reply_free`. Completions of other requests that arrive meanwhile are kept for their
/// own wait; a request `sw_client_poll` or `sw_client_wait_any` reported is answered at
/// once. Not for clients made with a callback (`SW_ERR_INVALID_ARGUMENT`). For a rows
/// pull, once this returns (whatever it returns) starwire no longer touches the request's
/// buffers: a pull given up by its deadline while a receive into a buffer is in flight is
/// waited for until that receive ends.
///
/// # Safety
/// `c` is a live client used by this thread only; `reply` is writable.
#[no_mangle]
pub extern "C" fn sw_client_wait(
    c: *mut sw_client,
    tag: u64,
    reply: *mut *mut sw_reply,
) -> sw_result {
    boundary!({
        let client = client_mut(c)?;
        let reply = try_out!(reply);
        let mut completion = match client.ready.remove(&tag) {
            Some(c) => c,
            None => with_client!(client, |h| h.wait_tag(tag)).map_err(|_| {
                Failure::invalid(format!(
                    "request {tag} is not outstanding (never submitted, already waited for, \
                     or submitted through a client with a callback)"
                ))
            })?,
        };
        let targets = client.rows.remove(&tag);
        let result =
            std::mem::replace(&mut completion.result, Err(Error::new(ErrorKind::Shutdown)));
        // The request's vectors serve the client's next requests (no allocation for them).
        with_client!(client, |h| h.recycle(completion));
        let answer = answer(result, targets.as_deref());
        if let Some(targets) = targets {
            // A rows pull given up mid-transfer may still be receiving into the buffers.
            client.wait_released(&targets);
        }
        reply.write(to_boxed(answer?));
        Ok(())
    })
}

/// Whether a request of this client has completed, without waiting: on `SW_OK`, `*ready`
/// says whether one has and, if so, `*tag` names it. Each completed request is reported
/// once (by this or `sw_client_wait_any`); its answer is then taken with `sw_client_wait`,
/// which returns at once. Not for clients made with a callback (`SW_ERR_INVALID_ARGUMENT`).
///
/// # Safety
/// `c` is a live client used by this thread only; `tag` and `ready` are writable.
#[no_mangle]
pub extern "C" fn sw_client_poll(c: *mut sw_client, tag: *mut u64, ready: *mut bool) -> sw_result {
    boundary!({
        let client = client_mut(c)?;
        let tag = try_out!(tag);
        let ready = try_out!(ready);
        if client.callback {
            return Err(Failure::invalid(
                "a client with a callback has nothing to poll: its completions go to the callback",
            ));
        }
        let completion = with_client!(client, |h| h.poll());
        ready.write(completion.is_some());
        if let Some(c) = completion {
            tag.write(c.tag);
            client.ready.insert(c.tag, c);
        }
        Ok(())
    })
}

/// Waits for the next request of this client to complete (spins briefly, then parks), and
/// writes its tag to `*tag`; reported once, as by `sw_client_poll`, and its answer then
/// taken with `sw_client_wait`. `SW_ERR_INVALID_ARGUMENT` when no request is outstanding
/// (all completed ones already reported), and for clients made with a callback.
///
/// # Safety
/// `c` is a live client used by this thread only; `tag` is writable.
#[no_mangle]
pub extern "C" fn sw_client_wait_any(c: *mut sw_client, tag: *mut u64) -> sw_result {
    boundary!({
        let client = client_mut(c)?;
        let tag = try_out!(tag);
        if client.callback {
            return Err(Failure::invalid(
                "a client with a callback has nothing to wait for: its completions go to the callback",
            ));
        }
        let c = with_client!(client, |h| h.wait_any()).map_err(|_| {
            Failure::invalid("no request outstanding (every completed one already reported)")
        })?;
        tag.write(c.tag);
        client.ready.insert(c.tag, c);
        Ok(())
    })
}

/// Writes a snapshot of an embedded client's counters (those of its own loop, which the
/// runtime's do not include) to `*out`. `SW_ERR_INVALID_ARGUMENT` for a client of the
/// runtime's loops: its requests are in `sw_runtime_stats`.
///
/// # Safety
/// `c` is a live client used by this thread only; `out` is writable.
#[no_mangle]
pub extern "C" fn sw_client_loop_stats(c: *mut sw_client, out: *mut sw_stats) -> sw_result {
    boundary!({
        let client = client_mut(c)?;
        let out = try_out!(out);
        let Driven::Caller(caller) = &client.driven else {
            return Err(Failure::invalid(
                "not an embedded client: its requests are in its runtime's stats",
            ));
        };
        out.write(sw_stats::of(&caller.client.stats()));
        Ok(())
    })
}
