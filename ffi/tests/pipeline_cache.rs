//! The pipeline's row cache through the C ABI (`sw_pipeline_settings.cache_bytes` and the
//! cache counts of `sw_pipeline_report`), two PS tasks on loopback serving in-memory tables
//! (which keep row versions): a batch pulled again is served from the cache; a run of
//! steps with repeated ids, a cache small enough to evict and pushes of part of each batch
//! hits, misses, evicts and gets rows answered unchanged, and its reports and rows are
//! those of the Rust pipeline given the same steps; a cache too small for one row is
//! refused, naming the setting.

mod common;

use common::*;
use starwire::rows::Partition;
use starwire::{ConfigBuilder, DType, Peer, Pipeline, PipelineReport, PipelineSettings, Runtime};
use starwire_ffi::*;
use std::ffi::{c_char, CString};
use std::ptr;
use std::time::Duration;

const F32: u8 = 10;
const DIM: usize = 4;
const ROW_BYTES: usize = DIM * 4;
const TABLE: u32 = 4;

/// Two PS tasks (rows made by their first pull, SGD at rate 0.5) and their peers.
fn cluster() -> (Vec<*mut sw_runtime>, Vec<CString>) {
    let rts: Vec<_> = (0..2)
        .map(|_| mem_table_runtime(true, TABLE, DIM, INIT_UNIFORM, 0.5, &[]))
        .collect();
    let peers = rts.iter().map(|&r| peer_of(r)).collect();
    (rts, peers)
}

fn free(rts: Vec<*mut sw_runtime>) {
    for r in rts {
        sw_runtime_free(r);
    }
}

/// A worker runtime and its client.
struct Worker {
    rt: *mut sw_runtime,
    client: *mut sw_client,
}

impl Worker {
    fn new() -> Worker {
        let rt = mem_table_runtime(false, TABLE, DIM, INIT_UNIFORM, 0.5, &[]);
        let mut client = ptr::null_mut();
        ok(sw_client_new(rt, 16, &mut client));
        Worker { rt, client }
    }

    fn pipeline(
        &self,
        peers: &[CString],
        settings: sw_pipeline_settings,
    ) -> Result<*mut sw_pipeline, sw_result> {
        let peers: Vec<*const c_char> = peers.iter().map(|p| p.as_ptr()).collect();
        let part = sw_partition {
            kind: sw_partition_kind::SW_PARTITION_MOD as u32,
            vocab: 0,
        };
        let dims = [DIM as u64];
        let mut p = ptr::null_mut();
        match sw_pipeline_new(
            self.client,
            peers.as_ptr(),
            peers.len(),
            part,
            TABLE,
            F32,
            dims.as_ptr(),
            1,
            settings,
            &mut p,
        ) {
            sw_result::SW_OK => Ok(p),
            r => Err(r),
        }
    }

    fn pull(&self, p: *mut sw_pipeline, ids: &[u64]) -> (Vec<u8>, sw_pipeline_report) {
        let mut out = vec![0u8; ids.len() * ROW_BYTES];
        let mut report = sw_pipeline_report::default();
        ok(sw_pipeline_pull(
            p,
            self.client,
            ids.as_ptr(),
            ids.len(),
            out.as_mut_ptr().cast(),
            out.len() as u64,
            &mut report,
        ));
        (out, report)
    }

    /// Pushes `grads` for `ids` and waits for every answer: the step's whole report.
    fn push_and_flush(&self, p: *mut sw_pipeline, ids: &[u64], grads: &[u8]) -> sw_pipeline_report {
        let mut report = sw_pipeline_report::default();
        ok(sw_pipeline_push(
            p,
            self.client,
            ids.as_ptr(),
            ids.len(),
            grads.as_ptr().cast(),
            grads.len() as u64,
            &mut report,
        ));
        ok(sw_pipeline_flush(p, self.client, &mut report));
        report
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        sw_client_free(self.client);
        sw_runtime_free(self.rt);
    }
}

fn settings(staleness: u32, cache_bytes: u64) -> sw_pipeline_settings {
    sw_pipeline_settings {
        staleness,
        timeout_ms: 20_000,
        cache_bytes,
        ..sw_pipeline_settings_default()
    }
}

#[test]
fn a_batch_pulled_again_is_served_from_the_cache() {
    let (rts, peers) = cluster();
    let w = Worker::new();
    // Ids 0..10, each twice.
    let ids: Vec<u64> = (0..10).chain(0..10).collect();
    for (cache_bytes, hits) in [(0, 0), (4096, 10)] {
        let p = w.pipeline(&peers, settings(1, cache_bytes)).unwrap();
        let (first, r1) = w.pull(p, &ids);
        assert_eq!((r1.unique, r1.rows_received), (10, 10));
        assert_eq!(
            (r1.cache_hits, r1.cache_misses),
            (0, if hits > 0 { 10 } else { 0 })
        );
        // No push in between: the rows cached by the first pull are fresh enough.
        let (second, r2) = w.pull(p, &ids);
        assert_eq!(second, first);
        assert_eq!(r2.cache_hits, hits, "cache of {cache_bytes} bytes");
        assert_eq!(r2.rows_received, 10 - hits);
        assert_eq!(r2.cache_bytes, (hits * ROW_BYTES) as u64);
        assert_eq!(r2.bytes_sent, 8 * (10 - hits) as u64, "ids asked for");
        let mut done = sw_pipeline_report::default();
        ok(sw_pipeline_flush(p, w.client, &mut done));
        sw_pipeline_free(p);
    }
    drop(w);
    free(rts);
}

/// `n` batches of `len` ids in `0..universe`, half of them below `hot`, from a fixed
/// xorshift.
fn batches(n: usize, len: usize, universe: u64, hot: u64) -> Vec<Vec<u64>> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    (0..n)
        .map(|_| {
            (0..len)
                .map(|_| {
                    let r = next();
                    (r >> 1) % if r & 1 == 0 { hot } else { universe }
                })
                .collect()
        })
        .collect()
}

/// The first half of a batch (pushed), and its gradients.
fn pushed(ids: &[u64]) -> (&[u64], Vec<u8>) {
    let half = &ids[..ids.len() / 2];
    let grads = f32_bytes(&vec![0.25; half.len() * DIM]);
    (half, grads)
}

/// A report's counts, in the order of `sw_pipeline_report`'s fields (times left out).
type Counts = [u64; 17];

fn c_counts(r: &sw_pipeline_report) -> Counts {
    [
        r.step,
        r.unique as u64,
        r.missing as u64,
        r.rows_received as u64,
        r.rows_sent as u64,
        r.bytes_received,
        r.bytes_sent,
        r.pushes_in_flight as u64,
        r.prefetched as u64,
        r.refetched as u64,
        r.may_miss,
        r.fallbacks as u64,
        r.cache_hits as u64,
        r.cache_misses as u64,
        r.cache_bytes,
        r.cache_evictions,
        r.rows_unchanged as u64,
    ]
}

fn rust_counts(r: &PipelineReport) -> Counts {
    [
        r.step,
        r.unique as u64,
        r.missing as u64,
        r.rows_received as u64,
        r.rows_sent as u64,
        r.bytes_received,
        r.bytes_sent,
        r.pushes_in_flight as u64,
        r.prefetched as u64,
        r.refetched as u64,
        r.may_miss,
        r.fallbacks as u64,
        r.cache_hits as u64,
        r.cache_misses as u64,
        r.cache_bytes,
        r.cache_evictions,
        r.rows_unchanged as u64,
    ]
}

/// Bytes of a cache that holds 12 rows of the table (of 24 distinct ids in a batch, 48 in
/// all): it evicts.
const SMALL_CACHE: u64 = 12 * (ROW_BYTES as u64 + 25 + 16);

/// Per step: the rows pulled and the counts of the report after push and flush, through
/// the C ABI.
fn c_run(steps: &[Vec<u64>], staleness: u32) -> Vec<(Vec<u8>, Counts)> {
    let (rts, peers) = cluster();
    let w = Worker::new();
    let p = w
        .pipeline(&peers, settings(staleness, SMALL_CACHE))
        .unwrap();
    let out = steps
        .iter()
        .map(|ids| {
            let (rows, _) = w.pull(p, ids);
            let (half, grads) = pushed(ids);
            (rows, c_counts(&w.push_and_flush(p, half, &grads)))
        })
        .collect();
    sw_pipeline_free(p);
    drop(w);
    free(rts);
    out
}

/// The same through the Rust pipeline, with PS tasks of their own.
fn rust_run(steps: &[Vec<u64>], staleness: u32) -> Vec<(Vec<u8>, Counts)> {
    let (rts, peers) = cluster();
    let peers: Vec<Peer> = peers
        .iter()
        .map(|p| Peer::from(p.to_str().unwrap().parse::<std::net::SocketAddr>().unwrap()))
        .collect();
    let cfg = ConfigBuilder::from_env("worker", 0)
        .unwrap()
        .loops(1)
        .build()
        .unwrap();
    let worker = Runtime::start(cfg, None).unwrap();
    let mut h = worker.handle(16);
    let settings = PipelineSettings::default()
        .staleness(staleness)
        .timeout(Some(Duration::from_secs(20)))
        .cache_bytes(SMALL_CACHE as usize);
    let mut pipe = Pipeline::new(
        peers,
        Partition::Mod,
        TABLE,
        DType::F32,
        &[DIM as u64],
        settings,
    )
    .unwrap();
    let out = steps
        .iter()
        .map(|ids| {
            let mut rows = vec![0u8; ids.len() * ROW_BYTES];
            pipe.pull(&mut h, ids, &mut rows).unwrap();
            let (half, grads) = pushed(ids);
            pipe.push(&mut h, half, &grads).unwrap();
            (rows, rust_counts(pipe.flush(&mut h).unwrap()))
        })
        .collect();
    drop(h);
    drop(worker);
    free(rts);
    out
}

#[test]
fn the_c_pipeline_s_cache_counts_and_rows_are_the_rust_pipeline_s() {
    let steps = batches(8, 32, 48, 8);
    for staleness in [0, 1] {
        let c = c_run(&steps, staleness);
        let rust = rust_run(&steps, staleness);
        for (t, (c, r)) in c.iter().zip(&rust).enumerate() {
            assert_eq!(
                c.1, r.1,
                "staleness {staleness}, step {t}: C vs Rust counts"
            );
            assert_eq!(c.0, r.0, "staleness {staleness}, step {t}: C vs Rust rows");
        }
        // [step, .., 12 hits, 13 misses, 14 bytes, 15 evictions, 16 unchanged]
        let total = |i: usize| c.iter().map(|(_, k)| k[i]).sum::<u64>();
        let unique = total(1);
        assert_eq!(total(12) + total(13), unique, "staleness {staleness}");
        assert!(
            total(13) > 0 && total(15) > 0,
            "misses and evictions: {c:?}"
        );
        assert!(
            total(16) > 0,
            "rows answered unchanged, staleness {staleness}"
        );
        assert!(c.iter().all(|(_, k)| k[14] <= SMALL_CACHE));
        if staleness == 0 {
            // The cache serves nothing without asking.
            assert_eq!(total(12), 0);
        } else {
            assert!(total(12) > 0, "hits at staleness 1");
        }
    }
}

#[test]
fn cache_bytes_is_0_by_default_and_a_cache_too_small_for_a_row_is_refused() {
    let (rts, peers) = cluster();
    let w = Worker::new();
    assert_eq!(sw_pipeline_settings_default().cache_bytes, 0);
    // One row with its id, clock, version and two index cells: row_bytes + 33.
    let least = ROW_BYTES as u64 + 33;
    assert_eq!(
        w.pipeline(&peers, settings(1, least - 1)).unwrap_err(),
        sw_result::SW_ERR_INVALID_ARGUMENT
    );
    assert!(last_error().contains("cache_bytes"), "{}", last_error());
    let p = w.pipeline(&peers, settings(1, least)).unwrap();
    let (_, r) = w.pull(p, &[3, 4]);
    // Room for one row: the second evicts the first.
    assert_eq!((r.cache_misses, r.cache_evictions), (2, 1));
    assert_eq!(r.cache_bytes, ROW_BYTES as u64);
    let mut done = sw_pipeline_report::default();
    ok(sw_pipeline_flush(p, w.client, &mut done));
    sw_pipeline_free(p);
    drop(w);
    free(rts);
}
