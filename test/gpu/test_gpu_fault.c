/*
 * test/gpu/test_gpu_fault.c - failure behaviour of GPU communicators, on a GPU
 * machine: `make CUDA=1 gpu-test`, then `mpiexec -n 2 build/test/gpu/test_gpu_fault`.
 *
 * abort     rank 0's kernel waits on a receive that is never matched; another thread calls
 *           gcommCommAbort after 50 ms: gcommWait returns gcommAborted within 100 ms (printed),
 *           the kernel ends by itself (cudaStreamSynchronize returns; time printed), and
 *           gcommCommAbort never waits on the GPU (its own time printed).
 * mismatch  the last rank all-reduces int32 where the others use float32 (same bytes): the
 *           kernels' slot tags differ; gcommCommGetAsyncError turns non-success without a wait on
 *           some rank, and every rank's gcommWait returns gcommInvalidUsage (the detecting ranks,
 *           naming "datatype") or gcommTimeout/gcommRemoteError (ranks whose kernel waited on a
 *           stopped one; GCOMM_TIMEOUT_MS=3000).
 * capture   rank 0 captures a 1 MB all-reduce into a CUDA graph (which meets the other ranks at
 *           capture, GCOMM_GRAPH_REGISTER's default) while the others launch it: rank 0's call
 *           returns gcommTimeout naming the ranks that did not take part, the others' gcommWait
 *           gcommTimeout (or gcommRemoteError) naming the rank they waited for
 *           (GCOMM_TIMEOUT_MS=3000), each within seconds.
 * Each rank ends every communicator with gcommCommAbort + gcommCommDestroy (a GPU communicator's
 * destroy skips its final barrier once aborted or failed).
 */
#include <cuda_runtime_api.h>
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gcomm.h"

static int rank, nranks, failed;

#include "gpureport.h"

typedef struct {
  gcommComm_t comm;
  double at, took;
  gcommResult_t res;
} Aborter;

static void* abortLater(void* arg) {
  Aborter* a = arg;
  usleep(50000);
  a->at = now();
  a->res = gcommCommAbort(a->comm);
  a->took = now() - a->at;
  return NULL;
}

static void testAbort(cudaStream_t s, float* dbuf) {
  gcommComm_t comm;
  int ok = 1;
  if (gcommCommInitMPI(&comm, MPI_COMM_WORLD, NULL) != gcommSuccess) {
    printf("rank %d: init: %s\n", rank, gcommGetLastError(NULL));
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  if (rank == 0) {
    Aborter ab = {comm, 0, 0, gcommInternalError};
    pthread_t t;
    gcommResult_t r = gcommRecv(dbuf, 1 << 20, gcommFloat32, nranks > 1 ? 1 : 0, comm, s);
    pthread_create(&t, NULL, abortLater, &ab);
    gcommResult_t w = gcommWait(comm, s);
    double waited = now();
    pthread_join(t, NULL);
    cudaError_t e = cudaStreamSynchronize(s);
    double ended = now();
    ok = r == gcommSuccess && ab.res == gcommSuccess && w == gcommAborted && waited - ab.at < 0.1 &&
         e == cudaSuccess;
    printf(
        "# gpu abort: gcommCommAbort took %.3f ms; gcommWait returned %s %.2f ms after it; the "
        "kernel ended %.2f ms after it (%s)\n",
        ab.took * 1e3, gcommGetErrorString(w), (waited - ab.at) * 1e3, (ended - ab.at) * 1e3,
        cudaGetErrorString(e));
  }
  report(ok,
         "gpu abort: a kernel waiting on a receive never matched; gcommWait returns "
         "gcommAborted within 100 ms, the kernel ends");
  gcommCommAbort(comm);
  report(gcommCommDestroy(comm) == gcommSuccess, "gpu abort: destroy");
}

static void testMismatch(cudaStream_t s, float* dbuf) {
  gcommComm_t comm;
  if (nranks < 2) return; /* one rank cannot disagree */
  setenv("GCOMM_TIMEOUT_MS", "3000", 1);
  if (gcommCommInitMPI(&comm, MPI_COMM_WORLD, NULL) != gcommSuccess) MPI_Abort(MPI_COMM_WORLD, 1);
  unsetenv("GCOMM_TIMEOUT_MS");
  int odd = rank == nranks - 1;
  double t0 = now();
  gcommResult_t r =
      gcommAllReduce(dbuf, dbuf, 4096, odd ? gcommInt32 : gcommFloat32, gcommSum, comm, s);
  gcommResult_t async = gcommSuccess;
  while (r == gcommSuccess && async == gcommSuccess && now() - t0 < 10) {
    gcommCommGetAsyncError(comm, &async);
    usleep(1000);
  }
  double asyncMs = (now() - t0) * 1e3;
  gcommResult_t w = gcommWait(comm, s);
  const char* msg = gcommGetLastError(comm);
  int named = w == gcommInvalidUsage && strstr(msg, "datatype") != NULL, anyNamed = 0;
  MPI_Allreduce(&named, &anyNamed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  int ok = r == gcommSuccess && async != gcommSuccess &&
           (w == gcommInvalidUsage || w == gcommTimeout || w == gcommRemoteError) && anyNamed;
  printf("# gpu mismatch: rank %d: async error %s after %.1f ms; gcommWait: %s: %s\n", rank,
         gcommGetErrorString(async), asyncMs, gcommGetErrorString(w), msg);
  report(ok,
         "gpu mismatch: float32 against int32: gcommCommGetAsyncError sees the "
         "kernel's error without a wait; gcommInvalidUsage naming the datatype");
  cudaStreamSynchronize(s);
  gcommCommAbort(comm);
  report(gcommCommDestroy(comm) == gcommSuccess, "gpu mismatch: destroy");
}

static void testCaptureAlone(cudaStream_t s, float* dbuf) {
  gcommComm_t comm;
  if (nranks < 2) return;
  setenv("GCOMM_TIMEOUT_MS", "3000", 1);
  if (gcommCommInitMPI(&comm, MPI_COMM_WORLD, NULL) != gcommSuccess) MPI_Abort(MPI_COMM_WORLD, 1);
  unsetenv("GCOMM_TIMEOUT_MS");
  double t0 = now();
  gcommResult_t r = gcommSuccess, w = gcommSuccess;
  if (rank == 0) {
    cudaGraph_t g;
    cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
    r = gcommAllReduce(dbuf, dbuf, 1 << 18, gcommFloat32, gcommSum, comm, s);
    if (cudaStreamEndCapture(s, &g) == cudaSuccess) cudaGraphDestroy(g);
  } else {
    r = gcommAllReduce(dbuf, dbuf, 1 << 18, gcommFloat32, gcommSum, comm, s);
    w = gcommWait(comm, s);
  }
  double secs = now() - t0;
  const char* msg = gcommGetLastError(comm);
  int ok = rank == 0 ? r == gcommTimeout && strstr(msg, "did not take part") != NULL
                     : r == gcommSuccess && (w == gcommTimeout || w == gcommRemoteError);
  printf("# gpu capture alone: rank %d: %s after %.1f s: %s\n", rank,
         gcommGetErrorString(rank == 0 ? r : w), secs, msg);
  report(ok && secs < 20,
         "gpu capture alone: the capturing rank gets gcommTimeout naming the others, the "
         "launching ones their kernels' timeout");
  cudaStreamSynchronize(s);
  gcommCommAbort(comm);
  report(gcommCommDestroy(comm) == gcommSuccess, "gpu capture alone: destroy");
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  MPI_Comm node;
  int local, ndev = 0;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, &local);
  MPI_Comm_free(&node);
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    if (rank == 0) printf("FAIL no GPU\n");
    MPI_Finalize();
    return 1;
  }
  cudaSetDevice(local % ndev);
  cudaStream_t s;
  float* dbuf;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaMalloc((void**)&dbuf, (size_t)4 << 20);
  testAbort(s, dbuf);
  testMismatch(s, dbuf);
  testCaptureAlone(s, dbuf);
  cudaFree(dbuf);
  cudaStreamDestroy(s);
  if (rank == 0) printf("%d failed\n", failed);
  MPI_Finalize();
  return failed != 0;
}
