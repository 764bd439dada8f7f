# Sourced by scripts/run, scripts/test and scripts/deps.sh: each step says what it does before it
# starts and how long it took when it ends, and a failing step says which step failed, where its
# output is and what to do. Nothing here waits silently: a step whose output is kept in a log
# prints a line every 20 s with the log's last line.
#
#   step NAME HINT CMD...        runs CMD with its output shown (builds: ninja's [n/N] progress)
#   quiet_step NAME HINT CMD...  runs CMD with its output in a log, shown (last 40 lines) on failure
#
# HINT says what to do when the step fails. Any other failing command in a script that sets
# `trap on_error ERR` (with set -E) is reported with its line and command.

say() { echo "corral: $*" >&2; }

_step_failed() {  # NAME HINT RC SECONDS [LOG]
  say "FAILED: $1 (exit $3 after $4 s)"
  [ -n "${5:-}" ] && say "its output is in $5"
  [ -n "$2" ] && say "what to do: $2"
}

step() {
  local name="$1" hint="$2" t0=$SECONDS rc=0
  shift 2
  say "$name ..."
  "$@" || rc=$?
  if [ "$rc" -ne 0 ]; then
    _step_failed "$name" "$hint" "$rc" $((SECONDS - t0))
    exit "$rc"
  fi
  say "$name (took $((SECONDS - t0)) s)"
}

quiet_step() {
  local name="$1" hint="$2" t0=$SECONDS rc=0 last=$SECONDS log pid
  shift 2
  log="$(mktemp "${TMPDIR:-/tmp}/corral-step.XXXXXX")"
  say "$name ..."
  "$@" >"$log" 2>&1 </dev/null &
  pid=$!
  # bash reaps the child when it exits, so kill -0 fails from then on; `wait` still has its status.
  while kill -0 "$pid" 2>/dev/null; do
    sleep 0.2
    if [ $((SECONDS - last)) -ge 20 ]; then
      last=$SECONDS
      say "  ... $name: $((SECONDS - t0)) s so far; $(tail -n 1 "$log" | tr -d '\r' | cut -c1-100)"
    fi
  done
  wait "$pid" || rc=$?
  if [ "$rc" -ne 0 ]; then
    echo "----- last 40 lines of $name -----" >&2
    tail -n 40 "$log" >&2
    echo "-----" >&2
    _step_failed "$name" "$hint" "$rc" $((SECONDS - t0)) "$log"
    exit "$rc"
  fi
  rm -f "$log"
  say "$name (took $((SECONDS - t0)) s)"
}

on_error() {  # trap 'on_error $LINENO' ERR, for failures outside step/quiet_step
  local rc=$?
  say "FAILED: ${BASH_SOURCE[1]:-$0} line $1: $BASH_COMMAND (exit $rc)"
  exit "$rc"
}
