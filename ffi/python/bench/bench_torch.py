"""starwire.torch's cost, in one process: two PS tasks (`PsTable`s, SGD) and a worker.

    flock /tmp/starwire-build.lock cargo build --release -p starwire-ffi
    STARWIRE_LIB=target/release/libstarwire_ffi.so PYTHONPATH=ffi/python \\
        python3 ffi/python/bench/bench_torch.py --rounds 5

**Overhead**: the per-step cost of `PSEmbeddingBag` over calling the sharded client
directly, on one table, the same ids and the same pull and push (one request per PS task
each way). Three forms take turns step by step, in a random order per turn, each on its
own client, with the same batch:

- **raw**: `Sharded.pull` of the step's unique ids (computed beforehand) into a
  preallocated array, and `Sharded.push` of a preallocated gradient block: the
  communication alone.
- **by hand**: what a trainer writes without the module: ``torch.unique`` with the
  inverse, `Sharded.pull`, ``torch.from_numpy`` as a leaf that requires grad,
  ``F.embedding_bag``, ``backward``, `Sharded.push` of the leaf's gradient.
- **module**: ``bag(ids, offsets).sum().backward()`` on a `PSEmbeddingBag`.
- **by hand, unique pull**: the same with `Sharded.pull_unique` (the deduplication in
  Rust, as the module does it) in place of ``torch.unique`` and `Sharded.pull`.
- **module, push after backward**: the same on a `PSEmbeddingBag` made with
  ``push_in_backward=False``, then ``bag.push_gradients()``.

A figure is the median over rounds of each round's median paired difference per step
(module − by hand: the module's own overhead; module − raw: everything torch adds).
Two batch sizes show whether it grows with the rows (no per-row Python work).

**Training**: a step of a small DLRM-style model (4 tables, bags of 4 ids per example,
a bottom and a top MLP, Adam) with the tables synchronous, pipelined at staleness 0 with a
`PrefetchingLoader`, and at staleness 1 with and without it, through the collection (one
`PipelineTables` for all the tables: one request per PS task each way); and, as the
baseline of that, at staleness 1 with and without the prefetch through a `Pipeline` per
table (`PSEmbeddingBag`s of their own: one request per table and PS task each way). The
configurations take turns round by round, each on its own client; a figure is the median
over rounds of the round's mean step time, visible communication (`PipelineReport.visible`
of the step, summed over the pipelines; the synchronous collection's is timed around its
forward's pull and its backward) and requests per step (the worker's completed requests);
the ratios pair each round's figures.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from typing import Any, Callable, Iterator

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import starwire
from starwire.torch import (PrefetchingLoader, PSEmbeddingBag, PSEmbeddingBagCollection,
                            TableConfig)

DIM = 16


def cluster(tables: int, rows: int) -> tuple[list[starwire.Runtime], starwire.Runtime]:
    def table(t: int) -> starwire.PsTable:
        return starwire.PsTable(DIM, table_id=t, init="uniform", scale=0.05, seed=7,
                                optimizer="sgd", lr=0.01, capacity=rows // 2 + 1024)

    ps = [starwire.Runtime("ps", i, listen="127.0.0.1:0",
                           tables={t: table(t) for t in range(1, tables + 1)},
                           NETWORK_PS_CORE_NUMBER=1) for i in range(2)]
    spec = {"ps": ["127.0.0.1:2222", "127.0.0.1:2223"]}
    endpoints = "".join(f"127.0.0.1:{2222 + i}=127.0.0.1:{p.port}\n" for i, p in enumerate(ps))
    return ps, starwire.Runtime("worker", cluster=spec, endpoint_map=endpoints)


def warm(worker: starwire.Runtime, tables: int, rows: int) -> None:
    """Pulls every row once, so that every table holds its `rows` rows before timing."""
    client = worker.client()
    every = np.arange(rows, dtype=np.uint64)
    for t in range(1, tables + 1):
        sharded = client.sharded(t, DIM)
        for chunk in np.array_split(every, max(1, rows // 20000)):
            sharded.pull(chunk)
        sharded.close()


def overhead(worker: starwire.Runtime, args: argparse.Namespace, bags: int
             ) -> dict[str, list[float]]:
    """Per round, the median paired differences (µs) and the forms' medians."""
    raw_s = worker.client().sharded(1, DIM)
    hand_s = worker.client().sharded(1, DIM)
    hand_u_s = worker.client().sharded(1, DIM)
    module = PSEmbeddingBag(worker.client(), 1, DIM, "sum")
    deferred = PSEmbeddingBag(worker.client(), 1, DIM, "sum", push_in_backward=False)
    rng = np.random.default_rng(3)
    out: dict[str, list[float]] = {k: [] for k in (
        "module-hand", "module-raw", "deferred-hand", "module-hand_u", "deferred-hand_u", "raw",
        "hand", "hand_u", "module", "deferred", "unique")}

    def batch() -> tuple[Any, Any, Any, Any, Any]:
        ids = torch.from_numpy(rng.integers(0, args.rows, size=bags * args.bag))
        offsets = torch.arange(0, bags * args.bag, args.bag)
        unique = np.unique(ids.numpy()).astype(np.uint64)
        rows = np.empty((len(unique), DIM), dtype=np.float32)
        grads = np.ones((len(unique), DIM), dtype=np.float32)
        return ids, offsets, unique, rows, grads

    def raw(b: Any) -> None:
        _, _, unique, rows, grads = b
        raw_s.pull(unique, out=rows)
        raw_s.push(unique, grads)

    def hand(b: Any) -> None:
        ids, offsets = b[0], b[1]
        u, inverse = torch.unique(ids, return_inverse=True)
        uids = u.numpy().view(np.uint64)
        rows, _ = hand_s.pull(uids)
        w = torch.from_numpy(rows).requires_grad_(True)
        pooled: torch.Tensor = F.embedding_bag(inverse, w, offsets, mode="sum")
        pooled.sum().backward()  # type: ignore[no-untyped-call]
        assert w.grad is not None
        hand_s.push(uids, w.grad.numpy())

    def hand_unique(b: Any) -> None:
        ids, offsets = b[0], b[1]
        uids, rows, inverse, _ = hand_u_s.pull_unique(ids.numpy().view(np.uint64))
        w = torch.from_numpy(rows).requires_grad_(True)
        pooled: torch.Tensor = F.embedding_bag(torch.from_numpy(inverse), w, offsets,
                                               mode="sum")
        pooled.sum().backward()  # type: ignore[no-untyped-call]
        assert w.grad is not None
        hand_u_s.push(uids, w.grad.numpy())

    def mod(b: Any) -> None:
        module(b[0], b[1]).sum().backward()

    def mod_deferred(b: Any) -> None:
        deferred(b[0], b[1]).sum().backward()
        deferred.push_gradients()

    forms: dict[str, Callable[[Any], None]] = {"raw": raw, "hand": hand,
                                               "hand_u": hand_unique, "module": mod,
                                               "deferred": mod_deferred}
    for _ in range(args.rounds):
        times: dict[str, list[float]] = {k: [] for k in forms}
        for step in range(args.steps + 20):
            b = batch()
            order = list(forms)
            random.shuffle(order)
            for name in order:
                t0 = time.perf_counter()
                forms[name](b)
                if step >= 20:  # warm-up steps are not counted
                    times[name].append(time.perf_counter() - t0)
        us = {k: np.array(v) * 1e6 for k, v in times.items()}
        out["module-hand"].append(float(np.median(us["module"] - us["hand"])))
        out["module-raw"].append(float(np.median(us["module"] - us["raw"])))
        out["deferred-hand"].append(float(np.median(us["deferred"] - us["hand"])))
        out["module-hand_u"].append(float(np.median(us["module"] - us["hand_u"])))
        out["deferred-hand_u"].append(float(np.median(us["deferred"] - us["hand_u"])))
        for k in forms:
            out[k].append(float(np.median(us[k])))
        out["unique"].append(float(len(b[2])))
    module.close()
    deferred.close()
    return out


class Model(nn.Module):
    def __init__(self, embeddings: nn.Module, tables: int) -> None:
        super().__init__()
        self.embeddings = embeddings
        self.bottom = nn.Sequential(nn.Linear(13, 256), nn.ReLU(), nn.Linear(256, DIM))
        self.top = nn.Sequential(nn.Linear(DIM * (tables + 1), 512), nn.ReLU(),
                                 nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 1))

    def forward(self, b: dict[str, Any]) -> Any:
        bags = self.embeddings(b["ids"])
        x = torch.cat([self.bottom(b["dense"]), *(bags[k] for k in sorted(bags))], dim=1)
        return self.top(x)


class PerTable(nn.Module):
    """The tables as pipelined `PSEmbeddingBag`s of their own (a `Pipeline` each: one
    request per table and PS task each way), taking and giving what the collection does:
    the baseline of the collection's one `PipelineTables`."""

    def __init__(self, client: starwire.Client, tables: int, staleness: int) -> None:
        super().__init__()
        self.bags = nn.ModuleDict({f"t{t}": PSEmbeddingBag(client, t, DIM, "sum",
                                                           staleness=staleness,
                                                           pipelined=True)
                                   for t in range(1, tables + 1)})

    def _each(self) -> Iterator[tuple[str, PSEmbeddingBag]]:
        for k, b in self.bags.items():
            assert isinstance(b, PSEmbeddingBag)
            yield k, b

    def forward(self, ids: dict[str, Any]) -> dict[str, Any]:
        return {k: b(ids[k]) for k, b in self._each()}

    def prefetch(self, ids: dict[str, Any]) -> None:
        for k, b in self._each():
            b.prefetch(ids[k])

    def flush(self) -> None:
        for _, b in self._each():
            b.flush()

    def close(self) -> None:
        for _, b in self._each():
            b.close()


#: Each training configuration: staleness, pipelined, prefetch, a pipeline per table.
CONFIGS = {"synchronous": (0, False, False, False),
           "staleness 0, prefetch": (0, True, True, False),
           "staleness 1": (1, True, False, False),
           "staleness 1, prefetch": (1, True, True, False),
           "staleness 1, a pipeline per table": (1, True, False, True),
           "staleness 1, prefetch, a pipeline per table": (1, True, True, True)}


def training(worker: starwire.Runtime, args: argparse.Namespace
             ) -> dict[str, dict[str, list[float]]]:
    setups = {}
    for name, (staleness, pipelined, _, per_table) in CONFIGS.items():
        # Each on a client of its own, with room for a pipeline per table.
        client = worker.client(capacity=256)
        coll: Any = (PerTable(client, args.tables, staleness) if per_table
                     else PSEmbeddingBagCollection(
                         client, {f"t{t}": TableConfig(t, DIM, "sum")
                                  for t in range(1, args.tables + 1)},
                         staleness=staleness, pipelined=pipelined))
        torch.manual_seed(0)
        model = Model(coll, args.tables)
        setups[name] = (coll, model, torch.optim.Adam(model.parameters(), lr=1e-3))
    rng = np.random.default_rng(5)
    weights = 1.0 / np.arange(1, args.rows + 1, dtype=np.float64) ** args.zipf
    cdf = np.cumsum(weights) / weights.sum()
    n = args.batch

    def batches(count: int) -> Iterator[dict[str, Any]]:
        for _ in range(count):
            ids = {f"t{t}": torch.from_numpy(np.minimum(np.searchsorted(
                cdf, rng.random((n, args.bag))), args.rows - 1))
                for t in range(1, args.tables + 1)}
            yield {"ids": ids, "dense": torch.randn(n, 13), "y": torch.rand(n, 1).round()}

    result: dict[str, dict[str, list[float]]] = {
        k: {"step": [], "visible": [], "requests": []} for k in CONFIGS}
    loss_fn = nn.BCEWithLogitsLoss()
    for _ in range(args.rounds):
        order = list(CONFIGS)
        random.shuffle(order)
        for name in order:
            coll, model, opt = setups[name]
            _, pipelined, prefetch, per_table = CONFIGS[name]
            data = [b for b in batches(args.train_steps)]
            # The collection's tables share one step report; a pipeline per table has one
            # each.
            reporting = ([b for b in coll.bags.values() if isinstance(b, PSEmbeddingBag)]
                         if per_table else [coll])
            visible = 0.0
            loader: Any = (PrefetchingLoader(data, coll, lambda b: b["ids"])
                           if prefetch and not per_table else data)
            requests = worker.stats().requests_completed
            t0 = time.perf_counter()
            for i, b in enumerate(loader):
                if pipelined:
                    bags = coll(b["ids"])
                    if prefetch and per_table and i + 1 < len(data):
                        # As the loader does: the next batch's rows right after this pull.
                        coll.prefetch(data[i + 1]["ids"])
                    x = torch.cat([model.bottom(b["dense"]), *(bags[k] for k in sorted(bags))],
                                  dim=1)
                    loss = loss_fn(model.top(x), b["y"])
                    opt.zero_grad()
                    loss.backward()
                    visible += sum(r.visible for r in (x.last_report for x in reporting)
                                   if isinstance(r, starwire.PipelineReport))
                else:
                    # Synchronous: the pulls and pushes timed where they happen.
                    p0 = time.perf_counter()
                    bags = coll(b["ids"])
                    p1 = time.perf_counter()
                    x = torch.cat([model.bottom(b["dense"]), *(bags[k] for k in sorted(bags))],
                                  dim=1)
                    loss = loss_fn(model.top(x), b["y"])
                    opt.zero_grad()
                    # The backward pushes the tables; the dense part's gradient is computed
                    # first and timed with it (an upper bound).
                    b0 = time.perf_counter()
                    loss.backward()
                    b1 = time.perf_counter()
                    visible += (p1 - p0) + (b1 - b0)
                opt.step()
            coll.flush()
            elapsed = time.perf_counter() - t0
            result[name]["step"].append(elapsed / args.train_steps * 1e3)
            result[name]["visible"].append(visible / args.train_steps * 1e3)
            result[name]["requests"].append(
                (worker.stats().requests_completed - requests) / args.train_steps)
    for coll, _, _ in setups.values():
        coll.close()
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=300, help="overhead steps per round")
    ap.add_argument("--train-steps", type=int, default=60, help="training steps per round")
    ap.add_argument("--rows", type=int, default=100_000, help="rows per table")
    ap.add_argument("--bag", type=int, default=4, help="ids per bag")
    ap.add_argument("--tables", type=int, default=4)
    ap.add_argument("--batch", type=int, default=512, help="examples per training step")
    ap.add_argument("--zipf", type=float, default=1.05)
    ap.add_argument("--sizes", default="64,1024", help="bags per overhead step")
    ap.add_argument("--skip-training", action="store_true", help="the overhead only")
    ap.add_argument("--skip-overhead", action="store_true", help="the training only")
    args = ap.parse_args()
    torch.set_num_threads(1)
    random.seed(1)
    ps, worker = cluster(args.tables, args.rows)
    warm(worker, args.tables, args.rows)
    print(f"starwire {starwire.version()} ({starwire.library_path()}), torch "
          f"{torch.__version__}; 2 PS tasks in process; {args.tables} tables of {args.rows} "
          f"rows x {DIM * 4} B = {args.tables * args.rows * DIM * 4 / 1e6:.1f} MB; load "
          f"average {os.getloadavg()[0]:.2f}")
    sizes = [] if args.skip_overhead else [int(s) for s in args.sizes.split(",")]
    for bags in sizes:
        o = overhead(worker, args, bags)
        med = {k: statistics.median(v) for k, v in o.items()}
        print(f"overhead, {bags} bags x {args.bag} ids ({med['unique']:.0f} unique rows): "
              f"raw {med['raw']:.1f} µs, by hand {med['hand']:.1f} µs, module "
              f"{med['module']:.1f} µs; module - by hand {med['module-hand']:+.1f} µs "
              f"(rounds {', '.join(f'{x:+.1f}' for x in o['module-hand'])}); module - raw "
              f"{med['module-raw']:+.1f} µs")
        print(f"  push_in_backward=False (push_gradients after backward): module "
              f"{med['deferred']:.1f} µs; module - by hand {med['deferred-hand']:+.1f} µs "
              f"(rounds {', '.join(f'{x:+.1f}' for x in o['deferred-hand'])})")
        print(f"  by hand with Sharded.pull_unique (no torch.unique): {med['hand_u']:.1f} µs; "
              f"module - it {med['module-hand_u']:+.1f} µs (rounds "
              f"{', '.join(f'{x:+.1f}' for x in o['module-hand_u'])}); push_in_backward=False "
              f"- it {med['deferred-hand_u']:+.1f} µs (rounds "
              f"{', '.join(f'{x:+.1f}' for x in o['deferred-hand_u'])})")
    if args.skip_training:
        return close(worker, ps)
    t = training(worker, args)
    for name, r in t.items():
        print(f"training, {name}: step {statistics.median(r['step']):.2f} ms, visible "
              f"communication {statistics.median(r['visible']):.2f} ms, "
              f"{statistics.median(r['requests']):.1f} requests per step "
              f"(rounds {', '.join(f'{x:.2f}' for x in r['step'])})")
    for shared, own in (("staleness 1", "staleness 1, a pipeline per table"),
                        ("staleness 1, prefetch", "staleness 1, prefetch, a pipeline per table")):
        ratio = [a / b for a, b in zip(t[shared]["step"], t[own]["step"])]
        vis = [a / b for a, b in zip(t[shared]["visible"], t[own]["visible"]) if b > 0]
        print(f"one pipeline for the {args.tables} tables / a pipeline per table, {shared}: "
              f"step {statistics.median(ratio):.3f}x (rounds "
              f"{', '.join(f'{x:.3f}' for x in ratio)}), visible communication "
              f"{statistics.median(vis):.3f}x")
    close(worker, ps)


def close(worker: starwire.Runtime, ps: list[starwire.Runtime]) -> None:
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    worker.close()
    for p in ps:
        p.close()


if __name__ == "__main__":
    main()
