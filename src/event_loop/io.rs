//! A connection as the loop's I/O sees it: its socket, the operations in flight on it, and
//! the memory handed to the kernel for them.

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use nix::libc;

/// Most iovecs in one send.
pub(super) const MAX_IOV: usize = 64;

/// Memory handed to the kernel for one connection; boxed so it never moves.
pub(super) struct ConnIo {
    pub iov: [libc::iovec; MAX_IOV],
    pub msg: libc::msghdr,
    pub addr: libc::sockaddr_storage,
    pub addr_len: libc::socklen_t,
}

/// One connection's I/O state, in the slot the session gave the connection.
pub(super) struct IoConn {
    pub fd: Option<OwnedFd>,
    pub io: Box<ConnIo>,
    pub reading: bool,
    pub writing: bool,
    pub connecting: bool,
    /// The receive in flight reads straight into a tensor, not into the buffer.
    pub direct: bool,
    /// Index of the pool buffer the connection's decoder receives into, if it has one.
    pub pool_buf: Option<u16>,
    /// Whether this is an accepted connection counted against `max_connections`.
    pub counted: bool,
    /// The session closed it: released once no operation is in flight.
    pub closing: bool,
}

impl IoConn {
    pub fn new(fd: Option<OwnedFd>) -> IoConn {
        IoConn {
            fd,
            io: Box::new(ConnIo {
                iov: [libc::iovec {
                    iov_base: std::ptr::null_mut(),
                    iov_len: 0,
                }; MAX_IOV],
                msg: empty_msghdr(),
                // SAFETY: sockaddr_storage is plain old data; all-zero is a valid value.
                addr: unsafe { std::mem::zeroed() },
                addr_len: 0,
            }),
            reading: false,
            writing: false,
            connecting: false,
            direct: false,
            pool_buf: None,
            counted: false,
            closing: false,
        }
    }

    pub fn fd(&self) -> RawFd {
        self.fd.as_ref().map_or(-1, |f| f.as_raw_fd())
    }

    pub fn ops_in_flight(&self) -> bool {
        self.reading || self.writing || self.connecting
    }
}

pub(super) fn empty_msghdr() -> libc::msghdr {
    // SAFETY: msghdr is plain old data; all-zero (null pointers, zero lengths) is valid.
    unsafe { std::mem::zeroed() }
}

/// Writes `addr` as a C sockaddr into `out`; returns its length.
pub(super) fn write_sockaddr(
    addr: &SocketAddr,
    out: &mut libc::sockaddr_storage,
) -> libc::socklen_t {
    let storage = nix::sys::socket::SockaddrStorage::from(*addr);
    use nix::sys::socket::SockaddrLike;
    let len = storage.len();
    // SAFETY: `storage.as_ptr()` points at `len` valid bytes of sockaddr, and `out` is a
    // sockaddr_storage, large enough for any socket address.
    unsafe {
        std::ptr::copy_nonoverlapping(
            storage.as_ptr().cast::<u8>(),
            (out as *mut libc::sockaddr_storage).cast::<u8>(),
            len as usize,
        );
    }
    len
}

pub(super) fn errno_str(result: i32) -> String {
    std::io::Error::from_raw_os_error(-result).to_string()
}
