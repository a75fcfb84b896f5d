/*
 * gcomm_sched.h - every algorithm's schedule, written once.
 *
 * A collective on one channel is a sequence of steps. A step moves at most one FIFO slot of data
 * and is one of the data-movement verbs (send, recv, and their combinations), spelled as fields:
 *
 *   value = recv data from recvPeer[] (combined with the local operand src when reduce is set),
 *           or the local operand src when there is nothing to receive;
 *   then value (after the op's post-operation when postOp is set) goes to the local buffer dst
 *   and to the FIFOs of sendPeer[].
 *
 * So send = {src, sendPeer}, recv = {recvPeer, dst}, recvReduceSend = {recvPeer, src, reduce,
 * sendPeer}, recvReduceCopySend adds dst, recvCopySend = {recvPeer, dst, sendPeer}, copySend =
 * {src, dst, sendPeer}, and a local copy is {src, dst}.
 *
 * Both executors run these: the host executor in gcomm.c (non-blocking: a step runs when all of
 * its FIFOs are ready) and the GPU kernels (one block per channel, waiting on the FIFOs). Every
 * rank derives its steps from the same arguments, so the ranks agree on what each FIFO slot holds.
 */
#ifndef GCOMM_SCHED_H
#define GCOMM_SCHED_H

#include <stddef.h>
#include <stdint.h>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define GCOMM_HD static inline __host__ __device__
#else
#define GCOMM_HD static inline
#endif

#define GCOMM_STEPS 8 /* slots in every connection FIFO */
/* Mismatch detection (GCOMM_CHECK_MISMATCH): each FIFO slot's word is (tag << 32) | payload bytes,
 * where the tag packs the call that filled it (gcomm.c's opTag). A receiver that expects another
 * word names what differs and the rank. Host and GPU executors write and check the same word; the
 * network carries only the payload size (across nodes only the size is checked). */
#define GCOMM_SLOT_WORD(tag, bytes) (((uint64_t)(tag) << 32) | (uint64_t)(bytes))

typedef enum {
  gcommFuncAllReduce,
  gcommFuncBroadcast,
  gcommFuncReduce,
  gcommFuncAllGather,
  gcommFuncReduceScatter,
  gcommFuncAllToAll,
  gcommFuncGather,
  gcommFuncScatter,
  gcommFuncSend,
  gcommFuncRecv,
  /* the vector collectives (gcomm_vcoll.c): run as Send/Recv parts, named only in their tags */
  gcommFuncAllGatherV,
  gcommFuncAllToAllV,
  gcommFuncGatherV,
  gcommFuncScatterV,
  /* a rank's own block of a vector collective: one copy from its input to its output, with no
   * FIFO between (a Send and a Recv to itself would move it twice) */
  gcommFuncCopy,
  gcommNumFuncs
} gcommFunc_t;

/* Send, Recv and Copy run on the point-to-point channels, one peer each (Copy's is the rank). */
GCOMM_HD int gcommIsPointToPoint(int func) {
  return func == gcommFuncSend || func == gcommFuncRecv || func == gcommFuncCopy;
}
GCOMM_HD int gcommIsReduction(int func) {
  return func == gcommFuncAllReduce || func == gcommFuncReduce || func == gcommFuncReduceScatter;
}

typedef enum {
  gcommAlgoRing,
  gcommAlgoTree,
  gcommAlgoDirect,
  gcommAlgoTwoShot, /* AllReduce: a direct reduce-scatter, then a direct all-gather */
  gcommAlgoRecDbl,  /* host, small: AllGather in ceil(log2 n) exchanges (recursive doubling on
                       2^k ranks, Bruck's dissemination on others); AllReduce's butterfly */
  gcommNumAlgos
} gcommAlgo_t;

/* How a FIFO slot carries data (GPU communicators; the host executor always uses Simple).
 * Simple: the payload, then a fence and the tail counter. LL (low latency): 16-byte lines of
 * {data 4 B, flag 4 B, data 4 B, flag 4 B}, the flag being the connection's step + 1, so a
 * receiver polls the data itself and the sender needs no fence: half the capacity, a fraction
 * of the latency. An LL slot starts with a header line carrying the payload size. */
typedef enum { gcommProtoSimple, gcommProtoLL, gcommNumProtos } gcommProto_t;
#define GCOMM_LL_LINE 16
/* LL slots are their own (never shared with Simple payloads, which could hold a value that looks
 * like a flag): GCOMM_STEPS of them per connection, each carrying GCOMM_LL_SLOT_PAYLOAD bytes. */
#define GCOMM_LL_SLOT_PAYLOAD ((size_t)32768)
#define GCOMM_LL_SLOT_BYTES (GCOMM_LL_LINE + 2 * GCOMM_LL_SLOT_PAYLOAD)

/* A step's local buffers: the caller's input and output, and the operation's scratch, where the
 * binomial Gather and Scatter (host communicators) hold a subtree's blocks on the ranks whose
 * output has no room for them (gcommSchedScratchElems elements). */
enum { GCOMM_BUF_NONE = 0, GCOMM_BUF_IN = 1, GCOMM_BUF_OUT = 2, GCOMM_BUF_SCRATCH = 3 };

/* A fan step (GPU communicators, LL, at most GCOMM_FAN_MAX_RANKS ranks) meets every other rank
 * at once instead of one or two a step: a step's fixed work, not its data, is what a small
 * reduction on a GPU costs (docs/PERF.md), and the direct patterns below take n-1 or more steps.
 * Its data is cut in blocks: block p starts gcommFanStart elements past srcOff (or dstOff) and
 * holds gcommFanCount. What it does is the union of:
 *   SEND_SAME   this rank's block of src (at srcOff + start(rank)) to every other rank;
 *   SEND_BLOCKS block p of src to each other rank p;
 *   REDUCE      every rank's block `rank`, combined in rank order (x0 op x1 op ... op xn-1, this
 *               rank's own from src), to dst at dstOff (after the post-operation when postOp);
 *   GATHER      what each other rank p sends, to dst at dstOff + start(p).
 * Its sends come before its receives in every thread, and a send waits only for a free slot
 * (freed by the peer's earlier steps), so a fan step that sends and receives cannot deadlock. */
#define GCOMM_FAN_MAX_RANKS 8
enum {
  GCOMM_FAN_SEND_SAME = 1,
  GCOMM_FAN_SEND_BLOCKS = 2,
  GCOMM_FAN_REDUCE = 4,
  GCOMM_FAN_GATHER = 8
};

typedef struct {
  int recvPeer[2]; /* ranks whose FIFO to this rank is read, -1 for none */
  int sendPeer[2]; /* ranks whose FIFO from this rank is written, -1 for none */
  int src;         /* local operand: a GCOMM_BUF_* (GCOMM_BUF_NONE: none) */
  int dst;         /* local destination: GCOMM_BUF_OUT, GCOMM_BUF_SCRATCH or GCOMM_BUF_NONE */
  int reduce;      /* combine the received data with src (else received data replaces it) */
  int postOp;      /* the value is final: apply the op's post-operation (Avg divides) */
  int fan;         /* GCOMM_FAN_* flags (recvPeer and sendPeer unused), or 0 */
  size_t srcOff, dstOff, count; /* in elements; a fan step's count is a block's */
  size_t fanStride, fanSpan;    /* fan blocks: block p at min(p * stride, span), clipped there */
} gcommStep_t;

GCOMM_HD size_t gcommFanStart(const gcommStep_t* st, int p) {
  size_t start = (size_t)p * st->fanStride;
  return start < st->fanSpan ? start : st->fanSpan;
}
GCOMM_HD size_t gcommFanCount(const gcommStep_t* st, int p) {
  size_t left = st->fanSpan - gcommFanStart(st, p);
  return st->count < left ? st->count : left;
}

/* What one channel of one operation needs to compute its steps. */
typedef struct {
  int func, algo, nranks, rank;
  int root;     /* root of Broadcast/Reduce/Gather/Scatter; 0 for the AllReduce tree */
  int peer;     /* Send/Recv */
  size_t count; /* per-rank block for AllGather/ReduceScatter/AllToAll/Gather/Scatter, else total */
  size_t chanOff; /* this channel's range inside [0, count) */
  size_t chanCount;
  size_t chunk; /* elements per FIFO slot, a multiple of align */
  size_t align; /* chunk boundaries fall on multiples of this many elements */
  int fan;      /* the direct reductions take fan steps (gcommSchedFans) */
} gcommSched_t;

GCOMM_HD int gcommMod(int a, int n) {
  return ((a % n) + n) % n;
}
/* Division by the 32-bit divide when both operands fit: on a GPU the 64-bit one is a called
 * routine, whose register saves go through local memory (slow in a kernel's steps, PERF.md). */
GCOMM_HD size_t gcommDiv(size_t a, size_t b) {
  return ((a | b) >> 32) ? a / b : (size_t)((uint32_t)a / (uint32_t)b);
}
GCOMM_HD size_t gcommDivUp(size_t a, size_t b) {
  return gcommDiv(a + b - 1, b);
}
GCOMM_HD size_t gcommMinSize(size_t a, size_t b) {
  return a < b ? a : b;
}

/* The algorithm an operation really runs: a forced one it lacks falls back to one it has. */
GCOMM_HD int gcommSchedAlgo(int func, int algo) {
  switch (func) {
    case gcommFuncAllReduce:
      return algo;
    case gcommFuncBroadcast:
    case gcommFuncReduce: /* two-shot is AllReduce's: the others' direct form is their one shot */
      return algo == gcommAlgoTwoShot || algo == gcommAlgoRecDbl ? gcommAlgoDirect : algo;
    case gcommFuncAllGather:
      return algo == gcommAlgoDirect || algo == gcommAlgoTwoShot ? gcommAlgoDirect
             : algo == gcommAlgoRecDbl                           ? gcommAlgoRecDbl
                                                                 : gcommAlgoRing;
    case gcommFuncReduceScatter:
      return algo == gcommAlgoRing || algo == gcommAlgoTree ? gcommAlgoRing : gcommAlgoDirect;
    case gcommFuncGather:
    case gcommFuncScatter:
      return algo == gcommAlgoTree ? gcommAlgoTree : gcommAlgoDirect;
    default:
      return gcommAlgoDirect;
  }
}

/* Whether func's algo is the binomial Gather or Scatter (GCOMM_ALGO=tree for those). */
GCOMM_HD int gcommIsBinomial(int func, int algo) {
  return algo == gcommAlgoTree && (func == gcommFuncGather || func == gcommFuncScatter);
}

/* Whether only host communicators run this algorithm (recursive doubling; the binomial Gather and
 * Scatter): the kernels do not carry it, and a GPU communicator runs direct instead. */
GCOMM_HD int gcommSchedHostOnly(int func, int algo) {
  return algo == gcommAlgoRecDbl || gcommIsBinomial(func, algo);
}

/* Chunks of the channel range; a ring AllReduce moves nranks chunks per round. */
GCOMM_HD size_t gcommSchedRoundElems(const gcommSched_t* s) {
  return (s->func == gcommFuncAllReduce &&
          (s->algo == gcommAlgoRing || s->algo == gcommAlgoTwoShot))
             ? s->chunk * s->nranks
             : s->chunk;
}

GCOMM_HD int gcommLog2(int n) {
  int l = 0;
  while ((1 << l) < n) l++;
  return l;
}

/* Whether n is a power of two: recursive doubling's own pairs, else the dissemination pattern. */
GCOMM_HD int gcommIsPow2(int n) {
  return (n & (n - 1)) == 0;
}

/* Recursive doubling (and, on other rank counts, the dissemination pattern) and the binomial
 * Gather and Scatter move whole groups of blocks, each one contiguous slot: they run where the
 * channel holds the whole block (one round) and the largest group, 2^(ceil(log2 n) - 1) blocks
 * (n/2 on 2^L ranks; a binomial subtree below the root), fits a slot. Elsewhere their collective
 * runs direct, which every rank decides alike from the schedule's shared fields. */
GCOMM_HD int gcommGroupsFit(const gcommSched_t* s) {
  int n = s->nranks, most = n < 2 ? 1 : 1 << (gcommLog2(n) - 1);
  return s->chanOff == 0 && s->chanCount == s->count && s->count * (size_t)most <= s->chunk;
}

/* The kernels carry only the schedules GPU communicators run. Recursive doubling is a host
 * algorithm (gcommChooseAlgo never gives it to a GPU communicator), and its code in the kernels'
 * schedule made every Simple step slower (2 H200, a 2 MB all-reduce 2.5%: the step loop's
 * registers). */
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
#define GCOMM_SCHED_HOST_ALGOS 0
#else
#define GCOMM_SCHED_HOST_ALGOS 1
#endif

/* The algorithm a channel runs: its operation's, except an all-gather's recursive doubling and a
 * binomial Gather or Scatter where they do not fit (gcommGroupsFit). */
GCOMM_HD int gcommSchedChannelAlgo(const gcommSched_t* s) {
  if (!GCOMM_SCHED_HOST_ALGOS) return s->algo;
  int groups = (s->func == gcommFuncAllGather && s->algo == gcommAlgoRecDbl) ||
               gcommIsBinomial(s->func, s->algo);
  return groups && !gcommGroupsFit(s) ? gcommAlgoDirect : s->algo;
}

/* Binomial tree over v = (rank - root) mod n, the root 0: v's parent is v without its lowest set
 * bit, its children v + 2^k for every 2^k below that bit (the root: below n), its subtree the
 * ranks [v, v + span) below n. A subtree's blocks, in v order, are one contiguous range of the
 * root's buffer unless they pass block n-1: a child of the root whose range wraps moves it in two
 * parts (gcommBinParts). */
GCOMM_HD int gcommBinSpan(int v, int n) {
  return v == 0 ? 1 << gcommLog2(n) : v & -v;
}
GCOMM_HD int gcommBinSize(int v, int n) {
  int span = gcommBinSpan(v, n);
  return span < n - v ? span : n - v;
}
GCOMM_HD int gcommBinChildren(int v, int n) {
  int k = 0, span = gcommBinSpan(v, n);
  while ((1 << k) < span && v + (1 << k) < n) k++;
  return k;
}
/* The blocks of v's subtree before the wrap (its size where there is none), on the root's side. */
GCOMM_HD int gcommBinFirstPart(int v, int root, int n) {
  int size = gcommBinSize(v, n), first = n - (root + v) % n;
  return v > 0 && v == gcommBinSpan(v, n) && first < size ? first : size;
}
GCOMM_HD int gcommBinParts(int v, int root, int n) {
  return gcommBinFirstPart(v, root, n) < gcommBinSize(v, n) ? 2 : 1;
}

/* Elements of scratch the operation needs on each rank: the binomial Gather's and Scatter's
 * subtrees (nranks blocks bound them all), else none. */
GCOMM_HD size_t gcommSchedScratchElems(int func, int algo, int nranks, size_t count) {
  return gcommIsBinomial(func, algo) && nranks > 1 ? (size_t)nranks * count : 0;
}

/* Recursive doubling's AllReduce on n ranks, p = 2^floor(log2 n) of which exchange: the first
 * 2e = 2(n - p) pair up, the even one of each pair handing its input to the odd one and getting
 * the result back. e; a rank's place among the p (-1: it hands over); the rank at a place. */
GCOMM_HD int gcommRecDblExtra(int n) {
  return n - (1 << (gcommLog2(n + 1) - 1));
}
GCOMM_HD int gcommRecDblPlace(int r, int n) {
  int e = gcommRecDblExtra(n);
  return r >= 2 * e ? r - e : r % 2 ? r / 2 : -1;
}
GCOMM_HD int gcommRecDblRank(int v, int n) {
  int e = gcommRecDblExtra(n);
  return v < e ? 2 * v + 1 : v + e;
}

/* Whether a schedule sends partial values out of the output and writes the output again later
 * (recursive doubling's AllReduce); every other sends a value from the output only once it is
 * final, which the host executor counts on to lend it by reference (gcomm_executor.c sendsRef). */
GCOMM_HD int gcommSchedRewritesOutput(int func, int algo) {
  return func == gcommFuncAllReduce && algo == gcommAlgoRecDbl;
}

/* Steps of a direct reduction (gcommDirectReduce): n-1 sends, then the n-1 receives two a step. */
GCOMM_HD long gcommDirectReduceSteps(int n) {
  return (n - 1) + n / 2;
}

/* Steps of the binomial Gather (Scatter) on this rank: the root copies its own block and
 * receives (sends) each child's subtree, in one or two parts; any other rank with children copies
 * its own block to (from) scratch, receives (sends) their subtrees there, and sends (receives) its
 * whole subtree to (from) its parent; a leaf only sends (receives) its block. */
GCOMM_HD long gcommBinSteps(const gcommSched_t* s) {
  int n = s->nranks, v = gcommMod(s->rank - s->root, n), k = gcommBinChildren(v, n);
  if (v > 0) return (k > 0 ? 1 + k : 0) + gcommBinParts(v, s->root, n);
  long steps = 1;
  for (int i = 0; i < k; i++) steps += gcommBinParts(1 << i, s->root, n);
  return steps;
}

/* Steps one round (one chunk of the channel range) takes on this rank. */
GCOMM_HD long gcommSchedStepsPerRound(const gcommSched_t* s) {
  int n = s->nranks, r = s->rank, algo = gcommSchedChannelAlgo(s);
  if (gcommIsPointToPoint(s->func) || n == 1) return 1;
  switch (s->func) {
    case gcommFuncAllReduce:
      if (s->fan && (s->algo == gcommAlgoDirect || s->algo == gcommAlgoTwoShot))
        return s->algo == gcommAlgoDirect ? 1 : 2;
      if (s->algo == gcommAlgoDirect) return n == 2 ? 2 : 2 * ((n + 1) / 2);
      if (s->algo == gcommAlgoTwoShot) return 2 * gcommDirectReduceSteps(n);
      if (GCOMM_SCHED_HOST_ALGOS && s->algo == gcommAlgoRecDbl) {
        int e = gcommRecDblExtra(n);
        return gcommRecDblPlace(r, n) < 0 ? 2 : 2 * gcommLog2(n - e) + (r < 2 * e ? 2 : 0);
      }
      return s->algo == gcommAlgoTree ? 2 : 2 * n - 1;
    case gcommFuncBroadcast:
      return (s->algo == gcommAlgoDirect && r == s->root) ? n : 1;
    case gcommFuncReduce:
      return (s->algo == gcommAlgoDirect && r == s->root) ? n : 1;
    case gcommFuncAllGather:
      return GCOMM_SCHED_HOST_ALGOS && algo == gcommAlgoRecDbl
                 ? (gcommIsPow2(n) ? 2 : 4) * gcommLog2(n)
             : algo == gcommAlgoDirect ? 2 * n - 1
                                       : n;
    case gcommFuncReduceScatter:
      if (s->algo != gcommAlgoDirect) return n;
      return s->fan ? 1 : gcommDirectReduceSteps(n);
    case gcommFuncAllToAll:
      return 2 * n - 1;
    case gcommFuncGather:
    case gcommFuncScatter:
      if (GCOMM_SCHED_HOST_ALGOS && algo == gcommAlgoTree) return gcommBinSteps(s);
      return r == s->root ? n : 1;
    default:
      return 0;
  }
}

GCOMM_HD long gcommSchedNumSteps(const gcommSched_t* s) {
  if (s->chanCount == 0) return 0;
  return (long)gcommDivUp(s->chanCount, gcommSchedRoundElems(s)) * gcommSchedStepsPerRound(s);
}

GCOMM_HD void gcommStepInit(gcommStep_t* st) {
  st->recvPeer[0] = st->recvPeer[1] = st->sendPeer[0] = st->sendPeer[1] = -1;
  st->src = st->dst = GCOMM_BUF_NONE;
  st->reduce = st->postOp = st->fan = 0;
  st->srcOff = st->dstOff = st->count = 0;
  st->fanStride = st->fanSpan = 0;
}

/* ======================================================================================== */
/* The building blocks: a binary tree, the direct (all-pairs) pattern, chunks of a round.    */
/* ======================================================================================== */

/* Binary tree over ranks renumbered v = (rank - root) mod n, so that root is 0: v's parent is
 * (v - 1) / 2, its children 2v + 1 and 2v + 2 (those below n). */
GCOMM_HD int gcommTreeParent(int rank, int root, int n) {
  int v = gcommMod(rank - root, n);
  return v == 0 ? -1 : (root + (v - 1) / 2) % n;
}
GCOMM_HD int gcommTreeChild(int rank, int root, int n, int which) {
  int c = 2 * gcommMod(rank - root, n) + 1 + which;
  return c < n ? (root + c) % n : -1;
}

/* Tree reduce of one chunk, up toward the root: each rank receives its children's partial
 * results, combines them with its own input and sends the sum to its parent; the root writes the
 * finished value (the post-operation applies there). A leaf only sends its input. */
GCOMM_HD void gcommTreeUp(int r, int n, int root, gcommStep_t* st) {
  int parent = gcommTreeParent(r, root, n), c0 = gcommTreeChild(r, root, n, 0);
  st->recvPeer[0] = c0;
  st->recvPeer[1] = gcommTreeChild(r, root, n, 1);
  st->reduce = c0 >= 0;
  st->src = GCOMM_BUF_IN;
  if (parent < 0) {
    st->dst = GCOMM_BUF_OUT;
    st->postOp = 1;
  } else {
    st->sendPeer[0] = parent;
  }
}

/* Tree broadcast of one chunk, down from the root: the root sends its value (from srcBuf, copied
 * to its output when that is the input) to its children; every other rank receives it from its
 * parent, writes it to its output and forwards it to its children. */
GCOMM_HD void gcommTreeDown(int r, int n, int root, int srcBuf, gcommStep_t* st) {
  int parent = gcommTreeParent(r, root, n);
  st->sendPeer[0] = gcommTreeChild(r, root, n, 0);
  st->sendPeer[1] = gcommTreeChild(r, root, n, 1);
  if (parent < 0) {
    st->src = srcBuf;
    if (srcBuf == GCOMM_BUF_IN) st->dst = GCOMM_BUF_OUT;
  } else {
    st->recvPeer[0] = parent;
    st->dst = GCOMM_BUF_OUT;
  }
}

/* The direct pattern: in round step t, t < n-1 sends to rank+1+t, t == n-1 is the local part,
 * t >= n receives from rank-(t-n+1). Sends come first so that in-place buffers are read before
 * they are overwritten. It cannot deadlock: rank p sends to this rank at its step
 * (rank-p-1) mod n < n-1, and sends wait on nothing but free slots, so every receive waits only
 * on a step of its peer that comes strictly earlier. Returns the peer (or this rank for the local
 * part). */
GCOMM_HD int gcommDirectPeer(int rank, int n, long t, int* sending) {
  *sending = t < n - 1;
  if (t < n - 1) return (rank + 1 + (int)t) % n;
  if (t == n - 1) return rank;
  return gcommMod(rank - (int)(t - n + 1), n);
}

/* The ranks paired step j serves when a rank meets the m ranks r+s, r+2s, ..., r+ms (s = 1: the
 * ranks after it, -1: before; r+n is r itself) two a step: r+s(1+2j), and r+s(2+2j) while one is
 * left. */
GCOMM_HD void gcommPairPeers(int r, int n, int m, int j, int s, int* peer) {
  peer[0] = gcommMod(r + s * (1 + 2 * j), n);
  if (2 * j + 2 <= m) peer[1] = gcommMod(r + s * (2 + 2 * j), n);
}

/* A direct reduction in gcommDirectReduceSteps: send block p of the input to each rank p
 * (t < n-1), then combine what every other rank sent, two ranks a step, from rank-1 down to rank+1:
 * step j receives from ranks r-1-2j and r-2-2j. The first of those steps takes this rank's own
 * input block as its operand, the others the output, so the value is x_r op x_r-1 op x_r-2 ...
 * in that order, as one rank a step would compute it, in one step fewer for every two ranks
 * (a step's fixed work is what a small reduction on a GPU costs). blk: elements between blocks;
 * 0 when every rank reduces the whole range, as the one-shot AllReduce does. */
GCOMM_HD void gcommDirectReduce(int r, int n, long t, size_t blk, size_t off, gcommStep_t* st) {
  st->srcOff = st->dstOff = off;
  st->src = GCOMM_BUF_IN;
  if (t < n - 1) {
    int p = (r + 1 + (int)t) % n;
    st->srcOff = p * blk + off;
    st->sendPeer[0] = p;
    return;
  }
  int j = (int)(t - (n - 1));
  gcommPairPeers(r, n, n - 1, j, -1, st->recvPeer);
  st->reduce = 1;
  st->dst = GCOMM_BUF_OUT;
  if (j == 0)
    st->srcOff = r * blk + off;
  else
    st->src = GCOMM_BUF_OUT;
  st->postOp = j == n / 2 - 1;
}

/* A direct exchange: send input block p (at p*blk) to each rank p, copy this rank's own block,
 * and put what rank p sent at output block p (at p*R). blk is 0 when every rank sends the same
 * block (AllGather), R when each peer gets its own (AllToAll). */
GCOMM_HD void gcommDirectExchange(int r, int n, long t, size_t blk, size_t R, size_t off,
                                  gcommStep_t* st) {
  int sending, p = gcommDirectPeer(r, n, t, &sending);
  st->src = GCOMM_BUF_IN;
  if (sending) {
    st->srcOff = p * blk + off;
    st->sendPeer[0] = p;
    return;
  }
  if (p != r) {
    st->src = GCOMM_BUF_NONE;
    st->recvPeer[0] = p;
  }
  st->srcOff = r * blk + off;
  st->dst = GCOMM_BUF_OUT;
  st->dstOff = p * R + off;
}

/* The fan reduction of a round (gcommStep_t's fan steps): send block p of src (block p at off +
 * p * stride, c elements; stride 0: the same block to all) to each rank p and combine every rank's
 * block of this rank, in rank order, into dst at dstOff, the value final. One step where the
 * direct reduction takes gcommDirectReduceSteps. */
GCOMM_HD void gcommFanReduce(size_t off, size_t stride, size_t span, size_t c, gcommStep_t* st) {
  st->fan = (stride ? GCOMM_FAN_SEND_BLOCKS : GCOMM_FAN_SEND_SAME) | GCOMM_FAN_REDUCE;
  st->src = GCOMM_BUF_IN;
  st->dst = GCOMM_BUF_OUT;
  st->reduce = st->postOp = 1;
  st->srcOff = off;
  st->count = c;
  st->fanStride = stride;
  st->fanSpan = span;
}

/* A round of c elements cut into n blocks of a multiple of align (the last ones shorter or empty):
 * the block size, and where block k starts. */
GCOMM_HD size_t gcommRankBlock(size_t c, int n, size_t align) {
  return gcommDivUp(gcommDivUp(c, n), align) * align;
}
GCOMM_HD size_t gcommBlockStart(size_t c, size_t pc, int k) {
  return gcommMinSize(c, pc * (size_t)k);
}

/* Where a step falls: step t of its round, which covers elements [off, off + c) of the buffers.
 * Rounds cut the channel's range [chanOff, chanOff + chanCount) into gcommSchedRoundElems pieces
 * and each takes gcommSchedStepsPerRound steps, one round after the other; the tree AllReduce
 * instead sends every round up the tree (t = 0) before any comes down (t = 1), so that the rounds
 * pipeline along the tree. */
typedef struct {
  long t;
  size_t off, c;
} gcommRound_t;

GCOMM_HD void gcommSchedRound(const gcommSched_t* s, long step, gcommRound_t* q) {
  long per = gcommSchedStepsPerRound(s);
  size_t round = gcommDiv((size_t)step, (size_t)per), relems = gcommSchedRoundElems(s);
  long t = step - (long)round * per;
  if (s->func == gcommFuncAllReduce && s->algo == gcommAlgoTree && s->nranks > 1) {
    long nChunks = (long)gcommDivUp(s->chanCount, relems);
    t = step < nChunks ? 0 : 1;
    round = (size_t)(step < nChunks ? step : step - nChunks);
  }
  q->t = t;
  q->off = s->chanOff + round * relems;
  q->c = gcommMinSize(relems, s->chanOff + s->chanCount - q->off);
}

/* ======================================================================================== */
/* One function per collective and algorithm: step q->t of a round on rank s->rank of n.     */
/* Each starts from gcommStepInit's empty step with count q->c at srcOff = dstOff = q->off.  */
/* R = s->count is the distance between per-rank blocks of the buffers.                      */
/* ======================================================================================== */

/* Ring AllReduce, a round of c elements cut into n chunks, ranks in a ring r -> r+1. At every step
 * t (0 <= t <= 2n-2) rank r works on chunk k = (r - 1 - t) mod n, the one rank r-1 worked on at
 * step t-1:
 *   reduce-scatter, t = 0 .. n-1: at t = 0 rank r sends chunk r-1 of its input to r+1; at t > 0 it
 *     receives from r-1 the partial result of chunk k (the inputs of ranks k+1 .. r-1), combines
 *     it with its own input's chunk k and sends it on. At t = n-1, k = r and the result holds
 *     every rank's input: rank r owns the finished chunk r (the post-operation applies here),
 *     writes it to its output and sends it on, which starts
 *   all-gather, t = n .. 2n-2: each rank writes the finished chunk it receives from r-1 to its
 *     output and forwards it, except at the last step: its chunk r+1 is the one r+1 finished. */
GCOMM_HD void gcommStepAllReduceRing(const gcommSched_t* s, const gcommRound_t* q,
                                     gcommStep_t* st) {
  int n = s->nranks, r = s->rank;
  long t = q->t;
  size_t pc = gcommRankBlock(q->c, n, s->align);
  int k = gcommMod(r - 1 - (int)t, n);
  st->srcOff = st->dstOff = q->off + gcommBlockStart(q->c, pc, k);
  st->count = gcommBlockStart(q->c, pc, k + 1) - gcommBlockStart(q->c, pc, k);
  if (t > 0) st->recvPeer[0] = gcommMod(r - 1, n);
  if (t < 2 * n - 2) st->sendPeer[0] = (r + 1) % n;
  if (t < n) {
    st->src = GCOMM_BUF_IN;
    st->reduce = t > 0;
  }
  if (t >= n - 1) st->dst = GCOMM_BUF_OUT;
  st->postOp = t == n - 1;
}

/* Tree AllReduce: a tree reduce toward rank 0 (t = 0), then a tree broadcast of rank 0's output
 * (t = 1), each pipelined over the rounds (gcommSchedRound). */
GCOMM_HD void gcommStepAllReduceTree(const gcommSched_t* s, const gcommRound_t* q,
                                     gcommStep_t* st) {
  if (q->t == 0)
    gcommTreeUp(s->rank, s->nranks, 0, st);
  else
    gcommTreeDown(s->rank, s->nranks, 0, GCOMM_BUF_OUT, st);
}

/* One-shot (direct) AllReduce with more than two ranks: every rank sends its input to every rank,
 * itself included (through its self FIFO), two a step, then combines the n inputs in rank order,
 * two a step: ((x0 op x1) op x2) op ... is then the same expression on every rank, so every rank
 * gets the same bits (a rank-dependent order could differ in the last bits for floating point).
 * With two ranks, a direct reduction: x0 op x1 == x1 op x0, the same bits. */
GCOMM_HD void gcommStepAllReduceOneShot(const gcommSched_t* s, const gcommRound_t* q,
                                        gcommStep_t* st) {
  int n = s->nranks, r = s->rank;
  long t = q->t, half = (n + 1) / 2;
  if (s->fan) { /* one fan step: the input to every rank, every rank's combined */
    gcommFanReduce(q->off, 0, q->c, q->c, st);
    return;
  }
  if (n == 2) {
    gcommDirectReduce(r, n, t, 0, q->off, st);
    return;
  }
  if (t < half) { /* send the input to ranks r+1+2t and r+2+2t */
    st->src = GCOMM_BUF_IN;
    gcommPairPeers(r, n, n, (int)t, 1, st->sendPeer);
    return;
  }
  long k = t - half; /* combine the inputs of ranks 2k and 2k+1 into the output */
  st->recvPeer[0] = (int)(2 * k);
  if (2 * k + 1 < n) st->recvPeer[1] = (int)(2 * k + 1);
  st->reduce = 1;
  st->src = k == 0 ? GCOMM_BUF_NONE : GCOMM_BUF_OUT; /* the first step: in0 op in1 */
  st->dst = GCOMM_BUF_OUT;
  st->postOp = k == half - 1;
}

/* Recursive-doubling AllReduce (the butterfly), a round's c elements whole. On p = 2^L ranks,
 * exchange k (0 <= k < L) pairs place v with v ^ 2^k: step 2k sends the rank's value (its input
 * at k = 0, else its output), step 2k+1 combines the partner's with it into the output; after
 * exchange k each rank holds the combination of its group of 2^(k+1), all of them after the last
 * (the post-operation there). On other counts (gcommRecDblPlace) the first 2e = 2(n - p) ranks
 * pair up before: even rank 2i sends its input to 2i+1 (its step 0) and receives the result from
 * it at the end (step 1); 2i+1 combines it with its own input first (its step 0) and sends the
 * result back last. L exchanges (plus 2 steps on the paired ranks) against the one-shot's n-1
 * sends and receives. Partners combine the same two values, a op b on one and b op a on the
 * other: the operators commute, so every rank gets the same bits (not the rank order's, which the
 * one-shot keeps). In place, a step reads its value before the next writes the output. */
GCOMM_HD void gcommStepAllReduceRecDbl(const gcommSched_t* s, const gcommRound_t* q,
                                       gcommStep_t* st) {
  int n = s->nranks, r = s->rank, v = gcommRecDblPlace(r, n);
  int e = gcommRecDblExtra(n), L = gcommLog2(n - e), paired = r < 2 * e;
  long t = q->t;
  if (v < 0) { /* hands its input to r + 1, then gets the result */
    if (t == 0) {
      st->src = GCOMM_BUF_IN;
      st->sendPeer[0] = r + 1;
    } else {
      st->recvPeer[0] = r + 1;
      st->dst = GCOMM_BUF_OUT;
    }
    return;
  }
  if (paired && t == 0) { /* r - 1's input combined with this one's */
    st->src = GCOMM_BUF_IN;
    st->recvPeer[0] = r - 1;
    st->dst = GCOMM_BUF_OUT;
    st->reduce = 1;
    st->postOp = L == 0;
    return;
  }
  long x = t - paired; /* the step within the exchanges */
  if (x == 2 * L) {    /* the result back to r - 1 */
    st->src = GCOMM_BUF_OUT;
    st->sendPeer[0] = r - 1;
    return;
  }
  int k = (int)(x / 2), partner = gcommRecDblRank(v ^ (1 << k), n);
  st->src = k == 0 && !paired ? GCOMM_BUF_IN : GCOMM_BUF_OUT;
  if (x % 2 == 0) {
    st->sendPeer[0] = partner;
  } else {
    st->recvPeer[0] = partner;
    st->dst = GCOMM_BUF_OUT;
    st->reduce = 1;
    st->postOp = k == L - 1;
  }
}

/* Two-shot AllReduce, a round of c elements cut into n blocks (as the ring's):
 *   reduce-scatter, the first gcommDirectReduceSteps steps: a direct reduction of block r (send
 *     block p of the input to rank p, then combine what every other rank sent into output
 *     block r);
 *   all-gather, the next as many: send the finished block r to every other rank, two a step
 *     (ranks r+1+2j and r+2+2j), then receive every other rank's into its output block, from
 *     rank-1 down to rank+1.
 * Two hops instead of the ring's 2(n-1); each block is reduced by one rank and copied to the
 * others, so every rank gets the same bits. In place, input block p is sent before output block
 * p is written. */
GCOMM_HD void gcommStepAllReduceTwoShot(const gcommSched_t* s, const gcommRound_t* q,
                                        gcommStep_t* st) {
  int n = s->nranks, r = s->rank;
  long t = q->t, half = gcommDirectReduceSteps(n);
  size_t off = q->off, c = q->c, pc = gcommRankBlock(c, n, s->align);
  if (s->fan) { /* two fan steps: the reduce-scatter, then block r to every rank */
    gcommFanReduce(off, pc, c, pc, st);
    st->dstOff = off + gcommFanStart(st, r);
    if (t == 1) {
      st->fan = GCOMM_FAN_SEND_SAME | GCOMM_FAN_GATHER;
      st->src = GCOMM_BUF_OUT;
      st->dstOff = off;
      st->reduce = st->postOp = 0;
    }
    return;
  }
  if (t < half) { /* reduce-scatter */
    gcommDirectReduce(r, n, t, 0, 0, st);
    int k = t < n - 1 ? st->sendPeer[0] : r; /* the block this step moves */
    st->srcOff = off + gcommBlockStart(c, pc, k);
    st->dstOff = off + gcommBlockStart(c, pc, r);
    st->count = gcommBlockStart(c, pc, k + 1) - gcommBlockStart(c, pc, k);
    return;
  }
  int j = (int)(t - half), k = r; /* k: the block this step moves */
  if (j < n / 2) {                /* block r, finished, to ranks r+1+2j and r+2+2j */
    st->src = GCOMM_BUF_OUT;
    gcommPairPeers(r, n, n - 1, j, 1, st->sendPeer);
  } else { /* rank k's block */
    k = gcommMod(r - 1 - (j - n / 2), n);
    st->recvPeer[0] = k;
    st->dst = GCOMM_BUF_OUT;
  }
  st->srcOff = st->dstOff = off + gcommBlockStart(c, pc, k);
  st->count = gcommBlockStart(c, pc, k + 1) - gcommBlockStart(c, pc, k);
}

/* Chain Broadcast (the ring algorithm): root -> root+1 -> ... -> root-1. The root sends its input
 * to r+1 and copies it to its output; every other rank receives from r-1, writes the data to its
 * output and forwards it to r+1 unless r+1 is the root. Rounds pipeline along the chain. */
GCOMM_HD void gcommStepBroadcastChain(const gcommSched_t* s, gcommStep_t* st) {
  int n = s->nranks, r = s->rank, next = (r + 1) % n;
  if (r == s->root) {
    st->src = GCOMM_BUF_IN;
    st->dst = GCOMM_BUF_OUT;
    st->sendPeer[0] = next;
    return;
  }
  st->dst = GCOMM_BUF_OUT;
  st->recvPeer[0] = gcommMod(r - 1, n);
  if (next != s->root) st->sendPeer[0] = next;
}

/* Direct Broadcast: the root sends its input to every other rank, one a step in gcommDirectPeer's
 * order, then copies it to its own output (step n-1); every other rank receives from the root. */
GCOMM_HD void gcommStepBroadcastDirect(const gcommSched_t* s, const gcommRound_t* q,
                                       gcommStep_t* st) {
  int sending, p;
  if (s->rank != s->root) {
    st->dst = GCOMM_BUF_OUT;
    st->recvPeer[0] = s->root;
    return;
  }
  st->src = GCOMM_BUF_IN;
  p = gcommDirectPeer(s->rank, s->nranks, q->t, &sending);
  if (sending)
    st->sendPeer[0] = p;
  else
    st->dst = GCOMM_BUF_OUT;
}

/* Chain Reduce (the ring algorithm): root+1 -> root+2 -> ... -> root. Rank root+1 sends its input
 * to r+1; every later rank receives the partial result from r-1, combines its own input with it
 * and sends it on, the root writing the finished value (the post-operation applies there). */
GCOMM_HD void gcommStepReduceChain(const gcommSched_t* s, gcommStep_t* st) {
  int n = s->nranks, r = s->rank, prev = gcommMod(r - 1, n);
  st->src = GCOMM_BUF_IN;
  if (prev != s->root) {
    st->recvPeer[0] = prev;
    st->reduce = 1;
  }
  if (r == s->root) {
    st->dst = GCOMM_BUF_OUT;
    st->postOp = 1;
  } else {
    st->sendPeer[0] = (r + 1) % n;
  }
}

/* Direct Reduce: every other rank sends its input to the root. The root copies its own input to
 * its output (t = 0), then combines into it what rank root+t sent, t = 1 .. n-1 (the
 * post-operation at the last). */
GCOMM_HD void gcommStepReduceDirect(const gcommSched_t* s, const gcommRound_t* q, gcommStep_t* st) {
  int r = s->rank;
  long t = q->t;
  if (r != s->root) {
    st->src = GCOMM_BUF_IN;
    st->sendPeer[0] = s->root;
  } else if (t == 0) {
    st->src = GCOMM_BUF_IN;
    st->dst = GCOMM_BUF_OUT;
  } else {
    st->recvPeer[0] = (r + (int)t) % s->nranks;
    st->src = GCOMM_BUF_OUT;
    st->reduce = 1;
    st->dst = GCOMM_BUF_OUT;
    st->postOp = t == s->nranks - 1;
  }
}

/* Ring AllGather, ranks in a ring r -> r+1: at step t (0 <= t <= n-1) rank r holds block
 * (r - t) mod n and writes it to that block of its output: its own input at t = 0, else what it
 * receives from r-1. It sends the block on to r+1 except at the last step (r+1 owns that block). */
GCOMM_HD void gcommStepAllGatherRing(const gcommSched_t* s, const gcommRound_t* q,
                                     gcommStep_t* st) {
  int n = s->nranks, r = s->rank;
  long t = q->t;
  st->dstOff = gcommMod(r - (int)t, n) * s->count + q->off;
  st->dst = GCOMM_BUF_OUT;
  if (t == 0)
    st->src = GCOMM_BUF_IN;
  else
    st->recvPeer[0] = gcommMod(r - 1, n);
  if (t < n - 1) st->sendPeer[0] = (r + 1) % n;
}

/* Recursive-doubling AllGather on n = 2^L ranks, the whole block in one round (gcommGroupsFit).
 * Exchange k (0 <= k < L) pairs rank r with r ^ 2^k; before it, r holds the 2^k blocks of its
 * group g = r >> k, which lie next to each other in the output (blocks g*2^k .. g*2^k + 2^k - 1):
 *   step 2k: send the group to the partner: at k = 0 r's own input, written to output block r
 *     on the way; later the group's blocks from the output;
 *   step 2k+1: receive the partner's group (g ^ 1) into its blocks of the output.
 * 2 log2(n) steps against the direct pattern's 2n-1; a receive waits only on the partner's send of
 * the same exchange, which follows only its own earlier exchanges: no deadlock. In place, output
 * block r is the input, and nothing writes it. */
GCOMM_HD void gcommStepAllGatherRecDbl(const gcommSched_t* s, const gcommRound_t* q,
                                       gcommStep_t* st) {
  int r = s->rank, k = (int)(q->t / 2), size = 1 << k;
  int group = (r >> k) ^ (int)(q->t % 2); /* the one sent, then the one received */
  size_t R = s->count;
  st->count = q->c * (size_t)size;
  st->dstOff = st->srcOff = (size_t)(group * size) * R;
  if (q->t % 2) {
    st->recvPeer[0] = r ^ size;
    st->dst = GCOMM_BUF_OUT;
  } else {
    st->sendPeer[0] = r ^ size;
    st->src = k == 0 ? GCOMM_BUF_IN : GCOMM_BUF_OUT;
    if (k == 0) st->srcOff = 0, st->dst = GCOMM_BUF_OUT;
  }
}

/* Dissemination AllGather (Bruck's) on any n, the whole block in one round (gcommGroupsFit).
 * Before exchange k (0 <= k < ceil(log2 n)) rank r holds the 2^k blocks r .. r + 2^k - 1 (mod n)
 * of its output; it sends the first m = min(2^k, n - 2^k) of them to r - 2^k and receives the m
 * blocks of r + 2^k (r + 2^k .. r + 2^k + m - 1) into its output, after which it holds 2^(k+1),
 * all n after the last. A range that passes block n - 1 goes on at block 0, so an exchange takes
 * four steps: the send of the range's part up to the end of the output, then of its part from
 * block 0, then the two receives alike. An empty part is a step that does nothing, on both sides
 * (the sender's range is the receiver's). At k = 0 the send is r's own input, written to output
 * block r on the way. ceil(log2 n) exchanges against the ring's n - 1 steps; a receive waits only
 * on the partner's send of the same exchange, which follows only its own earlier exchanges: no
 * deadlock. In place, output block r is the input, and nothing writes it. */
GCOMM_HD void gcommStepAllGatherBruck(const gcommSched_t* s, const gcommRound_t* q,
                                      gcommStep_t* st) {
  int n = s->nranks, r = s->rank, k = (int)(q->t / 4), part = (int)(q->t % 4), d = 1 << k;
  int m = d < n - d ? d : n - d, recv = part >= 2;
  int first = recv ? (r + d) % n : r, end = first + m; /* the range, before it wraps */
  int from = part % 2 == 0 ? first : 0;
  int blocks = part % 2 == 0 ? (end < n ? end : n) - first : (end > n ? end - n : 0);
  st->count = 0;
  if (blocks == 0) return;
  st->count = q->c * (size_t)blocks;
  st->dstOff = st->srcOff = (size_t)from * s->count;
  if (recv) {
    st->recvPeer[0] = first;
    st->dst = GCOMM_BUF_OUT;
  } else {
    st->sendPeer[0] = gcommMod(r - d, n);
    st->src = k == 0 ? GCOMM_BUF_IN : GCOMM_BUF_OUT;
    if (k == 0) st->srcOff = 0, st->dst = GCOMM_BUF_OUT;
  }
}

/* Ring ReduceScatter, ranks in a ring r -> r+1: at step t (0 <= t <= n-1) rank r works on block
 * k = (r - 1 - t) mod n. At t = 0 it sends block k of its input to r+1; at t > 0 it receives from
 * r-1 the partial result of block k, combines block k of its own input with it, and sends it on;
 * at t = n-1, k = r holds every rank's input: it goes to the output (the post-operation). */
GCOMM_HD void gcommStepReduceScatterRing(const gcommSched_t* s, const gcommRound_t* q,
                                         gcommStep_t* st) {
  int n = s->nranks, r = s->rank;
  long t = q->t;
  st->src = GCOMM_BUF_IN;
  st->srcOff = gcommMod(r - 1 - (int)t, n) * s->count + q->off;
  if (t > 0) {
    st->recvPeer[0] = gcommMod(r - 1, n);
    st->reduce = 1;
  }
  if (t < n - 1) {
    st->sendPeer[0] = (r + 1) % n;
  } else {
    st->dst = GCOMM_BUF_OUT;
    st->postOp = 1;
  }
}

/* Gather: every other rank sends its input to the root. The root writes its own input to output
 * block root (t = 0), then what rank root+t sent to output block root+t, t = 1 .. n-1. */
GCOMM_HD void gcommStepGather(const gcommSched_t* s, const gcommRound_t* q, gcommStep_t* st) {
  int r = s->rank, p = (r + (int)q->t) % s->nranks;
  if (r != s->root) {
    st->src = GCOMM_BUF_IN;
    st->sendPeer[0] = s->root;
    return;
  }
  if (q->t == 0)
    st->src = GCOMM_BUF_IN;
  else
    st->recvPeer[0] = p;
  st->dst = GCOMM_BUF_OUT;
  st->dstOff = p * s->count + q->off;
}

/* Scatter: the root sends input block p to each other rank p, in gcommDirectPeer's order, then
 * copies its own block to its output (step n-1); every other rank receives from the root. */
GCOMM_HD void gcommStepScatter(const gcommSched_t* s, const gcommRound_t* q, gcommStep_t* st) {
  int sending, p;
  if (s->rank != s->root) {
    st->recvPeer[0] = s->root;
    st->dst = GCOMM_BUF_OUT;
    return;
  }
  p = gcommDirectPeer(s->rank, s->nranks, q->t, &sending);
  st->src = GCOMM_BUF_IN;
  st->srcOff = p * s->count + q->off;
  if (sending)
    st->sendPeer[0] = p;
  else
    st->dst = GCOMM_BUF_OUT;
}

/* Part u (gcommBinParts) of the subtree of the root's child `child` in a binomial Gather or
 * Scatter: its range of the root's buffer (*off, *count, in elements); returns the child's rank. */
GCOMM_HD int gcommBinRootPart(const gcommSched_t* s, int child, int u, size_t* off, size_t* count) {
  int n = s->nranks, a = (s->root + child) % n, first = gcommBinFirstPart(child, s->root, n);
  *off = u == 0 ? (size_t)a * s->count : 0;
  *count = (size_t)(u == 0 ? first : gcommBinSize(child, n) - first) * s->count;
  return a;
}
/* The same part on the side of v (not the root): its range of v's scratch (the subtree in v
 * order); returns v's parent's rank. */
GCOMM_HD int gcommBinChildPart(const gcommSched_t* s, int v, int u, size_t* off, size_t* count) {
  int n = s->nranks, first = gcommBinFirstPart(v, s->root, n);
  *off = u == 0 ? 0 : (size_t)first * s->count;
  *count = (size_t)(u == 0 ? first : gcommBinSize(v, n) - first) * s->count;
  return (s->root + v - gcommBinSpan(v, n)) % n;
}

/* Binomial Gather (the whole block in one round, gcommGroupsFit): ceil(log2 n) levels where the
 * direct Gather's root takes n-1 receives. A rank with children copies its input to scratch block
 * 0 (t = 0), receives the subtree of child v + 2^i at scratch block 2^i (t = 1 + i, the smallest
 * first), and sends its subtree to its parent; a leaf sends its input. The root copies its input
 * to output block root and receives each child's subtree where it lies in the output. */
GCOMM_HD void gcommStepGatherBinomial(const gcommSched_t* s, const gcommRound_t* q,
                                      gcommStep_t* st) {
  int n = s->nranks, root = s->root, v = gcommMod(s->rank - root, n);
  int k = gcommBinChildren(v, n);
  long t = q->t;
  size_t R = s->count;
  st->count = R;
  if (v == 0) {
    st->dst = GCOMM_BUF_OUT;
    if (t == 0) {
      st->src = GCOMM_BUF_IN;
      st->dstOff = (size_t)root * R;
      return;
    }
    int i = 0, u = (int)t - 1;
    while (u >= gcommBinParts(1 << i, root, n)) u -= gcommBinParts(1 << i, root, n), i++;
    st->recvPeer[0] = gcommBinRootPart(s, 1 << i, u, &st->dstOff, &st->count);
    return;
  }
  if (k == 0 || t > k) { /* the subtree (a leaf: its input) to the parent */
    st->src = k == 0 ? GCOMM_BUF_IN : GCOMM_BUF_SCRATCH;
    st->sendPeer[0] = gcommBinChildPart(s, v, k == 0 ? 0 : (int)t - k - 1, &st->srcOff, &st->count);
    return;
  }
  st->dst = GCOMM_BUF_SCRATCH;
  if (t == 0) {
    st->src = GCOMM_BUF_IN;
    return;
  }
  int c = v + (1 << (t - 1));
  st->recvPeer[0] = (root + c) % n;
  st->dstOff = (size_t)(1 << (t - 1)) * R;
  st->count = (size_t)gcommBinSize(c, n) * R;
}

/* Binomial Scatter, the Gather's mirror: the root sends each child's subtree from where it lies in
 * its input (the largest first), then copies its own block; a rank with children receives its
 * subtree into scratch, sends child v + 2^i the blocks from scratch block 2^i (the largest first)
 * and copies its own block, scratch block 0, to its output; a leaf receives its block there. */
GCOMM_HD void gcommStepScatterBinomial(const gcommSched_t* s, const gcommRound_t* q,
                                       gcommStep_t* st) {
  int n = s->nranks, root = s->root, v = gcommMod(s->rank - root, n);
  int k = gcommBinChildren(v, n), parts = v == 0 ? 0 : gcommBinParts(v, root, n);
  long t = q->t, last = gcommBinSteps(s) - 1;
  size_t R = s->count;
  st->count = R;
  if (t == last && (v == 0 || k > 0)) { /* its own block to the output */
    st->src = v == 0 ? GCOMM_BUF_IN : GCOMM_BUF_SCRATCH;
    st->srcOff = v == 0 ? (size_t)root * R : 0;
    st->dst = GCOMM_BUF_OUT;
    return;
  }
  if (t < parts) { /* the subtree (a leaf: its block) from the parent */
    st->dst = k == 0 ? GCOMM_BUF_OUT : GCOMM_BUF_SCRATCH;
    st->recvPeer[0] = gcommBinChildPart(s, v, (int)t, &st->dstOff, &st->count);
    return;
  }
  int i = k - 1, u = (int)(t - parts);
  if (v == 0) {
    while (u >= gcommBinParts(1 << i, root, n)) u -= gcommBinParts(1 << i, root, n), i--;
    st->src = GCOMM_BUF_IN;
    st->sendPeer[0] = gcommBinRootPart(s, 1 << i, u, &st->srcOff, &st->count);
    return;
  }
  i -= u;
  st->src = GCOMM_BUF_SCRATCH;
  st->srcOff = (size_t)(1 << i) * R;
  st->count = (size_t)gcommBinSize(v + (1 << i), n) * R;
  st->sendPeer[0] = (root + v + (1 << i)) % n;
}

/* Step number `step` (0 <= step < gcommSchedNumSteps) of this rank. Send and Recv move their
 * chunks one a step to or from the peer; on one rank every collective is a copy. */
GCOMM_HD void gcommSchedGetStep(const gcommSched_t* s, long step, gcommStep_t* st) {
  int n = s->nranks, r = s->rank, algo = gcommSchedChannelAlgo(s);
  gcommRound_t q;
  gcommSchedRound(s, step, &q);
  gcommStepInit(st);
  st->count = q.c;
  st->srcOff = st->dstOff = q.off;
  if (s->func == gcommFuncSend) {
    st->src = GCOMM_BUF_IN;
    st->sendPeer[0] = s->peer;
    return;
  }
  if (s->func == gcommFuncRecv) {
    st->dst = GCOMM_BUF_OUT;
    st->recvPeer[0] = s->peer;
    return;
  }
  if (s->func == gcommFuncCopy || n == 1) {
    st->src = GCOMM_BUF_IN;
    st->dst = GCOMM_BUF_OUT;
    return;
  }
  switch (s->func) {
    case gcommFuncAllReduce:
      if (algo == gcommAlgoRing)
        gcommStepAllReduceRing(s, &q, st);
      else if (algo == gcommAlgoTree)
        gcommStepAllReduceTree(s, &q, st);
      else if (algo == gcommAlgoTwoShot)
        gcommStepAllReduceTwoShot(s, &q, st);
      else if (GCOMM_SCHED_HOST_ALGOS && algo == gcommAlgoRecDbl)
        gcommStepAllReduceRecDbl(s, &q, st);
      else
        gcommStepAllReduceOneShot(s, &q, st);
      return;
    case gcommFuncBroadcast:
      if (algo == gcommAlgoTree)
        gcommTreeDown(r, n, s->root, GCOMM_BUF_IN, st);
      else if (algo == gcommAlgoRing)
        gcommStepBroadcastChain(s, st);
      else
        gcommStepBroadcastDirect(s, &q, st);
      return;
    case gcommFuncReduce:
      if (algo == gcommAlgoTree)
        gcommTreeUp(r, n, s->root, st);
      else if (algo == gcommAlgoRing)
        gcommStepReduceChain(s, st);
      else
        gcommStepReduceDirect(s, &q, st);
      return;
    case gcommFuncAllGather: /* direct: every rank sends the same block to all */
      if (algo == gcommAlgoRing)
        gcommStepAllGatherRing(s, &q, st);
      else if (GCOMM_SCHED_HOST_ALGOS && algo == gcommAlgoRecDbl && gcommIsPow2(n))
        gcommStepAllGatherRecDbl(s, &q, st);
      else if (GCOMM_SCHED_HOST_ALGOS && algo == gcommAlgoRecDbl)
        gcommStepAllGatherBruck(s, &q, st);
      else
        gcommDirectExchange(r, n, q.t, 0, s->count, q.off, st);
      return;
    case gcommFuncReduceScatter: /* direct: each rank reduces its own block */
      if (algo == gcommAlgoRing)
        gcommStepReduceScatterRing(s, &q, st);
      else if (s->fan)
        gcommFanReduce(q.off, s->count, (size_t)-1, q.c, st);
      else
        gcommDirectReduce(r, n, q.t, s->count, q.off, st);
      return;
    case gcommFuncAllToAll: /* direct: block p of the input to rank p */
      gcommDirectExchange(r, n, q.t, s->count, s->count, q.off, st);
      return;
    case gcommFuncGather:
      if (GCOMM_SCHED_HOST_ALGOS && algo == gcommAlgoTree)
        gcommStepGatherBinomial(s, &q, st);
      else
        gcommStepGather(s, &q, st);
      return;
    case gcommFuncScatter:
      if (GCOMM_SCHED_HOST_ALGOS && algo == gcommAlgoTree)
        gcommStepScatterBinomial(s, &q, st);
      else
        gcommStepScatter(s, &q, st);
      return;
  }
}

#endif /* GCOMM_SCHED_H */
