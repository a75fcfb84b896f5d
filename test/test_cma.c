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
 * what an earlier one sent, must not hang. The same with every buffer from gcommHostAlloc (the
 * receiver maps the sender's buffer and reads or reduces it there), where buffers come and go at
 * every call (the same addresses and descriptors again, more buffers than a peer keeps mapped),
 * and a buffer freed and allocated again between two sends must carry the new data.
 */
#define _GNU_SOURCE
#include <mpi.h>
#include <sys/uio.h>

#include "testlib.h"

#define N(a) ((int)(sizeof(a) / sizeof((a)[0])))

static gcommComm_t comm;
static const char* variant;
static int shared; /* the variant's buffers come from gcommHostAlloc */

static void* bufNew(size_t bytes) {
  void* p = NULL;
  if (!shared) return malloc(bytes ? bytes : 1);
  if (gcommHostAlloc(&p, bytes) != gcommSuccess)
    tlFail("gcommHostAlloc: %s", gcommGetLastError(NULL));
  return p;
}

static void bufFree(void* p) {
  if (!shared)
    free(p);
  else if (gcommHostFree(p) != gcommSuccess)
    tlFail("gcommHostFree: %s", gcommGetLastError(NULL));
}

/* Random bytes, the same on every rank for (seed, rank). */
static char* randomBytes(size_t bytes, uint64_t seed, int rank) {
  char* p = bufNew(bytes);
  for (size_t i = 0; i < bytes; i++) p[i] = (char)(tlHash3(seed, (uint64_t)rank, i) >> 24);
  return p;
}

static char* poisoned(size_t bytes) {
  char* p = bufNew(bytes);
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
  bufFree(in), bufFree(want);
  if (!inPlace) bufFree(out);
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
  bufFree(mine), bufFree(out), bufFree(want);
  tlReport("[%s] all-gather %zu B a rank %s = MPI's", variant, count, inPlace ? "in place" : "");
}

/* Broadcast from root of count bytes (in place: one buffer, as MPI_Bcast). */
static void testBroadcast(size_t count, int root, int inPlace, uint64_t seed) {
  char* want = randomBytes(count, seed, root);
  char *in = randomBytes(count, seed, root), *out = inPlace ? in : poisoned(count);
  if (inPlace && tlRank != root) memset(out, 0xa5, count);
  finish(gcommBroadcast(in, out, count, gcommUint8, root, comm, NULL), out, want, count);
  bufFree(want), bufFree(in);
  if (!inPlace) bufFree(out);
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
  bufFree(mine), bufFree(all), bufFree(out), bufFree(want);
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
  bufFree(in), bufFree(want);
  if (!inPlace) bufFree(out);
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
  bufFree(buf), bufFree(want), bufFree(out);
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
  bufFree(a), bufFree(sent), bufFree(b), bufFree(out);
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
  for (int i = 0; i < MESSAGES; i++) bufFree(sent[i]), bufFree(out[i]);
  bufFree(reply);
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
  bufFree(a), bufFree(copy), bufFree(out), bufFree(want), bufFree(gathered), bufFree(mine);
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
  bufFree(in), bufFree(out), bufFree(want);
  tlReport("[%s] all-to-allv up to %zu B a pair = MPI's", variant, max);
}

/* Ring all-reduce: its all-gather half sends finished values by reference. */
static void testAllReduce(size_t count, int inPlace, uint64_t seed) {
  int32_t* in = bufNew(count * sizeof(int32_t));
  int32_t *out = inPlace ? in : bufNew(count * sizeof(int32_t)), *want = bufNew(count * 4);
  for (size_t i = 0; i < count; i++) in[i] = (int32_t)(tlHash3(seed, (uint64_t)tlRank, i) >> 40);
  MPI_Allreduce(in, want, (int)count, MPI_INT32_T, MPI_SUM, MPI_COMM_WORLD);
  if (!inPlace) memset(out, 0xa5, count * sizeof(int32_t));
  finish(gcommAllReduce(in, out, count, gcommInt32, gcommSum, comm, NULL), (char*)out, (char*)want,
         count * sizeof(int32_t));
  bufFree(in), bufFree(want);
  if (!inPlace) bufFree(out);
  tlReport("[%s] all-reduce int32 sum of %zu %s = MPI's", variant, count,
           inPlace ? "in place" : "");
}

/* How many buffers of other processes from gcommHostAlloc this process maps (read-only). */
static int peerBuffersMapped(void) {
  FILE* f = fopen("/proc/self/maps", "r");
  char line[512];
  int n = 0;
  while (f != NULL && fgets(line, sizeof(line), f) != NULL)
    n += strstr(line, " r--s ") != NULL && strstr(line, "gcomm-host") != NULL;
  if (f != NULL) fclose(f);
  return n;
}

/* Rank 0 sends rank 1 a buffer, frees it, allocates another of the same size (the same address
 * and descriptor, as a rule) with other data and sends it again: rank 1, which mapped the first
 * (where the variant lends at all: mapped), must get the second's data. Then gcommHostFree refuses
 * a pointer it did not hand out. */
static void testFreedAndAgain(size_t count, int mapped, uint64_t seed) {
  for (int round = 0; round < 2; round++) {
    char* buf = randomBytes(count, seed + (uint64_t)round, 0);
    char *want = randomBytes(count, seed + (uint64_t)round, 0), *out = poisoned(count);
    if (tlRank == 0)
      finish(gcommSend(buf, count, gcommUint8, 1, comm, NULL), buf, want, count);
    else if (tlRank == 1)
      finish(gcommRecv(out, count, gcommUint8, 0, comm, NULL), out, want, count);
    bufFree(buf), bufFree(want), bufFree(out);
  }
  if (tlRank == 1 && (peerBuffersMapped() > 0) != mapped)
    tlFail("rank 1 maps %d of rank 0's buffers, expected %s", peerBuffersMapped(),
           mapped ? "some" : "none");
  tlReport("[%s] send %zu B, free, allocate again, send: the receiver gets the new data%s", variant,
           count, mapped ? " (read where rank 0's buffer lies)" : "");
  char* plain = malloc(64);
  gcommResult_t res = gcommHostFree(plain);
  if (res != gcommInvalidArgument || !strstr(gcommGetLastError(NULL), "not the start of a buffer"))
    tlFail("gcommHostFree(malloc's memory): %s, \"%s\"", gcommGetErrorString(res),
           gcommGetLastError(NULL));
  free(plain);
  tlReport("[%s] gcommHostFree of malloc's memory: gcommInvalidArgument", variant);
}

/* Reduce-scatter (int32 sum, count a rank) and a reduce to root of its whole input: from buffers
 * of gcommHostAlloc their receivers reduce the peers' inputs where they lie. */
static void testReductions(size_t count, int root, uint64_t seed) {
  size_t n = (size_t)tlNranks, bytes = count * n * sizeof(int32_t);
  int32_t *in = bufNew(bytes), *out = bufNew(bytes), *want = bufNew(bytes);
  for (size_t i = 0; i < count * n; i++)
    in[i] = (int32_t)(tlHash3(seed, (uint64_t)tlRank, i) >> 40);
  MPI_Reduce_scatter_block(in, want, (int)count, MPI_INT32_T, MPI_SUM, MPI_COMM_WORLD);
  memset(out, 0xa5, bytes);
  finish(gcommReduceScatter(in, out, count, gcommInt32, gcommSum, comm, NULL), (char*)out,
         (char*)want, count * sizeof(int32_t));
  tlReport("[%s] reduce-scatter int32 sum of %zu a rank = MPI's", variant, count);
  MPI_Reduce(in, want, (int)(count * n), MPI_INT32_T, MPI_SUM, root, MPI_COMM_WORLD);
  memset(out, 0xa5, bytes);
  finish(gcommReduce(in, out, count * n, gcommInt32, gcommSum, root, comm, NULL), (char*)out,
         (char*)want, tlRank == root ? bytes : 0);
  tlReport("[%s] reduce int32 sum of %zu to %d = MPI's", variant, count * n, root);
  bufFree(in), bufFree(out), bufFree(want);
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
    int shared;
  } variants[] = {
      {"one copy, 512 B slots, 3 channels, ring",
       "GCOMM_CMA=1 GCOMM_CMA_MIN_BYTES=0 GCOMM_BUFFSIZE=4096 GCOMM_NCHANNELS=3 GCOMM_ALGO=ring",
       0},
      {"one copy, 512 B slots, 2 channels, direct",
       "GCOMM_CMA=1 GCOMM_CMA_MIN_BYTES=0 GCOMM_BUFFSIZE=4096 GCOMM_NCHANNELS=2 GCOMM_ALGO=direct",
       0},
      {"one copy from 300 B, 4 KB slots, tree",
       "GCOMM_CMA=1 GCOMM_CMA_MIN_BYTES=300 GCOMM_BUFFSIZE=32768 GCOMM_ALGO=tree", 0},
      {"one copy, defaults", "GCOMM_CMA=1", 0},
      {"FIFO only, 512 B slots", "GCOMM_CMA=0 GCOMM_BUFFSIZE=4096 GCOMM_NCHANNELS=3", 0},
      {"gcommHostAlloc, 512 B slots, 3 channels, ring",
       "GCOMM_CMA=1 GCOMM_CMA_MIN_BYTES=0 GCOMM_BUFFSIZE=4096 GCOMM_NCHANNELS=3 GCOMM_ALGO=ring",
       1},
      {"gcommHostAlloc, 512 B slots, 2 channels, direct",
       "GCOMM_CMA=1 GCOMM_CMA_MIN_BYTES=0 GCOMM_BUFFSIZE=4096 GCOMM_NCHANNELS=2 GCOMM_ALGO=direct",
       1},
      {"gcommHostAlloc, from 300 B, tree",
       "GCOMM_CMA=1 GCOMM_CMA_MIN_BYTES=300 GCOMM_BUFFSIZE=32768 GCOMM_ALGO=tree", 1},
      {"gcommHostAlloc, defaults", "GCOMM_CMA=auto", 1},
      {"gcommHostAlloc, FIFO only", "GCOMM_CMA=0 GCOMM_BUFFSIZE=4096", 1},
  };
  static const size_t counts[] = {1, 777, 5003, 70001};
  int permitted = mayReadPeer();
  for (int v = 0; v < N(variants); v++) {
    variant = variants[v].name, shared = variants[v].shared;
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
      testReductions(k, (c + 2) % tlNranks, seed + 7);
      testAllToAllV(k, seed + 6);
    }
    if (tlNranks >= 2) testSendWaitReuse(70001, seed);
    if (tlNranks >= 2) testReceiveIntoLent(70001, seed + 2);
    if (tlNranks >= 2) testRunAhead(seed + 3);
    testRewriteSent(5003, seed + 1);
    if (tlNranks >= 2 && shared)
      testFreedAndAgain(70001, permitted && !strstr(variants[v].env, "GCOMM_CMA=0"), seed + 4);
    tlCommDestroy(comm);
    tlReport("[%s] destroy", variant);
  }
  return tlFinish("test_cma");
}
