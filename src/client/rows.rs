//! Rows requests on a [`Client`]: one frame per peer for any number of tables.

use std::sync::Arc;
use std::time::Instant;

use crate::client::{Client, Mode, PullRows, Push, Ticket};
use crate::cluster::Peer;
use crate::error::Error;
use crate::session::{RequestOp, Spare};
use crate::tensor::{SharedAllocator, Tensor};

use crate::session::{Rows, RowsSpec};

/// The specs and ids of `tables` in `spare`'s vectors; `None` when a table is invalid.
fn specs(tables: &[Rows<'_>], spare: &mut Spare) -> Option<(Vec<RowsSpec>, Vec<u64>)> {
    let mut specs = std::mem::take(&mut spare.tables);
    let mut ids = std::mem::take(&mut spare.ids);
    specs.clear();
    ids.clear();
    for t in tables {
        match RowsSpec::of(t) {
            Some(s) => specs.push(s),
            None => {
                (spare.tables, spare.ids) = (specs, ids);
                return None;
            }
        }
        ids.extend_from_slice(t.ids);
    }
    if specs.is_empty() {
        (spare.tables, spare.ids) = (specs, ids);
        return None;
    }
    Some((specs, ids))
}

impl<M: Mode> Client<M> {
    /// Pulls rows of one or more tables from `peer` in one request: per table, in order,
    /// one block of `ids.len()` rows (`[ids, row...]`, rows in the order of the ids) in
    /// memory from the runtime's allocator, and the rows the peer did not have.
    ///
    /// The ids are copied into vectors this client keeps: with completions handed back
    /// through [`recycle`](Self::recycle), a steady stream of rows pulls allocates nothing
    /// but the blocks (and those come from [`pull_rows_into`](Self::pull_rows_into)'s
    /// allocator when given one).
    ///
    /// Each table's block arrives in the dtype its rows travel as
    /// ([`Rows::wire`](crate::rows::Rows::wire): a pull of an f32 table may ask for bf16
    /// or f16 rows, half the bytes; a PS that did not announce `row_formats` answers in
    /// the table's dtype instead), and
    /// [`PulledRows::read_f32`](crate::rows::PulledRows::read_f32) reads either as f32.
    ///
    /// Fails at once with [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) when `tables` is empty or a table
    /// has no ids, an unknown dtype, zero-byte rows, more than
    /// [`MAX_ROW_RANK`](crate::session::MAX_ROW_RANK) row dimensions, or a wire dtype its
    /// rows do not convert into. With no `deadline`, a
    /// peer that cannot be reached fails it after the connect-retry schedule (about 2.55 s
    /// with the defaults when nothing listens there, at most 47.55 s; see
    /// [Unreachable peers](Client#unreachable-peers)).
    pub fn pull_rows(
        &mut self,
        peer: impl Into<Peer>,
        tables: &[Rows<'_>],
        deadline: Option<Instant>,
    ) -> Result<Ticket<PullRows>, Error> {
        let spare = self.spare();
        self.rows_pull(peer.into(), tables, &[], None, deadline, spare)
    }

    /// Pulls rows as [`pull_rows`](Self::pull_rows) does, for a caller that holds some of
    /// them already (a cache of rows): `held` has one entry per id, all tables' in order
    /// (as the ids of `tables` follow each other), the version of the row the caller
    /// holds, or 0 for none. The answer carries each row's current version
    /// ([`PulledRows::versions`](crate::rows::PulledRows::versions)) and only the rows
    /// whose version is not the one held: those are
    /// [`unchanged`](crate::rows::PulledRows::unchanged) and their bytes do not travel.
    /// Each table's [`block`](crate::rows::PulledRows::block) holds the other rows, in the
    /// order of their positions; [`changed_rows`](crate::rows::PulledRows::changed_rows)
    /// names their positions and
    /// [`write_changed`](crate::rows::PulledRows::write_changed) writes them into the
    /// caller's rows, leaving the unchanged ones as they are.
    ///
    /// A version is a number the PS's table gives a row each time a push changes it (and
    /// when it creates or loads it), never twice and never again after the PS restarts,
    /// so a held version that matches is the row as the PS has it. Rows pulled with a
    /// version of 0 are sent; a table that keeps no versions answers every row changed,
    /// with version 0 (unknown).
    ///
    /// With a peer that did not announce `row_versions` (an earlier release, or
    /// `STARWIRE_WIRE_FEATURES` without it on either end) the call works all the same: a
    /// plain pull goes out, and every row comes back changed, with version 0 (unknown).
    ///
    /// Fails at once as [`pull_rows`](Self::pull_rows) does, and when `held` does not have
    /// one entry per id. The vectors are reused as for `pull_rows`: no allocation per call
    /// in steady state with [`recycle`](Self::recycle).
    pub fn pull_rows_versioned(
        &mut self,
        peer: impl Into<Peer>,
        tables: &[Rows<'_>],
        held: &[u64],
        deadline: Option<Instant>,
    ) -> Result<Ticket<PullRows>, Error> {
        let spare = self.spare();
        self.rows_pull_versioned(peer.into(), tables, held, None, deadline, spare)
    }

    /// Like [`pull_rows_versioned`](Self::pull_rows_versioned), with each table's block (the
    /// rows sent) in memory from `alloc`, as [`pull_rows_into`](Self::pull_rows_into).
    pub fn pull_rows_versioned_into(
        &mut self,
        peer: impl Into<Peer>,
        tables: &[Rows<'_>],
        held: &[u64],
        alloc: SharedAllocator,
        deadline: Option<Instant>,
    ) -> Result<Ticket<PullRows>, Error> {
        let spare = self.spare();
        self.rows_pull_versioned(peer.into(), tables, held, Some(alloc), deadline, spare)
    }

    /// [`pull_rows_versioned`](Self::pull_rows_versioned) with the vectors of `spare`, as
    /// [`pull_rows_with`](Self::pull_rows_with).
    #[allow(dead_code)] // for the worker's row cache
    pub(crate) fn pull_rows_versioned_with(
        &mut self,
        peer: Peer,
        tables: &[Rows<'_>],
        held: &[u64],
        deadline: Option<Instant>,
        spare: Spare,
    ) -> Result<Ticket<PullRows>, Error> {
        self.rows_pull_versioned(peer, tables, held, None, deadline, spare)
    }

    fn rows_pull_versioned(
        &mut self,
        peer: Peer,
        tables: &[Rows<'_>],
        held: &[u64],
        alloc: Option<SharedAllocator>,
        deadline: Option<Instant>,
        spare: Spare,
    ) -> Result<Ticket<PullRows>, Error> {
        let ids: usize = tables.iter().map(|t| t.ids.len()).sum();
        if held.len() != ids || held.is_empty() {
            self.recycle_spare(spare);
            return Err(Error::invalid(&format!(
                "rows: {} held versions for {ids} ids (one per id)",
                held.len()
            )));
        }
        self.rows_pull(peer, tables, held, alloc, deadline, spare)
    }

    /// [`pull_rows`](Self::pull_rows) with the vectors of `spare` (a caller that keeps its
    /// own, one per request it has in flight, so that each serves one kind of request).
    pub(crate) fn pull_rows_with(
        &mut self,
        peer: Peer,
        tables: &[Rows<'_>],
        deadline: Option<Instant>,
        spare: Spare,
    ) -> Result<Ticket<PullRows>, Error> {
        self.rows_pull(peer, tables, &[], None, deadline, spare)
    }

    /// Like [`pull_rows`](Self::pull_rows), with each table's block in memory from
    /// `alloc` — for instance the trainer's own buffers.
    pub fn pull_rows_into(
        &mut self,
        peer: impl Into<Peer>,
        tables: &[Rows<'_>],
        alloc: SharedAllocator,
        deadline: Option<Instant>,
    ) -> Result<Ticket<PullRows>, Error> {
        let spare = self.spare();
        self.rows_pull(peer.into(), tables, &[], Some(alloc), deadline, spare)
    }

    fn rows_pull(
        &mut self,
        peer: Peer,
        tables: &[Rows<'_>],
        held: &[u64],
        alloc: Option<SharedAllocator>,
        deadline: Option<Instant>,
        mut spare: Spare,
    ) -> Result<Ticket<PullRows>, Error> {
        let Some((tables, ids)) = specs(tables, &mut spare) else {
            self.recycle_spare(spare);
            return Err(Error::invalid(
                "rows: no table, no ids, or an invalid dtype, wire dtype or row shape",
            ));
        };
        let mut held_v = std::mem::take(&mut spare.held);
        held_v.clear();
        held_v.extend_from_slice(held);
        let op = RequestOp::PullRows {
            tables,
            ids,
            alloc,
            held: held_v,
        };
        self.submit_with(op, peer, deadline, spare)
    }

    /// Pushes gradient rows of one or more tables to `peer` in one request: per table its
    /// ids and `grads`, the gradient rows in the order of the ids (`ids.len() × row_bytes`
    /// bytes, little-endian elements of the rows' `dtype`; narrowed into
    /// [`Rows::wire`](crate::rows::Rows::wire) as they are sent, and sent with
    /// [`Rows::loss_scale`](crate::rows::Rows::loss_scale)). The result is one status per
    /// table.
    ///
    /// The ids and gradient bytes are copied into vectors this client keeps (allocation-free
    /// in steady state with [`recycle`](Self::recycle)), and blocks that fit one frame are
    /// copied again into it: [`push_rows_shared`](Self::push_rows_shared) sends the
    /// gradients from their own memory instead. Fails at once with
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) as [`pull_rows`](Self::pull_rows) does, and when a
    /// table's `grads` is not `ids.len() × row_bytes` bytes.
    pub fn push_rows(
        &mut self,
        peer: impl Into<Peer>,
        tables: &[(Rows<'_>, &[u8])],
        deadline: Option<Instant>,
    ) -> Result<Ticket<Push>, Error> {
        let spare = self.spare();
        self.push_rows_with(peer.into(), tables, deadline, spare)
    }

    /// [`push_rows`](Self::push_rows) with the vectors of `spare`, as
    /// [`pull_rows_with`](Self::pull_rows_with).
    pub(crate) fn push_rows_with(
        &mut self,
        peer: Peer,
        tables: &[(Rows<'_>, &[u8])],
        deadline: Option<Instant>,
        mut spare: Spare,
    ) -> Result<Ticket<Push>, Error> {
        let rows = tables.iter().map(|(r, _)| *r);
        let mut specs_v = std::mem::take(&mut spare.tables);
        let mut ids = std::mem::take(&mut spare.ids);
        let mut grads = std::mem::take(&mut spare.grads);
        specs_v.clear();
        ids.clear();
        grads.clear();
        let mut ok = !tables.is_empty();
        for (r, (_, g)) in rows.zip(tables) {
            match RowsSpec::of(&r) {
                Some(s) if s.own_bytes() == g.len() as u64 => specs_v.push(s),
                _ => {
                    ok = false;
                    break;
                }
            }
            ids.extend_from_slice(r.ids);
            grads.extend_from_slice(g);
        }
        if !ok {
            (spare.tables, spare.ids, spare.grads) = (specs_v, ids, grads);
            self.recycle_spare(spare);
            return Err(Error::invalid(
                "rows: no table, no ids, an invalid dtype, wire dtype or row shape, a loss scale \
                 on rows that are not f32, bf16 or f16, or gradients of another size",
            ));
        }
        let mut shared = std::mem::take(&mut spare.items);
        shared.clear();
        let op = RequestOp::PushRows {
            tables: specs_v,
            ids,
            grads,
            shared,
        };
        self.submit_with(op, peer, deadline, spare)
    }

    /// Like [`push_rows`](Self::push_rows), with each table's gradient rows in a shared
    /// tensor (its contents `ids.len() × row_bytes` bytes; its dtype and shape are not
    /// looked at: the table's are), sent from the tensor's own memory: no byte of a block
    /// above the encoder's inline threshold (256 bytes by default, where a copy into the
    /// frame is cheaper than one more `iovec`) is copied on this side. The connection holds
    /// a reference to each block until it is written; after that (at the latest once the
    /// connection lets go of it, shortly after the completion) the caller's `Arc` is the
    /// only one again, and [`Arc::get_mut`] gives the memory back for the next step. A
    /// tensor over the caller's own memory ([`Tensor::from_memory`]) is
    /// sent from that memory.
    ///
    /// The ids are still copied (8 bytes a row) into vectors this client keeps: allocation
    /// free in steady state with [`recycle`](Self::recycle). Fails at once as
    /// [`push_rows`](Self::push_rows) does, a block of another length included.
    pub fn push_rows_shared(
        &mut self,
        peer: impl Into<Peer>,
        tables: &[(Rows<'_>, Arc<Tensor>)],
        deadline: Option<Instant>,
    ) -> Result<Ticket<Push>, Error> {
        let spare = self.spare();
        self.push_rows_shared_with(peer.into(), tables, deadline, spare)
    }

    /// [`push_rows_shared`](Self::push_rows_shared) with the vectors of `spare`, as
    /// [`pull_rows_with`](Self::pull_rows_with).
    pub(crate) fn push_rows_shared_with(
        &mut self,
        peer: Peer,
        tables: &[(Rows<'_>, Arc<Tensor>)],
        deadline: Option<Instant>,
        mut spare: Spare,
    ) -> Result<Ticket<Push>, Error> {
        let mut specs_v = std::mem::take(&mut spare.tables);
        let mut ids = std::mem::take(&mut spare.ids);
        let mut shared = std::mem::take(&mut spare.items);
        specs_v.clear();
        ids.clear();
        shared.clear();
        let mut ok = !tables.is_empty();
        for (i, (r, g)) in tables.iter().enumerate() {
            match RowsSpec::of(r) {
                Some(s) if s.own_bytes() == g.byte_len() as u64 && !g.is_dead() => specs_v.push(s),
                _ => {
                    ok = false;
                    break;
                }
            }
            ids.extend_from_slice(r.ids);
            shared.push((i as u64, g.clone()));
        }
        if !ok {
            shared.clear();
            (spare.tables, spare.ids, spare.items) = (specs_v, ids, shared);
            self.recycle_spare(spare);
            return Err(Error::invalid(
                "rows: no table, no ids, an invalid dtype or row shape, or a block of another size",
            ));
        }
        let grads = std::mem::take(&mut spare.grads);
        let op = RequestOp::PushRows {
            tables: specs_v,
            ids,
            grads,
            shared,
        };
        self.submit_with(op, peer, deadline, spare)
    }
}
