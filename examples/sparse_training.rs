//! A sparse model trained over starwire by PS and worker processes on this machine.
//!
//! ```console
//! $ cargo run --release --example sparse_training            # about a minute
//! $ cargo run --release --example sparse_training -- --help
//! ```
//!
//! The program writes a `.endpoint_map` for a cluster of `--ps` PS tasks and `--workers`
//! worker tasks on loopback, starts each task as a process of its own (this program again,
//! with `--role`), and prints what the workers report. Each task finds its data address the
//! way a real job does: from the cluster spec and the `.endpoint_map`.
//!
//! The model (`sparse_training/model.rs`) is a factorization machine over hashed
//! categorical features: one row of `--dim` f32 per feature id, sharded over the PS tasks by
//! id. Labels come from a ground-truth model of the same form, so the best reachable loss is
//! known and printed next to the reached one. Per step, a worker draws a batch, pulls the
//! rows of the batch's distinct ids, computes the gradients, and pushes one gradient row per
//! id. The PS tasks apply Adagrad as the gradients arrive.
//!
//! How rows travel is chosen on the command line:
//!
//! - by default, as embedding rows: the worker's `Sharded` client spreads the ids over the
//!   PS tasks and sends one `PULL_ROWS` and one `PUSH_ROWS` frame per PS task and step, each
//!   carrying its rows as one packed block (an 8-byte id and the row's bytes per row). The
//!   PS serves them from its shard of the model through the `Table` trait;
//! - with `--pipeline`, the same frames through the pipelined rows client (`Pipeline`): a
//!   step pulls the rows its previous step requested, requests the next batch's rows
//!   before it computes, and pushes without waiting for the answer; `--staleness N` bounds
//!   how many of the worker's own latest pushes the rows it uses may miss (0: none, the
//!   synchronous step's rows); `--cache BYTES` (`8M`: 8 MiB) gives the pipeline a row cache
//!   (`RowCache`), which serves every row of a step that misses at most that many pushes
//!   without asking the PS (the worker's own pushes do not update it: the bound keeps it
//!   honest). The rows it holds too old to serve are named in the pull with their
//!   versions, and the PS sends only those that changed: at staleness 0 the cache serves
//!   nothing without asking, but every row it holds is refreshed this way. Rows in another
//!   wire format (`--wire`) are pulled whole;
//! - with `--per-tensor`, as tensors: one fused `PULL` and one fused `PUSH` per PS task and
//!   step, one tensor (with its own descriptor) per row, served by `Service::pull` and
//!   `Service::push`;
//! - with `--unfused`, every row pulled and pushed by a request of its own (64 in flight),
//!   to show what fusion saves.
//!
//! `--wire bf16` (or `f16`) moves the rows blocks, pulls and pushes, in that format: half
//! the bytes of each row, while the PS tables stay f32 (the held-out evaluation pulls f32).
//!
//! Either way the PS holds its rows and their Adagrad state in starwire's PS table
//! (`PsTable`), which both paths go through, so the loss and AUC are those of the same
//! model. Each worker times its steps: communication (the time in the calls that move
//! rows: what the computation did not overlap) beside compute (the model's forward and
//! backward pass) and data (drawing the batch), and counts the rows and bytes it moved
//! and the rows its row cache served (and those a versioned pull had answered unchanged);
//! the coordinator prints them per interval, each worker's summary line, the means per
//! step over all workers, and checks the rows the workers moved against the rows the PS
//! tables counted. `--compare` runs the job twice, through the synchronous rows client and
//! then as the other flags say, with the same batches, and sets the two side by side.
//!
//! Each field's values are drawn with Zipf exponent `--zipf S` (1.1 by default: a few ids
//! of each field are in most examples; 0 draws them uniformly).
//!
//! The program, one idea per file of `examples/sparse_training/`, in reading order:
//!
//! - `model.rs`: the synthetic data (a ground-truth model draws the labels), the model's
//!   loss and gradients, and a plain PS shard (rows and Adagrad state in a hash map, what
//!   `tools/wirebench`'s servers keep); no starwire in it (`tools/wirebench` includes it);
//! - `args.rs`: the command line;
//! - `cluster.rs`: the cluster spec and `.endpoint_map`, and the coordinator that starts
//!   the tasks as processes and collects their output;
//! - `ps.rs`: a PS task, its shard of the model in a `PsTable` (sized for the rows it
//!   expects: its share of the features), served as a table of rows and as tensors;
//! - `worker.rs`: a worker task's training loop and the held-out evaluation;
//! - `transfer.rs`: how a step's rows travel (rows blocks, pipelined rows blocks, fused
//!   tensors, or a request per row);
//! - `report.rs`: the table per interval, the summary, the communication per PS task;
//! - `compare.rs`: `--compare`, the job twice and the two side by side;
//! - `cpu.rs`: a task's CPU time, and the time its threads waited for a CPU.

#[path = "sparse_training/args.rs"]
mod args;
#[path = "sparse_training/cluster.rs"]
mod cluster;
#[path = "sparse_training/compare.rs"]
mod compare;
#[path = "sparse_training/cpu.rs"]
mod cpu;
#[path = "sparse_training/model.rs"]
mod model;
#[path = "sparse_training/ps.rs"]
mod ps;
#[path = "sparse_training/report.rs"]
mod report;
#[path = "sparse_training/transfer.rs"]
mod transfer;
#[path = "sparse_training/worker.rs"]
mod worker;

use args::{Args, USAGE};
use std::process::ExitCode;

/// What a task or the coordinator returns: an error is one line, printed with the task's
/// name.
type Res<T> = Result<T, String>;

fn main() -> ExitCode {
    let args = match Args::parse(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) if e.is_empty() => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("sparse_training: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let result = match &args.role {
        None => compare::run(args.clone()),
        Some(task) if task.job == "ps" => ps::run_ps(&args, task),
        Some(task) => worker::run_worker(&args, task),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            let who = args
                .role
                .as_ref()
                .map_or("sparse_training".into(), |t| t.to_string());
            eprintln!("{who}: {e}");
            ExitCode::FAILURE
        }
    }
}
