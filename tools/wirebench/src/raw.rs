//! The workloads over raw blocking sockets: a thread per connection on both ends,
//! length-prefixed messages, buffers reused, no framework. The floor for what any
//! transport adds.
//!
//! Request: `u32 length | u8 op | body`; reply: `u32 length | body`. Ping echoes its body.
//! Pull: `u32 n | n x u64 id` -> `n x (i32 status | u32 length | bytes)`. Push:
//! `u32 n | n x (u64 id | u32 length | bytes)` -> `n x i32 status`.
//!
//! The rows workloads, packed: rows pull `u32 n | n x u64 id` -> `n x ROW_BYTES block |
//! u32 m | m x u32 missing position` (a missing row's place in the block is zeros); rows
//! push `u32 n | n x u64 id | n x ROW_BYTES block` -> `u32 m | m x u32 missing position`.
//!
//! A connection carries one request at a time: N requests in flight are N connections,
//! each with a client thread and a server thread.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use crate::common::*;
use crate::cpu::Meter;

const PING: u8 = 1;
const PULL: u8 = 2;
const PUSH: u8 = 3;
const ROWS_PULL: u8 = 4;
const ROWS_PUSH: u8 = 5;
/// Largest message either side accepts.
const MAX: usize = 64 << 20;

/// Serves on `addr` (a thread accepting, a thread per connection); returns the address.
pub fn serve(addr: SocketAddr, table: TableConfig) -> Result<SocketAddr, String> {
    let listener = TcpListener::bind(addr).map_err(|e| e.to_string())?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    let store = Arc::new(Store::new(table)?);
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let store = store.clone();
            std::thread::spawn(move || {
                let _ = conn.set_nodelay(true);
                let _ = serve_conn(conn, &store);
            });
        }
    });
    Ok(local)
}

fn read_msg(s: &mut TcpStream, buf: &mut Vec<u8>) -> std::io::Result<()> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX {
        return Err(std::io::Error::other("message too large"));
    }
    buf.resize(len, 0);
    s.read_exact(buf)
}

fn write_msg(s: &mut TcpStream, buf: &mut [u8]) -> std::io::Result<()> {
    // `buf` starts with 4 bytes reserved for the length.
    let len = (buf.len() - 4) as u32;
    buf[..4].copy_from_slice(&len.to_le_bytes());
    s.write_all(buf)
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// `n` ids from `at` in `b`.
fn ids_at(b: &[u8], at: usize, n: usize) -> Option<impl Iterator<Item = u64> + '_> {
    let ids = b.get(at..at.checked_add(n.checked_mul(8)?)?)?;
    Some(
        ids.chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap())),
    )
}

fn serve_conn(mut s: TcpStream, store: &Store) -> std::io::Result<()> {
    let bad = || std::io::Error::other("malformed request");
    let (mut req, mut reply, mut missing) = (Vec::new(), Vec::new(), Vec::new());
    let mut ids: Vec<u64> = Vec::new();
    loop {
        read_msg(&mut s, &mut req)?;
        reply.clear();
        reply.extend_from_slice(&[0; 4]);
        let (op, body) = req.split_first().ok_or_else(bad)?;
        match *op {
            PING => reply.extend_from_slice(body),
            PULL => {
                let n = u32_at(body, 0).ok_or_else(bad)? as usize;
                let mut shard = None;
                for i in 0..n {
                    let id = u64_at(body, 4 + 8 * i).ok_or_else(bad)?;
                    if id & STEP_BIT != 0 {
                        let shard = shard.get_or_insert_with(|| store.shard.lock().unwrap());
                        reply.extend_from_slice(&OK.to_le_bytes());
                        reply.extend_from_slice(&(store.model.dim as u32 * 4).to_le_bytes());
                        store.read_model(shard, id, &mut reply);
                    } else if let Some(b) = store.fixed(id) {
                        reply.extend_from_slice(&OK.to_le_bytes());
                        reply.extend_from_slice(&(b.len() as u32).to_le_bytes());
                        reply.extend_from_slice(b);
                    } else {
                        reply.extend_from_slice(&NOT_FOUND.to_le_bytes());
                        reply.extend_from_slice(&0u32.to_le_bytes());
                    }
                }
            }
            PUSH => {
                let n = u32_at(body, 0).ok_or_else(bad)? as usize;
                let mut at = 4;
                let mut shard = None;
                for _ in 0..n {
                    let id = u64_at(body, at).ok_or_else(bad)?;
                    let len = u32_at(body, at + 8).ok_or_else(bad)? as usize;
                    let bytes = body.get(at + 12..at + 12 + len).ok_or_else(bad)?;
                    reply.extend_from_slice(&store.push_one(&mut shard, id, bytes).to_le_bytes());
                    at += 12 + len;
                }
            }
            ROWS_PULL => {
                let n = u32_at(body, 0).ok_or_else(bad)? as usize;
                ids.clear();
                ids.extend(ids_at(body, 4, n).ok_or_else(bad)?);
                missing.clear();
                let at = reply.len();
                reply.resize(at + n * ROW_BYTES, 0);
                store.pull_rows(&ids, &mut reply[at..], &mut missing);
                put_missing(&mut reply, &missing);
            }
            ROWS_PUSH => {
                let n = u32_at(body, 0).ok_or_else(bad)? as usize;
                ids.clear();
                ids.extend(ids_at(body, 4, n).ok_or_else(bad)?);
                let block = &body[4 + 8 * n..];
                if block.len() != n * ROW_BYTES {
                    return Err(bad());
                }
                missing.clear();
                store.push_rows(&ids, block, &mut missing);
                put_missing(&mut reply, &missing);
            }
            _ => return Err(bad()),
        }
        write_msg(&mut s, &mut reply)?;
    }
}

/// `u32 m | m x u32 position` onto `out`.
fn put_missing(out: &mut Vec<u8>, missing: &[u32]) {
    out.extend_from_slice(&(missing.len() as u32).to_le_bytes());
    for m in missing {
        out.extend_from_slice(&m.to_le_bytes());
    }
}

/// One blocking connection with its buffers.
struct Conn {
    s: TcpStream,
    out: Vec<u8>,
    reply: Vec<u8>,
}

impl Conn {
    fn open(addr: SocketAddr) -> Result<Conn, String> {
        let s = TcpStream::connect(addr).map_err(|e| format!("connect: {e}"))?;
        s.set_nodelay(true).map_err(|e| e.to_string())?;
        Ok(Conn {
            s,
            out: Vec::new(),
            reply: Vec::new(),
        })
    }

    /// Opens a connection and pings over it, so that the server has taken it up (accepted
    /// it, started its thread) when this returns.
    fn open_ready(addr: SocketAddr) -> Result<Conn, String> {
        let mut c = Conn::open(addr)?;
        c.start(PING);
        c.call().map_err(|e| format!("first ping: {e}"))?;
        Ok(c)
    }

    fn start(&mut self, op: u8) {
        self.out.clear();
        self.out.extend_from_slice(&[0; 4]);
        self.out.push(op);
    }

    fn call(&mut self) -> std::io::Result<()> {
        write_msg(&mut self.s, &mut self.out)?;
        read_msg(&mut self.s, &mut self.reply)
    }

    fn pull(&mut self, ids: &[u64]) -> std::io::Result<()> {
        self.start(PULL);
        self.out
            .extend_from_slice(&(ids.len() as u32).to_le_bytes());
        for id in ids {
            self.out.extend_from_slice(&id.to_le_bytes());
        }
        self.call()
    }

    /// The pulled tensors of the last reply, in order (`None` for a missing one).
    fn tensors(&self) -> impl Iterator<Item = Option<&[u8]>> {
        let r = &self.reply;
        let mut at = 0;
        std::iter::from_fn(move || {
            let status = u32_at(r, at)? as i32;
            let len = u32_at(r, at + 4)? as usize;
            let bytes = r.get(at + 8..at + 8 + len)?;
            at += 8 + len;
            Some((status == OK).then_some(bytes))
        })
    }

    /// A rows pull or push of `ids`; the push's rows are `block`.
    fn rows(&mut self, op: u8, ids: &[u64], block: &[u8]) -> std::io::Result<()> {
        self.start(op);
        self.out
            .extend_from_slice(&(ids.len() as u32).to_le_bytes());
        for id in ids {
            self.out.extend_from_slice(&id.to_le_bytes());
        }
        self.out.extend_from_slice(block);
        self.call()
    }

    /// Whether the last rows pull's reply holds every row of `ids`, none missing.
    fn rows_pulled(&self, ids: &[u64]) -> bool {
        let (block, tail) = self
            .reply
            .split_at(self.reply.len().min(ids.len() * ROW_BYTES));
        tail == 0u32.to_le_bytes()
            && ids
                .iter()
                .zip(block.chunks_exact(ROW_BYTES))
                .all(|(&id, row)| check_row(id, row))
    }

    fn push_all_ok(&self, n: usize) -> bool {
        self.reply.len() == 4 * n && self.reply.chunks_exact(4).all(|c| c == OK.to_le_bytes())
    }
}

/// Runs `w` with one connection and one thread per request in flight. `meter` measures
/// the load: from when every thread's connection is up (the server's thread for it too) to
/// when every thread has stopped, before they close their connections.
pub fn run(
    w: &Workload,
    addr: SocketAddr,
    time: Duration,
    meter: &Meter,
) -> Result<Sample, String> {
    let (op, rows, table_rows) = (w.op, w.rows, w.table_rows);
    let gate = Barrier::new(w.inflight);
    std::thread::scope(|scope| {
        let threads: Vec<_> = (0..w.inflight)
            .map(|i| {
                let gate = &gate;
                scope.spawn(move || {
                    let mut c = Conn::open_ready(addr);
                    if gate.wait().is_leader() {
                        meter.start();
                    }
                    let s = match &mut c {
                        Ok(c) => conn_loop(c, op, (rows, table_rows), addr, i as u64, time),
                        Err(e) => Err(e.clone()),
                    };
                    if gate.wait().is_leader() {
                        meter.stop();
                    }
                    s
                })
            })
            .collect();
        let mut total = Sample::default();
        for t in threads {
            total.merge(&t.join().map_err(|_| "client thread panicked")??);
        }
        Ok(total)
    })
}

/// Keeps requests going over `c` for `time` (over a new connection to `addr` where `c`
/// breaks). `rows`: ids per request of the rows workloads, and the rows of their table.
fn conn_loop(
    c: &mut Conn,
    op: Op,
    (rows, table_rows): (usize, u64),
    addr: SocketAddr,
    seed: u64,
    time: Duration,
) -> Result<Sample, String> {
    // The gradient rows, which every rows push copies into its message.
    let grad = if op == Op::RowsPush {
        grad_block(rows)
    } else {
        Vec::new()
    };
    let mut s = Sample::default();
    let mut ids = Vec::new();
    let mut n = seed * 7919;
    let mut wk = (op == Op::Step).then(|| StepWorker::new(seed));
    let start = Instant::now();
    let end = start + time;
    while Instant::now() < end {
        let t0 = Instant::now();
        let ok = match op {
            Op::Ping => {
                c.start(PING);
                c.out.extend_from_slice(&[7; PING_BYTES]);
                c.call().is_ok() && c.reply.len() == PING_BYTES
            }
            Op::Pull | Op::PullBig => {
                if op == Op::Pull {
                    ids_for(n, &mut ids);
                } else {
                    ids.clear();
                    ids.push(BIG_ID);
                }
                c.pull(&ids).is_ok() && {
                    let mut got = 0;
                    let all = ids.iter().zip(c.tensors()).all(|(&id, t)| {
                        got += 1;
                        t.is_some_and(|t| check_fixed(id, t))
                    });
                    all && got == ids.len()
                }
            }
            Op::Push => {
                c.start(PUSH);
                c.out.extend_from_slice(&(IDS as u32).to_le_bytes());
                for i in 0..IDS as u64 {
                    c.out.extend_from_slice(&i.to_le_bytes());
                    c.out.extend_from_slice(&(ROW_BYTES as u32).to_le_bytes());
                    c.out.extend_from_slice(&[i as u8; ROW_BYTES]);
                }
                c.call().is_ok() && c.push_all_ok(IDS)
            }
            Op::Step => {
                let wk = wk.as_mut().unwrap();
                wk.next_batch();
                let mut ok = c.pull(&wk.ids).is_ok();
                let mut got = 0;
                if ok {
                    for (i, t) in c.tensors().enumerate() {
                        ok &= t.is_some_and(|t| wk.set_row(i, t));
                        got += 1;
                    }
                }
                if ok && got == wk.ids.len() {
                    wk.compute();
                    let dim4 = wk.cfg.dim * 4;
                    c.start(PUSH);
                    c.out
                        .extend_from_slice(&(wk.ids.len() as u32).to_le_bytes());
                    for (i, id) in wk.ids.iter().enumerate() {
                        c.out.extend_from_slice(&id.to_le_bytes());
                        c.out.extend_from_slice(&(dim4 as u32).to_le_bytes());
                        let at = c.out.len();
                        c.out.resize(at + dim4, 0);
                        wk.grad_bytes(i, &mut c.out[at..]);
                    }
                    c.call().is_ok() && c.push_all_ok(wk.ids.len())
                } else {
                    false
                }
            }
            Op::RowsPull => {
                rows_ids(n, rows, table_rows, &mut ids);
                c.rows(ROWS_PULL, &ids, &[]).is_ok() && c.rows_pulled(&ids)
            }
            Op::RowsPush => {
                rows_ids(n, rows, table_rows, &mut ids);
                c.rows(ROWS_PUSH, &ids, &grad).is_ok() && c.reply == 0u32.to_le_bytes()
            }
        };
        n += 1;
        if ok {
            s.ops += 1;
            s.latency.record(t0.elapsed());
        } else {
            s.failed += 1;
            // A broken connection: open a new one.
            *c = Conn::open(addr)?;
        }
    }
    s.elapsed = start.elapsed();
    Ok(s)
}
