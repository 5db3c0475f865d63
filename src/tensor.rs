//! Tensors, and the allocator hook that decides where received tensors live.
//!
//! A [`Tensor`] is a dtype, a shape, a dead flag and its contents. Contents live in memory
//! from a [`TensorAllocator`]: the default [`HeapAllocator`] (64-byte aligned heap memory),
//! or the trainer's own (a framework's device allocator, a memory pool, a numpy array), so
//! that received payloads land where the trainer wants them. Large payloads are received
//! straight from the socket into that memory; small ones are copied once out of the
//! connection's receive buffer.

use core::fmt;
use std::sync::Arc;

use crate::wire::{DType, Dims, TensorMeta, MAX_RANK};

/// Memory holding one tensor's contents.
///
/// # Safety
///
/// The runtime keeps raw pointers from [`bytes`](Self::bytes) and
/// [`bytes_mut`](Self::bytes_mut) after the borrow ends: the kernel writes received payload
/// into that memory, and reads sent payload from it, asynchronously. An implementation must
/// therefore return the same memory, at the same address and of the same length, from every
/// call, and must not move, free or reallocate it while the value lives.
#[allow(unsafe_code)]
pub unsafe trait TensorMemory: Send + Sync {
    /// The contents.
    fn bytes(&self) -> &[u8];
    /// The contents, writable. Must be the same memory as [`bytes`](Self::bytes), at least
    /// as long as the tensor's byte length, and must not move while the tensor lives.
    fn bytes_mut(&mut self) -> &mut [u8];
}

/// What a tensor about to be received looks like.
#[derive(Debug, Clone, Copy)]
pub struct TensorDesc<'a> {
    /// Element type.
    pub dtype: DType,
    /// Shape, outermost first.
    pub dims: &'a [u64],
    /// Bytes of contents.
    pub byte_len: u64,
}

/// Chooses memory for tensors as they arrive: called once per tensor, with its description,
/// before any of its payload is read. Returning `None` fails that tensor (its status is
/// `RESOURCE_EXHAUSTED`); the rest of the request and the connection go on.
pub trait TensorAllocator: Send + Sync {
    /// Memory of at least `desc.byte_len` bytes, or `None`.
    fn allocate(&self, desc: &TensorDesc<'_>) -> Option<Box<dyn TensorMemory>>;

    /// Whether tensors of at most [`Tensor::INLINE_MAX`] bytes may be kept inside the
    /// [`Tensor`] value itself (64-byte aligned) instead of in memory from
    /// [`allocate`](Self::allocate), which is then not called for them. Such tensors cost no
    /// allocation at all. [`HeapAllocator`] says yes; the default says no, so a trainer's
    /// hook sees every tensor.
    fn inline_small(&self) -> bool {
        false
    }
}

/// The default allocator: heap memory aligned to [`HeapAllocator::ALIGN`] bytes.
///
/// Buffers of at least [`HeapAllocator::CACHE_MIN`] bytes are kept when their tensor is
/// dropped, up to [`HeapAllocator::CACHE_BYTES`] in all, and reused for the next tensor of
/// the same size: a large tensor received step after step then costs no fresh zeroed pages
/// (measured in `docs/performance-log.md`, run U). Clones share the cache.
#[derive(Default, Clone)]
pub struct HeapAllocator {
    cache: Arc<BufCache>,
}

/// Large buffers waiting for reuse, and their total size.
#[derive(Default)]
struct BufCache {
    free: std::sync::Mutex<(Vec<AlignedBuf>, usize)>,
}

impl BufCache {
    fn lock(&self) -> std::sync::MutexGuard<'_, (Vec<AlignedBuf>, usize)> {
        self.free.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl fmt::Debug for HeapAllocator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (bufs, bytes) = &*self.cache.lock();
        f.debug_struct("HeapAllocator")
            .field("cached_buffers", &bufs.len())
            .field("cached_bytes", bytes)
            .finish()
    }
}

impl HeapAllocator {
    /// Alignment of every allocation: a cache line, enough for any dtype and for SIMD.
    pub const ALIGN: usize = 64;
    /// Buffers at least this large are cached for reuse.
    pub const CACHE_MIN: usize = 1 << 20;
    /// Most bytes kept in the cache.
    pub const CACHE_BYTES: usize = 256 << 20;
}

impl TensorAllocator for HeapAllocator {
    fn inline_small(&self) -> bool {
        true
    }

    fn allocate(&self, desc: &TensorDesc<'_>) -> Option<Box<dyn TensorMemory>> {
        let len = usize::try_from(desc.byte_len).ok()?;
        if len < Self::CACHE_MIN {
            return Some(Box::new(AlignedBuf::zeroed(len)?));
        }
        let reused = {
            let (bufs, bytes) = &mut *self.cache.lock();
            let found = bufs.iter().position(|b| b.len == len);
            found.map(|i| {
                *bytes -= len;
                bufs.swap_remove(i)
            })
        };
        let buf = match reused {
            Some(b) => b,
            None => AlignedBuf::zeroed(len)?,
        };
        Some(Box::new(Cached {
            buf: Some(buf),
            cache: self.cache.clone(),
        }))
    }
}

/// A large buffer that goes back to its allocator's cache when its tensor is dropped.
struct Cached {
    buf: Option<AlignedBuf>,
    cache: Arc<BufCache>,
}

// SAFETY: the buffer is an `AlignedBuf` (see its impl), moved neither in nor out while the
// value lives; it leaves only in `drop`.
#[allow(unsafe_code)]
unsafe impl TensorMemory for Cached {
    fn bytes(&self) -> &[u8] {
        self.buf.as_ref().map_or(&[], |b| b.bytes())
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        match &mut self.buf {
            Some(b) => b.bytes_mut(),
            None => &mut [],
        }
    }
}

impl Drop for Cached {
    fn drop(&mut self) {
        if let Some(b) = self.buf.take() {
            let (bufs, bytes) = &mut *self.cache.lock();
            if *bytes + b.len <= HeapAllocator::CACHE_BYTES {
                *bytes += b.len;
                bufs.push(b);
            }
        }
    }
}

/// A shared allocator.
pub type SharedAllocator = Arc<dyn TensorAllocator>;

/// 64-byte aligned, zero-initialized heap bytes.
///
/// Below [`AlignedBuf::MAP_MIN`] bytes they come from the global allocator
/// (`alloc_zeroed`). From there up they are an anonymous private mapping of their own: the
/// kernel hands out zero pages only when they are first written, so a buffer costs memory
/// as its contents arrive, not when it is created, and creating one takes the same short
/// time at any size. (Aligned `alloc_zeroed` writes every byte up front: a peer declaring a
/// 4 GiB tensor would have made the receiver commit 4 GiB and stall for seconds.)
pub struct AlignedBuf {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: `AlignedBuf` owns its allocation exclusively, like a `Box<[u8]>`.
#[allow(unsafe_code)]
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only reads.
#[allow(unsafe_code)]
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    const ALIGN: usize = HeapAllocator::ALIGN;

    /// Buffers at least this large are mappings of their own, committed page by page as
    /// they are written.
    pub const MAP_MIN: usize = 256 << 10;

    fn layout(len: usize) -> Option<std::alloc::Layout> {
        std::alloc::Layout::from_size_align(len, Self::ALIGN).ok()
    }

    /// `len` zero bytes; `None` if the size cannot be represented or memory is exhausted.
    #[allow(unsafe_code)]
    pub fn zeroed(len: usize) -> Option<AlignedBuf> {
        let layout = Self::layout(len)?;
        if len == 0 {
            // An aligned, dangling pointer: no allocation for an empty buffer.
            let ptr = std::ptr::NonNull::new(Self::ALIGN as *mut u8)?;
            return Some(AlignedBuf { ptr, len });
        }
        if len >= Self::MAP_MIN {
            use nix::sys::mman::{mmap_anonymous, MapFlags, ProtFlags};
            let size = std::num::NonZeroUsize::new(len)?;
            let prot = ProtFlags::PROT_READ | ProtFlags::PROT_WRITE;
            // SAFETY: a fresh private anonymous mapping at an address of the kernel's
            // choosing: it aliases nothing. It is page-aligned (so 64-byte aligned), reads
            // as zeros, and is unmapped once, in `drop`, with the same length.
            let ptr = unsafe { mmap_anonymous(None, size, prot, MapFlags::MAP_PRIVATE) }.ok()?;
            return Some(AlignedBuf {
                ptr: ptr.cast(),
                len,
            });
        }
        // SAFETY: `layout` has a nonzero size.
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = std::ptr::NonNull::new(raw)?;
        Some(AlignedBuf { ptr, len })
    }
}

impl Drop for AlignedBuf {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        if self.len == 0 {
            return;
        }
        if self.len >= Self::MAP_MIN {
            // SAFETY: mapped in `zeroed` with this length, unmapped once; no view of it
            // outlives `self`.
            if let Err(e) = unsafe { nix::sys::mman::munmap(self.ptr.cast(), self.len) } {
                log::error!("munmap of a {}-byte tensor buffer: {e}", self.len);
            }
            return;
        }
        if let Some(layout) = Self::layout(self.len) {
            // SAFETY: allocated in `zeroed` with this very layout, freed once.
            unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) };
        }
    }
}

// SAFETY: the allocation is made once in `zeroed` and never moved or resized; `bytes` and
// `bytes_mut` view that one allocation.
#[allow(unsafe_code)]
unsafe impl TensorMemory for AlignedBuf {
    fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr` points at `len` initialized (zeroed, then written) bytes owned by
        // `self` (or is a dangling aligned pointer with `len == 0`).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, and the slice borrows `self` mutably, so it is unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

// SAFETY: the vector is never resized through this trait, so its buffer stays where it is
// for as long as the value lives.
#[allow(unsafe_code)]
unsafe impl TensorMemory for Vec<u8> {
    fn bytes(&self) -> &[u8] {
        self
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        self
    }
}

// SAFETY: `TensorMemory` promises the same memory at the same address from every call, not
// moved while the value lives; moving the box moves a pointer, not the memory.
#[allow(unsafe_code)]
unsafe impl crate::sys::loan::IoBufMut for Box<dyn TensorMemory> {
    fn io_bytes_mut(&mut self) -> &mut [u8] {
        self.bytes_mut()
    }
}

// SAFETY: the contents are either separate memory (stable by `TensorMemory`'s contract) or
// inside the tensor value, which the `Arc` keeps at one heap address while any clone lives;
// a shared tensor is not written (every writing method takes `&mut self`).
#[allow(unsafe_code)]
unsafe impl crate::sys::loan::IoBuf for std::sync::Arc<Tensor> {
    fn io_bytes(&self) -> &[u8] {
        self.bytes()
    }
}

/// Why a tensor could not be built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorError {
    /// The dtype is unknown.
    UnknownDType,
    /// More than 32 dimensions.
    RankTooLarge,
    /// The size of dtype x shape overflows.
    TooLarge,
    /// The contents' length is not dtype size x elements.
    LengthMismatch {
        /// Bytes dtype and shape call for.
        expected: u64,
        /// Bytes given.
        got: u64,
    },
}

impl fmt::Display for TensorError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TensorError::UnknownDType => f.write_str("unknown dtype"),
            TensorError::RankTooLarge => write!(f, "more than {MAX_RANK} dimensions"),
            TensorError::TooLarge => f.write_str("tensor size overflows"),
            TensorError::LengthMismatch { expected, got } => {
                write!(
                    f,
                    "contents are {got} bytes; dtype and shape need {expected}"
                )
            }
        }
    }
}

impl std::error::Error for TensorError {}

/// A tensor: dtype, shape, dead flag, contents.
pub struct Tensor {
    dtype: DType,
    dims: Shape,
    dead: bool,
    byte_len: usize,
    memory: Contents,
}

/// Dimensions a [`Shape`] keeps in the value.
const SHAPE_INLINE: usize = 4;

/// A tensor's dimensions: up to four inside the value (no allocation, and a small value to
/// move: tensors move through several vectors on their way to the caller), higher ranks in
/// one heap allocation.
#[derive(Clone, PartialEq, Eq)]
pub(crate) enum Shape {
    Inline(u8, [u64; SHAPE_INLINE]),
    Heap(Box<[u64]>),
}

impl Shape {
    /// Rank 0.
    const SCALAR: Shape = Shape::Inline(0, [0; SHAPE_INLINE]);

    /// The `n` dimensions of `dims`; `None` above [`MAX_RANK`].
    fn new(n: usize, dims: impl Iterator<Item = u64>) -> Option<Shape> {
        if n > MAX_RANK {
            return None;
        }
        if n <= SHAPE_INLINE {
            let mut a = [0; SHAPE_INLINE];
            for (slot, d) in a.iter_mut().zip(dims) {
                *slot = d;
            }
            Some(Shape::Inline(n as u8, a))
        } else {
            Some(Shape::Heap(dims.take(n).collect()))
        }
    }
}

impl fmt::Debug for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl core::ops::Deref for Shape {
    type Target = [u64];

    fn deref(&self) -> &[u64] {
        match self {
            Shape::Inline(n, a) => &a[..*n as usize],
            Shape::Heap(b) => b,
        }
    }
}

/// Where a tensor's contents are.
enum Contents {
    /// None (dead, or empty).
    Empty,
    /// Inside the tensor value: small tensors, no allocation.
    Inline(Inline),
    /// Memory from an allocator or the caller.
    Memory(Box<dyn TensorMemory>),
    /// The memory is lent to a receive in flight ([`Tensor::lend_memory`]).
    Lent,
}

/// The contents of a small tensor, kept in the tensor itself.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Inline([u8; Tensor::INLINE_MAX]);

impl Tensor {
    /// Most bytes of contents kept inside the tensor value (see
    /// [`TensorAllocator::inline_small`] and [`from_slice`](Self::from_slice)).
    pub const INLINE_MAX: usize = 128;

    fn check(dtype: DType, dims: &[u64]) -> Result<(Shape, u64), TensorError> {
        let shape =
            Shape::new(dims.len(), dims.iter().copied()).ok_or(TensorError::RankTooLarge)?;
        let elem = dtype.size().ok_or(TensorError::UnknownDType)?;
        let n = Dims::Native(dims).elements().ok_or(TensorError::TooLarge)?;
        let len = n.checked_mul(elem).ok_or(TensorError::TooLarge)?;
        if len > i64::MAX as u64 || usize::try_from(len).is_err() {
            return Err(TensorError::TooLarge);
        }
        Ok((shape, len))
    }

    /// A tensor with the given contents (row-major, little-endian elements).
    pub fn from_bytes(dtype: DType, dims: &[u64], bytes: Vec<u8>) -> Result<Tensor, TensorError> {
        Self::from_memory(dtype, dims, Box::new(bytes))
    }

    /// A tensor whose contents are `memory` (at least dtype size x elements bytes long; the
    /// tensor uses that prefix).
    pub fn from_memory(
        dtype: DType,
        dims: &[u64],
        memory: Box<dyn TensorMemory>,
    ) -> Result<Tensor, TensorError> {
        let (shape, len) = Self::check(dtype, dims)?;
        let got = memory.bytes().len() as u64;
        if got < len {
            return Err(TensorError::LengthMismatch { expected: len, got });
        }
        Ok(Tensor {
            dtype,
            dims: shape,
            dead: false,
            byte_len: len as usize,
            memory: Contents::Memory(memory),
        })
    }

    /// A tensor holding a copy of `bytes`: kept inside the tensor value (no allocation) up
    /// to [`INLINE_MAX`](Self::INLINE_MAX) bytes, in 64-byte aligned heap memory above.
    pub fn from_slice(dtype: DType, dims: &[u64], bytes: &[u8]) -> Result<Tensor, TensorError> {
        let mut t = Self::zeros(dtype, dims)?;
        let got = bytes.len() as u64;
        if got != t.byte_len as u64 {
            return Err(TensorError::LengthMismatch {
                expected: t.byte_len as u64,
                got,
            });
        }
        t.bytes_mut().copy_from_slice(bytes);
        Ok(t)
    }

    /// A zero-filled tensor: inside the tensor value up to [`INLINE_MAX`](Self::INLINE_MAX)
    /// bytes, in 64-byte aligned heap memory above.
    pub fn zeros(dtype: DType, dims: &[u64]) -> Result<Tensor, TensorError> {
        let (shape, len) = Self::check(dtype, dims)?;
        if len as usize <= Self::INLINE_MAX {
            return Ok(Self::inline(dtype, shape, len as usize));
        }
        let buf = AlignedBuf::zeroed(len as usize).ok_or(TensorError::TooLarge)?;
        Self::from_memory(dtype, dims, Box::new(buf))
    }

    /// A zero-filled tensor of `len <= INLINE_MAX` bytes kept inside the value.
    fn inline(dtype: DType, dims: Shape, len: usize) -> Tensor {
        debug_assert!(len <= Self::INLINE_MAX);
        Tensor {
            dtype,
            dims,
            dead: false,
            byte_len: len,
            memory: Contents::Inline(Inline([0; Self::INLINE_MAX])),
        }
    }

    /// Whether the contents live inside the tensor value, so move with it (never a target
    /// of an asynchronous receive).
    pub(crate) fn is_inline(&self) -> bool {
        matches!(self.memory, Contents::Inline(_))
    }

    /// Takes the contents' memory out, to be written by a receive in flight; `None` for
    /// contents that are not separate memory (inline, empty, or already lent). Until
    /// [`restore_memory`](Self::restore_memory) the tensor reads as empty.
    pub(crate) fn lend_memory(&mut self) -> Option<Box<dyn TensorMemory>> {
        if !matches!(self.memory, Contents::Memory(_)) {
            return None;
        }
        match std::mem::replace(&mut self.memory, Contents::Lent) {
            Contents::Memory(m) => Some(m),
            _ => None,
        }
    }

    /// Whether the contents' memory is lent out.
    pub(crate) fn is_lent(&self) -> bool {
        matches!(self.memory, Contents::Lent)
    }

    /// Puts back memory taken by [`lend_memory`](Self::lend_memory); gives it back if this
    /// tensor has none lent.
    pub(crate) fn restore_memory(
        &mut self,
        memory: Box<dyn TensorMemory>,
    ) -> Result<(), Box<dyn TensorMemory>> {
        if !self.is_lent() {
            return Err(memory);
        }
        self.memory = Contents::Memory(memory);
        Ok(())
    }

    /// A tensor whose contents are `values` (any dtype whose elements are 4-byte floats).
    pub fn from_f32(dims: &[u64], values: &[f32]) -> Result<Tensor, TensorError> {
        let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        Self::from_bytes(DType::F32, dims, bytes)
    }

    /// A dead tensor: the value of a rendezvous key whose producer did not run.
    pub fn dead(dtype: DType) -> Tensor {
        Tensor {
            dtype,
            dims: Shape::SCALAR,
            dead: true,
            byte_len: 0,
            memory: Contents::Empty,
        }
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Shape, outermost first.
    pub fn dims(&self) -> &[u64] {
        &self.dims
    }

    /// Whether this is a dead tensor.
    pub fn is_dead(&self) -> bool {
        self.dead
    }

    /// Bytes of contents.
    pub fn byte_len(&self) -> usize {
        self.byte_len
    }

    /// The contents.
    pub fn bytes(&self) -> &[u8] {
        match &self.memory {
            Contents::Memory(m) => &m.bytes()[..self.byte_len],
            Contents::Inline(b) => &b.0[..self.byte_len],
            Contents::Empty | Contents::Lent => &[],
        }
    }

    /// The contents, writable.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        let len = self.byte_len;
        match &mut self.memory {
            Contents::Memory(m) => &mut m.bytes_mut()[..len],
            Contents::Inline(b) => &mut b.0[..len],
            Contents::Empty | Contents::Lent => &mut [],
        }
    }

    /// Makes this a one-dimensional `U8` tensor of `len` bytes over the memory it has,
    /// when that memory has room for them (the bytes are then whatever it held): a buffer
    /// reused from request to request without an allocation. False, and nothing changed,
    /// when it has not (or the tensor is dead).
    pub(crate) fn reuse_as_bytes(&mut self, len: usize) -> bool {
        let room = match &mut self.memory {
            Contents::Memory(m) => m.bytes_mut().len(),
            Contents::Inline(_) => Self::INLINE_MAX,
            Contents::Empty | Contents::Lent => 0,
        };
        if self.dead || room < len || len as u64 > i64::MAX as u64 {
            return false;
        }
        self.dtype = DType::U8;
        self.dims = Shape::Inline(1, [len as u64, 0, 0, 0]);
        self.byte_len = len;
        true
    }

    /// The contents as f32 values (for `F32` tensors; others give an empty vector).
    pub fn to_f32(&self) -> Vec<f32> {
        if self.dtype != DType::F32 {
            return Vec::new();
        }
        self.bytes()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }

    /// The wire meta of this tensor.
    pub(crate) fn meta(&self) -> TensorMeta<'_> {
        if self.dead {
            return TensorMeta::dead(self.dtype);
        }
        TensorMeta {
            dtype: self.dtype,
            dead: false,
            chunked: false,
            byte_len: self.byte_len as u64,
            dims: Dims::Native(&self.dims),
        }
    }

    /// A tensor for an incoming meta, in memory taken from `reuse` when one there is large
    /// enough (it is removed from `reuse`: memory kept from earlier answers, so that a
    /// steady stream of them allocates nothing), else from `alloc`; `None` if the allocator
    /// refuses or returns too little memory.
    pub(crate) fn receive_reusing(
        meta: &TensorMeta<'_>,
        alloc: &dyn TensorAllocator,
        reuse: &mut Vec<Box<dyn TensorMemory>>,
    ) -> Option<Tensor> {
        if meta.dead {
            return Some(Tensor::dead(meta.dtype));
        }
        Self::receive_owned_reusing(&OwnedMeta::of(meta)?, alloc, reuse)
    }

    /// As [`receive_owned`](Self::receive_owned), in memory from `reuse` when one fits.
    pub(crate) fn receive_owned_reusing(
        meta: &OwnedMeta,
        alloc: &dyn TensorAllocator,
        reuse: &mut Vec<Box<dyn TensorMemory>>,
    ) -> Option<Tensor> {
        let len = usize::try_from(meta.byte_len).ok()?;
        let small = meta.byte_len <= Self::INLINE_MAX as u64 && alloc.inline_small();
        // The smallest memory that fits: a small table's block must not take the memory
        // a larger one of the same answer needs.
        let fits = (!small)
            .then(|| {
                reuse
                    .iter()
                    .enumerate()
                    .filter(|(_, m)| m.bytes().len() >= len)
                    .min_by_key(|(_, m)| m.bytes().len())
                    .map(|(i, _)| i)
            })
            .flatten();
        match fits {
            Some(i) => Some(Tensor {
                dtype: meta.dtype,
                dims: meta.dims.clone(),
                dead: false,
                byte_len: len,
                memory: Contents::Memory(reuse.swap_remove(i)),
            }),
            None => Self::receive_owned(meta, alloc),
        }
    }

    /// The contents' memory, for reuse (`None` for contents kept inside the value, or
    /// none).
    pub fn into_memory(self) -> Option<Box<dyn TensorMemory>> {
        match self.memory {
            Contents::Memory(m) => Some(m),
            _ => None,
        }
    }

    /// A tensor for a meta kept from an earlier frame (a chunked tensor, allocated when its
    /// first chunk arrives).
    pub(crate) fn receive_owned(meta: &OwnedMeta, alloc: &dyn TensorAllocator) -> Option<Tensor> {
        let dims = meta.dims.clone();
        if meta.byte_len <= Self::INLINE_MAX as u64 && alloc.inline_small() {
            return Some(Self::inline(meta.dtype, dims, meta.byte_len as usize));
        }
        let desc = TensorDesc {
            dtype: meta.dtype,
            dims: &dims,
            byte_len: meta.byte_len,
        };
        let memory = crate::panic::guarded("TensorAllocator::allocate", || alloc.allocate(&desc))??;
        let len = usize::try_from(meta.byte_len).ok()?;
        if memory.bytes().len() < len {
            log::warn!(
                "tensor allocator returned {} bytes for a {len}-byte tensor",
                memory.bytes().len()
            );
            return None;
        }
        Some(Tensor {
            dtype: meta.dtype,
            dims,
            dead: false,
            byte_len: len,
            memory: Contents::Memory(memory),
        })
    }
}

/// A tensor meta copied out of a frame.
#[derive(Debug, Clone)]
pub(crate) struct OwnedMeta {
    pub dtype: DType,
    pub dims: Shape,
    pub byte_len: u64,
}

impl OwnedMeta {
    pub(crate) fn of(meta: &TensorMeta<'_>) -> Option<OwnedMeta> {
        let dims = Shape::new(meta.dims.len(), meta.dims.iter())?;
        Some(OwnedMeta {
            dtype: meta.dtype,
            dims,
            byte_len: meta.byte_len,
        })
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tensor")
            .field("dtype", &self.dtype)
            .field("dims", &&self.dims[..])
            .field("dead", &self.dead)
            .field("byte_len", &self.byte_len)
            .finish()
    }
}

impl PartialEq for Tensor {
    fn eq(&self, other: &Self) -> bool {
        self.dtype == other.dtype
            && self.dims == other.dims
            && self.dead == other.dead
            && self.bytes() == other.bytes()
    }
}

/// Memory that counts its drops, for tests that check when received tensors are freed.
#[cfg(test)]
pub(crate) struct DropCounted {
    pub buf: Vec<u8>,
    pub drops: Arc<std::sync::atomic::AtomicUsize>,
}

// SAFETY: the vector is never resized, so its buffer stays where it is while the value lives.
#[cfg(test)]
#[allow(unsafe_code)]
unsafe impl TensorMemory for DropCounted {
    fn bytes(&self) -> &[u8] {
        &self.buf
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.buf
    }
}

#[cfg(test)]
impl Drop for DropCounted {
    fn drop(&mut self) {
        self.drops.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn shapes_up_to_rank_four_stay_in_the_value() {
        assert!(
            std::mem::size_of::<Tensor>() <= 256,
            "{}",
            std::mem::size_of::<Tensor>()
        );
        for rank in 0..=MAX_RANK {
            let dims: Vec<u64> = (1..=rank as u64).map(|d| d % 3 + 1).collect();
            let t = Tensor::zeros(DType::U8, &dims).unwrap();
            assert_eq!(t.dims(), &dims[..]);
            assert_eq!(matches!(t.dims, Shape::Inline(..)), rank <= SHAPE_INLINE);
            assert_eq!(t.byte_len() as u64, dims.iter().product::<u64>());
        }
        let too_many = vec![1u64; MAX_RANK + 1];
        assert_eq!(
            Tensor::zeros(DType::U8, &too_many).unwrap_err(),
            TensorError::RankTooLarge
        );
    }

    use super::*;

    #[test]
    fn a_received_block_takes_the_smallest_kept_memory_that_fits() {
        let mut reuse: Vec<Box<dyn TensorMemory>> = vec![
            Box::new(vec![1u8; 8192]),
            Box::new(vec![2u8; 1024]),
            Box::new(vec![3u8; 4096]),
        ];
        let meta = |len: u64| OwnedMeta {
            dtype: DType::U8,
            dims: Shape::new(1, [len].into_iter()).unwrap(),
            byte_len: len,
        };
        let alloc = HeapAllocator::default();
        let t = Tensor::receive_owned_reusing(&meta(1000), &alloc, &mut reuse).unwrap();
        assert_eq!(t.bytes()[0], 2, "the 1,024-byte memory");
        let t = Tensor::receive_owned_reusing(&meta(2000), &alloc, &mut reuse).unwrap();
        assert_eq!(t.bytes()[0], 3, "the 4,096-byte memory");
        assert_eq!(reuse.len(), 1);
        assert_eq!(reuse[0].bytes().len(), 8192);
    }

    #[test]
    fn small_tensors_live_inline_aligned_and_keep_their_bytes() {
        for len in [0usize, 1, 64, Tensor::INLINE_MAX] {
            let bytes: Vec<u8> = (0..len).map(|i| i as u8 ^ 0x5a).collect();
            let t = Tensor::from_slice(DType::U8, &[len as u64], &bytes).unwrap();
            assert!(t.is_inline(), "{len} bytes");
            assert_eq!(t.bytes(), &bytes[..]);
            assert_eq!(t.bytes().as_ptr() as usize % HeapAllocator::ALIGN, 0);
            // Moving the tensor moves its contents with it.
            let moved = [t];
            assert_eq!(moved[0].bytes(), &bytes[..]);
        }
        let big = Tensor::zeros(DType::U8, &[Tensor::INLINE_MAX as u64 + 1]).unwrap();
        assert!(!big.is_inline());
        assert_eq!(
            Tensor::from_slice(DType::F32, &[2], &[0; 4]).unwrap_err(),
            TensorError::LengthMismatch {
                expected: 8,
                got: 4
            }
        );
    }

    #[test]
    fn only_allocators_that_allow_it_get_small_tensors_inline() {
        struct Counting(std::sync::atomic::AtomicUsize);
        impl TensorAllocator for Counting {
            fn allocate(&self, d: &TensorDesc<'_>) -> Option<Box<dyn TensorMemory>> {
                self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                Some(Box::new(vec![0u8; d.byte_len as usize]))
            }
        }
        let dims = [16u64];
        let meta = TensorMeta {
            dtype: DType::F32,
            dead: false,
            chunked: false,
            byte_len: 64,
            dims: Dims::Native(&dims),
        };
        let hook = Counting(Default::default());
        let t = Tensor::receive_reusing(&meta, &hook, &mut Vec::new()).unwrap();
        assert!(!t.is_inline());
        assert_eq!(hook.0.load(std::sync::atomic::Ordering::Relaxed), 1);
        let t = Tensor::receive_reusing(&meta, &HeapAllocator::default(), &mut Vec::new()).unwrap();
        assert!(t.is_inline());
        assert_eq!(t.byte_len(), 64);
    }

    #[test]
    fn heap_memory_is_aligned_and_zeroed() {
        for len in [0usize, 1, 63, 64, 65, 4096, 100_003] {
            let b = AlignedBuf::zeroed(len).unwrap();
            assert_eq!(b.bytes().len(), len);
            assert_eq!(b.bytes().as_ptr() as usize % HeapAllocator::ALIGN, 0);
            assert!(b.bytes().iter().all(|&x| x == 0));
        }
    }

    #[test]
    fn contents_must_match_dtype_and_shape() {
        assert!(Tensor::from_bytes(DType::F32, &[2, 3], vec![0; 24]).is_ok());
        assert_eq!(
            Tensor::from_bytes(DType::F32, &[2, 3], vec![0; 23]).unwrap_err(),
            TensorError::LengthMismatch {
                expected: 24,
                got: 23
            }
        );
        assert_eq!(
            Tensor::from_bytes(DType::Unknown(99), &[1], vec![0]).unwrap_err(),
            TensorError::UnknownDType
        );
        assert_eq!(
            Tensor::zeros(DType::U8, &[u64::MAX, 2]).unwrap_err(),
            TensorError::TooLarge
        );
        let t = Tensor::from_f32(&[3], &[1.0, 2.5, -3.0]).unwrap();
        assert_eq!(t.to_f32(), [1.0, 2.5, -3.0]);
        assert!(Tensor::dead(DType::F32).is_dead());
    }

    #[test]
    fn receive_uses_the_allocator_and_refuses_short_memory() {
        struct Short;
        impl TensorAllocator for Short {
            fn allocate(&self, _: &TensorDesc<'_>) -> Option<Box<dyn TensorMemory>> {
                Some(Box::new(vec![0u8; 3]))
            }
        }
        let dims = [4u64];
        let meta = TensorMeta::new(DType::U8, &dims).unwrap();
        assert!(Tensor::receive_reusing(&meta, &Short, &mut Vec::new()).is_none());
        let t = Tensor::receive_reusing(&meta, &HeapAllocator::default(), &mut Vec::new()).unwrap();
        assert_eq!(t.byte_len(), 4);
    }

    #[test]
    fn large_buffers_are_reused_after_their_tensor_is_dropped() {
        let heap = HeapAllocator::default();
        let dims = [2u64 << 20];
        let meta = TensorMeta::new(DType::U8, &dims).unwrap();
        let mut t = Tensor::receive_reusing(&meta, &heap, &mut Vec::new()).unwrap();
        t.bytes_mut()[0] = 7;
        let first = t.bytes().as_ptr();
        drop(t);
        let again = Tensor::receive_reusing(&meta, &heap, &mut Vec::new()).unwrap();
        assert_eq!(again.bytes().as_ptr(), first, "the cached buffer is reused");
        assert_eq!(again.byte_len(), 2 << 20);
        // Small tensors are not cached.
        let small = TensorMeta::new(DType::U8, &[16]).unwrap();
        let s = Tensor::receive_reusing(&small, &heap, &mut Vec::new()).unwrap();
        drop(s);
        assert_eq!(heap.cache.lock().0.len(), 0);
    }
}
