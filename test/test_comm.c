/*
 * test_comm.c - communicators: queries, split, several at once, proxy modes, gcommTest,
 * asynchrony, destroy and init/destroy cycles.
 *
 * Results are checked against MPI: a Job is an int64 sum allreduce on a gcomm communicator whose
 * expected result MPI_Allreduce computes on the matching MPI communicator (for splits, the one
 * MPI_Comm_split gives for the same color and key).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>

#include "test/testlib.h"

/* ---- Jobs: an allreduce checked against MPI ---- */

#define JOB_COUNT 1031

typedef struct {
  int64_t in[JOB_COUNT], out[JOB_COUNT];
  uint64_t seed;
} Job;

/* Not every rank starts every job (splits), so the seed is local: MPI gives the reference. */
static void jobStart(Job* j, gcommComm_t comm) {
  static uint64_t jobs;
  j->seed = tlHash3(tlSeed, (uint64_t)tlRank, ++jobs);
  for (int i = 0; i < JOB_COUNT; i++) {
    j->in[i] = (int64_t)(tlHash3(j->seed, (uint64_t)tlRank, (uint64_t)i) % 2000001) - 1000000;
    j->out[i] = -1;
  }
  TL_OK(comm, gcommAllReduce(j->in, j->out, JOB_COUNT, gcommInt64, gcommSum, comm, NULL));
}

/* Collective over mpiComm (which holds the same ranks as the job's communicator). */
static void jobCheck(const Job* j, MPI_Comm mpiComm, const char* what) {
  int64_t want[JOB_COUNT];
  MPI_Request req;
  MPI_Iallreduce(j->in, want, JOB_COUNT, MPI_INT64_T, MPI_SUM, mpiComm, &req);
  tlWaitRequest(&req);
  for (int i = 0; i < JOB_COUNT; i++)
    if (j->out[i] != want[i]) {
      tlFail("%s: element %d is %lld, MPI says %lld", what, i, (long long)j->out[i],
             (long long)want[i]);
      return;
    }
}

static void jobRun(gcommComm_t comm, MPI_Comm mpiComm, const char* what) {
  static Job j;
  jobStart(&j, comm);
  TL_OK(comm, gcommWait(comm, NULL));
  jobCheck(&j, mpiComm, what);
}

/* ---- Checks ---- */

static void testQueries(void) {
  int version = 0, count = -1, rank = -1, device = 0;
  TL_OK(NULL, gcommGetVersion(&version));
  if (version != GCOMM_VERSION_CODE)
    tlFail("gcommGetVersion gives %d, gcomm.h says %d", version, GCOMM_VERSION_CODE);
  tlReport("comm gcommGetVersion = GCOMM_VERSION_CODE");

  gcommComm_t comm = NULL;
  TL_OK(NULL, gcommCommInitMPI(&comm, MPI_COMM_WORLD, NULL));
  if (!tlReport("comm init with config NULL")) return;
  gcommResult_t async = gcommInternalError;
  TL_OK(comm, gcommCommCount(comm, &count));
  TL_OK(comm, gcommCommUserRank(comm, &rank));
  TL_OK(comm, gcommCommDevice(comm, &device));
  TL_OK(comm, gcommCommGetAsyncError(comm, &async));
  if (count != tlNranks) tlFail("gcommCommCount gives %d, MPI %d", count, tlNranks);
  if (rank != tlRank) tlFail("gcommCommUserRank gives %d, MPI %d", rank, tlRank);
  if (device != GCOMM_DEVICE_HOST)
    tlFail("gcommCommDevice gives %d, not GCOMM_DEVICE_HOST", device);
  if (async != gcommSuccess) tlFail("gcommCommGetAsyncError gives %s", gcommGetErrorString(async));
  tlReport("comm count, user rank, device, async error");
  TL_OK(comm, gcommTest(comm, NULL));
  tlReport("comm gcommTest on an idle communicator is gcommSuccess");
  tlCommDestroy(comm);
  tlReport("comm destroy with nothing outstanding");

  gcommConfig_t config = GCOMM_CONFIG_INITIALIZER;
  char name[32];
  snprintf(name, sizeof(name), "test-comm");
  config.commName = name, config.nChannels = 3, config.device = GCOMM_DEVICE_HOST;
  TL_OK(NULL, gcommCommInitMPI(&comm, MPI_COMM_WORLD, &config));
  memset(name, 0, sizeof(name)); /* the name must have been copied */
  if (tlReport("comm init with commName, nChannels=3, device=host")) {
    jobRun(comm, MPI_COMM_WORLD, "allreduce");
    tlCommDestroy(comm);
    tlReport("comm allreduce on a configured communicator");
  }
}

/* Splits world by (color, key) with gcomm and with MPI, checks the result's shape and members,
 * runs a job on it concurrently with one on the parent, and splits it again. */
static void testSplit(gcommComm_t world, const char* what, int color, int key,
                      const gcommConfig_t* config) {
  gcommComm_t sub = (gcommComm_t)(uintptr_t)1; /* must be overwritten */
  MPI_Comm mpiSub;
  if (TL_OK(world, gcommCommSplit(world, color, key, &sub, config)) != gcommSuccess) sub = NULL;
  MPI_Comm_split(MPI_COMM_WORLD, color == GCOMM_SPLIT_NOCOLOR ? MPI_UNDEFINED : color, key,
                 &mpiSub);
  if (color == GCOMM_SPLIT_NOCOLOR) {
    if (sub != NULL) tlFail("GCOMM_SPLIT_NOCOLOR gave a communicator, not NULL");
    sub = NULL;
  } else {
    int count = -1, rank = -1, mpiCount, mpiRank;
    MPI_Comm_size(mpiSub, &mpiCount);
    MPI_Comm_rank(mpiSub, &mpiRank);
    if (!sub) tlFail("color %d gave no communicator", color);
    if (sub) TL_OK(sub, gcommCommCount(sub, &count));
    if (sub) TL_OK(sub, gcommCommUserRank(sub, &rank));
    if (count != mpiCount || rank != mpiRank)
      tlFail("color %d key %d: rank %d of %d, MPI_Comm_split says %d of %d", color, key, rank,
             count, mpiRank, mpiCount);
  }
  if (!tlReport("comm split %s: shape", what)) {
    if (sub) gcommCommDestroy(sub);
    if (mpiSub != MPI_COMM_NULL) MPI_Comm_free(&mpiSub);
    return;
  }

  /* Members, in order: every rank's world rank gathered over the new communicator. */
  if (sub) {
    int n, me = tlRank, *mine = malloc(tlNranks * sizeof(int)),
           *want = malloc(tlNranks * sizeof(int));
    MPI_Comm_size(mpiSub, &n);
    TL_OK(sub, gcommAllGather(&me, mine, 1, gcommInt32, sub, NULL));
    TL_OK(sub, gcommWait(sub, NULL));
    MPI_Allgather(&me, 1, MPI_INT, want, 1, MPI_INT, mpiSub);
    for (int i = 0; i < n; i++)
      if (mine[i] != want[i]) {
        tlFail("member %d is world rank %d, MPI_Comm_split says %d", i, mine[i], want[i]);
        break;
      }
    free(mine), free(want);
  }
  tlReport("comm split %s: members in key order", what);

  /* A job on the split and one on the parent in flight together. */
  static Job onSub, onWorld;
  if (sub) jobStart(&onSub, sub);
  jobStart(&onWorld, world);
  if (sub) TL_OK(sub, gcommWait(sub, NULL));
  TL_OK(world, gcommWait(world, NULL));
  if (sub) jobCheck(&onSub, mpiSub, "allreduce on the split");
  jobCheck(&onWorld, MPI_COMM_WORLD, "allreduce on the parent");
  tlReport("comm split %s: allreduce on split and parent concurrently", what);

  /* Split the split again (odd and even ranks of it, reversed). */
  if (sub) {
    int rank;
    gcommComm_t sub2 = NULL;
    MPI_Comm mpiSub2;
    MPI_Comm_rank(mpiSub, &rank);
    TL_OK(sub, gcommCommSplit(sub, rank % 2, -rank, &sub2, NULL));
    MPI_Comm_split(mpiSub, rank % 2, -rank, &mpiSub2);
    if (sub2)
      jobRun(sub2, mpiSub2, "allreduce on a split of a split");
    else
      tlFail("a split of a split gave no communicator");
    /* The parent first: the nested split must outlive it. */
    TL_OK(sub, gcommCommDestroy(sub));
    sub = NULL;
    if (sub2) jobRun(sub2, mpiSub2, "allreduce on a split after its parent was destroyed");
    tlCommDestroy(sub2);
    MPI_Comm_free(&mpiSub2);
  }
  tlReport("comm split %s: split of the split, used after its parent is destroyed", what);
  if (sub) tlCommDestroy(sub);
  if (mpiSub != MPI_COMM_NULL) MPI_Comm_free(&mpiSub);
}

static void testSplits(void) {
  gcommComm_t world = tlCommInitEnv(MPI_COMM_WORLD, "", -1);
  if (!tlReport("comm split: init parent")) return;
  testSplit(world, "rank%3, reversed keys", tlRank % 3, tlNranks - tlRank, NULL);
  testSplit(world, "all one color, equal keys", 7, 0, NULL);
  testSplit(world, "last rank NOCOLOR", tlRank == tlNranks - 1 ? GCOMM_SPLIT_NOCOLOR : tlRank % 2,
            tlRank, NULL);
  gcommConfig_t poll = GCOMM_CONFIG_INITIALIZER;
  poll.proxyMode = GCOMM_PROXY_POLL;
  testSplit(world, "rank/2 halves, poll config", tlRank / 2, 0, &poll);
  tlCommDestroy(world);
  tlReport("comm split: destroy parent");
}

/* Three communicators over world with ops interleaved, waited in reverse order. */
static void testSeveral(void) {
  static const char* const envs[] = {"", "GCOMM_BUFFSIZE=4096 GCOMM_ALGO=ring", "GCOMM_ALGO=tree"};
  static const int modes[] = {-1, GCOMM_PROXY_POLL, -1};
  static Job jobs[3][4];
  gcommComm_t comms[3];
  for (int c = 0; c < 3; c++) comms[c] = tlCommInitEnv(MPI_COMM_WORLD, envs[c], modes[c]);
  if (!tlReport("comm several: init 3 communicators")) return;
  for (int i = 0; i < 4; i++)
    for (int c = 0; c < 3; c++) jobStart(&jobs[c][i], comms[c]);
  for (int c = 2; c >= 0; c--) TL_OK(comms[c], gcommWait(comms[c], NULL));
  for (int i = 0; i < 4; i++)
    for (int c = 0; c < 3; c++) jobCheck(&jobs[c][i], MPI_COMM_WORLD, "interleaved allreduce");
  tlReport("comm several: 3 communicators (thread, poll, tree) with interleaved ops");

  /* One group over all three: launched together at GroupEnd, one launch per communicator. */
  TL_OK(NULL, gcommGroupStart());
  for (int i = 0; i < 2; i++)
    for (int c = 0; c < 3; c++) jobStart(&jobs[c][i], comms[c]);
  TL_OK(NULL, gcommGroupEnd());
  for (int c = 0; c < 3; c++) TL_OK(comms[c], gcommWait(comms[c], NULL));
  for (int i = 0; i < 2; i++)
    for (int c = 0; c < 3; c++) jobCheck(&jobs[c][i], MPI_COMM_WORLD, "allreduce in a group");
  for (int c = 0; c < 3; c++) tlCommDestroy(comms[c]);
  tlReport("comm several: one group of ops on 3 communicators");
}

/* Does a send move without its rank calling gcomm? Rank 1 sends to rank 0 more than a FIFO holds
 * (2 MB and a little, against 8 slots of 128 KB) and then stays out of gcomm until rank 0 has
 * tested for the data for a while: a threaded communicator delivers it all, a polled one moves
 * only what its rank's own calls move (the send's call fills the FIFO once) and must not. */
static void testProxyMode(gcommComm_t comm, int expectThread, const char* what) {
  enum { MODE_COUNT = (2 << 20) / 4 + 7 };
  static int32_t data[MODE_COUNT];
  uint64_t seed = tlNextSeed();
  int delivered = 0;
  if (tlRank == 1) {
    tlFillRandom(data, MODE_COUNT, gcommInt32, seed, 1);
    TL_OK(comm, gcommSend(data, MODE_COUNT, gcommInt32, 0, comm, NULL));
  } else if (tlRank == 0) {
    memset(data, 0, sizeof(data));
    TL_OK(comm, gcommRecv(data, MODE_COUNT, gcommInt32, 1, comm, NULL));
  }
  tlBarrier(MPI_COMM_WORLD);
  if (tlRank == 0) {
    double end = tlNow() + (expectThread ? 20.0 : 0.3);
    while (!delivered && tlNow() < end) {
      gcommResult_t res = gcommTest(comm, NULL);
      if (res == gcommSuccess)
        delivered = 1;
      else if (res != gcommInProgress)
        TL_OK(comm, res);
      else
        tlSleepMs(1);
    }
    if (delivered != expectThread)
      tlFail(expectThread ? "the data never arrived while the sender stayed out of gcomm"
                          : "the data arrived although the sender never drove progress");
  }
  tlBarrier(MPI_COMM_WORLD);
  TL_OK(comm, gcommWait(comm, NULL));
  for (int i = 0; tlRank == 0 && i < MODE_COUNT; i++)
    if ((uint32_t)data[i] != (uint32_t)tlHash3(seed, 1, (uint64_t)i)) {
      tlFail("element %d of the message is wrong", i);
      break;
    }
  tlReport("comm proxy mode %s: %s", what,
           expectThread ? "a send progresses while its rank is away" : "a send waits for its rank");
}

/* Whether this process may run on more than one CPU: the default mode is the thread then, else
 * the caller polls. */
static int mayRunOnSeveralCpus(void) {
  cpu_set_t cpus;
  return sched_getaffinity(0, sizeof(cpus), &cpus) != 0 || CPU_COUNT(&cpus) > 1;
}

/* The default on one CPU: this process bound to the CPU it runs on (as `mpiexec -bind-to core`
 * binds it) while the communicator is made, then its CPUs given back. */
static gcommComm_t commOnOneCpu(void) {
  cpu_set_t all, one;
  if (sched_getaffinity(0, sizeof(all), &all) != 0) return NULL;
  CPU_ZERO(&one);
  CPU_SET(sched_getcpu() >= 0 ? sched_getcpu() : 0, &one);
  if (sched_setaffinity(0, sizeof(one), &one) != 0) return NULL;
  gcommComm_t comm = tlCommInitEnv(MPI_COMM_WORLD, "", -1);
  sched_setaffinity(0, sizeof(all), &all);
  return comm;
}

static void testProxyModes(void) {
  if (tlNranks < 2) return;
  static const struct {
    const char* what;
    const char* env;
    int config, thread;
  } cases[] = {
      {"default", "", -1, -1},
      {"default bound to one CPU", NULL, -1, 0},
      {"config poll", "", GCOMM_PROXY_POLL, 0},
      {"config thread", "", GCOMM_PROXY_THREAD, 1},
      {"GCOMM_PROXY_MODE=poll", "GCOMM_PROXY_MODE=poll", -1, 0},
      {"GCOMM_PROXY_MODE=thread over config poll", "GCOMM_PROXY_MODE=thread", GCOMM_PROXY_POLL, 1},
      {"GCOMM_PROXY_MODE=poll over config thread", "GCOMM_PROXY_MODE=poll", GCOMM_PROXY_THREAD, 0},
  };
  for (int i = 0; i < (int)(sizeof(cases) / sizeof(cases[0])); i++) {
    gcommComm_t comm = cases[i].env ? tlCommInitEnv(MPI_COMM_WORLD, cases[i].env, cases[i].config)
                                    : commOnOneCpu();
    if (comm == NULL) tlFail("comm proxy mode %s: no communicator", cases[i].what);
    if (!tlReport("comm proxy mode %s: init", cases[i].what) || comm == NULL) continue;
    int thread = cases[i].thread >= 0 ? cases[i].thread : mayRunOnSeveralCpus();
    testProxyMode(comm, thread, cases[i].what);
    /* A split with config NULL inherits the mode. */
    gcommComm_t sub = NULL;
    TL_OK(comm, gcommCommSplit(comm, 0, tlRank, &sub, NULL));
    if (tlReport("comm proxy mode %s: split", cases[i].what)) {
      char what[96];
      snprintf(what, sizeof(what), "%s, inherited by a split", cases[i].what);
      testProxyMode(sub, thread, what);
    }
    tlCommDestroy(sub);
    tlCommDestroy(comm);
    tlReport("comm proxy mode %s: destroy", cases[i].what);
  }
}

/* gcommTest: rank 0's receive from rank 1 is in progress until rank 1 posts the send, then
 * completes (rank 0 also calls gcommProgress meanwhile). (Outside a group, a rank's ops run in call
 * order: rank 0 must not also send.) */
static void testTest(int proxyMode, const char* what) {
  if (tlNranks < 2) return;
  gcommComm_t comm = tlCommInitEnv(MPI_COMM_WORLD, "", proxyMode);
  if (!tlReport("comm gcommTest [%s]: init", what)) return;
  static int32_t buf[JOB_COUNT];
  uint64_t seed = tlNextSeed();
  memset(buf, 0, sizeof(buf));
  if (tlRank == 0) {
    TL_OK(comm, gcommRecv(buf, JOB_COUNT, gcommInt32, 1, comm, NULL));
    for (int i = 0; i < 5; i++) {
      gcommResult_t res = gcommTest(comm, NULL);
      if (res != gcommInProgress)
        tlFail("gcommTest on a receive with no matching send gave %s", gcommGetErrorString(res));
      tlSleepMs(2);
    }
  }
  tlBarrier(MPI_COMM_WORLD);
  if (tlRank == 1) {
    tlFillRandom(buf, JOB_COUNT, gcommInt32, seed, 1);
    TL_OK(comm, gcommSend(buf, JOB_COUNT, gcommInt32, 0, comm, NULL));
    TL_OK(comm, gcommWait(comm, NULL));
  } else if (tlRank == 0) {
    double end = tlNow() + 30;
    gcommResult_t res;
    while ((res = gcommTest(comm, NULL)) == gcommInProgress && tlNow() < end) {
      TL_OK(comm, gcommProgress(comm)); /* drives a polled communicator, harmless otherwise */
      tlSleepMs(0.2);
    }
    if (res != gcommSuccess)
      tlFail("gcommTest gave %s once the send was posted", gcommGetErrorString(res));
    for (int i = 0; i < JOB_COUNT && !tlLocalFailed; i++)
      if ((uint32_t)buf[i] != (uint32_t)tlHash3(seed, 1, (uint64_t)i))
        tlFail("element %d of the message is wrong", i);
  }
  tlCommDestroy(comm);
  tlReport("comm gcommTest [%s]: in progress until the send is posted, then success", what);
}

/* Many ops enqueued before one wait. */
static void testAsync(int proxyMode, const char* what) {
  enum { NJOBS = 64 };
  static Job jobs[NJOBS];
  static double bcast[NJOBS][64];
  gcommComm_t comm = tlCommInitEnv(MPI_COMM_WORLD, "", proxyMode);
  if (!tlReport("comm async [%s]: init", what)) return;
  uint64_t seed = tlNextSeed();
  for (int i = 0; i < NJOBS; i++) {
    jobStart(&jobs[i], comm);
    tlFillRandom(bcast[i], 64, gcommFloat64, seed + (uint64_t)i, tlRank);
    TL_OK(comm, gcommBroadcast(bcast[i], bcast[i], 64, gcommFloat64, i % tlNranks, comm, NULL));
  }
  TL_OK(comm, gcommWait(comm, NULL));
  for (int i = 0; i < NJOBS; i++) {
    jobCheck(&jobs[i], MPI_COMM_WORLD, "allreduce");
    for (int e = 0; e < 64 && !tlLocalFailed; e++) {
      uint64_t g;
      memcpy(&g, &bcast[i][e], 8);
      if (g != tlHash3(seed + (uint64_t)i, (uint64_t)(i % tlNranks), (uint64_t)e))
        tlFail("broadcast %d element %d is wrong", i, e);
    }
  }
  tlCommDestroy(comm);
  tlReport("comm async [%s]: 128 ops enqueued before one gcommWait", what);
}

/* gcommCommDestroy waits for outstanding work. */
static void testDestroyWaits(int proxyMode, const char* what) {
  static Job j;
  gcommComm_t comm = tlCommInitEnv(MPI_COMM_WORLD, "", proxyMode);
  if (!tlReport("comm destroy with work outstanding [%s]: init", what)) return;
  jobStart(&j, comm);
  TL_OK(comm, gcommCommDestroy(comm));
  jobCheck(&j, MPI_COMM_WORLD, "allreduce not waited for before destroy");
  tlReport("comm destroy with work outstanding [%s]: it completes first", what);
}

/* Many init/destroy cycles (ASan's leak checker sees anything left behind). */
static void testCycles(void) {
  for (int i = 0; i < 8; i++) {
    gcommComm_t comm = tlCommInitEnv(MPI_COMM_WORLD, i % 4 == 3 ? "GCOMM_NCHANNELS=4" : "",
                                     i % 2 ? GCOMM_PROXY_POLL : -1);
    if (comm && i % 3) jobRun(comm, MPI_COMM_WORLD, "allreduce");
    tlCommDestroy(comm);
  }
  tlReport("comm 8 init/destroy cycles (thread and poll, some with an allreduce)");
}

int main(int argc, char** argv) {
  tlInit(&argc, &argv);
  testQueries();
  testSplits();
  testSeveral();
  testProxyModes();
  testTest(-1, "thread");
  testTest(GCOMM_PROXY_POLL, "poll");
  testAsync(-1, "thread");
  testAsync(GCOMM_PROXY_POLL, "poll");
  testDestroyWaits(-1, "thread");
  testDestroyWaits(GCOMM_PROXY_POLL, "poll");
  testCycles();
  return tlFinish("test_comm");
}
