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
# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

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

need_tools --no-hint strace python3 curl
if [[ "$server" == nginx ]]; then
  corral=""
  nginx_bin=nginx
else
  find_corral --quiet --fallback
fi

make_tmp corral-syscalls
strace_pid=""
cleanup() {  # replaces lib.sh's: the tracer first, then the server
  stop_pid "$strace_pid"
  stop_server
  rm -rf "$tmp"
}

port=$(free_port)
if [[ "$server" == nginx ]]; then
  write_nginx_conf "$port" "worker_processes 1;" "" ""
  "$nginx_bin" -p "$tmp" -c "$tmp/nginx.conf" -e "$tmp/nginx-error.log" >"$tmp/server.out" 2>&1 &
else
  "$corral" serve --config "$tmp/plain.toml" --listen "127.0.0.1:$port" --no-access-log \
    --log-level warn >"$tmp/server.out" 2>&1 &
fi
server_pid=$!
poll_while_alive "$server_pid" curl -fsS -o /dev/null "http://127.0.0.1:$port/hello" 2>/dev/null ||
  { cat "$tmp/server.out" >&2; exit 1; }

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
