#!/usr/bin/env bash
# tools/nccl_tests.sh - NVIDIA's nccl-tests as a suite for gcomm's libnccl.so.2 (make CUDA=1 nccl):
# every program with its own data check (-c 1), over NVIDIA's NCCL and over gcomm, one table.
#
#   bash tools/nccl_tests.sh build SRC [OUT]
#       On a machine with nvcc and MPICH (no GPU needed): builds nccl-tests from the checkout SRC
#       (MPI=1, DSO=1, sm_90, stripped) into OUT (default build-nccl-tests), a folder that can be
#       carried to the GPU machine, and writes the NCCL symbols its programs reference into
#       nccl/nccl_symbols.txt (what `make CUDA=1 nccl-check` requires libnccl.so.2 to export).
#       NCCL_HOME: the folder of include/nccl.h and lib/libnccl.so (default /usr/local/cuda).
#
#   bash tools/nccl_tests.sh run BINDIR GCOMM_LIBDIR NP [LOGDIR]
#       On the GPU machine: runs every program with NP ranks, once over NVIDIA's libnccl
#       ($NCCL_HOME/lib) and once over gcomm's (GCOMM_LIBDIR first in LD_LIBRARY_PATH), then prints
#       per program, size, type and operator: both times (us, out of place and in place), gcomm's
#       over NCCL's, and #wrong of each. With more ranks than GPUs, each rank gets its GPU through
#       NCCL_TESTS_DEVICE and only gcomm runs (NCCL refuses ranks sharing a GPU).
#       MPIEXEC (default: $MPIEXEC_MPICH or mpiexec), NT_ARGS (default: sizes 8 B to 8 MB by 32x,
#       5 iterations, every type and operator), NT_TIMEOUT (seconds per program, default 120),
#       NT_PROGRAMS (default: all eleven), NT_NGPUS (GPUs the ranks may use; default: all).
#   bash tools/nccl_tests.sh perf BINDIR GCOMM_LIBDIR NP [LOGDIR]
#       On the GPU machine: times every program over gcomm and over NVIDIA's NCCL, float, sum, no
#       data check, with CUDA graphs (-G 20) and with plain launches, RUNS times (default 2), the
#       libraries taking turns program by program so that a machine that drifts slows both alike;
#       appended to LOGDIR/perf-graphs.log and LOGDIR/perf-plain.log ("=== PROGRAM LIB G=..
#       round=.." before each run; a later call adds its runs), then the tables of
#       tools/nccl_tests_table.py over all of them. PERF_ARGS (default: -b 8 -e 8M
#       -f 4 -n 40 -w 5; all-gather, reduce-scatter, all-to-all, gather and scatter from 32 B).
#       ALSO="NAME=LIBDIR[@VAR=VALUE...] ...": more builds of gcomm's libnccl.so.2 (a change
#       against a base, say), or the same one with other GCOMM_* settings (fifo=build/nccl@
#       GCOMM_GRAPH_REGISTER=0), timed in the same turns, each under its NAME
#       (tools/nccl_tests_table.py --a NAME --b gcomm; the launcher must pass the environment,
#       as MPICH's does);
#       WITH_NCCL=0 leaves NVIDIA's NCCL out of the turns (the tables then hold gcomm against the
#       first ALSO build); PERF_GRAPHS (default "20 0": with graphs, then plain launches) the -G
#       values to time.
# Exit status: 0 when every gcomm run passed and found no wrong value.
set -uo pipefail
PROGRAMS=${NT_PROGRAMS:-"all_reduce all_gather broadcast reduce_scatter reduce alltoall alltoallv scatter gather sendrecv hypercube"}
here=$(cd "$(dirname "$0")/.." && pwd)

build() {
  local src=$1 out=${2:-build-nccl-tests} nccl=${NCCL_HOME:-/usr/local/cuda}
  [ -f "$nccl/include/nccl.h" ] || { echo "no nccl.h in $nccl/include (NCCL_HOME)" >&2; return 1; }
  mkdir -p "$out" && out=$(cd "$out" && pwd)
  # nccl-tests links -lmpi: an MPI_HOME whose lib/libmpi.so is MPICH's library
  local mpi=$out/mpi inc lib
  inc=$(mpicc -show | grep -o -- '-I[^ ]*' | head -1 | cut -c3-)
  lib=$(mpicc -show | grep -o -- '-L[^ ]*' | head -1 | cut -c3-)
  mkdir -p "$mpi/lib" && ln -sfn "$inc" "$mpi/include" && ln -sf "$lib/libmpich.so" "$mpi/lib/libmpi.so"
  make -C "$src/src" -j"${JOBS:-2}" MPI=1 MPI_HOME="$mpi" NCCL_HOME="$nccl" DSO=1 BUILDDIR="$out" \
    NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" || return 1
  strip "$out"/*_perf "$out"/verifiable/libverifiable.so.0
  rm -f "$out"/*.o "$out"/verifiable/*.o
  nm -D --undefined-only "$out"/*_perf "$out"/verifiable/libverifiable.so.0 | awk '{print $NF}' |
    grep -E '^p?nccl' | sort -u > "$here/nccl/nccl_symbols.txt"
  echo "built $(ls "$out"/*_perf | wc -l) programs in $out; $(wc -l < "$here/nccl/nccl_symbols.txt") NCCL symbols in nccl/nccl_symbols.txt"
}

# One program over one library: LOGDIR/LIB-PROG.log; the exit status of the launch.
runOne() {
  local lib=$1 prog=$2 libdir=$3 bindir=$4 np=$5 logdir=$6 ng=$7 wrap=()
  if [ "$np" -gt "$ng" ]; then # rank r on GPU r mod ng
    wrap=(bash -c 'NCCL_TESTS_DEVICE=$(( ${PMI_RANK:-${OMPI_COMM_WORLD_RANK:-0}} % '"$ng"' )) exec "$@"' --)
  fi
  # shellcheck disable=SC2086
  LD_LIBRARY_PATH="$libdir:${LD_LIBRARY_PATH:-}" timeout -k 5 "${NT_TIMEOUT:-120}" \
    $MPIEXEC -n "$np" "${wrap[@]}" stdbuf -oL "$bindir/${prog}_perf" \
    ${NT_ARGS:--b 8 -e 8M -f 32 -n 5 -w 2 -d all -o all} -c 1 > "$logdir/$lib-$prog.log" 2>&1
}

# The data rows of a log: KEY (size/type/op/root) oop-time oop-wrong ip-time ip-wrong.
rows() {
  awk '$1 ~ /^[0-9]+$/ && NF >= 13 { print $1 "/" $3 "/" $4 "/" $5, $6, $9, $10, $13 }' "$1" 2>/dev/null
}

# The table of one program: gcomm's rows joined with NCCL's (when NCCL ran).
table() {
  local prog=$1 logdir=$2
  printf '\n## %s\n%-28s %10s %10s %6s %6s %6s | %10s %10s %6s %6s %6s\n' "$prog" \
    "size/type/op/root" "nccl us" "gcomm us" "ratio" "wrongN" "wrongG" \
    "nccl ip" "gcomm ip" "ratio" "wrongN" "wrongG"
  LC_ALL=C join -a 2 -e - -o 0,1.2,2.2,1.3,2.3,1.4,2.4,1.5,2.5 \
    <(rows "$logdir/nccl-$prog.log" | LC_ALL=C sort) <(rows "$logdir/gcomm-$prog.log" | LC_ALL=C sort) |
    sort -t/ -k1,1n -s |
    awk '{ r = ($2 == "-" || $2 == 0) ? "-" : sprintf("%.2f", $3 / $2);
           q = ($6 == "-" || $6 == 0) ? "-" : sprintf("%.2f", $7 / $6);
           printf "%-28s %10s %10s %6s %6s %6s | %10s %10s %6s %6s %6s\n", $1, $2, $3, r, $4, $5, $6, $7, q, $8, $9 }'
}

run() {
  local bindir=$1 libdir=$2 np=$3 logdir=${4:-nccl-tests-logs} ng fails=0
  MPIEXEC=${MPIEXEC:-${MPIEXEC_MPICH:-mpiexec}}
  ng=${NT_NGPUS:-$(nvidia-smi -L | wc -l)} # NT_NGPUS: GPUs the ranks may use (CUDA_VISIBLE_DEVICES)
  mkdir -p "$logdir"
  export LD_LIBRARY_PATH="${NCCL_HOME:+$NCCL_HOME/lib:}/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
  echo "# nccl-tests over NVIDIA's NCCL and over gcomm ($libdir): $np ranks, $ng GPUs, $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
  echo "# args: ${NT_ARGS:--b 8 -e 8M -f 32 -n 5 -w 2 -d all -o all} -c 1; times in us; ratio = gcomm / nccl; ip = in place"
  [ "$np" -gt "$ng" ] && echo "# $np ranks on $ng GPUs: NCCL refuses ranks sharing a GPU, gcomm only"
  for prog in $PROGRAMS; do
    local rcN=skipped rcG
    if [ "$np" -le "$ng" ] && [ -n "${NCCL_HOME:-}" ]; then
      runOne nccl "$prog" "$NCCL_HOME/lib" "$bindir" "$np" "$logdir" "$ng"; rcN=$?
    fi
    runOne gcomm "$prog" "$libdir" "$bindir" "$np" "$logdir" "$ng"; rcG=$?
    local wrongG
    wrongG=$(rows "$logdir/gcomm-$prog.log" | awk '{ w += $3 + $5 } END { print w + 0 }')
    echo "# $prog: exit nccl $rcN, gcomm $rcG; gcomm rows $(rows "$logdir/gcomm-$prog.log" | wc -l), wrong values $wrongG"
    { [ "$rcG" = 0 ] && [ "$wrongG" = 0 ]; } || fails=$((fails + 1))
  done
  printf '\n# Summary: float, sum (or no operator), root 0 or none; the full tables follow\n'
  for prog in $PROGRAMS; do
    table "$prog" "$logdir" | awk -v p="$prog" 'NR == 3 { printf "%-15s %s\n", "program", $0 }
      $1 ~ /\/float\/(sum|none)\/(-1|0)$/ { printf "%-15s %s\n", p, $0 }' | sed "1!{/^program/d}"
  done | awk 'NR == 1 || !/^program/'
  for prog in $PROGRAMS; do table "$prog" "$logdir"; done
  echo "# $fails of $(echo $PROGRAMS | wc -w) programs failed or found wrong values over gcomm"
  [ "$fails" = 0 ]
}

# One timed run: PROG over the library LIB (gcomm, nccl or an ALSO name) in LIBDIR with graphs G,
# appended to LOG. LIBDIR may carry settings for the run: DIR@VAR=VALUE@VAR=VALUE.
perfOne() {
  local lib=$1 libdir=${2%%@*} prog=$3 g=$4 round=$5 bindir=$6 np=$7 log=$8 args=${PERF_ARGS:--b 8 -e 8M -f 4 -n 40 -w 5}
  local settings=()
  [ "$libdir" = "$2" ] || IFS=@ read -r -a settings <<< "${2#*@}"
  case $prog in all_gather | reduce_scatter | alltoall | gather | scatter) args=${args/-b 8 /-b 32 } ;; esac
  echo "=== $prog $lib G=$g round=$round" >> "$log"
  # shellcheck disable=SC2086
  env "${settings[@]}" LD_LIBRARY_PATH="$libdir:${LD_LIBRARY_PATH:-}" timeout -k 5 "${NT_TIMEOUT:-120}" \
    $MPIEXEC -n "$np" stdbuf -oL "$bindir/${prog}_perf" $args -G "$g" -c 0 >> "$log" 2>&1
}

perf() {
  local bindir=$1 libdir=$2 np=$3 logdir=${4:-nccl-tests-logs}
  local progs=${NT_PROGRAMS:-"all_reduce all_gather reduce_scatter broadcast reduce sendrecv alltoall gather scatter"}
  MPIEXEC=${MPIEXEC:-${MPIEXEC_MPICH:-mpiexec}}
  local withNccl=${WITH_NCCL:-1}
  [ "$withNccl" = 0 ] || [ -n "${NCCL_HOME:-}" ] ||
    { echo "NCCL_HOME: NVIDIA's NCCL, to time beside gcomm (or WITH_NCCL=0)" >&2; return 1; }
  mkdir -p "$logdir"
  export LD_LIBRARY_PATH="/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
  for round in $(seq "${RUNS:-2}"); do
    for prog in $progs; do
      for g in ${PERF_GRAPHS:-20 0}; do
        local log=$logdir/perf-graphs.log
        [ "$g" = 0 ] && log=$logdir/perf-plain.log
        perfOne gcomm "$libdir" "$prog" "$g" "$round" "$bindir" "$np" "$log"
        for also in ${ALSO:-}; do
          perfOne "${also%%=*}" "${also#*=}" "$prog" "$g" "$round" "$bindir" "$np" "$log"
        done
        [ "$withNccl" = 0 ] || perfOne nccl "$NCCL_HOME/lib" "$prog" "$g" "$round" "$bindir" "$np" "$log"
      done
    done
  done
  local b=nccl
  [ "$withNccl" = 0 ] && b=${ALSO%%=*}
  for mode in graphs plain; do
    [ -n "$b" ] && [ -s "$logdir/perf-$mode.log" ] || continue
    echo "## $mode"
    python3 "$here/tools/nccl_tests_table.py" "$logdir/perf-$mode.log" --b "$b"
  done
}

case "${1:-}" in
  build) shift; build "$@" ;;
  run) shift; run "$@" ;;
  perf) shift; perf "$@" ;;
  *) sed -n '2,37p' "$0"; exit 2 ;;
esac
