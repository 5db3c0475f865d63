"""Ids are u64 on the wire: every call that takes ids refuses floats, bools, negatives and
values of 2^64 or more with `InvalidArgument` before anything is sent, and takes Python
ints and integer arrays in 0..2^64-1 as they are."""

from __future__ import annotations

import threading
import unittest
from typing import Any, Callable, Optional, Sequence

import numpy as np
import numpy.typing as npt

import starwire


class Recorder:
    """A Python rows table (float32 rows of 4) and a per-tensor service that remember every
    id they were asked about."""

    dtype = np.float32
    row_shape = (4,)

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: list[int] = []

    def _saw(self, ids: Sequence[int]) -> None:
        with self.lock:
            self.seen.extend(int(i) for i in ids)

    # RowsTable
    def pull(self, ids: Any, out: Any = None) -> Any:
        self._saw(ids.tolist() if isinstance(ids, np.ndarray) else ids)
        if out is None:  # Service.pull
            return [np.zeros(1, dtype=np.float32) for _ in ids]
        out[:] = 1.0
        return None

    def push(self, ids: Any, grads: Any) -> Any:
        self._saw(ids.tolist() if isinstance(ids, np.ndarray) else ids)
        return None if isinstance(ids, np.ndarray) else [0] * len(ids)


class ServiceOf:
    """The recorder as a per-tensor service."""

    def __init__(self, r: Recorder) -> None:
        self.r = r

    def pull(self, ids: list[int]) -> Sequence[Optional[npt.NDArray[Any]]]:
        result: Sequence[Optional[npt.NDArray[Any]]] = self.r.pull(ids)
        return result

    def push(self, ids: list[int], arrays: list[npt.NDArray[Any]]) -> Sequence[int]:
        result: Sequence[int] = self.r.push(ids, arrays)
        return result


BAD_IDS: list[tuple[Any, str]] = [
    ([1.5], "ids[0] is 1.5: a float"),
    ([3, 2.0], "ids[1] is 2.0: a float"),
    ([-1], "ids[0] is -1: negative"),
    ([True], "ids[0] is True: a bool"),
    ([1, False], "ids[1] is False: a bool"),
    ([2**64], "2^64 or more"),
    ([1, 2**64 + 5], "2^64 or more"),
    ([-1, 2**63], "negative"),
    (["7"], "a str, not an integer"),
    (np.array([-1]), "ids[0] is -1: negative"),
    (np.array([4, 5, -6], dtype=np.int32), "ids[2] is -6: negative"),
    (np.array([1.0, 2.0]), "dtype float64"),
    (np.array([True]), "dtype bool"),
]


class IdsTest(unittest.TestCase):
    def setUp(self) -> None:
        self.rec = Recorder()
        self.ps = starwire.Runtime("ps", listen="127.0.0.1:0", service=ServiceOf(self.rec),
                                   tables={0: self.rec}, NETWORK_PS_CORE_NUMBER=1)
        self.peer = self.ps.address
        self.worker = starwire.Runtime("worker")
        self.client = self.worker.client()
        self.sharded = self.client.sharded(0, 4, peers=[self.peer])

    def tearDown(self) -> None:
        self.sharded.close()
        self.worker.close()
        self.ps.close()

    def calls(self) -> dict[str, Callable[[Any], Any]]:
        c, p, s = self.client, self.peer, self.sharded

        def grads(ids: Any) -> npt.NDArray[np.float32]:
            return np.zeros((len(ids), 4), dtype=np.float32)

        return {
            "pull": lambda ids: c.pull(p, ids),
            "submit_pull": lambda ids: c.submit_pull(p, ids),
            "pull_rows": lambda ids: c.pull_rows(p, 0, ids, 4),
            "submit_pull_rows": lambda ids: c.submit_pull_rows(p, 0, ids, 4),
            "push_rows": lambda ids: c.push_rows(p, 0, ids, grads(ids)),
            "submit_push_rows": lambda ids: c.submit_push_rows(p, 0, ids, grads(ids)),
            "sharded.pull": lambda ids: s.pull(ids),
            "sharded.push": lambda ids: s.push(ids, grads(ids)),
            "push": lambda ids: c.push(p, [(i, np.zeros(1, np.float32)) for i in ids]),
            "submit_push": lambda ids: c.submit_push(
                p, [(i, np.zeros(1, np.float32)) for i in ids]),
        }

    def test_bad_ids_are_refused_before_anything_is_sent(self) -> None:
        for name, call in self.calls().items():
            pairs = name in ("push", "submit_push")
            for ids, why in BAD_IDS:
                if pairs and isinstance(ids, np.ndarray):
                    ids = ids.tolist()  # per-tensor pushes take (id, array) pairs
                with self.subTest(call=name, ids=ids):
                    with self.assertRaises(starwire.InvalidArgument) as cm:
                        call(ids)
                    message = str(cm.exception)
                    self.assertIn("u64 on the wire", message)
                    if not pairs:
                        self.assertIn(why, message)
        with self.assertRaises(starwire.InvalidArgument) as cm:
            self.client.push(self.peer, [(3, np.zeros(1, np.float32)),
                                         (-1, np.zeros(1, np.float32))])
        self.assertIn("items[1]'s id is -1: negative", str(cm.exception))
        # Nothing reached the PS.
        self.assertEqual(self.rec.seen, [])

    def test_integer_ids_in_range_are_taken(self) -> None:
        top = 2**64 - 1
        accepted: list[Any] = [
            [0, top],
            (5, 6),
            np.array([0, top], dtype=np.uint64),
            np.array([7, 8], dtype=np.int64),
            np.array([9], dtype=np.uint32),
            np.array([1, 2, 3, 4], dtype=np.int64)[::2],  # not contiguous: copied
            [np.int64(10), np.uint64(top)],
        ]
        for ids in accepted:
            with self.subTest(ids=ids):
                rows, missing = self.client.pull_rows(self.peer, 0, ids, 4)
                self.assertEqual(rows.shape, (len(ids), 4))
        self.assertEqual(self.rec.seen, [0, top, 5, 6, 0, top, 7, 8, 9, 1, 3, 10, top])
        # The largest id reaches a per-tensor service as it is, not wrapped.
        self.rec.seen.clear()
        self.client.pull(self.peer, [top])
        self.client.push(self.peer, [(top, np.zeros(1, np.float32))])
        self.assertEqual(self.rec.seen, [top, top])


if __name__ == "__main__":
    unittest.main()
