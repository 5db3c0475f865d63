"""The benchmarking aid of the C ABI (``sw_bench_pull_rows``), which
``bench/bench_pull_rows.py`` alternates with `Client.pull_rows`: each form makes the pull it
names, and fails as a pull does."""

from __future__ import annotations

import ctypes as C
import unittest

import numpy as np

import starwire
from starwire import _lib
from starwire.errors import from_code

SENTINEL = 0xFFFF_FFFF_FFFF_FFFF


class BenchAidTest(unittest.TestCase):
    def setUp(self) -> None:
        tables = {0: starwire.MemTable(8, init="uniform", scale=0.1, seed=5)}
        self.ps = starwire.Runtime("ps", listen="127.0.0.1:0", tables=tables,
                                   NETWORK_PS_CORE_NUMBER=1)
        self.worker = starwire.Runtime("worker")
        self.client = self.worker.client()
        self.peer = self.ps.address.encode()
        self.ids = np.array([7, 3, 7, 11], dtype=np.uint64)
        self.dims = (C.c_uint64 * 1)(8)
        self.latencies = (C.c_uint64 * 3)(SENTINEL, SENTINEL, SENTINEL)

    def tearDown(self) -> None:
        self.worker.close()
        self.ps.close()

    def rows(self, table: int, data: np.ndarray | None) -> _lib.Rows:
        return _lib.Rows(table, 10, C.addressof(self.dims), 1, int(self.ids.ctypes.data),
                         len(self.ids), 0 if data is None else int(data.ctypes.data),
                         len(self.ids) * 8 * 4)

    def bench(self, rows: _lib.Rows, how: int, calls: int = 3) -> int:
        return int(_lib.bench_pull_rows(self.client._handle(), self.peer, C.byref(rows), 5000,
                                        how, calls, self.latencies))

    def test_the_c_form_writes_the_rows_pull_rows_gives(self) -> None:
        expected, _ = self.client.pull_rows(self.ps.address, 0, self.ids, 8)
        data = np.zeros((4, 8), dtype=np.float32)
        self.assertEqual(self.bench(self.rows(0, data), _lib.BENCH_PULL_C), 0)
        np.testing.assert_array_equal(data, expected)
        self.assertNotIn(SENTINEL, list(self.latencies))
        self.assertNotIn(0, list(self.latencies))

    def test_the_rust_form_pulls_without_the_callers_buffer(self) -> None:
        self.assertEqual(self.bench(self.rows(0, None), _lib.BENCH_PULL_RUST), 0)
        self.assertNotIn(SENTINEL, list(self.latencies))
        self.assertNotIn(0, list(self.latencies))
        # The client goes on: nothing of those pulls is left outstanding.
        rows, missing = self.client.pull_rows(self.ps.address, 0, self.ids, 8)
        self.assertEqual((rows.shape, missing.size), ((4, 8), 0))

    def test_a_refused_table_fails_either_form_with_its_status(self) -> None:
        data = np.zeros((4, 8), dtype=np.float32)
        for how in (_lib.BENCH_PULL_C, _lib.BENCH_PULL_RUST):
            code = self.bench(self.rows(9, data), how)
            error = from_code(code)
            assert isinstance(error, starwire.RemoteError)
            self.assertEqual(error.status, starwire.NOT_FOUND)
            self.assertIn("table 9", str(error))
            # Outputs are written only on success.
            self.assertEqual(list(self.latencies), [SENTINEL] * 3)

    def test_invalid_arguments_are_refused(self) -> None:
        data = np.zeros((4, 8), dtype=np.float32)
        for how, calls, rows, words in ((_lib.BENCH_PULL_RUST, 0, self.rows(0, data), "no calls"),
                                        (7, 3, self.rows(0, data), "how 7"),
                                        (_lib.BENCH_PULL_C, 3, self.rows(0, None), "data")):
            error = from_code(self.bench(rows, how, calls))
            self.assertIsInstance(error, starwire.InvalidArgument if calls == 0 or how == 7
                                  else starwire.StarwireError)
            self.assertIn(words, str(error))
        self.assertEqual(list(self.latencies), [SENTINEL] * 3)


if __name__ == "__main__":
    unittest.main()
