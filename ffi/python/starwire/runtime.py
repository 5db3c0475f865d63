"""The runtime: event loops, the task's rendezvous, what a PS serves, and task names."""

from __future__ import annotations

import ctypes as C
import json
import logging
import os
import threading
import weakref
from typing import (Any, Callable, Mapping, Optional, Protocol, Sequence, Union,
                    runtime_checkable)

import numpy as np
import numpy.typing as npt

from . import _lib
from ._arrays import HookArrays, Lender, code_of, view
from .client import _LEAKED, Client
from .errors import INTERNAL, NOT_FOUND, Closed, InvalidArgument, check
from .metrics import Metrics
from .ps_table import PsTable

log = logging.getLogger("starwire")

_runtime_metrics_json = _lib._sig("sw_runtime_metrics_json", _lib.R, _lib.p,
                                  C.POINTER(C.c_void_p))
_runtime_trace_json = _lib._sig("sw_runtime_trace_json", _lib.R, _lib.p,
                                C.POINTER(C.c_void_p))
_string_free = _lib._sig("sw_string_free", None, _lib.p)

Setting = Union[str, int, float, bool]

_CHECKPOINT_DIR = "STARWIRE_CHECKPOINT_DIR"


@runtime_checkable
class Service(Protocol):
    """A PS's variables, answered per tensor (`Client.pull`, `Client.push`).

    `pull` gets the ids and returns, per id, an array (copied once into the answer) or None
    (``NOT_FOUND``). `push` gets the ids and the pushed arrays (views of the received
    payload, valid during the call: copy what you keep) and returns one wire status per
    item (0 ``OK``). Both run on loop threads, holding the GIL for the call.
    """

    def pull(self, ids: list[int]) -> Sequence[Optional[npt.NDArray[Any]]]: ...

    def push(self, ids: list[int], arrays: list[npt.NDArray[Any]]) -> Sequence[int]: ...


@runtime_checkable
class RowsTable(Protocol):
    """A table of embedding rows kept in Python, served to rows requests
    (`Client.pull_rows`, `Client.push_rows`, the sharded client).

    `dtype` and `row_shape` describe one row (e.g. ``np.float32`` and ``(16,)``). `pull`
    writes the rows of `ids` (uint64, 1-D) into `out` (``[len(ids), *row_shape]``, a view
    of the answer's memory) and returns the positions of ids it has no row for (or None);
    starwire zeroes those rows. `push` applies `grads` (same layout, a view of the received
    block) to the rows of `ids`. Both run on loop threads, holding the GIL; an exception
    answers the table with ``INTERNAL`` (and is logged to the ``starwire`` logger).
    """

    @property
    def dtype(self) -> Any: ...

    @property
    def row_shape(self) -> tuple[int, ...]: ...

    def pull(self, ids: npt.NDArray[np.uint64],
             out: npt.NDArray[Any]) -> Optional[Sequence[int]]: ...

    def push(self, ids: npt.NDArray[np.uint64], grads: npt.NDArray[Any]) -> None: ...


class Allocator(Protocol):
    """Memory for received tensors, chosen by the trainer: called with a tensor's dtype and
    shape before its payload is read, on a loop thread (taking the GIL); returns a
    C-contiguous, writable array of exactly that dtype and shape to receive into, or None
    to fail that tensor (``RESOURCE_EXHAUSTED``). The tensor then arrives as that very
    array."""

    def __call__(self, dtype: np.dtype[Any],
                 shape: tuple[int, ...]) -> Optional[npt.NDArray[Any]]: ...


_INITS = {"zeros": 0, "missing": 1, "uniform": 2}
_OPTIMIZERS = {"sgd": 0, "adagrad": 1}


class MemTable:
    """starwire's small in-memory table of embedding rows (rows of `dim` float32 in
    locked shards of a hash map), served in Rust: no Python runs per request. A simple
    table kept to compare with; a PS serves a `PsTable` (faster, bounded memory,
    checkpoints, metrics).

    `init`: ``"zeros"`` (a pull of an unknown id creates its row at zero), ``"missing"``
    (a pull creates nothing and reports unknown ids missing; a push creates the row at
    zero) or ``"uniform"`` (each element uniform in ``[-scale, scale]``, a fixed function
    of id, element and `seed`). `optimizer`: ``"sgd"`` (``w -= lr * g``) or ``"adagrad"``
    (``acc += g * g; w -= lr * g / sqrt(acc)``, `acc` starting at `initial_accumulator`,
    above 0). A runtime serving the table keeps it alive on its own.
    """

    def __init__(self, dim: int, init: str = "zeros", scale: float = 0.0, seed: int = 0,
                 optimizer: str = "sgd", lr: float = 0.01,
                 initial_accumulator: float = 0.1) -> None:
        if init not in _INITS:
            raise InvalidArgument(f"init {init!r} is not one of {sorted(_INITS)}")
        if optimizer not in _OPTIMIZERS:
            raise InvalidArgument(f"optimizer {optimizer!r} is not one of "
                                  f"{sorted(_OPTIMIZERS)}")
        self.dim = int(dim)
        self.dtype = np.dtype(np.float32)
        self.row_shape = (self.dim,)
        self._t = C.c_void_p()
        check(_lib.mem_table_new(self.dim, _lib.Init(_INITS[init], scale, seed),
                                 _lib.Optimizer(_OPTIMIZERS[optimizer], lr,
                                                initial_accumulator),
                                 C.byref(self._t)))

    def _handle(self) -> int:
        if not self._t:
            raise Closed("the table was closed")
        return int(self._t.value or 0)

    def close(self) -> None:
        """Drops this handle (runtimes serving the table keep serving it)."""
        if self._t:
            _lib.table_free(self._t)
            self._t = C.c_void_p()

    def __del__(self) -> None:
        if getattr(self, "_t", None):
            self.close()


class _PyTable:
    """A `RowsTable` served through ``sw_table_new``: its callbacks, kept alive as long as
    the runtime that serves it."""

    def __init__(self, table: RowsTable) -> None:
        self.table = table
        self.dtype = np.dtype(table.dtype)
        self.row_shape = tuple(int(d) for d in table.row_shape)
        self.row_bytes = int(self.dtype.itemsize * int(np.prod(self.row_shape)))
        code = code_of(self.dtype, "the table's rows")
        self.callbacks = _lib.TableCallbacks(None, _lib.TABLE_PULL_FN(self._pull),
                                             _lib.TABLE_PUSH_FN(self._push))
        dims = (C.c_uint64 * max(len(self.row_shape), 1))(*self.row_shape)
        self.handle = C.c_void_p()
        check(_lib.table_new(code, C.addressof(dims), len(self.row_shape),
                             C.byref(self.callbacks), C.byref(self.handle)))

    def _pull(self, _user: Any, ids: int, n: int, out: int, nbytes: int, missing: int,
              n_missing: Any) -> int:
        try:
            id_arr = view(ids, 8 * n, np.dtype(np.uint64), (n,))
            rows = view(out, nbytes, self.dtype, (n, *self.row_shape))
            gone = self.table.pull(id_arr, rows)
            if gone is not None and len(gone):
                positions = np.asarray(gone, dtype=np.uint32)
                if positions.ndim != 1 or len(positions) > n:
                    raise ValueError(f"pull returned {positions.shape} missing positions "
                                     f"for {n} ids")
                view(missing, 4 * n, np.dtype(np.uint32), (n,))[:len(positions)] = positions
                n_missing[0] = len(positions)
            return 0
        except Exception:
            log.exception("rows table %r: pull failed", self.table)
            return INTERNAL

    def _push(self, _user: Any, ids: int, n: int, grads: int, nbytes: int) -> int:
        try:
            id_arr = view(ids, 8 * n, np.dtype(np.uint64), (n,))
            g = view(grads, nbytes, self.dtype, (n, *self.row_shape))
            g.flags.writeable = False
            self.table.push(id_arr, g)
            return 0
        except Exception:
            log.exception("rows table %r: push failed", self.table)
            return INTERNAL

    def close(self) -> None:
        if self.handle:
            _lib.table_free(self.handle)
            self.handle = C.c_void_p()


def _new_tensor(array: Any, what: str) -> int:
    """A tensor handle holding a copy of `array` (the caller frees it)."""
    a = np.ascontiguousarray(array)
    code = code_of(a.dtype, what)
    dims = (C.c_uint64 * max(a.ndim, 1))(*a.shape)
    out = C.c_void_p()
    check(_lib.tensor_new(code, C.addressof(dims), a.ndim, a.ctypes.data, a.nbytes,
                          C.byref(out)))
    return int(out.value or 0)


class Runtime:
    """A starwire runtime: event loops, the task's rendezvous, and (with `listen`) what a
    PS serves. Use it as a context manager; `close` stops it.

    `job` and `task_index` name this task (``"ps"``, 0): the job decides which role
    settings apply. Settings are given by keyword under their environment variable names
    (``Runtime("ps", NETWORK_PS_CORE_NUMBER=2, STARWIRE_BACKEND="epoll")``, or in
    `settings`); those not given are read from the environment unless `use_env` is False.
    See docs/tuning.md for every setting.

    A PS passes `listen` (``"host:port"``, port 0 picks one; see `port`), and serves
    `service` (per-tensor pull and push, a `Service`) and `tables` (table id to a
    `PsTable`, served under its own `table_id`, a `MemTable`, or a `RowsTable` kept in
    Python) to rows requests.

    Peers are named by address (``"10.0.0.1:5555"``) or by task (``"ps:0"``,
    ``"/job:ps/task:0"``): task names go through the cluster spec (`cluster`: job to a list
    of ``host:port``, or the ``TF_CONFIG`` JSON text; default: the ``TF_CONFIG`` variable)
    and the endpoint map (`endpoint_map`: its text; default: ``.endpoint_map`` in
    ``TF_SEASTAR_ENDPOINT_MAP_PATH`` or the current folder).

    Received tensors arrive in memory starwire allocates and come out as numpy arrays over
    it; `allocator` (an `Allocator`) makes them arrive in the trainer's own arrays instead,
    at the cost of a Python call per received tensor on a loop thread.

    `checkpoint_dir` (the setting ``STARWIRE_CHECKPOINT_DIR``) is where this task saves the
    tables it serves when a peer asks (`Client.checkpoint`, ``commctl checkpoint``): one
    file per table, then the manifest ``checkpoint.json``. Without it a checkpoint request
    is refused (``UNIMPLEMENTED``). How often the runtime runs each table's upkeep while
    serving is ``STARWIRE_TABLE_UPKEEP_MS`` (1,000 ms by default).
    """

    def __init__(self, job: str = "worker", task_index: int = 0, *,
                 listen: Optional[str] = None,
                 service: Optional[Service] = None,
                 tables: Optional[Mapping[int, Union[PsTable, MemTable, RowsTable]]] = None,
                 handler_threads: int = 0,
                 allocator: Optional[Allocator] = None,
                 cluster: Union[None, str, Mapping[str, Sequence[str]]] = None,
                 endpoint_map: Optional[str] = None,
                 checkpoint_dir: Union[None, str, "os.PathLike[str]"] = None,
                 settings: Optional[Mapping[str, Setting]] = None,
                 use_env: bool = True,
                 **more_settings: Setting) -> None:
        self._rt = C.c_void_p()
        self.job, self.task_index = job, int(task_index)
        self._lock = threading.Lock()
        self._clients: weakref.WeakSet[Client] = weakref.WeakSet()
        self._lender = Lender()
        self._peers: dict[str, bytes] = {}
        self._resolver: Optional[C.c_void_p] = None
        self._cluster, self._endpoint_map = cluster, endpoint_map
        all_settings = {**(settings or {}), **more_settings}
        if checkpoint_dir is not None:
            if _CHECKPOINT_DIR in all_settings:
                raise InvalidArgument(f"checkpoint_dir and {_CHECKPOINT_DIR} are the same "
                                      "setting: give one of them")
            all_settings[_CHECKPOINT_DIR] = os.fspath(checkpoint_dir)
        names = [k.encode() for k in all_settings]
        values = [_setting_text(v).encode() for v in all_settings.values()]
        c_names = (C.c_char_p * max(len(names), 1))(*names)
        c_values = (C.c_char_p * max(len(values), 1))(*values)

        self._service_cb: Optional[_lib.Service] = None
        if service is not None:
            self._service_cb = _lib.Service(None, _lib.PULL_FN(self._make_pull(service)),
                                            _lib.PUSH_FN(self._make_push(service)))
        self._hooks: Optional[HookArrays] = None
        self._allocator_cb: Optional[_lib.Allocator] = None
        if allocator is not None:
            self._hooks = HookArrays()
            self._allocator_cb = _lib.Allocator(
                None, _lib.ALLOC_FN(self._make_allocate(allocator, self._hooks)),
                _lib.RELEASE_FN(self._make_release(self._hooks)))
        # Rows tables: PsTables and MemTables as they are, Python tables through callbacks
        # (kept alive until the runtime is closed).
        self._py_tables: list[_PyTable] = []
        handles = []
        for tid, t in (tables or {}).items():
            if isinstance(t, PsTable):
                if t.table_id != tid:
                    raise InvalidArgument(
                        f"a PsTable of table_id={t.table_id} is given as table {tid}: serve "
                        f"it under its own id (its table_id names its checkpoint file and "
                        f"selects its rows' initial values), or build it with "
                        f"table_id={tid}")
                handles.append(t._table_handle())
            elif isinstance(t, MemTable):
                handles.append(t._handle())
            else:
                py = _PyTable(t)
                self._py_tables.append(py)
                handles.append(int(py.handle.value or 0))
        n_tables = len(handles)
        table_ids = (C.c_uint32 * max(n_tables, 1))(*(tables or {}).keys())
        table_handles = (C.c_void_p * max(n_tables, 1))(*handles)
        opts = _lib.Options(
            job.encode(), self.task_index, c_names, c_values, len(names), use_env,
            listen.encode() if listen else None,
            C.pointer(self._service_cb) if self._service_cb else None,
            C.pointer(self._allocator_cb) if self._allocator_cb else None,
            handler_threads, table_ids, table_handles, n_tables)
        try:
            check(_lib.runtime_new(C.byref(opts), C.byref(self._rt)))
        finally:
            # The runtime holds its own references to the tables.
            for py in self._py_tables:
                py.close()

    # ----- serving -----

    def _make_pull(self, service: Service) -> Callable[..., None]:
        def pull(_user: Any, ids: Any, n: int, out: Any, statuses: Any) -> None:
            try:
                values = service.pull([ids[i] for i in range(n)])
                for i in range(n):
                    v = values[i] if i < len(values) else None
                    if v is None:
                        statuses[i] = NOT_FOUND
                    else:
                        out[i] = _new_tensor(v, f"pull's array for id {ids[i]}")
            except Exception:
                log.exception("service %r: pull failed", service)
                for i in range(n):
                    if not out[i]:
                        statuses[i] = INTERNAL
        return pull

    def _make_push(self, service: Service) -> Callable[..., None]:
        def push(_user: Any, ids: Any, tensors: Any, n: int, statuses: Any) -> None:
            try:
                arrays = [_borrowed(tensors[i]) for i in range(n)]
                got = service.push([ids[i] for i in range(n)], arrays)
                for i in range(n):
                    statuses[i] = int(got[i]) if i < len(got) else INTERNAL
            except Exception:
                log.exception("service %r: push failed", service)
                for i in range(n):
                    statuses[i] = INTERNAL
        return push

    @staticmethod
    def _make_allocate(allocator: Allocator, hooks: HookArrays) -> Callable[..., int]:
        def allocate(_user: Any, dtype: int, dims: Any, rank: int, nbytes: int) -> int:
            try:
                dt = _lib.DTYPES.get(dtype, np.dtype(np.uint8))
                shape = tuple(dims[i] for i in range(rank))
                a = allocator(dt, shape)
                if a is None:
                    return 0
                if (not isinstance(a, np.ndarray) or a.nbytes != nbytes
                        or not a.flags.c_contiguous or not a.flags.writeable):
                    log.error("allocator %r returned %r for %s%s: not a writable C-contiguous "
                              "array of %d bytes", allocator, type(a), dt, list(shape), nbytes)
                    return 0
                return hooks.add(a)
            except Exception:
                log.exception("allocator %r failed", allocator)
                return 0
        return allocate

    @staticmethod
    def _make_release(hooks: HookArrays) -> Callable[..., None]:
        def release(_user: Any, data: int, _len: int) -> None:
            hooks.release(data)
        return release

    # ----- state -----

    def _handle(self) -> C.c_void_p:
        if not self._rt:
            raise Closed(f"the runtime of {self.job}:{self.task_index} is closed")
        return self._rt

    @property
    def closed(self) -> bool:
        """Whether `close` was called."""
        return not self._rt

    @property
    def port(self) -> int:
        """The port this runtime listens on (0 if it does not listen)."""
        return int(_lib.runtime_port(self._handle()))

    @property
    def address(self) -> str:
        """``127.0.0.1:<port>``: where a peer on this machine reaches this runtime."""
        return f"127.0.0.1:{self.port}"

    def stats(self) -> _lib.Stats:
        """A snapshot of the loops' counters (`Stats`)."""
        s = _lib.Stats()
        check(_lib.runtime_stats(self._handle(), C.byref(s)))
        return s

    def metrics(self) -> Metrics:
        """Per-peer, per-operation metrics of the loops (`starwire.metrics.Metrics`):
        requests by outcome, bytes, tensors and rows, latency percentiles."""
        return Metrics.from_json(_taken_string(_runtime_metrics_json, self._handle()))

    def trace_json(self) -> str:
        """The request trace (with ``trace=True`` or ``STARWIRE_TRACE=1``): a Chrome trace /
        Perfetto JSON document with, per request, when it was submitted, sent, answered and
        completed, on a track per peer. Takes the records: the next call holds only what
        came after. Without tracing the document holds no requests."""
        return _taken_string(_runtime_trace_json, self._handle())

    def write_trace(self, path: str) -> None:
        """Writes `trace_json` to `path` (open it in Perfetto or chrome://tracing)."""
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.trace_json())

    @property
    def lent(self) -> int:
        """Arrays starwire still reads from (pushed or published without a copy, not yet
        sent or received): they must not change until then."""
        return self._lender.held()

    # ----- peers -----

    def peer(self, target: str) -> str:
        """The address of `target` (``"ps:0"``, ``"/job:ps/task:0"`` or a ``host:port``),
        resolved once and kept."""
        return self._peer(target).decode().rpartition("@")[2]

    def _peer(self, target: str) -> bytes:
        """The text requests name `target` by: ``task@host:port`` for a task name (or an
        address the cluster has a task at), so that their errors name the task; else
        ``host:port``."""
        got = self._peers.get(target)
        if got is not None:
            return got
        if not isinstance(target, str):
            raise InvalidArgument(f"a peer is a str (\"ps:0\" or \"host:port\"), not "
                                  f"{type(target).__name__}")
        out = C.create_string_buffer(256)
        check(_lib.resolver_peer(self._resolver_handle(), target.encode(), out, len(out)))
        text = out.value
        self._peers[target] = text
        return text

    def peers(self, job: str) -> list[str]:
        """The addresses of every task of `job` in the cluster spec, task 0 first."""
        n = C.c_size_t()
        check(_lib.resolver_tasks(self._resolver_handle(), job.encode(), C.byref(n)))
        return [self.peer(f"{job}:{i}") for i in range(n.value)]

    def _resolver_handle(self) -> C.c_void_p:
        self._handle()
        with self._lock:
            if self._resolver is None:
                spec = self._cluster
                if isinstance(spec, Mapping):
                    spec = json.dumps({"cluster": {k: list(v) for k, v in spec.items()}})
                r = C.c_void_p()
                check(_lib.resolver_new(spec.encode() if spec is not None else None,
                                        self._endpoint_map.encode()
                                        if self._endpoint_map is not None else None,
                                        C.byref(r)))
                self._resolver = r
            return self._resolver

    # ----- rendezvous -----

    def publish(self, key: Union[str, bytes], array: npt.NDArray[Any]) -> None:
        """Publishes `array` under `key` in this task's rendezvous: a peer's recv of `key`
        gets it, exactly once. The array is sent from its own memory (no copy): it must be
        C-contiguous, and must not change until it has been received (see `lent`)."""
        k = key.encode() if isinstance(key, str) else bytes(key)
        rt = self._handle()
        handle = self._lender.wrap(array, "array")
        try:
            check(_lib.runtime_publish(rt, k, len(k), handle))
        finally:
            self._lender.give_back([(handle, array)])

    def abort_step(self, step: int) -> None:
        """Fails every recv of `step` still waiting in this task's rendezvous
        (``ABORTED``)."""
        check(_lib.runtime_abort_step(self._handle(), step))

    # ----- clients -----

    def client(self, capacity: int = 64) -> Client:
        """A client for the calling thread, with room for `capacity` requests in flight
        (rounded up to a power of two, at least 2; more raise `Backpressure`)."""
        c = Client(self, capacity)
        with self._lock:
            self._clients.add(c)
        return c

    def embedded_client(self, settings: Optional[Mapping[str, Setting]] = None,
                        **more_settings: Setting) -> Client:
        """A client that runs an event loop of its own on the calling thread instead of
        handing its requests to the runtime's loop threads: no thread hop on a request's
        way out or back, and no loop thread to share a CPU with. It moves only while its
        thread is inside one of its calls: a `submit_*` sends its request at once on a
        connection that is up, and connecting and taking in answers happen in the calls
        that wait or poll (a blocking call, `Pending.wait` or `done`, `wait_any`). Only that
        thread may use and close it (`InvalidArgument` on another); closed or dropped
        elsewhere, it is left running until the process ends, with a `ResourceWarning`.
        The allocator hook runs on this thread too, inside those calls.

        Its settings are the runtime's with `settings` (and keywords) on top, under their
        environment variable names: ``WORKER_ENABLE_POLLING=True`` (``PS_...`` for a PS)
        makes its waits busy-poll, keeping the thread and its CPU warm through a wait, at
        the price of that CPU; otherwise a wait spins for ``STARWIRE_SPIN_US``, or for
        twice the client's recent average wait when longer (up to 250 µs), before it
        sleeps in the kernel. It uses the runtime's allocator; it has no limit on
        requests in flight. See docs/tuning.md, "Embedded clients"."""
        given = {**(settings or {}), **more_settings}
        c = Client(self, embedded={k: _setting_text(v) for k, v in given.items()})
        with self._lock:
            self._clients.add(c)
        return c

    def close(self) -> None:
        """Stops the runtime: its clients are closed, requests in flight fail
        (`Shutdown`), the loops are joined. Closing twice does nothing. An embedded client
        of another thread cannot be closed here: it is left running until the process ends,
        with a `ResourceWarning` (close embedded clients on their own threads first)."""
        if not self._rt:
            return
        with self._lock:
            clients = list(self._clients)
        kept = [c for c in clients if not c._free()]
        _lib.runtime_free(self._rt)
        self._rt = C.c_void_p()
        if kept:
            # An embedded client left running (another thread's) may still send from the
            # arrays lent to it, and call the allocator hooks: they stay for good.
            _LEAKED.append((self._lender, self._hooks, self._allocator_cb))
        else:
            self._lender.close()
        if self._resolver is not None:
            _lib.resolver_free(self._resolver)
            self._resolver = None

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_rt", None):
            self.close()


def _taken_string(get: Callable[..., int], rt: C.c_void_p) -> str:
    """The string the C ABI function `get` gives for runtime `rt` (a JSON document), freed
    after it is read."""
    out = C.c_void_p()
    check(get(rt, C.byref(out)))
    try:
        return C.string_at(out).decode()
    finally:
        _string_free(out)


def _borrowed(handle: int) -> npt.NDArray[Any]:
    """A read-only view of a tensor starwire lends to a callback (valid during the call)."""
    if not handle:
        return np.empty(0, dtype=np.uint8)
    dtype = _lib.DTYPES.get(_lib.tensor_dtype(handle), np.dtype(np.uint8))
    rank = _lib.tensor_rank(handle)
    dims = _lib.tensor_dims(handle)
    shape = tuple(dims[i] for i in range(rank))
    a = view(_lib.tensor_data(handle) or 0, _lib.tensor_byte_len(handle), dtype, shape)
    a.flags.writeable = False
    return a


def _setting_text(v: Setting) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)
