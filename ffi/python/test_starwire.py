"""Tests of the Python module over real loopback sockets (python3 -m unittest)."""

import threading
import unittest

import numpy as np

import starwire


class Table:
    """Rows of float32[8]; a push adds into the row."""

    def __init__(self, n):
        self.lock = threading.Lock()
        self.rows = [np.full(8, i, dtype=np.float32) for i in range(n)]

    def pull(self, ids):
        with self.lock:
            return [self.rows[i].copy() if i < len(self.rows) else None for i in ids]

    def push(self, ids, arrays):
        with self.lock:
            out = []
            for i, a in zip(ids, arrays):
                if i >= len(self.rows) or a.shape != (8,):
                    out.append(starwire.INVALID_ARGUMENT)
                else:
                    self.rows[i] += a
                    out.append(0)
            return out


class StarwireTest(unittest.TestCase):
    def setUp(self):
        self.ps = starwire.Runtime("ps", listen="127.0.0.1:0", service=Table(16),
                                   settings={"NETWORK_PS_CORE_NUMBER": 1})
        self.peer = f"127.0.0.1:{self.ps.port}"
        self.worker = starwire.Runtime("worker")
        self.client = self.worker.client()

    def tearDown(self):
        self.client.close()
        self.worker.close()
        self.ps.close()

    def test_pull_lands_in_numpy_arrays_from_the_hook(self):
        before = self.worker.allocated
        rows = self.client.pull(self.peer, [3, 0, 99])
        self.assertEqual(rows[0].dtype, np.float32)
        np.testing.assert_array_equal(rows[0], np.full(8, 3, dtype=np.float32))
        np.testing.assert_array_equal(rows[1], np.zeros(8, dtype=np.float32))
        self.assertIsNone(rows[2])
        # Each received tensor was allocated by the hook as a numpy array.
        self.assertEqual(self.worker.allocated - before, 2)

    def test_push_then_pull_sees_the_update(self):
        statuses = self.client.push(self.peer, [(5, np.ones(8, dtype=np.float32)),
                                                (6, np.ones(3, dtype=np.float32))])
        self.assertEqual(statuses, [starwire.OK, starwire.INVALID_ARGUMENT])
        np.testing.assert_array_equal(self.client.pull(self.peer, [5])[0],
                                      np.full(8, 6, dtype=np.float32))

    def test_fused_recv_of_published_tensors(self):
        keys = [f"k/{i}" for i in range(50)]
        for i, k in enumerate(keys):
            self.ps.publish(k, np.arange(i, i + 4, dtype=np.int64).reshape(2, 2))
        got = self.client.recv_many(self.peer, 1, keys)
        self.assertEqual(len(got), 50)
        for i, a in enumerate(got):
            self.assertEqual(a.shape, (2, 2))
            np.testing.assert_array_equal(a.ravel(), np.arange(i, i + 4))

    def test_large_tensor_received_in_place(self):
        big = np.arange(1 << 20, dtype=np.float32)  # 4 MiB
        self.ps.publish("big", big)
        (got,) = self.client.recv_many(self.peer, 1, ["big"])
        np.testing.assert_array_equal(got, big)
        self.assertGreater(self.worker.stats().payload_direct, 0)

    def test_errors_raise_with_the_message(self):
        with self.assertRaises(starwire.Error) as e:
            self.client.ping("no such address")
        self.assertIn("not an address", str(e.exception))
        with self.assertRaises(starwire.Error) as e:
            starwire.Runtime("ps", settings={"STARWIRE_BACKEND": "carrier-pigeon"}, use_env=False)
        self.assertIn("STARWIRE_BACKEND", str(e.exception))
        self.assertGreater(self.client.ping(self.peer), 0)


if __name__ == "__main__":
    unittest.main()
