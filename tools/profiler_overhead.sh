#!/usr/bin/env bash
# tools/profiler_overhead.sh BASE_DIR [ROUNDS] - the profiler's cost on a 1 KB host all-reduce at 4
# ranks: BASE_DIR holds an older gcomm's sources (e.g. `git archive <commit> | tar -x -C base`),
# built beside this tree; then ROUNDS (default 5) interleaved runs of base, this tree without a
# plugin, and this tree with the example trace plugin and every event on. Prints one line a run.
# Environment: MAKEFLAGS_MPI (extra make arguments, e.g. MPICC=gcc MPI_CFLAGS=... MPI_LIBS=...),
#   MPIEXEC (default mpiexec).
set -eu
base=$1
rounds=${2:-5}
MPIEXEC=${MPIEXEC:-mpiexec}
read -r -a mk <<<"${MAKEFLAGS_MPI:-}"
(cd "$base" && make -j8 BUILD=build-base "${mk[@]}" build-base/gcomm_perf >/dev/null)
make -j8 BUILD=build-host "${mk[@]}" build-host/gcomm_perf \
  build-host/examples/libgcomm-profiler-trace.so >/dev/null
trace=$(mktemp -d)
trap 'rm -rf "$trace"' EXIT
plugin="GCOMM_PROFILER_PLUGIN=$PWD/build-host/examples/libgcomm-profiler-trace.so"
for round in $(seq "$rounds"); do
  for v in base noplugin plugin; do
    case $v in
      base) prog=$base/build-base/gcomm_perf envs=() ;;
      noplugin) prog=build-host/gcomm_perf envs=() ;;
      plugin) prog=build-host/gcomm_perf envs=("$plugin" "GCOMM_PROFILER_TRACE=$trace/t-%r-%p.json") ;;
    esac
    line=$(env "${envs[@]}" timeout 60 "$MPIEXEC" -n 4 "$prog" --coll allreduce -b 1K -e 1K \
      -n 2000 -w 200 2>&1 | grep -E '^ +1024 ')
    echo "$round $v $line"
  done
done
