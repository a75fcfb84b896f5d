/*
 * test_coll.c - every collective against a serial reference computed from every rank's input.
 *
 * A case is one call: collective, datatype, op, root, count, in-place or not. Each rank's input
 * is a function of (case seed, rank, index), so every rank computes the expected output of its own
 * buffers serially from all ranks' inputs. Outputs are poisoned before the call; afterwards every
 * element of every buffer this rank passed is checked: the output region against the reference,
 * the input region against the input (left unchanged), the rest still poison, the guard zones
 * around each buffer intact. Cases are launched in batches and completed by one gcommWait.
 *
 * Reducing collectives use "exact" data: values for which every partial result of every type is
 * exact (floats: small integers for sum, and for avg ones whose sum divides by nranks; signed
 * powers of two for prod; anything for max/min; integers: full-range random bits, as integer sum
 * and prod wrap the same in any order; small values for avg, whose sum must not wrap; fp8: ranges
 * small enough for its 3 or 4 significant bits), so results compare exactly whatever the
 * reduction order. The ops include PreMulSum (each rank's own scalar, host-immediate or read when
 * the call runs: "premul" and "premuldev"): floats get small integers times signed powers of two.
 * Other sections check the rounding of float types (fp8's saturation too), random reals with a
 * tolerance, and agreement with MPI's own collectives (AllToAll in place: MPI_IN_PLACE).
 *
 * Each communicator (made with GCOMM_* settings: forced algorithm, channels, FIFO size, proxy
 * mode) runs some of these sections:
 *   small   counts 0, 1, 7, 1031: every collective x datatype x op x algorithm x in/out-of-place,
 *           every root for count 7, first and last root otherwise; with the algorithm left to
 *           the cost model, every datatype with one op each
 *   pipe    GCOMM_BUFFSIZE=4096 and 1..16 channels: count 65537 on a few type/op pairs
 *   large   count 300007 on a few type/op pairs, every algorithm
 *   real    float32/float64 sum and avg of random reals, compared with a tolerance
 *   round   float sum, prod and avg where each result is one rounded operation (two ranks hold
 *           random reals, the others the identity), compared exactly: checks the rounding
 *   mpi     int32 and float64 results compared with MPI's collectives
 * Sections other than small use one root a case (in place the first, else the last) and, for
 * the collectives whose buffers hold nranks blocks, blocks of count/nranks elements.
 * A collective that lacks the forced algorithm runs one type/op pair: it must fall back.
 */
#include "test/testlib.h"

#define N(a) (int)(sizeof(a) / sizeof((a)[0]))

enum { RING = 1, TREE = 2, DIRECT = 4, TWOSHOT = 8, RECDBL = 16 };

typedef enum {
  ALLREDUCE,
  BROADCAST,
  REDUCE,
  ALLGATHER,
  REDUCESCATTER,
  ALLTOALL,
  GATHER,
  SCATTER,
  NCOLLS
} CollId;

typedef struct {
  const char* name;
  int reduces, rooted;
  int algos;        /* the GCOMM_ALGO values it has */
  int inPlace;      /* it has an in-place form */
  int sendPerRank;  /* sendbuff holds nranks*count elements (else count) */
  int recvPerRank;  /* recvbuff holds nranks*count elements (else count) */
  int sendRootOnly; /* sendbuff is used on root only: may be NULL elsewhere */
  int recvRootOnly; /* recvbuff is used on root only: may be NULL elsewhere */
} Coll;

static const Coll colls[NCOLLS] = {
    /*                 name      reduce root algorithms     inpl sendN recvN sendR recvR */
    [ALLREDUCE] = {"allreduce", 1, 0, RING | TREE | DIRECT | TWOSHOT | RECDBL, 1, 0, 0, 0, 0},
    [BROADCAST] = {"broadcast", 0, 1, RING | TREE | DIRECT, 1, 0, 0, 0, 0},
    [REDUCE] = {"reduce", 1, 1, RING | TREE | DIRECT, 1, 0, 0, 0, 1},
    [ALLGATHER] = {"allgather", 0, 0, RING | DIRECT | RECDBL, 1, 0, 1, 0, 0},
    [REDUCESCATTER] = {"reducescatter", 1, 0, RING | DIRECT, 1, 1, 0, 0, 0},
    [ALLTOALL] = {"alltoall", 0, 0, 0, 1, 1, 1, 0, 0},
    [GATHER] = {"gather", 0, 1, TREE, 1, 0, 1, 0, 1},
    [SCATTER] = {"scatter", 0, 1, TREE, 0, 1, 0, 1, 0},
};

/* A communicator setting: algo is the GCOMM_ALGO it forces (0: the cost model chooses); sparse:
 * where a section runs every type and op, run one op a type; sections: which to run on it. */
typedef struct {
  const char* name;
  int algo;
  const char* env;
  int proxyMode;
  int sparse;
  unsigned sections;
} Variant;

/* exact: see the top; real: random reals, compared with a tolerance; round: at each index two
 * ranks hold random reals and the others the op's identity, so the result is one rounded
 * operation whatever the order, compared exactly; mpi: data for comparing with MPI. */
typedef enum { DATA_EXACT, DATA_REAL, DATA_ROUND, DATA_MPI } DataMode;

/* The test's ops: gcomm.h's, then PreMulSum with a host-immediate scalar and with one read when the
 * call runs (an operator made for each call, destroyed as soon as the call has returned). */
enum { PREMUL = gcommNumOps, PREMUL_DEV, NUM_TEST_OPS };
static const char* const opNames[NUM_TEST_OPS] = {"sum", "prod",   "max",      "min",
                                                  "avg", "premul", "premuldev"};
#define OP_DIV NUM_TEST_OPS /* typedOp: a / b */

typedef struct {
  CollId coll;
  gcommDataType_t type;
  int op; /* a gcommRedOp_t, PREMUL or PREMUL_DEV */
  int root;
  size_t count;
  int inPlace;
  int nullOffRoot; /* pass NULL for a buffer used on root only, on the other ranks */
  size_t misalign; /* buffers start this many bytes off the allocator's alignment */
  DataMode mode;
  uint64_t seed;
  /* Set up by caseSetup: */
  TlBuf bufs[2]; /* out-of-place: send, recv; in-place: one buffer */
  const void* sendbuff;
  void* recvbuff;
  uint64_t scalar; /* PREMUL_DEV: where the operator's scalar is read when the call runs */
} Case;

static const Variant* curVariant; /* for failure messages */

/* ---- The reference ---- */

/* DATA_ROUND's reals lie in [-range, range): for fp8, up to 0.9 of its largest value, so that
 * sums and products saturate now and then. */
static double roundRange(gcommDataType_t t) {
  return t == gcommFloat8e4m3 ? 400 : t == gcommFloat8e5m2 ? 50000 : 50;
}

/* Exact fp8 data (3 or 4 significant bits; every partial result of up to 8 ranks exact): sum's
 * inputs in [-2, 2] (E5M2: [-1, 1]), premul's in [-1, 1]; avg the same power of two on every rank
 * (E5M2: up to 1); prod signed powers of two (and 0); max/min any finite value. */
static uint64_t fp8ExactInput(const Case* c, uint64_t h, size_t k) {
  static const double powersOfTwo[] = {-2, -1, -0.5, 0, 0.5, 1, 2};
  int e5m2 = c->type == gcommFloat8e5m2;
  uint64_t common = tlHash3(c->seed, ~0ull, k);
  switch (c->op) {
    case gcommProd:
      return tlFromDouble(c->type, powersOfTwo[h % 7]);
    case gcommMax:
    case gcommMin:
      return isfinite(tlToDouble(c->type, h & 0xff)) ? h & 0xff : 0;
    case gcommAvg:
      return tlFromDouble(c->type, powersOfTwo[e5m2 + common % (7 - 2 * e5m2)]);
    case gcommSum:
      return tlFromDouble(c->type, (double)((int)(h % (5 - 2 * e5m2)) - 2 + e5m2));
    default:
      return tlFromDouble(c->type, (double)((int)(h % 3) - 1));
  }
}

/* Rank r's PreMulSum scalar in case c: full-range bits for integers; signed powers of two for
 * floats (E4M3 and, up to 4 ranks, E5M2: 1 or 2; E5M2 beyond: 1), random reals in DATA_ROUND. */
static uint64_t scalarBits(const Case* c, int r) {
  const TlType* t = &tlTypes[c->type];
  uint64_t h = tlHash3(c->seed, ~2ull, (uint64_t)r);
  static const double scalars[] = {-2, -1, -0.5, 0.5, 1, 2};
  if (!t->isFloat) return h & tlMask(t->size);
  if (c->mode == DATA_ROUND || c->mode == DATA_REAL)
    return tlFromDouble(c->type, (double)(h >> 11) * 0x1p-53 * 4 - 2);
  if (t->size == 1) {
    double mag = c->type == gcommFloat8e5m2 && tlNranks > 4 ? 1 : 1 + (double)(h >> 8 & 1);
    return tlFromDouble(c->type, (h & 1) ? -mag : mag);
  }
  return tlFromDouble(c->type, scalars[h % 6]);
}

/* Input element k of rank r. */
static uint64_t inputBits(const Case* c, int r, size_t k) {
  const TlType* t = &tlTypes[c->type];
  uint64_t h = tlHash3(c->seed, (uint64_t)r, k);
  if (!colls[c->coll].reduces) return h & tlMask(t->size);
  if (c->mode == DATA_REAL) return tlFromDouble(c->type, (double)(h >> 11) * 0x1p-52 - 1.0);
  if (c->mode == DATA_ROUND) {
    uint64_t pick = tlHash3(c->seed, ~1ull, k), n = (uint64_t)tlNranks;
    uint64_t r1 = pick % n, r2 = (r1 + 1 + (pick >> 32) % (n > 1 ? n - 1 : 1)) % n;
    if ((uint64_t)r != r1 && (uint64_t)r != r2) return tlFromDouble(c->type, c->op == gcommProd);
    return tlFromDouble(
        c->type, (double)(h >> 11) * 0x1p-53 * 2 * roundRange(c->type) - roundRange(c->type));
  }
  if (c->mode == DATA_MPI) { /* int32 or float64, no overflow (MPI's int arithmetic is signed) */
    if (t->isFloat) return tlFromDouble(c->type, (double)(h >> 11) * 0x1p-52 - 1.0);
    static const double factors[] = {-2, -1, 1, 2, 3};
    if (c->op == gcommProd) return tlFromDouble(c->type, factors[h % 5]);
    if (c->op == gcommSum) return tlFromDouble(c->type, (double)((int64_t)(h % 2000001) - 1000000));
    return h & tlMask(t->size);
  }
  if (!t->isFloat) {
    if (c->op != gcommAvg) return h & tlMask(t->size);
    /* Avg: small enough that the sum does not wrap. */
    uint64_t lim = (tlMask(t->size) >> (t->isSigned ? 1 : 0)) / (uint64_t)tlNranks;
    if (lim > (1u << 20)) lim = 1u << 20;
    if (!t->isSigned) return h % (lim + 1);
    return (uint64_t)((int64_t)(h % (2 * lim + 1)) - (int64_t)lim) & tlMask(t->size);
  }
  static const double powersOfTwo[] = {-2, -1, -0.5, 0.5, 1, 2};
  if (t->size == 1) return fp8ExactInput(c, h, k);
  switch (c->op) {
    case gcommProd:
      return tlFromDouble(c->type, powersOfTwo[h % 6]);
    case gcommMax:
    case gcommMin:
      return tlFromDouble(c->type, (double)((int64_t)(h % 20001) - 10000) / 8);
    case gcommAvg: { /* every rank's value = the same residue mod nranks: the sum divides */
      int64_t residue = (int64_t)(tlHash3(c->seed, ~0ull, k) % (uint64_t)tlNranks);
      return tlFromDouble(c->type, (double)(residue + tlNranks * ((int64_t)(h % 3) - 1)));
    }
    default: /* sum, and premul's inputs */
      return tlFromDouble(c->type, (double)((int)(h % 9) - 4));
  }
}

/* a op b (op OP_DIV: a / b) as gcomm computes it for float type t: in double for float64,
 * else in float, rounded to t (16-bit floats are reduced in float, rounded once per operation). */
static double typedOp(gcommDataType_t t, int op, double a, double b) {
  if (t == gcommFloat64) {
    switch (op) {
      case gcommProd:
        return a * b;
      case gcommMax:
        return a > b ? a : b;
      case gcommMin:
        return a < b ? a : b;
      case OP_DIV:
        return a / b;
      default:
        return a + b;
    }
  }
  float fa = (float)a, fb = (float)b, r;
  switch (op) {
    case gcommProd:
      r = fa * fb;
      break;
    case gcommMax:
      r = fa > fb ? fa : fb;
      break;
    case gcommMin:
      r = fa < fb ? fa : fb;
      break;
    case OP_DIV:
      r = fa / fb;
      break;
    default:
      r = fa + fb;
      break;
  }
  return tlToDouble(t, tlFromDouble(t, r));
}

/* How rank r's contributions combine: PreMulSum sums them. */
static int combineOp(int op) {
  return op >= PREMUL ? gcommSum : op;
}

/* Rank r's contribution to element k: its input, for PreMulSum times its scalar, rounded to the
 * type (gcomm's pre-operation: integers wrap, floats round once). */
static uint64_t operandBits(const Case* c, int r, size_t k) {
  gcommDataType_t t = c->type;
  uint64_t x = inputBits(c, r, k), s;
  if (c->op < PREMUL) return x;
  s = scalarBits(c, r);
  if (!tlTypes[t].isFloat) return (x * s) & tlMask(tlTypes[t].size);
  return tlFromDouble(t, typedOp(t, gcommProd, tlToDouble(t, x), tlToDouble(t, s)));
}

/* The reduction over every rank of input element k; *tol: the error allowed. */
static uint64_t reduceAll(const Case* c, size_t k, double* tol) {
  gcommDataType_t t = c->type;
  int n = tlNranks;
  *tol = 0;
  if (!tlTypes[t].isFloat) {
    uint64_t acc = operandBits(c, 0, k);
    int64_t sacc = tlSext(t, acc);
    for (int r = 1; r < n; r++) {
      uint64_t x = operandBits(c, r, k);
      int64_t sx = tlSext(t, x);
      int signedType = tlTypes[t].isSigned;
      switch (combineOp(c->op)) {
        case gcommSum:
          acc += x;
          break;
        case gcommAvg:
          acc += x, sacc += sx;
          break; /* avg data is small: no overflow */
        case gcommProd:
          acc *= x;
          break;
        case gcommMax:
          acc = (signedType ? sx > tlSext(t, acc) : x > acc) ? x : acc;
          break;
        case gcommMin:
          acc = (signedType ? sx < tlSext(t, acc) : x < acc) ? x : acc;
          break;
        default:
          break;
      }
    }
    if (c->op == gcommAvg) acc = tlTypes[t].isSigned ? (uint64_t)(sacc / n) : acc / (uint64_t)n;
    return acc & tlMask(tlTypes[t].size);
  }
  double acc = tlToDouble(t, operandBits(c, 0, k)), mag = fabs(acc);
  for (int r = 1; r < n; r++) {
    double x = tlToDouble(t, operandBits(c, r, k));
    mag += fabs(x);
    acc = typedOp(t, combineOp(c->op), acc, x);
  }
  if (c->op == gcommAvg) acc = typedOp(t, OP_DIV, acc, n), mag /= n;
  if (c->mode == DATA_REAL) *tol = 2.0 * (n + 1) * tlTypes[t].eps * mag;
  return tlFromDouble(t, acc);
}

/* What output element j of this rank should be. */
static uint64_t expectedBits(const Case* c, size_t j, double* tol) {
  size_t n = c->count, rank = (size_t)tlRank;
  *tol = 0;
  switch (c->coll) {
    case ALLREDUCE:
    case REDUCE:
      return reduceAll(c, j, tol);
    case REDUCESCATTER:
      return reduceAll(c, rank * n + j, tol);
    case BROADCAST:
      return inputBits(c, c->root, j);
    case SCATTER:
      return inputBits(c, c->root, rank * n + j);
    case ALLGATHER:
    case GATHER:
      return inputBits(c, (int)(j / n), j % n);
    case ALLTOALL:
      return inputBits(c, (int)(j / n), rank * n + j % n);
    default:
      return 0;
  }
}

static int sameElem(const Case* c, uint64_t got, uint64_t want, double tol) {
  if (!colls[c->coll].reduces || !tlTypes[c->type].isFloat) return got == want;
  double g = tlToDouble(c->type, got), w = tlToDouble(c->type, want);
  return g == w || fabs(g - w) <= tol;
}

/* ---- One case ---- */

static size_t sendElems(const Case* c) {
  return c->count * (colls[c->coll].sendPerRank ? tlNranks : 1);
}
static size_t recvElems(const Case* c) {
  return c->count * (colls[c->coll].recvPerRank ? tlNranks : 1);
}
static int receives(const Case* c) {
  return !colls[c->coll].recvRootOnly || tlRank == c->root;
}

/* Where the send and recv regions of buffer b start (in elements), -1 when it has none. */
static void regions(const Case* c, int b, long* sendOff, long* recvOff) {
  size_t s = sendElems(c), r = recvElems(c), mine = (size_t)tlRank * c->count;
  if (c->inPlace) {
    *sendOff = (long)(s < r ? mine : 0);
    *recvOff = (long)(r < s ? mine : 0);
  } else {
    *sendOff = b == 0 ? 0 : -1;
    *recvOff = b == 1 ? 0 : -1;
  }
}

static void caseSetup(Case* c) {
  const Coll* k = &colls[c->coll];
  size_t es = tlTypes[c->type].size, s = sendElems(c), r = recvElems(c);
  int offRoot = tlRank != c->root;
  memset(c->bufs, 0, sizeof(c->bufs));
  if (c->inPlace) {
    c->bufs[0] = tlBufAlloc((s > r ? s : r) * es, c->misalign);
  } else {
    if (!(k->sendRootOnly && offRoot && c->nullOffRoot))
      c->bufs[0] = tlBufAlloc(s * es, c->misalign);
    if (!(k->recvRootOnly && offRoot && c->nullOffRoot))
      c->bufs[1] = tlBufAlloc(r * es, c->misalign);
  }
  long sendOff, recvOff;
  regions(c, 0, &sendOff, &recvOff);
  unsigned char* sendBase = c->bufs[0].ptr;
  unsigned char* recvBase = c->inPlace ? c->bufs[0].ptr : c->bufs[1].ptr;
  c->sendbuff = sendBase ? sendBase + (size_t)sendOff * es : NULL;
  c->recvbuff = recvBase ? recvBase + (size_t)(c->inPlace ? recvOff : 0) * es : NULL;
  for (size_t i = 0; sendBase && i < s; i++)
    tlStore(c->type, (void*)c->sendbuff, i, inputBits(c, tlRank, i));
}

static gcommResult_t collLaunch(const Case* c, gcommRedOp_t op, gcommComm_t comm) {
  const void* s = c->sendbuff;
  void* r = c->recvbuff;
  size_t n = c->count;
  switch (c->coll) {
    case ALLREDUCE:
      return gcommAllReduce(s, r, n, c->type, op, comm, NULL);
    case BROADCAST:
      return gcommBroadcast(s, r, n, c->type, c->root, comm, NULL);
    case REDUCE:
      return gcommReduce(s, r, n, c->type, op, c->root, comm, NULL);
    case ALLGATHER:
      return gcommAllGather(s, r, n, c->type, comm, NULL);
    case REDUCESCATTER:
      return gcommReduceScatter(s, r, n, c->type, op, comm, NULL);
    case ALLTOALL:
      return gcommAllToAll(s, r, n, c->type, comm, NULL);
    case GATHER:
      return gcommGather(s, r, n, c->type, c->root, comm, NULL);
    case SCATTER:
      return gcommScatter(s, r, n, c->type, c->root, comm, NULL);
    default:
      return gcommInternalError;
  }
}

/* Launches c. A PreMulSum case makes its operator first and destroys it as soon as the call has
 * returned. Host-immediate: the scalar is spoilt after the operator is made (it was read then).
 * Read when the call runs: spoilt when the operator is made and set after the call, inside a
 * group (nothing runs before its end), so the result shows when it was read. */
static gcommResult_t caseLaunch(Case* c, gcommComm_t comm) {
  if (c->op < PREMUL) return collLaunch(c, (gcommRedOp_t)c->op, comm);
  int dev = c->op == PREMUL_DEV;
  uint64_t bits = scalarBits(c, tlRank);
  gcommRedOp_t op;
  c->scalar = dev ? ~bits : bits;
  gcommResult_t res = gcommRedOpCreatePreMulSum(
      &op, &c->scalar, c->type, dev ? gcommScalarDevice : gcommScalarHostImmediate, comm);
  if (res != gcommSuccess) return res;
  if (dev) TL_OK(comm, gcommGroupStart());
  c->scalar = ~bits;
  res = collLaunch(c, op, comm);
  if (dev) c->scalar = bits;
  TL_OK(comm, gcommRedOpDestroy(op, comm));
  if (dev) TL_OK(comm, gcommGroupEnd());
  return res;
}

static const char* caseName(const Case* c, char* out, size_t len) {
  snprintf(out, len, "%s %s%s%s count=%zu root=%d %s%s [%s: %s%s]", colls[c->coll].name,
           tlTypes[c->type].name, colls[c->coll].reduces ? " " : "",
           colls[c->coll].reduces ? opNames[c->op] : "", c->count, c->root,
           c->inPlace ? "in-place" : "out-of-place", c->misalign ? " misaligned" : "",
           curVariant->name, curVariant->env,
           curVariant->proxyMode == GCOMM_PROXY_POLL ? " poll" : "");
  return out;
}

/* Checks every element of this rank's buffers; returns 1 when all are right. */
static int caseVerify(const Case* c) {
  char name[256], want[64], got[64];
  size_t es = tlTypes[c->type].size, s = sendElems(c), r = recvElems(c);
  for (int b = 0; b < 2; b++) {
    const TlBuf* buf = &c->bufs[b];
    if (!buf->raw) continue;
    caseName(c, name, sizeof(name));
    if (!tlBufCheckGuards(buf, name)) return 0;
    long sendOff, recvOff;
    regions(c, b, &sendOff, &recvOff);
    size_t elems = buf->bytes / es;
    for (size_t e = 0; e < elems; e++) {
      uint64_t bits = tlLoad(c->type, buf->ptr, e), expect;
      double tol = 0;
      const char* role;
      if (recvOff >= 0 && receives(c) && e >= (size_t)recvOff && e < (size_t)recvOff + r) {
        expect = expectedBits(c, e - (size_t)recvOff, &tol), role = "output";
        if (sameElem(c, bits, expect, tol)) continue;
      } else if (sendOff >= 0 && e >= (size_t)sendOff && e < (size_t)sendOff + s) {
        expect = inputBits(c, tlRank, e - (size_t)sendOff), role = "input (must stay unchanged)";
        if (bits == expect) continue;
      } else {
        if (tlFirstUnpoisoned(buf->ptr + e * es, es) == es) continue;
        expect = TL_POISON_BYTE * 0x0101010101010101ull & tlMask(es);
        role = "element outside the output (must stay untouched)";
      }
      static const char* const bufNames[2] = {"send", "recv"};
      tlFail("%s: %s buffer element %zu, %s: expected %s, got %s (tol %g)", name,
             c->inPlace ? "in-place" : bufNames[b], e, role,
             tlFormat(c->type, expect, want, sizeof(want)),
             tlFormat(c->type, bits, got, sizeof(got)), tol);
      return 0;
    }
  }
  return 1;
}

/* Runs cases as one batch: set up and launch all, one gcommWait, verify and free all. */
static void runBatch(gcommComm_t comm, Case* cases, int ncases) {
  char name[256];
  int launched = 0;
  for (int i = 0; i < ncases; i++) {
    caseSetup(&cases[i]);
    gcommResult_t res = caseLaunch(&cases[i], comm);
    if (res != gcommSuccess)
      tlFail("%s: launch returned %s (%s)", caseName(&cases[i], name, sizeof(name)),
             gcommGetErrorString(res), gcommGetLastError(comm));
    else
      launched++;
  }
  if (launched) TL_OK(comm, gcommWait(comm, NULL));
  for (int i = 0; i < ncases; i++) {
    if (!tlLocalFailed) caseVerify(&cases[i]);
    tlBufFree(&cases[i].bufs[0]);
    tlBufFree(&cases[i].bufs[1]);
  }
}

/* ---- Sections ---- */

#define MAX_BATCH 256

typedef struct {
  gcommDataType_t type;
  int op;
} TypeOp;

/* allRootsCount for one root a case: in place the first, out of place the last. */
#define ONE_ROOT ((size_t)-1)

/* Sections of large counts give the collectives whose buffers hold nranks blocks (allgather,
 * reducescatter, alltoall, gather, scatter) count/nranks elements a block (kept odd), so that
 * every buffer holds about count elements. */
static size_t blockCount(const Coll* k, size_t count, int scaled) {
  if (!scaled || !(k->sendPerRank || k->recvPerRank)) return count;
  return (count / (size_t)tlNranks) | 1;
}

/* Adds the cases of one (collective, type, op) over counts x in-place x roots. allRootsCount: the
 * count run with every root, or ONE_ROOT; the other cases use the first and the last root. */
static int addCases(Case* cases, int ncases, CollId coll, gcommDataType_t type, int op,
                    const size_t* counts, int ncounts, size_t allRootsCount, int scaled,
                    DataMode mode) {
  const Coll* k = &colls[coll];
  for (int ci = 0; ci < ncounts; ci++) {
    for (int inPlace = 0; inPlace <= k->inPlace; inPlace++) {
      int everyRoot = k->rooted && counts[ci] == allRootsCount;
      for (int root = 0; root < (k->rooted ? tlNranks : 1); root++) {
        if (k->rooted && !everyRoot && root != 0 && root != tlNranks - 1) continue;
        if (k->rooted && allRootsCount == ONE_ROOT && root != (inPlace ? 0 : tlNranks - 1))
          continue;
        if (ncases == MAX_BATCH) return ncases;
        Case* c = &cases[ncases++];
        memset(c, 0, sizeof(*c));
        c->coll = coll, c->type = type, c->op = op, c->root = root;
        c->count = blockCount(k, counts[ci], scaled);
        c->inPlace = inPlace, c->mode = mode, c->seed = tlNextSeed();
        c->nullOffRoot = (ncases + ci) & 1;
        c->misalign = (ncases & 2) ? tlTypes[type].size : 0;
      }
    }
  }
  return ncases;
}

/* The type/op pairs collective k runs on variant v: the section's pairs (NULL: every type and op,
 * PreMulSum with one scalar residence a type, alternating; or with v->sparse one op a type); for
 * data movement, each distinct type once; when k lacks the algorithm v forces, one pair only: it
 * must fall back. Returns how many went to out. */
static int pairsFor(const Coll* k, const Variant* v, const TypeOp* pairs, int npairs, TypeOp* out) {
  TypeOp all[gcommNumTypes * NUM_TEST_OPS];
  if (!pairs) {
    npairs = 0;
    for (int t = 0; t < gcommNumTypes; t++)
      for (int op = 0; op < NUM_TEST_OPS; op++) {
        if (op >= PREMUL && op != PREMUL + t % 2) continue; /* one residence a type */
        if (!v->sparse || op == t % NUM_TEST_OPS) all[npairs++] = (TypeOp){t, op};
      }
    pairs = all;
  }
  int n = 0;
  for (int p = 0; p < npairs; p++) {
    TypeOp to = {pairs[p].type, k->reduces ? pairs[p].op : gcommSum};
    int dup = 0;
    for (int q = 0; q < n; q++) dup |= out[q].type == to.type && out[q].op == to.op;
    if (!dup) out[n++] = to;
  }
  return v->algo && !(k->algos & v->algo) && n ? 1 : n;
}

/* A section: type/op pairs (NULL: every type and op), counts, roots and data. */
typedef struct {
  const char* name;
  const TypeOp* pairs;
  int npairs;
  const size_t* counts;
  int ncounts;
  size_t allRootsCount; /* see addCases */
  int scaled;           /* see blockCount */
  DataMode mode;
} Section;

/* Runs every collective's pairs (pairsFor) of section sec on comm, a communicator of variant v. */
static void runSection(gcommComm_t comm, const Variant* v, const Section* sec) {
  static Case cases[MAX_BATCH];
  TypeOp todo[gcommNumTypes * NUM_TEST_OPS];
  curVariant = v;
  for (int coll = 0; coll < NCOLLS; coll++) {
    const Coll* k = &colls[coll];
    if ((sec->mode == DATA_REAL || sec->mode == DATA_ROUND) && !k->reduces) continue;
    int fallback = v->algo && !(k->algos & v->algo);
    int ntodo = pairsFor(k, v, sec->pairs, sec->npairs, todo);
    for (int p = 0; p < ntodo; p++) {
      TypeOp to = todo[p];
      int ncases = addCases(cases, 0, coll, to.type, to.op, sec->counts, sec->ncounts,
                            sec->allRootsCount, sec->scaled, sec->mode);
      runBatch(comm, cases, ncases);
      tlReport("%s %s %s%s%s [%s]%s", sec->name, k->name, tlTypes[to.type].name,
               k->reduces ? " " : "", k->reduces ? opNames[to.op] : "", v->name,
               fallback ? " (falls back)" : "");
    }
  }
}

/* ---- Comparison with MPI ---- */

static MPI_Op mpiOp(int op) {
  return op == gcommProd ? MPI_PROD : op == gcommMax ? MPI_MAX : op == gcommMin ? MPI_MIN : MPI_SUM;
}

/* Runs c's collective with MPI on c's input; out: recvElems(c) elements (on every rank). */
static void mpiCollective(const Case* c, void* out) {
  size_t es = tlTypes[c->type].size, s = sendElems(c);
  int n = (int)c->count;
  MPI_Datatype dt = c->type == gcommInt32 ? MPI_INT32_T : MPI_DOUBLE;
  void* in = malloc(s * es + 1);
  for (size_t i = 0; i < s; i++) tlStore(c->type, in, i, inputBits(c, tlRank, i));
  MPI_Comm w = MPI_COMM_WORLD;
  MPI_Op o = mpiOp(c->op);
  MPI_Request req = MPI_REQUEST_NULL;
  switch (c->coll) {
    case ALLREDUCE:
      MPI_Iallreduce(in, out, n, dt, o, w, &req);
      break;
    case REDUCE:
      MPI_Ireduce(in, out, n, dt, o, c->root, w, &req);
      break;
    case REDUCESCATTER:
      MPI_Ireduce_scatter_block(in, out, n, dt, o, w, &req);
      break;
    case BROADCAST:
      memcpy(out, in, s * es);
      MPI_Ibcast(out, n, dt, c->root, w, &req);
      break;
    case ALLGATHER:
      MPI_Iallgather(in, n, dt, out, n, dt, w, &req);
      break;
    case ALLTOALL:
      if (c->inPlace) memcpy(out, in, s * es);
      MPI_Ialltoall(c->inPlace ? MPI_IN_PLACE : in, n, dt, out, n, dt, w, &req);
      break;
    case GATHER:
      MPI_Igather(in, n, dt, out, n, dt, c->root, w, &req);
      break;
    case SCATTER:
      MPI_Iscatter(in, n, dt, out, n, dt, c->root, w, &req);
      break;
    default:
      break;
  }
  tlWaitRequest(&req);
  free(in);
}

static void runMpiComparison(gcommComm_t comm, const Variant* variant) {
  static const TypeOp pairs[] = {{gcommInt32, gcommSum},   {gcommInt32, gcommProd},
                                 {gcommInt32, gcommMax},   {gcommInt32, gcommMin},
                                 {gcommFloat64, gcommSum}, {gcommFloat64, gcommMax}};
  curVariant = variant;
  char name[256], want[64], got[64];
  for (int coll = 0; coll < NCOLLS; coll++) {
    int npairs = colls[coll].reduces ? N(pairs) : coll == ALLTOALL ? 4 : 2;
    for (int p = 0; p < npairs; p++) {
      TypeOp to =
          colls[coll].reduces ? pairs[p] : (TypeOp){p & 1 ? gcommFloat64 : gcommInt32, gcommSum};
      Case c = {.coll = coll,
                .type = to.type,
                .op = to.op,
                .root = tlNranks - 1,
                .count = 1031,
                .inPlace = coll == ALLTOALL && p >= 2, /* against MPI_IN_PLACE */
                .mode = DATA_MPI,
                .seed = tlNextSeed()};
      caseSetup(&c);
      if (TL_OK(comm, caseLaunch(&c, comm)) == gcommSuccess) TL_OK(comm, gcommWait(comm, NULL));
      size_t es = tlTypes[c.type].size, r = recvElems(&c);
      void* ref = malloc(r * es);
      mpiCollective(&c, ref);
      for (size_t j = 0; j < r && receives(&c) && !tlLocalFailed; j++) {
        uint64_t g = tlLoad(c.type, c.recvbuff, j), w = tlLoad(c.type, ref, j);
        double tol =
            c.type == gcommFloat64 && c.op == gcommSum ? 2.0 * tlNranks * tlNranks * 0x1p-52 : 0;
        if (!sameElem(&c, g, w, tol))
          tlFail("%s: element %zu: MPI gives %s, gcomm %s", caseName(&c, name, sizeof(name)), j,
                 tlFormat(c.type, w, want, sizeof(want)), tlFormat(c.type, g, got, sizeof(got)));
      }
      free(ref);
      tlBufFree(&c.bufs[0]);
      tlBufFree(&c.bufs[1]);
      tlReport("mpi %s %s%s%s%s = MPI [%s]", colls[coll].name, tlTypes[to.type].name,
               colls[coll].reduces ? " " : "", colls[coll].reduces ? opNames[to.op] : "",
               c.inPlace ? " in place" : "", variant->name);
    }
  }
}

enum { SMALL = 1, PIPE = 2, LARGE = 4, REAL = 8, ROUND = 16, MPICMP = 32 };

/* The cost model's all-reduce gives every rank the same bits (float sums in one order), at sizes
 * where each algorithm is picked: real-valued random data, compared across ranks through MPI. */
static void checkSameOnEveryRank(gcommComm_t comm) {
  static const size_t counts[] = {1, 1031, 65537, 1 << 20};
  for (int i = 0; i < N(counts); i++) {
    size_t n = counts[i];
    float* in = malloc(n * sizeof(float));
    float* out = malloc(n * sizeof(float));
    float* rank0 = malloc(n * sizeof(float));
    for (size_t k = 0; k < n; k++)
      in[k] = (float)((double)(tlHash3(tlSeed, tlRank, k) >> 11) * 0x1p-53 * 3.0 - 1.0);
    memset(out, 0xff, n * sizeof(float));
    gcommResult_t r = gcommAllReduce(in, out, n, gcommFloat32, gcommSum, comm, NULL);
    if (r == gcommSuccess) r = gcommWait(comm, NULL);
    if (r != gcommSuccess) tlFail("all-reduce: %s", gcommGetErrorString(r));
    memcpy(rank0, out, n * sizeof(float));
    MPI_Bcast(rank0, (int)n, MPI_FLOAT, 0, MPI_COMM_WORLD);
    for (size_t k = 0; k < n && r == gcommSuccess; k++)
      if (memcmp(&out[k], &rank0[k], sizeof(float)) != 0) {
        tlFail("element %zu: %a here, %a on rank 0", k, out[k], rank0[k]);
        break;
      }
    free(in), free(out), free(rank0);
    tlReport("auto all-reduce float sum of %zu: the same bits on every rank", n);
  }
}

int main(int argc, char** argv) {
  tlInit(&argc, &argv);
  static const TypeOp pipePairs[] = {
      {gcommInt32, gcommSum},      {gcommFloat16, gcommAvg},      {gcommFloat64, gcommProd},
      {gcommUint8, gcommMax},      {gcommFloat8e4m3, PREMUL_DEV}, {gcommInt64, PREMUL},
      {gcommFloat8e5m2, gcommSum},
  };
  static const TypeOp largePairs[] = {
      {gcommUint8, gcommProd}, {gcommBfloat16, gcommAvg},   {gcommFloat64, gcommSum},
      {gcommFloat32, PREMUL},  {gcommFloat8e4m3, gcommSum},
  };
  static const TypeOp realPairs[] = {
      {gcommFloat32, gcommSum},
      {gcommFloat32, gcommAvg},
      {gcommFloat64, gcommSum},
      {gcommFloat64, gcommAvg},
  };
  static const TypeOp roundPairs[] = {
      {gcommFloat16, gcommSum},    {gcommFloat16, gcommProd},    {gcommFloat16, gcommAvg},
      {gcommBfloat16, gcommSum},   {gcommBfloat16, gcommProd},   {gcommBfloat16, gcommAvg},
      {gcommFloat32, gcommSum},    {gcommFloat32, gcommProd},    {gcommFloat32, gcommAvg},
      {gcommFloat64, gcommSum},    {gcommFloat64, gcommProd},    {gcommFloat64, gcommAvg},
      {gcommFloat8e4m3, gcommSum}, {gcommFloat8e4m3, gcommProd}, {gcommFloat8e4m3, gcommAvg},
      {gcommFloat8e5m2, gcommSum}, {gcommFloat8e5m2, gcommProd}, {gcommFloat8e5m2, gcommAvg},
      {gcommFloat16, PREMUL},      {gcommBfloat16, PREMUL_DEV},  {gcommFloat32, PREMUL},
      {gcommFloat64, PREMUL_DEV},  {gcommFloat8e4m3, PREMUL},    {gcommFloat8e5m2, PREMUL_DEV},
  };
  static const size_t smallCounts[] = {0, 1, 7, 1031}, pipeCounts[] = {65537},
                      largeCounts[] = {300007}, realCounts[] = {1031, 65537},
                      roundCounts[] = {1031};
  static const Section sections[] = {
      /* name  pairs                     counts                        roots    scaled data */
      {"small", NULL, 0, smallCounts, N(smallCounts), 7, 0, DATA_EXACT},
      {"pipe", pipePairs, N(pipePairs), pipeCounts, N(pipeCounts), ONE_ROOT, 1, DATA_EXACT},
      {"large", largePairs, N(largePairs), largeCounts, N(largeCounts), ONE_ROOT, 1, DATA_EXACT},
      {"real", realPairs, N(realPairs), realCounts, N(realCounts), ONE_ROOT, 1, DATA_REAL},
      {"round", roundPairs, N(roundPairs), roundCounts, N(roundCounts), ONE_ROOT, 1, DATA_ROUND},
  };
  static const Variant variants[] = {
      {"ring", RING, "GCOMM_ALGO=ring GCOMM_NCHANNELS=2", -1, 0,
       SMALL | LARGE | REAL | ROUND | MPICMP},
      {"tree", TREE, "GCOMM_ALGO=tree", -1, 0, SMALL | LARGE | REAL | ROUND},
      {"direct/poll", DIRECT, "GCOMM_ALGO=direct", GCOMM_PROXY_POLL, 0,
       SMALL | LARGE | REAL | ROUND},
      {"twoshot", TWOSHOT, "GCOMM_ALGO=twoshot", -1, 0, SMALL | LARGE | REAL | ROUND},
      /* recursive doubling on 2^k ranks where n/2 blocks fit a slot (small), direct elsewhere */
      {"recdbl", RECDBL, "GCOMM_ALGO=recdbl", -1, 0, SMALL | LARGE},
      {"recdbl/4k/poll", RECDBL, "GCOMM_ALGO=recdbl GCOMM_BUFFSIZE=4096", GCOMM_PROXY_POLL, 0,
       SMALL},
      {"auto", 0, "", -1, 1, SMALL | MPICMP},
      {"ring/4k/1ch/poll", RING, "GCOMM_ALGO=ring GCOMM_BUFFSIZE=4096 GCOMM_NCHANNELS=1",
       GCOMM_PROXY_POLL, 0, PIPE},
      {"ring/4k/4ch", RING, "GCOMM_ALGO=ring GCOMM_BUFFSIZE=4096 GCOMM_NCHANNELS=4", -1, 0, PIPE},
      {"tree/4k/2ch", TREE, "GCOMM_ALGO=tree GCOMM_BUFFSIZE=4096 GCOMM_NCHANNELS=2", -1, 0, PIPE},
      {"direct/4k/3ch", DIRECT, "GCOMM_ALGO=direct GCOMM_BUFFSIZE=4096 GCOMM_NCHANNELS=3", -1, 0,
       PIPE},
      {"twoshot/4k/3ch/poll", TWOSHOT, "GCOMM_ALGO=twoshot GCOMM_BUFFSIZE=4096 GCOMM_NCHANNELS=3",
       GCOMM_PROXY_POLL, 0, PIPE},
      {"auto/4k/16ch/poll", 0, "GCOMM_BUFFSIZE=4096 GCOMM_NCHANNELS=16", GCOMM_PROXY_POLL, 0, PIPE},
  };
  for (int v = 0; v < N(variants); v++) {
    gcommComm_t comm = tlCommInitEnv(MPI_COMM_WORLD, variants[v].env, variants[v].proxyMode);
    if (!tlReport("init communicator %s", variants[v].name)) continue;
    for (int s = 0; s < N(sections); s++)
      if (variants[v].sections & (1u << s)) runSection(comm, &variants[v], &sections[s]);
    if (variants[v].sections & MPICMP) runMpiComparison(comm, &variants[v]);
    if (variants[v].algo == 0 && variants[v].proxyMode < 0) checkSameOnEveryRank(comm);
    tlCommDestroy(comm);
    tlReport("destroy communicator %s", variants[v].name);
  }
  return tlFinish("test_coll");
}
