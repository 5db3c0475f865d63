#!/bin/bash
# Instructions the PS executes per request, counted by callgrind (deterministic where the
# machine is shared and timings are not). A `commctl serve` with one loop runs under
# callgrind with counting off; a warm-up of 3,000 requests; counting on; N requests from
# `commctl bench` on another CPU; a dump; total / N.
#
#   tools/scripts/ps-instructions.sh COMMCTL PORT INFLIGHT N [bench args...]
#   e.g. tools/scripts/ps-instructions.sh target/release/commctl 47900 64 30000
#        tools/scripts/ps-instructions.sh target/release/commctl 47901 16 5000 -o pull -k 100
#        tools/scripts/ps-instructions.sh target/release/commctl 47902 8 3000 -o pull-rows -k 1000
#
# The server runs on epoll (callgrind does not follow io_uring's kernel-side work) with
# spinning off; SERVE_ARGS adds arguments to `commctl serve` (for instance
# "--table-kind mem --rows 100000": a PsTable's default reservation is more address space
# than valgrind allows). Needs valgrind and callgrind_control.
set -euo pipefail
bin=$1 port=$2 inflight=$3 n=$4
shift 4
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# shellcheck disable=SC2086
STARWIRE_SPIN_US=0 STARWIRE_BACKEND=epoll taskset -c 0 valgrind --tool=callgrind \
    --instr-atstart=no --callgrind-out-file="$out/cg.out" \
    "$bin" serve --loops 1 ${SERVE_ARGS:-} -l "127.0.0.1:$port" >"$out/serve.log" 2>&1 &
server=$!
for _ in $(seq 100); do
    grep -q "listening\|serving" "$out/serve.log" 2>/dev/null && break
    sleep 0.1
done
taskset -c 1 "$bin" bench -n 3000 -p "$inflight" "$@" "127.0.0.1:$port" >/dev/null
callgrind_control -i on "$server" >/dev/null
taskset -c 1 "$bin" bench -n "$n" -p "$inflight" "$@" "127.0.0.1:$port" >"$out/bench.txt"
callgrind_control -d "$server" >/dev/null
kill "$server"
wait "$server" 2>/dev/null || true
total=$(grep -m1 '^summary:' "$out"/cg.out.* | awk '{print $2}')
echo "requests $n, in flight $inflight, instructions $total, per request $((total / n))"
