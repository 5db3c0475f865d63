#!/usr/bin/env python3
"""io_uring against epoll through commctl: per round, `commctl serve` (one loop, CPU 0) and
`commctl bench` (one loop, CPU 1) on each backend in turn, 3 s each. Prints the rate ratio
per round, and medians of: CPU per request on each end, both loops' busy / idle-awake /
parked time per request (the server's from its stats before and after, so it includes the
bench's connection set-up; the client's from the bench report) and, with --syscalls,
system calls per request on each end, counted by perf tracepoints (which slow the backend
that makes more calls: take rates from runs without it).

    cargo build --release -p starwire-tools
    python3 benches/backends.py ROUNDS conn400|inflight64|rows [--syscalls]

--syscalls needs perf and the tracepoints (mount -t tracefs nodev /sys/kernel/tracing).
"""
import json, os, subprocess, sys, time, statistics, re, signal

C = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "target", "release", "commctl")
EVENTS = ["raw_syscalls:sys_enter", "syscalls:sys_enter_io_uring_enter",
          "syscalls:sys_enter_epoll_wait", "syscalls:sys_enter_sendmsg",
          "syscalls:sys_enter_recvfrom", "syscalls:sys_enter_sched_yield",
          "syscalls:sys_enter_futex"]

def env_for(cfg):
    e = dict(os.environ)
    e["STARWIRE_BACKEND"] = cfg
    return e

def totals(addr, cfg):
    r = subprocess.run(["taskset", "-c", "1", C, "stats", addr, "--json"], capture_output=True, text=True, env=env_for(cfg))
    return json.loads(r.stdout)["totals"]

def perf_parse(path):
    out = {}
    for line in open(path):
        parts = line.strip().split(",")
        if len(parts) > 3 and parts[2].startswith(("raw_syscalls", "syscalls")):
            try:
                out[parts[2].split(":")[1]] = int(parts[0])
            except ValueError:
                pass
    return out

def one(cfg, port, bench_args, syscalls):
    addr = f"127.0.0.1:{port}"
    srv = subprocess.Popen(["taskset", "-c", "0", C, "serve", "--listen", addr, "--loops", "1"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env_for(cfg))
    srv.stdout.readline()
    t0 = totals(addr, cfg)
    perf = None
    if syscalls:
        perf = subprocess.Popen(["perf", "stat", "-x,", "-o", f"/tmp/perf-s-{cfg}", "-e", ",".join(EVENTS), "-p", str(srv.pid)])
        time.sleep(0.3)
    cmd = ["taskset", "-c", "1", C, "bench", addr, *bench_args, "--loops", "1", "-d", "3s", "--json", "--server-pid", str(srv.pid)]
    if syscalls:
        cmd = ["perf", "stat", "-x,", "-o", f"/tmp/perf-c-{cfg}", "-e", ",".join(EVENTS), "--"] + cmd
    r = subprocess.run(cmd, capture_output=True, text=True, env=env_for(cfg))
    if perf:
        perf.send_signal(signal.SIGINT); perf.wait()
    t1 = totals(addr, cfg)
    srv.send_signal(signal.SIGTERM); srv.wait()
    j = json.loads(r.stdout)
    n = j["ok"]
    res = {"rate": j["requests_per_second"], "n": n,
           "server_cpu_us": j["server_cpu_seconds"] * 1e6 / n,
           "client_cpu_us": j["client_cpu_seconds"] * 1e6 / n}
    for k in ["busy", "spin", "parked"]:
        res[f"server_{k}_us"] = (t1[f"{k}_ns"] - t0[f"{k}_ns"]) / 1e3 / n
        res[f"client_{k}_us"] = j["client_loop_time"][f"{k}_seconds"] * 1e6 / n
    res["server_parks"] = (t1["parks"] - t0["parks"]) / n
    res["client_parks"] = j["client_loop_time"]["parks"] / n
    if syscalls:
        for side in "sc":
            for k, v in perf_parse(f"/tmp/perf-{side}-{cfg}").items():
                res[f"{'server' if side == 's' else 'client'}_{k}"] = v / n
    return res

def main():
    rounds = int(sys.argv[1])
    syscalls = "--syscalls" in sys.argv
    workload = sys.argv[2]
    bench_args = {"conn400": ["-o", "ping", "-C", "400", "-p", "400"],
                  "inflight64": ["-o", "ping", "-C", "1", "-p", "64"],
                  "rows": ["-o", "pull-rows", "-k", "100", "-C", "1", "-p", "64"]}[workload]
    cfgs = ["uring", "epoll"]
    res = {c: [] for c in cfgs}
    ratios = []
    port = 27000 + (os.getpid() % 1000) * 4
    print(f"# {workload}, {rounds} rounds, {time.strftime('%H:%M:%S', time.gmtime())} UTC, load {open('/proc/loadavg').read().split()[:3]}")
    for i in range(rounds):
        order = cfgs if i % 2 == 0 else cfgs[::-1]
        rr = {}
        for c in order:
            port += 1
            rr[c] = one(c, port, bench_args, syscalls)
            res[c].append(rr[c])
        ratios.append(rr["uring"]["rate"] / rr["epoll"]["rate"])
        print(f"round {i+1}: uring {rr['uring']['rate']:.0f}/s epoll {rr['epoll']['rate']:.0f}/s ratio {ratios[-1]:.2f}", flush=True)
    print(f"ratio uring/epoll: median {statistics.median(ratios):.2f} (range {min(ratios):.2f}-{max(ratios):.2f}); uring ahead in {sum(r > 1 for r in ratios)} of {len(ratios)}")
    keys = list(res["uring"][0].keys())
    print("| figure | uring | epoll |")
    print("|---|---:|---:|")
    for k in keys:
        if k == "n":
            continue
        u = statistics.median(x.get(k, 0) for x in res["uring"])
        e = statistics.median(x.get(k, 0) for x in res["epoll"])
        print(f"| {k} | {u:.3f} | {e:.3f} |")
    print(f"# end {time.strftime('%H:%M:%S', time.gmtime())} UTC")

main()
