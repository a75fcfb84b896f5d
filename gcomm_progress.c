/*
 * gcomm_progress.c - the progress engine (proxy): fetches posted operations into the queues,
 * runs passes that advance every queue's head work and every transport's proxy, the progress
 * thread and its sleeps, completion (what gcommWait and gcommTest wait for), hang dumps.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gcomm_core.h"

static volatile sig_atomic_t dumpRequests; /* bumped by the GCOMM_PROXY_DUMP_SIGNAL handler */
static void dumpSignalHandler(int sig) {
  (void)sig;
  dumpRequests++;
}

/* One-work records kept for reuse: the most a communicator keeps (enough for the calls of a
 * group of small operations in flight; more are freed). */
#define GCOMM_OP_POOL_MAX 64

static void opFree(gcommOp_t* op) {
  free(op->scratch);
  free(op);
}

/* Moves the records the finishing threads pushed into the owner's list, freeing what is beyond
 * GCOMM_OP_POOL_MAX (a large group's records, once it has finished). */
static void takePool(gcommComm_t comm) {
  gcommOp_t* op = __atomic_exchange_n(&comm->opPool, NULL, __ATOMIC_ACQUIRE);
  for (gcommOp_t* next; op != NULL; op = next) {
    next = op->next;
    if (comm->opFreeSize >= GCOMM_OP_POOL_MAX) {
      opFree(op);
      continue;
    }
    op->next = comm->opFree;
    comm->opFree = op;
    comm->opFreeSize++;
  }
}

gcommOp_t* gcommOpAlloc(gcommComm_t comm, int nWorks) {
  if (nWorks > 1) {
    gcommOp_t* op = malloc(sizeof(gcommOp_t) + (size_t)nWorks * sizeof(gcommWork_t));
    if (op != NULL) op->pooled = 0, op->scratch = NULL, op->scratchBytes = 0;
    return op;
  }
  if (comm->opFree == NULL) takePool(comm);
  gcommOp_t* op = comm->opFree;
  if (op == NULL) {
    op = malloc(sizeof(gcommOp_t) + sizeof(gcommWork_t));
    if (op == NULL) return NULL;
    op->scratch = NULL, op->scratchBytes = 0;
  } else {
    comm->opFree = op->next;
    comm->opFreeSize--;
  }
  op->pooled = 1;
  return op;
}

void gcommOpRelease(gcommComm_t comm, gcommOp_t* op) {
  if (!op->pooled) {
    opFree(op);
    return;
  }
  op->next = __atomic_load_n(&comm->opPool, __ATOMIC_RELAXED);
  while (!__atomic_compare_exchange_n(&comm->opPool, &op->next, op, 1, __ATOMIC_RELEASE,
                                      __ATOMIC_RELAXED)) {
  }
}

void gcommOpPoolFree(gcommComm_t comm) {
  takePool(comm);
  for (gcommOp_t *op = comm->opFree, *next; op != NULL; op = next) next = op->next, opFree(op);
  comm->opFree = NULL;
  comm->opFreeSize = 0;
}

static void opFinished(gcommComm_t comm, gcommOp_t* op) {
  if (op->prevActive)
    op->prevActive->nextActive = op->nextActive;
  else
    comm->activeHead = op->nextActive;
  if (op->nextActive)
    op->nextActive->prevActive = op->prevActive;
  else
    comm->activeTail = op->prevActive;
  gcommOpRelease(comm, op);
  __atomic_add_fetch(&comm->opsDone, 1, __ATOMIC_RELEASE);
  if (__atomic_load_n(&comm->waiters, __ATOMIC_ACQUIRE) > 0) {
    pthread_mutex_lock(&comm->doneLock);
    pthread_cond_broadcast(&comm->doneCond);
    pthread_mutex_unlock(&comm->doneLock);
  }
}

static void workFinished(gcommComm_t comm, gcommWork_t* w) {
  if (w->profStarted) gcommProfWorkStepEnd(comm, w, 1); /* drained before its end */
  comm->nActiveWorks--;
  if (--w->op->nWorksLeft == 0) opFinished(comm, w->op);
}

/* An operation joins the active list (call order) and its works their queues. Run under
 * progressLock. */
static void activateOp(gcommComm_t comm, gcommOp_t* op) {
  op->prevActive = comm->activeTail;
  op->nextActive = NULL;
  if (comm->activeTail)
    comm->activeTail->nextActive = op;
  else
    comm->activeHead = op;
  comm->activeTail = op;
  for (int i = 0; i < op->nWorks; i++) {
    gcommWork_t* w = &op->works[i];
    gcommQueue_t* q = &comm->queues[w->queue];
    w->next = NULL;
    if (q->tail) {
      q->tail->next = w;
    } else {
      q->head = w;
      comm->busyQueues[w->queue / 64] |= 1ull << (w->queue % 64);
    }
    q->tail = w;
  }
  comm->nActiveWorks += op->nWorks;
}

/* Moves up to max posted operations into the queues. */
static void fetchPosted(gcommComm_t comm, long max) {
  /* a peek without the lock (atomic: posters write it under the lock); the next pass sees what
   * it missed */
  if (__atomic_load_n(&comm->postedHead, __ATOMIC_ACQUIRE) == NULL) return;
  void* ctrl = GCOMM_PROF_ON(comm, gcommProfileProxyCtrl)
                   ? gcommProfCtrlStart(comm, gcommProfilerProxyCtrlAppend)
                   : NULL;
  long k = 0;
  pthread_mutex_lock(&comm->postLock);
  for (; k < max && comm->postedHead != NULL; k++) {
    gcommOp_t* op = comm->postedHead;
    __atomic_store_n(&comm->postedHead, op->next, __ATOMIC_RELEASE);
    if (op->next == NULL) comm->postedTail = NULL;
    activateOp(comm, op);
  }
  pthread_mutex_unlock(&comm->postLock);
  if (ctrl != NULL) gcommProfCtrlStop(comm, ctrl, gcommProfilerProxyCtrlAppendEnd, (int)k);
}

void gcommDrainAll(gcommComm_t comm) {
  fetchPosted(comm, LONG_MAX);
  for (int q = 0; q < comm->nQueues; q++) {
    while (comm->queues[q].head != NULL) {
      gcommWork_t* w = comm->queues[q].head;
      comm->queues[q].head = w->next;
      workFinished(comm, w);
    }
    comm->queues[q].tail = NULL;
  }
  memset(comm->busyQueues, 0, (size_t)busyQueueWords(comm) * sizeof(uint64_t));
}

/* Tells the other ranks that this rank's communicator stopped, and why, so that those blocked on
 * it stop too, naming it: the ranks of this node through its status page (gcommStatus_t), those
 * of other nodes through the network (its stop hook sends comm->stopMsg). The first word stays. */
void gcommPublishStop(gcommComm_t comm, gcommResult_t res, const char* why) {
  gcommStatus_t* st = gcommShmStatus(comm, comm->rank);
  pthread_mutex_lock(&comm->errorLock);
  if (comm->stopCode == 0) {
    const char* msg = why ? why : comm->lastError;
    size_t len = strnlen(msg, sizeof(comm->stopMsg) - 1);
    memcpy(comm->stopMsg, msg, len);
    comm->stopMsg[len] = 0;
    __atomic_store_n(&comm->stopCode, (int)res, __ATOMIC_RELEASE);
  }
  if (st != NULL && __atomic_load_n(&st->code, __ATOMIC_ACQUIRE) == 0) {
    memcpy(st->msg, comm->stopMsg, sizeof(st->msg));
    __atomic_store_n(&st->code, comm->stopCode, __ATOMIC_RELEASE);
  }
  pthread_mutex_unlock(&comm->errorLock);
}

void gcommSetAsyncError(gcommComm_t comm, gcommResult_t res) {
  int expected = gcommSuccess;
  if (__atomic_compare_exchange_n(&comm->asyncError, &expected, (int)res, 0, __ATOMIC_ACQ_REL,
                                  __ATOMIC_ACQUIRE))
    gcommPublishStop(comm, res,
                     res == gcommAborted   ? "gcommCommAbort was called there"
                     : res == gcommRevoked ? "the communicator was revoked"
                                           : NULL);
}

void gcommStop(gcommComm_t comm, gcommResult_t res) {
  /* the error before the flag: a wait that sees the flag returns the error, never success */
  gcommSetAsyncError(comm, res);
  __atomic_store_n(&comm->abortFlag, 1, __ATOMIC_RELEASE);
#ifdef GCOMM_GPU
  gcommDeviceAbort(comm); /* kernels poll it */
#endif
  pthread_mutex_lock(&comm->postLock);
  pthread_cond_signal(&comm->postCond);
  pthread_mutex_unlock(&comm->postLock);
  pthread_mutex_lock(&comm->doneLock);
  pthread_cond_broadcast(&comm->doneCond);
  pthread_mutex_unlock(&comm->doneLock);
}

/* A revoke travels in a node as one word, on the status page of its first rank (not a stop code,
 * which keeps the first failure): a call reads that word alone, however many ranks the node has.
 * To other nodes it goes as a message of its own: every rank that sees it marks the word (the
 * first revoke stays) and sends it on too. */
void gcommRevokeBy(gcommComm_t comm, int by) {
  int expected = 0;
  if (!__atomic_compare_exchange_n(&comm->revoked, &expected, by + 1, 0, __ATOMIC_ACQ_REL,
                                   __ATOMIC_ACQUIRE))
    return;
  expected = 0;
  if (comm->nodeRevoked != NULL)
    __atomic_compare_exchange_n(comm->nodeRevoked, &expected, by + 1, 0, __ATOMIC_ACQ_REL,
                                __ATOMIC_ACQUIRE);
  if (by != comm->rank)
    gcommSetError(comm, gcommRevoked, by, "progress", "rank %d revoked the communicator", by);
  gcommStop(comm, gcommRevoked);
}

/* 1 + the rank whose revoke reached this rank: in the node's revoke word, or through a transport
 * from another node (which reads what came, if no pass holds the engine now), or 0. */
static int revokeArrived(gcommComm_t comm) {
  int by = comm->nodeRevoked != NULL ? __atomic_load_n(comm->nodeRevoked, __ATOMIC_ACQUIRE) : 0;
  if (by != 0 || comm->nLocal == comm->nranks) return by;
  int locked = pthread_mutex_trylock(&comm->progressLock) == 0;
  for (int i = 0; i < comm->nTransports && by == 0; i++)
    if (comm->transports[i]->revokedBy) by = comm->transports[i]->revokedBy(comm, locked);
  if (locked) pthread_mutex_unlock(&comm->progressLock);
  return by;
}

int gcommRevokeSeen(gcommComm_t comm) {
  if (__atomic_load_n(&comm->revoked, __ATOMIC_ACQUIRE) != 0) return 1;
  int by = revokeArrived(comm);
  if (by == 0) return 0;
  gcommRevokeBy(comm, by - 1);
  return 1;
}

/* Every queue's head operation, its step and the peer it waits on, for hang diagnosis
 * (tools/hang_report.py reads these lines from every rank's log): on GCOMM_PROXY_DUMP_SIGNAL and
 * when the engine stops on an error. Logged whatever GCOMM_DEBUG says: it was asked for, or it
 * explains a failure. */
static void dumpState(gcommComm_t comm, const char* why) {
  char line[1024];
  snprintf(
      line, sizeof(line),
      "rank %d/%d comm \"%s\" pid %d (%s): %llu collectives called, %llu ops posted, %llu "
      "done, %ld works active, async error: %s",
      comm->rank, comm->nranks, comm->name, (int)getpid(), why,
      (unsigned long long)__atomic_load_n(&comm->collSeq, __ATOMIC_RELAXED),
      (unsigned long long)__atomic_load_n(&comm->opsPosted, __ATOMIC_RELAXED),
      (unsigned long long)__atomic_load_n(&comm->opsDone, __ATOMIC_RELAXED), comm->nActiveWorks,
      gcommGetErrorString((gcommResult_t)__atomic_load_n(&comm->asyncError, __ATOMIC_RELAXED)));
  gcommLogWrite(GCOMM_LOG_WARN, comm, "dump", line);
  for (int q = 0; q < comm->nQueues; q++) {
    gcommWork_t* w = comm->queues[q].head;
    if (w == NULL) continue;
    int queued = 0;
    for (gcommWork_t* x = w->next; x; x = x->next) queued++;
    const gcommOp_t* op = w->op;
    int len = snprintf(line, sizeof(line), "rank %d comm \"%s\" queue %d: %s", comm->rank,
                       comm->name, q, gcommFuncNames[op->func]);
    if (gcommIsPointToPoint(op->func))
      len += snprintf(line + len, sizeof(line) - len, " peer %d", op->peer);
    else
      len += snprintf(line + len, sizeof(line) - len, " seq %llu root %d",
                      (unsigned long long)op->seq, op->root);
    len +=
        snprintf(line + len, sizeof(line) - len, " count %zu %s %s algo %s channel %d step %ld/%ld",
                 op->count, gcommTypeNames[op->datatype], gcommOpNames[op->redop],
                 gcommAlgoNames[op->algo], w->lane, w->step, w->nSteps);
    if (w->waitSinceNs > 1) { /* timed (1: waiting a few polls, untimed yet) */
      gcommConn_t* c =
          w->waitRecv ? recvConn(comm, w->lane, w->waitPeer) : sendConn(comm, w->lane, w->waitPeer);
      len += snprintf(line + len, sizeof(line) - len,
                      ", waiting %llu ms to %s rank %d (fifo tail %llu head %llu)",
                      (unsigned long long)((gcommNowNs() - w->waitSinceNs) / 1000000),
                      w->waitRecv ? "receive from" : "send to", w->waitPeer,
                      (unsigned long long)c->fifo->tail, (unsigned long long)c->fifo->head);
    }
    snprintf(line + len, sizeof(line) - len, "; %d more queued", queued);
    gcommLogWrite(GCOMM_LOG_WARN, comm, "dump", line);
  }
}

/* Each transport stops whatever waits on its proxy and tells the ranks it reaches why this rank
 * stopped. Run by the pass that found the error too: in poll mode nobody may run another. */
static void stopTransports(gcommComm_t comm) {
  for (int i = 0; i < comm->nTransports; i++)
    if (comm->transports[i]->stop) comm->transports[i]->stop(comm);
}

/* After an error or an abort: every operation finishes as failed, and the transports stop.
 * Returns whether anything was still active. */
static int stopPass(gcommComm_t comm) {
  int moved = comm->nActiveWorks > 0 || __atomic_load_n(&comm->postedHead, __ATOMIC_ACQUIRE);
  gcommDrainAll(comm);
  stopTransports(comm);
  return moved;
}

/* A work failed with res: the communicator stops, every queue's state is logged. */
static void workFailed(gcommComm_t comm, gcommResult_t res) {
  gcommSetAsyncError(comm, res);
  dumpState(comm, gcommGetErrorString(res)); /* where every queue stood */
  /* a mismatch: slots this rank filled before it saw it still go out (the network's posting
   * sends them for small slots), so that a peer on another node waiting on them sees the
   * mismatch in their tag instead of waiting for its deadline */
  int posted = 0;
  for (int i = 0; i < comm->nTransports && res == gcommInvalidUsage; i++)
    if (comm->transports[i]->progress) (void)comm->transports[i]->progress(comm, &posted);
  gcommDrainAll(comm);
  stopTransports(comm);
}

/* Every queue's head work runs its ready steps; a finished work makes way for the next. Returns
 * -1 when a work failed (the communicator has stopped), else whether anything moved. */
static int runQueues(gcommComm_t comm) {
  int moved = 0;
  for (int word = 0; word < busyQueueWords(comm); word++)
    for (uint64_t bits = comm->busyQueues[word]; bits != 0; bits &= bits - 1) {
      int q = word * 64 + __builtin_ctzll(bits);
      gcommWork_t* w;
      while ((w = comm->queues[q].head) != NULL) {
        gcommResult_t res = gcommSuccess;
        if (w->step == 0 && !gcommWorkMayStart(comm, w)) break;
        int ran = gcommWorkAdvance(comm, w, &res);
        if (ran < 0) {
          workFailed(comm, res);
          return -1;
        }
        moved |= ran > 0;
        if (w->step < w->nSteps) break;
        comm->queues[q].head = w->next;
        if (w->next == NULL) {
          comm->queues[q].tail = NULL;
          comm->busyQueues[word] &= ~(1ull << (q % 64));
        }
        workFinished(comm, w);
        moved = 1;
      }
    }
  return moved;
}

/* One pass: every queue's head work runs its ready steps, then every transport's proxy (the
 * network's: slots just filled go out, arrived ones are handed to the executor; the copy
 * engines': staging slots the kernels filled go to the local peers' FIFOs). Returns whether
 * anything moved. Only one thread at a time runs a pass (comm->progressLock). */
int gcommProgressPass(gcommComm_t comm) {
  comm->passes++;
  if (comm->dumpSeen != (uint64_t)dumpRequests) {
    comm->dumpSeen = (uint64_t)dumpRequests;
    dumpState(comm, "GCOMM_PROXY_DUMP_SIGNAL");
  }
  if (__atomic_load_n(&comm->abortFlag, __ATOMIC_ACQUIRE) ||
      __atomic_load_n(&comm->asyncError, __ATOMIC_ACQUIRE) != gcommSuccess)
    return stopPass(comm);
  if (comm->nActiveWorks == 0 || comm->passes % comm->params.appendFreq == 0)
    fetchPosted(comm, comm->params.appendBatch);
  int moved = runQueues(comm);
  if (moved < 0) return 1;
  for (int i = 0; i < comm->nTransports; i++) {
    const gcommTransport_t* t = comm->transports[i];
    gcommResult_t res = t->progress ? t->progress(comm, &moved) : gcommSuccess;
    if (res != gcommSuccess) {
      gcommSetAsyncError(comm, res); /* the next pass, if any, stops the rest (stopPass) */
      gcommDrainAll(comm);
      stopTransports(comm);
      return 1;
    }
  }
  /* work that waits (on a peer the revoke stopped, maybe) looks for a revoke, every
   * GCOMM_UNTIMED_POLLS passes (the node's revoke word and, across nodes, the transports', which
   * a spinning wait need not read each poll): the next pass stops */
  if (!moved && comm->nActiveWorks > 0 && comm->passes % GCOMM_UNTIMED_POLLS == 0 &&
      gcommRevokeSeen(comm))
    return 1;
  return moved;
}

/* Data of finished operations still in a transport (withCredits: or what it owes peers besides
 * data): the engine keeps running for them after every operation has finished. gcommWait waits
 * for the data, which may read the caller's memory, but not for the credits: they only tell a
 * peer about receives posted ahead for later operations, and a peer that has destroyed its
 * communicator never takes them (a wait for one hung). */
static int transportsPending(gcommComm_t comm, int withCredits) {
  int pending = 0;
  for (int i = 0; i < comm->nTransports && !pending; i++)
    if (comm->transports[i]->pending) pending = comm->transports[i]->pending(comm, withCredits);
  return pending;
}

/* Whether a transport may be moving data for this communicator only while polled (works
 * active on a provider that progresses when polled, or a GPU communicator's kernels waiting on
 * proxied FIFOs): the engine yields the core then, but never naps. Every transport is asked (a
 * GPU's answer notes when its kernels last waited). Run under progressLock. */
static int transportsMustPoll(gcommComm_t comm) {
  int poll = 0;
  for (int i = 0; i < comm->nTransports; i++)
    if (comm->transports[i]->mustPoll) poll |= comm->transports[i]->mustPoll(comm);
  return poll;
}

/* The host's waits: spinUs microseconds of spinning, then yields, naps of at most 1 ms (when
 * mayNap). */
static uint64_t hostBackoff(uint64_t* idleSince, uint64_t spinUs, int mayNap) {
  return gcommBackoff(idleSince, spinUs, mayNap ? 1000 : 0);
}

/* At the thread's end, GCOMM_DEBUG=INFO (PROXY): the CPU it used over the communicator's life,
 * in all and per operation posted or launched, what the proxy knobs (GCOMM_PROGRESS_APPENDOP_FREQ,
 * GCOMM_PROXY_APPEND_BATCH_SIZE, copy engines, ...) trade against latency. */
static void reportThreadCpu(gcommComm_t comm) {
  struct timespec cpu;
  if (!gcommLogEnabled(GCOMM_LOG_INFO, GCOMM_SUBSYS_PROXY) ||
      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu) != 0)
    return;
  double us = cpu.tv_sec * 1e6 + cpu.tv_nsec / 1e3;
  unsigned long long ops = __atomic_load_n(&comm->opsPosted, __ATOMIC_RELAXED) +
                           __atomic_load_n(&comm->opsGpu, __ATOMIC_RELAXED);
  GCOMM_INFO(GCOMM_SUBSYS_PROXY, comm,
             "progress thread CPU time: %.0f us over %llu operations, %.2f us an operation "
             "(%llu passes)",
             us, ops, ops ? us / (double)ops : 0.0, (unsigned long long)comm->passes);
}

static void* progressThread(void* arg) {
  gcommComm_t comm = (gcommComm_t)arg;
  uint64_t idleSince = 0;
  for (int i = 0; i < comm->nTransports; i++)
    if (comm->transports[i]->threadStart) comm->transports[i]->threadStart(comm);
  pthread_mutex_lock(&comm->progressLock);
  while (!__atomic_load_n(&comm->stopThread, __ATOMIC_ACQUIRE)) {
    if (__atomic_load_n(&comm->drivers, __ATOMIC_ACQUIRE) > 0) {
      /* A waiting thread runs the passes (gcommWait): stay off the cores while one does. Posts
       * do not wake this sleep (a wait follows most posts, and a wake for each made small
       * all-reduces 2-3 us slower); a driver that leaves work behind does, else it ends within
       * 1 ms of the last driver leaving. */
      pthread_mutex_unlock(&comm->progressLock);
      pthread_mutex_lock(&comm->postLock);
      comm->standby = 1;
      while (__atomic_load_n(&comm->drivers, __ATOMIC_ACQUIRE) > 0 &&
             !__atomic_load_n(&comm->stopThread, __ATOMIC_ACQUIRE)) {
        struct timespec ts = gcommDeadlineIn(1000000);
        pthread_cond_timedwait(&comm->postCond, &comm->postLock, &ts);
      }
      comm->standby = 0;
      pthread_mutex_unlock(&comm->postLock);
      pthread_mutex_lock(&comm->progressLock);
      idleSince = 0;
      continue;
    }
    if (gcommProgressPass(comm)) {
      idleSince = 0;
      continue;
    }
    int mayNap = !transportsMustPoll(comm);
    int nothingLeft =
        mayNap && comm->nActiveWorks == 0 && !transportsPending(comm, 1); /* under lock */
    pthread_mutex_unlock(&comm->progressLock);
    /* waiting on peers: back off. Nothing at all to do for a while: sleep until a post (a GPU
     * communicator's launch signals too, and kernels may start later, as graphs do: a GPU
     * communicator with a proxy, network or copy engines, looks every millisecond). Where
     * waiting threads drive (host communicators), this thread matters only for
     * work nobody waits on, which a post wakes it for: it sleeps as soon as nothing is left
     * instead of yielding for 1 ms, which took the core from whatever the caller did next. */
    int idleUs = (int)hostBackoff(&idleSince, 5, mayNap);
    if ((idleUs > 1000 || waitersDrive(comm)) && nothingLeft) {
      int timedOut = 0;
      pthread_mutex_lock(&comm->postLock);
      int callerLeft = comm->callerLeft; /* queued after nothingLeft was found: not asleep */
      comm->callerLeft = 0;
      if (comm->postedHead == NULL && !callerLeft &&
          !__atomic_load_n(&comm->stopThread, __ATOMIC_ACQUIRE)) {
        /* wake now and then for dumps */
        struct timespec ts = gcommDeadlineIn(hasGpuProxy(comm) ? 1000000 : 100 * 1000000);
        void* ctrl = GCOMM_PROF_ON(comm, gcommProfileProxyCtrl)
                         ? gcommProfCtrlStart(comm, gcommProfilerProxyCtrlSleep)
                         : NULL;
        timedOut = pthread_cond_timedwait(&comm->postCond, &comm->postLock, &ts) == ETIMEDOUT;
        if (ctrl != NULL) gcommProfCtrlStop(comm, ctrl, gcommProfilerProxyCtrlWakeup, 0);
      }
      pthread_mutex_unlock(&comm->postLock);
      if (!timedOut) idleSince = 0; /* woken: work may follow; else back to sleep after a pass */
    }
    pthread_mutex_lock(&comm->progressLock);
  }
  reportThreadCpu(comm); /* under progressLock: passes */
  pthread_mutex_unlock(&comm->progressLock);
  return NULL;
}

gcommResult_t gcommStartThread(gcommComm_t comm) {
  if (comm->params.proxyMode != GCOMM_PROXY_THREAD ||
      __atomic_load_n(&comm->threadStarted, __ATOMIC_ACQUIRE)) /* posters may race: see below */
    return gcommSuccess;
  pthread_mutex_lock(&comm->postLock);
  int err = 0;
  if (!comm->threadStarted) {
    err = pthread_create(&comm->thread, NULL, progressThread, comm);
    if (err == 0) __atomic_store_n(&comm->threadStarted, 1, __ATOMIC_RELEASE);
  }
  pthread_mutex_unlock(&comm->postLock);
  if (err != 0)
    return GCOMM_ERROR(comm, gcommSystemError, -1, "cannot start the progress thread: %s",
                       strerror(err));
  return gcommSuccess;
}

/* A GPU communicator with a proxy (hasGpuProxy: ranks on other nodes, or copy engines): the
 * FIFOs its kernels fill and drain move only while the progress thread runs (nobody calls
 * gcommWait while stream-ordered kernels wait on them), so the thread starts with the
 * communicator and runs until destroy: polling while kernels wait, sleeping (1 ms at a time) when
 * nothing moves. Poll mode cannot drive such kernels: it warns and uses the thread. */
gcommResult_t gcommStartGpuProxy(gcommComm_t comm) {
  if (comm->params.proxyMode == GCOMM_PROXY_POLL) {
    GCOMM_WARN(comm,
               "GCOMM_PROXY_MODE=poll: a GPU communicator %s needs the progress thread to move "
               "its FIFOs while kernels run: using it",
               stagesNet(comm) ? "whose ranks span nodes" : "with copy engines");
    comm->params.proxyMode = GCOMM_PROXY_THREAD;
  }
  return gcommStartThread(comm);
}

/* The caller's fast path, in both modes. Where nothing is posted or active ahead of the
 * operations (so call order holds without the engine; only this thread posts) and no pass runs
 * now, the calling thread puts them straight into the queues and runs one pass itself: what can
 * move moves before the call returns (a small operation's sends, a root's broadcast, all of it on
 * one rank), with no hand-off through the posted list and its lock. Returns -1 when it did not run
 * them (the engine fetches them), 1 when everything finished there (the progress thread need not
 * hear of it), 0 when work is left in the queues for gcommWait's drivers or the thread. */
static int runPosted(gcommComm_t comm, gcommOp_t* head) {
  if (__atomic_load_n(&comm->postedHead, __ATOMIC_ACQUIRE) != NULL ||
      pthread_mutex_trylock(&comm->progressLock) != 0)
    return -1;
  if (comm->nActiveWorks > 0) { /* the engine has work ahead */
    pthread_mutex_unlock(&comm->progressLock);
    return -1;
  }
  void* ctrl = GCOMM_PROF_ON(comm, gcommProfileProxyCtrl) /* an append, as fetchPosted's */
                   ? gcommProfCtrlStart(comm, gcommProfilerProxyCtrlAppend)
                   : NULL;
  int k = 0;
  for (gcommOp_t *op = head, *next; op != NULL; op = next, k++) {
    next = op->next;
    activateOp(comm, op);
  }
  if (ctrl != NULL) gcommProfCtrlStop(comm, ctrl, gcommProfilerProxyCtrlAppendEnd, k);
  (void)gcommProgressPass(comm);
  int done = comm->nActiveWorks == 0 && !transportsPending(comm, 1);
  pthread_mutex_unlock(&comm->progressLock);
  return done;
}

/* Hands a list of operations to the engine: run by the caller (runPosted) where nothing is ahead
 * of them, else appended to the posted list, which the engine fetches. Only the owner thread
 * posts (gcommEnqueueCheck), so the posted list's emptiness cannot change under the caller. */
gcommResult_t gcommPostOps(gcommComm_t comm, gcommOp_t* head, gcommOp_t* tail, int n) {
  GCOMM_CHECK(gcommStartThread(comm));
  gcommOwnerAdd(&comm->opsPosted, (uint64_t)n);
  comm->batches++;
  for (gcommOp_t* op = head; op != NULL; op = op->next) op->batch = comm->batches;
  int ran = runPosted(comm, head);
  /* done, or left in the queues with no progress thread to tell (poll mode: the caller's waits
   * drive them) */
  if (ran == 1 || (ran == 0 && !__atomic_load_n(&comm->threadStarted, __ATOMIC_ACQUIRE)))
    return gcommSuccess;
  pthread_mutex_lock(&comm->postLock);
  if (ran == 0) { /* active already: wake the thread for what is left unless a driver runs */
    comm->callerLeft = 1;
    if (!comm->standby) pthread_cond_signal(&comm->postCond);
    pthread_mutex_unlock(&comm->postLock);
    return gcommSuccess;
  }
  if (comm->postedTail)
    comm->postedTail->next = head;
  else
    __atomic_store_n(&comm->postedHead, head, __ATOMIC_RELEASE);
  comm->postedTail = tail;
  if (__atomic_load_n(&comm->threadStarted, __ATOMIC_ACQUIRE) && !comm->standby)
    pthread_cond_signal(&comm->postCond); /* else no one sleeps on it */
  pthread_mutex_unlock(&comm->postLock);
  return gcommSuccess;
}

/* GCOMM_PROXY_DUMP_SIGNAL: only a signal nothing else needs (SIGUSR1, SIGUSR2, real-time). Any
 * other would take one from the program or the runtime: SIGSEGV's handler returning makes a
 * crash loop forever, SIGINT's swallows Ctrl-C, SIGKILL cannot be caught. */
void gcommInstallDumpSignal(gcommComm_t comm) {
  int sig = (int)comm->params.dumpSignal;
  if (sig != SIGUSR1 && sig != SIGUSR2 && (sig < SIGRTMIN || sig > SIGRTMAX)) {
    GCOMM_WARN(comm,
               "GCOMM_PROXY_DUMP_SIGNAL=%d is not SIGUSR1 (%d), SIGUSR2 (%d) or a real-time "
               "signal (%d..%d): dumps on a signal are off",
               sig, SIGUSR1, SIGUSR2, SIGRTMIN, SIGRTMAX);
    return;
  }
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = dumpSignalHandler;
  sa.sa_flags = SA_RESTART;
  sigaction(sig, &sa, NULL);
}

int gcommAllDone(gcommComm_t comm, uint64_t target) {
  return __atomic_load_n(&comm->opsDone, __ATOMIC_ACQUIRE) >= target && !transportsPending(comm, 0);
}

/* The result of finished work: the communicator's error if it stopped, else success. */
gcommResult_t gcommFinalResult(gcommComm_t comm, const char* where) {
  gcommResult_t res = (gcommResult_t)__atomic_load_n(&comm->asyncError, __ATOMIC_ACQUIRE);
  if (res == gcommSuccess) return gcommSuccess;
  if (res == gcommAborted)
    return gcommSetError(comm, res, -1, where, "the communicator was aborted");
  if (res == gcommRevoked) {
    int by = __atomic_load_n(&comm->revoked, __ATOMIC_ACQUIRE) - 1;
    return gcommSetError(comm, res, by, where,
                         "the communicator was revoked (gcommCommRevoke on rank %d)", by);
  }
  return res; /* the engine already recorded what, where and which peer */
}

gcommResult_t gcommRevokedResult(gcommComm_t comm, const char* where) {
  return gcommRevokeSeen(comm) ? gcommFinalResult(comm, where) : gcommSuccess;
}

gcommResult_t gcommDeadPeerResult(gcommComm_t comm, const char* where) {
  for (int i = 0; i < comm->nLocal && comm->localRanks != NULL; i++) {
    int q = comm->localRanks[i];
    if (q == comm->rank || !gcommPeerIsDead(comm, q)) continue;
    gcommResult_t res = gcommSetError(comm, gcommRemoteError, q, where, "rank %d has died", q);
    gcommStop(comm, res);
    return res;
  }
  return gcommSuccess;
}

static gcommResult_t waitDone(gcommComm_t comm, uint64_t target, int poll, int drive) {
  uint64_t deadline = 0, idleSince = 0, probeAt = 0;
  int spins = 0;
  while (!gcommAllDone(comm, target)) {
    /* a revoke (the node's word, and across nodes the transports') at the first poll and once
     * spinning is over: a spinning poll's cost is the wait's reaction time */
    if (__atomic_load_n(&comm->abortFlag, __ATOMIC_ACQUIRE) ||
        ((spins == 0 || spins >= GCOMM_UNTIMED_POLLS) && gcommRevokeSeen(comm)))
      return gcommFinalResult(comm, "gcommWait");
    int ran = poll || (drive && pthread_mutex_trylock(&comm->progressLock) == 0), mayNap = 1;
    if (ran) {
      if (poll) pthread_mutex_lock(&comm->progressLock);
      int moved = gcommProgressPass(comm);
      mayNap = moved || !transportsMustPoll(comm); /* asked only where a nap may follow */
      pthread_mutex_unlock(&comm->progressLock);
      if (moved) {
        idleSince = 0, spins = 0;
        continue;
      }
    }
    if (spins < GCOMM_UNTIMED_POLLS) { /* then the clock's: spin comm->waitSpinUs, then yield */
      spins++;
      gcommCpuRelax();
      continue;
    }
    uint64_t now = gcommNowNs();
    if (deadline == 0) deadline = now + (uint64_t)(comm->params.timeoutMs + 1000) * 1000000;
    /* what is left may wait on no step (a local peer's copy of this rank's memory, one copy):
     * after 100 ms, every 50 ms, a rank of the node that died is named (the steps' own probes
     * cover the rest) */
    if (probeAt == 0) probeAt = now + 100000000;
    if (now >= probeAt) {
      probeAt = now + 50000000;
      gcommResult_t res = gcommDeadPeerResult(comm, "gcommWait");
      if (res != gcommSuccess) {
        if (poll) { /* the stop reaches other nodes in a pass: in poll mode, this thread's */
          pthread_mutex_lock(&comm->progressLock);
          (void)gcommProgressPass(comm);
          pthread_mutex_unlock(&comm->progressLock);
        }
        return res;
      }
    }
    if (now > deadline)
      return gcommSetError(
          comm, gcommTimeout, -1, "gcommWait",
          "%llu operations still outstanding after GCOMM_TIMEOUT_MS=%lld",
          (unsigned long long)(target - __atomic_load_n(&comm->opsDone, __ATOMIC_ACQUIRE)),
          (long long)comm->params.timeoutMs);
    if (ran) {
      hostBackoff(&idleSince, comm->waitSpinUs, mayNap);
    } else if (hostBackoff(&idleSince, 0, 1) > 1000) {
      /* long waits sleep until the engine finishes something (or 1 ms, to see aborts) */
      struct timespec ts = gcommDeadlineIn(1000000);
      pthread_mutex_lock(&comm->doneLock);
      __atomic_add_fetch(&comm->waiters, 1, __ATOMIC_SEQ_CST);
      if (!gcommAllDone(comm, target) && !__atomic_load_n(&comm->abortFlag, __ATOMIC_ACQUIRE))
        pthread_cond_timedwait(&comm->doneCond, &comm->doneLock, &ts);
      __atomic_sub_fetch(&comm->waiters, 1, __ATOMIC_SEQ_CST);
      pthread_mutex_unlock(&comm->doneLock);
    }
  }
  return gcommFinalResult(comm, "gcommWait");
}

/* A wait that found every operation up to target done and no transport holding their data: the
 * waits after it, of any thread (release: they see what it saw), are over at once while nothing
 * is posted (a transport holds data only of operations posted since). */
static gcommResult_t settled(gcommComm_t comm, uint64_t target) {
  __atomic_store_n(&comm->opsSettled, target, __ATOMIC_RELEASE);
  return gcommFinalResult(comm, "gcommWait");
}

gcommResult_t gcommHostWait(gcommComm_t comm) {
  uint64_t target = __atomic_load_n(&comm->opsPosted, __ATOMIC_ACQUIRE);
  if (target == __atomic_load_n(&comm->opsSettled, __ATOMIC_ACQUIRE))
    return gcommFinalResult(comm, "gcommWait");
  /* finished already (small operations often finish in the call that posted them) */
  if (gcommAllDone(comm, target)) return settled(comm, target);
  int poll = comm->params.proxyMode == GCOMM_PROXY_POLL;
  /* A waiting thread runs the passes itself, as in poll mode, and the engine thread sleeps
   * meanwhile: no hand-off from one thread to the other on the critical path (small all-reduces
   * over tcp: 12 against 40-60 us; in a node on 2 cores: 3 against 16 us), and no second thread
   * taking turns on the lock and the cores (each of its waits on the lock cost a futex wake:
   * docs/PERF.md). The engine thread serves work posted while nobody waits. */
  int drive = !poll && waitersDrive(comm);
  if (drive) __atomic_add_fetch(&comm->drivers, 1, __ATOMIC_SEQ_CST);
  gcommResult_t res = waitDone(comm, target, poll, drive);
  if (drive && __atomic_sub_fetch(&comm->drivers, 1, __ATOMIC_SEQ_CST) == 0 &&
      !gcommAllDone(comm, __atomic_load_n(&comm->opsPosted, __ATOMIC_ACQUIRE))) {
    pthread_mutex_lock(&comm->postLock); /* the engine thread takes over what is left */
    pthread_cond_broadcast(&comm->postCond);
    pthread_mutex_unlock(&comm->postLock);
  }
  return res;
}
