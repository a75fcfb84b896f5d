/*
 * examples/profiler/trace.c - a gcomm profiler plugin (gcomm_profiler.h) that writes a Chrome
 * trace: one JSON file per process, which Perfetto (ui.perfetto.dev) and chrome://tracing open.
 * tools/gcomm_trace.py merges the files of a run into one trace (one process track per rank) and
 * prints a per-collective summary.
 *
 *   make                     builds build/examples/libgcomm-profiler-trace.so
 *   GCOMM_PROFILER_PLUGIN=build/examples/libgcomm-profiler-trace.so \
 *   GCOMM_PROFILER_TRACE=/tmp/trace-%r.json mpiexec -n 4 build/gcomm_perf ...
 *
 * GCOMM_PROFILER_TRACE is the file name pattern: %r becomes the rank (in the first communicator
 * of the process), %p the pid; default gcomm-trace-%r.json. The file holds every communicator
 * of the process (tracks are named after them) and is completed when the process exits (gcomm
 * keeps a plugin loaded); a process that dies leaves it unterminated, which the tool repairs.
 *
 * Every event type is enabled. Events are written as complete ("X") slices when they end, on
 * tracks (threads) where slices nest properly: "ops" for Group/Coll/P2p (a slice per lane, a
 * new lane while one is busy), one track per channel (and per peer and direction for Send/Recv)
 * for ProxyOp with its ProxySteps inside, "gpu ch N" for KernelCh, "proxy" for ProxyCtrl, "net"
 * for Net. A Coll/P2p/Group slice lasts from the call until its last descendant ends (gcomm
 * stops a Coll when it is enqueued, so its own stop is kept in args.enqueue_us); args.exec_us is
 * the time from its first child's start to its end. args.id and args.parent give the event tree.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gcomm_profiler.h"

typedef struct event event_t;
typedef struct context context_t;

struct event {
  event_t *prev, *next; /* the context's live events */
  event_t* parent;
  context_t* ctx;
  uint64_t id, type;
  int refs;      /* itself until stopped, plus children not yet ended, plus children to come */
  int expected;  /* Coll/P2p: children announced (nChannels) that have not started yet */
  int track;     /* index in tracks[] */
  int ownsTrack; /* its lane is free again when it ends (a step shares its ProxyOp's) */
  uint64_t startNs, stopNs, endNs, firstChildNs;
  gcommProfilerEventDescr_v1_t d;
  int state, statePeer; /* the last recorded state (steps: the wait) */
  uint64_t stateNs;
  int appended;
};

struct context {
  char name[64];
  int rank, mask;
  event_t* live; /* events not yet written */
};

typedef struct {
  char name[128]; /* "<comm> <what>", and " (n)" for lanes after the first */
  char key[112];  /* the same without the lane */
  int lane, tid;
  uint64_t busyUntil; /* UINT64_MAX while an event holds it */
} track_t;

/* Process-wide: one file, one lock for everything. */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static FILE* out;
static int outRank, opened;
static uint64_t nextId = 1;
static track_t* tracks;
static int nTracks, capTracks;
static gcommDebugLogger_t logger;

static uint64_t nowNs(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Microseconds with nanosecond digits, exactly (a double would round large timestamps). */
static void fprintUs(FILE* f, uint64_t ns) {
  fprintf(f, "%" PRIu64 ".%03u", ns / 1000, (unsigned)(ns % 1000));
}

static void openTrace(int rank) {
  const char* pattern = getenv("GCOMM_PROFILER_TRACE");
  char path[4096];
  size_t n = 0;
  if (pattern == NULL || pattern[0] == 0) pattern = "gcomm-trace-%r.json";
  for (const char* c = pattern; *c && n < sizeof(path) - 32; c++) {
    if (c[0] == '%' && c[1] == 'r')
      n += snprintf(path + n, sizeof(path) - n, "%d", rank), c++;
    else if (c[0] == '%' && c[1] == 'p')
      n += snprintf(path + n, sizeof(path) - n, "%d", (int)getpid()), c++;
    else
      path[n++] = *c;
  }
  path[n] = 0;
  out = fopen(path, "w");
  if (out == NULL) {
    logger(1, 0, __FILE__, __LINE__, "trace plugin: cannot write %s", path);
    return;
  }
  outRank = rank;
  fprintf(out, "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n");
  fprintf(out,
          "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{\"name\":"
          "\"rank %d\"}},\n{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,"
          "\"args\":{\"sort_index\":%d}}",
          rank, rank, rank, rank);
  logger(2, 0, __FILE__, __LINE__, "trace plugin: writing %s", path);
}

/* At exit: the file ends, whatever communicators are left. */
__attribute__((destructor)) static void closeTrace(void) {
  pthread_mutex_lock(&lock);
  if (out != NULL) {
    fprintf(out, "\n]}\n");
    fclose(out);
    out = NULL;
  }
  free(tracks);
  tracks = NULL;
  pthread_mutex_unlock(&lock);
}

/* A lane of track `key` free at time t (held until released, or until `until`). */
static int takeTrack(const char* comm, const char* what, uint64_t t, uint64_t until) {
  char key[112];
  snprintf(key, sizeof(key), "%s %s", comm, what);
  int lane = 0;
  for (int i = 0; i < nTracks; i++) {
    if (strcmp(tracks[i].key, key) != 0) continue;
    if (tracks[i].busyUntil <= t) {
      tracks[i].busyUntil = until;
      return i;
    }
    lane++;
  }
  if (nTracks == capTracks) {
    int cap = capTracks ? 2 * capTracks : 64;
    track_t* grown = realloc(tracks, cap * sizeof(track_t));
    if (grown == NULL) return -1;
    tracks = grown;
    capTracks = cap;
  }
  track_t* tr = &tracks[nTracks];
  snprintf(tr->key, sizeof(tr->key), "%s", key);
  if (lane == 0)
    snprintf(tr->name, sizeof(tr->name), "%s", key);
  else
    snprintf(tr->name, sizeof(tr->name), "%s (%d)", key, lane + 1);
  tr->lane = lane;
  tr->tid = nTracks + 1;
  tr->busyUntil = until;
  if (out != NULL)
    fprintf(out,
            ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":"
            "\"%s\"}},\n{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,"
            "\"args\":{\"sort_index\":%d}}",
            outRank, tr->tid, tr->name, outRank, tr->tid, tr->tid);
  return nTracks++;
}

/* The track an event goes on, chosen when it starts (steps go inside their ProxyOp). */
static int trackFor(event_t* e) {
  char what[96];
  const gcommProfilerEventDescr_v1_t* d = &e->d;
  switch (e->type) {
    case gcommProfileProxyStep:
      if (e->parent != NULL) return e->parent->track; /* nested inside it */
      snprintf(what, sizeof(what), "steps");
      break;
    case gcommProfileProxyOp:
      if (d->proxyOp.isSend < 0)
        snprintf(what, sizeof(what), "ch %d", d->proxyOp.channelId);
      else
        snprintf(what, sizeof(what), "ch %d %s %d", d->proxyOp.channelId,
                 d->proxyOp.isSend ? "send to" : "recv from", d->proxyOp.peer);
      break;
    case gcommProfileKernelCh: /* times known at once: the lane is busy until its stop */
      snprintf(what, sizeof(what), "gpu ch %d", d->kernelCh.channelId);
      return takeTrack(e->ctx->name, what, d->kernelCh.startNs, d->kernelCh.stopNs);
    case gcommProfileProxyCtrl:
      snprintf(what, sizeof(what), "proxy");
      break;
    case gcommProfileNet:
      snprintf(what, sizeof(what), "net %s %d ch %d", d->net.isSend ? "send to" : "recv from",
               d->net.peer, d->net.channelId);
      break;
    default:
      snprintf(what, sizeof(what), "ops");
  }
  e->ownsTrack = 1;
  return takeTrack(e->ctx->name, what, e->startNs, UINT64_MAX);
}

static const char* eventName(const event_t* e, char* buf, size_t len) {
  switch (e->type) {
    case gcommProfileGroup:
      return "Group";
    case gcommProfileColl:
      return e->d.coll.name;
    case gcommProfileP2p:
      snprintf(buf, len, "%s %s %d", e->d.p2p.name, e->d.p2p.name[0] == 'S' ? "to" : "from",
               e->d.p2p.peer);
      return buf;
    case gcommProfileProxyOp:
      return "ProxyOp";
    case gcommProfileProxyStep:
      snprintf(buf, len, "step %ld", e->d.proxyStep.step);
      return buf;
    case gcommProfileKernelCh:
      return "KernelCh";
    case gcommProfileProxyCtrl:
      return e->state == gcommProfilerProxyCtrlSleep ? "sleep" : "append";
    default:
      return e->d.net.isSend ? "net send" : "net recv";
  }
}

static const char* category(uint64_t type) {
  switch (type) {
    case gcommProfileGroup:
      return "group";
    case gcommProfileColl:
      return "coll";
    case gcommProfileP2p:
      return "p2p";
    case gcommProfileProxyOp:
      return "proxyop";
    case gcommProfileProxyStep:
      return "proxystep";
    case gcommProfileKernelCh:
      return "kernelch";
    case gcommProfileProxyCtrl:
      return "proxyctrl";
    default:
      return "net";
  }
}

static void writeArgs(FILE* f, const event_t* e) {
  const gcommProfilerEventDescr_v1_t* d = &e->d;
  fprintf(f, "\"id\":%" PRIu64 ",\"parent\":%" PRIu64 ",\"comm\":\"%s\",\"rank\":%d", e->id,
          e->parent ? e->parent->id : 0, e->ctx->name, d->rank);
  if (e->type & (gcommProfileGroup | gcommProfileColl | gcommProfileP2p)) {
    fprintf(f, ",\"enqueue_us\":");
    fprintUs(f, e->stopNs - e->startNs);
    fprintf(f, ",\"exec_us\":");
    fprintUs(f, e->firstChildNs ? e->endNs - e->firstChildNs : 0);
  }
  switch (e->type) {
    case gcommProfileColl:
      fprintf(f,
              ",\"seq\":%" PRIu64
              ",\"count\":%zu,\"datatype\":\"%s\",\"bytes\":%zu,\"op\":\"%s\","
              "\"root\":%d,\"algorithm\":\"%s\",\"protocol\":\"%s\",\"nChannels\":%d",
              d->coll.seqNumber, d->coll.count, d->coll.datatype, d->coll.bytes, d->coll.op,
              d->coll.root, d->coll.algorithm, d->coll.protocol, d->coll.nChannels);
      break;
    case gcommProfileP2p:
      fprintf(f, ",\"peer\":%d,\"count\":%zu,\"datatype\":\"%s\",\"bytes\":%zu,\"nChannels\":%d",
              d->p2p.peer, d->p2p.count, d->p2p.datatype, d->p2p.bytes, d->p2p.nChannels);
      break;
    case gcommProfileProxyOp:
      fprintf(f, ",\"channel\":%d,\"peer\":%d,\"nSteps\":%ld,\"chunkSize\":%zu,\"isSend\":%d",
              d->proxyOp.channelId, d->proxyOp.peer, d->proxyOp.nSteps, d->proxyOp.chunkSize,
              d->proxyOp.isSend);
      break;
    case gcommProfileProxyStep:
      fprintf(f, ",\"step\":%ld,\"bytes\":%zu,\"sendPeer\":%d,\"recvPeer\":%d", d->proxyStep.step,
              d->proxyStep.bytes, d->proxyStep.sendPeer, d->proxyStep.recvPeer);
      if (e->state) {
        fprintf(f, ",\"waited\":\"%s %d\",\"wait_us\":",
                e->state == gcommProfilerProxyStepRecvWait ? "recv from" : "send to", e->statePeer);
        fprintUs(f, e->stopNs - e->stateNs);
      }
      break;
    case gcommProfileKernelCh:
      fprintf(f, ",\"channel\":%d", d->kernelCh.channelId);
      break;
    case gcommProfileProxyCtrl:
      if (e->state != gcommProfilerProxyCtrlSleep) fprintf(f, ",\"appended\":%d", e->appended);
      break;
    case gcommProfileNet:
      fprintf(f, ",\"peer\":%d,\"channel\":%d,\"step\":%" PRIu64 ",\"bytes\":%zu", d->net.peer,
              d->net.channelId, d->net.step, d->net.bytes);
      break;
  }
}

static void writeEvent(const event_t* e) {
  char buf[64];
  if (out == NULL || e->track < 0) return;
  if (e->type == gcommProfileKernelCh && e->d.kernelCh.startNs == 0) return; /* unmeasured */
  fprintf(out, ",\n{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":",
          eventName(e, buf, sizeof(buf)), category(e->type), outRank, tracks[e->track].tid);
  fprintUs(out, e->startNs);
  fprintf(out, ",\"dur\":");
  fprintUs(out, e->endNs - e->startNs);
  fprintf(out, ",\"args\":{");
  writeArgs(out, e);
  fprintf(out, "}}");
}

static void unlink_(event_t* e) {
  if (e->prev)
    e->prev->next = e->next;
  else
    e->ctx->live = e->next;
  if (e->next) e->next->prev = e->prev;
}

/* Drops one reference; at zero the event is written and its parent loses one in turn. */
static void release(event_t* e) {
  while (e != NULL && --e->refs == 0) {
    event_t* parent = e->parent;
    if (e->stopNs > e->endNs) e->endNs = e->stopNs;
    writeEvent(e);
    if (e->ownsTrack && e->track >= 0) tracks[e->track].busyUntil = e->endNs;
    if (parent != NULL) {
      if (e->endNs > parent->endNs) parent->endNs = e->endNs;
      if (parent->firstChildNs == 0 || e->startNs < parent->firstChildNs)
        parent->firstChildNs = e->startNs;
    }
    unlink_(e);
    free(e);
    e = parent;
  }
}

static gcommResult_t traceInit(void** context, uint64_t commId, int* eActivationMask,
                               const char* commName, int nNodes, int nRanks, int rank,
                               gcommDebugLogger_t logfn) {
  (void)commId, (void)nNodes, (void)nRanks;
  context_t* ctx = calloc(1, sizeof(*ctx));
  if (ctx == NULL) return gcommSystemError;
  snprintf(ctx->name, sizeof(ctx->name), "%s", commName ? commName : "comm");
  for (char* c = ctx->name; *c; c++) /* it goes into JSON strings as is */
    if (*c == '"' || *c == '\\' || (unsigned char)*c < 0x20) *c = '_';
  ctx->rank = rank;
  ctx->mask = gcommProfileAll;
  pthread_mutex_lock(&lock);
  logger = logfn;
  if (!opened) openTrace(rank); /* at the first communicator of the process */
  opened = 1;
  pthread_mutex_unlock(&lock);
  *eActivationMask = ctx->mask;
  *context = ctx;
  return gcommSuccess;
}

static gcommResult_t traceStartEvent(void* context, void** eHandle,
                                     gcommProfilerEventDescr_v1_t* d) {
  context_t* ctx = context;
  event_t* e = calloc(1, sizeof(*e));
  *eHandle = e;
  if (e == NULL) return gcommSuccess; /* no event: gcomm goes on */
  e->ctx = ctx;
  e->type = d->type;
  e->d = *d;
  e->parent = d->parentObj;
  e->refs = 1;
  if (d->type == gcommProfileColl || d->type == gcommProfileP2p)
    e->expected = ctx->mask & (gcommProfileProxyOp | gcommProfileKernelCh)
                      ? (d->type == gcommProfileColl ? d->coll.nChannels : d->p2p.nChannels)
                      : 0;
  e->refs += e->expected;
  e->startNs = d->type == gcommProfileKernelCh ? d->kernelCh.startNs : nowNs();
  pthread_mutex_lock(&lock);
  e->id = nextId++;
  e->next = ctx->live;
  if (ctx->live) ctx->live->prev = e;
  ctx->live = e;
  if (e->parent != NULL) {
    if (e->parent->expected > 0)
      e->parent->expected--; /* one of the children it was announced with */
    else
      e->parent->refs++;
  }
  e->track = trackFor(e);
  pthread_mutex_unlock(&lock);
  return gcommSuccess;
}

static gcommResult_t traceStopEvent(void* eHandle) {
  event_t* e = eHandle;
  uint64_t now = e->type == gcommProfileKernelCh ? e->d.kernelCh.stopNs : nowNs();
  pthread_mutex_lock(&lock);
  e->stopNs = now;
  release(e);
  pthread_mutex_unlock(&lock);
  return gcommSuccess;
}

static gcommResult_t traceRecordEventState(void* eHandle, gcommProfilerEventState_v1_t state,
                                           gcommProfilerEventStateArgs_v1_t* args) {
  event_t* e = eHandle;
  uint64_t now = nowNs();
  pthread_mutex_lock(&lock);
  if (e->type == gcommProfileProxyStep) {
    e->state = state;
    e->statePeer = args ? args->proxyStep.peer : -1;
    e->stateNs = now;
  } else if (state == gcommProfilerProxyCtrlSleep || state == gcommProfilerProxyCtrlAppend) {
    e->state = state;
  } else if (state == gcommProfilerProxyCtrlAppendEnd && args != NULL) {
    e->appended = args->proxyCtrl.appendedProxyOps;
  }
  pthread_mutex_unlock(&lock);
  return gcommSuccess;
}

/* Events still live belong to a communicator that failed: dropped, not written. */
static gcommResult_t traceFinalize(void* context) {
  context_t* ctx = context;
  pthread_mutex_lock(&lock);
  while (ctx->live != NULL) {
    event_t* e = ctx->live;
    ctx->live = e->next;
    free(e);
  }
  pthread_mutex_unlock(&lock);
  free(ctx);
  return gcommSuccess;
}

const gcommProfiler_v1_t gcommProfiler_v1 = {
    "trace", traceInit, traceStartEvent, traceStopEvent, traceRecordEventState, traceFinalize,
};
