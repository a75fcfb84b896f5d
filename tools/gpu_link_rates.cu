/*
 * tools/gpu_link_rates.cu - what the link between GPUs 0 and 1 carries: copy engines
 * (cudaMemcpyAsync, pushing or pulling) against SM stores (a copy kernel writing the peer's
 * memory), one way and both ways at once. The ceiling of what gcomm's kernels (SM stores) or a
 * copy-engine path could reach on a machine (docs/PERF.md).
 *
 *   nvcc -O2 -arch=sm_90 -o gpu_link_rates tools/gpu_link_rates.cu && ./gpu_link_rates
 *
 * Prints, for 16 MB to 1 GB, the best of 6 runs of each mode in GB/s each way.
 */
#include <cuda_runtime.h>
#include <stdio.h>

#define CK(x)                                                                            \
  do {                                                                                   \
    cudaError_t e_ = (x);                                                                \
    if (e_ != cudaSuccess) {                                                             \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      return -1;                                                                         \
    }                                                                                    \
  } while (0)

__global__ void storeCopy(int4* __restrict__ dst, const int4* __restrict__ src, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    dst[i] = src[i];
}

enum { CE_PUSH, CE_PULL, SM_PUSH, NUM_KINDS };
static const char* kindNames[NUM_KINDS] = {"copy engine, push", "copy engine, pull",
                                           "SM stores, push"};

static char *buf[2], *peerBuf[2]; /* each GPU's source, and its destination */
static cudaStream_t stream[2];
static cudaEvent_t start[2], stop[2];

/* GPU g moves bytes to (or, pulling, from) the other GPU on its stream. */
static int issue(int kind, int g, size_t bytes) {
  CK(cudaSetDevice(g));
  if (kind == CE_PUSH)
    CK(cudaMemcpyAsync(peerBuf[1 - g], buf[g], bytes, cudaMemcpyDefault, stream[g]));
  else if (kind == CE_PULL)
    CK(cudaMemcpyAsync(peerBuf[g], buf[1 - g], bytes, cudaMemcpyDefault, stream[g]));
  else
    storeCopy<<<264, 512, 0, stream[g]>>>((int4*)peerBuf[1 - g], (const int4*)buf[g], bytes / 16);
  return cudaGetLastError() == cudaSuccess ? 0 : -1;
}

/* Milliseconds of one run: GPU 0 alone, or both GPUs at once (the slower one's time). */
static float timeOnce(int kind, int both, size_t bytes) {
  int n = both ? 2 : 1;
  for (int g = 0; g < 2; g++) {
    CK(cudaSetDevice(g));
    CK(cudaDeviceSynchronize());
  }
  for (int g = 0; g < n; g++) {
    CK(cudaSetDevice(g));
    CK(cudaEventRecord(start[g], stream[g]));
    if (issue(kind, g, bytes)) return -1;
    CK(cudaEventRecord(stop[g], stream[g]));
  }
  float worst = 0;
  for (int g = 0; g < n; g++) {
    float ms = 0;
    CK(cudaSetDevice(g));
    CK(cudaEventSynchronize(stop[g]));
    CK(cudaEventElapsedTime(&ms, start[g], stop[g]));
    if (ms > worst) worst = ms;
  }
  return worst;
}

int main(void) {
  const size_t maxBytes = (size_t)1 << 30;
  int ndev = 0;
  CK(cudaGetDeviceCount(&ndev));
  if (ndev < 2) {
    fprintf(stderr, "needs 2 GPUs, found %d\n", ndev);
    return 1;
  }
  for (int g = 0; g < 2; g++) {
    CK(cudaSetDevice(g));
    CK(cudaDeviceEnablePeerAccess(1 - g, 0));
    CK(cudaMalloc((void**)&buf[g], maxBytes));
    CK(cudaMalloc((void**)&peerBuf[g], maxBytes));
    CK(cudaStreamCreateWithFlags(&stream[g], cudaStreamNonBlocking));
    CK(cudaEventCreate(&start[g]));
    CK(cudaEventCreate(&stop[g]));
  }
  for (size_t bytes = (size_t)16 << 20; bytes <= maxBytes; bytes *= 4)
    for (int kind = 0; kind < NUM_KINDS; kind++)
      for (int both = 0; both < 2; both++) {
        float best = 1e30f;
        for (int run = 0; run < 6; run++) {
          float ms = timeOnce(kind, both, bytes);
          if (ms < 0) return 1;
          if (ms < best) best = ms;
        }
        printf("%6zu MB  %-18s %-9s %7.1f GB/s each way (%.3f ms)\n", bytes >> 20, kindNames[kind],
               both ? "both ways" : "one way", bytes / best / 1e6, best);
      }
  return 0;
}
