"""A PS and a worker in Python over starwire (loopback): fused recv, push, pull, and
embedding rows from starwire's reference in-memory table pulled into a numpy array.

    cargo build -p starwire-ffi && python3 ffi/python/example.py
"""

import numpy as np

import starwire


class Embeddings:
    """The PS's shard: 1000 rows of float32[16]; a push applies SGD with rate 0.5."""

    def __init__(self):
        self.rows = np.zeros((1000, 16), dtype=np.float32)

    def pull(self, ids):
        return [self.rows[i] if i < len(self.rows) else None for i in ids]

    def push(self, ids, grads):
        for i, g in zip(ids, grads):
            self.rows[i] -= 0.5 * g
        return [0] * len(ids)


# Table 0 of the PS: rows of float32[32], drawn from [-0.05, 0.05] on first pull, Adagrad.
table = starwire.MemTable(32, init="uniform", scale=0.05, seed=1, optimizer="adagrad", lr=0.1,
                          initial_accumulator=0.1)

with starwire.Runtime("ps", listen="127.0.0.1:0", service=Embeddings(), tables={0: table}) as ps, \
        starwire.Runtime("worker") as worker:
    peer = f"127.0.0.1:{ps.port}"
    client = worker.client()
    print(f"starwire {starwire.version()}, PS on {peer}, ping {client.ping(peer):.0f} us")

    for i in range(100):
        ps.publish(f"step1/feature/{i}", np.full(4, i, dtype=np.int32))
    got = client.recv_many(peer, 1, [f"step1/feature/{i}" for i in range(100)])
    print(f"fused recv: {len(got)} tensors, last = {got[-1]}")

    ids = [7, 42, 999]
    statuses = client.push(peer, [(i, np.ones(16, dtype=np.float32)) for i in ids])
    rows = client.pull(peer, ids + [5000])
    print(f"push statuses {statuses}; pulled row 42[:4] = {rows[1][:4]}, id 5000 -> {rows[3]}")

    # A batch of ids with repeats, pulled into the trainer's own array (no copy after the
    # socket), a gradient pushed, and the rows pulled again into the same array.
    batch = np.random.default_rng(0).integers(0, 100_000, size=4096, dtype=np.uint64)
    emb = np.empty((len(batch), 32), dtype=np.float32)
    rows, missing = client.pull_rows(peer, 0, batch, 32, out=emb)
    first = emb[0].copy()
    client.push_rows(peer, 0, batch[:1], np.ones((1, 32), dtype=np.float32))
    client.pull_rows(peer, 0, batch, 32, out=emb)
    print(f"rows: {rows.shape} into the trainer's array (same memory: "
          f"{rows.ctypes.data == emb.ctypes.data}), {missing.size} missing; "
          f"row 0[:2] {first[:2]} -> {emb[0][:2]} after one Adagrad step")
    print(f"worker stats: {worker.stats().requests_completed} requests, "
          f"{worker.allocated} tensors received into numpy arrays")
    client.close()
