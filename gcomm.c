/*
 * gcomm.c - the core of gcomm: parameters and logging, bootstrap over MPI, communicators,
 * argument checks, enqueue and groups, the cost model, the host executor and the progress
 * engine. Read top to bottom; the path of one collective is:
 *
 *   gcommAllReduce -> checkArgs -> enqueue (group-aware) -> chooseAlgo -> works, one per channel
 *   -> posted to the progress engine -> each progress pass advances the head work of every queue
 *   by the steps of its schedule (gcomm_sched.h) whose FIFOs are ready -> the op completes when
 *   all of its works have -> gcommWait returns.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "gcomm_internal.h"
#ifdef GCOMM_GPU
#include "gcomm_device.h"
#endif

/* ======================================================================================== */
/* Parameters: every GCOMM_* variable, in one table.                                        */
/* ======================================================================================== */

enum { PARAM_INT, PARAM_SIZE, PARAM_ENUM, PARAM_STR, PARAM_LOG };

static const char* const algoNames[] = {"ring", "tree", "direct", "twoshot", NULL};
static const char* const protoNames[] = {"simple", "ll", NULL};
static const char* const proxyModeNames[] = {"thread", "poll", NULL};
#if defined(GCOMM_GPU) && defined(GCOMM_OFI)
static const char* const netGdrNames[] = {"0", "1", "auto", NULL}; /* GCOMM_NET_GDR_OFF, ON, AUTO */
#endif

typedef struct {
  const char* name;
  const char* defaultValue;
  int kind;
  int offset;                 /* into gcommParams_t, -1 for the process-wide logging knobs */
  const char* const* choices; /* PARAM_ENUM */
  int64_t min, max;           /* PARAM_INT, PARAM_SIZE */
  const char* doc;
  int shared; /* SHARED: it shapes the schedule or the wire, so every rank must have the same */
} gcommParamDef_t;
#define SHARED 1
#define LOCAL 0

#define PARAM_AT(field) ((int)offsetof(gcommParams_t, field))
static const gcommParamDef_t paramTable[] = {
    {"GCOMM_DEBUG", "WARN", PARAM_LOG, -1, NULL, 0, 0, "log level: NONE, WARN, INFO or TRACE",
     LOCAL},
    {"GCOMM_DEBUG_SUBSYS", "ALL", PARAM_LOG, -1, NULL, 0, 0,
     "comma list of INIT, COLL, P2P, PROXY, NET, SHM, TUNING, ENV, ALL; ^ excludes", LOCAL},
    {"GCOMM_DEBUG_FILE", "", PARAM_LOG, -1, NULL, 0, 0,
     "log to this file instead of stderr; %h is the host name, %p the pid", LOCAL},
    {"GCOMM_ALGO", "", PARAM_ENUM, PARAM_AT(algo), algoNames, 0, 0,
     "force the algorithm: ring, tree or direct (default: the cost model picks)", SHARED},
    {"GCOMM_PROTO", "", PARAM_ENUM, PARAM_AT(proto), protoNames, 0, 0,
     "GPU communicators: force the protocol, simple or ll (default: the cost model picks)", SHARED},
    {"GCOMM_NCHANNELS", "2", PARAM_INT, PARAM_AT(nChannels), NULL, 1, GCOMM_MAX_CHANNELS,
     "parallel channels (each with its own FIFOs); config.nChannels", SHARED},
    {"GCOMM_BUFFSIZE", "1M", PARAM_SIZE, PARAM_AT(buffSize), NULL, 512, (int64_t)1 << 30,
     "bytes of one connection FIFO (8 slots)", SHARED},
    {"GCOMM_PROXY_MODE", "thread", PARAM_ENUM, PARAM_AT(proxyMode), proxyModeNames, 0, 0,
     "thread: a progress thread per communicator; poll: the caller drives progress", LOCAL},
    {"GCOMM_PROGRESS_APPENDOP_FREQ", "8", PARAM_INT, PARAM_AT(appendFreq), NULL, 1, 1 << 20,
     "progress passes between fetches of newly posted operations", LOCAL},
    {"GCOMM_PROXY_APPEND_BATCH_SIZE", "16", PARAM_INT, PARAM_AT(appendBatch), NULL, 1, 1 << 20,
     "most operations fetched at once", LOCAL},
    {"GCOMM_PROXY_DUMP_SIGNAL", "0", PARAM_INT, PARAM_AT(dumpSignal), NULL, 0, 64,
     "on this signal, print every active operation, its state and counters (0: off)", LOCAL},
    {"GCOMM_TIMEOUT_MS", "300000", PARAM_INT, PARAM_AT(timeoutMs), NULL, 1, INT64_MAX / 1000000,
     "deadline of every wait, in milliseconds", LOCAL},
    {"GCOMM_CHECK_MISMATCH", "1", PARAM_INT, PARAM_AT(checkMismatch), NULL, 0, 1,
     "1: ranks whose calls differ (collective, count, datatype, op, root) fail naming the rank",
     SHARED},
    {"GCOMM_HOSTID", "", PARAM_STR, PARAM_AT(hostId), NULL, 0, 0,
     "ranks with the same value share a node (default: MPI_COMM_TYPE_SHARED)", LOCAL},
    {"GCOMM_PROFILER_PLUGIN", "", PARAM_STR, PARAM_AT(profilerPlugin), NULL, 0, 0,
     "profiler plugin: a path, or NAME for libgcomm-profiler-NAME.so (default: none)", LOCAL},
#ifdef GCOMM_GPU
    {"GCOMM_P2P_DISABLE", "0", PARAM_INT, PARAM_AT(p2pDisable), NULL, 0, 1,
     "1: GPU FIFOs in pinned shared host memory instead of GPU memory shared through IPC", SHARED},
    {"GCOMM_P2P_USE_CUDA_MEMCPY", "0", PARAM_INT, PARAM_AT(p2pMemcpy), NULL, 0, 1,
     "1: GPU sends to local ranks through copy engines (cudaMemcpyAsync by the progress thread)",
     SHARED},
    {"GCOMM_PDL", "1", PARAM_INT, PARAM_AT(pdl), NULL, 0, 1,
     "0: a small GPU launch never starts before the previous one on its stream has finished",
     LOCAL},
#endif
#ifdef GCOMM_OFI
    {"GCOMM_NET_DISABLE", "0", PARAM_INT, PARAM_AT(netDisable), NULL, 0, 1,
     "1: refuse ranks on other nodes instead of using the network (OFI=1 builds)", SHARED},
    {"GCOMM_OFI_PROVIDER", "", PARAM_STR, PARAM_AT(ofiProvider), NULL, 0, 0,
     "libfabric provider, e.g. tcp or shm (default: the best found, tcp last; never shm)", SHARED},
    {"GCOMM_OFI_IFACE", "", PARAM_STR, PARAM_AT(ofiIface), NULL, 0, 0,
     "only use the provider's domain of this name (tcp: the interface, e.g. eth0 or lo)", LOCAL},
    {"GCOMM_NET_SHARED_BUFFERS", "1", PARAM_INT, PARAM_AT(netSharedBuffers), NULL, 0, 1,
     "1: every network FIFO in one registered region; 0: one registration per FIFO", LOCAL},
    {"GCOMM_NET_ENDPOINTS", "1", PARAM_INT, PARAM_AT(netEndpoints), NULL, 1, 4,
     "network endpoints (so connections per peer); lane l uses endpoint l mod this", SHARED},
#endif
#if defined(GCOMM_GPU) && defined(GCOMM_OFI)
    {"GCOMM_NET_GDR", "auto", PARAM_ENUM, PARAM_AT(netGdr), netGdrNames, 0, 0,
     "GPU comms across nodes: network FIFO slots in GPU memory (FI_HMEM): 0, 1 (required), auto",
     LOCAL},
#endif
};
#define NPARAMS ((int)(sizeof(paramTable) / sizeof(paramTable[0])))

/* Integers with an optional K, M or G suffix (powers of two). */
static int parseInt(const char* s, int64_t* out) {
  char* end;
  errno = 0;
  long long v = strtoll(s, &end, 0);
  if (errno != 0 || end == s) return -1;
  int shift = 0;
  if (*end == 'k' || *end == 'K') shift = 10;
  if (*end == 'm' || *end == 'M') shift = 20;
  if (*end == 'g' || *end == 'G') shift = 30;
  if (shift) end++;
  if (*end != 0) return -1;
  if (shift && (v > (LLONG_MAX >> shift) || v < (LLONG_MIN >> shift))) return -1;
  *out = (int64_t)v * ((int64_t)1 << shift);
  return 0;
}

static int parseEnum(const char* s, const char* const* choices) {
  for (int i = 0; choices[i] != NULL; i++)
    if (strcasecmp(s, choices[i]) == 0) return i;
  return -1;
}

/* Sets one parameter from text; -1 when the text is not a valid value. */
static int paramSet(gcommParams_t* p, const gcommParamDef_t* d, const char* text) {
  char* field = (char*)p + d->offset;
  int64_t v;
  switch (d->kind) {
    case PARAM_INT:
    case PARAM_SIZE:
      if (parseInt(text, &v) != 0 || v < d->min || v > d->max) return -1;
      if (d->offset == PARAM_AT(nChannels))
        *(int*)field = (int)v;
      else
        *(int64_t*)field = v;
      return 0;
    case PARAM_ENUM:
      /* empty is the default (found by the fuzzer: GCOMM_PROXY_MODE="" gave neither mode); only
       * GCOMM_ALGO's default is empty: -1, nothing forced */
      if (text[0] == 0) text = d->defaultValue;
      v = text[0] == 0 ? -1 : parseEnum(text, d->choices);
      if (text[0] != 0 && v < 0) return -1;
      *(int*)field = (int)v;
      return 0;
    case PARAM_STR:
      *(const char**)field = text[0] ? text : NULL;
      return 0;
  }
  return -1;
}

/* Defaults, then the config's fields, then the environment (which wins). comm (for the
 * warnings) may be NULL. */
static void paramsLoad(gcommParams_t* p, gcommComm_t comm, const gcommConfig_t* config) {
  for (int i = 0; i < NPARAMS; i++)
    if (paramTable[i].kind != PARAM_LOG) paramSet(p, &paramTable[i], paramTable[i].defaultValue);
  if (config != NULL) {
    if (config->proxyMode != GCOMM_CONFIG_UNDEF_INT) p->proxyMode = config->proxyMode;
    if (config->nChannels != GCOMM_CONFIG_UNDEF_INT) p->nChannels = config->nChannels;
  }
  for (int i = 0; i < NPARAMS; i++) {
    const char* env = getenv(paramTable[i].name);
    if (env == NULL || paramTable[i].kind == PARAM_LOG) continue;
    if (paramSet(p, &paramTable[i], env) != 0)
      GCOMM_WARN(comm, "%s=\"%s\" is not valid (%s); using %s", paramTable[i].name, env,
                 paramTable[i].doc, paramTable[i].defaultValue);
  }
}

void gcommParamsRead(gcommParams_t* params) { paramsLoad(params, NULL, NULL); }

static void paramsPrint(gcommComm_t comm) {
  if (!gcommLogEnabled(GCOMM_LOG_INFO, GCOMM_SUBSYS_ENV) || comm->rank != 0) return;
  for (int i = 0; i < NPARAMS; i++) {
    const char* env = getenv(paramTable[i].name);
    GCOMM_INFO(GCOMM_SUBSYS_ENV, comm, "%-30s = %-10s (default %s%s) %s", paramTable[i].name,
               env ? env : paramTable[i].defaultValue,
               paramTable[i].defaultValue[0] ? paramTable[i].defaultValue : "unset",
               env ? ", from the environment" : "", paramTable[i].doc);
  }
}

/* ======================================================================================== */
/* Logging and errors                                                                       */
/* ======================================================================================== */

static pthread_once_t logOnce = PTHREAD_ONCE_INIT;
static int logLevel = GCOMM_LOG_WARN;
static int logSubsys = GCOMM_SUBSYS_ALL;
static FILE* logFile;
static pthread_mutex_t logLock = PTHREAD_MUTEX_INITIALIZER;
static char hostName[64];
static __thread char threadLastError[1024];

static const char* const subsysNames[] = {"INIT", "COLL",   "P2P", "PROXY",   "NET",
                                          "SHM",  "TUNING", "ENV", "PROFILE", NULL};

static const char* const logLevels[] = {"NONE", "WARN", "INFO", "TRACE", NULL};

/* GCOMM_DEBUG_SUBSYS: a mask of subsystems, or -1 when a name is not one (the caller keeps the
 * default: a typo must not silence every message). */
static int parseSubsys(const char* subsys) {
  char buf[256];
  int exclude = subsys[0] == '^', mask = 0;
  snprintf(buf, sizeof(buf), "%s", subsys + exclude);
  for (char *save, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    int i = parseEnum(tok, subsysNames);
    if (i < 0 && strcasecmp(tok, "ALL") != 0) return -1;
    mask |= i >= 0 ? 1 << i : GCOMM_SUBSYS_ALL;
  }
  return exclude ? (GCOMM_SUBSYS_ALL & ~mask) : mask;
}

/* GCOMM_DEBUG_FILE: %h becomes the host name, %p the pid; truncated to size - 1 bytes. */
static void expandPath(const char* pattern, char* path, size_t size) {
  size_t n = 0;
  for (const char* c = pattern; *c && n + 1 < size; c++) {
    if (c[0] == '%' && c[1] == 'h')
      n += snprintf(path + n, size - n, "%s", hostName), c++;
    else if (c[0] == '%' && c[1] == 'p')
      n += snprintf(path + n, size - n, "%d", (int)getpid()), c++;
    else
      path[n++] = *c;
    if (n >= size) n = size - 1; /* snprintf truncated */
  }
  path[n] = 0;
}

/* GCOMM_DEBUG_FILE: created 0600 (a log names hosts, pids and buffers), appended to, and never
 * through a symbolic link (another user's /tmp/x -> /root/file would make this job write
 * there). NULL with errno set when it cannot be opened. */
static void logWrite(int level, gcommComm_t comm, const char* where, const char* msg);

static FILE* openLogFile(const char* path) {
  int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_CLOEXEC, 0600);
  FILE* f = fd >= 0 ? fdopen(fd, "a") : NULL;
  if (f == NULL && fd >= 0) close(fd);
  return f;
}

static void logInit(void) {
  char bad[3][PATH_MAX + 160];
  int nBad = 0;
  gethostname(hostName, sizeof(hostName) - 1);
  const char* level = getenv("GCOMM_DEBUG");
  if (level != NULL && level[0] != 0 && parseEnum(level, logLevels) < 0)
    snprintf(bad[nBad++], sizeof(bad[0]),
             "GCOMM_DEBUG=\"%.64s\" is not a level (NONE, WARN, INFO or TRACE): using WARN", level);
  else if (level != NULL && level[0] != 0)
    logLevel = parseEnum(level, logLevels);
  const char* subsys = getenv("GCOMM_DEBUG_SUBSYS");
  int mask = subsys != NULL && subsys[0] != 0 ? parseSubsys(subsys) : GCOMM_SUBSYS_ALL;
  if (mask < 0)
    snprintf(bad[nBad++], sizeof(bad[0]),
             "GCOMM_DEBUG_SUBSYS=\"%.64s\" names no subsystem of INIT, COLL, P2P, PROXY, NET, "
             "SHM, TUNING, ENV, PROFILE, ALL: using ALL",
             subsys);
  else
    logSubsys = mask;
  const char* file = getenv("GCOMM_DEBUG_FILE");
  if (file != NULL && file[0] != 0) {
    char path[PATH_MAX];
    expandPath(file, path, sizeof(path));
    logFile = openLogFile(path);
    if (logFile == NULL)
      snprintf(bad[nBad++], sizeof(bad[0]),
               "GCOMM_DEBUG_FILE: cannot open %s (%s; a symbolic link is refused): logging to "
               "stderr",
               path, strerror(errno));
  }
  if (logFile == NULL) logFile = stderr;
  for (int i = 0; i < nBad && logLevel >= GCOMM_LOG_WARN; i++)
    logWrite(GCOMM_LOG_WARN, NULL, "logInit", bad[i]);
}

/* ---- The params table as gcomm_info (tools/gcomm_info.c) reads it ---- */

int gcommParamInfo(int i, gcommParamInfo_t* info) {
  if (i < 0 || i >= NPARAMS) return -1;
  info->name = paramTable[i].name;
  info->defaultValue = paramTable[i].defaultValue;
  info->doc = paramTable[i].doc;
  return 0;
}

/* The logging knobs, read once by logInit: what it makes of text. */
static int logKnobParse(const gcommParamDef_t* d, const char* text, char* out, size_t len) {
  if (strcmp(d->name, "GCOMM_DEBUG") == 0) {
    int level = parseEnum(text, logLevels);
    if (level < 0) return -1;
    snprintf(out, len, "%s", logLevels[level]);
  } else if (strcmp(d->name, "GCOMM_DEBUG_SUBSYS") == 0) {
    snprintf(out, len, "mask 0x%x", (unsigned)parseSubsys(text));
  } else {
    pthread_once(&logOnce, logInit); /* the host name */
    expandPath(text, out, len);
  }
  return 0;
}

int gcommParamParse(int i, const char* text, char* out, size_t len) {
  if (i < 0 || i >= NPARAMS || len == 0) return -1;
  const gcommParamDef_t* d = &paramTable[i];
  if (d->kind == PARAM_LOG) return logKnobParse(d, text, out, len);
  gcommParams_t p;
  memset(&p, 0, sizeof(p));
  if (paramSet(&p, d, text) != 0) return -1;
  const char* field = (const char*)&p + d->offset;
  if (d->kind == PARAM_ENUM) {
    int v = *(const int*)field;
    snprintf(out, len, "%s", v < 0 ? "(the cost model's)" : d->choices[v]);
  } else if (d->kind == PARAM_STR) {
    snprintf(out, len, "%s", text[0] ? text : "(unset)");
  } else {
    long long v = d->offset == PARAM_AT(nChannels) ? *(const int*)field : *(const int64_t*)field;
    snprintf(out, len, "%lld", v);
  }
  return 0;
}

int gcommLogEnabled(int level, int subsys) {
  pthread_once(&logOnce, logInit);
  return level <= logLevel && (subsys & logSubsys);
}

static void logWrite(int level, gcommComm_t comm, const char* where, const char* msg) {
  static const char* const tags[] = {"", "WARN", "INFO", "TRACE"};
  pthread_mutex_lock(&logLock);
  if (comm != NULL)
    fprintf(logFile, "%s:%d:%ld [%d] GCOMM %s %s: %s\n", hostName, (int)getpid(),
            (long)syscall(SYS_gettid), comm->rank, tags[level], where, msg);
  else
    fprintf(logFile, "%s:%d:%ld GCOMM %s %s: %s\n", hostName, (int)getpid(),
            (long)syscall(SYS_gettid), tags[level], where, msg);
  fflush(logFile);
  pthread_mutex_unlock(&logLock);
}

void gcommLog(int level, int subsys, gcommComm_t comm, const char* where, const char* fmt, ...) {
  if (!gcommLogEnabled(level, subsys)) return;
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  logWrite(level, comm, where, msg);
}

gcommResult_t gcommSetError(gcommComm_t comm, gcommResult_t res, int peer, const char* where,
                            const char* fmt, ...) {
  char msg[768], full[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  if (comm != NULL && peer >= 0 && comm->cards != NULL && peer < comm->nranks)
    snprintf(full, sizeof(full), "%s: %s (peer rank %d, pid %d on %s) [%s]", where, msg, peer,
             (int)comm->cards[peer].pid, comm->cards[peer].host, gcommGetErrorString(res));
  else if (peer >= 0)
    snprintf(full, sizeof(full), "%s: %s (peer rank %d) [%s]", where, msg, peer,
             gcommGetErrorString(res));
  else
    snprintf(full, sizeof(full), "%s: %s [%s]", where, msg, gcommGetErrorString(res));
  snprintf(threadLastError, sizeof(threadLastError), "%s", full);
  if (comm != NULL) {
    pthread_mutex_lock(&comm->errorLock);
    snprintf(comm->lastError, sizeof(comm->lastError), "%s", full);
    pthread_mutex_unlock(&comm->errorLock);
  }
  pthread_once(&logOnce, logInit);
  if (logLevel >= GCOMM_LOG_WARN) logWrite(GCOMM_LOG_WARN, comm, "error", full);
  return res;
}

const char* gcommGetErrorString(gcommResult_t result) {
  switch (result) {
    case gcommSuccess:
      return "no error";
    case gcommInvalidArgument:
      return "invalid argument";
    case gcommInvalidUsage:
      return "invalid usage";
    case gcommSystemError:
      return "system error";
    case gcommInternalError:
      return "internal error";
    case gcommDeviceError:
      return "device (CUDA/HIP) error";
    case gcommRemoteError:
      return "remote error: another rank failed";
    case gcommTimeout:
      return "timeout";
    case gcommAborted:
      return "aborted";
    case gcommInProgress:
      return "in progress";
    default:
      return "unknown result code";
  }
}

static int commIsLive(gcommComm_t comm);

const char* gcommGetLastError(gcommComm_t comm) {
  if (comm != NULL && commIsLive(comm)) return comm->lastError;
  return threadLastError;
}

gcommResult_t gcommGetVersion(int* version) {
  if (version == NULL) return GCOMM_ERROR(NULL, gcommInvalidArgument, -1, "version is NULL");
  *version = GCOMM_VERSION_CODE;
  return gcommSuccess;
}

uint64_t gcommNowNs(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Waiting politely: spin a few microseconds, then yield the core, then (when mayNap) sleep for a
 * fraction of the time already waited (at most 1 ms, so that an abort or a deadline is seen
 * quickly). Many ranks share few cores in tests. *idleSince is 0 while things move. Returns
 * microseconds idle. */
static uint64_t backoff(uint64_t* idleSince, int mayNap) {
  uint64_t now = gcommNowNs();
  if (*idleSince == 0) *idleSince = now;
  uint64_t us = (now - *idleSince) / 1000;
  if (us < 5) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  } else if (us < 2000 || !mayNap) {
    sched_yield();
  } else {
    struct timespec ts = {0, (long)(us / 16 < 1000 ? us / 16 : 1000) * 1000};
    nanosleep(&ts, NULL);
  }
  return us;
}

/* ======================================================================================== */
/* The host executor: runs one step of a schedule when all of its FIFOs are ready.          */
/* ======================================================================================== */

static gcommConn_t* sendConn(gcommComm_t comm, int lane, int peer) {
  return &comm->sendConns[lane * comm->nranks + peer];
}
static gcommConn_t* recvConn(gcommComm_t comm, int lane, int peer) {
  return &comm->recvConns[lane * comm->nranks + peer];
}

static char* opBuffer(const gcommOp_t* op, int which) {
  if (which == GCOMM_BUF_IN) return (char*)op->sendbuff;
  if (which == GCOMM_BUF_OUT) return (char*)op->recvbuff;
  return NULL;
}

static const char* const funcNames[gcommNumFuncs] = {
    "AllReduce", "Broadcast", "Reduce", "AllGather",  "ReduceScatter", "AllToAll", "Gather",
    "Scatter",   "Send",      "Recv",   "AllGatherV", "AllToAllV",     "GatherV",  "ScatterV"};
const char* gcommFuncName(int func) {
  return (unsigned)func < gcommNumFuncs ? funcNames[func] : "?";
}

int gcommLocalIndex(gcommComm_t comm, int rank) {
  int idx = 0;
  for (int q = 0; q < rank; q++) idx += comm->cards[q].hostId == comm->cards[rank].hostId;
  return idx;
}

/* Whether some ranks are on other nodes (the same answer on every rank). */
static int spansNodes(gcommComm_t comm) {
  return comm->nLocal < comm->nranks;
}

/* Whether threads in gcommWait run the progress passes themselves (host communicators, thread
 * mode: see gcommWait), the progress thread serving only work nobody waits on. */
static int waitersDrive(gcommComm_t comm) {
  return comm->device < 0;
}

/* A GPU communicator whose kernels stage data to other nodes through network FIFOs in pinned
 * host memory (transports/p2p.c), which only the progress thread moves. */
static int stagesNet(gcommComm_t comm) {
#if defined(GCOMM_GPU) && defined(GCOMM_OFI)
  return comm->device >= 0 && comm->net != NULL;
#else
  (void)comm;
  return 0;
#endif
}

/* A GPU communicator whose kernels send to local ranks through staging FIFOs that the progress
 * thread copies with copy engines (GCOMM_P2P_USE_CUDA_MEMCPY, transports/p2p.c). */
static int copiesByEngine(gcommComm_t comm) {
#ifdef GCOMM_GPU
  return comm->device >= 0 && gcommDeviceCopyEngines(comm);
#else
  (void)comm;
  return 0;
#endif
}

/* A GPU communicator some of whose FIFOs a proxy on the progress thread moves (the network's,
 * the copy engines'): the thread runs from init to destroy, and LL is never used (its flags live
 * in the data, which the proxy moves keyed on the tail). */
static int hasGpuProxy(gcommComm_t comm) {
  return stagesNet(comm) || copiesByEngine(comm);
}
static const char* const typeNames[gcommNumTypes] = {
    "int8",    "uint8",   "int32",   "uint32",   "int64",      "uint64",
    "float16", "float32", "float64", "bfloat16", "float8e4m3", "float8e5m2"};
/* an operation's redop: gcomm.h's operators, then PreMulSum (GCOMM_OP_PREMULSUM) */
static const char* const opNames[GCOMM_OP_PREMULSUM + 1] = {"sum", "prod", "max",
                                                            "min", "avg",  "premulsum"};

/* Whether [a, a + alen) and [b, b + blen) share a byte. */
static int rangesMeet(const char* a, size_t alen, const char* b, size_t blen) {
  return a != NULL && b != NULL && a < b + blen && b < a + alen;
}

/* The peer of an unfinished network send from the caller's memory (gcommConn_t.refs) that
 * overlaps [p, p + len) on this lane, or -1; sends to rank peerDone below FIFO step doneBelow do
 * not count (the peer has received them). */
static int refOverlaps(gcommComm_t comm, int lane, const char* p, size_t len, int peerDone,
                       uint64_t doneBelow) {
  for (int q = 0; q < comm->nranks; q++) {
    gcommConn_t* c = sendConn(comm, lane, q);
    uint64_t s = c->refs ? __atomic_load_n(&c->fifo->head, __ATOMIC_ACQUIRE) : c->refUntil;
    if (q == peerDone && s < doneBelow) s = doneBelow;
    for (; s < c->refUntil; s++) {
      const char* r = c->refs[s % GCOMM_STEPS];
      if (rangesMeet(r, (uint32_t)c->fifo->bytes[s % GCOMM_STEPS], p, len)) return q;
    }
  }
  return -1;
}

static void bufferCounts(const gcommOp_t* op, int rank, int n, size_t* inCount, size_t* outCount);

/* Whether two operations split their memory alike: then each channel's work of one touches just
 * what the same channel's work of the other does, and its queue orders the two. */
static int sameSlices(const gcommOp_t* a, const gcommOp_t* b) {
  return a->func == b->func && a->count == b->count && a->datatype == b->datatype &&
         a->sendbuff == b->sendbuff && a->recvbuff == b->recvbuff && a->root == b->root &&
         a->peer == b->peer && a->nWorks == b->nWorks && a->proto == b->proto;
}

/* Whether an operation writes memory the other reads or writes, on this rank. */
static int opsConflict(gcommComm_t comm, const gcommOp_t* a, const gcommOp_t* b) {
  size_t aIn, aOut, bIn, bOut, aEsz = gcommTypeSize(a->datatype), bEsz = gcommTypeSize(b->datatype);
  bufferCounts(a, comm->rank, comm->nranks, &aIn, &aOut);
  bufferCounts(b, comm->rank, comm->nranks, &bIn, &bOut);
  aIn *= aEsz, aOut *= aEsz, bIn *= bEsz, bOut *= bEsz;
  return rangesMeet(a->recvbuff, aOut, b->sendbuff, bIn) ||
         rangesMeet(a->recvbuff, aOut, b->recvbuff, bOut) ||
         rangesMeet(b->recvbuff, bOut, a->sendbuff, aIn);
}

/* Host operations run in call order wherever they share memory, as on a stream: each queue runs
 * its works in order, but queues (channels, and each peer's sends and receives) run on their
 * own, so a work of an operation whose memory an earlier one, posted in another call or group,
 * still uses on another queue waits until that one has finished. Operations split alike
 * (sameSlices, e.g. the same all-reduce again) need no wait. A group's operations run
 * concurrently, as NCCL's do. Once true it stays true: earlier operations only finish. */
static int opMayStart(gcommComm_t comm, gcommOp_t* op) {
  if (op->mayStart) return 1;
  for (const gcommOp_t* e = op->prevActive; e != NULL; e = e->prevActive)
    if (e->batch != op->batch && !sameSlices(e, op) && opsConflict(comm, e, op)) return 0;
  op->mayStart = 1;
  return 1;
}

/* Whether a network send by reference on a lane other than lane (another channel's, or a send's)
 * still reads [p, p + len). Its operation may have finished: the message goes out later. */
static int refOverlapsElsewhere(gcommComm_t comm, int lane, const char* p, size_t len) {
  for (int l = 0; l < comm->nLanes; l++)
    if (l != lane && refOverlaps(comm, l, p, len, -1, 0) >= 0) return 1;
  return 0;
}

/* The memory w may write: its slice of the output where the channels split one buffer, else the
 * call's whole output (NULL when it writes none). */
static const char* workOutput(gcommComm_t comm, const gcommWork_t* w, size_t* len) {
  const gcommOp_t* op = w->op;
  size_t esz = gcommTypeSize(op->datatype), in, out;
  bufferCounts(op, comm->rank, comm->nranks, &in, &out);
  *len = 0;
  if (op->recvbuff == NULL || out == 0) return NULL;
  switch (op->func) {
    case gcommFuncAllReduce:
    case gcommFuncBroadcast:
    case gcommFuncReduce:
    case gcommFuncRecv:
      *len = w->sched.chanCount * esz;
      return (const char*)op->recvbuff + w->sched.chanOff * esz;
    default:
      *len = out * esz;
      return op->recvbuff;
  }
}

/* Whether w may run its first step: its operation may start (opMayStart) and, between nodes, no
 * send by reference of another lane still reads what it writes. */
static int workMayStart(gcommComm_t comm, gcommWork_t* w) {
  if (w->mayStart) return 1;
  if (!opMayStart(comm, w->op)) return 0;
  size_t len;
  const char* out = workOutput(comm, w, &len);
  w->mayStart = !spansNodes(comm) || !refOverlapsElsewhere(comm, w->lane, out, len);
  return w->mayStart;
}

#ifdef GCOMM_OFI
/* Steps [0, upTo) of schedule s that receive from (isRecv) or send to rank peer: the messages
 * they take from, or give to, that peer's FIFO. */
static uint64_t schedMessages(const gcommSched_t* s, long upTo, int peer, int isRecv) {
  uint64_t n = 0;
  for (long k = 0; k < upTo; k++) {
    gcommStep_t st;
    gcommSchedGetStep(s, k, &st);
    const int* with = isRecv ? st.recvPeer : st.sendPeer;
    n += with[0] == peer || with[1] == peer;
  }
  return n;
}

/* How many of this rank's messages of an operation (schedule s) rank peer has received when it
 * sends its message i of that operation to this rank: it runs the same schedule as its own rank,
 * and a step that both receives and sends has received first. */
static uint64_t peerReceivedBefore(const gcommSched_t* s, int peer, uint64_t i) {
  gcommSched_t theirs = *s;
  theirs.rank = peer;
  long n = gcommSchedNumSteps(&theirs);
  uint64_t sent = 0, got = 0;
  for (long k = 0; k < n; k++) {
    gcommStep_t st;
    gcommSchedGetStep(&theirs, k, &st);
    got += st.recvPeer[0] == s->rank || st.recvPeer[1] == s->rank;
    if ((st.sendPeer[0] == s->rank || st.sendPeer[1] == s->rank) && sent++ == i) return got;
  }
  return 0; /* no such message: nothing is known to have been received */
}

/* The last step of an all-gather phase copies what arrives into the output, half of what a rank
 * receives in a 2-rank all-reduce: received there directly, that copy goes. The works queued on
 * the lane (collective lanes only) tell which step takes FIFO step s (counting, from the head's
 * current step, those that receive from the peer). The data lands whenever the message comes,
 * before that step runs, so what that memory is used for before then must be over by the time the
 * message can come:
 *  - a step of this rank that reads or writes it has run, if it runs no later than this rank's
 *    send of a message the peer has received before it sends step s (peerReceivedBefore: the
 *    peer's schedule); an in-place all-reduce's all-gather half lands where its reduce-scatter
 *    sent from, which the peer received first;
 *  - a send by reference from it (refs) has been read if the peer has received it by then; one to
 *    another rank may still be read.
 * *queuedUntil: when none takes step s, the FIFO step after those they take, if its receive
 * should wait for the operation that does (c->holdRecvs), else UINT64_MAX. After a failure such a
 * receive may stay posted into the caller's memory until the communicator is destroyed (as MPI's
 * would). */
char* gcommNetDirectTarget(gcommComm_t comm, gcommConn_t* c, uint64_t s, size_t* bytes,
                           uint64_t* queuedUntil) {
  enum { LOOKAHEAD = 64 }; /* steps examined: a receive is at most GCOMM_STEPS ahead */
  int lane = (int)(c - comm->recvConns) / comm->nranks, peer = c->peer;
  *queuedUntil = UINT64_MAX;
  if (lane >= comm->nChannels || s < c->step) return NULL;
  gcommWork_t* head = comm->queues[lane].head;
  const gcommConn_t* out = sendConn(comm, lane, peer);
  struct {
    const char* p;
    size_t len;
    uint64_t sentBefore; /* this rank's next message to peer when that step runs */
    int toOthers;        /* the step sends to a rank other than peer */
  } touched[2 * LOOKAHEAD];
  int nTouched = 0;
  long scanned = 0;
  uint64_t at = c->step, sent = out->step; /* the next FIFO steps from and to peer */
  for (gcommWork_t* w = head; w != NULL; w = w->next) {
    const gcommOp_t* op = w->op;
    size_t esz = gcommTypeSize(op->datatype), largest = 0; /* of its messages from peer */
    long first = w == head ? w->step : 0;
    uint64_t recvFirst = at, sendFirst = sent; /* the FIFO steps at its step `first` */
    for (long k = first; k < w->nSteps; k++) {
      if (scanned++ == LOOKAHEAD) return NULL;
      gcommStep_t st;
      gcommSchedGetStep(&w->sched, k, &st);
      int fromPeer = st.recvPeer[0] == peer || st.recvPeer[1] == peer;
      int toPeer = st.sendPeer[0] == peer || st.sendPeer[1] == peer;
      int toOthers = (st.sendPeer[0] >= 0 && st.sendPeer[0] != peer) ||
                     (st.sendPeer[1] >= 0 && st.sendPeer[1] != peer);
      char* src = opBuffer(op, st.src);
      char* dst = opBuffer(op, st.dst);
      size_t len = st.count * esz;
      if (src) src += st.srcOff * esz;
      if (dst) dst += st.dstOff * esz;
      if (!fromPeer || at < s) {
        if (fromPeer && len > largest) largest = len;
        for (int i = 0; i < 2; i++) {
          touched[nTouched].p = i ? dst : src;
          touched[nTouched].len = len;
          touched[nTouched].sentBefore = sent;
          touched[nTouched++].toOthers = toOthers;
        }
        at += fromPeer;
        sent += toPeer;
        continue;
      }
      /* step k takes FIFO step s: a plain copy of the message into the output, once no earlier
       * operation on another lane still uses that memory */
      if (!opMayStart(comm, w->op) || st.recvPeer[1] >= 0 || st.reduce || st.postOp ||
          src != NULL || dst == NULL || len == 0 || len > c->slotBytes)
        return NULL;
      /* what else uses that memory first must be over by the time the message can come */
      if (refOverlapsElsewhere(comm, lane, dst, len)) return NULL;
      int used = refOverlaps(comm, lane, dst, len, -1, 0) >= 0;
      for (int i = 0; i < nTouched && !used; i++)
        used = rangesMeet(touched[i].p, touched[i].len, dst, len);
      if (used) {
        /* this rank's messages below `received` reached the peer before it sent step s */
        uint64_t recvBase = recvFirst - schedMessages(&w->sched, first, peer, 1);
        uint64_t received = sendFirst - schedMessages(&w->sched, first, peer, 0) +
                            peerReceivedBefore(&w->sched, peer, s - recvBase);
        for (int i = 0; i < nTouched; i++)
          if (rangesMeet(touched[i].p, touched[i].len, dst, len) &&
              (touched[i].toOthers || touched[i].sentBefore >= received))
            return NULL;
        if (refOverlaps(comm, lane, dst, len, peer, received) >= 0) return NULL;
      }
      *bytes = len;
      return dst;
    }
    if (largest > 0) c->holdRecvs = 2 * largest >= c->slotBytes;
  }
  *queuedUntil = c->holdRecvs ? at : UINT64_MAX;
  return NULL;
}
#endif

/* A step is ready when every FIFO it reads holds a slot, every FIFO it writes has room, and no
 * network send still reads the memory it writes (a send by reference: the next steps of an
 * in-place operation rewrite its input). Returns the peer it waits on (and whether for a
 * receive), or -1 when ready. */
static int stepBlockedOn(gcommComm_t comm, const gcommWork_t* w, const gcommStep_t* st,
                         int* isRecv) {
  int lane = w->lane;
  for (int i = 0; i < 2; i++) {
    if (st->recvPeer[i] < 0) continue;
    gcommConn_t* c = recvConn(comm, lane, st->recvPeer[i]);
    if (__atomic_load_n(&c->fifo->tail, __ATOMIC_ACQUIRE) <= c->step) {
      *isRecv = 1;
      return st->recvPeer[i];
    }
  }
  for (int i = 0; i < 2; i++) {
    if (st->sendPeer[i] < 0) continue;
    gcommConn_t* c = sendConn(comm, lane, st->sendPeer[i]);
    if (c->step - __atomic_load_n(&c->fifo->head, __ATOMIC_ACQUIRE) >= GCOMM_STEPS) {
      *isRecv = 0;
      return st->sendPeer[i];
    }
  }
  size_t esz = gcommTypeSize(w->op->datatype);
  char* dst = st->dst == GCOMM_BUF_NONE ? NULL : opBuffer(w->op, st->dst) + st->dstOff * esz;
  /* a message received into dst itself (gcommNetDirectTarget) leaves the step nothing to write */
  gcommConn_t* in = st->recvPeer[0] >= 0 ? recvConn(comm, lane, st->recvPeer[0]) : NULL;
  int landed = in != NULL && in->landed != NULL && in->landed[in->step % GCOMM_STEPS] == dst;
  int peer = dst == NULL || landed || !spansNodes(comm)
                 ? -1
                 : refOverlaps(comm, lane, dst, st->count * esz, -1, 0);
  *isRecv = 0;
  return peer;
}

/* The tag of a call: what every rank must agree on at one point of the FIFOs. Fields (bits): func
 * 0-3 (a Recv is tagged as the Send it matches), datatype 4-7, op 8-10, root 11-17 (mod 128),
 * collective seq 18-23 (mod 64), a hash of count 24-30, and bit 31 set (0 means "no tag"). */
#define TAG_FIELD(tag, shift, bits) (((tag) >> (shift)) & ((1u << (bits)) - 1))
static uint32_t opTag(const gcommOp_t* op) {
  int isP2p = op->func == gcommFuncSend || op->func == gcommFuncRecv;
  uint64_t h = (uint64_t)op->count * 0x9e3779b97f4a7c15ull;
  return (uint32_t)(isP2p ? gcommFuncSend : op->func) | (uint32_t)op->datatype << 4 |
         (uint32_t)op->redop << 8 | (uint32_t)(isP2p ? 0 : op->root & 127) << 11 |
         (uint32_t)(op->seq & 63) << 18 | (uint32_t)(h >> 57) << 24 | 1u << 31;
}

void gcommDescribeMismatch(char* buf, size_t len, uint64_t got, uint64_t expected) {
  uint32_t g = (uint32_t)(got >> 32), e = (uint32_t)(expected >> 32);
  unsigned gf = TAG_FIELD(g, 0, 4), gt = TAG_FIELD(g, 4, 4), go = TAG_FIELD(g, 8, 3);
  if (g == 0 || e == 0 || g == e) /* no tags (a remote peer, GCOMM_CHECK_MISMATCH=0) or alike */
    snprintf(buf, len, "it sent %llu bytes where this rank expects %llu (a different count)",
             (unsigned long long)(uint32_t)got, (unsigned long long)(uint32_t)expected);
  else if (gf != TAG_FIELD(e, 0, 4))
    snprintf(buf, len, "it called %s where this rank called %s", gcommFuncName((int)gf),
             gcommFuncName((int)TAG_FIELD(e, 0, 4)));
  else if (TAG_FIELD(g, 18, 6) != TAG_FIELD(e, 18, 6))
    snprintf(buf, len,
             "its collective is seq %u (mod 64) where this rank's is seq %u: a rank skipped a "
             "collective or called one more",
             TAG_FIELD(g, 18, 6), TAG_FIELD(e, 18, 6));
  else if (gt != TAG_FIELD(e, 4, 4))
    snprintf(buf, len, "its datatype is %s where this rank's is %s",
             gt < gcommNumTypes ? typeNames[gt] : "?",
             typeNames[TAG_FIELD(e, 4, 4) % gcommNumTypes]);
  else if (go != TAG_FIELD(e, 8, 3))
    snprintf(buf, len, "its op is %s where this rank's is %s",
             go <= GCOMM_OP_PREMULSUM ? opNames[go] : "?",
             opNames[TAG_FIELD(e, 8, 3) % (GCOMM_OP_PREMULSUM + 1)]);
  else if (TAG_FIELD(g, 11, 7) != TAG_FIELD(e, 11, 7))
    snprintf(buf, len, "its root is %u (mod 128) where this rank's is %u", TAG_FIELD(g, 11, 7),
             TAG_FIELD(e, 11, 7));
  else
    snprintf(buf, len, "its count differs from this rank's");
}

static char* slotOf(gcommConn_t* c) {
  return c->slots + (c->step % GCOMM_STEPS) * c->slotBytes;
}

/* Whether a step multiplies its local operand by the PreMulSum scalar: it reads the caller's input
 * (never an earlier partial result in the output) and uses it (a plain receive does not). */
static int stepScalesInput(const gcommOp_t* op, const gcommStep_t* st, int nIn) {
  return op->redop == GCOMM_OP_PREMULSUM && st->src == GCOMM_BUF_IN && (nIn == 0 || st->reduce);
}

/* The step's value into value (st->count elements): src [op in0 [op in1]], or in0 [op in1], then
 * Avg's division. PreMulSum scales src into value first (a host communicator's device-resident
 * scalar is read here, when the operation runs). */
static void stepValue(gcommComm_t comm, const gcommOp_t* op, const gcommStep_t* st, const char* src,
                      char* const* in, int nIn, char* value) {
  size_t bytes = st->count * gcommTypeSize(op->datatype);
  if (stepScalesInput(op, st, nIn)) {
    gcommPreMulArray(op->datatype, value, src, st->count,
                     op->scalarPtr ? op->scalarPtr : &op->scalar);
    src = value;
  }
  if (nIn == 0) {
    if (value != src) memcpy(value, src, bytes);
  } else if (!st->reduce) {
    if (value != in[0]) memcpy(value, in[0], bytes); /* else received in place */
  } else {
    int t = op->datatype, o = op->redop;
    if (src != NULL) { /* src op in0 [op in1] */
      gcommReduceArray(t, o, value, src, in[0], st->count);
      if (nIn == 2) gcommReduceArray(t, o, value, value, in[1], st->count);
    } else { /* no local operand: in0 op in1 */
      gcommReduceArray(t, o, value, in[0], in[1], st->count);
    }
  }
  if (st->postOp && op->redop == gcommAvg)
    gcommDivideArray(op->datatype, value, st->count, comm->nranks);
}

/* Executes a ready step: value = recv (op src) or src; value -> dst and send FIFOs. */
static gcommResult_t runStep(gcommComm_t comm, gcommWork_t* w, const gcommStep_t* st) {
  const gcommOp_t* op = w->op;
  size_t esz = gcommTypeSize(op->datatype), bytes = st->count * esz;
  char* src = opBuffer(op, st->src);
  char* dst = opBuffer(op, st->dst);
  char *in[2] = {NULL, NULL}, *out[2] = {NULL, NULL};
  gcommConn_t* outConn[2] = {NULL, NULL};
  int nIn = 0, nOut = 0;
  if (src) src += st->srcOff * esz;
  if (dst) dst += st->dstOff * esz;
  for (int i = 0; i < 2; i++) {
    if (st->recvPeer[i] >= 0) {
      int peer = st->recvPeer[i];
      gcommConn_t* c = recvConn(comm, w->lane, peer);
      uint64_t got = c->fifo->bytes[c->step % GCOMM_STEPS], want = GCOMM_SLOT_WORD(op->tag, bytes);
      if (got != want) {
        char what[256];
        gcommDescribeMismatch(what, sizeof(what), got, want);
        return gcommSetError(comm, gcommInvalidUsage, peer, "progress",
                             "%s (seq %llu, count %zu, %s, %s, root %d) channel %d step %ld: rank "
                             "%d made a different call: %s",
                             funcNames[op->func], (unsigned long long)op->seq, op->count,
                             typeNames[op->datatype], opNames[op->redop], op->root, w->lane,
                             w->step, peer, what);
      }
      char* landed = c->landed ? c->landed[c->step % GCOMM_STEPS] : NULL;
      in[nIn++] = landed ? landed : slotOf(c);
    }
    if (st->sendPeer[i] >= 0) {
      outConn[nOut] = sendConn(comm, w->lane, st->sendPeer[i]);
      out[nOut] = slotOf(outConn[nOut]);
      nOut++;
    }
  }
  /* compute the value once, into dst if there is one, else into the first send slot; a value in
   * the caller's memory (dst, or src sent as it is) goes to a network FIFO by reference */
  char* user = dst ? dst : nIn == 0 && !st->postOp && !stepScalesInput(op, st, nIn) ? src : NULL;
  char* value = user ? user : out[0];
  if (value != NULL && bytes > 0) {
    stepValue(comm, op, st, src, in, nIn, value);
    for (int i = 0; i < nOut; i++)
      if (out[i] != value && !(user && outConn[i]->refs)) memcpy(out[i], value, bytes);
  }
  /* publish: payload sizes and data before the counters that hand the slots over */
  for (int i = 0; i < 2; i++) {
    if (st->sendPeer[i] >= 0) {
      gcommConn_t* c = sendConn(comm, w->lane, st->sendPeer[i]);
      /* the payload size and the call's tag (across nodes the tag travels as the message's
       * completion data, transports/net_ofi.c) */
      c->fifo->bytes[c->step % GCOMM_STEPS] = GCOMM_SLOT_WORD(op->tag, bytes);
      if (c->refs) {
        c->refs[c->step % GCOMM_STEPS] = user;
        if (user) c->refUntil = c->step + 1;
      }
      __atomic_store_n(&c->fifo->tail, ++c->step, __ATOMIC_RELEASE);
    }
    if (st->recvPeer[i] >= 0) {
      gcommConn_t* c = recvConn(comm, w->lane, st->recvPeer[i]);
      __atomic_store_n(&c->fifo->head, ++c->step, __ATOMIC_RELEASE);
    }
  }
  return gcommSuccess;
}

/* Whether process pid is gone or a zombie: a killed rank stays a zombie until its parent reaps
 * it, and launchers (MPICH's hydra, Open MPI's prted) may not do so before the job ends, while
 * kill(pid, 0) still finds it. /proc/<pid>/stat's state ("pid (comm) S ...") says Z or X then. */
int gcommProcessIsDead(pid_t pid) {
  if (kill(pid, 0) != 0 && errno == ESRCH) return 1;
  char path[64], buf[512];
  snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
  FILE* f = fopen(path, "r");
  if (f == NULL) return 0; /* no /proc: kill's answer stands */
  size_t len = fread(buf, 1, sizeof(buf) - 1, f);
  fclose(f);
  buf[len] = 0;
  const char* paren = strrchr(buf, ')'); /* the command name may hold spaces and parentheses */
  return paren != NULL && paren[1] == ' ' && (paren[2] == 'Z' || paren[2] == 'X');
}

/* A local peer that no longer exists will never fill or drain its FIFOs. Only a process of this
 * very machine can be probed (GCOMM_HOSTID nodes may share one): compare real host names. */
static int peerIsDead(gcommComm_t comm, int peer) {
  if (strcmp(comm->cards[peer].host, comm->cards[comm->rank].host) != 0) return 0;
  return gcommProcessIsDead(comm->cards[peer].pid);
}

/* What a blocked work probes in local rank q, in this order over every rank (the cause first):
 * its death; a different call at the same sequence number (its status page: e.g. another root,
 * where no data flows, so no slot word can tell); the error that stopped it. */
enum { PROBE_DEATH, PROBE_CALL, PROBE_STOP, PROBE_PHASES };

/* Whether local rank q can still serve w, by one phase of probes. Fails w naming q. */
static gcommResult_t probeRank(gcommComm_t comm, const gcommWork_t* w, int q, uint64_t waitedMs,
                               int phase) {
  const gcommOp_t* op = w->op;
  char at[192];
  snprintf(at, sizeof(at), "%s (seq %llu) lane %d step %ld/%ld, waiting %llu ms to %s rank %d",
           funcNames[op->func], (unsigned long long)op->seq, w->lane, w->step, w->nSteps,
           (unsigned long long)waitedMs, w->waitRecv ? "receive from" : "send to", w->waitPeer);
  if (phase == PROBE_DEATH)
    return peerIsDead(comm, q)
               ? gcommSetError(comm, gcommRemoteError, q, "progress", "%s: rank %d has died", at, q)
               : gcommSuccess;
  gcommStatus_t* st = gcommShmStatus(comm, q);
  if (st == NULL) return gcommSuccess;
  int isColl = op->func != gcommFuncSend && op->func != gcommFuncRecv;
  if (phase == PROBE_CALL) {
    if (!isColl || op->tag == 0 || w->lane >= GCOMM_STATUS_LANES) return gcommSuccess;
    uint64_t cur = __atomic_load_n(&st->current[w->lane], __ATOMIC_ACQUIRE);
    if ((uint32_t)(cur >> 32) != (uint32_t)(op->seq + 1) || (uint32_t)cur == op->tag)
      return gcommSuccess;
    char what[256];
    gcommDescribeMismatch(what, sizeof(what), GCOMM_SLOT_WORD((uint32_t)cur, 0),
                          GCOMM_SLOT_WORD(op->tag, 0));
    return gcommSetError(comm, gcommInvalidUsage, q, "progress",
                         "%s: rank %d made a different call: %s", at, q, what);
  }
  int code = __atomic_load_n(&st->code, __ATOMIC_ACQUIRE);
  /* A rank that finished all its work and destroyed the communicator stops only the ranks that
   * wait on it directly (it will never send or drain again); others wait on slower ranks. */
  if (code == 0 || (st->finished && q != w->waitPeer)) return gcommSuccess;
  char msg[sizeof(st->msg)];
  memcpy(msg, st->msg, sizeof(msg));
  msg[sizeof(msg) - 1] = 0;
  return gcommSetError(comm, code == gcommInvalidUsage ? gcommInvalidUsage : gcommRemoteError, q,
                       "progress", "%s: rank %d stopped: %s", at, q, msg);
}

/* Publishes the collective w's lane is in (gcommStatus_t.current) for blocked peers' checks. */
static void noteCurrent(gcommComm_t comm, const gcommWork_t* w) {
  const gcommOp_t* op = w->op;
  gcommStatus_t* st = gcommShmStatus(comm, comm->rank);
  if (st == NULL || op->tag == 0 || op->func == gcommFuncSend || op->func == gcommFuncRecv ||
      w->lane >= GCOMM_STATUS_LANES)
    return;
  __atomic_store_n(&st->current[w->lane], (uint64_t)(uint32_t)(op->seq + 1) << 32 | op->tag,
                   __ATOMIC_RELEASE);
}

/* Notes that w cannot move: fails it when a local rank died or stopped, the ranks' calls differ,
 * or the deadline passed. */
static gcommResult_t workBlocked(gcommComm_t comm, gcommWork_t* w, int peer, int isRecv) {
  uint64_t now = gcommNowNs();
  const char* lost =
      (isRecv ? recvConn(comm, w->lane, peer) : sendConn(comm, w->lane, peer))->netFailure;
  if (lost != NULL) return gcommSetError(comm, gcommRemoteError, peer, "progress", "%s", lost);
  if (w->waitSinceNs == 0 || w->waitPeer != peer) {
    w->waitSinceNs = now;
    w->waitPeer = peer;
    w->waitRecv = isRecv;
    return gcommSuccess;
  }
  uint64_t waitedMs = (now - w->waitSinceNs) / 1000000;
  const gcommOp_t* op = w->op;
  /* A dead or stopped rank never fills or drains its FIFOs, and the ranks behind it stop when
   * they notice, so the awaited peer may be alive but stuck: after 100 ms of waiting, probe every
   * local rank every 50 ms: deaths first (the cause), then different calls, then stops, the
   * awaited peer first. Survivors name the rank long before the deadline. */
  if (waitedMs >= 100 && now - comm->livenessNs >= 50000000) {
    comm->livenessNs = now;
    for (int phase = 0; phase < PROBE_PHASES; phase++)
      for (int k = 0; k < comm->nranks; k++) {
        int q = (peer + k) % comm->nranks;
        gcommResult_t res = q == comm->rank ? gcommSuccess : probeRank(comm, w, q, waitedMs, phase);
        if (res != gcommSuccess) return res;
      }
  }
  if ((int64_t)waitedMs >= comm->params.timeoutMs)
    return gcommSetError(comm, gcommTimeout, peer, "progress",
                         "%s (seq %llu, count %zu, %s) lane %d step %ld/%ld: waited %llu ms to "
                         "%s rank %d (GCOMM_TIMEOUT_MS=%lld)",
                         funcNames[op->func], (unsigned long long)op->seq, op->count,
                         typeNames[op->datatype], w->lane, w->step, w->nSteps,
                         (unsigned long long)waitedMs, isRecv ? "receive from" : "send to", peer,
                         (long long)comm->params.timeoutMs);
  return gcommSuccess;
}

/* Runs w's steps while they are ready (at most a FIFO's worth, for fairness between queues).
 * Returns how many ran, or -1 on error (*res says which). */
static int advanceWork(gcommComm_t comm, gcommWork_t* w, gcommResult_t* res) {
  int ran = 0;
  if (w->step == 0) noteCurrent(comm, w);
  while (w->step < w->nSteps && ran < GCOMM_STEPS) {
    gcommStep_t st;
    int isRecv = 0;
    gcommSchedGetStep(&w->sched, w->step, &st);
    if (GCOMM_PROF_ON(comm, gcommProfileProxyOp | gcommProfileProxyStep))
      gcommProfStepBegin(comm, w, &st);
    int peer = stepBlockedOn(comm, w, &st, &isRecv);
    if (peer >= 0) {
      if (w->profStep != NULL && w->waitSinceNs == 0) gcommProfStepWait(comm, w, peer, isRecv);
      *res = workBlocked(comm, w, peer, isRecv);
      return *res == gcommSuccess ? ran : -1;
    }
    *res = runStep(comm, w, &st);
    if (*res != gcommSuccess) return -1;
    w->waitSinceNs = 0;
    w->step++;
    if (w->profStarted) gcommProfWorkStepEnd(comm, w, w->step == w->nSteps);
    ran++;
  }
  return ran;
}

/* ======================================================================================== */
/* The progress engine (proxy): fetches posted operations and advances their works.        */
/* ======================================================================================== */

static volatile sig_atomic_t dumpRequests; /* bumped by the GCOMM_PROXY_DUMP_SIGNAL handler */
static void dumpSignalHandler(int sig) {
  (void)sig;
  dumpRequests++;
}

static void opFinished(gcommComm_t comm, gcommOp_t* op) {
  if (op->prevActive)
    op->prevActive->nextActive = op->nextActive;
  else
    comm->activeHead = op->nextActive;
  if (op->nextActive)
    op->nextActive->prevActive = op->prevActive;
  else
    comm->activeTail = op->prevActive;
  free(op);
  __atomic_add_fetch(&comm->opsDone, 1, __ATOMIC_RELEASE);
  if (__atomic_load_n(&comm->waiters, __ATOMIC_ACQUIRE) > 0) {
    pthread_mutex_lock(&comm->doneLock);
    pthread_cond_broadcast(&comm->doneCond);
    pthread_mutex_unlock(&comm->doneLock);
  }
}

static void workFinished(gcommComm_t comm, gcommWork_t* w) {
  if (w->profStarted) gcommProfWorkStepEnd(comm, w, 1); /* drained before its end */
  comm->nActiveWorks--;
  if (--w->op->nWorksLeft == 0) opFinished(comm, w->op);
}

/* Moves up to max posted operations into the queues. */
static void fetchPosted(gcommComm_t comm, long max) {
  /* a peek without the lock (atomic: posters write it under the lock); the next pass sees what
   * it missed */
  if (__atomic_load_n(&comm->postedHead, __ATOMIC_ACQUIRE) == NULL) return;
  void* ctrl = GCOMM_PROF_ON(comm, gcommProfileProxyCtrl)
                   ? gcommProfCtrlStart(comm, gcommProfilerProxyCtrlAppend)
                   : NULL;
  long k = 0;
  pthread_mutex_lock(&comm->postLock);
  for (; k < max && comm->postedHead != NULL; k++) {
    gcommOp_t* op = comm->postedHead;
    __atomic_store_n(&comm->postedHead, op->next, __ATOMIC_RELEASE);
    if (op->next == NULL) comm->postedTail = NULL;
    op->prevActive = comm->activeTail;
    op->nextActive = NULL;
    if (comm->activeTail)
      comm->activeTail->nextActive = op;
    else
      comm->activeHead = op;
    comm->activeTail = op;
    for (int i = 0; i < op->nWorks; i++) {
      gcommWork_t* w = &op->works[i];
      gcommQueue_t* q = &comm->queues[w->queue];
      w->next = NULL;
      if (q->tail)
        q->tail->next = w;
      else
        q->head = w;
      q->tail = w;
    }
    comm->nActiveWorks += op->nWorks;
  }
  pthread_mutex_unlock(&comm->postLock);
  if (ctrl != NULL) gcommProfCtrlStop(comm, ctrl, gcommProfilerProxyCtrlAppendEnd, (int)k);
}

/* After an error or an abort nothing can move any more: finish every operation as failed. */
static void drainAll(gcommComm_t comm) {
  fetchPosted(comm, LONG_MAX);
  for (int q = 0; q < comm->nQueues; q++) {
    while (comm->queues[q].head != NULL) {
      gcommWork_t* w = comm->queues[q].head;
      comm->queues[q].head = w->next;
      workFinished(comm, w);
    }
    comm->queues[q].tail = NULL;
  }
}

/* Tells the ranks of this node that this rank's communicator stopped, and why (gcommStatus_t),
 * so that those blocked on it stop too, naming it. The first word stays. */
static void publishStop(gcommComm_t comm, gcommResult_t res, const char* why) {
  gcommStatus_t* st = gcommShmStatus(comm, comm->rank);
  if (st == NULL || __atomic_load_n(&st->code, __ATOMIC_ACQUIRE) != 0) return;
  pthread_mutex_lock(&comm->errorLock);
  const char* msg = why ? why : comm->lastError;
  size_t len = strnlen(msg, sizeof(st->msg) - 1);
  memcpy(st->msg, msg, len);
  st->msg[len] = 0;
  pthread_mutex_unlock(&comm->errorLock);
  __atomic_store_n(&st->code, (int)res, __ATOMIC_RELEASE);
}

/* Records the error that stops the communicator (the first one wins) and publishes it. */
static void setAsyncError(gcommComm_t comm, gcommResult_t res) {
  int expected = gcommSuccess;
  if (__atomic_compare_exchange_n(&comm->asyncError, &expected, (int)res, 0, __ATOMIC_ACQ_REL,
                                  __ATOMIC_ACQUIRE))
    publishStop(comm, res, res == gcommAborted ? "gcommCommAbort was called there" : NULL);
}

/* Every queue's head operation, its step and the peer it waits on, for hang diagnosis
 * (tools/hang_report.py reads these lines from every rank's log): on GCOMM_PROXY_DUMP_SIGNAL and
 * when the engine stops on an error. Logged whatever GCOMM_DEBUG says: it was asked for, or it
 * explains a failure. */
static void dumpState(gcommComm_t comm, const char* why) {
  char line[1024];
  pthread_once(&logOnce, logInit);
  snprintf(
      line, sizeof(line),
      "rank %d/%d comm \"%s\" pid %d (%s): %llu collectives called, %llu ops posted, %llu "
      "done, %ld works active, async error: %s",
      comm->rank, comm->nranks, comm->name, (int)getpid(), why,
      (unsigned long long)__atomic_load_n(&comm->collSeq, __ATOMIC_RELAXED),
      (unsigned long long)__atomic_load_n(&comm->opsPosted, __ATOMIC_RELAXED),
      (unsigned long long)__atomic_load_n(&comm->opsDone, __ATOMIC_RELAXED), comm->nActiveWorks,
      gcommGetErrorString((gcommResult_t)__atomic_load_n(&comm->asyncError, __ATOMIC_RELAXED)));
  logWrite(GCOMM_LOG_WARN, comm, "dump", line);
  for (int q = 0; q < comm->nQueues; q++) {
    gcommWork_t* w = comm->queues[q].head;
    if (w == NULL) continue;
    int queued = 0;
    for (gcommWork_t* x = w->next; x; x = x->next) queued++;
    const gcommOp_t* op = w->op;
    int len = snprintf(line, sizeof(line), "rank %d comm \"%s\" queue %d: %s", comm->rank,
                       comm->name, q, funcNames[op->func]);
    if (op->func == gcommFuncSend || op->func == gcommFuncRecv)
      len += snprintf(line + len, sizeof(line) - len, " peer %d", op->peer);
    else
      len += snprintf(line + len, sizeof(line) - len, " seq %llu root %d",
                      (unsigned long long)op->seq, op->root);
    len +=
        snprintf(line + len, sizeof(line) - len, " count %zu %s %s algo %s channel %d step %ld/%ld",
                 op->count, typeNames[op->datatype], opNames[op->redop], algoNames[op->algo],
                 w->lane, w->step, w->nSteps);
    if (w->waitSinceNs) {
      gcommConn_t* c =
          w->waitRecv ? recvConn(comm, w->lane, w->waitPeer) : sendConn(comm, w->lane, w->waitPeer);
      len += snprintf(line + len, sizeof(line) - len,
                      ", waiting %llu ms to %s rank %d (fifo tail %llu head %llu)",
                      (unsigned long long)((gcommNowNs() - w->waitSinceNs) / 1000000),
                      w->waitRecv ? "receive from" : "send to", w->waitPeer,
                      (unsigned long long)c->fifo->tail, (unsigned long long)c->fifo->head);
    }
    snprintf(line + len, sizeof(line) - len, "; %d more queued", queued);
    logWrite(GCOMM_LOG_WARN, comm, "dump", line);
  }
}

/* One pass: every queue's head work runs its ready steps. Returns whether anything moved.
 * Only one thread at a time runs a pass (comm->progressLock). */
static int progressPass(gcommComm_t comm) {
  int moved = 0;
  comm->passes++;
  if (comm->dumpSeen != (uint64_t)dumpRequests) {
    comm->dumpSeen = (uint64_t)dumpRequests;
    dumpState(comm, "GCOMM_PROXY_DUMP_SIGNAL");
  }
  if (__atomic_load_n(&comm->abortFlag, __ATOMIC_ACQUIRE) ||
      __atomic_load_n(&comm->asyncError, __ATOMIC_ACQUIRE) != gcommSuccess) {
    if (comm->nActiveWorks > 0 || __atomic_load_n(&comm->postedHead, __ATOMIC_ACQUIRE)) moved = 1;
    drainAll(comm);
#ifdef GCOMM_GPU
    /* the proxied FIFOs move no more: kernels waiting on them stop (the first error stands) */
    if (hasGpuProxy(comm)) gcommDeviceAbort(comm);
#endif
    return moved;
  }
  if (comm->nActiveWorks == 0 || comm->passes % comm->params.appendFreq == 0)
    fetchPosted(comm, comm->params.appendBatch);
  for (int q = 0; q < comm->nQueues && comm->nActiveWorks > 0; q++) {
    gcommWork_t* w;
    while ((w = comm->queues[q].head) != NULL) {
      gcommResult_t res = gcommSuccess;
      if (w->step == 0 && !workMayStart(comm, w)) break;
      int ran = advanceWork(comm, w, &res);
      if (ran < 0) {
        setAsyncError(comm, res);
        dumpState(comm, gcommGetErrorString(res)); /* where every queue stood */
#ifdef GCOMM_OFI
        /* a mismatch: slots this rank filled before it saw it still go out (posting sends them
         * for small slots), so that a peer on another node waiting on them sees the mismatch in
         * their tag instead of waiting for its deadline */
        int posted = 0;
        if (res == gcommInvalidUsage) (void)gcommNetProgress(comm, &posted);
#endif
        drainAll(comm);
        return 1;
      }
      moved |= ran > 0;
      if (w->step < w->nSteps) break;
      comm->queues[q].head = w->next;
      if (w->next == NULL) comm->queues[q].tail = NULL;
      workFinished(comm, w);
      moved = 1;
    }
  }
#ifdef GCOMM_OFI
  /* the network proxy: slots just filled go out, arrived ones are handed to the executor */
  gcommResult_t netRes = gcommNetProgress(comm, &moved);
  if (netRes != gcommSuccess) {
    setAsyncError(comm, netRes);
    drainAll(comm);
    return 1;
  }
#endif
#ifdef GCOMM_GPU
  /* the copy engines' proxy: staging slots the kernels filled go to the local peers' FIFOs */
  if (copiesByEngine(comm)) {
    gcommResult_t copyRes = gcommDeviceCopyProgress(comm, &moved);
    if (copyRes != gcommSuccess) {
      setAsyncError(comm, copyRes); /* the next pass aborts the kernels */
      return 1;
    }
  }
#endif
  return moved;
}

/* Slots handed to the network and not yet sent (withCredits: or credits owed to peers): the
 * engine keeps running for them after every operation has finished. gcommWait waits for the
 * slots, which may read the caller's memory, but not for the credits: they only tell a peer
 * about receives posted ahead for later operations, and a peer that has destroyed its
 * communicator never takes them (a wait for one hung). */
static int netPending(gcommComm_t comm, int withCredits) {
#ifdef GCOMM_OFI
  return gcommNetSendsPending(comm, withCredits);
#else
  (void)comm;
  (void)withCredits;
  return 0;
#endif
}

/* Whether the network or a GPU proxy may be moving data for this communicator (works active,
 * slots and credits not yet sent, or a GPU communicator's kernels waiting on proxied FIFOs). Most
 * providers (tcp) progress only when polled, and a kernel waits on the copy engines' proxy: the
 * engine yields the core then, but never naps. Run under progressLock. */
static int netBusy(gcommComm_t comm) {
#ifdef GCOMM_GPU
  if (hasGpuProxy(comm) && gcommDeviceKernelsWaiting(comm)) return 1;
#endif
#ifdef GCOMM_OFI
  return comm->net != NULL && (comm->nActiveWorks > 0 || gcommNetSendsPending(comm, 0));
#else
  (void)comm;
  return 0;
#endif
}

/* A relative deadline for pthread_cond_timedwait. */
static struct timespec deadlineIn(long ns) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_nsec += ns;
  ts.tv_sec += ts.tv_nsec / 1000000000;
  ts.tv_nsec %= 1000000000;
  return ts;
}

static void* progressThread(void* arg) {
  gcommComm_t comm = (gcommComm_t)arg;
  uint64_t idleSince = 0;
#ifdef GCOMM_GPU
  gcommDeviceBindThread(comm); /* the provider's copies of GPU memory (FI_HMEM) run here */
#endif
  pthread_mutex_lock(&comm->progressLock);
  while (!__atomic_load_n(&comm->stopThread, __ATOMIC_ACQUIRE)) {
    if (__atomic_load_n(&comm->drivers, __ATOMIC_ACQUIRE) > 0) {
      /* A waiting thread runs the passes (gcommWait): stay off the cores while one does. Posts
       * do not wake this sleep (a wait follows most posts, and a wake for each made small
       * all-reduces 2-3 us slower); a driver that leaves work behind does, else it ends within
       * 1 ms of the last driver leaving. */
      pthread_mutex_unlock(&comm->progressLock);
      pthread_mutex_lock(&comm->postLock);
      comm->standby = 1;
      while (__atomic_load_n(&comm->drivers, __ATOMIC_ACQUIRE) > 0 &&
             !__atomic_load_n(&comm->stopThread, __ATOMIC_ACQUIRE)) {
        struct timespec ts = deadlineIn(1000000);
        pthread_cond_timedwait(&comm->postCond, &comm->postLock, &ts);
      }
      comm->standby = 0;
      pthread_mutex_unlock(&comm->postLock);
      pthread_mutex_lock(&comm->progressLock);
      idleSince = 0;
      continue;
    }
    if (progressPass(comm)) {
      idleSince = 0;
      continue;
    }
    int mayNap = !netBusy(comm);
    int nothingLeft = mayNap && comm->nActiveWorks == 0 && !netPending(comm, 1); /* under lock */
    pthread_mutex_unlock(&comm->progressLock);
    /* waiting on peers: back off. Nothing at all to do for a while: sleep until a post (a GPU
     * communicator's launch signals too, and kernels may start later, as graphs do: a GPU
     * communicator with a proxy, network or copy engines, looks every millisecond). Where
     * waiting threads drive (host communicators), this thread matters only for
     * work nobody waits on, which a post wakes it for: it sleeps as soon as nothing is left
     * instead of yielding for 1 ms, which took the core from whatever the caller did next. */
    int idleUs = (int)backoff(&idleSince, mayNap);
    if ((idleUs > 1000 || waitersDrive(comm)) && nothingLeft) {
      int timedOut = 0;
      pthread_mutex_lock(&comm->postLock);
      if (comm->postedHead == NULL && !__atomic_load_n(&comm->stopThread, __ATOMIC_ACQUIRE)) {
        /* wake now and then for dumps */
        struct timespec ts = deadlineIn(hasGpuProxy(comm) ? 1000000 : 100 * 1000000);
        void* ctrl = GCOMM_PROF_ON(comm, gcommProfileProxyCtrl)
                         ? gcommProfCtrlStart(comm, gcommProfilerProxyCtrlSleep)
                         : NULL;
        timedOut = pthread_cond_timedwait(&comm->postCond, &comm->postLock, &ts) == ETIMEDOUT;
        if (ctrl != NULL) gcommProfCtrlStop(comm, ctrl, gcommProfilerProxyCtrlWakeup, 0);
      }
      pthread_mutex_unlock(&comm->postLock);
      if (!timedOut) idleSince = 0; /* woken: work may follow; else back to sleep after a pass */
    }
    pthread_mutex_lock(&comm->progressLock);
  }
  pthread_mutex_unlock(&comm->progressLock);
  return NULL;
}

static gcommResult_t startThreadOnce(gcommComm_t comm) {
  if (comm->params.proxyMode != GCOMM_PROXY_THREAD ||
      __atomic_load_n(&comm->threadStarted, __ATOMIC_ACQUIRE)) /* posters may race: see below */
    return gcommSuccess;
  pthread_mutex_lock(&comm->postLock);
  int err = 0;
  if (!comm->threadStarted) {
    err = pthread_create(&comm->thread, NULL, progressThread, comm);
    if (err == 0) __atomic_store_n(&comm->threadStarted, 1, __ATOMIC_RELEASE);
  }
  pthread_mutex_unlock(&comm->postLock);
  if (err != 0)
    return GCOMM_ERROR(comm, gcommSystemError, -1, "cannot start the progress thread: %s",
                       strerror(err));
  return gcommSuccess;
}

/* A GPU communicator with a proxy (hasGpuProxy: ranks on other nodes, or copy engines): the
 * FIFOs its kernels fill and drain move only while the progress thread runs (nobody calls
 * gcommWait while stream-ordered kernels wait on them), so the thread starts with the
 * communicator and runs until destroy: polling while kernels wait, sleeping (1 ms at a time) when
 * nothing moves. Poll mode cannot drive such kernels: it warns and uses the thread. */
static gcommResult_t startGpuProxy(gcommComm_t comm) {
  if (comm->params.proxyMode == GCOMM_PROXY_POLL) {
    GCOMM_WARN(comm,
               "GCOMM_PROXY_MODE=poll: a GPU communicator %s needs the progress thread to move "
               "its FIFOs while kernels run: using it",
               stagesNet(comm) ? "whose ranks span nodes" : "with copy engines");
    comm->params.proxyMode = GCOMM_PROXY_THREAD;
  }
  return startThreadOnce(comm);
}

/* Hands a list of operations to the engine. */
static gcommResult_t postOps(gcommComm_t comm, gcommOp_t* head, gcommOp_t* tail, int n) {
  GCOMM_CHECK(startThreadOnce(comm));
  pthread_mutex_lock(&comm->postLock);
  __atomic_add_fetch(&comm->opsPosted, n, __ATOMIC_ACQ_REL);
  comm->batches++;
  for (gcommOp_t* op = head; op != NULL; op = op->next) op->batch = comm->batches;
  if (comm->postedTail)
    comm->postedTail->next = head;
  else
    __atomic_store_n(&comm->postedHead, head, __ATOMIC_RELEASE);
  comm->postedTail = tail;
  if (!comm->standby) pthread_cond_signal(&comm->postCond);
  pthread_mutex_unlock(&comm->postLock);
  return gcommSuccess;
}

/* ======================================================================================== */
/* Communicators: bootstrap over MPI, split, destroy, abort, queries.                       */
/* ======================================================================================== */

#define MPI_CHECK(comm, call)                                                                     \
  do {                                                                                            \
    int mpiErr_ = (call);                                                                         \
    if (mpiErr_ != MPI_SUCCESS)                                                                   \
      return GCOMM_ERROR(comm, gcommSystemError, -1, "%s failed (MPI error %d)", #call, mpiErr_); \
  } while (0)

/* Every rank learns whether every rank succeeded, so that no rank waits in a later collective
 * step for a rank that has given up; and the ranks that succeeded learn why one failed (its
 * message: the cause, e.g. a full /dev/shm, at every rank). */
static gcommResult_t agree(gcommComm_t comm, gcommResult_t mine, const char* what) {
  struct {
    int code, rank;
  } worst = {(int)mine, comm->rank};
  MPI_CHECK(comm, MPI_Allreduce(MPI_IN_PLACE, &worst, 1, MPI_2INT, MPI_MAXLOC, comm->mpiComm));
  if (worst.code == gcommSuccess) return gcommSuccess;
  char why[512];
  pthread_mutex_lock(&comm->errorLock);
  snprintf(why, sizeof(why), "%.*s", (int)sizeof(why) - 1, comm->lastError);
  pthread_mutex_unlock(&comm->errorLock);
  MPI_CHECK(comm, MPI_Bcast(why, sizeof(why), MPI_CHAR, worst.rank, comm->mpiComm));
  if (mine != gcommSuccess) return mine;
  return GCOMM_ERROR(comm, gcommRemoteError, worst.rank, "rank %d failed during %s: %s", worst.rank,
                     what, why);
}

static uint64_t hashString(const char* s) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

/* A parameter's value as a number every rank can compare (a string: its hash; unset: 0). */
static int64_t paramValue(const gcommParams_t* p, const gcommParamDef_t* d) {
  const char* field = (const char*)p + d->offset;
  if (d->kind == PARAM_STR)
    return *(const char* const*)field ? (int64_t)(hashString(*(const char* const*)field) | 1) : 0;
  if (d->kind == PARAM_ENUM || d->offset == PARAM_AT(nChannels)) return *(const int*)field;
  return *(const int64_t*)field;
}

static void paramFormat(const gcommParamDef_t* d, int64_t v, char* buf, size_t len) {
  if (d->kind == PARAM_ENUM)
    snprintf(buf, len, "%s", v < 0 ? "unset" : d->choices[v]);
  else if (d->kind == PARAM_STR)
    snprintf(buf, len, "%s", v ? "a value" : "unset");
  else
    snprintf(buf, len, "%lld", (long long)v);
}

/* Collective. Ranks with different algorithms, protocols or FIFO shapes would run different
 * schedules on one set of FIFOs: wrong data or a hang, reported as nothing. One exchange of the
 * SHARED parameters at init instead, failing on every rank with the first that differs. */
static gcommResult_t paramsAgree(gcommComm_t comm) {
  int64_t mine[NPARAMS];
  int idx[NPARAMS], k = 0, n = comm->nranks;
  for (int i = 0; i < NPARAMS; i++)
    if (paramTable[i].shared) idx[k] = i, mine[k] = paramValue(&comm->params, &paramTable[i]), k++;
  int64_t* all = malloc((size_t)n * k * sizeof(int64_t));
  if (all == NULL) return GCOMM_ERROR(comm, gcommSystemError, -1, "out of memory");
  int rc = MPI_Allgather(mine, k, MPI_INT64_T, all, k, MPI_INT64_T, comm->mpiComm);
  gcommResult_t res = gcommSuccess;
  for (int r = 1; r < n && rc == MPI_SUCCESS && res == gcommSuccess; r++)
    for (int j = 0; j < k && res == gcommSuccess; j++) {
      if (all[(size_t)r * k + j] == all[j]) continue;
      const gcommParamDef_t* d = &paramTable[idx[j]];
      char first[64], other[64];
      paramFormat(d, all[j], first, sizeof(first));
      paramFormat(d, all[(size_t)r * k + j], other, sizeof(other));
      res = GCOMM_ERROR(comm, gcommInvalidUsage, -1,
                        "ranks disagree on %s: rank 0 has %s, rank %d has %s: set %s the same "
                        "everywhere (it shapes the schedule or the FIFOs)",
                        d->name, first, r, other, d->name);
    }
  free(all);
  MPI_CHECK(comm, rc);
  return res;
}

/* Which ranks share a node: MPI_COMM_TYPE_SHARED, or GCOMM_HOSTID when set, so that one machine
 * can pretend to be several nodes. The node's id is its first rank. */
static gcommResult_t detectNode(gcommComm_t comm, uint64_t* hostId) {
  MPI_Comm node;
  int leader = comm->rank;
  if (comm->params.hostId != NULL)
    MPI_CHECK(comm,
              MPI_Comm_split(comm->mpiComm, (int)(hashString(comm->params.hostId) & 0x7fffffff),
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

static gcommResult_t checkConfig(const gcommConfig_t* config) {
  if (config == NULL) return gcommSuccess;
  if (config->magic != GCOMM_CONFIG_MAGIC || config->size != sizeof(gcommConfig_t))
    return GCOMM_ERROR(NULL, gcommInvalidArgument, -1,
                       "config was not initialised with GCOMM_CONFIG_INITIALIZER");
  if (config->proxyMode != GCOMM_CONFIG_UNDEF_INT && config->proxyMode != GCOMM_PROXY_THREAD &&
      config->proxyMode != GCOMM_PROXY_POLL)
    return GCOMM_ERROR(NULL, gcommInvalidArgument, -1,
                       "config->proxyMode %d is neither GCOMM_PROXY_THREAD nor GCOMM_PROXY_POLL",
                       config->proxyMode);
  if (config->nChannels != GCOMM_CONFIG_UNDEF_INT &&
      (config->nChannels < 1 || config->nChannels > GCOMM_MAX_CHANNELS))
    return GCOMM_ERROR(NULL, gcommInvalidArgument, -1, "config->nChannels %d is not in 1..%d",
                       config->nChannels, GCOMM_MAX_CHANNELS);
#ifdef GCOMM_GPU
  if (config->device != GCOMM_CONFIG_UNDEF_INT && config->device < GCOMM_DEVICE_HOST)
    return GCOMM_ERROR(NULL, gcommInvalidArgument, -1,
                       "config->device %d is neither a CUDA device nor GCOMM_DEVICE_HOST",
                       config->device);
#else
  if (config->device != GCOMM_CONFIG_UNDEF_INT && config->device != GCOMM_DEVICE_HOST)
    return GCOMM_ERROR(NULL, gcommInvalidArgument, -1,
                       "config->device %d: this build has no GPU support (build with CUDA=1 or "
                       "HIP=1), use GCOMM_DEVICE_HOST",
                       config->device);
#endif
  return gcommSuccess;
}

static void tuningPrint(gcommComm_t comm);

/* GCOMM_PROXY_DUMP_SIGNAL: only a signal nothing else needs (SIGUSR1, SIGUSR2, real-time). Any
 * other would take one from the program or the runtime: SIGSEGV's handler returning makes a
 * crash loop forever, SIGINT's swallows Ctrl-C, SIGKILL cannot be caught. */
static void installDumpSignal(gcommComm_t comm) {
  int sig = (int)comm->params.dumpSignal;
  if (sig != SIGUSR1 && sig != SIGUSR2 && (sig < SIGRTMIN || sig > SIGRTMAX)) {
    GCOMM_WARN(comm,
               "GCOMM_PROXY_DUMP_SIGNAL=%d is not SIGUSR1 (%d), SIGUSR2 (%d) or a real-time "
               "signal (%d..%d): dumps on a signal are off",
               sig, SIGUSR1, SIGUSR2, SIGRTMIN, SIGRTMAX);
    return;
  }
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = dumpSignalHandler;
  sa.sa_flags = SA_RESTART;
  sigaction(sig, &sa, NULL);
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
  if (sharingNoMps == 0 || comm->rank != 0 || __atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
    return;
  GCOMM_WARN(comm,
             "%d ranks share one GPU without MPS: their kernels time-slice the GPU and every "
             "operation waits for a time slice (milliseconds at any size); start the MPS daemon "
             "(nvidia-cuda-mps-control -d) before the ranks",
             sharingNoMps);
}

/* Collective (every rank). The channel (block) count a GPU communicator uses by default. A block
 * pushes ~11 GB/s over NVLink and blocks that reduce or copy locally leave the link idle
 * meanwhile, so 128 of them fill it (docs/PERF.md: 2 and 4 GPUs). Blocks of ranks that share a
 * GPU wait on each other, so all of them must be resident at once: at most 2 a multiprocessor
 * (this kernel's 64 registers x 512 threads), and not more than one per multiprocessor for each
 * rank. More than 4 ranks on a node: 64 at most (FIFO memory grows with ranks x lanes). Between
 * nodes 4: each lane to a remote rank pins 2 FIFOs of host memory, and the network sets the pace;
 * staged through host memory (GCOMM_P2P_DISABLE) 16: PCIe sets it; 16 with copy engines too. */
static gcommResult_t gpuDefaultChannels(gcommComm_t comm, uint64_t hostId, int* nChannels) {
  gpuOfRank_t mine = {hostId, comm->devicePci, comm->device >= 0 ? comm->deviceSMs : -1,
                      comm->device >= 0 && comm->deviceMps};
  gpuOfRank_t* all = calloc(comm->nranks, sizeof(*all));
  if (all == NULL) return GCOMM_ERROR(comm, gcommSystemError, -1, "out of memory");
  int rc = MPI_Allgather(&mine, sizeof(mine), MPI_BYTE, all, sizeof(mine), MPI_BYTE, comm->mpiComm);
  if (rc != MPI_SUCCESS) {
    free(all);
    MPI_CHECK(comm, rc);
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
  noteGpuSharing(comm, sharing, sharingNoMps);
  int nch = comm->nLocal > 4 ? GCOMM_MAX_CHANNELS / 2 : GCOMM_MAX_CHANNELS;
  while (nch > 1 && (nch > fewestSms || (int64_t)sharing * nch > 2 * fewestSms)) nch /= 2;
  /* a small LL launch runs up to GCOMM_DEV_SMALL_WORKS blocks at 1 an SM (blocks of ranks sharing
   * a GPU wait on each other: all must be resident); one waiting to start beside the one before
   * it holds SMs too: every rank sharing a GPU must still fit both */
  comm->smallKernel = (int64_t)sharing * GCOMM_DEV_SMALL_WORKS <= fewestSms;
  comm->launchOverlap = comm->params.pdl && comm->deviceCcMajor >= 9 &&
                        (int64_t)sharing * 2 * GCOMM_DEV_SMALL_WORKS <= fewestSms;
  *nChannels = spansNodes(comm)                                    ? GPU_NET_CHANNELS
               : comm->params.p2pDisable || comm->params.p2pMemcpy ? GPU_STAGED_CHANNELS
                                                                   : nch;
  return gcommSuccess;
}
#endif

/* Whether the user chose the channel count (GCOMM_NCHANNELS or config.nChannels): defaults that
 * depend on the communicator's shape then stay out of the way. */
static int channelsChosen(const gcommConfig_t* config) {
  return getenv("GCOMM_NCHANNELS") != NULL ||
         (config != NULL && config->nChannels != GCOMM_CONFIG_UNDEF_INT);
}

/* Everything after the MPI communicator exists; on failure the caller frees comm. */
static gcommResult_t commSetup(gcommComm_t comm, const gcommConfig_t* config) {
  static int commCounter;
  gcommCard_t card;
  uint64_t hostId = 0;
  MPI_CHECK(comm, MPI_Comm_rank(comm->mpiComm, &comm->rank));
  MPI_CHECK(comm, MPI_Comm_size(comm->mpiComm, &comm->nranks));
  paramsLoad(&comm->params, comm, config);
  paramsPrint(comm);
  GCOMM_CHECK(paramsAgree(comm));
  comm->device = GCOMM_DEVICE_HOST;
  snprintf(comm->name, sizeof(comm->name), "%s",
           config && config->commName ? config->commName : "");
  if (comm->name[0] == 0)
    snprintf(comm->name, sizeof(comm->name), "comm%d",
             __atomic_fetch_add(&commCounter, 1, __ATOMIC_RELAXED));
  GCOMM_CHECK(detectNode(comm, &hostId));
#ifdef GCOMM_GPU
  GCOMM_CHECK(agree(comm, gcommDeviceSelect(comm, config), "GPU selection"));
  int gpuChannels = 0;
  GCOMM_CHECK(gpuDefaultChannels(comm, hostId, &gpuChannels)); /* every rank: an MPI call */
  if (comm->device >= 0 && !channelsChosen(config)) comm->params.nChannels = gpuChannels;
  if (comm->device >= 0 && getenv("GCOMM_BUFFSIZE") == NULL) comm->params.buffSize = 4 << 20;
#endif
  /* host communicators between nodes: one channel. Every lane to a peer shares its one
   * connection, and one thread moves them all; against 2 channels a 4 MB all-reduce over tcp took
   * less CPU in 9 of 9 adjacent pairs of runs, 16 MB in 3 of 4 (docs/PERF.md). 512 KB slots, each
   * one eager message (transports/net_ofi.c): over tcp each message costs the kernel and the
   * provider a fixed amount besides its bytes; against 256 KB slots the all-reduce was ahead at
   * 1-16 MB in 3 of 4 sets of alternating runs (34 pairs), 128 KB was worse everywhere, 768 KB
   * and 1 MB no better. GPU communicators keep theirs (above). */
  if (spansNodes(comm) && comm->device < 0) {
    if (!channelsChosen(config)) comm->params.nChannels = 1;
    if (getenv("GCOMM_BUFFSIZE") == NULL) comm->params.buffSize = 4 << 20;
  }
  comm->nChannels = comm->params.nChannels;
  /* lanes [0, nChannels) carry collectives, [nChannels, nChannels + nP2pChannels) point-to-point */
  comm->nP2pChannels = comm->nChannels;
#ifdef GCOMM_GPU
  /* one launch holds GCOMM_DEV_MAX_WORKS works (blocks): keep a group that sends to and receives
   * from every other rank once, each split over every p2p channel, inside one launch (a split
   * launch may deadlock). This also bounds the GPU FIFO memory of the p2p lanes. */
  if (comm->device >= 0) {
    int cap = GCOMM_DEV_MAX_WORKS / 2 / (comm->nranks > 1 ? comm->nranks - 1 : 1);
    if (cap < 1) cap = 1;
    if (comm->nP2pChannels > cap) comm->nP2pChannels = cap;
  }
#endif
  comm->nLanes = comm->nChannels + comm->nP2pChannels;
  comm->slotBytes = ((size_t)comm->params.buffSize / GCOMM_STEPS) & ~(size_t)63;

  memset(&card, 0, sizeof(card));
  card.hostId = hostId;
  card.pid = getpid();
  card.device = comm->device;
  gethostname(card.host, sizeof(card.host) - 1);
  size_t gpuShmBytes = 0; /* a GPU FIFO region staged through host memory, in the shm segment */
#ifdef GCOMM_GPU
  GCOMM_CHECK(agree(comm, gcommDevicePlaceFifos(comm, hostId, &gpuShmBytes), "GPU FIFO placement"));
#endif
  gcommResult_t res = gcommShmCreate(comm, &card, gpuShmBytes);
#ifdef GCOMM_GPU
  if (res == gcommSuccess && comm->device >= 0) res = gcommDeviceSetup(comm, &card);
#endif
  GCOMM_CHECK(agree(comm, res, "shared-memory setup"));
  comm->cards = calloc(comm->nranks, sizeof(gcommCard_t));
  if (comm->cards == NULL) return GCOMM_ERROR(comm, gcommSystemError, -1, "out of memory");
  MPI_CHECK(comm, MPI_Allgather(&card, sizeof(card), MPI_BYTE, comm->cards, sizeof(card), MPI_BYTE,
                                comm->mpiComm));
  /* the lanes and slot size must agree: they shape every FIFO; and so must the slot words, and
   * on GPUs the copy engines (which rule out LL: both ends of a connection use one protocol) */
  int shape[5] = {comm->nChannels, (int)comm->slotBytes, comm->nLanes,
                  (int)comm->params.checkMismatch, comm->device >= 0 && comm->params.p2pMemcpy},
      lo[5], hi[5];
  MPI_CHECK(comm, MPI_Allreduce(shape, lo, 5, MPI_INT, MPI_MIN, comm->mpiComm));
  MPI_CHECK(comm, MPI_Allreduce(shape, hi, 5, MPI_INT, MPI_MAX, comm->mpiComm));
  if (memcmp(lo, hi, sizeof(lo)) != 0)
    return GCOMM_ERROR(comm, gcommInvalidUsage, -1,
                       "ranks disagree on GCOMM_NCHANNELS (%d..%d), GCOMM_BUFFSIZE, "
                       "GCOMM_CHECK_MISMATCH, GCOMM_P2P_USE_CUDA_MEMCPY or GPU vs host "
                       "(config.device): set them the same on every rank",
                       lo[0], hi[0]);
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

  comm->sendConns = calloc((size_t)comm->nLanes * comm->nranks, sizeof(gcommConn_t));
  comm->recvConns = calloc((size_t)comm->nLanes * comm->nranks, sizeof(gcommConn_t));
  comm->nQueues = comm->nChannels + 2 * comm->nranks * comm->nP2pChannels;
  comm->queues = calloc(comm->nQueues, sizeof(gcommQueue_t));
  res = comm->sendConns && comm->recvConns && comm->queues
            ? gcommShmConnect(comm)
            : GCOMM_ERROR(comm, gcommSystemError, -1, "out of memory");
  GCOMM_CHECK(agree(comm, res, "shared-memory connection"));
  gcommShmUnlink(comm); /* every rank has mapped every segment it needs */
#ifdef GCOMM_OFI
  GCOMM_CHECK(agree(comm, gcommNetSetup(comm), "network setup"));
#endif
#ifdef GCOMM_GPU
  res = comm->device >= 0 ? gcommDeviceConnect(comm) : gcommSuccess;
  GCOMM_CHECK(agree(comm, res, "GPU IPC connection"));
  if (comm->device >= 0 && comm->params.proto == gcommProtoLL &&
      (spansNodes(comm) || copiesByEngine(comm)))
    GCOMM_WARN(comm,
               "GCOMM_PROTO=ll: LL cannot cross a proxy (its flags live in the data); this GPU "
               "communicator %s and uses simple",
               spansNodes(comm) ? "spans nodes" : "sends through copy engines");
#endif

  if (comm->params.dumpSignal > 0) installDumpSignal(comm);
  GCOMM_INFO(GCOMM_SUBSYS_INIT, comm,
             "comm \"%s\" rank %d/%d: %d local ranks, %d channels, %zu-byte FIFO slots, proxy "
             "%s, pid %d",
             comm->name, comm->rank, comm->nranks, comm->nLocal, comm->nChannels, comm->slotBytes,
             proxyModeNames[comm->params.proxyMode], (int)getpid());
  tuningPrint(comm);
  gcommProfInit(comm); /* late: a failing setup has no profiler to finalize */
  /* after the profiler, which the thread's passes report to (commFree finalizes it on failure) */
  return hasGpuProxy(comm) ? startGpuProxy(comm) : gcommSuccess;
}

/* The live communicators of the process. A handle is checked here, never by reading the memory
 * it points to: after gcommCommDestroy that memory is freed (a magic number in it was no check:
 * the compiler drops a store before free, and reading it is a use after free). A destroyed
 * handle whose address a new communicator reuses passes for the new one. */
static pthread_mutex_t liveLock = PTHREAD_MUTEX_INITIALIZER;
static gcommComm_t* liveComms;
static int nLive, liveCap;

static gcommResult_t commRegister(gcommComm_t comm) {
  pthread_mutex_lock(&liveLock);
  if (nLive == liveCap) {
    int cap = liveCap ? 2 * liveCap : 16;
    gcommComm_t* grown = realloc(liveComms, (size_t)cap * sizeof(*grown));
    if (grown == NULL) {
      pthread_mutex_unlock(&liveLock);
      return GCOMM_ERROR(comm, gcommSystemError, -1, "out of memory");
    }
    liveComms = grown, liveCap = cap;
  }
  liveComms[nLive++] = comm;
  pthread_mutex_unlock(&liveLock);
  return gcommSuccess;
}

/* Removes comm from the live set; 0 when it was not there (the loser of two destroys). */
static int commUnregister(gcommComm_t comm) {
  int found = 0;
  pthread_mutex_lock(&liveLock);
  for (int i = 0; i < nLive && !found; i++)
    if (liveComms[i] == comm) liveComms[i] = liveComms[--nLive], found = 1;
  if (nLive == 0) free(liveComms), liveComms = NULL, liveCap = 0; /* nothing left at exit */
  pthread_mutex_unlock(&liveLock);
  return found;
}

static int commIsLive(gcommComm_t comm) {
  int found = 0;
  pthread_mutex_lock(&liveLock);
  for (int i = 0; i < nLive && !found; i++) found = liveComms[i] == comm;
  pthread_mutex_unlock(&liveLock);
  return found;
}

static void commFree(gcommComm_t comm) {
  int finalized = 1;
  if (comm->threadStarted) {
    pthread_mutex_lock(&comm->postLock);
    __atomic_store_n(&comm->stopThread, 1, __ATOMIC_RELEASE);
    pthread_cond_signal(&comm->postCond);
    pthread_mutex_unlock(&comm->postLock);
    pthread_join(comm->thread, NULL);
  }
  if (comm->queues) drainAll(comm); /* frees whatever never ran */
  gcommProfFinalize(comm);          /* no hook runs after this */
#ifdef GCOMM_OFI
  gcommNetFree(comm); /* first: its receives may land in a GPU communicator's pinned FIFOs */
#endif
#ifdef GCOMM_GPU
  gcommDeviceFree(comm);
#endif
  gcommShmFree(comm);
  free(comm->sendConns);
  free(comm->recvConns);
  free(comm->queues);
  free(comm->cards);
  MPI_Finalized(&finalized);
  if (!finalized && comm->mpiComm != MPI_COMM_NULL) MPI_Comm_free(&comm->mpiComm);
  pthread_mutex_destroy(&comm->postLock);
  pthread_cond_destroy(&comm->postCond);
  pthread_mutex_destroy(&comm->progressLock);
  pthread_mutex_destroy(&comm->doneLock);
  pthread_cond_destroy(&comm->doneCond);
  pthread_mutex_destroy(&comm->errorLock);
  free(comm);
}

/* Takes ownership of mpiComm (already private to gcomm). */
static gcommResult_t commCreate(gcommComm_t* out, MPI_Comm mpiComm, const gcommConfig_t* config) {
  gcommComm_t comm = calloc(1, sizeof(*comm));
  if (comm == NULL) {
    MPI_Comm_free(&mpiComm);
    return GCOMM_ERROR(NULL, gcommSystemError, -1, "out of memory");
  }
  comm->mpiComm = mpiComm;
  comm->owner = pthread_self();
  comm->ownerTid = (long)syscall(SYS_gettid);
  pthread_mutex_init(&comm->postLock, NULL);
  pthread_cond_init(&comm->postCond, NULL);
  pthread_mutex_init(&comm->progressLock, NULL);
  pthread_mutex_init(&comm->doneLock, NULL);
  pthread_cond_init(&comm->doneCond, NULL);
  pthread_mutex_init(&comm->errorLock, NULL);
  gcommResult_t res = commSetup(comm, config);
  if (res == gcommSuccess) res = commRegister(comm);
  if (res != gcommSuccess) {
    snprintf(threadLastError, sizeof(threadLastError), "%s", comm->lastError);
    commFree(comm);
    return res;
  }
  *out = comm;
  return gcommSuccess;
}

gcommResult_t gcommCommInitMPI(gcommComm_t* comm, MPI_Comm mpiComm, const gcommConfig_t* config) {
  int initialized = 0, finalized = 0;
  MPI_Comm dup;
  if (comm == NULL) return GCOMM_ERROR(NULL, gcommInvalidArgument, -1, "comm is NULL");
  *comm = NULL;
  GCOMM_CHECK(checkConfig(config));
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized)
    return GCOMM_ERROR(NULL, gcommInvalidUsage, -1, "MPI is not initialised (or is finalised)");
  if (mpiComm == MPI_COMM_NULL)
    return GCOMM_ERROR(NULL, gcommInvalidArgument, -1, "mpiComm is MPI_COMM_NULL");
  int err = MPI_Comm_dup(mpiComm, &dup);
  if (err != MPI_SUCCESS)
    return GCOMM_ERROR(NULL, gcommSystemError, -1, "MPI_Comm_dup failed (MPI error %d)", err);
  return commCreate(comm, dup, config);
}

static gcommResult_t checkComm(gcommComm_t comm, const char* where) {
  if (comm == NULL) return gcommSetError(NULL, gcommInvalidArgument, -1, where, "comm is NULL");
  if (!commIsLive(comm))
    return gcommSetError(NULL, gcommInvalidArgument, -1, where,
                         "comm %p is not a live communicator (destroyed already, or never made)",
                         (void*)comm);
  return gcommSuccess;
}

gcommResult_t gcommCommSplit(gcommComm_t comm, int color, int key, gcommComm_t* newcomm,
                             const gcommConfig_t* config) {
  MPI_Comm split;
  GCOMM_CHECK(checkComm(comm, __func__));
  if (newcomm == NULL) return GCOMM_ERROR(comm, gcommInvalidArgument, -1, "newcomm is NULL");
  *newcomm = NULL;
  if (color < 0 && color != GCOMM_SPLIT_NOCOLOR)
    return GCOMM_ERROR(comm, gcommInvalidArgument, -1,
                       "color %d is negative (use GCOMM_SPLIT_NOCOLOR to join no communicator)",
                       color);
  GCOMM_CHECK(checkConfig(config));
  gcommConfig_t inherited = GCOMM_CONFIG_INITIALIZER;
  if (config == NULL) {
    inherited.proxyMode = comm->params.proxyMode;
    inherited.nChannels = comm->nChannels;
#ifdef GCOMM_GPU
    inherited.device = comm->device;
#endif
    config = &inherited;
  }
  MPI_CHECK(comm,
            MPI_Comm_split(comm->mpiComm, color == GCOMM_SPLIT_NOCOLOR ? MPI_UNDEFINED : color, key,
                           &split));
  if (split == MPI_COMM_NULL) return gcommSuccess;
  return commCreate(newcomm, split, config);
}

gcommResult_t gcommCommAbort(gcommComm_t comm) {
  GCOMM_CHECK(checkComm(comm, __func__));
  __atomic_store_n(&comm->abortFlag, 1, __ATOMIC_RELEASE);
#ifdef GCOMM_GPU
  gcommDeviceAbort(comm); /* kernels poll it */
#endif
  setAsyncError(comm, gcommAborted);
  pthread_mutex_lock(&comm->postLock);
  pthread_cond_signal(&comm->postCond);
  pthread_mutex_unlock(&comm->postLock);
  pthread_mutex_lock(&comm->doneLock);
  pthread_cond_broadcast(&comm->doneCond);
  pthread_mutex_unlock(&comm->doneLock);
  return gcommSuccess;
}

static gcommResult_t hostWait(gcommComm_t comm);

gcommResult_t gcommCommDestroy(gcommComm_t comm) {
  GCOMM_CHECK(checkComm(comm, __func__));
  /* the group's queued operations point at comm: GroupEnd would post them to freed memory */
  if (__atomic_load_n(&comm->inGroup, __ATOMIC_ACQUIRE))
    return GCOMM_ERROR(comm, gcommInvalidUsage, -1,
                       "a group is open with work on this communicator: call gcommGroupEnd "
                       "first, then destroy it");
  /* unregistered first: of two destroys of one handle, only one goes on */
  if (!commUnregister(comm)) return checkComm(comm, __func__);
  gcommResult_t res = gcommSuccess;
#ifdef GCOMM_GPU
  if (comm->device >= 0)
    res = gcommDeviceQuiesce(comm); /* the GPU's work, then every rank's */
  else
#endif
      if (__atomic_load_n(&comm->asyncError, __ATOMIC_ACQUIRE) == gcommSuccess)
    res = hostWait(comm); /* outstanding work finishes first */
  /* a rank still blocked on this one now called something this one never will */
  gcommStatus_t* st = gcommShmStatus(comm, comm->rank);
  if (st != NULL && res == gcommSuccess &&
      __atomic_load_n(&comm->asyncError, __ATOMIC_ACQUIRE) == gcommSuccess)
    st->finished = 1; /* before the code: readers load the code with acquire */
  publishStop(comm, gcommRemoteError, "gcommCommDestroy was called there");
  commFree(comm);
  return res == gcommAborted ? gcommSuccess : res;
}

/* The error that stopped comm: the engine's or, on a GPU communicator, a kernel's as soon as the
 * kernel has recorded it in mapped memory (no CUDA call, no wait for the stream). */
static gcommResult_t commAsyncError(gcommComm_t comm, const char* where) {
#ifdef GCOMM_GPU
  if (comm->device >= 0 && __atomic_load_n(&comm->asyncError, __ATOMIC_ACQUIRE) == gcommSuccess)
    gcommDeviceKernelError(comm, where);
#else
  (void)where;
#endif
  return (gcommResult_t)__atomic_load_n(&comm->asyncError, __ATOMIC_ACQUIRE);
}

gcommResult_t gcommCommGetAsyncError(gcommComm_t comm, gcommResult_t* asyncError) {
  GCOMM_CHECK(checkComm(comm, __func__));
  if (asyncError == NULL) return GCOMM_ERROR(comm, gcommInvalidArgument, -1, "asyncError is NULL");
  *asyncError = commAsyncError(comm, __func__);
  return gcommSuccess;
}

#define DEFINE_QUERY(NAME, ARG, FIELD)                                                    \
  gcommResult_t NAME(const gcommComm_t comm, int* ARG) {                                  \
    GCOMM_CHECK(checkComm(comm, __func__));                                               \
    if (ARG == NULL) return GCOMM_ERROR(comm, gcommInvalidArgument, -1, #ARG " is NULL"); \
    *ARG = comm->FIELD;                                                                   \
    return gcommSuccess;                                                                  \
  }
DEFINE_QUERY(gcommCommCount, count, nranks)
DEFINE_QUERY(gcommCommUserRank, rank, rank)
DEFINE_QUERY(gcommCommDevice, device, device)

/* ======================================================================================== */
/* The cost model: time = hops * alpha + bytes * dataFactor / bandwidth, per algorithm.     */
/* ======================================================================================== */

/* Measured on host shared memory (docs/PERF.md): a hop is one FIFO slot handed from one rank
 * to the next; bandwidth is what one rank's copy/reduce loops move. */
#define HOST_ALPHA_US 2.0
#define HOST_BW_BYTES_PER_US 4000.0
/* Between nodes: the all-reduce size up to which the one-shot beats the ring (see chooseAlgo). */
#define NET_ONESHOT_MAX_BYTES (256u << 10)

static int log2Up(int n) {
  int l = 0;
  while ((1 << l) < n) l++;
  return l;
}

/* An algorithm's two cost terms: FIFO hops one after another, and bytes each rank moves per byte
 * of `bytes`, the size nccl-tests reports (the whole buffer; AllGather: the output;
 * ReduceScatter: the input). Returns 0 when func has no such algorithm. */
static int costTerms(int func, int algo, int n, double* hops, double* data) {
  if (gcommSchedAlgo(func, algo) != algo) return 0;
  switch (func) {
    case gcommFuncAllReduce:
      *hops = algo == gcommAlgoRing ? 2 * (n - 1) : algo == gcommAlgoTree ? 2 * log2Up(n) : 2;
      *data = algo == gcommAlgoRing || algo == gcommAlgoTwoShot ? 4.0 * (n - 1) / n
              : algo == gcommAlgoTree                           ? 4
                                                                : 2.0 * (n - 1);
      break;
    case gcommFuncBroadcast:
    case gcommFuncReduce:
      *hops = algo == gcommAlgoRing ? n - 1 : algo == gcommAlgoTree ? log2Up(n) : 1;
      *data = algo == gcommAlgoRing ? 2 : algo == gcommAlgoTree ? 3 : n - 1;
      break;
    case gcommFuncAllGather:
    case gcommFuncReduceScatter:
      *hops = algo == gcommAlgoRing ? n - 1 : 1;
      *data = (algo == gcommAlgoRing ? 2.0 : 3.0) * (n - 1) / n;
      break;
    default:
      *hops = 1, *data = 2.0 * (n - 1) / n;
  }
  if (n == 1) *hops = 0, *data = 1;
  return 1;
}

/* Predicted microseconds on host memory, or a negative value when func has no such algorithm. */
static double predictUs(int func, int algo, int n, double bytes) {
  double hops, data;
  if (!costTerms(func, algo, n, &hops, &data)) return -1;
  return hops * HOST_ALPHA_US + bytes * data / HOST_BW_BYTES_PER_US;
}

#ifdef GCOMM_GPU
/* GPU communicators, per protocol, fitted to GCOMM_PROTO-forced sweeps on 2 H200s over NVLink
 * (docs/PERF.md): the cost of one FIFO hop (launch included), what one block (a channel) moves
 * per microsecond, and the link's cap. LL saves ~2 us a hop (its launches run the LL-only kernel,
 * which spills nothing) but moves data at a fraction of Simple's rate (half of every line is
 * flags), so it pays up to ~128-256 KB (a GCOMM_PROTO-forced sweep). */
static const struct {
  double hopUs, blockBytesPerUs, linkBytesPerUs;
} gpuCost[gcommNumProtos] = {
    {5.9, 20000, 340000}, /* Simple: payload, one release per post */
    {3.9, 11000, 120000}, /* LL: flags in the data; its kernel spills nothing */
};

static double predictGpuUs(int func, int algo, int proto, int n, double bytes, int nch) {
  double hops, data;
  if (!costTerms(func, algo, n, &hops, &data)) return -1;
  double bw = nch * gpuCost[proto].blockBytesPerUs;
  if (bw > gpuCost[proto].linkBytesPerUs) bw = gpuCost[proto].linkBytesPerUs;
  return hops * gpuCost[proto].hopUs + bytes * data / bw;
}
#endif

static int chooseAlgo(gcommComm_t comm, int func, size_t bytes) {
  if (comm->params.algo >= 0) return gcommSchedAlgo(func, comm->params.algo);
#ifdef GCOMM_GPU
  /* GPUs (measured on 2 H200s, docs/PERF.md): the one-shot all-reduce (one hop) wins while each
   * rank's (n-1) copies stay small; elsewhere the ring. */
  if (comm->device >= 0) {
    int small = func == gcommFuncAllReduce && bytes * (size_t)(comm->nranks - 1) <= (2u << 20);
    return gcommSchedAlgo(func, small ? gcommAlgoDirect : gcommAlgoRing);
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
  int best = gcommSchedAlgo(func, gcommAlgoRing);
  double bestUs = predictUs(func, best, comm->nranks, (double)bytes);
  for (int a = 0; a < gcommNumAlgos; a++) {
    double us = predictUs(func, a, comm->nranks, (double)bytes);
    /* two-shot only when forced (GCOMM_ALGO=twoshot) until it is measured */
    if (us >= 0 && us < bestUs && a != gcommAlgoTwoShot) best = a, bestUs = us;
  }
  return best;
}

/* Channels pay off once each gets a few slots of data: one per perChannel bytes, at most the
 * collective channels (or the point-to-point channels for a Send/Recv). For a Send/Recv, bytes is
 * count * type size: sender and receiver derive the same number, so their slices meet on the
 * same lanes. */
static int chooseChannels(gcommComm_t comm, int func, size_t bytes, int proto) {
  int isP2p = func == gcommFuncSend || func == gcommFuncRecv;
  size_t maxCh = (size_t)(isP2p ? comm->nP2pChannels : comm->nChannels);
  size_t nc = bytes / (4 * comm->slotBytes);
#ifdef GCOMM_GPU
  /* a block per channel: up to 32 from 32 KB each; beyond 32 only once each gets 128 KB, beyond
   * 64 once each gets 512 KB, a slot (more blocks made 2 MB slower and 16 MB+ faster: docs/PERF.md)
   */
  if (comm->device >= 0) {
    size_t few = bytes / (32 * 1024), many = bytes / (128 * 1024), most = bytes / (512 * 1024);
    nc = most > 64 ? most : many > 64 ? 64 : many > 32 ? many : few < 32 ? few : 32;
    /* LL: a block moves ~11 GB/s of payload (half of each line is flags), so an LL operation
     * spreads from 8 KB a channel; up to GCOMM_DEV_SMALL_WORKS of them, which one small launch
     * carries (16 or 32 LL channels, a large launch, made 128 KB slower: docs/PERF.md) */
    if (proto == gcommProtoLL) {
      /* a Send/Recv takes half: the usual group of one send and one receive fits one small launch
       */
      size_t cap = isP2p ? GCOMM_DEV_SMALL_WORKS / 2 : GCOMM_DEV_SMALL_WORKS;
      nc = bytes / (8 * 1024) < cap ? bytes / (8 * 1024) : cap;
    }
  }
#else
  (void)proto;
#endif
  return nc < 1 ? 1 : nc > maxCh ? (int)maxCh : (int)nc;
}

/* Host communicators always use Simple; GPU communicators the faster by the model, except with a
 * proxy (between nodes, copy engines): LL's flags travel in the data, which the proxy moves keyed
 * on a tail LL does not publish (a forced GCOMM_PROTO=ll warned at init). */
static int chooseProto(gcommComm_t comm, int func, int algo, size_t bytes) {
  if (comm->device < 0 || spansNodes(comm) || copiesByEngine(comm)) return gcommProtoSimple;
  if (comm->params.proto >= 0) return comm->params.proto;
#ifdef GCOMM_GPU
  double us[gcommNumProtos];
  for (int p = 0; p < gcommNumProtos; p++)
    us[p] = predictGpuUs(func, algo, p, comm->nranks, (double)bytes,
                         chooseChannels(comm, func, bytes, p));
  if (us[gcommProtoLL] < us[gcommProtoSimple]) return gcommProtoLL;
#else
  (void)func, (void)algo, (void)bytes;
#endif
  return gcommProtoSimple;
}

/* GCOMM_DEBUG_SUBSYS=TUNING: the cost model's predictions and choices, by collective and size. */
static void tuningPrint(gcommComm_t comm) {
  if (comm->rank != 0 || !gcommLogEnabled(GCOMM_LOG_INFO, GCOMM_SUBSYS_TUNING)) return;
  for (int f = 0; f <= gcommFuncReduceScatter; f++) {
    for (double bytes = comm->device >= 0 ? 8 : 1024; bytes <= 1024.0 * 1024 * 1024; bytes *= 8) {
      char line[512];
      int len = 0;
      size_t b = (size_t)bytes;
      int algo = chooseAlgo(comm, f, b), proto = chooseProto(comm, f, algo, b);
      int nch = chooseChannels(comm, f, b, proto);
      for (int a = 0; a < gcommNumAlgos && len < (int)sizeof(line) - 64; a++) {
#ifdef GCOMM_GPU
        if (comm->device >= 0) {
          for (int p = 0; p < gcommNumProtos; p++) {
            double us = predictGpuUs(f, a, p, comm->nranks, bytes, chooseChannels(comm, f, b, p));
            if (us >= 0)
              len += snprintf(line + len, sizeof(line) - len, " %s/%s %.1f", algoNames[a],
                              protoNames[p], us);
          }
          continue;
        }
#endif
        double us = predictUs(f, a, comm->nranks, bytes);
        if (us >= 0) len += snprintf(line + len, sizeof(line) - len, " %s %.1f", algoNames[a], us);
      }
      GCOMM_INFO(GCOMM_SUBSYS_TUNING, comm, "%-13s %10.0f B: %s/%s, %d channel(s) (model, us:%s)",
                 funcNames[f], bytes, algoNames[algo], protoNames[proto], nch, line);
    }
  }
}

/* ======================================================================================== */
/* Argument checks: a bad call says which argument and why, and changes nothing.            */
/* ======================================================================================== */

/* A CUDA device pointer on a host communicator. libcuda is only asked if the process has
 * already loaded it: without it there can be no device pointers. */
static int isDevicePointer(const void* ptr) {
  typedef int (*getAttr_t)(void* data, int attribute, unsigned long long ptr);
  static getAttr_t getAttr;
  static int looked;
  if (!__atomic_load_n(&looked, __ATOMIC_ACQUIRE)) {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (lib != NULL) getAttr = (getAttr_t)dlsym(lib, "cuPointerGetAttribute");
    __atomic_store_n(&looked, 1, __ATOMIC_RELEASE);
  }
  unsigned int memType = 0, managed = 0;
  if (getAttr == NULL || ptr == NULL) return 0;
  if (getAttr(&memType, 2 /* CU_POINTER_ATTRIBUTE_MEMORY_TYPE */, (unsigned long long)ptr) != 0)
    return 0;
  getAttr(&managed, 8 /* CU_POINTER_ATTRIBUTE_IS_MANAGED */, (unsigned long long)ptr);
  return memType == 2 /* CU_MEMORYTYPE_DEVICE */ && !managed;
}

/* Elements each side of op uses on this rank (0 where a buffer is unused). */
static void bufferCounts(const gcommOp_t* op, int rank, int n, size_t* inCount, size_t* outCount) {
  size_t c = op->count;
  int isRoot = rank == op->root;
  switch (op->func) {
    case gcommFuncAllReduce:
      *inCount = c, *outCount = c;
      return;
    case gcommFuncBroadcast:
      *inCount = isRoot ? c : 0, *outCount = c;
      return;
    case gcommFuncReduce:
      *inCount = c, *outCount = isRoot ? c : 0;
      return;
    case gcommFuncAllGather:
      *inCount = c, *outCount = c * n;
      return;
    case gcommFuncReduceScatter:
      *inCount = c * n, *outCount = c;
      return;
    case gcommFuncAllToAll:
      *inCount = c * n, *outCount = c * n;
      return;
    case gcommFuncGather:
      *inCount = c, *outCount = isRoot ? c * n : 0;
      return;
    case gcommFuncScatter:
      *inCount = isRoot ? c * n : 0, *outCount = c;
      return;
    case gcommFuncSend:
      *inCount = c, *outCount = 0;
      return;
    default:
      *inCount = 0, *outCount = c;
      return;
  }
}

/* The in-place layouts of gcomm.h: the one overlap that is allowed. */
static int isInPlace(const gcommOp_t* op, int rank, size_t esz) {
  /* as integers: a NULL buffer (one a rank does not use) plus an offset is undefined */
  uintptr_t in = (uintptr_t)op->sendbuff, out = (uintptr_t)op->recvbuff;
  size_t blk = op->count * esz * rank;
  switch (op->func) {
    case gcommFuncAllReduce:
    case gcommFuncBroadcast:
    case gcommFuncReduce:
    case gcommFuncAllToAll: /* every block is sent before its peer's block lands on it */
      return in == out;
    case gcommFuncAllGather:
    case gcommFuncGather:
      return in == out + blk;
    case gcommFuncReduceScatter:
    case gcommFuncScatter:
      return out == in + blk;
    default:
      return 0;
  }
}

static int isReduction(int func) {
  return func == gcommFuncAllReduce || func == gcommFuncReduce || func == gcommFuncReduceScatter;
}

/* No buffer is larger than a process's address space (2^57 bytes with 5-level paging): a count
 * beyond it is too large, before it can look like an overlap (or an in-place layout). */
#define MAX_BUFFER_BYTES ((size_t)1 << 57)

/* A reduction's op: a gcommRedOp_t, or a PreMulSum operator of comm for the call's datatype, which
 * becomes GCOMM_OP_PREMULSUM with the operator's scalar (so the operator may be destroyed once the
 * call has returned). */
static gcommResult_t resolveRedOp(gcommComm_t comm, gcommOp_t* op, const char* where) {
  unsigned slot = (unsigned)op->redop - gcommNumOps;
  if ((unsigned)op->redop < gcommNumOps) return gcommSuccess;
  if (op->redop < 0 || slot >= GCOMM_MAX_REDOPS || !comm->redOps[slot].used)
    return gcommSetError(comm, gcommInvalidArgument, -1, where,
                         "op %d is neither a gcommRedOp_t (0..%d) nor a PreMulSum operator of "
                         "this communicator (never created here, or destroyed)",
                         op->redop, gcommNumOps - 1);
  const gcommRedOpSlot_t* r = &comm->redOps[slot];
  if (r->datatype != op->datatype)
    return gcommSetError(comm, gcommInvalidArgument, -1, where,
                         "op %d is a PreMulSum operator for %s, but the call's datatype is %s",
                         op->redop, typeNames[r->datatype], typeNames[op->datatype]);
  op->redop = GCOMM_OP_PREMULSUM;
  op->scalar = r->scalar;
  op->scalarPtr = r->scalarPtr;
  return gcommSuccess;
}

static gcommResult_t checkArgs(gcommComm_t comm, gcommOp_t* op, const char* where) {
  int n = comm->nranks;
  size_t inCount, outCount;
#define BAD(...) gcommSetError(comm, gcommInvalidArgument, -1, where, __VA_ARGS__)
  if ((unsigned)op->datatype >= gcommNumTypes)
    return BAD("datatype %d is not a gcommDataType_t (0..%d)", op->datatype, gcommNumTypes - 1);
  if (isReduction(op->func)) GCOMM_CHECK(resolveRedOp(comm, op, where));
  if ((op->func == gcommFuncBroadcast || op->func == gcommFuncReduce ||
       op->func == gcommFuncGather || op->func == gcommFuncScatter) &&
      (op->root < 0 || op->root >= n))
    return BAD("root %d is not a rank of this communicator (0..%d)", op->root, n - 1);
  if ((op->func == gcommFuncSend || op->func == gcommFuncRecv) && (op->peer < 0 || op->peer >= n))
    return BAD("peer %d is not a rank of this communicator (0..%d)", op->peer, n - 1);
  size_t esz = gcommTypeSize(op->datatype);
  if (op->count > SIZE_MAX / 2 / esz / (size_t)n)
    return BAD("count %zu of %s is too large", op->count, typeNames[op->datatype]);
  bufferCounts(op, comm->rank, n, &inCount, &outCount);
  /* (no overflow: count * n * esz <= SIZE_MAX / 2 above) */
  if ((inCount > outCount ? inCount : outCount) * esz > MAX_BUFFER_BYTES)
    return BAD(
        "count %zu of %s is too large: %s would use %zu bytes of one buffer, more than an "
        "address space holds",
        op->count, typeNames[op->datatype], funcNames[op->func],
        (inCount > outCount ? inCount : outCount) * esz);
  if (inCount > 0 && op->sendbuff == NULL)
    return BAD("sendbuff is NULL but %s sends %zu elements from it on rank %d", funcNames[op->func],
               inCount, comm->rank);
  if (outCount > 0 && op->recvbuff == NULL)
    return BAD("recvbuff is NULL but %s receives %zu elements into it on rank %d",
               funcNames[op->func], outCount, comm->rank);
#ifdef GCOMM_GPU
  if (comm->device >= 0) {
    if (inCount > 0 && gcommDeviceBadPointer(comm, op->sendbuff))
      return BAD("sendbuff %p is host memory the GPU cannot use (a GPU communicator)",
                 op->sendbuff);
    if (outCount > 0 && gcommDeviceBadPointer(comm, op->recvbuff))
      return BAD("recvbuff %p is host memory the GPU cannot use (a GPU communicator)",
                 op->recvbuff);
  } else
#endif
  {
    if (inCount > 0 && isDevicePointer(op->sendbuff))
      return BAD("sendbuff %p is GPU memory but this is a host communicator", op->sendbuff);
    if (outCount > 0 && isDevicePointer(op->recvbuff))
      return BAD("recvbuff %p is GPU memory but this is a host communicator", op->recvbuff);
  }
  if (inCount > 0 && outCount > 0 && !isInPlace(op, comm->rank, esz)) {
    const char *in = op->sendbuff, *out = op->recvbuff;
    if (in < out + outCount * esz && out < in + inCount * esz)
      return BAD(
          "sendbuff [%p, +%zu B) and recvbuff [%p, +%zu B) overlap and are not the "
          "in-place layout of %s",
          op->sendbuff, inCount * esz, op->recvbuff, outCount * esz, funcNames[op->func]);
  }
  if (inCount == 0) op->sendbuff = NULL; /* never touched: the schedule reads no such buffer */
  if (outCount == 0) op->recvbuff = NULL;
  if (!isReduction(op->func)) op->redop = gcommSum;
  return gcommSuccess;
#undef BAD
}

/* ======================================================================================== */
/* Enqueue and groups                                                                       */
/* ======================================================================================== */

static __thread int groupDepth;
static __thread gcommComm_t groupComms; /* communicators with operations held by the group */

/* Splits a checked operation into its works: one per channel, each a contiguous slice
 * (chanOff, chanCount). Collectives use the collective channels; a Send/Recv uses the
 * point-to-point channels, as many as its byte count gives (the same on both sides). */
static gcommOp_t* buildOp(gcommComm_t comm, const gcommOp_t* args) {
  int n = comm->nranks, isP2p = args->func == gcommFuncSend || args->func == gcommFuncRecv;
  size_t esz = gcommTypeSize(args->datatype);
  /* the size every rank agrees on (nccl-tests' size), so that all ranks choose alike */
  size_t bytes = args->count * esz * (args->func >= gcommFuncAllGather && !isP2p ? n : 1);
  int algo = isP2p ? gcommAlgoDirect : chooseAlgo(comm, args->func, bytes);
  int proto = chooseProto(comm, args->func, algo, bytes);
  int nch = chooseChannels(comm, args->func, bytes, proto);
  gcommOp_t* op = calloc(1, sizeof(gcommOp_t) + nch * sizeof(gcommWork_t));
  if (op == NULL) return NULL;
  *op = *args;
  op->algo = algo;
  op->proto = proto;
  op->nChannels = nch;
  op->seq = isP2p ? 0 : __atomic_fetch_add(&comm->collSeq, 1, __ATOMIC_RELAXED); /* dumps read it */
  op->tag = comm->params.checkMismatch ? opTag(op) : 0;
  /* one rank in place: nothing to move (no launch, no engine pass), unless PreMulSum scales */
  if (n == 1 && isInPlace(args, 0, esz) && args->redop != GCOMM_OP_PREMULSUM) {
    op->nWorksLeft = 0;
    return op;
  }
  size_t align = esz >= 16 ? 1 : 16 / esz;
  size_t slotPayload = proto == gcommProtoLL ? GCOMM_LL_SLOT_PAYLOAD : comm->slotBytes;
  size_t chunk = (slotPayload / esz) / align * align;
  size_t per = gcommDivUp(gcommDivUp(args->count, nch), align) * align;
  for (int c = 0; c < nch; c++) {
    size_t off = per * c;
    if (off >= args->count) break;
    gcommWork_t* w = &op->works[op->nWorks];
    w->op = op;
    w->sched.func = args->func;
    w->sched.algo = algo;
    w->sched.nranks = n;
    w->sched.rank = comm->rank;
    w->sched.root = args->root;
    w->sched.peer = args->peer;
    w->sched.count = args->count;
    w->sched.chanOff = off;
    w->sched.chanCount = gcommMinSize(per, args->count - off);
    w->sched.chunk = chunk;
    w->sched.align = align;
    w->nSteps = gcommSchedNumSteps(&w->sched);
    if (w->nSteps == 0) continue;
    if (isP2p) { /* queue per (direction, peer, p2p channel); lane per p2p channel */
      int dir = args->func == gcommFuncRecv;
      w->queue = comm->nChannels + (dir * n + args->peer) * comm->nP2pChannels + c;
      w->lane = comm->nChannels + c;
    } else {
      w->queue = w->lane = c;
    }
    op->nWorks++;
  }
  op->nWorksLeft = op->nWorks;
  return op;
}

#ifdef GCOMM_GPU
/* One kernel launch for a GPU communicator's ops; one with a proxy (network, copy engines) wakes
 * the progress thread, which may be asleep with nothing posted. */
static gcommResult_t launchOps(gcommComm_t comm, gcommOp_t* ops, int n, void* stream) {
  gcommResult_t res = gcommDeviceLaunch(comm, ops, n, stream);
  if (res == gcommSuccess && hasGpuProxy(comm)) {
    pthread_mutex_lock(&comm->postLock);
    pthread_cond_signal(&comm->postCond);
    pthread_mutex_unlock(&comm->postLock);
  }
  return res;
}
#endif

/* Calls from two threads would post in an order that differs from rank to rank, and a call of
 * one thread would meet another thread's call on the other ranks: wrong data reported as
 * success. So a communicator's data calls come from the thread that created it, and a call from
 * any other is refused (it changes nothing; the owner's calls go on). */
static gcommResult_t checkOwner(gcommComm_t comm, const char* where) {
  if (pthread_equal(pthread_self(), comm->owner)) {
    __atomic_store_n(&comm->ownerLastCall, where, __ATOMIC_RELAXED);
    return gcommSuccess;
  }
  const char* last = __atomic_load_n(&comm->ownerLastCall, __ATOMIC_RELAXED);
  return gcommSetError(comm, gcommInvalidUsage, -1, where,
                       "called from thread %ld, but communicator \"%s\" belongs to thread %ld, "
                       "which created it (its last call: %s): a communicator's collective and "
                       "point-to-point calls must all come from the thread that created it",
                       (long)syscall(SYS_gettid), comm->name, comm->ownerTid,
                       last ? last : "none yet");
}

/* The checks every call makes before its own arguments'. */
gcommResult_t gcommEnqueueCheck(gcommComm_t comm, gcommStream_t stream, const char* where) {
  GCOMM_CHECK(checkComm(comm, where));
  GCOMM_CHECK(checkOwner(comm, where));
  if (stream != NULL && comm->device < 0)
    return gcommSetError(comm, gcommInvalidArgument, -1, where,
                         "stream must be NULL on a host communicator");
  gcommResult_t async = commAsyncError(comm, where);
  if (async != gcommSuccess)
    return gcommSetError(comm, async, -1, where,
                         "the communicator has stopped on an earlier error: %s", comm->lastError);
  return gcommSuccess;
}

static void traceOp(gcommComm_t comm, const gcommOp_t* op) {
  GCOMM_TRACE(isReduction(op->func) ? GCOMM_SUBSYS_COLL : GCOMM_SUBSYS_P2P, comm,
              "%s seq %llu count %zu %s %s root/peer %d algo %s proto %s channels %d works %d",
              funcNames[op->func], (unsigned long long)op->seq, op->count, typeNames[op->datatype],
              opNames[op->redop], op->func >= gcommFuncSend ? op->peer : op->root,
              algoNames[op->algo], protoNames[op->proto], op->nChannels, op->nWorks);
  if (GCOMM_PROF_ON(comm, gcommProfileGroup | gcommProfileColl | gcommProfileP2p))
    gcommProfOpEnqueued(comm, (gcommOp_t*)op, groupDepth > 0);
}

static void freeOps(gcommOp_t* head) {
  for (gcommOp_t* next; head; head = next) next = head->next, free(head);
}

/* Hands the built operations of one call (n of them, head to tail, each with works) over: a GPU
 * communicator launches them, a host communicator posts them as one batch (they run
 * concurrently), or the group holds them until its end. */
static gcommResult_t submitOps(gcommComm_t comm, gcommOp_t* head, gcommOp_t* tail, int n,
                               gcommStream_t stream, const char* where) {
#ifdef GCOMM_GPU
  if (comm->device >= 0) { /* a GPU communicator launches (now, or at the group's end) */
    if (groupDepth == 0) {
      gcommResult_t r = launchOps(comm, head, n, stream);
      freeOps(head);
      return r;
    }
    if (comm->groupHead != NULL && stream != comm->groupStream) {
      freeOps(head);
      return gcommSetError(comm, gcommInvalidUsage, -1, where,
                           "every operation of a group on one GPU communicator must use the "
                           "same stream");
    }
    comm->groupStream = stream;
  }
#else
  (void)stream, (void)where;
#endif
  if (groupDepth == 0 && comm->device < 0) return postOps(comm, head, tail, n);
  if (comm->groupTail)
    comm->groupTail->next = head;
  else
    comm->groupHead = head;
  comm->groupTail = tail;
  if (!comm->inGroup) {
    __atomic_store_n(&comm->inGroup, 1, __ATOMIC_RELEASE);
    comm->groupNext = groupComms;
    groupComms = comm;
  }
  return gcommSuccess;
}

static gcommResult_t enqueue(gcommComm_t comm, gcommOp_t* args, gcommStream_t stream,
                             const char* where) {
  GCOMM_CHECK(gcommEnqueueCheck(comm, stream, where));
  GCOMM_CHECK(checkArgs(comm, args, where));
  gcommOp_t* op = buildOp(comm, args);
  if (op == NULL) return gcommSetError(comm, gcommSystemError, -1, where, "out of memory");
  traceOp(comm, op);
  if (op->nWorks == 0) { /* nothing to move (count 0): complete at once */
    if (comm->device < 0) {
      __atomic_add_fetch(&comm->opsPosted, 1, __ATOMIC_ACQ_REL);
      __atomic_add_fetch(&comm->opsDone, 1, __ATOMIC_ACQ_REL);
    }
    free(op);
    return gcommSuccess;
  }
  return submitOps(comm, op, op, 1, stream, where);
}

/* A call made of point-to-point parts (gcomm_vcoll.c): checked whole before anything is
 * enqueued, one collective sequence number, every part tagged as the call (func, its datatype and
 * root, a hash of countsHash or, when 0, of the part's count), posted or launched together. */
gcommResult_t gcommEnqueueParts(gcommComm_t comm, gcommOp_t* parts, int n, int func,
                                uint64_t countsHash, gcommStream_t stream, const char* where) {
  GCOMM_CHECK(gcommEnqueueCheck(comm, stream, where));
  for (int i = 0; i < n; i++) GCOMM_CHECK(checkArgs(comm, &parts[i], where));
  uint64_t seq = __atomic_fetch_add(&comm->collSeq, 1, __ATOMIC_RELAXED);
  gcommOp_t *head = NULL, *tail = NULL;
  int count = 0;
  for (int i = 0; i < n; i++) {
    gcommOp_t* op = buildOp(comm, &parts[i]);
    if (op == NULL) {
      freeOps(head);
      return gcommSetError(comm, gcommSystemError, -1, where, "out of memory");
    }
    gcommOp_t call = *op;
    call.func = func;
    call.seq = op->seq = seq;
    call.count = countsHash ? countsHash : op->count;
    op->tag = comm->params.checkMismatch ? opTag(&call) : 0;
    traceOp(comm, op);
    if (op->nWorks == 0) { /* an empty part */
      free(op);
      continue;
    }
    if (tail)
      tail->next = op;
    else
      head = op;
    tail = op;
    count++;
  }
  return head == NULL ? gcommSuccess : submitOps(comm, head, tail, count, stream, where);
}

gcommResult_t gcommGroupStart(void) {
  groupDepth++;
  return gcommSuccess;
}

gcommResult_t gcommGroupEnd(void) {
  gcommResult_t res = gcommSuccess;
  if (groupDepth == 0)
    return GCOMM_ERROR(NULL, gcommInvalidUsage, -1, "gcommGroupEnd without gcommGroupStart");
  if (--groupDepth > 0) return gcommSuccess;
  while (groupComms != NULL) { /* one post per communicator: the group is one launch */
    gcommComm_t comm = groupComms;
    groupComms = comm->groupNext;
    int count = 0;
    gcommOp_t* tail = NULL;
    for (gcommOp_t* op = comm->groupHead; op; op = op->next) count++, tail = op;
    gcommResult_t r;
#ifdef GCOMM_GPU
    if (comm->device >= 0) {
      r = launchOps(comm, comm->groupHead, count, comm->groupStream);
      for (gcommOp_t *op = comm->groupHead, *next; op; op = next) next = op->next, free(op);
    } else
#endif
      r = postOps(comm, comm->groupHead, tail, count);
    if (r != gcommSuccess && res == gcommSuccess) res = r;
    if (comm->profGroup != NULL) gcommProfGroupEnd(comm);
    comm->groupHead = comm->groupTail = NULL;
    comm->groupNext = NULL;
    __atomic_store_n(&comm->inGroup, 0, __ATOMIC_RELEASE);
  }
  return res;
}

#define OP_ARGS(F, S, R, C, T, O, ROOT, PEER)                                                   \
  {                                                                                             \
    .func = (F), .sendbuff = (S), .recvbuff = (R), .count = (C), .datatype = (T), .redop = (O), \
    .root = (ROOT), .peer = (PEER)                                                              \
  }

gcommResult_t gcommAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                             gcommDataType_t datatype, gcommRedOp_t op, gcommComm_t comm,
                             gcommStream_t stream) {
  gcommOp_t a = OP_ARGS(gcommFuncAllReduce, sendbuff, recvbuff, count, datatype, op, 0, -1);
  return enqueue(comm, &a, stream, __func__);
}
gcommResult_t gcommBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                             gcommDataType_t datatype, int root, gcommComm_t comm,
                             gcommStream_t stream) {
  gcommOp_t a = OP_ARGS(gcommFuncBroadcast, sendbuff, recvbuff, count, datatype, 0, root, -1);
  return enqueue(comm, &a, stream, __func__);
}
gcommResult_t gcommReduce(const void* sendbuff, void* recvbuff, size_t count,
                          gcommDataType_t datatype, gcommRedOp_t op, int root, gcommComm_t comm,
                          gcommStream_t stream) {
  gcommOp_t a = OP_ARGS(gcommFuncReduce, sendbuff, recvbuff, count, datatype, op, root, -1);
  return enqueue(comm, &a, stream, __func__);
}
gcommResult_t gcommAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                             gcommDataType_t datatype, gcommComm_t comm, gcommStream_t stream) {
  gcommOp_t a = OP_ARGS(gcommFuncAllGather, sendbuff, recvbuff, sendcount, datatype, 0, 0, -1);
  return enqueue(comm, &a, stream, __func__);
}
gcommResult_t gcommReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                 gcommDataType_t datatype, gcommRedOp_t op, gcommComm_t comm,
                                 gcommStream_t stream) {
  gcommOp_t a = OP_ARGS(gcommFuncReduceScatter, sendbuff, recvbuff, recvcount, datatype, op, 0, -1);
  return enqueue(comm, &a, stream, __func__);
}
gcommResult_t gcommAllToAll(const void* sendbuff, void* recvbuff, size_t count,
                            gcommDataType_t datatype, gcommComm_t comm, gcommStream_t stream) {
  gcommOp_t a = OP_ARGS(gcommFuncAllToAll, sendbuff, recvbuff, count, datatype, 0, 0, -1);
  return enqueue(comm, &a, stream, __func__);
}
gcommResult_t gcommGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                          gcommDataType_t datatype, int root, gcommComm_t comm,
                          gcommStream_t stream) {
  gcommOp_t a = OP_ARGS(gcommFuncGather, sendbuff, recvbuff, sendcount, datatype, 0, root, -1);
  return enqueue(comm, &a, stream, __func__);
}
gcommResult_t gcommScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                           gcommDataType_t datatype, int root, gcommComm_t comm,
                           gcommStream_t stream) {
  gcommOp_t a = OP_ARGS(gcommFuncScatter, sendbuff, recvbuff, recvcount, datatype, 0, root, -1);
  return enqueue(comm, &a, stream, __func__);
}
gcommResult_t gcommSend(const void* sendbuff, size_t count, gcommDataType_t datatype, int peer,
                        gcommComm_t comm, gcommStream_t stream) {
  gcommOp_t a = OP_ARGS(gcommFuncSend, sendbuff, NULL, count, datatype, 0, -1, peer);
  return enqueue(comm, &a, stream, __func__);
}
gcommResult_t gcommRecv(void* recvbuff, size_t count, gcommDataType_t datatype, int peer,
                        gcommComm_t comm, gcommStream_t stream) {
  gcommOp_t a = OP_ARGS(gcommFuncRecv, NULL, recvbuff, count, datatype, 0, -1, peer);
  return enqueue(comm, &a, stream, __func__);
}

/* ======================================================================================== */
/* Reduction operators: PreMulSum, one table a communicator                                 */
/* ======================================================================================== */

/* Where a scalar of residence can be read: the host now (immediate), the kernels (device
 * residence on a GPU communicator) or the host executor (on a host communicator). */
static const char* badScalarPointer(gcommComm_t comm, const void* scalar, int residence) {
#ifdef GCOMM_GPU
  if (residence == gcommScalarDevice && comm->device >= 0)
    return gcommDeviceBadPointer(comm, scalar)
               ? "is host memory the GPU cannot read (a device-resident scalar)"
               : NULL;
#else
  (void)comm, (void)residence;
#endif
  return isDevicePointer(scalar) ? "is GPU memory, which the host reads (a host-immediate scalar, "
                                   "or any scalar of a host communicator)"
                                 : NULL;
}

gcommResult_t gcommRedOpCreatePreMulSum(gcommRedOp_t* op, void* scalar, gcommDataType_t datatype,
                                        gcommScalarResidence_t residence, gcommComm_t comm) {
  GCOMM_CHECK(checkComm(comm, __func__));
  if (op == NULL) return GCOMM_ERROR(comm, gcommInvalidArgument, -1, "op is NULL");
  if (scalar == NULL) return GCOMM_ERROR(comm, gcommInvalidArgument, -1, "scalar is NULL");
  if ((unsigned)datatype >= gcommNumTypes)
    return GCOMM_ERROR(comm, gcommInvalidArgument, -1,
                       "datatype %d is not a gcommDataType_t (0..%d)", datatype, gcommNumTypes - 1);
  if (residence != gcommScalarDevice && residence != gcommScalarHostImmediate)
    return GCOMM_ERROR(comm, gcommInvalidArgument, -1,
                       "residence %d is neither gcommScalarDevice (0) nor "
                       "gcommScalarHostImmediate (1)",
                       residence);
  const char* bad = badScalarPointer(comm, scalar, residence);
  if (bad != NULL) return GCOMM_ERROR(comm, gcommInvalidArgument, -1, "scalar %p %s", scalar, bad);
  int slot = 0;
  while (slot < GCOMM_MAX_REDOPS && comm->redOps[slot].used) slot++;
  if (slot == GCOMM_MAX_REDOPS)
    return GCOMM_ERROR(comm, gcommInvalidUsage, -1,
                       "all %d PreMulSum operators of this communicator exist: destroy one first",
                       GCOMM_MAX_REDOPS);
  gcommRedOpSlot_t* r = &comm->redOps[slot];
  memset(r, 0, sizeof(*r));
  r->datatype = datatype;
  if (residence == gcommScalarHostImmediate)
    memcpy(&r->scalar, scalar, gcommTypeSize(datatype));
  else
    r->scalarPtr = scalar;
  r->used = 1;
  *op = (gcommRedOp_t)(gcommNumOps + slot);
  return gcommSuccess;
}

gcommResult_t gcommRedOpDestroy(gcommRedOp_t op, gcommComm_t comm) {
  GCOMM_CHECK(checkComm(comm, __func__));
  unsigned slot = (unsigned)op - gcommNumOps;
  if ((int)op >= 0 && (int)op < gcommNumOps)
    return GCOMM_ERROR(comm, gcommInvalidArgument, -1,
                       "op %d is a built-in gcommRedOp_t: only PreMulSum operators are destroyed",
                       (int)op);
  if ((int)op < 0 || slot >= GCOMM_MAX_REDOPS || !comm->redOps[slot].used)
    return GCOMM_ERROR(comm, gcommInvalidArgument, -1,
                       "op %d is not a PreMulSum operator of this communicator (never created "
                       "here, or destroyed already)",
                       (int)op);
  comm->redOps[slot].used = 0;
  return gcommSuccess;
}

/* ======================================================================================== */
/* Progress and completion                                                                  */
/* ======================================================================================== */

gcommResult_t gcommProgress(gcommComm_t comm) {
  GCOMM_CHECK(checkComm(comm, __func__));
  if (comm->params.proxyMode == GCOMM_PROXY_POLL) {
    pthread_mutex_lock(&comm->progressLock);
    progressPass(comm);
    pthread_mutex_unlock(&comm->progressLock);
  }
  return gcommSuccess;
}

static int allDone(gcommComm_t comm, uint64_t target) {
  return __atomic_load_n(&comm->opsDone, __ATOMIC_ACQUIRE) >= target && !netPending(comm, 0);
}

/* The result of finished work: the communicator's error if it stopped, else success. */
static gcommResult_t finalResult(gcommComm_t comm, const char* where) {
  gcommResult_t res = (gcommResult_t)__atomic_load_n(&comm->asyncError, __ATOMIC_ACQUIRE);
  if (res == gcommSuccess) return gcommSuccess;
  if (res == gcommAborted)
    return gcommSetError(comm, res, -1, where, "the communicator was aborted");
  return res; /* the engine already recorded what, where and which peer */
}

gcommResult_t gcommTest(gcommComm_t comm, gcommStream_t stream) {
  GCOMM_CHECK(checkComm(comm, __func__));
#ifdef GCOMM_GPU
  if (comm->device >= 0) return gcommDeviceTest(comm, stream, __func__);
#endif
  if (stream != NULL)
    return GCOMM_ERROR(comm, gcommInvalidArgument, -1,
                       "stream must be NULL on a host communicator");
  uint64_t target = __atomic_load_n(&comm->opsPosted, __ATOMIC_ACQUIRE);
  GCOMM_CHECK(gcommProgress(comm));
  if (__atomic_load_n(&comm->abortFlag, __ATOMIC_ACQUIRE)) return finalResult(comm, __func__);
  return allDone(comm, target) ? finalResult(comm, __func__) : gcommInProgress;
}

/* gcommWait's loop: until the operations posted before target are done. A driver runs passes. */
static gcommResult_t waitDone(gcommComm_t comm, uint64_t target, int poll, int drive) {
  uint64_t deadline = gcommNowNs() + (uint64_t)(comm->params.timeoutMs + 1000) * 1000000;
  uint64_t idleSince = 0;
  while (!allDone(comm, target)) {
    if (__atomic_load_n(&comm->abortFlag, __ATOMIC_ACQUIRE)) return finalResult(comm, "gcommWait");
    if (gcommNowNs() > deadline)
      return gcommSetError(
          comm, gcommTimeout, -1, "gcommWait",
          "%llu operations still outstanding after GCOMM_TIMEOUT_MS=%lld",
          (unsigned long long)(target - __atomic_load_n(&comm->opsDone, __ATOMIC_ACQUIRE)),
          (long long)comm->params.timeoutMs);
    if (poll || (drive && pthread_mutex_trylock(&comm->progressLock) == 0)) {
      if (poll) pthread_mutex_lock(&comm->progressLock);
      int moved = progressPass(comm), mayNap = !netBusy(comm);
      pthread_mutex_unlock(&comm->progressLock);
      if (moved)
        idleSince = 0;
      else
        backoff(&idleSince, mayNap);
    } else if (backoff(&idleSince, 1) > 1000) {
      /* long waits sleep until the engine finishes something (or 1 ms, to see aborts) */
      struct timespec ts = deadlineIn(1000000);
      pthread_mutex_lock(&comm->doneLock);
      __atomic_add_fetch(&comm->waiters, 1, __ATOMIC_SEQ_CST);
      if (!allDone(comm, target) && !__atomic_load_n(&comm->abortFlag, __ATOMIC_ACQUIRE))
        pthread_cond_timedwait(&comm->doneCond, &comm->doneLock, &ts);
      __atomic_sub_fetch(&comm->waiters, 1, __ATOMIC_SEQ_CST);
      pthread_mutex_unlock(&comm->doneLock);
    }
  }
  return finalResult(comm, "gcommWait");
}

gcommResult_t gcommWait(gcommComm_t comm, gcommStream_t stream) {
  GCOMM_CHECK(checkComm(comm, __func__));
#ifdef GCOMM_GPU
  if (comm->device >= 0) return gcommDeviceWait(comm, stream, __func__);
#endif
  if (stream != NULL)
    return GCOMM_ERROR(comm, gcommInvalidArgument, -1,
                       "stream must be NULL on a host communicator");
  return hostWait(comm);
}

/* gcommWait on a host communicator (also gcommCommDestroy's, after comm left the live set). */
static gcommResult_t hostWait(gcommComm_t comm) {
  uint64_t target = __atomic_load_n(&comm->opsPosted, __ATOMIC_ACQUIRE);
  int poll = comm->params.proxyMode == GCOMM_PROXY_POLL;
  /* A waiting thread runs the passes itself, as in poll mode, and the engine thread sleeps
   * meanwhile: no hand-off from one thread to the other on the critical path (small all-reduces
   * over tcp: 12 against 40-60 us; in a node on 2 cores: 3 against 16 us), and no second thread
   * taking turns on the lock and the cores (each of its waits on the lock cost a futex wake:
   * docs/PERF.md). The engine thread serves work posted while nobody waits. */
  int drive = !poll && waitersDrive(comm);
  if (drive) __atomic_add_fetch(&comm->drivers, 1, __ATOMIC_SEQ_CST);
  gcommResult_t res = waitDone(comm, target, poll, drive);
  if (drive && __atomic_sub_fetch(&comm->drivers, 1, __ATOMIC_SEQ_CST) == 0 &&
      !allDone(comm, __atomic_load_n(&comm->opsPosted, __ATOMIC_ACQUIRE))) {
    pthread_mutex_lock(&comm->postLock); /* the engine thread takes over what is left */
    pthread_cond_broadcast(&comm->postCond);
    pthread_mutex_unlock(&comm->postLock);
  }
  return res;
}

/* ======================================================================================== */
/* Profiler: the plugin (GCOMM_PROFILER_PLUGIN, gcomm_profiler.h) and the hooks' bodies.    */
/* Every hook sits behind GCOMM_PROF_ON or a non-NULL handle: with no plugin, one branch.   */
/* ======================================================================================== */

#define PROF_OP 1   /* gcommWork_t.profStarted: its ProxyOp event was started */
#define PROF_STEP 2 /* ... and its current step's ProxyStep event */

/* The plugin's logger: its messages go where gcomm's go, under the PROFILE subsystem. */
static void profLog(int level, unsigned long flags, const char* file, int line, const char* fmt,
                    ...) {
  (void)flags;
  level = level < GCOMM_LOG_WARN    ? GCOMM_LOG_WARN
          : level > GCOMM_LOG_TRACE ? GCOMM_LOG_TRACE
                                    : level;
  if (!gcommLogEnabled(level, GCOMM_SUBSYS_PROFILE)) return;
  char msg[1024], where[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  snprintf(where, sizeof(where), "profiler plugin %s:%d", file ? file : "?", line);
  logWrite(level, NULL, where, msg);
}

/* A path (with a '/') as given; else libgcomm-profiler-NAME.so, then NAME as a library name.
 * On failure err holds the loader's message for the first candidate. RTLD_NODELETE: a plugin's
 * process-wide state (an open trace file) outlives the communicators that loaded it. */
static void* profOpen(const char* name, char* err, size_t errLen) {
  char shortName[PATH_MAX];
  void* lib;
  if (strchr(name, '/') == NULL) {
    snprintf(shortName, sizeof(shortName), "libgcomm-profiler-%s.so", name);
    if ((lib = dlopen(shortName, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE)) != NULL) return lib;
    snprintf(err, errLen, "%s", dlerror());
    return dlopen(name, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  }
  if ((lib = dlopen(name, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE)) == NULL)
    snprintf(err, errLen, "%s", dlerror());
  return lib;
}

void gcommProfInit(gcommComm_t comm) {
  const char* name = comm->params.profilerPlugin;
  if (name == NULL || strcmp(name, "none") == 0) return;
  char err[512] = "";
  void* lib = profOpen(name, err, sizeof(err));
  if (lib == NULL) {
    GCOMM_WARN(comm, "GCOMM_PROFILER_PLUGIN=%s: cannot load it (%s); profiling is off", name, err);
    return;
  }
  const gcommProfiler_v1_t* api = dlsym(lib, GCOMM_PROFILER_SYMBOL);
  if (api == NULL || !api->init || !api->startEvent || !api->stopEvent || !api->recordEventState ||
      !api->finalize) {
    GCOMM_WARN(comm,
               "GCOMM_PROFILER_PLUGIN=%s: no %s symbol with every function set (is it a gcomm "
               "profiler plugin?); profiling is off",
               name, GCOMM_PROFILER_SYMBOL);
    dlclose(lib);
    return;
  }
  /* an id every rank computes alike: rank 0's segment name is unique on its host */
  uint64_t commId = hashString(comm->cards[0].host) ^ (hashString(comm->cards[0].shmName) << 1);
  int nNodes = 0;
  for (int p = 0; p < comm->nranks; p++) nNodes += comm->cards[p].hostId == (uint64_t)p;
  comm->prof.api = api;
  gcommResult_t res = api->init(&comm->prof.context, commId, &comm->prof.mask, comm->name, nNodes,
                                comm->nranks, comm->rank, profLog);
  if (res != gcommSuccess) {
    GCOMM_WARN(comm, "GCOMM_PROFILER_PLUGIN=%s: the plugin's init failed (%s); profiling is off",
               name, gcommGetErrorString(res));
    __atomic_store_n(&comm->prof.mask, 0, __ATOMIC_RELAXED);
    comm->prof.api = NULL;
    comm->prof.context = NULL;
    dlclose(lib);
    return;
  }
  comm->prof.lib = lib;
  GCOMM_INFO(GCOMM_SUBSYS_INIT | GCOMM_SUBSYS_PROFILE, comm,
             "profiler plugin \"%s\" (%s) loaded, event mask 0x%x", api->name ? api->name : "?",
             name, comm->prof.mask);
#ifdef GCOMM_GPU
  if (comm->device >= 0) gcommDeviceProfSetup(comm); /* kernel timestamps; warns on failure */
#endif
}

void gcommProfFinalize(gcommComm_t comm) {
  if (comm->prof.api == NULL) return;
  __atomic_store_n(&comm->prof.mask, 0, __ATOMIC_RELAXED);
  comm->prof.api->finalize(comm->prof.context);
  dlclose(comm->prof.lib);
  memset(&comm->prof, 0, sizeof(comm->prof));
}

static void* profStart(gcommComm_t comm, gcommProfilerEventDescr_v1_t* d, uint64_t type,
                       void* parent) {
  void* handle = NULL;
  d->type = type;
  d->parentObj = parent;
  d->rank = comm->rank;
  comm->prof.api->startEvent(comm->prof.context, &handle, d);
  return handle;
}

void gcommProfStop(gcommComm_t comm, void* handle) {
  comm->prof.api->stopEvent(handle);
}

void gcommProfOpEnqueued(gcommComm_t comm, gcommOp_t* op, int inGroup) {
  gcommProfilerEventDescr_v1_t d;
  int mask = __atomic_load_n(&comm->prof.mask, __ATOMIC_RELAXED);
  int isP2p = op->func == gcommFuncSend || op->func == gcommFuncRecv;
  memset(&d, 0, sizeof(d));
  if (inGroup && comm->profGroup == NULL && (mask & gcommProfileGroup))
    comm->profGroup = profStart(comm, &d, gcommProfileGroup, NULL);
  if (!(mask & (isP2p ? gcommProfileP2p : gcommProfileColl))) return;
  size_t esz = gcommTypeSize(op->datatype);
  size_t bytes = op->count * esz * (op->func >= gcommFuncAllGather && !isP2p ? comm->nranks : 1);
  if (isP2p) {
    d.p2p.name = funcNames[op->func];
    d.p2p.peer = op->peer;
    d.p2p.count = op->count;
    d.p2p.datatype = typeNames[op->datatype];
    d.p2p.bytes = bytes;
    d.p2p.nChannels = op->nWorks;
    d.p2p.buff = op->func == gcommFuncSend ? op->sendbuff : op->recvbuff;
  } else {
    d.coll.name = funcNames[op->func];
    d.coll.seqNumber = op->seq;
    d.coll.count = op->count;
    d.coll.datatype = typeNames[op->datatype];
    d.coll.bytes = bytes;
    d.coll.op = isReduction(op->func) ? opNames[op->redop] : "none";
    d.coll.root = op->func == gcommFuncBroadcast || op->func == gcommFuncReduce ||
                          op->func == gcommFuncGather || op->func == gcommFuncScatter
                      ? op->root
                      : -1;
    d.coll.algorithm = algoNames[op->algo];
    d.coll.protocol = protoNames[op->proto];
    d.coll.nChannels = op->nWorks;
    d.coll.sendBuff = op->sendbuff;
    d.coll.recvBuff = op->recvbuff;
  }
  /* as NCCL's: the event ends once enqueued; the works' events (children) follow */
  op->profHandle = profStart(comm, &d, isP2p ? gcommProfileP2p : gcommProfileColl, comm->profGroup);
  if (op->profHandle != NULL) gcommProfStop(comm, op->profHandle);
}

void gcommProfGroupEnd(gcommComm_t comm) {
  gcommProfStop(comm, comm->profGroup);
  comm->profGroup = NULL;
}

void gcommProfStepBegin(gcommComm_t comm, gcommWork_t* w, const gcommStep_t* st) {
  gcommProfilerEventDescr_v1_t d;
  int mask = __atomic_load_n(&comm->prof.mask, __ATOMIC_RELAXED);
  const gcommOp_t* op = w->op;
  size_t esz = gcommTypeSize(op->datatype);
  if (!(w->profStarted & PROF_OP) && (mask & gcommProfileProxyOp)) {
    memset(&d, 0, sizeof(d));
    d.proxyOp.channelId = w->lane;
    d.proxyOp.peer = op->func >= gcommFuncSend ? op->peer : -1;
    d.proxyOp.nSteps = w->nSteps;
    d.proxyOp.chunkSize = w->sched.chunk * esz;
    d.proxyOp.isSend = op->func == gcommFuncSend ? 1 : op->func == gcommFuncRecv ? 0 : -1;
    w->profOp = profStart(comm, &d, gcommProfileProxyOp, op->profHandle);
    w->profStarted |= PROF_OP;
  }
  if (!(w->profStarted & PROF_STEP) && (mask & gcommProfileProxyStep)) {
    memset(&d, 0, sizeof(d));
    d.proxyStep.step = w->step;
    d.proxyStep.bytes = st->count * esz;
    d.proxyStep.sendPeer = st->sendPeer[0];
    d.proxyStep.recvPeer = st->recvPeer[0];
    w->profStep = profStart(comm, &d, gcommProfileProxyStep, w->profOp);
    w->profStarted |= PROF_STEP;
  }
}

void gcommProfStepWait(gcommComm_t comm, gcommWork_t* w, int peer, int isRecv) {
  gcommProfilerEventStateArgs_v1_t args;
  args.proxyStep.peer = peer;
  comm->prof.api->recordEventState(
      w->profStep, isRecv ? gcommProfilerProxyStepRecvWait : gcommProfilerProxyStepSendWait, &args);
}

void gcommProfWorkStepEnd(gcommComm_t comm, gcommWork_t* w, int workOver) {
  if (w->profStep != NULL) gcommProfStop(comm, w->profStep);
  w->profStep = NULL;
  w->profStarted &= ~PROF_STEP;
  if (!workOver) return;
  if (w->profOp != NULL) gcommProfStop(comm, w->profOp);
  w->profOp = NULL;
  w->profStarted = 0;
}

void* gcommProfCtrlStart(gcommComm_t comm, gcommProfilerEventState_v1_t state) {
  gcommProfilerEventDescr_v1_t d;
  memset(&d, 0, sizeof(d));
  void* handle = profStart(comm, &d, gcommProfileProxyCtrl, NULL);
  if (handle != NULL) comm->prof.api->recordEventState(handle, state, NULL);
  return handle;
}

void gcommProfCtrlStop(gcommComm_t comm, void* handle, gcommProfilerEventState_v1_t state,
                       int appended) {
  gcommProfilerEventStateArgs_v1_t args;
  args.proxyCtrl.appendedProxyOps = appended;
  comm->prof.api->recordEventState(handle, state, &args);
  gcommProfStop(comm, handle);
}

void gcommProfKernelCh(gcommComm_t comm, void* parent, int channel, uint64_t startNs,
                       uint64_t stopNs) {
  gcommProfilerEventDescr_v1_t d;
  if (!GCOMM_PROF_ON(comm, gcommProfileKernelCh)) return;
  memset(&d, 0, sizeof(d));
  d.kernelCh.channelId = channel;
  d.kernelCh.startNs = startNs;
  d.kernelCh.stopNs = stopNs;
  void* handle = profStart(comm, &d, gcommProfileKernelCh, parent);
  if (handle != NULL) gcommProfStop(comm, handle);
}

void* gcommProfNetStart(gcommComm_t comm, int peer, int channel, uint64_t step, size_t bytes,
                        int isSend) {
  gcommProfilerEventDescr_v1_t d;
  memset(&d, 0, sizeof(d));
  d.net.peer = peer;
  d.net.channelId = channel;
  d.net.step = step;
  d.net.bytes = bytes;
  d.net.isSend = isSend;
  return profStart(comm, &d, gcommProfileNet, NULL);
}
