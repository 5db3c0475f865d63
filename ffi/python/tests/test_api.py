"""The runtime and the client over real loopback sockets: settings, task names, per-tensor
pull and push, the rendezvous, and the submitted (non-blocking) form."""

from __future__ import annotations

import threading
import unittest
from typing import Any, Optional, Sequence

import numpy as np
import numpy.typing as npt

import starwire


class Variables:
    """A PS's variables: float32[8] each; a push adds into the variable."""

    def __init__(self, n: int) -> None:
        self.lock = threading.Lock()
        self.rows = [np.full(8, i, dtype=np.float32) for i in range(n)]

    def pull(self, ids: list[int]) -> Sequence[Optional[npt.NDArray[Any]]]:
        with self.lock:
            return [self.rows[i] if i < len(self.rows) else None for i in ids]

    def push(self, ids: list[int], arrays: list[npt.NDArray[Any]]) -> Sequence[int]:
        with self.lock:
            out = []
            for i, a in zip(ids, arrays):
                if i >= len(self.rows) or a.shape != (8,) or a.dtype != np.float32:
                    out.append(starwire.INVALID_ARGUMENT)
                else:
                    self.rows[i] += a
                    out.append(starwire.OK)
            return out


class ApiTest(unittest.TestCase):
    def setUp(self) -> None:
        self.ps = starwire.Runtime("ps", listen="127.0.0.1:0", service=Variables(16),
                                   NETWORK_PS_CORE_NUMBER=1)
        self.peer = self.ps.address
        self.worker = starwire.Runtime("worker", NETWORK_WORKER_CORE_NUMBER=1)
        self.client = self.worker.client()

    def tearDown(self) -> None:
        self.worker.close()
        self.ps.close()

    def test_ping_and_stats(self) -> None:
        self.assertGreater(self.client.ping(self.peer), 0)
        s = self.worker.stats()
        self.assertEqual(s.connections_opened, 1)
        self.assertGreaterEqual(s.requests_completed, 1)

    def test_pull_gives_arrays_and_none_for_unknown_ids(self) -> None:
        rows = self.client.pull(self.peer, [3, 0, 99])
        assert rows[0] is not None and rows[1] is not None
        self.assertEqual(rows[0].dtype, np.float32)
        np.testing.assert_array_equal(rows[0], np.full(8, 3, dtype=np.float32))
        np.testing.assert_array_equal(rows[1], np.zeros(8, dtype=np.float32))
        self.assertIsNone(rows[2])
        # A received array is the caller's own: writable.
        rows[0][:] = -1
        self.assertEqual(float(rows[0].sum()), -8.0)

    def test_push_then_pull_sees_the_update(self) -> None:
        statuses = self.client.push(self.peer, [(5, np.ones(8, dtype=np.float32)),
                                                (6, np.ones(3, dtype=np.float32))])
        self.assertEqual(statuses, [starwire.OK, starwire.INVALID_ARGUMENT])
        got = self.client.pull(self.peer, [5])[0]
        assert got is not None
        np.testing.assert_array_equal(got, np.full(8, 6, dtype=np.float32))

    def test_recv_and_fused_recv_of_published_tensors(self) -> None:
        keys = [f"k/{i}" for i in range(50)]
        for i, k in enumerate(keys):
            self.ps.publish(k, np.arange(i, i + 4, dtype=np.int64).reshape(2, 2))
        got = self.client.recv_many(self.peer, 1, keys)
        self.assertEqual(len(got), 50)
        for i, a in enumerate(got):
            self.assertEqual((a.shape, a.dtype), ((2, 2), np.int64))
            np.testing.assert_array_equal(a.ravel(), np.arange(i, i + 4))
        self.ps.publish(b"one", np.array([2.5]))
        np.testing.assert_array_equal(self.client.recv(self.peer, 2, "one"), [2.5])

    def test_blocking_calls_release_the_gil(self) -> None:
        # The publisher is a Python thread that needs the GIL to publish: the recv it
        # answers would time out if waiting held the GIL.
        def publish_later() -> None:
            total = sum(i * i for i in range(200_000))
            self.ps.publish("late", np.array([total], dtype=np.int64))

        t = threading.Thread(target=publish_later)
        t.start()
        got = self.client.recv(self.peer, 3, "late", timeout=30)
        t.join()
        self.assertEqual(int(got[0]), sum(i * i for i in range(200_000)))

    def test_submitted_requests_complete_in_any_order(self) -> None:
        waiting = self.client.submit_recv(self.peer, 4, "later")
        pings = [self.client.submit_ping(self.peer) for _ in range(3)]
        first = self.client.wait_any([waiting, *pings])
        self.assertIn(first, pings, "the recv cannot complete before its publish")
        self.assertFalse(waiting.done())
        for p in pings:
            self.assertGreater(p.wait(), 0)
        self.ps.publish("later", np.array([7], dtype=np.int32))
        self.assertIs(self.client.wait_any([waiting]), waiting)
        self.assertTrue(waiting.done())
        np.testing.assert_array_equal(waiting.wait(), [7])
        with self.assertRaises(starwire.InvalidArgument):
            waiting.wait()

    def test_settings_by_keyword_reach_the_runtime(self) -> None:
        with self.assertRaises(starwire.ConfigError) as e:
            starwire.Runtime("worker", STARWIRE_BACKEND="carrier-pigeon", use_env=False)
        self.assertIn("STARWIRE_BACKEND", str(e.exception))
        with self.assertRaises(starwire.ConfigError):
            starwire.Runtime("worker", settings={"STARWIRE_CONNECT_BACKOFF_MS": 0})
        with starwire.Runtime("worker", STARWIRE_CONNECT_RETRIES=0) as rt:
            self.assertFalse(rt.closed)
        self.assertTrue(rt.closed)

    def test_peers_by_task_name(self) -> None:
        port = self.ps.port
        cluster = {"ps": ["127.0.0.1:2222"], "worker": ["127.0.0.1:2223"]}
        endpoints = f"127.0.0.1:2222=127.0.0.1:{port}\n127.0.0.1:2223=127.0.0.1:2224\n"
        with starwire.Runtime("worker", cluster=cluster, endpoint_map=endpoints) as w:
            c = w.client()
            self.assertEqual(w.peer("ps:0"), f"127.0.0.1:{port}")
            self.assertEqual(w.peer("/job:ps/task:0"), f"127.0.0.1:{port}")
            self.assertEqual(w.peers("ps"), [f"127.0.0.1:{port}"])
            self.assertGreater(c.ping("ps:0"), 0)
            with self.assertRaises(starwire.InvalidArgument) as e:
                c.ping("ps:1")
            self.assertIn("ps:1", str(e.exception))


if __name__ == "__main__":
    unittest.main()
