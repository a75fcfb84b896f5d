/*
 * gcomm_nccl.c - NCCL's API over gcomm: built with gcomm's sources into libnccl.so.2, so that an
 * MPI program written for NCCL 2.2x runs on gcomm with no change (LD_LIBRARY_PATH or LD_PRELOAD).
 *
 * The mapping:
 *   - ncclComm_t is a small wrapper around a gcommComm_t (created at once, or at the outermost
 *     ncclGroupEnd when ncclCommInitRank was called inside a group, as NCCL does).
 *   - ncclUniqueId names a group: a random 64-bit key and the MPI_COMM_WORLD rank of the process
 *     that made it (the "creator"). ncclCommInitRank finds the members without a call that all of
 *     WORLD must make: each member sends (key, rank, nranks) to the creator, which must itself be a
 *     member (as in every NCCL-over-MPI program: rank 0 makes the id and broadcasts it); the
 *     creator answers every member with the WORLD ranks in NCCL rank order; the members then make
 *     an MPI communicator of just themselves (MPI_Comm_create_group, collective over the group
 *     only) and call gcommCommInitMPI on it. So two disjoint communicators can be made at once.
 *     Messages of other groups that arrive meanwhile are kept for their own init.
 *   - Collectives, send/receive, groups, queries and PreMulSum operators call their gcomm
 *     counterparts; enums are NCCL 2.2x's values (checked at compile time) translated by table.
 *   - Errors: gcomm's results map to NCCL's; ncclGetLastError returns gcomm's message (what,
 *     where, which peer) of the calling thread.
 *   - ncclCommShrink and ncclCommRevoke are gcommCommShrink and gcommCommRevoke (the survivors
 *     on one node; no MPI).
 *   - Not served: NCCL's device API (ncclDevCommCreate), several GPUs in one process
 *     (ncclCommInitAll with ndev > 1, or two ranks of one id in one group) return
 *     ncclInvalidUsage. Buffer and window registration are accepted and ignored: gcomm
 *     copies through its own FIFOs and needs none.
 */
#define _GNU_SOURCE
#include <nccl.h>
#include <sched.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "gcomm_internal.h"

/* ---- The NCCL 2.2x ABI this layer implements (NVIDIA's header, checked) ---- */
_Static_assert(NCCL_MAJOR == 2 && NCCL_MINOR >= 20, "needs nccl.h of NCCL 2.20 or later");
_Static_assert(sizeof(ncclUniqueId) == 128, "ncclUniqueId is 128 bytes");
_Static_assert(ncclSuccess == 0 && ncclUnhandledCudaError == 1 && ncclSystemError == 2 &&
                   ncclInternalError == 3 && ncclInvalidArgument == 4 && ncclInvalidUsage == 5 &&
                   ncclRemoteError == 6 && ncclInProgress == 7,
               "ncclResult_t values");
_Static_assert(ncclInt8 == 0 && ncclUint8 == 1 && ncclInt32 == 2 && ncclUint32 == 3 &&
                   ncclInt64 == 4 && ncclUint64 == 5 && ncclFloat16 == 6 && ncclFloat32 == 7 &&
                   ncclFloat64 == 8 && ncclBfloat16 == 9 && ncclFloat8e4m3 == 10 &&
                   ncclFloat8e5m2 == 11 && ncclNumTypes == 12,
               "ncclDataType_t values");
_Static_assert(ncclSum == 0 && ncclProd == 1 && ncclMax == 2 && ncclMin == 3 && ncclAvg == 4 &&
                   ncclNumOps == 5 && (int)gcommNumOps == (int)ncclNumOps,
               "ncclRedOp_t values: built-in operators, then created ones from ncclNumOps up");
_Static_assert(ncclScalarDevice == 0 && ncclScalarHostImmediate == 1, "ncclScalarResidence_t");
_Static_assert(NCCL_SPLIT_NOCOLOR == GCOMM_SPLIT_NOCOLOR, "NCCL_SPLIT_NOCOLOR");
/* ncclConfig_t's fixed head: size, magic, version, then the user's fields from blocking on */
_Static_assert(offsetof(ncclConfig_t, magic) == sizeof(size_t) &&
                   offsetof(ncclConfig_t, blocking) == sizeof(size_t) + 8,
               "ncclConfig_t head");
#define NCCL_CONFIG_MAGIC 0xcafebeefu
#define NCCL_CONFIG_MIN_SIZE (offsetof(ncclConfig_t, commName) + sizeof(const char*))

static const gcommDataType_t dataTypes[ncclNumTypes] = {[ncclInt8] = gcommInt8,
                                                        [ncclUint8] = gcommUint8,
                                                        [ncclInt32] = gcommInt32,
                                                        [ncclUint32] = gcommUint32,
                                                        [ncclInt64] = gcommInt64,
                                                        [ncclUint64] = gcommUint64,
                                                        [ncclFloat16] = gcommFloat16,
                                                        [ncclFloat32] = gcommFloat32,
                                                        [ncclFloat64] = gcommFloat64,
                                                        [ncclBfloat16] = gcommBfloat16,
                                                        [ncclFloat8e4m3] = gcommFloat8e4m3,
                                                        [ncclFloat8e5m2] = gcommFloat8e5m2};

/* An out-of-range type stays out of range, so that gcomm's check names it. */
static gcommDataType_t toType(ncclDataType_t t) {
  return (int)t >= 0 && t < ncclNumTypes ? dataTypes[t] : (gcommDataType_t)t;
}
/* Built-in operators have the same values; created ones are gcomm's handles, passed through. */
static gcommRedOp_t toOp(ncclRedOp_t op) {
  return (gcommRedOp_t)(int)op;
}

static ncclResult_t toNccl(gcommResult_t r) {
  switch (r) {
    case gcommSuccess:
      return ncclSuccess;
    case gcommInvalidArgument:
      return ncclInvalidArgument;
    case gcommInvalidUsage:
    case gcommAborted: /* a call on an aborted communicator */
    case gcommRevoked: /* a call on a revoked one (NCCL's ncclCommRevoke) */
      return ncclInvalidUsage;
    case gcommDeviceError:
      return ncclUnhandledCudaError;
    case gcommRemoteError:
    case gcommTimeout: /* a wait for another rank that passed its deadline */
      return ncclRemoteError;
    case gcommInProgress:
      return ncclInProgress;
    case gcommSystemError:
      return ncclSystemError;
    default:
      return ncclInternalError;
  }
}
#define NCCL_ERROR(res, ...) toNccl(GCOMM_ERROR(NULL, res, -1, __VA_ARGS__))

/* ---- Communicators: the wrapper ---- */
#define NCCL_COMM_MAGIC 0x6e63636c67636f6dull

struct ncclComm {
  uint64_t magic;
  gcommComm_t g;           /* NULL until its init ran, or when it failed */
  ncclResult_t initResult; /* of a deferred init (ncclGroupEnd) */
  /* a deferred init's arguments */
  int nranks, rank, device;
  ncclUniqueId id;
  gcommConfig_t config;
  char commName[64];
  struct ncclComm* nextPending;
};

static gcommComm_t commOf(ncclComm_t comm) {
  return comm != NULL && comm->magic == NCCL_COMM_MAGIC ? comm->g : NULL;
}

/* The gcomm communicator behind comm, or an error saying why there is none. */
static ncclResult_t checkComm(ncclComm_t comm, const char* where, gcommComm_t* g) {
  if (comm == NULL) return NCCL_ERROR(gcommInvalidArgument, "%s: comm is NULL", where);
  if (comm->magic != NCCL_COMM_MAGIC)
    return NCCL_ERROR(gcommInvalidArgument, "%s: comm is not a communicator (destroyed?)", where);
  if (comm->g == NULL)
    return comm->initResult != ncclSuccess
               ? NCCL_ERROR(gcommInvalidUsage, "%s: the communicator's init failed", where)
               : NCCL_ERROR(gcommInvalidUsage,
                            "%s: the communicator is made at ncclGroupEnd (its init was called "
                            "inside the group), not before",
                            where);
  *g = comm->g;
  return ncclSuccess;
}
#define COMM_OR_RETURN(comm, g)                      \
  gcommComm_t g = NULL;                              \
  do {                                               \
    ncclResult_t r_ = checkComm(comm, __func__, &g); \
    if (r_ != ncclSuccess) return r_;                \
  } while (0)

static ncclComm_t wrap(gcommComm_t g) {
  ncclComm_t comm = calloc(1, sizeof(*comm));
  if (comm == NULL) return NULL;
  comm->magic = NCCL_COMM_MAGIC;
  comm->g = g;
  return comm;
}

static void unwrap(ncclComm_t comm) {
  comm->magic = 0;
  free(comm);
}

/* NCCL's config checks (made by NCCL_CONFIG_INITIALIZER of 2.14 or later), then gcomm's config:
 * the CUDA device current now, the name; NCCL's tuning fields have no gcomm meaning. */
static ncclResult_t toConfig(const ncclConfig_t* in, gcommConfig_t* out, char* name, size_t len) {
  gcommConfig_t init = GCOMM_CONFIG_INITIALIZER;
  *out = init;
  if (cudaGetDevice(&out->device) != cudaSuccess)
    return NCCL_ERROR(gcommDeviceError, "cudaGetDevice failed: no CUDA device for the rank");
  if (in == NULL) return ncclSuccess;
  if (in->magic != NCCL_CONFIG_MAGIC || in->size < NCCL_CONFIG_MIN_SIZE ||
      in->size > sizeof(ncclConfig_t))
    return NCCL_ERROR(gcommInvalidArgument,
                      "config (size %zu, magic 0x%x) was not made by NCCL_CONFIG_INITIALIZER of "
                      "NCCL 2.14 to %d.%d",
                      in->size, in->magic, NCCL_MAJOR, NCCL_MINOR);
  if (in->blocking != NCCL_CONFIG_UNDEF_INT && in->blocking != 0 && in->blocking != 1)
    return NCCL_ERROR(gcommInvalidArgument, "config->blocking %d is not 0 or 1", in->blocking);
  if (in->commName != NULL) {
    snprintf(name, len, "%s", in->commName);
    out->commName = name;
  }
  return ncclSuccess;
}

/* ---- The unique id and the rendezvous ---- */
#define ID_MAGIC 0x6463636e6d6d6f63ull /* "commnccd" */
#define TAG_JOIN 0x7e6c                /* within the MPI standard's least MPI_TAG_UB (32767) */
#define TAG_ANSWER 0x7e6d

typedef struct {
  uint64_t magic;
  uint64_t key;      /* random: names the group */
  int32_t creator;   /* MPI_COMM_WORLD rank of the process that made the id */
  int32_t worldSize; /* an id of another MPI job is refused */
} idBody_t;
_Static_assert(sizeof(idBody_t) <= sizeof(ncclUniqueId), "the id fits ncclUniqueId");

/* Messages of the rendezvous: int64 words, the key first. A join: key, rank, nranks. An answer:
 * key, result, then nranks WORLD ranks in NCCL rank order. */
typedef struct message {
  int tag, source, n;
  int64_t* words;
  struct message* next;
} message_t;
static message_t* keptMessages; /* those of another group, received meanwhile */
static pthread_mutex_t rendezvousLock = PTHREAD_MUTEX_INITIALIZER;

static ncclResult_t checkMpi(const char* where) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized)
    return NCCL_ERROR(gcommInvalidUsage,
                      "%s: MPI is not initialised (or is finalised): gcomm's libnccl serves "
                      "programs that call MPI_Init before ncclGetUniqueId and ncclCommInitRank",
                      where);
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
  idBody_t body = {.magic = ID_MAGIC};
  if (uniqueId == NULL) return NCCL_ERROR(gcommInvalidArgument, "uniqueId is NULL");
  ncclResult_t r = checkMpi(__func__);
  if (r != ncclSuccess) return r;
  if (getrandom(&body.key, sizeof(body.key), 0) != sizeof(body.key))
    body.key = gcommNowNs() ^ ((uint64_t)getpid() << 32);
  MPI_Comm_rank(MPI_COMM_WORLD, &body.creator);
  MPI_Comm_size(MPI_COMM_WORLD, &body.worldSize);
  memset(uniqueId, 0, sizeof(*uniqueId));
  memcpy(uniqueId->internal, &body, sizeof(body));
  return ncclSuccess;
}

static uint64_t deadlineNs(void) {
  gcommParams_t params;
  gcommParamsRead(&params);
  return gcommNowNs() + (uint64_t)params.timeoutMs * 1000000;
}

/* The next message with tag from source (MPI_ANY_SOURCE: anyone) whose key is key: a kept one,
 * or one received now; others are kept for their own group. NULL at the deadline. */
static message_t* receive(int tag, int source, uint64_t key, uint64_t deadline) {
  for (message_t** m = &keptMessages; *m != NULL; m = &(*m)->next)
    if ((*m)->tag == tag && (source == MPI_ANY_SOURCE || (*m)->source == source) &&
        (uint64_t)(*m)->words[0] == key) {
      message_t* found = *m;
      *m = found->next;
      return found;
    }
  while (gcommNowNs() < deadline) {
    int flag = 0;
    MPI_Status status;
    MPI_Iprobe(source, tag, MPI_COMM_WORLD, &flag, &status);
    if (!flag) {
      sched_yield();
      continue;
    }
    message_t* msg = calloc(1, sizeof(*msg));
    MPI_Get_count(&status, MPI_INT64_T, &msg->n);
    msg->words = calloc(msg->n > 0 ? msg->n : 1, sizeof(int64_t));
    msg->tag = tag;
    msg->source = status.MPI_SOURCE;
    MPI_Recv(msg->words, msg->n, MPI_INT64_T, status.MPI_SOURCE, tag, MPI_COMM_WORLD,
             MPI_STATUS_IGNORE);
    if (msg->n >= 1 && (uint64_t)msg->words[0] == key) return msg;
    msg->next = keptMessages;
    keptMessages = msg;
  }
  return NULL;
}

static void messageFree(message_t* msg) {
  free(msg->words);
  free(msg);
}

/* A send that completes before the deadline (small messages go eagerly). */
static ncclResult_t sendWords(const int64_t* words, int n, int dest, int tag, uint64_t deadline) {
  MPI_Request req;
  int done = 0;
  MPI_Isend(words, n, MPI_INT64_T, dest, tag, MPI_COMM_WORLD, &req);
  while (!done && gcommNowNs() < deadline) MPI_Test(&req, &done, MPI_STATUS_IGNORE);
  if (done) return ncclSuccess;
  MPI_Cancel(&req);
  MPI_Request_free(&req);
  return NCCL_ERROR(gcommTimeout,
                    "ncclCommInitRank: WORLD rank %d took no message in "
                    "GCOMM_TIMEOUT_MS",
                    dest);
}

/* The creator: collects the other members' joins, checks them, answers each with the WORLD
 * ranks in rank order (or the error). */
static ncclResult_t gatherMembers(const idBody_t* id, int nranks, int rank, int* worldRanks) {
  uint64_t deadline = deadlineNs();
  int64_t* answer = calloc(nranks + 2, sizeof(int64_t));
  int* sources = calloc(nranks, sizeof(int));
  ncclResult_t res = ncclSuccess;
  int joined = 1;
  for (int r = 0; r < nranks; r++) worldRanks[r] = -1;
  worldRanks[rank] = id->creator;
  for (; joined < nranks && res == ncclSuccess; joined++) {
    message_t* msg = receive(TAG_JOIN, MPI_ANY_SOURCE, id->key, deadline);
    if (msg == NULL) {
      res = NCCL_ERROR(gcommTimeout,
                       "ncclCommInitRank: %d of %d ranks joined within GCOMM_TIMEOUT_MS (this "
                       "process made the id: it waits for all)",
                       joined, nranks);
      break;
    }
    int64_t r = msg->n == 3 ? msg->words[1] : -1;
    sources[joined] = msg->source;
    if (msg->n != 3 || msg->words[2] != nranks || r < 0 || r >= nranks || worldRanks[r] >= 0)
      res = NCCL_ERROR(gcommInvalidUsage,
                       "ncclCommInitRank: WORLD rank %d joined as rank %lld of %lld, but this "
                       "communicator has %d ranks%s",
                       msg->source, (long long)r, msg->n == 3 ? (long long)msg->words[2] : -1LL,
                       nranks,
                       r >= 0 && r < nranks && worldRanks[r] >= 0 ? " and that rank is taken" : "");
    else
      worldRanks[r] = msg->source;
    messageFree(msg);
  }
  answer[0] = (int64_t)id->key;
  answer[1] = res;
  for (int r = 0; r < nranks; r++) answer[2 + r] = worldRanks[r];
  for (int j = 1; j < joined; j++) {
    ncclResult_t s =
        sendWords(answer, res == ncclSuccess ? nranks + 2 : 2, sources[j], TAG_ANSWER, deadline);
    if (res == ncclSuccess) res = s;
  }
  free(answer);
  free(sources);
  return res;
}

/* Another member: joins at the creator and waits for its answer. */
static ncclResult_t joinMembers(const idBody_t* id, int nranks, int rank, int* worldRanks) {
  uint64_t deadline = deadlineNs();
  int64_t join[3] = {(int64_t)id->key, rank, nranks};
  ncclResult_t res = sendWords(join, 3, id->creator, TAG_JOIN, deadline);
  if (res != ncclSuccess) return res;
  message_t* msg = receive(TAG_ANSWER, id->creator, id->key, deadline);
  if (msg == NULL)
    return NCCL_ERROR(gcommTimeout,
                      "ncclCommInitRank: no answer within GCOMM_TIMEOUT_MS from WORLD rank %d, "
                      "which made the id (it must be a rank of the communicator too)",
                      id->creator);
  if (msg->n < 2 || msg->words[1] != ncclSuccess)
    res = NCCL_ERROR(gcommRemoteError,
                     "ncclCommInitRank: WORLD rank %d, which made the id, refused the "
                     "communicator (its error says why)",
                     id->creator);
  else if (msg->n != nranks + 2)
    res = NCCL_ERROR(gcommInvalidUsage, "ncclCommInitRank: %d ranks here, %d at WORLD rank %d",
                     nranks, msg->n - 2, id->creator);
  else
    for (int r = 0; r < nranks; r++) worldRanks[r] = (int)msg->words[2 + r];
  messageFree(msg);
  return res;
}

/* The MPI communicator of the id's members, in NCCL rank order: collective over them only. */
static ncclResult_t groupComm(const idBody_t* id, int nranks, int rank, MPI_Comm* mpiComm) {
  int worldRank, worldSize;
  MPI_Comm_rank(MPI_COMM_WORLD, &worldRank);
  MPI_Comm_size(MPI_COMM_WORLD, &worldSize);
  if (id->magic != ID_MAGIC || id->worldSize != worldSize || id->creator < 0 ||
      id->creator >= worldSize)
    return NCCL_ERROR(gcommInvalidArgument,
                      "ncclCommInitRank: the id was not made by ncclGetUniqueId of gcomm's "
                      "libnccl in this MPI job");
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return NCCL_ERROR(gcommInvalidArgument, "ncclCommInitRank: rank %d of %d ranks", rank, nranks);
  int* worldRanks = calloc(nranks, sizeof(int));
  pthread_mutex_lock(&rendezvousLock);
  ncclResult_t res = worldRank == id->creator ? gatherMembers(id, nranks, rank, worldRanks)
                                              : joinMembers(id, nranks, rank, worldRanks);
  pthread_mutex_unlock(&rendezvousLock);
  if (res == ncclSuccess) {
    MPI_Group world, members;
    MPI_Comm_group(MPI_COMM_WORLD, &world);
    MPI_Group_incl(world, nranks, worldRanks, &members);
    int err = MPI_Comm_create_group(MPI_COMM_WORLD, members, (int)(id->key % 32000), mpiComm);
    MPI_Group_free(&members);
    MPI_Group_free(&world);
    if (err != MPI_SUCCESS)
      res = NCCL_ERROR(gcommSystemError, "MPI_Comm_create_group failed (MPI error %d)", err);
  }
  free(worldRanks);
  return res;
}

/* Makes comm's gcomm communicator from its recorded arguments. */
static ncclResult_t commInit(ncclComm_t comm) {
  idBody_t id;
  MPI_Comm mpiComm;
  memcpy(&id, comm->id.internal, sizeof(id));
  ncclResult_t res = groupComm(&id, comm->nranks, comm->rank, &mpiComm);
  if (res == ncclSuccess) {
    comm->config.device = comm->device;
    res = toNccl(gcommCommInitMPI(&comm->g, mpiComm, &comm->config));
    MPI_Comm_free(&mpiComm); /* gcomm keeps its own duplicate */
  }
  comm->initResult = res;
  return res;
}

/* ---- Groups: inits inside a group wait for the outermost ncclGroupEnd, as in NCCL ---- */
static __thread int groupDepth;
static __thread ncclComm_t pendingInits;

ncclResult_t ncclCommInitRankConfig(ncclComm_t* newcomm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t* config) {
  if (newcomm == NULL) return NCCL_ERROR(gcommInvalidArgument, "newcomm is NULL");
  *newcomm = NULL;
  ncclResult_t res = checkMpi(__func__);
  if (res != ncclSuccess) return res;
  ncclComm_t comm = wrap(NULL);
  if (comm == NULL) return NCCL_ERROR(gcommSystemError, "out of memory");
  res = toConfig(config, &comm->config, comm->commName, sizeof(comm->commName));
  if (res != ncclSuccess) {
    unwrap(comm);
    return res;
  }
  comm->nranks = nranks;
  comm->rank = rank;
  comm->device = comm->config.device;
  comm->id = commId;
  if (groupDepth > 0) {
    for (ncclComm_t p = pendingInits; p != NULL; p = p->nextPending)
      if (memcmp(&p->id, &commId, sizeof(commId)) == 0) {
        unwrap(comm);
        p->initResult = ncclInvalidUsage; /* its init at ncclGroupEnd fails at once */
        return NCCL_ERROR(gcommInvalidUsage,
                          "ncclCommInitRank: ranks %d and %d of one communicator in one process "
                          "(several GPUs per process): gcomm serves one rank per process",
                          p->rank, rank);
      }
    comm->nextPending = pendingInits;
    pendingInits = comm;
    *newcomm = comm;
    return ncclSuccess;
  }
  res = commInit(comm);
  if (res != ncclSuccess) {
    unwrap(comm);
    return res;
  }
  *newcomm = comm;
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* newcomm, int nranks, ncclUniqueId commId, int rank) {
  return ncclCommInitRankConfig(newcomm, nranks, commId, rank, NULL);
}

/* Every rank gets the same ids: the first names the group. */
ncclResult_t ncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank, int nId,
                                      ncclUniqueId* commIds, ncclConfig_t* config) {
  if (nId < 1 || commIds == NULL)
    return NCCL_ERROR(gcommInvalidArgument, "ncclCommInitRankScalable: %d ids at %p", nId,
                      (void*)commIds);
  return ncclCommInitRankConfig(newcomm, nranks, commIds[0], myrank, config);
}

/* One process, one GPU: ndev 1 is a communicator of this process alone. */
ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  if (comms == NULL) return NCCL_ERROR(gcommInvalidArgument, "comms is NULL");
  if (ndev != 1)
    return NCCL_ERROR(gcommInvalidUsage,
                      "ncclCommInitAll with %d devices: gcomm serves one rank (one GPU) per "
                      "process; start one MPI process per GPU and call ncclCommInitRank",
                      ndev);
  ncclResult_t res = checkMpi(__func__);
  if (res != ncclSuccess) return res;
  if (devlist != NULL && cudaSetDevice(devlist[0]) != cudaSuccess)
    return NCCL_ERROR(gcommDeviceError, "cudaSetDevice(%d) failed", devlist[0]);
  gcommConfig_t config = GCOMM_CONFIG_INITIALIZER;
  if (cudaGetDevice(&config.device) != cudaSuccess)
    return NCCL_ERROR(gcommDeviceError, "cudaGetDevice failed");
  gcommComm_t g;
  res = toNccl(gcommCommInitMPI(&g, MPI_COMM_SELF, &config));
  if (res != ncclSuccess) return res;
  if ((comms[0] = wrap(g)) != NULL) return ncclSuccess;
  gcommCommDestroy(g);
  return NCCL_ERROR(gcommSystemError, "out of memory");
}

ncclResult_t ncclGroupStart(void) {
  groupDepth++;
  return toNccl(gcommGroupStart());
}

ncclResult_t ncclGroupEnd(void) {
  ncclResult_t res = ncclSuccess;
  if (groupDepth == 0) return NCCL_ERROR(gcommInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--groupDepth == 0) {
    /* in call order: the list is newest first */
    ncclComm_t ordered = NULL;
    while (pendingInits != NULL) {
      ncclComm_t c = pendingInits;
      pendingInits = c->nextPending;
      c->nextPending = ordered;
      ordered = c;
    }
    for (ncclComm_t c = ordered; c != NULL; c = c->nextPending) {
      ncclResult_t r = c->initResult != ncclSuccess ? c->initResult : commInit(c);
      if (res == ncclSuccess) res = r;
    }
  }
  ncclResult_t r = toNccl(gcommGroupEnd());
  return res != ncclSuccess ? res : r;
}

/* Simulation is NCCL's cost model; gcomm has its own and reports nothing. */
ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t* simInfo) {
  if (simInfo != NULL) simInfo->estimatedTime = NCCL_UNDEF_FLOAT;
  return ncclGroupEnd();
}

/* ---- Communicator lifetime and queries ---- */
/* A communicator made from another (split, shrink), where names the call: *newcomm NULL, the
 * config converted, then make's result wrapped (a NULL one, a split's NOCOLOR, stays NULL). */
typedef gcommResult_t (*makeComm_t)(gcommComm_t parent, const gcommConfig_t* config,
                                    gcommComm_t* out, const void* args);
static ncclResult_t makeFrom(ncclComm_t comm, ncclComm_t* newcomm, ncclConfig_t* config,
                             makeComm_t make, const void* args, const char* where) {
  gcommComm_t g = NULL;
  ncclResult_t checked = checkComm(comm, where, &g);
  if (checked != ncclSuccess) return checked;
  gcommConfig_t gconfig;
  char name[64];
  if (newcomm == NULL) return NCCL_ERROR(gcommInvalidArgument, "newcomm is NULL");
  *newcomm = NULL;
  ncclResult_t res = toConfig(config, &gconfig, name, sizeof(name));
  if (res != ncclSuccess) return res;
  gcommComm_t made = NULL;
  res = toNccl(make(g, config != NULL ? &gconfig : NULL, &made, args));
  if (res != ncclSuccess || made == NULL) return res;
  if ((*newcomm = wrap(made)) != NULL) return ncclSuccess;
  gcommCommDestroy(made);
  return NCCL_ERROR(gcommSystemError, "out of memory");
}

static gcommResult_t makeSplit(gcommComm_t g, const gcommConfig_t* config, gcommComm_t* out,
                               const void* args) {
  const int* colorKey = args;
  return gcommCommSplit(g, colorKey[0], colorKey[1], out, config);
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                           ncclConfig_t* config) {
  int colorKey[2] = {color, key};
  return makeFrom(comm, newcomm, config, makeSplit, colorKey, __func__);
}

typedef struct {
  const int* exclude;
  int n, flags;
} shrinkArgs_t;

static gcommResult_t makeShrink(gcommComm_t g, const gcommConfig_t* config, gcommComm_t* out,
                                const void* args) {
  const shrinkArgs_t* a = args;
  return gcommCommShrink(g, a->exclude, a->n, out, config, a->flags);
}

_Static_assert(NCCL_SHRINK_DEFAULT == GCOMM_SHRINK_DEFAULT &&
                   NCCL_SHRINK_ABORT == GCOMM_SHRINK_ABORT,
               "NCCL's shrink flags are gcomm's");
ncclResult_t ncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,
                            ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags) {
  shrinkArgs_t a = {excludeRanksList, excludeRanksCount, shrinkFlags};
  return makeFrom(comm, newcomm, config, makeShrink, &a, __func__);
}

/* gcomm's destroy waits for the communicator's outstanding work itself. */
ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  COMM_OR_RETURN(comm, g);
  (void)g;
  return ncclSuccess;
}

/* A communicator whose init failed or never ran is freed too. */
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm == NULL) return ncclSuccess;
  if (comm->magic != NCCL_COMM_MAGIC)
    return NCCL_ERROR(gcommInvalidArgument, "ncclCommDestroy: comm is not a communicator");
  ncclResult_t res = comm->g != NULL ? toNccl(gcommCommDestroy(comm->g)) : ncclSuccess;
  unwrap(comm);
  return res;
}

/* As NCCL's: stops everything, then frees the communicator. */
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm == NULL) return ncclSuccess;
  if (commOf(comm) != NULL) gcommCommAbort(comm->g);
  ncclCommDestroy(comm);
  return ncclSuccess;
}

/* Stops in-flight operations on every rank of the node; the communicator must still be
 * destroyed (or shrunk). */
ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags) {
  COMM_OR_RETURN(comm, g);
  if (revokeFlags != NCCL_REVOKE_DEFAULT)
    return NCCL_ERROR(gcommInvalidArgument, "revokeFlags %d is not NCCL_REVOKE_DEFAULT",
                      revokeFlags);
  return toNccl(gcommCommRevoke(g));
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  if (asyncError == NULL) return NCCL_ERROR(gcommInvalidArgument, "asyncError is NULL");
  if (comm != NULL && comm->magic == NCCL_COMM_MAGIC && comm->g == NULL) {
    *asyncError = comm->initResult;
    return ncclSuccess;
  }
  COMM_OR_RETURN(comm, g);
  gcommResult_t e = gcommSuccess;
  ncclResult_t res = toNccl(gcommCommGetAsyncError(g, &e));
  *asyncError = toNccl(e);
  return res;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  COMM_OR_RETURN(comm, g);
  return toNccl(gcommCommCount(g, count));
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  COMM_OR_RETURN(comm, g);
  return toNccl(gcommCommDevice(g, device));
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  COMM_OR_RETURN(comm, g);
  return toNccl(gcommCommUserRank(g, rank));
}

/* ---- Library ---- */
ncclResult_t ncclGetVersion(int* version) {
  if (version == NULL) return NCCL_ERROR(gcommInvalidArgument, "version is NULL");
  *version = NCCL_VERSION_CODE; /* the API level served: that of the header built against */
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error (ncclGetLastError says which call)";
    case ncclSystemError:
      return "unhandled system error (ncclGetLastError says which call)";
    case ncclInternalError:
      return "internal error - please report this issue to gcomm's developers";
    case ncclInvalidArgument:
      return "invalid argument (ncclGetLastError says which)";
    case ncclInvalidUsage:
      return "invalid usage (ncclGetLastError says why)";
    case ncclRemoteError:
      return "remote process exited or there was a network error";
    case ncclInProgress:
      return "NCCL operation in progress";
    default:
      return "unknown result code";
  }
}

/* The calling thread's last error, as NCCL's (which ignores comm). */
const char* ncclGetLastError(ncclComm_t comm) {
  (void)comm;
  return gcommGetLastError(NULL);
}

/* NCCL's debug reset: gcomm reads GCOMM_DEBUG once per process. */
void ncclResetDebugInit(void) {}

/* ---- Memory and registration: gcomm needs no registration ---- */
ncclResult_t ncclMemAlloc(void** ptr, size_t size) {
  if (ptr == NULL) return NCCL_ERROR(gcommInvalidArgument, "ptr is NULL");
  cudaError_t err = cudaMalloc(ptr, size);
  if (err != cudaSuccess)
    return NCCL_ERROR(gcommDeviceError, "cudaMalloc(%zu) failed: %s", size,
                      cudaGetErrorString(err));
  return ncclSuccess;
}

ncclResult_t ncclMemFree(void* ptr) {
  cudaError_t err = cudaFree(ptr);
  if (err != cudaSuccess)
    return NCCL_ERROR(gcommDeviceError, "cudaFree(%p) failed: %s", ptr, cudaGetErrorString(err));
  return ncclSuccess;
}

ncclResult_t ncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle) {
  COMM_OR_RETURN(comm, g);
  (void)g, (void)size;
  if (handle == NULL) return NCCL_ERROR(gcommInvalidArgument, "handle is NULL");
  *handle = buff;
  return ncclSuccess;
}

ncclResult_t ncclCommDeregister(const ncclComm_t comm, void* handle) {
  COMM_OR_RETURN(comm, g);
  (void)g, (void)handle;
  return ncclSuccess;
}

ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win,
                                    int winFlags) {
  COMM_OR_RETURN(comm, g);
  (void)g, (void)size, (void)winFlags;
  if (win == NULL) return NCCL_ERROR(gcommInvalidArgument, "win is NULL");
  *win = (ncclWindow_t)buff;
  return ncclSuccess;
}

ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
  COMM_OR_RETURN(comm, g);
  (void)g, (void)win;
  return ncclSuccess;
}

/* NCCL 2.28's device API (nccl_device.h, C++: kernels that communicate themselves) is not served;
 * its types are opaque here. */
struct ncclDevCommRequirements;
struct ncclDevComm;
ncclResult_t ncclDevCommCreate(ncclComm_t comm, const struct ncclDevCommRequirements* reqs,
                               struct ncclDevComm* outDevComm);
ncclResult_t ncclDevCommDestroy(ncclComm_t comm, const struct ncclDevComm* devComm);

ncclResult_t ncclDevCommCreate(ncclComm_t comm, const struct ncclDevCommRequirements* reqs,
                               struct ncclDevComm* outDevComm) {
  (void)comm, (void)reqs, (void)outDevComm;
  return NCCL_ERROR(gcommInvalidUsage,
                    "ncclDevCommCreate: NCCL's device API (nccl_device.h) is not served by gcomm");
}

ncclResult_t ncclDevCommDestroy(ncclComm_t comm, const struct ncclDevComm* devComm) {
  (void)comm, (void)devComm;
  return NCCL_ERROR(gcommInvalidUsage,
                    "ncclDevCommDestroy: NCCL's device API (nccl_device.h) is not served by gcomm");
}

/* ---- Reduction operators ---- */
ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                      ncclScalarResidence_t residence, ncclComm_t comm) {
  COMM_OR_RETURN(comm, g);
  gcommRedOp_t created;
  if (op == NULL) return NCCL_ERROR(gcommInvalidArgument, "op is NULL");
  ncclResult_t res = toNccl(gcommRedOpCreatePreMulSum(&created, scalar, toType(datatype),
                                                      (gcommScalarResidence_t)residence, g));
  if (res == ncclSuccess) *op = (ncclRedOp_t)(int)created;
  return res;
}

ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  COMM_OR_RETURN(comm, g);
  return toNccl(gcommRedOpDestroy(toOp(op), g));
}

/* ---- Collectives and point to point ---- */
ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
  COMM_OR_RETURN(comm, g);
  return toNccl(gcommAllReduce(sendbuff, recvbuff, count, toType(datatype), toOp(op), g, stream));
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  COMM_OR_RETURN(comm, g);
  return toNccl(gcommBroadcast(sendbuff, recvbuff, count, toType(datatype), root, g, stream));
}

ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                       cudaStream_t stream) {
  return ncclBroadcast(buff, buff, count, datatype, root, comm, stream);
}

ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
  COMM_OR_RETURN(comm, g);
  return toNccl(
      gcommReduce(sendbuff, recvbuff, count, toType(datatype), toOp(op), root, g, stream));
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  COMM_OR_RETURN(comm, g);
  return toNccl(gcommAllGather(sendbuff, recvbuff, sendcount, toType(datatype), g, stream));
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream) {
  COMM_OR_RETURN(comm, g);
  return toNccl(
      gcommReduceScatter(sendbuff, recvbuff, recvcount, toType(datatype), toOp(op), g, stream));
}

ncclResult_t ncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count,
                          ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  COMM_OR_RETURN(comm, g);
  return toNccl(gcommAllToAll(sendbuff, recvbuff, count, toType(datatype), g, stream));
}

ncclResult_t ncclGather(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                        int root, ncclComm_t comm, cudaStream_t stream) {
  COMM_OR_RETURN(comm, g);
  return toNccl(gcommGather(sendbuff, recvbuff, count, toType(datatype), root, g, stream));
}

ncclResult_t ncclScatter(const void* sendbuff, void* recvbuff, size_t count,
                         ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream) {
  COMM_OR_RETURN(comm, g);
  return toNccl(gcommScatter(sendbuff, recvbuff, count, toType(datatype), root, g, stream));
}

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  COMM_OR_RETURN(comm, g);
  return toNccl(gcommSend(sendbuff, count, toType(datatype), peer, g, stream));
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  COMM_OR_RETURN(comm, g);
  return toNccl(gcommRecv(recvbuff, count, toType(datatype), peer, g, stream));
}

/* ---- NCCL's profiling names (pnccl*): the same functions ---- */
#define PROFILING_NAME(f) extern __typeof__(f) p##f __attribute__((alias(#f)))
PROFILING_NAME(ncclMemAlloc);
PROFILING_NAME(ncclMemFree);
PROFILING_NAME(ncclGetVersion);
PROFILING_NAME(ncclGetUniqueId);
PROFILING_NAME(ncclCommInitRankConfig);
PROFILING_NAME(ncclCommInitRank);
PROFILING_NAME(ncclCommInitAll);
PROFILING_NAME(ncclCommInitRankScalable);
PROFILING_NAME(ncclCommFinalize);
PROFILING_NAME(ncclCommDestroy);
PROFILING_NAME(ncclCommAbort);
PROFILING_NAME(ncclCommRevoke);
PROFILING_NAME(ncclCommSplit);
PROFILING_NAME(ncclCommShrink);
PROFILING_NAME(ncclGetErrorString);
PROFILING_NAME(ncclGetLastError);
PROFILING_NAME(ncclCommGetAsyncError);
PROFILING_NAME(ncclCommCount);
PROFILING_NAME(ncclCommCuDevice);
PROFILING_NAME(ncclCommUserRank);
PROFILING_NAME(ncclCommRegister);
PROFILING_NAME(ncclCommDeregister);
PROFILING_NAME(ncclCommWindowRegister);
PROFILING_NAME(ncclCommWindowDeregister);
PROFILING_NAME(ncclRedOpCreatePreMulSum);
PROFILING_NAME(ncclRedOpDestroy);
PROFILING_NAME(ncclReduce);
PROFILING_NAME(ncclBcast);
PROFILING_NAME(ncclBroadcast);
PROFILING_NAME(ncclAllReduce);
PROFILING_NAME(ncclReduceScatter);
PROFILING_NAME(ncclAllGather);
PROFILING_NAME(ncclAlltoAll);
PROFILING_NAME(ncclGather);
PROFILING_NAME(ncclScatter);
PROFILING_NAME(ncclSend);
PROFILING_NAME(ncclRecv);
PROFILING_NAME(ncclGroupStart);
PROFILING_NAME(ncclGroupEnd);
PROFILING_NAME(ncclGroupSimulateEnd);
