/*
 * test_init.c - a communicator made under the environment as given, used once, destroyed.
 *
 * test/test_fault.sh runs it in hostile environments (a small /dev/shm, GCOMM_* settings that
 * differ between ranks, bad logging settings, leftover segments) and checks what it prints, its
 * log and /dev/shm; test/run.sh runs it plain. Init must succeed, or, when TEST_INIT_REFUSAL is
 * set, may fail on every rank with a message that contains that text (never succeed on some
 * ranks and fail on others, never die on a signal). After a successful init: an all-to-all of
 * TEST_INIT_BYTES (default 1 MiB) to each peer and an all-reduce, both checked.
 */
#include "test/testlib.h"

static void useComm(gcommComm_t comm) {
  size_t bytes = getenv("TEST_INIT_BYTES") ? strtoull(getenv("TEST_INIT_BYTES"), NULL, 0) : 1 << 20;
  size_t count = bytes / 4, n = (size_t)tlNranks;
  int32_t* in = malloc(count * n * 4);
  int32_t* out = malloc(count * n * 4);
  for (size_t i = 0; i < count * n; i++) in[i] = (int32_t)(tlRank * 1000003 + i);
  TL_OK(comm, gcommAllToAll(in, out, count, gcommInt32, comm, NULL));
  TL_OK(comm, gcommWait(comm, NULL));
  for (size_t p = 0; p < n && !tlLocalFailed; p++)
    for (size_t i = 0; i < count && !tlLocalFailed; i++)
      if (out[p * count + i] != (int32_t)(p * 1000003 + tlRank * count + i))
        tlFail("all-to-all: element %zu from rank %zu is %d", i, p, (int)out[p * count + i]);
  tlReport("init: all-to-all of %zu bytes to each peer", bytes);
  int64_t x = tlRank + 1;
  TL_OK(comm, gcommAllReduce(&x, &x, 1, gcommInt64, gcommSum, comm, NULL));
  TL_OK(comm, gcommWait(comm, NULL));
  if (x != (int64_t)tlNranks * (tlNranks + 1) / 2) tlFail("all-reduce gave %lld", (long long)x);
  tlReport("init: all-reduce");
  free(in);
  free(out);
}

int main(int argc, char** argv) {
  tlInit(&argc, &argv);
  const char* refusal = getenv("TEST_INIT_REFUSAL");
  gcommComm_t comm = NULL;
  gcommResult_t res = gcommCommInitMPI(&comm, MPI_COMM_WORLD, NULL);
  int ok = res == gcommSuccess, all = 0, any = 0;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&ok, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (all) {
    tlReport("init: gcommCommInitMPI");
    useComm(comm);
    tlBarrier(MPI_COMM_WORLD);
    tlCommDestroy(comm);
    tlReport("init: destroy");
  } else {
    const char* msg = gcommGetLastError(NULL);
    if (any)
      tlFail("init succeeded on some ranks and failed on others (here: %s)", ok ? "success" : msg);
    else if (refusal == NULL || strstr(msg, refusal) == NULL)
      tlFail("init failed: %s", msg);
    if (ok) gcommCommDestroy(comm);
    tlReport("init: refused on every rank, saying \"%s\"", refusal ? refusal : "");
    if (tlRank == 0) printf("# rank 0: %s\n", msg);
  }
  return tlFinish("test_init");
}
