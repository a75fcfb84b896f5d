/*
 * test_random.c - a random sequence of valid and invalid calls for TEST_RANDOM_SECONDS (default
 * 4): collectives (every function, datatype and op, counts up to 200k, in place or not, any root),
 * groups of collectives with a ring of sends and receives, splits (colors, NOCOLOR, reversed keys,
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
static long nColls, nGroups, nSplits, nInvalid;

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
  if (!tlReport("random: init")) return tlFinish("test_random");
  if (tlNranks > 64) { /* members[] */
    tlCommDestroy(pool[0].comm);
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
    } else if (action < 4) {
      group(s);
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
  long mine[4] = {nColls, nGroups, nSplits, nInvalid}, all[4];
  MPI_Allreduce(mine, all, 4, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  tlReport(
      "random: %ld steps in %.1f s (%ld collective calls, %ld groups, %ld splits, %ld invalid "
      "calls over all ranks), seed 0x%llx",
      iter, tlNow() - t0, all[0], all[1], all[2], all[3], (unsigned long long)tlSeed);
  tlCommDestroy(pool[0].comm);
  tlReport("random: destroy");
  return tlFinish("test_random");
}
