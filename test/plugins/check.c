/*
 * test/plugins/check.c - a profiler plugin for test_profiler.c: records every event it is given
 * (descriptor, parent, start and stop times, states) for the test to check through
 * checkGetLog(). TEST_PROFILER_FAIL_INIT=1 makes init fail.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static checkLog_t logged;
static int capRecs;

static uint64_t nowNs(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

const checkLog_t* checkGetLog(void) {
  return &logged;
}

void checkReset(void) {
  pthread_mutex_lock(&lock);
  for (int i = 0; i < logged.nRecs; i++) free(logged.recs[i]);
  free(logged.recs);
  memset(&logged, 0, sizeof(logged));
  capRecs = 0;
  pthread_mutex_unlock(&lock);
}

static gcommResult_t checkInit(void** context, uint64_t commId, int* eActivationMask,
                               const char* commName, int nNodes, int nRanks, int rank,
                               gcommDebugLogger_t logfn) {
  (void)commId, (void)commName, (void)nNodes, (void)logfn;
  const char* fail = getenv("TEST_PROFILER_FAIL_INIT");
  pthread_mutex_lock(&lock);
  int failing = fail != NULL && fail[0] == '1';
  int id = failing ? -1 : logged.inits++;
  logged.failedInits += failing;
  pthread_mutex_unlock(&lock);
  if (failing || rank < 0 || rank >= nRanks) return gcommInternalError;
  *eActivationMask = gcommProfileAll;
  *context = (void*)(intptr_t)(id + 1); /* never NULL */
  return gcommSuccess;
}

static gcommResult_t checkStartEvent(void* context, void** eHandle,
                                     gcommProfilerEventDescr_v1_t* d) {
  checkRec_t* r = calloc(1, sizeof(*r));
  *eHandle = r;
  if (r == NULL) return gcommSuccess;
  r->context = (int)(intptr_t)context - 1;
  r->d = *d;
  r->startNs = d->type == gcommProfileKernelCh ? d->kernelCh.startNs : nowNs();
  r->parent = d->parentObj ? ((checkRec_t*)d->parentObj)->index : -1;
  pthread_mutex_lock(&lock);
  if (logged.nRecs == capRecs) {
    capRecs = capRecs ? 2 * capRecs : 1024;
    logged.recs = realloc(logged.recs, capRecs * sizeof(checkRec_t*));
  }
  r->index = logged.nRecs;
  logged.recs[logged.nRecs++] = r;
  pthread_mutex_unlock(&lock);
  return gcommSuccess;
}

static gcommResult_t checkStopEvent(void* eHandle) {
  checkRec_t* r = eHandle;
  uint64_t now = r->d.type == gcommProfileKernelCh ? r->d.kernelCh.stopNs : nowNs();
  pthread_mutex_lock(&lock);
  if (r->stopNs != 0) logged.badHandles++; /* stopped twice */
  r->stopNs = now ? now : 1;
  pthread_mutex_unlock(&lock);
  return gcommSuccess;
}

static gcommResult_t checkRecordEventState(void* eHandle, gcommProfilerEventState_v1_t state,
                                           gcommProfilerEventStateArgs_v1_t* args) {
  checkRec_t* r = eHandle;
  pthread_mutex_lock(&lock);
  if (r->stopNs != 0) logged.badHandles++; /* a state after the stop */
  r->nStates++;
  r->lastState = state;
  r->lastStateArg = args == NULL                         ? -1
                    : r->d.type == gcommProfileProxyStep ? args->proxyStep.peer
                                                         : args->proxyCtrl.appendedProxyOps;
  pthread_mutex_unlock(&lock);
  return gcommSuccess;
}

static gcommResult_t checkFinalize(void* context) {
  (void)context;
  pthread_mutex_lock(&lock);
  logged.finalizes++;
  pthread_mutex_unlock(&lock);
  return gcommSuccess;
}

const gcommProfiler_v1_t gcommProfiler_v1 = {
    "check", checkInit, checkStartEvent, checkStopEvent, checkRecordEventState, checkFinalize,
};
