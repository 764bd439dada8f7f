#!/usr/bin/env bash
# bench/metrics_scrape.sh: what scraping GET /metrics costs corral under load.
#
#   bench/metrics_scrape.sh [--rounds R] [--duration S] [--warmup S] [--connections N]
#                           [--interval S] [--scraper curl|keepalive|curl-noop]
#                           [--scraper-cpu any|0|1]
#                           [--priority rt|nice|none]
#
# Method: bench/run.sh's case (a), GET /hello (5-byte body, keep-alive) by wrk -t1 -cN pinned to
# CPU 1, against `corral serve --admin-listen 127.0.0.1:PORT`: one server process under its
# supervisor (the admin listener needs one), both pinned to CPU 0 as bench/run.sh pins the server
# (the supervisor renders the scrapes there, next to the process it measures). Runs alternate
# without and with a loop that scrapes the admin listener every --interval seconds (default 0.1)
# with curl, the operator's loop:
#
#   while :; do curl -s http://127.0.0.1:PORT/metrics >/dev/null; sleep 0.1; done
#
# --scraper keepalive scrapes from one Python process on one keep-alive connection instead (what
# Prometheus does): no fork and exec of curl ten times a second, whose own CPU time, on a machine
# of two CPUs that the load keeps busy, is most of what the curl loop costs the benchmark.
# --scraper curl-noop is the control for that: the same loop with `curl -s file:///dev/null`,
# which does not reach corral at all.
# --scraper-cpu: where the scraper runs: any (default: unpinned, the loop as written), 1 (with
# wrk) or 0 (with corral). Each round runs "off" then "on", the next "on" then "off" (no order
# bias); every run has a warm-up that is not measured. Printed per run: req/s, the server
# process's CPU time per request (/proc/PID/schedstat: robust to other load on the machine, which
# req/s is not), scrapes made, the supervisor's CPU per scrape and its share of a CPU (of CPU 0,
# which it shares with the server process: what scraping takes from it); then the mean of each
# without and with scraping, and the ratio of the req/s. Only measures; nothing is pass/fail.
# --priority (default none here: under rt a busy wrk on CPU 1 would starve an unpinned curl loop):
# as bench/run.sh.
#
# Environment: CORRAL_BIN (use this binary, do not build). Needs: wrk, curl, python3, taskset.
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
help_lines=2,33

rounds=2
duration=10
warmup=2
conns=50
interval=0.1
scraper_cpu=any
scraper_kind=curl
priority=none
parse_flags "--rounds rounds --duration duration --warmup warmup --connections conns
  --interval interval --scraper scraper_kind --scraper-cpu scraper_cpu --priority priority" "$@"
set_prio "$priority"
need_tools wrk curl python3 taskset
need_cpus "(corral on CPU 0, wrk on CPU 1)"
find_corral --fallback
case "$scraper_cpu" in
  any) scraper=() ;;
  0|1) scraper=(taskset -c "$scraper_cpu") ;;
  *) echo "$self: --scraper-cpu any|0|1" >&2; exit 2 ;;
esac
case "$scraper_kind" in
  curl) scrape_url="" ;;  # the admin listener's /metrics, once its port is known
  curl-noop) scrape_url="file:///dev/null" ;;
  keepalive) ;;
  *) echo "$self: --scraper curl|keepalive|curl-noop" >&2; exit 2 ;;
esac

make_tmp corral-metrics-bench
scrape_pid=""
cleanup() {
  stop_pid "$scrape_pid"
  stop_server
  rm -rf "$tmp"
}

port=$(free_port)
admin=$(free_port)
"${prio[@]}" taskset -c 0 "$corral" serve --config "$tmp/plain.toml" --listen "127.0.0.1:$port" \
  --admin-listen "127.0.0.1:$admin" --state-dir "$tmp/state" --no-access-log --log-level warn \
  >"$tmp/server.out" 2>&1 &
server_pid=$!
await_body corral "http://127.0.0.1:$port/hello" 5
poll_while_alive "$server_pid" curl -fsS -o /dev/null "http://127.0.0.1:$admin/metrics" ||
  { echo "$self: no /metrics on the admin listener" >&2; cat "$tmp/server.out" >&2; exit 1; }

# The supervisor's own time on CPU (not its children's): what the scrapes cost it; and the server
# process's (the supervisor's only child: there are no workers here).
own_cpu_ns() { awk '{ print $1 }' "/proc/$server_pid/schedstat"; }
child_cpu_ns() {
  local child
  child=$(awk '{ print $1 }' "/proc/$server_pid/task/$server_pid/children")
  awk '{ print $1 }' "/proc/$child/schedstat"
}

scrape_loop() {  # counts its scrapes in $tmp/scrapes
  echo 0 >"$tmp/scrapes"
  if [[ "$scraper_kind" != keepalive ]]; then
    # shellcheck disable=SC2016
    "${scraper[@]}" bash -c 'n=0
      while :; do curl -s "$1" >/dev/null; n=$((n + 1)); echo $n >"$2"; sleep "$3"; done' \
      scrape "${scrape_url:-http://127.0.0.1:$admin/metrics}" "$tmp/scrapes" "$interval" &
  else
    "${scraper[@]}" python3 -c '
import http.client, sys, time
c, n = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1])), 0
while True:
    c.request("GET", "/metrics")
    c.getresponse().read()
    n += 1
    with open(sys.argv[2], "w") as f:
        f.write(f"{n}\n")
    time.sleep(float(sys.argv[3]))
' "$admin" "$tmp/scrapes" "$interval" &
  fi
  scrape_pid=$!
}
scrapes_now() { cat "$tmp/scrapes" 2>/dev/null || echo 0; }

results="$tmp/results.txt"
: >"$results"
url="http://127.0.0.1:$port/hello"
wrk_cmd=("${prio[@]}" taskset -c 1 wrk -t1 "-c$conns" --latency)

run() {  # $1 off|on
  local reqs rps p99 errors non2xx out c0 c1 p0 p1 s0=0 s1=0 scrapes=0
  if [[ "$1" == on ]]; then scrape_loop; fi
  "${wrk_cmd[@]}" "-d${warmup}s" "$url" >/dev/null 2>&1 || true
  c0=$(own_cpu_ns)
  p0=$(child_cpu_ns)
  if [[ "$1" == on ]]; then s0=$(scrapes_now); fi
  out=$("${wrk_cmd[@]}" "-d${duration}s" "$url" 2>&1)
  c1=$(own_cpu_ns)
  p1=$(child_cpu_ns)
  if [[ "$1" == on ]]; then
    s1=$(scrapes_now)
    stop_pid "$scrape_pid"
    scrape_pid=""
    scrapes=$((s1 - s0))
  fi
  wrk_fields "$out"
  wrk_ran "$out" "with scraping $1" || return 1
  local per_scrape="-"
  if [[ "$scrapes" -gt 0 ]]; then
    per_scrape=$(awk -v d=$((c1 - c0)) -v n="$scrapes" 'BEGIN { printf "%.0f", d / 1e3 / n }')
  fi
  local share proc_us
  share=$(awk -v d=$((c1 - c0)) -v s="$duration" 'BEGIN { printf "%.3f", d / 1e7 / s }')
  proc_us=$(awk -v d=$((p1 - p0)) -v n="$reqs" 'BEGIN { printf "%.3f", d / 1e3 / n }')
  echo "$1 $rps $p99 $scrapes $per_scrape $share $proc_us ${errors:-0} ${non2xx:-0}" >>"$results"
  printf '%s: scraping %-3s %10s req/s  p99 %6s us  server %s us CPU/req  scrapes %4s  supervisor %6s us CPU/scrape, %s%% of a CPU  errors %s non2xx %s\n' \
    "$self" "$1" "$rps" "$p99" "$proc_us" "$scrapes" "$per_scrape" "$share" "${errors:-0}" "${non2xx:-0}" >&2
}

for ((r = 0; r < rounds; r++)); do
  if ((r % 2 == 0)); then run off; run on; else run on; run off; fi
done

awk -v dur="$duration" -v conns="$conns" -v iv="$interval" -v where="$scraper_cpu" \
    -v kind="$scraper_kind" -v date="$(utc_minute)" -v cpumodel="$(cpu_model)" -v kernel="$(uname -r)" -v prio="$priority" '
  { n[$1]++; sum[$1] += $2; runs[$1] = runs[$1] (runs[$1] ? ", " : "") sprintf("%.0f", $2)
    share[$1] += $6; proc[$1] += $7 }
  END {
    off = sum["off"] / n["off"]; on = sum["on"] / n["on"]
    printf "\n<!-- bench/metrics_scrape.sh --duration %s --interval %s --scraper %s --scraper-cpu %s --priority %s, %s, %s, Linux %s, wrk -t1 -c%s -->\n",
      dur, iv, kind, where, prio, date, cpumodel, kernel, conns
    print "| scraping /metrics | runs (req/s) | mean req/s | ratio | server CPU/req | supervisor CPU |"
    print "| --- | --- | ---: | ---: | ---: | ---: |"
    printf "| off | %s | %.0f | 1.000 | %.3f us | %.2f%% |\n", runs["off"], off,
      proc["off"] / n["off"], share["off"] / n["off"]
    printf "| every %s s | %s | %.0f | %.3f | %.3f us | %.2f%% |\n", iv, runs["on"], on, on / off,
      proc["on"] / n["on"], share["on"] / n["on"]
  }' "$results"
