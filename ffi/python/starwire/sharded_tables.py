"""Several tables partitioned over the same PS tasks, pulled and pushed together: a step is
one rows request per PS for all the tables (``rows::ShardedTables`` in Rust,
``sw_sharded_tables`` in C)."""

from __future__ import annotations

import ctypes as C
from typing import Any, Optional, Sequence, Union

import numpy as np
import numpy.typing as npt

from . import _lib
from ._arrays import address, code_of, contiguous, loss_scale_value, wire_code
from ._ids import _row_ids, _row_shape
from .client import _PARTITIONS, DEFAULT_TIMEOUT, Client, StepReport, _ms, _step_outcome
from .errors import Closed, InvalidArgument, check

__all__ = ["ShardedTables"]


def _c_shapes(specs: Sequence[tuple[int, tuple[int, ...]]], dtype: np.dtype[Any],
              partition: str, vocab: Union[int, Sequence[int]]) -> tuple[Any, list[Any]]:
    """The ``sw_table_shape`` array of the tables `specs` (``(table, row_shape)``), and the
    row dimensions it points at (to be kept alive through the call). `vocab`: one for all
    the tables, or one per table."""
    vocabs = [vocab] * len(specs) if isinstance(vocab, int) else list(vocab)
    if len(vocabs) != len(specs):
        raise InvalidArgument(f"vocab has {len(vocabs)} values for {len(specs)} tables")
    code = code_of(dtype, "the rows")
    dims = [(C.c_uint64 * max(len(shape), 1))(*shape) for _, shape in specs]
    shapes = (_lib.TableShape * max(len(specs), 1))(*[
        _lib.TableShape(t, code, C.addressof(d), len(shape),
                        _lib.Partition(_PARTITIONS[partition], v))
        for (t, shape), d, v in zip(specs, dims, vocabs)])
    return shapes, dims


#: One table's part of a unique pull: its distinct ids, their rows, each position's index.
_UniquePart = tuple[npt.NDArray[np.uint64], npt.NDArray[Any], npt.NDArray[np.int64]]


def _unique_batches(batches: Any, arrays: Sequence[npt.NDArray[np.uint64]],
                    row_shapes: Sequence[tuple[int, ...]], dtype: np.dtype[Any]
                    ) -> list[_UniquePart]:
    """Fills the ``sw_unique_batch`` structs `batches` for a unique pull of `arrays` (a
    batch of ids per table) into new arrays, which it returns per table."""
    made = []
    for i, (a, shape) in enumerate(zip(arrays, row_shapes)):
        n = len(a)
        inverse = np.empty(n, dtype=np.int64)
        unique = np.empty(n, dtype=np.uint64)
        # Every distinct row is written (a failed PS's zeroed).
        out = np.empty((n, *shape), dtype=dtype)
        b = batches[i]
        b.ids, b.n = (address(a) if n else None), n
        b.inverse = address(inverse) if n else None
        b.unique = address(unique) if n else None
        b.data, b.byte_len = (address(out) if n else None), out.nbytes
        b.unique_len = 0
        made.append((unique, out, inverse))
    return made


def _unique_parts(made: list[_UniquePart], batches: Any) -> list[_UniquePart]:
    """After a unique pull: each table's distinct ids and rows, as many as it wrote."""
    return [(u[:b.unique_len], o[:b.unique_len], inv) for (u, o, inv), b in zip(made, batches)]


def _grad_batches(batches: Any, arrays: Sequence[npt.NDArray[np.uint64]],
                  grads: Sequence[npt.NDArray[Any]], tables: Sequence[int],
                  row_shapes: Sequence[tuple[int, ...]], dtype: np.dtype[Any]) -> None:
    """Fills the ``sw_table_batch`` structs `batches` for a push of each table's `grads`
    (checked: ``[len(ids), *row_shape]`` of `dtype`, C-contiguous: the caller's arrays are
    pointed at, not copied) of `arrays`."""
    if len(grads) != len(arrays):
        raise InvalidArgument(f"{len(grads)} gradient blocks for {len(arrays)} tables")
    for i, (a, g, shape) in enumerate(zip(arrays, grads, row_shapes)):
        g = contiguous(g, f"grads[{i}]")
        want = (len(a), *shape)
        if g.dtype != dtype or g.shape != want:
            raise InvalidArgument(f"grads[{i}] is {g.dtype}{list(g.shape)}, not "
                                  f"{dtype}{list(want)} (table {tables[i]})")
        b, n = batches[i], len(a)
        b.ids, b.n = (address(a) if n else None), n
        b.data, b.byte_len = (address(g) if n else None), g.nbytes


class ShardedTables:
    """Tables partitioned over the same PS tasks, from a worker: `tables` is a sequence of
    ``(table, row_shape)`` (``row_shape`` an int or a tuple), each of rows of `dtype`; a step
    takes one batch of ids per table (in that order), deduplicates and partitions each as
    `Sharded` does, and sends each PS **one** rows request carrying every table's ids it
    holds, all PS requests in flight at once: a step over T tables and P PS tasks is at
    most P requests each way, not T × P. `peers`, `job` and `partition` as for
    `Client.sharded`; `vocab` is the number of ids of each table for ``"div"`` (an int for
    all, or one per table). `wire_dtype` and `loss_scale` apply to every table, as
    `Sharded.set_wire_dtype` and `Sharded.set_loss_scale` say.

    A PS that fails fails its part alone (every table's rows at that PS): the exception
    raised names it and carries the step's report (``e.report``), the other parts' rows
    being written."""

    def __init__(self, client: Client, tables: Sequence[tuple[int, Union[int, Sequence[int]]]],
                 *, peers: Optional[Sequence[str]] = None, job: str = "ps",
                 dtype: Any = np.float32, partition: str = "mod",
                 vocab: Union[int, Sequence[int]] = 0, wire_dtype: Any = None,
                 loss_scale: Optional[float] = None) -> None:
        self._s = C.c_void_p()
        if partition not in _PARTITIONS:
            raise InvalidArgument(f"partition {partition!r} is not one of "
                                  f"{sorted(_PARTITIONS)}")
        specs = [(int(t), _row_shape(shape)) for t, shape in tables]
        names = list(peers) if peers is not None else client.runtime.peers(job)
        texts = [client.runtime._peer(p) for p in names]
        self.client = client
        #: The tables, and each one's row shape, in the order the batches are given.
        self.tables = [t for t, _ in specs]
        self.row_shapes = [shape for _, shape in specs]
        self.dtype = np.dtype(dtype)
        #: The PS tasks' addresses, in shard order.
        self.peers = [t.decode().rpartition("@")[2] for t in texts]
        shapes, _dims = _c_shapes(specs, self.dtype, partition, vocab)
        c_texts = (C.c_char_p * max(len(texts), 1))(*texts)
        check(_lib.sharded_tables_new(c_texts, len(texts), shapes, len(specs),
                                      C.byref(self._s)))
        # Reused by every step: the batches' structs and the report.
        self._batches = (_lib.TableBatch * len(specs))()
        self._unique_batches = (_lib.UniqueBatch * len(specs))()
        self._report = _lib.StepReport()
        self._report_ref = C.byref(self._report)
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
            raise Closed("the sharded tables are closed")
        return self._s

    def set_wire_dtype(self, wire_dtype: Any) -> None:
        """Every table's rows travel as `wire_dtype` from the next step on (as
        `Sharded.set_wire_dtype`)."""
        check(_lib.sharded_tables_set_wire_dtype(self._handle(),
                                                 wire_code(wire_dtype, self.dtype)))

    def set_loss_scale(self, loss_scale: Optional[float]) -> None:
        """Pushes of every table from the next one on are sent with `loss_scale` (as
        `Sharded.set_loss_scale`)."""
        value = loss_scale_value(loss_scale)
        check(_lib.sharded_tables_set_loss_scale(self._handle(), value))
        self._loss_scale = None if loss_scale is None else value

    @property
    def loss_scale(self) -> Optional[float]:
        """The loss scale pushes are sent with, or None."""
        return self._loss_scale

    def _ids(self, ids: Sequence[Any]) -> list[npt.NDArray[np.uint64]]:
        if len(ids) != len(self.tables):
            raise InvalidArgument(f"{len(ids)} batches of ids for {len(self.tables)} tables "
                                  f"({self.tables})")
        return [_row_ids(i) for i in ids]

    def _finish(self, code: int) -> StepReport:
        return _step_outcome(code, self._report, len(self.peers),
                             lambda i: _lib.sharded_tables_part(self._s, i))

    def pull(self, ids: Sequence[Any], timeout: Optional[float] = DEFAULT_TIMEOUT
             ) -> tuple[list[npt.NDArray[Any]], StepReport]:
        """The rows of each table's batch ``ids[t]`` (duplicates allowed; an empty batch
        takes no part), as new arrays ``[len(ids[t]), *row_shape]`` of `dtype`, and the
        step's report (``missing`` over all tables; rows a PS does not have are zero)."""
        s, c = self._handle(), self.client._handle()
        arrays = self._ids(ids)
        outs = []
        batches = self._batches
        for i, (a, shape) in enumerate(zip(arrays, self.row_shapes)):
            out = np.zeros((len(a), *shape), dtype=self.dtype)
            b = batches[i]
            n = len(a)
            b.ids, b.n = (address(a) if n else None), n
            b.data, b.byte_len = (address(out) if n else None), out.nbytes
            outs.append(out)
        self._report.failed = 0
        code = _lib.sharded_tables_pull(s, c, batches, len(arrays), _ms(timeout),
                                        self._report_ref)
        return outs, self._finish(code)

    def pull_unique(self, ids: Sequence[Any], timeout: Optional[float] = DEFAULT_TIMEOUT
                    ) -> tuple[list[tuple[npt.NDArray[np.uint64], npt.NDArray[Any],
                                          npt.NDArray[np.int64]]], StepReport]:
        """Each distinct id of each table's batch ``ids[t]`` pulled once, one request per
        PS for all the tables (as `Sharded.pull_unique` for one): per table ``(unique,
        rows, inverse)``, its distinct ids (grouped by PS task, each task's in the order
        first seen), their rows ``[len(unique), *row_shape]`` and, per position of
        ``ids[t]``, the index of its id in `unique` (int64), so that ``rows[inverse]`` is
        what `pull` gives; and the step's report."""
        s, c = self._handle(), self.client._handle()
        arrays = self._ids(ids)
        batches = self._unique_batches
        made = _unique_batches(batches, arrays, self.row_shapes, self.dtype)
        self._report.failed = 0
        code = _lib.sharded_tables_pull_unique(s, c, batches, len(arrays), _ms(timeout),
                                               self._report_ref)
        report = self._finish(code)
        return _unique_parts(made, batches), report

    def push(self, ids: Sequence[Any], grads: Sequence[npt.NDArray[Any]],
             timeout: Optional[float] = DEFAULT_TIMEOUT) -> StepReport:
        """Pushes each table's gradient rows ``grads[t]`` (``[len(ids[t]), *row_shape]``,
        C-contiguous, of `dtype`) of ``ids[t]``: each table's duplicates summed, one request
        per PS for all tables."""
        s, c = self._handle(), self.client._handle()
        arrays = self._ids(ids)
        batches = self._batches
        _grad_batches(batches, arrays, grads, self.tables, self.row_shapes, self.dtype)
        self._report.failed = 0
        code = _lib.sharded_tables_push(s, c, batches, len(arrays), _ms(timeout),
                                        self._report_ref)
        return self._finish(code)

    def close(self) -> None:
        """Frees the tables' client. Closing twice does nothing."""
        if self._s:
            _lib.sharded_tables_free(self._s)
            self._s = C.c_void_p()

    def __enter__(self) -> ShardedTables:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_s", None):
            self.close()
