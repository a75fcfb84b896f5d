/*
 * test_vcoll.c - the vector collectives (AllGatherV, AllToAllV, GatherV, ScatterV) against MPI's
 * own (MPI_Allgatherv, MPI_Alltoallv, MPI_Gatherv, MPI_Scatterv) on the same random data.
 *
 * Counts are random from a seed every rank shares (so each rank knows what every pair moves),
 * about a third of them zero; blocks sit in a random order with random gaps; outputs start
 * poisoned, so the gaps must come out untouched exactly as MPI leaves them: the whole output is
 * compared byte for byte. Three datatypes, small and large counts (several FIFO slots and
 * channels), out of place, in place (where the call has a form for it) and two calls in one
 * group; the roots move. Then bad arguments (each refused, naming what is wrong) and ranks that
 * disagree on AllGatherV's counts (gcommInvalidUsage naming the count, nobody hangs).
 *
 * Built with -DTEST_ON_GPU (make CUDA=1 gpu-test: test/gpu/test_vcoll_gpu), the same comparisons
 * run on a GPU communicator: every gcomm buffer is mirrored in device memory, the collectives run
 * on the device copies and the results are copied back before they are compared with MPI's.
 */
#include "test/testlib.h"

enum { OUT_OF_PLACE, IN_PLACE, GROUPED };
static const char* const modeNames[] = {"out of place", "in place", "two in a group"};

static const struct {
  gcommDataType_t type;
  const char* name;
  size_t esz;
} types[] = {{gcommInt8, "int8", 1}, {gcommInt32, "int32", 4}, {gcommFloat64, "float64", 8}};

static gcommComm_t comm;

#ifdef TEST_ON_GPU
#include <cuda_runtime.h>

/* A host buffer and its device copy: D(p) is the device address of host address p. */
static struct {
  char *host, *dev;
  size_t bytes;
} mirrors[8];
static int nMirrors;
static cudaStream_t stream;
static const int onGpu = 1;
#define STREAM stream

static void cudaOk(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return;
  fprintf(stderr, "rank %d: %s: %s\n", tlRank, what, cudaGetErrorString(err));
  MPI_Abort(MPI_COMM_WORLD, 1);
}

static char* mirrored(char* host, size_t bytes) {
  if (nMirrors == 8) cudaOk(cudaErrorMemoryAllocation, "more than 8 mirrored buffers");
  mirrors[nMirrors].host = host, mirrors[nMirrors].bytes = bytes + 1; /* + the guard byte */
  cudaOk(cudaMalloc((void**)&mirrors[nMirrors].dev, bytes + 1), "cudaMalloc");
  nMirrors++;
  return host;
}

static void* D(const void* p) {
  for (int k = 0; k < nMirrors; k++)
    if ((const char*)p >= mirrors[k].host && (const char*)p <= mirrors[k].host + mirrors[k].bytes)
      return mirrors[k].dev + ((const char*)p - mirrors[k].host);
  return (void*)p;
}

static void copyMirrors(int toDevice) {
  for (int k = 0; k < nMirrors; k++)
    cudaOk(
        toDevice
            ? cudaMemcpy(mirrors[k].dev, mirrors[k].host, mirrors[k].bytes, cudaMemcpyHostToDevice)
            : cudaMemcpy(mirrors[k].host, mirrors[k].dev, mirrors[k].bytes, cudaMemcpyDeviceToHost),
        "cudaMemcpy");
}

static void release(char* p) {
  for (int k = 0; k < nMirrors; k++)
    if (mirrors[k].host == p) {
      cudaOk(cudaFree(mirrors[k].dev), "cudaFree");
      mirrors[k] = mirrors[--nMirrors];
      break;
    }
  free(p);
}

/* Ranks of a node take GPUs round robin (TEST_NGPUS limits how many), as test_gpu does. */
static void selectDevice(void) {
  MPI_Comm node;
  int local = 0, ndev = 0;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, tlRank, MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, &local);
  MPI_Comm_free(&node);
  cudaOk(cudaGetDeviceCount(&ndev), "cudaGetDeviceCount");
  const char* limit = getenv("TEST_NGPUS");
  if (limit && atoi(limit) > 0 && atoi(limit) < ndev) ndev = atoi(limit);
  cudaOk(cudaSetDevice(local % ndev), "cudaSetDevice");
  cudaOk(cudaStreamCreate(&stream), "cudaStreamCreate");
}
#else
static const int onGpu = 0;
#define STREAM NULL
#define D(p) (p)
static char* mirrored(char* host, size_t bytes) {
  (void)bytes;
  return host;
}
static void copyMirrors(int toDevice) {
  (void)toDevice;
}
static void release(char* p) {
  free(p);
}
#endif

/* Elements rank i sends rank j in the test seeded seed: 0 about a third of the time. */
static size_t pairCount(uint64_t seed, int i, int j, size_t max) {
  uint64_t h = tlHash3(seed, (uint64_t)i, (uint64_t)j);
  return h % 3 == 0 ? 0 : (size_t)((h >> 8) % (max + 1));
}

/* Displacements of n blocks of counts in a random order with 0-3 elements between them; returns
 * the elements the buffer spans. */
static size_t layout(uint64_t seed, const size_t* counts, int n, size_t* displs) {
  int order[64];
  for (int k = 0; k < n; k++) order[k] = k;
  for (int k = n - 1; k > 0; k--) { /* Fisher-Yates */
    int j = (int)(tlHash3(seed, 77, (uint64_t)k) % (uint64_t)(k + 1)), t = order[k];
    order[k] = order[j], order[j] = t;
  }
  size_t at = 0;
  for (int k = 0; k < n; k++) {
    at += tlHash3(seed, 78, (uint64_t)k) % 4;
    displs[order[k]] = at;
    at += counts[order[k]];
  }
  return at;
}

/* MPI's counts and displacements are ints of bytes here (MPI_BYTE: every type is copied). */
static void toMpi(const size_t* c, const size_t* d, size_t esz, int n, int* ic, int* id) {
  for (int k = 0; k < n; k++) ic[k] = (int)(c[k] * esz), id[k] = (int)(d[k] * esz);
}

static char* poisoned(size_t bytes) {
  char* p = malloc(bytes + 1);
  memset(p, TL_POISON_BYTE, bytes + 1);
  return p;
}

/* A poisoned buffer gcomm writes (mirrored on the device in the GPU build). */
static char* output(size_t bytes) {
  return mirrored(poisoned(bytes), bytes);
}

static char* randomBytes(size_t bytes, uint64_t seed) {
  char* p = malloc(bytes + 1);
  tlFillRandom(p, bytes, gcommUint8, seed, tlRank);
  return mirrored(p, bytes);
}

/* Waits, then compares got (and got2 for a group's second call) with MPI's want. */
static void finish(const char* got, const char* got2, const char* want, size_t bytes) {
  if (TL_OK(comm, gcommWait(comm, STREAM)) != gcommSuccess) return;
  copyMirrors(0);
  for (int k = 0; k < 2; k++) {
    const char* g = k ? got2 : got;
    if (g == NULL) continue;
    for (size_t i = 0; i < bytes; i++)
      if (g[i] != want[i]) {
        tlFail("%soutput byte %zu is 0x%02x, MPI's 0x%02x", k ? "second call's " : "", i,
               (unsigned char)g[i], (unsigned char)want[i]);
        return;
      }
  }
}

static void testAllGatherV(int t, size_t max, int mode, uint64_t seed) {
  int n = tlNranks, me = tlRank, ic[64] = {0}, id[64] = {0};
  size_t esz = types[t].esz, counts[64] = {0}, displs[64] = {0};
  for (int k = 0; k < n; k++) counts[k] = pairCount(seed, k, 0, max);
  size_t span = layout(seed, counts, n, displs), bytes = span * esz;
  char *send = randomBytes(counts[me] * esz, seed), *want = poisoned(bytes);
  char *got = output(bytes), *got2 = mode == GROUPED ? output(bytes) : NULL;
  toMpi(counts, displs, esz, n, ic, id);
  if (n == 1) /* MPICH 4.0's MPI_Allgatherv on one rank ignores displs[0]: the copy is the answer */
    memcpy(want + displs[0] * esz, send, counts[0] * esz);
  else
    MPI_Allgatherv(send, ic[me], MPI_BYTE, want, ic, id, MPI_BYTE, MPI_COMM_WORLD);
  const char* in = send;
  if (mode == IN_PLACE) {
    memcpy(got + displs[me] * esz, send, counts[me] * esz);
    in = got + displs[me] * esz;
  }
  copyMirrors(1);
  if (mode == GROUPED) TL_OK(comm, gcommGroupStart());
  TL_OK(comm,
        gcommAllGatherV(D(in), counts[me], D(got), counts, displs, types[t].type, comm, STREAM));
  if (mode == GROUPED) {
    TL_OK(comm,
          gcommAllGatherV(D(in), counts[me], D(got2), counts, displs, types[t].type, comm, STREAM));
    TL_OK(comm, gcommGroupEnd());
  }
  finish(got, got2, want, bytes);
  release(send), free(want), release(got), release(got2);
}

static void testAllToAllV(int t, size_t max, int mode, uint64_t seed) {
  int n = tlNranks, me = tlRank, isc[64] = {0}, isd[64] = {0}, irc[64] = {0}, ird[64] = {0};
  size_t esz = types[t].esz, sc[64] = {0}, sd[64] = {0}, rc[64] = {0}, rd[64] = {0};
  for (int k = 0; k < n; k++)
    sc[k] = pairCount(seed, me, k, max), rc[k] = pairCount(seed, k, me, max);
  size_t inBytes = layout(seed ^ (uint64_t)(2 * me + 1), sc, n, sd) * esz;
  size_t bytes = layout(seed ^ (uint64_t)(2 * me + 2), rc, n, rd) * esz;
  char *send = randomBytes(inBytes, seed), *want = poisoned(bytes), *got = output(bytes);
  char* got2 = mode == GROUPED ? output(bytes) : NULL;
  toMpi(sc, sd, esz, n, isc, isd);
  toMpi(rc, rd, esz, n, irc, ird);
  MPI_Alltoallv(send, isc, isd, MPI_BYTE, want, irc, ird, MPI_BYTE, MPI_COMM_WORLD);
  copyMirrors(1);
  if (mode == GROUPED) TL_OK(comm, gcommGroupStart());
  TL_OK(comm, gcommAllToAllV(D(send), sc, sd, D(got), rc, rd, types[t].type, comm, STREAM));
  if (mode == GROUPED) {
    TL_OK(comm, gcommAllToAllV(D(send), sc, sd, D(got2), rc, rd, types[t].type, comm, STREAM));
    TL_OK(comm, gcommGroupEnd());
  }
  finish(got, got2, want, bytes);
  release(send), free(want), release(got), release(got2);
}

static void testGatherV(int t, size_t max, int mode, uint64_t seed) {
  int n = tlNranks, me = tlRank, root = (int)(seed % (uint64_t)n), ic[64] = {0}, id[64] = {0};
  size_t esz = types[t].esz, counts[64] = {0}, displs[64] = {0};
  for (int k = 0; k < n; k++) counts[k] = pairCount(seed, k, root, max);
  size_t bytes = layout(seed, counts, n, displs) * esz;
  char *send = randomBytes(counts[me] * esz, seed), *want = poisoned(bytes);
  char *got = output(bytes), *got2 = mode == GROUPED ? output(bytes) : NULL;
  toMpi(counts, displs, esz, n, ic, id);
  MPI_Gatherv(send, ic[me], MPI_BYTE, want, ic, id, MPI_BYTE, root, MPI_COMM_WORLD);
  const char* in = send;
  if (mode == IN_PLACE && me == root) {
    memcpy(got + displs[me] * esz, send, counts[me] * esz);
    in = got + displs[me] * esz;
  }
  copyMirrors(1);
  if (mode == GROUPED) TL_OK(comm, gcommGroupStart());
  TL_OK(comm,
        gcommGatherV(D(in), counts[me], D(got), counts, displs, types[t].type, root, comm, STREAM));
  if (mode == GROUPED) {
    TL_OK(comm, gcommGatherV(D(in), counts[me], D(got2), counts, displs, types[t].type, root, comm,
                             STREAM));
    TL_OK(comm, gcommGroupEnd());
  }
  finish(me == root ? got : NULL, me == root ? got2 : NULL, want, bytes); /* root's only */
  release(send), free(want), release(got), release(got2);
}

static void testScatterV(int t, size_t max, int mode, uint64_t seed) {
  int n = tlNranks, me = tlRank, root = (int)((seed >> 8) % (uint64_t)n), ic[64] = {0},
      id[64] = {0};
  size_t esz = types[t].esz, counts[64] = {0}, displs[64] = {0};
  for (int k = 0; k < n; k++) counts[k] = pairCount(seed, root, k, max);
  size_t inBytes = layout(seed, counts, n, displs) * esz, bytes = counts[me] * esz;
  char *send = randomBytes(inBytes, seed), *want = poisoned(bytes), *got = output(bytes);
  char* got2 = mode == GROUPED ? output(bytes) : NULL;
  toMpi(counts, displs, esz, n, ic, id);
  MPI_Scatterv(send, ic, id, MPI_BYTE, want, ic[me], MPI_BYTE, root, MPI_COMM_WORLD);
  void* out = got;
  if (mode == IN_PLACE && me == root) out = send + displs[me] * esz;
  copyMirrors(1);
  if (mode == GROUPED) TL_OK(comm, gcommGroupStart());
  TL_OK(comm, gcommScatterV(D(send), counts, displs, D(out), counts[me], types[t].type, root, comm,
                            STREAM));
  if (mode == GROUPED) {
    TL_OK(comm, gcommScatterV(D(send), counts, displs, D(got2), counts[me], types[t].type, root,
                              comm, STREAM));
    TL_OK(comm, gcommGroupEnd());
  }
  finish(out, got2, want, bytes);
  release(send), free(want), release(got), release(got2);
}

static const struct {
  const char* name;
  void (*run)(int t, size_t max, int mode, uint64_t seed);
  int hasInPlace;
} colls[] = {{"AllGatherV", testAllGatherV, 1},
             {"AllToAllV", testAllToAllV, 0},
             {"GatherV", testGatherV, 1},
             {"ScatterV", testScatterV, 1}};

static void testAgainstMpi(void) {
  static const size_t maxCounts[] = {7, 3000, 70000};
  for (size_t c = 0; c < sizeof(colls) / sizeof(colls[0]); c++)
    for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); t++)
      for (size_t s = 0; s < 3; s++) {
        if (s == 2 && types[t].esz != 8) continue; /* large counts: one type is enough */
        for (int mode = OUT_OF_PLACE; mode <= GROUPED; mode++) {
          if (mode == IN_PLACE && !colls[c].hasInPlace) continue;
          colls[c].run((int)t, maxCounts[s], mode, tlNextSeed());
          tlReport("%s %s counts 0..%zu %s = MPI's", colls[c].name, types[t].name, maxCounts[s],
                   modeNames[mode]);
        }
      }
}

/* A call that must be refused with gcommInvalidArgument, naming word. */
static void expectBad(gcommResult_t res, const char* word, const char* what) {
  if (res != gcommInvalidArgument)
    tlFail("returned %s, not gcommInvalidArgument", gcommGetErrorString(res));
  else if (strstr(gcommGetLastError(comm), word) == NULL)
    tlFail("the message does not name %s: %s", word, gcommGetLastError(comm));
  tlReport("bad %s is refused, naming %s", what, word);
}

static void testBadArguments(void) {
  int n = tlNranks, me = tlRank;
  size_t counts[64] = {0}, displs[64] = {0};
  double buf[128] = {0};
  for (int k = 0; k < n; k++) counts[k] = 1, displs[k] = (size_t)k;
  expectBad(gcommAllGatherV(buf, 1, buf + 64, NULL, displs, gcommFloat64, comm, NULL), "recvcounts",
            "AllGatherV recvcounts NULL");
  expectBad(gcommAllGatherV(buf, 2, buf + 64, counts, displs, gcommFloat64, comm, NULL),
            "sendcount", "AllGatherV sendcount other than recvcounts[rank]");
  expectBad(gcommAllToAllV(buf, counts, displs, buf, counts, displs, gcommFloat64, comm, NULL),
            "overlap", "AllToAllV with sendbuff == recvbuff");
  expectBad(gcommGatherV(buf, 1, buf + 64, counts, displs, gcommFloat64, n, comm, NULL), "root",
            "GatherV root = nranks");
  expectBad(gcommScatterV(buf, counts, displs, buf + 64, 1, (gcommDataType_t)99, 0, comm, NULL),
            "datatype", "ScatterV datatype 99");
  size_t more[64];
  memcpy(more, counts, sizeof(more));
  more[me] = 2;
  expectBad(gcommAllToAllV(buf, counts, displs, buf + 64, more, displs, gcommFloat64, comm, NULL),
            "own block", "AllToAllV whose own block's send and receive counts differ");
  displs[me] = SIZE_MAX / 4;
  expectBad(gcommAllToAllV(buf, counts, displs, buf + 64, counts, displs, gcommFloat64, comm, NULL),
            "sdispls", "AllToAllV with a displacement past the address space");
  expectBad(gcommAllGatherV(buf, 1, buf + 64, counts, displs, gcommFloat64, comm, (void*)buf),
            "stream", "AllGatherV with a stream on a host communicator");
  for (int k = 0; k < n; k++) displs[k] = (size_t)k;
  expectBad(gcommAllGatherV(buf, 1, NULL, counts, displs, gcommFloat64, comm, NULL), "recvbuff",
            "AllGatherV recvbuff NULL with blocks to receive");
  expectBad(
      gcommAllToAllV(NULL, counts, displs, buf + 64, counts, displs, gcommFloat64, comm, NULL),
      "sendbuff", "AllToAllV sendbuff NULL with blocks to send");
  expectBad(gcommGatherV(NULL, 1, buf + 64, counts, displs, gcommFloat64, 0, comm, NULL),
            "sendbuff", "GatherV sendbuff NULL with a block to send");
  expectBad(gcommScatterV(buf, counts, displs, NULL, 1, gcommFloat64, 0, comm, NULL), "recvbuff",
            "ScatterV recvbuff NULL with a block to receive");
  expectBad(gcommGatherV(buf, SIZE_MAX / 4, buf + 64, counts, displs, gcommFloat64, 0, comm, NULL),
            me == 0 ? "sendcount" : "sendbuff", "GatherV sendcount past the address space");
}

/* The last rank's recvcounts say rank 0's block is one element longer than rank 0 sends. */
static void testMismatch(void) {
  int n = tlNranks, me = tlRank, odd = n - 1;
  /* across pretend nodes (test/test_net.sh) the ranks not facing the odd one learn of its stop
   * only at their deadline: test_fault covers mismatches there */
  if (n == 1 || getenv("GCOMM_HOSTID") != NULL) return;
  gcommComm_t c = tlCommInitEnv(MPI_COMM_WORLD, "GCOMM_CHECK_MISMATCH=1", -1);
  if (!tlReport("AllGatherV mismatch: init")) return;
  size_t counts[64] = {0}, displs[64] = {0};
  double send[8] = {0}, recv[64 * 9];
  for (int k = 0; k < n; k++) counts[k] = 8, displs[k] = (size_t)k * 9;
  if (me == odd) counts[0] = 9;
  gcommResult_t res =
      gcommAllGatherV(send, counts[me], recv, counts, displs, gcommFloat64, c, NULL);
  if (res == gcommSuccess) res = gcommWait(c, NULL);
  if (me == odd && res != gcommInvalidUsage)
    tlFail("the rank with other counts returned %s, not gcommInvalidUsage",
           gcommGetErrorString(res));
  else if (me == odd && strstr(gcommGetLastError(c), "count") == NULL)
    tlFail("the message does not name the count: %s", gcommGetLastError(c));
  tlReport("AllGatherV with counts that differ: gcommInvalidUsage naming the count, nobody hangs");
  tlCommDestroy(c);
  tlReport("AllGatherV mismatch: destroy");
}

int main(int argc, char** argv) {
  tlInit(&argc, &argv);
  if (tlNranks > 64) return tlFinish("test_vcoll (at most 64 ranks)");
#ifdef TEST_ON_GPU
  selectDevice();
#endif
  comm = tlCommInitEnv(MPI_COMM_WORLD, "GCOMM_BUFFSIZE=65536", -1); /* many slots per pair */
  if (!tlReport("init")) return tlFinish("test_vcoll");
  if (!onGpu) testBadArguments(); /* argument checks and mismatch detection: shared code */
  testAgainstMpi();
  tlCommDestroy(comm);
  if (!onGpu) testMismatch();
  return tlFinish("test_vcoll");
}
