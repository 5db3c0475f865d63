//! Embedding rows served on the handler pool (`handler_threads` > 0): the table's pull and
//! push run on the pool's threads, not on the loop, and the answers are the same as inline.

mod common;

use common::*;
use starwire::rows::Rows;
use starwire::{DType, Options, Runtime, Service, Status, Table};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// u8 rows of 64 bytes: row `id` is `id as u8` repeated for ids below 1,000, missing
/// above; pushes add into a kept copy. Records the thread each call ran on.
#[derive(Default)]
struct Recording {
    pushed: Mutex<HashMap<u64, Vec<u8>>>,
    threads: Mutex<Vec<String>>,
}

const DIMS: [u64; 1] = [64];

impl Recording {
    fn note(&self) {
        let name = std::thread::current().name().unwrap_or("").to_string();
        self.threads.lock().unwrap().push(name);
    }
}

impl Table for Recording {
    fn dtype(&self) -> DType {
        DType::U8
    }
    fn row_dims(&self) -> &[u64] {
        &DIMS
    }
    fn pull(&self, ids: &[u64], out: &mut [u8], missing: &mut Vec<u32>) -> Status {
        self.note();
        let pushed = self.pushed.lock().unwrap();
        for (i, (&id, row)) in ids.iter().zip(out.chunks_exact_mut(64)).enumerate() {
            match pushed.get(&id) {
                Some(p) => row.copy_from_slice(p),
                None if id < 1000 => row.fill(id as u8),
                None => {
                    row.fill(0);
                    missing.push(i as u32);
                }
            }
        }
        Status::Ok
    }
    fn push(&self, ids: &[u64], grads: &[u8]) -> Status {
        self.note();
        let mut pushed = self.pushed.lock().unwrap();
        for (&id, g) in ids.iter().zip(grads.chunks_exact(64)) {
            let row = pushed.entry(id).or_insert_with(|| vec![id as u8; 64]);
            for (r, g) in row.iter_mut().zip(g) {
                *r = r.wrapping_add(*g);
            }
        }
        Status::Ok
    }
}

struct Ps(Arc<Recording>);

impl Service for Ps {
    fn table(&self, table: u32) -> Option<&dyn Table> {
        (table == 1).then_some(&*self.0 as &dyn Table)
    }
}

fn ps(handler_threads: usize) -> (Runtime, std::net::SocketAddr, Arc<Recording>) {
    let table = Arc::new(Recording::default());
    let options = Options {
        service: Some(Arc::new(Ps(table.clone()))),
        handler_threads: Some(handler_threads),
        ..Options::listen("127.0.0.1:0".parse().unwrap())
    };
    let rt = Runtime::start_with(config("ps", 1).build().unwrap(), options).expect("ps starts");
    let addr = rt.local_addr().unwrap();
    (rt, addr, table)
}

/// Pushes to rows 1..=3, pulls them back with a missing row, then with an unknown table
/// beside, and returns what came back: rows, missing positions, per-table statuses, and
/// what the PS said of the table it refused.
fn step(addr: std::net::SocketAddr) -> (Vec<Vec<u8>>, Vec<u32>, Vec<Status>, Option<String>) {
    let worker = client(1);
    let mut h = worker.handle(16);
    let ids = [1u64, 2, 3];
    let grads: Vec<u8> = (0..3 * 64).map(|i| (i / 64) as u8 + 1).collect();
    let t = h
        .push_rows(
            addr,
            &[(Rows::new(1, DType::U8, &DIMS, &ids), &grads[..])],
            secs(10),
        )
        .unwrap();
    assert_eq!(h.wait(t).unwrap(), [Status::Ok]);
    let pulled = [1u64, 2, 3, 5_000];
    let t = h
        .pull_rows(addr, &[Rows::new(1, DType::U8, &DIMS, &pulled)], secs(10))
        .unwrap();
    let rows = h.wait(t).unwrap();
    let got: Vec<Vec<u8>> = (0..pulled.len())
        .map(|i| rows.row(0, i).unwrap().to_vec())
        .collect();
    // With a table the PS does not serve: the PS says so (and serves that request on its
    // loop, where the words can be sent), the other table is answered as before.
    let unknown = [1u64];
    let tables = [
        Rows::new(1, DType::U8, &DIMS, &pulled),
        Rows::new(7, DType::U8, &DIMS, &unknown),
    ];
    let t = h.pull_rows(addr, &tables, secs(10)).unwrap();
    let rows = h.wait(t).unwrap();
    let again: Vec<Vec<u8>> = (0..pulled.len())
        .map(|i| rows.row(0, i).unwrap().to_vec())
        .collect();
    assert_eq!(again, got);
    let statuses = (0..2)
        .map(|i| rows.block(i).err().unwrap_or(Status::Ok))
        .collect();
    let said = rows.refusal().map(str::to_owned);
    (got, rows.missing(0).to_vec(), statuses, said)
}

#[test]
fn rows_run_on_the_handler_pool_and_answer_as_inline() {
    let (_inline, inline_addr, inline_table) = ps(0);
    let (_pooled, pooled_addr, pooled_table) = ps(2);
    let inline = step(inline_addr);
    let pooled = step(pooled_addr);
    assert_eq!(pooled, inline, "the pool answers as the loop does");
    let (rows, missing, statuses, said) = pooled;
    assert_eq!(said.as_deref(), Some("no table 7 on this task"));
    for (i, row) in rows.iter().take(3).enumerate() {
        let want = (i as u8 + 1).wrapping_add(i as u8 + 1);
        assert!(row.iter().all(|&b| b == want), "row {i}: {row:?}");
    }
    assert!(rows[3].iter().all(|&b| b == 0));
    assert_eq!(missing, [3]);
    assert_eq!(statuses, [Status::Ok, Status::NotFound]);
    let threads = pooled_table.threads.lock().unwrap().clone();
    assert_eq!(threads.len(), 3, "one push and two pulls: {threads:?}");
    assert!(
        threads[..2]
            .iter()
            .all(|t| t.starts_with("starwire-handler")),
        "{threads:?}"
    );
    assert!(!threads[2].starts_with("starwire-handler"), "{threads:?}");
    let threads = inline_table.threads.lock().unwrap().clone();
    assert_eq!(threads.len(), 3);
    assert!(
        threads.iter().all(|t| !t.starts_with("starwire-handler")),
        "{threads:?}"
    );
}

#[test]
fn blocks_larger_than_a_frame_travel_in_chunks_from_the_pool() {
    let (_ps, addr, table) = ps(1);
    let worker = client(1);
    let mut h = worker.handle(16);
    // 40,000 rows of 64 B: a 2.5 MiB block each way, above the chunk size.
    let ids: Vec<u64> = (0..40_000).map(|i| i % 997).collect();
    let t = h
        .pull_rows(addr, &[Rows::new(1, DType::U8, &DIMS, &ids)], secs(30))
        .unwrap();
    let rows = h.wait(t).unwrap();
    assert_eq!(rows.block(0).unwrap().byte_len(), 40_000 * 64);
    for (i, id) in ids.iter().enumerate() {
        assert!(
            rows.row(0, i).unwrap().iter().all(|&b| b == *id as u8),
            "row {i}"
        );
    }
    assert!(rows.missing(0).is_empty());
    assert_eq!(table.threads.lock().unwrap().len(), 1);
}
