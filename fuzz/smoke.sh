#!/usr/bin/env bash
# Fuzzing smoke (STYLE rule 11): runs every fuzzer built by the `fuzz` preset for a few seconds over
# a scratch copy of its checked-in corpus (so the tree is never written), with the shared
# dictionary. Exits 1 if any fuzzer crashes or finds a leak or timeout (its crash input is kept
# and printed), 77 (ctest SKIP_RETURN_CODE) when the fuzzers are not built.
#
# Usage: fuzz/smoke.sh [seconds per fuzzer, default 15] [build dir, default build/fuzz]
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
seconds="${1:-${CORRAL_FUZZ_SECONDS:-15}}"
build="${2:-$root/build/fuzz}"
bin_dir="$build/fuzz"

shopt -s nullglob
fuzzers=()
for src in "$root"/fuzz/*_fuzz.cc; do
  name="$(basename "$src" .cc)"
  if [[ ! -x "$bin_dir/$name" ]]; then
    echo "fuzz smoke: $bin_dir/$name is not built (cmake --build --preset fuzz --target fuzzers); skipping"
    exit 77
  fi
  fuzzers+=("$name")
done
if [[ ${#fuzzers[@]} -eq 0 ]]; then
  echo "fuzz smoke: no fuzz/*_fuzz.cc"
  exit 77
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/corral-fuzz.XXXXXX")"
failed=0
for name in "${fuzzers[@]}"; do
  target="${name%_fuzz}"
  corpus="$work/corpus-$target"
  mkdir -p "$corpus" "$work/artifacts-$target"
  if [[ -d "$root/fuzz/corpus/$target" ]]; then cp -R "$root/fuzz/corpus/$target/." "$corpus/"; fi
  log="$work/$target.log"
  # The fuzzers are built with ASan+UBSan; make UBSan findings fatal, as in the unit tests.
  UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}" \
    "$bin_dir/$name" "$corpus" -dict="$root/fuzz/http.dict" -max_len=4096 \
    -max_total_time="$seconds" -error_exitcode=1 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$work/artifacts-$target/" >"$log" 2>&1
  rc=$?
  execs="$(grep -m1 '^stat::number_of_executed_units' "$log" | awk '{print $2}')"
  if [[ $rc -ne 0 ]]; then
    failed=1
    echo "fuzz smoke: $name FAILED (exit $rc)"
    tail -n 60 "$log"
    for a in "$work/artifacts-$target"/*; do
      echo "--- crash input $a (base64):"
      base64 "$a"
    done
  else
    echo "fuzz smoke: $name ok, ${execs:-?} runs in ${seconds}s"
  fi
done
if [[ $failed -eq 0 ]]; then rm -rf "$work"; else echo "fuzz smoke: logs and inputs in $work"; fi
exit $failed
