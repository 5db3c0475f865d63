//! A PS task: its shard of the model, the rows and their Adagrad state in starwire's PS
//! table (`PsTable`), served as table [`TABLE`] of embedding rows and as tensors by id
//! (`Service::pull` / `Service::push`, through the same table), on the data address the
//! cluster gives its task.

use crate::args::Args;
use crate::cluster::resolver;
use crate::cpu::Cpu;
use crate::model::ModelConfig;
use crate::Res;
use starwire::cluster::TaskId;
use starwire::config::ConfigBuilder;
use starwire::rows::ps::{Init, Optimizer};
use starwire::rows::PsTable;
use starwire::{DType, Options, Runtime, Service, Status, Table, Tensor};
use std::io::Read;
use std::process::ExitCode;
use std::sync::Arc;

/// The table the PS tasks serve the model's rows as.
pub const TABLE: u32 = 1;

/// A PS task's shard of the model: rows of `dim` f32 and their Adagrad sums, created by
/// the first pull or push of their id with the model's initial values. Served both ways:
/// as table [`TABLE`] (the table itself answers rows requests) and as tensors by id (this
/// service's `pull` and `push`, which go through the same table).
struct Ps {
    table: PsTable,
    dims: [u64; 1],
}

/// The table of a PS task's shard: the model's initializer and Adagrad, sized for the rows
/// the task expects (its share of the features the data can draw, and the bias).
fn shard_table(m: &ModelConfig, ps_tasks: usize) -> Res<PsTable> {
    let features = m.fields as u64 * m.vocab + 1;
    PsTable::builder(m.dim)
        .table_id(TABLE)
        .init(Init::Normal {
            std: m.init_factor_std,
            seed: 0xabcd,
        })
        .optimizer(Optimizer::Adagrad {
            lr: m.learning_rate,
            initial_accumulator: m.initial_accumulator,
        })
        .capacity(features / ps_tasks as u64 + 1)
        .build()
        .map_err(|e| e.to_string())
}

impl Service for Ps {
    fn table(&self, table: u32) -> Option<&dyn Table> {
        (table == TABLE).then_some(&self.table as &dyn Table)
    }

    fn table_ids(&self) -> Vec<u32> {
        vec![TABLE]
    }

    /// One tensor per id: the table's rows (created if new), pulled as one block.
    fn pull(&self, ids: &[u64], out: &mut Vec<Result<Arc<Tensor>, Status>>) {
        let row_bytes = self.table.row_bytes();
        let mut block = vec![0u8; ids.len() * row_bytes];
        let status = Table::pull(&self.table, ids, &mut block, &mut Vec::new());
        for row in block.chunks_exact(row_bytes) {
            out.push(if status.is_ok() {
                Tensor::from_slice(DType::F32, &self.dims, row)
                    .map(Arc::new)
                    .map_err(|_| Status::Internal)
            } else {
                Err(status)
            });
        }
    }

    /// Gradients by id: those of the row's shape pushed into the table as one block.
    fn push(&self, items: &mut Vec<(u64, Tensor)>, statuses: &mut Vec<Status>) {
        let row_bytes = self.table.row_bytes();
        let (mut ids, mut grads) = (Vec::new(), Vec::new());
        for (id, t) in items.iter() {
            if t.dtype() == DType::F32 && t.byte_len() == row_bytes {
                ids.push(*id);
                grads.extend_from_slice(t.bytes());
                statuses.push(Status::Ok);
            } else {
                statuses.push(Status::InvalidArgument);
            }
        }
        let status = Table::push(&self.table, &ids, &grads);
        if !status.is_ok() {
            for s in statuses.iter_mut().filter(|s| s.is_ok()) {
                *s = status;
            }
        }
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
        table: shard_table(&args.model, args.ps)?,
        dims: [args.model.dim as u64],
    });
    let service: Arc<dyn Service> = ps.clone();
    let options = Options {
        service: Some(service),
        ..Options::listen(addr)
    };
    let rt = Runtime::start_with(config, options).map_err(|e| format!("listen on {addr}: {e}"))?;
    println!("READY");
    let cpu = Cpu::now();
    // Serve until the coordinator closes our stdin.
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    let stats = rt.stats();
    let cpu = Cpu::now().since(cpu);
    rt.shutdown();
    // How the table is laid out, and what it holds now.
    println!("ps:{}: {}", task.index, ps.table.report());
    let m = ps.table.metrics();
    println!(
        "ps:{}: {} rows stored ({:.1} MB), {} rows read by pulls ({} of them answered \
         unchanged, not sent), {} gradient rows applied; {} bytes in, {} out",
        task.index,
        m.rows,
        m.memory_bytes as f64 / 1e6,
        m.pulled_rows,
        m.unchanged_rows,
        m.pushed_rows - m.dropped_pushes,
        stats.bytes_in,
        stats.bytes_out
    );
    // For the coordinator: the rows read, applied and answered unchanged, to check
    // against the workers' counts, and the CPU time the task took and waited for while
    // serving.
    println!(
        "COUNTED {} {} {} {} {}",
        m.pulled_rows,
        m.pushed_rows - m.dropped_pushes,
        m.unchanged_rows,
        cpu.ran.as_nanos(),
        cpu.waited.as_nanos()
    );
    Ok(ExitCode::SUCCESS)
}
