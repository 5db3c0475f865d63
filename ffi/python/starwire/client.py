"""Clients: requests to peers, blocking or submitted and waited for later, and the sharded
rows client."""

from __future__ import annotations

import ctypes as C
import json
import math
import threading
import warnings
from dataclasses import dataclass, field
from typing import (Any, Callable, Generic, Iterable, Mapping, NamedTuple, Optional, Protocol,
                    Sequence, TypeVar, Union)

import numpy as np
import numpy.typing as npt

from . import _lib
from ._arrays import (WIRE_NAME_OF, HookArrays, Lender, _addressof, _from_buffer, address,
                      code_of, contiguous, loss_scale_value, received, wire_code)
from ._ids import _held_versions, _id, _row_ids, _row_shape
from .errors import (NOT_FOUND, OK, Closed, InvalidArgument, StarwireError, check, from_code,
                     remote_status)

T = TypeVar("T")
Key = Union[str, bytes]

#: The default deadline of a request, in seconds.
DEFAULT_TIMEOUT = 5.0

# The arrays of embedded clients freed by a thread other than their own: the library keeps
# such a client (only its thread may run its loop), which may still write into them.
_LEAKED: list[Any] = []


class _Runtime(Protocol):
    """What a client uses of the `Runtime` that made it (`Client.runtime`): its loops, the
    arrays it lends and receives into, and its peers by task name. (The runtime module
    imports this one to make clients, so this one names the runtime by what it uses.)"""

    @property
    def job(self) -> str: ...

    @property
    def task_index(self) -> int: ...

    @property
    def _rt(self) -> C.c_void_p: ...

    @property
    def _hooks(self) -> Optional[HookArrays]: ...

    @property
    def _lender(self) -> Lender: ...

    def _handle(self) -> C.c_void_p: ...

    def _peer(self, target: str) -> bytes: ...

    def peer(self, target: str) -> str: ...

    def peers(self, job: str) -> list[str]: ...


def _ms(timeout: Optional[float]) -> int:
    """A deadline in whole milliseconds for the C ABI (0: none)."""
    if timeout == DEFAULT_TIMEOUT:
        return 5000
    if timeout is None:
        return 0
    if not timeout > 0:
        raise InvalidArgument(f"timeout {timeout!r} is not a positive number of seconds "
                              "(None: no deadline)")
    return max(1, math.ceil(timeout * 1000))


def _key(k: Key) -> bytes:
    return k.encode() if isinstance(k, str) else bytes(k)


class Pending(Generic[T]):
    """A request submitted and not yet waited for: `done` says (without waiting) whether
    it completed, `wait` gives its result (or raises its error). Take every pending's
    result: the arrays it reads or writes stay referenced until then."""

    __slots__ = ("_client", "tag", "_finish", "_taken")

    def __init__(self, client: Client, tag: int, finish: Callable[[int], T],
                 keep: Any = None) -> None:
        self._client = client
        self.tag = tag
        self._finish = finish
        self._taken = False
        if keep is not None:
            # Kept by the client, not by this object: dropping a pending without waiting
            # must not free memory starwire writes into.
            client._inflight[tag] = keep

    def done(self) -> bool:
        """Whether the request completed (its `wait` then returns at once)."""
        if self._taken:
            return True
        return self._client._is_ready(self.tag)

    def wait(self) -> T:
        """Waits for the request (releasing the GIL) and gives its result."""
        if self._taken:
            raise InvalidArgument(f"request {self.tag} was already waited for")
        self._taken = True
        try:
            reply = self._client._wait_reply(self.tag)
        finally:
            # Once the wait returned (whatever it returned), starwire no longer touches
            # the request's arrays.
            self._client._inflight.pop(self.tag, None)
        return self._finish(reply)

    def __repr__(self) -> str:
        state = "taken" if self._taken else "pending"
        return f"<starwire.Pending {self.tag:#x} {state}>"


@dataclass
class StepReport:
    """What a sharded step did: distinct ids sent, rows the PS tasks did not have (left
    zero), and per PS task (in the order given) None or why its part failed."""

    unique: int
    missing: int
    parts: list[Optional[StarwireError]] = field(default_factory=list)
    #: PS parts of a pull whose rows came back in the table's dtype although another wire
    #: dtype was set: that PS did not announce ``row_formats`` (an earlier release, or
    #: ``STARWIRE_WIRE_FEATURES=none``). The rows are right all the same.
    fallbacks: int = 0

    @property
    def ok(self) -> bool:
        """Whether every PS part succeeded."""
        return all(p is None for p in self.parts)


class VersionedRows(NamedTuple):
    """What `Client.pull_rows_versioned` returns: `rows` (``[len(ids), *row_shape]``, the
    caller's rows with the rows that were sent written in), `versions` (uint64, per id the
    row's version as the PS has it; 0 unknown), `unchanged` (bool, per id whether the row
    came unchanged: its bytes did not travel), `missing` (uint32, the positions of the ids
    the PS has no row for, increasing) and `changed` (the rows written)."""

    rows: npt.NDArray[Any]
    versions: npt.NDArray[np.uint64]
    unchanged: npt.NDArray[np.bool_]
    missing: npt.NDArray[np.uint32]
    changed: int


class Client:
    """A thread's way to submit requests (make one per thread with `Runtime.client`).

    Every request exists in two forms: blocking (`pull_rows`) and submitted
    (`submit_pull_rows`, which returns a `Pending` at once, for overlapping communication
    with compute; `wait_any` waits for the first of several). Waiting releases the GIL.
    Peers are task names or addresses (see `Runtime`); `timeout` is in seconds (default
    `DEFAULT_TIMEOUT`, 5 s; None: no deadline).

    A peer that cannot be reached: a request to it makes a connect attempt, and after a
    failed one (refused, no route to host) another, ``STARWIRE_CONNECT_RETRIES`` times
    (default 8), retry n (from 0) after ``STARWIRE_CONNECT_BACKOFF_MS`` (default 10)
    doubled n times, at most 2 s: 10, 20, 40, ... 1280 ms, 2.55 s in all with the
    defaults. An attempt the peer does not answer at all is given up after
    ``STARWIRE_HANDSHAKE_TIMEOUT_MS`` (default 5000), without more retries. So with
    ``timeout=None`` it raises `ConnectFailed` after about 2.55 s when nothing listens at
    the peer's address, 5 s when its host does not answer, and within 47.55 s in any case
    (2.55 s plus 5 s for each of the 9 attempts). The exception says where, how often, for
    how long and why (``could not connect to ps:1 (10.0.0.2:5555) after 9 attempts over
    2.6 s: connection refused``; ``e.task``, ``e.errno``). A `timeout` cuts this short:
    `Timeout`, saying it was still connecting and why the last attempt failed
    (``deadline exceeded while connecting to ps:1 (10.0.0.2:5555): connection refused
    (attempt 3)``). A peer given by task name is named so in errors; one given by address,
    once a handshake with it named it.
    """

    def __init__(self, runtime: _Runtime, capacity: int = 64, *,
                 embedded: Optional[Mapping[str, str]] = None) -> None:
        self.runtime = runtime
        self._c = C.c_void_p()
        # An embedded client's thread: the only one that may use it.
        self._owner: Optional[threading.Thread] = (
            None if embedded is None else threading.current_thread())
        self._ready: set[int] = set()
        # Arrays of requests not yet waited for (rows pulls write into theirs), by tag.
        self._inflight: dict[int, Any] = {}
        self._tag = C.c_uint64()
        self._tag_ref = C.byref(self._tag)
        self._reply = C.c_void_p()
        self._reply_ref = C.byref(self._reply)
        self._flag = C.c_bool()
        self._missing_count = C.c_size_t()
        # A rows request's table and row shape, filled per call (no allocation).
        self._rows = _lib.Rows()
        self._rows_ref = C.byref(self._rows)
        self._dims = (C.c_uint64 * 7)()
        self._rows.row_dims = C.addressof(self._dims)
        self._missing = (C.c_uint32 * 0)()
        # Blocking rows pulls checked once per kind of call (peer, table, row shape, dtype,
        # timeout, and the shapes of ids and out): see `pull_rows`.
        self._plans: dict[Any, _PullPlan] = {}
        self._count_ref = C.byref(self._missing_count)
        if embedded is not None:
            names = [k.encode() for k in embedded]
            values = [v.encode() for v in embedded.values()]
            c_names = (C.c_char_p * max(len(names), 1))(*names)
            c_values = (C.c_char_p * max(len(values), 1))(*values)
            check(_lib.client_new_embedded(runtime._handle(), c_names, c_values, len(names),
                                           C.byref(self._c)))
            return
        if capacity < 1:
            raise InvalidArgument(f"capacity {capacity} is not at least 1")
        check(_lib.client_new(runtime._handle(), capacity, C.byref(self._c)))

    def loop_stats(self) -> _lib.Stats:
        """A snapshot of an embedded client's own loop's counters (`Stats`), which
        `Runtime.stats` does not include; `InvalidArgument` for a client of the runtime's
        loops, whose requests `Runtime.stats` counts."""
        s = _lib.Stats()
        check(_lib.client_loop_stats(self._handle(), C.byref(s)))
        return s

    @property
    def embedded(self) -> bool:
        """Whether this client runs its own event loop on the thread that made it
        (`Runtime.embedded_client`)."""
        return self._owner is not None

    # ----- plumbing -----

    def _handle(self) -> C.c_void_p:
        if not self._c:
            raise Closed("the client is closed")
        if not self.runtime._rt:
            raise Closed(f"the runtime of {self.runtime.job}:{self.runtime.task_index} is "
                         "closed")
        return self._c

    def _submitted(self, code: int) -> int:
        check(code)
        return int(self._tag.value)

    def _wait_reply(self, tag: int) -> int:
        self._ready.discard(tag)
        code = _lib.client_wait(self._handle(), tag, C.byref(self._reply))
        if code:
            raise from_code(code)
        return int(self._reply.value or 0)

    def _is_ready(self, tag: int) -> bool:
        if tag in self._ready:
            return True
        c = self._handle()
        while True:
            check(_lib.client_poll(c, C.byref(self._tag), C.byref(self._flag)))
            if not self._flag.value:
                return False
            self._ready.add(int(self._tag.value))
            if self._tag.value == tag:
                return True

    def wait_any(self, pending: Iterable[Pending[Any]]) -> Pending[Any]:
        """Waits until one of `pending` completed and returns it (its `wait` then returns
        at once). Completions of this client's other requests are kept for their own
        wait."""
        by_tag = {p.tag: p for p in pending if not p._taken}
        if not by_tag:
            raise InvalidArgument("wait_any of no pending request")
        for tag in by_tag:
            if tag in self._ready or self._is_ready(tag):
                return by_tag[tag]
        c = self._handle()
        while True:
            check(_lib.client_wait_any(c, C.byref(self._tag)))
            tag = int(self._tag.value)
            self._ready.add(tag)
            if tag in by_tag:
                return by_tag[tag]

    def _tensors(self, reply: int, what: str, missing_ok: bool) -> list[Any]:
        hooks = self.runtime._hooks
        try:
            out: list[Any] = []
            for i in range(_lib.reply_count(reply)):
                status = _lib.reply_status(reply, i)
                if status == OK:
                    out.append(received(_lib.reply_take_tensor(reply, i), hooks))
                elif status == NOT_FOUND and missing_ok:
                    out.append(None)
                else:
                    raise remote_status(f"{what} item {i}", status)
            return out
        finally:
            _lib.reply_free(reply)

    def _statuses(self, reply: int) -> list[int]:
        try:
            return [_lib.reply_status(reply, i) for i in range(_lib.reply_count(reply))]
        finally:
            _lib.reply_free(reply)

    # ----- ping -----

    def submit_ping(self, peer: str, payload: int = 32,
                    timeout: Optional[float] = DEFAULT_TIMEOUT) -> Pending[float]:
        """`ping`, submitted."""
        tag = self._submitted(_lib.client_ping(self._handle(), self.runtime._peer(peer),
                                               payload, _ms(timeout), C.byref(self._tag)))
        return Pending(self, tag, _rtt)

    def ping(self, peer: str, payload: int = 32,
             timeout: Optional[float] = DEFAULT_TIMEOUT) -> float:
        """The round-trip time to `peer`, in microseconds, with `payload` bytes each way."""
        return self.submit_ping(peer, payload, timeout).wait()

    # ----- per-tensor pull and push -----

    def submit_pull(self, peer: str, ids: Sequence[int],
                    timeout: Optional[float] = DEFAULT_TIMEOUT
                    ) -> Pending[list[Optional[npt.NDArray[Any]]]]:
        """`pull`, submitted."""
        id_arr = _row_ids(ids)
        tag = self._submitted(_lib.client_pull(self._handle(), self.runtime._peer(peer),
                                               address(id_arr), len(id_arr), _ms(timeout),
                                               C.byref(self._tag)))
        return Pending(self, tag, lambda r: self._tensors(r, "pull", True))

    def pull(self, peer: str, ids: Sequence[int],
             timeout: Optional[float] = DEFAULT_TIMEOUT) -> list[Optional[npt.NDArray[Any]]]:
        """Variables `ids` from `peer`: per id, a numpy array over the memory its payload
        was received into (no copy), or None when the peer has no such variable. Another
        failed item raises `RemoteError`."""
        return self.submit_pull(peer, ids, timeout).wait()

    def submit_push(self, peer: str, items: Sequence[tuple[int, npt.NDArray[Any]]],
                    timeout: Optional[float] = DEFAULT_TIMEOUT) -> Pending[list[int]]:
        """`push`, submitted. The arrays must not change until it completes."""
        c, addr = self._handle(), self.runtime._peer(peer)
        if not items:
            raise InvalidArgument("push of no items")
        lender = self.runtime._lender
        handles: list[tuple[int, npt.NDArray[Any]]] = []
        try:
            ids = np.array([_id(i, f"items[{n}]'s id") for n, (i, _) in enumerate(items)],
                           dtype=np.uint64)
            for i, (_, a) in enumerate(items):
                handles.append((lender.wrap(a, f"items[{i}]"), a))
            ptrs = (C.c_void_p * len(handles))(*[h for h, _ in handles])
            tag = self._submitted(_lib.client_push(c, addr, address(ids), ptrs, len(ids),
                                                   _ms(timeout), C.byref(self._tag)))
        finally:
            lender.give_back(handles)
        return Pending(self, tag, self._statuses)

    def push(self, peer: str, items: Sequence[tuple[int, npt.NDArray[Any]]],
             timeout: Optional[float] = DEFAULT_TIMEOUT) -> list[int]:
        """Pushes `(id, array)` pairs to `peer`; returns the service's wire status per item
        (0 ``OK``). Each array is sent from its own memory (no copy): it must be
        C-contiguous, of a dtype starwire carries."""
        return self.submit_push(peer, items, timeout).wait()

    # ----- rendezvous -----

    def submit_recv(self, peer: str, step: int, key: Key,
                    timeout: Optional[float] = DEFAULT_TIMEOUT
                    ) -> Pending[npt.NDArray[Any]]:
        """`recv`, submitted."""
        k = _key(key)
        tag = self._submitted(_lib.client_recv(self._handle(), self.runtime._peer(peer),
                                               step, k, len(k), _ms(timeout),
                                               C.byref(self._tag)))
        return Pending(self, tag, lambda r: self._tensors(r, f"recv of {key!r}", False)[0])

    def recv(self, peer: str, step: int, key: Key,
             timeout: Optional[float] = DEFAULT_TIMEOUT) -> npt.NDArray[Any]:
        """The tensor `peer` publishes under `key` (waiting until it does), as a numpy array
        over the memory it was received into."""
        return self.submit_recv(peer, step, key, timeout).wait()

    def submit_recv_many(self, peer: str, step: int, keys: Sequence[Key],
                         timeout: Optional[float] = DEFAULT_TIMEOUT
                         ) -> Pending[list[npt.NDArray[Any]]]:
        """`recv_many`, submitted."""
        raw = [_key(k) for k in keys]
        if not raw:
            raise InvalidArgument("recv_many of no keys")
        ks = (C.c_char_p * len(raw))(*raw)
        lens = (C.c_size_t * len(raw))(*[len(k) for k in raw])
        tag = self._submitted(_lib.client_recv_many(
            self._handle(), self.runtime._peer(peer), step, ks, lens, len(raw), _ms(timeout),
            C.byref(self._tag)))
        return Pending(self, tag, lambda r: self._tensors(r, "recv_many", False))

    def recv_many(self, peer: str, step: int, keys: Sequence[Key],
                  timeout: Optional[float] = DEFAULT_TIMEOUT) -> list[npt.NDArray[Any]]:
        """The tensors `peer` publishes under `keys`, in one round trip (one fused frame);
        each is sent as soon as it is published."""
        return self.submit_recv_many(peer, step, keys, timeout).wait()

    # ----- rows -----

    def _fill_rows(self, table: int, ids: npt.NDArray[np.uint64], code: int,
                   row_shape: tuple[int, ...], data: npt.NDArray[Any]) -> Any:
        """The client's `sw_rows` for one table (a reference to it), filled."""
        rows, dims = self._rows, self._dims
        for i, d in enumerate(row_shape):
            dims[i] = d
        rows.table, rows.dtype, rows.rank = table, code, len(row_shape)
        rows.ids, rows.n = address(ids), len(ids)
        rows.data, rows.byte_len = address(data), data.nbytes
        return self._rows_ref

    def _pull_rows_args(self, ids: Any, row_shape: Union[int, Sequence[int]], dtype: Any,
                        out: Optional[npt.NDArray[Any]]
                        ) -> tuple[npt.NDArray[np.uint64], int, npt.NDArray[Any]]:
        id_arr = _row_ids(ids)
        shape = (len(id_arr), *_row_shape(row_shape))
        dt = dtype if isinstance(dtype, np.dtype) else np.dtype(dtype)
        code = code_of(dt, "the rows")
        if out is None:
            return id_arr, code, np.empty(shape, dtype=dt)
        if not isinstance(out, np.ndarray) or not out.flags.c_contiguous:
            contiguous(out, "out")
        if out.dtype != dt or out.shape != shape:
            raise InvalidArgument(f"out is {out.dtype}{list(out.shape)}, not "
                                  f"{dt}{list(shape)}")
        if not out.flags.writeable:
            raise InvalidArgument("out is read-only")
        return id_arr, code, out

    def submit_pull_rows(self, peer: str, table: int, ids: Any,
                         row_shape: Union[int, Sequence[int]], dtype: Any = np.float32,
                         out: Optional[npt.NDArray[Any]] = None,
                         timeout: Optional[float] = DEFAULT_TIMEOUT
                         ) -> Pending[tuple[npt.NDArray[Any], npt.NDArray[np.uint32]]]:
        """`pull_rows`, submitted: `out` (and `ids`) must not be touched until it is
        waited for."""
        c, addr = self._handle(), self.runtime._peer(peer)
        id_arr, code, target = self._pull_rows_args(ids, row_shape, dtype, out)
        rows = self._fill_rows(table, id_arr, code, target.shape[1:], target)
        tag = self._submitted(_lib.client_pull_rows(c, addr, rows, 1, _ms(timeout),
                                                    C.byref(self._tag)))
        return Pending(self, tag, lambda r: self._rows_pulled(r, table, target),
                       keep=(id_arr, target))

    def _rows_pulled(self, reply: int, table: int, out: npt.NDArray[Any]
                     ) -> tuple[npt.NDArray[Any], npt.NDArray[np.uint32]]:
        try:
            status = _lib.reply_status(reply, 0)
            if status != OK:
                raise remote_status(f"table {table}", status)
            n = len(out)
            if len(self._missing) < n:
                self._missing = (C.c_uint32 * max(n, 2 * len(self._missing)))()
            check(_lib.reply_missing(reply, 0, self._missing, len(self._missing),
                                     C.byref(self._missing_count)))
        finally:
            _lib.reply_free(reply)
        count = self._missing_count.value
        if count == 0:
            return out, _NO_ROWS
        return out, np.frombuffer(memoryview(self._missing), dtype=np.uint32,
                                  count=count).copy()

    def pull_rows(self, peer: str, table: int, ids: Any, row_shape: Union[int, Sequence[int]],
                  dtype: Any = np.float32, out: Optional[npt.NDArray[Any]] = None,
                  timeout: Optional[float] = DEFAULT_TIMEOUT
                  ) -> tuple[npt.NDArray[Any], npt.NDArray[np.uint32]]:
        """Rows `ids` of `table` at `peer`, each of `dtype` and shape `row_shape` (an int
        for ``(dim,)``): returns ``(rows, missing)``, `rows` an array
        ``[len(ids), *row_shape]`` and `missing` the positions (increasing) of the ids the
        PS has no row for (their rows are zero).

        The block is received straight into `rows`' memory (no copy above the small-frame
        size); with `out` (a C-contiguous, writable array of that dtype and shape), that is
        `out`, which is returned. `ids` (uint64, 1-D) is used as it is when it is a
        C-contiguous uint64 array. A table the PS does not serve, or of another dtype or
        shape, raises `RemoteError` (``NOT_FOUND``, ``INVALID_ARGUMENT``) with the PS's
        reason in ``remote_message``.

        One foreign call (``sw_client_pull_rows_wait``, which submits, waits with the GIL
        released, and reports the missing rows). The arguments are checked in full the first
        time a kind of call is made (peer, table, row shape, dtype, timeout, and the shapes
        of `ids` and `out`); later calls of that kind check only what can differ between
        arrays of those shapes (type, dtype, layout, writability)."""
        try:
            plan = self._plans[(peer, table, row_shape, dtype, timeout, ids.shape,
                                None if out is None else out.shape)]
            if out is None:
                out = np.empty(plan.shape, plan.dtype)
            if (type(ids) is not _ndarray or type(out) is not _ndarray
                    or ids.dtype is not _U64 or out.dtype is not plan.dtype):
                raise _Unplanned
            rows = plan.rows
            # The buffer protocol refuses arrays that are not C-contiguous (and, for `out`,
            # read-only ones): those take the checked path below.
            rows.ids = _addressof(_from_buffer(ids))  # type: ignore[arg-type]
            rows.data = _addressof(_from_buffer(out))  # type: ignore[arg-type]
        except (KeyError, AttributeError, TypeError, ValueError, BufferError, _Unplanned):
            ids, out, plan = self._plan_pull(peer, table, ids, row_shape, dtype, out, timeout)
        code = _pull_rows_wait(self._c, plan.peer, plan.rows_ref, plan.ms, plan.missing,
                               self._count_ref)
        if code:
            self._handle()  # Closed, when the client or its runtime is
            raise from_code(code)
        count = self._missing_count.value
        if count == 0:
                return out, _NO_ROWS
        return out, np.frombuffer(memoryview(plan.missing), dtype=np.uint32,
                                  count=count).copy()

    def _plan_pull(self, peer: str, table: int, ids: Any, row_shape: Union[int, Sequence[int]],
                   dtype: Any, out: Optional[npt.NDArray[Any]], timeout: Optional[float]
                   ) -> tuple[npt.NDArray[np.uint64], npt.NDArray[Any], _PullPlan]:
        """`pull_rows`' arguments checked in full (the array to receive into made when `out`
        is None) and the plan of the call, kept for later calls of its kind when they can
        be told apart."""
        self._handle()
        addr = self.runtime._peer(peer)
        ms = _ms(timeout)
        id_arr, code, target = self._pull_rows_args(ids, row_shape, dtype, out)
        if len(id_arr) == 0:
            raise InvalidArgument("pull_rows of no ids")
        key: Any = (peer, table, row_shape, dtype, timeout, id_arr.shape,
                    None if out is None else target.shape)
        try:
            hash(key)
        except TypeError:  # a row shape given as a list
            key = None
        if len(self._missing) < len(target):
            # Grown for all plans to come; earlier plans keep the smaller one they fit.
            self._missing = (C.c_uint32 * max(len(target), 2 * len(self._missing)))()
        plan = _PullPlan(addr, table, code, target, ms, self._missing)
        plan.rows.ids, plan.rows.data = address(id_arr), address(target)
        if key is not None and id_arr is ids:
            if len(self._plans) >= _PLANS_KEPT:
                self._plans.clear()
            self._plans[key] = plan
        return id_arr, target, plan

    def pull_rows_versioned(self, peer: str, table: int, ids: Any, held: Any,
                            row_shape: Union[int, Sequence[int]], dtype: Any = np.float32,
                            out: Optional[npt.NDArray[Any]] = None,
                            timeout: Optional[float] = DEFAULT_TIMEOUT) -> VersionedRows:
        """`pull_rows` for a caller that holds some of the rows already (a cache of rows):
        `held` has per id the version of the row the caller holds in `out` (row `i` for
        ``ids[i]``), or 0 for none, and only the rows whose version is not the one held are
        sent. Returns a `VersionedRows`: `rows` is `out` with the rows sent written at their
        positions and the others left as they were, `versions` each row's current version
        (the held one for the rows that came unchanged; 0 for a missing row and for every
        row from a PS or table that keeps or speaks no versions: hold those as 0, so the
        next pull asks again), `unchanged` which rows came unchanged, `missing` as for
        `pull_rows`, `changed` how many rows were written.

        `out` (C-contiguous, writable, of `dtype` and shape ``[len(ids), *row_shape]``) is
        the caller's copy of the rows; it may be None only when nothing is held (every
        entry of `held` 0), and is then a new array. A PS that did not announce
        ``row_versions`` (an earlier release, or ``STARWIRE_WIRE_FEATURES`` without it)
        sends every row, with version 0. Raises as `pull_rows` does, and `InvalidArgument`
        for `held` of another length or not of integers 0 to 2^64-1. One foreign call
        (``sw_client_pull_rows_versioned_wait``), waiting with the GIL released."""
        c, addr = self._handle(), self.runtime._peer(peer)
        ms = _ms(timeout)
        id_arr = _row_ids(ids)
        versions_held = _held_versions(held, len(id_arr))
        if out is None and versions_held.any():
            raise InvalidArgument("out is None but held names versions: the rows held are "
                                  "read from out (pass the array they are in)")
        id_arr, code, target = self._pull_rows_args(id_arr, row_shape, dtype, out)
        if out is None:
            target.fill(0)
        n = len(id_arr)
        versions = np.empty(n, dtype=np.uint64)
        unchanged = np.empty(n, dtype=np.bool_)
        missing = np.empty(n, dtype=np.uint32)
        changed, count = C.c_size_t(), C.c_size_t()
        rows = self._fill_rows(table, id_arr, code, target.shape[1:], target)
        check(_lib.client_pull_rows_versioned_wait(
            c, addr, rows, address(versions_held), ms, address(versions), address(unchanged),
            C.byref(changed), missing.ctypes.data_as(_lib.u32p), C.byref(count)))
        return VersionedRows(target, versions, unchanged, missing[:count.value].copy(),
                             int(changed.value))

    def submit_push_rows(self, peer: str, table: int, ids: Any, grads: npt.NDArray[Any],
                         timeout: Optional[float] = DEFAULT_TIMEOUT) -> Pending[None]:
        """`push_rows`, submitted. `grads` is sent from its own memory (no copy; the ids
        are copied): it must not change until the request completes. Starwire keeps the
        array referenced until it is written (the pending also holds it until waited
        for)."""
        c, addr = self._handle(), self.runtime._peer(peer)
        id_arr = _row_ids(ids)
        g = contiguous(grads, "grads")
        if g.ndim < 2 or g.shape[0] != len(id_arr):
            raise InvalidArgument(f"grads has shape {list(g.shape)}, not "
                                  f"[{len(id_arr)}, *row_shape] (one row per id)")
        code = code_of(g.dtype, "grads")
        rows = self._fill_rows(table, id_arr, code, g.shape[1:], g)
        lender = self.runtime._lender
        handles = [(lender.wrap(g, "grads"), g)]
        try:
            blocks = (C.c_void_p * 1)(handles[0][0])
            tag = self._submitted(_lib.client_push_rows_tensors(
                c, addr, rows, blocks, 1, _ms(timeout), C.byref(self._tag)))
        finally:
            # Kept by the lender until starwire no longer holds the tensor over `g`.
            lender.give_back(handles)
        return Pending(self, tag, lambda r: _rows_pushed(r, table), keep=g)

    def push_rows(self, peer: str, table: int, ids: Any, grads: npt.NDArray[Any],
                  timeout: Optional[float] = DEFAULT_TIMEOUT) -> None:
        """Pushes gradient rows `grads` (C-contiguous, ``[len(ids), *row_shape]``, of the
        table's dtype) for `ids` of `table` at `peer`, sent from the array's own memory (no
        copy; a non-contiguous array or a dtype starwire does not carry raises
        `InvalidArgument`). Raises `RemoteError` when the PS refuses them (``NOT_FOUND``:
        no such table; ``INVALID_ARGUMENT``: another dtype or shape), with its reason in
        ``remote_message``."""
        self.submit_push_rows(peer, table, ids, grads, timeout).wait()

    # ----- checkpoints -----

    def submit_checkpoint(self, peer: str, timeout: Optional[float] = None
                          ) -> Pending[dict[str, Any]]:
        """`checkpoint`, submitted."""
        tag = self._submitted(_lib.client_checkpoint(self._handle(), self.runtime._peer(peer),
                                                     _ms(timeout), C.byref(self._tag)))
        return Pending(self, tag, lambda r: _manifest(_reply_text(r)))

    def checkpoint(self, peer: str, timeout: Optional[float] = None) -> dict[str, Any]:
        """Asks `peer` to save the tables it serves (a checkpoint request, what
        ``commctl checkpoint`` sends) and returns its manifest, parsed: ``format``
        (``"starwire-checkpoint"``), ``version``, ``task``, ``dir`` (the peer's checkpoint
        directory, on its host), ``written_unix_s``, ``seconds``, and ``tables``: per
        table ``table``, ``file`` (`starwire.checkpoint_file` of the table), ``rows``,
        ``bytes``, ``seconds``, ``direct_io``. The peer writes one file per table into its
        own directory (its setting ``STARWIRE_CHECKPOINT_DIR``, `Runtime`'s
        `checkpoint_dir`), each atomically while it serves, then the manifest
        ``checkpoint.json``; `PsTable.load` reads a table back from there.

        A refusal raises `RemoteError` with the peer's words in ``remote_message``: status
        ``UNIMPLEMENTED`` for a peer without a checkpoint directory (or with nothing it can
        save), ``UNAVAILABLE`` for one already saving with two more checkpoints queued
        (retry later), ``INTERNAL`` naming each table that failed to save. Saving takes
        about a second per GB of table: `timeout` (seconds; None, the default, waits as
        long as it takes) must allow for it. One foreign call, waiting with the GIL
        released."""
        out = C.c_void_p()
        check(_lib.client_checkpoint_wait(self._handle(), self.runtime._peer(peer),
                                          _ms(timeout), C.byref(out)))
        try:
            text = C.string_at(out.value or 0).decode()
        finally:
            _lib.string_free(out)
        return _manifest(text)

    def sharded(self, table: int, row_shape: Union[int, Sequence[int]], *,
                peers: Optional[Sequence[str]] = None, job: str = "ps",
                dtype: Any = np.float32, partition: str = "mod",
                vocab: int = 0, wire_dtype: Any = None,
                loss_scale: Optional[float] = None) -> Sharded:
        """The sharded client of `table`, partitioned over `peers` (task names or
        addresses; default: every task of `job` in the cluster spec). `partition`:
        ``"mod"`` (id % tasks), ``"div"`` (contiguous ranges of ``0..vocab``) or
        ``"hash"``. `wire_dtype` and `loss_scale`: see `Sharded.set_wire_dtype` and
        `Sharded.set_loss_scale`."""
        names = list(peers) if peers is not None else self.runtime.peers(job)
        return Sharded(self, [self.runtime._peer(p).decode() for p in names], table,
                       _row_shape(row_shape), np.dtype(dtype), partition, vocab,
                       wire_dtype=wire_dtype, loss_scale=loss_scale)

    def close(self) -> None:
        """Frees the client (its rows pulls in flight are waited for first). Closing twice
        does nothing. An embedded client is closed by the thread that made it
        (`InvalidArgument` on another)."""
        if self._c and self._owner is not None and self._owner is not threading.current_thread():
            raise InvalidArgument("an embedded client is closed by the thread that made it")
        self._free()

    def _free(self) -> bool:
        """`close` from any thread; whether the client was freed. An embedded client can
        only be freed by its own thread (only that thread may run its loop, which may still
        write into the arrays of its requests in flight, and may be inside a call right
        now): on another, it is left as it is, its arrays are kept for good, and a
        `ResourceWarning` says so."""
        if not self._c:
            return True
        if self._owner is not None and self._owner is not threading.current_thread():
            _LEAKED.append((self._c, self._inflight))
            self._c = C.c_void_p()
            self._inflight = {}
            self._ready.clear()
            warnings.warn("an embedded starwire client was not closed by its own thread "
                          f"({self._owner.name}): its event loop and connections are kept "
                          "until the process ends", ResourceWarning, stacklevel=3)
            return False
        # Waits for the rows pulls in flight: their arrays are let go after it.
        _lib.client_free(self._c)
        self._c = C.c_void_p()
        self._ready.clear()
        self._inflight.clear()
        return True

    def __del__(self) -> None:
        # A client dropped without `close`: freed (or, embedded and on another thread, kept
        # with its arrays) rather than left with arrays it may still write into.
        try:
            if getattr(self, "_c", None):
                self._free()
        except Exception:  # noqa: BLE001 - nothing may escape a finalizer
            pass

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _reply_text(reply: int) -> str:
    """The text a stats or checkpoint request is answered with (its one ``uint8`` tensor),
    the reply freed."""
    try:
        t = _lib.reply_take_tensor(reply, 0)
        try:
            n = int(_lib.tensor_byte_len(t))
            return C.string_at(_lib.tensor_data(t), n).decode()
        finally:
            _lib.tensor_free(t)
    finally:
        _lib.reply_free(reply)


def _manifest(text: str) -> dict[str, Any]:
    """A checkpoint manifest, parsed and checked to be one."""
    doc = json.loads(text)
    if not isinstance(doc, dict) or doc.get("format") != "starwire-checkpoint":
        raise ValueError(f"not a starwire checkpoint manifest: {text[:80]!r}")
    return doc


def _rtt(reply: int) -> float:
    try:
        return float(_lib.reply_rtt_us(reply))
    finally:
        _lib.reply_free(reply)


def _rows_pushed(reply: int, table: int) -> None:
    try:
        status = _lib.reply_status(reply, 0)
    finally:
        _lib.reply_free(reply)
    if status != OK:
        raise remote_status(f"table {table}", status)


class _Unplanned(Exception):
    """A call that its plan does not cover (another type, dtype or layout)."""


class _PullPlan:
    """A blocking rows pull, checked: its request (table, dtype, row shape, number of ids;
    the ids and data addresses are set per call), the peer and deadline, and room for the
    missing positions (the client's buffer)."""

    __slots__ = ("peer", "ms", "dtype", "shape", "dims", "rows", "rows_ref", "missing")

    def __init__(self, peer: bytes, table: int, code: int, target: npt.NDArray[Any],
                 ms: int, missing: Any) -> None:
        # ctypes values, not Python ints and bytes: converting those costs more per call.
        self.peer, self.ms = C.c_char_p(peer), C.c_uint64(ms)
        self.dtype, self.shape = target.dtype, target.shape
        row_shape = target.shape[1:]
        self.dims = (C.c_uint64 * max(len(row_shape), 1))(*row_shape)
        self.rows = _lib.Rows(table, code, C.addressof(self.dims), len(row_shape), 0,
                              len(target), 0, target.nbytes)
        self.rows_ref = C.byref(self.rows)
        # The client's buffer (room for at least `len(target)`), shared by its plans.
        self.missing = missing


#: Plans a client keeps (all dropped when more are made: a program has a few kinds of call).
_PLANS_KEPT = 64
_ndarray = np.ndarray
_U64 = np.dtype(np.uint64)
_pull_rows_wait: Callable[..., int] = _lib.client_pull_rows_wait_unchecked

_PARTITIONS = {"mod": 0, "div": 1, "hash": 2}
_NO_ROWS: npt.NDArray[np.uint32] = np.empty(0, dtype=np.uint32)
_NO_ROWS.flags.writeable = False



def _step_outcome(code: int, r: Any, peers: int, part: Callable[[int], int]) -> StepReport:
    """The report of a sharded step that returned `code`, from the C report `r`; raises
    the first failed PS part's error (with the report attached) when the step failed, or
    the refusal when it did not run. `part(i)` is PS `i`'s outcome code."""
    report = StepReport(r.unique, r.missing, [None] * peers, r.fallbacks)
    if code == OK:
        return report
    if r.failed == 0:
        # The step did not run: an argument was refused.
        raise from_code(code)
    for i in range(peers):
        failed = part(i)
        if failed:
            report.parts[i] = from_code(failed)
    first = report.parts[r.first_failed] or from_code(code)
    first.report = report
    raise first

class Sharded:
    """One table partitioned over PS tasks, from a worker (`Client.sharded`): each step's
    ids are deduplicated, spread over the PS tasks, sent as one rows request per PS (all in
    flight at once), and the answers scattered into the caller's ``[batch, *row_shape]``
    array with duplicates filled; a push sums the gradients of duplicate ids before
    sending. All of it runs in Rust: no Python per row or per PS.

    A PS that cannot be reached fails its part alone (the exception raised names it, e.g.
    ``could not connect to ps:1 (10.0.0.2:5555) after 9 attempts over 2.6 s: connection
    refused``, with ``e.report`` the step's report: the other parts' rows are written).
    The parts are in flight at once, so dead PS tasks cost a step the time of one: with
    ``timeout=None``, the connect-retry schedule (about 2.55 s with the defaults when
    nothing listens there, within 47.55 s in any case; see `Client`), every step; the
    default `timeout` (5 s) or a shorter one bounds it.

    Rows of float32, bfloat16 or float16 may travel as any of the three (`wire_dtype`,
    `set_wire_dtype`; ``"bf16"`` halves a float32 table's bytes): the PS rounds the rows it
    sends to nearest even, and they are widened into the caller's array, which stays in
    the table's dtype; pushed gradients are summed in the table's dtype, then narrowed as
    they are sent, with the `loss_scale` they were multiplied by, which the PS divides out
    before applying them in the table's dtype. A PS that did not announce ``row_formats``
    (an earlier release, or ``STARWIRE_WIRE_FEATURES=none``) is sent and answers rows in
    the table's dtype instead: the step is served all the same, and
    ``report.fallbacks`` counts such parts of a pull."""

    def __init__(self, client: Client, addresses: list[str], table: int,
                 row_shape: tuple[int, ...], dtype: np.dtype[Any], partition: str,
                 vocab: int, *, wire_dtype: Any = None,
                 loss_scale: Optional[float] = None) -> None:
        # `addresses`: ``host:port``, or ``task@host:port`` so that errors name the task.
        if partition not in _PARTITIONS:
            raise InvalidArgument(f"partition {partition!r} is not one of "
                                  f"{sorted(_PARTITIONS)}")
        self.client, self.table = client, table
        self.peers = [a.rpartition("@")[2] for a in addresses]
        self.row_shape, self.dtype = row_shape, dtype
        code = code_of(dtype, "the rows")
        raw = [a.encode() for a in addresses]
        texts = (C.c_char_p * max(len(raw), 1))(*raw)
        dims = (C.c_uint64 * len(row_shape))(*row_shape)
        self._s = C.c_void_p()
        self._report = _lib.StepReport()
        self._report_ref = C.byref(self._report)
        check(_lib.sharded_new(texts, len(raw), _lib.Partition(_PARTITIONS[partition], vocab),
                               table, code, C.addressof(dims), len(row_shape),
                               C.byref(self._s)))
        self._loss_scale: Optional[float] = None
        try:
            if wire_dtype is not None:
                self.set_wire_dtype(wire_dtype)
            self.set_loss_scale(loss_scale)
        except BaseException:
            self.close()
            raise

    def _handle(self) -> C.c_void_p:
        if not self._s:
            raise Closed("the sharded table is closed")
        return self._s

    def set_wire_dtype(self, wire_dtype: Any) -> None:
        """Rows travel as `wire_dtype` from the next step on: ``"float32"`` (``"f32"``),
        ``"bfloat16"`` (``"bf16"``) or ``"float16"`` (``"f16"``) for rows of one of those,
        None for the table's own dtype. `InvalidArgument`, changing nothing, for another
        name or a dtype the rows do not convert into."""
        check(_lib.sharded_set_wire_dtype(self._handle(), wire_code(wire_dtype, self.dtype)))

    @property
    def wire_dtype(self) -> str:
        """The dtype rows travel as (``"float32"``, ``"bfloat16"``, ``"float16"``, or the
        table's dtype's name)."""
        code = int(_lib.sharded_wire_dtype(self._handle()))
        return WIRE_NAME_OF.get(code) or str(_lib.DTYPES[code])

    def set_loss_scale(self, loss_scale: Optional[float]) -> None:
        """Pushes from the next one on say their gradients were multiplied by `loss_scale`
        (2^-126 to 2^126; None: not scaled), which the PS divides out (multiplying by the
        float32 nearest its inverse: exact for powers of two) before applying them. For
        float32, bfloat16 and float16 rows. `InvalidArgument`, changing nothing,
        otherwise."""
        value = loss_scale_value(loss_scale)
        check(_lib.sharded_set_loss_scale(self._handle(), value))
        self._loss_scale = None if loss_scale is None else value

    @property
    def loss_scale(self) -> Optional[float]:
        """The loss scale pushes are sent with, or None."""
        return self._loss_scale

    def _finish(self, code: int) -> StepReport:
        return _step_outcome(code, self._report, len(self.peers),
                             lambda i: _lib.sharded_part(self._s, i))

    def pull(self, ids: Any, out: Optional[npt.NDArray[Any]] = None,
             timeout: Optional[float] = DEFAULT_TIMEOUT
             ) -> tuple[npt.NDArray[Any], StepReport]:
        """The rows of `ids` (duplicates allowed) in `out` (``[len(ids), *row_shape]``,
        C-contiguous and writable; a new array when None), row `i` for ``ids[i]``, and the
        step's report. Rows a PS does not have are left zero (``report.missing``). When a
        PS fails, the others' rows are still written and its error is raised with the
        report attached (``e.report``)."""
        s, c = self._handle(), self.client._handle()
        id_arr = _row_ids(ids)
        shape = (len(id_arr), *self.row_shape)
        self._report.failed = 0
        if out is None:
            out = np.zeros(shape, dtype=self.dtype)
        else:
            contiguous(out, "out")
            if out.dtype != self.dtype or out.shape != shape:
                raise InvalidArgument(f"out is {out.dtype}{list(out.shape)}, not "
                                      f"{self.dtype}{list(shape)}")
            if not out.flags.writeable:
                raise InvalidArgument("out is read-only")
        code = _lib.sharded_pull(s, c, address(id_arr), len(id_arr), address(out),
                                 out.nbytes, _ms(timeout), self._report_ref)
        return out, self._finish(code)

    def pull_unique(self, ids: Any, timeout: Optional[float] = DEFAULT_TIMEOUT
                    ) -> tuple[npt.NDArray[np.uint64], npt.NDArray[Any],
                               npt.NDArray[np.int64], StepReport]:
        """Each distinct id of `ids` (duplicates allowed) pulled once, for a caller that
        builds its batch from the distinct rows (an embedding lookup): ``(unique, rows,
        inverse, report)``, the distinct ids (grouped by PS task, each task's in the order
        first seen), their rows (``[len(unique), *row_shape]``, row `j` for ``unique[j]``)
        and, per position `i` of `ids`, the index of its id in `unique` (int64), so that
        ``rows[inverse]`` is what `pull` gives. The deduplication is the one every step
        does, in Rust. Rows a PS does not have are zero (``report.missing`` counts
        positions); a failed PS raises as for `pull`."""
        s, c = self._handle(), self.client._handle()
        id_arr = _row_ids(ids)
        n = len(id_arr)
        inverse = np.empty(n, dtype=np.int64)
        unique = np.empty(n, dtype=np.uint64)
        # Every distinct row is written (a failed PS's zeroed): no need to clear it first.
        out = np.empty((n, *self.row_shape), dtype=self.dtype)
        self._report.failed = 0
        code = _lib.sharded_pull_unique(s, c, address(id_arr), n, address(inverse),
                                        address(unique), address(out), out.nbytes,
                                        _ms(timeout), self._report_ref)
        report = self._finish(code)
        return unique[:report.unique], out[:report.unique], inverse, report

    def push(self, ids: Any, grads: npt.NDArray[Any],
             timeout: Optional[float] = DEFAULT_TIMEOUT) -> StepReport:
        """Pushes the gradient rows `grads` (``[len(ids), *row_shape]``, C-contiguous)
        of `ids`: duplicates' gradients summed, one request per PS. When a PS fails, its
        error is raised with the report attached (``e.report``)."""
        s, c = self._handle(), self.client._handle()
        id_arr = _row_ids(ids)
        g = contiguous(grads, "grads")
        shape = (len(id_arr), *self.row_shape)
        if g.dtype != self.dtype or g.shape != shape:
            raise InvalidArgument(f"grads is {g.dtype}{list(g.shape)}, not "
                                  f"{self.dtype}{list(shape)}")
        self._report.failed = 0
        code = _lib.sharded_push(s, c, address(id_arr), len(id_arr), address(g),
                                 g.nbytes, _ms(timeout), self._report_ref)
        return self._finish(code)

    def close(self) -> None:
        """Frees the sharded table. Closing twice does nothing."""
        if self._s:
            _lib.sharded_free(self._s)
            self._s = C.c_void_p()

    def __del__(self) -> None:
        if getattr(self, "_s", None):
            self.close()
