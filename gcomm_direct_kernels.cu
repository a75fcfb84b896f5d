/*
 * gcomm_direct_kernels.cu - the kernel of collectives captured into a CUDA graph over buffers that
 * every local rank has mapped (gcomm_gpu_direct.c): the data goes straight from the ranks' input
 * buffers into their output buffers, with no FIFO between them.
 *
 * Block b of each rank first meets block b of every other rank: it writes the meeting's number
 * into a word of each peer's mailbox (its own word there, which no one else writes) and waits
 * until every peer's word in its own mailbox has reached it. A block starts only once the work
 * before it on its stream has ended, so past the first meeting every peer's input is ready and
 * its output free to be written. The block then computes its share of
 *     out[k][i] = in[0][i] op in[1][i] op ... op in[nIn - 1][i]   for every output k
 * and meets the peers again (its stores released at system scope first), so that no rank's stream
 * goes on while a peer still reads its input or writes its output. A launch captured right after
 * the communicator's previous one, with nothing between them on any rank, skips its first meeting:
 * the previous launch's last one already ordered every access of that call before any rank's next
 * kernel, and no other work touched the buffers since. Each wait has the
 * communicator's deadline and abort flag, and names the peer that did not come.
 *
 * What each rank computes is planned on the host: an all-reduce is a two-shot, rank r reducing
 * part r of every input into part r of every output; a reduce-scatter reduces its block of every
 * input; an all-gather writes its input into every output; a broadcast reads the root's input; a
 * reduce's root reads every input. An all-to-all, gather or scatter copies pairs instead, each
 * input into its output: an all-to-all's blocks into the peers' outputs, a gather's input into the
 * root's output, a scatter's block of the root's input into its own. One thread reads all inputs
 * of an element before it writes it, and only one rank touches an element, so in-place calls need
 * nothing more (an all-to-all in place, where a rank's block is both read and overwritten by
 * others, never comes here).
 *
 * CUDA only, as gcomm_gpu_direct.c.
 */
#ifdef __HIPCC__
#error \
    "gcomm_direct_kernels.cu is CUDA only: the HIP build runs graph-captured calls on its kernels"
#endif
#include <stdint.h>

#include "gcomm_device.h"
#include "gcomm_gpu.h"
#include "gcomm_reduce.h"
#include "gcomm_types.h"

#define THREADS 512
#define UNROLL 4 /* packs a thread loads from every input before it combines them */

/* ---- meeting the other ranks ---- */

static __device__ void recordMeetError(const gcommDirectArgs_t& a, int code, int peer, uint64_t got,
                                       uint64_t expected) {
  gcommDevComm_t* c = a.comm;
  gcommDevError_t* e = c->error;
  if (atomicCAS(&c->claim, 0, 1) != 0) return; /* someone else reports */
  e->peer = peer;
  e->lane = (int)blockIdx.x;
  e->isRecv = GCOMM_DEV_WAIT_MEET;
  e->func = a.func;
  e->step = (long)expected;
  e->got = got;
  e->expected = expected;
  __threadfence_system();
  e->code = code;
  __threadfence_system();
}

/* Thread p (p a peer) tells peer p that this block has reached meeting `value`, then waits for
 * peer p's word to reach it. Returns 0, or the failure this block saw (every thread). */
static __device__ int meet(const gcommDirectArgs_t& a, uint64_t value, int* failed) {
  int p = (int)threadIdx.x;
  if (p < a.nranks && p != a.rank) {
    size_t slot = (size_t)a.rank * GCOMM_DIRECT_BLOCKS + blockIdx.x;
    gcommGpuStRelease(a.mailbox[p] + slot, value);
    volatile uint64_t* mine = a.mailbox[a.rank] + (size_t)p * GCOMM_DIRECT_BLOCKS + blockIdx.x;
    uint64_t got, t0 = 0;
    unsigned spins = 0;
    while ((got = gcommGpuLdAcquire(mine)) < value) {
      if (++spins < 512) continue;
      spins = 0;
      int code = *a.comm->abortFlag ? gcommAborted : 0;
      uint64_t now = gcommGpuTimerNs();
      if (t0 == 0) t0 = now;
      if (code == 0 && now - t0 > a.comm->timeoutNs) code = gcommTimeout;
      if (code != 0) {
        recordMeetError(a, code, p, got, value);
        *failed = 1;
        break;
      }
    }
  }
  __syncthreads();
  return *failed;
}

/* ---- the data: out[k] = in[0] op ... op in[nIn - 1], a block's share ---- */

struct Share {
  const void* const* in;
  void* const* out;
  size_t count;
  int nIn, nOut, divide;
};

template <int TYPE, int OP>
static __device__ __forceinline__ typename gcommElem<TYPE>::T combine(const Share& s, size_t i) {
  typedef typename gcommElem<TYPE>::T T;
  T v = __ldcg((const T*)s.in[0] + i);
  for (int k = 1; k < s.nIn; k++) v = gcommElem<TYPE>::reduce(OP, v, __ldcg((const T*)s.in[k] + i));
  return s.divide ? gcommElem<TYPE>::divide(v, s.divide) : v;
}

/* 16-byte packs, UNROLL a thread loaded from every input before any is combined; the block's
 * packs are [lo, hi). */
template <int TYPE, int OP>
static __device__ void combinePacks(const Share& s, size_t lo, size_t hi) {
  typedef typename gcommElem<TYPE>::T T;
  constexpr int N = 16 / sizeof(T);
  union Pack {
    uint4 v;
    T e[N];
  };
  for (size_t i = lo + threadIdx.x; i < hi; i += (size_t)THREADS * UNROLL) {
    Pack acc[UNROLL], x[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; u++)
      if (i + u * THREADS < hi) acc[u].v = __ldcg((const uint4*)s.in[0] + i + u * THREADS);
    for (int k = 1; k < s.nIn; k++) {
#pragma unroll
      for (int u = 0; u < UNROLL; u++)
        if (i + u * THREADS < hi) x[u].v = __ldcg((const uint4*)s.in[k] + i + u * THREADS);
#pragma unroll
      for (int u = 0; u < UNROLL; u++)
#pragma unroll
        for (int e = 0; e < N; e++)
          acc[u].e[e] = gcommElem<TYPE>::reduce(OP, acc[u].e[e], x[u].e[e]);
    }
#pragma unroll
    for (int u = 0; u < UNROLL; u++) {
      if (i + u * THREADS >= hi) continue;
      if (s.divide)
#pragma unroll
        for (int e = 0; e < N; e++) acc[u].e[e] = gcommElem<TYPE>::divide(acc[u].e[e], s.divide);
      for (int k = 0; k < s.nOut; k++) ((uint4*)s.out[k])[i + u * THREADS] = acc[u].v;
    }
  }
}

/* The block's share: the packs in contiguous stretches a block, then the elements past the last
 * whole pack (or every element, when a buffer is not 16-byte aligned) spread over the blocks. */
template <int TYPE, int OP>
static __device__ void combineShare(const Share& s) {
  typedef typename gcommElem<TYPE>::T T;
  constexpr size_t N = 16 / sizeof(T);
  uintptr_t bits = 0;
  for (int k = 0; k < s.nIn; k++) bits |= (uintptr_t)s.in[k];
  for (int k = 0; k < s.nOut; k++) bits |= (uintptr_t)s.out[k];
  size_t packs = (bits & 15) == 0 ? s.count / N : 0;
  size_t per = (packs + gridDim.x - 1) / gridDim.x;
  size_t lo = per * blockIdx.x < packs ? per * blockIdx.x : packs;
  size_t hi = lo + per < packs ? lo + per : packs;
  combinePacks<TYPE, OP>(s, lo, hi);
  size_t stride = (size_t)gridDim.x * THREADS;
  for (size_t i = packs * N + (size_t)blockIdx.x * THREADS + threadIdx.x; i < s.count;
       i += stride) {
    T v = combine<TYPE, OP>(s, i);
    for (int k = 0; k < s.nOut; k++) ((T*)s.out[k])[i] = v;
  }
}

/* This rank's part of the call: every input combined into every output, or each pair copied. */
template <int TYPE, int OP>
static __device__ void combineAll(const gcommDirectArgs_t& a) {
  if (!a.pairs) {
    combineShare<TYPE, OP>(Share{a.in, a.out, a.count, a.nIn, a.nOut, a.divide});
    return;
  }
  for (int k = 0; k < a.nOut; k++)
    combineShare<TYPE, OP>(Share{&a.in[k], &a.out[k], a.count, 1, 1, 0});
}

template <int TYPE, int OP>
__global__ void __launch_bounds__(THREADS, 2)
    directKernel(const __grid_constant__ gcommDirectArgs_t a) {
  __shared__ int failed;
  __shared__ uint64_t meetings;
  if (threadIdx.x == 0) {
    failed = 0;
    meetings = a.meetings[blockIdx.x];
  }
  __syncthreads();
  uint64_t m = meetings;
  if (a.meetFirst && meet(a, 2 * m + 1, &failed)) return;
  if (a.count > 0) combineAll<TYPE, OP>(a);
  __syncthreads();
  if (threadIdx.x < (unsigned)a.nranks) __threadfence_system(); /* the peers' outputs written */
  if (meet(a, 2 * m + 2, &failed)) return;
  if (threadIdx.x == 0) a.meetings[blockIdx.x] = m + 1;
}

/* ---- launch: the datatype and operator as constants ---- */

template <int TYPE>
static void launchType(const gcommDirectArgs_t* a, cudaStream_t s) {
  dim3 grid((unsigned)a->nBlocks), block(THREADS);
  switch (a->redop) {
    case gcommProd:
      directKernel<TYPE, gcommProd><<<grid, block, 0, s>>>(*a);
      break;
    case gcommMax:
      directKernel<TYPE, gcommMax><<<grid, block, 0, s>>>(*a);
      break;
    case gcommMin:
      directKernel<TYPE, gcommMin><<<grid, block, 0, s>>>(*a);
      break;
    default: /* Sum, and Avg (the sum, then a.divide) */
      directKernel<TYPE, gcommSum><<<grid, block, 0, s>>>(*a);
  }
}

extern "C" int gcommDirectLaunch(const gcommDirectArgs_t* a, void* stream) {
  if (!gcommByDatatype(a->datatype,
                       [&](auto dt) { launchType<decltype(dt)::value>(a, (cudaStream_t)stream); }))
    return (int)cudaErrorInvalidValue;
  return (int)cudaGetLastError();
}
