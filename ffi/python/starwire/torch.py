"""Embedding modules for PyTorch whose rows live on PS tasks: `PSEmbedding`,
`PSEmbeddingBag` and `PSEmbeddingBagCollection`, drop-in for ``nn.Embedding`` and
``nn.EmbeddingBag`` in a trainer's model. (Only ``import starwire.torch`` imports torch; the
rest of the package does not need it.)

Each forward deduplicates the batch's ids, pulls the unique rows through the sharded rows
client (one request per PS task, all in flight at once; a synchronous module's or
collection's pull deduplicates in Rust, `starwire.Sharded.pull_unique` or
`starwire.ShardedTables.pull_unique`, pipelined ones use ``torch.unique`` with the
inverse), wraps the ``[unique, dim]`` block it was received into as a tensor without a
copy (``torch.from_numpy``), and builds the output with ``F.embedding`` / ``F.embedding_bag``
over that block and the inverse indices. Autograd then gives the gradient of the block,
``[unique, dim]`` with the gradients of duplicate ids already summed, and the backward
pushes it to the PS tasks, whose optimizer applies it (a `PsTable` with
``optimizer="sgd"`` does ``w -= lr * g``). The rows are therefore not parameters: the
trainer's ``torch.optim`` optimizer sees only the dense parameters. With
``push_in_backward=False`` backward runs no Python for the rows (the gradient only
accumulates on the block) and the gradients go at ``push_gradients()``, which the trainer
calls after ``loss.backward()`` (or, at the latest, the next forward, before its pull).

With ``staleness=0`` (the default) a forward waits for its pull and a backward for its
push. With ``staleness=s`` above 0 (or ``pipelined=True``) the table goes through a
`starwire.Pipeline`: a backward sends its push and returns, and the rows of a forward may
miss at most this worker's `s` most recent pushes (every earlier one is in them); a push
that fails after its backward returned raises at a later forward, backward or `flush`,
never dropped. `PrefetchingLoader` wraps a data loader so that the next batch's rows are
requested while this batch computes. Rows cross the wire as float32, or as bfloat16 or
float16 with ``wire_dtype`` (half the bytes; the modules still compute in float32). Pulls
and pushes go through the calling thread's `Client` (backward of a CPU graph runs on the
thread that calls ``loss.backward()``); the modules run on the CPU.

A module's `state_dict` holds no rows, and is not empty either: it holds a marker naming
the table and its PS tasks (``_extra_state``), and `load_state_dict` refuses a marker of
another table. The rows are saved by the PS tasks themselves (`checkpoint`, or
``commctl checkpoint``) and loaded by them (`starwire.PsTable.load`).

    import torch, starwire
    from starwire.torch import PSEmbeddingBag

    client = worker.client()
    bag = PSEmbeddingBag(client, table=1, dim=16, mode="sum", peers=["ps:0", "ps:1"])
    out = bag(torch.tensor([3, 9, 3, 4]), offsets=torch.tensor([0, 2]))    # [2, 16]
    out.sum().backward()                                                   # pushes
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import (Any, Callable, Generic, Iterable, Iterator, Mapping, Optional, Sequence,
                    TypeVar, Union)

import numpy as np
import numpy.typing as npt
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._arrays import loss_scale_value
from ._embedding_rows import _note, _PipelinedRows, _Rows, _ShardedRows
from .client import DEFAULT_TIMEOUT, Client, StepReport
from .errors import Closed, InvalidArgument, StarwireError
from .pipeline import Pipeline, PipelineReport, PipelineSettings
from .sharded_tables import ShardedTables

__all__ = ["MARKER_FORMAT", "PSEmbedding", "PSEmbeddingBag", "PSEmbeddingBagCollection",
           "PrefetchingLoader", "TableConfig"]

#: The ``format`` of the marker a module's `state_dict` holds in place of its rows.
MARKER_FORMAT = "starwire.torch/ps-rows"
_MARKER_VERSION = 1
_MODES = ("sum", "mean")
#: The most blocks without a gradient a forward keeps for a later push
#: (``push_in_backward=False``): gradients accumulated over this many forwards before one
#: backward are all pushed.
_KEPT_WITHOUT_GRAD = 16
_IDS_ARE = ("ids are an integer tensor of values 0 to 2^63-1 (int64 without negative "
            "values; uint8, int8, int16, int32 and uint64 are converted)")


_Push = Callable[[npt.NDArray[np.uint64], npt.NDArray[np.float32]], None]
#: What a forward hands the block it pulled (with its unique ids) when autograd records:
#: a hook that pushes its gradient in backward, or a list that keeps it for a later push.
_Sink = Callable[[npt.NDArray[np.uint64], Tensor], None]


def _take_grad(block: Tensor, clear: bool = True) -> Optional[npt.NDArray[np.float32]]:
    """The gradient backward accumulated on the pulled block (``[unique, dim]``, duplicates
    summed by autograd), taken off it (`clear`: a block that stays in the graph), or None
    when it has none."""
    grad = block.grad
    if grad is None:
        return None
    if clear:
        block.grad = None
    # The gradient of a float32 block is a contiguous float32 tensor (that does not require
    # grad): its memory as it is (one torch call), converted only when it is not.
    g = grad.numpy()
    if g.dtype != np.float32 or not g.flags.c_contiguous:
        g = np.ascontiguousarray(g, dtype=np.float32)
    return g


def _push_on_backward(block: Tensor, push: _Push, ids: npt.NDArray[np.uint64]) -> None:
    """Makes the pulled block (a leaf that requires grad) hand its gradient to `push` when
    backward has accumulated it. A hook on the leaf costs less than a custom autograd
    Function (one Python call in backward, none in forward; torch 2.1 or later)."""

    def hook(leaf: Tensor) -> None:
        g = _take_grad(leaf)
        assert g is not None
        push(ids, g)

    block.register_post_accumulate_grad_hook(hook)  # type: ignore[no-untyped-call]


# ----- ids -----

def _ids(input: Any, what: str, sign_later: bool = False) -> Tensor:
    """`input` as an int64 tensor of ids, checked: an integer tensor on the CPU with no
    negative value (uint64 values of 2^63 or more are refused: torch computes on int64).
    `sign_later`: an int64 tensor, the usual case, is returned unchecked for sign, the
    caller checking its sorted unique ids (`_PSModule._lookup`)."""
    if isinstance(input, Tensor) and input.dtype is torch.int64 and input.is_cpu:
        ids = input  # an integer tensor: never part of a graph
        if sign_later or ids.numel() == 0 or int(ids.min()) >= 0:
            return ids
    if not isinstance(input, Tensor):
        raise InvalidArgument(f"{what} is a {type(input).__name__}, not a tensor: {_IDS_ARE}")
    if input.is_floating_point() or input.is_complex() or input.dtype == torch.bool:
        raise InvalidArgument(f"{what} has dtype {input.dtype}, not an integer dtype: "
                              f"{_IDS_ARE}")
    if input.device.type != "cpu":
        raise InvalidArgument(f"{what} is on {input.device}: the rows are pulled into host "
                              "memory and the modules run on the CPU")
    ids = input.detach()
    uint64 = getattr(torch, "uint64", None)
    if ids.dtype == uint64:
        # Reinterpreted, not converted: values of 2^63 or more show as negative.
        signed = ids.view(torch.int64)
        bad = (signed < 0).nonzero()
        if len(bad):
            at = tuple(int(i) for i in bad[0])
            raise InvalidArgument(f"{what}{list(at)} is {int(ids[at].item())}: over int64's "
                                  f"range; {_IDS_ARE}")
        return signed
    ids = ids.to(torch.int64)
    if ids.numel() and int(ids.min()) < 0:
        bad = (ids < 0).nonzero()
        if len(bad):
            at = tuple(int(i) for i in bad[0])
            raise InvalidArgument(f"{what}{list(at)} is {int(ids[at].item())}: negative; "
                                  f"{_IDS_ARE}")
    return ids


def _in_vocab(ids: Tensor, num_embeddings: Optional[int], what: str) -> None:
    if num_embeddings is None or ids.numel() == 0 or int(ids.max()) < num_embeddings:
        return
    bad = (ids >= num_embeddings).nonzero()
    if len(bad):
        at = tuple(int(i) for i in bad[0])
        raise InvalidArgument(f"{what}{list(at)} is {int(ids[at].item())}: not below "
                              f"num_embeddings ({num_embeddings})")


class _Lookup:
    """One table's part of a step: its unique ids and where each input id's row is among
    them, then the pulled block. When the pull deduplicates (`ids` set: the checked input
    ids), `unique` and `inverse` are the pull's to fill."""

    __slots__ = ("unique", "inverse", "block", "ids")

    def __init__(self, unique: npt.NDArray[np.uint64], inverse: Tensor,
                 ids: Optional[Tensor] = None) -> None:
        self.unique, self.inverse, self.ids = unique, inverse, ids
        self.block: Optional[npt.NDArray[np.float32]] = None


# The operator torch.unique calls, without its Python dispatch (a few µs per call);
# torch.unique where the operator is not there.
_UNIQUE2 = getattr(torch, "_unique2", None)


def _unique_of(ids: Tensor) -> tuple[Tensor, Tensor]:
    """``torch.unique(ids, return_inverse=True)`` (sorted)."""
    unique: Tensor
    inverse: Tensor
    if _UNIQUE2 is not None:
        unique, inverse, _ = _UNIQUE2(ids, sorted=True, return_inverse=True)
    else:
        unique, inverse = torch.unique(ids, return_inverse=True)
    return unique, inverse


def _dedup(ids: Tensor) -> _Lookup:
    flat = ids.dim() == 1
    unique, inverse = _unique_of(ids if flat else ids.reshape(-1))
    # A new contiguous int64 tensor (of non-negative values, as the caller checks): its
    # memory seen as uint64.
    return _Lookup(unique.numpy().view(np.uint64),
                   inverse if flat else inverse.reshape(ids.shape))


def _flat_ids(ids: Tensor) -> npt.NDArray[np.uint64]:
    """Checked (non-negative) int64 ids as a 1-D uint64 array over their memory."""
    return (ids if ids.dim() == 1 else ids.reshape(-1)).numpy().view(np.uint64)


def _fill(lookup: _Lookup, unique: npt.NDArray[np.uint64], block: npt.NDArray[np.float32],
          inverse: npt.NDArray[np.int64]) -> None:
    """Completes a lookup whose pull deduplicated its ids."""
    assert lookup.ids is not None
    lookup.unique, lookup.block = unique, block
    lookup.inverse = (torch.from_numpy(inverse) if lookup.ids.dim() == 1
                      else torch.from_numpy(inverse).reshape(lookup.ids.shape))


def _weight(sink: _Sink, lookup: _Lookup) -> Tensor:
    """The pulled block as a tensor over its own memory (``torch.from_numpy`` keeps the
    array alive), a leaf handed to `sink` when autograd records."""
    assert lookup.block is not None
    block = torch.from_numpy(lookup.block)
    if not torch.is_grad_enabled():
        return block
    block.requires_grad_(True)
    sink(lookup.unique, block)
    return block


# ----- the modules -----

#: The dtypes rows may cross the wire as, and their names for `starwire.Sharded`.
_WIRE_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
_WIRE_BY_NAME = {"float32": torch.float32, "f32": torch.float32, "bfloat16": torch.bfloat16,
                 "bf16": torch.bfloat16, "float16": torch.float16, "f16": torch.float16,
                 "half": torch.float16}


def _checked_options(staleness: int, wire_dtype: Any, loss_scale: Optional[float],
                     push_in_backward: bool) -> torch.dtype:
    """Checks the options every module shares; the wire dtype as a torch dtype."""
    if not isinstance(push_in_backward, bool):
        raise InvalidArgument(f"push_in_backward {push_in_backward!r} is not a bool")
    if isinstance(staleness, bool) or not isinstance(staleness, int) or staleness < 0:
        raise InvalidArgument(f"staleness {staleness!r} is not an int of 0 or more (the "
                              "most of this worker's recent pushes a pull may miss)")
    wire = (_WIRE_BY_NAME.get(wire_dtype.lower()) if isinstance(wire_dtype, str)
            else wire_dtype if wire_dtype in _WIRE_DTYPES else None)
    if wire is None:
        raise InvalidArgument(
            f"wire_dtype {wire_dtype!r} is not one rows cross the wire as: torch.float32 "
            "('float32', 'f32'), torch.bfloat16 ('bfloat16', 'bf16') or torch.float16 "
            "('float16', 'f16')")
    loss_scale_value(loss_scale)
    assert isinstance(wire, torch.dtype)
    return wire


class _PSModule(nn.Module):
    """What `PSEmbedding` and `PSEmbeddingBag` share: the table, its PS tasks, the rows
    interface, the state marker and checkpoints."""

    def __init__(self, client: Client, table: int, dim: int, *,
                 peers: Optional[Sequence[str]], job: str, partition: str,
                 num_embeddings: Optional[int], staleness: int, wire_dtype: Any,
                 timeout: Optional[float], pipelined: Optional[bool] = None,
                 max_pushes_in_flight: int = 2, loss_scale: Optional[float] = None,
                 push_in_backward: bool = True, cache_bytes: int = 0) -> None:
        super().__init__()
        wire = _checked_options(staleness, wire_dtype, loss_scale, push_in_backward)
        if not isinstance(client, Client):
            raise InvalidArgument(f"client is a {type(client).__name__}, not a "
                                  "starwire.Client (runtime.client())")
        if isinstance(table, bool) or not isinstance(table, int) or not 0 <= table < 1 << 32:
            raise InvalidArgument(f"table {table!r} is not a table id (0 to 2^32-1)")
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise InvalidArgument(f"dim {dim!r} is not a positive int")
        if num_embeddings is not None and (isinstance(num_embeddings, bool) or not isinstance(
                num_embeddings, int) or num_embeddings < 1):
            raise InvalidArgument(f"num_embeddings {num_embeddings!r} is not a positive int "
                                  "(or None: any id up to 2^63-1)")
        if partition == "div" and num_embeddings is None:
            raise InvalidArgument('partition="div" splits 0..num_embeddings into ranges: '
                                  "give num_embeddings")
        if peers is None:
            n = len(client.runtime.peers(job))
            if n == 0:
                raise InvalidArgument(f"the cluster has no task of job {job!r}: give peers")
            tasks = [f"{job}:{i}" for i in range(n)]
        else:
            tasks = [str(p) for p in peers]
            if not tasks:
                raise InvalidArgument("peers is empty: name the PS tasks of the table")
        if pipelined is None:
            pipelined = staleness > 0
        elif not pipelined and staleness > 0:
            raise InvalidArgument(f"staleness={staleness} needs the pipelined client: "
                                  "pipelined=False allows only 0")
        if cache_bytes and not pipelined:
            raise InvalidArgument(f"cache_bytes={cache_bytes!r}: the row cache is the "
                                  "pipelined client's; give staleness >= 1 or "
                                  "pipelined=True")
        self._rows: _Rows
        if pipelined:
            settings = PipelineSettings(staleness, max_pushes_in_flight, timeout,
                                        _WIRE_DTYPES[wire], loss_scale, cache_bytes)
            self._rows = _PipelinedRows(Pipeline(
                client, table, dim, peers=tasks, dtype=np.float32, partition=partition,
                vocab=num_embeddings or 0, settings=settings))
        else:
            self._rows = _ShardedRows(client.sharded(
                table, dim, peers=tasks, dtype=np.float32, partition=partition,
                vocab=num_embeddings or 0, wire_dtype=_WIRE_DTYPES[wire],
                loss_scale=loss_scale), timeout)
        self.table, self.dim = table, dim
        self.num_embeddings = num_embeddings
        self.tasks, self.partition = tasks, partition
        self.staleness, self.wire_dtype, self.loss_scale = staleness, wire, loss_scale
        self.pipelined = bool(pipelined)
        self._client = client
        #: The unique ids of the next batch (`PrefetchingLoader`), requested right after
        #: the next pull.
        self._next: Optional[npt.NDArray[np.uint64]] = None
        self.push_in_backward = push_in_backward
        #: A synchronous module's pull deduplicates the batch (in Rust, `Sharded.pull_unique`,
        #: or `ShardedTables.pull_unique` for a collection's).
        self._dedup_in_pull = isinstance(self._rows, _ShardedRows)
        #: Without a push in backward: the blocks pulled since the last push, with their
        #: ids, whose gradients `push_gradients` sends.
        self._deferred: list[tuple[npt.NDArray[np.uint64], Tensor]] = []
        self._sink: _Sink = self._hook if push_in_backward else self._keep

    def _hook(self, ids: npt.NDArray[np.uint64], block: Tensor) -> None:
        _push_on_backward(block, self._rows.push, ids)

    def _keep(self, ids: npt.NDArray[np.uint64], block: Tensor) -> None:
        self._deferred.append((ids, block))

    def push_gradients(self) -> None:
        """Pushes the gradients that backward accumulated on the blocks the forwards since
        the last push pulled (in the order of the forwards; pipelined, without waiting), for
        a module made with ``push_in_backward=False``; with the default, backward pushed
        them already and this does nothing. A block without a gradient (no backward reached
        its output) is forgotten, as backward would push nothing for it. Call it after
        ``loss.backward()``; `flush`, `close`, `checkpoint` and a `PrefetchingLoader`
        moving to the next batch call it. The next forward pushes what has a gradient
        and keeps the rest (its backward may come later) up to `_KEPT_WITHOUT_GRAD`
        blocks, forgetting the oldest beyond that."""
        self._push_deferred(forget=True)

    def _push_deferred(self, forget: bool) -> None:
        deferred = self._deferred
        kept: list[tuple[npt.NDArray[np.uint64], Tensor]] = []
        while deferred:
            ids, block = deferred.pop(0)
            g = _take_grad(block, clear=False)
            if g is not None:
                try:
                    self._rows.push(ids, g)
                except BaseException:
                    deferred[:0] = kept
                    raise
            elif not forget:
                kept.append((ids, block))
        deferred.extend(kept[-_KEPT_WITHOUT_GRAD:])

    @property
    def last_report(self) -> Optional[Union[StepReport, PipelineReport]]:
        """The last forward's pull: distinct ids sent, rows the PS tasks did not have
        (their rows were zero); pipelined, the step's `PipelineReport` as the last pull or
        push left it (visible and waited seconds, bytes, prefetched parts)."""
        return self._rows.last_report

    def flush(self) -> None:
        """Waits until every push sent has been answered (pipelined; synchronous, nothing
        is in flight), raising a push failure it finds. Call it before reading the rows
        elsewhere, before a checkpoint, and at the end of training. Pushes the
        gradients not pushed yet first (`push_gradients`)."""
        self.push_gradients()
        self._rows.flush()

    def close(self) -> None:
        """Pushes the gradients not pushed yet, waits for what is in flight (as `flush`)
        and frees the table's client. The module is unusable afterwards."""
        try:
            self.push_gradients()
        finally:
            self._deferred.clear()
            self._rows.close()

    def prefetch(self, input: Any) -> None:
        """Requests the rows of `input` (the ids a later forward will take) now, when the
        staleness bound allows: the next forward of the same ids waits only for what has
        not arrived. Pipelined modules only (synchronous ones ask at the forward)."""
        self._prefetch(self._lookup(input, "input").unique)

    def _prefetch(self, unique: npt.NDArray[np.uint64]) -> None:
        if not self.pipelined:
            raise InvalidArgument(f"table {self.table} is synchronous: prefetch needs a "
                                  "module made with staleness >= 1 or pipelined=True")
        self._rows.prefetch(unique)

    def _lookup(self, input: Any, what: str) -> _Lookup:
        if self._dedup_in_pull:
            # Checked whole (a reduction each), deduplicated by the pull in Rust.
            ids = _ids(input, what)
            _in_vocab(ids, self.num_embeddings, what)
            return _Lookup(_NO_IDS, ids, ids)
        ids = _ids(input, what, sign_later=True)
        lookup = _dedup(ids)
        # The unique ids are sorted: the first and last bound them all, with no reduction.
        # A bad one is then found, and named by its position, by the full checks.
        ordered = lookup.unique.view(np.int64)
        if len(ordered) and (ordered[0] < 0 or (self.num_embeddings is not None
                                                and ordered[-1] >= self.num_embeddings)):
            _ids(ids, what)
            _in_vocab(ids, self.num_embeddings, what)
        return lookup

    def _pull(self, lookup: _Lookup) -> None:
        # The last step's gradients go first: the rows are those of pushing in backward.
        if self._deferred:
            self._push_deferred(forget=False)
        if lookup.ids is None:
            lookup.block = self._rows.pull(lookup.unique)
        else:
            assert isinstance(self._rows, _ShardedRows)
            _fill(lookup, *self._rows.pull_unique(_flat_ids(lookup.ids)))
        # The next batch's rows are requested now that this step's are taken: a prefetch
        # made before the pull would replace this step's. (`nn.Module` attributes are
        # slow to set: only when there is one.)
        if self._next is not None:
            next_ids, self._next = self._next, None
            self._rows.prefetch(next_ids)

    # ----- state -----

    def marker(self) -> dict[str, Any]:
        """What the module's `state_dict` holds for it (under ``_extra_state``): where its
        rows live, not the rows."""
        return {
            "format": MARKER_FORMAT, "version": _MARKER_VERSION, "table": self.table,
            "dim": self.dim, "tasks": list(self.tasks), "partition": self.partition,
            "num_embeddings": self.num_embeddings,
            "rows": "on the PS tasks, not in this state dict: they save them (checkpoint(), "
                    "commctl checkpoint) and load them (starwire.PsTable.load)",
        }

    def get_extra_state(self) -> dict[str, Any]:
        return self.marker()

    def set_extra_state(self, state: Any) -> None:
        """Checks a loaded marker against this module: another table, row size, partition
        or number of PS tasks raises `InvalidArgument` (its rows are not these). The tasks'
        names may differ (PS tasks moved with their checkpoints)."""
        if not isinstance(state, Mapping) or state.get("format") != MARKER_FORMAT:
            raise InvalidArgument(f"the state loaded into the PS-backed embedding of table "
                                  f"{self.table} is not a {MARKER_FORMAT} marker: {state!r}")
        mine = self.marker()
        for key, what in (("table", "table"), ("dim", "row size"),
                          ("partition", "partition"), ("num_embeddings", "num_embeddings")):
            if state.get(key) != mine[key]:
                raise InvalidArgument(
                    f"the state loaded is the marker of {what} {state.get(key)!r} "
                    f"(table {state.get('table')!r} on {state.get('tasks')}), not of this "
                    f"module's {what} {mine[key]!r} (table {self.table} on {self.tasks}): "
                    "its rows are not this module's")
        tasks = state.get("tasks")
        if not isinstance(tasks, list) or len(tasks) != len(self.tasks):
            raise InvalidArgument(
                f"the state loaded is table {self.table} partitioned over {tasks!r}, not over "
                f"{len(self.tasks)} PS tasks ({self.tasks}): its rows are spread otherwise")

    def checkpoint(self, timeout: Optional[float] = None) -> list[dict[str, Any]]:
        """Asks each PS task of the table to save the tables it serves into its own
        checkpoint directory (`Client.checkpoint`; all at once) and returns their
        manifests, in the order of `tasks`. The gradients not pushed yet are pushed and
        every push answered first (`flush`)."""
        self.flush()
        pending = [self._client.submit_checkpoint(t, timeout) for t in self.tasks]
        return [p.wait() for p in pending]

    def extra_repr(self) -> str:
        return (f"table={self.table}, dim={self.dim}, tasks={self.tasks}, "
                f"partition={self.partition!r}")


class PSEmbedding(_PSModule):
    """``nn.Embedding`` whose rows are table `table` (rows of `dim` float32) partitioned
    over PS tasks: `peers` (task names such as ``"ps:0"``, or addresses), by default every
    task of `job` in the cluster spec; `partition` ``"mod"``, ``"div"`` (needs
    `num_embeddings`) or ``"hash"``, as the PS tasks were given their ids. `forward(input)`
    takes an integer tensor of any shape and returns ``[*input.shape, dim]``.

    `num_embeddings` (optional) bounds the ids (an id at or above it raises
    `InvalidArgument`); without it any id 0 to 2^63-1 is pulled (the table creates or
    reports missing what it does not have, by its ``create`` setting; missing rows are
    zero). `staleness`: 0 (synchronous), or the most of this worker's recent pushes a
    forward's rows may miss (a `starwire.Pipeline` then carries the rows: backward returns
    without waiting for its push, at most `max_pushes_in_flight` unanswered, and a failed
    push raises at a later forward, backward or `flush`). `pipelined=True` takes the
    pipeline with staleness 0 too (the synchronous results, exactly; `prefetch` and
    `PrefetchingLoader` need a pipelined module; each pipelined table may have
    ``(max_pushes_in_flight + 1) * len(tasks)`` requests in flight on `client`, whose
    capacity must cover its tables' sum). `push_in_backward`: True (the default), backward
    pushes the gradient of the rows (a hook on the pulled block calls into Python); False,
    backward only accumulates it on the block, and `push_gradients` pushes it, called by
    the trainer after ``loss.backward()`` or, at the latest, by the next forward (before
    its pull, so the rows are the same), `flush`, `close`, `checkpoint` or a
    `PrefetchingLoader` moving on. That saves the hook's cost per step. A forward keeps the
    blocks still without a gradient (accumulating over up to 16 forwards before one
    backward works); `push_gradients` forgets them, as backward would push nothing.
    `cache_bytes` (pipelined modules; 0, the default: none): a row cache of that many bytes
    on the worker (`starwire.PipelineSettings.cache_bytes`): a row that misses at most
    `staleness` of this worker's pushes is served from it without asking, and the cached
    rows too old to serve are pulled with their versions, the PS answering those nobody
    changed without their bytes; ``last_report`` counts ``cache_hits`` and
    ``rows_unchanged``. In a collection each table has a cache of `cache_bytes`.
    `wire_dtype`: how rows cross the wire, ``torch.float32`` (the default), ``torch.bfloat16`` or ``torch.float16`` (or
    ``"bf16"``, ``"f16"``...): the PS rounds the rows it sends to nearest even, the module
    computes in float32 on them, and the gradients pushed are narrowed likewise (the table
    on the PS stays float32 and applies them in float32); a PS that did not announce
    ``row_formats`` answers float32 rows instead. `loss_scale`: the factor the loss, and so
    the gradients pushed, were multiplied by (for float16 gradients that would underflow;
    2^-126 to 2^126, None: none); the PS divides it out before applying them. `timeout` is
    the deadline of each pull and push, in seconds (None: none).
    """

    def __init__(self, client: Client, table: int, dim: int, *,
                 peers: Optional[Sequence[str]] = None, job: str = "ps",
                 partition: str = "mod", num_embeddings: Optional[int] = None,
                 staleness: int = 0, wire_dtype: Any = torch.float32,
                 timeout: Optional[float] = DEFAULT_TIMEOUT, pipelined: Optional[bool] = None,
                 max_pushes_in_flight: int = 2, loss_scale: Optional[float] = None,
                 push_in_backward: bool = True, cache_bytes: int = 0) -> None:
        super().__init__(client, table, dim, peers=peers, job=job, partition=partition,
                         num_embeddings=num_embeddings, staleness=staleness,
                         wire_dtype=wire_dtype, timeout=timeout, pipelined=pipelined,
                         max_pushes_in_flight=max_pushes_in_flight, loss_scale=loss_scale,
                         push_in_backward=push_in_backward, cache_bytes=cache_bytes)

    def forward(self, input: Tensor) -> Tensor:
        lookup = self._lookup(input, "input")
        self._pull(lookup)
        return F.embedding(lookup.inverse, _weight(self._sink, lookup))


class PSEmbeddingBag(_PSModule):
    """``nn.EmbeddingBag`` whose rows are table `table` on PS tasks (the arguments as for
    `PSEmbedding`): bags reduced by `mode` (``"sum"`` or ``"mean"``; an empty bag gives
    zeros), from a 1-D `input` with `offsets` (where each bag starts; with
    `include_last_offset`, one more giving the end) or a 2-D `input` (a bag per row), with
    optional `per_sample_weights` (mode ``"sum"``, of `input`'s shape). Returns
    ``[bags, dim]``."""

    def __init__(self, client: Client, table: int, dim: int, mode: str = "mean", *,
                 peers: Optional[Sequence[str]] = None, job: str = "ps",
                 partition: str = "mod", num_embeddings: Optional[int] = None,
                 include_last_offset: bool = False, staleness: int = 0,
                 wire_dtype: Any = torch.float32,
                 timeout: Optional[float] = DEFAULT_TIMEOUT, pipelined: Optional[bool] = None,
                 max_pushes_in_flight: int = 2, loss_scale: Optional[float] = None,
                 push_in_backward: bool = True, cache_bytes: int = 0) -> None:
        if mode not in _MODES:
            raise InvalidArgument(f"mode {mode!r} is not one of {', '.join(_MODES)} (max is "
                                  "not supported)")
        super().__init__(client, table, dim, peers=peers, job=job, partition=partition,
                         num_embeddings=num_embeddings, staleness=staleness,
                         wire_dtype=wire_dtype, timeout=timeout, pipelined=pipelined,
                         max_pushes_in_flight=max_pushes_in_flight, loss_scale=loss_scale,
                         push_in_backward=push_in_backward, cache_bytes=cache_bytes)
        self.mode = mode
        self.include_last_offset = bool(include_last_offset)

    def _bags(self, input: Any, offsets: Optional[Tensor],
              per_sample_weights: Optional[Tensor]) -> tuple[_Lookup, Optional[Tensor]]:
        """The checked lookup of one call, and its offsets as int64."""
        if isinstance(input, Tensor) and input.dim() == 2:
            if offsets is not None:
                raise InvalidArgument("offsets is given with a 2-D input: each row of a 2-D "
                                      "input is a bag (give a 1-D input with offsets)")
        elif isinstance(input, Tensor) and input.dim() == 1:
            if offsets is None:
                raise InvalidArgument("a 1-D input needs offsets (where each bag starts)")
            if not isinstance(offsets, Tensor) or offsets.dim() != 1:
                raise InvalidArgument(f"offsets must be a 1-D integer tensor, not {offsets!r}")
            offsets = _ids(offsets, "offsets")
        elif isinstance(input, Tensor):
            raise InvalidArgument(f"input has {input.dim()} dimensions: a bag of ids is a 1-D "
                                  "input with offsets, or a 2-D input of a bag per row")
        if per_sample_weights is not None:
            if self.mode != "sum":
                raise InvalidArgument(f"per_sample_weights is for mode 'sum', not "
                                      f"{self.mode!r}")
            if not isinstance(per_sample_weights, Tensor) or (
                    isinstance(input, Tensor) and per_sample_weights.shape != input.shape):
                raise InvalidArgument("per_sample_weights must be a float tensor of input's "
                                      f"shape {list(input.shape)}")
        return self._lookup(input, "input"), offsets

    def _reduce(self, lookup: _Lookup, offsets: Optional[Tensor],
                per_sample_weights: Optional[Tensor], sink: Optional[_Sink] = None) -> Tensor:
        weight = _weight(sink or self._sink, lookup)
        if per_sample_weights is not None:
            per_sample_weights = per_sample_weights.to(weight.dtype)
        return F.embedding_bag(lookup.inverse, weight, offsets, mode=self.mode,
                               per_sample_weights=per_sample_weights,
                               include_last_offset=self.include_last_offset)

    def forward(self, input: Tensor, offsets: Optional[Tensor] = None,
                per_sample_weights: Optional[Tensor] = None) -> Tensor:
        lookup, offsets = self._bags(input, offsets, per_sample_weights)
        self._pull(lookup)
        return self._reduce(lookup, offsets, per_sample_weights)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, mode={self.mode!r}"


@dataclass(frozen=True)
class TableConfig:
    """One table of a `PSEmbeddingBagCollection`: its id on the PS tasks, its row size,
    how bags reduce, and optionally the bound of its ids."""

    table: int
    dim: int
    mode: str = "sum"
    num_embeddings: Optional[int] = None


class _StepPush:
    """The gradients of one step of a synchronous collection, pushed together (one request
    per PS for all the tables). Pushing in backward, they go once every block of the step
    has its gradient; a block that gets none (its output not in the loss) leaves the push
    to the next forward, `push_gradients`, `flush` or `close`, which push what came (before
    the next pull: the rows are those of pushing at once). Without a push in backward the
    blocks are kept, and those calls push the gradients backward accumulated on them."""

    def __init__(self, tables: ShardedTables, empty: list[npt.NDArray[np.float32]],
                 timeout: Optional[float], expected: int, in_backward: bool) -> None:
        self.tables, self.timeout = tables, timeout
        self.ids: list[npt.NDArray[np.uint64]] = [_NO_IDS] * len(empty)
        self.grads = list(empty)
        self.blocks: list[Optional[Tensor]] = [None] * len(empty)
        self.waiting = self.expected = expected
        self.in_backward = in_backward
        self.sent = False

    def sink_of(self, pos: int) -> _Sink:
        """Where the forward hands table `pos`'s block."""
        def keep(ids: npt.NDArray[np.uint64], block: Tensor) -> None:
            self.ids[pos], self.blocks[pos] = ids, block

        def hook(ids: npt.NDArray[np.uint64], block: Tensor) -> None:
            _push_on_backward(block, arrived, ids)

        def arrived(ids: npt.NDArray[np.uint64], grad: npt.NDArray[np.float32]) -> None:
            self.ids[pos], self.grads[pos] = ids, grad
            self.waiting -= 1
            if self.waiting == 0:
                self.send()
        return hook if self.in_backward else keep

    def send(self) -> None:
        """Pushes what came, once."""
        if self.sent:
            return
        if not self.in_backward:
            for pos, block in enumerate(self.blocks):
                if block is None:
                    continue
                self.blocks[pos] = None
                g = _take_grad(block, clear=False)
                if g is None:
                    self.ids[pos] = _NO_IDS
                else:
                    self.grads[pos] = g
                    self.waiting -= 1
        if self.waiting == self.expected:
            return
        self.sent = True
        try:
            self.tables.push(self.ids, self.grads, timeout=self.timeout)
        except StarwireError as e:
            _note(e, "while pushing the gradients of tables "
                     f"{[t for t, i in zip(self.tables.tables, self.ids) if len(i)]}")
            raise


_NO_IDS: npt.NDArray[np.uint64] = np.empty(0, dtype=np.uint64)


class PSEmbeddingBagCollection(nn.Module):
    """Several `PSEmbeddingBag` tables in one step, by feature name: ``tables`` maps each
    feature to its `TableConfig`; the PS tasks, partition, staleness, wire dtype, loss
    scale and timeout are as for `PSEmbeddingBag` and shared by all. `forward(inputs,
    offsets, per_sample_weights)` takes, per feature (any of the collection's), its ids
    (1-D with ``offsets[name]``, or 2-D) and optional ``per_sample_weights[name]``, and
    returns a dict of ``[bags, dim]`` tensors.

    Every feature's input is checked and deduplicated before any request is sent.
    Synchronous (``staleness=0``, not pipelined), a step's pull of all its tables is ONE
    request per PS task (`starwire.ShardedTables`), and so is its backward's push, sent once
    every table's block has its gradient (`last_report` is the step's pull's report).
    Pipelined, each table has its own `starwire.Pipeline`, and a step is one request per
    PS task and table. With ``push_in_backward=False`` backward only accumulates the
    gradients and `push_gradients` (or the next forward) pushes them, synchronous in one
    request per PS task. The bags are ``self.bags[name]`` (their markers are the
    collection's `state_dict`). `prefetch`, `flush` and `close` act on every table.
    """

    def __init__(self, client: Client, tables: Mapping[str, TableConfig], *,
                 peers: Optional[Sequence[str]] = None, job: str = "ps",
                 partition: str = "mod", staleness: int = 0, wire_dtype: Any = torch.float32,
                 timeout: Optional[float] = DEFAULT_TIMEOUT, pipelined: Optional[bool] = None,
                 max_pushes_in_flight: int = 2, loss_scale: Optional[float] = None,
                 push_in_backward: bool = True, cache_bytes: int = 0) -> None:
        super().__init__()
        _checked_options(staleness, wire_dtype, loss_scale, push_in_backward)
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
        self.bags = nn.ModuleDict({
            name: PSEmbeddingBag(client, cfg.table, cfg.dim, cfg.mode, peers=peers, job=job,
                                 partition=partition, num_embeddings=cfg.num_embeddings,
                                 staleness=staleness, wire_dtype=wire_dtype, timeout=timeout,
                                 pipelined=pipelined,
                                 max_pushes_in_flight=max_pushes_in_flight,
                                 loss_scale=loss_scale, push_in_backward=push_in_backward,
                                 cache_bytes=cache_bytes)
            for name, cfg in tables.items()})
        self._client, self.timeout = client, timeout
        self._in_backward = push_in_backward
        #: The last synchronous forward's pull of all its tables.
        self.last_report: Optional[StepReport] = None
        self._pos = {name: i for i, name in enumerate(tables)}
        self._tables: Optional[ShardedTables] = None
        self._pending: Optional[_StepPush] = None
        first = self._bag(next(iter(tables)))
        if not first.pipelined:
            self._tables = ShardedTables(
                client, [(cfg.table, cfg.dim) for cfg in tables.values()], peers=first.tasks,
                partition=partition, vocab=[cfg.num_embeddings or 0 for cfg in tables.values()],
                wire_dtype=_WIRE_DTYPES[first.wire_dtype], loss_scale=loss_scale)
            self._empty = [np.zeros((0, cfg.dim), dtype=np.float32) for cfg in tables.values()]

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
        now, table by table (`PSEmbeddingBag.prefetch`)."""
        lookups = [(self._bag(name), self._bag(name)._lookup(input, f"inputs[{name!r}]"))
                   for name, input in inputs.items()]
        for bag, lookup in lookups:
            bag._prefetch(lookup.unique)

    def _send_pending(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.send()

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
        for bag in self._each():
            bag.flush()

    def close(self) -> None:
        """Waits for and frees every table's client (`PSEmbeddingBag.close`)."""
        try:
            self._send_pending()
        finally:
            if self._tables is not None:
                self._tables.close()
            for bag in self._each():
                bag.close()

    def _pull_all(self, steps: list[tuple[str, PSEmbeddingBag, _Lookup, Optional[Tensor]]],
                  tables: ShardedTables) -> Optional[_StepPush]:
        """Pulls every step's rows in one request per PS; the push of the step's gradients
        when autograd records."""
        self._send_pending()
        runtime = self._client.runtime
        if not runtime._rt:
            raise Closed(f"cannot pull the rows of tables {tables.tables}: the runtime of "
                         f"{runtime.job}:{runtime.task_index} is closed")
        # Each table's checked ids, deduplicated by the pull (in Rust).
        ids = [_NO_IDS] * len(self._pos)
        for name, _, lookup, _ in steps:
            assert lookup.ids is not None
            ids[self._pos[name]] = _flat_ids(lookup.ids)
        try:
            parts, self.last_report = tables.pull_unique(ids, timeout=self.timeout)
        except StarwireError as e:
            _note(e, f"while pulling the rows of tables {tables.tables}")
            raise
        for name, _, lookup, _ in steps:
            _fill(lookup, *parts[self._pos[name]])
        if not torch.is_grad_enabled():
            return None
        self._pending = _StepPush(tables, self._empty, self.timeout, len(steps),
                                  self._in_backward)
        return self._pending

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
        if self._tables is not None and steps:
            push = self._pull_all(steps, self._tables)
            return {name: bag._reduce(lookup, offs, weights.get(name),
                                      push.sink_of(self._pos[name]) if push else None)
                    for name, bag, lookup, offs in steps}
        for _, bag, lookup, _ in steps:
            bag._pull(lookup)
        return {name: bag._reduce(lookup, offs, weights.get(name))
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



# ----- prefetching the next batch -----

B = TypeVar("B")
_Embeddings = Union[PSEmbedding, PSEmbeddingBag, PSEmbeddingBagCollection]


class PrefetchingLoader(Generic[B]):
    """A data loader whose next batch's rows are on their way while this batch computes:
    iterating it yields `loader`'s batches, in order, and reads one batch ahead. `ids`
    gives a batch's ids as `embeddings` takes them: a tensor for a `PSEmbedding` or
    `PSEmbeddingBag`, a mapping of feature to tensor for a `PSEmbeddingBagCollection`
    (the ``inputs`` of its forward). The modules must be pipelined (``staleness >= 1``, or
    ``pipelined=True`` for 0).

    The first batch's rows are requested before it is yielded; each later batch's right
    after the forward of the batch before has taken its rows (a prefetch made earlier would
    replace that step's), so they travel during that step's computation and backward. When
    they may be sent is the pipeline's staleness bound: with staleness 0 they wait for the
    push before them (and the results are the synchronous ones, exactly); with `s` they
    may miss this worker's `s` most recent pushes. The last batch prefetches nothing. A
    batch whose forward takes other ids than `ids` gave is pulled as without a prefetch.

    An exception raised by `loader` is raised by this iterator where the loader's own
    iteration would raise it: after the batches before it were yielded. A loop that stops
    early (``break``) leaves no prefetch pending. Pushes still in flight at the end are
    the modules' (`flush`)."""

    def __init__(self, loader: Iterable[B], embeddings: _Embeddings,
                 ids: Callable[[B], Any]) -> None:
        bags = (list(embeddings._each()) if isinstance(embeddings, PSEmbeddingBagCollection)
                else [embeddings])
        for m in bags:
            if not isinstance(m, _PSModule):
                raise InvalidArgument(f"{type(m).__name__} is not a PSEmbedding, "
                                      "PSEmbeddingBag or PSEmbeddingBagCollection")
            if not m.pipelined:
                raise InvalidArgument(f"table {m.table} is synchronous: a PrefetchingLoader "
                                      "needs modules made with staleness >= 1 or "
                                      "pipelined=True")
        self.loader, self.embeddings, self.ids = loader, embeddings, ids
        self._modules = [m for m in bags if isinstance(m, _PSModule)]

    def _lookups(self, batch: B) -> list[tuple[_PSModule, npt.NDArray[np.uint64]]]:
        """Each table's unique ids of `batch`, checked as its forward checks them."""
        given = self.ids(batch)
        e = self.embeddings
        if isinstance(e, PSEmbeddingBagCollection):
            if not isinstance(given, Mapping):
                raise InvalidArgument(f"ids(batch) gave a {type(given).__name__}: a "
                                      "collection takes a mapping of feature to ids")
            return [(e._bag(name), e._bag(name)._lookup(t, f"ids(batch)[{name!r}]").unique)
                    for name, t in given.items()]
        return [(e, e._lookup(given, "ids(batch)").unique)]

    def __iter__(self) -> Iterator[B]:
        it = iter(self.loader)
        try:
            batch = next(it)
        except StopIteration:
            return
        for m, unique in self._lookups(batch):
            m._prefetch(unique)
        while True:
            failure: Optional[BaseException] = None
            ahead: list[tuple[_PSModule, npt.NDArray[np.uint64]]] = []
            try:
                following = next(it)
            except StopIteration:
                last = True
            except BaseException as e:  # the loader's: raised after this batch
                failure, last = e, True
            else:
                last = False
                ahead = self._lookups(following)
                for m, unique in ahead:
                    m._next = unique
            try:
                yield batch
            except GeneratorExit:  # the loop stopped early: no prefetch of a batch not used
                for m, _ in ahead:
                    m._next = None
                raise
            # The step is over: gradients a module keeps for a later push go now (before
            # the prefetch, which the staleness bound orders after them).
            for m in self._modules:
                m.push_gradients()
            # A table this batch's forward did not pull prefetches now.
            for m, unique in ahead:
                if m._next is not None:
                    m._next = None
                    m._prefetch(unique)
            if failure is not None:
                raise failure
            if last:
                return
            batch = following
