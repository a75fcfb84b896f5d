/*
 * gcomm_bootstrap.c - a communicator's setup over MPI: parameters agreed, nodes found, GPU
 * channels chosen, transports created and connected, every rank agreeing on each step's outcome.
 */
#define _GNU_SOURCE
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gcomm_core.h"

/* Every rank learns whether every rank succeeded, so that no rank waits in a later collective
 * step for a rank that has given up; and the ranks that succeeded learn why one failed (its
 * message: the cause, e.g. a full /dev/shm, at every rank). */
static gcommResult_t agreeOnResult(gcommComm_t comm, gcommResult_t mine, const char* what) {
  int* codes = malloc((size_t)comm->nranks * sizeof(int));
  if (codes == NULL) return GCOMM_ERROR(comm, gcommSystemError, -1, "out of memory");
  gcommResult_t res = gcommAllgather(comm, &(int){(int)mine}, sizeof(int), codes);
  int worst = 0; /* the highest code, the lowest rank among equals (MPI_MAXLOC's choice) */
  for (int r = 1; r < comm->nranks && res == gcommSuccess; r++)
    if (codes[r] > codes[worst]) worst = r;
  int failed = res == gcommSuccess && codes[worst] != gcommSuccess;
  free(codes);
  if (!failed) return res;
  enum { WHY = 512 };
  char* whys = malloc((size_t)comm->nranks * WHY);
  if (whys == NULL) return GCOMM_ERROR(comm, gcommSystemError, -1, "out of memory");
  char why[WHY];
  pthread_mutex_lock(&comm->errorLock);
  snprintf(why, sizeof(why), "%.*s", WHY - 1, comm->lastError);
  pthread_mutex_unlock(&comm->errorLock);
  res = gcommAllgather(comm, why, WHY, whys);
  if (res == gcommSuccess) memcpy(why, whys + (size_t)worst * WHY, WHY);
  free(whys);
  if (res != gcommSuccess || mine != gcommSuccess) return mine != gcommSuccess ? mine : res;
  return GCOMM_ERROR(comm, gcommRemoteError, worst, "rank %d failed during %s: %s", worst, what,
                     why);
}

/* Which ranks share a node: MPI_COMM_TYPE_SHARED, or GCOMM_HOSTID when set, so that one machine
 * can pretend to be several nodes. The node's id is its first rank. */
static gcommResult_t detectNode(gcommComm_t comm, uint64_t* hostId) {
  MPI_Comm node;
  int leader = comm->rank;
  if (comm->boot != NULL) { /* shrunk: the parent knew the nodes; this one's lowest rank names it */
    const struct gcommBoot* b = comm->boot;
    const gcommCard_t* cards = b->pages->cards;
    uint64_t mine = cards[b->pageRank[comm->rank]].hostId;
    comm->nLocal = 0;
    for (int r = comm->nranks - 1; r >= 0; r--)
      if (cards[b->pageRank[r]].hostId == mine) leader = r, comm->nLocal++;
    *hostId = (uint64_t)leader;
    return gcommSuccess;
  }
  if (comm->params.hostId != NULL)
    MPI_CHECK(comm, MPI_Comm_split(comm->mpiComm,
                                   (int)(gcommHashString(comm->params.hostId) & 0x7fffffff),
                                   comm->rank, &node));
  else
    MPI_CHECK(comm, MPI_Comm_split_type(comm->mpiComm, MPI_COMM_TYPE_SHARED, comm->rank,
                                        MPI_INFO_NULL, &node));
  MPI_CHECK(comm, MPI_Bcast(&leader, 1, MPI_INT, 0, node));
  MPI_CHECK(comm, MPI_Comm_size(node, &comm->nLocal));
  MPI_Comm_free(&node);
  *hostId = (uint64_t)leader;
  return gcommSuccess;
}

/* GPU communicators whose ranks span nodes: channels by default (GCOMM_NCHANNELS). Each lane
 * to a remote rank pins a send and a receive FIFO of host memory: with 4 MB FIFOs, 4 collective
 * and 4 point-to-point lanes, 64 MB per remote rank (32 channels would pin 512 MB). */
#define GPU_NET_CHANNELS 4
/* GCOMM_P2P_DISABLE: PCIe, not the blocks, sets the pace; GCOMM_P2P_USE_CUDA_MEMCPY: the copy
 * engines and the proxy do (each lane to a local peer adds a staging FIFO in GPU memory: with 16
 * channels, 16 point-to-point lanes and 4 MB FIFOs, 128 MB a peer) */
#define GPU_STAGED_CHANNELS 16

#ifdef GCOMM_GPU
/* One rank's GPU, as gpuDefaultChannels gathers it: ranks sharing a GPU have the same node and
 * PCI address. */
typedef struct {
  uint64_t node, pci;
  int64_t sms; /* -1: a host communicator's rank */
  int64_t mps; /* the rank reaches its GPU through MPS */
} gpuOfRank_t;

static int gpuOfRankCompare(const void* a, const void* b) {
  const gpuOfRank_t *x = a, *y = b;
  if (x->node != y->node) return x->node < y->node ? -1 : 1;
  return x->pci < y->pci ? -1 : x->pci > y->pci;
}

/* Ranks that share a GPU without MPS time-slice it: a kernel waiting for a peer's kernel holds
 * the GPU for its whole slice, and each operation takes milliseconds whatever its size. Said once
 * per process (rank 0 of the first such communicator), with what to do about it; GCOMM_DEBUG=INFO
 * shows every communicator's finding. */
static void noteGpuSharing(gcommComm_t comm, int sharing, int sharingNoMps) {
  static int warned;
  if (comm->device < 0) return;
  GCOMM_INFO(GCOMM_SUBSYS_INIT, comm,
             "GPU sharing: up to %d ranks of this communicator on one GPU; this rank %s MPS%s",
             sharing, comm->deviceMps ? "runs under" : "does not run under",
             sharingNoMps ? ": ranks share a GPU without MPS (time-sliced)" : "");
  if (sharingNoMps == 0 || comm->sharedCopy || comm->rank != 0 ||
      __atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
    return;
  GCOMM_WARN(comm,
             "%d ranks share one GPU without MPS: their kernels time-slice the GPU and every "
             "operation waits for a time slice (milliseconds at any size); start the MPS daemon "
             "(nvidia-cuda-mps-control -d) before the ranks",
             sharingNoMps);
}

/* How ranks that all share one GPU run (GCOMM_SHARED_GPU): on the kernels, whose blocks wait for
 * the peers' blocks, or by stream-ordered copies and short kernels that never wait on the GPU
 * (gcomm_gpu_shared.c). Without MPS the contexts time-slice the GPU and a waiting block holds it
 * for a whole slice, so auto takes the copies there. Every rank decides alike from what all
 * gathered. Only for communicators whose every rank is on the one GPU. */
static void chooseSharedGpu(gcommComm_t comm, int sharing, int sharingNoMps) {
  int mode = comm->params.sharedGpu, all = sharing == comm->nranks && comm->nranks > 1;
  int fits = all && comm->nranks <= GCOMM_SHARED_MAX_RANKS;
  comm->sharedCopy = fits && (mode == GCOMM_SHARED_GPU_COPY ||
                              (mode == GCOMM_SHARED_GPU_AUTO && sharingNoMps > 0));
#ifdef GCOMM_HIP
  if (comm->sharedCopy && mode == GCOMM_SHARED_GPU_COPY && comm->rank == 0)
    GCOMM_WARN(comm, "GCOMM_SHARED_GPU=copy: the copy path is CUDA only: the kernels run");
  comm->sharedCopy = 0;
#endif
  if (mode == GCOMM_SHARED_GPU_COPY && !fits && comm->rank == 0)
    GCOMM_WARN(comm,
               "GCOMM_SHARED_GPU=copy needs every rank (2 to %d) on one GPU; %d of %d are: the "
               "kernels run this communicator",
               GCOMM_SHARED_MAX_RANKS, sharing, comm->nranks);
  if (all)
    GCOMM_INFO(GCOMM_SUBSYS_INIT, comm,
               "GPU sharing: all %d ranks on one GPU, %s: %s (GCOMM_SHARED_GPU=%s)", comm->nranks,
               sharingNoMps ? "without MPS" : "under MPS",
               comm->sharedCopy ? "stream-ordered copies and short kernels, no kernel waits for a "
                                  "peer"
                                : "the kernels",
               mode == GCOMM_SHARED_GPU_COPY      ? "copy"
               : mode == GCOMM_SHARED_GPU_KERNELS ? "kernels"
                                                  : "auto");
}

/* Collective (every rank). The channel (block) count a GPU communicator uses by default. A block
 * pushes ~11 GB/s over NVLink and blocks that reduce or copy locally leave the link idle
 * meanwhile, so 128 of them fill it (docs/PERF.md: 2 and 4 GPUs). Blocks of ranks that share a
 * GPU wait on each other, so all of them must be resident at once: the ranks on one GPU get one
 * block a multiprocessor between them (comm->blockBudget). More than 4 ranks on a node: 64 at
 * most (FIFO memory grows with ranks x lanes). Between nodes 4: each lane to a remote rank pins
 * 2 FIFOs of host memory, and the network sets the pace;
 * staged through host memory (GCOMM_P2P_DISABLE) 16: PCIe sets it; 16 with copy engines too. */
static gcommResult_t gpuDefaultChannels(gcommComm_t comm, uint64_t hostId, int* nChannels) {
  gpuOfRank_t mine = {hostId, comm->devicePci, comm->device >= 0 ? comm->deviceSMs : -1,
                      comm->device >= 0 && comm->deviceMps};
  gpuOfRank_t* all = calloc(comm->nranks, sizeof(*all));
  if (all == NULL) return GCOMM_ERROR(comm, gcommSystemError, -1, "out of memory");
  gcommResult_t res = gcommAllgather(comm, &mine, sizeof(mine), all);
  if (res != gcommSuccess) {
    free(all);
    return res;
  }
  qsort(all, comm->nranks, sizeof(*all), gpuOfRankCompare);
  int64_t fewestSms = INT64_MAX;
  int sharing = 1, sharingNoMps = 0; /* the most ranks on one GPU; without MPS */
  for (int i = 0, run = 0, noMps = 0; i < comm->nranks; i++) {
    if (all[i].sms < 0) continue;
    if (all[i].sms < fewestSms) fewestSms = all[i].sms;
    int same = i > 0 && all[i - 1].sms >= 0 && gpuOfRankCompare(&all[i], &all[i - 1]) == 0;
    run = same ? run + 1 : 1;
    noMps = (same ? noMps : 0) || !all[i].mps;
    if (run > sharing) sharing = run;
    if (run > 1 && noMps && run > sharingNoMps) sharingNoMps = run;
  }
  free(all);
  if (comm->device >= 0) chooseSharedGpu(comm, sharing, sharingNoMps);
  noteGpuSharing(comm, sharing, sharingNoMps);
  /* Ranks sharing a GPU: one block a multiprocessor for all of them together. The kernel fits 2
   * an SM, but under MPS 8 ranks on one H100 with 32 channels each (256 blocks) stalled in 9 of
   * 21 stress runs (some ranks' blocks did not start until the others timed out), and with 16 or
   * 8 channels passed 15 of 15 (docs/PERF.md, ranks sharing a GPU). */
  comm->blockBudget = sharing > 1 ? (int)(fewestSms / sharing) : GCOMM_DEV_MAX_WORKS;
  if (comm->blockBudget < 1) comm->blockBudget = 1;
  if (comm->blockBudget > GCOMM_DEV_MAX_WORKS) comm->blockBudget = GCOMM_DEV_MAX_WORKS;
  int nch = comm->nLocal > 4 ? GCOMM_MAX_CHANNELS / 2 : GCOMM_MAX_CHANNELS;
  while (nch > 1 && (nch > fewestSms || (sharing > 1 && nch > comm->blockBudget))) nch /= 2;
  /* a small LL launch runs up to GCOMM_DEV_SMALL_WORKS blocks at 1 an SM (blocks of ranks sharing
   * a GPU wait on each other: all must be resident); one waiting to start beside the one before
   * it holds SMs too: every rank sharing a GPU must still fit both */
  comm->smallKernel = (int64_t)sharing * GCOMM_DEV_SMALL_WORKS <= fewestSms;
  comm->mediumKernel = (int64_t)sharing * 2 * GCOMM_DEV_MEDIUM_WORKS <= fewestSms;
  comm->launchOverlap = !comm->params.pdl || comm->deviceCcMajor < 9 ? GCOMM_OVERLAP_NONE
                        : sharing == 1                               ? GCOMM_OVERLAP_EVERY
                        : (int64_t)sharing * 2 * GCOMM_DEV_SMALL_WORKS <= fewestSms
                            ? GCOMM_OVERLAP_SMALL_LL
                            : GCOMM_OVERLAP_NONE;
  *nChannels = spansNodes(comm)                                    ? GPU_NET_CHANNELS
               : comm->params.p2pDisable || comm->params.p2pMemcpy ? GPU_STAGED_CHANNELS
                                                                   : nch;
  return gcommSuccess;
}
#endif

/* How progress is driven where the user did not choose (GCOMM_PROXY_MODE, config.proxyMode): a
 * host communicator whose process may run on one CPU only (bound to a core, as `mpiexec
 * -bind-to core` does) has the caller drive it (poll), as MPI libraries do: a progress thread
 * there only takes turns with the caller on that core, a context switch each time it wakes (2
 * ranks bound on a 2-vCPU VM, every collective 8 B-4 KB: with the thread 0.6-4 us and outliers
 * of 16-52, polled 0.5-1.9). Elsewhere the thread, which moves operations while the caller
 * computes. */
static void chooseProxyMode(gcommComm_t comm) {
  cpu_set_t cpus;
  if (comm->params.proxyModeChosen || comm->device >= 0) return;
  if (sched_getaffinity(0, sizeof(cpus), &cpus) == 0 && CPU_COUNT(&cpus) == 1)
    comm->params.proxyMode = GCOMM_PROXY_POLL;
}

/* How long a wait spins before it yields the CPU. A rank that waits on a ring of others (each
 * call waits for the one before it) yields its core after GCOMM_UNTIMED_POLLS polls unless it
 * spins: every yield is a system call that the data arriving meanwhile waits out, and a ring adds
 * up its ranks' delays, so that small send/recv grew with the ranks (16 cores, MPICH's
 * `-bind-to core`, 8 B: 0.55 us at 4 ranks, 0.9-1.5 at 15; spinning 20 us first: 0.61-0.70 at
 * 15, level with MPICH: docs/PERF.md), as MPI libraries spin before they yield. Only where every
 * rank of the node has a CPU: ranks that share one take turns, and a spin holds the CPU from the
 * rank it waits for. CPUs: those the process may run on, or, where it is bound to one (as
 * `-bind-to core` does), the machine's, the launcher having placed the other ranks. */
static void chooseWaitSpin(gcommComm_t comm) {
  cpu_set_t cpus;
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  long mine = sched_getaffinity(0, sizeof(cpus), &cpus) == 0 ? CPU_COUNT(&cpus) : online;
  long usable = mine > 1 ? mine : online;
  comm->waitSpinUs = comm->nLocal <= usable ? (uint64_t)comm->params.waitSpinUs : 0;
}

/* The build's transports, in setup order, before any of them makes anything: a failed setup
 * frees whatever each made (commFree). The network asks the core where a receive may land. */
static void addTransports(gcommComm_t comm) {
  comm->allgather = gcommAllgather; /* the exchanges at setup of the transports and the base */
  comm->revokedResult = gcommRevokedResult; /* the GPU engine's waits */
  comm->deadPeerResult = gcommDeadPeerResult;
  comm->transports[comm->nTransports++] = &gcommShmTransport;
#ifdef GCOMM_OFI
  comm->transports[comm->nTransports++] = &gcommNetTransport;
  comm->netDirectTarget = gcommNetDirectTarget;
#endif
#ifdef GCOMM_GPU
  comm->transports[comm->nTransports++] = &gcommGpuTransport;
#endif
}

/* Rank, size, parameters (every rank the same), name, node. */
static gcommResult_t setupIdentity(gcommComm_t comm, const gcommConfig_t* config,
                                   uint64_t* hostId) {
  static int commCounter;
  if (comm->boot == NULL) { /* else gcommCommShrink gave them */
    MPI_CHECK(comm, MPI_Comm_rank(comm->mpiComm, &comm->rank));
    MPI_CHECK(comm, MPI_Comm_size(comm->mpiComm, &comm->nranks));
  }
  gcommParamsLoad(&comm->params, comm, config);
  gcommParamsPrint(comm);
  GCOMM_CHECK(gcommParamsAgree(comm));
  comm->device = GCOMM_DEVICE_HOST;
  snprintf(comm->name, sizeof(comm->name), "%s",
           config && config->commName ? config->commName : "");
  if (comm->name[0] == 0)
    snprintf(comm->name, sizeof(comm->name), "comm%d",
             __atomic_fetch_add(&commCounter, 1, __ATOMIC_RELAXED));
  return detectNode(comm, hostId);
}

/* The GPU (or none), the channels and the FIFO slots: defaults that depend on the communicator's
 * shape, where the user did not choose (GCOMM_NCHANNELS, config.nChannels, GCOMM_BUFFSIZE). */
static gcommResult_t setupShape(gcommComm_t comm, const gcommConfig_t* config, uint64_t hostId) {
  (void)config, (void)hostId;
#ifdef GCOMM_GPU
  GCOMM_CHECK(agreeOnResult(comm, gcommDeviceSelect(comm, config), "GPU selection"));
  int gpuChannels = 0;
  GCOMM_CHECK(gpuDefaultChannels(comm, hostId, &gpuChannels)); /* every rank: an MPI call */
  if (comm->device >= 0 && !comm->params.nChannelsChosen) comm->params.nChannels = gpuChannels;
  if (comm->device >= 0 && !comm->params.buffSizeChosen) comm->params.buffSize = 4 << 20;
#endif
  /* host communicators between nodes: one channel. Every lane to a peer shares its one
   * connection, and one thread moves them all; against 2 channels a 4 MB all-reduce over tcp took
   * less CPU in 9 of 9 adjacent pairs of runs, 16 MB in 3 of 4 (docs/PERF.md). 512 KB slots, each
   * one eager message (transports/net_ofi.c): over tcp each message costs the kernel and the
   * provider a fixed amount besides its bytes; against 256 KB slots the all-reduce was ahead at
   * 1-16 MB in 3 of 4 sets of alternating runs (34 pairs), 128 KB was worse everywhere, 768 KB
   * and 1 MB no better. GPU communicators keep theirs (above). */
  if (spansNodes(comm) && comm->device < 0) {
    if (!comm->params.nChannelsChosen) comm->params.nChannels = 1;
    if (!comm->params.buffSizeChosen) comm->params.buffSize = 4 << 20;
  }
  comm->nChannels = comm->params.nChannels;
  /* lanes [0, nChannels) carry collectives, [nChannels, nChannels + nP2pChannels) point-to-point */
  comm->nP2pChannels = comm->nChannels;
#ifdef GCOMM_GPU
  /* one launch holds GCOMM_DEV_MAX_WORKS works (blocks): keep a group that sends to and receives
   * from every other rank once, each split over every p2p channel, inside one launch (a split
   * launch may deadlock). This also bounds the GPU FIFO memory of the p2p lanes. */
  if (comm->device >= 0) {
    int cap = comm->blockBudget / 2 / (comm->nranks > 1 ? comm->nranks - 1 : 1);
    if (cap < 1) cap = 1;
    if (comm->nP2pChannels > cap) comm->nP2pChannels = cap;
  }
#endif
  comm->nLanes = comm->nChannels + comm->nP2pChannels;
  comm->slotBytes = ((size_t)comm->params.buffSize / GCOMM_STEPS) & ~(size_t)63;
  return gcommSuccess;
}

/* This rank's card (its node, pid, GPU, shm segment, GPU region handle): the segment and the
 * GPU's FIFO region made first, then every rank's card exchanged. */
static gcommResult_t exchangeCards(gcommComm_t comm, uint64_t hostId) {
  gcommCard_t card;
  memset(&card, 0, sizeof(card));
  card.hostId = hostId;
  card.pid = getpid();
  card.device = comm->device;
  gethostname(card.host, sizeof(card.host) - 1);
  size_t gpuShmBytes = 0; /* a GPU FIFO region staged through host memory, in the shm segment */
#ifdef GCOMM_GPU
  GCOMM_CHECK(
      agreeOnResult(comm, gcommDevicePlaceFifos(comm, hostId, &gpuShmBytes), "GPU FIFO placement"));
#endif
  gcommResult_t res = gcommShmCreate(comm, &card, gpuShmBytes);
#ifdef GCOMM_GPU
  if (res == gcommSuccess && comm->device >= 0) res = gcommDeviceSetup(comm, &card);
#endif
  GCOMM_CHECK(agreeOnResult(comm, res, "shared-memory setup"));
  comm->cards = calloc(comm->nranks, sizeof(gcommCard_t));
  if (comm->cards == NULL) return GCOMM_ERROR(comm, gcommSystemError, -1, "out of memory");
  return gcommAllgather(comm, &card, sizeof(card), comm->cards);
}

/* What shapes every FIFO must be the same on every rank: the lanes and slot size, the slot words
 * (GCOMM_CHECK_MISMATCH) and, on GPUs, the copy engines (which rule out LL: both ends of a
 * connection use one protocol). And a rank on another node needs the network. */
static gcommResult_t checkShapeAgrees(gcommComm_t comm, uint64_t hostId) {
  enum { CHANNELS, SLOT_BYTES, LANES, CHECK_MISMATCH, COPY_ENGINES, NFIELDS };
  int shape[NFIELDS], lo[NFIELDS], hi[NFIELDS];
  shape[CHANNELS] = comm->nChannels;
  shape[SLOT_BYTES] = (int)comm->slotBytes;
  shape[LANES] = comm->nLanes;
  shape[CHECK_MISMATCH] = (int)comm->params.checkMismatch;
  shape[COPY_ENGINES] = comm->device >= 0 && (comm->params.p2pMemcpy || comm->params.shmMemcpy);
  int* all = malloc(sizeof(shape) * (size_t)comm->nranks);
  if (all == NULL) return GCOMM_ERROR(comm, gcommSystemError, -1, "out of memory");
  gcommResult_t res = gcommAllgather(comm, shape, sizeof(shape), all);
  memcpy(lo, shape, sizeof(lo));
  memcpy(hi, shape, sizeof(hi));
  for (int i = 0; i < comm->nranks * NFIELDS && res == gcommSuccess; i++) {
    if (all[i] < lo[i % NFIELDS]) lo[i % NFIELDS] = all[i];
    if (all[i] > hi[i % NFIELDS]) hi[i % NFIELDS] = all[i];
  }
  free(all);
  GCOMM_CHECK(res);
  if (memcmp(lo, hi, sizeof(lo)) != 0)
    return GCOMM_ERROR(comm, gcommInvalidUsage, -1,
                       "ranks disagree on GCOMM_NCHANNELS (%d..%d), GCOMM_BUFFSIZE, "
                       "GCOMM_CHECK_MISMATCH, GCOMM_P2P_USE_CUDA_MEMCPY, "
                       "GCOMM_SHM_USE_CUDA_MEMCPY or GPU vs host "
                       "(config.device): set them the same on every rank",
                       lo[CHANNELS], hi[CHANNELS]);
#ifdef GCOMM_OFI
  for (int p = 0; p < comm->nranks; p++)
    if (comm->cards[p].hostId != hostId && comm->params.netDisable)
      return GCOMM_ERROR(comm, gcommInvalidUsage, p,
                         "rank %d is on another node and GCOMM_NET_DISABLE=1 refuses the network",
                         p);
#else
  for (int p = 0; p < comm->nranks; p++)
    if (comm->cards[p].hostId != hostId)
      return GCOMM_ERROR(comm, gcommInvalidUsage, p,
                         "rank %d is on another node and this build has no network transport "
                         "(build with OFI=1)",
                         p);
#endif
  return gcommSuccess;
}

/* The connection tables, then every transport's connections, each step agreed by every rank. */
static gcommResult_t connectTransports(gcommComm_t comm) {
  comm->localRanks = calloc(comm->nLocal, sizeof(int));
  for (int r = 0, i = 0; r < comm->nranks && comm->localRanks != NULL; r++)
    if (comm->cards[r].hostId == comm->cards[comm->rank].hostId && i < comm->nLocal)
      comm->localRanks[i++] = r;
  comm->sendConns = calloc((size_t)comm->nLanes * comm->nranks, sizeof(gcommConn_t));
  comm->recvConns = calloc((size_t)comm->nLanes * comm->nranks, sizeof(gcommConn_t));
  comm->nQueues = comm->nChannels + 2 * comm->nranks * comm->nP2pChannels;
  comm->queues = calloc(comm->nQueues, sizeof(gcommQueue_t));
  comm->busyQueues = calloc((size_t)busyQueueWords(comm), sizeof(uint64_t));
  gcommResult_t res =
      comm->sendConns && comm->recvConns && comm->queues && comm->busyQueues && comm->localRanks
          ? gcommSuccess
          : GCOMM_ERROR(comm, gcommSystemError, -1, "out of memory");
  for (int i = 0; i < comm->nTransports; i++) {
    const gcommTransport_t* t = comm->transports[i];
    if (t->connect == NULL) continue;
    if (res == gcommSuccess) res = t->connect(comm);
    GCOMM_CHECK(agreeOnResult(comm, res, t->connectWhat));
    if (t->connected) GCOMM_CHECK(t->connected(comm));
  }
  /* every call reads it (gcommRevokeSeen): its address once */
  gcommStatus_t* first = res == gcommSuccess ? gcommShmStatus(comm, comm->localRanks[0]) : NULL;
  comm->nodeRevoked = first != NULL ? &first->revoked : NULL;
  comm->quickStop = comm->device < 0 && !spansNodes(comm) && comm->nodeRevoked != NULL;
#ifdef GCOMM_GPU
  if (comm->device >= 0 && comm->params.proto == gcommProtoLL &&
      (spansNodes(comm) || copiesByEngine(comm)))
    GCOMM_WARN(comm,
               "GCOMM_PROTO=ll: LL cannot cross a proxy (its flags live in the data); this GPU "
               "communicator %s and uses simple",
               spansNodes(comm) ? "spans nodes" : "sends through copy engines");
#endif
  return gcommSuccess;
}

/* Everything after the MPI communicator exists; on failure the caller frees comm. */
gcommResult_t gcommCommSetup(gcommComm_t comm, const gcommConfig_t* config) {
  uint64_t hostId = 0;
  addTransports(comm);
  GCOMM_CHECK(setupIdentity(comm, config, &hostId));
  GCOMM_CHECK(setupShape(comm, config, hostId));
  chooseProxyMode(comm);
  chooseWaitSpin(comm);
  GCOMM_CHECK(exchangeCards(comm, hostId));
  GCOMM_CHECK(checkShapeAgrees(comm, hostId));
  GCOMM_CHECK(connectTransports(comm));
  gcommBootOwnPages(comm);
  if (comm->params.dumpSignal > 0) gcommInstallDumpSignal(comm);
  GCOMM_INFO(GCOMM_SUBSYS_INIT, comm,
             "comm \"%s\" rank %d/%d: %d local ranks, %d channels, %zu-byte FIFO slots, proxy "
             "%s, waits spin %llu us, pid %d",
             comm->name, comm->rank, comm->nranks, comm->nLocal, comm->nChannels, comm->slotBytes,
             gcommProxyModeNames[comm->params.proxyMode], (unsigned long long)comm->waitSpinUs,
             (int)getpid());
  gcommTuningPrint(comm);
  gcommProfInit(comm); /* late: a failing setup has no profiler to finalize */
#ifdef GCOMM_GPU
  /* the kernels' timestamps, with a plugin loaded (warns on failure) */
  if (comm->prof.lib != NULL && comm->device >= 0) gcommDeviceProfSetup(comm);
#endif
  /* after the profiler, which the thread's passes report to (commFree in gcomm.c finalizes it on
   * failure) */
  if (hasGpuProxy(comm)) return gcommStartGpuProxy(comm);
  /* spanning nodes: the engine reads the network from the start, every 100 ms while idle, so that
   * a connection another rank opens to this one is taken, and a stop or revoke sent to it is
   * there at its next call, whether or not it has called anything yet */
  return spansNodes(comm) ? gcommStartThread(comm) : gcommSuccess;
}
