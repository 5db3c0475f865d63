//! `CHECKPOINT` in memory: refused with the reason when checkpoints are off, handed to the
//! upkeep thread otherwise, its manifest or its failure answered to the requester, counted
//! under its own kind on both sides.

use std::sync::mpsc::TryRecvError;

use super::metrics::metrics;
use super::*;
use crate::pool::Answer;
use crate::stats::{Outcome, RequestKind};
use crate::upkeep::Checkpoints;
use crate::wire::Status;
use crate::ErrorKind;

#[test]
fn a_task_without_checkpoints_refuses_with_its_reason() {
    let mut p = Pair::new();
    p.submit(RequestOp::Checkpoint, None);
    p.drain();
    p.pump();
    let done = p.completions();
    let e = done[0].result.as_ref().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Remote(Status::Unimplemented));
    assert_eq!(e.remote_message(), Some("no tables"));
    let served = metrics(&p.server);
    let op = served
        .served("worker:0")
        .unwrap()
        .op(RequestKind::Checkpoint);
    assert_eq!((op.requests, op.outcome(Outcome::Refused)), (1, 1));
}

#[test]
fn a_checkpoint_goes_to_the_upkeep_thread_and_its_manifest_comes_back() {
    let mut p = Pair::new();
    let (checkpoints, asked) = Checkpoints::channel(1);
    p.server.server.set_checkpoints(checkpoints);
    let first = p.submit(RequestOp::Checkpoint, None);
    let second = p.submit(RequestOp::Checkpoint, None);
    let third = p.submit(RequestOp::Checkpoint, None);
    p.drain();
    p.pump();
    // One place in the queue: the first is taken, the two others are refused at once.
    let to = asked.try_recv().expect("the first is handed over");
    assert_eq!(asked.try_recv().unwrap_err(), TryRecvError::Empty);
    let done = p.completions();
    let tags: Vec<u64> = done.iter().map(|c| c.tag).collect();
    assert_eq!(tags, [second, third]);
    for c in &done {
        let e = c.result.as_ref().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Remote(Status::Unavailable));
        assert!(e.remote_message().unwrap().contains("in progress"), "{e}");
    }
    // The thread's answer: the manifest, as the requester's result.
    let manifest = br#"{"format":"starwire-checkpoint","version":1}"#.to_vec();
    p.server.take_answer(Answer::Checkpoint {
        to,
        result: Ok(manifest.clone()),
    });
    p.pump();
    let mut done = p.completions();
    assert_eq!(done.len(), 1);
    let c = done.pop().unwrap();
    assert_eq!(c.tag, first);
    assert_eq!(c.into_checkpoint_manifest().unwrap().as_bytes(), manifest);

    // A failure: the status and the message, whole.
    let fourth = p.submit(RequestOp::Checkpoint, None);
    p.drain();
    p.pump();
    let to = asked.try_recv().expect("handed over");
    let why = "checkpoint into /x failed: table 2: disk full".to_owned();
    p.server.take_answer(Answer::Checkpoint {
        to,
        result: Err((Status::Internal, why.clone())),
    });
    p.pump();
    let done = p.completions();
    assert_eq!(done[0].tag, fourth);
    let e = done[0].result.as_ref().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Remote(Status::Internal));
    assert_eq!(e.remote_message(), Some(why.as_str()));

    let m = metrics(&p.client);
    let op = m
        .client(PEER.parse().unwrap())
        .unwrap()
        .op(RequestKind::Checkpoint);
    assert_eq!(op.requests, 4);
    assert_eq!(op.outcome(Outcome::Ok), 1);
    let served = metrics(&p.server);
    let op = served
        .served("worker:0")
        .unwrap()
        .op(RequestKind::Checkpoint);
    assert_eq!(
        (
            op.requests,
            op.outcome(Outcome::Ok),
            op.outcome(Outcome::Refused)
        ),
        (4, 2, 2)
    );
}
