#!/usr/bin/env bash
# bench/workers.sh: workers (one process per address) measured through the real corral binary.
#
#   bench/workers.sh [--count 200] [--concurrency 8] [--duration 10] [--warmup 2]
#                    [--connections 32] [--threads 2] [--repeat 2] [--idle-workers 50]
#                    [--kinds cpp,python,node] [--parts first,proxy,memory,upload] [--priority rt|nice|none]
#                    [--upload-mib 1024]
#                    [--spares N]
#                    [--baseline PATH [--baseline-worker PATH]]
#
# Parts (each on a fresh `corral serve --config` with its own state directory; the config has no
# root, so the embedded welcome site's GET /hello is served next to the worker routes):
#   first   First request to a new address (fork -> response): --count requests to distinct
#           addresses /counter/a1/ ... /counter/aN/, each on a new TCP connection, timed by
#           bench/workers_first.py from before connect() to the last response byte; once one at a
#           time and once --concurrency at a time (a fresh corral for each round, idle = "1h" so
#           nothing stops in between). 5 unmeasured first requests warm the page cache first.
#           Reports median, p90, p99, max in ms. With --spares N the kind has `spares = N` (warm
#           spares, docs/process-model.md): the rounds are then concurrency 1 and N, and before
#           each batch of requests workers_first.py waits (untimed) until the N spares are in
#           standby again, so each first request binds a warm spare; rows say "<kind>/spares=N".
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
#   upload  Proxied upload MiB/s (issue 14: request bodies streamed to the worker), by
#           bench/workers_upload.py on its own corral with every kind of --kinds (node: the Node.js
#           example worker too, when `node` runs): --upload-mib MiB made on the fly, to POST
#           /count through the proxy with Content-Length and chunked, and with Content-Length
#           straight to the worker's socket (the worker alone); the best of --repeat (at least 2)
#           each, and the server process's peak RSS growth during the proxied ones.
#
# Kinds: cpp = examples/worker_cpp (example_worker), python = examples/worker_python/worker.py.
# No CPU pinning: the server, supervisor, worker and wrk share the machine's CPUs (a proxied
# request needs three processes). --priority (default rt as root, as bench/run.sh): corral, wrk
# and the clients run under chrt -f 50 (rt) or nice -19 (nice). Workers inherit a nice value but
# never the real-time policy (the launcher gives every worker the normal one). A baseline built
# before that change (aa244d8) gives its workers the real-time policy; part proxy sets its warm
# worker back to the normal one (chrt -o), so both builds' workers run under the same policy (a
# real-time worker preempts the server and wrk at once: the baseline gave ~1.1x its proxied req/s).
# --baseline PATH measures a second corral binary (e.g. a release build of the commit before a
# change) in the same run, with the same config, clients and priority: its example_worker is
# --baseline-worker, by default examples/worker_cpp/example_worker next to it (else corral's).
# Parts first and memory run both builds back to back (a fresh corral each); in part proxy both
# run at once and every wrk run goes to one then the other (which goes first alternates), so both
# see the same machine. A last table gives corral/baseline per worker kind. Without it, one corral.
# This script only measures; nothing is pass/fail.
#
# Environment: CORRAL_BIN and WORKER_BIN (use these binaries, do not build), PYTHON_BIN (the
# interpreter for worker.py; default /usr/bin/python3).
# Needs: wrk, curl, python3, cc, chrt (scripts/deps.sh bench).
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
help_lines=2,53

count=200
concurrency=8
duration=10
warmup=2
conns=32
threads=2
repeat=2
idle_workers=50
kinds="cpp,python"
parts="first,proxy,memory,upload"
upload_mib=1024  # part upload (issue 14)
spares=0
priority=$(rt_if_root)
baseline=""
baseline_worker=""
parse_flags "--count count --concurrency concurrency --duration duration --warmup warmup
  --connections conns --threads threads --repeat repeat --idle-workers idle_workers --kinds kinds
  --parts parts --priority priority --baseline baseline --baseline-worker baseline_worker
  --upload-mib upload_mib --spares spares" "$@"
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
# The builds measured, each with its corral and its example_worker: "corral", and "baseline" first
# when --baseline names one. The functions below act on the current build (use_build).
builds=()
declare -A bin_of worker_of pid_of port_of state_of out_of srv_of wpid_of
if [[ -n "$baseline" ]]; then
  builds+=(baseline)
  bin_of[baseline]="$(realpath "$baseline")"
  if [[ -z "$baseline_worker" ]]; then
    baseline_worker="$(dirname "${bin_of[baseline]}")/examples/worker_cpp/example_worker"
    [[ -x "$baseline_worker" ]] || baseline_worker="$worker_cpp"
  fi
  worker_of[baseline]="$(realpath "$baseline_worker")"
fi
builds+=(corral)
bin_of[corral]="$corral"
worker_of[corral]="$worker_cpp"
for b in "${builds[@]}"; do
  for f in "${bin_of[$b]}" "${worker_of[$b]}"; do
    [[ -x "$f" ]] || { echo "workers.sh: no binary at $f" >&2; exit 2; }
  done
done

# --- fixtures ----------------------------------------------------------------------------------
make_tmp corral-workers-bench
corral_pid=""
build=corral
seen_workers=()  # every worker pid seen, killed at exit if one outlived its supervisor
use_build() {  # $1 a build: sets corral (its binary) and the pid, port, state, pids of its corral
  build="$1"
  corral="${bin_of[$1]}"
  worker_cpp="${worker_of[$1]}"
  corral_pid="${pid_of[$1]:-}"
  port="${port_of[$1]:-}"
  state="${state_of[$1]:-}"
  out="${out_of[$1]:-}"
  srv="${srv_of[$1]:-}"
  wpid="${wpid_of[$1]:-}"
}
stop_corral() {  # the current build's corral
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
  pid_of[$build]=""
}
stop_all() {
  local b
  for b in "${builds[@]}"; do
    use_build "$b"
    stop_corral
  done
}
cleanup() {  # replaces lib.sh's: corral and any worker left over, then $tmp
  stop_all
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
start_corral() {  # $1 cpp|python|node  [$2 build, default corral]: it becomes the current build
  use_build "${2:-corral}"
  run_n=$((run_n + 1))
  state="$tmp/state-$run_n"
  port=$(free_port)
  local cmd
  case "$1" in
    cpp) cmd="[\"$worker_cpp\"]" ;;
    python) cmd="[\"$python_bin\", \"$worker_py\"]" ;;
    node) cmd="[\"$(command -v node)\", \"$root/examples/worker_node/worker.mjs\"]" ;;
    *) echo "workers.sh: unknown kind $1 (cpp, python, node)" >&2; exit 2 ;;
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
  # Only when asked: a baseline built before spares existed refuses the key.
  if ((spares > 0)); then echo "spares = $spares" >>"$tmp/corral-$run_n.toml"; fi
  out="$tmp/corral-$run_n.out"
  "${prio[@]}" "$corral" serve --config "$tmp/corral-$run_n.toml" >"$out" 2>&1 &
  corral_pid=$!
  pid_of[$build]=$corral_pid port_of[$build]=$port state_of[$build]=$state out_of[$build]=$out
  poll_while_alive "$corral_pid" answers_hello && return 0
  echo "workers.sh: $build did not answer /hello; its output:" >&2
  cat "$out" >&2
  return 1
}

answers_hello() { [[ "$(curl -fsS "http://127.0.0.1:$port/hello" 2>/dev/null)" == hello ]]; }

# The body of a worker's GET / is its count: "0\n" for a new address.
expect_counter() {  # $1 path
  local body
  body=$(curl -fsS "http://127.0.0.1:$port$1") || {
    echo "workers.sh: GET $1 failed; $build's output:" >&2
    cat "$out" >&2
    return 1
  }
  [[ "$body" =~ ^[0-9]+$ ]] || { echo "workers.sh: GET $1 answered '$body'" >&2; return 1; }
}

worker_pids() {  # pids of the running workers, one per line
  # A baseline built before `ctl workers` printed a table has no --json: it prints JSON anyway.
  { "$corral" ctl workers --json --state-dir "$state" 2>/dev/null ||
    "$corral" ctl workers --state-dir "$state"; } | python3 -c '
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
first_concs=(1 "$concurrency")
spare_args=()
if ((spares > 0)); then
  first_concs=(1)
  ((spares > 1)) && first_concs+=("$spares")
fi
if has_part first; then
  for kind in "${kind_list[@]}"; do
    for c in "${first_concs[@]}"; do
      for b in "${builds[@]}"; do
        start_corral "$kind" "$b"
        for i in 1 2 3 4 5; do expect_counter "/counter/w$i/"; done
        ((spares > 0)) && spare_args=(--spares "$spares" --state-dir "$state")
        got=$("${prio[@]}" python3 "$root/bench/workers_first.py" --port "$port" --prefix /counter/a \
          --count "$count" --concurrency "$c" "${spare_args[@]}")
        remember_workers
        alive=$(worker_pids | wc -l)
        echo "workers.sh: first $kind c=$c $b: $got (workers running: $alive)" >&2
        python3 -c '
import json, sys
d = json.loads(sys.argv[1])
print("first", sys.argv[2], d["concurrency"], d["count"], d["errors"], d["median_ms"], d["p90_ms"],
      d["p99_ms"], d["max_ms"], d["starts_per_s"], sys.argv[3], sys.argv[4])' "$got" \
          "$kind$( ((spares > 0)) && echo "/spares=$spares")" "$alive" "$b" \
          >>"$results"
        stop_corral
      done
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
  wrk_ran "$out" "on $2 ($build)" || return 1
  awk -v k="$kind" -v l="$1" -v rps="$rps" -v p50="$p50" -v p99="$p99" -v n="$reqs" \
      -v s=$((s1 - s0)) -v v=$((v1 - v0)) -v w=$((w1 - w0)) -v b=$((b1 - b0)) -v hz="$hz" \
      -v e="${errors:-0}" -v x="${non2xx:-0}" -v build="$build" 'BEGIN {
    printf "proxy %s %s %s %s %s %.2f %.2f %.2f %.2f %d %s\n", k, l, rps, p50, p99,
      s / 1e3 / n, v / 1e3 / n, w / 1e3 / n, b * 1e6 / hz / n, e + x, build }' | tee -a "$results" >&2
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
      -v b=$((b1 - b0)) -v hz="$hz" -v e="$((e + x))" -v build="$build" 'BEGIN {
    printf "proxy %s %s %s - - - - %.2f %.2f %d %s\n", k, l, rps, w / 1e3 / n, b * 1e6 / hz / n, e,
      build
  }' | tee -a "$results" >&2
}

if has_part proxy; then
  for kind in "${kind_list[@]}"; do
    for b in "${builds[@]}"; do
      start_corral "$kind" "$b"
      expect_counter /counter/x/
      remember_workers
      srv_of[$b]=$(server_pid)
      wpid_of[$b]=$(worker_pids | head -1)
      [[ -n "${srv_of[$b]}" && -n "${wpid_of[$b]}" ]] ||
        { echo "workers.sh: no server or worker pid ($b)" >&2; exit 1; }
      # Like with like: a worker of an older build may have inherited the real-time policy.
      chrt -o -p 0 "${wpid_of[$b]}" >/dev/null 2>&1 || true
    done
    order=("${builds[@]}")
    for _ in $(seq "$repeat"); do
      for b in "${order[@]}"; do use_build "$b"; wrk_run direct /hello; done
      for b in "${order[@]}"; do use_build "$b"; wrk_run proxied /counter/x/; done
      # shellcheck disable=SC2207  # the builds' names have no spaces
      order=($(printf '%s\n' "${order[@]}" | tac))  # the other build goes first next round
    done
    for b in "${builds[@]}"; do use_build "$b"; uds_run close; uds_run keepalive; done
    stop_all
  done
fi

# --- part 3: memory per idle worker ------------------------------------------------------------
if has_part memory; then
  for kind in "${kind_list[@]}"; do
    for b in "${builds[@]}"; do
      start_corral "$kind" "$b"
      for i in $(seq "$idle_workers"); do expect_counter "/counter/m$i/"; done
      sleep 3
      remember_workers
      # shellcheck disable=SC2207
      pids=($(worker_pids))
      srv=$(server_pid)
      python3 - "$kind" "$b" "$corral_pid" "$srv" "${pids[@]}" >>"$results" <<'EOF'
import sys
kind, build, sup, srv, pids = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
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
      corral_pss, build)
EOF
      tail -1 "$results" >&2
      stop_corral
    done
  done
fi

# --- part 4: proxied upload MiB/s (issue 14: streamed request bodies) -------------------------
if has_part upload; then
  for b in "${builds[@]}"; do
    use_build "$b"
    up_kinds=()
    for kind in "${kind_list[@]}"; do
      case "$kind" in
        cpp) up_kinds+=(--kind "cpp=[\"$worker_cpp\"]") ;;
        python) up_kinds+=(--kind "python=[\"$python_bin\", \"$worker_py\"]") ;;
        node) up_kinds+=(--kind "node=[\"$(command -v node)\", \"$root/examples/worker_node/worker.mjs\"]") ;;
      esac
    done
    # The Node.js worker when it can run, even if --kinds does not name it.
    if [[ ",$kinds," != *",node,"* ]] && command -v node >/dev/null; then
      up_kinds+=(--kind "node=[\"$(command -v node)\", \"$root/examples/worker_node/worker.mjs\"]")
    fi
    run_n=$((run_n + 1))
    "${prio[@]}" python3 "$root/bench/workers_upload.py" --corral "$corral" \
      --state "$tmp/state-$run_n" --mib "$upload_mib" --repeat "$((repeat < 2 ? 2 : repeat))" \
      --build "$b" "${up_kinds[@]}" | tee -a "$results" >&2
  done
fi
# --- end part 4 ---

load_after=$(cut -d' ' -f1-3 /proc/loadavg)

# --- report ------------------------------------------------------------------------------------
echo
printf '<!-- bench/workers.sh --count %s --concurrency %s --duration %s --repeat %s --idle-workers %s --spares %s --priority %s, %s, %s x%s, Linux %s, load average before %s after %s -->\n' \
  "$count" "$concurrency" "$duration" "$repeat" "$idle_workers" "$spares" "$priority" "$(utc_minute)" \
  "$(cpu_model)" "$(nproc)" "$(uname -r)" "$load_before" "$load_after"
awk -v conns="$conns" -v threads="$threads" -v nbuilds="${#builds[@]}" -v basebin="${bin_of[baseline]:-}" \
    -v kindlist="$kinds" -v concs="1,$concurrency" '
  function who(kind, build) { return (nbuilds > 1) ? kind " (" build ")" : kind }
  function ratio(x, y) { return (x > 0 && y > 0) ? sprintf("%.3f", x / y) : "-" }
  function row(kind, what, fmt, b, c) {
    printf "| %s | %s | " fmt " | " fmt " | %s |\n", kind, what, b, c, ratio(c, b)
  }
  $1 == "first" { first[++nf] = $0 }
  $1 == "proxy" { proxy[++np] = $0 }
  $1 == "memory" { mem[++nm] = $0 }
  $1 == "upload" { up[++nu] = $0 }  # part 4 (issue 14)
  END {
    if (nu) {  # part 4 (issue 14)
      print ""
      print "Upload MiB/s (POST /count, the body streamed; server RSS growth: its peak during the proxied uploads):"
      print ""
      print "| worker | how | MiB/s | server RSS growth KiB |"
      print "| --- | --- | ---: | ---: |"
      for (i = 1; i <= nu; i++) {
        split(up[i], f, " ")
        printf "| %s | %s | %s | %s |\n", who(f[2], f[6]), f[3], f[4], f[5]
      }
    }
    if (nf) {
      print ""
      print "First request to a new address (fork -> response), ms:"
      print ""
      print "| worker | concurrency | requests | median | p90 | p99 | max | starts/s | errors |"
      print "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
      for (i = 1; i <= nf; i++) {
        split(first[i], f, " ")
        printf "| %s | %s | %s | %.1f | %.1f | %.1f | %.1f | %s | %s |\n",
          who(f[2], f[12]), f[3], f[4], f[6], f[7], f[8], f[9], f[10], f[5]
        med[f[2], f[3], f[12]] = f[6]; conc[f[2], f[3]] = 1
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
          printf "| %s | %s | %.0f | - | - | - | - | %.2f us | %.2f us | %s |\n", who(f[2], f[12]), f[3], f[4], f[9], f[10], f[11]
        else
          printf "| %s | %s | %.0f | %s us | %s us | %.2f us | %.2f us | %.2f us | %.2f us | %s |\n",
            who(f[2], f[12]), f[3], f[4], f[5], f[6], f[7], f[8], f[9], f[10], f[11]
        k = f[2] SUBSEP f[12]
        if (f[3] == "direct") { d[k] += f[4]; nd[k]++ }
        if (f[3] == "proxied") { p[k] += f[4]; npx[k]++; ps[k] += f[7]; pv[k] += f[8] }
        if (f[3] ~ /^worker-uds-/) uds[f[2], f[3], f[12]] = f[4]
      }
      print ""
      for (k in d) if (npx[k]) {
        split(k, kb, SUBSEP)
        printf "%s: proxied/direct = %.3f (mean of %d runs each: %.0f / %.0f req/s)\n",
          who(kb[1], kb[2]), (p[k] / npx[k]) / (d[k] / nd[k]), nd[k], p[k] / npx[k], d[k] / nd[k]
      }
    }
    if (nm) {
      print ""
      print "Memory per idle worker (smaps_rollup, KiB):"
      print ""
      print "| worker | workers | PSS/worker | RSS/worker | USS/worker | corral supervisor+server PSS |"
      print "| --- | ---: | ---: | ---: | ---: | ---: |"
      for (i = 1; i <= nm; i++) {
        split(mem[i], f, " ")
        printf "| %s | %s | %s | %s | %s | %s |\n", who(f[2], f[8]), f[3], f[4], f[5], f[6], f[7]
        pss[f[2], f[8]] = f[4]; cpss[f[2], f[8]] = f[7]
      }
    }
    if (nbuilds < 2) exit
    print ""
    printf "corral against the baseline build (%s), side by side in this run (means over --repeat):\n", basebin
    print ""
    print "| worker | measure | baseline | corral | corral/baseline |"
    print "| --- | --- | ---: | ---: | ---: |"
    nk = split(kindlist, kl, ","); ncs = split(concs, cl, ",")
    for (ki = 1; ki <= nk; ki++) {
      w = kl[ki]
      b = w SUBSEP "baseline"; c = w SUBSEP "corral"
      if (npx[b] && npx[c]) {
        row(w, "direct req/s", "%.0f", d[b] / nd[b], d[c] / nd[c])
        row(w, "proxied req/s", "%.0f", p[b] / npx[b], p[c] / npx[c])
        row(w, "proxied/direct", "%.3f", (p[b] / npx[b]) / (d[b] / nd[b]), (p[c] / npx[c]) / (d[c] / nd[c]))
        row(w, "proxied: server CPU/req (us)", "%.2f", ps[b] / npx[b], ps[c] / npx[c])
        row(w, "proxied: supervisor CPU/req (us)", "%.2f", pv[b] / npx[b], pv[c] / npx[c])
        for (u = 0; u < 2; u++) {
          l = u ? "worker-uds-keepalive" : "worker-uds-close"
          if ((w, l, "baseline") in uds) row(w, l " req/s", "%.0f", uds[w, l, "baseline"], uds[w, l, "corral"])
        }
      }
      for (ci = 1; ci <= ncs; ci++)
        if ((w, cl[ci]) in conc)
          row(w, "first request median (ms), concurrency " cl[ci], "%.1f", med[w, cl[ci], "baseline"],
              med[w, cl[ci], "corral"])
      if ((w, "baseline") in pss) {
        row(w, "PSS per idle worker (KiB)", "%d", pss[w, "baseline"], pss[w, "corral"])
        row(w, "supervisor+server PSS (KiB)", "%d", cpss[w, "baseline"], cpss[w, "corral"])
      }
    }
  }' "$results"
