//! What bench sends and what the answers moved: the operations, the next request's ids,
//! keys and rows, and the tally of each answer.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use starwire::rows::Rows;
use starwire::{DType, Status};
use starwire::{Error, ErrorKind, Handle, Reply, Tensor};

use super::ids::Ids;
use super::versions::{changed_rows, Versions};
use crate::cli::BenchArgs;
use crate::exit::Failure;
use crate::serve::recv_key;

/// The operations bench can drive.
pub(super) const OPERATIONS: &[&str] = &[
    "ping",
    "pull",
    "push",
    "recv",
    "fused-recv",
    "pull-rows",
    "push-rows",
];

/// An operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Op {
    Ping,
    Pull,
    Push,
    Recv,
    FusedRecv,
    PullRows,
    PushRows,
}

impl Op {
    pub(super) fn parse(text: &str) -> Option<Op> {
        Some(match text {
            "ping" => Op::Ping,
            "pull" => Op::Pull,
            "push" => Op::Push,
            "recv" => Op::Recv,
            "fused-recv" | "fused_recv" => Op::FusedRecv,
            "pull-rows" | "pull_rows" => Op::PullRows,
            "push-rows" | "push_rows" => Op::PushRows,
            _ => return None,
        })
    }

    /// Whether it moves rows of a table.
    pub(super) fn rows(self) -> bool {
        matches!(self, Op::PullRows | Op::PushRows)
    }

    /// Tensors in each request.
    pub(super) fn per_request(self, args: &BenchArgs) -> usize {
        match self {
            Op::Ping => 0,
            Op::Recv => 1,
            _ => args.tensors,
        }
    }
}

/// What bench sends: the next request's ids or keys, and the tensor it pushes.
pub(super) struct Load {
    op: Op,
    addr: SocketAddr,
    ping_size: u32,
    per_request: usize,
    variables: u64,
    next: u64,
    push: Option<Arc<Tensor>>,
    /// Rows requests: the table, the shape of a row, how ids are drawn and how many so far.
    table: u32,
    row_dims: [u64; 1],
    ids: Ids,
    drawn: u64,
    /// The next rows request's ids, and a push's gradient rows (the same every request,
    /// sent from this tensor's memory by every request in flight).
    row_ids: Vec<u64>,
    grads: Arc<Tensor>,
    /// What rows travel as (`--wire`).
    wire: DType,
    /// `--versioned` pulls: the versions held, and the pushes that change rows.
    versions: Option<Versions>,
}

/// What one answer moved: tensors or rows, their bytes, the rows the server did not have,
/// and the first failure in it.
#[derive(Debug, Default)]
pub(super) struct Tally {
    pub items: u64,
    pub bytes: u64,
    pub missing: u64,
    /// Rows that came unchanged (`--versioned`): not sent.
    pub unchanged: u64,
    pub failure: Option<Error>,
}

impl Load {
    pub(super) fn new(
        op: Op,
        addr: SocketAddr,
        args: &BenchArgs,
        dim: usize,
        ids: Ids,
    ) -> Result<Load, Failure> {
        let push = match op {
            Op::Push => {
                let size = args.tensor_size;
                let t = Tensor::from_bytes(DType::U8, &[size], vec![1u8; size as usize])
                    .map_err(|e| Failure::usage(format!("--tensor-size {size}: {e}")))?;
                Some(Arc::new(t))
            }
            _ => None,
        };
        let per_request = op.per_request(args);
        // Small gradients, so that rows stay small however long the run.
        let grads: Vec<u8> = match op {
            Op::PushRows => (0..per_request * dim)
                .flat_map(|i| (1e-3 * ((i % 7) as f32 - 3.0)).to_le_bytes())
                .collect(),
            _ => Vec::new(),
        };
        let grads = Arc::new(
            Tensor::from_bytes(DType::U8, &[grads.len() as u64], grads)
                .map_err(|e| Failure::usage(format!("gradients: {e}")))?,
        );
        let versions = match (op, args.versioned) {
            (Op::PullRows, true) => {
                let changed = changed_rows(args.changed.unwrap_or(0.0), per_request);
                let v = Versions::new(ids.rows(), per_request, dim, changed, args.inflight)?;
                Some(v)
            }
            _ => None,
        };
        Ok(Load {
            versions,
            op,
            addr,
            ping_size: args.size,
            per_request,
            variables: args.variables,
            next: 0,
            push,
            table: args.table,
            row_dims: [dim as u64],
            ids,
            drawn: 0,
            row_ids: Vec::with_capacity(if op.rows() { per_request } else { 0 }),
            grads,
            wire: args.wire.dtype(),
        })
    }

    /// Bytes of one row as it travels.
    fn row_bytes(&self) -> u64 {
        self.row_dims[0] * self.wire.size().unwrap_or(4)
    }

    /// Draws the next rows request's ids into `row_ids`.
    fn draw_rows(&mut self) {
        self.row_ids.clear();
        for _ in 0..self.per_request {
            self.row_ids.push(self.ids.id(self.drawn));
            self.drawn += 1;
        }
    }

    /// The ids of the next request.
    fn ids(&mut self) -> Vec<u64> {
        let ids = (0..self.per_request as u64)
            .map(|j| (self.next + j) % self.variables)
            .collect();
        self.next = (self.next + self.per_request as u64) % self.variables;
        ids
    }

    /// Submits the next request.
    pub(super) fn submit(&mut self, h: &mut Handle, deadline: Instant) -> Result<u64, Error> {
        let deadline = Some(deadline);
        match self.op {
            Op::Ping => h.ping(self.addr, self.ping_size, deadline).map(|t| t.tag()),
            Op::Pull => {
                let ids = self.ids();
                h.pull(self.addr, ids, deadline).map(|t| t.tag())
            }
            Op::Push => {
                let t = self
                    .push
                    .clone()
                    .unwrap_or_else(|| Arc::new(Tensor::dead(DType::U8)));
                let items = self.ids().into_iter().map(|i| (i, t.clone())).collect();
                h.push(self.addr, items, deadline).map(|t| t.tag())
            }
            Op::Recv => {
                let key = recv_key(self.ids()[0]);
                h.recv(self.addr, 0, &key, deadline).map(|t| t.tag())
            }
            Op::FusedRecv => {
                let keys = self.ids().into_iter().map(recv_key).collect();
                h.recv_many(self.addr, 0, keys, deadline).map(|t| t.tag())
            }
            Op::PullRows => {
                let first = self.drawn;
                self.draw_rows();
                let rows = Rows::new(self.table, DType::F32, &self.row_dims, &self.row_ids);
                let rows = rows.travel_as(self.wire);
                let Some(v) = &mut self.versions else {
                    return h.pull_rows(self.addr, &[rows], deadline).map(|t| t.tag());
                };
                if v.changed_rows > 0 {
                    // The rows to come back changed: pushed to first, on the same connection.
                    let ids = &self.row_ids[..v.changed_rows];
                    let pushed = Rows::new(self.table, DType::F32, &self.row_dims, ids);
                    let pushed = [(pushed.travel_as(self.wire), v.grads.clone())];
                    let tag = h.push_rows_shared(self.addr, &pushed, deadline)?.tag();
                    v.pushed(tag);
                }
                let held = v.held_of(&self.row_ids);
                let tag = h
                    .pull_rows_versioned(self.addr, &[rows], held, deadline)?
                    .tag();
                v.pulled(tag, first);
                Ok(tag)
            }
            Op::PushRows => {
                self.draw_rows();
                let rows = Rows::new(self.table, DType::F32, &self.row_dims, &self.row_ids);
                let rows = rows.travel_as(self.wire);
                h.push_rows_shared(self.addr, &[(rows, self.grads.clone())], deadline)
                    .map(|t| t.tag())
            }
        }
    }

    /// `--versioned`: pulls every row of the table once, holding the versions they come
    /// with, before the clock starts. Returns how many rows have a version (0: the target
    /// keeps or speaks no versions, and every row will be sent).
    pub(super) fn learn_versions(
        &mut self,
        h: &mut Handle,
        timeout: Duration,
    ) -> Result<u64, Error> {
        let Some(v) = &mut self.versions else {
            return Ok(0);
        };
        let (rows, k) = (self.ids.rows(), self.per_request as u64);
        let mut known = 0u64;
        let mut start = 0;
        while start < rows {
            let n = k.min(rows - start);
            self.row_ids.clear();
            self.row_ids.extend(start..start + n);
            let r = Rows::new(self.table, DType::F32, &self.row_dims, &self.row_ids);
            let zeros = vec![0u64; n as usize];
            let deadline = Some(Instant::now() + timeout);
            let t =
                h.pull_rows_versioned(self.addr, &[r.travel_as(self.wire)], &zeros, deadline)?;
            let pulled = h.wait(t)?;
            if let Err(s) = pulled.block(0) {
                return Err(Error::new(ErrorKind::Remote(s)));
            }
            known += v.learn_range(start, &pulled) as u64;
            start += n;
        }
        Ok(known)
    }

    /// Whether `tag` is a push `--changed` made (no longer in flight), and if so whether it
    /// failed.
    pub(super) fn push_outcome(
        &mut self,
        tag: u64,
        result: &Result<Reply, Error>,
    ) -> Option<Option<Error>> {
        if !self.versions.as_mut()?.push_done(tag) {
            return None;
        }
        Some(match result {
            Ok(Reply::Pushed(s)) if s[..] == [Status::Ok] => None,
            Ok(Reply::Pushed(s)) => Some(Error::new(ErrorKind::Remote(
                s.first().copied().unwrap_or(Status::Internal),
            ))),
            Ok(_) => Some(Error::new(ErrorKind::Protocol)),
            Err(e) => Some(e.clone()),
        })
    }

    /// Pushes `--changed` has in flight.
    pub(super) fn pushes_in_flight(&self) -> usize {
        self.versions.as_ref().map_or(0, Versions::pushes_in_flight)
    }

    /// Rows each `--changed` push sends.
    pub(super) fn rows_per_push(&self) -> u64 {
        self.versions.as_ref().map_or(0, |v| v.changed_rows as u64)
    }

    /// Request `tag` failed: nothing of it is kept.
    pub(super) fn failed(&mut self, tag: u64) {
        if let Some(v) = &mut self.versions {
            v.forget(tag);
        }
    }

    /// What answer `reply` to request `tag` moved.
    pub(super) fn tally(&mut self, tag: u64, reply: &Reply) -> Tally {
        let mut t = Tally::default();
        let remote = |s: Status| Some(Error::new(ErrorKind::Remote(s)));
        match (self.op, reply) {
            (Op::Ping, Reply::Pong { payload, .. }) => t.bytes = u64::from(*payload),
            (Op::Pull, Reply::Pulled(items))
            | (Op::Recv | Op::FusedRecv, Reply::Received(items)) => {
                for item in items {
                    match item {
                        Ok(tensor) => {
                            t.items += 1;
                            t.bytes += tensor.byte_len() as u64;
                        }
                        Err(s) => t.failure = t.failure.or(remote(*s)),
                    }
                }
            }
            (Op::Push, Reply::Pushed(statuses)) => {
                let size = self.push.as_ref().map_or(0, |t| t.byte_len() as u64);
                for &s in statuses {
                    if s == Status::Ok {
                        t.items += 1;
                        t.bytes += size;
                    } else {
                        t.failure = t.failure.or(remote(s));
                    }
                }
            }
            (Op::PullRows, Reply::Rows(rows)) => match rows.block(0) {
                Ok(block) if rows.len() == 1 => {
                    t.items = self.per_request as u64;
                    t.bytes = block.byte_len() as u64;
                    t.missing = rows.missing(0).len() as u64;
                    if let Some(v) = &mut self.versions {
                        t.unchanged = v.answered(tag, &self.ids, rows);
                    }
                }
                Ok(_) => t.failure = Some(Error::new(ErrorKind::Protocol)),
                Err(s) => t.failure = remote(s),
            },
            (Op::PushRows, Reply::Pushed(statuses)) => match statuses[..] {
                [Status::Ok] => {
                    t.items = self.per_request as u64;
                    t.bytes = self.per_request as u64 * self.row_bytes();
                }
                [s] => t.failure = remote(s),
                _ => t.failure = Some(Error::new(ErrorKind::Protocol)),
            },
            (_, other) => {
                log::warn!("unexpected reply: {other:?}");
                t.failure = Some(Error::new(ErrorKind::Protocol));
            }
        }
        if t.failure.is_some() {
            self.failed(tag);
        }
        t
    }
}
