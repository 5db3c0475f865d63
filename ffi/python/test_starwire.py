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


class RowsTest(unittest.TestCase):
    """Rows of starwire's reference in-memory tables, pulled into numpy arrays."""

    def setUp(self):
        tables = {
            0: starwire.MemTable(8, init="uniform", scale=0.1, seed=3, optimizer="sgd", lr=0.5),
            1: starwire.MemTable(4, init="missing", optimizer="adagrad", lr=1.0,
                                 initial_accumulator=1.0),
        }
        self.ps = starwire.Runtime("ps", listen="127.0.0.1:0", tables=tables,
                                   settings={"NETWORK_PS_CORE_NUMBER": 1})
        # The runtime holds its own references to the tables.
        for t in tables.values():
            t.close()
        self.peer = f"127.0.0.1:{self.ps.port}"
        self.worker = starwire.Runtime("worker")
        self.client = self.worker.client()

    def tearDown(self):
        self.client.close()
        self.worker.close()
        self.ps.close()

    def test_rows_land_in_out_without_a_copy(self):
        ids = np.arange(20000, dtype=np.uint64) * 7
        out = np.full((len(ids), 8), np.nan, dtype=np.float32)
        before = self.worker.stats().payload_direct
        rows, missing = self.client.pull_rows(self.peer, 0, ids, 8, out=out)
        self.assertIs(rows, out)
        self.assertEqual(rows.ctypes.data, out.ctypes.data)
        self.assertEqual(missing.size, 0)
        self.assertTrue(np.all(np.abs(out) <= 0.1) and np.any(out != 0))
        # The 640 kB block went from the socket into `out`'s memory.
        self.assertGreater(self.worker.stats().payload_direct - before, out.nbytes // 2)
        # The same ids again, into a fresh array: the same rows.
        again, _ = self.client.pull_rows(self.peer, 0, ids, 8)
        self.assertEqual(again.shape, (20000, 8))
        np.testing.assert_array_equal(again, out)

    def test_push_rows_then_pull_sees_sgd(self):
        ids = np.array([3, 1, 4], dtype=np.uint64)
        before, _ = self.client.pull_rows(self.peer, 0, ids, 8)
        grads = np.arange(24, dtype=np.float32).reshape(3, 8)
        self.client.push_rows(self.peer, 0, ids, grads)
        after, _ = self.client.pull_rows(self.peer, 0, ids, 8)
        np.testing.assert_array_equal(after, before - np.float32(0.5) * grads)

    def test_missing_rows_are_reported_and_zero(self):
        ids = np.array([5, 6, 5], dtype=np.uint64)
        rows, missing = self.client.pull_rows(self.peer, 1, ids, 4)
        self.assertEqual(missing.dtype, np.uint32)
        np.testing.assert_array_equal(missing, [0, 1, 2])
        np.testing.assert_array_equal(rows, np.zeros((3, 4), dtype=np.float32))
        self.client.push_rows(self.peer, 1, np.array([5], dtype=np.uint64),
                              np.array([[3.0, 0, 0, 0]], dtype=np.float32))
        rows, missing = self.client.pull_rows(self.peer, 1, ids, 4)
        np.testing.assert_array_equal(missing, [1])
        # Adagrad from an accumulator of 1: w = -1.0 * 3 / sqrt(1 + 9).
        w = np.float32(-3.0) / np.sqrt(np.float32(10.0))
        np.testing.assert_allclose(rows[:, 0], [w, 0.0, w], rtol=1e-6)
        np.testing.assert_array_equal(rows[:, 1:], 0.0)

    def test_unknown_table_and_other_shapes_raise_with_the_status(self):
        ids = np.array([1, 2], dtype=np.uint64)
        with self.assertRaises(starwire.Error) as e:
            self.client.pull_rows(self.peer, 9, ids, 8)
        self.assertEqual(e.exception.status, starwire.NOT_FOUND)
        self.assertIn("NOT_FOUND", str(e.exception))
        with self.assertRaises(starwire.Error) as e:
            self.client.push_rows(self.peer, 9, ids, np.ones((2, 8), dtype=np.float32))
        self.assertEqual(e.exception.status, starwire.NOT_FOUND)
        for dim, dtype in [(4, np.float32), (8, np.float64)]:
            with self.assertRaises(starwire.Error) as e:
                self.client.pull_rows(self.peer, 0, ids, dim, dtype=dtype)
            self.assertEqual(e.exception.status, starwire.INVALID_ARGUMENT)
        with self.assertRaises(starwire.Error) as e:
            self.client.push_rows(self.peer, 0, ids, np.ones((2, 8), dtype=np.float64))
        self.assertEqual(e.exception.status, starwire.INVALID_ARGUMENT)

    def test_wrong_arrays_are_refused_before_sending(self):
        ids = np.array([1, 2], dtype=np.uint64)
        pull = self.client.pull_rows
        with self.assertRaisesRegex(ValueError, "not float32"):
            pull(self.peer, 0, ids, 8, out=np.empty((3, 8), dtype=np.float32))
        with self.assertRaisesRegex(ValueError, "not float32"):
            pull(self.peer, 0, ids, 8, out=np.empty((2, 8), dtype=np.float64))
        with self.assertRaisesRegex(ValueError, "C-contiguous"):
            pull(self.peer, 0, ids, 8, out=np.empty((8, 2), dtype=np.float32).T)
        with self.assertRaisesRegex(TypeError, "numpy array"):
            pull(self.peer, 0, ids, 8, out=[[0.0] * 8] * 2)
        with self.assertRaisesRegex(ValueError, "1-D"):
            pull(self.peer, 0, ids.reshape(2, 1), 8)
        push = self.client.push_rows
        with self.assertRaisesRegex(ValueError, "C-contiguous"):
            push(self.peer, 0, ids, np.ones((8, 2), dtype=np.float32).T)
        with self.assertRaisesRegex(ValueError, "C-contiguous"):
            push(self.peer, 0, ids, np.ones((2, 16), dtype=np.float32)[:, ::2])
        with self.assertRaisesRegex(ValueError, "one row per id"):
            push(self.peer, 0, ids, np.ones(16, dtype=np.float32))
        with self.assertRaisesRegex(ValueError, "one row per id"):
            push(self.peer, 0, ids, np.ones((3, 8), dtype=np.float32))
        with self.assertRaisesRegex(TypeError, "no starwire code"):
            push(self.peer, 0, ids, np.ones((2, 8), dtype=np.complex64))
        with self.assertRaises(starwire.Error) as e:
            pull(self.peer, 0, np.array([], dtype=np.uint64), 8)
        self.assertEqual(e.exception.code, 2)
        self.assertIn("no ids", str(e.exception))
        # The client still works.
        rows, missing = pull(self.peer, 0, ids, 8)
        self.assertEqual((rows.shape, missing.size), ((2, 8), 0))

    def test_mem_table_parameters_are_checked(self):
        with self.assertRaisesRegex(ValueError, "init"):
            starwire.MemTable(4, init="gaussian")
        with self.assertRaisesRegex(ValueError, "optimizer"):
            starwire.MemTable(4, optimizer="adam")
        with self.assertRaises(starwire.Error) as e:
            starwire.MemTable(0)
        self.assertEqual(e.exception.code, 2)
        with self.assertRaises(starwire.Error) as e:
            starwire.MemTable(4, optimizer="adagrad", initial_accumulator=0.0)
        self.assertIn("initial_accumulator", str(e.exception))


if __name__ == "__main__":
    unittest.main()
