#!/usr/bin/env bash
# bench/run.sh: corral against nginx on this machine, one server at a time.
#
#   bench/run.sh [--duration S] [--warmup S] [--connections N] [--cases a,b,c,d]
#                [--priority rt|nice|none] [--floor yes|no] [--baseline PATH]
#                [--nginx yes|no]
#
# Cases: (a) GET /hello, 5-byte body, keep-alive; (b) GET /64k.bin, a 64 KiB static file;
# (c) /hello with 16 requests pipelined per write (bench/pipeline.lua); (d) /hello with
# "Connection: close" (a new TCP connection per request).
#
# Method: the server under test is pinned to CPU 0 (taskset -c 0; nginx: worker_processes 1, the
# master is pinned too but idle), wrk to CPU 1 (-t1 -c50). Servers run one at a time. Each case
# has a warm-up run that is not measured. "CPU/req" is CPU 0's busy time (user+nice+system+irq+
# softirq from /proc/stat) during the measured run divided by the requests wrk completed: it
# includes the kernel's TCP work done on CPU 0 on the server's behalf, not only the process.
# "proc CPU/req" is the server processes' own time on CPU (/proc/PID/schedstat) per request: a
# cross-check that ignores anything else that ran on CPU 0 (other builds filling idle time).
# Neither number is pass/fail: this script only measures.
# --floor yes (cases a, c, d) also measures bench/floor_server.c, which is not an HTTP server: one
# read and one send per request batch and nothing else. Its CPU per request is the kernel's share,
# the least any server making the same system calls can spend; a second table compares to it.
# And its io_uring twin, bench/floor_uring.c: the same reads and sends, submitted in batches.
# --priority (default rt when run as root, else none): the servers and wrk run under SCHED_FIFO
# (chrt -f 50) or nice -19, the same for both servers, so that other work on a shared machine
# (compilers) does not take CPU 0 or CPU 1 in the middle of a run and req/s stays comparable.
# nice does not help against processes in other cgroups. Cost of rt: the kernel's RT throttling
# (sched_rt_runtime_us, 950 ms per s) stalls a saturated server, which inflates p99 for both
# servers (tens of ms); compare p99 from a --priority none run on a quiet machine.
# --baseline PATH also measures a second corral binary (e.g. a release build of the commit before
# a change), started with the same arguments, pinned and loaded the same way, back to back with
# corral in every case (which of the two goes first alternates from case to case); a second table
# gives corral/baseline per case. Without it, one corral as before.
# --nginx no leaves nginx out (and its table): for comparing two corral builds where it is missing.
#
# Environment: CORRAL_BIN (use this binary, do not build), NGINX_BIN (default: nginx in PATH).
# Needs: wrk, nginx, curl, python3, taskset (scripts/deps.sh bench).
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
help_lines=2,37

duration=10
warmup=2
conns=50
cases="a,b,c,d"
priority=$(rt_if_root)
floor=no
baseline=""
with_nginx=yes
parse_flags "--duration duration --warmup warmup --connections conns --cases cases --priority priority
  --floor floor --baseline baseline --nginx with_nginx" "$@"
set_prio "$priority"

need_tools wrk curl python3 taskset
if [[ "$with_nginx" == yes ]]; then
  find_nginx
  need_tools "$nginx_bin"
elif [[ "$with_nginx" != no ]]; then
  echo "$self: --nginx yes|no" >&2
  exit 2
fi
need_cpus "(server on CPU 0, wrk on CPU 1)"
find_corral --fallback
if [[ -n "$baseline" ]]; then
  baseline="$(realpath "$baseline")"
  [[ -x "$baseline" ]] || { echo "$self: no baseline binary at $baseline" >&2; exit 2; }
fi

# --- fixtures ----------------------------------------------------------------------------------
make_tmp corral-bench
mkdir -p "$tmp/www"
head -c 65536 /dev/urandom >"$tmp/www/64k.bin"
printf 'hello' >"$tmp/www/hello.txt"
chmod -R a+rX "$tmp/www"
if [[ "$floor" == yes ]]; then
  need_tools cc
  cc -O2 -Wall -o "$tmp/floor_server" "$root/bench/floor_server.c"
  cc -O2 -Wall -o "$tmp/floor_uring" "$root/bench/floor_uring.c"
fi

# --- servers -----------------------------------------------------------------------------------
start_server() {  # $1 nginx|floor|uring|corral|baseline  $2 hello|static  $3 port
  local bin="$corral"
  case "$1" in
    nginx)
      write_nginx_conf "$3" "worker_processes 1;" "  sendfile on;
  types { text/plain txt; application/octet-stream bin; }
  default_type application/octet-stream;" "    root $tmp/www;
    location / { }"
      "${prio[@]}" taskset -c 0 "$nginx_bin" -p "$tmp" -c "$tmp/nginx.conf" -e "$tmp/nginx-error.log" \
        >"$tmp/server.out" 2>&1 &
      ;;
    floor)
      "${prio[@]}" taskset -c 0 "$tmp/floor_server" "$3" >"$tmp/server.out" 2>&1 &
      ;;
    uring)
      "${prio[@]}" taskset -c 0 "$tmp/floor_uring" "$3" >"$tmp/server.out" 2>&1 &
      ;;
    corral|baseline)
      [[ "$1" == baseline ]] && bin="$baseline"
      if [[ "$2" == static ]]; then
        "${prio[@]}" taskset -c 0 "$bin" serve "$tmp/www" --config "$tmp/plain.toml" --listen "127.0.0.1:$3" --no-access-log \
          --log-level warn >"$tmp/server.out" 2>&1 &
      else
        "${prio[@]}" taskset -c 0 "$bin" serve --config "$tmp/plain.toml" --listen "127.0.0.1:$3" --no-access-log \
          --log-level warn >"$tmp/server.out" 2>&1 &
      fi
      ;;
  esac
  server_pid=$!
  if [[ "$2" == static ]]; then
    await_body "$1" "http://127.0.0.1:$3/64k.bin" 65536
  else
    await_body "$1" "http://127.0.0.1:$3/hello" 5
  fi
}

results="$tmp/results.txt"
: >"$results"

measure() {  # $1 case  $2 server  $3 port
  local path="/hello" extra=()
  case "$1" in
    b) path="/64k.bin" ;;
    c) extra=(-s "$root/bench/pipeline.lua") ;;
    d) extra=(-H "Connection: close") ;;
  esac
  local url="http://127.0.0.1:$3$path"
  local wrk_cmd=("${prio[@]}" taskset -c 1 wrk -t1 "-c$conns" --latency "${extra[@]}")
  "${wrk_cmd[@]}" "-d${warmup}s" "$url" >/dev/null 2>&1 || true
  local c0 p0 c1 p1 out
  c0=$(busy_jiffies cpu0)
  p0=$(proc_cpu_ns "$server_pid")
  out=$("${wrk_cmd[@]}" "-d${duration}s" "$url" 2>&1)
  c1=$(busy_jiffies cpu0)
  p1=$(proc_cpu_ns "$server_pid")
  echo "$out" >"$tmp/wrk-$1-$2.txt"
  local reqs rps p99 errors non2xx
  wrk_fields "$out"
  if [[ "$p99" == 0 ]]; then
    # wrk 4.1 prints "99% 0.00us" for some pipelined runs (its percentile walk runs off the
    # histogram); the table says n/a rather than 0.
    echo "run.sh: case $1 on $2: wrk reported no usable p99" >&2
  fi
  wrk_ran "$out" "for case $1 on $2" || return 1
  local cpu_us proc_us
  cpu_us=$(awk -v d=$((c1 - c0)) -v hz="$hz" -v n="$reqs" 'BEGIN { printf "%.2f", d * 1e6 / hz / n }')
  proc_us=$(awk -v d=$((p1 - p0)) -v n="$reqs" 'BEGIN { printf "%.2f", d / 1e3 / n }')
  echo "$1 $2 $rps $p99 $cpu_us $proc_us ${errors:-0} ${non2xx:-0} $reqs" >>"$results"
  printf 'run.sh: case %s %-8s %10s req/s  p99 %6s us  cpu/req %6s us  proc/req %6s us  errors %s non2xx %s\n' \
    "$1" "$2" "$rps" "$p99" "$cpu_us" "$proc_us" "${errors:-0}" "${non2xx:-0}" >&2
}

# Warn when CPU 0 is not quiet: other work there inflates "CPU/req" (not "proc CPU/req").
c0=$(busy_jiffies cpu0); sleep 1; c1=$(busy_jiffies cpu0)
idle_busy=$(awk -v d=$((c1 - c0)) -v hz="$hz" 'BEGIN { printf "%.0f", d * 100 / hz }')
if [[ "$idle_busy" -gt 5 ]]; then
  echo "run.sh: warning: CPU 0 was ${idle_busy}% busy before the run; CPU/req will be inflated" >&2
fi

IFS=, read -ra case_list <<<"$cases"
n_case=0
for c in "${case_list[@]}"; do
  kind=hello
  [[ "$c" == b ]] && kind=static
  servers=()
  [[ "$with_nginx" == yes ]] && servers+=(nginx)
  if [[ -z "$baseline" ]]; then
    servers+=(corral)
  elif (( n_case++ % 2 == 0 )); then  # the two builds take turns going first: no order bias
    servers+=(baseline corral)
  else
    servers+=(corral baseline)
  fi
  [[ "$floor" == yes && "$c" != b ]] && servers+=(floor uring)
  for server in "${servers[@]}"; do
    port=$(free_port)
    start_server "$server" "$kind" "$port"
    measure "$c" "$server" "$port"
    stop_server
  done
done

# --- report ------------------------------------------------------------------------------------
awk -v dur="$duration" -v conns="$conns" -v prio="$priority" -v date="$(utc_minute)" -v cpumodel="$(cpu_model)" \
    -v kernel="$(uname -r)" -v nginxv="$([[ "$with_nginx" == no ]] || nginx_version)" -v basebin="$baseline" '
  function name(c) {
    if (c == "a") return "(a) 5-byte, keep-alive";
    if (c == "b") return "(b) 64 KiB static file";
    if (c == "c") return "(c) 5-byte, 16-deep pipeline";
    if (c == "d") return "(d) 5-byte, Connection: close";
    return c;
  }
  function ratio(x, y) { return (x > 0 && y > 0) ? sprintf("%.2f", x / y) : "-" }
  function lat(x, unit) { return (x > 0) ? sprintf("%d%s", x, unit) : "n/a" }
  {
    seen[$1] = 1; if (!($1 in order)) { order[$1] = ++n; cases[n] = $1 }
    rps[$1, $2] = $3; p99[$1, $2] = $4; cpu[$1, $2] = $5; proc[$1, $2] = $6;
    err[$1, $2] = $7 + $8;
  }
  END {
    nginx = 0
    for (i = 1; i <= n; i++) if ((cases[i], "nginx") in proc) nginx++
    if (nginx) {
      printf "\n%-30s | %10s %10s %6s | %9s %8s %6s | %7s %7s %6s | %7s %7s %6s\n",
        "case", "nginx r/s", "corral r/s", "ratio", "nginx p99", "corral", "ratio",
        "nginx", "corral", "ratio", "nginx", "corral", "ratio"
      printf "%-30s | %29s | %25s | %23s | %23s\n", "", "requests/s", "p99 latency (us)",
        "CPU 0 us/request", "process us/request"
      for (i = 1; i <= n; i++) {
        c = cases[i]
        printf "%-30s | %10.0f %10.0f %6s | %9s %8s %6s | %7.2f %7.2f %6s | %7.2f %7.2f %6s\n",
          name(c), rps[c, "nginx"], rps[c, "corral"], ratio(rps[c, "corral"], rps[c, "nginx"]),
          lat(p99[c, "nginx"], ""), lat(p99[c, "corral"], ""), ratio(p99[c, "corral"], p99[c, "nginx"]),
          cpu[c, "nginx"], cpu[c, "corral"], ratio(cpu[c, "corral"], cpu[c, "nginx"]),
          proc[c, "nginx"], proc[c, "corral"], ratio(proc[c, "corral"], proc[c, "nginx"])
      }
    }
    print ""
    printf "<!-- bench/run.sh --duration %s --priority %s, %s, %s, Linux %s, nginx %s, wrk -t1 -c%s -->\n",
      dur, prio, date, cpumodel, kernel, nginx ? nginxv : "not run", conns
    if (nginx) {
      print "| case | nginx req/s | corral req/s | corral/nginx | nginx p99 | corral p99 | corral/nginx | nginx CPU/req | corral CPU/req | corral/nginx | nginx proc CPU/req | corral proc CPU/req | corral/nginx |"
      print "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
      for (i = 1; i <= n; i++) {
        c = cases[i]
        printf "| %s | %.0f | %.0f | %s | %s | %s | %s | %.2f us | %.2f us | %s | %.2f us | %.2f us | %s |\n",
          name(c), rps[c, "nginx"], rps[c, "corral"], ratio(rps[c, "corral"], rps[c, "nginx"]),
          lat(p99[c, "nginx"], " us"), lat(p99[c, "corral"], " us"), ratio(p99[c, "corral"], p99[c, "nginx"]),
          cpu[c, "nginx"], cpu[c, "corral"], ratio(cpu[c, "corral"], cpu[c, "nginx"]),
          proc[c, "nginx"], proc[c, "corral"], ratio(proc[c, "corral"], proc[c, "nginx"])
        if (err[c, "nginx"] + err[c, "corral"] > 0)
          printf "\n(case %s: socket errors or non-2xx: nginx %d, corral %d)\n", c, err[c, "nginx"], err[c, "corral"] > "/dev/stderr"
      }
    }
    bases = 0
    for (i = 1; i <= n; i++) if ((cases[i], "baseline") in proc) bases++
    if (bases) {
      print ""
      printf "corral against the baseline build (%s), side by side in this run:\n", basebin
      print ""
      print "| case | baseline req/s | corral req/s | corral/baseline | baseline p99 | corral p99 | corral/baseline | baseline CPU/req | corral CPU/req | corral/baseline | baseline proc CPU/req | corral proc CPU/req | corral/baseline |"
      print "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
      for (i = 1; i <= n; i++) {
        c = cases[i]
        if (!((c, "baseline") in proc)) continue
        printf "| %s | %.0f | %.0f | %s | %s | %s | %s | %.2f us | %.2f us | %s | %.2f us | %.2f us | %s |\n",
          name(c), rps[c, "baseline"], rps[c, "corral"], ratio(rps[c, "corral"], rps[c, "baseline"]),
          lat(p99[c, "baseline"], " us"), lat(p99[c, "corral"], " us"), ratio(p99[c, "corral"], p99[c, "baseline"]),
          cpu[c, "baseline"], cpu[c, "corral"], ratio(cpu[c, "corral"], cpu[c, "baseline"]),
          proc[c, "baseline"], proc[c, "corral"], ratio(proc[c, "corral"], proc[c, "baseline"])
        if (err[c, "baseline"] > 0)
          printf "\n(case %s: socket errors or non-2xx: baseline %d)\n", c, err[c, "baseline"] > "/dev/stderr"
      }
    }
    floors = 0
    for (i = 1; i <= n; i++) if ((cases[i], "floor") in proc) floors++
    if (floors) {
      print ""
      print "Against the floor (bench/floor_server.c: the same system calls, no HTTP work; uring:"
      print "bench/floor_uring.c, the same reads and sends batched through io_uring). CPU 0 busy per request:"
      print ""
      print "| case | floor req/s | floor | uring | nginx | corral | floor/nginx | uring/nginx | corral/nginx | corral/floor | proc: floor | uring | nginx | corral |"
      print "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
      for (i = 1; i <= n; i++) {
        c = cases[i]
        if (!((c, "floor") in proc)) continue
        printf "| %s | %.0f | %.2f us | %.2f us | %.2f us | %.2f us | %s | %s | %s | %s | %.2f us | %.2f us | %.2f us | %.2f us |\n",
          name(c), rps[c, "floor"], cpu[c, "floor"], cpu[c, "uring"], cpu[c, "nginx"], cpu[c, "corral"],
          ratio(cpu[c, "floor"], cpu[c, "nginx"]), ratio(cpu[c, "uring"], cpu[c, "nginx"]),
          ratio(cpu[c, "corral"], cpu[c, "nginx"]), ratio(cpu[c, "corral"], cpu[c, "floor"]),
          proc[c, "floor"], proc[c, "uring"], proc[c, "nginx"], proc[c, "corral"]
      }
    }
  }' "$results"
