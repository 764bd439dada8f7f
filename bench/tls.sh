#!/usr/bin/env bash
# bench/tls.sh: HTTPS keep-alive requests/s, corral against nginx with TLS, in one run.
#
#   bench/tls.sh [--duration S] [--warmup S] [--connections N] [--cases a,b]
#                [--priority rt|nice|none]
#
# Cases: (a) GET /hello, 5-byte body, HTTPS keep-alive; (b) GET /64k.bin, a 64 KiB static file
# over HTTPS keep-alive (corral reads it into its buffer and encrypts, nginx too: no sendfile
# under TLS for either).
#
# Same method as bench/run.sh (read its header): the server under test on CPU 0 (corral: one
# server process under its supervisor, the supervisor idle; nginx: worker_processes 1), wrk on
# CPU 1 (-t1 -c50, OpenSSL, TLS 1.3), one server at a time, a warm-up run that is not measured.
# Both servers use the same certificate (an ECDSA P-256 one made by `corral cert`), TLS 1.2 and
# 1.3 with session tickets; wrk makes its connections once, so handshakes are not what is measured
# but the record layer (AES-GCM) and the HTTP path are. "proc CPU/req" is the server processes'
# own time on CPU (/proc/PID/schedstat, children included) per request.
#
# Environment: CORRAL_BIN (use this binary, do not build), NGINX_BIN (default: nginx in PATH).
# Needs: wrk, nginx (with the ssl module: nginx-light has it), curl, python3, taskset.
set -euo pipefail

duration=10
warmup=2
conns=50
cases="a,b"
priority=none
[[ $(id -u) -eq 0 ]] && priority=rt
while [[ $# -gt 0 ]]; do
  case "$1" in
    --duration) duration="$2"; shift 2 ;;
    --warmup) warmup="$2"; shift 2 ;;
    --connections) conns="$2"; shift 2 ;;
    --cases) cases="$2"; shift 2 ;;
    --priority) priority="$2"; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "tls.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
done
case "$priority" in
  rt) prio=(chrt -f 50) ;;
  nice) prio=(nice -n -19) ;;
  none) prio=() ;;
  *) echo "tls.sh: --priority rt|nice|none" >&2; exit 2 ;;
esac

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
nginx_bin="${NGINX_BIN:-$(command -v nginx || echo /usr/sbin/nginx)}"
for tool in wrk curl python3 taskset "$nginx_bin"; do
  command -v "$tool" >/dev/null || { echo "tls.sh: '$tool' not found (scripts/deps.sh bench)" >&2; exit 2; }
done
[[ $(nproc) -ge 2 ]] || { echo "tls.sh: needs 2 CPUs (server on CPU 0, wrk on CPU 1)" >&2; exit 2; }

if [[ -n "${CORRAL_BIN:-}" ]]; then
  corral="$CORRAL_BIN"
else
  corral="$root/build/release/corral"
  echo "tls.sh: building release corral" >&2
  (cd "$root" && { [[ -f build/release/CMakeCache.txt ]] || cmake --preset release >/dev/null; } &&
    cmake --build --preset release --target corral >/dev/null)
fi
[[ -x "$corral" ]] || { echo "tls.sh: no corral binary at $corral" >&2; exit 2; }

tmp="$(mktemp -d /tmp/corral-tls-bench.XXXXXX)"
chmod 755 "$tmp"
server_pid=""
cleanup() {
  if [[ -n "$server_pid" ]] && kill -0 "$server_pid" 2>/dev/null; then
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

mkdir -p "$tmp/www" "$tmp/nginx-temp" "$tmp/state"
head -c 65536 /dev/urandom >"$tmp/www/64k.bin"
printf 'hello' >"$tmp/www/hello"
chmod -R a+rX "$tmp/www"
"$corral" cert --dir "$tmp/cert" >/dev/null
chmod 644 "$tmp/cert/dev-key.pem"  # nginx reads it as root before dropping privileges anyway
cert="$tmp/cert/dev-cert.pem"
key="$tmp/cert/dev-key.pem"

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

write_nginx_conf() {  # $1 port
  cat >"$tmp/nginx.conf" <<EOF
worker_processes 1;
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
  types { application/octet-stream bin; }
  default_type application/octet-stream;
  ssl_certificate $cert;
  ssl_certificate_key $key;
  ssl_protocols TLSv1.2 TLSv1.3;
  ssl_session_tickets on;
  server {
    listen 127.0.0.1:$1 ssl;
    root $tmp/www;
    location = /hello {
      default_type text/plain;
      return 200 "hello";
    }
    location / { }
  }
}
EOF
}

start_server() {  # $1 nginx|corral  $2 port  $3 hello|static
  case "$1" in
    nginx)
      write_nginx_conf "$2"
      "${prio[@]}" taskset -c 0 "$nginx_bin" -p "$tmp" -c "$tmp/nginx.conf" -e "$tmp/nginx-error.log" \
        >"$tmp/server.out" 2>&1 &
      ;;
    corral)
      # The plain listener is unused; the TLS one is measured. As in run.sh: /hello is the
      # embedded site's 5-byte route (nginx: `return 200`), /64k.bin comes from a served DIR.
      local dir=()
      [[ "$3" == static ]] && dir=("$tmp/www")
      "${prio[@]}" taskset -c 0 "$corral" serve "${dir[@]}" --listen "127.0.0.1:0" \
        --tls-listen "127.0.0.1:$2" --cert "$cert" --key "$key" --state-dir "$tmp/state" \
        --no-access-log --log-level warn >"$tmp/server.out" 2>&1 &
      ;;
  esac
  server_pid=$!
  local url="https://localhost:$2/hello" got
  [[ "$3" == static ]] && url="https://localhost:$2/64k.bin"
  for _ in $(seq 100); do
    if got=$(curl -fsS --cacert "$cert" "$url" 2>/dev/null | wc -c); then
      [[ ("$3" == static && "$got" -eq 65536) || ("$3" == hello && "$got" -eq 5) ]] && return 0
      echo "tls.sh: $1 answered $url with '$got'" >&2
      return 1
    fi
    kill -0 "$server_pid" 2>/dev/null || break
    sleep 0.1
  done
  echo "tls.sh: $1 did not answer $url; its output:" >&2
  cat "$tmp/server.out" "$tmp/nginx-error.log" 2>/dev/null >&2 || true
  return 1
}

stop_server() {
  if [[ -n "$server_pid" ]]; then
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
    server_pid=""
  fi
}

proc_cpu_ns() {  # $1 pid: its time on CPU and its children's, ns
  local total=0 pid t
  local pids=("$1")
  # shellcheck disable=SC2207
  [[ -r /proc/$1/task/$1/children ]] && pids+=($(cat "/proc/$1/task/$1/children"))
  for pid in "${pids[@]}"; do
    t=$(awk '{ print $1 }' "/proc/$pid/schedstat" 2>/dev/null) || t=0
    total=$((total + ${t:-0}))
  done
  echo "$total"
}

results="$tmp/results.txt"
: >"$results"
measure() {  # $1 case  $2 server  $3 port
  local path=/hello
  [[ "$1" == b ]] && path=/64k.bin
  local url="https://localhost:$3$path"
  local wrk_cmd=("${prio[@]}" taskset -c 1 wrk -t1 "-c$conns" --latency)
  "${wrk_cmd[@]}" "-d${warmup}s" "$url" >/dev/null 2>&1 || true
  local p0 p1 out reqs rps p99 errors
  p0=$(proc_cpu_ns "$server_pid")
  out=$("${wrk_cmd[@]}" "-d${duration}s" "$url" 2>&1)
  p1=$(proc_cpu_ns "$server_pid")
  reqs=$(awk '/requests in/ { print $1 }' <<<"$out")
  rps=$(awk '/^Requests\/sec:/ { print $2 }' <<<"$out")
  p99=$(awk '$1 == "99%" { print $2 }' <<<"$out")
  errors=$(awk '/Socket errors:/ { gsub(",", ""); s += $4 + $6 + $8 + $10 } /Non-2xx/ { s += $NF }
                END { print s + 0 }' <<<"$out")
  if [[ -z "$reqs" || "$reqs" -eq 0 ]]; then
    echo "tls.sh: wrk produced no requests for case $1 on $2:" >&2
    echo "$out" >&2
    return 1
  fi
  local proc_us
  proc_us=$(awk -v d=$((p1 - p0)) -v n="$reqs" 'BEGIN { printf "%.2f", d / 1e3 / n }')
  echo "$1 $2 $rps $p99 $proc_us ${errors:-0}" >>"$results"
  printf 'tls.sh: case %s %-6s %10s req/s  p99 %8s  proc/req %6s us  errors %s\n' \
    "$1" "$2" "$rps" "$p99" "$proc_us" "${errors:-0}" >&2
}

IFS=, read -ra case_list <<<"$cases"
for c in "${case_list[@]}"; do
  for server in nginx corral; do
    port=$(free_port)
    kind=hello
    [[ "$c" == b ]] && kind=static
    start_server "$server" "$port" "$kind"
    measure "$c" "$server" "$port"
    stop_server
  done
done

awk -v dur="$duration" -v conns="$conns" -v prio="$priority" -v date="$(date -u +%Y-%m-%dT%H:%MZ)" \
    -v cpumodel="$(awk -F': ' '/model name/ { print $2; exit }' /proc/cpuinfo)" \
    -v nginxv="$("$nginx_bin" -v 2>&1 | sed 's/.*nginx\///')" '
  function name(c) {
    if (c == "a") return "(a) 5-byte, HTTPS keep-alive";
    if (c == "b") return "(b) 64 KiB file, HTTPS keep-alive";
    return c;
  }
  function ratio(x, y) { return (x > 0 && y > 0) ? sprintf("%.2f", x / y) : "-" }
  { if (!($1 in seen)) { seen[$1] = 1; cases[++n] = $1 }
    rps[$1, $2] = $3; p99[$1, $2] = $4; proc[$1, $2] = $5; err[$1, $2] = $6 }
  END {
    printf "<!-- bench/tls.sh --duration %s --priority %s, %s, %s, nginx %s, wrk -t1 -c%s -->\n",
      dur, prio, date, cpumodel, nginxv, conns
    print "| case | nginx req/s | corral req/s | corral/nginx | nginx p99 | corral p99 | nginx proc CPU/req | corral proc CPU/req | errors (nginx/corral) |"
    print "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    for (i = 1; i <= n; i++) {
      c = cases[i]
      printf "| %s | %.0f | %.0f | %s | %s | %s | %.2f us | %.2f us | %d/%d |\n", name(c),
        rps[c, "nginx"], rps[c, "corral"], ratio(rps[c, "corral"], rps[c, "nginx"]),
        p99[c, "nginx"], p99[c, "corral"], proc[c, "nginx"], proc[c, "corral"],
        err[c, "nginx"], err[c, "corral"]
    }
  }' "$results"
