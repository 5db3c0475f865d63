//! Rows, a part of their own: encoding a rows pull and a rows push, assembling a rows
//! pull's answer on the client ([`RowsReply`]), and serving both on the server (each
//! table's block written by the table straight into the answer frame where it fits).

use std::sync::Arc;

use slab::Slab;

use crate::float;
use crate::pool::{apply_rows, missing_is_ordered, pull_as, table_for, Grads as PushedGrads};
use crate::pool::{RowsPull, RowsPulled};
use crate::proto::{
    EncodeError, Encoder, OutTensor, ResponseItem, RowsItem, RowsQuery, COPY_TOKEN,
};
use crate::service::Service;
use crate::tensor::{Tensor, TensorAllocator};
use crate::wire::{
    Missing, ResponseEntries, RowsTable, RowsTables, Status, TensorMeta, WireFeatures,
};

use super::assemble::Tensors;
use super::budget::{ConnBudget, Reservation};
use super::push::RowIds;
use super::refusal::{refusal, send_refusals, Refusal, Verb};
use super::reply::{PulledRows, RowVersions, Spare};
use super::respond::{answer_by_reference, fits_peer, recast, release_unsent, send_items};
use super::spec::RowsSpec;
use super::versioned::{serve_versioned, Served, VersionsScratch};
use super::violation::Violation;

// ----- the client: encoding requests, assembling answers -----

/// Vectors for encoding rows requests, reused from request to request.
#[derive(Default)]
pub(crate) struct RowsEncodeScratch {
    tokens: Vec<u64>,
    queries: Vec<RowsQuery<'static>>,
    rows: Vec<RowsItem<'static>>,
    /// A push's gradients converted into the dtypes they travel as.
    converted: Vec<u8>,
}

/// Queues a `PULL_ROWS`, with the versions held of its ids when `held` is not empty.
pub(crate) fn encode_pull(
    enc: &mut Encoder,
    handle: u64,
    tables: &[RowsSpec],
    ids: &[u64],
    held: &[u64],
    scratch: &mut RowsEncodeScratch,
) -> Result<(), EncodeError> {
    let mut queries: Vec<RowsQuery<'_>> = recast(std::mem::take(&mut scratch.queries));
    let mut at = 0;
    for t in tables {
        queries.push(RowsQuery {
            table: t.table,
            block: t.meta(),
            ids: &ids[at..at + t.len()],
            held: held.get(at..at + t.len()).unwrap_or_default(),
        });
        at += t.len();
    }
    let r = enc.pull_rows(handle, &queries);
    scratch.queries = recast(queries);
    r
}

/// A rows push's gradient blocks.
pub(crate) enum Grads<'a> {
    /// One after the other, in table order: copied.
    Packed(&'a [u8]),
    /// One shared tensor per table, in table order: sent from their own memory.
    Shared(&'a [(u64, Arc<Tensor>)]),
}

impl Grads<'_> {
    /// Table `i`'s gradients (`len` bytes at `at` when packed).
    fn block(&self, i: usize, at: usize, len: usize) -> &[u8] {
        match self {
            Grads::Packed(g) => g.get(at..at + len).unwrap_or_default(),
            Grads::Shared(b) => b.get(i).map_or(&[][..], |(_, t)| t.bytes()),
        }
    }
}

/// The gradients of `tables` converted into the dtypes they travel as (multiplied by what
/// a peer without loss scales needs), one after the other, into `out` (emptied first).
fn convert_grads(
    tables: &[RowsSpec],
    grads: &Grads<'_>,
    out: &mut Vec<u8>,
) -> Result<(), EncodeError> {
    out.clear();
    let mut at = 0;
    for (i, t) in tables.iter().enumerate() {
        let own = t.own_bytes() as usize;
        let src = grads.block(i, at, own);
        let start = out.len();
        out.resize(start + t.meta().byte_len as usize, 0);
        let mul = t.conversion().flatten();
        float::convert(t.dtype, src, t.wire, &mut out[start..], mul)
            .map_err(|_| EncodeError::BadTensor)?;
        at += own;
    }
    Ok(())
}

/// Queues a `PUSH_ROWS`. Packed blocks that fit one frame are copied into it; larger ones
/// are moved into tensors of their own and sent in chunks. Shared blocks are never copied
/// but by the encoder (up to its `inline_threshold`, 256 bytes by default, where a copy
/// into the frame is cheaper than one more `iovec`): the connection holds them until
/// written, and the frame references them, or they travel in chunks. Gradients that travel
/// in another dtype than submitted are converted first (and then sent as packed blocks).
pub(crate) fn encode_push(
    enc: &mut Encoder,
    out_tensors: &mut Slab<Arc<Tensor>>,
    handle: u64,
    tables: &[RowsSpec],
    ids: &[u64],
    grads: Grads<'_>,
    scratch: &mut RowsEncodeScratch,
) -> Result<(), EncodeError> {
    let mut converted = std::mem::take(&mut scratch.converted);
    let grads = if tables.iter().any(|t| t.conversion().is_some()) {
        if let Err(e) = convert_grads(tables, &grads, &mut converted) {
            scratch.converted = converted;
            return Err(e);
        }
        Grads::Packed(&converted)
    } else {
        grads
    };
    let r = encode_push_blocks(enc, out_tensors, handle, tables, ids, grads, scratch);
    converted.clear();
    converted.shrink_to(SCRATCH_KEPT);
    scratch.converted = converted;
    r
}

fn encode_push_blocks(
    enc: &mut Encoder,
    out_tensors: &mut Slab<Arc<Tensor>>,
    handle: u64,
    tables: &[RowsSpec],
    ids: &[u64],
    grads: Grads<'_>,
    scratch: &mut RowsEncodeScratch,
) -> Result<(), EncodeError> {
    let tokens = &mut scratch.tokens;
    tokens.clear();
    match grads {
        Grads::Packed(grads) => {
            // The meta section (ids and block metas) must fit beside the blocks.
            let meta = 8 * ids.len() as u64 + 96 * tables.len() as u64;
            let in_frame = grads.len() as u64 + meta <= enc.chunk_limit();
            let mut at = 0;
            for t in tables {
                let len = t.meta().byte_len as usize;
                let token = if in_frame {
                    COPY_TOKEN
                } else {
                    let bytes = grads.get(at..at + len).unwrap_or_default();
                    match Tensor::from_slice(t.wire, &t.dims, bytes) {
                        Ok(block) => out_tensors.insert(Arc::new(block)) as u64,
                        Err(_) => COPY_TOKEN,
                    }
                };
                tokens.push(token);
                at += len;
            }
        }
        Grads::Shared(blocks) => tokens.extend(
            blocks
                .iter()
                .map(|(_, b)| out_tensors.insert(b.clone()) as u64),
        ),
    }
    let mut rows: Vec<RowsItem<'_>> = recast(std::mem::take(&mut scratch.rows));
    let (mut id_at, mut byte_at) = (0, 0);
    for (t, &token) in tables.iter().zip(tokens.iter()) {
        let len = t.meta().byte_len as usize;
        let bytes = match (token, &grads) {
            (COPY_TOKEN, Grads::Packed(g)) => g.get(byte_at..byte_at + len).unwrap_or_default(),
            (COPY_TOKEN, Grads::Shared(_)) => &[][..],
            (token, _) => out_tensors
                .get(token as usize)
                .map_or(&[][..], |b| b.bytes()),
        };
        rows.push(RowsItem {
            table: t.table,
            ids: &ids[id_at..id_at + t.len()],
            block: OutTensor {
                meta: t.meta(),
                bytes,
                token,
            },
            loss_scale: t.loss_scale,
        });
        (id_at, byte_at) = (id_at + t.len(), byte_at + len);
    }
    let r = if tokens.len() == tables.len() {
        enc.push_rows(handle, &rows)
    } else {
        Err(EncodeError::BadCount)
    };
    scratch.rows = recast(rows);
    if r.is_err() {
        for &t in tokens.iter().filter(|&&t| t != COPY_TOKEN) {
            out_tensors.try_remove(t as usize);
        }
    }
    r
}

/// A rows pull's answer being assembled: one block per table, checked against the block
/// the request expects, and the rows each table did not have.
pub(crate) struct RowsReply {
    blocks: Tensors,
    /// The block each table expects.
    expected: Vec<RowsSpec>,
    /// The rows not found, all tables', and per table where its are.
    missing: Vec<u32>,
    spans: Vec<(u32, u32)>,
    /// What the PS said of the tables it refused.
    refusal: Option<Arc<str>>,
    /// Row versions: what the request asked for, the versions it held (all tables', in
    /// the order of the ids) and, per id, its version and whether it came unchanged.
    versioning: Versioning,
    versions: RowVersions,
}

/// Whether a rows pull's answer carries row versions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Versioning {
    /// A plain pull.
    Plain,
    /// The pull carried held versions: every block comes with its versions report.
    Asked,
    /// The pull would have, but the peer did not announce `ROW_VERSIONS`: every row comes
    /// as changed, of version 0 (unknown).
    Unknown,
}

impl RowsReply {
    /// The answer to a pull of `tables` (with `held`, the versions held of their ids, or
    /// none), in `spare`'s vectors; with `reuse` (the request uses the runtime's
    /// allocator), its blocks land in the memory `spare` kept from earlier answers when it
    /// fits.
    pub(crate) fn new(
        tables: &[RowsSpec],
        held: &[u64],
        spare: &mut Spare,
        reuse: bool,
    ) -> RowsReply {
        spare.runtime_memory = reuse;
        let blocks = Tensors::new(tables.len(), spare, reuse);
        let mut expected = std::mem::take(&mut spare.expected);
        expected.clear();
        expected.extend_from_slice(tables);
        let mut missing = std::mem::take(&mut spare.missing);
        missing.clear();
        let mut spans = std::mem::take(&mut spare.spans);
        spans.clear();
        spans.resize(tables.len(), (0, 0));
        let mut versions = std::mem::take(&mut spare.versions);
        versions.reset(tables, held);
        RowsReply {
            blocks,
            expected,
            missing,
            spans,
            refusal: None,
            versioning: if held.is_empty() {
                Versioning::Plain
            } else {
                Versioning::Asked
            },
            versions,
        }
    }

    /// The peer did not negotiate `ROW_VERSIONS`: the pull goes without the versions held
    /// and every row comes as changed, of version 0.
    pub(crate) fn unversioned(&mut self) {
        if self.versioning == Versioning::Asked {
            self.versioning = Versioning::Unknown;
        }
    }

    /// Takes the entries of a `RESPONSE` to request `handle`. Blocks get memory from
    /// `alloc`.
    pub(crate) fn accept(
        &mut self,
        handle: u64,
        entries: ResponseEntries<'_>,
        end: bool,
        alloc: &dyn TensorAllocator,
    ) -> Result<(), Violation> {
        for entry in entries {
            let index = entry.index;
            self.blocks.answer(handle, index)?;
            let spec = &self.expected[index as usize];
            let asked = self.versioning == Versioning::Asked;
            if let Some(meta) = &entry.tensor {
                let want = spec.meta();
                let report = &entry.versions;
                let why = match (asked, report.is_empty()) {
                    (true, true) => Some("no row versions, which the request asked for"),
                    (false, false) => Some("row versions the request did not ask for"),
                    (true, false) if report.rows() != spec.len() => {
                        Some("row versions of another row count than the request's")
                    }
                    _ => None,
                };
                if let Some(why) = why {
                    return Err(Violation::BadItem { handle, index, why });
                }
                // With versions, the block holds the rows not unchanged.
                let rows = if asked {
                    report.sent() as u64
                } else {
                    want.dims.get(0).unwrap_or(0)
                };
                let shape_ok = meta.dims.len() == want.dims.len()
                    && meta.dims.get(0) == Some(rows)
                    && meta.dims.iter().skip(1).eq(want.dims.iter().skip(1));
                if meta.dtype != want.dtype || !shape_ok {
                    return Err(Violation::RowsShape { handle, index });
                }
                if asked {
                    self.versions.take(index as usize, report);
                }
            }
            self.spans[index as usize] = (self.missing.len() as u32, entry.missing.len() as u32);
            self.missing.extend(entry.missing.iter());
            self.blocks.accept(handle, &entry, alloc)?;
        }
        self.blocks.end(end);
        Ok(())
    }

    /// The peer did not negotiate `ROW_FORMATS`: the blocks come in the rows' own dtypes.
    pub(crate) fn fall_back(&mut self) {
        for e in self.expected.iter_mut().filter(|e| e.needs_row_formats()) {
            e.fall_back();
        }
    }

    /// What the PS said of the tables it refused (its `ERROR`'s message).
    pub(crate) fn refused(&mut self, why: &str) {
        if !why.is_empty() {
            self.refusal = Some(why.into());
        }
    }

    /// Whether every block has arrived.
    pub(crate) fn is_complete(&self) -> bool {
        self.blocks.is_complete()
    }

    /// The tables' blocks, as assembled so far.
    pub(crate) fn blocks(&mut self) -> &mut Tensors {
        &mut self.blocks
    }

    /// Memory for table `index`'s block.
    pub(crate) fn tensor_mut(
        &mut self,
        index: u32,
        alloc: &dyn TensorAllocator,
        budget: &ConnBudget,
    ) -> Option<&mut Tensor> {
        self.blocks.tensor_mut(index, alloc, budget)
    }

    /// The finished answer; the vectors it does not hand out go back to `spare`.
    pub(crate) fn finish(self, spare: &mut Spare) -> PulledRows {
        spare.expected = self.expected;
        PulledRows {
            blocks: self.blocks.finish(spare),
            missing: self.missing,
            spans: self.spans,
            refusal: self.refusal,
            versions: self.versions,
        }
    }
}

// ----- the server: serving pulls, applying pushes -----

/// Where a table's answer to a `PULL_ROWS` is assembled when it does not go straight into
/// a frame: its ids, its block and the rows not found.
#[derive(Default)]
pub(crate) struct RowsScratch {
    block: Vec<u8>,
    missing: Vec<u32>,
    ids: Vec<u64>,
    refusals: Vec<Refusal>,
    /// Rows in their table's dtype, on their way to or from another one.
    pub(crate) wide: Vec<u8>,
    /// For the tables whose requester holds versions of their rows.
    versions: VersionsScratch,
}

/// Bytes of room each vector of a [`RowsScratch`] keeps between requests: a pull of more
/// rows takes room for itself and gives it back, so one peer's huge request does not stay
/// in the loop's memory.
const SCRATCH_KEPT: usize = 1 << 20;

impl RowsScratch {
    /// Empties the vectors and gives back room above [`SCRATCH_KEPT`].
    fn trim(&mut self) {
        self.block.clear();
        self.missing.clear();
        self.ids.clear();
        self.wide.clear();
        self.wide.shrink_to(SCRATCH_KEPT);
        self.block.shrink_to(SCRATCH_KEPT);
        self.missing.shrink_to(SCRATCH_KEPT / 4);
        self.ids.shrink_to(SCRATCH_KEPT / 8);
        self.versions.trim();
    }
}

/// Answers a `PULL_ROWS` on the loop, one `RESPONSE` frame per table, `END` on the last:
/// its block of rows in request order, written by the table straight into the frame; when
/// rows are missing, the block and the report of them; for a block too large for one
/// frame, a tensor of its own sent in chunks. Rows asked in another float format than
/// their table's are converted when the connection negotiated `ROW_FORMATS`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn serve_pull(
    service: &dyn Service,
    tables: RowsTables<'_>,
    enc: &mut Encoder,
    out_tensors: &mut Slab<Arc<Tensor>>,
    handle: u64,
    scratch: &mut RowsScratch,
    budget: &ConnBudget,
    held: &mut Vec<(u64, Reservation)>,
) {
    // Tables refused for a reason the server can say are answered last, by an ERROR that
    // says it (see `refusal`).
    let mut refusals = std::mem::take(&mut scratch.refusals);
    refusals.clear();
    let convert = enc.features().contains(WireFeatures::ROW_FORMATS);
    for (index, t) in tables.enumerate() {
        let (dtype, dims) = (t.block.dtype, t.block.dims.iter());
        if let Some((status, why)) = refusal(service, Verb::Pull, t.table, dtype, dims, convert) {
            refusals.push(Refusal {
                index: index as u32,
                status,
                why,
            });
        }
    }
    let refused = |index: usize| refusals.iter().any(|r| r.index as usize == index);
    let last = (0..tables.len()).rev().find(|&i| !refused(i));
    for (index, t) in tables.enumerate() {
        if refused(index) {
            continue;
        }
        let end = refusals.is_empty() && Some(index) == last;
        if t.has_held() {
            let (s, index) = (&mut scratch.versions, index as u32);
            match serve_versioned(
                service,
                &t,
                enc,
                out_tensors,
                handle,
                end,
                index,
                s,
                budget,
                held,
            ) {
                Served::Answered => continue,
                Served::Failed => break,
            }
        }
        let (status, mut token) = pull_table(
            service,
            &t,
            enc,
            handle,
            end,
            index as u32,
            scratch,
            out_tensors,
            budget,
            held,
        );
        let Some(status) = status else {
            continue; // answered in the frame
        };
        let meta = TensorMeta {
            chunked: false,
            ..t.block
        };
        // A report of missing rows the requester could not take (4.5).
        let missing = if status.is_ok() {
            scratch.missing.len()
        } else {
            0
        };
        let status = if status.is_ok() && !fits_peer(&meta, missing, enc.peer_limits()) {
            if let Some(t) = token.take() {
                out_tensors.try_remove(t as usize);
                held.retain(|&(h, _)| h != t);
            }
            Status::ResourceExhausted
        } else {
            status
        };
        let tensor = match token {
            _ if !status.is_ok() => None,
            Some(token) => out_tensors.get(token as usize).map(|b| OutTensor {
                meta,
                bytes: b.bytes(),
                token,
            }),
            None => Some(OutTensor {
                meta,
                bytes: &scratch.block,
                token: COPY_TOKEN,
            }),
        };
        let item = ResponseItem {
            versions: Default::default(),
            index: index as u32,
            status,
            tensor,
            missing: Missing::Native(if status.is_ok() {
                &scratch.missing
            } else {
                &[]
            }),
        };
        if send_items(enc, handle, end, &[item]).is_err() {
            release_unsent(out_tensors, token.into_iter());
            break;
        }
    }
    send_refusals(enc, handle, &refusals);
    scratch.refusals = refusals;
    scratch.trim();
}

/// Whether `service` refuses any table of a rows request for a reason it can say
/// (`convert`: the connection negotiated `ROW_FORMATS`).
pub(crate) fn any_refused(
    service: &dyn Service,
    verb: Verb,
    tables: RowsTables<'_>,
    convert: bool,
) -> bool {
    tables.into_iter().any(|t| {
        let (dtype, dims) = (t.block.dtype, t.block.dims.iter());
        refusal(service, verb, t.table, dtype, dims, convert).is_some()
    })
}

/// A `PULL_ROWS` as a job for the handler pool.
pub(crate) fn pull_job(tables: RowsTables<'_>, convert: bool) -> Vec<RowsPull> {
    tables
        .map(|t| RowsPull {
            table: t.table,
            dtype: t.block.dtype,
            dims: t.block.dims.iter().collect(),
            ids: t.ids().collect(),
            convert,
        })
        .collect()
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
    budget: &ConnBudget,
    held: &mut Vec<(u64, Reservation)>,
) -> (Option<Status>, Option<u64>) {
    let convert = enc.features().contains(WireFeatures::ROW_FORMATS);
    let dims = t.block.dims.iter();
    let table = match table_for(service, t.table, t.block.dtype, dims, convert) {
        Ok(table) => table,
        Err(status) => return (Some(status), None),
    };
    let block = TensorMeta {
        chunked: false,
        ..t.block
    };
    if !fits_peer(&block, 0, enc.peer_limits()) {
        // The requester could not take the block it asked for (4.5).
        return (Some(Status::ResourceExhausted), None);
    }
    scratch.ids.clear();
    scratch.ids.extend(t.ids());
    scratch.missing.clear();
    let (ids, wide, wire) = (&scratch.ids, &mut scratch.wide, t.block.dtype);
    let direct = enc.response_block(
        handle,
        end,
        index,
        &t.block,
        &mut scratch.missing,
        &mut scratch.block,
        |out, missing| pull_as(table, ids, wire, out, missing, &mut *wide),
    );
    let (status, token) = match direct {
        Ok(None) => return (None, None),
        Ok(Some(status)) => (status, None),
        Err(_) => {
            // Too large for one frame: a block of its own, sent in chunks, its bytes
            // charged to the connection's part of the receive budget until written.
            let reserved = match budget.reserve(t.block.byte_len) {
                Ok(r) => r,
                Err(_) => {
                    log::warn!(
                        "a rows answer of {} bytes does not fit the receive budget; table {} \
                         is answered RESOURCE_EXHAUSTED",
                        t.block.byte_len,
                        t.table
                    );
                    return (Some(Status::ResourceExhausted), None);
                }
            };
            let dims: Vec<u64> = t.block.dims.iter().collect();
            let Ok(mut block) = Tensor::zeros(t.block.dtype, &dims) else {
                return (Some(Status::ResourceExhausted), None);
            };
            let missing = &mut scratch.missing;
            let status = pull_as(table, ids, wire, block.bytes_mut(), missing, wide);
            let token = status
                .is_ok()
                .then(|| out_tensors.insert(Arc::new(block)) as u64);
            if let Some(token) = token {
                held.push((token, reserved));
            }
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
            held.retain(|&(h, _)| h != token);
        }
        return (Some(Status::Internal), None);
    }
    (Some(status), token)
}

/// Answers a `PULL_ROWS` with the tables a handler thread pulled: their blocks sent by
/// reference, with the missing-rows reports.
pub(crate) fn answer_pulled(
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

/// Applies a received `PUSH_ROWS` on the loop: per table (`tables`), its gradient block
/// (`blocks`) to the rows of its ids, converted through `wide` (kept between pushes) when
/// it is in another dtype than the table's or has a loss scale (`convert`: the connection
/// negotiated `ROW_FORMATS`); one status per table into `statuses` (emptied first).
pub(crate) fn apply_push(
    service: &dyn Service,
    tables: &[u64],
    blocks: &[Result<Tensor, Status>],
    rows: &RowIds,
    statuses: &mut Vec<Status>,
    convert: bool,
    wide: &mut Vec<u8>,
) {
    statuses.clear();
    for (i, (table, block)) in tables.iter().zip(blocks).enumerate() {
        let scale = rows.scales.get(i).copied().flatten();
        statuses.push(match block {
            Ok(block) => {
                let grads = PushedGrads {
                    block,
                    scale,
                    convert,
                };
                apply_rows(service, *table as u32, rows.of(i), grads, wide)
            }
            Err(st) => *st,
        });
    }
    wide.clear();
    wide.shrink_to(SCRATCH_KEPT);
}
