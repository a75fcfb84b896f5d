/*
 * gcomm_core.h - what the core's files (gcomm.c and the gcomm_*.c beside it) share and the
 * transports do not see: small helpers over the communicator, the name tables of logs, the host
 * reduction tables, and each core file's functions for the others. The transports include
 * gcomm_internal.h only.
 */
#ifndef GCOMM_CORE_H
#define GCOMM_CORE_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "gcomm_internal.h"
#ifdef GCOMM_GPU
#include "gcomm_device.h"
#endif

/* ---- Helpers over the communicator ---- */
static inline gcommConn_t* sendConn(gcommComm_t comm, int lane, int peer) {
  return &comm->sendConns[lane * comm->nranks + peer];
}
static inline gcommConn_t* recvConn(gcommComm_t comm, int lane, int peer) {
  return &comm->recvConns[lane * comm->nranks + peer];
}
/* The 64-bit words of comm->busyQueues, a bit a queue. */
static inline int busyQueueWords(gcommComm_t comm) {
  return (comm->nQueues + 63) / 64;
}

static inline char* opBuffer(const gcommOp_t* op, int which) {
  if (which == GCOMM_BUF_IN) return (char*)op->sendbuff;
  if (which == GCOMM_BUF_OUT) return (char*)op->recvbuff;
  if (which == GCOMM_BUF_SCRATCH) return (char*)op->scratch;
  return NULL;
}

/* Adds n to a counter that only the communicator's owner thread writes (gcommEnqueueCheck) and
 * returns its old value: a load and a release store, not a locked read-modify-write, which waits
 * for every store before it to reach the cache (the FIFO line just handed to a peer's core). Other
 * threads (dumps, the progress thread's statistics, waits) only read it. */
static inline uint64_t gcommOwnerAdd(uint64_t* counter, uint64_t n) {
  uint64_t old = __atomic_load_n(counter, __ATOMIC_RELAXED);
  __atomic_store_n(counter, old + n, __ATOMIC_RELEASE);
  return old;
}

/* Whether some ranks are on other nodes (the same answer on every rank). */
static inline int spansNodes(gcommComm_t comm) {
  return comm->nLocal < comm->nranks;
}

/* Whether some send FIFOs may hand slots over by reference (gcommConn_t.refs: the network's,
 * or between ranks of this node with GCOMM_CMA): then no step writes memory such a send still
 * reads. */
static inline int sendsByRef(gcommComm_t comm) {
  return spansNodes(comm) || comm->cma;
}

/* Whether threads in gcommWait run the progress passes themselves (host communicators, thread
 * mode: see gcommWait), the progress thread serving only work nobody waits on. */
static inline int waitersDrive(gcommComm_t comm) {
  return comm->device < 0;
}

/* A GPU communicator whose kernels stage data to other nodes through network FIFOs in pinned
 * host memory (gcomm_gpu_net.c), which only the progress thread moves. */
static inline int stagesNet(gcommComm_t comm) {
#if defined(GCOMM_GPU) && defined(GCOMM_OFI)
  return comm->device >= 0 && comm->net != NULL;
#else
  (void)comm;
  return 0;
#endif
}

/* A GPU communicator some of whose FIFOs to local ranks the progress thread fills or drains with
 * copy engines (GCOMM_P2P_USE_CUDA_MEMCPY, GCOMM_SHM_USE_CUDA_MEMCPY, gcomm_gpu_copy.c). */
static inline int copiesByEngine(gcommComm_t comm) {
#ifdef GCOMM_GPU
  return comm->device >= 0 && gcommDeviceCopyEngines(comm);
#else
  (void)comm;
  return 0;
#endif
}

/* A GPU communicator some of whose FIFOs a proxy on the progress thread moves (the network's,
 * the copy engines'): the thread runs from init to destroy, and LL is never used (its flags live
 * in the data, which the proxy moves keyed on the tail). */
static inline int hasGpuProxy(gcommComm_t comm) {
  return stagesNet(comm) || copiesByEngine(comm);
}

#define MPI_CHECK(comm, call)                                                                     \
  do {                                                                                            \
    int mpiErr_ = (call);                                                                         \
    if (mpiErr_ != MPI_SUCCESS)                                                                   \
      return GCOMM_ERROR(comm, gcommSystemError, -1, "%s failed (MPI error %d)", #call, mpiErr_); \
  } while (0)

/* ---- Names for logs and errors (gcomm_params.c) ---- */
extern const char* const gcommAlgoNames[];
extern const char* const gcommProtoNames[];
extern const char* const gcommProxyModeNames[];
extern const char* const gcommFuncNames[gcommNumFuncs];
extern const char* const gcommTypeNames[gcommNumTypes];
/* an operation's redop: gcomm.h's operators, then PreMulSum (GCOMM_OP_PREMULSUM) */
extern const char* const gcommOpNames[GCOMM_OP_PREMULSUM + 1];
/* Writes one line to the log whatever GCOMM_DEBUG says (hang dumps, which were asked for; a
 * profiler plugin's lines, which it filtered itself). */
void gcommLogWrite(int level, gcommComm_t comm, const char* where, const char* msg);
/* The last error of this thread (gcommGetLastError without a live communicator), and keeping a
 * failed init's message there. */
const char* gcommThreadLastError(void);
void gcommKeepThreadError(const char* msg);

/* ---- gcomm_agree.c ---- */
/* How a communicator made by gcommCommShrink exchanges without MPI: over the status pages of
 * pages (its parent during setup, then itself), where its rank r is pageRank[r]. */
struct gcommBoot {
  gcommComm_t pages;
  int* pageRank;
  int rank, nranks; /* this rank, and the size of the communicator being set up */
};
/* MPI_Allgather of bytes from every rank, or, for a communicator made by gcommCommShrink, the
 * same over status pages (a deadline on each rank, a death named). Collective. */
gcommResult_t gcommAllgather(gcommComm_t comm, const void* mine, size_t bytes, void* all);
/* The same over comm's own status pages among all its ranks, never MPI (every rank of comm on
 * this node, or reached through its transports' boxes): for exchanges while the caller enqueues,
 * where MPI may be in the caller's hands. what names it in errors. Collective. */
gcommResult_t gcommPagesAllgather(gcommComm_t comm, const void* mine, size_t bytes, void* all,
                                  const char* what);
/* comm (not set up yet) will exchange over the pages of pages, its rank r being pageRank[r]. */
gcommResult_t gcommBootFromPages(gcommComm_t comm, gcommComm_t pages, const int* pageRank, int rank,
                                 int nranks);
/* Once comm's own segments are mapped: its exchanges go over its own pages. */
void gcommBootOwnPages(gcommComm_t comm);
/* gcommCommShrink's meeting: excl[q] (1: excluded by the caller) gains the ranks found dead;
 * survivors[0..*n) are the ranks every survivor agreed on, ascending. Collective over them. */
gcommResult_t gcommAgreeSurvivors(gcommComm_t comm, unsigned char* excl, int* survivors, int* n);

/* ---- gcomm_executor.c ---- */
int gcommWorkAdvance(gcommComm_t comm, gcommWork_t* w, gcommResult_t* res);
int gcommSlotAtOnce(gcommComm_t comm, const gcommOp_t* op, int lane, int peer, int send);
int gcommWorkAtOnce(gcommComm_t comm, gcommWork_t* w);
/* Whether local rank peer's process is gone (only a process of this very machine can be probed:
 * GCOMM_HOSTID nodes may share one). */
int gcommPeerIsDead(gcommComm_t comm, int peer);
uint32_t gcommOpTag(const gcommOp_t* op);

/* ---- gcomm_progress.c ---- */
/* An operation record with room for nWorks works, unwritten but for pooled (NULL: out of memory;
 * the caller writes the rest); the owner thread only. gcommOpRelease gives it back, from any
 * thread; gcommOpPoolFree frees the pool at destroy. */
gcommOp_t* gcommOpAlloc(gcommComm_t comm, int nWorks);
void gcommOpRelease(gcommComm_t comm, gcommOp_t* op);
void gcommOpPoolFree(gcommComm_t comm);
int gcommAllDone(gcommComm_t comm, uint64_t target);
void gcommDrainAll(gcommComm_t comm);
gcommResult_t gcommFinalResult(gcommComm_t comm, const char* where);
gcommResult_t gcommHostWait(gcommComm_t comm);
void gcommInstallDumpSignal(gcommComm_t comm);
gcommResult_t gcommPostOps(gcommComm_t comm, gcommOp_t* head, gcommOp_t* tail, int n);
int gcommProgressPass(gcommComm_t comm);
void gcommPublishStop(gcommComm_t comm, gcommResult_t res, const char* why);
void gcommSetAsyncError(gcommComm_t comm, gcommResult_t res);
/* Stops comm now (gcommCommAbort, gcommCommRevoke, a peer's revoke): res becomes its error, then
 * every wait on it returns. */
void gcommStop(gcommComm_t comm, gcommResult_t res);
/* comm is revoked by rank by (here, or seen now): it stops with gcommRevoked, the node's revoke
 * word says so and the network tells the other nodes (from the next pass on), so the revoke
 * spreads. The first revoke stays. */
void gcommRevokeBy(gcommComm_t comm, int by);
/* Whether comm is revoked, here or (seen now) by a rank of this node, in the node's revoke word,
 * or of another node, through the network: the first sight revokes comm here (gcommRevokeBy). */
int gcommRevokeSeen(gcommComm_t comm);
/* gcommSuccess, or, when gcommRevokeSeen, the communicator's error recorded at where. */
gcommResult_t gcommRevokedResult(gcommComm_t comm, const char* where);
/* gcommSuccess, or a rank of this node has died: comm stops with its error, named, at where. */
gcommResult_t gcommDeadPeerResult(gcommComm_t comm, const char* where);
gcommResult_t gcommStartGpuProxy(gcommComm_t comm);
/* The progress thread, once (thread mode; nothing in poll mode): started by the first post, or by
 * the setup of a communicator that spans nodes or has a GPU proxy. */
gcommResult_t gcommStartThread(gcommComm_t comm);

/* ---- gcomm_wait.c ---- */
struct timespec gcommDeadlineIn(long ns);

/* ---- gcomm_args.c ---- */
const char* gcommBadScalarPointer(gcommComm_t comm, const void* scalar, int residence);
/* The arguments a call must get right whatever its count: the datatype, a reduction's op (a
 * PreMulSum operator becomes GCOMM_OP_PREMULSUM), the root, the peer. */
gcommResult_t gcommCheckShape(gcommComm_t comm, gcommOp_t* op, const char* where);
/* Every argument of a call: gcommCheckShape's, the count and the buffers. */
gcommResult_t gcommCheckArgs(gcommComm_t comm, gcommOp_t* op, const char* where);
/* A buffer that call moves count elements through on this rank (isSend: reads them): present, and
 * memory of the communicator's kind (host, or GPU memory the GPU can use). */
gcommResult_t gcommCheckBuffer(gcommComm_t comm, const void* buf, int isSend, size_t count,
                               const char* call, const char* where);
/* comm is a live communicator (gcommCommIsLive), or the error says why not. */
gcommResult_t gcommCheckCommListed(gcommComm_t comm, const char* where);
/* The handle this thread last found live, and the live list's generation then (gcomm_args.c). */
extern uint64_t gcommLiveGen; /* atomic */
extern __thread gcommComm_t gcommLastLive;
extern __thread uint64_t gcommLastLiveGen;
/* Whether comm is the handle this thread last found live, no communicator gone since: it still
 * is. gcommCheckComm, where every call starts, passes it at once, and asks gcommCheckCommListed
 * about any other. */
static inline int gcommLiveAtOnce(gcommComm_t comm) {
  return comm != NULL && comm == gcommLastLive &&
         gcommLastLiveGen == __atomic_load_n(&gcommLiveGen, __ATOMIC_ACQUIRE);
}
static inline gcommResult_t gcommCheckComm(gcommComm_t comm, const char* where) {
  return gcommLiveAtOnce(comm) ? gcommSuccess : gcommCheckCommListed(comm, where);
}
/* The handle this thread last passed the owner check with (gcommEnqueueCheck), and the live
 * list's generation then: while no communicator has gone since, it is live and this thread's. */
extern __thread gcommComm_t gcommLastOwned;
extern __thread uint64_t gcommLastOwnedGen;
/* Whether a call passes gcommEnqueueCheck at once (its name recorded as that does): the handle
 * this thread last owned, no communicator gone since, stream NULL, and a host communicator of one
 * node not stopped, its node's revoke word clear. Otherwise gcommEnqueueCheck says why not, or
 * looks further (a revoke of another node, a GPU's kernel error). */
static inline int gcommCallReady(gcommComm_t comm, gcommStream_t stream, const char* where) {
  if (comm == NULL || comm != gcommLastOwned || stream != NULL ||
      gcommLastOwnedGen != __atomic_load_n(&gcommLiveGen, __ATOMIC_ACQUIRE) || !comm->quickStop ||
      __atomic_load_n(&comm->asyncError, __ATOMIC_ACQUIRE) != gcommSuccess ||
      __atomic_load_n(comm->nodeRevoked, __ATOMIC_ACQUIRE) != 0)
    return 0;
  __atomic_store_n(&comm->ownerLastCall, where, __ATOMIC_RELAXED);
  return 1;
}
/* gcommEnqueueCheck of a call on a communicator whose operations this thread's open group holds:
 * it is live (a destroy refuses it) and this thread's (an earlier call of the group passed the
 * owner check), so only the stream and an error that stopped it since are checked (the node's
 * revoke word was read by the group's first call, and its wait reads it). */
gcommResult_t gcommEnqueueCheckHeld(gcommComm_t comm, gcommStream_t stream, const char* where);
gcommResult_t gcommCheckConfig(const gcommConfig_t* config);
gcommResult_t gcommAsyncError(gcommComm_t comm, const char* where);
int gcommCommIsLive(gcommComm_t comm);
gcommResult_t gcommCommRegister(gcommComm_t comm);
int gcommCommUnregister(gcommComm_t comm);
int gcommIsInPlace(const gcommOp_t* op, int rank, size_t esz);

/* ---- gcomm_order.c ---- */
void gcommBufferCounts(const gcommOp_t* op, int rank, int n, size_t* inCount, size_t* outCount);
int gcommOpMayStart(gcommComm_t comm, gcommOp_t* op);
int gcommRangesMeet(const char* a, size_t alen, const char* b, size_t blen);
int gcommRefOverlaps(gcommComm_t comm, int lane, const char* p, size_t len, int peerDone,
                     uint64_t doneBelow, uint64_t batch);
int gcommRefOverlapsElsewhere(gcommComm_t comm, int lane, const char* p, size_t len,
                              uint64_t batch);
int gcommWorkMayStart(gcommComm_t comm, gcommWork_t* w);

/* ---- gcomm_vcoll.c ---- */
/* An AllGather, AllToAll, Gather or Scatter (of a communicator that passed gcommEnqueueCheck), its
 * arguments checked as its own, enqueued as its vector form's parts (equal blocks). */
gcommResult_t gcommCollParts(gcommComm_t comm, gcommOp_t* args, gcommStream_t stream,
                             const char* where);

/* ---- gcomm_tuning.c ---- */
int gcommChooseAlgo(gcommComm_t comm, int func, size_t bytes);
int gcommChooseChannels(gcommComm_t comm, int func, size_t bytes, int proto, int nParts);
int gcommChooseProto(gcommComm_t comm, int func, int algo, size_t bytes, int nParts);
size_t gcommChooseStepBytes(gcommComm_t comm, int func, int proto, int nParts, size_t share);
int gcommChooseFan(gcommComm_t comm, int func, int algo, int proto);
int gcommByParts(gcommComm_t comm, const gcommOp_t* args);
/* Whether a collective of bytes (its whole data: an all-gather's output, a reduce-scatter's input)
 * captured into a CUDA graph runs straight between the ranks' buffers (GCOMM_GRAPH_REGISTER). */
int gcommDirectPays(gcommComm_t comm, int func, size_t bytes);
void gcommTuningPrint(gcommComm_t comm);

/* ---- gcomm_bootstrap.c ---- */
gcommResult_t gcommCommSetup(gcommComm_t comm, const gcommConfig_t* config);

/* ---- gcomm.c ---- */
/* A new communicator over mpiComm (taken over), or, with mpiComm MPI_COMM_NULL, over boot's pages
 * (gcommCommShrink: rank of nranks, pageRank[r] being rank r's in pages). Collective. */
gcommResult_t gcommCommCreate(gcommComm_t* out, MPI_Comm mpiComm, const gcommConfig_t* config,
                              gcommComm_t pages, const int* pageRank, int rank, int nranks);
/* The config a communicator made from comm inherits when the caller gives none. */
void gcommInheritConfig(gcommComm_t comm, gcommConfig_t* config);

/* ---- gcomm_enqueue.c ---- */
/* One operation: the communicator's checks (gcommEnqueueCheck), its arguments', then posted,
 * launched or held by the group; gcommEnqueueChecked skips the first, done by the caller. */
gcommResult_t gcommEnqueue(gcommComm_t comm, gcommOp_t* args, gcommStream_t stream,
                           const char* where);
gcommResult_t gcommEnqueueChecked(gcommComm_t comm, gcommOp_t* args, gcommStream_t stream,
                                  const char* where);
gcommResult_t gcommGroupOpen(void);
gcommResult_t gcommGroupClose(void);

/* ---- gcomm_params.c ---- */
gcommResult_t gcommParamsAgree(gcommComm_t comm);
void gcommParamsLoad(gcommParams_t* p, gcommComm_t comm, const gcommConfig_t* config);
void gcommParamsPrint(gcommComm_t comm);
uint64_t gcommHashString(const char* s);

#endif /* GCOMM_CORE_H */
