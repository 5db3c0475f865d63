"""Embedded clients (`Runtime.embedded_client`): the API and rows suites run again with a
client whose event loop runs on the calling thread, and what is particular to it: one
thread only, its own settings, the runtime's allocator, deadlines without a loop thread."""

from __future__ import annotations

import socket
import threading
import time
import unittest
from typing import Any

import numpy as np

import starwire
from test_api import ApiTest
from test_rows import RowsTest, ShardedTest
from test_zero_copy import RecordingAllocator


class EmbeddedApiTest(ApiTest):
    def setUp(self) -> None:
        super().setUp()
        self.client.close()
        self.client = self.worker.embedded_client()
        self.assertTrue(self.client.embedded)

    def test_ping_and_stats(self) -> None:
        # The runtime's loops carry none of an embedded client's requests.
        self.assertGreater(self.client.ping(self.peer), 0)
        self.assertEqual(self.worker.stats().connections_opened, 0)
        own = self.client.loop_stats()
        self.assertEqual((own.connections_opened, own.requests_completed), (1, 1))
        self.assertEqual(self.ps.stats().connections_accepted, 1)
        with self.assertRaises(starwire.InvalidArgument):
            self.worker.client().loop_stats()


class EmbeddedRowsTest(RowsTest):
    def setUp(self) -> None:
        super().setUp()
        self.client.close()
        self.client = self.worker.embedded_client()


class EmbeddedShardedTest(ShardedTest):
    def setUp(self) -> None:
        super().setUp()
        self.client.close()
        self.client = self.worker.embedded_client()
        self.sharded = self.client.sharded(7, 4)


class EmbeddedOnlyTest(unittest.TestCase):
    def setUp(self) -> None:
        self.ps = starwire.Runtime("ps", listen="127.0.0.1:0", NETWORK_PS_CORE_NUMBER=1,
                                   tables={0: starwire.MemTable(16, init="uniform", scale=1.0)})
        self.peer = self.ps.address
        self.worker = starwire.Runtime("worker", NETWORK_WORKER_CORE_NUMBER=1)

    def tearDown(self) -> None:
        self.worker.close()
        self.ps.close()

    def on_another_thread(self, f: Any) -> BaseException | None:
        caught: list[BaseException | None] = [None]

        def run() -> None:
            try:
                f()
            except BaseException as e:  # noqa: BLE001 - handed to the test thread
                caught[0] = e

        t = threading.Thread(target=run)
        t.start()
        t.join()
        return caught[0]

    def test_only_the_thread_that_made_it_may_use_it(self) -> None:
        c = self.worker.embedded_client()
        self.assertGreater(c.ping(self.peer), 0)
        e = self.on_another_thread(lambda: c.ping(self.peer))
        self.assertIsInstance(e, starwire.InvalidArgument)
        self.assertIn("thread that made it", str(e))
        e = self.on_another_thread(c.close)
        self.assertIsInstance(e, starwire.InvalidArgument)
        # Still whole for its own thread.
        rows, missing = c.pull_rows(self.peer, 0, np.arange(5, dtype=np.uint64), 16)
        self.assertEqual((rows.shape, len(missing)), ((5, 16), 0))
        c.close()
        with self.assertRaises(starwire.Closed):
            c.ping(self.peer)

    def test_runtime_closed_by_another_thread_keeps_the_client_and_its_arrays(self) -> None:
        from starwire import client as client_module
        c = self.worker.embedded_client()
        out = np.zeros((4, 16), dtype=np.float32)
        pending = c.submit_pull_rows(self.peer, 0, np.arange(4, dtype=np.uint64), 16, out=out)
        leaked = len(client_module._LEAKED)
        # Closing the runtime elsewhere cannot run this client's loop: the client is left
        # alone, the package keeps the array it may still write into, and says so.
        with self.assertWarns(ResourceWarning):
            self.assertIsNone(self.on_another_thread(self.worker.close))
        self.assertTrue(self.worker.closed)
        # The client's own arrays, then the runtime's lent arrays and hooks.
        self.assertEqual(len(client_module._LEAKED), leaked + 2)
        _, kept = client_module._LEAKED[leaked]
        self.assertTrue(any(out is k or (isinstance(k, tuple) and any(out is x for x in k))
                            for k in kept.values()), kept)
        with self.assertRaises(starwire.Closed):
            pending.wait()

    def test_a_client_dropped_without_close_is_freed(self) -> None:
        import gc
        import weakref
        c = self.worker.embedded_client()
        self.assertGreater(c.ping(self.peer), 0)
        pending = c.submit_pull_rows(self.peer, 0, np.arange(4, dtype=np.uint64), 16)
        self.assertTrue(c.wait_any([pending]) is pending)
        gone = weakref.ref(c)
        del c, pending
        gc.collect()
        self.assertIsNone(gone())
        # Its connection ends: the PS sees it go.
        deadline = time.monotonic() + 30
        while self.ps.stats().connections_lost + self.ps.stats().connections_closed < 1:
            self.assertLess(time.monotonic(), deadline, "the connection never ended")
            time.sleep(0.01)

    def test_settings_on_top_of_the_runtime_s(self) -> None:
        with self.assertRaises(starwire.ConfigError) as e:
            self.worker.embedded_client(STARWIRE_SPIN_US="soon")
        self.assertIn("STARWIRE_SPIN_US", str(e.exception))
        polling = self.worker.embedded_client(WORKER_ENABLE_POLLING=True)
        ids = np.arange(100, dtype=np.uint64)
        for _ in range(3):
            rows, _ = polling.pull_rows(self.peer, 0, ids, 16)
        plain, _ = self.worker.client().pull_rows(self.peer, 0, ids, 16)
        np.testing.assert_array_equal(rows, plain)

    def test_a_submitted_request_goes_out_before_any_wait(self) -> None:
        c = self.worker.embedded_client()
        self.assertGreater(c.ping(self.peer), 0)  # the connection is up
        ids = np.array([3], dtype=np.uint64)
        before, _ = self.worker.client().pull_rows(self.peer, 0, ids, 16)
        pending = c.submit_push_rows(self.peer, 0, ids, np.ones((1, 16), dtype=np.float32))
        # Not waited for: another client sees the update all the same.
        other = self.worker.client()
        deadline = time.monotonic() + 30
        while True:
            now, _ = other.pull_rows(self.peer, 0, ids, 16)
            if not np.array_equal(now, before):
                break
            self.assertLess(time.monotonic(), deadline, "the push never went out")
            time.sleep(0.001)
        pending.wait()

    def test_a_silent_peer_times_out(self) -> None:
        # A listener that accepts (the kernel does) and never answers.
        silent = socket.socket()
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        try:
            c = self.worker.embedded_client(STARWIRE_CONNECT_RETRIES=0)
            addr = "127.0.0.1:%d" % silent.getsockname()[1]
            with self.assertRaises(starwire.Timeout):
                c.ping(addr, timeout=0.2)
            # The client goes on with other peers.
            self.assertGreater(c.ping(self.peer), 0)
        finally:
            silent.close()

    def test_received_tensors_land_in_the_runtime_s_allocator_memory(self) -> None:
        hook = RecordingAllocator()
        with starwire.Runtime("worker", allocator=hook) as w:
            c = w.embedded_client()
            big = np.arange(1 << 18, dtype=np.float32)
            self.ps.publish("big", big)
            got = c.recv(self.peer, 1, "big")
            self.assertEqual([int(got.ctypes.data)], hook.returned)
            np.testing.assert_array_equal(got, big)


if __name__ == "__main__":
    unittest.main()
