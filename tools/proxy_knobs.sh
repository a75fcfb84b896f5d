#!/usr/bin/env bash
# tools/proxy_knobs.sh - the proxy knobs measured on a GPU machine, one gcomm_perf all-reduce at 2
# ranks per setting and range: latency 8 B-64 KB (data checked) and bandwidth 1 MB-1 GB, with the
# progress thread's CPU time per operation from its GCOMM_DEBUG=INFO report. Settings: FIFOs in GPU
# memory (CUDA IPC) with SM stores or copy engines; staged through host memory (GCOMM_P2P_DISABLE=1)
# with SM loads and stores or copy engines in each GCOMM_SHM_MEMCPY_MODE, each GCOMM_SHM_LOCALITY,
# the proxy in its own context, gdrcopy asked for; and on host buffers, the progress presets RCCL's
# tuning guide gives (GCOMM_PROGRESS_APPENDOP_FREQ / GCOMM_PROXY_APPEND_BATCH_SIZE 4/8 against
# 16/32, beside the default 8/16; bandwidth to 64 MB there). About 3 minutes on 2 H100s; a setting that would start past
# BUDGET seconds (default 230) is skipped and said so.
#
#   bash tools/proxy_knobs.sh [OUTDIR]     (default $OUT, else proxy-knobs-logs): per setting and
#       range NAME-RANGE.log (gcomm_perf's table) and NAME-RANGE.err (the INFO lines); summary.txt
#   python3 tools/proxy_knobs_table.py OUTDIR/*.log     the markdown table of docs/TUNING.md
#
# Environment: BUILD (a CUDA build with gcomm_perf, default build-gpu: make CUDA=1 BUILD=build-gpu
# build-gpu/gcomm_perf), MPIEXEC_MPICH or Open MPI's mpirun (as test/gpu/run.sh), BUDGET.
set -u
OUT=${1:-${OUT:-proxy-knobs-logs}}
mkdir -p "$OUT"
B=${BUILD:-build-gpu}
BUDGET=${BUDGET:-230}
PERF=$B/gcomm_perf
[ -x "$PERF" ] || { echo "no $PERF: build it first (make CUDA=1 BUILD=$B $PERF)"; exit 1; }
export GCOMM_DEBUG=INFO GCOMM_DEBUG_SUBSYS=INIT,PROXY GCOMM_TIMEOUT_MS=${GCOMM_TIMEOUT_MS:-30000}
KNOBS="GCOMM_P2P_DISABLE GCOMM_P2P_USE_CUDA_MEMCPY GCOMM_SHM_USE_CUDA_MEMCPY GCOMM_SHM_MEMCPY_MODE
       GCOMM_SHM_LOCALITY GCOMM_CREATE_THREAD_CONTEXT GCOMM_GDRCOPY_SYNC_ENABLE
       GCOMM_PROGRESS_APPENDOP_FREQ GCOMM_PROXY_APPEND_BATCH_SIZE"
if command -v mpicc >/dev/null && mpicc -showme >/dev/null 2>&1; then # Open MPI, as test/gpu/run.sh
  RUN=(mpirun --oversubscribe --bind-to none -x GCOMM_DEBUG -x GCOMM_DEBUG_SUBSYS -x GCOMM_TIMEOUT_MS)
  for k in $KNOBS; do RUN+=(-x "$k"); done
  RUN+=(-np 2)
else
  RUN=("${MPIEXEC_MPICH:-mpiexec}" -n 2) # hydra passes the environment
fi
LAT=(--coll allreduce -b 8 -e 64K -f 2 -n 50 -w 10 -c 1 --backend gcomm)
BW=(--coll allreduce -b 1M -e 1G -f 4 -n 10 -w 3 -c 0 --backend gcomm)

# setting NAME GPU(0/1) VAR=VALUE...: both ranges, one log each (NAME-lat.log, NAME-bw.log)
setting() {
  local name=$1 gpu=$2
  shift 2
  for range in lat bw; do
    if [ "$SECONDS" -ge "$BUDGET" ]; then
      echo "=== $name-$range: skipped (past $BUDGET s)" | tee -a "$OUT/summary.txt"
      continue
    fi
    local args=("${LAT[@]}")
    [ "$range" = bw ] && args=("${BW[@]}")
    [ "$range" = bw ] && [ "$gpu" = 0 ] && args+=(-e 64M) # host memory: 1 GB takes seconds a call
    local s=$SECONDS
    { echo "# setting $name: ${*:-defaults}"; } >"$OUT/$name-$range.log"
    env "$@" timeout -k 5 60 "${RUN[@]}" "$PERF" -g "$gpu" "${args[@]}" >>"$OUT/$name-$range.log" \
      2>"$OUT/$name-$range.err" # the INFO lines: apart, as ranks' lines would split the table's
    echo "=== $name-$range rc=$? ($((SECONDS - s)) s) ${*:-defaults}" | tee -a "$OUT/summary.txt"
  done
}

: >"$OUT/summary.txt"
{ nvidia-smi -L; nvidia-smi topo -m; } >"$OUT/machine.txt" 2>&1
setting ipc-sm 1
setting ipc-ce 1 GCOMM_P2P_USE_CUDA_MEMCPY=1
setting ipc-ce-ctx 1 GCOMM_P2P_USE_CUDA_MEMCPY=1 GCOMM_CREATE_THREAD_CONTEXT=1
setting shm-sm-loc2 1 GCOMM_P2P_DISABLE=1
setting shm-sm-loc1 1 GCOMM_P2P_DISABLE=1 GCOMM_SHM_LOCALITY=1
setting shm-ce3-loc2 1 GCOMM_P2P_DISABLE=1 GCOMM_SHM_USE_CUDA_MEMCPY=1
setting shm-ce3-loc1 1 GCOMM_P2P_DISABLE=1 GCOMM_SHM_USE_CUDA_MEMCPY=1 GCOMM_SHM_LOCALITY=1
setting shm-ce1 1 GCOMM_P2P_DISABLE=1 GCOMM_SHM_USE_CUDA_MEMCPY=1 GCOMM_SHM_MEMCPY_MODE=1
setting shm-ce2 1 GCOMM_P2P_DISABLE=1 GCOMM_SHM_USE_CUDA_MEMCPY=1 GCOMM_SHM_MEMCPY_MODE=2
setting shm-ce3-ctx 1 GCOMM_P2P_DISABLE=1 GCOMM_SHM_USE_CUDA_MEMCPY=1 GCOMM_CREATE_THREAD_CONTEXT=1
setting shm-ce3-gdr 1 GCOMM_P2P_DISABLE=1 GCOMM_SHM_USE_CUDA_MEMCPY=1 GCOMM_GDRCOPY_SYNC_ENABLE=1
setting host-8-16 0
setting host-4-8 0 GCOMM_PROGRESS_APPENDOP_FREQ=4 GCOMM_PROXY_APPEND_BATCH_SIZE=8
setting host-16-32 0 GCOMM_PROGRESS_APPENDOP_FREQ=16 GCOMM_PROXY_APPEND_BATCH_SIZE=32
echo "=== done in $SECONDS s: python3 tools/proxy_knobs_table.py $OUT/*.log" | tee -a "$OUT/summary.txt"
