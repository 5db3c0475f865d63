"""Python's overhead per `pull_rows` call: the Python client against the Rust one
(`commctl bench -o pull-rows`), the same workload against the same server.

    cargo build --release -p starwire-tools -p starwire-ffi
    pip install ./ffi/python      # or STARWIRE_LIB=target/release/libstarwire_ffi.so
    python ffi/python/bench/bench_pull_rows.py --commctl target/release/commctl

One `commctl serve` (rows of 16 float32, 64 bytes; every row of the id range created
before the first round) answers both clients; each is a
`Runtime` with one `Handle`-driven client, one request in flight, `k` rows per request of
ids drawn as `commctl bench` draws them (splitmix64 of a counter, modulo 100,000). The two
take turns, `--rounds` times per `k`; a cell is the median over rounds of each round's
latency (p50 and mean, from submitting a request to taking its answer). The Python client
pulls into one preallocated ``[k, 16]`` array, as a trainer does. Python's overhead is the
Python median minus the Rust median of the same `k`; if it is per call, not per row, it
does not grow with `k`.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

import ctypes as C

import numpy as np

import starwire
from starwire import _lib

ID_RANGE = 100_000


def row_ids(start: int, n: int) -> np.ndarray:
    """`commctl bench`'s row ids `start .. start + n` (tools/src/bench.rs, `row_id`)."""
    z = np.arange(start, start + n, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = z + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    out: np.ndarray = (z ^ (z >> np.uint64(31))) % np.uint64(ID_RANGE)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rust_round(commctl: str, addr: str, k: int, seconds: float) -> tuple[float, float, int]:
    """`commctl bench` once: p50 and mean latency in µs, and requests."""
    out = subprocess.run(
        [commctl, "bench", addr, "-o", "pull-rows", "-k", str(k), "--row-bytes", "64",
         "-p", "1", "-d", f"{int(seconds * 1000)}ms", "--json"],
        check=True, capture_output=True, text=True).stdout
    report = json.loads(out)
    lat = report["latency_ms"]
    return lat["p50"] * 1e3, lat["mean"] * 1e3, int(report["ok"])


def python_round(client: starwire.Client, addr: str, k: int,
                 seconds: float) -> tuple[tuple[float, float, int], float]:
    """The Python client for `seconds`: p50 and mean latency in µs, and requests; and the
    median over pairs of calls of `pull_rows` less the same request made with the bare
    ctypes call (``sw_client_pull_rows_wait``, the one foreign call `pull_rows` makes), the
    two alternating call by call so that both meet the same load."""
    out = np.empty((k, 16), dtype=np.float32)
    # The ids of the next 100,000 rows, drawn up front (commctl draws them per request
    # in Rust; drawing them is not what is measured).
    ids = row_ids(0, max(100_000 // k, 1) * k).reshape(-1, k)
    dims = (C.c_uint64 * 1)(16)
    rows = _lib.Rows(1, 10, C.addressof(dims), 1, 0, k, int(out.ctypes.data), out.nbytes)
    rows_ref = C.byref(rows)
    missing, count = (C.c_uint32 * k)(), C.c_size_t()
    count_ref = C.byref(count)
    handle, peer = client._handle(), addr.encode()
    times, bare = [], []
    pull, clock, call = client.pull_rows, time.perf_counter_ns, _lib.client_pull_rows_wait
    end = time.monotonic() + seconds
    i = 0
    while time.monotonic() < end:
        # Successive batches, so that neither form meets rows the other just touched.
        batch, other = ids[(2 * i) % len(ids)], ids[(2 * i + 1) % len(ids)]
        t0 = clock()
        pull(addr, 1, batch, 16, out=out)
        t1 = clock()
        rows.ids = other.ctypes.data
        t2 = clock()
        call(handle, peer, rows_ref, 5000, missing, count_ref)
        t3 = clock()
        times.append(t1 - t0)
        bare.append(t3 - t2)
        i += 1
    us = np.array(times, dtype=np.float64) / 1e3
    wrapper = float(np.median(us - np.array(bare, dtype=np.float64) / 1e3))
    return (float(np.median(us)), float(us.mean()), len(times)), wrapper


def outside_call(client: starwire.Client, addr: str, k: int, calls: int) -> float:
    """Median µs per `pull_rows` call spent outside its foreign call
    (``sw_client_pull_rows_wait``): the Python layer, not the C ABI nor the round trip.
    Measured by timing the foreign call from a wrapper around it (which adds its own
    ~0.2 µs)."""
    waits: list[int] = []
    real_call, clock = starwire.client._pull_rows_wait, time.perf_counter_ns

    def timed_call(*a: object) -> int:
        t0 = clock()
        r = real_call(*a)
        waits.append(clock() - t0)
        return int(r)

    out = np.empty((k, 16), dtype=np.float32)
    ids = row_ids(0, max(100_000 // k, 1) * k).reshape(-1, k)
    totals = []
    starwire.client._pull_rows_wait = timed_call
    try:
        for i in range(calls):
            t0 = clock()
            client.pull_rows(addr, 1, ids[i % len(ids)], 16, out=out)
            totals.append(clock() - t0)
    finally:
        starwire.client._pull_rows_wait = real_call
    return float(np.median(np.array(totals) - np.array(waits))) / 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--commctl", default="target/release/commctl")
    ap.add_argument("--rows", default="1,100,1000", help="rows per request, comma list")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=2.0, help="per round and client")
    ap.add_argument("--json", action="store_true", help="print the table as JSON too")
    ap.add_argument("--taskset", default="0",
                    help="CPUs of the server (taskset -c; '' to not pin); the clients run "
                         "on the others")
    args = ap.parse_args()
    port = free_port()
    addr = f"127.0.0.1:{port}"
    pin = ["taskset", "-c", args.taskset] if args.taskset else []
    if args.taskset:
        cpus = os.sched_getaffinity(0) - {int(c) for c in args.taskset.split(",")}
        if cpus:
            os.sched_setaffinity(0, cpus)
    server = subprocess.Popen([*pin, args.commctl, "serve", "--listen", addr, "--dim", "16"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with starwire.Runtime("worker", NETWORK_WORKER_CORE_NUMBER=1) as rt:
            client = rt.client()
            deadline = time.monotonic() + 10
            while True:
                try:
                    client.ping(addr)
                    break
                except starwire.StarwireError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
            # Every row of the id range once, so that no client pays for creating rows.
            for start in range(0, ID_RANGE, 10_000):
                client.pull_rows(addr, 1, np.arange(start, start + 10_000, dtype=np.uint64), 16)
            print(f"starwire {starwire.version()} ({starwire.library_path()}), "
                  f"server {addr}, {args.rounds} rounds x {args.seconds} s per client and k, "
                  f"1 request in flight, 64-byte rows; pid {os.getpid()}")
            rows = []
            for k in [int(x) for x in args.rows.split(",")]:
                rust: list[tuple[float, float, int]] = []
                py: list[tuple[float, float, int]] = []
                wrappers: list[float] = []
                for _ in range(args.rounds):
                    rust.append(rust_round(args.commctl, addr, k, args.seconds))
                    got, wrapper = python_round(client, addr, k, args.seconds)
                    py.append(got)
                    wrappers.append(wrapper)
                med = {name: (statistics.median(r[0] for r in runs),
                              statistics.median(r[1] for r in runs),
                              sum(r[2] for r in runs))
                       for name, runs in (("rust", rust), ("python", py))}
                row = {"k": k, "rust_p50_us": med["rust"][0], "python_p50_us": med["python"][0],
                       "overhead_p50_us": med["python"][0] - med["rust"][0],
                       "rust_mean_us": med["rust"][1], "python_mean_us": med["python"][1],
                       "overhead_mean_us": med["python"][1] - med["rust"][1],
                       "wrapper_us": statistics.median(wrappers),
                       "outside_call_us": outside_call(client, addr, k, 5000),
                       "rust_requests": med["rust"][2], "python_requests": med["python"][2],
                       "rust_p50_rounds": [round(r[0], 1) for r in rust],
                       "python_p50_rounds": [round(r[0], 1) for r in py]}
                rows.append(row)
                print(f"k={k:5}: p50 Rust {row['rust_p50_us']:7.1f} us, Python "
                      f"{row['python_p50_us']:7.1f} us, overhead {row['overhead_p50_us']:+6.1f} "
                      f"us; mean Rust {row['rust_mean_us']:7.1f}, Python "
                      f"{row['python_mean_us']:7.1f}, overhead {row['overhead_mean_us']:+6.1f} us;"
                      f" pull_rows less the bare C call {row['wrapper_us']:+5.1f} us;"
                      f" Python outside the C call {row['outside_call_us']:.1f} us"
                      f"  (p50 per round: Rust {row['rust_p50_rounds']}, Python "
                      f"{row['python_p50_rounds']})", flush=True)
            if args.json:
                print(json.dumps(rows))
    finally:
        server.terminate()
        server.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
