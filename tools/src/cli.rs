//! The command line: argh structs for `commctl` and its subcommands (their values' parsers
//! are in `values`).

use std::path::PathBuf;
use std::time::Duration;

use argh::FromArgs;

use crate::table::{
    parse_init, parse_optimizer, parse_rate, parse_stored, parse_table_kind, InitSpec,
    OptimizerKind, TableKind, DEFAULT_DIM, DEFAULT_ROWS, DEFAULT_TABLE,
};
pub use crate::values::PortRule;
use crate::values::{parse_duration, parse_port_rule, parse_positive_seconds, parse_seconds};

/// Default `--tensors` of serve and bench.
pub const DEFAULT_TENSORS: u64 = 1024;
/// Default `--tensor-size` of serve and bench, bytes.
pub const DEFAULT_TENSOR_SIZE: u64 = 4096;

/// check, reach and load starwire tasks
#[derive(FromArgs, Debug)]
#[argh(
    help_triggers("-h", "--help"),
    note = "A TARGET is HOST:PORT (a data address, where starwire listens) or JOB:INDEX\n\
            (also /job:ps/task:0), looked up in the cluster spec and the .endpoint_map.\n\
            The cluster spec comes from --cluster, --ps-hosts and --worker-hosts, or from\n\
            $TF_CONFIG. The .endpoint_map is --endpoint-map, else the one in the folder\n\
            $TF_SEASTAR_ENDPOINT_MAP_PATH, else the one in the current folder.\n\
            Transport settings come from the environment as for any starwire task\n\
            (STARWIRE_CLUSTER_ID, STARWIRE_CLUSTER_TOKEN, STARWIRE_BACKEND, ...).\n\
            commctl's requests come from the task commctl-COMMAND:PID (commctl-bench:4242,\n\
            its process id), so a task's stats show each command and each run apart.",
    error_code(0, "success: valid, or every request answered"),
    error_code(
        1,
        "validate or endpoint-map found problems; ping or bench lost some requests; the \
         task did not save a checkpoint"
    ),
    error_code(2, "usage or configuration error, unreadable file"),
    error_code(3, "could not connect: nothing listening, or unreachable"),
    error_code(4, "handshake refused: cluster id or token mismatch"),
    error_code(5, "no reply within the timeout"),
    error_code(6, "connection lost or protocol error")
)]
pub struct Commctl {
    /// more log output on stderr (repeat for more: -v, -vv, -vvv)
    #[argh(switch, short = 'v')]
    pub verbose: u8,

    /// print the version and exit
    #[argh(switch, short = 'V')]
    pub version: bool,

    #[argh(subcommand)]
    pub command: Option<Command>,
}

/// A subcommand.
#[derive(FromArgs, Debug)]
#[argh(subcommand)]
pub enum Command {
    /// `commctl validate`
    Validate(ValidateArgs),
    /// `commctl ping`
    Ping(PingArgs),
    /// `commctl serve`
    Serve(ServeArgs),
    /// `commctl bench`
    Bench(BenchArgs),
    /// `commctl endpoint-map`
    EndpointMap(EndpointMapArgs),
    /// `commctl wait`
    Wait(WaitArgs),
    /// `commctl stats`
    Stats(StatsArgs),
    /// `commctl checkpoint`
    Checkpoint(CheckpointArgs),
}

/// The cluster-spec and endpoint-map options several subcommands share.
#[derive(Debug, Default, Clone)]
pub struct ClusterOpts {
    /// `--cluster JOB=HOST:PORT,...`, repeated.
    pub cluster: Vec<String>,
    /// `--ps-hosts`.
    pub ps_hosts: Option<String>,
    /// `--worker-hosts`.
    pub worker_hosts: Option<String>,
    /// `--tf-config`.
    pub tf_config: bool,
    /// `--endpoint-map`.
    pub endpoint_map: Option<PathBuf>,
}

impl ClusterOpts {
    /// Whether a spec was given on the command line (not `TF_CONFIG`).
    pub fn has_lists(&self) -> bool {
        !self.cluster.is_empty() || self.ps_hosts.is_some() || self.worker_hosts.is_some()
    }
}

/// check an .endpoint_map, and a cluster spec against it
#[derive(FromArgs, Debug)]
#[argh(
    subcommand,
    name = "validate",
    help_triggers("-h", "--help"),
    example = "commctl validate\n\
               commctl validate /etc/training/.endpoint_map --ps-hosts ps0:2222,ps1:2222 \
               --worker-hosts w0:2222,w1:2222\n\
               TF_CONFIG='{{\"cluster\": ...}}' commctl validate --tf-config --json",
    note = "Every problem is reported, as FILE:LINE: what is wrong. With a cluster spec,\n\
            every task must have an entry in the map (a task whose line has a problem is\n\
            reported once, on that line).",
    error_code(0, "valid"),
    error_code(1, "problems found"),
    error_code(2, "usage error, or a file that cannot be read")
)]
pub struct ValidateArgs {
    /// the endpoint map, or a folder holding one (default:
    /// $TF_SEASTAR_ENDPOINT_MAP_PATH/.endpoint_map, else ./.endpoint_map)
    #[argh(positional)]
    pub file: Option<PathBuf>,

    /// a job of the cluster spec, as JOB=HOST:PORT[,HOST:PORT...]; repeat for each job
    #[argh(option, arg_name = "job=hosts")]
    pub cluster: Vec<String>,

    /// the ps job, as HOST:PORT[,HOST:PORT...] (same as --cluster ps=...)
    #[argh(option, arg_name = "hosts")]
    pub ps_hosts: Option<String>,

    /// the worker job, as HOST:PORT[,HOST:PORT...]
    #[argh(option, arg_name = "hosts")]
    pub worker_hosts: Option<String>,

    /// read the cluster spec (and this task) from $TF_CONFIG
    #[argh(switch)]
    pub tf_config: bool,

    /// print the report as JSON on stdout
    #[argh(switch)]
    pub json: bool,
}

impl ValidateArgs {
    /// The shared options.
    pub fn cluster_opts(&self) -> ClusterOpts {
        ClusterOpts {
            cluster: self.cluster.clone(),
            ps_hosts: self.ps_hosts.clone(),
            worker_hosts: self.worker_hosts.clone(),
            tf_config: self.tf_config,
            endpoint_map: self.file.clone(),
        }
    }
}

/// send pings to a starwire task and report round-trip times
#[derive(FromArgs, Debug)]
#[argh(
    subcommand,
    name = "ping",
    help_triggers("-h", "--help"),
    example = "commctl ping -c 3 127.0.0.1:5555\n\
               commctl ping ps:0 --ps-hosts 10.0.0.1:2222 --worker-hosts 10.0.0.2:2222\n\
               commctl ping -c 100 -i 0.01 -s 65536 /job:worker/task:1",
    note = "Without -c, pings until interrupted (Ctrl-C prints the summary). Times are\n\
            measured by the event loop, from the ping being queued on the connection to\n\
            its pong being read; connecting is not included.",
    error_code(0, "every ping answered"),
    error_code(1, "some pings answered, not all"),
    error_code(2, "usage or configuration error"),
    error_code(3, "could not connect: nothing listening, or unreachable"),
    error_code(4, "handshake refused: cluster id or token mismatch"),
    error_code(5, "no reply within the timeout"),
    error_code(6, "connection lost or protocol error")
)]
pub struct PingArgs {
    /// HOST:PORT, or JOB:INDEX looked up in the cluster spec and the endpoint map
    #[argh(positional)]
    pub target: String,

    /// stop after sending COUNT pings
    #[argh(option, short = 'c')]
    pub count: Option<u64>,

    /// seconds between pings (default: 1)
    #[argh(option, short = 'i', default = "1.0", from_str_fn(parse_seconds))]
    pub interval: f64,

    /// payload bytes of each ping (default: 56)
    #[argh(option, short = 's', default = "56")]
    pub size: u32,

    /// seconds to wait for each reply (default: 5)
    #[argh(
        option,
        short = 'W',
        default = "5.0",
        from_str_fn(parse_positive_seconds)
    )]
    pub timeout: f64,

    /// print only the summary
    #[argh(switch, short = 'q')]
    pub quiet: bool,

    /// a job of the cluster spec, as JOB=HOST:PORT[,HOST:PORT...]; repeat for each job
    #[argh(option, arg_name = "job=hosts")]
    pub cluster: Vec<String>,

    /// the ps job, as HOST:PORT[,HOST:PORT...]
    #[argh(option, arg_name = "hosts")]
    pub ps_hosts: Option<String>,

    /// the worker job, as HOST:PORT[,HOST:PORT...]
    #[argh(option, arg_name = "hosts")]
    pub worker_hosts: Option<String>,

    /// the endpoint map, or a folder holding one
    #[argh(option, arg_name = "path")]
    pub endpoint_map: Option<PathBuf>,
}

impl PingArgs {
    /// The shared options.
    pub fn cluster_opts(&self) -> ClusterOpts {
        ClusterOpts {
            cluster: self.cluster.clone(),
            ps_hosts: self.ps_hosts.clone(),
            worker_hosts: self.worker_hosts.clone(),
            tf_config: false,
            endpoint_map: self.endpoint_map.clone(),
        }
    }
}

/// show a running task's counters and latencies per peer and operation
#[derive(FromArgs, Debug)]
#[argh(
    subcommand,
    name = "stats",
    help_triggers("-h", "--help"),
    example = "commctl stats ps:0 --ps-hosts 10.0.0.1:2222,10.0.0.2:2222\n\
               commctl stats 127.0.0.1:5555 --watch -i 1\n\
               commctl stats ps:1 --prometheus > ps1.prom",
    note = "Sends a STATS request (behind the handshake and the cluster token, like every\n\
            request) and shows the answer: per peer (its task name from the handshake, and\n\
            its address for requests the task sent) and operation, requests by outcome,\n\
            bytes, and latency percentiles; then, for a task that serves tables, per table\n\
            its rows and memory, calls, rows pulled and pushed, rows missing, rows answered\n\
            unchanged (row versions), created and evicted, and its hottest ids (how often\n\
            each was sampled).\n\
            `sent` rows are requests the task sent to a peer, `served` rows requests a peer\n\
            sent to it. A task with\n\
            STARWIRE_STATS_ENDPOINT=0 refuses (exit status 6). docs/deploying.md explains\n\
            the columns.",
    error_code(0, "answered"),
    error_code(2, "usage or configuration error"),
    error_code(3, "could not connect: nothing listening, or unreachable"),
    error_code(4, "handshake refused: cluster id or token mismatch"),
    error_code(5, "no reply within the timeout"),
    error_code(6, "connection lost, protocol error, or stats refused")
)]
pub struct StatsArgs {
    /// HOST:PORT, or JOB:INDEX looked up in the cluster spec and the endpoint map
    #[argh(positional)]
    pub target: String,

    /// refresh until interrupted, with rates per second (on a terminal the screen is
    /// cleared for each; into a file or a pipe the tables follow one another)
    #[argh(switch, short = 'w')]
    pub watch: bool,

    /// seconds between refreshes with --watch (default: 2)
    #[argh(
        option,
        short = 'i',
        default = "2.0",
        from_str_fn(parse_positive_seconds)
    )]
    pub interval: f64,

    /// print the task's JSON document (one line per refresh)
    #[argh(switch)]
    pub json: bool,

    /// print the Prometheus text exposition format
    #[argh(switch)]
    pub prometheus: bool,

    /// seconds to wait for the answer (default: 5)
    #[argh(
        option,
        short = 'W',
        default = "5.0",
        from_str_fn(parse_positive_seconds)
    )]
    pub timeout: f64,

    /// a job of the cluster spec, as JOB=HOST:PORT[,HOST:PORT...]; repeat for each job
    #[argh(option, arg_name = "job=hosts")]
    pub cluster: Vec<String>,

    /// the ps job, as HOST:PORT[,HOST:PORT...]
    #[argh(option, arg_name = "hosts")]
    pub ps_hosts: Option<String>,

    /// the worker job, as HOST:PORT[,HOST:PORT...]
    #[argh(option, arg_name = "hosts")]
    pub worker_hosts: Option<String>,

    /// the endpoint map, or a folder holding one
    #[argh(option, arg_name = "path")]
    pub endpoint_map: Option<PathBuf>,
}

impl StatsArgs {
    /// The shared options.
    pub fn cluster_opts(&self) -> ClusterOpts {
        ClusterOpts {
            cluster: self.cluster.clone(),
            ps_hosts: self.ps_hosts.clone(),
            worker_hosts: self.worker_hosts.clone(),
            tf_config: false,
            endpoint_map: self.endpoint_map.clone(),
        }
    }
}

/// ask a running task to save its tables into its checkpoint directory
#[derive(FromArgs, Debug)]
#[argh(
    subcommand,
    name = "checkpoint",
    help_triggers("-h", "--help"),
    example = "commctl checkpoint ps:0 --ps-hosts 10.0.0.1:2222,10.0.0.2:2222\n\
               commctl checkpoint 127.0.0.1:5555 --json > manifest.json",
    note = "Sends a CHECKPOINT request (behind the handshake and the cluster token, like every\n\
            request). The task saves every table it serves into its own checkpoint\n\
            directory, on its host: the setting STARWIRE_CHECKPOINT_DIR of the task\n\
            (commctl serve: --checkpoint-dir DIR), never named by the requester. One file per\n\
            table (table-ID.swrows), each written atomically while the table serves, then\n\
            the manifest checkpoint.json. The answer is the manifest: shown per table (file,\n\
            rows, bytes, seconds, GB/s, whether rows went around the page cache) with the\n\
            directory, or as it is with --json. A PS started with the same directory loads\n\
            its tables from there (commctl serve --checkpoint-dir DIR, PsTable::load).\n\
            Saving takes about a second per GB of table: the default timeout is 600 s.\n\
            A task without a checkpoint directory refuses (UNIMPLEMENTED); one already\n\
            saving with two more checkpoints queued says to retry later (UNAVAILABLE); a\n\
            table that failed to save is named with the task's reason (INTERNAL), and the\n\
            previous manifest stays in place. Each of these exits with status 1.",
    error_code(0, "saved: the manifest is shown"),
    error_code(
        1,
        "the task did not save: no checkpoint directory, checkpoints already queued, or a \
         table failed"
    ),
    error_code(2, "usage or configuration error"),
    error_code(3, "could not connect: nothing listening, or unreachable"),
    error_code(4, "handshake refused: cluster id or token mismatch"),
    error_code(5, "no reply within the timeout"),
    error_code(6, "connection lost or protocol error")
)]
pub struct CheckpointArgs {
    /// HOST:PORT, or JOB:INDEX looked up in the cluster spec and the endpoint map
    #[argh(positional)]
    pub target: String,

    /// seconds to wait for the answer, saving included (default: 600)
    #[argh(
        option,
        short = 'W',
        default = "600.0",
        from_str_fn(parse_positive_seconds)
    )]
    pub timeout: f64,

    /// print the task's manifest as it is (JSON)
    #[argh(switch)]
    pub json: bool,

    /// a job of the cluster spec, as JOB=HOST:PORT[,HOST:PORT...]; repeat for each job
    #[argh(option, arg_name = "job=hosts")]
    pub cluster: Vec<String>,

    /// the ps job, as HOST:PORT[,HOST:PORT...]
    #[argh(option, arg_name = "hosts")]
    pub ps_hosts: Option<String>,

    /// the worker job, as HOST:PORT[,HOST:PORT...]
    #[argh(option, arg_name = "hosts")]
    pub worker_hosts: Option<String>,

    /// the endpoint map, or a folder holding one
    #[argh(option, arg_name = "path")]
    pub endpoint_map: Option<PathBuf>,
}

impl CheckpointArgs {
    /// The shared options.
    pub fn cluster_opts(&self) -> ClusterOpts {
        ClusterOpts {
            cluster: self.cluster.clone(),
            ps_hosts: self.ps_hosts.clone(),
            worker_hosts: self.worker_hosts.clone(),
            tf_config: false,
            endpoint_map: self.endpoint_map.clone(),
        }
    }
}

/// wait until starwire tasks answer, and name the ones that do not
#[derive(FromArgs, Debug)]
#[argh(
    subcommand,
    name = "wait",
    help_triggers("-h", "--help"),
    example = "commctl wait ps:0 ps:1 --ps-hosts ps0:2222,ps1:2222 -W 120\n\
               commctl wait 10.0.0.1:5555 10.0.0.2:5555",
    note = "Each target is tried (connect, handshake, ping) again and again until it answers\n\
            or the time is up; then the ones that never answered are listed, each with its\n\
            last error. For a job's start-up: it says which peers never came up.",
    error_code(0, "every target answered"),
    error_code(2, "usage error"),
    error_code(3, "some targets did not answer within the time")
)]
pub struct WaitArgs {
    /// HOST:PORT, or JOB:INDEX looked up in the cluster spec and the endpoint map
    #[argh(positional)]
    pub targets: Vec<String>,

    /// seconds to wait in all (default: 60)
    #[argh(
        option,
        short = 'W',
        default = "60.0",
        from_str_fn(parse_positive_seconds)
    )]
    pub timeout: f64,

    /// a job of the cluster spec, as JOB=HOST:PORT[,HOST:PORT...]; repeat for each job
    #[argh(option, arg_name = "job=hosts")]
    pub cluster: Vec<String>,

    /// the ps job, as HOST:PORT[,HOST:PORT...]
    #[argh(option, arg_name = "hosts")]
    pub ps_hosts: Option<String>,

    /// the worker job, as HOST:PORT[,HOST:PORT...]
    #[argh(option, arg_name = "hosts")]
    pub worker_hosts: Option<String>,

    /// the endpoint map, or a folder holding one
    #[argh(option, arg_name = "path")]
    pub endpoint_map: Option<PathBuf>,
}

impl WaitArgs {
    /// The shared options.
    pub fn cluster_opts(&self) -> ClusterOpts {
        ClusterOpts {
            cluster: self.cluster.clone(),
            ps_hosts: self.ps_hosts.clone(),
            worker_hosts: self.worker_hosts.clone(),
            tf_config: false,
            endpoint_map: self.endpoint_map.clone(),
        }
    }
}

/// run a standalone starwire server until interrupted
#[derive(FromArgs, Debug)]
#[argh(
    subcommand,
    name = "serve",
    help_triggers("-h", "--help"),
    example = "commctl serve --listen 127.0.0.1:5555\n\
               commctl serve --task ps:1 --ps-hosts ps0:2222,ps1:2222\n\
               commctl serve --tf-config      # the task named in $TF_CONFIG",
    note = "Prints 'listening on ADDRESS as TASK ...' on stdout once it accepts\n\
            connections (the line names the store and the rows table); without --task or\n\
            --tf-config, TASK is ps:0, the default task, and the line says so. The lines\n\
            after it are the table's report (its layout, and whether the kernel gave huge\n\
            pages), where its rows came from, with its bytes against the CPU caches, and\n\
            where a checkpoint request saves it.\n\
            Answers ping, pull, push, recv and fused recv from a synthetic store of\n\
            --tensors variables (ids 0..N-1), each a u8 tensor of --tensor-size bytes:\n\
            - pull of id i < N returns variable i; other ids: NOT_FOUND.\n\
            - push is checked and dropped: OK for id i < N with a tensor of\n\
              --tensor-size bytes; NOT_FOUND for other ids; INVALID_ARGUMENT for other\n\
              sizes. Variables never change.\n\
            - recv keys are t/0 .. t/N-1 (variable i under t/i), any step: a producer\n\
              thread publishes each key again soon after a recv took it, so every key\n\
              can be received any number of times. Other keys wait until the deadline.\n\
            Answers pull-rows and push-rows (PULL_ROWS, PUSH_ROWS) from one table of\n\
            embedding rows, table --table of rows of --dim f32 (any u64 id): starwire's\n\
            PsTable (--table-kind ps, the default; --stored bf16 or f16 halves its rows in\n\
            memory) or its small MemTable (--table-kind mem, to compare with):\n\
            - rows 0..--rows-1 are made at start with their --init values (default\n\
              100000 rows, the ids bench draws by default), so a bench pulls rows that\n\
              exist; with --checkpoint-dir DIR (or $STARWIRE_CHECKPOINT_DIR) holding the\n\
              table's checkpoint (table-<id>.swrows), its rows are loaded from there\n\
              instead; commctl checkpoint makes serve save the table there;\n\
            - a pull of an id without a row creates it (--init zeros, uniform, normal,\n\
              truncated-normal) or reports it missing and reads zeros (--init missing);\n\
            - a push applies the gradient rows: --optimizer sgd (w -= lr * g), adagrad\n\
              (acc += g * g; w -= lr * g / sqrt(acc)) or adam, creating rows as needed.\n\
            Another table is NOT_FOUND; rows of another dtype or shape INVALID_ARGUMENT.\n\
            Stops cleanly on SIGINT or SIGTERM, saying on stderr what each part served\n\
            (recvs: the tensors they took).",
    error_code(0, "stopped by SIGINT or SIGTERM"),
    error_code(2, "usage or configuration error, or the address cannot be bound")
)]
pub struct ServeArgs {
    /// more log output on stderr, as commctl -v (repeat for more; -v says what is served)
    #[argh(switch, short = 'v')]
    pub verbose: u8,

    /// the address to listen on, HOST:PORT (port 0 picks a free one)
    #[argh(option, short = 'l', arg_name = "addr")]
    pub listen: Option<String>,

    /// serve as this task, JOB:INDEX: listen on its data address from the cluster spec and
    /// the endpoint map (default: ps:0 with --listen, the task $TF_CONFIG names with
    /// --tf-config)
    #[argh(option, arg_name = "job:index")]
    pub task: Option<String>,

    /// event loops (default: from NETWORK_PS_CORE_NUMBER or NETWORK_WORKER_CORE_NUMBER,
    /// else one per CPU, at most 16)
    #[argh(option)]
    pub loops: Option<usize>,

    /// variables in the store, ids 0..N-1, and recv keys t/0..t/N-1 (default: 1024)
    #[argh(option, default = "DEFAULT_TENSORS", arg_name = "n")]
    pub tensors: u64,

    /// bytes of each tensor (default: 4096)
    #[argh(option, default = "DEFAULT_TENSOR_SIZE", arg_name = "bytes")]
    pub tensor_size: u64,

    /// threads that run pull and push handlers; 0 runs them on the event loops
    /// (default: 0)
    #[argh(option, default = "0")]
    pub handler_threads: usize,

    /// the rows table's id, for pull-rows and push-rows (default: 1)
    #[argh(option, default = "DEFAULT_TABLE", arg_name = "id")]
    pub table: u32,

    /// f32 per row of the rows table (default: 16, rows of 64 B)
    #[argh(option, default = "DEFAULT_DIM", arg_name = "n")]
    pub dim: usize,

    /// the rows table: ps (starwire's PsTable) or mem (the small MemTable, to compare
    /// with) (default: ps)
    #[argh(
        option,
        default = "TableKind::Ps",
        from_str_fn(parse_table_kind),
        arg_name = "kind"
    )]
    pub table_kind: TableKind,

    /// rows made at start, ids 0..N-1, with their --init values (default: 100000)
    #[argh(option, default = "DEFAULT_ROWS", arg_name = "n")]
    pub rows: u64,

    /// how a PsTable stores its elements: f32, bf16 or f16 (rows still travel as f32)
    /// (default: f32)
    #[argh(
        option,
        default = "starwire::rows::ps::Float::F32",
        from_str_fn(parse_stored),
        arg_name = "format"
    )]
    pub stored: starwire::rows::ps::Float,

    /// the task's checkpoint directory: the table is loaded from its checkpoint there
    /// (table-ID.swrows) when there is one, instead of making --rows rows, and saved there
    /// when a peer asks for a checkpoint (commctl checkpoint) (default:
    /// $STARWIRE_CHECKPOINT_DIR; without either, checkpoints are refused)
    #[argh(option, arg_name = "dir")]
    pub checkpoint_dir: Option<PathBuf>,

    /// a new row of the table: zeros, missing (a pull reports it missing), or uniform,
    /// normal or truncated-normal, each with :SCALE or :SCALE:SEED (the range's half-width
    /// or the standard deviation; default 0.01:0) (default: zeros)
    #[argh(
        option,
        default = "InitSpec::Zeros",
        from_str_fn(parse_init),
        arg_name = "init"
    )]
    pub init: InitSpec,

    /// how the table applies pushed gradients: sgd, adagrad or adam (default: sgd)
    #[argh(
        option,
        default = "OptimizerKind::Sgd",
        from_str_fn(parse_optimizer),
        arg_name = "name"
    )]
    pub optimizer: OptimizerKind,

    /// the optimizer's learning rate (default: 0.01)
    #[argh(option, default = "0.01", from_str_fn(parse_rate), arg_name = "x")]
    pub lr: f32,

    /// adagrad's squared-gradient sum of a new row, more than 0 (default: 0.1)
    #[argh(option, default = "0.1", from_str_fn(parse_rate), arg_name = "x")]
    pub initial_accumulator: f32,

    /// a job of the cluster spec, as JOB=HOST:PORT[,HOST:PORT...]; repeat for each job
    #[argh(option, arg_name = "job=hosts")]
    pub cluster: Vec<String>,

    /// the ps job, as HOST:PORT[,HOST:PORT...]
    #[argh(option, arg_name = "hosts")]
    pub ps_hosts: Option<String>,

    /// the worker job, as HOST:PORT[,HOST:PORT...]
    #[argh(option, arg_name = "hosts")]
    pub worker_hosts: Option<String>,

    /// read the cluster spec, and the task when --task is not given, from $TF_CONFIG
    #[argh(switch)]
    pub tf_config: bool,

    /// the endpoint map, or a folder holding one
    #[argh(option, arg_name = "path")]
    pub endpoint_map: Option<PathBuf>,
}

impl ServeArgs {
    /// The shared options.
    pub fn cluster_opts(&self) -> ClusterOpts {
        ClusterOpts {
            cluster: self.cluster.clone(),
            ps_hosts: self.ps_hosts.clone(),
            worker_hosts: self.worker_hosts.clone(),
            tf_config: self.tf_config,
            endpoint_map: self.endpoint_map.clone(),
        }
    }
}

/// drive load against a starwire server; report rate, latency and CPU time
#[derive(FromArgs, Debug)]
#[argh(
    subcommand,
    name = "bench",
    help_triggers("-h", "--help"),
    example = "commctl bench                          # starts its own server\n\
               commctl bench 10.0.0.1:5555 -d 30s -p 64 -C 4 --loops 2\n\
               commctl bench -o fused-recv -k 16 --tensor-size 65536 -d 10s\n\
               commctl bench -o pull-rows -k 1000 --row-bytes 64 -d 10s\n\
               commctl bench ps:0 --server-pid 4242 --json",
    note = "Without a TARGET, bench starts `commctl serve` on 127.0.0.1 and reports its\n\
            CPU time too; with one, --server-pid reads the server's CPU time from /proc.\n\
            Operations, against `commctl serve` (see commctl serve --help):\n\
            - ping: a ping of -s bytes each way.\n\
            - pull: -k ids per request; push: -k tensors of --tensor-size bytes.\n\
            - recv: one key t/i per request; fused-recv: -k keys in one request.\n\
            - pull-rows, push-rows: -k rows of table --table in one packed block, rows of\n\
              --dim f32 (or --row-bytes B, B/4 f32); a push sends gradient rows.\n\
            Ids and keys i run through 0..--variables in turn, continuing across requests.\n\
            Row ids are drawn from 0..--rows uniformly by a fixed hash of a counter (or\n\
            Zipf-distributed with --zipf S, the hot ids spread over the range): the same\n\
            sequence every run, repeats within a request possible. The header says the\n\
            working set: the table's bytes for --rows rows (a --table-kind table of\n\
            --stored rows with --optimizer) and whether they fit in the CPU's caches.\n\
            A request counts as ok when every tensor (or block of rows) in it is; bytes\n\
            are tensor or row bytes moved (received for pulls and recv, sent for pushes;\n\
            ping: payload). Rows operations also report rows/s and CPU time per row.\n\
            Latency is measured by the client, from submitting a request to taking its\n\
            completion. A progress line is shown while stderr is a terminal.",
    error_code(0, "every request answered"),
    error_code(1, "some requests failed"),
    error_code(2, "usage or configuration error"),
    error_code(3, "could not connect: nothing listening, or unreachable"),
    error_code(4, "handshake refused: cluster id or token mismatch"),
    error_code(5, "no reply within the timeout"),
    error_code(6, "connection lost or protocol error")
)]
pub struct BenchArgs {
    /// HOST:PORT or JOB:INDEX of the server (default: start one)
    #[argh(positional)]
    pub target: Option<String>,

    /// the request to send: ping, pull, push, recv, fused-recv, pull-rows or push-rows
    /// (default: ping)
    #[argh(option, short = 'o', default = "String::from(\"ping\")")]
    pub operation: String,

    /// payload bytes of each ping (default: 64)
    #[argh(option, short = 's', default = "64")]
    pub size: u32,

    /// tensors per pull, push or fused recv: ids or keys in each request; rows per
    /// pull-rows or push-rows (default: 1; recv always asks for one)
    #[argh(option, short = 'k', default = "1", arg_name = "k")]
    pub tensors: usize,

    /// the rows table, for pull-rows and push-rows (default: 1, commctl serve's)
    #[argh(option, default = "DEFAULT_TABLE", arg_name = "id")]
    pub table: u32,

    /// f32 per row, for pull-rows and push-rows; the server bench starts gets it
    /// (default: 16)
    #[argh(option, arg_name = "n")]
    pub dim: Option<usize>,

    /// bytes per row instead of --dim: a multiple of 4, rows of B/4 f32
    #[argh(option, arg_name = "bytes")]
    pub row_bytes: Option<u64>,

    /// rows of the table: row ids are drawn from 0..N-1, and the server bench starts
    /// makes those rows at start (default: 100000, serve's default)
    #[argh(option, arg_name = "n")]
    pub rows: Option<u64>,

    /// the same as --rows (its older name)
    #[argh(option, arg_name = "n")]
    pub id_range: Option<u64>,

    /// draw row ids Zipf-distributed with exponent S (more than 0; 1.1 is typical of
    /// categorical features) instead of uniformly
    #[argh(option, arg_name = "s")]
    pub zipf: Option<f64>,

    /// pull-rows as a worker's row cache pulls: holding each row's version, so that rows
    /// unchanged since bench last pulled them come back without their bytes (every row of
    /// --rows is pulled once before the clock starts, to learn the versions)
    #[argh(switch)]
    pub versioned: bool,

    /// with --versioned: the share of each pull's rows, 0 to 1, that bench pushes a
    /// gradient to just before the pull, so that they come back changed (default: 0)
    #[argh(option, arg_name = "fraction")]
    pub changed: Option<f64>,

    /// the table of the server bench starts, and what the working set's size is reckoned
    /// for: ps or mem (default: ps)
    #[argh(
        option,
        default = "TableKind::Ps",
        from_str_fn(parse_table_kind),
        arg_name = "kind"
    )]
    pub table_kind: TableKind,

    /// what pull-rows and push-rows rows travel as: f32, bf16 or f16 (default: f32, the
    /// table's; a target that does not announce row_formats is sent f32)
    #[argh(
        option,
        default = "starwire::rows::ps::Float::F32",
        from_str_fn(parse_stored),
        arg_name = "format"
    )]
    pub wire: starwire::rows::ps::Float,

    /// how that table stores its elements: f32, bf16 or f16 (default: f32)
    #[argh(
        option,
        default = "starwire::rows::ps::Float::F32",
        from_str_fn(parse_stored),
        arg_name = "format"
    )]
    pub stored: starwire::rows::ps::Float,

    /// that table's optimizer: sgd, adagrad or adam (default: sgd)
    #[argh(
        option,
        default = "OptimizerKind::Sgd",
        from_str_fn(parse_optimizer),
        arg_name = "name"
    )]
    pub optimizer: OptimizerKind,

    /// bytes of each pushed tensor, and of the store of the server bench starts
    /// (default: 4096)
    #[argh(option, default = "DEFAULT_TENSOR_SIZE", arg_name = "bytes")]
    pub tensor_size: u64,

    /// ids and keys are taken in turn from 0..N-1: at most the server's --tensors;
    /// the server bench starts gets N (default: 1024)
    #[argh(option, default = "DEFAULT_TENSORS", arg_name = "n")]
    pub variables: u64,

    /// how long to run, as 10s, 500ms or 2m (default: 5s)
    #[argh(option, short = 'd', from_str_fn(parse_duration))]
    pub duration: Option<Duration>,

    /// stop after this many requests instead
    #[argh(option, short = 'n')]
    pub requests: Option<u64>,

    /// requests kept in flight (default: 16)
    #[argh(option, short = 'p', default = "16")]
    pub inflight: usize,

    /// TCP connections to the server (default: 1)
    #[argh(option, short = 'C', default = "1")]
    pub connections: usize,

    /// client event loops (default: 1)
    #[argh(option, default = "1")]
    pub loops: usize,

    /// event loops of the server bench starts (default: 1)
    #[argh(option, default = "1")]
    pub server_loops: usize,

    /// the server's process id, to report its CPU time
    #[argh(option)]
    pub server_pid: Option<u32>,

    /// seconds before a request counts as failed (default: 5)
    #[argh(
        option,
        short = 'W',
        default = "5.0",
        from_str_fn(parse_positive_seconds)
    )]
    pub timeout: f64,

    /// print the report as JSON on stdout
    #[argh(switch)]
    pub json: bool,

    /// a job of the cluster spec, as JOB=HOST:PORT[,HOST:PORT...]; repeat for each job
    #[argh(option, arg_name = "job=hosts")]
    pub cluster: Vec<String>,

    /// the ps job, as HOST:PORT[,HOST:PORT...]
    #[argh(option, arg_name = "hosts")]
    pub ps_hosts: Option<String>,

    /// the worker job, as HOST:PORT[,HOST:PORT...]
    #[argh(option, arg_name = "hosts")]
    pub worker_hosts: Option<String>,

    /// the endpoint map, or a folder holding one
    #[argh(option, arg_name = "path")]
    pub endpoint_map: Option<PathBuf>,
}

impl BenchArgs {
    /// The shared options.
    pub fn cluster_opts(&self) -> ClusterOpts {
        ClusterOpts {
            cluster: self.cluster.clone(),
            ps_hosts: self.ps_hosts.clone(),
            worker_hosts: self.worker_hosts.clone(),
            tf_config: false,
            endpoint_map: self.endpoint_map.clone(),
        }
    }
}

/// write the .endpoint_map of a cluster spec, each task's data port by a rule
#[derive(FromArgs, Debug)]
#[argh(
    subcommand,
    name = "endpoint-map",
    help_triggers("-h", "--help"),
    example = "commctl endpoint-map --tf-config --port-rule 5555 -o /etc/starwire\n\
               commctl endpoint-map --ps-hosts 10.0.0.1:2222 --worker-hosts 10.0.0.1:2223 \
               --port-rule +1000",
    note = "Each task's data address (where its starwire listens) is its control address\n\
            from the cluster spec, same host, with the port of --port-rule:\n\
            - PORT: that port on every host (tasks on hosts of their own, as pods are);\n\
            - +OFFSET: the control port plus OFFSET (tasks sharing a host).\n\
            The map is checked as every task will read it (no two tasks on one data\n\
            address, no data address that is a control address) before it is written.\n\
            Without -o it goes to stdout. With -o, the file (or .endpoint_map in the\n\
            folder) is replaced in one step: a task reading it never sees half of it.\n\
            Tasks find it through $TF_SEASTAR_ENDPOINT_MAP_PATH (the folder).",
    error_code(0, "written"),
    error_code(1, "the rule gives a map with problems; nothing written"),
    error_code(
        2,
        "usage error, a cluster spec with problems, or a file that cannot be written"
    )
)]
pub struct EndpointMapArgs {
    /// each task's data port: PORT, the same on every host, or +OFFSET, the control port
    /// plus OFFSET
    #[argh(option, from_str_fn(parse_port_rule), arg_name = "rule")]
    pub port_rule: PortRule,

    /// write the map to this file, or to .endpoint_map in this folder (default: stdout)
    #[argh(option, short = 'o', arg_name = "path")]
    pub output: Option<PathBuf>,

    /// read the cluster spec from $TF_CONFIG
    #[argh(switch)]
    pub tf_config: bool,

    /// a job of the cluster spec, as JOB=HOST:PORT,...; repeat for each job
    #[argh(option, arg_name = "job=hosts")]
    pub cluster: Vec<String>,

    /// the ps job, as HOST:PORT,...
    #[argh(option, arg_name = "hosts")]
    pub ps_hosts: Option<String>,

    /// the worker job, as HOST:PORT,...
    #[argh(option, arg_name = "hosts")]
    pub worker_hosts: Option<String>,
}

impl EndpointMapArgs {
    /// The shared options (the map is written, not read).
    pub fn cluster_opts(&self) -> ClusterOpts {
        ClusterOpts {
            cluster: self.cluster.clone(),
            ps_hosts: self.ps_hosts.clone(),
            worker_hosts: self.worker_hosts.clone(),
            tf_config: self.tf_config,
            endpoint_map: None,
        }
    }
}
