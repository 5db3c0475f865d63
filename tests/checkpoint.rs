//! Checkpoints over real sockets: a `CHECKPOINT` request saves a PS's tables into its own
//! directory and answers with the manifest; a new PS loads them and is reached again after a
//! membership change while a worker keeps stepping, with every row pushed before the
//! checkpoint; refusals say why; `STATS` carries the tables' metrics; the upkeep thread
//! maintains the tables; the start-up report has a line per table.

mod common;

use common::*;
use starwire::cluster::endpoint_map::EndpointMap;
use starwire::cluster::ClusterSpec;
use starwire::rows::ps::{checkpoint_file, Create, Init, Optimizer};
use starwire::rows::{MemTable, Partition, PsTable, Tables};
use starwire::{
    Config, DType, ErrorKind, Options, Peer, Resolver, Runtime, Service, Sharded, Status,
    CHECKPOINT_MANIFEST,
};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const DIM: usize = 4;

/// An empty directory of this test's own.
fn scratch(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("starwire-ckpt-wire-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn table() -> PsTable {
    PsTable::builder(DIM)
        .table_id(1)
        .init(Init::Zeros)
        .optimizer(Optimizer::Sgd { lr: 1.0 })
        .create(Create::OnPullOrPush)
        .build()
        .unwrap()
}

fn ps_config(index: u32, dir: Option<&Path>) -> Config {
    let mut b = starwire::config::ConfigBuilder::from_env("ps", index)
        .expect("environment")
        .loops(1);
    if let Some(dir) = dir {
        b = b.checkpoint_dir(dir.to_path_buf());
    }
    b.build().unwrap()
}

fn ps_with(service: Arc<dyn Service>, cfg: Config) -> (Runtime, SocketAddr) {
    let options = Options {
        service: Some(service),
        ..Options::listen("127.0.0.1:0".parse().unwrap())
    };
    let rt = Runtime::start_with(cfg, options).expect("ps starts");
    let addr = rt.local_addr().unwrap();
    (rt, addr)
}

fn ps(index: u32, table: PsTable, dir: Option<&Path>) -> (Runtime, SocketAddr) {
    ps_with(
        Arc::new(Tables::new().with(1, Arc::new(table))),
        ps_config(index, dir),
    )
}

/// The cluster: PS tasks named by fixed control addresses, the endpoint map saying where
/// each listens now.
fn resolver(ps: &[SocketAddr]) -> Resolver {
    let control: Vec<String> = (0..ps.len())
        .map(|i| format!("127.0.0.2:{}", 3100 + i))
        .collect();
    let mut spec = ClusterSpec::new();
    spec.add_job("ps", &control.join(",")).unwrap();
    spec.add_job("worker", "127.0.0.2:4100").unwrap();
    let text: String = control
        .iter()
        .zip(ps)
        .map(|(c, d)| format!("{c}={d}\n"))
        .collect();
    let map = EndpointMap::parse(".endpoint_map", text.as_bytes()).unwrap();
    Resolver::from_spec(&spec, &map)
}

fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn rows_of(out: &[u8]) -> Vec<f32> {
    out.chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// The value of `"key":<number>` in a JSON document, first occurrence.
fn number(doc: &str, key: &str) -> u64 {
    let at = doc
        .find(&format!("\"{key}\":"))
        .unwrap_or_else(|| panic!("{key} in {doc}"));
    doc[at + key.len() + 3..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .unwrap()
}

fn checkpoint(worker: &Runtime, peer: SocketAddr) -> Result<String, starwire::Error> {
    let mut h = worker.handle(4);
    let t = h.checkpoint(peer, secs(60)).unwrap();
    h.wait(t)
}

#[test]
fn a_ps_moved_with_its_checkpoint_has_every_row_pushed_before_it() {
    let dir0 = scratch("move-0");
    let dir1 = scratch("move-1");
    let (ps0, a) = ps(0, table(), Some(&dir0));
    let (ps1, b) = ps(1, table(), Some(&dir1));
    let worker = client(1);
    let before = resolver(&[a, b]);
    let peers = Arc::new(Mutex::new(before.peers("ps").unwrap()));

    // A worker that keeps stepping on its own ids (1,000 and up) the whole time: push a
    // gradient of 1, pull. Its steps to a PS that is gone fail; it goes on.
    let stop = Arc::new(AtomicBool::new(false));
    let (ok_steps, moved_at) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let background = {
        let (stop, ok_steps, peers) = (stop.clone(), ok_steps.clone(), peers.clone());
        let mut h = worker.handle(16);
        std::thread::spawn(move || {
            let ids: Vec<u64> = (1000..1064).collect();
            let grads = f32s(&vec![1.0; ids.len() * DIM]);
            let mut out = vec![0u8; ids.len() * DIM * 4];
            let mut seen = peers.lock().unwrap().clone();
            let mut sharded =
                Sharded::new(seen.clone(), Partition::Mod, 1, DType::F32, &[DIM as u64]).unwrap();
            while !stop.load(Ordering::Relaxed) {
                let now = peers.lock().unwrap().clone();
                if now != seen {
                    sharded.set_peers(now.clone()).unwrap();
                    seen = now;
                }
                let pushed_ok = (sharded.push(&mut h, &ids, &grads, secs(5)).unwrap())
                    .shards
                    .iter()
                    .all(Result::is_ok);
                let pulled_ok = (sharded.pull(&mut h, &ids, &mut out, secs(5)).unwrap())
                    .shards
                    .iter()
                    .all(Result::is_ok);
                let all_ok = pushed_ok && pulled_ok;
                if all_ok {
                    ok_steps.fetch_add(1, Ordering::Relaxed);
                } else {
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        })
    };

    // The rows that must survive: ids 0..64, three pushes of a gradient of 1 each, all
    // acknowledged, then a checkpoint of each PS.
    let mut h = worker.handle(16);
    let mut sharded = Sharded::new(
        before.peers("ps").unwrap(),
        Partition::Mod,
        1,
        DType::F32,
        &[DIM as u64],
    )
    .unwrap();
    let marked: Vec<u64> = (0..64).collect();
    let grads = f32s(&vec![1.0; marked.len() * DIM]);
    for _ in 0..3 {
        let r = sharded.push(&mut h, &marked, &grads, secs(30)).unwrap();
        assert!(r.shards.iter().all(Result::is_ok), "{r:?}");
    }
    while ok_steps.load(Ordering::Relaxed) < 5 {
        std::thread::sleep(Duration::from_millis(1));
    }
    let manifest = checkpoint(&worker, b).expect("ps:1 saves");
    assert!(
        manifest.starts_with(r#"{"format":"starwire-checkpoint","version":1,"task":"ps:1""#),
        "{manifest}"
    );
    assert_eq!(number(&manifest, "table"), 1, "{manifest}");
    // Its 32 marked rows, and the 32 of the stepping worker.
    assert!(number(&manifest, "rows") >= 64, "{manifest}");
    assert!(
        manifest.contains(&format!("\"file\":\"{}\"", checkpoint_file(1))),
        "{manifest}"
    );
    let on_disk = std::fs::read_to_string(dir1.join(CHECKPOINT_MANIFEST)).unwrap();
    assert_eq!(
        on_disk, manifest,
        "the manifest is written beside the tables"
    );

    // ps:1 goes away; a new process loads the checkpoint on another port.
    drop(ps1);
    let loaded = PsTable::builder(DIM)
        .table_id(1)
        .init(Init::Zeros)
        .optimizer(Optimizer::Sgd { lr: 1.0 })
        .load(&dir1)
        .expect("the checkpoint loads");
    assert!(loaded.len() >= 64);
    let (ps1, c) = ps(1, loaded, Some(&dir1));
    let after = resolver(&[a, c]);
    worker.update_cluster(&before, &after).unwrap();
    let steps_before_update = ok_steps.load(Ordering::Relaxed);
    *peers.lock().unwrap() = after.peers("ps").unwrap();
    moved_at.store(steps_before_update, Ordering::Relaxed);
    sharded.set_peers(after.peers("ps").unwrap()).unwrap();

    // Every marked row is as it was acknowledged: three gradients of 1 with lr 1 from zero.
    let mut out = vec![0u8; marked.len() * DIM * 4];
    let r = sharded.pull(&mut h, &marked, &mut out, secs(30)).unwrap();
    assert!(r.shards.iter().all(Result::is_ok), "{r:?}");
    assert_eq!(rows_of(&out), vec![-3.0; marked.len() * DIM]);

    // The stepping worker reaches the new ps:1 too.
    while ok_steps.load(Ordering::Relaxed) < steps_before_update + 5 {
        std::thread::sleep(Duration::from_millis(1));
    }
    stop.store(true, Ordering::Relaxed);
    background.join().unwrap();
    drop((ps0, ps1));
    let _ = std::fs::remove_dir_all(&dir0);
    let _ = std::fs::remove_dir_all(&dir1);
}

#[test]
fn a_checkpoint_is_refused_with_the_reason_when_it_cannot_be_made() {
    let worker = client(1);
    // No checkpoint directory.
    let (_ps, addr) = ps(0, table(), None);
    let e = checkpoint(&worker, addr).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Remote(Status::Unimplemented));
    let msg = e.remote_message().unwrap_or_default();
    assert!(msg.contains("STARWIRE_CHECKPOINT_DIR"), "{msg}");

    // A table that cannot be saved.
    let dir = scratch("refused");
    let mem = MemTable::new(
        DIM,
        starwire::rows::Init::Zeros,
        starwire::rows::Optimizer::Sgd { lr: 1.0 },
    );
    let service = Arc::new(Tables::new().with(3, Arc::new(mem)));
    let (_mem_ps, mem_addr) = ps_with(service, ps_config(0, Some(&dir)));
    let e = checkpoint(&worker, mem_addr).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Remote(Status::Unimplemented));
    let msg = e.remote_message().unwrap_or_default();
    assert!(
        msg.contains("table 3") && msg.contains("cannot be saved"),
        "{msg}"
    );
    assert!(
        !dir.join(CHECKPOINT_MANIFEST).exists(),
        "no manifest for a failed checkpoint"
    );

    // No tables at all.
    let (_none, none_addr) = ps_with(Arc::new(Tables::new()), ps_config(0, Some(&dir)));
    let e = checkpoint(&worker, none_addr).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Remote(Status::Unimplemented));
    assert!(
        e.remote_message().unwrap_or_default().contains("no tables"),
        "{e}"
    );

    // A directory that cannot be made (a file is in its way): the error names it.
    let blocked = dir.join("a-file");
    std::fs::write(&blocked, b"x").unwrap();
    let (_blocked, blocked_addr) = ps(0, table(), Some(&blocked.join("sub")));
    let e = checkpoint(&worker, blocked_addr).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Remote(Status::Internal));
    assert!(
        e.remote_message().unwrap_or_default().contains("a-file"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn stats_carry_the_tables_metrics_and_the_report_a_line_per_table() {
    let t = table();
    t.load_rows(&[7, 8, 9], &[1.0; 3 * DIM], None).unwrap();
    let (ps, addr) = ps(0, t, None);
    assert_eq!(ps.report().tables().len(), 1, "{}", ps.report());
    assert!(
        ps.report().tables()[0].starts_with("table 1:"),
        "{}",
        ps.report()
    );
    assert!(
        ps.report().to_string().contains("\n  table 1:"),
        "{}",
        ps.report()
    );

    let worker = client(1);
    let mut h = worker.handle(4);
    let rows = [starwire::rows::Rows::new(
        1,
        DType::F32,
        &[DIM as u64],
        &[7, 100],
    )];
    let t = h.pull_rows(Peer::new(addr), &rows, secs(30)).unwrap();
    let pulled = h.wait(t).unwrap();
    assert_eq!(rows_of(pulled.row(0, 0).unwrap()), [1.0; DIM]);
    let t = h.remote_stats(addr, secs(30)).unwrap();
    let doc = h.wait(t).unwrap();
    let tables = &doc[doc.find("\"tables\":[").expect("a tables key")..];
    assert_eq!(number(tables, "table"), 1, "{tables}");
    // The three loaded rows and the one the pull created.
    assert_eq!(number(tables, "rows"), 4, "{tables}");
    assert_eq!(number(tables, "pulls"), 1, "{tables}");
    assert_eq!(number(tables, "pulled_rows"), 2, "{tables}");
    assert_eq!(number(tables, "loaded"), 3, "{tables}");
    let local = ps.metrics_json();
    assert!(
        local[local.find("\"tables\"").unwrap()..].contains("\"rows\":4"),
        "{local}"
    );
}

#[test]
fn the_upkeep_thread_maintains_the_served_tables() {
    // A cap of 1,000 rows: over 95 % of it, maintain evicts the least recently touched
    // down to 90 %. Nothing but the upkeep thread calls maintain here.
    let t = PsTable::builder(DIM)
        .table_id(1)
        .max_rows(1000)
        .build()
        .unwrap();
    let ids: Vec<u64> = (0..990).collect();
    t.load_rows(&ids, &vec![0.5; ids.len() * DIM], None)
        .unwrap();
    let table = Arc::new(t);
    let cfg = config("ps", 1)
        .table_upkeep(Duration::from_millis(10))
        .build()
        .unwrap();
    let service = Arc::new(Tables::new().with(1, table.clone()));
    let (_ps, _) = ps_with(service, cfg);
    let start = Instant::now();
    while table.metrics().evicted_over_cap == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{:?}",
            table.metrics()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(table.len() <= 950, "{}", table.len());
}
