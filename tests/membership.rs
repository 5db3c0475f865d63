//! Membership changes at run time, over real sockets: a PS restarted on another port while
//! a worker keeps stepping (the steps during the move fail cleanly for that PS alone, the
//! steps after the update reach it at its new address), requests to a retired address
//! failing at once, and a moved task's old connection drained and then closed.

mod common;

use common::*;
use starwire::cluster::endpoint_map::EndpointMap;
use starwire::cluster::{ClusterSpec, TaskId};
use starwire::rows::{Init, MemTable, Optimizer, Tables};
use starwire::rows::{Partition, Rows};
use starwire::{
    DType, ErrorKind, Options, Peer, Resolver, Runtime, Service, Sharded, Status, Table,
};
use std::net::SocketAddr;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

const DIM: usize = 4;

fn ps_with(service: Arc<dyn Service>) -> (Runtime, SocketAddr) {
    let options = Options {
        service: Some(service),
        ..Options::listen("127.0.0.1:0".parse().unwrap())
    };
    let rt = Runtime::start_with(config("ps", 1).build().unwrap(), options).expect("ps starts");
    let addr = rt.local_addr().unwrap();
    (rt, addr)
}

fn ps() -> (Runtime, SocketAddr) {
    let table = Arc::new(MemTable::new(DIM, Init::Zeros, Optimizer::Sgd { lr: 1.0 }));
    ps_with(Arc::new(Tables::new().with(1, table)))
}

/// The cluster as the job sees it: the spec names the PS tasks by fixed control
/// addresses; the endpoint map says where each one's starwire listens now.
fn resolver(ps: &[SocketAddr]) -> Resolver {
    let control: Vec<String> = (0..ps.len())
        .map(|i| format!("127.0.0.2:{}", 3000 + i))
        .collect();
    let mut spec = ClusterSpec::new();
    spec.add_job("ps", &control.join(",")).unwrap();
    spec.add_job("worker", "127.0.0.2:4000").unwrap();
    let text: String = control
        .iter()
        .zip(ps)
        .map(|(c, d)| format!("{c}={d}\n"))
        .collect();
    let map = EndpointMap::parse(".endpoint_map", text.as_bytes()).unwrap();
    Resolver::from_spec(&spec, &map)
}

/// Pushes a gradient of 1.0 for every id, then pulls them: returns the report of each.
fn step(
    sharded: &mut Sharded,
    h: &mut starwire::Handle,
    ids: &[u64],
    out: &mut [u8],
) -> (Vec<bool>, Vec<bool>) {
    let grads: Vec<u8> = (0..ids.len() * DIM)
        .flat_map(|_| 1f32.to_le_bytes())
        .collect();
    let pushed = sharded.push(h, ids, &grads, secs(30)).unwrap();
    let pushed: Vec<bool> = pushed.shards.iter().map(Result::is_ok).collect();
    let pulled = sharded.pull(h, ids, out, secs(30)).unwrap();
    let pulled = pulled.shards.iter().map(Result::is_ok).collect();
    (pushed, pulled)
}

fn row(out: &[u8], i: usize) -> Vec<f32> {
    out[i * DIM * 4..(i + 1) * DIM * 4]
        .chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn a_ps_restarted_on_another_port_is_reached_again_after_the_update() {
    let (ps0, a) = ps();
    let (ps1, b) = ps();
    let worker = client(1);
    let mut h = worker.handle(16);
    let before = resolver(&[a, b]);
    let ids: Vec<u64> = (0..8).collect();
    let mut out = vec![0u8; ids.len() * DIM * 4];
    let mut sharded = Sharded::new(
        before.peers("ps").unwrap(),
        Partition::Mod,
        1,
        DType::F32,
        &[DIM as u64],
    )
    .unwrap();
    assert_eq!(
        step(&mut sharded, &mut h, &ids, &mut out),
        (vec![true, true], vec![true, true])
    );
    assert_eq!(row(&out, 1), [-1.0; DIM], "SGD with lr 1 from zeros");

    // ps:1 goes away and comes back on another port: steps meanwhile fail for it alone.
    drop(ps1);
    let (_ps1, c) = ps();
    let (pushed, pulled) = step(&mut sharded, &mut h, &ids, &mut out);
    assert_eq!((pushed, pulled), (vec![true, false], vec![true, false]));
    assert_eq!(row(&out, 0), [-2.0; DIM], "ps:0's rows go on");

    // The update: ps:1 moved from b to c.
    let after = resolver(&[a, c]);
    let change = worker.update_cluster(&before, &after).unwrap();
    assert_eq!(
        change.moved,
        [(TaskId::new("ps", 1), Peer::new(b), Peer::new(c))]
    );
    assert!(change.added.is_empty() && change.removed.is_empty());
    // A request still addressed to the old address fails at once, saying where it went.
    let t = h.ping(b, 8, secs(30)).unwrap();
    let e = h.wait(t).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotInCluster);
    let msg = e.remote_message().unwrap_or_default().to_owned();
    assert!(
        msg.contains("ps:1") && msg.contains(&c.to_string()),
        "{msg}"
    );

    // The sharded client over the new list: every step reaches both PS again. ps:1 is a
    // new process: its rows start from zero.
    sharded.set_peers(after.peers("ps").unwrap()).unwrap();
    for k in 1..=3 {
        assert_eq!(
            step(&mut sharded, &mut h, &ids, &mut out),
            (vec![true, true], vec![true, true])
        );
        assert_eq!(row(&out, 0), [-2.0 - k as f32; DIM]);
        assert_eq!(row(&out, 1), [-(k as f32); DIM]);
    }
    drop(ps0);
}

/// A table whose pulls wait until the gate opens, counting the pulls that entered.
struct Gate {
    dims: [u64; 1],
    open: Mutex<(bool, usize)>,
    cv: Condvar,
}

impl Table for Gate {
    fn dtype(&self) -> DType {
        DType::U8
    }
    fn row_dims(&self) -> &[u64] {
        &self.dims
    }
    fn pull(&self, ids: &[u64], out: &mut [u8], _missing: &mut Vec<u32>) -> Status {
        let mut g = self.open.lock().unwrap();
        g.1 += 1;
        self.cv.notify_all();
        while !g.0 {
            g = self.cv.wait(g).unwrap();
        }
        out.fill(ids.len() as u8);
        Status::Ok
    }
    fn push(&self, _ids: &[u64], _grads: &[u8]) -> Status {
        Status::Ok
    }
}

struct GatePs(Arc<Gate>);

/// Opens the gate when the test ends, failed or not, so the PS can stop.
struct OpenOnDrop(Arc<Gate>);

impl Drop for OpenOnDrop {
    fn drop(&mut self) {
        let mut g = self.0.open.lock().unwrap_or_else(|p| p.into_inner());
        g.0 = true;
        self.0.cv.notify_all();
    }
}

impl Service for GatePs {
    fn table(&self, table: u32) -> Option<&dyn Table> {
        (table == 1).then_some(&*self.0 as &dyn Table)
    }
}

#[test]
fn a_moved_tasks_old_connection_finishes_its_requests_then_closes() {
    let gate = Arc::new(Gate {
        dims: [8],
        open: Mutex::new((false, 0)),
        cv: Condvar::new(),
    });
    let (old, a) = ps_with(Arc::new(GatePs(gate.clone())));
    let _open = OpenOnDrop(gate.clone());
    let (_new, d) = ps();
    let worker = client(1);
    let mut h = worker.handle(16);
    let before = resolver(&[a]);
    let ids = [1u64, 2, 3];
    let t = h
        .pull_rows(a, &[Rows::new(1, DType::U8, &[8], &ids)], secs(60))
        .unwrap();
    // The pull is at the old PS, held by its table.
    {
        let mut g = gate.open.lock().unwrap();
        while g.1 == 0 {
            g = gate.cv.wait(g).unwrap();
        }
    }
    let ended = |rt: &Runtime| rt.stats().connections_lost + rt.stats().connections_closed;
    let ended_before = ended(&old);
    let change = worker.update_cluster(&before, &resolver(&[d])).unwrap();
    assert_eq!(change.moved.len(), 1, "{change}");
    // New requests to the old address are refused at once...
    let p = h.ping(a, 8, secs(30)).unwrap();
    assert_eq!(h.wait(p).unwrap_err().kind(), ErrorKind::NotInCluster);
    // ... while the one in flight there finishes.
    {
        let mut g = gate.open.lock().unwrap();
        g.0 = true;
        gate.cv.notify_all();
    }
    let rows = h.wait(t).unwrap();
    assert!(rows.row(0, 2).unwrap().iter().all(|&b| b == 3));
    // Then the drained connection is closed: the old PS sees it go.
    let until = Instant::now() + Duration::from_secs(30);
    while ended(&old) == ended_before && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(ended(&old), ended_before + 1);
    // The task at its new address answers.
    let p = h.ping(d, 8, secs(30)).unwrap();
    assert!(h.wait(p).is_ok());
}

#[test]
fn a_removed_task_fails_requests_with_a_clear_error_and_an_unchanged_cluster_changes_nothing() {
    let (_ps0, a) = ps();
    let (_ps1, b) = ps();
    let worker = client(1);
    let mut h = worker.handle(16);
    let both = resolver(&[a, b]);
    assert!(worker.update_cluster(&both, &both).unwrap().is_empty());
    assert!(ping_once(&worker, b, secs(30)).is_ok());
    let change = worker.update_cluster(&both, &resolver(&[a])).unwrap();
    assert_eq!(change.removed, [(TaskId::new("ps", 1), Peer::new(b))]);
    let t = h.ping(b, 8, secs(30)).unwrap();
    let e = h.wait(t).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotInCluster);
    assert!(
        e.remote_message().unwrap_or_default().contains("removed"),
        "{e}"
    );
    assert!(
        ping_once(&worker, a, secs(30)).is_ok(),
        "other tasks are unaffected"
    );
    // Back in the cluster: reachable again.
    worker.update_cluster(&resolver(&[a]), &both).unwrap();
    assert!(ping_once(&worker, b, secs(30)).is_ok());
}

#[test]
fn an_embedded_client_takes_cluster_changes_too() {
    let (_ps0, a) = ps();
    let (_ps1, b) = ps();
    let mut e = starwire::Embedded::new(config("worker", 1).build().unwrap(), None).unwrap();
    let both = resolver(&[a, b]);
    let t = e.ping(b, 8, secs(30)).unwrap();
    assert!(e.wait(t).is_ok());
    let change = e.update_cluster(&both, &resolver(&[a])).unwrap();
    assert_eq!(change.removed.len(), 1);
    let t = e.ping(b, 8, secs(30)).unwrap();
    assert_eq!(e.wait(t).unwrap_err().kind(), ErrorKind::NotInCluster);
    let t = e.ping(a, 8, secs(30)).unwrap();
    assert!(e.wait(t).is_ok());
}
