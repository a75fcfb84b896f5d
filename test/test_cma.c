/*
 * test_cma.c - one copy between ranks of a node (GCOMM_CMA): steps handed over by reference and
 * copied by the receiver from the sender's memory, forced at small sizes (GCOMM_CMA_MIN_BYTES=0:
 * every step larger than a slot's line, small slots, several channels, so that every collective
 * takes many such steps, partial last ones included), beside a threshold inside the steps' sizes
 * (some steps by reference, some through the slots) and the FIFO forced (GCOMM_CMA=0). Each
 * collective runs on random bytes at odd counts, out of place and in place, into poisoned outputs,
 * against MPI's own collective; a send's buffer is rewritten as soon as its wait returns while the
 * receiver posts late (the wait must cover the peer's copy), or received into at once (the receive
 * must wait for that copy); a run of small messages with large ones among them reaches a late
 * receiver intact; a send and a receive of one buffer in a group, and operations that rewrite
 * what an earlier one sent, must not hang.
 */
#define _GNU_SOURCE
#include <mpi.h>
#include <sys/uio.h>

#include "testlib.h"

#define N(a) ((int)(sizeof(a) / sizeof((a)[0])))

static gcommComm_t comm;
static const char* variant;

/* Random bytes, the same on every rank for (seed, rank). */
static char* randomBytes(size_t bytes, uint64_t seed, int rank) {
  char* p = malloc(bytes ? bytes : 1);
  for (size_t i = 0; i < bytes; i++) p[i] = (char)(tlHash3(seed, (uint64_t)rank, i) >> 24);
  return p;
}

static char* poisoned(size_t bytes) {
  char* p = malloc(bytes ? bytes : 1);
  memset(p, 0xa5, bytes);
  return p;
}

/* Waits for gcomm, then compares got with want (bytes), naming the first byte that differs. */
static void finish(gcommResult_t res, const char* got, const char* want, size_t bytes) {
  if (TL_OK(comm, res) == gcommSuccess) TL_OK(comm, gcommWait(comm, NULL));
  for (size_t i = 0; i < bytes; i++)
    if (got[i] != want[i]) {
      tlFail("byte %zu of %zu: %d, MPI's %d", i, bytes, got[i], want[i]);
      return;
    }
}

/* All-to-all of count bytes a pair (in place: one buffer). */
static void testAllToAll(size_t count, int inPlace, uint64_t seed) {
  size_t bytes = count * (size_t)tlNranks;
  char* in = randomBytes(bytes, seed, tlRank);
  char *out = inPlace ? in : poisoned(bytes), *want = poisoned(bytes);
  MPI_Alltoall(in, (int)count, MPI_CHAR, want, (int)count, MPI_CHAR, MPI_COMM_WORLD);
  finish(gcommAllToAll(inPlace ? out : in, out, count, gcommUint8, comm, NULL), out, want, bytes);
  free(in), free(want);
  if (!inPlace) free(out);
  tlReport("[%s] all-to-all %zu B a pair %s = MPI's", variant, count, inPlace ? "in place" : "");
}

/* All-gather (algo as the variant forces) of count bytes a rank. */
static void testAllGather(size_t count, int inPlace, uint64_t seed) {
  size_t bytes = count * (size_t)tlNranks;
  char* mine = randomBytes(count, seed, tlRank);
  char *out = poisoned(bytes), *want = poisoned(bytes);
  MPI_Allgather(mine, (int)count, MPI_CHAR, want, (int)count, MPI_CHAR, MPI_COMM_WORLD);
  if (inPlace) memcpy(out + count * (size_t)tlRank, mine, count);
  const char* in = inPlace ? out + count * (size_t)tlRank : mine;
  finish(gcommAllGather(in, out, count, gcommUint8, comm, NULL), out, want, bytes);
  free(mine), free(out), free(want);
  tlReport("[%s] all-gather %zu B a rank %s = MPI's", variant, count, inPlace ? "in place" : "");
}

/* Broadcast from root of count bytes (in place: one buffer, as MPI_Bcast). */
static void testBroadcast(size_t count, int root, int inPlace, uint64_t seed) {
  char* want = randomBytes(count, seed, root);
  char *in = randomBytes(count, seed, root), *out = inPlace ? in : poisoned(count);
  if (inPlace && tlRank != root) memset(out, 0xa5, count);
  finish(gcommBroadcast(in, out, count, gcommUint8, root, comm, NULL), out, want, count);
  free(want), free(in);
  if (!inPlace) free(out);
  tlReport("[%s] broadcast %zu B from %d %s = root's", variant, count, root,
           inPlace ? "in place" : "");
}

/* Gather and scatter at root of count bytes a rank. */
static void testGatherScatter(size_t count, int root, uint64_t seed) {
  size_t bytes = count * (size_t)tlNranks;
  char *mine = randomBytes(count, seed, tlRank), *all = randomBytes(bytes, seed + 1, root);
  char *out = poisoned(bytes), *want = poisoned(bytes);
  MPI_Gather(mine, (int)count, MPI_CHAR, want, (int)count, MPI_CHAR, root, MPI_COMM_WORLD);
  finish(gcommGather(mine, out, count, gcommUint8, root, comm, NULL), out, want,
         tlRank == root ? bytes : 0);
  tlReport("[%s] gather %zu B a rank to %d = MPI's", variant, count, root);
  memset(out, 0xa5, count);
  MPI_Scatter(all, (int)count, MPI_CHAR, want, (int)count, MPI_CHAR, root, MPI_COMM_WORLD);
  finish(gcommScatter(all, out, count, gcommUint8, root, comm, NULL), out, want, count);
  tlReport("[%s] scatter %zu B a rank from %d = MPI's", variant, count, root);
  free(mine), free(all), free(out), free(want);
}

/* Each rank sends to the next and receives from the previous in a group; in place: one buffer
 * for both, whose content then is not defined, but nothing may hang. */
static void testSendRecv(size_t count, int inPlace, uint64_t seed) {
  int next = (tlRank + 1) % tlNranks, prev = (tlRank + tlNranks - 1) % tlNranks;
  char *in = randomBytes(count, seed, tlRank), *want = randomBytes(count, seed, prev);
  char* out = inPlace ? in : poisoned(count);
  gcommGroupStart();
  gcommResult_t res = gcommSend(in, count, gcommUint8, next, comm, NULL);
  if (res == gcommSuccess) res = gcommRecv(out, count, gcommUint8, prev, comm, NULL);
  gcommGroupEnd();
  finish(res, out, want, inPlace ? 0 : count);
  free(in), free(want);
  if (!inPlace) free(out);
  tlReport("[%s] send/recv %zu B in a ring %s", variant, count,
           inPlace ? "from and into one buffer: no hang" : "= the sender's");
}

/* Rank 0 sends, waits and rewrites its buffer at once; rank 1 posts its receive only later. The
 * wait must cover rank 1's copy from rank 0's memory. */
static void testSendWaitReuse(size_t count, uint64_t seed) {
  char *buf = randomBytes(count, seed, 0), *want = randomBytes(count, seed, 0);
  char* out = poisoned(count);
  if (tlRank == 0) {
    if (TL_OK(comm, gcommSend(buf, count, gcommUint8, 1, comm, NULL)) == gcommSuccess)
      TL_OK(comm, gcommWait(comm, NULL));
    memset(buf, 0x5a, count);
  } else if (tlRank == 1) {
    tlSleepMs(50);
    finish(gcommRecv(out, count, gcommUint8, 0, comm, NULL), out, want, count);
  }
  free(buf), free(want), free(out);
  tlReport("[%s] send %zu B, wait, rewrite the buffer: the late receiver gets what was sent",
           variant, count);
}

/* Rank 0 sends a buffer to rank 1, which posts its receive late, and at once receives into that
 * buffer from rank 1, which sent first: the send is over on rank 0 once handed over, so only the
 * receive's step may hold the write back until rank 1 has copied what was lent (a reference's
 * extent, the slot's word). Rank 1 must get the original, rank 0 rank 1's data. */
static void testReceiveIntoLent(size_t count, uint64_t seed) {
  char *a = randomBytes(count, seed, 0), *sent = randomBytes(count, seed, 0);
  char *b = randomBytes(count, seed, 1), *out = poisoned(count);
  if (tlRank == 0) {
    gcommResult_t res = gcommSend(a, count, gcommUint8, 1, comm, NULL);
    if (res == gcommSuccess) res = gcommRecv(a, count, gcommUint8, 1, comm, NULL);
    finish(res, a, b, count);
  } else if (tlRank == 1) {
    gcommResult_t res = gcommSend(b, count, gcommUint8, 0, comm, NULL);
    tlSleepMs(50);
    if (res == gcommSuccess) res = gcommRecv(out, count, gcommUint8, 0, comm, NULL);
    finish(res, out, sent, count);
  }
  free(a), free(sent), free(b), free(out);
  tlReport("[%s] send %zu B, receive into it before the late receiver copied it: both get theirs",
           variant, count);
}

/* Rank 0 sends rank 1 a run of messages, more than a FIFO has lines, a call each, and then
 * receives rank 1's reply into the buffer of the first large one; rank 1 sent that reply first and
 * posts its receives late. Most messages fit a line (up to 48 B: the sender runs up to GCOMM_LINES
 * steps ahead of its receiver), every 37th is 70,001 B (a slot, or a reference that rank 1 copies
 * late: while one is unread the sender keeps to GCOMM_STEPS, whose record holds it, so the reply
 * waits for that copy). Each rank must get what the other sent, and neither may hang. */
static void testRunAhead(uint64_t seed) {
  enum { MESSAGES = 150, LENT = 5, LARGE = 70001 };
  char *sent[MESSAGES], *out[MESSAGES], *reply = randomBytes(LARGE, seed, 1);
  size_t bytes[MESSAGES];
  for (int i = 0; i < MESSAGES; i++) {
    bytes[i] = i % 37 == LENT ? LARGE : 1 + (size_t)i % 48;
    sent[i] = randomBytes(bytes[i], seed + (uint64_t)i, 0);
    out[i] = tlRank == 0 ? memcpy(poisoned(bytes[i]), sent[i], bytes[i]) : poisoned(bytes[i]);
  }
  gcommResult_t res = gcommSuccess;
  if (tlRank == 0) {
    for (int i = 0; i < MESSAGES && res == gcommSuccess; i++)
      res = gcommSend(out[i], bytes[i], gcommUint8, 1, comm, NULL);
    tlSleepMs(20); /* the sends run ahead meanwhile */
    if (res == gcommSuccess) res = gcommRecv(out[LENT], LARGE, gcommUint8, 1, comm, NULL);
    finish(res, out[LENT], reply, LARGE);
    for (int i = 0; i < MESSAGES; i++) memset(out[i], 0x5a, bytes[i]);
  } else if (tlRank == 1) {
    res = gcommSend(reply, LARGE, gcommUint8, 0, comm, NULL);
    tlSleepMs(50);
    for (int i = 0; i < MESSAGES && res == gcommSuccess; i++)
      res = gcommRecv(out[i], bytes[i], gcommUint8, 0, comm, NULL);
    if (TL_OK(comm, res) == gcommSuccess) TL_OK(comm, gcommWait(comm, NULL));
    for (int i = 0; i < MESSAGES; i++)
      if (memcmp(out[i], sent[i], bytes[i]) != 0) {
        tlFail("message %d of %zu B differs from what rank 0 sent", i, bytes[i]);
        break;
      }
  }
  for (int i = 0; i < MESSAGES; i++) free(sent[i]), free(out[i]);
  free(reply);
  tlReport("[%s] %d messages of 1-48 B and %d B to a late receiver, a reply into one: as sent",
           variant, MESSAGES, LARGE);
}

/* An all-gather into the buffer an earlier all-to-all sent from (another call): it must wait
 * until the peers have copied the all-to-all's blocks, and neither may hang. */
static void testRewriteSent(size_t count, uint64_t seed) {
  size_t bytes = count * (size_t)tlNranks;
  char *a = randomBytes(bytes, seed, tlRank), *copy = randomBytes(bytes, seed, tlRank);
  char *out = poisoned(bytes), *want = poisoned(bytes), *gathered = poisoned(bytes);
  MPI_Alltoall(copy, (int)count, MPI_CHAR, want, (int)count, MPI_CHAR, MPI_COMM_WORLD);
  char* mine = randomBytes(count, seed + 7, tlRank);
  gcommResult_t res = gcommAllToAll(a, out, count, gcommUint8, comm, NULL);
  if (res == gcommSuccess) res = gcommAllGather(mine, a, count, gcommUint8, comm, NULL);
  finish(res, out, want, bytes);
  MPI_Allgather(mine, (int)count, MPI_CHAR, gathered, (int)count, MPI_CHAR, MPI_COMM_WORLD);
  for (size_t i = 0; i < bytes; i++)
    if (a[i] != gathered[i]) {
      tlFail("all-gather byte %zu: %d, MPI's %d", i, a[i], gathered[i]);
      break;
    }
  free(a), free(copy), free(out), free(want), free(gathered), free(mine);
  tlReport("[%s] all-to-all then an all-gather into its input, one wait: both = MPI's", variant);
}

/* All-to-allv with random counts per pair (some zero). */
static void testAllToAllV(size_t max, uint64_t seed) {
  int n = tlNranks;
  size_t sc[64], rc[64], sd[64], rd[64], inBytes = 0, outBytes = 0;
  int isc[64], irc[64], isd[64], ird[64];
  for (int p = 0; p < n; p++) {
    sc[p] = tlHash3(seed, (uint64_t)tlRank, (uint64_t)p) % (max + 1);
    rc[p] = tlHash3(seed, (uint64_t)p, (uint64_t)tlRank) % (max + 1);
    sd[p] = inBytes, rd[p] = outBytes;
    inBytes += sc[p] + 3, outBytes += rc[p] + 5; /* gaps between blocks */
    isc[p] = (int)sc[p], irc[p] = (int)rc[p], isd[p] = (int)sd[p], ird[p] = (int)rd[p];
  }
  char *in = randomBytes(inBytes, seed, tlRank), *out = poisoned(outBytes);
  char* want = poisoned(outBytes);
  MPI_Alltoallv(in, isc, isd, MPI_CHAR, want, irc, ird, MPI_CHAR, MPI_COMM_WORLD);
  finish(gcommAllToAllV(in, sc, sd, out, rc, rd, gcommUint8, comm, NULL), out, want, outBytes);
  free(in), free(out), free(want);
  tlReport("[%s] all-to-allv up to %zu B a pair = MPI's", variant, max);
}

/* Ring all-reduce: its all-gather half sends finished values by reference. */
static void testAllReduce(size_t count, int inPlace, uint64_t seed) {
  int32_t* in = malloc(count * sizeof(int32_t));
  int32_t *out = inPlace ? in : malloc(count * sizeof(int32_t)), *want = malloc(count * 4);
  for (size_t i = 0; i < count; i++) in[i] = (int32_t)(tlHash3(seed, (uint64_t)tlRank, i) >> 40);
  MPI_Allreduce(in, want, (int)count, MPI_INT32_T, MPI_SUM, MPI_COMM_WORLD);
  if (!inPlace) memset(out, 0xa5, count * sizeof(int32_t));
  finish(gcommAllReduce(in, out, count, gcommInt32, gcommSum, comm, NULL), (char*)out, (char*)want,
         count * sizeof(int32_t));
  free(in), free(want);
  if (!inPlace) free(out);
  tlReport("[%s] all-reduce int32 sum of %zu %s = MPI's", variant, count,
           inPlace ? "in place" : "");
}

/* Whether this rank may read the next rank's memory as gcomm would (the kernel's own answer):
 * the report says which path a forced variant really took here. */
static int mayReadPeer(void) {
  uint64_t word = 0x600d5eedull + (uint64_t)tlRank, got = 0, at = (uint64_t)(uintptr_t)&word;
  int pids[64], pid = getpid(), ok = 1, next = (tlRank + 1) % tlNranks;
  uint64_t ats[64];
  MPI_Allgather(&pid, 1, MPI_INT, pids, 1, MPI_INT, MPI_COMM_WORLD);
  MPI_Allgather(&at, 1, MPI_UINT64_T, ats, 1, MPI_UINT64_T, MPI_COMM_WORLD);
  struct iovec local = {&got, sizeof(got)}, remote = {(void*)(uintptr_t)ats[next], sizeof(got)};
  if (next != tlRank)
    ok = process_vm_readv(pids[next], &local, 1, &remote, 1, 0) == sizeof(got) &&
         got == 0x600d5eedull + (uint64_t)next;
  MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  MPI_Barrier(MPI_COMM_WORLD); /* word lives until every rank has read it */
  return ok;
}

int main(int argc, char** argv) {
  tlInit(&argc, &argv);
  if (tlNranks > 64) return tlFinish("test_cma"); /* the count arrays above */
  static const struct {
    const char *name, *env;
  } variants[] = {
      {"one copy, 512 B slots, 3 channels, ring",
       "GCOMM_CMA=1 GCOMM_CMA_MIN_BYTES=0 GCOMM_BUFFSIZE=4096 GCOMM_NCHANNELS=3 GCOMM_ALGO=ring"},
      {"one copy, 512 B slots, 2 channels, direct",
       "GCOMM_CMA=1 GCOMM_CMA_MIN_BYTES=0 GCOMM_BUFFSIZE=4096 GCOMM_NCHANNELS=2 GCOMM_ALGO=direct"},
      {"one copy from 300 B, 4 KB slots, tree",
       "GCOMM_CMA=1 GCOMM_CMA_MIN_BYTES=300 GCOMM_BUFFSIZE=32768 GCOMM_ALGO=tree"},
      {"one copy, defaults", "GCOMM_CMA=1"},
      {"FIFO only, 512 B slots", "GCOMM_CMA=0 GCOMM_BUFFSIZE=4096 GCOMM_NCHANNELS=3"},
  };
  static const size_t counts[] = {1, 777, 5003, 70001};
  int permitted = mayReadPeer();
  for (int v = 0; v < N(variants); v++) {
    variant = variants[v].name;
    comm = tlCommInitEnv(MPI_COMM_WORLD, variants[v].env, -1);
    if (!tlReport("[%s] init (reading another rank's memory is %s here)", variant,
                  permitted ? "permitted" : "refused: the FIFO runs"))
      continue;
    uint64_t seed = tlSeed + (uint64_t)v * 1000;
    for (int c = 0; c < N(counts); c++, seed += 10) {
      size_t k = counts[c];
      for (int inPlace = 0; inPlace < 2; inPlace++) {
        testAllToAll(k, inPlace, seed);
        testAllGather(k, inPlace, seed + 1);
        testBroadcast(k, (c + 1) % tlNranks, inPlace, seed + 2);
        testSendRecv(k, inPlace, seed + 3);
        testAllReduce(k, inPlace, seed + 4);
      }
      testGatherScatter(k, c % tlNranks, seed + 5);
      testAllToAllV(k, seed + 6);
    }
    if (tlNranks >= 2) testSendWaitReuse(70001, seed);
    if (tlNranks >= 2) testReceiveIntoLent(70001, seed + 2);
    if (tlNranks >= 2) testRunAhead(seed + 3);
    testRewriteSent(5003, seed + 1);
    tlCommDestroy(comm);
    tlReport("[%s] destroy", variant);
  }
  return tlFinish("test_cma");
}
