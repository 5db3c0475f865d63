"""starwire's exceptions: one class per result code of the C ABI, under `StarwireError`.

Each also derives from the built-in exception a Python caller would catch for it
(`ValueError`, `TimeoutError`, `ConnectionError`, `OSError`), so that generic handlers
keep working.
"""

from __future__ import annotations

import os
from typing import Any, Optional, Sequence

from . import _lib

# Wire status codes (docs/wire-format.md): what a peer answers per item or per request.
OK = 0
NOT_FOUND = 1
ABORTED = 2
CANCELLED = 3
DEADLINE_EXCEEDED = 4
SHUTDOWN = 5
RESOURCE_EXHAUSTED = 6
INVALID_ARGUMENT = 7
INTERNAL = 8
UNIMPLEMENTED = 9
UNAVAILABLE = 10
PROTOCOL = 11

STATUS_NAMES = {
    0: "OK", 1: "NOT_FOUND", 2: "ABORTED", 3: "CANCELLED", 4: "DEADLINE_EXCEEDED",
    5: "SHUTDOWN", 6: "RESOURCE_EXHAUSTED", 7: "INVALID_ARGUMENT", 8: "INTERNAL",
    9: "UNIMPLEMENTED", 10: "UNAVAILABLE", 11: "PROTOCOL", 12: "VERSION_MISMATCH",
    13: "CLUSTER_MISMATCH", 14: "UNAUTHENTICATED", 15: "TASK_REJECTED",
}


def status_name(status: int) -> str:
    """The name of a wire status code (``"NOT_FOUND"``), or ``"STATUS_<n>"``."""
    return STATUS_NAMES.get(status, f"STATUS_{status}")


class StarwireError(Exception):
    """A starwire call failed. `code` is the C ABI's result code (``sw_result``).

    For a request's failure, `task` is the peer's task name (``"ps:1"``) where it is known
    (the request named the peer by task, or a handshake with it did), and `errno` and
    `strerror` are the operating system's reason where there is one: why the last connect
    attempt failed (`ConnectFailed`, or a `Timeout` while the connection was still being
    retried), or the socket error that lost a connection (`ConnectionLost`). They are None
    otherwise. ``str(e)`` is the message, which says all of it::

        could not connect to ps:1 (10.0.0.2:5555) after 9 attempts over 2.6 s: connection refused
    """

    code: int = 0
    #: For the failure of a sharded step's part: the step's `StepReport` (the other parts'
    #: rows were written). None otherwise.
    report: Any = None
    #: For the failure of a `Pipeline` call that found pushes which failed after their
    #: call had returned: those pushes (`starwire.PushFailure`), in the order found; the
    #: exception is the first one's kind. Empty otherwise.
    failed_pushes: Sequence[Any] = ()
    task: Optional[str]
    errno: Optional[int]
    strerror: Optional[str]

    def __init__(self, message: str, code: Optional[int] = None, *,
                 task: Optional[str] = None, errno: Optional[int] = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.task = task
        # On the exceptions that are also OSErrors these are OSError's own fields.
        self.errno = errno
        self.strerror = os.strerror(errno) if errno else None

    def __str__(self) -> str:
        # The message, also where OSError would say "[Errno 111] Connection refused".
        return self.message


class InvalidArgument(StarwireError, ValueError):
    """An argument is not valid, as the client checks it: a NULL, an array of the wrong
    dtype or shape for the call, an array that is not C-contiguous, an unknown table kind,
    an address that does not parse. Raised before anything is sent. (A table the PS does
    not serve, or rows of another dtype or shape than its table's, is refused by the PS:
    `RemoteError`, with its reason.)"""

    code = 2


class ConfigError(StarwireError, ValueError):
    """A setting is malformed or out of range; the message names it."""

    code = 3


class IoError(StarwireError, OSError):
    """An operating-system error (listening, starting the loops)."""

    code = 4


class Timeout(StarwireError, TimeoutError):
    """The request's deadline passed before its answer arrived. When the connection to the
    peer was still being made, the message says so and `errno` is why the last attempt
    before the deadline failed (None when none had failed yet)."""

    code = 5


class ConnectionLost(StarwireError, ConnectionError):
    """The connection carrying the request was lost before its answer arrived."""

    code = 6


class ConnectFailed(StarwireError, ConnectionError):
    """No connection to the peer could be made (nothing listening, unreachable): every
    attempt of the connect-retry schedule failed (see `starwire.Client`). `errno` is why
    the last attempt failed (``errno.ECONNREFUSED``: nothing listens at the address;
    ``errno.ETIMEDOUT``: the peer did not answer within the handshake timeout)."""

    code = 7


class RemoteError(StarwireError):
    """The peer answered with an error status. `status` is the wire status
    (`UNIMPLEMENTED`, `NOT_FOUND`, ...), `remote_message` what the peer said (may be
    empty)."""

    code = 9

    def __init__(self, message: str, status: int = INTERNAL, remote_message: str = "",
                 code: Optional[int] = None, *, task: Optional[str] = None,
                 errno: Optional[int] = None) -> None:
        super().__init__(message, code, task=task, errno=errno)
        self.status = status
        self.remote_message = remote_message

    @property
    def status_name(self) -> str:
        """The name of `status` (``"NOT_FOUND"``)."""
        return status_name(self.status)


class Refused(RemoteError, ConnectionError):
    """The peer refused the handshake (another cluster, a wrong token, another version);
    `status` and `remote_message` say why."""

    code = 8


class ProtocolError(StarwireError):
    """The peer broke the protocol; its connection was closed."""

    code = 10


class Backpressure(StarwireError):
    """Too many requests in flight on this client: the request was not sent."""

    code = 11


class Shutdown(StarwireError):
    """The runtime is shutting down."""

    code = 12


class InternalError(StarwireError):
    """starwire panicked inside the call (a bug); the call had no effect."""

    code = 13


class AlreadyPublished(StarwireError):
    """The rendezvous key is already published and not yet received."""

    code = 14


class CheckpointError(StarwireError):
    """A table checkpoint could not be read or written; the message names the file and
    what is wrong. Each kind is a subclass."""


class CheckpointIoError(CheckpointError, OSError):
    """A system call failed reading or writing the checkpoint (a file that is not there
    fails opening it)."""

    code = 15


class NotACheckpoint(CheckpointError, ValueError):
    """The file is not a table checkpoint."""

    code = 16


class CheckpointVersionError(CheckpointError):
    """The checkpoint's format version is not one this build reads."""

    code = 17


class CheckpointTruncated(CheckpointError):
    """The checkpoint ends early."""

    code = 18


class CheckpointCorrupted(CheckpointError):
    """A checksum or a count of the checkpoint does not match: the file was damaged."""

    code = 19


class CheckpointShapeError(CheckpointError, ValueError):
    """The checkpoint holds rows of another shape (table id, dim, stored format, optimizer
    state) than the table's settings."""

    code = 20


class CheckpointTableError(CheckpointError):
    """The checkpoint's table could not be built, or refused its rows (a row cap below
    the file's rows)."""

    code = 21


class TableFull(StarwireError):
    """The table refused new rows: at its row cap, or out of memory."""

    code = 22


class Closed(StarwireError):
    """The runtime, client or sharded table was closed; it cannot be used any more."""

    code = 12


_BY_CODE: dict[int, type[StarwireError]] = {
    1: InvalidArgument, 2: InvalidArgument, 3: ConfigError, 4: IoError, 5: Timeout,
    6: ConnectionLost, 7: ConnectFailed, 8: Refused, 9: RemoteError, 10: ProtocolError,
    11: Backpressure, 12: Shutdown, 13: InternalError, 14: AlreadyPublished,
    15: CheckpointIoError, 16: NotACheckpoint, 17: CheckpointVersionError,
    18: CheckpointTruncated, 19: CheckpointCorrupted, 20: CheckpointShapeError,
    21: CheckpointTableError, 22: TableFull,
}


def from_code(code: int) -> StarwireError:
    """The exception for result `code` of the call that just failed on this thread, with
    the library's message (and the peer's status and message, for a remote error; the
    peer's task and the operating system's reason, for a request's failure)."""
    message = (_lib.last_error() or b"").decode("utf-8", "replace")
    task = (_lib.last_error_task() or b"").decode("utf-8", "replace") or None
    errno = int(_lib.last_error_os_error()) or None
    cls = _BY_CODE.get(code, StarwireError)
    if issubclass(cls, RemoteError):
        status = int(_lib.last_error_status())
        remote = (_lib.last_error_remote() or b"").decode("utf-8", "replace")
        return cls(message, status, remote, code=code, task=task, errno=errno)
    return cls(message, code=code, task=task, errno=errno)


def check(code: int) -> None:
    """Raises the exception of a failed call's result `code`; nothing for 0 (``SW_OK``)."""
    if code:
        raise from_code(code)


def remote_status(what: str, status: int) -> RemoteError:
    """The error of an item or table the peer answered with non-OK `status`."""
    return RemoteError(f"{what}: the peer answered {status_name(status)} ({status})", status)
