#!/usr/bin/env bash
# test/test_schedule.sh - gcomm_schedule (tools/gcomm_schedule.c), run once by test/run.sh: every
# collective's schedule for every algorithm on 1 to 8 ranks checked against the collective's
# definition by an independent simulation (test/schedule_check.py); the 4-rank ring all-reduce
# table is the textbook one; every picture is valid XML; the pictures in docs/schedules are what
# their commands (kept in each picture's <desc>) draw now; bad arguments get exit status 2.
# Prints PASS/FAIL lines. Environment: BUILD (default build).
set -u
BUILD=${BUILD:-build}
here=$(cd "$(dirname "$0")" && pwd)
tool=$BUILD/gcomm_schedule
CHECK_NAME=gcomm_schedule
source "$here/checks.sh"
# valid_xml FILE: xmllint where installed, else Python's parser
valid_xml() {
  if command -v xmllint >/dev/null; then
    xmllint --noout "$1" 2>"$tmp/err"
  else
    python3 -c 'import sys, xml.dom.minidom; xml.dom.minidom.parse(sys.argv[1])' "$1" 2>"$tmp/err"
  fi
}

if [ ! -x "$tool" ]; then
  echo "FAIL gcomm_schedule: no $tool (make builds it)"
  exit 0
fi

# the data movement of every schedule, simulated independently (one PASS/FAIL line per case)
python3 "$here/schedule_check.py" "$tool" || true

# the 4-rank ring all-reduce: reduce-scatter in 4 rounds (rank r finishes chunk r), then all-gather
check "ring all-reduce on 4 ranks: exit 0" run 0 "$tool" --coll allreduce --algo ring -n 4
check "ring all-reduce: 7 rounds" has "ring: 7 rounds, a rank runs at most 7 steps"
check "ring all-reduce: round 0 sends in[r-1] to r+1" \
  grep -qE '^ +0 \| in\[3\] -> send 1 +\| in\[0\] -> send 2 +\| in\[1\] -> send 3 +\| in\[2\] -> send 0$' "$tmp/out"
check "ring all-reduce: round 3 finishes chunk r on rank r" \
  grep -qE '^ +3 \| in\[0\] \+ recv 3 -> out\[0\], send 1 +\| in\[1\] \+ recv 0 -> out\[1\], send 2 ' "$tmp/out"
check "ring all-reduce: round 6 receives the last chunk" \
  grep -qE '^ +6 \| recv 3 -> out\[1\] +\| recv 0 -> out\[2\] +\| recv 1 -> out\[3\] +\| recv 2 -> out\[0\]$' "$tmp/out"
check "an algorithm a collective lacks is named with the one gcomm runs" \
  run 0 "$tool" --coll allgather --algo tree -n 3
check "... (allgather tree runs ring)" has "algorithm ring (allgather has no tree: gcomm runs this)"

# recursive doubling: exchange k swaps groups of 2^k blocks with rank r ^ 2^k (on other rank counts
# the dissemination pattern: r sends its 2^k blocks to r - 2^k); where it does not fit, direct runs
# and the header says why
check "recdbl all-gather on 4 ranks: exit 0" run 0 "$tool" --coll allgather --algo recdbl -n 4 --chunk 2
check "recdbl all-gather: 4 rounds" has "algorithm recdbl: 4 rounds, a rank runs at most 4 steps"
check "recdbl all-gather: exchange 1 sends a rank's pair of blocks to r ^ 2" \
  grep -qE '^ +2 \| out\[0\.\.1\] -> send 2 +\| out\[0\.\.1\] -> send 3 +\| out\[2\.\.3\] -> send 0 ' "$tmp/out"
check "recdbl all-gather on 5 ranks (dissemination): exit 0" \
  run 0 "$tool" --coll allgather --algo recdbl -n 5 --chunk 4
check "... 3 exchanges of 4 steps" has "algorithm recdbl: 12 rounds, a rank runs at most 12 steps"
check "... exchange 1 sends blocks r, r+1 to r - 2, split where they pass block 4" \
  grep -qE '^ +5 \| .*\| out\[0\] -> send 2 *$' "$tmp/out"
check "recdbl all-gather on 3 ranks, 2 blocks not in a chunk, runs direct: exit 0" \
  run 0 "$tool" --coll allgather --algo recdbl -n 3 --chunk 1
check "... (says recdbl does not fit)" has "algorithm direct (recdbl does not fit"

# every picture is XML: every collective's on 5 ranks, the all-reduce's on 1 and 2 too
bad=""
for coll in allreduce broadcast reduce allgather reducescatter alltoall gather scatter; do
  for algo in ring tree direct twoshot recdbl; do
    for n in 5 $([ $coll = allreduce ] && echo 1 2); do
      if ! run 0 "$tool" --coll "$coll" --algo "$algo" -n "$n" --count 7 --chunk 3 --svg "$tmp/p.svg" ||
        ! valid_xml "$tmp/p.svg"; then
        bad="$bad $coll/$algo/$n"
      fi
    done
  done
done
check "every picture is valid XML${bad:+ (not:$bad)}" [ -z "$bad" ]

# the pictures in docs/ are the schedules gcomm runs now
for svg in "$here"/../docs/schedules/*.svg; do
  [ -f "$svg" ] || continue
  cmd=$(sed -n 's|.*<desc>gcomm_schedule \(.*\)</desc>.*|\1|p' "$svg")
  # shellcheck disable=SC2086 # the command's words
  check "docs/schedules/$(basename "$svg") is what '$cmd' draws" \
    sh -c '"$1" $2 --svg "$3" >/dev/null && cmp -s "$3" "$4"' _ "$tool" "$cmd" "$tmp/d.svg" "$svg"
done

# bad arguments: exit status 2 and a reason
check "--help: exit 0" run 0 "$tool" --help
check "no arguments: exit 2" run 2 "$tool"
check "an unknown collective: exit 2, named" run 2 "$tool" --coll allsum --algo ring -n 4
check "... says so" grep -qF -- "--coll: not a collective" "$tmp/err"
check "an unknown algorithm: exit 2" run 2 "$tool" --coll allreduce --algo star -n 4
check "0 ranks: exit 2" run 2 "$tool" --coll allreduce --algo ring -n 0
check "a root outside the ranks: exit 2" run 2 "$tool" --coll broadcast --algo tree -n 4 --root 4
check "count 0: exit 2" run 2 "$tool" --coll allreduce --algo ring -n 4 --count 0
check "too many steps to show: exit 1, said" run 1 "$tool" --coll allreduce --algo ring -n 8 \
  --count 100000000 --chunk 1
