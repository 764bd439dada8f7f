#!/usr/bin/env bash
# bench/ws_bench.sh: WebSocket echo, corral against a Node `ws` echo server, on this machine.
#
#   bench/ws_bench.sh [--duration S] [--warmup S] [--clients N] [--window W] [--sizes 64,65536]
#                     [--priority rt|nice|none]
#
# Servers: (a) corral release, `corral serve --config EMPTY --listen 127.0.0.1:PORT --no-access-log` (its embedded
# site's /ws/echo); (b) bench/ws_echo_server.mjs (Node's `ws`, same route, no permessage-deflate).
# Each is pinned to CPU 0 (taskset -c 0), one at a time; the load is bench/ws_bench.mjs on CPU 1:
# N clients in one Node process, each keeping W messages in flight (an echo answered with the
# next message), no permessage-deflate. For each size: a warm-up run, then the measured run.
# Reported: echoed messages/s (and MiB/s each way), and the server's own CPU time per message from
# /proc/PID/schedstat (the cleaner comparison when the single-threaded client is the limit).
# --priority (default none; unlike bench/run.sh): rt runs servers and client under chrt -f 50,
# nice under nice -19. rt distorts this benchmark: a SCHED_FIFO server wakes for every message
# instead of reading a batch (corral measured 20.8 us CPU per 64-byte echo at 36k msg/s under rt,
# 4.3 us at 100k msg/s without), so the default is none.
#
# Environment: CORRAL_BIN (use this binary, do not build), NODE (default: node in PATH).
# Needs: node, npm (tests/node's `ws`), taskset, 2 CPUs.
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
help_lines=2,20

duration=10
warmup=2
clients=50
window=8
sizes="64,65536"
priority=none
parse_flags "--duration duration --warmup warmup --clients clients --window window --sizes sizes
  --priority priority" "$@"
set_prio "$priority"

node_bin="${NODE:-$(command -v node || true)}"
need_tools --no-hint "$node_bin" taskset python3
need_cpus "(server on CPU 0, clients on CPU 1)"
if [[ ! -d "$root/tests/node/node_modules/ws" ]]; then
  echo "ws_bench.sh: installing tests/node (npm ci) for the ws package" >&2
  (cd "$root/tests/node" && npm ci --silent --no-audit --no-fund >/dev/null)
fi

# --- build -------------------------------------------------------------------------------------
find_corral

make_tmp corral-ws-bench

start_server() {  # $1 corral|node  $2 port
  case "$1" in
    corral)
      "${prio[@]}" taskset -c 0 "$corral" serve --config "$tmp/plain.toml" --listen "127.0.0.1:$2" --no-access-log \
        --log-level warn >"$tmp/server.out" 2>&1 &
      ;;
    node)
      "${prio[@]}" taskset -c 0 "$node_bin" "$root/bench/ws_echo_server.mjs" --listen "127.0.0.1:$2" \
        >"$tmp/server.out" 2>&1 &
      ;;
  esac
  server_pid=$!
  local url="ws://127.0.0.1:$2/ws/echo"
  poll_while_alive "$server_pid" "$node_bin" "$root/bench/ws_bench.mjs" --url "$url" --probe 2>/dev/null &&
    return 0
  echo "ws_bench.sh: $1 did not echo on $url; its output:" >&2
  cat "$tmp/server.out" >&2 || true
  return 1
}

results="$tmp/results.txt"
: >"$results"

measure() {  # $1 server  $2 port  $3 size
  local load=("${prio[@]}" taskset -c 1 "$node_bin" "$root/bench/ws_bench.mjs"
              --url "ws://127.0.0.1:$2/ws/echo" --clients "$clients" --window "$window" --size "$3")
  "${load[@]}" --warmup 0 --duration "$warmup" >/dev/null
  local p0 p1 out
  p0=$(threads_cpu_ns "$server_pid")
  out=$("${load[@]}" --warmup 1 --duration "$duration")
  p1=$(threads_cpu_ns "$server_pid")
  # msg/s is over the measured interval; the server's CPU time covers the whole client run
  # (its 1 s warm-up included), so CPU/message divides by every echo of that run.
  local rate messages cpu_us
  rate=$(sed -E 's/.*"rate":([0-9]+).*/\1/' <<<"$out")
  messages=$(sed -E 's/.*"total_messages":([0-9]+).*/\1/' <<<"$out")
  cpu_us=$(awk -v d=$((p1 - p0)) -v n="$messages" 'BEGIN { printf "%.2f", d / 1e3 / n }')
  echo "$3 $1 $rate $cpu_us $messages" >>"$results"
  printf 'ws_bench.sh: %6s bytes %-6s %9s msg/s  server CPU %6s us/msg  (%s)\n' \
    "$3" "$1" "$rate" "$cpu_us" "$out" >&2
}

IFS=, read -ra size_list <<<"$sizes"
for size in "${size_list[@]}"; do
  for server in corral node; do
    port=$(free_port)
    start_server "$server" "$port"
    measure "$server" "$port" "$size"
    stop_server
  done
done

# --- report ------------------------------------------------------------------------------------
ws_version=$("$node_bin" -p "require('$root/tests/node/node_modules/ws/package.json').version")
awk -v dur="$duration" -v clients="$clients" -v window="$window" -v prio="$priority" \
    -v date="$(utc_minute)" -v cpumodel="$(cpu_model)" -v kernel="$(uname -r)" \
    -v nodev="$("$node_bin" --version)" -v wsv="$ws_version" '
  function name(s) { return s >= 1024 ? sprintf("%d KiB", s / 1024) : sprintf("%d B", s) }
  function ratio(x, y) { return (x > 0 && y > 0) ? sprintf("%.2f", x / y) : "-" }
  {
    if (!($1 in seen)) { seen[$1] = 1; order[++n] = $1 }
    rate[$1, $2] = $3; cpu[$1, $2] = $4
  }
  END {
    printf "\n<!-- bench/ws_bench.sh --duration %s --clients %s --window %s --priority %s, %s, %s, Linux %s, node %s, ws %s -->\n",
      dur, clients, window, prio, date, cpumodel, kernel, nodev, wsv
    print "| message | corral msg/s | node ws msg/s | corral/node | corral MiB/s | corral CPU/msg | node ws CPU/msg | corral/node |"
    print "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    for (i = 1; i <= n; i++) {
      s = order[i]
      printf "| %s | %d | %d | %s | %.1f | %.2f us | %.2f us | %s |\n", name(s),
        rate[s, "corral"], rate[s, "node"], ratio(rate[s, "corral"], rate[s, "node"]),
        rate[s, "corral"] * s / 1048576, cpu[s, "corral"], cpu[s, "node"],
        ratio(cpu[s, "corral"], cpu[s, "node"])
    }
  }' "$results"
