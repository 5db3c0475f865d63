"""Checkpoints from Python: a PS saves its tables into its checkpoint directory when a client
asks (blocking or submitted, from a client of the runtime's loops or an embedded one), and a
PS started from that directory with `PsTable.load` serves the same rows; refusals raise
`RemoteError` with the PS's words; a peer's stats carry its tables; a table the PS refuses
says why."""

from __future__ import annotations

import json
import os
import tempfile
import unittest
from typing import Any

import numpy as np

import starwire

DIM = 4
SETTINGS: dict[str, Any] = dict(table_id=1, init="uniform", scale=0.5, seed=3, optimizer="sgd",
                                lr=1.0)


class CheckpointTest(unittest.TestCase):
    def setUp(self) -> None:
        self.dir = tempfile.TemporaryDirectory()
        self.path = self.dir.name

    def tearDown(self) -> None:
        self.dir.cleanup()

    def test_a_ps_saved_on_request_restarts_from_its_directory(self) -> None:
        ids = np.array([1, 2, 3, 500], dtype=np.uint64)
        table = starwire.PsTable(DIM, **SETTINGS)
        with starwire.Runtime("ps", listen="127.0.0.1:0", tables={1: table},
                              checkpoint_dir=self.path) as ps, \
                starwire.Runtime("worker") as worker:
            client = worker.client()
            client.push_rows(ps.address, 1, ids[:2], np.full((2, DIM), 0.25, np.float32))
            before, missing = client.pull_rows(ps.address, 1, ids, DIM)
            self.assertEqual(missing.size, 0)

            manifest = client.checkpoint(ps.address)
            self.assertEqual(manifest["format"], "starwire-checkpoint")
            self.assertEqual(manifest["task"], "ps:0")
            self.assertEqual(manifest["dir"], self.path)
            [entry] = manifest["tables"]
            self.assertEqual(entry["table"], 1)
            self.assertEqual(entry["file"], starwire.checkpoint_file(1))
            self.assertEqual(entry["rows"], 4)
            # On disk: the table's file, and the manifest the PS answered with.
            file = os.path.join(self.path, entry["file"])
            self.assertEqual(os.path.getsize(file), entry["bytes"])
            with open(os.path.join(self.path, "checkpoint.json"), encoding="utf-8") as f:
                self.assertEqual(json.load(f), manifest)

        # A new PS from the directory: the rows as they were served.
        loaded = starwire.PsTable.load(self.path, DIM, **SETTINGS)
        self.assertEqual(len(loaded), 4)
        with starwire.Runtime("ps", listen="127.0.0.1:0", tables={1: loaded},
                              checkpoint_dir=self.path) as ps, \
                starwire.Runtime("worker") as worker:
            after, missing = worker.client().pull_rows(ps.address, 1, ids, DIM)
            self.assertEqual(missing.size, 0)
            np.testing.assert_array_equal(after, before)

    def test_submitted_and_embedded_checkpoints(self) -> None:
        table = starwire.PsTable(DIM, **SETTINGS)
        with starwire.Runtime("ps", listen="127.0.0.1:0", tables={1: table},
                              STARWIRE_CHECKPOINT_DIR=self.path) as ps, \
                starwire.Runtime("worker") as worker:
            client = worker.client()
            client.pull_rows(ps.address, 1, [7, 8], DIM)
            pending = client.submit_checkpoint(ps.address, timeout=60)
            self.assertEqual(pending.wait()["tables"][0]["rows"], 2)
            embedded = worker.embedded_client()
            embedded.pull_rows(ps.address, 1, [9], DIM)
            self.assertEqual(embedded.checkpoint(ps.address)["tables"][0]["rows"], 3)
            self.assertEqual(
                embedded.submit_checkpoint(ps.address).wait()["tables"][0]["rows"], 3)
            embedded.close()
            self.assertTrue(os.path.exists(os.path.join(self.path, "table-1.swrows")))

    def test_a_ps_without_a_directory_refuses_with_its_words(self) -> None:
        table = starwire.PsTable(DIM, **SETTINGS)
        with starwire.Runtime("ps", listen="127.0.0.1:0", tables={1: table},
                              use_env=False) as ps, \
                starwire.Runtime("worker") as worker:
            with self.assertRaises(starwire.RemoteError) as e:
                worker.client().checkpoint(ps.address)
            self.assertEqual(e.exception.status, starwire.UNIMPLEMENTED)
            self.assertIn("no checkpoint directory (STARWIRE_CHECKPOINT_DIR)",
                          e.exception.remote_message)
            with self.assertRaises(starwire.RemoteError):
                worker.client().submit_checkpoint(ps.address).wait()
        # The keyword and the setting are one: giving both is refused.
        with self.assertRaises(starwire.InvalidArgument):
            starwire.Runtime("ps", checkpoint_dir=self.path,
                             STARWIRE_CHECKPOINT_DIR=self.path)
        with self.assertRaises(starwire.ConfigError):
            starwire.Runtime("ps", STARWIRE_TABLE_UPKEEP_MS=1)

    def test_a_failed_save_names_the_directory(self) -> None:
        blocked = os.path.join(self.path, "a-file")
        with open(blocked, "w", encoding="utf-8"):
            pass
        table = starwire.PsTable(DIM, **SETTINGS)
        with starwire.Runtime("ps", listen="127.0.0.1:0", tables={1: table},
                              checkpoint_dir=blocked) as ps, \
                starwire.Runtime("worker") as worker:
            with self.assertRaises(starwire.RemoteError) as e:
                worker.client().checkpoint(ps.address)
            self.assertEqual(e.exception.status, starwire.INTERNAL)
            self.assertIn(f"checkpoint directory {blocked}", e.exception.remote_message)

    def test_stats_carry_the_tables_and_refused_tables_say_why(self) -> None:
        table = starwire.PsTable(DIM, hot_sample_every=1, **SETTINGS)
        with starwire.Runtime("ps", listen="127.0.0.1:0", tables={1: table}) as ps, \
                starwire.Runtime("worker") as worker:
            client = worker.client()
            client.pull_rows(ps.address, 1, [5, 5, 6], DIM)
            client.push_rows(ps.address, 1, [5], np.ones((1, DIM), np.float32))
            remote = starwire.remote_stats(client, ps.address)
            m = remote.tables[1]
            self.assertEqual((m.rows, m.pulled_rows, m.pushed_rows, m.created), (2, 3, 1, 2))
            self.assertEqual(m.hot[0].id, 5)
            self.assertEqual(ps.metrics().tables[1].rows, 2)
            self.assertEqual(worker.metrics().tables, {})

            # Refused by the PS, with its reason: submitted pulls and pushes, and a
            # sharded step's part.
            with self.assertRaises(starwire.RemoteError) as e:
                client.submit_pull_rows(ps.address, 9, [1], DIM).wait()
            self.assertEqual(e.exception.status, starwire.NOT_FOUND)
            self.assertIn("no table 9 on this task (this task serves table 1)",
                          e.exception.remote_message)
            with self.assertRaises(starwire.RemoteError) as e:
                client.push_rows(ps.address, 1, [1], np.ones((1, DIM + 1), np.float32))
            self.assertEqual(e.exception.status, starwire.INVALID_ARGUMENT)
            self.assertIn("table 1 holds f32 [4] rows", e.exception.remote_message)
            sharded = client.sharded(1, DIM + 2, peers=[ps.address])
            with self.assertRaises(starwire.RemoteError) as e:
                sharded.pull([1, 2])
            self.assertIn("table 1 holds f32 [4] rows; the request asked for f32 [6]",
                          e.exception.remote_message)
            part = e.exception.report.parts[0]
            assert isinstance(part, starwire.RemoteError)
            self.assertIn("table 1 holds f32 [4] rows", part.remote_message)
            sharded.close()


if __name__ == "__main__":
    unittest.main()
