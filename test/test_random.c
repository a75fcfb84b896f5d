/*
 * test_random.c - a random sequence of valid and invalid calls for TEST_RANDOM_SECONDS (default
 * 4): collectives (every function, datatype and op, counts up to 200k, in place or not, any root),
 * groups of collectives with a ring of sends and receives, chains of int32 collectives posted one
 * call after another on overlapping memory before one wait, splits (colors, NOCOLOR, reversed keys,
 * poll or thread mode) and destroys, and on each rank on its own, invalid calls (bad arguments,
 * a stream on a host communicator, GroupEnd without GroupStart), alone or inside a group.
 * Every rank draws the same valid sequence from the run's seed (printed; TEST_SEED=0x... repeats
 * it) and its invalid calls from its own. Checks: invalid calls return gcommInvalidArgument or
 * gcommInvalidUsage and change nothing; every wait succeeds; int32 sums and data movements are
 * compared with a reference; nothing crashes, hangs (test/run.sh's timeout) or leaks (the SAN=1
 * run).
 */
#include "test/testlib.h"

/* the collectives, in gcomm_sched.h's order */
enum { AllReduce, Broadcast, Reduce, AllGather, ReduceScatter, AllToAll, Gather, Scatter };
static const char* const funcNames[] = {"AllReduce",     "Broadcast", "Reduce", "AllGather",
                                        "ReduceScatter", "AllToAll",  "Gather", "Scatter"};

#define POOL 4 /* communicators alive at once: slot 0 is the world, the others splits */

typedef struct {
  int made;           /* the same on every rank: the slot holds a communicator */
  gcommComm_t comm;   /* NULL where this rank is not a member */
  int members[64], n; /* world ranks in communicator rank order */
} Slot;

static Slot pool[POOL];
static uint64_t rngShared, rngLocal;
static long nColls, nGroups, nChains, nSplits, nInvalid;

static uint64_t next(uint64_t* s) {
  *s = tlMix(*s);
  return *s;
}
static unsigned pick(unsigned n) {
  return (unsigned)(next(&rngShared) % n);
}

static int32_t input(uint64_t seed, int worldRank, size_t k) {
  return (int32_t)(tlHash3(seed, (uint64_t)worldRank, k) & 0xff);
}

/* A split of the world: color r % k unless (r + off) % 4 == 3 (NOCOLOR, when there are several
 * ranks), key -r (so the new ranks run backwards). */
static void split(int slot, int k, int off, int poll) {
  Slot* s = &pool[slot];
  int color = (tlNranks > 1 && (tlRank + off) % 4 == 3) ? GCOMM_SPLIT_NOCOLOR : tlRank % k;
  gcommConfig_t config = GCOMM_CONFIG_INITIALIZER;
  config.proxyMode = poll ? GCOMM_PROXY_POLL : GCOMM_PROXY_THREAD;
  s->comm = NULL;
  s->made = 1;
  TL_OK(pool[0].comm, gcommCommSplit(pool[0].comm, color, -tlRank, &s->comm, &config));
  s->n = 0;
  for (int r = tlNranks - 1; r >= 0 && color != GCOMM_SPLIT_NOCOLOR; r--)
    if (!(tlNranks > 1 && (r + off) % 4 == 3) && r % k == color) s->members[s->n++] = r;
  int n = -1;
  if (s->comm) TL_OK(s->comm, gcommCommCount(s->comm, &n));
  if (s->comm && n != s->n) tlFail("split: %d ranks, expected %d", n, s->n);
  nSplits++;
}

/* One invalid call on this rank alone: it must fail cleanly and change nothing. */
static void invalidCall(gcommComm_t comm) {
  int32_t buf[16], copy[16];
  for (int k = 0; k < 16; k++) buf[k] = copy[k] = (int32_t)next(&rngLocal);
  int n = 0;
  gcommCommCount(comm, &n);
  gcommResult_t res;
  unsigned kind = (unsigned)(next(&rngLocal) % 8);
  switch (kind) {
    case 0:
      res = gcommAllReduce(buf, buf, 8, gcommInt32, gcommSum, NULL, NULL);
      break;
    case 1:
      res = gcommAllReduce(buf, buf, 8, (gcommDataType_t)(gcommNumTypes + 3), gcommSum, comm, NULL);
      break;
    case 2:
      res = gcommReduce(buf, buf, 8, gcommInt32, (gcommRedOp_t)-1, 0, comm, NULL);
      break;
    case 3:
      res = gcommBroadcast(buf, buf, 8, gcommInt32, n, comm, NULL);
      break;
    case 4:
      res = gcommSend(buf, 8, gcommInt32, -1, comm, NULL);
      break;
    case 5:
      res = gcommAllReduce(buf, buf + 1, 8, gcommInt32, gcommSum, comm, NULL); /* overlap */
      break;
    case 6:
      res = gcommAllGather(buf, NULL, 8, gcommInt32, comm, (gcommStream_t)buf);
      break;
    default:
      res = gcommAllToAll(buf, buf, SIZE_MAX / 4, gcommInt32, comm, NULL);
  }
  if (res != gcommInvalidArgument && res != gcommInvalidUsage)
    tlFail("invalid call %u returned %s", kind, gcommGetErrorString(res));
  if (memcmp(copy, buf, sizeof(buf)) != 0) tlFail("invalid call %u changed the buffer", kind);
  nInvalid++;
}

typedef struct {
  int func, type, op, root, inPlace;
  size_t count;
  uint64_t seed;
  int32_t *send, *recv; /* the buffers of the call (recv may point into send or the reverse) */
  TlBuf in, out;
} Call;

/* Draws a collective (shared), prepares this rank's buffers and posts it on slot s. */
static void postColl(Slot* s, Call* c) {
  c->func = (int)pick(8);
  c->type = (int)pick(gcommNumTypes);
  c->op = (int)pick(gcommNumOps);
  c->root = (int)pick(64);
  c->inPlace = pick(3) == 0;
  c->count = pick(8) == 0 ? pick(200000) : pick(300);
  c->seed = next(&rngShared);
  if (pick(2)) c->type = gcommInt32; /* half of them are checked: int32 sums */
  if (c->type == gcommInt32) c->op = gcommSum;
  if (s->comm == NULL) return;
  int n = s->n, me = 0;
  gcommCommUserRank(s->comm, &me);
  c->root %= n;
  size_t esz = tlTypes[c->type].size, big = c->count * (size_t)n;
  c->in = tlBufAlloc(big * esz + 16, 0);
  c->out = tlBufAlloc(big * esz + 16, 0);
  for (size_t k = 0; k < big && c->type == gcommInt32; k++)
    ((int32_t*)c->in.ptr)[k] = input(c->seed, s->members[me], k);
  if (c->type != gcommInt32) tlFillRandom(c->in.ptr, big, c->type, c->seed, s->members[me]);
  c->send = (int32_t*)c->in.ptr;
  c->recv = (int32_t*)c->out.ptr;
  char* o = (char*)c->out.ptr;
  if (c->inPlace) switch (c->func) {
      case AllReduce:
      case Broadcast:
      case Reduce:
        memcpy(o, c->in.ptr, c->count * esz);
        c->send = c->recv;
        break;
      case AllToAll: /* sendbuff == recvbuff */
        memcpy(o, c->in.ptr, big * esz);
        c->send = c->recv;
        break;
      case AllGather: /* sendbuff = recvbuff + me * count */
        memcpy(o + me * c->count * esz, c->in.ptr, c->count * esz);
        c->send = (int32_t*)(o + me * c->count * esz);
        break;
      case ReduceScatter: /* recvbuff = sendbuff + me * count */
        memcpy(o, c->in.ptr, big * esz);
        c->send = (int32_t*)o;
        c->recv = (int32_t*)(o + me * c->count * esz);
        break;
    }
  void *sb = c->send, *rb = c->recv;
  size_t cnt = c->count;
  gcommComm_t comm = s->comm;
  gcommResult_t res = gcommInternalError;
  switch (c->func) {
    case AllReduce:
      res = gcommAllReduce(sb, rb, cnt, c->type, c->op, comm, NULL);
      break;
    case Broadcast:
      res = gcommBroadcast(sb, rb, cnt, c->type, c->root, comm, NULL);
      break;
    case Reduce:
      res = gcommReduce(sb, rb, cnt, c->type, c->op, c->root, comm, NULL);
      break;
    case AllGather:
      res = gcommAllGather(sb, rb, cnt, c->type, comm, NULL);
      break;
    case ReduceScatter:
      res = gcommReduceScatter(sb, rb, cnt, c->type, c->op, comm, NULL);
      break;
    case AllToAll:
      res = gcommAllToAll(sb, rb, cnt, c->type, comm, NULL);
      break;
    case Gather:
      res = gcommGather(sb, rb, cnt, c->type, c->root, comm, NULL);
      break;
    default:
      res = gcommScatter(sb, rb, cnt, c->type, c->root, comm, NULL);
  }
  TL_OK(comm, res);
  nColls++;
}

/* After the wait: int32 sums and data movements against the reference; frees the buffers. */
static void checkColl(Slot* s, Call* c) {
  if (s->comm == NULL) return;
  int n = s->n, me = 0;
  gcommCommUserRank(s->comm, &me);
  size_t cnt = c->count, outCount = cnt;
  if (c->func == AllGather || c->func == AllToAll || (c->func == Gather && me == c->root))
    outCount = cnt * n;
  if ((c->func == Reduce || c->func == Gather) && me != c->root) outCount = 0;
  for (size_t k = 0; k < outCount && c->type == gcommInt32 && !tlLocalFailed; k++) {
    int64_t want = 0;
    size_t blk = k / (cnt ? cnt : 1), off = k % (cnt ? cnt : 1);
    switch (c->func) {
      case AllReduce:
      case Reduce:
        for (int j = 0; j < n; j++) want += input(c->seed, s->members[j], k);
        break;
      case Broadcast:
        want = input(c->seed, s->members[c->root], k);
        break;
      case AllGather:
      case Gather:
        want = input(c->seed, s->members[blk], off);
        break;
      case ReduceScatter:
        for (int j = 0; j < n; j++) want += input(c->seed, s->members[j], me * cnt + k);
        break;
      case AllToAll:
        want = input(c->seed, s->members[blk], me * cnt + off);
        break;
      default: /* Scatter */
        want = input(c->seed, s->members[c->root], me * cnt + k);
    }
    if (c->recv[k] != (int32_t)want)
      tlFail("%s count %zu root %d%s on %d ranks: element %zu is %d, expected %d",
             funcNames[c->func], cnt, c->root, c->inPlace ? " in place" : "", n, k, c->recv[k],
             (int)want);
  }
  tlBufCheckGuards(&c->in, "send buffer");
  tlBufCheckGuards(&c->out, "receive buffer");
  tlBufFree(&c->in);
  tlBufFree(&c->out);
}

/* A group: a few collectives on one communicator and a ring of sends and receives, maybe with an
 * invalid call (this rank's own) in the middle. */
static void group(Slot* s) {
  Call calls[3];
  int nc = 1 + (int)pick(3), withInvalid = next(&rngLocal) % 4 == 0;
  size_t count = pick(2000);
  int32_t *sbuf = NULL, *rbuf = NULL;
  if (s->comm) {
    sbuf = malloc((count + 1) * sizeof(int32_t));
    rbuf = malloc((count + 1) * sizeof(int32_t));
    for (size_t k = 0; k < count; k++) sbuf[k] = (int32_t)(k * 31 + (size_t)tlRank);
  }
  if (s->comm) TL_OK(s->comm, gcommGroupStart());
  for (int i = 0; i < nc; i++) {
    postColl(s, &calls[i]);
    if (i == 0 && withInvalid && s->comm) invalidCall(s->comm);
  }
  int me = 0, n = s->n;
  if (s->comm) {
    gcommCommUserRank(s->comm, &me);
    TL_OK(s->comm, gcommRecv(rbuf, count, gcommInt32, (me - 1 + n) % n, s->comm, NULL));
    TL_OK(s->comm, gcommSend(sbuf, count, gcommInt32, (me + 1) % n, s->comm, NULL));
    TL_OK(s->comm, gcommGroupEnd());
    TL_OK(s->comm, gcommWait(s->comm, NULL));
  }
  for (int i = 0; i < nc; i++) checkColl(s, &calls[i]);
  int from = s->comm ? s->members[(me - 1 + n) % n] : 0;
  for (size_t k = 0; k < count && s->comm && !tlLocalFailed; k++)
    if (rbuf[k] != (int32_t)(k * 31 + (size_t)from))
      tlFail("group ring: element %zu from rank %d is %d", k, from, rbuf[k]);
  free(sbuf);
  free(rbuf);
  nGroups++;
}

/* A chain: 2-5 int32 sum collectives posted one call after another on one arena of memory (on
 * chainComm, whose small FIFOs split even small calls over several channels), the
 * regions of each chosen at random (in place or not), so that later calls read and write what
 * earlier ones still use, with one wait at the end. gcomm runs a host communicator's calls in
 * order wherever they share memory, as a stream would. Reference: the same chain run serially on
 * every member's arena (its input is known to all). */
#define ARENA (1 << 20) /* int32 elements of each rank's arena: two halves of HALF */
#define HALF (ARENA / 2)
typedef struct {
  int func, root;
  size_t count, in, out;     /* elements: count, and the largest extent of each buffer */
  size_t sOff[64], dOff[64]; /* each member's buffers, as offsets into its arena */
} ChainOp;

/* Ranks in other splits draw alike (the shared sequence), so the draws never depend on n; the
 * members scale them to their n. */
static void drawChainOp(ChainOp* o, int n) {
  enum { FRACTION = 1 << 20 }; /* draws in [0, FRACTION) scaled to a range */
  o->func = (int)pick(8);
  unsigned root = pick(64), large = pick(2) == 0, size = pick(FRACTION), place = pick(3);
  unsigned sendHigh = pick(2), at[2] = {pick(FRACTION), pick(FRACTION)};
  if (n == 0) return;
  o->root = (int)(root % (unsigned)n);
  size_t c = o->count = large ? size * (HALF / n + 1) / FRACTION : size % 3000;
  int multiIn = o->func == ReduceScatter || o->func == AllToAll || o->func == Scatter;
  int multiOut = o->func == AllGather || o->func == AllToAll || o->func == Gather;
  o->in = multiIn ? c * n : c;
  o->out = multiOut ? c * n : c;
  if (place == 0) { /* gcomm.h's in-place layouts */
    size_t extent = o->in > o->out ? o->in : o->out;
    size_t base = at[0] * (ARENA - extent + 1) / FRACTION;
    for (int r = 0; r < n; r++) {
      o->sOff[r] = base + (o->func == AllGather || o->func == Gather ? r * c : 0);
      o->dOff[r] = base + (o->func == ReduceScatter || o->func == Scatter ? r * c : 0);
    }
    return;
  }
  size_t sendHalf = sendHigh * HALF, recvHalf = HALF - sendHalf; /* never overlapping */
  size_t sOff = sendHalf + at[0] * (HALF - o->in + 1) / FRACTION;
  size_t dOff = recvHalf + at[1] * (HALF - o->out + 1) / FRACTION;
  for (int r = 0; r < n; r++) o->sOff[r] = sOff, o->dOff[r] = dOff;
}

static gcommResult_t postChainOp(const ChainOp* o, int32_t* arena, int me, gcommComm_t comm) {
  int32_t *sb = arena + o->sOff[me], *rb = arena + o->dOff[me];
  size_t c = o->count;
  switch (o->func) {
    case AllReduce:
      return gcommAllReduce(sb, rb, c, gcommInt32, gcommSum, comm, NULL);
    case Broadcast:
      return gcommBroadcast(sb, rb, c, gcommInt32, o->root, comm, NULL);
    case Reduce:
      return gcommReduce(sb, rb, c, gcommInt32, gcommSum, o->root, comm, NULL);
    case AllGather:
      return gcommAllGather(sb, rb, c, gcommInt32, comm, NULL);
    case ReduceScatter:
      return gcommReduceScatter(sb, rb, c, gcommInt32, gcommSum, comm, NULL);
    case AllToAll:
      return gcommAllToAll(sb, rb, c, gcommInt32, comm, NULL);
    case Gather:
      return gcommGather(sb, rb, c, gcommInt32, o->root, comm, NULL);
    default:
      return gcommScatter(sb, rb, c, gcommInt32, o->root, comm, NULL);
  }
}

/* The serial reference of one call on every member's arena (a[r]); tmp holds ARENA elements. */
static void runChainOp(const ChainOp* o, int32_t** a, int n, int32_t* tmp) {
  size_t c = o->count;
  const size_t *s = o->sOff, *d = o->dOff;
  int root = o->root;
  switch (o->func) {
    case AllReduce:
    case Reduce:
      for (size_t k = 0; k < c; k++) {
        uint32_t sum = 0; /* int32 sums wrap */
        for (int r = 0; r < n; r++) sum += (uint32_t)a[r][s[r] + k];
        tmp[k] = (int32_t)sum;
      }
      for (int r = 0; r < n; r++)
        if (o->func == AllReduce || r == root) memcpy(a[r] + d[r], tmp, c * 4);
      break;
    case Broadcast:
      memcpy(tmp, a[root] + s[root], c * 4);
      for (int r = 0; r < n; r++) memcpy(a[r] + d[r], tmp, c * 4);
      break;
    case AllGather:
    case Gather:
      for (int r = 0; r < n; r++) memcpy(tmp + r * c, a[r] + s[r], c * 4);
      for (int r = 0; r < n; r++)
        if (o->func == AllGather || r == root) memcpy(a[r] + d[r], tmp, c * n * 4);
      break;
    case ReduceScatter:
      for (size_t k = 0; k < c * n; k++) {
        uint32_t sum = 0;
        for (int r = 0; r < n; r++) sum += (uint32_t)a[r][s[r] + k];
        tmp[k] = (int32_t)sum;
      }
      for (int r = 0; r < n; r++) memcpy(a[r] + d[r], tmp + r * c, c * 4);
      break;
    case AllToAll: /* rank r's block q goes to rank q's block r; in place, the two swap */
      for (int r = 0; r < n; r++)
        for (int q = s[0] == d[0] ? r + 1 : 0; q < n; q++) {
          memcpy(tmp, a[q] + s[q] + r * c, c * 4);
          memcpy(a[q] + d[q] + r * c, a[r] + s[r] + q * c, c * 4);
          if (s[0] == d[0]) memcpy(a[r] + d[r] + q * c, tmp, c * 4);
        }
      break;
    default: /* Scatter */
      memcpy(tmp, a[root] + s[root], c * n * 4);
      for (int r = 0; r < n; r++) memcpy(a[r] + d[r], tmp + r * c, c * 4);
  }
}

static gcommComm_t chainComm; /* the world with small FIFOs and 4 channels: many queues */

static void chain(void) {
  Slot world = {1, chainComm, {0}, tlNranks}, *s = &world;
  for (int r = 0; r < tlNranks; r++) world.members[r] = r;
  int n = s->comm ? s->n : 0, nOps = 2 + (int)pick(4), me = 0;
  ChainOp ops[5];
  uint64_t seed = next(&rngShared);
  for (int i = 0; i < nOps; i++) drawChainOp(&ops[i], n);
  if (s->comm == NULL) return;
  gcommCommUserRank(s->comm, &me);
  int32_t* a[64];
  for (int r = 0; r < n; r++) {
    a[r] = malloc(ARENA * sizeof(int32_t));
    for (size_t k = 0; k < ARENA; k++) a[r][k] = input(seed, s->members[r], k);
  }
  TlBuf mine = tlBufAlloc(ARENA * sizeof(int32_t), 0);
  int32_t* arena = (int32_t*)mine.ptr;
  memcpy(arena, a[me], ARENA * sizeof(int32_t));
  for (int i = 0; i < nOps; i++) TL_OK(s->comm, postChainOp(&ops[i], arena, me, s->comm));
  TL_OK(s->comm, gcommWait(s->comm, NULL));
  int32_t* tmp = malloc(ARENA * sizeof(int32_t));
  for (int i = 0; i < nOps; i++) runChainOp(&ops[i], a, n, tmp);
  for (size_t k = 0; k < ARENA && !tlLocalFailed; k++)
    if (arena[k] != a[me][k]) {
      char calls[256];
      int len = 0;
      for (int i = 0; i < nOps; i++)
        len += snprintf(calls + len, sizeof(calls) - len, " %s(count %zu, in %zu, out %zu)",
                        funcNames[ops[i].func], ops[i].count, ops[i].sOff[me], ops[i].dOff[me]);
      tlFail("chain on %d ranks:%s: element %zu is %d, expected %d", n, calls, k, arena[k],
             a[me][k]);
    }
  tlBufCheckGuards(&mine, "chain arena");
  tlBufFree(&mine);
  for (int r = 0; r < n; r++) free(a[r]);
  free(tmp);
  nChains++;
}

int main(int argc, char** argv) {
  tlInit(&argc, &argv);
  double budget = getenv("TEST_RANDOM_SECONDS") ? atof(getenv("TEST_RANDOM_SECONDS")) : 4;
  rngShared = tlSeed;
  rngLocal = tlHash3(tlSeed, 0x10ca1, (uint64_t)tlRank);
  if (tlRank == 0)
    printf("# test_random: seed 0x%llx (TEST_SEED=0x%llx repeats it), %.0f s\n",
           (unsigned long long)tlSeed, (unsigned long long)tlSeed, budget);
  pool[0].comm = tlCommInitEnv(MPI_COMM_WORLD, "", -1);
  pool[0].n = tlNranks;
  pool[0].made = 1;
  for (int r = 0; r < tlNranks; r++) pool[0].members[r] = r;
  chainComm = tlCommInitEnv(MPI_COMM_WORLD, "GCOMM_BUFFSIZE=32K GCOMM_NCHANNELS=4", -1);
  if (!tlReport("random: init")) return tlFinish("test_random");
  if (tlNranks > 64) { /* members[] */
    tlCommDestroy(pool[0].comm);
    tlCommDestroy(chainComm);
    return tlFinish("test_random");
  }
  double t0 = tlNow();
  long iter = 0;
  for (int go = 1; go; iter++) {
    Slot* s = &pool[pick(POOL)];
    unsigned action = pick(10);
    if (s != &pool[0] && (action == 0 || !s->made)) { /* destroy (if any) and split again */
      if (s->comm) TL_OK(s->comm, gcommCommDestroy(s->comm));
      split((int)(s - pool), 1 + (int)pick(3), (int)pick(4), (int)pick(2));
    } else if (action < 3) {
      group(s);
    } else if (action == 3) {
      chain();
    } else {
      Call c;
      postColl(s, &c);
      if (s->comm && next(&rngLocal) % 8 == 0) invalidCall(s->comm);
      if (s->comm) TL_OK(s->comm, gcommWait(s->comm, NULL));
      checkColl(s, &c);
    }
    if (s->comm && next(&rngLocal) % 16 == 0) { /* GroupEnd without GroupStart */
      if (gcommGroupEnd() != gcommInvalidUsage) tlFail("GroupEnd without GroupStart succeeded");
      nInvalid++;
    }
    if (iter % 8 == 7) { /* rank 0's clock decides for everyone */
      int cont = tlNow() - t0 < budget && !tlLocalFailed;
      MPI_Request req;
      MPI_Iallreduce(MPI_IN_PLACE, &cont, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD, &req);
      tlWaitRequest(&req);
      go = cont;
    }
  }
  for (int i = 1; i < POOL; i++)
    if (pool[i].comm) TL_OK(pool[i].comm, gcommCommDestroy(pool[i].comm));
  long mine[5] = {nColls, nGroups, nChains, nSplits, nInvalid}, all[5];
  MPI_Allreduce(mine, all, 5, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  tlReport(
      "random: %ld steps in %.1f s (%ld collective calls, %ld groups, %ld chains, %ld splits, %ld "
      "invalid calls over all ranks), seed 0x%llx",
      iter, tlNow() - t0, all[0], all[1], all[2], all[3], all[4], (unsigned long long)tlSeed);
  tlCommDestroy(pool[0].comm);
  tlCommDestroy(chainComm);
  tlReport("random: destroy");
  return tlFinish("test_random");
}
