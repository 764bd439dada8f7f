#!/usr/bin/env bash
# Installs the Debian packages corral needs, only those missing; silent when nothing is.
# Usage: scripts/deps.sh build|test|bench
set -euo pipefail

build=(cmake ninja-build g++ pkg-config node-llhttp nlohmann-json3-dev libtomlplusplus-dev
       libcli11-dev libfmt-dev libgtest-dev libgmock-dev libbenchmark-dev libsqlite3-dev
       libgnutls28-dev zlib1g-dev libngtcp2-dev libngtcp2-crypto-gnutls-dev libnghttp3-dev
       libbpf-dev clang)
test=(libclang-rt-14-dev ngtcp2-client chromium curl python3 python3-pytest python3-requests python3-websockets)
bench=(wrk nginx-light strace ngtcp2-server)

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
[ ${#missing[@]} -eq 0 ] && exit 0

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "corral: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq >/dev/null
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
