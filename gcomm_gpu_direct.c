/*
 * gcomm_gpu_direct.c - collectives captured into a CUDA graph, run straight between the ranks'
 * own buffers (GCOMM_GRAPH_REGISTER): no FIFO, no copy through slots, no step counters.
 *
 * A captured call is replayed as it was captured, so whatever the ranks learn of each other's
 * buffers at capture holds at every replay. When a collective (not a vector form) alone in its
 * call is captured, at a size where the cost model takes this
 * path (gcommDirectPays; GCOMM_GRAPH_REGISTER=2: every size), every rank posts a card on its status
 * page (the CUDA IPC handle, id and offset of each buffer's allocation, the call's tag), reads
 * every other rank's, and maps each peer's allocation it has not mapped yet (a table by rank and
 * id). The captured graph holds the mappings it uses (a CUDA user object): a mapping is closed at
 * a later capture once no graph holds it, so that a peer may free its buffer, and at destroy. A
 * second exchange says whether every rank mapped everything; only then does every
 * rank capture the direct kernel (gcomm_direct_kernels.cu), and otherwise every rank captures the
 * call on the FIFO kernels as it would have without this. Nothing of this runs at replay.
 *
 * The meetings need a word a block for each pair of ranks: each rank's mailbox (one cudaMalloc,
 * its IPC handle exchanged at connect), written by the peers, and its own meeting counts beside.
 *
 * Every rank must capture the calls that others capture (as every rank must make the calls others
 * make): a rank that launches one while the others capture it leaves them at the card exchange
 * until GCOMM_TIMEOUT_MS, which names it, and its kernel waits out the same deadline.
 *
 * CUDA only (the IPC export is cuPointerGetAttributes's); every rank of the communicator on this
 * node, with FIFOs in GPU memory (not staged, no copy engines), and not ranks sharing a GPU
 * without MPS (gcomm_gpu_shared.c runs those).
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gcomm_core.h" /* gcommDirectPays, gcommPagesAllgather */
#include "gcomm_gpu_engine.h"

#define MAXR GCOMM_DIRECT_MAX_RANKS
#define MAILBOX_WORDS ((size_t)MAXR * GCOMM_DIRECT_BLOCKS)
/* bytes of its share a block combines, about: blocks = the call's bytes / this, at most
 * GCOMM_DIRECT_BLOCKS */
#define BYTES_A_BLOCK (32 * 1024)

/* A peer's allocation mapped here. refs: 1 while the table holds it, plus one for each graph that
 * captured a call on it and still exists (CUDA drops a graph's hold when the graph and its
 * executable forms are gone and their launches have ended: releaseHold, on a thread of CUDA's).
 * The table closes a mapping that only it holds; whoever drops the last reference frees the
 * record. */
typedef struct {
  int rank;
  unsigned long long id; /* the allocation's id in rank's process */
  void* base;            /* as this process maps it */
  int refs;
} directMap_t;

/* What one captured call holds for its graph: the mappings it uses. */
typedef struct {
  directMap_t* maps[2 * GCOMM_DIRECT_MAX_RANKS];
  int n;
} graphHold_t;

struct gcommDirect {
  uint64_t* own;                    /* cudaMalloc: this rank's mailbox, then its meeting counts */
  volatile uint64_t* mailbox[MAXR]; /* every rank's, as this process maps it */
  gcommBufferExport_t export;
  directMap_t** maps; /* the peers' allocations mapped here */
  int nMaps, capMaps;
  uint64_t opened, closed; /* mappings opened, and closed once no graph held them */
  int said;                /* the first direct capture was said at INFO */
  /* the graph node of this communicator's latest direct kernel, and its capture's id */
  cudaGraphNode_t lastNode;
  unsigned long long lastCapture;
};

/* A captured call's card: its buffers, and whether the call follows this communicator's previous
 * direct kernel with nothing between them. */
typedef struct {
  gcommSharedCard_t buffers;
  int follows;
} callCard_t;

/* ---- the peers' allocations, held while a graph uses them ---- */

/* Drops one reference to m; the last frees it (its mapping was closed by the table). */
static void dropMap(directMap_t* m) {
  if (__atomic_sub_fetch(&m->refs, 1, __ATOMIC_ACQ_REL) == 0) free(m);
}

/* A graph's hold ends (CUDA's thread, which may call no CUDA function). */
static void CUDART_CB releaseHold(void* p) {
  graphHold_t* hold = p;
  for (int i = 0; i < hold->n; i++) dropMap(hold->maps[i]);
  free(hold);
}

/* Closes the mappings no graph holds any more: the table's alone. */
static void closeUnused(struct gcommDirect* x) {
  for (int i = 0; i < x->nMaps;) {
    directMap_t* m = x->maps[i];
    if (__atomic_load_n(&m->refs, __ATOMIC_ACQUIRE) != 1) {
      i++;
      continue;
    }
    cudaIpcCloseMemHandle(m->base);
    free(m);
    x->maps[i] = x->maps[--x->nMaps];
    x->closed++;
  }
}

/* The graph being captured holds hold's mappings until CUDA destroys it (a user object, which CUDA
 * releases once the graph and its executable forms are gone and their launches have ended). Where
 * that cannot be set up, the references stay and the mappings live until destroy. */
static void holdForGraph(cudaGraph_t graph, const graphHold_t* hold) {
  graphHold_t* h = malloc(sizeof(*h));
  cudaUserObject_t obj;
  if (h == NULL) return; /* nothing held, nothing released early: never unsafe */
  *h = *hold;
  for (int i = 0; i < h->n; i++) __atomic_add_fetch(&h->maps[i]->refs, 1, __ATOMIC_ACQ_REL);
  if (graph == NULL ||
      cudaUserObjectCreate(&obj, h, releaseHold, 1, cudaUserObjectNoDestructorSync) !=
          cudaSuccess ||
      cudaGraphRetainUserObject(graph, obj, 1, cudaGraphUserObjectMove) != cudaSuccess)
    cudaGetLastError(); /* not sticky */
}

/* ---- connect and free ---- */

typedef struct {
  cudaIpcMemHandle_t mailbox;
  int failed;     /* the mailbox could not be made */
  int exportable; /* the driver has cuPointerGetAttributes: buffers can be exported */
} mailboxCard_t;

static int directComm(gcommComm_t comm) {
  struct gcommDev* d = comm->dev;
  return comm->params.graphRegister && comm->nranks > 1 && comm->nranks <= MAXR &&
         comm->nLocal == comm->nranks && !d->staged && !gcommDeviceCopyEngines(comm) &&
         !comm->sharedCopy;
}

static gcommResult_t makeMailbox(gcommComm_t comm, struct gcommDirect* x, mailboxCard_t* card) {
  size_t bytes = (MAILBOX_WORDS + GCOMM_DIRECT_BLOCKS) * sizeof(uint64_t);
  CUDA_CHECK(comm, -1, cudaMalloc((void**)&x->own, bytes));
  CUDA_CHECK(comm, -1, cudaMemset(x->own, 0, bytes));
  CUDA_CHECK(comm, -1, cudaIpcGetMemHandle(&card->mailbox, x->own));
  return gcommSuccess;
}

/* GCOMM_DEBUG_SUBSYS=TUNING: from which size (the call's whole data) each collective captured into
 * a graph takes this path. */
static void sayThresholds(gcommComm_t comm) {
  char line[512] = "";
  int len = 0;
  if (comm->rank != 0 || !gcommLogEnabled(GCOMM_LOG_INFO, GCOMM_SUBSYS_TUNING)) return;
  for (int f = gcommFuncAllReduce; f <= gcommFuncScatter && len < (int)sizeof(line) - 64; f++) {
    size_t b = 8;
    while (b < ((size_t)1 << 40) && !gcommDirectPays(comm, f, b)) b *= 2;
    len += snprintf(line + len, sizeof(line) - len, " %s from %zu B;", gcommFuncName(f), b);
  }
  GCOMM_INFO(
      GCOMM_SUBSYS_TUNING, comm,
      "graph-captured calls straight between the ranks' buffers (GCOMM_GRAPH_REGISTER=%lld):%s",
      (long long)comm->params.graphRegister, line);
}

/* Every rank's mailbox opened here, after the exchange of their handles. */
static gcommResult_t openMailboxes(gcommComm_t comm, struct gcommDirect* x,
                                   const mailboxCard_t* all) {
  for (int r = 0; r < comm->nranks; r++) {
    if (all[r].failed)
      return GCOMM_ERROR(comm, gcommDeviceError, r,
                         "rank %d could not make its mailbox for graph-captured calls "
                         "(GCOMM_GRAPH_REGISTER)",
                         r);
    if (r == comm->rank) {
      x->mailbox[r] = x->own;
      continue;
    }
    void* p = NULL;
    cudaError_t e = cudaIpcOpenMemHandle(&p, all[r].mailbox, cudaIpcMemLazyEnablePeerAccess);
    if (e != cudaSuccess)
      return GCOMM_ERROR(comm, gcommDeviceError, r, "opening rank %d's mailbox: %s", r,
                         cudaGetErrorString(e));
    x->mailbox[r] = p;
  }
  return gcommSuccess;
}

gcommResult_t gcommGpuDirectConnect(gcommComm_t comm) {
  if (!directComm(comm)) return gcommSuccess;
  int n = comm->nranks, exportable = 1;
  struct gcommDirect* x = calloc(1, sizeof(*x));
  mailboxCard_t mine, *all = calloc((size_t)n, sizeof(mailboxCard_t));
  if (x == NULL || all == NULL) {
    free(x), free(all);
    return GCOMM_ERROR(comm, gcommSystemError, -1, "out of memory");
  }
  comm->dev->direct = x;
  memset(&mine, 0, sizeof(mine));
  gcommBufferExportInit(&x->export);
  /* every rank reaches the exchange, so that one rank's failure fails all of them */
  mine.failed = makeMailbox(comm, x, &mine) != gcommSuccess;
  mine.exportable = x->export.pointerAttributes != NULL;
  gcommResult_t res = gcommAllgather(comm, &mine, sizeof(mine), all);
  for (int r = 0; r < n; r++) exportable &= all[r].exportable;
  if (res == gcommSuccess && exportable) res = openMailboxes(comm, x, all);
  free(all);
  if (res == gcommSuccess && !exportable) { /* alike on every rank: the FIFO kernels for all */
    GCOMM_INFO(GCOMM_SUBSYS_INIT, comm,
               "graph-captured calls run on the FIFO kernels: a rank's driver has no "
               "cuPointerGetAttributes to export buffers with");
    gcommGpuDirectFree(comm);
  }
  if (res == gcommSuccess && comm->dev->direct != NULL) sayThresholds(comm);
  return res;
}

void gcommGpuDirectFree(gcommComm_t comm) {
  struct gcommDirect* x = comm->dev->direct;
  if (x == NULL) return;
  if (x->opened > 0)
    GCOMM_INFO(GCOMM_SUBSYS_COLL, comm,
               "graph-captured calls mapped %llu peer allocations; %llu were let go once no graph "
               "held them, %d at destroy",
               (unsigned long long)x->opened, (unsigned long long)x->closed, x->nMaps);
  for (int i = 0; i < x->nMaps; i++) { /* a graph of this communicator never runs again */
    if (!comm->dev->keepMemory) cudaIpcCloseMemHandle(x->maps[i]->base);
    dropMap(x->maps[i]);
  }
  if (!comm->dev->keepMemory) { /* else a kernel may still use them */
    for (int r = 0; r < comm->nranks; r++)
      if (r != comm->rank && x->mailbox[r] != NULL) cudaIpcCloseMemHandle((void*)x->mailbox[r]);
    if (x->own) cudaFree(x->own);
  }
  free(x->maps);
  free(x);
  comm->dev->direct = NULL;
}

/* ---- a captured call ---- */

/* The call's whole data: an all-gather's output, a reduce-scatter's or all-to-all's input. */
static size_t callBytes(gcommComm_t comm, const gcommOp_t* op) {
  size_t bytes = op->count * gcommTypeSize(op->datatype);
  int perRank = op->func != gcommFuncAllReduce && op->func != gcommFuncBroadcast &&
                op->func != gcommFuncReduce; /* the call's count is a rank's block */
  return perRank ? bytes * (size_t)comm->nranks : bytes;
}

int gcommDeviceDirectCall(gcommComm_t comm, const gcommOp_t* op, void* stream) {
  enum cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (comm->dev == NULL || comm->dev->direct == NULL || op->count == 0 ||
      !gcommDirectPays(comm, op->func, callBytes(comm, op)) ||
      (op->redop >= gcommNumOps && gcommIsReduction(op->func)) ||
      (op->func == gcommFuncAllToAll && op->sendbuff == op->recvbuff))
    return 0;
  return cudaStreamIsCapturing((cudaStream_t)stream, &capture) == cudaSuccess &&
         capture == cudaStreamCaptureStatusActive;
}

/* Whether the other ranks address rank r's sendbuff (which 0) or recvbuff (1) in op. */
static int peersUse(const gcommOp_t* op, int r, int which) {
  int f = op->func, root = r == op->root;
  if (which == 0)
    return f == gcommFuncAllReduce || f == gcommFuncReduceScatter || f == gcommFuncReduce ||
           ((f == gcommFuncBroadcast || f == gcommFuncScatter) && root);
  return f == gcommFuncAllReduce || f == gcommFuncAllGather || f == gcommFuncAllToAll ||
         (f == gcommFuncGather && root);
}

/* Rank r's allocation of card's buffer which mapped here: *m, or NULL where it cannot be. */
static gcommResult_t mapPeer(gcommComm_t comm, struct gcommDirect* x, int r,
                             const gcommSharedCard_t* card, int which, directMap_t** m) {
  for (int i = 0; i < x->nMaps; i++)
    if (x->maps[i]->rank == r && x->maps[i]->id == card->id[which]) {
      *m = x->maps[i];
      return gcommSuccess;
    }
  *m = NULL;
  if (x->nMaps == x->capMaps) {
    int cap = x->capMaps ? 2 * x->capMaps : 16;
    directMap_t** grown = realloc(x->maps, (size_t)cap * sizeof(*grown));
    if (grown == NULL) return GCOMM_ERROR(comm, gcommSystemError, -1, "out of memory");
    x->maps = grown, x->capMaps = cap;
  }
  directMap_t* rec = calloc(1, sizeof(*rec));
  if (rec == NULL) return GCOMM_ERROR(comm, gcommSystemError, -1, "out of memory");
  cudaIpcMemHandle_t h;
  memcpy(&h, card->handle[which], sizeof(h));
  if (cudaIpcOpenMemHandle(&rec->base, h, cudaIpcMemLazyEnablePeerAccess) != cudaSuccess) {
    cudaGetLastError(); /* not sticky: every rank captures the call on the FIFOs instead */
    free(rec);
    return gcommSuccess;
  }
  rec->rank = r, rec->id = card->id[which], rec->refs = 1;
  x->opened++;
  x->maps[x->nMaps++] = *m = rec;
  return gcommSuccess;
}

/* Every rank's buffers as this rank addresses them (in[r], out[r]); *ok 0 where one cannot be. */
static gcommResult_t mapBuffers(gcommComm_t comm, const gcommOp_t* op, const callCard_t* cards,
                                char** in, char** out, graphHold_t* hold, int* ok) {
  struct gcommDirect* x = comm->dev->direct;
  *ok = 1;
  hold->n = 0;
  for (int r = 0; r < comm->nranks && *ok; r++) {
    in[r] = (char*)op->sendbuff, out[r] = (char*)op->recvbuff;
    if (r == comm->rank) continue;
    in[r] = out[r] = NULL;
    for (int w = 0; w < 2 && *ok; w++) {
      if (!peersUse(op, r, w)) continue;
      directMap_t* m = NULL;
      GCOMM_CHECK(mapPeer(comm, x, r, &cards[r].buffers, w, &m));
      *ok = m != NULL;
      if (*ok) (w == 0 ? in : out)[r] = (char*)m->base + cards[r].buffers.offset[w];
      if (*ok) hold->maps[hold->n++] = m;
    }
  }
  return gcommSuccess;
}

/* The capture's id, graph and the nodes the next captured work will depend on (CUDA 12.3 and
 * later): 0 when they cannot be told. */
static int captureDeps(cudaStream_t s, unsigned long long* id, cudaGraph_t* graph,
                       const cudaGraphNode_t** deps, size_t* n) {
  enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
#if CUDART_VERSION >= 13000
  cudaError_t e = cudaStreamGetCaptureInfo(s, &st, id, graph, deps, NULL, n);
#elif CUDART_VERSION >= 12030
  cudaError_t e = cudaStreamGetCaptureInfo_v3(s, &st, id, graph, deps, NULL, n);
#else
  cudaError_t e = cudaErrorNotSupported;
  (void)s, (void)id, (void)graph, (void)deps, (void)n;
#endif
  if (e != cudaSuccess) cudaGetLastError();
  return e == cudaSuccess && st == cudaStreamCaptureStatusActive;
}

/* Whether the work captured next on s depends on this communicator's latest direct kernel alone,
 * in the same capture: no work of this rank between them. */
static int followsDirect(struct gcommDirect* x, cudaStream_t s) {
  unsigned long long id = 0;
  const cudaGraphNode_t* deps = NULL;
  size_t n = 0;
  return x->lastNode != NULL && captureDeps(s, &id, NULL, &deps, &n) && id == x->lastCapture &&
         n == 1 && deps[0] == x->lastNode;
}

/* After a direct kernel's launch: its node (the one the stream's next work depends on), and the
 * graph's hold on the mappings it uses. */
static void afterLaunch(struct gcommDirect* x, cudaStream_t s, const graphHold_t* hold) {
  unsigned long long id = 0;
  cudaGraph_t graph = NULL;
  const cudaGraphNode_t* deps = NULL;
  size_t n = 0;
  int known = captureDeps(s, &id, &graph, &deps, &n);
  x->lastNode = known && n == 1 ? deps[0] : NULL;
  x->lastCapture = id;
  holdForGraph(known ? graph : NULL, hold);
}

/* The cards of every rank: *ok when each exported every buffer it uses; a rank at another call
 * is named. */
static gcommResult_t exchangeCards(gcommComm_t comm, const gcommOp_t* op, void* stream,
                                   callCard_t* cards, int* ok, int* follows) {
  struct gcommDirect* x = comm->dev->direct;
  callCard_t mine;
  const void* buf[2] = {op->sendbuff, op->recvbuff};
  memset(&mine, 0, sizeof(mine));
  mine.buffers.tag = op->tag;
  mine.buffers.ok = 1;
  for (int w = 0; w < 2; w++)
    if (peersUse(op, comm->rank, w))
      mine.buffers.ok &= gcommBufferExport(&x->export, w, buf[w], &mine.buffers);
  mine.follows = followsDirect(x, (cudaStream_t)stream);
  GCOMM_CHECK(gcommPagesAllgather(comm, &mine, sizeof(mine), cards,
                                  "a graph-captured call's buffers (GCOMM_GRAPH_REGISTER)"));
  *ok = *follows = 1;
  for (int r = 0; r < comm->nranks; r++) {
    if (cards[r].buffers.tag != op->tag)
      return GCOMM_ERROR(comm, gcommInvalidUsage, r,
                         "graph capture of %s: rank %d captured another call (tag %08x, this "
                         "rank's %08x)",
                         gcommFuncName(op->func), r, cards[r].buffers.tag, op->tag);
    *ok &= cards[r].buffers.ok;
    *follows &= cards[r].follows;
  }
  return gcommSuccess;
}

/* What this rank copies: an all-to-all writes block r of its input into block me of rank r's
 * output, a gather its input into block me of the root's output, a scatter reads block me of the
 * root's input. */
static void planCopies(gcommComm_t comm, const gcommOp_t* op, char** in, char** out,
                       gcommDirectArgs_t* a) {
  int n = comm->nranks, me = comm->rank;
  size_t block = op->count * gcommTypeSize(op->datatype);
  a->pairs = 1;
  a->count = op->count;
  if (op->func == gcommFuncAllToAll) {
    for (int r = 0; r < n; r++) {
      a->in[a->nIn++] = in[me] + (size_t)r * block;
      a->out[a->nOut++] = out[r] + (size_t)me * block;
    }
  } else if (op->func == gcommFuncGather) {
    a->in[a->nIn++] = in[me];
    a->out[a->nOut++] = out[op->root] + (size_t)me * block;
  } else {
    a->in[a->nIn++] = in[op->root] + (size_t)me * block;
    a->out[a->nOut++] = out[me];
  }
}

/* What this rank combines: a's inputs, outputs and count from every rank's buffers. */
static void plan(gcommComm_t comm, const gcommOp_t* op, char** in, char** out,
                 gcommDirectArgs_t* a) {
  int n = comm->nranks, me = comm->rank;
  size_t esz = gcommTypeSize(op->datatype), count = op->count;
  a->nIn = a->nOut = 0;
  a->count = 0;
  a->divide = op->redop == gcommAvg ? n : 0;
  switch (op->func) {
    case gcommFuncAllReduce: { /* two-shot: part me of every input into part me of every output */
      size_t pack = 16 / esz, part = gcommDivUp(gcommDivUp(count, n), pack) * pack;
      size_t lo = part * me < count ? part * me : count, hi = lo + part < count ? lo + part : count;
      for (int r = 0; r < n; r++) a->in[a->nIn++] = in[r] + lo * esz;
      for (int r = 0; r < n; r++) a->out[a->nOut++] = out[r] + lo * esz;
      a->count = hi - lo;
      break;
    }
    case gcommFuncReduceScatter: /* block me of every input */
      for (int r = 0; r < n; r++) a->in[a->nIn++] = in[r] + (size_t)me * count * esz;
      a->out[a->nOut++] = out[me];
      a->count = count;
      break;
    case gcommFuncAllGather: /* this input into block me of every output */
      a->in[a->nIn++] = in[me];
      for (int r = 0; r < n; r++) a->out[a->nOut++] = out[r] + (size_t)me * count * esz;
      a->count = count;
      break;
    case gcommFuncBroadcast: /* every rank reads the root's input; the root in place: nothing */
      a->in[a->nIn++] = in[op->root];
      a->out[a->nOut++] = out[me];
      a->count = in[op->root] == out[me] ? 0 : count;
      break;
    case gcommFuncReduce: /* the root reads every input */
      for (int r = 0; r < n; r++) a->in[a->nIn++] = in[r];
      a->out[a->nOut++] = out[me];
      a->count = me == op->root ? count : 0;
      break;
    default: /* copies: AllToAll, Gather, Scatter */
      planCopies(comm, op, in, out, a);
  }
}

/* Blocks: the same on every rank (the meetings pair block b with block b), from the call alone. */
static int blocksOf(gcommComm_t comm, const gcommOp_t* op) {
  size_t b = gcommDivUp(callBytes(comm, op), BYTES_A_BLOCK), most = GCOMM_DIRECT_BLOCKS;
  if ((size_t)comm->nChannels < most) most = (size_t)comm->nChannels; /* residency (channels) */
  return b < 1 ? 1 : b > most ? (int)most : (int)b;
}

/* follows: every rank's call follows its previous direct kernel with nothing between them, whose
 * last meeting then stands for this one's first (all accesses of that call are over, on every
 * rank, before any rank's next kernel starts). */
static gcommResult_t launch(gcommComm_t comm, const gcommOp_t* op, char** in, char** out,
                            const graphHold_t* hold, int follows, void* stream) {
  struct gcommDev* d = comm->dev;
  struct gcommDirect* x = d->direct;
  gcommDirectArgs_t a;
  memset(&a, 0, sizeof(a));
  plan(comm, op, in, out, &a);
  for (int r = 0; r < comm->nranks; r++) a.mailbox[r] = x->mailbox[r];
  a.meetings = x->own + MAILBOX_WORDS;
  a.comm = d->devComm;
  a.datatype = op->datatype, a.redop = op->redop, a.func = op->func;
  a.rank = comm->rank, a.nranks = comm->nranks, a.nBlocks = blocksOf(comm, op);
  a.meetFirst = !follows;
  int e = gcommDirectLaunch(&a, stream);
  if (e != cudaSuccess)
    return GCOMM_ERROR(comm, gcommDeviceError, -1, "direct kernel launch failed: %s",
                       cudaGetErrorString((cudaError_t)e));
  afterLaunch(x, (cudaStream_t)stream, hold);
  if (!x->said && (x->said = 1))
    GCOMM_INFO(GCOMM_SUBSYS_COLL, comm,
               "graph capture: %s of %zu elements runs straight between the ranks' buffers, "
               "%d blocks (GCOMM_GRAPH_REGISTER; said once a communicator)",
               gcommFuncName(op->func), op->count, a.nBlocks);
  return gcommSuccess;
}

gcommResult_t gcommGpuDirectRun(gcommComm_t comm, const gcommOp_t* op, void* stream, int* done) {
  *done = 0;
  /* exporting and mapping buffers is no stream work: allowed whatever the capture's mode */
  enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  cudaThreadExchangeStreamCaptureMode(&mode);
  callCard_t* cards = calloc((size_t)comm->nranks, sizeof(callCard_t));
  int* oks = calloc((size_t)comm->nranks, sizeof(int));
  char *in[MAXR], *out[MAXR];
  int ok = 0, follows = 0;
  graphHold_t hold;
  closeUnused(comm->dev->direct);
  gcommResult_t res =
      cards && oks ? gcommSuccess : GCOMM_ERROR(comm, gcommSystemError, -1, "out of memory");
  if (res == gcommSuccess) res = exchangeCards(comm, op, stream, cards, &ok, &follows);
  if (res == gcommSuccess && ok) res = mapBuffers(comm, op, cards, in, out, &hold, &ok);
  if (res == gcommSuccess) /* every rank mapped every buffer, or every rank takes the FIFOs */
    res = gcommPagesAllgather(comm, &ok, sizeof(ok), oks,
                              "whether every rank mapped a graph-captured call's buffers");
  for (int r = 0; r < comm->nranks && res == gcommSuccess; r++) ok &= oks[r];
  if (res == gcommSuccess && ok) {
    WITH_DEVICE(comm, old);
    res = launch(comm, op, in, out, &hold, follows, stream);
    RESTORE_DEVICE(comm, old);
    *done = res == gcommSuccess;
  }
  free(cards);
  free(oks);
  cudaThreadExchangeStreamCaptureMode(&mode);
  return res;
}
