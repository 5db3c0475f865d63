//! The C ABI's conventions, called as C would: NULL pointers are refused with
//! `SW_ERR_NULL`, outputs are written only on success, and every failure leaves a message.

use starwire_ffi::*;
use std::ffi::{c_char, CStr};
use std::ptr;

fn last_error() -> String {
    // SAFETY: `sw_last_error` returns a NUL-terminated string valid until the next call.
    unsafe { CStr::from_ptr(sw_last_error()) }
        .to_string_lossy()
        .into_owned()
}

/// A PS runtime listening on a free loopback port, settings from the environment.
fn listening_ps() -> sw_runtime_options {
    sw_runtime_options {
        job: c"ps".as_ptr(),
        task_index: 0,
        setting_names: ptr::null(),
        setting_values: ptr::null(),
        settings: 0,
        use_env: true,
        listen: c"127.0.0.1:0".as_ptr(),
        service: ptr::null(),
        allocator: ptr::null(),
        handler_threads: 0,
        table_ids: ptr::null(),
        tables: ptr::null(),
        n_tables: 0,
    }
}

#[test]
fn null_pointers_are_refused_and_outputs_untouched() {
    let dims = [2u64];
    let data = [1u8, 2];
    assert_eq!(
        sw_tensor_new(
            2,
            dims.as_ptr(),
            1,
            data.as_ptr().cast(),
            2,
            ptr::null_mut()
        ),
        sw_result::SW_ERR_NULL
    );
    assert!(last_error().contains("out"), "{}", last_error());
    let mut rt = 0x1 as *mut sw_runtime;
    assert_eq!(sw_runtime_new(ptr::null(), &mut rt), sw_result::SW_ERR_NULL);
    assert_eq!(rt as usize, 0x1, "no partial success");
    let mut tag = 7u64;
    assert_eq!(
        sw_client_ping(ptr::null_mut(), c"127.0.0.1:1".as_ptr(), 0, 0, &mut tag),
        sw_result::SW_ERR_NULL
    );
    assert_eq!(tag, 7);
    // The benchmarking aid, in either form.
    let mut latencies = [7u64; 2];
    for how in [
        sw_bench_pull::SW_BENCH_PULL_RUST,
        sw_bench_pull::SW_BENCH_PULL_C,
    ] {
        assert_eq!(
            sw_bench_pull_rows(
                ptr::null_mut(),
                c"127.0.0.1:1".as_ptr(),
                ptr::null(),
                0,
                how as u32,
                2,
                latencies.as_mut_ptr()
            ),
            sw_result::SW_ERR_NULL
        );
        assert!(last_error().contains("client"), "{}", last_error());
        assert_eq!(latencies, [7, 7]);
    }
    // Getters and frees accept NULL.
    assert_eq!(sw_tensor_byte_len(ptr::null()), 0);
    assert!(sw_tensor_data(ptr::null()).is_null());
    assert_eq!(sw_reply_count(ptr::null()), 0);
    sw_tensor_free(ptr::null_mut());
    sw_reply_free(ptr::null_mut());
    sw_client_free(ptr::null_mut());
    sw_runtime_free(ptr::null_mut());
}

#[test]
fn bad_arguments_fail_with_a_message() {
    let dims = [3u64];
    let data = [0u8; 8];
    let mut t = ptr::null_mut();
    let r = sw_tensor_new(10, dims.as_ptr(), 1, data.as_ptr().cast(), 8, &mut t);
    assert_eq!(r, sw_result::SW_ERR_INVALID_ARGUMENT);
    assert!(t.is_null());
    assert!(last_error().contains("12"), "{}", last_error());

    let names: [*const c_char; 1] = [c"STARWIRE_BACKEND".as_ptr()];
    let values: [*const c_char; 1] = [c"carrier-pigeon".as_ptr()];
    let opts = sw_runtime_options {
        job: c"ps".as_ptr(),
        task_index: 0,
        setting_names: names.as_ptr(),
        setting_values: values.as_ptr(),
        settings: 1,
        use_env: false,
        listen: ptr::null(),
        service: ptr::null(),
        allocator: ptr::null(),
        handler_threads: 0,
        table_ids: ptr::null(),
        tables: ptr::null(),
        n_tables: 0,
    };
    let mut rt = ptr::null_mut();
    assert_eq!(sw_runtime_new(&opts, &mut rt), sw_result::SW_ERR_CONFIG);
    assert!(rt.is_null());
    assert!(
        last_error().contains("STARWIRE_BACKEND"),
        "{}",
        last_error()
    );
}

#[test]
fn a_runtime_starts_answers_a_ping_and_stops() {
    let opts = listening_ps();
    let mut rt = ptr::null_mut();
    assert_eq!(sw_runtime_new(&opts, &mut rt), sw_result::SW_OK);
    let port = sw_runtime_port(rt);
    assert_ne!(port, 0);
    let mut client = ptr::null_mut();
    assert_eq!(sw_client_new(rt, 4, &mut client), sw_result::SW_OK);
    let peer = std::ffi::CString::new(format!("127.0.0.1:{port}")).unwrap();
    let mut tag = 0;
    assert_eq!(
        sw_client_ping(client, peer.as_ptr(), 16, 5000, &mut tag),
        sw_result::SW_OK
    );
    let mut reply = ptr::null_mut();
    assert_eq!(sw_client_wait(client, tag, &mut reply), sw_result::SW_OK);
    assert!(sw_reply_rtt_us(reply) > 0.0);
    sw_reply_free(reply);
    // A pull from a task without a service fails with the peer's status.
    let ids = [1u64];
    assert_eq!(
        sw_client_pull(client, peer.as_ptr(), ids.as_ptr(), 1, 5000, &mut tag),
        sw_result::SW_OK
    );
    let mut reply = 0x1 as *mut sw_reply;
    assert_eq!(
        sw_client_wait(client, tag, &mut reply),
        sw_result::SW_ERR_REMOTE
    );
    assert_eq!(reply as usize, 0x1, "no reply written on failure");
    let mut stats = sw_stats::default();
    assert_eq!(sw_runtime_stats(rt, &mut stats), sw_result::SW_OK);
    assert!(stats.requests_completed >= 1 && stats.frames_in >= 2);
    sw_client_free(client);
    sw_runtime_free(rt);
}

/// Completions counted by `on_done`, with the tag of the last.
struct Seen {
    done: std::sync::atomic::AtomicU64,
    last_tag: std::sync::atomic::AtomicU64,
}

unsafe extern "C" fn on_done(
    user: *mut std::ffi::c_void,
    tag: u64,
    r: sw_result,
    reply: *mut sw_reply,
) {
    // SAFETY: `user` is the `Seen` the test passed, alive until the runtime is freed.
    let seen = unsafe { &*(user as *const Seen) };
    assert_eq!(r, sw_result::SW_OK);
    assert!(sw_reply_rtt_us(reply) > 0.0);
    sw_reply_free(reply);
    seen.last_tag
        .store(tag, std::sync::atomic::Ordering::SeqCst);
    seen.done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
}

#[test]
fn completion_callbacks_get_every_request_with_its_tag() {
    let opts = listening_ps();
    let seen = Seen {
        done: Default::default(),
        last_tag: Default::default(),
    };
    let mut rt = ptr::null_mut();
    assert_eq!(sw_runtime_new(&opts, &mut rt), sw_result::SW_OK);
    let peer = std::ffi::CString::new(format!("127.0.0.1:{}", sw_runtime_port(rt))).unwrap();
    let mut client = ptr::null_mut();
    let user = &seen as *const Seen as *mut std::ffi::c_void;
    assert_eq!(
        sw_client_new_with_callback(rt, 16, Some(on_done), user, &mut client),
        sw_result::SW_OK
    );
    let mut tag = 0;
    for _ in 0..10 {
        assert_eq!(
            sw_client_ping(client, peer.as_ptr(), 8, 5000, &mut tag),
            sw_result::SW_OK
        );
    }
    let start = std::time::Instant::now();
    while seen.done.load(std::sync::atomic::Ordering::SeqCst) < 10 {
        assert!(
            start.elapsed().as_secs() < 10,
            "callbacks did not all arrive"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert_eq!(seen.last_tag.load(std::sync::atomic::Ordering::SeqCst), tag);
    // A callback client has nothing to wait on.
    let mut reply = ptr::null_mut();
    assert_eq!(
        sw_client_wait(client, tag, &mut reply),
        sw_result::SW_ERR_INVALID_ARGUMENT
    );
    sw_client_free(client);
    sw_runtime_free(rt);
}

/// A client pointer handed to another thread by a test.
struct SendPtr(*mut sw_client);
// SAFETY: the tests hand the pointer over and use it from one thread at a time.
unsafe impl Send for SendPtr {}

#[test]
fn an_embedded_client_runs_on_its_own_thread_only() {
    let opts = listening_ps();
    let mut rt = ptr::null_mut();
    assert_eq!(sw_runtime_new(&opts, &mut rt), sw_result::SW_OK);
    let peer = std::ffi::CString::new(format!("127.0.0.1:{}", sw_runtime_port(rt))).unwrap();

    // Settings on top of the runtime's are checked.
    let names = [c"STARWIRE_SPIN_US".as_ptr()];
    let bad = [c"soon".as_ptr()];
    let mut c = ptr::null_mut();
    assert_eq!(
        sw_client_new_embedded(rt, names.as_ptr(), bad.as_ptr(), 1, &mut c),
        sw_result::SW_ERR_CONFIG
    );
    assert!(c.is_null(), "no client written on failure");
    assert!(
        last_error().contains("STARWIRE_SPIN_US"),
        "{}",
        last_error()
    );
    let good = [c"0".as_ptr()];
    assert_eq!(
        sw_client_new_embedded(rt, names.as_ptr(), good.as_ptr(), 1, &mut c),
        sw_result::SW_OK
    );

    let ping = |c: *mut sw_client| {
        let mut tag = 0;
        let r = sw_client_ping(c, peer.as_ptr(), 16, 5000, &mut tag);
        if r != sw_result::SW_OK {
            return r;
        }
        let mut reply = ptr::null_mut();
        let r = sw_client_wait(c, tag, &mut reply);
        sw_reply_free(reply);
        r
    };
    assert_eq!(ping(c), sw_result::SW_OK);
    // Its loop's counters are its own; the runtime's loops carried nothing.
    let mut own = sw_stats::default();
    assert_eq!(sw_client_loop_stats(c, &mut own), sw_result::SW_OK);
    assert_eq!((own.connections_opened, own.requests_completed), (1, 1));
    // Its ping went out of a send block of its connection's own.
    assert!(own.send_blocks_allocated >= 1, "{own:?}");
    let mut runtime = sw_stats::default();
    assert_eq!(sw_runtime_stats(rt, &mut runtime), sw_result::SW_OK);
    assert_eq!(runtime.connections_opened, 0);
    // The runtime's loops answered the ping from blocks of their own.
    assert!(runtime.send_blocks_allocated >= 1, "{runtime:?}");

    // Another thread is refused, with a message, and the client goes on.
    let other = SendPtr(c);
    let (r, msg) = std::thread::spawn(move || {
        let other = other;
        let mut tag = 0;
        let r = sw_client_ping(other.0, c"127.0.0.1:1".as_ptr(), 16, 5000, &mut tag);
        (r, last_error())
    })
    .join()
    .unwrap();
    assert_eq!(r, sw_result::SW_ERR_INVALID_ARGUMENT);
    assert!(msg.contains("thread that made it"), "{msg}");
    assert_eq!(ping(c), sw_result::SW_OK);
    sw_client_free(c);

    // Freed by another thread, with a request in flight: refused, and nothing breaks.
    let mut c = ptr::null_mut();
    assert_eq!(
        sw_client_new_embedded(rt, ptr::null(), ptr::null(), 0, &mut c),
        sw_result::SW_OK
    );
    let mut tag = 0;
    assert_eq!(
        sw_client_ping(c, peer.as_ptr(), 16, 5000, &mut tag),
        sw_result::SW_OK
    );
    let other = SendPtr(c);
    let msg = std::thread::spawn(move || {
        let other = other;
        sw_client_free(other.0);
        last_error()
    })
    .join()
    .unwrap();
    assert!(
        msg.contains("freed only by the thread that made it"),
        "{msg}"
    );
    // Left as it was: its own thread still uses it, and frees it.
    let mut reply = ptr::null_mut();
    assert_eq!(sw_client_wait(c, tag, &mut reply), sw_result::SW_OK);
    sw_reply_free(reply);
    sw_client_free(c);

    // A client of the runtime's loops has no loop of its own to report.
    let mut h = ptr::null_mut();
    assert_eq!(sw_client_new(rt, 4, &mut h), sw_result::SW_OK);
    assert_eq!(
        sw_client_loop_stats(h, &mut own),
        sw_result::SW_ERR_INVALID_ARGUMENT
    );
    assert_eq!(ping(h), sw_result::SW_OK);
    sw_client_free(h);
    sw_runtime_free(rt);
}
