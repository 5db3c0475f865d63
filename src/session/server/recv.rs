//! Recvs served from the rendezvous: keys already published are answered at once, the
//! others wait and are answered one by one as they are published (each in its own frame,
//! so a slow tensor never holds back a ready one); a cancel or the recv's deadline removes
//! its waiters, so a tensor published after the requester stopped waiting stays for the
//! next recv.

use std::sync::Arc;
use std::time::Instant;

use crate::proto::{Encoder, ResponseItem};
use crate::rendezvous::{Rendezvous, Waiter};
use crate::stats::{Outcome, RequestKind};
use crate::tensor::Tensor;
use crate::wire::{ItemIndexes, Missing, RecvBody, Status};

use super::super::conn::Conn;
use super::super::observer::Observer;
use super::super::respond::{out_tensor, release_unsent, send_items, status_item};
use super::super::timer::{Timer, Timers};
use super::super::violation::Violation;
use super::{Server, Serving};

impl Server {
    /// Serves the peer's recv (or fused recv) `handle` of `r`, given up at `deadline`.
    pub(super) fn serve_recv(
        &mut self,
        c: &mut Serving<'_>,
        handle: u64,
        r: RecvBody<'_>,
        deadline: Option<Instant>,
        timers: &mut Timers,
        observer: &Observer,
    ) -> Result<(), Violation> {
        let Some(rendezvous) = self.rendezvous.as_deref() else {
            let _ = c
                .enc
                .error(handle, Status::Unimplemented, "no rendezvous on this task");
            observer.served(c.peer, RequestKind::Recv, Outcome::Error, None);
            return Ok(());
        };
        if c.served.owes_recv(handle) {
            let kind = crate::wire::FrameKind::Recv;
            return Err(Violation::HandleInUse { handle, kind });
        }
        let mut ready = Vec::new();
        let mut waiting = 0u32;
        for (index, key) in r.keys.enumerate() {
            let waiter = Waiter {
                loop_index: self.index,
                conn: c.slot,
                generation: c.generation,
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
            .map(|(_, t)| c.out.insert(t.clone()) as u64)
            .collect();
        let items: Vec<ResponseItem<'_>> = ready
            .iter()
            .zip(&tokens)
            .map(|((index, t), &token)| ResponseItem {
                index: *index,
                status: Status::Ok,
                tensor: Some(out_tensor(t, token)),
                missing: Missing::default(),
            })
            .collect();
        if waiting > 0 {
            c.served.recvs.push((handle, waiting));
            if let Some(at) = deadline {
                let timer = Timer::ServeDeadline {
                    slot: c.slot,
                    generation: c.generation,
                    handle,
                };
                timers.add(at, timer);
            }
        } else {
            observer.served(c.peer, RequestKind::Recv, Outcome::Ok, None);
        }
        if waiting == 0 || !items.is_empty() {
            if let Err(k) = send_items(c.enc, handle, waiting == 0, &items) {
                release_unsent(c.out, tokens[k..].iter().copied());
            }
        }
        Ok(())
    }

    /// The peer gave up its request `handle` (or the items `items` of it): its recv
    /// waiters are removed and what they waited for is answered `CANCELLED` (so the peer
    /// knows no tensor is on its way for them), a push still arriving is dropped
    /// unanswered. A handle with nothing waiting (answered already, or never seen) is
    /// ignored: the cancel crossed the answer.
    pub(super) fn on_cancel(
        &mut self,
        c: &mut Serving<'_>,
        handle: u64,
        items: ItemIndexes<'_>,
        observer: &Observer,
    ) {
        if let Some(p) = c.served.push_mut(handle) {
            p.cancelled = true;
            return;
        }
        let (Some(rendezvous), Some(pos)) = (
            self.rendezvous.as_deref(),
            c.served.recvs.iter().position(|&(h, _)| h == handle),
        ) else {
            return;
        };
        let waiter = (self.index, c.slot, c.generation);
        if items.is_empty() {
            rendezvous.forget_request(waiter, handle, None);
            c.served.recvs.swap_remove(pos);
            let _ = c
                .enc
                .error(handle, Status::Cancelled, "cancelled by the requester");
            observer.served(c.peer, RequestKind::Recv, Outcome::Timeout, None);
            return;
        }
        for index in items.iter() {
            if rendezvous.forget_request(waiter, handle, Some(index)) == 0 {
                continue; // answered already, or its answer is on its way
            }
            let owed = &mut c.served.recvs[pos].1;
            *owed -= 1;
            let last = *owed == 0;
            let _ = send_items(
                c.enc,
                handle,
                last,
                &[status_item(index, Status::Cancelled)],
            );
            if last {
                c.served.recvs.swap_remove(pos);
                observer.served(c.peer, RequestKind::Recv, Outcome::Timeout, None);
                return;
            }
        }
    }

    /// Answers item `index` of the peer's recv `handle` on `conn` with `result`, a tensor
    /// the rendezvous delivered (or a failure); the last item owed carries `END`. When that
    /// recv is no longer waiting (cancelled, or past its deadline), gives `result` back.
    pub(crate) fn answer_recv(
        conn: &mut Conn,
        handle: u64,
        index: u32,
        result: Result<Arc<Tensor>, Status>,
        observer: &Observer,
    ) -> Option<Result<Arc<Tensor>, Status>> {
        let recvs = &mut conn.served.recvs;
        let Some(pos) = recvs.iter().position(|&(h, _)| h == handle) else {
            return Some(result);
        };
        recvs[pos].1 -= 1;
        let last = recvs[pos].1 == 0;
        if last {
            recvs.swap_remove(pos);
            // Its last item answered.
            observer.served(conn.peer, RequestKind::Recv, Outcome::Ok, None);
        }
        let (item, token) = match &result {
            Ok(t) => {
                let token = conn.out_tensors.insert(t.clone()) as u64;
                let item = ResponseItem {
                    index,
                    status: Status::Ok,
                    tensor: Some(out_tensor(t, token)),
                    missing: Missing::default(),
                };
                (item, Some(token))
            }
            Err(s) => (status_item(index, *s), None),
        };
        let enc: &mut Encoder = conn.proto.encoder();
        if send_items(enc, handle, last, &[item]).is_err() {
            release_unsent(&mut conn.out_tensors, token.into_iter());
        }
        None
    }

    /// The peer's recv `handle` on connection `slot` (`conn`) reached the deadline it
    /// carried: if still waiting, its waiters are removed and it is answered
    /// `DEADLINE_EXCEEDED`, so a tensor published after the requester stopped waiting
    /// stays for the next recv. Returns whether it answered.
    pub(crate) fn deadline_due(
        &self,
        conn: &mut Conn,
        slot: u32,
        handle: u64,
        observer: &Observer,
    ) -> bool {
        let recvs = &mut conn.served.recvs;
        let Some(pos) = recvs.iter().position(|&(h, _)| h == handle) else {
            return false;
        };
        recvs.swap_remove(pos);
        if let Some(r) = &self.rendezvous {
            r.forget_request((self.index, slot, conn.generation), handle, None);
        }
        observer.served(conn.peer, RequestKind::Recv, Outcome::Timeout, None);
        let why = "deadline passed before the tensor was published";
        let _ = conn
            .proto
            .encoder()
            .error(handle, Status::DeadlineExceeded, why);
        true
    }

    /// The rendezvous this server serves recvs from.
    pub(crate) fn rendezvous(&self) -> Option<&Rendezvous> {
        self.rendezvous.as_deref()
    }
}
