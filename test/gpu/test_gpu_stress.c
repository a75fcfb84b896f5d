/*
 * test/gpu/test_gpu_stress.c - many back-to-back GPU collectives, checked (built by the gpu-test
 * target, run by test/gpu/run.sh, meant for several ranks sharing one GPU under MPS).
 *
 * Each communicator gets chains of random collectives (all-reduce, broadcast, reduce, all-gather,
 * reduce-scatter, all-to-all), random sizes from 8 B to 1 MB (so that consecutive operations
 * cross the LL/Simple threshold and change their channel count), random datatypes, reduction
 * ops and roots, some in place; a chain is enqueued on one stream without waiting in between (so
 * launches overlap and fast ranks run ahead), then waited for and every output is checked against
 * a serial reference computed on the host (inputs are small integers: every reduction order gives
 * the same bits). The communicators differ in their configuration (GCOMM_ALGO, GCOMM_PROTO read at
 * init), and their chains are interleaved on the same stream; one rank, drawn at random, starts
 * each chain late.
 *
 * Every rank draws the same sequence from a seed rank 0 picks (printed, or STRESS_SEED to
 * repeat a run). Usage: test_gpu_stress [chains per communicator] [operations per chain].
 * Ranks pick GPU localRank % TEST_NGPUS (default: every visible GPU), as test_gpu does.
 */
#include <cuda_runtime_api.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gcomm.h"
#include "gpucheck.h"

static int rank, nranks, failures, checks;

enum { F_ALLREDUCE, F_BROADCAST, F_REDUCE, F_ALLGATHER, F_REDUCESCATTER, F_ALLTOALL, NFUNCS };
static const char* funcNames[] = {"AllReduce", "Broadcast",     "Reduce",
                                  "AllGather", "ReduceScatter", "AllToAll"};
#define MAX_BYTES (1u << 20) /* the largest buffer of one operation (nccl-tests' size) */
#define MAX_CHAIN 64

/* One operation of a chain: what every rank calls, and where its buffers are in the arenas. */
typedef struct {
  int func, dt, op, root, inPlace, seed;
  size_t count;         /* the call's count argument */
  size_t inOff, outOff; /* byte offsets in the input and output arenas */
} StressOp;

/* A small deterministic generator: every rank draws the same sequence from the same seed. */
static uint64_t nextRand(uint64_t* s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

/* Input element i of rank r for an operation: a small integer (exact in every type). */
static int inputValue(int r, size_t i, int seed) {
  uint32_t h = (uint32_t)(r * 7919u + i * 104729u + seed * 31337u);
  h ^= h >> 13;
  h *= 0x5bd1e995u;
  h ^= h >> 15;
  return (int)(h % 7) - 3;
}

static size_t typeSize(int dt) {
  return dt == gcommFloat || dt == gcommInt32 ? 4 : 8;
}
static void putValue(void* buf, int dt, size_t i, long v) {
  if (dt == gcommFloat)
    ((float*)buf)[i] = (float)v;
  else if (dt == gcommInt32)
    ((int32_t*)buf)[i] = (int32_t)v;
  else if (dt == gcommDouble)
    ((double*)buf)[i] = (double)v;
  else
    ((int64_t*)buf)[i] = (int64_t)v;
}
static long reduceValues(int op, long a, long b) {
  return op == gcommMax ? (a > b ? a : b) : op == gcommMin ? (a < b ? a : b) : a + b;
}

/* Elements of the input and output buffers of o on this rank (as gcomm.h defines them). */
static void bufferCounts(const StressOp* o, size_t* in, size_t* out) {
  size_t c = o->count, n = (size_t)nranks;
  *in = c, *out = c;
  if (o->func == F_ALLGATHER) *out = c * n;
  if (o->func == F_REDUCESCATTER) *in = c * n;
  if (o->func == F_ALLTOALL) *in = *out = c * n;
}

/* Draws one operation; its buffers start at *inAt and *outAt in the arenas (moved past them). */
static StressOp drawOp(uint64_t* rng, size_t* inAt, size_t* outAt) {
  static const int types[] = {gcommFloat, gcommInt32, gcommDouble, gcommInt64};
  static const int ops[] = {gcommSum, gcommMax, gcommMin};
  StressOp o;
  o.func = (int)(nextRand(rng) % NFUNCS);
  o.dt = types[nextRand(rng) % 4];
  o.op = ops[nextRand(rng) % 3];
  o.root = (int)(nextRand(rng) % (uint64_t)nranks);
  o.seed = (int)(nextRand(rng) % 100000);
  /* 8 B to 1 MB, spread evenly over the powers of two, plus an odd remainder now and then */
  size_t bytes = (size_t)8 << (nextRand(rng) % 18);
  if (nextRand(rng) % 3 == 0) bytes += (nextRand(rng) % 64) * 8;
  if (bytes > MAX_BYTES) bytes = MAX_BYTES;
  size_t esz = typeSize(o.dt), perRank = o.func >= F_ALLGATHER ? (size_t)nranks : 1;
  o.count = bytes / esz / perRank;
  if (o.count == 0) o.count = 1;
  /* in place: the all-reduce, broadcast and reduce layouts (the input is the output) */
  o.inPlace = o.func <= F_REDUCE && nextRand(rng) % 4 == 0;
  size_t in, out;
  bufferCounts(&o, &in, &out);
  o.inOff = *inAt, o.outOff = *outAt;
  *inAt += (in * esz + 255) & ~(size_t)255;
  *outAt += (out * esz + 255) & ~(size_t)255;
  return o;
}

/* The expected element k of o's output on this rank. */
static long expected(const StressOp* o, size_t k) {
  size_t c = o->count;
  long v = 0;
  switch (o->func) {
    case F_BROADCAST:
      return inputValue(o->root, k, o->seed);
    case F_ALLGATHER:
      return inputValue((int)(k / c), k % c, o->seed);
    case F_ALLTOALL:
      return inputValue((int)(k / c), rank * c + k % c, o->seed);
    default: /* a reduction; reduce-scatter's output is this rank's block of it */
      if (o->func == F_REDUCESCATTER) k += rank * c;
      v = inputValue(0, k, o->seed);
      for (int r = 1; r < nranks; r++) v = reduceValues(o->op, v, inputValue(r, k, o->seed));
      return v;
  }
}

static void enqueueOp(gcommComm_t comm, cudaStream_t s, const StressOp* o, char* dIn, char* dOut) {
  const void* in = o->inPlace ? dOut + o->outOff : dIn + o->inOff;
  void* out = dOut + o->outOff;
  gcommDataType_t dt = (gcommDataType_t)o->dt;
  gcommRedOp_t op = (gcommRedOp_t)o->op;
  switch (o->func) {
    case F_ALLREDUCE:
      CK(gcommAllReduce(in, out, o->count, dt, op, comm, s));
      break;
    case F_BROADCAST:
      CK(gcommBroadcast(in, out, o->count, dt, o->root, comm, s));
      break;
    case F_REDUCE:
      CK(gcommReduce(in, out, o->count, dt, op, o->root, comm, s));
      break;
    case F_ALLGATHER:
      CK(gcommAllGather(in, out, o->count, dt, comm, s));
      break;
    case F_REDUCESCATTER:
      CK(gcommReduceScatter(in, out, o->count, dt, op, comm, s));
      break;
    default:
      CK(gcommAllToAll(in, out, o->count, dt, comm, s));
      break;
  }
}

/* Host inputs of a chain (in place: into the output arena), outputs poisoned. */
static void fillChain(const StressOp* ops, int n, char* hIn, char* hOut, size_t inBytes,
                      size_t outBytes) {
  memset(hOut, 0xA5, outBytes);
  memset(hIn, 0x5A, inBytes);
  for (int j = 0; j < n; j++) {
    const StressOp* o = &ops[j];
    size_t in, out;
    bufferCounts(o, &in, &out);
    char* dst = o->inPlace ? hOut + o->outOff : hIn + o->inOff;
    for (size_t i = 0; i < in; i++) putValue(dst, o->dt, i, inputValue(rank, i, o->seed));
  }
}

/* Compares every output of a chain with the reference; returns the number of wrong ones. */
static int checkChain(const StressOp* ops, int n, const char* hOut, const char* label, int chain) {
  int wrong = 0;
  char ref[8];
  for (int j = 0; j < n; j++) {
    const StressOp* o = &ops[j];
    size_t in, out, esz = typeSize(o->dt);
    bufferCounts(o, &in, &out);
    if (o->func == F_REDUCE && rank != o->root) out = 0; /* only the root's output is defined */
    if (o->func == F_REDUCESCATTER) out = o->count;
    for (size_t k = 0; k < out; k++) {
      putValue(ref, o->dt, 0, expected(o, k));
      if (memcmp(ref, hOut + o->outOff + k * esz, esz) == 0) continue;
      if (failures + wrong < 20)
        fprintf(stderr,
                "FAIL rank %d: %s chain %d op %d: %s dt %d op %d root %d count %zu%s: element "
                "%zu wrong\n",
                rank, label, chain, j, funcNames[o->func], o->dt, o->op, o->root, o->count,
                o->inPlace ? " in place" : "", k);
      wrong++;
      break;
    }
    checks++;
  }
  return wrong;
}

/* One rank, drawn at random, starts the chain up to 2 ms late: the others' kernels run ahead
 * and wait for it inside their operations, as in a real program whose ranks drift. */
static void straggle(uint64_t* rng) {
  int late = (int)(nextRand(rng) % (uint64_t)nranks);
  long ns = (long)(nextRand(rng) % 2000000);
  struct timespec pause = {0, ns};
  if (rank == late) nanosleep(&pause, NULL);
}

/* A communicator of the run and its configuration (the environment gcomm reads at init). */
typedef struct {
  const char* label;
  const char* algo;     /* GCOMM_ALGO, or NULL for the cost model */
  const char* buffSize; /* GCOMM_BUFFSIZE, or NULL: smaller slots, more steps per operation
                           (and less FIFO memory with 8 ranks on a GPU) */
  gcommComm_t comm;
  uint64_t rng;
} StressComm;

/* Waits for a chain; a failure names the communicator and the chain, and ends the run. */
static void waitChain(const StressComm* sc, cudaStream_t s, int chain) {
  gcommResult_t r = gcommWait(sc->comm, s);
  if (r == gcommSuccess) return;
  fprintf(stderr, "FAIL rank %d: communicator %s chain %d: gcommWait -> %s: %s\n", rank, sc->label,
          chain, gcommGetErrorString(r), gcommGetLastError(NULL));
  MPI_Abort(MPI_COMM_WORLD, 1);
}

static void initComms(StressComm* sc, int n, uint64_t seed) {
  for (int i = 0; i < n; i++) {
    if (sc[i].algo) setenv("GCOMM_ALGO", sc[i].algo, 1);
    if (sc[i].buffSize) setenv("GCOMM_BUFFSIZE", sc[i].buffSize, 1);
    CK(gcommCommInitMPI(&sc[i].comm, MPI_COMM_WORLD, NULL));
    unsetenv("GCOMM_ALGO");
    unsetenv("GCOMM_BUFFSIZE");
    sc[i].rng = seed * 2654435761u + (uint64_t)i * 40503u + 1;
  }
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  int chains = argc > 1 ? atoi(argv[1]) : 6, perChain = argc > 2 ? atoi(argv[2]) : 24;
  if (chains < 1 || perChain < 1 || perChain > MAX_CHAIN) {
    if (rank == 0) fprintf(stderr, "usage: test_gpu_stress [chains] [ops per chain <= 64]\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  MPI_Comm node;
  int local, ndev = 0;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, &local);
  CU(cudaGetDeviceCount(&ndev));
  if (getenv("TEST_NGPUS") && atoi(getenv("TEST_NGPUS")) > 0 && atoi(getenv("TEST_NGPUS")) < ndev)
    ndev = atoi(getenv("TEST_NGPUS"));
  CU(cudaSetDevice(local % ndev));
  unsigned long long seed = getenv("STRESS_SEED") ? strtoull(getenv("STRESS_SEED"), NULL, 0)
                                                  : (unsigned long long)time(NULL) ^ 0x9e3779b9u;
  MPI_Bcast(&seed, 1, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD);
  StressComm sc[] = {{"auto", NULL, NULL, NULL, 0},   {"auto-1M", NULL, "1M", NULL, 0},
                     {"ring", "ring", "1M", NULL, 0}, {"direct", "direct", "1M", NULL, 0},
                     {"tree", "tree", "1M", NULL, 0}, {"twoshot", "twoshot", "1M", NULL, 0}};
  const int nComms = (int)(sizeof(sc) / sizeof(sc[0]));
  initComms(sc, nComms, seed);
  size_t arena = (size_t)perChain * (MAX_BYTES + 256);
  char *dIn, *dOut, *hIn = malloc(arena), *hOut = malloc(arena);
  CU(cudaMalloc((void**)&dIn, arena));
  CU(cudaMalloc((void**)&dOut, arena));
  cudaStream_t s;
  CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  StressOp ops[MAX_CHAIN];
  int before[sizeof(sc) / sizeof(sc[0])] = {0};
  for (int c = 0; c < chains; c++) {
    for (int i = 0; i < nComms; i++) { /* the communicators take turns on the one stream */
      size_t inAt = 0, outAt = 0;
      for (int j = 0; j < perChain; j++) ops[j] = drawOp(&sc[i].rng, &inAt, &outAt);
      fillChain(ops, perChain, hIn, hOut, inAt, outAt);
      CU(cudaMemcpy(dIn, hIn, inAt, cudaMemcpyHostToDevice));
      CU(cudaMemcpy(dOut, hOut, outAt, cudaMemcpyHostToDevice));
      CU(cudaDeviceSynchronize());
      straggle(&sc[i].rng);
      for (int j = 0; j < perChain; j++) enqueueOp(sc[i].comm, s, &ops[j], dIn, dOut);
      waitChain(&sc[i], s, c);
      CU(cudaMemcpy(hOut, dOut, outAt, cudaMemcpyDeviceToHost));
      int wrong = checkChain(ops, perChain, hOut, sc[i].label, c);
      failures += wrong;
      before[i] += wrong;
    }
  }
  int total = 0, totalChecks = 0;
  MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Allreduce(&checks, &totalChecks, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  for (int i = 0; i < nComms; i++) {
    int bad = 0;
    MPI_Allreduce(&before[i], &bad, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0)
      printf("%s stress %-8s: %d ranks, %d chains of %d operations, seed %llu\n",
             bad ? "FAIL" : "PASS", sc[i].label, nranks, chains, perChain, seed);
    CK(gcommCommDestroy(sc[i].comm));
  }
  if (rank == 0) printf("%d outputs checked, %d wrong\n", totalChecks, total);
  CU(cudaFree(dIn));
  CU(cudaFree(dOut));
  free(hIn);
  free(hOut);
  MPI_Comm_free(&node);
  MPI_Finalize();
  return total != 0;
}
