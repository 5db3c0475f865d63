//! Meta sections of every frame kind (specification section 4).
//!
//! [`Body::parse`] validates a whole meta section against its header and the receiver's
//! limits, including that `payload_len` matches the tensors it declares. The variable-length
//! parts it returns are iterators over the validated bytes: nothing is allocated.

use super::bytes::{get_u16, get_u32, get_u64, put_u16, put_u32, put_u64};
use super::error::truncated_meta;
use super::header::CHUNK_META_LEN;
use super::features::WireFeatures;
use super::rows::{Missing, RowsTables, Versions, ENTRY_HAS_MISSING, ENTRY_HAS_VERSIONS};
use super::tensor::TensorMeta;
use super::{Error, HeaderRepr, FrameKind, Limits, Result, Status};

/// Longest job name in a hello.
pub const MAX_JOB_NAME: usize = 64;
/// Longest cluster token in a hello.
pub const MAX_TOKEN: usize = 64;
/// Longest message in an `ERROR` frame.
pub const MAX_ERROR_MESSAGE: usize = 1024;
/// Response entry flag: a tensor meta follows.
pub const ENTRY_HAS_TENSOR: u16 = 1;

const HELLO_FIXED_LEN: usize = 48;
const RECV_FIXED_LEN: usize = 8;
const RESPONSE_ENTRY_FIXED_LEN: usize = 8;

/// A validated meta section.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Body<'a> {
    /// `HELLO`.
    Hello(HelloRepr<'a>),
    /// `HELLO_ACK`.
    HelloAck(HelloRepr<'a>),
    /// `PING`: the payload is opaque.
    Ping,
    /// `PONG`: the payload echoes the ping.
    Pong,
    /// `RECV` (one key).
    Recv(RecvBody<'a>),
    /// `FUSED_RECV`.
    FusedRecv(RecvBody<'a>),
    /// `PULL`.
    Pull(VarIds<'a>),
    /// `PUSH`.
    Push(PushEntries<'a>),
    /// `RESPONSE`.
    Response(ResponseEntries<'a>),
    /// `ERROR`.
    Error(ErrorRepr<'a>),
    /// `CHUNK`.
    Chunk(ChunkRepr),
    /// `PULL_ROWS`.
    PullRows(RowsTables<'a>),
    /// `PUSH_ROWS`.
    PushRows(RowsTables<'a>),
    /// `CANCEL`: the items given up (none: the whole request).
    Cancel(ItemIndexes<'a>),
    /// `STATS`: no meta, no payload.
    Stats,
    /// `CHECKPOINT`: no meta, no payload.
    Checkpoint,
}

impl<'a> Body<'a> {
    /// Validates `meta` (exactly `header.meta_len` bytes) as the meta section of a frame with
    /// this header, and checks `header.payload_len` against it, on a connection that
    /// negotiated no optional feature.
    pub fn parse(header: &HeaderRepr, meta: &'a [u8], limits: &Limits) -> Result<Body<'a>> {
        Body::parse_with(header, meta, limits, WireFeatures::NONE)
    }

    /// [`parse`](Self::parse) on a connection that negotiated `features` (4.1): what they
    /// add to the format is accepted (with [`WireFeatures::ROW_FORMATS`], the `loss_scale`
    /// of a rows table; with [`WireFeatures::ROW_VERSIONS`], a rows pull's held versions and
    /// an answer's versions report; 4.9).
    pub fn parse_with(
        header: &HeaderRepr,
        meta: &'a [u8],
        limits: &Limits,
        features: WireFeatures,
    ) -> Result<Body<'a>> {
        if meta.len() < header.meta_len as usize {
            return Err(Error::Truncated);
        }
        if meta.len() > header.meta_len as usize {
            return Err(Error::BadMetaLen);
        }
        let body = match header.kind {
            FrameKind::Hello => Body::Hello(HelloRepr::parse(meta, true)?),
            FrameKind::HelloAck => Body::HelloAck(HelloRepr::parse(meta, false)?),
            FrameKind::Ping => Body::Ping,
            FrameKind::Pong => Body::Pong,
            FrameKind::Recv => Body::Recv(RecvBody::parse(meta, header.count, limits)?),
            FrameKind::FusedRecv => Body::FusedRecv(RecvBody::parse(meta, header.count, limits)?),
            FrameKind::Pull => Body::Pull(VarIds::parse(meta, header.count)?),
            FrameKind::Push => {
                let (entries, payload) = PushEntries::parse(meta, header.count, limits)?;
                check_payload(header, payload)?;
                Body::Push(entries)
            }
            FrameKind::Response => {
                let (entries, payload) =
                    ResponseEntries::parse(meta, header.count, limits, features)?;
                check_payload(header, payload)?;
                Body::Response(entries)
            }
            FrameKind::Error => Body::Error(ErrorRepr::parse(meta)?),
            FrameKind::Chunk => Body::Chunk(ChunkRepr::parse(meta)?),
            FrameKind::PullRows => {
                Body::PullRows(RowsTables::parse(meta, header.count, limits, false, features)?.0)
            }
            FrameKind::PushRows => {
                let (tables, payload) =
                    RowsTables::parse(meta, header.count, limits, true, features)?;
                check_payload(header, payload)?;
                Body::PushRows(tables)
            }
            FrameKind::Cancel => Body::Cancel(ItemIndexes::parse(meta, header.count)?),
            FrameKind::Stats => Body::Stats,
            FrameKind::Checkpoint => Body::Checkpoint,
            FrameKind::Unknown(k) => return Err(Error::UnknownKind(k)),
        };
        Ok(body)
    }

    /// The tensors a `PUSH`, `PUSH_ROWS` (its gradient blocks) or `RESPONSE` declares, in
    /// entry order (payload order); empty for other kinds.
    pub fn tensors(&self) -> TensorEntries<'a> {
        match self {
            Body::Push(p) => TensorEntries::Push(*p, 0),
            Body::PushRows(t) => TensorEntries::PushRows(*t, 0),
            Body::Response(r) => TensorEntries::Response(*r),
            _ => TensorEntries::None,
        }
    }
}

fn check_payload(header: &HeaderRepr, inline_bytes: u64) -> Result<()> {
    if inline_bytes != header.payload_len as u64 {
        return Err(Error::BadPayloadLen);
    }
    Ok(())
}

/// Adds the contents of an inline tensor to the payload bytes a frame declares.
fn note_tensor(meta: &TensorMeta<'_>, inline: &mut u64) -> Result<()> {
    if meta.is_inline() {
        *inline = inline
            .checked_add(meta.byte_len)
            .ok_or(Error::BadPayloadLen)?;
    }
    Ok(())
}

/// `HELLO` / `HELLO_ACK` content (4.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HelloRepr<'a> {
    /// Cluster both ends must share.
    pub cluster_id: u64,
    /// Sender's task index.
    pub task_index: u32,
    /// Every limit the sender enforces on what it receives (section 6).
    pub limits: Limits,
    /// Sender's job name.
    pub job: &'a [u8],
    /// Cluster token (empty in `HELLO_ACK`).
    pub token: &'a [u8],
    /// The optional features the sender understands (bits it does not know included, as
    /// they travel).
    pub features: WireFeatures,
}

impl<'a> HelloRepr<'a> {
    fn parse(meta: &'a [u8], is_hello: bool) -> Result<Self> {
        if meta.len() < HELLO_FIXED_LEN {
            return Err(Error::BadMetaLen);
        }
        let job_len = meta[16] as usize;
        let token_len = meta[17] as usize;
        if meta[19] != 0 {
            return Err(Error::ReservedNotZero);
        }
        if meta.len() != HELLO_FIXED_LEN + job_len + token_len {
            return Err(Error::BadMetaLen);
        }
        let job = &meta[HELLO_FIXED_LEN..HELLO_FIXED_LEN + job_len];
        let token = &meta[HELLO_FIXED_LEN + job_len..];
        let repr = HelloRepr {
            cluster_id: get_u64(meta, 0),
            task_index: get_u32(meta, 8),
            limits: Limits {
                max_frame: get_u32(meta, 12),
                max_rank: meta[18],
                max_key: get_u16(meta, 20),
                max_tensors: get_u32(meta, 24),
                max_tables: get_u32(meta, 28),
                max_rows: get_u32(meta, 32),
                max_row_bytes: get_u32(meta, 36),
                max_tensor_bytes: get_u64(meta, 40),
            },
            job,
            token,
            features: WireFeatures::from_bits(get_u16(meta, 22)),
        };
        if !is_hello && !token.is_empty() {
            return Err(Error::BadString);
        }
        repr.check()?;
        Ok(repr)
    }

    /// Checks the job name, token length and announced limits.
    pub fn check(&self) -> Result<()> {
        let job_ok = (1..=MAX_JOB_NAME).contains(&self.job.len())
            && self
                .job
                .iter()
                .all(|c| c.is_ascii_alphanumeric() || *c == b'_' || *c == b'-');
        if !job_ok || self.token.len() > MAX_TOKEN {
            return Err(Error::BadString);
        }
        if self.limits.validate().is_err() {
            return Err(Error::BadLimits);
        }
        Ok(())
    }

    /// Bytes needed to emit.
    pub fn buffer_len(&self) -> usize {
        HELLO_FIXED_LEN + self.job.len() + self.token.len()
    }

    /// Writes exactly `buffer_len()` bytes. The caller has run [`check`](Self::check).
    pub fn emit(&self, buf: &mut [u8]) {
        put_u64(buf, 0, self.cluster_id);
        put_u32(buf, 8, self.task_index);
        let l = &self.limits;
        put_u32(buf, 12, l.max_frame);
        buf[16] = self.job.len() as u8;
        buf[17] = self.token.len() as u8;
        buf[18] = l.max_rank;
        buf[19] = 0;
        put_u16(buf, 20, l.max_key);
        put_u16(buf, 22, self.features.bits());
        put_u32(buf, 24, l.max_tensors);
        put_u32(buf, 28, l.max_tables);
        put_u32(buf, 32, l.max_rows);
        put_u32(buf, 36, l.max_row_bytes);
        put_u64(buf, 40, l.max_tensor_bytes);
        let job_end = HELLO_FIXED_LEN + self.job.len();
        buf[HELLO_FIXED_LEN..job_end].copy_from_slice(self.job);
        buf[job_end..job_end + self.token.len()].copy_from_slice(self.token);
    }
}

/// `RECV` / `FUSED_RECV` content (4.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvBody<'a> {
    /// Step the keys belong to.
    pub step_id: u64,
    /// The keys, in item order.
    pub keys: Keys<'a>,
}

impl<'a> RecvBody<'a> {
    fn parse(meta: &'a [u8], count: u32, limits: &Limits) -> Result<Self> {
        if meta.len() < RECV_FIXED_LEN {
            return Err(Error::BadMetaLen);
        }
        let keys = &meta[RECV_FIXED_LEN..];
        let mut at = 0usize;
        for _ in 0..count {
            let len = keys.get(at..at + 2).ok_or(Error::BadMetaLen)?;
            let len = get_u16(len, 0) as usize;
            if len == 0 || len > limits.max_key as usize {
                return Err(Error::BadKey);
            }
            at += 2 + len;
            if at > keys.len() {
                return Err(Error::BadMetaLen);
            }
        }
        if at != keys.len() {
            return Err(Error::BadMetaLen);
        }
        Ok(RecvBody {
            step_id: get_u64(meta, 0),
            keys: Keys {
                bytes: keys,
                remaining: count,
            },
        })
    }
}

/// Meta length of a recv carrying `keys`.
pub fn recv_meta_len<K: AsRef<[u8]>>(keys: &[K]) -> usize {
    RECV_FIXED_LEN + keys.iter().map(|k| 2 + k.as_ref().len()).sum::<usize>()
}

/// Writes a recv meta section into exactly `recv_meta_len(keys)` bytes of `buf`.
/// Keys must be 1 to 65,535 bytes long (the caller checks them against its limits).
pub fn emit_recv_meta<K: AsRef<[u8]>>(step_id: u64, keys: &[K], buf: &mut [u8]) {
    put_u64(buf, 0, step_id);
    let mut at = RECV_FIXED_LEN;
    for key in keys {
        let key = key.as_ref();
        put_u16(buf, at, key.len() as u16);
        buf[at + 2..at + 2 + key.len()].copy_from_slice(key);
        at += 2 + key.len();
    }
}

/// Iterator over the validated keys of a recv.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keys<'a> {
    bytes: &'a [u8],
    remaining: u32,
}

impl<'a> Iterator for Keys<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        if self.remaining == 0 {
            return None;
        }
        let len = get_u16(self.bytes.get(..2)?, 0) as usize;
        let key = self.bytes.get(2..2 + len)?;
        self.bytes = &self.bytes[2 + len..];
        self.remaining -= 1;
        Some(key)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.remaining as usize, Some(self.remaining as usize))
    }
}

impl ExactSizeIterator for Keys<'_> {}

/// `PULL` content (4.3): variable ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VarIds<'a> {
    bytes: &'a [u8],
}

impl<'a> VarIds<'a> {
    fn parse(meta: &'a [u8], count: u32) -> Result<Self> {
        if meta.len() as u64 != 8 * count as u64 {
            return Err(Error::BadMetaLen);
        }
        Ok(VarIds { bytes: meta })
    }

    /// Number of ids.
    pub fn len(&self) -> usize {
        self.bytes.len() / 8
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// Id `i`.
    pub fn get(&self, i: usize) -> Option<u64> {
        self.bytes.get(8 * i..8 * i + 8).map(|b| get_u64(b, 0))
    }

    /// The ids, in item order.
    pub fn iter(&self) -> impl Iterator<Item = u64> + 'a {
        self.bytes.chunks_exact(8).map(|b| get_u64(b, 0))
    }
}

/// `CANCEL` content (4.10): item indexes of the cancelled request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ItemIndexes<'a> {
    bytes: &'a [u8],
}

impl<'a> ItemIndexes<'a> {
    fn parse(meta: &'a [u8], count: u32) -> Result<Self> {
        if meta.len() as u64 != 4 * count as u64 {
            return Err(Error::BadMetaLen);
        }
        Ok(ItemIndexes { bytes: meta })
    }

    /// Number of indexes.
    pub fn len(&self) -> usize {
        self.bytes.len() / 4
    }

    /// Whether there are none (the whole request is cancelled).
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The indexes, in order.
    pub fn iter(&self) -> impl Iterator<Item = u32> + 'a {
        self.bytes.chunks_exact(4).map(|b| get_u32(b, 0))
    }
}

/// Meta length of a cancel of `n` items.
pub fn cancel_meta_len(n: usize) -> usize {
    4 * n
}

/// Writes a cancel meta section into exactly `cancel_meta_len(items.len())` bytes.
pub fn emit_cancel_meta(items: &[u32], buf: &mut [u8]) {
    for (i, index) in items.iter().enumerate() {
        put_u32(buf, 4 * i, *index);
    }
}

/// Meta length of a pull of `n` ids.
pub fn pull_meta_len(n: usize) -> usize {
    8 * n
}

/// Writes a pull meta section into exactly `pull_meta_len(ids.len())` bytes.
pub fn emit_pull_meta(ids: &[u64], buf: &mut [u8]) {
    for (i, id) in ids.iter().enumerate() {
        put_u64(buf, 8 * i, *id);
    }
}

/// One `PUSH` entry (4.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PushEntry<'a> {
    /// Variable the tensor is for.
    pub var_id: u64,
    /// The tensor.
    pub meta: TensorMeta<'a>,
}

impl PushEntry<'_> {
    /// Bytes needed to emit.
    pub fn buffer_len(&self) -> usize {
        8 + self.meta.buffer_len()
    }

    /// Writes exactly `buffer_len()` bytes.
    pub fn emit(&self, buf: &mut [u8]) {
        put_u64(buf, 0, self.var_id);
        self.meta.emit(&mut buf[8..]);
    }
}

/// Iterator over validated `PUSH` entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PushEntries<'a> {
    bytes: &'a [u8],
    remaining: u32,
}

impl<'a> PushEntries<'a> {
    /// No entries.
    pub(crate) fn empty() -> PushEntries<'static> {
        PushEntries {
            bytes: &[],
            remaining: 0,
        }
    }

    /// Validates the entries; returns them and the inline payload bytes they declare.
    fn parse(meta: &'a [u8], count: u32, limits: &Limits) -> Result<(Self, u64)> {
        let (mut at, mut inline) = (0usize, 0u64);
        for _ in 0..count {
            let rest = meta.get(at..).ok_or(Error::BadMetaLen)?;
            if rest.len() < 8 {
                return Err(Error::BadMetaLen);
            }
            let (tensor, len) = TensorMeta::parse(&rest[8..], limits).map_err(truncated_meta)?;
            note_tensor(&tensor, &mut inline)?;
            at += 8 + len;
        }
        if at != meta.len() {
            return Err(Error::BadMetaLen);
        }
        let entries = PushEntries {
            bytes: meta,
            remaining: count,
        };
        Ok((entries, inline))
    }
}

impl<'a> Iterator for PushEntries<'a> {
    type Item = PushEntry<'a>;

    fn next(&mut self) -> Option<PushEntry<'a>> {
        if self.remaining == 0 {
            return None;
        }
        let var_id = get_u64(self.bytes.get(..8)?, 0);
        let (meta, len) = TensorMeta::parse_validated(self.bytes.get(8..)?)?;
        self.bytes = self.bytes.get(8 + len..)?;
        self.remaining -= 1;
        Some(PushEntry { var_id, meta })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.remaining as usize, Some(self.remaining as usize))
    }
}

/// One `RESPONSE` entry (4.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResponseEntry<'a> {
    /// The request item answered.
    pub index: u32,
    /// The item's status.
    pub status: Status,
    /// The tensor, for successful recv and pull items (for a rows pull: the block).
    pub tensor: Option<TensorMeta<'a>>,
    /// For a rows pull: the rows not found (empty when all were). Only with a tensor.
    pub missing: Missing<'a>,
    /// For a rows pull that carried held versions: the rows' versions and the positions
    /// answered unchanged (empty otherwise). Only with a tensor.
    pub versions: Versions<'a>,
}

impl ResponseEntry<'_> {
    /// Bytes needed to emit.
    pub fn buffer_len(&self) -> usize {
        RESPONSE_ENTRY_FIXED_LEN
            + self.tensor.map_or(0, |t| t.buffer_len())
            + self.versions.buffer_len()
            + self.missing.buffer_len()
    }

    /// Writes exactly `buffer_len()` bytes.
    pub fn emit(&self, buf: &mut [u8]) {
        put_u32(buf, 0, self.index);
        put_u16(buf, 4, self.status.into());
        let mut flags = 0;
        if self.tensor.is_some() {
            flags |= ENTRY_HAS_TENSOR;
        }
        if !self.missing.is_empty() {
            flags |= ENTRY_HAS_MISSING;
        }
        if !self.versions.is_empty() {
            flags |= ENTRY_HAS_VERSIONS;
        }
        put_u16(buf, 6, flags);
        let mut at = RESPONSE_ENTRY_FIXED_LEN;
        if let Some(t) = self.tensor {
            t.emit(&mut buf[at..]);
            at += t.buffer_len();
        }
        self.versions.emit(&mut buf[at..]);
        at += self.versions.buffer_len();
        self.missing.emit(&mut buf[at..]);
    }
}

/// Iterator over validated `RESPONSE` entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResponseEntries<'a> {
    bytes: &'a [u8],
    remaining: u32,
}

impl<'a> ResponseEntries<'a> {
    fn parse(
        meta: &'a [u8],
        count: u32,
        limits: &Limits,
        features: WireFeatures,
    ) -> Result<(Self, u64)> {
        let (mut at, mut inline) = (0usize, 0u64);
        let mut known = ENTRY_HAS_TENSOR | ENTRY_HAS_MISSING;
        if features.contains(WireFeatures::ROW_VERSIONS) {
            known |= ENTRY_HAS_VERSIONS;
        }
        for _ in 0..count {
            let rest = meta.get(at..).ok_or(Error::BadMetaLen)?;
            if rest.len() < RESPONSE_ENTRY_FIXED_LEN {
                return Err(Error::BadMetaLen);
            }
            let status = Status::from(get_u16(rest, 4));
            let flags = get_u16(rest, 6);
            if flags & !known != 0 {
                return Err(Error::BadFlags);
            }
            at += RESPONSE_ENTRY_FIXED_LEN;
            if flags & ENTRY_HAS_TENSOR != 0 {
                if !status.is_ok() {
                    return Err(Error::BadEntry);
                }
                let (tensor, len) = TensorMeta::parse(&rest[RESPONSE_ENTRY_FIXED_LEN..], limits)
                    .map_err(truncated_meta)?;
                note_tensor(&tensor, &mut inline)?;
                at += len;
                let block_rows = tensor.dims.get(0);
                let mut versions = Versions::default();
                if flags & ENTRY_HAS_VERSIONS != 0 {
                    let rows = block_rows.ok_or(Error::BadVersions)?;
                    let (v, len) = Versions::parse(&meta[at..], rows, limits)?;
                    versions = v;
                    at += len;
                }
                if flags & ENTRY_HAS_MISSING != 0 {
                    // Positions in the request's rows: with versions, all of them.
                    let rows = match versions.is_empty() {
                        true => block_rows.ok_or(Error::BadMissing)?,
                        false => versions.rows() as u64,
                    };
                    let (missing, len) = Missing::parse(&meta[at..], rows, limits)?;
                    if !versions.is_empty() && !missing_rows_unversioned(&versions, &missing) {
                        return Err(Error::BadVersions);
                    }
                    at += len;
                }
            } else if flags & (ENTRY_HAS_MISSING | ENTRY_HAS_VERSIONS) != 0 {
                return Err(if flags & ENTRY_HAS_MISSING != 0 {
                    Error::BadMissing
                } else {
                    Error::BadVersions
                });
            }
        }
        if at != meta.len() {
            return Err(Error::BadMetaLen);
        }
        let entries = ResponseEntries {
            bytes: meta,
            remaining: count,
        };
        Ok((entries, inline))
    }
}

impl<'a> Iterator for ResponseEntries<'a> {
    type Item = ResponseEntry<'a>;

    fn next(&mut self) -> Option<ResponseEntry<'a>> {
        if self.remaining == 0 {
            return None;
        }
        let fixed = self.bytes.get(..RESPONSE_ENTRY_FIXED_LEN)?;
        let index = get_u32(fixed, 0);
        let status = Status::from(get_u16(fixed, 4));
        let flags = get_u16(fixed, 6);
        let mut len = RESPONSE_ENTRY_FIXED_LEN;
        let tensor = if flags & ENTRY_HAS_TENSOR != 0 {
            let (t, l) = TensorMeta::parse_validated(self.bytes.get(len..)?)?;
            len += l;
            Some(t)
        } else {
            None
        };
        let mut versions = Versions::default();
        if flags & ENTRY_HAS_VERSIONS != 0 {
            let (v, l) = Versions::parse_validated(self.bytes.get(len..)?)?;
            versions = v;
            len += l;
        }
        let mut missing = Missing::default();
        if flags & ENTRY_HAS_MISSING != 0 {
            let (m, l) = Missing::parse_validated(self.bytes.get(len..)?)?;
            missing = m;
            len += l;
        }
        self.bytes = self.bytes.get(len..)?;
        self.remaining -= 1;
        Some(ResponseEntry {
            index,
            status,
            tensor,
            missing,
            versions,
        })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.remaining as usize, Some(self.remaining as usize))
    }
}

/// Whether every missing position of a versioned answer is sent (not unchanged) with
/// version 0: one pass over the bitmap and the (increasing) positions.
fn missing_rows_unversioned(versions: &Versions<'_>, missing: &Missing<'_>) -> bool {
    let bitmap = versions.unchanged_bitmap();
    // Unchanged positions before byte `byte` of the bitmap, counted as the bytes pass.
    let (mut byte, mut unchanged_before) = (0usize, 0usize);
    for p in missing.iter() {
        let p = p as usize;
        while byte < p / 8 {
            unchanged_before += bitmap[byte].count_ones() as usize;
            byte += 1;
        }
        let low = bitmap[p / 8] & ((1u8 << (p % 8)) - 1);
        if versions.is_unchanged(p) {
            return false;
        }
        let k = p - unchanged_before - low.count_ones() as usize;
        if versions.sent_version(k) != Some(0) {
            return false;
        }
    }
    true
}

/// A tensor declared by a `PUSH` or `RESPONSE`, with the item index it belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorEntry<'a> {
    /// Item index: position in a push, `index` field in a response.
    pub index: u32,
    /// The tensor meta.
    pub meta: TensorMeta<'a>,
}

/// Iterator over the tensors of a body, in payload order.
#[derive(Debug, Clone, Copy)]
pub enum TensorEntries<'a> {
    /// A push's entries, with the position of the next one.
    Push(PushEntries<'a>, u32),
    /// A rows push's tables, with the position of the next one.
    PushRows(RowsTables<'a>, u32),
    /// A response's entries that carry tensors.
    Response(ResponseEntries<'a>),
    /// A kind without tensors.
    None,
}

impl<'a> Iterator for TensorEntries<'a> {
    type Item = TensorEntry<'a>;

    fn next(&mut self) -> Option<TensorEntry<'a>> {
        match self {
            TensorEntries::Push(entries, position) => {
                let e = entries.next()?;
                let index = *position;
                *position += 1;
                Some(TensorEntry {
                    index,
                    meta: e.meta,
                })
            }
            TensorEntries::PushRows(tables, position) => {
                let t = tables.next()?;
                let index = *position;
                *position += 1;
                Some(TensorEntry {
                    index,
                    meta: t.block,
                })
            }
            TensorEntries::Response(entries) => loop {
                let e = entries.next()?;
                if let Some(meta) = e.tensor {
                    return Some(TensorEntry {
                        index: e.index,
                        meta,
                    });
                }
            },
            TensorEntries::None => None,
        }
    }
}

/// `ERROR` content (4.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorRepr<'a> {
    /// Human-readable text; UTF-8 by convention, not by guarantee.
    pub message: &'a [u8],
}

impl<'a> ErrorRepr<'a> {
    fn parse(meta: &'a [u8]) -> Result<Self> {
        if meta.len() < 2 {
            return Err(Error::BadMetaLen);
        }
        let len = get_u16(meta, 0) as usize;
        if len > MAX_ERROR_MESSAGE {
            return Err(Error::BadString);
        }
        if meta.len() != 2 + len {
            return Err(Error::BadMetaLen);
        }
        Ok(ErrorRepr {
            message: &meta[2..],
        })
    }

    /// An error carrying `message`, cut to at most [`MAX_ERROR_MESSAGE`] bytes without
    /// splitting a UTF-8 sequence.
    pub fn new(message: &'a [u8]) -> Self {
        let mut len = message.len().min(MAX_ERROR_MESSAGE);
        if len < message.len() {
            // Back off over continuation bytes (0b10xx_xxxx) to a character boundary.
            while len > 0 && message[len] & 0xC0 == 0x80 {
                len -= 1;
            }
        }
        ErrorRepr {
            message: &message[..len],
        }
    }

    /// Bytes needed to emit.
    pub fn buffer_len(&self) -> usize {
        2 + self.message.len()
    }

    /// Writes exactly `buffer_len()` bytes.
    pub fn emit(&self, buf: &mut [u8]) {
        put_u16(buf, 0, self.message.len() as u16);
        buf[2..2 + self.message.len()].copy_from_slice(self.message);
    }
}

/// `CHUNK` content (4.8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkRepr {
    /// Item index of the chunked tensor.
    pub index: u32,
    /// Offset of this chunk's bytes in the tensor's contents.
    pub offset: u64,
}

impl ChunkRepr {
    fn parse(meta: &[u8]) -> Result<Self> {
        if meta.len() != CHUNK_META_LEN {
            return Err(Error::BadMetaLen);
        }
        if get_u32(meta, 4) != 0 {
            return Err(Error::ReservedNotZero);
        }
        Ok(ChunkRepr {
            index: get_u32(meta, 0),
            offset: get_u64(meta, 8),
        })
    }

    /// Bytes needed to emit.
    pub const fn buffer_len(&self) -> usize {
        CHUNK_META_LEN
    }

    /// Writes exactly `buffer_len()` bytes.
    pub fn emit(&self, buf: &mut [u8]) {
        put_u32(buf, 0, self.index);
        put_u32(buf, 4, 0);
        put_u64(buf, 8, self.offset);
    }
}
