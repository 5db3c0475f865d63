//! The fixed 32-byte frame header (specification section 2.1).

use super::bytes::{get_u16, get_u32, get_u64, put_u16, put_u32, put_u64};
use super::macros::enum_with_unknown;
use super::{Error, Limits, Result, Status};

/// `SWRE`: the first four bytes of every frame.
pub const MAGIC: [u8; 4] = *b"SWRE";
/// The protocol version this module speaks.
pub const VERSION: u8 = 2;
/// Length of the header in bytes.
pub const HEADER_LEN: usize = 32;
/// `flags` bit 0: the last frame answering a request.
pub const FLAG_END: u16 = 1;
/// The `meta_len` of every `CHUNK` frame: its meta section has a fixed length.
pub(super) const CHUNK_META_LEN: usize = 16;

mod field {
    use core::ops::Range;
    pub const MAGIC: Range<usize> = 0..4;
    pub const VERSION: usize = 4;
    pub const KIND: usize = 5;
    pub const FLAGS: usize = 6;
    pub const STATUS: usize = 8;
    pub const RESERVED: usize = 10;
    /// On request kinds, in place of `status` and `reserved`.
    pub const TIMEOUT: usize = 8;
    pub const COUNT: usize = 12;
    pub const HANDLE: usize = 16;
    pub const META_LEN: usize = 24;
    pub const PAYLOAD_LEN: usize = 28;
}

enum_with_unknown! {
    /// Frame kind (specification section 3).
    pub enum FrameKind(u8) {
        /// Client's first frame: protocol, cluster and task identity.
        Hello = 1,
        /// Server's acceptance of a `HELLO`.
        HelloAck = 2,
        /// Ping request with opaque payload.
        Ping = 3,
        /// Answer to a ping, echoing its payload.
        Pong = 4,
        /// Recv of one rendezvous key.
        Recv = 5,
        /// Recv of many keys in one round trip.
        FusedRecv = 6,
        /// Read of variables by id.
        Pull = 7,
        /// Delivery of tensors (gradients) by variable id.
        Push = 8,
        /// Answer carrying per-item statuses and tensors.
        Response = 9,
        /// Failure of a whole request, or of the connection.
        Error = 10,
        /// A piece of a chunked tensor.
        Chunk = 11,
        /// Read of embedding rows by id, one packed block per table.
        PullRows = 12,
        /// Delivery of gradient rows by id, one packed block per table.
        PushRows = 13,
        /// The requester gave up a request (or some of its items): answer it no further.
        Cancel = 14,
        /// Request for the responder's counters and latencies (a JSON document).
        Stats = 15,
        /// Request that the responder save its tables to its checkpoint directory.
        Checkpoint = 16,
    }
}

impl FrameKind {
    /// Whether frames of this kind are requests that need a nonzero handle.
    pub fn is_request(self) -> bool {
        matches!(
            self,
            FrameKind::Ping
                | FrameKind::Recv
                | FrameKind::FusedRecv
                | FrameKind::Pull
                | FrameKind::Push
                | FrameKind::PullRows
                | FrameKind::PushRows
                | FrameKind::Stats
                | FrameKind::Checkpoint
        )
    }
}

/// A read/write view of a frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Header<T> {
    /// Wraps a buffer without checking its length.
    pub const fn new_unchecked(buffer: T) -> Header<T> {
        Header { buffer }
    }

    /// Wraps a buffer after checking it holds a whole header.
    pub fn new_checked(buffer: T) -> Result<Header<T>> {
        let header = Self::new_unchecked(buffer);
        header.check_len()?;
        Ok(header)
    }

    /// Checks that the buffer is at least [`HEADER_LEN`] bytes; after this no accessor panics.
    pub fn check_len(&self) -> Result<()> {
        if self.buffer.as_ref().len() < HEADER_LEN {
            Err(Error::Truncated)
        } else {
            Ok(())
        }
    }

    /// Returns the underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The four magic bytes.
    pub fn magic(&self) -> [u8; 4] {
        let mut m = [0; 4];
        m.copy_from_slice(&self.buffer.as_ref()[field::MAGIC]);
        m
    }

    /// The version byte.
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[field::VERSION]
    }

    /// The frame kind.
    pub fn kind(&self) -> FrameKind {
        FrameKind::from(self.buffer.as_ref()[field::KIND])
    }

    /// The flags field.
    pub fn flags(&self) -> u16 {
        get_u16(self.buffer.as_ref(), field::FLAGS)
    }

    /// The status field.
    pub fn status(&self) -> Status {
        Status::from(get_u16(self.buffer.as_ref(), field::STATUS))
    }

    /// The reserved field (must be zero).
    pub fn reserved(&self) -> u16 {
        get_u16(self.buffer.as_ref(), field::RESERVED)
    }

    /// On request kinds, the `timeout_ms` field (the same bytes as `status` and `reserved`).
    pub fn timeout_ms(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::TIMEOUT)
    }

    /// Number of items in the meta section.
    pub fn count(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::COUNT)
    }

    /// The request handle.
    pub fn handle(&self) -> u64 {
        get_u64(self.buffer.as_ref(), field::HANDLE)
    }

    /// Length of the meta section.
    pub fn meta_len(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::META_LEN)
    }

    /// Length of the payload section.
    pub fn payload_len(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::PAYLOAD_LEN)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Header<T> {
    /// Sets magic and version to this module's values.
    pub fn set_magic_version(&mut self) {
        let b = self.buffer.as_mut();
        b[field::MAGIC].copy_from_slice(&MAGIC);
        b[field::VERSION] = VERSION;
    }

    /// Sets the kind.
    pub fn set_kind(&mut self, kind: FrameKind) {
        self.buffer.as_mut()[field::KIND] = kind.into();
    }

    /// Sets the flags.
    pub fn set_flags(&mut self, flags: u16) {
        put_u16(self.buffer.as_mut(), field::FLAGS, flags);
    }

    /// Sets the status.
    pub fn set_status(&mut self, status: Status) {
        put_u16(self.buffer.as_mut(), field::STATUS, status.into());
    }

    /// Zeroes the reserved field.
    pub fn clear_reserved(&mut self) {
        put_u16(self.buffer.as_mut(), field::RESERVED, 0);
    }

    /// Sets the `timeout_ms` field of a request (over `status` and `reserved`).
    pub fn set_timeout_ms(&mut self, ms: u32) {
        put_u32(self.buffer.as_mut(), field::TIMEOUT, ms);
    }

    /// Sets the item count.
    pub fn set_count(&mut self, count: u32) {
        put_u32(self.buffer.as_mut(), field::COUNT, count);
    }

    /// Sets the handle.
    pub fn set_handle(&mut self, handle: u64) {
        put_u64(self.buffer.as_mut(), field::HANDLE, handle);
    }

    /// Sets the meta length.
    pub fn set_meta_len(&mut self, len: u32) {
        put_u32(self.buffer.as_mut(), field::META_LEN, len);
    }

    /// Sets the payload length.
    pub fn set_payload_len(&mut self, len: u32) {
        put_u32(self.buffer.as_mut(), field::PAYLOAD_LEN, len);
    }
}

/// A parsed, validated frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeaderRepr {
    /// Frame kind; never `Unknown` after `parse`.
    pub kind: FrameKind,
    /// The `END` flag.
    pub end: bool,
    /// Status (nonzero only on `ERROR`).
    pub status: Status,
    /// On request kinds: the time the requester still waits for the answer, in
    /// milliseconds from when it sent the frame; 0 for none. Always 0 on other kinds.
    pub timeout_ms: u32,
    /// Item count.
    pub count: u32,
    /// Request handle.
    pub handle: u64,
    /// Meta section length.
    pub meta_len: u32,
    /// Payload section length.
    pub payload_len: u32,
}

impl HeaderRepr {
    /// Parses and validates a header: everything section 2 of the specification lets a
    /// receiver check from the 32 header bytes alone, including the frame size limit.
    pub fn parse<T: AsRef<[u8]>>(header: &Header<T>, limits: &Limits) -> Result<HeaderRepr> {
        header.check_len()?;
        if header.magic() != MAGIC {
            return Err(Error::BadMagic);
        }
        if header.version() != VERSION {
            return Err(Error::BadVersion(header.version()));
        }
        let kind = header.kind();
        if let FrameKind::Unknown(k) = kind {
            return Err(Error::UnknownKind(k));
        }
        // Requests carry `timeout_ms` where other kinds have `status` and `reserved`.
        let request = kind.is_request();
        if !request && header.reserved() != 0 {
            return Err(Error::ReservedNotZero);
        }
        let len = HEADER_LEN as u64 + header.meta_len() as u64 + header.payload_len() as u64;
        if len > limits.max_frame as u64 {
            return Err(Error::FrameTooLarge {
                len,
                max: limits.max_frame,
            });
        }
        let flags = header.flags();
        if flags & !FLAG_END != 0 {
            return Err(Error::BadFlags);
        }
        let repr = HeaderRepr {
            kind,
            end: flags & FLAG_END != 0,
            status: if request { Status::Ok } else { header.status() },
            timeout_ms: if request { header.timeout_ms() } else { 0 },
            count: header.count(),
            handle: header.handle(),
            meta_len: header.meta_len(),
            payload_len: header.payload_len(),
        };
        repr.check_kind_rules(limits)?;
        Ok(repr)
    }

    /// The per-kind rules on flags, status, handle, count and section lengths that the
    /// header alone decides.
    fn check_kind_rules(&self, limits: &Limits) -> Result<()> {
        let end_ok = match self.kind {
            FrameKind::Pong => self.end,
            FrameKind::Response => true,
            FrameKind::Error => self.end == (self.handle != 0),
            _ => !self.end,
        };
        if !end_ok {
            return Err(Error::BadFlags);
        }
        let status_ok = match self.kind {
            FrameKind::Error => self.status != Status::Ok,
            _ => self.status == Status::Ok,
        };
        if !status_ok {
            return Err(Error::BadStatus);
        }
        let handle_ok = match self.kind {
            FrameKind::Hello | FrameKind::HelloAck => self.handle == 0,
            k if k.is_request() => self.handle != 0,
            FrameKind::Pong | FrameKind::Response | FrameKind::Chunk | FrameKind::Cancel => self.handle != 0,
            _ => true,
        };
        if !handle_ok {
            return Err(Error::BadHandle);
        }
        let many = 1..=limits.max_tensors;
        let count_ok = match self.kind {
            FrameKind::Hello
            | FrameKind::HelloAck
            | FrameKind::Ping
            | FrameKind::Pong
            | FrameKind::Error
            | FrameKind::Stats
            | FrameKind::Checkpoint => self.count == 0,
            FrameKind::Recv | FrameKind::Chunk => self.count == 1,
            FrameKind::FusedRecv | FrameKind::Pull | FrameKind::Push => many.contains(&self.count),
            FrameKind::Response | FrameKind::Cancel => self.count <= limits.max_tensors,
            FrameKind::PullRows | FrameKind::PushRows => (1..=limits.max_tables).contains(&self.count),
            FrameKind::Unknown(_) => false,
        };
        if !count_ok {
            return Err(Error::BadCount);
        }
        let meta_ok = match self.kind {
            FrameKind::Ping | FrameKind::Pong | FrameKind::Stats | FrameKind::Checkpoint => {
                self.meta_len == 0
            }
            FrameKind::Chunk => self.meta_len == CHUNK_META_LEN as u32,
            _ => true,
        };
        if !meta_ok {
            return Err(Error::BadMetaLen);
        }
        let payload_ok = match self.kind {
            FrameKind::Hello
            | FrameKind::HelloAck
            | FrameKind::Recv
            | FrameKind::FusedRecv
            | FrameKind::Pull
            | FrameKind::PullRows
            | FrameKind::Error
            | FrameKind::Cancel
            | FrameKind::Stats
            | FrameKind::Checkpoint => self.payload_len == 0,
            FrameKind::Chunk => self.payload_len > 0,
            _ => true,
        };
        if !payload_ok {
            return Err(Error::BadPayloadLen);
        }
        Ok(())
    }

    /// Total frame length: header, meta and payload.
    pub fn frame_len(&self) -> u64 {
        HEADER_LEN as u64 + self.meta_len as u64 + self.payload_len as u64
    }

    /// Bytes needed to emit the header.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header into the first [`HEADER_LEN`] bytes of the view.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, header: &mut Header<T>) {
        header.set_magic_version();
        header.set_kind(self.kind);
        header.set_flags(if self.end { FLAG_END } else { 0 });
        if self.kind.is_request() {
            header.set_timeout_ms(self.timeout_ms);
        } else {
            header.set_status(self.status);
            header.clear_reserved();
        }
        header.set_count(self.count);
        header.set_handle(self.handle);
        header.set_meta_len(self.meta_len);
        header.set_payload_len(self.payload_len);
    }
}
