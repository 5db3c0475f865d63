//! A PS and a worker, two processes that find each other through `TF_CONFIG`: the PS serves
//! one embedding table (starwire's `PsTable`, at most [`MAX_ROWS`] rows), the worker pulls
//! rows, pushes gradients, pulls again and prints what changed. `cargo run --example ps_worker` with no `TF_CONFIG` runs both: it writes an
//! `.endpoint_map` into a temporary folder, starts itself again as task `ps:0` (a child
//! process with `TF_CONFIG` and `TF_SEASTAR_ENDPOINT_MAP_PATH` set) and runs `worker:0`.
//! The two roles by hand, in two terminals of one folder (the PS serves until Ctrl-D):
//!
//! ```console
//! $ printf '127.0.0.1:2222=127.0.0.1:5555\n127.0.0.1:2223=127.0.0.1:5556\n' > .endpoint_map
//! $ C='"cluster": {"ps": ["127.0.0.1:2222"], "worker": ["127.0.0.1:2223"]}'
//! $ TF_CONFIG="{$C, \"task\": {\"type\": \"ps\", \"index\": 0}}" cargo run --example ps_worker
//! $ TF_CONFIG="{$C, \"task\": {\"type\": \"worker\", \"index\": 0}}" cargo run --example ps_worker
//! ```

use starwire::cluster::{TaskId, TfConfig};
use starwire::config::ConfigBuilder;
use starwire::rows::ps::{Init, Optimizer};
use starwire::rows::{Partition, PsTable, Tables};
use starwire::{DType, Options, Resolver, Runtime, Sharded, StepReport};
use std::error::Error;
use std::io::Read;
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

type Res<T> = Result<T, Box<dyn Error>>;

/// The table's id and its rows: 4 f32 each, at most `MAX_ROWS` of them (the cap bounds the
/// memory the table may take; rows past it are refused, or evicted by `maintain`).
const TABLE: u32 = 1;
const DIM: usize = 4;
const MAX_ROWS: u64 = 1 << 20;
const INIT: Init = Init::Uniform {
    scale: 0.5,
    seed: 7,
};

fn main() -> Res<()> {
    let Ok(text) = std::env::var("TF_CONFIG") else {
        return both();
    };
    match TfConfig::parse(&text)?.task {
        Some(task) if task.job == "ps" => ps(&task),
        Some(task) => worker(&task),
        None => Err("TF_CONFIG names no task".into()),
    }
}

/// The PS: listens on its own data address (its control address in the cluster spec, looked
/// up in the `.endpoint_map`) and serves table `TABLE` from memory until its input ends.
fn ps(task: &TaskId) -> Res<()> {
    let me = Resolver::from_env()?.resolve_task(task)?;
    let table = PsTable::builder(DIM)
        .table_id(TABLE)
        .init(INIT)
        .optimizer(Optimizer::Sgd { lr: 0.1 })
        .max_rows(MAX_ROWS)
        .build()?;
    eprintln!("{task}: {}", table.report());
    let service = Tables::new().with(TABLE, Arc::new(table));
    let mut options = Options::listen(me.addr());
    options.service = Some(Arc::new(service));
    let config = ConfigBuilder::from_env("ps", task.index)?.build()?;
    let rt = Runtime::start_with(config, options)?;
    eprintln!("{task}: serving table {TABLE} on {me}");
    std::io::stdin().read_to_end(&mut Vec::new())?;
    rt.shutdown();
    Ok(())
}

/// The worker: pulls four rows (id 3 twice), pushes a gradient of 1 for each, pulls again.
fn worker(task: &TaskId) -> Res<()> {
    let peers = Resolver::from_env()?.peers("ps")?;
    let config = ConfigBuilder::from_env("worker", task.index)?.build()?;
    let rt = Runtime::start(config, None)?;
    let mut h = rt.handle(64);
    h.wait_for_peers(peers.clone(), Duration::from_secs(20))?;
    let mut table = Sharded::new(peers, Partition::Mod, TABLE, DType::F32, &[DIM as u64])?;

    let ids = [3u64, 17, 3, 42];
    let row = table.row_bytes();
    let (mut before, mut after) = (vec![0u8; ids.len() * row], vec![0u8; ids.len() * row]);
    ok(table.pull(&mut h, &ids, &mut before, None)?)?;
    // Rows travel as little-endian bytes. Duplicates' gradients are summed: id 3 gets 2.
    let grads = 1f32.to_le_bytes().repeat(ids.len() * DIM);
    ok(table.push(&mut h, &ids, &grads, None)?)?;
    ok(table.pull(&mut h, &ids, &mut after, None)?)?;

    println!("{task}: rows of table {TABLE} before and after one SGD step (lr 0.1, gradient 1)");
    let f32s = |b: &[u8]| -> Vec<f32> {
        b.chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    };
    for ((id, old), new) in ids.iter().zip(before.chunks(row)).zip(after.chunks(row)) {
        println!("  id {id:>2}: {:>7.3?} -> {:>7.3?}", f32s(old), f32s(new));
    }
    rt.shutdown();
    Ok(())
}

/// A step's outcome: the first PS task that failed its part, and why.
fn ok(report: &StepReport) -> Res<()> {
    match report.first_error() {
        Some((ps, e)) => Err(format!("ps:{ps}: {e}").into()),
        None => Ok(()),
    }
}

/// Both roles on this machine: the PS as a child process, the worker here.
fn both() -> Res<()> {
    let dir = std::env::temp_dir().join(format!("ps_worker.{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let port = || -> Res<u16> { Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port()) };
    // Control addresses name the tasks; the map gives each its data address.
    let (a, b) = (port()?, port()?);
    let map = format!("127.0.0.1:2222=127.0.0.1:{a}\n127.0.0.1:2223=127.0.0.1:{b}\n");
    std::fs::write(dir.join(".endpoint_map"), map)?;
    let cluster = r#""cluster": {"ps": ["127.0.0.1:2222"], "worker": ["127.0.0.1:2223"]}"#;
    let tf_config =
        |job: &str| format!(r#"{{{cluster}, "task": {{"type": "{job}", "index": 0}}}}"#);
    std::env::set_var("TF_SEASTAR_ENDPOINT_MAP_PATH", &dir);
    let mut ps = Command::new(std::env::current_exe()?)
        .env("TF_CONFIG", tf_config("ps"))
        .stdin(Stdio::piped())
        .spawn()?;
    std::env::set_var("TF_CONFIG", tf_config("worker"));
    let result = worker(&TaskId::new("worker", 0));
    drop(ps.stdin.take()); // the PS stops when its input ends
    let status = ps.wait()?;
    std::fs::remove_dir_all(&dir)?;
    result?;
    if !status.success() {
        return Err(format!("ps:0 exited with {status}").into());
    }
    Ok(())
}
