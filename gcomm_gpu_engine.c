/*
 * gcomm_gpu_engine.c - the GPU engine: a GPU communicator's device selection, its setup and
 * connection table for the kernels, launches (works ordered by queue, one launch per call or
 * group), the kernels' errors, stream-ordered test and wait, the proxy's view of waiting kernels,
 * abort, quiesce and teardown. Its FIFOs come from transports/p2p.c (CUDA IPC in a node),
 * gcomm_gpu_net.c (staged for the network) and gcomm_gpu_copy.c (copy engines); kernel timestamps
 * from gcomm_gpu_prof.c. The HIP build compiles this same file (gcomm_gpu.h).
 */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gcomm_gpu_engine.h"

gcommResult_t gcommDeviceSelect(gcommComm_t comm, const gcommConfig_t* config) {
  int want = config ? config->device : GCOMM_CONFIG_UNDEF_INT, count = 0;
  comm->device = GCOMM_DEVICE_HOST;
  if (want == GCOMM_DEVICE_HOST) return gcommSuccess;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    if (want == GCOMM_CONFIG_UNDEF_INT) return gcommSuccess; /* no GPU: a host communicator */
    return GCOMM_ERROR(comm, gcommInvalidArgument, -1, "config->device %d: no CUDA device", want);
  }
  if (want == GCOMM_CONFIG_UNDEF_INT) CUDA_CHECK(comm, -1, cudaGetDevice(&want));
  if (want < 0 || want >= count)
    return GCOMM_ERROR(comm, gcommInvalidArgument, -1,
                       "config->device %d is not a CUDA device (0..%d)", want, count - 1);
  comm->device = want;
  CUDA_CHECK(comm, -1,
             cudaDeviceGetAttribute(&comm->deviceSMs, cudaDevAttrMultiProcessorCount, want));
  CUDA_CHECK(comm, -1,
             cudaDeviceGetAttribute(&comm->deviceCcMajor, cudaDevAttrComputeCapabilityMajor, want));
  /* the GPU's PCI address: ranks of a node that share a GPU have the same */
  int domain = 0, bus = 0, dev = 0;
  CUDA_CHECK(comm, -1, cudaDeviceGetAttribute(&domain, cudaDevAttrPciDomainId, want));
  CUDA_CHECK(comm, -1, cudaDeviceGetAttribute(&bus, cudaDevAttrPciBusId, want));
  CUDA_CHECK(comm, -1, cudaDeviceGetAttribute(&dev, cudaDevAttrPciDeviceId, want));
  comm->devicePci = ((uint64_t)domain << 16) | ((uint64_t)bus << 8) | (uint64_t)dev;
  comm->deviceMps = 0;
#ifndef GCOMM_HIP /* ROCm has no MPS: processes sharing a GPU always time-slice it */
  CUDA_CHECK(comm, -1, cudaDeviceGetAttribute(&comm->deviceMps, cudaDevAttrMpsEnabled, want));
#endif
  return gcommSuccess;
}

gcommResult_t gcommDeviceSetup(gcommComm_t comm, gcommCard_t* card) {
  struct gcommDev* d = comm->dev;
  CUDA_CHECK(comm, -1, cudaSetDevice(comm->device));
  /* every kernel's code and stack now, not at its first launch (gcommKernelsLoad says why) */
  size_t stackBytes = 0;
  cudaError_t loaded = (cudaError_t)gcommKernelsLoad(&stackBytes);
  if (loaded != cudaSuccess)
    return GCOMM_ERROR(comm, gcommDeviceError, -1, "loading the kernels failed: %s (%s)",
                       cudaGetErrorName(loaded), cudaGetErrorString(loaded));
  GCOMM_INFO(GCOMM_SUBSYS_INIT, comm,
             "GPU %d: kernels loaded, %zu bytes of stack a thread reserved", comm->device,
             stackBytes);
  d->peerRegion = calloc(comm->nranks, sizeof(char*));
  d->args = malloc(sizeof(gcommDevLaunch_t));
  if (d->peerRegion == NULL || d->args == NULL)
    return GCOMM_ERROR(comm, gcommSystemError, -1, "out of memory");
  GCOMM_CHECK(gcommIpcRegionCreate(comm, card));
  size_t stepBytes = GCOMM_DEV_COUNTERS * sizeof(uint64_t) * comm->nLanes * comm->nranks;
  CUDA_CHECK(comm, -1, cudaMalloc((void**)&d->steps, stepBytes));
  CUDA_CHECK(comm, -1, cudaMemset(d->steps, 0, stepBytes));
  CUDA_CHECK(comm, -1, cudaHostAlloc(&d->hostMapped, 4096, cudaHostAllocMapped));
  memset(d->hostMapped, 0, 4096);
  CUDA_CHECK(comm, -1, cudaDeviceSynchronize());
  GCOMM_INFO(GCOMM_SUBSYS_INIT, comm,
             "GPU %d: FIFO region of %zu bytes in %s (%d local ranks x %d lanes)", comm->device,
             d->regionBytes, d->staged ? "pinned shared host memory" : "GPU memory", comm->nLocal,
             comm->nLanes);
  return gcommSuccess;
}

/* The mapped page d->hostMapped: the abort flag, the kernels' first error, their waiting flag. */
#define HOST_ERROR_OFF 64
#define HOST_WAITING_OFF 192
static volatile int* hostAbort(struct gcommDev* d) {
  return (volatile int*)d->hostMapped;
}
static gcommDevError_t* hostError(struct gcommDev* d) {
  return (gcommDevError_t*)((char*)d->hostMapped + HOST_ERROR_OFF);
}
static volatile int* hostWaiting(struct gcommDev* d) {
  return (volatile int*)((char*)d->hostMapped + HOST_WAITING_OFF);
}

/* Whether a proxy on the progress thread moves some of the kernels' FIFOs: the network's
 * (gcommGpuNetConnect) or the copy engines' (gcommGpuCopyConnect). Their kernels then set the
 * waiting flag, and the thread polls while they run. */
static int proxied(struct gcommDev* d) {
  return d->netFifos != NULL || d->nCe > 0;
}

gcommResult_t gcommDeviceConnect(gcommComm_t comm) {
  struct gcommDev* d = comm->dev;
  int me = comm->rank, n = comm->nranks;
  CUDA_CHECK(comm, -1, cudaSetDevice(comm->device));
  GCOMM_CHECK(gcommIpcOpenPeers(comm));
  size_t nc = (size_t)comm->nLanes * n;
  gcommDevConn_t* hc = calloc(2 * nc, sizeof(gcommDevConn_t));
  if (hc == NULL) return GCOMM_ERROR(comm, gcommSystemError, -1, "out of memory");
  uint64_t* steps = d->steps;
  gcommIpcFillConns(comm, hc, steps);
  gcommResult_t res = gcommGpuProxySetup(comm);
  if (res == gcommSuccess) res = gcommGpuCopyConnect(comm, hc);
#ifndef GCOMM_HIP
  if (res == gcommSuccess && comm->sharedCopy) res = gcommGpuSharedConnect(comm);
  if (res == gcommSuccess) res = gcommGpuDirectConnect(comm);
#endif
#ifdef GCOMM_OFI
  if (res == gcommSuccess && comm->net != NULL) res = gcommGpuNetConnect(comm, hc, steps);
#endif
  if (res != gcommSuccess) {
    free(hc);
    return res;
  }
  cudaError_t e = cudaMalloc((void**)&d->conns, 2 * nc * sizeof(gcommDevConn_t));
  if (e == cudaSuccess)
    e = cudaMemcpy(d->conns, hc, 2 * nc * sizeof(gcommDevConn_t), cudaMemcpyHostToDevice);
  free(hc);
  if (e != cudaSuccess)
    return GCOMM_ERROR(comm, gcommDeviceError, -1, "connection table: %s", cudaGetErrorString(e));
  char* hm = d->hostMapped;
  void *abortDev, *errDev, *waitingDev = NULL;
  CUDA_CHECK(comm, -1, cudaHostGetDevicePointer(&abortDev, hm, 0));
  CUDA_CHECK(comm, -1, cudaHostGetDevicePointer(&errDev, hm + HOST_ERROR_OFF, 0));
  if (proxied(d))
    CUDA_CHECK(comm, -1, cudaHostGetDevicePointer(&waitingDev, hm + HOST_WAITING_OFF, 0));
  d->host.rank = me;
  d->host.nranks = n;
  d->host.nLanes = comm->nLanes;
  d->host.slotBytes = comm->slotBytes;
  d->host.send = d->conns;
  d->host.recv = d->conns + nc;
  d->host.steps = steps;
  d->host.abortFlag = abortDev;
  d->host.error = errDev;
  d->host.waiting = waitingDev;
  d->host.timeoutNs = (unsigned long long)comm->params.timeoutMs * 1000000ull;
  CUDA_CHECK(comm, -1, cudaMalloc((void**)&d->devComm, sizeof(gcommDevComm_t)));
  CUDA_CHECK(comm, -1,
             cudaMemcpy(d->devComm, &d->host, sizeof(gcommDevComm_t), cudaMemcpyHostToDevice));
  return res;
}

/* Records that stream holds this communicator's latest launch on it, for destroy's wait. A launch
 * captured into a graph is not marked: an event recorded in capture cannot be queried after. */
static gcommResult_t markLaunch(gcommComm_t comm, cudaStream_t stream) {
  struct gcommDev* d = comm->dev;
  enum cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  CUDA_CHECK(comm, -1, cudaStreamIsCapturing(stream, &capture));
  if (capture != cudaStreamCaptureStatusNone) return gcommSuccess;
  int i = 0;
  while (i < d->nMarks && d->marks[i].stream != stream) i++;
  if (i == d->nMarks) { /* a new stream: take the mark of one whose work is done, or a new one */
    i = 0;
    while (i < d->nMarks && cudaEventQuery(d->marks[i].done) == cudaErrorNotReady) i++;
    if (i == d->nMarks) {
      launchMark_t* m = realloc(d->marks, (d->nMarks + 1) * sizeof(launchMark_t));
      if (m == NULL) return GCOMM_ERROR(comm, gcommSystemError, -1, "out of memory");
      d->marks = m;
      CUDA_CHECK(comm, -1, cudaEventCreateWithFlags(&m[i].done, cudaEventDisableTiming));
      d->nMarks++;
    }
    d->marks[i].stream = stream;
  }
  CUDA_CHECK(comm, -1, cudaEventRecord(d->marks[i].done, stream));
  __atomic_store_n(&d->lastMark, d->marks[i].done, __ATOMIC_RELEASE);
  return gcommSuccess;
}

/* A launch's blocks run whole warps (AMD: wavefronts of 64). At least 64 threads: one warp
 * waits out each load alone: on 2 H100 with graphs 32 threads were 0.1-0.4 us slower than 64 (8 B
 * all-reduce 4.9 us against 4.6; 128 level with 64). */
#ifdef GCOMM_HIP
#define LAUNCH_WARP 64
#else
#define LAUNCH_WARP 32
#endif
#define LAUNCH_MIN_THREADS 64

/* Threads a block of a small LL launch runs: as many as its largest step has lines (a line a
 * thread), and one for the header lines (a fan step's: one a peer), in whole warps. Every thread
 * runs each step's bookkeeping (the FIFO positions, the step's pointers, two barriers), and a
 * block's warps share the SM's four schedulers: with 512 threads that bookkeeping took ~0.3-0.5 us
 * a step where the data was a line (clock stamps of one block), and 64 threads save 0.3-0.6 us a
 * call (2 H100, nccl-tests with graphs, 8 B: all-reduce 5.1 -> 4.6 us, broadcast 3.2 -> 2.8,
 * send/recv 4.1 -> 3.7; docs/PERF.md). Any other launch: GCOMM_DEV_THREADS. */
static int launchThreads(gcommComm_t comm, const gcommDevLaunch_t* a) {
  if (!comm->smallKernel || a->nWorks > GCOMM_DEV_SMALL_WORKS) return GCOMM_DEV_THREADS;
  size_t lines = 0;
  for (int i = 0; i < a->nWorks; i++) {
    const gcommDevWork_t* w = &a->works[i];
    if (w->proto != gcommProtoLL) return GCOMM_DEV_THREADS;
    size_t count = w->sched.chunk < w->sched.chanCount ? w->sched.chunk : w->sched.chanCount;
    size_t l = gcommDivUp(count * gcommTypeSize(w->datatype), 8) +
               (w->sched.fan ? (size_t)w->sched.nranks - 1 : 1);
    if (l > lines) lines = l;
  }
  size_t threads = gcommDivUp(lines, LAUNCH_WARP) * LAUNCH_WARP;
  if (threads < LAUNCH_MIN_THREADS) threads = LAUNCH_MIN_THREADS;
  return threads < GCOMM_DEV_THREADS ? (int)threads : GCOMM_DEV_THREADS;
}

/* Which launches may start beside the one before them (gcommComm.launchOverlap). Where every
 * launch may, one that reduces still waits for the launch before it to end: 2 H200, nccl-tests
 * with CUDA graphs, overlapped reduce-scatters of 4-16 MB ran 2-4% slower, where broadcast,
 * all-gather, send/recv and all-to-all of 1-4 MB ran 1-10% faster (docs/PERF.md). */
static int launchOverlapOf(gcommComm_t comm, const gcommDevLaunch_t* a) {
  if (comm->launchOverlap != GCOMM_OVERLAP_EVERY) return comm->launchOverlap;
  for (int i = 0; i < a->nWorks; i++)
    if (gcommIsReduction(a->works[i].sched.func)) return GCOMM_OVERLAP_SMALL_LL;
  return GCOMM_OVERLAP_EVERY;
}

static gcommResult_t launchBatch(gcommComm_t comm, gcommDevLaunch_t* a, void* stream) {
  struct gcommDev* d = comm->dev;
  if (a->nWorks == 0) return gcommSuccess;
  a->comm = d->devComm;
  a->hostCopy = d->host;
  a->first[a->nBlocks] = (uint16_t)a->nWorks;
  a->smallKernel = comm->smallKernel;
  a->mediumKernel = comm->mediumKernel;
  a->overlap = launchOverlapOf(comm, a);
  a->nThreads = launchThreads(comm, a);
  a->times =
      d->prof && GCOMM_PROF_ON(comm, gcommProfileKernelCh) ? gcommGpuProfTake(comm, a) : NULL;
  if (proxied(d)) *hostWaiting(d) = 1; /* the proxy is about to be needed */
  int e = gcommKernelLaunch(a, stream);
  if (e != cudaSuccess)
    return GCOMM_ERROR(comm, gcommDeviceError, -1, "kernel launch failed: %s",
                       cudaGetErrorString((cudaError_t)e));
  return markLaunch(comm, (cudaStream_t)stream);
}

/* The works of ops, a queue at a time (posting order inside a queue): one block per queue. A
 * single operation's works are in queue order already; a group's are sorted (stable). */
static gcommResult_t orderWorks(gcommComm_t comm, gcommOp_t* ops, int n, int* nWorks) {
  struct gcommDev* d = comm->dev;
  int total = 0;
  gcommOp_t* op = ops;
  for (int i = 0; i < n && op; i++, op = op->next) total += op->nWorks;
  if (total > d->orderCap) {
    const gcommWork_t** o = realloc(d->order, total * sizeof(*o));
    if (o == NULL) return GCOMM_ERROR(comm, gcommSystemError, -1, "out of memory");
    d->order = o;
    d->orderCap = total;
  }
  int k = 0;
  op = ops;
  for (int i = 0; i < n && op; i++, op = op->next)
    for (int w = 0; w < op->nWorks; w++) {
      const gcommWork_t* wk = &op->works[w];
      int j = k++;
      for (; j > 0 && d->order[j - 1]->queue > wk->queue; j--) d->order[j] = d->order[j - 1];
      d->order[j] = wk;
    }
  *nWorks = total;
  return gcommSuccess;
}

#ifndef GCOMM_HIP
/* Ranks all on one GPU without MPS: no kernel that waits for a peer (gcomm_gpu_shared.c). */
static gcommResult_t runShared(gcommComm_t comm, gcommOp_t* ops, int n, void* stream) {
  WITH_DEVICE(comm, old);
  gcommResult_t res = gcommGpuSharedRun(comm, ops, n, stream);
  if (res == gcommSuccess) res = markLaunch(comm, (cudaStream_t)stream);
  RESTORE_DEVICE(comm, old);
  return res;
}
#endif

/* The n operations from ops in as few launches as their works fit. */
static gcommResult_t launchOps(gcommComm_t comm, gcommOp_t* ops, int n, void* stream) {
  struct gcommDev* d = comm->dev;
  gcommDevLaunch_t* a = d->args;
  int total = 0;
  GCOMM_CHECK(orderWorks(comm, ops, n, &total));
  gcommResult_t res = gcommSuccess;
  WITH_DEVICE(comm, old);
  a->nBlocks = a->nWorks = 0;
  for (int k = 0; k < total && res == gcommSuccess; k++) {
    const gcommWork_t* wk = d->order[k];
    const gcommOp_t* op = wk->op;
    int opened = k > 0 && d->order[k - 1]->queue == wk->queue && a->nWorks > 0;
    if (a->nWorks == GCOMM_DEV_MAX_WORKS || (!opened && a->nBlocks == GCOMM_DEV_MAX_WORKS)) {
      /* too many for one launch: launch what we have; queues stay ordered on the stream */
      if (!d->warnedSplit && (d->warnedSplit = 1))
        GCOMM_WARN(comm,
                   "a group of more than %d works is split into several launches: "
                   "point-to-point inside it may deadlock (said once a communicator)",
                   GCOMM_DEV_MAX_WORKS);
      res = launchBatch(comm, a, stream);
      if (res != gcommSuccess) break;
      a->nBlocks = a->nWorks = 0;
      opened = 0;
    }
    if (!opened) a->first[a->nBlocks++] = (uint16_t)a->nWorks;
    gcommDevWork_t* dw = &a->works[a->nWorks++];
    if (d->prof) gcommGpuProfStage(d->prof, a->nWorks - 1, op->profHandle);
    dw->sched = wk->sched;
    dw->sendbuff = op->sendbuff;
    dw->recvbuff = op->recvbuff;
    dw->nSteps = wk->nSteps;
    dw->datatype = op->datatype;
    dw->redop = op->redop;
    dw->lane = wk->lane;
    dw->proto = op->proto;
    dw->tag = op->tag;
    dw->scalar = op->scalar;
    dw->scalarPtr = op->scalarPtr;
  }
  if (res == gcommSuccess) res = launchBatch(comm, a, stream);
  RESTORE_DEVICE(comm, old);
  return res;
}

/* Whether op runs Simple fan steps, which only the FAN kernel carries (gcomm_kernels.cu). */
static int simpleFans(const gcommOp_t* op) {
  return op->nWorks > 0 && op->proto != gcommProtoLL && op->works[0].sched.fan;
}

#ifdef GCOMM_HIP
int gcommDeviceDirectCall(gcommComm_t comm, const gcommOp_t* op, void* stream) {
  (void)comm, (void)op, (void)stream;
  return 0; /* no direct path: gcomm_gpu_direct.c is CUDA only */
}
#endif

/* A call's operation, or a group's in call order. A group that mixes Simple fan reductions (GPU
 * all-reduce and reduce-scatter of 1-32 MB, gcomm_tuning.c) with other operations runs as one
 * launch per stretch of either kind, in call order: a send of the group whose receive its peer
 * posts only after a later collective of this group then waits for that collective (said once a
 * communicator, at INFO). Where the peer's calls follow the same order, as a group written alike
 * on every rank does, nothing changes. */
gcommResult_t gcommDeviceLaunch(gcommComm_t comm, gcommOp_t* ops, int n, void* stream) {
  struct gcommDev* d = comm->dev;
#ifndef GCOMM_HIP
  if (d->shared != NULL) return runShared(comm, ops, n, stream);
  if (n == 1 && gcommDeviceDirectCall(comm, ops, stream)) {
    int done = 0;
    GCOMM_CHECK(gcommGpuDirectRun(comm, ops, stream, &done));
    if (done) return gcommSuccess;
  }
#endif
  while (n > 0 && ops != NULL) {
    int fans = simpleFans(ops), k = 1;
    gcommOp_t* next = ops->next;
    for (; k < n && next != NULL && simpleFans(next) == fans; k++) next = next->next;
    if (k < n && !d->saidFanSplit && (d->saidFanSplit = 1))
      GCOMM_INFO(GCOMM_SUBSYS_COLL, comm,
                 "a group mixing Simple fan reductions with other operations runs as several "
                 "launches, in call order (said once a communicator)");
    GCOMM_CHECK(launchOps(comm, ops, k, stream));
    ops = next;
    n -= k;
  }
  return gcommSuccess;
}

gcommResult_t gcommDeviceKernelError(gcommComm_t comm, const char* where) {
  gcommDevError_t* e = hostError(comm->dev);
  int code = e->code, stopped = gcommSuccess;
  if (code == 0) return gcommSuccess;
  /* the first error stands: kernels aborted because the network failed report that failure
   * (already recorded, naming the peer), and a kernel error is recorded only once */
  if (!__atomic_compare_exchange_n(&comm->asyncError, &stopped, code, 0, __ATOMIC_ACQ_REL,
                                   __ATOMIC_ACQUIRE))
    return stopped == gcommAborted
               ? gcommSetError(comm, gcommAborted, -1, where, "the communicator was aborted")
               : (gcommResult_t)stopped;
  const char* fn = gcommFuncName(e->func);
  if (code == gcommAborted)
    return gcommSetError(comm, gcommAborted, -1, where, "the communicator was aborted");
  if (code == gcommInvalidUsage) {
    char what[256];
    gcommDescribeMismatch(what, sizeof(what), e->got, e->expected);
    return gcommSetError(comm, gcommInvalidUsage, e->peer, where,
                         "GPU %s channel %d step %ld: rank %d made a different call: %s", fn,
                         e->lane, e->step, e->peer, what);
  }
  const char* what = e->isRecv == GCOMM_DEV_WAIT_MEET ? "meet (graph-captured direct call)"
                     : e->isRecv                      ? "receive from"
                                                      : "send to";
  return gcommSetError(comm, (gcommResult_t)code, e->peer, where,
                       "GPU %s lane %d step %ld: waited more than GCOMM_TIMEOUT_MS=%lld to %s "
                       "rank %d",
                       fn, e->lane, e->step, (long long)comm->params.timeoutMs, what, e->peer);
}

gcommResult_t gcommDeviceTest(gcommComm_t comm, void* stream, const char* where) {
  WITH_DEVICE(comm, old);
  cudaError_t e = cudaStreamQuery((cudaStream_t)stream);
  RESTORE_DEVICE(comm, old);
  if (comm->dev->prof) gcommGpuProfReap(comm, 0);
  gcommResult_t kres = gcommDeviceKernelError(comm, where);
  if (kres != gcommSuccess) return kres;
  gcommResult_t revoked = comm->revokedResult(comm, where);
  if (revoked != gcommSuccess) return revoked;
  if (__atomic_load_n(&comm->abortFlag, __ATOMIC_ACQUIRE))
    return gcommSetError(comm, gcommAborted, -1, where, "the communicator was aborted");
  /* the network failed (recorded by the progress thread, naming the peer; kernels are aborted) */
  int stopped = __atomic_load_n(&comm->asyncError, __ATOMIC_ACQUIRE);
  if (stopped != gcommSuccess) return (gcommResult_t)stopped;
  if (e == cudaErrorNotReady) return gcommInProgress;
  if (e != cudaSuccess)
    return gcommSetError(comm, gcommDeviceError, -1, where, "cudaStreamQuery: %s",
                         cudaGetErrorString(e));
  return gcommSuccess;
}

/* Waits on the GPU (a stream, the kernels' end): 50 us of polling first, naps of at most
 * 200 us. */
static void gpuBackoff(uint64_t* idleSince) {
  (void)gcommBackoff(idleSince, 50, 200);
}

gcommResult_t gcommDeviceWait(gcommComm_t comm, void* stream, const char* where) {
  uint64_t start = gcommNowNs(), probed = start;
  uint64_t deadline = start + (uint64_t)(comm->params.timeoutMs + 1000) * 1000000;
  uint64_t idleSince = 0;
  for (;;) {
    gcommResult_t r = gcommDeviceTest(comm, stream, where);
    if (r != gcommInProgress) return r;
    uint64_t now = gcommNowNs();
    /* as the host executor's probes: a dead local rank ends the wait long before the deadline */
    if (now - start >= 100000000 && now - probed >= 50000000) {
      probed = now;
      r = comm->deadPeerResult(comm, where);
      if (r != gcommSuccess) return r;
    }
    if (now > deadline)
      return gcommSetError(comm, gcommTimeout, -1, where,
                           "the stream's GPU work is not done after GCOMM_TIMEOUT_MS=%lld",
                           (long long)comm->params.timeoutMs);
    gpuBackoff(&idleSince);
  }
}

int gcommDeviceKernelsWaiting(gcommComm_t comm) {
  struct gcommDev* d = comm->dev;
  if (d == NULL || !proxied(d)) return 0;
  /* a launch still queued or running: its kernels will wait on the proxied FIFOs (launches are
   * enqueued far ahead of the GPU: the flag the launch set is long consumed by then) */
  cudaEvent_t last = __atomic_load_n(&d->lastMark, __ATOMIC_ACQUIRE);
  if (last != NULL) {
    /* relaxed: a query from this thread must not invalidate a graph the user captures meanwhile
     * in global mode (as NCCL's proxy threads do) */
    enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&mode);
    WITH_DEVICE(comm, old);
    int running = cudaEventQuery(last) == cudaErrorNotReady;
    RESTORE_DEVICE(comm, old);
    cudaThreadExchangeStreamCaptureMode(&mode);
    if (running) return 1;
  }
  uint64_t now = gcommNowNs();
  if (*hostWaiting(d)) { /* a waiting block sets it every few hundred polls: ~1 ms at most */
    *hostWaiting(d) = 0;
    d->waitSeenNs = now;
  }
  return d->waitSeenNs != 0 && now - d->waitSeenNs < 5000000;
}

void gcommDeviceBindThread(gcommComm_t comm) {
  if (comm->device < 0) return;
  cudaError_t e = gcommGpuProxyBind(comm) ? cudaSuccess : cudaSetDevice(comm->device);
  if (e != cudaSuccess)
    GCOMM_WARN(comm, "progress thread: cudaSetDevice(%d) failed: %s", comm->device,
               cudaGetErrorString(e));
  /* relaxed: the CUDA calls made here (the provider's copies with FI_HMEM) must not fail while
   * the application captures a graph in global mode */
  enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  e = cudaThreadExchangeStreamCaptureMode(&mode);
  if (e != cudaSuccess)
    GCOMM_WARN(comm, "progress thread: cudaThreadExchangeStreamCaptureMode failed: %s",
               cudaGetErrorString(e));
}

void gcommDeviceAbort(gcommComm_t comm) {
  if (comm->dev && comm->dev->hostMapped) {
    *hostAbort(comm->dev) = 1;
    __sync_synchronize();
  }
}

int gcommDeviceBadPointer(gcommComm_t comm, const void* ptr) {
  struct gcommDev* d = comm->dev;
  struct cudaPointerAttributes at;
  if (ptr == NULL) return 0;
  /* Buffers are mostly used again and again, and the query costs a good part of a small
   * operation's host time. Only GPU memory is remembered: its addresses come from the driver's
   * own range, so one that was GPU memory never becomes pageable host memory (pinned host memory,
   * once freed, could). */
  for (int i = 0; i < GPU_POINTERS_KNOWN; i++)
    if (d->knownPointers[i] == ptr) return 0;
  if (cudaPointerGetAttributes(&at, ptr) != cudaSuccess) {
    cudaGetLastError();
    return 1;
  }
  if (gcommGpuPtrDevice(at)) d->knownPointers[d->knownNext++ % GPU_POINTERS_KNOWN] = ptr;
  return gcommGpuPtrUnregistered(at);
}

/* How many of the streams this communicator launched on still run its kernels once they have all
 * ended or the deadline has passed. A failed query counts as ended: the GPU reports the failure
 * to every later call anyway. */
static int waitLaunches(struct gcommDev* d, uint64_t deadline) {
  uint64_t idleSince = 0;
  for (;;) {
    int busy = 0;
    for (int i = 0; i < d->nMarks; i++)
      busy += cudaEventQuery(d->marks[i].done) == cudaErrorNotReady;
    if (busy == 0 || gcommNowNs() > deadline) return busy;
    gpuBackoff(&idleSince);
  }
}

/* MPI_Barrier with a deadline: gcommSuccess, gcommTimeout (the request is left pending: a
 * collective cannot be cancelled, and the communicator's MPI_Comm_free lets it finish), or an MPI
 * failure. */
static gcommResult_t barrierBefore(gcommComm_t comm, uint64_t deadline) {
  if (comm->mpiComm == MPI_COMM_NULL) { /* gcommCommShrink's: its status pages, their deadline */
    char* all = malloc((size_t)comm->nranks);
    gcommResult_t res = all != NULL ? comm->allgather(comm, "", 1, all)
                                    : GCOMM_ERROR(comm, gcommSystemError, -1, "out of memory");
    free(all);
    return res;
  }
  MPI_Request req;
  int done = 0, rc = MPI_Ibarrier(comm->mpiComm, &req);
  uint64_t idleSince = 0;
  while (rc == MPI_SUCCESS) {
    rc = MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS || done) break;
    if (gcommNowNs() > deadline)
      return GCOMM_ERROR(comm, gcommTimeout, -1,
                         "waited GCOMM_TIMEOUT_MS=%lld for every rank to reach gcommCommDestroy "
                         "(MPI_Ibarrier): a peer's kernels may still use this rank's FIFOs, "
                         "which stay allocated",
                         (long long)comm->params.timeoutMs);
    gpuBackoff(&idleSince);
  }
  if (rc != MPI_SUCCESS)
    return GCOMM_ERROR(comm, gcommSystemError, -1,
                       "destroy's barrier failed (MPI error %d): this rank's FIFOs stay allocated",
                       rc);
  return gcommSuccess;
}

gcommResult_t gcommDeviceQuiesce(gcommComm_t comm) {
  struct gcommDev* d = comm->dev;
  int finalized = 1, initialized = 0;
  if (d == NULL) return gcommSuccess;
  /* kernels end by themselves: done, their own deadline passed, or aborted */
  uint64_t timeoutNs = (uint64_t)comm->params.timeoutMs * 1000000;
  int busy = waitLaunches(d, gcommNowNs() + timeoutNs + 1000000000ull);
  if (d->prof) gcommGpuProfReap(comm, 1); /* every launch has ended (or never will: reported now) */
  if (busy > 0) {
    d->keepMemory = 1;
    gcommDeviceAbort(comm); /* a kernel that starts later ends at once */
    return GCOMM_ERROR(comm, gcommTimeout, -1,
                       "GPU %d: this communicator's kernels on %d of the %d streams it launched "
                       "on have not ended within GCOMM_TIMEOUT_MS=%lld + 1 s (queued behind other "
                       "work?); the memory they use stays allocated",
                       comm->device, busy, d->nMarks, (long long)comm->params.timeoutMs);
  }
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized || __atomic_load_n(&comm->abortFlag, __ATOMIC_ACQUIRE) ||
      __atomic_load_n(&comm->asyncError, __ATOMIC_ACQUIRE) != gcommSuccess ||
      hostError(d)->code != 0)
    return gcommSuccess; /* failed: the other ranks may never come */
  gcommResult_t res = barrierBefore(comm, gcommNowNs() + timeoutNs);
  if (res != gcommSuccess) d->keepMemory = 1;
  return res;
}

void gcommDeviceFree(gcommComm_t comm) {
  struct gcommDev* d = comm->dev;
  if (d == NULL) return;
  int old = -1;
  cudaGetDevice(&old);
  if (comm->device >= 0) cudaSetDevice(comm->device);
  for (int i = 0; i < d->nMarks; i++) cudaEventDestroy(d->marks[i].done);
  gcommGpuCopyFree(comm); /* first: its copies write into the peers' regions */
  gcommGpuProxyFree(comm);
  if (!d->keepMemory) { /* else a kernel may still run: leaked, never reused under it */
    gcommIpcClose(comm);
    if (d->steps) cudaFree(d->steps);
    if (d->conns) cudaFree(d->conns);
    if (d->devComm) cudaFree(d->devComm);
    if (d->hostMapped) cudaFreeHost(d->hostMapped);
    if (d->netFifos) cudaFreeHost(d->netFifos); /* after gcommNetFree: no receive lands there */
    if (d->netSlots) cudaFree(d->netSlots);
    if (d->prof) gcommGpuProfFree(d->prof);
  }
#ifndef GCOMM_HIP
  gcommGpuSharedFree(comm); /* keeps its staging too when d->keepMemory */
  gcommGpuDirectFree(comm);
#endif
  if (old >= 0) cudaSetDevice(old);
  free(d->marks);
  free(d->peerRegion);
  free(d->args);
  free(d->order);
  free(d);
  comm->dev = NULL;
}

/* ---- The GPU's FIFOs as a transport of the core (gcommTransport_t) ---- */

/* Some of the kernels' FIFOs are moved by the progress thread's proxy: the network's (ranks on
 * other nodes) or the copy engines'. */
static int gpuProxied(gcommComm_t comm) {
  if (comm->device < 0) return 0;
#ifdef GCOMM_OFI
  if (comm->net != NULL) return 1;
#endif
  return gcommDeviceCopyEngines(comm);
}

static gcommResult_t gpuConnect(gcommComm_t comm) {
#ifdef GCOMM_OFI
  comm->netFence = gcommDeviceNetFence; /* the network waits on the provider's GPU copies */
#endif
  return comm->device >= 0 ? gcommDeviceConnect(comm) : gcommSuccess;
}

/* the copy engines' proxy: staging slots the kernels filled go to the local peers' FIFOs */
static gcommResult_t gpuProgress(gcommComm_t comm, int* moved) {
  if (comm->device < 0 || !gcommDeviceCopyEngines(comm)) return gcommSuccess;
  return gcommDeviceCopyProgress(comm, moved);
}

/* a kernel waits on the copy engines' proxy or the network's: the engine yields, never naps */
static int gpuMustPoll(gcommComm_t comm) {
  return gpuProxied(comm) && gcommDeviceKernelsWaiting(comm);
}

/* the proxied FIFOs move no more: kernels waiting on them stop (the first error stands) */
static void gpuStop(gcommComm_t comm) {
  if (gpuProxied(comm)) gcommDeviceAbort(comm);
}

const gcommTransport_t gcommGpuTransport = {
    .name = "GPU (CUDA IPC, copy engines, network FIFOs)",
    .connect = gpuConnect,
    .connectWhat = "GPU IPC connection",
    .progress = gpuProgress,
    .mustPoll = gpuMustPoll,
    .stop = gpuStop,
    .threadStart =
        gcommDeviceBindThread, /* the provider's copies of GPU memory (FI_HMEM) run there */
    .free = gcommDeviceFree,
};
