//! Metrics through the C ABI: a runtime's JSON document, and a stats request to a peer.

use starwire_ffi::metrics::*;
use starwire_ffi::*;
use std::ffi::CStr;
use std::ptr;

fn options(job: &std::ffi::CStr, listen: bool) -> sw_runtime_options {
    sw_runtime_options {
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
    }
}

#[test]
fn metrics_as_json_and_a_peer_s_stats() {
    // SAFETY: valid handles and pointers throughout; each handle freed once.
    unsafe {
        let (mut ps, mut worker) = (ptr::null_mut(), ptr::null_mut());
        assert_eq!(
            sw_runtime_new(&options(c"ps", true), &mut ps),
            sw_result::SW_OK
        );
        assert_eq!(
            sw_runtime_new(&options(c"worker", false), &mut worker),
            sw_result::SW_OK
        );
        let peer = std::ffi::CString::new(format!("127.0.0.1:{}", sw_runtime_port(ps))).unwrap();
        let mut client = ptr::null_mut();
        assert_eq!(sw_client_new(worker, 4, &mut client), sw_result::SW_OK);
        let mut tag = 0;
        for _ in 0..3 {
            assert_eq!(
                sw_client_ping(client, peer.as_ptr(), 8, 5000, &mut tag),
                sw_result::SW_OK
            );
            let mut reply = ptr::null_mut();
            assert_eq!(sw_client_wait(client, tag, &mut reply), sw_result::SW_OK);
            sw_reply_free(reply);
        }

        // The worker's own metrics: three pings to the PS, named by its handshake.
        let mut doc = ptr::null_mut();
        assert_eq!(sw_runtime_metrics_json(worker, &mut doc), sw_result::SW_OK);
        let text = CStr::from_ptr(doc).to_str().unwrap().to_owned();
        sw_string_free(doc);
        assert!(text.contains(r#""task":"ps:0""#), "{text}");
        assert!(
            text.contains(r#""ping":{"requests":3,"in_flight":0"#),
            "{text}"
        );

        // The PS's document, asked over the wire: one U8 tensor.
        assert_eq!(
            sw_client_stats(client, peer.as_ptr(), 5000, &mut tag),
            sw_result::SW_OK
        );
        let mut reply = ptr::null_mut();
        assert_eq!(sw_client_wait(client, tag, &mut reply), sw_result::SW_OK);
        assert_eq!(sw_reply_count(reply), 1);
        let t = sw_reply_tensor(reply, 0);
        let bytes = std::slice::from_raw_parts(
            sw_tensor_data(t) as *const u8,
            sw_tensor_byte_len(t) as usize,
        );
        let remote = std::str::from_utf8(bytes).unwrap();
        assert!(remote.starts_with(r#"{"format":"starwire-stats","version":1,"task":"ps:0""#));
        sw_reply_free(reply);

        // NULLs are refused; freeing NULL is a no-op.
        assert_eq!(
            sw_runtime_metrics_json(ptr::null(), &mut doc),
            sw_result::SW_ERR_NULL
        );
        assert_eq!(
            sw_runtime_metrics_json(worker, ptr::null_mut()),
            sw_result::SW_ERR_NULL
        );
        sw_string_free(ptr::null_mut());
        sw_client_free(client);
        sw_runtime_free(worker);
        sw_runtime_free(ps);
    }
}
