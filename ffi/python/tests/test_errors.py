"""Every exception class, raised by what causes it over real sockets; bad arguments never
crash the process."""

from __future__ import annotations

import socket
import threading
import unittest

import numpy as np

import starwire


def free_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ErrorsTest(unittest.TestCase):
    def setUp(self) -> None:
        self.ps = starwire.Runtime("ps", listen="127.0.0.1:0", NETWORK_PS_CORE_NUMBER=1,
                                   tables={0: starwire.MemTable(8)})
        self.peer = self.ps.address
        self.worker = starwire.Runtime("worker", STARWIRE_CONNECT_RETRIES=0)
        self.client = self.worker.client()

    def tearDown(self) -> None:
        self.worker.close()
        self.ps.close()

    def test_hierarchy(self) -> None:
        for cls in (starwire.InvalidArgument, starwire.Timeout, starwire.ConnectionLost,
                    starwire.ConnectFailed, starwire.Refused, starwire.RemoteError,
                    starwire.Closed, starwire.ConfigError, starwire.Backpressure):
            self.assertTrue(issubclass(cls, starwire.StarwireError), cls)
        self.assertTrue(issubclass(starwire.InvalidArgument, ValueError))
        self.assertTrue(issubclass(starwire.Timeout, TimeoutError))
        self.assertTrue(issubclass(starwire.ConnectionLost, ConnectionError))
        self.assertTrue(issubclass(starwire.Refused, starwire.RemoteError))

    def test_invalid_argument_wrong_dtype(self) -> None:
        with self.assertRaisesRegex(starwire.InvalidArgument, "dtype"):
            self.client.push_rows(self.peer, 0, [1], np.array([["a"] * 8]))
        with self.assertRaisesRegex(starwire.InvalidArgument, "dtype"):
            self.client.pull_rows(self.peer, 0, [1], 8, dtype=np.object_)
        with self.assertRaisesRegex(starwire.InvalidArgument, "dtype"):
            self.ps.publish("k", np.array([object()]))
        with self.assertRaisesRegex(starwire.InvalidArgument, "'x': a str, not an integer"):
            self.client.pull_rows(self.peer, 0, ["x"], 8)
        self.assertEqual(self.worker.stats().requests_completed, 0)

    def test_invalid_argument_wrong_shape_or_layout(self) -> None:
        pull = self.client.pull_rows
        with self.assertRaisesRegex(starwire.InvalidArgument, "not float32"):
            pull(self.peer, 0, [1, 2], 8, out=np.empty((3, 8), dtype=np.float32))
        with self.assertRaisesRegex(starwire.InvalidArgument, "C-contiguous"):
            pull(self.peer, 0, [1, 2], 8, out=np.empty((8, 2), dtype=np.float32).T)
        with self.assertRaisesRegex(starwire.InvalidArgument, "read-only"):
            out = np.empty((2, 8), dtype=np.float32)
            out.flags.writeable = False
            pull(self.peer, 0, [1, 2], 8, out=out)
        with self.assertRaisesRegex(starwire.InvalidArgument, "1-D"):
            pull(self.peer, 0, np.array([[1], [2]], dtype=np.uint64), 8)
        with self.assertRaisesRegex(starwire.InvalidArgument, "one row per id"):
            self.client.push_rows(self.peer, 0, [1, 2], np.ones((3, 8), dtype=np.float32))
        with self.assertRaisesRegex(starwire.InvalidArgument, "C-contiguous"):
            self.client.push(self.peer, [(1, np.ones((4, 4), dtype=np.float32)[:, 1])])
        with self.assertRaisesRegex(starwire.InvalidArgument, "no ids"):
            pull(self.peer, 0, np.array([], dtype=np.uint64), 8)
        with self.assertRaisesRegex(starwire.InvalidArgument, "not an address"):
            self.client.ping("not an address")
        with self.assertRaisesRegex(starwire.InvalidArgument, "timeout"):
            self.client.ping(self.peer, timeout=-1)
        # The client still works.
        rows, missing = pull(self.peer, 0, [1, 2], 8)
        self.assertEqual((rows.shape, missing.size), ((2, 8), 0))

    def test_closed_runtime_and_client(self) -> None:
        c = self.client
        self.worker.close()
        with self.assertRaises(starwire.Closed):
            c.ping(self.peer)
        with self.assertRaises(starwire.Closed):
            self.worker.client()
        with self.assertRaises(starwire.Closed):
            self.worker.stats()
        self.worker.close()  # twice: nothing
        other = self.ps.client()
        other.close()
        with self.assertRaises(starwire.Closed):
            other.pull_rows(self.peer, 0, [1], 8)
        table = starwire.MemTable(4)
        table.close()
        with self.assertRaises(starwire.Closed):
            starwire.Runtime("ps", tables={1: table})

    def test_timeout(self) -> None:
        with self.assertRaises(starwire.Timeout) as e:
            self.client.recv(self.peer, 1, "never published", timeout=0.2)
        self.assertEqual(e.exception.code, 5)

    def test_connection_lost(self) -> None:
        ps = starwire.Runtime("ps", listen="127.0.0.1:0")
        waiting = self.client.submit_recv(ps.address, 1, "never published", timeout=30)
        self.assertGreater(self.client.ping(ps.address), 0)  # connected, the recv waiting
        ps.close()
        with self.assertRaises(starwire.ConnectionLost):
            waiting.wait()

    def test_connect_failed(self) -> None:
        with self.assertRaises(starwire.ConnectFailed) as e:
            self.client.ping(f"127.0.0.1:{free_port()}", timeout=10)
        self.assertIsInstance(e.exception, ConnectionError)

    def test_refused_handshake_says_why(self) -> None:
        with starwire.Runtime("ps", listen="127.0.0.1:0", STARWIRE_CLUSTER_ID=1) as ps:
            with self.assertRaises(starwire.Refused) as e:
                self.client.ping(ps.address, timeout=10)
        self.assertNotEqual(e.exception.status, 0)
        self.assertEqual(e.exception.status_name, "CLUSTER_MISMATCH")

    def test_remote_error_with_the_remote_message(self) -> None:
        with starwire.Runtime("ps", listen="127.0.0.1:0") as bare:
            with self.assertRaises(starwire.RemoteError) as e:
                self.client.pull(bare.address, [1])
        self.assertEqual(e.exception.status, starwire.UNIMPLEMENTED)
        self.assertEqual(e.exception.remote_message, "no pull service")
        self.assertIn("no pull service", str(e.exception))

    def test_config_error_names_the_setting(self) -> None:
        with self.assertRaisesRegex(starwire.ConfigError, "STARWIRE_CONNECT_RETRIES"):
            starwire.Runtime("worker", STARWIRE_CONNECT_RETRIES="many")

    def test_already_published(self) -> None:
        self.ps.publish("twice", np.zeros(2))
        with self.assertRaises(starwire.AlreadyPublished):
            self.ps.publish("twice", np.zeros(2))

    def test_backpressure(self) -> None:
        c = self.worker.client(capacity=2)
        waiting = [c.submit_recv(self.peer, 1, f"later/{i}", timeout=30) for i in range(2)]
        with self.assertRaises(starwire.Backpressure):
            c.submit_ping(self.peer)
        for i, w in enumerate(waiting):
            self.ps.publish(f"later/{i}", np.zeros(1))
            w.wait()
        self.assertGreater(c.ping(self.peer), 0)

    def test_errors_from_many_threads_stay_apart(self) -> None:
        # The message of a failure is per thread: each thread sees its own.
        seen: dict[int, str] = {}

        def fail(i: int) -> None:
            c = self.worker.client()
            try:
                c.ping(f"bad address {i}")
            except starwire.InvalidArgument as e:
                seen[i] = str(e)
            c.close()

        threads = [threading.Thread(target=fail, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(sorted(seen), list(range(8)))
        for i, msg in seen.items():
            self.assertIn(f"bad address {i}", msg)


if __name__ == "__main__":
    unittest.main()
