/*
 * gcomm_gpu_engine.h - what the GPU engine's files (gcomm_gpu_engine.c: select, launch, wait,
 * test, quiesce, abort; gcomm_gpu_copy.c: copy engines; gcomm_gpu_prof.c: kernel timestamps;
 * gcomm_gpu_net.c: network FIFOs staged for the kernels) and the IPC transport (transports/p2p.c)
 * share: a GPU communicator's state (struct gcommDev), the CUDA error idiom, and their functions
 * for one another. C only (gcomm_device.h holds what the kernels see); the CUDA and HIP builds.
 */
#ifndef GCOMM_GPU_ENGINE_H
#define GCOMM_GPU_ENGINE_H

#include "gcomm_device.h"
#include "gcomm_gpu.h" /* CUDA, or HIP (GCOMM_HIP) under the same cuda* names */

/* A stream this communicator launched on, and an event recorded after its latest launch there. */
typedef struct {
  cudaStream_t stream;
  cudaEvent_t done;
} launchMark_t;

/* GPU memory mapped for the CPU by gdrcopy (gcomm_gpu_proxy.c) */
typedef struct {
  void* alloc;                 /* cudaMalloc'd */
  char* gpu;                   /* its first whole GPU page, which the mapping starts at */
  struct gcommGdrMapping* map; /* the CPU's view */
} gpuMapping_t;

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
  char* ceSlots; /* cudaMalloc: every connection's FIFO in GPU memory (staging or mirror) */
  char* ceHdrs;  /* cudaHostAlloc'd, mapped: every connection's staging header, tail values */
  /* the proxy (gcomm_gpu_proxy.c): its own context (GCOMM_CREATE_THREAD_CONTEXT) or NULL, and
   * gdrcopy's mappings: the staging headers in GPU memory (GCOMM_GDRCOPY_SYNC_ENABLE), a word read
   * to flush the network's writes into GPU memory (GCOMM_GDRCOPY_FLUSH_ENABLE) */
  void* proxyCtx;
  struct gcommGdr* gdr;
  int gdrMissing;
  gpuMapping_t syncMem, flushMem;
  char* ceSync;                      /* syncMem's GPU address, or NULL: headers in ceHdrs */
  struct gcommGdrMapping* ceSyncMap; /* syncMem's mapping */
  volatile uint64_t* flushWord;      /* flushMem as the CPU reads it, or NULL */

  /* ranks all on one GPU, run by stream-ordered copies (gcomm_gpu_shared.c), or NULL */
  struct gcommShared* shared;
  /* graph-captured collectives straight between the ranks' buffers (gcomm_gpu_direct.c), or NULL */
  struct gcommDirect* direct;

  /* the profiler's kernel timestamps (section at the end), or NULL */
  struct gcommDevProf* prof;
  const gcommWork_t** order; /* gcommDeviceLaunch: the works of a launch by queue */
  int orderCap;
  int warnedSplit;  /* the split of a group too large for one launch was said once */
  int saidFanSplit; /* the split of a group mixing Simple fan reductions was said once */
  /* gcommDeviceBadPointer: the latest buffers found in GPU memory */
  const void* knownPointers[GPU_POINTERS_KNOWN];
  unsigned knownNext;
};

#define CUDA_CHECK(comm, peer, call)                                                \
  do {                                                                              \
    cudaError_t e_ = (call);                                                        \
    if (e_ != cudaSuccess)                                                          \
      return GCOMM_ERROR(comm, gcommDeviceError, peer, "%s failed: %s (%s)", #call, \
                         cudaGetErrorName(e_), cudaGetErrorString(e_));             \
  } while (0)

/* Runs with comm's device current, restoring the caller's. */
#define WITH_DEVICE(comm, old) \
  int old = -1;                \
  cudaGetDevice(&old);         \
  if (old != (comm)->device) cudaSetDevice((comm)->device)
#define RESTORE_DEVICE(comm, old) \
  if (old >= 0 && old != (comm)->device) cudaSetDevice(old)

/* ---- transports/p2p.c: the FIFO regions of a node's GPUs, shared through CUDA IPC ---- */
/* Registers rank's shm area (its staged region) with CUDA in this process; *region: the address
 * this process's kernels use for it. */
gcommResult_t gcommIpcRegisterArea(gcommComm_t comm, int rank, char** region);
/* This rank's FIFO region: in its GPU's memory, exported for IPC in card->devHandle, or (staged)
 * its shm area registered with CUDA. */
gcommResult_t gcommIpcRegionCreate(gcommComm_t comm, gcommCard_t* card);
/* Opens (or registers, staged) every local peer's region: d->peerRegion. */
gcommResult_t gcommIpcOpenPeers(gcommComm_t comm);
/* The kernels' connections to the local ranks (itself included): hc[lane * n + p] sends to p,
 * hc[nc + that] receives from p, each with its step counter in steps. */
void gcommIpcFillConns(gcommComm_t comm, gcommDevConn_t* hc, uint64_t* steps);
/* Closes the peers' regions and frees this rank's (not when d->keepMemory). */
void gcommIpcClose(gcommComm_t comm);
/* The address the proxy's copies use for addr, an address of a local region as the kernels use
 * it: the host view in the owner's shm area when staged, addr itself otherwise. */
char* gcommIpcHostAddress(gcommComm_t comm, const char* addr);

/* ---- gcomm_gpu_copy.c: copy engines (GCOMM_P2P_ and GCOMM_SHM_USE_CUDA_MEMCPY) ---- */
/* Points the kernels' connections to local peers that copy engines serve at their staging or
 * mirror FIFOs (after gcommIpcFillConns). */
gcommResult_t gcommGpuCopyConnect(gcommComm_t comm, gcommDevConn_t* hc);
void gcommGpuCopyFree(gcommComm_t comm);

/* ---- gcomm_gpu_proxy.c: the proxy's CUDA context and gdrcopy mappings ---- */
/* What gcommGpuProxyEnter changed on the calling thread. */
typedef struct {
  int device;
  enum cudaStreamCaptureMode mode;
} gcommProxyCtx_t;
/* At connect: GCOMM_CREATE_THREAD_CONTEXT=1: d->proxyCtx, a context of its own (NULL where it
 * cannot be made, said at INFO); a GCOMM_GDRCOPY_FLUSH_ENABLE=1 with nothing to flush said. */
gcommResult_t gcommGpuProxySetup(gcommComm_t comm);
/* Around the proxy's CUDA calls on any thread: its context (or comm's GPU) current, relaxed
 * capture mode; Leave restores the caller's. */
gcommResult_t gcommGpuProxyEnter(gcommComm_t comm, gcommProxyCtx_t* saved);
void gcommGpuProxyLeave(gcommComm_t comm, gcommProxyCtx_t saved);
/* The progress thread's start: the proxy's context made current, 1; 0 when it has none. */
int gcommGpuProxyBind(gcommComm_t comm);
/* GCOMM_GDRCOPY_SYNC_ENABLE=1: d->ceSync, bytes of GPU memory for the staging headers mapped
 * through gdrcopy (left NULL where gdrcopy is absent or fails, said at INFO). */
void gcommGpuSyncMap(gcommComm_t comm, size_t bytes);
/* GCOMM_GDRCOPY_FLUSH_ENABLE=1: d->flushWord, a GPU word read through gdrcopy (or NULL). */
void gcommGpuFlushMap(gcommComm_t comm);
/* A read of d->flushWord, when mapped: the network's writes into GPU memory before it are done. */
void gcommGpuFlush(struct gcommDev* d);
/* Unmaps, frees, destroys the context (after gcommGpuCopyFree, whose streams live in it). */
void gcommGpuProxyFree(gcommComm_t comm);

/* ---- gcomm_gpu_shared.c: ranks that all share one GPU, without spinning kernels (CUDA) ---- */
/* Collective: this rank's staging and interprocess event, exchanged and opened by every rank. */
gcommResult_t gcommGpuSharedConnect(gcommComm_t comm);
/* One call or group's operations as stream-ordered work on stream, meeting the peers' calls. */
gcommResult_t gcommGpuSharedRun(gcommComm_t comm, gcommOp_t* ops, int n, void* stream);
void gcommGpuSharedFree(gcommComm_t comm);
/* A buffer's allocation exported for CUDA IPC: cuPointerGetAttributes (through the runtime's
 * entry points) gives its start and its id, never reused in the process; the handle made for the
 * latest send (which 0) and receive (1) buffer's allocation is kept. */
typedef struct {
  void* pointerAttributes; /* cuPointerGetAttributes, or NULL: no buffer can be exported */
  struct {
    unsigned long long id;
    cudaIpcMemHandle_t handle;
  } last[2];
} gcommBufferExport_t;
void gcommBufferExportInit(gcommBufferExport_t* x);
/* card's handle, id and offset [which] for buf; 0 when its allocation cannot be exported. */
int gcommBufferExport(gcommBufferExport_t* x, int which, const void* buf, gcommSharedCard_t* card);

/* ---- gcomm_gpu_direct.c: graph-captured collectives between mapped buffers (CUDA) ---- */
/* Collective, at connect: with GCOMM_GRAPH_REGISTER=1 on a communicator whose every rank is on
 * this node with FIFOs in GPU memory (CUDA IPC, no copy engines), each rank's mailbox, exchanged
 * and opened by every rank; nothing otherwise (d->direct stays NULL). */
gcommResult_t gcommGpuDirectConnect(gcommComm_t comm);
/* op, which gcommDeviceDirectCall takes: if every rank's buffers can be mapped, it is captured
 * as the direct kernel (*done = 1); else *done = 0 on every rank alike. Meets every rank over the
 * status pages. */
gcommResult_t gcommGpuDirectRun(gcommComm_t comm, const gcommOp_t* op, void* stream, int* done);
void gcommGpuDirectFree(gcommComm_t comm);

/* ---- gcomm_gpu_prof.c: the profiler's kernel timestamps ---- */
void gcommGpuProfStage(struct gcommDevProf* p, int work, void* parent);
uint64_t* gcommGpuProfTake(gcommComm_t comm, const gcommDevLaunch_t* a);
void gcommGpuProfReap(gcommComm_t comm, int all);
void gcommGpuProfFree(struct gcommDevProf* p);

#ifdef GCOMM_OFI
/* ---- gcomm_gpu_net.c: FIFOs to ranks on other nodes, moved by the network's proxy ---- */
gcommResult_t gcommGpuNetConnect(gcommComm_t comm, gcommDevConn_t* hc, uint64_t* steps);
/* Before a tail advances over receives into GPU memory (the network's comm->netFence): waits
 * for the copies of GPU memory that the provider issued from this thread on the legacy default
 * stream (providerCopies), and flushes a GPUDirect RDMA NIC's writes (gdrcopy's read). */
gcommResult_t gcommDeviceNetFence(gcommComm_t comm, int providerCopies);
#endif

#endif /* GCOMM_GPU_ENGINE_H */
