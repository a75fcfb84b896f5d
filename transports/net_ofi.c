/*
 * transports/net_ofi.c - connections to ranks on other nodes through libfabric (make OFI=1).
 *
 * The executor only sees FIFOs, the same gcommFifo_t as shared memory; this file is the proxy
 * that moves FIFO slots over the network. It does not care who allocated a FIFO: the host
 * communicator's come from one registered region of this file (or one mapping each, see
 * GCOMM_NET_SHARED_BUFFERS), and gcommNetConnect takes any FIFO in host memory the caller owns
 * (e.g. pinned host memory mapped for a GPU). For a remote peer on one lane:
 *
 * Receiver: a fi_trecv is kept posted into every free slot, steps head .. head+STEPS-1, except
 * that after operations of large messages a host communicator's collective lanes post no further
 * than one step past the operations queued there (gcommConn_t.holdRecvs): a step whose operation
 * is known may be received straight into the caller's output (comm->netDirectTarget), and the one
 * step past them lets the peer start its next operation. It tells the sender how far it has posted:
 * a credit, the count in an 8-byte fi_tinject (no completion, no buffer to keep; a provider that
 * injects nothing, shm with FI_HMEM, gets an fi_tsend, one in flight per connection), sent once the
 * sender may have only STEPS/2 receives left (creditDue). The first STEPS receives are posted when
 * the edge is connected, before the ranks' barrier, so the sender starts with STEPS credits. A
 * completed receive records its byte count in fifo->bytes[] and tail advances over the contiguous
 * prefix of completed steps (completions may come out of order). The executor drains slots and
 * advances head; the next pass re-posts into the freed slots.
 *
 * Sender: the executor fills slot tail % STEPS and advances tail. Every pass posts fi_tsend for
 * each step below both tail and the peer's credit; when a send completes its slot is free again
 * and head advances (over the contiguous prefix of completed steps; GPU memory copied by CUDA
 * calls waits for the credit too, sendHead).
 *
 * Flow control: a data message is only sent into a receive that is already posted, so nothing is
 * ever written into a slot the executor still reads, and no data message ever waits in the
 * provider's unexpected-message path (only credits can: at most STEPS per connection, since the
 * receiver posts no further than STEPS past the data the sender has sent). Sends use the
 * provider's default completion (the buffer is reusable), never FI_DELIVERY_COMPLETE: no extra
 * round trip per slot, and the shm provider (libfabric 1.17) sends FI_DELIVERY_COMPLETE messages
 * through its segmentation protocol, one message at a time per peer, whose zero-byte case never
 * completes: every later send to that peer then fails with -FI_EAGAIN forever (a deadlock; an
 * unmatched message would block the peer's other lanes the same way).
 *
 * Tags (60 bits, the top 4 left to providers that reserve them):
 *   bit 58: box     bit 57: stop (lane 0) or revoke (lane 1)    bit 56: credit
 *   bits 36..55  sender's rank (20 bits)    bits 28..35  lane
 *   bits  0..27: data: the step modulo 2^28 (at most STEPS steps of a connection are in flight);
 *                a box: its exchange's round modulo 2^28
 * Receives are posted from FI_ADDR_UNSPEC (the tag names the sender) for exact tags: the shm
 * provider of libfabric 1.17 matches a new receive against already-arrived messages with the
 * ignore mask of a stale entry, so a wildcard receive can miss them. A sender keeps one credit
 * receive posted per connection, into its slot of a small registered array.
 *
 * GPU memory (FI_HMEM): a GPU communicator asks the provider chosen as above for FI_HMEM too
 * (hmemInfo); when it offers it and GCOMM_NET_GDR allows (auto: only a provider that makes no CUDA
 * calls of its own, providerCallsCuda; 1: any), transports/p2p.c puts the slots of its
 * network FIFOs in GPU memory (gcommNetRegister with its device: fi_mr_regattr, iface CUDA or
 * ROCR) while their counters stay in mapped host memory, and the messages go from and into the
 * GPU's memory directly: nothing here changes but the descriptor. The kernel reads a received slot
 * once the proxy has seen the receive's completion and advanced tail (acquire at system scope,
 * then loads that bypass L1), so the data must be in the GPU's memory by then. A provider that
 * copies with CUDA (shm: cudaMemcpy, through a CUDA IPC mapping of the sender's slot) may complete
 * a receive before its copy between GPU buffers is done (such a cudaMemcpy does not wait), so
 * gcommNetProgress waits for this thread's legacy-stream copies (comm->netFence) before it
 * advances a tail; and as the receiver's copy may still read the sender's slot when the send
 * completes (shm returns the command once the copy is issued), the sender frees a slot only once
 * the receiver's credit shows it drained that step (sendHead). An RDMA NIC writing the GPU's memory
 * (GPUDirect RDMA: verbs, efa) has its writes flushed by the same fence when gdrcopy is there
 * (GCOMM_GDRCOPY_FLUSH_ENABLE=1: a CPU read of GPU memory through its mapping), not otherwise.
 * Host communicators never ask for FI_HMEM.
 *
 * Everything here runs on the progress engine (under comm->progressLock): the CQ is read only by
 * gcommNetProgress, called from progressPass; setup, connection and teardown run at init and
 * destroy. One fabric, domain, CQ and AV per communicator, and GCOMM_NET_ENDPOINTS endpoints.
 */
#define _GNU_SOURCE
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>

#include "gcomm_internal.h"

#define NET_FI_VERSION FI_VERSION(1, 9)
#define TAG_STEP_BITS 28
#define TAG_LANE_BITS 8
#define TAG_RANK_BITS 20
#define TAG_STEP_MASK (((uint64_t)1 << TAG_STEP_BITS) - 1)
#define TAG_CREDIT ((uint64_t)1 << (TAG_STEP_BITS + TAG_LANE_BITS + TAG_RANK_BITS))
#define TAG_STOP (TAG_CREDIT << 1)
#define TAG_BOX (TAG_STOP << 1)
#define STOP_LANE 0       /* a stop's tag: TAG_STOP | makeTag(sender, STOP_LANE, 0) */
#define REVOKE_LANE 1     /* a revoke's */
#define STOP_FLUSH_MS 100 /* how long a stopped rank polls for its stops to go out */
#define NET_ADDR_MAX 240
#define NET_MAX_ENDPOINTS 4 /* GCOMM_NET_ENDPOINTS */

typedef struct netConn netConn_t;
/* What a request carries: data, a credit (received by a sending connection, sent by a receiving
 * one), or, from or to a remote rank with no connection, a stop, a revoke or a box (the control
 * kinds, from NET_STOP_RECV on) */
enum {
  NET_DATA,
  NET_CREDIT_RECV,
  NET_CREDIT_SEND,
  NET_STOP_RECV,
  NET_STOP_SEND,
  NET_REVOKE_RECV,
  NET_REVOKE_SEND,
  NET_BOX_RECV,
  NET_BOX_SEND
};
typedef struct {
  struct fi_context2 ctx; /* first: the completion's op_context points here */
  netConn_t* nc;          /* NULL for the control kinds */
  uint64_t step;          /* a data message's step; a box's parity; others have none */
  int kind;
  int peer;   /* a control message's remote rank */
  void* prof; /* the profiler's Net event, or NULL */
} netReq_t;

struct netConn {
  gcommConn_t* conn; /* the executor's view: fifo, slots, slotBytes */
  int peer, lane, isSend;
  struct fid_ep* ep; /* the lane's endpoint */
  /* the first failure of a receive or credit here (a peer that destroyed its communicator or
   * died): nothing more is posted, and it becomes the communicator's error only when a step
   * waits on this connection (gcommConn_t.netFailure) or slots filled for it can never go */
  char failure[320];
  fi_addr_t addr;
  struct fid_mr* mr; /* this FIFO's own registration; NULL inside the shared region */
  void* desc;
  void* ownMem; /* a FIFO this file mapped for itself (GCOMM_NET_SHARED_BUFFERS=0) */
  size_t ownBytes;
  uint64_t posted; /* send: next step to post; recv: receives are posted for every step below */
  uint64_t done;   /* every step below is complete (send: >= fifo->head, sendHead; recv: = tail) */
  /* send: the peer has receives posted below this step; recv: the count last told the peer */
  uint64_t credit;
  int creditPosted;    /* send: the credit receive is posted */
  uint64_t* creditBuf; /* send: where the credit receive lands (registered) */
  uint8_t complete[GCOMM_STEPS];
  const char* refs[GCOMM_STEPS]; /* a host send FIFO's gcommConn_t.refs */
  char* landed[GCOMM_STEPS];     /* a host receive FIFO's gcommConn_t.landed */
  netReq_t reqs[GCOMM_STEPS];
  netReq_t creditReq;
  /* recv, with a provider that cannot inject 8 bytes: the credit in flight (fi_tsend reads it
   * until its completion), and whether one is */
  uint64_t creditSent;
  int creditInFlight;
};

/* Stops: a rank whose communicator stopped (an error, a peer it found dead, an abort) tells every
 * remote rank why, once (comm->stopCode and stopMsg, from gcommPublishStop), so that the ranks
 * of other nodes blocked on it, or on ranks blocked on it, stop too and name the cause instead of
 * waiting for their deadline: the executor's probes read each remote rank's stop as its status
 * (the status hook), as they read a local rank's status page. Every rank keeps one receive
 * posted for each remote rank's stop, on endpoint 0, from its first progress pass to destroy;
 * nothing goes while no communicator stops. */
typedef struct {
  int32_t code;
  char msg[sizeof(((gcommStatus_t*)0)->msg)];
} netStopMsg_t;

/* A revoke (gcommCommRevoke here, or one this rank learned of) goes the same way, once, as its own
 * message (a rank stopped by an error before it revoked has sent its stop already): the rank whose
 * gcommCommRevoke it was. */
typedef struct {
  netStopMsg_t in;      /* where its stop lands */
  gcommStatus_t status; /* its stop, once received (code written last) */
  netReq_t recv, send, revokeRecv, revokeSend;
  int32_t revokeIn; /* where its revoke lands */
  int recvPosted, revokePosted;
  int sendState;   /* this rank's stop to it: 0 not posted, 1 in flight, 2 done or failed */
  int revokeState; /* this rank's revoke to it, the same */
} netStopPeer_t;

typedef struct {
  netStopMsg_t out;      /* this rank's stop */
  int32_t revokeOut;     /* the rank whose revoke this rank passes on */
  int told, revokeTold;  /* out, revokeOut are filled: they go to every remote rank */
  int inFlight;          /* sends posted and not complete */
  int recvsLeft;         /* remote ranks whose stop or revoke receive is not posted yet */
  int revokedBy;         /* atomic: 1 + the rank whose revoke came first over the network, or 0 */
  netStopPeer_t peers[]; /* [rank] (remote ranks only) */
} netStops_t;

/* Boxes: the exchanges of gcomm_agree.c without MPI (a shrink's agreement, a shrunk
 * communicator's setup) with the ranks of other nodes, which have no status page here. A box is
 * one message (tag bit 58, the exchange's round in the step bits) from this rank to every remote
 * rank the exchange names; each remote rank's box of a round is received, when asked for, into
 * the slot of the round's parity, as the pages keep two boxes: a rank starts exchange k + 2 only
 * once every rank has sent its box of k + 1, so no slot holds two rounds at once. A slot whose
 * receive of an older round never came (an exchange that failed) has it cancelled first. A send
 * the provider cannot take yet (a connection to a rank that is not progressing is still being
 * made) is tried again whenever a box is read, and given up when its parity's next round is
 * posted: a rank that takes no part must not hold the others up. Allocated and registered at the
 * first exchange. */
enum { BOX_FREE, BOX_POSTED, BOX_DONE, BOX_CANCELLING };
enum { SEND_NONE, SEND_WAITING, SEND_IN_FLIGHT };
struct gcommNet;
typedef struct {
  gcommBox_t in[2];
  netReq_t recv[2], send[2];
  uint64_t round[2]; /* the round posted or received in each slot */
  int state[2];
  int sendState[2]; /* this rank's box of each parity to it */
} netBoxPeer_t;

typedef struct {
  gcommBox_t out[2];    /* this rank's box of each parity */
  int sendsLeft[2];     /* sends of out[parity] in flight */
  int waiting;          /* sends not posted yet, either parity */
  netBoxPeer_t peers[]; /* [rank] (remote ranks only) */
} netBoxes_t;
/* Posts the box sends that wait: at every exchange's read, every pass, every flush of stops (a
 * rank whose exchange has ended may not have sent its box to all yet). */
static void sendBoxes(gcommComm_t comm, struct gcommNet* net);

/* Memory registered once for the FIFO slots placed inside it (gcommNetRegister). */
typedef struct {
  uintptr_t base;
  size_t len;
  struct fid_mr* mr;
  void* desc;
} netRegion_t;

struct gcommNet {
  struct fi_info* info;
  struct fid_fabric* fabric;
  struct fid_domain* domain;
  struct fid_av* av;
  struct fid_cq* cq;
  /* GCOMM_NET_ENDPOINTS endpoints, all on this CQ and AV: each makes its own connection to a peer,
   * and lane l takes endpoint l % nEps, so that a provider over TCP moves an operation's channels
   * over separate sockets (docs/TUNING.md) */
  struct fid_ep* eps[NET_MAX_ENDPOINTS];
  int nEps;
  netRegion_t* regions;
  int nRegions;
  int hmem;            /* the endpoint takes GPU memory (FI_HMEM, allowed by GCOMM_NET_GDR) */
  int hmemCopies;      /* ... and the provider copies it with CUDA calls (providerCallsCuda) */
  const char* hmemWhy; /* else why not, for the INFO line */
  char* region; /* the host communicator's FIFOs in one mapping (GCOMM_NET_SHARED_BUFFERS=1) */
  size_t regionBytes;
  uint64_t nextKey;  /* requested keys, unique in this domain (without FI_MR_PROV_KEY) */
  uint64_t* credits; /* [peer * nLanes + lane]: the credit receive of each sending connection */
  struct fid_mr* creditMr;
  void* creditDesc;
  fi_addr_t* addrs;  /* [rank * nEps + endpoint] */
  netStops_t* stops; /* registered whole */
  struct fid_mr* stopMr;
  void* stopDesc;
  netBoxes_t* boxes; /* registered whole, at the first exchange */
  struct fid_mr* boxMr;
  void* boxDesc;
  uint64_t lastReadNs; /* when the completion queue was last read */
  netConn_t** conns;
  int nConns, capConns;
};

/* What each rank tells every other rank at setup (one comm->allgather). */
typedef struct {
  int ok;
  int nEps;
  char prov[64];
  char addr[NET_MAX_ENDPOINTS][NET_ADDR_MAX];
} netCard_t;

static uint64_t makeTag(int rank, int lane, uint64_t step) {
  return ((uint64_t)rank << (TAG_STEP_BITS + TAG_LANE_BITS)) | ((uint64_t)lane << TAG_STEP_BITS) |
         (step & TAG_STEP_MASK);
}

static int isRemote(gcommComm_t comm, int p) {
  return comm->cards[p].hostId != comm->cards[comm->rank].hostId;
}

/* Auto choice: providers that cannot leave the machine are never picked by themselves (they are
 * for testing: GCOMM_OFI_PROVIDER=shm); TCP and sockets only when nothing better exists. Of the
 * TCP ones, a provider that speaks reliable datagrams itself (libfabric 1.17's `net`, which became
 * `tcp` in 1.18) comes before tcp under the rxm layer: rxm signals every message through a pipe
 * besides the socket, which doubles a small operation's cost (2 pretend nodes, 8 B all-reduce:
 * 12 against 20 us, docs/PERF.md). */
static int provRank(const char* name) {
  if (strncmp(name, "shm", 3) == 0 || strncmp(name, "sm2", 3) == 0 ||
      strncmp(name, "udp", 3) == 0 || strstr(name, "ofi_rxd") != NULL ||
      strncmp(name, "ofi_", 4) == 0)
    return -1;
  if (strcmp(name, "net") == 0 || strcmp(name, "tcp") == 0) return 2;
  if (strncmp(name, "tcp", 3) == 0 || strncmp(name, "net", 3) == 0) return 1;
  if (strncmp(name, "sockets", 7) == 0) return 0;
  return 3;
}

/* An entry's rank for the choice: provRank's, 4 when GCOMM_OFI_PROVIDER named it (fi_getinfo
 * matched the name), -2 when GCOMM_OFI_IFACE leaves its domain out. */
static int candidateRank(const struct fi_info* i, const char* prov, const char* iface) {
  if (iface != NULL && (i->domain_attr->name == NULL || strcmp(i->domain_attr->name, iface) != 0))
    return -2;
  return prov != NULL ? 4 : provRank(i->fabric_attr->prov_name);
}

const char* gcommNetRankWhy(int rank) {
  static const char* const why[] = {
      "not the domain GCOMM_OFI_IFACE names",
      "stays on this machine, or a utility layer: never chosen by itself (GCOMM_OFI_PROVIDER "
      "names it)",
      "sockets: the last resort",
      "TCP under the rxm layer: its extra signalling doubles a small operation's cost",
      "TCP speaking reliable datagrams itself",
      "neither TCP nor sockets (RDMA or a vendor's network): first choice",
      "named by GCOMM_OFI_PROVIDER"};
  return rank >= -2 && rank <= 4 ? why[rank + 2] : "unknown";
}

/* The first entry of the highest rank, or NULL when none may be chosen (ranks below 0). */
static struct fi_info* chooseProvider(struct fi_info* list, const char* prov, const char* iface) {
  struct fi_info* best = NULL;
  int bestRank = -1;
  for (struct fi_info* i = list; i != NULL; i = i->next) {
    int r = candidateRank(i, prov, iface);
    if (r > bestRank) best = i, bestRank = r;
  }
  return best;
}

#define OFI_CHECK(call)                                                             \
  do {                                                                              \
    int e_ = (call);                                                                \
    if (e_ != 0)                                                                    \
      return GCOMM_ERROR(comm, gcommSystemError, -1, "%s: %s (provider %s)", #call, \
                         fi_strerror(-e_), net->info->fabric_attr->prov_name);      \
  } while (0)

/* The endpoints, with rxm's eager limit raised to a FIFO slot. rxm (over tcp) sends a message
 * above its limit (16 KB by default) by rendezvous: a request, the receiver's read request, then
 * the data, each leg waiting for the other rank to poll; an eager message goes at once and lands
 * straight in the posted receive. Every data message here has its receive posted before it is
 * sent (the credits), so none needs rendezvous's flow control (2 pretend nodes over tcp, 2 shared
 * cores: 1 MB all-reduce 568 against 681 us, 4 MB 2542 against 2877, medians of 5: docs/PERF.md).
 * rxm reads the limit from the environment when the endpoint opens and has no other way to set
 * it: gcomm sets the variable for that call only, unless the user did (every rank must agree;
 * rxm refuses connections between different limits). Other providers ignore it. */
static gcommResult_t openEndpoints(gcommComm_t comm, struct gcommNet* net) {
  static const char* const var = "FI_OFI_RXM_EAGER_LIMIT";
  int mine = getenv(var) == NULL;
  if (mine) {
    char val[32];
    snprintf(val, sizeof(val), "%zu", comm->slotBytes);
    setenv(var, val, 0);
  }
  int err = 0;
  for (int e = 0; e < net->nEps && err == 0; e++)
    err = fi_endpoint(net->domain, net->info, &net->eps[e], NULL);
  if (mine) unsetenv(var);
  OFI_CHECK(err);
  return gcommSuccess;
}

/* The hints: tagged reliable datagrams, the mr_mode bits gcomm honours (regMem), and FI_HMEM with
 * FI_MR_HMEM (GPU memory, registered like the rest) when hmem is set. prov and domain: NULL, or
 * the names to match. */
static struct fi_info* makeHints(const char* prov, const char* domain, int hmem) {
  struct fi_info* hints = fi_allocinfo();
  if (hints == NULL) return NULL;
  hints->caps = FI_TAGGED | FI_SEND | FI_RECV | (hmem ? FI_HMEM : 0);
  hints->ep_attr->type = FI_EP_RDM;
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY |
                                FI_MR_ENDPOINT | (hmem ? FI_MR_HMEM : 0);
  hints->domain_attr->threading = FI_THREAD_DOMAIN;
  hints->domain_attr->cq_data_size =
      4; /* each message carries its call's tag (the mismatch check) */
  hints->fabric_attr->prov_name = prov ? strdup(prov) : NULL;
  hints->domain_attr->name = domain ? strdup(domain) : NULL;
  if ((prov && !hints->fabric_attr->prov_name) || (domain && !hints->domain_attr->name)) {
    fi_freeinfo(hints);
    return NULL;
  }
  return hints;
}

#ifdef GCOMM_GPU
/* A GPU communicator's endpoint: the provider and domain chosen by the usual rules, asked again
 * with FI_HMEM. Offered (and GCOMM_NET_GDR not 0): its info replaces net->info and net->hmem is
 * set; else the endpoint stays as chosen and net->hmemWhy says why (GCOMM_NET_GDR=1: an error). */
static gcommResult_t hmemInfo(gcommComm_t comm, struct gcommNet* net) {
  const char* prov = net->info->fabric_attr->prov_name;
  if (comm->params.netGdr == GCOMM_NET_GDR_OFF) {
    net->hmemWhy = "GCOMM_NET_GDR=0";
    return gcommSuccess;
  }
  struct fi_info* hints = makeHints(prov, net->info->domain_attr->name, 1);
  struct fi_info* list = NULL;
  if (hints == NULL) return GCOMM_ERROR(comm, gcommSystemError, -1, "out of memory");
  int err = fi_getinfo(NET_FI_VERSION, NULL, NULL, 0, hints, &list);
  fi_freeinfo(hints);
  struct fi_info* got = list;
  while (got != NULL && !(got->caps & FI_HMEM)) got = got->next;
  if (got == NULL) {
    fi_freeinfo(list);
    net->hmemWhy = "the provider does not offer FI_HMEM";
    if (comm->params.netGdr == GCOMM_NET_GDR_ON)
      return GCOMM_ERROR(comm, gcommInvalidUsage, -1,
                         "GCOMM_NET_GDR=1 but provider %s (domain %s) does not offer FI_HMEM "
                         "(%s; fi_info -c FI_HMEM lists those that do)",
                         prov, net->info->domain_attr->name, err ? fi_strerror(-err) : "no match");
    return gcommSuccess;
  }
  struct fi_info* dup = fi_dupinfo(got);
  fi_freeinfo(list);
  if (dup == NULL) return GCOMM_ERROR(comm, gcommSystemError, -1, "fi_dupinfo failed");
  fi_freeinfo(net->info);
  net->info = dup;
  net->hmem = 1;
  return gcommSuccess;
}

/* Whether the provider moves GPU memory with CUDA calls of its own, as shm does (cudaMemcpy, from
 * the progress thread, on the legacy default stream), rather than by the NIC's access to it: it
 * refuses the promise not to (FI_OPT_CUDA_API_PERMITTED=false, libfabric 1.18, as NCCL's plugins
 * ask; set before the endpoint is enabled). Such copies wait for every kernel on a blocking stream,
 * the kernel waiting for their data: GCOMM_NET_GDR=auto stages instead, 1 takes the provider for
 * non-blocking streams. And a copy between GPU buffers returns before it is done: a receive's
 * completion needs gcommDeviceNetFence before the kernel may read the slot. */
static int providerCallsCuda(struct gcommNet* net) {
#if defined(GCOMM_CUDA) && \
    FI_VERSION_GE(FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION), FI_VERSION(1, 18))
  bool permitted = false;
  int calls = 0;
  for (int e = 0; e < net->nEps; e++)
    calls |= fi_setopt(&net->eps[e]->fid, FI_OPT_ENDPOINT, FI_OPT_CUDA_API_PERMITTED, &permitted,
                       sizeof(permitted)) != 0;
  return calls;
#else
  (void)net;
  return 1; /* no way to ask: assume it does */
#endif
}

int gcommNetDeviceMemory(gcommComm_t comm, const char** why) {
  struct gcommNet* net = comm->net;
  *why = net == NULL ? "no network" : net->hmemWhy;
  return net != NULL && net->hmem;
}
#endif

/* fi_getinfo with the hints for prov (NULL: any): 0 or a negative fi_errno. */
static int providerList(const char* prov, struct fi_info** list) {
  struct fi_info* hints = makeHints(prov, NULL, 0);
  if (hints == NULL) return -FI_ENOMEM;
  int err = fi_getinfo(NET_FI_VERSION, NULL, NULL, 0, hints, list);
  fi_freeinfo(hints);
  return err;
}

static gcommResult_t openFabric(gcommComm_t comm, struct gcommNet* net) {
  const char* prov = comm->params.ofiProvider;
  const char* iface = comm->params.ofiIface;
  struct fi_info* list = NULL;
  int err = providerList(prov, &list);
  if (err != 0)
    return GCOMM_ERROR(comm, gcommSystemError, -1,
                       "fi_getinfo found no tagged reliable-datagram provider%s%s: %s "
                       "(fi_info -t FI_EP_RDM lists them; GCOMM_OFI_PROVIDER chooses)",
                       prov ? " named " : "", prov ? prov : "", fi_strerror(-err));
  struct fi_info* best = chooseProvider(list, prov, iface);
  if (best == NULL) {
    fi_freeinfo(list);
    return GCOMM_ERROR(comm, gcommSystemError, -1,
                       "no usable libfabric provider%s%s (set GCOMM_OFI_PROVIDER, e.g. tcp)",
                       iface ? " on interface " : "", iface ? iface : "");
  }
  net->info = fi_dupinfo(best);
  fi_freeinfo(list);
  if (net->info == NULL) return GCOMM_ERROR(comm, gcommSystemError, -1, "fi_dupinfo failed");
  net->hmemWhy = "a host communicator";
#ifdef GCOMM_GPU
  if (comm->device >= 0) GCOMM_CHECK(hmemInfo(comm, net));
#endif

  OFI_CHECK(fi_fabric(net->info->fabric_attr, &net->fabric, NULL));
  OFI_CHECK(fi_domain(net->fabric, net->info, &net->domain, NULL));
  struct fi_av_attr avAttr;
  memset(&avAttr, 0, sizeof(avAttr));
  avAttr.type = FI_AV_TABLE;
  avAttr.count = (size_t)comm->nranks * NET_MAX_ENDPOINTS;
  OFI_CHECK(fi_av_open(net->domain, &avAttr, &net->av, NULL));
  struct fi_cq_attr cqAttr;
  memset(&cqAttr, 0, sizeof(cqAttr));
  cqAttr.format = FI_CQ_FORMAT_TAGGED;
  cqAttr.wait_obj = FI_WAIT_NONE;
  /* at most STEPS data operations per connection, 2 connections per (peer, lane), one credit
   * receive per sending connection and one credit send per receiving one; a stop and a revoke
   * from and to each rank; two boxes from and to each */
  cqAttr.size = (size_t)comm->nranks * (comm->nLanes * (2 * GCOMM_STEPS + 2) + 8) + 64;
  OFI_CHECK(fi_cq_open(net->domain, &cqAttr, &net->cq, NULL));
  /* a registration bound to one endpoint (FI_MR_ENDPOINT) serves that one only: then one */
  net->nEps =
      (net->info->domain_attr->mr_mode & FI_MR_ENDPOINT) ? 1 : (int)comm->params.netEndpoints;
  OFI_CHECK(openEndpoints(comm, net));
#ifdef GCOMM_GPU
  if (net->hmem) net->hmemCopies = providerCallsCuda(net);
  if (net->hmemCopies && comm->params.netGdr == GCOMM_NET_GDR_AUTO) {
    net->hmem = net->hmemCopies = 0;
    net->hmemWhy =
        "the provider moves GPU memory with CUDA calls of its own, which wait for "
        "kernels on blocking streams (GCOMM_NET_GDR=1 takes it for non-blocking streams)";
  }
#endif
  GCOMM_INFO(GCOMM_SUBSYS_NET | GCOMM_SUBSYS_INIT, comm,
             "provider %s, fabric %s, domain %s, mr_mode 0x%x, inject %zu bytes, %d endpoint%s, "
             "GPU memory (FI_HMEM): %s%s",
             net->info->fabric_attr->prov_name, net->info->fabric_attr->name,
             net->info->domain_attr->name, (unsigned)net->info->domain_attr->mr_mode,
             net->info->tx_attr->inject_size, net->nEps, net->nEps > 1 ? "s" : "",
             net->hmem ? "yes" : "no: ", net->hmem ? "" : net->hmemWhy);
  for (int e = 0; e < net->nEps; e++) {
    OFI_CHECK(fi_ep_bind(net->eps[e], &net->av->fid, 0));
    OFI_CHECK(fi_ep_bind(net->eps[e], &net->cq->fid, FI_TRANSMIT | FI_RECV));
    OFI_CHECK(fi_enable(net->eps[e]));
  }
  /* credits go by fi_tinject, or else by fi_tsend from host memory with no descriptor */
  if (net->info->tx_attr->inject_size < sizeof(uint64_t) &&
      (net->info->domain_attr->mr_mode & FI_MR_LOCAL))
    return GCOMM_ERROR(comm, gcommSystemError, -1,
                       "provider %s can neither inject %zu bytes nor send them unregistered "
                       "(FI_MR_LOCAL): credits cannot go",
                       net->info->fabric_attr->prov_name, sizeof(uint64_t));
  return gcommSuccess;
}

int gcommNetCandidates(const gcommParams_t* params, gcommNetCandidate_t* out, int max, int* chosen,
                       const char** err) {
  struct fi_info* list = NULL;
  *chosen = -1;
  int rc = providerList(params->ofiProvider, &list);
  if (rc != 0) {
    *err = fi_strerror(-rc);
    return -1;
  }
  struct fi_info* best = chooseProvider(list, params->ofiProvider, params->ofiIface);
  int n = 0;
  for (struct fi_info* i = list; i != NULL && n < max; i = i->next, n++) {
    snprintf(out[n].prov, sizeof(out[n].prov), "%s", i->fabric_attr->prov_name);
    snprintf(out[n].fabric, sizeof(out[n].fabric), "%s", i->fabric_attr->name);
    snprintf(out[n].domain, sizeof(out[n].domain), "%s",
             i->domain_attr->name ? i->domain_attr->name : "");
    out[n].rank = candidateRank(i, params->ofiProvider, params->ofiIface);
    if (i == best) *chosen = n;
  }
  fi_freeinfo(list);
  return n;
}

/* Registers [buf, buf+len) for sends and receives as the provider's mr_mode asks: host memory
 * (device < 0), or GPU memory of that device (the endpoint has FI_HMEM). FI_MR_ALLOCATED: the
 * memory exists before (callers map or allocate it). FI_MR_PROV_KEY: the provider picks the key,
 * else a counter keeps requested keys unique in this communicator's own domain. FI_MR_ENDPOINT:
 * bound to the endpoint and enabled. FI_MR_LOCAL and FI_MR_HMEM: the descriptor goes with every
 * send and receive (it is passed whatever the mode). FI_MR_VIRT_ADDR only concerns RMA, unused. */
static gcommResult_t regMem(gcommComm_t comm, struct gcommNet* net, void* buf, size_t len,
                            int device, struct fid_mr** mr, void** desc) {
  struct iovec iov = {.iov_base = buf, .iov_len = len};
  struct fi_mr_attr attr;
  memset(&attr, 0, sizeof(attr));
  attr.mr_iov = &iov;
  attr.iov_count = 1;
  attr.access = FI_SEND | FI_RECV;
  attr.requested_key = net->nextKey++;
  attr.iface = FI_HMEM_SYSTEM;
#ifdef GCOMM_GPU
  if (device >= 0) {
#ifdef GCOMM_HIP
    attr.iface = FI_HMEM_ROCR;
#else
    attr.iface = FI_HMEM_CUDA;
    attr.device.cuda = device;
#endif
  }
#endif
  int e = fi_mr_regattr(net->domain, &attr, 0, mr);
  if (e != 0)
    return GCOMM_ERROR(comm, gcommSystemError, -1,
                       "fi_mr_regattr of %zu bytes of %s memory%s: %s (provider %s)", len,
                       device >= 0 ? "GPU" : "host", device >= 0 ? " (FI_HMEM)" : "",
                       fi_strerror(-e), net->info->fabric_attr->prov_name);
  if (net->info->domain_attr->mr_mode & FI_MR_ENDPOINT) {
    OFI_CHECK(fi_mr_bind(*mr, &net->eps[0]->fid, 0));
    OFI_CHECK(fi_mr_enable(*mr));
  }
  *desc = fi_mr_desc(*mr);
  return gcommSuccess;
}

gcommResult_t gcommNetRegister(gcommComm_t comm, void* buf, size_t len, int device) {
  struct gcommNet* net = comm->net;
  if (net == NULL || buf == NULL || len == 0 || (device >= 0 && !net->hmem))
    return GCOMM_ERROR(
        comm, gcommInternalError, -1, "gcommNetRegister: %zu bytes of %s memory (%s)", len,
        device >= 0 ? "GPU" : "host", net == NULL ? "no endpoint" : "bad arguments, or no FI_HMEM");
  netRegion_t* r = realloc(net->regions, (size_t)(net->nRegions + 1) * sizeof(*r));
  if (r == NULL) return GCOMM_ERROR(comm, gcommSystemError, -1, "out of memory");
  net->regions = r;
  r += net->nRegions;
  memset(r, 0, sizeof(*r));
  r->base = (uintptr_t)buf;
  r->len = len;
  gcommResult_t res = regMem(comm, net, buf, len, device, &r->mr, &r->desc);
  if (r->mr != NULL) net->nRegions++; /* gcommNetFree closes it, even when binding it failed */
  return res;
}

static gcommResult_t postFailed(gcommComm_t comm, netConn_t* nc, const char* what, uint64_t step,
                                ssize_t rc) {
  return GCOMM_ERROR(comm, gcommSystemError, nc->peer, "%s to/from rank %d lane %d step %llu: %s",
                     what, nc->peer, nc->lane, (unsigned long long)step, fi_strerror((int)-rc));
}

/* A receive or a credit failed: a receive may be one posted ahead for a later operation, a credit
 * only serves later ones, and a peer that destroyed its communicator resets its connections while
 * this rank may still finish its own part. So the failure waits until something needs the
 * connection (gcommConn_t.netFailure, and gcommNetProgress for slots filled for it). */
static void connFailed(netConn_t* nc, const char* msg) {
  if (nc->failure[0] != 0) return;
  snprintf(nc->failure, sizeof(nc->failure), "%s", msg);
  nc->conn->netFailure = nc->failure;
}

/* The request of step s's slot, taken for step s. */
static netReq_t* slotReq(netConn_t* nc, uint64_t s) {
  netReq_t* req = &nc->reqs[s % GCOMM_STEPS];
  req->nc = nc;
  req->step = s;
  return req;
}

/* Posts what can be posted on a sending connection: the credit receive, then sends of the filled
 * slots the receiver has receives for. -FI_EAGAIN: the provider needs progress (the CQ read). */
static gcommResult_t postSend(gcommComm_t comm, struct gcommNet* net, netConn_t* nc, int* moved) {
  if (nc->failure[0] != 0) /* its slots can never go: an error once some are filled */
    return __atomic_load_n(&nc->conn->fifo->tail, __ATOMIC_ACQUIRE) == nc->done
               ? gcommSuccess
               : GCOMM_ERROR(comm, gcommRemoteError, nc->peer, "%s", nc->failure);
  if (!nc->creditPosted) {
    nc->creditReq.nc = nc;
    nc->creditReq.kind = NET_CREDIT_RECV;
    ssize_t rc = fi_trecv(nc->ep, nc->creditBuf, sizeof(uint64_t), net->creditDesc, FI_ADDR_UNSPEC,
                          TAG_CREDIT | makeTag(nc->peer, nc->lane, 0), 0, &nc->creditReq.ctx);
    if (rc == 0) nc->creditPosted = 1;
    if (rc != 0 && rc != -FI_EAGAIN) return postFailed(comm, nc, "fi_trecv (credit)", 0, rc);
  }
  gcommFifo_t* f = nc->conn->fifo;
  uint64_t limit = __atomic_load_n(&f->tail, __ATOMIC_ACQUIRE);
  if (limit > nc->credit) limit = nc->credit;
  while (nc->posted < limit) {
    uint64_t s = nc->posted;
    int slot = (int)(s % GCOMM_STEPS);
    netReq_t* req = slotReq(nc, s);
    /* the slot's word: the payload size, and the call's tag in the completion data */
    uint64_t word = f->bytes[slot];
    const char* ref = nc->conn->refs ? nc->conn->refs[slot] : NULL;
    ssize_t rc =
        fi_tsenddata(nc->ep, ref ? ref : nc->conn->slots + (size_t)slot * nc->conn->slotBytes,
                     (size_t)(uint32_t)word, ref ? NULL : nc->desc, word >> 32, nc->addr,
                     makeTag(comm->rank, nc->lane, s), &req->ctx);
    if (rc == -FI_EAGAIN) break;
    if (rc != 0) return postFailed(comm, nc, "fi_tsenddata", s, rc);
    req->prof = GCOMM_PROF_ON(comm, gcommProfileNet)
                    ? gcommProfNetStart(comm, nc->peer, nc->lane, s, (size_t)(uint32_t)word, 1)
                    : NULL;
    nc->posted++;
    *moved = 1;
  }
  return gcommSuccess;
}

/* Whether a receiving connection owes its sender a credit. Credits are told lazily, once at most
 * half of the receives the sender knows of are still unmatched (credit - done): a credit for
 * every freed slot would put a message on the path of every small operation (and gcommWait
 * waits for owed credits), while the sender, with STEPS/2 receives left when this one leaves,
 * still never waits for it. gcommWait's threads read it too. */
static int creditDue(netConn_t* nc) {
  uint64_t told = __atomic_load_n(&nc->credit, __ATOMIC_RELAXED);
  return __atomic_load_n(&nc->posted, __ATOMIC_RELAXED) != told &&
         told - __atomic_load_n(&nc->done, __ATOMIC_RELAXED) <= GCOMM_STEPS / 2;
}

/* A receiving connection: receives into every free slot, then the credit that says so. */
static gcommResult_t postRecv(gcommComm_t comm, struct gcommNet* net, netConn_t* nc, int* moved) {
  if (nc->failure[0] != 0) return gcommSuccess; /* netFailure tells a step that waits */
  uint64_t limit = __atomic_load_n(&nc->conn->fifo->head, __ATOMIC_ACQUIRE) + GCOMM_STEPS;
  while (nc->posted < limit) {
    uint64_t s = nc->posted;
    int slot = (int)(s % GCOMM_STEPS);
    netReq_t* req = slotReq(nc, s);
    size_t len = nc->conn->slotBytes;
    uint64_t queuedUntil = UINT64_MAX;
    char* to =
        nc->conn->landed ? comm->netDirectTarget(comm, nc->conn, s, &len, &queuedUntil) : NULL;
    /* no queued operation takes step s: its receive waits for the one that does, which may take
     * it directly, except the first such step, so that the peer's next operation can start */
    if (s > queuedUntil) break;
    ssize_t rc = fi_trecv(nc->ep, to ? to : nc->conn->slots + (size_t)slot * nc->conn->slotBytes,
                          len, to ? NULL : nc->desc, FI_ADDR_UNSPEC, makeTag(nc->peer, nc->lane, s),
                          0, &req->ctx);
    if (rc == -FI_EAGAIN) break;
    if (rc != 0) return postFailed(comm, nc, "fi_trecv", s, rc);
    if (nc->conn->landed) nc->conn->landed[slot] = to;
    req->prof = GCOMM_PROF_ON(comm, gcommProfileNet)
                    ? gcommProfNetStart(comm, nc->peer, nc->lane, s, len, 0)
                    : NULL;
    __atomic_store_n(&nc->posted, s + 1, __ATOMIC_RELAXED); /* gcommNetSendsPending reads it */
    *moved = 1;
  }
  if (creditDue(nc) && !nc->creditInFlight) {
    uint64_t tag = TAG_CREDIT | makeTag(comm->rank, nc->lane, 0);
    ssize_t rc;
    if (net->info->tx_attr->inject_size >= sizeof(uint64_t)) {
      rc = fi_tinject(nc->ep, &nc->posted, sizeof(uint64_t), nc->addr, tag);
    } else { /* shm with FI_HMEM injects nothing: a send, one in flight per connection */
      nc->creditSent = nc->posted;
      nc->creditReq.nc = nc;
      nc->creditReq.kind = NET_CREDIT_SEND;
      rc = fi_tsend(nc->ep, &nc->creditSent, sizeof(uint64_t), NULL, nc->addr, tag,
                    &nc->creditReq.ctx);
      nc->creditInFlight = rc == 0;
    }
    if (rc == 0) __atomic_store_n(&nc->credit, nc->posted, __ATOMIC_RELAXED);
    if (rc != 0 && rc != -FI_EAGAIN) {
      char msg[sizeof(nc->failure)];
      snprintf(msg, sizeof(msg), "network credit to rank %d failed on lane %d: %s", nc->peer,
               nc->lane, fi_strerror((int)-rc));
      connFailed(nc, msg);
    }
  }
  return gcommSuccess;
}

gcommResult_t gcommNetConnect(gcommComm_t comm, gcommConn_t* conn, int peer, int lane, int isSend) {
  struct gcommNet* net = comm->net;
  if (net == NULL || peer < 0 || peer >= comm->nranks || !isRemote(comm, peer) || lane < 0 ||
      lane >= comm->nLanes || conn->fifo == NULL || conn->slots == NULL || conn->slotBytes == 0)
    return GCOMM_ERROR(comm, gcommInternalError, peer,
                       "gcommNetConnect: no network edge to rank %d lane %d (%s)", peer, lane,
                       net == NULL ? "no endpoint: every rank on one node" : "bad arguments");
  if (net->nConns == net->capConns) {
    int cap = net->capConns ? 2 * net->capConns : 64;
    netConn_t** c = realloc(net->conns, (size_t)cap * sizeof(*c));
    if (c == NULL) return GCOMM_ERROR(comm, gcommSystemError, peer, "out of memory");
    net->conns = c;
    net->capConns = cap;
  }
  netConn_t* nc = calloc(1, sizeof(*nc));
  if (nc == NULL) return GCOMM_ERROR(comm, gcommSystemError, peer, "out of memory");
  nc->conn = conn;
  nc->peer = peer;
  nc->lane = lane;
  nc->isSend = isSend;
  nc->ep = net->eps[lane % net->nEps];
  nc->addr = net->addrs[(size_t)peer * net->nEps + lane % net->nEps];
  nc->creditBuf = &net->credits[(size_t)peer * comm->nLanes + lane];
  size_t len = GCOMM_STEPS * conn->slotBytes;
  uintptr_t at = (uintptr_t)conn->slots;
  netRegion_t* in = NULL;
  for (int i = 0; i < net->nRegions && in == NULL; i++)
    if (at >= net->regions[i].base && at + len <= net->regions[i].base + net->regions[i].len)
      in = &net->regions[i];
  if (in != NULL) {
    nc->desc = in->desc;
  } else {
    gcommResult_t res = regMem(comm, net, conn->slots, len, -1, &nc->mr, &nc->desc);
    if (res != gcommSuccess) {
      free(nc);
      return res;
    }
  }
  /* the first STEPS receives now, before the caller's barrier: the sender starts with that
   * credit and no message needs to tell it */
  nc->credit = GCOMM_STEPS;
  if (!isSend) {
    int moved = 0;
    gcommResult_t res = postRecv(comm, net, nc, &moved);
    if (res == gcommSuccess && nc->posted != GCOMM_STEPS)
      res = GCOMM_ERROR(comm, gcommSystemError, peer,
                        "provider %s took only %llu of the first %d receives from rank %d",
                        net->info->fabric_attr->prov_name, (unsigned long long)nc->posted,
                        GCOMM_STEPS, peer);
    if (res != gcommSuccess) {
      if (nc->mr) fi_close(&nc->mr->fid);
      free(nc);
      return res;
    }
  }
  net->conns[net->nConns++] = nc;
  return gcommSuccess;
}

/* The host communicator's FIFOs for every remote peer and lane, [peer][lane][send, recv]: in one
 * registered region (GCOMM_NET_SHARED_BUFFERS=1), or one mapping and registration each. */
static gcommResult_t connectHostFifos(gcommComm_t comm, struct gcommNet* net, int nRemote) {
  size_t fb = gcommFifoBytes(comm->slotBytes);
  int shared = comm->params.netSharedBuffers != 0;
  if (shared) {
    net->regionBytes = fb * (size_t)nRemote * comm->nLanes * 2;
    net->region =
        mmap(NULL, net->regionBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (net->region == MAP_FAILED) {
      net->region = NULL;
      return GCOMM_ERROR(comm, gcommSystemError, -1, "out of memory for %zu bytes of network FIFOs",
                         net->regionBytes);
    }
    GCOMM_CHECK(gcommNetRegister(comm, net->region, net->regionBytes, -1));
  }
  int k = 0;
  for (int p = 0; p < comm->nranks; p++) {
    if (!isRemote(comm, p)) continue;
    for (int lane = 0; lane < comm->nLanes; lane++) {
      for (int isSend = 1; isSend >= 0; isSend--, k++) {
        gcommConn_t* c = isSend ? &comm->sendConns[lane * comm->nranks + p]
                                : &comm->recvConns[lane * comm->nranks + p];
        char* base =
            shared ? net->region + (size_t)k * fb
                   : mmap(NULL, fb, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (base == MAP_FAILED)
          return GCOMM_ERROR(comm, gcommSystemError, p, "out of memory for a network FIFO");
        c->fifo = (gcommFifo_t*)base;
        c->slots = base + sizeof(gcommFifo_t);
        c->step = 0;
        c->slotBytes = comm->slotBytes;
        c->peer = p;
        gcommResult_t res = gcommNetConnect(comm, c, p, lane, isSend);
        /* sends from and receives into the caller's buffers need a provider that wants no
         * registration for them */
        if (res == gcommSuccess && !(net->info->domain_attr->mr_mode & FI_MR_LOCAL)) {
          if (isSend)
            c->refs = net->conns[net->nConns - 1]->refs;
          else
            c->landed = net->conns[net->nConns - 1]->landed;
        }
        if (!shared && res == gcommSuccess) {
          net->conns[net->nConns - 1]->ownMem = base;
          net->conns[net->nConns - 1]->ownBytes = fb;
        } else if (!shared) {
          munmap(base, fb);
        }
        GCOMM_CHECK(res);
      }
    }
  }
  GCOMM_INFO(GCOMM_SUBSYS_NET | GCOMM_SUBSYS_INIT, comm,
             "%d remote ranks, %d network FIFOs of %zu bytes, %s (provider %s)", nRemote, k, fb,
             shared ? "one registered region" : "registered one by one",
             net->info->fabric_attr->prov_name);
  return gcommSuccess;
}

/* A send FIFO's head: the steps whose slots the kernel or executor may refill. A completed send
 * frees its slot, except with a provider that copies GPU memory with CUDA (shm, through a CUDA IPC
 * mapping of this slot): the send completes once the receiver has issued its copy, which may
 * still be reading. There the slot of step s is free once the receiver has posted a receive for
 * step s + STEPS (its credit passed it): it drained step s first, after its fence
 * (comm->netFence) saw the copy done. */
static void sendHead(struct gcommNet* net, netConn_t* nc) {
  uint64_t head = nc->done;
  if (net->hmemCopies && nc->credit < head + GCOMM_STEPS) head = nc->credit - GCOMM_STEPS;
  __atomic_store_n(&nc->conn->fifo->head, head, __ATOMIC_RELEASE);
}

static void completeData(struct gcommNet* net, netReq_t* req, size_t len, uint64_t tag) {
  netConn_t* nc = req->nc;
  gcommFifo_t* f = nc->conn->fifo;
  int slot = (int)(req->step % GCOMM_STEPS);
  if (!nc->isSend) f->bytes[slot] = GCOMM_SLOT_WORD(tag, len);
  nc->complete[slot] = 1;
  uint64_t done = nc->done;
  while (done < nc->posted && nc->complete[done % GCOMM_STEPS])
    nc->complete[done++ % GCOMM_STEPS] = 0;
  __atomic_store_n(&nc->done, done, __ATOMIC_RELAXED); /* creditDue, gcommNetSendsPending read it */
  if (nc->isSend)
    sendHead(net, nc);
  else
    __atomic_store_n(&f->tail, done, __ATOMIC_RELEASE);
}

/* Credits only grow: one that overtook a later one changes nothing. */
static void completeCredit(struct gcommNet* net, netConn_t* nc) {
  if (*nc->creditBuf > nc->credit) nc->credit = *nc->creditBuf;
  nc->creditPosted = 0;
  if (net->hmemCopies) sendHead(net, nc);
}

/* Posts one control receive of remote rank p (a stop or a revoke) into buf, unless posted.
 * Returns fi_trecv's answer (-FI_EAGAIN: a later pass). */
static ssize_t postControlRecv(struct gcommNet* net, int p, int kind, void* buf, size_t len,
                               netReq_t* req, int* posted) {
  if (*posted) return 0;
  req->kind = kind;
  req->peer = p;
  int lane = kind == NET_STOP_RECV ? STOP_LANE : REVOKE_LANE;
  ssize_t rc = fi_trecv(net->eps[0], buf, len, net->stopDesc, FI_ADDR_UNSPEC,
                        TAG_STOP | makeTag(p, lane, 0), 0, &req->ctx);
  *posted = rc == 0;
  return rc;
}

/* Posts the receives of every remote rank's stop and revoke not posted yet. */
static gcommResult_t postStopRecvs(gcommComm_t comm, struct gcommNet* net) {
  netStops_t* st = net->stops;
  for (int p = 0; p < comm->nranks && st->recvsLeft > 0; p++) {
    netStopPeer_t* sp = &st->peers[p];
    if (!isRemote(comm, p) || (sp->recvPosted && sp->revokePosted)) continue;
    ssize_t rc =
        postControlRecv(net, p, NET_STOP_RECV, &sp->in, sizeof(sp->in), &sp->recv, &sp->recvPosted);
    if (rc == 0)
      rc = postControlRecv(net, p, NET_REVOKE_RECV, &sp->revokeIn, sizeof(sp->revokeIn),
                           &sp->revokeRecv, &sp->revokePosted);
    if (rc == -FI_EAGAIN) break;
    if (rc != 0)
      return GCOMM_ERROR(comm, gcommSystemError, p, "fi_trecv (the stop or revoke of rank %d): %s",
                         p, fi_strerror((int)-rc));
    st->recvsLeft--;
  }
  return gcommSuccess;
}

static gcommResult_t postAll(gcommComm_t comm, struct gcommNet* net, int* moved) {
  if (net->stops != NULL && net->stops->recvsLeft > 0) GCOMM_CHECK(postStopRecvs(comm, net));
  if (net->boxes != NULL && net->boxes->waiting > 0) sendBoxes(comm, net);
  for (int i = 0; i < net->nConns; i++) {
    netConn_t* nc = net->conns[i];
    GCOMM_CHECK(nc->isSend ? postSend(comm, net, nc, moved) : postRecv(comm, net, nc, moved));
  }
  return gcommSuccess;
}

/* A box completed: a received one is ready to read (or, one whose round was given up, its slot
 * free again; a failed receive is posted again when asked for), a send is done. */
static void completeBox(struct gcommNet* net, netReq_t* req, int err) {
  int parity = (int)req->step;
  if (req->kind == NET_BOX_SEND) {
    net->boxes->sendsLeft[parity]--;
    net->boxes->peers[req->peer].sendState[parity] = SEND_NONE;
    return;
  }
  netBoxPeer_t* bp = &net->boxes->peers[req->peer];
  bp->state[parity] = err == 0 && bp->state[parity] == BOX_POSTED ? BOX_DONE : BOX_FREE;
}

/* A control message completed (err: 0, or the failure's fi_errno): a remote rank's stop becomes
 * its status, code last, with release (the probes read it); its revoke, the first one, becomes
 * net->stops->revokedBy; a send of this rank's stop or revoke is done. A stop or revoke receive
 * is not posted again: a rank stops once, and one revoke is enough. */
static void completeControl(struct gcommNet* net, netReq_t* req, int err) {
  if (req->kind == NET_BOX_RECV || req->kind == NET_BOX_SEND) {
    completeBox(net, req, err);
    return;
  }
  netStopPeer_t* sp = &net->stops->peers[req->peer];
  if (req->kind == NET_STOP_SEND || req->kind == NET_REVOKE_SEND) {
    *(req->kind == NET_STOP_SEND ? &sp->sendState : &sp->revokeState) = 2;
    net->stops->inFlight--;
    return;
  }
  if (err != 0) return;
  if (req->kind == NET_REVOKE_RECV) {
    int expected = 0;
    __atomic_compare_exchange_n(&net->stops->revokedBy, &expected, 1 + sp->revokeIn, 0,
                                __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
    return;
  }
  memcpy(sp->status.msg, sp->in.msg, sizeof(sp->status.msg));
  sp->status.msg[sizeof(sp->status.msg) - 1] = 0;
  __atomic_store_n(&sp->status.code, sp->in.code != 0 ? sp->in.code : (int)gcommRemoteError,
                   __ATOMIC_RELEASE);
}

/* The completion queue's error entry: a failed stop is done; a failed receive or credit waits
 * for whatever needs its connection (connFailed); data this rank sent and lost fails the
 * communicator now. */
static gcommResult_t readCqError(gcommComm_t comm, struct gcommNet* net, int* moved) {
  struct fi_cq_err_entry e;
  memset(&e, 0, sizeof(e));
  if (fi_cq_readerr(net->cq, &e, 0) < 0)
    return GCOMM_ERROR(comm, gcommSystemError, -1, "fi_cq_readerr failed");
  netReq_t* req = (netReq_t*)e.op_context;
  *moved = 1;
  if (req != NULL && req->kind >= NET_STOP_RECV) {
    completeControl(net, req, e.err);
    return gcommSuccess;
  }
  int peer = req ? req->nc->peer : -1;
  char buf[256];
  const char* what = fi_cq_strerror(net->cq, e.prov_errno, e.err_data, buf, sizeof(buf));
  /* a receive into the caller's memory (comm->netDirectTarget) takes the expected size only */
  if (e.err == FI_ETRUNC && req && req->kind == NET_DATA && !req->nc->isSend)
    what =
        "the message is longer than this rank's call expects: the ranks made different "
        "calls (counts)";
  char msg[sizeof(req->nc->failure)];
  snprintf(msg, sizeof(msg), "network %s %s rank %d failed on lane %d step %llu: %s (%s)",
           req && req->kind != NET_DATA ? "credit"
           : req && req->nc->isSend     ? "send"
                                        : "receive",
           req && req->nc->isSend ? "to" : "from", peer, req ? req->nc->lane : -1,
           req ? (unsigned long long)req->step : 0ull, fi_strerror(e.err), what ? what : "");
  if (req == NULL || (req->nc->isSend && req->kind == NET_DATA)) /* data this rank sent is lost */
    return GCOMM_ERROR(comm, gcommRemoteError, peer, "%s", msg);
  connFailed(req->nc, msg);
  if (req->kind == NET_CREDIT_SEND) req->nc->creditInFlight = 0;
  if (req->kind == NET_CREDIT_RECV) req->nc->creditPosted = 0;
  return gcommSuccess;
}

/* Handles n completions read from the queue. */
static gcommResult_t completeEntries(gcommComm_t comm, struct gcommNet* net,
                                     const struct fi_cq_tagged_entry* ent, ssize_t n) {
#ifdef GCOMM_GPU
  /* received into GPU memory by copies that may still run (providerCallsCuda) or by a NIC
   * whose writes may still be in flight: done before any tail advances */
  int gpuRecv = 0;
  for (ssize_t k = 0; k < n && net->hmem && !gpuRecv; k++) {
    netReq_t* req = (netReq_t*)ent[k].op_context;
    gpuRecv = req->kind == NET_DATA && !req->nc->isSend;
  }
  if (gpuRecv) GCOMM_CHECK(comm->netFence(comm, net->hmemCopies));
#endif
  for (ssize_t k = 0; k < n; k++) {
    netReq_t* req = (netReq_t*)ent[k].op_context;
    if (req->kind >= NET_STOP_RECV) {
      completeControl(net, req, 0);
    } else if (req->kind == NET_CREDIT_SEND) { /* the next credit may go */
      req->nc->creditInFlight = 0;
    } else if (req->kind == NET_CREDIT_RECV) {
      completeCredit(net, req->nc);
    } else {
      if (!req->nc->isSend && ent[k].len > req->nc->conn->slotBytes)
        return GCOMM_ERROR(comm, gcommInternalError, req->nc->peer, "received %zu bytes > slot",
                           ent[k].len);
      if (req->prof != NULL) gcommProfStop(comm, req->prof);
      completeData(net, req, ent[k].len,
                   (ent[k].flags & FI_REMOTE_CQ_DATA) ? (uint32_t)ent[k].data : 0);
    }
  }
  return gcommSuccess;
}

/* Reads the completion queue until it is empty; *got: any entry. */
static gcommResult_t readCq(gcommComm_t comm, struct gcommNet* net, int* got, int* moved) {
  net->lastReadNs = gcommNowNs();
  for (;;) {
    struct fi_cq_tagged_entry ent[16];
    ssize_t n = fi_cq_read(net->cq, ent, 16);
    if (n == -FI_EAGAIN) break;
    if (n == -FI_EAVAIL) {
      GCOMM_CHECK(readCqError(comm, net, moved));
      continue;
    }
    if (n < 0)
      return GCOMM_ERROR(comm, gcommSystemError, -1, "fi_cq_read: %s", fi_strerror((int)-n));
    GCOMM_CHECK(completeEntries(comm, net, ent, n));
    *got = 1;
    if (n < 16) break;
  }
  return gcommSuccess;
}

gcommResult_t gcommNetProgress(gcommComm_t comm, int* moved) {
  struct gcommNet* net = comm->net;
  if (net == NULL) return gcommSuccess;
  GCOMM_CHECK(postAll(comm, net, moved));
  int got = 0;
  GCOMM_CHECK(readCq(comm, net, &got, moved));
  /* freed slots can take new receives, completed sends and new credits let more sends go */
  if (got) {
    *moved = 1;
    GCOMM_CHECK(postAll(comm, net, moved));
  }
  return gcommSuccess;
}

/* Sends buf (this rank's stop or revoke, as kind says) to every remote rank not sent to yet. */
static void postControlSends(gcommComm_t comm, struct gcommNet* net, int kind, void* buf,
                             size_t len) {
  netStops_t* st = net->stops;
  int lane = kind == NET_STOP_SEND ? STOP_LANE : REVOKE_LANE;
  for (int p = 0; p < comm->nranks; p++) {
    netStopPeer_t* sp = &st->peers[p];
    int* state = kind == NET_STOP_SEND ? &sp->sendState : &sp->revokeState;
    if (!isRemote(comm, p) || *state != 0) continue;
    netReq_t* req = kind == NET_STOP_SEND ? &sp->send : &sp->revokeSend;
    req->kind = kind;
    req->peer = p;
    ssize_t rc = fi_tsend(net->eps[0], buf, len, net->stopDesc, net->addrs[(size_t)p * net->nEps],
                          TAG_STOP | makeTag(comm->rank, lane, 0), &req->ctx);
    if (rc == -FI_EAGAIN) break;
    *state = rc == 0 ? 1 : 2; /* a send that cannot be posted: that rank's deadline tells */
    st->inFlight += rc == 0;
  }
}

/* Sends this rank's stop (once it has one) and its revoke (once comm is revoked) to every remote
 * rank not sent to yet. */
static void postStopSends(gcommComm_t comm, struct gcommNet* net) {
  netStops_t* st = net->stops;
  if (!st->told && __atomic_load_n(&comm->stopCode, __ATOMIC_ACQUIRE) != 0) {
    st->out.code = __atomic_load_n(&comm->stopCode, __ATOMIC_ACQUIRE);
    memcpy(st->out.msg, comm->stopMsg, sizeof(st->out.msg));
    st->told = 1;
  }
  if (!st->revokeTold && __atomic_load_n(&comm->revoked, __ATOMIC_ACQUIRE) != 0) {
    st->revokeOut = __atomic_load_n(&comm->revoked, __ATOMIC_ACQUIRE) - 1;
    st->revokeTold = 1;
  }
  if (st->told) postControlSends(comm, net, NET_STOP_SEND, &st->out, sizeof(st->out));
  if (st->revokeTold)
    postControlSends(comm, net, NET_REVOKE_SEND, &st->revokeOut, sizeof(st->revokeOut));
}

/* Whether all this rank has to tell (its stop, its revoke) has gone out. */
static int stopsTold(gcommComm_t comm, struct gcommNet* net) {
  netStops_t* st = net->stops;
  return (st->told || __atomic_load_n(&comm->stopCode, __ATOMIC_ACQUIRE) == 0) &&
         (st->revokeTold || __atomic_load_n(&comm->revoked, __ATOMIC_ACQUIRE) == 0);
}

/* Whether this rank's stop or revoke still has to go somewhere (an abort in poll mode may have
 * left it to destroy). */
static int stopsPending(gcommComm_t comm, struct gcommNet* net) {
  netStops_t* st = net->stops;
  if (st == NULL) return 0;
  if (!stopsTold(comm, net) || st->inFlight > 0) return 1;
  if (net->boxes != NULL && net->boxes->waiting > 0) return 1;
  for (int p = 0; p < comm->nranks; p++)
    if (isRemote(comm, p) && ((st->told && st->peers[p].sendState == 0) ||
                              (st->revokeTold && st->peers[p].revokeState == 0)))
      return 1;
  return 0;
}

/* Posts and polls until this rank's stop (and its boxes) have gone to every remote rank, or for
 * at most ms milliseconds: most providers move messages only while polled, and the caller may
 * destroy the communicator as soon as its wait returned the error. */
static void flushStops(gcommComm_t comm, struct gcommNet* net, int ms) {
  uint64_t until = gcommNowNs() + (uint64_t)ms * 1000000;
  do {
    int got = 0, moved = 0;
    postStopSends(comm, net);
    if (net->boxes != NULL && net->boxes->waiting > 0) sendBoxes(comm, net);
    (void)readCq(comm, net, &got, &moved); /* the communicator has stopped already */
  } while (stopsPending(comm, net) && gcommNowNs() < until);
}

/* The communicator stopped: its stop (and its revoke, once revoked) goes to every remote rank
 * (the first time with up to STOP_FLUSH_MS of polling for it, then a little more on every stopped
 * pass). */
static void netStop(gcommComm_t comm) {
  struct gcommNet* net = comm->net;
  if (net == NULL || net->stops == NULL) return;
  flushStops(comm, net, stopsTold(comm, net) ? 0 : STOP_FLUSH_MS);
}

/* 1 + the rank whose revoke came over the network, or 0. mayRead: the caller holds
 * progressLock, and when no pass has read the completion queue for LISTEN_NS it reads it, so that
 * a rank whose engine sleeps (it waits on nobody) learns of a revoke at its next call. */
#define LISTEN_NS 100000
static int netRevokedBy(gcommComm_t comm, int mayRead) {
  struct gcommNet* net = comm->net;
  if (net == NULL || net->stops == NULL) return 0;
  if (mayRead && gcommNowNs() - net->lastReadNs > LISTEN_NS) {
    int got = 0, moved = 0;
    if (net->stops->recvsLeft > 0) (void)postStopRecvs(comm, net);
    (void)readCq(comm, net, &got, &moved); /* a failure here is the next pass's to report */
  }
  return __atomic_load_n(&net->stops->revokedBy, __ATOMIC_ACQUIRE);
}

/* A remote rank's stop, once it sent one (its status: the code is 0 until then). */
static gcommStatus_t* netStatus(gcommComm_t comm, int rank) {
  struct gcommNet* net = comm->net;
  if (net == NULL || net->stops == NULL || !isRemote(comm, rank)) return NULL;
  return &net->stops->peers[rank].status;
}

/* The boxes' memory, registered at the first exchange with a remote rank. */
static gcommResult_t setupBoxes(gcommComm_t comm, struct gcommNet* net) {
  if (net->boxes != NULL) return gcommSuccess;
  size_t bytes = sizeof(netBoxes_t) + (size_t)comm->nranks * sizeof(netBoxPeer_t);
  net->boxes = calloc(1, bytes);
  if (net->boxes == NULL) return GCOMM_ERROR(comm, gcommSystemError, -1, "out of memory");
  gcommResult_t res = regMem(comm, net, net->boxes, bytes, -1, &net->boxMr, &net->boxDesc);
  if (res != gcommSuccess) {
    free(net->boxes);
    net->boxes = NULL;
  }
  return res;
}

/* Posts the box sends that wait (-FI_EAGAIN: a later call; another failure: given up, that
 * rank's deadline tells). */
static void sendBoxes(gcommComm_t comm, struct gcommNet* net) {
  netBoxes_t* bx = net->boxes;
  for (int q = 0; q < comm->nranks && bx->waiting > 0; q++)
    for (int parity = 0; parity < 2; parity++) {
      netBoxPeer_t* bp = &bx->peers[q];
      if (bp->sendState[parity] != SEND_WAITING) continue;
      gcommBox_t* box = &bx->out[parity];
      netReq_t* req = &bp->send[parity];
      req->kind = NET_BOX_SEND;
      req->peer = q;
      req->step = (uint64_t)parity;
      ssize_t rc = fi_tsend(net->eps[0], box, offsetof(gcommBox_t, data) + box->bytes, net->boxDesc,
                            net->addrs[(size_t)q * net->nEps],
                            TAG_BOX | makeTag(comm->rank, 0, box->round), &req->ctx);
      if (rc == -FI_EAGAIN) continue;
      bx->waiting--;
      bp->sendState[parity] = rc == 0 ? SEND_IN_FLIGHT : SEND_NONE;
      bx->sendsLeft[parity] += rc == 0;
    }
}

/* This rank's box of an exchange to every remote rank of ranks[0..n), once the sends of the same
 * parity two rounds ago are done (polled until deadline; those not posted yet are given up). */
static gcommResult_t netBoxPost(gcommComm_t comm, const gcommBox_t* mine, const int* ranks, int n,
                                uint64_t deadline) {
  struct gcommNet* net = comm->net;
  int any = 0;
  for (int i = 0; i < n && net != NULL; i++) any |= isRemote(comm, ranks[i]);
  if (!any) return gcommSuccess;
  GCOMM_CHECK(setupBoxes(comm, net));
  netBoxes_t* bx = net->boxes;
  int parity = (int)(mine->round % 2);
  for (int q = 0; q < comm->nranks; q++)
    if (bx->peers[q].sendState[parity] == SEND_WAITING)
      bx->peers[q].sendState[parity] = SEND_NONE, bx->waiting--;
  while (bx->sendsLeft[parity] > 0) {
    if (gcommNowNs() > deadline)
      return GCOMM_ERROR(comm, gcommTimeout, -1,
                         "the boxes of exchange %llu have not all gone to the other nodes",
                         (unsigned long long)mine->round - 2);
    int got = 0, moved = 0;
    GCOMM_CHECK(readCq(comm, net, &got, &moved));
  }
  memcpy(&bx->out[parity], mine, offsetof(gcommBox_t, data) + mine->bytes);
  for (int i = 0; i < n; i++)
    if (isRemote(comm, ranks[i]) && bx->peers[ranks[i]].sendState[parity] == SEND_NONE)
      bx->peers[ranks[i]].sendState[parity] = SEND_WAITING, bx->waiting++;
  sendBoxes(comm, net);
  return gcommSuccess;
}

/* Gets the slot of round's parity ready for remote rank q's box of round: an older round's box
 * nobody reads any more is dropped, an older receive that never came cancelled (its slot is free
 * once the cancellation completes), then the receive posted. */
static void postBoxRecv(struct gcommNet* net, int q, uint64_t round) {
  netBoxPeer_t* bp = &net->boxes->peers[q];
  int parity = (int)(round % 2);
  if (bp->round[parity] != round && bp->state[parity] == BOX_DONE) bp->state[parity] = BOX_FREE;
  if (bp->round[parity] != round && bp->state[parity] == BOX_POSTED) {
    fi_cancel(&net->eps[0]->fid, &bp->recv[parity].ctx);
    bp->state[parity] = BOX_CANCELLING;
  }
  if (bp->state[parity] != BOX_FREE) return;
  netReq_t* req = &bp->recv[parity];
  req->kind = NET_BOX_RECV;
  req->peer = q;
  req->step = (uint64_t)parity;
  if (fi_trecv(net->eps[0], &bp->in[parity], sizeof(bp->in[parity]), net->boxDesc, FI_ADDR_UNSPEC,
               TAG_BOX | makeTag(q, 0, round), 0, &req->ctx) == 0) {
    bp->state[parity] = BOX_POSTED;
    bp->round[parity] = round;
  }
}

/* Remote rank q's box of round once it came, else NULL (a failed post or read is tried again at
 * the next call; the caller's deadline ends it). */
static const gcommBox_t* netBoxRead(gcommComm_t comm, int q, uint64_t round) {
  struct gcommNet* net = comm->net;
  if (net == NULL || net->boxes == NULL || !isRemote(comm, q)) return NULL;
  netBoxPeer_t* bp = &net->boxes->peers[q];
  int parity = (int)(round % 2);
  if (bp->state[parity] != BOX_DONE || bp->round[parity] != round) {
    sendBoxes(comm, net);
    postBoxRecv(net, q, round);
    int got = 0, moved = 0;
    (void)readCq(comm, net, &got, &moved);
  }
  return bp->state[parity] == BOX_DONE && bp->round[parity] == round ? &bp->in[parity] : NULL;
}

/* Memory registered for every remote rank's stop. The receives are posted by the first progress
 * pass (postAll), after the FIFOs' first receives and the ranks' barrier: a stop sent before is
 * kept by the provider as an unexpected message. Posted here, before the FIFOs' receives, they
 * made tcp (rxm, libfabric 1.17) under Open MPI's mpirun stall the first all-reduce of 6 ranks
 * on 3 pretend nodes, polled, in most runs. */
static gcommResult_t setupStops(gcommComm_t comm, struct gcommNet* net) {
  size_t bytes = sizeof(netStops_t) + (size_t)comm->nranks * sizeof(netStopPeer_t);
  net->stops = calloc(1, bytes);
  if (net->stops == NULL) return GCOMM_ERROR(comm, gcommSystemError, -1, "out of memory");
  for (int p = 0; p < comm->nranks; p++) net->stops->recvsLeft += isRemote(comm, p);
  return regMem(comm, net, net->stops, bytes, -1, &net->stopMr, &net->stopDesc);
}

int gcommNetSendsPending(gcommComm_t comm, int withCredits) {
  struct gcommNet* net = comm->net;
  if (net == NULL || __atomic_load_n(&comm->asyncError, __ATOMIC_ACQUIRE) != gcommSuccess) return 0;
  for (int i = 0; i < net->nConns; i++) {
    netConn_t* nc = net->conns[i];
    /* a send FIFO's head may wait for a credit after its sends completed (sendHead) */
    if (nc->isSend ? __atomic_load_n(&nc->conn->fifo->tail, __ATOMIC_ACQUIRE) !=
                         __atomic_load_n(&nc->done, __ATOMIC_RELAXED)
                   : withCredits && nc->failure[0] == 0 && creditDue(nc))
      return 1;
  }
  return 0;
}

gcommResult_t gcommNetSetup(gcommComm_t comm) {
  int nRemote = 0, anyRemote = 0;
  for (int p = 0; p < comm->nranks; p++) {
    nRemote += isRemote(comm, p);
    anyRemote |= comm->cards[p].hostId != comm->cards[0].hostId;
  }
  if (!anyRemote) return gcommSuccess; /* one node: every rank agrees, nothing to set up */
  if (comm->nranks > (1 << TAG_RANK_BITS) || comm->nLanes > (1 << TAG_LANE_BITS))
    return GCOMM_ERROR(comm, gcommInvalidUsage, -1,
                       "the network tags hold at most %d ranks and %d lanes", 1 << TAG_RANK_BITS,
                       1 << TAG_LANE_BITS);
  struct gcommNet* net = calloc(1, sizeof(*net));
  netCard_t mine, *all = calloc(comm->nranks, sizeof(netCard_t));
  if (net == NULL || all == NULL) {
    free(net);
    free(all);
    return GCOMM_ERROR(comm, gcommSystemError, -1, "out of memory");
  }
  comm->net = net;
  net->addrs = calloc((size_t)comm->nranks * NET_MAX_ENDPOINTS, sizeof(fi_addr_t));
  net->credits = calloc((size_t)comm->nranks * comm->nLanes, sizeof(uint64_t));
  gcommResult_t res = net->addrs && net->credits
                          ? openFabric(comm, net)
                          : GCOMM_ERROR(comm, gcommSystemError, -1, "out of memory");
  if (res == gcommSuccess)
    res = regMem(comm, net, net->credits, (size_t)comm->nranks * comm->nLanes * sizeof(uint64_t),
                 -1, &net->creditMr, &net->creditDesc);

  /* every rank takes part in the exchange, failed or not, so that none waits alone */
  memset(&mine, 0, sizeof(mine));
  if (res == gcommSuccess) {
    mine.nEps = net->nEps;
    for (int ep = 0; ep < net->nEps && res == gcommSuccess; ep++) {
      size_t len = sizeof(mine.addr[ep]);
      int e = fi_getname(&net->eps[ep]->fid, mine.addr[ep], &len);
      if (e != 0) res = GCOMM_ERROR(comm, gcommSystemError, -1, "fi_getname: %s", fi_strerror(-e));
    }
    snprintf(mine.prov, sizeof(mine.prov), "%s", net->info->fabric_attr->prov_name);
  }
  mine.ok = res == gcommSuccess;
  /* MPI's, or (a shrunk communicator) through its parent's pages and network */
  gcommResult_t exchanged = comm->allgather(comm, &mine, sizeof(mine), all);
  if (exchanged != gcommSuccess && res == gcommSuccess) res = exchanged;
  for (int p = 0; p < comm->nranks && res == gcommSuccess; p++) {
    if (!all[p].ok) {
      res =
          GCOMM_ERROR(comm, gcommRemoteError, p, "rank %d could not open its network endpoint", p);
    } else if (strcmp(all[p].prov, mine.prov) != 0) {
      res = GCOMM_ERROR(comm, gcommInvalidUsage, p,
                        "rank %d uses provider %s, this rank %s "
                        "(set GCOMM_OFI_PROVIDER the same everywhere)",
                        p, all[p].prov, mine.prov);
    } else if (all[p].nEps != mine.nEps) {
      res = GCOMM_ERROR(comm, gcommInvalidUsage, p,
                        "rank %d has %d network endpoints, this rank %d "
                        "(set GCOMM_NET_ENDPOINTS the same everywhere)",
                        p, all[p].nEps, mine.nEps);
    } else if (isRemote(comm, p)) {
      for (int ep = 0; ep < net->nEps && res == gcommSuccess; ep++)
        if (fi_av_insert(net->av, all[p].addr[ep], 1, &net->addrs[(size_t)p * net->nEps + ep], 0,
                         NULL) != 1)
          res = GCOMM_ERROR(comm, gcommSystemError, p,
                            "fi_av_insert of rank %d's address %d failed", p, ep);
    }
  }
  free(all);
  if (res != gcommSuccess) return res;
  GCOMM_CHECK(setupStops(comm, net));
  /* GPU communicators connect FIFOs of their own (transports/p2p.c, gcommNetConnect) */
  if (comm->device != GCOMM_DEVICE_HOST) return gcommSuccess;
  return connectHostFifos(comm, net, nRemote);
}

void gcommNetFree(gcommComm_t comm) {
  struct gcommNet* net = comm->net;
  if (net == NULL) return;
  if (stopsPending(comm, net)) flushStops(comm, net, STOP_FLUSH_MS);
  /* closing the endpoints cancels the receives still posted; registrations and the CQ go after */
  for (int e = 0; e < NET_MAX_ENDPOINTS; e++)
    if (net->eps[e]) fi_close(&net->eps[e]->fid);
  for (int i = 0; i < net->nConns; i++) {
    netConn_t* nc = net->conns[i];
    if (nc->mr) fi_close(&nc->mr->fid);
    if (nc->ownMem) munmap(nc->ownMem, nc->ownBytes);
    free(nc);
  }
  for (int i = 0; i < net->nRegions; i++) fi_close(&net->regions[i].mr->fid);
  if (net->creditMr) fi_close(&net->creditMr->fid);
  if (net->stopMr) fi_close(&net->stopMr->fid);
  if (net->boxMr) fi_close(&net->boxMr->fid);
  if (net->av) fi_close(&net->av->fid);
  if (net->cq) fi_close(&net->cq->fid);
  if (net->domain) fi_close(&net->domain->fid);
  if (net->fabric) fi_close(&net->fabric->fid);
  if (net->info) fi_freeinfo(net->info);
  if (net->region) munmap(net->region, net->regionBytes);
  free(net->conns);
  free(net->regions);
  free(net->addrs);
  free(net->credits);
  free(net->stops);
  free(net->boxes);
  free(net);
  comm->net = NULL;
}

/* Whether the engine must poll rather than nap: most providers (tcp) progress only when polled,
 * while works are active or sends are not all out. */
static int netMustPoll(gcommComm_t comm) {
  return comm->net != NULL && (comm->nActiveWorks > 0 || gcommNetSendsPending(comm, 0));
}

const gcommTransport_t gcommNetTransport = {
    .name = "network (libfabric)",
    .connect = gcommNetSetup,
    .connectWhat = "network setup",
    .progress = gcommNetProgress,
    .pending = gcommNetSendsPending,
    .mustPoll = netMustPoll,
    .stop = netStop,
    .status = netStatus,
    .revokedBy = netRevokedBy,
    .boxPost = netBoxPost,
    .boxRead = netBoxRead,
    /* first: its receives may land in a GPU communicator's pinned FIFOs */
    .close = gcommNetFree,
};
