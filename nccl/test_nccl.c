/*
 * test_nccl.c - gcomm's libnccl.so.2 through NCCL's own API (NVIDIA's nccl.h), on GPUs: what
 * nccl-tests does not reach. Communicators of all of MPI_COMM_WORLD made in a group, two disjoint
 * ones made at once from two ids (each id passed point to point, no WORLD collective), split;
 * results against MPI's collectives; PreMulSum with a host scalar; all-to-all in place; the
 * refusals (several GPUs in one process, a bad config, a foreign id, MPI not initialised).
 *   mpiexec -n 4 build/nccl/test_nccl           (rank r on GPU r mod the GPU count)
 *   build/nccl/test_nccl --no-mpi               (one process that never calls MPI_Init)
 */
#define _GNU_SOURCE
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <libgen.h>
#include <limits.h>
#include <unistd.h>
#include <nccl.h>

#include "../test/testlib.h"

#define COUNT 1000 /* an odd size: not a multiple of any vector width */

static int ncclOk(ncclResult_t res, const char* call, int line) {
  if (res != ncclSuccess)
    tlFail("line %d: %s returned %s (%s)", line, call, ncclGetErrorString(res),
           ncclGetLastError(NULL));
  return res == ncclSuccess;
}
#define NCCL_OK(call) ncclOk((call), #call, __LINE__)

/* Expects a refusal with result want and a last-error message containing word. */
static void expectRefused(ncclResult_t got, ncclResult_t want, const char* word, const char* what) {
  const char* msg = ncclGetLastError(NULL);
  if (got != want)
    tlFail("%s returned %s, not %s (%s)", what, ncclGetErrorString(got), ncclGetErrorString(want),
           msg);
  else if (strstr(msg, word) == NULL)
    tlFail("%s: the last error '%s' does not say '%s'", what, msg, word);
}

/* AllReduce (sum, or PreMulSum with scalar rank+1 when preMul) of random int32 on comm, checked
 * against MPI_Allreduce over mpiComm (the same ranks in the same order). */
static void checkAllReduce(ncclComm_t comm, MPI_Comm mpiComm, int preMul) {
  int32_t in[COUNT], out[COUNT], ref[COUNT], *dev = NULL;
  int rank = -1, n = 0, mpiRank;
  MPI_Comm_rank(mpiComm, &mpiRank);
  if (!NCCL_OK(ncclCommUserRank(comm, &rank)) || !NCCL_OK(ncclCommCount(comm, &n))) return;
  if (rank != mpiRank) tlFail("ncclCommUserRank %d, MPI rank %d", rank, mpiRank);
  tlFillRandom(in, COUNT, gcommInt32, tlSeed ^ (uint64_t)tlRank, 0);
  for (int i = 0; i < COUNT; i++) in[i] %= 1000, ref[i] = in[i] * (preMul ? rank + 1 : 1);
  MPI_Allreduce(MPI_IN_PLACE, ref, COUNT, MPI_INT32_T, MPI_SUM, mpiComm);
  ncclRedOp_t op = ncclSum;
  int32_t scalar = rank + 1;
  if (preMul &&
      !NCCL_OK(ncclRedOpCreatePreMulSum(&op, &scalar, ncclInt32, ncclScalarHostImmediate, comm)))
    return;
  cudaMalloc((void**)&dev, sizeof(in));
  cudaMemcpy(dev, in, sizeof(in), cudaMemcpyHostToDevice);
  if (NCCL_OK(ncclAllReduce(dev, dev, COUNT, ncclInt32, op, comm, NULL))) {
    cudaMemcpy(out, dev, sizeof(out), cudaMemcpyDeviceToHost);
    for (int i = 0; i < COUNT; i++)
      if (out[i] != ref[i]) {
        tlFail("element %d: %d, MPI says %d", i, out[i], ref[i]);
        break;
      }
  }
  if (preMul) NCCL_OK(ncclRedOpDestroy(op, comm));
  cudaFree(dev);
}

/* All-to-all in place (sendbuff == recvbuff) against MPI_Alltoall. */
static void checkAllToAllInPlace(ncclComm_t comm, int n) {
  size_t total = (size_t)n * COUNT;
  int32_t* in = malloc(total * sizeof(int32_t));
  int32_t* out = malloc(total * sizeof(int32_t));
  int32_t* ref = malloc(total * sizeof(int32_t));
  int32_t* dev = NULL;
  tlFillRandom(in, total, gcommInt32, tlSeed ^ (uint64_t)tlRank << 8, 0);
  MPI_Alltoall(in, COUNT, MPI_INT32_T, ref, COUNT, MPI_INT32_T, MPI_COMM_WORLD);
  cudaMalloc((void**)&dev, total * sizeof(int32_t));
  cudaMemcpy(dev, in, total * sizeof(int32_t), cudaMemcpyHostToDevice);
  if (NCCL_OK(ncclAlltoAll(dev, dev, COUNT, ncclInt32, comm, NULL))) {
    cudaMemcpy(out, dev, total * sizeof(int32_t), cudaMemcpyDeviceToHost);
    size_t bad = 0, first = total;
    for (size_t i = 0; i < total; i++)
      if (out[i] != ref[i]) bad++, first = first < i ? first : i;
    if (bad)
      tlFail(
          "differs from MPI_Alltoall at %zu of %zu elements, the first at %zu (block %zu): %d, "
          "not %d (input there: %d)",
          bad, total, first, first / COUNT, out[first], ref[first], in[first]);
  }
  cudaFree(dev);
  free(in), free(out), free(ref);
}

/* Two disjoint communicators made at once: each half's first rank makes an id and sends it to
 * the rest of its half point to point; nothing is called by all of WORLD. */
static void checkHalves(void) {
  int half = tlRank < tlNranks / 2 ? 0 : 1, first = half ? tlNranks / 2 : 0;
  int size = half ? tlNranks - tlNranks / 2 : tlNranks / 2;
  ncclUniqueId id;
  ncclComm_t comm = NULL;
  MPI_Comm ref;
  MPI_Comm_split(MPI_COMM_WORLD, half, tlRank, &ref); /* the test's reference only */
  if (tlRank == first) {
    NCCL_OK(ncclGetUniqueId(&id));
    for (int r = first + 1; r < first + size; r++)
      MPI_Send(&id, sizeof(id), MPI_BYTE, r, 7, MPI_COMM_WORLD);
  } else {
    MPI_Recv(&id, sizeof(id), MPI_BYTE, first, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  }
  if (NCCL_OK(ncclCommInitRank(&comm, size, id, tlRank - first))) {
    checkAllReduce(comm, ref, 0);
    NCCL_OK(ncclCommDestroy(comm));
  }
  MPI_Comm_free(&ref);
}

static void checkSplit(ncclComm_t world) {
  ncclComm_t odd = NULL;
  MPI_Comm ref;
  MPI_Comm_split(MPI_COMM_WORLD, tlRank % 2, tlRank, &ref);
  if (NCCL_OK(ncclCommSplit(world, tlRank % 2, tlRank, &odd, NULL)) && odd != NULL) {
    checkAllReduce(odd, ref, 0);
    NCCL_OK(ncclCommDestroy(odd));
  } else if (odd == NULL) {
    tlFail("ncclCommSplit gave no communicator");
  }
  MPI_Comm_free(&ref);
}

/* Each rank alone: two ranks of one id in one group, ncclCommInitAll of 2, bad config and id. */
static void checkRefusals(void) {
  ncclUniqueId id, zero;
  ncclComm_t a = NULL, b = NULL, all[2];
  NCCL_OK(ncclGetUniqueId(&id));
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclCommInitRank(&a, 2, id, 0));
  expectRefused(ncclCommInitRank(&b, 2, id, 1), ncclInvalidUsage, "one process",
                "a second rank of one id in one group");
  expectRefused(ncclGroupEnd(), ncclInvalidUsage, "one process", "its ncclGroupEnd");
  NCCL_OK(ncclCommDestroy(a));
  expectRefused(ncclCommInitAll(all, 2, NULL), ncclInvalidUsage, "one rank",
                "ncclCommInitAll of 2 devices");
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.magic = 0;
  expectRefused(ncclCommInitRankConfig(&a, 1, id, 0, &config), ncclInvalidArgument,
                "NCCL_CONFIG_INITIALIZER", "a config not made by NCCL_CONFIG_INITIALIZER");
  memset(&zero, 0, sizeof(zero));
  expectRefused(ncclCommInitRank(&a, 1, zero, 0), ncclInvalidArgument, "ncclGetUniqueId",
                "an id not made by ncclGetUniqueId");
}

static int noMpi(void) {
  ncclUniqueId id;
  ncclComm_t comm;
  ncclResult_t r1 = ncclGetUniqueId(&id);
  ncclResult_t r2 = ncclCommInitRank(&comm, 1, id, 0);
  int ok = r1 == ncclInvalidUsage && r2 == ncclInvalidUsage &&
           strstr(ncclGetLastError(NULL), "MPI_Init") != NULL;
  printf("%s without MPI_Init: ncclGetUniqueId and ncclCommInitRank refuse (%s)\n",
         ok ? "PASS" : "FAIL", ncclGetLastError(NULL));
  printf("%d passed, %d failed\n", ok, !ok);
  return ok ? 0 : 1;
}

/* The libnccl.so.2 this process runs is gcomm's, the one beside the test (the Makefile links it
 * there with an RPATH that LD_LIBRARY_PATH cannot override): a machine with NVIDIA's NCCL on
 * LD_LIBRARY_PATH would otherwise test that instead. */
static void checkLibrary(void) {
  Dl_info info;
  char exe[PATH_MAX], lib[PATH_MAX];
  ssize_t len = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (len <= 0 || !dladdr((void*)ncclGetVersion, &info) || info.dli_fname == NULL ||
      realpath(info.dli_fname, lib) == NULL) {
    tlFail("cannot tell which libnccl.so.2 is loaded");
    return;
  }
  exe[len] = 0;
  char* dir = dirname(exe);
  if (strncmp(lib, dir, strlen(dir)) != 0 || lib[strlen(dir)] != '/')
    tlFail("the NCCL library loaded is %s, not gcomm's beside this test in %s", lib, dir);
}

int main(int argc, char** argv) {
  if (argc > 1 && strcmp(argv[1], "--no-mpi") == 0) return noMpi();
  tlInit(&argc, &argv);
  int ngpus = 0, version = 0;
  cudaGetDeviceCount(&ngpus);
  cudaSetDevice(ngpus > 0 ? tlRank % ngpus : 0);
  if (!NCCL_OK(ncclGetVersion(&version)) || version != NCCL_VERSION_CODE)
    tlFail("ncclGetVersion %d, the header's %d", version, NCCL_VERSION_CODE);
  tlReport("ncclGetVersion is the header's");
  checkLibrary();
  tlReport("the library under test is gcomm's libnccl.so.2");

  ncclUniqueId id;
  ncclComm_t world = NULL;
  if (tlRank == 0) NCCL_OK(ncclGetUniqueId(&id));
  MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.commName = "world";
  NCCL_OK(ncclGroupStart()); /* as nccl-tests: the init runs at ncclGroupEnd */
  NCCL_OK(ncclCommInitRankConfig(&world, tlNranks, id, tlRank, &config));
  NCCL_OK(ncclGroupEnd());
  int device = -1;
  if (world && NCCL_OK(ncclCommCuDevice(world, &device)) && device != tlRank % ngpus)
    tlFail("ncclCommCuDevice %d, current device %d", device, tlRank % ngpus);
  if (tlReport("ncclCommInitRankConfig in a group over WORLD (%d ranks)", tlNranks)) {
    checkAllReduce(world, MPI_COMM_WORLD, 0);
    tlReport("ncclAllReduce int32 sum in place, against MPI");
    checkAllReduce(world, MPI_COMM_WORLD, 1);
    tlReport("ncclAllReduce with ncclRedOpCreatePreMulSum (host scalar rank+1), against MPI");
    checkAllToAllInPlace(world, tlNranks);
    tlReport("ncclAlltoAll in place, against MPI_Alltoall");
    checkSplit(world);
    tlReport("ncclCommSplit by rank parity, then ncclAllReduce");
  }
  checkHalves();
  tlReport("two disjoint communicators made at once from two ids");
  checkRefusals();
  tlReport("refusals: two ranks in one process, ncclCommInitAll(2), bad config, foreign id");
  if (world) NCCL_OK(ncclCommDestroy(world));
  tlReport("ncclCommDestroy");
  if (tlRank == 0) printf("%d passed, %d failed\n", tlPassed, tlFailed);
  return tlFinish("test_nccl");
}
