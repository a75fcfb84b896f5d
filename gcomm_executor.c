/*
 * gcomm_executor.c - the host executor: runs the ready steps of one work of a schedule
 * (gcomm_sched.h) over the FIFOs, and, when a step waits too long, finds out why (a dead rank,
 * a different call at the same point, a stopped peer) and names the peer.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "gcomm_core.h"

/* Whether the slot of c's step has arrived: its line's flag (a FIFO between the ranks of a node,
 * gcommLine_t) or the tail says so. */
static int slotArrived(const gcommConn_t* c) {
  if (c->lines != NULL)
    return __atomic_load_n(&c->lines[c->step % GCOMM_LINES].flag, __ATOMIC_ACQUIRE) == c->step + 1;
  return __atomic_load_n(&c->fifo->tail, __ATOMIC_ACQUIRE) > c->step;
}

/* Where the payload of c's step lies: in its line when it fits there, else in its slot. */
static char* slotData(gcommConn_t* c, size_t bytes) {
  if (c->lines != NULL && bytes <= GCOMM_LINE_PAYLOAD) return c->lines[c->step % GCOMM_LINES].data;
  return c->slots + (c->step % GCOMM_STEPS) * c->slotBytes;
}

/* The reference a rank of this node handed c's step over by (GCOMM_CMA), which the line of a
 * payload too large for it carries; NULL: the payload is in the slot (or the line). */
static const gcommRef_t* slotRef(const gcommConn_t* c, size_t bytes) {
  if (c->lines == NULL || bytes <= GCOMM_LINE_PAYLOAD) return NULL;
  const gcommRef_t* ref = &c->lines[c->step % GCOMM_LINES].ref;
  return ref->at != NULL ? ref : NULL;
}

/* Hands the filled slot of c's step over: its word (and, in the line of a payload too large for
 * it, ref: where in this rank's memory the payload is, or NULL), then the flag of its line (the
 * tail follows for dumps only) or the tail. */
static void slotPublish(gcommConn_t* c, uint64_t word, const gcommRef_t* ref) {
  uint64_t next = c->step + 1;
  if (c->lines != NULL) {
    gcommLine_t* line = &c->lines[c->step % GCOMM_LINES];
    if ((uint32_t)word > GCOMM_LINE_PAYLOAD) /* the word's payload size */
      line->ref = ref != NULL ? *ref : (gcommRef_t){NULL, 0, 0, 0, -1};
    line->word = word;
    __atomic_store_n(&line->flag, next, __ATOMIC_RELEASE);
    __atomic_store_n(&c->fifo->tail, next, __ATOMIC_RELAXED);
  } else {
    c->fifo->bytes[c->step % GCOMM_STEPS] = word;
    __atomic_store_n(&c->fifo->tail, next, __ATOMIC_RELEASE);
  }
  c->step = next;
}

/* How far c's sender may run ahead of the receiver's head with a step of this many bytes: a
 * payload that travels in its line alone, GCOMM_LINES steps; one in a slot, GCOMM_STEPS. While a
 * slot handed over by reference is unread, GCOMM_STEPS for every step: the record of those
 * slots (refs, refBatch) holds GCOMM_STEPS steps. */
static uint64_t sendDepth(const gcommConn_t* c, size_t bytes) {
  if (c->lines == NULL || bytes > GCOMM_LINE_PAYLOAD) return GCOMM_STEPS;
  if (c->refs != NULL && __atomic_load_n(&c->refUntil, __ATOMIC_RELAXED) > c->headSeen)
    return GCOMM_STEPS;
  return GCOMM_LINES;
}

/* Whether c's sender may fill its next slot with a step of this many bytes: the receiver's head
 * is read again only when the room the last one left has run out. */
static int hasRoom(gcommConn_t* c, size_t bytes) {
  if (c->step >= c->headSeen + sendDepth(c, bytes))
    c->headSeen = __atomic_load_n(&c->fifo->head, __ATOMIC_ACQUIRE);
  return c->step < c->headSeen + sendDepth(c, bytes);
}

/* A step is ready when every FIFO it reads holds a slot, every FIFO it writes has room, and no
 * send by reference (the network's, or a local peer's one copy) still reads the memory it writes
 * (the next steps of an in-place operation rewrite its input). Returns the peer it waits on (and
 * whether for a receive), or -1 when ready. */
static int stepBlockedOn(gcommComm_t comm, const gcommWork_t* w, const gcommStep_t* st,
                         int* isRecv) {
  int lane = w->lane;
  for (int i = 0; i < 2; i++) {
    if (st->recvPeer[i] < 0) continue;
    gcommConn_t* c = recvConn(comm, lane, st->recvPeer[i]);
    if (!slotArrived(c)) {
      *isRecv = 1;
      return st->recvPeer[i];
    }
  }
  size_t esz = gcommTypeSize(w->op->datatype);
  for (int i = 0; i < 2; i++) {
    if (st->sendPeer[i] < 0) continue;
    if (!hasRoom(sendConn(comm, lane, st->sendPeer[i]), st->count * esz)) {
      *isRecv = 0;
      return st->sendPeer[i];
    }
  }
  char* dst = st->dst == GCOMM_BUF_NONE ? NULL : opBuffer(w->op, st->dst) + st->dstOff * esz;
  /* a message received into dst itself (gcommNetDirectTarget) leaves the step nothing to write */
  gcommConn_t* in = st->recvPeer[0] >= 0 ? recvConn(comm, lane, st->recvPeer[0]) : NULL;
  int landed = in != NULL && in->landed != NULL && in->landed[in->step % GCOMM_STEPS] == dst;
  int peer = dst == NULL || landed || !sendsByRef(comm)
                 ? -1
                 : gcommRefOverlaps(comm, lane, dst, st->count * esz, -1, 0, 0);
  *isRecv = 0;
  return peer;
}

/* The tag of a call: what every rank must agree on at one point of the FIFOs. Fields (bits): func
 * 0-3 (a Recv is tagged as the Send it matches), datatype 4-7, op 8-10, root 11-17 (mod 128),
 * collective seq 18-23 (mod 64), a hash of count 24-30, and bit 31 set (0 means "no tag"). */
#define TAG_FIELD(tag, shift, bits) (((tag) >> (shift)) & ((1u << (bits)) - 1))
uint32_t gcommOpTag(const gcommOp_t* op) {
  int isP2p = gcommIsPointToPoint(op->func);
  uint64_t h = (uint64_t)op->count * 0x9e3779b97f4a7c15ull;
  return (uint32_t)(isP2p ? gcommFuncSend : op->func) | (uint32_t)op->datatype << 4 |
         (uint32_t)op->redop << 8 | (uint32_t)(isP2p ? 0 : op->root & 127) << 11 |
         (uint32_t)(op->seq & 63) << 18 | (uint32_t)(h >> 57) << 24 | 1u << 31;
}

void gcommDescribeMismatch(char* buf, size_t len, uint64_t got, uint64_t expected) {
  uint32_t g = (uint32_t)(got >> 32), e = (uint32_t)(expected >> 32);
  unsigned gf = TAG_FIELD(g, 0, 4), gt = TAG_FIELD(g, 4, 4), go = TAG_FIELD(g, 8, 3);
  if (g == 0 || e == 0 || g == e) /* no tags (a remote peer, GCOMM_CHECK_MISMATCH=0) or alike */
    snprintf(buf, len, "it sent %llu bytes where this rank expects %llu (a different count)",
             (unsigned long long)(uint32_t)got, (unsigned long long)(uint32_t)expected);
  else if (gf != TAG_FIELD(e, 0, 4))
    snprintf(buf, len, "it called %s where this rank called %s", gcommFuncName((int)gf),
             gcommFuncName((int)TAG_FIELD(e, 0, 4)));
  else if (TAG_FIELD(g, 18, 6) != TAG_FIELD(e, 18, 6))
    snprintf(buf, len,
             "its collective is seq %u (mod 64) where this rank's is seq %u: a rank skipped a "
             "collective or called one more",
             TAG_FIELD(g, 18, 6), TAG_FIELD(e, 18, 6));
  else if (gt != TAG_FIELD(e, 4, 4))
    snprintf(buf, len, "its datatype is %s where this rank's is %s",
             gt < gcommNumTypes ? gcommTypeNames[gt] : "?",
             gcommTypeNames[TAG_FIELD(e, 4, 4) % gcommNumTypes]);
  else if (go != TAG_FIELD(e, 8, 3))
    snprintf(buf, len, "its op is %s where this rank's is %s",
             go <= GCOMM_OP_PREMULSUM ? gcommOpNames[go] : "?",
             gcommOpNames[TAG_FIELD(e, 8, 3) % (GCOMM_OP_PREMULSUM + 1)]);
  else if (TAG_FIELD(g, 11, 7) != TAG_FIELD(e, 11, 7))
    snprintf(buf, len, "its root is %u (mod 128) where this rank's is %u", TAG_FIELD(g, 11, 7),
             TAG_FIELD(e, 11, 7));
  else
    snprintf(buf, len, "its count differs from this rank's");
}

/* Whether a step multiplies its local operand by the PreMulSum scalar: it reads the caller's input
 * (never an earlier partial result in the output) and uses it (a plain receive does not). */
static int stepScalesInput(const gcommOp_t* op, const gcommStep_t* st, int nIn) {
  return op->redop == GCOMM_OP_PREMULSUM && st->src == GCOMM_BUF_IN && (nIn == 0 || st->reduce);
}

/* The step's value into value (st->count elements): src [op in0 [op in1]], or in0 [op in1], then
 * Avg's division. PreMulSum scales src into value first (a host communicator's device-resident
 * scalar is read here, when the operation runs). */
static void stepValue(gcommComm_t comm, const gcommOp_t* op, const gcommStep_t* st, const char* src,
                      char* const* in, int nIn, char* value) {
  size_t bytes = st->count * gcommTypeSize(op->datatype);
  if (stepScalesInput(op, st, nIn)) {
    gcommPreMulArray(op->datatype, value, src, st->count,
                     op->scalarPtr ? op->scalarPtr : &op->scalar);
    src = value;
  }
  if (nIn == 0) {
    if (value != src) memcpy(value, src, bytes);
  } else if (!st->reduce) {
    if (value != in[0]) memcpy(value, in[0], bytes); /* else received in place */
  } else {
    int t = op->datatype, o = op->redop;
    if (src != NULL) { /* src op in0 [op in1] */
      gcommReduceArray(t, o, value, src, in[0], st->count);
      if (nIn == 2) gcommReduceArray(t, o, value, value, in[1], st->count);
    } else { /* no local operand: in0 op in1 */
      gcommReduceArray(t, o, value, in[0], in[1], st->count);
    }
  }
  if (st->postOp && op->redop == gcommAvg)
    gcommDivideArray(op->datatype, value, st->count, comm->nranks);
}

/* Whether one copy pays for op's sends to ranks of this node when the receiver reads at speed
 * (per mille of a copy's: comm->cmaSpeed, or a copy's own from a buffer of gcommHostAlloc), by
 * where the copies fall (measured on a 64-core H100 host whose reads ran at 44-52%, 2-16 ranks,
 * 1-16 MB, forced one copy against the FIFO):
 *  - a root sending to every other local rank (Scatter, ScatterV, a direct Broadcast) makes n-1
 *    copies into the slots one after another, where each receiver's one read runs at once with
 *    the others': reads pay from 1/(n-1) of a copy's speed (16 ranks, a 16 MB scatter in 0.21 ms
 *    against 2.1 through the slots); but at 2 ranks a root in place, which has nothing else to
 *    do, copying into the slots while its peer copies out of them moves data faster than the
 *    peer's one read alone, even at a copy's speed (32 cores, a 16 MB broadcast in place from
 *    gcommHostAlloc's buffers: 2.47 ms by reference, 1.74 through the slots);
 *  - a rank sending to a root that receives from every rank (Gather, GatherV) would leave the
 *    root n-1 reads in place of its n-1 copies out of the slots, which its senders warmed in the
 *    cache while the root copied: only where forced (a 16 MB gather 2.5 ms against
 *    0.64; from gcommHostAlloc's buffers on 32 cores, 8-16 ranks 4 MB, 0.68-0.80 of MPICH's
 *    speed by reference against 3.1-3.2 through the slots);
 *  - a ring or tree (Broadcast, AllGather, an AllReduce's all-gather half) one read a rank in
 *    place of copies its neighbours make alongside its own: only reads as fast as copies (ring
 *    all-gather and broadcast at 4-16 ranks 5-30% slower by process_vm_readv);
 *  - an exchange, where every rank sends and receives in pairs (send/recv, all-to-all(v),
 *    all-gatherv, a direct all-gather): one read against two copies, into the slot and out of
 *    it, both moving through memory the other ranks' copies load too: from 35% (all-to-all 16 MB
 *    1.3-1.6x faster by reference at 2-16 ranks, all-gatherv 1.1-2.2x at 4-16; on 32 cores whose
 *    reads measured ~40%, send/recv 16 MB 1.3x faster at 2-16 ranks; on a 2-vCPU microVM whose
 *    reads ran at 30% every transfer was slower). The speed is measured on memory warm in the
 *    cache, where a read's page pinning weighs most: on memory that is not, as a large
 *    exchange's, reads run 1.3-1.7x closer to a copy (2 vCPUs, 64-128 KB reads: 42-50% warm,
 *    55-78% cold). */
static int refPays(gcommComm_t comm, const gcommOp_t* op, long speed) {
  int n = comm->nLocal, f = op->callFunc, isRoot = comm->rank == op->root;
  int forwards =
      !gcommIsPointToPoint(op->func) && (op->algo == gcommAlgoRing || op->algo == gcommAlgoTree);
  long need = 350;
  if (isRoot && (f == gcommFuncScatter || f == gcommFuncScatterV ||
                 (f == gcommFuncBroadcast && op->algo == gcommAlgoDirect)))
    need = n > 2 || !gcommIsInPlace(op, comm->rank, gcommTypeSize(op->datatype))
               ? 1000 / (n > 1 ? n - 1 : 1)
               : 1001; /* a root in place copies nothing to itself */
  else if (!isRoot && (f == gcommFuncGather || f == gcommFuncGatherV))
    need = 1001; /* more than a copy's: forced only */
  else if (forwards)
    need = 1000;
  return speed >= need;
}

/* Whether the value of a step, in the caller's memory at user (NULL: not there), goes to send
 * FIFO c by reference. Over the network always (the provider sends from it). To a rank of this
 * node (GCOMM_CMA), a step of at least c->refMinBytes (refMinFileBytes) where its one copy pays
 * (refPays: read at a copy's speed from a buffer of gcommHostAlloc, whose file ref then names) and
 * its receiver only copies it; a reduction's input only from such a buffer, where every rank
 * reduces (ReduceScatter, AllReduce: the receiver reduces it where it lies, and the sender's copy
 * into the slot is saved; 2 ranks, 1-16 MB, 1.4-1.6x MPICH's speed through the slots, 1.9-2.3x so),
 * not a Reduce's (its other ranks' copies into the slots run beside the root's reductions; through
 * the slots, 2 ranks 1 MB: 2.1x MPICH's speed, by reference 1.3x); plain memory's never (its
 * receiver reads it once anyway, to reduce it). In every case only where no operation of this rank
 * running now writes that memory: such a write must wait until the peer has copied it, and the
 * peer's own receive may wait likewise for this rank (an in-place all-to-all, a send and a receive
 * of one buffer in a group): neither would come. A finished value (in the output) is written once
 * by its operation (not in a schedule that rewrites it, gcommSchedRewritesOutput: its next step
 * would wait for the partner to read the value lent, while the partner, lent its own, waits
 * alike), and a root that only sends (Broadcast, Scatter) may lend its input in place. */
static int sendsRef(gcommComm_t comm, const gcommOp_t* op, const gcommStep_t* st,
                    const gcommConn_t* c, const char* user, size_t bytes, gcommRef_t* ref) {
  if (user == NULL || c->refs == NULL) return 0;
  if (c->refPid == 0) return 1;
  if (bytes < c->refMinFileBytes) return 0;
  int finished = (st->dst != GCOMM_BUF_NONE || st->src == GCOMM_BUF_OUT) &&
                 !gcommSchedRewritesOutput(op->func, op->algo);
  int inFile = gcommHostFind(user, bytes, ref);
  if (!inFile && bytes < c->refMinBytes) return 0;
  long speed = inFile && comm->cmaSpeed < 1000 ? 1000 : comm->cmaSpeed;
  int reduces = !finished && gcommIsReduction(op->func) && (!inFile || op->func == gcommFuncReduce);
  if (reduces || !refPays(comm, op, speed)) return 0;
  for (const gcommOp_t* e = comm->activeHead; e != NULL; e = e->nextActive) {
    size_t in, out;
    if (e == op && (finished || op->func == gcommFuncBroadcast || op->func == gcommFuncScatter))
      continue;
    gcommBufferCounts(e, comm->rank, comm->nranks, &in, &out);
    if (gcommRangesMeet(e->recvbuff, out * gcommTypeSize(e->datatype), user, bytes)) return 0;
  }
  return 1;
}

/* Where a received slot's data is for the step: the slot (or its line), the caller's memory the
 * network received it into, or, for a slot handed over by reference by a rank of this node, the
 * sender's buffer itself in this rank's mapping of it (gcommHostAlloc: the step copies or reduces
 * from there), else where this rank copied it from the sender's memory: dst itself when the step
 * only copies it there (one copy in all), else the slot (what a reduction reads). */
static gcommResult_t receivedData(gcommComm_t comm, gcommConn_t* c, const gcommStep_t* st,
                                  char* dst, size_t bytes, char** data) {
  int slot = (int)(c->step % GCOMM_STEPS);
  const gcommRef_t* ref = slotRef(c, bytes);
  *data = c->landed && c->landed[slot] ? c->landed[slot] : slotData(c, bytes);
  if (ref == NULL) return gcommSuccess;
  char* to = dst != NULL && !st->reduce && st->recvPeer[1] < 0 ? dst : *data;
  return gcommShmReadRef(comm, c, ref, to, bytes, data);
}

/* Executes a ready step: value = recv (op src) or src; value -> dst and send FIFOs. */
static gcommResult_t runStep(gcommComm_t comm, gcommWork_t* w, const gcommStep_t* st) {
  const gcommOp_t* op = w->op;
  size_t esz = gcommTypeSize(op->datatype), bytes = st->count * esz;
  char* src = opBuffer(op, st->src);
  char* dst = opBuffer(op, st->dst);
  char *in[2] = {NULL, NULL}, *out[2] = {NULL, NULL};
  gcommConn_t* outConn[2] = {NULL, NULL};
  int nIn = 0, nOut = 0;
  if (src) src += st->srcOff * esz;
  if (dst) dst += st->dstOff * esz;
  for (int i = 0; i < 2; i++) {
    if (st->recvPeer[i] >= 0) {
      int peer = st->recvPeer[i];
      gcommConn_t* c = recvConn(comm, w->lane, peer);
      uint64_t got = gcommSlotWord(c, c->step), want = GCOMM_SLOT_WORD(op->tag, bytes);
      if (got != want) {
        char what[256];
        gcommDescribeMismatch(what, sizeof(what), got, want);
        return gcommSetError(comm, gcommInvalidUsage, peer, "progress",
                             "%s (seq %llu, count %zu, %s, %s, root %d) channel %d step %ld: rank "
                             "%d made a different call: %s",
                             gcommFuncNames[op->func], (unsigned long long)op->seq, op->count,
                             gcommTypeNames[op->datatype], gcommOpNames[op->redop], op->root,
                             w->lane, w->step, peer, what);
      }
      GCOMM_CHECK(receivedData(comm, c, st, dst, bytes, &in[nIn++]));
    }
    if (st->sendPeer[i] >= 0) {
      outConn[nOut] = sendConn(comm, w->lane, st->sendPeer[i]);
      out[nOut] = slotData(outConn[nOut], bytes);
      nOut++;
    }
  }
  /* compute the value once, into dst if there is one, else into the first send slot; a value in
   * the caller's memory (dst, or src sent as it is) goes to a network FIFO by reference */
  char* user = dst ? dst : nIn == 0 && !st->postOp && !stepScalesInput(op, st, nIn) ? src : NULL;
  char* value = user ? user : out[0];
  int byRef[2] = {0, 0};
  gcommRef_t ref[2] = {{user, 0, 0, 0, -1}, {user, 0, 0, 0, -1}};
  for (int i = 0; i < nOut; i++)
    byRef[i] = sendsRef(comm, op, st, outConn[i], user, bytes, &ref[i]);
  if (value != NULL && bytes > 0) {
    stepValue(comm, op, st, src, in, nIn, value);
    for (int i = 0; i < nOut; i++)
      if (out[i] != value && !byRef[i]) memcpy(out[i], value, bytes);
  }
  /* publish: data (or references) before the flags or counters that hand the slots over */
  for (int i = 0, o = 0; i < 2; i++) {
    if (st->sendPeer[i] >= 0) {
      gcommConn_t* c = outConn[o];
      const gcommRef_t* lent = byRef[o] ? &ref[o] : NULL;
      o++;
      if (c->refs) {
        c->refs[c->step % GCOMM_STEPS] = lent ? user : NULL;
        c->refBatch[c->step % GCOMM_STEPS] = op->batch;
        if (lent) {
          __atomic_store_n(&comm->refsUsed, 1, __ATOMIC_RELAXED);
          __atomic_store_n(&c->refUntil, c->step + 1, __ATOMIC_RELAXED);
        }
      }
      /* the payload size and the call's tag (across nodes the tag travels as the message's
       * completion data, transports/net_ofi.c) */
      slotPublish(c, GCOMM_SLOT_WORD(op->tag, bytes), lent);
    }
    if (st->recvPeer[i] >= 0) {
      gcommConn_t* c = recvConn(comm, w->lane, st->recvPeer[i]);
      __atomic_store_n(&c->fifo->head, ++c->step, __ATOMIC_RELEASE);
    }
  }
  return gcommSuccess;
}

/* Whether a step of this many bytes may go out on c, a FIFO to a rank of this node, within the
 * call: through a slot, too small to be lent by reference (the receiver's later read of such a
 * send would outlive the call unseen by gcommWait). */
static int sendsAtOnce(const gcommConn_t* c, size_t bytes) {
  return c->lines != NULL && bytes <= c->slotBytes &&
         (c->refs == NULL || bytes < c->refMinFileBytes);
}

/* Whether c, a FIFO from a rank of this node, holds the step word announces, in its slot (not
 * lent by reference). */
static int receivesAtOnce(const gcommConn_t* c, size_t bytes, uint64_t word) {
  return c->lines != NULL && bytes <= c->slotBytes && slotArrived(c) &&
         gcommSlotWord(c, c->step) == word && slotRef(c, bytes) == NULL;
}

/* One step of a call whose payload fits one slot, to or from peer, a rank of this node, run by
 * the calling thread in its call, without an operation record: a send (of op's sendbuff, also
 * copied to its recvbuff where that is another buffer: a broadcast's root) when sendsAtOnce and
 * its FIFO has room, a receive (into op's recvbuff) when receivesAtOnce with the call's word
 * (size and tag) and no send by reference still reads the memory it writes. The caller holds
 * progressLock with no work active, so no earlier step can come between. Returns whether it ran;
 * else the call takes the whole path, which waits for the room or the slot, or says what is wrong
 * (a different call at this point). */
int gcommSlotAtOnce(gcommComm_t comm, const gcommOp_t* op, int lane, int peer, int send) {
  size_t bytes = op->count * gcommTypeSize(op->datatype);
  uint64_t word = GCOMM_SLOT_WORD(op->tag, bytes);
  if (send) {
    gcommConn_t* c = sendConn(comm, lane, peer);
    if (!sendsAtOnce(c, bytes) || !hasRoom(c, bytes)) return 0;
    memcpy(slotData(c, bytes), op->sendbuff, bytes);
    if (op->recvbuff != NULL && op->recvbuff != op->sendbuff)
      memcpy(op->recvbuff, op->sendbuff, bytes);
    if (c->refs) c->refs[c->step % GCOMM_STEPS] = NULL;
    slotPublish(c, word, NULL);
    return 1;
  }
  gcommConn_t* c = recvConn(comm, lane, peer);
  if (!receivesAtOnce(c, bytes, word) ||
      (sendsByRef(comm) && gcommRefOverlapsElsewhere(comm, -1, op->recvbuff, bytes, 0)))
    return 0;
  memcpy(op->recvbuff, slotData(c, bytes), bytes);
  __atomic_store_n(&c->fifo->head, ++c->step, __ATOMIC_RELEASE);
  return 1;
}

/* A work of one step between ranks of this node, run by the calling thread in its call when the
 * step is ready now: each of its FIFOs sendsAtOnce (with room) or receivesAtOnce the call's word,
 * and it may start (gcommWorkMayStart, stepBlockedOn). The caller holds progressLock with no work
 * active and w's operation not posted, so no earlier step can come between. Returns whether it ran;
 * else the operation takes the whole path, which waits, or says what is wrong. */
int gcommWorkAtOnce(gcommComm_t comm, gcommWork_t* w) {
  const gcommOp_t* op = w->op;
  if (w->nSteps != 1) return 0;
  gcommSchedGetStep(&w->sched, 0, &w->held);
  w->stepHeld = 1;
  const gcommStep_t* st = &w->held;
  size_t bytes = st->count * gcommTypeSize(op->datatype);
  for (int i = 0; i < 2; i++)
    if ((st->sendPeer[i] >= 0 && !sendsAtOnce(sendConn(comm, w->lane, st->sendPeer[i]), bytes)) ||
        (st->recvPeer[i] >= 0 && !receivesAtOnce(recvConn(comm, w->lane, st->recvPeer[i]), bytes,
                                                 GCOMM_SLOT_WORD(op->tag, bytes))))
      return 0;
  int isRecv;
  if (!gcommWorkMayStart(comm, w) || stepBlockedOn(comm, w, st, &isRecv) >= 0 ||
      runStep(comm, w, st) != gcommSuccess)
    return 0;
  w->step = 1;
  return 1;
}

/* A local peer that no longer exists will never fill or drain its FIFOs. Only a process of this
 * node can be probed: a rank of another node is known dead from what the ranks of its node tell
 * (their stop, over the network). Pretend nodes (GCOMM_HOSTID) of one machine probe only their
 * own ranks too, as real nodes do, and the real host names must match. */
int gcommPeerIsDead(gcommComm_t comm, int peer) {
  if (comm->cards[peer].hostId != comm->cards[comm->rank].hostId ||
      strcmp(comm->cards[peer].host, comm->cards[comm->rank].host) != 0)
    return 0;
  return gcommProcessIsDead(comm->cards[peer].pid);
}

/* Rank q's status as a transport knows it: its status page (a rank of this node), or the stop it
 * sent over the network (a rank of another node), or NULL. */
static gcommStatus_t* rankStatus(gcommComm_t comm, int q) {
  gcommStatus_t* st = NULL;
  for (int i = 0; i < comm->nTransports && st == NULL; i++)
    if (comm->transports[i]->status) st = comm->transports[i]->status(comm, q);
  return st;
}

/* What a blocked work probes in rank q, in this order over every rank (the cause first):
 * its death; a different call at the same sequence number (its status page: e.g. another root,
 * where no data flows, so no slot word can tell); the error that stopped it. */
enum { PROBE_DEATH, PROBE_CALL, PROBE_STOP, PROBE_PHASES };

/* Whether rank q can still serve w, by one phase of probes. Fails w naming q. */
static gcommResult_t probeRank(gcommComm_t comm, const gcommWork_t* w, int q, uint64_t waitedMs,
                               int phase) {
  const gcommOp_t* op = w->op;
  char at[192];
  snprintf(at, sizeof(at), "%s (seq %llu) lane %d step %ld/%ld, waiting %llu ms to %s rank %d",
           gcommFuncNames[op->func], (unsigned long long)op->seq, w->lane, w->step, w->nSteps,
           (unsigned long long)waitedMs, w->waitRecv ? "receive from" : "send to", w->waitPeer);
  if (phase == PROBE_DEATH)
    return gcommPeerIsDead(comm, q)
               ? gcommSetError(comm, gcommRemoteError, q, "progress", "%s: rank %d has died", at, q)
               : gcommSuccess;
  gcommStatus_t* st = rankStatus(comm, q);
  if (st == NULL) return gcommSuccess;
  int isColl = !gcommIsPointToPoint(op->func);
  if (phase == PROBE_CALL) {
    if (!isColl || op->tag == 0 || w->lane >= GCOMM_STATUS_LANES) return gcommSuccess;
    uint64_t cur = __atomic_load_n(&st->current[w->lane], __ATOMIC_ACQUIRE);
    if ((uint32_t)(cur >> 32) != (uint32_t)(op->seq + 1) || (uint32_t)cur == op->tag)
      return gcommSuccess;
    char what[256];
    gcommDescribeMismatch(what, sizeof(what), GCOMM_SLOT_WORD((uint32_t)cur, 0),
                          GCOMM_SLOT_WORD(op->tag, 0));
    return gcommSetError(comm, gcommInvalidUsage, q, "progress",
                         "%s: rank %d made a different call: %s", at, q, what);
  }
  int code = __atomic_load_n(&st->code, __ATOMIC_ACQUIRE);
  /* A rank that finished all its work and destroyed the communicator stops only the ranks that
   * wait on it directly (it will never send or drain again); others wait on slower ranks. */
  if (code == 0 || (st->finished && q != w->waitPeer)) return gcommSuccess;
  char msg[sizeof(st->msg)];
  memcpy(msg, st->msg, sizeof(msg));
  msg[sizeof(msg) - 1] = 0;
  int keep = code == gcommInvalidUsage || code == gcommRevoked; /* else the peer's failure */
  return gcommSetError(comm, keep ? (gcommResult_t)code : gcommRemoteError, q, "progress",
                       "%s: rank %d stopped: %s", at, q, msg);
}

static void noteCurrent(gcommComm_t comm, const gcommWork_t* w) {
  const gcommOp_t* op = w->op;
  if (op->tag == 0 || gcommIsPointToPoint(op->func) || w->lane >= GCOMM_STATUS_LANES) return;
  gcommStatus_t* st = gcommShmStatus(comm, comm->rank);
  if (st == NULL) return;
  __atomic_store_n(&st->current[w->lane], (uint64_t)(uint32_t)(op->seq + 1) << 32 | op->tag,
                   __ATOMIC_RELEASE);
}

/* Notes that w cannot move: fails it when a rank died or stopped, the ranks' calls differ,
 * or the deadline passed. */
static gcommResult_t workBlocked(gcommComm_t comm, gcommWork_t* w, int peer, int isRecv) {
  const char* lost =
      (isRecv ? recvConn(comm, w->lane, peer) : sendConn(comm, w->lane, peer))->netFailure;
  if (lost != NULL) return gcommSetError(comm, gcommRemoteError, peer, "progress", "%s", lost);
  if (w->waitSinceNs == 0 || w->waitPeer != peer) {
    w->waitSinceNs = 1; /* waiting, untimed yet */
    w->untimedPolls = 0;
    w->waitPeer = peer;
    w->waitRecv = isRecv;
    return gcommSuccess;
  }
  /* the wait's time counts from its first clock read, GCOMM_UNTIMED_POLLS polls in */
  if (w->waitSinceNs == 1 && ++w->untimedPolls < GCOMM_UNTIMED_POLLS) return gcommSuccess;
  uint64_t now = gcommNowNs();
  if (w->waitSinceNs == 1) {
    w->waitSinceNs = now;
    return gcommSuccess;
  }
  uint64_t waitedMs = (now - w->waitSinceNs) / 1000000;
  const gcommOp_t* op = w->op;
  /* A dead or stopped rank never fills or drains its FIFOs, and the ranks behind it stop when
   * they notice, so the awaited peer may be alive but stuck: after 100 ms of waiting, probe every
   * rank every 50 ms (the pids of this node, the status pages of this node, the stops other
   * nodes sent): deaths first (the cause), then different calls, then stops, the awaited peer
   * first. Survivors name the rank long before the deadline. */
  if (waitedMs >= 100 && now - comm->livenessNs >= 50000000) {
    comm->livenessNs = now;
    for (int phase = 0; phase < PROBE_PHASES; phase++)
      for (int k = 0; k < comm->nranks; k++) {
        int q = (peer + k) % comm->nranks;
        gcommResult_t res = q == comm->rank ? gcommSuccess : probeRank(comm, w, q, waitedMs, phase);
        if (res != gcommSuccess) return res;
      }
  }
  if ((int64_t)waitedMs >= comm->params.timeoutMs)
    return gcommSetError(comm, gcommTimeout, peer, "progress",
                         "%s (seq %llu, count %zu, %s) lane %d step %ld/%ld: waited %llu ms to "
                         "%s rank %d (GCOMM_TIMEOUT_MS=%lld)",
                         gcommFuncNames[op->func], (unsigned long long)op->seq, op->count,
                         gcommTypeNames[op->datatype], w->lane, w->step, w->nSteps,
                         (unsigned long long)waitedMs, isRecv ? "receive from" : "send to", peer,
                         (long long)comm->params.timeoutMs);
  return gcommSuccess;
}

/* Runs w's steps while they are ready (at most a FIFO's worth, for fairness between queues).
 * Returns how many ran, or -1 on error (*res says which). */
int gcommWorkAdvance(gcommComm_t comm, gcommWork_t* w, gcommResult_t* res) {
  int ran = 0;
  if (w->step == 0) noteCurrent(comm, w);
  while (w->step < w->nSteps && ran < GCOMM_STEPS) {
    int isRecv = 0;
    if (w->stepHeld != w->step + 1) {
      gcommSchedGetStep(&w->sched, w->step, &w->held);
      w->stepHeld = w->step + 1;
    }
    const gcommStep_t* st = &w->held;
    if (GCOMM_PROF_ON(comm, gcommProfileProxyOp | gcommProfileProxyStep))
      gcommProfStepBegin(comm, w, st);
    int peer = stepBlockedOn(comm, w, st, &isRecv);
    if (peer >= 0) {
      if (w->profStep != NULL && w->waitSinceNs == 0) gcommProfStepWait(comm, w, peer, isRecv);
      *res = workBlocked(comm, w, peer, isRecv);
      return *res == gcommSuccess ? ran : -1;
    }
    *res = runStep(comm, w, st);
    if (*res != gcommSuccess) return -1;
    w->waitSinceNs = 0;
    w->step++;
    if (w->profStarted) gcommProfWorkStepEnd(comm, w, w->step == w->nSteps);
    ran++;
  }
  return ran;
}
