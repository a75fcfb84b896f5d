/*
 * gcomm_profiler.h - the profiler plugin ABI of gcomm, version 1, in the shape of NCCL's
 * (ncclProfiler_v*): a shared library exports `gcommProfiler_v1`, a gcommProfiler_v1_t, and
 * gcomm calls it as operations are enqueued and run. C11 (anonymous unions); needs gcomm.h for
 * gcommResult_t.
 *
 * Loading. GCOMM_PROFILER_PLUGIN names the library when a communicator is created: a path (any
 * value with a '/'), or a short name NAME for libgcomm-profiler-NAME.so on the loader's search
 * path (LD_LIBRARY_PATH), or a library name as given; unset, empty or "none": no profiler. A
 * library that does not load, lacks the symbol, or whose init fails is reported with a warning
 * and the communicator runs without a profiler. A loaded library stays loaded until the process
 * exits (RTLD_NODELETE): its process-wide state outlives the communicators.
 *
 * Calls. init once per communicator (each has its own context), finalize when it is destroyed.
 * startEvent/stopEvent/recordEventState come from the thread that enqueues and from the progress
 * thread at the same time: a plugin must be thread-safe. The core calls stopEvent only for a
 * non-NULL handle: a plugin that does not want an event returns *eHandle = NULL.
 *
 * Mask. init sets *eActivationMask (gcommProfile* bits); gcomm reads it at every hook, so a plugin
 * may change it later (e.g. to sample). With no plugin each hook costs one predictable branch.
 *
 * Nesting (parentObj is the parent's handle, or NULL):
 *   Group -> Coll / P2p -> ProxyOp (host communicators) -> ProxyStep
 *                       -> KernelCh (GPU communicators)
 *   ProxyCtrl and Net have no parent.
 * A Group is one gcommGroupStart/End on one communicator (calls outside a group have no Group).
 * As in NCCL, a Coll or P2p stops when it is enqueued, before it runs: its children start later.
 * So a plugin keeps a Coll/P2p handle valid until its own stop and the stops of its nChannels
 * children (ProxyOp on a host communicator, KernelCh on a GPU one, when the mask enables them).
 * On a communicator that failed or was aborted some events never start or stop: finalize frees
 * whatever the plugin still holds; the core never uses a handle after finalize.
 *
 * Time. Plugins take their own timestamps; the core passes times only for KernelCh, already
 * converted to the host's CLOCK_MONOTONIC in nanoseconds (use the same clock to line them up).
 */
#ifndef GCOMM_PROFILER_H
#define GCOMM_PROFILER_H

#include <stddef.h>
#include <stdint.h>

#include "gcomm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Event types, also the bits of the activation mask. */
typedef enum {
  gcommProfileGroup = 1 << 0,     /* a group's operations on one communicator */
  gcommProfileColl = 1 << 1,      /* a collective, from the call until it is enqueued */
  gcommProfileP2p = 1 << 2,       /* a Send or Recv, likewise */
  gcommProfileProxyOp = 1 << 3,   /* the progress engine runs one channel of an operation */
  gcommProfileProxyStep = 1 << 4, /* one step of it: from the first try until it has run */
  gcommProfileProxyCtrl = 1 << 5, /* the progress thread: sleeping, fetching posted operations */
  gcommProfileKernelCh = 1 << 6,  /* one channel of an operation in a GPU kernel */
  gcommProfileNet = 1 << 7,       /* one network message (make OFI=1), post to completion */
  gcommProfileAll = (1 << 8) - 1
} gcommProfilerEventType_t;

typedef struct {
  uint64_t type;   /* one gcommProfilerEventType_t */
  void* parentObj; /* the parent's handle, or NULL */
  int rank;        /* in the communicator */
  union {
    struct {
      const char* name;   /* "AllReduce", "Broadcast", ... */
      uint64_t seqNumber; /* the communicator's collective counter: the same on every rank */
      size_t count;
      const char* datatype;  /* "float32", ... */
      size_t bytes;          /* the size every rank agrees on (nccl-tests' size): count x type size,
                                x nRanks for AllGather, ReduceScatter, AllToAll, Gather and Scatter */
      const char* op;        /* "sum", ...; "none" where the collective does not reduce */
      int root;              /* -1 where there is none */
      const char* algorithm; /* "ring", "tree", "direct" */
      const char* protocol;  /* "simple" */
      int nChannels;         /* channels it runs on: the number of its children */
      const void* sendBuff;
      void* recvBuff;
    } coll;
    struct {
      const char* name; /* "Send" or "Recv" */
      int peer;
      size_t count;
      const char* datatype;
      size_t bytes;
      int nChannels; /* point-to-point channels it runs on: the number of its children */
      const void* buff;
    } p2p;
    struct {
      int channelId;    /* the channel (lane) whose FIFOs it uses */
      int peer;         /* Send/Recv: the peer; a collective talks to several: -1 */
      long nSteps;      /* ProxyStep children */
      size_t chunkSize; /* bytes of one full step */
      int isSend;       /* 1 Send, 0 Recv, -1 a collective (sends and receives) */
    } proxyOp;
    struct {
      long step;    /* 0 .. nSteps-1 */
      size_t bytes; /* moved by this step */
      int sendPeer; /* the peer it sends to, or -1 */
      int recvPeer; /* the peer it receives from, or -1 */
    } proxyStep;
    struct {
      int channelId;
      uint64_t startNs, stopNs; /* host CLOCK_MONOTONIC ns (0: not measured) */
    } kernelCh;
    struct {
      int peer;
      int channelId;
      uint64_t step; /* the connection's message counter */
      size_t bytes;  /* sends: the payload; receives: the slot's size */
      int isSend;
    } net;
  };
} gcommProfilerEventDescr_v1_t;

typedef enum {
  gcommProfilerProxyStepSendWait = 1, /* the step waits for room in a peer's FIFO */
  gcommProfilerProxyStepRecvWait = 2, /* the step waits for a peer's data */
  gcommProfilerProxyCtrlSleep = 3,    /* starts a ProxyCtrl: the progress thread sleeps, idle */
  gcommProfilerProxyCtrlWakeup = 4,   /* ... and wakes up (then the event stops) */
  gcommProfilerProxyCtrlAppend = 5,   /* starts a ProxyCtrl: fetching posted operations */
  gcommProfilerProxyCtrlAppendEnd = 6 /* ... done (args: how many), then the event stops */
} gcommProfilerEventState_v1_t;

typedef union {
  struct {
    int peer; /* the peer waited for */
  } proxyStep;
  struct {
    int appendedProxyOps;
  } proxyCtrl;
} gcommProfilerEventStateArgs_v1_t;

/* Log levels for logfn: 1 WARN, 2 INFO, 3 TRACE (GCOMM_DEBUG); flags is ignored. */
typedef void (*gcommDebugLogger_t)(int level, unsigned long flags, const char* file, int line,
                                   const char* fmt, ...);

typedef struct {
  const char* name;
  /* Once per communicator. commId is the same on every rank of the communicator. Anything but
   * gcommSuccess disables the profiler for this communicator. */
  gcommResult_t (*init)(void** context, uint64_t commId, int* eActivationMask, const char* commName,
                        int nNodes, int nRanks, int rank, gcommDebugLogger_t logfn);
  gcommResult_t (*startEvent)(void* context, void** eHandle, gcommProfilerEventDescr_v1_t* eDescr);
  gcommResult_t (*stopEvent)(void* eHandle);
  gcommResult_t (*recordEventState)(void* eHandle, gcommProfilerEventState_v1_t eState,
                                    gcommProfilerEventStateArgs_v1_t* eStateArgs);
  gcommResult_t (*finalize)(void* context);
} gcommProfiler_v1_t;

#define GCOMM_PROFILER_SYMBOL "gcommProfiler_v1"

#ifdef __cplusplus
}
#endif
#endif /* GCOMM_PROFILER_H */
