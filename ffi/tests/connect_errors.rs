//! A peer that cannot be reached, through the C ABI: the request's failure names the task
//! (`sw_last_error_task`, for a peer named `task@host:port` by `sw_resolver_peer`) and
//! the operating system's reason (`sw_last_error_os_error`), and so does its message.

use starwire_ffi::*;
use std::ffi::{CStr, CString};
use std::net::TcpListener;
use std::ptr;

fn last_error() -> String {
    // SAFETY: sw_last_error gives a NUL-terminated string valid until the next call.
    unsafe { CStr::from_ptr(sw_last_error()) }
        .to_string_lossy()
        .into_owned()
}

fn last_task() -> String {
    // SAFETY: as for sw_last_error.
    unsafe { CStr::from_ptr(sw_last_error_task()) }
        .to_string_lossy()
        .into_owned()
}

#[test]
fn a_closed_port_named_as_a_task_fails_with_its_name_and_the_refusal() {
    let dead = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let tf = CString::new(
        r#"{"cluster": {"ps": ["10.9.9.1:2222", "10.9.9.2:2222"],
            "worker": ["10.9.9.3:2222"]}, "task": {"type": "worker", "index": 0}}"#,
    )
    .unwrap();
    let map = CString::new(format!(
        "10.9.9.1:2222=10.9.9.1:5555\n10.9.9.2:2222={dead}\n"
    ))
    .unwrap();
    let names = [
        c"STARWIRE_CONNECT_RETRIES".as_ptr(),
        c"STARWIRE_CONNECT_BACKOFF_MS".as_ptr(),
    ];
    let values = [c"2".as_ptr(), c"1".as_ptr()];
    let options = sw_runtime_options {
        job: c"worker".as_ptr(),
        task_index: 0,
        setting_names: names.as_ptr(),
        setting_values: values.as_ptr(),
        settings: names.len(),
        use_env: true,
        listen: ptr::null(),
        service: ptr::null(),
        allocator: ptr::null(),
        handler_threads: 0,
        table_ids: ptr::null(),
        tables: ptr::null(),
        n_tables: 0,
    };
    // SAFETY: valid handles and pointers throughout; each handle freed once.
    unsafe {
        let mut resolver = ptr::null_mut();
        let r = sw_resolver_new(tf.as_ptr(), map.as_ptr(), &mut resolver);
        assert_eq!(r, sw_result::SW_OK, "{}", last_error());
        let mut out = [0 as std::ffi::c_char; 128];
        assert_eq!(
            sw_resolver_peer(resolver, c"ps:1".as_ptr(), out.as_mut_ptr(), out.len()),
            sw_result::SW_OK
        );
        let peer = CStr::from_ptr(out.as_ptr()).to_owned();
        assert_eq!(peer.to_str().unwrap(), format!("ps:1@{dead}"));
        // The address alone, as before, for sw_resolver_resolve.
        assert_eq!(
            sw_resolver_resolve(resolver, c"ps:1".as_ptr(), out.as_mut_ptr(), out.len()),
            sw_result::SW_OK
        );
        assert_eq!(
            CStr::from_ptr(out.as_ptr()).to_str().unwrap(),
            dead.to_string()
        );

        let mut rt = ptr::null_mut();
        assert_eq!(sw_runtime_new(&options, &mut rt), sw_result::SW_OK);
        let mut client = ptr::null_mut();
        assert_eq!(sw_client_new(rt, 4, &mut client), sw_result::SW_OK);
        let mut tag = 0;
        assert_eq!(
            sw_client_ping(client, peer.as_ptr(), 0, 0, &mut tag),
            sw_result::SW_OK
        );
        let mut reply = ptr::null_mut();
        assert_eq!(
            sw_client_wait(client, tag, &mut reply),
            sw_result::SW_ERR_CONNECT_FAILED
        );
        let message = last_error();
        let want = format!("could not connect to ps:1 ({dead}) after 3 attempts over ");
        assert!(message.starts_with(&want), "{message}");
        assert!(message.ends_with(": connection refused"), "{message}");
        assert_eq!(last_task(), "ps:1");
        assert_eq!(sw_last_error_os_error(), libc_econnrefused());

        // The same address without the name: the runtime knows it as ps:1 by now (its
        // metrics name it so).
        let plain = CString::new(dead.to_string()).unwrap();
        assert_eq!(
            sw_client_ping(client, plain.as_ptr(), 0, 0, &mut tag),
            sw_result::SW_OK
        );
        assert_eq!(
            sw_client_wait(client, tag, &mut reply),
            sw_result::SW_ERR_CONNECT_FAILED
        );
        assert_eq!(last_task(), "ps:1");
        // An address never named: no task, the same reason.
        let other = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let other = CString::new(other.to_string()).unwrap();
        assert_eq!(
            sw_client_ping(client, other.as_ptr(), 0, 0, &mut tag),
            sw_result::SW_OK
        );
        assert_eq!(
            sw_client_wait(client, tag, &mut reply),
            sw_result::SW_ERR_CONNECT_FAILED
        );
        assert_eq!(last_task(), "");
        assert_eq!(sw_last_error_os_error(), libc_econnrefused());
        // A failure that is not a request's carries neither.
        let bad = c"ps:1@nowhere";
        assert_eq!(
            sw_client_ping(client, bad.as_ptr(), 0, 0, &mut tag),
            sw_result::SW_ERR_INVALID_ARGUMENT
        );
        assert!(last_error().contains("task@host:port"), "{}", last_error());
        assert_eq!((last_task().as_str(), sw_last_error_os_error()), ("", 0));

        sw_client_free(client);
        sw_runtime_free(rt);
        sw_resolver_free(resolver);
    }
}

/// `ECONNREFUSED` on Linux.
fn libc_econnrefused() -> i32 {
    let refused = 111;
    let kind = std::io::Error::from_raw_os_error(refused).kind();
    assert_eq!(kind, std::io::ErrorKind::ConnectionRefused);
    refused
}
