//! What the stream targets share: frame bodies as native values (to compare what two
//! decoders yielded, or what went into an encoder with what came out), payload targets as
//! plain keys, and the limits and piece sizes an input selects.
#![allow(dead_code)] // each target that includes this module uses a part of it

use starwire::proto::PayloadTarget;
use starwire::wire::{Body, HelloRepr, Limits, TensorMeta};

pub const CAPACITIES: [usize; 8] = [0, 32, 33, 40, 64, 100, 256, 4096];

pub fn limits_for(sel: u8) -> Limits {
    let d = Limits::default();
    match sel & 3 {
        0 => d,
        1 => Limits {
            max_frame: Limits::MIN_FRAME,
            max_key: 8,
            max_tensors: 2,
            max_rank: 2,
            max_tensor_bytes: 4096,
            max_tables: 2,
            max_rows: 16,
            max_row_bytes: 64,
        },
        2 => Limits {
            max_tensors: 1,
            max_rank: 0,
            max_tensor_bytes: 16,
            ..d
        },
        _ => Limits {
            max_frame: Limits::MAX_FRAME,
            max_key: u16::MAX,
            max_tensors: Limits::MAX_TENSORS,
            max_rank: 32,
            max_tensor_bytes: i64::MAX as u64,
            max_tables: Limits::MAX_TABLES,
            max_rows: Limits::MAX_ROWS,
            max_row_bytes: Limits::MAX_ROW_BYTES,
        },
    }
}

pub fn piece_size(b: u8) -> usize {
    if b < 0xc0 {
        b as usize + 1
    } else {
        (b - 0xbf) as usize * 1024
    }
}

// ---------------------------------------------------------------------------------------
// Native forms of a frame body (as in frame_roundtrip).

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NTensor {
    pub dtype: u8,
    pub dead: bool,
    pub chunked: bool,
    pub byte_len: u64,
    pub dims: Vec<u64>,
}

impl NTensor {
    pub fn of(m: &TensorMeta<'_>) -> NTensor {
        NTensor {
            dtype: m.dtype.into(),
            dead: m.dead,
            chunked: m.chunked,
            byte_len: m.byte_len,
            dims: m.dims.iter().collect(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NBody {
    Hello {
        ack: bool,
        cluster_id: u64,
        task_index: u32,
        limits: Limits,
        job: Vec<u8>,
        token: Vec<u8>,
        features: u16,
    },
    Ping,
    Pong,
    Stats,
    Checkpoint,
    Recv {
        fused: bool,
        step_id: u64,
        keys: Vec<Vec<u8>>,
    },
    Pull(Vec<u64>),
    Push(Vec<(u64, NTensor)>),
    Response(Vec<(u32, u16, Option<NTensor>)>),
    Rows {
        push: bool,
        tables: Vec<(u32, NTensor, Vec<u64>)>,
    },
    Error(Vec<u8>),
    Chunk {
        index: u32,
        offset: u64,
    },
    Cancel(Vec<u32>),
}

impl NBody {
    pub fn of(body: &Body<'_>) -> NBody {
        let hello = |h: &HelloRepr<'_>, ack| NBody::Hello {
            ack,
            cluster_id: h.cluster_id,
            task_index: h.task_index,
            limits: h.limits,
            job: h.job.to_vec(),
            token: h.token.to_vec(),
            features: h.features.bits(),
        };
        match body {
            Body::Hello(h) => hello(h, false),
            Body::HelloAck(h) => hello(h, true),
            Body::Ping => NBody::Ping,
            Body::Pong => NBody::Pong,
            Body::Stats => NBody::Stats,
            Body::Checkpoint => NBody::Checkpoint,
            Body::Recv(r) | Body::FusedRecv(r) => NBody::Recv {
                fused: matches!(body, Body::FusedRecv(_)),
                step_id: r.step_id,
                keys: r.keys.map(<[u8]>::to_vec).collect(),
            },
            Body::Pull(ids) => NBody::Pull(ids.iter().collect()),
            Body::Push(p) => NBody::Push(p.map(|e| (e.var_id, NTensor::of(&e.meta))).collect()),
            Body::Response(r) => NBody::Response(
                r.map(|e| (e.index, e.status.into(), e.tensor.as_ref().map(NTensor::of)))
                    .collect(),
            ),
            Body::Error(e) => NBody::Error(e.message.to_vec()),
            Body::Chunk(c) => NBody::Chunk {
                index: c.index,
                offset: c.offset,
            },
            Body::PullRows(t) | Body::PushRows(t) => NBody::Rows {
                push: matches!(body, Body::PushRows(_)),
                tables: t
                    .map(|t| (t.table, NTensor::of(&t.block), t.ids().collect()))
                    .collect(),
            },
            Body::Cancel(items) => NBody::Cancel(items.iter().collect()),
        }
    }

    /// The tensors in payload order with their item index.
    pub fn tensors(&self) -> Vec<(u32, &NTensor)> {
        match self {
            NBody::Push(e) => e
                .iter()
                .enumerate()
                .map(|(i, (_, t))| (i as u32, t))
                .collect(),
            NBody::Response(e) => e
                .iter()
                .filter_map(|(i, _, t)| t.as_ref().map(|t| (*i, t)))
                .collect(),
            NBody::Rows { push: true, tables } => tables
                .iter()
                .enumerate()
                .map(|(i, (_, t, _))| (i as u32, t))
                .collect(),
            _ => Vec::new(),
        }
    }

    /// This body with every `chunked` flag cleared (the encoder decides them).
    pub fn unchunked(&self) -> NBody {
        let mut b = self.clone();
        match &mut b {
            NBody::Push(e) => e.iter_mut().for_each(|(_, t)| t.chunked = false),
            NBody::Rows { tables, .. } => tables.iter_mut().for_each(|(_, t, _)| t.chunked = false),
            NBody::Response(e) => e.iter_mut().for_each(|(_, _, t)| {
                if let Some(t) = t {
                    t.chunked = false
                }
            }),
            _ => {}
        }
        b
    }
}

// ---------------------------------------------------------------------------------------
// Recording what a decoder yields.

/// `PayloadTarget` as a plain tuple: kind, handle, index.
pub type TargetKey = (u8, u64, u32);

/// `PayloadTarget` as an orderable, comparable key.
pub fn target_key(t: PayloadTarget) -> TargetKey {
    match t {
        PayloadTarget::Tensor { index } => (0, 0, index),
        PayloadTarget::Chunk { handle, index } => (1, handle, index),
        PayloadTarget::Opaque => (2, 0, 0),
    }
}
