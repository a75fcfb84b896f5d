#!/bin/bash
# test/gpu/run.sh - on a GPU machine, in one call: build with CUDA (and NCCL when
# $NCCL_HOME has it), GPU correctness at 2 ranks on 2 GPUs, the benchmark beside NCCL, then 4 ranks
# on 2 GPUs and 2 ranks on 1 GPU, then compute-sanitizer, staging through host memory, copy
# engines, the network. Logs go to $OUT (or ./gpu-logs).
# Usage (from the repository root): bash test/gpu/run.sh
# STAGES picks parts (default: all but knobs, channels, algos and shrinkkill): build test perf sweep
# shrink knobs channels algos large quick mps shared profiler sanitizer host p2pdisable ce shmce
# net hmem shrinkkill.
# One device call may run 10 minutes: split the stages over two calls when all do not fit.
STAGES=${STAGES:-"build test shrink perf sweep large quick mps shared profiler sanitizer host p2pdisable ce shmce net hmem"}
want() { [[ " $STAGES " == *" $1 "* ]]; }
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
B=${BUILD:-build-gpu}
export GCOMM_TIMEOUT_MS=${GCOMM_TIMEOUT_MS:-30000}
# every stage but `shared` runs the kernels, also where ranks share a GPU without MPS (a 1-GPU
# machine); `shared` runs the copy path that such ranks take by default (GCOMM_SHARED_GPU=auto)
export GCOMM_SHARED_GPU=kernels
NG=$(nvidia-smi -L 2>/dev/null | wc -l)
# ranks of the main stages (test, perf, large, channels): one a GPU, 2 by default;
# NR=4 on a machine with 4 GPUs
NR=${NR:-2}
{ nvidia-smi; nvidia-smi topo -m; df -h /dev/shm; } > "$OUT/machine.log" 2>&1
if command -v mpicc >/dev/null && mpicc -showme >/dev/null 2>&1; then   # Open MPI
  MPICC=mpicc; RUN="mpirun --oversubscribe --bind-to none -x GCOMM_TIMEOUT_MS -x TEST_NGPUS -x LD_LIBRARY_PATH -x GCOMM_DEBUG -x GCOMM_SHARED_GPU -x GCOMM_SHARED_GPU_CHUNK -x TEST_SHARED_COPY -np"
  PASSENV="-x GCOMM_PROTO -x GCOMM_DEBUG_SUBSYS"
  P2PENV="-x GCOMM_P2P_DISABLE -x NCCL_P2P_DISABLE -x GCOMM_DEBUG_SUBSYS"
  CEENV="-x GCOMM_P2P_USE_CUDA_MEMCPY -x GCOMM_DEBUG_SUBSYS"
else                                                                 # MPICH from .devdeps
  P2PENV=""; CEENV=""                                                # hydra passes the environment
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
# make is quick when the build is there already (a second call on a warm machine)
# KERNELS_PREBUILT=1: the kernels' objects were compiled on the CPU machine and carried here
# (they need neither MPI nor NCCL): make uses them as they are, saving the long compiles.
# keep_kernels DIR: make's arguments that keep DIR's kernel objects
KOBJ="gcomm_kernels.o gcomm_kernels_general.o"
keep_kernels() { [ "$KERNELS_PREBUILT" = 1 ] && for o in $KOBJ; do [ -f $1/obj/$o ] && echo "-o $1/obj/$o"; done; }
KEEP=($(keep_kernels $B))
step build 300 make -j"$(nproc)" "${KEEP[@]}" CUDA=1 CUDA_ARCH=90 BUILD=$B MPICC="$MPICC" "${EXTRA[@]}" $NCCLARG gpu-test || exit 1
want test && step test_${NR}r${NG}g 400 $RUN $NR $B/test/gpu/test_gpu
want test && step fault_${NR}r 120 $RUN $NR $B/test/gpu/test_gpu_fault   # abort, kernel mismatch, async error
want test && step vcoll_${NR}r 200 $RUN $NR $B/test/gpu/test_vcoll_gpu       # vector collectives against MPI's
want shrink && step shrink_${NR}r 180 $RUN $NR $B/test/gpu/test_gpu_shrink # revoke, shrink
# 4 ranks on the GPUs, rank 2 SIGKILLed mid all-reduce, a zombie under a parent that reaps it once
# the 3 survivors have written their lines (a launcher that reaps it at once ends the job: see
# docs/RELIABILITY.md); the survivors shrink and run 100 all-reduces without MPI
if want shrinkkill; then
  SK=$(mktemp -d); NPF=${RUN##* }; KEEPF=(-disable-auto-cleanup); [ "$MPICC" = mpicc ] && KEEPF=(--mca orte_abort_on_non_zero_status 0 -x TEST_KILL_RANK -x TEST_SHRINK_DIR)
  printf '%s\n' 'import os, signal, sys, time' 'pid = os.fork()' 'if pid == 0: os.execvp(sys.argv[3], sys.argv[3:])' \
    'signal.signal(signal.SIGUSR1, signal.SIG_IGN)' 'end = time.time() + 60' \
    'while time.time() < end and sum(f.startswith("rank") for f in os.listdir(sys.argv[1])) < int(sys.argv[2]): time.sleep(0.05)' \
    'os.waitpid(pid, 0)' > "$SK/keeper.py"
  TEST_KILL_RANK=2 TEST_SHRINK_DIR=$SK GCOMM_TIMEOUT_MS=5000 step shrinkkill_4r 120 $RUN 2 "${KEEPF[@]}" $B/test/gpu/test_gpu_shrink : \
    $NPF 1 python3 "$SK/keeper.py" "$SK" 3 $B/test/gpu/test_gpu_shrink : $NPF 1 $B/test/gpu/test_gpu_shrink
  cat "$SK"/rank* | tee -a "$OUT/summary.log"
fi
# the benchmark: gcomm and NCCL through the same harness, one table each, every collective
PERFBACK=gcomm; [ -n "$NCCLARG" ] && PERFBACK=gcomm,nccl
want perf && step perf_${NR}r 240 $RUN $NR $B/gcomm_perf --coll all -b 8 -e 64M -f 8 -n 20 -w 5 --backend $PERFBACK
# each protocol forced, small sizes: the numbers behind the cost model's GPU constants
if want sweep; then
  GCOMM_DEBUG=INFO GCOMM_DEBUG_SUBSYS=TUNING step tuning 60 $RUN 2 $PASSENV $B/gcomm_perf --coll allreduce -b 8 -e 8 -n 1 -w 0
  for p in simple ll; do
    GCOMM_PROTO=$p step sweep_$p 120 $RUN 2 $PASSENV $B/gcomm_perf --coll allreduce,broadcast,allgather,reducescatter,sendrecv -b 8 -e 4M -f 4 -n 50 -w 10 --backend gcomm
  done
fi
# FIFO size against the large-message rate of the reductions (the default is GCOMM_BUFFSIZE=4M)
if want knobs; then
  for b in 2M 8M 16M; do
    GCOMM_BUFFSIZE=$b step knobs_buff$b 120 $RUN 2 -x GCOMM_BUFFSIZE $B/gcomm_perf --coll allreduce,reduce,reducescatter,broadcast -b 256M -e 256M -n 10 -w 3 -c 0 --backend gcomm
  done
fi
# channel count (blocks per collective) against the same large-message rates (CHANNELS picks them)
if want channels; then
  for c in ${CHANNELS:-16 48 64}; do
    GCOMM_NCHANNELS=$c step channels_${NR}r_$c 120 $RUN $NR -x GCOMM_NCHANNELS $B/gcomm_perf --coll allreduce,reduce,reducescatter,broadcast,alltoall -b 256M -e 256M -n 10 -w 3 -c 0 --backend gcomm
  done
fi
# the all-reduce algorithms forced in turn beside the cost model's choice and NCCL (small and
# medium sizes, where one-shot, two-shot and the ring differ)
if want algos; then
  for a in ring direct twoshot; do
    GCOMM_ALGO=$a step algo_${NR}r_$a 150 $RUN $NR $PASSENV -x GCOMM_ALGO $B/gcomm_perf --coll allreduce -b 8 -e 64M -f 4 -n 50 -w 10 --backend gcomm
  done
  step algo_${NR}r_auto 150 $RUN $NR $B/gcomm_perf --coll allreduce -b 8 -e 64M -f 4 -n 50 -w 10 --backend $PERFBACK
fi
want large && step perf_${NR}r_large 300 $RUN $NR $B/gcomm_perf --coll all -b 64M -e 4G -f 4 -n 10 -w 3 -c 0 --backend $PERFBACK
want quick && step quick_4r${NG}g 200 $RUN 4 $B/test/gpu/test_gpu --quick
# two ranks on every GPU when there are more than 2 (8 ranks on 4 GPUs)
want quick && [ "$NG" -gt 2 ] && step quick_$((2 * NG))r${NG}g 300 $RUN $((2 * NG)) $B/test/gpu/test_gpu --quick
want quick && TEST_NGPUS=1 step quick_2r1g 120 $RUN 2 $B/test/gpu/test_gpu --quick
want quick && TEST_NGPUS=1 step quick_4r1g 200 $RUN 4 $B/test/gpu/test_gpu --quick
# ranks sharing one GPU under MPS (the daemon started and stopped here): the stress test (chains
# of random collectives and sizes across the LL/Simple threshold, several communicators) at 4 and
# 8 ranks on GPU 0, and the all-reduce sweep at 4 ranks, each run MPS_RUNS / MPS_SWEEPS times;
# every run's output goes to one log per kind, the summary counts the runs that passed. A run
# that fails may leave the daemon refusing clients: it is restarted then.
if want mps && command -v nvidia-cuda-mps-control >/dev/null; then
  export CUDA_MPS_PIPE_DIRECTORY=$(mktemp -d) CUDA_MPS_LOG_DIRECTORY=$(mktemp -d)
  MPSENV=""; [ "$MPICC" = mpicc ] && MPSENV="-x CUDA_MPS_PIPE_DIRECTORY -x CUDA_MPS_LOG_DIRECTORY"
  nvidia-cuda-mps-control -d
  repeat() { # name runs timeout command...: "name: P of N runs passed"
    local name=$1 runs=$2 t=$3 pass=0; shift 3
    for i in $(seq "$runs"); do
      echo "=== $name run $i: $*" >> "$OUT/$name.log"
      if timeout -k 5 "$t" "$@" >> "$OUT/$name.log" 2>&1; then pass=$((pass + 1)); else
        echo quit | nvidia-cuda-mps-control; sleep 1; nvidia-cuda-mps-control -d
      fi
    done
    echo "=== $name: $pass of $runs runs passed $([ $pass = "$runs" ] && echo ok || echo FAILED)" | tee -a "$OUT/summary.log"
  }
  for n in 4 8; do
    TEST_NGPUS=1 repeat mps_stress_${n}r1g "${MPS_RUNS:-50}" 120 $RUN $n $MPSENV $B/test/gpu/test_gpu_stress
  done
  TEST_NGPUS=1 GCOMM_TIMEOUT_MS=8000 repeat mps_sweep_4r1g "${MPS_SWEEPS:-30}" 120 $RUN 4 $MPSENV $B/gcomm_perf --coll allreduce -b 8 -e 16M -f 8 -n 50 -w 10 -R 1 --backend gcomm
  echo quit | nvidia-cuda-mps-control
fi
# ranks all on one GPU through the copy path (GCOMM_SHARED_GPU: stream-ordered copies and short
# kernels, none waiting for a peer): without MPS, where auto takes it, test_gpu at 2 ranks and at 4
# with small staging chunks (every message in many chunks), the stress test at 4, and the
# all-reduce sweep at 2; under MPS with the path forced, test_gpu at 4. The INFO lines show the
# path each communicator took.
if want shared; then
  export GCOMM_SHARED_GPU=auto TEST_SHARED_COPY=1 TEST_NGPUS=1
  GCOMM_DEBUG=INFO GCOMM_DEBUG_SUBSYS=INIT step shared_2r1g 150 $RUN 2 $B/test/gpu/test_gpu --quick
  n=$(grep -c "through staging (GCOMM_SHARED_GPU=copy path)" $OUT/shared_2r1g.log)
  echo "=== shared_used: $n ranks' communicators took the copy path (4 expected: 2 comms x 2 ranks) $([ "$n" -ge 4 ] && echo ok || echo FAILED)" | tee -a "$OUT/summary.log"
  GCOMM_SHARED_GPU_CHUNK=64K step shared_4r1g_64k 200 $RUN 4 $B/test/gpu/test_gpu --quick
  step shared_stress_4r1g 150 $RUN 4 $B/test/gpu/test_gpu_stress 3 24
  step shared_perf_2r1g 120 $RUN 2 $B/gcomm_perf --coll allreduce -b 8 -e 64M -f 2 -n 20 -w 5 --backend gcomm
  if command -v nvidia-cuda-mps-control >/dev/null; then
    export CUDA_MPS_PIPE_DIRECTORY=$(mktemp -d) CUDA_MPS_LOG_DIRECTORY=$(mktemp -d)
    MPSENV=""; [ "$MPICC" = mpicc ] && MPSENV="-x CUDA_MPS_PIPE_DIRECTORY -x CUDA_MPS_LOG_DIRECTORY"
    nvidia-cuda-mps-control -d
    GCOMM_SHARED_GPU=copy step shared_mps_4r1g 200 $RUN 4 $MPSENV $B/test/gpu/test_gpu --quick
    echo quit | nvidia-cuda-mps-control
  fi
  export GCOMM_SHARED_GPU=kernels; unset TEST_SHARED_COPY TEST_NGPUS
fi
# the profiler on GPU communicators: kernel-channel events from device timestamps, merged and
# checked (valid JSON, one track per rank, children inside their parents)
if want profiler; then
  GCOMM_PROFILER_PLUGIN=$PWD/$B/examples/libgcomm-profiler-trace.so GCOMM_PROFILER_TRACE=$OUT/prof-%r.json \
    step profiler 120 $RUN 2 -x GCOMM_PROFILER_PLUGIN -x GCOMM_PROFILER_TRACE $B/gcomm_perf --coll all -b 1K -e 4M -f 8 -n 3 -w 1
  step profiler_check 60 python3 tools/gcomm_trace.py --check --ranks 2 -o $OUT/prof-merged.json $OUT/prof-0.json $OUT/prof-1.json
  # the GPU's own events must be there: kernel-channel slices from device timestamps
  n=$(grep -oE '"cat": *"kernelch"' $OUT/prof-merged.json | wc -l)
  echo "=== profiler_kernelch: $n kernel-channel events $([ "$n" -gt 0 ] && echo ok || echo FAILED)" | tee -a "$OUT/summary.log"
fi
if want sanitizer && command -v compute-sanitizer >/dev/null; then
  step sanitizer 120 $RUN 2 compute-sanitizer --tool memcheck --print-limit 10 $B/test/gpu/test_gpu --quick
  step racecheck 300 $RUN 2 compute-sanitizer --tool racecheck --print-limit 10 $B/test/gpu/test_gpu --quick
fi
# GPU FIFOs staged through pinned shared host memory (GCOMM_P2P_DISABLE=1; NCCL_P2P_DISABLE=1
# for NCCL's own shm path beside it): correctness at 2 ranks on 2 GPUs and on 1 GPU, then the
# bandwidth (docs/PERF.md). The INFO lines show that the variable reached the ranks.
if want p2pdisable; then
  export GCOMM_P2P_DISABLE=1 NCCL_P2P_DISABLE=1
  GCOMM_DEBUG=INFO GCOMM_DEBUG_SUBSYS=INIT step p2pdis_2r${NG}g 150 $RUN 2 $P2PENV $B/test/gpu/test_gpu --quick
  GCOMM_DEBUG=INFO GCOMM_DEBUG_SUBSYS=INIT TEST_NGPUS=1 step p2pdis_2r1g 150 $RUN 2 $P2PENV $B/test/gpu/test_gpu --quick
  # one log per GPU count (one file when the machine has one GPU): 16 regions each
  nlogs=$(ls $OUT/p2pdis_2r*g.log | wc -l)
  n=$(cat $OUT/p2pdis_2r*g.log | grep -c "FIFO region of .* in pinned shared host memory")
  echo "=== p2pdis_staged: $n FIFO regions in pinned host memory in the tests' logs ($((16 * nlogs)) expected: 8 comms x 2 ranks x $nlogs runs) $([ "$n" -ge $((16 * nlogs)) ] && echo ok || echo FAILED)" | tee -a "$OUT/summary.log"
  # NCCL refuses two ranks on one GPU: beside NCCL only with a GPU per rank
  PB=$PERFBACK; [ "$NG" -lt 2 ] && PB=gcomm
  step p2pdis_perf 150 $RUN 2 $P2PENV $B/gcomm_perf --coll allreduce,broadcast,sendrecv -b 8 -e 256M -f 8 --backend $PB
  unset GCOMM_P2P_DISABLE NCCL_P2P_DISABLE
fi
# sends to local ranks through copy engines (GCOMM_P2P_USE_CUDA_MEMCPY=1: staging FIFOs in each
# rank's GPU memory that the progress thread copies into the receivers' FIFOs with
# cudaMemcpyAsync; Simple protocol only, so the LL passes warn and run Simple): correctness at 2
# ranks (on 2 GPUs when there are 2) and 4 ranks on 1 GPU, the failure tests, then the bandwidth
# beside the same sweep with SM stores (the default) on this machine. The INFO lines show that
# the copy engines were used.
if want ce; then
  export GCOMM_P2P_USE_CUDA_MEMCPY=1
  CEG=$((NG > 1 ? 2 : 1))
  GCOMM_DEBUG=INFO GCOMM_DEBUG_SUBSYS=INIT step ce_2r${CEG}g 200 $RUN 2 $CEENV $B/test/gpu/test_gpu --quick
  GCOMM_DEBUG=INFO GCOMM_DEBUG_SUBSYS=INIT TEST_NGPUS=1 step ce_4r1g 250 $RUN 4 $CEENV $B/test/gpu/test_gpu --quick
  step ce_fault 120 $RUN 2 $CEENV $B/test/gpu/test_gpu_fault   # abort, mismatch (the words are copied)
  # every rank of the tests' 8 communicators says so: 8 x 2 + 8 x 4 lines
  n=$(cat $OUT/ce_2r${CEG}g.log $OUT/ce_4r1g.log | grep -c "through copy engines (GCOMM_P2P_USE_CUDA_MEMCPY=1")
  echo "=== ce_used: $n communicators' ranks used copy engines in the tests' logs (48 expected) $([ "$n" -ge 48 ] && echo ok || echo FAILED)" | tee -a "$OUT/summary.log"
  CEPERF="--coll allreduce,allgather,broadcast,sendrecv -b 1M -e 1G -f 4 -n 10 -w 3 --backend gcomm"
  step ce_perf 240 $RUN 2 $CEENV $B/gcomm_perf $CEPERF
  unset GCOMM_P2P_USE_CUDA_MEMCPY
  step ce_perf_sm 240 $RUN 2 $B/gcomm_perf $CEPERF
fi
# the proxy's knobs on FIFOs staged through host memory (GCOMM_P2P_DISABLE=1): SM loads and stores
# with the FIFOs in the sender's segment (GCOMM_SHM_LOCALITY=1; the receiver's is the p2pdisable
# stage), copy engines (GCOMM_SHM_USE_CUDA_MEMCPY=1) filling them (mode 1), draining them (2) or
# both (3) with either locality, the last with the proxy in its own context and gdrcopy asked for
# (absent here: its INFO line and the fallback); and copy engines on IPC FIFOs in the proxy's own
# context. Correctness at 2 ranks on 2 GPUs (when there are 2) and 2 ranks on 1 GPU; the INFO lines
# show that each choice was taken.
if want shmce; then
  SHMENV=""; [ "$MPICC" = mpicc ] && SHMENV="-x GCOMM_P2P_DISABLE -x GCOMM_P2P_USE_CUDA_MEMCPY -x GCOMM_SHM_USE_CUDA_MEMCPY -x GCOMM_SHM_MEMCPY_MODE -x GCOMM_SHM_LOCALITY -x GCOMM_CREATE_THREAD_CONTEXT -x GCOMM_GDRCOPY_SYNC_ENABLE -x GCOMM_DEBUG_SUBSYS"
  SHMG=$((NG > 1 ? 2 : 1))
  # name: GCOMM_P2P_DISABLE GCOMM_SHM_USE_CUDA_MEMCPY GCOMM_SHM_MEMCPY_MODE GCOMM_SHM_LOCALITY
  #       GCOMM_CREATE_THREAD_CONTEXT GCOMM_GDRCOPY_SYNC_ENABLE GCOMM_P2P_USE_CUDA_MEMCPY
  for cfg in "sm_loc1 1 0 3 1 0 0 0" "ce1_loc2 1 1 1 2 0 0 0" "ce2_loc1 1 1 2 1 0 0 0" \
             "ce3_loc2 1 1 3 2 0 0 0" "ce3_loc1_ctx_gdr 1 1 3 1 1 1 0"; do
    set -- $cfg
    for g in $(printf '%s\n' $SHMG 1 | sort -u); do
      GCOMM_P2P_DISABLE=$2 GCOMM_SHM_USE_CUDA_MEMCPY=$3 GCOMM_SHM_MEMCPY_MODE=$4 GCOMM_SHM_LOCALITY=$5 \
        GCOMM_CREATE_THREAD_CONTEXT=$6 GCOMM_GDRCOPY_SYNC_ENABLE=$7 GCOMM_P2P_USE_CUDA_MEMCPY=$8 \
        GCOMM_DEBUG=INFO GCOMM_DEBUG_SUBSYS=INIT TEST_NGPUS=$g \
        step shm_$1_2r${g}g 200 $RUN 2 $SHMENV $B/test/gpu/test_gpu --quick
    done
  done
  GCOMM_P2P_USE_CUDA_MEMCPY=1 GCOMM_CREATE_THREAD_CONTEXT=1 GCOMM_DEBUG=INFO GCOMM_DEBUG_SUBSYS=INIT \
    step ipc_ce_ctx_2r${SHMG}g 200 $RUN 2 $SHMENV $B/test/gpu/test_gpu --quick
  # name of the logs, INFO text each rank of them must print at least once
  for check in "shm_ce*:through copy engines (GCOMM_SHM_USE_CUDA_MEMCPY=1" \
               "shm_*loc1*:lies in its sender's shm segment" \
               "shm_ce1*:sends to local ranks through copy engines" \
               "shm_ce2*:receives from local ranks through copy engines" \
               "*ctx*:runs in a context of its own" "*gdr*:no gdrcopy"; do
    logs=$(ls $OUT/${check%%:*}.log 2>/dev/null); want=$((2 * $(echo "$logs" | wc -w)))
    n=0; for l in $logs; do n=$((n + $(grep -F "${check#*:}" "$l" | grep -oE '\[[0-9]+\]' | sort -u | wc -l))); done
    echo "=== shmce_info '${check#*:}': $n of $want ranks in ${check%%:*} $([ "$n" -ge "$want" ] && [ "$want" -gt 0 ] && echo ok || echo FAILED)" | tee -a "$OUT/summary.log"
  done
fi
# GPU communicators across 2 pretend nodes (GCOMM_HOSTID from the MPI rank, as test/test_net.sh):
# device buffers staged through pinned host FIFOs and libfabric's tcp provider on loopback; built
# with OFI=1 and MPICH + libfabric from .devdeps. Correctness at 2 nodes x 1 rank on 1 GPU and on
# every GPU, 2 nodes x 2 ranks, the failure tests, then the bandwidth between the nodes.
if want net; then
  [ -z "$OFI_LIBS" ] && [ -f .devdeps/setup.sh ] && source .devdeps/setup.sh
  BN=$B-net
  node=$(mktemp -d)/node.sh
  printf '#!/bin/bash\nr=${PMI_RANK:-${OMPI_COMM_WORLD_RANK:-0}}\nexport GCOMM_HOSTID=node$((r / NET_RPN))\nexec "$@"\n' >"$node"
  chmod +x "$node"
  # the kernels' object depends on neither MPI nor libfabric: the main build's saves a compile
  mkdir -p $BN/obj && for o in $KOBJ; do cp -p $B/obj/$o $BN/obj/ 2>/dev/null; done
  if [ -z "$MPIEXEC_MPICH" ] || [ -z "$OFI_LIBS" ]; then
    echo "=== net: skipped (no MPICH/libfabric: source .devdeps/setup.sh)" | tee -a "$OUT/summary.log"
  elif step build_net 300 make -j"$(nproc)" $(keep_kernels $BN) CUDA=1 CUDA_ARCH=90 OFI=1 BUILD=$BN MPICC=gcc \
      MPI_CFLAGS="$MPICH_CFLAGS" MPI_LIBS="$MPICH_LIBS" OFI_CFLAGS="$OFI_CFLAGS" OFI_LIBS="$OFI_LIBS" gpu-test; then
    export GCOMM_OFI_PROVIDER=tcp FI_TCP_IFACE=lo
    NET_RPN=1 TEST_NGPUS=1 step net_2n1r_1g 200 $MPIEXEC_MPICH -n 2 "$node" $BN/test/gpu/test_gpu --quick
    [ "$NG" -gt 1 ] && NET_RPN=1 step net_2n1r_${NG}g 150 $MPIEXEC_MPICH -n 2 "$node" $BN/test/gpu/test_gpu --quick
    NET_RPN=2 step net_2n2r_${NG}g 250 $MPIEXEC_MPICH -n 4 "$node" $BN/test/gpu/test_gpu --quick
    NET_RPN=1 step net_fault 90 $MPIEXEC_MPICH -n 2 "$node" $BN/test/gpu/test_gpu_fault
    NET_RPN=2 step net_shrink_2n2r 150 $MPIEXEC_MPICH -n 4 "$node" $BN/test/gpu/test_gpu_shrink   # revoke, shrink across nodes
    NET_RPN=1 step net_perf 180 $MPIEXEC_MPICH -n 2 "$node" $BN/gcomm_perf --coll allreduce,allgather,sendrecv -b 8 -e 256M -f 8 -n 10 -w 3
    unset GCOMM_OFI_PROVIDER FI_TCP_IFACE
  fi
fi
# GPU communicators across 2 pretend nodes with the network FIFO slots in GPU memory (FI_HMEM,
# GCOMM_NET_GDR), against the libfabric with CUDA in .devdeps-ofi (not in the repository: carried
# beside .devdeps, its build script in .devdeps-ofi/share/; MPICH then runs on it too; libfabric
# dlopens libcudart.so from $CUDA_HOME/lib64). Of its providers (tcp, rxm, shm) only shm
# offers FI_HMEM: tcp does not, and rxm only over a core provider that does. shm copies GPU memory
# with cudaMemcpy from the progress thread, so GCOMM_NET_GDR=auto keeps it staged (an INFO line
# says why) and GCOMM_NET_GDR=1 takes it (the tests' streams are non-blocking). Checked: every
# rank's INFO line shows its slots in GPU memory (any staged rank fails the stage), correctness at
# 2 nodes x 1 and 2 x 2 ranks, GCOMM_NET_GDR=1 over tcp fails init, auto over shm stages; then the
# bandwidth between the nodes, shm with FI_HMEM and staged, and tcp staged.
# Runs in a subshell (its libfabric stays out of the other stages); a failure makes run.sh's exit
# status non-zero.
want hmem && ! (
  BH=$B-hmem
  node=$(mktemp -d)/node.sh
  printf '#!/bin/bash\nr=${PMI_RANK:-${OMPI_COMM_WORLD_RANK:-0}}\nexport GCOMM_HOSTID=node$((r / NET_RPN))\nexec "$@"\n' >"$node"
  chmod +x "$node"
  mkdir -p $BH/obj && for o in $KOBJ; do cp -p $B/obj/$o $BH/obj/ 2>/dev/null; done
  hmemfail=0
  if [ -z "$MPIEXEC_MPICH" ] || [ ! -f .devdeps-ofi/setup.sh ]; then
    echo "=== hmem: FAILED: no MPICH (.devdeps/setup.sh) or no .devdeps-ofi (a libfabric built with CUDA)" | tee -a "$OUT/summary.log"
    hmemfail=1
  else
    source .devdeps-ofi/setup.sh   # OFI_CFLAGS, OFI_LIBS (rpath), LD_LIBRARY_PATH, fi_info
    export LD_LIBRARY_PATH="${CUDA_HOME:-/usr/local/cuda}/lib64:$LD_LIBRARY_PATH"   # libfabric dlopens libcudart.so
    { fi_info --version; FI_LOG_LEVEL=warn fi_info -c FI_HMEM -t FI_EP_RDM; } > "$OUT/hmem_fi_info.log" 2>&1
    step build_hmem 300 make -j"$(nproc)" $(keep_kernels $BH) CUDA=1 CUDA_ARCH=90 OFI=1 BUILD=$BH MPICC=gcc \
      MPI_CFLAGS="$MPICH_CFLAGS" MPI_LIBS="$MPICH_LIBS" OFI_CFLAGS="$OFI_CFLAGS" OFI_LIBS="$OFI_LIBS" gpu-test || hmemfail=1
  fi
  # hmem_check LOG RANKS: every rank's network FIFO slots in GPU memory, none staged
  hmem_check() {
    local on off
    on=$(grep -c "slots in GPU memory registered with FI_HMEM" "$OUT/$1.log")
    off=$(grep -c "staged in pinned host memory" "$OUT/$1.log")
    local ok=$([ "$on" -ge "$2" ] && [ "$off" = 0 ] && echo ok || echo FAILED)
    echo "=== $1 FI_HMEM: $on communicators' slots in GPU memory (>= $2 expected), $off staged: $ok" | tee -a "$OUT/summary.log"
    [ "$ok" = ok ]
  }
  if [ $hmemfail = 0 ]; then
    export GCOMM_OFI_PROVIDER=shm GCOMM_NET_GDR=1 GCOMM_DEBUG=INFO GCOMM_DEBUG_SUBSYS=INIT,NET
    NET_RPN=1 TEST_NGPUS=1 step hmem_2n1r_1g 200 $MPIEXEC_MPICH -n 2 "$node" $BH/test/gpu/test_gpu --quick || hmemfail=1
    hmem_check hmem_2n1r_1g 2 || hmemfail=1
    NET_RPN=2 step hmem_2n2r_${NG}g 250 $MPIEXEC_MPICH -n 4 "$node" $BH/test/gpu/test_gpu --quick || hmemfail=1
    hmem_check hmem_2n2r_${NG}g 4 || hmemfail=1
    # required but not offered: init must fail, naming FI_HMEM
    GCOMM_OFI_PROVIDER=tcp FI_TCP_IFACE=lo NET_RPN=1 TEST_NGPUS=1 step hmem_tcp_required 120 $MPIEXEC_MPICH -n 2 "$node" $BH/test/gpu/test_gpu --quick
    r=$?; n=$(grep -c "GCOMM_NET_GDR=1 but provider .* does not offer FI_HMEM" "$OUT/hmem_tcp_required.log")
    echo "=== hmem_tcp_required: rc=$r, $n ranks refused $([ $r != 0 ] && [ "$n" -ge 1 ] && echo ok || echo FAILED)" | tee -a "$OUT/summary.log"
    [ $r != 0 ] && [ "$n" -ge 1 ] || hmemfail=1
    # auto with a provider that calls CUDA itself: staged, saying why
    GCOMM_NET_GDR=auto NET_RPN=1 TEST_NGPUS=1 step hmem_shm_auto 120 $MPIEXEC_MPICH -n 2 "$node" $BH/gcomm_perf --coll allreduce -b 1M -e 1M -n 2 -w 1 --backend gcomm
    n=$(grep -c "staged in pinned host memory .*no FI_HMEM: the provider moves GPU memory with CUDA calls" "$OUT/hmem_shm_auto.log")
    echo "=== hmem_shm_auto: $n ranks staged with the reason $([ "$n" -ge 2 ] && echo ok || echo FAILED)" | tee -a "$OUT/summary.log"
    [ "$n" -ge 2 ] || hmemfail=1
    unset GCOMM_DEBUG GCOMM_DEBUG_SUBSYS
    # the bandwidth between the 2 nodes: FI_HMEM on and off over shm, and tcp (staged) beside them
    for v in 1 0; do
      GCOMM_NET_GDR=$v NET_RPN=1 TEST_NGPUS=1 step hmem_perf_shm_gdr$v 200 $MPIEXEC_MPICH -n 2 "$node" $BH/gcomm_perf --coll allreduce,sendrecv -b 1M -e 256M -f 4 -n 10 -w 3 --backend gcomm || hmemfail=1
    done
    GCOMM_OFI_PROVIDER=tcp FI_TCP_IFACE=lo GCOMM_NET_GDR=0 NET_RPN=1 TEST_NGPUS=1 step hmem_perf_tcp_gdr0 200 $MPIEXEC_MPICH -n 2 "$node" $BH/gcomm_perf --coll allreduce,sendrecv -b 1M -e 256M -f 4 -n 10 -w 3 --backend gcomm || hmemfail=1
  fi
  echo "=== hmem: $([ $hmemfail = 0 ] && echo ok || echo FAILED)" | tee -a "$OUT/summary.log"
  exit $hmemfail
) && RC=1
# host memory: gcomm beside MPICH's own collectives (16 cores here, unlike the 2-core CI machine)
if want host && [ -n "$MPIEXEC_MPICH" ]; then
  step build_host 200 make -j"$(nproc)" BUILD=build-host MPICC=gcc MPI_CFLAGS="$MPICH_CFLAGS" MPI_LIBS="$MPICH_LIBS" build-host/gcomm_perf
  for n in 2 4; do
    step host_perf_${n}r 120 $MPIEXEC_MPICH -n $n build-host/gcomm_perf --coll allreduce -b 1K -e 256M -f 4 -n 10 -w 3 --backend gcomm,mpi
  done
fi
exit ${RC:-0}
