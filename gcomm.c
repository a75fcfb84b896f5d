/*
 * gcomm.c - gcomm's public API (gcomm.h) and the life of a communicator: create (over MPI, or over
 * a shrunk communicator's status pages for gcomm_shrink.c), split, abort, destroy, queries,
 * PreMulSum operators, and the entry points of every data call, of groups and of completion. Each
 * entry point checks its arguments (gcomm_args.c) and hands the work to the file that does it. The
 * path of one collective:
 *
 *   gcommAllReduce -> gcommEnqueue (gcomm_enqueue.c: checks, group-aware) -> gcommChooseAlgo
 *   (gcomm_tuning.c) -> works, one per channel -> posted to the progress engine
 *   (gcomm_progress.c) -> each progress pass advances the head work of every queue by the steps of
 *   its schedule (gcomm_sched.h) whose FIFOs are ready (gcomm_executor.c) -> the op completes when
 *   all of its works have -> gcommWait returns.
 *
 * docs/ARCHITECTURE.md draws the layers and lists every file.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "gcomm_core.h"

const char* gcommGetLastError(gcommComm_t comm) {
  if (comm != NULL && gcommCommIsLive(comm)) return comm->lastError;
  return gcommThreadLastError();
}

gcommResult_t gcommGetVersion(int* version) {
  if (version == NULL) return GCOMM_ERROR(NULL, gcommInvalidArgument, -1, "version is NULL");
  *version = GCOMM_VERSION_CODE;
  return gcommSuccess;
}

static void commFree(gcommComm_t comm) {
  int finalized = 1;
  if (comm->threadStarted) {
    pthread_mutex_lock(&comm->postLock);
    __atomic_store_n(&comm->stopThread, 1, __ATOMIC_RELEASE);
    pthread_cond_signal(&comm->postCond);
    pthread_mutex_unlock(&comm->postLock);
    pthread_join(comm->thread, NULL);
  }
  if (comm->queues) gcommDrainAll(comm); /* frees whatever never ran */
  gcommOpPoolFree(comm);
  free(comm->partArgs);
  gcommProfFinalize(comm); /* no hook runs after this */
  /* the transports: all closed (in setup order), then freed (in reverse) */
  for (int i = 0; i < comm->nTransports; i++)
    if (comm->transports[i]->close) comm->transports[i]->close(comm);
  for (int i = comm->nTransports - 1; i >= 0; i--)
    if (comm->transports[i]->free) comm->transports[i]->free(comm);
  free(comm->sendConns);
  free(comm->recvConns);
  free(comm->queues);
  free(comm->busyQueues);
  free(comm->cards);
  free(comm->localRanks);
  free(comm->boot);
  MPI_Finalized(&finalized);
  if (!finalized && comm->mpiComm != MPI_COMM_NULL) MPI_Comm_free(&comm->mpiComm);
  pthread_mutex_destroy(&comm->postLock);
  pthread_cond_destroy(&comm->postCond);
  pthread_mutex_destroy(&comm->progressLock);
  pthread_mutex_destroy(&comm->doneLock);
  pthread_cond_destroy(&comm->doneCond);
  pthread_mutex_destroy(&comm->errorLock);
  free(comm);
}

/* Takes ownership of mpiComm (already private to gcomm). */
gcommResult_t gcommCommCreate(gcommComm_t* out, MPI_Comm mpiComm, const gcommConfig_t* config,
                              gcommComm_t pages, const int* pageRank, int rank, int nranks) {
  gcommComm_t comm = calloc(1, sizeof(*comm));
  if (comm == NULL) {
    if (mpiComm != MPI_COMM_NULL) MPI_Comm_free(&mpiComm);
    return GCOMM_ERROR(NULL, gcommSystemError, -1, "out of memory");
  }
  comm->mpiComm = mpiComm;
  comm->rank = rank;
  comm->nranks = nranks;
  comm->owner = pthread_self();
  comm->ownerTid = (long)syscall(SYS_gettid);
  pthread_mutex_init(&comm->postLock, NULL);
  pthread_cond_init(&comm->postCond, NULL);
  pthread_mutex_init(&comm->progressLock, NULL);
  pthread_mutex_init(&comm->doneLock, NULL);
  pthread_cond_init(&comm->doneCond, NULL);
  pthread_mutex_init(&comm->errorLock, NULL);
  gcommResult_t res = mpiComm != MPI_COMM_NULL
                          ? gcommSuccess
                          : gcommBootFromPages(comm, pages, pageRank, rank, nranks);
  if (res == gcommSuccess) res = gcommCommSetup(comm, config);
  if (res == gcommSuccess) res = gcommCommRegister(comm);
  if (res != gcommSuccess) {
    gcommKeepThreadError(comm->lastError);
    commFree(comm);
    return res;
  }
  *out = comm;
  return gcommSuccess;
}

gcommResult_t gcommCommInitMPI(gcommComm_t* comm, MPI_Comm mpiComm, const gcommConfig_t* config) {
  int initialized = 0, finalized = 0;
  MPI_Comm dup;
  if (comm == NULL) return GCOMM_ERROR(NULL, gcommInvalidArgument, -1, "comm is NULL");
  *comm = NULL;
  GCOMM_CHECK(gcommCheckConfig(config));
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized)
    return GCOMM_ERROR(NULL, gcommInvalidUsage, -1, "MPI is not initialised (or is finalised)");
  if (mpiComm == MPI_COMM_NULL)
    return GCOMM_ERROR(NULL, gcommInvalidArgument, -1, "mpiComm is MPI_COMM_NULL");
  int err = MPI_Comm_dup(mpiComm, &dup);
  if (err != MPI_SUCCESS)
    return GCOMM_ERROR(NULL, gcommSystemError, -1, "MPI_Comm_dup failed (MPI error %d)", err);
  return gcommCommCreate(comm, dup, config, NULL, NULL, 0, 0);
}

void gcommInheritConfig(gcommComm_t comm, gcommConfig_t* config) {
  config->proxyMode = comm->params.proxyMode;
  config->nChannels = comm->nChannels;
#ifdef GCOMM_GPU
  config->device = comm->device;
#endif
}

gcommResult_t gcommCommSplit(gcommComm_t comm, int color, int key, gcommComm_t* newcomm,
                             const gcommConfig_t* config) {
  MPI_Comm split;
  GCOMM_CHECK(gcommCheckComm(comm, __func__));
  if (newcomm == NULL) return GCOMM_ERROR(comm, gcommInvalidArgument, -1, "newcomm is NULL");
  *newcomm = NULL;
  if (color < 0 && color != GCOMM_SPLIT_NOCOLOR)
    return GCOMM_ERROR(comm, gcommInvalidArgument, -1,
                       "color %d is negative (use GCOMM_SPLIT_NOCOLOR to join no communicator)",
                       color);
  GCOMM_CHECK(gcommCheckConfig(config));
  if (comm->mpiComm == MPI_COMM_NULL)
    return GCOMM_ERROR(comm, gcommInvalidUsage, -1,
                       "comm was made by gcommCommShrink and has no MPI communicator to split: "
                       "split the communicator it was shrunk from, or shrink this one");
  gcommConfig_t inherited = GCOMM_CONFIG_INITIALIZER;
  if (config == NULL) {
    gcommInheritConfig(comm, &inherited);
    config = &inherited;
  }
  MPI_CHECK(comm,
            MPI_Comm_split(comm->mpiComm, color == GCOMM_SPLIT_NOCOLOR ? MPI_UNDEFINED : color, key,
                           &split));
  if (split == MPI_COMM_NULL) return gcommSuccess;
  return gcommCommCreate(newcomm, split, config, NULL, NULL, 0, 0);
}

gcommResult_t gcommCommAbort(gcommComm_t comm) {
  GCOMM_CHECK(gcommCheckComm(comm, __func__));
  gcommStop(comm, gcommAborted);
  return gcommSuccess;
}

gcommResult_t gcommCommDestroy(gcommComm_t comm) {
  GCOMM_CHECK(gcommCheckComm(comm, __func__));
  /* the group's queued operations point at comm: GroupEnd would post them to freed memory */
  if (__atomic_load_n(&comm->inGroup, __ATOMIC_ACQUIRE))
    return GCOMM_ERROR(comm, gcommInvalidUsage, -1,
                       "a group is open with work on this communicator: call gcommGroupEnd "
                       "first, then destroy it");
  /* unregistered first: of two destroys of one handle, only one goes on */
  if (!gcommCommUnregister(comm)) return gcommCheckComm(comm, __func__);
  gcommResult_t res = gcommSuccess;
#ifdef GCOMM_GPU
  if (comm->device >= 0)
    res = gcommDeviceQuiesce(comm); /* the GPU's work, then every rank's */
  else
#endif
      if (__atomic_load_n(&comm->asyncError, __ATOMIC_ACQUIRE) == gcommSuccess)
    res = gcommHostWait(comm); /* outstanding work finishes first */
  /* a rank still blocked on this one now called something this one never will */
  gcommStatus_t* st = gcommShmStatus(comm, comm->rank);
  if (st != NULL && res == gcommSuccess &&
      __atomic_load_n(&comm->asyncError, __ATOMIC_ACQUIRE) == gcommSuccess)
    st->finished = 1; /* before the code: readers load the code with acquire */
  gcommPublishStop(comm, gcommRemoteError, "gcommCommDestroy was called there");
  commFree(comm);
  return res == gcommAborted ? gcommSuccess : res;
}

gcommResult_t gcommCommGetAsyncError(gcommComm_t comm, gcommResult_t* asyncError) {
  GCOMM_CHECK(gcommCheckComm(comm, __func__));
  if (asyncError == NULL) return GCOMM_ERROR(comm, gcommInvalidArgument, -1, "asyncError is NULL");
  *asyncError = gcommAsyncError(comm, __func__);
  return gcommSuccess;
}

#define DEFINE_QUERY(NAME, ARG, FIELD)                                                    \
  gcommResult_t NAME(const gcommComm_t comm, int* ARG) {                                  \
    GCOMM_CHECK(gcommCheckComm(comm, __func__));                                          \
    if (ARG == NULL) return GCOMM_ERROR(comm, gcommInvalidArgument, -1, #ARG " is NULL"); \
    *ARG = comm->FIELD;                                                                   \
    return gcommSuccess;                                                                  \
  }
DEFINE_QUERY(gcommCommCount, count, nranks)
DEFINE_QUERY(gcommCommUserRank, rank, rank)
DEFINE_QUERY(gcommCommDevice, device, device)

gcommResult_t gcommGroupStart(void) {
  return gcommGroupOpen();
}

gcommResult_t gcommGroupEnd(void) {
  return gcommGroupClose();
}

/* A call of count 0 moves nothing and reads no buffer: one whose every check passes at once
 * (gcommCallReady, the datatype, a built-in op, root and peer ranks of comm: rootless calls pass 0,
 * collectives peer 0) is complete here, a collective taking its sequence number as on every other
 * rank. Any other takes the whole path (enqueueCall), which says what is wrong. */
static inline int doneAtOnce(gcommComm_t comm, gcommStream_t stream, size_t count, int func,
                             gcommDataType_t datatype, gcommRedOp_t op, int root, int peer,
                             const char* where) {
  if (count != 0 || (unsigned)datatype >= gcommNumTypes || (unsigned)op >= gcommNumOps ||
      !gcommCallReady(comm, stream, where) || (unsigned)root >= (unsigned)comm->nranks ||
      (unsigned)peer >= (unsigned)comm->nranks)
    return 0;
  if (!gcommIsPointToPoint(func)) gcommOwnerAdd(&comm->collSeq, 1);
  return 1;
}

/* An all-gather captured into a graph runs straight between the ranks' buffers, not as parts. */
static int directCall(gcommComm_t comm, const gcommOp_t* a, gcommStream_t stream) {
#ifdef GCOMM_GPU
  return comm->device >= 0 && gcommDeviceDirectCall(comm, a, stream);
#else
  (void)comm, (void)a, (void)stream;
  return 0;
#endif
}

/* A data call's operation, checked and enqueued: an AllGather, AllToAll, Gather or Scatter may
 * move as its vector form's parts (gcommByParts) instead of its schedule. Out of line, so that
 * doneAtOnce's path saves no register and builds no record. */
static __attribute__((noinline)) gcommResult_t enqueueCall(
    int func, const void* sendbuff, void* recvbuff, size_t count, gcommDataType_t datatype, int op,
    int root, int peer, gcommComm_t comm, gcommStream_t stream, const char* where) {
  gcommOp_t a = {.func = func,
                 .sendbuff = sendbuff,
                 .recvbuff = recvbuff,
                 .count = count,
                 .datatype = datatype,
                 .redop = op,
                 .root = root,
                 .peer = peer};
  int byParts = func == gcommFuncAllGather || func == gcommFuncAllToAll ||
                func == gcommFuncGather || func == gcommFuncScatter;
  if (!byParts) return gcommEnqueue(comm, &a, stream, where);
  GCOMM_CHECK(gcommEnqueueCheck(comm, stream, where));
  if (gcommByParts(comm, &a) && !directCall(comm, &a, stream))
    return gcommCollParts(comm, &a, stream, where);
  return gcommEnqueueChecked(comm, &a, stream, where);
}

gcommResult_t gcommAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                             gcommDataType_t datatype, gcommRedOp_t op, gcommComm_t comm,
                             gcommStream_t stream) {
  if (doneAtOnce(comm, stream, count, gcommFuncAllReduce, datatype, op, 0, 0, __func__))
    return gcommSuccess;
  return enqueueCall(gcommFuncAllReduce, sendbuff, recvbuff, count, datatype, op, 0, -1, comm,
                     stream, __func__);
}
gcommResult_t gcommBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                             gcommDataType_t datatype, int root, gcommComm_t comm,
                             gcommStream_t stream) {
  if (doneAtOnce(comm, stream, count, gcommFuncBroadcast, datatype, gcommSum, root, 0, __func__))
    return gcommSuccess;
  return enqueueCall(gcommFuncBroadcast, sendbuff, recvbuff, count, datatype, 0, root, -1, comm,
                     stream, __func__);
}
gcommResult_t gcommReduce(const void* sendbuff, void* recvbuff, size_t count,
                          gcommDataType_t datatype, gcommRedOp_t op, int root, gcommComm_t comm,
                          gcommStream_t stream) {
  if (doneAtOnce(comm, stream, count, gcommFuncReduce, datatype, op, root, 0, __func__))
    return gcommSuccess;
  return enqueueCall(gcommFuncReduce, sendbuff, recvbuff, count, datatype, op, root, -1, comm,
                     stream, __func__);
}
gcommResult_t gcommAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                             gcommDataType_t datatype, gcommComm_t comm, gcommStream_t stream) {
  if (doneAtOnce(comm, stream, sendcount, gcommFuncAllGather, datatype, gcommSum, 0, 0, __func__))
    return gcommSuccess;
  return enqueueCall(gcommFuncAllGather, sendbuff, recvbuff, sendcount, datatype, 0, 0, -1, comm,
                     stream, __func__);
}
gcommResult_t gcommReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                 gcommDataType_t datatype, gcommRedOp_t op, gcommComm_t comm,
                                 gcommStream_t stream) {
  if (doneAtOnce(comm, stream, recvcount, gcommFuncReduceScatter, datatype, op, 0, 0, __func__))
    return gcommSuccess;
  return enqueueCall(gcommFuncReduceScatter, sendbuff, recvbuff, recvcount, datatype, op, 0, -1,
                     comm, stream, __func__);
}
gcommResult_t gcommAllToAll(const void* sendbuff, void* recvbuff, size_t count,
                            gcommDataType_t datatype, gcommComm_t comm, gcommStream_t stream) {
  if (doneAtOnce(comm, stream, count, gcommFuncAllToAll, datatype, gcommSum, 0, 0, __func__))
    return gcommSuccess;
  return enqueueCall(gcommFuncAllToAll, sendbuff, recvbuff, count, datatype, 0, 0, -1, comm, stream,
                     __func__);
}
gcommResult_t gcommGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                          gcommDataType_t datatype, int root, gcommComm_t comm,
                          gcommStream_t stream) {
  if (doneAtOnce(comm, stream, sendcount, gcommFuncGather, datatype, gcommSum, root, 0, __func__))
    return gcommSuccess;
  return enqueueCall(gcommFuncGather, sendbuff, recvbuff, sendcount, datatype, 0, root, -1, comm,
                     stream, __func__);
}
gcommResult_t gcommScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                           gcommDataType_t datatype, int root, gcommComm_t comm,
                           gcommStream_t stream) {
  if (doneAtOnce(comm, stream, recvcount, gcommFuncScatter, datatype, gcommSum, root, 0, __func__))
    return gcommSuccess;
  return enqueueCall(gcommFuncScatter, sendbuff, recvbuff, recvcount, datatype, 0, root, -1, comm,
                     stream, __func__);
}
gcommResult_t gcommSend(const void* sendbuff, size_t count, gcommDataType_t datatype, int peer,
                        gcommComm_t comm, gcommStream_t stream) {
  if (doneAtOnce(comm, stream, count, gcommFuncSend, datatype, gcommSum, 0, peer, __func__))
    return gcommSuccess;
  return enqueueCall(gcommFuncSend, sendbuff, NULL, count, datatype, 0, -1, peer, comm, stream,
                     __func__);
}
gcommResult_t gcommRecv(void* recvbuff, size_t count, gcommDataType_t datatype, int peer,
                        gcommComm_t comm, gcommStream_t stream) {
  if (doneAtOnce(comm, stream, count, gcommFuncRecv, datatype, gcommSum, 0, peer, __func__))
    return gcommSuccess;
  return enqueueCall(gcommFuncRecv, NULL, recvbuff, count, datatype, 0, -1, peer, comm, stream,
                     __func__);
}

gcommResult_t gcommRedOpCreatePreMulSum(gcommRedOp_t* op, void* scalar, gcommDataType_t datatype,
                                        gcommScalarResidence_t residence, gcommComm_t comm) {
  GCOMM_CHECK(gcommCheckComm(comm, __func__));
  if (op == NULL) return GCOMM_ERROR(comm, gcommInvalidArgument, -1, "op is NULL");
  if (scalar == NULL) return GCOMM_ERROR(comm, gcommInvalidArgument, -1, "scalar is NULL");
  if ((unsigned)datatype >= gcommNumTypes)
    return GCOMM_ERROR(comm, gcommInvalidArgument, -1,
                       "datatype %d is not a gcommDataType_t (0..%d)", datatype, gcommNumTypes - 1);
  if (residence != gcommScalarDevice && residence != gcommScalarHostImmediate)
    return GCOMM_ERROR(comm, gcommInvalidArgument, -1,
                       "residence %d is neither gcommScalarDevice (0) nor "
                       "gcommScalarHostImmediate (1)",
                       residence);
  const char* bad = gcommBadScalarPointer(comm, scalar, residence);
  if (bad != NULL) return GCOMM_ERROR(comm, gcommInvalidArgument, -1, "scalar %p %s", scalar, bad);
  int slot = 0;
  while (slot < GCOMM_MAX_REDOPS && comm->redOps[slot].used) slot++;
  if (slot == GCOMM_MAX_REDOPS)
    return GCOMM_ERROR(comm, gcommInvalidUsage, -1,
                       "all %d PreMulSum operators of this communicator exist: destroy one first",
                       GCOMM_MAX_REDOPS);
  gcommRedOpSlot_t* r = &comm->redOps[slot];
  memset(r, 0, sizeof(*r));
  r->datatype = datatype;
  if (residence == gcommScalarHostImmediate)
    memcpy(&r->scalar, scalar, gcommTypeSize(datatype));
  else
    r->scalarPtr = scalar;
  r->used = 1;
  *op = (gcommRedOp_t)(gcommNumOps + slot);
  return gcommSuccess;
}

gcommResult_t gcommRedOpDestroy(gcommRedOp_t op, gcommComm_t comm) {
  GCOMM_CHECK(gcommCheckComm(comm, __func__));
  unsigned slot = (unsigned)op - gcommNumOps;
  if ((int)op >= 0 && (int)op < gcommNumOps)
    return GCOMM_ERROR(comm, gcommInvalidArgument, -1,
                       "op %d is a built-in gcommRedOp_t: only PreMulSum operators are destroyed",
                       (int)op);
  if ((int)op < 0 || slot >= GCOMM_MAX_REDOPS || !comm->redOps[slot].used)
    return GCOMM_ERROR(comm, gcommInvalidArgument, -1,
                       "op %d is not a PreMulSum operator of this communicator (never created "
                       "here, or destroyed already)",
                       (int)op);
  comm->redOps[slot].used = 0;
  return gcommSuccess;
}

gcommResult_t gcommProgress(gcommComm_t comm) {
  GCOMM_CHECK(gcommCheckComm(comm, __func__));
  if (comm->params.proxyMode == GCOMM_PROXY_POLL) {
    pthread_mutex_lock(&comm->progressLock);
    gcommProgressPass(comm);
    pthread_mutex_unlock(&comm->progressLock);
  }
  return gcommSuccess;
}

gcommResult_t gcommTest(gcommComm_t comm, gcommStream_t stream) {
  GCOMM_CHECK(gcommCheckComm(comm, __func__));
#ifdef GCOMM_GPU
  if (comm->device >= 0) return gcommDeviceTest(comm, stream, __func__);
#endif
  if (stream != NULL)
    return GCOMM_ERROR(comm, gcommInvalidArgument, -1,
                       "stream must be NULL on a host communicator");
  uint64_t target = __atomic_load_n(&comm->opsPosted, __ATOMIC_ACQUIRE);
  GCOMM_CHECK(gcommProgress(comm));
  if (__atomic_load_n(&comm->abortFlag, __ATOMIC_ACQUIRE) || gcommRevokeSeen(comm))
    return gcommFinalResult(comm, __func__);
  return gcommAllDone(comm, target) ? gcommFinalResult(comm, __func__) : gcommInProgress;
}

/* gcommWait past its first case. */
static __attribute__((noinline)) gcommResult_t waitChecked(gcommComm_t comm, gcommStream_t stream) {
  GCOMM_CHECK(gcommCheckComm(comm, "gcommWait"));
#ifdef GCOMM_GPU
  if (comm->device >= 0) return gcommDeviceWait(comm, stream, "gcommWait");
#endif
  if (stream != NULL)
    return gcommSetError(comm, gcommInvalidArgument, -1, "gcommWait",
                         "stream must be NULL on a host communicator");
  return gcommHostWait(comm);
}

gcommResult_t gcommWait(gcommComm_t comm, gcommStream_t stream) {
  /* gcommHostWait's first case, without a call: the handle this thread last found live, a host
   * communicator not stopped, nothing posted since a settled wait */
  if (gcommLiveAtOnce(comm) && stream == NULL && comm->device < 0 &&
      __atomic_load_n(&comm->opsPosted, __ATOMIC_ACQUIRE) ==
          __atomic_load_n(&comm->opsSettled, __ATOMIC_ACQUIRE) &&
      __atomic_load_n(&comm->asyncError, __ATOMIC_ACQUIRE) == gcommSuccess)
    return gcommSuccess;
  return waitChecked(comm, stream);
}
