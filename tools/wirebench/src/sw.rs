//! The workloads over starwire: a `Service` on a one-loop runtime, and clients that keep
//! requests in flight on one `Handle` with the allocation-free calls.

use starwire::client::Mode;
use starwire::config::ConfigBuilder;
use starwire::rows::Rows;
use starwire::{Completion, Embedded, Handle, Options, Reply, Runtime, Service, Table, Tensor};
use starwire::{DType, Status};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::*;
use crate::cpu::Meter;

struct Svc {
    store: Arc<Store>,
    rows: Vec<Arc<Tensor>>,
    big: Arc<Tensor>,
    table: RowsTable,
}

/// The rows workloads' table (table 1): u8 rows of `ROW_BYTES` from the store's table
/// (`--table`), pushed gradient rows applied there.
struct RowsTable {
    store: Arc<Store>,
    dims: [u64; 1],
}

impl Table for RowsTable {
    fn dtype(&self) -> DType {
        DType::U8
    }
    fn row_dims(&self) -> &[u64] {
        &self.dims
    }
    fn pull(&self, ids: &[u64], out: &mut [u8], missing: &mut Vec<u32>) -> Status {
        self.store.pull_rows(ids, out, missing);
        Status::Ok
    }
    fn push(&self, ids: &[u64], grads: &[u8]) -> Status {
        let mut missing = Vec::new();
        self.store.push_rows(ids, grads, &mut missing);
        if missing.is_empty() {
            Status::Ok
        } else {
            Status::NotFound
        }
    }
}

fn status(code: i32) -> Status {
    match code {
        OK => Status::Ok,
        NOT_FOUND => Status::NotFound,
        _ => Status::InvalidArgument,
    }
}

impl Service for Svc {
    fn pull(&self, ids: &[u64], out: &mut Vec<Result<Arc<Tensor>, Status>>) {
        let mut shard = None;
        let mut bytes = Vec::new();
        for &id in ids {
            if id & STEP_BIT != 0 {
                let shard = shard.get_or_insert_with(|| self.store.shard.lock().unwrap());
                bytes.clear();
                self.store.read_model(shard, id, &mut bytes);
                let t = Tensor::from_slice(DType::F32, &[self.store.model.dim as u64], &bytes);
                out.push(Ok(Arc::new(t.expect("model row"))));
            } else if id == BIG_ID {
                out.push(Ok(self.big.clone()));
            } else if id < ROWS {
                out.push(Ok(self.rows[id as usize].clone()));
            } else {
                out.push(Err(Status::NotFound));
            }
        }
    }

    fn push(&self, items: &mut Vec<(u64, Tensor)>, statuses: &mut Vec<Status>) {
        let mut shard = None;
        for (id, t) in items.iter() {
            statuses.push(status(self.store.push_one(&mut shard, *id, t.bytes())));
        }
    }

    fn table(&self, table: u32) -> Option<&dyn Table> {
        (table == 1).then_some(&self.table as &dyn Table)
    }
}

/// Serves on `addr` until the process ends, the rows workloads from `table`.
pub fn serve(addr: SocketAddr, table: TableConfig) -> Result<(Runtime, SocketAddr), String> {
    let store = Arc::new(Store::new(table)?);
    let tensor = |b: &[u8]| Arc::new(Tensor::from_slice(DType::U8, &[b.len() as u64], b).unwrap());
    let svc = Svc {
        rows: store.rows.iter().map(|r| tensor(r)).collect(),
        big: tensor(&store.big),
        table: RowsTable {
            store: store.clone(),
            dims: [ROW_BYTES as u64],
        },
        store,
    };
    let config = ConfigBuilder::from_env("ps", 0)
        .and_then(|b| b.loops(1).build())
        .map_err(|e| e.to_string())?;
    let options = Options {
        service: Some(Arc::new(svc)),
        ..Options::listen(addr)
    };
    let rt = Runtime::start_with(config, options).map_err(|e| e.to_string())?;
    let addr = rt.local_addr().ok_or("no address")?;
    Ok((rt, addr))
}

const TIMEOUT: Duration = Duration::from_secs(10);

/// What a workload needs of a client, for either way to drive starwire from a client
/// thread: a [`Handle`] to a runtime's own loop thread, or an [`Embedded`] loop that the
/// calling thread runs itself (both are a `starwire::Client`).
trait Client {
    fn submit(
        &mut self,
        op: Op,
        addr: SocketAddr,
        ids: &[u64],
        items: &[(u64, Arc<Tensor>)],
        deadline: Instant,
    ) -> Result<u64, String>;
    fn next(&mut self) -> Result<Completion, String>;
    fn recycle(&mut self, c: Completion);
}

impl<M: Mode> Client for starwire::Client<M> {
    fn submit(
        &mut self,
        op: Op,
        addr: SocketAddr,
        ids: &[u64],
        items: &[(u64, Arc<Tensor>)],
        deadline: Instant,
    ) -> Result<u64, String> {
        let d = Some(deadline);
        let tag = match op {
            Op::Ping => self.ping(addr, PING_BYTES as u32, d).map(|t| t.tag()),
            Op::Push => self.push_slice(addr, items, d).map(|t| t.tag()),
            _ => self.pull_slice(addr, ids, d).map(|t| t.tag()),
        };
        tag.map_err(|e| e.to_string())
    }
    fn next(&mut self) -> Result<Completion, String> {
        self.wait_any().map_err(|e| e.to_string())
    }
    fn recycle(&mut self, c: Completion) {
        starwire::Client::recycle(self, c)
    }
}

/// Keeps `w.inflight` requests of `w.op` in flight for `time`: training steps on threads
/// with handles to a runtime, the other workloads from this thread with an embedded loop
/// (one thread, as the gRPC client's runtime is pinned to one CPU too). `meter` measures
/// the load, the runtime or loop started and the connections open. `None`: the workload is
/// not supported over starwire (yet).
pub fn run(
    w: &Workload,
    addr: SocketAddr,
    time: Duration,
    meter: &Meter,
) -> Result<Option<Sample>, String> {
    let config = client_config(w.connections)?;
    match w.op {
        Op::Step => {
            let rt = Runtime::start(config, None).map_err(|e| e.to_string())?;
            let s = run_steps(&rt, w, addr, time, meter);
            rt.shutdown();
            s.map(Some)
        }
        Op::RowsPull | Op::RowsPush => {
            let mut e = Embedded::new(config, None).map_err(|e| e.to_string())?;
            run_rows(&mut e, w, addr, time, meter).map(Some)
        }
        _ => {
            let mut e = Embedded::new(config, None).map_err(|e| e.to_string())?;
            run_ops(&mut e, w, addr, time, meter).map(Some)
        }
    }
}

fn client_config(connections: usize) -> Result<starwire::Config, String> {
    ConfigBuilder::from_env("worker", 0)
        .and_then(|b| b.loops(1).connections_per_peer(connections).build())
        .map_err(|e| e.to_string())
}

fn run_ops(
    c: &mut impl Client,
    w: &Workload,
    addr: SocketAddr,
    time: Duration,
    meter: &Meter,
) -> Result<Sample, String> {
    // Open every connection before the clock starts.
    for _ in 0..w.connections {
        let tag = c.submit(Op::Ping, addr, &[], &[], Instant::now() + TIMEOUT)?;
        let done = c.next()?;
        if done.tag != tag {
            return Err("unexpected completion".into());
        }
        done.result.map_err(|e| format!("connect: {e}"))?;
    }
    let push_items: Vec<(u64, Arc<Tensor>)> = (0..IDS as u64)
        .map(|i| {
            (
                i,
                Arc::new(
                    Tensor::from_slice(DType::U8, &[ROW_BYTES as u64], &[i as u8; ROW_BYTES])
                        .unwrap(),
                ),
            )
        })
        .collect();
    let mut ids = Vec::with_capacity(IDS);
    let mut started: HashMap<u64, Instant> = HashMap::with_capacity(w.inflight * 2);
    let mut s = Sample::default();
    let mut n = 0u64;
    meter.start();
    let start = Instant::now();
    let end = start + time;
    loop {
        let now = Instant::now();
        while now < end && started.len() < w.inflight {
            match w.op {
                Op::Pull => ids_for(n, &mut ids),
                _ => {
                    ids.clear();
                    ids.push(BIG_ID);
                }
            }
            let tag = c.submit(w.op, addr, &ids, &push_items, now + TIMEOUT)?;
            started.insert(tag, Instant::now());
            n += 1;
        }
        if started.is_empty() {
            break;
        }
        let done = c.next()?;
        let t0 = started.remove(&done.tag).ok_or("unknown completion")?;
        let ok = match &done.result {
            Ok(Reply::Pong { .. }) => true,
            Ok(Reply::Pulled(t)) => t.iter().all(|t| t.as_ref().is_ok_and(|t| t.byte_len() > 0)),
            Ok(Reply::Pushed(st)) => st.iter().all(|s| *s == Status::Ok),
            _ => false,
        };
        if let (true, Ok(Reply::Pulled(t))) = (ok, &done.result) {
            // Spot-check contents (first tensor).
            if let Some(Ok(first)) = t.first() {
                if !(check_fixed(BIG_ID, first.bytes()) || first.bytes().len() == ROW_BYTES) {
                    s.failed += 1;
                }
            }
        }
        if ok {
            s.ops += 1;
            s.latency.record(t0.elapsed());
        } else {
            s.failed += 1;
        }
        c.recycle(done);
    }
    s.elapsed = start.elapsed();
    meter.stop();
    Ok(s)
}

/// Keeps `w.inflight` rows requests of `w.rows` ids in flight on one embedded loop: the
/// same ids (`rows_ids`) and gradient rows (`grad_block`, sent from a shared tensor) as the
/// other kinds, every pulled row checked, a request failed when a row is missing.
fn run_rows(
    e: &mut Embedded,
    w: &Workload,
    addr: SocketAddr,
    time: Duration,
    meter: &Meter,
) -> Result<Sample, String> {
    let t = e
        .ping(addr, 8, Some(Instant::now() + TIMEOUT))
        .map_err(|e| e.to_string())?;
    e.wait(t).map_err(|e| format!("connect: {e}"))?;
    // The gradient rows, sent from this tensor's memory (shared by the requests in flight).
    let grad = grad_block(w.rows);
    let grad = Arc::new(
        Tensor::from_bytes(DType::U8, &[grad.len() as u64], grad).map_err(|e| e.to_string())?,
    );
    let dims = [ROW_BYTES as u64];
    let mut ids = Vec::with_capacity(w.rows);
    let mut sent: HashMap<u64, (Instant, u64)> = HashMap::with_capacity(w.inflight * 2);
    let mut check = Vec::with_capacity(w.rows);
    let mut s = Sample::default();
    let mut n = 0u64;
    meter.start();
    let start = Instant::now();
    let end = start + time;
    loop {
        let now = Instant::now();
        while now < end && sent.len() < w.inflight {
            rows_ids(n, w.rows, w.table_rows, &mut ids);
            let rows = Rows::new(1, DType::U8, &dims, &ids);
            let d = Some(now + TIMEOUT);
            let tag = match w.op {
                Op::RowsPull => e.pull_rows(addr, &[rows], d).map(|t| t.tag()),
                _ => e
                    .push_rows_shared(addr, &[(rows, grad.clone())], d)
                    .map(|t| t.tag()),
            };
            sent.insert(tag.map_err(|e| e.to_string())?, (Instant::now(), n));
            n += 1;
        }
        if sent.is_empty() {
            break;
        }
        let done = e.wait_any().map_err(|e| e.to_string())?;
        let (t0, number) = sent.remove(&done.tag).ok_or("unknown completion")?;
        let ok = match &done.result {
            Ok(Reply::Rows(rows)) => {
                rows_ids(number, w.rows, w.table_rows, &mut check);
                rows.missing(0).is_empty()
                    && check
                        .iter()
                        .enumerate()
                        .all(|(i, &id)| rows.row(0, i).is_some_and(|r| check_row(id, r)))
            }
            Ok(Reply::Pushed(st)) => st.iter().all(|s| *s == Status::Ok),
            _ => false,
        };
        if ok {
            s.ops += 1;
            s.latency.record(t0.elapsed());
        } else {
            s.failed += 1;
        }
        e.recycle(done);
    }
    s.elapsed = start.elapsed();
    meter.stop();
    Ok(s)
}

/// The steps' load is measured from before their threads start to after they have ended.
fn run_steps(
    rt: &Runtime,
    w: &Workload,
    addr: SocketAddr,
    time: Duration,
    meter: &Meter,
) -> Result<Sample, String> {
    meter.start();
    let end = Instant::now() + time;
    let total = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..w.inflight)
            .map(|i| scope.spawn(move || step_loop(&mut rt.handle(4), i as u64, addr, end)))
            .collect();
        let mut total = Sample::default();
        for t in threads {
            let s = t.join().map_err(|_| "worker panicked")??;
            total.merge(&s);
        }
        Ok(total)
    });
    meter.stop();
    total
}

fn step_loop(h: &mut Handle, seed: u64, addr: SocketAddr, end: Instant) -> Result<Sample, String> {
    let mut wk = StepWorker::new(seed);
    let dim = wk.cfg.dim;
    let mut items: Vec<(u64, Arc<Tensor>)> = Vec::new();
    let mut s = Sample::default();
    let start = Instant::now();
    while Instant::now() < end {
        let t0 = Instant::now();
        wk.next_batch();
        let deadline = Some(t0 + TIMEOUT);
        let tag = h
            .pull_slice(addr, &wk.ids, deadline)
            .map_err(|e| e.to_string())?
            .tag();
        let done = h.wait_tag(tag).map_err(|e| e.to_string())?;
        let mut ok = false;
        if let Ok(t) = done.pulled() {
            ok = t.len() == wk.ids.len();
            for (i, t) in t.iter().enumerate() {
                ok &= t.as_ref().is_ok_and(|t| wk.set_row(i, t.bytes()));
            }
        }
        h.recycle(done);
        if !ok {
            s.failed += 1;
            continue;
        }
        wk.compute();
        // Gradient tensors, reused once the runtime has let go of last step's.
        items.truncate(wk.ids.len());
        for i in 0..wk.ids.len() {
            if i == items.len() {
                items.push((
                    0,
                    Arc::new(Tensor::zeros(DType::F32, &[dim as u64]).unwrap()),
                ));
            }
            let item = &mut items[i];
            item.0 = wk.ids[i];
            if Arc::get_mut(&mut item.1).is_none() {
                item.1 = Arc::new(Tensor::zeros(DType::F32, &[dim as u64]).unwrap());
            }
            wk.grad_bytes(i, Arc::get_mut(&mut item.1).unwrap().bytes_mut());
        }
        let tag = h
            .push_slice(addr, &items, deadline)
            .map_err(|e| e.to_string())?
            .tag();
        let done = h.wait_tag(tag).map_err(|e| e.to_string())?;
        match done.pushed() {
            Ok(st) if st.iter().all(|s| *s == Status::Ok) => {
                s.ops += 1;
                s.latency.record(t0.elapsed());
            }
            _ => s.failed += 1,
        }
        h.recycle(done);
    }
    s.elapsed = start.elapsed();
    Ok(s)
}
