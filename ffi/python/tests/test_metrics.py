"""Per-peer metrics from Python: a runtime's own, and a peer's through a stats request."""

from __future__ import annotations

import json
import os
import tempfile
import unittest

import starwire
from starwire.metrics import Metrics


class MetricsTest(unittest.TestCase):
    def test_a_worker_and_a_ps_count_the_same_pings(self) -> None:
        with starwire.Runtime("ps", listen="127.0.0.1:0", NETWORK_PS_CORE_NUMBER=1) as ps, \
                starwire.Runtime("worker", NETWORK_WORKER_CORE_NUMBER=1) as worker:
            client = worker.client()
            for _ in range(4):
                client.ping(ps.address, payload=8)
            m = worker.metrics()
            self.assertIsInstance(m, Metrics)
            self.assertEqual(m.task, "worker:0")
            peer = m.client(ps.address)
            assert peer is not None
            self.assertEqual(peer.task, "ps:0")
            ping = peer.ops["ping"]
            self.assertEqual((ping.requests, ping.ok, ping.in_flight), (4, 4, 0))
            self.assertEqual(ping.latency.count, 4)
            lat = ping.latency
            self.assertTrue(0 < lat.p50_ns <= lat.p99_ns <= lat.max_ns)
            self.assertEqual(sum(c for _, c in lat.buckets), 4)
            # The PS's document, asked over the wire, names the worker.
            remote = starwire.remote_stats(client, ps.address)
            self.assertEqual(remote.task, "ps:0")
            self.assertTrue(any(p.role == "server" and p.task == "worker:0"
                                for p in remote.peers))

    def test_a_disabled_endpoint_refuses(self) -> None:
        with starwire.Runtime("ps", listen="127.0.0.1:0", STARWIRE_STATS_ENDPOINT=0) as ps, \
                starwire.Runtime("worker") as worker:
            with self.assertRaises(starwire.RemoteError):
                starwire.remote_stats(worker.client(), ps.address)

    def test_a_trace_holds_one_slice_per_request_with_its_phases(self) -> None:
        with starwire.Runtime("ps", listen="127.0.0.1:0") as ps, \
                starwire.Runtime("worker", STARWIRE_TRACE=1) as worker:
            client = worker.client()
            for _ in range(5):
                client.ping(ps.address, payload=8)
            with tempfile.TemporaryDirectory() as d:
                path = os.path.join(d, "trace.json")
                worker.write_trace(path)
                with open(path, encoding="utf-8") as f:
                    doc = json.load(f)
            pings = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e["name"] == "ping"]
            self.assertEqual(len(pings), 5)
            phases = {e["name"] for e in doc["traceEvents"] if e.get("ph") == "X"}
            self.assertTrue({"queued", "delivering"} <= phases, phases)
            # The records were taken: the next document holds no requests.
            again = json.loads(worker.trace_json())
            self.assertFalse([e for e in again["traceEvents"] if e.get("ph") == "X"])

    def test_without_tracing_the_trace_is_empty(self) -> None:
        with starwire.Runtime("ps", listen="127.0.0.1:0") as ps, \
                starwire.Runtime("worker", STARWIRE_TRACE=0) as worker:
            worker.client().ping(ps.address, payload=8)
            doc = json.loads(worker.trace_json())
            self.assertFalse([e for e in doc["traceEvents"] if e.get("ph") == "X"])


if __name__ == "__main__":
    unittest.main()
