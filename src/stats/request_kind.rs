//! The kinds of request, for per-kind counters and metrics.

/// Kinds of request, for per-kind counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RequestKind {
    /// `PING`.
    Ping = 0,
    /// `RECV`.
    Recv = 1,
    /// `FUSED_RECV`.
    FusedRecv = 2,
    /// `PULL`.
    Pull = 3,
    /// `PUSH`.
    Push = 4,
    /// `PULL_ROWS`.
    PullRows = 5,
    /// `PUSH_ROWS`.
    PushRows = 6,
    /// `STATS`: a task's counters, asked by `commctl stats`.
    Stats = 7,
    /// `CHECKPOINT`: a task's tables saved, asked by `commctl checkpoint`.
    Checkpoint = 8,
}

/// Number of [`RequestKind`]s.
pub const REQUEST_KINDS: usize = 9;

impl RequestKind {
    /// Every request kind, in order.
    pub const ALL: [RequestKind; REQUEST_KINDS] = [
        RequestKind::Ping,
        RequestKind::Recv,
        RequestKind::FusedRecv,
        RequestKind::Pull,
        RequestKind::Push,
        RequestKind::PullRows,
        RequestKind::PushRows,
        RequestKind::Stats,
        RequestKind::Checkpoint,
    ];

    /// The label used in the JSON document and by `commctl stats` (`"pull_rows"`, ...).
    pub fn name(self) -> &'static str {
        match self {
            RequestKind::Ping => "ping",
            RequestKind::Recv => "recv",
            RequestKind::FusedRecv => "fused_recv",
            RequestKind::Pull => "pull",
            RequestKind::Push => "push",
            RequestKind::PullRows => "pull_rows",
            RequestKind::PushRows => "push_rows",
            RequestKind::Stats => "stats",
            RequestKind::Checkpoint => "checkpoint",
        }
    }
}
