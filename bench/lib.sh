# bench/lib.sh: what the load scripts in bench/ share; sourced (after `set -euo pipefail`), not run.
#
#   source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
#
# On sourcing it sets `self` (the script's file name, the prefix of its messages), `root` (the
# repository), `hz` (clock ticks per second, for /proc/stat) and `server_pid` (empty). The rest are
# functions: flag parsing and --help, the --priority wrapper, tool and binary checks, a temporary
# directory with its cleanup, nginx's config, waiting for a server, CPU time from /proc and wrk's
# numbers. Each script keeps its own flags, cases, servers, measurements and report.
# shellcheck shell=bash disable=SC2034  # the variables set here are read by the scripts

self="$(basename "$0")"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
hz=$(getconf CLK_TCK)
server_pid=""

# --- flags -------------------------------------------------------------------------------------

# Parses the script's arguments. SPEC lists its flags, each with the variable its value goes to
# ("--duration duration --connections conns"); -h|--help prints lines $help_lines of the script
# (e.g. 2,24: its header comment) and exits 0; anything else is an unknown argument (exit 2).
parse_flags() {  # SPEC ARG...
  local spec=" ${1//$'\n'/ } " var  # SPEC may span lines
  shift
  while [[ $# -gt 0 ]]; do
    if [[ "$1" == --* && "$spec" == *" $1 "* ]]; then
      var="${spec#*" $1 "}"
      printf -v "${var%% *}" '%s' "$2"
      shift 2
    else
      help_or_unknown "$1"
    fi
  done
}

help_or_unknown() {  # $1 the argument: -h|--help prints the header and exits 0, the rest exit 2
  # shellcheck disable=SC2154  # help_lines is the script's
  case "$1" in
    -h|--help) sed -n "${help_lines}p" "$0"; exit 0 ;;
    *) echo "$self: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
}

rt_if_root() {  # the default --priority of most scripts: rt when run as root, else none
  if [[ $(id -u) -eq 0 ]]; then echo rt; else echo none; fi
}

# prio: the command prefix for --priority rt (SCHED_FIFO, chrt -f 50), nice (nice -19) or none.
set_prio() {  # $1 rt|nice|none
  case "$1" in
    rt) prio=(chrt -f 50) ;;
    nice) prio=(nice -n -19) ;;
    none) prio=() ;;
    *) echo "$self: --priority rt|nice|none" >&2; exit 2 ;;
  esac
}

# --- tools and binaries ------------------------------------------------------------------------

# Exits 2 naming the first TOOL that is not found, with the hint to install the bench
# dependencies (--no-hint: without it, for tools that scripts/deps.sh bench does not install).
need_tools() {  # [--no-hint] TOOL...
  local hint=" (scripts/deps.sh bench)" tool
  if [[ "$1" == --no-hint ]]; then hint=""; shift; fi
  for tool in "$@"; do
    command -v "$tool" >/dev/null || { echo "$self: '$tool' not found$hint" >&2; exit 2; }
  done
}

# shellcheck disable=SC2120  # its argument is optional
need_cpus() {  # $1 why (e.g. "(server on CPU 0, wrk on CPU 1)"): exits 2 on fewer than 2 CPUs
  [[ $(nproc) -ge 2 ]] || { echo "$self: needs 2 CPUs${1:+ $1}" >&2; exit 2; }
}

find_nginx() {  # sets nginx_bin: $NGINX_BIN, else nginx in PATH, else /usr/sbin/nginx
  nginx_bin="${NGINX_BIN:-$(command -v nginx || echo /usr/sbin/nginx)}"
}

release_build() {  # TARGET...: builds them with cmake's release preset, configured first if need be
  (cd "$root" && { [[ -f build/release/CMakeCache.txt ]] || cmake --preset release >/dev/null; } &&
    cmake --build --preset release --target "$@" >/dev/null)
}

# Sets corral: $CORRAL_BIN, else build/release/corral built now (saying so on stderr unless
# --quiet). --fallback: when the release preset does not build, build build/bench-release instead.
# Exits 2 when there is no binary.
# shellcheck disable=SC2120  # its argument is optional
find_corral() {  # [--quiet] [--fallback]
  local quiet=0 fallback=0 arg
  for arg in "$@"; do
    case "$arg" in
      --quiet) quiet=1 ;;
      --fallback) fallback=1 ;;
    esac
  done
  if [[ -n "${CORRAL_BIN:-}" ]]; then
    corral="$CORRAL_BIN"
  else
    corral="$root/build/release/corral"
    [[ $quiet == 1 ]] || echo "$self: building release corral" >&2
    if [[ $fallback == 0 ]]; then
      release_build corral
    elif ! release_build corral; then
      # GCC 12 reports a -Wrestrict false positive under -O3 in some std::string concatenations;
      # with -Werror that stops the release preset. Benchmark a build that only differs by that.
      echo "$self: release preset build failed; building build/bench-release with -Wno-error=restrict" >&2
      (cd "$root" && cmake -S . -B build/bench-release -G Ninja -DCMAKE_BUILD_TYPE=Release \
          -DCMAKE_CXX_FLAGS=-Wno-error=restrict -DCORRAL_TESTS=OFF >/dev/null &&
        cmake --build build/bench-release -j2 --target corral >/dev/null)
      corral="$root/build/bench-release/corral"
    fi
  fi
  [[ -x "$corral" ]] || { echo "$self: no corral binary at $corral" >&2; exit 2; }
}

# --- temporary directory, servers, cleanup -----------------------------------------------------

# Sets tmp to a new directory /tmp/NAME.XXXXXX, removed at exit by cleanup (which stops
# $server_pid first; a script with more to stop defines its own cleanup after sourcing this).
# Also writes $tmp/plain.toml, an empty config: `corral serve --config "$tmp/plain.toml"` is one
# server process with the embedded site. Without any config, corral serve adds the notes demo (when
# its worker program is built next to corral), and workers put the server under a supervisor: the
# pid the scripts measure would be the idle supervisor, not the process serving.
make_tmp() {  # $1 NAME
  tmp="$(mktemp -d "/tmp/$1.XXXXXX")"
  trap cleanup EXIT
  trap 'exit 130' INT TERM
  : >"$tmp/plain.toml"
}

cleanup() {
  stop_server
  rm -rf "$tmp"
}

stop_pid() {  # $1 pid or "": terminates it (nginx master / corral supervisor stop their workers)
  if [[ -n "$1" ]] && kill -0 "$1" 2>/dev/null; then
    kill "$1" 2>/dev/null || true
    wait "$1" 2>/dev/null || true
  fi
}

stop_server() {
  stop_pid "$server_pid"
  server_pid=""
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# Runs CMD until it succeeds: 0, or 1 after 100 tries 0.1 s apart or once PID has exited.
poll_while_alive() {  # PID CMD...
  local pid="$1"
  shift
  for _ in $(seq 100); do
    "$@" && return 0
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  return 1
}

# Waits until URL answers (polling while $server_pid lives), then checks that its body is BYTES
# long. On failure says what happened, with the server's output, and returns 1.
await_body() {  # NAME URL BYTES [CURL-ARG...]
  local name="$1" url="$2" want="$3" got
  shift 3
  if poll_while_alive "$server_pid" curl -fsS -o /dev/null "$@" "$url" 2>/dev/null; then
    # The body must be the one we measure, not an error page.
    got=$(curl -fsS "$@" "$url" | wc -c)
    [[ "$got" -eq "$want" ]] && return 0
    echo "$self: $name answered $url with $got bytes" >&2
    return 1
  fi
  echo "$self: $name did not answer $url; its output:" >&2
  cat "$tmp/server.out" "$tmp/nginx-error.log" 2>/dev/null >&2 || true
  return 1
}

# Writes $tmp/nginx.conf, for `nginx -p "$tmp" -c "$tmp/nginx.conf" -e "$tmp/nginx-error.log"`:
# one server on 127.0.0.1 whose `location = /hello` answers "hello" (corral's embedded site's
# 5-byte route), no access log, keep-alive connections that last a whole run, temporary files
# under $tmp/nginx-temp. The arguments add what a script's cases need.
write_nginx_conf() {  # $1 listen PORT[ OPTIONS]  $2 main-context lines  $3 http lines  $4 server lines
  chmod 755 "$tmp"  # nginx workers may run as another user
  mkdir -p "$tmp/nginx-temp"
  cat >"$tmp/nginx.conf" <<EOF
$2
daemon off;
pid $tmp/nginx.pid;
error_log $tmp/nginx-error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  tcp_nodelay on;
  keepalive_requests 1000000;
  keepalive_timeout 65;
  client_body_temp_path $tmp/nginx-temp/body;
  proxy_temp_path $tmp/nginx-temp/proxy;
  fastcgi_temp_path $tmp/nginx-temp/fastcgi;
  uwsgi_temp_path $tmp/nginx-temp/uwsgi;
  scgi_temp_path $tmp/nginx-temp/scgi;
$3
  server {
    listen 127.0.0.1:$1;
$4
    location = /hello {
      default_type text/plain;
      return 200 "hello";
    }
  }
}
EOF
}

nginx_version() { "$nginx_bin" -v 2>&1 | sed 's/.*nginx\///'; }

# --- CPU time ----------------------------------------------------------------------------------

# Busy jiffies of CPU N ("cpu0"), or of all CPUs (no argument): user + nice + system + irq + softirq.
# shellcheck disable=SC2120  # its argument is optional
busy_jiffies() { awk -v cpu="${1:-cpu}" '$1 == cpu { print $2 + $3 + $4 + $7 + $8 }' /proc/stat; }

# Time on CPU of a process and its children (nginx's worker), in ns: the scheduler's
# sum_exec_runtime (/proc/PID/schedstat), exact where utime+stime are sampled at 100 Hz ticks.
proc_cpu_ns() {  # $1 pid
  local total=0 pid t
  local pids=("$1")
  if [[ -r /proc/$1/task/$1/children ]]; then
    # shellcheck disable=SC2207
    pids+=($(cat "/proc/$1/task/$1/children"))
  fi
  for pid in "${pids[@]}"; do
    t=$(awk '{ print $1 }' "/proc/$pid/schedstat" 2>/dev/null) || t=0
    total=$((total + ${t:-0}))
  done
  echo "$total"
}

# Time on CPU of one process, all its threads (Node has helper threads), in ns:
# /proc/PID/task/*/schedstat.
threads_cpu_ns() {  # $1 pid
  cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{ s += $1 } END { printf "%.0f", s }'  # %d is 32-bit in mawk
}

# --- wrk ---------------------------------------------------------------------------------------

to_us() {  # wrk latency "1.23ms" -> microseconds
  awk -v v="$1" 'BEGIN {
    n = v + 0; u = v; sub(/^[0-9.]+/, "", u);
    if (u == "us") f = 1; else if (u == "ms") f = 1000; else if (u == "s") f = 1000000;
    else if (u == "m") f = 60000000; else f = 1;
    printf "%.0f", n * f }'
}

# Reads wrk --latency output into the caller's variables (declare them local there): reqs, rps,
# p99 (us), errors (socket errors) and non2xx, the last two empty when wrk printed none.
wrk_fields() {  # $1 wrk's output
  reqs=$(awk '/requests in/ { print $1 }' <<<"$1")
  rps=$(awk '/^Requests\/sec:/ { print $2 }' <<<"$1")
  p99=$(to_us "$(awk '$1 == "99%" { print $2 }' <<<"$1")")
  errors=$(awk '/Socket errors:/ { gsub(",", ""); print $4 + $6 + $8 + $10 }' <<<"$1")
  non2xx=$(awk '/Non-2xx/ { print $NF }' <<<"$1")
}

# 0 when wrk completed requests ($reqs from wrk_fields); else prints wrk's output after
# "wrk produced no requests WHAT:" and returns 1.
wrk_ran() {  # $1 wrk's output  $2 what (e.g. "for case a on nginx")
  [[ -n "$reqs" && "$reqs" -ne 0 ]] && return 0
  echo "$self: wrk produced no requests $2:" >&2
  echo "$1" >&2
  return 1
}

# --- report ------------------------------------------------------------------------------------

utc_minute() { date -u +%Y-%m-%dT%H:%MZ; }
cpu_model() { awk -F': ' '/model name/ { print $2; exit }' /proc/cpuinfo; }
