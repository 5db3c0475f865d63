"""Trains a small DLRM-style click model with starwire.torch: several embedding tables on
PS tasks (pulled as bags through `PSEmbeddingBagCollection`, updated by Adagrad on the PS
tasks), a bottom MLP for the dense features and a top MLP over the features' pairwise
dot products (dense Adam through torch.optim), on synthetic click data; then evaluated on
held-out examples (loss against the best constant, and AUC).

    pip install ./ffi/python torch
    python ffi/python/examples/dlrm.py                          # 2 PS tasks, staleness 0
    python ffi/python/examples/dlrm.py --prefetch               # next batch's rows early
    python ffi/python/examples/dlrm.py --prefetch --staleness 2 # pushes not waited for
    python ffi/python/examples/dlrm.py --zipf 1.3 --check       # exit 1 unless it learns

Each example has `--dense` standard normal features and, per table, a bag of `--bag` ids
drawn from `--vocab` values with Zipf exponent `--zipf` (a few ids are most of the
traffic, as in click logs). The label is drawn from a ground truth: a logistic model of
the dense features plus a fixed effect per id. The tables go through the pipelined client
at every staleness (at 0 it gives the synchronous modules' results exactly), so each step
reports its *visible* communication: the seconds the step's pulls, prefetches and pushes
kept the computation waiting. With ``--prefetch`` a `PrefetchingLoader` requests the next
batch's rows while this batch computes; with ``--staleness S`` a step's rows may miss
this worker's S most recent pushes, so a pull does not wait for the push before it.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any, Iterator

import numpy as np
import torch
from torch import Tensor, nn

import starwire
from starwire.torch import PrefetchingLoader, PSEmbeddingBagCollection, TableConfig

Batch = dict[str, Any]


class Data:
    """The ground truth and its examples: a batch is the dense features ``[n, dense]``,
    per table a 2-D ``[n, bag]`` tensor of ids, and the labels ``[n, 1]``."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.a = args
        truth = np.random.default_rng(99)
        self.dense_w = truth.normal(0.0, 0.5, args.dense)
        # A fixed effect per id: the popular ids' effects matter most, and are learnt.
        self.effects = truth.normal(0.0, 0.7, (args.tables, args.vocab))
        weights = 1.0 / np.arange(1, args.vocab + 1, dtype=np.float64) ** args.zipf
        self.cdf = np.cumsum(weights) / weights.sum()
        # Which value each Zipf rank is, per table (so that ids 0, 1, ... are not the
        # popular ones everywhere).
        self.perm = np.stack([truth.permutation(args.vocab) for _ in range(args.tables)])

    def batch(self, rng: np.random.Generator, n: int) -> Batch:
        a = self.a
        x = rng.standard_normal((n, a.dense)).astype(np.float32)
        ranks = np.minimum(np.searchsorted(self.cdf, rng.random((a.tables, n, a.bag))),
                           a.vocab - 1)
        ids = np.stack([self.perm[t][ranks[t]] for t in range(a.tables)])
        logit = -1.0 + x @ self.dense_w
        for t in range(a.tables):
            logit = logit + self.effects[t][ids[t]].sum(axis=1) / np.sqrt(a.bag)
        y = (rng.random(n) < 1.0 / (1.0 + np.exp(-logit))).astype(np.float32)
        return {"dense": torch.from_numpy(x),
                "ids": {f"t{t}": torch.from_numpy(ids[t]) for t in range(a.tables)},
                "y": torch.from_numpy(y[:, None])}

    def loader(self, seed: int, batches: int, n: int) -> Iterator[Batch]:
        rng = np.random.default_rng(seed)
        for _ in range(batches):
            yield self.batch(rng, n)


class DLRM(nn.Module):
    """Bottom MLP on the dense features, the embedding bags, their pairwise dot products,
    and a top MLP to the logit."""

    def __init__(self, embeddings: PSEmbeddingBagCollection, dense: int, dim: int,
                 tables: int) -> None:
        super().__init__()
        self.embeddings = embeddings
        self.bottom = nn.Sequential(nn.Linear(dense, 32), nn.ReLU(), nn.Linear(32, dim),
                                    nn.ReLU())
        pairs = (tables + 1) * tables // 2
        self.top = nn.Sequential(nn.Linear(dim + pairs, 32), nn.ReLU(), nn.Linear(32, 1))
        k = tables + 1
        self.rows, self.cols = torch.triu_indices(k, k, offset=1)

    def forward(self, batch: Batch) -> Tensor:
        bottom = self.bottom(batch["dense"])
        bags = self.embeddings(batch["ids"])
        features = torch.stack([bottom, *(bags[name] for name in sorted(bags))], dim=1)
        dots = torch.bmm(features, features.transpose(1, 2))[:, self.rows, self.cols]
        out: Tensor = self.top(torch.cat([bottom, dots], dim=1))
        return out


def auc(scores: Any, labels: Any) -> float:
    """Area under the ROC curve (ties count half)."""
    scores, labels = np.asarray(scores), np.asarray(labels)
    order = np.argsort(scores, kind="mergesort")
    _, inverse, counts = np.unique(scores[order], return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    ranks = ((ends - counts + 1 + ends) / 2.0)[inverse]
    positive = labels[order] > 0.5
    p = float(positive.sum())
    n = len(labels) - p
    if p == 0 or n == 0:
        return 0.5
    return float((ranks[positive].sum() - p * (p + 1) / 2) / (p * n))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ps", type=int, default=2, help="PS tasks (default 2)")
    ap.add_argument("--tables", type=int, default=4, help="embedding tables (default 4)")
    ap.add_argument("--vocab", type=int, default=2000, help="ids per table (default 2000)")
    ap.add_argument("--zipf", type=float, default=1.1, help="Zipf exponent of the ids "
                    "(default 1.1)")
    ap.add_argument("--bag", type=int, default=3, help="ids per example and table (default 3)")
    ap.add_argument("--dense", type=int, default=8, help="dense features (default 8)")
    ap.add_argument("--dim", type=int, default=16, help="float32 per row (default 16)")
    ap.add_argument("--steps", type=int, default=300, help="training steps (default 300)")
    ap.add_argument("--batch", type=int, default=256, help="examples per step (default 256)")
    ap.add_argument("--eval", type=int, default=20000, help="held-out examples "
                    "(default 20000)")
    ap.add_argument("--staleness", type=int, default=0, help="pushes a step's rows may miss "
                    "(default 0: the synchronous results)")
    ap.add_argument("--prefetch", action="store_true",
                    help="request the next batch's rows while this one computes")
    ap.add_argument("--check", action="store_true",
                    help="exit with status 1 unless the held-out loss is below the best "
                    "constant's (for CI)")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    data = Data(args)

    def ps_table(t: int) -> starwire.PsTable:
        return starwire.PsTable(args.dim, table_id=t, init="uniform", scale=0.05, seed=7,
                                optimizer="adagrad", lr=0.05, capacity=args.vocab + 1)

    ps = [starwire.Runtime("ps", i, listen="127.0.0.1:0",
                           tables={t: ps_table(t) for t in range(1, args.tables + 1)},
                           NETWORK_PS_CORE_NUMBER=1) for i in range(args.ps)]
    cluster = {"ps": [f"127.0.0.1:{2222 + i}" for i in range(args.ps)]}
    endpoint_map = "".join(f"127.0.0.1:{2222 + i}=127.0.0.1:{p.port}\n"
                           for i, p in enumerate(ps))
    with starwire.Runtime("worker", cluster=cluster, endpoint_map=endpoint_map) as worker:
        client = worker.client()
        embeddings = PSEmbeddingBagCollection(
            client, {f"t{t}": TableConfig(t + 1, args.dim, "sum", num_embeddings=args.vocab)
                     for t in range(args.tables)},
            staleness=args.staleness, pipelined=True)
        model = DLRM(embeddings, args.dense, args.dim, args.tables)
        opt = torch.optim.Adam(model.parameters(), lr=0.003)
        print(f"starwire {starwire.version()}: {args.ps} PS tasks, {args.tables} tables of "
              f"{args.vocab} rows x {args.dim} float32, zipf {args.zipf}, batch {args.batch} "
              f"x {args.bag} ids per table; staleness {args.staleness}, prefetch "
              f"{'on' if args.prefetch else 'off'}")
        batches: Any = data.loader(1, args.steps, args.batch)
        if args.prefetch:
            batches = PrefetchingLoader(batches, embeddings, lambda b: b["ids"])
        loss_fn = nn.BCEWithLogitsLoss()
        window: list[float] = []
        visible = total = 0.0
        start = time.perf_counter()
        for step, batch in enumerate(batches, 1):
            loss = loss_fn(model(batch), batch["y"])
            opt.zero_grad()
            loss.backward()
            opt.step()
            window.append(loss.item())
            # The step's report of all the tables, as its push left it: the whole step's.
            report = embeddings.last_report
            if isinstance(report, starwire.PipelineReport):
                visible += report.visible
            if step % 50 == 0 or step == args.steps:
                total = time.perf_counter() - start
                print(f"step {step:4}: loss {np.mean(window):.4f}; per step: visible "
                      f"communication {visible / step * 1e3:.3f} ms of {total / step * 1e3:.2f}"
                      " ms")
                window = []
        embeddings.flush()

        model.eval()
        held = data.batch(np.random.default_rng(12345), args.eval)
        with torch.no_grad():
            logits = model(held)
        labels = held["y"]
        loss = float(loss_fn(logits, labels))
        rate = float(labels.mean())
        constant = -(rate * np.log(rate) + (1 - rate) * np.log(1 - rate))
        model_auc = auc(logits.numpy().ravel(), labels.numpy().ravel())
        print(f"held-out {args.eval} examples: loss {loss:.4f} (best constant "
              f"{constant:.4f}); AUC {model_auc:.4f}")
        stats = worker.stats()
        print(f"worker: {stats.requests_completed} requests, {stats.bytes_in / 1e6:.1f} MB "
              f"in, {stats.bytes_out / 1e6:.1f} MB out")
        embeddings.close()
    for p in ps:
        p.close()
    if args.check and not (loss < constant and model_auc > 0.6):
        print("check failed: the held-out loss is not below the best constant's with AUC "
              "above 0.6", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
