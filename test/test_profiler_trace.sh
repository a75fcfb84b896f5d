#!/usr/bin/env bash
# test/test_profiler_trace.sh - the example profiler plugin end to end (`make test-profiler`, CI):
# gcomm_perf on 4 ranks with every collective and the trace plugin loaded by its short name
# (GCOMM_PROFILER_PLUGIN=trace, found through LD_LIBRARY_PATH), then tools/gcomm_trace.py merges
# the 4 files and checks the result (valid JSON, one track per rank, children inside their
# parents, threads that nest). Prints PASS/FAIL lines and "N passed, N failed" like test/run.sh.
set -u
BUILD=${BUILD:-build}
MPIEXEC=${MPIEXEC:-mpiexec}
NP=${TEST_PROFILER_NP:-4}
here=$(cd "$(dirname "$0")/.." && pwd)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
passed=0
failed=0
report() { # status what [why]
  if [ "$1" = 0 ]; then
    echo "PASS $2"
    passed=$((passed + 1))
  else
    echo "FAIL $2${3:+: $3}"
    failed=$((failed + 1))
  fi
}

# as test/run.sh: MPI's and hwloc's own leaks are not gcomm's (a SAN=1 build)
export LSAN_OPTIONS="suppressions=$here/test/lsan.supp:print_suppressions=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
export HWLOC_PLUGINS_PATH=${HWLOC_PLUGINS_PATH:-/nonexistent}

flags=()
if "$MPIEXEC" --version 2>&1 | grep -qi "open mpi\|openrte"; then
  flags+=(--oversubscribe)
  [ "$(id -u)" = 0 ] && flags+=(--allow-run-as-root)
fi

LD_LIBRARY_PATH="$here/$BUILD/examples${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
  GCOMM_PROFILER_PLUGIN=trace GCOMM_PROFILER_TRACE="$dir/trace-%r.json" \
  timeout -k 10 300 "$MPIEXEC" "${flags[@]}" -n "$NP" "$here/$BUILD/gcomm_perf" --coll all \
  -b 1K -e 64K -f 8 -n 2 -w 1 >"$dir/perf.log" 2>&1
rc=$?
wrong=$(awk '$1 ~ /^[0-9]+$/ && ($9 != 0 || ($13 != 0 && $13 != "N/A"))' "$dir/perf.log" | wc -l)
[ "$rc" = 0 ] && [ "$wrong" = 0 ]
report $? "profiler trace: gcomm_perf --coll all on $NP ranks with the trace plugin" \
  "exit status $rc, $wrong rows with wrong results; $(tail -3 "$dir/perf.log" | tr '\n' ' ')"

files=("$dir"/trace-*.json)
[ "${#files[@]}" = "$NP" ] && [ -s "${files[0]}" ]
report $? "profiler trace: one file per rank" "found ${files[*]}"

python3 "$here/tools/gcomm_trace.py" --check --ranks "$NP" -o "$dir/merged.json" "${files[@]}" \
  >"$dir/check.log" 2>&1
rc=$?
cat "$dir/check.log"
report $rc "profiler trace: merged trace valid, $NP tracks, children inside their parents" \
  "$(grep -m3 'problem\|Error' "$dir/check.log" | tr '\n' ' ')"

colls=$(grep -cE '^  (AllReduce|Broadcast|Reduce|AllGather|ReduceScatter|AllToAll|Gather|Scatter|Send|Recv) ' "$dir/check.log")
[ "$colls" -ge 30 ]
report $? "profiler trace: summary has every collective and size" "$colls rows"

echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
