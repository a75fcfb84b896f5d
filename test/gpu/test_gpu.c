/*
 * test/gpu/test_gpu.c - correctness of GPU communicators (built by test/gpu/run.sh, not by the
 * default make). Every collective x datatype x op x algorithm x protocol on device buffers, odd
 * counts, in-place and out-of-place, poisoned outputs, checked byte for byte against a host
 * reference (the inputs are small integers, so every reduction order gives the exact same result);
 * the ops include PreMulSum, with a host-immediate scalar and with one in device memory that a copy
 * on the stream writes after the operator is made (so the kernel must read it when it runs), each
 * rank its own; AllToAll in place too. Then every case captured into a CUDA graph, launched
 * twice (the buffers prepared afresh), on the FIFO kernels and straight between the ranks' buffers
 * (GCOMM_GRAPH_REGISTER); send/recv, a fused group, two all-reduces replayed three times from
 * one graph, then one run eagerly, an all-reduce and an all-gather chained in one graph, and 40
 * graphs over buffers allocated and freed in turn (the GPU's memory comes back). Ranks pick GPU
 * localRank % TEST_NGPUS (default: every visible GPU). TEST_SHARED_COPY=1: every rank is on one GPU
 * and runs the copy path (GCOMM_SHARED_GPU: no kernel waits for a peer), where algorithms and
 * protocols play no part: only the cost model's run, and graph capture must be refused.
 */
#include <cuda_runtime_api.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gcomm.h"
#include "gpucheck.h"
#include "gcomm_reduce.h"

static int rank, nranks, failures, checks, sharedCopy;

static const char* fnames[] = {"AllReduce",     "Broadcast", "Reduce", "AllGather",
                               "ReduceScatter", "AllToAll",  "Gather", "Scatter"};
static const char* tnames[] = {"int8", "uint8", "int32",  "uint32", "int64",   "uint64",
                               "half", "float", "double", "bf16",   "fp8e4m3", "fp8e5m2"};
static const char* onames[] = {"sum", "prod", "max", "min", "avg", "premul", "premuldev"};
enum { PREMUL = 5, PREMUL_DEV = 6, NOPS = 7 };

static int isFp8(int dt) {
  return dt == gcommFloat8e4m3 || dt == gcommFloat8e5m2;
}

/* input value of rank r at element i: a small integer (fp8: -1, 0, 1, whose sums over 8 ranks
 * are exact in 3 significant bits) */
static int val(int r, size_t i, int op, int seed, int dt) {
  unsigned h = (unsigned)(r * 7919 + i * 104729 + seed * 31337);
  h ^= h >> 13;
  h *= 0x5bd1e995u;
  h ^= h >> 15;
  if (op == gcommProd) return (int)(h % 3) - 1 == 0 ? 2 : (int)(h % 3) - 1; /* -1, 1, 2 */
  return isFp8(dt) ? (int)(h % 3) - 1 : (int)(h % 7) - 3;
}

/* rank r's PreMulSum scalar: products and sums stay exact (fp8 E5M2: +-1, sums within 8) */
static double scalarVal(int dt, int r) {
  static const double scalars[] = {1, -1, 2, 0.5};
  if (dt == gcommFloat8e5m2) return r & 1 ? -1 : 1;
  if (dt == gcommFloat8e4m3) return r & 1 ? -1 : 2;
  if (dt < gcommFloat16) return r % 4 == 3 ? 3 : scalars[r % 4];
  return scalars[r % 4];
}

static void put(void* buf, int dt, size_t i, double v) {
  switch (dt) {
    case 0:
      ((int8_t*)buf)[i] = (int8_t)(int64_t)v;
      break;
    case 1:
      ((uint8_t*)buf)[i] = (uint8_t)(int64_t)v;
      break;
    case 2:
      ((int32_t*)buf)[i] = (int32_t)(int64_t)v;
      break;
    case 3:
      ((uint32_t*)buf)[i] = (uint32_t)(int64_t)v;
      break;
    case 4:
      ((int64_t*)buf)[i] = (int64_t)v;
      break;
    case 5:
      ((uint64_t*)buf)[i] = (uint64_t)(int64_t)v;
      break;
    case 6:
      ((uint16_t*)buf)[i] = gcommFloatToHalf((float)v);
      break;
    case 7:
      ((float*)buf)[i] = (float)v;
      break;
    case 8:
      ((double*)buf)[i] = v;
      break;
    case 9:
      ((uint16_t*)buf)[i] = gcommFloatToBf16((float)v);
      break;
    default:
      ((uint8_t*)buf)[i] = gcommFloatToFp8((float)v, dt == gcommFloat8e5m2);
      break;
  }
}

/* reference reduction of element i over all ranks, with the type's wrap-around and Avg; PreMulSum
 * sums each rank's value times its scalar */
static void refReduce(void* out, size_t oi, int dt, int op, size_t i, int seed) {
  if (dt >= gcommFloat16) {
    double acc = val(0, i, op, seed, dt) * (op >= PREMUL ? scalarVal(dt, 0) : 1);
    for (int r = 1; r < nranks; r++) {
      double v = val(r, i, op, seed, dt) * (op >= PREMUL ? scalarVal(dt, r) : 1);
      if (op == gcommSum || op == gcommAvg || op >= PREMUL)
        acc += v;
      else if (op == gcommProd)
        acc *= v;
      else if (op == gcommMax)
        acc = v > acc ? v : acc;
      else
        acc = v < acc ? v : acc;
    }
    if (op == gcommAvg) {
      if (dt == 8)
        acc = acc / nranks;
      else
        acc = (float)acc / (float)nranks; /* rounded by put */
    }
    put(out, dt, oi, acc);
    return;
  }
#define INTREF(T, U)                                                    \
  {                                                                     \
    T acc = (T)val(0, i, op, seed, dt);                                 \
    if (op >= PREMUL) acc = (T)((U)acc * (U)(int64_t)scalarVal(dt, 0)); \
    for (int r = 1; r < nranks; r++) {                                  \
      T v = (T)val(r, i, op, seed, dt);                                 \
      if (op >= PREMUL) v = (T)((U)v * (U)(int64_t)scalarVal(dt, r));   \
      if (op == gcommSum || op == gcommAvg || op >= PREMUL)             \
        acc = (T)((U)acc + (U)v);                                       \
      else if (op == gcommProd)                                         \
        acc = (T)((U)acc * (U)v);                                       \
      else if (op == gcommMax)                                          \
        acc = v > acc ? v : acc;                                        \
      else                                                              \
        acc = v < acc ? v : acc;                                        \
    }                                                                   \
    if (op == gcommAvg) acc = (T)(acc / (T)nranks);                     \
    ((T*)out)[oi] = acc;                                                \
    return;                                                             \
  }
  switch (dt) {
    case 0:
      INTREF(int8_t, uint8_t)
    case 1:
      INTREF(uint8_t, uint8_t)
    case 2:
      INTREF(int32_t, uint32_t)
    case 3:
      INTREF(uint32_t, uint32_t)
    case 4:
      INTREF(int64_t, uint64_t)
    default:
      INTREF(uint64_t, uint64_t)
  }
}

static char *dIn, *dOut, *hIn, *hOut, *hRef, *dScalar;
static size_t maxBytes;

/* The reduction operator of a case: op itself, or a PreMulSum operator of this rank's scalar.
 * PREMUL_DEV: the device scalar holds a wrong value when the operator is made; a copy on s, after
 * it, writes the right one, which the kernel must read when it runs. */
static gcommRedOp_t caseOp(gcommComm_t comm, cudaStream_t s, int dt, int op) {
  char right[8] = {0}, wrong[8] = {0};
  gcommRedOp_t redop = (gcommRedOp_t)op;
  if (op < PREMUL) return redop;
  put(right, dt, 0, scalarVal(dt, rank));
  put(wrong, dt, 0, scalarVal(dt, rank) + 4);
  if (op == PREMUL) {
    CK(gcommRedOpCreatePreMulSum(&redop, right, dt, gcommScalarHostImmediate, comm));
    memcpy(right, wrong, sizeof(right)); /* read when the operator was made */
    return redop;
  }
  /* both copies on s, in order: a cudaMemcpy from pageable memory may land after it returns, and
   * s (non-blocking) would not wait for it, so the wrong value could land last */
  CU(cudaMemcpyAsync(dScalar, wrong, sizeof(wrong), cudaMemcpyHostToDevice, s));
  CU(cudaStreamSynchronize(s));
  CK(gcommRedOpCreatePreMulSum(&redop, dScalar, dt, gcommScalarDevice, comm));
  CU(cudaMemcpyAsync(dScalar, right, sizeof(right), cudaMemcpyHostToDevice, s));
  CU(cudaStreamSynchronize(s)); /* the copy reads right[] on this stack */
  return redop;
}

/* One case's buffers: the poisoned output and this rank's input (element j of its whole input:
 * val(rank, j)), where the call reads it; *sendbuf and *recvbuf the call's arguments. */
static void prepareCase(int f, int dt, int op, size_t count, int inPlace, int seed, char** sendbuf,
                        char** recvbuf) {
  int n = nranks;
  size_t esz = gcommTypeSize(dt);
  size_t inCount = count, outCount = count;
  if (f == 3 || f == 6) outCount = count * n; /* AllGather, Gather */
  if (f == 4 || f == 7) inCount = count * n;  /* ReduceScatter, Scatter */
  if (f == 5) inCount = outCount = count * n; /* AllToAll */
  for (size_t j = 0; j < inCount; j++) put(hIn, dt, j, val(rank, j, op, seed, dt));
  memset(hOut, 0xAB, outCount * esz);
  CU(cudaMemcpy(dOut, hOut, outCount * esz, cudaMemcpyHostToDevice));
  *sendbuf = dIn;
  *recvbuf = dOut;
  if (inPlace) {
    if (f == 3 || f == 6)
      *sendbuf = dOut + rank * count * esz; /* AllGather, Gather */
    else if (f == 4 || f == 7) {
      *sendbuf = dOut;
      *recvbuf = dOut + rank * count * esz;
    } else
      *sendbuf = dOut;
    CU(cudaMemcpy(*sendbuf, hIn, inCount * esz, cudaMemcpyHostToDevice));
  } else {
    CU(cudaMemcpy(dIn, hIn, inCount * esz, cudaMemcpyHostToDevice));
  }
  /* cudaMemcpy from pageable memory may return before its DMA lands, and s does not wait for
   * the legacy stream: finish the copies first */
  CU(cudaDeviceSynchronize());
}

/* The output of one case against the host reference; returns 0 when it matches. */
static int checkCase(int f, int dt, int op, size_t count, int inPlace, int seed,
                     const char* recvbuf, const char* algo, int graph) {
  int n = nranks, root = (seed % n), isRed = f == 0 || f == 2 || f == 4;
  size_t esz = gcommTypeSize(dt), outCount = count;
  if (f == 3 || f == 6 || f == 5) outCount = count * n; /* AllGather, Gather, AllToAll */
  size_t checkCount = outCount;
  if (f == 4 || f == 7) checkCount = count;
  if ((f == 2 || f == 6) && rank != root) checkCount = 0;
  if (checkCount) CU(cudaMemcpy(hOut, recvbuf, checkCount * esz, cudaMemcpyDeviceToHost));
  /* reference */
  memset(hRef, 0xAB, checkCount * esz);
  for (size_t k = 0; k < checkCount; k++) {
    switch (f) {
      case 0:
      case 2:
        refReduce(hRef, k, dt, op, k, seed);
        break;
      case 4:
        refReduce(hRef, k, dt, op, rank * count + k, seed);
        break;
      case 1:
        put(hRef, dt, k, val(root, k, op, seed, dt));
        break;
      case 3:
      case 6:
        put(hRef, dt, k, val((int)(k / count), k % count, op, seed, dt));
        break;
      case 5:
        put(hRef, dt, k, val((int)(k / count), rank * count + k % count, op, seed, dt));
        break;
      case 7:
        put(hRef, dt, k, val(root, rank * count + k, op, seed, dt));
        break;
    }
  }
  checks++;
  if (memcmp(hOut, hRef, checkCount * esz) != 0) {
    size_t k = 0;
    while (memcmp(hOut + k * esz, hRef + k * esz, esz) == 0) k++;
    unsigned long long got = 0, want = 0;
    memcpy(&got, hOut + k * esz, esz);
    memcpy(&want, hRef + k * esz, esz);
    if (failures++ < 20)
      fprintf(stderr,
              "FAIL rank %d: %s %s %s%s algo %s count %zu %s%s root %d: element %zu is "
              "0x%llx, expected 0x%llx\n",
              rank, fnames[f], tnames[dt], isRed ? "op " : "", isRed ? onames[op] : "", algo, count,
              inPlace ? "in-place" : "out-of-place", graph ? " graph" : "", root, k, got, want);
    return 1;
  }
  return 0;
}

/* One case; returns 0 on success. graph: the call is captured into a CUDA graph, which is
 * launched twice, the buffers prepared afresh and checked each time. */
static int runCase(gcommComm_t comm, cudaStream_t s, int f, int dt, int op, size_t count,
                   int inPlace, int seed, const char* algo, int graph) {
  int root = seed % nranks, isRed = f == 0 || f == 2 || f == 4;
  gcommRedOp_t redop = isRed ? caseOp(comm, s, dt, op) : gcommSum;
  char *sendbuf, *recvbuf;
  prepareCase(f, dt, op, count, inPlace, seed, &sendbuf, &recvbuf);
  cudaGraph_t g = NULL;
  cudaGraphExec_t exec = NULL;
  if (graph) CU(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  /* every third case alone in a group: a group's launch runs fan reductions step by step */
  int grouped = seed % 3 == 0;
  if (grouped) CK(gcommGroupStart());
  switch (f) {
    case 0:
      CK(gcommAllReduce(sendbuf, recvbuf, count, dt, redop, comm, s));
      break;
    case 1:
      CK(gcommBroadcast(sendbuf, recvbuf, count, dt, root, comm, s));
      break;
    case 2:
      CK(gcommReduce(sendbuf, recvbuf, count, dt, redop, root, comm, s));
      break;
    case 3:
      CK(gcommAllGather(sendbuf, recvbuf, count, dt, comm, s));
      break;
    case 4:
      CK(gcommReduceScatter(sendbuf, recvbuf, count, dt, redop, comm, s));
      break;
    case 5:
      CK(gcommAllToAll(sendbuf, recvbuf, count, dt, comm, s));
      break;
    case 6:
      CK(gcommGather(sendbuf, recvbuf, count, dt, root, comm, s));
      break;
    case 7:
      CK(gcommScatter(sendbuf, recvbuf, count, dt, root, comm, s));
      break;
  }
  if (grouped) CK(gcommGroupEnd());
  if ((int)redop >= gcommNumOps) CK(gcommRedOpDestroy(redop, comm)); /* the call captured it */
  if (graph) {
    CU(cudaStreamEndCapture(s, &g));
    CU(cudaGraphInstantiate(&exec, g, 0));
  }
  int bad = 0;
  for (int launch = 0; launch < (graph ? 2 : 1) && !bad; launch++) {
    if (launch > 0) prepareCase(f, dt, op, count, inPlace, seed, &sendbuf, &recvbuf);
    if (graph) CU(cudaGraphLaunch(exec, s));
    CK(gcommWait(comm, s));
    bad = checkCase(f, dt, op, count, inPlace, seed, recvbuf, algo, graph);
  }
  if (graph) {
    CU(cudaGraphExecDestroy(exec));
    CU(cudaGraphDestroy(g));
  }
  return bad;
}

/* graph capture: two in-place all-reduces of ones, back to back in one graph (the second, direct,
 * skips its first meeting), replayed 3 times -> n^6; then an eager one -> n^7 (powers of n stay
 * exact in float at these sizes). Returns the wrong elements. */
static int graphCapture(gcommComm_t comm, cudaStream_t s, float* dA, float* h, float* g,
                        size_t cnt) {
  int bad = 0;
  for (size_t i = 0; i < cnt; i++) h[i] = 1.0f;
  CU(cudaMemcpy(dA, h, cnt * 4, cudaMemcpyHostToDevice));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CU(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  CK(gcommAllReduce(dA, dA, cnt, gcommFloat, gcommSum, comm, s));
  CK(gcommAllReduce(dA, dA, cnt, gcommFloat, gcommSum, comm, s));
  CU(cudaStreamEndCapture(s, &graph));
  CU(cudaGraphInstantiate(&exec, graph, 0));
  for (int k = 0; k < 3; k++) CU(cudaGraphLaunch(exec, s));
  CK(gcommWait(comm, s));
  float want = 1;
  for (int k = 0; k < 6; k++) want *= (float)nranks;
  CU(cudaMemcpy(g, dA, cnt * 4, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < cnt; i++) bad += g[i] != want;
  /* an eager collective after the replays still agrees on the FIFO counters */
  CK(gcommAllReduce(dA, dA, cnt, gcommFloat, gcommSum, comm, s));
  CK(gcommWait(comm, s));
  CU(cudaMemcpy(g, dA, cnt * 4, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < cnt; i++) bad += g[i] != want * (float)nranks;
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return bad;
}

/* graph capture of a chain: an all-reduce of ones into dB, then an all-gather of dB's first
 * cnt / n elements into dD, back to back (direct at the default sizes: the all-gather skips its
 * first meeting and reads what the peers wrote into this rank's dB in the all-reduce), replayed
 * twice: every element of dD is n. Returns the wrong elements. */
static int graphChain(gcommComm_t comm, cudaStream_t s, float* dA, float* dB, float* dD, float* g,
                      size_t cnt) {
  size_t part = cnt / nranks;
  int bad = 0;
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CU(cudaMemcpy(dA, g, cnt * 4, cudaMemcpyHostToDevice)); /* g: ones */
  CU(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  CK(gcommAllReduce(dA, dB, cnt, gcommFloat, gcommSum, comm, s));
  CK(gcommAllGather(dB, dD, part, gcommFloat, comm, s));
  CU(cudaStreamEndCapture(s, &graph));
  CU(cudaGraphInstantiate(&exec, graph, 0));
  for (int k = 0; k < 2; k++) {
    CU(cudaMemset(dB, 0xff, cnt * 4));
    CU(cudaMemset(dD, 0xff, part * nranks * 4));
    CU(cudaDeviceSynchronize());
    CU(cudaGraphLaunch(exec, s));
    CK(gcommWait(comm, s));
    CU(cudaMemcpy(g, dD, part * nranks * 4, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < part * nranks; i++) bad += g[i] != (float)nranks;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return bad;
}

/* One in-place all-reduce of cnt floats at buf captured into a graph, launched once, destroyed. */
static void captureOnce(gcommComm_t comm, cudaStream_t s, float* buf, size_t cnt) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CU(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  CK(gcommAllReduce(buf, buf, cnt, gcommFloat, gcommSum, comm, s));
  CU(cudaStreamEndCapture(s, &graph));
  CU(cudaGraphInstantiate(&exec, graph, 0));
  CU(cudaGraphLaunch(exec, s));
  CK(gcommWait(comm, s));
  CU(cudaGraphExecDestroy(exec));
  CU(cudaGraphDestroy(graph));
}

/* Graphs over buffers allocated and freed in turn: each rank maps its peers' buffers at capture
 * and must let go of them once the graph is gone (they would stay allocated on the peers' GPUs
 * otherwise). 40 rounds of 16 MB each (short under compute-sanitizer too); then the GPU's free
 * memory is back within two buffers a rank. Returns 1 if not. */
static int graphRelease(gcommComm_t comm, cudaStream_t s, float* small, size_t smallCnt) {
  const size_t cnt = (size_t)4 << 20;
  size_t free0 = 0, free1 = 0, total = 0;
  CU(cudaDeviceSynchronize());
  MPI_Barrier(MPI_COMM_WORLD);
  CU(cudaMemGetInfo(&free0, &total));
  for (int round = 0; round < 40; round++) {
    float* buf;
    CU(cudaMalloc((void**)&buf, cnt * 4));
    CU(cudaMemset(buf, 0, cnt * 4));
    captureOnce(comm, s, buf, cnt);
    CU(cudaFree(buf));
  }
  captureOnce(comm, s, small, smallCnt); /* lets go of the last round's mappings */
  CU(cudaDeviceSynchronize());
  MPI_Barrier(MPI_COMM_WORLD);
  CU(cudaMemGetInfo(&free1, &total));
  long long lost = (long long)free0 - (long long)free1, bound = 2LL * nranks * (long long)cnt * 4;
  if (lost > bound)
    fprintf(stderr,
            "FAIL rank %d: graph mappings: %lld MB of GPU memory not returned (bound %lld)\n", rank,
            lost >> 20, bound >> 20);
  return lost > bound;
}

/* The copy path refuses graph capture (its flags are set when the host enqueues): a clear
 * gcommInvalidUsage that changes nothing, and the communicator still works. Returns 1 if not. */
static int captureRefused(gcommComm_t comm, cudaStream_t s, float* dA, size_t cnt) {
  cudaGraph_t graph;
  CU(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  gcommResult_t r = gcommAllReduce(dA, dA, cnt, gcommFloat, gcommSum, comm, s);
  CU(cudaStreamEndCapture(s, &graph));
  cudaGraphDestroy(graph);
  if (r != gcommInvalidUsage) return 1;
  CK(gcommAllReduce(dA, dA, cnt, gcommFloat, gcommSum, comm, s));
  CK(gcommWait(comm, s));
  return 0;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  int full = argc > 1 && strcmp(argv[1], "--quick") != 0;
  int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
  (void)full;
  MPI_Comm node;
  int local;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, &local);
  int ndev = 0;
  CU(cudaGetDeviceCount(&ndev));
  if (getenv("TEST_NGPUS") && atoi(getenv("TEST_NGPUS")) > 0 && atoi(getenv("TEST_NGPUS")) < ndev)
    ndev = atoi(getenv("TEST_NGPUS"));
  int dev = local % ndev;
  CU(cudaSetDevice(dev));
  /* --quick runs the first two counts, and the third where a forced direct or two-shot all-reduce
   * or reduce-scatter takes fan steps with several lines a thread (LL) or several rounds (Simple),
   * one datatype of each size: compute-sanitizer runs --quick too */
  size_t counts[] = {1, 1031, 262147};
  maxBytes = counts[2] * 8 * nranks + 4096;
  CU(cudaMalloc((void**)&dIn, maxBytes));
  CU(cudaMalloc((void**)&dOut, maxBytes));
  CU(cudaMalloc((void**)&dScalar, 8));
  hIn = malloc(maxBytes);
  hOut = malloc(maxBytes);
  hRef = malloc(maxBytes);
  cudaStream_t s;
  CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

  /* every algorithm x protocol forced in turn, then the cost model's own choices (which mix
   * protocols on the same connections as the size changes) */
  const char* algos[] = {"ring", "tree",   "direct",  "twoshot", "ring",
                         "tree", "direct", "twoshot", "auto"};
  const char* protos[] = {"simple", "simple", "simple", "simple", "ll", "ll", "ll", "ll", "auto"};
  const int nRuns = (int)(sizeof(algos) / sizeof(algos[0])); /* the last: the cost model's */
  const char* copyEnv = getenv("TEST_SHARED_COPY");
  sharedCopy = copyEnv != NULL && strcmp(copyEnv, "1") == 0;
  int seed = 1;
  for (int a = sharedCopy ? nRuns - 1 : 0; a < nRuns; a++) {
    char what[32];
    snprintf(what, sizeof(what), "%s/%s", algos[a], protos[a]);
    if (a < nRuns - 1) {
      setenv("GCOMM_ALGO", algos[a], 1);
      setenv("GCOMM_PROTO", protos[a], 1);
    } else {
      unsetenv("GCOMM_ALGO");
      unsetenv("GCOMM_PROTO");
    }
    gcommComm_t comm;
    CK(gcommCommInitMPI(&comm, MPI_COMM_WORLD, NULL));
    int cdev = -2;
    CK(gcommCommDevice(comm, &cdev));
    if (cdev != dev) {
      fprintf(stderr, "rank %d: comm device %d, expected %d\n", rank, cdev, dev);
      failures++;
    }
    int before = failures;
    int fans = strcmp(algos[a], "direct") == 0 || strcmp(algos[a], "twoshot") == 0;
    for (int f = 0; f < 8; f++) {
      int isRed = f == 0 || f == 2 || f == 4;
      for (int dt = 0; dt < gcommNumTypes; dt++) {
        int eachSize = dt == 0 || dt == 6 || dt == 7 || dt == 8;
        if (!isRed && !eachSize) continue;
        int nCounts = quick && !(fans && (f == 0 || f == 4) && eachSize) ? 2 : 3;
        for (int op = 0; op < (isRed ? NOPS : 1); op++) {
          if (quick && isRed && op > 0 && dt != 7 && dt != 6 && dt != gcommFloat8e4m3) continue;
          for (int c = 0; c < nCounts; c++)
            for (int ip = 0; ip < 2; ip++)
              runCase(comm, s, f, dt, op, counts[c], ip, seed++, what, 0);
        }
      }
    }
    if (rank == 0)
      printf("algo/proto %-13s: %s (%d checks so far)\n", what,
             failures == before ? "ok" : "FAILED", checks);
    fflush(stdout);
    CK(gcommCommDestroy(comm));
  }
  unsetenv("GCOMM_ALGO");
  unsetenv("GCOMM_PROTO");

  /* every collective captured into a CUDA graph, each graph launched twice: on the FIFO kernels
   * (GCOMM_GRAPH_REGISTER=0), then with the all-reduce, broadcast, reduce, all-gather and
   * reduce-scatter straight between the ranks' buffers at every size (2; mapped at capture,
   * PreMulSum excepted). The copy path refuses capture (below). */
  for (int reg = 0; reg <= 2 && !sharedCopy; reg += 2) {
    char what[32];
    snprintf(what, sizeof(what), "graph/register=%d", reg);
    setenv("GCOMM_GRAPH_REGISTER", reg ? "2" : "0", 1);
    gcommComm_t comm;
    CK(gcommCommInitMPI(&comm, MPI_COMM_WORLD, NULL));
    int before = failures;
    for (int f = 0; f < 8; f++) {
      int isRed = f == 0 || f == 2 || f == 4;
      for (int dt = 0; dt < gcommNumTypes; dt++) {
        int eachSize = dt == 0 || dt == 6 || dt == 7 || dt == 8;
        if (!isRed && !eachSize) continue;
        for (int op = 0; op < (isRed ? NOPS : 1); op++) {
          if (quick && isRed && op > 0 && dt != 7 && dt != 6 && dt != gcommFloat8e4m3) continue;
          for (int c = 0; c < 3; c++)
            for (int ip = 0; ip < 2; ip++)
              runCase(comm, s, f, dt, op, counts[c], ip, seed++, what, 1);
        }
      }
    }
    if (rank == 0)
      printf("%-19s: %s (%d checks so far)\n", what, failures == before ? "ok" : "FAILED", checks);
    fflush(stdout);
    CK(gcommCommDestroy(comm));
    unsetenv("GCOMM_GRAPH_REGISTER");
  }

  /* send/recv around the ring, a fused group, and graph capture */
  gcommComm_t comm;
  CK(gcommCommInitMPI(&comm, MPI_COMM_WORLD, NULL));
  {
    /* 1.6 MB: the all-reduce takes Simple fan steps, so the group runs as three launches (the
     * send and receive, the all-reduce, the all-gather); the graph captures the direct kernel
     * (GCOMM_GRAPH_REGISTER's default), and the eager all-reduce after it the FAN kernel */
    size_t cnt = 400003;
    float* h = malloc(cnt * 4 * 3);
    for (size_t i = 0; i < cnt; i++) h[i] = (float)(rank * 1000 + i % 1000);
    float *dA, *dB, *dC, *dD;
    CU(cudaMalloc((void**)&dA, cnt * 4));
    CU(cudaMalloc((void**)&dB, cnt * 4));
    CU(cudaMalloc((void**)&dC, cnt * 4));
    CU(cudaMalloc((void**)&dD, cnt * 4 * nranks));
    CU(cudaMemcpy(dA, h, cnt * 4, cudaMemcpyHostToDevice));
    CU(cudaMemset(dB, 0xff, cnt * 4));
    int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
    CK(gcommGroupStart());
    CK(gcommRecv(dB, cnt, gcommFloat, prev, comm, s));
    CK(gcommSend(dA, cnt, gcommFloat, next, comm, s));
    CK(gcommAllReduce(dA, dC, cnt, gcommFloat, gcommSum, comm, s));
    CK(gcommAllGather(dA, dD, cnt, gcommFloat, comm, s));
    CK(gcommGroupEnd());
    CK(gcommWait(comm, s));
    float* g = malloc(cnt * 4 * nranks);
    int bad = 0;
    CU(cudaMemcpy(g, dB, cnt * 4, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < cnt; i++) bad += g[i] != (float)(prev * 1000 + i % 1000);
    CU(cudaMemcpy(g, dC, cnt * 4, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < cnt; i++)
      bad += g[i] != (float)(1000 * nranks * (nranks - 1) / 2 + nranks * (i % 1000));
    CU(cudaMemcpy(g, dD, cnt * 4 * nranks, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < cnt * nranks; i++)
      bad += g[i] != (float)((i / cnt) * 1000 + (i % cnt) % 1000);
    checks++;
    if (bad) {
      failures++;
      fprintf(stderr, "FAIL rank %d: group send/recv/allreduce/allgather: %d bad elements\n", rank,
              bad);
    }
    if (rank == 0) printf("group send/recv+allreduce+allgather: %s\n", bad ? "FAILED" : "ok");

    bad = sharedCopy ? captureRefused(comm, s, dA, cnt) : graphCapture(comm, s, dA, h, g, cnt);
    if (!sharedCopy) {
      for (size_t i = 0; i < cnt; i++) g[i] = 1.0f;
      bad += graphChain(comm, s, dA, dB, dD, g, cnt);
      bad += graphRelease(comm, s, dA, cnt);
    }
    checks++;
    if (bad) {
      failures++;
      fprintf(stderr, "FAIL rank %d: graph-captured calls: %d bad elements\n", rank, bad);
    }
    if (rank == 0)
      printf("graph capture: %s\n", bad ? "FAILED" : sharedCopy ? "refused (copy path)" : "ok");
    /* argument checks on a GPU comm */
    gcommResult_t r = gcommAllReduce(NULL, dA, 4, gcommFloat, gcommSum, comm, s);
    gcommResult_t r2 = gcommAllReduce(h, dA, 4, gcommFloat, gcommSum, comm, s);
    if (r != gcommInvalidArgument || r2 != gcommInvalidArgument) {
      failures++;
      fprintf(stderr, "FAIL rank %d: NULL / host pointer accepted (%d %d)\n", rank, r, r2);
    }
    free(h);
    free(g);
    cudaFree(dA), cudaFree(dB), cudaFree(dC), cudaFree(dD);
  }
  CK(gcommCommDestroy(comm));
  int total = 0;
  MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0)
    printf("%s: %d ranks on %d GPU(s), %d checks per rank, %d failures\n",
           total ? "FAILED" : "PASSED", nranks, ndev < nranks ? ndev : nranks, checks, total);
  MPI_Finalize();
  return total != 0;
}
