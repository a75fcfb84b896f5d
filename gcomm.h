/*
 * gcomm.h - the whole public API of gcomm, an embeddable collective-communication runtime.
 *
 * NCCL's shape with a gcomm prefix: a user who knows NCCL ports a program by renaming
 * nccl -> gcomm and ncclCommInitRank -> gcommCommInitMPI. C99; needs <mpi.h> but no CUDA or HIP
 * header (streams are opaque pointers).
 */
#ifndef GCOMM_H
#define GCOMM_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "gcomm_types.h" /* results, datatypes, operators */

#ifdef __cplusplus
extern "C" {
#endif

#define GCOMM_MAJOR 0
#define GCOMM_MINOR 1
#define GCOMM_PATCH 0
#define GCOMM_VERSION(X, Y, Z) ((X)*10000 + (Y)*100 + (Z))
#define GCOMM_VERSION_CODE GCOMM_VERSION(GCOMM_MAJOR, GCOMM_MINOR, GCOMM_PATCH)

/* A communicator: a set of ranks that run collectives together. */
typedef struct gcommComm* gcommComm_t;
/* A cudaStream_t / hipStream_t on a GPU communicator; NULL on a host communicator. */
typedef void* gcommStream_t;

/* Where the scalar of a PreMulSum operator lives, and when it is read. Device: a pointer read when
 * each operation runs (by the kernel on a GPU communicator, so device memory; on a host
 * communicator, host memory). HostImmediate: a host pointer read once, at creation. */
typedef enum { gcommScalarDevice = 0, gcommScalarHostImmediate = 1 } gcommScalarResidence_t;

#define GCOMM_DEVICE_HOST (-1)   /* config.device for a communicator on host memory */
#define GCOMM_PROXY_THREAD 0     /* a progress thread drives the communicator */
#define GCOMM_PROXY_POLL 1       /* the caller drives it: gcommProgress / gcommWait */
#define GCOMM_SPLIT_NOCOLOR (-1) /* gcommCommSplit: this rank joins no new communicator */
#define GCOMM_SHRINK_DEFAULT 0   /* gcommCommShrink: comm is healthy, its work is finished */
#define GCOMM_SHRINK_ABORT 1     /* gcommCommShrink: abort comm's outstanding work first */
#define GCOMM_CONFIG_UNDEF_INT INT32_MIN
#define GCOMM_CONFIG_MAGIC 0x67636f6du

/* Communicator options. Always start from GCOMM_CONFIG_INITIALIZER; a field left undefined takes
 * its default, and the matching GCOMM_* environment variable, when set, wins over both. */
typedef struct {
  size_t size;          /* sizeof(gcommConfig_t), set by the initializer (ABI check) */
  unsigned int magic;   /* GCOMM_CONFIG_MAGIC */
  unsigned int version; /* GCOMM_VERSION_CODE */
  int device;           /* GCOMM_DEVICE_HOST, or a CUDA/HIP device; default: host in a host-only
                           build, the current device in a GPU build */
  int proxyMode;        /* GCOMM_PROXY_THREAD (default) or GCOMM_PROXY_POLL; GCOMM_PROXY_MODE */
  const char* commName; /* shown in logs and to the profiler; copied */
  int nChannels;        /* parallel channels; GCOMM_NCHANNELS */
} gcommConfig_t;

#define GCOMM_CONFIG_INITIALIZER                                                           \
  {                                                                                        \
    sizeof(gcommConfig_t), GCOMM_CONFIG_MAGIC, GCOMM_VERSION_CODE, GCOMM_CONFIG_UNDEF_INT, \
        GCOMM_CONFIG_UNDEF_INT, NULL, GCOMM_CONFIG_UNDEF_INT                               \
  }

/* ---- Library ---- */
gcommResult_t gcommGetVersion(int* version);
const char* gcommGetErrorString(gcommResult_t result);
/* The last error message of comm (each communicator keeps its own), or, when comm is NULL or not
 * a live communicator, the last error of this thread: what failed, where, and which peer. Never
 * NULL. */
const char* gcommGetLastError(gcommComm_t comm);

/* ---- Threads ----
 * A communicator's collective, point-to-point and group calls all come from the thread that
 * created it (gcommCommInitMPI, gcommCommSplit, gcommCommShrink): calls from two threads would be
 * posted in an order that differs from rank to rank and mix their data, so another thread's call
 * returns gcommInvalidUsage naming both threads and changes nothing. Any thread may call gcommWait,
 * gcommTest, gcommProgress, gcommCommAbort, gcommCommRevoke, gcommCommGetAsyncError,
 * gcommGetLastError and the queries. Different communicators may be used from different threads at
 * once. A handle is checked against the live communicators: after gcommCommDestroy every call on it
 * (a second destroy included) returns gcommInvalidArgument. */

/* ---- Communicators ---- */
/* Collective over mpiComm: every rank calls it. MPI is used here and in gcommCommSplit only,
 * never on the data path; MPI_THREAD_SINGLE is enough. config may be NULL. */
gcommResult_t gcommCommInitMPI(gcommComm_t* comm, MPI_Comm mpiComm, const gcommConfig_t* config);
/* Collective over comm. Ranks with the same color form a new communicator, ordered by key then
 * by rank; color GCOMM_SPLIT_NOCOLOR gives *newcomm = NULL. config NULL: inherit comm's. */
gcommResult_t gcommCommSplit(gcommComm_t comm, int color, int key, gcommComm_t* newcomm,
                             const gcommConfig_t* config);
/* Waits for outstanding work (up to GCOMM_TIMEOUT_MS), then frees everything. Refused
 * (gcommInvalidUsage) while an open group holds work of comm: call gcommGroupEnd first. */
gcommResult_t gcommCommDestroy(gcommComm_t comm);
/* Stops everything now, from any thread: every pending wait on comm returns gcommAborted. The
 * communicator must still be destroyed. */
gcommResult_t gcommCommAbort(gcommComm_t comm);
/* Stops comm on every rank, from any thread: this rank's pending and future calls on comm return
 * gcommRevoked at once, and so do every other rank's as soon as it next waits, tests, enqueues or
 * asks gcommCommGetAsyncError, whether or not it waits on this rank: on this node through the
 * shared-memory status pages (within a millisecond or so), on other nodes through a message over
 * the network that every rank that learns of the revoke sends on (seen at the next call once it
 * has come; a rank's engine reads the network every 100 ms while idle). What comes next is
 * gcommCommShrink (GCOMM_SHRINK_ABORT) or gcommCommDestroy. */
gcommResult_t gcommCommRevoke(gcommComm_t comm);
/* Collective over the ranks of comm that are not in excludeRanks (nExclude of them, comm's ranks,
 * never this rank's): *newcomm holds the survivors, ranked in comm's order. Excluded ranks do not
 * call. GCOMM_SHRINK_DEFAULT: comm is healthy and its host work finishes first (a GPU
 * communicator's streams are the caller's to synchronise); GCOMM_SHRINK_ABORT: comm's outstanding
 * work is aborted first (after a rank died, a revoke, an error). MPI is not used (it may be stuck
 * on a dead rank): the survivors meet through comm's shared-memory status pages and, across nodes,
 * gcomm's own network, each wait bounded by GCOMM_TIMEOUT_MS, and a rank found dead by its node is
 * excluded too, whether listed or not (a rank alone on its node that dies is seen by nobody: list
 * it); a live rank that neither calls nor is excluded fails every caller with gcommTimeout naming
 * it. Every survivor must reach the same set (else gcommInvalidUsage naming the rank that
 * differs). The new communicator, on this node or across nodes, gets fresh FIFOs and network
 * endpoints (comm stays usable after a DEFAULT shrink), and has no MPI communicator, so it cannot
 * be split. config NULL: inherit comm's. */
gcommResult_t gcommCommShrink(gcommComm_t comm, const int* excludeRanks, int nExclude,
                              gcommComm_t* newcomm, const gcommConfig_t* config, int flags);
/* gcommSuccess, or the error that stopped the communicator (set by the progress engine). */
gcommResult_t gcommCommGetAsyncError(gcommComm_t comm, gcommResult_t* asyncError);
gcommResult_t gcommCommCount(const gcommComm_t comm, int* count);
gcommResult_t gcommCommUserRank(const gcommComm_t comm, int* rank);
/* The CUDA/HIP device of comm, or GCOMM_DEVICE_HOST. */
gcommResult_t gcommCommDevice(const gcommComm_t comm, int* device);

/* ---- Host memory the ranks of a node share ----
 * Host buffers for host communicators, page-aligned, zeroed. A step that another rank of the
 * node receives from such a buffer is read by that rank straight from it (one copy at a memcpy's
 * speed, or none where it reduces the data into its own result), where plain memory is copied
 * with process_vm_readv or twice through shared memory (GCOMM_CMA: either needs the right to
 * read the peer's memory, as a debugger would). Any memory works with every call; these buffers
 * make large transfers between the ranks of a node faster. A peer keeps its mapping of a buffer
 * after gcommHostFree until the communicator is destroyed or it maps more than 8 other buffers of
 * this rank: allocate a few, once, and use them many times. Any thread may call these. */
gcommResult_t gcommHostAlloc(void** ptr, size_t bytes);
/* Frees a buffer of gcommHostAlloc (NULL: nothing); no operation may still use it. */
gcommResult_t gcommHostFree(void* ptr);

/* ---- Collectives ----
 * Enqueue and return. On a GPU communicator they are ordered on stream; on a host communicator
 * (stream NULL) they run asynchronously and complete at gcommWait(comm, NULL), each call after
 * the earlier ones whose buffers it shares (as on a stream; a group's calls run together, so they
 * must not write what another of the group uses). In-place: sendbuff
 * == recvbuff for AllReduce, Broadcast, Reduce; recvbuff == sendbuff + rank*recvcount for
 * ReduceScatter and Scatter; sendbuff == recvbuff + rank*sendcount for AllGather and Gather;
 * sendbuff == recvbuff for AllToAll (as MPI_IN_PLACE: block j of the buffer goes to rank j, and
 * block r is replaced by what rank r sent; as with MPI_IN_PLACE, every rank in place or none: a
 * GPU communicator moves the two forms differently). Any other overlap is rejected. */
gcommResult_t gcommAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                             gcommDataType_t datatype, gcommRedOp_t op, gcommComm_t comm,
                             gcommStream_t stream);
gcommResult_t gcommBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                             gcommDataType_t datatype, int root, gcommComm_t comm,
                             gcommStream_t stream);
/* recvbuff is used on root only (it may be NULL elsewhere). */
gcommResult_t gcommReduce(const void* sendbuff, void* recvbuff, size_t count,
                          gcommDataType_t datatype, gcommRedOp_t op, int root, gcommComm_t comm,
                          gcommStream_t stream);
gcommResult_t gcommAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                             gcommDataType_t datatype, gcommComm_t comm, gcommStream_t stream);
gcommResult_t gcommReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                 gcommDataType_t datatype, gcommRedOp_t op, gcommComm_t comm,
                                 gcommStream_t stream);
/* count elements go to each peer: sendbuff and recvbuff hold nranks*count. */
gcommResult_t gcommAllToAll(const void* sendbuff, void* recvbuff, size_t count,
                            gcommDataType_t datatype, gcommComm_t comm, gcommStream_t stream);
/* recvbuff (nranks*sendcount) is used on root only. */
gcommResult_t gcommGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                          gcommDataType_t datatype, int root, gcommComm_t comm,
                          gcommStream_t stream);
/* sendbuff (nranks*recvcount) is used on root only. */
gcommResult_t gcommScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                           gcommDataType_t datatype, int root, gcommComm_t comm,
                           gcommStream_t stream);

/* ---- Vector collectives ----
 * MPI's argument order with one datatype: each rank's block has its own count, at its own
 * displacement (counts and displacements in elements). recvcounts and displs are used on root only
 * for GatherV, sendcounts and displs on root only for ScatterV. Every pair's counts must agree
 * (what one rank sends to another is what that one expects from it). In place: AllGatherV with
 * sendbuff == recvbuff + displs[rank] * element size, GatherV likewise on root, ScatterV with
 * recvbuff == sendbuff + displs[root] * element size on root. AllToAllV has no in-place form. */
gcommResult_t gcommAllGatherV(const void* sendbuff, size_t sendcount, void* recvbuff,
                              const size_t* recvcounts, const size_t* displs,
                              gcommDataType_t datatype, gcommComm_t comm, gcommStream_t stream);
gcommResult_t gcommAllToAllV(const void* sendbuff, const size_t* sendcounts, const size_t* sdispls,
                             void* recvbuff, const size_t* recvcounts, const size_t* rdispls,
                             gcommDataType_t datatype, gcommComm_t comm, gcommStream_t stream);
gcommResult_t gcommGatherV(const void* sendbuff, size_t sendcount, void* recvbuff,
                           const size_t* recvcounts, const size_t* displs, gcommDataType_t datatype,
                           int root, gcommComm_t comm, gcommStream_t stream);
gcommResult_t gcommScatterV(const void* sendbuff, const size_t* sendcounts, const size_t* displs,
                            void* recvbuff, size_t recvcount, gcommDataType_t datatype, int root,
                            gcommComm_t comm, gcommStream_t stream);

/* ---- Reduction operators ----
 * A PreMulSum operator multiplies each rank's input by that rank's scalar (of type datatype),
 * then sums: out = sum over ranks r of scalar_r * in_r (for Float16, Bfloat16 and fp8 the
 * product is taken in float; integer products wrap). It is valid with comm and datatype only, for
 * AllReduce, Reduce and ReduceScatter. Each rank creates its own (not collective). *op receives a
 * value >= gcommNumOps. A collective captures the operator when it is called, so the operator may
 * be destroyed as soon as the last call that uses it has returned; a device-resident scalar must
 * stay valid, and is read, until that operation completes. */
gcommResult_t gcommRedOpCreatePreMulSum(gcommRedOp_t* op, void* scalar, gcommDataType_t datatype,
                                        gcommScalarResidence_t residence, gcommComm_t comm);
gcommResult_t gcommRedOpDestroy(gcommRedOp_t op, gcommComm_t comm);

/* ---- Point to point ----
 * Sends and receives between one pair match in call order. Inside a group they never deadlock,
 * whatever the order of the calls. */
gcommResult_t gcommSend(const void* sendbuff, size_t count, gcommDataType_t datatype, int peer,
                        gcommComm_t comm, gcommStream_t stream);
gcommResult_t gcommRecv(void* recvbuff, size_t count, gcommDataType_t datatype, int peer,
                        gcommComm_t comm, gcommStream_t stream);

/* ---- Groups ----
 * Calls between GroupStart and GroupEnd are queued and launched together at GroupEnd (one launch
 * per communicator). Groups nest; only the outermost GroupEnd launches. */
gcommResult_t gcommGroupStart(void);
gcommResult_t gcommGroupEnd(void);

/* ---- Progress and completion ---- */
/* One pass of comm's progress engine. Needed in GCOMM_PROXY_POLL mode; harmless otherwise. */
gcommResult_t gcommProgress(gcommComm_t comm);
/* Returns when everything comm enqueued on stream is complete (a host communicator: stream
 * NULL), driving progress itself in poll mode. Returns the first error of that work. */
gcommResult_t gcommWait(gcommComm_t comm, gcommStream_t stream);
/* gcommSuccess when everything enqueued on stream is complete, gcommInProgress when not; never
 * blocks (it runs one progress pass in poll mode). */
gcommResult_t gcommTest(gcommComm_t comm, gcommStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* GCOMM_H */
