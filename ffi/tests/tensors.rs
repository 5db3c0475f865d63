//! Tensors over the caller's memory, received tensors taken out of replies, completions
//! polled or waited for in any order, and the detail of a remote error: over the C ABI as C
//! calls it, on loopback.

use starwire_ffi::*;
use std::ffi::{c_void, CStr};
use std::ptr;
use std::sync::atomic::{AtomicUsize, Ordering};

fn last_error() -> String {
    // SAFETY: `sw_last_error` returns a NUL-terminated string valid until the next call.
    unsafe { CStr::from_ptr(sw_last_error()) }
        .to_string_lossy()
        .into_owned()
}

fn ok(r: sw_result) {
    assert_eq!(r, sw_result::SW_OK, "{}", last_error());
}

fn runtime(job: &CStr, listen: bool) -> *mut sw_runtime {
    let o = sw_runtime_options {
        job: job.as_ptr(),
        task_index: 0,
        setting_names: ptr::null(),
        setting_values: ptr::null(),
        settings: 0,
        use_env: true,
        listen: if listen {
            c"127.0.0.1:0".as_ptr()
        } else {
            ptr::null()
        },
        service: ptr::null(),
        allocator: ptr::null(),
        handler_threads: 0,
        table_ids: ptr::null(),
        tables: ptr::null(),
        n_tables: 0,
    };
    let mut rt = ptr::null_mut();
    ok(sw_runtime_new(&o, &mut rt));
    rt
}

unsafe extern "C" fn count_release(user: *mut c_void) {
    // SAFETY: `user` is the test's counter, alive until the test ends.
    unsafe { &*user.cast::<AtomicUsize>() }.fetch_add(1, Ordering::SeqCst);
}

#[test]
fn a_wrapped_tensor_is_sent_from_the_callers_memory_and_released_once() {
    let released = AtomicUsize::new(0);
    let user = (&released as *const AtomicUsize)
        .cast_mut()
        .cast::<c_void>();
    let mut data: Vec<i32> = (0..1000).collect();
    let dims = [10u64, 100];
    // SAFETY: `data` outlives every reference (the release count says when starwire is
    // done); handles freed once.
    unsafe {
        let ps = runtime(c"ps", true);
        let worker = runtime(c"worker", false);
        let mut t = ptr::null_mut();
        ok(sw_tensor_wrap(
            9,
            dims.as_ptr(),
            2,
            data.as_ptr().cast(),
            4000,
            Some(count_release),
            user,
            &mut t,
        ));
        assert_eq!(sw_tensor_data(t), data.as_ptr().cast());
        assert!(sw_tensor_data_mut(t).is_null(), "the caller's memory");
        assert!(!sw_tensor_shared(t));
        ok(sw_runtime_publish(ps, b"k".as_ptr(), 1, t));
        assert!(sw_tensor_shared(t), "the rendezvous holds it");
        sw_tensor_free(t);
        assert_eq!(released.load(Ordering::SeqCst), 0);
        // Changed after the publish: the receiver sees the change (no copy was made).
        data[0] = -5;

        let mut client = ptr::null_mut();
        ok(sw_client_new(worker, 8, &mut client));
        let port = sw_runtime_port(ps);
        let peer = std::ffi::CString::new(format!("127.0.0.1:{port}")).unwrap();
        let mut tag = 0;
        ok(sw_client_recv(
            client,
            peer.as_ptr(),
            1,
            b"k".as_ptr(),
            1,
            0,
            &mut tag,
        ));
        let mut reply = ptr::null_mut();
        ok(sw_client_wait(client, tag, &mut reply));
        let got = sw_reply_take_tensor(reply, 0);
        assert!(!got.is_null());
        assert!(sw_reply_take_tensor(reply, 0).is_null(), "taken once");
        assert!(sw_reply_tensor(reply, 0).is_null());
        sw_reply_free(reply);
        // The received tensor is the caller's alone: writable.
        let p = sw_tensor_data_mut(got).cast::<i32>();
        assert!(!p.is_null());
        assert_eq!(*p, -5);
        assert_eq!(*p.add(999), 999);
        let clone = sw_tensor_clone(got);
        assert!(sw_tensor_data_mut(got).is_null(), "shared once cloned");
        sw_tensor_free(clone);
        sw_tensor_free(got);

        sw_client_free(client);
        sw_runtime_free(worker);
        sw_runtime_free(ps);
        assert_eq!(released.load(Ordering::SeqCst), 1);

        // A wrong length fails and releases at once.
        let mut t = ptr::null_mut();
        let r = sw_tensor_wrap(
            9,
            dims.as_ptr(),
            2,
            data.as_ptr().cast(),
            3999,
            Some(count_release),
            user,
            &mut t,
        );
        assert_eq!(r, sw_result::SW_ERR_INVALID_ARGUMENT);
        assert!(t.is_null());
        assert_eq!(released.load(Ordering::SeqCst), 2);
    }
}

#[test]
fn completions_are_polled_and_waited_for_in_any_order() {
    // SAFETY: live handles, freed once at the end.
    unsafe {
        let ps = runtime(c"ps", true);
        let worker = runtime(c"worker", false);
        let mut client = ptr::null_mut();
        ok(sw_client_new(worker, 8, &mut client));
        let peer = std::ffi::CString::new(format!("127.0.0.1:{}", sw_runtime_port(ps))).unwrap();
        let (mut tag, mut ready) = (0u64, true);
        assert_eq!(
            sw_client_wait_any(client, &mut tag),
            sw_result::SW_ERR_INVALID_ARGUMENT,
            "nothing outstanding"
        );
        ok(sw_client_poll(client, &mut tag, &mut ready));
        assert!(!ready);

        let mut recv = 0;
        ok(sw_client_recv(
            client,
            peer.as_ptr(),
            1,
            b"later".as_ptr(),
            5,
            0,
            &mut recv,
        ));
        let mut ping = 0;
        ok(sw_client_ping(client, peer.as_ptr(), 8, 0, &mut ping));
        ok(sw_client_wait_any(client, &mut tag));
        assert_eq!(tag, ping, "the recv waits for its publish");
        let mut t = ptr::null_mut();
        ok(sw_tensor_new(
            2,
            ptr::null(),
            0,
            b"x".as_ptr().cast(),
            1,
            &mut t,
        ));
        ok(sw_runtime_publish(ps, b"later".as_ptr(), 5, t));
        sw_tensor_free(t);
        loop {
            ok(sw_client_poll(client, &mut tag, &mut ready));
            if ready {
                break;
            }
            std::thread::yield_now();
        }
        assert_eq!(tag, recv);
        // Both reported; their answers are taken at once, in any order.
        let mut reply = ptr::null_mut();
        ok(sw_client_wait(client, recv, &mut reply));
        assert_eq!(sw_reply_count(reply), 1);
        sw_reply_free(reply);
        ok(sw_client_wait(client, ping, &mut reply));
        assert!(sw_reply_rtt_us(reply) > 0.0);
        sw_reply_free(reply);
        assert_eq!(
            sw_client_wait(client, ping, &mut reply),
            sw_result::SW_ERR_INVALID_ARGUMENT
        );

        // A remote error: the peer's status and message.
        ok(sw_client_pull(
            client,
            peer.as_ptr(),
            [1u64].as_ptr(),
            1,
            0,
            &mut tag,
        ));
        assert_eq!(
            sw_client_wait(client, tag, &mut reply),
            sw_result::SW_ERR_REMOTE
        );
        assert_eq!(sw_last_error_status(), 9, "UNIMPLEMENTED");
        let remote = CStr::from_ptr(sw_last_error_remote()).to_string_lossy();
        assert_eq!(remote, "no pull service");
        assert!(last_error().contains("no pull service"), "{}", last_error());
        // Another failure clears them.
        assert_eq!(
            sw_client_wait(client, tag, &mut reply),
            sw_result::SW_ERR_INVALID_ARGUMENT
        );
        assert_eq!(sw_last_error_status(), 0);
        assert_eq!(CStr::from_ptr(sw_last_error_remote()).to_bytes(), b"");

        sw_client_free(client);
        sw_runtime_free(worker);
        sw_runtime_free(ps);
    }
}
