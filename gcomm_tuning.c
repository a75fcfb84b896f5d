/*
 * gcomm_tuning.c - the cost model: time = hops * alpha + bytes * dataFactor / bandwidth, per
 * algorithm; it picks each call's algorithm, protocol and channel count.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>

#include "gcomm_core.h"

/* Measured on host shared memory (docs/PERF.md): a hop is one FIFO slot handed from one rank
 * to the next; bandwidth is what one rank's copy/reduce loops move. */
#define HOST_ALPHA_US 2.0
#define HOST_BW_BYTES_PER_US 4000.0
#define NET_ONESHOT_MAX_BYTES (256u << 10)
/* One node's host thresholds (hostNodeAlgo) */
#define HOST_RECDBL_AR_MAX_BYTES (8u << 10)
#define HOST_ONESHOT_MAX_COPIES (6u << 10)
#define HOST_TWOSHOT_MAX_BYTES (16u << 10)
#define HOST_TREE_MAX_BYTES (256u << 10)
#define HOST_RECDBL_MAX_BYTES (128u << 10)
#define HOST_DIRECT_RS_MAX_BYTES (16u << 10)
#define HOST_BINOMIAL_MIN_RANKS 8
#define HOST_BINOMIAL_MAX_BYTES (128u << 10)
/* GPU reductions that take fan steps up to this size (a quarter of it on 2 ranks: gcommChooseAlgo)
 */
#define GPU_FAN_MAX_BYTES (512u << 10)
/* and Simple fan steps in these ranges (simpleFanAlgo) */
#define GPU_SIMPLE_FAN_MIN_BYTES (1u << 20)
#define GPU_SIMPLE_FAN_PAIR_RS_MIN_BYTES (2u << 20)
#define GPU_SIMPLE_FAN_PAIR_AR_MAX_BYTES (8u << 20)
#define GPU_SIMPLE_FAN_MAX_BYTES (32u << 20)

/* An algorithm's two cost terms: FIFO hops one after another, and bytes each rank moves per byte
 * of `bytes`, the size nccl-tests reports (the whole buffer; AllGather: the output;
 * ReduceScatter: the input). Returns 0 when func has no such algorithm. */
static int costTerms(int func, int algo, int n, double* hops, double* data) {
  if (gcommSchedAlgo(func, algo) != algo) return 0;
  switch (func) {
    case gcommFuncAllReduce:
      *hops = algo == gcommAlgoRing ? 2 * (n - 1) : algo == gcommAlgoTree ? 2 * gcommLog2(n) : 2;
      *data = algo == gcommAlgoRing || algo == gcommAlgoTwoShot ? 4.0 * (n - 1) / n
              : algo == gcommAlgoTree                           ? 4
                                                                : 2.0 * (n - 1);
      break;
    case gcommFuncBroadcast:
    case gcommFuncReduce:
      *hops = algo == gcommAlgoRing ? n - 1 : algo == gcommAlgoTree ? gcommLog2(n) : 1;
      *data = algo == gcommAlgoRing ? 2 : algo == gcommAlgoTree ? 3 : n - 1;
      break;
    case gcommFuncAllGather:
    case gcommFuncReduceScatter:
      *hops = algo == gcommAlgoRing ? n - 1 : algo == gcommAlgoRecDbl ? gcommLog2(n) : 1;
      *data = (algo == gcommAlgoRing ? 2.0 : 3.0) * (n - 1) / n;
      break;
    case gcommFuncSend:
    case gcommFuncRecv:
    case gcommFuncCopy:
      /* the send and the receive run in blocks of their own, at once; a part's copy of the rank's
       * own block costs as its sends do, so that a call of equal parts takes one protocol (a
       * launch mixing LL and Simple runs the slower kernel: all-to-all 512 KB on 4 H100s, 16.4 us
       * against 10.3) */
      *hops = 1, *data = 1;
      break;
    default:
      *hops = 1, *data = 2.0 * (n - 1) / n;
  }
  if (n == 1) *hops = 0, *data = 1;
  return 1;
}

static double predictUs(int func, int algo, int n, double bytes) {
  double hops, data;
  if (!costTerms(func, algo, n, &hops, &data)) return -1;
  return hops * HOST_ALPHA_US + bytes * data / HOST_BW_BYTES_PER_US;
}

#ifdef GCOMM_GPU
/* GPU communicators, per protocol, fitted to GCOMM_PROTO-forced sweeps on 2 H200s and 2 H100s
 * over NVLink (docs/PERF.md): the cost of one FIFO hop (launch included), what one block (a
 * channel) moves per microsecond in a collective and in a send or a receive, and the link's cap.
 * LL saves ~3 us a hop (its launches run the LL-only kernel, and a line needs no fence) but moves
 * data at ~3/4 of Simple's rate (half of every line is flags), so it pays up to ~1-2 MB on 2 GPUs,
 * spread over up to 32 channels. An LL send or receive block moves less than a collective's
 * (send/recv and all-to-all on 2 H100s: LL ahead at 512 KB a peer, 11.1 us against Simple's 12.8,
 * behind at 1 MB, 15.2 against 13.9). */
static const struct {
  double hopUs, blockBytesPerUs, p2pBlockBytesPerUs, linkBytesPerUs;
} gpuCost[gcommNumProtos] = {
    {5.9, 20000, 20000, 340000}, /* Simple: payload, one release per post */
    {2.7, 20000, 8500, 260000},  /* LL: flags in the data */
};

static double predictGpuUs(int func, int algo, int proto, int n, double bytes, int nch) {
  double hops, data;
  if (!costTerms(func, algo, n, &hops, &data)) return -1;
  double bw = nch * (gcommIsPointToPoint(func) ? gpuCost[proto].p2pBlockBytesPerUs
                                               : gpuCost[proto].blockBytesPerUs);
  if (bw > gpuCost[proto].linkBytesPerUs) bw = gpuCost[proto].linkBytesPerUs;
  return hops * gpuCost[proto].hopUs + bytes * data / bw;
}
#endif

/* Host communicators of 3 or more ranks on one node: the algorithm measured fastest, where the
 * model's one hop cost misjudges them all (a step's cost depends on how many run at once): 4, 8 and
 * 16 ranks, a core each on 32 cores, every algorithm forced beside MPICH in gcomm_perf's turns,
 * the faster of 2 runs (docs/TUNING.md). -1: the model decides (two ranks, where every
 * algorithm is one hop; GPUs; several nodes; the other functions).
 * - AllReduce: from 4 ranks, recursive doubling up to 8 KB (log2(n) exchanges: 16 ranks, 8 B 2.0
 *   us against the one-shot's 4.5-4.9, 2 KB 5.6-5.9 against 11.5-13.5; 30 ranks, 8 B 3.0-3.2
 *   against 7.9-8.9, 8 KB 16.0-18.4 against 30.2-30.5; 4 ranks, 2 KB 2.5-2.7 against 3.4-3.6; at
 *   16 KB slower on 5-8 ranks, 12.8-15.6 against 9.7-12.7; on 3 ranks slower at every size, 64 B
 *   1.8 against 1.3); then, and on 3 ranks, the one-shot while its n-1 copies of bytes stay
 *   within 6 KB (16 ranks, 128 B: 6.7 us against the two-shot's 8.4; 512 B: 9.7 against 8.3);
 *   the two-shot up to 16 KB (16 ranks, 8 KB: 16.3 us against the ring's 24.4 and the one-shot's
 *   42.5; 4 KB, run beside the model's one-shot: 15.4-17.4 against 23.6-27.6); the ring beyond,
 *   where the two-shot's time varies from run to run (16 ranks, 128 KB: 90-320 us; the ring
 *   82-112).
 * - Broadcast, Reduce: the ring, each of whose ranks makes one receive and one send whatever n and
 *   whose calls overlap one another; from 9 ranks the tree up to 256 KB, whose log2(n) levels
 *   beat the ring's n-1 hops (16 ranks: broadcast 8 B 0.70 us against 0.81, 128 KB 61.7 against
 *   65.7; reduce 128 KB 36.0 against 54.8; 2 MB: the ring, 465 against 579). Never the direct
 *   form, whose root makes n-1 sends or receives one after another (16 ranks, broadcast 8 B:
 *   2.6 us).
 * - AllGather: recursive doubling on 4, 8, 16, ... ranks up to 128 KB in all (16 ranks, 2 KB: 4.8
 *   us against the direct exchange's 8.1 and the ring's 11.2), and its dissemination form on the
 *   other counts from 9 ranks (medians of 3 runs, 30 ranks, 4 KB: 6.5 us against the model's
 *   13.6, 64 KB: 24.8 against 33.0; 12 ranks, 1 KB: 3.9 against 5.6; 10 ranks level; 3 ranks
 *   slower, 1.4 us against 1.1); beyond, the model (the direct exchange and the ring were level
 *   within the runs' spread).
 * - ReduceScatter: the direct exchange up to 16 KB (16 ranks, 8 KB: 8.8 us against the ring's
 *   11.6), the ring beyond (32 KB, beside the model's direct exchange: 21.0-23.8 us against
 *   31.1-32.2; 2 MB: 440 against 764).
 * - Gather, Scatter: from 8 ranks the binomial tree up to 128 KB in all, whose root takes
 *   ceil(log2 n) messages where the direct form's takes n-1 (medians of 3 runs, 16 ranks: gather
 *   2 KB 2.1 us against 3.1, scatter 32 KB 4.7 against 6.5; 8 ranks, 8 KB: gather 2.0 against
 *   2.5, scatter 2.4 against 3.4; at 4 and 6 ranks mixed); beyond, and on fewer ranks, the direct
 *   form. */
static int hostNodeAlgo(gcommComm_t comm, int func, size_t bytes) {
  int n = comm->nranks;
  if (comm->device >= 0 || comm->nLocal < n || n <= 2) return -1;
  switch (func) {
    case gcommFuncAllReduce:
      return n >= 4 && bytes <= HOST_RECDBL_AR_MAX_BYTES          ? gcommAlgoRecDbl
             : bytes * (size_t)(n - 1) <= HOST_ONESHOT_MAX_COPIES ? gcommAlgoDirect
             : bytes <= HOST_TWOSHOT_MAX_BYTES                    ? gcommAlgoTwoShot
                                                                  : gcommAlgoRing;
    case gcommFuncBroadcast:
    case gcommFuncReduce:
      return n > 8 && bytes <= HOST_TREE_MAX_BYTES ? gcommAlgoTree : gcommAlgoRing;
    case gcommFuncAllGather:
      return (gcommIsPow2(n) || n > 8) && bytes <= HOST_RECDBL_MAX_BYTES ? gcommAlgoRecDbl : -1;
    case gcommFuncReduceScatter:
      return bytes <= HOST_DIRECT_RS_MAX_BYTES ? gcommAlgoDirect : gcommAlgoRing;
    case gcommFuncGather:
    case gcommFuncScatter:
      return n >= HOST_BINOMIAL_MIN_RANKS && bytes <= HOST_BINOMIAL_MAX_BYTES ? gcommAlgoTree : -1;
    default:
      return -1;
  }
}

#ifdef GCOMM_GPU
/* The fan reduction that Simple steps run fastest at this size, or -1 (nccl-tests with graphs,
 * every algorithm forced beside the default, docs/PERF.md). 4 H200: the two-shot all-reduce from
 * 1 MB (20.9 us against the ring's 22.2; 4 MB 37.5 against 50.9, 32 MB 175.6 against 179.5) and
 * the direct reduce-scatter (1 MB 12.2 against 13.7, 4 MB 21.3 against 30.1, 32 MB 97.0 against
 * 114.2); below 1 MB LL's fans are faster (all-reduce 512 KB 17.1 against 19.2). 2 H200: the
 * one-shot all-reduce from 1 MB to 8 MB (4 MB 26.6 against the ring's 32.4, 8 MB 45.7 against
 * 46.1; 16 MB 88.2 against 75.7), the direct reduce-scatter from 2 MB (15.1 against 17.1, 32 MB
 * 76.5 against 87.0; 1 MB level). Measured up to 32 MB: beyond, the ring. Not where GCOMM_PROTO
 * forces LL. */
static int simpleFanAlgo(gcommComm_t comm, int func, size_t bytes) {
  int pair = comm->nranks == 2, algo;
  if (func == gcommFuncAllReduce)
    algo = pair ? gcommAlgoDirect : gcommAlgoTwoShot;
  else if (func == gcommFuncReduceScatter)
    algo = gcommAlgoDirect;
  else
    return -1;
  if (comm->params.proto == gcommProtoLL || !gcommChooseFan(comm, func, algo, gcommProtoSimple))
    return -1;
  size_t lo = pair && func == gcommFuncReduceScatter ? GPU_SIMPLE_FAN_PAIR_RS_MIN_BYTES
                                                     : GPU_SIMPLE_FAN_MIN_BYTES;
  size_t hi = pair && func == gcommFuncAllReduce ? GPU_SIMPLE_FAN_PAIR_AR_MAX_BYTES
                                                 : GPU_SIMPLE_FAN_MAX_BYTES;
  return bytes >= lo && bytes <= hi ? algo : -1;
}
#endif

int gcommChooseAlgo(gcommComm_t comm, int func, size_t bytes) {
#ifdef GCOMM_GPU
  /* recursive doubling and the binomial Gather and Scatter are not in the kernels
   * (gcomm_sched.h): forced, a GPU one runs direct */
  if (comm->device >= 0 && comm->params.algo >= 0 &&
      gcommSchedHostOnly(func, gcommSchedAlgo(func, comm->params.algo)))
    return gcommSchedAlgo(func, gcommAlgoDirect);
#endif
  if (comm->params.algo >= 0) return gcommSchedAlgo(func, comm->params.algo);
#ifdef GCOMM_GPU
  /* GPUs (docs/PERF.md): the one-shot all-reduce (one hop) wins while each rank's (n-1) copies
   * stay small, up to 2 MB of them with Simple, 384 KB with LL (2 H200: LL's ring is faster at
   * 512 KB, 9.8 us against 10.6, and 2 MB, 21.9 against 26.2; 4 H100, nccl-tests with graphs, the
   * one-shot ahead at 128 KB, 384 KB of copies: 12.4 us against the ring's 16.3, behind at 512
   * KB: 23.9 against 18.4). Beyond, up to GPU_FAN_MAX_BYTES, the two-shot all-reduce and the
   * direct reduce-scatter where they take fan steps (nccl-tests with graphs, 4 H200: all-reduce
   * 512 KB 16.1 us against the ring's 19.1, reduce-scatter 32 B-512 KB 5.0-9.2 against 7.7-11.8,
   * at 2 MB the ring is faster: 29.2 against 42.9, 18.6 against 23.1; 2 H200, where the ring is
   * two steps: reduce-scatter 128 KB 5.5 against 6.2, 512 KB 8.2 against 7.7, the two-shot
   * all-reduce 512 KB 13.8 against 10.2). Elsewhere the ring. */
  if (comm->device >= 0) {
    int simpleFan = simpleFanAlgo(comm, func, bytes);
    if (simpleFan >= 0) return simpleFan;
    int ll = gcommChooseProto(comm, func, gcommAlgoRing, bytes, 0) == gcommProtoLL;
    size_t copies = bytes * (size_t)(comm->nranks - 1);
    if (func == gcommFuncAllReduce && copies <= (ll ? 384u << 10 : 2u << 20))
      return gcommAlgoDirect;
    int pair = comm->nranks == 2;
    int fanAlgo = func == gcommFuncAllReduce ? gcommAlgoTwoShot : gcommAlgoDirect;
    int fans = gcommChooseFan(comm, func, fanAlgo, gcommChooseProto(comm, func, fanAlgo, bytes, 0));
    if (fans && !(pair && fanAlgo == gcommAlgoTwoShot) &&
        bytes <= (pair ? GPU_FAN_MAX_BYTES / 4 : GPU_FAN_MAX_BYTES))
      return fanAlgo;
    return gcommSchedAlgo(func, gcommAlgoRing);
  }
#endif
  /* Between nodes (libfabric tcp, docs/PERF.md) the one-shot all-reduce takes one network hop
   * against the ring's 2(n-1), and wins while each rank's (n-1) copies stay small; larger, its
   * chunks go one at a time (each sent, then the peer's awaited and reduced) and the ring, which
   * moves half as much through each rank's copy loops, is faster (measured: even at 256 KB on
   * 2 ranks, ahead below, behind from 1 MB). */
  if (comm->nLocal < comm->nranks && func == gcommFuncAllReduce)
    return bytes * (size_t)(comm->nranks - 1) <= NET_ONESHOT_MAX_BYTES ? gcommAlgoDirect
                                                                       : gcommAlgoRing;
  int measured = hostNodeAlgo(comm, func, bytes);
  if (measured >= 0) return measured;
  int best = gcommSchedAlgo(func, gcommAlgoRing);
  double bestUs = predictUs(func, best, comm->nranks, (double)bytes);
  for (int a = 0; a < gcommNumAlgos; a++) {
    double us = predictUs(func, a, comm->nranks, (double)bytes);
    /* the two-shot, recursive doubling and the binomial Gather and Scatter were measured in one
     * node only (hostNodeAlgo), the tree all-reduce runs far slower than its hops say (above):
     * the model never takes them */
    int forcedOnly = a == gcommAlgoTwoShot || gcommSchedHostOnly(func, a) ||
                     (func == gcommFuncAllReduce && a == gcommAlgoTree);
    if (us >= 0 && us < bestUs && !forcedOnly) best = a, bestUs = us;
  }
  return best;
}

/* Whether an AllGather, AllToAll, Gather or Scatter moves as point-to-point parts (gcommCollParts:
 * a send and a receive a pair, the copy of the rank's own block, each in blocks of its own, all at
 * once) instead of its schedule, whose channels run a rank's steps one after another: the ring's
 * n-1 hops, or the root's n-1 receives (sends). On GPUs whose kernels move every FIFO (nccl-tests
 * with graphs, docs/PERF.md: 4 H100, gather 8 B 3.2 us against 7.7, all-gather 8 B 4.2 against
 * 8.4; 2 H100, all-to-all 2 MB 14.0 against 18.6). AllGather from 3 ranks: with 2 the ring is one
 * hop already, and its channels move 512 KB faster than a part's share (2 H100: 7.4 against 9.3
 * us). The host's copy loops gain nothing from parts (all-to-all, 16 ranks on 32 cores: level or
 * behind). An AllToAll out of place only: in place the schedule's sends come first in each
 * channel, so a block is read before the peer's lands on it; in place must then be every rank's
 * choice or none, as MPI_IN_PLACE is (gcomm.h). */
int gcommByParts(gcommComm_t comm, const gcommOp_t* args) {
#ifdef GCOMM_GPU
  int func = args->func, n = comm->nranks;
  int fits = func == gcommFuncGather || func == gcommFuncScatter ||
             (func == gcommFuncAllGather && n > 2) ||
             (func == gcommFuncAllToAll && args->sendbuff != args->recvbuff);
  return fits && comm->device >= 0 && n > 1 && !hasGpuProxy(comm) && !comm->sharedCopy;
#else
  (void)comm, (void)args;
  return 0;
#endif
}

/* The direct path (gcomm_gpu_direct.c) meets every peer before and after the data (back-to-back
 * captured calls: after it only), where LL's lines carry their own flags: it pays once the data
 * outweighs that. One H200 shared by 2 and 4 ranks under MPS, nccl-tests with graphs
 * (docs/PERF.md): all-reduce, reduce-scatter, all-gather and all-to-all were faster from 32 KB on
 * both (4 ranks, 32 KB: 6.6-7.9 us against 8.5-9.8), broadcast, reduce, gather and scatter from
 * 128 KB (4 ranks: level to 1.3x; at 32 KB 0.3-0.6 us slower); 1.2-3.9x from 512 KB.
 * Small sizes keep LL, whose 8-byte all-reduce on NVLink (4.0 us on 2 H200) the direct path has not
 * been measured against. GCOMM_GRAPH_REGISTER=2: every size. */
int gcommDirectPays(gcommComm_t comm, int func, size_t bytes) {
  int fits = func >= gcommFuncAllReduce && func <= gcommFuncScatter; /* not the vector forms */
  int exchange = func == gcommFuncAllReduce || func == gcommFuncReduceScatter ||
                 func == gcommFuncAllGather || func == gcommFuncAllToAll;
  if (!fits || comm->params.graphRegister == 0) return 0;
  return comm->params.graphRegister == 2 || bytes >= (exchange ? 32 : 128) * (size_t)1024;
}

/* Channels pay off once each gets a few slots of data: one per perChannel bytes, at most the
 * collective channels (or the point-to-point channels for a Send/Recv). For a Send/Recv, bytes is
 * count * type size: sender and receiver derive the same number, so their slices meet on the
 * same lanes. A part of a call of nParts parts (gcommSubmitParts; 0: a call of its own) takes
 * its share of the call's one launch on a GPU: with LL of a medium launch (1 block an SM, whose
 * launch costs half the large one's: all-to-all 128 KB with plain launches on 2 H100s, 9.3-10.0
 * us against 13.5), else of the blocks the rank may run; every rank derives the same share. */
int gcommChooseChannels(gcommComm_t comm, int func, size_t bytes, int proto, int nParts) {
  int isP2p = gcommIsPointToPoint(func);
  size_t maxCh = (size_t)(isP2p ? comm->nP2pChannels : comm->nChannels);
  size_t nc = bytes / (4 * comm->slotBytes);
#ifdef GCOMM_GPU
  /* a block per channel: up to 32 from 32 KB each; beyond 32 only once each gets 64 KB, beyond
   * 64 once each gets 256 KB (nccl-tests with graphs, docs/PERF.md: 64 blocks at 4 MB instead of
   * 32 took 2 H100's all-reduce from 35.7 to 34.0 us, reduce-scatter from 26.8 to 23.2 and reduce
   * from 27.9 to 19.5, 4 H100's level; 128 at 32 MB instead of 64, medians of 3 runs on 4 H200:
   * reduce-scatter 121.2 -> 115.1, reduce 129.0 -> 118.4, all-to-all 111.8 -> 106.3, the rest
   * within 1%; 2 H100's reduce-scatter 104.5 -> 95.9; more blocks made 2 MB slower) */
  if (comm->device >= 0) {
    size_t few = bytes / (32 * 1024), many = bytes / (64 * 1024), most = bytes / (256 * 1024);
    nc = most > 64 ? most : many > 64 ? 64 : many > 32 ? many : few < 32 ? few : 32;
    /* LL: a block moves ~20 GB/s of payload (half of each line is flags), so an LL operation
     * spreads from 4 KB a channel (faster than 8 or 16 KB from 32 KB to 256 KB: docs/PERF.md), up
     * to the works of one medium launch, 1 block an SM (a small launch's where ranks sharing the
     * GPU leave no room for it) */
    if (proto == gcommProtoLL) {
      /* a Send/Recv takes half: the usual group of one send and one receive fits one launch */
      size_t most = comm->mediumKernel ? GCOMM_DEV_MEDIUM_WORKS : GCOMM_DEV_SMALL_WORKS;
      size_t cap = isP2p ? most / 2 : most;
      nc = bytes / (4 * 1024) < cap ? bytes / (4 * 1024) : cap;
    }
    if (nParts > 0) {
      int launch =
          proto == gcommProtoLL && comm->mediumKernel ? GCOMM_DEV_MEDIUM_WORKS : comm->blockBudget;
      size_t share = launch / nParts > 1 ? (size_t)(launch / nParts) : 1;
      if (nc > share) nc = share;
    }
  }
#else
  (void)proto, (void)nParts;
#endif
  return nc < 1 ? 1 : nc > maxCh ? (int)maxCh : (int)nc;
}

/* Host communicators always use Simple; GPU communicators the faster by the model (with the
 * channels each protocol would get: nParts as for gcommChooseChannels), except with a proxy
 * (between nodes, copy engines): LL's flags travel in the data, which the proxy moves keyed on a
 * tail LL does not publish (a forced GCOMM_PROTO=ll warned at init). */
int gcommChooseProto(gcommComm_t comm, int func, int algo, size_t bytes, int nParts) {
  if (comm->device < 0 || spansNodes(comm) || copiesByEngine(comm)) return gcommProtoSimple;
  if (comm->params.proto >= 0) return comm->params.proto;
#ifdef GCOMM_GPU
  if (simpleFanAlgo(comm, func, bytes) == algo) return gcommProtoSimple;
  double us[gcommNumProtos];
  for (int p = 0; p < gcommNumProtos; p++)
    us[p] = predictGpuUs(func, algo, p, comm->nranks, (double)bytes,
                         gcommChooseChannels(comm, func, bytes, p, nParts));
  if (us[gcommProtoLL] < us[gcommProtoSimple]) return gcommProtoLL;
#else
  (void)func, (void)algo, (void)bytes, (void)nParts;
#endif
  return gcommProtoSimple;
}

/* The most bytes a step of func moves when a channel's share is share bytes: a slot's payload,
 * except a GPU Send/Recv of its own (nParts 0) on one node, whose Simple steps are a quarter of
 * the share, between a quarter slot (128 KB at the default GCOMM_BUFFSIZE) and a whole one: a
 * channel then moves in at least four steps, the sender's writes of one overlapping the receiver's
 * copy of the one before, where whole slots made a channel's share one step up to 32 MB (2 H100,
 * nccl-tests send/recv with graphs: 16 MB 67.2 -> 62.3 us, 32 MB 129.2 -> 110.6, 64 MB 212.6 ->
 * 202.3, 128-256 MB level; NCCL 61.1, 109.6, 201.6; docs/PERF.md). Quarter slots at every size
 * made 256 MB slower, 755 -> 764 us: its 32 steps a channel each pay a step's cost. Every rank
 * derives the same size for both ends of a pair. The parts of a vector collective keep whole
 * slots: all-to-all with quarter slots was faster at 16-32 MB and slower at 64-128 MB. */
size_t gcommChooseStepBytes(gcommComm_t comm, int func, int proto, int nParts, size_t share) {
  if (proto == gcommProtoLL) return GCOMM_LL_SLOT_PAYLOAD;
  int gpuPair = comm->device >= 0 && gcommIsPointToPoint(func) && func != gcommFuncCopy &&
                nParts == 0 && !spansNodes(comm) && !copiesByEngine(comm);
  size_t slot = comm->slotBytes, quarter = share / 4;
  if (!gpuPair || quarter >= slot) return slot;
  return quarter > slot / 4 ? quarter : slot / 4;
}

/* Whether a GPU reduction takes fan steps (gcomm_sched.h: every other rank in one step): the
 * one-shot and two-shot all-reduce and the direct reduce-scatter, on up to GCOMM_FAN_MAX_RANKS
 * ranks. With LL a block's threads poll every peer's lines at once; with Simple each peer's slot
 * is handed over by its tail, which only the kernels' own FIFOs carry (not a proxy's), in a kernel
 * of their own (CUDA: the HIP build leaves it out, its compile the build's longest). Every rank
 * decides alike. */
int gcommChooseFan(gcommComm_t comm, int func, int algo, int proto) {
  int direct = algo == gcommAlgoDirect || (func == gcommFuncAllReduce && algo == gcommAlgoTwoShot);
  int reduction = func == gcommFuncAllReduce || func == gcommFuncReduceScatter;
#if defined(GCOMM_GPU) && !defined(GCOMM_HIP)
  int fifos = proto == gcommProtoLL || !hasGpuProxy(comm);
#else
  int fifos = proto == gcommProtoLL;
#endif
  return comm->device >= 0 && fifos && reduction && direct && comm->nranks <= GCOMM_FAN_MAX_RANKS;
}

void gcommTuningPrint(gcommComm_t comm) {
  if (comm->rank != 0 || !gcommLogEnabled(GCOMM_LOG_INFO, GCOMM_SUBSYS_TUNING)) return;
  for (int f = 0; f <= gcommFuncReduceScatter; f++) {
    for (double bytes = comm->device >= 0 ? 8 : 1024; bytes <= 1024.0 * 1024 * 1024; bytes *= 8) {
      char line[512] = "";
      int len = 0;
      size_t b = (size_t)bytes;
      int algo = gcommChooseAlgo(comm, f, b), proto = gcommChooseProto(comm, f, algo, b, 0);
      int nch = gcommChooseChannels(comm, f, b, proto, 0);
      int measured = comm->params.algo < 0 && hostNodeAlgo(comm, f, b) >= 0;
      for (int a = 0; a < gcommNumAlgos && !measured && len < (int)sizeof(line) - 64; a++) {
#ifdef GCOMM_GPU
        if (comm->device >= 0) {
          for (int p = 0; p < gcommNumProtos; p++) {
            double us =
                predictGpuUs(f, a, p, comm->nranks, bytes, gcommChooseChannels(comm, f, b, p, 0));
            if (us >= 0)
              len += snprintf(line + len, sizeof(line) - len, " %s/%s %.1f", gcommAlgoNames[a],
                              gcommProtoNames[p], us);
          }
          continue;
        }
#endif
        double us = predictUs(f, a, comm->nranks, bytes);
        if (us >= 0)
          len += snprintf(line + len, sizeof(line) - len, " %s %.1f", gcommAlgoNames[a], us);
      }
      GCOMM_INFO(GCOMM_SUBSYS_TUNING, comm, "%-13s %10.0f B: %s/%s, %d channel(s) (%s%s)",
                 gcommFuncNames[f], bytes, gcommAlgoNames[algo], gcommProtoNames[proto], nch,
                 measured ? "measured thresholds" : "model, us:", line);
    }
  }
}
