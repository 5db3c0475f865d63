"""Python's overhead per `pull_rows` call above the Rust client, the same request on the same
client, connection and server, measured in one process.

    cargo build --release -p starwire-tools -p starwire-ffi
    pip install ./ffi/python      # or STARWIRE_LIB=target/release/libstarwire_ffi.so
    python ffi/python/bench/bench_pull_rows.py --commctl target/release/commctl

One `commctl serve` (rows of 16 float32, 64 bytes; every row of the id range created before
the first round) answers one `Runtime` (one loop) and one client of it, 1 request in flight,
`k` rows per request of ids drawn as `commctl bench` draws them (splitmix64 of a counter,
modulo 100,000). Four forms of the same pull take turns, call by call, in a random order per
turn, each with the next batch of ids:

- **Python**: `Client.pull_rows(..., out=out)` into one preallocated ``[k, 16]`` array, as a
  trainer does; timed in Python around the call.
- **ctypes**: the one foreign call `pull_rows` makes (``sw_client_pull_rows_wait``, with the
  very arguments it passes), made from Python; timed in Python around the call.
- **C**: ``sw_client_pull_rows_wait`` made from inside the library
  (``sw_bench_pull_rows(SW_BENCH_PULL_C)``), timed there.
- **Rust**: the Rust client's own pull, ``pull_rows`` + ``wait_tag`` + ``recycle`` on the
  `Handle` (or `Embedded`) as a Rust program (and `commctl bench`) makes it
  (``sw_bench_pull_rows(SW_BENCH_PULL_RUST)``), timed inside the library, from before the
  submit to after the recycle.

Taking turns call by call puts every form under the same load, the same loop thread and the
same waits; the random order keeps any form from always following the same other. A figure
is the median over all turns of the paired difference (Python − Rust: the overhead; C − Rust:
the C ABI's share; ctypes − C: calling it through ctypes; Python − ctypes: the package's own
code), with a distribution-free 95% interval of that median; the p50 of each form is given
too. `--rounds` repeats the whole set of `k` that many times, `--seconds` per `k` each
time, so that a drift of the machine falls on every `k`.

`--clients` picks the kinds of client measured, each with its own connection, taking turns
round by round: ``handle`` (`Runtime.client`: the runtime's loop thread moves the requests,
the calling thread waits, spinning briefly and then parking), ``embedded``
(`Runtime.embedded_client`: the calling thread runs the client's own loop, spinning
`STARWIRE_SPIN_US` and then sleeping in the kernel) and ``polling`` (an embedded client with
``WORKER_ENABLE_POLLING``: the calling thread busy-polls through every wait);
``embedded:N`` is an embedded client with ``STARWIRE_SPIN_US=N``. The Rust and C
forms use the same client as the Python ones, so each kind is compared with the Rust client
of that kind.

`--cross-process` adds the earlier comparison: rounds of `commctl bench -o pull-rows -p 1`
(the Rust client in a process of its own) alternating with rounds of the Python client, the
medians of their p50s compared. A 1,000-row round trip there is mostly waiting, and which
rounds park moves each round's p50 by tens of µs: it cannot resolve a few µs, and
`commctl bench` times from after the submit to before the recycle.
"""

from __future__ import annotations

import argparse
import ctypes as C
import json
import math
import os
import socket
import statistics
import subprocess
import sys
import time
from typing import Any, Callable

import numpy as np
import numpy.typing as npt

import starwire
import starwire.client
from starwire import _lib
from starwire.errors import from_code

ID_RANGE = 100_000
FORMS = ("python", "ctypes", "c", "rust")
#: The paired differences reported: (name, form, less form).
DIFFS = (("python_minus_rust", "python", "rust"), ("c_minus_rust", "c", "rust"),
         ("ctypes_minus_c", "ctypes", "c"), ("python_minus_ctypes", "python", "ctypes"))


def row_ids(start: int, n: int) -> npt.NDArray[np.uint64]:
    """`commctl bench`'s row ids `start .. start + n` (tools/src/bench.rs, `row_id`)."""
    z = np.arange(start, start + n, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = z + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    out: npt.NDArray[np.uint64] = (z ^ (z >> np.uint64(31))) % np.uint64(ID_RANGE)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def median_interval(x: npt.NDArray[np.float64]) -> tuple[float, float, float]:
    """The median of `x` and a distribution-free 95% interval of it (order statistics)."""
    s = np.sort(x)
    n = len(s)
    half = 1.96 * math.sqrt(n) / 2
    lo, hi = max(int(n / 2 - half), 0), min(int(math.ceil(n / 2 + half)), n - 1)
    return float(np.median(s)), float(s[lo]), float(s[hi])


def make_client(rt: starwire.Runtime, kind: str) -> starwire.Client:
    """A client of `kind` (see `--clients`)."""
    if kind == "handle":
        return rt.client()
    if kind == "embedded":
        return rt.embedded_client()
    if kind.startswith("embedded:"):
        return rt.embedded_client(STARWIRE_SPIN_US=int(kind.split(":", 1)[1]))
    if kind == "polling":
        return rt.embedded_client(WORKER_ENABLE_POLLING=True)
    raise SystemExit(f"--clients: {kind!r} is not handle, embedded, embedded:SPIN_US or "
                     "polling")


def in_process(client: starwire.Client, addr: str, k: int, seconds: float,
               rng: np.random.Generator) -> dict[str, list[float]]:
    """The four forms taking turns for `seconds`: per form, its latencies in µs (turn by
    turn, so that the lists pair up)."""
    out = np.empty((k, 16), dtype=np.float32)
    ids = row_ids(0, max(ID_RANGE // k, len(FORMS)) * k).reshape(-1, k)
    # Python's call first, so that the next ones find its plan (the `ctypes` form passes
    # the plan's own arguments, as `pull_rows` does).
    client.pull_rows(addr, 1, ids[0], 16, out=out)
    plan = next(p for p in client._plans.values() if p.shape == (k, 16))
    handle, peer = client._handle(), plan.peer
    # The `ctypes`, `c` and `rust` forms pull into a buffer of their own, through a request
    # of their own (the same table, dtype, row shape and number of ids).
    theirs = np.empty((k, 16), dtype=np.float32)
    rows = _lib.Rows(1, 10, C.addressof(plan.dims), 1, 0, k, int(theirs.ctypes.data),
                     theirs.nbytes)
    rows_ref = C.byref(rows)
    missing = (C.c_uint32 * k)()
    count = C.c_size_t()
    count_ref = C.byref(count)
    latency = (C.c_uint64 * 1)()
    call = starwire.client._pull_rows_wait
    bench, clock = _lib.bench_pull_rows, time.perf_counter_ns
    pull = client.pull_rows
    got: dict[str, list[float]] = {f: [] for f in FORMS}
    end = time.monotonic() + seconds
    turn = 0
    while time.monotonic() < end:
        for f in rng.permutation(len(FORMS)):
            form = FORMS[f]
            batch = ids[(len(FORMS) * turn + f) % len(ids)]
            if form == "python":
                t0 = clock()
                pull(addr, 1, batch, 16, out=out)
                got[form].append((clock() - t0) / 1e3)
                continue
            rows.ids = batch.ctypes.data
            if form == "ctypes":
                t0 = clock()
                code = call(handle, peer, rows_ref, plan.ms, missing, count_ref)
                got[form].append((clock() - t0) / 1e3)
            else:
                how = _lib.BENCH_PULL_C if form == "c" else _lib.BENCH_PULL_RUST
                code = bench(handle, peer, rows_ref, 5000, how, 1, latency)
                got[form].append(latency[0] / 1e3)
            if code:
                raise from_code(code)
        turn += 1
    return got


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
                 seconds: float) -> tuple[float, float, int]:
    """The Python client alone for `seconds`: p50 and mean latency in µs, and requests."""
    out = np.empty((k, 16), dtype=np.float32)
    ids = row_ids(0, max(ID_RANGE // k, 1) * k).reshape(-1, k)
    times: list[int] = []
    pull, clock = client.pull_rows, time.perf_counter_ns
    end = time.monotonic() + seconds
    i = 0
    while time.monotonic() < end:
        t0 = clock()
        pull(addr, 1, ids[i % len(ids)], 16, out=out)
        times.append(clock() - t0)
        i += 1
    us = np.array(times, dtype=np.float64) / 1e3
    return float(np.median(us)), float(us.mean()), len(times)


def cross_process(client: starwire.Client, args: argparse.Namespace, addr: str,
                  k: int) -> dict[str, Any]:
    rust: list[tuple[float, float, int]] = []
    py: list[tuple[float, float, int]] = []
    for _ in range(args.rounds):
        rust.append(rust_round(args.commctl, addr, k, args.seconds))
        py.append(python_round(client, addr, k, args.seconds))
    med: Callable[[list[tuple[float, float, int]], int], float] = (
        lambda runs, i: statistics.median(r[i] for r in runs))
    return {"rust_p50_us": med(rust, 0), "python_p50_us": med(py, 0),
            "overhead_p50_us": med(py, 0) - med(rust, 0),
            "rust_p50_rounds": [round(r[0], 1) for r in rust],
            "python_p50_rounds": [round(r[0], 1) for r in py]}


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--commctl", default="target/release/commctl")
    ap.add_argument("--rows", default="1,100,1000", help="rows per request, comma list")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=2.0, help="per round and k")
    ap.add_argument("--cross-process", action="store_true",
                    help="also rounds of `commctl bench` against rounds of the Python client")
    ap.add_argument("--clients", default="handle",
                    help="kinds of client, comma list of handle, embedded, embedded:SPIN_US "
                         "(its STARWIRE_SPIN_US), polling")
    ap.add_argument("--seed", type=int, default=1, help="of the order of the forms")
    ap.add_argument("--json", action="store_true", help="print the table as JSON too")
    ap.add_argument("--taskset", default="0",
                    help="CPUs of the server (taskset -c; '' to not pin); the client runs "
                         "on the others")
    args = ap.parse_args()
    sizes = [int(x) for x in args.rows.split(",")]
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
            kinds = args.clients.split(",")
            clients = {kind: make_client(rt, kind) for kind in kinds}
            client = clients[kinds[0]]
            deadline = time.monotonic() + 10
            while True:
                try:
                    client.ping(addr)
                    break
                except starwire.StarwireError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
            # Every row of the id range once, so that no form pays for creating rows.
            for start in range(0, ID_RANGE, 10_000):
                client.pull_rows(addr, 1, np.arange(start, start + 10_000, dtype=np.uint64), 16)
            load = os.getloadavg()
            print(f"starwire {starwire.version()} ({starwire.library_path()}), server {addr}, "
                  f"{args.rounds} rounds x {args.seconds} s per k and client, 1 request in "
                  f"flight, 64-byte rows; load average {load[0]:.2f} {load[1]:.2f} "
                  f"{load[2]:.2f}; pid {os.getpid()}", flush=True)
            rng = np.random.default_rng(args.seed)
            pooled: dict[tuple[str, int], dict[str, list[float]]] = {
                (kind, k): {f: [] for f in FORMS} for kind in kinds for k in sizes}
            per_round: dict[tuple[str, int], list[float]] = {key: [] for key in pooled}
            for _ in range(args.rounds):
                for k in sizes:
                    for kind in kinds:
                        got = in_process(clients[kind], addr, k, args.seconds, rng)
                        for f in FORMS:
                            pooled[kind, k][f].extend(got[f])
                        per_round[kind, k].append(float(np.median(
                            np.array(got["python"]) - np.array(got["rust"]))))
            table = []
            print("in one process, the four forms taking turns call by call (µs; median of "
                  "the paired differences [95% interval]):")
            for (kind, k), forms in pooled.items():
                lat = {f: np.array(v, dtype=np.float64) for f, v in forms.items()}
                row: dict[str, Any] = {"client": kind, "k": k, "turns": len(lat["python"])}
                for f in FORMS:
                    row[f"{f}_p50_us"] = float(np.median(lat[f]))
                for name, a, b in DIFFS:
                    row[name] = median_interval(lat[a] - lat[b])
                row["python_minus_rust_rounds"] = [round(x, 1) for x in per_round[kind, k]]
                table.append(row)

                def cell(name: str, row: dict[str, Any] = row) -> str:
                    m, lo, hi = row[name]
                    return f"{m:+5.1f} [{lo:+.1f}, {hi:+.1f}]"

                print(f"{kind:8} k={k:5}: p50 Rust {row['rust_p50_us']:6.1f}, C "
                      f"{row['c_p50_us']:6.1f}, ctypes {row['ctypes_p50_us']:6.1f}, Python "
                      f"{row['python_p50_us']:6.1f}; Python - Rust "
                      f"{cell('python_minus_rust')}; C - Rust {cell('c_minus_rust')}; ctypes - "
                      f"C {cell('ctypes_minus_c')}; Python - ctypes "
                      f"{cell('python_minus_ctypes')}; {row['turns']} turns (Python - Rust per "
                      f"round: {row['python_minus_rust_rounds']})", flush=True)
            if args.cross_process:
                print("in two processes, commctl bench and the Python client taking turns "
                      "round by round (µs; median of the rounds' p50s):")
                for row in table:
                    if row["client"] != "handle":
                        continue
                    k = row["k"]
                    row["cross_process"] = x = cross_process(clients["handle"], args, addr, k)
                    print(f"k={k:5}: p50 Rust {x['rust_p50_us']:7.1f}, Python "
                          f"{x['python_p50_us']:7.1f}, overhead {x['overhead_p50_us']:+6.1f} "
                          f"(p50 per round: Rust {x['rust_p50_rounds']}, Python "
                          f"{x['python_p50_rounds']})", flush=True)
            load = os.getloadavg()
            print(f"load average at the end {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
            if args.json:
                print(json.dumps(table))
    finally:
        server.terminate()
        server.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
