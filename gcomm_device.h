/*
 * gcomm_device.h - the GPU engine's internal interface (GPU builds only, CUDA or HIP: the core
 * includes it under #ifdef GCOMM_GPU; gcomm_gpu.h maps the cuda* names below to hip* for HIP).
 * transports/p2p.c owns the connection FIFOs in GPU memory, shared with the other local ranks
 * through CUDA IPC (or staged in pinned shared host memory); gcomm_kernels.cu runs the schedules of
 * gcomm_sched.h over them, one block per queue (a collective channel, or one point-to-point channel
 * of one direction to one peer: a Send/Recv is split over up to nP2pChannels of them).
 *
 * Layout of one rank's region (one cudaMalloc exported with cudaIpcGetMemHandle; or, staged
 * (GCOMM_P2P_DISABLE), an area of the rank's shm segment that every local process registers with
 * cudaHostRegister):
 *   recv FIFOs  [local sender][lane] (staged with GCOMM_SHM_LOCALITY=1: send FIFOs
 *               [local receiver][lane], in the sender's region): a 256-byte header (tail at 0,
 *               written by the sender; bytes[GCOMM_STEPS] at 64), GCOMM_STEPS slots of
 *               slotBytes (Simple), then GCOMM_STEPS LL slots of GCOMM_LL_SLOT_BYTES (zeroed
 *               at setup: no line carries a flag before it is written)
 *   send heads  [local receiver][lane]: 128 bytes, head at 0, written by the receiver
 * and, in a separate cudaMalloc that no other rank reads:
 *   steps       [GCOMM_DEV_COUNTERS][lane * nranks + peer]: this rank's own counters, persistent
 *               across launches like gcommConn_t.step: send steps, receive steps, and for each
 *               send connection the receiver's head as last read (a sender that knows the slot
 *               is free skips polling the head)
 * So each counter lives where its reader polls it: the receiver polls tail in its own memory,
 * the sender polls head in its own memory, and the remote side only stores.
 *
 * A peer on another node (make OFI=1) has no region to open: its connections are FIFOs in this
 * rank's pinned host memory (gcommFifo_t then GCOMM_STEPS slots, mapped for the GPU), a send and a
 * receive FIFO per lane, whose slots transports/net_ofi.c moves (gcommNetConnect) on the progress
 * thread. The kernel uses them like any other: it writes the send FIFO's slots, bytes[] and tail
 * and polls its head (sends completed), polls the receive FIFO's tail (receives completed, after
 * bytes[]) and writes its head. Simple protocol only: LL's flags cannot cross the proxy.
 *
 * Copy engines (GCOMM_P2P_USE_CUDA_MEMCPY=1, not staged): a send connection to another local
 * rank points slots at a staging FIFO in this rank's GPU memory and tail, bytes[] at its header
 * in mapped pinned host memory; head stays in this rank's region. The kernel cannot tell: it
 * waits for head, fills the staging slot and word, release-stores the tail (system scope), and
 * the progress thread copies slot, word and tail into the receiver's FIFO with cudaMemcpyAsync,
 * the tail last in the same stream (gcommDeviceCopyProgress). Simple protocol only, as above.
 * Staged with GCOMM_SHM_USE_CUDA_MEMCPY=1 the same staging serves sends (mode 1, 3), and
 * receives (mode 2, 3) get a mirror FIFO in this rank's GPU memory that the progress thread fills
 * from the host FIFO, tail last; the receive connection's tail, bytes[] and slots point at it.
 */
#ifndef GCOMM_DEVICE_H
#define GCOMM_DEVICE_H

#include <stdint.h>

#include "gcomm_sched.h"

#ifdef __cplusplus
extern "C" {
#endif

#define GCOMM_DEV_FIFO_HDR 256
#define GCOMM_DEV_HEAD_BYTES 128
#define GCOMM_DEV_THREADS 512
#define GCOMM_DEV_SMALL_WORKS 8   /* works a small launch carries in its parameters */
#define GCOMM_DEV_MEDIUM_WORKS 32 /* works a medium LL launch carries (1 block an SM) */
#define GCOMM_DEV_MAX_WORKS 128   /* works one launch carries at most (a bigger group is split) */

/* Which launches may start while the launch before them on the stream still runs (programmatic
 * dependent launch): none; the small and medium LL ones (two of those fit beside every rank's on a
 * shared GPU); every launch (the rank has its GPU to itself: no other rank's blocks wait for SMs
 * the next launch holds). */
#define GCOMM_OVERLAP_NONE 0
#define GCOMM_OVERLAP_SMALL_LL 1
#define GCOMM_OVERLAP_EVERY 2
/* a block keeps its lane's connections in shared memory up to this many ranks */
#define GCOMM_DEV_CACHE_RANKS 256
#define GCOMM_DEV_COUNTERS 3 /* per connection in `steps`: send, receive, known head */
/* steps a block computes at once, a thread each, into shared memory */
#define GCOMM_DEV_STEP_BATCH 32

typedef struct {
  volatile uint64_t* tail;  /* recv: in this rank's memory; send: in the receiver's */
  volatile uint64_t* head;  /* recv: in the sender's memory; send: in this rank's */
  volatile uint64_t* bytes; /* [GCOMM_STEPS], beside tail */
  char* slots;              /* GCOMM_STEPS slots, in the receiver's memory */
  char* llSlots;            /* GCOMM_STEPS LL slots, beside them */
  uint64_t* step;           /* this side's counter, in this rank's memory */
} gcommDevConn_t;

#define GCOMM_DEV_WAIT_MEET 2 /* the direct kernel's meeting (lane: its block) */
/* The first failure a kernel saw, in mapped host memory: gcommWait reports it. */
typedef struct {
  volatile int code;            /* 0, or a gcommResult_t */
  int peer, lane, isRecv, func; /* isRecv: 0 a send, 1 a receive, GCOMM_DEV_WAIT_MEET */
  long step;
  unsigned long long got, expected;
} gcommDevError_t;

typedef struct {
  int rank, nranks, nLanes;
  size_t slotBytes;
  gcommDevConn_t* send; /* device array [lane * nranks + peer] */
  gcommDevConn_t* recv;
  uint64_t* steps; /* [GCOMM_DEV_COUNTERS][nLanes * nranks]: send, receive steps; heads seen */
  volatile int* abortFlag; /* mapped host memory */
  gcommDevError_t* error;  /* mapped host memory */
  /* mapped host memory, or NULL when no proxy moves FIFOs (every rank on this node, no copy
   * engines): a block waiting on a FIFO sets it now and then, so that the progress thread keeps
   * polling the network and the copy engines' staging tails instead of napping */
  volatile int* waiting;
  unsigned long long timeoutNs;
  int claim; /* device memory: the first failing block claims the error record */
} gcommDevComm_t;

typedef struct {
  gcommSched_t sched;
  const void* sendbuff;
  void* recvbuff;
  long nSteps;
  int datatype, redop, lane, proto;
  uint32_t tag; /* gcommOp_t.tag: the high half of each slot's word (GCOMM_SLOT_WORD) */
  /* PreMulSum (redop GCOMM_OP_PREMULSUM): the scalar's bits, or where the kernel reads them */
  uint64_t scalar;
  const void* scalarPtr;
} gcommDevWork_t;

/* One launch: block b runs works[first[b] .. first[b+1]) in order. All works of a block come
 * from one queue, so they use one lane. */
typedef struct {
  gcommDevComm_t* comm;    /* device copy (the kernels' error claim word) */
  gcommDevComm_t hostCopy; /* the same, passed by value: no global load to start a block */
  uint64_t* times;         /* profiler: [2 * work] start and stop %globaltimer of each work, in
                              mapped host memory (device pointer), or NULL */
  int nBlocks, nWorks;
  /* a small or medium LL launch may run a kernel of 1 block an SM (gcommComm.smallKernel,
   * mediumKernel); overlap: which launches start their prologue while the previous launch on the
   * stream runs (programmatic dependent launch: gcommComm.launchOverlap, a GCOMM_OVERLAP_*) */
  int smallKernel, mediumKernel, overlap;
  int nThreads; /* threads a block: GCOMM_DEV_THREADS, or fewer in whole warps (at least 64) */
  uint16_t first[GCOMM_DEV_MAX_WORKS + 1];
  gcommDevWork_t works[GCOMM_DEV_MAX_WORKS];
} gcommDevLaunch_t;

/* gcomm_kernels.cu: one kernel launch on stream (a cudaStream_t). Returns a cudaError_t. */
int gcommKernelLaunch(const gcommDevLaunch_t* args, void* stream);
/* Loads the code of every kernel and reserves the local memory they need (at init: never at a
 * launch, see gcomm_kernels.cu); *stackBytes: the context's stack reservation a thread. Returns a
 * cudaError_t. */
int gcommKernelsLoad(size_t* stackBytes);
/* Profiler clock: one thread sets flags[0], waits for the host to set flags[1], then writes
 * %globaltimer to flags[2] and sets flags[3] (flags: mapped host memory, device pointer). */
int gcommKernelTimerPing(volatile uint64_t* flags, void* stream);

/* ---- gcomm_reduce_kernels.cu (CUDA only): the short kernels of ranks that share a GPU without
 * MPS (gcomm_gpu_shared.c). Each runs over inputs that have all landed and waits for nothing. */
#define GCOMM_REDUCE_MAX_INPUTS 16
typedef struct {
  const void* in[GCOMM_REDUCE_MAX_INPUTS]; /* combined in this order: the same bits everywhere */
  void* out[GCOMM_REDUCE_MAX_INPUTS]; /* the result goes to each (an all-reduce: every rank's) */
  size_t count;
  int nIn, nOut, datatype, redop;
  int divide; /* Avg: the result divided by this; 0: not */
} gcommReduceArgs_t;
/* out[k][i] = in[0][i] op in[1][i] op ... (then / divide), for every output k: an output that is
 * also an input is read before it is written (the same element). Returns a cudaError_t. */
int gcommReduceLaunch(const gcommReduceArgs_t* args, void* stream);
/* Copies rows x bytes: dst + r * dstPitch <- src + r * srcPitch (pitches in bytes), with 16-byte
 * accesses when everything is 16-byte aligned. Returns a cudaError_t. */
int gcommCopyLaunch(void* dst, size_t dstPitch, const void* src, size_t srcPitch, size_t bytes,
                    size_t rows, void* stream);
/* PreMulSum's pre-operation over rows x count elements: dst[r * dstPitch + i] = src[r * srcPitch +
 * i] * scalar (pitches in elements), the scalar's bits, or read from scalarPtr (device memory)
 * when the kernel runs. Returns a cudaError_t. */
int gcommPreMulLaunch(void* dst, size_t dstPitch, const void* src, size_t srcPitch, size_t count,
                      size_t rows, int datatype, uint64_t scalar, const void* scalarPtr,
                      void* stream);

/* ---- gcomm_direct_kernels.cu (CUDA only): a collective captured into a CUDA graph over every
 * local rank's own buffers, mapped at capture (gcomm_gpu_direct.c). Block b of each rank meets
 * block b of every other rank through their mailboxes before and after its share of
 * out[k][i] = in[0][i] op ... op in[nIn - 1][i] for every output k (or of out[k] = in[k]). */
#define GCOMM_DIRECT_MAX_RANKS 16
/* blocks a launch runs at most: each rank's mailbox words a sender */
#define GCOMM_DIRECT_BLOCKS 32
typedef struct {
  const void* in[GCOMM_DIRECT_MAX_RANKS]; /* combined in this order: the same bits everywhere */
  void* out[GCOMM_DIRECT_MAX_RANKS];      /* as this rank addresses them (mapped peers' buffers) */
  /* every rank's mailbox as this rank addresses it: [sender][GCOMM_DIRECT_BLOCKS] words, which
   * only the sender writes and only the owner reads */
  volatile uint64_t* mailbox[GCOMM_DIRECT_MAX_RANKS];
  uint64_t* meetings;   /* this rank's [GCOMM_DIRECT_BLOCKS]: how many times each block has met */
  gcommDevComm_t* comm; /* device copy: abort flag, deadline, error record and its claim */
  size_t count;         /* elements this rank combines (0: it only meets the others) */
  int nIn, nOut, datatype, redop, func, rank, nranks, nBlocks;
  int divide;    /* Avg: the result divided by this; 0: not */
  int pairs;     /* out[k] = in[k] for each k < nOut, nothing combined (count elements each) */
  int meetFirst; /* 0: the previous launch's last meeting stands for the first (nothing between) */
} gcommDirectArgs_t;
/* Returns a cudaError_t. */
int gcommDirectLaunch(const gcommDirectArgs_t* args, void* stream);

#ifdef __cplusplus
}
#endif

/* gcomm_gpu_engine.c and transports/p2p.c (C only: they need the communicator) */
#if !defined(__CUDACC__) && !defined(__HIPCC__)
#include "gcomm_internal.h"
/* Picks the device (config->device, or the current device when undefined and a GPU exists);
 * sets comm->device, GCOMM_DEVICE_HOST for a host communicator. */
gcommResult_t gcommDeviceSelect(gcommComm_t comm, const gcommConfig_t* config);
/* Collective (every rank, GPU communicator or not, before gcommShmCreate): where the FIFO regions
 * live, the same on every rank: GPU memory shared through CUDA IPC, or staged in pinned shared
 * host memory when any rank sets GCOMM_P2P_DISABLE=1 or has a GPU of its node it cannot access as
 * a peer. *shmBytes: what gcommShmCreate must reserve for the region (0: GPU memory). */
gcommResult_t gcommDevicePlaceFifos(gcommComm_t comm, uint64_t hostId, size_t* shmBytes);
/* How the FIFOs between ranks on GPUs a and b of one node go, as gcommDevicePlaceFifos and the
 * copy-engine setup decide it with these parameters: a GCOMM_PATH_*, *why saying why (static
 * text), or -1 when CUDA cannot tell (*why: its error). A pair without peer access stages the
 * whole communicator. gcommDevicePathName: "CUDA IPC", "copy engines", "staged". */
enum { GCOMM_PATH_IPC, GCOMM_PATH_COPY_ENGINES, GCOMM_PATH_STAGED, GCOMM_PATH_NO_PEER };
int gcommDevicePath(const gcommParams_t* params, int a, int b, const char** why);
const char* gcommDevicePathName(int path);
/* The bytes of comm's FIFO region in its /dev/shm segment: 0 unless staged. */
size_t gcommDeviceShmBytes(gcommComm_t comm);
/* Allocates (or registers) this rank's region; exports it into card->devHandle (IPC). */
gcommResult_t gcommDeviceSetup(gcommComm_t comm, gcommCard_t* card);
/* Opens every local peer's region and builds the device connections (after the card exchange). */
gcommResult_t gcommDeviceConnect(gcommComm_t comm);
/* Whether op, a call of its own, runs straight between the ranks' buffers (gcomm_gpu_direct.c):
 * comm has that path, stream is being captured into a CUDA graph, and the cost model takes it for
 * the call (gcommDirectPays); the same answer on every rank that captures the call. */
int gcommDeviceDirectCall(gcommComm_t comm, const gcommOp_t* op, void* stream);
/* One launch for ops (a list linked by next, n of them); frees nothing. */
gcommResult_t gcommDeviceLaunch(gcommComm_t comm, gcommOp_t* ops, int n, void* stream);
/* gcommSuccess when stream is idle, gcommInProgress when not, or the kernels' error. */
gcommResult_t gcommDeviceTest(gcommComm_t comm, void* stream, const char* where);
gcommResult_t gcommDeviceWait(gcommComm_t comm, void* stream, const char* where);
/* The kernels' recorded failure (read from mapped memory: no CUDA call), recorded as comm's
 * error and async error; gcommSuccess when there is none. */
gcommResult_t gcommDeviceKernelError(gcommComm_t comm, const char* where);
void gcommDeviceAbort(gcommComm_t comm);
/* Whether a kernel waited on a FIFO lately (gcommDevComm_t.waiting), or a launch just went out:
 * the progress thread then polls the network or the copy engines instead of napping. Progress
 * thread only. */
int gcommDeviceKernelsWaiting(gcommComm_t comm);
/* Whether copy engines move some of this rank's FIFOs to local peers (GCOMM_P2P_USE_CUDA_MEMCPY=1
 * on FIFOs in GPU memory, GCOMM_SHM_USE_CUDA_MEMCPY=1 on staged ones: the same answer on every
 * rank of the node, the knobs being checked alike at init). Such a communicator uses the Simple
 * protocol only. */
int gcommDeviceCopyEngines(gcommComm_t comm);
/* The copy-engine proxy, run by progressPass: for every source FIFO (a staging FIFO, or a staged
 * host FIFO with a mirror) whose tail moved, enqueues the copies of its new slots, their words and
 * then the tail into the destination FIFO (one stream per peer and direction); *moved = 1 when it
 * enqueued some. A failed copy: gcommDeviceError naming the peer. */
gcommResult_t gcommDeviceCopyProgress(gcommComm_t comm, int* moved);
/* Makes comm's GPU current on the calling thread (the progress thread), in relaxed capture mode;
 * nothing for a host comm. */
void gcommDeviceBindThread(gcommComm_t comm);
/* gcommCommDestroy: waits for this communicator's kernels on every stream it launched on (they
 * end by themselves: done, deadline, abort), then, unless the communicator failed, for every rank,
 * so that no peer still writes into a region freed; each wait is bounded by GCOMM_TIMEOUT_MS.
 * gcommTimeout when either deadline passed (logged, and the memory kernels use is never freed). */
gcommResult_t gcommDeviceQuiesce(gcommComm_t comm);
void gcommDeviceFree(gcommComm_t comm);
/* checkArgs: a pointer the GPU cannot use (plain pageable host memory). */
int gcommDeviceBadPointer(gcommComm_t comm, const void* ptr);
/* Profiler (gcomm_gpu_prof.c): kernel timestamps for KernelCh events, the GPU clock's
 * offset to the host's; warns and leaves them off on failure. */
void gcommDeviceProfSetup(gcommComm_t comm);
#endif

#endif /* GCOMM_DEVICE_H */
