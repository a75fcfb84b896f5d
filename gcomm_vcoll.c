/*
 * gcomm_vcoll.c - the vector collectives: AllGatherV, AllToAllV, GatherV, ScatterV; and AllGather,
 * AllToAll, Gather and Scatter where they move as their vector forms' parts (gcommByParts).
 *
 * Every rank's block has its own size, so the fixed-chunk schedules of gcomm_sched.h (which both
 * executors, host and GPU, compute from one count) do not fit. A vector collective is the direct
 * pattern instead: a send and a receive per pair of ranks that exchange data, and a copy of the
 * rank's own block (gcommFuncCopy: once from input to output, no FIFO between), all enqueued as
 * one operation (gcommSubmitParts). Each pair moves on its own point-to-point queue at once,
 * pipelined through the FIFO slots and split over channels when large (host: one batch of the
 * progress engine; GPU: one kernel launch, a block per pair and channel), never one pair after
 * another. The call's checks come first and cover the whole call (its counts, displacements and
 * buffers, each buffer once: the parts are pieces of them and are not checked again); nothing is
 * enqueued when one fails.
 *
 * Mismatch detection: every part is tagged as the call (its kind, datatype, root, sequence
 * number), AllGatherV with a hash of recvcounts (the same array on every rank), the others with
 * the pair's count; each FIFO slot also carries its byte count. A rank whose counts or call differ
 * is named by the peer it meets.
 */
#include <stdlib.h>
#include <string.h>

#include "gcomm_core.h"

/* One call's parts as it is built. */
typedef struct {
  gcommComm_t comm;
  gcommOp_t* parts; /* up to 2 * nranks - 1: a send and a receive per peer, a copy of its own */
  int nParts, root;
  gcommDataType_t datatype;
  size_t esz;
  const char* where;
} VCall;

#define V_BAD(v, ...) gcommSetError((v)->comm, gcommInvalidArgument, -1, (v)->where, __VA_ARGS__)

/* The checks before any count is read, of a communicator that passed gcommEnqueueCheck: the
 * datatype and root (hasRoot). */
static gcommResult_t vInit(VCall* v, gcommComm_t comm, gcommDataType_t datatype, int root,
                           int hasRoot, const char* where) {
  memset(v, 0, sizeof(*v));
  v->comm = comm;
  v->where = where;
  if ((unsigned)datatype >= gcommNumTypes)
    return V_BAD(v, "datatype %d is not a gcommDataType_t (0..%d)", datatype, gcommNumTypes - 1);
  if (hasRoot && (root < 0 || root >= comm->nranks))
    return V_BAD(v, "root %d is not a rank of this communicator (0..%d)", root, comm->nranks - 1);
  v->datatype = datatype;
  v->root = hasRoot ? root : 0;
  v->esz = gcommTypeSize(datatype);
  if (comm->partArgs == NULL) comm->partArgs = malloc(2 * (size_t)comm->nranks * sizeof(gcommOp_t));
  if (comm->partArgs == NULL)
    return gcommSetError(comm, gcommSystemError, -1, where, "out of memory");
  v->parts = comm->partArgs;
  return gcommSuccess;
}

/* A vector call's start: the communicator's checks, then vInit's. */
static gcommResult_t vBegin(VCall* v, gcommComm_t comm, gcommDataType_t datatype, int root,
                            int hasRoot, gcommStream_t stream, const char* where) {
  GCOMM_CHECK(gcommEnqueueCheck(comm, stream, where));
  return vInit(v, comm, datatype, root, hasRoot, where);
}

/* Whether a block of count elements at displ stays within limit elements (no overflow). */
static int vBlockFits(size_t count, size_t displ, size_t limit) {
  return count <= limit && displ <= limit - count;
}

/* A vector call that moves nothing (every count 0) completes at once, taking its sequence number
 * as on every other rank, when the checks of its communicator (gcommCallReady), datatype and root
 * (hasRoot) pass; vNone checks its counts. Any other call takes the whole path, which says what is
 * wrong. */
static int vReady(gcommComm_t comm, gcommDataType_t datatype, int root, int hasRoot,
                  gcommStream_t stream, const char* where) {
  return (unsigned)datatype < gcommNumTypes && gcommCallReady(comm, stream, where) &&
         (!hasRoot || (unsigned)root < (unsigned)comm->nranks);
}

/* Whether the blocks of counts and displs (one a rank of comm) are all empty and pass vBlocks. */
static int vNone(gcommComm_t comm, gcommDataType_t datatype, const size_t* counts,
                 const size_t* displs) {
  size_t limit = SIZE_MAX / 2 / gcommTypeSize(datatype);
  if (counts == NULL || displs == NULL) return 0;
  for (int p = 0; p < comm->nranks; p++)
    if (counts[p] != 0 || !vBlockFits(0, displs[p], limit)) return 0;
  return 1;
}

static gcommResult_t vDone(gcommComm_t comm) {
  gcommOwnerAdd(&comm->collSeq, 1);
  return gcommSuccess;
}

/* Element displ of base (NULL stays NULL: a buffer a rank does not use). */
static char* vAt(const void* base, size_t displ, size_t esz) {
  return base == NULL ? NULL : (char*)base + displ * esz;
}

static gcommOp_t* vNewPart(VCall* v, int func, size_t count, int peer) {
  gcommOp_t* p = &v->parts[v->nParts++];
  memset(p, 0, sizeof(*p));
  p->func = func;
  p->count = count;
  p->datatype = v->datatype;
  p->root = v->root;
  p->peer = peer;
  return p;
}

/* A part of count 0 moves nothing (its operation would have no work): none is made, on either
 * end of the pair alike. */
static void vPart(VCall* v, int func, const void* buf, size_t count, int peer) {
  if (count == 0) return;
  gcommOp_t* p = vNewPart(v, func, count, peer);
  if (func == gcommFuncSend)
    p->sendbuff = buf;
  else
    p->recvbuff = (void*)buf;
}

/* The rank's own block: one copy from in to out. */
static void vCopy(VCall* v, const void* in, void* out, size_t count) {
  if (count == 0) return;
  gcommOp_t* p = vNewPart(v, gcommFuncCopy, count, v->comm->rank);
  p->sendbuff = in;
  p->recvbuff = out;
}

/* The counts and displacements of a buffer's n blocks: present, and every block addressable.
 * *extent: the bytes from the buffer's start to the end of its last non-empty block. */
static gcommResult_t vBlocks(VCall* v, const char* countsName, const size_t* counts,
                             const char* displsName, const size_t* displs, size_t* extent) {
  size_t limit = SIZE_MAX / 2 / v->esz;
  *extent = 0;
  if (counts == NULL) return V_BAD(v, "%s is NULL", countsName);
  if (displs == NULL) return V_BAD(v, "%s is NULL", displsName);
  for (int p = 0; p < v->comm->nranks; p++) {
    if (!vBlockFits(counts[p], displs[p], limit))
      return V_BAD(v, "%s[%d] = %zu and %s[%d] = %zu are too large", countsName, p, counts[p],
                   displsName, p, displs[p]);
    if (counts[p] > 0 && (displs[p] + counts[p]) * v->esz > *extent)
      *extent = (displs[p] + counts[p]) * v->esz;
  }
  return gcommSuccess;
}

/* An all-to-all's parts: the rank's own block copied, then a send to and a receive from each peer,
 * starting with the next rank (so that the pairs spread out). */
static void vExchange(VCall* v, const void* sendbuff, const size_t* sendcounts,
                      const size_t* sdispls, void* recvbuff, const size_t* recvcounts,
                      const size_t* rdispls) {
  int n = v->comm->nranks, r = v->comm->rank;
  vCopy(v, vAt(sendbuff, sdispls[r], v->esz), vAt(recvbuff, rdispls[r], v->esz), sendcounts[r]);
  for (int i = 1; i < n; i++) {
    int p = (r + i) % n;
    vPart(v, gcommFuncSend, vAt(sendbuff, sdispls[p], v->esz), sendcounts[p], p);
    vPart(v, gcommFuncRecv, vAt(recvbuff, rdispls[p], v->esz), recvcounts[p], p);
  }
}

/* An all-gather's parts: the rank's own block copied (unless it is in place), then sendbuff sent
 * to each peer and each peer's block received, starting with the next rank. */
static void vAllGather(VCall* v, const void* sendbuff, size_t sendcount, void* recvbuff,
                       const size_t* recvcounts, const size_t* displs) {
  int n = v->comm->nranks, r = v->comm->rank;
  if (sendbuff != vAt(recvbuff, displs[r], v->esz))
    vCopy(v, sendbuff, vAt(recvbuff, displs[r], v->esz), sendcount);
  for (int i = 1; i < n; i++) {
    int p = (r + i) % n;
    vPart(v, gcommFuncSend, sendbuff, sendcount, p);
    vPart(v, gcommFuncRecv, vAt(recvbuff, displs[p], v->esz), recvcounts[p], p);
  }
}

/* A buffer the call moves count elements through on this rank (isSend: reads them), checked
 * once for all the parts that are pieces of it (gcommCheckBuffer). */
static gcommResult_t vBuffer(VCall* v, const void* buf, int isSend, size_t count) {
  if (count > SIZE_MAX / 2 / v->esz)
    return V_BAD(v, "%s: %zu elements of %s are too many", isSend ? "sendbuff" : "recvbuff", count,
                 gcommTypeNames[v->datatype]);
  return gcommCheckBuffer(v->comm, buf, isSend, count, v->where + strlen("gcomm"), v->where);
}

/* Buffers that meet outside the in-place layout are rejected, as for the other collectives. */
static gcommResult_t vNoOverlap(VCall* v, const void* in, size_t inBytes, const void* out,
                                size_t outBytes) {
  const char *a = in, *b = out;
  if (inBytes > 0 && outBytes > 0 && a < b + outBytes && b < a + inBytes)
    return V_BAD(v,
                 "sendbuff [%p, +%zu B) and recvbuff [%p, +%zu B) overlap and are not the "
                 "in-place layout of %s",
                 in, inBytes, out, outBytes, v->where + strlen("gcomm"));
  return gcommSuccess;
}

/* What the ranks agree on for AllGatherV: its recvcounts, hashed (never 0: 0 means "the part's
 * own count"). */
static uint64_t hashCounts(const size_t* counts, int n) {
  uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a over the counts */
  for (int i = 0; i < n; i++) h = (h ^ (uint64_t)counts[i]) * 0x100000001b3ull;
  return h | 1;
}

/* gcommAllGatherV's whole path (out of line: the empty call saves no register). */
static __attribute__((noinline)) gcommResult_t allGatherV(const void* sendbuff, size_t sendcount,
                                                          void* recvbuff, const size_t* recvcounts,
                                                          const size_t* displs,
                                                          gcommDataType_t datatype,
                                                          gcommComm_t comm, gcommStream_t stream) {
  VCall v;
  size_t extent;
  GCOMM_CHECK(vBegin(&v, comm, datatype, 0, 0, stream, "gcommAllGatherV"));
  int n = comm->nranks, r = comm->rank;
  gcommResult_t res = vBlocks(&v, "recvcounts", recvcounts, "displs", displs, &extent);
  if (res == gcommSuccess && sendcount != recvcounts[r])
    res = V_BAD(&v, "sendcount %zu is not recvcounts[%d] = %zu (this rank's block)", sendcount, r,
                recvcounts[r]);
  int inPlace =
      res == gcommSuccess && sendbuff != NULL && sendbuff == vAt(recvbuff, displs[r], v.esz);
  if (res == gcommSuccess && !inPlace)
    res = vNoOverlap(&v, sendbuff, sendcount * v.esz, recvbuff, extent);
  if (res == gcommSuccess) res = vBuffer(&v, sendbuff, 1, sendcount);
  if (res == gcommSuccess) res = vBuffer(&v, recvbuff, 0, extent / v.esz);
  if (res != gcommSuccess) return res;
  vAllGather(&v, sendbuff, sendcount, recvbuff, recvcounts, displs);
  return gcommSubmitParts(comm, v.parts, v.nParts, gcommFuncAllGatherV, hashCounts(recvcounts, n),
                          stream, "gcommAllGatherV");
}

gcommResult_t gcommAllGatherV(const void* sendbuff, size_t sendcount, void* recvbuff,
                              const size_t* recvcounts, const size_t* displs,
                              gcommDataType_t datatype, gcommComm_t comm, gcommStream_t stream) {
  if (sendcount == 0 && vReady(comm, datatype, 0, 0, stream, __func__) &&
      vNone(comm, datatype, recvcounts, displs))
    return vDone(comm);
  return allGatherV(sendbuff, sendcount, recvbuff, recvcounts, displs, datatype, comm, stream);
}

/* gcommAllToAllV's whole path (out of line: the empty call saves no register). */
static __attribute__((noinline)) gcommResult_t allToAllV(
    const void* sendbuff, const size_t* sendcounts, const size_t* sdispls, void* recvbuff,
    const size_t* recvcounts, const size_t* rdispls, gcommDataType_t datatype, gcommComm_t comm,
    gcommStream_t stream) {
  VCall v;
  size_t inBytes, outBytes;
  GCOMM_CHECK(vBegin(&v, comm, datatype, 0, 0, stream, "gcommAllToAllV"));
  int r = comm->rank;
  gcommResult_t res = vBlocks(&v, "sendcounts", sendcounts, "sdispls", sdispls, &inBytes);
  if (res == gcommSuccess)
    res = vBlocks(&v, "recvcounts", recvcounts, "rdispls", rdispls, &outBytes);
  if (res == gcommSuccess) res = vNoOverlap(&v, sendbuff, inBytes, recvbuff, outBytes);
  if (res == gcommSuccess && sendcounts[r] != recvcounts[r])
    res = V_BAD(&v, "sendcounts[%d] = %zu and recvcounts[%d] = %zu differ (this rank's own block)",
                r, sendcounts[r], r, recvcounts[r]);
  if (res == gcommSuccess) res = vBuffer(&v, sendbuff, 1, inBytes / v.esz);
  if (res == gcommSuccess) res = vBuffer(&v, recvbuff, 0, outBytes / v.esz);
  if (res != gcommSuccess) return res;
  vExchange(&v, sendbuff, sendcounts, sdispls, recvbuff, recvcounts, rdispls);
  return gcommSubmitParts(comm, v.parts, v.nParts, gcommFuncAllToAllV, 0, stream, "gcommAllToAllV");
}

gcommResult_t gcommAllToAllV(const void* sendbuff, const size_t* sendcounts, const size_t* sdispls,
                             void* recvbuff, const size_t* recvcounts, const size_t* rdispls,
                             gcommDataType_t datatype, gcommComm_t comm, gcommStream_t stream) {
  if (vReady(comm, datatype, 0, 0, stream, __func__) &&
      vNone(comm, datatype, sendcounts, sdispls) && vNone(comm, datatype, recvcounts, rdispls))
    return vDone(comm);
  return allToAllV(sendbuff, sendcounts, sdispls, recvbuff, recvcounts, rdispls, datatype, comm,
                   stream);
}

/* Root's side of GatherV (gather) or ScatterV: its own block `own` (ownCount elements: GatherV's
 * input, ScatterV's output) and every rank's block in `all` at displs (the other buffer). */
static gcommResult_t vRoot(VCall* v, int gather, const void* own, size_t ownCount, const void* all,
                           const size_t* counts, const size_t* displs) {
  int n = v->comm->nranks, r = v->comm->rank;
  size_t extent, ownBytes = ownCount * v->esz;
  const char* countsName = gather ? "recvcounts" : "sendcounts";
  GCOMM_CHECK(vBlocks(v, countsName, counts, "displs", displs, &extent));
  if (ownCount != counts[r])
    return V_BAD(v, "%s %zu is not %s[%d] = %zu (root's own block)",
                 gather ? "sendcount" : "recvcount", ownCount, countsName, r, counts[r]);
  GCOMM_CHECK(vBuffer(v, own, gather, ownCount));
  GCOMM_CHECK(vBuffer(v, all, !gather, extent / v->esz));
  int inPlace = own != NULL && own == vAt(all, displs[r], v->esz);
  if (!inPlace) {
    GCOMM_CHECK(gather ? vNoOverlap(v, own, ownBytes, all, extent)
                       : vNoOverlap(v, all, extent, own, ownBytes));
    if (gather)
      vCopy(v, own, vAt(all, displs[r], v->esz), ownCount);
    else
      vCopy(v, vAt(all, displs[r], v->esz), (void*)own, ownCount);
  }
  for (int i = 1; i < n; i++) {
    int p = (r + i) % n;
    vPart(v, gather ? gcommFuncRecv : gcommFuncSend, vAt(all, displs[p], v->esz), counts[p], p);
  }
  return gcommSuccess;
}

gcommResult_t gcommCollParts(gcommComm_t comm, gcommOp_t* args, gcommStream_t stream,
                             const char* where) {
  VCall v;
  GCOMM_CHECK(gcommCheckArgs(comm, args, where));
  int hasRoot = args->func != gcommFuncAllToAll, isRoot = hasRoot && comm->rank == args->root;
  GCOMM_CHECK(vInit(&v, comm, args->datatype, args->root, hasRoot, where));
  int n = comm->nranks;
  size_t* blocks = malloc(2 * (size_t)n * sizeof(size_t)); /* counts, then displacements */
  if (blocks == NULL) return gcommSetError(comm, gcommSystemError, -1, where, "out of memory");
  for (int p = 0; p < n; p++) blocks[p] = args->count, blocks[n + p] = p * args->count;
  gcommResult_t res = gcommSuccess;
  if (args->func == gcommFuncAllGather)
    vAllGather(&v, args->sendbuff, args->count, args->recvbuff, blocks, blocks + n);
  else if (args->func == gcommFuncAllToAll)
    vExchange(&v, args->sendbuff, blocks, blocks + n, args->recvbuff, blocks, blocks + n);
  else if (isRoot && args->func == gcommFuncGather)
    res = vRoot(&v, 1, args->sendbuff, args->count, args->recvbuff, blocks, blocks + n);
  else if (isRoot)
    res = vRoot(&v, 0, args->recvbuff, args->count, args->sendbuff, blocks, blocks + n);
  else
    vPart(&v, args->func == gcommFuncGather ? gcommFuncSend : gcommFuncRecv,
          args->func == gcommFuncGather ? args->sendbuff : args->recvbuff, args->count, args->root);
  free(blocks);
  if (res == gcommSuccess)
    res = gcommSubmitParts(comm, v.parts, v.nParts, args->func, 0, stream, where);
  return res;
}

/* gcommGatherV's whole path (out of line: the empty call saves no register). */
static __attribute__((noinline)) gcommResult_t gatherV(const void* sendbuff, size_t sendcount,
                                                       void* recvbuff, const size_t* recvcounts,
                                                       const size_t* displs,
                                                       gcommDataType_t datatype, int root,
                                                       gcommComm_t comm, gcommStream_t stream) {
  VCall v;
  GCOMM_CHECK(vBegin(&v, comm, datatype, root, 1, stream, "gcommGatherV"));
  gcommResult_t res = gcommSuccess;
  if (comm->rank != root) { /* recvbuff, recvcounts and displs are root's */
    res = vBuffer(&v, sendbuff, 1, sendcount);
    vPart(&v, gcommFuncSend, sendbuff, sendcount, root);
  } else {
    res = vRoot(&v, 1, sendbuff, sendcount, recvbuff, recvcounts, displs);
  }
  if (res == gcommSuccess)
    res = gcommSubmitParts(comm, v.parts, v.nParts, gcommFuncGatherV, 0, stream, "gcommGatherV");
  return res;
}

gcommResult_t gcommGatherV(const void* sendbuff, size_t sendcount, void* recvbuff,
                           const size_t* recvcounts, const size_t* displs, gcommDataType_t datatype,
                           int root, gcommComm_t comm, gcommStream_t stream) {
  if (sendcount == 0 && vReady(comm, datatype, root, 1, stream, __func__) &&
      (comm->rank != root || vNone(comm, datatype, recvcounts, displs)))
    return vDone(comm);
  return gatherV(sendbuff, sendcount, recvbuff, recvcounts, displs, datatype, root, comm, stream);
}

/* gcommScatterV's whole path (out of line: the empty call saves no register). */
static __attribute__((noinline)) gcommResult_t scatterV(
    const void* sendbuff, const size_t* sendcounts, const size_t* displs, void* recvbuff,
    size_t recvcount, gcommDataType_t datatype, int root, gcommComm_t comm, gcommStream_t stream) {
  VCall v;
  GCOMM_CHECK(vBegin(&v, comm, datatype, root, 1, stream, "gcommScatterV"));
  gcommResult_t res = gcommSuccess;
  if (comm->rank != root) { /* sendbuff, sendcounts and displs are root's */
    res = vBuffer(&v, recvbuff, 0, recvcount);
    vPart(&v, gcommFuncRecv, recvbuff, recvcount, root);
  } else {
    res = vRoot(&v, 0, recvbuff, recvcount, sendbuff, sendcounts, displs);
  }
  if (res == gcommSuccess)
    res = gcommSubmitParts(comm, v.parts, v.nParts, gcommFuncScatterV, 0, stream, "gcommScatterV");
  return res;
}

gcommResult_t gcommScatterV(const void* sendbuff, const size_t* sendcounts, const size_t* displs,
                            void* recvbuff, size_t recvcount, gcommDataType_t datatype, int root,
                            gcommComm_t comm, gcommStream_t stream) {
  if (recvcount == 0 && vReady(comm, datatype, root, 1, stream, __func__) &&
      (comm->rank != root || vNone(comm, datatype, sendcounts, displs)))
    return vDone(comm);
  return scatterV(sendbuff, sendcounts, displs, recvbuff, recvcount, datatype, root, comm, stream);
}
