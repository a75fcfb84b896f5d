/*
 * test/fuzz/fuzz_gcomm.c - libFuzzer target over gcomm's hostile-input surface (`make fuzz`).
 *
 * It includes gcomm_params.c to reach the static parsers, and links the rest of the library. The first byte of an input picks:
 *   0  the text (the rest of the input) as the value of every GCOMM_* variable of paramTable, and
 *      of the logging knobs (GCOMM_DEBUG, GCOMM_DEBUG_SUBSYS, GCOMM_DEBUG_FILE's expansion): a
 *      value accepted must be within the table's range, and gcommParamParse (gcomm_info's view)
 *      must accept exactly what the table does;
 *   1  one data call (any function, count, datatype, op, root, peer, stream, buffers: NULL, valid,
 *      overlapping, in place) on a one-rank poll communicator, inside a group or not: it must
 *      succeed or return gcommInvalidArgument/gcommInvalidUsage with a message and without
 *      touching the buffers; then gcommWait must succeed;
 *   2  a fuzzed gcommConfig_t and GCOMM_* environment for gcommCommInitMPI and gcommCommSplit:
 *      success (then one all-reduce works) or a clean error.
 * Any crash, sanitizer report, leak or violated expectation (abort()) is a finding.
 */
#include "gcomm_params.c"

static gcommComm_t fuzzComm;
#define CAP 4096 /* bytes of each fuzz buffer */
static unsigned char bufA[CAP], bufB[CAP], before[2 * CAP];

static void expect(int cond, const char* what) {
  if (!cond) {
    fprintf(stderr, "fuzz: expectation violated: %s (last error: %s)\n", what,
            gcommGetLastError(fuzzComm));
    abort();
  }
}

int LLVMFuzzerInitialize(int* argc, char*** argv) {
  MPI_Init(argc, argv);
  setenv("GCOMM_DEBUG", "NONE", 1);      /* errors are expected: keep the output readable */
  setenv("GCOMM_TIMEOUT_MS", "2000", 1); /* a hang would fail at once, not after 5 minutes */
  gcommConfig_t config = GCOMM_CONFIG_INITIALIZER;
  config.proxyMode = GCOMM_PROXY_POLL;
  expect(gcommCommInitMPI(&fuzzComm, MPI_COMM_SELF, &config) == gcommSuccess, "init");
  return 0;
}

/* Reads n bytes (zero-padded) from the input. */
static uint64_t take(const uint8_t** d, size_t* size, int n) {
  uint64_t v = 0;
  for (int i = 0; i<n&& * size> 0; i++, (*d)++, (*size)--) v |= (uint64_t) * *d << (8 * i);
  return v;
}

static void fuzzParams(const uint8_t* d, size_t size) {
  char text[512], path[256];
  size_t n = size < sizeof(text) - 1 ? size : sizeof(text) - 1;
  memcpy(text, d, n);
  text[n] = 0;
  for (int i = 0; i < NPARAMS; i++) {
    const gcommParamDef_t* def = &paramTable[i];
    gcommParams_t p;
    memset(&p, 0, sizeof(p));
    if (def->kind == PARAM_LOG || paramSet(&p, def, text) != 0) continue;
    const char* field = (const char*)&p + def->offset;
    if (def->kind == PARAM_INT || def->kind == PARAM_SIZE) { /* int64_t fields, but nChannels */
      int64_t v = def->offset == PARAM_AT(nChannels) ? *(const int*)field : *(const int64_t*)field;
      expect(v >= def->min && v <= def->max, "an accepted value is within the table's range");
    }
    if (def->kind == PARAM_ENUM)
      expect(*(const int*)field >= -1 && *(const int*)field < 8, "an enum value is a choice");
  }
  for (int i = 0; i < NPARAMS; i++) { /* gcomm_info's view: the same verdict, a bounded text */
    char shown[64];
    int taken = gcommParamParse(i, text, shown, sizeof(shown)) == 0;
    gcommParams_t p;
    memset(&p, 0, sizeof(p));
    if (paramTable[i].kind != PARAM_LOG)
      expect(taken == (paramSet(&p, &paramTable[i], text) == 0), "gcommParamParse agrees");
    expect(!taken || strlen(shown) < sizeof(shown), "gcommParamParse's text fits");
  }
  int64_t v;
  parseInt(text, &v);
  parseEnum(text, logLevels);
  parseSubsys(text);
  expandPath(text, path, sizeof(path));
  expect(strlen(path) < sizeof(path), "the expanded path fits");
}

static gcommResult_t call(int f, const void* s, void* r, size_t count, int type, int op, int root,
                          int peer, gcommStream_t stream) {
  gcommComm_t c = fuzzComm;
  switch (f) {
    case 0:
      return gcommAllReduce(s, r, count, type, op, c, stream);
    case 1:
      return gcommBroadcast(s, r, count, type, root, c, stream);
    case 2:
      return gcommReduce(s, r, count, type, op, root, c, stream);
    case 3:
      return gcommAllGather(s, r, count, type, c, stream);
    case 4:
      return gcommReduceScatter(s, r, count, type, op, c, stream);
    case 5:
      return gcommAllToAll(s, r, count, type, c, stream);
    case 6:
      return gcommGather(s, r, count, type, root, c, stream);
    case 7:
      return gcommScatter(s, r, count, type, root, c, stream);
    default: { /* a send and its receive, in a group: a lone one would wait for ever */
      gcommResult_t a = gcommSend(s, count, type, peer, c, stream);
      gcommResult_t b = gcommRecv(r, count, type, peer, c, stream);
      return a != gcommSuccess ? a : b;
    }
  }
}

/* A buffer: NULL, or inside A at a fuzzed offset, in one of two ranges that overlap (so that send
 * and receive may overlap); either way CAP / 2 bytes from it stay inside A. */
static void* pickBuffer(unsigned sel, unsigned off) {
  switch (sel % 3) {
    case 0:
      return NULL;
    case 1:
      return bufA + off % (CAP / 2);
    default:
      return bufA + CAP / 4 + off % (CAP / 4);
  }
}

static void fuzzCall(const uint8_t* d, size_t size) {
  int f = (int)(take(&d, &size, 1) % 9);
  unsigned flags = (unsigned)take(&d, &size, 1);
  uint64_t count = take(&d, &size, 8);
  int type = (int)(int8_t)take(&d, &size, 1), op = (int)(int8_t)take(&d, &size, 1);
  int root = (int)(int32_t)take(&d, &size, 4), peer = (int)(int32_t)take(&d, &size, 4);
  void* s = pickBuffer(flags, (unsigned)take(&d, &size, 2));
  void* r = flags & 8 ? s : pickBuffer(flags >> 2, (unsigned)take(&d, &size, 2));
  if (flags & 16) r = bufB;                                       /* apart from A */
  if (f == 8 && (s == NULL) != (r == NULL)) r = s ? bufB : NULL;  /* the pair: both or neither */
  gcommStream_t stream = flags & 32 ? (gcommStream_t)bufB : NULL; /* a host comm wants NULL */
  /* a call with any real buffer moves count elements of at most 8 bytes: keep it inside them */
  if (s != NULL || r != NULL) count %= CAP / 2 / 8 + 1;
  memcpy(before, bufA, CAP);
  memcpy(before + CAP, bufB, CAP);
  int group = (flags & 64) || f == 8;
  if (group) gcommGroupStart();
  gcommResult_t res = call(f, s, r, (size_t)count, type, op, root, peer, stream);
  if (group) expect(gcommGroupEnd() == gcommSuccess, "GroupEnd");
  if (res != gcommSuccess) {
    expect(res == gcommInvalidArgument || res == gcommInvalidUsage, "bad input: a usage error");
    expect(gcommGetLastError(fuzzComm)[0] != 0, "an error has a message");
    expect(memcmp(before, bufA, CAP) == 0 && memcmp(before + CAP, bufB, CAP) == 0,
           "a rejected call changes nothing");
  }
  expect(gcommWait(fuzzComm, NULL) == gcommSuccess, "what was accepted completes");
}

static void fuzzConfig(const uint8_t* d, size_t size) {
  static const char* const vars[] = {"GCOMM_NCHANNELS",
                                     "GCOMM_BUFFSIZE",
                                     "GCOMM_PROXY_MODE",
                                     "GCOMM_ALGO",
                                     "GCOMM_TIMEOUT_MS",
                                     "GCOMM_CHECK_MISMATCH",
                                     "GCOMM_PROGRESS_APPENDOP_FREQ"};
  gcommConfig_t config = GCOMM_CONFIG_INITIALIZER;
  unsigned flags = (unsigned)take(&d, &size, 1);
  if (flags & 1) config.size = (size_t)take(&d, &size, 2);
  if (flags & 2) config.magic = (unsigned)take(&d, &size, 4);
  if (flags & 4) config.device = (int)(int32_t)take(&d, &size, 4);
  if (flags & 8) config.proxyMode = (int)(int32_t)take(&d, &size, 4);
  if (flags & 16) config.nChannels = (int)(int32_t)take(&d, &size, 4);
  int var = (int)(take(&d, &size, 1) % (sizeof(vars) / sizeof(vars[0])));
  char text[64], name[64];
  size_t n = size < sizeof(text) - 1 ? size : sizeof(text) - 1;
  memcpy(text, d, n);
  text[n] = 0;
  snprintf(name, sizeof(name), "fuzz-%s", text);
  config.commName = flags & 32 ? name : NULL;
  if (strcmp(vars[var], "GCOMM_BUFFSIZE") == 0 && atoll(text) > (64 << 20)) return; /* memory */
  setenv(vars[var], text, 1);
  gcommComm_t comm = NULL;
  gcommResult_t res = flags & 64 ? gcommCommSplit(fuzzComm, 0, 0, &comm, &config)
                                 : gcommCommInitMPI(&comm, MPI_COMM_SELF, &config);
  unsetenv(vars[var]);
  if (res != gcommSuccess) {
    expect(res == gcommInvalidArgument || res == gcommInvalidUsage, "bad config: a usage error");
    expect(comm == NULL, "no communicator on failure");
    return;
  }
  float x[3] = {1, 2, 3};
  expect(gcommAllReduce(x, x, 3, gcommFloat32, gcommSum, comm, NULL) == gcommSuccess, "all-reduce");
  expect(gcommWait(comm, NULL) == gcommSuccess, "wait");
  expect(x[2] == 3, "a one-rank all-reduce keeps the data");
  expect(gcommCommDestroy(comm) == gcommSuccess, "destroy");
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  switch (data[0] % 3) {
    case 0:
      fuzzParams(data + 1, size - 1);
      break;
    case 1:
      fuzzCall(data + 1, size - 1);
      break;
    default:
      fuzzConfig(data + 1, size - 1);
  }
  return 0;
}
