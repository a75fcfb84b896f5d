#!/usr/bin/env bash
# test/test_fault.sh - failures that need more than one MPI job can show (`make test-fault`).
#
#   kill  test_netkill with every rank on one node (shm): the last rank is SIGKILLed 3 ms into a
#         32 MiB all-reduce (mid) or right before it (before), thread or poll mode. Every
#         survivor must return an error naming the dead rank within TEST_KILL_MAX_S (2 s;
#         GCOMM_TIMEOUT_MS is 5 s, so only the probes can find it), then abort and destroy must
#         succeed, and no segment of the job may be left in /dev/shm. Open MPI: plain
#         `mpirun --mca orte_abort_on_non_zero_status 0 -n 4` as users start it (its daemon reaps
#         the victim at once and, with that setting, leaves the survivors running). MPICH: plain
#         mpiexec -disable-auto-cleanup, but only the victim has a parent that does not reap it
#         until the survivors have reported, so that it stays a zombie (kill(pid, 0) still finds
#         a zombie): MPICH 4.0.2's hydra, when a rank is killed by a signal and its proxy reaps
#         it, SIGKILLs the other ranks at once, -disable-auto-cleanup or not, so that no survivor
#         is left to return anything.
#   shrink test_shrink on 4 ranks over shm: rank 2 is SIGKILLed 3 ms into a 32 MiB all-reduce
#         (a zombie until the end, as above: between the kept ranks 0-1 and 3 of the launch line);
#         the 3 survivors must get an error naming it, shrink with GCOMM_SHRINK_ABORT (rank 2
#         listed, or with "auto" none: found dead) and run 100 all-reduces right on the new
#         communicator, without MPI, each printing the seconds from the all-reduce's start to the
#         last check
#   hang  test_fault with TEST_FAULT_HANG=2 on 4 ranks: rank 2 skips a collective, the others
#         hang. Every rank is sent GCOMM_PROXY_DUMP_SIGNAL; tools/hang_report.py, given every
#         rank's log, must say that rank 2 is behind.
#   init  test_init in hostile environments: GCOMM_ALGO set differently on two ranks (MPMD
#         launch line): init fails on both naming it; 8 ranks in a 64 MB /dev/shm (a mount
#         namespace; root only): a clear error at init naming --shm-size, never a signal, and
#         with smaller FIFOs a working communicator
#   log   GCOMM_DEBUG=WRN, GCOMM_DEBUG_SUBSYS=abc: a warning naming the valid values, and the
#         other warnings still shown; GCOMM_DEBUG_FILE through a symbolic link: refused with a
#         warning on stderr; a new log file has mode 0600
#   stale a segment named as gcomm names them, of a pid that no longer exists, is removed by the
#         next init; one of a live pid, or of another pid namespace, is kept
#   soak  test_soak on 4 ranks (TEST_SOAK_SMALL small and TEST_SOAK_LARGE large collectives):
#         memory, file descriptors and /dev/shm stable (the program checks and prints them).
#
# Environment: BUILD (default build), MPIEXEC, TEST_FAULT_SHRINKS (default "listed auto"),
#   TEST_FAULT_KILLS (default "4/mid 4/before
#   4/mid/poll 2/mid"; ranks/moment[/poll]), TEST_SOAK_SMALL, TEST_SOAK_LARGE (the program's
#   defaults when unset). The last line is "N passed, N failed".
set -u
BUILD=${BUILD:-build}
MPIEXEC=${MPIEXEC:-mpiexec}
KILLS=${TEST_FAULT_KILLS-"4/mid 4/before 4/mid/poll 2/mid"}
SHRINKS=${TEST_FAULT_SHRINKS-"listed auto"}
here=$(cd "$(dirname "$0")" && pwd)

export LSAN_OPTIONS="suppressions=$here/lsan.supp:print_suppressions=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
export HWLOC_PLUGINS_PATH=${HWLOC_PLUGINS_PATH:-/nonexistent}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
out=$tmp/out
# The victim's parent: it starts the rank and reaps it only once the survivors have written their
# results ($1: the directory, $2: how many), so that a killed victim stays a zombie meanwhile. It
# ignores the SIGUSR1 that hydra sends when a survivor leaves without MPI_Finalize (its death
# would make hydra SIGKILL the survivors still reporting).
cat >"$tmp/keeper.py" <<'KEEPER'
import os, signal, sys, time
pid = os.fork()
if pid == 0:
    os.execvp(sys.argv[3], sys.argv[3:])
signal.signal(signal.SIGUSR1, signal.SIG_IGN)
deadline = time.time() + 60
while time.time() < deadline:
    if sum(f.startswith("rank") for f in os.listdir(sys.argv[1])) >= int(sys.argv[2]): break
    time.sleep(0.05)
_, status = os.waitpid(pid, 0)
sys.exit(0 if os.WIFSIGNALED(status) else 1)
KEEPER

mpiexec_flags=()
if "$MPIEXEC" --version 2>&1 | grep -qi "open mpi\|openrte"; then
  mpiexec_flags+=(--oversubscribe)
  [ "$(id -u)" = 0 ] && mpiexec_flags+=(--allow-run-as-root)
fi
hydra=0
"$MPIEXEC" --version 2>&1 | grep -qi hydra && hydra=1
if [ "$hydra" = 1 ]; then keep=(-disable-auto-cleanup); else keep=(--mca orte_abort_on_non_zero_status 0); fi

passed=0
failed=0
pass() { echo "PASS $*"; passed=$((passed + 1)); }
source "$here/survivors.sh"

# ---- kill: a rank dies over shm ----
for cfg in $KILLS; do
  n=${cfg%%/*}
  rest=${cfg#*/}
  moment=${rest%%/*}
  poll=0
  [ "${rest#*/}" = poll ] && poll=1
  dir=$tmp/kill-$n-$moment-$poll
  mkdir -p "$dir"
  victim=$((n - 1))
  echo "== test_netkill over shm: $n ranks, rank $victim killed $moment the all-reduce$([ $poll = 1 ] && echo ", poll mode")$([ $hydra = 1 ] && echo ", a zombie until the end")"
  t0=$(date +%s)
  if [ "$hydra" = 1 ]; then
    launch=(-n "$victim" "$BUILD/test/test_netkill" : -n 1 python3 "$tmp/keeper.py" "$dir" "$victim"
      "$BUILD/test/test_netkill")
  else
    launch=(-n "$n" "$BUILD/test/test_netkill")
  fi
  TEST_KILL_RANK=$victim TEST_KILL_MOMENT=$moment TEST_POLL=$poll TEST_NETKILL_DIR="$dir" \
    TEST_KILL_MAX_S=2 GCOMM_TIMEOUT_MS=5000 timeout -k 5 120 "$MPIEXEC" "${mpiexec_flags[@]}" \
    "${keep[@]}" "${launch[@]}" >"$out" 2>&1
  [ $? = 124 ] && fail "kill $cfg: the job hung"
  for ((r = 0; r < victim; r++)); do
    if [ -s "$dir/rank$r" ]; then
      sed -E "s#^(PASS|FAIL) netkill:#\1 kill shm $cfg:#" "$dir/rank$r" | cut -c1-400
      if grep -q '^PASS' "$dir/rank$r"; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
    else
      fail "kill $cfg: survivor rank $r reported nothing (crashed or hung?)"
      tail -20 "$out"
    fi
  done
  pids=$(cat "$dir"/seen* "$dir/victim" 2>/dev/null | tr '\n' '|')
  left=$(ls /dev/shm | grep -E "^gcomm-(${pids%|})-" || true)
  if [ -z "$left" ]; then pass "kill $cfg: nothing of the job left in /dev/shm"
  else fail "kill $cfg: left in /dev/shm: $left"; fi
  echo "== kill $cfg: $(($(date +%s) - t0)) s"
done

# ---- shrink: rank 2 of 4 dies, the survivors shrink and carry on ----
for how in $SHRINKS; do
  dir=$tmp/shrink-$how
  mkdir -p "$dir"
  echo "== test_shrink over shm: 4 ranks, rank 2 killed in the all-reduce, shrink ($how)"
  TEST_KILL_RANK=2 TEST_SHRINK_AUTO=$([ "$how" = auto ] && echo 1 || echo 0) \
    TEST_SHRINK_DIR="$dir" GCOMM_TIMEOUT_MS=5000 timeout -k 5 120 "$MPIEXEC" \
    "${mpiexec_flags[@]}" "${keep[@]}" -n 2 "$BUILD/test/test_shrink" : \
    -n 1 python3 "$tmp/keeper.py" "$dir" 3 "$BUILD/test/test_shrink" : \
    -n 1 "$BUILD/test/test_shrink" >"$out" 2>&1
  [ $? = 124 ] && fail "shrink $how: the job hung"
  countSurvivors "$dir" "shrink $how" "$out" 0 1 3
done

# examples/shrink_solver: rank 2 dies at iteration 555; the survivors shrink, go back to the
# checkpoint of iteration 500 (rank 2's block from its buddy, rank 3) and must end bitwise equal to
# the serial run. Each survivor's output and exit status go to files (mpiexec may drop the output
# of a job that lost a rank).
dir=$tmp/solver
mkdir -p "$dir"
echo "== examples/shrink_solver: 4 ranks, rank 2 killed at iteration 555 of 1000"
solver=("$BUILD/shrink_solver" --iters 1000 --checkpoint 100 --kill-rank 2 --kill-iter 555)
# each survivor's wrapper leaves only once all three have written their status (Open MPI's
# mpirun ends the job when the first leaves without MPI_Finalize)
keepFiles='trap "" USR1; "$@" >"$D/out${PMI_RANK:-$OMPI_COMM_WORLD_RANK}" 2>&1; echo $? >"$D/rank${PMI_RANK:-$OMPI_COMM_WORLD_RANK}"; i=0; while [ "$(ls "$D" | grep -c "^rank")" -lt 3 ] && [ $i -lt 200 ]; do sleep 0.1; i=$((i + 1)); done'
D=$dir timeout -k 5 120 "$MPIEXEC" "${mpiexec_flags[@]}" "${keep[@]}" \
  -n 2 sh -c "$keepFiles" sh "${solver[@]}" : \
  -n 1 python3 "$tmp/keeper.py" "$dir" 3 "${solver[@]}" : \
  -n 1 sh -c "$keepFiles" sh "${solver[@]}" >"$out" 2>&1
[ $? = 124 ] && fail "shrink_solver: the job hung"
grep -h '^PASS\|^FAIL\|^shrink_solver' "$dir"/out* | cut -c1-300
if grep -q '^PASS shrink_solver: .* on 3 of 4 ranks' "$dir/out0" 2>/dev/null &&
  [ "$(cat "$dir"/rank0 "$dir"/rank1 "$dir"/rank3 2>/dev/null | tr -d '\n')" = 000 ]; then
  pass "shrink_solver: the 3 survivors of rank 2 shrank, rebuilt the field from the checkpoints and ended bitwise equal to the serial run"
else
  fail "shrink_solver: survivors' exit codes $(cat "$dir"/rank* 2>/dev/null | tr '\n' ' ')"
  tail -20 "$out"
fi

# ---- hang: one rank skips a collective; dumps from every rank; the tool names it ----
dir=$tmp/hang
mkdir -p "$dir"
echo "== hang: 4 ranks, rank 2 skips a collective; dumps on SIGUSR2; tools/hang_report.py"
GCOMM_TIMEOUT_MS=8000 GCOMM_PROXY_DUMP_SIGNAL=12 GCOMM_DEBUG_FILE="$dir/log.%h.%p" TEST_FAULT_HANG=2 \
  TEST_FAULT_DIR="$dir" timeout -k 5 120 "$MPIEXEC" "${mpiexec_flags[@]}" -n 4 \
  "$BUILD/test/test_fault" >"$out" 2>&1 &
job=$!
for _ in $(seq 300); do [ "$(ls "$dir"/pid.* 2>/dev/null | wc -l)" = 4 ] && break; sleep 0.1; done
sleep 1 # the others are blocked in the sixth all-reduce now
for f in "$dir"/pid.*; do kill -USR2 "$(cat "$f")" 2>/dev/null; done
wait $job
rc=$?
grep -E '^(PASS|FAIL) ' "$out"
passed=$((passed + $(grep -c '^PASS ' "$out")))
failed=$((failed + $(grep -c '^FAIL ' "$out")))
[ "$rc" = 0 ] || fail "hang: the job exited with status $rc"
python3 "$here/../tools/hang_report.py" "$dir" >"$tmp/report" 2>&1
rc=$?
cat "$tmp/report"
if [ "$rc" = 0 ] && grep -q '^verdict: .*: rank 2 behind' "$tmp/report"; then
  pass "hang: tools/hang_report.py says rank 2 is behind, from the dumps of all 4 ranks"
else
  fail "hang: tools/hang_report.py did not name rank 2 (exit $rc)"
fi

# ---- init in hostile environments (test_init) ----
# Runs test_init under mpiexec with the arguments given; its PASS/FAIL lines count, and a non-zero
# exit (a signal, an MPI abort) is one more failure.
runInit() {
  local what=$1
  shift
  echo "== init: $what"
  timeout -k 5 120 "$@" >"$out" 2>"$tmp/err"
  local rc=$?
  sed -E "s#^(PASS|FAIL) init:#\1 init ($what):#" "$out" | grep -E '^(PASS|FAIL|#) '
  passed=$((passed + $(grep -c '^PASS ' "$out")))
  failed=$((failed + $(grep -c '^FAIL ' "$out")))
  if [ "$rc" != 0 ]; then
    fail "init ($what): exited with status $rc"
    grep -v 'GCOMM WARN' "$tmp/err" | tail -5
  fi
}

# ranks that set GCOMM_ALGO differently, as users do with MPMD launch lines
TEST_INIT_REFUSAL="ranks disagree on GCOMM_ALGO" runInit "GCOMM_ALGO ring on rank 0, tree on rank 1" \
  "$MPIEXEC" "${mpiexec_flags[@]}" -n 1 env GCOMM_ALGO=ring "$BUILD/test/test_init" : \
  -n 1 env GCOMM_ALGO=tree "$BUILD/test/test_init"

# Docker's default /dev/shm (64 MB), in a mount namespace of its own (needs root; else skipped):
# 8 ranks with the default FIFOs do not fit (a clear error at init, naming the remedy), smaller
# FIFOs do (the 1 MiB all-to-all runs)
if unshare -m true 2>/dev/null; then
  small=(unshare -m sh -c 'mount -t tmpfs -o size=64m tmpfs /dev/shm && exec "$@"' sh)
  TEST_INIT_REFUSAL="docker run --shm-size" runInit "8 ranks, a 64 MB /dev/shm" \
    "${small[@]}" "$MPIEXEC" "${mpiexec_flags[@]}" -n 8 "$BUILD/test/test_init"
  GCOMM_BUFFSIZE=128K GCOMM_NCHANNELS=1 runInit "8 ranks, a 64 MB /dev/shm, GCOMM_BUFFSIZE=128K" \
    "${small[@]}" "$MPIEXEC" "${mpiexec_flags[@]}" -n 8 "$BUILD/test/test_init"
else
  echo "# init: no mount namespace here (unshare -m needs root): the small /dev/shm runs are skipped"
fi

# ---- logging settings that are wrong must say so, never silence warnings ----
# Runs test_init on 1 rank under the environment given; $1: what stderr must contain.
expectStderr() {
  local want=$1
  shift
  env "$@" timeout -k 5 60 "$MPIEXEC" "${mpiexec_flags[@]}" -n 1 "$BUILD/test/test_init" >"$out" 2>"$tmp/err"
  if [ $? = 0 ] && grep -qF "$want" "$tmp/err"; then pass "log ($*): stderr says \"$want\""
  else fail "log ($*): stderr does not say \"$want\": $(head -c 600 "$tmp/err")"; fi
}
echo "== logging: bad GCOMM_DEBUG, GCOMM_DEBUG_SUBSYS and GCOMM_DEBUG_FILE"
expectStderr 'GCOMM_NCHANNELS="abc" is not valid' GCOMM_DEBUG_SUBSYS=abc GCOMM_NCHANNELS=abc
expectStderr 'GCOMM_DEBUG_SUBSYS="abc" names no subsystem' GCOMM_DEBUG_SUBSYS=abc
expectStderr 'GCOMM_DEBUG="WRN" is not a level (NONE, WARN, INFO or TRACE)' GCOMM_DEBUG=WRN
ln -s "$tmp/target" "$tmp/link"
expectStderr "GCOMM_DEBUG_FILE: cannot open $tmp/link" GCOMM_DEBUG_FILE="$tmp/link"
if [ -e "$tmp/target" ]; then fail "log: GCOMM_DEBUG_FILE followed a symbolic link and created its target"
else pass "log: GCOMM_DEBUG_FILE through a symbolic link: refused, its target not created"; fi
GCOMM_DEBUG=INFO GCOMM_DEBUG_FILE="$tmp/log.%p" timeout -k 5 60 "$MPIEXEC" "${mpiexec_flags[@]}" -n 1 \
  "$BUILD/test/test_init" >"$out" 2>&1
mode=$(stat -c %a "$tmp"/log.* 2>/dev/null | head -1)
if [ "$mode" = 600 ]; then pass "log: GCOMM_DEBUG_FILE is created with mode 0600"
else fail "log: GCOMM_DEBUG_FILE has mode ${mode:-(not created)}, not 0600"; fi

# ---- segments left by a job killed during init: the next init removes them ----
echo "== leftover segments: one of a dead process (removed), of a live one and of another pid namespace (kept)"
ns=$(stat -L -c %i /proc/self/ns/pid)
sh -c 'exit 0' &
dead=$!
wait $dead
stale=gcomm-$dead-$ns-0-0-1 live=gcomm-$$-$ns-0-0-2 other=gcomm-$dead-1-0-0-3
for f in $stale $live $other; do (umask 077 && : >"/dev/shm/$f"); done
timeout -k 5 60 "$MPIEXEC" "${mpiexec_flags[@]}" -n 1 "$BUILD/test/test_init" >"$out" 2>&1
if [ ! -e "/dev/shm/$stale" ] && [ -e "/dev/shm/$live" ] && [ -e "/dev/shm/$other" ]; then
  pass "leftover segments: init removed the dead process's, kept the live one's and the other namespace's"
else
  fail "leftover segments: after init: $(cd /dev/shm && ls -d $stale $live $other 2>/dev/null | tr '\n' ' ')(expected $live $other)"
fi
rm -f "/dev/shm/$stale" "/dev/shm/$live" "/dev/shm/$other"

# ---- soak ----
echo "== test_soak: 4 ranks"
t0=$(date +%s)
TEST_SOAK=1 timeout -k 5 900 "$MPIEXEC" "${mpiexec_flags[@]}" -n 4 "$BUILD/test/test_soak" 2>&1 | tee "$out"
rc=${PIPESTATUS[0]}
passed=$((passed + $(grep -c '^PASS ' "$out")))
failed=$((failed + $(grep -c '^FAIL ' "$out")))
[ "$rc" = 0 ] || fail "soak: exited with status $rc"
echo "== soak: $(($(date +%s) - t0)) s"

echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
