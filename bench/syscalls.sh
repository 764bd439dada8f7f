#!/usr/bin/env bash
# bench/syscalls.sh: system calls per request of release corral on the 5-byte keep-alive path.
#
#   bench/syscalls.sh [--requests N] [--connections C] [--depth D] [--nginx]
#
# Starts `corral serve` (embedded site), attaches `strace -f -c` to it once it answers, drives
# N keep-alive requests for GET /hello over C connections from a Python client (each connection
# sends D requests per write, waits for the D responses, then the next connection goes: one
# readable wakeup per batch), detaches and prints the calls per request. Target (D=1): 1 read + 1
# write per request, 1 epoll_wait per request and nothing else. --nginx traces nginx's worker
# instead (same client, `location = /hello { return 200 "hello"; }`), for comparison.
#
# Environment: CORRAL_BIN (use this binary, do not build).
set -euo pipefail

requests=20000
conns=4
depth=1
server=corral
while [[ $# -gt 0 ]]; do
  case "$1" in
    --requests) requests="$2"; shift 2 ;;
    --connections) conns="$2"; shift 2 ;;
    --depth) depth="$2"; shift 2 ;;
    --nginx) server=nginx; shift ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "syscalls.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
for tool in strace python3 curl; do
  command -v "$tool" >/dev/null || { echo "syscalls.sh: '$tool' not found" >&2; exit 2; }
done

if [[ "$server" == nginx ]]; then
  corral=""
elif [[ -n "${CORRAL_BIN:-}" ]]; then
  corral="$CORRAL_BIN"
else
  corral="$root/build/release/corral"
  if ! (cd "$root" && { [[ -f build/release/CMakeCache.txt ]] || cmake --preset release >/dev/null; } &&
        cmake --build --preset release --target corral >/dev/null); then
    # See bench/run.sh: GCC 12's -Wrestrict false positive under -O3 and -Werror.
    echo "syscalls.sh: release preset build failed; using build/bench-release (-Wno-error=restrict)" >&2
    (cd "$root" && cmake -S . -B build/bench-release -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_CXX_FLAGS=-Wno-error=restrict -DCORRAL_TESTS=OFF >/dev/null &&
      cmake --build build/bench-release -j2 --target corral >/dev/null)
    corral="$root/build/bench-release/corral"
  fi
fi

tmp="$(mktemp -d /tmp/corral-syscalls.XXXXXX)"
server_pid=""
strace_pid=""
cleanup() {
  for p in "$strace_pid" "$server_pid"; do
    if [[ -n "$p" ]] && kill -0 "$p" 2>/dev/null; then
      kill "$p" 2>/dev/null || true
      wait "$p" 2>/dev/null || true
    fi
  done
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
if [[ "$server" == nginx ]]; then
  chmod 755 "$tmp"
  cat >"$tmp/nginx.conf" <<EOF
worker_processes 1;
daemon off;
pid $tmp/nginx.pid;
error_log $tmp/nginx-error.log warn;
events { worker_connections 1024; }
http {
  access_log off;
  tcp_nodelay on;
  keepalive_requests 1000000;
  client_body_temp_path $tmp/body;
  proxy_temp_path $tmp/proxy;
  fastcgi_temp_path $tmp/fastcgi;
  uwsgi_temp_path $tmp/uwsgi;
  scgi_temp_path $tmp/scgi;
  server {
    listen 127.0.0.1:$port;
    location = /hello { default_type text/plain; return 200 "hello"; }
  }
}
EOF
  nginx -p "$tmp" -c "$tmp/nginx.conf" -e "$tmp/nginx-error.log" >"$tmp/server.out" 2>&1 &
else
  "$corral" serve --listen "127.0.0.1:$port" --no-access-log --log-level warn >"$tmp/server.out" 2>&1 &
fi
server_pid=$!
for _ in $(seq 100); do
  curl -fsS -o /dev/null "http://127.0.0.1:$port/hello" 2>/dev/null && break
  kill -0 "$server_pid" 2>/dev/null || { cat "$tmp/server.out" >&2; exit 1; }
  sleep 0.1
done

traced_pid="$server_pid"
if [[ "$server" == nginx ]]; then  # the worker serves; the master only waits
  traced_pid=$(awk '{ print $1 }' "/proc/$server_pid/task/$server_pid/children")
fi
strace -f -c -o "$tmp/strace.txt" -p "$traced_pid" 2>"$tmp/strace.err" &
strace_pid=$!
for _ in $(seq 100); do  # wait until the tracer is attached
  [[ "$(awk '/^TracerPid:/ { print $2 }' "/proc/$traced_pid/status")" != 0 ]] && break
  sleep 0.05
done

python3 - "$port" "$requests" "$conns" "$depth" <<'EOF'
import socket, sys
port, n, conns, depth = (int(a) for a in sys.argv[1:5])
req = b"GET /hello HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(conns)]
for s in socks:
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

def read_responses(s, count, buf):
    got = 0
    while got < count:
        end = buf.find(b"\r\n\r\n")
        if end >= 0:
            head = buf[:end].decode()
            length = 0
            for line in head.split("\r\n")[1:]:
                k, _, v = line.partition(":")
                if k.strip().lower() == "content-length":
                    length = int(v)
            if not head.startswith("HTTP/1.1 200"):
                sys.exit("unexpected response: " + head.splitlines()[0])
            if len(buf) >= end + 4 + length:
                buf = buf[end + 4 + length:]
                got += 1
                continue
        chunk = s.recv(65536)
        if not chunk:
            sys.exit("server closed the connection")
        buf += chunk
    return buf

bufs = [b""] * conns
sent = 0
i = 0
while sent < n:
    k = min(depth, n - sent)
    s = socks[i % conns]
    s.sendall(req * k)
    bufs[i % conns] = read_responses(s, k, bufs[i % conns])
    sent += k
    i += 1
for s in socks:
    s.close()
EOF

sleep 0.2  # let the server see the closes (their reads and epoll calls are counted too)
kill -INT "$strace_pid"
wait "$strace_pid" 2>/dev/null || true
strace_pid=""

echo "$server: $requests keep-alive requests (GET /hello) on $conns connections, $depth per write"
echo
awk -v n="$requests" '
  $1 ~ /^[0-9.]+$/ && NF >= 5 && $NF != "total" {
    per[$NF] = $4 / n; total += $4
  }
  END {
    printf "%-14s %10s\n", "syscall", "per request"
    split("read recvfrom readv write writev sendto sendmsg sendfile epoll_wait epoll_ctl accept4 close", order, " ")
    for (i = 1; i in order; i++) if (order[i] in per) { printf "%-14s %10.3f\n", order[i], per[order[i]]; shown[order[i]] = 1 }
    for (k in per) if (!(k in shown)) printf "%-14s %10.3f\n", k, per[k]
    printf "%-14s %10.3f\n", "total", total / n
  }' "$tmp/strace.txt"
echo
echo "(strace -c summary:)"
cat "$tmp/strace.txt"
