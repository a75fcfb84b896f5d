/*
 * heat2d_gpu.cu - the GPU half of examples/heat2d.c (a CUDA build): device memory, the column
 * packing and the Jacobi sweep, on the caller's stream (examples/heat2d.h).
 *
 * The sweep computes each point by the host code's expression (0.25 * ((N + S) + (W + E)): no
 * multiply-add to contract), so the GPU field has the host field's bits. The residual is summed
 * per block in a fixed tree, then the blocks' sums in a fixed order: the same on every run.
 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#include "heat2d.h"

#define CUDA_CHECK(call)                                                         \
  do {                                                                           \
    cudaError_t e_ = (call);                                                     \
    if (e_ != cudaSuccess) {                                                     \
      fprintf(stderr, "heat2d: %s failed: %s\n", #call, cudaGetErrorString(e_)); \
      exit(1);                                                                   \
    }                                                                            \
  } while (0)

enum { BX = 32, BY = 8, SUM_THREADS = 256 };

static double* partials; /* one sum per block of the sweep */
static size_t partialsCap;

extern "C" int heatGpuCount(void) {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

extern "C" void heatGpuSelect(int localRank) {
  int n = 0;
  CUDA_CHECK(cudaGetDeviceCount(&n));
  CUDA_CHECK(cudaSetDevice(localRank % n));
}

extern "C" int heatGpuDevice(void) {
  int d = 0;
  CUDA_CHECK(cudaGetDevice(&d));
  return d;
}

extern "C" double* heatGpuAlloc(size_t count) {
  double* p = NULL;
  CUDA_CHECK(cudaMalloc((void**)&p, count * sizeof(double)));
  CUDA_CHECK(cudaMemset(p, 0, count * sizeof(double)));
  return p;
}

extern "C" void heatGpuFree(double* p) {
  CUDA_CHECK(cudaFree(p));
}

extern "C" void heatGpuCopy(double* dst, const double* src, size_t count) {
  CUDA_CHECK(cudaMemcpy(dst, src, count * sizeof(double), cudaMemcpyDefault));
}

extern "C" void* heatGpuStreamCreate(void) {
  cudaStream_t s;
  CUDA_CHECK(cudaStreamCreate(&s)); /* blocking: cudaMemcpy on the legacy stream waits for it */
  return (void*)s;
}

extern "C" void heatGpuStreamDestroy(void* stream) {
  CUDA_CHECK(cudaStreamDestroy((cudaStream_t)stream));
  CUDA_CHECK(cudaFree(partials));
  partials = NULL;
  partialsCap = 0;
}

extern "C" void heatGpuSync(void* stream) {
  CUDA_CHECK(cudaStreamSynchronize((cudaStream_t)stream));
}

__global__ void packColumns(const double* u, int nx, int ny, double* sendW, double* sendE) {
  int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= ny) return;
  size_t row = (size_t)(j + 1) * (nx + 2);
  sendW[j] = u[row + 1];
  sendE[j] = u[row + nx];
}

__global__ void unpackColumns(double* u, int nx, int ny, const double* recvW, const double* recvE) {
  int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= ny) return;
  size_t row = (size_t)(j + 1) * (nx + 2);
  if (recvW != NULL) u[row] = recvW[j];
  if (recvE != NULL) u[row + nx + 1] = recvE[j];
}

__global__ void sweep(const double* u, double* v, int nx, int ny, double* blockSums) {
  __shared__ double sum[BX * BY];
  int i = blockIdx.x * BX + threadIdx.x + 1, j = blockIdx.y * BY + threadIdx.y + 1;
  int t = threadIdx.y * BX + threadIdx.x;
  size_t w = (size_t)nx + 2, k = (size_t)j * w + i;
  double d = 0;
  if (i <= nx && j <= ny) {
    double x =
        __dmul_rn(0.25, __dadd_rn(__dadd_rn(u[k - w], u[k + w]), __dadd_rn(u[k - 1], u[k + 1])));
    v[k] = x;
    d = (x - u[k]) * (x - u[k]);
  }
  sum[t] = d;
  __syncthreads();
  for (int s = BX * BY / 2; s > 0; s /= 2) {
    if (t < s) sum[t] += sum[t + s];
    __syncthreads();
  }
  if (t == 0) blockSums[blockIdx.y * gridDim.x + blockIdx.x] = sum[0];
}

__global__ void sumBlocks(const double* blockSums, int n, double* result) {
  __shared__ double sum[SUM_THREADS];
  double d = 0;
  for (int b = threadIdx.x; b < n; b += SUM_THREADS) d += blockSums[b];
  sum[threadIdx.x] = d;
  __syncthreads();
  for (int s = SUM_THREADS / 2; s > 0; s /= 2) {
    if ((int)threadIdx.x < s) sum[threadIdx.x] += sum[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) *result = sum[0];
}

extern "C" void heatGpuPack(void* stream, const double* u, int nx, int ny, double* sendW,
                            double* sendE) {
  packColumns<<<(ny + 255) / 256, 256, 0, (cudaStream_t)stream>>>(u, nx, ny, sendW, sendE);
  CUDA_CHECK(cudaGetLastError());
}

extern "C" void heatGpuSweep(void* stream, double* u, double* v, int nx, int ny,
                             const double* recvW, const double* recvE, double* result) {
  cudaStream_t s = (cudaStream_t)stream;
  dim3 grid((nx + BX - 1) / BX, (ny + BY - 1) / BY), block(BX, BY);
  size_t blocks = (size_t)grid.x * grid.y;
  if (blocks > partialsCap) {
    CUDA_CHECK(cudaStreamSynchronize(s)); /* the old buffer may still be in use */
    CUDA_CHECK(cudaFree(partials));
    CUDA_CHECK(cudaMalloc((void**)&partials, blocks * sizeof(double)));
    partialsCap = blocks;
  }
  if (recvW != NULL || recvE != NULL)
    unpackColumns<<<(ny + 255) / 256, 256, 0, s>>>(u, nx, ny, recvW, recvE);
  sweep<<<grid, block, 0, s>>>(u, v, nx, ny, partials);
  sumBlocks<<<1, SUM_THREADS, 0, s>>>(partials, (int)blocks, result);
  CUDA_CHECK(cudaGetLastError());
}
