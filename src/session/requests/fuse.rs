//! Fusing the single-key recvs of one drain pass: one `FUSED_RECV` per peer, lane and step.
//! Nothing waits for a timer: what arrived in the same pass goes out together.

use super::super::reply::Spare;
use super::super::request::{FusedMember, Request, RequestOp, Submitter};

/// Groups the recvs in `held` (emptied) by peer, lane and step, and hands each group to
/// `start`: a lone recv as it is, several as one recv of all their keys with the
/// originals as its members (each keeps its own deadline; the group has none).
pub(crate) fn fuse(
    held: &mut Vec<(Request, Submitter)>,
    mut start: impl FnMut(Request, Submitter, Vec<FusedMember>),
) {
    let step_of = |r: &Request| match &r.op {
        RequestOp::Recv { step, .. } => *step,
        _ => 0,
    };
    held.sort_by_key(|(r, _)| (r.peer, r.lane, step_of(r)));
    let mut rest = held.drain(..).peekable();
    while let Some((first, submitter)) = rest.next() {
        let key = (first.peer, first.lane, step_of(&first));
        let mut group = Vec::new();
        while let Some((r, _)) = rest.peek() {
            if (r.peer, r.lane, step_of(r)) != key {
                break;
            }
            group.extend(rest.next());
        }
        if group.is_empty() {
            start(first, submitter, Vec::new());
            continue;
        }
        let member = |submitter, r: &Request| FusedMember {
            submitter,
            tag: r.tag,
            deadline: r.deadline,
            done: false,
            cancel_sent: false,
        };
        let mut members = vec![member(submitter, &first)];
        let RequestOp::Recv { step, mut keys } = first.op else {
            continue;
        };
        for (r, s) in group {
            members.push(member(s, &r));
            if let RequestOp::Recv { keys: k, .. } = r.op {
                keys.extend(k);
            }
        }
        let fused = Request {
            op: RequestOp::Recv { step, keys },
            peer: key.0,
            task: first.task,
            lane: key.1,
            deadline: None,
            tag: 0,
            spare: Spare::default(),
            trace: first.trace,
        };
        start(fused, Submitter::Local, members);
    }
}
