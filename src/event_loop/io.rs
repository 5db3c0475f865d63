//! A connection as the loop's I/O sees it: its socket and the operations in flight on it.

use std::os::fd::{AsRawFd, RawFd};

use crate::error::{Error, ErrorKind, OsError};
use crate::sys::driver::Socket;

/// One connection's I/O state, in the slot the session gave the connection.
pub(super) struct IoConn {
    /// Its socket: a descriptor, or a direct one (an entry of the io_uring file table only,
    /// closed by the driver's `deregister`).
    pub sock: Option<Socket>,
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
    pub fn new(sock: Option<Socket>) -> IoConn {
        IoConn {
            sock,
            reading: false,
            writing: false,
            connecting: false,
            direct: false,
            pool_buf: None,
            counted: false,
            closing: false,
        }
    }

    /// Its descriptor; -1 for none or a direct socket (which the driver names by index).
    pub fn fd(&self) -> RawFd {
        match &self.sock {
            Some(Socket::Fd(f)) => f.as_raw_fd(),
            Some(Socket::Direct(_)) | None => -1,
        }
    }

    pub fn ops_in_flight(&self) -> bool {
        self.reading || self.writing || self.connecting
    }
}

/// What the requests of a connection that a socket error `e` lost fail with: the error
/// names the operating system's reason (`connection reset by peer`).
pub(super) fn lost(e: &std::io::Error) -> Error {
    Error::new(ErrorKind::ConnectionLost).with_os_error(OsError::of(e))
}
