//! The status of a request or of one of its items, as the wire carries it.

use super::macros::enum_with_unknown;

enum_with_unknown! {
    /// Status of a whole request (`ERROR` frames) or of one item (`RESPONSE` entries).
    pub enum Status(u16) {
        /// Success.
        Ok = 0,
        /// No such variable, or the key is unknown to the responder's service.
        NotFound = 1,
        /// The step was aborted while the recv was pending.
        Aborted = 2,
        /// The request was cancelled.
        Cancelled = 3,
        /// The request's deadline passed.
        DeadlineExceeded = 4,
        /// The responder is shutting down.
        Shutdown = 5,
        /// A limit was hit: no free request slot, or an allocation failed.
        ResourceExhausted = 6,
        /// Well-formed but unacceptable.
        InvalidArgument = 7,
        /// The service's handler failed.
        Internal = 8,
        /// The responder serves no handler for this kind.
        Unimplemented = 9,
        /// The connection to the peer was lost.
        Unavailable = 10,
        /// A protocol violation.
        Protocol = 11,
        /// Unsupported protocol version.
        VersionMismatch = 12,
        /// The peers belong to different clusters.
        ClusterMismatch = 13,
        /// The cluster token is missing or wrong.
        Unauthenticated = 14,
        /// The server refuses the client's task identity.
        TaskRejected = 15,
    }
}

impl Status {
    /// Whether this is [`Status::Ok`].
    pub fn is_ok(self) -> bool {
        self == Status::Ok
    }
}
