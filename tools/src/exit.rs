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
        ErrorKind::ConnectFailed => format!("{peer}: could not connect"),
        ErrorKind::Refused(s) => format!("{peer} refused the handshake: {}", refusal(s)),
        ErrorKind::Timeout => format!("{peer}: no reply within the timeout"),
        ErrorKind::ConnectionLost => format!("{peer}: connection lost"),
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
