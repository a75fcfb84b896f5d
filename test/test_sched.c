/*
 * test_sched.c - every schedule of gcomm_sched.h, run for n simulated ranks and checked against a
 * serial computation of its collective.
 *
 * A small executor with the semantics of the real ones (gcomm.c's runStep, the kernels): a step's
 * value is what it receives (combined with its local operand when it reduces) or its local
 * operand, after the post-operation when the step says so; it goes to the local destination and
 * to the FIFO of every send peer. FIFOs hold GCOMM_STEPS slots of at most `chunk` elements, as the
 * real ones; a rank runs its next step once that step's receive FIFOs have data and its send
 * FIFOs room, and a round where no rank can run is a deadlock. Each step's payload is compared
 * with the count the receiver expects (what the real executors' slot words check).
 *
 * The operator is a wrapping 64-bit sum of random inputs (so a lost or doubled contribution shows),
 * and the post-operation v -> 3v + 1 (so a result finished zero times or twice shows). Outputs
 * start poisoned: a write where the collective puts nothing shows too. Every function and
 * algorithm, 1 to 9 ranks, every root, odd counts, several chunk sizes and alignments, one and two
 * channels; the MPI ranks share the cases out, and report together.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gcomm_sched.h"
#include "testlib.h"

#define MAXR 9
#define POISON 0xdeadbeefcafef00dull

/* One collective's buffers: in[r], out[r] and scratch[r] of every simulated rank. */
typedef struct {
  int func, algo, n, root, fan;
  size_t count, inLen, outLen, scratchLen; /* count: gcommSched_t.count; lengths in elements */
  uint64_t* in[MAXR];
  uint64_t* out[MAXR];
  uint64_t* scratch[MAXR]; /* poisoned, as a rank's scratch holds anything at the start */
} Case;

/* A FIFO from one rank to another: GCOMM_STEPS slots of payloads. */
typedef struct {
  uint64_t* slot[GCOMM_STEPS];
  size_t count[GCOMM_STEPS];
  long head, tail;
} Fifo;

static uint64_t postOp(uint64_t v) {
  return 3 * v + 1;
}
/* The finished value of a reduction: on one rank the input itself (a copy; Avg's division by one
 * changes nothing). */
static uint64_t finished(const Case* c, uint64_t sum) {
  return c->n > 1 ? postOp(sum) : sum;
}

/* Which lengths a collective's buffers have, with count elements per rank block (or in total). */
static void bufferLengths(Case* c) {
  size_t n = (size_t)c->n, k = c->count;
  c->inLen = c->outLen = k;
  if (c->func == gcommFuncAllGather || c->func == gcommFuncGather) c->outLen = n * k;
  if (c->func == gcommFuncReduceScatter || c->func == gcommFuncScatter) c->inLen = n * k;
  if (c->func == gcommFuncAllToAll) c->inLen = c->outLen = n * k;
  c->scratchLen = gcommSchedScratchElems(c->func, c->algo, c->n, k);
}

/* The serial reference: what out[r][i] must hold. */
static uint64_t expected(const Case* c, int r, size_t i) {
  size_t k = c->count;
  uint64_t sum = 0;
  switch (c->func) {
    case gcommFuncAllReduce:
    case gcommFuncReduce:
      if (c->func == gcommFuncReduce && r != c->root) return POISON;
      for (int p = 0; p < c->n; p++) sum += c->in[p][i];
      return finished(c, sum);
    case gcommFuncReduceScatter:
      for (int p = 0; p < c->n; p++) sum += c->in[p][(size_t)r * k + i];
      return finished(c, sum);
    case gcommFuncBroadcast:
      return c->in[c->root][i];
    case gcommFuncAllGather:
      return c->in[i / k][i % k];
    case gcommFuncGather:
      return r == c->root ? c->in[i / k][i % k] : POISON;
    case gcommFuncScatter:
      return c->in[c->root][(size_t)r * k + i];
    case gcommFuncAllToAll:
      return c->in[i / k][(size_t)r * k + i % k];
    default: /* Send to r+1, Recv from r-1 */
      return c->in[(r + c->n - 1) % c->n][i];
  }
}

static uint64_t* buffer(const Case* c, int r, int which) {
  return which == GCOMM_BUF_IN        ? c->in[r]
         : which == GCOMM_BUF_OUT     ? c->out[r]
         : which == GCOMM_BUF_SCRATCH ? c->scratch[r]
                                      : NULL;
}

/* Whether a step's range of buffer `which` lies inside it (its length on each simulated rank). */
static int inBuffer(const Case* c, int which, size_t off, size_t count) {
  size_t len = which == GCOMM_BUF_IN    ? c->inLen
               : which == GCOMM_BUF_OUT ? c->outLen
                                        : c->scratchLen;
  return which == GCOMM_BUF_NONE || (off <= len && count <= len - off);
}

/* The sends of fan step st of rank r (one FIFO slot to every other rank), if every FIFO has
 * room; returns 1 if they went, 0 if they must wait. */
static int fanSend(const Case* c, int r, const gcommStep_t* st, Fifo fifo[MAXR][MAXR]) {
  for (int p = 0; p < c->n; p++)
    if (p != r && fifo[r][p].tail - fifo[r][p].head == GCOMM_STEPS) return 0;
  const uint64_t* src = buffer(c, r, st->src);
  for (int p = 0; p < c->n; p++) {
    if (p == r) continue;
    int b = st->fan & GCOMM_FAN_SEND_BLOCKS ? p : r; /* the block p gets */
    size_t count = gcommFanCount(st, b);
    Fifo* f = &fifo[r][p];
    uint64_t* copy = malloc((count + 1) * sizeof(uint64_t));
    memcpy(copy, src + st->srcOff + gcommFanStart(st, b), count * sizeof(uint64_t));
    f->count[f->tail % GCOMM_STEPS] = count;
    f->slot[f->tail++ % GCOMM_STEPS] = copy;
  }
  return 1;
}

/* The receives of fan step st of rank r, once every other rank's slot is there: the reduction of
 * every rank's block r in rank order, or each rank's block to its place. Returns 1 if they ran,
 * 0 if they must wait, -1 on an error (recorded). */
static int fanReceive(const Case* c, int r, const gcommStep_t* st, Fifo fifo[MAXR][MAXR]) {
  for (int p = 0; p < c->n; p++)
    if (p != r && fifo[p][r].head == fifo[p][r].tail) return 0;
  const uint64_t* src = buffer(c, r, st->src);
  uint64_t* dst = buffer(c, r, st->dst);
  size_t own = gcommFanCount(st, r);
  uint64_t* value = calloc(own + 1, sizeof(uint64_t));
  for (int p = 0; p < c->n; p++) {
    size_t expect = st->fan & GCOMM_FAN_REDUCE ? own : gcommFanCount(st, p);
    if (p == r) {
      for (size_t i = 0; (st->fan & GCOMM_FAN_REDUCE) && i < own; i++)
        value[i] += src[st->srcOff + gcommFanStart(st, r) + i];
      continue;
    }
    Fifo* f = &fifo[p][r];
    const uint64_t* in = f->slot[f->head % GCOMM_STEPS];
    if (f->count[f->head % GCOMM_STEPS] != expect) {
      tlFail("rank %d receives %zu elements from rank %d, which sent %zu", r, expect, p,
             f->count[f->head % GCOMM_STEPS]);
      free(value);
      return -1;
    }
    for (size_t i = 0; i < expect; i++) {
      if (st->fan & GCOMM_FAN_REDUCE)
        value[i] += in[i];
      else
        dst[st->dstOff + gcommFanStart(st, p) + i] = in[i];
    }
    free(f->slot[f->head % GCOMM_STEPS]);
    f->slot[f->head++ % GCOMM_STEPS] = NULL;
  }
  for (size_t i = 0; (st->fan & GCOMM_FAN_REDUCE) && i < own; i++)
    dst[st->dstOff + i] = st->postOp ? postOp(value[i]) : value[i];
  free(value);
  return 1;
}

/* Runs step st of rank r if its FIFOs are ready (fifo[from][to]); returns 1 if it ran, 0 if it
 * must wait, -1 on an error (recorded). A fan step runs in two halves (*sent: the first went),
 * as a kernel's threads send before they receive. */
static int runStep(const Case* c, int r, const gcommStep_t* st, size_t chunk, Fifo fifo[MAXR][MAXR],
                   int* sent) {
  if (st->fan && st->count > chunk)
    return tlFail("rank %d: a fan block of %zu elements, slots hold %zu", r, st->count, chunk), -1;
  if (st->fan && !*sent) return (*sent = fanSend(c, r, st, fifo)) ? 2 : 0;
  if (st->fan) {
    int ran = fanReceive(c, r, st, fifo);
    if (ran) *sent = 0;
    return ran;
  }
  for (int k = 0; k < 2; k++) {
    if (st->recvPeer[k] >= 0 && fifo[st->recvPeer[k]][r].head == fifo[st->recvPeer[k]][r].tail)
      return 0;
    if (st->sendPeer[k] >= 0 &&
        fifo[r][st->sendPeer[k]].tail - fifo[r][st->sendPeer[k]].head == GCOMM_STEPS)
      return 0;
  }
  if (st->count > chunk)
    return tlFail("rank %d: a step of %zu elements, slots hold %zu", r, st->count, chunk), -1;
  if (!inBuffer(c, st->src, st->srcOff, st->count) || !inBuffer(c, st->dst, st->dstOff, st->count))
    return tlFail("rank %d: a step's %zu elements pass the end of its buffer", r, st->count), -1;
  const uint64_t* src = buffer(c, r, st->src);
  uint64_t* dst = buffer(c, r, st->dst);
  const uint64_t* in[2] = {NULL, NULL};
  int nIn = 0;
  for (int k = 0; k < 2; k++) {
    if (st->recvPeer[k] < 0) continue;
    Fifo* f = &fifo[st->recvPeer[k]][r];
    size_t got = f->count[f->head % GCOMM_STEPS];
    if (got != st->count)
      return tlFail("rank %d receives %zu elements from rank %d, which sent %zu", r, st->count,
                    st->recvPeer[k], got),
             -1;
    in[nIn++] = f->slot[f->head % GCOMM_STEPS];
  }
  if (nIn == 0 && src == NULL && st->count > 0)
    return tlFail("rank %d: a step of %zu elements with no operand", r, st->count), -1;
  uint64_t* value = malloc((st->count + 1) * sizeof(uint64_t));
  for (size_t i = 0; i < st->count; i++) {
    uint64_t v = nIn ? in[0][i] : src[st->srcOff + i];
    if (nIn && st->reduce) {
      if (src) v += src[st->srcOff + i];
      if (nIn == 2) v += in[1][i];
    }
    value[i] = st->postOp ? postOp(v) : v;
  }
  for (int k = 0; k < 2; k++) {
    if (st->recvPeer[k] >= 0) {
      Fifo* f = &fifo[st->recvPeer[k]][r];
      free(f->slot[f->head % GCOMM_STEPS]);
      f->slot[f->head++ % GCOMM_STEPS] = NULL;
    }
  }
  if (dst) memcpy(dst + st->dstOff, value, st->count * sizeof(uint64_t));
  for (int k = 0; k < 2; k++) {
    if (st->sendPeer[k] < 0) continue;
    Fifo* f = &fifo[r][st->sendPeer[k]];
    uint64_t* copy = malloc((st->count + 1) * sizeof(uint64_t));
    memcpy(copy, value, st->count * sizeof(uint64_t));
    f->count[f->tail % GCOMM_STEPS] = st->count;
    f->slot[f->tail++ % GCOMM_STEPS] = copy;
  }
  free(value);
  return 1;
}

/* One channel's range [off, off + len) of the collective, every rank's program to its end.
 * Send/Recv: every rank sends to r+1 and receives from r-1 (two programs a rank). */
static void runChannel(const Case* c, size_t off, size_t len, size_t chunk, size_t align) {
  int nProg = c->func == gcommFuncSend ? 2 * c->n : c->n;
  gcommSched_t sched[2 * MAXR];
  int rankOf[2 * MAXR];
  long next[2 * MAXR], total[2 * MAXR];
  int sent[2 * MAXR] = {0};
  static Fifo fifo[MAXR][MAXR];
  memset(fifo, 0, sizeof(fifo));
  for (int p = 0; p < nProg; p++) {
    int r = p % c->n, recv = p >= c->n;
    gcommSched_t s = {.func = recv ? gcommFuncRecv : c->func,
                      .algo = c->algo,
                      .nranks = c->n,
                      .rank = r,
                      .root = c->root,
                      .peer = (r + (recv ? c->n - 1 : 1)) % c->n,
                      .count = c->count,
                      .chanOff = off,
                      .chanCount = len,
                      .chunk = chunk,
                      .align = align,
                      .fan = c->fan};
    sched[p] = s;
    rankOf[p] = r;
    next[p] = 0;
    total[p] = gcommSchedNumSteps(&sched[p]);
  }
  for (int progress = 1, done = 0; !done;) {
    if (!progress) {
      tlFail("deadlock: no rank can run its next step");
      break;
    }
    progress = 0;
    done = 1;
    for (int p = 0; p < nProg; p++) {
      if (next[p] == total[p]) continue;
      done = 0;
      gcommStep_t st;
      gcommSchedGetStep(&sched[p], next[p], &st);
      int ran = runStep(c, rankOf[p], &st, chunk, fifo, &sent[p]);
      if (ran < 0) return;
      if (ran) progress = 1;
      if (ran == 1) next[p]++;
    }
  }
  for (int a = 0; a < c->n; a++)
    for (int b = 0; b < c->n; b++)
      if (fifo[a][b].head != fifo[a][b].tail) tlFail("data left in the FIFO %d -> %d", a, b);
}

/* One case: fresh random inputs and poisoned outputs, the channels, the comparison. */
static void runCase(Case* c, size_t chunk, size_t align, int nChannels, uint64_t seed) {
  bufferLengths(c);
  for (int r = 0; r < c->n; r++) {
    c->in[r] = malloc((c->inLen + 1) * sizeof(uint64_t));
    c->out[r] = malloc((c->outLen + 1) * sizeof(uint64_t));
    c->scratch[r] = malloc((c->scratchLen + 1) * sizeof(uint64_t));
    for (size_t i = 0; i < c->inLen; i++) c->in[r][i] = tlHash3(seed, (uint64_t)r, i);
    for (size_t i = 0; i < c->outLen; i++) c->out[r][i] = POISON;
    for (size_t i = 0; i < c->scratchLen; i++) c->scratch[r][i] = POISON;
  }
  /* channels split the range at a multiple of align, as gcomm.c's */
  size_t range = c->count, cut = range, half = (range / 2 + align - 1) / align * align;
  if (nChannels == 2 && half < range) cut = half;
  runChannel(c, 0, cut, chunk, align);
  if (cut < range) runChannel(c, cut, range - cut, chunk, align);
  for (int r = 0; r < c->n; r++) {
    for (size_t i = 0; i < c->outLen; i++) {
      if (c->out[r][i] != expected(c, r, i)) {
        tlFail("rank %d output element %zu of %zu is %s", r, i, c->outLen,
               c->out[r][i] == POISON ? "never written" : "wrong");
        break;
      }
    }
  }
  for (int r = 0; r < c->n; r++) free(c->in[r]), free(c->out[r]), free(c->scratch[r]);
}

static const char* const funcNames[] = {"AllReduce", "Broadcast",     "Reduce",
                                        "AllGather", "ReduceScatter", "AllToAll",
                                        "Gather",    "Scatter",       "Send/Recv"};
static const char* const algoNames[] = {"ring", "tree", "direct", "twoshot", "recdbl"};

int main(int argc, char** argv) {
  tlInit(&argc, &argv);
  static const size_t counts[] = {0, 1, 5, 17, 64, 101};
  static const size_t chunks[] = {1, 4, 12};
  static const size_t aligns[] = {1, 2, 4};
  long job = 0;
  for (int func = gcommFuncAllReduce; func <= gcommFuncSend; func++) {
    for (int algo = 0; algo < gcommNumAlgos; algo++) {
      /* each algorithm the function really runs, once */
      int a = gcommSchedAlgo(func, algo), seen = 0;
      for (int b = 0; b < algo; b++) seen |= gcommSchedAlgo(func, b) == a;
      if (seen) continue;
      for (int fan = 0; fan <= 1; fan++) {
        /* the reductions that have fan steps, to as many ranks as those run on */
        int fans =
            (func == gcommFuncAllReduce && (a == gcommAlgoDirect || a == gcommAlgoTwoShot)) ||
            (func == gcommFuncReduceScatter && a == gcommAlgoDirect);
        if (fan && !fans) continue;
        int maxRanks = fan && GCOMM_FAN_MAX_RANKS < MAXR ? GCOMM_FAN_MAX_RANKS : MAXR;
        for (int n = 1; n <= maxRanks; n++)
          for (int root = 0; root < n; root++)
            for (unsigned ci = 0; ci < sizeof(counts) / sizeof(counts[0]); ci++)
              for (unsigned hi = 0; hi < sizeof(chunks) / sizeof(chunks[0]); hi++)
                for (unsigned ai = 0; ai < sizeof(aligns) / sizeof(aligns[0]); ai++)
                  for (int nch = 1; nch <= 2; nch++) {
                    if (chunks[hi] % aligns[ai] || job++ % tlNranks != tlRank) continue;
                    Case c = {.func = func,
                              .algo = a,
                              .n = n,
                              .root = root,
                              .count = counts[ci],
                              .fan = fan};
                    int before = tlLocalFailed;
                    runCase(&c, chunks[hi], aligns[ai], nch, tlHash3(tlSeed, (uint64_t)job, 1));
                    if (tlLocalFailed && !before)
                      snprintf(tlWhy + strlen(tlWhy), sizeof(tlWhy) - strlen(tlWhy),
                               " (%d ranks, root %d, count %zu, chunk %zu, align %zu, %d channels)",
                               n, root, counts[ci], chunks[hi], aligns[ai], nch);
                  }
        tlReport("%s %s%s: every rank's output is the serial result, no deadlock, 1-%d ranks",
                 funcNames[func], algoNames[a], fan ? " (fan steps)" : "", maxRanks);
      }
    }
  }
  return tlFinish("test_sched");
}
