#!/usr/bin/env bash
# cpack's .deb from this build tree: its control data (Depends from dpkg-shlibdeps, the
# maintainer scripts, the conffiles), its files, and corral run from where `dpkg-deb -x` unpacked
# it: --version, `check` on a good configuration, on the packaged one and on a bad one.
# Usage: test_deb.sh BUILD_DIR
set -Eeuo pipefail
build=$1

for tool in cpack dpkg-deb dpkg-shlibdeps; do
  command -v "$tool" >/dev/null ||
    { echo "FAILED: $tool is missing (dpkg-shlibdeps: Debian's dpkg-dev; scripts/deps.sh test)" >&2; exit 1; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAILED: $*" >&2; exit 1; }

# -B: the staging tree and the package go to the temporary directory, not the build tree.
cpack --config "$build/CPackConfig.cmake" -B "$tmp/out" >"$tmp/cpack.log" 2>&1 ||
  { cat "$tmp/cpack.log"; fail "cpack"; }
debs=("$tmp"/out/*.deb)
if [ ${#debs[@]} -ne 1 ] || [ ! -f "${debs[0]}" ]; then fail "cpack made no single .deb: ${debs[*]}"; fi
deb=${debs[0]}

info=$(dpkg-deb -I "$deb")
field() { dpkg-deb -f "$deb" "$1"; }
[ "$(field Package)" = corral ] || fail "Package: $(field Package)"
depends=$(field Depends)
# dpkg-shlibdeps names the libraries the binaries link: GnuTLS (TLS), ngtcp2 (HTTP/3), SQLite
# (the notes worker), the C library.
for lib in libc6 libgnutls30 libngtcp2 libsqlite3-0 procps; do
  [[ $depends == *"$lib"* ]] || fail "Depends lacks $lib: $depends"
done
for script in postinst prerm postrm conffiles; do
  grep -qw "$script" <<<"$info" || fail "the package has no $script"
done
[ "$(dpkg-deb --ctrl-tarfile "$deb" | tar -xOf - ./conffiles)" = \
  "$(printf '/etc/corral/corral.toml\n/etc/logrotate.d/corral')" ] || fail "conffiles"

dpkg-deb -x "$deb" "$tmp/root"
for f in usr/bin/corral usr/bin/corral-notes-worker usr/lib/systemd/system/corral.service \
         usr/lib/systemd/system/corral.socket usr/lib/systemd/system/corral-https.socket \
         usr/lib/sysusers.d/corral.conf etc/corral/corral.toml etc/logrotate.d/corral \
         usr/share/doc/corral/operate.md; do
  [ -e "$tmp/root/$f" ] || fail "the package lacks /$f"
done
[ ! -e "$tmp/root/usr/include" ] || fail "the package holds the development files"

corral=$tmp/root/usr/bin/corral
"$corral" --version | grep -q "^corral $(field Version)$" || fail "corral --version: $("$corral" --version)"
cat >"$tmp/good.toml" <<'TOML'
listen = "127.0.0.1:8080"
state_dir = "/var/lib/corral"
TOML
"$corral" check --config "$tmp/good.toml" || fail "corral check on a good configuration"
"$corral" check --config "$tmp/root/etc/corral/corral.toml" ||
  fail "corral check on the packaged /etc/corral/corral.toml"
printf 'listen = "127.0.0.1:8080"\nno_such_key = 1\n' >"$tmp/bad.toml"
status=0
"$corral" check --config "$tmp/bad.toml" >"$tmp/bad.out" 2>&1 || status=$?
[ "$status" -eq 78 ] || fail "corral check on a bad configuration exited $status, not 78"
echo "ok: $(basename "$deb"), Depends: $depends"
