"""Where the rows of `starwire.torch`'s modules come from and their gradients go: the one
interface they pull from and push to (`_Rows`), over the sharded rows client
(`_ShardedRows`, synchronous) or a `PipelineTables` (`_SharedPipeline`, of a pipelined
module's one table or a pipelined collection's tables; each table's view `_TableOfShared`).
It needs no torch: the modules hand it numpy arrays."""

from __future__ import annotations

from typing import Optional, Protocol, Union

import numpy as np
import numpy.typing as npt

from .client import Sharded, StepReport
from .errors import Closed, StarwireError
from .pipeline import PipelineReport, PipelineTables

#: No ids.
_NONE: npt.NDArray[np.uint64] = np.empty(0, dtype=np.uint64)


class _Rows(Protocol):
    """The one interface the modules pull rows from and push gradients to: the ids of a
    step (uint64, 1-D, duplicates allowed) in; their distinct ids, the ``[unique, dim]``
    float32 block (a new array the module keeps: the tensor it wraps uses its memory) and
    each position's index among them out, the deduplication done in Rust by the pull
    (`pull_unique`); the distinct ids' gradients of the block's shape back; the next pull's
    ids handed early (`prefetch`); everything in flight waited for (`flush`).
    `_ShardedRows` is the synchronous form, `_TableOfShared` the pipelined one (a table of
    a `starwire.PipelineTables`: pulls ahead, pushes in the background)."""

    @property
    def table(self) -> int: ...

    @property
    def dim(self) -> int: ...

    @property
    def last_report(self) -> Optional[Union[StepReport, PipelineReport]]: ...

    def pull_unique(self, ids: npt.NDArray[np.uint64]
                    ) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.float32],
                               npt.NDArray[np.int64]]: ...

    def push(self, ids: npt.NDArray[np.uint64], grads: npt.NDArray[np.float32]) -> None: ...

    def prefetch(self, ids: npt.NDArray[np.uint64]) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


class _ShardedRows:
    """A table's rows through the sharded rows client, synchronously: `pull` and `push`
    return when every PS task answered. Failures raise starwire's exceptions, with a note
    naming the table."""

    def __init__(self, sharded: Sharded, timeout: Optional[float]) -> None:
        self.sharded = sharded
        self.timeout = timeout
        #: The last pull's report (distinct ids, rows the PS tasks did not have).
        self.last_report: Optional[StepReport] = None

    @property
    def table(self) -> int:
        return self.sharded.table

    @property
    def dim(self) -> int:
        return self.sharded.row_shape[0]

    def _check_open(self, doing: str) -> None:
        runtime = self.sharded.client.runtime
        if not runtime._rt:
            raise Closed(f"cannot {doing} table {self.table}: the runtime of "
                         f"{runtime.job}:{runtime.task_index} is closed")

    def pull_unique(self, ids: npt.NDArray[np.uint64]
                    ) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.float32],
                               npt.NDArray[np.int64]]:
        """The distinct ids of `ids` (duplicates allowed), their ``[unique, dim]`` block
        and where each position's id is among them: the deduplication done in Rust by the
        pull itself."""
        self._check_open("pull the rows of")
        try:
            unique, rows, inverse, self.last_report = self.sharded.pull_unique(
                ids, timeout=self.timeout)
        except StarwireError as e:
            _note(e, f"while pulling the rows of {len(ids)} ids of table {self.table}")
            raise
        return unique, rows, inverse

    def push(self, ids: npt.NDArray[np.uint64], grads: npt.NDArray[np.float32]) -> None:
        if len(ids) == 0:
            return
        self._check_open("push gradients to")
        try:
            self.sharded.push(ids, grads, timeout=self.timeout)
        except StarwireError as e:
            _note(e, f"while pushing the gradients of {len(ids)} rows of table {self.table}")
            raise

    def prefetch(self, ids: npt.NDArray[np.uint64]) -> None:
        """Nothing to do: a synchronous pull asks when it is made."""

    def flush(self) -> None:
        """Nothing in flight: every push was answered before its backward returned."""

    def close(self) -> None:
        self.sharded.close()


class _SharedPipeline:
    """Pipelined tables through one `PipelineTables` (a pipelined module's one table, or a
    pipelined collection's tables): a step's pull of every table is one request per PS,
    and so is its push. Failures raise starwire's exceptions, with a note naming the
    tables."""

    def __init__(self, pipeline: PipelineTables) -> None:
        self.pipeline = pipeline
        #: The report of the last call's step.
        self.last_report: Optional[PipelineReport] = None
        #: No gradients, per table.
        self.empty = [np.zeros((0, *s), dtype=np.float32) for s in pipeline.row_shapes]

    def _tables(self) -> str:
        t = self.pipeline.tables
        return f"table {t[0]}" if len(t) == 1 else f"tables {t}"

    def _check_open(self, doing: str) -> None:
        runtime = self.pipeline.client.runtime
        if not runtime._rt:
            raise Closed(f"cannot {doing} {self._tables()}: the runtime of "
                         f"{runtime.job}:{runtime.task_index} is closed")

    def _named(self, ids: list[npt.NDArray[np.uint64]], unit: str) -> str:
        """The tables a call names: ``4 ids of table 1, 3 ids of table 2``."""
        return ", ".join(f"{len(i)} {unit} of table {t}"
                         for t, i in zip(self.pipeline.tables, ids) if len(i)) or "no ids"

    def pull_unique(self, ids: list[npt.NDArray[np.uint64]]
                    ) -> list[tuple[npt.NDArray[np.uint64], npt.NDArray[np.float32],
                                    npt.NDArray[np.int64]]]:
        """Each table's ids in (an empty array: none this step); per table its distinct
        ids, their block and each position's index among them out."""
        self._check_open("pull the rows of")
        try:
            parts, self.last_report = self.pipeline.pull_unique(ids)
        except StarwireError as e:
            _note(e, f"while pulling the rows of {self._named(ids, 'ids')}")
            raise
        return parts

    def push(self, ids: list[npt.NDArray[np.uint64]],
             grads: list[npt.NDArray[np.float32]]) -> None:
        self._check_open("push gradients to")
        try:
            self.last_report = self.pipeline.push(ids, grads)
        except StarwireError as e:
            _note(e, f"while pushing the gradients of {self._named(ids, 'rows')}")
            raise

    def prefetch(self, ids: list[npt.NDArray[np.uint64]]) -> None:
        self._check_open("prefetch the rows of")
        try:
            self.pipeline.prefetch(ids)
        except StarwireError as e:
            _note(e, f"while prefetching the rows of {self._named(ids, 'ids')}")
            raise

    def flush(self) -> None:
        self._check_open("flush the pushes to")
        try:
            self.pipeline.flush()
        except StarwireError as e:
            _note(e, f"while flushing the pushes to {self._tables()}")
            raise

    def close(self) -> None:
        self.pipeline.close()

    def alone(self, pos: int, ids: npt.NDArray[np.uint64]) -> list[npt.NDArray[np.uint64]]:
        """A step's batches with `ids` for table `pos`, none for the others."""
        if len(self.empty) == 1:
            return [ids]
        batches = [_NONE] * len(self.empty)
        batches[pos] = ids
        return batches


class _TableOfShared:
    """One table of a `_SharedPipeline`, as the one-table interface: a pipelined module's
    rows (its pipeline's only table), or a table of a pipelined collection called on its
    own (a step of the shared pipeline in which the other tables take no part). `pull`
    takes the rows `prefetch` requested (or requests them), `push` sends and returns, a
    push that failed after its call returned raises at the next call that finds it (with
    ``e.failed_pushes``)."""

    def __init__(self, shared: _SharedPipeline, pos: int) -> None:
        self.shared, self.pos = shared, pos

    @property
    def table(self) -> int:
        return self.shared.pipeline.tables[self.pos]

    @property
    def dim(self) -> int:
        return self.shared.pipeline.row_shapes[self.pos][0]

    @property
    def last_report(self) -> Optional[PipelineReport]:
        return self.shared.last_report

    def pull_unique(self, ids: npt.NDArray[np.uint64]
                    ) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.float32],
                               npt.NDArray[np.int64]]:
        return self.shared.pull_unique(self.shared.alone(self.pos, ids))[self.pos]

    def push(self, ids: npt.NDArray[np.uint64], grads: npt.NDArray[np.float32]) -> None:
        if len(self.shared.empty) == 1:
            self.shared.push([ids], [grads])
            return
        blocks = list(self.shared.empty)
        blocks[self.pos] = grads
        self.shared.push(self.shared.alone(self.pos, ids), blocks)

    def prefetch(self, ids: npt.NDArray[np.uint64]) -> None:
        self.shared.prefetch(self.shared.alone(self.pos, ids))

    def flush(self) -> None:
        self.shared.flush()

    def close(self) -> None:
        self.shared.close()


def _note(e: BaseException, text: str) -> None:
    """Adds `text` to the traceback of `e` (Python 3.11 and later)."""
    add = getattr(e, "add_note", None)
    if add is not None:
        add(text)
