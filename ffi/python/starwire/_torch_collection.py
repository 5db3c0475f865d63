"""`starwire.torch`'s `PSEmbeddingBagCollection`: several tables in one step (see
`starwire.torch`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence, Union

import numpy as np
import numpy.typing as npt
import torch
from torch import Tensor, nn

from ._embedding_rows import _note, _SharedPipeline, _TableOfShared
from ._torch_modules import (_NO_IDS, _WIRE_DTYPES, PSEmbeddingBag, _checked_options, _fill,
                             _flat_ids, _Lookup, _push_on_backward, _Sink, _take_grad,
                             _tasks_of)
from .client import DEFAULT_TIMEOUT, Client, StepReport
from .errors import Closed, InvalidArgument, StarwireError
from .pipeline import PipelineReport, PipelineSettings, PipelineTables
from .sharded_tables import ShardedTables

#: The most forwards of a synchronous collection whose gradients are awaited at once
#: (gradients accumulated over that many forwards before one backward are all pushed).
_STEPS_KEPT = 16

@dataclass(frozen=True)
class TableConfig:
    """One table of a `PSEmbeddingBagCollection`: its id on the PS tasks, its row size,
    how bags reduce, and optionally the bound of its ids."""

    table: int
    dim: int
    mode: str = "sum"
    num_embeddings: Optional[int] = None


#: Pushes every table's gradients of a step (an empty array: none of that table).
_PushAll = Callable[[list[npt.NDArray[np.uint64]], list[npt.NDArray[np.float32]]], None]


class _StepPush:
    """The gradients of one forward of a collection, pushed together (one request per PS
    for the tables whose gradients are there). Pushing in backward, they go
    once every block of the step has its gradient; a block that gets none by the next
    forward, `push_gradients`, `flush` or `close` leaves the others to be pushed by that
    call, and its own (if backward brings it later) by itself when it comes. Without a push
    in backward the blocks are kept, and those calls push the gradients backward
    accumulated on them; the next forward keeps the blocks with no gradient yet (their
    backward may come later), the others forget them."""

    def __init__(self, push: _PushAll, empty: list[npt.NDArray[np.float32]],
                 in_backward: bool) -> None:
        self.push, self.empty = push, empty
        self.ids: list[npt.NDArray[np.uint64]] = [_NO_IDS] * len(empty)
        self.grads = list(empty)
        self.blocks: list[Optional[Tensor]] = [None] * len(empty)
        #: Tables whose gradient is still to come, and those whose gradient came and is
        #: not pushed yet.
        self.waiting: set[int] = set()
        self.ready: set[int] = set()
        self.in_backward = in_backward

    def sink_of(self, pos: int) -> _Sink:
        """Where the forward hands table `pos`'s block."""
        self.waiting.add(pos)

        def keep(ids: npt.NDArray[np.uint64], block: Tensor) -> None:
            self.ids[pos], self.blocks[pos] = ids, block

        def hook(ids: npt.NDArray[np.uint64], block: Tensor) -> None:
            self.ids[pos] = ids
            _push_on_backward(block, arrived, ids)

        def arrived(ids: npt.NDArray[np.uint64], grad: npt.NDArray[np.float32]) -> None:
            self.grads[pos] = grad
            self.waiting.discard(pos)
            self.ready.add(pos)
            if not self.waiting:
                self.send(forget=False)
        return hook if self.in_backward else keep

    def send(self, forget: bool) -> bool:
        """Pushes the gradients that are there, in one request per PS; `forget`: the tables
        whose gradient has not come are given up (without a push in backward; with one,
        a gradient that comes later is pushed when it comes). Returns whether some are
        still to come."""
        if not self.in_backward:
            for pos in sorted(self.waiting):
                block = self.blocks[pos]
                g = None if block is None else _take_grad(block, clear=False)
                if g is not None:
                    self.grads[pos] = g
                    self.blocks[pos] = None
                    self.waiting.discard(pos)
                    self.ready.add(pos)
            if forget:
                self.blocks = [None] * len(self.blocks)
                self.waiting.clear()
        if self.ready:
            ready, self.ready = self.ready, set()
            ids = [i if pos in ready else _NO_IDS for pos, i in enumerate(self.ids)]
            grads = [g if pos in ready else e
                     for pos, (g, e) in enumerate(zip(self.grads, self.empty))]
            for pos in ready:
                self.grads[pos] = self.empty[pos]
            self.push(ids, grads)
        return bool(self.waiting)


class PSEmbeddingBagCollection(nn.Module):
    """Several `PSEmbeddingBag` tables in one step, by feature name: ``tables`` maps each
    feature to its `TableConfig`; the PS tasks, partition, staleness, wire dtype, loss
    scale and timeout are as for `PSEmbeddingBag` and shared by all. `forward(inputs,
    offsets, per_sample_weights)` takes, per feature (any of the collection's), its ids
    (1-D with ``offsets[name]``, or 2-D) and optional ``per_sample_weights[name]``, and
    returns a dict of ``[bags, dim]`` tensors.

    Every feature's input is checked and deduplicated before any request is sent. A
    step's pull of all its tables is ONE request per PS task, and so is its backward's
    push, sent once every table's block has its gradient (`last_report` is the step's
    pull's report, pipelined the step's): synchronous (``staleness=0``, not pipelined) through
    `starwire.ShardedTables`, pipelined through one `starwire.PipelineTables` for all the
    tables (its staleness bound and ``max_pushes_in_flight`` count a step's push of every
    table as one; each table has a row cache of ``cache_bytes``). With
    ``push_in_backward=False`` backward only accumulates the gradients and
    `push_gradients` (or the next forward) pushes them, in one request per PS task. The bags are ``self.bags[name]`` (their markers are the
    collection's `state_dict`). `prefetch`, `flush` and `close` act on every table.
    """

    def __init__(self, client: Client, tables: Mapping[str, TableConfig], *,
                 peers: Optional[Sequence[str]] = None, job: str = "ps",
                 partition: str = "mod", staleness: int = 0, wire_dtype: Any = torch.float32,
                 timeout: Optional[float] = DEFAULT_TIMEOUT, pipelined: Optional[bool] = None,
                 max_pushes_in_flight: int = 2, loss_scale: Optional[float] = None,
                 push_in_backward: bool = True, cache_bytes: int = 0) -> None:
        super().__init__()
        if not tables:
            raise InvalidArgument("a collection of no tables")
        seen: dict[int, str] = {}
        for name, cfg in tables.items():
            if not isinstance(cfg, TableConfig):
                raise InvalidArgument(f"feature {name!r}: {cfg!r} is not a TableConfig")
            if cfg.table in seen:
                raise InvalidArgument(f"features {seen[cfg.table]!r} and {name!r} both name "
                                      f"table {cfg.table}")
            seen[cfg.table] = name
        wire = _checked_options(staleness, wire_dtype, loss_scale, push_in_backward)
        if pipelined is None:
            pipelined = staleness > 0
        tasks = _tasks_of(client, peers, job)
        configs = list(tables.values())
        #: Pipelined: every table's rows through one `PipelineTables`.
        self._shared: Optional[_SharedPipeline] = None
        if pipelined:
            if isinstance(cache_bytes, bool) or not isinstance(cache_bytes, int) \
                    or cache_bytes < 0:
                raise InvalidArgument(f"cache_bytes {cache_bytes!r} is not an int of 0 or "
                                      "more (the bytes of each table's row cache; 0: none)")
            settings = PipelineSettings(staleness, max_pushes_in_flight, timeout,
                                        _WIRE_DTYPES[wire], loss_scale, cache_bytes)
            self._shared = _SharedPipeline(PipelineTables(
                client, [(cfg.table, cfg.dim) for cfg in configs], peers=tasks,
                dtype=np.float32, partition=partition,
                vocab=[cfg.num_embeddings or 0 for cfg in configs], settings=settings))
        try:
            self.bags = nn.ModuleDict({
                name: PSEmbeddingBag(client, cfg.table, cfg.dim, cfg.mode, peers=tasks,
                                     job=job, partition=partition,
                                     num_embeddings=cfg.num_embeddings, staleness=staleness,
                                     wire_dtype=wire_dtype, timeout=timeout,
                                     pipelined=pipelined,
                                     max_pushes_in_flight=max_pushes_in_flight,
                                     loss_scale=loss_scale, push_in_backward=push_in_backward,
                                     cache_bytes=cache_bytes,
                                     _rows=None if self._shared is None
                                     else _TableOfShared(self._shared, pos))
                for pos, (name, cfg) in enumerate(tables.items())})
        except BaseException:
            if self._shared is not None:
                self._shared.close()
            raise
        self._client, self.timeout = client, timeout
        self._in_backward = push_in_backward
        #: The last synchronous forward's pull of all its tables.
        self._last_pull: Optional[StepReport] = None
        self._pos = {name: i for i, name in enumerate(tables)}
        #: Each table's position, by its module.
        self._bag_pos = {id(bag): i for i, bag in enumerate(self.bags.values())}
        self._tables: Optional[ShardedTables] = None
        #: The forwards whose gradients are not all pushed (at most `_STEPS_KEPT`).
        self._pending: list[_StepPush] = []
        #: Pipelined: the next batch's unique ids per table (`PrefetchingLoader`),
        #: requested right after the next pull.
        self._next: Optional[list[npt.NDArray[np.uint64]]] = None
        self._empty = [np.zeros((0, cfg.dim), dtype=np.float32) for cfg in configs]
        if not pipelined:
            self._tables = ShardedTables(
                client, [(cfg.table, cfg.dim) for cfg in configs], peers=tasks,
                partition=partition, vocab=[cfg.num_embeddings or 0 for cfg in configs],
                wire_dtype=_WIRE_DTYPES[wire], loss_scale=loss_scale)

    @property
    def last_report(self) -> Optional[Union[StepReport, PipelineReport]]:
        """Synchronous: the last forward's pull of all its tables. Pipelined: the report of
        the step of all the tables as the last call left it (after the backward's push,
        the whole step's: visible and waited seconds, bytes, prefetched parts)."""
        if self._shared is not None:
            return self._shared.last_report
        return self._last_pull

    def _bag(self, name: str) -> PSEmbeddingBag:
        if name not in self.bags:
            raise InvalidArgument(f"feature {name!r} is not one of the collection's "
                                  f"({', '.join(self.bags.keys())})")
        bag = self.bags[name]
        assert isinstance(bag, PSEmbeddingBag)
        return bag

    def _each(self) -> Iterator[PSEmbeddingBag]:
        for name in self.bags.keys():
            yield self._bag(name)

    def prefetch(self, inputs: Mapping[str, Tensor]) -> None:
        """Requests the rows of the features' ids `inputs` (as a later forward takes them)
        now: pipelined, in one request per PS task for all the tables (a table not in
        `inputs` takes no part), taken by the next forward of the same ids."""
        lookups = [(self._bag(name), self._bag(name)._lookup(input, f"inputs[{name!r}]"))
                   for name, input in inputs.items()]
        if self._shared is None:
            for bag, lookup in lookups:
                bag._prefetch(_flat_ids(lookup.ids))
            return
        self._shared.prefetch(self._batches((bag, _flat_ids(lookup.ids))
                                            for bag, lookup in lookups))

    def _batches(self, given: Any) -> list[npt.NDArray[np.uint64]]:
        """Each table's ids from the ``(bag, ids)`` pairs `given` (none for the others)."""
        batches = [_NO_IDS] * len(self._pos)
        for bag, ids in given:
            batches[self._bag_pos[id(bag)]] = ids
        return batches

    def _stage(self, given: Sequence[tuple[nn.Module, npt.NDArray[np.uint64]]]) -> None:
        """`PrefetchingLoader`: the next batch's ids, requested right after the next
        forward's pull (pipelined)."""
        assert self._shared is not None
        self._next = self._batches(given)

    def _prefetch_staged(self) -> None:
        """`PrefetchingLoader`: the next batch's rows requested now, when no forward took
        the staged ids."""
        if self._next is not None and self._shared is not None:
            staged, self._next = self._next, None
            self._shared.prefetch(staged)

    def _send_pending(self, forget: bool = True) -> None:
        """Pushes the gradients of earlier forwards that are there; keeps (unless `forget`)
        the forwards some of whose gradients are still to come, the last `_STEPS_KEPT`."""
        pending, self._pending = self._pending, []
        for i, p in enumerate(pending):
            try:
                if p.send(forget) and not forget:
                    self._pending.append(p)
            except BaseException:
                self._pending.extend(pending[i + 1:])
                raise
        del self._pending[:-_STEPS_KEPT]

    def push_gradients(self) -> None:
        """Pushes the gradients of the last forward's tables not pushed yet
        (`PSEmbeddingBag.push_gradients`): with ``push_in_backward=False``, call it after
        ``loss.backward()`` (synchronous, one request per PS for all the tables); pushing
        in backward, it pushes those of a step some of whose blocks got no gradient."""
        self._send_pending()
        for bag in self._each():
            bag.push_gradients()

    def flush(self) -> None:
        """Pushes the gradients not pushed yet (`push_gradients`) and waits for every
        table's pushes (`PSEmbeddingBag.flush`)."""
        self._send_pending()
        if self._shared is None:
            for bag in self._each():
                bag.flush()
            return
        for bag in self._each():
            bag.push_gradients()
        self._shared.flush()

    def close(self) -> None:
        """Waits for and frees every table's client (`PSEmbeddingBag.close`)."""
        try:
            self._send_pending()
        finally:
            if self._tables is not None:
                self._tables.close()
            for bag in self._each():
                bag.close()

    def _push_all(self, ids: list[npt.NDArray[np.uint64]],
                  grads: list[npt.NDArray[np.float32]]) -> None:
        """Pushes every table's gradients of a step in one request per PS."""
        if self._shared is not None:
            self._shared.push(ids, grads)
            return
        assert self._tables is not None
        try:
            self._tables.push(ids, grads, timeout=self.timeout)
        except StarwireError as e:
            _note(e, "while pushing the gradients of tables "
                     f"{[t for t, i in zip(self._tables.tables, ids) if len(i)]}")
            raise

    def _pull_all(self, steps: list[tuple[str, PSEmbeddingBag, _Lookup, Optional[Tensor]]]
                  ) -> Optional[_StepPush]:
        """Pulls every step's rows in one request per PS; the push of the step's gradients
        when autograd records."""
        # The earlier forwards' gradients go first: the rows are those of pushing at once.
        self._send_pending(forget=False)
        # Each table's checked ids, deduplicated by the pull (in Rust); none for a table
        # not in the step.
        ids = [_NO_IDS] * len(self._pos)
        for name, _, lookup, _ in steps:
            ids[self._pos[name]] = _flat_ids(lookup.ids)
        if self._shared is not None:
            parts = self._shared.pull_unique(ids)
            for name, _, lookup, _ in steps:
                _fill(lookup, *parts[self._pos[name]])
            # The next batch's rows are requested now that this step's are taken.
            self._prefetch_staged()
        else:
            self._pull_unique(steps, ids)
        if not torch.is_grad_enabled():
            return None
        step = _StepPush(self._push_all, self._empty, self._in_backward)
        self._pending.append(step)
        return step

    def _pull_unique(self, steps: list[tuple[str, PSEmbeddingBag, _Lookup, Optional[Tensor]]],
                     ids: list[npt.NDArray[np.uint64]]) -> None:
        """The synchronous pull of every table's `ids`, deduplicated in Rust."""
        tables = self._tables
        assert tables is not None
        runtime = self._client.runtime
        if not runtime._rt:
            raise Closed(f"cannot pull the rows of tables {tables.tables}: the runtime of "
                         f"{runtime.job}:{runtime.task_index} is closed")
        try:
            parts, self._last_pull = tables.pull_unique(ids, timeout=self.timeout)
        except StarwireError as e:
            _note(e, f"while pulling the rows of tables {tables.tables}")
            raise
        for name, _, lookup, _ in steps:
            _fill(lookup, *parts[self._pos[name]])

    def forward(self, inputs: Mapping[str, Tensor],
                offsets: Optional[Mapping[str, Tensor]] = None,
                per_sample_weights: Optional[Mapping[str, Tensor]] = None
                ) -> dict[str, Tensor]:
        offsets = offsets or {}
        weights = per_sample_weights or {}
        for name in (*offsets, *weights):
            if name not in inputs:
                raise InvalidArgument(f"feature {name!r} has offsets or weights but no input")
        steps = []
        for name, input in inputs.items():
            bag = self._bag(name)
            lookup, offs = bag._bags(input, offsets.get(name), weights.get(name))
            steps.append((name, bag, lookup, offs))
        if not steps:
            return {}
        push = self._pull_all(steps)
        return {name: bag._reduce(lookup, offs, weights.get(name),
                                  push.sink_of(self._pos[name]) if push else None)
                for name, bag, lookup, offs in steps}

    def checkpoint(self, timeout: Optional[float] = None) -> list[dict[str, Any]]:
        """Asks each PS task of the collection's tables, once each, to save the tables it
        serves (`Client.checkpoint`; all at once) and returns their manifests. The
        gradients not pushed yet are pushed and every push answered first (`flush`)."""
        self.flush()
        first = self._bag(next(iter(self.bags.keys())))
        tasks = list(dict.fromkeys(t for b in self.bags.values()
                                   for t in getattr(b, "tasks")))
        pending = [first._client.submit_checkpoint(t, timeout) for t in tasks]
        return [p.wait() for p in pending]
