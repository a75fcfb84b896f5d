#!/usr/bin/env bash
# test/run.sh - runs every test program under $MPIEXEC -n N for several N (`make test` calls it),
# then the test scripts that start their own jobs (test_info.sh) or need none (test_schedule.sh)
# once each.
#
# Each program prints "PASS what" / "FAIL what: why" lines (rank 0); this script counts them. A run
# that exits non-zero (a crash, a sanitizer report, a leak), hangs past its timeout, or prints no
# PASS line counts as one more failure. Each run's output (stdout, and stderr with the warnings of
# tests that provoke errors on purpose) goes to a log file; the screen gets one line per program
# and rank count, and for a failed run its FAIL lines and the tail of its log. The last line is
# "N passed, N failed"; the exit status is non-zero when anything failed.
#
# Environment: BUILD (build directory, default build), MPIEXEC (default mpiexec),
#   TEST_NPS     rank counts to use (default "1 2 3 4 5 8"; a test's own minimum still applies)
#   TEST_ONLY    run only the tests whose names match this extended regex
#   TEST_TIMEOUT seconds one run may take (default 300)
#   TEST_SEED    the seed of the random data (the programs print it when a check fails)
#   TEST_LOGS    where to keep the logs (default: a temporary folder, removed when all passed)
#   TEST_VERBOSE 1: print every run's whole output as it comes, as well
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
logs=${TEST_LOGS:-$(mktemp -d)}
mkdir -p "$logs"
[ -n "${TEST_LOGS:-}" ] || trap '[ "$failed" = 0 ] && rm -rf "$logs"' EXIT

tests=("$BUILD"/test/*)
if [ ! -e "${tests[0]}" ]; then
  echo "FAIL no test programs in $BUILD/test"
  echo "0 passed, 1 failed"
  exit 1
fi

# Shows what went wrong in one run: its FAIL lines and the last lines of its log.
show_failure() {
  local out=$1 err=$2
  grep '^FAIL ' "$out" | head -20 | sed 's/^/      /'
  echo "      -- last lines of $err (stderr) and $out (stdout):"
  tail -n 30 "$err" | sed 's/^/      | /'
  tail -n 10 "$out" | sed 's/^/      | /'
}

# runCounted LABEL LOGNAME COMMAND...: runs one command under the timeout, counts its PASS/FAIL
# lines and prints one line for it (with its log's tail when something failed).
runCounted() {
  local label=$1 out="$logs/$2.out" err="$logs/$2.err"
  shift 2
  t0=$(date +%s.%N)
  # Only stdout is counted (rank 0 prints the checks there); stderr (warnings, sanitizer
  # reports) goes to its own file, so it cannot split a PASS/FAIL line.
  if [ "${TEST_VERBOSE:-0}" = 1 ]; then
    timeout -k 10 "$TIMEOUT" "$@" 2> >(tee "$err" >&2) | tee "$out"
  else
    timeout -k 10 "$TIMEOUT" "$@" >"$out" 2>"$err"
  fi
  rc=${PIPESTATUS[0]}
  t1=$(date +%s.%N)
  p=$(grep -c '^PASS ' "$out")
  f=$(grep -c '^FAIL ' "$out")
  why=""
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    why="timed out after ${TIMEOUT} s (a hang?)"
  elif [ "$rc" != 0 ]; then
    why="exited with status $rc"
  elif [ "$p" = 0 ]; then
    why="ran no check"
  fi
  [ -z "$why" ] || f=$((f + 1))
  passed=$((passed + p))
  failed=$((failed + f))
  secs=$(awk -v t0="$t0" -v t1="$t1" 'BEGIN { printf "%.1f", t1 - t0 }')
  if [ "$f" = 0 ]; then
    printf 'PASS  %-22s %6d check%s  %7s s\n' "$label" "$p" "$([ "$p" = 1 ] || echo s)" "$secs"
  else
    printf 'FAIL  %-22s %6d passed, %d failed%s  %s s\n' "$label" "$p" "$f" "${why:+ ($why)}" "$secs"
    show_failure "$out" "$err"
  fi
}

# libgfortran hands strndup strings that end at their length, not at a NUL: AddressSanitizer's
# strict_string_checks reads those as C strings and reports an overflow in the runtime, not in gcomm
asan_fortran=""
[ -n "${ASAN_OPTIONS:-}" ] && asan_fortran="ASAN_OPTIONS=$ASAN_OPTIONS:strict_string_checks=0"

start_all=$(date +%s)
for prog in "${tests[@]}"; do
  [ -f "$prog" ] && [ -x "$prog" ] || continue # (a CUDA build also has test/gpu/)
  name=$(basename "$prog")
  if [ -n "${TEST_ONLY:-}" ] && ! [[ $name =~ $TEST_ONLY ]]; then continue; fi
  progEnv=""
  [ "$name" = test_fortran ] && progEnv=$asan_fortran
  for n in $NPS; do
    [ "$n" -ge "$(min_ranks "$name")" ] || continue
    runCounted "$name -n $n" "$name-n$n" env $progEnv \
      "$MPIEXEC" "${mpiexec_flags[@]}" -n "$n" "$prog"
  done
done
# Scripts that start their own jobs (each with the rank counts it needs): run once each.
for script in test_info.sh test_schedule.sh; do
  name=${script%.sh}
  if [ -n "${TEST_ONLY:-}" ] && ! [[ $name =~ $TEST_ONLY ]]; then continue; fi
  runCounted "$name" "$name" env BUILD="$BUILD" MPIEXEC="$MPIEXEC" bash "$here/$script"
done
echo "== all tests: $(($(date +%s) - start_all)) s"
[ "$failed" = 0 ] || echo "== logs of every run: $logs"
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
