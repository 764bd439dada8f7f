#!/usr/bin/env bash
# bench/instructions.sh: corral's user-space instructions per request, counted, not timed.
#
#   bench/instructions.sh [--cases a,c,w] [--duration S] [--runs N] [--baseline PATH]
#
# For comparing two builds on a busy machine, where req/s and CPU time move with whatever else
# runs: the count does not (the same binary varies by ~0.3% from run to run). Each run starts
# `corral serve` (the embedded site, one process) under valgrind's callgrind on CPU 0, loads it
# with wrk on CPU 1 as bench/run.sh does for the case ((a) GET /hello keep-alive, (c) the same
# 16-deep pipelined, bench/pipeline.lua), zeroes the counters after a 2 s warm-up, runs wrk for
# --duration seconds, dumps, and divides the instructions executed in that window (callgrind's Ir:
# every instruction of the process, the event loop's included, none of the kernel's) by the calls
# of Connection::dispatch() (one per request) in the same window. Under callgrind the server runs
# ~50x slower; the batching (requests per read) is what wrk gives it then, the same for both.
# Callgrind counts each iteration of a `rep` string instruction: a PMU counts one.
# Why not `perf stat -e instructions`: this VM has no PMU (perf: "<not supported>").
# Case (w) counts a C++ worker instead: `corral serve` (not under callgrind) with one worker kind
# whose command runs examples/worker_cpp's example_worker under callgrind, wrk -c8 on GET
# /counter/x/ (one warm worker, every request proxied to it), and the worker's instructions
# divided by its own Connection::dispatch() calls: the worker's share of a proxied request.
# --baseline PATH also measures a second corral binary the same way, alternating with corral
# (for (w) with the example_worker next to it, else corral's).
#
# Environment: CORRAL_BIN (use this binary, do not build), WORKER_BIN (the example_worker for
# case w; default: next to corral). Needs: valgrind, wrk, curl, python3.
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
help_lines=2,25

cases="c" duration=5 runs=3 baseline=""
parse_flags "--cases cases --duration duration --runs runs --baseline baseline" "$@"
need_tools valgrind callgrind_control wrk curl python3 taskset
need_cpus "(server on CPU 0, wrk on CPU 1)"
find_corral
if [[ -n "$baseline" ]]; then
  baseline="$(realpath "$baseline")"
  [[ -x "$baseline" ]] || { echo "$self: no baseline binary at $baseline" >&2; exit 2; }
fi
make_tmp corral-instructions

# Instructions in a callgrind dump and calls of the functions whose name contains $2.
count() {  # $1 callgrind file  $2 function
  python3 - "$1" "$2" <<'EOF'
import re, sys
names, total, calls, callee = {}, 0, 0, None
for line in open(sys.argv[1], errors="replace"):
    if line.startswith("summary:"):
        total = int(line.split()[1])
    m = re.match(r"(c?)fn=\((\d+)\)(?: (.*))?", line)
    if m:
        if m.group(3):
            names[m.group(2)] = m.group(3)
        callee = names.get(m.group(2), "") if m.group(1) else None
    elif line.startswith("calls=") and callee is not None:
        if sys.argv[2] in callee:
            calls += int(line[6:].split()[0])
        callee = None
print(total, calls)
EOF
}

# The example_worker built with corral $1 (examples/worker_cpp under its build directory).
worker_of() {  # $1 corral binary
  if [[ "$1" == "$corral" && -n "${WORKER_BIN:-}" ]]; then
    realpath "$WORKER_BIN"
  elif [[ -x "$(dirname "$1")/examples/worker_cpp/example_worker" ]]; then
    realpath "$(dirname "$1")/examples/worker_cpp/example_worker"
  else
    realpath "${WORKER_BIN:-$(dirname "$corral")/examples/worker_cpp/example_worker}"
  fi
}

measure_worker() {  # $1 binary  $2 label
  local port worker out pid ir n
  port=$(free_port)
  worker=$(worker_of "$1")
  [[ -x "$worker" ]] || { echo "$self: no example_worker at $worker" >&2; exit 2; }
  out="$tmp/cg.$2.w"
  rm -rf "$tmp/state"
  cat >"$tmp/workers.toml" <<EOF
listen = "127.0.0.1:$port"
access_log = false
log_level = "warn"
state_dir = "$tmp/state"

[workers.counter]
command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=$out.%p", "$worker"]
routes = ["/counter/{id}/*"]
idle = "1h"
EOF
  "$1" serve --config "$tmp/workers.toml" >"$tmp/server.out" 2>&1 &
  server_pid=$!
  # The first request starts the worker under callgrind (slow): each try waits up to 20 s.
  poll_while_alive "$server_pid" curl -fsS -m 20 -o /dev/null "http://127.0.0.1:$port/counter/x/" ||
    { echo "$self: $2 did not answer /counter/x/; its output:" >&2; cat "$tmp/server.out" >&2; exit 1; }
  pid=$(pgrep -f -- "--callgrind-out-file=$out" | head -1)
  [[ -n "$pid" ]] || { echo "$self: no worker under callgrind for $2" >&2; exit 1; }
  local wrk_cmd=(wrk -t1 -c8 "http://127.0.0.1:$port/counter/x/")
  "${wrk_cmd[@]}" -d2s >/dev/null
  callgrind_control -z "$pid" >/dev/null 2>&1
  "${wrk_cmd[@]}" "-d${duration}s" >/dev/null
  callgrind_control -d "$pid" >/dev/null 2>&1
  stop_server
  read -r ir n < <(count "$out.$pid.1" "corral::http::Connection::dispatch()")
  [[ "$n" -gt 0 ]] || { echo "$self: no request counted for $2" >&2; exit 1; }
  awk -v ir="$ir" -v n="$n" -v l="$2" \
    'BEGIN { printf "case w %-8s %12d instructions %8d requests %8.1f per request (the worker)\n", l, ir, n, ir / n }'
}

measure() {  # $1 case  $2 binary  $3 label
  [[ "$1" == w ]] && { measure_worker "$2" "$3"; return; }
  local port extra=() out pid n
  port=$(free_port)
  [[ "$1" == c ]] && extra=(-s "$root/bench/pipeline.lua")
  out="$tmp/cg.$3.$1"
  taskset -c 0 valgrind --tool=callgrind --callgrind-out-file="$out.%p" "$2" serve \
    --config "$tmp/plain.toml" --listen "127.0.0.1:$port" --no-access-log --log-level warn \
    >"$tmp/server.out" 2>&1 &
  server_pid=$!
  await_body "$3" "http://127.0.0.1:$port/hello" 5
  local wrk_cmd=(taskset -c 1 wrk -t1 -c50 "${extra[@]}" "http://127.0.0.1:$port/hello")
  "${wrk_cmd[@]}" -d2s >/dev/null
  callgrind_control -z "$server_pid" >/dev/null 2>&1
  "${wrk_cmd[@]}" "-d${duration}s" >/dev/null
  callgrind_control -d "$server_pid" >/dev/null 2>&1
  pid=$server_pid
  stop_server
  read -r ir n < <(count "$out.$pid.1" "corral::http::Connection::dispatch()")
  [[ "$n" -gt 0 ]] || { echo "$self: no request counted for $3" >&2; exit 1; }
  awk -v ir="$ir" -v n="$n" -v c="$1" -v l="$3" \
    'BEGIN { printf "case %s %-8s %12d instructions %8d requests %8.1f per request\n", c, l, ir, n, ir / n }'
}

echo "# bench/instructions.sh --cases $cases --duration $duration --runs $runs, $(utc_minute)"
echo "# corral: $corral${baseline:+; baseline: $baseline}"
for c in ${cases//,/ }; do
  for ((i = 1; i <= runs; i++)); do
    if [[ -n "$baseline" && $((i % 2)) -eq 1 ]]; then measure "$c" "$baseline" baseline; fi
    measure "$c" "$corral" corral
    if [[ -n "$baseline" && $((i % 2)) -eq 0 ]]; then measure "$c" "$baseline" baseline; fi
  done
done
