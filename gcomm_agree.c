/*
 * gcomm_agree.c - exchanges between the ranks of one node without MPI, over the status pages of
 * their shared-memory segments (gcommStatus_t: a shrink counter and a mailbox of two boxes).
 *
 * Once a rank has died MPI may be stuck (its collectives wait for the dead rank; MPICH's hydra
 * may even end the job), so gcommCommShrink's survivors meet here: they agree on who is alive
 * (gcommAgreeSurvivors), and the new communicator's setup exchanges its cards and checks through
 * its parent's pages, then its own (gcommAllgather, which is MPI_Allgather for a communicator
 * made over MPI). Every wait has a deadline (GCOMM_TIMEOUT_MS), notices a participant's death
 * within 10 ms, and names the rank that did not arrive.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gcomm_core.h"

/* How a wait on one rank's page ended. */
enum { PAGE_READY, PAGE_DEAD, PAGE_LATE, PAGE_ABSENT };

typedef int (*pageReady_t)(const gcommStatus_t* st, uint64_t want);

static int arrived(const gcommStatus_t* st, uint64_t want) {
  return __atomic_load_n(&st->shrinkSeq, __ATOMIC_ACQUIRE) >= want;
}

static int posted(const gcommStatus_t* st, uint64_t want) {
  return __atomic_load_n(&st->box[want % 2].round, __ATOMIC_ACQUIRE) == want;
}

/* Waits until rank r of pc shows ready(want) on its page, dies, or the deadline passes. */
static int waitPage(gcommComm_t pc, int r, pageReady_t ready, uint64_t want, uint64_t deadline) {
  const gcommStatus_t* st = gcommShmStatus(pc, r);
  if (st == NULL) return PAGE_ABSENT;
  uint64_t idleSince = 0, probed = gcommNowNs();
  while (!ready(st, want)) {
    uint64_t now = gcommNowNs();
    if (now - probed > 10000000) {
      probed = now;
      if (gcommPeerIsDead(pc, r)) return PAGE_DEAD;
    }
    if (now > deadline) return PAGE_LATE;
    gcommBackoff(&idleSince, 5, 1000);
  }
  return PAGE_READY;
}

static uint64_t deadlineOf(gcommComm_t comm) {
  return gcommNowNs() + (uint64_t)comm->params.timeoutMs * 1000000;
}

/* One exchange over the pages of pc among the participants ranks[0..n) (ranks of pc; this rank
 * is ranks[me]): each posts bytes, all receives them in participant order. Errors go to comm
 * (the communicator being set up, or pc), naming participants by their rank in pc. */
static gcommResult_t pagesExchange(gcommComm_t comm, gcommComm_t pc, const int* ranks, int n,
                                   int me, const void* mine, size_t bytes, void* all,
                                   const char* what) {
  if (bytes > GCOMM_BOX_BYTES)
    return GCOMM_ERROR(comm, gcommInternalError, -1, "%s: %zu bytes exceed a box (%d)", what, bytes,
                       GCOMM_BOX_BYTES);
  uint64_t round = ++pc->pageRounds;
  gcommBox_t* box = &gcommShmStatus(pc, ranks[me])->box[round % 2];
  memcpy(box->data, mine, bytes);
  box->bytes = bytes;
  __atomic_store_n(&box->round, round, __ATOMIC_RELEASE);
  uint64_t deadline = deadlineOf(pc);
  for (int i = 0; i < n; i++) {
    int r = ranks[i], how = waitPage(pc, r, posted, round, deadline);
    if (how == PAGE_DEAD)
      return GCOMM_ERROR(comm, gcommRemoteError, -1, "%s: rank %d of \"%s\" has died", what, r,
                         pc->name);
    if (how != PAGE_READY)
      return GCOMM_ERROR(comm, gcommTimeout, -1,
                         "%s: rank %d of \"%s\" did not take part within GCOMM_TIMEOUT_MS=%lld",
                         what, r, pc->name, (long long)pc->params.timeoutMs);
    const gcommBox_t* b = &gcommShmStatus(pc, r)->box[round % 2];
    if (b->bytes != bytes)
      return GCOMM_ERROR(comm, gcommInvalidUsage, -1,
                         "%s: rank %d of \"%s\" is in another exchange (%llu bytes where this "
                         "rank has %zu)",
                         what, r, pc->name, (unsigned long long)b->bytes, bytes);
    memcpy((char*)all + (size_t)i * bytes, b->data, bytes);
  }
  return gcommSuccess;
}

gcommResult_t gcommAllgather(gcommComm_t comm, const void* mine, size_t bytes, void* all) {
  struct gcommBoot* b = comm->boot;
  if (b == NULL) {
    MPI_CHECK(comm,
              MPI_Allgather(mine, (int)bytes, MPI_BYTE, all, (int)bytes, MPI_BYTE, comm->mpiComm));
    return gcommSuccess;
  }
  return pagesExchange(comm, b->pages, b->pageRank, b->nranks, b->rank, mine, bytes, all,
                       "setup exchange");
}

gcommResult_t gcommBootFromPages(gcommComm_t comm, gcommComm_t pages, const int* pageRank, int rank,
                                 int nranks) {
  struct gcommBoot* b = calloc(1, sizeof(*b) + (size_t)nranks * sizeof(int));
  if (b == NULL) return GCOMM_ERROR(comm, gcommSystemError, -1, "out of memory");
  b->pages = pages;
  b->pageRank = (int*)(b + 1);
  memcpy(b->pageRank, pageRank, (size_t)nranks * sizeof(int));
  b->rank = rank;
  b->nranks = nranks;
  comm->boot = b;
  return gcommSuccess;
}

void gcommBootOwnPages(gcommComm_t comm) {
  struct gcommBoot* b = comm->boot;
  if (b == NULL) return;
  b->pages = comm; /* the parent may go first: from now on this communicator's own pages */
  for (int r = 0; r < b->nranks; r++) b->pageRank[r] = r;
}

/* Which ranks arrived (those excluded already, excl[q] set, are not waited for): a rank found dead
 * is excluded too; a live rank that never arrives fails the call, named. */
static gcommResult_t awaitArrivals(gcommComm_t comm, unsigned char* excl, uint64_t seq) {
  uint64_t deadline = deadlineOf(comm);
  for (int q = 0; q < comm->nranks; q++) {
    if (excl[q] || q == comm->rank) continue;
    int how = waitPage(comm, q, arrived, seq, deadline);
    if (how == PAGE_DEAD) {
      excl[q] = 1;
      GCOMM_INFO(GCOMM_SUBSYS_INIT, comm, "gcommCommShrink: rank %d has died: excluded", q);
    } else if (how == PAGE_ABSENT) {
      return GCOMM_ERROR(comm, gcommInvalidUsage, q,
                         "rank %d is on another node: gcommCommShrink reaches the ranks of this "
                         "node only (exclude it, or shrink before spanning nodes)",
                         q);
    } else if (how == PAGE_LATE) {
      return GCOMM_ERROR(comm, gcommTimeout, q,
                         "rank %d did not call gcommCommShrink within GCOMM_TIMEOUT_MS=%lld and "
                         "is alive: list it in excludeRanks if it is not to take part",
                         q, (long long)comm->params.timeoutMs);
    }
  }
  return gcommSuccess;
}

/* Every survivor's set, compared with this rank's: the first one that differs is named. */
static gcommResult_t compareSets(gcommComm_t comm, const unsigned char* excl, const int* ranks,
                                 int n, const unsigned char* all, size_t maskBytes) {
  for (int i = 0; i < n; i++)
    for (int q = 0; q < comm->nranks; q++) {
      int theirs = (all[(size_t)i * maskBytes + q / 8] >> (q % 8)) & 1;
      if (theirs == excl[q]) continue;
      return GCOMM_ERROR(comm, gcommInvalidUsage, ranks[i],
                         "gcommCommShrink: rank %d %s rank %d, which this rank %s: every "
                         "survivor must exclude the same ranks",
                         ranks[i], theirs ? "excludes" : "keeps", q, theirs ? "keeps" : "excludes");
    }
  return gcommSuccess;
}

gcommResult_t gcommAgreeSurvivors(gcommComm_t comm, unsigned char* excl, int* survivors, int* n) {
  size_t maskBytes = ((size_t)comm->nranks + 7) / 8;
  if (maskBytes > GCOMM_BOX_BYTES)
    return GCOMM_ERROR(comm, gcommInvalidUsage, -1,
                       "gcommCommShrink handles up to %d ranks; this communicator has %d",
                       GCOMM_BOX_BYTES * 8, comm->nranks);
  /* a rank left out of a shrink stays out of comm's later ones: its count of them is behind */
  int by = __atomic_load_n(&gcommShmStatus(comm, comm->rank)->excludedBy, __ATOMIC_ACQUIRE);
  if (by != 0)
    return GCOMM_ERROR(comm, gcommInvalidUsage, by - 1,
                       "rank %d's gcommCommShrink left this rank out: it takes no part in this "
                       "communicator's shrinks any more",
                       by - 1);
  uint64_t seq = ++comm->shrinkSeq;
  __atomic_store_n(&gcommShmStatus(comm, comm->rank)->shrinkSeq, seq, __ATOMIC_RELEASE);
  GCOMM_CHECK(awaitArrivals(comm, excl, seq));
  unsigned char* buf = calloc(maskBytes, (size_t)comm->nranks + 1);
  if (buf == NULL) return GCOMM_ERROR(comm, gcommSystemError, -1, "out of memory");
  int me = 0;
  *n = 0;
  for (int q = 0; q < comm->nranks; q++) {
    if (excl[q]) buf[q / 8] |= (unsigned char)(1u << (q % 8));
    if (q == comm->rank) me = *n;
    if (!excl[q]) survivors[(*n)++] = q;
  }
  /* a rank that dies now fails the exchange: each caller may try again, excluding it */
  gcommResult_t res = pagesExchange(comm, comm, survivors, *n, me, buf, maskBytes, buf + maskBytes,
                                    "gcommCommShrink's agreement");
  if (res == gcommSuccess) res = compareSets(comm, excl, survivors, *n, buf + maskBytes, maskBytes);
  for (int q = 0; q < comm->nranks && res == gcommSuccess; q++)
    if (excl[q] && gcommShmStatus(comm, q) != NULL)
      __atomic_store_n(&gcommShmStatus(comm, q)->excludedBy, survivors[0] + 1, __ATOMIC_RELEASE);
  free(buf);
  return res;
}
