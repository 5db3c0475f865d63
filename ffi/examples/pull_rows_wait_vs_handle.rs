//! What the C ABI's blocking rows pull costs above the Rust client: `sw_client_pull_rows_wait`
//! (one call: submit, wait, missing rows) against `Handle::pull_rows` + `wait_tag` +
//! `recycle` (what `commctl bench -o pull-rows` does), alternating request by request in one
//! process so that both meet the same load. Each has a runtime of its own (one loop).
//!
//! ```sh
//! commctl serve --listen 127.0.0.1:5555 --dim 16 &     # rows of 16 f32 in table 1
//! cargo run --release -p starwire-ffi --example pull_rows_wait_vs_handle -- 127.0.0.1:5555 1,100,1000 3
//! ```
//!
//! Arguments: the server, rows per request (comma list), seconds per size. Ids are drawn
//! from `0..100_000`, every row of which is pulled once before the clock starts. Prints
//! the p50 of each, in µs.

use starwire::rows::Rows;
use starwire::{ConfigBuilder, DType, Reply, Runtime};
use starwire_ffi::*;
use std::ffi::CString;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

fn p50(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let mut args = std::env::args().skip(1);
    let usage = "usage: pull_rows_wait_vs_handle HOST:PORT ROWS[,ROWS...] SECONDS";
    let addr: SocketAddr = args.next().expect(usage).parse().expect(usage);
    let sizes: Vec<usize> = args
        .next()
        .expect(usage)
        .split(',')
        .map(|s| s.parse().expect(usage))
        .collect();
    let seconds: f64 = args.next().map_or(3.0, |s| s.parse().expect(usage));

    let config = ConfigBuilder::from_env("worker", 0)
        .and_then(|b| b.loops(1).build())
        .expect("configuration");
    let runtime = Runtime::start(config, None).expect("runtime");
    let mut handle = runtime.handle(4);

    let options = sw_runtime_options {
        job: c"worker".as_ptr(),
        task_index: 0,
        setting_names: std::ptr::null(),
        setting_values: std::ptr::null(),
        settings: 0,
        use_env: true,
        listen: std::ptr::null(),
        service: std::ptr::null(),
        allocator: std::ptr::null(),
        handler_threads: 0,
        table_ids: std::ptr::null(),
        tables: std::ptr::null(),
        n_tables: 0,
    };
    let (mut rt, mut client) = (std::ptr::null_mut(), std::ptr::null_mut());
    assert_eq!(sw_runtime_new(&options, &mut rt), sw_result::SW_OK);
    assert_eq!(sw_client_new(rt, 4, &mut client), sw_result::SW_OK);
    let peer = CString::new(addr.to_string()).expect("address");
    let dims = [16u64];
    // Every row of the id range once, so that neither client pays for creating rows.
    let all: Vec<u64> = (0..100_000).collect();
    for chunk in all.chunks(10_000) {
        let rows = Rows::new(1, DType::F32, &dims, chunk);
        let ticket = handle
            .pull_rows(
                addr,
                &[rows],
                Some(Instant::now() + Duration::from_secs(10)),
            )
            .expect("submit");
        let done = handle.wait_tag(ticket.tag()).expect("wait");
        assert!(done.result.is_ok(), "{:?}", done.result.err());
        handle.recycle(done);
    }
    for &k in &sizes {
        let batches = (100_000 / k).max(2);
        // A fixed scramble of the id range, so that successive requests touch other rows.
        let ids: Vec<u64> = (0..(batches * k) as u64)
            .map(|i| i.wrapping_mul(7919) % 100_000)
            .collect();
        let batch = |i: usize| &ids[(i % batches) * k..(i % batches + 1) * k];
        let mut out = vec![0u8; k * 64];
        let mut missing = vec![0u32; k];
        let (mut rust, mut c_abi) = (Vec::new(), Vec::new());
        let end = Instant::now() + Duration::from_secs_f64(seconds);
        let mut i = 0;
        while Instant::now() < end {
            let t0 = Instant::now();
            let rows = Rows::new(1, DType::F32, &dims, batch(2 * i));
            let ticket = handle.pull_rows(addr, &[rows], None).expect("submit");
            let done = handle.wait_tag(ticket.tag()).expect("wait");
            assert!(matches!(&done.result, Ok(Reply::Rows(r)) if r.block(0).is_ok()));
            handle.recycle(done);
            let t1 = Instant::now();
            let request = sw_rows {
                table: 1,
                dtype: 10,
                row_dims: dims.as_ptr(),
                rank: 1,
                ids: batch(2 * i + 1).as_ptr(),
                n: k,
                data: out.as_mut_ptr().cast(),
                byte_len: out.len() as u64,
            };
            let mut count = 0;
            let r = sw_client_pull_rows_wait(
                client,
                peer.as_ptr(),
                &request,
                5000,
                missing.as_mut_ptr(),
                &mut count,
            );
            assert_eq!(r, sw_result::SW_OK);
            let t2 = Instant::now();
            rust.push((t1 - t0).as_secs_f64() * 1e6);
            c_abi.push((t2 - t1).as_secs_f64() * 1e6);
            i += 1;
        }
        let (r, c) = (p50(&mut rust), p50(&mut c_abi));
        println!(
            "k={k}: Rust handle p50 {r:.1} us, sw_client_pull_rows_wait p50 {c:.1} us ({:+.1} us), {i} pairs",
            c - r
        );
    }
    sw_client_free(client);
    sw_runtime_free(rt);
}
