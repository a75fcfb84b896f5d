/*
 * transports/net_ofi.c - connections to ranks on other nodes through libfabric (make OFI=1).
 *
 * The executor only sees FIFOs, the same gcommFifo_t as shared memory; this file is the proxy
 * that moves FIFO slots over the network. For a remote peer on one lane:
 *
 *   sender's FIFO, in the sender's own (registered) memory: the executor fills slot tail % STEPS
 *     and advances tail. Every progress pass posts fi_tsend for each slot between `posted` and
 *     tail; when a send completes, the slot is free again and head advances (over the
 *     contiguous prefix of completed steps: completions may come out of order).
 *   receiver's FIFO, in the receiver's (registered) memory: a fi_trecv is kept posted into every
 *     free slot, steps head .. head+STEPS-1. A completed receive records its byte count in
 *     fifo->bytes[] and tail advances over the contiguous prefix of completed steps. The executor
 *     drains slots and advances head; the next pass re-posts receives into the freed slots.
 *
 * Flow control: a sender has at most STEPS unfinished sends per connection, and sends are posted
 * with FI_DELIVERY_COMPLETE where the provider has it (a send completes only once it has landed
 * in the posted receive, which the receiver posts only into a free slot). A message that arrives
 * before its receive is posted waits in the provider's unexpected-message path; nothing is ever
 * written into a slot the executor still reads.
 *
 * Tags (60 bits, the top 4 left to providers that reserve them):
 *   bits 36..55  sender's rank (20 bits)      bits 28..35  lane (8 bits)
 *   bits  0..27  step modulo 2^28 (at most STEPS steps of a connection are ever in flight)
 * Receives are posted for exact tags (ignore mask 0) from FI_ADDR_UNSPEC: the tag names the sender.
 *
 * Everything here runs on the progress engine (under comm->progressLock): the CQ is read only by
 * gcommNetProgress, called from progressPass; setup and teardown run at init and destroy.
 * One fabric, domain, endpoint, CQ, AV and memory region per communicator.
 */
#define _GNU_SOURCE
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
#define NET_ADDR_MAX 240

typedef struct netConn netConn_t;
typedef struct {
  struct fi_context2 ctx; /* first: the completion's op_context points here */
  netConn_t* nc;
  uint64_t step;
  void* prof; /* the profiler's Net event, or NULL */
} netReq_t;

struct netConn {
  gcommConn_t* conn; /* the executor's view: fifo, slots */
  int peer, lane, isSend;
  fi_addr_t addr;
  uint64_t posted; /* send: next step to post; recv: next step whose receive is posted */
  uint64_t done;   /* every step below is complete (send: = fifo->head; recv: = fifo->tail) */
  uint8_t complete[GCOMM_STEPS];
  netReq_t reqs[GCOMM_STEPS];
};

struct gcommNet {
  struct fi_info* info;
  struct fid_fabric* fabric;
  struct fid_domain* domain;
  struct fid_av* av;
  struct fid_cq* cq;
  struct fid_ep* ep;
  struct fid_mr* mr;
  void* desc;
  char* region;
  size_t regionBytes;
  fi_addr_t* addrs; /* [rank] */
  netConn_t* conns;
  int nConns;
  int inflight; /* operations posted and not yet completed */
};

/* What each rank tells every other rank at setup (one MPI_Allgather). */
typedef struct {
  int ok;
  int addrLen;
  char prov[64];
  char addr[NET_ADDR_MAX];
} netCard_t;

static uint64_t makeTag(int rank, int lane, uint64_t step) {
  return ((uint64_t)rank << (TAG_STEP_BITS + TAG_LANE_BITS)) | ((uint64_t)lane << TAG_STEP_BITS) |
         (step & (((uint64_t)1 << TAG_STEP_BITS) - 1));
}

static int isRemote(gcommComm_t comm, int p) {
  return comm->cards[p].hostId != comm->cards[comm->rank].hostId;
}

/* Auto choice: providers that cannot leave the machine are never picked by themselves (they are
 * for testing: GCOMM_OFI_PROVIDER=shm), tcp and sockets only when nothing better exists. */
static int provRank(const char* name) {
  if (strncmp(name, "shm", 3) == 0 || strncmp(name, "sm2", 3) == 0 ||
      strncmp(name, "net", 3) == 0 || strncmp(name, "udp", 3) == 0 ||
      strstr(name, "ofi_rxd") != NULL || strncmp(name, "ofi_", 4) == 0)
    return -1;
  if (strncmp(name, "tcp", 3) == 0) return 1;
  if (strncmp(name, "sockets", 7) == 0) return 0;
  return 2;
}

static gcommResult_t openFabric(gcommComm_t comm, struct gcommNet* net) {
  const char* prov = comm->params.ofiProvider;
  const char* iface = comm->params.ofiIface;
  struct fi_info* hints = fi_allocinfo();
  struct fi_info* list = NULL;
  if (hints == NULL) return GCOMM_ERROR(comm, gcommSystemError, -1, "fi_allocinfo failed");
  hints->caps = FI_TAGGED | FI_SEND | FI_RECV;
  hints->ep_attr->type = FI_EP_RDM;
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  hints->domain_attr->mr_mode =
      FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
  hints->domain_attr->threading = FI_THREAD_DOMAIN;
  hints->tx_attr->op_flags = FI_DELIVERY_COMPLETE;
  if (prov != NULL) hints->fabric_attr->prov_name = strdup(prov);
  int err = fi_getinfo(NET_FI_VERSION, NULL, NULL, 0, hints, &list);
  int delivery = 1;
  if (err != 0) { /* providers without delivery completion: transmit completion still works */
    delivery = 0;
    hints->tx_attr->op_flags = 0;
    err = fi_getinfo(NET_FI_VERSION, NULL, NULL, 0, hints, &list);
  }
  fi_freeinfo(hints);
  if (err != 0)
    return GCOMM_ERROR(comm, gcommSystemError, -1,
                       "fi_getinfo found no tagged reliable-datagram provider%s%s: %s "
                       "(fi_info -t FI_EP_RDM lists them; GCOMM_OFI_PROVIDER chooses)",
                       prov ? " named " : "", prov ? prov : "", fi_strerror(-err));
  struct fi_info* best = NULL;
  int bestRank = -2;
  for (struct fi_info* i = list; i != NULL; i = i->next) {
    if (iface != NULL && (i->domain_attr->name == NULL || strcmp(i->domain_attr->name, iface) != 0))
      continue;
    int r = prov != NULL ? 3 : provRank(i->fabric_attr->prov_name);
    if (r > bestRank) best = i, bestRank = r;
  }
  if (best == NULL || bestRank < 0) {
    fi_freeinfo(list);
    return GCOMM_ERROR(comm, gcommSystemError, -1,
                       "no usable libfabric provider%s%s (set GCOMM_OFI_PROVIDER, e.g. tcp)",
                       iface ? " on interface " : "", iface ? iface : "");
  }
  net->info = fi_dupinfo(best);
  fi_freeinfo(list);
  if (net->info == NULL) return GCOMM_ERROR(comm, gcommSystemError, -1, "fi_dupinfo failed");
  if (!delivery) net->info->tx_attr->op_flags = 0;
  GCOMM_INFO(GCOMM_SUBSYS_NET | GCOMM_SUBSYS_INIT, comm,
             "provider %s, fabric %s, domain %s, mr_mode 0x%x, %s completion",
             net->info->fabric_attr->prov_name, net->info->fabric_attr->name,
             net->info->domain_attr->name, (unsigned)net->info->domain_attr->mr_mode,
             delivery ? "delivery" : "transmit");

#define OFI_CHECK(call)                                                             \
  do {                                                                              \
    int e_ = (call);                                                                \
    if (e_ != 0)                                                                    \
      return GCOMM_ERROR(comm, gcommSystemError, -1, "%s: %s (provider %s)", #call, \
                         fi_strerror(-e_), net->info->fabric_attr->prov_name);      \
  } while (0)
  OFI_CHECK(fi_fabric(net->info->fabric_attr, &net->fabric, NULL));
  OFI_CHECK(fi_domain(net->fabric, net->info, &net->domain, NULL));
  struct fi_av_attr avAttr;
  memset(&avAttr, 0, sizeof(avAttr));
  avAttr.type = FI_AV_TABLE;
  avAttr.count = comm->nranks;
  OFI_CHECK(fi_av_open(net->domain, &avAttr, &net->av, NULL));
  struct fi_cq_attr cqAttr;
  memset(&cqAttr, 0, sizeof(cqAttr));
  cqAttr.format = FI_CQ_FORMAT_TAGGED;
  cqAttr.wait_obj = FI_WAIT_NONE;
  cqAttr.size = (size_t)comm->nranks * comm->nLanes * 2 * GCOMM_STEPS + 64;
  OFI_CHECK(fi_cq_open(net->domain, &cqAttr, &net->cq, NULL));
  OFI_CHECK(fi_endpoint(net->domain, net->info, &net->ep, NULL));
  OFI_CHECK(fi_ep_bind(net->ep, &net->av->fid, 0));
  OFI_CHECK(fi_ep_bind(net->ep, &net->cq->fid, FI_TRANSMIT | FI_RECV));
  OFI_CHECK(fi_enable(net->ep));

  /* Registration, as the provider's mr_mode asks: one region holds every network FIFO of this
   * rank. FI_MR_ALLOCATED: it is allocated before registering (mmap). FI_MR_PROV_KEY: the
   * provider picks the key, else 0 is unique in this communicator's own domain. FI_MR_ENDPOINT:
   * bound to the endpoint and enabled. FI_MR_LOCAL: the descriptor goes with every send and
   * receive (it is passed whatever the mode). FI_MR_VIRT_ADDR only concerns RMA, unused here. */
  uint64_t mrMode = (uint64_t)net->info->domain_attr->mr_mode;
  OFI_CHECK(fi_mr_reg(net->domain, net->region, net->regionBytes, FI_SEND | FI_RECV, 0, 0, 0,
                      &net->mr, NULL));
  if (mrMode & FI_MR_ENDPOINT) {
    OFI_CHECK(fi_mr_bind(net->mr, &net->ep->fid, 0));
    OFI_CHECK(fi_mr_enable(net->mr));
  }
  net->desc = fi_mr_desc(net->mr);
  return gcommSuccess;
}

static size_t netFifoBytes(gcommComm_t comm) {
  size_t b = sizeof(gcommFifo_t) + GCOMM_STEPS * comm->slotBytes;
  return (b + 4095) & ~(size_t)4095;
}

/* Posts what can be posted on one connection: sends of filled slots, receives into free ones. */
static gcommResult_t postConn(gcommComm_t comm, struct gcommNet* net, netConn_t* nc, int* moved) {
  gcommFifo_t* f = nc->conn->fifo;
  uint64_t limit = nc->isSend ? __atomic_load_n(&f->tail, __ATOMIC_ACQUIRE)
                              : __atomic_load_n(&f->head, __ATOMIC_ACQUIRE) + GCOMM_STEPS;
  while (nc->posted < limit) {
    uint64_t s = nc->posted;
    int slot = (int)(s % GCOMM_STEPS);
    netReq_t* req = &nc->reqs[slot];
    char* buf = nc->conn->slots + (size_t)slot * nc->conn->slotBytes;
    req->nc = nc;
    req->step = s;
    ssize_t rc;
    if (nc->isSend)
      rc = fi_tsend(net->ep, buf, (size_t)f->bytes[slot], net->desc, nc->addr,
                    makeTag(comm->rank, nc->lane, s), &req->ctx);
    else
      rc = fi_trecv(net->ep, buf, nc->conn->slotBytes, net->desc, FI_ADDR_UNSPEC,
                    makeTag(nc->peer, nc->lane, s), 0, &req->ctx);
    if (rc == -FI_EAGAIN) break; /* the provider needs progress (the CQ read) first */
    if (rc != 0)
      return GCOMM_ERROR(comm, gcommSystemError, nc->peer, "%s lane %d step %llu: %s",
                         nc->isSend ? "fi_tsend" : "fi_trecv", nc->lane, (unsigned long long)s,
                         fi_strerror((int)-rc));
    req->prof = GCOMM_PROF_ON(comm, gcommProfileNet)
                    ? gcommProfNetStart(comm, nc->peer, nc->lane, s,
                                        nc->isSend ? (size_t)f->bytes[slot] : nc->conn->slotBytes,
                                        nc->isSend)
                    : NULL;
    nc->posted++;
    net->inflight++;
    *moved = 1;
  }
  return gcommSuccess;
}

static void completeReq(netReq_t* req, size_t len) {
  netConn_t* nc = req->nc;
  gcommFifo_t* f = nc->conn->fifo;
  int slot = (int)(req->step % GCOMM_STEPS);
  if (!nc->isSend) f->bytes[slot] = len;
  nc->complete[slot] = 1;
  while (nc->done < nc->posted && nc->complete[nc->done % GCOMM_STEPS]) {
    nc->complete[nc->done % GCOMM_STEPS] = 0;
    nc->done++;
  }
  if (nc->isSend)
    __atomic_store_n(&f->head, nc->done, __ATOMIC_RELEASE);
  else
    __atomic_store_n(&f->tail, nc->done, __ATOMIC_RELEASE);
}

gcommResult_t gcommNetProgress(gcommComm_t comm, int* moved) {
  struct gcommNet* net = comm->net;
  if (net == NULL) return gcommSuccess;
  for (int i = 0; i < net->nConns; i++) GCOMM_CHECK(postConn(comm, net, &net->conns[i], moved));
  for (;;) {
    struct fi_cq_tagged_entry ent[16];
    ssize_t n = fi_cq_read(net->cq, ent, 16);
    if (n == -FI_EAGAIN) break;
    if (n == -FI_EAVAIL) {
      struct fi_cq_err_entry e;
      memset(&e, 0, sizeof(e));
      if (fi_cq_readerr(net->cq, &e, 0) < 0)
        return GCOMM_ERROR(comm, gcommSystemError, -1, "fi_cq_readerr failed");
      netReq_t* req = (netReq_t*)e.op_context;
      int peer = req ? req->nc->peer : -1;
      char buf[256];
      const char* what = fi_cq_strerror(net->cq, e.prov_errno, e.err_data, buf, sizeof(buf));
      return GCOMM_ERROR(comm, gcommRemoteError, peer,
                         "network %s %s rank %d failed on lane %d step %llu: %s (%s)",
                         req && req->nc->isSend ? "send" : "receive",
                         req && req->nc->isSend ? "to" : "from", peer, req ? req->nc->lane : -1,
                         req ? (unsigned long long)req->step : 0ull, fi_strerror(e.err),
                         what ? what : "");
    }
    if (n < 0)
      return GCOMM_ERROR(comm, gcommSystemError, -1, "fi_cq_read: %s", fi_strerror((int)-n));
    for (ssize_t k = 0; k < n; k++) {
      netReq_t* req = (netReq_t*)ent[k].op_context;
      if (!req->nc->isSend && ent[k].len > req->nc->conn->slotBytes)
        return GCOMM_ERROR(comm, gcommInternalError, req->nc->peer, "received %zu bytes > slot",
                           ent[k].len);
      if (req->prof != NULL) gcommProfStop(comm, req->prof);
      completeReq(req, ent[k].len);
      net->inflight--;
    }
    *moved = 1;
    if (n < 16) break;
  }
  /* freed slots can take new receives, completed sends make room for more */
  for (int i = 0; i < net->nConns; i++) GCOMM_CHECK(postConn(comm, net, &net->conns[i], moved));
  return gcommSuccess;
}

int gcommNetSendsPending(gcommComm_t comm) {
  struct gcommNet* net = comm->net;
  if (net == NULL || __atomic_load_n(&comm->asyncError, __ATOMIC_ACQUIRE) != gcommSuccess) return 0;
  for (int i = 0; i < net->nConns; i++) {
    netConn_t* nc = &net->conns[i];
    if (nc->isSend && __atomic_load_n(&nc->conn->fifo->tail, __ATOMIC_ACQUIRE) !=
                          __atomic_load_n(&nc->conn->fifo->head, __ATOMIC_ACQUIRE))
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
                       "the network tags hold at most %d ranks and "
                       "%d lanes",
                       1 << TAG_RANK_BITS, (1 << TAG_LANE_BITS) - 1);
  struct gcommNet* net = calloc(1, sizeof(*net));
  if (net == NULL) return GCOMM_ERROR(comm, gcommSystemError, -1, "out of memory");
  comm->net = net;
  size_t fb = netFifoBytes(comm);
  net->nConns = nRemote * comm->nLanes * 2;
  net->regionBytes = fb * (net->nConns > 0 ? net->nConns : 1);
  net->region =
      mmap(NULL, net->regionBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  net->conns = calloc(net->nConns > 0 ? net->nConns : 1, sizeof(netConn_t));
  net->addrs = calloc(comm->nranks, sizeof(fi_addr_t));
  gcommResult_t res = gcommSuccess;
  if (net->region == MAP_FAILED || net->conns == NULL || net->addrs == NULL) {
    if (net->region == MAP_FAILED) net->region = NULL;
    res = GCOMM_ERROR(comm, gcommSystemError, -1, "out of memory for %zu bytes of network FIFOs",
                      net->regionBytes);
  }
  if (res == gcommSuccess) res = openFabric(comm, net);

  /* every rank takes part in the exchange, failed or not, so that none waits alone */
  netCard_t mine, *all = calloc(comm->nranks, sizeof(netCard_t));
  memset(&mine, 0, sizeof(mine));
  if (res == gcommSuccess) {
    size_t len = sizeof(mine.addr);
    int e = fi_getname(&net->ep->fid, mine.addr, &len);
    if (e != 0) res = GCOMM_ERROR(comm, gcommSystemError, -1, "fi_getname: %s", fi_strerror(-e));
    mine.addrLen = (int)len;
    snprintf(mine.prov, sizeof(mine.prov), "%s", net->info->fabric_attr->prov_name);
  }
  mine.ok = res == gcommSuccess;
  if (all == NULL) return GCOMM_ERROR(comm, gcommSystemError, -1, "out of memory");
  int mpiErr =
      MPI_Allgather(&mine, sizeof(mine), MPI_BYTE, all, sizeof(mine), MPI_BYTE, comm->mpiComm);
  if (mpiErr != MPI_SUCCESS) {
    free(all);
    return GCOMM_ERROR(comm, gcommSystemError, -1, "MPI_Allgather of fabric addresses failed");
  }
  for (int p = 0; p < comm->nranks && res == gcommSuccess; p++) {
    if (!all[p].ok) {
      res =
          GCOMM_ERROR(comm, gcommRemoteError, p, "rank %d could not open its network endpoint", p);
    } else if (strcmp(all[p].prov, mine.prov) != 0) {
      res = GCOMM_ERROR(comm, gcommInvalidUsage, p,
                        "rank %d uses provider %s, this rank %s "
                        "(set GCOMM_OFI_PROVIDER the same everywhere)",
                        p, all[p].prov, mine.prov);
    } else if (isRemote(comm, p)) {
      int n = fi_av_insert(net->av, all[p].addr, 1, &net->addrs[p], 0, NULL);
      if (n != 1)
        res = GCOMM_ERROR(comm, gcommSystemError, p, "fi_av_insert of rank %d's address failed", p);
    }
  }
  free(all);
  if (res != gcommSuccess) return res;

  /* the FIFOs: [peer][lane][send, recv] in the region; the executor's connections point there */
  int k = 0;
  for (int p = 0; p < comm->nranks; p++) {
    if (!isRemote(comm, p)) continue;
    for (int lane = 0; lane < comm->nLanes; lane++) {
      for (int isSend = 1; isSend >= 0; isSend--, k++) {
        gcommConn_t* c = isSend ? &comm->sendConns[lane * comm->nranks + p]
                                : &comm->recvConns[lane * comm->nranks + p];
        char* base = net->region + (size_t)k * fb;
        c->fifo = (gcommFifo_t*)base;
        c->slots = base + sizeof(gcommFifo_t);
        c->step = 0;
        c->slotBytes = comm->slotBytes;
        c->peer = p;
        netConn_t* nc = &net->conns[k];
        nc->conn = c;
        nc->peer = p;
        nc->lane = lane;
        nc->isSend = isSend;
        nc->addr = net->addrs[p];
      }
    }
  }
  /* receives for the first STEPS steps of every connection, before any rank can send */
  int moved = 0;
  for (int i = 0; i < net->nConns; i++) GCOMM_CHECK(postConn(comm, net, &net->conns[i], &moved));
  GCOMM_INFO(GCOMM_SUBSYS_NET | GCOMM_SUBSYS_INIT, comm,
             "%d remote ranks, %d network FIFOs of %zu bytes (provider %s)", nRemote, net->nConns,
             fb, mine.prov);
  return gcommSuccess;
}

void gcommNetFree(gcommComm_t comm) {
  struct gcommNet* net = comm->net;
  if (net == NULL) return;
  /* closing the endpoint cancels the receives still posted; the CQ goes after it */
  if (net->ep) fi_close(&net->ep->fid);
  if (net->mr) fi_close(&net->mr->fid);
  if (net->av) fi_close(&net->av->fid);
  if (net->cq) fi_close(&net->cq->fid);
  if (net->domain) fi_close(&net->domain->fid);
  if (net->fabric) fi_close(&net->fabric->fid);
  if (net->info) fi_freeinfo(net->info);
  if (net->region) munmap(net->region, net->regionBytes);
  free(net->conns);
  free(net->addrs);
  free(net);
  comm->net = NULL;
}
