/*
 * gcomm_profiler.c - the profiler plugin (GCOMM_PROFILER_PLUGIN, gcomm_profiler.h): loading it,
 * and the hooks' bodies. Every hook sits behind GCOMM_PROF_ON or a non-NULL handle: with no
 * plugin, one branch.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gcomm_core.h"

#define PROF_OP 1   /* gcommWork_t.profStarted: its ProxyOp event was started */
#define PROF_STEP 2 /* ... and its current step's ProxyStep event */

/* The plugin's logger: its messages go where gcomm's go, under the PROFILE subsystem. */
static void profLog(int level, unsigned long flags, const char* file, int line, const char* fmt,
                    ...) {
  (void)flags;
  level = level < GCOMM_LOG_WARN    ? GCOMM_LOG_WARN
          : level > GCOMM_LOG_TRACE ? GCOMM_LOG_TRACE
                                    : level;
  if (!gcommLogEnabled(level, GCOMM_SUBSYS_PROFILE)) return;
  char msg[1024], where[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  snprintf(where, sizeof(where), "profiler plugin %s:%d", file ? file : "?", line);
  gcommLogWrite(level, NULL, where, msg);
}

/* A path (with a '/') as given; else libgcomm-profiler-NAME.so, then NAME as a library name.
 * On failure err holds the loader's message for the first candidate. RTLD_NODELETE: a plugin's
 * process-wide state (an open trace file) outlives the communicators that loaded it. */
static void* profOpen(const char* name, char* err, size_t errLen) {
  char shortName[PATH_MAX];
  void* lib;
  if (strchr(name, '/') == NULL) {
    snprintf(shortName, sizeof(shortName), "libgcomm-profiler-%s.so", name);
    if ((lib = dlopen(shortName, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE)) != NULL) return lib;
    snprintf(err, errLen, "%s", dlerror());
    return dlopen(name, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  }
  if ((lib = dlopen(name, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE)) == NULL)
    snprintf(err, errLen, "%s", dlerror());
  return lib;
}

void gcommProfInit(gcommComm_t comm) {
  const char* name = comm->params.profilerPlugin;
  if (name == NULL || strcmp(name, "none") == 0) return;
  char err[512] = "";
  void* lib = profOpen(name, err, sizeof(err));
  if (lib == NULL) {
    GCOMM_WARN(comm, "GCOMM_PROFILER_PLUGIN=%s: cannot load it (%s); profiling is off", name, err);
    return;
  }
  const gcommProfiler_v1_t* api = dlsym(lib, GCOMM_PROFILER_SYMBOL);
  if (api == NULL || !api->init || !api->startEvent || !api->stopEvent || !api->recordEventState ||
      !api->finalize) {
    GCOMM_WARN(comm,
               "GCOMM_PROFILER_PLUGIN=%s: no %s symbol with every function set (is it a gcomm "
               "profiler plugin?); profiling is off",
               name, GCOMM_PROFILER_SYMBOL);
    dlclose(lib);
    return;
  }
  /* an id every rank computes alike: rank 0's segment name is unique on its host */
  uint64_t commId =
      gcommHashString(comm->cards[0].host) ^ (gcommHashString(comm->cards[0].shmName) << 1);
  int nNodes = 0;
  for (int p = 0; p < comm->nranks; p++) nNodes += comm->cards[p].hostId == (uint64_t)p;
  comm->prof.api = api;
  gcommResult_t res = api->init(&comm->prof.context, commId, &comm->prof.mask, comm->name, nNodes,
                                comm->nranks, comm->rank, profLog);
  if (res != gcommSuccess) {
    GCOMM_WARN(comm, "GCOMM_PROFILER_PLUGIN=%s: the plugin's init failed (%s); profiling is off",
               name, gcommGetErrorString(res));
    __atomic_store_n(&comm->prof.mask, 0, __ATOMIC_RELAXED);
    comm->prof.api = NULL;
    comm->prof.context = NULL;
    dlclose(lib);
    return;
  }
  comm->prof.lib = lib;
  GCOMM_INFO(GCOMM_SUBSYS_INIT | GCOMM_SUBSYS_PROFILE, comm,
             "profiler plugin \"%s\" (%s) loaded, event mask 0x%x", api->name ? api->name : "?",
             name, comm->prof.mask);
}

void gcommProfFinalize(gcommComm_t comm) {
  if (comm->prof.api == NULL) return;
  __atomic_store_n(&comm->prof.mask, 0, __ATOMIC_RELAXED);
  comm->prof.api->finalize(comm->prof.context);
  dlclose(comm->prof.lib);
  memset(&comm->prof, 0, sizeof(comm->prof));
}

static void* profStart(gcommComm_t comm, gcommProfilerEventDescr_v1_t* d, uint64_t type,
                       void* parent) {
  void* handle = NULL;
  d->type = type;
  d->parentObj = parent;
  d->rank = comm->rank;
  comm->prof.api->startEvent(comm->prof.context, &handle, d);
  return handle;
}

void gcommProfStop(gcommComm_t comm, void* handle) {
  comm->prof.api->stopEvent(handle);
}

void gcommProfOpEnqueued(gcommComm_t comm, gcommOp_t* op, int inGroup) {
  gcommProfilerEventDescr_v1_t d;
  int mask = __atomic_load_n(&comm->prof.mask, __ATOMIC_RELAXED);
  int isP2p = gcommIsPointToPoint(op->func);
  memset(&d, 0, sizeof(d));
  if (inGroup && comm->profGroup == NULL && (mask & gcommProfileGroup))
    comm->profGroup = profStart(comm, &d, gcommProfileGroup, NULL);
  if (!(mask & (isP2p ? gcommProfileP2p : gcommProfileColl))) return;
  size_t esz = gcommTypeSize(op->datatype);
  size_t bytes = op->count * esz * (op->func >= gcommFuncAllGather && !isP2p ? comm->nranks : 1);
  if (isP2p) {
    d.p2p.name = gcommFuncNames[op->func];
    d.p2p.peer = op->peer;
    d.p2p.count = op->count;
    d.p2p.datatype = gcommTypeNames[op->datatype];
    d.p2p.bytes = bytes;
    d.p2p.nChannels = op->nWorks;
    d.p2p.buff = op->func == gcommFuncSend ? op->sendbuff : op->recvbuff;
  } else {
    d.coll.name = gcommFuncNames[op->func];
    d.coll.seqNumber = op->seq;
    d.coll.count = op->count;
    d.coll.datatype = gcommTypeNames[op->datatype];
    d.coll.bytes = bytes;
    d.coll.op = gcommIsReduction(op->func) ? gcommOpNames[op->redop] : "none";
    d.coll.root = op->func == gcommFuncBroadcast || op->func == gcommFuncReduce ||
                          op->func == gcommFuncGather || op->func == gcommFuncScatter
                      ? op->root
                      : -1;
    d.coll.algorithm = gcommAlgoNames[op->algo];
    d.coll.protocol = gcommProtoNames[op->proto];
    d.coll.nChannels = op->nWorks;
    d.coll.sendBuff = op->sendbuff;
    d.coll.recvBuff = op->recvbuff;
  }
  /* as NCCL's: the event ends once enqueued; the works' events (children) follow */
  op->profHandle = profStart(comm, &d, isP2p ? gcommProfileP2p : gcommProfileColl, comm->profGroup);
  if (op->profHandle != NULL) gcommProfStop(comm, op->profHandle);
}

void gcommProfGroupEnd(gcommComm_t comm) {
  gcommProfStop(comm, comm->profGroup);
  comm->profGroup = NULL;
}

void gcommProfStepBegin(gcommComm_t comm, gcommWork_t* w, const gcommStep_t* st) {
  gcommProfilerEventDescr_v1_t d;
  int mask = __atomic_load_n(&comm->prof.mask, __ATOMIC_RELAXED);
  const gcommOp_t* op = w->op;
  size_t esz = gcommTypeSize(op->datatype);
  if (!(w->profStarted & PROF_OP) && (mask & gcommProfileProxyOp)) {
    memset(&d, 0, sizeof(d));
    d.proxyOp.channelId = w->lane;
    d.proxyOp.peer = op->func >= gcommFuncSend ? op->peer : -1;
    d.proxyOp.nSteps = w->nSteps;
    d.proxyOp.chunkSize = w->sched.chunk * esz;
    d.proxyOp.isSend = op->func == gcommFuncSend ? 1 : op->func == gcommFuncRecv ? 0 : -1;
    w->profOp = profStart(comm, &d, gcommProfileProxyOp, op->profHandle);
    w->profStarted |= PROF_OP;
  }
  if (!(w->profStarted & PROF_STEP) && (mask & gcommProfileProxyStep)) {
    memset(&d, 0, sizeof(d));
    d.proxyStep.step = w->step;
    d.proxyStep.bytes = st->count * esz;
    d.proxyStep.sendPeer = st->sendPeer[0];
    d.proxyStep.recvPeer = st->recvPeer[0];
    w->profStep = profStart(comm, &d, gcommProfileProxyStep, w->profOp);
    w->profStarted |= PROF_STEP;
  }
}

void gcommProfStepWait(gcommComm_t comm, gcommWork_t* w, int peer, int isRecv) {
  gcommProfilerEventStateArgs_v1_t args;
  args.proxyStep.peer = peer;
  comm->prof.api->recordEventState(
      w->profStep, isRecv ? gcommProfilerProxyStepRecvWait : gcommProfilerProxyStepSendWait, &args);
}

void gcommProfWorkStepEnd(gcommComm_t comm, gcommWork_t* w, int workOver) {
  if (w->profStep != NULL) gcommProfStop(comm, w->profStep);
  w->profStep = NULL;
  w->profStarted &= ~PROF_STEP;
  if (!workOver) return;
  if (w->profOp != NULL) gcommProfStop(comm, w->profOp);
  w->profOp = NULL;
  w->profStarted = 0;
}

void* gcommProfCtrlStart(gcommComm_t comm, gcommProfilerEventState_v1_t state) {
  gcommProfilerEventDescr_v1_t d;
  memset(&d, 0, sizeof(d));
  void* handle = profStart(comm, &d, gcommProfileProxyCtrl, NULL);
  if (handle != NULL) comm->prof.api->recordEventState(handle, state, NULL);
  return handle;
}

void gcommProfCtrlStop(gcommComm_t comm, void* handle, gcommProfilerEventState_v1_t state,
                       int appended) {
  gcommProfilerEventStateArgs_v1_t args;
  args.proxyCtrl.appendedProxyOps = appended;
  comm->prof.api->recordEventState(handle, state, &args);
  gcommProfStop(comm, handle);
}

void gcommProfKernelCh(gcommComm_t comm, void* parent, int channel, uint64_t startNs,
                       uint64_t stopNs) {
  gcommProfilerEventDescr_v1_t d;
  if (!GCOMM_PROF_ON(comm, gcommProfileKernelCh)) return;
  memset(&d, 0, sizeof(d));
  d.kernelCh.channelId = channel;
  d.kernelCh.startNs = startNs;
  d.kernelCh.stopNs = stopNs;
  void* handle = profStart(comm, &d, gcommProfileKernelCh, parent);
  if (handle != NULL) gcommProfStop(comm, handle);
}

void* gcommProfNetStart(gcommComm_t comm, int peer, int channel, uint64_t step, size_t bytes,
                        int isSend) {
  gcommProfilerEventDescr_v1_t d;
  memset(&d, 0, sizeof(d));
  d.net.peer = peer;
  d.net.channelId = channel;
  d.net.step = step;
  d.net.bytes = bytes;
  d.net.isSend = isSend;
  return profStart(comm, &d, gcommProfileNet, NULL);
}
