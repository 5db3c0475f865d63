//! Encoding answers: `RESPONSE` frames that fit the peer's frame limit, tensors sent by
//! reference (held by the connection until written), and the vectors that encoding lends
//! and takes back so that answering allocates nothing in steady state.

use std::sync::Arc;

use slab::Slab;

use crate::proto::{Encoder, OutTensor, ResponseItem, COPY_TOKEN};
use crate::tensor::Tensor;
use crate::wire::{Limits, Missing, Status, TensorMeta, HEADER_LEN};

/// The tensor as encoder input: its meta, its bytes, and the caller's `token` for them.
#[inline]
pub(crate) fn out_tensor(t: &Tensor, token: u64) -> OutTensor<'_> {
    OutTensor {
        meta: t.meta(),
        bytes: t.bytes(),
        token,
    }
}

/// An item of an answer with `status` and no tensor.
pub(crate) fn status_item(index: u32, status: Status) -> ResponseItem<'static> {
    ResponseItem {
        versions: Default::default(),
        index,
        status,
        tensor: None,
        missing: Missing::default(),
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

/// Answers `handle` with one item per `(status, tensor, missing rows)` in one frame (or
/// more, `END` on the last): an `OK` item's tensor is sent by reference (held in
/// `out_tensors` until written); an `OK` item without one fails with `INTERNAL`.
pub(crate) fn answer_by_reference<'a>(
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
                versions: Default::default(),
                index: index as u32,
                status: Status::Ok,
                tensor: Some(out_tensor(t, *token)),
                missing: Missing::Native(missing),
            },
            _ => ResponseItem {
                versions: Default::default(),
                index: index as u32,
                status: if status.is_ok() {
                    Status::Internal
                } else {
                    status
                },
                tensor: None,
                missing: Missing::default(),
            },
        },
    ));
    let peer = *enc.peer_limits();
    fit_to_peer(&mut out, &peer, |at, token| {
        out_tensors.try_remove(token as usize);
        tokens[at] = None;
    });
    if let Err(k) = send_items(enc, handle, true, &out) {
        release_unsent(out_tensors, tokens[k..].iter().flatten().copied());
    }
    *spare = recast(out);
}

/// Drops the references of tensors whose items were not encoded (those already queued keep
/// theirs until written).
pub(crate) fn release_unsent(
    out_tensors: &mut Slab<Arc<Tensor>>,
    tokens: impl Iterator<Item = u64>,
) {
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
                versions: Default::default(),
                index: index as u32,
                status,
                tensor: None,
                missing: Missing::default(),
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

/// Sends `items` in `RESPONSE` frames that fit the peer's frame limit, `end` on the last.
/// When a frame cannot be encoded, sends an `ERROR` for the request instead and returns
/// the index of the first item not sent.
pub(crate) fn send_items(
    enc: &mut Encoder,
    handle: u64,
    end: bool,
    items: &[ResponseItem<'_>],
) -> Result<(), usize> {
    let budget = (enc.config().max_frame / 2) as usize;
    // The peer's count limit binds every frame (4.5): more items go in more frames.
    let most = (enc.peer_limits().max_tensors as usize).max(1);
    let mut start = 0;
    loop {
        let mut stop = start;
        let mut size = 0;
        while stop < items.len() && stop - start < most {
            let item = &items[stop];
            let len = 8
                + item.tensor.map_or(0, |t| t.meta.buffer_len())
                + 4 * item.missing.len()
                + item.versions.buffer_len();
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

/// Whether the peer, by the limits it announced (`peer`), accepts an answer item with a
/// tensor of `meta` and a missing-rows report of `missing` positions: the tensor's rank and
/// size, and the report's length and room in a frame (4.1, 4.5, 6).
#[inline]
pub(crate) fn fits_peer(meta: &TensorMeta<'_>, missing: usize, peer: &Limits) -> bool {
    fits_peer_with(meta, missing, 0, 0, peer)
}

/// [`fits_peer`] for an item that also carries a row-versions report of `versions_len`
/// bytes over `rows` positions (4.9), which must fit beside the rest and list at most the
/// peer's `max_rows` positions.
pub(crate) fn fits_peer_with(
    meta: &TensorMeta<'_>,
    missing: usize,
    versions_len: u64,
    rows: usize,
    peer: &Limits,
) -> bool {
    let report = if missing > 0 {
        4 + 4 * missing as u64
    } else {
        0
    };
    let head = (HEADER_LEN + 8 + meta.buffer_len()) as u64 + report + versions_len;
    meta.dims.len() <= peer.max_rank as usize
        && meta.byte_len <= peer.max_tensor_bytes
        && missing <= peer.max_rows as usize
        && rows <= peer.max_rows as usize
        && head <= u64::from(peer.max_frame)
}

/// Replaces every item of `items` the peer would refuse (see [`fits_peer`]) by its status
/// `RESOURCE_EXHAUSTED`: the remedy of 4.5 for an answer over a requester's limit.
/// `dropped` is told the position and tensor token of each item replaced whose tensor the
/// connection holds (to drop it, and forget its token).
pub(crate) fn fit_to_peer(
    items: &mut [ResponseItem<'_>],
    peer: &Limits,
    mut dropped: impl FnMut(usize, u64),
) {
    for (at, item) in items.iter_mut().enumerate() {
        let Some(t) = item.tensor else {
            continue;
        };
        if fits_peer(&t.meta, item.missing.len(), peer) {
            continue;
        }
        log::debug!(
            "answer item {} over a limit its requester announced; answered RESOURCE_EXHAUSTED",
            item.index
        );
        if t.token != COPY_TOKEN {
            dropped(at, t.token);
        }
        *item = status_item(item.index, Status::ResourceExhausted);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recast_keeps_the_allocation_of_borrowing_items() {
        let mut v: Vec<ResponseItem<'static>> = Vec::with_capacity(100);
        v.push(ResponseItem {
            versions: Default::default(),
            index: 1,
            status: Status::Ok,
            tensor: None,
            missing: Missing::default(),
        });
        let ptr = v.as_ptr() as usize;
        let bytes = [0u8; 4];
        let mut w: Vec<ResponseItem<'_>> = recast(v);
        assert!(w.is_empty());
        assert_eq!((w.as_ptr() as usize, w.capacity()), (ptr, 100));
        w.push(ResponseItem {
            versions: Default::default(),
            index: 0,
            status: Status::Ok,
            tensor: Some(crate::proto::OutTensor {
                meta: crate::wire::TensorMeta::dead(crate::wire::DType::U8),
                bytes: &bytes,
                token: 0,
            }),
            missing: Missing::default(),
        });
        let back: Vec<ResponseItem<'static>> = recast(w);
        assert_eq!((back.as_ptr() as usize, back.capacity()), (ptr, 100));
        let push: Vec<crate::proto::PushItem<'static>> =
            recast(Vec::<crate::proto::PushItem<'_>>::with_capacity(8));
        assert_eq!(push.capacity(), 8);
    }
}
