"""Rows in bfloat16 and float16 on the wire, over real loopback sockets: two PS tasks
serving float32 `PsTable`s (SGD), a worker whose `Sharded`, `Pipeline` and `starwire.torch`
modules ask for bf16/f16 rows and push bf16 gradients with a loss scale; a PS whose
handshake does not announce ``row_formats`` (``STARWIRE_WIRE_FEATURES=none``); the
errors."""

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

    from starwire.torch import PSEmbedding, PSEmbeddingBag

NO_TORCH = "torch is not importable here (CI installs it; pip install torch)"
VOCAB, DIM, LR, TABLE = 40, 4, 0.25, 1


def bf16(x: npt.NDArray[Any]) -> npt.NDArray[np.float32]:
    """`x` rounded to the nearest bfloat16 (ties to even), as float32."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return rounded.astype(np.uint32).view(np.float32)


def f16(x: npt.NDArray[Any]) -> npt.NDArray[np.float32]:
    """`x` rounded to the nearest float16, as float32."""
    return np.asarray(x, dtype=np.float32).astype(np.float16).astype(np.float32)


def ps_table() -> starwire.PsTable:
    return starwire.PsTable(DIM, table_id=TABLE, init="uniform", scale=0.5, seed=11,
                            optimizer="sgd", lr=LR, huge_pages=False)


class WireCase(unittest.TestCase):
    """Two PS tasks (table `TABLE` split by id mod 2) and a worker naming them by address;
    `ps_settings` go to the PS runtimes."""

    ps_settings: dict[str, Any] = {}

    def setUp(self) -> None:
        self.tables = [ps_table() for _ in range(2)]
        self.ps = [starwire.Runtime("ps", i, listen="127.0.0.1:0", tables={TABLE: t},
                                    NETWORK_PS_CORE_NUMBER=1, **self.ps_settings)
                   for i, t in enumerate(self.tables)]
        self.peers = [p.address for p in self.ps]
        self.worker = starwire.Runtime("worker", NETWORK_WORKER_CORE_NUMBER=1)
        self.client = self.worker.client()
        # Every row made (a PsTable makes a row at its first pull) and read on the PS.
        self.sharded().pull(np.arange(VOCAB, dtype=np.uint64))

    def tearDown(self) -> None:
        self.worker.close()
        for p in self.ps:
            p.close()
        for t in self.tables:
            t.close()

    def held(self, ids: Any) -> npt.NDArray[np.float32]:
        """The rows of `ids` as the PS tables hold them (read on the PS side)."""
        ids = np.asarray(ids, dtype=np.uint64)
        out = np.zeros((len(ids), DIM), dtype=np.float32)
        for i, id_ in enumerate(ids):
            rows, missing = self.tables[int(id_) % 2].export_rows([id_])
            self.assertEqual(len(missing), 0)
            out[i] = rows[0]
        return out

    def sharded(self, **kw: Any) -> starwire.Sharded:
        s = self.client.sharded(TABLE, DIM, peers=self.peers, **kw)
        self.addCleanup(s.close)
        return s


class ShardedWireTest(WireCase):
    def test_a_bf16_pull_returns_the_rows_rounded_to_bf16(self) -> None:
        ids = np.array([3, 8, 3, 11, 0, 25], dtype=np.uint64)
        exact, _ = self.sharded().pull(ids)
        s = self.sharded(wire_dtype="bf16")
        self.assertEqual(s.wire_dtype, "bfloat16")
        rows, report = s.pull(ids)
        self.assertEqual(rows.dtype, np.float32)
        np.testing.assert_array_equal(rows, bf16(exact))
        # Uniform rows are not bf16 values: the rounding is seen.
        self.assertFalse(np.array_equal(rows, exact))
        self.assertEqual((report.unique, report.missing, report.fallbacks), (5, 0, 0))
        np.testing.assert_array_equal(exact, self.held(ids))

    def test_an_f16_pull_returns_the_rows_rounded_to_f16(self) -> None:
        ids = np.arange(VOCAB, dtype=np.uint64)
        exact, _ = self.sharded().pull(ids)
        rows, _ = self.sharded(wire_dtype=np.float16).pull(ids)
        np.testing.assert_array_equal(rows, f16(exact))
        self.assertFalse(np.array_equal(rows, exact))

    def test_a_bf16_push_with_a_loss_scale_applies_the_unscaled_gradient_in_f32(self) -> None:
        ids = np.array([5, 2, 5, 9], dtype=np.uint64)
        before = self.held([5, 2, 9])
        # Gradients that bf16 carries exactly (and their sums over duplicate ids too), then
        # multiplied by a power-of-two loss scale, as a scaled loss gives them.
        rng = np.random.default_rng(2)
        grads = (rng.integers(-8, 9, size=(4, DIM)) / 8).astype(np.float32)
        scale = 1024.0
        s = self.sharded(wire_dtype="bf16", loss_scale=scale)
        self.assertEqual(s.loss_scale, scale)
        s.push(ids, grads * np.float32(scale))
        summed = np.stack([grads[0] + grads[2], grads[1], grads[3]])
        want = before - np.float32(LR) * summed
        np.testing.assert_array_equal(self.held([5, 2, 9]), want)
        # The rows are float32 on the PS: the update is not rounded to bf16.
        self.assertFalse(np.array_equal(want, bf16(want)))

    def test_a_push_narrowed_to_bf16_rounds_the_summed_gradient(self) -> None:
        ids = np.array([4, 4, 7], dtype=np.uint64)
        before = self.held([4, 7])
        grads = np.array([[0.1, 0.2, 0.3, 0.4], [0.05, 0.05, 0.05, 0.05],
                          [1.001, -2.002, 3.003, -4.004]], dtype=np.float32)
        self.sharded(wire_dtype="bf16").push(ids, grads)
        summed = np.stack([grads[0] + grads[1], grads[2]])
        np.testing.assert_array_equal(self.held([4, 7]),
                                      before - np.float32(LR) * bf16(summed))

    def test_the_wire_dtype_and_loss_scale_can_be_changed_between_steps(self) -> None:
        ids = np.array([1, 2], dtype=np.uint64)
        s = self.sharded()
        exact, _ = s.pull(ids)
        s.set_wire_dtype("f16")
        np.testing.assert_array_equal(s.pull(ids)[0], f16(exact))
        s.set_wire_dtype(None)
        self.assertEqual(s.wire_dtype, "float32")
        np.testing.assert_array_equal(s.pull(ids)[0], exact)
        s.set_loss_scale(4.0)
        s.push(ids, np.full((2, DIM), 4.0, dtype=np.float32))
        np.testing.assert_array_equal(self.held(ids), exact - np.float32(LR))
        s.set_loss_scale(None)
        self.assertIsNone(s.loss_scale)

    def test_bad_wire_dtypes_and_loss_scales_are_refused_naming_them(self) -> None:
        s = self.sharded()
        with self.assertRaisesRegex(starwire.InvalidArgument, "wire_dtype 'int8'"):
            s.set_wire_dtype("int8")
        with self.assertRaisesRegex(starwire.InvalidArgument, "wire_dtype"):
            self.sharded(wire_dtype=np.int32)
        for bad in (-1.0, 0.0, float("nan"), float("inf"), "2"):
            with self.assertRaisesRegex(starwire.InvalidArgument, "loss_scale"):
                s.set_loss_scale(bad)  # type: ignore[arg-type]
        # Out of the wire's range: the library's message says so.
        with self.assertRaisesRegex(starwire.InvalidArgument, "2\\^126"):
            s.set_loss_scale(1e39)
        with self.assertRaisesRegex(starwire.InvalidArgument, "2\\^-126"):
            s.set_loss_scale(1e-39)
        self.assertEqual((s.wire_dtype, s.loss_scale), ("float32", None))
        # float64 rows travel only as float64.
        wide = self.client.sharded(TABLE, DIM, peers=self.peers, dtype=np.float64)
        self.addCleanup(wide.close)
        with self.assertRaisesRegex(starwire.InvalidArgument, "f64 rows"):
            wide.set_wire_dtype("bf16")
        with self.assertRaisesRegex(starwire.InvalidArgument, "f64 rows"):
            wide.set_loss_scale(2.0)


class PipelineWireTest(WireCase):
    def pipeline(self, **kw: Any) -> starwire.Pipeline:
        p = starwire.Pipeline(self.client, TABLE, DIM, peers=self.peers,
                              settings=starwire.PipelineSettings(staleness=0, **kw))
        self.addCleanup(p.close)
        return p

    def test_a_bf16_pipeline_pulls_rounded_rows_and_pushes_unscaled(self) -> None:
        ids = np.array([6, 13, 6, 20], dtype=np.uint64)
        exact, _ = self.sharded().pull(ids)
        p = self.pipeline(wire_dtype="bfloat16", loss_scale=256.0)
        rows, _ = p.pull(ids)
        np.testing.assert_array_equal(rows, bf16(exact))
        grads = np.full((4, DIM), 0.5 * 256.0, dtype=np.float32)
        p.push(ids, grads)
        p.flush()
        # id 6 twice: 1.0 summed; 13 and 20: 0.5 each, the scale divided out.
        step = np.array([[1.0], [0.5], [1.0], [0.5]], dtype=np.float32) * np.float32(LR)
        np.testing.assert_array_equal(self.held(ids), exact - step)

    def test_bad_pipeline_settings_are_refused_naming_them(self) -> None:
        with self.assertRaisesRegex(starwire.InvalidArgument, "wire_dtype 'int4'"):
            self.pipeline(wire_dtype="int4")
        with self.assertRaisesRegex(starwire.InvalidArgument, "loss_scale"):
            self.pipeline(loss_scale=-2.0)
        with self.assertRaisesRegex(starwire.InvalidArgument, "loss scale"):
            self.pipeline(loss_scale=1e39)
        with self.assertRaisesRegex(starwire.InvalidArgument, "wire_dtype is bf16"):
            starwire.Pipeline(self.client, TABLE, DIM, peers=self.peers, dtype=np.float64,
                              settings=starwire.PipelineSettings(wire_dtype="bf16"))


class OlderPsTest(WireCase):
    """PS tasks whose handshake does not announce ``row_formats``."""

    ps_settings = {"STARWIRE_WIRE_FEATURES": "none"}

    def test_a_bf16_client_is_served_f32_rows_and_its_scaled_push_applies(self) -> None:
        ids = np.array([3, 8, 3, 11, 0, 25], dtype=np.uint64)
        exact, _ = self.sharded().pull(ids)
        s = self.sharded(wire_dtype="bf16", loss_scale=8.0)
        rows, report = s.pull(ids)
        # As the Rust client does: the rows travel in the table's dtype, exactly.
        np.testing.assert_array_equal(rows, exact)
        self.assertEqual(report.fallbacks, 2)
        self.assertTrue(report.ok)
        s.push(np.array([8], dtype=np.uint64), np.full((1, DIM), 8.0, dtype=np.float32))
        np.testing.assert_array_equal(self.held([8]), exact[1:2] - np.float32(LR))
        p = starwire.Pipeline(self.client, TABLE, DIM, peers=self.peers,
                              settings=starwire.PipelineSettings(staleness=0,
                                                                 wire_dtype="bf16"))
        self.addCleanup(p.close)
        np.testing.assert_array_equal(p.pull(ids)[0], self.sharded().pull(ids)[0])


def _bags(rng: np.random.Generator, n: int) -> tuple[Any, Any]:
    lengths = rng.integers(1, 6, size=n)
    ids = torch.from_numpy(rng.integers(0, VOCAB, size=int(lengths.sum())))
    offsets = torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)[:-1]]))
    return ids, offsets


@unittest.skipUnless(HAVE_TORCH, NO_TORCH)
class TorchWireTest(WireCase):
    def setUp(self) -> None:
        super().setUp()
        self.exact = self.held(np.arange(VOCAB))

    def train(self, bag: Any, scale: float, steps: int = 8) -> tuple[Any, Any, Any]:
        """Trains `bag` and ``nn.EmbeddingBag`` (from the same rows, float32 throughout)
        side by side with a dense layer and SGD, the loss multiplied by `scale` for `bag`
        (its gradients then carry it); the last outputs of both, and the reference's
        rows."""
        ref = nn.EmbeddingBag(VOCAB, DIM, mode="mean")
        with torch.no_grad():
            ref.weight.copy_(torch.from_numpy(self.exact))
        torch.manual_seed(5)
        dense = nn.Linear(DIM, 1)
        torch.manual_seed(5)
        ref_dense = nn.Linear(DIM, 1)
        opt = torch.optim.SGD(dense.parameters(), lr=LR / scale)
        ref_opt = torch.optim.SGD([*ref.parameters(), *ref_dense.parameters()], lr=LR)
        rng = np.random.default_rng(3)
        out = want = None
        for _ in range(steps):
            ids, offsets = _bags(rng, 5)
            target = torch.from_numpy(rng.standard_normal((5, 1), dtype=np.float32))
            out, want = bag(ids, offsets), ref(ids, offsets)
            for model, emb_out, o, k in ((dense, out, opt, scale),
                                         (ref_dense, want, ref_opt, 1.0)):
                (((model(emb_out) - target) ** 2).mean() * k).backward()
                o.step()
                o.zero_grad()
        return out, want, ref.weight.detach().numpy()

    def test_a_bf16_bag_trains_as_torch_does_within_bf16_tolerance(self) -> None:
        bag = PSEmbeddingBag(self.client, TABLE, DIM, "mean", peers=self.peers,
                             wire_dtype="bf16")
        self.assertIs(bag.wire_dtype, torch.bfloat16)
        # The first forward is the bags of the rows rounded to bf16, exactly.
        ids, offsets = torch.tensor([1, 7, 7, 30]), torch.tensor([0, 2])
        rounded = torch.from_numpy(bf16(self.exact))
        with torch.no_grad():
            first = bag(ids, offsets)
        torch.testing.assert_close(first,
                                   nn.functional.embedding_bag(ids, rounded, offsets,
                                                               mode="mean"),
                                   rtol=0, atol=0)
        out, want, ref_rows = self.train(bag, 1.0)
        torch.testing.assert_close(out, want, rtol=2e-2, atol=2e-2)
        held = self.held(np.arange(VOCAB))
        np.testing.assert_allclose(held, ref_rows, rtol=2e-2, atol=2e-2)
        # The rows moved (the comparison is not of two untouched tables).
        self.assertGreater(float(np.abs(held - self.exact).max()), 0.01)

    def test_a_loss_scaled_pipelined_f16_bag_trains_as_torch_does(self) -> None:
        scale = 1024.0
        bag = PSEmbeddingBag(self.client, TABLE, DIM, "mean", peers=self.peers,
                             wire_dtype=torch.float16, loss_scale=scale, pipelined=True)
        out, want, ref_rows = self.train(bag, scale)
        bag.flush()
        torch.testing.assert_close(out, want, rtol=5e-3, atol=5e-3)
        np.testing.assert_allclose(self.held(np.arange(VOCAB)), ref_rows, rtol=5e-3,
                                   atol=5e-3)

    def test_a_bf16_embedding_pulls_rounded_rows(self) -> None:
        emb = PSEmbedding(self.client, TABLE, DIM, peers=self.peers, wire_dtype="bfloat16")
        ids = torch.tensor([[2, 9], [9, 39]])
        torch.testing.assert_close(emb(ids).detach(),
                                   torch.from_numpy(bf16(self.exact))[ids], rtol=0, atol=0)

    def test_bad_wire_dtypes_and_loss_scales_are_refused(self) -> None:
        with self.assertRaisesRegex(starwire.InvalidArgument, "wire_dtype torch.int8"):
            PSEmbedding(self.client, TABLE, DIM, peers=self.peers, wire_dtype=torch.int8)
        with self.assertRaisesRegex(starwire.InvalidArgument, "wire_dtype 'fp8'"):
            PSEmbeddingBag(self.client, TABLE, DIM, peers=self.peers, wire_dtype="fp8")
        with self.assertRaisesRegex(starwire.InvalidArgument, "loss_scale"):
            PSEmbeddingBag(self.client, TABLE, DIM, peers=self.peers, loss_scale=0.0)


if __name__ == "__main__":
    unittest.main()
