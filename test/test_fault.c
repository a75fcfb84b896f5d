/*
 * test_fault.c - ranks that disagree, errors raised by the progress engine, and (run by
 * test/test_fault.sh) a hang for tools/hang_report.py to diagnose.
 *
 * mismatch  the last rank ("odd") makes a call that differs from the others' in one thing: the
 *           collective, the count, the datatype, the op, the root (also with the ranks that only
 *           send destroying the communicator at once), one collective more (a count-0 call
 *           first: the sequence numbers differ), or a Recv of another datatype than the Send.
 *           Every rank returns within seconds (GCOMM_TIMEOUT_MS is 60 s): gcommInvalidUsage, or
 *           success on a rank that only sent; a rank other than the odd one names the mismatch
 *           and the odd rank. Where every rank receives, every rank gets gcommInvalidUsage.
 *           GCOMM_CHECK_MISMATCH=0 turns it off (float32 against int32 then goes through), and
 *           ranks that disagree on GCOMM_CHECK_MISMATCH fail at init.
 * destroyed rank 0 calls one collective more while the others destroy the communicator: rank 0
 *           fails with gcommRemoteError naming one of them within seconds, not at the deadline.
 * async     a receive that is never matched, GCOMM_TIMEOUT_MS=300, nobody waits:
 *           gcommCommGetAsyncError reports gcommTimeout by itself; then a collective, a send and
 *           gcommWait all return that error instead of carrying on; destroy works.
 * hang      TEST_FAULT_HANG=k (test/test_fault.sh): six all-reduces, rank k skips the fourth;
 *           each rank writes its pid to TEST_FAULT_DIR/pid.R, then waits (the others time out).
 * TEST_FAULT_NET=1 (test/test_net.sh, ranks on pretend nodes): the cases found through the slot
 * words, and by ranks of other nodes through the stop the detecting rank sends over the network.
 * Mismatched roots (no data flows) and a destroyed peer are found through the status page that
 * ranks of one node share, so across nodes they end at the deadline: not run there.
 */
#include <errno.h>
#include <signal.h>

#include "test/testlib.h"

enum { MM_COLL, MM_COUNT, MM_TYPE, MM_OP, MM_ROOT, MM_ROOT_GONE, MM_SEQ, MM_P2P, MM_OFF, NMM };
static const struct {
  const char* what;
  const char* word; /* the detecting rank's message names the mismatch with this word */
  int everyRank;    /* every rank receives from the odd rank: every rank must fail */
} cases[NMM] = {
    [MM_COLL] = {"AllReduce against AllGather", "called", 1},
    [MM_COUNT] = {"count 1031 against 1032", "count", 1},
    [MM_TYPE] = {"float32 against int32", "datatype", 1},
    [MM_OP] = {"sum against max", "op", 1},
    [MM_ROOT] = {"Reduce to root 0 against root 1", "root", 0},
    [MM_ROOT_GONE] = {"Reduce to root 0 against root 1, the senders destroy at once", "root", 0},
    [MM_SEQ] = {"one collective more (count 0 first)", "seq", 1},
    [MM_P2P] = {"Send float32 against Recv int32", "datatype", 0},
    [MM_OFF] = {"float32 against int32 with GCOMM_CHECK_MISMATCH=0", NULL, 0},
};

#define COUNT 1031

/* Does msg contain "rank <r>" as a whole number? */
static int namesRank(const char* msg, int r) {
  char want[24];
  snprintf(want, sizeof(want), "rank %d", r);
  for (const char* p = strstr(msg, want); p; p = strstr(p + 1, want))
    if (p[strlen(want)] < '0' || p[strlen(want)] > '9') return 1;
  return 0;
}

static void testMismatch(int kind) {
  int n = tlNranks, odd = n - 1, me = tlRank, isOdd = me == odd;
  if (n == 1 && kind != MM_OFF) return; /* one rank has nobody to disagree with */
  gcommComm_t comm = tlCommInitEnv(
      MPI_COMM_WORLD, kind == MM_OFF ? "GCOMM_CHECK_MISMATCH=0" : "GCOMM_CHECK_MISMATCH=1", -1);
  if (!tlReport("mismatch %s: init", cases[kind].what)) return;
  float* in = calloc((size_t)n * (COUNT + 1), sizeof(float));
  float* out = calloc((size_t)n * (COUNT + 1), sizeof(float));
  gcommResult_t res = gcommSuccess;
  double t0 = tlNow();
  switch (kind) {
    case MM_COLL:
      res = isOdd ? gcommAllGather(in, out, COUNT, gcommFloat32, comm, NULL)
                  : gcommAllReduce(in, out, COUNT, gcommFloat32, gcommSum, comm, NULL);
      break;
    case MM_COUNT:
      res = gcommAllReduce(in, out, COUNT + isOdd, gcommFloat32, gcommSum, comm, NULL);
      break;
    case MM_TYPE:
    case MM_OFF:
      res = gcommAllReduce(in, out, COUNT, isOdd ? gcommInt32 : gcommFloat32, gcommSum, comm, NULL);
      break;
    case MM_OP:
      res = gcommAllReduce(in, out, COUNT, gcommFloat32, isOdd ? gcommMax : gcommSum, comm, NULL);
      break;
    case MM_ROOT:
    case MM_ROOT_GONE:
      res = gcommReduce(in, out, COUNT, gcommFloat32, gcommSum, isOdd ? 1 : 0, comm, NULL);
      break;
    case MM_SEQ:
      if (isOdd) res = gcommAllReduce(in, out, 0, gcommFloat32, gcommSum, comm, NULL);
      if (res == gcommSuccess)
        res = gcommAllReduce(in, out, COUNT, gcommFloat32, gcommSum, comm, NULL);
      break;
    case MM_P2P: /* rank 0 sends float32 to the odd rank, which receives int32 */
      if (me == 0) res = gcommSend(in, COUNT, gcommFloat32, odd, comm, NULL);
      if (isOdd) res = gcommRecv(out, COUNT, gcommInt32, 0, comm, NULL);
      break;
  }
  if (res == gcommSuccess) res = gcommWait(comm, NULL);
  double ms = (tlNow() - t0) * 1e3;
  const char* msg = gcommGetLastError(comm);
  /* the ranks that only send are done: their destroy must not hide the mismatch from rank 0 */
  gcommResult_t gone = gcommSuccess;
  if (kind == MM_ROOT_GONE && me != 0) gone = gcommCommDestroy(comm), msg = "", comm = NULL;
  /* the detecting side names the odd rank (P2P: the odd rank detects and names rank 0) */
  int named = kind == MM_P2P ? isOdd && namesRank(msg, 0) : !isOdd && namesRank(msg, odd);
  int detected = res == gcommInvalidUsage && named && cases[kind].word &&
                 strstr(msg, cases[kind].word) != NULL;
  int failedHere = res != gcommSuccess, all[3], mine[3] = {detected, !failedHere, failedHere};
  MPI_Allreduce(mine, all, 3, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  double maxMs;
  MPI_Allreduce(&ms, &maxMs, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  int pairOnly = kind == MM_P2P && me != 0 && !isOdd; /* not part of the pair */
  if (kind == MM_OFF) {
    if (res != gcommSuccess) tlFail("returned %s: %s", gcommGetErrorString(res), msg);
  } else if (res != gcommSuccess && res != gcommInvalidUsage) {
    tlFail("returned %s, not gcommInvalidUsage: %s", gcommGetErrorString(res), msg);
  } else if (ms > 20000) {
    tlFail("took %.0f ms: the deadline found it, not the check", ms);
  } else if (me == 0 && !all[0]) {
    tlFail("no rank named the %s and rank %d; rank 0 says: %s", cases[kind].word,
           kind == MM_P2P ? 0 : odd, msg);
  } else if (cases[kind].everyRank && !pairOnly && res != gcommInvalidUsage) {
    tlFail("returned %s: every rank receives from rank %d and should have failed",
           gcommGetErrorString(res), odd);
  }
  if (kind == MM_OFF)
    tlReport("mismatch %s: goes through unchecked", cases[kind].what);
  else
    tlReport(
        "mismatch %s: gcommInvalidUsage naming it (\"%s\") and rank %d, all ranks back in "
        "%.0f ms",
        cases[kind].what, cases[kind].word, kind == MM_P2P ? 0 : odd, maxMs);
  free(in);
  free(out);
  tlBarrier(MPI_COMM_WORLD);
  gcommResult_t d = comm ? gcommCommDestroy(comm) : gone;
  if (d != gcommSuccess && d != res) tlFail("gcommCommDestroy returned %s", gcommGetErrorString(d));
  tlReport("mismatch %s: destroy", cases[kind].what);
}

/* Ranks that disagree on GCOMM_CHECK_MISMATCH would misread each other's slots: init refuses. */
static void testCheckDisagree(void) {
  if (tlNranks == 1) return;
  setenv("GCOMM_CHECK_MISMATCH", tlRank == 0 ? "0" : "1", 1);
  gcommComm_t comm = NULL;
  gcommResult_t res = gcommCommInitMPI(&comm, MPI_COMM_WORLD, NULL);
  unsetenv("GCOMM_CHECK_MISMATCH");
  if (res == gcommSuccess) {
    tlFail("init succeeded");
    gcommCommDestroy(comm);
  } else if (res != gcommInvalidUsage && res != gcommRemoteError) {
    tlFail("init returned %s", gcommGetErrorString(res));
  } else if (!strstr(gcommGetLastError(NULL), "GCOMM_CHECK_MISMATCH") && res == gcommInvalidUsage) {
    tlFail("the message does not name GCOMM_CHECK_MISMATCH: %s", gcommGetLastError(NULL));
  }
  tlReport("mismatch: ranks that disagree on GCOMM_CHECK_MISMATCH fail at init");
}

/* Rank 0 calls one collective more; the others destroy the communicator: rank 0 learns it from
 * their status pages instead of waiting for the deadline (60 s). */
static void testDestroyed(void) {
  if (tlNranks == 1) return;
  gcommComm_t comm = tlCommInitEnv(MPI_COMM_WORLD, "", -1);
  if (!tlReport("destroyed peer: init")) return;
  static float buf[COUNT];
  if (tlRank == 0) {
    double t0 = tlNow();
    gcommResult_t res = gcommAllReduce(buf, buf, COUNT, gcommFloat32, gcommSum, comm, NULL);
    if (res == gcommSuccess) res = gcommWait(comm, NULL);
    double ms = (tlNow() - t0) * 1e3;
    const char* msg = gcommGetLastError(comm);
    if (res != gcommRemoteError || !strstr(msg, "gcommCommDestroy was called there"))
      tlFail("gcommWait returned %s: %s", gcommGetErrorString(res), msg);
    else if (ms > 20000)
      tlFail("took %.0f ms", ms);
    else
      printf("# destroyed peer: rank 0 got gcommRemoteError after %.0f ms: %s\n", ms, msg);
  }
  gcommResult_t d = gcommCommDestroy(comm);
  if (d != gcommSuccess && d != gcommRemoteError)
    tlFail("gcommCommDestroy returned %s", gcommGetErrorString(d));
  tlReport(
      "destroyed peer: a rank blocked on ranks that destroyed the communicator fails naming "
      "one");
}

/* An error raised in the progress engine while nobody waits. */
static void testAsync(void) {
  gcommComm_t comm = tlCommInitEnv(MPI_COMM_WORLD, "GCOMM_TIMEOUT_MS=300", GCOMM_PROXY_THREAD);
  if (!tlReport("async: init")) return;
  static float buf[COUNT];
  int peer = tlNranks > 1 ? 1 : 0;
  if (tlRank == 0) {
    gcommResult_t async = gcommSuccess;
    TL_OK(comm, gcommRecv(buf, COUNT, gcommFloat32, peer, comm, NULL));
    double t0 = tlNow();
    while (async == gcommSuccess && tlNow() - t0 < 10) {
      TL_OK(comm, gcommCommGetAsyncError(comm, &async));
      tlSleepMs(5);
    }
    double ms = (tlNow() - t0) * 1e3;
    gcommResult_t coll = gcommAllReduce(buf, buf, COUNT, gcommFloat32, gcommSum, comm, NULL);
    gcommResult_t send = gcommSend(buf, COUNT, gcommFloat32, peer, comm, NULL);
    gcommResult_t wait = gcommWait(comm, NULL);
    if (async != gcommTimeout)
      tlFail("gcommCommGetAsyncError gave %s after %.0f ms", gcommGetErrorString(async), ms);
    else if (coll != async || send != async || wait != async)
      tlFail("after the error: AllReduce %s, Send %s, Wait %s (want %s)", gcommGetErrorString(coll),
             gcommGetErrorString(send), gcommGetErrorString(wait), gcommGetErrorString(async));
    else if (!namesRank(gcommGetLastError(comm), peer))
      tlFail("the error does not name rank %d: %s", peer, gcommGetLastError(comm));
    else
      printf(
          "# async: gcommCommGetAsyncError saw gcommTimeout %.0f ms after the receive was posted "
          "(GCOMM_TIMEOUT_MS=300)\n",
          ms);
  }
  tlReport(
      "async: gcommCommGetAsyncError reports the engine's timeout without a wait; later "
      "calls return it");
  tlBarrier(MPI_COMM_WORLD);
  gcommResult_t d = gcommCommDestroy(comm);
  if (d != gcommSuccess && d != gcommTimeout)
    tlFail("gcommCommDestroy returned %s", gcommGetErrorString(d));
  tlReport("async: destroy after the error");
}

/* TEST_FAULT_HANG=k: rank k skips the fourth of six all-reduces, so the others hang in the
 * sixth; test/test_fault.sh signals every rank for a dump and runs tools/hang_report.py. */
static void hang(int skipper) {
  gcommComm_t comm = tlCommInitEnv(MPI_COMM_WORLD, "", -1);
  static float buf[COUNT];
  for (int i = 0; i < 6; i++)
    if (!(tlRank == skipper && i == 3))
      TL_OK(comm, gcommAllReduce(buf, buf, COUNT, gcommFloat32, gcommSum, comm, NULL));
  const char* dir = getenv("TEST_FAULT_DIR");
  char path[512];
  snprintf(path, sizeof(path), "%s/pid.%d", dir ? dir : ".", tlRank);
  FILE* f = fopen(path, "w");
  if (f) fprintf(f, "%d\n", (int)getpid()), fclose(f);
  gcommResult_t res = gcommWait(comm, NULL);
  if ((res == gcommSuccess) != (tlRank == skipper))
    tlFail("gcommWait returned %s", gcommGetErrorString(res));
  tlReport("hang: rank %d skipped a collective; the others time out", skipper);
  gcommCommDestroy(comm);
}

int main(int argc, char** argv) {
  tlInit(&argc, &argv);
  if (getenv("TEST_FAULT_HANG")) {
    hang(atoi(getenv("TEST_FAULT_HANG")));
    return tlFinish("test_fault");
  }
  int net = getenv("TEST_FAULT_NET") != NULL;
  for (int k = 0; k < NMM; k++)
    if (!(net && (k == MM_ROOT || k == MM_ROOT_GONE))) testMismatch(k);
  testCheckDisagree();
  if (!net) testDestroyed();
  testAsync();
  return tlFinish("test_fault");
}
