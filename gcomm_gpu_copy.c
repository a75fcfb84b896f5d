/*
 * gcomm_gpu_copy.c - copy engines (GCOMM_P2P_USE_CUDA_MEMCPY=1): the kernels' sends to a local
 * peer go to a staging FIFO in this rank's GPU memory, which the progress thread copies into the
 * peer's FIFO with cudaMemcpyAsync: the slots' data and words, then the tail, in one stream per
 * peer, so that the tail lands after what it publishes.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gcomm_gpu_engine.h"

/* A staging header, in mapped pinned host memory (so that the proxy polls it without a CUDA
 * call), laid out like a FIFO's: the kernel's tail at 0 and its bytes[] words at CE_BYTES_OFF;
 * then the tail values the copies read (tailVals[slot] = the step after it). */
#define CE_BYTES_OFF 64
#define CE_TAILVALS_OFF 128

typedef struct cePeer {
  int rank;
  cudaStream_t stream; /* non-blocking */
  int pending;         /* copies enqueued since the stream was last seen idle */
} cePeer_t;

typedef struct ceConn {
  cePeer_t* to;
  uint64_t copied; /* steps whose copies are enqueued */
  uint64_t* hdr;   /* the staging header, host view */
  char* slots;     /* the staging slots (this GPU) */
  char* dst;       /* the receiver's FIFO (tail at 0, bytes[] at 64, slots at the header's end), as
                      this process maps the receiver's region */
} ceConn_t;

/* Why reusing a staging slot is safe: the kernel writes slot s % GCOMM_STEPS for step s only
 * once the receiver's head has passed s - GCOMM_STEPS; the receiver moves its head past a step
 * after it saw a tail beyond it, and the tail copy that published it ran after the copies of that
 * step's slot and word in stream order. The same holds for tailVals[slot]. */
gcommResult_t gcommGpuCopyConnect(gcommComm_t comm, gcommDevConn_t* hc) {
  struct gcommDev* d = comm->dev;
  int n = comm->nranks, me = comm->rank;
  if (!comm->params.p2pMemcpy || comm->nLocal < 2) return gcommSuccess;
  if (d->staged) {
    GCOMM_INFO(GCOMM_SUBSYS_INIT, comm,
               "GCOMM_P2P_USE_CUDA_MEMCPY=1 is ignored: the GPU FIFOs are staged through host "
               "memory");
    return gcommSuccess;
  }
  size_t slotsBytes = (size_t)GCOMM_STEPS * comm->slotBytes;
  int nPeers = comm->nLocal - 1, nCe = nPeers * comm->nLanes;
  d->cePeers = calloc(nPeers, sizeof(cePeer_t));
  d->ce = calloc(nCe, sizeof(ceConn_t));
  if (d->cePeers == NULL || d->ce == NULL)
    return GCOMM_ERROR(comm, gcommSystemError, -1, "out of memory");
  d->nCePeers = nPeers;
  d->nCe = nCe;
  CUDA_CHECK(comm, -1, cudaMalloc((void**)&d->ceSlots, slotsBytes * d->nCe));
  size_t hdrBytes = (size_t)GCOMM_DEV_FIFO_HDR * d->nCe;
  CUDA_CHECK(comm, -1, cudaHostAlloc((void**)&d->ceHdrs, hdrBytes, cudaHostAllocMapped));
  memset(d->ceHdrs, 0, hdrBytes); /* tails at 0 */
  char* devHdrs = NULL;
  CUDA_CHECK(comm, -1, cudaHostGetDevicePointer((void**)&devHdrs, d->ceHdrs, 0));
  char ranks[160] = "";
  int len = 0, k = 0;
  cePeer_t* to = d->cePeers;
  for (int p = 0; p < n; p++) {
    if (p == me || comm->cards[p].hostId != comm->cards[me].hostId) continue;
    to->rank = p;
    CUDA_CHECK(comm, p, cudaStreamCreateWithFlags(&to->stream, cudaStreamNonBlocking));
    if (len < (int)sizeof(ranks) - 16)
      len += snprintf(ranks + len, sizeof(ranks) - len, "%s%d", len ? "," : "", p);
    for (int lane = 0; lane < comm->nLanes; lane++, k++) {
      size_t i = (size_t)lane * n + p;
      ceConn_t* c = &d->ce[k];
      c->to = to;
      c->hdr = (uint64_t*)(d->ceHdrs + (size_t)k * GCOMM_DEV_FIFO_HDR);
      c->slots = d->ceSlots + k * slotsBytes;
      c->dst = (char*)hc[i].tail; /* gcommDeviceConnect pointed it at p's FIFO */
      char* dev = devHdrs + (size_t)k * GCOMM_DEV_FIFO_HDR;
      hc[i].tail = (volatile uint64_t*)dev;
      hc[i].bytes = (volatile uint64_t*)(dev + CE_BYTES_OFF);
      hc[i].slots = c->slots;
      hc[i].llSlots = NULL; /* LL is never chosen with copy engines */
    }
    to++;
  }
  GCOMM_INFO(GCOMM_SUBSYS_INIT, comm,
             "GPU %d: sends to local ranks %s%s through copy engines (GCOMM_P2P_USE_CUDA_MEMCPY=1, "
             "Simple protocol only): %d staging FIFOs, %zu bytes of GPU memory, %zu bytes of "
             "pinned host memory",
             comm->device, ranks, len >= (int)sizeof(ranks) - 16 ? ",..." : "", d->nCe,
             slotsBytes * d->nCe, hdrBytes);
  return gcommSuccess;
}

int gcommDeviceCopyEngines(gcommComm_t comm) {
  return comm->dev != NULL && comm->dev->nCe > 0;
}

/* Enqueues the copies of c's steps [c->copied, tail): per stretch of slots that does not wrap,
 * their words in one copy and their data in as few copies as the slots allow (a slot only
 * partly filled ends one: what follows it is not copied), then the tail. */
static gcommResult_t ceCopy(gcommComm_t comm, ceConn_t* c, uint64_t tail) {
  const size_t sb = comm->slotBytes;
  const volatile uint64_t* words = (const volatile uint64_t*)((char*)c->hdr + CE_BYTES_OFF);
  cudaStream_t s = c->to->stream;
  int p = c->to->rank;
  for (uint64_t step = c->copied; step < tail;) {
    uint64_t first = step % GCOMM_STEPS, stretchEnd = step - first + GCOMM_STEPS;
    if (stretchEnd > tail) stretchEnd = tail;
    CUDA_CHECK(comm, p,
               cudaMemcpyAsync(c->dst + CE_BYTES_OFF + first * sizeof(uint64_t),
                               (const void*)(words + first), (stretchEnd - step) * sizeof(uint64_t),
                               cudaMemcpyDefault, s));
    while (step < stretchEnd) {
      uint64_t end = step + 1;
      while (end < stretchEnd && (uint32_t)words[(end - 1) % GCOMM_STEPS] == sb) end++;
      size_t off = (step % GCOMM_STEPS) * sb;
      size_t bytes = (end - step - 1) * sb + (uint32_t)words[(end - 1) % GCOMM_STEPS];
      if (bytes > 0)
        CUDA_CHECK(comm, p,
                   cudaMemcpyAsync(c->dst + GCOMM_DEV_FIFO_HDR + off, c->slots + off, bytes,
                                   cudaMemcpyDefault, s));
      step = end;
    }
  }
  uint64_t* tailVal = c->hdr + CE_TAILVALS_OFF / sizeof(uint64_t) + (tail - 1) % GCOMM_STEPS;
  *tailVal = tail;
  CUDA_CHECK(comm, p, cudaMemcpyAsync(c->dst, tailVal, sizeof(uint64_t), cudaMemcpyDefault, s));
  c->copied = tail;
  c->to->pending = 1;
  return gcommSuccess;
}

/* The copies of every connection whose staging tail moved, from connection `from` on; then
 * every stream with copies enqueued is queried: a copy that failed on the GPU shows there. */
static gcommResult_t ceProgress(gcommComm_t comm, int from, int* moved) {
  struct gcommDev* d = comm->dev;
  for (int k = from; k < d->nCe; k++) {
    ceConn_t* c = &d->ce[k];
    uint64_t tail = __atomic_load_n(c->hdr, __ATOMIC_ACQUIRE); /* then its words */
    if (tail == c->copied) continue;
    GCOMM_CHECK(ceCopy(comm, c, tail));
    *moved = 1;
  }
  for (int i = 0; i < d->nCePeers; i++) {
    cePeer_t* to = &d->cePeers[i];
    if (!to->pending) continue;
    cudaError_t e = cudaStreamQuery(to->stream);
    if (e == cudaSuccess) to->pending = 0;
    if (e != cudaSuccess && e != cudaErrorNotReady)
      return GCOMM_ERROR(comm, gcommDeviceError, to->rank,
                         "GPU %d: a copy to rank %d's FIFOs failed (GCOMM_P2P_USE_CUDA_MEMCPY=1): "
                         "%s (%s)",
                         comm->device, to->rank, cudaGetErrorName(e), cudaGetErrorString(e));
  }
  return gcommSuccess;
}

gcommResult_t gcommDeviceCopyProgress(gcommComm_t comm, int* moved) {
  struct gcommDev* d = comm->dev;
  /* most passes find nothing to do: no CUDA call then */
  int k = 0, busy = 0;
  while (k < d->nCe && __atomic_load_n(d->ce[k].hdr, __ATOMIC_RELAXED) == d->ce[k].copied) k++;
  for (int i = 0; i < d->nCePeers && !busy; i++) busy = d->cePeers[i].pending;
  if (k == d->nCe && !busy) return gcommSuccess;
  /* relaxed: these calls must not invalidate a graph the user captures meanwhile in global mode */
  enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  cudaThreadExchangeStreamCaptureMode(&mode);
  WITH_DEVICE(comm, old);
  gcommResult_t res = ceProgress(comm, k, moved);
  RESTORE_DEVICE(comm, old);
  cudaThreadExchangeStreamCaptureMode(&mode);
  return res;
}

/* Destroy: the copies still enqueued finish before the memory they read and write goes (unless
 * a kernel may still run: the memory is then never freed). */
void gcommGpuCopyFree(struct gcommDev* d) {
  for (int i = 0; i < d->nCePeers; i++) {
    if (d->cePeers[i].stream == NULL) continue;
    if (!d->keepMemory) cudaStreamSynchronize(d->cePeers[i].stream);
    cudaStreamDestroy(d->cePeers[i].stream);
  }
  if (!d->keepMemory) {
    if (d->ceSlots) cudaFree(d->ceSlots);
    if (d->ceHdrs) cudaFreeHost(d->ceHdrs);
  }
  free(d->cePeers);
  free(d->ce);
}
