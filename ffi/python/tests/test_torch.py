"""`starwire.torch` over real loopback sockets: two PS tasks serving `PsTable`s with SGD, and
the PS-backed modules trained beside their torch counterparts (``nn.EmbeddingBag``,
``nn.Embedding`` with ``torch.optim.SGD``) from the same rows: the same outputs every step
and the same rows after them; state dicts that name where the rows live; the errors."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import unittest
import warnings
from typing import Any, Optional

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

    from starwire.torch import (MARKER_FORMAT, PSEmbedding, PSEmbeddingBag,
                                PSEmbeddingBagCollection, TableConfig)

NO_TORCH = "torch is not importable here (CI installs it; pip install torch)"
VOCAB, DIM, DIM2, LR, STEPS = 24, 4, 3, 0.25, 6
TOL: dict[str, Any] = dict(rtol=1e-5, atol=1e-6)


def ps_table(table_id: int, dim: int) -> starwire.PsTable:
    """A table every PS task creates alike: uniform rows (a fixed function of table, id and
    seed), SGD with `LR`."""
    return starwire.PsTable(dim, table_id=table_id, init="uniform", scale=0.5, seed=11,
                            optimizer="sgd", lr=LR, huge_pages=False)


class PsCase(unittest.TestCase):
    """Two PS tasks ``ps:0`` and ``ps:1`` (tables 1 and 2 on each, split by id mod 2),
    each with a checkpoint directory, and a worker that names them by task."""

    worker_settings: dict[str, Any] = {}

    def setUp(self) -> None:
        self.dirs = [tempfile.TemporaryDirectory() for _ in range(2)]
        self.ps = [starwire.Runtime("ps", i, listen="127.0.0.1:0",
                                    tables={1: ps_table(1, DIM), 2: ps_table(2, DIM2)},
                                    checkpoint_dir=self.dirs[i].name,
                                    NETWORK_PS_CORE_NUMBER=1)
                   for i in range(2)]
        cluster = {"ps": ["127.0.0.1:3000", "127.0.0.1:3001"]}
        endpoints = "".join(f"127.0.0.1:{3000 + i}=127.0.0.1:{p.port}\n"
                            for i, p in enumerate(self.ps))
        self.worker = starwire.Runtime("worker", cluster=cluster, endpoint_map=endpoints,
                                       NETWORK_WORKER_CORE_NUMBER=1, **self.worker_settings)
        self.client = self.worker.client()

    def tearDown(self) -> None:
        self.worker.close()
        for p in self.ps:
            p.close()
        for d in self.dirs:
            d.cleanup()

    def rows(self, table: int, dim: int) -> npt.NDArray[np.float32]:
        """Every row of the vocabulary as the PS tasks hold it now."""
        sharded = self.client.sharded(table, dim)
        try:
            rows, report = sharded.pull(np.arange(VOCAB, dtype=np.uint64))
            self.assertEqual(report.missing, 0)
            return rows
        finally:
            sharded.close()

    def requests(self) -> int:
        return int(self.worker.stats().requests_completed)


def _bags(rng: np.random.Generator, n: int) -> tuple[Any, Any]:
    """Ids of `n` bags drawn from a small vocabulary (duplicates in and across bags), one
    bag empty, and their offsets."""
    lengths = rng.integers(1, 6, size=n)
    lengths[rng.integers(0, n)] = 0
    ids = torch.from_numpy(rng.integers(0, VOCAB, size=int(lengths.sum())))
    offsets = torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)[:-1]]))
    return ids, offsets


@unittest.skipUnless(HAVE_TORCH, NO_TORCH)
class TrainingTest(PsCase):
    def reference(self, mode: Optional[str]) -> tuple[Any, Any]:
        """The torch module of the PS rows as they are (``nn.EmbeddingBag`` with `mode`,
        or ``nn.Embedding``), and a dense layer."""
        initial = torch.from_numpy(self.rows(1, DIM).copy())
        ref: Any = (nn.Embedding(VOCAB, DIM) if mode is None
                    else nn.EmbeddingBag(VOCAB, DIM, mode=mode))
        with torch.no_grad():
            ref.weight.copy_(initial)
        torch.manual_seed(5)
        return ref, nn.Linear(DIM, 1)

    def train_bags(self, mode: str, weighted: bool, two_d: bool) -> None:
        ref, ref_dense = self.reference(mode)
        initial = ref.weight.detach().clone()
        bag = PSEmbeddingBag(self.client, 1, DIM, mode)
        torch.manual_seed(5)
        dense = nn.Linear(DIM, 1)
        opt = torch.optim.SGD(dense.parameters(), lr=LR)
        ref_opt = torch.optim.SGD([*ref.parameters(), *ref_dense.parameters()], lr=LR)
        self.assertEqual(list(bag.parameters()), [])
        rng = np.random.default_rng(3)
        for step in range(STEPS):
            if two_d:
                ids, offsets = torch.from_numpy(rng.integers(0, VOCAB, size=(5, 3))), None
            else:
                ids, offsets = _bags(rng, 5)
            w = torch.from_numpy(rng.random(ids.shape, dtype=np.float32)) if weighted else None
            target = torch.from_numpy(rng.standard_normal((5, 1), dtype=np.float32))
            out = bag(ids, offsets, per_sample_weights=w)
            want = ref(ids, offsets, per_sample_weights=w)
            torch.testing.assert_close(out, want, **TOL)
            report = bag.last_report
            assert report is not None
            self.assertEqual(report.unique, len(torch.unique(ids)))
            for model, emb_out, o in ((dense, out, opt), (ref_dense, want, ref_opt)):
                loss = ((model(emb_out) - target) ** 2).sum()
                loss.backward()
                o.step()
                o.zero_grad()
            np.testing.assert_allclose(self.rows(1, DIM), ref.weight.detach().numpy(), **TOL,
                                       err_msg=f"after step {step}")
        torch.testing.assert_close(dense.weight, ref_dense.weight, **TOL)
        # The rows moved: the comparison is not of two untouched tables.
        self.assertGreater(float((ref.weight.detach() - initial).abs().max()), 0.01)

    def test_bag_sum_with_weights_duplicates_and_empty_bags_trains_as_torch_does(self) -> None:
        self.train_bags("sum", weighted=True, two_d=False)

    def test_bag_mean_with_empty_bags_trains_as_torch_does(self) -> None:
        self.train_bags("mean", weighted=False, two_d=False)

    def test_bag_mean_of_a_2d_input_trains_as_torch_does(self) -> None:
        self.train_bags("mean", weighted=False, two_d=True)

    def test_embedding_trains_as_torch_does(self) -> None:
        ref, ref_dense = self.reference(None)
        emb = PSEmbedding(self.client, 1, DIM, peers=["ps:0", "ps:1"])
        torch.manual_seed(5)
        dense = nn.Linear(DIM, 1)
        opt = torch.optim.SGD(dense.parameters(), lr=LR)
        ref_opt = torch.optim.SGD([*ref.parameters(), *ref_dense.parameters()], lr=LR)
        rng = np.random.default_rng(4)
        for _ in range(STEPS):
            ids = torch.from_numpy(rng.integers(0, VOCAB, size=(3, 5))).to(torch.int32)
            target = torch.from_numpy(rng.standard_normal((3, 5, 1), dtype=np.float32))
            out = emb(ids)
            self.assertEqual(out.shape, (3, 5, DIM))
            want = ref(ids)
            torch.testing.assert_close(out, want, **TOL)
            for model, emb_out, o in ((dense, out, opt), (ref_dense, want, ref_opt)):
                ((model(emb_out) - target) ** 2).mean().backward()
                o.step()
                o.zero_grad()
        np.testing.assert_allclose(self.rows(1, DIM), ref.weight.detach().numpy(), **TOL)

    def test_one_request_per_ps_each_way_and_duplicates_summed(self) -> None:
        bag = PSEmbeddingBag(self.client, 1, DIM, "sum")
        ids = torch.tensor([5, 2, 5, 5, 2, 7])
        before = self.requests()
        out = bag(ids, torch.tensor([0, 3]))
        # Three distinct ids over two PS tasks: one pull request to each.
        self.assertEqual(self.requests() - before, 2)
        rows = self.rows(1, DIM)
        torch.testing.assert_close(out[0], torch.from_numpy(rows[5] * 2 + rows[2]))
        before = self.requests()
        out.sum().backward()
        self.assertEqual(self.requests() - before, 2)
        # Each id's gradient summed over its occurrences: 3 for id 5, 2 for id 2, 1 for 7.
        after = self.rows(1, DIM)
        np.testing.assert_allclose(after[[5, 2, 7]], rows[[5, 2, 7]] - LR * np.array(
            [[3.0], [2.0], [1.0]], dtype=np.float32), **TOL)
        np.testing.assert_array_equal(after[[0, 1, 3]], rows[[0, 1, 3]])

    def test_the_output_is_computed_over_the_array_the_rows_were_pulled_into(self) -> None:
        bag = PSEmbeddingBag(self.client, 1, DIM, "sum")
        pulled: list[tuple[npt.NDArray[np.uint64], npt.NDArray[np.float32]]] = []
        pull_unique = bag._rows.pull_unique

        def recording(ids: npt.NDArray[np.uint64]) -> Any:
            unique, block, inverse = pull_unique(ids)
            pulled.append((unique, block))
            return unique, block, inverse

        setattr(bag._rows, "pull_unique", recording)
        ids = torch.tensor([6, 1, 6])
        w = torch.ones(3, requires_grad=True)
        out = bag(ids, torch.tensor([0, 2]), per_sample_weights=w)
        [(unique, block)] = pulled
        self.assertEqual(sorted(unique.tolist()), [1, 6])
        self.assertEqual(block.shape, (2, DIM))
        # The gradient of a weight is its row: read from the block's memory in backward, so
        # a change to the pulled array shows there (no copy was made of it). Each row is
        # set to its id.
        block[:] = unique.astype(np.float32)[:, None]
        out.sum().backward()
        assert w.grad is not None
        torch.testing.assert_close(w.grad, torch.tensor([6.0 * DIM, 1.0 * DIM, 6.0 * DIM]))

    def test_under_no_grad_a_forward_pushes_nothing(self) -> None:
        bag = PSEmbeddingBag(self.client, 1, DIM, "sum")
        rows = self.rows(1, DIM)
        with torch.no_grad():
            out = bag(torch.tensor([[1, 2], [3, 3]]))
        self.assertFalse(out.requires_grad)
        torch.testing.assert_close(out[1], torch.from_numpy(rows[3] * 2))
        np.testing.assert_array_equal(self.rows(1, DIM), rows)

    def test_include_last_offset_as_torch(self) -> None:
        bag = PSEmbeddingBag(self.client, 1, DIM, "sum", include_last_offset=True)
        ref = nn.EmbeddingBag(VOCAB, DIM, mode="sum", include_last_offset=True)
        with torch.no_grad():
            ref.weight.copy_(torch.from_numpy(self.rows(1, DIM).copy()))
        ids, offsets = torch.tensor([4, 9, 4, 1]), torch.tensor([0, 1, 1, 4])
        out = bag(ids, offsets)
        self.assertEqual(out.shape, (3, DIM))
        torch.testing.assert_close(out, ref(ids, offsets), **TOL)

    def test_a_batch_of_no_ids_sends_nothing(self) -> None:
        bag = PSEmbeddingBag(self.client, 1, DIM, "mean")
        before = self.requests()
        out = bag(torch.tensor([], dtype=torch.int64), torch.tensor([0, 0, 0]))
        torch.testing.assert_close(out, torch.zeros(3, DIM))
        out.sum().backward()
        self.assertEqual(self.requests(), before)

    def test_collection_trains_both_tables_as_torch_does(self) -> None:
        coll = PSEmbeddingBagCollection(self.client, {
            "user": TableConfig(1, DIM, "sum"), "item": TableConfig(2, DIM2, "mean")})
        refs = {"user": nn.EmbeddingBag(VOCAB, DIM, mode="sum"),
                "item": nn.EmbeddingBag(VOCAB, DIM2, mode="mean")}
        with torch.no_grad():
            refs["user"].weight.copy_(torch.from_numpy(self.rows(1, DIM).copy()))
            refs["item"].weight.copy_(torch.from_numpy(self.rows(2, DIM2).copy()))
        ref_opt = torch.optim.SGD([p for r in refs.values() for p in r.parameters()], lr=LR)
        rng = np.random.default_rng(6)
        for _ in range(STEPS):
            user, user_offsets = _bags(rng, 4)
            item = torch.from_numpy(rng.integers(0, VOCAB, size=(4, 2)))
            w = torch.from_numpy(rng.random(len(user), dtype=np.float32))
            before = self.requests()
            out = coll({"user": user, "item": item}, offsets={"user": user_offsets},
                       per_sample_weights={"user": w})
            # One pull per PS task for both tables.
            self.assertEqual(self.requests() - before, 2)
            want = {"user": refs["user"](user, user_offsets, per_sample_weights=w),
                    "item": refs["item"](item)}
            self.assertEqual(sorted(out), ["item", "user"])
            for name in out:
                torch.testing.assert_close(out[name], want[name], **TOL)
            before = self.requests()
            (out["user"].sum() + (out["item"] ** 2).sum()).backward()
            # And one push per PS task for both.
            self.assertEqual(self.requests() - before, 2)
            (want["user"].sum() + (want["item"] ** 2).sum()).backward()
            ref_opt.step()
            ref_opt.zero_grad()
        np.testing.assert_allclose(self.rows(1, DIM), refs["user"].weight.detach().numpy(),
                                   **TOL)
        np.testing.assert_allclose(self.rows(2, DIM2), refs["item"].weight.detach().numpy(),
                                   **TOL)
        # A subset of the features; and a bad input fails the step before any request.
        self.assertEqual(list(coll({"item": item})), ["item"])
        before = self.requests()
        with self.assertRaisesRegex(starwire.InvalidArgument, "not an integer dtype"):
            coll({"user": user, "item": item.float()}, offsets={"user": user_offsets})
        with self.assertRaisesRegex(starwire.InvalidArgument, "'price' is not one of"):
            coll({"price": item})
        self.assertEqual(self.requests(), before)


@unittest.skipUnless(HAVE_TORCH, NO_TORCH)
class DeferredPushTest(PsCase):
    """``push_in_backward=False``: backward sends nothing, `push_gradients` (or the next
    forward) pushes what backward accumulated, and the rows are those of the default."""

    def reference(self) -> tuple[Any, Any]:
        ref = nn.EmbeddingBag(VOCAB, DIM, mode="sum")
        with torch.no_grad():
            ref.weight.copy_(torch.from_numpy(self.rows(1, DIM).copy()))
        return ref, torch.optim.SGD(ref.parameters(), lr=LR)

    def test_backward_sends_nothing_and_push_gradients_one_request_per_ps(self) -> None:
        ref, ref_opt = self.reference()
        bag = PSEmbeddingBag(self.client, 1, DIM, "sum", push_in_backward=False)
        rng = np.random.default_rng(8)
        for step in range(STEPS):
            ids, offsets = _bags(rng, 5)
            w = torch.from_numpy(rng.random(len(ids), dtype=np.float32))
            out = bag(ids, offsets, per_sample_weights=w)
            want = ref(ids, offsets, per_sample_weights=w)
            torch.testing.assert_close(out, want, **TOL)
            before = self.requests()
            (out ** 2).sum().backward()
            self.assertEqual(self.requests(), before, f"step {step}: backward sent")
            # Explicitly on even steps; on odd ones the next forward (or the end) pushes.
            if step % 2 == 0 or step == STEPS - 1:
                bag.push_gradients()
                self.assertEqual(self.requests() - before, 2, f"step {step}")
                bag.push_gradients()  # nothing left: nothing sent
                self.assertEqual(self.requests() - before, 2)
            (want ** 2).sum().backward()
            ref_opt.step()
            ref_opt.zero_grad()
        np.testing.assert_allclose(self.rows(1, DIM), ref.weight.detach().numpy(), **TOL)

    def test_gradients_of_forwards_before_one_backward_are_all_pushed(self) -> None:
        ref, ref_opt = self.reference()
        bag = PSEmbeddingBag(self.client, 1, DIM, "sum", push_in_backward=False)
        a, a_off = torch.tensor([1, 2, 2, 5]), torch.tensor([0, 1])
        b, b_off = torch.tensor([2, 7, 9]), torch.tensor([0, 2])
        # Two forwards, then one backward of both (gradient accumulation).
        loss = bag(a, a_off).sum() + (bag(b, b_off) ** 2).sum()
        loss.backward()
        (ref(a, a_off).sum() + (ref(b, b_off) ** 2).sum()).backward()
        ref_opt.step()
        # The next forward pushes both (in order), then pulls.
        before = self.requests()
        out = bag(a, a_off)
        self.assertEqual(self.requests() - before, 2 * 2 + 2)
        torch.testing.assert_close(out, ref(a, a_off), **TOL)
        np.testing.assert_allclose(self.rows(1, DIM), ref.weight.detach().numpy(), **TOL)

    def test_forwards_without_backward_keep_a_bounded_number_of_blocks(self) -> None:
        bag = PSEmbeddingBag(self.client, 1, DIM, "sum", push_in_backward=False)
        ids, offsets = torch.tensor([3, 4]), torch.tensor([0])
        before = self.rows(1, DIM)
        for _ in range(40):
            bag(ids, offsets)  # grad enabled, no backward
        self.assertEqual(len(bag._deferred), 16 + 1)
        requests = self.requests()
        bag.push_gradients()  # no block has a gradient: nothing sent, all forgotten
        self.assertEqual(self.requests(), requests)
        self.assertEqual(len(bag._deferred), 0)
        np.testing.assert_array_equal(self.rows(1, DIM), before)
        with torch.no_grad():
            bag(ids, offsets)
        self.assertEqual(len(bag._deferred), 0)

    def test_collection_pushes_every_table_in_one_request_per_ps(self) -> None:
        coll = PSEmbeddingBagCollection(self.client, {
            "user": TableConfig(1, DIM, "sum"), "item": TableConfig(2, DIM2, "mean")},
            push_in_backward=False)
        refs = {"user": nn.EmbeddingBag(VOCAB, DIM, mode="sum"),
                "item": nn.EmbeddingBag(VOCAB, DIM2, mode="mean")}
        with torch.no_grad():
            refs["user"].weight.copy_(torch.from_numpy(self.rows(1, DIM).copy()))
            refs["item"].weight.copy_(torch.from_numpy(self.rows(2, DIM2).copy()))
        ref_opt = torch.optim.SGD([p for r in refs.values() for p in r.parameters()], lr=LR)
        rng = np.random.default_rng(9)
        for step in range(STEPS):
            user, user_offsets = _bags(rng, 4)
            item = torch.from_numpy(rng.integers(0, VOCAB, size=(4, 2)))
            out = coll({"user": user, "item": item}, offsets={"user": user_offsets})
            want = {"user": refs["user"](user, user_offsets), "item": refs["item"](item)}
            for name in out:
                torch.testing.assert_close(out[name], want[name], **TOL)
            before = self.requests()
            (out["user"].sum() + (out["item"] ** 2).sum()).backward()
            self.assertEqual(self.requests(), before)
            if step % 2:
                coll.push_gradients()
                self.assertEqual(self.requests() - before, 2)
            (want["user"].sum() + (want["item"] ** 2).sum()).backward()
            ref_opt.step()
            ref_opt.zero_grad()
        coll.flush()
        np.testing.assert_allclose(self.rows(1, DIM), refs["user"].weight.detach().numpy(),
                                   **TOL)
        np.testing.assert_allclose(self.rows(2, DIM2), refs["item"].weight.detach().numpy(),
                                   **TOL)

    def test_collection_gradients_of_two_forwards_before_one_backward_are_pushed(self) -> None:
        rows_before = self.rows(1, DIM)
        for in_backward in (False, True):
            coll = PSEmbeddingBagCollection(self.client, {
                "user": TableConfig(1, DIM, "sum"), "item": TableConfig(2, DIM2, "sum")},
                push_in_backward=in_backward)
            a = coll({"user": torch.tensor([[1], [3]]), "item": torch.tensor([[1]])})
            b = coll({"user": torch.tensor([[5], [7]]), "item": torch.tensor([[2]])})
            # One loss over both forwards, leaving out the first forward's "item" table.
            (a["user"].sum() + b["user"].sum() + b["item"].sum()).backward()
            coll.push_gradients()
            coll.close()
            after = self.rows(1, DIM)
            # Every id of both forwards moved by LR (SGD, gradient 1), each pushed once.
            moved = [i for i in range(VOCAB) if not np.allclose(after[i], rows_before[i])]
            self.assertEqual(moved, [1, 3, 5, 7], f"push in backward: {in_backward}")
            np.testing.assert_allclose(after[[1, 3, 5, 7]], rows_before[[1, 3, 5, 7]] - LR,
                                       **TOL)
            rows_before = after

    def test_a_backward_that_keeps_its_graph_pushes(self) -> None:
        for in_backward in (True, False):
            bag = PSEmbeddingBag(self.client, 1, DIM, "sum", push_in_backward=in_backward)
            before = self.rows(1, DIM)
            # One id per bag: each row's gradient is twice itself (a bag of both would sum
            # to zero after one SGD step of this rate, and the second round push nothing).
            with warnings.catch_warnings():  # torch's note on the graph it keeps
                warnings.simplefilter("ignore", UserWarning)
                (bag(torch.tensor([[2], [4]])) ** 2).sum().backward(create_graph=True)
            bag.push_gradients()
            after = self.rows(1, DIM)
            moved = [i for i in range(VOCAB) if not np.allclose(after[i], before[i])]
            self.assertEqual(moved, [2, 4], f"push in backward: {in_backward}")
            np.testing.assert_allclose(after[[2, 4]], before[[2, 4]] * (1 - 2 * LR), **TOL)
            bag.close()

    def test_a_push_refused_before_it_is_sent_stays_to_be_pushed(self) -> None:
        bag = PSEmbeddingBag(self.client, 1, DIM, "sum", push_in_backward=False)
        bag(torch.tensor([[2, 4]])).sum().backward()
        self.worker.close()
        with self.assertRaises(starwire.Closed):
            bag.push_gradients()
        self.assertEqual(len(bag._deferred), 1)

    def test_push_in_backward_must_be_a_bool(self) -> None:
        with self.assertRaisesRegex(starwire.InvalidArgument, "push_in_backward 1 is not a"):
            PSEmbeddingBag(self.client, 1, DIM, push_in_backward=1)  # type: ignore[arg-type]


@unittest.skipUnless(HAVE_TORCH, NO_TORCH)
class StateTest(PsCase):
    def test_the_state_dict_names_the_table_and_its_tasks(self) -> None:
        bag = PSEmbeddingBag(self.client, 1, DIM, "sum")
        state = bag.state_dict()
        self.assertEqual(list(state), ["_extra_state"])
        marker = state["_extra_state"]
        self.assertEqual((marker["format"], marker["table"], marker["dim"], marker["tasks"]),
                         (MARKER_FORMAT, 1, DIM, ["ps:0", "ps:1"]))
        self.assertIn("on the PS tasks", marker["rows"])
        # In a model, beside the dense parameters; loaded into a model of the same table.
        model = nn.ModuleDict({"emb": bag, "dense": nn.Linear(DIM, 1)})
        saved = model.state_dict()
        self.assertEqual(sorted(saved), ["dense.bias", "dense.weight", "emb._extra_state"])
        again = nn.ModuleDict({"emb": PSEmbeddingBag(self.client, 1, DIM, "sum"),
                               "dense": nn.Linear(DIM, 1)})
        again.load_state_dict(saved)
        torch.testing.assert_close(again["dense"].weight, model["dense"].weight)
        # The marker of another table, or of another split of this one, is refused.
        other = nn.ModuleDict({"emb": PSEmbeddingBag(self.client, 2, DIM2, "sum"),
                               "dense": nn.Linear(DIM, 1)})
        with self.assertRaisesRegex(starwire.InvalidArgument,
                                    r"marker of table 1 .*not of this module's table 2"):
            other.load_state_dict(saved)
        alone = PSEmbeddingBag(self.client, 1, DIM, "sum", peers=["ps:0"])
        with self.assertRaisesRegex(starwire.InvalidArgument, "not over 1 PS tasks"):
            alone.load_state_dict(state)
        # A torch module's rows are not taken silently in place of the marker.
        with self.assertRaises(RuntimeError):
            bag.load_state_dict(nn.EmbeddingBag(VOCAB, DIM).state_dict())
        with self.assertRaisesRegex(starwire.InvalidArgument, "not a starwire.torch"):
            bag.load_state_dict({"_extra_state": {"table": 1}})

    def test_checkpoint_asks_each_ps_task_to_save(self) -> None:
        emb = PSEmbedding(self.client, 1, DIM)
        emb(torch.arange(10)).sum().backward()
        manifests = emb.checkpoint(timeout=60)
        self.assertEqual([m["task"] for m in manifests], ["ps:0", "ps:1"])
        for m, d in zip(manifests, self.dirs):
            self.assertEqual(m["dir"], d.name)
            tables = {t["table"]: t for t in m["tables"]}
            # Ids 0..9 split by id mod 2: five rows of table 1 on each task.
            self.assertEqual(tables[1]["rows"], 5)
            self.assertTrue(os.path.exists(os.path.join(d.name, tables[1]["file"])))
        coll = PSEmbeddingBagCollection(self.client, {"a": TableConfig(1, DIM),
                                                      "b": TableConfig(2, DIM2)})
        self.assertEqual([m["task"] for m in coll.checkpoint()], ["ps:0", "ps:1"])
        self.assertEqual(sorted(coll.state_dict()), ["bags.a._extra_state",
                                                     "bags.b._extra_state"])


@unittest.skipUnless(HAVE_TORCH, NO_TORCH)
class ErrorsTest(PsCase):
    worker_settings = {"STARWIRE_CONNECT_RETRIES": 0}

    def test_ids_that_are_not_ids_are_refused_before_sending(self) -> None:
        bag = PSEmbeddingBag(self.client, 1, DIM, "sum", num_embeddings=VOCAB)
        emb = PSEmbedding(self.client, 1, DIM)
        offsets = torch.tensor([0])
        cases: list[tuple[Any, str]] = [
            (torch.tensor([1.0, 2.0]), "input has dtype torch.float32, not an integer dtype"),
            (torch.tensor([True]), "torch.bool, not an integer dtype"),
            (torch.tensor([3, -1]), r"input\[1\] is -1: negative"),
            (torch.tensor([3, VOCAB]), rf"input\[1\] is {VOCAB}: not below num_embeddings"),
            ([1, 2], "input is a list, not a tensor"),
            (torch.tensor([1], device="meta"), "input is on meta: .* on the CPU"),
        ]
        uint64 = getattr(torch, "uint64", None)
        if uint64 is not None:
            big = torch.from_numpy(np.array([1, 1 << 63], dtype=np.uint64))
            cases.append((big, rf"input\[1\] is {1 << 63}: over int64's range"))
        before = self.requests()
        for ids, message in cases:
            with self.assertRaisesRegex(starwire.InvalidArgument, message):
                bag(ids, offsets)
        with self.assertRaisesRegex(starwire.InvalidArgument, r"input\[0, 1\] is -2: negative"):
            emb(torch.tensor([[0, -2]]))
        with self.assertRaisesRegex(starwire.InvalidArgument, "offsets has dtype"):
            bag(torch.tensor([1]), torch.tensor([0.0]))
        with self.assertRaisesRegex(starwire.InvalidArgument, "needs offsets"):
            bag(torch.tensor([1]))
        with self.assertRaisesRegex(starwire.InvalidArgument, "offsets is given with a 2-D"):
            bag(torch.tensor([[1]]), offsets)
        with self.assertRaisesRegex(starwire.InvalidArgument, "3 dimensions"):
            bag(torch.zeros(1, 1, 1, dtype=torch.int64))
        mean = PSEmbeddingBag(self.client, 1, DIM, "mean")
        with self.assertRaisesRegex(starwire.InvalidArgument, "per_sample_weights is for mode"):
            mean(torch.tensor([[1]]), per_sample_weights=torch.ones(1, 1))
        self.assertEqual(self.requests(), before)
        # uint64 ids within int64's range are taken as they are.
        if uint64 is not None:
            ok = torch.from_numpy(np.array([3, 4], dtype=np.uint64))
            torch.testing.assert_close(bag(ok, offsets), bag(torch.tensor([3, 4]), offsets))

    def test_bad_options_are_refused_naming_them(self) -> None:
        with self.assertRaisesRegex(starwire.InvalidArgument, "wire_dtype torch.float64"):
            PSEmbedding(self.client, 1, DIM, wire_dtype=torch.float64)
        with self.assertRaisesRegex(starwire.InvalidArgument, "staleness -1"):
            PSEmbeddingBag(self.client, 1, DIM, staleness=-1)
        with self.assertRaisesRegex(starwire.InvalidArgument, "pipelined=False allows only 0"):
            PSEmbeddingBagCollection(self.client, {"a": TableConfig(1, DIM)}, staleness=1,
                                     pipelined=False)
        with self.assertRaisesRegex(starwire.InvalidArgument, "prefetch needs a module"):
            PSEmbeddingBag(self.client, 1, DIM).prefetch(torch.tensor([[1, 2]]))
        with self.assertRaisesRegex(starwire.InvalidArgument, "mode 'max'"):
            PSEmbeddingBag(self.client, 1, DIM, "max")
        with self.assertRaisesRegex(starwire.InvalidArgument, "give num_embeddings"):
            PSEmbedding(self.client, 1, DIM, partition="div")
        with self.assertRaisesRegex(starwire.InvalidArgument, "both name table 1"):
            PSEmbeddingBagCollection(self.client, {"a": TableConfig(1, DIM),
                                                   "b": TableConfig(1, DIM)})

    def test_a_dead_ps_fails_the_forward_and_the_backward(self) -> None:
        bag = PSEmbeddingBag(self.client, 1, DIM, "sum", timeout=10)
        ids, offsets = torch.tensor([2, 3]), torch.tensor([0])
        out = bag(ids, offsets)
        row2 = out.detach().numpy()[0] - self.rows_at(1, 3)
        self.ps[1].close()
        # The push of the step already pulled: ps:1's part fails, ps:0's is applied.
        with self.assertRaises((starwire.ConnectionLost, starwire.ConnectFailed)) as e:
            out.sum().backward()
        err = e.exception
        assert isinstance(err, starwire.StarwireError)
        self.assertIn("ps:1", str(err))
        self.assertIsNone(err.report.parts[0])
        if hasattr(err, "__notes__"):  # Python 3.11 and later
            self.assertIn("while pushing the gradients of 2 rows of table 1", err.__notes__)
        np.testing.assert_allclose(self.rows_at(0, 2), row2 - LR, **TOL)
        with self.assertRaises((starwire.ConnectionLost, starwire.ConnectFailed)) as e:
            bag(ids, offsets)
        self.assertIn("ps:1", str(e.exception))
        # Ids of ps:0 alone still work.
        bag(torch.tensor([2, 4]), offsets).sum().backward()

    def rows_at(self, task: int, id_: int) -> npt.NDArray[np.float32]:
        rows, missing = self.client.pull_rows(f"ps:{task}", 1, [id_], DIM)
        self.assertEqual(missing.size, 0)
        row: npt.NDArray[np.float32] = rows[0]
        return row

    def test_a_closed_runtime_raises_closed(self) -> None:
        bag = PSEmbeddingBag(self.client, 1, DIM, "sum")
        out = bag(torch.tensor([1, 2]), torch.tensor([0]))
        self.worker.close()
        with self.assertRaisesRegex(starwire.Closed, "runtime of worker:0 is closed"):
            bag(torch.tensor([1, 2]), torch.tensor([0]))
        with self.assertRaisesRegex(starwire.Closed, "cannot push gradients to table 1"):
            out.sum().backward()


class ImportTest(unittest.TestCase):
    def test_the_package_does_not_import_torch(self) -> None:
        # Only ``import starwire.torch`` does; without torch installed the rest works.
        code = "import sys, starwire; print('torch' in sys.modules)"
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              check=True)
        self.assertEqual(done.stdout.strip(), "False")


if __name__ == "__main__":
    unittest.main()
