#!/usr/bin/env bash
# test/test_info.sh - gcomm_info (tools/gcomm_info.c), run once by test/run.sh: every section
# printed alone; its self-test passing on 2 ranks, and whether the node's ranks copy once; --json
# valid and holding the same findings; a GCOMM_ variable it does not know named with the nearest
# known one, an invalid value reported and a valid one parsed; and ranks whose settings disagree
# failing with a non-zero exit status.
# Prints PASS/FAIL lines. Environment: BUILD (default build), MPIEXEC (default mpiexec).
set -u
BUILD=${BUILD:-build}
MPIEXEC=${MPIEXEC:-mpiexec}
info=$BUILD/gcomm_info
CHECK_NAME=gcomm_info
source "$(dirname "$0")/checks.sh"

# alone: an MPI singleton
check "runs alone (exit 0)" run 0 "$info"
for section in "== build" "== node" "== network" "== environment" "== job" "== self-test" \
  "== findings" "/dev/shm:" "gcomm needs at most:" "MPI: " "skipped: needs 2 or more ranks"; do
  check "alone prints '$section'" has "$section"
done

check "2 ranks: exit 0" run 0 "$MPIEXEC" -n 2 "$info"
check "2 ranks: the small host all-reduce passes" has "host all-reduce 256 B: ok"
check "2 ranks: the large host all-reduce passes, beside the memcpy rate" \
  grep -qE "host all-reduce 16.0 MB: ok, .* busbw .* of this node's memcpy rate" "$tmp/out"
check "2 ranks: self-test passed" has "passed: yes"
check "2 ranks: ranks per node" grep -qE "^    .*: 2 ranks, ranks 0,1$" "$tmp/out"
check "2 ranks: no finding" has "none: nothing to fix"
check "2 ranks: one copy between local ranks, on or off" \
  grep -qE "^  one copy between local ranks: (on|off)" "$tmp/out"

check "--json on 2 ranks: exit 0" run 0 "$MPIEXEC" -n 2 "$info" --json
check "--json is valid JSON" python3 -m json.tool "$tmp/out" /dev/null
check "--json holds the self-test and the node" python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
t = d["selftest"]
assert t["passed"] is True and len(t["allreduce"]) == 2, t
assert all(r["result"] == "ok" and r["time_us"] > 0 for r in t["allreduce"]), t
assert d["job"]["ranks"] == 2 and d["node"]["shm"]["need_bytes"] > 0, d
assert d["build"]["mpi"] and d["warnings"] == [], d' "$tmp/out"

export GCOMM_NCHANELS=4 GCOMM_NCHANNELS=abc GCOMM_BUFFSIZE=2M
check "unknown and invalid variables: exit 0 (findings, not failures)" run 0 "$info"
check "an unknown variable is named with the nearest known one" \
  has "GCOMM_NCHANELS=4: unknown, did you mean GCOMM_NCHANNELS"
check "an unknown variable is a finding" \
  grep -qE "^WARN GCOMM_NCHANELS is set but gcomm does not know it.*did you mean GCOMM_NCHANNELS" \
  "$tmp/out"
check "an invalid value is a finding" grep -qE '^WARN GCOMM_NCHANNELS="abc" is not a valid value' \
  "$tmp/out"
check "a valid value is shown as gcomm parses it" has "GCOMM_BUFFSIZE=2M: known, gcomm takes 2097152"
check "--json: the unknown variable with its suggestion" run 0 "$info" --json
check "--json: the unknown variable with its suggestion (content)" python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
v = {x["name"]: x for x in d["environment"]["variables"]}
assert v["GCOMM_NCHANELS"]["status"] == "unknown", v
assert v["GCOMM_NCHANELS"]["suggestion"] == "GCOMM_NCHANNELS", v
assert v["GCOMM_NCHANNELS"]["status"] == "invalid", v
assert v["GCOMM_BUFFSIZE"]["parsed"] == "2097152", v
assert any("GCOMM_NCHANELS" in w for w in d["warnings"]), d["warnings"]' "$tmp/out"
unset GCOMM_NCHANELS GCOMM_NCHANNELS GCOMM_BUFFSIZE

# ranks that disagree on GCOMM_NCHANNELS cannot create a communicator: the self-test fails
cat >"$tmp/disagree.sh" <<'WRAP'
#!/usr/bin/env bash
r=${PMI_RANK:-${OMPI_COMM_WORLD_RANK:-0}}
GCOMM_NCHANNELS=$((r + 1)) exec "$@"
WRAP
chmod +x "$tmp/disagree.sh"
check "a failing self-test: non-zero exit status" run nonzero "$MPIEXEC" -n 2 "$tmp/disagree.sh" "$info"
check "a failing self-test: the error is a finding" \
  grep -qE "^WARN a host communicator could not be created .*disagree on GCOMM_NCHANNELS" "$tmp/out"
check "a failing self-test: passed: no" has "passed: no"
