"""Rows of embedding tables over real loopback sockets: the small `MemTable`, a table
kept in Python, and the sharded client over two PS tasks."""

from __future__ import annotations

import threading
import unittest
from typing import Any, Optional, Sequence

import numpy as np
import numpy.typing as npt

import starwire


class DictTable:
    """A Python rows table: float64 rows of shape (2, 3); unknown ids are missing; a push
    adds the gradient into the row (creating it)."""

    dtype = np.float64
    row_shape = (2, 3)

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.rows: dict[int, npt.NDArray[np.float64]] = {}
        self.pulls = 0

    def pull(self, ids: npt.NDArray[np.uint64], out: npt.NDArray[Any]) -> Optional[Sequence[int]]:
        with self.lock:
            self.pulls += 1
            missing = []
            for i, id_ in enumerate(ids.tolist()):
                row = self.rows.get(id_)
                if row is None:
                    missing.append(i)
                    out[i] = 99.0  # starwire zeroes the rows reported missing
                else:
                    out[i] = row
            return missing

    def push(self, ids: npt.NDArray[np.uint64], grads: npt.NDArray[Any]) -> None:
        with self.lock:
            for id_, g in zip(ids.tolist(), grads):
                self.rows[id_] = self.rows.get(id_, np.zeros((2, 3))) + g


class BrokenTable:
    dtype = np.float32
    row_shape = (4,)

    def pull(self, ids: npt.NDArray[np.uint64], out: npt.NDArray[Any]) -> Optional[Sequence[int]]:
        raise RuntimeError("this table always fails")

    def push(self, ids: npt.NDArray[np.uint64], grads: npt.NDArray[Any]) -> None:
        raise RuntimeError("this table always fails")


class RowsTest(unittest.TestCase):
    def setUp(self) -> None:
        self.py_table = DictTable()
        tables: dict[int, starwire.MemTable | starwire.RowsTable] = {
            0: starwire.MemTable(8, init="uniform", scale=0.1, seed=3, optimizer="sgd", lr=0.5),
            1: starwire.MemTable(4, init="missing", optimizer="adagrad", lr=1.0,
                                 initial_accumulator=1.0),
            2: self.py_table,
            3: BrokenTable(),
        }
        self.ps = starwire.Runtime("ps", listen="127.0.0.1:0", tables=tables,
                                   NETWORK_PS_CORE_NUMBER=1)
        self.peer = self.ps.address
        self.worker = starwire.Runtime("worker")
        self.client = self.worker.client()

    def tearDown(self) -> None:
        self.worker.close()
        self.ps.close()

    def test_mem_table_rows_and_sgd(self) -> None:
        ids = np.array([3, 1, 4], dtype=np.uint64)
        before, missing = self.client.pull_rows(self.peer, 0, ids, 8)
        self.assertEqual((before.shape, missing.size), ((3, 8), 0))
        self.assertTrue(np.all(np.abs(before) <= 0.1) and np.any(before != 0))
        grads = np.arange(24, dtype=np.float32).reshape(3, 8)
        self.client.push_rows(self.peer, 0, ids, grads)
        after, _ = self.client.pull_rows(self.peer, 0, ids, 8)
        np.testing.assert_array_equal(after, before - np.float32(0.5) * grads)

    def test_missing_rows_are_reported_and_zero(self) -> None:
        ids = [5, 6, 5]
        rows, missing = self.client.pull_rows(self.peer, 1, ids, 4)
        self.assertEqual(missing.dtype, np.uint32)
        np.testing.assert_array_equal(missing, [0, 1, 2])
        np.testing.assert_array_equal(rows, np.zeros((3, 4), dtype=np.float32))
        self.client.push_rows(self.peer, 1, [5], np.array([[3.0, 0, 0, 0]], dtype=np.float32))
        rows, missing = self.client.pull_rows(self.peer, 1, ids, 4)
        np.testing.assert_array_equal(missing, [1])
        w = np.float32(-3.0) / np.sqrt(np.float32(10.0))
        np.testing.assert_allclose(rows[:, 0], [w, 0.0, w], rtol=1e-6)

    def test_python_table_serves_rows(self) -> None:
        ids = np.array([10, 11, 10], dtype=np.uint64)
        rows, missing = self.client.pull_rows(self.peer, 2, ids, (2, 3), dtype=np.float64)
        np.testing.assert_array_equal(missing, [0, 1, 2])
        np.testing.assert_array_equal(rows, np.zeros((3, 2, 3)))
        grads = np.arange(18, dtype=np.float64).reshape(3, 2, 3)
        self.client.push_rows(self.peer, 2, ids, grads)
        rows, missing = self.client.pull_rows(self.peer, 2, ids, (2, 3), dtype=np.float64)
        self.assertEqual(missing.size, 0)
        np.testing.assert_array_equal(rows[0], grads[0] + grads[2])
        np.testing.assert_array_equal(rows[1], grads[1])
        self.assertEqual(self.py_table.pulls, 2)
        # Another shape than the table's: refused by the PS before the table is called.
        with self.assertRaises(starwire.RemoteError) as e:
            self.client.pull_rows(self.peer, 2, ids, 6, dtype=np.float64)
        self.assertEqual(e.exception.status, starwire.INVALID_ARGUMENT)
        self.assertEqual(self.py_table.pulls, 2)

    def test_a_failing_python_table_answers_internal(self) -> None:
        with self.assertLogs("starwire", level="ERROR"):
            with self.assertRaises(starwire.RemoteError) as e:
                self.client.pull_rows(self.peer, 3, [1, 2], 4)
        self.assertEqual(e.exception.status, starwire.INTERNAL)
        with self.assertLogs("starwire", level="ERROR"):
            with self.assertRaises(starwire.RemoteError):
                self.client.push_rows(self.peer, 3, [1], np.ones((1, 4), dtype=np.float32))
        # The PS goes on serving.
        rows, _ = self.client.pull_rows(self.peer, 0, [1], 8)
        self.assertEqual(rows.shape, (1, 8))

    def test_unknown_table_and_other_shapes_raise_with_the_status(self) -> None:
        ids = np.array([1, 2], dtype=np.uint64)
        with self.assertRaises(starwire.RemoteError) as e:
            self.client.pull_rows(self.peer, 9, ids, 8)
        self.assertEqual(e.exception.status, starwire.NOT_FOUND)
        # The PS says why.
        self.assertIn("no table 9 on this task", str(e.exception))
        with self.assertRaises(starwire.RemoteError) as e:
            self.client.pull_rows(self.peer, 0, ids, 5)
        self.assertEqual(e.exception.status, starwire.INVALID_ARGUMENT)
        self.assertIn("table 0 holds f32 [8] rows; the request asked for f32 [5]",
                      str(e.exception))
        with self.assertRaises(starwire.RemoteError) as e:
            self.client.push_rows(self.peer, 0, ids, np.ones((2, 8), dtype=np.float64))
        self.assertEqual(e.exception.status, starwire.INVALID_ARGUMENT)
        self.assertIn("table 0 holds f32 [8] rows; the push sent f64 [8] gradients",
                      str(e.exception))

    def test_submitted_rows_requests_overlap(self) -> None:
        outs = [np.empty((100, 8), dtype=np.float32) for _ in range(4)]
        pending = [self.client.submit_pull_rows(self.peer, 0, np.arange(100) + 100 * k, 8,
                                                out=outs[k]) for k in range(4)]
        for k, p in enumerate(pending):
            rows, missing = p.wait()
            self.assertIs(rows, outs[k])
            self.assertEqual(missing.size, 0)
        again, _ = self.client.pull_rows(self.peer, 0, np.arange(100), 8)
        np.testing.assert_array_equal(again, outs[0])

    def test_repeated_pulls_of_one_kind_check_what_can_change(self) -> None:
        # The first call of a kind is checked in full and planned; later calls of it (same
        # peer, table, shapes) take the planned path, which must still refuse or convert
        # what differs between arrays of those shapes.
        ids = np.array([3, 1, 4], dtype=np.uint64)
        out = np.empty((3, 8), dtype=np.float32)
        want, _ = self.client.pull_rows(self.peer, 0, ids, 8)
        for _ in range(3):
            got, missing = self.client.pull_rows(self.peer, 0, ids, 8, out=out)
            self.assertIs(got, out)
            self.assertEqual(missing.size, 0)
            np.testing.assert_array_equal(out, want)
        self.assertEqual(len(self.client._plans), 2)  # with and without `out`
        # Other ids dtypes and layouts of the same shape: converted, same rows.
        for other in (ids.astype(np.int64), np.array([3, 9, 1, 9, 4], dtype=np.uint64)[::2],
                      ids.astype(">u8")):
            out[:] = np.nan
            got, _ = self.client.pull_rows(self.peer, 0, other, 8, out=out)
            np.testing.assert_array_equal(got, want)
        read_only = ids.copy()
        read_only.flags.writeable = False
        np.testing.assert_array_equal(self.client.pull_rows(self.peer, 0, read_only, 8)[0], want)
        # Without `out`: a new array per call.
        a, _ = self.client.pull_rows(self.peer, 0, ids, 8)
        b, _ = self.client.pull_rows(self.peer, 0, ids, 8)
        self.assertIsNot(a, b)
        np.testing.assert_array_equal(a, b)
        # Outs of the planned shape that cannot be written into, or of another dtype.
        strided = np.empty((3, 16), dtype=np.float32)[:, ::2]
        fortran = np.asfortranarray(np.empty((3, 8), dtype=np.float32))
        frozen = np.empty((3, 8), dtype=np.float32)
        frozen.flags.writeable = False
        for bad, what in ((strided, "C-contiguous"), (fortran, "C-contiguous"),
                          (frozen, "read-only"),
                          (np.empty((3, 8), dtype=np.float64), "float64"),
                          (np.empty((3, 8), dtype=">f4"), "out is")):
            with self.assertRaisesRegex(starwire.InvalidArgument, what):
                self.client.pull_rows(self.peer, 0, ids, 8, out=bad)
        with self.assertRaises(starwire.InvalidArgument):
            self.client.pull_rows(self.peer, 0, ids[:0], 8, out=out[:0])
        # Missing rows through the planned path: positions, and zero rows.
        missing_ids = np.array([500, 501], dtype=np.uint64)
        out1 = np.full((2, 4), np.nan, dtype=np.float32)
        for _ in range(2):
            got, missing = self.client.pull_rows(self.peer, 1, missing_ids, 4, out=out1)
            np.testing.assert_array_equal(missing, [0, 1])
            np.testing.assert_array_equal(got, 0)
        # Plans of other lengths share the client's room for missing positions, which grows.
        for n in (2, 300, 2, 300):
            missing_ids = np.arange(1000, 1000 + n, dtype=np.uint64)
            got, missing = self.client.pull_rows(self.peer, 1, missing_ids, 4,
                                                 out=np.empty((n, 4), dtype=np.float32))
            np.testing.assert_array_equal(missing, np.arange(n))
        # A closed client: Closed, also on a planned call.
        self.client.close()
        with self.assertRaises(starwire.Closed):
            self.client.pull_rows(self.peer, 0, ids, 8, out=out)

    def test_a_refused_table_raises_also_on_a_planned_call(self) -> None:
        ids = np.array([1, 2], dtype=np.uint64)
        out = np.zeros((2, 8), dtype=np.float32)
        for _ in range(2):
            with self.assertRaises(starwire.RemoteError) as e:
                self.client.pull_rows(self.peer, 9, ids, 8, out=out)
            self.assertEqual(e.exception.status, starwire.NOT_FOUND)
        np.testing.assert_array_equal(out, 0)


class ShardedTest(unittest.TestCase):
    """Two PS tasks, each a MemTable (ids missing until pushed), one table split by id."""

    def setUp(self) -> None:
        self.ps = [starwire.Runtime("ps", i, listen="127.0.0.1:0",
                                    tables={7: starwire.MemTable(4, init="missing", lr=1.0)})
                   for i in range(2)]
        cluster = {"ps": ["127.0.0.1:3000", "127.0.0.1:3001"]}
        endpoints = "".join(f"127.0.0.1:{3000 + i}=127.0.0.1:{p.port}\n"
                            for i, p in enumerate(self.ps))
        self.worker = starwire.Runtime("worker", cluster=cluster, endpoint_map=endpoints)
        self.client = self.worker.client()
        self.sharded = self.client.sharded(7, 4)

    def tearDown(self) -> None:
        self.worker.close()
        for p in self.ps:
            p.close()

    def test_dedup_partition_scatter_and_merge(self) -> None:
        ids = np.array([4, 5, 4, 6, 5, 4], dtype=np.uint64)
        grads = np.ones((6, 4), dtype=np.float32) * np.arange(1, 7, dtype=np.float32)[:, None]
        report = self.sharded.push(ids, grads)
        self.assertEqual((report.unique, report.ok), (3, True))
        out = np.full((6, 4), np.nan, dtype=np.float32)
        rows, report = self.sharded.pull(ids, out)
        self.assertIs(rows, out)
        self.assertEqual((report.unique, report.missing), (3, 0))
        # SGD with lr 1 from zero: minus the summed gradient of each id.
        want = {4: -(1 + 3 + 6), 5: -(2 + 5), 6: -4}
        np.testing.assert_array_equal(out[:, 0], [want[i] for i in ids.tolist()])
        # Each PS got only its ids (mod 2): even ids on ps:0, odd on ps:1.
        p0, m0 = self.client.pull_rows("ps:0", 7, [4, 5, 6], 4)
        np.testing.assert_array_equal(m0, [1])
        p1, m1 = self.client.pull_rows("ps:1", 7, [4, 5, 6], 4)
        np.testing.assert_array_equal(m1, [0, 2])
        # Ids no PS has: left zero and counted.
        rows, report = self.sharded.pull([4, 100, 101, 100])
        self.assertEqual(report.missing, 3)
        np.testing.assert_array_equal(rows[1:], 0)

    def test_a_unique_pull_gives_each_distinct_row_once_and_the_inverse(self) -> None:
        ids = np.array([4, 5, 4, 6, 5, 4, 101], dtype=np.uint64)
        grads = np.ones((7, 4), dtype=np.float32) * np.arange(1, 8, dtype=np.float32)[:, None]
        self.sharded.push(ids[:6], grads[:6])
        unique, rows, inverse, report = self.sharded.pull_unique(ids)
        # By PS (even ids on ps:0, odd on ps:1), each in the order first seen.
        self.assertEqual(unique.tolist(), [4, 6, 5, 101])
        self.assertEqual(inverse.dtype, np.int64)
        self.assertEqual(inverse.tolist(), [0, 2, 0, 1, 2, 0, 3])
        self.assertEqual(rows.shape, (4, 4))
        self.assertEqual((report.unique, report.missing), (4, 1))
        # rows[inverse] is the plain pull.
        plain, _ = self.sharded.pull(ids)
        np.testing.assert_array_equal(rows[inverse], plain)
        np.testing.assert_array_equal(rows[3], 0)
        # No ids: nothing sent.
        before = self.worker.stats().requests_completed
        unique, rows, inverse, report = self.sharded.pull_unique([])
        self.assertEqual((len(unique), rows.shape, len(inverse)), (0, (0, 4), 0))
        self.assertEqual(self.worker.stats().requests_completed, before)

    def test_a_failed_ps_fails_its_part_alone(self) -> None:
        self.sharded.push([4, 5], np.ones((2, 4), dtype=np.float32))
        self.ps[1].close()
        out = np.full((2, 4), np.nan, dtype=np.float32)
        with self.assertRaises(starwire.StarwireError) as e:
            self.sharded.pull([4, 5], out, timeout=10)
        report = e.exception.report
        self.assertIsNone(report.parts[0])
        self.assertIsInstance(report.parts[1], (starwire.ConnectionLost, starwire.ConnectFailed))
        self.assertIs(e.exception, report.parts[1])
        np.testing.assert_array_equal(out[0], -1.0)

    def test_wrong_arrays_are_refused_before_sending(self) -> None:
        with self.assertRaises(starwire.InvalidArgument):
            self.sharded.pull([1, 2], np.empty((3, 4), dtype=np.float32))
        with self.assertRaises(starwire.InvalidArgument):
            self.sharded.push([1, 2], np.ones((2, 4), dtype=np.float64))
        with self.assertRaises(starwire.InvalidArgument):
            self.sharded.push([1, 2], np.ones((4, 2), dtype=np.float32).T)
        with self.assertRaises(starwire.InvalidArgument):
            self.client.sharded(7, 4, peers=["ps:0"], partition="random")
        self.assertEqual(self.worker.stats().requests_completed, 0)


if __name__ == "__main__":
    unittest.main()
