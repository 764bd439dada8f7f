#!/usr/bin/env bash
# bench/workers.sh: workers (one process per address) measured through the real corral binary.
#
#   bench/workers.sh [--count 200] [--concurrency 8] [--duration 10] [--warmup 2]
#                    [--connections 32] [--threads 2] [--repeat 2] [--idle-workers 50]
#                    [--kinds cpp,python] [--parts first,proxy,memory] [--priority rt|nice|none]
#
# Parts (each on a fresh `corral serve --config` with its own state directory; the config has no
# root, so the embedded welcome site's GET /hello is served next to the worker routes):
#   first   First request to a new address (fork -> response): --count requests to distinct
#           addresses /counter/a1/ ... /counter/aN/, each on a new TCP connection, timed by
#           bench/workers_first.py from before connect() to the last response byte; once one at a
#           time and once --concurrency at a time (a fresh corral for each round, idle = "1h" so
#           nothing stops in between). 5 unmeasured first requests warm the page cache first.
#           Reports median, p90, p99, max in ms.
#   proxy   Proxied req/s against direct req/s in the same corral process: wrk -t2 -c32 on
#           GET /counter/x/ (one warm worker) and on GET /hello, alternated --repeat times, each
#           measured run after an unmeasured --warmup. Reports both, the ratio, and CPU per request
#           of each process (utime+stime: the server process, the supervisor, which answers the
#           resolve message of every proxied request, the worker). Then the worker's own req/s on
#           its Unix socket (bench/workers_uds_load.c: wrk cannot connect to a Unix socket), with a
#           new connection per request (as the proxy does today) and with keep-alive connections.
#   memory  --idle-workers addresses are started, left idle for 3 s, then the PSS (and RSS and
#           USS = Private_Clean + Private_Dirty) of the worker processes (pids from
#           `corral ctl workers`) is summed from /proc/PID/smaps_rollup and divided by the count.
#
# Kinds: cpp = examples/worker_cpp (example_worker), python = examples/worker_python/worker.py.
# No CPU pinning: the server, supervisor, worker and wrk share the machine's CPUs (a proxied
# request needs three processes). --priority (default rt as root, as bench/run.sh): corral (and so
# its workers, which inherit it), wrk and the clients run under chrt -f 50 / nice -19.
# This script only measures; nothing is pass/fail.
#
# Environment: CORRAL_BIN and WORKER_BIN (use these binaries, do not build), PYTHON_BIN (the
# interpreter for worker.py; default /usr/bin/python3).
# Needs: wrk, curl, python3, cc, chrt (scripts/deps.sh bench).
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
help_lines=2,35

count=200
concurrency=8
duration=10
warmup=2
conns=32
threads=2
repeat=2
idle_workers=50
kinds="cpp,python"
parts="first,proxy,memory"
priority=$(rt_if_root)
parse_flags "--count count --concurrency concurrency --duration duration --warmup warmup
  --connections conns --threads threads --repeat repeat --idle-workers idle_workers --kinds kinds
  --parts parts --priority priority" "$@"
set_prio "$priority"

need_tools wrk curl python3 cc
python_bin="${PYTHON_BIN:-/usr/bin/python3}"
[[ -x "$python_bin" ]] || python_bin="$(python3 -c 'import sys; print(sys.executable)')"

# --- build -------------------------------------------------------------------------------------
if [[ -n "${CORRAL_BIN:-}" ]]; then
  corral="$(realpath "$CORRAL_BIN")"
  worker_cpp="$(realpath "${WORKER_BIN:-$(dirname "$corral")/examples/worker_cpp/example_worker}")"
else
  corral="$root/build/release/corral"
  worker_cpp="$root/build/release/examples/worker_cpp/example_worker"
  echo "workers.sh: building release corral and example_worker" >&2
  release_build corral example_worker
fi
worker_py="$root/examples/worker_python/worker.py"
for f in "$corral" "$worker_cpp"; do
  [[ -x "$f" ]] || { echo "workers.sh: no binary at $f" >&2; exit 2; }
done

# --- fixtures ----------------------------------------------------------------------------------
make_tmp corral-workers-bench
corral_pid=""
seen_workers=()  # every worker pid seen, killed at exit if one outlived its supervisor
stop_corral() {
  if [[ -n "$corral_pid" ]] && kill -0 "$corral_pid" 2>/dev/null; then
    kill -TERM "$corral_pid" 2>/dev/null || true
    for _ in $(seq 150); do
      kill -0 "$corral_pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL "$corral_pid" 2>/dev/null || true
    wait "$corral_pid" 2>/dev/null || true
  fi
  corral_pid=""
}
cleanup() {  # replaces lib.sh's: corral and any worker left over, then $tmp
  stop_corral
  local p
  for p in "${seen_workers[@]}"; do
    kill -KILL "$p" 2>/dev/null || true
  done
  rm -rf "$tmp"
}

cc -O2 -o "$tmp/uds_load" "$root/bench/workers_uds_load.c"

run_n=0
state=""
port=""
start_corral() {  # $1 cpp|python
  run_n=$((run_n + 1))
  state="$tmp/state-$run_n"
  port=$(free_port)
  local cmd
  case "$1" in
    cpp) cmd="[\"$worker_cpp\"]" ;;
    python) cmd="[\"$python_bin\", \"$worker_py\"]" ;;
  esac
  cat >"$tmp/corral-$run_n.toml" <<EOF
listen = "127.0.0.1:$port"
access_log = false
log_level = "warn"
state_dir = "$state"

[workers.counter]
command = $cmd
routes = ["/counter/{id}/*"]
idle = "1h"
EOF
  "${prio[@]}" "$corral" serve --config "$tmp/corral-$run_n.toml" >"$tmp/corral-$run_n.out" 2>&1 &
  corral_pid=$!
  poll_while_alive "$corral_pid" answers_hello && return 0
  echo "workers.sh: corral did not answer /hello; its output:" >&2
  cat "$tmp/corral-$run_n.out" >&2
  return 1
}

answers_hello() { [[ "$(curl -fsS "http://127.0.0.1:$port/hello" 2>/dev/null)" == hello ]]; }

# The body of a worker's GET / is its count: "0\n" for a new address.
expect_counter() {  # $1 path
  local body
  body=$(curl -fsS "http://127.0.0.1:$port$1") || {
    echo "workers.sh: GET $1 failed; corral's output:" >&2
    cat "$tmp/corral-$run_n.out" >&2
    return 1
  }
  [[ "$body" =~ ^[0-9]+$ ]] || { echo "workers.sh: GET $1 answered '$body'" >&2; return 1; }
}

worker_pids() {  # pids of the running workers, one per line
  "$corral" ctl workers --state-dir "$state" | python3 -c '
import json, sys
for a, w in json.load(sys.stdin).items():
    if w.get("pid") and w.get("status") == "running":
        print(w["pid"])'
}

remember_workers() {
  local p
  for p in $(worker_pids); do seen_workers+=("$p"); done
}

server_pid() {  # the server process: the supervisor's child that is corral itself
  ps --ppid "$corral_pid" -o pid=,comm= | awk '$2 == "corral" { print $1; exit }'
}

cpu_ns() {  # time on CPU of the given pids, ns: utime + stime from /proc/PID/stat, which (unlike
  # schedstat) includes threads that have exited (the Python worker runs a thread per connection)
  local pid
  for pid in "$@"; do
    sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null || true
  done | awk -v hz="$(getconf CLK_TCK)" '{ t += $12 + $13 } END { printf "%.0f", t * 1e9 / hz }'
}

results="$tmp/results.txt"
: >"$results"
IFS=, read -ra kind_list <<<"$kinds"
has_part() { [[ ",$parts," == *",$1,"* ]]; }

load_before=$(cut -d' ' -f1-3 /proc/loadavg)

# --- part 1: first request to a new address ----------------------------------------------------
if has_part first; then
  for kind in "${kind_list[@]}"; do
    for c in 1 "$concurrency"; do
      start_corral "$kind"
      for i in 1 2 3 4 5; do expect_counter "/counter/w$i/"; done
      out=$("${prio[@]}" python3 "$root/bench/workers_first.py" --port "$port" --prefix /counter/a \
        --count "$count" --concurrency "$c")
      remember_workers
      alive=$(worker_pids | wc -l)
      echo "workers.sh: first $kind c=$c: $out (workers running: $alive)" >&2
      python3 -c '
import json, sys
d = json.loads(sys.argv[1])
print("first", sys.argv[2], d["concurrency"], d["count"], d["errors"], d["median_ms"], d["p90_ms"],
      d["p99_ms"], d["max_ms"], d["starts_per_s"], sys.argv[3])' "$out" "$kind" "$alive" >>"$results"
      stop_corral
    done
  done
fi

# --- part 2: proxied req/s against direct req/s --------------------------------------------------
wrk_run() {  # $1 label  $2 path  -> one "proxy" line in results
  local url="http://127.0.0.1:$port$2"
  local wrk_cmd=("${prio[@]}" wrk "-t$threads" "-c$conns" --latency)
  "${wrk_cmd[@]}" "-d${warmup}s" "$url" >/dev/null 2>&1 || true
  local s0 v0 w0 b0 s1 v1 w1 b1 out
  s0=$(cpu_ns "$srv"); v0=$(cpu_ns "$corral_pid"); w0=$(cpu_ns "$wpid"); b0=$(busy_jiffies)
  out=$("${wrk_cmd[@]}" "-d${duration}s" "$url" 2>&1)
  s1=$(cpu_ns "$srv"); v1=$(cpu_ns "$corral_pid"); w1=$(cpu_ns "$wpid"); b1=$(busy_jiffies)
  local reqs rps p50 p99 errors non2xx
  wrk_fields "$out"
  p50=$(to_us "$(awk '$1 == "50%" { print $2 }' <<<"$out")")
  wrk_ran "$out" "on $2" || return 1
  awk -v k="$kind" -v l="$1" -v rps="$rps" -v p50="$p50" -v p99="$p99" -v n="$reqs" \
      -v s=$((s1 - s0)) -v v=$((v1 - v0)) -v w=$((w1 - w0)) -v b=$((b1 - b0)) -v hz="$hz" \
      -v e="${errors:-0}" -v x="${non2xx:-0}" 'BEGIN {
    printf "proxy %s %s %s %s %s %.2f %.2f %.2f %.2f %d\n", k, l, rps, p50, p99,
      s / 1e3 / n, v / 1e3 / n, w / 1e3 / n, b * 1e6 / hz / n, e + x }' | tee -a "$results" >&2
}

uds_run() {  # $1 close|keepalive
  local sock="$state/sockets/counter%3Ax"
  "${prio[@]}" "$tmp/uds_load" "$sock" "$conns" "$warmup" "$1" >/dev/null
  local w0 w1 b0 b1 out
  w0=$(cpu_ns "$wpid"); b0=$(busy_jiffies)
  out=$("${prio[@]}" "$tmp/uds_load" "$sock" "$conns" "$duration" "$1")
  w1=$(cpu_ns "$wpid"); b1=$(busy_jiffies)
  # requests N seconds S rps R errors E non200 M
  read -r _ n _ _ _ rps _ e _ x <<<"$out"
  awk -v k="$kind" -v l="worker-uds-$1" -v rps="$rps" -v n="$n" -v w=$((w1 - w0)) \
      -v b=$((b1 - b0)) -v hz="$hz" -v e="$((e + x))" 'BEGIN {
    printf "proxy %s %s %s - - - - %.2f %.2f %d\n", k, l, rps, w / 1e3 / n, b * 1e6 / hz / n, e
  }' | tee -a "$results" >&2
}

if has_part proxy; then
  for kind in "${kind_list[@]}"; do
    start_corral "$kind"
    expect_counter /counter/x/
    remember_workers
    srv=$(server_pid)
    wpid=$(worker_pids | head -1)
    [[ -n "$srv" && -n "$wpid" ]] || { echo "workers.sh: no server or worker pid" >&2; exit 1; }
    for _ in $(seq "$repeat"); do
      wrk_run direct /hello
      wrk_run proxied /counter/x/
    done
    uds_run close
    uds_run keepalive
    stop_corral
  done
fi

# --- part 3: memory per idle worker ------------------------------------------------------------
if has_part memory; then
  for kind in "${kind_list[@]}"; do
    start_corral "$kind"
    for i in $(seq "$idle_workers"); do expect_counter "/counter/m$i/"; done
    sleep 3
    remember_workers
    # shellcheck disable=SC2207
    pids=($(worker_pids))
    srv=$(server_pid)
    python3 - "$kind" "$corral_pid" "$srv" "${pids[@]}" >>"$results" <<'EOF'
import sys
kind, sup, srv, pids = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
def rollup(pid):
    out = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 2 and parts[0].endswith(":") and parts[1].isdigit():
                out[parts[0][:-1]] = int(parts[1])
    return out
tot = {"Pss": 0, "Rss": 0, "Uss": 0}
for p in pids:
    r = rollup(p)
    tot["Pss"] += r["Pss"]; tot["Rss"] += r["Rss"]
    tot["Uss"] += r.get("Private_Clean", 0) + r.get("Private_Dirty", 0)
n = len(pids)
corral_pss = rollup(sup)["Pss"] + rollup(srv)["Pss"]
print("memory", kind, n, round(tot["Pss"] / n), round(tot["Rss"] / n), round(tot["Uss"] / n),
      corral_pss)
EOF
    tail -1 "$results" >&2
    stop_corral
  done
fi

load_after=$(cut -d' ' -f1-3 /proc/loadavg)

# --- report ------------------------------------------------------------------------------------
echo
printf '<!-- bench/workers.sh --count %s --concurrency %s --duration %s --repeat %s --idle-workers %s --priority %s, %s, %s x%s, Linux %s, load average before %s after %s -->\n' \
  "$count" "$concurrency" "$duration" "$repeat" "$idle_workers" "$priority" "$(utc_minute)" \
  "$(cpu_model)" "$(nproc)" "$(uname -r)" "$load_before" "$load_after"
awk -v conns="$conns" -v threads="$threads" '
  $1 == "first" { first[++nf] = $0 }
  $1 == "proxy" { proxy[++np] = $0 }
  $1 == "memory" { mem[++nm] = $0 }
  END {
    if (nf) {
      print ""
      print "First request to a new address (fork -> response), ms:"
      print ""
      print "| worker | concurrency | requests | median | p90 | p99 | max | starts/s | errors |"
      print "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
      for (i = 1; i <= nf; i++) {
        split(first[i], f, " ")
        printf "| %s | %s | %s | %.1f | %.1f | %.1f | %.1f | %s | %s |\n",
          f[2], f[3], f[4], f[6], f[7], f[8], f[9], f[10], f[5]
      }
    }
    if (np) {
      print ""
      printf "Proxied against direct (wrk -t%s -c%s; worker-uds: %s connections on the worker socket):\n", threads, conns, conns
      print ""
      print "| worker | run | req/s | p50 | p99 | server CPU/req | supervisor CPU/req | worker CPU/req | machine busy/req | errors |"
      print "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
      for (i = 1; i <= np; i++) {
        split(proxy[i], f, " ")
        if (f[5] == "-")
          printf "| %s | %s | %.0f | - | - | - | - | %.2f us | %.2f us | %s |\n", f[2], f[3], f[4], f[9], f[10], f[11]
        else
          printf "| %s | %s | %.0f | %s us | %s us | %.2f us | %.2f us | %.2f us | %.2f us | %s |\n",
            f[2], f[3], f[4], f[5], f[6], f[7], f[8], f[9], f[10], f[11]
        if (f[3] == "direct") { d[f[2]] += f[4]; nd[f[2]]++ }
        if (f[3] == "proxied") { p[f[2]] += f[4]; npx[f[2]]++ }
      }
      print ""
      for (k in d) if (npx[k])
        printf "%s: proxied/direct = %.3f (mean of %d runs each: %.0f / %.0f req/s)\n",
          k, (p[k] / npx[k]) / (d[k] / nd[k]), nd[k], p[k] / npx[k], d[k] / nd[k]
    }
    if (nm) {
      print ""
      print "Memory per idle worker (smaps_rollup, KiB):"
      print ""
      print "| worker | workers | PSS/worker | RSS/worker | USS/worker | corral supervisor+server PSS |"
      print "| --- | ---: | ---: | ---: | ---: | ---: |"
      for (i = 1; i <= nm; i++) {
        split(mem[i], f, " ")
        printf "| %s | %s | %s | %s | %s | %s |\n", f[2], f[3], f[4], f[5], f[6], f[7]
      }
    }
  }' "$results"
