"""Embedding modules for PyTorch whose rows live on PS tasks: `PSEmbedding`,
`PSEmbeddingBag` and `PSEmbeddingBagCollection`, drop-in for ``nn.Embedding`` and
``nn.EmbeddingBag`` in a trainer's model. (Only ``import starwire.torch`` imports torch; the
rest of the package does not need it.)

Each forward deduplicates the batch's ids (``torch.unique`` with the inverse), pulls the
unique rows through the sharded rows client (one request per PS task, all in flight at
once), wraps the ``[unique, dim]`` block it was received into as a tensor without a copy
(``torch.from_numpy``), and builds the output with ``F.embedding`` / ``F.embedding_bag``
over that block and the inverse indices. Autograd then gives the gradient of the block,
``[unique, dim]`` with the gradients of duplicate ids already summed, and the backward
pushes it to the PS tasks, whose optimizer applies it (a `PsTable` with
``optimizer="sgd"`` does ``w -= lr * g``). The rows are therefore not parameters: the
trainer's ``torch.optim`` optimizer sees only the dense parameters.

This first form is synchronous: a forward waits for its pull, a backward for its push
(``staleness=0``), and rows cross the wire as float32. Pulls and pushes go through the
calling thread's `Client` (backward of a CPU graph runs on the thread that calls
``loss.backward()``); the modules run on the CPU.

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
from typing import Any, Mapping, Optional, Protocol, Sequence

import numpy as np
import numpy.typing as npt
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .client import DEFAULT_TIMEOUT, Client, Sharded, StepReport
from .errors import Closed, InvalidArgument, StarwireError

__all__ = ["MARKER_FORMAT", "PSEmbedding", "PSEmbeddingBag", "PSEmbeddingBagCollection",
           "TableConfig"]

#: The ``format`` of the marker a module's `state_dict` holds in place of its rows.
MARKER_FORMAT = "starwire.torch/ps-rows"
_MARKER_VERSION = 1
_MODES = ("sum", "mean")
_IDS_ARE = ("ids are an integer tensor of values 0 to 2^63-1 (int64 without negative "
            "values; uint8, int8, int16, int32 and uint64 are converted)")


# ----- where rows come from and gradients go -----

class _Rows(Protocol):
    """The one interface the modules pull rows from and push gradients to: the unique ids
    of a step (uint64, 1-D, no duplicates) in, their ``[len(ids), dim]`` float32 block out
    (a new array the module keeps: the tensor it wraps uses its memory); gradients of the
    same shape back. `_ShardedRows` is the synchronous form; a pipelined client that pulls
    ahead and pushes in the background replaces it behind these four members."""

    @property
    def table(self) -> int: ...

    @property
    def dim(self) -> int: ...

    def pull(self, ids: npt.NDArray[np.uint64]) -> npt.NDArray[np.float32]: ...

    def push(self, ids: npt.NDArray[np.uint64], grads: npt.NDArray[np.float32]) -> None: ...


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

    def pull(self, ids: npt.NDArray[np.uint64]) -> npt.NDArray[np.float32]:
        if len(ids) == 0:
            self.last_report = StepReport(0, 0, [None] * len(self.sharded.peers))
            return np.zeros((0, self.dim), dtype=np.float32)
        self._check_open("pull the rows of")
        try:
            rows, self.last_report = self.sharded.pull(ids, timeout=self.timeout)
        except StarwireError as e:
            _note(e, f"while pulling {len(ids)} rows of table {self.table}")
            raise
        return rows

    def push(self, ids: npt.NDArray[np.uint64], grads: npt.NDArray[np.float32]) -> None:
        if len(ids) == 0:
            return
        self._check_open("push gradients to")
        try:
            self.sharded.push(ids, grads, timeout=self.timeout)
        except StarwireError as e:
            _note(e, f"while pushing the gradients of {len(ids)} rows of table {self.table}")
            raise


def _note(e: BaseException, text: str) -> None:
    """Adds `text` to the traceback of `e` (Python 3.11 and later)."""
    add = getattr(e, "add_note", None)
    if add is not None:
        add(text)


class _PushOnBackward(torch.autograd.Function):
    """Identity on the pulled block in forward; in backward, pushes the block's gradient
    (``[unique, dim]``, duplicates summed by autograd) and gives the block none (it is not
    a parameter: nothing accumulates into its ``.grad``)."""

    @staticmethod
    def forward(ctx: Any, block: Tensor, rows: _Rows, ids: npt.NDArray[np.uint64]
                ) -> Tensor:
        ctx.rows, ctx.ids = rows, ids
        return block.view_as(block)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[None, None, None]:
        g = grad.detach().to(torch.float32).contiguous()
        ctx.rows.push(ctx.ids, g.numpy())
        return None, None, None


# ----- ids -----

def _ids(input: Any, what: str) -> Tensor:
    """`input` as an int64 tensor of ids, checked: an integer tensor on the CPU with no
    negative value (uint64 values of 2^63 or more are refused: torch computes on int64)."""
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
    if ids.numel():
        bad = (ids < 0).nonzero()
        if len(bad):
            at = tuple(int(i) for i in bad[0])
            raise InvalidArgument(f"{what}{list(at)} is {int(ids[at].item())}: negative; "
                                  f"{_IDS_ARE}")
    return ids


def _in_vocab(ids: Tensor, num_embeddings: Optional[int], what: str) -> None:
    if num_embeddings is None or ids.numel() == 0:
        return
    bad = (ids >= num_embeddings).nonzero()
    if len(bad):
        at = tuple(int(i) for i in bad[0])
        raise InvalidArgument(f"{what}{list(at)} is {int(ids[at].item())}: not below "
                              f"num_embeddings ({num_embeddings})")


@dataclass
class _Lookup:
    """One table's part of a step: its unique ids and where each input id's row is among
    them, then the pulled block."""

    unique: npt.NDArray[np.uint64]
    inverse: Tensor
    block: Optional[npt.NDArray[np.float32]] = None


def _dedup(ids: Tensor) -> _Lookup:
    unique, inverse = torch.unique(ids.reshape(-1), return_inverse=True)
    # A new contiguous int64 tensor of non-negative values: its memory seen as uint64.
    return _Lookup(unique.numpy().view(np.uint64), inverse.reshape(ids.shape))


def _weight(rows: _Rows, lookup: _Lookup) -> Tensor:
    """The pulled block as a tensor over its own memory (``torch.from_numpy`` keeps the
    array alive), which pushes its gradient in backward when autograd records."""
    assert lookup.block is not None
    block = torch.from_numpy(lookup.block)
    if not torch.is_grad_enabled():
        return block
    block.requires_grad_(True)
    weight: Tensor = _PushOnBackward.apply(block, rows, lookup.unique)
    return weight


# ----- the modules -----

def _checked_options(staleness: int, wire_dtype: Any) -> None:
    if staleness != 0:
        raise NotImplementedError(
            f"staleness={staleness!r}: only 0 (synchronous pulls and pushes) for now; a "
            "staleness above 0 needs the pipelined client, which starwire.torch does not "
            "bind yet")
    if wire_dtype not in (torch.float32, "float32"):
        raise NotImplementedError(
            f"wire_dtype={wire_dtype!r}: rows cross the wire as float32 for now (bfloat16 "
            "is not bound yet)")


class _PSModule(nn.Module):
    """What `PSEmbedding` and `PSEmbeddingBag` share: the table, its PS tasks, the rows
    interface, the state marker and checkpoints."""

    def __init__(self, client: Client, table: int, dim: int, *,
                 peers: Optional[Sequence[str]], job: str, partition: str,
                 num_embeddings: Optional[int], staleness: int, wire_dtype: Any,
                 timeout: Optional[float]) -> None:
        super().__init__()
        _checked_options(staleness, wire_dtype)
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
        sharded = client.sharded(table, dim, peers=tasks, dtype=np.float32,
                                 partition=partition, vocab=num_embeddings or 0)
        self.table, self.dim = table, dim
        self.num_embeddings = num_embeddings
        self.tasks, self.partition = tasks, partition
        self.staleness, self.wire_dtype = staleness, torch.float32
        self._client = client
        self._rows: _Rows = _ShardedRows(sharded, timeout)

    @property
    def last_report(self) -> Optional[StepReport]:
        """The last forward's pull: distinct ids sent, rows the PS tasks did not have
        (their rows were zero)."""
        rows = self._rows
        return rows.last_report if isinstance(rows, _ShardedRows) else None

    def _lookup(self, input: Any, what: str) -> _Lookup:
        ids = _ids(input, what)
        _in_vocab(ids, self.num_embeddings, what)
        return _dedup(ids)

    def _pull(self, lookup: _Lookup) -> None:
        lookup.block = self._rows.pull(lookup.unique)

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
        manifests, in the order of `tasks`."""
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
    zero). `staleness` must be 0 and `wire_dtype` float32 (`NotImplementedError`
    otherwise: the pipelined client and bfloat16 rows are not bound yet). `timeout` is the
    deadline of each pull and push, in seconds (None: none).
    """

    def __init__(self, client: Client, table: int, dim: int, *,
                 peers: Optional[Sequence[str]] = None, job: str = "ps",
                 partition: str = "mod", num_embeddings: Optional[int] = None,
                 staleness: int = 0, wire_dtype: Any = torch.float32,
                 timeout: Optional[float] = DEFAULT_TIMEOUT) -> None:
        super().__init__(client, table, dim, peers=peers, job=job, partition=partition,
                         num_embeddings=num_embeddings, staleness=staleness,
                         wire_dtype=wire_dtype, timeout=timeout)

    def forward(self, input: Tensor) -> Tensor:
        lookup = self._lookup(input, "input")
        self._pull(lookup)
        return F.embedding(lookup.inverse, _weight(self._rows, lookup))


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
                 timeout: Optional[float] = DEFAULT_TIMEOUT) -> None:
        if mode not in _MODES:
            raise InvalidArgument(f"mode {mode!r} is not one of {', '.join(_MODES)} (max is "
                                  "not supported)")
        super().__init__(client, table, dim, peers=peers, job=job, partition=partition,
                         num_embeddings=num_embeddings, staleness=staleness,
                         wire_dtype=wire_dtype, timeout=timeout)
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
                per_sample_weights: Optional[Tensor]) -> Tensor:
        weight = _weight(self._rows, lookup)
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


class PSEmbeddingBagCollection(nn.Module):
    """Several `PSEmbeddingBag` tables in one step, by feature name: ``tables`` maps each
    feature to its `TableConfig`; the PS tasks, partition, staleness, wire dtype and
    timeout are as for `PSEmbeddingBag` and shared by all. `forward(inputs, offsets,
    per_sample_weights)` takes, per feature (any of the collection's), its ids (1-D with
    ``offsets[name]``, or 2-D) and optional ``per_sample_weights[name]``, and returns a
    dict of ``[bags, dim]`` tensors.

    Every feature's input is checked and deduplicated before any request is sent. The
    sharded client serves one table per call, so the step pulls table by table (one request
    per PS task and table, each table's requests in flight at once) and its backward pushes
    table by table. The bags are ``self.bags[name]`` (their markers are the collection's
    `state_dict`)."""

    def __init__(self, client: Client, tables: Mapping[str, TableConfig], *,
                 peers: Optional[Sequence[str]] = None, job: str = "ps",
                 partition: str = "mod", staleness: int = 0, wire_dtype: Any = torch.float32,
                 timeout: Optional[float] = DEFAULT_TIMEOUT) -> None:
        super().__init__()
        _checked_options(staleness, wire_dtype)
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
                                 timeout=timeout)
            for name, cfg in tables.items()})

    def _bag(self, name: str) -> PSEmbeddingBag:
        if name not in self.bags:
            raise InvalidArgument(f"feature {name!r} is not one of the collection's "
                                  f"({', '.join(self.bags.keys())})")
        bag = self.bags[name]
        assert isinstance(bag, PSEmbeddingBag)
        return bag

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
        for _, bag, lookup, _ in steps:
            bag._pull(lookup)
        return {name: bag._reduce(lookup, offs, weights.get(name))
                for name, bag, lookup, offs in steps}

    def checkpoint(self, timeout: Optional[float] = None) -> list[dict[str, Any]]:
        """Asks each PS task of the collection's tables, once each, to save the tables it
        serves (`Client.checkpoint`; all at once) and returns their manifests."""
        first = self._bag(next(iter(self.bags.keys())))
        tasks = list(dict.fromkeys(t for b in self.bags.values()
                                   for t in getattr(b, "tasks")))
        pending = [first._client.submit_checkpoint(t, timeout) for t in tasks]
        return [p.wait() for p in pending]

