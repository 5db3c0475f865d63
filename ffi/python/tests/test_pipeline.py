"""The pipelined sharded rows client over loopback sockets, two PS tasks: staleness 0 gives
the sharded client's rows; staleness 2 delivers rows while pushes are unanswered; a push
that failed after its call returned raises at the next call that finds it, once."""

from __future__ import annotations

import threading
import time
import unittest
from typing import Any, Optional, Sequence, Union

import numpy as np
import numpy.typing as npt

import starwire

DIM = 4
TABLE = 7


class HeldTable:
    """A Python rows table: float32 rows of DIM, zero until pushed, SGD with rate 1. It
    counts the pushes it receives and applies, holds pushes until `released` is set (at
    most 20 s), and refuses (an exception: ``INTERNAL``) a push whose first gradient is at
    least 500."""

    dtype = np.float32
    row_shape = (DIM,)

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.rows: dict[int, npt.NDArray[np.float32]] = {}
        self.released = threading.Event()
        self.released.set()
        self.received = 0
        self.applied = 0

    def pull(self, ids: npt.NDArray[np.uint64], out: npt.NDArray[Any]) -> Optional[Sequence[int]]:
        with self.lock:
            for i, id_ in enumerate(ids.tolist()):
                out[i] = self.rows.get(id_, 0.0)
        return None

    def push(self, ids: npt.NDArray[np.uint64], grads: npt.NDArray[Any]) -> None:
        with self.lock:
            self.received += 1
        self.released.wait(20)
        if grads[0, 0] >= 500:
            raise ValueError("gradients refused")
        with self.lock:
            for id_, g in zip(ids.tolist(), grads):
                self.rows[id_] = self.rows.get(id_, np.zeros(DIM, np.float32)) - g
            self.applied += 1

    def wait_received(self, n: int) -> None:
        give_up = time.monotonic() + 20
        while self.received < n and time.monotonic() < give_up:
            time.sleep(0.001)


Table = Union[starwire.MemTable, starwire.RowsTable]


class PipelineTest(unittest.TestCase):
    def ps_tasks(self, tables: Sequence[Table], handler_threads: int = 0
                 ) -> list[starwire.Runtime]:
        """PS tasks ps:0, ps:1, ... serving `tables` as table TABLE, closed after the test."""
        ps = [starwire.Runtime("ps", i, listen="127.0.0.1:0", tables={TABLE: t},
                               handler_threads=handler_threads)
              for i, t in enumerate(tables)]
        for p in ps:
            self.addCleanup(p.close)
        return ps

    def worker(self, ps: Sequence[starwire.Runtime]) -> starwire.Client:
        """A worker whose cluster spec names `ps` ps:0, ps:1, ... (no connect retries)."""
        cluster = {"ps": [f"127.0.0.1:{3000 + i}" for i in range(len(ps))]}
        endpoints = "".join(f"127.0.0.1:{3000 + i}=127.0.0.1:{p.port}\n"
                            for i, p in enumerate(ps))
        worker = starwire.Runtime("worker", cluster=cluster, endpoint_map=endpoints,
                                  STARWIRE_CONNECT_RETRIES=0)
        # Closed first (cleanups run last in, first out): its pipelines before the PS tasks.
        self.addCleanup(worker.close)
        self.worker_rt = worker
        return worker.client()

    def test_staleness_0_gives_the_sharded_client_s_rows(self) -> None:
        def table() -> starwire.MemTable:
            return starwire.MemTable(DIM, init="uniform", scale=0.1, seed=3,
                                     optimizer="adagrad", lr=0.1)

        a = self.ps_tasks([table(), table()])
        b = self.ps_tasks([table(), table()])
        client = self.worker(a)
        sync = client.sharded(TABLE, DIM, peers=[p.address for p in a])
        pipe = starwire.Pipeline(client, TABLE, DIM, peers=[p.address for p in b],
                                 settings=starwire.PipelineSettings(staleness=0))
        rng = np.random.default_rng(1)
        batches = [rng.integers(0, 30, 24, dtype=np.uint64) for _ in range(10)]
        pipe.prefetch(batches[0])
        for t, ids in enumerate(batches):
            want, _ = sync.pull(ids)
            got, report = pipe.pull(ids)
            self.assertEqual((report.step, report.may_miss), (t, 0))
            np.testing.assert_array_equal(got, want, err_msg=f"step {t}")
            if t + 1 < len(batches):
                pipe.prefetch(batches[t + 1])
            # A gradient that depends on the rows pulled: any difference in them shows.
            grads = got * 0.5 - 0.01
            sync.push(ids, grads)
            report = pipe.push(ids, grads)
            self.assertEqual(report.rows_sent, report.unique)
            self.assertEqual(report.pushes_in_flight, 1, "the push just sent is unanswered")
        pipe.flush()
        self.assertEqual((pipe.steps(), pipe.pushes(), pipe.pushes_in_flight()), (10, 10, 0))
        # The tables of both clusters end equal.
        every = np.arange(30, dtype=np.uint64)
        x, _ = sync.pull(every)
        y, _ = client.sharded(TABLE, DIM, peers=[p.address for p in b]).pull(every)
        np.testing.assert_array_equal(x, y)
        pipe.close()

    def test_staleness_2_delivers_rows_while_pushes_are_unanswered(self) -> None:
        held = [HeldTable(), HeldTable()]
        # Four handler threads: three held pushes leave one to serve the pulls.
        client = self.worker(self.ps_tasks(held, handler_threads=4))
        settings = starwire.PipelineSettings(staleness=2, max_pushes_in_flight=3, timeout=20)
        pipe = starwire.Pipeline(client, TABLE, DIM, peers=["ps:0", "ps:1"], settings=settings)
        ids = np.array([0, 1, 2, 3, 4, 5, 0], dtype=np.uint64)  # id 0 twice: summed
        ones = np.ones((len(ids), DIM), dtype=np.float32)
        for h in held:
            h.released.clear()
        try:
            pipe.prefetch(ids)
            for t in range(3):
                rows, report = pipe.pull(ids)
                # Sent before any push was answered: the rows miss every push sent so far,
                # and no more than the bound.
                self.assertEqual((report.step, report.may_miss, report.refetched), (t, t, 0))
                np.testing.assert_array_equal(rows, 0)
                if t < 2:
                    pipe.prefetch(ids)
                report = pipe.push(ids, ones)
                self.assertEqual(report.pushes_in_flight, t + 1)
            self.assertEqual(pipe.pushes_in_flight(), 3)
            for h in held:
                h.wait_received(1)
                self.assertEqual((h.received >= 1, h.applied), (True, 0))
        except BaseException:
            for h in held:
                h.released.set()
            raise
        # Released by another thread while this one waits in flush (which runs without the
        # GIL: the tables' Python and the releasing thread run meanwhile).
        flushing = threading.Event()

        def release() -> None:
            flushing.wait(20)
            for h in held:
                h.released.set()

        releaser = threading.Thread(target=release)
        releaser.start()
        flushing.set()
        report = pipe.flush()
        releaser.join()
        self.assertEqual(report.pushes_in_flight, 0)
        self.assertEqual([h.applied for h in held], [3, 3])
        rows, report = pipe.pull(ids)
        want = np.where(ids == 0, -6.0, -3.0).astype(np.float32)
        np.testing.assert_array_equal(rows, np.repeat(want[:, None], DIM, axis=1))
        pipe.close()

    def test_a_refused_push_raises_at_the_next_call_with_the_ps_task_and_status(self) -> None:
        held = [HeldTable(), HeldTable()]
        client = self.worker(self.ps_tasks(held))
        pipe = starwire.Pipeline(client, TABLE, DIM, peers=["ps:0", "ps:1"],
                                 settings=starwire.PipelineSettings(staleness=1, timeout=20))
        ids = np.arange(6, dtype=np.uint64)
        pipe.prefetch(ids)
        # The PS tables log the refusal; the assertion keeps it out of the test's output.
        with self.assertLogs("starwire", "ERROR"):
            for t in range(2):
                pipe.pull(ids)
                pipe.prefetch(ids)
                # Step 1's gradients are refused by both PS tasks; the push returns at once.
                pipe.push(ids, np.full((6, DIM), 1000.0 if t == 1 else 1.0, np.float32))
            with self.assertRaises(starwire.RemoteError) as caught:
                pipe.flush()
        e = caught.exception
        self.assertEqual(e.status, starwire.INTERNAL, str(e))
        failed = e.failed_pushes
        self.assertEqual(sorted((f.step, f.shard) for f in failed), [(1, 0), (1, 1)], str(e))
        self.assertEqual(e.task, f"ps:{failed[0].shard}")
        for f in failed:
            self.assertEqual(f.peer, client.runtime.peer(f"ps:{f.shard}"))
            self.assertIn(f"step 1 to PS {f.shard} ({f.peer})", str(e))
            err = f.error
            assert isinstance(err, starwire.RemoteError), repr(err)
            self.assertEqual((err.task, err.status), (f"ps:{f.shard}", starwire.INTERNAL))
        self.assertEqual(pipe.failed_pushes(), failed)
        # Reported once: the next calls go on, and the refused push was not applied.
        pipe.flush()
        self.assertEqual(pipe.failed_pushes(), [])
        rows, _ = pipe.pull(ids)
        np.testing.assert_array_equal(rows, -1.0)
        self.assertEqual([(h.received, h.applied) for h in held], [(2, 1), (2, 1)])
        pipe.close()

    def test_a_killed_ps_s_push_raises_at_the_next_call(self) -> None:
        ps = self.ps_tasks([starwire.MemTable(DIM, lr=1.0), starwire.MemTable(DIM, lr=1.0)])
        client = self.worker(ps)
        pipe = starwire.Pipeline(client, TABLE, DIM, peers=["ps:0", "ps:1"],
                                 settings=starwire.PipelineSettings(staleness=0, timeout=20))
        ids = np.arange(6, dtype=np.uint64)
        ones = np.ones((6, DIM), dtype=np.float32)
        pipe.prefetch(ids)
        pipe.pull(ids)
        pipe.prefetch(ids)
        pipe.push(ids, ones)
        pipe.pull(ids)
        pipe.prefetch(ids)
        pipe.flush()
        # PS 1 goes away between step 1's pull and its push.
        dead = ps[1].address
        ps[1].close()
        pipe.push(ids, ones)  # returns without waiting; its part at PS 1 fails after
        # Staleness 0: the next pull waits for that push, and raises its failure.
        with self.assertRaises(starwire.StarwireError) as caught:
            pipe.pull(ids)
        e = caught.exception
        shutdown = isinstance(e, starwire.Refused) and e.status == starwire.SHUTDOWN
        self.assertTrue(isinstance(e, (starwire.ConnectFailed, starwire.ConnectionLost))
                        or shutdown, repr(e))
        self.assertEqual(e.task, "ps:1", str(e))
        self.assertIn("step 1 to PS 1", str(e))
        self.assertEqual([(f.step, f.shard, f.peer) for f in e.failed_pushes],
                         [(1, 1, dead)])
        self.assertEqual(pipe.steps(), 2, "the failed call delivered nothing")

    def test_bad_arguments_are_refused_before_anything_is_sent(self) -> None:
        ps = self.ps_tasks([starwire.MemTable(DIM), starwire.MemTable(DIM)])
        client = self.worker(ps)
        with self.assertRaisesRegex(starwire.InvalidArgument, "max_pushes_in_flight"):
            starwire.Pipeline(client, TABLE, DIM,
                              settings=starwire.PipelineSettings(max_pushes_in_flight=0))
        with self.assertRaises(starwire.InvalidArgument):
            starwire.Pipeline(client, TABLE, DIM, partition="random")
        pipe = starwire.Pipeline(client, TABLE, DIM)  # every ps task of the cluster spec
        self.assertEqual(pipe.peers, [p.address for p in ps])
        with self.assertRaises(starwire.InvalidArgument):
            pipe.pull([1, 2], np.empty((3, DIM), dtype=np.float32))
        with self.assertRaises(starwire.InvalidArgument):
            pipe.push([1, 2], np.ones((2, DIM), dtype=np.float64))
        with self.assertRaises(starwire.InvalidArgument):
            pipe.prefetch([1, -2])
        self.assertEqual(self.worker_rt.stats().requests_completed, 0)
        self.assertEqual(pipe.settings(), starwire.PipelineSettings())
        pipe.close()
        with self.assertRaises(starwire.Closed):
            pipe.flush()


if __name__ == "__main__":
    unittest.main()
