/*
 * gcomm_gpu_shared.c - ranks that all share one GPU without MPS (GCOMM_SHARED_GPU, chosen at init
 * by gcomm_bootstrap.c). Their contexts time-slice the GPU: a kernel block that spins for a peer's
 * block holds the GPU for its whole slice, so every operation of the main kernels costs a slice
 * (milliseconds) whatever its size. Here nothing on the GPU ever waits for a peer while it holds
 * SMs. The calling thread executes each call (or group) as stream-ordered work, meeting the peers'
 * calling threads through flags in their shared-memory status pages, on one of two paths.
 *
 * Why two: every hand-off between two processes' contexts costs the GPU about 140 us without MPS,
 * whether the stream waits on the GPU (cudaStreamWaitEvent) or the host waits for the peer's work
 * to end and only then enqueues: switching to a context costs that much even when the other one
 * is idle (tools/gpu_share_pingpong.cu, one H200: a 2-process ping-pong took 285-294 us a round
 * trip in every way of ordering it, 355 with blocking-sync events; one process alone, 8 us). So
 * the fast path is the one where a single context does all the work of a call.
 *
 * The direct path (GCOMM_SHARED_GPU_DIRECT; all-reduce, reduce, reduce-scatter, all-gather and
 * broadcast alone in a call, not PreMulSum): rank 0 runs the whole collective on its own stream
 * over every rank's buffers, mapped through CUDA IPC; the other ranks drain their streams, post
 * their buffers' handles and wait on the host for rank 0's event, so their contexts never run:
 * 29 us an 8-byte all-reduce at 2 ranks, 43 at 4, 108 us at 64 MB at 2 ranks (one H200). Their
 * calls return with the work done: they wait for their own GPU and for rank 0's.
 *
 * The staging (everything else: send/recv, groups, the other collectives, buffers that CUDA IPC
 * cannot share), on the caller's stream, each rank's context once per operation after its peers'
 * (~290 us an operation at 2 ranks):
 *
 *   publish a chunk: copy the chunk of the input into this rank's staging slot (copy engines or a
 *     copy kernel, GCOMM_SHARED_GPU_COPY; PreMulSum's scaling kernel), record this rank's
 *     interprocess event, then tell the peers (published[channel], release) which call it holds
 *     (tag[channel][slot]);
 *   consume a chunk: once every owner's flag says the chunk is there, cudaStreamWaitEvent on each
 *     owner's event (a wait in the GPU's front end that holds no SM), then copy or reduce (one
 *     short kernel over the n inputs, in rank order) into the output, record this rank's event and
 *     say so (readColl / readP2p);
 *   a slot is reused two chunks later, after its readers said they read it and a stream wait on
 *     their events: two slots per channel keep one chunk in flight while the next is filled.
 *
 * One event per rank is enough: a stream wait covers the event's latest record, and that record
 * follows (in its rank's stream) everything the flag that was seen speaks of. No GPU wait can
 * deadlock: every wait enqueued names a record enqueued earlier (its flag was seen), which waits
 * only on records enqueued before it. On the staging the host waits only for the peers' calls,
 * never for the GPU (a call may wait for the peers it needs to make it, never for the GPU to run
 * it); every host wait has the GCOMM_TIMEOUT_MS deadline and names the peer. Channel 0 carries
 * collectives (each rank publishes its whole image of a chunk once, every rank that needs it reads
 * it); channel 1 + r the sends to rank r, read by r alone. A group's collectives run in call
 * order, its sends to and receives from each peer each in their own order, interleaved so that no
 * order of calls in a group deadlocks. Not graph-capturable: the flags are set when the host
 * enqueues, not when a graph replays.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h> /* cuPointerGetAttributes' types: called through the runtime, not linked */

#include "gcomm_core.h" /* gcommIsReduction */
#include "gcomm_gpu_engine.h"

_Static_assert(GCOMM_SHARED_MAX_RANKS <= GCOMM_REDUCE_MAX_INPUTS, "a reduction reads every rank");
#define MAXR GCOMM_SHARED_MAX_RANKS
#define SLOTS GCOMM_SHARED_SLOTS
#define DIRECT_MAPS 32 /* other ranks' allocations kept mapped on the lead rank */
#define LEAD 0         /* the rank that runs a direct call */

typedef struct {
  cudaIpcMemHandle_t mem;
  cudaIpcEventHandle_t event;
  int failed; /* this rank's staging or event could not be made: every rank fails alike */
} sharedCard_t;

struct gcommShared {
  size_t collSlot, p2pSlot; /* bytes of a staging slot: the collective channel, a send channel */
  char* own;                /* cudaMalloc: this rank's staging, channel by channel */
  char* base[MAXR];         /* every rank's staging as this process maps it */
  cudaEvent_t event[MAXR];  /* every rank's interprocess event (this rank's created here) */
  gcommSharedFlags_t* flags[MAXR];
  /* what every rank's calls have published so far, as this rank's calls count it */
  uint64_t collPub[MAXR];      /* chunks rank r has published on its collective channel */
  uint64_t sent[MAXR];         /* chunks this rank has published to rank r */
  uint64_t recvd[MAXR];        /* chunks rank r has published to this rank */
  uint32_t slotReaders[SLOTS]; /* the collective channel: the ranks that read each slot */
  /* the stream of the latest call: a call on another stream first waits for this rank's event
   * there, so that the event's latest record always follows all this rank's earlier work */
  cudaStream_t lastStream;
  int called;
  int smCopy; /* GCOMM_SHARED_GPU_COPY=sm: staging copies by a kernel, not copy engines */
  /* the direct path */
  uint64_t directCalls; /* calls that went to it (every rank counts alike) */
  struct {
    int rank;
    unsigned long long id; /* the allocation's id in rank's process */
    char handle[64];
    void* base;
    uint64_t used;
  } maps[DIRECT_MAPS]; /* the lead rank: other ranks' allocations it has mapped */
  int nMaps;
  uint64_t mapClock;
  gcommBufferExport_t export; /* this rank's buffers' allocations, for the lead */
};

/* ---- buffers exported for CUDA IPC (this path's direct calls, gcomm_gpu_direct.c's) ---- */

/* cuPointerGetAttributes, through the runtime's driver entry points (no link to libcuda):
 * without it no buffer is exported. */
void gcommBufferExportInit(gcommBufferExport_t* x) {
  enum cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  void* fn = NULL;
  memset(x, 0, sizeof(*x));
  if (cudaGetDriverEntryPointByVersion("cuPointerGetAttributes", &fn, 12000, cudaEnableDefault,
                                       &found) != cudaSuccess ||
      found != cudaDriverEntryPointSuccess) {
    cudaGetLastError();
    fn = NULL;
  }
  x->pointerAttributes = fn;
}

int gcommBufferExport(gcommBufferExport_t* x, int which, const void* buf, gcommSharedCard_t* card) {
  typedef CUresult (*attributes_t)(unsigned n, CUpointer_attribute* attrs, void** data,
                                   CUdeviceptr p);
  unsigned long long id = 0, start = 0;
  CUpointer_attribute attrs[2] = {CU_POINTER_ATTRIBUTE_BUFFER_ID,
                                  CU_POINTER_ATTRIBUTE_RANGE_START_ADDR};
  void* data[2] = {&id, &start};
  if (x->pointerAttributes == NULL ||
      ((attributes_t)x->pointerAttributes)(2, attrs, data, (CUdeviceptr)(uintptr_t)buf) !=
          CUDA_SUCCESS)
    return 0;
  if (x->last[which].id != id) {
    if (cudaIpcGetMemHandle(&x->last[which].handle, (void*)(uintptr_t)start) != cudaSuccess) {
      cudaGetLastError(); /* not sticky: the call goes another way */
      return 0;
    }
    x->last[which].id = id;
  }
  memcpy(card->handle[which], &x->last[which].handle, sizeof(cudaIpcMemHandle_t));
  card->id[which] = id;
  card->offset[which] = (uintptr_t)buf - start;
  return 1;
}

/* ---- setup and teardown ---- */

static size_t stagingBytes(const struct gcommShared* s, int n) {
  return SLOTS * s->collSlot + (size_t)n * SLOTS * s->p2pSlot;
}

/* Where chunk seq of channel ch lies in rank r's staging. */
static char* slotOf(const struct gcommShared* s, int r, int ch, uint64_t seq) {
  size_t slot = seq % SLOTS;
  if (ch == 0) return s->base[r] + slot * s->collSlot;
  return s->base[r] + SLOTS * s->collSlot + ((size_t)(ch - 1) * SLOTS + slot) * s->p2pSlot;
}

static gcommResult_t makeOwn(gcommComm_t comm, struct gcommShared* s, sharedCard_t* card) {
  int me = comm->rank;
  CUDA_CHECK(comm, -1, cudaMalloc((void**)&s->own, stagingBytes(s, comm->nranks)));
  CUDA_CHECK(comm, -1, cudaIpcGetMemHandle(&card->mem, s->own));
  CUDA_CHECK(
      comm, -1,
      cudaEventCreateWithFlags(&s->event[me], cudaEventInterprocess | cudaEventDisableTiming));
  CUDA_CHECK(comm, -1, cudaIpcGetEventHandle(&card->event, s->event[me]));
  s->base[me] = s->own;
  return gcommSuccess;
}

static gcommResult_t openPeers(gcommComm_t comm, struct gcommShared* s, sharedCard_t* all) {
  for (int r = 0; r < comm->nranks; r++) {
    gcommStatus_t* st = gcommShmStatus(comm, r);
    if (st == NULL)
      return GCOMM_ERROR(comm, gcommInternalError, r, "rank %d shares the GPU but not the node", r);
    s->flags[r] = &st->shared;
    if (r == comm->rank) continue;
    CUDA_CHECK(
        comm, r,
        cudaIpcOpenMemHandle((void**)&s->base[r], all[r].mem, cudaIpcMemLazyEnablePeerAccess));
    CUDA_CHECK(comm, r, cudaIpcOpenEventHandle(&s->event[r], all[r].event));
  }
  return gcommSuccess;
}

gcommResult_t gcommGpuSharedConnect(gcommComm_t comm) {
  int n = comm->nranks;
  struct gcommShared* s = calloc(1, sizeof(*s));
  sharedCard_t mine, *all = calloc(n, sizeof(sharedCard_t));
  if (s == NULL || all == NULL) {
    free(s), free(all);
    return GCOMM_ERROR(comm, gcommSystemError, -1, "out of memory");
  }
  comm->dev->shared = s;
  memset(&mine, 0, sizeof(mine));
  s->collSlot = (size_t)comm->params.sharedChunk / 256 * 256;
  s->smCopy = comm->params.sharedCopyBy == 1;
  s->p2pSlot = s->collSlot / 4 / 256 * 256 > 4096 ? s->collSlot / 4 / 256 * 256 : 4096;
  gcommBufferExportInit(&s->export);
  mine.failed = makeOwn(comm, s, &mine) != gcommSuccess;
  /* every rank reaches the exchange, so that one rank's failure fails all of them */
  int rc = MPI_Allgather(&mine, sizeof(mine), MPI_BYTE, all, sizeof(mine), MPI_BYTE, comm->mpiComm);
  gcommResult_t res = gcommSuccess;
  for (int r = 0; r < n && rc == MPI_SUCCESS && res == gcommSuccess; r++)
    if (all[r].failed)
      res = GCOMM_ERROR(comm, gcommDeviceError, r,
                        "rank %d could not make its staging for ranks sharing a GPU", r);
  if (rc != MPI_SUCCESS) res = GCOMM_ERROR(comm, gcommSystemError, -1, "MPI_Allgather: %d", rc);
  if (res == gcommSuccess) res = openPeers(comm, s, all);
  free(all);
  if (res == gcommSuccess)
    GCOMM_INFO(
        GCOMM_SUBSYS_INIT, comm,
        "GPU %d: %d ranks share it through staging (GCOMM_SHARED_GPU=copy path): %zu bytes "
        "of GPU memory, chunks of %zu bytes (collectives) and %zu (sends), copies by %s; %s",
        comm->device, n, stagingBytes(s, n), s->collSlot, s->p2pSlot,
        s->smCopy ? "a kernel (GCOMM_SHARED_GPU_COPY=sm)" : "copy engines",
        !comm->params.sharedDirect ? "every call through staging (GCOMM_SHARED_GPU_DIRECT=0)"
        : s->export.pointerAttributes == NULL
            ? "every call through staging (no cuPointerGetAttributes in the driver)"
            : "all-reduce, reduce, reduce-scatter, all-gather, broadcast run by rank 0 alone");
  return res;
}

/* Destroy (after every rank's stream work ended: gcommDeviceQuiesce's barrier). */
void gcommGpuSharedFree(gcommComm_t comm) {
  struct gcommShared* s = comm->dev->shared;
  if (s == NULL) return;
  for (int i = 0; i < s->nMaps; i++) cudaIpcCloseMemHandle(s->maps[i].base);
  for (int r = 0; r < comm->nranks; r++) {
    if (s->event[r] != NULL) cudaEventDestroy(s->event[r]);
    if (r != comm->rank && s->base[r] != NULL) cudaIpcCloseMemHandle(s->base[r]);
  }
  if (s->own != NULL && !comm->dev->keepMemory) cudaFree(s->own);
  free(s);
  comm->dev->shared = NULL;
}

/* ---- one call or group: its operations cut into chunks, as phases of tasks ---- */

typedef struct {
  const gcommOp_t* op;
  int pieces;               /* blocks of one image: nranks for ReduceScatter, AllToAll, Scatter */
  size_t esz, per, chunks;  /* element bytes; elements of a piece in one chunk; chunks */
  uint32_t owners, readers; /* collectives: the ranks that publish, the ranks that read */
  uint64_t base[MAXR]; /* the first chunk's sequence on each owner's channel (Send/Recv: [0]) */
} shOp_t;

typedef struct {
  shOp_t* op;
  size_t chunk;
  int consume; /* 0: publish this rank's chunk; 1: read the owners' */
} shPhase_t;

typedef struct {
  shPhase_t* ph;
  int n, next;
} shTask_t;

typedef struct {
  gcommComm_t comm;
  struct gcommShared* s;
  cudaStream_t stream;
  shOp_t* ops;
  shPhase_t* phases;
  shTask_t* tasks;
  int nTasks;
  int waitPeer;      /* the rank the last blocked phase waits for */
  const char* what;  /* and what for */
  cudaEvent_t event; /* the event a wait on the GPU's progress queries */
} shRun_t;

static int isSend(const gcommOp_t* op) {
  return op->func == gcommFuncSend;
}
static int isP2p(const gcommOp_t* op) {
  return op->func == gcommFuncSend || op->func == gcommFuncRecv;
}

/* Who publishes and who reads each chunk of a collective, and how an image is cut. */
static void shapeColl(shOp_t* o, int n) {
  const gcommOp_t* op = o->op;
  uint32_t all = (1u << n) - 1, root = 1u << op->root;
  o->owners = o->readers = all;
  o->pieces = 1;
  switch (op->func) {
    case gcommFuncReduceScatter:
    case gcommFuncAllToAll:
      o->pieces = n;
      break;
    case gcommFuncBroadcast:
      o->owners = root;
      break;
    case gcommFuncScatter:
      o->owners = root;
      o->pieces = n;
      break;
    case gcommFuncReduce:
    case gcommFuncGather:
      o->readers = root;
      break;
    default:
      break;
  }
}

/* Cuts op into chunks and numbers them on their channels (every rank numbers every rank's
 * chunks alike: the same calls in the same order). */
static void planOp(shRun_t* run, shOp_t* o, const gcommOp_t* op) {
  struct gcommShared* s = run->s;
  int n = run->comm->nranks;
  o->op = op;
  o->esz = gcommTypeSize(op->datatype);
  size_t align = o->esz >= 16 ? 1 : 16 / o->esz;
  if (isP2p(op)) {
    o->pieces = 1;
    o->per = s->p2pSlot / o->esz / align * align;
  } else {
    shapeColl(o, n);
    o->per = s->collSlot / o->pieces / o->esz / align * align;
  }
  o->chunks = gcommDivUp(op->count, o->per);
  if (isP2p(op)) {
    uint64_t* next = isSend(op) ? &s->sent[op->peer] : &s->recvd[op->peer];
    o->base[0] = *next;
    *next += o->chunks;
    return;
  }
  for (int r = 0; r < n; r++)
    if (o->owners >> r & 1) {
      o->base[r] = s->collPub[r];
      s->collPub[r] += o->chunks;
    }
}

/* A task's phases for one operation: a collective publishes chunk j before it reads chunk j - 1
 * (one chunk in flight while the next is filled); a Send only publishes, a Recv only reads. */
static int addPhases(shPhase_t* ph, shOp_t* o, int me) {
  int k = 0, pub = isP2p(o->op) ? isSend(o->op) : (int)(o->owners >> me & 1);
  int read = isP2p(o->op) ? !isSend(o->op) : (int)(o->readers >> me & 1);
  for (size_t j = 0; j <= o->chunks; j++) {
    if (j < o->chunks && pub) ph[k++] = (shPhase_t){o, j, 0};
    if (j > 0 && read) ph[k++] = (shPhase_t){o, j - 1, 1};
  }
  return k;
}

/* The tasks: every collective in call order; the sends to each peer; the receives from each. */
static gcommResult_t planRun(shRun_t* run, gcommOp_t* ops, int nOps) {
  gcommComm_t comm = run->comm;
  int n = comm->nranks;
  size_t nPh = 0;
  run->ops = calloc(nOps, sizeof(shOp_t));
  run->tasks = calloc(1 + 2 * n, sizeof(shTask_t));
  if (run->ops == NULL || run->tasks == NULL)
    return GCOMM_ERROR(comm, gcommSystemError, -1, "out of memory");
  gcommOp_t* op = ops;
  for (int i = 0; i < nOps && op; i++, op = op->next) {
    planOp(run, &run->ops[i], op);
    nPh += 2 * run->ops[i].chunks;
  }
  run->phases = calloc(nPh, sizeof(shPhase_t));
  if (run->phases == NULL) return GCOMM_ERROR(comm, gcommSystemError, -1, "out of memory");
  shPhase_t* at = run->phases;
  for (int t = 0; t < 1 + 2 * n; t++) { /* task 0: collectives; 1 + p: sends to p; 1 + n + p */
    shTask_t* task = &run->tasks[run->nTasks];
    task->ph = at;
    for (int i = 0; i < nOps; i++) {
      const gcommOp_t* o = run->ops[i].op;
      int mine =
          t == 0 ? !isP2p(o) : isP2p(o) && o->peer == (t - 1) % n && isSend(o) == (t - 1 < n);
      if (mine) task->n += addPhases(at + task->n, &run->ops[i], comm->rank);
    }
    at += task->n;
    if (task->n > 0) run->nTasks++;
  }
  return gcommSuccess;
}

static void freeRun(shRun_t* run) {
  free(run->ops);
  free(run->phases);
  free(run->tasks);
}

/* ---- the phases ---- */

/* The channel this rank publishes o's chunks on: 0 (collectives) or 1 + the receiver. */
static int channelOf(const shOp_t* o) {
  return isP2p(o->op) ? 1 + o->op->peer : 0;
}

/* Rank r's call (tag got) against this one: a peer in another call is named. */
static gcommResult_t tagMatches(shRun_t* run, const gcommOp_t* op, int r, uint32_t got) {
  uint32_t want = op->tag;
  if (want == 0 || got == want) return gcommSuccess;
  char what[256];
  gcommDescribeMismatch(what, sizeof(what), GCOMM_SLOT_WORD(got, 0), GCOMM_SLOT_WORD(want, 0));
  return GCOMM_ERROR(run->comm, gcommInvalidUsage, r,
                     "%s (ranks sharing a GPU, copy path): rank %d made a different call: %s",
                     gcommFuncName(op->func), r, what);
}

/* Whether rank r's chunk seq on ch holds this call. */
static gcommResult_t checkTag(shRun_t* run, const shOp_t* o, int r, int ch, uint64_t seq) {
  return tagMatches(run, o->op, r, run->s->flags[r]->tag[ch][seq % SLOTS]);
}

/* A publish may go once every reader of the chunk two before it in the slot has read it. */
static int slotFree(shRun_t* run, int ch, uint64_t seq) {
  struct gcommShared* s = run->s;
  int me = run->comm->rank;
  if (seq < SLOTS) return 1;
  uint64_t need = seq - SLOTS + 1;
  if (ch > 0) {
    int p = ch - 1;
    run->waitPeer = p, run->what = "read the chunk before in a send slot";
    return __atomic_load_n(&s->flags[p]->readP2p[me], __ATOMIC_ACQUIRE) >= need;
  }
  for (int r = 0; r < run->comm->nranks; r++) {
    if (!(s->slotReaders[seq % SLOTS] >> r & 1) || r == me) continue;
    run->waitPeer = r, run->what = "read the chunk before in a collective slot";
    if (__atomic_load_n(&s->flags[r]->readColl[me], __ATOMIC_ACQUIRE) < need) return 0;
  }
  return 1;
}

/* Stream waits on the events of the ranks in mask (other than this one). */
static gcommResult_t waitEvents(shRun_t* run, uint32_t mask) {
  for (int r = 0; r < run->comm->nranks; r++)
    if ((mask >> r & 1) && r != run->comm->rank)
      CUDA_CHECK(run->comm, r, cudaStreamWaitEvent(run->stream, run->s->event[r], 0));
  return gcommSuccess;
}

/* After this rank's work on a chunk: its event, which the peers wait on. */
static gcommResult_t recordOwn(shRun_t* run) {
  CUDA_CHECK(run->comm, -1, cudaEventRecord(run->s->event[run->comm->rank], run->stream));
  return gcommSuccess;
}

/* rows x bytes from src (a row every srcPitch bytes) to dst (every dstPitch), on the stream. */
static gcommResult_t copyRows(shRun_t* run, void* dst, size_t dstPitch, const void* src,
                              size_t srcPitch, size_t bytes, size_t rows) {
  cudaError_t e;
  if (run->s->smCopy)
    e = (cudaError_t)gcommCopyLaunch(dst, dstPitch, src, srcPitch, bytes, rows, run->stream);
  else if (rows == 1)
    e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, run->stream);
  else
    e = cudaMemcpy2DAsync(dst, dstPitch, src, srcPitch, bytes, rows, cudaMemcpyDeviceToDevice,
                          run->stream);
  CUDA_CHECK(run->comm, -1, e);
  return gcommSuccess;
}

/* Copies (or, PreMulSum, scales) this rank's part of chunk j into dst: each piece's elements. */
static gcommResult_t fillSlot(shRun_t* run, const shOp_t* o, size_t j, char* dst) {
  const gcommOp_t* op = o->op;
  size_t off = j * o->per, len = gcommMinSize(o->per, op->count - off);
  const char* src = (const char*)op->sendbuff + off * o->esz;
  if (op->redop == GCOMM_OP_PREMULSUM && gcommIsReduction(op->func)) {
    int e = gcommPreMulLaunch(dst, o->per, src, op->count, len, o->pieces, op->datatype, op->scalar,
                              op->scalarPtr, run->stream);
    CUDA_CHECK(run->comm, -1, (cudaError_t)e);
    return gcommSuccess;
  }
  return copyRows(run, dst, o->per * o->esz, src, op->count * o->esz, len * o->esz, o->pieces);
}

static gcommResult_t publish(shRun_t* run, const shPhase_t* p, int* moved) {
  struct gcommShared* s = run->s;
  const shOp_t* o = p->op;
  int me = run->comm->rank, ch = channelOf(o);
  uint64_t seq = (ch == 0 ? o->base[me] : o->base[0]) + p->chunk;
  if (!slotFree(run, ch, seq)) return gcommSuccess;
  if (seq >= SLOTS)
    GCOMM_CHECK(waitEvents(run, ch == 0 ? s->slotReaders[seq % SLOTS] : 1u << (ch - 1)));
  GCOMM_CHECK(fillSlot(run, o, p->chunk, slotOf(s, me, ch, seq)));
  GCOMM_CHECK(recordOwn(run));
  if (ch == 0) s->slotReaders[seq % SLOTS] = o->readers;
  s->flags[me]->tag[ch][seq % SLOTS] = o->op->tag;
  __atomic_store_n(&s->flags[me]->published[ch], seq + 1, __ATOMIC_RELEASE);
  *moved = 1;
  return gcommSuccess;
}

/* Whether every owner of chunk j has published it (its call checked). */
static gcommResult_t chunkThere(shRun_t* run, const shOp_t* o, size_t j, int* there) {
  int me = run->comm->rank;
  *there = 0;
  for (int r = 0; r < run->comm->nranks; r++) {
    int owner = isP2p(o->op) ? r == o->op->peer : (int)(o->owners >> r & 1);
    if (!owner) continue;
    int ch = isP2p(o->op) ? 1 + me : 0;
    uint64_t seq = (isP2p(o->op) ? o->base[0] : o->base[r]) + j;
    run->waitPeer = r, run->what = "publish a chunk";
    if (__atomic_load_n(&run->s->flags[r]->published[ch], __ATOMIC_ACQUIRE) <= seq)
      return gcommSuccess;
    GCOMM_CHECK(checkTag(run, o, r, ch, seq));
  }
  *there = 1;
  return gcommSuccess;
}

/* Chunk j of every owner into this rank's output: a reduction kernel, or copies. */
static gcommResult_t readChunk(shRun_t* run, const shOp_t* o, size_t j) {
  struct gcommShared* s = run->s;
  const gcommOp_t* op = o->op;
  int n = run->comm->nranks, me = run->comm->rank;
  size_t off = j * o->per, len = gcommMinSize(o->per, op->count - off), bytes = len * o->esz;
  size_t mine = o->pieces > 1 ? (size_t)me * o->per * o->esz : 0; /* this rank's piece */
  char* out = (char*)op->recvbuff;
  if (isP2p(op))
    return copyRows(run, out + off * o->esz, 0, slotOf(s, op->peer, 1 + me, o->base[0] + j), 0,
                    bytes, 1);
  if (gcommIsReduction(op->func)) {
    gcommReduceArgs_t a = {.out = {out + off * o->esz},
                           .count = len,
                           .nIn = n,
                           .nOut = 1,
                           .datatype = op->datatype,
                           .redop = op->redop};
    for (int r = 0; r < n; r++) a.in[r] = slotOf(s, r, 0, o->base[r] + j) + mine;
    if (op->redop == gcommAvg) a.divide = n;
    CUDA_CHECK(run->comm, -1, (cudaError_t)gcommReduceLaunch(&a, run->stream));
    return gcommSuccess;
  }
  for (int r = 0; r < n; r++) {
    if (!(o->owners >> r & 1)) continue;
    /* one owner (Broadcast, Scatter): its chunk is this rank's whole output chunk; else rank r's
     * block of the output */
    size_t at = o->owners == (1u << r) ? off : (size_t)r * op->count + off;
    GCOMM_CHECK(
        copyRows(run, out + at * o->esz, 0, slotOf(s, r, 0, o->base[r] + j) + mine, 0, bytes, 1));
  }
  return gcommSuccess;
}

static gcommResult_t consume(shRun_t* run, const shPhase_t* p, int* moved) {
  struct gcommShared* s = run->s;
  const shOp_t* o = p->op;
  int me = run->comm->rank, there = 0;
  GCOMM_CHECK(chunkThere(run, o, p->chunk, &there));
  if (!there) return gcommSuccess;
  GCOMM_CHECK(waitEvents(run, isP2p(o->op) ? 1u << o->op->peer : o->owners));
  GCOMM_CHECK(readChunk(run, o, p->chunk));
  GCOMM_CHECK(recordOwn(run));
  if (isP2p(o->op)) {
    __atomic_store_n(&s->flags[me]->readP2p[o->op->peer], o->base[0] + p->chunk + 1,
                     __ATOMIC_RELEASE);
  } else {
    for (int r = 0; r < run->comm->nranks; r++)
      if (o->owners >> r & 1)
        __atomic_store_n(&s->flags[me]->readColl[r], o->base[r] + p->chunk + 1, __ATOMIC_RELEASE);
  }
  *moved = 1;
  return gcommSuccess;
}

/* ---- the run: every task's phases as they become ready, each wait bounded ---- */

/* Whether the rank waited for can still come: not dead, not stopped, this one not aborted. */
static gcommResult_t peerAlive(shRun_t* run) {
  gcommComm_t comm = run->comm;
  int p = run->waitPeer;
  if (__atomic_load_n(&comm->abortFlag, __ATOMIC_ACQUIRE))
    return GCOMM_ERROR(comm, gcommAborted, -1, "the communicator was aborted");
  if (gcommProcessIsDead(comm->cards[p].pid))
    return GCOMM_ERROR(comm, gcommRemoteError, p, "waiting for rank %d to %s: it has died", p,
                       run->what);
  gcommStatus_t* st = gcommShmStatus(comm, p);
  if (st != NULL && __atomic_load_n(&st->code, __ATOMIC_ACQUIRE) != 0)
    return GCOMM_ERROR(comm, gcommRemoteError, p, "waiting for rank %d to %s: it stopped: %.400s",
                       p, run->what, st->msg);
  return gcommSuccess;
}

static gcommResult_t advance(shRun_t* run, int* left, int* moved) {
  *left = 0;
  for (int t = 0; t < run->nTasks; t++) {
    shTask_t* task = &run->tasks[t];
    while (task->next < task->n) {
      const shPhase_t* p = &task->ph[task->next];
      int did = 0;
      GCOMM_CHECK(p->consume ? consume(run, p, &did) : publish(run, p, &did));
      if (!did) break;
      task->next++;
      *moved = 1;
    }
    *left += task->n - task->next;
  }
  return gcommSuccess;
}

/* One look at what a wait waits for: *done when it is there, *moved when something advanced
 * (the deadline starts again). */
typedef gcommResult_t (*shStep_t)(shRun_t* run, void* arg, int* done, int* moved);

/* Steps until done; GCOMM_TIMEOUT_MS without a move, the peer's death or stop, or an abort end
 * the wait with an error naming run->waitPeer. */
static gcommResult_t waitSteps(shRun_t* run, shStep_t step, void* arg) {
  gcommComm_t comm = run->comm;
  uint64_t timeoutNs = (uint64_t)comm->params.timeoutMs * 1000000, idleSince = 0;
  uint64_t since = gcommNowNs(), lastProbe = since;
  for (;;) {
    int done = 0, moved = 0;
    GCOMM_CHECK(step(run, arg, &done, &moved));
    if (done) return gcommSuccess;
    if (moved) {
      since = gcommNowNs(), idleSince = 0;
      continue;
    }
    uint64_t now = gcommNowNs();
    if (now - lastProbe > 50000000ull) { /* every 50 ms: the peer's death, its stop, an abort */
      lastProbe = now;
      GCOMM_CHECK(peerAlive(run));
    }
    if (now - since > timeoutNs)
      return GCOMM_ERROR(comm, gcommTimeout, run->waitPeer,
                         "ranks sharing a GPU (copy path): waited more than GCOMM_TIMEOUT_MS=%lld "
                         "for rank %d to %s",
                         (long long)comm->params.timeoutMs, run->waitPeer, run->what);
    gcommBackoff(&idleSince, 50, 200);
  }
}

static gcommResult_t tasksStep(shRun_t* run, void* arg, int* done, int* moved) {
  int left = 0;
  (void)arg;
  GCOMM_CHECK(advance(run, &left, moved));
  *done = left == 0;
  return gcommSuccess;
}

/* ---- the direct path: the lead rank runs a whole collective on its own stream ----
 *
 * Every hand-off between two processes' contexts costs the GPU ~140 us without MPS, whether the
 * stream waits on the GPU or the host waits and then enqueues (tools/gpu_share_pingpong.cu), so a
 * call is fast only if one context does all its GPU work. A collective that fits (directFits)
 * goes so: each other rank drains its stream (its input written, its output no longer read), posts
 * the IPC handles of its buffers' allocations and waits; the lead rank (rank 0) maps them (kept
 * open, directMap), enqueues the reduction and copies between every rank's buffers on its own
 * stream, records its event and answers; the others wait on the host until that event has
 * completed and return with their stream empty. Their contexts never run, so an 8-byte all-reduce
 * costs one launch or two. A buffer that cannot be shared (not from cudaMalloc) makes the lead
 * answer "staging", and every rank runs the call on the staging path instead. */

static int directFunc(int func) {
  return func == gcommFuncAllReduce || func == gcommFuncReduce || func == gcommFuncBroadcast ||
         func == gcommFuncAllGather || func == gcommFuncReduceScatter;
}

/* Whether this call goes direct: the same answer on every rank (the same call everywhere). */
static int directFits(gcommComm_t comm, const gcommOp_t* ops, int n) {
  const gcommOp_t* op = ops;
  return comm->params.sharedDirect && n == 1 && directFunc(op->func) && op->count > 0 &&
         !(op->redop == GCOMM_OP_PREMULSUM && gcommIsReduction(op->func));
}

/* Whether rank r's sendbuff (which 0) or recvbuff (1) takes part in op. */
static int directUses(const gcommOp_t* op, int r, int which) {
  if (which == 0) return op->func != gcommFuncBroadcast || r == op->root;
  return op->func != gcommFuncReduce || r == op->root;
}

/* Until run->event has completed or, without one, run->stream has run all its work. */
static gcommResult_t gpuIdleStep(shRun_t* run, void* arg, int* done, int* moved) {
  cudaError_t e = run->event != NULL ? cudaEventQuery(run->event) : cudaStreamQuery(run->stream);
  (void)arg, (void)moved;
  *done = e == cudaSuccess;
  if (e == cudaErrorNotReady || e == cudaSuccess) return gcommSuccess;
  CUDA_CHECK(run->comm, run->waitPeer, e);
  return gcommSuccess;
}

/* This rank's card: the IPC handle of each buffer's allocation and the buffer's offset in it. */
static void postCard(shRun_t* run, const gcommOp_t* op) {
  int me = run->comm->rank;
  gcommSharedCard_t* card = &run->s->flags[me]->card;
  const void* buf[2] = {op->sendbuff, op->recvbuff};
  card->ok = 1;
  card->tag = op->tag;
  for (int w = 0; w < 2; w++)
    if (directUses(op, me, w)) card->ok &= gcommBufferExport(&run->s->export, w, buf[w], card);
}

static gcommResult_t answerStep(shRun_t* run, void* arg, int* done, int* moved) {
  uint64_t call = *(uint64_t*)arg;
  (void)moved;
  *done = __atomic_load_n(&run->s->flags[LEAD]->directAnswer, __ATOMIC_ACQUIRE) >> 1 >= call;
  return gcommSuccess;
}

/* A rank other than the lead: drained, card posted, the lead's answer, the lead's work done. */
static gcommResult_t followDirect(shRun_t* run, const gcommOp_t* op, int* done) {
  struct gcommShared* s = run->s;
  int me = run->comm->rank;
  uint64_t call = ++s->directCalls;
  run->waitPeer = me, run->what = "run the work on its stream before the call (its own GPU)";
  GCOMM_CHECK(waitSteps(run, gpuIdleStep, NULL));
  postCard(run, op);
  __atomic_store_n(&s->flags[me]->directPosted, call, __ATOMIC_RELEASE);
  run->waitPeer = LEAD, run->what = "take the call (direct path)";
  GCOMM_CHECK(waitSteps(run, answerStep, &call));
  *done = __atomic_load_n(&s->flags[LEAD]->directAnswer, __ATOMIC_ACQUIRE) & 1;
  if (!*done) return gcommSuccess;
  run->event = s->event[LEAD], run->what = "finish the call on the GPU (direct path)";
  return waitSteps(run, gpuIdleStep, NULL);
}

static gcommResult_t postedStep(shRun_t* run, void* arg, int* done, int* moved) {
  uint64_t call = *(uint64_t*)arg;
  *done = 1;
  for (int r = 0; r < run->comm->nranks; r++) {
    if (r == LEAD) continue;
    run->waitPeer = r, run->what = "reach the call (direct path)";
    if (__atomic_load_n(&run->s->flags[r]->directPosted, __ATOMIC_ACQUIRE) < call) {
      *done = 0;
      return gcommSuccess;
    }
  }
  (void)moved;
  return gcommSuccess;
}

/* Closes mapping i once the lead's work so far has ended (it may read it). */
static gcommResult_t directUnmap(shRun_t* run, int i) {
  struct gcommShared* s = run->s;
  run->event = s->event[LEAD], run->waitPeer = LEAD;
  run->what = "end its work before a buffer is unmapped (its own GPU)";
  GCOMM_CHECK(waitSteps(run, gpuIdleStep, NULL));
  CUDA_CHECK(run->comm, s->maps[i].rank, cudaIpcCloseMemHandle(s->maps[i].base));
  s->maps[i] = s->maps[--s->nMaps];
  return gcommSuccess;
}

/* Maps rank r's allocation of its card's buffer which; *i its entry, or -1 if it cannot be. A
 * full table gives up its least recently used entry. */
static gcommResult_t directOpen(shRun_t* run, int r, int which, int* i) {
  struct gcommShared* s = run->s;
  const gcommSharedCard_t* card = &s->flags[r]->card;
  cudaIpcMemHandle_t h;
  void* base = NULL;
  if (s->nMaps == DIRECT_MAPS) {
    int old = 0;
    for (int k = 1; k < s->nMaps; k++)
      if (s->maps[k].used < s->maps[old].used) old = k;
    GCOMM_CHECK(directUnmap(run, old));
  }
  for (int k = 0; k < s->nMaps; k++) /* the same handle, another id: a freed allocation's */
    if (s->maps[k].rank == r && !memcmp(s->maps[k].handle, card->handle[which], sizeof(h))) {
      GCOMM_CHECK(directUnmap(run, k));
      break;
    }
  memcpy(&h, card->handle[which], sizeof(h));
  *i = -1;
  if (cudaIpcOpenMemHandle(&base, h, cudaIpcMemLazyEnablePeerAccess) != cudaSuccess) {
    cudaGetLastError(); /* not sticky: the call takes the staging */
    return gcommSuccess;
  }
  *i = s->nMaps++;
  s->maps[*i].rank = r, s->maps[*i].id = card->id[which], s->maps[*i].base = base;
  memcpy(s->maps[*i].handle, card->handle[which], sizeof(h));
  return gcommSuccess;
}

/* Rank r's buffer which (0 send, 1 recv) as the lead addresses it; NULL if it cannot be mapped.
 * An allocation is known by its id, never reused in its process: a handle alone might be. */
static gcommResult_t directMap(shRun_t* run, int r, int which, char** ptr) {
  struct gcommShared* s = run->s;
  const gcommSharedCard_t* card = &s->flags[r]->card;
  int i = 0;
  while (i < s->nMaps && !(s->maps[i].rank == r && s->maps[i].id == card->id[which])) i++;
  if (i == s->nMaps) GCOMM_CHECK(directOpen(run, r, which, &i));
  *ptr = NULL;
  if (i < 0) return gcommSuccess;
  s->maps[i].used = ++s->mapClock;
  *ptr = (char*)s->maps[i].base + card->offset[which];
  return gcommSuccess;
}

/* Every rank's buffers as the lead addresses them; *ok 0 if one of them cannot be. */
static gcommResult_t directBuffers(shRun_t* run, const gcommOp_t* op, char** in, char** out,
                                   int* ok) {
  struct gcommShared* s = run->s;
  *ok = 1;
  for (int r = 0; r < run->comm->nranks; r++) {
    in[r] = (char*)op->sendbuff, out[r] = (char*)op->recvbuff;
    if (r == LEAD) continue;
    GCOMM_CHECK(tagMatches(run, op, r, s->flags[r]->card.tag));
    *ok &= s->flags[r]->card.ok;
    for (int w = 0; w < 2 && *ok; w++) {
      char** p = w == 0 ? &in[r] : &out[r];
      if (!directUses(op, r, w)) continue;
      GCOMM_CHECK(directMap(run, r, w, p));
      *ok &= *p != NULL;
    }
  }
  return gcommSuccess;
}

/* outs[k] <- the reduction of every rank's input at byte offset off, for each of nOut outputs. */
static gcommResult_t directReduce(shRun_t* run, const gcommOp_t* op, char** in, size_t off,
                                  char** outs, int nOut) {
  int n = run->comm->nranks;
  gcommReduceArgs_t a = {
      .count = op->count, .nIn = n, .nOut = nOut, .datatype = op->datatype, .redop = op->redop};
  for (int r = 0; r < n; r++) a.in[r] = in[r] + off;
  for (int k = 0; k < nOut; k++) a.out[k] = outs[k];
  if (op->redop == gcommAvg) a.divide = n;
  CUDA_CHECK(run->comm, -1, (cudaError_t)gcommReduceLaunch(&a, run->stream));
  return gcommSuccess;
}

static gcommResult_t directCopy(shRun_t* run, char* dst, const char* src, size_t bytes) {
  return dst == src ? gcommSuccess : copyRows(run, dst, 0, src, 0, bytes, 1);
}

/* The whole collective between every rank's buffers, on the lead's stream, in one kernel where it
 * can (an all-reduce writes every rank's output at once). An in-place rank's input is read before
 * its output is written: by the same element of the one reduction, or by a copy out of another
 * rank's buffer. */
static gcommResult_t directWork(shRun_t* run, const gcommOp_t* op, char** in, char** out) {
  int n = run->comm->nranks, root = op->root;
  size_t bytes = op->count * gcommTypeSize(op->datatype);
  switch (op->func) {
    case gcommFuncAllReduce:
      return directReduce(run, op, in, 0, out, n);
    case gcommFuncReduce:
      return directReduce(run, op, in, 0, &out[root], 1);
    case gcommFuncReduceScatter:
      for (int r = 0; r < n; r++) GCOMM_CHECK(directReduce(run, op, in, r * bytes, &out[r], 1));
      return gcommSuccess;
    case gcommFuncBroadcast:
      for (int r = 0; r < n; r++) GCOMM_CHECK(directCopy(run, out[r], in[root], bytes));
      return gcommSuccess;
    default: /* AllGather */
      for (int r = 0; r < n; r++)
        for (int k = 0; k < n; k++) GCOMM_CHECK(directCopy(run, out[r] + k * bytes, in[k], bytes));
      return gcommSuccess;
  }
}

/* The lead rank: every other rank's card, then the work on its stream (or the answer "staging"). */
static gcommResult_t leadDirect(shRun_t* run, const gcommOp_t* op, int* done) {
  struct gcommShared* s = run->s;
  uint64_t call = ++s->directCalls;
  char *in[MAXR], *out[MAXR];
  int ok = 0;
  GCOMM_CHECK(waitSteps(run, postedStep, &call));
  GCOMM_CHECK(directBuffers(run, op, in, out, &ok));
  if (ok) {
    GCOMM_CHECK(directWork(run, op, in, out));
    GCOMM_CHECK(recordOwn(run));
  }
  __atomic_store_n(&s->flags[LEAD]->directAnswer, call << 1 | (uint64_t)ok, __ATOMIC_RELEASE);
  *done = ok;
  return gcommSuccess;
}

gcommResult_t gcommGpuSharedRun(gcommComm_t comm, gcommOp_t* ops, int n, void* stream) {
  enum cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  CUDA_CHECK(comm, -1, cudaStreamIsCapturing((cudaStream_t)stream, &capture));
  if (capture != cudaStreamCaptureStatusNone)
    return GCOMM_ERROR(comm, gcommInvalidUsage, -1,
                       "ranks sharing a GPU without MPS (GCOMM_SHARED_GPU=copy) cannot capture "
                       "into a CUDA graph: start MPS or set GCOMM_SHARED_GPU=kernels");
  struct gcommShared* s = comm->dev->shared;
  shRun_t run = {.comm = comm, .s = s, .stream = (cudaStream_t)stream};
  if (s->called && s->lastStream != run.stream)
    CUDA_CHECK(comm, -1, cudaStreamWaitEvent(run.stream, s->event[comm->rank], 0));
  s->lastStream = run.stream;
  s->called = 1;
  gcommResult_t res = gcommSuccess;
  int done = 0;
  if (directFits(comm, ops, n))
    res = comm->rank == LEAD ? leadDirect(&run, ops, &done) : followDirect(&run, ops, &done);
  if (res == gcommSuccess && !done) {
    res = planRun(&run, ops, n);
    if (res == gcommSuccess) res = waitSteps(&run, tasksStep, NULL);
    freeRun(&run);
  }
  if (res != gcommSuccess) { /* the ranks' counts no longer agree: the communicator stops */
    int ok = gcommSuccess;
    __atomic_compare_exchange_n(&comm->asyncError, &ok, (int)res, 0, __ATOMIC_ACQ_REL,
                                __ATOMIC_ACQUIRE);
  }
  return res;
}
