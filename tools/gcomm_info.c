/*
 * tools/gcomm_info.c - gcomm_info: whether this machine is set up for gcomm, and why not.
 *
 * Run alone (an MPI singleton) or under mpiexec; rank 0 prints:
 *   build        gcomm's version, the engines compiled in, the MPI library
 *   node         CPUs, NUMA nodes, /dev/shm (size, free, what gcomm needs for the ranks here), and
 *                each GPU (name, memory, PCI id, NUMA node, compute mode, MPS) with, for every
 *                pair, peer access, the link (NVLink count from NVML, else PCIe) and the transport
 *                gcomm takes and why
 *   network      (OFI=1) the libfabric providers found, the one gcomm takes and why, its domains
 *   environment  every GCOMM_* variable set, as gcomm parses it, and those it does not know
 *   job          ranks per node, the GPU each rank was given, GPUs shared
 *   self-test    (2+ ranks) a small and a large all-reduce on a host communicator and, with GPUs,
 *                on a GPU communicator: results checked against a serial sum, time and busbw
 *                beside what the link should give
 *   findings     each one that needs action as a "WARN what: fix" line
 * --json prints the same as one JSON object. The exit status is 1 when a communicator cannot be
 * created or the self-test fails; every wait of the self-test ends within a minute
 * (GCOMM_TIMEOUT_MS=60000, unless set).
 *
 * The decisions shown are the library's own, through internal functions (gcommParamParse,
 * gcommShmSegmentBytes, gcommDevicePath, gcommNetCandidates), so this tool cannot drift from them.
 * Each rank in a job is given GPU (local rank mod GPU count), the usual choice of applications.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <dirent.h>
#include <dlfcn.h>
#include <math.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "gcomm_internal.h"
#ifdef GCOMM_CUDA
#include <cuda_runtime.h>

#include "gcomm_device.h"
#endif
#ifdef GCOMM_OFI
#include <rdma/fabric.h>
#endif

extern char** environ;

/* ======================================================================================== */
/* Output: one set of calls writes text or JSON                                            */
/* ======================================================================================== */

#define MAX_DEPTH 16
static struct {
  int json;
  int depth;
  int members[MAX_DEPTH]; /* JSON: members written so far at each depth */
  int inRow, rowFields;   /* text: a row's fields go on one line */
  int rows[MAX_DEPTH];    /* text: rows written so far in the list at each depth */
} out;

static void indent(int depth) {
  printf("%*s", 2 * depth, "");
}

static void jsonString(const char* s) {
  putchar('"');
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\')
      printf("\\%c", c);
    else if (c < 0x20)
      printf("\\u%04x", c);
    else
      putchar(c);
  }
  putchar('"');
}

/* JSON: the comma and key before a member (key NULL in an array). */
static void jsonMember(const char* key) {
  if (out.members[out.depth]++) putchar(',');
  putchar('\n');
  indent(out.depth);
  if (key != NULL) {
    jsonString(key);
    fputs(": ", stdout);
  }
}

static void jsonOpen(const char* key, char bracket) {
  jsonMember(key);
  putchar(bracket);
  out.members[++out.depth] = 0;
}

static void jsonClose(char bracket) {
  if (out.members[out.depth--]) {
    putchar('\n');
    indent(out.depth);
  }
  putchar(bracket);
}

/* A section (an object): in text a heading at the top level, "title:" below it. */
static void beginSection(const char* key, const char* title) {
  if (out.json)
    jsonOpen(key, '{');
  else if (out.depth == 0)
    printf("\n== %s\n", title), out.depth++;
  else
    indent(out.depth), printf("%s:\n", title), out.depth++;
}
static void endSection(void) {
  if (out.json)
    jsonClose('}');
  else
    out.depth--;
}

/* A list of rows; in text "title:", the rows below it, or "none". */
static void beginList(const char* key, const char* title) {
  if (out.json) {
    jsonOpen(key, '[');
    return;
  }
  indent(out.depth);
  printf("%s:\n", title);
  out.rows[++out.depth] = 0;
}
static void endList(void) {
  if (out.json) {
    jsonClose(']');
    return;
  }
  if (out.rows[out.depth] == 0) indent(out.depth), printf("none\n");
  out.depth--;
}

/* An object of a list: in text one line, "label: field, field, ...". */
static void beginRow(const char* label) {
  if (out.json) {
    jsonOpen(NULL, '{');
    return;
  }
  indent(out.depth);
  printf("%s: ", label);
  out.rows[out.depth]++;
  out.inRow = 1;
  out.rowFields = 0;
}
static void endRow(void) {
  if (out.json)
    jsonClose('}');
  else
    putchar('\n'), out.inRow = 0;
}

/* A field: key in JSON, "label value" in text (value alone when label is empty, nothing when
 * label is NULL: a JSON-only field). */
static void textField(const char* label, const char* value) {
  if (out.inRow) {
    printf("%s%s%s%s", out.rowFields++ ? ", " : "", label, label[0] ? " " : "", value);
  } else {
    indent(out.depth);
    printf("%s: %s\n", label, value);
  }
}

static void field(const char* key, const char* label, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void field(const char* key, const char* label, const char* fmt, ...) {
  char value[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(value, sizeof(value), fmt, ap);
  va_end(ap);
  if (out.json)
    jsonMember(key), jsonString(value);
  else if (label != NULL)
    textField(label, value);
}

/* A number: plain in JSON (null when not finite), with its unit in text. */
static void number(const char* key, const char* label, double v, int decimals, const char* unit) {
  if (out.json) {
    jsonMember(key);
    if (isfinite(v))
      printf("%.*f", decimals, v);
    else
      fputs("null", stdout);
    return;
  }
  char value[64];
  snprintf(value, sizeof(value), "%.*f%s%s", decimals, v, unit[0] ? " " : "", unit);
  if (label != NULL) textField(label, value);
}

/* A byte count: plain in JSON, "12.0 MB" in text. */
static const char* bytesText(double b, char* buf, size_t len);
static void byteCount(const char* key, const char* label, double v) {
  char text[32];
  if (out.json)
    number(key, label, v, 0, "");
  else if (label != NULL)
    textField(label, bytesText(v, text, sizeof(text)));
}

static void boolean(const char* key, const char* label, int v) {
  if (out.json)
    jsonMember(key), fputs(v ? "true" : "false", stdout);
  else
    textField(label, v ? "yes" : "no");
}

/* Findings that need action, printed last: "WARN what: fix". */
#define MAX_WARNINGS 64
static char warnings[MAX_WARNINGS][640];
static int nWarnings;

static void warn(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
static void warn(const char* fmt, ...) {
  if (nWarnings == MAX_WARNINGS) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(warnings[nWarnings++], sizeof(warnings[0]), fmt, ap);
  va_end(ap);
}

/* "12.0 MB" */
static const char* bytesText(double b, char* buf, size_t len) {
  static const char* const units[] = {"B", "KB", "MB", "GB", "TB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, u++;
  snprintf(buf, len, u ? "%.1f %s" : "%.0f %s", b, units[u]);
  return buf;
}

/* ======================================================================================== */
/* What every rank finds, gathered on rank 0                                               */
/* ======================================================================================== */

typedef struct {
  char host[64];
  int device;   /* the GPU this rank was given, -1: none */
  char pci[32]; /* its PCI id */
  int mps;      /* 1: MPS serves this rank's GPU, 0: it does not, -1: unknown */
  unsigned long long shmSize, shmFree;
} rankFacts_t;

typedef struct {
  const char* what; /* "host" or "GPU" */
  size_t bytes;
  int ok;    /* every rank got the right sum */
  double us; /* the slowest rank's average time */
  char error[512];
} testResult_t;

#define MAX_TESTS 4
typedef struct {
  int rank, nranks, localIndex;
  rankFacts_t* all; /* rank 0: every rank's */
  gcommComm_t hostComm, gpuComm;
  char hostCommError[512], gpuCommError[512];
  int gpuCommTried;
  double memcpyGBs; /* the slowest rank's memcpy rate */
  testResult_t tests[MAX_TESTS];
  int nTests;
  char** gcommEnv; /* the GCOMM_* entries as the tool found them, before its own */
} job_t;

/* "0,1,5" for the ranks whose facts match rank r's by same() */
static int ranksLike(const job_t* job, int r, int (*same)(const rankFacts_t*, const rankFacts_t*),
                     char* list, size_t len) {
  int n = 0, used = 0;
  list[0] = 0;
  for (int q = 0; q < job->nranks; q++) {
    if (!same(&job->all[q], &job->all[r])) continue;
    if (used < (int)len - 16) used += snprintf(list + used, len - used, "%s%d", n ? "," : "", q);
    n++;
  }
  return n;
}
static int sameHost(const rankFacts_t* a, const rankFacts_t* b) {
  return strcmp(a->host, b->host) == 0;
}
static int sameGpu(const rankFacts_t* a, const rankFacts_t* b) {
  return sameHost(a, b) && a->device >= 0 && b->device >= 0 && strcmp(a->pci, b->pci) == 0;
}
/* Whether rank r is the first of the ranks like it. */
static int firstLike(const job_t* job, int r, int (*same)(const rankFacts_t*, const rankFacts_t*)) {
  for (int q = 0; q < r; q++)
    if (same(&job->all[q], &job->all[r])) return 0;
  return 1;
}

static void shmFacts(rankFacts_t* f) {
  struct statvfs s;
  if (statvfs("/dev/shm", &s) == 0) {
    f->shmSize = (unsigned long long)s.f_blocks * s.f_frsize;
    f->shmFree = (unsigned long long)s.f_bavail * s.f_frsize;
  }
}

/* ======================================================================================== */
/* GPUs: CUDA for the devices, NVML (loaded if present) for the links                       */
/* ======================================================================================== */

#ifdef GCOMM_CUDA
/* The few NVML entry points used, declared here so that no NVML header or library is needed to
 * build: libnvidia-ml.so.1 comes with the driver and is opened at run time. */
typedef struct nvmlDevice_st* nvmlDevice_t;
typedef struct {
  char busIdLegacy[16];
  unsigned domain, bus, device, pciDeviceId, pciSubSystemId;
  char busId[32];
} nvmlPciInfo_t;
typedef struct {
  unsigned fieldId, scopeId;
  long long timestamp, latencyUsec;
  int valueType, nvmlReturn;
  union {
    double d;
    unsigned u;
    unsigned long long ull;
  } value;
} nvmlFieldValue_t;
#define NVML_MAX_LINKS 18
#define NVML_FIELD_NVLINK_SPEED_MBPS 90 /* NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON */
#define NVML_NVLINK_SWITCH 2            /* NVML_NVLINK_DEVICE_TYPE_SWITCH */

static struct {
  void* lib;
  int (*init)(void);
  int (*shutdown)(void);
  int (*byPci)(const char*, nvmlDevice_t*);
  int (*linkState)(nvmlDevice_t, unsigned, int*);
  int (*remotePci)(nvmlDevice_t, unsigned, nvmlPciInfo_t*);
  int (*remoteType)(nvmlDevice_t, unsigned, int*);
  int (*fields)(nvmlDevice_t, int, nvmlFieldValue_t*);
  int (*linkVersion)(nvmlDevice_t, unsigned, unsigned*);
  int (*pcieGen)(nvmlDevice_t, unsigned*);
  int (*pcieWidth)(nvmlDevice_t, unsigned*);
} nvml;

static void nvmlLoad(void) {
  nvml.lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (nvml.lib == NULL) return;
  *(void**)&nvml.init = dlsym(nvml.lib, "nvmlInit_v2");
  *(void**)&nvml.shutdown = dlsym(nvml.lib, "nvmlShutdown");
  *(void**)&nvml.byPci = dlsym(nvml.lib, "nvmlDeviceGetHandleByPciBusId_v2");
  *(void**)&nvml.linkState = dlsym(nvml.lib, "nvmlDeviceGetNvLinkState");
  *(void**)&nvml.remotePci = dlsym(nvml.lib, "nvmlDeviceGetNvLinkRemotePciInfo_v2");
  *(void**)&nvml.remoteType = dlsym(nvml.lib, "nvmlDeviceGetNvLinkRemoteDeviceType");
  *(void**)&nvml.fields = dlsym(nvml.lib, "nvmlDeviceGetFieldValues");
  *(void**)&nvml.linkVersion = dlsym(nvml.lib, "nvmlDeviceGetNvLinkVersion");
  *(void**)&nvml.pcieGen = dlsym(nvml.lib, "nvmlDeviceGetCurrPcieLinkGeneration");
  *(void**)&nvml.pcieWidth = dlsym(nvml.lib, "nvmlDeviceGetCurrPcieLinkWidth");
  if (nvml.init == NULL || nvml.shutdown == NULL || nvml.byPci == NULL || nvml.init() != 0) {
    dlclose(nvml.lib);
    nvml.lib = NULL;
  }
}

static void nvmlUnload(void) {
  if (nvml.lib == NULL) return;
  nvml.shutdown();
  dlclose(nvml.lib);
  nvml.lib = NULL;
}

static nvmlDevice_t nvmlDevice(const char* pci) {
  nvmlDevice_t d = NULL;
  return nvml.lib != NULL && nvml.byPci(pci, &d) == 0 ? d : NULL;
}

/* One NVLink's rate each way in GB/s: NVML's speed field where the driver fills it, else the
 * rate of the link's generation, which NVML names by an enumerator (nvmlNvlinkVersion_t: 1 is
 * NVLink 1.0, 20 GB/s; 2-6 are 2.0, 2.2, 3.0, 3.1 and 4.0, 25 GB/s; 7 is 5.0, 50 GB/s), or NAN. */
static double nvlinkRate(nvmlDevice_t d) {
  nvmlFieldValue_t speed;
  memset(&speed, 0, sizeof(speed));
  speed.fieldId = NVML_FIELD_NVLINK_SPEED_MBPS;
  if (nvml.fields != NULL && nvml.fields(d, 1, &speed) == 0 && speed.nvmlReturn == 0 &&
      speed.value.u > 0)
    return speed.value.u / 1000.0;
  unsigned version = 0;
  for (unsigned l = 0; l < NVML_MAX_LINKS && version == 0; l++)
    if (nvml.linkVersion == NULL || nvml.linkVersion(d, l, &version) != 0) version = 0;
  static const double rateOfVersion[] = {NAN, 20, 25, 25, 25, 25, 25, 50};
  return version > 0 && version < sizeof(rateOfVersion) / sizeof(rateOfVersion[0])
             ? rateOfVersion[version]
             : NAN;
}

/* Active NVLinks from the GPU at PCI id a to the one at b (through an NVSwitch: all of a's), or
 * -1 when NVML cannot tell. *perLinkGBs: one link's rate each way. */
static int nvlinkCount(const char* a, const char* b, double* perLinkGBs) {
  nvmlDevice_t d = nvmlDevice(a);
  unsigned dom = 0, bus = 0, dev = 0;
  if (d == NULL || nvml.linkState == NULL || nvml.remotePci == NULL ||
      sscanf(b, "%x:%x:%x", &dom, &bus, &dev) != 3)
    return -1;
  int links = 0;
  for (unsigned l = 0; l < NVML_MAX_LINKS; l++) {
    int active = 0, type = -1;
    nvmlPciInfo_t remote;
    if (nvml.linkState(d, l, &active) != 0 || !active) continue;
    if (nvml.remoteType != NULL && nvml.remoteType(d, l, &type) == 0 && type == NVML_NVLINK_SWITCH)
      links++;
    else if (nvml.remotePci(d, l, &remote) == 0 && remote.domain == dom && remote.bus == bus &&
             remote.device == dev)
      links++;
  }
  *perLinkGBs = nvlinkRate(d);
  return links;
}

/* The GPU's PCIe link rate each way in GB/s (generation x width), or NAN. */
static double pcieGBs(const char* pci) {
  static const double laneGBs[] = {0, 0.25, 0.5, 0.985, 1.969, 3.938, 7.563};
  nvmlDevice_t d = nvmlDevice(pci);
  unsigned gen = 0, width = 0;
  if (d == NULL || nvml.pcieGen == NULL || nvml.pcieWidth == NULL || nvml.pcieGen(d, &gen) != 0 ||
      nvml.pcieWidth(d, &width) != 0 || gen == 0 || gen > 6)
    return NAN;
  return laneGBs[gen] * width;
}

static int cudaCheck(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return 1;
  warn("CUDA: %s failed: %s: check the driver (nvidia-smi) and CUDA_VISIBLE_DEVICES", what,
       cudaGetErrorString(e));
  cudaGetLastError();
  return 0;
}

static int gpuCount(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError(); /* no driver or no GPU: a host-only machine */
    return 0;
  }
  return n;
}

/* Whether MPS serves contexts on dev: the device attribute (CUDA 13), else whether an MPS control
 * daemon runs on this machine. */
static int mpsState(int dev) {
#if CUDART_VERSION >= 13000
  int v = 0;
  if (cudaDeviceGetAttribute(&v, cudaDevAttrMpsEnabled, dev) == cudaSuccess) return v != 0;
  cudaGetLastError();
#else
  (void)dev;
#endif
  DIR* proc = opendir("/proc");
  if (proc == NULL) return -1;
  int found = 0;
  for (struct dirent* e; !found && (e = readdir(proc)) != NULL;) {
    char path[300], comm[64] = "";
    snprintf(path, sizeof(path), "/proc/%s/comm", e->d_name);
    FILE* f = fopen(path, "r");
    if (f == NULL) continue;
    found = fgets(comm, sizeof(comm), f) != NULL && strncmp(comm, "nvidia-cuda-mps", 15) == 0;
    fclose(f);
  }
  closedir(proc);
  return found;
}

static int pciId(int dev, char* pci, size_t len) {
  return cudaCheck(cudaDeviceGetPCIBusId(pci, (int)len, dev), "cudaDeviceGetPCIBusId");
}

/* The NUMA node of the PCI device (sysfs), or -1. */
static int pciNumaNode(const char* pci) {
  char path[128], lower[32];
  size_t i = 0;
  for (; pci[i] && i < sizeof(lower) - 1; i++) lower[i] = (char)tolower((unsigned char)pci[i]);
  lower[i] = 0;
  snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/numa_node", lower);
  FILE* f = fopen(path, "r");
  int node = -1;
  if (f != NULL) {
    if (fscanf(f, "%d", &node) != 1) node = -1;
    fclose(f);
  }
  return node;
}
#endif

/* ======================================================================================== */
/* Build                                                                                    */
/* ======================================================================================== */

static void printBuild(void) {
  int version = 0;
  gcommGetVersion(&version);
  beginSection("build", "build");
  field("version", "gcomm", "%d.%d.%d", version / 10000, version / 100 % 100, version % 100);
#ifdef GCOMM_CUDA
  int rt = 0, drv = 0;
  cudaCheck(cudaRuntimeGetVersion(&rt), "cudaRuntimeGetVersion");
  cudaCheck(cudaDriverGetVersion(&drv), "cudaDriverGetVersion");
  if (drv == 0)
    field("cuda", "CUDA", "yes (runtime %d.%d), no NVIDIA driver found", rt / 1000, rt % 1000 / 10);
  else
    field("cuda", "CUDA", "yes (runtime %d.%d, driver supports %d.%d)", rt / 1000, rt % 1000 / 10,
          drv / 1000, drv % 1000 / 10);
#else
  field("cuda", "CUDA", "no (make CUDA=1)");
#endif
#ifdef GCOMM_HIP
  field("hip", "HIP", "yes");
#else
  field("hip", "HIP", "no (make HIP=1)");
#endif
#ifdef GCOMM_OFI
  uint32_t fv = fi_version();
  field("libfabric", "libfabric", "yes (built with %d.%d, running %u.%u)", FI_MAJOR_VERSION,
        FI_MINOR_VERSION, FI_MAJOR(fv), FI_MINOR(fv));
#else
  field("libfabric", "libfabric", "no (make OFI=1): ranks on other nodes are refused");
#endif
  char lib[MPI_MAX_LIBRARY_VERSION_STRING] = "";
  int len = 0, major = 0, minor = 0;
  MPI_Get_library_version(lib, &len);
  MPI_Get_version(&major, &minor);
  lib[strcspn(lib, "\n")] = 0; /* the first line names it */
  for (char* c = lib; *c; c++)
    if (*c == '\t') *c = ' ';
  field("mpi", "MPI", "%s (MPI %d.%d)", lib, major, minor);
  endSection();
}

/* ======================================================================================== */
/* Node                                                                                     */
/* ======================================================================================== */

static int numaNodes(void) {
  DIR* d = opendir("/sys/devices/system/node");
  int n = 0;
  if (d == NULL) return 0;
  for (struct dirent* e; (e = readdir(d)) != NULL;)
    n += strncmp(e->d_name, "node", 4) == 0 && e->d_name[4] >= '0' && e->d_name[4] <= '9';
  closedir(d);
  return n;
}

/* /dev/shm on nodes that rank 0's communicators describe: every FIFO of the host communicator
 * (its pages count once used: this is the most), and the staged region of the GPU one (taken at
 * init). nLocal: ranks on the node. */
static double shmNeed(const job_t* job, int nLocal) {
  double need = 0;
  gcommComm_t h = job->hostComm;
  if (h != NULL) need += (double)nLocal * gcommShmSegmentBytes(h->slotBytes, h->nLanes, nLocal, 0);
#ifdef GCOMM_CUDA
  if (job->gpuComm != NULL) need += (double)nLocal * gcommDeviceShmBytes(job->gpuComm);
#endif
  return need;
}

static void printShm(const job_t* job) {
  const rankFacts_t* f = &job->all[0];
  char a[32], b[32], list[256];
  int nLocal = ranksLike(job, 0, sameHost, list, sizeof(list));
  beginSection("shm", "/dev/shm");
  byteCount("size_bytes", "size", (double)f->shmSize);
  byteCount("free_bytes", "free", (double)f->shmFree);
  if (job->hostComm == NULL) {
    field("need", "gcomm needs", "unknown: no communicator (see the findings)");
    endSection();
    return;
  }
  double need = shmNeed(job, nLocal);
  number("local_ranks", "ranks on this node", nLocal, 0, "");
  byteCount("need_bytes", "gcomm needs at most", need);
  if (job->nranks == 1) {
    int cpus = (int)sysconf(_SC_NPROCESSORS_ONLN);
    byteCount("need_one_rank_per_cpu_bytes", "with one rank per CPU", shmNeed(job, cpus));
  }
  endSection();
  if (need > (double)f->shmFree)
    warn(
        "/dev/shm on %s has %s free and gcomm may need %s for %d ranks: enlarge it (mount -o "
        "remount,size=... /dev/shm; docker run --shm-size=...), or lower GCOMM_BUFFSIZE or "
        "GCOMM_NCHANNELS",
        f->host, bytesText((double)f->shmFree, a, sizeof(a)), bytesText(need, b, sizeof(b)),
        nLocal);
}

/* /dev/shm of the other nodes: a finding only. */
static void checkOtherNodesShm(const job_t* job) {
  char a[32], b[32], list[256];
  for (int r = 1; r < job->nranks; r++) {
    const rankFacts_t* f = &job->all[r];
    if (!firstLike(job, r, sameHost) || sameHost(f, &job->all[0])) continue;
    int nLocal = ranksLike(job, r, sameHost, list, sizeof(list));
    double need = shmNeed(job, nLocal);
    if (need > (double)f->shmFree)
      warn("/dev/shm on %s has %s free and gcomm may need %s for %d ranks: enlarge it", f->host,
           bytesText((double)f->shmFree, a, sizeof(a)), bytesText(need, b, sizeof(b)), nLocal);
  }
}

#ifdef GCOMM_CUDA
static void printGpu(int dev) {
  static const char* const modes[] = {"default", "exclusive thread", "prohibited",
                                      "exclusive process"};
  struct cudaDeviceProp p;
  char pci[32] = "", row[16];
  int mode = 0;
  snprintf(row, sizeof(row), "GPU %d", dev);
  if (!cudaCheck(cudaGetDeviceProperties(&p, dev), "cudaGetDeviceProperties") ||
      !pciId(dev, pci, sizeof(pci)) ||
      !cudaCheck(cudaDeviceGetAttribute(&mode, cudaDevAttrComputeMode, dev), "compute mode"))
    return;
  beginRow(row);
  number("index", NULL, dev, 0, "");
  field("name", "", "%s", p.name);
  number("memory_gib", "", p.totalGlobalMem / (double)(1 << 30), 1, "GiB");
  field("pci", "PCI", "%s", pci);
  number("numa_node", "NUMA node", pciNumaNode(pci), 0, "");
  field("compute_capability", "sm", "%d%d", p.major, p.minor);
  number("sms", "SMs", p.multiProcessorCount, 0, "");
  field("compute_mode", "compute mode", "%s", mode >= 0 && mode < 4 ? modes[mode] : "unknown");
  int mps = mpsState(dev);
  field("mps", "MPS", "%s", mps < 0 ? "unknown" : mps ? "on" : "off");
  endRow();
  if (mode == 2)
    warn(
        "GPU %d (%s) is in compute mode prohibited: no process can use it; nvidia-smi -i %d -c "
        "DEFAULT",
        dev, pci, dev);
}

static void printGpuPair(const job_t* job, int a, int b) {
  char pa[32], pb[32], row[32];
  int ab = 0, ba = 0;
  if (!pciId(a, pa, sizeof(pa)) || !pciId(b, pb, sizeof(pb)) ||
      !cudaCheck(cudaDeviceCanAccessPeer(&ab, a, b), "cudaDeviceCanAccessPeer") ||
      !cudaCheck(cudaDeviceCanAccessPeer(&ba, b, a), "cudaDeviceCanAccessPeer"))
    return;
  double perLink = NAN;
  int links = nvlinkCount(pa, pb, &perLink);
  snprintf(row, sizeof(row), "GPU %d - GPU %d", a, b);
  beginRow(row);
  number("a", NULL, a, 0, "");
  number("b", NULL, b, 0, "");
  boolean("peer_access", "peer access", ab && ba);
  if (links > 0 && isfinite(perLink))
    field("link", "link", "NVLink x%d (%.2f GB/s each way a link)", links, perLink);
  else if (links > 0)
    field("link", "link", "NVLink x%d", links);
  else
    field("link", "link", "%s", links == 0 ? "PCIe" : "unknown (no NVML)");
  number("nvlinks", NULL, links, 0, "");
  if (job->hostComm != NULL) {
    const char* why = "";
    int path = gcommDevicePath(&job->hostComm->params, a, b, &why);
    field("transport", "transport", "%s", path < 0 ? "unknown" : gcommDevicePathName(path));
    field("why", "because", "%s", why);
  }
  endRow();
  if (!(ab && ba))
    warn(
        "GPUs %d and %d cannot access each other as peers: a communicator on both stages every "
        "FIFO through host memory (slower); check the topology (nvidia-smi topo -m) and IOMMU/ACS "
        "settings",
        a, b);
}

static void printGpus(const job_t* job) {
  int n = gpuCount();
  beginList("gpus", "GPUs");
  for (int d = 0; d < n; d++) printGpu(d);
  endList();
  beginList("gpu_pairs", "GPU pairs");
  for (int a = 0; a < n; a++)
    for (int b = a + 1; b < n; b++) printGpuPair(job, a, b);
  endList();
}
#endif

/* One copy between the ranks of rank 0's node (GCOMM_CMA), as the host communicator decided. */
static void printOneCopy(const job_t* job) {
  const char* label = "one copy between local ranks";
  gcommComm_t h = job->hostComm;
  if (h == NULL || h->nLocal < 2)
    field("one_copy", label, "not known: %s",
          h == NULL ? "no communicator (see the findings)" : "one rank on this node");
  else if (!h->cma)
    field("one_copy", label,
          "off: GCOMM_CMA=0, or a rank may not read another's memory (ptrace_scope, seccomp; "
          "GCOMM_DEBUG=INFO names the rank); every step goes through the FIFO slots");
  else if (h->cmaSpeed >= GCOMM_CMA_ALWAYS)
    field("one_copy", label, "on everywhere (GCOMM_CMA=1)");
  else
    field("one_copy", label,
          "on: reads of another rank's memory at %d%% of a copy's speed; buffers of "
          "gcommHostAlloc read where they lie",
          h->cmaSpeed / 10);
}

static void printNode(const job_t* job) {
  cpu_set_t set;
  int usable = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : -1;
  beginSection("node", "node");
  field("host", "host", "%s", job->all[0].host);
  number("cpus", "CPUs", (double)sysconf(_SC_NPROCESSORS_ONLN), 0, "");
  number("cpus_usable", "CPUs this rank may run on", usable, 0, "");
  number("numa_nodes", "NUMA nodes", numaNodes(), 0, "");
  printShm(job);
  printOneCopy(job);
#ifdef GCOMM_CUDA
  printGpus(job);
#else
  field("gpus", "GPUs", "not looked for (a build without CUDA=1)");
#endif
  endSection();
  checkOtherNodesShm(job);
}

/* ======================================================================================== */
/* Network                                                                                  */
/* ======================================================================================== */

static int spansNodes(const job_t* job) {
  for (int r = 1; r < job->nranks; r++)
    if (strcmp(job->all[r].host, job->all[0].host) != 0) return 1;
  return 0;
}

#ifdef GCOMM_OFI
#define MAX_CANDIDATES 128
/* Whether two candidates have the same provider and rank (level 0), and domain (1), and fabric
 * (2). */
static int alike(const gcommNetCandidate_t* a, const gcommNetCandidate_t* b, int level) {
  return strcmp(a->prov, b->prov) == 0 && a->rank == b->rank &&
         (level < 1 || strcmp(a->domain, b->domain) == 0) &&
         (level < 2 || strcmp(a->fabric, b->fabric) == 0);
}
static int seenBefore(const gcommNetCandidate_t* c, int i, int level) {
  for (int j = 0; j < i; j++)
    if (alike(&c[j], &c[i], level)) return 1;
  return 0;
}

/* "eth0 (192.0.2.0/24 fe80::/64), lo (127.0.0.1/32)": the domains (interfaces) of the entries
 * alike c[k], each with its fabrics (addresses). */
static void domainsOf(const gcommNetCandidate_t* c, int n, int k, char* buf, size_t len) {
  size_t used = 0;
  buf[0] = 0;
  for (int i = 0; i < n && used + 96 < len; i++) {
    if (!alike(&c[i], &c[k], 0) || seenBefore(c, i, 1)) continue;
    used += snprintf(buf + used, len - used, "%s%s (", used ? ", " : "", c[i].domain);
    for (int j = i; j < n && used + 80 < len; j++)
      if (alike(&c[j], &c[i], 1) && !seenBefore(c, j, 2))
        used += snprintf(buf + used, len - used, "%s%s", j > i ? " " : "", c[j].fabric);
    used += snprintf(buf + used, len - used, ")");
  }
}

static void printNetwork(const job_t* job) {
  static gcommNetCandidate_t c[MAX_CANDIDATES];
  char domains[1024];
  int chosen = -1;
  const char* err = NULL;
  beginSection("network", "network (libfabric)");
  int n = job->hostComm
              ? gcommNetCandidates(&job->hostComm->params, c, MAX_CANDIDATES, &chosen, &err)
              : -1;
  if (n < 0) {
    field("error", "fi_getinfo", "%s", err ? err : "no communicator (see the findings)");
    n = 0;
  }
  beginList("providers", "providers (tagged, reliable datagrams), by gcomm's rank");
  for (int i = 0; i < n; i++) {
    if (seenBefore(c, i, 0)) continue;
    domainsOf(c, n, i, domains, sizeof(domains));
    beginRow(c[i].prov);
    field("provider", NULL, "%s", c[i].prov);
    number("rank", "rank", c[i].rank, 0, "");
    field("why", "", "%s", gcommNetRankWhy(c[i].rank));
    field("domains", "domains", "%s", domains);
    endRow();
  }
  endList();
  if (chosen >= 0) {
    domainsOf(c, n, chosen, domains, sizeof(domains));
    field("chosen", "gcomm takes", "%s, domain %s: %s", c[chosen].prov, c[chosen].domain,
          gcommNetRankWhy(c[chosen].rank));
    field("interfaces", "its domains (interfaces)", "%s", domains);
  } else {
    field("chosen", "gcomm takes", "none");
    if (spansNodes(job))
      warn(
          "no usable libfabric provider and the ranks span nodes: set GCOMM_OFI_PROVIDER (fi_info "
          "-t FI_EP_RDM lists the providers)");
  }
  endSection();
}
#else
static void printNetwork(const job_t* job) {
  beginSection("network", "network");
  field("libfabric", "libfabric", "not built (make OFI=1)");
  endSection();
  if (spansNodes(job))
    warn("the ranks span nodes and this build has no network transport: build with make OFI=1");
}
#endif

/* ======================================================================================== */
/* Environment                                                                              */
/* ======================================================================================== */

/* GCOMM_* variables read outside the params table: name and reader. */
static const char* const otherVariables[][2] = {
    {"GCOMM_PROFILER_TRACE", "read by the example profiler plugin"},
};
#define N_OTHER ((int)(sizeof(otherVariables) / sizeof(otherVariables[0])))

static int editDistance(const char* a, const char* b) {
  int la = (int)strlen(a), lb = (int)strlen(b), row[128];
  if (la > 127 || lb > 127) return 1 << 20;
  for (int j = 0; j <= lb; j++) row[j] = j;
  for (int i = 1; i <= la; i++) {
    int diag = row[0];
    row[0] = i;
    for (int j = 1; j <= lb; j++) {
      int up = row[j], cost = a[i - 1] != b[j - 1];
      int best = diag + cost;
      if (up + 1 < best) best = up + 1;
      if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
      row[j] = best;
      diag = up;
    }
  }
  return row[lb];
}

/* The known name nearest to name, or NULL when none is close (a third of its letters or 3). */
static const char* nearestName(const char* name) {
  const char* best = NULL;
  int bestD = 1 << 20;
  gcommParamInfo_t p;
  for (int i = 0; gcommParamInfo(i, &p) == 0; i++) {
    int d = editDistance(name, p.name);
    if (d < bestD) best = p.name, bestD = d;
  }
  for (int i = 0; i < N_OTHER; i++) {
    int d = editDistance(name, otherVariables[i][0]);
    if (d < bestD) best = otherVariables[i][0], bestD = d;
  }
  int limit = (int)strlen(name) / 3 < 3 ? (int)strlen(name) / 3 : 3;
  return bestD <= (limit > 1 ? limit : 1) ? best : NULL;
}

/* One GCOMM_ variable: its parsed value, or why gcomm will not take it. */
static void printVariable(const char* name, const char* value) {
  gcommParamInfo_t p;
  int i = 0;
  while (gcommParamInfo(i, &p) == 0 && strcmp(p.name, name) != 0) i++;
  char row[256];
  snprintf(row, sizeof(row), "%s=%.64s", name, value);
  beginRow(row);
  field("name", NULL, "%s", name);
  field("value", NULL, "%s", value);
  if (gcommParamInfo(i, &p) == 0) {
    char parsed[512];
    int valid = gcommParamParse(i, value, parsed, sizeof(parsed)) == 0;
    field("status", "", "%s", valid ? "known" : "invalid");
    if (valid) field("parsed", "gcomm takes", "%s", parsed);
    if (!valid)
      warn("%s=\"%s\" is not a valid value (%s): gcomm uses its default (%s); correct it", name,
           value, p.doc, p.defaultValue[0] ? p.defaultValue : "unset");
    endRow();
    return;
  }
  for (int k = 0; k < N_OTHER; k++)
    if (strcmp(otherVariables[k][0], name) == 0) {
      field("status", "", "known");
      field("reader", "", "%s", otherVariables[k][1]);
      endRow();
      return;
    }
  const char* near = nearestName(name);
  field("status", "", "unknown");
  if (near != NULL) field("suggestion", "did you mean", "%s", near);
  endRow();
  warn(
      "%s is set but gcomm does not know it (a typo, or a variable of a build with other "
      "options)%s%s",
      name, near ? ": did you mean " : ": unset it", near ? near : "");
}

static void printEnvironment(const job_t* job) {
  beginSection("environment", "environment");
  beginList("variables", "GCOMM_* variables set");
  for (char** e = job->gcommEnv; e != NULL && *e != NULL; e++) {
    char name[128];
    const char* eq = strchr(*e, '=');
    snprintf(name, sizeof(name), "%.*s", (int)(eq - *e), *e);
    printVariable(name, eq + 1);
  }
  endList();
  endSection();
}

static char** gcommEnvironment(void) {
  int n = 0;
  for (char** e = environ; *e != NULL; e++) n += strncmp(*e, "GCOMM_", 6) == 0 && strchr(*e, '=');
  char** list = calloc(n + 1, sizeof(char*));
  if (list == NULL) return NULL;
  n = 0;
  for (char** e = environ; *e != NULL; e++)
    if (strncmp(*e, "GCOMM_", 6) == 0 && strchr(*e, '=')) list[n++] = strdup(*e);
  return list;
}

/* ======================================================================================== */
/* Job: where the ranks are                                                                 */
/* ======================================================================================== */

static void printJob(const job_t* job) {
  char list[256];
  beginSection("job", "job");
  number("ranks", "ranks", job->nranks, 0, "");
  beginList("nodes", "nodes");
  for (int r = 0; r < job->nranks; r++) {
    if (!firstLike(job, r, sameHost)) continue;
    int n = ranksLike(job, r, sameHost, list, sizeof(list));
    beginRow(job->all[r].host);
    field("host", NULL, "%s", job->all[r].host);
    number("nranks", "", n, 0, n == 1 ? "rank" : "ranks");
    field("ranks", "ranks", "%s", list);
    endRow();
  }
  endList();
  beginList("gpus", "GPUs of the ranks (local rank mod GPUs)");
  for (int r = 0; r < job->nranks; r++) {
    const rankFacts_t* f = &job->all[r];
    if (f->device < 0 || !firstLike(job, r, sameGpu)) continue;
    int n = ranksLike(job, r, sameGpu, list, sizeof(list));
    char row[96];
    snprintf(row, sizeof(row), "%s GPU %d", f->host, f->device);
    beginRow(row);
    field("host", NULL, "%s", f->host);
    number("device", NULL, f->device, 0, "");
    field("pci", "PCI", "%s", f->pci);
    field("ranks", "ranks", "%s", list);
    field("mps", "MPS", "%s", f->mps < 0 ? "unknown" : f->mps ? "on" : "off");
    endRow();
    if (n > 1 && f->mps == 0)
      warn(
          "ranks %s share GPU %d (%s) on %s and MPS is off: operations will take a GPU time "
          "slice each; start nvidia-cuda-mps-control -d",
          list, f->device, f->pci, f->host);
  }
  endList();
  endSection();
}

/* ======================================================================================== */
/* Communicators and the self-test (every rank)                                             */
/* ======================================================================================== */

static float valueAt(size_t i, int rank) {
  return (float)((int)((i * 7 + (size_t)rank * 13) % 31) - 15);
}

/* Whether got holds the sum over nranks of valueAt (small integers: exact in float). */
static int sumIsRight(const float* got, size_t n, int nranks) {
  for (size_t i = 0; i < n; i++) {
    float want = 0;
    for (int r = 0; r < nranks; r++) want += valueAt(i, r);
    if (got[i] != want) return 0;
  }
  return 1;
}

static gcommResult_t allReduce(gcommComm_t comm, const float* send, float* recv, size_t n,
                               void* stream) {
  gcommResult_t res = gcommAllReduce(send, recv, n, gcommFloat32, gcommSum, comm, stream);
  return res == gcommSuccess ? gcommWait(comm, stream) : res;
}

/* The average time of iters all-reduces enqueued back to back after one untimed, in us. */
static double timeAllReduce(gcommComm_t comm, const float* send, float* recv, size_t n,
                            void* stream, int iters, gcommResult_t* res) {
  *res = allReduce(comm, send, recv, n, stream);
  MPI_Barrier(MPI_COMM_WORLD);
  uint64_t t0 = gcommNowNs();
  for (int i = 0; i < iters && *res == gcommSuccess; i++)
    *res = gcommAllReduce(send, recv, n, gcommFloat32, gcommSum, comm, stream);
  if (*res == gcommSuccess) *res = gcommWait(comm, stream);
  return (gcommNowNs() - t0) / 1e3 / iters;
}

/* Buffers for one test: host memory, or GPU memory filled from host. */
typedef struct {
  float *host, *send, *recv;
  int onGpu;
} buffers_t;

static int buffersMake(buffers_t* b, size_t bytes, int onGpu, int rank) {
  memset(b, 0, sizeof(*b));
  b->onGpu = onGpu;
  b->host = malloc(bytes);
  if (b->host == NULL) return 0;
  for (size_t i = 0; i < bytes / sizeof(float); i++) b->host[i] = valueAt(i, rank);
  if (!onGpu) {
    b->send = b->host;
    b->recv = malloc(bytes);
    if (b->recv != NULL) memset(b->recv, 0xff, bytes); /* NaN until written */
    return b->recv != NULL;
  }
#ifdef GCOMM_CUDA
  return cudaCheck(cudaMalloc((void**)&b->send, bytes), "cudaMalloc") &&
         cudaCheck(cudaMalloc((void**)&b->recv, bytes), "cudaMalloc") &&
         cudaCheck(cudaMemcpy(b->send, b->host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy") &&
         cudaCheck(cudaMemset(b->recv, 0xff, bytes), "cudaMemset");
#else
  return 0;
#endif
}

/* The result as host memory (into b->host for a GPU), or NULL. */
static const float* buffersResult(buffers_t* b, size_t bytes) {
  if (!b->onGpu) return b->recv;
#ifdef GCOMM_CUDA
  if (cudaCheck(cudaMemcpy(b->host, b->recv, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy"))
    return b->host;
#endif
  (void)bytes;
  return NULL;
}

static void buffersFree(buffers_t* b) {
#ifdef GCOMM_CUDA
  if (b->onGpu) {
    cudaFree(b->send);
    cudaFree(b->recv);
    b->send = b->recv = NULL;
  }
#endif
  if (b->recv != b->host) free(b->recv);
  free(b->host);
}

/* Every rank: t from every rank's ok and time; the first failing rank's message goes to all. */
static void agreeOnTest(job_t* job, testResult_t* t, int ok, double us) {
  int firstBad = ok ? job->nranks : job->rank;
  MPI_Allreduce(&ok, &t->ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &firstBad, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&us, &t->us, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  if (firstBad == job->nranks) return;
  char msg[sizeof(t->error)];
  MPI_Bcast(t->error, sizeof(t->error), MPI_CHAR, firstBad, MPI_COMM_WORLD);
  snprintf(msg, sizeof(msg), "rank %d: %.480s", firstBad, t->error);
  memcpy(t->error, msg, sizeof(msg));
}

/* Every rank: one checked all-reduce of bytes, then, when every rank got the right sums, iters
 * timed. */
static void selfTest(job_t* job, gcommComm_t comm, const char* what, size_t bytes, int iters,
                     void* stream) {
  testResult_t* t = &job->tests[job->nTests++];
  t->what = what;
  t->bytes = bytes;
  size_t n = bytes / sizeof(float);
  buffers_t b;
  gcommResult_t res = gcommSystemError;
  int made = buffersMake(&b, bytes, stream != NULL, job->rank), allOk = 0;
  if (made) res = allReduce(comm, b.send, b.recv, n, stream);
  const float* got = res == gcommSuccess ? buffersResult(&b, bytes) : NULL;
  int ok = got != NULL && sumIsRight(got, n, job->nranks);
  MPI_Allreduce(&ok, &allOk, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD); /* all time, or none */
  double us = allOk ? timeAllReduce(comm, b.send, b.recv, n, stream, iters, &res) : INFINITY;
  ok &= res == gcommSuccess;
  if (!ok)
    snprintf(t->error, sizeof(t->error), "%s",
             !made                 ? "could not allocate and fill the buffers"
             : res != gcommSuccess ? gcommGetLastError(comm)
                                   : "wrong sums");
  buffersFree(&b);
  agreeOnTest(job, t, ok, us);
}

#define SMALL_BYTES 256
#define HOST_LARGE_BYTES (16u << 20)
#define GPU_LARGE_BYTES (256u << 20)

/* The slowest rank's memcpy rate over the large host buffer, all ranks copying at once. */
static double memcpyRate(void) {
  char* a = malloc(HOST_LARGE_BYTES);
  char* b = malloc(HOST_LARGE_BYTES);
  double best = 0, slowest = 0;
  if (a != NULL && b != NULL) {
    memset(a, 1, HOST_LARGE_BYTES);
    memset(b, 2, HOST_LARGE_BYTES);
    MPI_Barrier(MPI_COMM_WORLD);
    for (int i = 0; i < 3; i++) {
      uint64_t t0 = gcommNowNs();
      memcpy(b, a, HOST_LARGE_BYTES);
      double gbs = HOST_LARGE_BYTES / (double)(gcommNowNs() - t0);
      if (gbs > best) best = gbs;
    }
  }
  free(a);
  free(b);
  MPI_Allreduce(&best, &slowest, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
  return slowest;
}

/* Every rank: a communicator only if every rank has one (the self-test calls it on all). */
static void agreeOnComm(gcommComm_t* comm, char* error, size_t len) {
  int mine = *comm != NULL, all = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (all || !mine) return;
  gcommCommDestroy(*comm);
  *comm = NULL;
  snprintf(error, len, "another rank could not create its communicator (its error is on stderr)");
}

#ifdef GCOMM_CUDA
/* Every rank: the GPU communicator, when every rank has a GPU (local rank mod GPU count). */
static void gpuSetup(job_t* job, rankFacts_t* mine) {
  int n = gpuCount(), all = 0, has = n > 0;
  MPI_Allreduce(&has, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!all) return; /* GPU communicators need a GPU on every rank */
  int dev = job->localIndex % n;
  if (!pciId(dev, mine->pci, sizeof(mine->pci)) || !cudaCheck(cudaSetDevice(dev), "cudaSetDevice"))
    has = 0;
  mine->device = has ? dev : -1;
  mine->mps = has ? mpsState(dev) : -1;
  MPI_Allreduce(&has, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!all) return;
  gcommConfig_t config = GCOMM_CONFIG_INITIALIZER;
  config.device = dev;
  config.commName = "gcomm_info GPU";
  job->gpuCommTried = 1;
  if (gcommCommInitMPI(&job->gpuComm, MPI_COMM_WORLD, &config) != gcommSuccess)
    snprintf(job->gpuCommError, sizeof(job->gpuCommError), "%s", gcommGetLastError(NULL));
  agreeOnComm(&job->gpuComm, job->gpuCommError, sizeof(job->gpuCommError));
}
/* Every rank: the GPU communicator's all-reduces, on a stream of their own. */
static void gpuSelfTest(job_t* job) {
  cudaStream_t stream = NULL;
  int mine = job->gpuComm != NULL &&
             cudaCheck(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStream"),
      all = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (all) {
    selfTest(job, job->gpuComm, "GPU", SMALL_BYTES, 50, stream);
    selfTest(job, job->gpuComm, "GPU", GPU_LARGE_BYTES, 10, stream);
  }
  if (mine) cudaStreamDestroy(stream);
}
#endif

/* Every rank: the communicators, the facts, the self-test. */
static void runJob(job_t* job) {
  rankFacts_t mine;
  memset(&mine, 0, sizeof(mine));
  gethostname(mine.host, sizeof(mine.host) - 1);
  mine.device = mine.mps = -1;
  shmFacts(&mine); /* before the communicators take their part */
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, job->rank, MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, &job->localIndex);
  MPI_Comm_free(&node);
  gcommConfig_t config = GCOMM_CONFIG_INITIALIZER;
  config.device = GCOMM_DEVICE_HOST;
  config.commName = "gcomm_info host";
  if (gcommCommInitMPI(&job->hostComm, MPI_COMM_WORLD, &config) != gcommSuccess)
    snprintf(job->hostCommError, sizeof(job->hostCommError), "%s", gcommGetLastError(NULL));
  agreeOnComm(&job->hostComm, job->hostCommError, sizeof(job->hostCommError));
#ifdef GCOMM_CUDA
  gpuSetup(job, &mine);
#endif
  job->all = calloc(job->nranks, sizeof(rankFacts_t));
  MPI_Gather(&mine, sizeof(mine), MPI_BYTE, job->all, sizeof(mine), MPI_BYTE, 0, MPI_COMM_WORLD);
  if (job->nranks < 2) return;
  if (job->hostComm != NULL) {
    selfTest(job, job->hostComm, "host", SMALL_BYTES, 50, NULL);
    selfTest(job, job->hostComm, "host", HOST_LARGE_BYTES, 5, NULL);
  }
  job->memcpyGBs = memcpyRate();
#ifdef GCOMM_CUDA
  gpuSelfTest(job);
#endif
}

/* ======================================================================================== */
/* Self-test report (rank 0)                                                                */
/* ======================================================================================== */

/* What the GPUs' link should give each way, or NAN; *name says which link. Only for ranks of one
 * node on distinct GPUs: the slowest pair's NVLinks, or else the slowest GPU's PCIe link. */
static double gpuLinkRate(const job_t* job, const char** name) {
  *name = "";
#ifdef GCOMM_CUDA
  double rate = INFINITY, pcie = INFINITY;
  int allNvlink = 1;
  if (spansNodes(job) || job->nranks < 2) return NAN;
  for (int a = 0; a < job->nranks; a++)
    for (int b = 0; b < job->nranks; b++) {
      if (a == b) continue;
      if (sameGpu(&job->all[a], &job->all[b])) return NAN; /* shared: no link between them */
      double perLink = NAN;
      int links = nvlinkCount(job->all[a].pci, job->all[b].pci, &perLink);
      if (links > 0 && links * perLink < rate) rate = links * perLink; /* NAN: not taken */
      allNvlink &= links > 0;
      double p = pcieGBs(job->all[a].pci);
      if (p < pcie) pcie = p;
    }
  *name = allNvlink ? "the NVLink rate" : "the PCIe rate";
  rate = allNvlink ? rate : pcie;
  return isfinite(rate) ? rate : NAN;
#else
  (void)job;
  return NAN;
#endif
}

static void printTest(const job_t* job, const testResult_t* t) {
  char size[32], row[64];
  snprintf(row, sizeof(row), "%s all-reduce %s", t->what,
           bytesText((double)t->bytes, size, sizeof(size)));
  beginRow(row);
  field("memory", NULL, "%s", t->what);
  number("bytes", NULL, (double)t->bytes, 0, "bytes");
  field("result", "", "%s", t->ok ? "ok" : "FAILED");
  if (!t->ok) {
    field("error", "", "%s", t->error);
    endRow();
    return;
  }
  double busbw = t->bytes / t->us / 1e3 * 2 * (job->nranks - 1) / job->nranks;
  number("time_us", "", t->us, 1, "us");
  number("busbw_gbs", "busbw", busbw, 2, "GB/s");
  const char* refName = "this node's memcpy rate";
  double ref = job->memcpyGBs;
  if (strcmp(t->what, "GPU") == 0) ref = gpuLinkRate(job, &refName);
  if (t->bytes > SMALL_BYTES && isfinite(ref) && ref > 0) {
    if (!out.json) printf(" = %.0f%% of %s (%.1f GB/s)", 100 * busbw / ref, refName, ref);
    number("reference_gbs", NULL, ref, 2, "");
    field("reference", NULL, "%s", refName);
    number("fraction_of_reference", NULL, busbw / ref, 3, "");
  }
  endRow();
}

static int printSelfTest(const job_t* job) {
  int failed = job->hostComm == NULL || (job->gpuCommTried && job->gpuComm == NULL);
  beginSection("selftest", "self-test");
  if (job->hostComm == NULL)
    field("host_comm_error", "host communicator", "FAILED: %s", job->hostCommError);
  if (job->gpuCommTried && job->gpuComm == NULL)
    field("gpu_comm_error", "GPU communicator", "FAILED: %s", job->gpuCommError);
  if (job->nranks < 2) field("skipped", "skipped", "needs 2 or more ranks (mpiexec -n 2)");
  beginList("allreduce", "all-reduce (float sum, checked against a serial sum)");
  for (int i = 0; i < job->nTests; i++) {
    printTest(job, &job->tests[i]);
    failed |= !job->tests[i].ok;
  }
  endList();
  boolean("passed", "passed", !failed);
  endSection();
  if (job->hostComm == NULL)
    warn("a host communicator could not be created (%s): fix what the message names",
         job->hostCommError);
  if (job->gpuCommTried && job->gpuComm == NULL)
    warn("a GPU communicator could not be created (%s): fix what the message names",
         job->gpuCommError);
  for (int i = 0; i < job->nTests; i++)
    if (!job->tests[i].ok)
      warn(
          "the %s all-reduce of %zu bytes failed (%s): run again with GCOMM_DEBUG=INFO and read "
          "the log",
          job->tests[i].what, job->tests[i].bytes, job->tests[i].error);
  return failed;
}

static void printFindings(void) {
  if (out.json) {
    jsonOpen("warnings", '[');
    for (int i = 0; i < nWarnings; i++) jsonMember(NULL), jsonString(warnings[i]);
    jsonClose(']');
    return;
  }
  printf("\n== findings\n");
  if (nWarnings == 0) printf("  none: nothing to fix\n");
  for (int i = 0; i < nWarnings; i++) printf("WARN %s\n", warnings[i]);
}

/* ======================================================================================== */
/* main                                                                                     */
/* ======================================================================================== */

static void destroyComms(job_t* job) {
  if (job->gpuComm != NULL) gcommCommDestroy(job->gpuComm);
  if (job->hostComm != NULL) gcommCommDestroy(job->hostComm);
}

int main(int argc, char** argv) {
  job_t job;
  memset(&job, 0, sizeof(job));
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--json") == 0) {
      out.json = 1;
    } else {
      printf(
          "usage: [mpiexec -n N] %s [--json]\n"
          "Says whether this machine is set up for gcomm; see tools/gcomm_info.c.\n",
          argv[0]);
      return strcmp(argv[i], "--help") == 0 ? 0 : 2;
    }
  }
  job.gcommEnv = gcommEnvironment(); /* before the deadline below is set */
  /* every wait of the self-test ends within a minute unless the user chose otherwise */
  setenv("GCOMM_TIMEOUT_MS", "60000", 0);
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &job.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &job.nranks);
  runJob(&job);
  int failed = 0;
  if (job.rank == 0) {
#ifdef GCOMM_CUDA
    nvmlLoad();
#endif
    if (out.json) putchar('{');
    printBuild();
    printNode(&job);
    printNetwork(&job);
    printEnvironment(&job);
    printJob(&job);
    failed = printSelfTest(&job);
    printFindings();
    if (out.json) printf("\n}\n");
    fflush(stdout);
#ifdef GCOMM_CUDA
    nvmlUnload();
#endif
  }
  MPI_Bcast(&failed, 1, MPI_INT, 0, MPI_COMM_WORLD);
  destroyComms(&job);
  for (char** e = job.gcommEnv; e != NULL && *e != NULL; e++) free(*e);
  free(job.gcommEnv);
  free(job.all);
  MPI_Finalize();
  return failed;
}
