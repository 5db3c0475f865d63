"""Row versions and the worker's row cache from Python, over real loopback sockets: PS tasks
serving `MemTable`s (which keep row versions). `Client.pull_rows_versioned` after a push of
k of n rows gets exactly those k rows and the others answered unchanged, the rows then a
plain pull's; holding every current version writes nothing; a PS whose handshake does not
announce ``row_versions`` (``STARWIRE_WIRE_FEATURES=none``) sends every row. A `Pipeline`
with ``PipelineSettings(cache_bytes=...)`` serves a batch pulled again from its cache, and
a small cache at staleness 0 evicts, gets rows answered unchanged and still gives the
rows of a synchronous `Sharded` client step by step. Bad arguments raise
`InvalidArgument` naming them."""

from __future__ import annotations

import unittest
from typing import Any

import numpy as np
import numpy.typing as npt

import starwire

DIM, TABLE = 4, 6
ROW_BYTES = DIM * 4


def grads(n: int) -> npt.NDArray[np.float32]:
    """Gradients of `n` rows: row i all i + 1."""
    return np.repeat(np.arange(1, n + 1, dtype=np.float32), DIM).reshape(n, DIM)


class VersionedPullCase(unittest.TestCase):
    """A PS (rows missing until pushed, SGD at rate 1; `ps_settings` on top) and a worker's
    client."""

    ps_settings: dict[str, Any] = {}

    def setUp(self) -> None:
        self.table = starwire.MemTable(DIM, init="missing", lr=1.0)
        self.ps = starwire.Runtime("ps", listen="127.0.0.1:0", tables={TABLE: self.table},
                                   **self.ps_settings)
        self.addCleanup(self.ps.close)
        self.worker = starwire.Runtime("worker", STARWIRE_CONNECT_RETRIES=0)
        self.addCleanup(self.worker.close)
        self.client = self.worker.client()
        self.peer = self.ps.address

    def plain(self, ids: Any) -> npt.NDArray[Any]:
        rows, _ = self.client.pull_rows(self.peer, TABLE, ids, DIM)
        return rows

    def versioned(self, ids: Any, held: Any, out: Any = None) -> starwire.VersionedRows:
        return self.client.pull_rows_versioned(self.peer, TABLE, ids, held, DIM, out=out)


class VersionedPullTest(VersionedPullCase):
    def test_after_a_push_of_k_rows_a_pull_holding_all_versions_gets_exactly_those_k(
            self) -> None:
        ids = np.arange(0, 36, 3, dtype=np.uint64)
        n = len(ids)
        self.client.push_rows(self.peer, TABLE, ids, grads(n))
        # Nothing held: every row travels, with its version; `out` may be left out.
        first = self.versioned(ids, np.zeros(n, dtype=np.uint64))
        self.assertEqual(first.changed, n)
        self.assertFalse(first.unchanged.any())
        self.assertEqual(len(first.missing), 0)
        self.assertTrue((first.versions != 0).all(), first.versions)
        np.testing.assert_array_equal(first.rows, self.plain(ids))
        cache = first.rows

        pushed = ids[[1, 4, 5, 9, 11]]
        self.client.push_rows(self.peer, TABLE, pushed, grads(len(pushed)))
        # A list of Python ints is taken as well as an array.
        second = self.versioned(ids, [int(v) for v in first.versions], out=cache)
        self.assertIs(second.rows, cache)
        self.assertEqual(second.changed, len(pushed))
        was_pushed = np.isin(ids, pushed)
        np.testing.assert_array_equal(second.unchanged, ~was_pushed)
        np.testing.assert_array_equal(second.versions[~was_pushed],
                                      first.versions[~was_pushed])
        self.assertTrue((second.versions[was_pushed] != first.versions[was_pushed]).all())
        np.testing.assert_array_equal(cache, self.plain(ids))

        # Holding every current version: nothing travels, `out` is left as it is (here not
        # the PS's rows, to see that nothing is written).
        untouched = np.full((n, DIM), 7.5, dtype=np.float32)
        third = self.versioned(ids, second.versions, out=untouched)
        self.assertEqual(third.changed, 0)
        self.assertTrue(third.unchanged.all())
        np.testing.assert_array_equal(third.versions, second.versions)
        self.assertTrue((untouched == 7.5).all())

    def test_a_missing_row_comes_back_at_zero_with_version_0(self) -> None:
        self.client.push_rows(self.peer, TABLE, [1, 2], grads(2))
        out = np.full((3, DIM), 9.0, dtype=np.float32)
        got = self.versioned([1, 1000, 2], [0, 0, 0], out=out)
        np.testing.assert_array_equal(got.missing, [1])
        self.assertEqual(int(got.versions[1]), 0)
        self.assertEqual(got.changed, 3)
        np.testing.assert_array_equal(out[1], np.zeros(DIM, dtype=np.float32))

    def test_bad_arguments_are_refused_naming_them(self) -> None:
        ids = [1, 2]
        out = np.zeros((2, DIM), dtype=np.float32)
        for held, says in [([0], "held"), ([0, 0, 0], "held"), ([-1, 0], "held"),
                           ([0.5, 1.0], "held"), ([[0, 0]], "held")]:
            with self.assertRaises(starwire.InvalidArgument, msg=repr(held)) as e:
                self.versioned(ids, held, out=out)
            self.assertIn(says, str(e.exception))
        with self.assertRaises(starwire.InvalidArgument) as e:
            self.versioned(ids, [3, 0])
        self.assertIn("out", str(e.exception))
        with self.assertRaises(starwire.InvalidArgument) as e:
            self.versioned(ids, [0, 0], out=np.zeros((3, DIM), dtype=np.float32))
        self.assertIn("out", str(e.exception))
        with self.assertRaises(starwire.InvalidArgument) as e:
            self.versioned([], [])
        self.assertIn("no ids", str(e.exception))


class OlderPsVersionedPullTest(VersionedPullCase):
    """A PS whose handshake does not announce ``row_versions``."""

    ps_settings = {"STARWIRE_WIRE_FEATURES": "none"}

    def test_every_row_is_sent_with_version_0(self) -> None:
        ids = np.arange(8, dtype=np.uint64)
        self.client.push_rows(self.peer, TABLE, ids, grads(8))
        first = self.versioned(ids, np.zeros(8, dtype=np.uint64))
        self.assertEqual(first.changed, 8)
        np.testing.assert_array_equal(first.versions, np.zeros(8, dtype=np.uint64))
        self.client.push_rows(self.peer, TABLE, ids[:2], grads(2))
        # Whatever is held, every row travels.
        again = self.versioned(ids, np.arange(1, 9, dtype=np.uint64),
                               out=np.full((8, DIM), 7.5, dtype=np.float32))
        self.assertEqual(again.changed, 8)
        self.assertFalse(again.unchanged.any())
        np.testing.assert_array_equal(again.versions, np.zeros(8, dtype=np.uint64))
        np.testing.assert_array_equal(again.rows, self.plain(ids))


class PipelineCacheTest(unittest.TestCase):
    def cluster(self) -> list[str]:
        """Two PS tasks (rows made by their first pull, SGD at rate 0.5) closed after the
        test; their addresses."""
        ps = [starwire.Runtime("ps", i, listen="127.0.0.1:0", tables={TABLE: starwire.MemTable(
            DIM, init="uniform", scale=0.5, seed=5, lr=0.5)}) for i in range(2)]
        for p in ps:
            self.addCleanup(p.close)
        return [p.address for p in ps]

    def setUp(self) -> None:
        self.worker = starwire.Runtime("worker", STARWIRE_CONNECT_RETRIES=0)
        self.addCleanup(self.worker.close)
        self.client = self.worker.client()

    def pipeline(self, peers: list[str], **settings: Any) -> starwire.Pipeline:
        s = starwire.PipelineSettings(timeout=20.0, **settings)
        pipe = starwire.Pipeline(self.client, TABLE, DIM, peers=peers, settings=s)
        self.addCleanup(pipe.close)
        return pipe

    def test_a_batch_pulled_again_is_served_from_the_cache(self) -> None:
        peers = self.cluster()
        self.assertEqual(starwire.PipelineSettings().cache_bytes, 0)
        ids = np.concatenate([np.arange(10), np.arange(10)]).astype(np.uint64)
        for cache_bytes, hits in [(0, 0), (4096, 10)]:
            pipe = self.pipeline(peers, cache_bytes=cache_bytes)
            first, r1 = pipe.pull(ids)
            self.assertEqual((r1.unique, r1.rows_received, r1.cache_hits), (10, 10, 0))
            self.assertEqual(r1.cache_misses, 10 if hits else 0)
            # No push in between: the cached rows are fresh enough.
            second, r2 = pipe.pull(ids)
            np.testing.assert_array_equal(second, first)
            self.assertEqual(r2.cache_hits, hits, f"cache of {cache_bytes} bytes")
            self.assertEqual(r2.rows_received, 10 - hits)
            self.assertEqual(r2.cache_bytes, hits * ROW_BYTES)
            pipe.close()

    def test_an_evicting_cache_at_staleness_0_gives_the_sharded_rows(self) -> None:
        a, b = self.cluster(), self.cluster()
        sync = self.client.sharded(TABLE, DIM, peers=a)
        # Room for 12 of the 48 rows: it evicts.
        pipe = self.pipeline(b, staleness=0, cache_bytes=12 * (ROW_BYTES + 25 + 16))
        rng = np.random.default_rng(3)
        hot = rng.integers(0, 8, (8, 16))
        cold = rng.integers(0, 48, (8, 16))
        totals = {"unique": 0, "cache_hits": 0, "cache_misses": 0, "cache_evictions": 0,
                  "rows_unchanged": 0}
        for t in range(8):
            ids = np.concatenate([hot[t], cold[t]]).astype(np.uint64)
            want, _ = sync.pull(ids)
            got, report = pipe.pull(ids)
            np.testing.assert_array_equal(got, want, err_msg=f"step {t}")
            # Half of each batch pushed: the other half's cached rows stay unchanged.
            half = ids[: len(ids) // 2]
            g = np.full((len(half), DIM), 0.25, dtype=np.float32)
            sync.push(half, g)
            pipe.push(half, g)
            report = pipe.flush()
            self.assertEqual(report.cache_hits + report.cache_misses, report.unique)
            for k in totals:
                totals[k] += getattr(report, k)
        self.assertEqual(totals["cache_hits"], 0, "staleness 0 serves nothing unasked")
        self.assertGreater(totals["cache_evictions"], 0)
        self.assertGreater(totals["rows_unchanged"], 0)

    def test_bad_cache_sizes_are_refused_naming_the_setting(self) -> None:
        peers = self.cluster()
        for bad in [-1, 1.5, "1k", True, ROW_BYTES + 32]:
            with self.assertRaises(starwire.InvalidArgument, msg=repr(bad)) as e:
                self.pipeline(peers, cache_bytes=bad)
            self.assertIn("cache_bytes", str(e.exception))
        self.pipeline(peers, cache_bytes=ROW_BYTES + 33).close()


if __name__ == "__main__":
    unittest.main()
