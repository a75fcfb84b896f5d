/*
 * test_profiler.c - the profiler plugin interface (gcomm_profiler.h) on host communicators.
 *
 * With the recording plugin of test/plugins/check.c (next to this program, in plugins/): every
 * collective and a grouped Send/Recv, in thread and poll mode; the events' fields, their tree
 * (Group -> Coll/P2p -> ProxyOp -> ProxyStep), counts (a ProxyOp per channel, a ProxyStep per
 * step), times (children start after their parents, steps inside their ProxyOp and one after
 * another), that every event stops exactly once, and init/finalize pairs. Then the failures that
 * must leave profiling off without harm: an init that fails, a missing path, a short name with no
 * library, a library without the symbol (each warns on stderr, which the test captures).
 */
#include <dlfcn.h>
#include <fcntl.h>
#include <libgen.h>

#include "plugins/check.h"
#include "testlib.h"

static char pluginPath[4096];
static checkGetLog_t getLog;
static checkReset_t resetLog;

enum { NCOLLS = 8 };
static const char* const collNames[NCOLLS] = {"AllReduce",     "Broadcast", "Reduce", "AllGather",
                                              "ReduceScatter", "AllToAll",  "Gather", "Scatter"};

/* Every collective (not in place, float32, count elements per rank), then Send to the next rank
 * and Recv from the previous one in a group. */
static void runOps(gcommComm_t comm, size_t count, size_t pcount, float* send, float* recv,
                   float* precv) {
  int n = tlNranks, root = n - 1;
  for (size_t i = 0; i < n * count || i < pcount; i++) send[i] = (float)(tlRank + 1);
  TL_OK(comm, gcommAllReduce(send, recv, count, gcommFloat32, gcommSum, comm, NULL));
  TL_OK(comm, gcommWait(comm, NULL));
  for (size_t i = 0; i < count; i++)
    if (recv[i] != (float)(n * (n + 1) / 2)) {
      tlFail("AllReduce element %zu: %g, not %d", i, recv[i], n * (n + 1) / 2);
      break;
    }
  TL_OK(comm, gcommBroadcast(send, recv, count, gcommFloat32, root, comm, NULL));
  TL_OK(comm, gcommReduce(send, recv, count, gcommFloat32, gcommSum, root, comm, NULL));
  TL_OK(comm, gcommAllGather(send, recv, count, gcommFloat32, comm, NULL));
  TL_OK(comm, gcommReduceScatter(send, recv, count, gcommFloat32, gcommSum, comm, NULL));
  TL_OK(comm, gcommAllToAll(send, recv, count, gcommFloat32, comm, NULL));
  TL_OK(comm, gcommGather(send, recv, count, gcommFloat32, root, comm, NULL));
  TL_OK(comm, gcommScatter(send, recv, count, gcommFloat32, root, comm, NULL));
  TL_OK(comm, gcommGroupStart());
  TL_OK(comm, gcommSend(send, pcount, gcommFloat32, (tlRank + 1) % n, comm, NULL));
  TL_OK(comm, gcommRecv(precv, pcount, gcommFloat32, (tlRank + n - 1) % n, comm, NULL));
  TL_OK(comm, gcommGroupEnd());
  TL_OK(comm, gcommWait(comm, NULL));
}

static const char* typeName(uint64_t t) {
  switch (t) {
    case gcommProfileGroup:
      return "Group";
    case gcommProfileColl:
      return "Coll";
    case gcommProfileP2p:
      return "P2p";
    case gcommProfileProxyOp:
      return "ProxyOp";
    case gcommProfileProxyStep:
      return "ProxyStep";
    case gcommProfileProxyCtrl:
      return "ProxyCtrl";
    default:
      return "other";
  }
}

/* The parent type each type must have (0: none). */
static int parentOk(uint64_t type, const checkRec_t* p) {
  uint64_t pt = p ? p->d.type : 0;
  switch (type) {
    case gcommProfileColl:
    case gcommProfileP2p:
      return pt == 0 || pt == gcommProfileGroup;
    case gcommProfileProxyOp:
      return pt == gcommProfileColl || pt == gcommProfileP2p;
    case gcommProfileProxyStep:
      return pt == gcommProfileProxyOp;
    default:
      return pt == 0;
  }
}

/* A ProxyOp: its steps are its children, numbered 0..nSteps-1 in order, inside its time span and
 * one after another. Returns the bytes they moved. */
static size_t checkProxyOp(const checkLog_t* L, const checkRec_t* o) {
  long next = 0;
  size_t bytes = 0;
  uint64_t lastStop = o->startNs;
  for (int i = o->index + 1; i < L->nRecs; i++) {
    const checkRec_t* s = L->recs[i];
    if (s->parent != o->index) continue;
    if (s->d.proxyStep.step != next)
      return tlFail("ProxyOp %d: step %ld where %ld was next", o->index, s->d.proxyStep.step, next),
             0;
    if (s->startNs < lastStop || s->stopNs > o->stopNs)
      return tlFail(
                 "ProxyOp %d: step %ld [%llu, %llu] is not after the previous step and inside "
                 "its ProxyOp [%llu, %llu]",
                 o->index, next, (unsigned long long)s->startNs, (unsigned long long)s->stopNs,
                 (unsigned long long)o->startNs, (unsigned long long)o->stopNs),
             0;
    if (s->d.proxyStep.sendPeer < -1 || s->d.proxyStep.sendPeer >= tlNranks ||
        s->d.proxyStep.recvPeer < -1 || s->d.proxyStep.recvPeer >= tlNranks)
      return tlFail("ProxyOp %d step %ld: peers %d/%d", o->index, next, s->d.proxyStep.sendPeer,
                    s->d.proxyStep.recvPeer),
             0;
    if (s->nStates > 0 && s->lastState != gcommProfilerProxyStepSendWait &&
        s->lastState != gcommProfilerProxyStepRecvWait)
      return tlFail("ProxyOp %d step %ld: state %d", o->index, next, s->lastState), 0;
    lastStop = s->stopNs;
    bytes += s->d.proxyStep.bytes;
    next++;
  }
  if (next != o->d.proxyOp.nSteps)
    tlFail("ProxyOp %d: %ld step events for nSteps %ld", o->index, next, o->d.proxyOp.nSteps);
  return bytes;
}

/* Everything recorded for one runOps on a fresh communicator. */
static void checkLog(const checkLog_t* L, size_t count, size_t pcount) {
  int n = tlNranks, nColl = 0, nP2p = 0, nGroup = 0, group = -1, posted = 0, appended = 0;
  if (L->inits != 1 || L->finalizes != 1 || L->failedInits != 0)
    return tlFail("%d inits, %d finalizes, %d failed inits: expected 1, 1, 0", L->inits,
                  L->finalizes, L->failedInits);
  if (L->badHandles) return tlFail("%d stops or states after a stop", L->badHandles);
  int* children = calloc(L->nRecs, sizeof(int));
  for (int i = 0; i < L->nRecs; i++) {
    const checkRec_t* r = L->recs[i];
    const checkRec_t* p = r->parent >= 0 ? L->recs[r->parent] : NULL;
    if (r->stopNs == 0) tlFail("%s event %d was never stopped", typeName(r->d.type), i);
    if (r->d.rank != tlRank) tlFail("event %d: rank %d", i, r->d.rank);
    if (!parentOk(r->d.type, p))
      tlFail("%s event %d has a %s parent", typeName(r->d.type), i, p ? typeName(p->d.type) : "no");
    if (p != NULL && r->startNs < p->startNs) tlFail("event %d starts before its parent", i);
    if (p != NULL) children[r->parent]++;
    if (r->d.type == gcommProfileGroup) nGroup++, group = i;
    if (r->d.type == gcommProfileProxyCtrl && r->lastState == gcommProfilerProxyCtrlAppendEnd)
      appended += r->lastStateArg;
  }
  for (int i = 0; i < L->nRecs; i++) {
    const checkRec_t* r = L->recs[i];
    if (r->d.type == gcommProfileColl) {
      int k = nColl++, rooted = k == 1 || k == 2 || k == 6 || k == 7;
      int reduces = k == 0 || k == 2 || k == 4;
      size_t bytes = count * sizeof(float) * (k >= 3 ? (size_t)n : 1);
      if (k >= NCOLLS || strcmp(r->d.coll.name, collNames[k]) != 0 ||
          r->d.coll.seqNumber != (uint64_t)k || r->d.coll.count != count ||
          strcmp(r->d.coll.datatype, "float32") != 0 || r->d.coll.bytes != bytes ||
          strcmp(r->d.coll.op, reduces ? "sum" : "none") != 0 ||
          r->d.coll.root != (rooted ? n - 1 : -1) || strcmp(r->d.coll.protocol, "simple") != 0 ||
          r->parent != -1)
        tlFail(
            "Coll event %d (call %d, %s): %s seq %llu count %zu %s bytes %zu op %s root %d "
            "protocol %s parent %d",
            i, k, k < NCOLLS ? collNames[k] : "?", r->d.coll.name,
            (unsigned long long)r->d.coll.seqNumber, r->d.coll.count, r->d.coll.datatype,
            r->d.coll.bytes, r->d.coll.op, r->d.coll.root, r->d.coll.protocol, r->parent);
      if (strcmp(r->d.coll.algorithm, "ring") && strcmp(r->d.coll.algorithm, "tree") &&
          strcmp(r->d.coll.algorithm, "direct") && strcmp(r->d.coll.algorithm, "twoshot") &&
          strcmp(r->d.coll.algorithm, "recdbl"))
        tlFail("Coll event %d: algorithm %s", i, r->d.coll.algorithm);
      if (children[i] != r->d.coll.nChannels)
        tlFail("%s: %d ProxyOp events for nChannels %d", r->d.coll.name, children[i],
               r->d.coll.nChannels);
      if (n > 1 && r->d.coll.nChannels < 1) tlFail("%s: no channel", r->d.coll.name);
      posted += r->d.coll.nChannels > 0;
    } else if (r->d.type == gcommProfileP2p) {
      int isSend = nP2p++ == 0, peer = isSend ? (tlRank + 1) % n : (tlRank + n - 1) % n;
      if (strcmp(r->d.p2p.name, isSend ? "Send" : "Recv") != 0 || r->d.p2p.peer != peer ||
          r->d.p2p.count != pcount || r->d.p2p.bytes != pcount * sizeof(float) ||
          r->parent != group || group < 0)
        tlFail(
            "P2p event %d: %s peer %d count %zu bytes %zu parent %d (expected %s peer %d "
            "count %zu, parent the Group %d)",
            i, r->d.p2p.name, r->d.p2p.peer, r->d.p2p.count, r->d.p2p.bytes, r->parent,
            isSend ? "Send" : "Recv", peer, pcount, group);
      if (children[i] != r->d.p2p.nChannels || r->d.p2p.nChannels < 1)
        tlFail("%s: %d ProxyOp events for nChannels %d", r->d.p2p.name, children[i],
               r->d.p2p.nChannels);
      posted++;
      size_t moved = 0;
      for (int j = i + 1; j < L->nRecs; j++) {
        const checkRec_t* o = L->recs[j];
        if (o->parent != i) continue;
        if (o->d.proxyOp.peer != peer || o->d.proxyOp.isSend != isSend)
          tlFail("ProxyOp %d of %s: peer %d isSend %d", j, r->d.p2p.name, o->d.proxyOp.peer,
                 o->d.proxyOp.isSend);
        moved += checkProxyOp(L, o);
      }
      if (moved != r->d.p2p.bytes)
        tlFail("%s: its steps moved %zu bytes of %zu", r->d.p2p.name, moved, r->d.p2p.bytes);
    } else if (r->d.type == gcommProfileProxyOp) {
      const checkRec_t* p = r->parent >= 0 ? L->recs[r->parent] : NULL;
      if (p != NULL && p->d.type == gcommProfileColl) {
        if (r->d.proxyOp.peer != -1 || r->d.proxyOp.isSend != -1 || r->d.proxyOp.channelId < 0)
          tlFail("ProxyOp %d of %s: peer %d isSend %d channel %d", i, p->d.coll.name,
                 r->d.proxyOp.peer, r->d.proxyOp.isSend, r->d.proxyOp.channelId);
        checkProxyOp(L, r);
      }
    } else if (r->d.type == gcommProfileGroup) {
      for (int j = i + 1; j < L->nRecs; j++)
        if (L->recs[j]->parent == i && L->recs[j]->stopNs > r->stopNs)
          tlFail("%s event %d stops after its Group", typeName(L->recs[j]->d.type), j);
    }
  }
  if (nColl != NCOLLS || nP2p != 2 || nGroup != 1)
    tlFail("%d Coll, %d P2p and %d Group events: expected %d, 2 and 1", nColl, nP2p, nGroup,
           NCOLLS);
  if (appended != posted)
    tlFail("ProxyCtrl appends fetched %d operations, %d were posted", appended, posted);
  free(children);
}

/* Runs init with fd 2 sent to a file; returns what gcomm wrote there (to free). */
static char* initCapturingStderr(gcommComm_t* comm, const char* env) {
  char path[] = "/tmp/gcomm-test-profiler-XXXXXX";
  int fd = mkstemp(path), saved = dup(2);
  fflush(stderr);
  dup2(fd, 2);
  *comm = tlCommInitEnv(MPI_COMM_WORLD, env, -1);
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  char* text = calloc(1, 65536);
  lseek(fd, 0, SEEK_SET);
  ssize_t got = read(fd, text, 65535);
  text[got > 0 ? got : 0] = 0;
  close(fd);
  unlink(path);
  return text;
}

/* A plugin that cannot be used: init works, a warning naming `expect`, operations correct. */
static void checkOff(const char* env, const char* expect, const char* what) {
  gcommComm_t comm;
  int before = getLog()->nRecs;
  char* text = initCapturingStderr(&comm, env);
  if (expect && (strstr(text, "GCOMM WARN") == NULL || strstr(text, expect) == NULL))
    tlFail("no warning naming \"%s\" (stderr: %.300s)", expect, text);
  if (!expect && text[0] != 0) tlFail("unexpected output: %.300s", text);
  free(text);
  if (comm != NULL) {
    float x = (float)tlRank, y = -1;
    TL_OK(comm, gcommAllReduce(&x, &y, 1, gcommFloat32, gcommSum, comm, NULL));
    TL_OK(comm, gcommWait(comm, NULL));
    if (y != (float)(tlNranks * (tlNranks - 1) / 2)) tlFail("AllReduce: %g", y);
    tlCommDestroy(comm);
  }
  if (getLog()->nRecs != before) tlFail("%d events recorded", getLog()->nRecs - before);
  tlReport("profiler off: %s", what);
}

int main(int argc, char** argv) {
  tlInit(&argc, &argv);
  char self[4096];
  snprintf(self, sizeof(self), "%s", argv[0]);
  snprintf(pluginPath, sizeof(pluginPath), "%s/plugins/libgcomm-profiler-check.so", dirname(self));
  void* lib = dlopen(pluginPath, RTLD_NOW | RTLD_LOCAL); /* the same copy gcomm opens */
  getLog = lib ? (checkGetLog_t)dlsym(lib, CHECK_GET_LOG) : NULL;
  resetLog = lib ? (checkReset_t)dlsym(lib, CHECK_RESET) : NULL;
  if (!getLog || !resetLog) {
    tlFail("cannot load %s: %s", pluginPath, dlerror());
    tlReport("profiler: the test plugin loads");
    return tlFinish("test_profiler");
  }

  size_t count = 20000, pcount = 30011; /* 2 channels of several 8 KB steps each */
  size_t elems = tlNranks * count > pcount ? tlNranks * count : pcount; /* the Send reads pcount */
  float* send = malloc(elems * sizeof(float));
  float* recv = malloc(elems * sizeof(float));
  float* precv = malloc(pcount * sizeof(float));
  char env[4200];
  snprintf(env, sizeof(env), "GCOMM_PROFILER_PLUGIN=%s GCOMM_BUFFSIZE=64K GCOMM_NCHANNELS=2",
           pluginPath);
  for (int mode = GCOMM_PROXY_THREAD; mode <= GCOMM_PROXY_POLL; mode++) {
    resetLog();
    gcommComm_t comm = tlCommInitEnv(MPI_COMM_WORLD, env, mode);
    if (comm != NULL) {
      runOps(comm, count, pcount, send, recv, precv);
      tlCommDestroy(comm);
      checkLog(getLog(), count, pcount);
    }
    tlReport("profiler events: every collective and a grouped Send/Recv, %s mode",
             mode == GCOMM_PROXY_THREAD ? "thread" : "poll");
  }
  free(send);
  free(recv);
  free(precv);

  resetLog();
  char failEnv[4300];
  snprintf(failEnv, sizeof(failEnv), "%s TEST_PROFILER_FAIL_INIT=1", env);
  checkOff(failEnv, "init failed", "a plugin whose init fails");
  if (getLog()->failedInits != 1 || getLog()->finalizes != 0)
    tlFail("%d failed inits, %d finalizes", getLog()->failedInits, getLog()->finalizes);
  tlReport("profiler off: a failed init is not finalized");
  checkOff("GCOMM_PROFILER_PLUGIN=/nonexistent/libgcomm-profiler-x.so",
           "/nonexistent/libgcomm-profiler-x.so", "a missing path");
  checkOff("GCOMM_PROFILER_PLUGIN=nosuchname", "libgcomm-profiler-nosuchname.so",
           "a short name with no library");
  checkOff("GCOMM_PROFILER_PLUGIN=libm.so.6", "no gcommProfiler_v1 symbol",
           "a library without the symbol");
  checkOff("GCOMM_PROFILER_PLUGIN=none", NULL, "none");
  resetLog();
  dlclose(lib);
  return tlFinish("test_profiler");
}
