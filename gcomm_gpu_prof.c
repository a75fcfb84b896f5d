/*
 * gcomm_gpu_prof.c - the profiler's kernel-channel timestamps. With a plugin, each launch gets a
 * slot of mapped host memory where thread 0 of each block writes %globaltimer at the start and
 * stop of each of its works; once every stop is there (or the GPU is idle), the host converts them
 * to its clock (offset measured once by a ping kernel) and reports one KernelCh event per work.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gcomm_gpu_engine.h"

#define PROF_LAUNCHES 128 /* launches timed at once; more in flight are reported unmeasured */
#define PROF_SLOT_WORDS (2 * GCOMM_DEV_MAX_WORKS)

typedef struct {
  int busy, nWorks;
  uint64_t launchNs; /* host clock just before the launch: no work started earlier */
  void* parent[GCOMM_DEV_MAX_WORKS];
  int lane[GCOMM_DEV_MAX_WORKS];
} profLaunch_t;

struct gcommDevProf {
  uint64_t* hostTimes; /* mapped: [PROF_LAUNCHES][PROF_SLOT_WORDS], then 4 ping flags */
  uint64_t* devTimes;  /* the same, as the device sees it */
  int64_t offsetNs;    /* host CLOCK_MONOTONIC - %globaltimer */
  pthread_mutex_t lock;
  void* parent[GCOMM_DEV_MAX_WORKS]; /* the launch being staged: each work's Coll/P2p handle */
  profLaunch_t launches[PROF_LAUNCHES];
};

/* Host time = GPU time + offset, taken as the middle of the shortest of a few round trips in
 * which the host releases a waiting kernel that then reads its clock. */
static const char* profCalibrate(struct gcommDevProf* p) {
  volatile uint64_t* flags = p->hostTimes + (size_t)PROF_LAUNCHES * PROF_SLOT_WORDS;
  cudaStream_t s;
  cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (e != cudaSuccess) return cudaGetErrorString(e);
  uint64_t best = UINT64_MAX;
  for (int i = 0; i < 3 && e == cudaSuccess; i++) {
    for (int k = 0; k < 4; k++) flags[k] = 0;
    e = (cudaError_t)gcommKernelTimerPing(p->devTimes + (size_t)PROF_LAUNCHES * PROF_SLOT_WORDS, s);
    if (e != cudaSuccess) break;
    uint64_t deadline = gcommNowNs() + 1000000000ull;
    while (flags[0] == 0 && gcommNowNs() < deadline) {
    }
    uint64_t t0 = gcommNowNs();
    flags[1] = 1;
    __sync_synchronize();
    while (flags[3] == 0 && gcommNowNs() < deadline + 1000000000ull) {
    }
    uint64_t t1 = gcommNowNs();
    e = cudaStreamSynchronize(s);
    if (e == cudaSuccess && flags[3] != 0 && t1 - t0 < best) {
      best = t1 - t0;
      p->offsetNs = (int64_t)(t0 + (t1 - t0) / 2) - (int64_t)flags[2];
    }
  }
  cudaStreamDestroy(s);
  if (e != cudaSuccess) return cudaGetErrorString(e);
  return best == UINT64_MAX ? "the clock ping kernel did not answer within 1 s" : NULL;
}

void gcommDeviceProfSetup(gcommComm_t comm) {
  struct gcommDev* d = comm->dev;
  struct gcommDevProf* p = calloc(1, sizeof(*p));
  const char* why = p ? NULL : "out of memory";
  if (p) pthread_mutex_init(&p->lock, NULL);
  size_t bytes = ((size_t)PROF_LAUNCHES * PROF_SLOT_WORDS + 4) * sizeof(uint64_t);
  WITH_DEVICE(comm, old);
  cudaError_t e =
      why ? cudaSuccess : cudaHostAlloc((void**)&p->hostTimes, bytes, cudaHostAllocMapped);
  if (!why && e == cudaSuccess) {
    memset(p->hostTimes, 0, bytes);
    e = cudaHostGetDevicePointer((void**)&p->devTimes, p->hostTimes, 0);
  }
  if (!why) why = e != cudaSuccess ? cudaGetErrorString(e) : profCalibrate(p);
  RESTORE_DEVICE(comm, old);
  if (why != NULL) {
    GCOMM_WARN(comm, "profiler: no kernel timestamps on GPU %d: %s", comm->device, why);
    if (p) gcommGpuProfFree(p);
    return;
  }
  d->prof = p;
  GCOMM_INFO(GCOMM_SUBSYS_PROFILE, comm, "GPU %d: %%globaltimer + %lld ns = host time",
             comm->device, (long long)p->offsetNs);
}

/* The launch being staged: work's parent event. */
void gcommGpuProfStage(struct gcommDevProf* p, int work, void* parent) {
  p->parent[work] = parent;
}

/* A free slot for launch a (its timestamps' device address), or NULL when every slot is taken:
 * its works are then reported at once as unmeasured, so that every work has its event. */
uint64_t* gcommGpuProfTake(gcommComm_t comm, const gcommDevLaunch_t* a) {
  struct gcommDevProf* p = comm->dev->prof;
  gcommGpuProfReap(comm, 0);
  pthread_mutex_lock(&p->lock);
  int i = 0;
  while (i < PROF_LAUNCHES && p->launches[i].busy) i++;
  if (i == PROF_LAUNCHES) {
    pthread_mutex_unlock(&p->lock);
    for (int w = 0; w < a->nWorks; w++)
      gcommProfKernelCh(comm, p->parent[w], a->works[w].lane, 0, 0);
    return NULL;
  }
  profLaunch_t* l = &p->launches[i];
  l->busy = 1;
  l->nWorks = a->nWorks;
  l->launchNs = gcommNowNs();
  for (int w = 0; w < a->nWorks; w++) {
    l->parent[w] = p->parent[w];
    l->lane[w] = a->works[w].lane;
  }
  memset(p->hostTimes + (size_t)i * PROF_SLOT_WORDS, 0, 2 * a->nWorks * sizeof(uint64_t));
  pthread_mutex_unlock(&p->lock);
  return p->devTimes + (size_t)i * PROF_SLOT_WORDS;
}

/* GPU time to host time, inside [from, to] (what the host saw bounds what the clocks' offset
 * may blur); 0 stays 0: never written. */
static uint64_t profHostNs(const struct gcommDevProf* p, uint64_t gpuNs, uint64_t from,
                           uint64_t to) {
  if (gpuNs == 0) return 0;
  int64_t t = (int64_t)gpuNs + p->offsetNs;
  return t < (int64_t)from ? from : t > (int64_t)to ? to : (uint64_t)t;
}

/* Reports the launches whose works have all stopped (all: every launch, the GPU being idle). */
void gcommGpuProfReap(gcommComm_t comm, int all) {
  struct gcommDevProf* p = comm->dev->prof;
  pthread_mutex_lock(&p->lock);
  uint64_t now = gcommNowNs();
  for (int i = 0; i < PROF_LAUNCHES; i++) {
    profLaunch_t* l = &p->launches[i];
    volatile uint64_t* t = p->hostTimes + (size_t)i * PROF_SLOT_WORDS;
    if (!l->busy) continue;
    int done = 1;
    for (int w = 0; w < l->nWorks && done && !all; w++) done = t[2 * w + 1] != 0;
    if (!done) continue;
    __sync_synchronize(); /* the stops before the starts they follow */
    for (int w = 0; w < l->nWorks; w++) {
      uint64_t start = profHostNs(p, t[2 * w], l->launchNs, now);
      uint64_t stop = start ? profHostNs(p, t[2 * w + 1], start, now) : 0;
      gcommProfKernelCh(comm, l->parent[w], l->lane[w], stop ? start : 0, stop);
    }
    l->busy = 0;
  }
  pthread_mutex_unlock(&p->lock);
}

void gcommGpuProfFree(struct gcommDevProf* p) {
  if (p->hostTimes) cudaFreeHost(p->hostTimes);
  pthread_mutex_destroy(&p->lock);
  free(p);
}
