/*
 * test_shrink.c - gcommCommRevoke and gcommCommShrink.
 *
 * Without TEST_KILL_RANK (test/run.sh, every rank count): bad arguments refused with
 * gcommInvalidArgument and nothing changed; a DEFAULT shrink without a failure (the last rank
 * excluded and not calling, then every rank), the new communicator's all-reduces checked against
 * a serial sum and the old communicator still usable; a revoke by rank 0 reaching ranks that wait
 * on each other and a rank that waits on nobody (gcommRevoked, long before GCOMM_TIMEOUT_MS),
 * then an ABORT shrink of every rank that works; a live rank that neither calls nor is excluded
 * (gcommTimeout naming it); survivors that disagree (gcommInvalidUsage).
 *
 * TEST_KILL_RANK=k (test/test_fault.sh, under mpiexec -disable-auto-cleanup): rank k is SIGKILLed
 * TEST_KILL_AFTER_MS (3) into a 32 MiB all-reduce. Each survivor's wait must fail naming rank k;
 * it then shrinks (GCOMM_SHRINK_ABORT, excluding rank k, or with TEST_SHRINK_AUTO=1 excluding
 * nobody: the dead rank is found) and runs 100 all-reduces on the new communicator, each checked
 * against the sum over the survivors, all without MPI. Each survivor prints its PASS/FAIL line
 * with the time from the all-reduce's start (the death is 3 ms later) to the last check, and
 * writes it to TEST_SHRINK_DIR/rankR.
 */
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testlib.h"

#define ITERS 100

/* Rank r's input of all-reduce it, element i: small, so sums of int32 are exact. */
static int32_t inputOf(int r, int it, size_t i) {
  return (int32_t)(tlHash3(tlSeed, (uint64_t)r, (uint64_t)it << 32 | i) & 0xffff);
}

/* ITERS all-reduces of odd sizes on comm, whose rank j was rank members[j] of the world: each
 * result checked against the serial sum. Returns 0 or the first failure's message in why. */
static int allReducesRight(gcommComm_t comm, const int* members, int n, char* why, size_t len) {
  int me = -1;
  gcommCommUserRank(comm, &me);
  size_t maxCount = 4096 + 7;
  int32_t* buf = malloc(maxCount * sizeof(int32_t));
  for (int it = 0; it < ITERS; it++) {
    size_t count = 4096 + (size_t)(it % 8);
    for (size_t i = 0; i < count; i++) buf[i] = inputOf(members[me], it, i);
    gcommResult_t res = gcommAllReduce(buf, buf, count, gcommInt32, gcommSum, comm, NULL);
    if (res == gcommSuccess) res = gcommWait(comm, NULL);
    if (res != gcommSuccess) {
      snprintf(why, len, "all-reduce %d: %s (%s)", it, gcommGetErrorString(res),
               gcommGetLastError(comm));
      free(buf);
      return 1;
    }
    for (size_t i = 0; i < count; i++) {
      int32_t want = 0;
      for (int j = 0; j < n; j++) want += inputOf(members[j], it, i);
      if (buf[i] != want) {
        snprintf(why, len, "all-reduce %d element %zu: %d, expected %d", it, i, buf[i], want);
        free(buf);
        return 1;
      }
    }
  }
  free(buf);
  return 0;
}

static void expectCode(gcommResult_t got, gcommResult_t want, const char* what) {
  if (got != want)
    tlFail("%s: returned %s, expected %s (%s)", what, gcommGetErrorString(got),
           gcommGetErrorString(want), gcommGetLastError(NULL));
}

static void badArguments(gcommComm_t comm) {
  int n = tlNranks, bad[2] = {0, 0};
  gcommComm_t out = (gcommComm_t)&n; /* must become NULL */
  expectCode(gcommCommShrink(comm, NULL, 0, NULL, NULL, GCOMM_SHRINK_DEFAULT), gcommInvalidArgument,
             "newcomm NULL");
  expectCode(gcommCommShrink(comm, NULL, 0, &out, NULL, 7), gcommInvalidArgument, "flags 7");
  if (out != NULL) tlFail("a refused shrink left *newcomm set");
  expectCode(gcommCommShrink(comm, NULL, -1, &out, NULL, 0), gcommInvalidArgument, "nExclude -1");
  expectCode(gcommCommShrink(comm, NULL, n, &out, NULL, 0), gcommInvalidArgument, "nExclude n");
  expectCode(gcommCommShrink(comm, NULL, n > 1 ? 1 : 0, &out, NULL, 0),
             n > 1 ? gcommInvalidArgument : gcommSuccess, "excludeRanks NULL");
  if (out != NULL) TL_OK(out, gcommCommDestroy(out)), out = NULL; /* 1 rank: a shrink of itself */
  bad[0] = n;
  expectCode(gcommCommShrink(comm, bad, 1, &out, NULL, 0), gcommInvalidArgument, "rank n excluded");
  bad[0] = tlRank;
  expectCode(gcommCommShrink(comm, bad, 1, &out, NULL, 0), gcommInvalidArgument, "self excluded");
  if (n > 2) {
    bad[0] = bad[1] = (tlRank + 1) % n;
    expectCode(gcommCommShrink(comm, bad, 2, &out, NULL, 0), gcommInvalidArgument, "a rank twice");
  }
  gcommConfig_t cfg = GCOMM_CONFIG_INITIALIZER;
  cfg.magic = 0;
  expectCode(gcommCommShrink(comm, NULL, 0, &out, &cfg, 0), gcommInvalidArgument, "bad config");
  expectCode(gcommCommShrink(NULL, NULL, 0, &out, NULL, 0), gcommInvalidArgument, "comm NULL");
  if (!strstr(gcommGetLastError(NULL), "comm is NULL")) tlFail("no message for comm NULL");
  int* members = malloc((size_t)n * sizeof(int));
  for (int j = 0; j < n; j++) members[j] = j;
  char why[512];
  if (allReducesRight(comm, members, n, why, sizeof(why))) tlFail("after the refusals: %s", why);
  free(members);
  tlReport("gcommCommShrink: bad arguments refused with gcommInvalidArgument, comm unchanged");
}

/* Every rank shrinks, and shrinks the result again; then the last rank is excluded and does not
 * call (n > 1), and its own later shrink of comm is refused. */
static void shrinkDefault(gcommComm_t comm) {
  int n = tlNranks, last = n - 1, keep = n > 1 ? n - 1 : 1;
  int* members = malloc((size_t)n * sizeof(int));
  for (int j = 0; j < n; j++) members[j] = j;
  char why[512];
  gcommComm_t small = NULL;
  if (TL_OK(comm, gcommCommShrink(comm, NULL, 0, &small, NULL, GCOMM_SHRINK_DEFAULT)) ==
      gcommSuccess) {
    if (allReducesRight(small, members, n, why, sizeof(why))) tlFail("shrunk: %s", why);
    gcommComm_t again = NULL; /* a shrunk communicator shrinks too, over its own pages */
    if (TL_OK(small, gcommCommShrink(small, NULL, 0, &again, NULL, 0)) == gcommSuccess) {
      if (allReducesRight(again, members, n, why, sizeof(why))) tlFail("twice: %s", why);
      tlCommDestroy(again);
    }
    tlCommDestroy(small);
  }
  tlReport("gcommCommShrink DEFAULT of every rank, and a shrink of the shrunk communicator");
  if (n == 1 || tlRank != last) {
    double t0 = tlNow();
    if (TL_OK(comm, gcommCommShrink(comm, &last, n > 1, &small, NULL, GCOMM_SHRINK_DEFAULT)) ==
        gcommSuccess) {
      int count = -1, rank = -1;
      gcommCommCount(small, &count);
      gcommCommUserRank(small, &rank);
      if (tlRank == 0)
        printf("# DEFAULT shrink of %d ranks to %d: %.1f ms\n", n, keep, (tlNow() - t0) * 1e3);
      if (count != keep || rank != tlRank)
        tlFail("the shrunk communicator has %d ranks (want %d), this one is %d (want %d)", count,
               keep, rank, tlRank);
      else if (allReducesRight(small, members, keep, why, sizeof(why)))
        tlFail("shrunk: %s", why);
      gcommComm_t split = NULL;
      expectCode(gcommCommSplit(small, 0, 0, &split, NULL), gcommInvalidUsage,
                 "split of a shrunk communicator");
      tlCommDestroy(small);
    }
  }
  tlBarrier(MPI_COMM_WORLD); /* the shrink has marked the excluded rank */
  if (n > 1 && tlRank == last)
    expectCode(gcommCommShrink(comm, NULL, 0, &small, NULL, 0), gcommInvalidUsage,
               "the excluded rank's own shrink");
  if (allReducesRight(comm, members, n, why, sizeof(why))) tlFail("the old one after: %s", why);
  tlReport(
      "gcommCommShrink DEFAULT: the last rank excluded and absent, %d ranks go on; the old "
      "communicator still works; the excluded rank's later shrink is refused",
      keep);
  free(members);
}

/* Rank 0 revokes while ranks 1..n-2 wait in an all-reduce rank 0 never joins and rank n-1 waits
 * on nobody; then every rank shrinks with ABORT and carries on. */
static void revokeThenShrink(void) {
  gcommComm_t comm = tlCommInitEnv(MPI_COMM_WORLD, "GCOMM_TIMEOUT_MS=20000", -1);
  int n = tlNranks, idle = n - 1;
  int32_t x[64] = {0};
  /* every connection up: across nodes a first message waits for its connection, which a rank
   * makes only while its engine polls */
  TL_OK(comm, gcommAllReduce(x, x, 64, gcommInt32, gcommSum, comm, NULL));
  TL_OK(comm, gcommWait(comm, NULL));
  tlBarrier(MPI_COMM_WORLD);
  double t0 = tlNow();
  if (tlRank == 0) {
    tlSleepMs(50);
    TL_OK(comm, gcommCommRevoke(comm));
    expectCode(gcommWait(comm, NULL), gcommRevoked, "the revoking rank's wait");
  } else if (tlRank != idle) {
    gcommResult_t res = gcommAllReduce(x, x, 64, gcommInt32, gcommSum, comm, NULL);
    if (res == gcommSuccess) res = gcommWait(comm, NULL);
    expectCode(res, gcommRevoked, "a wait on the revoked communicator");
    if (!strstr(gcommGetLastError(comm), "rank 0"))
      tlFail("no rank 0 in: %s", gcommGetLastError(comm));
  } else {
    tlSleepMs(300);
    gcommResult_t async = gcommSuccess;
    TL_OK(comm, gcommCommGetAsyncError(comm, &async));
    expectCode(async, gcommRevoked, "the idle rank's gcommCommGetAsyncError");
    expectCode(gcommAllReduce(x, x, 64, gcommInt32, gcommSum, comm, NULL), gcommRevoked,
               "the idle rank's next call");
  }
  double dt = tlNow() - t0;
  if (dt > 10) tlFail("the revoke took %.1f s to arrive (the deadline was 20)", dt);
  tlReport("gcommCommRevoke on rank 0: waiting ranks and an idle rank get gcommRevoked");
  gcommComm_t fresh = NULL;
  int* members = malloc((size_t)n * sizeof(int));
  for (int j = 0; j < n; j++) members[j] = j;
  char why[512];
  if (TL_OK(comm, gcommCommShrink(comm, NULL, 0, &fresh, NULL, GCOMM_SHRINK_ABORT)) ==
      gcommSuccess) {
    if (allReducesRight(fresh, members, n, why, sizeof(why))) tlFail("after revoke: %s", why);
    tlCommDestroy(fresh);
  }
  free(members);
  tlCommDestroy(comm);
  tlReport("gcommCommShrink ABORT after a revoke: a working communicator of every rank");
}

/* The last rank neither calls nor is excluded: the others fail at the deadline, naming it. Then
 * ranks that exclude different sets fail, naming a rank that differs. */
static void shrinkMisuse(void) {
  int n = tlNranks, last = n - 1;
  gcommComm_t comm = tlCommInitEnv(MPI_COMM_WORLD, "GCOMM_TIMEOUT_MS=300", -1);
  gcommComm_t out = NULL;
  char want[32];
  snprintf(want, sizeof(want), "rank %d", last);
  if (tlRank != last) {
    expectCode(gcommCommShrink(comm, NULL, 0, &out, NULL, 0), gcommTimeout, "an absent rank");
    if (!strstr(gcommGetLastError(comm), want))
      tlFail("no \"%s\" in: %s", want, gcommGetLastError(comm));
  }
  tlCommDestroy(comm);
  tlReport("gcommCommShrink: a live rank that does not call fails the others, named");
  if (n < 3) return;
  comm = tlCommInitEnv(MPI_COMM_WORLD, "GCOMM_TIMEOUT_MS=5000", -1);
  expectCode(gcommCommShrink(comm, &last, tlRank == 0, &out, NULL, 0), gcommInvalidUsage,
             "sets that differ");
  tlCommDestroy(comm);
  tlReport("gcommCommShrink: survivors that exclude different ranks get gcommInvalidUsage");
}

/* ---- TEST_KILL_RANK: a rank dies, the survivors shrink and go on ---- */

static void report(const char* dir, const char* line) {
  fputs(line, stdout);
  fflush(stdout);
  if (dir == NULL) return;
  char path[512];
  snprintf(path, sizeof(path), "%s/rank%d", dir, tlRank);
  FILE* f = fopen(path, "w");
  if (f) fputs(line, f), fclose(f);
}

static int killRun(int victim) {
  int afterMs = getenv("TEST_KILL_AFTER_MS") ? atoi(getenv("TEST_KILL_AFTER_MS")) : 3;
  int autoExclude = getenv("TEST_SHRINK_AUTO") && atoi(getenv("TEST_SHRINK_AUTO"));
  const char* dir = getenv("TEST_SHRINK_DIR");
  gcommComm_t comm = tlCommInitEnv(MPI_COMM_WORLD, NULL, -1);
  size_t count = (size_t)8 << 20;
  float* big = malloc(count * sizeof(float));
  for (size_t i = 0; i < count; i++) big[i] = 1.0f;
  gcommAllReduce(big, big, 1024, gcommFloat32, gcommSum, comm, NULL); /* every connection up */
  gcommWait(comm, NULL);
  tlBarrier(MPI_COMM_WORLD); /* MPI's last use */
  double t0 = tlNow();
  gcommResult_t res = gcommAllReduce(big, big, count, gcommFloat32, gcommSum, comm, NULL);
  if (tlRank == victim) {
    tlSleepMs(afterMs);
    raise(SIGKILL);
  }
  if (res == gcommSuccess) res = gcommWait(comm, NULL);
  double tErr = tlNow() - t0;
  char want[32], why[600] = "", line[1600];
  snprintf(want, sizeof(want), "rank %d", victim);
  int ok = res != gcommSuccess && strstr(gcommGetLastError(comm), want) != NULL;
  if (!ok)
    snprintf(why, sizeof(why), "the wait returned %s: %s", gcommGetErrorString(res),
             gcommGetLastError(comm));
  int survivors[64], n = 0;
  for (int r = 0; r < tlNranks && r < 64; r++)
    if (r != victim) survivors[n++] = r;
  gcommComm_t small = NULL;
  double tShrink = tErr;
  if (ok) {
    res = gcommCommShrink(comm, &victim, autoExclude ? 0 : 1, &small, NULL, GCOMM_SHRINK_ABORT);
    ok = res == gcommSuccess;
    if (!ok) snprintf(why, sizeof(why), "shrink: %s", gcommGetLastError(comm));
    tShrink = tlNow() - t0;
  }
  if (ok) ok = !allReducesRight(small, survivors, n, why, sizeof(why));
  double tDone = tlNow() - t0;
  if (small != NULL && gcommCommDestroy(small) != gcommSuccess) ok = 0;
  if (gcommCommDestroy(comm) != gcommSuccess) ok = 0;
  snprintf(line, sizeof(line),
           "%s shrink: rank %d of %d: rank %d killed %d ms into a 32 MiB all-reduce; error after "
           "%.3f s, shrunk%s to %d ranks at %.3f s, %d all-reduces right at %.3f s (from the "
           "all-reduce's start)%s%s\n",
           ok ? "PASS" : "FAIL", tlRank, tlNranks, victim, afterMs, tErr,
           autoExclude ? " (dead rank found, none listed)" : "", n, tShrink, ok ? ITERS : 0, tDone,
           ok ? "" : ": ", why);
  report(dir, line);
  free(big);
  /* the survivors leave together, once every one has written its line: under Open MPI's mpirun
   * the first to leave without MPI_Finalize would end the others' runs */
  if (dir != NULL) tlAwaitFiles(dir, "rank", tlNranks, tlNranks - 1, 20);
  _exit(ok ? 0 : 1); /* MPI cannot finalise with a dead rank */
}

int main(int argc, char** argv) {
  tlInit(&argc, &argv);
  signal(SIGUSR1, SIG_IGN); /* hydra tells the survivors of a dead rank with it */
  if (getenv("TEST_KILL_RANK")) return killRun(atoi(getenv("TEST_KILL_RANK")));
  gcommComm_t comm = tlCommInitEnv(MPI_COMM_WORLD, NULL, -1);
  badArguments(comm);
  shrinkDefault(comm);
  tlCommDestroy(comm);
  revokeThenShrink();
  shrinkMisuse();
  return tlFinish("test_shrink");
}
