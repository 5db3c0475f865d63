//! How rows travel when the wire dtype differs from the table's: the checks of the
//! settings that choose it, and an answer's block brought back to the table's dtype.

use crate::cluster::Peer;
use crate::error::{Error, ErrorKind};
use crate::tensor::Tensor;
use crate::wire::{DType, LossScale, Status};

/// Checks that a PS's block (in the table's dtype) is `n` rows of `row_bytes`: what its
/// request asked for.
pub(crate) fn check_block(bytes: &[u8], n: usize, row_bytes: usize) -> Result<(), Error> {
    if bytes.len() == n * row_bytes {
        Ok(())
    } else {
        Err(Error::new(ErrorKind::Protocol))
    }
}

/// Checks that a unique pull of `n` tables was given `n` batches of ids, inverses, unique
/// ids and row buffers (`lens`, in that order); `hint` ends the error.
pub(crate) fn check_unique_counts(n: usize, lens: [usize; 4], hint: &str) -> Result<(), Error> {
    if lens != [n; 4] {
        let [ids, inverse, unique, outs] = lens;
        return Err(Error::invalid(&format!(
            "rows: a unique pull of {n} tables takes {n} batches of ids, inverses, unique ids \
             and row buffers ({ids}, {inverse}, {unique}, {outs} given){hint}"
        )));
    }
    Ok(())
}

/// Checks the buffers of a unique pull of `n` ids of table `table` (rows of `row_bytes`):
/// an inverse of `n`, room for `n` distinct ids and for their rows.
pub(crate) fn check_unique_buffers(
    table: u32,
    n: usize,
    row_bytes: usize,
    (inverse, unique, out): (usize, usize, usize),
) -> Result<(), Error> {
    let need = n.saturating_mul(row_bytes);
    if inverse != n || unique < n || out < need {
        return Err(Error::invalid(&format!(
            "rows: table {table}: a unique pull of {n} ids needs an inverse of {n} (is \
             {inverse}), room for {n} unique ids (is {unique}) and {need} bytes of rows (is \
             {out})"
        )));
    }
    Ok(())
}

/// Checks that a batch of `n` ids can be planned (at most `u32::MAX`).
pub(crate) fn check_batch_size(n: usize) -> Result<(), Error> {
    if u32::try_from(n).is_err() {
        return Err(Error::invalid(&format!(
            "rows: a batch of {n} ids (at most {})",
            u32::MAX
        )));
    }
    Ok(())
}

/// The bytes of `block` in `dtype`: its own when it travelled as `dtype`, else widened
/// or narrowed into `wide` (grown as needed, kept).
pub(crate) fn widened<'a>(
    dtype: DType,
    block: &'a Tensor,
    wide: &'a mut Vec<u8>,
) -> Result<&'a [u8], Error> {
    if block.dtype() == dtype {
        return Ok(block.bytes());
    }
    let (from, to) = (block.dtype().size(), dtype.size());
    let n = match (from, to) {
        (Some(f), Some(t)) if f > 0 => block.byte_len() / f as usize * t as usize,
        _ => return Err(Error::new(ErrorKind::Protocol)),
    };
    if wide.len() < n {
        wide.resize(n, 0);
    }
    crate::float::convert(block.dtype(), block.bytes(), dtype, &mut wide[..n], None)
        .map_err(|e| Error::invalid(&e.to_string()))?;
    Ok(&wide[..n])
}

/// `scale` as a loss scale of table `table`'s `dtype` rows, checked.
pub(crate) fn checked_scale(
    table: u32,
    dtype: DType,
    scale: Option<f32>,
) -> Result<Option<LossScale>, Error> {
    let Some(s) = scale else {
        return Ok(None);
    };
    if crate::float::Float::from_dtype(dtype).is_none() {
        return Err(Error::invalid(&format!(
            "rows: table {table} holds {} rows; a loss scale is for f32, bf16 and f16 rows",
            dtype.name()
        )));
    }
    LossScale::new(s).map(Some).ok_or_else(|| {
        Error::invalid(&format!(
            "rows: loss scale {s:e} out of range: it must be from 2^-126 to 2^126"
        ))
    })
}

/// The error of a part PS `peer` refused with `status`, naming the peer and its task.
pub(crate) fn remote(status: Status, peer: Peer) -> Error {
    let e = Error::new(ErrorKind::Remote(status)).with_peer(peer.addr());
    match peer.task() {
        Some(task) => e.with_task(task),
        None => e,
    }
}
