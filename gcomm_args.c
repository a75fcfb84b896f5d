/*
 * gcomm_args.c - argument checks: live communicator handles, the owner thread, configs and every
 * data call's arguments. A bad call says which argument and why, and changes nothing.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "gcomm_core.h"

gcommResult_t gcommCheckConfig(const gcommConfig_t* config) {
  if (config == NULL) return gcommSuccess;
  if (config->magic != GCOMM_CONFIG_MAGIC || config->size != sizeof(gcommConfig_t))
    return GCOMM_ERROR(NULL, gcommInvalidArgument, -1,
                       "config was not initialised with GCOMM_CONFIG_INITIALIZER");
  if (config->proxyMode != GCOMM_CONFIG_UNDEF_INT && config->proxyMode != GCOMM_PROXY_THREAD &&
      config->proxyMode != GCOMM_PROXY_POLL)
    return GCOMM_ERROR(NULL, gcommInvalidArgument, -1,
                       "config->proxyMode %d is neither GCOMM_PROXY_THREAD nor GCOMM_PROXY_POLL",
                       config->proxyMode);
  if (config->nChannels != GCOMM_CONFIG_UNDEF_INT &&
      (config->nChannels < 1 || config->nChannels > GCOMM_MAX_CHANNELS))
    return GCOMM_ERROR(NULL, gcommInvalidArgument, -1, "config->nChannels %d is not in 1..%d",
                       config->nChannels, GCOMM_MAX_CHANNELS);
#ifdef GCOMM_GPU
  if (config->device != GCOMM_CONFIG_UNDEF_INT && config->device < GCOMM_DEVICE_HOST)
    return GCOMM_ERROR(NULL, gcommInvalidArgument, -1,
                       "config->device %d is neither a CUDA device nor GCOMM_DEVICE_HOST",
                       config->device);
#else
  if (config->device != GCOMM_CONFIG_UNDEF_INT && config->device != GCOMM_DEVICE_HOST)
    return GCOMM_ERROR(NULL, gcommInvalidArgument, -1,
                       "config->device %d: this build has no GPU support (build with CUDA=1 or "
                       "HIP=1), use GCOMM_DEVICE_HOST",
                       config->device);
#endif
  return gcommSuccess;
}

/* The live communicators of the process. A handle is checked here, never by reading the memory
 * it points to: after gcommCommDestroy that memory is freed (a magic number in it was no check:
 * the compiler drops a store before free, and reading it is a use after free). A destroyed
 * handle whose address a new communicator reuses passes for the new one. */
static pthread_mutex_t liveLock = PTHREAD_MUTEX_INITIALIZER;
static gcommComm_t* liveComms;
static int nLive, liveCap;
/* Each call checks its handle, so a thread remembers the last handle it found live and the list's
 * generation then (bumped by every unregister): while no communicator has gone since, that handle
 * is still live, without the lock and the search (gcommCheckComm, inline in every caller). */
uint64_t gcommLiveGen; /* atomic */
__thread gcommComm_t gcommLastLive;
__thread uint64_t gcommLastLiveGen;
__thread gcommComm_t gcommLastOwned;
__thread uint64_t gcommLastOwnedGen;

gcommResult_t gcommCommRegister(gcommComm_t comm) {
  pthread_mutex_lock(&liveLock);
  if (nLive == liveCap) {
    int cap = liveCap ? 2 * liveCap : 16;
    gcommComm_t* grown = realloc(liveComms, (size_t)cap * sizeof(*grown));
    if (grown == NULL) {
      pthread_mutex_unlock(&liveLock);
      return GCOMM_ERROR(comm, gcommSystemError, -1, "out of memory");
    }
    liveComms = grown, liveCap = cap;
  }
  liveComms[nLive++] = comm;
  pthread_mutex_unlock(&liveLock);
  return gcommSuccess;
}

int gcommCommUnregister(gcommComm_t comm) {
  int found = 0;
  pthread_mutex_lock(&liveLock);
  for (int i = 0; i < nLive && !found; i++)
    if (liveComms[i] == comm) liveComms[i] = liveComms[--nLive], found = 1;
  __atomic_add_fetch(&gcommLiveGen, 1, __ATOMIC_RELEASE);
  if (nLive == 0) free(liveComms), liveComms = NULL, liveCap = 0; /* nothing left at exit */
  pthread_mutex_unlock(&liveLock);
  return found;
}

int gcommCommIsLive(gcommComm_t comm) {
  if (comm == gcommLastLive && gcommLastLiveGen == __atomic_load_n(&gcommLiveGen, __ATOMIC_ACQUIRE))
    return 1;
  int found = 0;
  pthread_mutex_lock(&liveLock);
  for (int i = 0; i < nLive && !found; i++) found = liveComms[i] == comm;
  if (found)
    gcommLastLive = comm, gcommLastLiveGen = __atomic_load_n(&gcommLiveGen, __ATOMIC_RELAXED);
  pthread_mutex_unlock(&liveLock);
  return found;
}

gcommResult_t gcommCheckCommListed(gcommComm_t comm, const char* where) {
  if (comm == NULL) return gcommSetError(NULL, gcommInvalidArgument, -1, where, "comm is NULL");
  if (!gcommCommIsLive(comm))
    return gcommSetError(NULL, gcommInvalidArgument, -1, where,
                         "comm %p is not a live communicator (destroyed already, or never made)",
                         (void*)comm);
  return gcommSuccess;
}

/* The error that stopped comm: the engine's or, on a GPU communicator, a kernel's as soon as the
 * kernel has recorded it in mapped memory (no CUDA call, no wait for the stream). */
static gcommResult_t stoppedError(gcommComm_t comm, const char* where) {
#ifdef GCOMM_GPU
  if (comm->device >= 0 && __atomic_load_n(&comm->asyncError, __ATOMIC_ACQUIRE) == gcommSuccess)
    gcommDeviceKernelError(comm, where);
#else
  (void)where;
#endif
  return (gcommResult_t)__atomic_load_n(&comm->asyncError, __ATOMIC_ACQUIRE);
}

gcommResult_t gcommAsyncError(gcommComm_t comm, const char* where) {
  gcommRevokeSeen(comm); /* a rank that waits on nobody learns of a revoke at its next call */
  return stoppedError(comm, where);
}

/* A CUDA device pointer on a host communicator. libcuda is only asked if the process has
 * already loaded it: without it there can be no device pointers. */
static int isDevicePointer(const void* ptr) {
  typedef int (*getAttr_t)(void* data, int attribute, unsigned long long ptr);
  static getAttr_t getAttr;
  static int looked;
  if (!__atomic_load_n(&looked, __ATOMIC_ACQUIRE)) {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (lib != NULL) getAttr = (getAttr_t)dlsym(lib, "cuPointerGetAttribute");
    __atomic_store_n(&looked, 1, __ATOMIC_RELEASE);
  }
  unsigned int memType = 0, managed = 0;
  if (getAttr == NULL || ptr == NULL) return 0;
  if (getAttr(&memType, 2 /* CU_POINTER_ATTRIBUTE_MEMORY_TYPE */, (unsigned long long)ptr) != 0)
    return 0;
  getAttr(&managed, 8 /* CU_POINTER_ATTRIBUTE_IS_MANAGED */, (unsigned long long)ptr);
  return memType == 2 /* CU_MEMORYTYPE_DEVICE */ && !managed;
}

/* No buffer is larger than a process's address space (2^57 bytes with 5-level paging): a count
 * beyond it is too large, before it can look like an overlap (or an in-place layout). */
#define MAX_BUFFER_BYTES ((size_t)1 << 57)

/* A reduction's op: a gcommRedOp_t, or a PreMulSum operator of comm for the call's datatype, which
 * becomes GCOMM_OP_PREMULSUM with the operator's scalar (so the operator may be destroyed once the
 * call has returned). */
static gcommResult_t resolveRedOp(gcommComm_t comm, gcommOp_t* op, const char* where) {
  unsigned slot = (unsigned)op->redop - gcommNumOps;
  if ((unsigned)op->redop < gcommNumOps) return gcommSuccess;
  if (op->redop < 0 || slot >= GCOMM_MAX_REDOPS || !comm->redOps[slot].used)
    return gcommSetError(comm, gcommInvalidArgument, -1, where,
                         "op %d is neither a gcommRedOp_t (0..%d) nor a PreMulSum operator of "
                         "this communicator (never created here, or destroyed)",
                         op->redop, gcommNumOps - 1);
  const gcommRedOpSlot_t* r = &comm->redOps[slot];
  if (r->datatype != op->datatype)
    return gcommSetError(comm, gcommInvalidArgument, -1, where,
                         "op %d is a PreMulSum operator for %s, but the call's datatype is %s",
                         op->redop, gcommTypeNames[r->datatype], gcommTypeNames[op->datatype]);
  op->redop = GCOMM_OP_PREMULSUM;
  op->scalar = r->scalar;
  op->scalarPtr = r->scalarPtr;
  return gcommSuccess;
}

gcommResult_t gcommCheckBuffer(gcommComm_t comm, const void* buf, int isSend, size_t count,
                               const char* call, const char* where) {
  const char* name = isSend ? "sendbuff" : "recvbuff";
#define BAD(...) gcommSetError(comm, gcommInvalidArgument, -1, where, __VA_ARGS__)
  if (count == 0) return gcommSuccess;
  if (buf == NULL)
    return BAD("%s is NULL but %s %s %zu elements %s it on rank %d", name, call,
               isSend ? "sends" : "receives", count, isSend ? "from" : "into", comm->rank);
#ifdef GCOMM_GPU
  if (comm->device >= 0) {
    if (gcommDeviceBadPointer(comm, buf))
      return BAD("%s %p is host memory the GPU cannot use (a GPU communicator)", name, buf);
    return gcommSuccess;
  }
#endif
  if (isDevicePointer(buf))
    return BAD("%s %p is GPU memory but this is a host communicator", name, buf);
  return gcommSuccess;
#undef BAD
}

#define BAD(...) gcommSetError(comm, gcommInvalidArgument, -1, where, __VA_ARGS__)
gcommResult_t gcommCheckShape(gcommComm_t comm, gcommOp_t* op, const char* where) {
  int n = comm->nranks;
  if ((unsigned)op->datatype >= gcommNumTypes)
    return BAD("datatype %d is not a gcommDataType_t (0..%d)", op->datatype, gcommNumTypes - 1);
  if (gcommIsReduction(op->func)) GCOMM_CHECK(resolveRedOp(comm, op, where));
  if ((op->func == gcommFuncBroadcast || op->func == gcommFuncReduce ||
       op->func == gcommFuncGather || op->func == gcommFuncScatter) &&
      (op->root < 0 || op->root >= n))
    return BAD("root %d is not a rank of this communicator (0..%d)", op->root, n - 1);
  if (gcommIsPointToPoint(op->func) && (op->peer < 0 || op->peer >= n))
    return BAD("peer %d is not a rank of this communicator (0..%d)", op->peer, n - 1);
  return gcommSuccess;
}

gcommResult_t gcommCheckArgs(gcommComm_t comm, gcommOp_t* op, const char* where) {
  int n = comm->nranks;
  size_t inCount, outCount;
  GCOMM_CHECK(gcommCheckShape(comm, op, where));
  size_t esz = gcommTypeSize(op->datatype);
  if (op->count > SIZE_MAX / 2 / esz / (size_t)n)
    return BAD("count %zu of %s is too large", op->count, gcommTypeNames[op->datatype]);
  gcommBufferCounts(op, comm->rank, n, &inCount, &outCount);
  /* (no overflow: count * n * esz <= SIZE_MAX / 2 above) */
  if ((inCount > outCount ? inCount : outCount) * esz > MAX_BUFFER_BYTES)
    return BAD(
        "count %zu of %s is too large: %s would use %zu bytes of one buffer, more than an "
        "address space holds",
        op->count, gcommTypeNames[op->datatype], gcommFuncNames[op->func],
        (inCount > outCount ? inCount : outCount) * esz);
  GCOMM_CHECK(gcommCheckBuffer(comm, op->sendbuff, 1, inCount, gcommFuncNames[op->func], where));
  GCOMM_CHECK(gcommCheckBuffer(comm, op->recvbuff, 0, outCount, gcommFuncNames[op->func], where));
  if (inCount > 0 && outCount > 0 && !gcommIsInPlace(op, comm->rank, esz)) {
    const char *in = op->sendbuff, *out = op->recvbuff;
    if (in < out + outCount * esz && out < in + inCount * esz)
      return BAD(
          "sendbuff [%p, +%zu B) and recvbuff [%p, +%zu B) overlap and are not the "
          "in-place layout of %s",
          op->sendbuff, inCount * esz, op->recvbuff, outCount * esz, gcommFuncNames[op->func]);
  }
  if (inCount == 0) op->sendbuff = NULL; /* never touched: the schedule reads no such buffer */
  if (outCount == 0) op->recvbuff = NULL;
  if (!gcommIsReduction(op->func)) op->redop = gcommSum;
  return gcommSuccess;
}
#undef BAD

/* Calls from two threads would post in an order that differs from rank to rank, and a call of
 * one thread would meet another thread's call on the other ranks: wrong data reported as
 * success. So a communicator's data calls come from the thread that created it, and a call from
 * any other is refused (it changes nothing; the owner's calls go on). */
static gcommResult_t checkOwner(gcommComm_t comm, const char* where) {
  if (pthread_equal(pthread_self(), comm->owner)) {
    __atomic_store_n(&comm->ownerLastCall, where, __ATOMIC_RELAXED);
    gcommLastOwned = comm, gcommLastOwnedGen = gcommLastLiveGen; /* gcommCheckComm's find */
    return gcommSuccess;
  }
  const char* last = __atomic_load_n(&comm->ownerLastCall, __ATOMIC_RELAXED);
  return gcommSetError(comm, gcommInvalidUsage, -1, where,
                       "called from thread %ld, but communicator \"%s\" belongs to thread %ld, "
                       "which created it (its last call: %s): a communicator's collective and "
                       "point-to-point calls must all come from the thread that created it",
                       (long)syscall(SYS_gettid), comm->name, comm->ownerTid,
                       last ? last : "none yet");
}

/* The error of a call on a communicator that async stopped: the error that stopped it, once (the
 * communicator's last error may already be an earlier call's citation of it, with its tag). */
static gcommResult_t citeStop(gcommComm_t comm, gcommResult_t async, const char* where) {
  static const char stopped[] = "the communicator has stopped on an earlier error: ";
  char first[sizeof(comm->lastError)], tag[64];
  const char *from = comm->lastError, *cited;
  while ((cited = strstr(from, stopped)) != NULL) from = cited + sizeof(stopped) - 1;
  snprintf(first, sizeof(first), "%s", from);
  size_t len = strlen(first),
         tagLen = (size_t)snprintf(tag, sizeof(tag), " [%s]", gcommGetErrorString(async));
  while (len >= tagLen && strcmp(first + len - tagLen, tag) == 0) first[len -= tagLen] = '\0';
  return gcommSetError(comm, async, -1, where, "%s%s", stopped, first);
}

/* The checks of a call on a live communicator of this thread: its stream, and async, the error
 * that stopped it (gcommAsyncError) or success. */
static gcommResult_t checkRunning(gcommComm_t comm, gcommStream_t stream, gcommResult_t async,
                                  const char* where) {
  if (stream != NULL && comm->device < 0)
    return gcommSetError(comm, gcommInvalidArgument, -1, where,
                         "stream must be NULL on a host communicator");
  if (async != gcommSuccess) return citeStop(comm, async, where);
  return gcommSuccess;
}

/* gcommEnqueueCheck, all of it (out of line: a call that is ready at once saves no register). */
static __attribute__((noinline)) gcommResult_t enqueueCheckAll(gcommComm_t comm,
                                                               gcommStream_t stream,
                                                               const char* where) {
  GCOMM_CHECK(gcommCheckComm(comm, where));
  GCOMM_CHECK(checkOwner(comm, where));
  return checkRunning(comm, stream, gcommAsyncError(comm, where), where);
}

/* The checks every call makes before its own arguments'. */
gcommResult_t gcommEnqueueCheck(gcommComm_t comm, gcommStream_t stream, const char* where) {
  return gcommCallReady(comm, stream, where) ? gcommSuccess : enqueueCheckAll(comm, stream, where);
}

gcommResult_t gcommEnqueueCheckHeld(gcommComm_t comm, gcommStream_t stream, const char* where) {
  __atomic_store_n(&comm->ownerLastCall, where, __ATOMIC_RELAXED); /* as checkOwner */
  return checkRunning(comm, stream, stoppedError(comm, where), where);
}

/* Where a scalar of residence can be read: the host now (immediate), the kernels (device
 * residence on a GPU communicator) or the host executor (on a host communicator). */
const char* gcommBadScalarPointer(gcommComm_t comm, const void* scalar, int residence) {
#ifdef GCOMM_GPU
  if (residence == gcommScalarDevice && comm->device >= 0)
    return gcommDeviceBadPointer(comm, scalar)
               ? "is host memory the GPU cannot read (a device-resident scalar)"
               : NULL;
#else
  (void)comm, (void)residence;
#endif
  return isDevicePointer(scalar) ? "is GPU memory, which the host reads (a host-immediate scalar, "
                                   "or any scalar of a host communicator)"
                                 : NULL;
}
