//! Memory lent to the driver for the life of an operation (tokio-uring's ownership model).
//!
//! A receive is handed the buffer it writes into, by value: a connection's receive buffer
//! ([`RecvMem::Buffer`]) or the memory of a tensor being received in place
//! ([`RecvMem::Memory`]). A send is handed what it reads from: arena blocks by value
//! ([`SendMem::Block`]) and tensors by a shared reference ([`SendMem::Shared`], e.g. an
//! `Arc`). The driver keeps them in the slot's [`SlotMem`] while the kernel may use them,
//! and gives them back only once the operation's completion has been reaped
//! ([`Driver::take_recv`](super::driver::Driver::take_recv),
//! [`Driver::take_sent`](super::driver::Driver::take_sent)). Nothing above the driver can
//! therefore free, move or touch memory the kernel is using, whatever it does meanwhile:
//! give a request up, close the connection, or panic.
//!
//! The two traits say which memory qualifies: memory that stays at one address while the
//! value owning it moves (heap memory behind a `Vec`, a `Box` or an `Arc`).

use nix::libc;

/// Memory a receive may write into while the driver holds the value.
///
/// # Safety
/// [`io_bytes_mut`](Self::io_bytes_mut) must return the same memory, at the same address
/// and of the same length, on every call, and moving the value must not move it.
pub unsafe trait IoBufMut: Send {
    /// The memory.
    fn io_bytes_mut(&mut self) -> &mut [u8];
}

/// Memory a send may read while the driver holds the value.
///
/// # Safety
/// [`io_bytes`](Self::io_bytes) must return the same memory, at the same address and of
/// the same length, on every call, moving the value must not move it, and it must not
/// change while the value lives.
pub unsafe trait IoBuf: Send {
    /// The memory.
    fn io_bytes(&self) -> &[u8];
}

/// What a receive writes into.
pub enum RecvMem<M> {
    /// A connection's receive buffer; its heap memory does not move with the `Vec`.
    Buffer(Vec<u8>),
    /// The memory of a tensor received in place.
    Memory(M),
}

impl<M> std::fmt::Debug for RecvMem<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RecvMem::Buffer(v) => write!(f, "Buffer({} bytes)", v.len()),
            RecvMem::Memory(_) => f.write_str("Memory"),
        }
    }
}

impl<M: IoBufMut> RecvMem<M> {
    fn bytes_mut(&mut self) -> &mut [u8] {
        match self {
            RecvMem::Buffer(v) => v.as_mut_slice(),
            RecvMem::Memory(m) => m.io_bytes_mut(),
        }
    }
}

/// What a send reads from.
pub enum SendMem<S> {
    /// An arena block of the connection's encoder, named by `tag` so it can be given back.
    Block {
        /// The encoder's number for the block.
        tag: u32,
        /// The block.
        buf: Box<[u8]>,
    },
    /// A tensor shared with its owner.
    Shared(S),
}

impl<S> std::fmt::Debug for SendMem<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SendMem::Block { tag, buf } => write!(f, "Block({tag}, {} bytes)", buf.len()),
            SendMem::Shared(_) => f.write_str("Shared"),
        }
    }
}

impl<S: IoBuf> SendMem<S> {
    fn bytes(&self) -> &[u8] {
        match self {
            SendMem::Block { buf, .. } => buf,
            SendMem::Shared(s) => s.io_bytes(),
        }
    }
}

/// Most iovecs in one send.
pub const MAX_IOV: usize = 64;

/// Per slot, everything the kernel reads or writes for the slot's operations: the socket
/// address of a connect, the `msghdr` and iovecs of a send, and the memory lent to the
/// receive and the send in flight. Boxed so it never moves; reused by the slot's next
/// connection (its vectors keep their capacity, so lending allocates nothing).
pub struct SlotMem<M, S> {
    pub(super) iov: [libc::iovec; MAX_IOV],
    pub(super) iov_len: usize,
    pub(super) msg: libc::msghdr,
    pub(super) addr: libc::sockaddr_storage,
    pub(super) addr_len: libc::socklen_t,
    /// The receive's memory, and where in it the kernel writes.
    pub(super) recv: Option<(RecvMem<M>, usize)>,
    /// The memory the send's iovecs point into.
    pub(super) send: Vec<SendMem<S>>,
    /// Operations submitted and not yet reaped: their memory stays here until they are.
    pub(super) recv_busy: bool,
    pub(super) send_busy: bool,
    pub(super) connect_busy: bool,
}

impl<M: IoBufMut, S: IoBuf> SlotMem<M, S> {
    pub(super) fn new() -> Box<SlotMem<M, S>> {
        Box::new(SlotMem {
            iov: [libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 0,
            }; MAX_IOV],
            iov_len: 0,
            // SAFETY: msghdr is plain old data; all-zero (null pointers, zero lengths) is
            // valid.
            msg: unsafe { std::mem::zeroed() },
            // SAFETY: sockaddr_storage is plain old data; all-zero is a valid value.
            addr: unsafe { std::mem::zeroed() },
            addr_len: 0,
            recv: None,
            send: Vec::with_capacity(MAX_IOV),
            recv_busy: false,
            send_busy: false,
            connect_busy: false,
        })
    }

    /// Whether the kernel may still use this memory.
    pub(super) fn busy(&self) -> bool {
        self.recv_busy || self.send_busy || self.connect_busy
    }

    /// Takes `mem` as the receive's memory and returns where the kernel may write:
    /// `start..start + len` of it, or `None` (and `mem` back) when that is out of range.
    pub(super) fn lend_recv(
        &mut self,
        mut mem: RecvMem<M>,
        start: usize,
        len: usize,
    ) -> Result<(*mut u8, u32), RecvMem<M>> {
        let bytes = mem.bytes_mut();
        let in_range = start.checked_add(len).is_some_and(|end| end <= bytes.len())
            && len > 0
            && len <= u32::MAX as usize;
        if !in_range {
            return Err(mem);
        }
        let ptr = bytes[start..].as_mut_ptr();
        self.recv = Some((mem, start));
        Ok((ptr, len as u32))
    }
}

/// The next send on a slot, filled by [`Driver::gather`](super::driver::Driver::gather):
/// the memory it reads ([`own`](Gather::own)) and the ranges of it to send, in order
/// ([`piece`](Gather::piece)).
pub struct Gather<'a, M, S> {
    pub(super) mem: &'a mut SlotMem<M, S>,
    pub(super) bytes: u64,
}

impl<M: IoBufMut, S: IoBuf> Gather<'_, M, S> {
    /// Whether another owner and another piece fit.
    pub fn has_room(&self) -> bool {
        self.mem.iov_len < MAX_IOV && self.mem.send.len() < MAX_IOV
    }

    /// Hands `mem` to the send; returns its number for [`piece`](Self::piece), or `mem`
    /// back when the send is full.
    pub fn own(&mut self, mem: SendMem<S>) -> Result<usize, SendMem<S>> {
        if self.mem.send.len() == MAX_IOV {
            return Err(mem);
        }
        self.mem.send.push(mem);
        Ok(self.mem.send.len() - 1)
    }

    /// Adds bytes `start..start + len` of owner `owner` to the send. False (and nothing
    /// added) when the send is full or the range is not inside that owner.
    pub fn piece(&mut self, owner: usize, start: usize, len: usize) -> bool {
        if self.mem.iov_len == MAX_IOV {
            return false;
        }
        let Some(bytes) = self.mem.send.get(owner).map(SendMem::bytes) else {
            return false;
        };
        let Some(piece) = start.checked_add(len).and_then(|end| bytes.get(start..end)) else {
            return false;
        };
        self.mem.iov[self.mem.iov_len] = libc::iovec {
            iov_base: piece.as_ptr() as *mut libc::c_void,
            iov_len: piece.len(),
        };
        self.mem.iov_len += 1;
        self.bytes += len as u64;
        true
    }

    /// Pieces added so far.
    pub fn len(&self) -> usize {
        self.mem.iov_len
    }

    /// Whether nothing was added.
    pub fn is_empty(&self) -> bool {
        self.mem.iov_len == 0
    }

    /// Bytes added so far.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}
