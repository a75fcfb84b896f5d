/*
 * test_p2p.c - gcommSend / gcommRecv.
 *
 * A plan is a list of sends and receives of this rank. The m-th message from rank s to rank d
 * holds random bits from (plan seed, s, d, m), so a receiver knows what each message must hold
 * and a message matched out of order is caught. After the wait every receive buffer must hold
 * its message exactly, every send buffer its data unchanged, and all guard zones be intact.
 *
 * Checks, on a threaded communicator and on a polled one with 4 KiB FIFOs and 2 channels:
 *   pairs      every ordered pair (self included), in a group, in every call order
 *   nogroup    send/recv outside groups between rank pairs
 *   many       many messages of varied counts and types to one peer, matched in order, and
 *              a fan-in of several messages from every rank to rank 0
 *   self       messages to this rank in one group, receives before and between their sends
 *   groups     several groups enqueued before one wait
 *   counts     zero, odd and large counts in a ring exchange
 *   ring       a bidirectional ring exchange in one group
 *   fused      collectives and send/recv in one (nested) group
 *   lines      outside groups, messages that fit a FIFO line (run in their call while nothing
 *              else is under way) behind a larger one still in flight, more of them than the
 *              line FIFO holds before the receiver starts, and receives that find them waiting
 */
#include "test/testlib.h"

#define MAX_OPS 512

typedef struct {
  int isSend, peer;
  size_t count;
  gcommDataType_t type;
  uint64_t seed; /* of the message's data */
  TlBuf buf;
} Op;

typedef struct {
  uint64_t seed;
  int nops;
  Op ops[MAX_OPS];
  int sent[64], received[64]; /* messages so far to / from each peer (gives m) */
} Plan;

static void planStart(Plan* p) {
  memset(p, 0, sizeof(*p));
  p->seed = tlNextSeed();
}

/* Adds a send to peer or a receive from peer; the data or poison is set up now. */
static void planAdd(Plan* p, int isSend, int peer, size_t count, gcommDataType_t type) {
  if (p->nops == MAX_OPS || tlNranks > 64) {
    tlFail("test plan too large");
    return;
  }
  Op* op = &p->ops[p->nops++];
  int src = isSend ? tlRank : peer, dst = isSend ? peer : tlRank;
  int m = isSend ? p->sent[peer]++ : p->received[peer]++;
  op->isSend = isSend, op->peer = peer, op->count = count, op->type = type;
  op->seed = tlHash3(p->seed, (uint64_t)src * 64 + (uint64_t)dst, (uint64_t)m);
  op->buf = tlBufAlloc(count * tlTypes[type].size, (size_t)(p->nops & 1) * tlTypes[type].size);
  if (isSend) tlFillRandom(op->buf.ptr, count, type, op->seed, 0);
}

static gcommResult_t opIssue(const Op* op, gcommComm_t comm) {
  return op->isSend ? gcommSend(op->buf.ptr, op->count, op->type, op->peer, comm, NULL)
                    : gcommRecv(op->buf.ptr, op->count, op->type, op->peer, comm, NULL);
}

/* Issues ops [from, to) of the plan in a group (or one by one when !grouped). */
static void planIssue(Plan* p, int from, int to, int grouped, gcommComm_t comm) {
  if (grouped) TL_OK(comm, gcommGroupStart());
  for (int i = from; i < to; i++) TL_OK(comm, opIssue(&p->ops[i], comm));
  if (grouped) TL_OK(comm, gcommGroupEnd());
}

/* Checks every buffer of the plan and frees it. */
static void planVerify(Plan* p, const char* what) {
  char name[160], want[64], got[64];
  for (int i = 0; i < p->nops; i++) {
    Op* op = &p->ops[i];
    snprintf(name, sizeof(name), "%s: %s %zu %s %s peer %d (op %d)", what,
             op->isSend ? "send of" : "recv of", op->count, tlTypes[op->type].name,
             op->isSend ? "to" : "from", op->peer, i);
    if (!tlLocalFailed && tlBufCheckGuards(&op->buf, name)) {
      for (size_t e = 0; e < op->count; e++) {
        uint64_t w = tlHash3(op->seed, 0, e) & tlMask(tlTypes[op->type].size);
        uint64_t g = tlLoad(op->type, op->buf.ptr, e);
        if (g == w) continue;
        tlFail("%s: element %zu: expected %s, got %s%s", name, e,
               tlFormat(op->type, w, want, sizeof(want)), tlFormat(op->type, g, got, sizeof(got)),
               op->isSend ? " (a send buffer must stay unchanged)" : "");
        break;
      }
    }
    tlBufFree(&op->buf);
  }
  p->nops = 0;
}

static void waitAndVerify(Plan* p, gcommComm_t comm, const char* what) {
  TL_OK(comm, gcommWait(comm, NULL));
  planVerify(p, what);
}

static Plan plan; /* large: not on the stack */

/* Every ordered pair: in round k, rank r sends to r+k and receives from r-k. Orders: 0 all ranks
 * send first, 1 all receive first, 2 even ranks send first, 3 odd ranks send first. */
static void testPairs(gcommComm_t comm, const char* cname) {
  static const size_t counts[] = {1, 7, 1031};
  for (int k = 0; k < tlNranks; k++) {
    int to = (tlRank + k) % tlNranks, from = (tlRank - k + tlNranks) % tlNranks;
    for (int order = 0; order < 4; order++) {
      int sendFirst = order == 0 || (order == 2 && tlRank % 2 == 0) || (order == 3 && tlRank % 2);
      for (int ci = 0; ci < 3; ci++) {
        gcommDataType_t type = (gcommDataType_t)((k + order + ci) % gcommNumTypes);
        planStart(&plan);
        planAdd(&plan, sendFirst, sendFirst ? to : from, counts[ci], type);
        planAdd(&plan, !sendFirst, sendFirst ? from : to, counts[ci], type);
        planIssue(&plan, 0, 2, 1, comm);
        char what[64];
        snprintf(what, sizeof(what), "shift %d order %d", k, order);
        waitAndVerify(&plan, comm, what);
      }
    }
    tlReport("p2p pairs shift %d (%s), 4 call orders [%s]", k, k ? "to rank+k" : "self", cname);
  }
}

/* Outside groups: ranks 2i and 2i+1 exchange, the even one sending first. */
static void testNoGroup(gcommComm_t comm, const char* cname) {
  int peer = tlRank ^ 1;
  planStart(&plan); /* on every rank: it draws the next seed */
  if (peer < tlNranks) {
    int even = tlRank % 2 == 0;
    planAdd(&plan, even, peer, 1031, gcommFloat32);
    planAdd(&plan, !even, peer, 1031, gcommFloat32);
    planAdd(&plan, even, peer, 7, gcommInt8);
    planAdd(&plan, !even, peer, 7, gcommInt8);
    planIssue(&plan, 0, plan.nops, 0, comm);
    waitAndVerify(&plan, comm, "nogroup");
  }
  tlReport("p2p send/recv outside a group, rank pairs [%s]", cname);
}

static const size_t manyCounts[] = {0, 1, 7, 33, 1031, 4099};
#define MANY_COUNT(m) manyCounts[(m) % 6]
#define MANY_TYPE(m) ((gcommDataType_t)((m) % gcommNumTypes))

static void testMany(gcommComm_t comm, const char* cname) {
  int right = (tlRank + 1) % tlNranks, left = (tlRank - 1 + tlNranks) % tlNranks;
  planStart(&plan);
  for (int m = 0; m < 24; m++) planAdd(&plan, 1, right, MANY_COUNT(m), MANY_TYPE(m));
  for (int m = 0; m < 24; m++) planAdd(&plan, 0, left, MANY_COUNT(m), MANY_TYPE(m));
  planIssue(&plan, 0, plan.nops, 1, comm);
  waitAndVerify(&plan, comm, "many to one peer");
  tlReport("p2p 24 messages of varied sizes to one peer, in order [%s]", cname);

  /* Fan-in: rank 0 receives 3 messages from every rank, itself included. */
  planStart(&plan);
  for (int m = 0; m < 3; m++) {
    planAdd(&plan, 1, 0, MANY_COUNT(m + 3), MANY_TYPE(m + 1));
    for (int r = 0; tlRank == 0 && r < tlNranks; r++)
      planAdd(&plan, 0, r, MANY_COUNT(m + 3), MANY_TYPE(m + 1));
  }
  planIssue(&plan, 0, plan.nops, 1, comm);
  waitAndVerify(&plan, comm, "fan-in");
  tlReport("p2p fan-in: every rank sends 3 messages to rank 0 [%s]", cname);
}

/* Messages to this rank in one group, receives called before their sends and between them, a
 * ring exchange in the middle (from 2 ranks): the k-th receive from the rank gets its k-th send (a
 * group runs each such pair as one copy). */
static void testSelf(gcommComm_t comm, const char* cname) {
  static const struct {
    size_t count;
    gcommDataType_t type;
  } msgs[] = {{1031, gcommFloat32}, {7, gcommInt8}, {300007, gcommInt64}, {1, gcommFloat16}};
  int right = (tlRank + 1) % tlNranks, left = (tlRank - 1 + tlNranks) % tlNranks;
  planStart(&plan);
  planAdd(&plan, 0, tlRank, msgs[0].count, msgs[0].type);
  planAdd(&plan, 0, tlRank, msgs[1].count, msgs[1].type);
  planAdd(&plan, 1, tlRank, msgs[0].count, msgs[0].type);
  if (tlNranks > 1) { /* on one rank the ring's messages would be the rank's own too */
    planAdd(&plan, 1, right, 4099, gcommFloat64);
    planAdd(&plan, 0, left, 4099, gcommFloat64);
  }
  for (int m = 1; m < 4; m++) {
    planAdd(&plan, 1, tlRank, msgs[m].count, msgs[m].type);
    if (m >= 2) planAdd(&plan, 0, tlRank, msgs[m].count, msgs[m].type);
  }
  planIssue(&plan, 0, plan.nops, 1, comm);
  waitAndVerify(&plan, comm, "self");
  tlReport("p2p 4 messages to this rank in one group, receives first and between [%s]", cname);
}

/* Several groups, each a ring step, enqueued before one wait: they match in call order. */
static void testGroups(gcommComm_t comm, const char* cname) {
  int right = (tlRank + 1) % tlNranks, left = (tlRank - 1 + tlNranks) % tlNranks;
  planStart(&plan);
  for (int g = 0; g < 8; g++) {
    planAdd(&plan, g % 2, g % 2 ? right : left, MANY_COUNT(g), MANY_TYPE(g));
    planAdd(&plan, !(g % 2), g % 2 ? left : right, MANY_COUNT(g), MANY_TYPE(g));
    planIssue(&plan, 2 * g, 2 * g + 2, 1, comm);
  }
  waitAndVerify(&plan, comm, "groups");
  tlReport("p2p 8 groups enqueued before one wait [%s]", cname);
}

/* Ring exchange (right then left) with zero, odd and large counts. */
static void testCounts(gcommComm_t comm, const char* cname) {
  static const struct {
    size_t count;
    gcommDataType_t type;
  } sizes[] = {{0, gcommFloat32},   {1, gcommInt8},       {3, gcommFloat16},
               {1031, gcommUint64}, {300007, gcommInt64}, {(1 << 22) + 1, gcommUint8}};
  int right = (tlRank + 1) % tlNranks, left = (tlRank - 1 + tlNranks) % tlNranks;
  for (int i = 0; i < (int)(sizeof(sizes) / sizeof(sizes[0])); i++) {
    planStart(&plan);
    planAdd(&plan, 1, right, sizes[i].count, sizes[i].type);
    planAdd(&plan, 0, left, sizes[i].count, sizes[i].type);
    planIssue(&plan, 0, 2, 1, comm);
    waitAndVerify(&plan, comm, "counts");
    tlReport("p2p ring exchange of %zu %s [%s]", sizes[i].count, tlTypes[sizes[i].type].name,
             cname);
  }
}

/* Both directions of a ring in one group: X goes right, Y goes left. With 1 or 2 ranks, left and
 * right are the same peer and messages match in call order: sends go X then Y, so receives take
 * X (from the left) before Y (from the right). */
static void testRing(gcommComm_t comm, const char* cname) {
  int right = (tlRank + 1) % tlNranks, left = (tlRank - 1 + tlNranks) % tlNranks;
  planStart(&plan);
  planAdd(&plan, 0, left, 1031, gcommInt32);    /* X */
  planAdd(&plan, 1, right, 1031, gcommInt32);   /* X */
  planAdd(&plan, 1, left, 4099, gcommFloat64);  /* Y */
  planAdd(&plan, 0, right, 4099, gcommFloat64); /* Y */
  planIssue(&plan, 0, plan.nops, 1, comm);
  waitAndVerify(&plan, comm, "ring");
  tlReport("p2p bidirectional ring exchange in one group [%s]", cname);
}

/* In one nested group: an int32 allreduce, a ring send/recv, a broadcast from the last rank. */
static void testFused(gcommComm_t comm, const char* cname) {
  const size_t n = 1031;
  int right = (tlRank + 1) % tlNranks, left = (tlRank - 1 + tlNranks) % tlNranks;
  uint64_t seed = tlNextSeed();
  int32_t* arIn = malloc(n * 4);
  int32_t* arOut = malloc(n * 4);
  double* bc = malloc(n * 8);
  tlFillRandom(arIn, n, gcommInt32, seed, tlRank);
  tlFillRandom(bc, n, gcommFloat64, seed, tlRank == tlNranks - 1 ? -1 : tlRank);
  planStart(&plan);
  planAdd(&plan, 1, right, 4099, gcommUint8);
  planAdd(&plan, 0, left, 4099, gcommUint8);

  TL_OK(comm, gcommGroupStart());
  TL_OK(comm, gcommAllReduce(arIn, arOut, n, gcommInt32, gcommSum, comm, NULL));
  TL_OK(comm, gcommGroupStart());
  planIssue(&plan, 0, 2, 0, comm);
  TL_OK(comm, gcommGroupEnd());
  TL_OK(comm, gcommBroadcast(bc, bc, n, gcommFloat64, tlNranks - 1, comm, NULL));
  TL_OK(comm, gcommGroupEnd());
  TL_OK(comm, gcommWait(comm, NULL));

  for (size_t i = 0; i < n && !tlLocalFailed; i++) {
    uint32_t sum = 0;
    for (int r = 0; r < tlNranks; r++) sum += (uint32_t)tlHash3(seed, (uint64_t)r, i);
    if ((uint32_t)arOut[i] != sum)
      tlFail("fused allreduce element %zu: expected %u, got %u", i, sum, (uint32_t)arOut[i]);
    uint64_t w = tlHash3(seed, (uint64_t)-1, i), g;
    memcpy(&g, &bc[i], 8);
    if (g != w)
      tlFail("fused broadcast element %zu: expected 0x%llx, got 0x%llx", i, (unsigned long long)w,
             (unsigned long long)g);
  }
  planVerify(&plan, "fused send/recv");
  free(arIn), free(arOut), free(bc);
  tlReport("p2p allreduce + send/recv + broadcast fused in one nested group [%s]", cname);
}

/* Ranks 2i and 2i+1: the even one sends a message larger than a FIFO, then 100 that fit a line
 * (int32, 1-12 elements) without waiting; the odd one receives them one call at a time, in order.
 * Either the receiver starts late, so that the messages pile up (more than a line FIFO's 64 steps:
 * some wait for room), or the sender does, so that every receive waits in its queue before its
 * message comes (a small send that overtook the larger one would land where the larger one's
 * receive expects its next step). Then the other way, each receive posted before its send, one
 * pair at a time. */
static void testLines(gcommComm_t comm, const char* cname) {
  int peer = tlRank ^ 1, even = tlRank % 2 == 0;
  for (int late = 0; late < 2; late++) {
    planStart(&plan);
    if (peer < tlNranks) {
      planAdd(&plan, even, peer, 300007, gcommInt64);
      for (int m = 0; m < 100; m++) planAdd(&plan, even, peer, 1 + m % 12, gcommInt32);
      if (even == late) usleep(20000);
      planIssue(&plan, 0, plan.nops, 0, comm);
      waitAndVerify(&plan, comm,
                    late ? "lines behind a larger message, sender late"
                         : "lines behind a larger message, receiver late");
    }
    tlReport("p2p 100 line-sized messages behind a larger one, outside groups, %s late [%s]",
             late ? "sender" : "receiver", cname);
  }
  planStart(&plan);
  for (int m = 0; m < 20 && peer < tlNranks; m++) {
    planAdd(&plan, 0, peer, 1 + m % 12, gcommUint8);
    planAdd(&plan, 1, peer, 1 + m % 12, gcommUint8);
    planIssue(&plan, 2 * m, 2 * m + 2, 0, comm);
  }
  if (peer < tlNranks) waitAndVerify(&plan, comm, "lines, receive first");
  tlReport("p2p 20 line-sized exchanges, each receive before its send [%s]", cname);
}

int main(int argc, char** argv) {
  tlInit(&argc, &argv);
  static const struct {
    const char* name;
    const char* env;
    int proxyMode;
  } variants[] = {
      {"thread", "", -1},
      {"poll/4k/2ch", "GCOMM_BUFFSIZE=4096 GCOMM_NCHANNELS=2", GCOMM_PROXY_POLL},
  };
  for (int v = 0; v < 2; v++) {
    gcommComm_t comm = tlCommInitEnv(MPI_COMM_WORLD, variants[v].env, variants[v].proxyMode);
    if (!tlReport("p2p init communicator [%s]", variants[v].name)) continue;
    const char* cname = variants[v].name;
    testPairs(comm, cname);
    testNoGroup(comm, cname);
    testMany(comm, cname);
    testSelf(comm, cname);
    testGroups(comm, cname);
    testCounts(comm, cname);
    testRing(comm, cname);
    testFused(comm, cname);
    testLines(comm, cname);
    tlCommDestroy(comm);
    tlReport("p2p destroy communicator [%s]", cname);
  }
  return tlFinish("test_p2p");
}
