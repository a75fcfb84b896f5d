/*
 * gcomm_net_direct.c - the network's zero-copy receives: which caller memory the receive of a
 * network FIFO step may land in directly (the hook gcommNetDirectTarget that the core hands the
 * network transport).
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <string.h>

#include "gcomm_core.h"

#ifdef GCOMM_OFI
/* Steps [0, upTo) of schedule s that receive from (isRecv) or send to rank peer: the messages
 * they take from, or give to, that peer's FIFO. */
static uint64_t schedMessages(const gcommSched_t* s, long upTo, int peer, int isRecv) {
  uint64_t n = 0;
  for (long k = 0; k < upTo; k++) {
    gcommStep_t st;
    gcommSchedGetStep(s, k, &st);
    const int* with = isRecv ? st.recvPeer : st.sendPeer;
    n += with[0] == peer || with[1] == peer;
  }
  return n;
}

/* How many of this rank's messages of an operation (schedule s) rank peer has received when it
 * sends its message i of that operation to this rank: it runs the same schedule as its own rank,
 * and a step that both receives and sends has received first. */
static uint64_t peerReceivedBefore(const gcommSched_t* s, int peer, uint64_t i) {
  gcommSched_t theirs = *s;
  theirs.rank = peer;
  long n = gcommSchedNumSteps(&theirs);
  uint64_t sent = 0, got = 0;
  for (long k = 0; k < n; k++) {
    gcommStep_t st;
    gcommSchedGetStep(&theirs, k, &st);
    got += st.recvPeer[0] == s->rank || st.recvPeer[1] == s->rank;
    if ((st.sendPeer[0] == s->rank || st.sendPeer[1] == s->rank) && sent++ == i) return got;
  }
  return 0; /* no such message: nothing is known to have been received */
}

/* The last step of an all-gather phase copies what arrives into the output, half of what a rank
 * receives in a 2-rank all-reduce: received there directly, that copy goes. The works queued on
 * the lane (collective lanes only) tell which step takes FIFO step s (counting, from the head's
 * current step, those that receive from the peer). The data lands whenever the message comes,
 * before that step runs, so what that memory is used for before then must be over by the time the
 * message can come:
 *  - a step of this rank that reads or writes it has run, if it runs no later than this rank's
 *    send of a message the peer has received before it sends step s (peerReceivedBefore: the
 *    peer's schedule); an in-place all-reduce's all-gather half lands where its reduce-scatter
 *    sent from, which the peer received first;
 *  - a send by reference from it (refs) has been read if the peer has received it by then; one to
 *    another rank may still be read.
 * *queuedUntil: when none takes step s, the FIFO step after those they take, if its receive
 * should wait for the operation that does (c->holdRecvs), else UINT64_MAX. After a failure such a
 * receive may stay posted into the caller's memory until the communicator is destroyed (as MPI's
 * would). */
char* gcommNetDirectTarget(gcommComm_t comm, gcommConn_t* c, uint64_t s, size_t* bytes,
                           uint64_t* queuedUntil) {
  enum { LOOKAHEAD = 64 }; /* steps examined: a receive is at most GCOMM_STEPS ahead */
  int lane = (int)(c - comm->recvConns) / comm->nranks, peer = c->peer;
  *queuedUntil = UINT64_MAX;
  if (lane >= comm->nChannels || s < c->step) return NULL;
  gcommWork_t* head = comm->queues[lane].head;
  const gcommConn_t* out = sendConn(comm, lane, peer);
  struct {
    const char* p;
    size_t len;
    uint64_t sentBefore; /* this rank's next message to peer when that step runs */
    int toOthers;        /* the step sends to a rank other than peer */
  } touched[2 * LOOKAHEAD];
  int nTouched = 0;
  long scanned = 0;
  uint64_t at = c->step, sent = out->step; /* the next FIFO steps from and to peer */
  for (gcommWork_t* w = head; w != NULL; w = w->next) {
    const gcommOp_t* op = w->op;
    size_t esz = gcommTypeSize(op->datatype), largest = 0; /* of its messages from peer */
    long first = w == head ? w->step : 0;
    uint64_t recvFirst = at, sendFirst = sent; /* the FIFO steps at its step `first` */
    for (long k = first; k < w->nSteps; k++) {
      if (scanned++ == LOOKAHEAD) return NULL;
      gcommStep_t st;
      gcommSchedGetStep(&w->sched, k, &st);
      int fromPeer = st.recvPeer[0] == peer || st.recvPeer[1] == peer;
      int toPeer = st.sendPeer[0] == peer || st.sendPeer[1] == peer;
      int toOthers = (st.sendPeer[0] >= 0 && st.sendPeer[0] != peer) ||
                     (st.sendPeer[1] >= 0 && st.sendPeer[1] != peer);
      char* src = opBuffer(op, st.src);
      char* dst = opBuffer(op, st.dst);
      size_t len = st.count * esz;
      if (src) src += st.srcOff * esz;
      if (dst) dst += st.dstOff * esz;
      if (!fromPeer || at < s) {
        if (fromPeer && len > largest) largest = len;
        for (int i = 0; i < 2; i++) {
          touched[nTouched].p = i ? dst : src;
          touched[nTouched].len = len;
          touched[nTouched].sentBefore = sent;
          touched[nTouched++].toOthers = toOthers;
        }
        at += fromPeer;
        sent += toPeer;
        continue;
      }
      /* step k takes FIFO step s: a plain copy of the message into the output, once no earlier
       * operation on another lane still uses that memory */
      if (!gcommOpMayStart(comm, w->op) || st.recvPeer[1] >= 0 || st.reduce || st.postOp ||
          src != NULL || dst == NULL || len == 0 || len > c->slotBytes)
        return NULL;
      /* what else uses that memory first must be over by the time the message can come */
      if (gcommRefOverlapsElsewhere(comm, lane, dst, len, 0)) return NULL;
      int used = gcommRefOverlaps(comm, lane, dst, len, -1, 0, 0) >= 0;
      for (int i = 0; i < nTouched && !used; i++)
        used = gcommRangesMeet(touched[i].p, touched[i].len, dst, len);
      if (used) {
        /* this rank's messages below `received` reached the peer before it sent step s */
        uint64_t recvBase = recvFirst - schedMessages(&w->sched, first, peer, 1);
        uint64_t received = sendFirst - schedMessages(&w->sched, first, peer, 0) +
                            peerReceivedBefore(&w->sched, peer, s - recvBase);
        for (int i = 0; i < nTouched; i++)
          if (gcommRangesMeet(touched[i].p, touched[i].len, dst, len) &&
              (touched[i].toOthers || touched[i].sentBefore >= received))
            return NULL;
        if (gcommRefOverlaps(comm, lane, dst, len, peer, received, 0) >= 0) return NULL;
      }
      *bytes = len;
      return dst;
    }
    if (largest > 0) c->holdRecvs = 2 * largest >= c->slotBytes;
  }
  *queuedUntil = c->holdRecvs ? at : UINT64_MAX;
  return NULL;
}
#endif
