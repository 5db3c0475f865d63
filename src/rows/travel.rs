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
