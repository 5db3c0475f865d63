//! Exit codes, and the error type that carries one.

use starwire::Status;
use starwire::{Error, ErrorKind};

/// Success: valid, or every request answered.
pub const OK: i32 = 0;
/// `validate` found problems; `ping` or `bench` lost some requests (not all).
pub const FAILED: i32 = 1;
/// Usage or configuration error, or a file that cannot be read.
pub const USAGE: i32 = 2;
/// Could not connect: nothing listening, or unreachable.
pub const UNREACHABLE: i32 = 3;
/// The server refused the handshake.
pub const REFUSED: i32 = 4;
/// No reply within the timeout.
pub const TIMEOUT: i32 = 5;
/// Connection lost, protocol error, or another transport error.
pub const TRANSPORT: i32 = 6;

/// A failure that ends the command: a one-line message and the exit code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The exit code.
    pub code: i32,
    /// The message, printed as `commctl: MESSAGE`.
    pub message: String,
}

impl Failure {
    /// A usage or configuration error.
    pub fn usage(message: impl Into<String>) -> Failure {
        Failure {
            code: USAGE,
            message: message.into(),
        }
    }
}

/// The exit code for a request that failed with `e`.
pub fn code_of(e: &Error) -> i32 {
    match e.kind() {
        ErrorKind::ConnectFailed => UNREACHABLE,
        ErrorKind::Refused(_) => REFUSED,
        ErrorKind::Timeout => TIMEOUT,
        _ => TRANSPORT,
    }
}

/// Why a handshake was refused, in words a user can act on.
pub fn refusal(status: Status) -> String {
    match status {
        Status::ClusterMismatch => {
            "cluster id differs (STARWIRE_CLUSTER_ID must match the server's)".into()
        }
        Status::Unauthenticated => {
            "cluster token missing or wrong (STARWIRE_CLUSTER_TOKEN must match the server's)".into()
        }
        Status::VersionMismatch => "protocol version not supported by the other side".into(),
        Status::TaskRejected => "the server does not accept this task".into(),
        other => format!("status {other:?}"),
    }
}

/// A one-line description of a request failure to `peer`.
pub fn describe(e: &Error, peer: &str) -> String {
    match e.kind() {
        ErrorKind::ConnectFailed => match e.os_error() {
            Some(os) => format!("{peer}: could not connect: {os}"),
            None => format!("{peer}: could not connect"),
        },
        ErrorKind::Refused(s) => format!("{peer} refused the handshake: {}", refusal(s)),
        ErrorKind::Timeout if e.connect_attempts().is_some() => match e.os_error() {
            Some(os) => format!("{peer}: not connected within the timeout (last attempt: {os})"),
            None => format!("{peer}: not connected within the timeout"),
        },
        ErrorKind::Timeout => format!("{peer}: no reply within the timeout"),
        ErrorKind::ConnectionLost => match e.os_error() {
            Some(os) => format!("{peer}: connection lost: {os}"),
            None => format!("{peer}: connection lost"),
        },
        ErrorKind::Protocol => format!("{peer}: protocol error; connection closed"),
        ErrorKind::Remote(s) => match e.remote_message() {
            Some(m) => format!("{peer} answered with an error ({s:?}): {m}"),
            None => format!("{peer} answered with an error ({s:?})"),
        },
        ErrorKind::InvalidArgument => {
            format!("{peer}: request not sendable (payload too large?)")
        }
        _ => format!("{peer}: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use starwire::OsError;

    #[test]
    fn a_connect_failure_says_why() {
        // ECONNREFUSED, ECONNRESET on Linux.
        let (refused, reset) = (
            OsError::from_raw_os_error(111),
            OsError::from_raw_os_error(104),
        );
        let failed = Error::new(ErrorKind::ConnectFailed).with_os_error(refused);
        assert_eq!(
            describe(&failed, "ps:1"),
            "ps:1: could not connect: connection refused"
        );
        let connecting = Error::new(ErrorKind::Timeout)
            .with_os_error(refused)
            .with_connect_attempts(2, None);
        assert_eq!(
            describe(&connecting, "ps:1"),
            "ps:1: not connected within the timeout (last attempt: connection refused)"
        );
        let waiting = Error::new(ErrorKind::Timeout);
        assert_eq!(
            describe(&waiting, "ps:1"),
            "ps:1: no reply within the timeout"
        );
        let lost = Error::new(ErrorKind::ConnectionLost).with_os_error(reset);
        assert_eq!(
            describe(&lost, "ps:1"),
            "ps:1: connection lost: connection reset by peer"
        );
        assert_eq!(code_of(&connecting), TIMEOUT);
    }
}
