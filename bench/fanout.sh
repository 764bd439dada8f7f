#!/usr/bin/env bash
# bench/fanout.sh: corral --processes 1 and 2 against nginx worker_processes 1 and 2.
#
#   bench/fanout.sh [--rounds R] [--duration S] [--warmup S] [--threads T] [--connections C]
#                   [--cases n1,c1,n2,c2,n2r,n2p,c2p] [--priority rt|nice|none]
#
# Cases (one server at a time, GET /hello, 5-byte body, keep-alive):
#   n1   nginx worker_processes 1
#   c1   corral serve --processes 1 (one process, no supervisor)
#   n2   nginx worker_processes 2 (plain `listen`: one shared socket, the workers' epoll uses
#        EPOLLEXCLUSIVE; this is nginx's default)
#   c2   corral serve --processes 2 (supervisor + 2 children, one SO_REUSEPORT socket each)
#   n2r  nginx worker_processes 2, `listen ... reuseport` (same distribution as corral's)
#   n2p  nginx worker_processes 2, reuseport, worker_cpu_affinity auto (pinned)
#   c2p  corral serve --processes 2 --pin (process i on CPU i)
#
# Method: the servers are NOT pinned as a whole (two processes need both CPUs) and wrk
# (-t2 -c64 --latency) is not pinned either: server and load generator share the 2 CPUs, so
# req/s is the throughput of the whole machine, not of the server alone. Each case: start, check
# that /hello answers exactly 5 bytes, a warm-up wrk run that is not measured, then the measured
# run. Cases are interleaved round by round (n1 c1 n2 ... n1 c1 n2 ...) so that a noisy stretch
# on a shared machine hits all of them, and the table reports the median of the rounds for each
# number separately.
#   machine CPU/req: busy time of all CPUs (user+nice+system+irq+softirq, /proc/stat) over the
#     run / requests. Includes wrk, the kernel's TCP work on both sides, and anything else that
#     ran on the machine.
#   server CPU/req: time on CPU of the server's processes (nginx master + workers, corral
#     supervisor + children; every thread, /proc/PID/task/TID/schedstat, exact ns) / requests.
#     Immune to other load; the fairer comparison.
#   wrk CPU/req: wrk's user+sys time (GNU time) / requests: what the load generator costs.
#   split: share of server CPU taken by each worker process (N=2), e.g. 50/50 = even.
# --priority (default rt as root): servers and wrk run under chrt -f 50 (rt) or nice -19 so
# that other work on a shared machine does not take the CPUs mid-run (see bench/run.sh).
#
# Environment: CORRAL_BIN (use this binary, do not build), NGINX_BIN (default: nginx in PATH).
# Needs: wrk, nginx, curl, python3 (scripts/deps.sh bench).
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
help_lines=2,36

rounds=3
duration=10
warmup=2
threads=2
conns=64
cases="n1,c1,n2,c2,n2r,n2p,c2p"
priority=$(rt_if_root)
parse_flags "--rounds rounds --duration duration --warmup warmup --threads threads --connections conns
  --cases cases --priority priority" "$@"
set_prio "$priority"

find_nginx
need_tools wrk curl python3 "$nginx_bin"
need_cpus
find_corral

# --- fixtures ----------------------------------------------------------------------------------
make_tmp corral-fanout
mkdir -p "$tmp/state"

nginx_conf() {  # $1 port  $2 workers  $3 reuseport(0/1)  $4 affinity(0/1)
  local listen_opts="" affinity=""
  [[ "$3" == 1 ]] && listen_opts=" reuseport"
  [[ "$4" == 1 ]] && affinity="worker_cpu_affinity auto;"
  write_nginx_conf "$1$listen_opts" "worker_processes $2;
$affinity" "" ""
}

start_server() {  # $1 case  $2 port
  case "$1" in
    n1) nginx_conf "$2" 1 0 0 ;;
    n2) nginx_conf "$2" 2 0 0 ;;
    n2r) nginx_conf "$2" 2 1 0 ;;
    n2p) nginx_conf "$2" 2 1 1 ;;
  esac
  case "$1" in
    n*)
      "${prio[@]}" "$nginx_bin" -p "$tmp" -c "$tmp/nginx.conf" -e "$tmp/nginx-error.log" \
        >"$tmp/server.out" 2>&1 &
      ;;
    c1|c2|c2p)
      local extra=()
      case "$1" in
        c1) extra=(--processes 1) ;;
        c2) extra=(--processes 2) ;;
        c2p) extra=(--processes 2 --pin) ;;
      esac
      "${prio[@]}" "$corral" serve --listen "127.0.0.1:$2" --no-access-log --log-level warn \
        --state-dir "$tmp/state" "${extra[@]}" >"$tmp/server.out" 2>&1 &
      ;;
    *) echo "fanout.sh: unknown case '$1'" >&2; return 1 ;;
  esac
  server_pid=$!
  await_body "$1" "http://127.0.0.1:$2/hello" 5 || return 1
  # All workers up: nginx master + N workers, corral supervisor + N children.
  local want=0
  case "$1" in n2*|c2*) want=2 ;; esac
  for _ in $(seq 50); do
    [[ $(children "$server_pid" | wc -w) -ge $want ]] && return 0
    sleep 0.1
  done
  echo "fanout.sh: $1: expected $want worker processes, found $(children "$server_pid" | wc -w)" >&2
  return 1
}

children() {  # direct child processes of $1
  cat /proc/"$1"/task/*/children 2>/dev/null || true
}

# "total child1 child2 ..." for the server's process tree (the root and its direct children).
tree_cpu_ns() {
  local total kids=() k t
  total=$(threads_cpu_ns "$1")
  # shellcheck disable=SC2207
  kids=($(children "$1"))
  local out=""
  for k in "${kids[@]}"; do
    t=$(threads_cpu_ns "$k")
    total=$((total + t))
    out+=" $k:$t"
  done
  echo "$total$out"
}

results="$tmp/results.txt"
: >"$results"

measure() {  # $1 case  $2 port  $3 round
  local url="http://127.0.0.1:$2/hello"
  local wrk_cmd=(wrk "-t$threads" "-c$conns" --latency)
  "${prio[@]}" "${wrk_cmd[@]}" "-d${warmup}s" "$url" >/dev/null 2>&1 || true
  # wrk's own CPU (user+sys seconds) from GNU time, when there is one.
  local timed=()
  [[ -x /usr/bin/time ]] && timed=(/usr/bin/time -o "$tmp/wrk.time" -f "%U %S")
  rm -f "$tmp/wrk.time"
  local m0 m1 p0 p1 out load
  load=$(cut -d' ' -f1 /proc/loadavg)
  m0=$(busy_jiffies)
  p0=$(tree_cpu_ns "$server_pid")
  out=$("${prio[@]}" "${timed[@]}" "${wrk_cmd[@]}" "-d${duration}s" "$url" 2>&1)
  m1=$(busy_jiffies)
  p1=$(tree_cpu_ns "$server_pid")
  local reqs rps p99 errors non2xx
  wrk_fields "$out"
  wrk_ran "$out" "for $1" || return 1
  # Server CPU and the per-worker split (children present at both samples).
  local stats
  stats=$(awk -v a="$p0" -v b="$p1" -v n="$reqs" 'BEGIN {
    na = split(a, A, " "); nb = split(b, B, " ");
    for (i = 2; i <= na; i++) { split(A[i], kv, ":"); before[kv[1]] = kv[2] }
    total = B[1] - A[1]; split_s = "";
    for (i = 2; i <= nb; i++) {
      split(B[i], kv, ":");
      if (kv[1] in before) { d[++k] = kv[2] - before[kv[1]]; sum += d[k] }
    }
    if (k >= 2 && sum > 0) {
      for (i = 1; i <= k; i++) split_s = split_s (i > 1 ? "/" : "") sprintf("%.0f", 100 * d[i] / sum)
    } else split_s = "-";
    printf "%.2f %s", total / 1e3 / n, split_s }')
  local server_us split machine_us
  server_us=${stats% *}
  split=${stats#* }
  machine_us=$(awk -v d=$((m1 - m0)) -v hz="$hz" -v n="$reqs" 'BEGIN { printf "%.2f", d * 1e6 / hz / n }')
  local wrk_us=-1
  [[ -s "$tmp/wrk.time" ]] && wrk_us=$(awk -v n="$reqs" 'END { printf "%.2f", ($1 + $2) * 1e6 / n }' "$tmp/wrk.time")
  echo "$1 $3 $rps $p99 $machine_us $server_us $split ${errors:-0} ${non2xx:-0} $reqs $load $wrk_us" >>"$results"
  printf 'fanout.sh: round %s %-4s %10s req/s  p99 %6s us  machine %5s us/req  server %5s us/req  wrk %5s us/req  split %-6s errors %s non2xx %s  load %s\n' \
    "$3" "$1" "$rps" "$p99" "$machine_us" "$server_us" "$wrk_us" "$split" "${errors:-0}" "${non2xx:-0}" "$load" >&2
}

load_start=$(cut -d' ' -f1-3 /proc/loadavg)
echo "fanout.sh: load average before: $load_start" >&2
IFS=, read -ra case_list <<<"$cases"
for ((r = 1; r <= rounds; r++)); do
  for c in "${case_list[@]}"; do
    port=$(free_port)
    start_server "$c" "$port"
    measure "$c" "$port" "$r"
    stop_server
  done
done
load_end=$(cut -d' ' -f1-3 /proc/loadavg)
echo "fanout.sh: load average after: $load_end" >&2

# --- report ------------------------------------------------------------------------------------
awk -v rounds="$rounds" -v dur="$duration" -v threads="$threads" -v conns="$conns" -v prio="$priority" \
    -v date="$(utc_minute)" -v cpumodel="$(cpu_model)" -v kernel="$(uname -r)" -v nginxv="$(nginx_version)" \
    -v load0="$load_start" -v load1="$load_end" '
  function name(c) {
    if (c == "n1") return "nginx `worker_processes 1`";
    if (c == "c1") return "corral `--processes 1`";
    if (c == "n2") return "nginx `worker_processes 2`";
    if (c == "n2r") return "nginx `worker_processes 2`, `reuseport`";
    if (c == "c2") return "corral `--processes 2`";
    if (c == "n2p") return "nginx `worker_processes 2`, `reuseport`, `worker_cpu_affinity auto`";
    if (c == "c2p") return "corral `--processes 2 --pin`";
    return c;
  }
  function median(c, f,    n, i, j, t, v) {
    n = cnt[c]
    for (i = 1; i <= n; i++) v[i] = val[c, f, i]
    for (i = 2; i <= n; i++) for (j = i; j > 1 && v[j-1] > v[j]; j--) { t = v[j]; v[j] = v[j-1]; v[j-1] = t }
    if (n % 2) return v[(n + 1) / 2]
    return (v[n / 2] + v[n / 2 + 1]) / 2
  }
  function ratio(x, y) { return (x > 0 && y > 0) ? sprintf("%.2f", x / y) : "-" }
  {
    c = $1
    if (!(c in cnt)) { order[++nc] = c }
    i = ++cnt[c]
    val[c, "rps", i] = $3; val[c, "p99", i] = $4; val[c, "mach", i] = $5; val[c, "srv", i] = $6
    val[c, "wrk", i] = $12
    splits[c] = splits[c] (i > 1 ? ", " : "") $7
    err[c] += $8 + $9
    rps_all[c] = rps_all[c] (i > 1 ? ", " : "") sprintf("%.0f", $3)
  }
  END {
    for (k = 1; k <= nc; k++) {
      c = order[k]
      R[c] = median(c, "rps"); P[c] = median(c, "p99"); M[c] = median(c, "mach"); S[c] = median(c, "srv")
      W[c] = median(c, "wrk")
    }
    printf "\n<!-- bench/fanout.sh --rounds %s --duration %s --priority %s, %s, load %s -> %s, %s, Linux %s, nginx %s, wrk -t%s -c%s -->\n",
      rounds, dur, prio, date, load0, load1, cpumodel, kernel, nginxv, threads, conns
    print "| server | req/s | p99 | machine CPU/req | server CPU/req | wrk CPU/req | worker CPU split | req/s of each round |"
    print "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
    for (k = 1; k <= nc; k++) {
      c = order[k]
      printf "| %s | %.0f | %d us | %.2f us | %.2f us | %s | %s | %s |\n", name(c), R[c], P[c], M[c], S[c],
        (W[c] >= 0 ? sprintf("%.2f us", W[c]) : "-"),
        (c ~ /2/ ? splits[c] : "-"), rps_all[c]
    }
    print ""
    print "| comparison | req/s corral/nginx | p99 corral/nginx | machine CPU/req corral/nginx | server CPU/req corral/nginx |"
    print "| --- | ---: | ---: | ---: | ---: |"
    np = split("c1:n1 c2:n2 c2:n2r c2p:n2p", pairs, " ")
    for (k = 1; k <= np; k++) {
      split(pairs[k], ab, ":"); a = ab[1]; b = ab[2]
      if (!(a in R) || !(b in R)) continue
      printf "| %s vs %s | %s | %s | %s | %s |\n", name(a), name(b), ratio(R[a], R[b]), ratio(P[a], P[b]),
        ratio(M[a], M[b]), ratio(S[a], S[b])
    }
    print ""
    print "| scaling 1 -> 2 processes | nginx | corral |"
    print "| --- | ---: | ---: |"
    if (("n1" in R) && ("c1" in R)) {
      if ("n2" in R && "c2" in R) printf "| req/s, N=2 / N=1 (nginx default listen) | %s | %s |\n", ratio(R["n2"], R["n1"]), ratio(R["c2"], R["c1"])
      if ("n2r" in R && "c2" in R) printf "| req/s, N=2 / N=1 (nginx reuseport) | %s | %s |\n", ratio(R["n2r"], R["n1"]), ratio(R["c2"], R["c1"])
      if ("n2p" in R && "c2p" in R) printf "| req/s, N=2 pinned / N=1 | %s | %s |\n", ratio(R["n2p"], R["n1"]), ratio(R["c2p"], R["c1"])
    }
    for (k = 1; k <= nc; k++) if (err[order[k]] > 0)
      printf "fanout.sh: %s: socket errors or non-2xx: %d\n", order[k], err[order[k]] > "/dev/stderr"
  }' "$results"
