#!/usr/bin/env bash
# `systemd-analyze verify` on packaging/'s units, corral taking corral.service's ExecStart=
# arguments, systemd-sysusers on the sysusers.d file, and logrotate running its file once.
# Usage: test_units.sh PACKAGING_DIR CORRAL_BINARY
#
# verify needs the ExecStart= program to exist: the units are checked as copies whose
# /usr/bin/corral is CORRAL_BINARY (the built one), in a temporary directory. verify exits 0 on
# an unknown key or a value it ignores, so any line it prints is a failure too.
set -Eeuo pipefail
packaging=$(realpath "$1")
binary=$(realpath "$2")

for tool in systemd-analyze:systemd systemd-sysusers:systemd logrotate:logrotate; do
  if ! command -v "${tool%:*}" >/dev/null; then
    echo "FAILED: ${tool%:*} is missing; install Debian's ${tool#*:} package (scripts/deps.sh test)" >&2
    exit 1
  fi
done

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

units=()
for unit in corral.service corral.socket corral-https.socket; do
  sed "s|/usr/bin/corral|$binary|g" "$packaging/$unit" >"$tmp/$unit"
  units+=("$tmp/$unit")
done

status=0
if ! out=$(cd "$tmp" && systemd-analyze verify --man=no "${units[@]}" 2>&1); then status=1; fi
if [ "$status" -ne 0 ] || [ -n "$out" ]; then
  echo "FAILED: systemd-analyze verify (exit $status):" >&2
  echo "$out" >&2
  exit 1
fi

# ExecStart='s command line is one corral takes: with /etc/corral/corral.toml replaced by a file
# with a bad key, corral must get as far as reading it (exit 78), not stop at an argument.
read -ra command <<<"$(sed -n 's/^ExecStart=//p' "$packaging/corral.service")"
printf 'no_such_key = 1\n' >"$tmp/bad.toml"
command=("${command[@]/#\/usr\/bin\/corral/$binary}")
command=("${command[@]/#\/etc\/corral\/corral.toml/$tmp/bad.toml}")
command=("${command[@]/#\/var\/lib\/corral/$tmp/state}")
status=0
out=$("${command[@]}" 2>&1) || status=$?
if [ "$status" -ne 78 ] || ! grep -q "no_such_key" <<<"$out"; then
  echo "FAILED: ExecStart= as corral runs it (${command[*]}) exited $status, not 78:" >&2
  echo "$out" >&2
  exit 1
fi

# sysusers.d(5): the user the service runs as, made in an empty root (nothing written).
mkdir "$tmp/root"
if ! out=$(systemd-sysusers --dry-run --root="$tmp/root" "$packaging/corral.sysusers" 2>&1) ||
   ! grep -q "Creating user 'corral'" <<<"$out"; then
  echo "FAILED: systemd-sysusers on corral.sysusers:" >&2
  echo "$out" >&2
  exit 1
fi
# logrotate(8): the file rotates a log in a directory of ours, and runs its postrotate (its
# systemctl line replaced by a mark; the line itself is checked by name).
grep -q "systemctl kill --kill-who=main --signal=USR1 corral.service" "$packaging/logrotate/corral" ||
  { echo "FAILED: the logrotate file does not signal corral's main process" >&2; exit 1; }
mkdir "$tmp/log"
echo "a line" >"$tmp/log/access.log"
sed -e "s|/var/log/corral|$tmp/log|" -e "s|systemctl kill .*|touch $tmp/signalled|" \
  "$packaging/logrotate/corral" >"$tmp/logrotate.conf"
if ! out=$(logrotate --force --state "$tmp/logrotate.state" "$tmp/logrotate.conf" 2>&1) ||
   [ -n "$out" ] || [ ! -s "$tmp/log/access.log.1" ] || [ ! -e "$tmp/signalled" ]; then
  echo "FAILED: logrotate on packaging/logrotate/corral:" >&2
  echo "$out" >&2
  ls -l "$tmp/log" >&2
  exit 1
fi
echo "ok: corral.service, corral.socket, corral-https.socket, corral.sysusers, logrotate/corral"
