//! What a driver's operations are called (`user_data`) and what their completions say.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};

/// The slot number reserved for a loop's listener.
pub const LISTENER: u32 = u32::MAX;

/// `user_data` the loop gives its doorbell read / poll (both backends); one of the values
/// an io_uring ring reserves, delivered to its reap callback like any completion.
pub const USER_DATA_DOORBELL: u64 = u64::MAX - 1;

/// Operation kinds, kept in the low byte of `user_data`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Op {
    /// Accept on a listener.
    Accept = 1,
    /// Connect a socket.
    Connect = 2,
    /// Receive into a buffer.
    Recv = 3,
    /// Send a message (iovecs).
    Send = 4,
}

/// The low byte of a direct accept's `user_data` (not an [`Op`]: the event loop sees it as
/// an accept). Multishot receives use 5.
pub(super) const ACCEPT_DIRECT: u64 = 6;

/// An accepted socket: a descriptor of the process, or only an entry of the io_uring
/// ring's file table (a *direct* descriptor, see [`FixedFiles`](super::uring::FixedFiles)).
#[derive(Debug)]
pub enum Socket {
    /// A descriptor (non-blocking, close-on-exec).
    Fd(OwnedFd),
    /// The index of its entry in the file table; it has no descriptor, and is closed by
    /// emptying the entry.
    Direct(u32),
}

/// `user_data` of an operation on `slot`.
pub fn user_data(slot: u32, op: Op) -> u64 {
    ((slot as u64) << 8) | op as u64
}

/// A completion: the slot, the operation, and its result.
#[derive(Debug)]
pub enum IoCompletion {
    /// An operation finished: bytes moved (0 at the end of a stream), or 0 for a connect.
    Op {
        /// The slot it was issued on.
        slot: u32,
        /// Which operation (not `Accept`).
        op: Op,
        /// Bytes, 0, or the error.
        result: io::Result<u32>,
    },
    /// An accept on the listener finished: the new socket, or the error.
    Accepted(io::Result<Socket>),
    /// The doorbell rang.
    Doorbell,
}

/// The completion `user_data` and `result` stand for; `None` for the driver's own.
pub(super) fn decode(user_data: u64, result: i32) -> Option<IoCompletion> {
    if user_data == USER_DATA_DOORBELL {
        return Some(IoCompletion::Doorbell);
    }
    let op = match user_data & 0xff {
        ACCEPT_DIRECT if result >= 0 => {
            return Some(IoCompletion::Accepted(Ok(Socket::Direct(result as u32))))
        }
        1 | ACCEPT_DIRECT => Op::Accept,
        2 => Op::Connect,
        3 => Op::Recv,
        4 => Op::Send,
        _ => return None,
    };
    if result < 0 {
        let e = io::Error::from_raw_os_error(-result);
        return Some(match op {
            Op::Accept => IoCompletion::Accepted(Err(e)),
            _ => IoCompletion::Op {
                slot: (user_data >> 8) as u32,
                op,
                result: Err(e),
            },
        });
    }
    Some(match op {
        // SAFETY: a successful accept returns a new fd that nothing else owns.
        Op::Accept => {
            IoCompletion::Accepted(Ok(Socket::Fd(unsafe { OwnedFd::from_raw_fd(result) })))
        }
        _ => IoCompletion::Op {
            slot: (user_data >> 8) as u32,
            op,
            result: Ok(result as u32),
        },
    })
}
