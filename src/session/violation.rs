//! Why a peer's frame breaks the protocol. A violation closes the connection: its text is
//! sent to the peer in the connection's `ERROR`, logged, and carried in the error every
//! request on the connection fails with. Data only.

use core::fmt;

use crate::wire::FrameKind;

/// A frame the peer should not have sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Violation {
    /// An answer names a handle this task has no request for on the connection (never
    /// issued, completed already, or of an earlier generation).
    UnknownHandle(u64),
    /// An item of an answer came a second time.
    DuplicateAnswer { handle: u64, index: u32 },
    /// An answer names an item its request does not have.
    NoSuchItem { handle: u64, index: u32 },
    /// An answer of a kind the request cannot have (e.g. a `PONG` for a pull).
    WrongAnswer {
        handle: u64,
        /// The frame's kind.
        kind: FrameKind,
        /// What the request is.
        request: &'static str,
    },
    /// An answer item whose form its request cannot have.
    BadItem {
        handle: u64,
        index: u32,
        /// What is wrong with it.
        why: &'static str,
    },
    /// A rows block of another dtype or shape than the request asked for.
    RowsShape { handle: u64, index: u32 },
    /// A request with a handle the peer still has a request of in flight here.
    HandleInUse { handle: u64, kind: FrameKind },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Violation::UnknownHandle(h) => {
                write!(f, "answer with an unknown or stale handle {h:#018x}")
            }
            Violation::DuplicateAnswer { handle, index } => {
                write!(f, "item {index} of request {handle:#018x} answered twice")
            }
            Violation::NoSuchItem { handle, index } => {
                write!(
                    f,
                    "answer to item {index}, out of range of request {handle:#018x}"
                )
            }
            Violation::WrongAnswer {
                handle,
                kind,
                request,
            } => write!(
                f,
                "{kind:?} for request {handle:#018x}, which is a {request}"
            ),
            Violation::BadItem { handle, index, why } => {
                write!(f, "item {index} of the answer to {handle:#018x}: {why}")
            }
            Violation::RowsShape { handle, index } => write!(
                f,
                "rows block {index} of the answer to {handle:#018x} of another dtype or shape \
                 than asked for"
            ),
            Violation::HandleInUse { handle, kind } => {
                write!(f, "{kind:?} with handle {handle:#018x}, already in use")
            }
        }
    }
}
