"""`starwire.torch` over the pipelined client, over loopback sockets: staleness 0 through
the pipeline (with and without `PrefetchingLoader`) trains exactly as the synchronous
modules; the loader prefetches every batch, the first included, and nothing after the
last, and raises the data loader's exception after the batches before it; a push that
fails after its backward returned is raised by a later call, never dropped."""

from __future__ import annotations

import threading
import unittest
from typing import Any, Iterator, Optional, Sequence

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

    from starwire.torch import (PrefetchingLoader, PSEmbeddingBag, PSEmbeddingBagCollection,
                                TableConfig)

NO_TORCH = "torch is not importable here (CI installs it; pip install torch)"
VOCAB, DIM, DIM2, STEPS = 40, 4, 3, 6


class RefusingTable:
    """A Python rows table of DIM float32 rows, zero until pushed, SGD with rate 1, that
    refuses (``INTERNAL``) a push whose first gradient is at least 500."""

    dtype = np.float32
    row_shape = (DIM,)

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.rows: dict[int, npt.NDArray[np.float32]] = {}
        self.applied = 0

    def pull(self, ids: npt.NDArray[np.uint64], out: npt.NDArray[Any]) -> Optional[Sequence[int]]:
        with self.lock:
            for i, id_ in enumerate(ids.tolist()):
                out[i] = self.rows.get(id_, 0.0)
        return None

    def push(self, ids: npt.NDArray[np.uint64], grads: npt.NDArray[Any]) -> None:
        if grads[0, 0] >= 500:
            raise ValueError("gradients refused")
        with self.lock:
            for id_, g in zip(ids.tolist(), grads):
                self.rows[id_] = self.rows.get(id_, np.zeros(DIM, np.float32)) - g
            self.applied += 1


@unittest.skipUnless(HAVE_TORCH, NO_TORCH)
class PipelinedTest(unittest.TestCase):
    def cluster(self, tables: Optional[list[dict[int, Any]]] = None
                ) -> tuple[starwire.Client, list[starwire.Runtime], starwire.Runtime]:
        """Two PS tasks ps:0 and ps:1 (by default tables 1 and 2 as `PsTable`s with
        Adagrad) and a worker naming them; closed after the test, the worker first."""
        if tables is None:
            tables = [{t: starwire.PsTable(d, table_id=t, init="uniform", scale=0.5, seed=11,
                                           optimizer="adagrad", lr=0.1, huge_pages=False)
                       for t, d in ((1, DIM), (2, DIM2))} for _ in range(2)]
        ps = [starwire.Runtime("ps", i, listen="127.0.0.1:0", tables=tables[i],
                               NETWORK_PS_CORE_NUMBER=1) for i in range(2)]
        for p in ps:
            self.addCleanup(p.close)
        cluster = {"ps": ["127.0.0.1:3000", "127.0.0.1:3001"]}
        endpoints = "".join(f"127.0.0.1:{3000 + i}=127.0.0.1:{p.port}\n"
                            for i, p in enumerate(ps))
        worker = starwire.Runtime("worker", cluster=cluster, endpoint_map=endpoints,
                                  NETWORK_WORKER_CORE_NUMBER=1, STARWIRE_CONNECT_RETRIES=0)
        self.addCleanup(worker.close)
        return worker.client(), ps, worker

    def batches(self, seed: int, n: int = STEPS) -> list[dict[str, Any]]:
        """Batches of 5 samples: "user" bags of 0 to 5 ids with weights (duplicates, an
        empty bag), 2 "item" ids each, a target."""
        rng = np.random.default_rng(seed)
        out = []
        for _ in range(n):
            lengths = rng.integers(0, 6, size=5)
            user = torch.from_numpy(rng.integers(0, VOCAB, size=int(lengths.sum())))
            offsets = torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)[:-1]]))
            out.append({"user": user, "offsets": offsets,
                        "w": torch.from_numpy(rng.random(len(user), dtype=np.float32)),
                        "item": torch.from_numpy(rng.integers(0, VOCAB, size=(5, 2))),
                        "y": torch.from_numpy(rng.standard_normal((5, 1), dtype=np.float32))})
        return out

    def train(self, how: str, in_backward: bool = True
              ) -> tuple[list[Any], npt.NDArray[Any], npt.NDArray[Any], Any]:
        """Trains a collection of two tables and an MLP with Adam on a fresh cluster:
        `how` is "sync", "pipelined" (staleness 0) or "prefetch" (staleness 0, through a
        `PrefetchingLoader`); `in_backward`: push in backward, else at the next forward (or
        the loader moving on). Returns each step's outputs, both tables' rows and the dense
        weights after."""
        client, _, _ = self.cluster()
        coll = PSEmbeddingBagCollection(
            client, {"user": TableConfig(1, DIM, "sum"), "item": TableConfig(2, DIM2, "mean")},
            pipelined=how != "sync", push_in_backward=in_backward)
        torch.manual_seed(5)
        mlp = nn.Sequential(nn.Linear(DIM + DIM2, 8), nn.ReLU(), nn.Linear(8, 1))
        opt = torch.optim.Adam(mlp.parameters(), lr=0.05)
        data: Any = self.batches(7)
        if how == "prefetch":
            data = PrefetchingLoader(data, coll, lambda b: {"user": b["user"],
                                                            "item": b["item"]})
        outputs = []
        for b in data:
            out = coll({"user": b["user"], "item": b["item"]}, offsets={"user": b["offsets"]},
                       per_sample_weights={"user": b["w"]})
            pred = mlp(torch.cat([out["user"], out["item"]], dim=1))
            outputs.append(pred.detach().clone())
            ((pred - b["y"]) ** 2).mean().backward()
            opt.step()
            opt.zero_grad()
        coll.flush()
        every = np.arange(VOCAB, dtype=np.uint64)
        rows = [client.sharded(t, d).pull(every)[0] for t, d in ((1, DIM), (2, DIM2))]
        coll.close()
        return outputs, rows[0], rows[1], [p.detach().clone() for p in mlp.parameters()]

    def test_staleness_0_through_the_pipeline_is_the_synchronous_result_bit_for_bit(self
                                                                                     ) -> None:
        want = self.train("sync")
        for how, in_backward in (("pipelined", True), ("prefetch", True), ("sync", False),
                                 ("pipelined", False), ("prefetch", False)):
            how = f"{how}, push in backward: {in_backward}"
            got = self.train(how.split(",")[0], in_backward)
            for t, (a, b) in enumerate(zip(got[0], want[0])):
                self.assertTrue(torch.equal(a, b), f"{how}: step {t}: {a} != {b}")
            np.testing.assert_array_equal(got[1], want[1], err_msg=how)
            np.testing.assert_array_equal(got[2], want[2], err_msg=how)
            for a, b in zip(got[3], want[3]):
                self.assertTrue(torch.equal(a, b), how)
        # The rows moved: the comparison is not of untouched tables.
        first = self.cluster()[0].sharded(1, DIM).pull(np.arange(VOCAB, dtype=np.uint64))[0]
        self.assertGreater(float(np.abs(want[1] - first).max()), 1e-3)

    def test_every_batch_is_prefetched_the_first_included_and_nothing_after_the_last(self
                                                                                      ) -> None:
        client, _, worker = self.cluster()
        bag = PSEmbeddingBag(client, 1, DIM, "sum", staleness=1)
        data = self.batches(3, n=5)
        steps = 0
        for b in PrefetchingLoader(data, bag, lambda b: b["user"]):
            self.assertIs(b, data[steps])
            out = bag(b["user"], b["offsets"])
            report = bag.last_report
            assert isinstance(report, starwire.PipelineReport)
            self.assertEqual(report.step, steps)
            self.assertLessEqual(report.may_miss, 1)
            if steps == 0:
                # Nothing in flight yet: both PS tasks' parts were sent before the forward.
                # (Later prefetches wait, as the bound says, for the push two before.)
                self.assertEqual((report.prefetched, report.refetched), (2, 0))
            out.sum().backward()
            steps += 1
        self.assertEqual(steps, 5)
        bag.flush()
        # A pull and a push per batch and PS task: no prefetch of a batch that is not.
        self.assertEqual(worker.stats().requests_completed, 5 * 2 * 2)
        # An empty loader yields nothing and sends nothing.
        self.assertEqual(list(PrefetchingLoader([], bag, lambda b: b)), [])
        self.assertEqual(worker.stats().requests_completed, 5 * 2 * 2)
        with self.assertRaisesRegex(starwire.InvalidArgument, "synchronous"):
            PrefetchingLoader(data, PSEmbeddingBag(client, 1, DIM), lambda b: b["user"])
        bag.close()

    def test_the_loader_s_exception_is_raised_after_the_batches_before_it(self) -> None:
        client, _, worker = self.cluster()
        bag = PSEmbeddingBag(client, 1, DIM, "sum", staleness=2)
        data = self.batches(4, n=3)

        def loader() -> Iterator[dict[str, Any]]:
            yield from data
            raise ValueError("the loader broke")

        seen = []
        with self.assertRaisesRegex(ValueError, "the loader broke"):
            for b in PrefetchingLoader(loader(), bag, lambda b: b["user"]):
                bag(b["user"], b["offsets"]).sum().backward()
                seen.append(b)
        self.assertEqual(len(seen), 3)
        bag.flush()
        self.assertEqual(worker.stats().requests_completed, 3 * 2 * 2)
        bag.close()

    def test_a_loop_that_stops_early_leaves_no_prefetch_behind(self) -> None:
        client, _, worker = self.cluster()
        bag = PSEmbeddingBag(client, 1, DIM, "sum", staleness=1)
        data = self.batches(5, n=4)
        for b in PrefetchingLoader(data, bag, lambda b: b["user"]):
            break  # before the batch's forward, which would have prefetched the next
        # Other ids than batch 1's: their pull and push are the only requests sent.
        bag(torch.tensor([VOCAB + 1, VOCAB + 2]), torch.tensor([0])).sum().backward()
        bag.flush()
        report = bag.last_report
        assert isinstance(report, starwire.PipelineReport)
        self.assertEqual(report.prefetched, 0)
        # Batch 0's prefetch (sent before it was yielded), then a pull and a push: one
        # request to each PS each.
        self.assertEqual(worker.stats().requests_completed, 3 * 2)
        bag.close()

    def test_a_loss_over_two_loader_batches_pushes_both(self) -> None:
        client, _, _ = self.cluster()
        bag = PSEmbeddingBag(client, 1, DIM, "sum", pipelined=True, push_in_backward=False)
        every = np.arange(VOCAB, dtype=np.uint64)
        before = client.sharded(1, DIM).pull(every)[0]
        batches = [torch.tensor([[1, 2]]), torch.tensor([[3, 4]]), torch.tensor([[5, 6]]),
                   torch.tensor([[7, 8]])]
        loss = None
        for i, b in enumerate(PrefetchingLoader(batches, bag, lambda b: b)):
            out = bag(b).sum()
            loss = out if loss is None else loss + out
            if i % 2 == 1:  # one backward every two batches
                loss.backward()
                loss = None
        bag.flush()
        after = client.sharded(1, DIM).pull(every)[0]
        moved = [i for i in range(VOCAB) if not np.allclose(after[i], before[i])]
        self.assertEqual(moved, list(range(1, 9)))
        bag.close()

    def test_a_row_cache_serves_hits_and_refreshes_unchanged_rows(self) -> None:
        client, _, _ = self.cluster()
        with self.assertRaisesRegex(starwire.InvalidArgument, "cache_bytes=65536"):
            PSEmbeddingBag(client, 1, DIM, "sum", cache_bytes=1 << 16)
        # Staleness 2: the same ids again within the bound come from the cache.
        bag = PSEmbeddingBag(client, 1, DIM, "sum", staleness=2, cache_bytes=1 << 16)
        ids, offsets = torch.tensor([0, 1, 2, 3]), torch.tensor([0, 2])
        first = bag(ids, offsets)
        again = bag(ids, offsets)
        report = bag.last_report
        assert isinstance(report, starwire.PipelineReport)
        self.assertEqual((report.cache_hits, report.cache_misses, report.rows_received),
                         (4, 0, 0))
        torch.testing.assert_close(again, first)
        bag.close()
        # Staleness 0: every cached row is asked again with its version; a push of two of
        # four rows leaves the other two unchanged, which travel without their bytes.
        bag = PSEmbeddingBag(client, 2, DIM2, "sum", pipelined=True, cache_bytes=1 << 16)
        bag(ids, offsets)
        bag(torch.tensor([0, 2]), torch.tensor([0])).sum().backward()
        out = bag(ids, offsets)
        report = bag.last_report
        assert isinstance(report, starwire.PipelineReport)
        self.assertEqual((report.cache_hits, report.rows_unchanged, report.rows_received),
                         (0, 2, 2))
        bag.flush()
        every = np.arange(4, dtype=np.uint64)
        rows = client.sharded(2, DIM2).pull(every)[0]
        torch.testing.assert_close(out, torch.from_numpy(rows[[0, 2]] + rows[[1, 3]]))
        bag.close()

    def test_a_refused_push_raises_at_the_next_forward(self) -> None:
        tables = [RefusingTable(), RefusingTable()]
        client, _, _ = self.cluster([{1: t} for t in tables])
        bag = PSEmbeddingBag(client, 1, DIM, "sum", pipelined=True, timeout=20)
        ids, offsets = torch.tensor([0, 1, 2, 3]), torch.tensor([0, 2])
        with self.assertLogs("starwire", "ERROR"):
            bag(ids, offsets).sum().backward()
            # Gradients of 1000: refused by both PS tasks, after the backward returned.
            (bag(ids, offsets).sum() * 1000).backward()
            # Staleness 0: the next pull waits for that push, and raises its failure (the
            # first PS's found; the other's, if not yet answered, at the call after).
            with self.assertRaises(starwire.RemoteError) as caught:
                bag(ids, offsets)
            e = caught.exception
            failed = [(f.step, f.shard) for f in e.failed_pushes]
            if len(failed) < 2:
                with self.assertRaises(starwire.RemoteError) as again:
                    bag.flush()
                failed += [(f.step, f.shard) for f in again.exception.failed_pushes]
        self.assertEqual(e.status, starwire.INTERNAL, str(e))
        self.assertEqual(sorted(failed), [(1, 0), (1, 1)])
        if hasattr(e, "__notes__"):  # Python 3.11 and later
            self.assertIn("while pulling the rows of 4 ids of table 1", e.__notes__)
        # Raised once; the refused push was not applied.
        out = bag(ids, offsets)
        torch.testing.assert_close(out, torch.full((2, DIM), -2.0))
        self.assertEqual([t.applied for t in tables], [1, 1])
        bag.close()

    def test_a_killed_ps_s_push_is_raised_by_a_later_call_never_dropped(self) -> None:
        client, ps, _ = self.cluster()
        bag = PSEmbeddingBag(client, 1, DIM, "sum", staleness=1, timeout=20)
        ids, offsets = torch.tensor([0, 1, 2, 3]), torch.tensor([0, 2])
        bag(ids, offsets).sum().backward()
        out = bag(ids, offsets)
        ps[1].close()
        out.sum().backward()  # returns without waiting; its part at ps:1 fails after
        failed: list[starwire.PushFailure] = []
        with self.assertRaises(starwire.StarwireError) as caught:
            bag(ids, offsets)
        failed += caught.exception.failed_pushes
        if not failed:  # the pull failed first: the push failure is raised by flush
            with self.assertRaises(starwire.StarwireError) as caught:
                bag.flush()
            failed += caught.exception.failed_pushes
        self.assertIn("ps:1", str(caught.exception))
        self.assertEqual([(f.step, f.shard) for f in failed], [(1, 1)])


if __name__ == "__main__":
    unittest.main()
