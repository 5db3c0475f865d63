"""Embedding modules for PyTorch whose rows live on PS tasks: `PSEmbedding`,
`PSEmbeddingBag` and `PSEmbeddingBagCollection`, drop-in for ``nn.Embedding`` and
``nn.EmbeddingBag`` in a trainer's model. (Only ``import starwire.torch`` imports torch; the
rest of the package does not need it.)

Each forward deduplicates the batch's ids, pulls the unique rows through the sharded rows
client (one request per PS task, all in flight at once; the pull deduplicates in Rust and
gives the inverse: `starwire.Sharded.pull_unique`, `starwire.Pipeline.pull_unique`, or for
a collection `starwire.ShardedTables.pull_unique` and `starwire.PipelineTables.pull_unique`;
no ``torch.unique``), wraps the ``[unique, dim]`` block it was received into as a tensor
without a copy (``torch.from_numpy``), and builds the output with ``F.embedding`` /
``F.embedding_bag`` over that block and the inverse indices. Autograd then gives the gradient of the block,
``[unique, dim]`` with the gradients of duplicate ids already summed, and the backward
pushes it to the PS tasks, whose optimizer applies it (a `PsTable` with
``optimizer="sgd"`` does ``w -= lr * g``). The rows are therefore not parameters: the
trainer's ``torch.optim`` optimizer sees only the dense parameters. With
``push_in_backward=False`` backward runs no Python for the rows (the gradient only
accumulates on the block) and the gradients go at ``push_gradients()``, which the trainer
calls after ``loss.backward()`` (or, at the latest, the next forward, before its pull).

With ``staleness=0`` (the default) a forward waits for its pull and a backward for its
push. With ``staleness=s`` above 0 (or ``pipelined=True``) the table goes through a
`starwire.Pipeline` (the tables of a collection share one `starwire.PipelineTables`, one
request per PS task each way per step): a backward sends its push and returns, and the
rows of a forward may miss at most this worker's `s` most recent pushes (every earlier one
is in them); a push that fails after its backward returned raises at a later forward,
backward or `flush`, never dropped. `PrefetchingLoader` wraps a data loader so that the next batch's rows are
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

from ._torch_collection import PSEmbeddingBagCollection, TableConfig
from ._torch_loader import PrefetchingLoader
from ._torch_modules import MARKER_FORMAT, PSEmbedding, PSEmbeddingBag

__all__ = ["MARKER_FORMAT", "PSEmbedding", "PSEmbeddingBag", "PSEmbeddingBagCollection",
           "PrefetchingLoader", "TableConfig"]
