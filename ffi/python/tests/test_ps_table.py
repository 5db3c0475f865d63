"""`PsTable`: served over real loopback sockets, saved and loaded, every checkpoint error
as its own exception, rows by id, metrics, upkeep, and settings checked in Python."""

from __future__ import annotations

import os
import shutil
import tempfile
import unittest
from typing import Any

import numpy as np

import starwire


class ServedTest(unittest.TestCase):
    def setUp(self) -> None:
        self.table = starwire.PsTable(8, table_id=1, init="uniform", scale=0.1, seed=3,
                                      optimizer="sgd", lr=0.5, hot_sample_every=1)
        self.on_push = starwire.PsTable(4, table_id=2, create="on_push", optimizer="adagrad",
                                        lr=1.0, initial_accumulator=1.0)
        self.ps = starwire.Runtime("ps", listen="127.0.0.1:0", NETWORK_PS_CORE_NUMBER=1,
                                   tables={1: self.table, 2: self.on_push})
        self.worker = starwire.Runtime("worker")
        self.client = self.worker.client()

    def tearDown(self) -> None:
        self.worker.close()
        self.ps.close()
        self.table.close()
        self.on_push.close()

    def test_rows_are_created_pulled_and_pushed(self) -> None:
        ids = np.array([3, 1, 4], dtype=np.uint64)
        before, missing = self.client.pull_rows(self.ps.address, 1, ids, 8)
        self.assertEqual(missing.size, 0)
        self.assertTrue(np.all(np.abs(before) <= 0.1) and np.any(before != 0))
        # What the PS holds is what was pulled.
        held, gone = self.table.export_rows(ids)
        np.testing.assert_array_equal(held, before)
        self.assertEqual(gone.size, 0)
        grads = np.arange(24, dtype=np.float32).reshape(3, 8)
        self.client.push_rows(self.ps.address, 1, ids, grads)
        after, _ = self.client.pull_rows(self.ps.address, 1, ids, 8)
        np.testing.assert_array_equal(after, before - np.float32(0.5) * grads)
        m = self.table.metrics()
        self.assertEqual((m.rows, m.pulls, m.pushes, m.pulled_rows, m.created), (3, 2, 1, 6, 3))
        self.assertEqual(sorted(h.id for h in m.hot), [1, 3, 4])
        self.assertEqual(len(self.table), 3)
        self.assertEqual(len(self.table.metrics(hot=1).hot), 1)

    def test_rows_only_a_push_creates(self) -> None:
        rows, missing = self.client.pull_rows(self.ps.address, 2, [5, 6], 4)
        np.testing.assert_array_equal(missing, [0, 1])
        np.testing.assert_array_equal(rows, 0)
        self.client.push_rows(self.ps.address, 2, [5], np.array([[3.0, 0, 0, 0]], np.float32))
        rows, missing = self.client.pull_rows(self.ps.address, 2, [5, 6], 4)
        np.testing.assert_array_equal(missing, [1])
        w = np.float32(-3.0) / np.sqrt(np.float32(10.0))
        self.assertAlmostEqual(float(rows[0, 0]), float(w), places=6)
        self.assertEqual(self.on_push.metrics().missing, 3)

    def test_a_closed_handle_leaves_the_table_served(self) -> None:
        self.table.close()
        with self.assertRaises(starwire.Closed):
            len(self.table)
        rows, missing = self.client.pull_rows(self.ps.address, 1, [9], 8)
        self.assertEqual((rows.shape, missing.size), ((1, 8), 0))

    def test_a_table_is_served_under_its_own_id(self) -> None:
        with self.assertRaisesRegex(starwire.InvalidArgument, "table_id=1 is given as table 7"):
            starwire.Runtime("ps", listen="127.0.0.1:0", tables={7: self.table})


class CheckpointTest(unittest.TestCase):
    def setUp(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="starwire-ps-table-")
        self.settings: dict[str, Any] = dict(table_id=4, optimizer="adagrad", lr=0.1,
                                             init="normal", scale=0.01, seed=9)

    def tearDown(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    def saved(self) -> str:
        with starwire.PsTable(6, **self.settings) as t:
            t.load_rows(np.arange(100), np.arange(600, dtype=np.float32).reshape(100, 6))
            t.advance_clock()
            report = t.save(self.dir)
        self.assertEqual(report.path, os.path.join(self.dir, starwire.checkpoint_file(4)))
        self.assertEqual(report.rows, 100)
        self.assertEqual(report.bytes, os.path.getsize(report.path))
        self.assertGreaterEqual(report.seconds, report.writing_seconds)
        return report.path

    def test_save_and_load(self) -> None:
        self.saved()
        t = starwire.PsTable.load(self.dir, 6, **self.settings)
        self.assertEqual((len(t), t.clock), (100, 1))
        rows, missing, state = t.export_rows([42, 1000], state=True)
        np.testing.assert_array_equal(rows[0], np.arange(252, 258, dtype=np.float32))
        np.testing.assert_array_equal(rows[1], 0)
        np.testing.assert_array_equal(missing, [1])
        np.testing.assert_allclose(state[0], 0.1)  # Adagrad's sums, untouched
        self.assertEqual(t.metrics().loaded, 100)
        t.close()

    def test_a_missing_checkpoint(self) -> None:
        with self.assertRaises(starwire.CheckpointIoError) as e:
            starwire.PsTable.load(self.dir, 6, **self.settings)
        self.assertIsInstance(e.exception, OSError)
        self.assertIn("table-4.swrows", str(e.exception))
        t = starwire.PsTable.load(self.dir, 6, missing_ok=True, **self.settings)
        self.assertEqual(len(t), 0)

    def test_every_kind_of_damage_is_its_own_error(self) -> None:
        path = self.saved()
        with open(path, "rb") as reader:
            good = reader.read()

        def load_with(data: bytes, dim: int = 6) -> starwire.CheckpointError:
            with open(path, "wb") as f:
                f.write(data)
            with self.assertRaises(starwire.CheckpointError) as e:
                starwire.PsTable.load(self.dir, dim, **self.settings)
            self.assertIn(path, str(e.exception))
            return e.exception

        def flipped(at: int) -> bytes:
            return good[:at] + bytes([good[at] ^ 0x40]) + good[at + 1:]

        self.assertIsInstance(load_with(good[:-40]), starwire.CheckpointTruncated)
        self.assertIsInstance(load_with(flipped(len(good) // 2)), starwire.CheckpointCorrupted)
        version = good[:8] + (2).to_bytes(4, "little") + good[12:]
        self.assertIsInstance(load_with(version), starwire.CheckpointVersionError)
        self.assertIsInstance(load_with(b"x" * 200), starwire.NotACheckpoint)
        shape = load_with(good, dim=3)
        self.assertIsInstance(shape, starwire.CheckpointShapeError)
        self.assertIn("dim 6 in the file, 3 in the table", str(shape))
        with open(path, "wb") as f:
            f.write(good)
        with self.assertRaises(starwire.CheckpointTableError):
            starwire.PsTable.load(self.dir, 6, max_rows=50, **self.settings)
        # Saving where no folder can be made.
        with starwire.PsTable(6, **self.settings) as t:
            with self.assertRaisesRegex(starwire.CheckpointIoError, "creating the directory"):
                t.save(os.path.join(path, "below"))


class RowsByIdTest(unittest.TestCase):
    def test_load_export_and_the_row_cap(self) -> None:
        t = starwire.PsTable(2, optimizer="adam", lr=0.01, max_rows=3)
        self.assertEqual(t.state_len, 6)
        r = t.load_rows([7, 8], [[1, 2], [3, 4]], state=np.full((2, 6), 0.5))
        self.assertEqual((r.created, r.overwritten), (2, 0))
        self.assertEqual(t.load_rows([7], [[9, 9]]).overwritten, 1)
        rows, missing, state = t.export_rows(np.array([8, 7, 9]), state=True)
        np.testing.assert_array_equal(rows, [[3, 4], [9, 9], [0, 0]])
        np.testing.assert_array_equal(missing, [2])
        np.testing.assert_array_equal(state[:2], 0.5)
        with self.assertRaisesRegex(starwire.InvalidArgument, r"rows has shape \(1, 3\)"):
            t.load_rows([1], [[1, 2, 3]])
        with self.assertRaisesRegex(starwire.TableFull, "after 1 rows"):
            t.load_rows([10, 11], np.zeros((2, 2)))
        self.assertEqual(len(t), 3)
        empty, none = t.export_rows([])
        self.assertEqual((empty.shape, none.size), ((0, 2), 0))

    def test_maintain_evicts_untouched_rows(self) -> None:
        t = starwire.PsTable(4, evict_untouched=2)
        t.load_rows(np.arange(20), np.ones((20, 4)))
        self.assertEqual(t.maintain().evicted_untouched, 0)
        for tick in (1, 2, 3):
            self.assertEqual(t.advance_clock(), tick)
        done = t.maintain()
        self.assertEqual((done.evicted_untouched, len(t)), (20, 0))
        self.assertEqual(t.metrics().evicted_untouched, 20)

    def test_the_report_line(self) -> None:
        t = starwire.PsTable(16, table_id=3, stored="bf16", optimizer="adagrad")
        line = t.report()
        self.assertTrue(line.startswith("table 3: 16 x Bf16 (served F32), adagrad"), line)
        self.assertIn("huge pages", line)
        self.assertEqual(t.dtype, np.float32)
        half = starwire.PsTable(16, stored="f16", served="f16")
        self.assertEqual(half.dtype, np.float16)


class SettingsTest(unittest.TestCase):
    def test_bad_settings_raise_naming_the_argument(self) -> None:
        cases: list[tuple[dict[str, Any], str]] = [
            (dict(dim=0), "dim 0"),
            (dict(dim=4, stored="f64"), "stored 'f64'"),
            (dict(dim=4, served="bf16"), "served as f32 or f32, not bf16"),
            (dict(dim=4, init="gaussian"), "init 'gaussian'"),
            (dict(dim=4, init="normal", scale=-1), "scale -1"),
            (dict(dim=4, optimizer="rmsprop"), "optimizer 'rmsprop'"),
            (dict(dim=4, lr=float("nan")), "lr nan"),
            (dict(dim=4, optimizer="adagrad", initial_accumulator=0), "initial_accumulator"),
            (dict(dim=4, optimizer="adam", beta1=1.0), "beta1"),
            (dict(dim=4, create="sometimes"), "create 'sometimes'"),
            (dict(dim=4, admit_after=0), "admit_after 0"),
            (dict(dim=4, evict_untouched=40000), "evict_untouched 40000"),
            (dict(dim=4, max_rows=0), "max_rows 0"),
            (dict(dim=4, consistency="strict"), "consistency 'strict'"),
            (dict(dim=4, table_id=-1), "table_id -1"),
            (dict(dim=4.5), "dim must be an int"),
        ]
        for kwargs, says in cases:
            with self.subTest(kwargs=kwargs):
                with self.assertRaisesRegex(starwire.InvalidArgument, says):
                    starwire.PsTable(**kwargs)
        with self.assertRaisesRegex(starwire.InvalidArgument, "unknown PsTable setting lrr"):
            starwire.PsTable.load("/nonexistent", 4, lrr=0.1)


if __name__ == "__main__":
    unittest.main()
