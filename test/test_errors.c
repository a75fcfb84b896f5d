/*
 * test_errors.c - bad input, error strings, abort and timeout.
 *
 * bad     every data call with one bad argument (NULL comm, NULL buffer with count > 0, bad
 *         datatype, op, root or peer, overlapping buffers that are not the in-place layout) returns
 *         gcommInvalidArgument or gcommInvalidUsage, names the argument in gcommGetLastError,
 *         leaves the output untouched and enqueues nothing; the same call with good arguments then
 *         works. Only arguments that are bad on every rank are used (a NULL recvbuff is fine off
 *         root for Reduce, so it is not tried there), so no rank is left in a collective alone.
 * misc    NULL out-pointers, NULL communicators, a bad config, GroupEnd without GroupStart,
 *         count 0 with NULL buffers, gcommGetErrorString for every code
 * abort   rank 0 is blocked in an all-reduce no other rank joins (one rank: a receive never
 *         matched), two threads wait on it, a third calls gcommCommAbort after 50 ms: both waits
 *         return gcommAborted within 100 ms (500 asserted; the real numbers are printed), then
 *         gcommTest and gcommCommGetAsyncError say gcommAborted, calls fail citing the abort
 *         once (the same message each time); destroy succeeds
 * timeout GCOMM_TIMEOUT_MS=300 and a receive that is never matched: gcommWait fails with
 *         gcommTimeout or gcommRemoteError within a few seconds, and the message names the peer
 * misuse  two threads x 300 all-reduces on one communicator: no wrong result is returned as
 *         success (the calls of a thread that did not create it are gcommInvalidUsage naming the
 *         threads), and the creator's calls work after; use after destroy and a second destroy:
 *         gcommInvalidArgument (not a crash: ASan builds check the memory); destroy with the
 *         communicator's work queued in an open group: gcommInvalidUsage, and the group then
 *         runs; GCOMM_ALGO or GCOMM_PROTO set differently on different ranks: init fails on
 *         every rank naming the variable; an AllGather count whose buffer outgrows the address
 *         space: "too large"; buffers of doubles and int64s at odd byte offsets reduce correctly
 *         (UBSan builds check every load); GCOMM_PROXY_DUMP_SIGNAL=11 or 2 installs no handler
 */
#include <ctype.h>
#include <pthread.h>
#include <signal.h>
#include <strings.h>

#include "test/testlib.h"

/* more than any communicator holds (gcomm_internal.h: GCOMM_MAX_REDOPS) */
#define GCOMM_TEST_MAX_REDOPS 4096

#define N(a) (int)(sizeof(a) / sizeof((a)[0]))

typedef enum {
  F_ALLREDUCE,
  F_BROADCAST,
  F_REDUCE,
  F_ALLGATHER,
  F_REDUCESCATTER,
  F_ALLTOALL,
  F_GATHER,
  F_SCATTER,
  F_SEND,
  F_RECV,
  NFUNCS
} Func;

static const char* const funcNames[NFUNCS] = {
    "gcommAllReduce", "gcommBroadcast", "gcommReduce",  "gcommAllGather", "gcommReduceScatter",
    "gcommAllToAll",  "gcommGather",    "gcommScatter", "gcommSend",      "gcommRecv"};

#define COUNT 5 /* elements per rank in the calls below */

/* The arguments of one call. */
typedef struct {
  const void* sendbuff;
  void* recvbuff;
  size_t count;
  gcommDataType_t type;
  gcommRedOp_t op;
  int root, peer;
  gcommComm_t comm;
} Args;

static gcommResult_t call(Func f, const Args* a) {
  switch (f) {
    case F_ALLREDUCE:
      return gcommAllReduce(a->sendbuff, a->recvbuff, a->count, a->type, a->op, a->comm, NULL);
    case F_BROADCAST:
      return gcommBroadcast(a->sendbuff, a->recvbuff, a->count, a->type, a->root, a->comm, NULL);
    case F_REDUCE:
      return gcommReduce(a->sendbuff, a->recvbuff, a->count, a->type, a->op, a->root, a->comm,
                         NULL);
    case F_ALLGATHER:
      return gcommAllGather(a->sendbuff, a->recvbuff, a->count, a->type, a->comm, NULL);
    case F_REDUCESCATTER:
      return gcommReduceScatter(a->sendbuff, a->recvbuff, a->count, a->type, a->op, a->comm, NULL);
    case F_ALLTOALL:
      return gcommAllToAll(a->sendbuff, a->recvbuff, a->count, a->type, a->comm, NULL);
    case F_GATHER:
      return gcommGather(a->sendbuff, a->recvbuff, a->count, a->type, a->root, a->comm, NULL);
    case F_SCATTER:
      return gcommScatter(a->sendbuff, a->recvbuff, a->count, a->type, a->root, a->comm, NULL);
    case F_SEND:
      return gcommSend(a->sendbuff, a->count, a->type, a->peer, a->comm, NULL);
    case F_RECV:
      return gcommRecv(a->recvbuff, a->count, a->type, a->peer, a->comm, NULL);
    default:
      return gcommInternalError;
  }
}

/* A bad argument: which calls it applies to, how to make it, and what the message must name. */
typedef enum {
  BAD_COMM,
  BAD_SEND_NULL,
  BAD_RECV_NULL,
  BAD_TYPE,
  BAD_OP,
  BAD_ROOT_NEG,
  BAD_ROOT_BIG,
  BAD_PEER_NEG,
  BAD_PEER_BIG,
  BAD_OVERLAP,
  NBADS
} Bad;

#define FN(f) (1u << (f))
#define COLLS (FN(NFUNCS) - 1 - FN(F_SEND) - FN(F_RECV))

static const struct {
  const char* what;
  unsigned funcs;
  const char* names; /* the argument names, '|'-separated: the message must contain one */
} bads[NBADS] = {
    [BAD_COMM] = {"comm NULL", FN(NFUNCS) - 1, "comm"},
    [BAD_SEND_NULL] = {"sendbuff NULL, count > 0",
                       FN(F_ALLREDUCE) | FN(F_REDUCE) | FN(F_ALLGATHER) | FN(F_REDUCESCATTER) |
                           FN(F_ALLTOALL) | FN(F_GATHER) | FN(F_SEND),
                       "sendbuff"},
    [BAD_RECV_NULL] = {"recvbuff NULL, count > 0",
                       FN(F_ALLREDUCE) | FN(F_BROADCAST) | FN(F_ALLGATHER) | FN(F_REDUCESCATTER) |
                           FN(F_ALLTOALL) | FN(F_SCATTER) | FN(F_RECV),
                       "recvbuff"},
    [BAD_TYPE] = {"datatype 99", FN(NFUNCS) - 1, "datatype"},
    [BAD_OP] = {"op 99", FN(F_ALLREDUCE) | FN(F_REDUCE) | FN(F_REDUCESCATTER), "op"},
    [BAD_ROOT_NEG] = {"root -1", FN(F_BROADCAST) | FN(F_REDUCE) | FN(F_GATHER) | FN(F_SCATTER),
                      "root"},
    [BAD_ROOT_BIG] = {"root nranks", FN(F_BROADCAST) | FN(F_REDUCE) | FN(F_GATHER) | FN(F_SCATTER),
                      "root"},
    [BAD_PEER_NEG] = {"peer -1", FN(F_SEND) | FN(F_RECV), "peer"},
    [BAD_PEER_BIG] = {"peer nranks", FN(F_SEND) | FN(F_RECV), "peer"},
    [BAD_OVERLAP] = {"overlapping buffers, not in place",
                     FN(F_ALLREDUCE) | FN(F_ALLGATHER) | FN(F_REDUCESCATTER) | FN(F_ALLTOALL),
                     "sendbuff|recvbuff|overlap"},
};

static int isWordChar(char c) {
  return isalnum((unsigned char)c) || c == '_';
}

/* Does msg contain one of the '|'-separated names as a whole word (case-insensitive)? */
static int mentions(const char* msg, const char* names) {
  for (const char* p = names; *p;) {
    size_t len = strcspn(p, "|");
    for (const char* m = msg; *m; m++)
      if (!strncasecmp(m, p, len) && (m == msg || !isWordChar(m[-1])) && !isWordChar(m[len]))
        return 1;
    p += len + (p[len] == '|');
  }
  return 0;
}

static int isError(gcommResult_t res) {
  return res == gcommInvalidArgument || res == gcommInvalidUsage;
}

/* Makes the call a bad in its one argument (buf: the buffer both of its sides live in). */
static void makeBad(Args* a, Bad bad, Func f, unsigned char* buf) {
  switch (bad) {
    case BAD_COMM:
      a->comm = NULL;
      break;
    case BAD_SEND_NULL:
      a->sendbuff = NULL;
      break;
    case BAD_RECV_NULL:
      a->recvbuff = NULL;
      break;
    case BAD_TYPE:
      a->type = (gcommDataType_t)99;
      break;
    case BAD_OP:
      a->op = (gcommRedOp_t)99;
      break;
    case BAD_ROOT_NEG:
      a->root = -1;
      break;
    case BAD_ROOT_BIG:
      a->root = tlNranks;
      break;
    case BAD_PEER_NEG:
      a->peer = -1;
      break;
    case BAD_PEER_BIG:
      a->peer = tlNranks;
      break;
    case BAD_OVERLAP:
      /* recvbuff one element after sendbuff (AllGather: sendbuff one after recvbuff) */
      a->recvbuff = buf + 4;
      if (f == F_ALLGATHER) a->sendbuff = buf + 4, a->recvbuff = buf;
      break;
    default:
      break;
  }
}

/* One buffer of 2*nranks*COUNT int32 elements holds both sides of a call (the overlap case needs
 * them in one buffer; otherwise send is the first half, recv the second). */
static void testBad(gcommComm_t comm, Bad bad, Func f) {
  size_t half = (size_t)tlNranks * COUNT * 4;
  TlBuf buf = tlBufAlloc(2 * half, 0);
  tlFillRandom(buf.ptr, half / 4, gcommInt32, tlNextSeed(), tlRank);
  Args a = {buf.ptr,      buf.ptr + half,          COUNT, gcommInt32, gcommSum,
            tlNranks - 1, (tlRank + 1) % tlNranks, comm};
  makeBad(&a, bad, f, buf.ptr);
  unsigned char* before = malloc(2 * half);
  memcpy(before, buf.ptr, 2 * half);
  gcommResult_t res = call(f, &a);
  const char* msg = gcommGetLastError(a.comm);
  if (!isError(res))
    tlFail("returned %s, not gcommInvalidArgument or gcommInvalidUsage", gcommGetErrorString(res));
  else if (!msg || !*msg)
    tlFail("gcommGetLastError is empty");
  else if (!mentions(msg, bads[bad].names))
    tlFail("gcommGetLastError does not name %s: \"%s\"", bads[bad].names, msg);
  TL_OK(comm, gcommWait(comm, NULL));
  if (memcmp(before, buf.ptr, 2 * half)) tlFail("the call changed its buffers");
  tlBufCheckGuards(&buf, "buffers");
  free(before);

  /* The same call, good this time. */
  if (!tlLocalFailed) {
    Args good = {buf.ptr, buf.ptr + half, COUNT, gcommInt32, gcommSum, tlNranks - 1, 0, comm};
    if (f == F_SEND || f == F_RECV) { /* a send and receive between neighbours in one group */
      TL_OK(comm, gcommGroupStart());
      good.peer = (tlRank + 1) % tlNranks;
      TL_OK(comm, call(F_SEND, &good));
      good.peer = (tlRank - 1 + tlNranks) % tlNranks;
      TL_OK(comm, call(F_RECV, &good));
      TL_OK(comm, gcommGroupEnd());
    } else {
      TL_OK(comm, call(f, &good));
    }
    TL_OK(comm, gcommWait(comm, NULL));
  }
  tlBufFree(&buf);
  tlReport("bad %s: %s", funcNames[f], bads[bad].what);
}

/* NULL out-pointers and communicators, a bad config, call order, count 0 with NULL buffers. */
/* A call of count 0 whose checks all pass at once completes in the call (the call before, by the
 * same thread on the same communicator, let it skip the lookups): a bad argument is still refused
 * with a message naming it, by this thread and by another one. */
static void testCountZero(gcommComm_t comm, Bad bad, Func f) {
  unsigned char buf[8] = {0};
  Args good = {buf, buf + 4, 0, gcommInt32, gcommSum, tlNranks - 1, (tlRank + 1) % tlNranks, comm};
  Args a = good;
  makeBad(&a, bad, f, buf);
  TL_OK(comm, call(f, &good));
  gcommResult_t res = call(f, &a);
  const char* msg = gcommGetLastError(a.comm);
  if (!isError(res))
    tlFail("returned %s, not gcommInvalidArgument or gcommInvalidUsage", gcommGetErrorString(res));
  else if (!mentions(msg, bads[bad].names))
    tlFail("gcommGetLastError does not name %s: \"%s\"", bads[bad].names, msg);
  TL_OK(comm, call(f, &good));
  TL_OK(comm, gcommWait(comm, NULL));
  tlReport("count 0 after a good call, bad %s: %s", funcNames[f], bads[bad].what);
}

static void* countZeroElsewhere(void* arg) {
  static gcommResult_t res;
  res = gcommAllReduce(NULL, NULL, 0, gcommFloat, gcommSum, (gcommComm_t)arg, NULL);
  return &res;
}

static void testCountZeroThread(gcommComm_t comm) {
  TL_OK(comm, gcommAllReduce(NULL, NULL, 0, gcommFloat, gcommSum, comm, NULL));
  pthread_t t;
  void* ret = NULL;
  pthread_create(&t, NULL, countZeroElsewhere, comm);
  pthread_join(t, &ret);
  gcommResult_t res = *(gcommResult_t*)ret;
  if (res != gcommInvalidUsage || !strstr(gcommGetLastError(comm), "thread"))
    tlFail("another thread's call of count 0 returned %s: %s", gcommGetErrorString(res),
           gcommGetLastError(comm));
  TL_OK(comm, gcommAllReduce(NULL, NULL, 0, gcommFloat, gcommSum, comm, NULL));
  TL_OK(comm, gcommWait(comm, NULL));
  tlReport("count 0 after a good call, from another thread: refused");
}

static void testMisc(gcommComm_t comm) {
  static const struct {
    const char* what;
    int which;
  } nulls[] = {{"gcommGetVersion(NULL)", 0},
               {"gcommCommCount(comm, NULL)", 1},
               {"gcommCommUserRank(comm, NULL)", 2},
               {"gcommCommDevice(comm, NULL)", 3},
               {"gcommCommGetAsyncError(comm, NULL)", 4},
               {"gcommCommCount(NULL, &n)", 5},
               {"gcommWait(NULL, NULL)", 6},
               {"gcommTest(NULL, NULL)", 7},
               {"gcommProgress(NULL)", 8},
               {"gcommCommSplit(comm, 0, 0, NULL, NULL)", 9},
               {"gcommCommInitMPI(NULL, world, NULL)", 10}};
  int n;
  for (int i = 0; i < N(nulls); i++) {
    gcommResult_t res = gcommInternalError;
    switch (nulls[i].which) {
      case 0:
        res = gcommGetVersion(NULL);
        break;
      case 1:
        res = gcommCommCount(comm, NULL);
        break;
      case 2:
        res = gcommCommUserRank(comm, NULL);
        break;
      case 3:
        res = gcommCommDevice(comm, NULL);
        break;
      case 4:
        res = gcommCommGetAsyncError(comm, NULL);
        break;
      case 5:
        res = gcommCommCount(NULL, &n);
        break;
      case 6:
        res = gcommWait(NULL, NULL);
        break;
      case 7:
        res = gcommTest(NULL, NULL);
        break;
      case 8:
        res = gcommProgress(NULL);
        break;
      case 9:
        res = gcommCommSplit(comm, 0, 0, NULL, NULL);
        break;
      case 10:
        res = gcommCommInitMPI(NULL, MPI_COMM_WORLD, NULL);
        break;
    }
    if (res != gcommInvalidArgument) tlFail("returned %s", gcommGetErrorString(res));
    tlReport("bad %s is gcommInvalidArgument", nulls[i].what);
  }

  gcommConfig_t config = GCOMM_CONFIG_INITIALIZER;
  gcommComm_t bad = NULL;
  config.magic = 0;
  gcommResult_t res = gcommCommInitMPI(&bad, MPI_COMM_WORLD, &config);
  if (res != gcommInvalidArgument) tlFail("config.magic = 0 gave %s", gcommGetErrorString(res));
  if (res == gcommSuccess && bad) gcommCommDestroy(bad);
  tlReport("bad config (magic 0) is gcommInvalidArgument");

  res = gcommGroupEnd();
  if (res != gcommInvalidUsage) tlFail("returned %s", gcommGetErrorString(res));
  tlReport("bad gcommGroupEnd without gcommGroupStart is gcommInvalidUsage");

  for (Func f = 0; f < F_RECV; f++) { /* F_SEND: a send to self and a receive from self */
    Args a = {NULL, NULL, 0, gcommFloat32, gcommMax, 0, tlRank, comm};
    if (f == F_SEND) {
      TL_OK(comm, gcommGroupStart());
      TL_OK(comm, call(F_SEND, &a));
      TL_OK(comm, call(F_RECV, &a));
      TL_OK(comm, gcommGroupEnd());
    } else {
      TL_OK(comm, call(f, &a));
    }
    TL_OK(comm, gcommWait(comm, NULL));
    tlReport("count 0 with NULL buffers is fine: %s",
             f == F_SEND ? "gcommSend/gcommRecv" : funcNames[f]);
  }

  const char* seen[gcommNumResults];
  for (int r = 0; r < gcommNumResults; r++) {
    seen[r] = gcommGetErrorString((gcommResult_t)r);
    if (!seen[r] || !*seen[r]) tlFail("code %d has no string", r);
    for (int q = 0; q < r && !tlLocalFailed; q++)
      if (!strcmp(seen[q], seen[r]))
        tlFail("codes %d and %d share the string \"%s\"", q, r, seen[r]);
  }
  const char* unknown = gcommGetErrorString((gcommResult_t)99);
  if (!unknown || !*unknown) tlFail("code 99 has no string");
  tlReport("gcommGetErrorString: a distinct string for every code, one for an unknown code");
}

/* ---- Abort and timeout ---- */

typedef struct {
  gcommComm_t comm;
  double delayMs, at; /* aborter: when it called gcommCommAbort; waiter: when gcommWait returned */
  gcommResult_t res;
} Waiter;

/* Expects res to be gcommInvalidArgument or gcommInvalidUsage with a message naming one of names.
 */
static void expectBad(gcommComm_t comm, gcommResult_t res, const char* names, const char* what) {
  if (!isError(res))
    tlFail("%s returned %s", what, gcommGetErrorString(res));
  else if (!mentions(gcommGetLastError(comm), names))
    tlFail("%s: message \"%s\" does not name %s", what, gcommGetLastError(comm), names);
  tlReport("bad %s is refused, naming %s", what, names);
}

/* PreMulSum operators: bad arguments, handles that are not (or no longer) operators of the
 * communicator, a datatype that is not the operator's, a full table; none changes the buffer. */
static void testRedOps(gcommComm_t comm) {
  float scalar = 2, buf[4] = {1, 2, 3, 4};
  gcommRedOp_t op = gcommSum, ops[GCOMM_TEST_MAX_REDOPS + 1];
  expectBad(comm, gcommRedOpCreatePreMulSum(NULL, &scalar, gcommFloat32, gcommScalarDevice, comm),
            "op", "PreMulSum with op NULL");
  expectBad(comm, gcommRedOpCreatePreMulSum(&op, NULL, gcommFloat32, gcommScalarDevice, comm),
            "scalar", "PreMulSum with scalar NULL");
  expectBad(comm, gcommRedOpCreatePreMulSum(&op, &scalar, 99, gcommScalarDevice, comm), "datatype",
            "PreMulSum with datatype 99");
  expectBad(comm,
            gcommRedOpCreatePreMulSum(&op, &scalar, gcommFloat32, (gcommScalarResidence_t)7, comm),
            "residence", "PreMulSum with residence 7");
  if (op != gcommSum) tlFail("a refused PreMulSum changed op to %d", (int)op);
  expectBad(comm, gcommRedOpDestroy(gcommSum, comm), "op", "gcommRedOpDestroy of gcommSum");
  expectBad(comm, gcommRedOpDestroy((gcommRedOp_t)(gcommNumOps + 3), comm), "op",
            "gcommRedOpDestroy of an operator never made");
  TL_OK(comm,
        gcommRedOpCreatePreMulSum(&op, &scalar, gcommFloat32, gcommScalarHostImmediate, comm));
  if ((int)op < gcommNumOps) tlFail("PreMulSum operator %d is below gcommNumOps", (int)op);
  expectBad(comm, gcommAllReduce(buf, buf, 4, gcommFloat64, op, comm, NULL), "op|datatype",
            "an all-reduce of float64 with a float32 PreMulSum operator");
  TL_OK(comm, gcommRedOpDestroy(op, comm));
  expectBad(comm, gcommRedOpDestroy(op, comm), "op", "gcommRedOpDestroy twice");
  expectBad(comm, gcommAllReduce(buf, buf, 4, gcommFloat32, op, comm, NULL), "op",
            "an all-reduce with a destroyed PreMulSum operator");
  int made = 0;
  gcommResult_t res = gcommSuccess;
  while (made <= GCOMM_TEST_MAX_REDOPS && res == gcommSuccess) {
    res = gcommRedOpCreatePreMulSum(&ops[made], &scalar, gcommFloat32, gcommScalarDevice, comm);
    made += res == gcommSuccess;
  }
  if (made == 0 || made > GCOMM_TEST_MAX_REDOPS)
    tlFail("%d PreMulSum operators made: the table is unbounded or empty", made);
  expectBad(comm, res, "operators|destroy", "one PreMulSum operator more than the table holds");
  for (int i = 0; i < made; i++) TL_OK(comm, gcommRedOpDestroy(ops[i], comm));
  static const float want[4] = {1, 2, 3, 4};
  if (memcmp(buf, want, sizeof(buf)) != 0) tlFail("a refused call changed the buffer");
  tlReport("PreMulSum: %d operators at most, all destroyed", made);
}

static void* abortLater(void* arg) {
  Waiter* a = arg;
  tlSleepMs(a->delayMs);
  a->at = tlNow();
  a->res = gcommCommAbort(a->comm);
  return NULL;
}

static void* waitThread(void* arg) {
  Waiter* w = arg;
  w->res = gcommWait(w->comm, NULL);
  w->at = tlNow();
  return NULL;
}

/* Rank 0 is blocked in an all-reduce that no other rank joins (one rank: a receive from itself
 * that is never matched), waited on by two threads; a third aborts after 50 ms. Both waits must
 * return gcommAborted within 100 ms (asserted with a margin: 500 ms, for a loaded CI machine). */
/* Calls on a stopped communicator fail with its error, cited once however many calls came
 * before (each call's message is not the last one's with more around it). */
static void citedOnce(gcommComm_t comm, int32_t* buf) {
  char first[1024];
  for (int i = 0; i < 3; i++) {
    gcommResult_t res = gcommSend(buf, 1, gcommInt32, 0, comm, NULL);
    const char* msg = gcommGetLastError(comm);
    const char* cite = strstr(msg, "stopped on an earlier error");
    if (res != gcommAborted || cite == NULL || strstr(cite + 1, "stopped on an earlier") != NULL)
      tlFail("call %d after the abort: %s, \"%s\"", i, gcommGetErrorString(res), msg);
    else if (i == 0)
      snprintf(first, sizeof(first), "%s", msg);
    else if (strcmp(msg, first) != 0)
      tlFail("call %d after the abort: \"%s\", the first: \"%s\"", i, msg, first);
  }
}

static void testAbort(int proxyMode, const char* what) {
  gcommComm_t comm = tlCommInitEnv(MPI_COMM_WORLD, "GCOMM_TIMEOUT_MS=30000", proxyMode);
  if (!tlReport("abort [%s]: init", what)) return;
  static int32_t buf[1031];
  if (tlRank == 0) {
    Waiter ab = {comm, 50, 0, gcommInternalError},
           w[2] = {{comm, 0, 0, gcommInternalError}, {comm, 0, 0, gcommInternalError}};
    pthread_t thread[3];
    if (tlNranks > 1)
      TL_OK(comm, gcommAllReduce(buf, buf, 1031, gcommInt32, gcommSum, comm, NULL));
    else
      TL_OK(comm, gcommRecv(buf, 1031, gcommInt32, 0, comm, NULL));
    for (int i = 0; i < 2; i++) pthread_create(&thread[i], NULL, waitThread, &w[i]);
    pthread_create(&thread[2], NULL, abortLater, &ab);
    for (int i = 0; i < 3; i++) pthread_join(thread[i], NULL);
    gcommResult_t async = gcommSuccess, test = gcommTest(comm, NULL);
    TL_OK(comm, gcommCommGetAsyncError(comm, &async));
    double ms[2] = {(w[0].at - ab.at) * 1e3, (w[1].at - ab.at) * 1e3};
    if (ab.res != gcommSuccess)
      tlFail("gcommCommAbort returned %s", gcommGetErrorString(ab.res));
    else if (w[0].res != gcommAborted || w[1].res != gcommAborted)
      tlFail("the waits returned %s and %s", gcommGetErrorString(w[0].res),
             gcommGetErrorString(w[1].res));
    else if (ms[0] > 500 || ms[1] > 500)
      tlFail("the waits returned %.1f and %.1f ms after the abort", ms[0], ms[1]);
    else if (async != gcommAborted || test != gcommAborted)
      tlFail("after the abort gcommCommGetAsyncError gives %s, gcommTest %s",
             gcommGetErrorString(async), gcommGetErrorString(test));
    else
      printf("# abort [%s]: 2 waits returned gcommAborted %.2f and %.2f ms after gcommCommAbort\n",
             what, ms[0], ms[1]);
    citedOnce(comm, buf);
  }
  tlReport(
      "abort [%s]: 2 pending waits on a blocked %s return gcommAborted within 100 ms (500 "
      "asserted)",
      what, tlNranks > 1 ? "all-reduce" : "receive");
  tlBarrier(MPI_COMM_WORLD);
  tlCommDestroy(comm);
  tlReport("abort [%s]: destroy after abort", what);
}

/* Does msg name rank peer ("peer 1", "rank 1", "peer=1", ...)? */
static int namesPeer(const char* msg, int peer) {
  char num[16];
  snprintf(num, sizeof(num), "%d", peer);
  for (const char* p = msg; *p; p++) {
    if (strncasecmp(p, "peer", 4) && strncasecmp(p, "rank", 4)) continue;
    const char* q = p + 4;
    for (int skip = 0; skip < 4 && *q && !isdigit((unsigned char)*q); skip++) q++;
    if (!strncmp(q, num, strlen(num)) && !isdigit((unsigned char)q[strlen(num)])) return 1;
  }
  return 0;
}

static void testTimeout(int proxyMode, const char* what) {
  gcommComm_t comm = tlCommInitEnv(MPI_COMM_WORLD, "GCOMM_TIMEOUT_MS=300", proxyMode);
  if (!tlReport("timeout [%s]: init", what)) return;
  static int32_t buf[1031];
  int peer = tlNranks > 1 ? 1 : 0;
  if (tlRank == 0) {
    TL_OK(comm, gcommRecv(buf, 1031, gcommInt32, peer, comm, NULL));
    double start = tlNow();
    gcommResult_t res = gcommWait(comm, NULL);
    double took = tlNow() - start;
    const char* msg = gcommGetLastError(comm);
    if (res != gcommTimeout && res != gcommRemoteError)
      tlFail("gcommWait returned %s", gcommGetErrorString(res));
    else if (took > 5.0 || took < 0.25)
      tlFail("gcommWait returned after %.2f s with GCOMM_TIMEOUT_MS=300", took);
    else if (!namesPeer(msg, peer))
      tlFail("the message does not name peer %d: \"%s\"", peer, msg);
  }
  tlReport("timeout [%s]: an unmatched receive fails within seconds, naming the peer", what);
  tlBarrier(MPI_COMM_WORLD);
  double start = tlNow();
  gcommResult_t res = gcommCommDestroy(comm);
  if (res != gcommSuccess && res != gcommTimeout && res != gcommRemoteError)
    tlFail("gcommCommDestroy returned %s", gcommGetErrorString(res));
  if (tlNow() - start > 5.0) tlFail("gcommCommDestroy took %.2f s", tlNow() - start);
  tlReport("timeout [%s]: destroy returns promptly after the timeout", what);
}

/* ---- Misuse ---- */

enum { THREAD_CALLS = 300, THREAD_COUNT = 67 };
typedef struct {
  gcommComm_t comm;
  int t, wrong, refused, good, namesThreads;
} CallerThread;

static int64_t threadValue(int rank, int t, int i, int j) {
  return (int64_t)(rank + 1) * 1000003 + t * 7919 + i * 31 + j;
}

static void* callerThread(void* arg) {
  CallerThread* c = arg;
  int64_t buf[THREAD_COUNT];
  for (int i = 0; i < THREAD_CALLS; i++) {
    for (int j = 0; j < THREAD_COUNT; j++) buf[j] = threadValue(tlRank, c->t, i, j);
    gcommResult_t res = gcommAllReduce(buf, buf, THREAD_COUNT, gcommInt64, gcommSum, c->comm, NULL);
    if (res == gcommInvalidUsage && strstr(gcommGetLastError(NULL), "thread")) c->namesThreads++;
    if (res == gcommSuccess) res = gcommWait(c->comm, NULL);
    if (res != gcommSuccess) {
      c->refused++;
      continue;
    }
    int ok = 1;
    for (int j = 0; j < THREAD_COUNT && ok; j++) {
      int64_t want = 0;
      for (int r = 0; r < tlNranks; r++) want += threadValue(r, c->t, i, j);
      ok = buf[j] == want;
    }
    if (ok)
      c->good++;
    else
      c->wrong++;
  }
  return NULL;
}

/* Two threads share one communicator that the main thread created. */
static void testThreads(void) {
  gcommComm_t comm = tlCommInitEnv(MPI_COMM_WORLD, "", -1);
  if (!tlReport("misuse threads: init")) return;
  CallerThread c[2] = {{comm, 0, 0, 0, 0, 0}, {comm, 1, 0, 0, 0, 0}};
  pthread_t thread[2];
  for (int t = 0; t < 2; t++) pthread_create(&thread[t], NULL, callerThread, &c[t]);
  for (int t = 0; t < 2; t++) pthread_join(thread[t], NULL);
  int wrong = c[0].wrong + c[1].wrong;
  if (wrong > 0)
    tlFail("%d of %d all-reduces returned success with a wrong result (%d right, %d refused)",
           wrong, 2 * THREAD_CALLS, c[0].good + c[1].good, c[0].refused + c[1].refused);
  else if (c[0].refused + c[1].refused > 0 && c[0].namesThreads + c[1].namesThreads == 0)
    tlFail("calls were refused, but no message says gcommInvalidUsage naming the threads: %s",
           gcommGetLastError(comm));
  tlReport(
      "misuse threads: 2 threads x %d all-reduces on one communicator: no wrong result "
      "returned as success",
      THREAD_CALLS);
  int64_t one = 1;
  TL_OK(comm, gcommAllReduce(&one, &one, 1, gcommInt64, gcommSum, comm, NULL));
  TL_OK(comm, gcommWait(comm, NULL));
  if (one != tlNranks) tlFail("the all-reduce gave %lld", (long long)one);
  tlReport("misuse threads: the creating thread's all-reduce works after");
  tlBarrier(MPI_COMM_WORLD);
  tlCommDestroy(comm);
}

static void expectError(gcommResult_t res, gcommResult_t want, const char* call, const char* text) {
  const char* msg = gcommGetLastError(NULL);
  if (res != want)
    tlFail("%s returned %s, not %s", call, gcommGetErrorString(res), gcommGetErrorString(want));
  else if (text && !strstr(msg, text))
    tlFail("%s: the message does not say \"%s\": %s", call, text, msg);
}

static void testDestroyed(void) {
  gcommComm_t comm = tlCommInitEnv(MPI_COMM_WORLD, "", -1);
  if (!tlReport("misuse destroyed: init")) return;
  tlBarrier(MPI_COMM_WORLD);
  tlCommDestroy(comm);
  float x = 1;
  int n = 0;
  expectError(gcommAllReduce(&x, &x, 1, gcommFloat32, gcommSum, comm, NULL), gcommInvalidArgument,
              "gcommAllReduce", "not a live communicator");
  expectError(gcommWait(comm, NULL), gcommInvalidArgument, "gcommWait", "not a live");
  expectError(gcommCommCount(comm, &n), gcommInvalidArgument, "gcommCommCount", "not a live");
  expectError(gcommCommDestroy(comm), gcommInvalidArgument, "a second gcommCommDestroy",
              "not a live");
  tlReport(
      "misuse destroyed: calls on a destroyed communicator and a second destroy are "
      "gcommInvalidArgument");
}

static void testDestroyInGroup(void) {
  gcommComm_t comm = tlCommInitEnv(MPI_COMM_WORLD, "", -1);
  if (!tlReport("misuse destroy in a group: init")) return;
  int32_t in[101], buf[101]; /* not in place: one rank then has work to queue too */
  for (int i = 0; i < 101; i++) in[i] = i + tlRank;
  TL_OK(comm, gcommGroupStart());
  TL_OK(comm, gcommAllReduce(in, buf, 101, gcommInt32, gcommSum, comm, NULL));
  expectError(gcommCommDestroy(comm), gcommInvalidUsage, "gcommCommDestroy in the group",
              "a group is open");
  TL_OK(comm, gcommGroupEnd());
  TL_OK(comm, gcommWait(comm, NULL));
  for (int i = 0; i < 101 && !tlLocalFailed; i++)
    if (buf[i] != i * tlNranks + tlNranks * (tlNranks - 1) / 2)
      tlFail("element %d is %d after the group", i, (int)buf[i]);
  tlBarrier(MPI_COMM_WORLD);
  tlCommDestroy(comm);
  tlReport(
      "misuse destroy in a group: refused (gcommInvalidUsage), the group then runs, destroy "
      "after works");
}

/* GCOMM_* choices that shape the schedule, set differently on even and odd ranks. */
static void testDisagree(const char* var, const char* even, const char* odd) {
  if (tlNranks < 2) return;
  setenv(var, tlRank % 2 ? odd : even, 1);
  gcommComm_t comm = NULL;
  gcommResult_t res = gcommCommInitMPI(&comm, MPI_COMM_WORLD, NULL);
  unsetenv(var);
  expectError(res, gcommInvalidUsage, "gcommCommInitMPI", var);
  if (res == gcommSuccess) gcommCommDestroy(comm);
  tlReport("misuse %s=%s on even ranks, %s on odd ones: init fails on every rank naming it", var,
           even, odd);
}

static void testHuge(gcommComm_t comm) {
  static char buf[64];
  expectError(gcommAllGather(buf, buf, SIZE_MAX / 8, gcommInt8, comm, NULL), gcommInvalidArgument,
              "gcommAllGather", "too large");
  expectError(gcommAllReduce(buf, buf + 1, SIZE_MAX / 8, gcommFloat32, gcommSum, comm, NULL),
              gcommInvalidArgument, "gcommAllReduce", "too large");
  tlReport("misuse AllGather and AllReduce of SIZE_MAX/8 elements: \"too large\"");
}

/* Doubles and int64s at odd byte offsets: every load and store of the reductions is unaligned. */
static void testMisaligned(gcommComm_t comm) {
  static const gcommDataType_t types[] = {gcommFloat64, gcommInt64, gcommInt32, gcommFloat16};
  static const gcommRedOp_t ops[] = {gcommSum, gcommMax, gcommAvg};
  enum { COUNTN = 1031 };
  for (int t = 0; t < N(types); t++)
    for (int o = 0; o < N(ops); o++) {
      gcommDataType_t type = types[t];
      size_t esz = tlTypes[type].size;
      TlBuf in = tlBufAlloc(COUNTN * esz, 1), out = tlBufAlloc(COUNTN * esz, 3);
      for (size_t i = 0; i < COUNTN; i++) /* small integers: every sum is exact */
        tlStore(type, in.ptr, i, tlFromDouble(type, (double)((tlRank * 7 + i) % 13)));
      TL_OK(comm, gcommAllReduce(in.ptr, out.ptr, COUNTN, type, ops[o], comm, NULL));
      TL_OK(comm, gcommWait(comm, NULL));
      for (size_t i = 0; i < COUNTN && !tlLocalFailed; i++) {
        double want = 0, got = tlToDouble(type, tlLoad(type, out.ptr, i));
        for (int r = 0; r < tlNranks; r++) {
          double v = (double)((r * 7 + i) % 13);
          want = ops[o] == gcommMax ? (v > want ? v : want) : want + v;
        }
        if (ops[o] == gcommAvg)
          want = tlTypes[type].isFloat ? want / tlNranks : (double)((int64_t)want / tlNranks);
        double tol = tlTypes[type].isFloat ? fabs(want) * 4 * tlTypes[type].eps : 0;
        if (fabs(got - want) > tol)
          tlFail("%s %s element %zu: %g, expected %g", tlTypes[type].name, tlOpNames[ops[o]], i,
                 got, want);
      }
      tlBufCheckGuards(&out, "recvbuff");
      tlBufFree(&in);
      tlBufFree(&out);
      tlReport("misuse misaligned: %s %s, sendbuff at +1 byte, recvbuff at +3", tlTypes[type].name,
               tlOpNames[ops[o]]);
    }
}

/* A dump signal that is not SIGUSR1/2 or real-time would take over a signal the program or the
 * runtime needs (11: a crash would loop; 2: Ctrl-C would be swallowed). */
static void testDumpSignal(const char* value, int sig) {
  char env[64];
  snprintf(env, sizeof(env), "GCOMM_PROXY_DUMP_SIGNAL=%s", value);
  struct sigaction before, after;
  sigaction(sig, NULL, &before);
  gcommComm_t comm = tlCommInitEnv(MPI_COMM_WORLD, env, -1);
  sigaction(sig, NULL, &after);
  if (after.sa_handler != before.sa_handler)
    tlFail("%s replaced the handler of signal %d", env, sig);
  tlBarrier(MPI_COMM_WORLD);
  tlCommDestroy(comm);
  tlReport("misuse %s: no handler installed (a warning instead)", env);
}

int main(int argc, char** argv) {
  tlInit(&argc, &argv);
  gcommComm_t comm = tlCommInitEnv(MPI_COMM_WORLD, "", -1);
  if (tlReport("errors: init")) {
    for (Bad b = 0; b < NBADS; b++)
      for (Func f = 0; f < NFUNCS; f++)
        if (bads[b].funcs & FN(f)) testBad(comm, b, f);
    for (Bad b = 0; b < NBADS; b++)
      for (Func f = 0; f < NFUNCS; f++)
        if ((bads[b].funcs & FN(f)) && b != BAD_SEND_NULL && b != BAD_RECV_NULL && b != BAD_OVERLAP)
          testCountZero(comm, b, f);
    testCountZeroThread(comm);
    testMisc(comm);
    testHuge(comm);
    testMisaligned(comm);
    testRedOps(comm);
    tlCommDestroy(comm);
    tlReport("errors: destroy");
  }
  testAbort(GCOMM_PROXY_POLL, "poll");
  testAbort(GCOMM_PROXY_THREAD, "thread");
  testTimeout(-1, "thread");
  testTimeout(GCOMM_PROXY_POLL, "poll");
  testThreads();
  testDestroyed();
  testDestroyInGroup();
  testDisagree("GCOMM_ALGO", "ring", "tree");
  testDisagree("GCOMM_PROTO", "simple", "ll");
  testDisagree("GCOMM_SHM_USE_CUDA_MEMCPY", "0", "1");
  testDisagree("GCOMM_SHM_MEMCPY_MODE", "1", "3");
  testDisagree("GCOMM_SHM_LOCALITY", "2", "1");
  testDumpSignal("11", SIGSEGV);
  testDumpSignal("2", SIGINT);
  return tlFinish("test_errors");
}
