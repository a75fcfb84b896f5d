/*
 * gcomm_internal.h - what the core (gcomm.c, gcomm_*.c) and the transports share: the
 * communicator, connections, operations, parameters, logging and the error idiom, and the
 * transport interface (gcommTransport_t). Not installed; users include gcomm.h.
 */
#ifndef GCOMM_INTERNAL_H
#define GCOMM_INTERNAL_H

#include <pthread.h>
#include <stdint.h>
#include <sys/types.h>

#include "gcomm.h"
#include "gcomm_profiler.h"
#include "gcomm_reduce.h"
#include "gcomm_sched.h"

#if defined(GCOMM_CUDA) || defined(GCOMM_HIP) /* the GPU engine, either platform */
#define GCOMM_GPU 1
#endif

/* ---- Logging and errors ---- */
enum { GCOMM_LOG_NONE, GCOMM_LOG_WARN, GCOMM_LOG_INFO, GCOMM_LOG_TRACE };
enum {
  GCOMM_SUBSYS_INIT = 1 << 0,
  GCOMM_SUBSYS_COLL = 1 << 1,
  GCOMM_SUBSYS_P2P = 1 << 2,
  GCOMM_SUBSYS_PROXY = 1 << 3,
  GCOMM_SUBSYS_NET = 1 << 4,
  GCOMM_SUBSYS_SHM = 1 << 5,
  GCOMM_SUBSYS_TUNING = 1 << 6,
  GCOMM_SUBSYS_ENV = 1 << 7,
  GCOMM_SUBSYS_PROFILE = 1 << 8,
  GCOMM_SUBSYS_ALL = 0xffff
};

void gcommLog(int level, int subsys, gcommComm_t comm, const char* where, const char* fmt, ...)
    __attribute__((format(printf, 5, 6)));
int gcommLogEnabled(int level, int subsys);
#define GCOMM_WARN(comm, ...) \
  gcommLog(GCOMM_LOG_WARN, GCOMM_SUBSYS_ALL, comm, __func__, __VA_ARGS__)
#define GCOMM_INFO(subsys, comm, ...) gcommLog(GCOMM_LOG_INFO, subsys, comm, __func__, __VA_ARGS__)
/* The subsystems GCOMM_DEBUG=TRACE logs, once the log is set up; every bit until then, so that
 * the first trace sets it up (gcommLogEnabled). */
extern int gcommTraceSubsys;
/* every operation traces: its arguments are evaluated, and the call made, only when logged; an
 * untraced operation pays one load and a test (a call to gcommLogEnabled cost ~40 instructions
 * an operation) */
#define GCOMM_TRACE(subsys, comm, ...)                                            \
  do {                                                                            \
    if ((__atomic_load_n(&gcommTraceSubsys, __ATOMIC_RELAXED) & (subsys)) != 0 && \
        gcommLogEnabled(GCOMM_LOG_TRACE, subsys))                                 \
      gcommLog(GCOMM_LOG_TRACE, subsys, comm, __func__, __VA_ARGS__);             \
  } while (0)

/* Records and logs an error: what (the message), where (the function), which peer (when >= 0,
 * with its pid and host). Returns res so that `return GCOMM_ERROR(...)` reads naturally. */
gcommResult_t gcommSetError(gcommComm_t comm, gcommResult_t res, int peer, const char* where,
                            const char* fmt, ...) __attribute__((format(printf, 5, 6)));
#define GCOMM_ERROR(comm, res, peer, ...) gcommSetError(comm, res, peer, __func__, __VA_ARGS__)
#define GCOMM_CHECK(call)                  \
  do {                                     \
    gcommResult_t res_ = (call);           \
    if (res_ != gcommSuccess) return res_; \
  } while (0)

uint64_t gcommNowNs(void);
/* Polls a wait makes before it reads the clock (for its deadline, probes and back-off): a read
 * costs as much as a progress pass on some virtual machines (90 ns), and the peer of a small
 * operation usually answers within these few microseconds. */
#define GCOMM_UNTIMED_POLLS 32
/* The one back-off of every wait (gcomm_wait.c): spin spinUs microseconds, then yield the core,
 * then (maxNapUs > 0) sleep for a fraction of the time already waited, at most maxNapUs, so that
 * an abort or a deadline is seen quickly. Many ranks share few cores in tests. *idleSince is 0
 * while things move. Returns microseconds idle. */
uint64_t gcommBackoff(uint64_t* idleSince, uint64_t spinUs, uint64_t maxNapUs);
/* A spinning loop's pause: the core's hint that this thread waits on memory. */
static inline void gcommCpuRelax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}
/* Whether process pid (of this machine) is gone or a zombie. */
int gcommProcessIsDead(pid_t pid);
/* "AllReduce", "Broadcast", ... for logs and errors. */
const char* gcommFuncName(int func);

/* ---- gcomm_gdr.c: gdrcopy's CPU mappings of GPU memory, loaded when present ---- */
#define GCOMM_GDR_PAGE 65536 /* gdrcopy pins and maps whole GPU pages */
typedef struct gcommGdr gcommGdr_t;
typedef struct gcommGdrMapping gcommGdrMapping_t;
/* Loads library (NULL: libgdrapi.so.2) and opens the driver; NULL with why[] saying why not. */
gcommGdr_t* gcommGdrOpen(const char* library, char* why, size_t len);
/* Pins and maps GPU memory [gpuAddr, gpuAddr + bytes), both multiples of GCOMM_GDR_PAGE; NULL
 * with why[] saying why not. */
gcommGdrMapping_t* gcommGdrMap(gcommGdr_t* g, uint64_t gpuAddr, size_t bytes, char* why,
                               size_t len);
/* The CPU's address of the mapping's first byte (uncached or write-combined: no caching). */
void* gcommGdrCpu(const gcommGdrMapping_t* m);
void gcommGdrUnmap(gcommGdr_t* g, gcommGdrMapping_t* m);
void gcommGdrClose(gcommGdr_t* g);

/* ---- Parameters: one table in gcomm_params.c, read at communicator init ---- */
typedef struct {
  int algo;              /* GCOMM_ALGO: -1 = cost model, else gcommAlgo_t */
  int proto;             /* GCOMM_PROTO: -1 = cost model, else gcommProto_t (GPU only) */
  int nChannels;         /* GCOMM_NCHANNELS */
  int64_t buffSize;      /* GCOMM_BUFFSIZE: bytes of one connection FIFO */
  int proxyMode;         /* GCOMM_PROXY_MODE */
  int64_t appendFreq;    /* GCOMM_PROGRESS_APPENDOP_FREQ */
  int64_t appendBatch;   /* GCOMM_PROXY_APPEND_BATCH_SIZE */
  int64_t dumpSignal;    /* GCOMM_PROXY_DUMP_SIGNAL */
  int64_t waitSpinUs;    /* GCOMM_WAIT_SPIN_US */
  int64_t timeoutMs;     /* GCOMM_TIMEOUT_MS */
  int64_t checkMismatch; /* GCOMM_CHECK_MISMATCH */
  int64_t p2pDisable;    /* GCOMM_P2P_DISABLE (GPU builds) */
  int64_t p2pMemcpy;     /* GCOMM_P2P_USE_CUDA_MEMCPY (GPU builds) */
  int64_t pdl;           /* GCOMM_PDL (GPU builds) */
  int sharedGpu;         /* GCOMM_SHARED_GPU: GCOMM_SHARED_GPU_AUTO, _KERNELS or _COPY */
  int64_t sharedChunk;   /* GCOMM_SHARED_GPU_CHUNK: bytes of a collective staging slot */
  int sharedCopyBy;      /* GCOMM_SHARED_GPU_COPY: 0 copy engines, 1 a copy kernel (SMs) */
  int64_t sharedDirect;  /* GCOMM_SHARED_GPU_DIRECT: 1 one rank runs a whole collective */
  int64_t graphRegister; /* GCOMM_GRAPH_REGISTER: graph-captured calls between mapped buffers */
  int64_t shmMemcpy;     /* GCOMM_SHM_USE_CUDA_MEMCPY */
  int64_t shmMemcpyMode; /* GCOMM_SHM_MEMCPY_MODE: GCOMM_SHM_COPY_SEND | GCOMM_SHM_COPY_RECV */
  int64_t shmLocality;   /* GCOMM_SHM_LOCALITY: GCOMM_SHM_AT_SENDER or GCOMM_SHM_AT_RECEIVER */
  int64_t threadContext; /* GCOMM_CREATE_THREAD_CONTEXT */
  int64_t gdrSync;       /* GCOMM_GDRCOPY_SYNC_ENABLE */
  int64_t gdrFlush;      /* GCOMM_GDRCOPY_FLUSH_ENABLE */
  const char* gdrLib;    /* GCOMM_GDRCOPY_LIBRARY */
  int cma;               /* GCOMM_CMA: GCOMM_CMA_OFF, _ON or _AUTO */
  int64_t cmaMinBytes;   /* GCOMM_CMA_MIN_BYTES */
  const char* hostId;    /* GCOMM_HOSTID, or NULL */
#ifdef GCOMM_OFI
  int64_t netDisable;       /* GCOMM_NET_DISABLE */
  const char* ofiProvider;  /* GCOMM_OFI_PROVIDER, or NULL */
  const char* ofiIface;     /* GCOMM_OFI_IFACE, or NULL */
  int64_t netSharedBuffers; /* GCOMM_NET_SHARED_BUFFERS */
  int64_t netEndpoints;     /* GCOMM_NET_ENDPOINTS */
#endif
#if defined(GCOMM_GPU) && defined(GCOMM_OFI)
  int netGdr; /* GCOMM_NET_GDR: GCOMM_NET_GDR_OFF, _ON (required) or _AUTO */
#endif
  /* GCOMM_PROFILER_PLUGIN, or NULL */
  const char* profilerPlugin;
  /* whether the environment set GCOMM_NCHANNELS (or config.nChannels), GCOMM_BUFFSIZE and
   * GCOMM_PROXY_MODE (or config.proxyMode): defaults that depend on the communicator's shape then
   * stay out of the way */
  int nChannelsChosen, buffSizeChosen, proxyModeChosen;
} gcommParams_t;
#define GCOMM_SHM_COPY_SEND 1
#define GCOMM_SHM_COPY_RECV 2
#define GCOMM_SHM_AT_SENDER 1
#define GCOMM_SHM_AT_RECEIVER 2
/* The parameters a communicator made now without a config would have (defaults, then the
 * environment): for waits that come before any communicator exists (the NCCL layer's rendezvous).
 */
void gcommParamsRead(gcommParams_t* params);

/* The params table as gcomm_info (tools/gcomm_info.c) reads it: entry i, 0 (-1 past the end);
 * and text parsed as entry i's value the way gcomm reads it: 0 with the value taken in out (e.g.
 * "4194304" for 4M), or -1 when gcomm refuses it (and keeps the default, with a warning). */
typedef struct {
  const char *name, *defaultValue, *doc;
} gcommParamInfo_t;
int gcommParamInfo(int i, gcommParamInfo_t* info);
int gcommParamParse(int i, const char* text, char* out, size_t len);

#define GCOMM_SHARED_GPU_AUTO 0 /* the indices of GCOMM_SHARED_GPU's choices in gcomm_params.c */
#define GCOMM_SHARED_GPU_KERNELS 1
#define GCOMM_SHARED_GPU_COPY 2
#define GCOMM_CMA_OFF 0 /* the indices of GCOMM_CMA's choices in gcomm_params.c */
#define GCOMM_CMA_ON 1
#define GCOMM_CMA_AUTO 2
#define GCOMM_CMA_ALWAYS 1000000 /* comm->cmaSpeed where GCOMM_CMA=1: one copy pays everywhere */
#define GCOMM_NET_GDR_OFF 0      /* the indices of GCOMM_NET_GDR's choices in gcomm_params.c */
#define GCOMM_NET_GDR_ON 1
#define GCOMM_NET_GDR_AUTO 2

/* ---- Connections ----
 * A FIFO of GCOMM_STEPS slots in the receiver's memory. The sender fills slot tail % STEPS and
 * then advances tail; the receiver drains slot head % STEPS and then advances head. */
typedef struct {
  volatile uint64_t tail; /* written by the sender: slots produced */
  char pad0[56];
  volatile uint64_t head; /* written by the receiver: slots consumed */
  char pad1[56];
  volatile uint64_t bytes[GCOMM_STEPS]; /* each slot's word: payload bytes (low 32 bits) and,
                                           between ranks of a node, the sender's call tag */
} gcommFifo_t;

/* A step's line between the ranks of a node (transports/shm.c), low-latency style: the slot's
 * word and, when the payload fits, the payload itself, then the flag (the sender's step + 1),
 * written last with release. The receiver polls this one line, which the sender filled with one
 * hand-off of one cache line, instead of the tail, the word and the slot (three lines; the tail
 * still advances, for dumps). Larger payloads stay in the slot; the line carries their word and
 * ref: where in the sender's memory the payload is instead, when the sender handed it over by
 * reference (GCOMM_CMA), else NULL (ref.at).
 * A FIFO has GCOMM_LINES lines, step s in line s % GCOMM_LINES: a sender of payloads that fit a
 * line runs up to that many steps ahead of its receiver (a slot's payload, GCOMM_STEPS), as
 * MPICH's eager cells let a broadcast root or a sender of small messages go on without waiting for
 * a receiver that has not been scheduled yet. */
#define GCOMM_LINE_PAYLOAD 48
#define GCOMM_LINES 64
/* A reference to a step's payload in the sender's memory: at, and, when that lies in a buffer from
 * gcommHostAlloc (gcomm_hostmem.c), the buffer's file, which the receiver maps to copy with plain
 * loads: its allocation number (0: plain memory, read with process_vm_readv), its address and size
 * in the sender, the sender's descriptor of it. */
typedef struct {
  const char* at;
  uint64_t fileId, fileBase, fileBytes;
  int32_t fileFd;
} gcommRef_t;
_Static_assert(sizeof(gcommRef_t) <= GCOMM_LINE_PAYLOAD, "a reference fits a line's payload");
typedef struct {
  union {
    char data[GCOMM_LINE_PAYLOAD];
    gcommRef_t ref;
  };
  volatile uint64_t word;
  volatile uint64_t flag;
} __attribute__((aligned(64))) gcommLine_t;

/* The bytes of one FIFO in host memory: its counters, then its GCOMM_STEPS slots, page-rounded
 * (shm segments, the network's FIFOs, a GPU's network FIFOs staged in pinned memory). */
static inline size_t gcommFifoBytes(size_t slotBytes) {
  size_t b = sizeof(gcommFifo_t) + GCOMM_STEPS * slotBytes;
  return (b + 4095) & ~(size_t)4095;
}

/* What differs between the word a peer wrote (got) and the one expected, as text for an error. */
void gcommDescribeMismatch(char* buf, size_t len, uint64_t got, uint64_t expected);

typedef struct {
  gcommFifo_t* fifo;
  char* slots;   /* GCOMM_STEPS slots of slotBytes: after fifo, or elsewhere (GPU memory) */
  uint64_t step; /* this side's own counter: the next slot to fill (sender) or drain */
  /* sender, host executor: the receiver's head as last read, so that the executor reads it again
   * only when the room it leaves runs out */
  uint64_t headSeen;
  size_t slotBytes;
  int peer;
  /* A FIFO between the ranks of a node: its GCOMM_LINES lines (gcommLine_t), which the host
   * executor fills and polls in place of the tail and the words. NULL elsewhere. */
  gcommLine_t* lines;
  /* A send FIFO whose receiver takes data from any memory: a network provider that sends from it
   * (transports/net_ofi.c), or a rank of this node that reads the sender's memory itself
   * (transports/shm.c, GCOMM_CMA). The host executor may hand a slot over as a pointer into the
   * caller's buffer (refs[slot]) instead of copying the data into it; refUntil (atomic): the step
   * after the last slot so handed over. NULL elsewhere. Between ranks of a node refs is the
   * sender's own record and the reference itself travels in the slot's line (gcommLine_t.ref),
   * which the receiver copies from, once, out of the memory of process refPid (the sender; set on
   * both sides, 0 over the network); the sender hands over only steps of at least refMinBytes
   * there. */
  const char** refs;
  uint64_t refUntil;
  size_t refMinBytes, refMinFileBytes; /* the latter from a buffer of gcommHostAlloc */
  pid_t refPid;
  uint64_t refBatch[GCOMM_STEPS]; /* sender: the post (gcommOp.batch) of each slot's reference */
  /* A network receive FIFO whose provider receives into any memory (transports/net_ofi.c): where
   * the message of each slot's step was received, when not in the slot: the caller's memory the
   * step writes (gcommNetDirectTarget chose it as the receive was posted), else NULL. NULL
   * elsewhere. holdRecvs: the operations last queued on it took messages of at least half a slot,
   * so receives past the queued operations wait for the next one, which may take them directly
   * (gcommNetDirectTarget); small ones keep receives posted ahead, their credits off the path. */
  char** landed;
  int holdRecvs;
  /* A network connection's first failed receive or credit (transports/net_ofi.c connFailed): a
   * step that waits on it fails with this text. NULL while it works, and elsewhere. */
  const char* netFailure;
} gcommConn_t;

/* The word of c's slot of step s: in its line (a FIFO between the ranks of a node), else in the
 * FIFO's words. */
static inline uint64_t gcommSlotWord(const gcommConn_t* c, uint64_t s) {
  return c->lines != NULL ? c->lines[s % GCOMM_LINES].word : c->fifo->bytes[s % GCOMM_STEPS];
}

/* ---- Operations ----
 * An operation (a collective, a send or a receive) is split into works, one per channel, each a
 * contiguous slice of the data. Each work sits in one queue and queues run in parallel: one
 * queue per collective channel (every rank posts collectives in the same order), one per (peer,
 * direction, point-to-point channel) (sends and receives of a pair match in order on every
 * channel: both sides derive a Send/Recv's channel count from count * type size alone). */
typedef struct gcommOp gcommOp_t;
typedef struct gcommWork {
  struct gcommWork* next; /* in its queue */
  gcommOp_t* op;
  int queue, lane;
  gcommSched_t sched;
  long step, nSteps;
  /* step stepHeld - 1 as gcommSchedGetStep gave it (0: none yet): a step that waits is polled
   * again and again, and its FIFOs' readiness is all that changes */
  gcommStep_t held;
  long stepHeld;
  /* when the current step's wait was first timed (gcommWorkAdvance), 1 while it waits untimed
   * yet, 0 when moving */
  uint64_t waitSinceNs;
  int waitPeer, waitRecv;
  int untimedPolls; /* polls of the current wait before its clock started */
  int mayStart;     /* workMayStart said yes: it stays so, since later calls wait for this one */
  int profStarted;  /* profiler: PROF_OP / PROF_STEP events started (0 without one) */
  void *profOp, *profStep; /* their handles */
} gcommWork_t;

struct gcommOp {
  gcommOp_t* next; /* in the posted list */
  /* Host communicators: the operations the engine holds, in call order (gcommComm.activeHead).
   * batch: the post it came in, one call or one group; a batch's operations run concurrently, and
   * an operation waits for earlier batches' operations whose memory it shares (opMayStart). */
  gcommOp_t *prevActive, *nextActive;
  uint64_t batch;
  int mayStart; /* no earlier unfinished operation shares its memory any more */
  int func, algo, proto, datatype, root, peer, nChannels;
  int callFunc; /* the call's function: func, or the call a part belongs to (gcommSubmitParts) */
  int redop;    /* a gcommRedOp_t below gcommNumOps, or GCOMM_OP_PREMULSUM */
  /* PreMulSum: the scalar's bits (of datatype), or where to read them when the work runs */
  uint64_t scalar;
  const void* scalarPtr;
  const void* sendbuff;
  void* recvbuff;
  size_t count;
  uint64_t seq; /* collectives: the communicator's collective sequence number */
  uint32_t tag; /* the call, packed for the FIFO slots (0 with GCOMM_CHECK_MISMATCH=0) */
  int nWorks, nWorksLeft;
  int pooled; /* a one-work record of the communicator's pool (gcommOpAlloc) */
  /* the binomial Gather's and Scatter's scratch (GCOMM_BUF_SCRATCH), scratchBytes of malloc's,
   * kept with a pooled record for its next operations */
  void* scratch;
  size_t scratchBytes;
  /* profiler: the Coll/P2p event, parent of the works' events */
  void* profHandle;
  gcommWork_t works[];
};

typedef struct {
  gcommWork_t *head, *tail;
} gcommQueue_t;

/* A rank's card: what the other ranks need to reach it, exchanged once at setup (every rank
 * holds every rank's card in comm->cards): its node (hostId, host), its process (pid: the liveness
 * probes), its GPU, its shared-memory segment and its GPU FIFO region's IPC handle. */
typedef struct {
  uint64_t hostId;
  pid_t pid;
  int device;
  char host[64];
  char shmName[64];
  unsigned char devHandle[64]; /* GPU communicators: cudaIpcMemHandle_t of the FIFO region */
  /* a word of this process, its value and address, and where this process maps its shm segment:
   * the ranks of its node read them at setup, to learn whether they may read this process's
   * memory, and how fast (GCOMM_CMA) */
  uint64_t cmaWord, cmaAt, shmAt;
} gcommCard_t;

/* A PreMulSum operator of a communicator (gcommRedOpCreatePreMulSum): handle gcommNumOps + i is
 * slot i of gcommComm.redOps. */
#define GCOMM_MAX_REDOPS 256
typedef struct {
  int used, datatype;
  uint64_t scalar;       /* host-immediate: the scalar's bits, read at creation */
  const void* scalarPtr; /* device residence: read when each operation runs; else NULL */
} gcommRedOpSlot_t;
#define GCOMM_MAX_CHANNELS 128 /* GCOMM_NCHANNELS, config.nChannels */

/* The checks every call makes before its own arguments': a valid communicator, stream NULL on
 * a host communicator, no earlier error that stopped it. */
gcommResult_t gcommEnqueueCheck(gcommComm_t comm, gcommStream_t stream, const char* where);
/* Enqueues one call made of n point-to-point parts (Send/Recv arguments; gcomm_vcoll.c's vector
 * collectives), whose checks are done: the call's own, of its communicator and of its buffers
 * whole, of which each part is a piece, so no part is checked again. All are posted or launched
 * together (or held by the group) under one collective sequence number, each tagged as a call of
 * func with the part's datatype and root and a hash of countsHash (when 0: of the part's count),
 * so that a peer in another call is named. */
gcommResult_t gcommSubmitParts(gcommComm_t comm, gcommOp_t* parts, int n, int func,
                               uint64_t countsHash, gcommStream_t stream, const char* where);

/* ---- Profiler (gcomm_profiler.h; gcomm_profiler.c) ---- */
typedef struct {
  int mask;  /* the plugin's activation mask (it may change it): 0 without a plugin */
  void* lib; /* dlopen handle */
  const gcommProfiler_v1_t* api;
  void* context; /* its context for this communicator */
} gcommProf_t;
/* Whether a hook for these event types has work: the one branch a hook costs without a plugin. */
#define GCOMM_PROF_ON(comm, types) \
  __builtin_expect((__atomic_load_n(&(comm)->prof.mask, __ATOMIC_RELAXED) & (types)) != 0, 0)
/* Loads GCOMM_PROFILER_PLUGIN and calls its init (a failure only warns); finalize at destroy. */
void gcommProfInit(gcommComm_t comm);
void gcommProfFinalize(gcommComm_t comm);
/* The hooks, each behind GCOMM_PROF_ON or a non-NULL handle. */
void gcommProfOpEnqueued(gcommComm_t comm, gcommOp_t* op, int inGroup); /* Group, Coll/P2p */
void gcommProfGroupEnd(gcommComm_t comm);
void gcommProfStepBegin(gcommComm_t comm, gcommWork_t* w, const gcommStep_t* st);
void gcommProfStepWait(gcommComm_t comm, gcommWork_t* w, int peer, int isRecv);
/* Stops w's step event, and its ProxyOp when the work is over (done, or drained: workOver). */
void gcommProfWorkStepEnd(gcommComm_t comm, gcommWork_t* w, int workOver);
void* gcommProfCtrlStart(gcommComm_t comm, gcommProfilerEventState_v1_t state);
void gcommProfCtrlStop(gcommComm_t comm, void* handle, gcommProfilerEventState_v1_t state,
                       int appended);
/* A GPU communicator's kernel-channel event (gcomm_gpu_prof.c, once its launch has completed). */
void gcommProfKernelCh(gcommComm_t comm, void* parent, int channel, uint64_t startNs,
                       uint64_t stopNs);
/* One network message: started when posted, stopped (gcommProfStop) when complete. */
void* gcommProfNetStart(gcommComm_t comm, int peer, int channel, uint64_t step, size_t bytes,
                        int isSend);
void gcommProfStop(gcommComm_t comm, void* handle);

/* What a rank tells the other ranks, so that a peer blocked on it fails fast and names it: the
 * error that stopped it, and the collective each collective channel is in (a rank at the same
 * sequence number in a different call is a mismatch even when no data can flow, e.g. two ranks
 * that both think they are the root). Ranks of one node read it in each other's shared-memory
 * segment; a rank on another node sends its stop (code and msg) over the network. */
#define GCOMM_STATUS_LANES GCOMM_MAX_CHANNELS /* one per collective channel */
/* The page also carries what the ranks of a node exchange without MPI (gcomm_agree.c): which
 * gcommCommShrink of the communicator the rank has reached, and a mailbox of two boxes, one per
 * exchange parity: exchange k writes box k % 2, and a rank writes exchange k + 2 only after every
 * rank has posted k + 1, that is has finished reading k. The network carries the same boxes to
 * the ranks of other nodes (the transports' boxPost and boxRead). A box holds a network card
 * (transports/net_ofi.c: 4 endpoints' addresses). */
#define GCOMM_BOX_BYTES 2048
typedef struct {
  volatile uint64_t round; /* the exchange whose data the box holds (written after it) */
  volatile uint64_t bytes;
  char data[GCOMM_BOX_BYTES];
} gcommBox_t;
/* Ranks that share a GPU without MPS (gcomm_gpu_shared.c): how far a rank's staging chunks are
 * published and how far it has read its peers'. Channel 0 carries collectives (read by every rank
 * that needs the chunk), channel 1 + r the sends to rank r; each has GCOMM_SHARED_SLOTS slots. */
#define GCOMM_SHARED_MAX_RANKS 16
#define GCOMM_SHARED_SLOTS 2
typedef struct {
  char handle[2][64]; /* cudaIpcMemHandle_t of the allocations holding sendbuff, recvbuff */
  uint64_t offset[2]; /* of each buffer in its allocation */
  uint64_t id[2];     /* each allocation's id in its process (CU_POINTER_ATTRIBUTE_BUFFER_ID) */
  uint32_t tag;       /* the call */
  int ok;             /* every handle the call needs was made */
} gcommSharedCard_t;
typedef struct {
  volatile uint64_t published[1 + GCOMM_SHARED_MAX_RANKS]; /* chunks published, per channel */
  volatile uint64_t readColl[GCOMM_SHARED_MAX_RANKS]; /* [r]: 1 + the last chunk of r's channel 0
                                                         this rank read */
  volatile uint64_t readP2p[GCOMM_SHARED_MAX_RANKS];  /* [r]: chunks of r's channel to this rank
                                                         read */
  volatile uint32_t tag[1 + GCOMM_SHARED_MAX_RANKS][GCOMM_SHARED_SLOTS]; /* each slot's call */
  /* The direct path (one rank runs a whole call over every rank's buffers): a rank's card for its
   * latest direct call, how many such calls it has posted a card for (its stream drained), and,
   * on the lead rank, its answers: call << 1 | 1 when it enqueued the call, call << 1 when every
   * rank takes the staging instead. */
  gcommSharedCard_t card;
  volatile uint64_t directPosted;
  volatile uint64_t directAnswer;
} gcommSharedFlags_t;
typedef struct {
  volatile int code;     /* 0, or the gcommResult_t that stopped the rank (written after msg) */
  volatile int finished; /* the rank destroyed the communicator after all its work succeeded */
  char msg[504];
  volatile uint64_t current[GCOMM_STATUS_LANES]; /* (seq + 1) << 32 | tag, 0: none yet */
  gcommSharedFlags_t shared; /* in a node only: the network carries code and msg */
  volatile int revoked;      /* on the page of the node's first rank only: 1 + the rank of the first
                                revoke a rank of this node published, or 0 (whatever code says): the
                                node's one revoke word, which every call reads */
  volatile uint64_t shrinkSeq; /* the gcommCommShrink of this communicator the rank is in */
  volatile int excludedBy;     /* 1 + the survivor whose shrink left this rank out, or 0 */
  gcommBox_t box[2];
} gcommStatus_t;

/* ---- Transports ----
 * What the core asks of a transport (shm, the network, the GPU's FIFOs), each filling one
 * gcommTransport_t; the core keeps the build's transports in comm->transports and loops over
 * them: it never names one in its progress, completion or teardown. Every hook may be NULL (the
 * transport has nothing to do there) and copes with a transport this communicator does not use
 * (no peer on another node, a host communicator): it then does nothing. */
typedef struct {
  const char* name;
  /* Collective: connects its connections once every rank's card is known; connectWhat names the
   * step in the error every rank gets when one rank fails it. connected runs after every rank has
   * succeeded (collective too: the shm segments' names go away, and the ranks agree on reading
   * each other's memory). */
  gcommResult_t (*connect)(gcommComm_t comm);
  const char* connectWhat;
  gcommResult_t (*connected)(gcommComm_t comm);
  /* The proxy's share of a progress pass: moves what it can, sets *moved when anything moved. */
  gcommResult_t (*progress)(gcommComm_t comm, int* moved);
  /* Whether data it holds for finished operations is still in flight (withCredits: or what it owes
   * peers besides data): the engine keeps running for it. */
  int (*pending)(gcommComm_t comm, int withCredits);
  /* Whether the engine must keep polling rather than nap: a provider that moves only when polled,
   * or GPU kernels waiting on FIFOs the proxy moves. */
  int (*mustPoll)(gcommComm_t comm);
  /* The communicator stopped (an error, an abort): whatever waits on its proxy stops waiting,
   * and the ranks it reaches learn why (comm->stopCode, comm->stopMsg). */
  void (*stop)(gcommComm_t comm);
  /* What it knows of rank's status (the executor's probes read it), or NULL: rank is not
   * reached through it. */
  gcommStatus_t* (*status)(gcommComm_t comm, int rank);
  /* 1 + the rank whose gcommCommRevoke reached this rank through it (from ranks whose status
   * pages this rank cannot read), or 0. mayRead: the caller holds progressLock, so it may read
   * what has come since the last pass. */
  int (*revokedBy)(gcommComm_t comm, int mayRead);
  /* Exchanges without MPI (gcomm_agree.c) with the ranks it reaches that have no status page
   * here. boxPost: this rank's box (mine->round, mine->bytes of data) to those of ranks[0..n) it
   * reaches, polling until deadline for room. boxRead: rank's box of round once it came, else
   * NULL (not yet, or rank not reached through it). Both under progressLock. */
  gcommResult_t (*boxPost)(gcommComm_t comm, const gcommBox_t* mine, const int* ranks, int n,
                           uint64_t deadline);
  const gcommBox_t* (*boxRead)(gcommComm_t comm, int rank, uint64_t round);
  /* The progress thread starts: what its calls need (the GPU's device current there). */
  void (*threadStart)(gcommComm_t comm);
  /* Teardown, in two rounds over every transport: close (in order: after it, nothing lands in
   * memory another transport owns), then free (in reverse order). */
  void (*close)(gcommComm_t comm);
  void (*free)(gcommComm_t comm);
} gcommTransport_t;
#define GCOMM_MAX_TRANSPORTS 4
extern const gcommTransport_t gcommShmTransport; /* transports/shm.c */
#ifdef GCOMM_OFI
extern const gcommTransport_t gcommNetTransport; /* transports/net_ofi.c */
#endif
#ifdef GCOMM_GPU
extern const gcommTransport_t gcommGpuTransport; /* gcomm_gpu_engine.c over transports/p2p.c */
#endif

struct gcommComm {
  MPI_Comm mpiComm;
  int rank, nranks, device;
  int deviceSMs;     /* GPU communicators: the GPU's multiprocessors */
  int deviceCcMajor; /* GPU communicators: compute capability (major) */
  /* GPU communicators: small LL launches run the kernel of 1 block an SM (every rank sharing a
   * GPU has room for one at once); LL operations spread over up to GCOMM_DEV_MEDIUM_WORKS
   * channels, a medium launch of 1 block an SM, where there is room for two of those;
   * launchOverlap: which launches may start while the previous one on their stream ends
   * (GCOMM_PDL, a GCOMM_OVERLAP_* of gcomm_device.h) */
  int smallKernel, mediumKernel, launchOverlap;
  /* GPU communicators: the blocks one launch of this rank may hold, so that every rank sharing
   * its GPU is resident at once (GCOMM_DEV_MAX_WORKS when the rank has the GPU to itself) */
  int blockBudget;
  uint64_t devicePci; /* GPU communicators: the GPU's PCI domain, bus and device */
  int deviceMps;      /* GPU communicators: this process reaches its GPU through MPS */
  int sharedCopy;     /* GPU communicators: every rank on one GPU, run by gcomm_gpu_shared.c */
  int nLocal;         /* ranks on this node */
  int* localRanks;    /* their ranks, this one's included */
  volatile int* nodeRevoked; /* the node's revoke word (gcommStatus_t.revoked; NULL: no page) */
  /* a host communicator of one node with a revoke word: a revoke reaches it in that word alone,
   * and a stop in asyncError, so a call learns both from two loads (gcommCallReady) */
  int quickStop;
  gcommCard_t* cards; /* every rank's card */
  char name[64];
  gcommParams_t params;
  int nChannels;    /* collective channels: lanes [0, nChannels) */
  int nP2pChannels; /* point-to-point channels: lanes [nChannels, nChannels + nP2pChannels) */
  int nLanes;       /* nChannels + nP2pChannels */
  size_t slotBytes;
  gcommConn_t* sendConns; /* [lane * nranks + peer] */
  gcommConn_t* recvConns;
  struct gcommShm* shm;
  /* host communicators: steps between ranks of this node may go by reference, the receiver
   * copying from the sender's memory (transports/shm.c, GCOMM_CMA); every rank alike. cmaSpeed:
   * how fast such a read runs, per mille of a copy's (the ranks' median; GCOMM_CMA_ALWAYS where
   * GCOMM_CMA=1), which decides where one copy pays (gcomm_executor.c) */
  int cma, cmaSpeed;
  /* atomic: 1 once any step has gone by reference (gcommConn_t.refs); until then no send reads
   * the caller's memory, and the checks for such sends (gcommRefOverlaps, the shm transport's
   * pending) need not look at every connection */
  int refsUsed;
#ifdef GCOMM_OFI
  struct gcommNet* net; /* transports/net_ofi.c; NULL when every rank is on one node */
#endif
  struct gcommDev* dev; /* GPU communicators: gcomm_gpu_engine.c */
  const gcommTransport_t* transports[GCOMM_MAX_TRANSPORTS]; /* the build's, in setup order */
  int nTransports;
#ifdef GCOMM_OFI
  /* What the network transport asks of the rest, set at setup (the network calls no other file):
   * where the receive of step s of a receive FIFO may land (gcommNetDirectTarget), and, on a GPU
   * communicator, a wait for the copies of GPU memory the provider issued from this thread. */
  char* (*netDirectTarget)(gcommComm_t comm, gcommConn_t* c, uint64_t s, size_t* bytes,
                           uint64_t* queuedUntil);
  gcommResult_t (*netFence)(gcommComm_t comm, int providerCopies);
#endif

  /* Exchanges without MPI (gcomm_agree.c): a communicator made by gcommCommShrink has no MPI
   * communicator (mpiComm is MPI_COMM_NULL) and sets itself up through boot, the status pages of
   * its parent, then of its own segments. The transports' exchanges at setup go through allgather
   * (MPI's, or the pages'). pageRounds: exchanges made so far over this communicator's pages;
   * shrinkSeq: its gcommCommShrink calls so far. */
  struct gcommBoot* boot;
  gcommResult_t (*allgather)(gcommComm_t comm, const void* mine, size_t bytes, void* all);
  /* gcommSuccess, or (the GPU engine's waits ask) the error of a revoke seen now, at where */
  gcommResult_t (*revokedResult)(gcommComm_t comm, const char* where);
  /* gcommSuccess, or the error of a rank of this node found dead now, which stops comm (a GPU
   * wait that has lasted 100 ms asks every 50 ms: kernels cannot probe a process) */
  gcommResult_t (*deadPeerResult)(gcommComm_t comm, const char* where);
  uint64_t pageRounds, shrinkSeq;

  /* progress engine */
  pthread_mutex_t postLock;
  pthread_cond_t postCond; /* posted work or stop, for the sleeping progress thread */
  gcommOp_t *postedHead, *postedTail;
  uint64_t batches;                   /* posts so far (the owner thread's): gcommOp.batch */
  gcommOp_t *activeHead, *activeTail; /* fetched, unfinished operations in call order */
  int nQueues;
  gcommQueue_t* queues;
  long nActiveWorks;
  uint64_t* busyQueues; /* a bit a queue, set while it holds a work: a pass visits only those */
  pthread_mutex_t progressLock;
  pthread_t thread;
  int threadStarted, stopThread;
  uint64_t passes, dumpSeen;
  uint64_t opsPosted;  /* atomic: operations handed to the engine */
  uint64_t opsGpu;     /* atomic: GPU operations launched (the progress thread's CPU report) */
  uint64_t opsDone;    /* atomic: operations the engine finished */
  uint64_t opsSettled; /* atomic: opsPosted when a wait last found them all done and no transport
                          holding their data: until the next post, every wait is over at once */
  pthread_mutex_t doneLock;
  pthread_cond_t doneCond;
  int waiters;    /* atomic: threads sleeping on doneCond */
  int drivers;    /* atomic: threads in gcommWait running passes themselves (see gcommWait) */
  int standby;    /* the progress thread sleeps while drivers run passes (under postLock) */
  int callerLeft; /* a caller's pass (gcommPostOps) left work in the queues (under postLock): the
                   * progress thread must not go to sleep on it unseen */
  int abortFlag;  /* atomic */
  int asyncError; /* atomic gcommResult_t: the error that stopped the communicator */
  /* atomic: 1 + the rank whose gcommCommRevoke stopped it (asyncError gcommRevoked), once it
   * was revoked here or seen revoked, else 0; the network tells the other nodes */
  int revoked;
  uint64_t collSeq;
  /* One-work operation records (every small call's) kept for reuse instead of a calloc and a free
   * a call: the threads finishing operations push them on opPool (atomic), and the owner takes
   * the whole stack at once into opFree when its own list runs out (gcommOpAlloc), so that a call
   * costs one locked instruction for its record, not four. opFree: the owner's, at most
   * GCOMM_OP_POOL_MAX records (opFreeSize). */
  gcommOp_t* opPool;
  gcommOp_t* opFree;
  int opFreeSize;
  /* A vector collective's (or a collective moving as parts) arguments of its parts as the call
   * builds them (gcomm_vcoll.c): 2 * nranks records, made at the first such call and kept, the
   * owner thread's (the parts are copied into operation records before the call returns). */
  gcommOp_t* partArgs;
  /* The cost model's last choice for each function (owner thread only): a program repeats its
   * sizes, and the choice depends on nothing else that changes. bytesKey: bytes + 1, 0 none;
   * nParts: the parts of the call it was for (gcommChooseChannels). */
  struct {
    size_t bytesKey;
    int nParts, algo, proto, nChannels;
  } choice[gcommNumFuncs];
  uint64_t livenessNs; /* when the engine last probed the local ranks' pids */
  /* How long a wait that drives the engine spins before it yields the CPU: GCOMM_WAIT_SPIN_US
   * where the node has a CPU for each of its ranks, else 0 (gcomm_bootstrap.c chooseWaitSpin) */
  uint64_t waitSpinUs;
  /* why this rank stopped, as gcommPublishStop tells the other ranks (code atomic, 0 until then,
   * written after msg; the first stays) */
  int stopCode;
  char stopMsg[sizeof(((gcommStatus_t*)0)->msg)];

  /* the thread that created the communicator, the only one that may enqueue on it (gcomm.h),
   * and its last enqueued call (atomic), for the message that names a second thread */
  pthread_t owner;
  long ownerTid;
  const char* ownerLastCall;

  /* group */
  gcommOp_t *groupHead, *groupTail;
  struct gcommComm* groupNext;
  int inGroup;
  void* profGroup;   /* profiler: this communicator's Group event in the current group */
  void* groupStream; /* GPU communicators: the stream of the group's operations */

  pthread_mutex_t errorLock;
  char lastError[1024];

  gcommRedOpSlot_t redOps[GCOMM_MAX_REDOPS]; /* PreMulSum operators (caller's thread only) */

  /* the profiler plugin (all zero without one) */
  gcommProf_t prof;
};

/* ---- Shared-memory transport (transports/shm.c) ---- */
/* Creates this rank's segment: the FIFOs every local rank (itself included) sends to it on every
 * lane, and an area of areaBytes (0: none) for the caller, allocated now and zero (a GPU
 * communicator's FIFO region staged through host memory). Names it in card->shmName. */
gcommResult_t gcommShmCreate(gcommComm_t comm, gcommCard_t* card, size_t areaBytes);
/* Maps every local peer's segment and fills the connections; then, after all ranks have mapped
 * (the caller's barrier), gcommShmUnlink removes the names so nothing outlives the processes. */
gcommResult_t gcommShmConnect(gcommComm_t comm);
void gcommShmUnlink(gcommComm_t comm);
/* The bytes of one rank's segment: the FIFOs of nLocal senders on nLanes lanes of slotBytes
 * slots, an area of areaBytes, the status page. FIFO pages take /dev/shm space as they are first
 * used, the area at creation. */
size_t gcommShmSegmentBytes(size_t slotBytes, int nLanes, int nLocal, size_t areaBytes);
/* The area reserved in rank's segment, as mapped in this process (after gcommShmConnect for
 * another rank), or NULL: none reserved, rank not on this node or not mapped. */
void* gcommShmArea(gcommComm_t comm, int rank);
/* Where the receiver on c reads a slot that the sender handed over by reference (GCOMM_CMA):
 * *at, the payload in this rank's mapping of the sender's buffer (gcommHostAlloc), else *at =
 * to, where it copied the payload from the sender's memory. gcommSuccess, or the error, naming the
 * peer. */
gcommResult_t gcommShmReadRef(gcommComm_t comm, const gcommConn_t* c, const gcommRef_t* ref,
                              char* to, size_t bytes, char** at);
/* Host memory from gcommHostAlloc (gcomm_hostmem.c): whether [at, at + bytes) lies in one such
 * buffer, whose file then fills ref's file fields. */
int gcommHostFind(const void* at, size_t bytes, gcommRef_t* ref);
/* rank's status in its segment, or NULL when rank is not on this node (or not mapped yet). */
gcommStatus_t* gcommShmStatus(gcommComm_t comm, int rank);
void gcommShmFree(gcommComm_t comm);

#ifdef GCOMM_OFI
/* ---- Network transport (transports/net_ofi.c, make OFI=1) ---- */
/* Collective over the communicator (one MPI_Allgather of fabric addresses) when any two ranks are
 * on different nodes: opens the endpoint and, for a host communicator, connects every remote
 * peer's connections on every lane to FIFOs in this rank's registered memory. Nothing when all
 * ranks share a node. */
gcommResult_t gcommNetSetup(gcommComm_t comm);
/* Connects one network edge (to or from remote rank peer, on lane) on a FIFO the caller owns and
 * keeps until gcommCommDestroy: conn->fifo (zeroed, in host memory: the proxy reads its counters),
 * conn->slots (GCOMM_STEPS slots of conn->slotBytes, the same size on both sides) and conn->peer.
 * The slots may be anywhere the provider can take: inside memory given to gcommNetRegister (host
 * memory, or GPU memory when gcommNetDeviceMemory allows), which supplies their registration, or
 * else any host memory (malloc'd, or pinned and mapped for a GPU), registered here for this FIFO.
 * A GPU's kernel fills and drains the slots with the usual protocol (payload and bytes[] before
 * tail/head, with release at system scope). The edge moves by gcommNetProgress like the host
 * FIFOs. Both ranks connect the same (peer, lane) edges, then meet in a barrier before either
 * sends (receives for the first GCOMM_STEPS steps are posted here; later ones are announced by
 * credits). */
gcommResult_t gcommNetConnect(gcommComm_t comm, gcommConn_t* conn, int peer, int lane, int isSend);
/* Registers [buf, buf + len) once, until gcommNetFree, for the FIFO slots that gcommNetConnect
 * will find inside it: host memory (device < 0), or memory of GPU device (cudaMalloc'd; only
 * when gcommNetDeviceMemory said yes). */
gcommResult_t gcommNetRegister(gcommComm_t comm, void* buf, size_t len, int device);
#ifdef GCOMM_GPU
/* A GPU communicator's choice for its network FIFO slots: 1 when the endpoint takes GPU memory
 * (the provider offers FI_HMEM and GCOMM_NET_GDR allows it), else 0 with *why saying so. */
int gcommNetDeviceMemory(gcommComm_t comm, const char** why);
#endif
/* The proxy's network half, run by progressPass only: posts sends of filled slots the receiver
 * has receives for, receives into free slots and the credits that announce them, reads the
 * completion queue, advances head (sends) and tail (receives). Sets *moved when anything
 * happened. An error completion names the peer. */
gcommResult_t gcommNetProgress(gcommComm_t comm, int* moved);
/* gcomm_net_direct.c (the core's comm->netDirectTarget), for the receive of step s of the network
 * receive FIFO c (c->landed set) as it is posted: the caller's memory that step's message may land
 * in directly, or NULL (the slot). Its byte count goes to *bytes. Only a step of a queued
 * collective that copies the message to its output, with nothing else using that memory by the time
 * the message can come; the executor then copies nothing. *queuedUntil: UINT64_MAX, or when no
 * queued operation takes step s and c->holdRecvs is set, the FIFO step after those they take. */
char* gcommNetDirectTarget(gcommComm_t comm, gcommConn_t* c, uint64_t s, size_t* bytes,
                           uint64_t* queuedUntil);
/* Whether filled slots are not all sent, or (withCredits) credits owed to peers not all told (0
 * once the comm failed): the engine keeps running for them after every operation has finished. */
int gcommNetSendsPending(gcommComm_t comm, int withCredits);
/* gcomm_info (tools/gcomm_info.c): the tagged reliable-datagram providers fi_getinfo offers with
 * gcomm's hints and these parameters (GCOMM_OFI_PROVIDER, GCOMM_OFI_IFACE), up to max of them,
 * each with its rank in the choice (gcommNetRankWhy says what it means); *chosen: the index of the
 * one a communicator would open, or -1. Returns how many, or -1 with *err when fi_getinfo fails. */
typedef struct {
  char prov[32], fabric[64], domain[64];
  int rank;
} gcommNetCandidate_t;
int gcommNetCandidates(const gcommParams_t* params, gcommNetCandidate_t* out, int max, int* chosen,
                       const char** err);
const char* gcommNetRankWhy(int rank);
/* Closes the endpoints (which cancels the receives still posted, some into a GPU communicator's
 * pinned FIFOs) and frees everything gcommNetSetup made. */
void gcommNetFree(gcommComm_t comm);
#endif

/* A rank's index among the ranks of its node (cards must be filled). */
static inline int gcommLocalIndex(gcommComm_t comm, int rank) {
  int idx = 0;
  for (int q = 0; q < rank; q++) idx += comm->cards[q].hostId == comm->cards[rank].hostId;
  return idx;
}

#endif /* GCOMM_INTERNAL_H */
