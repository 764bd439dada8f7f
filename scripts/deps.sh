#!/usr/bin/env bash
# Installs the Debian packages corral needs, only those missing; silent when nothing is.
# Usage: scripts/deps.sh build|test|bench
#
# `test` installs every program a test runs (tests/e2e, tests/quic, tests/worker, tests/node,
# fuzz/smoke.sh, tests/packaging): curl, openssl, wrk (e2e.test_fanout), gtlsclient
# (ngtcp2-client), chromium, pgrep (procps), python3 with pytest/requests/websockets, node + npm,
# clang's libFuzzer runtime, systemd-analyze (systemd), logrotate, dpkg-shlibdeps (dpkg-dev) and
# file for cpack, promtool (prometheus: e2e.test_metrics checks /metrics with it) and
# python3-prometheus-client (its strict OpenMetrics parser reads /metrics' OpenMetrics body there),
# etcd (etcd-server, etcdctl from etcd-client) and haproxy for the cluster tests, pebble (an ACME
# server with its test CA) for automatic HTTPS, nghttp/h2load (nghttp2-client) and python3-h2 for
# the HTTP/2 tests.
# A test that needs a program not listed here fails on a fresh machine: add it here.
set -Eeuo pipefail
. "$(dirname "$0")/steps.sh"
trap 'on_error $LINENO' ERR

# python3: CMake's configure finds it for the tests (tests/CMakeLists.txt) in every preset.
build=(cmake ninja-build g++ pkg-config python3 node-llhttp nlohmann-json3-dev libtomlplusplus-dev
       libcli11-dev libfmt-dev libgtest-dev libgmock-dev libbenchmark-dev libsqlite3-dev
       libgnutls28-dev zlib1g-dev libngtcp2-dev libngtcp2-crypto-gnutls-dev libnghttp3-dev
       libbpf-dev clang libnghttp2-dev)
test=(libclang-rt-14-dev ngtcp2-client chromium curl openssl procps wrk jq python3 python3-pytest
      python3-requests python3-websockets systemd logrotate dpkg-dev file prometheus
      python3-prometheus-client etcd-server etcd-client haproxy pebble nghttp2-client python3-h2)
bench=(nginx-light strace ngtcp2-server)

want=("${build[@]}")
case "${1:-build}" in
  build) ;;
  test) want+=("${test[@]}") ;;
  bench) want+=("${test[@]}" "${bench[@]}") ;;
  *) echo "usage: $0 build|test|bench" >&2; exit 2 ;;
esac

missing=()
for p in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Node.js and npm: any install will do (this machine kind ships NodeSource's nodejs, which bundles
# npm and conflicts with Debian's npm package); install Debian's only when the commands are absent.
if [ "${1:-build}" != build ]; then
  command -v node >/dev/null 2>&1 || missing+=(nodejs)
  command -v npm >/dev/null 2>&1 || missing+=(npm)
fi

if [ ${#missing[@]} -gt 0 ]; then
  sudo=()
  [ "$(id -u)" -eq 0 ] || sudo=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  quiet_step "apt-get update" \
    "check the network and the APT sources (/etc/apt/sources.list.d/), then rerun" \
    "${sudo[@]}" apt-get update
  # Debian's npm alone pulls in a few hundred node-* packages; chromium is ~100 MB.
  say "missing: ${missing[*]}"
  quiet_step "apt-get install (${#missing[@]} packages)" \
    "read apt's messages above; run the same apt-get install by hand to see the whole story" \
    "${sudo[@]}" apt-get install -y --no-install-recommends "${missing[@]}"
fi

# The Node test clients (tests/node/package-lock.json: undici 6, ws 8) need Node >= 18.17
# (Debian 12 ships 18.19).
if [ "${1:-build}" != build ] &&
   ! node -e 'const [a, b] = process.versions.node.split(".").map(Number);
              process.exit(a > 18 || (a === 18 && b >= 17) ? 0 : 1)'; then
  say "FAILED: node $(node --version) is older than 18.17, which tests/node's undici needs"
  say "what to do: install Debian 12's nodejs (18.19) or newer"
  exit 1
fi
