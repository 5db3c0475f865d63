"""`starwire.torch`'s embedding modules for one table, `PSEmbedding` and `PSEmbeddingBag`,
and what they share: the checks of ids, the lookup of a step, the leaf block and its
gradient's way to the PS tasks (see `starwire.torch`)."""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Sequence, Union

import numpy as np
import numpy.typing as npt
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._arrays import loss_scale_value
from ._embedding_rows import _Rows, _SharedPipeline, _ShardedRows, _TableOfShared
from .client import DEFAULT_TIMEOUT, Client, StepReport
from .errors import Closed, InvalidArgument, StarwireError
from .pipeline import PipelineReport, PipelineSettings, PipelineTables

#: The ``format`` of the marker a module's `state_dict` holds in place of its rows.
MARKER_FORMAT = "starwire.torch/ps-rows"
_MARKER_VERSION = 1
_MODES = ("sum", "mean")
#: The most blocks without a gradient a forward keeps for a later push, besides its own
#: (``push_in_backward=False``): gradients accumulated over this many forwards and one more
#: before one backward are all pushed.
_KEPT_WITHOUT_GRAD = 16
#: No ids.
_NO_IDS: npt.NDArray[np.uint64] = np.empty(0, dtype=np.uint64)
#: No positions (a lookup not pulled yet).
_NO_INVERSE: Tensor = torch.empty(0, dtype=torch.int64)
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
    # The gradient of a float32 block is a contiguous float32 tensor: its memory as it is
    # (detached when it is part of a graph: ``backward(create_graph=True)``), converted
    # only when it is not.
    g = (grad.detach() if grad.requires_grad else grad).numpy()
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

def _ids(input: Any, what: str) -> Tensor:
    """`input` as an int64 tensor of ids, checked: an integer tensor on the CPU with no
    negative value (uint64 values of 2^63 or more are refused: torch computes on int64)."""
    if isinstance(input, Tensor) and input.dtype is torch.int64 and input.is_cpu:
        ids = input  # an integer tensor: never part of a graph
        if ids.numel() == 0 or int(ids.min()) >= 0:
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
        _refuse_negative(signed, ids, what, "over int64's range")
        return signed
    ids = ids.to(torch.int64)
    if ids.numel() and int(ids.min()) < 0:
        _refuse_negative(ids, ids, what, "negative")
    return ids


def _refuse_negative(signed: Tensor, shown: Tensor, what: str, why: str) -> None:
    """Raises `InvalidArgument` naming the first position where `signed` is below 0 (and
    its value as `shown` holds it), `why` saying what that means; nothing if there is
    none."""
    bad = (signed < 0).nonzero()
    if len(bad):
        at = tuple(int(i) for i in bad[0])
        raise InvalidArgument(f"{what}{list(at)} is {int(shown[at].item())}: {why}; "
                              f"{_IDS_ARE}")


def _in_vocab(ids: Tensor, num_embeddings: Optional[int], what: str) -> None:
    if num_embeddings is None or ids.numel() == 0 or int(ids.max()) < num_embeddings:
        return
    bad = (ids >= num_embeddings).nonzero()
    if len(bad):
        at = tuple(int(i) for i in bad[0])
        raise InvalidArgument(f"{what}{list(at)} is {int(ids[at].item())}: not below "
                              f"num_embeddings ({num_embeddings})")


class _Lookup:
    """One table's part of a step: the checked input ids (`ids`); once pulled, their
    distinct ids (`unique`), where each input id's row is among them (`inverse`, of the
    input's shape) and the pulled block. The pull deduplicates, in Rust."""

    __slots__ = ("unique", "inverse", "block", "ids")

    def __init__(self, ids: Tensor) -> None:
        self.ids = ids
        self.unique: npt.NDArray[np.uint64] = _NO_IDS
        self.inverse: Tensor = _NO_INVERSE
        self.block: Optional[npt.NDArray[np.float32]] = None


def _flat_ids(ids: Tensor) -> npt.NDArray[np.uint64]:
    """Checked (non-negative) int64 ids as a 1-D uint64 array over their memory."""
    return (ids if ids.dim() == 1 else ids.reshape(-1)).numpy().view(np.uint64)


def _fill(lookup: _Lookup, unique: npt.NDArray[np.uint64], block: npt.NDArray[np.float32],
          inverse: npt.NDArray[np.int64]) -> None:
    """Completes a lookup with what its pull gave."""
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


def _tasks_of(client: Client, peers: Optional[Sequence[str]], job: str) -> list[str]:
    """The PS tasks of a table: `peers`, or every task of `job` in the cluster spec."""
    if peers is None:
        n = len(client.runtime.peers(job))
        if n == 0:
            raise InvalidArgument(f"the cluster has no task of job {job!r}: give peers")
        return [f"{job}:{i}" for i in range(n)]
    tasks = [str(p) for p in peers]
    if not tasks:
        raise InvalidArgument("peers is empty: name the PS tasks of the table")
    return tasks


class _PSModule(nn.Module):
    """What `PSEmbedding` and `PSEmbeddingBag` share: the table, its PS tasks, the rows
    interface, the state marker and checkpoints."""

    def __init__(self, client: Client, table: int, dim: int, *,
                 peers: Optional[Sequence[str]], job: str, partition: str,
                 num_embeddings: Optional[int], staleness: int, wire_dtype: Any,
                 timeout: Optional[float], pipelined: Optional[bool] = None,
                 max_pushes_in_flight: int = 2, loss_scale: Optional[float] = None,
                 push_in_backward: bool = True, cache_bytes: int = 0,
                 _rows: Optional[_Rows] = None) -> None:
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
        tasks = _tasks_of(client, peers, job)
        if pipelined is None:
            pipelined = staleness > 0
        elif not pipelined and staleness > 0:
            raise InvalidArgument(f"staleness={staleness} needs the pipelined client: "
                                  "pipelined=False allows only 0")
        if isinstance(cache_bytes, bool) or not isinstance(cache_bytes, int) or cache_bytes < 0:
            raise InvalidArgument(f"cache_bytes {cache_bytes!r} is not an int of 0 or more (the "
                                  "bytes of the worker's row cache; 0: none)")
        if cache_bytes and not pipelined:
            raise InvalidArgument(f"cache_bytes={cache_bytes!r}: the row cache is the "
                                  "pipelined client's; give staleness >= 1 or "
                                  "pipelined=True")
        self._rows: _Rows
        if _rows is not None:
            # A collection's table: its rows go through the collection's pipeline.
            self._rows = _rows
        elif pipelined:
            settings = PipelineSettings(staleness, max_pushes_in_flight, timeout,
                                        _WIRE_DTYPES[wire], loss_scale, cache_bytes)
            self._rows = _TableOfShared(_SharedPipeline(PipelineTables(
                client, [(table, dim)], peers=tasks, dtype=np.float32, partition=partition,
                vocab=num_embeddings or 0, settings=settings)), 0)
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
        them already and this does nothing. A block without a gradient is forgotten: call
        it after the ``loss.backward()`` that covers the forwards (a backward that comes
        later finds nothing of them to push); `flush`, `close` and `checkpoint` call it.
        The next forward, and a `PrefetchingLoader` moving to the next batch, push what
        has a gradient and keep the rest (its backward may come later), up to
        `_KEPT_WITHOUT_GRAD` blocks besides the forward's own, forgetting the oldest."""
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
                except StarwireError as e:
                    # A push refused before it was sent (the runtime closed, or an earlier
                    # push's failure reported first) stays to be pushed; one a PS may have
                    # applied is not sent again.
                    unsent = isinstance(e, (Closed, InvalidArgument)) or bool(
                        getattr(e, "failed_pushes", None))
                    deferred[:0] = kept + ([(ids, block)] if unsent else [])
                    raise
                except BaseException:
                    deferred[:0] = kept + [(ids, block)]
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
        self._prefetch(_flat_ids(self._lookup(input, "input").ids))

    def _prefetch(self, unique: npt.NDArray[np.uint64]) -> None:
        if not self.pipelined:
            raise InvalidArgument(f"table {self.table} is synchronous: prefetch needs a "
                                  "module made with staleness >= 1 or pipelined=True")
        self._rows.prefetch(unique)

    def _lookup(self, input: Any, what: str) -> _Lookup:
        # Checked whole (a reduction each), deduplicated by the pull in Rust.
        ids = _ids(input, what)
        _in_vocab(ids, self.num_embeddings, what)
        return _Lookup(ids)

    def _pull(self, lookup: _Lookup) -> None:
        # The last step's gradients go first: the rows are those of pushing in backward.
        if self._deferred:
            self._push_deferred(forget=False)
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
    forward's rows may miss (a pipeline then carries the rows, `starwire.PipelineTables`
    of the one table: backward returns without waiting for its push, at most
    `max_pushes_in_flight` unanswered, and a failed push raises at a later forward,
    backward or `flush`). `pipelined=True` takes the
    pipeline with staleness 0 too (the synchronous results, exactly; `prefetch` and
    `PrefetchingLoader` need a pipelined module; each pipelined module, and each
    pipelined collection, may have ``(max_pushes_in_flight + 1) * len(tasks)`` requests in
    flight on `client`, whose capacity must cover their sum). `push_in_backward`: True (the default), backward
    pushes the gradient of the rows (a hook on the pulled block calls into Python); False,
    backward only accumulates it on the block, and `push_gradients` pushes it, called by
    the trainer after ``loss.backward()`` or, at the latest, by the next forward (before
    its pull, so the rows are the same), `flush`, `close`, `checkpoint` or a
    `PrefetchingLoader` moving on. That saves the hook's cost per step. A forward, and the
    loader, keep the blocks still without a gradient (accumulating over up to 17 forwards
    before one backward works); `push_gradients` forgets them, so call it after the
    backward that covers them.
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
                 push_in_backward: bool = True, cache_bytes: int = 0,
                 _rows: Optional[_Rows] = None) -> None:
        if mode not in _MODES:
            raise InvalidArgument(f"mode {mode!r} is not one of {', '.join(_MODES)} (max is "
                                  "not supported)")
        super().__init__(client, table, dim, peers=peers, job=job, partition=partition,
                         num_embeddings=num_embeddings, staleness=staleness,
                         wire_dtype=wire_dtype, timeout=timeout, pipelined=pipelined,
                         max_pushes_in_flight=max_pushes_in_flight, loss_scale=loss_scale,
                         push_in_backward=push_in_backward, cache_bytes=cache_bytes,
                         _rows=_rows)
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
