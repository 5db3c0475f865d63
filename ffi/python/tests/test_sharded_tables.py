"""Several tables in one request per PS (`starwire.ShardedTables`, `starwire.PipelineTables`
and the synchronous and pipelined `PSEmbeddingBagCollection` over them) over real loopback
sockets: two PS tasks serving three `PsTable`s each; the frames a step sends counted on
the PS tasks, and the rows compared with the per-table client's."""

from __future__ import annotations

import unittest
from typing import Any

import numpy as np
import numpy.typing as npt

import starwire

try:
    import torch
except ImportError:
    HAVE_TORCH = False
else:
    HAVE_TORCH = True
    from torch import nn

    from starwire.torch import PrefetchingLoader, PSEmbeddingBagCollection, TableConfig

NO_TORCH = "torch is not importable here (CI installs it; pip install torch)"
#: Table id and row size of each table.
TABLES = [(1, 4), (2, 3), (3, 2)]
VOCAB, LR = 30, 0.25


class TablesCase(unittest.TestCase):
    def setUp(self) -> None:
        def table(t: int, dim: int) -> starwire.PsTable:
            return starwire.PsTable(dim, table_id=t, init="uniform", scale=0.5, seed=5,
                                    optimizer="sgd", lr=LR, huge_pages=False)

        self.ps = [starwire.Runtime("ps", i, listen="127.0.0.1:0",
                                    tables={t: table(t, d) for t, d in TABLES},
                                    NETWORK_PS_CORE_NUMBER=1) for i in range(2)]
        self.peers = [p.address for p in self.ps]
        self.worker = starwire.Runtime("worker", NETWORK_WORKER_CORE_NUMBER=1)
        self.client = self.worker.client()
        # Connected (the handshake is a frame of its own) and every row made.
        for t, d in TABLES:
            self.single(t, d).pull(np.arange(VOCAB, dtype=np.uint64))

    def tearDown(self) -> None:
        self.worker.close()
        for p in self.ps:
            p.close()

    def single(self, table: int, dim: int) -> starwire.Sharded:
        s = self.client.sharded(table, dim, peers=self.peers)
        self.addCleanup(s.close)
        return s

    def frames(self) -> list[int]:
        """Frames each PS task received so far."""
        return [int(p.stats().frames_in) for p in self.ps]

    def sent(self, before: list[int]) -> list[int]:
        return [a - b for a, b in zip(self.frames(), before)]

    def rows(self, table: int, dim: int) -> npt.NDArray[np.float32]:
        return self.single(table, dim).pull(np.arange(VOCAB, dtype=np.uint64))[0]


class ShardedTablesTest(TablesCase):
    def test_a_step_is_one_frame_per_ps_and_gives_the_per_table_rows(self) -> None:
        multi = starwire.ShardedTables(self.client, TABLES, peers=self.peers)
        self.addCleanup(multi.close)
        ids: list[Any] = [np.array([1, 2, 3, 1, 4], dtype=np.uint64), [7, 7, 10],
                          np.arange(6)]
        before = self.frames()
        outs, report = multi.pull(ids)
        self.assertEqual(self.sent(before), [1, 1])
        self.assertTrue(report.ok)
        self.assertEqual((report.unique, report.missing), (4 + 2 + 6, 0))
        for (t, d), i, out in zip(TABLES, ids, outs):
            want, _ = self.single(t, d).pull(i)
            np.testing.assert_array_equal(out, want)
        grads = [np.ones((len(i), d), dtype=np.float32) for i, (_, d) in zip(ids, TABLES)]
        rows_before = [self.rows(t, d) for t, d in TABLES]
        before = self.frames()
        multi.push(ids, grads)
        self.assertEqual(self.sent(before), [1, 1])
        # Duplicates summed: id 1 of table 1 twice, id 7 of table 2 twice.
        after = [self.rows(t, d) for t, d in TABLES]
        np.testing.assert_array_equal(after[0][1], rows_before[0][1] - 2 * np.float32(LR))
        np.testing.assert_array_equal(after[1][7], rows_before[1][7] - 2 * np.float32(LR))
        np.testing.assert_array_equal(after[2][5], rows_before[2][5] - np.float32(LR))
        np.testing.assert_array_equal(after[0][0], rows_before[0][0])

    def test_a_unique_pull_is_one_frame_per_ps_with_each_distinct_row_once(self) -> None:
        multi = starwire.ShardedTables(self.client, TABLES, peers=self.peers)
        self.addCleanup(multi.close)
        ids: list[Any] = [np.array([1, 2, 3, 1, 4], dtype=np.uint64), [7, 7, 10], []]
        plain, _ = multi.pull(ids)
        before = self.frames()
        parts, report = multi.pull_unique(ids)
        self.assertEqual(self.sent(before), [1, 1])
        self.assertEqual((report.unique, report.missing), (4 + 2, 0))
        # By PS (even ids at ps 0), each PS's in the order first seen.
        self.assertEqual([u.tolist() for u, _, _ in parts], [[2, 4, 1, 3], [10, 7], []])
        self.assertEqual(parts[0][2].tolist(), [2, 0, 3, 2, 1])
        for (unique, rows, inverse), want, (_, d) in zip(parts, plain, TABLES):
            self.assertEqual(rows.shape, (len(unique), d))
            np.testing.assert_array_equal(rows[inverse], want)

    def test_gradients_that_are_not_contiguous_are_refused_naming_them(self) -> None:
        grads = [np.ones((2, 4), np.float32),
                 np.arange(12, dtype=np.float32).reshape(2, 6)[:, 1::2]]
        for make in (starwire.ShardedTables, starwire.PipelineTables):
            multi: Any = make(self.client, TABLES[:2], peers=self.peers)
            before = self.frames()
            with self.assertRaisesRegex(starwire.InvalidArgument,
                                        r"grads\[1\] is not C-contiguous"):
                multi.push([[3, 4], [5, 6]], grads)
            self.assertEqual(self.sent(before), [0, 0])
            multi.close()

    def test_an_empty_batch_takes_no_part_and_a_ps_with_no_ids_gets_nothing(self) -> None:
        multi = starwire.ShardedTables(self.client, TABLES, peers=self.peers)
        self.addCleanup(multi.close)
        before = self.frames()
        outs, report = multi.pull([[2, 4], [], [6]])
        # Even ids only: all at ps 0.
        self.assertEqual(self.sent(before), [1, 0])
        self.assertEqual([o.shape for o in outs], [(2, 4), (0, 3), (1, 2)])

    def test_bf16_rows_and_bad_arguments(self) -> None:
        multi = starwire.ShardedTables(self.client, TABLES[:2], peers=self.peers,
                                       wire_dtype="bf16")
        self.addCleanup(multi.close)
        exact = [self.rows(t, d) for t, d in TABLES[:2]]
        outs, _ = multi.pull([np.arange(VOCAB), np.arange(VOCAB)])
        for out, e in zip(outs, exact):
            self.assertFalse(np.array_equal(out, e))
            np.testing.assert_allclose(out, e, rtol=2 ** -8)
        # A scaled bf16 push: the scale divided out on the PS, applied to f32 rows.
        multi.set_loss_scale(64.0)
        self.assertEqual(multi.loss_scale, 64.0)
        grads = [np.full((2, d), 0.375 * 64, dtype=np.float32) for _, d in TABLES[:2]]
        multi.push([[3, 4], [5, 5]], grads)
        after = [self.rows(t, d) for t, d in TABLES[:2]]
        step = np.float32(LR) * np.float32(0.375)
        np.testing.assert_array_equal(after[0][[3, 4]], exact[0][[3, 4]] - step)
        np.testing.assert_array_equal(after[1][5], exact[1][5] - 2 * step)
        np.testing.assert_array_equal(after[1][6], exact[1][6])
        with self.assertRaisesRegex(starwire.InvalidArgument, "1 batches of ids for 2 tables"):
            multi.pull([[1]])
        with self.assertRaisesRegex(starwire.InvalidArgument, r"grads\[1\] is float32\[1, 4\]"):
            multi.push([[1], [1]], [np.ones((1, 4), np.float32), np.ones((1, 4), np.float32)])
        with self.assertRaisesRegex(starwire.InvalidArgument, "named twice"):
            starwire.ShardedTables(self.client, [(1, 4), (1, 4)], peers=self.peers)
        with self.assertRaisesRegex(starwire.InvalidArgument, "loss_scale"):
            multi.set_loss_scale(-1)
        multi.close()
        with self.assertRaises(starwire.Closed):
            multi.pull([[1], [1]])


class PipelineTablesTest(TablesCase):
    def test_a_step_is_one_frame_per_ps_each_way_with_the_per_table_rows(self) -> None:
        settings = starwire.PipelineSettings(staleness=0)
        pipe = starwire.PipelineTables(self.client, TABLES, peers=self.peers,
                                       settings=settings)
        self.addCleanup(pipe.close)
        ids: list[Any] = [np.array([1, 2, 3, 1, 4], dtype=np.uint64), [7, 7, 10],
                          np.arange(6)]
        for step in range(3):
            before = self.frames()
            pipe.prefetch(ids)
            outs, report = pipe.pull(ids)
            self.assertEqual(self.sent(before), [1, 1], f"pull of step {step}")
            self.assertEqual((report.step, report.unique, report.prefetched, report.missing),
                             (step, 4 + 2 + 6, 2, 0))
            for (t, d), i, out in zip(TABLES, ids, outs):
                want, _ = self.single(t, d).pull(i)
                np.testing.assert_array_equal(out, want, err_msg=f"table {t}, step {step}")
            rows_before = [self.rows(t, d) for t, d in TABLES]
            grads = [np.ones((len(i), d), dtype=np.float32) for i, (_, d) in zip(ids, TABLES)]
            before = self.frames()
            report = pipe.push(ids, grads)
            pipe.flush()
            self.assertEqual(self.sent(before), [1, 1], f"push of step {step}")
            self.assertEqual(report.rows_sent, 4 + 2 + 6)
            after = [self.rows(t, d) for t, d in TABLES]
            # Duplicates summed: id 1 of table 1 twice, id 7 of table 2 twice.
            np.testing.assert_array_equal(after[0][1], rows_before[0][1] - 2 * np.float32(LR))
            np.testing.assert_array_equal(after[1][7], rows_before[1][7] - 2 * np.float32(LR))
            np.testing.assert_array_equal(after[2][5], rows_before[2][5] - np.float32(LR))
            np.testing.assert_array_equal(after[0][0], rows_before[0][0])
        self.assertEqual((pipe.steps(), pipe.pushes(), pipe.pushes_in_flight()), (3, 3, 0))

    def test_a_unique_pull_is_one_frame_per_ps_with_each_distinct_row_once(self) -> None:
        pipe = starwire.PipelineTables(self.client, TABLES, peers=self.peers)
        self.addCleanup(pipe.close)
        ids: list[Any] = [np.array([1, 2, 3, 1, 4], dtype=np.uint64), [7, 7, 10], []]
        before = self.frames()
        pipe.prefetch(ids)
        parts, report = pipe.pull_unique(ids)
        # The prefetch's request, taken by the unique pull: one per PS for the tables.
        self.assertEqual(self.sent(before), [1, 1])
        self.assertEqual((report.unique, report.missing, report.prefetched), (4 + 2, 0, 2))
        # By PS (even ids at ps 0), each PS's in the order first seen.
        self.assertEqual([u.tolist() for u, _, _ in parts], [[2, 4, 1, 3], [10, 7], []])
        self.assertEqual(parts[0][2].tolist(), [2, 0, 3, 2, 1])
        for (unique, rows, inverse), i, (t, d) in zip(parts, ids, TABLES):
            self.assertEqual(rows.shape, (len(unique), d))
            want, _ = self.single(t, d).pull(i)
            np.testing.assert_array_equal(rows[inverse], want)
        # The gradients of the distinct rows, pushed by the distinct ids.
        rows_before = self.rows(1, 4)
        pipe.push([u for u, _, _ in parts],
                  [np.ones_like(r) for _, r, _ in parts])
        pipe.flush()
        np.testing.assert_array_equal(self.rows(1, 4)[[1, 2]],
                                      rows_before[[1, 2]] - np.float32(LR))
        # One table through a `Pipeline`.
        one = starwire.Pipeline(self.client, 1, 4, peers=self.peers)
        self.addCleanup(one.close)
        unique, rows, inverse, report = one.pull_unique(ids[0])
        self.assertEqual((unique.tolist(), inverse.tolist(), report.unique),
                         ([2, 4, 1, 3], [2, 0, 3, 2, 1], 4))
        np.testing.assert_array_equal(rows, self.rows(1, 4)[[2, 4, 1, 3]])

    def test_into_given_arrays_and_bad_arguments(self) -> None:
        pipe = starwire.PipelineTables(self.client, TABLES, peers=self.peers)
        ids: list[Any] = [[2, 4], [], [6]]
        outs = [np.full((2, 4), 7, np.float32), np.zeros((0, 3), np.float32),
                np.full((1, 2), 7, np.float32)]
        before = self.frames()
        got, _ = pipe.pull(ids, outs)
        # Even ids only: all at ps 0, in one request.
        self.assertEqual(self.sent(before), [1, 0])
        self.assertTrue(all(g is o for g, o in zip(got, outs)))
        np.testing.assert_array_equal(outs[0], self.rows(1, 4)[[2, 4]])
        np.testing.assert_array_equal(outs[2], self.rows(3, 2)[[6]])
        with self.assertRaisesRegex(starwire.InvalidArgument, "1 batches of ids for 3 tables"):
            pipe.pull([[1]])
        # Table 2's array over part of table 1's.
        shared = np.zeros(8, np.float32)
        overlapping = [shared[:4].reshape(1, 4), shared[2:5].reshape(1, 3),
                       np.zeros((1, 2), np.float32)]
        before = self.frames()
        with self.assertRaisesRegex(starwire.InvalidArgument, r"outs\[1\] and outs\[0\] share"):
            pipe.pull([[1], [2], [3]], overlapping)
        self.assertEqual(self.sent(before), [0, 0])
        with self.assertRaisesRegex(starwire.InvalidArgument, r"outs\[1\] is float32\[0, 3\]"):
            pipe.pull([[2, 4], [1], [6]], outs)
        with self.assertRaisesRegex(starwire.InvalidArgument, r"grads\[0\] is float32\[1, 3\]"):
            pipe.push([[1], [], []], [np.ones((1, 3), np.float32), outs[1],
                                      np.zeros((0, 2), np.float32)])
        with self.assertRaisesRegex(starwire.InvalidArgument, "named twice"):
            starwire.PipelineTables(self.client, [(1, 4), (1, 4)], peers=self.peers)
        with self.assertRaisesRegex(starwire.InvalidArgument, "cache_bytes"):
            starwire.PipelineTables(self.client, TABLES, peers=self.peers,
                                    settings=starwire.PipelineSettings(cache_bytes=-1))
        pipe.close()
        pipe.close()
        with self.assertRaises(starwire.Closed):
            pipe.pull(ids)


@unittest.skipUnless(HAVE_TORCH, NO_TORCH)
class CollectionTest(TablesCase):
    def test_a_synchronous_collection_step_is_one_frame_per_ps_each_way(self) -> None:
        configs = {"a": TableConfig(1, 4, "sum"), "b": TableConfig(2, 3, "mean"),
                   "c": TableConfig(3, 2, "sum")}
        coll = PSEmbeddingBagCollection(self.client, configs, peers=self.peers)
        refs: dict[str, Any] = {}
        for name, cfg in configs.items():
            refs[name] = nn.EmbeddingBag(VOCAB, cfg.dim, mode=cfg.mode)
            with torch.no_grad():
                refs[name].weight.copy_(torch.from_numpy(self.rows(cfg.table, cfg.dim)))
        ref_opt = torch.optim.SGD([p for r in refs.values() for p in r.parameters()], lr=LR)
        rng = np.random.default_rng(8)
        for step in range(4):
            inputs = {name: torch.from_numpy(rng.integers(0, VOCAB, size=(3, 2)))
                      for name in configs}
            before = self.frames()
            out = coll(inputs)
            self.assertEqual(self.sent(before), [1, 1], f"pull of step {step}")
            want = {name: refs[name](inputs[name]) for name in configs}
            for name in configs:
                torch.testing.assert_close(out[name], want[name], rtol=1e-5, atol=1e-6)
            before = self.frames()
            sum((o ** 2).sum() for o in out.values()).backward()
            self.assertEqual(self.sent(before), [1, 1], f"push of step {step}")
            sum((w ** 2).sum() for w in want.values()).backward()
            ref_opt.step()
            ref_opt.zero_grad()
        for name, cfg in configs.items():
            np.testing.assert_allclose(self.rows(cfg.table, cfg.dim),
                                       refs[name].weight.detach().numpy(), rtol=1e-5,
                                       atol=1e-6)

    def test_a_block_without_gradient_is_pushed_by_the_next_forward(self) -> None:
        coll = PSEmbeddingBagCollection(self.client, {"a": TableConfig(1, 4),
                                                      "b": TableConfig(2, 3)},
                                        peers=self.peers)
        a_before = self.rows(1, 4)
        inputs = {"a": torch.tensor([[5, 6]]), "b": torch.tensor([[5]])}
        out = coll(inputs)
        before = self.frames()
        out["a"].sum().backward()
        # b's block got no gradient: nothing sent yet.
        self.assertEqual(self.sent(before), [0, 0])
        before = self.frames()
        coll(inputs)
        # a's gradient pushed, then both pulled: one frame each way per PS.
        self.assertEqual(self.sent(before), [2, 2])
        a_after = self.rows(1, 4)
        np.testing.assert_array_equal(a_after[5], a_before[5] - np.float32(LR))
        np.testing.assert_array_equal(a_after[7], a_before[7])
        coll.flush()
        coll.close()

    def test_a_pipelined_collection_step_is_one_frame_per_ps_each_way(self) -> None:
        configs = {"a": TableConfig(1, 4, "sum"), "b": TableConfig(2, 3, "mean"),
                   "c": TableConfig(3, 2, "sum")}
        coll = PSEmbeddingBagCollection(self.client, configs, peers=self.peers, staleness=1,
                                        cache_bytes=1 << 14)
        rng = np.random.default_rng(9)
        # Ids 0..5 with both parities in every table's batch: each step reaches both PS
        # tasks.
        batches = [{name: torch.from_numpy(np.concatenate([[0, 1], rng.integers(0, 6, 4)])
                                           .reshape(3, 2))
                    for name in configs} for _ in range(6)]
        before = self.frames()
        hits = 0
        for step, inputs in enumerate(PrefetchingLoader(batches, coll, lambda b: b)):
            out = coll(inputs)
            report = coll.last_report
            assert isinstance(report, starwire.PipelineReport)
            self.assertEqual(report.step, step)
            self.assertLessEqual(report.may_miss, 1)
            hits += report.cache_hits
            sum(o.sum() for o in out.values()).backward()
        coll.flush()
        sent = self.sent(before)
        # A push per step and PS task for the three tables, and at most a pull: the row
        # caches serve some steps' rows whole (staleness 1), and no table has a request of
        # its own.
        for k in range(2):
            self.assertGreaterEqual(sent[k], 6, f"ps:{k}")
            self.assertLessEqual(sent[k], 6 * 2, f"ps:{k}")
        self.assertGreater(hits, 0)
        # A table of the collection called on its own: a step of the shared pipeline in
        # which the others take no part (ids 7 and 8, never pulled: not cached).
        rows_before = self.rows(1, 4)
        before = self.frames()
        out = coll.bags["a"](torch.tensor([[7, 8]]))
        np.testing.assert_allclose(out.detach().numpy()[0], rows_before[7] + rows_before[8],
                                   rtol=1e-6)
        out.sum().backward()
        coll.flush()
        self.assertEqual(self.sent(before), [2, 2])
        after = self.rows(1, 4)
        np.testing.assert_array_equal(after[[7, 8]], rows_before[[7, 8]] - np.float32(LR))
        coll.close()


if __name__ == "__main__":
    unittest.main()
