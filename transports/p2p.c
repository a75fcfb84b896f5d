/*
 * transports/p2p.c - connections between GPUs of one node through CUDA IPC, and the host side
 * of the GPU engine: device selection, launches, stream waits, teardown. The HIP build (HIP=1)
 * compiles this same file: gcomm_gpu.h maps the cuda* names to hip* (hipIpcGetMemHandle, ...).
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
 * A rank's step counters, which no other rank reads, stay in its GPU's memory either way. After
 * init no MPI is used but destroy's barrier: kernels talk through the FIFOs alone.
 *
 * Ranks on other nodes (make OFI=1): the connections to them are FIFOs in this rank's pinned
 * host memory, mapped for the GPU, that transports/net_ofi.c moves (connectRemote below); their
 * slots are in GPU memory instead when the provider takes it (FI_HMEM, GCOMM_NET_GDR).
 * Copy engines (GCOMM_P2P_USE_CUDA_MEMCPY=1): the sends to local peers go through staging FIFOs
 * in this rank's GPU memory, which the progress thread copies into the peers' FIFOs with
 * cudaMemcpyAsync (the copy-engine section).
 */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gcomm_device.h"
#include "gcomm_gpu.h" /* CUDA, or HIP (GCOMM_HIP) under the same cuda* names */

/* A stream this communicator launched on, and an event recorded after its latest launch there. */
typedef struct {
  cudaStream_t stream;
  cudaEvent_t done;
} launchMark_t;

#define GPU_POINTERS_KNOWN 8
struct gcommDev {
  int staged;        /* the regions are in pinned shared host memory, not GPU memory */
  char* region;      /* this rank's region as its kernels address it (cudaMalloc, or registered) */
  char** peerRegion; /* [rank]: a local peer's region as this rank's kernels address it (opened
                        IPC mapping, or registered), NULL for self and remote ranks */
  uint64_t* steps;   /* this rank's step counters (cudaMalloc) */
  size_t fifoBytes, regionBytes, headOff;
  gcommDevComm_t host;     /* host copy of the device communicator */
  gcommDevComm_t* devComm; /* device copy */
  gcommDevConn_t* conns;   /* device arrays: send then recv */
  void* hostMapped;        /* cudaHostAlloc'd: abort flag, error record */
  gcommDevLaunch_t* args;  /* staging of one launch's parameters */
  /* the streams launched on (not while being captured into a graph: the caller finishes its
   * replays), each with an event after its latest launch: destroy waits for these, not the device
   */
  launchMark_t* marks;
  int nMarks;
  /* the event after the latest launch (one of marks' events, never freed before destroy): the
   * progress thread reads it to poll the network while launched kernels may still need it */
  cudaEvent_t lastMark;
  int keepMemory;      /* destroy could not see every kernel end: what they use is never freed */
  char* netFifos;      /* cudaHostAlloc'd: the FIFOs to ranks on other nodes, or NULL */
  char* netSlots;      /* cudaMalloc'd: their slots when the network takes GPU memory, or NULL */
  uint64_t waitSeenNs; /* progress thread: when it last saw the kernels' waiting flag */
  /* copy-engine sends to local peers (GCOMM_P2P_USE_CUDA_MEMCPY, section below), or nCe == 0 */
  struct ceConn* ce;      /* [nCe]: the connections, by peer then lane */
  struct cePeer* cePeers; /* [nCePeers]: each local peer's copy stream */
  int nCe, nCePeers;
  char* ceSlots; /* cudaMalloc: every connection's staging slots */
  char* ceHdrs;  /* cudaHostAlloc'd, mapped: every connection's staging header */

  /* the profiler's kernel timestamps (section at the end), or NULL */
  struct gcommDevProf* prof;
  const gcommWork_t** order; /* gcommDeviceLaunch: the works of a launch by queue */
  int orderCap;
  /* gcommDeviceBadPointer: the latest buffers found in GPU memory */
  const void* knownPointers[GPU_POINTERS_KNOWN];
  unsigned knownNext;
};

/* the copy-engine section, after the launches */
static gcommResult_t connectCopyEngines(gcommComm_t comm, gcommDevConn_t* hc);
static void freeCopyEngines(struct gcommDev* d);

/* the profiler section, at the end */
static void profStage(struct gcommDevProf* p, int work, void* parent);
static uint64_t* profTake(gcommComm_t comm, const gcommDevLaunch_t* a);
static void profReap(gcommComm_t comm, int all);
static void profFree(struct gcommDevProf* p);

#define CUDA_CHECK(comm, peer, call)                                                \
  do {                                                                              \
    cudaError_t e_ = (call);                                                        \
    if (e_ != cudaSuccess)                                                          \
      return GCOMM_ERROR(comm, gcommDeviceError, peer, "%s failed: %s (%s)", #call, \
                         cudaGetErrorName(e_), cudaGetErrorString(e_));             \
  } while (0)

gcommResult_t gcommDeviceSelect(gcommComm_t comm, const gcommConfig_t* config) {
  int want = config ? config->device : GCOMM_CONFIG_UNDEF_INT, count = 0;
  comm->device = GCOMM_DEVICE_HOST;
  if (want == GCOMM_DEVICE_HOST) return gcommSuccess;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    if (want == GCOMM_CONFIG_UNDEF_INT) return gcommSuccess; /* no GPU: a host communicator */
    return GCOMM_ERROR(comm, gcommInvalidArgument, -1, "config->device %d: no CUDA device", want);
  }
  if (want == GCOMM_CONFIG_UNDEF_INT) CUDA_CHECK(comm, -1, cudaGetDevice(&want));
  if (want < 0 || want >= count)
    return GCOMM_ERROR(comm, gcommInvalidArgument, -1,
                       "config->device %d is not a CUDA device (0..%d)", want, count - 1);
  comm->device = want;
  CUDA_CHECK(comm, -1,
             cudaDeviceGetAttribute(&comm->deviceSMs, cudaDevAttrMultiProcessorCount, want));
  CUDA_CHECK(comm, -1,
             cudaDeviceGetAttribute(&comm->deviceCcMajor, cudaDevAttrComputeCapabilityMajor, want));
  /* the GPU's PCI address: ranks of a node that share a GPU have the same */
  int domain = 0, bus = 0, dev = 0;
  CUDA_CHECK(comm, -1, cudaDeviceGetAttribute(&domain, cudaDevAttrPciDomainId, want));
  CUDA_CHECK(comm, -1, cudaDeviceGetAttribute(&bus, cudaDevAttrPciBusId, want));
  CUDA_CHECK(comm, -1, cudaDeviceGetAttribute(&dev, cudaDevAttrPciDeviceId, want));
  comm->devicePci = ((uint64_t)domain << 16) | ((uint64_t)bus << 8) | (uint64_t)dev;
  comm->deviceMps = 0;
#ifndef GCOMM_HIP /* ROCm has no MPS: processes sharing a GPU always time-slice it */
  CUDA_CHECK(comm, -1, cudaDeviceGetAttribute(&comm->deviceMps, cudaDevAttrMpsEnabled, want));
#endif
  return gcommSuccess;
}

/* Runs with comm's device current, restoring the caller's. */
#define WITH_DEVICE(comm, old) \
  int old = -1;                \
  cudaGetDevice(&old);         \
  if (old != (comm)->device) cudaSetDevice((comm)->device)
#define RESTORE_DEVICE(comm, old) \
  if (old >= 0 && old != (comm)->device) cudaSetDevice(old)

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
  *shmBytes = 0;
  if (all == NULL) return GCOMM_ERROR(comm, gcommSystemError, -1, "out of memory");
  int rc = MPI_Allgather(&mine, sizeof(mine), MPI_BYTE, all, sizeof(mine), MPI_BYTE, comm->mpiComm);
  int noPeer = rc == MPI_SUCCESS && comm->device >= 0 ? peerWithoutAccess(comm, all) : -1;
  int staged = 0, ask = comm->device >= 0 && (comm->params.p2pDisable || noPeer >= 0);
  int noPeerDevice = noPeer >= 0 ? all[noPeer].device : -1;
  free(all);
  if (rc == MPI_SUCCESS) /* every rank reaches this one: no early return above */
    rc = MPI_Allreduce(&ask, &staged, 1, MPI_INT, MPI_MAX, comm->mpiComm);
  if (rc != MPI_SUCCESS)
    return GCOMM_ERROR(comm, gcommSystemError, -1, "FIFO placement exchange failed (MPI error %d)",
                       rc);
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
static gcommResult_t registerArea(gcommComm_t comm, int rank, char** region) {
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

gcommResult_t gcommDeviceSetup(gcommComm_t comm, gcommCard_t* card) {
  struct gcommDev* d = comm->dev;
  CUDA_CHECK(comm, -1, cudaSetDevice(comm->device));
  /* every kernel's code and stack now, not at its first launch (gcommKernelsLoad says why) */
  size_t stackBytes = 0;
  cudaError_t loaded = (cudaError_t)gcommKernelsLoad(&stackBytes);
  if (loaded != cudaSuccess)
    return GCOMM_ERROR(comm, gcommDeviceError, -1, "loading the kernels failed: %s (%s)",
                       cudaGetErrorName(loaded), cudaGetErrorString(loaded));
  GCOMM_INFO(GCOMM_SUBSYS_INIT, comm,
             "GPU %d: kernels loaded, %zu bytes of stack a thread reserved", comm->device,
             stackBytes);
  d->peerRegion = calloc(comm->nranks, sizeof(char*));
  d->args = malloc(sizeof(gcommDevLaunch_t));
  if (d->peerRegion == NULL || d->args == NULL)
    return GCOMM_ERROR(comm, gcommSystemError, -1, "out of memory");
  if (d->staged) {
    /* a new shm area reads zero: counters at 0, no stale LL flag */
    GCOMM_CHECK(registerArea(comm, comm->rank, &d->region));
  } else {
    CUDA_CHECK(comm, -1, gcommGpuMallocFifo((void**)&d->region, d->regionBytes));
    /* counters start at 0, and LL slots must hold no stale flag */
    CUDA_CHECK(comm, -1, cudaMemset(d->region, 0, d->regionBytes));
    cudaIpcMemHandle_t h;
    CUDA_CHECK(comm, -1, cudaIpcGetMemHandle(&h, d->region));
    memcpy(card->devHandle, &h,
           sizeof(h) < sizeof(card->devHandle) ? sizeof(h) : sizeof(card->devHandle));
  }
  size_t stepBytes = GCOMM_DEV_COUNTERS * sizeof(uint64_t) * comm->nLanes * comm->nranks;
  CUDA_CHECK(comm, -1, cudaMalloc((void**)&d->steps, stepBytes));
  CUDA_CHECK(comm, -1, cudaMemset(d->steps, 0, stepBytes));
  CUDA_CHECK(comm, -1, cudaHostAlloc(&d->hostMapped, 4096, cudaHostAllocMapped));
  memset(d->hostMapped, 0, 4096);
  CUDA_CHECK(comm, -1, cudaDeviceSynchronize());
  GCOMM_INFO(GCOMM_SUBSYS_INIT, comm,
             "GPU %d: FIFO region of %zu bytes in %s (%d local ranks x %d lanes)", comm->device,
             d->regionBytes, d->staged ? "pinned shared host memory" : "GPU memory", comm->nLocal,
             comm->nLanes);
  return gcommSuccess;
}

/* The mapped page d->hostMapped: the abort flag, the kernels' first error, their waiting flag. */
#define HOST_ERROR_OFF 64
#define HOST_WAITING_OFF 192
static volatile int* hostAbort(struct gcommDev* d) {
  return (volatile int*)d->hostMapped;
}
static gcommDevError_t* hostError(struct gcommDev* d) {
  return (gcommDevError_t*)((char*)d->hostMapped + HOST_ERROR_OFF);
}
static volatile int* hostWaiting(struct gcommDev* d) {
  return (volatile int*)((char*)d->hostMapped + HOST_WAITING_OFF);
}

/* Whether a proxy on the progress thread moves some of the kernels' FIFOs: the network's
 * (connectRemote) or the copy engines' (connectCopyEngines). Their kernels then set the waiting
 * flag, and the thread polls while they run. */
static int proxied(struct gcommDev* d) {
  return d->netFifos != NULL || d->nCe > 0;
}

#ifdef GCOMM_OFI
/* The network FIFO slots in GPU memory, one cudaMalloc of bytes registered with FI_HMEM: 1, or 0
 * (staged) with *why saying why. A registration that fails stages with GCOMM_NET_GDR=auto (its
 * error logged), and is an error with GCOMM_NET_GDR=1. */
static gcommResult_t netSlotsOnGpu(gcommComm_t comm, size_t bytes, int* onGpu, const char** why) {
  struct gcommDev* d = comm->dev;
  *onGpu = gcommNetDeviceMemory(comm, why);
  if (!*onGpu) return gcommSuccess;
  CUDA_CHECK(comm, -1, cudaMalloc((void**)&d->netSlots, bytes));
  gcommResult_t res = gcommNetRegister(comm, d->netSlots, bytes, comm->device);
  if (res == gcommSuccess || comm->params.netGdr == GCOMM_NET_GDR_ON) return res;
  cudaFree(d->netSlots);
  d->netSlots = NULL;
  *onGpu = 0;
  *why = "the provider could not register GPU memory (the error above)";
  return gcommSuccess;
}

gcommResult_t gcommDeviceNetFence(gcommComm_t comm) {
  CUDA_CHECK(comm, -1, cudaStreamSynchronize(NULL)); /* the legacy default stream */
  return gcommSuccess;
}

/* Each rank on another node gets, per lane, a send and a receive FIFO: its counters (gcommFifo_t)
 * in pinned host memory mapped for the GPU, one allocation for all of them, where the proxy reads
 * them without CUDA calls; its GCOMM_STEPS slots right after them there (staged: 2 x nLanes x
 * (GCOMM_STEPS x slotBytes + a page) per remote rank), or, when the provider takes GPU memory
 * (FI_HMEM, netSlotsOnGpu), in one cudaMalloc registered with it, the messages going from and into
 * the GPU's memory directly. The host view goes to comm->sendConns / recvConns and
 * gcommNetConnect (the progress thread moves the slots); the device aliases of the same tail,
 * head, bytes[] and slots go to the kernels' connections hc (send to p at [lane * n + p], receive
 * at nc + that), which work the same either way. Both count steps from 0: the send FIFO's tail is
 * the kernel's (slots filled) and its head the network's (sends completed); the receive FIFO's
 * tail is the network's (receives completed, bytes[] written first) and its head the kernel's
 * (slots drained). */
static gcommResult_t connectRemote(gcommComm_t comm, gcommDevConn_t* hc, uint64_t* steps) {
  struct gcommDev* d = comm->dev;
  int n = comm->nranks, me = comm->rank, nRemote = 0;
  for (int p = 0; p < n; p++) nRemote += comm->cards[p].hostId != comm->cards[me].hostId;
  if (nRemote == 0) return gcommSuccess;
  size_t nFifos = (size_t)nRemote * comm->nLanes * 2, nc = (size_t)comm->nLanes * n;
  size_t slotsBytes = GCOMM_STEPS * comm->slotBytes;
  int onGpu = 0;
  const char* why = NULL;
  GCOMM_CHECK(netSlotsOnGpu(comm, nFifos * slotsBytes, &onGpu, &why));
  _Static_assert(sizeof(gcommFifo_t) <= GCOMM_DEV_FIFO_HDR, "a FIFO header holds gcommFifo_t");
  size_t fifoBytes =
      onGpu ? GCOMM_DEV_FIFO_HDR : (sizeof(gcommFifo_t) + slotsBytes + 4095) & ~(size_t)4095;
  size_t bytes = fifoBytes * nFifos;
  CUDA_CHECK(comm, -1, cudaHostAlloc((void**)&d->netFifos, bytes, cudaHostAllocMapped));
  memset(d->netFifos, 0, bytes); /* counters start at 0 */
  if (!onGpu) GCOMM_CHECK(gcommNetRegister(comm, d->netFifos, bytes, -1));
  char* dev = NULL;
  CUDA_CHECK(comm, -1, cudaHostGetDevicePointer((void**)&dev, d->netFifos, 0));
  size_t k = 0;
  for (int p = 0; p < n; p++) {
    if (comm->cards[p].hostId == comm->cards[me].hostId) continue;
    for (int lane = 0; lane < comm->nLanes; lane++) {
      for (int isSend = 1; isSend >= 0; isSend--, k++) {
        size_t i = (size_t)lane * n + p, at = isSend ? i : nc + i;
        gcommConn_t* c = isSend ? &comm->sendConns[i] : &comm->recvConns[i];
        gcommFifo_t* f = (gcommFifo_t*)(dev + k * fifoBytes); /* the device's alias */
        c->fifo = (gcommFifo_t*)(d->netFifos + k * fifoBytes);
        c->slots = onGpu ? d->netSlots + k * slotsBytes : (char*)(c->fifo + 1);
        c->step = 0;
        c->slotBytes = comm->slotBytes;
        c->peer = p;
        GCOMM_CHECK(gcommNetConnect(comm, c, p, lane, isSend));
        hc[at].tail = &f->tail;
        hc[at].head = &f->head;
        hc[at].bytes = f->bytes;
        hc[at].slots = onGpu ? c->slots : (char*)(f + 1);
        hc[at].llSlots = NULL; /* LL is never chosen between nodes */
        hc[at].step = steps + at;
      }
    }
  }
  if (onGpu)
    GCOMM_INFO(GCOMM_SUBSYS_INIT | GCOMM_SUBSYS_NET, comm,
               "GPU %d: %d remote ranks, %zu network FIFOs: slots in GPU memory registered with "
               "FI_HMEM (%zu bytes), counters in pinned host memory (%zu bytes)",
               comm->device, nRemote, k, nFifos * slotsBytes, bytes);
  else
    GCOMM_INFO(GCOMM_SUBSYS_INIT | GCOMM_SUBSYS_NET, comm,
               "GPU %d: %d remote ranks, %zu network FIFOs of %zu bytes staged in pinned host "
               "memory (%zu bytes): no FI_HMEM: %s",
               comm->device, nRemote, k, fifoBytes, bytes, why);
  return gcommSuccess;
}
#endif

gcommResult_t gcommDeviceConnect(gcommComm_t comm) {
  struct gcommDev* d = comm->dev;
  int me = comm->rank, n = comm->nranks, myIdx = gcommLocalIndex(comm, me);
  CUDA_CHECK(comm, -1, cudaSetDevice(comm->device));
  for (int p = 0; p < n; p++) {
    int pd = comm->cards[p].device;
    if (p != me && pd < 0)
      return GCOMM_ERROR(comm, gcommInvalidUsage, p,
                         "rank %d has a host communicator and this rank a GPU one: every rank "
                         "must choose alike (config.device)",
                         p);
    if (p == me || comm->cards[p].hostId != comm->cards[me].hostId) continue;
    if (d->staged) { /* GPUs without peer access were seen by gcommDevicePlaceFifos */
      GCOMM_CHECK(registerArea(comm, p, &d->peerRegion[p]));
      continue;
    }
    cudaIpcMemHandle_t h;
    memcpy(&h, comm->cards[p].devHandle, sizeof(h));
    void* m = NULL;
    CUDA_CHECK(comm, p, cudaIpcOpenMemHandle(&m, h, cudaIpcMemLazyEnablePeerAccess));
    d->peerRegion[p] = m;
  }
  size_t nc = (size_t)comm->nLanes * n;
  gcommDevConn_t* hc = calloc(2 * nc, sizeof(gcommDevConn_t));
  if (hc == NULL) return GCOMM_ERROR(comm, gcommSystemError, -1, "out of memory");
  uint64_t* steps = d->steps;
  for (int p = 0; p < n; p++) {
    if (comm->cards[p].hostId != comm->cards[me].hostId) continue;
    char* peer = p == me ? d->region : d->peerRegion[p];
    int pIdx = gcommLocalIndex(comm, p);
    for (int lane = 0; lane < comm->nLanes; lane++) {
      size_t i = (size_t)lane * n + p;
      /* send to p: p's FIFO [me][lane], head in my region [p][lane] */
      char* f = peer + ((size_t)myIdx * comm->nLanes + lane) * d->fifoBytes;
      hc[i].tail = (volatile uint64_t*)f;
      hc[i].bytes = (volatile uint64_t*)(f + 64);
      hc[i].slots = f + GCOMM_DEV_FIFO_HDR;
      hc[i].llSlots = hc[i].slots + GCOMM_STEPS * comm->slotBytes;
      hc[i].head =
          (volatile uint64_t*)(d->region + d->headOff +
                               ((size_t)pIdx * comm->nLanes + lane) * GCOMM_DEV_HEAD_BYTES);
      hc[i].step = steps + i;
      /* receive from p: my FIFO [p][lane], head in p's region [me][lane] */
      f = d->region + ((size_t)pIdx * comm->nLanes + lane) * d->fifoBytes;
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
  gcommResult_t res = connectCopyEngines(comm, hc);
#ifdef GCOMM_OFI
  if (res == gcommSuccess && comm->net != NULL) res = connectRemote(comm, hc, steps);
#endif
  if (res != gcommSuccess) {
    free(hc);
    return res;
  }
  cudaError_t e = cudaMalloc((void**)&d->conns, 2 * nc * sizeof(gcommDevConn_t));
  if (e == cudaSuccess)
    e = cudaMemcpy(d->conns, hc, 2 * nc * sizeof(gcommDevConn_t), cudaMemcpyHostToDevice);
  free(hc);
  if (e != cudaSuccess)
    return GCOMM_ERROR(comm, gcommDeviceError, -1, "connection table: %s", cudaGetErrorString(e));
  char* hm = d->hostMapped;
  void *abortDev, *errDev, *waitingDev = NULL;
  CUDA_CHECK(comm, -1, cudaHostGetDevicePointer(&abortDev, hm, 0));
  CUDA_CHECK(comm, -1, cudaHostGetDevicePointer(&errDev, hm + HOST_ERROR_OFF, 0));
  if (proxied(d))
    CUDA_CHECK(comm, -1, cudaHostGetDevicePointer(&waitingDev, hm + HOST_WAITING_OFF, 0));
  d->host.rank = me;
  d->host.nranks = n;
  d->host.nLanes = comm->nLanes;
  d->host.slotBytes = comm->slotBytes;
  d->host.send = d->conns;
  d->host.recv = d->conns + nc;
  d->host.steps = steps;
  d->host.abortFlag = abortDev;
  d->host.error = errDev;
  d->host.waiting = waitingDev;
  d->host.timeoutNs = (unsigned long long)comm->params.timeoutMs * 1000000ull;
  CUDA_CHECK(comm, -1, cudaMalloc((void**)&d->devComm, sizeof(gcommDevComm_t)));
  CUDA_CHECK(comm, -1,
             cudaMemcpy(d->devComm, &d->host, sizeof(gcommDevComm_t), cudaMemcpyHostToDevice));
  return res;
}

/* Records that stream holds this communicator's latest launch on it, for destroy's wait. A launch
 * captured into a graph is not marked: an event recorded in capture cannot be queried after. */
static gcommResult_t markLaunch(gcommComm_t comm, cudaStream_t stream) {
  struct gcommDev* d = comm->dev;
  enum cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  CUDA_CHECK(comm, -1, cudaStreamIsCapturing(stream, &capture));
  if (capture != cudaStreamCaptureStatusNone) return gcommSuccess;
  int i = 0;
  while (i < d->nMarks && d->marks[i].stream != stream) i++;
  if (i == d->nMarks) { /* a new stream: take the mark of one whose work is done, or a new one */
    i = 0;
    while (i < d->nMarks && cudaEventQuery(d->marks[i].done) == cudaErrorNotReady) i++;
    if (i == d->nMarks) {
      launchMark_t* m = realloc(d->marks, (d->nMarks + 1) * sizeof(launchMark_t));
      if (m == NULL) return GCOMM_ERROR(comm, gcommSystemError, -1, "out of memory");
      d->marks = m;
      CUDA_CHECK(comm, -1, cudaEventCreateWithFlags(&m[i].done, cudaEventDisableTiming));
      d->nMarks++;
    }
    d->marks[i].stream = stream;
  }
  CUDA_CHECK(comm, -1, cudaEventRecord(d->marks[i].done, stream));
  __atomic_store_n(&d->lastMark, d->marks[i].done, __ATOMIC_RELEASE);
  return gcommSuccess;
}

static gcommResult_t launchBatch(gcommComm_t comm, gcommDevLaunch_t* a, void* stream) {
  struct gcommDev* d = comm->dev;
  if (a->nWorks == 0) return gcommSuccess;
  a->comm = d->devComm;
  a->hostCopy = d->host;
  a->first[a->nBlocks] = (uint16_t)a->nWorks;
  a->smallKernel = comm->smallKernel;
  a->overlap = comm->launchOverlap;
  a->times = d->prof && GCOMM_PROF_ON(comm, gcommProfileKernelCh) ? profTake(comm, a) : NULL;
  if (proxied(d)) *hostWaiting(d) = 1; /* the proxy is about to be needed */
  int e = gcommKernelLaunch(a, stream);
  if (e != cudaSuccess)
    return GCOMM_ERROR(comm, gcommDeviceError, -1, "kernel launch failed: %s",
                       cudaGetErrorString((cudaError_t)e));
  return markLaunch(comm, (cudaStream_t)stream);
}

/* The works of ops, a queue at a time (posting order inside a queue): one block per queue. A
 * single operation's works are in queue order already; a group's are sorted (stable). */
static gcommResult_t orderWorks(gcommComm_t comm, gcommOp_t* ops, int n, int* nWorks) {
  struct gcommDev* d = comm->dev;
  int total = 0;
  gcommOp_t* op = ops;
  for (int i = 0; i < n && op; i++, op = op->next) total += op->nWorks;
  if (total > d->orderCap) {
    const gcommWork_t** o = realloc(d->order, total * sizeof(*o));
    if (o == NULL) return GCOMM_ERROR(comm, gcommSystemError, -1, "out of memory");
    d->order = o;
    d->orderCap = total;
  }
  int k = 0;
  op = ops;
  for (int i = 0; i < n && op; i++, op = op->next)
    for (int w = 0; w < op->nWorks; w++) {
      const gcommWork_t* wk = &op->works[w];
      int j = k++;
      for (; j > 0 && d->order[j - 1]->queue > wk->queue; j--) d->order[j] = d->order[j - 1];
      d->order[j] = wk;
    }
  *nWorks = total;
  return gcommSuccess;
}

gcommResult_t gcommDeviceLaunch(gcommComm_t comm, gcommOp_t* ops, int n, void* stream) {
  struct gcommDev* d = comm->dev;
  gcommDevLaunch_t* a = d->args;
  int total = 0;
  GCOMM_CHECK(orderWorks(comm, ops, n, &total));
  gcommResult_t res = gcommSuccess;
  WITH_DEVICE(comm, old);
  a->nBlocks = a->nWorks = 0;
  for (int k = 0; k < total && res == gcommSuccess; k++) {
    const gcommWork_t* wk = d->order[k];
    const gcommOp_t* op = wk->op;
    int opened = k > 0 && d->order[k - 1]->queue == wk->queue && a->nWorks > 0;
    if (a->nWorks == GCOMM_DEV_MAX_WORKS || (!opened && a->nBlocks == GCOMM_DEV_MAX_WORKS)) {
      /* too many for one launch: launch what we have; queues stay ordered on the stream */
      GCOMM_WARN(comm,
                 "a group of more than %d works is split into several launches: "
                 "point-to-point inside it may deadlock",
                 GCOMM_DEV_MAX_WORKS);
      res = launchBatch(comm, a, stream);
      if (res != gcommSuccess) break;
      a->nBlocks = a->nWorks = 0;
      opened = 0;
    }
    if (!opened) a->first[a->nBlocks++] = (uint16_t)a->nWorks;
    gcommDevWork_t* dw = &a->works[a->nWorks++];
    if (d->prof) profStage(d->prof, a->nWorks - 1, op->profHandle);
    dw->sched = wk->sched;
    dw->sendbuff = op->sendbuff;
    dw->recvbuff = op->recvbuff;
    dw->nSteps = wk->nSteps;
    dw->datatype = op->datatype;
    dw->redop = op->redop;
    dw->lane = wk->lane;
    dw->proto = op->proto;
    dw->tag = op->tag;
    dw->scalar = op->scalar;
    dw->scalarPtr = op->scalarPtr;
  }
  if (res == gcommSuccess) res = launchBatch(comm, a, stream);
  RESTORE_DEVICE(comm, old);
  return res;
}

gcommResult_t gcommDeviceKernelError(gcommComm_t comm, const char* where) {
  gcommDevError_t* e = hostError(comm->dev);
  int code = e->code, stopped = gcommSuccess;
  if (code == 0) return gcommSuccess;
  /* the first error stands: kernels aborted because the network failed report that failure
   * (already recorded, naming the peer), and a kernel error is recorded only once */
  if (!__atomic_compare_exchange_n(&comm->asyncError, &stopped, code, 0, __ATOMIC_ACQ_REL,
                                   __ATOMIC_ACQUIRE))
    return stopped == gcommAborted
               ? gcommSetError(comm, gcommAborted, -1, where, "the communicator was aborted")
               : (gcommResult_t)stopped;
  const char* fn = gcommFuncName(e->func);
  if (code == gcommAborted)
    return gcommSetError(comm, gcommAborted, -1, where, "the communicator was aborted");
  if (code == gcommInvalidUsage) {
    char what[256];
    gcommDescribeMismatch(what, sizeof(what), e->got, e->expected);
    return gcommSetError(comm, gcommInvalidUsage, e->peer, where,
                         "GPU %s channel %d step %ld: rank %d made a different call: %s", fn,
                         e->lane, e->step, e->peer, what);
  }
  return gcommSetError(comm, (gcommResult_t)code, e->peer, where,
                       "GPU %s lane %d step %ld: waited more than GCOMM_TIMEOUT_MS=%lld to %s "
                       "rank %d",
                       fn, e->lane, e->step, (long long)comm->params.timeoutMs,
                       e->isRecv ? "receive from" : "send to", e->peer);
}

gcommResult_t gcommDeviceTest(gcommComm_t comm, void* stream, const char* where) {
  WITH_DEVICE(comm, old);
  cudaError_t e = cudaStreamQuery((cudaStream_t)stream);
  RESTORE_DEVICE(comm, old);
  if (comm->dev->prof) profReap(comm, 0);
  gcommResult_t kres = gcommDeviceKernelError(comm, where);
  if (kres != gcommSuccess) return kres;
  if (__atomic_load_n(&comm->abortFlag, __ATOMIC_ACQUIRE))
    return gcommSetError(comm, gcommAborted, -1, where, "the communicator was aborted");
  /* the network failed (recorded by the progress thread, naming the peer; kernels are aborted) */
  int stopped = __atomic_load_n(&comm->asyncError, __ATOMIC_ACQUIRE);
  if (stopped != gcommSuccess) return (gcommResult_t)stopped;
  if (e == cudaErrorNotReady) return gcommInProgress;
  if (e != cudaSuccess)
    return gcommSetError(comm, gcommDeviceError, -1, where, "cudaStreamQuery: %s",
                         cudaGetErrorString(e));
  return gcommSuccess;
}

static void pause_(uint64_t* idleSince) {
  uint64_t now = gcommNowNs();
  if (*idleSince == 0) *idleSince = now;
  uint64_t us = (now - *idleSince) / 1000;
  if (us < 50) return;
  if (us < 2000) {
    sched_yield();
    return;
  }
  struct timespec ts = {0, (long)(us / 16 < 200 ? us / 16 : 200) * 1000};
  nanosleep(&ts, NULL);
}

gcommResult_t gcommDeviceWait(gcommComm_t comm, void* stream, const char* where) {
  uint64_t deadline = gcommNowNs() + (uint64_t)(comm->params.timeoutMs + 1000) * 1000000;
  uint64_t idleSince = 0;
  for (;;) {
    gcommResult_t r = gcommDeviceTest(comm, stream, where);
    if (r != gcommInProgress) return r;
    if (gcommNowNs() > deadline)
      return gcommSetError(comm, gcommTimeout, -1, where,
                           "the stream's GPU work is not done after GCOMM_TIMEOUT_MS=%lld",
                           (long long)comm->params.timeoutMs);
    pause_(&idleSince);
  }
}

int gcommDeviceKernelsWaiting(gcommComm_t comm) {
  struct gcommDev* d = comm->dev;
  if (d == NULL || !proxied(d)) return 0;
  /* a launch still queued or running: its kernels will wait on the proxied FIFOs (launches are
   * enqueued far ahead of the GPU: the flag the launch set is long consumed by then) */
  cudaEvent_t last = __atomic_load_n(&d->lastMark, __ATOMIC_ACQUIRE);
  if (last != NULL) {
    /* relaxed: a query from this thread must not invalidate a graph the user captures meanwhile
     * in global mode (as NCCL's proxy threads do) */
    enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&mode);
    WITH_DEVICE(comm, old);
    int running = cudaEventQuery(last) == cudaErrorNotReady;
    RESTORE_DEVICE(comm, old);
    cudaThreadExchangeStreamCaptureMode(&mode);
    if (running) return 1;
  }
  uint64_t now = gcommNowNs();
  if (*hostWaiting(d)) { /* a waiting block sets it every few hundred polls: ~1 ms at most */
    *hostWaiting(d) = 0;
    d->waitSeenNs = now;
  }
  return d->waitSeenNs != 0 && now - d->waitSeenNs < 5000000;
}

void gcommDeviceBindThread(gcommComm_t comm) {
  if (comm->device < 0) return;
  cudaError_t e = cudaSetDevice(comm->device);
  if (e != cudaSuccess)
    GCOMM_WARN(comm, "progress thread: cudaSetDevice(%d) failed: %s", comm->device,
               cudaGetErrorString(e));
  /* relaxed: the CUDA calls made here (the provider's copies with FI_HMEM) must not fail while
   * the application captures a graph in global mode */
  enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  e = cudaThreadExchangeStreamCaptureMode(&mode);
  if (e != cudaSuccess)
    GCOMM_WARN(comm, "progress thread: cudaThreadExchangeStreamCaptureMode failed: %s",
               cudaGetErrorString(e));
}

void gcommDeviceAbort(gcommComm_t comm) {
  if (comm->dev && comm->dev->hostMapped) {
    *hostAbort(comm->dev) = 1;
    __sync_synchronize();
  }
}

int gcommDeviceBadPointer(gcommComm_t comm, const void* ptr) {
  struct gcommDev* d = comm->dev;
  struct cudaPointerAttributes at;
  if (ptr == NULL) return 0;
  /* Buffers are mostly used again and again, and the query costs a good part of a small
   * operation's host time. Only GPU memory is remembered: its addresses come from the driver's
   * own range, so one that was GPU memory never becomes pageable host memory (pinned host memory,
   * once freed, could). */
  for (int i = 0; i < GPU_POINTERS_KNOWN; i++)
    if (d->knownPointers[i] == ptr) return 0;
  if (cudaPointerGetAttributes(&at, ptr) != cudaSuccess) {
    cudaGetLastError();
    return 1;
  }
  if (gcommGpuPtrDevice(at)) d->knownPointers[d->knownNext++ % GPU_POINTERS_KNOWN] = ptr;
  return gcommGpuPtrUnregistered(at);
}

/* How many of the streams this communicator launched on still run its kernels once they have all
 * ended or the deadline has passed. A failed query counts as ended: the GPU reports the failure
 * to every later call anyway. */
static int waitLaunches(struct gcommDev* d, uint64_t deadline) {
  uint64_t idleSince = 0;
  for (;;) {
    int busy = 0;
    for (int i = 0; i < d->nMarks; i++)
      busy += cudaEventQuery(d->marks[i].done) == cudaErrorNotReady;
    if (busy == 0 || gcommNowNs() > deadline) return busy;
    pause_(&idleSince);
  }
}

/* MPI_Barrier with a deadline: gcommSuccess, gcommTimeout (the request is left pending: a
 * collective cannot be cancelled, and the communicator's MPI_Comm_free lets it finish), or an MPI
 * failure. */
static gcommResult_t barrierBefore(gcommComm_t comm, uint64_t deadline) {
  MPI_Request req;
  int done = 0, rc = MPI_Ibarrier(comm->mpiComm, &req);
  uint64_t idleSince = 0;
  while (rc == MPI_SUCCESS) {
    rc = MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS || done) break;
    if (gcommNowNs() > deadline)
      return GCOMM_ERROR(comm, gcommTimeout, -1,
                         "waited GCOMM_TIMEOUT_MS=%lld for every rank to reach gcommCommDestroy "
                         "(MPI_Ibarrier): a peer's kernels may still use this rank's FIFOs, "
                         "which stay allocated",
                         (long long)comm->params.timeoutMs);
    pause_(&idleSince);
  }
  if (rc != MPI_SUCCESS)
    return GCOMM_ERROR(comm, gcommSystemError, -1,
                       "destroy's barrier failed (MPI error %d): this rank's FIFOs stay allocated",
                       rc);
  return gcommSuccess;
}

gcommResult_t gcommDeviceQuiesce(gcommComm_t comm) {
  struct gcommDev* d = comm->dev;
  int finalized = 1, initialized = 0;
  if (d == NULL) return gcommSuccess;
  /* kernels end by themselves: done, their own deadline passed, or aborted */
  uint64_t timeoutNs = (uint64_t)comm->params.timeoutMs * 1000000;
  int busy = waitLaunches(d, gcommNowNs() + timeoutNs + 1000000000ull);
  if (d->prof) profReap(comm, 1); /* every launch has ended (or never will: reported now) */
  if (busy > 0) {
    d->keepMemory = 1;
    gcommDeviceAbort(comm); /* a kernel that starts later ends at once */
    return GCOMM_ERROR(comm, gcommTimeout, -1,
                       "GPU %d: this communicator's kernels on %d of the %d streams it launched "
                       "on have not ended within GCOMM_TIMEOUT_MS=%lld + 1 s (queued behind other "
                       "work?); the memory they use stays allocated",
                       comm->device, busy, d->nMarks, (long long)comm->params.timeoutMs);
  }
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized || __atomic_load_n(&comm->abortFlag, __ATOMIC_ACQUIRE) ||
      __atomic_load_n(&comm->asyncError, __ATOMIC_ACQUIRE) != gcommSuccess ||
      hostError(d)->code != 0)
    return gcommSuccess; /* failed: the other ranks may never come */
  gcommResult_t res = barrierBefore(comm, gcommNowNs() + timeoutNs);
  if (res != gcommSuccess) d->keepMemory = 1;
  return res;
}

void gcommDeviceFree(gcommComm_t comm) {
  struct gcommDev* d = comm->dev;
  if (d == NULL) return;
  int old = -1;
  cudaGetDevice(&old);
  if (comm->device >= 0) cudaSetDevice(comm->device);
  for (int i = 0; i < d->nMarks; i++) cudaEventDestroy(d->marks[i].done);
  freeCopyEngines(d);   /* first: its copies write into the peers' regions */
  if (!d->keepMemory) { /* else a kernel may still run: leaked, never reused under it */
    for (int p = 0; d->peerRegion && p < comm->nranks; p++) {
      if (d->peerRegion[p] == NULL) continue;
      if (d->staged)
        cudaHostUnregister(gcommShmArea(comm, p));
      else
        cudaIpcCloseMemHandle(d->peerRegion[p]);
    }
    if (d->region && d->staged) cudaHostUnregister(gcommShmArea(comm, comm->rank));
    if (d->region && !d->staged) cudaFree(d->region);
    if (d->steps) cudaFree(d->steps);
    if (d->conns) cudaFree(d->conns);
    if (d->devComm) cudaFree(d->devComm);
    if (d->hostMapped) cudaFreeHost(d->hostMapped);
    if (d->netFifos) cudaFreeHost(d->netFifos); /* after gcommNetFree: no receive lands there */
    if (d->netSlots) cudaFree(d->netSlots);
    if (d->prof) profFree(d->prof);
  }
  if (old >= 0) cudaSetDevice(old);
  free(d->marks);
  free(d->peerRegion);
  free(d->args);
  free(d->order);
  free(d);
  comm->dev = NULL;
}

/* ======================================================================================== */
/* Copy engines (GCOMM_P2P_USE_CUDA_MEMCPY=1): the kernels' sends to a local peer go to a   */
/* staging FIFO in this rank's GPU memory, which the progress thread copies into the peer's */
/* FIFO with cudaMemcpyAsync: the slots' data and words, then the tail, in one stream per   */
/* peer, so that the tail lands after what it publishes.                                    */
/* ======================================================================================== */

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
static gcommResult_t connectCopyEngines(gcommComm_t comm, gcommDevConn_t* hc) {
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
static void freeCopyEngines(struct gcommDev* d) {
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

/* ======================================================================================== */
/* Profiler: kernel-channel timestamps. With a plugin, each launch gets a slot of mapped host */
/* memory where thread 0 of each block writes %globaltimer at the start and stop of each of  */
/* its works; once every stop is there (or the GPU is idle), the host converts them to its   */
/* clock (offset measured once by a ping kernel) and reports one KernelCh event per work.    */
/* ======================================================================================== */

#define PROF_LAUNCHES 128 /* launches timed at once; more in flight are reported unmeasured */
#define PROF_SLOT_WORDS (2 * GCOMM_DEV_MAX_WORKS)

typedef struct {
  int busy, nWorks;
  uint64_t launchNs; /* host clock just before the launch: no work started earlier */
  void* parent[GCOMM_DEV_MAX_WORKS];
  int lane[GCOMM_DEV_MAX_WORKS];
} profLaunch_t;

struct gcommDevProf {
  uint64_t* hostTimes; /* mapped: [PROF_LAUNCHES][PROF_SLOT_WORDS], then 4 ping flags */
  uint64_t* devTimes;  /* the same, as the device sees it */
  int64_t offsetNs;    /* host CLOCK_MONOTONIC - %globaltimer */
  pthread_mutex_t lock;
  void* parent[GCOMM_DEV_MAX_WORKS]; /* the launch being staged: each work's Coll/P2p handle */
  profLaunch_t launches[PROF_LAUNCHES];
};

/* Host time = GPU time + offset, taken as the middle of the shortest of a few round trips in
 * which the host releases a waiting kernel that then reads its clock. */
static const char* profCalibrate(struct gcommDevProf* p) {
  volatile uint64_t* flags = p->hostTimes + (size_t)PROF_LAUNCHES * PROF_SLOT_WORDS;
  cudaStream_t s;
  cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (e != cudaSuccess) return cudaGetErrorString(e);
  uint64_t best = UINT64_MAX;
  for (int i = 0; i < 3 && e == cudaSuccess; i++) {
    for (int k = 0; k < 4; k++) flags[k] = 0;
    e = (cudaError_t)gcommKernelTimerPing(p->devTimes + (size_t)PROF_LAUNCHES * PROF_SLOT_WORDS, s);
    if (e != cudaSuccess) break;
    uint64_t deadline = gcommNowNs() + 1000000000ull;
    while (flags[0] == 0 && gcommNowNs() < deadline) {
    }
    uint64_t t0 = gcommNowNs();
    flags[1] = 1;
    __sync_synchronize();
    while (flags[3] == 0 && gcommNowNs() < deadline + 1000000000ull) {
    }
    uint64_t t1 = gcommNowNs();
    e = cudaStreamSynchronize(s);
    if (e == cudaSuccess && flags[3] != 0 && t1 - t0 < best) {
      best = t1 - t0;
      p->offsetNs = (int64_t)(t0 + (t1 - t0) / 2) - (int64_t)flags[2];
    }
  }
  cudaStreamDestroy(s);
  if (e != cudaSuccess) return cudaGetErrorString(e);
  return best == UINT64_MAX ? "the clock ping kernel did not answer within 1 s" : NULL;
}

void gcommDeviceProfSetup(gcommComm_t comm) {
  struct gcommDev* d = comm->dev;
  struct gcommDevProf* p = calloc(1, sizeof(*p));
  const char* why = p ? NULL : "out of memory";
  if (p) pthread_mutex_init(&p->lock, NULL);
  size_t bytes = ((size_t)PROF_LAUNCHES * PROF_SLOT_WORDS + 4) * sizeof(uint64_t);
  WITH_DEVICE(comm, old);
  cudaError_t e =
      why ? cudaSuccess : cudaHostAlloc((void**)&p->hostTimes, bytes, cudaHostAllocMapped);
  if (!why && e == cudaSuccess) {
    memset(p->hostTimes, 0, bytes);
    e = cudaHostGetDevicePointer((void**)&p->devTimes, p->hostTimes, 0);
  }
  if (!why) why = e != cudaSuccess ? cudaGetErrorString(e) : profCalibrate(p);
  RESTORE_DEVICE(comm, old);
  if (why != NULL) {
    GCOMM_WARN(comm, "profiler: no kernel timestamps on GPU %d: %s", comm->device, why);
    if (p) profFree(p);
    return;
  }
  d->prof = p;
  GCOMM_INFO(GCOMM_SUBSYS_PROFILE, comm, "GPU %d: %%globaltimer + %lld ns = host time",
             comm->device, (long long)p->offsetNs);
}

/* The launch being staged: work's parent event. */
static void profStage(struct gcommDevProf* p, int work, void* parent) {
  p->parent[work] = parent;
}

/* A free slot for launch a (its timestamps' device address), or NULL when every slot is taken:
 * its works are then reported at once as unmeasured, so that every work has its event. */
static uint64_t* profTake(gcommComm_t comm, const gcommDevLaunch_t* a) {
  struct gcommDevProf* p = comm->dev->prof;
  profReap(comm, 0);
  pthread_mutex_lock(&p->lock);
  int i = 0;
  while (i < PROF_LAUNCHES && p->launches[i].busy) i++;
  if (i == PROF_LAUNCHES) {
    pthread_mutex_unlock(&p->lock);
    for (int w = 0; w < a->nWorks; w++)
      gcommProfKernelCh(comm, p->parent[w], a->works[w].lane, 0, 0);
    return NULL;
  }
  profLaunch_t* l = &p->launches[i];
  l->busy = 1;
  l->nWorks = a->nWorks;
  l->launchNs = gcommNowNs();
  for (int w = 0; w < a->nWorks; w++) {
    l->parent[w] = p->parent[w];
    l->lane[w] = a->works[w].lane;
  }
  memset(p->hostTimes + (size_t)i * PROF_SLOT_WORDS, 0, 2 * a->nWorks * sizeof(uint64_t));
  pthread_mutex_unlock(&p->lock);
  return p->devTimes + (size_t)i * PROF_SLOT_WORDS;
}

/* GPU time to host time, inside [from, to] (what the host saw bounds what the clocks' offset
 * may blur); 0 stays 0: never written. */
static uint64_t profHostNs(const struct gcommDevProf* p, uint64_t gpuNs, uint64_t from,
                           uint64_t to) {
  if (gpuNs == 0) return 0;
  int64_t t = (int64_t)gpuNs + p->offsetNs;
  return t < (int64_t)from ? from : t > (int64_t)to ? to : (uint64_t)t;
}

/* Reports the launches whose works have all stopped (all: every launch, the GPU being idle). */
static void profReap(gcommComm_t comm, int all) {
  struct gcommDevProf* p = comm->dev->prof;
  pthread_mutex_lock(&p->lock);
  uint64_t now = gcommNowNs();
  for (int i = 0; i < PROF_LAUNCHES; i++) {
    profLaunch_t* l = &p->launches[i];
    volatile uint64_t* t = p->hostTimes + (size_t)i * PROF_SLOT_WORDS;
    if (!l->busy) continue;
    int done = 1;
    for (int w = 0; w < l->nWorks && done && !all; w++) done = t[2 * w + 1] != 0;
    if (!done) continue;
    __sync_synchronize(); /* the stops before the starts they follow */
    for (int w = 0; w < l->nWorks; w++) {
      uint64_t start = profHostNs(p, t[2 * w], l->launchNs, now);
      uint64_t stop = start ? profHostNs(p, t[2 * w + 1], start, now) : 0;
      gcommProfKernelCh(comm, l->parent[w], l->lane[w], stop ? start : 0, stop);
    }
    l->busy = 0;
  }
  pthread_mutex_unlock(&p->lock);
}

static void profFree(struct gcommDevProf* p) {
  if (p->hostTimes) cudaFreeHost(p->hostTimes);
  pthread_mutex_destroy(&p->lock);
  free(p);
}
