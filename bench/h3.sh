#!/usr/bin/env bash
# bench/h3.sh: HTTP/3, corral against Debian's gtlsserver (the ngtcp2 0.12.1 example server, same
# libraries) in one run, one server at a time, with the same certificate and the same files.
#
#   bench/h3.sh [--handshakes N] [--concurrency C] [--size MiB]
#
# Cases: (1) handshakes/s: N gtlsclient runs, C at a time, each a full QUIC + TLS 1.3 handshake and
# one small request (the client process start is in every number, the same for both servers);
# (2) one download of a SIZE MiB file (default 100), MiB/s, three runs, the best kept.
# The server runs pinned to CPU 0 (corral: --processes 1), the clients on CPU 1. Nothing is
# pass/fail; the ratio corral/gtlsserver is what to read.
#
# Environment: CORRAL_BIN (default: build/release/corral, built if missing).
# Needs: gtlsclient, gtlsserver, openssl, python3, taskset (scripts/deps.sh bench).
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
help_lines=2,15

handshakes=300
concurrency=10
size=100
parse_flags "--handshakes handshakes --concurrency concurrency --size size" "$@"

for tool in gtlsclient gtlsserver openssl python3 taskset; do
  command -v "$tool" >/dev/null || [[ -x /usr/sbin/$tool ]] ||
    { echo "h3.sh: '$tool' not found (scripts/deps.sh bench)" >&2; exit 2; }
done
find_corral --quiet

make_tmp corral-h3bench

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$tmp/key.pem" \
  -out "$tmp/cert.pem" -days 2 -subj /CN=localhost \
  -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" 2>/dev/null
mkdir -p "$tmp/www"
head -c $((size << 20)) /dev/urandom >"$tmp/www/big.bin"
printf 'hello' >"$tmp/www/hello"

client() { taskset -c 1 /usr/bin/python3 "$root/bench/h3_bench.py" "$@"; }

measure() {  # name port
  local name="$1" port="$2" hs dl best=0
  sleep 0.5
  client handshakes "$port" /hello 20 5 >/dev/null  # warm-up
  hs=$(client handshakes "$port" /hello "$handshakes" "$concurrency")
  for _ in 1 2 3; do
    dl=$(client download "$port" /big.bin $((size << 20)))
    rate=$(sed -E 's/.*mib_per_s=([0-9.]+).*/\1/' <<<"$dl")
    best=$(python3 -c "print(max($best, $rate))")
  done
  echo "$name: $hs; download ${size} MiB best of 3: ${best} MiB/s"
  eval "${name}_hs=$(sed -E 's/.*handshakes_per_s=([0-9.]+).*/\1/' <<<"$hs")"
  eval "${name}_dl=$best"
}

# gtlsserver: KEY then CERT on its command line.
port=$(free_port)
taskset -c 0 gtlsserver -q -d "$tmp/www" 127.0.0.1 "$port" "$tmp/key.pem" "$tmp/cert.pem" \
  >"$tmp/gtlsserver.log" 2>&1 &
server_pid=$!
measure gtlsserver "$port"
stop_server

port=$(free_port)
cat >"$tmp/corral.toml" <<EOF
state_dir = "$tmp/state"
access_log = false
[tls]
listen = "127.0.0.1:$port"
cert = "$tmp/cert.pem"
key = "$tmp/key.pem"
EOF
taskset -c 0 "$corral" serve "$tmp/www" --processes 1 --listen 127.0.0.1:0 --config "$tmp/corral.toml" \
  >"$tmp/corral.log" 2>&1 &
server_pid=$!
measure corral "$port"

python3 - "$gtlsserver_hs" "$corral_hs" "$gtlsserver_dl" "$corral_dl" <<'EOF'
import sys
g_hs, c_hs, g_dl, c_dl = map(float, sys.argv[1:])
print(f"ratio corral/gtlsserver: handshakes/s {c_hs / g_hs:.2f}x, download {c_dl / g_dl:.2f}x")
EOF
