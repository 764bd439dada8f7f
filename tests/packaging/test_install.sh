#!/usr/bin/env bash
# `cmake --install` of this build tree into a temporary prefix, then examples/hello built on its
# own against it: with find_package(corral) (CMake), and linked again from pkg-config's flags
# (corral.pc). The CMake-built hello serves one request on a free port.
# Usage: test_install.sh BUILD_DIR SOURCE_DIR
set -Eeuo pipefail
build=$1
source=$2

tmp=$(mktemp -d)
pid=
cleanup() {
  if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAILED: $*" >&2; exit 1; }

prefix=$tmp/prefix
cmake --install "$build" --prefix "$prefix" >"$tmp/install.log" || { cat "$tmp/install.log"; fail "cmake --install"; }
for f in bin/corral bin/corral-notes-worker include/corral/http/runner.h include/corral/llhttp.h \
         lib/cmake/corral/corralConfig.cmake lib/cmake/corral/corralConfigVersion.cmake \
         lib/cmake/corral/corralTargets.cmake lib/pkgconfig/corral.pc lib/libcorral_http.a \
         lib/systemd/system/corral.service lib/systemd/system/corral.socket; do
  [ -e "$prefix/$f" ] || fail "cmake --install did not install $f"
done
# The system component (/etc) is the package's alone.
! grep -q "^/etc/" "$build/install_manifest.txt" || fail "a plain install wrote to /etc"
"$prefix/bin/corral" --version | grep -q "^corral " || fail "installed corral --version"

# The example on its own: configured and built against the prefix only (nothing of corral's tree
# is rebuilt: the standalone project has no corral targets of its own).
cmake -S "$source/examples/hello" -B "$tmp/hello" -G Ninja -DCMAKE_BUILD_TYPE=Debug \
      -DCMAKE_PREFIX_PATH="$prefix" >"$tmp/configure.log" 2>&1 ||
  { cat "$tmp/configure.log"; fail "configuring examples/hello against the installed corral"; }
cmake --build "$tmp/hello" >"$tmp/build.log" 2>&1 ||
  { cat "$tmp/build.log"; fail "building examples/hello against the installed corral"; }

# pkg-config: the same object linked with corral.pc's flags alone.
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
pkg-config --print-errors --exists corral || fail "pkg-config does not take corral.pc"
object=$(find "$tmp/hello" -name 'main.cc.o' | head -n1)
# shellcheck disable=SC2046 # the flags are words
c++ -o "$tmp/hello-pc" "$object" $(pkg-config --libs corral) ||
  fail "linking examples/hello with \`pkg-config --libs corral\`"
# shellcheck disable=SC2046
c++ -std=c++20 -fsyntax-only $(pkg-config --cflags corral) "$source/examples/hello/main.cc" ||
  fail "compiling examples/hello with \`pkg-config --cflags corral\`"

# Serve on a port the kernel picks; the address is in the "listening" event line on stderr.
mkfifo "$tmp/log"
"$tmp/hello/example_hello" 127.0.0.1:0 2>"$tmp/log" &
pid=$!
exec 3<"$tmp/log"
addr=
while IFS= read -r -t 30 line <&3; do
  if [[ $line =~ listening.*address=\"?([0-9.]+:[0-9]+) ]]; then
    addr=${BASH_REMATCH[1]}
    break
  fi
done
[ -n "$addr" ] || fail "the installed-package hello did not say where it listens"
body=$(curl -sS --max-time 10 "http://$addr/greet/installed")
[[ $body == *'"hello installed"'* ]] || fail "GET /greet/installed answered: $body"
kill -TERM "$pid"
wait "$pid" || fail "hello exited $? on SIGTERM"
pid=
exec 3<&-
echo "ok: installed into a prefix; examples/hello built with find_package(corral) and pkg-config, served $addr"
