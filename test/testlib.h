/*
 * testlib.h - helpers shared by the gcomm tests (header-only: static inline functions).
 *
 * Reporting. Each program runs checks; a check is a stretch of work on every rank followed by
 * tlReport("what"), a collective over MPI_COMM_WORLD: rank 0 prints "PASS what", or
 * "FAIL what: [rank R of K failing] why (TEST_SEED=...)" where why is the first tlFail() message
 * of the lowest failing rank since the previous report. test/run.sh counts those lines.
 * TEST_SEED=0x... reproduces a run's data; TEST_TIMES=1 adds how long each check took.
 * MPI waits in the tests sleep between polls (tlWaitRequest): with 8 ranks on 2 cores, ranks
 * spinning in MPI would starve the ones still working.
 *
 * Data. Element values come from a counter-based hash, so any rank can compute any rank's input
 * (tlHash3(seed, rank, index)). tlLoad/tlStore move raw element bits; tlToDouble/tlFromDouble
 * convert, rounding to nearest even (float16 and bfloat16 included).
 *
 * Buffers. tlBufAlloc surrounds a buffer with guard zones and fills it with a poison pattern;
 * tlBufCheckGuards reports a write outside it.
 *
 * Communicators. tlCommInitEnv makes one with GCOMM_* variables set around the init only.
 * GCOMM_TIMEOUT_MS defaults to 60 s in the tests, so ranks that disagree fail naming the peer
 * instead of hanging until test/run.sh's timeout.
 */
#ifndef GCOMM_TESTLIB_H
#define GCOMM_TESTLIB_H

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gcomm.h"

/* ---- Reporting ---- */

static int tlRank, tlNranks;
static uint64_t tlSeed; /* the run's base seed: the same on every rank */
static int tlPassed, tlFailed;
static int tlLocalFailed; /* tlFail was called since the last report */
static char tlWhy[1024];  /* its first message */

static inline double tlNow(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline void tlSleepMs(double ms) {
  struct timespec ts = {(time_t)(ms / 1000), (long)(fmod(ms, 1000.0) * 1e6)};
  nanosleep(&ts, NULL);
}

/* Waits for a nonblocking MPI request, sleeping between tests: with more ranks than cores, a
 * rank spinning in MPI takes the CPU from the ranks (and progress threads) still working. */
static inline void tlWaitRequest(MPI_Request* req) {
  int done = 0;
  MPI_Test(req, &done, MPI_STATUS_IGNORE);
  while (!done) {
    tlSleepMs(0.05);
    MPI_Test(req, &done, MPI_STATUS_IGNORE);
  }
}

/* Waits up to maxS seconds until at least want of the files dir/prefix0 .. dir/prefix(n-1)
 * exist: ranks that must not leave before their peers (Open MPI's mpirun ends the whole job when
 * one rank leaves without MPI_Finalize) meet this way after a rank has died. */
static inline void tlAwaitFiles(const char* dir, const char* prefix, int n, int want, double maxS) {
  char path[512];
  for (double t = tlNow(); tlNow() - t < maxS;) {
    int seen = 0;
    for (int r = 0; r < n; r++) {
      snprintf(path, sizeof(path), "%s/%s%d", dir, prefix, r);
      seen += access(path, F_OK) == 0;
    }
    if (seen >= want) return;
    tlSleepMs(10);
  }
}

static inline void tlBarrier(MPI_Comm comm) {
  MPI_Request req;
  MPI_Ibarrier(comm, &req);
  tlWaitRequest(&req);
}

static inline void tlInit(int* argc, char*** argv) {
  MPI_Init(argc, argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &tlRank);
  MPI_Comm_size(MPI_COMM_WORLD, &tlNranks);
  unsigned long long seed = 0;
  if (tlRank == 0) {
    const char* s = getenv("TEST_SEED");
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    seed = s ? strtoull(s, NULL, 0)
             : (unsigned long long)ts.tv_sec * 1000003ull + (unsigned long long)ts.tv_nsec;
  }
  MPI_Bcast(&seed, 1, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD);
  tlSeed = seed;
  setvbuf(stdout, NULL, _IOLBF, 0);
  setenv("GCOMM_TIMEOUT_MS", "60000", 0); /* see the top */
}

/* Records a failure on this rank (the first message since the last report is kept). */
__attribute__((format(printf, 1, 2))) static inline void tlFail(const char* fmt, ...) {
  if (tlLocalFailed++) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(tlWhy, sizeof(tlWhy), fmt, ap);
  va_end(ap);
}

/* Collective: ends a check. Returns 1 when it passed on every rank. */
__attribute__((format(printf, 1, 2))) static inline int tlReport(const char* fmt, ...) {
  char what[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof(what), fmt, ap);
  va_end(ap);

  /* One collective: a bitmask of the failing ranks. */
  int words = (tlNranks + 63) / 64, first = tlNranks, nfailing = 0;
  uint64_t* mask = calloc(2 * (size_t)words, sizeof(uint64_t));
  MPI_Request req;
  if (tlLocalFailed) mask[tlRank / 64] = 1ull << (tlRank % 64);
  MPI_Iallreduce(mask, mask + words, words, MPI_UINT64_T, MPI_BOR, MPI_COMM_WORLD, &req);
  tlWaitRequest(&req);
  for (int r = tlNranks - 1; r >= 0; r--)
    if (mask[words + r / 64] >> (r % 64) & 1) first = r, nfailing++;
  free(mask);
  if (first < tlNranks) {
    MPI_Ibcast(tlWhy, sizeof(tlWhy), MPI_CHAR, first, MPI_COMM_WORLD, &req);
    tlWaitRequest(&req);
  }
  if (tlRank == 0) {
    static double last;
    double now = tlNow();
    if (getenv("TEST_TIMES")) /* TEST_TIMES=1: how long each check took */
      snprintf(what + strlen(what), sizeof(what) - strlen(what), " {%.3f s}",
               last ? now - last : 0);
    last = now;
    if (first == tlNranks)
      printf("PASS %s\n", what);
    else
      printf("FAIL %s: [rank %d of %d failing] %s (TEST_SEED=0x%llx)\n", what, first, nfailing,
             tlWhy, (unsigned long long)tlSeed);
  }
  tlLocalFailed = 0;
  tlWhy[0] = '\0';
  if (first == tlNranks) return tlPassed++, 1;
  return tlFailed++, 0;
}

static inline int tlFinish(const char* program) {
  if (tlRank == 0)
    printf("# %s on %d ranks: %d checks passed, %d failed\n", program, tlNranks, tlPassed,
           tlFailed);
  MPI_Finalize();
  return 0;
}

/* Checks that a gcomm call succeeded; returns its result. */
static inline gcommResult_t tlOk(gcommResult_t res, gcommComm_t comm, const char* call, int line) {
  if (res != gcommSuccess)
    tlFail("line %d: %s returned %s (%s)", line, call, gcommGetErrorString(res),
           gcommGetLastError(comm));
  return res;
}
#define TL_OK(comm, call) tlOk((call), (comm), #call, __LINE__)

/* Collective over mpiComm: a communicator whose GCOMM_* environment is env ("NAME=VALUE ...",
 * set around the init only) and whose config.proxyMode is proxyMode (< 0: left undefined). */
static inline gcommComm_t tlCommInitEnv(MPI_Comm mpiComm, const char* env, int proxyMode) {
  char buf[512], *save = NULL, *names[16], *old[16];
  int n = 0;
  snprintf(buf, sizeof(buf), "%s", env ? env : "");
  for (char* kv = strtok_r(buf, " ", &save); kv && n < 16; kv = strtok_r(NULL, " ", &save)) {
    char* eq = strchr(kv, '=');
    if (!eq) continue;
    *eq = '\0';
    const char* prev = getenv(kv);
    names[n] = kv;
    old[n] = prev ? strdup(prev) : NULL;
    setenv(kv, eq + 1, 1);
    n++;
  }
  gcommConfig_t config = GCOMM_CONFIG_INITIALIZER;
  if (proxyMode >= 0) config.proxyMode = proxyMode;
  gcommComm_t comm = NULL;
  if (TL_OK(NULL, gcommCommInitMPI(&comm, mpiComm, &config)) != gcommSuccess) comm = NULL;
  for (int i = 0; i < n; i++) {
    if (old[i])
      setenv(names[i], old[i], 1);
    else
      unsetenv(names[i]);
    free(old[i]);
  }
  return comm;
}

static inline void tlCommDestroy(gcommComm_t comm) {
  if (comm) TL_OK(comm, gcommCommDestroy(comm));
}

/* ---- Datatypes and values ---- */

typedef struct {
  const char* name;
  size_t size;
  int isFloat, isSigned;
  double eps; /* unit roundoff of float types */
} TlType;

static const TlType tlTypes[gcommNumTypes] = {
    [gcommInt8] = {"int8", 1, 0, 1, 0},
    [gcommUint8] = {"uint8", 1, 0, 0, 0},
    [gcommInt32] = {"int32", 4, 0, 1, 0},
    [gcommUint32] = {"uint32", 4, 0, 0, 0},
    [gcommInt64] = {"int64", 8, 0, 1, 0},
    [gcommUint64] = {"uint64", 8, 0, 0, 0},
    [gcommFloat16] = {"float16", 2, 1, 1, 0x1p-11},
    [gcommFloat32] = {"float32", 4, 1, 1, 0x1p-24},
    [gcommFloat64] = {"float64", 8, 1, 1, 0x1p-53},
    [gcommBfloat16] = {"bfloat16", 2, 1, 1, 0x1p-8},
    [gcommFloat8e4m3] = {"float8e4m3", 1, 1, 1, 0x1p-4},
    [gcommFloat8e5m2] = {"float8e5m2", 1, 1, 1, 0x1p-3},
};
static const char* const tlOpNames[gcommNumOps] = {"sum", "prod", "max", "min", "avg"};

static inline uint64_t tlMask(size_t size) {
  return size >= 8 ? ~0ull : (1ull << (8 * size)) - 1;
}

static inline uint64_t tlLoad(gcommDataType_t t, const void* buf, size_t i) {
  uint64_t v = 0; /* little-endian hosts only */
  memcpy(&v, (const char*)buf + i * tlTypes[t].size, tlTypes[t].size);
  return v;
}

static inline void tlStore(gcommDataType_t t, void* buf, size_t i, uint64_t bits) {
  memcpy((char*)buf + i * tlTypes[t].size, &bits, tlTypes[t].size);
}

/* Sign-extends the bits of an integer element. */
static inline int64_t tlSext(gcommDataType_t t, uint64_t bits) {
  unsigned shift = 64 - 8 * (unsigned)tlTypes[t].size;
  return shift ? (int64_t)(bits << shift) >> shift : (int64_t)bits;
}

static inline float tlHalfToFloat(uint16_t h) {
  uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff;
  float f;
  if (e == 31) {
    uint32_t x = ((uint32_t)(h & 0x8000) << 16) | 0x7f800000u | (m << 13);
    memcpy(&f, &x, 4);
    return f;
  }
  f = e ? ldexpf((float)(m | 0x400), (int)e - 25) : ldexpf((float)m, -24);
  return (h & 0x8000) ? -f : f;
}

static inline uint16_t tlFloatToHalf(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000, a = x & 0x7fffffff;
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00);  /* NaN */
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00); /* rounds to infinity */
  if (a < 0x38800000u) {                                  /* below 2^-14: a multiple of 2^-24 */
    float af;
    memcpy(&af, &a, 4);
    return (uint16_t)(sign | (uint32_t)nearbyintf(af * 0x1p24f));
  }
  uint32_t h = ((((a >> 23) - 127 + 15) << 10) | ((a & 0x7fffff) >> 13)), rest = a & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++;
  return (uint16_t)(sign | h);
}

static inline float tlBf16ToFloat(uint16_t b) {
  uint32_t x = (uint32_t)b << 16;
  float f;
  memcpy(&f, &x, 4);
  return f;
}

static inline uint16_t tlFloatToBf16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  if ((x & 0x7fffffff) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40);
  return (uint16_t)((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}

/* fp8 by its definition (OCP 8-bit floats, as CUDA's __nv_fp8_e4m3 / __nv_fp8_e5m2): manBits
 * mantissa bits, the exponent bias; E4M3 has no infinity and only 0x7f/0xff as NaN. */
static inline double tlFp8ToDouble(uint8_t b, int e5m2) {
  int manBits = e5m2 ? 2 : 3, bias = e5m2 ? 15 : 7, expMax = e5m2 ? 31 : 15;
  int e = (b & 0x7f) >> manBits, m = b & ((1 << manBits) - 1);
  double v;
  if (e5m2 && e == expMax)
    v = m ? NAN : INFINITY;
  else if (!e5m2 && (b & 0x7f) == 0x7f)
    v = NAN;
  else
    v = e ? ldexp(1.0 + m / (double)(1 << manBits), e - bias) : ldexp(m, 1 - bias - manBits);
  return (b & 0x80) ? -v : v;
}

/* The fp8 value nearest v, ties to an even code, saturating: past the largest finite value (and
 * infinity) gives it, NaN gives 0x7f (CUDA's __NV_SATFINITE conversion), found among the finite
 * codes (decoded once; their values rise with the code) rather than by manipulating bits. */
static inline uint8_t tlDoubleToFp8(double v, int e5m2) {
  static double values[2][128];
  static int decoded[2];
  uint8_t sign = signbit(v) ? 0x80 : 0, maxCode = e5m2 ? 0x7b : 0x7e;
  double a = fabs(v);
  if (!decoded[e5m2]) {
    for (int c = 0; c <= maxCode; c++) values[e5m2][c] = tlFp8ToDouble((uint8_t)c, e5m2);
    decoded[e5m2] = 1;
  }
  if (isnan(v)) return 0x7f;
  if (a >= values[e5m2][maxCode]) return (uint8_t)(sign | maxCode);
  int lo = 0, hi = maxCode; /* values[lo] <= a < values[hi] */
  while (hi - lo > 1) {
    int mid = (lo + hi) / 2;
    if (values[e5m2][mid] <= a)
      lo = mid;
    else
      hi = mid;
  }
  double below = a - values[e5m2][lo], above = values[e5m2][hi] - a;
  int best = below < above ? lo : above < below ? hi : (lo & 1) ? hi : lo;
  return (uint8_t)(sign | best);
}

static inline double tlToDouble(gcommDataType_t t, uint64_t bits) {
  float f;
  double d;
  switch (t) {
    case gcommFloat16:
      return tlHalfToFloat((uint16_t)bits);
    case gcommBfloat16:
      return tlBf16ToFloat((uint16_t)bits);
    case gcommFloat8e4m3:
    case gcommFloat8e5m2:
      return tlFp8ToDouble((uint8_t)bits, t == gcommFloat8e5m2);
    case gcommFloat32:
      memcpy(&f, &bits, 4);
      return f;
    case gcommFloat64:
      memcpy(&d, &bits, 8);
      return d;
    default:
      return tlTypes[t].isSigned ? (double)tlSext(t, bits) : (double)bits;
  }
}

/* Integer types: v must be an integer in the type's range (or the signed/unsigned range of 64
 * bits). */
static inline uint64_t tlFromDouble(gcommDataType_t t, double v) {
  float f = (float)v;
  uint64_t bits = 0;
  switch (t) {
    case gcommFloat16:
      return tlFloatToHalf(f);
    case gcommBfloat16:
      return tlFloatToBf16(f);
    case gcommFloat8e4m3:
    case gcommFloat8e5m2:
      return tlDoubleToFp8(f, t == gcommFloat8e5m2);
    case gcommFloat32:
      memcpy(&bits, &f, 4);
      return bits;
    case gcommFloat64:
      memcpy(&bits, &v, 8);
      return bits;
    default:
      bits = v < 0 ? (uint64_t)(int64_t)v : (uint64_t)v;
      return bits & tlMask(tlTypes[t].size);
  }
}

/* Formats one element as "value (0xbits)". */
static inline const char* tlFormat(gcommDataType_t t, uint64_t bits, char* out, size_t len) {
  if (tlTypes[t].isFloat)
    snprintf(out, len, "%.17g (0x%llx)", tlToDouble(t, bits), (unsigned long long)bits);
  else if (tlTypes[t].isSigned)
    snprintf(out, len, "%lld (0x%llx)", (long long)tlSext(t, bits), (unsigned long long)bits);
  else
    snprintf(out, len, "%llu (0x%llx)", (unsigned long long)bits, (unsigned long long)bits);
  return out;
}

/* ---- Random numbers (counter-based: any rank can compute any rank's data) ---- */

static inline uint64_t tlMix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

static inline uint64_t tlHash3(uint64_t a, uint64_t b, uint64_t c) {
  return tlMix(tlMix(tlMix(a) ^ b) ^ c);
}

/* A fresh seed for the next piece of data: the same sequence on every rank. */
static inline uint64_t tlNextSeed(void) {
  static uint64_t counter;
  return tlHash3(tlSeed, 0x5eed, ++counter);
}

/* Fills buf (count elements of type t) with random bits from (seed, rank). */
static inline void tlFillRandom(void* buf, size_t count, gcommDataType_t t, uint64_t seed,
                                int rank) {
  for (size_t i = 0; i < count; i++) tlStore(t, buf, i, tlHash3(seed, (uint64_t)rank, i));
}

/* ---- Guarded buffers ---- */

#define TL_GUARD 256        /* bytes of guard zone on each side */
#define TL_GUARD_BYTE 0x5a  /* what fills the guard zones */
#define TL_POISON_BYTE 0xa5 /* what fills an output before the call */

typedef struct {
  unsigned char* raw; /* the allocation */
  unsigned char* ptr; /* the buffer: bytes long, after a guard zone of front bytes */
  size_t bytes, front;
} TlBuf;

/* A poisoned buffer of bytes, misalign bytes off the allocator's alignment. */
static inline TlBuf tlBufAlloc(size_t bytes, size_t misalign) {
  TlBuf b = {NULL, NULL, bytes, TL_GUARD + misalign};
  b.raw = malloc(b.front + bytes + TL_GUARD);
  if (!b.raw) {
    fprintf(stderr, "test: out of memory (%zu bytes)\n", bytes);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  b.ptr = b.raw + b.front;
  memset(b.raw, TL_GUARD_BYTE, b.front);
  memset(b.ptr, TL_POISON_BYTE, bytes);
  memset(b.ptr + bytes, TL_GUARD_BYTE, TL_GUARD);
  return b;
}

static inline void tlBufFree(TlBuf* b) {
  free(b->raw);
  memset(b, 0, sizeof(*b));
}

/* Reports (tlFail) a byte changed in the guard zones of b; returns 1 when they are intact. */
static inline int tlBufCheckGuards(const TlBuf* b, const char* what) {
  if (!b->raw) return 1;
  for (size_t i = 0; i < b->front; i++)
    if (b->raw[i] != TL_GUARD_BYTE)
      return tlFail("%s: byte %zu before the buffer was overwritten", what, b->front - i), 0;
  for (size_t i = 0; i < TL_GUARD; i++)
    if (b->ptr[b->bytes + i] != TL_GUARD_BYTE)
      return tlFail("%s: byte %zu after the end of the buffer (%zu bytes) was overwritten", what, i,
                    b->bytes),
             0;
  return 1;
}

/* Index of the first byte of p[0, bytes) that is not the poison, or bytes. */
static inline size_t tlFirstUnpoisoned(const void* p, size_t bytes) {
  const unsigned char* c = p;
  for (size_t i = 0; i < bytes; i++)
    if (c[i] != TL_POISON_BYTE) return i;
  return bytes;
}

#endif /* GCOMM_TESTLIB_H */
