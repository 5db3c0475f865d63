//! Rows pulls with row versions (`ROW_VERSIONS`, `docs/wire-format.md` 4.9), served: a
//! table section that carries the versions the requester holds is answered with the rows'
//! versions, a bitmap of the positions whose version is the one held (*unchanged*: their
//! bytes are not sent), and a block of the other rows only, in position order.

use std::sync::Arc;

use slab::Slab;

use crate::float;
use crate::pool::{missing_is_ordered, table_for};
use crate::proto::{Encoder, OutTensor, ResponseItem, COPY_TOKEN};
use crate::service::{Service, Table};
use crate::tensor::Tensor;
use crate::wire::{
    versions_bitmap_len, Missing, RowsTable, Status, TensorMeta, Versions, WireFeatures, HEADER_LEN,
};

use super::budget::{ConnBudget, Reservation};
use super::respond::{fits_peer_with, release_unsent, send_items, status_item};

/// Vectors a versioned table answer is assembled in, kept between requests.
#[derive(Default)]
pub(crate) struct VersionsScratch {
    ids: Vec<u64>,
    held: Vec<u64>,
    versions: Vec<u64>,
    missing: Vec<u32>,
    /// The rows in their table's dtype, then compacted to the rows sent.
    rows: Vec<u8>,
    /// The rows sent, converted into the dtype asked for (when it is not the table's).
    converted: Vec<u8>,
    /// The unchanged bitmap and the versions of the positions sent.
    bitmap: Vec<u8>,
    sent: Vec<u64>,
    /// `[rows sent, row...]`.
    dims: Vec<u64>,
}

/// Bytes of room each vector keeps between requests (as the rows scratch's).
const KEPT: usize = 1 << 20;

impl VersionsScratch {
    /// Empties the vectors and gives back room above [`KEPT`] bytes.
    pub(crate) fn trim(&mut self) {
        self.rows.clear();
        self.rows.shrink_to(KEPT);
        self.converted.clear();
        self.converted.shrink_to(KEPT);
        for v in [
            &mut self.ids,
            &mut self.held,
            &mut self.versions,
            &mut self.sent,
        ] {
            v.clear();
            v.shrink_to(KEPT / 8);
        }
        self.missing.clear();
        self.missing.shrink_to(KEPT / 4);
        self.bitmap.clear();
        self.bitmap.shrink_to(KEPT / 8);
    }
}

/// What serving one versioned table did, for the caller's loop over tables.
pub(crate) enum Served {
    /// Answered (by its entry, queued).
    Answered,
    /// The answer could not be encoded: an `ERROR` for the request went out instead.
    Failed,
}

/// Answers table `index` of a `PULL_ROWS`, `t`, whose section carries held versions: one
/// `RESPONSE` entry (`end` on its frame when it is the last), with the versions report,
/// the rows not answered unchanged (converted into the dtype asked for), and the rows
/// missing. A block too large for one frame travels in chunks, its bytes charged to the
/// connection's part of the receive budget (`budget`, the charge kept in `held`) until
/// written.
#[allow(clippy::too_many_arguments)]
pub(crate) fn serve_versioned(
    service: &dyn Service,
    t: &RowsTable<'_>,
    enc: &mut Encoder,
    out_tensors: &mut Slab<Arc<Tensor>>,
    handle: u64,
    end: bool,
    index: u32,
    s: &mut VersionsScratch,
    budget: &ConnBudget,
    held: &mut Vec<(u64, Reservation)>,
) -> Served {
    let status = match pull_compacted(service, t, enc, s) {
        Ok(()) => Status::Ok,
        Err(status) => status,
    };
    let answer =
        |enc: &mut Encoder, item: ResponseItem<'_>| match send_items(enc, handle, end, &[item]) {
            Ok(()) => Served::Answered,
            Err(_) => Served::Failed,
        };
    if !status.is_ok() {
        return answer(enc, status_item(index, status));
    }
    let n = t.len();
    let wire = t.block.dtype;
    let (Some(meta), Some(versions)) = (
        TensorMeta::new(wire, &s.dims),
        Versions::new(n as u32, &s.bitmap, &s.sent),
    ) else {
        return answer(enc, status_item(index, Status::Internal));
    };
    let report = versions.buffer_len() as u64;
    if !fits_peer_with(&meta, s.missing.len(), report, n, enc.peer_limits()) {
        return answer(enc, status_item(index, Status::ResourceExhausted));
    }
    let bytes: &[u8] = if wire == service_dtype(service, t) {
        &s.rows[..meta.byte_len as usize]
    } else {
        &s.converted
    };
    // The entry's meta and the block in one frame when they fit; else the block in chunks.
    let entry_len = 8 + meta.buffer_len() as u64 + report + 4 * s.missing.len() as u64;
    let in_frame = meta.byte_len <= enc.chunk_limit()
        && HEADER_LEN as u64 + entry_len + meta.byte_len <= u64::from(enc.config().max_frame);
    let token = if in_frame {
        COPY_TOKEN
    } else {
        let Ok(reserved) = budget.reserve(meta.byte_len) else {
            log::warn!(
                "a rows answer of {} bytes does not fit the receive budget; table {} is \
                 answered RESOURCE_EXHAUSTED",
                meta.byte_len,
                t.table
            );
            return answer(enc, status_item(index, Status::ResourceExhausted));
        };
        let Ok(block) = Tensor::from_slice(wire, &s.dims, bytes) else {
            return answer(enc, status_item(index, Status::ResourceExhausted));
        };
        let token = out_tensors.insert(Arc::new(block)) as u64;
        held.push((token, reserved));
        token
    };
    let bytes = match token {
        COPY_TOKEN => bytes,
        token => out_tensors
            .get(token as usize)
            .map_or(&[][..], |b| b.bytes()),
    };
    let item = ResponseItem {
        index,
        status: Status::Ok,
        tensor: Some(OutTensor { meta, bytes, token }),
        missing: Missing::Native(&s.missing),
        versions,
    };
    let served = answer(enc, item);
    if matches!(served, Served::Failed) && token != COPY_TOKEN {
        release_unsent(out_tensors, std::iter::once(token));
        held.retain(|&(h, _)| h != token);
    }
    served
}

/// The dtype of the rows of the table `t` names (checked to exist by then).
fn service_dtype(service: &dyn Service, t: &RowsTable<'_>) -> crate::wire::DType {
    service
        .table(t.table)
        .map_or(t.block.dtype, |table| table.dtype())
}

/// Pulls table `t`'s rows with its held versions into `s`: the rows not unchanged
/// compacted to the front of `s.rows` (and converted into the dtype asked for into
/// `s.converted`), the bitmap, the versions sent, the missing positions, and the block's
/// dims. Errors are the entry's status.
fn pull_compacted(
    service: &dyn Service,
    t: &RowsTable<'_>,
    enc: &Encoder,
    s: &mut VersionsScratch,
) -> Result<(), Status> {
    let convert = enc.features().contains(WireFeatures::ROW_FORMATS);
    let table = table_for(
        service,
        t.table,
        t.block.dtype,
        t.block.dims.iter(),
        convert,
    )?;
    let asked = TensorMeta {
        chunked: false,
        ..t.block
    };
    if !fits_peer_with(&asked, 0, 0, 0, enc.peer_limits()) {
        // The requester could not take the block it asked for (4.5).
        return Err(Status::ResourceExhausted);
    }
    let n = t.len();
    let row = table.row_bytes();
    let bytes = n.checked_mul(row).ok_or(Status::InvalidArgument)?;
    s.ids.clear();
    s.ids.extend(t.ids());
    s.held.clear();
    s.held.extend(t.held());
    s.versions.clear();
    s.versions.resize(n, 0);
    s.missing.clear();
    s.rows.clear();
    s.rows.resize(bytes, 0);
    let status = crate::panic::guarded("Table::pull_versioned", || {
        table.pull_versioned(
            &s.ids,
            &s.held,
            &mut s.rows,
            &mut s.versions,
            &mut s.missing,
        )
    })
    .unwrap_or(Status::Internal);
    if !status.is_ok() {
        return Err(status);
    }
    if !missing_is_ordered(&s.missing, n) {
        log::warn!(
            "table {} reported missing rows out of order or range",
            t.table
        );
        return Err(Status::Internal);
    }
    let sent = compact(s, row);
    s.dims.clear();
    s.dims.push(sent as u64);
    s.dims.extend(t.block.dims.iter().skip(1));
    if t.block.dtype != table.dtype() {
        convert_sent(table, t.block.dtype, s, sent)?;
    }
    Ok(())
}

/// Marks the unchanged positions in `s.bitmap` (a version that is nonzero and the one
/// held, the row not missing), moves the other rows (`row` bytes each) to the front of
/// `s.rows` in position order with their versions into `s.sent` (0 for a missing row);
/// the number of rows sent.
fn compact(s: &mut VersionsScratch, row: usize) -> usize {
    let n = s.ids.len();
    s.bitmap.clear();
    s.bitmap.resize(versions_bitmap_len(n), 0);
    s.sent.clear();
    let mut missing = s.missing.iter().peekable();
    let mut k = 0;
    for i in 0..n {
        let is_missing = missing.next_if(|&&p| p as usize == i).is_some();
        let version = if is_missing { 0 } else { s.versions[i] };
        if version != 0 && version == s.held[i] {
            s.bitmap[i / 8] |= 1 << (i % 8);
            continue;
        }
        if k != i {
            s.rows.copy_within(i * row..(i + 1) * row, k * row);
        }
        s.sent.push(version);
        k += 1;
    }
    k
}

/// Converts the `sent` rows at the front of `s.rows` (the table's dtype) into `wire` in
/// `s.converted`.
fn convert_sent(
    table: &dyn Table,
    wire: crate::wire::DType,
    s: &mut VersionsScratch,
    sent: usize,
) -> Result<(), Status> {
    let from = sent * table.row_bytes();
    let to = TensorMeta::new(wire, &s.dims)
        .ok_or(Status::InvalidArgument)?
        .byte_len as usize;
    s.converted.clear();
    s.converted.resize(to, 0);
    float::convert(table.dtype(), &s.rows[..from], wire, &mut s.converted, None)
        .map_err(|_| Status::InvalidArgument)
}
