//! A connection as the loop's I/O sees it: its socket and the operations in flight on it.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};

/// One connection's I/O state, in the slot the session gave the connection.
pub(super) struct IoConn {
    pub fd: Option<OwnedFd>,
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
