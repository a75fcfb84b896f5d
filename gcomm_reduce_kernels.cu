/*
 * gcomm_reduce_kernels.cu - the short kernels of ranks that share a GPU without MPS
 * (gcomm_gpu_shared.c): an elementwise reduction of inputs that have all landed in GPU memory,
 * PreMulSum's scaling of a rank's input, and a strided copy (GCOMM_SHARED_GPU_COPY=sm). Neither
 * waits for another rank, so a time-sliced GPU runs each to its end within one slice. The element
 * operators are gcomm_reduce.h's, as in the main kernels, so every path gives the same bits.
 *
 * CUDA only: the HIP build has no such path (gcomm_gpu_shared.c is not compiled there, and
 * GCOMM_SHARED_GPU=copy falls back to the kernels with a warning).
 */
#ifdef __HIPCC__
#error "gcomm_reduce_kernels.cu is CUDA only: the HIP build runs ranks sharing a GPU on its kernels"
#endif
#include <stdint.h>

#include "gcomm_device.h"
#include "gcomm_gpu.h"
#include "gcomm_reduce.h"
#include "gcomm_types.h"

#define THREADS 512

/* Enough blocks for every element, at most a few waves: a grid-stride loop does the rest. */
static unsigned gridFor(size_t count) {
  size_t blocks = (count + THREADS - 1) / THREADS;
  return (unsigned)(blocks < 1 ? 1 : blocks > 1024 ? 1024 : blocks);
}

template <int TYPE>
__global__ void __launch_bounds__(THREADS) reduceKernel(gcommReduceArgs_t a) {
  typedef typename gcommElem<TYPE>::T T;
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < a.count; i += stride) {
    T v = ((const T*)a.in[0])[i];
    for (int k = 1; k < a.nIn; k++) v = gcommElem<TYPE>::reduce(a.redop, v, ((const T*)a.in[k])[i]);
    if (a.divide) v = gcommElem<TYPE>::divide(v, a.divide);
    for (int k = 0; k < a.nOut; k++) ((T*)a.out[k])[i] = v;
  }
}

template <int TYPE>
__global__ void __launch_bounds__(THREADS)
    preMulKernel(void* dst, size_t dstPitch, const void* src, size_t srcPitch, size_t count,
                 size_t rows, uint64_t scalar, const void* scalarPtr) {
  typedef typename gcommElem<TYPE>::T T;
  T s;
  if (scalarPtr != NULL)
    s = *(const T*)scalarPtr;
  else
    memcpy(&s, &scalar, sizeof(T));
  size_t stride = (size_t)gridDim.x * blockDim.x, total = count * rows;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
    size_t r = i / count, c = i % count;
    ((T*)dst)[r * dstPitch + c] = gcommElem<TYPE>::preMul(((const T*)src)[r * srcPitch + c], s);
  }
}

/* W: uint4 when every address and length is 16-byte aligned, else char. */
template <typename W>
__global__ void __launch_bounds__(THREADS) copyKernel(char* dst, size_t dstPitch, const char* src,
                                                      size_t srcPitch, size_t words, size_t rows) {
  size_t stride = (size_t)gridDim.x * blockDim.x, total = words * rows;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
    size_t r = i / words, c = i % words;
    ((W*)(dst + r * dstPitch))[c] = ((const W*)(src + r * srcPitch))[c];
  }
}

extern "C" int gcommCopyLaunch(void* dst, size_t dstPitch, const void* src, size_t srcPitch,
                               size_t bytes, size_t rows, void* stream) {
  cudaStream_t s = (cudaStream_t)stream;
  if ((((uintptr_t)dst | (uintptr_t)src | dstPitch | srcPitch | bytes) & 15) == 0)
    copyKernel<uint4><<<gridFor(bytes / 16 * rows), THREADS, 0, s>>>(
        (char*)dst, dstPitch, (const char*)src, srcPitch, bytes / 16, rows);
  else
    copyKernel<char><<<gridFor(bytes * rows), THREADS, 0, s>>>(
        (char*)dst, dstPitch, (const char*)src, srcPitch, bytes, rows);
  return (int)cudaGetLastError();
}

/* Launches for datatype (gcommByDatatype); then the launch's error. */
template <typename F>
static int byDatatype(int datatype, F launch) {
  if (!gcommByDatatype(datatype, launch)) return (int)cudaErrorInvalidValue;
  return (int)cudaGetLastError();
}

extern "C" int gcommReduceLaunch(const gcommReduceArgs_t* a, void* stream) {
  return byDatatype(a->datatype, [&](auto dt) {
    reduceKernel<decltype(dt)::value><<<gridFor(a->count), THREADS, 0, (cudaStream_t)stream>>>(*a);
  });
}

extern "C" int gcommPreMulLaunch(void* dst, size_t dstPitch, const void* src, size_t srcPitch,
                                 size_t count, size_t rows, int datatype, uint64_t scalar,
                                 const void* scalarPtr, void* stream) {
  return byDatatype(datatype, [&](auto dt) {
    preMulKernel<decltype(dt)::value><<<gridFor(count * rows), THREADS, 0, (cudaStream_t)stream>>>(
        dst, dstPitch, src, srcPitch, count, rows, scalar, scalarPtr);
  });
}
