/*
 * gcomm_params.c - parameters and logging: the one table of GCOMM_* variables (defaults,
 * ranges, docs; read at communicator init, agreed on by every rank), and the log and error idiom
 * every file uses (GCOMM_WARN/INFO/TRACE, GCOMM_ERROR), with the names logs give to functions,
 * types and operators.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "gcomm_core.h"

enum { PARAM_INT, PARAM_SIZE, PARAM_ENUM, PARAM_STR, PARAM_LOG };

const char* const gcommAlgoNames[] = {"ring", "tree", "direct", "twoshot", "recdbl", NULL};
const char* const gcommProtoNames[] = {"simple", "ll", NULL};
const char* const gcommProxyModeNames[] = {"thread", "poll", NULL};
static const char* const cmaNames[] = {"0", "1", "auto", NULL}; /* GCOMM_CMA_OFF, _ON, _AUTO */
#ifdef GCOMM_GPU
/* GCOMM_SHARED_GPU_AUTO, _KERNELS, _COPY */
static const char* const sharedGpuNames[] = {"auto", "kernels", "copy", NULL};
static const char* const sharedCopyNames[] = {"ce", "sm", NULL};
#endif
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
     "comma list of INIT, COLL, P2P, PROXY, NET, SHM, TUNING, ENV, PROFILE, ALL; ^ excludes",
     LOCAL},
    {"GCOMM_DEBUG_FILE", "", PARAM_LOG, -1, NULL, 0, 0,
     "log to this file instead of stderr; %h is the host name, %p the pid", LOCAL},
    {"GCOMM_ALGO", "", PARAM_ENUM, PARAM_AT(algo), gcommAlgoNames, 0, 0,
     "force the algorithm: ring, tree, direct, twoshot or recdbl (default: the cost model picks)",
     SHARED},
    {"GCOMM_PROTO", "", PARAM_ENUM, PARAM_AT(proto), gcommProtoNames, 0, 0,
     "GPU communicators: force the protocol, simple or ll (default: the cost model picks)", SHARED},
    {"GCOMM_NCHANNELS", "2", PARAM_INT, PARAM_AT(nChannels), NULL, 1, GCOMM_MAX_CHANNELS,
     "parallel channels (each with its own FIFOs); config.nChannels", SHARED},
    {"GCOMM_BUFFSIZE", "1M", PARAM_SIZE, PARAM_AT(buffSize), NULL, 512, (int64_t)1 << 30,
     "bytes of one connection FIFO (8 slots)", SHARED},
    {"GCOMM_PROXY_MODE", "thread", PARAM_ENUM, PARAM_AT(proxyMode), gcommProxyModeNames, 0, 0,
     "thread: a progress thread per communicator; poll: the caller drives progress (unset: poll "
     "for a host communicator whose process may run on one CPU only)",
     LOCAL},
    {"GCOMM_PROGRESS_APPENDOP_FREQ", "8", PARAM_INT, PARAM_AT(appendFreq), NULL, 1, 1 << 20,
     "progress passes between fetches of newly posted operations", LOCAL},
    {"GCOMM_PROXY_APPEND_BATCH_SIZE", "16", PARAM_INT, PARAM_AT(appendBatch), NULL, 1, 1 << 20,
     "most operations fetched at once", LOCAL},
    {"GCOMM_PROXY_DUMP_SIGNAL", "0", PARAM_INT, PARAM_AT(dumpSignal), NULL, 0, 64,
     "on this signal, print every active operation, its state and counters (0: off)", LOCAL},
    {"GCOMM_WAIT_SPIN_US", "20", PARAM_INT, PARAM_AT(waitSpinUs), NULL, 0, 1000000,
     "host communicators: microseconds a wait spins before it yields the CPU, where the node has "
     "a CPU for each of its ranks (more ranks than CPUs: it yields at once)",
     LOCAL},
    {"GCOMM_TIMEOUT_MS", "300000", PARAM_INT, PARAM_AT(timeoutMs), NULL, 1, INT64_MAX / 1000000,
     "deadline of every wait, in milliseconds", LOCAL},
    {"GCOMM_CHECK_MISMATCH", "1", PARAM_INT, PARAM_AT(checkMismatch), NULL, 0, 1,
     "1: ranks whose calls differ (collective, count, datatype, op, root) fail naming the rank",
     SHARED},
    {"GCOMM_CMA", "auto", PARAM_ENUM, PARAM_AT(cma), cmaNames, 0, 0,
     "host communicators: a step of at least GCOMM_CMA_MIN_BYTES moves between ranks of a node "
     "with one copy (process_vm_readv; from a buffer of gcommHostAlloc, read where it lies) "
     "where every local rank may read the others: 1, 0 never, auto where it pays at the speed "
     "such a read runs (timed at init; a copy's from gcommHostAlloc): exchanges (send/recv, "
     "all-to-all(v), all-gatherv) from 35% of a copy's speed, a root's sends to n-1 ranks "
     "(scatter) from 1/(n-1), a ring's or tree's forwarding from a copy's; a gather's senders "
     "only at 1",
     LOCAL},
    {"GCOMM_CMA_MIN_BYTES", "64K", PARAM_SIZE, PARAM_AT(cmaMinBytes), NULL, 0, (int64_t)1 << 30,
     "GCOMM_CMA: the smallest FIFO step (bytes) sent by reference to a rank of the node, a "
     "quarter of it from a buffer of gcommHostAlloc (at least 49: a slot's line carries up to 48 "
     "bytes)",
     LOCAL},
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
    {"GCOMM_SHARED_GPU", "auto", PARAM_ENUM, PARAM_AT(sharedGpu), sharedGpuNames, 0, 0,
     "ranks all on one GPU: kernels, or copy (stream-ordered copies, no spinning kernels); auto: "
     "copy when they share it without MPS",
     SHARED},
    {"GCOMM_SHARED_GPU_CHUNK", "64M", PARAM_SIZE, PARAM_AT(sharedChunk), NULL, 4096,
     (int64_t)1 << 30, "GCOMM_SHARED_GPU=copy: bytes of a collective's staging chunk", SHARED},
    {"GCOMM_SHARED_GPU_COPY", "ce", PARAM_ENUM, PARAM_AT(sharedCopyBy), sharedCopyNames, 0, 0,
     "GCOMM_SHARED_GPU=copy: staging copies by copy engines (ce) or by a copy kernel (sm)", LOCAL},
    {"GCOMM_SHARED_GPU_DIRECT", "1", PARAM_INT, PARAM_AT(sharedDirect), NULL, 0, 1,
     "GCOMM_SHARED_GPU=copy: 1 the lowest rank runs a whole collective over the others' buffers "
     "(CUDA IPC); 0 always the staging",
     SHARED},
    {"GCOMM_GRAPH_REGISTER", "1", PARAM_INT, PARAM_AT(graphRegister), NULL, 0, 2,
     "a collective captured into a CUDA graph runs straight between the ranks' buffers, mapped at "
     "capture (CUDA, one node): 1 at the sizes where that is faster, 2 at every size, 0 never",
     SHARED},
    {"GCOMM_PDL", "1", PARAM_INT, PARAM_AT(pdl), NULL, 0, 1,
     "0: a GPU launch never starts before the previous one on its stream has finished", LOCAL},
#endif
    /* the proxy's GPU knobs: in every build, so that host tests see their parsing and agreement;
     * a host communicator ignores them */
    {"GCOMM_SHM_USE_CUDA_MEMCPY", "0", PARAM_INT, PARAM_AT(shmMemcpy), NULL, 0, 1,
     "1: GPU FIFOs staged in host memory are filled and drained by copy engines, not kernels",
     SHARED},
    {"GCOMM_SHM_MEMCPY_MODE", "3", PARAM_INT, PARAM_AT(shmMemcpyMode), NULL, 1, 3,
     "with GCOMM_SHM_USE_CUDA_MEMCPY=1, whose copies: 1 the sender's, 2 the receiver's, 3 both",
     SHARED},
    {"GCOMM_SHM_LOCALITY", "2", PARAM_INT, PARAM_AT(shmLocality), NULL, 1, 2,
     "staged GPU FIFOs: 1 in the sender's shm segment (its NUMA node), 2 in the receiver's",
     SHARED},
    {"GCOMM_CREATE_THREAD_CONTEXT", "0", PARAM_INT, PARAM_AT(threadContext), NULL, 0, 1,
     "1: the proxy's CUDA work runs in a context of its own, not the GPU's primary context", LOCAL},
    {"GCOMM_GDRCOPY_SYNC_ENABLE", "0", PARAM_INT, PARAM_AT(gdrSync), NULL, 0, 1,
     "with gdrcopy: the proxy reads the copy engines' staging words in GPU memory by a CPU mapping",
     LOCAL},
    {"GCOMM_GDRCOPY_FLUSH_ENABLE", "0", PARAM_INT, PARAM_AT(gdrFlush), NULL, 0, 1,
     "with gdrcopy: a PCIe read of GPU memory flushes network writes into it (GCOMM_NET_GDR)",
     LOCAL},
    {"GCOMM_GDRCOPY_LIBRARY", "libgdrapi.so.2", PARAM_STR, PARAM_AT(gdrLib), NULL, 0, 0,
     "the gdrcopy library dlopen loads for the GCOMM_GDRCOPY_* knobs (a name or a path)", LOCAL},
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
void gcommParamsLoad(gcommParams_t* p, gcommComm_t comm, const gcommConfig_t* config) {
  p->nChannelsChosen = p->buffSizeChosen = p->proxyModeChosen = 0;
  for (int i = 0; i < NPARAMS; i++)
    if (paramTable[i].kind != PARAM_LOG) paramSet(p, &paramTable[i], paramTable[i].defaultValue);
  if (config != NULL) {
    if (config->proxyMode != GCOMM_CONFIG_UNDEF_INT) p->proxyMode = config->proxyMode;
    if (config->nChannels != GCOMM_CONFIG_UNDEF_INT) p->nChannels = config->nChannels;
    p->nChannelsChosen = config->nChannels != GCOMM_CONFIG_UNDEF_INT;
    p->proxyModeChosen = config->proxyMode != GCOMM_CONFIG_UNDEF_INT;
  }
  for (int i = 0; i < NPARAMS; i++) {
    const char* env = getenv(paramTable[i].name);
    if (env == NULL || paramTable[i].kind == PARAM_LOG) continue;
    if (paramTable[i].offset == PARAM_AT(nChannels)) p->nChannelsChosen = 1; /* even refused */
    if (paramTable[i].offset == PARAM_AT(buffSize)) p->buffSizeChosen = 1;
    if (paramTable[i].offset == PARAM_AT(proxyMode)) p->proxyModeChosen = 1;
    if (paramSet(p, &paramTable[i], env) != 0)
      GCOMM_WARN(comm, "%s=\"%s\" is not valid (%s); using %s", paramTable[i].name, env,
                 paramTable[i].doc, paramTable[i].defaultValue);
  }
}

void gcommParamsRead(gcommParams_t* params) {
  gcommParamsLoad(params, NULL, NULL);
}

void gcommParamsPrint(gcommComm_t comm) {
  if (!gcommLogEnabled(GCOMM_LOG_INFO, GCOMM_SUBSYS_ENV) || comm->rank != 0) return;
  for (int i = 0; i < NPARAMS; i++) {
    const char* env = getenv(paramTable[i].name);
    GCOMM_INFO(GCOMM_SUBSYS_ENV, comm, "%-30s = %-10s (default %s%s) %s", paramTable[i].name,
               env ? env : paramTable[i].defaultValue,
               paramTable[i].defaultValue[0] ? paramTable[i].defaultValue : "unset",
               env ? ", from the environment" : "", paramTable[i].doc);
  }
}

static pthread_once_t logOnce = PTHREAD_ONCE_INIT;
static int logLevel = GCOMM_LOG_WARN;
static int logSubsys = GCOMM_SUBSYS_ALL;
static FILE* logFile;
static pthread_mutex_t logLock = PTHREAD_MUTEX_INITIALIZER;
int gcommTraceSubsys = GCOMM_SUBSYS_ALL;
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
  __atomic_store_n(&gcommTraceSubsys, logLevel >= GCOMM_LOG_TRACE ? logSubsys : 0,
                   __ATOMIC_RELAXED);
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

void gcommLogWrite(int level, gcommComm_t comm, const char* where, const char* msg) {
  pthread_once(&logOnce, logInit);
  logWrite(level, comm, where, msg);
}

const char* gcommThreadLastError(void) {
  return threadLastError;
}

void gcommKeepThreadError(const char* msg) {
  snprintf(threadLastError, sizeof(threadLastError), "%s", msg);
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
    case gcommRevoked:
      return "communicator revoked";
    default:
      return "unknown result code";
  }
}

const char* const gcommFuncNames[gcommNumFuncs] = {
    "AllReduce",  "Broadcast", "Reduce",  "AllGather", "ReduceScatter",
    "AllToAll",   "Gather",    "Scatter", "Send",      "Recv",
    "AllGatherV", "AllToAllV", "GatherV", "ScatterV",  "Copy"};
const char* gcommFuncName(int func) {
  return (unsigned)func < gcommNumFuncs ? gcommFuncNames[func] : "?";
}
const char* const gcommTypeNames[gcommNumTypes] = {
    "int8",    "uint8",   "int32",   "uint32",   "int64",      "uint64",
    "float16", "float32", "float64", "bfloat16", "float8e4m3", "float8e5m2"};
/* an operation's redop: gcomm.h's operators, then PreMulSum (GCOMM_OP_PREMULSUM) */
const char* const gcommOpNames[GCOMM_OP_PREMULSUM + 1] = {"sum", "prod", "max",
                                                          "min", "avg",  "premulsum"};

uint64_t gcommHashString(const char* s) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

static int64_t paramValue(const gcommParams_t* p, const gcommParamDef_t* d) {
  const char* field = (const char*)p + d->offset;
  if (d->kind == PARAM_STR)
    return *(const char* const*)field ? (int64_t)(gcommHashString(*(const char* const*)field) | 1)
                                      : 0;
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
gcommResult_t gcommParamsAgree(gcommComm_t comm) {
  int64_t mine[NPARAMS];
  int idx[NPARAMS], k = 0, n = comm->nranks;
  for (int i = 0; i < NPARAMS; i++)
    if (paramTable[i].shared) idx[k] = i, mine[k] = paramValue(&comm->params, &paramTable[i]), k++;
  int64_t* all = malloc((size_t)n * k * sizeof(int64_t));
  if (all == NULL) return GCOMM_ERROR(comm, gcommSystemError, -1, "out of memory");
  gcommResult_t res = comm->allgather(comm, mine, (size_t)k * sizeof(int64_t), all);
  for (int r = 1; r < n && res == gcommSuccess; r++)
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
  return res;
}
