/*
 * gpu_share_pingpong.cu - what it costs two processes on one GPU, without MPS, to hand work to
 * each other: the evidence behind the copy path of gcomm_gpu_shared.c (GCOMM_SHARED_GPU=copy).
 *
 * Without MPS each process has its own CUDA context and the GPU time-slices between them. A
 * collective over ranks sharing the GPU is a chain of hand-offs: one process's work, then the
 * other's, ordered by an interprocess event or by the host. This program times a ping-pong (A's
 * work, B's work after it, A's next after B's: one round trip) for each way of ordering them, with
 * a one-thread kernel or an 8-byte cudaMemcpyAsync as the work:
 *
 *   gpuwait    the host enqueues at once; the stream waits on the peer's interprocess event
 *              (cudaStreamWaitEvent: a semaphore acquire in the GPU's front end), as gcomm does;
 *   query      the host sees the peer's enqueue flag, polls cudaEventQuery on the peer's event,
 *              then enqueues: no stream ever waits for the other process;
 *   evsync     the host enqueues, cudaEventSynchronize (spinning) on its own event, then flags;
 *   evblock    the same with a cudaEventBlockingSync event (the host sleeps);
 *   strsync    the same with cudaStreamSynchronize;
 *   gpuflag    the work's last kernel writes a flag in host-mapped shared memory; the peer's host
 *              polls it with plain loads and then enqueues;
 *   latewait   gpuflag, and the stream also waits on the peer's event, already complete;
 * and for a 2-process all-reduce of 8 bytes done by one process (it maps the other's input and
 * output through CUDA IPC and writes both outputs):
 *   alone      one process, kernel + cudaStreamSynchronize, the other process idle;
 *   lead-flag  the follower says "input ready" from its host and waits for the leader's kernel
 *              to write a host-mapped flag: the follower's context never runs;
 *   lead-wait  the follower records its event (input ready) and its stream waits on the
 *              leader's event: its context runs twice an operation.
 *
 * Build: nvcc -O2 -arch=sm_90 -o gpu_share_pingpong tools/gpu_share_pingpong.cu
 * Run: ./gpu_share_pingpong [rounds]   (MPS off: echo quit | nvidia-cuda-mps-control)
 * Prints one line per scheme: microseconds a round trip (or an operation), best and median of 5.
 *
 * One H200 (driver 580), 1000 round trips, median us, kernel / copy8: gpuwait 285 / 285, query
 * 293 / 295, evsync 293 / 293, evblock 358 / 355, strsync 291 / 292, gpuflag 289 / 294, latewait
 * 285 / 288; an 8-byte all-reduce: alone 8.3, lead-flag 7.4, lead-wait 282. A round trip is two
 * switches of the GPU between the contexts, ~140 us each, whether a stream waits in the GPU's
 * front end or no stream waits at all (the host orders the work): the switch itself costs it, not
 * a semaphore wait holding the slice. Only a call that one context runs alone is fast.
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define NSCHEMES 32
#define REPS 5
#define DEADLINE_NS 20000000000ull /* every host wait: 20 s, then the program fails */

typedef struct {
  cudaIpcMemHandle_t mem[2];
  cudaIpcEventHandle_t event[2];
  unsigned long long arrive;                 /* the barrier */
  unsigned long long enq[NSCHEMES][REPS][2]; /* set by the host when it enqueued a round */
  unsigned long long gpu[NSCHEMES][REPS][2]; /* set by the GPU (host-mapped) when a round ended */
  double result[NSCHEMES][REPS];
} shared_t;

typedef struct {
  int me, rounds;
  shared_t* sh;
  shared_t* shDev; /* the same page as the GPU addresses it */
  cudaStream_t stream;
  cudaEvent_t own, peer, local, blocking;
  float* buf[2]; /* 64 bytes of each process's GPU memory: [0..1] input, [8..9] output */
} ctx_t;

#define CK(x) check((x), #x, __LINE__)
static void check(cudaError_t e, const char* what, int line) {
  if (e == cudaSuccess) return;
  fprintf(stderr, "FAIL line %d: %s: %s\n", line, what, cudaGetErrorString(e));
  exit(1);
}

static uint64_t nowNs(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static unsigned long long load(volatile unsigned long long* p) {
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}
static void store(unsigned long long* p, unsigned long long v) {
  __atomic_store_n(p, v, __ATOMIC_RELEASE);
}

static void waitAtLeast(volatile unsigned long long* p, unsigned long long v, const char* what) {
  uint64_t t0 = nowNs();
  while (load(p) < v)
    if (nowNs() - t0 > DEADLINE_NS) {
      fprintf(stderr, "FAIL waiting for %s >= %llu (is %llu)\n", what, v, load(p));
      exit(1);
    }
}

static void barrier(shared_t* sh, unsigned long long* gen) {
  __atomic_add_fetch(&sh->arrive, 1, __ATOMIC_ACQ_REL);
  waitAtLeast(&sh->arrive, 2 * ++*gen, "the barrier");
}

/* ---- the GPU work ---- */

/* The work of one round: two floats bumped; then, if flag, the host-mapped flag set to v. */
__global__ void bump(float* x, unsigned long long* flag, unsigned long long v) {
  x[0] += 1.0f, x[1] += 1.0f;
  if (flag != NULL) {
    __threadfence_system();
    *(volatile unsigned long long*)flag = v;
  }
}

/* A 2-rank all-reduce of 2 floats by one process: both inputs in, both outputs out. */
__global__ void reduce2(const float* a, const float* b, float* oa, float* ob,
                        unsigned long long* flag, unsigned long long v) {
  int i = threadIdx.x;
  if (i < 2) oa[i] = ob[i] = a[i] + b[i];
  __syncthreads();
  if (i == 0 && flag != NULL) {
    __threadfence_system();
    *(volatile unsigned long long*)flag = v;
  }
}

static void work(ctx_t* c, int useCopy, unsigned long long* flag, unsigned long long v) {
  if (useCopy) {
    CK(cudaMemcpyAsync(c->buf[c->me] + 8, c->buf[c->me], 8, cudaMemcpyDeviceToDevice, c->stream));
    if (flag != NULL) bump<<<1, 1, 0, c->stream>>>(c->buf[c->me] + 4, flag, v);
  } else {
    bump<<<1, 1, 0, c->stream>>>(c->buf[c->me], flag, v);
  }
  CK(cudaGetLastError());
}

/* ---- the ping-pong schemes: one round trip is A's work, then B's ---- */

enum { GPUWAIT, QUERY, EVSYNC, EVBLOCK, STRSYNC, GPUFLAG, LATEWAIT };
static const char* schemeName[] = {"gpuwait", "query",   "evsync",  "evblock",
                                   "strsync", "gpuflag", "latewait"};

/* Waits (host or stream) until the peer's round r is done or ordered, per the scheme. */
static void awaitPeer(ctx_t* c, int scheme, unsigned long long* enq, unsigned long long* gpu,
                      unsigned long long r) {
  int p = 1 - c->me;
  switch (scheme) {
    case GPUWAIT:
      waitAtLeast(&enq[p], r, "the peer's enqueue");
      CK(cudaStreamWaitEvent(c->stream, c->peer, 0));
      break;
    case QUERY:
      waitAtLeast(&enq[p], r, "the peer's enqueue");
      for (uint64_t t0 = nowNs(); cudaEventQuery(c->peer) != cudaSuccess;)
        if (nowNs() - t0 > DEADLINE_NS) check(cudaErrorNotReady, "cudaEventQuery(peer)", __LINE__);
      break;
    case EVSYNC:
    case EVBLOCK:
    case STRSYNC:
      waitAtLeast(&enq[p], r, "the peer's completion");
      break;
    default: /* GPUFLAG, LATEWAIT */
      waitAtLeast(&gpu[p], r, "the peer's GPU flag");
      if (scheme == LATEWAIT) CK(cudaStreamWaitEvent(c->stream, c->peer, 0));
  }
}

/* This process's round r: the work, then whatever tells the peer. */
static void doRound(ctx_t* c, int scheme, int useCopy, unsigned long long* enq,
                    unsigned long long* gpuDev, unsigned long long r) {
  int gpuFlag = scheme == GPUFLAG || scheme == LATEWAIT;
  work(c, useCopy, gpuFlag ? &gpuDev[c->me] : NULL, r);
  if (scheme == GPUWAIT || scheme == QUERY || scheme == LATEWAIT)
    CK(cudaEventRecord(c->own, c->stream));
  if (scheme == EVSYNC) {
    CK(cudaEventRecord(c->local, c->stream));
    CK(cudaEventSynchronize(c->local));
  } else if (scheme == EVBLOCK) {
    CK(cudaEventRecord(c->blocking, c->stream));
    CK(cudaEventSynchronize(c->blocking));
  } else if (scheme == STRSYNC) {
    CK(cudaStreamSynchronize(c->stream));
  }
  store(&enq[c->me], r);
}

static double pingPong(ctx_t* c, int slot, int rep, int scheme, int useCopy) {
  unsigned long long* enq = c->sh->enq[slot][rep];
  unsigned long long* gpu = c->sh->gpu[slot][rep];
  unsigned long long* gpuDev = c->shDev->gpu[slot][rep];
  uint64_t t0 = nowNs();
  for (unsigned long long r = 1; r <= (unsigned long long)c->rounds; r++) {
    if (c->me == 1 || r > 1) awaitPeer(c, scheme, enq, gpu, c->me == 1 ? r : r - 1);
    doRound(c, scheme, useCopy, enq, gpuDev, r);
  }
  if (c->me == 0) awaitPeer(c, scheme, enq, gpu, c->rounds);
  CK(cudaStreamSynchronize(c->stream));
  return (double)(nowNs() - t0) / 1000.0 / c->rounds;
}

/* ---- one process does the 2-rank all-reduce ---- */

enum { ALONE, LEADFLAG, LEADWAIT };
static const char* leadName[] = {"alone", "lead-flag", "lead-wait"};

static void leadRound(ctx_t* c, int scheme, unsigned long long* enq, unsigned long long* gpuDev,
                      unsigned long long r) {
  float *a = c->buf[0], *b = c->buf[1];
  if (scheme == ALONE) {
    reduce2<<<1, 32, 0, c->stream>>>(a, b, a + 8, b + 8, NULL, 0);
    CK(cudaStreamSynchronize(c->stream));
    return;
  }
  waitAtLeast(&enq[1], r, "the follower's input");
  if (scheme == LEADWAIT) CK(cudaStreamWaitEvent(c->stream, c->peer, 0));
  reduce2<<<1, 32, 0, c->stream>>>(a, b, a + 8, b + 8, scheme == LEADFLAG ? &gpuDev[0] : NULL, r);
  CK(cudaGetLastError());
  if (scheme == LEADWAIT) CK(cudaEventRecord(c->own, c->stream));
  store(&enq[0], r);
}

static void followRound(ctx_t* c, int scheme, unsigned long long* enq, unsigned long long* gpu,
                        unsigned long long r) {
  if (scheme == ALONE) return;
  if (scheme == LEADWAIT) CK(cudaEventRecord(c->own, c->stream));
  store(&enq[1], r);
  if (scheme == LEADFLAG) {
    waitAtLeast(&gpu[0], r, "the leader's GPU flag");
    return;
  }
  waitAtLeast(&enq[0], r, "the leader's enqueue");
  CK(cudaStreamWaitEvent(c->stream, c->peer, 0));
}

static double leader(ctx_t* c, int slot, int rep, int scheme) {
  unsigned long long* enq = c->sh->enq[slot][rep];
  uint64_t t0 = nowNs();
  for (unsigned long long r = 1; r <= (unsigned long long)c->rounds; r++) {
    if (c->me == 0)
      leadRound(c, scheme, enq, c->shDev->gpu[slot][rep], r);
    else
      followRound(c, scheme, enq, c->sh->gpu[slot][rep], r);
  }
  CK(cudaStreamSynchronize(c->stream));
  return (double)(nowNs() - t0) / 1000.0 / c->rounds;
}

/* ---- setup, the table ---- */

static void setup(ctx_t* c) {
  shared_t* sh = c->sh;
  CK(cudaSetDevice(0));
  CK(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
  CK(cudaMalloc((void**)&c->buf[c->me], 256));
  CK(cudaMemset(c->buf[c->me], 0, 256));
  CK(cudaDeviceSynchronize());
  CK(cudaIpcGetMemHandle(&sh->mem[c->me], c->buf[c->me]));
  CK(cudaEventCreateWithFlags(&c->own, cudaEventInterprocess | cudaEventDisableTiming));
  CK(cudaIpcGetEventHandle(&sh->event[c->me], c->own));
  CK(cudaEventCreateWithFlags(&c->local, cudaEventDisableTiming));
  CK(cudaEventCreateWithFlags(&c->blocking, cudaEventDisableTiming | cudaEventBlockingSync));
  size_t bytes = (sizeof(shared_t) + 4095) / 4096 * 4096;
  CK(cudaHostRegister(sh, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable));
  CK(cudaHostGetDevicePointer((void**)&c->shDev, sh, 0));
}

static void openPeer(ctx_t* c) {
  int p = 1 - c->me;
  CK(cudaIpcOpenMemHandle((void**)&c->buf[p], c->sh->mem[p], cudaIpcMemLazyEnablePeerAccess));
  CK(cudaIpcOpenEventHandle(&c->peer, c->sh->event[p]));
}

static int cmpDouble(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

static void report(shared_t* sh, int slot, const char* name, const char* work, const char* unit) {
  double v[REPS];
  memcpy(v, sh->result[slot], sizeof(v));
  qsort(v, REPS, sizeof(double), cmpDouble);
  printf("%-10s %-6s %9.1f %9.1f   us %s (best, median of %d)\n", name, work, v[0], v[REPS / 2],
         unit, REPS);
  fflush(stdout);
}

static void runAll(ctx_t* c, unsigned long long* gen) {
  int slot = 0;
  barrier(c->sh, gen);
  for (int scheme = GPUWAIT; scheme <= LATEWAIT; scheme++)
    for (int useCopy = 0; useCopy < 2; useCopy++, slot++) {
      for (int rep = 0; rep < REPS; rep++) {
        double us = pingPong(c, slot, rep, scheme, useCopy);
        if (c->me == 0) c->sh->result[slot][rep] = us;
        barrier(c->sh, gen);
      }
      if (c->me == 0)
        report(c->sh, slot, schemeName[scheme], useCopy ? "copy8" : "kernel", "a round trip");
    }
  for (int scheme = ALONE; scheme <= LEADWAIT; scheme++, slot++) {
    for (int rep = 0; rep < REPS; rep++) {
      double us = leader(c, slot, rep, scheme);
      if (c->me == 0) c->sh->result[slot][rep] = us;
      barrier(c->sh, gen);
    }
    if (c->me == 0) report(c->sh, slot, leadName[scheme], "ar8B", "an all-reduce");
  }
}

static void child(shared_t* sh, int me, int rounds) {
  ctx_t c;
  memset(&c, 0, sizeof(c));
  c.me = me, c.rounds = rounds, c.sh = sh;
  unsigned long long gen = 0;
  setup(&c);
  barrier(sh, &gen); /* both handles are in the page */
  openPeer(&c);
  runAll(&c, &gen);
  exit(0);
}

int main(int argc, char** argv) {
  int rounds = argc > 1 ? atoi(argv[1]) : 300;
  size_t bytes = (sizeof(shared_t) + 4095) / 4096 * 4096;
  shared_t* sh =
      (shared_t*)mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (sh == MAP_FAILED) return perror("mmap"), 1;
  memset(sh, 0, bytes);
  printf("# two processes on GPU 0, %d round trips a measurement; scheme, work, us\n", rounds);
  fflush(stdout);
  pid_t pid[2];
  for (int me = 0; me < 2; me++)
    if ((pid[me] = fork()) == 0) child(sh, me, rounds);
  int bad = 0;
  for (int me = 0; me < 2; me++) {
    int st = 0;
    waitpid(pid[me], &st, 0);
    bad |= !WIFEXITED(st) || WEXITSTATUS(st) != 0;
  }
  printf("%s gpu_share_pingpong\n", bad ? "FAIL" : "PASS");
  return bad;
}
