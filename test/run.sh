#!/usr/bin/env bash
# test/run.sh - runs every test program under $MPIEXEC -n N for several N (`make test` calls it),
# then the test scripts that start their own jobs (test_info.sh) once each.
#
# Each program prints "PASS what" / "FAIL what: why" lines (rank 0); this script counts them. A run
# that exits non-zero (a crash, a sanitizer report, a leak), hangs past its timeout, or prints no
# PASS line counts as one more failure. The last line is "N passed, N failed"; the exit status is
# non-zero when anything failed.
#
# Environment: BUILD (build directory, default build), MPIEXEC (default mpiexec),
#   TEST_NPS     rank counts to use (default "1 2 3 4 5 8"; a test's own minimum still applies)
#   TEST_ONLY    run only the tests whose names match this extended regex
#   TEST_TIMEOUT seconds one run may take (default 300)
#   TEST_SEED    the seed of the random data (the programs print it when a check fails)
set -u

BUILD=${BUILD:-build}
MPIEXEC=${MPIEXEC:-mpiexec}
NPS=${TEST_NPS:-"1 2 3 4 5 8"}
TIMEOUT=${TEST_TIMEOUT:-300}
here=$(cd "$(dirname "$0")" && pwd)

# Rank counts each test needs at least (default 1).
min_ranks() {
  case "$1" in
    *) echo 1 ;;
  esac
}

# Open MPI refuses more ranks than cores, and root, unless told.
mpiexec_flags=()
if "$MPIEXEC" --version 2>&1 | grep -qi "open mpi\|openrte"; then
  mpiexec_flags+=(--oversubscribe)
  [ "$(id -u)" = 0 ] && mpiexec_flags+=(--allow-run-as-root)
fi

# Leaks inside MPI and its libraries are not gcomm's (see test/lsan.supp). hwloc (under MPI_Init)
# leaks from plugins it dlopens and unloads before LeakSanitizer looks, so their stacks have no
# names to suppress: keep it from loading plugins (the tests need no PCI or GL topology).
export LSAN_OPTIONS="suppressions=$here/lsan.supp:print_suppressions=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
export HWLOC_PLUGINS_PATH=${HWLOC_PLUGINS_PATH:-/nonexistent}

passed=0
failed=0
out=$(mktemp)
trap 'rm -f "$out"' EXIT

tests=("$BUILD"/test/*)
if [ ! -e "${tests[0]}" ]; then
  echo "FAIL no test programs in $BUILD/test"
  echo "0 passed, 1 failed"
  exit 1
fi

# runCounted LABEL COMMAND...: runs one command under the timeout and counts its PASS/FAIL lines.
runCounted() {
  local label=$1
  shift
  echo "== $label"
  t0=$(date +%s.%N)
  # Only stdout is counted (rank 0 prints the checks there); stderr (warnings, sanitizer
  # reports) goes straight through, so it cannot split a PASS/FAIL line.
  timeout -k 10 "$TIMEOUT" "$@" | tee "$out"
  rc=${PIPESTATUS[0]}
  t1=$(date +%s.%N)
  p=$(grep -c '^PASS ' "$out")
  f=$(grep -c '^FAIL ' "$out")
  passed=$((passed + p))
  failed=$((failed + f))
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    echo "FAIL $label: timed out after ${TIMEOUT} s (a hang?); last check above"
    failed=$((failed + 1))
  elif [ "$rc" != 0 ]; then
    echo "FAIL $label: exited with status $rc"
    failed=$((failed + 1))
  elif [ "$p" = 0 ]; then
    echo "FAIL $label: ran no check"
    failed=$((failed + 1))
  fi
  awk -v t0="$t0" -v t1="$t1" -v label="$label" -v p="$p" -v f="$f" \
    'BEGIN { printf "== %s: %d PASS, %d FAIL lines, %.1f s\n", label, p, f, t1 - t0 }'
}

start_all=$(date +%s)
for prog in "${tests[@]}"; do
  [ -f "$prog" ] && [ -x "$prog" ] || continue # (a CUDA build also has test/gpu/)
  name=$(basename "$prog")
  if [ -n "${TEST_ONLY:-}" ] && ! [[ $name =~ $TEST_ONLY ]]; then continue; fi
  for n in $NPS; do
    [ "$n" -ge "$(min_ranks "$name")" ] || continue
    runCounted "$name -n $n" "$MPIEXEC" "${mpiexec_flags[@]}" -n "$n" "$prog"
  done
done
# Scripts that start their own jobs (each with the rank counts it needs): run once each.
for script in test_info.sh; do
  name=${script%.sh}
  if [ -n "${TEST_ONLY:-}" ] && ! [[ $name =~ $TEST_ONLY ]]; then continue; fi
  runCounted "$name" env BUILD="$BUILD" MPIEXEC="$MPIEXEC" bash "$here/$script"
done
echo "== all tests: $(($(date +%s) - start_all)) s"
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
