/*
 * gcomm_enqueue.c - enqueue and groups: a checked call becomes an operation split into works
 * (one per channel), posted to the progress engine or launched on a GPU, or held by a group until
 * its end.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gcomm_core.h"

#define UNBUILT (-1)        /* the nWorks of a held operation not yet built (holdSlotOp) */
#define FUSED gcommNumFuncs /* the func of an operation fuseSelfPairs replaced */

static __thread int groupDepth;
static __thread gcommComm_t groupComms; /* communicators with operations held by the group */

/* The algorithm, protocol and channel count of a call of func moving bytes (the size every rank
 * agrees on; nParts: the parts of its call, gcommChooseChannels): the cost model's, remembered for
 * the next call of func with the same size and parts. */
static void choose(gcommComm_t comm, int func, size_t bytes, int nParts, int* algo, int* proto,
                   int* nch) {
  __typeof__(comm->choice[0])* c = &comm->choice[func];
  if (c->bytesKey != bytes + 1 || c->nParts != nParts) {
    c->algo = gcommIsPointToPoint(func) ? gcommAlgoDirect : gcommChooseAlgo(comm, func, bytes);
    c->proto = gcommChooseProto(comm, func, c->algo, bytes, nParts);
    c->nChannels = gcommChooseChannels(comm, func, bytes, c->proto, nParts);
    c->bytesKey = bytes + 1;
    c->nParts = nParts;
  }
  *algo = c->algo, *proto = c->proto, *nch = c->nChannels;
}

/* The queue and lane of channel c's work of op: a Send/Recv's queue per (direction, peer, p2p
 * channel) and lane per p2p channel (a Copy takes its rank's send queues); a collective's
 * channel c. */
static void workPlace(gcommComm_t comm, const gcommOp_t* op, int c, gcommWork_t* w) {
  if (gcommIsPointToPoint(op->func)) {
    int dir = op->func == gcommFuncRecv;
    w->queue = comm->nChannels + (dir * comm->nranks + op->peer) * comm->nP2pChannels + c;
    w->lane = comm->nChannels + c;
  } else {
    w->queue = w->lane = c;
  }
}

/* A record of room for nWorks works holding args (its own pool mark and scratch kept). */
static gcommOp_t* newOp(gcommComm_t comm, const gcommOp_t* args, int nWorks) {
  gcommOp_t* op = gcommOpAlloc(comm, nWorks);
  if (op == NULL) return NULL;
  int pooled = op->pooled;
  void* scratch = op->scratch;
  size_t scratchBytes = op->scratchBytes;
  *op = *args;
  op->pooled = pooled;
  op->scratch = scratch;
  op->scratchBytes = scratchBytes;
  return op;
}

/* Room in op's scratch for a work whose schedule needs it (where it runs its binomial Gather or
 * Scatter: gcommSchedChannelAlgo). Returns 0 when out of memory. */
static int reserveScratch(gcommOp_t* op, const gcommSched_t* s, size_t esz) {
  size_t need =
      gcommSchedScratchElems(s->func, gcommSchedChannelAlgo(s), s->nranks, s->count) * esz;
  if (need <= op->scratchBytes) return 1;
  void* p = realloc(op->scratch, need);
  if (p == NULL) return 0;
  op->scratch = p;
  op->scratchBytes = need;
  return 1;
}

/* Splits a checked operation into its works: one per channel, each a contiguous slice
 * (chanOff, chanCount). Collectives use the collective channels; a Send/Recv uses the
 * point-to-point channels, as many as its byte count gives (the same on both sides); a part of a
 * call of nParts parts (not 0) its share of the call's launch (gcommChooseChannels). The record
 * is written whole here (the arguments, then each work from a literal): never zeroed first. */
static gcommOp_t* buildOp(gcommComm_t comm, const gcommOp_t* args, int nParts) {
  int n = comm->nranks, isP2p = gcommIsPointToPoint(args->func);
  size_t esz = gcommTypeSize(args->datatype);
  /* the size every rank agrees on (nccl-tests' size), so that all ranks choose alike */
  size_t bytes = args->count * esz * (args->func >= gcommFuncAllGather && !isP2p ? n : 1);
  int algo, proto, nch;
  choose(comm, args->func, bytes, nParts, &algo, &proto, &nch);
  gcommOp_t* op = newOp(comm, args, nch);
  if (op == NULL) return NULL;
  op->callFunc = args->func;
  op->algo = algo;
  op->proto = proto;
  op->nChannels = nch;
  op->nWorks = 0;
  op->seq = isP2p ? 0 : gcommOwnerAdd(&comm->collSeq, 1); /* dumps read it */
  op->tag = comm->params.checkMismatch ? gcommOpTag(op) : 0;
  /* one rank in place: nothing to move (no launch, no engine pass), unless PreMulSum scales */
  if (n == 1 && gcommIsInPlace(args, 0, esz) && args->redop != GCOMM_OP_PREMULSUM) {
    op->nWorksLeft = 0;
    return op;
  }
  size_t align = esz >= 16 ? 1 : 16 / esz;
  size_t per = gcommDivUp(gcommDivUp(args->count, nch), align) * align;
  size_t step = gcommChooseStepBytes(comm, args->func, proto, nParts, per * esz);
  size_t chunk = (step / esz) / align * align;
  int fan = gcommChooseFan(comm, args->func, algo, proto);
  for (int c = 0; c < nch; c++) {
    size_t off = per * c;
    if (off >= args->count) break;
    gcommWork_t* w = &op->works[op->nWorks];
    *w = (gcommWork_t){.op = op,
                       .sched = {.func = args->func,
                                 .algo = algo,
                                 .nranks = n,
                                 .rank = comm->rank,
                                 .root = args->root,
                                 .peer = args->peer,
                                 .count = args->count,
                                 .chanOff = off,
                                 .chanCount = gcommMinSize(per, args->count - off),
                                 .chunk = chunk,
                                 .align = align,
                                 .fan = fan}};
    w->nSteps = gcommSchedNumSteps(&w->sched);
    if (w->nSteps == 0) continue;
    if (!reserveScratch(op, &w->sched, esz)) {
      gcommOpRelease(comm, op);
      return NULL;
    }
    workPlace(comm, op, c, w);
    op->nWorks++;
  }
  op->nWorksLeft = op->nWorks;
  return op;
}

#ifdef GCOMM_GPU
/* One kernel launch for a GPU communicator's ops; one with a proxy (network, copy engines) wakes
 * the progress thread, which may be asleep with nothing posted. */
static gcommResult_t launchOps(gcommComm_t comm, gcommOp_t* ops, int n, void* stream) {
  gcommResult_t res = gcommDeviceLaunch(comm, ops, n, stream);
  if (res == gcommSuccess) __atomic_add_fetch(&comm->opsGpu, n, __ATOMIC_RELAXED);
  if (res == gcommSuccess && hasGpuProxy(comm)) {
    pthread_mutex_lock(&comm->postLock);
    pthread_cond_signal(&comm->postCond);
    pthread_mutex_unlock(&comm->postLock);
  }
  return res;
}
#endif

static void traceOp(gcommComm_t comm, const gcommOp_t* op) {
  GCOMM_TRACE(gcommIsReduction(op->func) ? GCOMM_SUBSYS_COLL : GCOMM_SUBSYS_P2P, comm,
              "%s seq %llu count %zu %s %s root/peer %d algo %s proto %s channels %d works %d",
              gcommFuncNames[op->func], (unsigned long long)op->seq, op->count,
              gcommTypeNames[op->datatype], gcommOpNames[op->redop],
              op->func >= gcommFuncSend ? op->peer : op->root, gcommAlgoNames[op->algo],
              gcommProtoNames[op->proto], op->nChannels, op->nWorks);
  if (GCOMM_PROF_ON(comm, gcommProfileGroup | gcommProfileColl | gcommProfileP2p))
    gcommProfOpEnqueued(comm, (gcommOp_t*)op, groupDepth > 0);
}

static void freeOps(gcommComm_t comm, gcommOp_t* head) {
  for (gcommOp_t* next; head; head = next) next = head->next, gcommOpRelease(comm, head);
}

/* An operation of a host communicator runs where it is started (in its call, or at the end of its
 * group, where a group's operations start, as NCCL's do), without the post, the pass and the
 * wait's passes (MPI libraries send small messages eagerly too), while nothing else of the
 * communicator is under way: none of its operations posted or active (the queues would run it
 * after them), no profiler or trace watching (they follow operations through the engine), no
 * stop. Then a Send or Recv whose payload fits one FIFO slot takes gcommSlotAtOnce (in a call: no
 * operation record at all); any operation whose one work is one step gcommWorkAtOnce. Each runs
 * only if ready now, else the operation takes the whole path. */
static int unwatched(gcommComm_t comm) {
  return __atomic_load_n(&comm->prof.mask, __ATOMIC_RELAXED) == 0 &&
         (__atomic_load_n(&gcommTraceSubsys, __ATOMIC_RELAXED) &
          (GCOMM_SUBSYS_P2P | GCOMM_SUBSYS_COLL)) == 0;
}

static int mayRunAtOnce(gcommComm_t comm) {
  return comm->device < 0 && unwatched(comm) &&
         __atomic_load_n(&comm->postedHead, __ATOMIC_ACQUIRE) == NULL && !gcommRevokeSeen(comm);
}

/* Takes progressLock where no work is active and the communicator runs; returns whether it did. */
static int lockIdle(gcommComm_t comm) {
  if (pthread_mutex_trylock(&comm->progressLock) != 0) return 0;
  if (comm->nActiveWorks == 0 && __atomic_load_n(&comm->abortFlag, __ATOMIC_ACQUIRE) == 0 &&
      __atomic_load_n(&comm->asyncError, __ATOMIC_ACQUIRE) == gcommSuccess)
    return 1;
  pthread_mutex_unlock(&comm->progressLock);
  return 0;
}

/* gcommSlotAtOnce for a checked call that fits a slot on one channel: a Send or Recv, or a
 * Broadcast on 2 ranks (every algorithm's is then one step from the root to the other rank, on
 * channel 0), which takes its sequence number only if it ran (else buildOp does). Returns whether
 * it ran. 2 ranks, a send and a receive of 8 B and their wait: 4,300 instructions through the
 * engine, ~1,800 so. */
static int slotAtOnce(gcommComm_t comm, const gcommOp_t* args) {
  size_t bytes = args->count * gcommTypeSize(args->datatype);
  int isP2p = args->func == gcommFuncSend || args->func == gcommFuncRecv, algo, proto, nch;
  if ((!isP2p && (args->func != gcommFuncBroadcast || comm->nranks != 2)) ||
      bytes > comm->slotBytes)
    return 0;
  choose(comm, args->func, bytes, 0, &algo, &proto, &nch);
  if (nch != 1 || !lockIdle(comm)) return 0;
  gcommOp_t op = *args;
  op.seq = isP2p ? 0 : __atomic_load_n(&comm->collSeq, __ATOMIC_RELAXED);
  op.tag = comm->params.checkMismatch ? gcommOpTag(&op) : 0;
  int lane = isP2p ? comm->nChannels : 0, peer = isP2p ? op.peer : 1 - comm->rank;
  int ran = gcommSlotAtOnce(comm, &op, lane, peer,
                            isP2p ? op.func == gcommFuncSend : op.root == comm->rank);
  if (ran && !isP2p) gcommOwnerAdd(&comm->collSeq, 1);
  pthread_mutex_unlock(&comm->progressLock);
  return ran;
}

/* A held Send or Recv not yet built (holdSlotOp): slotAtOnce; a built operation of one work of
 * one step: gcommSlotAtOnce for a Send or Recv (the cheaper), else gcommWorkAtOnce. Returns
 * whether it ran. */
static int workAtOnce(gcommComm_t comm, gcommOp_t* op) {
  if (op->nWorks == UNBUILT) return slotAtOnce(comm, op);
  if (op->nWorks != 1 || op->works[0].nSteps != 1 || !lockIdle(comm)) return 0;
  int ran = op->func == gcommFuncSend || op->func == gcommFuncRecv
                ? gcommSlotAtOnce(comm, op, op->works[0].lane, op->peer, op->func == gcommFuncSend)
                : gcommWorkAtOnce(comm, &op->works[0]);
  pthread_mutex_unlock(&comm->progressLock);
  return ran;
}

/* Runs built operations at once (workAtOnce) from *head, in call order, up to the first that
 * cannot (those after it may share its queue: they follow it through the engine); *head becomes
 * the first left. Returns how many ran. */
static int runAtOnce(gcommComm_t comm, gcommOp_t** head) {
  int ran = 0;
  gcommOp_t* op;
  if (!mayRunAtOnce(comm)) return 0;
  while ((op = *head) != NULL && workAtOnce(comm, op)) {
    *head = op->next;
    gcommOpRelease(comm, op);
    ran++;
  }
  return ran;
}

/* Hands the built operations of one call (n of them, head to tail, each with works) over: a GPU
 * communicator launches them, a host communicator posts them as one batch (they run
 * concurrently), or the group holds them until its end. */
static gcommResult_t submitOps(gcommComm_t comm, gcommOp_t* head, gcommOp_t* tail, int n,
                               gcommStream_t stream, const char* where) {
#ifdef GCOMM_GPU
  if (comm->device >= 0) { /* a GPU communicator launches (now, or at the group's end) */
    if (groupDepth == 0) {
      gcommResult_t r = launchOps(comm, head, n, stream);
      freeOps(comm, head);
      return r;
    }
    if (comm->groupHead != NULL && stream != comm->groupStream) {
      freeOps(comm, head);
      return gcommSetError(comm, gcommInvalidUsage, -1, where,
                           "every operation of a group on one GPU communicator must use the "
                           "same stream");
    }
    comm->groupStream = stream;
  }
#else
  (void)stream, (void)where;
#endif
  if (groupDepth == 0 && comm->device < 0) {
    n -= runAtOnce(comm, &head);
    return head == NULL ? gcommSuccess : gcommPostOps(comm, head, tail, n);
  }
  if (comm->groupTail)
    comm->groupTail->next = head;
  else
    comm->groupHead = head;
  comm->groupTail = tail;
  if (!comm->inGroup) {
    __atomic_store_n(&comm->inGroup, 1, __ATOMIC_RELEASE);
    comm->groupNext = groupComms;
    groupComms = comm;
  }
  return gcommSuccess;
}

/* A group's Send or Recv on a host communicator that fits one FIFO slot, with nothing watching:
 * held as its arguments alone (nWorks UNBUILT), so that one which runs at once at the group's end
 * never builds works (the usual exchange of one small send and receive); buildHeld builds the
 * others there. Returns whether it held args. */
static int holdSlotOp(gcommComm_t comm, const gcommOp_t* args) {
  if (groupDepth == 0 || comm->device >= 0 ||
      (args->func != gcommFuncSend && args->func != gcommFuncRecv) ||
      args->count * gcommTypeSize(args->datatype) > comm->slotBytes || !unwatched(comm))
    return 0;
  gcommOp_t* op = newOp(comm, args, 1);
  if (op == NULL) return 0; /* built, and its failure reported, as any other */
  op->nWorks = UNBUILT;
  op->next = NULL;
  submitOps(comm, op, op, 1, NULL, NULL);
  return 1;
}

/* Builds the group's held operations still unbuilt, each in its place. */
static gcommResult_t buildHeld(gcommComm_t comm) {
  for (gcommOp_t** at = &comm->groupHead; *at != NULL; at = &(*at)->next) {
    gcommOp_t* held = *at;
    if (held->nWorks != UNBUILT) continue;
    gcommOp_t* op = buildOp(comm, held, 0);
    if (op == NULL) return GCOMM_ERROR(comm, gcommSystemError, -1, "out of memory");
    traceOp(comm, op);
    op->next = held->next;
    *at = op;
    gcommOpRelease(comm, held);
  }
  return gcommSuccess;
}

gcommResult_t gcommEnqueue(gcommComm_t comm, gcommOp_t* args, gcommStream_t stream,
                           const char* where) {
  /* groupComms: the last communicator whose operations the open group holds (NULL: none) */
  GCOMM_CHECK(comm != NULL && comm == groupComms ? gcommEnqueueCheckHeld(comm, stream, where)
                                                 : gcommEnqueueCheck(comm, stream, where));
  return gcommEnqueueChecked(comm, args, stream, where);
}

gcommResult_t gcommEnqueueChecked(gcommComm_t comm, gcommOp_t* args, gcommStream_t stream,
                                  const char* where) {
  if (args->count == 0) { /* nothing to move, no buffer read: complete at once, posted and done
                           * alike, without an operation record; a collective takes its sequence
                           * number as on every other rank */
    GCOMM_CHECK(gcommCheckShape(comm, args, where));
    if (!gcommIsPointToPoint(args->func)) gcommOwnerAdd(&comm->collSeq, 1);
    return gcommSuccess;
  }
  GCOMM_CHECK(gcommCheckArgs(comm, args, where));
  if (groupDepth == 0 && mayRunAtOnce(comm) && slotAtOnce(comm, args)) return gcommSuccess;
  if (holdSlotOp(comm, args)) return gcommSuccess;
  gcommOp_t* op = buildOp(comm, args, 0);
  if (op == NULL) return gcommSetError(comm, gcommSystemError, -1, where, "out of memory");
  traceOp(comm, op);
  if (op->nWorks == 0) { /* nothing to move (one rank, in place): complete at once */
    gcommOpRelease(comm, op);
    return gcommSuccess;
  }
  return submitOps(comm, op, op, 1, stream, where);
}

/* The parts of a call whose checks are done: one collective sequence number, every part tagged
 * as the call (func, its datatype and root, a hash of countsHash or, when 0, of the part's count),
 * posted or launched together. */
gcommResult_t gcommSubmitParts(gcommComm_t comm, gcommOp_t* parts, int n, int func,
                               uint64_t countsHash, gcommStream_t stream, const char* where) {
  uint64_t seq = gcommOwnerAdd(&comm->collSeq, 1);
  /* on a GPU, every part of the call in one launch: a vector collective has at most 2n - 1 parts
   * on a rank (a send and a receive a peer, the copy of its own block), and every rank caps them
   * alike, so that the two ends of a part still choose the same channels */
  int nParts = 2 * comm->nranks - 1;
  gcommOp_t *head = NULL, *tail = NULL;
  int count = 0;
  for (int i = 0; i < n; i++) {
    gcommOp_t* op = buildOp(comm, &parts[i], nParts);
    if (op == NULL) {
      freeOps(comm, head);
      return gcommSetError(comm, gcommSystemError, -1, where, "out of memory");
    }
    gcommOp_t call = *op;
    call.func = op->callFunc = func;
    call.seq = op->seq = seq;
    call.count = countsHash ? countsHash : op->count;
    op->tag = comm->params.checkMismatch ? gcommOpTag(&call) : 0;
    traceOp(comm, op);
    if (op->nWorks == 0) { /* an empty part */
      gcommOpRelease(comm, op);
      continue;
    }
    if (tail)
      tail->next = op;
    else
      head = op;
    tail = op;
    count++;
  }
  return head == NULL ? gcommSuccess : submitOps(comm, head, tail, count, stream, where);
}

/* Whether op is a Send to this rank (func gcommFuncSend) or a Receive from it (gcommFuncRecv)
 * that no profiler follows. */
static int isSelf(gcommComm_t comm, const gcommOp_t* op, int func) {
  return op->func == func && op->peer == comm->rank && op->profHandle == NULL;
}

/* Whether bytes at a and bytes at b share no byte (a copy between them is a memcpy). */
static int disjoint(const void* a, const void* b, size_t bytes) {
  uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
  return x + bytes <= y || y + bytes <= x;
}

/* The k-th Send of a group to this rank and its k-th Receive from it (NCCL's pairing) of equal
 * bytes become one Copy from the send buffer to the receive buffer, in the Send's place: the data
 * moves once, not through the rank's own FIFO and out again, in half the works (all-to-all and
 * scatter written as groups of sends and receives hold such a pair). A pair of unequal bytes or
 * of buffers that overlap, and every pair after it, is left as called. Returns whether it fused
 * any. */
static int fuseSelfPairs(gcommComm_t comm) {
  gcommOp_t *send = comm->groupHead, *recv = comm->groupHead, *copy;
  int fused = 0;
  for (;;) {
    while (send && !isSelf(comm, send, gcommFuncSend)) send = send->next;
    while (recv && !isSelf(comm, recv, gcommFuncRecv)) recv = recv->next;
    size_t bytes = send ? send->count * gcommTypeSize(send->datatype) : 0;
    if (!send || !recv || bytes != recv->count * gcommTypeSize(recv->datatype) ||
        !disjoint(send->sendbuff, recv->recvbuff, bytes))
      return fused;
    gcommOp_t args = *send;
    args.func = gcommFuncCopy;
    args.recvbuff = recv->recvbuff;
    if ((copy = buildOp(comm, &args, 0)) == NULL) return fused; /* left as called */
    GCOMM_TRACE(GCOMM_SUBSYS_P2P, comm, "send to and receive from this rank of %zu %s: one copy",
                send->count, gcommTypeNames[send->datatype]);
    copy->next = send->next;
    send->next = copy; /* the Send and the Receive become placeholders, unlinked by dropFused */
    send->func = recv->func = FUSED;
    send = copy->next;
    recv = recv->next;
    fused = 1;
  }
}

/* Unlinks and releases the placeholders fuseSelfPairs left; returns the new tail. */
static gcommOp_t* dropFused(gcommComm_t comm) {
  gcommOp_t **at = &comm->groupHead, *tail = NULL;
  while (*at != NULL) {
    gcommOp_t* op = *at;
    if (op->func == FUSED) {
      *at = op->next;
      gcommOpRelease(comm, op);
    } else {
      tail = op;
      at = &op->next;
    }
  }
  return tail;
}

gcommResult_t gcommGroupOpen(void) {
  groupDepth++;
  return gcommSuccess;
}

gcommResult_t gcommGroupClose(void) {
  gcommResult_t res = gcommSuccess;
  if (groupDepth == 0)
    return GCOMM_ERROR(NULL, gcommInvalidUsage, -1, "gcommGroupEnd without gcommGroupOpen");
  if (--groupDepth > 0) return gcommSuccess;
  while (groupComms != NULL) { /* one post per communicator: the group is one launch */
    gcommComm_t comm = groupComms;
    groupComms = comm->groupNext;
    if (fuseSelfPairs(comm)) comm->groupTail = dropFused(comm);
    runAtOnce(comm, &comm->groupHead);
    gcommResult_t r = buildHeld(comm);
    if (r != gcommSuccess) {
      freeOps(comm, comm->groupHead);
      comm->groupHead = NULL;
    }
    int count = 0;
    gcommOp_t* tail = NULL;
    for (gcommOp_t* op = comm->groupHead; op; op = op->next) count++, tail = op;
#ifdef GCOMM_GPU
    if (comm->device >= 0) {
      r = launchOps(comm, comm->groupHead, count, comm->groupStream);
      freeOps(comm, comm->groupHead);
    }
#endif
    if (comm->device < 0 && count > 0) r = gcommPostOps(comm, comm->groupHead, tail, count);
    if (r != gcommSuccess && res == gcommSuccess) res = r;
    if (comm->profGroup != NULL) gcommProfGroupEnd(comm);
    comm->groupHead = comm->groupTail = NULL;
    comm->groupNext = NULL;
    __atomic_store_n(&comm->inGroup, 0, __ATOMIC_RELEASE);
  }
  return res;
}
