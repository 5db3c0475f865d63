//! The serving side: requests from the peer answered by the service (inline, or on the
//! handler pool) or by the rendezvous, and the frames that carry the answers.

use std::sync::Arc;

use slab::Slab;

use crate::pool::{
    apply_rows, missing_is_ordered, table_for, Job, PushScratch, ReplyTo, RowsPull, RowsPulled,
};
use crate::proto::{Encoder, OutTensor, ResponseItem, COPY_TOKEN};
use crate::rendezvous::Waiter;
use crate::service::Service;
use crate::tensor::Tensor;
use crate::wire::{
    ItemIndexes, Missing, RecvBody, RowsTable, RowsTables, Status, TensorMeta, VarIds,
};

use super::conn::Conn;
use super::dispatch::Dispatch;
use super::metrics::served_end;
use super::out_tensor;
use super::reply::{keep_memory, PushVecs};
use crate::stats::{Outcome, RequestKind};

impl Dispatch<'_> {
    /// Applies a completely received push and answers it.
    pub(super) fn finish_push(&mut self, handle: u64, enc: &mut Encoder) {
        let Some(i) = self
            .incoming
            .iter()
            .position(|p| p.handle == handle && p.is_complete())
        else {
            return;
        };
        let push = self.incoming.swap_remove(i);
        let kind = match push.is_rows() {
            true => RequestKind::PushRows,
            false => RequestKind::Push,
        };
        let took = push.arrived.map(|a| self.now.saturating_duration_since(a));
        let end = |b: Option<&crate::stats::PeerBlock>, o: Outcome| {
            if let Some(b) = b {
                b.ended(kind, o, took.filter(|_| o == Outcome::Ok));
            }
        };
        if push.cancelled || push.deadline.is_some_and(|d| self.now > d) {
            end(self.metrics, Outcome::Timeout);
        }
        if push.cancelled {
            // The requester gave it up: dropped unanswered.
            return self.recycle(push);
        }
        if push.deadline.is_some_and(|d| self.now > d) {
            // Whole only after the requester stopped waiting: not applied.
            let _ = enc.error(
                handle,
                Status::DeadlineExceeded,
                "push complete after its deadline",
            );
            return self.recycle(push);
        }
        let s = &mut *self.serve;
        let Some(service) = self.service else {
            end(self.metrics, Outcome::Error);
            s.statuses.clear();
            s.statuses.resize(push.len(), Status::Unimplemented);
            return answer_push(enc, handle, &s.statuses, &mut s.items);
        };
        let PushVecs {
            ids,
            mut results,
            rows,
            mut memory,
        } = push.into_parts();
        if rows.is_rows() {
            if let Some(jobs) = self.jobs {
                let to = self.reply_to(handle);
                let job = Job::PushRows {
                    to,
                    tables: ids,
                    blocks: results,
                    ids: rows.ids,
                    ends: rows.ends,
                };
                end(self.metrics, Outcome::Ok);
                refuse_if_unsent(jobs.try_send(job), enc, handle);
                return;
            }
            s.statuses.clear();
            for (i, (table, block)) in ids.iter().zip(&results).enumerate() {
                let status = match block {
                    Ok(b) => apply_rows(service, *table as u32, rows.of(i), b),
                    Err(st) => *st,
                };
                s.statuses.push(status);
            }
            answer_push(enc, handle, &s.statuses, &mut s.items);
            end(self.metrics, Outcome::Ok);
            // The blocks were applied: their memory takes the next push's blocks.
            keep_memory(&mut results, &mut memory);
            if s.push_vecs.len() < PUSH_VECS_KEPT {
                s.push_vecs.push(PushVecs {
                    ids,
                    results,
                    rows,
                    memory,
                });
            }
            return;
        }
        if let Some(jobs) = self.jobs {
            let to = self.reply_to(handle);
            let job = Job::Push { to, ids, results };
            let sent = refuse_if_unsent(jobs.try_send(job), enc, handle);
            end(
                self.metrics,
                if sent { Outcome::Ok } else { Outcome::Refused },
            );
            return;
        }
        crate::pool::apply_push(service, &ids, &mut results, &mut s.statuses, &mut s.push);
        answer_push(enc, handle, &s.statuses, &mut s.items);
        end(self.metrics, Outcome::Ok);
        if s.push_vecs.len() < PUSH_VECS_KEPT {
            s.push_vecs.push(PushVecs {
                ids,
                results,
                rows,
                memory,
            });
        }
    }

    /// Answers a `PULL_ROWS`, one `RESPONSE` frame per table, `END` on the last: its block
    /// of rows in request order, written by the table straight into the frame; when rows
    /// are missing, the block and the report of them; for a block too large for one frame,
    /// a tensor of its own sent in chunks.
    pub(super) fn serve_pull_rows(
        &mut self,
        handle: u64,
        tables: RowsTables<'_>,
        enc: &mut Encoder,
    ) {
        let Some(service) = self.service else {
            let _ = enc.error(handle, Status::Unimplemented, "no rows service");
            served_end(self.metrics, RequestKind::PullRows, Outcome::Error);
            return;
        };
        // Counted when answered here or handed to the pool (whose answer is not seen here).
        served_end(self.metrics, RequestKind::PullRows, Outcome::Ok);
        if let Some(jobs) = self.jobs {
            let to = self.reply_to(handle);
            let tables = tables
                .map(|t| RowsPull {
                    table: t.table,
                    dtype: t.block.dtype,
                    dims: t.block.dims.iter().collect(),
                    ids: t.ids().collect(),
                })
                .collect();
            refuse_if_unsent(jobs.try_send(Job::PullRows { to, tables }), enc, handle);
            return;
        }
        let count = tables.len();
        for (index, t) in tables.enumerate() {
            let end = index + 1 == count;
            let s = &mut *self.serve;
            let (status, token) = pull_table(
                service,
                &t,
                enc,
                handle,
                end,
                index as u32,
                &mut s.rows,
                self.out_tensors,
            );
            let Some(status) = status else {
                continue; // answered in the frame
            };
            let meta = TensorMeta {
                chunked: false,
                ..t.block
            };
            let tensor = match token {
                _ if !status.is_ok() => None,
                Some(token) => self.out_tensors.get(token as usize).map(|b| OutTensor {
                    meta,
                    bytes: b.bytes(),
                    token,
                }),
                None => Some(OutTensor {
                    meta,
                    bytes: &s.rows.block,
                    token: COPY_TOKEN,
                }),
            };
            let item = ResponseItem {
                index: index as u32,
                status,
                tensor,
                missing: Missing::Native(if status.is_ok() { &s.rows.missing } else { &[] }),
            };
            let sent = send_items(enc, handle, end, &[item]);
            if sent.is_err() {
                release_unsent(self.out_tensors, token.into_iter());
                return;
            }
        }
    }

    fn reply_to(&self, handle: u64) -> ReplyTo {
        let (loop_index, generation) = self.waiter_base;
        ReplyTo {
            loop_index,
            conn: self.slot,
            generation,
            handle,
        }
    }

    /// Answers at once the keys already published; leaves waiters for the others, which
    /// are answered one by one as they are published (each in its own frame, so a slow
    /// tensor never holds back a ready one).
    /// Keeps the vectors of a push that is not applied, for the next one.
    fn recycle(&mut self, push: super::reply::IncomingPush) {
        let mut parts = push.into_parts();
        parts.results.clear();
        if self.serve.push_vecs.len() < PUSH_VECS_KEPT {
            self.serve.push_vecs.push(parts);
        }
    }

    /// The peer gave up its request `handle` (or the items `items` of it): its recv
    /// waiters are removed and what they waited for is answered `CANCELLED` (so the peer
    /// knows no tensor is on its way for them), a push still arriving is dropped
    /// unanswered. A handle with nothing waiting (answered already, or never seen) is
    /// ignored: the cancel crossed the answer.
    pub(super) fn on_cancel(&mut self, handle: u64, items: ItemIndexes<'_>, enc: &mut Encoder) {
        if let Some(p) = self.incoming.iter_mut().find(|p| p.handle == handle) {
            p.cancelled = true;
            return;
        }
        let (Some(rendezvous), Some(pos)) = (
            self.rendezvous,
            self.recvs.iter().position(|&(h, _)| h == handle),
        ) else {
            return;
        };
        let (loop_index, generation) = self.waiter_base;
        let waiter = (loop_index, self.slot, generation);
        if items.is_empty() {
            rendezvous.forget_request(waiter, handle, None);
            self.recvs.swap_remove(pos);
            let _ = enc.error(handle, Status::Cancelled, "cancelled by the requester");
            served_end(self.metrics, RequestKind::Recv, Outcome::Timeout);
            return;
        }
        for index in items.iter() {
            if rendezvous.forget_request(waiter, handle, Some(index)) == 0 {
                continue; // answered already, or its answer is on its way
            }
            let owed = &mut self.recvs[pos].1;
            *owed -= 1;
            let last = *owed == 0;
            let item = ResponseItem {
                index,
                status: Status::Cancelled,
                tensor: None,
                missing: Missing::default(),
            };
            let _ = send_items(enc, handle, last, &[item]);
            if last {
                self.recvs.swap_remove(pos);
                served_end(self.metrics, RequestKind::Recv, Outcome::Timeout);
                return;
            }
        }
    }

    pub(super) fn serve_recv(
        &mut self,
        handle: u64,
        r: RecvBody<'_>,
        deadline: Option<std::time::Instant>,
        enc: &mut Encoder,
    ) {
        let Some(rendezvous) = self.rendezvous else {
            let _ = enc.error(handle, Status::Unimplemented, "no rendezvous on this task");
            served_end(self.metrics, RequestKind::Recv, Outcome::Error);
            return;
        };
        if self.recvs.iter().any(|&(h, _)| h == handle) {
            self.violation = Some("recv with a handle already in use");
            return;
        }
        let (loop_index, generation) = self.waiter_base;
        let mut ready = Vec::new();
        let mut waiting = 0u32;
        for (index, key) in r.keys.enumerate() {
            let waiter = Waiter {
                loop_index,
                conn: self.slot,
                generation,
                handle,
                index: index as u32,
                step: r.step_id,
            };
            match rendezvous.take_or_wait(key, waiter) {
                Some(t) => ready.push((index as u32, t)),
                None => waiting += 1,
            }
        }
        let tokens: Vec<u64> = ready
            .iter()
            .map(|(_, t)| self.out_tensors.insert(t.clone()) as u64)
            .collect();
        let items: Vec<ResponseItem<'_>> = ready
            .iter()
            .zip(&tokens)
            .map(|((index, t), &token)| ResponseItem {
                index: *index,
                status: Status::Ok,
                tensor: Some(out_tensor(t, token)),
                missing: crate::wire::Missing::default(),
            })
            .collect();
        if waiting > 0 {
            self.recvs.push((handle, waiting));
            if let Some(at) = deadline {
                let timer = super::timer::Timer::ServeDeadline {
                    slot: self.slot,
                    generation,
                    handle,
                };
                self.timers.push(at, timer);
            }
        }
        if waiting == 0 {
            served_end(self.metrics, RequestKind::Recv, Outcome::Ok);
        }
        if waiting == 0 || !items.is_empty() {
            if let Err(k) = send_items(enc, handle, waiting == 0, &items) {
                release_unsent(self.out_tensors, tokens[k..].iter().copied());
            }
        }
    }

    pub(super) fn serve_pull(&mut self, handle: u64, ids: VarIds<'_>, enc: &mut Encoder) {
        let Some(service) = self.service else {
            let _ = enc.error(handle, Status::Unimplemented, "no pull service");
            served_end(self.metrics, RequestKind::Pull, Outcome::Error);
            return;
        };
        if let Some(jobs) = self.jobs {
            let to = self.reply_to(handle);
            let ids = ids.iter().collect();
            let sent = refuse_if_unsent(jobs.try_send(Job::Pull { to, ids }), enc, handle);
            let outcome = if sent { Outcome::Ok } else { Outcome::Refused };
            served_end(self.metrics, RequestKind::Pull, outcome);
            return;
        }
        served_end(self.metrics, RequestKind::Pull, Outcome::Ok);
        let s = &mut *self.serve;
        s.ids.clear();
        s.ids.extend(ids.iter());
        crate::service::pull(service, &s.ids, &mut s.pulled);
        answer_pull(
            enc,
            self.out_tensors,
            handle,
            &s.pulled,
            &mut s.tokens,
            &mut s.items,
        );
        s.pulled.clear();
    }
}

/// Answers a request the handler pool could not take; returns whether it took it.
pub(super) fn refuse_if_unsent(
    r: Result<(), std::sync::mpsc::TrySendError<Job>>,
    enc: &mut Encoder,
    h: u64,
) -> bool {
    match r {
        Ok(()) => true,
        Err(std::sync::mpsc::TrySendError::Full(_)) => {
            let _ = enc.error(h, Status::ResourceExhausted, "handlers are behind; retry");
            false
        }
        Err(std::sync::mpsc::TrySendError::Disconnected(_)) => {
            let _ = enc.error(h, Status::Shutdown, "handler pool stopped");
            false
        }
    }
}

/// Answers a pull with `results`, the tensors sent by reference; `tokens` and `spare` lend
/// their allocations.
pub(crate) fn answer_pull(
    enc: &mut Encoder,
    out_tensors: &mut Slab<Arc<Tensor>>,
    handle: u64,
    results: &[Result<Arc<Tensor>, Status>],
    tokens: &mut Vec<Option<u64>>,
    spare: &mut Vec<ResponseItem<'static>>,
) {
    let items = results.iter().map(|r| match r {
        Ok(t) => (Status::Ok, Some(t), &[][..]),
        Err(s) => (*s, None, &[][..]),
    });
    answer_by_reference(enc, out_tensors, handle, items, tokens, spare);
}

/// Answers a `PULL_ROWS` with the tables a handler thread pulled: their blocks sent by
/// reference, with the missing-rows reports.
pub(crate) fn answer_pull_rows(
    enc: &mut Encoder,
    out_tensors: &mut Slab<Arc<Tensor>>,
    handle: u64,
    tables: &[RowsPulled],
    tokens: &mut Vec<Option<u64>>,
    spare: &mut Vec<ResponseItem<'static>>,
) {
    let items = tables
        .iter()
        .map(|t| (t.status, t.block.as_ref(), &t.missing[..]));
    answer_by_reference(enc, out_tensors, handle, items, tokens, spare);
}

/// Answers `handle` with one item per `(status, tensor, missing rows)` in one frame (or
/// more, `END` on the last): an `OK` item's tensor is sent by reference (held in
/// `out_tensors` until written); an `OK` item without one fails with `INTERNAL`.
fn answer_by_reference<'a>(
    enc: &mut Encoder,
    out_tensors: &mut Slab<Arc<Tensor>>,
    handle: u64,
    items: impl Iterator<Item = (Status, Option<&'a Arc<Tensor>>, &'a [u32])> + Clone,
    tokens: &mut Vec<Option<u64>>,
    spare: &mut Vec<ResponseItem<'static>>,
) {
    tokens.clear();
    tokens.extend(items.clone().map(|(status, t, _)| {
        t.filter(|_| status.is_ok())
            .map(|t| out_tensors.insert(t.clone()) as u64)
    }));
    let mut out: Vec<ResponseItem<'_>> = recast(std::mem::take(spare));
    out.extend(items.zip(tokens.iter()).enumerate().map(
        |(index, ((status, t, missing), token))| match (t, token) {
            (Some(t), Some(token)) => ResponseItem {
                index: index as u32,
                status: Status::Ok,
                tensor: Some(out_tensor(t, *token)),
                missing: crate::wire::Missing::Native(missing),
            },
            _ => ResponseItem {
                index: index as u32,
                status: if status.is_ok() {
                    Status::Internal
                } else {
                    status
                },
                tensor: None,
                missing: crate::wire::Missing::default(),
            },
        },
    ));
    if let Err(k) = send_items(enc, handle, true, &out) {
        release_unsent(out_tensors, tokens[k..].iter().flatten().copied());
    }
    *spare = recast(out);
}

/// Drops the references of tensors whose items were not encoded (those already queued keep
/// theirs until written).
fn release_unsent(out_tensors: &mut Slab<Arc<Tensor>>, tokens: impl Iterator<Item = u64>) {
    for t in tokens {
        out_tensors.try_remove(t as usize);
    }
}

/// Answers a push with one status per item; `spare` lends its allocation.
pub(crate) fn answer_push(
    enc: &mut Encoder,
    handle: u64,
    statuses: &[Status],
    spare: &mut Vec<ResponseItem<'static>>,
) {
    let mut items: Vec<ResponseItem<'_>> = recast(std::mem::take(spare));
    items.extend(
        statuses
            .iter()
            .enumerate()
            .map(|(index, &status)| ResponseItem {
                index: index as u32,
                status,
                tensor: None,
                missing: crate::wire::Missing::default(),
            }),
    );
    let _ = send_items(enc, handle, true, &items);
    *spare = recast(items);
}

/// An empty vector of another item type in `v`'s allocation, when the two have the same
/// layout (here: the same items, borrowing for another lifetime), so that a vector of
/// borrowing items can be kept between uses. std collects a vector's `into_iter` in place
/// when layouts match (a test checks that it still does); otherwise this allocates anew.
pub(crate) fn recast<T, U>(mut v: Vec<T>) -> Vec<U> {
    v.clear();
    v.into_iter().filter_map(|_| None).collect()
}

/// Where a table's answer to a `PULL_ROWS` is assembled when it does not go straight into
/// a frame: its ids, its block and the rows not found.
#[derive(Default)]
pub(crate) struct RowsScratch {
    block: Vec<u8>,
    missing: Vec<u32>,
    ids: Vec<u64>,
}

/// Pulls one table's rows. Straight into a frame when the block fits one and every row is
/// there: answered, `(None, None)`. Otherwise the status to answer with, the block (when
/// `OK`) in `scratch.block` (no token) or, too large for one frame, in a tensor of its own
/// in `out_tensors` (its token), and the rows not found in `scratch.missing`. A table that
/// reports missing rows out of order or range fails with `INTERNAL`.
#[allow(clippy::too_many_arguments)]
fn pull_table(
    service: &dyn Service,
    t: &RowsTable<'_>,
    enc: &mut Encoder,
    handle: u64,
    end: bool,
    index: u32,
    scratch: &mut RowsScratch,
    out_tensors: &mut Slab<Arc<Tensor>>,
) -> (Option<Status>, Option<u64>) {
    let table = match table_for(service, t.table, t.block.dtype, t.block.dims.iter()) {
        Ok(table) => table,
        Err(status) => return (Some(status), None),
    };
    scratch.ids.clear();
    scratch.ids.extend(t.ids());
    scratch.missing.clear();
    let ids = &scratch.ids;
    let pull = |out: &mut [u8], missing: &mut Vec<u32>| {
        crate::panic::guarded("Table::pull", || table.pull(ids, out, missing))
            .unwrap_or(Status::Internal)
    };
    let direct = enc.response_block(
        handle,
        end,
        index,
        &t.block,
        &mut scratch.missing,
        &mut scratch.block,
        pull,
    );
    let (status, token) = match direct {
        Ok(None) => return (None, None),
        Ok(Some(status)) => (status, None),
        Err(_) => {
            let dims: Vec<u64> = t.block.dims.iter().collect();
            let Ok(mut block) = Tensor::zeros(t.block.dtype, &dims) else {
                return (Some(Status::ResourceExhausted), None);
            };
            let status = pull(block.bytes_mut(), &mut scratch.missing);
            let token = status
                .is_ok()
                .then(|| out_tensors.insert(Arc::new(block)) as u64);
            (status, token)
        }
    };
    if status.is_ok() && !missing_is_ordered(&scratch.missing, t.len()) {
        log::warn!(
            "table {} reported missing rows out of order or range",
            t.table
        );
        if let Some(token) = token {
            out_tensors.try_remove(token as usize);
        }
        return (Some(Status::Internal), None);
    }
    (Some(status), token)
}

/// Vectors the serving side reuses from request to request, so that answering allocates
/// nothing in steady state.
#[derive(Default)]
pub(crate) struct ServeScratch {
    pub(super) rows: RowsScratch,
    pub(super) ids: Vec<u64>,
    pub(super) pulled: Vec<Result<Arc<Tensor>, Status>>,
    pub(super) tokens: Vec<Option<u64>>,
    pub(super) items: Vec<ResponseItem<'static>>,
    pub(super) statuses: Vec<Status>,
    pub(super) push: PushScratch,
    /// Vectors of finished pushes, for the next ones (at most `PUSH_VECS_KEPT`).
    pub(super) push_vecs: Vec<PushVecs>,
}

/// Most sets of push vectors a loop keeps for reuse.
pub(super) const PUSH_VECS_KEPT: usize = 64;

/// Answers item `index` of the recv `handle` with a tensor delivered by the rendezvous (or
/// a failure); the last item owed carries `END`.
/// Answers item `index` of the peer's recv `handle` with `result`; when that recv is no
/// longer waiting (cancelled, or past its deadline), gives `result` back.
pub(crate) fn answer_recv(
    conn: &mut Conn,
    handle: u64,
    index: u32,
    result: Result<Arc<Tensor>, Status>,
) -> Option<Result<Arc<Tensor>, Status>> {
    let Some(pos) = conn.recvs.iter().position(|&(h, _)| h == handle) else {
        return Some(result);
    };
    conn.recvs[pos].1 -= 1;
    let last = conn.recvs[pos].1 == 0;
    if last {
        conn.recvs.swap_remove(pos);
    }
    let (item, token) = match &result {
        Ok(t) => {
            let token = conn.out_tensors.insert(t.clone()) as u64;
            let item = ResponseItem {
                index,
                status: Status::Ok,
                tensor: Some(out_tensor(t, token)),
                missing: crate::wire::Missing::default(),
            };
            (item, Some(token))
        }
        Err(s) => (
            ResponseItem {
                index,
                status: *s,
                tensor: None,
                missing: crate::wire::Missing::default(),
            },
            None,
        ),
    };
    let enc = conn.proto.encoder();
    if send_items(enc, handle, last, &[item]).is_err() {
        release_unsent(&mut conn.out_tensors, token.into_iter());
    }
    None
}

/// Sends `items` in `RESPONSE` frames that fit the peer's frame limit, `end` on the last.
/// When a frame cannot be encoded, sends an `ERROR` for the request instead and returns
/// the index of the first item not sent.
fn send_items(
    enc: &mut Encoder,
    handle: u64,
    end: bool,
    items: &[ResponseItem<'_>],
) -> Result<(), usize> {
    let budget = (enc.config().max_frame / 2) as usize;
    let mut start = 0;
    loop {
        let mut stop = start;
        let mut size = 0;
        while stop < items.len() {
            let len = 8 + items[stop].tensor.map_or(0, |t| t.meta.buffer_len());
            if stop > start && size + len > budget {
                break;
            }
            size += len;
            stop += 1;
        }
        let last = stop >= items.len();
        if let Err(e) = enc.response(handle, end && last, &items[start..stop]) {
            log::warn!("cannot encode response: {e}");
            let _ = enc.error(handle, Status::Internal, "response not encodable");
            return Err(start);
        }
        if last {
            return Ok(());
        }
        start = stop;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recast_keeps_the_allocation_of_borrowing_items() {
        let mut v: Vec<ResponseItem<'static>> = Vec::with_capacity(100);
        v.push(ResponseItem {
            index: 1,
            status: Status::Ok,
            tensor: None,
            missing: crate::wire::Missing::default(),
        });
        let ptr = v.as_ptr() as usize;
        let bytes = [0u8; 4];
        let mut w: Vec<ResponseItem<'_>> = recast(v);
        assert!(w.is_empty());
        assert_eq!((w.as_ptr() as usize, w.capacity()), (ptr, 100));
        w.push(ResponseItem {
            index: 0,
            status: Status::Ok,
            tensor: Some(crate::proto::OutTensor {
                meta: crate::wire::TensorMeta::dead(crate::wire::DType::U8),
                bytes: &bytes,
                token: 0,
            }),
            missing: crate::wire::Missing::default(),
        });
        let back: Vec<ResponseItem<'static>> = recast(w);
        assert_eq!((back.as_ptr() as usize, back.capacity()), (ptr, 100));
        let push: Vec<crate::proto::PushItem<'static>> =
            recast(Vec::<crate::proto::PushItem<'_>>::with_capacity(8));
        assert_eq!(push.capacity(), 8);
    }
}
