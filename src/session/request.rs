//! What a request is, as the loop receives it from a submitter: the operation and its
//! arguments, who submitted it, and (for rows) the tables it names. Data only.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use crate::stats::RequestKind;
use crate::tensor::{SharedAllocator, Tensor};
use crate::wire::Limits;

use super::reply::Spare;
use super::spec::RowsSpec;

/// What a request asks for.
pub(crate) enum RequestOp {
    /// A ping with this many payload bytes.
    Ping { payload: u32 },
    /// Values of variables; received tensors get memory from `alloc` (or the runtime's).
    Pull {
        ids: Vec<u64>,
        alloc: Option<SharedAllocator>,
    },
    /// Tensors for variables.
    Push { items: Vec<(u64, Arc<Tensor>)> },
    /// Rendezvous keys of a step (one key: `RECV`; more: `FUSED_RECV`).
    Recv { step: u64, keys: Vec<Vec<u8>> },
    /// Rows of tables, all tables' ids in one vector in table order; blocks get memory from
    /// `alloc` (or the runtime's). `held`: empty, or the version of each id the submitter
    /// holds (0: none), in the order of `ids`: the answer then carries the rows' versions
    /// and leaves out the rows whose version is the one held (`ROW_VERSIONS`).
    PullRows {
        tables: Vec<RowsSpec>,
        ids: Vec<u64>,
        alloc: Option<SharedAllocator>,
        held: Vec<u64>,
    },
    /// Gradient rows of tables: ids as for a pull; the blocks either one after the other
    /// in `grads` (copied), or, when `shared` is not empty, one shared tensor per table
    /// (`(position of the table, block)`, in table order; `grads` empty), sent from its
    /// own memory.
    PushRows {
        tables: Vec<RowsSpec>,
        ids: Vec<u64>,
        grads: Vec<u8>,
        shared: Vec<(u64, Arc<Tensor>)>,
    },
    /// The peer's counters and latencies: a JSON document (`docs/wire-format.md` 4.11).
    Stats,
    /// The peer saves its tables to its checkpoint directory; answered with the
    /// checkpoint's manifest, a JSON document (`docs/wire-format.md` 4.12).
    Checkpoint,
}

impl RequestOp {
    pub(crate) fn kind(&self) -> RequestKind {
        match self {
            RequestOp::Ping { .. } => RequestKind::Ping,
            RequestOp::Pull { .. } => RequestKind::Pull,
            RequestOp::Push { .. } => RequestKind::Push,
            RequestOp::Recv { keys, .. } if keys.len() == 1 => RequestKind::Recv,
            RequestOp::Recv { .. } => RequestKind::FusedRecv,
            RequestOp::PullRows { .. } => RequestKind::PullRows,
            RequestOp::PushRows { .. } => RequestKind::PushRows,
            RequestOp::Stats => RequestKind::Stats,
            RequestOp::Checkpoint => RequestKind::Checkpoint,
        }
    }

    /// Tensors (or keys, or ids) and rows the request carries.
    #[inline]
    pub(crate) fn items(&self) -> (u64, u64) {
        match self {
            RequestOp::Ping { .. } | RequestOp::Stats | RequestOp::Checkpoint => (0, 0),
            RequestOp::Pull { ids, .. } => (ids.len() as u64, 0),
            RequestOp::Push { items } => (items.len() as u64, 0),
            RequestOp::Recv { keys, .. } => (keys.len() as u64, 0),
            RequestOp::PullRows { tables, .. } | RequestOp::PushRows { tables, .. } => (
                tables.len() as u64,
                tables.iter().map(|t| t.len() as u64).sum(),
            ),
        }
    }

    /// Bytes of tensors too large for one frame of `chunk_limit` bytes, which travel in
    /// `CHUNK` frames queued later (the request's own frame is measured as it is queued).
    #[inline]
    pub(crate) fn chunked_bytes(&self, chunk_limit: u64) -> u64 {
        let big = |n: u64| if n > chunk_limit { n } else { 0 };
        match self {
            RequestOp::Push { items } => items.iter().map(|(_, t)| big(t.byte_len() as u64)).sum(),
            RequestOp::PushRows { tables, .. } => {
                tables.iter().map(|t| big(t.meta().byte_len)).sum()
            }
            _ => 0,
        }
    }

    /// Why the request would exceed a limit the peer announced (and so close the
    /// connection, failing every other request on it), or `None` when it fits.
    pub(crate) fn over_limits(&self, l: &Limits) -> Option<String> {
        let over = |what: &str, n: u64, max: u64| {
            (n > max).then(|| format!("{what} {n} over the peer's limit {max}"))
        };
        let tensor = |t: &Tensor| {
            over("tensor rank", t.dims().len() as u64, l.max_rank as u64)
                .or_else(|| over("tensor bytes", t.byte_len() as u64, l.max_tensor_bytes))
        };
        match self {
            RequestOp::Ping { .. } | RequestOp::Stats | RequestOp::Checkpoint => None,
            RequestOp::Pull { ids, .. } => over("ids", ids.len() as u64, l.max_tensors as u64),
            RequestOp::Push { items } => over("tensors", items.len() as u64, l.max_tensors as u64)
                .or_else(|| items.iter().find_map(|(_, t)| tensor(t))),
            RequestOp::Recv { keys, .. } => over("keys", keys.len() as u64, l.max_tensors as u64)
                .or_else(|| {
                    let longest = keys.iter().map(Vec::len).max().unwrap_or(0);
                    over("key bytes", longest as u64, l.max_key as u64)
                }),
            RequestOp::PullRows { tables, .. } | RequestOp::PushRows { tables, .. } => {
                let rows: u64 = tables.iter().map(|t| t.len() as u64).sum();
                over("tables", tables.len() as u64, l.max_tables as u64)
                    .or_else(|| over("rows", rows, l.max_rows as u64))
                    .or_else(|| {
                        tables.iter().find_map(|t| {
                            let meta = t.meta();
                            over("block rank", t.dims.len() as u64, l.max_rank as u64)
                                .or_else(|| {
                                    let row = meta.byte_len / t.len() as u64;
                                    over("row bytes", row, l.max_row_bytes as u64)
                                })
                                .or_else(|| over("block bytes", meta.byte_len, l.max_tensor_bytes))
                        })
                    })
            }
        }
    }

    /// For a peer without `ROW_FORMATS`: every table of a rows request travels in its
    /// rows' own dtype, without a loss scale. Whether any table changed.
    pub(crate) fn fall_back(&mut self) -> bool {
        let tables = match self {
            RequestOp::PullRows { tables, .. } | RequestOp::PushRows { tables, .. } => tables,
            _ => return false,
        };
        let mut changed = false;
        for t in tables.iter_mut().filter(|t| t.needs_row_formats()) {
            t.fall_back();
            changed = true;
        }
        changed
    }

    /// For a peer without `ROW_VERSIONS`: a rows pull goes without the versions held.
    /// Whether it carried any.
    pub(crate) fn drop_held(&mut self) -> bool {
        match self {
            RequestOp::PullRows { held, .. } if !held.is_empty() => {
                held.clear();
                true
            }
            _ => false,
        }
    }

    /// Gives the vectors of an encoded request back to `spare`, emptied, for its submitter's
    /// next requests (a rows push's shared blocks are held by the connection until written).
    pub(crate) fn recycle_into(self, spare: &mut Spare) {
        match self {
            RequestOp::Pull { mut ids, .. } => {
                ids.clear();
                spare.ids = ids;
            }
            RequestOp::Push { mut items } => {
                items.clear();
                spare.items = items;
            }
            RequestOp::PullRows {
                mut tables,
                mut ids,
                mut held,
                ..
            } => {
                tables.clear();
                ids.clear();
                held.clear();
                (spare.tables, spare.ids, spare.held) = (tables, ids, held);
            }
            RequestOp::PushRows {
                mut tables,
                mut ids,
                mut grads,
                mut shared,
            } => {
                tables.clear();
                ids.clear();
                grads.clear();
                shared.clear();
                (spare.tables, spare.ids, spare.grads) = (tables, ids, grads);
                spare.items = shared;
            }
            RequestOp::Ping { .. }
            | RequestOp::Recv { .. }
            | RequestOp::Stats
            | RequestOp::Checkpoint => {}
        }
    }
}

/// A request travelling from a handle to the loop that owns the peer's connection.
pub(crate) struct Request {
    pub op: RequestOp,
    pub peer: SocketAddr,
    /// The peer's task name, when the submitter knew it (a named [`Peer`](crate::Peer)):
    /// its metrics and errors use it until a handshake names the peer.
    pub task: Option<&'static str>,
    /// Which of the peer's connections (0..connections_per_peer) carries it.
    pub lane: u32,
    pub deadline: Option<Instant>,
    /// The submitter's name for the request, echoed in its completion.
    pub tag: u64,
    /// Vectors for the answer, returned with the completion.
    pub spare: Spare,
    /// Its submit time and sharded step, for the trace.
    pub trace: Stamp,
}

/// What a request brings from its submitter for the trace.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Stamp {
    /// When the trainer thread submitted it (only read when tracing).
    pub submitted: Option<Instant>,
    /// The sharded step it is a part of; 0: none.
    pub step: u64,
}

/// Who gets a completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Submitter {
    /// A handle: its number in the outbox's table, and the generation of that entry
    /// (entries are reused once a handle is gone; a completion owed to the old handle is
    /// dropped).
    Handle(u32, u32),
    /// The embedding thread (embedded mode).
    Local,
}

/// One of the recvs the session fused into a request; each keeps its own deadline.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FusedMember {
    pub submitter: Submitter,
    pub tag: u64,
    pub deadline: Option<Instant>,
    /// Already completed (its deadline passed, or its tensor arrived).
    pub done: bool,
    /// Its deadline passed and a `CANCEL` of its item was sent: its answer (the tensor, if
    /// it was on its way, or `CANCELLED`) is awaited.
    pub cancel_sent: bool,
}
