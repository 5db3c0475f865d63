"""`PsTable`: starwire's PS table of embedding rows, served in Rust (no Python runs per
request): rows and their optimizer state in huge-page memory, a lock-free index, eviction,
checkpoints, metrics. A runtime serves it (``Runtime(tables={1: table})``); this module
makes, saves, loads, measures and maintains it.
"""

from __future__ import annotations

import ctypes as C
import math
import os
from dataclasses import dataclass, field
from typing import Any, Literal, Optional, Union, overload

import numpy as np
import numpy.typing as npt

from . import _lib
from ._arrays import address
from .errors import Closed, InvalidArgument, check

#: Element formats: the name, and its wire dtype code.
FORMATS = {"f32": 10, "bf16": 7, "f16": 6}
_INITS = {"zeros": 0, "uniform": 1, "normal": 2, "truncated_normal": 3}
_OPTIMIZERS = {"sgd": 0, "adagrad": 1, "adam": 2}
_CREATE = {"on_pull_or_push": 0, "on_push": 1, "never": 2}
_CONSISTENCY = {"hogwild": 0, "per_row": 1}
#: Most elements per row, and most ticks of `evict_untouched`.
MAX_DIM = 1 << 20
MAX_EVICT_TICKS = (1 << 15) - 1
_U32, _U64 = (1 << 32) - 1, (1 << 64) - 1


@dataclass
class SaveReport:
    """What `PsTable.save` wrote: the file, its rows and bytes, the seconds it took (of
    which in write calls, and waiting for the disk), and whether rows went to the disk
    around the page cache (``O_DIRECT``)."""

    path: str
    rows: int
    bytes: int
    seconds: float
    writing_seconds: float
    syncing_seconds: float
    direct_io: bool


@dataclass
class HotId:
    """An id among a table's hottest, and how often it was sampled (about its pulls and
    pushes over `TableMetrics.hot_sample_every`, since the counts last halved in
    `PsTable.maintain`)."""

    id: int
    sampled: int


@dataclass
class TableMetrics:
    """A table's counters and state at one moment (see ``sw_table_metrics`` in the C
    header). Counters count from the table's creation; `rows`, the bytes and `clock` are
    the state when read; `hot` the hottest ids sampled, hottest first."""

    rows: int = 0
    data_bytes: int = 0
    memory_bytes: int = 0
    committed_bytes: int = 0
    index_capacity: int = 0
    pulls: int = 0
    pushes: int = 0
    pulled_rows: int = 0
    missing: int = 0
    pushed_rows: int = 0
    dropped_pushes: int = 0
    created: int = 0
    loaded: int = 0
    not_admitted: int = 0
    refused: int = 0
    evicted_untouched: int = 0
    evicted_over_cap: int = 0
    index_builds: int = 0
    clock: int = 0
    hot_sample_every: int = 0
    hot: list[HotId] = field(default_factory=list)


@dataclass
class MaintainReport:
    """What one `PsTable.maintain` did."""

    index_steps: int = 0
    slots_reused: int = 0
    slots_waiting: int = 0
    evicted_untouched: int = 0
    evicted_over_cap: int = 0


@dataclass
class LoadReport:
    """What `PsTable.load_rows` did: rows created, rows overwritten."""

    created: int = 0
    overwritten: int = 0


def checkpoint_file(table_id: int) -> str:
    """The file name of table `table_id`'s checkpoint in a checkpoint folder
    (``table-<id>.swrows``)."""
    out = C.create_string_buffer(32)
    check(_lib.checkpoint_file(_int(table_id, "table_id", 0, _U32), out, len(out)))
    return out.value.decode()


def _int(v: Any, what: str, low: int, high: int) -> int:
    """`v` as an int in ``low..=high``, else `InvalidArgument` naming `what`."""
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise InvalidArgument(f"{what} must be an int, not {type(v).__name__}")
    n = int(v)
    if not low <= n <= high:
        raise InvalidArgument(f"{what} {n} is not {low} to {high}")
    return n


def _float(v: Any, what: str, *, low: float = -math.inf, above: Optional[float] = None,
           below: Optional[float] = None) -> float:
    """`v` as a finite float, at least `low`, above `above`, below `below`."""
    try:
        x = float(v)
    except (TypeError, ValueError):
        raise InvalidArgument(f"{what} must be a number, not {type(v).__name__}") from None
    if not math.isfinite(x) or x < low or (above is not None and x <= above) or (
            below is not None and x >= below):
        bounds = []
        if low > -math.inf:
            bounds.append(f"at least {low}")
        if above is not None:
            bounds.append(f"above {above}")
        if below is not None:
            bounds.append(f"below {below}")
        limits = ", ".join(["finite", *bounds])
        raise InvalidArgument(f"{what} {v!r} is not a {limits} number")
    return x


def _choice(v: str, what: str, choices: dict[str, int]) -> int:
    if v not in choices:
        raise InvalidArgument(f"{what} {v!r} is not one of {', '.join(choices)}")
    return choices[v]


def _config(dim: int, table_id: int, stored: str, served: str, init: str, scale: float,
            seed: int, optimizer: str, lr: float, initial_accumulator: float, beta1: float,
            beta2: float, epsilon: float, create: str, admit_after: int,
            admission_counters: int, evict_untouched: Optional[int], max_rows: Optional[int],
            capacity: int, consistency: str, row_locks: int, huge_pages: bool,
            hot_sample_every: int, checkpoint_direct_io: bool) -> _lib.PsTableConfig:
    """The C config of these settings, checked here first (the library checks again)."""
    c: _lib.PsTableConfig = _lib.ps_table_config_default(_int(dim, "dim", 1, MAX_DIM))
    c.table_id = _int(table_id, "table_id", 0, _U32)
    c.stored = _choice(stored, "stored", FORMATS)
    c.served = _choice(served, "served", FORMATS)
    if served not in ("f32", stored):
        raise InvalidArgument(f"rows stored as {stored} are served as f32 or {stored}, not "
                              f"{served}")
    c.init.kind = _choice(init, "init", _INITS)
    c.init.scale = _float(scale, "scale", low=0.0)
    c.init.seed = _int(seed, "seed", 0, _U64)
    c.optimizer.kind = _choice(optimizer, "optimizer", _OPTIMIZERS)
    c.optimizer.lr = _float(lr, "lr")
    if optimizer == "adagrad":
        c.optimizer.initial_accumulator = _float(initial_accumulator, "initial_accumulator",
                                                 above=0.0)
    if optimizer == "adam":
        c.optimizer.beta1 = _float(beta1, "beta1", low=0.0, below=1.0)
        c.optimizer.beta2 = _float(beta2, "beta2", low=0.0, below=1.0)
        c.optimizer.epsilon = _float(epsilon, "epsilon", above=0.0)
    c.create = _choice(create, "create", _CREATE)
    c.admit_after = _int(admit_after, "admit_after", 1, 255)
    c.admission_counters = _int(admission_counters, "admission_counters", 128 if
                                admit_after > 1 else 0, _U64)
    c.evict_untouched = 0 if evict_untouched is None else _int(
        evict_untouched, "evict_untouched", 1, MAX_EVICT_TICKS)
    c.max_rows = 0 if max_rows is None else _int(max_rows, "max_rows", 1, _U32 - 2)
    c.capacity = _int(capacity, "capacity", 0, _U64)
    c.consistency = _choice(consistency, "consistency", _CONSISTENCY)
    c.row_locks = _int(row_locks, "row_locks", 1 if consistency == "per_row" else 0, _U32)
    c.huge_pages = bool(huge_pages)
    c.hot_sample_every = _int(hot_sample_every, "hot_sample_every", 0, _U32)
    c.checkpoint_direct_io = bool(checkpoint_direct_io)
    return c


class PsTable:
    """starwire's PS table: rows of `dim` elements, stored as `stored` (``"f32"``,
    ``"bf16"`` or ``"f16"``: half the memory) and served as `served` (``"f32"``, or the
    stored format), served in Rust from every loop at once. Give it to a runtime under its
    `table_id`: ``Runtime("ps", listen=..., tables={1: PsTable(16, table_id=1)})``.

    Settings (keywords, as ``PsTableBuilder``'s in Rust; checked here, bad ones raise
    `InvalidArgument` naming the argument):

    - `init`: new rows' values, ``"zeros"``, ``"uniform"`` (in ``[-scale, scale]``),
      ``"normal"`` or ``"truncated_normal"`` (standard deviation `scale`), a fixed function
      of (table id, row id, element, `seed`): every PS task and every run agree.
    - `optimizer`: ``"sgd"`` (``w -= lr * g``), ``"adagrad"`` (`initial_accumulator` above
      0) or ``"adam"`` (`beta1`, `beta2`, `epsilon`; a step count per row).
    - `create`: which calls create the row of an unknown id: ``"on_pull_or_push"``,
      ``"on_push"`` (a pull answers it missing) or ``"never"`` (rows come from
      `load_rows` and checkpoints only); `admit_after`: sightings of an id before its row
      is created (1: at once), counted in `admission_counters` bytes.
    - `evict_untouched`: `maintain` evicts rows not touched for this many ticks of the
      table's clock (`advance_clock`); `max_rows`: the row cap (at it new rows are
      refused; over 95 % of it `maintain` evicts the least recently touched down to 90 %).
    - `capacity`: rows expected (the index is sized for them); `consistency`:
      ``"hogwild"`` (no lock) or ``"per_row"`` (a lock per row for pushes, among
      `row_locks`); `huge_pages`: advise transparent huge pages; `hot_sample_every`: one
      row in this many sampled for the hottest ids (0: off); `checkpoint_direct_io`:
      `save` writes around the page cache where it can.

    A runtime serving the table keeps it alive on its own: `close` drops this handle only.
    """

    def __init__(self, dim: int, *, table_id: int = 0, stored: str = "f32",
                 served: str = "f32", init: str = "zeros", scale: float = 0.0, seed: int = 0,
                 optimizer: str = "sgd", lr: float = 0.01, initial_accumulator: float = 0.1,
                 beta1: float = 0.9, beta2: float = 0.999, epsilon: float = 1e-8,
                 create: str = "on_pull_or_push", admit_after: int = 1,
                 admission_counters: int = 1 << 20, evict_untouched: Optional[int] = None,
                 max_rows: Optional[int] = None, capacity: int = 0,
                 consistency: str = "hogwild", row_locks: int = 1 << 14,
                 huge_pages: bool = True, hot_sample_every: int = 128,
                 checkpoint_direct_io: bool = True) -> None:
        self._t = C.c_void_p()
        self._config = _config(dim, table_id, stored, served, init, scale, seed, optimizer,
                               lr, initial_accumulator, beta1, beta2, epsilon, create,
                               admit_after, admission_counters, evict_untouched, max_rows,
                               capacity, consistency, row_locks, huge_pages,
                               hot_sample_every, checkpoint_direct_io)
        self._describe(stored, served)
        self._open(None)

    @classmethod
    def load(cls, dir: Union[str, os.PathLike[str]], dim: int, *, missing_ok: bool = False,
             **settings: Any) -> PsTable:
        """The table of these settings (as for `PsTable`) holding the rows of its checkpoint
        in folder `dir` (the file `checkpoint_file` names for its `table_id`, written by
        `save`), and its clock. The optimizer's parameters are these settings'; the file's
        shape must be theirs. Raises a `CheckpointError` subclass naming the file and what
        is wrong (`CheckpointIoError` when there is no such file), having built no table;
        with `missing_ok`, a folder without the file gives an empty table instead."""
        table = cls.__new__(cls)
        table._t = C.c_void_p()
        table._config = _config(dim, **{**_DEFAULTS, **_known(settings)})
        table._describe(settings.get("stored", "f32"), settings.get("served", "f32"))
        path = os.path.join(os.fspath(dir), checkpoint_file(table.table_id))
        table._open(None if missing_ok and not os.path.exists(path) else os.fspath(dir))
        return table

    def _describe(self, stored: str, served: str) -> None:
        self.dim = int(self._config.dim)
        self.table_id = int(self._config.table_id)
        self.stored, self.served = stored, served
        #: The numpy dtype of rows as served (bfloat16 has none: its bits as uint16).
        self.dtype = np.dtype({"f32": np.float32, "f16": np.float16,
                               "bf16": np.uint16}[served])
        self.row_shape = (self.dim,)

    def _open(self, dir: Optional[str]) -> None:
        if dir is None:
            check(_lib.ps_table_new(C.byref(self._config), C.byref(self._t)))
        else:
            check(_lib.ps_table_load(C.byref(self._config), dir.encode(), C.byref(self._t)))
        self.state_len = int(_lib.ps_table_state_len(self._t))

    def _handle(self) -> C.c_void_p:
        if not self._t:
            raise Closed(f"PS table {self.table_id} was closed")
        return self._t

    def _table_handle(self) -> int:
        """The ``sw_table`` a runtime serves (valid while this handle is open)."""
        return int(_lib.ps_table_as_table(self._handle()) or 0)

    def __len__(self) -> int:
        """Rows stored."""
        return int(_lib.ps_table_len(self._handle()))

    @property
    def clock(self) -> int:
        """The table's clock: the ticks `evict_untouched` counts."""
        return int(_lib.ps_table_clock(self._handle()))

    def advance_clock(self) -> int:
        """Advances the clock by one tick (per step, per minute: the trainer's choice);
        the new value."""
        return int(_lib.ps_table_advance_clock(self._handle()))

    def save(self, dir: Union[str, os.PathLike[str]]) -> SaveReport:
        """Saves the table into folder `dir` (created if missing) as
        ``checkpoint_file(table_id)``, atomically, while runtimes go on serving it (rows
        pushed meanwhile may be saved before or after). Raises `CheckpointIoError` naming
        the file and the step that failed (no file is then left in its place)."""
        d = os.fspath(dir)
        r = _lib.SaveReport()
        check(_lib.ps_table_save(self._handle(), d.encode(), C.byref(r)))
        return SaveReport(os.path.join(d, checkpoint_file(self.table_id)), int(r.rows),
                          int(r.bytes), float(r.seconds), float(r.writing_seconds),
                          float(r.syncing_seconds), bool(r.direct_io))

    def report(self) -> str:
        """One line saying how the table is laid out and what it got from the kernel (huge
        pages), for a PS's start-up output."""
        out = C.c_void_p()
        check(_lib.ps_table_report(self._handle(), C.byref(out)))
        try:
            return C.string_at(out).decode()
        finally:
            _lib.string_free(out)

    def metrics(self, hot: int = 16) -> TableMetrics:
        """The counters and state now, with the `hot` hottest ids sampled."""
        m = _lib.TableMetrics()
        room = (_lib.HotId * max(hot, 1))()
        n = C.c_size_t()
        check(_lib.ps_table_metrics(self._handle(), C.byref(m), room,
                                    _int(hot, "hot", 0, _U32), C.byref(n)))
        counters = {name: int(getattr(m, name)) for name in _lib.TABLE_METRICS}
        return TableMetrics(**counters, hot_sample_every=int(m.hot_sample_every),
                            hot=[HotId(int(h.id), int(h.sampled)) for h in room[:n.value]])

    def maintain(self) -> MaintainReport:
        """Upkeep off the row path, while runtimes serve the table: finishes index work,
        reuses the slots of evicted rows, evicts (`evict_untouched`, `max_rows`), halves the
        hot-id counts. A runtime serving the table runs it on a thread of its own every
        ``STARWIRE_TABLE_UPKEEP_MS`` (1 s by default); call it for a table no runtime
        serves, or to see what a pass does."""
        r = _lib.MaintainReport()
        check(_lib.ps_table_maintain(self._handle(), C.byref(r)))
        return MaintainReport(**{name: int(getattr(r, name)) for name in _lib.MAINTAIN_REPORT})

    def load_rows(self, ids: Any, rows: Any, state: Any = None) -> LoadReport:
        """Writes rows by id: ``rows[i]`` (``[len(ids), dim]``, converted to float32)
        becomes the row of ``ids[i]``, created if absent whatever `create` says, or
        overwritten. With `state` (``[len(ids), state_len]``) the optimizer state is set
        too; without, a created row gets the initial state and an existing one keeps its
        own. Raises `InvalidArgument` for arrays of the wrong shape (nothing written), or
        `TableFull` when the table refused a new row (the rows before it were written)."""
        id_arr = _ids(ids)
        values = _rows(rows, "rows", len(id_arr), self.dim)
        st = None if state is None else _rows(state, "state", len(id_arr), self.state_len)
        r = _lib.LoadReport()
        check(_lib.ps_table_load_rows(
            self._handle(), address(id_arr) if len(id_arr) else None, len(id_arr),
            address(values) if values.size else None, values.size,
            address(st) if st is not None and st.size else None,
            0 if st is None else st.size, C.byref(r)))
        return LoadReport(int(r.created), int(r.overwritten))

    @overload
    def export_rows(self, ids: Any, *, state: Literal[False] = False
                    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.uint32]]: ...

    @overload
    def export_rows(self, ids: Any, *, state: Literal[True]
                    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.uint32],
                               npt.NDArray[np.float32]]: ...

    def export_rows(self, ids: Any, *, state: bool = False) -> Any:
        """Reads rows by id, creating nothing: ``(rows, missing)``, `rows` float32
        ``[len(ids), dim]`` and `missing` the positions of the ids without a row (their
        rows are zero); with ``state=True``, ``(rows, missing, state)``, `state`
        ``[len(ids), state_len]`` the optimizer state."""
        id_arr = _ids(ids)
        n = len(id_arr)
        values = np.zeros((n, self.dim), dtype=np.float32)
        st = np.zeros((n, self.state_len), dtype=np.float32) if state else None
        missing = np.zeros(n, dtype=np.uint32)
        count = C.c_size_t()
        check(_lib.ps_table_export_rows(
            self._handle(), address(id_arr) if n else None, n,
            address(values) if values.size else None, values.size,
            address(st) if st is not None and st.size else None,
            0 if st is None else st.size, address(missing) if n else None, C.byref(count)))
        if st is not None:
            return values, missing[:count.value], st
        return values, missing[:count.value]

    def close(self) -> None:
        """Drops this handle (runtimes serving the table keep serving it)."""
        if self._t:
            _lib.ps_table_free(self._t)
            self._t = C.c_void_p()

    def __enter__(self) -> PsTable:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_t", None):
            self.close()

    def __repr__(self) -> str:
        return (f"PsTable(table {self.table_id}, {self.dim} x {self.stored}, "
                f"{'closed' if not self._t else f'{len(self)} rows'})")


#: `PsTable`'s keyword defaults, for `PsTable.load`.
_DEFAULTS: dict[str, Any] = {
    "table_id": 0, "stored": "f32", "served": "f32", "init": "zeros", "scale": 0.0,
    "seed": 0, "optimizer": "sgd", "lr": 0.01, "initial_accumulator": 0.1, "beta1": 0.9,
    "beta2": 0.999, "epsilon": 1e-8, "create": "on_pull_or_push", "admit_after": 1,
    "admission_counters": 1 << 20, "evict_untouched": None, "max_rows": None,
    "capacity": 0, "consistency": "hogwild", "row_locks": 1 << 14, "huge_pages": True,
    "hot_sample_every": 128, "checkpoint_direct_io": True,
}


def _known(settings: dict[str, Any]) -> dict[str, Any]:
    """`settings`, each a `PsTable` keyword, else `InvalidArgument`."""
    unknown = sorted(set(settings) - set(_DEFAULTS))
    if unknown:
        raise InvalidArgument(f"unknown PsTable setting {', '.join(unknown)}")
    return settings


def _ids(ids: Any) -> npt.NDArray[np.uint64]:
    a = np.ascontiguousarray(ids, dtype=np.uint64)
    if a.ndim != 1:
        raise InvalidArgument(f"ids must be 1-D, not of shape {a.shape}")
    return a


def _rows(rows: Any, what: str, n: int, width: int) -> npt.NDArray[np.float32]:
    a = np.ascontiguousarray(rows, dtype=np.float32)
    if a.shape != (n, width):
        raise InvalidArgument(f"{what} has shape {a.shape}, not ({n}, {width})")
    return a
