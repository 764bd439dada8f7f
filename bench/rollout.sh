#!/usr/bin/env bash
# bench/rollout.sh: how long a rollout of new worker code takes across live workers, in place and
# by replacement, and what it does to the latency of the requests served meanwhile (issue 13).
#
#   bench/rollout.sh [--workers 100] [--rollouts 10] [--rate 400] [--connections 8]
#                    [--baseline 10] [--kinds cpp,python] [--modes in-place,restart]
#                    [--priority rt|nice|none]
#
# For each kind (cpp = examples/worker_cpp's example_worker, python = examples/worker_python)
# and each mode (`reload = "in-place"`: the worker's reload hook; "restart": each worker stopped
# and a new one started on the new code), a fresh `corral serve` with --workers live addresses
# (bench/rollout_bench.py does the measuring):
#   * the baseline: --baseline seconds of a steady load (--rate requests/s in all over
#     --connections keep-alive connections, GET /b/<n>/code spread over every address), latency
#     from each request's planned send time to its last byte (no coordinated omission);
#   * the same load during --rollouts back-to-back rollouts (hello.txt alternating, then
#     `corral ctl rollout b --json`, 0.5 s apart): each rollout's time from spawning ctl to its
#     exit and its report's took_ms (the manager's, from the step's start to its last settled
#     worker), and the latency of the requests planned while a rollout ran.
# Prints one row per kind and mode: rollout ctl and took_ms (median / max), p50 / p99 / max
# latency without rollouts, during them (the requests planned while one ran, and how many) and
# over the whole phase with rollouts, failed requests, and the 1-minute load average at the end
# (the machine's other work shows there). Nothing is pass/fail.
#
# Environment: CORRAL_BIN and WORKER_BIN (use these binaries, do not build), PYTHON_BIN (the
# interpreter for worker.py and the driver; default /usr/bin/python3).
# Needs: python3 (scripts/deps.sh bench).
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
help_lines=2,27

workers=100
rollouts=10
rate=400
conns=8
baseline=10
kinds="cpp,python"
modes="in-place,restart"
priority=$(rt_if_root)
parse_flags "--workers workers --rollouts rollouts --rate rate --connections conns
  --baseline baseline --kinds kinds --modes modes --priority priority" "$@"
set_prio "$priority"

python_bin="${PYTHON_BIN:-/usr/bin/python3}"
[[ -x "$python_bin" ]] || python_bin="$(command -v python3)"
need_tools "$python_bin"

if [[ -n "${CORRAL_BIN:-}" ]]; then
  corral="$(realpath "$CORRAL_BIN")"
  worker_cpp="$(realpath "${WORKER_BIN:-$(dirname "$corral")/examples/worker_cpp/example_worker}")"
else
  corral="$root/build/release/corral"
  worker_cpp="$root/build/release/examples/worker_cpp/example_worker"
  echo "$self: building release corral and example_worker" >&2
  release_build corral example_worker
fi
worker_py="$root/examples/worker_python/worker.py"
for f in "$corral" "$worker_cpp"; do
  [[ -x "$f" ]] || { echo "$self: no binary at $f" >&2; exit 2; }
done

echo "# rollout.sh $(utc_minute) $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?')" \
  "workers=$workers rollouts=$rollouts rate=$rate connections=$conns baseline=${baseline}s" \
  "cpus=$(nproc) ($(cpu_model)) corral=$corral"
printf '%-7s %-9s %15s %15s %22s %28s %22s %6s %5s\n' kind mode "ctl ms med/max" \
  "took_ms med/max" "base p50/p99/max ms" "during p50/p99/max ms (n)" "phase p50/p99/max ms" \
  failed load
IFS=, read -ra kind_list <<<"$kinds"
IFS=, read -ra mode_list <<<"$modes"
for kind in "${kind_list[@]}"; do
  case "$kind" in
    cpp) command="[\"$worker_cpp\"]" ;;
    python) command="[\"$python_bin\", \"$worker_py\"]" ;;
    *) echo "$self: --kinds cpp,python" >&2; exit 2 ;;
  esac
  for mode in "${mode_list[@]}"; do
    echo "$self: $kind $mode: $workers workers, $rollouts rollouts" >&2
    json=$("${prio[@]}" "$python_bin" "$root/bench/rollout_bench.py" --corral "$corral" \
      --command "$command" --workers "$workers" --mode "$mode" --rollouts "$rollouts" \
      --rate "$rate" --connections "$conns" --baseline-s "$baseline" --label "$kind")
    "$python_bin" - "$json" <<'EOF'
import json, sys
r = json.loads(sys.argv[1])
ro, lat, f = r["rollouts"], r["latency_ms"], r["failed_requests"]
def three(s):
    return f"{s['p50']}/{s['p99']}/{s['max']}"
during = f"{three(lat['during_rollouts'])} ({lat['during_rollouts']['n']})"
ctl = f"{ro['ctl_median_ms']:.0f}/{ro['ctl_max_ms']:.0f}"
took = f"{ro['took_median_ms']}/{ro['took_max_ms']}"
print(f"{r['label']:<7} {r['mode']:<9} {ctl:>15} {took:>15} {three(lat['baseline']):>22} "
      f"{during:>28} {three(lat['phase']):>22} {f['baseline'] + f['during']:>6} "
      f"{r['load1']:>5}")
if r["bad_reports"]:
    print(f"  reports with failures: {json.dumps(r['bad_reports'])[:600]}")
EOF
  done
done
