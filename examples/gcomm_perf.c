/*
 * gcomm_perf.c - the gcomm benchmark.
 *
 * nccl-tests' flags and output format, for every collective, timing gcomm and, in the same run
 * and the same harness, the MPI library's own collectives (and NCCL, when built with
 * -DGCOMM_PERF_NCCL). With several backends one table shows them side by side, each size's times
 * and bus bandwidths with the ratio of every other backend's time to the first's (--separate: one
 * nccl-tests table per backend instead; tools/perf_table.py reads both). The backends take turns
 * size by size, not one whole sweep after another: a shared or virtual machine drifts over
 * seconds, while measurements adjacent in time share the machine's state.
 *
 *   mpiexec -n 4 build/gcomm_perf --coll allreduce -b 16 -e 64M -f 4 --backend gcomm,mpi
 *
 * How it is put together, top to bottom:
 *   options        the command line (nccl-tests' short flags, plus --coll and --backend)
 *   types          element types, half/bfloat16 converters, loading and storing one element
 *   memory         buffers and timers, on the host or (GCOMM_CUDA) on the device
 *   data           the input of every rank (regenerable anywhere) and the expected results
 *   backends       gcomm, MPI, NCCL: open, close, completion, one runner per collective
 *   collectives    the table: name, shape of the buffers, busbw factor, expected values, runners
 *   harness        sizing, timing, checking, a row, a table, backends in turn, the whole run
 *
 * Sizes, counts, algbw and busbw follow nccl-tests: for allgather, gather, reducescatter, scatter
 * and alltoall the size column is the largest buffer (nranks blocks) and count is one block; the
 * per-rank block is rounded down to 16 bytes. Times are the average per iteration over -n
 * iterations after -w warm-ups, averaged across ranks (-a), in microseconds.
 */
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gcomm.h"

#ifdef GCOMM_CUDA
#include <cuda_runtime.h>
#endif
#ifdef GCOMM_PERF_NCCL
#ifndef GCOMM_CUDA
#error "the NCCL backend needs device buffers: build with make CUDA=1 NCCL=1"
#endif
#include <nccl.h>
#endif

#define PRINT(...)                            \
  do {                                        \
    if (world.rank == 0) printf(__VA_ARGS__); \
  } while (0)

/* ======================================================================================== */
/* Process-wide state and errors                                                            */
/* ======================================================================================== */

static struct {
  int rank, nranks, localRank;
  int device; /* the CUDA device of this rank, -1 for host memory */
  char host[64];
} world = {0, 1, 0, -1, ""};

static void die(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fflush(stdout);
  fprintf(stderr, "gcomm_perf: rank %d: ", world.rank);
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  MPI_Abort(MPI_COMM_WORLD, 1);
}

/* Any gcomm call that fails ends the run: its error string and the communicator's last error. */
static gcommComm_t gcComm; /* for gcommGetLastError; NULL until created */
#define GC(call) gcCheck((call), #call, __LINE__)
static void gcCheck(gcommResult_t r, const char* what, int line) {
  if (r == gcommSuccess) return;
  fflush(stdout);
  fprintf(stderr, "gcomm_perf: rank %d: line %d: %s: %s: %s\n", world.rank, line, what,
          gcommGetErrorString(r), gcommGetLastError(gcComm));
  MPI_Abort(MPI_COMM_WORLD, 1);
}

#ifdef GCOMM_CUDA
#define CU(call) cuCheck((call), #call)
static void cuCheck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) die("%s: %s", what, cudaGetErrorString(e));
}
#endif

/* ======================================================================================== */
/* Options                                                                                  */
/* ======================================================================================== */

enum { BACKEND_GCOMM, BACKEND_MPI, BACKEND_NCCL, NUM_BACKENDS };
#define ALL (-1) /* -d all, -o all, -r all, --coll all */

static struct {
  size_t minBytes, maxBytes, stepBytes, stepFactor;
  int iters, warmup, check, average, gpu;
  int rounds; /* turns each backend's iterations are timed in (see timeLanes); 0: the default */
  int type, op, root;
  unsigned colls;    /* bit i: collectives[i] */
  unsigned backends; /* bit i: BACKEND_i, in that order */
  int proxyMode;     /* GCOMM_PROXY_*, or -1 for gcomm's default */
  int separate;      /* several backends: one nccl-tests table each, not one side by side */
  int vskewed;       /* --vcounts skewed: the vector collectives' counts (see vCount) */
  int hostShared;    /* --host_mem gcomm: host buffers from gcommHostAlloc, for every backend */
} opt = {32 << 20,   32 << 20, 1 << 20, 1, 20, 5,  1, 1, -1, 0,
         gcommFloat, gcommSum, 0,       0, 0,  -1, 0, 0, 0};

static const char* const opNames[gcommNumOps] = {"sum", "prod", "max", "min", "avg"};
static const char* const backendNames[NUM_BACKENDS] = {"gcomm", "mpi", "nccl"};

static void usage(const char* prog) {
  PRINT(
      "USAGE: %s\n"
      "\t[-b,--minbytes <min size in bytes, K/M/G suffixes>]\n"
      "\t[-e,--maxbytes <max size in bytes>]\n"
      "\t[-i,--stepbytes <increment size>]\n"
      "\t[-f,--stepfactor <increment factor>]\n"
      "\t[-n,--iters <iteration count>] (default 20)\n"
      "\t[-w,--warmup_iters <warmup iteration count>] (default 5)\n"
      "\t[-R,--rounds <turns>] with several backends, each times its iterations in this many "
      "turns,\n\t\talternating with the others (default 4; 1 with one backend)\n"
      "\t[-c,--check <check iteration count>] (default 1)\n"
      "\t[-d,--datatype <int8/uint8/int32/uint32/int64/uint64/half/float/double/bfloat16/f8e4m3/"
      "f8e5m2/all>]\n"
      "\t[-o,--op <sum/prod/max/min/avg/all>]\n"
      "\t[-r,--root <root/all>]\n"
      "\t[-a,--average <0/1/2/3> report average iteration time <0=RANK0/1=AVG/2=MIN/3=MAX>]\n"
      "\t[-g <0/1>, --gpu[=0/1]] device buffers (default: in a CUDA build with a device present)\n"
      "\t[--coll <allreduce/broadcast/reduce/allgather/reducescatter/alltoall/gather/scatter/"
      "sendrecv/allgatherv/alltoallv/gatherv/scatterv/all>[,...]] (default allreduce)\n"
      "\t[--vcounts <random/skewed>] the vector collectives' counts per pair (default random)\n"
      "\t[--host_mem <malloc/gcomm>] host buffers from malloc or gcommHostAlloc, for every\n"
      "\t\tbackend (default malloc)\n"
      "\t[--backend <gcomm/mpi/nccl>[,...]] (default gcomm); several: one table, side by side,\n"
      "\t\twith each backend's time over the first one's (above 1: the first is faster)\n"
      "\t[--separate] with several backends, one nccl-tests table per backend instead\n"
      "\t[--proxy <thread/poll>] gcomm's progress mode (GCOMM_PROXY_MODE wins)\n"
      "\t[-h,--help]\n",
      prog);
}

/* A size with an optional K, M or G suffix (binary, as nccl-tests). */
static int parseSize(const char* s, size_t* out) {
  char* end;
  double v = strtod(s, &end);
  double unit = 1;
  if (end == s || v < 0) return -1;
  switch (*end) {
    case 'k':
    case 'K':
      unit = 1024.0, end++;
      break;
    case 'm':
    case 'M':
      unit = 1024.0 * 1024, end++;
      break;
    case 'g':
    case 'G':
      unit = 1024.0 * 1024 * 1024, end++;
      break;
  }
  if (*end == 'B' || *end == 'b') end++;
  if (*end != '\0') return -1;
  *out = (size_t)(v * unit);
  return 0;
}

/* "all_reduce", "AllReduce" and "allreduce" name the same thing. */
static int sameName(const char* a, const char* b, size_t blen) {
  size_t j = 0;
  for (; *a; a++) {
    if (*a == '_' || *a == '-') continue;
    if (j >= blen || (*a | 0x20) != (b[j] | 0x20)) return 0;
    j++;
    while (j < blen && (b[j] == '_' || b[j] == '-')) j++;
  }
  return j == blen;
}

/* Index of name in names[0..n), or ALL for "all", or -2. */
static int lookup(const char* name, size_t len, const char* const* names, int n) {
  if (sameName("all", name, len)) return ALL;
  for (int i = 0; i < n; i++)
    if (names[i] && sameName(names[i], name, len)) return i;
  return -2;
}

/* A comma list of names into a bit mask; 0 when one is unknown. */
static unsigned parseList(const char* list, const char* const* names, int n) {
  unsigned mask = 0;
  while (*list) {
    size_t len = strcspn(list, ",");
    int i = lookup(list, len, names, n);
    if (i == -2) return 0;
    mask |= i == ALL ? (1u << n) - 1 : 1u << i;
    list += len + (list[len] == ',');
  }
  return mask;
}

/* ======================================================================================== */
/* Types                                                                                    */
/* ======================================================================================== */

static const struct {
  const char* name;  /* as nccl-tests prints it */
  const char* alias; /* also accepted by -d */
  int size, isFloat, isSigned;
  double eps; /* unit roundoff, for the tolerance of avg */
} types[gcommNumTypes] = {
    [gcommInt8] = {"int8", "char", 1, 0, 1, 0},
    [gcommUint8] = {"uint8", NULL, 1, 0, 0, 0},
    [gcommInt32] = {"int32", "int", 4, 0, 1, 0},
    [gcommUint32] = {"uint32", NULL, 4, 0, 0, 0},
    [gcommInt64] = {"int64", NULL, 8, 0, 1, 0},
    [gcommUint64] = {"uint64", NULL, 8, 0, 0, 0},
    [gcommFloat16] = {"half", "float16", 2, 1, 1, 0x1p-11},
    [gcommFloat32] = {"float", "float32", 4, 1, 1, 0x1p-24},
    [gcommFloat64] = {"double", "float64", 8, 1, 1, 0x1p-53},
    [gcommBfloat16] = {"bfloat16", "bf16", 2, 1, 1, 0x1p-8},
    [gcommFloat8e4m3] = {"f8e4m3", "float8e4m3", 1, 1, 1, 0x1p-4},
    [gcommFloat8e5m2] = {"f8e5m2", "float8e5m2", 1, 1, 1, 0x1p-3},
};

static int parseType(const char* s) {
  for (int t = 0; t < gcommNumTypes; t++)
    if (strcmp(s, types[t].name) == 0 || (types[t].alias && strcmp(s, types[t].alias) == 0))
      return t;
  return strcmp(s, "all") == 0 ? ALL : -2;
}

static float bitsToFloat(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static uint32_t floatToBits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

static float halfToFloat(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  if (exp == 0) { /* zero or subnormal: man * 2^-24 */
    float f = (float)man * 0x1p-24f;
    return sign ? -f : f;
  }
  if (exp == 0x1f) return bitsToFloat(sign | 0x7f800000u | (man << 13));
  return bitsToFloat(sign | ((exp + 112) << 23) | (man << 13));
}

/* Round to nearest even. */
static uint16_t floatToHalf(float f) {
  uint32_t x = floatToBits(f), sign = (x >> 16) & 0x8000, mag = x & 0x7fffffffu;
  if (mag > 0x7f800000u) return (uint16_t)(sign | 0x7e00);  /* nan */
  if (mag >= 0x477ff000u) return (uint16_t)(sign | 0x7c00); /* inf, or rounds to it */
  if (mag < 0x38800000u) {                                  /* subnormal half, or zero */
    return (uint16_t)(sign | (uint32_t)lrintf(bitsToFloat(mag) * 0x1p24f));
  }
  mag -= 0x38000000u; /* exponent bias 127 -> 15 */
  return (uint16_t)(sign | ((mag + 0xfff + ((mag >> 13) & 1)) >> 13));
}

static float bf16ToFloat(uint16_t b) {
  return bitsToFloat((uint32_t)b << 16);
}

static uint16_t floatToBf16(float f) {
  uint32_t x = floatToBits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40); /* nan */
  return (uint16_t)((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}

/* fp8 (E4M3: 3 mantissa bits, bias 7; E5M2: 2, bias 15). Our values are small: no NaN or
 * infinity; the encoding rounds to nearest even and saturates. */
static double fp8ToDouble(uint8_t b, int e5m2) {
  int man = e5m2 ? 2 : 3, bias = e5m2 ? 15 : 7, e = (b & 0x7f) >> man, m = b & ((1 << man) - 1);
  double v = e ? ldexp(1.0 + ldexp(m, -man), e - bias) : ldexp(m, 1 - bias - man);
  return b & 0x80 ? -v : v;
}

static uint8_t doubleToFp8(double v, int e5m2) {
  int man = e5m2 ? 2 : 3, bias = e5m2 ? 15 : 7, e;
  double a = fmin(fabs(v), e5m2 ? 57344 : 448);
  frexp(a, &e);
  int exp = e - 1 < 1 - bias ? 1 - bias : e - 1; /* the value's exponent, subnormals' at least */
  double q = nearbyint(ldexp(a, man - exp));     /* its significand in units of its last place */
  uint8_t code = (uint8_t)(((exp + bias - 1) << man) + (int)q); /* a carry moves into exp */
  if (v != v) return 0x7f;
  return (uint8_t)((a == 0 ? 0 : code) | (signbit(v) ? 0x80 : 0));
}

/* Element i of an array of type, as a double (our values are small integers or their avg). */
static double loadValue(int type, const void* base, size_t i) {
  const char* p = (const char*)base + i * (size_t)types[type].size;
  union {
    int8_t i8;
    uint8_t u8;
    int32_t i32;
    uint32_t u32;
    int64_t i64;
    uint64_t u64;
    uint16_t u16;
    float f;
    double d;
  } v;
  if (type == gcommFloat8e4m3 || type == gcommFloat8e5m2)
    return fp8ToDouble((uint8_t)*p, type == gcommFloat8e5m2);
  memcpy(&v, p, (size_t)types[type].size);
  switch (type) {
    case gcommInt8:
      return v.i8;
    case gcommUint8:
      return v.u8;
    case gcommInt32:
      return v.i32;
    case gcommUint32:
      return v.u32;
    case gcommInt64:
      return (double)v.i64;
    case gcommUint64:
      return (double)v.u64;
    case gcommFloat16:
      return halfToFloat(v.u16);
    case gcommFloat32:
      return v.f;
    case gcommFloat64:
      return v.d;
    default:
      return bf16ToFloat(v.u16);
  }
}

/* Stores v rounded to type; integers wrap, like gcomm's integer Sum and Prod. */
static void storeValue(int type, void* base, size_t i, double v) {
  char* p = (char*)base + i * (size_t)types[type].size;
  uint16_t h;
  float f;
  uint64_t u;
  switch (type) {
    case gcommFloat16:
      h = floatToHalf((float)v), memcpy(p, &h, 2);
      return;
    case gcommBfloat16:
      h = floatToBf16((float)v), memcpy(p, &h, 2);
      return;
    case gcommFloat8e4m3:
    case gcommFloat8e5m2:
      *p = (char)doubleToFp8((float)v, type == gcommFloat8e5m2);
      return;
    case gcommFloat32:
      f = (float)v, memcpy(p, &f, 4);
      return;
    case gcommFloat64:
      memcpy(p, &v, 8);
      return;
    default: /* the low bytes of the two's complement (little endian) */
      u = v >= 0x1p63 ? (uint64_t)v : (uint64_t)(int64_t)v;
      memcpy(p, &u, (size_t)types[type].size);
  }
}

/* v as the type holds it. */
static double toType(int type, double v) {
  char tmp[8];
  storeValue(type, tmp, 0, v);
  return loadValue(type, tmp, 0);
}

/* ======================================================================================== */
/* Memory and timers: host memory and clock_gettime, or device memory and CUDA events       */
/* ======================================================================================== */

#ifdef GCOMM_CUDA
static cudaStream_t stream; /* the stream of the gcomm or NCCL backend on device buffers */
static cudaEvent_t events[2];
#endif

/* bytes of zeros, 64-byte aligned. Zeros, not garbage: no float denormals or NaNs get timed. */
static void* bufAlloc(int onDevice, size_t bytes) {
  void* p = NULL;
  bytes = (bytes + 63) & ~(size_t)63;
  if (bytes == 0) bytes = 64;
#ifdef GCOMM_CUDA
  if (onDevice) {
    CU(cudaMalloc(&p, bytes));
    CU(cudaMemset(p, 0, bytes));
    CU(cudaDeviceSynchronize());
    return p;
  }
#endif
  (void)onDevice;
  if (opt.hostShared) {
    if (gcommHostAlloc(&p, bytes) != gcommSuccess) die("%s", gcommGetLastError(NULL));
  } else {
    p = aligned_alloc(64, bytes);
    if (p == NULL) die("out of host memory");
  }
  memset(p, 0, bytes);
  return p;
}

static void bufFree(int onDevice, void* p) {
#ifdef GCOMM_CUDA
  if (onDevice) {
    CU(cudaFree(p));
    return;
  }
#endif
  (void)onDevice;
  if (opt.hostShared) {
    if (gcommHostFree(p) != gcommSuccess) die("%s", gcommGetLastError(NULL));
    return;
  }
  free(p);
}

static void bufUpload(int onDevice, void* dst, const void* host, size_t bytes) {
#ifdef GCOMM_CUDA
  if (onDevice) {
    CU(cudaMemcpy(dst, host, bytes, cudaMemcpyHostToDevice));
    CU(cudaDeviceSynchronize()); /* from pageable memory it may return before the copy ends */
    return;
  }
#endif
  (void)onDevice;
  memcpy(dst, host, bytes);
}

static void bufDownload(int onDevice, void* host, const void* src, size_t bytes) {
#ifdef GCOMM_CUDA
  if (onDevice) {
    CU(cudaMemcpy(host, src, bytes, cudaMemcpyDeviceToHost));
    return;
  }
#endif
  (void)onDevice;
  memcpy(host, src, bytes);
}

static double hostSeconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct {
  int onDevice;
  double t0;
} Timer;

static void timerStart(Timer* tm, int onDevice) {
  tm->onDevice = onDevice;
#ifdef GCOMM_CUDA
  if (onDevice) {
    CU(cudaEventRecord(events[0], stream));
    return;
  }
#endif
  tm->t0 = hostSeconds();
}

/* Marks the end; call after the work is enqueued and before waiting for it. */
static void timerMark(Timer* tm) {
#ifdef GCOMM_CUDA
  if (tm->onDevice) CU(cudaEventRecord(events[1], stream));
#endif
  (void)tm;
}

/* Seconds from start to mark; call once the work is complete. */
static double timerSeconds(Timer* tm) {
#ifdef GCOMM_CUDA
  if (tm->onDevice) {
    float ms;
    CU(cudaEventSynchronize(events[1]));
    CU(cudaEventElapsedTime(&ms, events[0], events[1]));
    return 1e-3 * ms;
  }
#endif
  return hostSeconds() - tm->t0;
}

/* ======================================================================================== */
/* Tests and data                                                                           */
/* ======================================================================================== */

typedef struct Coll Coll;
typedef struct Backend Backend;

/* One measurement: a collective on one backend, type, op, root and size, in or out of place. */
typedef struct {
  const Coll* coll;
  const Backend* be;
  int type, op, root, inPlace;
  size_t count;                  /* the count argument of the call */
  size_t sendCount, recvCount;   /* elements the call reads and writes on this rank */
  size_t sendOffset, recvOffset; /* in place: where they lie in the receive buffer */
  void *sendBuf, *recvBuf;       /* the allocations */
  unsigned seed;
} Test;

typedef void (*RunFn)(const Test* t, const void* send, void* recv);

/* How the buffers relate, after nccl-tests (count: the call's argument; base: one rank's block).
 *   SAME      send = recv = count                        allreduce broadcast reduce sendrecv
 *   GATHER    send = base, recv = nranks*base, in place  allgather gather
 *             send lies at block rank of recv
 *   SCATTER   send = nranks*base, recv = base, in place  reducescatter scatter
 *             recv lies at block rank of send
 *   ALLTOALL  send = recv = nranks*base                  alltoall */
typedef enum { SHAPE_SAME, SHAPE_GATHER, SHAPE_SCATTER, SHAPE_ALLTOALL } Shape;

struct Coll {
  const char* name;
  Shape shape;
  int reduces;          /* takes a redop: -o loops over it, the redop column names it */
  int rooted;           /* takes a root: -r loops over it, the root column shows it */
  int rootInputOnly;    /* only the root's input is read (broadcast, scatter) */
  int rootResultOnly;   /* only the root gets a result (reduce, gather); elsewhere: all of it */
  int inPlaceUndefined; /* in place leaves no defined result: #wrong is N/A, as nccl-tests */
  unsigned noInPlace;   /* backends with no in-place form of it: the in-place columns are N/A */
  double (*busFactor)(int nranks);
  double (*expect)(const Test* t, size_t i); /* element i of this rank's result */
  RunFn run[NUM_BACKENDS];
};

static int reduces(const Test* t) {
  return t->coll->reduces;
}

static uint32_t hash32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

/* Element i of rank's input. Small integers, so that every op is exact in every type whatever
 * the order of the reduction: [-3,3] (unsigned [0,3]) for sum, avg, max, min; +-1 for prod with
 * one rank per element contributing 2; [-100,100] ([0,200]) for the collectives that only move
 * data (exact in int8 and bfloat16; fp8 stores them rounded). fp8's sum, avg, max and min take
 * [-1,1]: its sums are exact up to 8 ranks. */
static double inputValue(const Test* t, int rank, size_t i) {
  uint32_t key = (uint32_t)(rank + 1) * 0x9e3779b9u + t->seed * 0x85ebca6bu;
  uint32_t h = hash32((uint32_t)i ^ key);
  if (i >> 32) h = hash32(h ^ (uint32_t)(i >> 32));
  int isSigned = types[t->type].isSigned;
  if (!reduces(t)) return isSigned ? (double)(h % 201) - 100 : h % 201;
  if (t->op == gcommProd) {
    if ((i + (size_t)rank) % (size_t)world.nranks == 0) return 2;
    return isSigned && (h & 1) ? -1 : 1;
  }
  if (types[t->type].size == 1 && types[t->type].isFloat) return (double)(h % 3) - 1;
  return isSigned ? (double)(h % 7) - 3 : h % 4;
}

/* Element i reduced over every rank's input, in the type's arithmetic. */
static double reducedValue(const Test* t, size_t i) {
  double acc = inputValue(t, 0, i);
  for (int q = 1; q < world.nranks; q++) {
    double v = inputValue(t, q, i);
    switch (t->op) {
      case gcommProd:
        acc *= v;
        break;
      case gcommMax:
        acc = v > acc ? v : acc;
        break;
      case gcommMin:
        acc = v < acc ? v : acc;
        break;
      default:
        acc += v;
        break;
    }
  }
  acc = toType(t->type, acc); /* integer wrap-around, before Avg's division */
  if (t->op != gcommAvg) return acc;
  if (types[t->type].isFloat) return acc / world.nranks;
  return (double)((int64_t)acc / world.nranks); /* integer division truncates */
}

/* In place of MPI's missing Avg, and of half/bfloat16: the element-wise post-division. */
static void divideByRanks(int type, void* buf, size_t count) {
  for (size_t i = 0; i < count; i++) {
    double v = loadValue(type, buf, i);
    if (types[type].isFloat) {
      storeValue(type, buf, i, v / world.nranks);
    } else if (types[type].isSigned) {
      storeValue(type, buf, i, (double)((int64_t)v / world.nranks));
    } else {
      storeValue(type, buf, i, (double)((uint64_t)v / (uint64_t)world.nranks));
    }
  }
}

/* ======================================================================================== */
/* Backends                                                                                 */
/* ======================================================================================== */

struct Backend {
  const char* name;
  int id;
  int (*onDevice)(void); /* buffers in device memory */
  void (*open)(void);    /* before its table */
  void (*close)(void);   /* after it */
  void (*describe)(char* buf, size_t n);
  void (*afterEach)(void); /* after each call: complete it, if it must be */
  void (*afterAll)(void);  /* after the timed calls are enqueued: complete them */
  void (*sync)(void);      /* every rank here, before a timed turn, by the library's own means */
  void* (*result)(const Test* t, void* send, void* recv); /* where this rank's result lies */
  int (*inPlaceBroken)(const Test* t); /* the library is known to fail it in place: N/A */
};

static void nothing(void) {}
static void mpiBarrier(void) {
  MPI_Barrier(MPI_COMM_WORLD);
}
static int never(const Test* t) {
  (void)t;
  return 0;
}
static void* resultInRecv(const Test* t, void* send, void* recv) {
  (void)t, (void)send;
  return recv;
}

/* ---- gcomm: a communicator over MPI_COMM_WORLD; on the host each call completes at gcommWait */

static gcommStream_t gcStream; /* NULL on host memory */

static int gcOnDevice(void) {
  return world.device >= 0;
}

static void gcOpen(void) {
  gcommConfig_t config = GCOMM_CONFIG_INITIALIZER;
  config.device = world.device >= 0 ? world.device : GCOMM_DEVICE_HOST;
  if (opt.proxyMode >= 0) config.proxyMode = opt.proxyMode;
  config.commName = "gcomm_perf";
  GC(gcommCommInitMPI(&gcComm, MPI_COMM_WORLD, &config));
#ifdef GCOMM_CUDA
  gcStream = world.device >= 0 ? (gcommStream_t)stream : NULL;
#endif
}

static void gcClose(void) {
  GC(gcommCommDestroy(gcComm));
  gcComm = NULL;
}

static const char* proxyDescription(void) {
  const char* env = getenv("GCOMM_PROXY_MODE");
  if (env && *env)
    return strcmp(env, "poll") == 0 ? "poll mode (GCOMM_PROXY_MODE)"
                                    : "proxy thread (GCOMM_PROXY_MODE)";
  if (opt.proxyMode >= 0) return opt.proxyMode == GCOMM_PROXY_POLL ? "poll mode" : "proxy thread";
  return "default progress (thread; polled where bound to one CPU)";
}

static void gcDescribe(char* buf, size_t n) {
  int v = 0;
  GC(gcommGetVersion(&v));
  snprintf(buf, n, "%s, %s, gcomm %d.%d.%d",
           world.device >= 0 ? "device memory, stream" : "host memory", proxyDescription(),
           v / 10000, v / 100 % 100, v % 100);
}

static void gcWaitHost(void) {
  if (gcStream == NULL) GC(gcommWait(gcComm, NULL));
}

static void gcWaitDevice(void) {
  if (gcStream != NULL) GC(gcommWait(gcComm, gcStream));
}

/* On the host, an all-reduce of one int, waited for: it runs gcomm's own path, as MPI_Barrier
 * runs MPI's before MPI's turn. Device turns are timed on the stream: an MPI barrier for both. */
static void gcSync(void) {
  int one = 1, sum = 0;
  if (gcStream != NULL) {
    MPI_Barrier(MPI_COMM_WORLD);
    return;
  }
  GC(gcommAllReduce(&one, &sum, 1, gcommInt32, gcommSum, gcComm, NULL));
  GC(gcommWait(gcComm, NULL));
}

#define GCT(t) ((gcommDataType_t)(t)->type)
#define GCO(t) ((gcommRedOp_t)(t)->op)

static void gcAllReduce(const Test* t, const void* s, void* r) {
  GC(gcommAllReduce(s, r, t->count, GCT(t), GCO(t), gcComm, gcStream));
}
static void gcBroadcast(const Test* t, const void* s, void* r) {
  GC(gcommBroadcast(s, r, t->count, GCT(t), t->root, gcComm, gcStream));
}
static void gcReduce(const Test* t, const void* s, void* r) {
  GC(gcommReduce(s, r, t->count, GCT(t), GCO(t), t->root, gcComm, gcStream));
}
static void gcAllGather(const Test* t, const void* s, void* r) {
  GC(gcommAllGather(s, r, t->count, GCT(t), gcComm, gcStream));
}
static void gcReduceScatter(const Test* t, const void* s, void* r) {
  GC(gcommReduceScatter(s, r, t->count, GCT(t), GCO(t), gcComm, gcStream));
}
static void gcAllToAll(const Test* t, const void* s, void* r) {
  GC(gcommAllToAll(s, r, t->count, GCT(t), gcComm, gcStream));
}
static void gcGather(const Test* t, const void* s, void* r) {
  GC(gcommGather(s, r, t->count, GCT(t), t->root, gcComm, gcStream));
}
static void gcScatter(const Test* t, const void* s, void* r) {
  GC(gcommScatter(s, r, t->count, GCT(t), t->root, gcComm, gcStream));
}
static void gcSendRecv(const Test* t, const void* s, void* r) {
  int next = (world.rank + 1) % world.nranks, prev = (world.rank + world.nranks - 1) % world.nranks;
  GC(gcommGroupStart());
  GC(gcommSend(s, t->count, GCT(t), next, gcComm, gcStream));
  GC(gcommRecv(r, t->count, GCT(t), prev, gcComm, gcStream));
  GC(gcommGroupEnd());
}

static const Backend gcommBackend = {.name = "gcomm",
                                     .id = BACKEND_GCOMM,
                                     .onDevice = gcOnDevice,
                                     .open = gcOpen,
                                     .close = gcClose,
                                     .describe = gcDescribe,
                                     .afterEach = gcWaitHost,
                                     .afterAll = gcWaitDevice,
                                     .sync = gcSync,
                                     .result = resultInRecv,
                                     .inPlaceBroken = never};

/* ---- MPI: the library's own collectives, blocking, on host memory ---- */

/* Half and bfloat16 are distinct duplicates of MPI_UINT16_T, fp8 of MPI_UINT8_T, reduced by user
 * ops that widen to float; MPI has no Avg: Sum, then the division, inside the timed call. */
static MPI_Datatype mpiHalf = MPI_DATATYPE_NULL, mpiBf16 = MPI_DATATYPE_NULL;
static MPI_Datatype mpiE4m3 = MPI_DATATYPE_NULL, mpiE5m2 = MPI_DATATYPE_NULL;
static MPI_Op mpiLowpOps[gcommAvg];

static void lowpApply(void* in, void* inout, const int* len, const MPI_Datatype* dt, int op) {
  int type = *dt == mpiBf16   ? gcommBfloat16
             : *dt == mpiE4m3 ? gcommFloat8e4m3
             : *dt == mpiE5m2 ? gcommFloat8e5m2
                              : gcommFloat16;
  for (int i = 0; i < *len; i++) {
    double a = loadValue(type, in, (size_t)i), b = loadValue(type, inout, (size_t)i);
    double v = op == gcommSum    ? a + b
               : op == gcommProd ? a * b
               : op == gcommMax  ? fmax(a, b)
                                 : fmin(a, b);
    storeValue(type, inout, (size_t)i, v);
  }
}
static void lowpSum(void* a, void* b, int* n, MPI_Datatype* dt) {
  lowpApply(a, b, n, dt, 0);
}
static void lowpProd(void* a, void* b, int* n, MPI_Datatype* dt) {
  lowpApply(a, b, n, dt, 1);
}
static void lowpMax(void* a, void* b, int* n, MPI_Datatype* dt) {
  lowpApply(a, b, n, dt, 2);
}
static void lowpMin(void* a, void* b, int* n, MPI_Datatype* dt) {
  lowpApply(a, b, n, dt, 3);
}

static int mpiOnDevice(void) {
  return 0;
}

static void mpiOpen(void) {
  MPI_User_function* fns[gcommAvg] = {lowpSum, lowpProd, lowpMax, lowpMin};
  MPI_Type_dup(MPI_UINT16_T, &mpiHalf);
  MPI_Type_dup(MPI_UINT16_T, &mpiBf16);
  MPI_Type_dup(MPI_UINT8_T, &mpiE4m3);
  MPI_Type_dup(MPI_UINT8_T, &mpiE5m2);
  for (int op = 0; op < gcommAvg; op++) MPI_Op_create(fns[op], 1, &mpiLowpOps[op]);
}

static void mpiClose(void) {
  for (int op = 0; op < gcommAvg; op++) MPI_Op_free(&mpiLowpOps[op]);
  MPI_Type_free(&mpiHalf);
  MPI_Type_free(&mpiBf16);
  MPI_Type_free(&mpiE4m3);
  MPI_Type_free(&mpiE5m2);
}

static void mpiDescribe(char* buf, size_t n) {
  char version[MPI_MAX_LIBRARY_VERSION_STRING], *out = version;
  int len = 0, space = 0;
  MPI_Get_library_version(version, &len);
  for (const char* p = version; *p && *p != '\n' && *p != ','; p++) { /* first line, one spaced */
    if (*p == ' ' || *p == '\t') {
      space = out != version;
    } else {
      if (space) *out++ = ' ';
      *out++ = *p, space = 0;
    }
  }
  *out = '\0';
  snprintf(buf, n, "host memory, %s", version);
}

static MPI_Datatype mpiType(int type) {
  switch (type) {
    case gcommInt8:
      return MPI_INT8_T;
    case gcommUint8:
      return MPI_UINT8_T;
    case gcommInt32:
      return MPI_INT32_T;
    case gcommUint32:
      return MPI_UINT32_T;
    case gcommInt64:
      return MPI_INT64_T;
    case gcommUint64:
      return MPI_UINT64_T;
    case gcommFloat16:
      return mpiHalf;
    case gcommFloat32:
      return MPI_FLOAT;
    case gcommFloat64:
      return MPI_DOUBLE;
    case gcommFloat8e4m3:
      return mpiE4m3;
    case gcommFloat8e5m2:
      return mpiE5m2;
    default:
      return mpiBf16;
  }
}

static MPI_Op mpiOp(const Test* t) {
  static const MPI_Op builtin[gcommNumOps] = {MPI_SUM, MPI_PROD, MPI_MAX, MPI_MIN, MPI_SUM};
  int op = t->op == gcommAvg ? gcommSum : t->op;
  if (types[t->type].isFloat && types[t->type].size < 4) return mpiLowpOps[op];
  return builtin[op];
}

static int mpiCount(const Test* t) {
  if (t->count > (size_t)INT32_MAX) die("count too large for MPI's int counts");
  return (int)t->count;
}

#define MPI_IN(t, s) ((t)->inPlace ? MPI_IN_PLACE : (s))

static void mpiAllReduce(const Test* t, const void* s, void* r) {
  MPI_Allreduce(MPI_IN(t, s), r, mpiCount(t), mpiType(t->type), mpiOp(t), MPI_COMM_WORLD);
  if (t->op == gcommAvg) divideByRanks(t->type, r, t->count);
}

/* Out of place, the root's send buffer is copied to its receive buffer, as NCCL does. */
static void mpiBroadcast(const Test* t, const void* s, void* r) {
  if (!t->inPlace && world.rank == t->root) memcpy(r, s, t->count * (size_t)types[t->type].size);
  MPI_Bcast(r, mpiCount(t), mpiType(t->type), t->root, MPI_COMM_WORLD);
}

static void mpiReduce(const Test* t, const void* s, void* r) {
  int root = world.rank == t->root;
  MPI_Reduce(root ? MPI_IN(t, s) : s, root ? r : NULL, mpiCount(t), mpiType(t->type), mpiOp(t),
             t->root, MPI_COMM_WORLD);
  if (root && t->op == gcommAvg) divideByRanks(t->type, r, t->count);
}

static void mpiAllGather(const Test* t, const void* s, void* r) {
  MPI_Datatype dt = mpiType(t->type);
  MPI_Allgather(MPI_IN(t, s), mpiCount(t), dt, r, mpiCount(t), dt, MPI_COMM_WORLD);
}

/* In place, MPI leaves this rank's block at the start of the buffer: see mpiResult. */
static void mpiReduceScatter(const Test* t, const void* s, void* r) {
  void* out = t->inPlace ? (void*)s : r;
  MPI_Reduce_scatter_block(MPI_IN(t, s), out, mpiCount(t), mpiType(t->type), mpiOp(t),
                           MPI_COMM_WORLD);
  if (t->op == gcommAvg) divideByRanks(t->type, out, t->count);
}

static void mpiAllToAll(const Test* t, const void* s, void* r) {
  MPI_Datatype dt = mpiType(t->type);
  MPI_Alltoall(MPI_IN(t, s), mpiCount(t), dt, r, mpiCount(t), dt, MPI_COMM_WORLD);
}

static void mpiGather(const Test* t, const void* s, void* r) {
  MPI_Datatype dt = mpiType(t->type);
  int root = world.rank == t->root;
  MPI_Gather(root ? MPI_IN(t, s) : s, mpiCount(t), dt, root ? r : NULL, mpiCount(t), dt, t->root,
             MPI_COMM_WORLD);
}

static void mpiScatter(const Test* t, const void* s, void* r) {
  MPI_Datatype dt = mpiType(t->type);
  int root = world.rank == t->root;
  MPI_Scatter(root ? s : NULL, mpiCount(t), dt, root && t->inPlace ? MPI_IN_PLACE : r, mpiCount(t),
              dt, t->root, MPI_COMM_WORLD);
}

static void mpiSendRecv(const Test* t, const void* s, void* r) {
  int next = (world.rank + 1) % world.nranks, prev = (world.rank + world.nranks - 1) % world.nranks;
  MPI_Datatype dt = mpiType(t->type);
  if (t->inPlace) {
    MPI_Sendrecv_replace(r, mpiCount(t), dt, next, 0, prev, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  } else {
    MPI_Sendrecv(s, mpiCount(t), dt, next, 0, r, mpiCount(t), dt, prev, 0, MPI_COMM_WORLD,
                 MPI_STATUS_IGNORE);
  }
}

static void* mpiResult(const Test* t, void* s, void* r) {
  return t->inPlace && t->coll->run[BACKEND_MPI] == mpiReduceScatter ? s : r;
}

/* MPICH 4.0 and 4.1 crash in an in-place MPI_Reduce whose root is not 0 (pmodels/mpich#6540). */
static int mpiInPlaceBroken(const Test* t) {
#if defined(MPICH_NUMVERSION) && MPICH_NUMVERSION >= 40000000 && MPICH_NUMVERSION < 40200000
  return t->coll->run[BACKEND_MPI] == mpiReduce && t->root != 0;
#else
  (void)t;
  return 0;
#endif
}

static const Backend mpiBackend = {.name = "mpi",
                                   .id = BACKEND_MPI,
                                   .onDevice = mpiOnDevice,
                                   .open = mpiOpen,
                                   .close = mpiClose,
                                   .describe = mpiDescribe,
                                   .afterEach = nothing,
                                   .afterAll = nothing,
                                   .sync = mpiBarrier,
                                   .result = mpiResult,
                                   .inPlaceBroken = mpiInPlaceBroken};

/* ---- NCCL: ncclCommInitRank with the id broadcast over MPI, device buffers, one stream ---- */

#ifdef GCOMM_PERF_NCCL
static ncclComm_t ncComm;

#define NC(call) ncCheck((call), #call)
static void ncCheck(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) die("%s: %s", what, ncclGetErrorString(r));
}

static int ncOnDevice(void) {
  return 1;
}

static void ncOpen(void) {
  ncclUniqueId id;
  if (world.rank == 0) NC(ncclGetUniqueId(&id));
  MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
  NC(ncclCommInitRank(&ncComm, world.nranks, id, world.rank));
}

static void ncClose(void) {
  NC(ncclCommDestroy(ncComm));
}

static void ncDescribe(char* buf, size_t n) {
  int v = 0;
  NC(ncclGetVersion(&v));
  snprintf(buf, n, "device memory, stream, NCCL %d.%d.%d", v / 10000, v / 100 % 100, v % 100);
}

static void ncSync(void) {
  CU(cudaStreamSynchronize(stream));
}

/* gcomm's type and op enums number their members as NCCL's do. */
#define NCT(t) ((ncclDataType_t)(t)->type)
#define NCO(t) ((ncclRedOp_t)(t)->op)

static void ncAllReduce(const Test* t, const void* s, void* r) {
  NC(ncclAllReduce(s, r, t->count, NCT(t), NCO(t), ncComm, stream));
}
static void ncBroadcast(const Test* t, const void* s, void* r) {
  NC(ncclBroadcast(s, r, t->count, NCT(t), t->root, ncComm, stream));
}
static void ncReduce(const Test* t, const void* s, void* r) {
  NC(ncclReduce(s, r, t->count, NCT(t), NCO(t), t->root, ncComm, stream));
}
static void ncAllGather(const Test* t, const void* s, void* r) {
  NC(ncclAllGather(s, r, t->count, NCT(t), ncComm, stream));
}
static void ncReduceScatter(const Test* t, const void* s, void* r) {
  NC(ncclReduceScatter(s, r, t->count, NCT(t), NCO(t), ncComm, stream));
}
static void ncSendRecv(const Test* t, const void* s, void* r) {
  int next = (world.rank + 1) % world.nranks, prev = (world.rank + world.nranks - 1) % world.nranks;
  NC(ncclGroupStart());
  NC(ncclSend(s, t->count, NCT(t), next, ncComm, stream));
  NC(ncclRecv(r, t->count, NCT(t), prev, ncComm, stream));
  NC(ncclGroupEnd());
}

#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
static void ncAllToAll(const Test* t, const void* s, void* r) {
  NC(ncclAlltoAll(s, r, t->count, NCT(t), ncComm, stream));
}
static void ncGather(const Test* t, const void* s, void* r) {
  NC(ncclGather(s, r, t->count, NCT(t), t->root, ncComm, stream));
}
static void ncScatter(const Test* t, const void* s, void* r) {
  NC(ncclScatter(s, r, t->count, NCT(t), t->root, ncComm, stream));
}
#else /* before 2.28: grouped sends and receives, as nccl-tests does */
static void ncAllToAll(const Test* t, const void* s, void* r) {
  size_t bytes = t->count * (size_t)types[t->type].size;
  NC(ncclGroupStart());
  for (int p = 0; p < world.nranks; p++) {
    NC(ncclSend((const char*)s + p * bytes, t->count, NCT(t), p, ncComm, stream));
    NC(ncclRecv((char*)r + p * bytes, t->count, NCT(t), p, ncComm, stream));
  }
  NC(ncclGroupEnd());
}
static void ncGather(const Test* t, const void* s, void* r) {
  size_t bytes = t->count * (size_t)types[t->type].size;
  NC(ncclGroupStart());
  NC(ncclSend(s, t->count, NCT(t), t->root, ncComm, stream));
  for (int p = 0; world.rank == t->root && p < world.nranks; p++)
    NC(ncclRecv((char*)r + p * bytes, t->count, NCT(t), p, ncComm, stream));
  NC(ncclGroupEnd());
}
static void ncScatter(const Test* t, const void* s, void* r) {
  size_t bytes = t->count * (size_t)types[t->type].size;
  NC(ncclGroupStart());
  for (int p = 0; world.rank == t->root && p < world.nranks; p++)
    NC(ncclSend((const char*)s + p * bytes, t->count, NCT(t), p, ncComm, stream));
  NC(ncclRecv(r, t->count, NCT(t), t->root, ncComm, stream));
  NC(ncclGroupEnd());
}
#endif

static const Backend ncclBackend = {.name = "nccl",
                                    .id = BACKEND_NCCL,
                                    .onDevice = ncOnDevice,
                                    .open = ncOpen,
                                    .close = ncClose,
                                    .describe = ncDescribe,
                                    .afterEach = nothing,
                                    .afterAll = ncSync,
                                    .sync = mpiBarrier,
                                    .result = resultInRecv,
                                    .inPlaceBroken = never};
#define NCCL_RUN(fn) fn
#else
#define NCCL_RUN(fn) NULL
#endif

static const Backend* backendOf(int id) {
  switch (id) {
    case BACKEND_GCOMM:
      return &gcommBackend;
    case BACKEND_MPI:
      return &mpiBackend;
#ifdef GCOMM_PERF_NCCL
    case BACKEND_NCCL:
      return &ncclBackend;
#endif
    default:
      return NULL;
  }
}

/* ======================================================================================== */
/* The vector collectives                                                                   */
/* ======================================================================================== */

/* Blocks as in allgather, alltoall, gather and scatter (block j at j * base, base = the count
 * column), each only partly used: rank `from` sends rank `to` vCount(from, to) elements, and in
 * allgatherv, gatherv and scatterv rank j's block holds vCount(j, j). Random (--vcounts random):
 * 0..base, zeros included; skewed: every pair with rank 0 moves base, the others base/8. The
 * size column stays the buffers' (nccl-tests' alltoall size): the bandwidth columns count the
 * whole blocks, so compare the times. NCCL has no vector collectives: its runners are the
 * grouped ncclSend/ncclRecv pattern an NCCL code writes instead. */
static size_t vCount(const Test* t, int from, int to) {
  if (opt.vskewed) return from == 0 || to == 0 ? t->count : t->count / 8;
  return hash32((uint32_t)from * 7919u + (uint32_t)to * 104729u + (uint32_t)t->count) %
         (t->count + 1);
}

/* The counts and displacements of t's call on this rank, as size_t (gcomm) and int (MPI): what it
 * sends each rank (send), receives from each (recv), each rank's own block (own), and where
 * block j starts (displ). Kept for the next call of the same count. */
static struct {
  size_t count;
  int vskewed, ready;
  size_t *send, *recv, *own, *displ;
  int *isend, *irecv, *iown, *idispl;
} va;

static void vArrays(const Test* t) {
  int n = world.nranks, me = world.rank;
  if (va.ready && va.count == t->count) return;
  if (!va.ready) {
    va.send = malloc(4 * (size_t)n * sizeof(size_t));
    va.isend = malloc(4 * (size_t)n * sizeof(int));
    if (va.send == NULL || va.isend == NULL) die("out of host memory");
    va.recv = va.send + n, va.own = va.send + 2 * n, va.displ = va.send + 3 * n;
    va.irecv = va.isend + n, va.iown = va.isend + 2 * n, va.idispl = va.isend + 3 * n;
  }
  if ((size_t)n * t->count > (size_t)INT32_MAX) die("count too large for MPI's int counts");
  for (int j = 0; j < n; j++) {
    va.send[j] = vCount(t, me, j), va.recv[j] = vCount(t, j, me), va.own[j] = vCount(t, j, j);
    va.displ[j] = (size_t)j * t->count;
    va.isend[j] = (int)va.send[j], va.irecv[j] = (int)va.recv[j], va.iown[j] = (int)va.own[j];
    va.idispl[j] = (int)va.displ[j];
  }
  va.count = t->count, va.ready = 1;
}

static void gcAllGatherV(const Test* t, const void* s, void* r) {
  vArrays(t);
  GC(gcommAllGatherV(s, va.own[world.rank], r, va.own, va.displ, GCT(t), gcComm, gcStream));
}
static void gcAllToAllV(const Test* t, const void* s, void* r) {
  vArrays(t);
  GC(gcommAllToAllV(s, va.send, va.displ, r, va.recv, va.displ, GCT(t), gcComm, gcStream));
}
static void gcGatherV(const Test* t, const void* s, void* r) {
  vArrays(t);
  GC(gcommGatherV(s, va.own[world.rank], r, va.own, va.displ, GCT(t), t->root, gcComm, gcStream));
}
static void gcScatterV(const Test* t, const void* s, void* r) {
  vArrays(t);
  GC(gcommScatterV(s, va.own, va.displ, r, va.own[world.rank], GCT(t), t->root, gcComm, gcStream));
}

static void mpiAllGatherV(const Test* t, const void* s, void* r) {
  MPI_Datatype dt = mpiType(t->type);
  vArrays(t);
  MPI_Allgatherv(MPI_IN(t, s), va.iown[world.rank], dt, r, va.iown, va.idispl, dt, MPI_COMM_WORLD);
}
static void mpiAllToAllV(const Test* t, const void* s, void* r) {
  MPI_Datatype dt = mpiType(t->type);
  vArrays(t);
  MPI_Alltoallv(s, va.isend, va.idispl, dt, r, va.irecv, va.idispl, dt, MPI_COMM_WORLD);
}
static void mpiGatherV(const Test* t, const void* s, void* r) {
  MPI_Datatype dt = mpiType(t->type);
  int root = world.rank == t->root;
  vArrays(t);
  MPI_Gatherv(root ? MPI_IN(t, s) : s, va.iown[world.rank], dt, r, va.iown, va.idispl, dt, t->root,
              MPI_COMM_WORLD);
}
static void mpiScatterV(const Test* t, const void* s, void* r) {
  MPI_Datatype dt = mpiType(t->type);
  int root = world.rank == t->root;
  vArrays(t);
  MPI_Scatterv(s, va.iown, va.idispl, dt, root && t->inPlace ? MPI_IN_PLACE : r,
               va.iown[world.rank], dt, t->root, MPI_COMM_WORLD);
}

/* Whether the call writes element i of this rank's result: all of it, except in the vector
 * collectives, which write only the first vCount elements of each block. */
static int vDefined(const Test* t, size_t i) {
  RunFn run = t->coll->run[BACKEND_GCOMM];
  int me = world.rank, j = t->count ? (int)(i / t->count) : 0;
  size_t k = t->count ? i % t->count : 0;
  if (run == gcAllGatherV || run == gcGatherV) return k < vCount(t, j, j);
  if (run == gcAllToAllV) return k < vCount(t, j, me);
  if (run == gcScatterV) return i < vCount(t, me, me);
  return 1;
}

#ifdef GCOMM_PERF_NCCL
/* One group: to every rank p scount[p] elements from s (sFromStart) or from block p of s, and from
 * every rank rcount[p] into r (rFromStart) or block p of r; empty ones left out. */
static void ncGrouped(const Test* t, const void* s, const size_t* scount, int sFromStart, void* r,
                      const size_t* rcount, int rFromStart) {
  size_t ts = (size_t)types[t->type].size;
  NC(ncclGroupStart());
  for (int p = 0; p < world.nranks; p++) {
    const char* from = (const char*)s + (sFromStart ? 0 : va.displ[p] * ts);
    char* to = (char*)r + (rFromStart ? 0 : va.displ[p] * ts);
    if (scount[p] > 0) NC(ncclSend(from, scount[p], NCT(t), p, ncComm, stream));
    if (rcount[p] > 0) NC(ncclRecv(to, rcount[p], NCT(t), p, ncComm, stream));
  }
  NC(ncclGroupEnd());
}
/* this rank's own block to every rank (all) or to root only; static zeros for "nothing" */
static const size_t* ncOwnTo(int all, int root) {
  static size_t mine[64], zeros[64];
  if (world.nranks > 64) die("the vector collectives on NCCL: at most 64 ranks");
  for (int p = 0; p < world.nranks; p++)
    mine[p] = all || p == root ? va.own[world.rank] : 0, zeros[p] = 0;
  return root == -2 ? zeros : mine;
}
static void ncAllGatherV(const Test* t, const void* s, void* r) {
  vArrays(t);
  ncGrouped(t, s, ncOwnTo(1, -1), 1, r, va.own, 0);
}
static void ncAllToAllV(const Test* t, const void* s, void* r) {
  vArrays(t);
  ncGrouped(t, s, va.send, 0, r, va.recv, 0);
}
static void ncGatherV(const Test* t, const void* s, void* r) {
  int isRoot = world.rank == t->root;
  vArrays(t);
  ncGrouped(t, s, ncOwnTo(0, t->root), 1, r, isRoot ? va.own : ncOwnTo(0, -2), 0);
}
static void ncScatterV(const Test* t, const void* s, void* r) {
  int isRoot = world.rank == t->root;
  vArrays(t);
  ncGrouped(t, s, isRoot ? va.own : ncOwnTo(0, -2), 0, r, ncOwnTo(0, t->root), 1);
}
#endif

/* ======================================================================================== */
/* The collectives                                                                          */
/* ======================================================================================== */

static double factorOne(int n) {
  (void)n;
  return 1;
}
static double factorAllReduce(int n) {
  return 2.0 * (n - 1) / n;
}
static double factorGather(int n) {
  return (double)(n - 1) / n;
}

static double expAllReduce(const Test* t, size_t i) {
  return reducedValue(t, i);
}
static double expBroadcast(const Test* t, size_t i) {
  return inputValue(t, t->root, i);
}
static double expAllGather(const Test* t, size_t i) {
  return inputValue(t, (int)(i / t->count), i % t->count);
}
static double expReduceScatter(const Test* t, size_t i) {
  return reducedValue(t, (size_t)world.rank * t->count + i);
}
static double expScatter(const Test* t, size_t i) {
  return inputValue(t, t->root, (size_t)world.rank * t->count + i);
}
static double expAllToAll(const Test* t, size_t i) {
  return inputValue(t, (int)(i / t->count), (size_t)world.rank * t->count + i % t->count);
}
static double expSendRecv(const Test* t, size_t i) {
  return inputValue(t, (world.rank + world.nranks - 1) % world.nranks, i);
}

#define B(id) (1u << (id))

/* In-place AllToAll is MPI_IN_PLACE's: the result is the out-of-place one. */
/* clang-format off */
static const Coll collectives[] = {
/*   name             shape           red root rootIn rootOut inPlaceUndef noInPlace
 *   busFactor        expect            runners: gcomm, MPI, NCCL */
    {"allreduce",     SHAPE_SAME,     1,  0,   0,     0,      0,           0,
     factorAllReduce, expAllReduce,     {gcAllReduce, mpiAllReduce, NCCL_RUN(ncAllReduce)}},
    {"broadcast",     SHAPE_SAME,     0,  1,   1,     0,      0,           0,
     factorOne,       expBroadcast,     {gcBroadcast, mpiBroadcast, NCCL_RUN(ncBroadcast)}},
    {"reduce",        SHAPE_SAME,     1,  1,   0,     1,      0,           0,
     factorOne,       expAllReduce,     {gcReduce, mpiReduce, NCCL_RUN(ncReduce)}},
    {"allgather",     SHAPE_GATHER,   0,  0,   0,     0,      0,           0,
     factorGather,    expAllGather,     {gcAllGather, mpiAllGather, NCCL_RUN(ncAllGather)}},
    {"reducescatter", SHAPE_SCATTER,  1,  0,   0,     0,      0,           0,
     factorGather,    expReduceScatter, {gcReduceScatter, mpiReduceScatter,
                                         NCCL_RUN(ncReduceScatter)}},
    {"alltoall",      SHAPE_ALLTOALL, 0,  0,   0,     0,      0,           0,
     factorGather,    expAllToAll,      {gcAllToAll, mpiAllToAll, NCCL_RUN(ncAllToAll)}},
    {"gather",        SHAPE_GATHER,   0,  1,   0,     1,      0,           0,
     factorGather,    expAllGather,     {gcGather, mpiGather, NCCL_RUN(ncGather)}},
    {"scatter",       SHAPE_SCATTER,  0,  1,   1,     0,      0,           0,
     factorGather,    expScatter,       {gcScatter, mpiScatter, NCCL_RUN(ncScatter)}},
    {"sendrecv",      SHAPE_SAME,     0,  0,   0,     0,      1,           0,
     factorOne,       expSendRecv,      {gcSendRecv, mpiSendRecv, NCCL_RUN(ncSendRecv)}},
    {"allgatherv",    SHAPE_GATHER,   0,  0,   0,     0,      0,           B(BACKEND_NCCL),
     factorGather,    expAllGather,     {gcAllGatherV, mpiAllGatherV, NCCL_RUN(ncAllGatherV)}},
    {"alltoallv",     SHAPE_ALLTOALL, 0,  0,   0,     0,      1,           ~0u,
     factorGather,    expAllToAll,      {gcAllToAllV, mpiAllToAllV, NCCL_RUN(ncAllToAllV)}},
    {"gatherv",       SHAPE_GATHER,   0,  1,   0,     1,      0,           B(BACKEND_NCCL),
     factorGather,    expAllGather,     {gcGatherV, mpiGatherV, NCCL_RUN(ncGatherV)}},
    {"scatterv",      SHAPE_SCATTER,  0,  1,   1,     0,      0,           B(BACKEND_NCCL),
     factorGather,    expScatter,       {gcScatterV, mpiScatterV, NCCL_RUN(ncScatterV)}},
};
/* clang-format on */
#define NUM_COLLS ((int)(sizeof(collectives) / sizeof(collectives[0])))

/* ======================================================================================== */
/* The harness                                                                              */
/* ======================================================================================== */

/* Host scratch, maxBytes each: the contents to upload, then the result read back; what the
 * receive region held before the call; the expected result. */
static unsigned char *stage, *before, *want;

/* Counts and offsets for a size in bytes, as nccl-tests' GetCollByteCount. */
static void sizeTest(Test* t, size_t bytes) {
  size_t ts = (size_t)types[t->type].size, n = (size_t)world.nranks, r = (size_t)world.rank;
  size_t count = bytes / ts, base = (count / n) & ~(16 / ts - 1);
  t->sendOffset = t->recvOffset = 0;
  switch (t->coll->shape) {
    case SHAPE_SAME:
      t->count = t->sendCount = t->recvCount = count;
      break;
    case SHAPE_GATHER:
      t->count = t->sendCount = base, t->recvCount = n * base, t->sendOffset = r * base;
      break;
    case SHAPE_SCATTER:
      t->count = t->recvCount = base, t->sendCount = n * base, t->recvOffset = r * base;
      break;
    case SHAPE_ALLTOALL:
      t->count = base, t->sendCount = t->recvCount = n * base;
      break;
  }
}

static size_t largestBytes(const Test* t) {
  size_t c = t->sendCount > t->recvCount ? t->sendCount : t->recvCount;
  return c * (size_t)types[t->type].size;
}

/* The pointers of iteration iter. Like nccl-tests, each iteration moves to the next slice of the
 * maxBytes buffers, so that small sizes do not always run from cache. */
static void testPointers(const Test* t, int iter, void** send, void** recv) {
  size_t ts = (size_t)types[t->type].size, total = largestBytes(t);
  size_t steps = total ? opt.maxBytes / total : 1;
  size_t shift = total * ((size_t)iter % (steps ? steps : 1));
  char* r = (char*)t->recvBuf + shift;
  *send = t->inPlace ? r + t->sendOffset * ts : (char*)t->sendBuf + shift;
  *recv = r + t->recvOffset * ts;
}

static void launch(const Test* t, int iter) {
  void *send, *recv;
  testPointers(t, iter, &send, &recv);
  t->coll->run[t->be->id](t, send, recv);
}

/* Uploads this rank's input and poisons what the call writes; keeps in `before` what the
 * receive region holds before the call. Ranks that give no input send poison too. */
static void fillBuffers(Test* t, unsigned seed) {
  size_t ts = (size_t)types[t->type].size, inputAt = t->inPlace ? t->sendOffset : 0;
  size_t extent = t->recvOffset + t->recvCount; /* elements of the receive buffer in use */
  int dev = t->be->onDevice(), hasInput = !t->coll->rootInputOnly || world.rank == t->root;
  t->seed = seed;
  if (t->inPlace && t->sendOffset + t->sendCount > extent) extent = t->sendOffset + t->sendCount;
  memset(stage, 0xa5, extent * ts);
  if (!t->inPlace) {
    bufUpload(dev, t->recvBuf, stage, extent * ts);
    memset(stage, 0xa5, t->sendCount * ts);
  }
  for (size_t i = 0; hasInput && i < t->sendCount; i++)
    storeValue(t->type, stage + inputAt * ts, i, inputValue(t, world.rank, i));
  if (t->inPlace) {
    bufUpload(dev, t->recvBuf, stage, extent * ts);
    memcpy(before, stage + t->recvOffset * ts, t->recvCount * ts);
  } else {
    bufUpload(dev, t->sendBuf, stage, t->sendCount * ts);
    memset(before, 0xa5, t->recvCount * ts);
  }
}

/* This rank's expected result, computed once for every backend and both modes. */
static const unsigned char* expectedResult(const Test* t) {
  static Test last;
  if (last.coll != t->coll || last.type != t->type || last.op != t->op || last.root != t->root ||
      last.count != t->count || last.seed != t->seed) {
    for (size_t i = 0; i < t->recvCount; i++) storeValue(t->type, want, i, t->coll->expect(t, i));
    last = *t;
  }
  return want;
}

/* Wrong elements of this rank's receive region: the result, or where the call gives this rank
 * none, what the region held before. Avg in floating point may round either way (gcomm divides
 * in float, we in double), so it gets a tolerance; everything else is exact. */
static long long countWrong(const Test* t) {
  size_t ts = (size_t)types[t->type].size, wrong = 0;
  int tolerant = reduces(t) && t->op == gcommAvg && types[t->type].isFloat;
  int none = t->coll->rootResultOnly && world.rank != t->root;
  const unsigned char* expected = none ? before : expectedResult(t);
  double tol = 8 * 3 * types[t->type].eps;
  void *send, *recv;
  testPointers(t, 0, &send, &recv);
  bufDownload(t->be->onDevice(), stage, t->be->result(t, send, recv), t->recvCount * ts);
  if (memcmp(stage, expected, t->recvCount * ts) == 0) return 0;
  for (size_t i = 0; i < t->recvCount; i++) {
    if (memcmp(stage + i * ts, expected + i * ts, ts) == 0) continue;
    if (!none && !vDefined(t, i)) continue;
    if (tolerant && fabs(loadValue(t->type, stage, i) - loadValue(t->type, expected, i)) <= tol)
      continue;
    wrong++;
  }
  return (long long)wrong;
}

/* Across ranks, as nccl-tests' -a: 0 rank 0's, 1 the mean, 2 the min, 3 the max. */
static double aggregateTime(double sec) {
  static const MPI_Op ops[4] = {MPI_SUM, MPI_SUM, MPI_MIN, MPI_MAX};
  if (opt.average == 0) {
    MPI_Bcast(&sec, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    return sec;
  }
  MPI_Allreduce(MPI_IN_PLACE, &sec, 1, MPI_DOUBLE, ops[opt.average], MPI_COMM_WORLD);
  return opt.average == 1 ? sec / world.nranks : sec;
}

/* One backend's table of a collective: its text and its totals. Only rank 0 keeps text, as only
 * it prints. The first table of a collective is printed as it is measured, as with one backend;
 * the others are kept until the collective's sweep is done, so that each still prints whole. */
typedef struct {
  char* text;
  size_t len, cap;
  int live; /* printed as it comes, not kept */
  double bwSum;
  int bwCount, errors;
} Table;

/* Adds to a table as printf would: printed now when live, else kept. */
static void tableAdd(Table* table, const char* fmt, ...) {
  va_list ap, again;
  int n;
  if (world.rank != 0) return;
  va_start(ap, fmt);
  if (table->live) {
    vprintf(fmt, ap);
    va_end(ap);
    return;
  }
  va_copy(again, ap);
  n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (n < 0) die("cannot format a line of a table");
  if (table->len + (size_t)n + 1 > table->cap) {
    table->cap = 2 * (table->len + (size_t)n + 1);
    table->text = realloc(table->text, table->cap);
    if (table->text == NULL) die("out of host memory");
  }
  vsnprintf(table->text + table->len, table->cap - table->len, fmt, again);
  va_end(again);
  table->len += (size_t)n;
}

/* Prints what was kept of a table, and lets go of it. */
static void printTable(Table* table) {
  if (table->text) fputs(table->text, stdout);
  free(table->text);
  table->text = NULL, table->len = table->cap = 0;
}

/* A backend taking part in a collective's sweep: its buffers and its table. */
typedef struct {
  const Backend* be;
  void *sendBuf, *recvBuf;
  Table table;
} Lane;

/* nccl-tests' number format: the most decimals (2, 1, 0) that fit the width, else exponent. */
static void formatNumber(char* out, int width, double v) {
  if (snprintf(out, (size_t)width + 1, "%*.2f", width, v) <= width) return;
  if (snprintf(out, (size_t)width + 1, "%*.1f", width, v) <= width) return;
  if (snprintf(out, (size_t)width + 1, "%*.0f", width, v) <= width) return;
  snprintf(out, (size_t)width + 1, width >= 7 ? "%*.1e" : "%*.0e", width, v);
}

/* Points the test at a lane's backend and buffers, in or out of place. Returns 0 when that
 * backend has no in-place form of the collective (its table says N/A). */
static int useLane(Test* t, const Lane* lane, int inPlace) {
  t->be = lane->be, t->sendBuf = lane->sendBuf, t->recvBuf = lane->recvBuf, t->inPlace = inPlace;
  return !(inPlace && ((t->coll->noInPlace & B(t->be->id)) || t->be->inPlaceBroken(t)));
}

/* The turns each backend's iterations are timed in (-R; 4 with several backends, else 1). */
static int roundsOf(int nlanes) {
  int rounds = opt.rounds ? opt.rounds : nlanes > 1 ? 4 : 1;
  return rounds < opt.iters ? rounds : opt.iters;
}

/* Seconds per iteration of each lane that runs (sec[l] < 0: it does not), every rank's time
 * aggregated as -a says. With several backends the iterations are timed in turns: roundsOf
 * rounds, each giving every backend its share of opt.iters in a row, so that a shared or
 * virtual machine whose speed changes within a second (adjacent runs of one build here differed
 * up to 2x) slows or speeds every backend alike. Each backend warms up first, and each turn starts
 * after a pause that lets the previous backend's own threads settle (gcomm's progress thread
 * backs off for up to 2 ms after its last operation): what one backend leaves running is not
 * timed as the next one's. The ranks then meet by the backend's own means (sync: MPI's barrier,
 * gcomm's one-int all-reduce on the host), so that the last call before the timer starts is the
 * timed library's own and leaves its code and data as warm as the other's: after MPI_Barrier and
 * a 3 ms pause, gcomm's first 8-byte broadcast on 2 ranks of a 2-vCPU machine took 3-4 us and
 * MPI's 1; after gcomm's all-reduce, the reverse. */
static void timeLanes(Test* t, Lane* lanes, int nlanes, int inPlace, double* sec) {
  int rounds = roundsOf(nlanes);
  for (int l = 0; l < nlanes; l++) {
    sec[l] = useLane(t, &lanes[l], inPlace) ? 0.0 : -1.0;
    if (sec[l] < 0) continue;
    for (int i = 0; i < opt.warmup; i++) launch(t, i), t->be->afterEach();
    t->be->afterAll();
  }
  for (int r = 0; r < rounds; r++) {
    int first = opt.iters * r / rounds, last = opt.iters * (r + 1) / rounds;
    for (int l = 0; l < nlanes; l++) {
      Timer tm = {0, 0.0};
      if (sec[l] < 0) continue;
      useLane(t, &lanes[l], inPlace);
      if (nlanes > 1) {
        struct timespec pause = {0, 3000000};
        nanosleep(&pause, NULL);
      }
      t->be->sync();
      timerStart(&tm, t->be->onDevice());
      for (int i = first; i < last; i++) launch(t, i), t->be->afterEach();
      timerMark(&tm);
      t->be->afterAll();
      sec[l] += timerSeconds(&tm);
    }
  }
  for (int l = 0; l < nlanes; l++)
    if (sec[l] >= 0) sec[l] = aggregateTime(sec[l] / opt.iters);
}

/* One half of a row of one backend (out of place or in place): seconds per iteration (negative:
 * not run), bandwidths, and the wrong elements over all ranks (negative: not checked). */
typedef struct {
  double sec, algBw, busBw;
  long long wrong;
} Result;

/* Checks a lane's result, timed at sec seconds per iteration, and adds it to the lane's totals. */
static Result measure(Test* t, Lane* lane, int inPlace, double sec) {
  Result res = {sec, 0.0, 0.0, -1};
  int checked = opt.check > 0 && !(inPlace && t->coll->inPlaceUndefined);
  if (sec < 0) return res;
  useLane(t, lane, inPlace);
  res.algBw = (double)largestBytes(t) / 1.0e9 / sec;
  res.busBw = res.algBw * t->coll->busFactor(world.nranks);
  if (checked) res.wrong = 0;
  for (int c = 0; checked && c < opt.check && res.wrong == 0; c++) {
    long long mine;
    fillBuffers(t, (unsigned)c + 1);
    launch(t, 0), t->be->afterEach(), t->be->afterAll();
    mine = countWrong(t);
    lane->table.errors += mine != 0;
    MPI_Allreduce(&mine, &res.wrong, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
  }
  lane->table.bwSum += res.busBw;
  lane->table.bwCount++;
  return res;
}

/* nccl-tests' cells of one half of a row: time, algbw, busbw, #wrong. */
static void addCells(Table* table, const Result* res) {
  char timeStr[16], algStr[16], busStr[16];
  if (res->sec < 0) {
    tableAdd(table, "  %7s  %6s  %6s    N/A", "N/A", "N/A", "N/A");
    return;
  }
  formatNumber(timeStr, 7, res->sec * 1e6);
  formatNumber(algStr, 6, res->algBw);
  formatNumber(busStr, 6, res->busBw);
  if (res->wrong >= 0) {
    tableAdd(table, "  %7s  %6s  %6s  %6g", timeStr, algStr, busStr, (double)res->wrong);
  } else {
    tableAdd(table, "  %7s  %6s  %6s    N/A", timeStr, algStr, busStr);
  }
}

/* The side-by-side cells of one half of a row: every backend's time, then every backend's busbw,
 * then each other backend's time over the first one's, then the wrong elements of them all. */
static void addSideBySide(Table* table, const Result* res, int nlanes) {
  char str[16];
  long long wrong = -1;
  for (int l = 0; l < nlanes; l++) {
    if (res[l].sec < 0)
      snprintf(str, sizeof(str), "N/A");
    else
      formatNumber(str, 8, res[l].sec * 1e6);
    tableAdd(table, " %8s", str);
  }
  for (int l = 0; l < nlanes; l++) {
    if (res[l].sec < 0)
      snprintf(str, sizeof(str), "N/A");
    else
      formatNumber(str, 7, res[l].busBw);
    tableAdd(table, " %7s", str);
  }
  for (int l = 1; l < nlanes; l++) {
    if (res[l].sec < 0 || res[0].sec <= 0)
      snprintf(str, sizeof(str), "N/A");
    else
      snprintf(str, sizeof(str), "%6.2f", res[l].sec / res[0].sec);
    tableAdd(table, " %6s", str);
  }
  for (int l = 0; l < nlanes; l++)
    if (res[l].wrong >= 0) wrong = (wrong < 0 ? 0 : wrong) + res[l].wrong;
  if (wrong >= 0)
    tableAdd(table, " %6lld", wrong);
  else
    tableAdd(table, " %6s", "N/A");
}

/* Whether the backends share one table (several, without --separate). */
static int sideBySide(int nlanes) {
  return nlanes > 1 && !opt.separate;
}

static size_t nextSize(size_t size) {
  if (opt.stepFactor > 1) return size ? size * opt.stepFactor : 1;
  return size + opt.stepBytes;
}

/* Every size for one type, op and root: one row in each lane's table, or one row side by side.
 * The backends take turns size by size (out of place, then in place), and within each in rounds
 * (timeLanes), rather than one backend's whole sweep after another's: a shared or virtual machine
 * drifts, so that rows measured seconds apart compare unfairly either way, while adjacent
 * measurements share its state. */
static void sweep(Test* t, Lane* lanes, int nlanes) {
  char root[16];
  int tables = sideBySide(nlanes) ? 1 : nlanes;
  snprintf(root, sizeof(root), "%6i", t->coll->rooted ? t->root : -1);
  for (size_t size = opt.minBytes; size <= opt.maxBytes; size = nextSize(size)) {
    sizeTest(t, size);
    for (int l = 0; l < tables; l++)
      tableAdd(&lanes[l].table, "%12zu  %12zu  %8s  %6s  %6s", largestBytes(t), t->count,
               types[t->type].name, reduces(t) ? opNames[t->op] : "none", root);
    for (int inPlace = 0; inPlace <= 1; inPlace++) {
      double sec[NUM_BACKENDS];
      Result res[NUM_BACKENDS];
      timeLanes(t, lanes, nlanes, inPlace, sec);
      for (int l = 0; l < nlanes; l++) res[l] = measure(t, &lanes[l], inPlace, sec[l]);
      if (tables == 1 && nlanes > 1)
        addSideBySide(&lanes[0].table, res, nlanes);
      else
        for (int l = 0; l < nlanes; l++) addCells(&lanes[l].table, &res[l]);
    }
    for (int l = 0; l < tables; l++) tableAdd(&lanes[l].table, "\n");
  }
}

/* The header of lanes[self]'s table. With several backends it names the others, measured in
 * turn with this one (see sweep), which tells such tables from those of a backend run alone. */
static void addTableHeader(Lane* lanes, int nlanes, int self, const Coll* coll) {
  Table* table = &lanes[self].table;
  const Backend* be = lanes[self].be;
  char description[512];
  be->describe(description, sizeof(description));
  tableAdd(table, "#\n# Collective: %s\n# Backend: %s (%s)\n", coll->name, be->name, description);
  if (nlanes > 1) {
    const char* separator = " ";
    tableAdd(table, "# Measured interleaved with:");
    for (int l = 0; l < nlanes; l++) {
      if (l == self) continue;
      tableAdd(table, "%s%s", separator, lanes[l].be->name);
      separator = ", ";
    }
    tableAdd(table, " (in %d rounds)\n", roundsOf(nlanes));
  }
  tableAdd(table, "#\n");
  tableAdd(table,
           "# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place"
           "          \n",
           "", "", "", "", "");
  tableAdd(table, "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s %*s\n",
           "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time",
           "algbw", "busbw", "#wrong", 0, "");
  tableAdd(table, "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s %*s\n",
           "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)",
           "(GB/s)", "", 0, "");
}

/* One line of the side-by-side header: the leading columns' cells, then for each half of a row
 * `time` and `busbw` over every backend, `ratio` over the others, and `wrong`. */
static void addSideBySideLine(Table* table, Lane* lanes, int nlanes, const char* const lead[5],
                              const char* time, const char* busbw, const char* ratio,
                              const char* wrong, int names) {
  tableAdd(table, "# %10s  %12s  %8s  %6s  %6s", lead[0], lead[1], lead[2], lead[3], lead[4]);
  for (int inPlace = 0; inPlace <= 1; inPlace++) {
    for (int l = 0; l < nlanes; l++) tableAdd(table, " %8s", names ? lanes[l].be->name : time);
    for (int l = 0; l < nlanes; l++) tableAdd(table, " %7s", names ? lanes[l].be->name : busbw);
    for (int l = 1; l < nlanes; l++) tableAdd(table, " %6s", names ? lanes[l].be->name : ratio);
    tableAdd(table, " %6s", wrong);
  }
  tableAdd(table, "\n");
}

/* The header of the one table of several backends: what each is, what the ratio means, and the
 * columns (out of place, then in place). "# Backends:" lists them in column order for scripts. */
static void addSideBySideHeader(Lane* lanes, int nlanes, const Coll* coll) {
  static const char* const names[5] = {"size", "count", "type", "redop", "root"};
  static const char* const units[5] = {"(B)", "(elements)", "", "", ""};
  Table* table = &lanes[0].table;
  char description[512];
  int width = 9 * nlanes + 8 * nlanes + 7 * (nlanes - 1) + 7;
  tableAdd(table, "#\n# Collective: %s\n# Backends:", coll->name);
  for (int l = 0; l < nlanes; l++) tableAdd(table, " %s", lanes[l].be->name);
  tableAdd(table, " (measured interleaved, in %d rounds)\n", roundsOf(nlanes));
  for (int l = 0; l < nlanes; l++) {
    lanes[l].be->describe(description, sizeof(description));
    tableAdd(table, "#   %-6s %s\n", lanes[l].be->name, description);
  }
  tableAdd(table,
           "# time: us per call; busbw: GB/s; ratio: that backend's time / %s's time (= %s's "
           "busbw / its busbw): above 1, %s is faster\n#\n",
           lanes[0].be->name, lanes[0].be->name, lanes[0].be->name);
  tableAdd(table, "# %10s  %12s  %8s  %6s  %6s %-*s %-*s\n", "", "", "", "", "", width - 1,
           " out-of-place", width - 1, " in-place");
  addSideBySideLine(table, lanes, nlanes, names, "time", "busbw", "ratio", "#wrong", 0);
  addSideBySideLine(table, lanes, nlanes, units, "", "", "", "", 1);
}

/* The footer: the wrong measurements of every rank, and the average bus bandwidth. */
static void addTableFooter(Table* table) {
  MPI_Allreduce(MPI_IN_PLACE, &table->errors, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  tableAdd(table, "# %-20s : %d %s\n", "Out of bounds values", table->errors,
           table->errors ? "FAILED" : "OK");
  tableAdd(table, "# %-20s : %g %s\n", "Avg bus bandwidth",
           table->bwCount ? table->bwSum / table->bwCount : 0.0, "");
  tableAdd(table, "#\n");
}

/* The side-by-side footer: the footer's two lines, with each backend's figure. */
static void addSideBySideFooter(Lane* lanes, int nlanes) {
  Table* table = &lanes[0].table;
  int errors = 0;
  for (int l = 0; l < nlanes; l++) {
    MPI_Allreduce(MPI_IN_PLACE, &lanes[l].table.errors, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    errors += lanes[l].table.errors;
  }
  tableAdd(table, "# %-20s : %d %s (", "Out of bounds values", errors, errors ? "FAILED" : "OK");
  for (int l = 0; l < nlanes; l++)
    tableAdd(table, "%s%s %d", l ? ", " : "", lanes[l].be->name, lanes[l].table.errors);
  tableAdd(table, ")\n# %-20s :", "Avg bus bandwidth");
  for (int l = 0; l < nlanes; l++) {
    Table* own = &lanes[l].table;
    tableAdd(table, "%s %s %g", l ? "," : "", lanes[l].be->name,
             own->bwCount ? own->bwSum / own->bwCount : 0.0);
  }
  tableAdd(table, "\n#\n");
}

/* Opens a backend with buffers of its own: each has its kind of memory (MPI's on the host), and
 * none of them sees another's data. */
static void openLane(Lane* lane, const Backend* be, int live) {
  *lane = (Lane){.be = be, .table = {.live = live}};
  be->open();
  lane->sendBuf = bufAlloc(be->onDevice(), opt.maxBytes);
  lane->recvBuf = bufAlloc(be->onDevice(), opt.maxBytes);
}

static void closeLane(Lane* lane) {
  bufFree(lane->be->onDevice(), lane->sendBuf);
  bufFree(lane->be->onDevice(), lane->recvBuf);
  lane->be->close();
}

/* One collective on every selected backend, all open at once and taking turns size by size (see
 * sweep), over every selected type, op and root; then its tables, in backend order. Returns the
 * number of (rank, measurement) pairs with wrong values, summed over ranks and backends. */
static int runCollective(const Coll* coll) {
  Lane lanes[NUM_BACKENDS];
  Test t = {.coll = coll};
  int nlanes = 0, errors = 0;
  int typeLo = opt.type == ALL ? 0 : opt.type,
      typeHi = opt.type == ALL ? gcommNumTypes : typeLo + 1;
  int opLo = opt.op == ALL || !coll->reduces ? 0 : opt.op;
  int opHi = !coll->reduces ? 1 : opt.op == ALL ? gcommNumOps : opLo + 1;
  int rootLo = opt.root == ALL || !coll->rooted ? 0 : opt.root;
  int rootHi = !coll->rooted ? 1 : opt.root == ALL ? world.nranks : rootLo + 1;
  for (int b = 0; b < NUM_BACKENDS; b++) {
    if (!(opt.backends & B(b))) continue;
    openLane(&lanes[nlanes], backendOf(b), nlanes == 0);
    nlanes++;
  }
  if (sideBySide(nlanes))
    addSideBySideHeader(lanes, nlanes, coll);
  else
    for (int l = 0; l < nlanes; l++) addTableHeader(lanes, nlanes, l, coll);
  for (t.type = typeLo; t.type < typeHi; t.type++)
    for (t.op = opLo; t.op < opHi; t.op++)
      for (t.root = rootLo; t.root < rootHi; t.root++) sweep(&t, lanes, nlanes);
  for (int l = 0; l < nlanes; l++) closeLane(&lanes[l]);
  if (sideBySide(nlanes))
    addSideBySideFooter(lanes, nlanes);
  else
    for (int l = 0; l < nlanes; l++) addTableFooter(&lanes[l].table);
  for (int l = 0; l < nlanes; l++) {
    printTable(&lanes[l].table);
    errors += lanes[l].table.errors;
  }
  return errors;
}

/* ======================================================================================== */
/* Setup and main                                                                           */
/* ======================================================================================== */

/* Rank within the node, and the device it uses: local rank modulo the devices present. */
static void chooseDevice(void) {
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world.rank, MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, &world.localRank);
  MPI_Comm_free(&node);
  world.device = -1;
#ifdef GCOMM_CUDA
  int ndev = 0;
  if (opt.gpu != 0 && cudaGetDeviceCount(&ndev) != cudaSuccess) ndev = 0;
  if (opt.gpu == 1 && ndev == 0) die("-g 1: no CUDA device");
  if (ndev > 0) {
    world.device = world.localRank % ndev;
    CU(cudaSetDevice(world.device));
    CU(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CU(cudaEventCreate(&events[0]));
    CU(cudaEventCreate(&events[1]));
  }
#else
  if (opt.gpu == 1) die("-g 1: built without CUDA (make CUDA=1)");
#endif
}

static void printDevices(const char* prog) {
  char line[256], *lines = world.rank == 0 ? malloc(sizeof(line) * (size_t)world.nranks) : NULL;
  int v = 0;
  GC(gcommGetVersion(&v));
  PRINT("# gcomm_perf version %d.%d.%d gcomm-headers=%d gcomm-library=%d\n", GCOMM_MAJOR,
        GCOMM_MINOR, GCOMM_PATCH, GCOMM_VERSION_CODE, v);
  PRINT("# Collective test starting: %s\n", prog);
  PRINT(
      "# nThread 1 nGpus %d minBytes %zu maxBytes %zu step: %zu(%s) warmup iters: %d iters: %d "
      "agg iters: 1 validation: %d graph: 0 unalign: 0\n",
      world.device >= 0, opt.minBytes, opt.maxBytes,
      opt.stepFactor > 1 ? opt.stepFactor : opt.stepBytes, opt.stepFactor > 1 ? "factor" : "bytes",
      opt.warmup, opt.iters, opt.check);
  PRINT("#\n# Using devices\n");
  snprintf(line, sizeof(line), "#  Rank %2d Group %2d Pid %6d on %10s device host\n", world.rank, 0,
           (int)getpid(), world.host);
#ifdef GCOMM_CUDA
  if (world.device >= 0) {
    struct cudaDeviceProp prop;
    CU(cudaGetDeviceProperties(&prop, world.device));
    snprintf(line, sizeof(line),
             "#  Rank %2d Group %2d Pid %6d on %10s device %2d [%04x:%02x:%02x] %.80s\n",
             world.rank, 0, (int)getpid(), world.host, world.device, prop.pciDomainID,
             prop.pciBusID, prop.pciDeviceID, prop.name);
  }
#endif
  MPI_Gather(line, sizeof(line), MPI_CHAR, lines, sizeof(line), MPI_CHAR, 0, MPI_COMM_WORLD);
  for (int r = 0; lines && r < world.nranks; r++) PRINT("%s", lines + r * sizeof(line));
  free(lines);
}

static int parseArgs(int argc, char** argv) {
  static const struct option longopts[] = {{"minbytes", required_argument, 0, 'b'},
                                           {"maxbytes", required_argument, 0, 'e'},
                                           {"stepbytes", required_argument, 0, 'i'},
                                           {"stepfactor", required_argument, 0, 'f'},
                                           {"iters", required_argument, 0, 'n'},
                                           {"warmup_iters", required_argument, 0, 'w'},
                                           {"rounds", required_argument, 0, 'R'},
                                           {"check", required_argument, 0, 'c'},
                                           {"datatype", required_argument, 0, 'd'},
                                           {"op", required_argument, 0, 'o'},
                                           {"root", required_argument, 0, 'r'},
                                           {"average", required_argument, 0, 'a'},
                                           {"gpu", optional_argument, 0, 'G'},
                                           {"ngpus", required_argument, 0, 'g'},
                                           {"coll", required_argument, 0, 'C'},
                                           {"backend", required_argument, 0, 'B'},
                                           {"proxy", required_argument, 0, 'P'},
                                           {"separate", no_argument, 0, 'S'},
                                           {"vcounts", required_argument, 0, 'V'},
                                           {"host_mem", required_argument, 0, 'H'},
                                           {"help", no_argument, 0, 'h'},
                                           {0, 0, 0, 0}};
  const char* collNames[NUM_COLLS];
  int c;
  for (int i = 0; i < NUM_COLLS; i++) collNames[i] = collectives[i].name;
  opt.colls = 1; /* allreduce */
  opt.backends = B(BACKEND_GCOMM);
  opterr = world.rank == 0;
  while ((c = getopt_long(argc, argv, "b:e:i:f:n:w:R:c:d:o:r:a:g:h", longopts, NULL)) != -1) {
    const char* bad = NULL;
    switch (c) {
      case 'b':
        bad = parseSize(optarg, &opt.minBytes) ? "minbytes" : NULL;
        break;
      case 'e':
        bad = parseSize(optarg, &opt.maxBytes) ? "maxbytes" : NULL;
        break;
      case 'i':
        bad = parseSize(optarg, &opt.stepBytes) ? "stepbytes" : NULL;
        break;
      case 'f':
        opt.stepFactor = strtoul(optarg, NULL, 0);
        break;
      case 'n':
        opt.iters = atoi(optarg), bad = opt.iters < 1 ? "iters" : NULL;
        break;
      case 'w':
        opt.warmup = atoi(optarg), bad = opt.warmup < 0 ? "warmup_iters" : NULL;
        break;
      case 'R':
        opt.rounds = atoi(optarg), bad = opt.rounds < 1 ? "rounds" : NULL;
        break;
      case 'c':
        opt.check = atoi(optarg);
        break;
      case 'd':
        opt.type = parseType(optarg), bad = opt.type == -2 ? "datatype" : NULL;
        break;
      case 'o':
        opt.op = lookup(optarg, strlen(optarg), opNames, gcommNumOps);
        bad = opt.op == -2 ? "op" : NULL;
        break;
      case 'r':
        opt.root = strcmp(optarg, "all") == 0 ? ALL : atoi(optarg);
        bad = opt.root < ALL || opt.root >= world.nranks ? "root" : NULL;
        break;
      case 'a':
        opt.average = atoi(optarg), bad = opt.average < 0 || opt.average > 3 ? "average" : NULL;
        break;
      case 'g':
        opt.gpu = atoi(optarg) != 0;
        break;
      case 'G':
        opt.gpu = optarg ? atoi(optarg) != 0 : 1;
        break;
      case 'C':
        bad = (opt.colls = parseList(optarg, collNames, NUM_COLLS)) ? NULL : "coll";
        break;
      case 'B':
        opt.backends = parseList(optarg, backendNames, NUM_BACKENDS);
        bad = opt.backends == 0 ? "backend" : NULL;
        break;
      case 'P':
        opt.proxyMode = strcmp(optarg, "poll") == 0     ? GCOMM_PROXY_POLL
                        : strcmp(optarg, "thread") == 0 ? GCOMM_PROXY_THREAD
                                                        : -2;
        bad = opt.proxyMode == -2 ? "proxy" : NULL;
        break;
      case 'S':
        opt.separate = 1;
        break;
      case 'V':
        opt.vskewed = strcmp(optarg, "skewed") == 0;
        bad = opt.vskewed || strcmp(optarg, "random") == 0 ? NULL : "vcounts";
        break;
      case 'H':
        opt.hostShared = strcmp(optarg, "gcomm") == 0;
        bad = opt.hostShared || strcmp(optarg, "malloc") == 0 ? NULL : "host_mem";
        break;
      case 'h':
        usage(argv[0]);
        return 0;
      default:
        usage(argv[0]);
        return 2;
    }
    if (bad) {
      if (world.rank == 0) fprintf(stderr, "gcomm_perf: invalid %s '%s'\n", bad, optarg);
      return 2;
    }
  }
  for (int b = 0; b < NUM_BACKENDS; b++) {
    if ((opt.backends & B(b)) && backendOf(b) == NULL) {
      if (world.rank == 0)
        fprintf(stderr, "gcomm_perf: the %s backend is not built in (make CUDA=1 NCCL=1)\n",
                backendNames[b]);
      return 2;
    }
  }
  if (opt.minBytes > opt.maxBytes || (opt.stepFactor <= 1 && opt.stepBytes == 0)) {
    if (world.rank == 0) fprintf(stderr, "gcomm_perf: invalid sizes or step\n");
    return 2;
  }
  return -1;
}

int main(int argc, char** argv) {
  const char* prog = strrchr(argv[0], '/') ? strrchr(argv[0], '/') + 1 : argv[0];
  int rc, errors = 0;
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &world.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world.nranks);
  setvbuf(stdout, NULL, _IOLBF, 0);
  rc = parseArgs(argc, argv);
  if (rc >= 0) {
    MPI_Finalize();
    return rc;
  }
  gethostname(world.host, sizeof(world.host) - 1);
  chooseDevice();
  printDevices(prog);
  stage = bufAlloc(0, opt.maxBytes);
  before = bufAlloc(0, opt.maxBytes);
  want = bufAlloc(0, opt.maxBytes);
  for (int c = 0; c < NUM_COLLS; c++)
    if (opt.colls & B(c)) errors += runCollective(&collectives[c]);
  PRINT("# Collective test concluded: %s\n\n#\n", prog);
  bufFree(0, stage);
  bufFree(0, before);
  bufFree(0, want);
#ifdef GCOMM_CUDA
  if (world.device >= 0) {
    CU(cudaEventDestroy(events[0]));
    CU(cudaEventDestroy(events[1]));
    CU(cudaStreamDestroy(stream));
  }
#endif
  MPI_Finalize();
  return errors ? 1 : 0;
}
