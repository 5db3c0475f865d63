"""Trains the factorization machine of examples/sparse_training.rs from Python, with numpy
only: PS tasks serve the model's rows, a worker pulls a batch's rows through the sharded
client, computes the loss and the gradients, and pushes them; then the model is evaluated
on held-out examples (loss against the known optimum, and AUC).

    pip install ./ffi/python
    python ffi/python/examples/train_fm.py                 # 2 PS tasks, 400 steps
    python ffi/python/examples/train_fm.py --table python  # rows kept by a Python table
    python ffi/python/examples/train_fm.py --checkpoint DIR  # PS tables saved, and loaded

The data and the model follow ``examples/sparse_training/model.rs``: every example has a
bias feature and one categorical value per field, hashed to a feature id; each id owns a
row of `dim` float32 (one linear weight, `dim - 1` factor components); labels are drawn
from a ground-truth model of the same form, so the best reachable loss is known. The PS
tasks apply Adagrad as gradients arrive: with ``--table ps`` (the default) starwire's
`PsTable` does it in Rust (``--table mem``: the small `MemTable`); with ``--table python``
a `RowsTable` written in numpy below does (``examples/sparse_training/model.rs``'s
`Shard`, the same initial rows and update). With ``--checkpoint DIR`` each PS task's
`PsTable` starts from its checkpoint in ``DIR/ps<i>`` when there is one, and is saved there
at the end: a second run goes on from where the first stopped.

Per step the worker sends, to each PS task, one PULL_ROWS and one PUSH_ROWS frame: the
sharded client removes duplicate ids, spreads the rest over the PS tasks, scatters the
answers into the batch's ``[examples * features, dim]`` array and sums the gradients of
duplicate ids. Python touches no row one by one: the model is a few numpy expressions.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from typing import Any, Optional, Sequence

import numpy as np
import numpy.typing as npt

import starwire

U64 = np.uint64
F32Array = npt.NDArray[np.float32]
U64Array = npt.NDArray[np.uint64]


def mix(x: Any) -> U64Array:
    """splitmix64 of each element (uint64 arithmetic wraps, as in the Rust model)."""
    x = np.asarray(x, dtype=U64)
    with np.errstate(over="ignore"):
        x = x + U64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> U64(30))) * U64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> U64(27))) * U64(0x94D049BB133111EB)
    out: U64Array = x ^ (x >> U64(31))
    return out


def unit(h: U64Array) -> npt.NDArray[np.float64]:
    """A uniform value in (0, 1) from each hash."""
    return ((h >> U64(11)).astype(np.float64) + 0.5) / float(1 << 53)


def normal(h: U64Array) -> F32Array:
    """A standard normal value from each hash (Box-Muller)."""
    u, v = unit(h), unit(mix(h ^ U64(0x5BD1E995)))
    return (np.sqrt(-2.0 * np.log(u)) * np.cos(2 * np.pi * v)).astype(np.float32)


class Model:
    """Sizes and the ground truth (``ModelConfig`` and friends in model.rs)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.fields, self.vocab, self.dim = args.fields, args.vocab, args.dim
        self.batch, self.lr = args.batch, args.lr
        self.zipf, self.hash_bits = 1.1, 24
        self.initial_accumulator = 0.1
        self.true_bias, self.true_linear_std, self.true_factor_std = -1.5, 0.4, 0.05
        self.init_factor_std = 0.01
        weights = 1.0 / np.arange(1, self.vocab + 1, dtype=np.float64) ** self.zipf
        self.cdf = np.cumsum(weights) / weights.sum()

    @property
    def features(self) -> int:
        return int(self.fields) + 1

    def feature_ids(self, values: U64Array) -> U64Array:
        """The id of each ``[example, field]`` value; the bias feature is id 0."""
        fields = mix(np.arange(1, self.fields + 1, dtype=U64))
        ids = mix(fields[None, :] ^ values) & U64((1 << self.hash_bits) - 1)
        ids[ids == 0] = 1
        return ids

    def true_rows(self, ids: U64Array) -> F32Array:
        """The ground truth's row of each id (``true_param``)."""
        k = np.arange(self.dim, dtype=U64)
        with np.errstate(over="ignore"):
            factors = self.true_factor_std * normal(mix(ids[:, None] * U64(131) + k[None, :]))
        rows = factors.astype(np.float32)
        rows[:, 0] = self.true_linear_std * normal(mix(ids ^ U64(0x1111)))
        bias = ids == 0
        rows[bias] = 0.0
        rows[bias, 0] = self.true_bias
        return rows


class Generator:
    """Draws examples from the ground truth: the same draws, in the same order, as the
    Rust example's `Generator` with the same seed."""

    def __init__(self, model: Model, seed: int) -> None:
        self.m = model
        self.state = int(mix(np.array([seed ^ 0xDEADBEEF], dtype=U64))[0])

    def batch(self, n: int) -> tuple[U64Array, F32Array, F32Array]:
        """`n` examples: ids ``[n, features]`` (bias first), labels, and the ground
        truth's logits."""
        m = self.m
        draws = n * (m.fields + 1)
        with np.errstate(over="ignore"):
            counters = U64(self.state) + np.arange(1, draws + 1, dtype=U64)
        self.state = (self.state + draws) % (1 << 64)
        h = mix(counters).reshape(n, m.fields + 1)
        values = np.minimum(np.searchsorted(m.cdf, unit(h[:, :m.fields])), m.vocab - 1)
        ids = np.zeros((n, m.features), dtype=U64)
        ids[:, 1:] = m.feature_ids(values.astype(U64))
        true_logits, _, _ = forward(m.true_rows(ids.ravel()).reshape(n, m.features, m.dim))
        p = 1.0 / (1.0 + np.exp(-true_logits.astype(np.float64)))
        labels = (unit(h[:, m.fields]) < p).astype(np.float32)
        return ids, labels, true_logits


def forward(rows: F32Array) -> tuple[F32Array, F32Array, F32Array]:
    """Logits of examples from their rows ``[examples, features, dim]``; also the factors
    and their per-example sums, for the gradients."""
    v = rows[:, :, 1:]
    s = v.sum(axis=1)
    pairs = 0.5 * (s * s - (v * v).sum(axis=1)).sum(axis=1)
    return rows[:, :, 0].sum(axis=1) + pairs, v, s


def log_loss(logits: F32Array, labels: F32Array) -> float:
    x = logits.astype(np.float64)
    return float(np.mean(np.maximum(x, 0) - x * labels + np.log1p(np.exp(-np.abs(x)))))


def auc(scores: Any, labels: F32Array) -> float:
    """Area under the ROC curve (ties count half)."""
    order = np.argsort(scores, kind="mergesort")
    _, inverse, counts = np.unique(np.asarray(scores)[order], return_inverse=True,
                                   return_counts=True)
    ends = np.cumsum(counts)
    ranks = ((ends - counts + 1 + ends) / 2.0)[inverse]
    positive = labels[order] > 0.5
    p = float(positive.sum())
    n = len(labels) - p
    if p == 0 or n == 0:
        return 0.5
    return float((ranks[positive].sum() - p * (p + 1) / 2) / (p * n))


class AdagradShard:
    """A PS task's rows with their Adagrad state, kept in numpy (the `Shard` of
    ``examples/sparse_training/model.rs``): a row never updated reads as its initial value."""

    dtype = np.float32

    def __init__(self, model: Model) -> None:
        self.m = model
        self.row_shape = (model.dim,)
        self.lock = threading.Lock()
        self.index: dict[int, int] = {}
        self.rows = np.zeros((1024, model.dim), dtype=np.float32)
        self.accum = np.zeros((1024, model.dim), dtype=np.float32)

    def initial(self, ids: U64Array) -> F32Array:
        k = np.arange(self.m.dim, dtype=U64)
        rows = self.m.init_factor_std * normal(mix(ids[:, None] ^ U64(0xABCD0000) ^ k[None, :]))
        rows[:, 0] = 0.0
        return rows.astype(np.float32)

    def pull(self, ids: U64Array, out: F32Array) -> Optional[Sequence[int]]:
        with self.lock:
            at = np.array([self.index.get(i, -1) for i in ids.tolist()], dtype=np.int64)
            known = at >= 0
            out[known] = self.rows[at[known]]
            out[~known] = self.initial(ids[~known])
        return None

    def push(self, ids: U64Array, grads: F32Array) -> None:
        with self.lock:
            at = np.empty(len(ids), dtype=np.int64)
            for j, i in enumerate(ids.tolist()):
                slot = self.index.get(i)
                if slot is None:
                    slot = len(self.index)
                    self.index[i] = slot
                    if slot == len(self.rows):
                        self.rows = np.concatenate([self.rows, np.zeros_like(self.rows)])
                        self.accum = np.concatenate([self.accum, np.zeros_like(self.accum)])
                    self.rows[slot] = self.initial(np.array([i], dtype=U64))[0]
                    self.accum[slot] = self.m.initial_accumulator
                at[j] = slot
            # The ids of one push are distinct (the worker's sharded client merged them).
            self.accum[at] += grads * grads
            self.rows[at] -= self.m.lr * grads / np.sqrt(self.accum[at])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ps", type=int, default=2, help="PS tasks (default 2)")
    ap.add_argument("--steps", type=int, default=400, help="training steps (default 400)")
    ap.add_argument("--batch", type=int, default=512, help="examples per step (default 512)")
    ap.add_argument("--fields", type=int, default=16, help="fields per example (default 16)")
    ap.add_argument("--vocab", type=int, default=300, help="values per field (default 300)")
    ap.add_argument("--dim", type=int, default=16, help="float32 per row (default 16)")
    ap.add_argument("--lr", type=float, default=0.05, help="Adagrad rate (default 0.05)")
    ap.add_argument("--eval", type=int, default=20000, help="held-out examples (default 20000)")
    ap.add_argument("--table", choices=["ps", "mem", "python"], default="ps",
                    help="the PS tasks' rows: starwire's PsTable (Rust, the default), its "
                    "small MemTable, or a numpy table")
    ap.add_argument("--checkpoint", metavar="DIR",
                    help="PS tables start from their checkpoints in DIR/ps<i> when there "
                    "are some, and are saved there at the end (--table ps)")
    ap.add_argument("--check", action="store_true",
                    help="exit with status 1 unless training went well (for CI)")
    args = ap.parse_args()
    m = Model(args)
    table_id = 1

    if args.checkpoint and args.table != "ps":
        ap.error("--checkpoint saves PsTables: use it with --table ps")

    def table(i: int) -> Any:
        if args.table == "python":
            return AdagradShard(m)
        # Uniform in [-a, a] has the standard deviation a / sqrt(3).
        scale = m.init_factor_std * 3 ** 0.5
        if args.table == "mem":
            return starwire.MemTable(m.dim, init="uniform", scale=scale, seed=7,
                                     optimizer="adagrad", lr=m.lr,
                                     initial_accumulator=m.initial_accumulator)
        settings: dict[str, Any] = dict(
            table_id=table_id, init="uniform", scale=scale, seed=7, optimizer="adagrad",
            lr=m.lr, initial_accumulator=m.initial_accumulator,
            capacity=m.fields * m.vocab + 1)
        if args.checkpoint:
            t = starwire.PsTable.load(f"{args.checkpoint}/ps{i}", m.dim, missing_ok=True,
                                      **settings)
            print(f"ps:{i}: {len(t)} rows from {args.checkpoint}/ps{i}")
            return t
        return starwire.PsTable(m.dim, **settings)

    tables = [table(i) for i in range(args.ps)]
    ps = [starwire.Runtime("ps", i, listen="127.0.0.1:0", tables={table_id: tables[i]},
                           NETWORK_PS_CORE_NUMBER=1) for i in range(args.ps)]
    # Task names as a job has them: the cluster spec's control addresses, and the endpoint
    # map from those to where each PS's starwire listens.
    cluster = {"ps": [f"127.0.0.1:{2222 + i}" for i in range(args.ps)]}
    endpoint_map = "".join(f"127.0.0.1:{2222 + i}=127.0.0.1:{p.port}\n"
                           for i, p in enumerate(ps))
    with starwire.Runtime("worker", cluster=cluster, endpoint_map=endpoint_map) as worker:
        client = worker.client()
        rows_table = client.sharded(table_id, m.dim, job="ps", partition="hash")
        print(f"starwire {starwire.version()}: {args.ps} PS tasks ({args.table} tables), "
              f"batch {m.batch} x {m.features} features, rows of {m.dim} float32")
        gen = Generator(m, seed=1)
        n = m.batch * m.features
        rows = np.empty((n, m.dim), dtype=np.float32)
        grads = np.empty((m.batch, m.features, m.dim), dtype=np.float32)
        comm = compute = 0.0
        window: list[float] = []
        for step in range(1, args.steps + 1):
            ids, labels, _ = gen.batch(m.batch)
            t0 = time.perf_counter()
            rows_table.pull(ids.ravel(), out=rows)
            t1 = time.perf_counter()
            r = rows.reshape(m.batch, m.features, m.dim)
            logits, v, s = forward(r)
            window.append(log_loss(logits, labels))
            g = (1.0 / (1.0 + np.exp(-logits)) - labels).astype(np.float32)
            grads[:, :, 0] = g[:, None]
            grads[:, :, 1:] = g[:, None, None] * (s[:, None, :] - v)
            t2 = time.perf_counter()
            rows_table.push(ids.ravel(), grads.reshape(n, m.dim))
            t3 = time.perf_counter()
            comm += (t1 - t0) + (t3 - t2)
            compute += t2 - t1
            if step % 50 == 0 or step == args.steps:
                print(f"step {step:4}: loss {np.mean(window):.4f}; per step: communication "
                      f"{comm / step * 1e3:.2f} ms, compute {compute / step * 1e3:.2f} ms")
                window = []

        # Held-out examples (a seed the training did not use).
        ids, labels, true_logits = Generator(m, seed=12345).batch(args.eval)
        got, report = rows_table.pull(ids.ravel())
        logits, _, _ = forward(got.reshape(args.eval, m.features, m.dim))
        loss, optimum = log_loss(logits, labels), log_loss(true_logits, labels)
        rate = float(labels.mean())
        constant = -(rate * np.log(rate) + (1 - rate) * np.log(1 - rate))
        model_auc, optimum_auc = auc(logits, labels), auc(true_logits, labels)
        print(f"held-out {args.eval} examples: loss {loss:.4f} (optimum {optimum:.4f}, best "
              f"constant {constant:.4f}); AUC {model_auc:.4f} (optimum {optimum_auc:.4f})")
        stats = worker.stats()
        print(f"worker: {stats.requests_completed} requests, {stats.frames_out} frames out, "
              f"{stats.bytes_in / 1e6:.1f} MB in, {stats.bytes_out / 1e6:.1f} MB out")
    for i, t in enumerate(tables):
        if isinstance(t, starwire.PsTable):
            tm = t.metrics(hot=3)
            hot = ", ".join(f"{h.id}" for h in tm.hot)
            print(f"ps:{i}: {tm.rows} rows, {tm.memory_bytes / 1e6:.1f} MB of memory, "
                  f"{tm.pushed_rows} gradient rows applied; hottest ids {hot}")
            if args.checkpoint:
                saved = t.save(f"{args.checkpoint}/ps{i}")
                print(f"ps:{i}: saved {saved.rows} rows ({saved.bytes} bytes) in "
                      f"{saved.seconds:.3f} s to {saved.path}")
    for p in ps:
        p.close()
    if args.check and not (loss < constant and model_auc > 0.6):
        print("check failed: the model did not beat the best constant with AUC above 0.6",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
