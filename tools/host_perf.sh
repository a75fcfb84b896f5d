#!/usr/bin/env bash
# tools/host_perf.sh - gcomm's host communicators against an MPI's own collectives, every
# collective, at several rank counts, each run several times: per rank count, per collective and
# size, the median of the runs' time ratios (MPI time / gcomm time: above 1, gcomm is faster) and
# in how many runs the ratio was at least 1.0. Runs are interleaved over the rank counts, so that a
# machine that drifts spreads over all of them.
#
#   bash tools/host_perf.sh [OUTDIR]   (default $OUT, else host-perf-logs): OUTDIR/NNr-RUN.log, one
#       gcomm_perf table a run, and OUTDIR/summary.md, the tables over every log in OUTDIR (also
#       printed). Runs may be split over several calls into one OUTDIR with FIRST_RUN (e.g. RUNS=2,
#       then FIRST_RUN=3 RUNS=3), when one call may not last long enough for all of them.
#
# Environment: BUILD (a build with gcomm_perf, default build), RANKS (default "2 4 8 16"), RUNS
# (default 5), FIRST_RUN (the number of the first, default 1), SIZES (gcomm_perf -b/-e/-f, default
# "8 64M 8"), ITERS (-n/-w, default "20 5"), COLLS (default all), MPIEXEC (default mpiexec), BIND
# (extra launcher arguments, default "-bind-to core" for MPICH's hydra, "--bind-to core" for Open
# MPI's mpirun; empty for none), PER_RUN (seconds a run may take, default 600), PERF_ARGS (more
# gcomm_perf arguments, e.g. "--host_mem gcomm").
set -u
OUT=${1:-${OUT:-host-perf-logs}}
B=${BUILD:-build}
RANKS=${RANKS:-2 4 8 16}
RUNS=${RUNS:-5}
read -r MINB MAXB FACTOR <<<"${SIZES:-8 64M 8}"
read -r ITERS WARMUP <<<"${ITERS:-20 5}"
MPIEXEC=${MPIEXEC:-mpiexec}
read -r -a BINDARGS <<<"${BIND--bind-to core}"
PERF=$B/gcomm_perf
[ -x "$PERF" ] || { echo "no $PERF: build it first (make BUILD=$B $PERF)"; exit 1; }
mkdir -p "$OUT"
FIRST=${FIRST_RUN:-1}
for run in $(seq "$FIRST" $((FIRST + RUNS - 1))); do
  for n in $RANKS; do
    log=$(printf '%s/%02dr-%d.log' "$OUT" "$n" "$run")
    s=$SECONDS
    timeout -k 5 "${PER_RUN:-600}" "$MPIEXEC" -n "$n" "${BINDARGS[@]}" "$PERF" -g 0 \
      --coll "${COLLS:-all}" -b "$MINB" -e "$MAXB" -f "$FACTOR" -n "$ITERS" -w "$WARMUP" \
      --backend gcomm,mpi ${PERF_ARGS:-} >"$log" 2>&1
    echo "run $run, $n ranks: rc=$? ($((SECONDS - s)) s) $log"
  done
done
for n in $RANKS; do
  logs=("$OUT"/$(printf '%02d' "$n")r-*.log)
  echo
  echo "## $n ranks: MPI time / gcomm time, median of ${#logs[@]} runs, and runs at least 1.0"
  echo
  python3 "$(dirname "$0")/perf_table.py" --vs mpi --wins "${logs[@]}"
done | tee "$OUT/summary.md"
