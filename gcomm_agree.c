/*
 * gcomm_agree.c - exchanges between the ranks of a communicator without MPI: over the status pages
 * of their shared-memory segments (gcommStatus_t: a shrink counter and a mailbox of two boxes)
 * with the ranks of this node, and over the network (the transports' boxPost and boxRead: the
 * same boxes as messages) with the ranks of other nodes.
 *
 * Once a rank has died MPI may be stuck (its collectives wait for the dead rank; MPICH's hydra
 * may even end the job), so gcommCommShrink's survivors meet here: they agree on who is alive
 * (gcommAgreeSurvivors), and the new communicator's setup exchanges its cards and checks through
 * its parent's pages and network, then its own (gcommAllgather, which is MPI_Allgather for a
 * communicator made over MPI). Every wait has a deadline (GCOMM_TIMEOUT_MS), notices the death of
 * a participant of this node within 10 ms, and names the rank that did not arrive; the death of a
 * rank of another node is known only from what its node found (the agreement), else the
 * deadline tells.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gcomm_core.h"

/* How a wait for one rank's arrival on its page ended. */
enum { PAGE_READY, PAGE_DEAD, PAGE_LATE };

static int posted(const gcommStatus_t* st, uint64_t want) {
  return __atomic_load_n(&st->box[want % 2].round, __ATOMIC_ACQUIRE) == want;
}

/* Waits until rank r of pc (a rank of this node) shows on its page that it has reached shrink
 * seq, dies, or the deadline passes. */
static int waitArrival(gcommComm_t pc, int r, uint64_t seq, uint64_t deadline) {
  const gcommStatus_t* st = gcommShmStatus(pc, r);
  uint64_t idleSince = 0, probed = gcommNowNs();
  while (__atomic_load_n(&st->shrinkSeq, __ATOMIC_ACQUIRE) < seq) {
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

/* Rank r's box of round in an exchange over pc, once it has come: on its status page (a rank of
 * this node), or as a transport brought it (a rank of another node); else NULL. */
static const gcommBox_t* boxOf(gcommComm_t pc, int r, uint64_t round) {
  const gcommStatus_t* st = gcommShmStatus(pc, r);
  if (st != NULL) return posted(st, round) ? &st->box[round % 2] : NULL;
  const gcommBox_t* b = NULL;
  pthread_mutex_lock(&pc->progressLock);
  for (int i = 0; i < pc->nTransports && b == NULL; i++)
    if (pc->transports[i]->boxRead) b = pc->transports[i]->boxRead(pc, r, round);
  pthread_mutex_unlock(&pc->progressLock);
  return b;
}

/* This rank's box of round: on its page, and through the transports to the ranks of targets[0..n)
 * on other nodes. */
static gcommResult_t postBox(gcommComm_t pc, uint64_t round, const void* mine, size_t bytes,
                             const int* targets, int n, uint64_t deadline) {
  gcommBox_t* box = &gcommShmStatus(pc, pc->rank)->box[round % 2];
  memcpy(box->data, mine, bytes);
  box->bytes = bytes;
  __atomic_store_n(&box->round, round, __ATOMIC_RELEASE);
  gcommResult_t res = gcommSuccess;
  pthread_mutex_lock(&pc->progressLock);
  for (int i = 0; i < pc->nTransports && res == gcommSuccess; i++)
    if (pc->transports[i]->boxPost) res = pc->transports[i]->boxPost(pc, box, targets, n, deadline);
  pthread_mutex_unlock(&pc->progressLock);
  return res;
}

/* Whether the exchange may stop waiting for participant i, whose box has not come (got[j]: box j
 * has come, into all + j * bytes). */
typedef int (*letGo_t)(gcommComm_t pc, const int* ranks, int n, int i, const unsigned char* got,
                       const char* all, size_t bytes);

/* The deadline passed: every participant whose box has not come is named (one that failed on
 * its own first, waiting for another, is among them). */
static gcommResult_t notArrived(gcommComm_t comm, gcommComm_t pc, const int* ranks, int n,
                                const unsigned char* done, const char* what) {
  char list[256] = "";
  size_t len = 0;
  for (int i = 0; i < n && len + 16 < sizeof(list); i++)
    if (!done[i])
      len +=
          (size_t)snprintf(list + len, sizeof(list) - len, "%srank %d", len ? ", " : "", ranks[i]);
  return GCOMM_ERROR(comm, gcommTimeout, -1,
                     "%s: %s of \"%s\" did not take part within GCOMM_TIMEOUT_MS=%lld", what, list,
                     pc->name, (long long)pc->params.timeoutMs);
}

/* Waits for the box of round of every participant ranks[0..n) (ranks of pc), copying it to
 * all + i * bytes and setting got[i]; one that letGo (may be NULL) lets go stays got[i] = 0. A
 * participant of this node found dead, one that does not come by the deadline, or one in another
 * exchange fails comm (the communicator being set up, or pc), named as a rank of pc. */
static gcommResult_t gatherBoxes(gcommComm_t comm, gcommComm_t pc, const int* ranks, int n,
                                 uint64_t round, size_t bytes, char* all, unsigned char* got,
                                 letGo_t letGo, const char* what) {
  uint64_t deadline = deadlineOf(pc), idleSince = 0, probed = gcommNowNs();
  unsigned char* done = calloc((size_t)n, 1);
  if (done == NULL) return GCOMM_ERROR(comm, gcommSystemError, -1, "out of memory");
  gcommResult_t res = gcommSuccess;
  for (int left = n; left > 0 && res == gcommSuccess;) {
    uint64_t now = gcommNowNs();
    int probe = now - probed > 10000000, late = now > deadline;
    if (probe) probed = now;
    for (int i = 0; i < n && res == gcommSuccess; i++) {
      if (done[i]) continue;
      int r = ranks[i];
      const gcommBox_t* b = boxOf(pc, r, round);
      if (b != NULL && b->bytes != bytes) {
        res = GCOMM_ERROR(comm, gcommInvalidUsage, -1,
                          "%s: rank %d of \"%s\" is in another exchange (%llu bytes where this "
                          "rank has %zu)",
                          what, r, pc->name, (unsigned long long)b->bytes, bytes);
      } else if (b != NULL || (letGo != NULL && letGo(pc, ranks, n, i, got, all, bytes))) {
        if (b != NULL) memcpy(all + (size_t)i * bytes, b->data, bytes);
        got[i] = b != NULL;
        done[i] = 1;
        left--;
      } else if (probe && gcommPeerIsDead(pc, r)) {
        res = GCOMM_ERROR(comm, gcommRemoteError, -1, "%s: rank %d of \"%s\" has died", what, r,
                          pc->name);
      } else if (late) {
        res = notArrived(comm, pc, ranks, n, done, what);
      }
    }
    if (left > 0) gcommBackoff(&idleSince, 5, 1000);
  }
  free(done);
  return res;
}

/* One exchange over pc among the participants ranks[0..n) (ranks of pc, this rank one of them):
 * each posts bytes, all receives them in participant order. Errors go to comm (the communicator
 * being set up, or pc), naming participants by their rank in pc. */
static gcommResult_t boxExchange(gcommComm_t comm, gcommComm_t pc, const int* ranks, int n,
                                 const void* mine, size_t bytes, void* all, const char* what) {
  if (bytes > GCOMM_BOX_BYTES)
    return GCOMM_ERROR(comm, gcommInternalError, -1, "%s: %zu bytes exceed a box (%d)", what, bytes,
                       GCOMM_BOX_BYTES);
  uint64_t round = ++pc->pageRounds;
  unsigned char* got = calloc((size_t)n, 1);
  if (got == NULL) return GCOMM_ERROR(comm, gcommSystemError, -1, "out of memory");
  gcommResult_t res = postBox(pc, round, mine, bytes, ranks, n, deadlineOf(pc));
  if (res == gcommSuccess)
    res = gatherBoxes(comm, pc, ranks, n, round, bytes, (char*)all, got, NULL, what);
  free(got);
  return res;
}

gcommResult_t gcommAllgather(gcommComm_t comm, const void* mine, size_t bytes, void* all) {
  struct gcommBoot* b = comm->boot;
  if (b == NULL) {
    MPI_CHECK(comm,
              MPI_Allgather(mine, (int)bytes, MPI_BYTE, all, (int)bytes, MPI_BYTE, comm->mpiComm));
    return gcommSuccess;
  }
  return boxExchange(comm, b->pages, b->pageRank, b->nranks, mine, bytes, all, "setup exchange");
}

gcommResult_t gcommPagesAllgather(gcommComm_t comm, const void* mine, size_t bytes, void* all,
                                  const char* what) {
  int* ranks = malloc((size_t)comm->nranks * sizeof(int));
  if (ranks == NULL) return GCOMM_ERROR(comm, gcommSystemError, -1, "out of memory");
  for (int r = 0; r < comm->nranks; r++) ranks[r] = r;
  gcommResult_t res = boxExchange(comm, comm, ranks, comm->nranks, mine, bytes, all, what);
  free(ranks);
  return res;
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

/* Which ranks of this node arrived (those excluded already, excl[q] set, are not waited for): a
 * rank found dead is excluded too (dead[q] set); a live rank that never arrives fails the call,
 * named. The ranks of other nodes arrive with their boxes (gcommAgreeSurvivors). */
static gcommResult_t awaitArrivals(gcommComm_t comm, unsigned char* excl, unsigned char* dead,
                                   uint64_t seq) {
  uint64_t deadline = deadlineOf(comm);
  for (int q = 0; q < comm->nranks; q++) {
    if (excl[q] || q == comm->rank || gcommShmStatus(comm, q) == NULL) continue;
    int how = waitArrival(comm, q, seq, deadline);
    if (how == PAGE_DEAD) {
      excl[q] = dead[q] = 1;
      GCOMM_INFO(GCOMM_SUBSYS_INIT, comm, "gcommCommShrink: rank %d has died: excluded", q);
    } else if (how == PAGE_LATE) {
      return GCOMM_ERROR(comm, gcommTimeout, q,
                         "rank %d did not call gcommCommShrink within GCOMM_TIMEOUT_MS=%lld and "
                         "is alive: list it in excludeRanks if it is not to take part",
                         q, (long long)comm->params.timeoutMs);
    }
  }
  return gcommSuccess;
}

static int bitOf(const unsigned char* mask, int q) {
  return (mask[q / 8] >> (q % 8)) & 1;
}

/* A rank's box in the agreement: the ranks it excludes (listed, or found dead), then those of
 * them it found dead itself (ranks of its node). */
static void packSets(const unsigned char* excl, const unsigned char* dead, int nranks,
                     unsigned char* box, size_t maskBytes) {
  memset(box, 0, 2 * maskBytes);
  for (int q = 0; q < nranks; q++) {
    box[q / 8] |= (unsigned char)(excl[q] << (q % 8));
    box[maskBytes + q / 8] |= (unsigned char)(dead[q] << (q % 8));
  }
}

/* The agreement stops waiting for a rank of another node whose box has not come once a
 * participant of that rank's node, whose box has, found it dead: only its node sees its process. */
static int foundDeadByItsNode(gcommComm_t pc, const int* ranks, int n, int i,
                              const unsigned char* got, const char* all, size_t bytes) {
  int r = ranks[i];
  if (gcommShmStatus(pc, r) != NULL) return 0; /* this node's: its own death is seen here */
  for (int j = 0; j < n; j++)
    if (got[j] && pc->cards[ranks[j]].hostId == pc->cards[r].hostId &&
        bitOf((const unsigned char*)all + (size_t)j * bytes + bytes / 2, r))
      return 1;
  return 0;
}

/* Every participant's set whose box came (the deaths any of them found added to each, and to
 * excl), compared with this rank's: the first one that differs is named. */
static gcommResult_t compareSets(gcommComm_t comm, unsigned char* excl, const int* ranks, int n,
                                 const unsigned char* got, const unsigned char* all,
                                 size_t maskBytes) {
  unsigned char* deaths = calloc((size_t)comm->nranks, 1);
  if (deaths == NULL) return GCOMM_ERROR(comm, gcommSystemError, -1, "out of memory");
  for (int i = 0; i < n; i++)
    for (int q = 0; q < comm->nranks && got[i]; q++)
      deaths[q] |= bitOf(all + (size_t)i * 2 * maskBytes + maskBytes, q);
  for (int q = 0; q < comm->nranks; q++) excl[q] |= deaths[q];
  gcommResult_t res = gcommSuccess;
  for (int i = 0; i < n && res == gcommSuccess; i++)
    for (int q = 0; q < comm->nranks && got[i] && res == gcommSuccess; q++) {
      int theirs = bitOf(all + (size_t)i * 2 * maskBytes, q) | deaths[q];
      if (theirs != excl[q])
        res =
            GCOMM_ERROR(comm, gcommInvalidUsage, ranks[i],
                        "gcommCommShrink: rank %d %s rank %d, which this rank %s: every "
                        "survivor must exclude the same ranks",
                        ranks[i], theirs ? "excludes" : "keeps", q, theirs ? "keeps" : "excludes");
    }
  free(deaths);
  return res;
}

/* The exchange of the agreement: this rank's sets to every other rank (the excluded ones too, so
 * that a rank excluded by some survivors only learns that they differ), every candidate's box
 * gathered (a candidate of another node its node found dead let go), the sets compared. */
static gcommResult_t exchangeSets(gcommComm_t comm, unsigned char* excl, const unsigned char* dead,
                                  const int* cand, int nCand, int* everyone, size_t maskBytes) {
  size_t bytes = 2 * maskBytes;
  unsigned char* buf = calloc(bytes, (size_t)nCand + 1);
  unsigned char* got = calloc((size_t)nCand, 1);
  gcommResult_t res =
      buf && got ? gcommSuccess : GCOMM_ERROR(comm, gcommSystemError, -1, "out of memory");
  for (int q = 0; q < comm->nranks; q++) everyone[q] = q;
  uint64_t round = ++comm->pageRounds;
  if (res == gcommSuccess) {
    packSets(excl, dead, comm->nranks, buf, maskBytes);
    res = postBox(comm, round, buf, bytes, everyone, comm->nranks, deadlineOf(comm));
  }
  /* a rank that dies now fails the exchange: each caller may try again, excluding it */
  if (res == gcommSuccess)
    res = gatherBoxes(comm, comm, cand, nCand, round, bytes, (char*)buf + bytes, got,
                      foundDeadByItsNode, "gcommCommShrink's agreement");
  if (res == gcommSuccess) res = compareSets(comm, excl, cand, nCand, got, buf + bytes, maskBytes);
  free(buf);
  free(got);
  return res;
}

gcommResult_t gcommAgreeSurvivors(gcommComm_t comm, unsigned char* excl, int* survivors, int* n) {
  size_t maskBytes = ((size_t)comm->nranks + 7) / 8;
  if (2 * maskBytes > GCOMM_BOX_BYTES)
    return GCOMM_ERROR(comm, gcommInvalidUsage, -1,
                       "gcommCommShrink handles up to %d ranks; this communicator has %d",
                       GCOMM_BOX_BYTES * 4, comm->nranks);
  /* a rank left out of a shrink stays out of comm's later ones: its count of them is behind */
  int by = __atomic_load_n(&gcommShmStatus(comm, comm->rank)->excludedBy, __ATOMIC_ACQUIRE);
  if (by != 0)
    return GCOMM_ERROR(comm, gcommInvalidUsage, by - 1,
                       "rank %d's gcommCommShrink left this rank out: it takes no part in this "
                       "communicator's shrinks any more",
                       by - 1);
  uint64_t seq = ++comm->shrinkSeq;
  __atomic_store_n(&gcommShmStatus(comm, comm->rank)->shrinkSeq, seq, __ATOMIC_RELEASE);
  unsigned char* dead = calloc((size_t)comm->nranks, 1);
  int* everyone = calloc((size_t)comm->nranks, sizeof(int));
  gcommResult_t res = dead && everyone ? awaitArrivals(comm, excl, dead, seq)
                                       : GCOMM_ERROR(comm, gcommSystemError, -1, "out of memory");
  int nCand = 0;
  for (int q = 0; q < comm->nranks && res == gcommSuccess; q++)
    if (!excl[q]) survivors[nCand++] = q;
  if (res == gcommSuccess)
    res = exchangeSets(comm, excl, dead, survivors, nCand, everyone, maskBytes);
  *n = 0;
  for (int q = 0; q < comm->nranks && res == gcommSuccess; q++)
    if (!excl[q]) survivors[(*n)++] = q;
  for (int q = 0; q < comm->nranks && res == gcommSuccess; q++)
    if (excl[q] && gcommShmStatus(comm, q) != NULL)
      __atomic_store_n(&gcommShmStatus(comm, q)->excludedBy, survivors[0] + 1, __ATOMIC_RELEASE);
  free(dead);
  free(everyone);
  return res;
}
