//! The workloads over gRPC, written as a typical user would: tonic with prost, one unary
//! RPC per operation, tensors as `repeated bytes`, the default multi-threaded tokio runtime
//! on both ends, N requests in flight as N tasks looping on clones of a client.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Request, Response};

use crate::common::*;

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
}

/// Serves on `addr` on a new tokio runtime, in a thread of its own; returns the address.
pub fn serve(addr: SocketAddr) -> Result<SocketAddr, String> {
    let rt = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
    let listener = rt
        .block_on(tokio::net::TcpListener::bind(addr))
        .map_err(|e| e.to_string())?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    std::thread::spawn(move || {
        let svc = bench_server::BenchServer::new(Svc {
            store: Arc::new(Store::new()),
        })
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
/// channels (HTTP/2 connections).
pub fn run(w: &Workload, addr: SocketAddr, time: Duration) -> Result<Sample, String> {
    let rt = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
    let w = w.clone();
    rt.block_on(async move {
        let mut clients = Vec::new();
        for _ in 0..w.connections {
            clients.push(connect(addr).await?);
        }
        let end = Instant::now() + time;
        let mut tasks = Vec::new();
        for i in 0..w.inflight {
            let client = clients[i % clients.len()].clone();
            let op = w.op;
            tasks.push(tokio::spawn(async move {
                if op == Op::Step {
                    step_task(client, i as u64, end).await
                } else {
                    op_task(client, op, i as u64, end).await
                }
            }));
        }
        let mut total = Sample::default();
        for t in tasks {
            let s = t.await.map_err(|e| e.to_string())?;
            total.merge(&s);
        }
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
            Op::Step => unreachable!(),
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
