//! Errors a request or the runtime can report.

use crate::wire::Status;
use core::fmt;

/// Why a request failed, or the runtime could not do what was asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// The request's deadline passed before its answer arrived.
    Timeout,
    /// The connection carrying the request was lost before the answer arrived.
    ConnectionLost,
    /// No connection to the peer could be made within the configured retries.
    ConnectFailed,
    /// The peer refused the handshake (cluster id, token, version or identity).
    Refused(Status),
    /// The peer answered the request with this error status.
    Remote(Status),
    /// The peer broke the protocol; the connection was closed.
    Protocol,
    /// Too many requests in flight: the request was not sent. Retry later.
    Backpressure,
    /// The runtime is shutting down.
    Shutdown,
    /// The request is malformed (e.g. a payload larger than the peer accepts).
    InvalidArgument,
}

impl Error {
    /// The wire status closest to this error.
    pub fn status(&self) -> Status {
        match *self {
            Error::Timeout => Status::DeadlineExceeded,
            Error::ConnectionLost | Error::ConnectFailed => Status::Unavailable,
            Error::Refused(s) | Error::Remote(s) => s,
            Error::Protocol => Status::Protocol,
            Error::Backpressure => Status::ResourceExhausted,
            Error::Shutdown => Status::Shutdown,
            Error::InvalidArgument => Status::InvalidArgument,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Timeout => f.write_str("deadline exceeded"),
            Error::ConnectionLost => f.write_str("connection to the peer lost"),
            Error::ConnectFailed => f.write_str("could not connect to the peer"),
            Error::Refused(s) => write!(f, "handshake refused by the peer ({s:?})"),
            Error::Remote(s) => write!(f, "the peer answered with an error ({s:?})"),
            Error::Protocol => f.write_str("protocol violation; connection closed"),
            Error::Backpressure => f.write_str("too many requests in flight"),
            Error::Shutdown => f.write_str("runtime shutting down"),
            Error::InvalidArgument => f.write_str("invalid request"),
        }
    }
}

impl std::error::Error for Error {}
