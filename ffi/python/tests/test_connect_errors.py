"""A peer that cannot be reached, or that goes away, over real sockets: the exception's
class, its message, the peer's task (`task`) and the operating system's reason (`errno`,
`strerror`)."""

from __future__ import annotations

import errno
import os
import socket
import time
import unittest

import numpy as np

import starwire


def free_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def worker(ps_ports: list[int], **settings: int) -> starwire.Runtime:
    """A worker whose cluster has ps:i at 127.0.0.1:ps_ports[i]."""
    cluster = {"ps": [f"10.9.9.{i + 1}:2222" for i in range(len(ps_ports))],
               "worker": ["10.9.9.100:2222"]}
    endpoints = "".join(f"10.9.9.{i + 1}:2222=127.0.0.1:{p}\n" for i, p in enumerate(ps_ports))
    endpoints += "10.9.9.100:2222=127.0.0.1:1\n"
    return starwire.Runtime("worker", cluster=cluster, endpoint_map=endpoints,
                            settings={"NETWORK_WORKER_CORE_NUMBER": 1, **settings})


class ConnectErrorsTest(unittest.TestCase):
    def test_a_closed_port_names_the_task_the_attempts_and_the_refusal(self) -> None:
        port = free_port()
        with worker([free_port(), port], STARWIRE_CONNECT_RETRIES=2,
                    STARWIRE_CONNECT_BACKOFF_MS=1) as w:
            self.assertEqual(w.peer("ps:1"), f"127.0.0.1:{port}")
            with self.assertRaises(starwire.ConnectFailed) as caught:
                w.client().ping("ps:1", timeout=None)
        e = caught.exception
        self.assertIsInstance(e, ConnectionError)
        self.assertEqual(e.code, 7)
        self.assertEqual(e.task, "ps:1")
        self.assertEqual(e.errno, errno.ECONNREFUSED)
        self.assertEqual(e.strerror, os.strerror(errno.ECONNREFUSED))
        text = str(e)
        self.assertTrue(text.startswith(
            f"could not connect to ps:1 (127.0.0.1:{port}) after 3 attempts over "), text)
        self.assertTrue(text.endswith(": connection refused"), text)

    def test_an_address_no_task_has_keeps_the_address(self) -> None:
        port = free_port()
        with worker([free_port()], STARWIRE_CONNECT_RETRIES=0) as w:
            with self.assertRaises(starwire.ConnectFailed) as caught:
                w.client().ping(f"127.0.0.1:{port}", timeout=None)
        e = caught.exception
        self.assertIsNone(e.task)
        self.assertEqual(e.errno, errno.ECONNREFUSED)
        self.assertEqual(str(e), f"could not connect to 127.0.0.1:{port} after 1 attempt: "
                                 "connection refused")

    def test_a_timeout_while_retrying_says_so_and_names_the_refusal(self) -> None:
        port = free_port()
        # The first attempt is refused, the next waits 60 s.
        with worker([port], STARWIRE_CONNECT_RETRIES=1000,
                    STARWIRE_CONNECT_BACKOFF_MS=60000) as w:
            c = w.client()
            first = c.submit_ping("ps:0", timeout=None)
            start = time.monotonic()
            while True:
                m = w.metrics().client(f"127.0.0.1:{port}")
                if m is not None and m.reconnects > 0:
                    break
                self.assertLess(time.monotonic() - start, 30, "no attempt failed")
                time.sleep(0.001)
            with self.assertRaises(starwire.Timeout) as caught:
                c.ping("ps:0", timeout=0.05)
            self.assertFalse(first.done())
        e = caught.exception
        self.assertIsInstance(e, TimeoutError)
        self.assertEqual((e.task, e.errno), ("ps:0", errno.ECONNREFUSED))
        self.assertEqual(str(e), f"deadline exceeded while connecting to ps:0 "
                                 f"(127.0.0.1:{port}): connection refused (attempt 1)")

    def test_a_lost_connection_names_the_task_its_handshake_gave(self) -> None:
        ps = starwire.Runtime("ps", 1, listen="127.0.0.1:0", NETWORK_PS_CORE_NUMBER=1)
        address = ps.address
        with starwire.Runtime("worker", STARWIRE_CONNECT_RETRIES=0) as w:
            c = w.client()
            # By address: the handshake says it is ps:1.
            waiting = c.submit_recv(address, 1, "never published", timeout=30)
            self.assertGreater(c.ping(address), 0)
            ps.close()
            with self.assertRaises(starwire.ConnectionLost) as caught:
                waiting.wait()
        e = caught.exception
        self.assertEqual(e.task, "ps:1")
        self.assertTrue(str(e).startswith(f"connection to ps:1 ({address}) lost"), str(e))

    def test_a_sharded_step_names_the_dead_ps(self) -> None:
        ps0 = starwire.Runtime("ps", 0, listen="127.0.0.1:0", NETWORK_PS_CORE_NUMBER=1,
                               tables={7: starwire.MemTable(4)})
        dead = free_port()
        try:
            with worker([ps0.port, dead], STARWIRE_CONNECT_RETRIES=1,
                        STARWIRE_CONNECT_BACKOFF_MS=1) as w:
                sharded = w.client().sharded(7, 4)
                self.assertEqual(sharded.peers, [ps0.address, f"127.0.0.1:{dead}"])
                with self.assertRaises(starwire.ConnectFailed) as caught:
                    sharded.pull(np.arange(8, dtype=np.uint64), timeout=None)
        finally:
            ps0.close()
        e = caught.exception
        self.assertEqual((e.task, e.errno), ("ps:1", errno.ECONNREFUSED))
        self.assertIn(f"could not connect to ps:1 (127.0.0.1:{dead})", str(e))
        report = e.report
        self.assertIsNone(report.parts[0])
        self.assertIs(report.parts[1], e)


if __name__ == "__main__":
    unittest.main()
