"""`starwire.torch`'s `PrefetchingLoader`: the next batch's rows on their way while this
batch computes (see `starwire.torch`)."""

from __future__ import annotations

from typing import Any, Callable, Generic, Iterable, Iterator, Mapping, Optional, TypeVar, Union

import numpy as np
import numpy.typing as npt

from ._torch_collection import PSEmbeddingBagCollection
from ._torch_modules import PSEmbedding, PSEmbeddingBag, _flat_ids, _PSModule
from .errors import InvalidArgument

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
        #: A pipelined collection: its tables are prefetched together, in one request per
        #: PS task.
        self._shared = (isinstance(embeddings, PSEmbeddingBagCollection)
                        and embeddings._shared is not None)

    def _collection(self) -> PSEmbeddingBagCollection:
        e = self.embeddings
        assert isinstance(e, PSEmbeddingBagCollection)
        return e

    def _lookups(self, batch: B) -> list[tuple[_PSModule, npt.NDArray[np.uint64]]]:
        """Each table's ids of `batch`, checked as its forward checks them (the pull
        deduplicates them)."""
        given = self.ids(batch)
        e = self.embeddings
        if isinstance(e, PSEmbeddingBagCollection):
            if not isinstance(given, Mapping):
                raise InvalidArgument(f"ids(batch) gave a {type(given).__name__}: a "
                                      "collection takes a mapping of feature to ids")
            return [(e._bag(name), _flat_ids(e._bag(name)._lookup(
                t, f"ids(batch)[{name!r}]").ids)) for name, t in given.items()]
        return [(e, _flat_ids(e._lookup(given, "ids(batch)").ids))]

    def __iter__(self) -> Iterator[B]:
        it = iter(self.loader)
        try:
            batch = next(it)
        except StopIteration:
            return
        first = self._lookups(batch)
        if self._shared:
            self._collection()._stage(first)
            self._collection()._prefetch_staged()
        else:
            for m, unique in first:
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
                if self._shared:
                    self._collection()._stage(ahead)
                else:
                    for m, unique in ahead:
                        m._next = unique
            try:
                yield batch
            except GeneratorExit:  # the loop stopped early: no prefetch of a batch not used
                if self._shared:
                    self._collection()._next = None
                for m, _ in ahead:
                    m._next = None
                raise
            # The step is over: gradients a module keeps for a later push go now (before
            # the prefetch, which the staleness bound orders after them); blocks whose
            # backward has not come stay (a loss over several batches).
            for m in self._modules:
                m._push_deferred(forget=False)
            if self._shared:
                # A collection keeps its steps' gradients: they go now, then the next
                # batch's rows if its forward did not request them.
                coll = self._collection()
                coll._send_pending(forget=False)
                coll._prefetch_staged()
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
