/*
 * gcomm_order.c - which work may start: host operations run in call order wherever they share
 * memory (as on a stream), and no work overwrites memory a network send by reference still
 * reads. Also the buffer layouts these rules read: how many elements each side uses, and the
 * in-place layout of each collective.
 */
#define _GNU_SOURCE
#include <string.h>

#include "gcomm_core.h"

/* Whether [a, a + alen) and [b, b + blen) share a byte. */
int gcommRangesMeet(const char* a, size_t alen, const char* b, size_t blen) {
  return a != NULL && b != NULL && a < b + blen && b < a + alen;
}

/* The peer of an unfinished send from the caller's memory (gcommConn_t.refs: over the network,
 * or read by a rank of this node) that overlaps [p, p + len) on this lane, or -1; sends to rank
 * peerDone below FIFO step doneBelow do not count (the peer has received them), nor those of the
 * operations of post batch (0: none). The head last read (headSeen) tells, without a read of the
 * peer's counter, that every such send is over. */
int gcommRefOverlaps(gcommComm_t comm, int lane, const char* p, size_t len, int peerDone,
                     uint64_t doneBelow, uint64_t batch) {
  if (!__atomic_load_n(&comm->refsUsed, __ATOMIC_RELAXED)) return -1;
  for (int q = 0; q < comm->nranks; q++) {
    gcommConn_t* c = sendConn(comm, lane, q);
    if (c->refs == NULL || c->refUntil <= c->headSeen) continue;
    uint64_t s = __atomic_load_n(&c->fifo->head, __ATOMIC_ACQUIRE);
    c->headSeen = s;
    if (q == peerDone && s < doneBelow) s = doneBelow;
    for (; s < c->refUntil; s++) {
      const char* r = c->refs[s % GCOMM_STEPS];
      if ((batch == 0 || c->refBatch[s % GCOMM_STEPS] != batch) &&
          gcommRangesMeet(r, (uint32_t)gcommSlotWord(c, s), p, len))
        return q;
    }
  }
  return -1;
}

/* Whether two operations split their memory alike: then each channel's work of one touches just
 * what the same channel's work of the other does, and its queue orders the two. */
static int sameSlices(const gcommOp_t* a, const gcommOp_t* b) {
  return a->func == b->func && a->count == b->count && a->datatype == b->datatype &&
         a->sendbuff == b->sendbuff && a->recvbuff == b->recvbuff && a->root == b->root &&
         a->peer == b->peer && a->nWorks == b->nWorks && a->proto == b->proto;
}

/* Whether an operation writes memory the other reads or writes, on this rank. */
static int opsConflict(gcommComm_t comm, const gcommOp_t* a, const gcommOp_t* b) {
  size_t aIn, aOut, bIn, bOut, aEsz = gcommTypeSize(a->datatype), bEsz = gcommTypeSize(b->datatype);
  gcommBufferCounts(a, comm->rank, comm->nranks, &aIn, &aOut);
  gcommBufferCounts(b, comm->rank, comm->nranks, &bIn, &bOut);
  aIn *= aEsz, aOut *= aEsz, bIn *= bEsz, bOut *= bEsz;
  return gcommRangesMeet(a->recvbuff, aOut, b->sendbuff, bIn) ||
         gcommRangesMeet(a->recvbuff, aOut, b->recvbuff, bOut) ||
         gcommRangesMeet(b->recvbuff, bOut, a->sendbuff, aIn);
}

/* Host operations run in call order wherever they share memory, as on a stream: each queue runs
 * its works in order, but queues (channels, and each peer's sends and receives) run on their
 * own, so a work of an operation whose memory an earlier one, posted in another call or group,
 * still uses on another queue waits until that one has finished. Operations split alike
 * (sameSlices, e.g. the same all-reduce again) need no wait. A group's operations run
 * concurrently, as NCCL's do. Once true it stays true: earlier operations only finish. */
int gcommOpMayStart(gcommComm_t comm, gcommOp_t* op) {
  if (op->mayStart) return 1;
  for (const gcommOp_t* e = op->prevActive; e != NULL; e = e->prevActive)
    if (e->batch != op->batch && !sameSlices(e, op) && opsConflict(comm, e, op)) return 0;
  op->mayStart = 1;
  return 1;
}

/* Whether a send by reference on a lane other than lane (another channel's, or a send's; -1:
 * on any lane) still reads [p, p + len), not counting those of post batch (0: every one counts).
 * Its operation may have finished: the message goes out (or the local peer copies it) later. */
int gcommRefOverlapsElsewhere(gcommComm_t comm, int lane, const char* p, size_t len,
                              uint64_t batch) {
  if (!__atomic_load_n(&comm->refsUsed, __ATOMIC_RELAXED)) return 0;
  for (int l = 0; l < comm->nLanes; l++)
    if (l != lane && gcommRefOverlaps(comm, l, p, len, -1, 0, batch) >= 0) return 1;
  return 0;
}

/* The memory w may write: its slice of the output where the channels split one buffer, else the
 * call's whole output (NULL when it writes none). */
static const char* workOutput(gcommComm_t comm, const gcommWork_t* w, size_t* len) {
  const gcommOp_t* op = w->op;
  size_t esz = gcommTypeSize(op->datatype), in, out;
  gcommBufferCounts(op, comm->rank, comm->nranks, &in, &out);
  *len = 0;
  if (op->recvbuff == NULL || out == 0) return NULL;
  switch (op->func) {
    case gcommFuncAllReduce:
    case gcommFuncBroadcast:
    case gcommFuncReduce:
    case gcommFuncRecv:
    case gcommFuncCopy:
      *len = w->sched.chanCount * esz;
      return (const char*)op->recvbuff + w->sched.chanOff * esz;
    default:
      *len = out * esz;
      return op->recvbuff;
  }
}

/* Whether w may run its first step: its operation may start (gcommOpMayStart) and no send by
 * reference of another lane still reads what it writes, an earlier post's (those of its own run
 * concurrently, as its operations do: each channel of an operation writes its own slice, and a
 * local peer's copy of this post's reference may wait for this very work). */
int gcommWorkMayStart(gcommComm_t comm, gcommWork_t* w) {
  if (w->mayStart) return 1;
  if (!gcommOpMayStart(comm, w->op)) return 0;
  /* no send by reference yet on this communicator: none to look for (gcommRefOverlapsElsewhere) */
  if (sendsByRef(comm) && __atomic_load_n(&comm->refsUsed, __ATOMIC_RELAXED)) {
    size_t len;
    const char* out = workOutput(comm, w, &len);
    if (gcommRefOverlapsElsewhere(comm, w->lane, out, len, w->op->batch)) return 0;
  }
  w->mayStart = 1;
  return 1;
}

/* Elements each side of op uses on this rank (0 where a buffer is unused). */
void gcommBufferCounts(const gcommOp_t* op, int rank, int n, size_t* inCount, size_t* outCount) {
  size_t c = op->count;
  int isRoot = rank == op->root;
  switch (op->func) {
    case gcommFuncAllReduce:
      *inCount = c, *outCount = c;
      return;
    case gcommFuncBroadcast:
      *inCount = isRoot ? c : 0, *outCount = c;
      return;
    case gcommFuncReduce:
      *inCount = c, *outCount = isRoot ? c : 0;
      return;
    case gcommFuncAllGather:
      *inCount = c, *outCount = c * n;
      return;
    case gcommFuncReduceScatter:
      *inCount = c * n, *outCount = c;
      return;
    case gcommFuncAllToAll:
      *inCount = c * n, *outCount = c * n;
      return;
    case gcommFuncGather:
      *inCount = c, *outCount = isRoot ? c * n : 0;
      return;
    case gcommFuncScatter:
      *inCount = isRoot ? c * n : 0, *outCount = c;
      return;
    case gcommFuncSend:
      *inCount = c, *outCount = 0;
      return;
    case gcommFuncCopy:
      *inCount = c, *outCount = c;
      return;
    default:
      *inCount = 0, *outCount = c;
      return;
  }
}

/* The in-place layouts of gcomm.h: the one overlap that is allowed. */
int gcommIsInPlace(const gcommOp_t* op, int rank, size_t esz) {
  /* as integers: a NULL buffer (one a rank does not use) plus an offset is undefined */
  uintptr_t in = (uintptr_t)op->sendbuff, out = (uintptr_t)op->recvbuff;
  size_t blk = op->count * esz * rank;
  switch (op->func) {
    case gcommFuncAllReduce:
    case gcommFuncBroadcast:
    case gcommFuncReduce:
    case gcommFuncAllToAll: /* every block is sent before its peer's block lands on it */
      return in == out;
    case gcommFuncAllGather:
    case gcommFuncGather:
      return in == out + blk;
    case gcommFuncReduceScatter:
    case gcommFuncScatter:
      return out == in + blk;
    default:
      return 0;
  }
}
