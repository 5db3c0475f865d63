"""The pipelined sharded rows client: a worker's step that does not wait for the network
when it need not (``rows::Pipeline`` in Rust, ``sw_pipeline`` in C)."""

from __future__ import annotations

import ctypes as C
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence, TypeVar, Union

import numpy as np
import numpy.typing as npt

from . import _lib
from ._arrays import address, code_of, contiguous, loss_scale_value, wire_code
from ._ids import _row_ids, _row_shape
from .client import _PARTITIONS, Client, _ms
from .errors import OK, Closed, InvalidArgument, StarwireError, check, from_code
from .sharded_tables import _c_shapes, _grad_batches, _unique_batches, _unique_parts


_P = TypeVar("_P", bound="_PipelineCore")


@dataclass(frozen=True)
class PipelineSettings:
    """How far a `Pipeline` runs ahead of its PS tasks.

    `staleness`: the rows a step uses may miss at most this many of this worker's own most
    recent pushes, and reflect every earlier one (0: each pull waits for the pushes before
    it, and its rows are `Sharded`'s). `max_pushes_in_flight`: the most pushes sent and
    not yet answered (1 to 64): a push waits while the one that many before it is
    unanswered. `timeout`: seconds each request is given from when it is sent (None: no
    limit). `wire_dtype`: the dtype rows travel as, for float32, bfloat16 and float16 rows
    (``"float32"``/``"f32"``, ``"bfloat16"``/``"bf16"``, ``"float16"``/``"f16"``; None: the
    table's own), as `Sharded.set_wire_dtype`. `loss_scale`: the factor pushed gradients
    were multiplied by, which the PS divides out (2^-126 to 2^126; None: none), as
    `Sharded.set_loss_scale`. `cache_bytes`: the bytes of the worker's row cache (its
    rows and their index, all allocated when the pipeline is made; 0, the default: no
    cache). With staleness s >= 1 a cached row that misses at most s of this worker's
    pushes is served from the cache, not pulled (``report.cache_hits``); with s = 0 the
    cache serves nothing without asking. Either way the cached rows too old to serve are
    named in the pull with their versions, and a PS that keeps row versions answers those
    nobody changed without their bytes (``report.rows_unchanged``); when those save fewer
    bytes than the versions cost (a trainer's own pushes change the rows it caches), plain
    pulls follow for 64 steps at a time. This worker's own pushes do not patch cached rows. At least ``row_bytes + 33`` (one row with its id,
    clock, version and index cells) when not 0. Checked when the pipeline is made
    (`InvalidArgument` naming the setting).
    """

    staleness: int = 1
    max_pushes_in_flight: int = 2
    timeout: Optional[float] = 60.0
    wire_dtype: Any = None
    loss_scale: Optional[float] = None
    cache_bytes: int = 0


@dataclass
class PipelineReport:
    """What a step of a `Pipeline` did so far. A step runs from the `Pipeline.pull` that
    delivers its rows to the next one (the pull, the prefetch of the next batch, the push of
    its gradients); each call returns the report of the step so far, so a push in the usual
    order returns the whole step's.

    `visible` is the seconds spent in the step's calls (the time communication kept the
    computation waiting), `waited` the part of it spent waiting for answers. Bytes are
    payload (8 per id, the row's bytes per row each way), counted in the step whose call
    sent or took them. `may_miss` is the most of this worker's pushes the step's rows may
    miss (never above the staleness bound); `prefetched` and `refetched` count PS parts of
    the pull sent before it, and sent again at it because more pushes had gone out since
    than the bound lets its rows miss; `fallbacks` the parts whose rows came in the table's
    dtype although another wire dtype was set (that PS did not announce ``row_formats``).

    With a row cache (``PipelineSettings.cache_bytes``): `cache_hits` counts the step's
    distinct rows served from the cache, `cache_misses` those it could not serve (absent or
    too old: asked for), `cache_bytes` the bytes of rows it held when the step's last call
    returned, `cache_evictions` the rows it evicted during the step, and `rows_unchanged`
    the rows it held too old that the PS answered unchanged (their bytes did not travel;
    counted in `cache_misses`, not in `rows_received`). All 0 without a cache."""

    step: int = 0
    visible: float = 0.0
    waited: float = 0.0
    unique: int = 0
    missing: int = 0
    rows_received: int = 0
    rows_sent: int = 0
    bytes_received: int = 0
    bytes_sent: int = 0
    pushes_in_flight: int = 0
    prefetched: int = 0
    refetched: int = 0
    may_miss: int = 0
    fallbacks: int = 0
    cache_hits: int = 0
    cache_misses: int = 0
    cache_bytes: int = 0
    cache_evictions: int = 0
    rows_unchanged: int = 0


@dataclass
class PushFailure:
    """A push whose part at one PS failed after the call that sent it had returned (refused
    by the PS, timed out, or lost with its connection): the step whose push it was, the PS
    (`shard`, its position in the pipeline's peers, and `peer`, its address) and the
    error (naming the PS; for a refusal, `error.status` is the PS's wire status)."""

    step: int
    shard: int
    peer: str
    error: StarwireError = field(repr=False, compare=False)


def _report(r: _lib.PipelineReport) -> PipelineReport:
    return PipelineReport(
        int(r.step), float(r.visible_seconds), float(r.waited_seconds),
        *(int(getattr(r, name)) for name in _lib.PIPELINE_REPORT_COUNTS))


def _c_settings(s: PipelineSettings, dtype: np.dtype[Any]) -> _lib.PipelineSettings:
    """`s` checked, for the C ABI (rows of `dtype`)."""
    for name in ("staleness", "max_pushes_in_flight"):
        value = getattr(s, name)
        if not isinstance(value, int) or not 0 <= value < 1 << 32:
            raise InvalidArgument(f"{name} is {value!r}; it must be an int from 0 to "
                                  "2^32-1 (and max_pushes_in_flight from 1 to 64)")
    if (type(s.cache_bytes) is not int and not isinstance(s.cache_bytes, np.integer)
            or not 0 <= s.cache_bytes < 1 << 64):
        raise InvalidArgument(f"cache_bytes is {s.cache_bytes!r}; it must be an int, 0 "
                              "(no cache) or at least the bytes of one row with its entry")
    # 0: the table's dtype, no loss scale.
    wire = 0 if s.wire_dtype is None else wire_code(s.wire_dtype, dtype)
    return _lib.PipelineSettings(s.staleness, s.max_pushes_in_flight, _ms(s.timeout), wire,
                                 loss_scale_value(s.loss_scale), int(s.cache_bytes))


class _PipelineCore:
    """What `Pipeline` and `PipelineTables` share: the handle, the push failures, flush,
    the report and the counts, closing."""

    _p: C.c_void_p
    client: Client
    peers: list[str]

    def _begin(self, client: Client, peers: Optional[Sequence[str]], job: str,
               settings: Optional[PipelineSettings]) -> list[bytes]:
        """Sets the client, the peers, the settings and the report; the peers' texts for
        the C ABI."""
        names = list(peers) if peers is not None else client.runtime.peers(job)
        # ``task@host:port`` for a task, so that errors name it.
        texts = [client.runtime._peer(p) for p in names]
        self.client = client
        #: The PS tasks' addresses, in shard order.
        self.peers = [t.decode().rpartition("@")[2] for t in texts]
        self._settings = settings if settings is not None else PipelineSettings()
        self._report = _lib.PipelineReport()
        self._report_ref = C.byref(self._report)
        return texts

    def _handle(self) -> C.c_void_p:
        if not self._p:
            raise Closed("the pipeline is closed")
        return self._p

    def _failure(self, code: int) -> StarwireError:
        """The exception of a call that failed with `code`, with the push failures it
        reported."""
        # Read first: the calls below leave errors of their own.
        err = from_code(code)
        err.failed_pushes = self._push_failures()
        return err

    def _push_failures(self) -> list[PushFailure]:
        failures = []
        f = _lib.PushFailure()
        for i in range(_lib.pipeline_failed_pushes(self._p)):
            check(_lib.pipeline_failed_push(self._p, i, C.byref(f)))
            one = from_code(_lib.pipeline_failed_push_error(self._p, i))
            failures.append(PushFailure(int(f.step), int(f.shard), self.peers[f.shard], one))
        return failures

    def _done(self, code: int) -> PipelineReport:
        if code != OK:
            raise self._failure(code)
        return _report(self._report)

    def flush(self) -> PipelineReport:
        """Waits until every push sent has been answered by every PS, and every prefetched
        request has its answer: then nothing of the pipeline is in flight. Raises the push
        failures found."""
        p, c = self._handle(), self.client._handle()
        return self._done(_lib.pipeline_flush(p, c, self._report_ref))

    def report(self) -> PipelineReport:
        """The report of the step in progress."""
        r = _lib.PipelineReport()
        check(_lib.pipeline_current_report(self._handle(), C.byref(r)))
        return _report(r)

    def failed_pushes(self) -> list[PushFailure]:
        """The push failures the last call raised, in the order found (empty when it
        raised none)."""
        return self._push_failures() if self._p else []

    def settings(self) -> PipelineSettings:
        """The settings in force."""
        return self._settings

    def steps(self) -> int:
        """Steps whose rows were delivered so far."""
        return int(_lib.pipeline_steps(self._handle()))

    def pushes(self) -> int:
        """Pushes sent so far."""
        return int(_lib.pipeline_pushes(self._handle()))

    def pushes_in_flight(self) -> int:
        """Pushes sent and not yet answered by every PS they went to, as far as the last
        call saw."""
        return int(_lib.pipeline_pushes_in_flight(self._handle()))

    def close(self) -> None:
        """Waits for what is in flight (`flush`, when the client is still open) and frees
        the pipeline; push failures that flush finds are raised once it is freed. Closing
        twice does nothing."""
        if not self._p:
            return
        try:
            if self.client._c and self.client.runtime._rt:
                self.flush()
        finally:
            _lib.pipeline_free(self._p)
            self._p = C.c_void_p()

    def __enter__(self: _P) -> _P:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        # Dropped without `close`: freed without waiting (a finalizer does not block).
        if getattr(self, "_p", None):
            _lib.pipeline_free(self._p)
            self._p = C.c_void_p()


class Pipeline(_PipelineCore):
    """One table partitioned over PS tasks, from a worker whose steps overlap their
    communication with their computation: `prefetch` hands the next step's ids early
    (their rows are requested while this step computes), `pull` takes a step's rows, `push`
    sends its gradients and returns without waiting for the answers, `flush` waits for
    everything in flight. Batches are planned as `Sharded` plans them (duplicate ids
    removed, one request per PS, rows scattered into the ``[batch, *row_shape]`` array,
    duplicates' gradients summed), all in Rust. Blocking calls release the GIL.

    `client` is the client the pipeline's requests go through, for good (one thread at a
    time; not one whose completions another caller takes with `Client.wait_any` while
    the pipeline has requests in flight). `peers` are task names or addresses (default:
    every task of `job` in the cluster spec); `partition` is ``"mod"``, ``"div"``
    (contiguous ranges of ``0..vocab``) or ``"hash"``; `settings` a `PipelineSettings`
    (staleness 1, 2 pushes in flight, 60 s per request by default).

    What a pulled row reflects: number this worker's pushes 1, 2, ... in the order of the
    `push` calls, and let P be the number sent when `pull` returns. Every row reflects
    each of pushes 1..P-s (s the staleness bound) and may or may not reflect the s most
    recent ones; other workers' pushes are not ordered against it. With s = 0 the rows are
    `Sharded.pull`'s after `Sharded.push` returned.

    A push that fails after its call returned (the PS refused it, it timed out, its
    connection was lost) is never dropped: the next call that finds it raises its error
    (the first failed part's kind, ``task`` and ``status``; the message names each failed
    step and PS) with ``e.failed_pushes`` listing them, and does nothing else: call it
    again to do its work. Nothing is retried.

    Use it as a context manager, or `close` it: that waits for what is in flight.
    """

    def __init__(self, client: Client, table: int, row_shape: Union[int, Sequence[int]], *,
                 peers: Optional[Sequence[str]] = None, job: str = "ps",
                 dtype: Any = np.float32, partition: str = "mod", vocab: int = 0,
                 settings: Optional[PipelineSettings] = None) -> None:
        self._p = C.c_void_p()
        if partition not in _PARTITIONS:
            raise InvalidArgument(f"partition {partition!r} is not one of "
                                  f"{sorted(_PARTITIONS)}")
        texts = self._begin(client, peers, job, settings)
        self.table = int(table)
        self.row_shape, self.dtype = _row_shape(row_shape), np.dtype(dtype)
        c_settings = _c_settings(self._settings, self.dtype)
        code = code_of(self.dtype, "the rows")
        c_texts = (C.c_char_p * max(len(texts), 1))(*texts)
        dims = (C.c_uint64 * len(self.row_shape))(*self.row_shape)
        check(_lib.pipeline_new(client._handle(), c_texts, len(texts),
                                _lib.Partition(_PARTITIONS[partition], vocab), self.table, code,
                                C.addressof(dims), len(self.row_shape), c_settings,
                                C.byref(self._p)))

    def _shape(self, n: int) -> tuple[int, ...]:
        return (n, *self.row_shape)

    def prefetch(self, ids: Any) -> PipelineReport:
        """Hands the next step's batch `ids` (duplicates allowed) early: each PS's part of
        its pull is sent at once if the staleness bound allows, else by a later call that
        finds the answers it waits for. Never waits for the network. The rows are taken by
        the next `pull` of the same ids (a prefetch of another batch first replaces this
        one). Raises the push failures found, as `push` says."""
        p, c = self._handle(), self.client._handle()
        id_arr = _row_ids(ids)
        return self._done(_lib.pipeline_prefetch(p, c, address(id_arr), len(id_arr),
                                                 self._report_ref))

    def pull(self, ids: Any, out: Optional[npt.NDArray[Any]] = None
             ) -> tuple[npt.NDArray[Any], PipelineReport]:
        """The rows of step `ids` (duplicates allowed) in `out` (``[len(ids),
        *row_shape]``, C-contiguous and writable; a new array when None), row `i` for
        ``ids[i]``, and the step's report: the rows the last `prefetch` requested when
        `ids` is its batch (waiting only for what has not arrived), else requested now.
        Rows no PS has are left zero (``report.missing``). Starts a new step.

        Raises the push failures found (nothing delivered), and a PS's part that failed
        (the message names the step and the PS; the other parts' rows may be written, and
        the step does not count)."""
        p, c = self._handle(), self.client._handle()
        id_arr = _row_ids(ids)
        shape = self._shape(len(id_arr))
        if out is None:
            out = np.zeros(shape, dtype=self.dtype)
        else:
            contiguous(out, "out")
            if out.dtype != self.dtype or out.shape != shape:
                raise InvalidArgument(f"out is {out.dtype}{list(out.shape)}, not "
                                      f"{self.dtype}{list(shape)}")
            if not out.flags.writeable:
                raise InvalidArgument("out is read-only")
        code = _lib.pipeline_pull(p, c, address(id_arr), len(id_arr), address(out), out.nbytes,
                                  self._report_ref)
        return out, self._done(code)

    def pull_unique(self, ids: Any) -> tuple[npt.NDArray[np.uint64], npt.NDArray[Any],
                                             npt.NDArray[np.int64], PipelineReport]:
        """`pull` of each distinct id of `ids` once, for a caller that builds its batch
        from the distinct rows: ``(unique, rows, inverse, report)`` as
        `Sharded.pull_unique` gives them (the distinct ids grouped by PS task, each task's
        in the order first seen; their rows; per position the index of its id in
        `unique`, so that ``rows[inverse]`` is what `pull` gives). A prefetch of the same
        ids is taken; the step's gradients may be pushed by the distinct ids. The
        deduplication is the one every step does, in Rust."""
        p, c = self._handle(), self.client._handle()
        id_arr = _row_ids(ids)
        n = len(id_arr)
        inverse = np.empty(n, dtype=np.int64)
        unique = np.empty(n, dtype=np.uint64)
        # Every distinct row is written (a failed PS's zeroed): no need to clear it first.
        out = np.empty(self._shape(n), dtype=self.dtype)
        count = C.c_size_t(0)
        code = _lib.pipeline_pull_unique(p, c, address(id_arr), n, address(inverse),
                                         address(unique), address(out), out.nbytes,
                                         C.byref(count), self._report_ref)
        report = self._done(code)
        k = count.value
        return unique[:k], out[:k], inverse, report

    def push(self, ids: Any, grads: npt.NDArray[Any]) -> PipelineReport:
        """Sends the gradient rows `grads` (``[len(ids), *row_shape]``, C-contiguous, of
        the rows' dtype: float32 or float64) of `ids`: duplicates summed into the
        pipeline's own blocks (`grads` may change as soon as it returns), one request per
        PS, and returns without waiting for the answers, unless the push
        `max_pushes_in_flight` before it is unanswered (then it waits for that one).

        A push part that fails after this returned is raised by the next call that finds
        it (`prefetch`, `pull`, `push` or `flush`), with ``e.failed_pushes``; that call
        does nothing else. Raises them here too, this push then not sent."""
        p, c = self._handle(), self.client._handle()
        id_arr = _row_ids(ids)
        g = contiguous(grads, "grads")
        shape = self._shape(len(id_arr))
        if g.dtype != self.dtype or g.shape != shape:
            raise InvalidArgument(f"grads is {g.dtype}{list(g.shape)}, not "
                                  f"{self.dtype}{list(shape)}")
        return self._done(_lib.pipeline_push(p, c, address(id_arr), len(id_arr), address(g),
                                             g.nbytes, self._report_ref))



class PipelineTables(_PipelineCore):
    """Several tables partitioned over the same PS tasks, pipelined together
    (``Pipeline::new_tables`` in Rust, ``sw_pipeline_new_tables`` in C): `tables` is a
    sequence of ``(table, row_shape)``, each of rows of `dtype`; `peers`, `job`,
    `partition` and `settings` as for `Pipeline` (each table gets a row cache of
    ``settings.cache_bytes``; the wire dtype and loss scale apply to every table), `vocab`
    as for `ShardedTables`. A step's calls take one batch of ids per table, in that order
    (an empty batch: the table takes no part in the step), and each PS gets ONE request
    each way for every table's rows it holds, not one per table; the step's push counts
    as one against the staleness bound and `max_pushes_in_flight`, and the report sums
    the tables' counts. What a row reflects, the push failures and closing are as for
    `Pipeline`."""

    def __init__(self, client: Client, tables: Sequence[tuple[int, Union[int, Sequence[int]]]],
                 *, peers: Optional[Sequence[str]] = None, job: str = "ps",
                 dtype: Any = np.float32, partition: str = "mod",
                 vocab: Union[int, Sequence[int]] = 0,
                 settings: Optional[PipelineSettings] = None) -> None:
        self._p = C.c_void_p()
        if partition not in _PARTITIONS:
            raise InvalidArgument(f"partition {partition!r} is not one of "
                                  f"{sorted(_PARTITIONS)}")
        specs = [(int(t), _row_shape(shape)) for t, shape in tables]
        texts = self._begin(client, peers, job, settings)
        #: The tables, and each one's row shape, in the order the batches are given.
        self.tables = [t for t, _ in specs]
        self.row_shapes = [shape for _, shape in specs]
        self.dtype = np.dtype(dtype)
        c_settings = _c_settings(self._settings, self.dtype)
        shapes, _dims = _c_shapes(specs, self.dtype, partition, vocab)
        c_texts = (C.c_char_p * max(len(texts), 1))(*texts)
        check(_lib.pipeline_new_tables(client._handle(), c_texts, len(texts), shapes,
                                       len(specs), c_settings, C.byref(self._p)))
        # Reused by every call: the batches' structs.
        self._batches = (_lib.TableBatch * max(len(specs), 1))()
        self._unique_batches = (_lib.UniqueBatch * max(len(specs), 1))()

    def _ids(self, ids: Sequence[Any]) -> list[npt.NDArray[np.uint64]]:
        if len(ids) != len(self.tables):
            raise InvalidArgument(f"{len(ids)} batches of ids for {len(self.tables)} tables "
                                  f"({self.tables})")
        return [_row_ids(i) for i in ids]

    def _batch(self, i: int, ids: npt.NDArray[np.uint64],
               data: Optional[npt.NDArray[Any]]) -> None:
        b, n = self._batches[i], len(ids)
        b.ids, b.n = (address(ids) if n else None), n
        b.data = address(data) if data is not None and n else None
        b.byte_len = 0 if data is None else data.nbytes

    def prefetch(self, ids: Sequence[Any]) -> PipelineReport:
        """Hands the next step's batches ``ids[t]`` early (as `Pipeline.prefetch`): taken
        by the next `pull` of the same batches."""
        p, c = self._handle(), self.client._handle()
        arrays = self._ids(ids)
        for i, a in enumerate(arrays):
            self._batch(i, a, None)
        return self._done(_lib.pipeline_prefetch_tables(p, c, self._batches, len(arrays),
                                                        self._report_ref))

    def pull(self, ids: Sequence[Any], outs: Optional[Sequence[npt.NDArray[Any]]] = None
             ) -> tuple[list[npt.NDArray[Any]], PipelineReport]:
        """The rows of each table's batch ``ids[t]`` in ``outs[t]`` (``[len(ids[t]),
        *row_shape]``, C-contiguous and writable; new arrays when None), and the step's
        report, as `Pipeline.pull` for each table, in one request per PS."""
        p, c = self._handle(), self.client._handle()
        arrays = self._ids(ids)
        if outs is None:
            made = [np.zeros((len(a), *shape), dtype=self.dtype)
                    for a, shape in zip(arrays, self.row_shapes)]
        else:
            if len(outs) != len(arrays):
                raise InvalidArgument(f"{len(outs)} arrays for {len(arrays)} tables")
            made = list(outs)
            for i, (a, out, shape) in enumerate(zip(arrays, made, self.row_shapes)):
                contiguous(out, f"outs[{i}]")
                want = (len(a), *shape)
                if out.dtype != self.dtype or out.shape != want:
                    raise InvalidArgument(f"outs[{i}] is {out.dtype}{list(out.shape)}, not "
                                          f"{self.dtype}{list(want)} (table {self.tables[i]})")
                if not out.flags.writeable:
                    raise InvalidArgument(f"outs[{i}] is read-only")
            for i, out in enumerate(made):
                for j in range(i):
                    if out.nbytes and made[j].nbytes and np.may_share_memory(out, made[j]):
                        raise InvalidArgument(f"outs[{i}] and outs[{j}] share memory: each "
                                              "table's rows need arrays of their own")
        for i, (a, out) in enumerate(zip(arrays, made)):
            self._batch(i, a, out)
        code = _lib.pipeline_pull_tables(p, c, self._batches, len(arrays), self._report_ref)
        return made, self._done(code)

    def pull_unique(self, ids: Sequence[Any]
                    ) -> tuple[list[tuple[npt.NDArray[np.uint64], npt.NDArray[Any],
                                          npt.NDArray[np.int64]]], PipelineReport]:
        """Each distinct id of each table's batch ``ids[t]`` pulled once, in one request per
        PS for all the tables: per table ``(unique, rows, inverse)`` as
        `Pipeline.pull_unique` gives them, and the step's report."""
        p, c = self._handle(), self.client._handle()
        arrays = self._ids(ids)
        batches = self._unique_batches
        made = _unique_batches(batches, arrays, self.row_shapes, self.dtype)
        code = _lib.pipeline_pull_tables_unique(p, c, batches, len(arrays), self._report_ref)
        report = self._done(code)
        return _unique_parts(made, batches), report

    def push(self, ids: Sequence[Any], grads: Sequence[npt.NDArray[Any]]) -> PipelineReport:
        """Sends each table's gradient rows ``grads[t]`` (``[len(ids[t]), *row_shape]``,
        C-contiguous, float32 or float64 as the rows) of ``ids[t]`` (as `Pipeline.push`),
        one request per PS for all the tables; returns without waiting for the answers."""
        p, c = self._handle(), self.client._handle()
        arrays = self._ids(ids)
        _grad_batches(self._batches, arrays, grads, self.tables, self.row_shapes, self.dtype)
        code = _lib.pipeline_push_tables(p, c, self._batches, len(arrays), self._report_ref)
        return self._done(code)
