//! The serving side: the peer's requests answered by the service (inline on the loop, or
//! on the handler pool), by the rendezvous ([`recv`]), or by the loop itself (`STATS`),
//! and the pushes it receives, applied once whole.

mod recv;

use std::collections::VecDeque;
use std::sync::mpsc::{SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use slab::Slab;

use crate::pool::{apply_push, Answer, Job, PushScratch, ReplyTo};
use crate::proto::{Encoder, Frame, ResponseItem};
use crate::rendezvous::Rendezvous;
use crate::service::{self, SharedService};
use crate::stats::{Outcome, RequestKind};
use crate::tensor::{SharedAllocator, Tensor, TensorAllocator};
use crate::upkeep::Checkpoints;
use crate::wire::{Body, DType, Status, VarIds, WireFeatures};

use super::budget::{ConnBudget, Reservation};
use super::conn::Conn;
use super::observer::{served_kind, Observer};
use super::push::{IncomingPush, PushVecs, Served, ServedRecv};
use super::refusal::{answer_statuses, push_refusals, Refusal, Verb};
use super::reply::keep_memory;
use super::respond::{answer_pull, answer_push};
use super::rows::{self, RowsScratch};
use super::timer::Timers;
use super::violation::Violation;

/// What the session serves and how it receives tensors.
#[derive(Clone)]
pub(crate) struct SessionParts {
    pub service: Option<SharedService>,
    pub rendezvous: Option<Arc<Rendezvous>>,
    /// Where heavy handlers run; `None`: inline on the loop.
    pub jobs: Option<std::sync::mpsc::SyncSender<Job>>,
    /// The loop's position among the runtime's loops (rendezvous waiters and pool answers
    /// find their way back by it).
    pub index: usize,
    pub allocator: SharedAllocator,
    /// Payload at least this long is received straight into its tensor.
    pub zero_copy_min: u64,
    /// Where checkpoint requests go; `None`: refused, for the reason in
    /// [`SessionParts::no_checkpoints`].
    pub checkpoints: Option<Checkpoints>,
    /// Why a checkpoint request is refused when `checkpoints` is `None`.
    pub no_checkpoints: &'static str,
    /// The task's receive budget, shared by its loops.
    pub budget: Arc<super::budget::Budget>,
}

/// Most sets of push vectors a loop keeps for reuse.
const PUSH_VECS_KEPT: usize = 64;

/// A connection as the server sees it while serving the requests it decodes.
pub(crate) struct Serving<'a> {
    pub slot: u32,
    pub generation: u32,
    /// Its peer's index in the observer's table.
    pub peer: u32,
    pub enc: &'a mut Encoder,
    /// Tensors the encoder references until written.
    pub out: &'a mut Slab<Arc<Tensor>>,
    pub served: &'a mut Served,
    /// Its account of the receive budget, and the answer memory charged to it.
    pub budget: &'a ConnBudget,
    pub held: &'a mut Vec<(u64, Reservation)>,
    pub now: Instant,
}

/// Vectors the serving side reuses from request to request, so that answering allocates
/// nothing in steady state.
#[derive(Default)]
struct ServeScratch {
    rows: RowsScratch,
    ids: Vec<u64>,
    pulled: Vec<Result<Arc<Tensor>, Status>>,
    tokens: Vec<Option<u64>>,
    items: Vec<ResponseItem<'static>>,
    statuses: Vec<Status>,
    push: PushScratch,
    refusals: Vec<Refusal>,
    /// Vectors of finished pushes, for the next ones (at most `PUSH_VECS_KEPT`).
    push_vecs: Vec<PushVecs>,
}

/// What the loop serves, and how.
pub(crate) struct Server {
    service: Option<SharedService>,
    rendezvous: Option<Arc<Rendezvous>>,
    /// Where heavy handlers run; `None`: inline on the loop.
    jobs: Option<SyncSender<Job>>,
    /// The loop's position among the runtime's loops (rendezvous waiters and pool answers
    /// find their way back by it).
    index: usize,
    scratch: ServeScratch,
    /// This task's name (`job:index`) for stats answers; `None`: the stats endpoint is off.
    stats_task: Option<String>,
    /// Requests a peer may have waiting on one connection.
    max_served: usize,
    /// Recvs of released connections whose waiters are still to be taken out of the
    /// rendezvous: the connection's loop, slot and generation, the recv, its next key.
    forgetting: VecDeque<((usize, u32, u32), ServedRecv, usize)>,
    /// Where checkpoint requests go, or why they are refused.
    checkpoints: Result<Checkpoints, &'static str>,
}

impl Server {
    pub(crate) fn new(
        service: Option<SharedService>,
        rendezvous: Option<Arc<Rendezvous>>,
        jobs: Option<SyncSender<Job>>,
        index: usize,
        stats_task: Option<String>,
        max_served: usize,
        checkpoints: Result<Checkpoints, &'static str>,
    ) -> Server {
        Server {
            service,
            rendezvous,
            jobs,
            index,
            scratch: ServeScratch::default(),
            stats_task,
            max_served,
            forgetting: VecDeque::new(),
            checkpoints,
        }
    }

    /// Where a pool answer for the peer's request `handle` on `c` goes.
    fn reply_to(&self, c: &Serving<'_>, handle: u64) -> ReplyTo {
        ReplyTo {
            loop_index: self.index,
            conn: c.slot,
            generation: c.generation,
            handle,
        }
    }

    /// A request frame of the peer: answered now, handed to the pool, left waiting in the
    /// rendezvous, or (a push) received until whole.
    pub(crate) fn on_request(
        &mut self,
        c: &mut Serving<'_>,
        f: &Frame<'_>,
        alloc: &dyn TensorAllocator,
        timers: &mut Timers,
        observer: &Observer,
    ) -> Result<(), Violation> {
        let h = f.header.handle;
        let request = matches!(
            f.body,
            Body::Pull(_)
                | Body::Push(_)
                | Body::Recv(_)
                | Body::FusedRecv(_)
                | Body::PullRows(_)
                | Body::PushRows(_)
        );
        if request && c.served.len() >= self.max_served {
            // A peer may not pile up unanswered requests without limit. Its payload, if
            // any, is still read and dropped.
            let _ = c
                .enc
                .error(h, Status::ResourceExhausted, "too many requests");
            if let Some(kind) = served_kind(f.header.kind) {
                observer.served(c.peer, kind, Outcome::Refused, None);
            }
            return Ok(());
        }
        match f.body {
            Body::Cancel(items) => self.on_cancel(c, h, items, observer),
            Body::Stats => self.serve_stats(c, h, observer),
            Body::Checkpoint => self.serve_checkpoint(c, h, observer),
            Body::Pull(ids) => self.serve_pull(c, h, ids, observer),
            Body::PullRows(tables) => {
                let Some(service) = self.service.as_deref() else {
                    let _ = c.enc.error(h, Status::Unimplemented, "no rows service");
                    observer.served(c.peer, RequestKind::PullRows, Outcome::Error, None);
                    return Ok(());
                };
                // Counted when answered here or handed to the pool (whose answer is not
                // seen here).
                observer.served(c.peer, RequestKind::PullRows, Outcome::Ok, None);
                // A request with a table refused for a reason the server can say is served
                // here, where the words can be sent.
                let convert = c.enc.features().contains(WireFeatures::ROW_FORMATS);
                let pooled = self.jobs.as_ref();
                let refused = rows::any_refused(service, Verb::Pull, tables, convert);
                // Tables whose requester holds versions are served here too.
                let versioned = tables.into_iter().any(|t| t.has_held());
                let pooled = pooled.filter(|_| !refused && !versioned);
                if let Some(jobs) = pooled {
                    // The blocks are made on the pool: charged before they are.
                    let bytes = tables.map(|t| t.block.byte_len).sum();
                    let Ok(reserved) = c.budget.reserve(bytes) else {
                        let why = "rows answer over the receive budget";
                        let _ = c.enc.error(h, Status::ResourceExhausted, why);
                        return Ok(());
                    };
                    let job = Job::PullRows {
                        to: self.reply_to(c, h),
                        tables: rows::pull_job(tables, convert),
                    };
                    if refuse_if_unsent(jobs.try_send(job), c.enc, h) {
                        c.served.producing.push((h, reserved));
                    }
                    return Ok(());
                }
                let s = &mut self.scratch.rows;
                rows::serve_pull(service, tables, c.enc, c.out, h, s, c.budget, c.held);
            }
            Body::Push(_) | Body::PushRows(_) => {
                if c.served.push_mut(h).is_some() {
                    let kind = f.header.kind;
                    return Err(Violation::HandleInUse { handle: h, kind });
                }
                let spare = self.scratch.push_vecs.pop().unwrap_or_default();
                let mut push = match f.body {
                    Body::Push(entries) => IncomingPush::new(h, entries, alloc, spare, c.now),
                    Body::PushRows(tables) => IncomingPush::rows(h, tables, alloc, spare, c.now),
                    _ => return Ok(()),
                };
                push.deadline = deadline_of(c.now, f.header.timeout_ms);
                c.served.pushes.push(push);
            }
            Body::Recv(r) | Body::FusedRecv(r) => {
                return self.serve_recv(c, &f.header, r, timers, observer);
            }
            _ => {}
        }
        Ok(())
    }

    fn serve_pull(
        &mut self,
        c: &mut Serving<'_>,
        handle: u64,
        ids: VarIds<'_>,
        observer: &Observer,
    ) {
        let Some(service) = self.service.as_deref() else {
            let _ = c
                .enc
                .error(handle, Status::Unimplemented, "no pull service");
            observer.served(c.peer, RequestKind::Pull, Outcome::Error, None);
            return;
        };
        if let Some(jobs) = &self.jobs {
            let to = self.reply_to(c, handle);
            let ids = ids.iter().collect();
            let sent = refuse_if_unsent(jobs.try_send(Job::Pull { to, ids }), c.enc, handle);
            let outcome = if sent { Outcome::Ok } else { Outcome::Refused };
            observer.served(c.peer, RequestKind::Pull, outcome, None);
            return;
        }
        observer.served(c.peer, RequestKind::Pull, Outcome::Ok, None);
        let s = &mut self.scratch;
        s.ids.clear();
        s.ids.extend(ids.iter());
        service::pull(service, &s.ids, &mut s.pulled);
        answer_pull(c.enc, c.out, handle, &s.pulled, &mut s.tokens, &mut s.items);
        s.pulled.clear();
    }

    /// Answers a `STATS` request: one `RESPONSE` entry whose tensor (dtype `U8`, rank 1)
    /// holds the JSON document; `UNIMPLEMENTED` when the endpoint is off.
    fn serve_stats(&mut self, c: &mut Serving<'_>, handle: u64, observer: &Observer) {
        // Counted once answered, so that the document does not show itself in flight.
        let Some(task) = &self.stats_task else {
            observer.started(c.peer, RequestKind::Stats, 0, 0);
            let _ = c
                .enc
                .error(handle, Status::Unimplemented, "stats endpoint disabled");
            observer.served(c.peer, RequestKind::Stats, Outcome::Error, None);
            return;
        };
        let tables = (self.service.as_deref())
            .map(service::table_metrics)
            .unwrap_or_default();
        let mut doc = observer.stats_document(task, &tables).into_bytes();
        doc.shrink_to_fit();
        observer.started(c.peer, RequestKind::Stats, 0, 0);
        // The document is larger than the request: charged to the receive budget until it
        // is written.
        let Ok(reserved) = c.budget.reserve(doc.capacity() as u64) else {
            let why = "stats document over the receive budget";
            let _ = c.enc.error(handle, Status::ResourceExhausted, why);
            observer.served(c.peer, RequestKind::Stats, Outcome::Refused, None);
            return;
        };
        let result = Tensor::from_bytes(DType::U8, &[doc.len() as u64], doc)
            .map(Arc::new)
            .map_err(|_| Status::Internal);
        let s = &mut self.scratch;
        answer_pull(c.enc, c.out, handle, &[result], &mut s.tokens, &mut s.items);
        if let Some(&Some(token)) = s.tokens.first() {
            c.held.push((token, reserved));
        }
        observer.served(c.peer, RequestKind::Stats, Outcome::Ok, None);
    }

    /// Checkpoint requests go to `checkpoints` from now on.
    #[cfg(test)]
    pub(crate) fn set_checkpoints(&mut self, checkpoints: Checkpoints) {
        self.checkpoints = Ok(checkpoints);
    }

    /// Asks the upkeep thread to save the tables; it answers through
    /// [`take_answer`](Self::take_answer). Refused at once when checkpoints are off.
    fn serve_checkpoint(&mut self, c: &mut Serving<'_>, handle: u64, observer: &Observer) {
        let asked = match &self.checkpoints {
            Ok(checkpoints) => checkpoints.ask(self.reply_to(c, handle)),
            Err(why) => Err((Status::Unimplemented, *why)),
        };
        let outcome = match asked {
            Ok(()) => Outcome::Ok,
            Err((status, why)) => {
                let _ = c.enc.error(handle, status, why);
                Outcome::Refused
            }
        };
        observer.served(c.peer, RequestKind::Checkpoint, outcome, None);
    }

    /// The frame of the peer's push `handle` is in: applied and answered if it is whole.
    pub(crate) fn on_push_end(&mut self, c: &mut Serving<'_>, handle: u64, observer: &Observer) {
        if let Some(p) = c.served.push_mut(handle) {
            p.frame_done();
        }
        self.finish_push(c, handle, observer);
    }

    /// Chunk bytes of item `index` of the peer's push `handle` up to `end` arrived.
    pub(crate) fn on_chunk(
        &mut self,
        c: &mut Serving<'_>,
        handle: u64,
        index: u32,
        end: u64,
        observer: &Observer,
    ) {
        if let Some(p) = c.served.push_mut(handle) {
            p.chunk_progress(index, end);
            self.finish_push(c, handle, observer);
        }
    }

    /// Applies the peer's push `handle` if completely received, and answers it.
    fn finish_push(&mut self, c: &mut Serving<'_>, handle: u64, observer: &Observer) {
        let pushes = &mut c.served.pushes;
        let Some(i) = pushes
            .iter()
            .position(|p| p.handle == handle && p.is_complete())
        else {
            return;
        };
        let push = pushes.swap_remove(i);
        let kind = push.kind();
        let took = c.now.saturating_duration_since(push.arrived);
        let end = |o: Outcome| {
            let took = (o == Outcome::Ok).then_some(took);
            observer.served(c.peer, kind, o, took);
        };
        let late = push.deadline.is_some_and(|d| c.now > d);
        if push.cancelled || late {
            end(Outcome::Timeout);
        }
        if push.cancelled {
            // The requester gave it up: dropped unanswered.
            return self.recycle(push);
        }
        if late {
            // Whole only after the requester stopped waiting: not applied.
            let why = "push complete after its deadline";
            let _ = c.enc.error(handle, Status::DeadlineExceeded, why);
            return self.recycle(push);
        }
        let s = &mut self.scratch;
        let Some(service) = self.service.as_deref() else {
            end(Outcome::Error);
            s.statuses.clear();
            s.statuses.resize(push.len(), Status::Unimplemented);
            return answer_push(c.enc, handle, &s.statuses, &mut s.items);
        };
        let PushVecs {
            ids,
            mut results,
            rows,
            mut memory,
        } = push.into_parts();
        // Tables refused for a reason the server can say: answered here, with the words.
        let convert = c.enc.features().contains(WireFeatures::ROW_FORMATS);
        if rows.is_rows() {
            push_refusals(service, &ids, &results, &mut s.refusals, convert);
        } else {
            s.refusals.clear();
        }
        if let Some(jobs) = self.jobs.as_ref().filter(|_| s.refusals.is_empty()) {
            let to = self.reply_to(c, handle);
            let job = if rows.is_rows() {
                Job::PushRows {
                    to,
                    tables: ids,
                    blocks: results,
                    ids: rows.ids,
                    ends: rows.ends,
                    scales: rows.scales,
                    convert,
                }
            } else {
                Job::Push { to, ids, results }
            };
            let sent = refuse_if_unsent(jobs.try_send(job), c.enc, handle);
            // A rows push handed over counts as served whatever the pool does with it.
            let taken = sent || kind == RequestKind::PushRows;
            end(if taken { Outcome::Ok } else { Outcome::Refused });
            return;
        }
        if rows.is_rows() {
            let wide = &mut s.rows.wide;
            rows::apply_push(
                service,
                &ids,
                &results,
                &rows,
                &mut s.statuses,
                convert,
                wide,
            );
            answer_statuses(c.enc, handle, &s.statuses, &s.refusals, &mut s.items);
            // The blocks were applied: their memory takes the next push's blocks.
            keep_memory(&mut results, &mut memory);
        } else {
            apply_push(service, &ids, &mut results, &mut s.statuses, &mut s.push);
            answer_push(c.enc, handle, &s.statuses, &mut s.items);
        }
        end(Outcome::Ok);
        if s.push_vecs.len() < PUSH_VECS_KEPT {
            s.push_vecs.push(PushVecs {
                ids,
                results,
                rows,
                memory,
            });
        }
    }

    /// Keeps the vectors of a push that is not applied, for the next one.
    fn recycle(&mut self, push: IncomingPush) {
        let mut parts = push.into_parts();
        parts.results.clear();
        if self.scratch.push_vecs.len() < PUSH_VECS_KEPT {
            self.scratch.push_vecs.push(parts);
        }
    }

    /// Sends a pool handler's answer on `conn` (its connection, still live).
    pub(crate) fn take_answer(&mut self, conn: &mut Conn, a: Answer) {
        let Conn {
            proto,
            out_tensors,
            served,
            held,
            ..
        } = conn;
        let enc = proto.encoder();
        let s = &mut self.scratch;
        match a {
            Answer::Pull { to, results } => answer_pull(
                enc,
                out_tensors,
                to.handle,
                &results,
                &mut s.tokens,
                &mut s.items,
            ),
            Answer::Push { to, statuses } => answer_push(enc, to.handle, &statuses, &mut s.items),
            Answer::PullRows { to, tables } => {
                let (tokens, items) = (&mut s.tokens, &mut s.items);
                rows::answer_pulled(enc, out_tensors, to.handle, &tables, tokens, items);
                // What the pool's blocks were charged stays charged until the last of them
                // is written.
                let producing = &mut served.producing;
                if let Some(at) = producing.iter().position(|(h, _)| *h == to.handle) {
                    let (_, reserved) = producing.swap_remove(at);
                    if let Some(&token) = tokens.iter().flatten().last() {
                        held.push((token, reserved));
                    }
                }
            }
            Answer::Checkpoint { to, result } => match result {
                Ok(doc) => {
                    let result = Tensor::from_bytes(DType::U8, &[doc.len() as u64], doc)
                        .map(Arc::new)
                        .map_err(|_| Status::Internal);
                    let (tokens, items) = (&mut s.tokens, &mut s.items);
                    answer_pull(enc, out_tensors, to.handle, &[result], tokens, items);
                }
                Err((status, why)) => {
                    let _ = enc.error(to.handle, status, &why);
                }
            },
        }
    }

    /// Connection `slot` (`conn`) is released: the peer's requests it was still serving
    /// (recvs waiting, pushes arriving) end unanswered. The waiters of its recvs are taken
    /// out of the rendezvous a bounded number at a time ([`forget_some`](Self::forget_some)),
    /// so that however many it left, no loop turn stalls on them.
    pub(crate) fn release(&mut self, slot: u32, conn: &mut Conn, observer: &Observer) {
        for r in &conn.served.recvs {
            observer.served(conn.peer, r.kind, Outcome::Unavailable, None);
        }
        for p in &conn.served.pushes {
            observer.served(conn.peer, p.kind(), Outcome::Unavailable, None);
        }
        let waiter = (self.index, slot, conn.generation);
        for recv in conn.served.recvs.drain(..) {
            self.forgetting.push_back((waiter, recv, 0));
        }
    }

    /// Takes up to `keys` waiters of released connections out of the rendezvous; returns
    /// whether it took any. Until then a tensor published for one of them goes to the
    /// loop, which finds the connection gone and puts the tensor back.
    pub(crate) fn forget_some(&mut self, keys: usize) -> bool {
        let Some(r) = self.rendezvous.as_deref() else {
            self.forgetting.clear();
            return false;
        };
        let mut done = 0;
        while done < keys {
            let Some((waiter, recv, next)) = self.forgetting.front_mut() else {
                break;
            };
            while *next < recv.len() && done < keys {
                r.forget(*waiter, recv.handle, recv.key(*next), None);
                *next += 1;
                done += 1;
            }
            if *next == recv.len() {
                // Its keys are forgotten: what it was charged is given back.
                self.forgetting.pop_front();
            }
        }
        done > 0
    }

    /// Whether waiters of released connections are still to be taken out.
    pub(crate) fn is_forgetting(&self) -> bool {
        !self.forgetting.is_empty()
    }
}

/// Answers a request the handler pool could not take; returns whether it took it.
fn refuse_if_unsent(r: Result<(), TrySendError<Job>>, enc: &mut Encoder, h: u64) -> bool {
    match r {
        Ok(()) => true,
        Err(TrySendError::Full(_)) => {
            let _ = enc.error(h, Status::ResourceExhausted, "handlers are behind; retry");
            false
        }
        Err(TrySendError::Disconnected(_)) => {
            let _ = enc.error(h, Status::Shutdown, "handler pool stopped");
            false
        }
    }
}

/// When a request that arrived `now` with `timeout_ms` stops being waited for.
fn deadline_of(now: Instant, timeout_ms: u32) -> Option<Instant> {
    (timeout_ms > 0).then(|| now + Duration::from_millis(timeout_ms.into()))
}
