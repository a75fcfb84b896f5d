/*
 * gcomm_gpu_copy.c - copy engines: FIFOs that the progress thread fills or drains with
 * cudaMemcpyAsync instead of the kernels' loads and stores over the interconnect.
 *
 * - Sends (GCOMM_P2P_USE_CUDA_MEMCPY=1 on GPU memory shared through IPC, or
 *   GCOMM_SHM_USE_CUDA_MEMCPY=1 with GCOMM_SHM_MEMCPY_MODE 1 or 3 on FIFOs staged in host
 *   memory): the kernels' sends to a local peer go to a staging FIFO in this rank's GPU memory,
 *   which the progress thread copies into the peer's FIFO.
 * - Receives (GCOMM_SHM_USE_CUDA_MEMCPY=1, GCOMM_SHM_MEMCPY_MODE 2 or 3): the progress thread
 *   copies the staged FIFO in host memory into a mirror FIFO in this rank's GPU memory, which the
 *   kernels read instead; their head still goes to the sender directly.
 * Either way the copies go in order in one stream per peer and direction: the slots' data and
 * words, then the tail, so that the tail lands after what it publishes.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gcomm_gpu_engine.h"

/* A FIFO header as the copies read it: the tail at 0 and the bytes[] words at CE_BYTES_OFF; a
 * connection's block of d->ceHdrs (mapped pinned host memory) holds a staging header laid out so
 * (sends, unless gdrcopy maps one in GPU memory), then the tail values the copies read
 * (tailVals[slot] = the step after it). */
#define CE_BYTES_OFF 64
#define CE_TAILVALS_OFF 128

typedef struct cePeer {
  int rank;
  cudaStream_t stream; /* non-blocking */
  int pending;         /* copies enqueued since the stream was last seen idle */
} cePeer_t;

typedef struct ceConn {
  cePeer_t* to;
  uint64_t copied;              /* steps whose copies are enqueued */
  const volatile uint64_t* src; /* the source FIFO's header, as the proxy reads it */
  char* slots;                  /* the source FIFO's slots */
  uint64_t* tailVals;           /* pinned host memory: what the tail copies read */
  char* dst;                    /* the destination FIFO (tail at 0, bytes[] at CE_BYTES_OFF,
                                   slots at GCOMM_DEV_FIFO_HDR) */
} ceConn_t;

/* Which connections to a local peer the copy engines serve here: GCOMM_SHM_COPY_SEND and/or
 * GCOMM_SHM_COPY_RECV, 0 for none (said at INFO when a knob is set but does not apply). */
static int ceDirections(gcommComm_t comm) {
  const gcommParams_t* p = &comm->params;
  if (comm->nLocal < 2) return 0;
  if (comm->dev->staged) {
    if (p->p2pMemcpy)
      GCOMM_INFO(GCOMM_SUBSYS_INIT, comm,
                 "GCOMM_P2P_USE_CUDA_MEMCPY=1 is ignored: the GPU FIFOs are staged through host "
                 "memory (GCOMM_SHM_USE_CUDA_MEMCPY=1 chooses copy engines there)");
    return p->shmMemcpy ? (int)p->shmMemcpyMode : 0;
  }
  if (p->shmMemcpy || p->shmLocality != GCOMM_SHM_AT_RECEIVER)
    GCOMM_INFO(GCOMM_SUBSYS_INIT, comm,
               "GCOMM_SHM_USE_CUDA_MEMCPY=%d and GCOMM_SHM_LOCALITY=%d are ignored: the GPU FIFOs "
               "are in GPU memory, not staged through host memory (GCOMM_P2P_DISABLE=1 stages "
               "them)",
               (int)p->shmMemcpy, (int)p->shmLocality);
  return p->p2pMemcpy ? GCOMM_SHM_COPY_SEND : 0;
}

/* A send connection: the kernel fills the staging FIFO (header hdr as the kernel addresses it,
 * hdrHost as the proxy reads it; slots in GPU memory) which the proxy copies into the receiver's
 * FIFO, where hc pointed. */
static void ceAttachSend(gcommComm_t comm, ceConn_t* c, gcommDevConn_t* hc, char* hdr,
                         const char* hdrHost, char* gpuFifo) {
  c->src = (const volatile uint64_t*)hdrHost;
  c->slots = gpuFifo + GCOMM_DEV_FIFO_HDR;
  c->dst = gcommIpcHostAddress(comm, (const char*)hc->tail);
  hc->tail = (volatile uint64_t*)hdr;
  hc->bytes = (volatile uint64_t*)(hdr + CE_BYTES_OFF);
  hc->slots = c->slots;
  hc->llSlots = NULL; /* LL is never chosen with copy engines */
}

/* A receive connection: the proxy copies the staged FIFO where hc pointed (host memory) into
 * gpuFifo, a mirror in this GPU's memory that the kernel reads instead. */
static void ceAttachRecv(gcommComm_t comm, ceConn_t* c, gcommDevConn_t* hc, char* gpuFifo) {
  char* fifo = gcommIpcHostAddress(comm, (const char*)hc->tail);
  c->src = (const volatile uint64_t*)fifo;
  c->slots = fifo + GCOMM_DEV_FIFO_HDR;
  c->dst = gpuFifo;
  hc->tail = (volatile uint64_t*)gpuFifo;
  hc->bytes = (volatile uint64_t*)(gpuFifo + CE_BYTES_OFF);
  hc->slots = gpuFifo + GCOMM_DEV_FIFO_HDR;
  hc->llSlots = NULL;
}

/* The memory of nCe connections: a FIFO in GPU memory each (a send's staging slots, a receive's
 * mirror), zeroed, and a block of mapped pinned host memory each (ceHdrs). */
static gcommResult_t ceAlloc(gcommComm_t comm, int nPeers, int nCe, size_t fifoBytes) {
  struct gcommDev* d = comm->dev;
  d->cePeers = calloc(nPeers, sizeof(cePeer_t));
  d->ce = calloc(nCe, sizeof(ceConn_t));
  if (d->cePeers == NULL || d->ce == NULL)
    return GCOMM_ERROR(comm, gcommSystemError, -1, "out of memory");
  d->nCePeers = nPeers;
  d->nCe = nCe;
  CUDA_CHECK(comm, -1, cudaMalloc((void**)&d->ceSlots, fifoBytes * nCe));
  CUDA_CHECK(comm, -1, cudaMemset(d->ceSlots, 0, fifoBytes * nCe)); /* mirrors' tails at 0 */
  size_t hdrBytes = (size_t)GCOMM_DEV_FIFO_HDR * nCe;
  CUDA_CHECK(comm, -1, cudaHostAlloc((void**)&d->ceHdrs, hdrBytes, cudaHostAllocMapped));
  memset(d->ceHdrs, 0, hdrBytes); /* staging tails at 0 */
  return gcommSuccess;
}

/* One stream per local peer and direction (in the proxy's context when it has its own), and
 * each lane's connection of it. */
static gcommResult_t ceConnectPeer(gcommComm_t comm, gcommDevConn_t* hc, int p, int dir, int* k,
                                   const char* devHdrs, size_t fifoBytes) {
  struct gcommDev* d = comm->dev;
  cePeer_t* to = &d->cePeers[*k / comm->nLanes];
  size_t nc = (size_t)comm->nLanes * comm->nranks;
  to->rank = p;
  gcommProxyCtx_t saved;
  GCOMM_CHECK(gcommGpuProxyEnter(comm, &saved));
  cudaError_t e = cudaStreamCreateWithFlags(&to->stream, cudaStreamNonBlocking);
  gcommGpuProxyLeave(comm, saved);
  if (e != cudaSuccess)
    return GCOMM_ERROR(comm, gcommDeviceError, p, "cudaStreamCreateWithFlags: %s",
                       cudaGetErrorString(e));
  for (int lane = 0; lane < comm->nLanes; lane++, (*k)++) {
    size_t i = (size_t)lane * comm->nranks + p, off = (size_t)*k * GCOMM_DEV_FIFO_HDR;
    ceConn_t* c = &d->ce[*k];
    char* gpuFifo = d->ceSlots + (size_t)*k * fifoBytes;
    c->to = to;
    c->tailVals = (uint64_t*)(d->ceHdrs + off + CE_TAILVALS_OFF);
    if (dir == GCOMM_SHM_COPY_RECV) {
      ceAttachRecv(comm, c, &hc[nc + i], gpuFifo);
    } else if (d->ceSync != NULL) { /* the staging header in GPU memory, read through gdrcopy */
      char* sync = (char*)d->ceSync + off;
      ceAttachSend(comm, c, &hc[i], sync, (char*)gcommGdrCpu(d->ceSyncMap) + off, gpuFifo);
    } else {
      ceAttachSend(comm, c, &hc[i], (char*)devHdrs + off, d->ceHdrs + off, gpuFifo);
    }
  }
  return gcommSuccess;
}

/* Why reusing a slot is safe. Sends: the kernel writes staging slot s % GCOMM_STEPS for step s
 * only once the receiver's head has passed s - GCOMM_STEPS; the receiver moves its head past a
 * step after it saw a tail beyond it, and the tail copy that published it ran after the copies
 * of that step's slot and word in stream order. Receives: the sender refills host slot s for
 * step s + GCOMM_STEPS only after this rank's kernel moved its head past s, which it did after
 * reading the mirror's slot, itself after the mirror's tail copy, after the slot's copy; and the
 * copy into mirror slot s for step s + GCOMM_STEPS is enqueued only once the host tail has passed
 * that step, so after the kernel drained s. The same holds for tailVals[slot]. */
gcommResult_t gcommGpuCopyConnect(gcommComm_t comm, gcommDevConn_t* hc) {
  struct gcommDev* d = comm->dev;
  int dirs = ceDirections(comm), n = comm->nranks, me = comm->rank;
  if (dirs == 0 && comm->params.gdrSync)
    GCOMM_INFO(GCOMM_SUBSYS_INIT, comm,
               "GCOMM_GDRCOPY_SYNC_ENABLE=1: no copy engines here, so no staging words to map");
  if (dirs == 0) return gcommSuccess;
  int nDirs = !!(dirs & GCOMM_SHM_COPY_SEND) + !!(dirs & GCOMM_SHM_COPY_RECV);
  int nPeers = (comm->nLocal - 1) * nDirs, nCe = nPeers * comm->nLanes;
  size_t fifoBytes = GCOMM_DEV_FIFO_HDR + (size_t)GCOMM_STEPS * comm->slotBytes;
  GCOMM_CHECK(ceAlloc(comm, nPeers, nCe, fifoBytes));
  if (dirs & GCOMM_SHM_COPY_SEND) gcommGpuSyncMap(comm, (size_t)GCOMM_DEV_FIFO_HDR * nCe);
  char* devHdrs = NULL;
  CUDA_CHECK(comm, -1, cudaHostGetDevicePointer((void**)&devHdrs, d->ceHdrs, 0));
  int k = 0;
  for (int p = 0; p < n; p++) {
    if (p == me || comm->cards[p].hostId != comm->cards[me].hostId) continue;
    for (int dir = GCOMM_SHM_COPY_SEND; dir <= GCOMM_SHM_COPY_RECV; dir <<= 1)
      if (dirs & dir) GCOMM_CHECK(ceConnectPeer(comm, hc, p, dir, &k, devHdrs, fifoBytes));
  }
  GCOMM_INFO(GCOMM_SUBSYS_INIT, comm,
             "GPU %d: %s local ranks through copy engines (%s, Simple protocol only): %d FIFOs, "
             "%zu bytes of GPU memory, %zu bytes of pinned host memory; staging words %s",
             comm->device,
             dirs == GCOMM_SHM_COPY_SEND   ? "sends to"
             : dirs == GCOMM_SHM_COPY_RECV ? "receives from"
                                           : "sends to and receives from",
             d->staged ? "GCOMM_SHM_USE_CUDA_MEMCPY=1, FIFOs staged in host memory"
                       : "GCOMM_P2P_USE_CUDA_MEMCPY=1",
             d->nCe, fifoBytes * d->nCe, (size_t)GCOMM_DEV_FIFO_HDR * d->nCe,
             d->ceSync ? "in GPU memory, read through gdrcopy" : "in mapped host memory");
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
  const volatile uint64_t* words = (const volatile uint64_t*)((const char*)c->src + CE_BYTES_OFF);
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
  uint64_t* tailVal = c->tailVals + (tail - 1) % GCOMM_STEPS;
  *tailVal = tail;
  CUDA_CHECK(comm, p, cudaMemcpyAsync(c->dst, tailVal, sizeof(uint64_t), cudaMemcpyDefault, s));
  c->copied = tail;
  c->to->pending = 1;
  return gcommSuccess;
}

/* The copies of every connection whose source tail moved, from connection `from` on; then
 * every stream with copies enqueued is queried: a copy that failed on the GPU shows there. */
static gcommResult_t ceProgress(gcommComm_t comm, int from, int* moved) {
  struct gcommDev* d = comm->dev;
  for (int k = from; k < d->nCe; k++) {
    ceConn_t* c = &d->ce[k];
    uint64_t tail = __atomic_load_n(c->src, __ATOMIC_ACQUIRE); /* then its words */
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
                         "GPU %d: a copy between this rank's FIFOs and rank %d's failed (copy "
                         "engines): %s (%s)",
                         comm->device, to->rank, cudaGetErrorName(e), cudaGetErrorString(e));
  }
  return gcommSuccess;
}

gcommResult_t gcommDeviceCopyProgress(gcommComm_t comm, int* moved) {
  struct gcommDev* d = comm->dev;
  /* most passes find nothing to do: no CUDA call then */
  int k = 0, busy = 0;
  while (k < d->nCe && __atomic_load_n(d->ce[k].src, __ATOMIC_RELAXED) == d->ce[k].copied) k++;
  for (int i = 0; i < d->nCePeers && !busy; i++) busy = d->cePeers[i].pending;
  if (k == d->nCe && !busy) return gcommSuccess;
  gcommProxyCtx_t saved;
  GCOMM_CHECK(gcommGpuProxyEnter(comm, &saved));
  gcommResult_t res = ceProgress(comm, k, moved);
  gcommGpuProxyLeave(comm, saved);
  return res;
}

/* Destroy: the copies still enqueued finish before the memory they read and write goes (unless
 * a kernel may still run: the memory is then never freed). */
void gcommGpuCopyFree(gcommComm_t comm) {
  struct gcommDev* d = comm->dev;
  gcommProxyCtx_t saved;
  int entered = d->nCePeers > 0 && gcommGpuProxyEnter(comm, &saved) == gcommSuccess;
  for (int i = 0; i < d->nCePeers; i++) {
    if (d->cePeers[i].stream == NULL) continue;
    if (!d->keepMemory) cudaStreamSynchronize(d->cePeers[i].stream);
    cudaStreamDestroy(d->cePeers[i].stream);
  }
  if (entered) gcommGpuProxyLeave(comm, saved);
  if (!d->keepMemory) {
    if (d->ceSlots) cudaFree(d->ceSlots);
    if (d->ceHdrs) cudaFreeHost(d->ceHdrs);
  }
  free(d->cePeers);
  free(d->ce);
}
