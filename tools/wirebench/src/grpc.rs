//! The workloads over gRPC, written as a typical user would: tonic with prost, one unary
//! RPC per operation, tensors as `repeated bytes`, the default multi-threaded tokio runtime
//! on both ends, N requests in flight as N tasks looping on clones of a client.
//!
//! The rows workloads two ways, as two kinds: `grpc` with one `bytes` per row
//! (`PullRowList`, `PushRowList`), and `grpc-packed` with the rows of a request in one
//! `bytes` block (`PullRowBlock`, `PushRowBlock`). Both send the ids as a packed
//! `repeated uint64` and report the rows not found as a `repeated uint32` of positions.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Request, Response};

use crate::common::*;
use crate::cpu::Meter;

tonic::include_proto!("wirebench.Bench");

#[derive(Clone, PartialEq, prost::Message)]
pub struct PingMessage {
    #[prost(bytes = "vec", tag = "1")]
    pub payload: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PullRequest {
    #[prost(uint64, repeated, tag = "1")]
    pub ids: Vec<u64>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PullReply {
    #[prost(bytes = "vec", repeated, tag = "1")]
    pub tensors: Vec<Vec<u8>>,
    /// Per id: 0, or why there is no tensor.
    #[prost(int32, repeated, tag = "2")]
    pub statuses: Vec<i32>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PushRequest {
    #[prost(uint64, repeated, tag = "1")]
    pub ids: Vec<u64>,
    #[prost(bytes = "vec", repeated, tag = "2")]
    pub tensors: Vec<Vec<u8>>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PushReply {
    #[prost(int32, repeated, tag = "1")]
    pub statuses: Vec<i32>,
}

/// The ids of a rows pull (both ways).
#[derive(Clone, PartialEq, prost::Message)]
pub struct RowsRequest {
    #[prost(uint64, repeated, tag = "1")]
    pub ids: Vec<u64>,
}

/// The rows of a pull, one `bytes` per id (empty for a missing one).
#[derive(Clone, PartialEq, prost::Message)]
pub struct RowList {
    #[prost(bytes = "vec", repeated, tag = "1")]
    pub rows: Vec<Vec<u8>>,
    /// Positions (in the request's ids) of the rows not found.
    #[prost(uint32, repeated, tag = "2")]
    pub missing: Vec<u32>,
}

/// The rows of a pull as one block, `ROW_BYTES` per id in order (zeros for a missing one).
#[derive(Clone, PartialEq, prost::Message)]
pub struct RowBlock {
    #[prost(bytes = "vec", tag = "1")]
    pub block: Vec<u8>,
    /// Positions (in the request's ids) of the rows not found.
    #[prost(uint32, repeated, tag = "2")]
    pub missing: Vec<u32>,
}

/// Gradient rows to add, one `bytes` per id.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PushRowList {
    #[prost(uint64, repeated, tag = "1")]
    pub ids: Vec<u64>,
    #[prost(bytes = "vec", repeated, tag = "2")]
    pub rows: Vec<Vec<u8>>,
}

/// Gradient rows to add as one block, `ROW_BYTES` per id in order.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PushRowBlock {
    #[prost(uint64, repeated, tag = "1")]
    pub ids: Vec<u64>,
    #[prost(bytes = "vec", tag = "2")]
    pub block: Vec<u8>,
}

/// What a rows push did not apply.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RowsPushed {
    /// Positions (in the request's ids) of the rows not applied.
    #[prost(uint32, repeated, tag = "1")]
    pub missing: Vec<u32>,
}

/// Large enough for the 4 MiB tensor (tonic's default limit is 4 MiB per message).
const MAX_MESSAGE: usize = 64 << 20;

struct Svc {
    store: Arc<Store>,
}

#[tonic::async_trait]
impl bench_server::Bench for Svc {
    async fn ping(&self, r: Request<PingMessage>) -> Result<Response<PingMessage>, tonic::Status> {
        Ok(Response::new(r.into_inner()))
    }

    async fn pull(&self, r: Request<PullRequest>) -> Result<Response<PullReply>, tonic::Status> {
        let ids = r.into_inner().ids;
        let mut reply = PullReply {
            tensors: Vec::with_capacity(ids.len()),
            statuses: Vec::with_capacity(ids.len()),
        };
        let mut shard = None;
        for id in ids {
            let mut bytes = Vec::new();
            let status = if id & STEP_BIT != 0 {
                let shard = shard.get_or_insert_with(|| self.store.shard.lock().unwrap());
                self.store.read_model(shard, id, &mut bytes);
                OK
            } else if let Some(b) = self.store.fixed(id) {
                bytes.extend_from_slice(b);
                OK
            } else {
                NOT_FOUND
            };
            reply.tensors.push(bytes);
            reply.statuses.push(status);
        }
        Ok(Response::new(reply))
    }

    async fn push(&self, r: Request<PushRequest>) -> Result<Response<PushReply>, tonic::Status> {
        let r = r.into_inner();
        if r.ids.len() != r.tensors.len() {
            return Err(tonic::Status::invalid_argument(
                "ids and tensors differ in number",
            ));
        }
        let mut shard = None;
        let statuses = r
            .ids
            .iter()
            .zip(&r.tensors)
            .map(|(&id, t)| self.store.push_one(&mut shard, id, t))
            .collect();
        Ok(Response::new(PushReply { statuses }))
    }

    async fn pull_row_list(
        &self,
        r: Request<RowsRequest>,
    ) -> Result<Response<RowList>, tonic::Status> {
        let ids = r.into_inner().ids;
        let mut reply = RowList {
            rows: Vec::with_capacity(ids.len()),
            missing: Vec::new(),
        };
        let mut i = 0;
        self.store.each_row(&ids, |row| {
            match row {
                Some(row) => reply.rows.push(row.to_vec()),
                None => {
                    reply.rows.push(Vec::new());
                    reply.missing.push(i);
                }
            }
            i += 1;
        });
        Ok(Response::new(reply))
    }

    async fn push_row_list(
        &self,
        r: Request<PushRowList>,
    ) -> Result<Response<RowsPushed>, tonic::Status> {
        let r = r.into_inner();
        if r.ids.len() != r.rows.len() {
            return Err(tonic::Status::invalid_argument(
                "ids and rows differ in number",
            ));
        }
        let mut missing = Vec::new();
        self.store.push_row_slices(&r.ids, &r.rows, &mut missing);
        Ok(Response::new(RowsPushed { missing }))
    }

    async fn pull_row_block(
        &self,
        r: Request<RowsRequest>,
    ) -> Result<Response<RowBlock>, tonic::Status> {
        let ids = r.into_inner().ids;
        let mut reply = RowBlock {
            block: Vec::with_capacity(ids.len() * ROW_BYTES),
            missing: Vec::new(),
        };
        reply.block.resize(ids.len() * ROW_BYTES, 0);
        self.store
            .pull_rows(&ids, &mut reply.block, &mut reply.missing);
        Ok(Response::new(reply))
    }

    async fn push_row_block(
        &self,
        r: Request<PushRowBlock>,
    ) -> Result<Response<RowsPushed>, tonic::Status> {
        let r = r.into_inner();
        if r.block.len() != r.ids.len() * ROW_BYTES {
            return Err(tonic::Status::invalid_argument(
                "the block is not one row per id",
            ));
        }
        let mut missing = Vec::new();
        self.store.push_rows(&r.ids, &r.block, &mut missing);
        Ok(Response::new(RowsPushed { missing }))
    }
}

/// Serves on `addr` on a new tokio runtime, in a thread of its own; returns the address.
pub fn serve(addr: SocketAddr, table: TableConfig) -> Result<SocketAddr, String> {
    let store = Arc::new(Store::new(table)?);
    let rt = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
    let listener = rt
        .block_on(tokio::net::TcpListener::bind(addr))
        .map_err(|e| e.to_string())?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    std::thread::spawn(move || {
        let svc = bench_server::BenchServer::new(Svc { store })
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE);
        // As `Server::serve(addr)` would: TCP_NODELAY on accepted connections.
        let incoming = match TcpIncoming::from_listener(listener, true, None) {
            Ok(i) => i,
            Err(e) => {
                eprintln!("wirebench: gRPC server: {e}");
                return;
            }
        };
        let result = rt.block_on(
            Server::builder()
                .add_service(svc)
                .serve_with_incoming(incoming),
        );
        if let Err(e) = result {
            eprintln!("wirebench: gRPC server: {e}");
        }
    });
    Ok(local)
}

type Client = bench_client::BenchClient<Channel>;

async fn connect(addr: SocketAddr) -> Result<Client, String> {
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| e.to_string())?
        .connect()
        .await
        .map_err(|e| format!("connect: {e}"))?;
    Ok(Client::new(channel)
        .max_decoding_message_size(MAX_MESSAGE)
        .max_encoding_message_size(MAX_MESSAGE))
}

/// Keeps `w.inflight` requests of `w.op` in flight for `time`, over `w.connections`
/// channels (HTTP/2 connections). `packed`: the rows workloads' rows in one block.
/// `meter` measures the load, from its tasks' start (the channels connected) to their end.
pub fn run(
    w: &Workload,
    addr: SocketAddr,
    time: Duration,
    packed: bool,
    meter: &Meter,
) -> Result<Sample, String> {
    let rt = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
    let w = w.clone();
    rt.block_on(async move {
        let mut clients = Vec::new();
        for _ in 0..w.connections {
            clients.push(connect(addr).await?);
        }
        meter.start();
        let end = Instant::now() + time;
        let mut tasks = Vec::new();
        for i in 0..w.inflight {
            let client = clients[i % clients.len()].clone();
            let (op, rows) = (w.op, (w.rows, w.table_rows));
            tasks.push(tokio::spawn(async move {
                match op {
                    Op::Step => step_task(client, i as u64, end).await,
                    Op::RowsPull | Op::RowsPush => {
                        rows_task(client, op, rows, packed, i as u64, end).await
                    }
                    _ => op_task(client, op, i as u64, end).await,
                }
            }));
        }
        let mut total = Sample::default();
        for t in tasks {
            let s = t.await.map_err(|e| e.to_string())?;
            total.merge(&s);
        }
        meter.stop();
        Ok(total)
    })
}

async fn op_task(mut client: Client, op: Op, seed: u64, end: Instant) -> Sample {
    let mut s = Sample::default();
    let start = Instant::now();
    let mut n = seed * 7919;
    let mut ids = Vec::new();
    while Instant::now() < end {
        let t0 = Instant::now();
        let ok = match op {
            Op::Ping => {
                let r = client
                    .ping(PingMessage {
                        payload: vec![7; PING_BYTES],
                    })
                    .await;
                r.is_ok_and(|r| r.into_inner().payload.len() == PING_BYTES)
            }
            Op::Pull | Op::PullBig => {
                if op == Op::Pull {
                    ids_for(n, &mut ids);
                } else {
                    ids.clear();
                    ids.push(BIG_ID);
                }
                let r = client.pull(PullRequest { ids: ids.clone() }).await;
                r.is_ok_and(|r| {
                    let r = r.into_inner();
                    r.tensors.len() == ids.len()
                        && ids
                            .iter()
                            .zip(&r.tensors)
                            .all(|(&id, t)| check_fixed(id, t))
                })
            }
            Op::Push => {
                let req = PushRequest {
                    ids: (0..IDS as u64).collect(),
                    tensors: (0..IDS).map(|i| vec![i as u8; ROW_BYTES]).collect(),
                };
                let r = client.push(req).await;
                r.is_ok_and(|r| r.into_inner().statuses.iter().all(|&s| s == OK))
            }
            Op::Step | Op::RowsPull | Op::RowsPush => unreachable!(),
        };
        n += 1;
        if ok {
            s.ops += 1;
            s.latency.record(t0.elapsed());
        } else {
            s.failed += 1;
        }
    }
    s.elapsed = start.elapsed();
    s
}

/// The rows workloads: `rows` ids a request from a table of `table_rows`, one `bytes` per
/// row or (`packed`) one block.
async fn rows_task(
    mut client: Client,
    op: Op,
    (rows, table_rows): (usize, u64),
    packed: bool,
    seed: u64,
    end: Instant,
) -> Sample {
    let mut s = Sample::default();
    let start = Instant::now();
    let mut n = seed * 7919;
    let mut ids = Vec::new();
    // The gradient rows, which every push copies into its message.
    let grad = grad_block(rows);
    while Instant::now() < end {
        let t0 = Instant::now();
        rows_ids(n, rows, table_rows, &mut ids);
        let ok = match (op, packed) {
            (Op::RowsPull, false) => {
                let r = client.pull_row_list(RowsRequest { ids: ids.clone() }).await;
                r.is_ok_and(|r| {
                    let r = r.into_inner();
                    r.missing.is_empty()
                        && r.rows.len() == ids.len()
                        && ids.iter().zip(&r.rows).all(|(&id, row)| check_row(id, row))
                })
            }
            (Op::RowsPull, true) => {
                let r = client
                    .pull_row_block(RowsRequest { ids: ids.clone() })
                    .await;
                r.is_ok_and(|r| {
                    let r = r.into_inner();
                    r.missing.is_empty()
                        && r.block.len() == ids.len() * ROW_BYTES
                        && ids
                            .iter()
                            .zip(r.block.chunks_exact(ROW_BYTES))
                            .all(|(&id, row)| check_row(id, row))
                })
            }
            (_, false) => {
                let req = PushRowList {
                    ids: ids.clone(),
                    rows: grad.chunks_exact(ROW_BYTES).map(<[u8]>::to_vec).collect(),
                };
                let r = client.push_row_list(req).await;
                r.is_ok_and(|r| r.into_inner().missing.is_empty())
            }
            (_, true) => {
                let req = PushRowBlock {
                    ids: ids.clone(),
                    block: grad.clone(),
                };
                let r = client.push_row_block(req).await;
                r.is_ok_and(|r| r.into_inner().missing.is_empty())
            }
        };
        n += 1;
        if ok {
            s.ops += 1;
            s.latency.record(t0.elapsed());
        } else {
            s.failed += 1;
        }
    }
    s.elapsed = start.elapsed();
    s
}

async fn step_task(mut client: Client, seed: u64, end: Instant) -> Sample {
    let mut wk = StepWorker::new(seed);
    let dim = wk.cfg.dim;
    let mut s = Sample::default();
    let start = Instant::now();
    while Instant::now() < end {
        let t0 = Instant::now();
        wk.next_batch();
        let r = client
            .pull(PullRequest {
                ids: wk.ids.clone(),
            })
            .await;
        let ok = r.is_ok_and(|r| {
            let r = r.into_inner();
            r.tensors.len() == wk.ids.len()
                && r.tensors.iter().enumerate().all(|(i, t)| wk.set_row(i, t))
        });
        if !ok {
            s.failed += 1;
            continue;
        }
        wk.compute();
        let tensors = (0..wk.ids.len())
            .map(|i| {
                let mut b = vec![0u8; dim * 4];
                wk.grad_bytes(i, &mut b);
                b
            })
            .collect();
        let r = client
            .push(PushRequest {
                ids: wk.ids.clone(),
                tensors,
            })
            .await;
        if r.is_ok_and(|r| r.into_inner().statuses.iter().all(|&s| s == OK)) {
            s.ops += 1;
            s.latency.record(t0.elapsed());
        } else {
            s.failed += 1;
        }
    }
    s.elapsed = start.elapsed();
    s
}
