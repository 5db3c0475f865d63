//! Why a table refuses a rows request, in words, and how the words reach the requester.
//!
//! A `RESPONSE` entry carries a status and no text, so a table the server refuses for a
//! reason it can say (no such table; rows of another type or shape than the table holds)
//! is not answered by an entry: the other tables are answered first, then one `ERROR` for
//! the request, whose status every item not yet answered takes, says why for each refused
//! table (`docs/wire-format.md`, 4.5 and 4.9). Refused tables whose status differs from the
//! first one's are answered by entries before it, and still named in its message.

use std::fmt::Write as _;

use crate::pool::serves_as;
use crate::proto::{Encoder, ResponseItem};
use crate::service::Service;
use crate::tensor::Tensor;
use crate::wire::{DType, Missing, Status};

use super::respond::{recast, send_items};

/// A table of a rows request the server refuses: its index in the request, the status,
/// and why.
pub(crate) struct Refusal {
    pub index: u32,
    pub status: Status,
    pub why: String,
}

/// What a rows request does with a table: pulls its rows, or pushes gradients to them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verb {
    Pull,
    Push,
}

/// Why `service` refuses table `table` of a rows request whose block is `dtype` shaped
/// `dims` (`[rows, row dims...]`), on a connection that negotiated `ROW_FORMATS` when
/// `convert`; `None` when it takes it. Mirrors [`table_for`](crate::pool::table_for): the
/// same cases, in words.
pub(crate) fn refusal(
    service: &dyn Service,
    verb: Verb,
    table: u32,
    dtype: DType,
    dims: impl Iterator<Item = u64> + Clone,
    convert: bool,
) -> Option<(Status, String)> {
    let Some(t) = service.table(table) else {
        let mut why = format!("no table {table} on this task");
        let served = service.table_ids();
        match served.as_slice() {
            // A service that does not list its tables.
            [] => {}
            [one] => {
                let _ = write!(why, " (this task serves table {one})");
            }
            ids => {
                why.push_str(" (this task serves tables ");
                for (i, id) in ids.iter().take(16).enumerate() {
                    let sep = if i == 0 { "" } else { ", " };
                    let _ = write!(why, "{sep}{id}");
                }
                if ids.len() > 16 {
                    let _ = write!(why, " and {} more", ids.len() - 16);
                }
                why.push(')');
            }
        }
        return Some((Status::NotFound, why));
    };
    let mut row = dims.clone();
    let rows = row.next();
    let same_rows = t.row_dims().iter().copied().eq(row.clone());
    if rows.is_some() && serves_as(t.dtype(), dtype, convert) && same_rows {
        return None; // no allocation on the way of a request served
    }
    let asked: Vec<u64> = row.collect();
    let held = shape(t.dtype(), t.row_dims());
    let mut why = match (rows, verb) {
        (None, _) => {
            format!("table {table} holds {held} rows; the request's block has no rows dimension")
        }
        (Some(_), Verb::Pull) => format!(
            "table {table} holds {held} rows; the request asked for {}",
            shape(dtype, &asked)
        ),
        (Some(_), Verb::Push) => format!(
            "table {table} holds {held} rows; the push sent {} gradients",
            shape(dtype, &asked)
        ),
    };
    if !convert && same_rows && crate::float::convertible(t.dtype(), dtype) {
        why.push_str(
            " (rows in another float format than the table's need the row_formats feature, \
             which this connection did not negotiate)",
        );
    }
    Some((Status::InvalidArgument, why))
}

/// `f32 [4]`, `bf16 [2, 2]`.
fn shape(dtype: DType, dims: &[u64]) -> String {
    let mut s = format!("{} [", dtype.name());
    for (i, d) in dims.iter().enumerate() {
        let sep = if i == 0 { "" } else { ", " };
        let _ = write!(s, "{sep}{d}");
    }
    s.push(']');
    s
}

/// Answers a rows push `handle` with a status per table (`statuses`), the tables in
/// `refusals` answered last with the words (see [`send_refusals`]).
pub(crate) fn answer_statuses(
    enc: &mut Encoder,
    handle: u64,
    statuses: &[Status],
    refusals: &[Refusal],
    spare: &mut Vec<ResponseItem<'static>>,
) {
    let mut items: Vec<ResponseItem<'_>> = recast(std::mem::take(spare));
    items.extend(
        statuses
            .iter()
            .enumerate()
            .filter(|(index, _)| !refusals.iter().any(|r| r.index as usize == *index))
            .map(|(index, &status)| ResponseItem {
                versions: Default::default(),
                index: index as u32,
                status,
                tensor: None,
                missing: Missing::default(),
            }),
    );
    let sent = items.is_empty() || send_items(enc, handle, refusals.is_empty(), &items).is_ok();
    if sent {
        send_refusals(enc, handle, refusals);
    }
    *spare = recast(items);
}

/// The tables of a received rows push (`tables`, their blocks `blocks`) that `service`
/// refuses for a reason it can say, into `out` (emptied first); `convert` as for
/// [`refusal`].
pub(crate) fn push_refusals(
    service: &dyn Service,
    tables: &[u64],
    blocks: &[Result<Tensor, Status>],
    out: &mut Vec<Refusal>,
    convert: bool,
) {
    out.clear();
    for (index, (&table, block)) in tables.iter().zip(blocks).enumerate() {
        let Ok(block) = block else { continue };
        let meta = block.meta();
        let Ok(table) = u32::try_from(table) else {
            continue;
        };
        if let Some((status, why)) = refusal(
            service,
            Verb::Push,
            table,
            meta.dtype,
            meta.dims.iter(),
            convert,
        ) {
            out.push(Refusal {
                index: index as u32,
                status,
                why,
            });
        }
    }
}

/// Ends the answer to request `handle` with its refused tables: entries for those whose
/// status differs from the first's, then one `ERROR` (status of the first, every refusal
/// named in its message) that fails every item not answered yet and ends the answer.
pub(crate) fn send_refusals(enc: &mut Encoder, handle: u64, refusals: &[Refusal]) {
    let Some(first) = refusals.first() else {
        return;
    };
    let others: Vec<ResponseItem<'_>> = refusals
        .iter()
        .filter(|r| r.status != first.status)
        .map(|r| ResponseItem {
            versions: Default::default(),
            index: r.index,
            status: r.status,
            tensor: None,
            missing: Missing::default(),
        })
        .collect();
    if !others.is_empty() && send_items(enc, handle, false, &others).is_err() {
        return;
    }
    let mut why = String::new();
    for (i, r) in refusals.iter().enumerate() {
        if i > 0 {
            why.push_str("; ");
        }
        why.push_str(&r.why);
    }
    let _ = enc.error(handle, first.status, &why);
}
