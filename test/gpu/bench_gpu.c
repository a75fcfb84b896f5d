/*
 * test/gpu/bench_gpu.c - busbw of gcomm's GPU collectives beside NCCL's (when built with NCCL=1),
 * one process per GPU, float, nccl-tests' size and busbw conventions, timed with CUDA events
 * over ITERS back-to-back launches after WARMUP. Usage: bench_gpu [maxBytes]
 */
#include <cuda_runtime_api.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gcomm.h"
#ifdef GCOMM_PERF_NCCL
#include <nccl.h>
#endif

#define WARMUP 5
#define ITERS 20

static int rank, nranks;
enum { AR, AG, RS, BC, A2A, SR, NCOLL };
static const char* names[] = {"all_reduce", "all_gather", "reduce_scatter", "broadcast",
                              "alltoall", "sendrecv"};

static double busFactor(int c, int n) {
  switch (c) {
    case AR: return 2.0 * (n - 1) / n;
    case AG: case RS: case A2A: return (double)(n - 1) / n;
    default: return 1.0;
  }
}

/* bytes: nccl-tests' size (the whole buffer); count per rank derived from it */
static void runG(gcommComm_t comm, int c, void* s, void* r, size_t bytes, cudaStream_t st) {
  size_t cnt = bytes / 4, per = cnt / nranks;
  int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
  switch (c) {
    case AR: gcommAllReduce(s, r, cnt, gcommFloat, gcommSum, comm, st); break;
    case AG: gcommAllGather(s, r, per, gcommFloat, comm, st); break;
    case RS: gcommReduceScatter(s, r, per, gcommFloat, gcommSum, comm, st); break;
    case BC: gcommBroadcast(s, r, cnt, gcommFloat, 0, comm, st); break;
    case A2A: gcommAllToAll(s, r, per, gcommFloat, comm, st); break;
    case SR:
      gcommGroupStart();
      gcommSend(s, cnt, gcommFloat, next, comm, st);
      gcommRecv(r, cnt, gcommFloat, prev, comm, st);
      gcommGroupEnd();
      break;
  }
}

#ifdef GCOMM_PERF_NCCL
static void runN(ncclComm_t comm, int c, void* s, void* r, size_t bytes, cudaStream_t st) {
  size_t cnt = bytes / 4, per = cnt / nranks;
  int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
  switch (c) {
    case AR: ncclAllReduce(s, r, cnt, ncclFloat, ncclSum, comm, st); break;
    case AG: ncclAllGather(s, r, per, ncclFloat, comm, st); break;
    case RS: ncclReduceScatter(s, r, per, ncclFloat, ncclSum, comm, st); break;
    case BC: ncclBroadcast(s, r, cnt, ncclFloat, 0, comm, st); break;
    case A2A:
      ncclGroupStart();
      for (int p = 0; p < nranks; p++) {
        ncclSend((char*)s + p * per * 4, per, ncclFloat, p, comm, st);
        ncclRecv((char*)r + p * per * 4, per, ncclFloat, p, comm, st);
      }
      ncclGroupEnd();
      break;
    case SR:
      ncclGroupStart();
      ncclSend(s, cnt, ncclFloat, next, comm, st);
      ncclRecv(r, cnt, ncclFloat, prev, comm, st);
      ncclGroupEnd();
      break;
  }
}
#endif

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  size_t maxBytes = argc > 1 ? strtoull(argv[1], NULL, 0) : ((size_t)1 << 30);
  int ndev = 1;
  cudaGetDeviceCount(&ndev);
  cudaSetDevice(rank % ndev);
  void *s, *r;
  cudaMalloc(&s, maxBytes);
  cudaMalloc(&r, maxBytes);
  cudaMemset(s, 0, maxBytes);
  cudaStream_t st;
  cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
  gcommComm_t g;
  if (gcommCommInitMPI(&g, MPI_COMM_WORLD, NULL) != gcommSuccess) {
    fprintf(stderr, "init: %s\n", gcommGetLastError(NULL));
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
#ifdef GCOMM_PERF_NCCL
  ncclUniqueId id;
  ncclComm_t nc;
  if (rank == 0) ncclGetUniqueId(&id);
  MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclCommInitRank(&nc, nranks, id, rank);
#endif
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  if (rank == 0)
    printf("# %d ranks, %d GPUs, float, %d iterations; time in us, busbw in GB/s\n"
           "# %-14s %12s %10s %9s %10s %9s\n",
           nranks, ndev, ITERS, "collective", "bytes", "gcomm_us", "gcomm_bw", "nccl_us", "nccl_bw");
  const char* only = getenv("BENCH_COLL");
  for (int c = 0; c < NCOLL; c++) {
    if (only && !strstr(only, names[c])) continue;
    for (size_t bytes = 8; bytes <= maxBytes; bytes *= (bytes < 65536 ? 8 : 4)) {
      if (bytes / 4 / nranks == 0 || (bytes / 4) % nranks) continue;
      double us[2] = {-1, -1};
      for (int b = 0; b < 2; b++) {
#ifndef GCOMM_PERF_NCCL
        if (b == 1) break;
#endif
        for (int i = 0; i < WARMUP; i++) {
          if (b == 0) runG(g, c, s, r, bytes, st);
#ifdef GCOMM_PERF_NCCL
          else runN(nc, c, s, r, bytes, st);
#endif
        }
        cudaStreamSynchronize(st);
        MPI_Barrier(MPI_COMM_WORLD);
        cudaEventRecord(e0, st);
        for (int i = 0; i < ITERS; i++) {
          if (b == 0) runG(g, c, s, r, bytes, st);
#ifdef GCOMM_PERF_NCCL
          else runN(nc, c, s, r, bytes, st);
#endif
        }
        cudaEventRecord(e1, st);
        if (b == 0) {
          gcommResult_t res = gcommWait(g, st);
          if (res != gcommSuccess) {
            fprintf(stderr, "rank %d: %s %zu: %s\n", rank, names[c], bytes, gcommGetLastError(g));
            MPI_Abort(MPI_COMM_WORLD, 1);
          }
        }
        cudaEventSynchronize(e1);
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        double t = ms * 1000.0 / ITERS, tmax;
        MPI_Allreduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        us[b] = tmax;
      }
      if (rank == 0) {
        double f = busFactor(c, nranks);
        printf("  %-14s %12zu %10.1f %9.1f", names[c], bytes, us[0], bytes / us[0] / 1e3 * f);
        if (us[1] > 0) printf(" %10.1f %9.1f", us[1], bytes / us[1] / 1e3 * f);
        printf("\n");
        fflush(stdout);
      }
    }
  }
  gcommCommDestroy(g);
#ifdef GCOMM_PERF_NCCL
  ncclCommDestroy(nc);
#endif
  MPI_Finalize();
  return 0;
}
