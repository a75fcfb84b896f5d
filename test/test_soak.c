/*
 * test_soak.c - many collectives on one communicator: memory, file descriptors and /dev/shm must
 * not grow, and results stay right.
 *
 * TEST_SOAK_SMALL small operations (default 2000; test/test_fault.sh sets TEST_SOAK=1: 100000)
 * cycle through AllReduce, Broadcast, AllGather, ReduceScatter, AllToAll and a ring of Send/Recv
 * in a group, 8 in flight between waits (each with its own buffers), every 64th checked;
 * TEST_SOAK_LARGE 4 MiB all-reduces (default 10; with TEST_SOAK=1: 1000), each checked; every 5000
 * small ones a split communicator is made, used and destroyed. The baseline (RSS, open fds, this
 * process's /dev/shm entries) is taken after a warm-up; at the end RSS may have grown by at most 4
 * MiB on any rank and the fds and /dev/shm entries not at all.
 */
#include <dirent.h>

#include "test/testlib.h"

typedef struct {
  double rssMiB;
  int fds, shm;
} Usage;

static Usage usage(void) {
  Usage u = {0, 0, 0};
  char line[256], prefix[64];
  FILE* f = fopen("/proc/self/status", "r");
  while (f && fgets(line, sizeof(line), f))
    if (!strncmp(line, "VmRSS:", 6)) u.rssMiB = atof(line + 6) / 1024;
  if (f) fclose(f);
  DIR* d = opendir("/proc/self/fd");
  for (struct dirent* e; d && (e = readdir(d));) u.fds += e->d_name[0] != '.';
  if (d) closedir(d);
  snprintf(prefix, sizeof(prefix), "gcomm-%d-", (int)getpid());
  d = opendir("/dev/shm");
  for (struct dirent* e; d && (e = readdir(d));)
    u.shm += !strncmp(e->d_name, prefix, strlen(prefix));
  if (d) closedir(d);
  return u;
}

static long envLong(const char* name, long dflt) {
  const char* v = getenv(name);
  return v && *v ? atol(v) : dflt;
}

#define SMALL 64        /* elements (float32) of a small operation, per rank and block */
#define LARGE (1 << 20) /* elements of a large all-reduce: 4 MiB */

/* Small operation i; when check, verifies the result (inputs: rank + 1 + i % 7). */
static void small(gcommComm_t comm, long i, float* in, float* out, int check) {
  int n = tlNranks, r = tlRank;
  float v = (float)(r + 1 + i % 7);
  for (int k = 0; k < SMALL * n; k++) in[k] = v;
  switch (i % 6) {
    case 0:
      TL_OK(comm, gcommAllReduce(in, out, SMALL, gcommFloat32, gcommSum, comm, NULL));
      break;
    case 1:
      TL_OK(comm, gcommBroadcast(in, out, SMALL, gcommFloat32, (int)(i % n), comm, NULL));
      break;
    case 2:
      TL_OK(comm, gcommAllGather(in, out, SMALL, gcommFloat32, comm, NULL));
      break;
    case 3:
      TL_OK(comm, gcommReduceScatter(in, out, SMALL, gcommFloat32, gcommMax, comm, NULL));
      break;
    case 4:
      TL_OK(comm, gcommAllToAll(in, out, SMALL, gcommFloat32, comm, NULL));
      break;
    case 5:
      TL_OK(comm, gcommGroupStart());
      TL_OK(comm, gcommSend(in, SMALL, gcommFloat32, (r + 1) % n, comm, NULL));
      TL_OK(comm, gcommRecv(out, SMALL, gcommFloat32, (r - 1 + n) % n, comm, NULL));
      TL_OK(comm, gcommGroupEnd());
      break;
  }
  if (!check) return;
  TL_OK(comm, gcommWait(comm, NULL));
  float base = (float)(1 + i % 7), want;
  for (int k = 0; k < SMALL * (i % 6 == 2 || i % 6 == 4 ? n : 1) && !tlLocalFailed; k++) {
    int from = k / SMALL; /* AllGather, AllToAll: block k / SMALL came from that rank */
    switch (i % 6) {
      case 0:
        want = base * n + (float)(n * (n - 1) / 2);
        break;
      case 1:
        want = base + (float)(i % n);
        break;
      case 3:
        want = base + (float)(n - 1);
        break;
      case 5:
        want = base + (float)((r - 1 + n) % n);
        break;
      default:
        want = base + (float)from;
    }
    if (out[k] != want)
      tlFail("small operation %ld (kind %ld): element %d is %g, expected %g", i, i % 6, k, out[k],
             want);
  }
}

/* Large all-reduce i, checked. */
static void large(gcommComm_t comm, long i, float* big) {
  for (int k = 0; k < LARGE; k += 4096) big[k] = (float)(tlRank + i % 3);
  TL_OK(comm, gcommAllReduce(big, big, LARGE, gcommFloat32, gcommSum, comm, NULL));
  TL_OK(comm, gcommWait(comm, NULL));
  float want = (float)(tlNranks * (i % 3) + tlNranks * (tlNranks - 1) / 2);
  if (big[0] != want || big[LARGE - 4096] != want)
    tlFail("large all-reduce %ld: %g, expected %g", i, big[0], want);
}

/* Small operations [from, to), 8 in flight, a split communicator every 5000. */
static void smalls(gcommComm_t comm, long from, long to, float* in, float* out) {
  for (long i = from; i < to && !tlLocalFailed; i++) {
    size_t slot = (size_t)(i % 8) * SMALL * tlNranks; /* free again: waited at i % 8 == 7 */
    small(comm, i, in + slot, out + slot, i % 64 == 0);
    if (i % 8 == 7) TL_OK(comm, gcommWait(comm, NULL));
    if (i % 5000 == 4999) { /* a communicator made, used and destroyed */
      gcommComm_t half = NULL;
      TL_OK(comm, gcommWait(comm, NULL));
      TL_OK(comm, gcommCommSplit(comm, tlRank % 2, 0, &half, NULL));
      if (half) {
        TL_OK(half, gcommAllReduce(in, out, SMALL, gcommFloat32, gcommSum, half, NULL));
        TL_OK(half, gcommWait(half, NULL));
        TL_OK(half, gcommCommDestroy(half));
      }
    }
  }
  TL_OK(comm, gcommWait(comm, NULL));
}

int main(int argc, char** argv) {
  tlInit(&argc, &argv);
  int soak = getenv("TEST_SOAK") != NULL;
  long nSmall = envLong("TEST_SOAK_SMALL", soak ? 100000 : 2000);
  long nLarge = envLong("TEST_SOAK_LARGE", soak ? 1000 : 10);
  gcommComm_t comm = tlCommInitEnv(MPI_COMM_WORLD, "", -1);
  if (!tlReport("soak: init")) return tlFinish("test_soak");
  float* in = malloc(sizeof(float) * 8 * SMALL * tlNranks);
  float* out = malloc(sizeof(float) * 8 * SMALL * tlNranks);
  float* big = malloc(sizeof(float) * LARGE);
  /* the baseline, after a warm-up has touched every FIFO page and buffer */
  long warm = 5000;
  smalls(comm, 0, warm, in, out);
  for (long i = 0; i < 3; i++) large(comm, i, big);
  tlBarrier(MPI_COMM_WORLD);
  Usage start = usage();
  double t0 = tlNow();
  smalls(comm, warm, warm + nSmall, in, out);
  double tSmall = tlNow() - t0;
  for (long i = 0; i < nLarge && !tlLocalFailed; i++) large(comm, i, big);
  double tLarge = tlNow() - t0 - tSmall;
  Usage end = usage();
  double grow = end.rssMiB - start.rssMiB, maxGrow, startMax, endMax;
  MPI_Allreduce(&grow, &maxGrow, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  MPI_Allreduce(&start.rssMiB, &startMax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  MPI_Allreduce(&end.rssMiB, &endMax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  if (grow > 4) tlFail("RSS grew by %.1f MiB (%.1f -> %.1f)", grow, start.rssMiB, end.rssMiB);
  if (end.fds != start.fds) tlFail("open fds went from %d to %d", start.fds, end.fds);
  if (end.shm != start.shm) tlFail("/dev/shm entries went from %d to %d", start.shm, end.shm);
  tlReport(
      "soak: %ld small (%.1f s, %.0f us each) and %ld large 4 MiB all-reduces (%.1f s) on %d "
      "ranks; RSS %.1f -> %.1f MiB (max over ranks; most growth %.2f MiB), fds %d -> %d, "
      "/dev/shm %d -> %d",
      nSmall, tSmall, tSmall / (nSmall ? nSmall : 1) * 1e6, nLarge, tLarge, tlNranks, startMax,
      endMax, maxGrow, start.fds, end.fds, start.shm, end.shm);
  free(in);
  free(out);
  free(big);
  tlCommDestroy(comm);
  tlReport("soak: destroy");
  return tlFinish("test_soak");
}
