/*
 * transports/p2p.c - the GPU FIFOs of one node's ranks, shared through CUDA IPC. The HIP build
 * (HIP=1) compiles this same file: gcomm_gpu.h maps the cuda* names to hip* (hipIpcGetMemHandle,
 * ...). The GPU engine that launches kernels on these FIFOs is gcomm_gpu_engine.c.
 *
 * Each rank allocates one region in its GPU's memory (layout in gcomm_device.h) holding the FIFOs
 * it receives on and the head counters of the FIFOs it sends on. The region is exported with
 * cudaIpcGetMemHandle, the handles travel in the cards exchanged at init, and every local peer
 * opens them (cudaIpcMemLazyEnablePeerAccess turns on NVLink peer access between different GPUs;
 * two ranks on one GPU need nothing more). Staged (GCOMM_P2P_DISABLE=1, or two GPUs of a node that
 * cannot access each other as peers), the region is instead an area of the rank's shm segment
 * (transports/shm.c), which every process of the node maps anyway; each registers every local
 * region with cudaHostRegister (mapped, portable) and gives its kernels the device addresses. The
 * kernels are the same: system-scope release/acquire and L1-bypassing loads hold over PCIe too.
 * GCOMM_SHM_LOCALITY=1 moves each staged FIFO into its sender's region (gcommIpcFillConns), and
 * GCOMM_SHM_USE_CUDA_MEMCPY=1 has copy engines fill or drain staged FIFOs (gcomm_gpu_copy.c).
 * A rank's step counters, which no other rank reads, stay in its GPU's memory either way. After
 * init no MPI is used but destroy's barrier: kernels talk through the FIFOs alone.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gcomm_gpu_engine.h"

const char* gcommDevicePathName(int path) {
  static const char* const names[] = {"CUDA IPC", "copy engines", "staged", "staged"};
  return path >= 0 && path <= GCOMM_PATH_NO_PEER ? names[path] : "unknown";
}

int gcommDevicePath(const gcommParams_t* params, int a, int b, const char** why) {
  int can = 1;
  cudaError_t e = a == b ? cudaSuccess : cudaDeviceCanAccessPeer(&can, a, b);
  if (e != cudaSuccess) {
    *why = cudaGetErrorString(e);
    cudaGetLastError();
    return -1;
  }
  if (!can) {
    *why =
        "the GPUs cannot access each other as peers: FIFOs in pinned shared host memory, for "
        "every pair of the communicator";
    return GCOMM_PATH_NO_PEER;
  }
  if (params->p2pDisable) {
    *why = "GCOMM_P2P_DISABLE=1: FIFOs in pinned shared host memory";
    return GCOMM_PATH_STAGED;
  }
  if (params->p2pMemcpy) {
    *why = "GCOMM_P2P_USE_CUDA_MEMCPY=1: the progress thread copies the kernels' staging FIFOs";
    return GCOMM_PATH_COPY_ENGINES;
  }
  *why = a == b ? "one GPU: FIFOs in its memory, shared through IPC"
                : "peer access: FIFOs in the receiver's GPU memory, written over NVLink or PCIe";
  return GCOMM_PATH_IPC;
}

size_t gcommDeviceShmBytes(gcommComm_t comm) {
  return comm->dev != NULL && comm->dev->staged ? comm->dev->regionBytes : 0;
}

/* Whether this rank's GPU lacks peer access to the GPU of a local rank: that rank, or -1 (an
 * error: -2). all[r]: rank r's node and device. */
typedef struct {
  uint64_t hostId;
  int device, pad; /* pad: no uninitialised bytes on the wire */
} placeCard_t;
static int peerWithoutAccess(gcommComm_t comm, const placeCard_t* all) {
  for (int p = 0; p < comm->nranks; p++) {
    if (all[p].hostId != all[comm->rank].hostId || all[p].device < 0 ||
        all[p].device == comm->device)
      continue; /* another node, a host communicator (refused at connect), or the same GPU */
    const char* why = NULL;
    int path = gcommDevicePath(&comm->params, comm->device, all[p].device, &why);
    if (path < 0) {
      GCOMM_ERROR(comm, gcommDeviceError, p, "cudaDeviceCanAccessPeer(GPU %d, GPU %d): %s",
                  comm->device, all[p].device, why);
      return -2;
    }
    if (path == GCOMM_PATH_NO_PEER) return p;
  }
  return -1;
}

gcommResult_t gcommDevicePlaceFifos(gcommComm_t comm, uint64_t hostId, size_t* shmBytes) {
  placeCard_t mine = {hostId, comm->device, 0};
  placeCard_t* all = calloc(comm->nranks, sizeof(placeCard_t));
  int* asks = calloc(comm->nranks, sizeof(int));
  *shmBytes = 0;
  if (all == NULL || asks == NULL) {
    free(all), free(asks);
    return GCOMM_ERROR(comm, gcommSystemError, -1, "out of memory");
  }
  /* every rank reaches both exchanges: no early return between them */
  gcommResult_t res = comm->allgather(comm, &mine, sizeof(mine), all);
  int noPeer = res == gcommSuccess && comm->device >= 0 ? peerWithoutAccess(comm, all) : -1;
  int staged = 0, ask = comm->device >= 0 && (comm->params.p2pDisable || noPeer >= 0);
  int noPeerDevice = noPeer >= 0 ? all[noPeer].device : -1;
  if (res == gcommSuccess) res = comm->allgather(comm, &ask, sizeof(ask), asks);
  for (int r = 0; r < comm->nranks && res == gcommSuccess; r++) staged |= asks[r];
  free(all), free(asks);
  if (res != gcommSuccess) return res;
  if (noPeer == -2) return gcommDeviceError; /* reported */
  if (comm->device < 0) return gcommSuccess;

  struct gcommDev* d = calloc(1, sizeof(*d));
  if (d == NULL) return GCOMM_ERROR(comm, gcommSystemError, -1, "out of memory");
  comm->dev = d;
  d->staged = staged;
  d->fifoBytes =
      (GCOMM_DEV_FIFO_HDR + GCOMM_STEPS * (comm->slotBytes + GCOMM_LL_SLOT_BYTES) + 255) &
      ~(size_t)255;
  d->headOff = d->fifoBytes * comm->nLocal * comm->nLanes;
  d->regionBytes = d->headOff + (size_t)GCOMM_DEV_HEAD_BYTES * comm->nLocal * comm->nLanes;
  if (staged) {
    *shmBytes = d->regionBytes;
    GCOMM_INFO(GCOMM_SUBSYS_INIT | GCOMM_SUBSYS_SHM, comm,
               "GCOMM_SHM_LOCALITY=%d: each staged GPU FIFO lies in its %s's shm segment (pages "
               "on that rank's NUMA node); GCOMM_SHM_USE_CUDA_MEMCPY=%d%s",
               (int)comm->params.shmLocality,
               comm->params.shmLocality == GCOMM_SHM_AT_SENDER ? "sender" : "receiver",
               (int)comm->params.shmMemcpy,
               !comm->params.shmMemcpy           ? ": the kernels read and write them over PCIe"
               : comm->params.shmMemcpyMode == 1 ? ", mode 1: copy engines fill them"
               : comm->params.shmMemcpyMode == 2 ? ", mode 2: copy engines drain them"
                                                 : ", mode 3: copy engines fill and drain them");
    if (noPeer >= 0)
      GCOMM_INFO(GCOMM_SUBSYS_INIT, comm,
                 "GPU %d cannot access GPU %d of rank %d as a peer: GPU FIFOs are staged through "
                 "pinned shared host memory (slower)",
                 comm->device, noPeerDevice, noPeer);
    else
      GCOMM_INFO(GCOMM_SUBSYS_INIT, comm, "GPU FIFOs staged through pinned shared host memory: %s",
                 comm->params.p2pDisable ? "GCOMM_P2P_DISABLE=1"
                                         : "another rank asked (GCOMM_P2P_DISABLE=1 there, or "
                                           "GPUs without peer access)");
  }
  return gcommSuccess;
}

/* Registers rank's shm area (its staged region) with CUDA in this process; *region: the address
 * this process's kernels use for it. */
gcommResult_t gcommIpcRegisterArea(gcommComm_t comm, int rank, char** region) {
  void* host = gcommShmArea(comm, rank);
  int peer = rank == comm->rank ? -1 : rank;
  if (host == NULL)
    return GCOMM_ERROR(comm, gcommInternalError, peer, "rank %d's shm segment has no FIFO area",
                       rank);
  CUDA_CHECK(comm, peer,
             cudaHostRegister(host, comm->dev->regionBytes,
                              cudaHostRegisterMapped | cudaHostRegisterPortable));
  void* dev = NULL;
  cudaError_t e = cudaHostGetDevicePointer(&dev, host, 0);
  if (e != cudaSuccess) {
    cudaHostUnregister(host);
    return GCOMM_ERROR(comm, gcommDeviceError, peer, "cudaHostGetDevicePointer: %s",
                       cudaGetErrorString(e));
  }
  *region = dev;
  return gcommSuccess;
}

gcommResult_t gcommIpcRegionCreate(gcommComm_t comm, gcommCard_t* card) {
  struct gcommDev* d = comm->dev;
  if (d->staged) {
    /* a new shm area reads zero: counters at 0, no stale LL flag */
    GCOMM_CHECK(gcommIpcRegisterArea(comm, comm->rank, &d->region));
  } else {
    CUDA_CHECK(comm, -1, gcommGpuMallocFifo((void**)&d->region, d->regionBytes));
    /* counters start at 0, and LL slots must hold no stale flag */
    CUDA_CHECK(comm, -1, cudaMemset(d->region, 0, d->regionBytes));
    cudaIpcMemHandle_t h;
    CUDA_CHECK(comm, -1, cudaIpcGetMemHandle(&h, d->region));
    memcpy(card->devHandle, &h,
           sizeof(h) < sizeof(card->devHandle) ? sizeof(h) : sizeof(card->devHandle));
  }
  return gcommSuccess;
}

gcommResult_t gcommIpcOpenPeers(gcommComm_t comm) {
  struct gcommDev* d = comm->dev;
  int me = comm->rank, n = comm->nranks;
  for (int p = 0; p < n; p++) {
    int pd = comm->cards[p].device;
    if (p != me && pd < 0)
      return GCOMM_ERROR(comm, gcommInvalidUsage, p,
                         "rank %d has a host communicator and this rank a GPU one: every rank "
                         "must choose alike (config.device)",
                         p);
    if (p == me || comm->cards[p].hostId != comm->cards[me].hostId) continue;
    if (d->staged) { /* GPUs without peer access were seen by gcommDevicePlaceFifos */
      GCOMM_CHECK(gcommIpcRegisterArea(comm, p, &d->peerRegion[p]));
      continue;
    }
    cudaIpcMemHandle_t h;
    memcpy(&h, comm->cards[p].devHandle, sizeof(h));
    void* m = NULL;
    CUDA_CHECK(comm, p, cudaIpcOpenMemHandle(&m, h, cudaIpcMemLazyEnablePeerAccess));
    d->peerRegion[p] = m;
  }
  return gcommSuccess;
}

/* Which region holds the FIFOs: the receiver's (its FIFO [sender][lane]), or when staged with
 * GCOMM_SHM_LOCALITY=1 the sender's (its FIFO [receiver][lane]), whose shm segment the sender
 * allocated (posix_fallocate: pages on its NUMA node when it runs there). Heads stay in the
 * sender's region, where it polls them. */
static int fifosAtSender(gcommComm_t comm) {
  return comm->dev->staged && comm->params.shmLocality == GCOMM_SHM_AT_SENDER;
}

void gcommIpcFillConns(gcommComm_t comm, gcommDevConn_t* hc, uint64_t* steps) {
  struct gcommDev* d = comm->dev;
  int me = comm->rank, n = comm->nranks, myIdx = gcommLocalIndex(comm, me);
  int atSender = fifosAtSender(comm);
  size_t nc = (size_t)comm->nLanes * n;
  for (int p = 0; p < n; p++) {
    if (comm->cards[p].hostId != comm->cards[me].hostId) continue;
    char* peer = p == me ? d->region : d->peerRegion[p];
    int pIdx = gcommLocalIndex(comm, p);
    for (int lane = 0; lane < comm->nLanes; lane++) {
      size_t i = (size_t)lane * n + p;
      /* send to p: FIFO [me][lane] of p's region (or [p][lane] of mine), head in my region
       * [p][lane] */
      char* f = atSender ? d->region + ((size_t)pIdx * comm->nLanes + lane) * d->fifoBytes
                         : peer + ((size_t)myIdx * comm->nLanes + lane) * d->fifoBytes;
      hc[i].tail = (volatile uint64_t*)f;
      hc[i].bytes = (volatile uint64_t*)(f + 64);
      hc[i].slots = f + GCOMM_DEV_FIFO_HDR;
      hc[i].llSlots = hc[i].slots + GCOMM_STEPS * comm->slotBytes;
      hc[i].head =
          (volatile uint64_t*)(d->region + d->headOff +
                               ((size_t)pIdx * comm->nLanes + lane) * GCOMM_DEV_HEAD_BYTES);
      hc[i].step = steps + i;
      /* receive from p: FIFO [p][lane] of my region (or [me][lane] of p's), head in p's region
       * [me][lane] */
      f = atSender ? peer + ((size_t)myIdx * comm->nLanes + lane) * d->fifoBytes
                   : d->region + ((size_t)pIdx * comm->nLanes + lane) * d->fifoBytes;
      hc[nc + i].tail = (volatile uint64_t*)f;
      hc[nc + i].bytes = (volatile uint64_t*)(f + 64);
      hc[nc + i].slots = f + GCOMM_DEV_FIFO_HDR;
      hc[nc + i].llSlots = hc[nc + i].slots + GCOMM_STEPS * comm->slotBytes;
      hc[nc + i].head =
          (volatile uint64_t*)(peer + d->headOff +
                               ((size_t)myIdx * comm->nLanes + lane) * GCOMM_DEV_HEAD_BYTES);
      hc[nc + i].step = steps + nc + i;
    }
  }
}

char* gcommIpcHostAddress(gcommComm_t comm, const char* addr) {
  struct gcommDev* d = comm->dev;
  for (int p = 0; d->staged && p < comm->nranks; p++) {
    const char* region = p == comm->rank ? d->region : d->peerRegion[p];
    if (region != NULL && addr >= region && addr < region + d->regionBytes)
      return (char*)gcommShmArea(comm, p) + (addr - region);
  }
  return (char*)addr;
}

void gcommIpcClose(gcommComm_t comm) {
  struct gcommDev* d = comm->dev;
  for (int p = 0; d->peerRegion && p < comm->nranks; p++) {
    if (d->peerRegion[p] == NULL) continue;
    if (d->staged)
      cudaHostUnregister(gcommShmArea(comm, p));
    else
      cudaIpcCloseMemHandle(d->peerRegion[p]);
  }
  if (d->region && d->staged) cudaHostUnregister(gcommShmArea(comm, comm->rank));
  if (d->region && !d->staged) cudaFree(d->region);
}
