//! What a call returns: `sw_result`, the failure behind a code that is not `SW_OK` (its
//! message, and for an error the peer reported its status and message), the per-thread last
//! error C reads with `sw_last_error`, and the conversion from starwire's errors.

use std::cell::RefCell;
use std::ffi::{c_char, CString};
use std::fmt::Display;

use starwire::{Error, ErrorKind};

use crate::boundary::{boundary, Outcome};

/// What a call returned. `SW_OK` is 0; the values are stable.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum sw_result {
    /// Success.
    SW_OK = 0,
    /// A required pointer was NULL.
    SW_ERR_NULL = 1,
    /// An argument is invalid (bad address, dtype, shape, length, empty list, unknown tag).
    SW_ERR_INVALID_ARGUMENT = 2,
    /// A setting is malformed or out of range (the message names it).
    SW_ERR_CONFIG = 3,
    /// An operating-system error (listening, starting loops).
    SW_ERR_IO = 4,
    /// The request's deadline passed.
    SW_ERR_TIMEOUT = 5,
    /// The connection to the peer was lost.
    SW_ERR_CONNECTION_LOST = 6,
    /// The peer could not be reached.
    SW_ERR_CONNECT_FAILED = 7,
    /// The peer refused the handshake (cluster id or token).
    SW_ERR_REFUSED = 8,
    /// The peer answered the request with an error status (see the message).
    SW_ERR_REMOTE = 9,
    /// The peer violated the protocol; its connection was closed.
    SW_ERR_PROTOCOL = 10,
    /// Too many requests in flight on this client.
    SW_ERR_BACKPRESSURE = 11,
    /// The runtime is shutting down.
    SW_ERR_SHUTDOWN = 12,
    /// starwire panicked inside this call (a bug); the call had no effect.
    SW_ERR_PANIC = 13,
    /// The rendezvous key is already published and not yet received.
    SW_ERR_ALREADY_PUBLISHED = 14,
    /// A checkpoint could not be read or written: a system call failed (the message names
    /// the file, the step and the system's error; a checkpoint that is not there fails
    /// opening it).
    SW_ERR_CHECKPOINT_IO = 15,
    /// The file is not a table checkpoint (it does not start with the magic).
    SW_ERR_NOT_A_CHECKPOINT = 16,
    /// The checkpoint has a format version this build does not read.
    SW_ERR_CHECKPOINT_VERSION = 17,
    /// The checkpoint ends early.
    SW_ERR_CHECKPOINT_TRUNCATED = 18,
    /// A checksum or a count of the checkpoint does not match: the file was damaged.
    SW_ERR_CHECKPOINT_CORRUPTED = 19,
    /// The checkpoint holds rows of another shape (table id, dim, stored format, optimizer
    /// state) than the table's settings.
    SW_ERR_CHECKPOINT_SHAPE = 20,
    /// The table of a checkpoint could not be built, or refused its rows (a row cap below
    /// the file's rows).
    SW_ERR_CHECKPOINT_TABLE = 21,
    /// The table refused new rows: it is at its row cap, or out of memory.
    SW_ERR_TABLE_FULL = 22,
}

use sw_result::*;

/// A failure: its code and message, for an error the peer reported (`SW_ERR_REMOTE`,
/// `SW_ERR_REFUSED`) its wire status and the peer's own message, and for a request's error
/// the peer's task name and the operating system's reason (`errno`), where known.
#[derive(Clone)]
pub(crate) struct Failure {
    pub(crate) code: sw_result,
    pub(crate) msg: String,
    pub(crate) remote: Option<(u32, String)>,
    pub(crate) task: Option<String>,
    pub(crate) os_error: i32,
}

impl Failure {
    pub(crate) fn new(code: sw_result, msg: impl Into<String>) -> Failure {
        Failure {
            code,
            msg: msg.into(),
            remote: None,
            task: None,
            os_error: 0,
        }
    }

    /// `SW_ERR_NULL` for the argument `what`.
    pub(crate) fn null(what: impl Display) -> Failure {
        Failure::new(SW_ERR_NULL, format!("{what} is NULL"))
    }

    pub(crate) fn invalid(msg: impl Into<String>) -> Failure {
        Failure::new(SW_ERR_INVALID_ARGUMENT, msg.into())
    }

    /// This thread's last error, failed with `code` by a call made from inside another
    /// (which records it again as its own).
    pub(crate) fn again(code: sw_result) -> Failure {
        LAST_ERROR.with(|e| {
            let e = e.borrow();
            Failure {
                code,
                msg: e.message.to_string_lossy().into_owned(),
                remote: (e.status != 0)
                    .then(|| (e.status, e.remote.to_string_lossy().into_owned())),
                task: (!e.task.is_empty()).then(|| e.task.to_string_lossy().into_owned()),
                os_error: e.os_error,
            }
        })
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Failure {
        let code = match e.kind() {
            ErrorKind::Timeout => SW_ERR_TIMEOUT,
            ErrorKind::ConnectionLost => SW_ERR_CONNECTION_LOST,
            // A task that moved or left the cluster: as unreachable as one that refuses
            // connections; the message says where it went.
            ErrorKind::ConnectFailed | ErrorKind::NotInCluster => SW_ERR_CONNECT_FAILED,
            ErrorKind::Refused(_) => SW_ERR_REFUSED,
            ErrorKind::Remote(_) => SW_ERR_REMOTE,
            ErrorKind::Protocol => SW_ERR_PROTOCOL,
            ErrorKind::Backpressure => SW_ERR_BACKPRESSURE,
            ErrorKind::Shutdown => SW_ERR_SHUTDOWN,
            _ => SW_ERR_INVALID_ARGUMENT,
        };
        let remote = match e.kind() {
            ErrorKind::Refused(s) | ErrorKind::Remote(s) => Some((
                u32::from(u16::from(s)),
                e.remote_message().unwrap_or_default().to_owned(),
            )),
            _ => None,
        };
        Failure {
            code,
            msg: e.to_string(),
            remote,
            task: e.task().map(str::to_owned),
            os_error: e.os_error().map_or(0, |o| o.raw_os_error()),
        }
    }
}

/// A body's outcome as C sees it: `SW_OK`, or the failure's code with the failure made this
/// thread's last error.
impl Outcome for Result<(), Failure> {
    type C = sw_result;

    fn into_c(self) -> sw_result {
        match self {
            Ok(()) => SW_OK,
            Err(failure) => {
                record(&failure);
                failure.code
            }
        }
    }

    fn panicked() -> sw_result {
        record(&Failure::new(
            SW_ERR_PANIC,
            "starwire panicked inside this call",
        ));
        SW_ERR_PANIC
    }
}

/// What `sw_last_error`, `sw_last_error_status`, `sw_last_error_remote`,
/// `sw_last_error_task` and `sw_last_error_os_error` give.
#[derive(Default)]
struct LastError {
    message: CString,
    status: u32,
    remote: CString,
    task: CString,
    os_error: i32,
}

thread_local! {
    static LAST_ERROR: RefCell<LastError> = RefCell::new(LastError::default());
}

/// `s` as a C string (a NUL inside it becomes a space).
pub(crate) fn c_string(s: &str) -> CString {
    CString::new(s.replace('\0', " ")).unwrap_or_default()
}

/// Makes `f` this thread's last error.
pub(crate) fn record(f: &Failure) {
    let (status, remote) = match &f.remote {
        Some((status, remote)) => (*status, c_string(remote)),
        None => (0, CString::default()),
    };
    let last = LastError {
        message: c_string(&f.msg),
        status,
        remote,
        task: c_string(f.task.as_deref().unwrap_or_default()),
        os_error: f.os_error,
    };
    LAST_ERROR.with(|e| *e.borrow_mut() = last);
}

/// The message of this thread's last failed call: a NUL-terminated string owned by
/// starwire, valid until the next starwire call on this thread. Empty if none failed.
#[no_mangle]
pub extern "C" fn sw_last_error() -> *const c_char {
    boundary!(c"".as_ptr(), {
        LAST_ERROR.with(|e| e.borrow().message.as_ptr())
    })
}

/// For this thread's last failed call, when it failed with `SW_ERR_REMOTE` or
/// `SW_ERR_REFUSED`: the wire status the peer answered with (9 `UNIMPLEMENTED`, ... as in
/// `docs/wire-format.md`). 0 otherwise.
#[no_mangle]
pub extern "C" fn sw_last_error_status() -> u32 {
    boundary!(0, { LAST_ERROR.with(|e| e.borrow().status) })
}

/// For this thread's last failed call, when it failed with `SW_ERR_REMOTE` or
/// `SW_ERR_REFUSED`: the peer's own message (a NUL-terminated string owned by starwire,
/// valid until the next starwire call on this thread; empty if the peer sent none, or for
/// other failures).
#[no_mangle]
pub extern "C" fn sw_last_error_remote() -> *const c_char {
    boundary!(c"".as_ptr(), {
        LAST_ERROR.with(|e| e.borrow().remote.as_ptr())
    })
}

/// For this thread's last failed call, when it was a request's: the name of the peer's task
/// (`ps:1`), when it is known — the request named the peer `task@host:port`
/// (`sw_resolver_peer`), or a handshake with the peer named it. A NUL-terminated string
/// owned by starwire, valid until the next starwire call on this thread; empty otherwise.
#[no_mangle]
pub extern "C" fn sw_last_error_task() -> *const c_char {
    boundary!(c"".as_ptr(), {
        LAST_ERROR.with(|e| e.borrow().task.as_ptr())
    })
}

/// For this thread's last failed call, when it was a request's: the operating system's
/// reason, an `errno` value (`ECONNREFUSED`: nothing listens at the peer's address;
/// `EHOSTUNREACH`; `ETIMEDOUT`: the peer did not answer the connect within
/// `STARWIRE_HANDSHAKE_TIMEOUT_MS`). For `SW_ERR_CONNECT_FAILED`, why the last connect
/// attempt failed; for `SW_ERR_TIMEOUT` while the connection was still being retried, why
/// the last attempt before the deadline failed; for `SW_ERR_CONNECTION_LOST`, the socket
/// error that lost it. 0 when there is none. `strerror` gives its text; the message
/// (`sw_last_error`) has it too.
#[no_mangle]
pub extern "C" fn sw_last_error_os_error() -> i32 {
    boundary!(0, { LAST_ERROR.with(|e| e.borrow().os_error) })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a_bug() -> Result<(), Failure> {
        panic!("a bug")
    }

    fn a_bug_in_a_getter() -> u32 {
        panic!("in a getter")
    }

    fn last_message() -> String {
        LAST_ERROR.with(|e| e.borrow().message.to_string_lossy().into_owned())
    }

    #[test]
    fn a_panic_inside_the_boundary_becomes_an_error_code() {
        let r = boundary!({ a_bug() });
        assert_eq!(r, SW_ERR_PANIC);
        assert!(last_message().contains("panicked"));
        assert_eq!(boundary!(7, { a_bug_in_a_getter() }), 7);
        assert_eq!(boundary!({ Ok(()) }), SW_OK);
    }

    #[test]
    fn a_request_s_error_leaves_its_task_and_reason_until_the_next_failure() {
        let e = Error::new(ErrorKind::ConnectionLost)
            .with_peer("127.0.0.1:9".parse().unwrap())
            .with_task("ps:1")
            .with_os_error(starwire::OsError::from_raw_os_error(104));
        let r = boundary!({ Err(Failure::from(e)) });
        assert_eq!(r, SW_ERR_CONNECTION_LOST);
        let task = LAST_ERROR.with(|e| e.borrow().task.to_string_lossy().into_owned());
        assert_eq!((task.as_str(), sw_last_error_os_error()), ("ps:1", 104));
        assert_eq!(
            last_message(),
            "connection to ps:1 (127.0.0.1:9) lost: connection reset by peer"
        );
        // Recorded again by an outer call: kept.
        let again = boundary!({ Err(Failure::again(SW_ERR_CONNECTION_LOST)) });
        assert_eq!(
            (again, sw_last_error_os_error()),
            (SW_ERR_CONNECTION_LOST, 104)
        );
        // Another failure: gone.
        boundary!({ Err(Failure::null("out")) });
        let task = LAST_ERROR.with(|e| e.borrow().task.to_string_lossy().into_owned());
        assert_eq!((task.as_str(), sw_last_error_os_error()), ("", 0));
    }

    #[test]
    fn a_failure_is_recorded_with_its_code() {
        let r = boundary!({ Err(Failure::null("out")) });
        assert_eq!(r, SW_ERR_NULL);
        assert_eq!(last_message(), "out is NULL");
        assert_eq!(sw_last_error_status(), 0);
    }
}
