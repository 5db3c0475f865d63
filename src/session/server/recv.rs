//! Recvs served from the rendezvous: keys already published are answered at once, the
//! others wait and are answered one by one as they are published (each in its own frame,
//! so a slow tensor never holds back a ready one); a cancel or the recv's deadline removes
//! its waiters, so a tensor published after the requester stopped waiting stays for the
//! next recv.

use std::sync::Arc;

use crate::proto::{Encoder, ResponseItem, COPY_TOKEN};
use crate::rendezvous::{Rendezvous, Waiter};
use crate::stats::{Outcome, RequestKind};
use crate::tensor::Tensor;
use crate::wire::{HeaderRepr, ItemIndexes, Missing, RecvBody, Status};

use super::super::conn::Conn;
use super::super::observer::served_kind;
use super::super::observer::Observer;
use super::super::push::{recv_cost, ServedRecv};
use super::super::respond::{fit_to_peer, out_tensor, release_unsent, send_items, status_item};
use super::super::timer::{Timer, Timers};
use super::super::violation::Violation;
use super::{deadline_of, Server, Serving};

impl Server {
    /// Serves the peer's recv (or fused recv) `handle` of `r`, given up at `deadline`.
    pub(super) fn serve_recv(
        &mut self,
        c: &mut Serving<'_>,
        header: &HeaderRepr,
        r: RecvBody<'_>,
        timers: &mut Timers,
        observer: &Observer,
    ) -> Result<(), Violation> {
        let handle = header.handle;
        let kind = served_kind(header.kind).unwrap_or(RequestKind::Recv);
        let deadline = deadline_of(c.now, header.timeout_ms);
        let Some(rendezvous) = self.rendezvous.as_deref() else {
            let _ = c
                .enc
                .error(handle, Status::Unimplemented, "no rendezvous on this task");
            observer.served(c.peer, kind, Outcome::Error, None);
            return Ok(());
        };
        if c.served.owes_recv(handle) {
            let kind = crate::wire::FrameKind::Recv;
            return Err(Violation::HandleInUse { handle, kind });
        }
        // What waiting would hold is charged first: keys a peer leaves waiting are bounded
        // by bytes, per connection and per task, not only by count.
        let key_bytes: usize = r.keys.map(<[u8]>::len).sum();
        let cost = recv_cost(r.keys.len(), key_bytes);
        let Ok(charged) = c.budget.reserve(cost) else {
            log::warn!(
                "a recv of {} keys ({key_bytes} bytes) does not fit the receive budget; \
                 refused with RESOURCE_EXHAUSTED",
                r.keys.len()
            );
            let why = "waiting recvs over the receive budget";
            let _ = c.enc.error(handle, Status::ResourceExhausted, why);
            observer.served(c.peer, kind, Outcome::Refused, None);
            return Ok(());
        };
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
        let mut tokens: Vec<Option<u64>> = ready
            .iter()
            .map(|(_, t)| Some(c.out.insert(t.clone()) as u64))
            .collect();
        let mut items: Vec<ResponseItem<'_>> = ready
            .iter()
            .zip(&tokens)
            .map(|((index, t), &token)| ResponseItem {
                versions: Default::default(),
                index: *index,
                status: Status::Ok,
                tensor: Some(out_tensor(t, token.unwrap_or(COPY_TOKEN))),
                missing: Missing::default(),
            })
            .collect();
        let peer = *c.enc.peer_limits();
        fit_to_peer(&mut items, &peer, |at, token| {
            c.out.try_remove(token as usize);
            tokens[at] = None;
        });
        if waiting > 0 {
            let recv = ServedRecv::new(handle, kind, waiting, r.keys, charged);
            c.served.recvs.push(recv);
            if let Some(at) = deadline {
                let timer = Timer::ServeDeadline {
                    slot: c.slot,
                    generation: c.generation,
                    handle,
                };
                timers.add(at, timer);
            }
        } else {
            observer.served(c.peer, kind, Outcome::Ok, None);
        }
        if waiting == 0 || !items.is_empty() {
            if let Err(k) = send_items(c.enc, handle, waiting == 0, &items) {
                release_unsent(c.out, tokens[k..].iter().flatten().copied());
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
        let (Some(rendezvous), Some(pos)) = (self.rendezvous.as_deref(), c.served.recv_at(handle))
        else {
            return;
        };
        let waiter = (self.index, c.slot, c.generation);
        let kind = c.served.recvs[pos].kind;
        if items.is_empty() {
            let recv = c.served.recvs.swap_remove(pos);
            for i in 0..recv.len() {
                rendezvous.forget(waiter, handle, recv.key(i), None);
            }
            let _ = c
                .enc
                .error(handle, Status::Cancelled, "cancelled by the requester");
            observer.served(c.peer, kind, Outcome::Timeout, None);
            return;
        }
        for index in items.iter() {
            let recv = &c.served.recvs[pos];
            if index as usize >= recv.len() {
                continue; // not an item of the request: nothing to give up
            }
            if rendezvous.forget(waiter, handle, recv.key(index as usize), Some(index)) == 0 {
                continue; // answered already, or its answer is on its way
            }
            let owed = &mut c.served.recvs[pos].owed;
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
                observer.served(c.peer, kind, Outcome::Timeout, None);
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
        let Some(pos) = conn.served.recv_at(handle) else {
            return Some(result);
        };
        let recvs = &mut conn.served.recvs;
        recvs[pos].owed -= 1;
        let last = recvs[pos].owed == 0;
        if last {
            let kind = recvs.swap_remove(pos).kind;
            // Its last item answered.
            observer.served(conn.peer, kind, Outcome::Ok, None);
        }
        let (mut item, mut token) = match &result {
            Ok(t) => {
                let token = conn.out_tensors.insert(t.clone()) as u64;
                let item = ResponseItem {
                    versions: Default::default(),
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
        let peer = *enc.peer_limits();
        let out = &mut conn.out_tensors;
        fit_to_peer(std::slice::from_mut(&mut item), &peer, |_, t| {
            out.try_remove(t as usize);
            token = None;
        });
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
        let Some(pos) = conn.served.recv_at(handle) else {
            return false;
        };
        let recv = conn.served.recvs.swap_remove(pos);
        if let Some(r) = &self.rendezvous {
            let waiter = (self.index, slot, conn.generation);
            for i in 0..recv.len() {
                r.forget(waiter, handle, recv.key(i), None);
            }
        }
        observer.served(conn.peer, recv.kind, Outcome::Timeout, None);
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
