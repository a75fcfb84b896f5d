/*
 * heat2d.h - the GPU half of examples/heat2d.c (examples/heat2d_gpu.cu, a CUDA build): memory,
 * the column packing and the Jacobi sweep on a stream. Plain C types only, so that nvcc needs
 * neither MPI's nor gcomm's headers. Without CUDA the functions stop the program.
 */
#ifndef HEAT2D_H
#define HEAT2D_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#ifdef GCOMM_CUDA
int heatGpuCount(void);            /* GPUs this process sees (0 when none or no driver) */
void heatGpuSelect(int localRank); /* a GPU per rank of the node, round robin */
int heatGpuDevice(void);
double* heatGpuAlloc(size_t count); /* zeroed */
void heatGpuFree(double* p);
void heatGpuCopy(double* dst, const double* src, size_t count); /* any direction; waits */
void* heatGpuStreamCreate(void);
void heatGpuStreamDestroy(void* stream);
void heatGpuSync(void* stream);
/* The west and east columns of the (nx+2) x (ny+2) field u into sendW and sendE (ny each). */
void heatGpuPack(void* stream, const double* u, int nx, int ny, double* sendW, double* sendE);
/* Unpacks the received columns (recvW/recvE, NULL where there is no neighbour) into u, then one
 * Jacobi sweep from u into v; *result (GPU memory) = the sum of squared changes, summed in a fixed
 * order. */
void heatGpuSweep(void* stream, double* u, double* v, int nx, int ny, const double* recvW,
                  const double* recvE, double* result);
#else
#include <stdio.h>
#include <stdlib.h>
static inline void heatNoGpu(void) {
  fprintf(stderr, "heat2d: --gpu needs a CUDA build (make CUDA=1)\n");
  exit(2);
}
static inline int heatGpuCount(void) {
  return 0;
}
static inline void heatGpuSelect(int localRank) {
  (void)localRank;
  heatNoGpu();
}
static inline int heatGpuDevice(void) {
  heatNoGpu();
  return -1;
}
static inline double* heatGpuAlloc(size_t count) {
  (void)count;
  heatNoGpu();
  return NULL;
}
static inline void heatGpuFree(double* p) {
  (void)p;
}
static inline void heatGpuCopy(double* dst, const double* src, size_t count) {
  (void)dst, (void)src, (void)count;
}
static inline void* heatGpuStreamCreate(void) {
  return NULL;
}
static inline void heatGpuStreamDestroy(void* stream) {
  (void)stream;
}
static inline void heatGpuSync(void* stream) {
  (void)stream;
}
static inline void heatGpuPack(void* stream, const double* u, int nx, int ny, double* sendW,
                               double* sendE) {
  (void)stream, (void)u, (void)nx, (void)ny, (void)sendW, (void)sendE;
}
static inline void heatGpuSweep(void* stream, double* u, double* v, int nx, int ny,
                                const double* recvW, const double* recvE, double* result) {
  (void)stream, (void)u, (void)v, (void)nx, (void)ny, (void)recvW, (void)recvE, (void)result;
}
#endif

#ifdef __cplusplus
}
#endif
#endif /* HEAT2D_H */
