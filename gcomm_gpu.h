/*
 * gcomm_gpu.h - the thin portability layer between CUDA and HIP (ROCm).
 *
 * One source serves both: gcomm_kernels.cu (nvcc) and gcomm_kernels.hip (hipcc: a few lines that
 * include this header and gcomm_kernels.cu), transports/p2p.c (the C compiler, with GCOMM_CUDA or
 * GCOMM_HIP). Under HIP the cuda* runtime names used by gcomm map to their hip* twins here; what
 * has no twin (the memory-model primitives, the global timer, FIFO loads, the fine-grained FIFO
 * allocation, the pointer-type field) is a gcommGpu* name with one definition per platform.
 *
 * Nothing in the kernels assumes a warp of 32 lanes (no shuffles, votes or lane masks): a block
 * of GCOMM_DEV_THREADS works alike in waves of 64.
 */
#ifndef GCOMM_GPU_H
#define GCOMM_GPU_H

#include <stdint.h>

#if defined(GCOMM_HIP) || defined(__HIPCC__)
#ifndef __HIP_PLATFORM_AMD__
#define __HIP_PLATFORM_AMD__
#endif
#ifndef GCOMM_HIP
#define GCOMM_HIP 1
#endif
#endif

#ifdef GCOMM_HIP
/* ======================================== HIP ======================================== */
#if defined(__HIPCC__)
#include <hip/hip_fp16.h>
#include <hip/hip_runtime.h>
#else
#include <hip/hip_runtime_api.h>
#endif

#define cudaError_t hipError_t
#define cudaSuccess hipSuccess
#define cudaErrorNotReady hipErrorNotReady
#define cudaErrorInvalidValue hipErrorInvalidValue
#define cudaStream_t hipStream_t
#define cudaGetErrorName hipGetErrorName
#define cudaGetErrorString hipGetErrorString
#define cudaGetLastError hipGetLastError
#define cudaGetDeviceCount hipGetDeviceCount
#define cudaGetDevice hipGetDevice
#define cudaSetDevice hipSetDevice
#define cudaDeviceSynchronize hipDeviceSynchronize
#define cudaDeviceCanAccessPeer hipDeviceCanAccessPeer
#define cudaDeviceGetAttribute hipDeviceGetAttribute
#define cudaDevAttrMultiProcessorCount hipDeviceAttributeMultiprocessorCount
#define cudaDevAttrComputeCapabilityMajor hipDeviceAttributeComputeCapabilityMajor
#define cudaDevAttrPciDomainId hipDeviceAttributePciDomainID
#define cudaDevAttrPciBusId hipDeviceAttributePciBusId
#define cudaDevAttrPciDeviceId hipDeviceAttributePciDeviceId
#define cudaMalloc hipMalloc
#define cudaFree hipFree
#define cudaMemset hipMemset
#define cudaMemcpy hipMemcpy
#define cudaMemcpyHostToDevice hipMemcpyHostToDevice
#define cudaMemcpyAsync hipMemcpyAsync
#define cudaMemcpyDefault hipMemcpyDefault
/* polled by the kernels: mapped and coherent (hipHostMalloc's default may be non-coherent) */
#define cudaHostAlloc hipHostMalloc
#define cudaHostAllocMapped (hipHostMallocMapped | hipHostMallocCoherent)
#define cudaHostGetDevicePointer hipHostGetDevicePointer
#define cudaFreeHost hipHostFree
/* a staged FIFO region: shm registered in every process that maps it (transports/p2p.c) */
#define cudaHostRegister hipHostRegister
#define cudaHostRegisterMapped hipHostRegisterMapped
#define cudaHostRegisterPortable hipHostRegisterPortable
#define cudaHostUnregister hipHostUnregister
#define cudaIpcMemHandle_t hipIpcMemHandle_t
#define cudaIpcGetMemHandle hipIpcGetMemHandle
#define cudaIpcOpenMemHandle hipIpcOpenMemHandle
#define cudaIpcCloseMemHandle hipIpcCloseMemHandle
#define cudaIpcMemLazyEnablePeerAccess hipIpcMemLazyEnablePeerAccess
#define cudaStreamQuery hipStreamQuery
#define cudaFuncAttributes hipFuncAttributes
#define cudaFuncGetAttributes hipFuncGetAttributes
/* destroy's wait: an event after each stream's latest launch, none while capturing */
#define cudaEvent_t hipEvent_t
#define cudaEventCreateWithFlags hipEventCreateWithFlags
#define cudaEventDisableTiming hipEventDisableTiming
#define cudaEventRecord hipEventRecord
#define cudaEventQuery hipEventQuery
#define cudaEventDestroy hipEventDestroy
#define cudaStreamIsCapturing hipStreamIsCapturing
#define cudaStreamCaptureStatus hipStreamCaptureStatus /* an enum tag too */
#define cudaStreamCaptureStatusNone hipStreamCaptureStatusNone
#define cudaStreamCaptureMode hipStreamCaptureMode /* an enum tag too */
#define cudaStreamCaptureModeRelaxed hipStreamCaptureModeRelaxed
#define cudaThreadExchangeStreamCaptureMode hipThreadExchangeStreamCaptureMode
/* the profiler's clock calibration (transports/p2p.c) */
#define cudaStreamCreateWithFlags hipStreamCreateWithFlags
#define cudaStreamNonBlocking hipStreamNonBlocking
#define cudaStreamSynchronize hipStreamSynchronize
#define cudaStreamDestroy hipStreamDestroy
#define cudaPointerAttributes hipPointerAttribute_t /* a struct tag too */
#define cudaPointerGetAttributes hipPointerGetAttributes

/* The FIFO region, polled across GPUs while kernels run: coarse-grained memory (hipMalloc) is
 * only coherent at kernel boundaries, so fine-grained (uncached where the runtime has it). */
#ifdef hipDeviceMallocUncached
#define gcommGpuMallocFifo(p, n) hipExtMallocWithFlags((p), (n), hipDeviceMallocUncached)
#else
#define gcommGpuMallocFifo(p, n) hipExtMallocWithFlags((p), (n), hipDeviceMallocFinegrained)
#endif

/* Plain host memory: HIP 5.x fails hipPointerGetAttributes (caught by the caller); HIP 6 has
 * the CUDA-like .type and hipMemoryTypeUnregistered. */
#if HIP_VERSION_MAJOR >= 6
#define gcommGpuPtrUnregistered(at) ((at).type == hipMemoryTypeUnregistered)
#define gcommGpuPtrDevice(at) ((at).type == hipMemoryTypeDevice)
#else
#define gcommGpuPtrUnregistered(at) ((void)(at), 0)
#define gcommGpuPtrDevice(at) ((at).memoryType == hipMemoryTypeDevice)
#endif

#if defined(__HIPCC__)

#define __grid_constant__ /* HIP: kernel arguments are constant already */

/* s_memrealtime counts at a constant rate: 100 MHz on gfx90a (MI200) and gfx94x (MI300).
 * HIP 5.2 cannot query it (hipDeviceAttributeWallClockRate came later): -D to change. */
#ifndef GCOMM_HIP_WALLCLOCK_HZ
#define GCOMM_HIP_WALLCLOCK_HZ 100000000ull
#endif

static __device__ __forceinline__ uint64_t gcommGpuLdAcquire(volatile uint64_t* p) {
  return __hip_atomic_load((uint64_t*)p, __ATOMIC_ACQUIRE, __HIP_MEMORY_SCOPE_SYSTEM);
}
static __device__ __forceinline__ void gcommGpuStRelease(volatile uint64_t* p, uint64_t v) {
  __hip_atomic_store((uint64_t*)p, v, __ATOMIC_RELEASE, __HIP_MEMORY_SCOPE_SYSTEM);
}
static __device__ __forceinline__ uint64_t gcommGpuTimerNs() {
#ifdef __HIP_DEVICE_COMPILE__ /* wall_clock64() is declared for the device pass only */
  return (uint64_t)wall_clock64() * (1000000000ull / GCOMM_HIP_WALLCLOCK_HZ);
#else
  return 0;
#endif
}
/* A FIFO slot is rewritten by the peer: load around the (non-coherent) L1. System-scope relaxed
 * atomic loads do that on gfx90a/gfx94x (glc / sc bits), two 8-byte halves. */
static __device__ __forceinline__ uint4 gcommGpuLdFifo(const uint4* p) {
  uint64_t* q = (uint64_t*)p;
  uint64_t lo = __hip_atomic_load(q, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
  uint64_t hi = __hip_atomic_load(q + 1, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
  uint4 v;
  v.x = (unsigned)lo;
  v.y = (unsigned)(lo >> 32);
  v.z = (unsigned)hi;
  v.w = (unsigned)(hi >> 32);
  return v;
}
/* LL lines: each 8-byte half {data, flag} is one single-copy-atomic access, so a half is either
 * old or new as a whole; the reader checks both flags. */
static __device__ __forceinline__ uint4 gcommGpuLlLoad(const uint4* p) {
  return gcommGpuLdFifo(p);
}
static __device__ __forceinline__ void gcommGpuLlStore(uint4* p, uint4 v) {
  uint64_t* q = (uint64_t*)p;
  __hip_atomic_store(q, v.x | (uint64_t)v.y << 32, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
  __hip_atomic_store(q + 1, v.z | (uint64_t)v.w << 32, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
}
static __device__ __forceinline__ float gcommGpuHalfToF(uint16_t h) {
  return __half2float(__ushort_as_half(h));
}
static __device__ __forceinline__ uint16_t gcommGpuFToHalf(float f) {
  return __half_as_ushort(__float2half_rn(f));
}
/* no programmatic dependent launch on ROCm: launches never overlap */
static __device__ __forceinline__ void gcommGpuGridWait() {}
static __device__ __forceinline__ void gcommGpuLaunchDependents() {}
/* The GPU's conversions gcomm_reduce.h uses: Float16's. HIP 5.2 has no __hip_bfloat16
 * intrinsics and ROCm no fp8 ones for gfx90a: Bfloat16 and fp8 take gcomm_reduce.h's own. */
#define GCOMM_GPU_HALF 1
#endif /* __HIPCC__ */

#else
/* ======================================== CUDA ======================================== */
#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#else
#include <cuda_runtime_api.h>
#endif

#define gcommGpuMallocFifo(p, n) cudaMalloc((p), (n))
#define gcommGpuPtrUnregistered(at) ((at).type == cudaMemoryTypeUnregistered)
#define gcommGpuPtrDevice(at) ((at).type == cudaMemoryTypeDevice)

#if defined(__CUDACC__)
static __device__ __forceinline__ uint64_t gcommGpuLdAcquire(volatile uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
static __device__ __forceinline__ void gcommGpuStRelease(volatile uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
static __device__ __forceinline__ uint64_t gcommGpuTimerNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
/* A FIFO slot is rewritten by the peer (through NVLink into this GPU's L2): skip L1, which is
 * not coherent, but keep L2 (ld.global.cg), which is. */
static __device__ __forceinline__ uint4 gcommGpuLdFifo(const uint4* p) {
  return __ldcg(p);
}
/* LL lines: one 16-byte volatile access (each 8-byte half carries its own flag, so even a torn
 * line is detected by the reader). */
static __device__ __forceinline__ uint4 gcommGpuLlLoad(const uint4* p) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}
static __device__ __forceinline__ void gcommGpuLlStore(uint4* p, uint4 v) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(p), "r"(v.x), "r"(v.y),
               "r"(v.z), "r"(v.w)
               : "memory");
}
/* Programmatic dependent launch (sm_90): gridWait returns once the grid before this one on the
 * stream has finished and its memory is visible (at once when this launch did not ask to overlap
 * it); launchDependents lets the next launch, if it asked to, start its own prologue now. */
static __device__ __forceinline__ void gcommGpuGridWait() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
static __device__ __forceinline__ void gcommGpuLaunchDependents() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
/* The GPU's conversions gcomm_reduce.h uses (the same bits as its own): Float16's, Bfloat16's,
 * and fp8's below. */
#define GCOMM_GPU_HALF 1
#define GCOMM_GPU_BF16 1
static __device__ __forceinline__ float gcommGpuHalfToF(uint16_t h) {
  return __half2float(__ushort_as_half(h));
}
static __device__ __forceinline__ uint16_t gcommGpuFToHalf(float f) {
  return __half_as_ushort(__float2half_rn(f));
}
static __device__ __forceinline__ float gcommGpuBf16ToF(uint16_t h) {
  return __bfloat162float(__ushort_as_bfloat16(h));
}
static __device__ __forceinline__ uint16_t gcommGpuFToBf16(float f) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}
/* fp8: the GPU's conversions from sm_89; cuda_fp8.h's host emulation of them gives the same bits
 * as gcomm_reduce.h's for every float and every fp8 value. Older GPUs take gcomm_reduce.h's. */
#if __CUDA_ARCH__ >= 890
#define GCOMM_GPU_FP8 1
static __device__ __forceinline__ float gcommGpuFp8ToF(uint8_t x, int e5m2) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(x, e5m2 ? __NV_E5M2 : __NV_E4M3)));
}
static __device__ __forceinline__ uint8_t gcommGpuFToFp8(float f, int e5m2) {
  return __nv_cvt_float_to_fp8(f, __NV_SATFINITE, e5m2 ? __NV_E5M2 : __NV_E4M3);
}
#endif
#endif /* __CUDACC__ */
#endif /* GCOMM_HIP */

#endif /* GCOMM_GPU_H */
