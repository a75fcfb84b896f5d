/*
 * test/gpu/test_gpu_shrink.c - gcommCommRevoke and gcommCommShrink on GPU communicators, on a GPU
 * machine: `make CUDA=1 gpu-test`, then `mpiexec -n 4 build/test/gpu/test_gpu_shrink`.
 *
 * default  every rank shrinks (GCOMM_SHRINK_DEFAULT) after its stream is synchronised; then the
 *          last rank is excluded and does not call; each new communicator runs 100 all-reduces
 *          of int32 in device memory, each checked against the serial sum.
 * revoke   rank 0 revokes while the other ranks' kernels wait in an all-reduce rank 0 never
 *          joins: their gcommWait returns gcommRevoked (time printed); every rank then shrinks
 *          with GCOMM_SHRINK_ABORT and the new communicator's all-reduces are right.
 * TEST_KILL_RANK=k: rank k is SIGKILLed 3 ms after the others entered a 32 MiB all-reduce,
 *          before it joins; each survivor's wait fails
 *          naming it, it shrinks (ABORT, rank k listed) and runs the 100 all-reduces, without MPI;
 *          each survivor prints its PASS/FAIL line with the times from the all-reduce's start.
 *          MPICH's hydra ends the job when it reaps the victim: run it under a parent that reaps
 *          late (test/test_fault.sh's keeper), e.g. `mpiexec -disable-auto-cleanup -n 2 prog :
 *          -n 1 python3 keeper.py DIR 3 prog : -n 1 prog` with TEST_SHRINK_DIR=DIR.
 */
#include <cuda_runtime_api.h>
#include <mpi.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gcomm.h"

#define ITERS 100
#define COUNT 4099

static int rank, nranks, failed;

#include "gpureport.h"

static int32_t inputOf(int r, int it, int i) {
  return (int32_t)((r * 7919 + it * 104729 + i * 31) & 0xffff);
}

/* ITERS all-reduces on comm (rank j was world rank members[j]), each checked on the host. */
static int allReducesRight(gcommComm_t comm, const int* members, int n, cudaStream_t s, char* why,
                           size_t len) {
  int me = 0;
  gcommCommUserRank(comm, &me);
  int32_t *h = malloc(COUNT * sizeof(int32_t)), *d = NULL;
  cudaMalloc((void**)&d, COUNT * sizeof(int32_t));
  int bad = 0;
  for (int it = 0; it < ITERS && !bad; it++) {
    for (int i = 0; i < COUNT; i++) h[i] = inputOf(members[me], it, i);
    cudaMemcpy(d, h, COUNT * sizeof(int32_t), cudaMemcpyHostToDevice);
    gcommResult_t res = gcommAllReduce(d, d, COUNT, gcommInt32, gcommSum, comm, s);
    if (res == gcommSuccess) res = gcommWait(comm, s);
    if (res != gcommSuccess) {
      snprintf(why, len, "all-reduce %d: %s", it, gcommGetLastError(comm));
      bad = 1;
      break;
    }
    cudaMemcpy(h, d, COUNT * sizeof(int32_t), cudaMemcpyDeviceToHost);
    for (int i = 0; i < COUNT && !bad; i++) {
      int32_t want = 0;
      for (int j = 0; j < n; j++) want += inputOf(members[j], it, i);
      if (h[i] != want)
        snprintf(why, len, "all-reduce %d element %d: %d, expected %d", it, i, h[i], want), bad = 1;
    }
  }
  cudaFree(d);
  free(h);
  return !bad;
}

static void testDefault(cudaStream_t s) {
  gcommComm_t comm = NULL, small = NULL;
  int members[64], last = nranks - 1, ok = 1;
  char why[512] = "";
  for (int j = 0; j < nranks; j++) members[j] = j;
  ok = gcommCommInitMPI(&comm, MPI_COMM_WORLD, NULL) == gcommSuccess;
  cudaStreamSynchronize(s);
  if (ok && gcommCommShrink(comm, NULL, 0, &small, NULL, GCOMM_SHRINK_DEFAULT) == gcommSuccess) {
    ok = allReducesRight(small, members, nranks, s, why, sizeof(why));
    gcommCommDestroy(small);
  } else {
    ok = 0, snprintf(why, sizeof(why), "%s", gcommGetLastError(comm));
  }
  if (!ok) printf("rank %d: %s\n", rank, why);
  report(ok, "GPU: gcommCommShrink DEFAULT of every rank, 100 all-reduces right");
  ok = 1;
  if (nranks > 1 && rank != last) {
    double t0 = now();
    ok = gcommCommShrink(comm, &last, 1, &small, NULL, GCOMM_SHRINK_DEFAULT) == gcommSuccess;
    if (rank == 0) printf("# GPU DEFAULT shrink to %d ranks: %.1f ms\n", last, (now() - t0) * 1e3);
    if (ok)
      ok = allReducesRight(small, members, last, s, why, sizeof(why)), gcommCommDestroy(small);
    else
      snprintf(why, sizeof(why), "%s", gcommGetLastError(comm));
    if (!ok) printf("rank %d: %s\n", rank, why);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  gcommCommDestroy(comm);
  report(ok, "GPU: gcommCommShrink DEFAULT, the last rank excluded and absent");
}

static void testRevoke(cudaStream_t s) {
  gcommComm_t comm = NULL, fresh = NULL;
  int members[64], ok;
  char why[512] = "";
  for (int j = 0; j < nranks; j++) members[j] = j;
  setenv("GCOMM_TIMEOUT_MS", "20000", 1);
  ok = gcommCommInitMPI(&comm, MPI_COMM_WORLD, NULL) == gcommSuccess;
  int32_t* d = NULL;
  cudaMalloc((void**)&d, 64 * sizeof(int32_t));
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = now();
  gcommResult_t res;
  if (rank == 0) {
    usleep(50000);
    res = gcommCommRevoke(comm);
  } else {
    res = gcommAllReduce(d, d, 64, gcommInt32, gcommSum, comm, s);
    if (res == gcommSuccess) res = gcommWait(comm, s);
    ok = ok && res == gcommRevoked;
    printf("# rank %d: %s after %.1f ms\n", rank, gcommGetErrorString(res), (now() - t0) * 1e3);
  }
  report(ok, "GPU: gcommCommRevoke on rank 0 ends the other ranks' waits with gcommRevoked");
  ok = gcommCommShrink(comm, NULL, 0, &fresh, NULL, GCOMM_SHRINK_ABORT) == gcommSuccess;
  if (ok)
    ok = allReducesRight(fresh, members, nranks, s, why, sizeof(why)), gcommCommDestroy(fresh);
  else
    snprintf(why, sizeof(why), "%s", gcommGetLastError(comm));
  if (!ok) printf("rank %d: %s\n", rank, why);
  gcommCommDestroy(comm);
  cudaFree(d);
  report(ok, "GPU: gcommCommShrink ABORT after the revoke, 100 all-reduces right");
}

static int killRun(int victim, cudaStream_t s) {
  const char* dir = getenv("TEST_SHRINK_DIR");
  gcommComm_t comm = NULL, small = NULL;
  gcommCommInitMPI(&comm, MPI_COMM_WORLD, NULL);
  size_t count = (size_t)8 << 20;
  float* d = NULL;
  cudaMalloc((void**)&d, count * sizeof(float));
  cudaMemset(d, 0, count * sizeof(float));
  gcommAllReduce(d, d, 1024, gcommFloat32, gcommSum, comm, s);
  gcommWait(comm, s);
  MPI_Barrier(MPI_COMM_WORLD); /* MPI's last use */
  double t0 = now();
  /* the victim dies 3 ms after the others entered the all-reduce, before it joins: on a GPU the
   * whole all-reduce takes well under 3 ms, so a victim that had joined could let it finish */
  if (rank == victim) {
    usleep(3000);
    raise(SIGKILL);
  }
  gcommResult_t res = gcommAllReduce(d, d, count, gcommFloat32, gcommSum, comm, s);
  if (res == gcommSuccess) res = gcommWait(comm, s);
  double tErr = now() - t0, tShrink = tErr;
  char want[32], why[600] = "", line[1600];
  snprintf(want, sizeof(want), "rank %d", victim);
  int ok = res != gcommSuccess && strstr(gcommGetLastError(comm), want) != NULL, members[64], n = 0;
  if (!ok) snprintf(why, sizeof(why), "the wait: %s", gcommGetLastError(comm));
  for (int r = 0; r < nranks && r < 64; r++)
    if (r != victim) members[n++] = r;
  if (ok) {
    ok = gcommCommShrink(comm, &victim, 1, &small, NULL, GCOMM_SHRINK_ABORT) == gcommSuccess;
    if (!ok) snprintf(why, sizeof(why), "shrink: %s", gcommGetLastError(comm));
    tShrink = now() - t0;
  }
  if (ok) ok = allReducesRight(small, members, n, s, why, sizeof(why));
  double tDone = now() - t0;
  if (small != NULL) gcommCommDestroy(small);
  gcommCommAbort(comm);
  gcommCommDestroy(comm);
  snprintf(line, sizeof(line),
           "%s GPU shrink: rank %d of %d: rank %d killed 3 ms into a 32 MiB all-reduce it never "
           "joined; error at "
           "%.3f s, shrunk to %d ranks at %.3f s, 100 all-reduces right at %.3f s%s%s\n",
           ok ? "PASS" : "FAIL", rank, nranks, victim, tErr, n, tShrink, tDone, ok ? "" : ": ",
           why);
  fputs(line, stdout);
  fflush(stdout);
  if (dir != NULL) {
    char path[512];
    snprintf(path, sizeof(path), "%s/rank%d", dir, rank);
    FILE* f = fopen(path, "w");
    if (f) fputs(line, f), fclose(f);
  }
  _exit(ok ? 0 : 1); /* MPI cannot finalise with a dead rank */
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  signal(SIGUSR1, SIG_IGN); /* hydra tells the survivors of a dead rank with it */
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  MPI_Comm node;
  int local = 0, ndev = 0;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, &local);
  MPI_Comm_free(&node);
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0 || nranks > 64) {
    if (rank == 0) printf("FAIL no GPU (or more than 64 ranks)\n");
    MPI_Finalize();
    return 1;
  }
  cudaSetDevice(local % ndev);
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (getenv("TEST_KILL_RANK")) return killRun(atoi(getenv("TEST_KILL_RANK")), s);
  testDefault(s);
  testRevoke(s);
  cudaStreamDestroy(s);
  if (rank == 0) printf("%d failed\n", failed);
  MPI_Finalize();
  return failed != 0;
}
