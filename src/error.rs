//! Errors a request can report: what went wrong ([`ErrorKind`]), with which peer, and what
//! the peer said.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

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

/// The operating system's reason for a failed connect or a lost connection: an `errno`
/// value, such as `ECONNREFUSED` (nothing listens at the address) or `EHOSTUNREACH` (no
/// route to the host). A connect attempt starwire gave up on because the peer did not
/// answer within `handshake_timeout` reads as `ETIMEDOUT`. `Display` is the system's text,
/// lower-cased (`connection refused`); [`kind`](Self::kind) is the [`io::ErrorKind`] to
/// match on. Four bytes, `Copy`.
///
/// ```
/// use starwire::OsError;
///
/// let refused = OsError::from_raw_os_error(111); // ECONNREFUSED on Linux
/// assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
/// assert_eq!(refused.to_string(), "connection refused");
/// assert_eq!(std::io::Error::from(refused).raw_os_error(), Some(111));
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct OsError(i32);

impl OsError {
    /// What starwire reports for a connect attempt the peer did not answer in time.
    pub(crate) const TIMED_OUT: OsError = OsError(nix::libc::ETIMEDOUT);

    /// The reason of `errno` value `code`.
    pub const fn from_raw_os_error(code: i32) -> OsError {
        OsError(code)
    }

    /// The reason of a failed system call (`EIO` for an error that carries no `errno`).
    pub(crate) fn of(e: &io::Error) -> OsError {
        OsError(e.raw_os_error().unwrap_or(nix::libc::EIO))
    }

    /// The `errno` value.
    pub fn raw_os_error(self) -> i32 {
        self.0
    }

    /// The standard library's kind of it (`ConnectionRefused`, `TimedOut`, ...).
    pub fn kind(self) -> io::ErrorKind {
        io::Error::from(self).kind()
    }
}

impl From<OsError> for io::Error {
    fn from(e: OsError) -> io::Error {
        io::Error::from_raw_os_error(e.0)
    }
}

impl fmt::Display for OsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The system's text, without the "(os error N)" the standard library appends, and
        // lower-cased like the rest of a message.
        let text = io::Error::from(*self).to_string();
        let suffix = format!(" (os error {})", self.0);
        let text = text.strip_suffix(suffix.as_str()).unwrap_or(&text);
        let mut chars = text.chars();
        if let Some(first) = chars.next() {
            for c in first.to_lowercase() {
                fmt::Write::write_char(f, c)?;
            }
        }
        f.write_str(chars.as_str())
    }
}

impl fmt::Debug for OsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OsError({}, {:?})", self.0, self.to_string())
    }
}

impl std::error::Error for OsError {}

/// Why a request failed: its [`kind`](Error::kind), the [`peer`](Error::peer) it was for
/// (when it had reached one) and that peer's [`task`](Error::task) name where it is known,
/// the operating system's reason for a failed connect or a lost connection
/// ([`os_error`](Error::os_error)), and the peer's own words where the peer gave a reason
/// ([`remote_message`](Error::remote_message)). Two words in size and cheap to clone (the
/// detail is shared, not copied).
///
/// `Display` names the peer by task and address when both are known:
///
/// - `could not connect to ps:1 (10.0.0.2:5555) after 9 attempts over 2.6 s: connection
///   refused` ([`ErrorKind::ConnectFailed`]: every attempt of the connect-retry schedule
///   failed; see [`Client`](crate::Client#unreachable-peers));
/// - `deadline exceeded while connecting to ps:1 (10.0.0.2:5555): connection refused
///   (attempt 3)` ([`ErrorKind::Timeout`] while the connection was still being retried;
///   [`connect_attempts`](Error::connect_attempts) is 3);
/// - `connection to ps:1 (10.0.0.2:5555) lost` ([`ErrorKind::ConnectionLost`]);
/// - `deadline exceeded waiting for ps:1 (10.0.0.2:5555)`;
/// - other kinds: `the peer answered with an error (NotFound) (peer ps:1 at
///   10.0.0.2:5555): no variable 7`.
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
    /// Shared, so that a result carrying an error is no larger than the answer it stands
    /// for (completions move through rings and queues on the hot path), and so that the
    /// error of a lost connection is given to each of its requests without a copy.
    detail: Option<Arc<Detail>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct Detail {
    peer: Option<SocketAddr>,
    /// The peer's task name, `job:index`.
    task: Option<Arc<str>>,
    message: Option<Arc<str>>,
    os: Option<OsError>,
    connect: Option<Connect>,
}

/// The connect attempts behind an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Connect {
    /// Attempts made (`ConnectFailed`), or failed so far (`Timeout`).
    attempts: u32,
    /// From the first attempt to giving up (`ConnectFailed`).
    over: Option<Duration>,
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Error")
            .field("kind", &self.kind)
            .field("peer", &self.peer())
            .field("task", &self.task())
            .field("os_error", &self.os_error())
            .field("connect_attempts", &self.connect_attempts())
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

    fn detail_mut(&mut self) -> &mut Detail {
        Arc::make_mut(self.detail.get_or_insert_with(Default::default))
    }

    /// The same error, naming `peer`.
    pub fn with_peer(mut self, peer: SocketAddr) -> Error {
        self.detail_mut().peer = Some(peer);
        self
    }

    /// The same error, naming the peer's task (`job:index`, e.g. `ps:1`).
    pub fn with_task(mut self, task: impl Into<Arc<str>>) -> Error {
        self.detail_mut().task = Some(task.into());
        self
    }

    /// The same error, with what the peer said.
    pub fn with_message(mut self, message: impl Into<Arc<str>>) -> Error {
        self.detail_mut().message = Some(message.into());
        self
    }

    /// The same error, with the operating system's reason.
    pub fn with_os_error(mut self, os: OsError) -> Error {
        self.detail_mut().os = Some(os);
        self
    }

    /// The same error, after `attempts` connect attempts (see
    /// [`connect_attempts`](Self::connect_attempts)), made over `over` (from the first
    /// attempt to giving up, for [`ErrorKind::ConnectFailed`]).
    pub fn with_connect_attempts(mut self, attempts: u32, over: Option<Duration>) -> Error {
        self.detail_mut().connect = Some(Connect { attempts, over });
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

    /// The peer's task name (`ps:1`), where it is known: the request named it (a
    /// [`Peer`](crate::Peer) from a [`Resolver`](crate::Resolver), by task name or by an
    /// address the cluster has a task at), or a handshake with the peer did. The names
    /// are those of the metrics ([`PeerMetrics::task`](crate::stats::PeerMetrics::task)).
    pub fn task(&self) -> Option<&str> {
        self.detail.as_ref().and_then(|d| d.task.as_deref())
    }

    /// The operating system's reason: for [`ErrorKind::ConnectFailed`], why the last
    /// connect attempt failed; for an [`ErrorKind::Timeout`] that came while the connection
    /// was still being retried, why the last attempt before it failed (none when none had
    /// failed yet); for [`ErrorKind::ConnectionLost`], the socket error that lost it, when
    /// there was one (not for a peer that closed the connection).
    pub fn os_error(&self) -> Option<OsError> {
        self.detail.as_ref().and_then(|d| d.os)
    }

    /// For [`ErrorKind::ConnectFailed`], the connect attempts made (`connect_retries` + 1
    /// when every retry failed); for an [`ErrorKind::Timeout`] that came while connecting,
    /// the attempts that had failed by then. `None` for other errors.
    pub fn connect_attempts(&self) -> Option<u32> {
        self.detail
            .as_ref()
            .and_then(|d| d.connect)
            .map(|c| c.attempts)
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

/// The peer as an error names it: `ps:1 (10.0.0.2:5555)`, or what is known of it; with
/// `flat`, `ps:1 at 10.0.0.2:5555` (for inside parentheses).
struct Who<'a> {
    task: Option<&'a str>,
    peer: Option<SocketAddr>,
    flat: bool,
}

impl Who<'_> {
    fn known(&self) -> bool {
        self.task.is_some() || self.peer.is_some()
    }
}

impl fmt::Display for Who<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.task, self.peer) {
            (Some(t), Some(p)) if self.flat => write!(f, "{t} at {p}"),
            (Some(t), Some(p)) => write!(f, "{t} ({p})"),
            (Some(t), None) => f.write_str(t),
            (None, Some(p)) => write!(f, "{p}"),
            (None, None) => f.write_str("the peer"),
        }
    }
}

/// A time span as an error message says it: `2.6 s`, `40 ms`.
fn span(d: Duration) -> String {
    if d >= Duration::from_secs(1) {
        format!("{:.1} s", d.as_secs_f64())
    } else {
        format!("{} ms", d.as_millis())
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = self.detail.as_deref();
        let who = Who {
            task: self.task(),
            peer: self.peer(),
            flat: false,
        };
        let connect = d.and_then(|d| d.connect);
        let mut os = self.os_error();
        match (self.kind, connect) {
            (ErrorKind::ConnectFailed, _) => {
                write!(f, "could not connect to {who}")?;
                match connect {
                    Some(Connect { attempts: 1, .. }) => f.write_str(" after 1 attempt")?,
                    Some(Connect { attempts, over }) => {
                        write!(f, " after {attempts} attempts")?;
                        if let Some(over) = over {
                            write!(f, " over {}", span(over))?;
                        }
                    }
                    None => {}
                }
            }
            (ErrorKind::Timeout, Some(c)) => {
                write!(f, "deadline exceeded while connecting to {who}")?;
                if let Some(reason) = os.take() {
                    write!(f, ": {reason} (attempt {})", c.attempts)?;
                }
            }
            (ErrorKind::Timeout, None) if who.known() => {
                write!(f, "deadline exceeded waiting for {who}")?;
            }
            (ErrorKind::ConnectionLost, _) => write!(f, "connection to {who} lost")?,
            (kind, _) => {
                fmt::Display::fmt(&kind, f)?;
                if who.known() {
                    let who = Who { flat: true, ..who };
                    write!(f, " (peer {who})")?;
                }
            }
        }
        if let Some(reason) = os {
            write!(f, ": {reason}")?;
        }
        if let Some(m) = self.remote_message() {
            write!(f, ": {m}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.detail
            .as_ref()
            .and_then(|d| d.os.as_ref())
            .map(|os| os as _)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const REFUSED: OsError = OsError(nix::libc::ECONNREFUSED);

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
        let named = e.with_task("ps:1");
        assert_eq!(
            named.to_string(),
            "the peer answered with an error (NotFound) (peer ps:1 at 10.0.0.1:5555): \
             no variable 7"
        );
        assert_eq!(named.task(), Some("ps:1"));
    }

    #[test]
    fn a_failed_connect_says_where_how_often_for_how_long_and_why() {
        let peer: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let e = Error::new(ErrorKind::ConnectFailed)
            .with_peer(peer)
            .with_task("ps:1")
            .with_os_error(REFUSED)
            .with_connect_attempts(9, Some(Duration::from_millis(2_560)));
        assert_eq!(
            e.to_string(),
            "could not connect to ps:1 (127.0.0.1:1) after 9 attempts over 2.6 s: \
             connection refused"
        );
        assert_eq!(
            e.os_error().map(OsError::kind),
            Some(io::ErrorKind::ConnectionRefused)
        );
        assert_eq!(e.connect_attempts(), Some(9));
        assert!(e.is_connection());
        // The reason is the error's source, as an I/O error.
        let source = std::error::Error::source(&e).unwrap().to_string();
        assert_eq!(source, "connection refused");
        // Without a task name, the address; one attempt, no span.
        let once = Error::new(ErrorKind::ConnectFailed)
            .with_peer(peer)
            .with_os_error(OsError::TIMED_OUT)
            .with_connect_attempts(1, Some(Duration::from_secs(5)));
        assert_eq!(
            once.to_string(),
            "could not connect to 127.0.0.1:1 after 1 attempt: connection timed out"
        );
    }

    #[test]
    fn a_deadline_while_connecting_says_so_and_stays_a_timeout() {
        let peer: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let e = Error::new(ErrorKind::Timeout)
            .with_peer(peer)
            .with_task("ps:1")
            .with_os_error(REFUSED)
            .with_connect_attempts(3, None);
        assert_eq!(
            e.to_string(),
            "deadline exceeded while connecting to ps:1 (127.0.0.1:1): connection refused \
             (attempt 3)"
        );
        assert!(e.is_timeout());
        assert_eq!(e.status(), Status::DeadlineExceeded);
        // Before any attempt failed: no reason to give.
        let first = Error::new(ErrorKind::Timeout)
            .with_peer(peer)
            .with_connect_attempts(0, None);
        assert_eq!(
            first.to_string(),
            "deadline exceeded while connecting to 127.0.0.1:1"
        );
        // Not connecting: the deadline passed waiting for the answer.
        let waiting = Error::new(ErrorKind::Timeout)
            .with_peer(peer)
            .with_task("ps:1");
        assert_eq!(
            waiting.to_string(),
            "deadline exceeded waiting for ps:1 (127.0.0.1:1)"
        );
    }

    #[test]
    fn a_lost_connection_names_the_task_and_the_socket_error() {
        let peer: SocketAddr = "127.0.0.1:15552".parse().unwrap();
        let e = Error::new(ErrorKind::ConnectionLost)
            .with_peer(peer)
            .with_task("ps:1");
        assert_eq!(e.to_string(), "connection to ps:1 (127.0.0.1:15552) lost");
        let reset = e.with_os_error(OsError(nix::libc::ECONNRESET));
        assert_eq!(
            reset.to_string(),
            "connection to ps:1 (127.0.0.1:15552) lost: connection reset by peer"
        );
        assert_eq!(
            Error::new(ErrorKind::ConnectionLost).to_string(),
            "connection to the peer lost"
        );
    }

    #[test]
    fn an_error_stays_two_words_and_clones_share_the_detail() {
        assert!(std::mem::size_of::<Error>() <= 16);
        assert!(std::mem::size_of::<OsError>() == 4);
        let e = Error::new(ErrorKind::ConnectionLost)
            .with_peer("10.0.0.1:5555".parse().unwrap())
            .with_task("ps:0");
        let c = e.clone();
        let (a, b) = (e.detail.as_ref().unwrap(), c.detail.as_ref().unwrap());
        assert!(Arc::ptr_eq(a, b));
        // Adding to a clone leaves the original as it was.
        let more = c.with_message("gone");
        assert_eq!(e.remote_message(), None);
        assert_eq!(more.remote_message(), Some("gone"));
    }
}
