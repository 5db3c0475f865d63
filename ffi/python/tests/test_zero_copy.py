"""Arrays cross without copies: received tensors and row blocks are numpy arrays over the
memory their payload was received into; arrays pushed or published are sent from their own
memory."""

from __future__ import annotations

import threading
import time
import unittest
from typing import Any, Optional

import numpy as np
import numpy.typing as npt

import starwire
from starwire import _lib

try:
    import torch
except ImportError:
    HAVE_TORCH = False
else:
    HAVE_TORCH = True


class RecordingAllocator:
    """An allocator hook that hands out fresh numpy arrays and records their addresses."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.returned: list[int] = []

    def __call__(self, dtype: np.dtype[Any], shape: tuple[int, ...]) -> Optional[npt.NDArray[Any]]:
        a = np.empty(shape, dtype=dtype)
        with self.lock:
            self.returned.append(int(a.ctypes.data))
        return a


class Recorded:
    """A PS service that keeps a copy of every array pushed to it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pushed: dict[int, npt.NDArray[Any]] = {}

    def pull(self, ids: list[int]) -> list[Optional[npt.NDArray[Any]]]:
        return [None for _ in ids]

    def push(self, ids: list[int], arrays: list[npt.NDArray[Any]]) -> list[int]:
        with self.lock:
            for i, a in zip(ids, arrays):
                self.pushed[i] = a.copy()
        return [starwire.OK] * len(ids)


class WrapSpy:
    """Records the data address of every array lent to starwire as a tensor
    (``sw_tensor_wrap``: the memory a push or publish is sent from) while active."""

    def __init__(self) -> None:
        self.addresses: list[int] = []

    def __enter__(self) -> WrapSpy:
        self.real = _lib.tensor_wrap

        def wrap(*args: Any) -> int:
            self.addresses.append(int(args[3]))
            return int(self.real(*args))

        _lib.tensor_wrap = wrap
        return self

    def __exit__(self, *exc: object) -> None:
        _lib.tensor_wrap = self.real


class ZeroCopyTest(unittest.TestCase):
    def setUp(self) -> None:
        self.ps = starwire.Runtime("ps", listen="127.0.0.1:0", NETWORK_PS_CORE_NUMBER=1,
                                   tables={0: starwire.MemTable(64, init="uniform", scale=1.0)})
        self.peer = self.ps.address

    def tearDown(self) -> None:
        self.ps.close()

    def test_received_arrays_are_the_memory_the_allocator_hook_returned(self) -> None:
        hook = RecordingAllocator()
        with starwire.Runtime("worker", allocator=hook) as w:
            c = w.client()
            big = np.arange(1 << 20, dtype=np.float32)  # 4 MiB: received from the socket
            small = np.arange(6, dtype=np.int16).reshape(2, 3)
            self.ps.publish("big", big)
            self.ps.publish("small", small)
            got_big, got_small = c.recv_many(self.peer, 1, ["big", "small"])
            self.assertEqual(len(hook.returned), 2)
            self.assertEqual({int(got_big.ctypes.data), int(got_small.ctypes.data)},
                             set(hook.returned))
            np.testing.assert_array_equal(got_big, big)
            np.testing.assert_array_equal(got_small, small)
            self.assertGreaterEqual(w.stats().payload_direct, big.nbytes // 2)

    def test_received_arrays_are_over_the_received_memory(self) -> None:
        with starwire.Runtime("worker") as w:
            c = w.client()
            big = np.arange(1 << 20, dtype=np.float64)
            self.ps.publish("big", big)
            before = w.stats().payload_direct
            got = c.recv(self.peer, 1, "big")
            np.testing.assert_array_equal(got, big)
            # Most of the 8 MiB went from the socket straight into the array's memory.
            self.assertGreaterEqual(w.stats().payload_direct - before, big.nbytes // 2)
            self.assertEqual(w.stats().payload_copied, 0)
            self.assertTrue(got.flags.writeable and got.flags.c_contiguous)

    def test_row_blocks_are_received_into_out(self) -> None:
        with starwire.Runtime("worker") as w:
            c = w.client()
            ids = np.arange(20000, dtype=np.uint64)
            out = np.empty((len(ids), 64), dtype=np.float32)
            rows, _ = c.pull_rows(self.peer, 0, ids, 64, out=out)
            self.assertIs(rows, out)
            self.assertGreaterEqual(w.stats().payload_direct, out.nbytes // 2)

    def test_published_arrays_are_sent_from_their_own_memory(self) -> None:
        a = np.zeros(1000, dtype=np.int32)
        self.ps.publish("shared", a)
        self.assertEqual(self.ps.lent, 1)
        # Changed after the publish and before the recv: the peer sees the change, so the
        # bytes were not copied at the publish.
        a[:] = 7
        with starwire.Runtime("worker") as w:
            got = w.client().recv(self.peer, 1, "shared")
        np.testing.assert_array_equal(got, 7)
        self.assertEqual(self.ps.lent, 0)

    def test_pushed_arrays_are_wrapped_not_copied(self) -> None:
        lender = self.ps._lender
        a = np.arange(12, dtype=np.float32).reshape(3, 4)
        handle = lender.wrap(a, "a")
        self.assertEqual(_lib.tensor_data(handle), a.ctypes.data)
        self.assertFalse(_lib.tensor_data_mut(handle), "never written through")
        _lib.tensor_free(handle)
        with self.assertRaisesRegex(starwire.InvalidArgument, "C-contiguous"):
            lender.wrap(a.T, "a")
        with self.assertRaisesRegex(starwire.InvalidArgument, "C-contiguous"):
            lender.wrap(a[:, ::2], "a")

    def test_pushed_arrays_are_lent_to_starwire_not_copied(self) -> None:
        service = Recorded()
        with starwire.Runtime("ps", listen="127.0.0.1:0", service=service) as ps, \
                starwire.Runtime("worker") as w:
            c = w.client()
            big = np.arange(1 << 18, dtype=np.float32)  # 1 MiB: sent in chunks from it
            small = np.arange(6, dtype=np.int16).reshape(2, 3)
            with WrapSpy() as spy:
                self.assertEqual(c.push(ps.address, [(1, big), (2, small)]), [0, 0])
            # The tensors starwire sent are over the arrays' own memory.
            self.assertEqual(spy.addresses, [big.ctypes.data, small.ctypes.data])
            np.testing.assert_array_equal(service.pushed[1], big)
            np.testing.assert_array_equal(service.pushed[2], small)
            # Not C-contiguous: refused before anything is sent, no silent copy.
            with WrapSpy() as spy, self.assertRaisesRegex(starwire.InvalidArgument,
                                                          "C-contiguous"):
                c.push(ps.address, [(3, big.reshape(512, 512).T)])
            self.assertEqual(spy.addresses, [])
            self.assertNotIn(3, service.pushed)

    def test_push_rows_sends_the_gradient_array_from_its_own_memory(self) -> None:
        # The ids are passed as they are (the C ABI copies them into the request); the
        # gradient block is lent to starwire as a tensor over the array's memory
        # (`sw_tensor_wrap`) and sent from there (`sw_client_push_rows_tensors`).
        with starwire.Runtime("worker") as w:
            c = w.client()
            ids = np.arange(4096, dtype=np.uint64)
            grads = np.ones((len(ids), 64), dtype=np.float32)
            before, _ = c.pull_rows(self.peer, 0, ids, 64)
            with WrapSpy() as spy:
                c.push_rows(self.peer, 0, ids, grads)
            self.assertEqual(spy.addresses, [grads.ctypes.data])
            self.assertEqual(c._rows.ids, ids.ctypes.data)
            after, _ = c.pull_rows(self.peer, 0, ids, 64)
            np.testing.assert_allclose(after, before - np.float32(0.01) * grads, rtol=1e-6)
            # Not C-contiguous, or a dtype starwire does not carry: refused before anything
            # is sent or lent, no silent copy.
            with WrapSpy() as spy:
                with self.assertRaisesRegex(starwire.InvalidArgument, "C-contiguous"):
                    c.push_rows(self.peer, 0, ids[:64], grads[:128].reshape(64, 128)[:, ::2])
                with self.assertRaisesRegex(starwire.InvalidArgument, "dtype"):
                    c.push_rows(self.peer, 0, ids[:2], np.array([["a"] * 64] * 2))
            self.assertEqual(spy.addresses, [])

    def test_a_submitted_rows_push_holds_its_gradient_array(self) -> None:
        with starwire.Runtime("worker") as w:
            c = w.client()
            ids = np.arange(1000, dtype=np.uint64)
            before, _ = c.pull_rows(self.peer, 0, ids, 64)
            grads = np.full((len(ids), 64), 2.0, dtype=np.float32)
            address = grads.ctypes.data
            with WrapSpy() as spy:
                pending = c.submit_push_rows(self.peer, 0, ids, grads)
            self.assertEqual(spy.addresses, [address])
            # The caller's reference dropped: the pending (and, until the block is
            # written, the runtime's lender) keeps the array alive.
            del grads
            self.assertIn(pending.tag, c._inflight)
            pending.wait()
            self.assertNotIn(pending.tag, c._inflight)
            after, _ = c.pull_rows(self.peer, 0, ids, 64)
            np.testing.assert_allclose(after, before - np.float32(0.02), rtol=1e-6)
            while w.lent:  # let go of once written (reported just after the answer at most)
                time.sleep(0.001)

    @unittest.skipUnless(HAVE_TORCH, "torch is not importable here (CI installs it)")
    def test_torch_tensors_are_pushed_and_pulled_without_copies(self) -> None:
        service = Recorded()
        with starwire.Runtime("ps", listen="127.0.0.1:0", service=service) as ps, \
                starwire.Runtime("worker") as w:
            c = w.client()
            t = torch.arange(1 << 16, dtype=torch.float32).reshape(256, 256)
            view = t.numpy()  # the tensor's memory, no copy
            self.assertEqual(view.ctypes.data, t.data_ptr())
            with WrapSpy() as spy:
                self.assertEqual(c.push(ps.address, [(1, view)]), [0])
            self.assertEqual(spy.addresses, [t.data_ptr()])
            np.testing.assert_array_equal(service.pushed[1], view)
            # A transposed tensor is not C-contiguous: refused, not copied.
            with self.assertRaisesRegex(starwire.InvalidArgument, "C-contiguous"):
                c.push(ps.address, [(2, t.t().numpy())])
            # Rows pulled into a torch tensor's memory, and its gradient pushed from it.
            ids = np.arange(512, dtype=np.uint64)
            emb = torch.empty((len(ids), 64), dtype=torch.float32)
            rows, _ = c.pull_rows(self.peer, 0, ids, 64, out=emb.numpy())
            self.assertEqual(rows.ctypes.data, emb.data_ptr())
            grad = torch.full((len(ids), 64), 2.0)
            with WrapSpy() as spy:
                c.push_rows(self.peer, 0, ids, grad.numpy())
            self.assertEqual(spy.addresses, [grad.data_ptr()])
            again, _ = c.pull_rows(self.peer, 0, ids, 64)
            self.assertTrue(torch.allclose(torch.from_numpy(again), emb - 0.02))

    @unittest.skipUnless(HAVE_TORCH, "torch is not importable here (CI installs it)")
    def test_torch_tensors_share_the_memory(self) -> None:
        with starwire.Runtime("worker") as w:
            c = w.client()
            rows, _ = c.pull_rows(self.peer, 0, np.arange(8, dtype=np.uint64), 64)
            t = torch.from_numpy(rows)
            self.assertEqual(t.data_ptr(), rows.ctypes.data)
            src = torch.arange(16, dtype=torch.float32)
            self.ps.publish("t", src.numpy())
            src += 1  # the publish reads the tensor's own memory
            recv = torch.from_numpy(c.recv(self.peer, 1, "t"))
            self.assertTrue(torch.equal(recv, torch.arange(1, 17, dtype=torch.float32)))


if __name__ == "__main__":
    unittest.main()
