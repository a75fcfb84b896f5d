/*
 * gcomm_kernels.cu - the GPU executor: runs the schedules of gcomm_sched.h (the same steps as the
 * host executor's runStep in gcomm.c) over the IPC FIFOs of transports/p2p.c.
 *
 * One block per queue (a collective channel, or one point-to-point channel of one direction to
 * one peer); a block runs its works in order. Each step: thread 0 waits until the step's FIFOs are
 * ready (bounded spin that watches the abort flag and a deadline), the block computes value = recv
 * (op src) or src, with Avg's division on the postOp step, and writes it to dst and the send slots
 * with 16-byte vector accesses where aligned; every thread fences its stores at system scope;
 * thread 0 then publishes the counters (release stores). Simple protocol only.
 */
#include <stdint.h>

#include "gcomm_device.h"
#include "gcomm_gpu.h" /* CUDA or HIP (gcomm_kernels.hip compiles this file with hipcc) */
#include "gcomm_reduce.h"

/* gcomm.h needs <mpi.h>, which nvcc may not find: the few values used here, as gcomm.h has them */
enum { gcommSum = 0, gcommProd = 1, gcommMax = 2, gcommMin = 3, gcommAvg = 4 };
enum { gcommInvalidUsage = 2, gcommTimeout = 7, gcommAborted = 8 };

/* ---- memory-model helpers (gcomm_gpu.h: PTX on CUDA, HIP atomics on ROCm) ---- */
#define ldAcquire gcommGpuLdAcquire
#define stRelease gcommGpuStRelease
#define globalTimer gcommGpuTimerNs

/* ---- element types and operators (gcomm_reduce.h semantics) ---- */
enum { K_INT, K_FLT, K_HALF, K_BF16 };
template <int DT>
struct Dt;
template <>
struct Dt<0> {
  typedef int8_t S;
  typedef uint8_t U;
  enum { K = K_INT };
};
template <>
struct Dt<1> {
  typedef uint8_t S;
  typedef uint8_t U;
  enum { K = K_INT };
};
template <>
struct Dt<2> {
  typedef int32_t S;
  typedef uint32_t U;
  enum { K = K_INT };
};
template <>
struct Dt<3> {
  typedef uint32_t S;
  typedef uint32_t U;
  enum { K = K_INT };
};
template <>
struct Dt<4> {
  typedef int64_t S;
  typedef uint64_t U;
  enum { K = K_INT };
};
template <>
struct Dt<5> {
  typedef uint64_t S;
  typedef uint64_t U;
  enum { K = K_INT };
};
template <>
struct Dt<6> {
  typedef uint16_t S;
  typedef uint16_t U;
  enum { K = K_HALF };
};
template <>
struct Dt<7> {
  typedef float S;
  typedef float U;
  enum { K = K_FLT };
};
template <>
struct Dt<8> {
  typedef double S;
  typedef double U;
  enum { K = K_FLT };
};
template <>
struct Dt<9> {
  typedef uint16_t S;
  typedef uint16_t U;
  enum { K = K_BF16 };
};

template <int K>
static __device__ __forceinline__ float toF(uint16_t h) {
  if constexpr (K == K_HALF)
    return gcommGpuHalfToF(h);
  else
    return gcommGpuBf16ToF(h);
}
template <int K>
static __device__ __forceinline__ uint16_t fromF(float f) {
  if constexpr (K == K_HALF)
    return gcommGpuFToHalf(f);
  else
    return gcommGpuFToBf16(f);
}

template <int DT, int OP>
static __device__ __forceinline__ typename Dt<DT>::S red(typename Dt<DT>::S A,
                                                         typename Dt<DT>::S B) {
  typedef typename Dt<DT>::S T;
  typedef typename Dt<DT>::U U;
  if constexpr (Dt<DT>::K == K_INT) {
    if constexpr (OP == gcommProd)
      return (T)((U)A * (U)B);
    else if constexpr (OP == gcommMax)
      return A > B ? A : B;
    else if constexpr (OP == gcommMin)
      return A < B ? A : B;
    else
      return (T)((U)A + (U)B);
  } else if constexpr (Dt<DT>::K == K_FLT) {
    if constexpr (OP == gcommProd)
      return A * B;
    else if constexpr (OP == gcommMax)
      return A > B ? A : B;
    else if constexpr (OP == gcommMin)
      return A < B ? A : B;
    else
      return A + B;
  } else {
    constexpr int K = Dt<DT>::K;
    if constexpr (OP == gcommProd)
      return fromF<K>(toF<K>(A) * toF<K>(B));
    else if constexpr (OP == gcommMax)
      return toF<K>(A) > toF<K>(B) ? A : B;
    else if constexpr (OP == gcommMin)
      return toF<K>(A) < toF<K>(B) ? A : B;
    else
      return fromF<K>(toF<K>(A) + toF<K>(B));
  }
}

template <int DT>
static __device__ __forceinline__ typename Dt<DT>::S divide(typename Dt<DT>::S A, int n) {
  typedef typename Dt<DT>::S T;
  if constexpr (Dt<DT>::K == K_INT)
    return (T)(A / (T)n);
  else if constexpr (Dt<DT>::K == K_FLT)
    return A / (T)n;
  else
    return fromF<Dt<DT>::K>(toF<Dt<DT>::K>(A) / (float)n);
}

/* ---- the data of one step ---- */
struct StepIo {
  const char* src;   /* local operand, or NULL */
  const char* in[2]; /* received slots (in this rank's memory), or NULL */
  char* out[3];      /* dst and send slots, NULL where absent */
  int reduce, div, nranks;
  size_t count; /* elements */
};

static __device__ __forceinline__ bool al(const void* p, uintptr_t a) {
  return ((uintptr_t)p & (a - 1)) == 0;
}

/* FIFO reads bypass L1: a slot is rewritten by the peer every GCOMM_STEPS steps. */
static __device__ __forceinline__ uint4 ldFifo(const uint4* p) {
  return gcommGpuLdFifo(p);
}

#ifndef UNROLL
#define UNROLL 4
#endif

/* Copy of nBytes from s (a FIFO slot when fifo) to every out, in words of W bytes. */
template <typename W>
static __device__ void copyWords(const char* s, bool fifo, char* const* out, size_t nWords) {
  const W* src = (const W*)s;
  W* o0 = (W*)out[0];
  W* o1 = (W*)out[1];
  W* o2 = (W*)out[2];
  size_t stride = (size_t)blockDim.x * UNROLL;
  size_t i = threadIdx.x;
  for (; i + (UNROLL - 1) * blockDim.x < nWords; i += stride) {
    W v[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; u++) {
      const W* p = src + i + u * blockDim.x;
      if constexpr (sizeof(W) == 16)
        v[u] = fifo ? ldFifo((const uint4*)p) : *p;
      else
        v[u] = fifo ? *(const volatile W*)p : *p;
    }
#pragma unroll
    for (int u = 0; u < UNROLL; u++) {
      size_t j = i + u * blockDim.x;
      if (o0) o0[j] = v[u];
      if (o1) o1[j] = v[u];
      if (o2) o2[j] = v[u];
    }
  }
  for (; i < nWords; i += blockDim.x) {
    W v;
    if constexpr (sizeof(W) == 16)
      v = fifo ? ldFifo((const uint4*)(src + i)) : src[i];
    else
      v = fifo ? *(const volatile W*)(src + i) : src[i];
    if (o0) o0[i] = v;
    if (o1) o1[i] = v;
    if (o2) o2[i] = v;
  }
}

static __device__ __noinline__ void copyStep(const StepIo& io, size_t esz) {
  const char* s = io.in[0] ? io.in[0] : io.src;
  bool fifo = io.in[0] != NULL;
  size_t n = io.count * esz;
  uintptr_t mix = (uintptr_t)s | n;
  char* out[3];
  for (int k = 0; k < 3; k++) {
    out[k] = io.out[k] == s ? NULL : io.out[k]; /* in place: nothing to copy */
    mix |= (uintptr_t)out[k];
  }
  if ((mix & 15) == 0)
    copyWords<uint4>(s, fifo, out, n / 16);
  else if ((mix & 7) == 0)
    copyWords<uint64_t>(s, fifo, out, n / 8);
  else if ((mix & 3) == 0)
    copyWords<uint32_t>(s, fifo, out, n / 4);
  else if ((mix & 1) == 0)
    copyWords<uint16_t>(s, fifo, out, n / 2);
  else
    copyWords<uint8_t>(s, fifo, out, n);
}

template <int DT, int OP>
static __device__ __forceinline__ typename Dt<DT>::S elem(const StepIo& io, size_t i) {
  typedef typename Dt<DT>::S T;
  T v;
  if (io.in[0] == NULL) {
    v = ((const T*)io.src)[i];
  } else if (!io.reduce) {
    v = ((const volatile T*)io.in[0])[i];
  } else {
    v = red<DT, OP>(((const T*)io.src)[i], ((const volatile T*)io.in[0])[i]);
    if (io.in[1]) v = red<DT, OP>(v, ((const volatile T*)io.in[1])[i]);
  }
  if (io.div) v = divide<DT>(v, io.nranks);
  return v;
}

template <int DT, int OP>
static __device__ __noinline__ void reduceStep(const StepIo& io) {
  typedef typename Dt<DT>::S T;
  constexpr int N = 16 / sizeof(T);
  union Pack {
    uint4 v;
    T e[N];
  };
  size_t count = io.count, nPack = 0;
  bool aligned = al(io.src, 16) && al(io.in[0], 16) && al(io.in[1], 16) && al(io.out[0], 16) &&
                 al(io.out[1], 16) && al(io.out[2], 16);
  if (aligned && !io.div) { /* Avg's final division takes the scalar loop: less code */
    nPack = count / N;
    const uint4* s = (const uint4*)io.src;
    const uint4* a = (const uint4*)io.in[0];
    const uint4* b = (const uint4*)io.in[1];
    uint4* o0 = (uint4*)io.out[0];
    uint4* o1 = (uint4*)io.out[1];
    uint4* o2 = (uint4*)io.out[2];
    size_t stride = (size_t)blockDim.x * UNROLL, i = threadIdx.x;
    for (; i < nPack; i += stride) {
      Pack v[UNROLL];
#pragma unroll
      for (int u = 0; u < UNROLL; u++) {
        size_t j = i + u * blockDim.x;
        if (j >= nPack) break;
        if (a == NULL) {
          v[u].v = s[j];
        } else if (!io.reduce) {
          v[u].v = ldFifo(a + j);
        } else {
          Pack x, y;
          x.v = s[j];
          y.v = ldFifo(a + j);
#pragma unroll
          for (int e = 0; e < N; e++) v[u].e[e] = red<DT, OP>(x.e[e], y.e[e]);
          if (b) {
            y.v = ldFifo(b + j);
#pragma unroll
            for (int e = 0; e < N; e++) v[u].e[e] = red<DT, OP>(v[u].e[e], y.e[e]);
          }
        }
      }
#pragma unroll
      for (int u = 0; u < UNROLL; u++) {
        size_t j = i + u * blockDim.x;
        if (j >= nPack) break;
        if (o0) o0[j] = v[u].v;
        if (o1) o1[j] = v[u].v;
        if (o2) o2[j] = v[u].v;
      }
    }
  }
  for (size_t i = nPack * N + threadIdx.x; i < count; i += blockDim.x) {
    T v = elem<DT, OP>(io, i);
    for (int k = 0; k < 3; k++)
      if (io.out[k]) ((T*)io.out[k])[i] = v;
  }
}

template <int DT>
static __device__ void reduceStepT(const StepIo& io, int op) {
  switch (op) {
    case gcommProd:
      reduceStep<DT, gcommProd>(io);
      break;
    case gcommMax:
      reduceStep<DT, gcommMax>(io);
      break;
    case gcommMin:
      reduceStep<DT, gcommMin>(io);
      break;
    default:
      reduceStep<DT, gcommSum>(io);
      break; /* Sum, Avg */
  }
}

static __device__ void dataStep(const StepIo& io, int datatype, int op) {
  if (!io.reduce && !io.div) {
    copyStep(io, gcommTypeSize(datatype));
    return;
  }
  switch (datatype) {
    case 0:
      reduceStepT<0>(io, op);
      break;
    case 1:
      reduceStepT<1>(io, op);
      break;
    case 2:
      reduceStepT<2>(io, op);
      break;
    case 3:
      reduceStepT<3>(io, op);
      break;
    case 4:
      reduceStepT<4>(io, op);
      break;
    case 5:
      reduceStepT<5>(io, op);
      break;
    case 6:
      reduceStepT<6>(io, op);
      break;
    case 7:
      reduceStepT<7>(io, op);
      break;
    case 8:
      reduceStepT<8>(io, op);
      break;
    default:
      reduceStepT<9>(io, op);
      break;
  }
}

/* ---- waiting, with the abort flag and a deadline ---- */
static __device__ int waitFor(const gcommDevComm_t* comm, volatile uint64_t* p, uint64_t target,
                              uint64_t* t0) {
  unsigned spins = 0;
  while (ldAcquire(p) < target) {
    if (++spins < 512) continue;
    spins = 0;
    if (*comm->abortFlag) return gcommAborted;
    uint64_t now = globalTimer();
    if (*t0 == 0)
      *t0 = now;
    else if (now - *t0 > comm->timeoutNs)
      return gcommTimeout;
  }
  return 0;
}

static __device__ void recordError(gcommDevComm_t* gcomm, const gcommDevComm_t* comm, int code,
                                   int peer, int lane, int isRecv, int func, long step,
                                   unsigned long long got, unsigned long long expected) {
  gcommDevError_t* e = comm->error;
  if (atomicCAS(&gcomm->claim, 0, 1) != 0) return; /* someone else reports */
  e->peer = peer;
  e->lane = lane;
  e->isRecv = isRecv;
  e->func = func;
  e->step = step;
  e->got = got;
  e->expected = expected;
  __threadfence_system();
  e->code = code;
  __threadfence_system();
}

template <int W>
struct KArgs {
  gcommDevComm_t* comm;
  int nBlocks, nWorks;
  uint16_t first[W + 1];
  gcommDevWork_t works[W];
};

template <int W>
__global__ void __launch_bounds__(GCOMM_DEV_THREADS)
    gcommKernel(const __grid_constant__ KArgs<W> a) {
  __shared__ gcommDevComm_t comm;
  __shared__ const char* shIn[2];
  __shared__ char* shOut[2];
  __shared__ int shFail;
  const int tid = threadIdx.x;
  if (tid == 0) {
    comm = *a.comm;
    shFail = 0;
  }
  __syncthreads();
  const int n = comm.nranks;
  for (int wi = a.first[blockIdx.x]; wi < a.first[blockIdx.x + 1]; wi++) {
    const gcommDevWork_t& w = a.works[wi];
    const size_t esz = gcommTypeSize(w.datatype);
    const gcommSched_t sched = w.sched;
    for (long s = 0; s < w.nSteps; s++) {
      gcommStep_t st;
      gcommSchedGetStep(&sched, s, &st);
      size_t bytes = st.count * esz;
      if (tid == 0) {
        uint64_t t0 = 0;
        int err = 0;
        for (int k = 0; k < 2 && !err; k++) {
          shIn[k] = NULL;
          shOut[k] = NULL;
          int p = st.recvPeer[k];
          if (p >= 0) {
            gcommDevConn_t c = comm.recv[w.lane * n + p];
            uint64_t step = *c.step;
            err = waitFor(&comm, c.tail, step + 1, &t0);
            if (err) {
              recordError(a.comm, &comm, err, p, w.lane, 1, sched.func, s, 0, 0);
              break;
            }
            uint64_t got = c.bytes[step % GCOMM_STEPS];
            if (got != GCOMM_SLOT_WORD(w.tag, bytes)) { /* a different call (or count) */
              err = gcommInvalidUsage;
              recordError(a.comm, &comm, err, p, w.lane, 1, sched.func, s, got,
                          GCOMM_SLOT_WORD(w.tag, bytes));
              break;
            }
            shIn[k] = c.slots + (step % GCOMM_STEPS) * comm.slotBytes;
          }
        }
        for (int k = 0; k < 2 && !err; k++) {
          int p = st.sendPeer[k];
          if (p >= 0) {
            gcommDevConn_t c = comm.send[w.lane * n + p];
            uint64_t step = *c.step;
            if (step >= GCOMM_STEPS) err = waitFor(&comm, c.head, step + 1 - GCOMM_STEPS, &t0);
            if (err) {
              recordError(a.comm, &comm, err, p, w.lane, 0, sched.func, s, 0, 0);
              break;
            }
            shOut[k] = c.slots + (step % GCOMM_STEPS) * comm.slotBytes;
          }
        }
        shFail = err;
      }
      __syncthreads();
      if (shFail) return;
      StepIo io;
      const char* in = st.src == GCOMM_BUF_IN    ? (const char*)w.sendbuff
                       : st.src == GCOMM_BUF_OUT ? (const char*)w.recvbuff
                                                 : NULL;
      char* out = st.dst == GCOMM_BUF_OUT ? (char*)w.recvbuff : NULL;
      io.src = in ? in + st.srcOff * esz : NULL;
      io.in[0] = shIn[0];
      io.in[1] = shIn[1];
      io.out[0] = out ? out + st.dstOff * esz : NULL;
      io.out[1] = shOut[0];
      io.out[2] = shOut[1];
      io.reduce = st.reduce && io.in[0] != NULL;
      io.div = st.postOp && w.redop == gcommAvg;
      io.nranks = n;
      io.count = st.count;
      if (bytes > 0) dataStep(io, w.datatype, w.redop);
      if (shOut[0]) __threadfence_system(); /* this thread's slot stores before the tail */
      __syncthreads();
      if (tid == 0) {
        for (int k = 0; k < 2; k++) {
          if (st.sendPeer[k] >= 0) {
            gcommDevConn_t c = comm.send[w.lane * n + st.sendPeer[k]];
            uint64_t step = *c.step;
            c.bytes[step % GCOMM_STEPS] = GCOMM_SLOT_WORD(w.tag, bytes);
            stRelease(c.tail, step + 1);
            *c.step = step + 1;
          }
          if (st.recvPeer[k] >= 0) {
            gcommDevConn_t c = comm.recv[w.lane * n + st.recvPeer[k]];
            uint64_t step = *c.step;
            stRelease(c.head, step + 1);
            *c.step = step + 1;
          }
        }
      }
      /* shIn/shOut are rewritten by thread 0 only after the next step's first barrier... which
       * every thread reaches only after reading them here: safe. */
    }
  }
}

template <int W>
static int launch(const gcommDevLaunch_t* src, void* stream) {
  KArgs<W> k;
  k.comm = src->comm;
  k.nBlocks = src->nBlocks;
  k.nWorks = src->nWorks;
  for (int i = 0; i <= src->nBlocks; i++) k.first[i] = src->first[i];
  for (int i = 0; i < src->nWorks; i++) k.works[i] = src->works[i];
  gcommKernel<W><<<src->nBlocks, GCOMM_DEV_THREADS, 0, (cudaStream_t)stream>>>(k);
  return (int)cudaGetLastError();
}

extern "C" int gcommKernelLaunch(const gcommDevLaunch_t* args, void* stream) {
  if (args->nWorks <= GCOMM_DEV_SMALL_WORKS) return launch<GCOMM_DEV_SMALL_WORKS>(args, stream);
  return launch<GCOMM_DEV_MAX_WORKS>(args, stream);
}
