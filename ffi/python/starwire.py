"""starwire from Python: a thin ctypes layer over the C ABI (ffi/include/starwire.h).

Tensors are numpy arrays. Received tensors land straight in numpy arrays: the runtime's
allocator hook hands starwire the memory of a fresh numpy array for every tensor, and the
reply returns that very array (no copy after the socket). Embedding rows pulled with
`Client.pull_rows` land in the caller's array (`out`) the same way; a PS serves rows from
`MemTable`s, starwire's reference in-memory table.

The library is loaded from $STARWIRE_LIB, else from target/debug or target/release of
this repository (cargo build -p starwire-ffi).
"""

import ctypes as C
import os
import threading

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.normpath(os.path.join(_HERE, "..", ".."))


def _find_library():
    env = os.environ.get("STARWIRE_LIB")
    if env:
        return env
    for profile in ("debug", "release"):
        path = os.path.join(_ROOT, "target", profile, "libstarwire_ffi.so")
        if os.path.exists(path):
            return path
    raise OSError("libstarwire_ffi.so not found: run `cargo build -p starwire-ffi` or set STARWIRE_LIB")


_lib = C.CDLL(_find_library())

# Wire dtype codes and their numpy types.
_DTYPES = {
    1: np.bool_, 2: np.uint8, 3: np.int8, 4: np.uint16, 5: np.int16, 6: np.float16,
    8: np.uint32, 9: np.int32, 10: np.float32, 11: np.uint64, 12: np.int64, 13: np.float64,
}
_CODES = {np.dtype(t): code for code, t in _DTYPES.items()}

# Wire status codes (docs/wire-format.md).
OK, NOT_FOUND, INVALID_ARGUMENT = 0, 1, 7
_STATUSES = {
    0: "OK", 1: "NOT_FOUND", 2: "ABORTED", 3: "CANCELLED", 4: "DEADLINE_EXCEEDED",
    5: "SHUTDOWN", 6: "RESOURCE_EXHAUSTED", 7: "INVALID_ARGUMENT", 8: "INTERNAL",
    9: "UNIMPLEMENTED", 10: "UNAVAILABLE", 11: "PROTOCOL",
}

_ERRORS = {
    1: "NULL argument", 2: "invalid argument", 3: "configuration error", 4: "I/O error",
    5: "deadline exceeded", 6: "connection lost", 7: "could not connect",
    8: "handshake refused", 9: "the peer answered with an error", 10: "protocol violation",
    11: "too many requests in flight", 12: "shutting down", 13: "internal panic",
    14: "key already published",
}


class Error(Exception):
    """A starwire call failed: `code` is its sw_result, the message sw_last_error().
    For a rows request the peer answered with a failure status for the table, `code` is 9
    and `status` is that wire status (NOT_FOUND, INVALID_ARGUMENT, ...); else `status` is
    None."""

    def __init__(self, code, message, status=None):
        super().__init__(f"{_ERRORS.get(code, 'error')} ({code}): {message}")
        self.code = code
        self.status = status


_p = C.c_void_p
_u64p = C.POINTER(C.c_uint64)
_PULL_FN = C.CFUNCTYPE(None, _p, _u64p, C.c_size_t, C.POINTER(_p), C.POINTER(C.c_uint32))
_PUSH_FN = C.CFUNCTYPE(None, _p, _u64p, C.POINTER(_p), C.c_size_t, C.POINTER(C.c_uint32))
_ALLOC_FN = C.CFUNCTYPE(_p, _p, C.c_uint8, _u64p, C.c_uint32, C.c_uint64)
_RELEASE_FN = C.CFUNCTYPE(None, _p, _p, C.c_uint64)


class _Service(C.Structure):
    _fields_ = [("user_data", _p), ("pull", _PULL_FN), ("push", _PUSH_FN)]


class _Allocator(C.Structure):
    _fields_ = [("user_data", _p), ("allocate", _ALLOC_FN), ("release", _RELEASE_FN)]


class _Options(C.Structure):
    _fields_ = [
        ("job", C.c_char_p), ("task_index", C.c_uint32),
        ("setting_names", C.POINTER(C.c_char_p)), ("setting_values", C.POINTER(C.c_char_p)),
        ("settings", C.c_size_t), ("use_env", C.c_bool), ("listen", C.c_char_p),
        ("service", C.POINTER(_Service)), ("allocator", C.POINTER(_Allocator)),
        ("handler_threads", C.c_uint32),
        ("table_ids", C.POINTER(C.c_uint32)), ("tables", C.POINTER(_p)), ("n_tables", C.c_size_t),
    ]


class _Init(C.Structure):
    _fields_ = [("kind", C.c_uint32), ("scale", C.c_float), ("seed", C.c_uint64)]


class _Optimizer(C.Structure):
    _fields_ = [("kind", C.c_uint32), ("lr", C.c_float), ("initial_accumulator", C.c_float)]


class _Rows(C.Structure):
    _fields_ = [
        ("table", C.c_uint32), ("dtype", C.c_uint8), ("row_dims", _u64p), ("rank", C.c_uint32),
        ("ids", _u64p), ("n", C.c_size_t), ("data", _p), ("byte_len", C.c_uint64),
    ]


class Stats(C.Structure):
    """Counters of a runtime's loops (sw_stats)."""

    _fields_ = [(name, C.c_uint64) for name in (
        "frames_in", "frames_out", "bytes_in", "bytes_out", "requests_completed",
        "requests_failed", "connections_accepted", "connections_opened", "connections_lost",
        "payload_direct", "payload_copied")]


def _sig(name, res, *args):
    f = getattr(_lib, name)
    f.restype, f.argtypes = res, list(args)
    return f


_last_error = _sig("sw_last_error", C.c_char_p)
_tensor_new = _sig("sw_tensor_new", C.c_uint32, C.c_uint8, _u64p, C.c_uint32, _p, C.c_uint64, C.POINTER(_p))
_tensor_free = _sig("sw_tensor_free", None, _p)
_tensor_dtype = _sig("sw_tensor_dtype", C.c_uint8, _p)
_tensor_rank = _sig("sw_tensor_rank", C.c_uint32, _p)
_tensor_dims = _sig("sw_tensor_dims", _u64p, _p)
_tensor_data = _sig("sw_tensor_data", _p, _p)
_tensor_len = _sig("sw_tensor_byte_len", C.c_uint64, _p)
_runtime_new = _sig("sw_runtime_new", C.c_uint32, C.POINTER(_Options), C.POINTER(_p))
_runtime_port = _sig("sw_runtime_port", C.c_uint16, _p)
_runtime_publish = _sig("sw_runtime_publish", C.c_uint32, _p, C.c_char_p, C.c_size_t, _p)
_runtime_stats = _sig("sw_runtime_stats", C.c_uint32, _p, C.POINTER(Stats))
_runtime_free = _sig("sw_runtime_free", None, _p)
_client_new = _sig("sw_client_new", C.c_uint32, _p, C.c_uint32, C.POINTER(_p))
_client_free = _sig("sw_client_free", None, _p)
_client_ping = _sig("sw_client_ping", C.c_uint32, _p, C.c_char_p, C.c_uint32, C.c_uint64, _u64p)
_client_pull = _sig("sw_client_pull", C.c_uint32, _p, C.c_char_p, _u64p, C.c_size_t, C.c_uint64, _u64p)
_client_push = _sig("sw_client_push", C.c_uint32, _p, C.c_char_p, _u64p, C.POINTER(_p), C.c_size_t, C.c_uint64, _u64p)
_client_recv_many = _sig("sw_client_recv_many", C.c_uint32, _p, C.c_char_p, C.c_uint64,
                         C.POINTER(C.c_char_p), C.POINTER(C.c_size_t), C.c_size_t, C.c_uint64, _u64p)
_client_wait = _sig("sw_client_wait", C.c_uint32, _p, C.c_uint64, C.POINTER(_p))
_reply_count = _sig("sw_reply_count", C.c_size_t, _p)
_reply_status = _sig("sw_reply_status", C.c_uint32, _p, C.c_size_t)
_reply_tensor = _sig("sw_reply_tensor", _p, _p, C.c_size_t)
_reply_rtt = _sig("sw_reply_rtt_us", C.c_double, _p)
_reply_free = _sig("sw_reply_free", None, _p)
_reply_missing = _sig("sw_reply_missing", C.c_uint32, _p, C.c_size_t, C.POINTER(C.c_uint32),
                      C.c_size_t, C.POINTER(C.c_size_t))
_mem_table_new = _sig("sw_mem_table_new", C.c_uint32, C.c_size_t, _Init, _Optimizer, C.POINTER(_p))
_table_free = _sig("sw_table_free", None, _p)
_client_pull_rows = _sig("sw_client_pull_rows", C.c_uint32, _p, C.c_char_p, C.POINTER(_Rows),
                         C.c_size_t, C.c_uint64, _u64p)
_client_push_rows = _sig("sw_client_push_rows", C.c_uint32, _p, C.c_char_p, C.POINTER(_Rows),
                         C.c_size_t, C.c_uint64, _u64p)


def _check(code):
    if code != 0:
        raise Error(code, (_last_error() or b"").decode("utf-8", "replace"))


def version():
    """The library's version."""
    return C.cast(_lib.starwire_version(), C.c_char_p).value.decode()


_lib.starwire_version.restype = C.c_void_p


def _new_tensor(array):
    """A C tensor holding a copy of `array` (the caller frees it)."""
    a = np.ascontiguousarray(array)
    code = _CODES.get(a.dtype)
    if code is None:
        raise TypeError(f"dtype {a.dtype} has no starwire code")
    dims = (C.c_uint64 * max(a.ndim, 1))(*a.shape)
    out = _p()
    _check(_tensor_new(code, dims, a.ndim, a.ctypes.data, a.nbytes, C.byref(out)))
    return out


class _Arrays:
    """The allocator hook: every received tensor's memory is a fresh numpy array, kept
    here by address until starwire releases it."""

    def __init__(self):
        self.lock = threading.Lock()
        self.live = {}
        self.allocated = 0
        self.hook = _Allocator(None, _ALLOC_FN(self._allocate), _RELEASE_FN(self._release))

    def _allocate(self, _user, dtype, dims, rank, byte_len):
        np_type = _DTYPES.get(dtype, np.uint8)
        shape = tuple(dims[i] for i in range(rank))
        try:
            arr = np.empty(shape, dtype=np_type)
        except (ValueError, MemoryError):
            return None
        if arr.nbytes != byte_len:
            arr = np.empty(byte_len, dtype=np.uint8)
        with self.lock:
            self.live[arr.ctypes.data] = arr
            self.allocated += 1
        return arr.ctypes.data

    def _release(self, _user, data, _len):
        with self.lock:
            self.live.pop(data, None)

    def array(self, data):
        with self.lock:
            return self.live.get(data)


def _to_array(t, arrays):
    """The numpy array holding C tensor `t`: the array it was received into, if the hook
    allocated it (no copy), else a copy of its bytes."""
    dtype = _DTYPES.get(_tensor_dtype(t), np.uint8)
    rank = _tensor_rank(t)
    dims = _tensor_dims(t)
    shape = tuple(dims[i] for i in range(rank))
    data = _tensor_data(t)
    arr = arrays.array(data) if data else None
    if arr is not None:
        return arr
    n = _tensor_len(t)
    raw = C.string_at(data, n) if n else b""
    return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()


_INITS = {"zeros": 0, "missing": 1, "uniform": 2}
_OPTIMIZERS = {"sgd": 0, "adagrad": 1}


class MemTable:
    """starwire's reference in-memory table of embedding rows, for a PS to serve
    (`Runtime(..., tables={table_id: table})`): rows of `dim` float32, thread-safe.

    `init`: "zeros" (a pull of an unknown id creates its row at zero), "missing" (a pull
    creates nothing and reports unknown ids missing; a push creates the row at zero) or
    "uniform" (each element uniform in [-scale, scale], a fixed function of id, element and
    `seed`). `optimizer`: "sgd" (w -= lr * g) or "adagrad" (acc += g * g;
    w -= lr * g / sqrt(acc), acc starting at `initial_accumulator`, which must be > 0).
    A runtime serving the table keeps it alive on its own.
    """

    def __init__(self, dim, init="zeros", scale=0.0, seed=0, optimizer="sgd", lr=0.01,
                 initial_accumulator=0.1):
        if init not in _INITS:
            raise ValueError(f"init {init!r} is not one of {sorted(_INITS)}")
        if optimizer not in _OPTIMIZERS:
            raise ValueError(f"optimizer {optimizer!r} is not one of {sorted(_OPTIMIZERS)}")
        self.dim = dim
        self._t = _p()
        _check(_mem_table_new(dim, _Init(_INITS[init], scale, seed),
                              _Optimizer(_OPTIMIZERS[optimizer], lr, initial_accumulator),
                              C.byref(self._t)))

    def close(self):
        if self._t:
            _table_free(self._t)
            self._t = _p()

    def __del__(self):
        if getattr(self, "_t", None):
            self.close()


class Runtime:
    """A starwire runtime (event loops and the task's rendezvous).

    `service` is an object with `pull(ids) -> list of arrays or None` and
    `push(ids, arrays) -> list of statuses` (0 OK), called on loop threads.
    `tables` maps table ids to `MemTable`s served to rows requests.
    `settings` maps setting names (their environment variable names) to values.
    """

    def __init__(self, job, task_index=0, listen=None, service=None, settings=None, use_env=True,
                 tables=None):
        self._arrays = _Arrays()
        settings = settings or {}
        names = (C.c_char_p * max(len(settings), 1))(*[k.encode() for k in settings])
        values = (C.c_char_p * max(len(settings), 1))(*[str(v).encode() for v in settings.values()])
        self._service = None
        if service is not None:
            self._service = _Service(None, _PULL_FN(self._make_pull(service)),
                                     _PUSH_FN(self._make_push(service)))
        tables = tables or {}
        table_ids = (C.c_uint32 * max(len(tables), 1))(*tables.keys())
        handles = (_p * max(len(tables), 1))(*[t._t.value for t in tables.values()])
        opts = _Options(
            job.encode(), task_index, names, values, len(settings), use_env,
            listen.encode() if listen else None,
            C.pointer(self._service) if self._service else None,
            C.pointer(self._arrays.hook), 0, table_ids, handles, len(tables))
        self._rt = _p()
        _check(_runtime_new(C.byref(opts), C.byref(self._rt)))

    def _make_pull(self, service):
        def pull(_user, ids, n, out, statuses):
            values = service.pull([ids[i] for i in range(n)])
            for i, v in enumerate(values[:n]):
                if v is None:
                    statuses[i] = NOT_FOUND
                else:
                    out[i] = _new_tensor(v).value
        return pull

    def _make_push(self, service):
        def push(_user, ids, tensors, n, statuses):
            arrays = [_to_array(tensors[i], self._arrays) for i in range(n)]
            for i, s in enumerate(service.push([ids[i] for i in range(n)], arrays)[:n]):
                statuses[i] = s
        return push

    @property
    def port(self):
        """The port this runtime listens on."""
        return _runtime_port(self._rt)

    @property
    def allocated(self):
        """Tensors received into numpy arrays by the allocator hook so far."""
        return self._arrays.allocated

    def publish(self, key, array):
        """Publishes `array` (copied once) under `key` in this task's rendezvous."""
        t = _new_tensor(array)
        try:
            k = key.encode() if isinstance(key, str) else key
            _check(_runtime_publish(self._rt, k, len(k), t))
        finally:
            _tensor_free(t)

    def stats(self):
        s = Stats()
        _check(_runtime_stats(self._rt, C.byref(s)))
        return s

    def client(self, capacity=64):
        return Client(self, capacity)

    def close(self):
        if self._rt:
            _runtime_free(self._rt)
            self._rt = _p()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Client:
    """A per-thread client: submits requests and waits for them."""

    def __init__(self, runtime, capacity=64):
        self._rt = runtime
        self._c = _p()
        _check(_client_new(runtime._rt, capacity, C.byref(self._c)))

    def _wait(self, tag):
        reply = _p()
        _check(_client_wait(self._c, tag, C.byref(reply)))
        return reply

    def _items(self, reply):
        try:
            out = []
            for i in range(_reply_count(reply)):
                t = _reply_tensor(reply, i)
                out.append(_to_array(t, self._rt._arrays) if t else None)
            return out
        finally:
            _reply_free(reply)

    def ping(self, peer, payload=32, timeout_ms=5000):
        """Round-trip time in microseconds."""
        tag = C.c_uint64()
        _check(_client_ping(self._c, peer.encode(), payload, timeout_ms, C.byref(tag)))
        reply = self._wait(tag.value)
        try:
            return _reply_rtt(reply)
        finally:
            _reply_free(reply)

    def pull(self, peer, ids, timeout_ms=5000):
        """One numpy array (or None: not found) per id."""
        arr = (C.c_uint64 * len(ids))(*ids)
        tag = C.c_uint64()
        _check(_client_pull(self._c, peer.encode(), arr, len(ids), timeout_ms, C.byref(tag)))
        return self._items(self._wait(tag.value))

    def push(self, peer, items, timeout_ms=5000):
        """Pushes (id, array) pairs; returns one status per item (0 OK)."""
        ids = (C.c_uint64 * len(items))(*[i for i, _ in items])
        tensors = [_new_tensor(a) for _, a in items]
        try:
            ptrs = (_p * len(items))(*[t.value for t in tensors])
            tag = C.c_uint64()
            _check(_client_push(self._c, peer.encode(), ids, ptrs, len(items), timeout_ms, C.byref(tag)))
        finally:
            for t in tensors:
                _tensor_free(t)
        reply = self._wait(tag.value)
        try:
            return [_reply_status(reply, i) for i in range(_reply_count(reply))]
        finally:
            _reply_free(reply)

    def recv_many(self, peer, step, keys, timeout_ms=5000):
        """The tensors published under `keys` at `peer`, in one fused request."""
        raw = [k.encode() if isinstance(k, str) else k for k in keys]
        ks = (C.c_char_p * len(raw))(*raw)
        lens = (C.c_size_t * len(raw))(*[len(k) for k in raw])
        tag = C.c_uint64()
        _check(_client_recv_many(self._c, peer.encode(), step, ks, lens, len(raw), timeout_ms, C.byref(tag)))
        return self._items(self._wait(tag.value))

    def pull_rows(self, peer, table, ids, dim, dtype=np.float32, out=None, timeout_ms=5000):
        """Rows `ids` (1-D, uint64) of `table` at `peer`, each `dim` elements of `dtype`:
        returns `(rows, missing)`, `rows` an array [len(ids), dim] and `missing` the
        positions (uint32, increasing) of the ids the PS has no row for (their rows are
        zero). The rows are received straight into `rows`' memory; with `out` (a writable,
        C-contiguous array of that shape and dtype) that is `out` itself, which is returned.
        A table the PS does not serve, or of another dtype or width, raises `Error` with
        its `status` (NOT_FOUND, INVALID_ARGUMENT)."""
        ids = _row_ids(ids)
        dtype = np.dtype(dtype)
        code = _CODES.get(dtype)
        if code is None:
            raise TypeError(f"dtype {dtype} has no starwire code")
        shape = (len(ids), int(dim))
        if out is None:
            out = np.empty(shape, dtype=dtype)
        elif not isinstance(out, np.ndarray):
            raise TypeError(f"out must be a numpy array, not {type(out).__name__}")
        elif out.dtype != dtype or out.shape != shape:
            raise ValueError(f"out is {out.dtype}{list(out.shape)}, not {dtype}{list(shape)}")
        elif not (out.flags.c_contiguous and out.flags.writeable):
            raise ValueError("out must be C-contiguous and writable")
        row_dims = (C.c_uint64 * 1)(shape[1])
        rows = _Rows(table, code, row_dims, 1, ids.ctypes.data_as(_u64p), len(ids),
                     out.ctypes.data, out.nbytes)
        tag = C.c_uint64()
        _check(_client_pull_rows(self._c, peer.encode(), C.byref(rows), 1, timeout_ms, C.byref(tag)))
        # `out` and `ids` stay referenced here until the wait returns: starwire writes into
        # `out` until then.
        reply = self._wait(tag.value)
        try:
            _check_status(table, _reply_status(reply, 0))
            missing = np.empty(len(ids), dtype=np.uint32)
            count = C.c_size_t()
            _check(_reply_missing(reply, 0, missing.ctypes.data_as(C.POINTER(C.c_uint32)),
                                  len(missing), C.byref(count)))
        finally:
            _reply_free(reply)
        return out, missing[:count.value].copy()

    def push_rows(self, peer, table, ids, grads, timeout_ms=5000):
        """Pushes gradient rows `grads` (a C-contiguous array [len(ids), dim] of the table's
        dtype) for `ids` (1-D, uint64) of `table` at `peer`. Raises `Error` with its `status`
        when the PS refuses them (NOT_FOUND: no such table; INVALID_ARGUMENT: another dtype
        or width)."""
        ids = _row_ids(ids)
        if not isinstance(grads, np.ndarray):
            raise TypeError(f"grads must be a numpy array, not {type(grads).__name__}")
        if grads.ndim != 2 or grads.shape[0] != len(ids):
            raise ValueError(f"grads has shape {list(grads.shape)}, not [{len(ids)}, dim] "
                             f"(one row per id)")
        if not grads.flags.c_contiguous:
            raise ValueError("grads must be C-contiguous (np.ascontiguousarray(grads))")
        code = _CODES.get(grads.dtype)
        if code is None:
            raise TypeError(f"grads dtype {grads.dtype} has no starwire code")
        row_dims = (C.c_uint64 * 1)(grads.shape[1])
        rows = _Rows(table, code, row_dims, 1, ids.ctypes.data_as(_u64p), len(ids),
                     grads.ctypes.data, grads.nbytes)
        tag = C.c_uint64()
        _check(_client_push_rows(self._c, peer.encode(), C.byref(rows), 1, timeout_ms, C.byref(tag)))
        reply = self._wait(tag.value)
        try:
            _check_status(table, _reply_status(reply, 0))
        finally:
            _reply_free(reply)

    def close(self):
        if self._c:
            _client_free(self._c)
            self._c = _p()


def _row_ids(ids):
    """`ids` as a 1-D C-contiguous uint64 array (copied only if it is not one)."""
    a = np.ascontiguousarray(ids, dtype=np.uint64)
    if a.ndim != 1:
        raise ValueError(f"ids must be 1-D, not of shape {list(a.shape)}")
    return a


def _check_status(table, status):
    if status != OK:
        name = _STATUSES.get(status, "unknown status")
        raise Error(9, f"table {table}: {name} ({status})", status=status)
