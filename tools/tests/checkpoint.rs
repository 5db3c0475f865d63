//! `commctl checkpoint` end to end: a real `serve` saves its table into its checkpoint
//! directory when asked, the files are on disk, another `serve` with that directory loads
//! them and serves the same rows; a task that cannot save says why; `commctl stats` shows
//! the tables a task serves.

mod common;

use common::*;
use starwire::rows::Partition;
use starwire::{DType, Peer, Runtime, Sharded};
use starwire_tools::ping::{client_config, start_client};
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

const DIM: usize = 16;

/// A client of the table of `serve` at `addr` (table 1, rows of 16 f32).
struct Worker {
    rt: Runtime,
    table: Sharded,
}

impl Worker {
    fn new(addr: SocketAddr) -> Worker {
        let rt = start_client(client_config("test", 1, 1, 0).unwrap()).unwrap();
        let table = Sharded::new(
            vec![Peer::new(addr)],
            Partition::Mod,
            1,
            DType::F32,
            &[DIM as u64],
        )
        .unwrap();
        Worker { rt, table }
    }

    fn deadline() -> Option<Instant> {
        Some(Instant::now() + Duration::from_secs(20))
    }

    /// The rows of `ids`, and how many the table did not have.
    fn pull(&mut self, ids: &[u64]) -> (Vec<f32>, usize) {
        let mut h = self.rt.handle(16);
        let mut out = vec![0f32; ids.len() * DIM];
        let report = self
            .table
            .pull_typed(&mut h, ids, &mut out, Worker::deadline())
            .unwrap();
        assert!(report.is_ok(), "{:?}", report.first_error());
        let missing = report.missing;
        (out, missing)
    }

    /// Pushes a gradient row of `g` to each of `ids`.
    fn push(&mut self, ids: &[u64], g: f32) {
        let mut h = self.rt.handle(16);
        let grads = vec![g; ids.len() * DIM];
        let report = self
            .table
            .push_typed(&mut h, ids, &grads, Worker::deadline())
            .unwrap();
        assert!(report.is_ok(), "{:?}", report.first_error());
    }
}

/// `commctl serve` on a free port with one loop, table 1 of uniform rows, and `more`.
fn serve(more: &[&str], env: &[(&str, &str)]) -> Server {
    let mut args = vec![
        "--listen",
        "127.0.0.1:0",
        "--loops",
        "1",
        "--init",
        "uniform:0.5:3",
        "--optimizer",
        "sgd",
        "--lr",
        "1",
    ];
    args.extend_from_slice(more);
    Server::start(&args, env)
}

/// The start-up lines after the first of a `PsTable`'s serve: the table's report, where
/// its rows came from, and where checkpoints go.
fn start_lines(server: &Server) -> (String, String) {
    server.next_line();
    let rows = server.next_line();
    let checkpoints = server.next_line();
    (rows, checkpoints)
}

fn manifest(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn a_checkpoint_is_saved_on_request_and_a_new_serve_loads_it() {
    let dir = Scratch::new("ckpt-saved");
    let dir_text = dir.0.to_str().unwrap().to_owned();
    let file = dir.0.join("table-1.swrows");
    let mut first = serve(&["--rows", "1000", "--checkpoint-dir", &dir_text], &[]);
    let (rows, checkpoints) = start_lines(&first);
    assert!(
        rows.starts_with("table 1: 1000 rows made at start (no checkpoint "),
        "{rows}"
    );
    assert_eq!(
        checkpoints.trim_end(),
        format!(
            "checkpoints: the table is saved into {dir_text} when a peer asks (commctl \
             checkpoint)"
        )
    );
    let addr = first.addr.to_string();

    // Rows made at start, rows changed by a push, and a row the push created (id 5000).
    let ids: Vec<u64> = vec![0, 1, 2, 500, 999, 5000];
    let mut worker = Worker::new(first.addr);
    worker.push(&[1, 500, 5000], 0.25);
    let (before, missing) = worker.pull(&ids);
    assert_eq!(missing, 0);
    assert!(before.iter().any(|&v| v != 0.0));

    let r = run(&mut commctl(&["checkpoint", &addr]));
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stdout.starts_with(&format!(
            "checkpoint of {addr}: task ps:0 saved 1 table, 1001 rows, "
        )),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout.contains(&format!(
            "directory {dir_text} (on the task's host), manifest {dir_text}/checkpoint.json"
        )),
        "{}",
        r.stdout
    );
    let line = r
        .stdout
        .lines()
        .find(|l| l.contains("table-1.swrows"))
        .unwrap_or_else(|| panic!("{}", r.stdout));
    let cells: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(cells[..3], ["1", "table-1.swrows", "1001"], "{line}");

    // On disk: the table's file and the manifest, which --json prints as it is.
    let on_disk = manifest(&dir.0.join("checkpoint.json"));
    assert_eq!(on_disk["format"], "starwire-checkpoint");
    assert_eq!(on_disk["task"], "ps:0");
    assert_eq!(on_disk["dir"], dir_text.as_str());
    let table = &on_disk["tables"][0];
    assert_eq!(table["table"], 1);
    assert_eq!(table["file"], "table-1.swrows");
    assert_eq!(table["rows"], 1001);
    assert_eq!(
        table["bytes"].as_u64(),
        Some(std::fs::metadata(&file).unwrap().len())
    );
    let r = run(&mut commctl(&["checkpoint", &addr, "--json"]));
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    let answered: serde_json::Value = serde_json::from_str(r.stdout.trim()).unwrap();
    assert_eq!(answered["tables"][0]["rows"], 1001);
    // The second checkpoint replaced the first: the manifest on disk is the one answered.
    assert_eq!(manifest(&dir.0.join("checkpoint.json")), answered);
    let (code, stderr) = first.signal("TERM");
    assert_eq!(code, 0, "{stderr}");

    // A new serve with the directory from the environment: it loads the rows (not the
    // --rows it is given) and serves them as they were.
    let second = serve(
        &["--rows", "5"],
        &[("STARWIRE_CHECKPOINT_DIR", dir_text.as_str())],
    );
    let (rows, checkpoints) = start_lines(&second);
    let want = format!("table 1: 1001 rows loaded from {} in ", file.display());
    assert!(rows.starts_with(&want), "{want}: {rows}");
    assert!(
        checkpoints.contains(&format!("saved into {dir_text}")),
        "{checkpoints}"
    );
    let mut worker = Worker::new(second.addr);
    let (after, missing) = worker.pull(&ids);
    assert_eq!(missing, 0);
    assert_eq!(after, before);

    // Saved again through the environment's directory; a third serve, with the option,
    // has the push made since.
    worker.push(&[2], 1.0);
    let (changed, _) = worker.pull(&ids);
    assert_ne!(changed, before);
    let r = run(&mut commctl(&["checkpoint", &second.addr.to_string()]));
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    drop(second);
    let third = serve(&["--checkpoint-dir", &dir_text], &[]);
    let (rows, _) = start_lines(&third);
    assert!(
        rows.starts_with("table 1: 1001 rows loaded from "),
        "{rows}"
    );
    let (again, _) = Worker::new(third.addr).pull(&ids);
    assert_eq!(again, changed);
}

#[test]
fn a_task_that_cannot_save_says_why() {
    // No checkpoint directory: the task refuses, and commctl says which variable sets it.
    let plain = serve(&["--rows", "10"], &[]);
    let (_, checkpoints) = start_lines(&plain);
    assert!(
        checkpoints.starts_with("checkpoints: refused, no checkpoint directory"),
        "{checkpoints}"
    );
    let r = run(&mut commctl(&["checkpoint", &plain.addr.to_string()]));
    assert_eq!(r.code, 1, "{}{}", r.stdout, r.stderr);
    assert!(r.stdout.is_empty(), "{}", r.stdout);
    assert!(
        r.stderr.contains(&format!(
            "commctl: {} takes no checkpoints: it has no checkpoint directory; start it with \
             STARWIRE_CHECKPOINT_DIR=DIR (commctl serve: --checkpoint-dir DIR)\n",
            plain.addr
        )),
        "{}",
        r.stderr
    );

    // A table that cannot be saved (the small MemTable) with a directory from the
    // environment: nothing to save, in the task's words.
    let dir = Scratch::new("ckpt-refused");
    let dir_text = dir.0.to_str().unwrap().to_owned();
    let mem = serve(
        &["--rows", "10", "--table-kind", "mem"],
        &[("STARWIRE_CHECKPOINT_DIR", dir_text.as_str())],
    );
    // (A MemTable has no report line.)
    mem.next_line();
    let checkpoints = mem.next_line();
    assert!(
        checkpoints.contains("a MemTable cannot be saved"),
        "{checkpoints}"
    );
    let r = run(&mut commctl(&["checkpoint", &mem.addr.to_string()]));
    assert_eq!(r.code, 1, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stderr.contains("has nothing to save: ") && r.stderr.contains("cannot be saved"),
        "{}",
        r.stderr
    );
    assert!(!dir.0.join("checkpoint.json").exists());

    // A directory that cannot be made (a file is in its place): the task's reason, naming
    // it.
    let blocked = dir.file("not-a-dir", "");
    let blocked_text = blocked.to_str().unwrap().to_owned();
    let failing = serve(&["--rows", "10", "--checkpoint-dir", &blocked_text], &[]);
    start_lines(&failing);
    let r = run(&mut commctl(&["checkpoint", &failing.addr.to_string()]));
    assert_eq!(r.code, 1, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stderr.contains(&format!(
            "could not save its tables: checkpoint directory {blocked_text}: "
        )),
        "{}",
        r.stderr
    );

    // Nothing listening: the transport's exit code, as for every command.
    let gone = failing.addr.to_string();
    drop(failing);
    let r = run(&mut commctl(&["checkpoint", &gone, "-W", "2"]));
    assert_eq!(r.code, 3, "{}{}", r.stdout, r.stderr);
}

#[test]
fn stats_shows_the_tables_a_task_serves() {
    let server = serve(&["--rows", "1000"], &[]);
    start_lines(&server);
    let addr = server.addr.to_string();
    let mut worker = Worker::new(server.addr);
    // 40 rows pulled (one of them, 7777, created by the pull), 3 pushed.
    let ids: Vec<u64> = (0..39).chain([7777]).collect();
    worker.pull(&ids);
    worker.push(&[1, 2, 3], 0.5);

    let r = run(&mut commctl(&["stats", &addr, "--json"]));
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    let doc: serde_json::Value = serde_json::from_str(r.stdout.trim()).unwrap();
    let table = &doc["tables"][0];
    assert_eq!(table["table"], 1);
    assert_eq!(table["rows"], 1001);
    assert_eq!(table["pulled_rows"], 40);
    assert_eq!(table["pushed_rows"], 3);
    assert_eq!(table["created"], 1);

    let r = run(&mut commctl(&["stats", &addr]));
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("ROWS PULLED"), "{}", r.stdout);
    let line = r
        .stdout
        .lines()
        .last()
        .unwrap_or_else(|| panic!("{}", r.stdout));
    let cells: Vec<&str> = line.split_whitespace().collect();
    // Table, rows, memory, pulls, pushes, rows pulled, pushed, missing, unchanged,
    // created, evicted.
    assert_eq!(cells[0], "1", "{line}");
    assert_eq!(cells[1], "1001", "{line}");
    assert_eq!(
        cells[3..11],
        ["1", "1", "40", "3", "0", "0", "1", "0"],
        "{line}"
    );
}
