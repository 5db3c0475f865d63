//! A PS task: its shard of the model (rows and their Adagrad state, `model::Shard`),
//! served as table [`TABLE`] of embedding rows (the [`Table`] trait) and as tensors by id
//! (`Service::pull` / `Service::push`), on the data address the cluster gives its task.

use crate::args::Args;
use crate::cluster::resolver;
use crate::model::Shard;
use crate::transfer::{f32s_from_le, f32s_to_le};
use crate::Res;
use starwire::cluster::TaskId;
use starwire::config::ConfigBuilder;
use starwire::{DType, Options, Runtime, Service, Status, Table, Tensor};
use std::io::Read;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

/// The table the PS tasks serve the model's rows as.
pub const TABLE: u32 = 1;

/// A PS task's shard of the model, served both ways: as tensors by id (`Service::pull` and
/// `Service::push`) and as table [`TABLE`] of embedding rows (the [`Table`] it is). Each PS
/// runs one event loop, so the lock is never contended: it only makes the shard `Sync` as
/// `Service` requires.
struct Ps {
    shard: Mutex<Shard>,
    dim: usize,
    /// `[dim]`: the shape of a row.
    row_dims: [u64; 1],
    pulled: std::sync::atomic::AtomicU64,
    pushed: std::sync::atomic::AtomicU64,
}

/// The shard as a table of rows of `dim` f32: a pull reads the rows (a row never updated
/// reads as its initial value, so none is missing), a push applies Adagrad to each.
impl Table for Ps {
    fn dtype(&self) -> DType {
        DType::F32
    }

    fn row_dims(&self) -> &[u64] {
        &self.row_dims
    }

    fn pull(&self, ids: &[u64], out: &mut [u8], _missing: &mut Vec<u32>) -> Status {
        let row_bytes = self.dim * 4;
        if out.len() != ids.len() * row_bytes {
            return Status::InvalidArgument;
        }
        let shard = self.shard.lock().unwrap();
        let mut row = [0f32; 1024];
        let row = &mut row[..self.dim];
        for (&id, dst) in ids.iter().zip(out.chunks_exact_mut(row_bytes)) {
            shard.read(id, row);
            f32s_to_le(row, dst);
        }
        self.pulled
            .fetch_add(ids.len() as u64, std::sync::atomic::Ordering::Relaxed);
        Status::Ok
    }

    fn push(&self, ids: &[u64], grads: &[u8]) -> Status {
        let row_bytes = self.dim * 4;
        if grads.len() != ids.len() * row_bytes {
            return Status::InvalidArgument;
        }
        let mut shard = self.shard.lock().unwrap();
        let mut grad = [0f32; 1024];
        let grad = &mut grad[..self.dim];
        for (&id, g) in ids.iter().zip(grads.chunks_exact(row_bytes)) {
            f32s_from_le(g, grad);
            shard.apply(id, grad);
        }
        self.pushed
            .fetch_add(ids.len() as u64, std::sync::atomic::Ordering::Relaxed);
        Status::Ok
    }
}

impl Service for Ps {
    fn table(&self, table: u32) -> Option<&dyn Table> {
        (table == TABLE).then_some(self as &dyn Table)
    }

    fn pull(&self, ids: &[u64], out: &mut Vec<Result<Arc<Tensor>, Status>>) {
        let shard = self.shard.lock().unwrap();
        let mut row = [0f32; 1024];
        let row = &mut row[..self.dim];
        for &id in ids {
            shard.read(id, row);
            let tensor = Tensor::from_f32(&[self.dim as u64], row).expect("row shape");
            out.push(Ok(Arc::new(tensor)));
        }
        let n = ids.len() as u64;
        self.pulled
            .fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    }

    fn push(&self, items: &mut Vec<(u64, Tensor)>, statuses: &mut Vec<Status>) {
        let mut shard = self.shard.lock().unwrap();
        let mut grad = [0f32; 1024];
        for (id, t) in items.iter() {
            if t.dtype() != DType::F32 || t.byte_len() != self.dim * 4 {
                statuses.push(Status::InvalidArgument);
                continue;
            }
            let grad = &mut grad[..self.dim];
            f32s_from_le(t.bytes(), grad);
            shard.apply(*id, grad);
            statuses.push(Status::Ok);
        }
        let n = items.len() as u64;
        self.pushed
            .fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Runs PS task `task`: listens on its data address, serves until the coordinator closes
/// its stdin, then prints what it served.
pub fn run_ps(args: &Args, task: &TaskId) -> Res<ExitCode> {
    let addr = resolver(args)?
        .resolve_task(task)
        .map_err(|e| e.to_string())?
        .addr();
    let config = ConfigBuilder::from_env("ps", task.index)
        .and_then(|b| b.loops(1).build())
        .map_err(|e| e.to_string())?;
    let ps = Arc::new(Ps {
        shard: Mutex::new(Shard::new(&args.model)),
        dim: args.model.dim,
        row_dims: [args.model.dim as u64],
        pulled: Default::default(),
        pushed: Default::default(),
    });
    let service: Arc<dyn Service> = ps.clone();
    let options = Options {
        service: Some(service),
        ..Options::listen(addr)
    };
    let rt = Runtime::start_with(config, options).map_err(|e| format!("listen on {addr}: {e}"))?;
    println!("READY");
    // Serve until the coordinator closes our stdin.
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    let stats = rt.stats();
    rt.shutdown();
    let rows = ps.shard.lock().unwrap().len();
    use std::sync::atomic::Ordering::Relaxed;
    println!(
        "ps:{}: {} rows stored, {} rows read by pulls, {} gradient rows applied; \
         {} bytes in, {} out",
        task.index,
        rows,
        ps.pulled.load(Relaxed),
        ps.pushed.load(Relaxed),
        stats.bytes_in,
        stats.bytes_out
    );
    Ok(ExitCode::SUCCESS)
}
