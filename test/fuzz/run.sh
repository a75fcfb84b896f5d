#!/usr/bin/env bash
# test/fuzz/run.sh FUZZER SECONDS - runs the libFuzzer target for SECONDS (`make fuzz`) from an
# empty corpus with a seed printed (FUZZ_SEED=N to repeat one), then prints "PASS fuzz: ..." with
# the number of inputs, or "FAIL fuzz: ..." with the finding (a crash, a sanitizer report, a leak,
# an input slower than 10 s, or a violated expectation; the input is kept in FUZZ_ARTIFACTS, default
# ./fuzz-artifacts). The last line is "N passed, N failed".
set -u
fuzzer=$1
seconds=${2:-60}
here=$(cd "$(dirname "$0")" && pwd)
seed=${FUZZ_SEED:-$(date +%s)}
art=${FUZZ_ARTIFACTS:-fuzz-artifacts}
mkdir -p "$art"
export LSAN_OPTIONS="suppressions=$here/../lsan.supp:print_suppressions=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
export HWLOC_PLUGINS_PATH=${HWLOC_PLUGINS_PATH:-/nonexistent}
corpus=$(mktemp -d)
log=$(mktemp)
trap 'rm -rf "$corpus" "$log"' EXIT
echo "== fuzz: $fuzzer for $seconds s, seed $seed"
timeout -k 10 $((seconds + 120)) "$fuzzer" -max_total_time="$seconds" -seed="$seed" -timeout=10 \
  -print_final_stats=1 -artifact_prefix="$art/" "$corpus" >"$log" 2>&1
rc=$?
runs=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$')
if [ "$rc" = 0 ]; then
  echo "PASS fuzz: ${runs:-?} inputs in $seconds s (seed $seed, $(ls "$corpus" | wc -l) in the corpus), no finding"
  echo "1 passed, 0 failed"
  exit 0
fi
grep -E 'ERROR|SUMMARY|expectation|runtime error|Test unit written' "$log" | head -20
echo "FAIL fuzz: exit status $rc after ${runs:-?} inputs (seed $seed); the input is in $art/"
echo "0 passed, 1 failed"
exit 1
