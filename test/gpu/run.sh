#!/bin/bash
# test/gpu/run.sh - on the lent GPU machine, in one call: build with CUDA (and NCCL when
# $NCCL_HOME has it), GPU correctness at 2 ranks on 2 GPUs, the benchmark beside NCCL, then 4 ranks
# on 2 GPUs and 2 ranks on 1 GPU, then compute-sanitizer. Logs go to $OUT (or ./gpu-logs).
# Usage (from the repository root): bash test/gpu/run.sh
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
B=${BUILD:-build-gpu}
export GCOMM_TIMEOUT_MS=${GCOMM_TIMEOUT_MS:-30000}
NG=$(nvidia-smi -L 2>/dev/null | wc -l)
{ nvidia-smi; nvidia-smi topo -m; } > "$OUT/machine.log" 2>&1
if command -v mpicc >/dev/null && mpicc -showme >/dev/null 2>&1; then   # Open MPI
  MPICC=mpicc; RUN="mpirun --oversubscribe --bind-to none -x GCOMM_TIMEOUT_MS -x TEST_NGPUS -x LD_LIBRARY_PATH -x GCOMM_DEBUG -np"
else                                                                 # MPICH from .devdeps
  MPICC=gcc; RUN="$MPIEXEC_MPICH -n"; EXTRA=(MPI_CFLAGS="$MPICH_CFLAGS" MPI_LIBS="$MPICH_LIBS")
fi
NCCLARG=""; [ -n "$NCCL_HOME" ] && [ -f "$NCCL_HOME/include/nccl.h" ] && NCCLARG="NCCL=1"
step() { # name timeout command...
  local name=$1 t=$2; shift 2
  echo "=== $name: $*" | tee -a "$OUT/summary.log"
  local s=$SECONDS
  timeout -k 5 "$t" "$@" > "$OUT/$name.log" 2>&1; local rc=$?
  echo "=== $name rc=$rc ($((SECONDS - s)) s)" | tee -a "$OUT/summary.log"
  tail -n 6 "$OUT/$name.log" | tee -a "$OUT/summary.log"
  return $rc
}
step build 300 make -j"$(nproc)" CUDA=1 CUDA_ARCH=90 BUILD=$B MPICC="$MPICC" "${EXTRA[@]}" $NCCLARG gpu-test || exit 1
step test_2r${NG}g 150 $RUN 2 $B/test/gpu/test_gpu
step fault_2r 120 $RUN 2 $B/test/gpu/test_gpu_fault   # abort, kernel mismatch, async error
# the benchmark: gcomm and NCCL through the same harness, one table each, every collective
PERFBACK=gcomm; [ -n "$NCCLARG" ] && PERFBACK=gcomm,nccl
step perf_2r 240 $RUN 2 $B/gcomm_perf --coll all -b 8 -e 1G -f 8 -n 20 -w 5 --backend $PERFBACK
step test_4r${NG}g 120 $RUN 4 $B/test/gpu/test_gpu --quick
TEST_NGPUS=1 step test_2r1g 60 $RUN 2 $B/test/gpu/test_gpu --quick
if command -v compute-sanitizer >/dev/null; then
  step sanitizer 60 $RUN 2 compute-sanitizer --tool memcheck --print-limit 10 $B/test/gpu/test_gpu --quick
fi
# host memory: gcomm beside MPICH's own collectives (16 cores here, unlike the 2-core CI machine)
if [ -n "$MPIEXEC_MPICH" ]; then
  step build_host 200 make -j"$(nproc)" BUILD=build-host MPICC=gcc MPI_CFLAGS="$MPICH_CFLAGS" MPI_LIBS="$MPICH_LIBS" build-host/gcomm_perf
  for n in 2 4; do
    step host_perf_${n}r 120 $MPIEXEC_MPICH -n $n build-host/gcomm_perf --coll allreduce -b 1K -e 256M -f 4 -n 10 -w 3 --backend gcomm,mpi
  done
fi
true
