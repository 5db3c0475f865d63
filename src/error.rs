//! Errors a request can report: what went wrong ([`ErrorKind`]), with which peer, and what
//! the peer said.

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;

use crate::wire::Status;

/// What went wrong, without where: what callers match on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
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
    /// No request with this tag is outstanding on this client (never submitted, or its
    /// completion was already taken).
    NotOutstanding,
    /// The completion answers another kind of request than the one asked for.
    OtherKind,
    /// The peer's address is no longer a task of the cluster: the task moved to another
    /// address or was removed ([`Runtime::update_cluster`](crate::Runtime::update_cluster)).
    /// The error's message says which; resolve the task again.
    NotInCluster,
}

impl ErrorKind {
    /// The wire status closest to this kind.
    pub fn status(self) -> Status {
        match self {
            ErrorKind::Timeout => Status::DeadlineExceeded,
            ErrorKind::ConnectionLost | ErrorKind::ConnectFailed | ErrorKind::NotInCluster => {
                Status::Unavailable
            }
            ErrorKind::Refused(s) | ErrorKind::Remote(s) => s,
            ErrorKind::Protocol => Status::Protocol,
            ErrorKind::Backpressure => Status::ResourceExhausted,
            ErrorKind::Shutdown => Status::Shutdown,
            ErrorKind::InvalidArgument | ErrorKind::NotOutstanding | ErrorKind::OtherKind => {
                Status::InvalidArgument
            }
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ErrorKind::Timeout => f.write_str("deadline exceeded"),
            ErrorKind::ConnectionLost => f.write_str("connection to the peer lost"),
            ErrorKind::ConnectFailed => f.write_str("could not connect to the peer"),
            ErrorKind::Refused(s) => write!(f, "handshake refused by the peer ({s:?})"),
            ErrorKind::Remote(s) => write!(f, "the peer answered with an error ({s:?})"),
            ErrorKind::Protocol => f.write_str("protocol violation; connection closed"),
            ErrorKind::Backpressure => f.write_str("too many requests in flight"),
            ErrorKind::Shutdown => f.write_str("runtime shutting down"),
            ErrorKind::InvalidArgument => f.write_str("invalid request"),
            ErrorKind::NotOutstanding => f.write_str("no request with this tag is outstanding"),
            ErrorKind::OtherKind => f.write_str("the completion is of another request kind"),
            ErrorKind::NotInCluster => f.write_str("the peer is no longer a task of the cluster"),
        }
    }
}

/// Why a request failed: its [`kind`](Error::kind), the [`peer`](Error::peer) it was for
/// (when it had reached one), and the peer's own words where the peer gave a reason
/// ([`remote_message`](Error::remote_message)). Cheap to clone.
///
/// ```
/// use starwire::{Error, ErrorKind};
///
/// let e = Error::from(ErrorKind::Timeout);
/// assert!(e.is_timeout());
/// assert_eq!(e, ErrorKind::Timeout);
/// assert_eq!(e.peer(), None);
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Error {
    kind: ErrorKind,
    /// Boxed, so that a result carrying an error is no larger than the answer it stands
    /// for: completions move through rings and queues on the hot path.
    detail: Option<Box<Detail>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct Detail {
    peer: Option<SocketAddr>,
    message: Option<Arc<str>>,
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Error")
            .field("kind", &self.kind)
            .field("peer", &self.peer())
            .field("message", &self.remote_message())
            .finish()
    }
}

impl Error {
    /// An error of `kind`, for no peer in particular.
    pub fn new(kind: ErrorKind) -> Error {
        Error { kind, detail: None }
    }

    /// An [`ErrorKind::InvalidArgument`] saying `what`.
    pub(crate) fn invalid(what: &str) -> Error {
        Error::new(ErrorKind::InvalidArgument).with_message(what.to_owned())
    }

    /// The same error, naming `peer`.
    pub fn with_peer(mut self, peer: SocketAddr) -> Error {
        self.detail.get_or_insert_with(Box::default).peer = Some(peer);
        self
    }

    /// The same error, with what the peer said.
    pub fn with_message(mut self, message: impl Into<Arc<str>>) -> Error {
        self.detail.get_or_insert_with(Box::default).message = Some(message.into());
        self
    }

    /// What went wrong.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The peer the request was for, when it had been routed to one.
    pub fn peer(&self) -> Option<SocketAddr> {
        self.detail.as_ref().and_then(|d| d.peer)
    }

    /// What the peer said: the message of its `ERROR` frame, for a remote error or a
    /// refused handshake.
    pub fn remote_message(&self) -> Option<&str> {
        self.detail.as_ref().and_then(|d| d.message.as_deref())
    }

    /// The wire status closest to this error.
    pub fn status(&self) -> Status {
        self.kind.status()
    }

    /// The deadline passed.
    pub fn is_timeout(&self) -> bool {
        self.kind == ErrorKind::Timeout
    }

    /// The connection was lost, or could not be made.
    pub fn is_connection(&self) -> bool {
        matches!(
            self.kind,
            ErrorKind::ConnectionLost | ErrorKind::ConnectFailed
        )
    }

    /// The peer refused the handshake.
    pub fn is_refused(&self) -> bool {
        matches!(self.kind, ErrorKind::Refused(_))
    }

    /// The peer answered with an error status (see [`status`](Self::status)).
    pub fn is_remote(&self) -> bool {
        matches!(self.kind, ErrorKind::Remote(_))
    }
}

impl From<ErrorKind> for Error {
    fn from(kind: ErrorKind) -> Error {
        Error::new(kind)
    }
}

impl PartialEq<ErrorKind> for Error {
    fn eq(&self, kind: &ErrorKind) -> bool {
        self.kind == *kind
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.kind, f)?;
        if let Some(peer) = self.peer() {
            write!(f, " (peer {peer})")?;
        }
        if let Some(m) = self.remote_message() {
            write!(f, ": {m}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_the_peer_and_what_it_said() {
        let peer: SocketAddr = "10.0.0.1:5555".parse().unwrap();
        let e = Error::new(ErrorKind::Remote(Status::NotFound))
            .with_peer(peer)
            .with_message("no variable 7");
        assert_eq!(
            e.to_string(),
            "the peer answered with an error (NotFound) (peer 10.0.0.1:5555): no variable 7"
        );
        assert_eq!(e.status(), Status::NotFound);
        assert!(e.is_remote() && !e.is_timeout());
        assert_eq!(e.remote_message(), Some("no variable 7"));
    }
}
