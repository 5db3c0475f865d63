//! The one table of settings. Each setting is written here once: its name, type, variable,
//! default, kind (how it is read and checked) and doc; `settings!` (in `macros.rs`) makes
//! the config, the builder, the environment reader, the checks, `Debug` and the rows of the
//! table in `docs/tuning.md` from it.
//!
//! The first paragraph of a setting's doc is its line in `docs/tuning.md`: plain text, no
//! rustdoc links.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::env::Env;
use super::error::{ConfigError, Origin, Setting};
use super::types::{
    BackendSetting, FeaturesSetting, FitsFrame, Flag, Num, Opt, PathSetting, Secret, SettingType,
    Shown, Time, TimeUnit, ZeroOr,
};
use super::BackendChoice;
use crate::wire::{self, Limits, WireFeatures};

settings! {
    /// Both ends of a connection must have the same value, or the handshake fails.
    cluster_id: u64 [] {
        env: [ENV_CLUSTER_ID = "STARWIRE_CLUSTER_ID"],
        default: [DEFAULT_CLUSTER_ID = 0],
        kind: Num::new(0, u64::MAX, "an integer"),
        setter: plain,
    }

    /// Event loops (threads) asked for explicitly; `None` computes them: min(16,
    /// connections), at most the CPUs this process may run on.
    ///
    /// See [`Config::loop_count`].
    loops: Option<usize> [] {
        env: [role LOOPS_ENV = "NETWORK_WORKER_CORE_NUMBER", "NETWORK_PS_CORE_NUMBER"],
        default: [None],
        kind: Opt {
            some: Num::new(1, MAX_LOOPS, "loops").env_unit("a number of loops"),
            none: "computed: min(16, connections), at most the allowed CPUs",
        },
        setter: into,
        consts: {
            /// Most event loops that may be asked for explicitly (the size of a Linux CPU set).
            pub const MAX_LOOPS: usize = 1024;
        }
    }

    /// Busy-poll forever instead of spinning for `spin` and then parking. Costs a whole CPU
    /// per loop; off in the originals too. A polling loop yields its CPU after each burst
    /// of work and every 20 µs, so a thread sharing the CPU is not shut out.
    polling: bool [] {
        env: [role POLLING_ENV = "WORKER_ENABLE_POLLING", "PS_ENABLE_POLLING"],
        default: [DEFAULT_POLLING = false],
        kind: Flag { inverted: false },
        setter: plain,
    }

    /// Pin each loop thread to one CPU of the allowed set. Off by default, as in the
    /// originals (their `*_DISABLE_PIN_CORES` defaults to true).
    ///
    /// The variable is inverted: `pin(true)` is `*_DISABLE_PIN_CORES=false`. See
    /// [`pin_plan`](super::pin_plan).
    pin: bool [] {
        env: [role DISABLE_PIN_ENV = "WORKER_DISABLE_PIN_CORES", "PS_DISABLE_PIN_CORES"],
        default: [DEFAULT_PIN = false],
        kind: Flag { inverted: true },
        setter: plain,
    }

    /// How long an idle loop spins before it parks (ignored when polling); 50 µs is the
    /// smallest budget at which back-to-back round trips stop parking. An embedded
    /// client's waits spin longer, up to 250 µs, while its recent waits have been longer
    /// (twice their average); 0 parks at once everywhere.
    spin: Duration [] {
        env: [ENV_SPIN_US = "STARWIRE_SPIN_US"],
        default: [DEFAULT_SPIN = Duration::from_micros(50)],
        kind: Time { lo: Duration::ZERO, hi: MAX_SPIN, unit: TimeUnit::Micros },
        setter: plain,
        consts: {
            /// Longest accepted [`Config::spin`].
            pub const MAX_SPIN: Duration = Duration::from_secs(10);
        }
    }

    /// The I/O backend; `auto` uses io_uring when the start-up probe finds what the loops
    /// need, else epoll; `uring` is io_uring or an error.
    backend: BackendChoice [] {
        env: [ENV_BACKEND = "STARWIRE_BACKEND"],
        default: [BackendChoice::Auto],
        kind: BackendSetting,
        setter: plain,
    }

    /// Create each loop's io_uring with task-work setup flags, the best the kernel accepts:
    /// SINGLE_ISSUER + DEFER_TASKRUN (Linux 6.1), else COOP_TASKRUN (5.19), else none, and
    /// register its descriptor (5.18) so the loop enters it by index; false creates the
    /// rings without flags and enters them by descriptor.
    uring_flags: bool [] {
        env: [ENV_URING_FLAGS = "STARWIRE_URING_FLAGS"],
        default: [DEFAULT_URING_FLAGS = true],
        kind: Flag { inverted: false },
        setter: plain,
    }

    /// Enter each connection's socket in its loop's io_uring file table (Linux 5.19), so
    /// that operations name it by index and the kernel skips the descriptor lookup; false
    /// names sockets by descriptor.
    uring_fixed_files: bool [] {
        env: [ENV_URING_FIXED_FILES = "STARWIRE_URING_FIXED_FILES"],
        default: [DEFAULT_URING_FIXED_FILES = true],
        kind: Flag { inverted: false },
        setter: plain,
    }

    /// With the file table and multishot accepts (Linux 6.0): the kernel puts each
    /// accepted socket straight in the table, with no descriptor, saving a descriptor, a
    /// `setsockopt` and a table update per accepted connection; false accepts into
    /// descriptors that the loop enters in the table.
    uring_direct_accept: bool [] {
        env: [ENV_URING_DIRECT_ACCEPT = "STARWIRE_URING_DIRECT_ACCEPT"],
        default: [DEFAULT_URING_DIRECT_ACCEPT = true],
        kind: Flag { inverted: false },
        setter: plain,
    }

    /// Buffers (16 KiB each) in each loop's io_uring ring of provided buffers: receives
    /// that may read ahead (on connections carrying small frames) are multishot, each
    /// arrival of data landing in one of them (with `DEFER_TASKRUN` of `uring_flags`, Linux
    /// 6.1); rounded down to a power of two. 0 makes every receive one-shot.
    uring_recv_bufs: u32 [] {
        env: [ENV_URING_RECV_BUFS = "STARWIRE_URING_RECV_BUFS"],
        default: [DEFAULT_URING_RECV_BUFS = 256],
        kind: Num::new(0, MAX_URING_RECV_BUFS, "buffers"),
        setter: plain,
        consts: {
            /// Largest accepted [`Config::uring_recv_bufs`], the kernel's limit.
            pub const MAX_URING_RECV_BUFS: u32 = 1 << 15;
        }
    }

    /// Multishot receives take bundles where the kernel has them (Linux 6.10): one
    /// completion fills as many buffers of the ring as the data that came needs; false
    /// (the default: measured slower, see `docs/performance.md`, run I7) takes one buffer
    /// per completion.
    uring_recv_bundles: bool [] {
        env: [ENV_URING_RECV_BUNDLES = "STARWIRE_URING_RECV_BUNDLES"],
        default: [DEFAULT_URING_RECV_BUNDLES = false],
        kind: Flag { inverted: false },
        setter: plain,
    }

    /// Multishot receives without bundles consume the ring of buffers incrementally where
    /// the kernel has it (Linux 6.12): the data of successive receives, of any
    /// connections, is packed into one buffer until it is full, instead of a buffer per
    /// receive; false (the default: it did not pay, see `docs/performance.md`, run I8)
    /// takes a buffer per receive.
    uring_recv_incremental: bool [] {
        env: [ENV_URING_RECV_INCREMENTAL = "STARWIRE_URING_RECV_INCREMENTAL"],
        default: [DEFAULT_URING_RECV_INCREMENTAL = false],
        kind: Flag { inverted: false },
        setter: plain,
    }

    /// Tensors larger than this travel as chunks of this many bytes. When only `max_frame`
    /// is lowered below the default plus 64, the default follows it down to the largest
    /// multiple of 4 KiB that fits.
    chunk_size: u32 [] {
        env: [ENV_CHUNK_SIZE = "STARWIRE_CHUNK_SIZE"],
        default: [DEFAULT_CHUNK_SIZE = 4 << 20],
        kind: FitsFrame {
            num: Num::new(MIN_CHUNK_SIZE, Limits::MAX_FRAME - CHUNK_FRAME_OVERHEAD, "bytes"),
            overhead: CHUNK_FRAME_OVERHEAD,
        },
        setter: plain,
        consts: {
            /// Smallest accepted [`Config::chunk_size`], 4 KiB.
            pub const MIN_CHUNK_SIZE: u32 = 4 << 10;
        }
    }

    /// Most bytes of queued frames one write (`sendmsg`) coalesces.
    acc_size: u32 [] {
        env: [ENV_ACC_SIZE = "STARWIRE_ACC_SIZE"],
        default: [DEFAULT_ACC_SIZE = 256 << 10],
        kind: Num::new(MIN_ACC_SIZE, MAX_ACC_SIZE, "bytes"),
        setter: plain,
        consts: {
            /// Smallest accepted [`Config::acc_size`], 4 KiB.
            pub const MIN_ACC_SIZE: u32 = 4 << 10;
            /// Largest accepted [`Config::acc_size`], 64 MiB.
            pub const MAX_ACC_SIZE: u32 = 64 << 20;
        }
    }

    /// Most bytes of send arena (the blocks of 128 KiB that headers, metas and small tensors
    /// are written into before a write) a connection keeps once its output is written,
    /// beyond the two idle blocks it always keeps: within this, it keeps what its recent
    /// output needed at once plus one block, so a connection whose every loop turn fills
    /// several blocks allocates none in steady state; it gives the rest back once its output
    /// has drained 16 to 32 times with less in use. 0 keeps only the two idle blocks.
    send_arena_keep: u64 [] {
        env: [ENV_SEND_ARENA_KEEP = "STARWIRE_SEND_ARENA_KEEP"],
        default: [DEFAULT_SEND_ARENA_KEEP = 1 << 20],
        kind: Num::new(0, MAX_SEND_ARENA_KEEP, "bytes"),
        setter: plain,
        consts: {
            /// Largest accepted [`Config::send_arena_keep`], 1 GiB per connection.
            pub const MAX_SEND_ARENA_KEEP: u64 = 1 << 30;
        }
    }

    /// Bytes of each loop's receive-buffer pool, cut into buffers of `recv_buffer` bytes
    /// that connections keep for their life, registered as io_uring fixed buffers; at least
    /// one receive buffer. Off by default: it measured no faster on loopback, and it locks
    /// memory.
    buf_size: u64 [] {
        env: [ENV_BUF_SIZE = "STARWIRE_BUF_SIZE"],
        default: [DEFAULT_BUF_SIZE = 0],
        kind: ZeroOr {
            some: Num::new(MIN_BUF_SIZE, MAX_BUF_SIZE, "bytes"),
            zero: "no buffer pool",
        },
        setter: plain,
        consts: {
            /// Smallest nonzero [`Config::buf_size`], 4 KiB (one page); it must also hold at
            /// least one receive buffer ([`Config::recv_buffer`]).
            pub const MIN_BUF_SIZE: u64 = 4 << 10;
            /// Largest accepted [`Config::buf_size`], 1 GiB per loop.
            pub const MAX_BUF_SIZE: u64 = 1 << 30;
        }
    }

    /// Fuse the recv requests for one peer found in one drain pass into one frame.
    tensor_fuse: bool [] {
        env: [ENV_TENSOR_FUSE = "STARWIRE_TENSOR_FUSE"],
        default: [DEFAULT_TENSOR_FUSE = false],
        kind: Flag { inverted: false },
        setter: plain,
    }

    /// Answer `STATS` requests (what `commctl stats` sends) with this task's counters and
    /// latencies; when off they are refused with `UNIMPLEMENTED`. A stats request passes
    /// the handshake (cluster id, token) like any other.
    stats_endpoint: bool [] {
        env: [ENV_STATS_ENDPOINT = "STARWIRE_STATS_ENDPOINT"],
        default: [DEFAULT_STATS_ENDPOINT = true],
        kind: Flag { inverted: false },
        setter: plain,
    }

    /// Where this task saves its tables when a peer asks for a checkpoint (a `CHECKPOINT`
    /// request, `commctl checkpoint`): one file per table, written atomically. Unset, a
    /// checkpoint request is refused with `UNIMPLEMENTED`. A checkpoint request passes the
    /// handshake (cluster id, token) like any other; the directory is this task's own
    /// setting, never named by the peer.
    checkpoint_dir: Option<PathBuf> [Option<&Path>] {
        env: [ENV_CHECKPOINT_DIR = "STARWIRE_CHECKPOINT_DIR"],
        default: [None],
        kind: PathSetting { what: "a directory", none: "none: checkpoints refused" },
        setter: into,
    }

    /// How often the runtime's upkeep thread calls each served table's `maintain` (row
    /// eviction, memory given back). The thread runs only while some table is served.
    table_upkeep: Duration [] {
        env: [ENV_TABLE_UPKEEP_MS = "STARWIRE_TABLE_UPKEEP_MS"],
        default: [DEFAULT_TABLE_UPKEEP = Duration::from_secs(1)],
        kind: Time { lo: MIN_TABLE_UPKEEP, hi: MAX_TABLE_UPKEEP, unit: TimeUnit::Millis },
        setter: plain,
        consts: {
            /// Smallest accepted [`Config::table_upkeep`].
            pub const MIN_TABLE_UPKEEP: Duration = Duration::from_millis(10);
            /// Longest accepted [`Config::table_upkeep`].
            pub const MAX_TABLE_UPKEEP: Duration = Duration::from_secs(3600);
        }
    }

    /// Record, per request, when it was submitted, sent, answered and completed, for a
    /// Chrome trace file (`Runtime::write_trace`; `docs/deploying.md` says how to read
    /// it). Each loop keeps the latest `trace_events` requests. Off, it costs one branch
    /// per request.
    trace: bool [] {
        env: [ENV_TRACE = "STARWIRE_TRACE"],
        default: [DEFAULT_TRACE = false],
        kind: Flag { inverted: false },
        setter: plain,
    }

    /// Requests each loop's trace keeps when `trace` is on (64 bytes each, allocated at
    /// start); when full, the oldest is overwritten and counted as dropped.
    trace_events: usize [] {
        env: [ENV_TRACE_EVENTS = "STARWIRE_TRACE_EVENTS"],
        default: [DEFAULT_TRACE_EVENTS = 1 << 18],
        kind: Num::new(1, MAX_TRACE_EVENTS, "records"),
        setter: plain,
        consts: {
            /// Largest accepted [`Config::trace_events`], 2^24 (1 GiB of records a loop).
            pub const MAX_TRACE_EVENTS: usize = 1 << 24;
        }
    }

    /// Initial receive buffer of each connection; it grows up to one frame as needed.
    recv_buffer: usize [] {
        env: [ENV_RECV_BUFFER = "STARWIRE_RECV_BUFFER"],
        default: [DEFAULT_RECV_BUFFER = 64 << 10],
        kind: Num::new(MIN_RECV_BUFFER, MAX_RECV_BUFFER, "bytes"),
        setter: plain,
        consts: {
            /// Smallest accepted [`Config::recv_buffer`], 4 KiB.
            pub const MIN_RECV_BUFFER: usize = 4 << 10;
            /// Largest accepted [`Config::recv_buffer`], 64 MiB.
            pub const MAX_RECV_BUFFER: usize = 64 << 20;
        }
    }

    /// Request contexts per loop: the most requests one loop has in flight at once.
    max_inflight: usize [] {
        env: [ENV_MAX_INFLIGHT = "STARWIRE_MAX_INFLIGHT"],
        default: [DEFAULT_MAX_INFLIGHT = 65_536],
        kind: Num::new(1, MAX_MAX_INFLIGHT, "request contexts"),
        setter: plain,
        consts: {
            /// Largest accepted [`Config::max_inflight`], 2^22.
            pub const MAX_MAX_INFLIGHT: usize = 1 << 22;
        }
    }

    /// Retries of a failed connect before the peer is reported unreachable (0: no retry).
    connect_retries: u32 [] {
        env: [ENV_CONNECT_RETRIES = "STARWIRE_CONNECT_RETRIES"],
        default: [DEFAULT_CONNECT_RETRIES = 8],
        kind: Num::new(0, u32::MAX, "retries"),
        setter: plain,
    }

    /// Delay before the first connect retry; it doubles per retry up to 2 s.
    ///
    /// See [`Config::connect_delay`].
    connect_backoff: Duration [] {
        env: [ENV_CONNECT_BACKOFF_MS = "STARWIRE_CONNECT_BACKOFF_MS"],
        default: [DEFAULT_CONNECT_BACKOFF = Duration::from_millis(10)],
        kind: Time { lo: MIN_CONNECT_BACKOFF, hi: MAX_CONNECT_BACKOFF, unit: TimeUnit::Millis },
        setter: plain,
        consts: {
            /// Smallest accepted [`Config::connect_backoff`].
            pub const MIN_CONNECT_BACKOFF: Duration = Duration::from_millis(1);
            /// Largest accepted [`Config::connect_backoff`].
            pub const MAX_CONNECT_BACKOFF: Duration = Duration::from_secs(60);
        }
    }

    /// TCP connections opened to each peer.
    connections_per_peer: usize [] {
        env: [ENV_CONNECTIONS_PER_PEER = "STARWIRE_CONNECTIONS_PER_PEER"],
        default: [DEFAULT_CONNECTIONS_PER_PEER = 1],
        kind: Num::new(1, MAX_CONNECTIONS_PER_PEER, "connections"),
        setter: plain,
        consts: {
            /// Largest accepted [`Config::connections_per_peer`].
            pub const MAX_CONNECTIONS_PER_PEER: usize = 4096;
        }
    }

    /// Shared secret checked in the handshake (raw bytes); none sends and requires none.
    /// Never shown in logs, errors or `Debug`, only its length.
    cluster_token: Option<Vec<u8>> [Option<&[u8]>] {
        env: [ENV_CLUSTER_TOKEN = "STARWIRE_CLUSTER_TOKEN"],
        default: [None],
        kind: Secret { max: MAX_CLUSTER_TOKEN },
        setter: into,
        consts: {
            /// Longest [`Config::cluster_token`], in bytes (the wire format's limit).
            pub const MAX_CLUSTER_TOKEN: usize = wire::MAX_TOKEN;
        }
    }

    /// The optional wire features this task announces in its handshake; a connection uses
    /// those both ends announce. `row_formats`: rows pulled and pushed in another float
    /// format than their table's (f32, bf16, f16), and loss scales on rows pushes.
    /// `row_versions`: rows pulls that name the versions the worker holds, answered with
    /// the rows' versions and only the rows that changed. `none`
    /// announces nothing, as a task of an earlier release does; such a server refuses a
    /// handshake that announces features, and a worker then connects again announcing
    /// none (`none` spares it the refused handshake).
    ///
    /// See `docs/wire-format.md` (4.1) for how peers of an earlier release are served.
    wire_features: WireFeatures [] {
        env: [ENV_WIRE_FEATURES = "STARWIRE_WIRE_FEATURES"],
        default: [DEFAULT_WIRE_FEATURES = WireFeatures::ALL],
        kind: FeaturesSetting,
        setter: plain,
    }

    /// Time from connect (or accept) to a finished handshake.
    handshake_timeout: Duration [] {
        env: [ENV_HANDSHAKE_TIMEOUT_MS = "STARWIRE_HANDSHAKE_TIMEOUT_MS"],
        default: [DEFAULT_HANDSHAKE_TIMEOUT = Duration::from_secs(5)],
        kind: Time { lo: MIN_HANDSHAKE_TIMEOUT, hi: MAX_HANDSHAKE_TIMEOUT, unit: TimeUnit::Millis },
        setter: plain,
        consts: {
            /// Smallest accepted [`Config::handshake_timeout`].
            pub const MIN_HANDSHAKE_TIMEOUT: Duration = Duration::from_millis(1);
            /// Largest accepted [`Config::handshake_timeout`], 10 minutes.
            pub const MAX_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(600);
        }
    }

    /// Time a frame's header and meta section may take once its first byte arrived; a peer
    /// that stalls or trickles inside them is disconnected. Payload bytes are not timed.
    frame_timeout: Duration [] {
        env: [ENV_FRAME_TIMEOUT_MS = "STARWIRE_FRAME_TIMEOUT_MS"],
        default: [DEFAULT_FRAME_TIMEOUT = Duration::from_secs(30)],
        kind: Time { lo: MIN_FRAME_TIMEOUT, hi: MAX_FRAME_TIMEOUT, unit: TimeUnit::Millis },
        setter: plain,
        consts: {
            /// Smallest accepted [`Config::frame_timeout`].
            pub const MIN_FRAME_TIMEOUT: Duration = Duration::from_millis(1);
            /// Largest accepted [`Config::frame_timeout`], 1 hour.
            pub const MAX_FRAME_TIMEOUT: Duration = Duration::from_secs(3600);
        }
    }

    /// Time a frame in progress, or a chunked tensor announced and not complete, may go
    /// without progress: fewer than 4 KiB arriving in this time while such bytes are owed
    /// closes the connection (silent or trickling senders).
    progress_timeout: Duration [] {
        env: [ENV_PROGRESS_TIMEOUT_MS = "STARWIRE_PROGRESS_TIMEOUT_MS"],
        default: [DEFAULT_PROGRESS_TIMEOUT = Duration::from_secs(30)],
        kind: Time { lo: MIN_PROGRESS_TIMEOUT, hi: MAX_PROGRESS_TIMEOUT, unit: TimeUnit::Millis },
        setter: plain,
        consts: {
            /// Smallest accepted [`Config::progress_timeout`].
            pub const MIN_PROGRESS_TIMEOUT: Duration = Duration::from_millis(1);
            /// Largest accepted [`Config::progress_timeout`], 1 hour.
            pub const MAX_PROGRESS_TIMEOUT: Duration = Duration::from_secs(3600);
        }
    }

    /// An open connection that has received nothing for this long is probed with a PING
    /// (again every interval while it stays silent); 0 turns heartbeats off.
    heartbeat_interval: Duration [] {
        env: [ENV_HEARTBEAT_INTERVAL_MS = "STARWIRE_HEARTBEAT_INTERVAL_MS"],
        default: [DEFAULT_HEARTBEAT_INTERVAL = Duration::from_secs(5)],
        kind: Time { lo: Duration::ZERO, hi: MAX_HEARTBEAT, unit: TimeUnit::Millis },
        setter: plain,
        consts: {
            /// Largest accepted [`Config::heartbeat_interval`] and
            /// [`Config::heartbeat_timeout`], 1 hour.
            pub const MAX_HEARTBEAT: Duration = Duration::from_secs(3600);
        }
    }

    /// An open connection that has received nothing (no answer to its heartbeats either)
    /// for this long is declared lost: its requests fail, and the next request reconnects.
    /// Keep it several heartbeat intervals long.
    heartbeat_timeout: Duration [] {
        env: [ENV_HEARTBEAT_TIMEOUT_MS = "STARWIRE_HEARTBEAT_TIMEOUT_MS"],
        default: [DEFAULT_HEARTBEAT_TIMEOUT = Duration::from_secs(30)],
        kind: Time { lo: MIN_HEARTBEAT_TIMEOUT, hi: MAX_HEARTBEAT, unit: TimeUnit::Millis },
        setter: plain,
        consts: {
            /// Smallest accepted [`Config::heartbeat_timeout`].
            pub const MIN_HEARTBEAT_TIMEOUT: Duration = Duration::from_millis(1);
        }
    }

    /// Bytes of chunked tensors being received, over all connections of the task, that may
    /// be reserved at once; a tensor that would go over fails alone with
    /// `RESOURCE_EXHAUSTED`. `None` computes a quarter of the machine's memory (or of the
    /// container's memory limit, when lower).
    ///
    /// See [`Config::recv_budget_bytes`].
    recv_budget: Option<u64> [] {
        env: [ENV_RECV_BUDGET = "STARWIRE_RECV_BUDGET"],
        default: [None],
        kind: Opt {
            some: Num::new(MIN_RECV_BUDGET, u64::MAX, "bytes"),
            none: "computed: a quarter of physical memory or of the cgroup limit",
        },
        setter: into,
        consts: {
            /// Smallest accepted [`Config::recv_budget`] and [`Config::conn_recv_budget`].
            pub const MIN_RECV_BUDGET: u64 = 1 << 20;
        }
    }

    /// The part of the receive budget one connection may hold; `None` is half of the
    /// task's budget, so one peer can never take all of it.
    ///
    /// See [`Config::conn_recv_budget_bytes`].
    conn_recv_budget: Option<u64> [] {
        env: [ENV_CONN_RECV_BUDGET = "STARWIRE_CONN_RECV_BUDGET"],
        default: [None],
        kind: Opt {
            some: Num::new(MIN_RECV_BUDGET, u64::MAX, "bytes"),
            none: "computed: half of the task's receive budget",
        },
        setter: into,
    }

    /// Bytes of answers a connection this task accepted may have queued and not written
    /// (its peer not reading them) before the task stops reading that connection: the peer
    /// is then held back by TCP flow control, not by the task's memory. Reading resumes
    /// once the queue drains below it. Answers larger than a frame (rows blocks, stats
    /// documents) are also charged to the connection's part of the receive budget before
    /// they are produced.
    answer_backlog: u64 [] {
        env: [ENV_ANSWER_BACKLOG = "STARWIRE_ANSWER_BACKLOG"],
        default: [DEFAULT_ANSWER_BACKLOG = 16 << 20],
        kind: Num::new(MIN_ANSWER_BACKLOG, u64::MAX, "bytes"),
        setter: plain,
        consts: {
            /// Smallest accepted [`Config::answer_backlog`].
            pub const MIN_ANSWER_BACKLOG: u64 = 64 << 10;
        }
    }

    /// Most accepted connections open at once, over all loops; more are closed as soon as
    /// they are accepted. Connections the task opens are not counted.
    max_connections: usize [] {
        env: [ENV_MAX_CONNECTIONS = "STARWIRE_MAX_CONNECTIONS"],
        default: [DEFAULT_MAX_CONNECTIONS = 4096],
        kind: Num::new(1, MAX_MAX_CONNECTIONS, "connections"),
        setter: plain,
        consts: {
            /// Largest accepted [`Config::max_connections`].
            pub const MAX_MAX_CONNECTIONS: usize = 1 << 20;
        }
    }

    /// Requests a peer may have waiting on one connection (recvs for unpublished keys,
    /// pushes still arriving); more are refused with `RESOURCE_EXHAUSTED`.
    max_served: usize [] {
        env: [ENV_MAX_SERVED = "STARWIRE_MAX_SERVED"],
        default: [DEFAULT_MAX_SERVED = 4096],
        kind: Num::new(1, MAX_MAX_SERVED, "requests"),
        setter: plain,
        consts: {
            /// Largest accepted [`Config::max_served`].
            pub const MAX_MAX_SERVED: usize = 1 << 20;
        }
    }

    /// How long a connection closing for an error may take to send its last frame.
    close_linger: Duration [] {
        env: [ENV_CLOSE_LINGER_MS = "STARWIRE_CLOSE_LINGER_MS"],
        default: [DEFAULT_CLOSE_LINGER = Duration::from_secs(1)],
        kind: Time { lo: MIN_CLOSE_LINGER, hi: MAX_CLOSE_LINGER, unit: TimeUnit::Millis },
        setter: plain,
        consts: {
            /// Smallest accepted [`Config::close_linger`].
            pub const MIN_CLOSE_LINGER: Duration = Duration::from_millis(1);
            /// Largest accepted [`Config::close_linger`].
            pub const MAX_CLOSE_LINGER: Duration = Duration::from_secs(60);
        }
    }

    /// Tensor payload of at least this many bytes is received straight into the tensor's
    /// memory; shorter payload is copied once out of the receive buffer. Do not lower it
    /// below the default: in place measured slower for 4 KiB tensors.
    zero_copy_min: u64 [] {
        env: [ENV_ZERO_COPY_MIN = "STARWIRE_ZERO_COPY_MIN"],
        default: [DEFAULT_ZERO_COPY_MIN = 16 << 10],
        kind: Num::new(0, u64::MAX, "bytes"),
        setter: plain,
    }

    /// Threads that run a service's pull and push handlers and its tables' rows pulls and
    /// pushes; 0 runs them inline on the loop that received the request.
    handler_threads: usize [] {
        env: [ENV_HANDLER_THREADS = "STARWIRE_HANDLER_THREADS"],
        default: [DEFAULT_HANDLER_THREADS = 0],
        kind: Num::new(0, MAX_HANDLER_THREADS, "threads"),
        setter: plain,
        consts: {
            /// Largest accepted [`Config::handler_threads`].
            pub const MAX_HANDLER_THREADS: usize = 1024;
        }
    }
}

/// Longest job name, in bytes (the wire format's limit).
pub const MAX_JOB_LEN: usize = wire::MAX_JOB_NAME;

/// Cap of the computed loop count: `min(16, connections)`, the GRPC++ rule.
pub const DEFAULT_LOOP_CAP: usize = 16;

/// Room kept in a frame beside a chunk's bytes: the 32-byte header and the 16-byte chunk
/// body, rounded up. [`Config::chunk_size`] is at most `max_frame - CHUNK_FRAME_OVERHEAD`.
pub const CHUNK_FRAME_OVERHEAD: u32 = 64;
const _: () = assert!(wire::HEADER_LEN as u32 + 16 <= CHUNK_FRAME_OVERHEAD);

/// The doubling connect backoff stops growing here (see [`Config::connect_delay`]).
pub const CONNECT_BACKOFF_CAP: Duration = Duration::from_secs(2);

/// Environment variable: [`Limits::max_frame`].
pub const ENV_MAX_FRAME: &str = "STARWIRE_MAX_FRAME";
/// Environment variable: [`Limits::max_key`].
pub const ENV_MAX_KEY: &str = "STARWIRE_MAX_KEY";
/// Environment variable: [`Limits::max_tensors`].
pub const ENV_MAX_TENSORS: &str = "STARWIRE_MAX_TENSORS";
/// Environment variable: [`Limits::max_rank`].
pub const ENV_MAX_RANK: &str = "STARWIRE_MAX_RANK";
/// Environment variable: [`Limits::max_tensor_bytes`].
pub const ENV_MAX_TENSOR_BYTES: &str = "STARWIRE_MAX_TENSOR_BYTES";
/// Environment variable: [`Limits::max_tables`].
pub const ENV_MAX_TABLES: &str = "STARWIRE_MAX_TABLES";
/// Environment variable: [`Limits::max_rows`].
pub const ENV_MAX_ROWS: &str = "STARWIRE_MAX_ROWS";
/// Environment variable: [`Limits::max_row_bytes`].
pub const ENV_MAX_ROW_BYTES: &str = "STARWIRE_MAX_ROW_BYTES";

/// One field of [`Limits`]: its variable, allowed range (those of [`Limits::validate`] and
/// the wire format's section 6) and doc. All of them are set at once with
/// [`ConfigBuilder::limits`]; their defaults are [`Limits::default`].
pub(crate) struct LimitField {
    pub(crate) field: &'static str,
    pub(crate) env: &'static str,
    pub(crate) lo: u64,
    pub(crate) hi: u64,
    pub(crate) unit: &'static str,
    pub(crate) doc: &'static str,
    pub(crate) get: fn(&Limits) -> u64,
    /// Sets the field to a value within its range (so it fits the field's type).
    pub(crate) set: fn(&mut Limits, u64),
}

pub(crate) const LIMIT_FIELDS: [LimitField; 8] = [
    LimitField {
        field: "max_frame",
        env: ENV_MAX_FRAME,
        lo: Limits::MIN_FRAME as u64,
        hi: Limits::MAX_FRAME as u64,
        unit: "bytes",
        doc: "Largest frame accepted (and announced to peers).",
        get: |l| u64::from(l.max_frame),
        set: |l, v| l.max_frame = v.try_into().unwrap_or(u32::MAX),
    },
    LimitField {
        field: "max_key",
        env: ENV_MAX_KEY,
        lo: 1,
        hi: u16::MAX as u64,
        unit: "bytes",
        doc: "Longest rendezvous key.",
        get: |l| u64::from(l.max_key),
        set: |l, v| l.max_key = v.try_into().unwrap_or(u16::MAX),
    },
    LimitField {
        field: "max_tensors",
        env: ENV_MAX_TENSORS,
        lo: 1,
        hi: Limits::MAX_TENSORS as u64,
        unit: "tensors",
        doc: "Most tensors in one fused recv, pull, push or response.",
        get: |l| u64::from(l.max_tensors),
        set: |l, v| l.max_tensors = v.try_into().unwrap_or(u32::MAX),
    },
    LimitField {
        field: "max_rank",
        env: ENV_MAX_RANK,
        lo: 0,
        hi: wire::MAX_RANK as u64,
        unit: "dimensions",
        doc: "Highest tensor rank.",
        get: |l| u64::from(l.max_rank),
        set: |l, v| l.max_rank = v.try_into().unwrap_or(u8::MAX),
    },
    LimitField {
        field: "max_tensor_bytes",
        env: ENV_MAX_TENSOR_BYTES,
        lo: 0,
        hi: i64::MAX as u64,
        unit: "bytes",
        doc: "Largest tensor.",
        get: |l| l.max_tensor_bytes,
        set: |l, v| l.max_tensor_bytes = v,
    },
    LimitField {
        field: "max_tables",
        env: ENV_MAX_TABLES,
        lo: 1,
        hi: Limits::MAX_TABLES as u64,
        unit: "tables",
        doc: "Most tables in one rows pull or push.",
        get: |l| u64::from(l.max_tables),
        set: |l, v| l.max_tables = v.try_into().unwrap_or(u32::MAX),
    },
    LimitField {
        field: "max_rows",
        env: ENV_MAX_ROWS,
        lo: 1,
        hi: Limits::MAX_ROWS as u64,
        unit: "rows",
        doc: "Most row ids in one frame (all its tables), and most missing rows in one answer.",
        get: |l| u64::from(l.max_rows),
        set: |l, v| l.max_rows = v.try_into().unwrap_or(u32::MAX),
    },
    LimitField {
        field: "max_row_bytes",
        env: ENV_MAX_ROW_BYTES,
        lo: 1,
        hi: Limits::MAX_ROW_BYTES as u64,
        unit: "bytes",
        doc: "Largest embedding row.",
        get: |l| u64::from(l.max_row_bytes),
        set: |l, v| l.max_row_bytes = v.try_into().unwrap_or(u32::MAX),
    },
];

/// Which of the originals' two variable families a task reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// The jobs `worker` and `chief`: `WORKER_*` and `NETWORK_WORKER_*`.
    Worker,
    /// Every other job (`ps`, `evaluator`, ...): `PS_*` and `NETWORK_PS_*`.
    Ps,
}

impl Role {
    /// The role of a job name: `worker` and `chief` (exactly, case-sensitive, as in the
    /// originals) are workers, everything else reads the PS variables.
    pub fn of_job(job: &str) -> Role {
        match job {
            "worker" | "chief" => Role::Worker,
            _ => Role::Ps,
        }
    }

    /// `WORKER` or `PS`.
    pub const fn prefix(self) -> &'static str {
        match self {
            Role::Worker => "WORKER",
            Role::Ps => "PS",
        }
    }

    /// `WORKER_ENABLE_POLLING` or `PS_ENABLE_POLLING`.
    pub const fn polling_env(self) -> &'static str {
        POLLING_ENV.of(self)
    }

    /// `NETWORK_WORKER_CORE_NUMBER` or `NETWORK_PS_CORE_NUMBER`.
    pub const fn loops_env(self) -> &'static str {
        LOOPS_ENV.of(self)
    }

    /// `WORKER_DISABLE_PIN_CORES` or `PS_DISABLE_PIN_CORES` (true means *not* pinned).
    pub const fn disable_pin_env(self) -> &'static str {
        DISABLE_PIN_ENV.of(self)
    }
}

/// The environment variable of a setting: one name, or one per [`Role`].
#[derive(Clone, Copy, Debug)]
pub(crate) enum EnvName {
    One(&'static str),
    ByRole {
        worker: &'static str,
        ps: &'static str,
    },
}

impl EnvName {
    /// The name a task of `role` reads.
    pub(crate) const fn of(self, role: Role) -> &'static str {
        match (self, role) {
            (EnvName::One(name), _) => name,
            (EnvName::ByRole { worker, .. }, Role::Worker) => worker,
            (EnvName::ByRole { ps, .. }, Role::Ps) => ps,
        }
    }
}

/// One setting as the docs table shows it.
pub(crate) struct Row {
    pub(crate) env: EnvName,
    /// The builder method, `.name(Type)`.
    pub(crate) method: String,
    pub(crate) default: String,
    pub(crate) range: String,
    /// The rustdoc lines; the first paragraph is the effect.
    pub(crate) doc: &'static [&'static str],
}

/// What an accessor returns for a stored value: a copy, or a borrow (the token).
trait Get<'a, Out> {
    fn get(&'a self) -> Out;
}

impl<T: Copy> Get<'_, T> for T {
    fn get(&self) -> T {
        *self
    }
}

impl<'a> Get<'a, Option<&'a Path>> for Option<PathBuf> {
    fn get(&'a self) -> Option<&'a Path> {
        self.as_deref()
    }
}

impl<'a> Get<'a, Option<&'a [u8]>> for Option<Vec<u8>> {
    fn get(&'a self) -> Option<&'a [u8]> {
        self.as_deref()
    }
}
