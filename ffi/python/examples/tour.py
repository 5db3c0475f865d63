"""A PS and a worker over starwire (loopback), one feature of the API after the other:
ping, fused recv of published tensors, per-tensor push and pull served by Python,
embedding rows from starwire's PS table pulled into the trainer's array, a request
submitted while the worker computes, errors, and the PS table's metrics and checkpoint.

    pip install ./ffi/python && python ffi/python/examples/tour.py
"""

from __future__ import annotations

import tempfile
from typing import Any, Optional, Sequence

import numpy as np
import numpy.typing as npt

import starwire


class Embeddings:
    """The PS's variables: 1000 rows of float32[16]; a push applies SGD with rate 0.5."""

    def __init__(self) -> None:
        self.rows = np.zeros((1000, 16), dtype=np.float32)

    def pull(self, ids: list[int]) -> Sequence[Optional[npt.NDArray[Any]]]:
        return [self.rows[i] if i < len(self.rows) else None for i in ids]

    def push(self, ids: list[int], grads: list[npt.NDArray[Any]]) -> Sequence[int]:
        for i, g in zip(ids, grads):
            self.rows[i] -= 0.5 * g
        return [starwire.OK] * len(ids)


def main() -> None:
    # Table 0: rows of float32[32], drawn from [-0.05, 0.05] on first pull, Adagrad.
    table = starwire.PsTable(32, table_id=0, init="uniform", scale=0.05, seed=1,
                             optimizer="adagrad", lr=0.1, initial_accumulator=0.1,
                             capacity=100_000)
    print(table.report())
    with starwire.Runtime("ps", listen="127.0.0.1:0", service=Embeddings(),
                          tables={0: table}, NETWORK_PS_CORE_NUMBER=1) as ps, \
            starwire.Runtime("worker") as worker:
        peer = ps.address
        client = worker.client()
        print(f"starwire {starwire.version()}, PS on {peer}, ping {client.ping(peer):.0f} us")

        for i in range(100):
            ps.publish(f"step1/feature/{i}", np.full(4, i, dtype=np.int32))
        got = client.recv_many(peer, 1, [f"step1/feature/{i}" for i in range(100)])
        print(f"fused recv: {len(got)} tensors in one round trip, last = {got[-1]}")

        ids = [7, 42, 999]
        statuses = client.push(peer, [(i, np.ones(16, dtype=np.float32)) for i in ids])
        rows = client.pull(peer, ids + [5000])
        row42 = rows[1]
        assert row42 is not None
        print(f"push statuses {statuses}; pulled row 42[:4] = {row42[:4]}, id 5000 -> {rows[3]}")

        # A batch of ids with repeats, pulled into the trainer's own array (received there
        # from the socket), a gradient pushed, and the rows pulled again into it.
        batch = np.random.default_rng(0).integers(0, 100_000, size=4096, dtype=np.uint64)
        emb = np.empty((len(batch), 32), dtype=np.float32)
        out, missing = client.pull_rows(peer, 0, batch, 32, out=emb)
        first = emb[0].copy()
        client.push_rows(peer, 0, batch[:1], np.ones((1, 32), dtype=np.float32))
        # Submitted: the pull travels while the worker computes something else.
        pending = client.submit_pull_rows(peer, 0, batch, 32, out=emb)
        norm = float(np.linalg.norm(first))
        pending.wait()
        print(f"rows: {out.shape} into the trainer's array (same memory: {out is emb}), "
              f"{missing.size} missing; row 0[:2] {first[:2]} -> {emb[0][:2]} after one "
              f"Adagrad step (|row 0| was {norm:.3f})")

        try:
            client.pull_rows(peer, 9, batch[:4], 32)
        except starwire.RemoteError as e:
            print(f"table 9: {type(e).__name__} {e.status_name}")
        s = worker.stats()
        print(f"worker: {s.requests_completed} requests, {s.payload_direct} payload bytes "
              f"received straight into arrays")

        # An embedded client: its own event loop, run by this thread inside its calls (no
        # loop thread in between); waits spin up to 300 us before they sleep.
        with worker.embedded_client(STARWIRE_SPIN_US=300) as mine:
            again, _ = mine.pull_rows(peer, 0, batch, 32)
            own = mine.loop_stats()
            print(f"embedded client: rows equal {bool(np.array_equal(again, emb))}, "
                  f"{own.requests_completed} request on its own loop")

        # The PS table: what it did, and a checkpoint of it, loaded into a new table
        # (as a PS would at start).
        m = table.metrics(hot=3)
        print(f"table 0: {m.rows} rows, {m.pulls} pulls of {m.pulled_rows} rows, "
              f"{m.memory_bytes / 1e6:.1f} MB; hottest ids sampled "
              f"{[h.id for h in m.hot]}")
        with tempfile.TemporaryDirectory() as folder:
            saved = table.save(folder)
            again_table = starwire.PsTable.load(folder, 32, table_id=0, optimizer="adagrad",
                                                lr=0.1)
            back, gone = again_table.export_rows(batch)
            print(f"checkpoint: {saved.rows} rows, {saved.bytes} bytes in "
                  f"{saved.seconds * 1e3:.1f} ms; loaded back: rows equal "
                  f"{bool(np.array_equal(back, emb))}, {gone.size} missing")


if __name__ == "__main__":
    main()
