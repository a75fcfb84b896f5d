/*
 * test_knobs.c - the proxy's knobs (GCOMM_SHM_USE_CUDA_MEMCPY, GCOMM_SHM_MEMCPY_MODE,
 * GCOMM_SHM_LOCALITY, GCOMM_CREATE_THREAD_CONTEXT, GCOMM_GDRCOPY_*) and the waits' spin
 * (GCOMM_WAIT_SPIN_US) on the host side:
 * - every valid value is read as itself and every invalid one leaves the default;
 * - ranks that differ on the knobs that need not agree (the context, gdrcopy, the spin) still init
 *   and run all-reduces and all-gathers that match MPI's (test_errors checks that the others must
 *   agree), and a communicator spins only where the node has a CPU for each of its ranks;
 * - gcomm_gdr.c over a stand-in gdrcopy (test/gdr/fake_gdrapi.c, built beside this program): a
 *   mapping written through shows at the address pinned, everything pinned is undone at close,
 *   and each failure says why: no library, a library without gdr_*, gdr_open failing (no
 *   kernel module), a range that is not whole GPU pages.
 * A host communicator ignores the GPU knobs; test/gpu/run.sh (stage shmce) runs GPU ones.
 */
#define _GNU_SOURCE
#include <libgen.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <dlfcn.h>

#include "gcomm_internal.h"
#include "testlib.h"

typedef struct {
  const char* name;
  size_t offset; /* into gcommParams_t, an int64_t */
  const char* valid[4];
  int64_t validValue[4];
  const char* invalid[4];
  int64_t byDefault;
} knob_t;

#define AT(field) offsetof(gcommParams_t, field)
static const knob_t knobs[] = {
    {"GCOMM_SHM_USE_CUDA_MEMCPY", AT(shmMemcpy), {"0", "1"}, {0, 1}, {"2", "-1", "yes"}, 0},
    {"GCOMM_SHM_MEMCPY_MODE", AT(shmMemcpyMode), {"1", "2", "3"}, {1, 2, 3}, {"0", "4", "x"}, 3},
    {"GCOMM_SHM_LOCALITY", AT(shmLocality), {"1", "2"}, {1, 2}, {"0", "3", ""}, 2},
    {"GCOMM_CREATE_THREAD_CONTEXT", AT(threadContext), {"0", "1"}, {0, 1}, {"2", "on"}, 0},
    {"GCOMM_GDRCOPY_SYNC_ENABLE", AT(gdrSync), {"0", "1"}, {0, 1}, {"7", "1k"}, 0},
    {"GCOMM_GDRCOPY_FLUSH_ENABLE", AT(gdrFlush), {"0", "1"}, {0, 1}, {"-3", "0x"}, 0},
    {"GCOMM_WAIT_SPIN_US",
     AT(waitSpinUs),
     {"0", "5", "1000000"},
     {0, 5, 1000000},
     {"-1", "2000000", "fast"},
     20},
};
#define NKNOBS ((int)(sizeof(knobs) / sizeof(knobs[0])))

static int64_t readKnob(const knob_t* k, const char* text) {
  gcommParams_t p;
  if (text != NULL) setenv(k->name, text, 1);
  gcommParamsRead(&p);
  unsetenv(k->name);
  return *(const int64_t*)((const char*)&p + k->offset);
}

static void testParse(void) {
  for (int i = 0; i < NKNOBS; i++) {
    const knob_t* k = &knobs[i];
    if (readKnob(k, NULL) != k->byDefault)
      tlFail("%s unset reads %lld, not %lld", k->name, (long long)readKnob(k, NULL),
             (long long)k->byDefault);
    for (int v = 0; v < 4 && k->valid[v] != NULL; v++)
      if (readKnob(k, k->valid[v]) != k->validValue[v])
        tlFail("%s=%s reads %lld", k->name, k->valid[v], (long long)readKnob(k, k->valid[v]));
    for (int v = 0; v < 4 && k->invalid[v] != NULL; v++)
      if (readKnob(k, k->invalid[v]) != k->byDefault)
        tlFail("%s=\"%s\" (invalid) reads %lld, not the default %lld", k->name, k->invalid[v],
               (long long)readKnob(k, k->invalid[v]), (long long)k->byDefault);
  }
  gcommParams_t p;
  setenv("GCOMM_GDRCOPY_LIBRARY", "/opt/gdr/libgdrapi.so.2", 1);
  gcommParamsRead(&p);
  unsetenv("GCOMM_GDRCOPY_LIBRARY");
  if (p.gdrLib == NULL || strcmp(p.gdrLib, "/opt/gdr/libgdrapi.so.2") != 0)
    tlFail("GCOMM_GDRCOPY_LIBRARY reads %s", p.gdrLib ? p.gdrLib : "NULL");
  tlReport(
      "knobs: every valid value of the proxy's knobs is read, every invalid one keeps the "
      "default");
}

/* An all-reduce (sum of int64) and an all-gather of odd counts and random data on comm, against
 * MPI's. */
static void checkCollectives(gcommComm_t comm, uint64_t seed) {
  size_t count = 1 + tlHash3(seed, 1, 0) % 4099;
  int64_t* in = malloc(count * sizeof(int64_t));
  int64_t* out = malloc(count * sizeof(int64_t) * tlNranks);
  int64_t* ref = malloc(count * sizeof(int64_t) * tlNranks);
  tlFillRandom(in, count, gcommInt64, tlHash3(seed, tlRank, 2), 0);
  memset(out, 0xa5, count * sizeof(int64_t)); /* poisoned */
  TL_OK(comm, gcommAllReduce(in, out, count, gcommInt64, gcommSum, comm, NULL));
  TL_OK(comm, gcommWait(comm, NULL));
  MPI_Allreduce(in, ref, (int)count, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  if (memcmp(out, ref, count * sizeof(int64_t)) != 0) tlFail("all-reduce of %zu differs", count);
  memset(out, 0x5a, count * sizeof(int64_t) * tlNranks);
  TL_OK(comm, gcommAllGather(in, out, count, gcommInt64, comm, NULL));
  TL_OK(comm, gcommWait(comm, NULL));
  MPI_Allgather(in, (int)count, MPI_INT64_T, ref, (int)count, MPI_INT64_T, MPI_COMM_WORLD);
  if (memcmp(out, ref, count * sizeof(int64_t) * tlNranks) != 0)
    tlFail("all-gather of %zu differs", count);
  free(in);
  free(out);
  free(ref);
}

/* The shared knobs alike everywhere (not their defaults), the local ones differing by rank. */
static void testLocalDiffer(void) {
  char env[512];
  snprintf(env, sizeof(env),
           "GCOMM_SHM_USE_CUDA_MEMCPY=1 GCOMM_SHM_MEMCPY_MODE=2 GCOMM_SHM_LOCALITY=1 "
           "GCOMM_CREATE_THREAD_CONTEXT=%d GCOMM_GDRCOPY_SYNC_ENABLE=%d "
           "GCOMM_GDRCOPY_FLUSH_ENABLE=%d GCOMM_GDRCOPY_LIBRARY=/nonexistent/libgdrapi.so.2 "
           "GCOMM_WAIT_SPIN_US=%d",
           tlRank % 2, (tlRank + 1) % 2, tlRank % 2, tlRank % 2 ? 0 : 50);
  gcommComm_t comm = tlCommInitEnv(MPI_COMM_WORLD, env, -1);
  if (comm != NULL) {
    cpu_set_t mine; /* the CPUs of this process, or the machine's where it is bound to one */
    long cpus = sched_getaffinity(0, sizeof(mine), &mine) == 0 && CPU_COUNT(&mine) > 1
                    ? CPU_COUNT(&mine)
                    : sysconf(_SC_NPROCESSORS_ONLN);
    uint64_t spin = tlRank % 2 || comm->nLocal > cpus ? 0 : 50;
    if (comm->waitSpinUs != spin)
      tlFail("GCOMM_WAIT_SPIN_US=%d, %d local ranks, %ld CPUs: waits spin %llu us, not %llu",
             tlRank % 2 ? 0 : 50, comm->nLocal, cpus, (unsigned long long)comm->waitSpinUs,
             (unsigned long long)spin);
    for (int i = 0; i < 3; i++) checkCollectives(comm, tlHash3(tlSeed, 7, (uint64_t)i));
    tlBarrier(MPI_COMM_WORLD);
    tlCommDestroy(comm);
  }
  tlReport(
      "knobs: ranks differing on GCOMM_CREATE_THREAD_CONTEXT, GCOMM_GDRCOPY_* and "
      "GCOMM_WAIT_SPIN_US init and match MPI's all-reduce and all-gather; waits spin where each "
      "local rank has a CPU");
}

/* ---- gcomm_gdr.c over the stand-in library ---- */

static void expectOpenFails(const char* library, const char* why) {
  char got[512] = "";
  gcommGdr_t* g = gcommGdrOpen(library, got, sizeof(got));
  if (g != NULL) {
    tlFail("gcommGdrOpen(%s) succeeded", library);
    gcommGdrClose(g);
  } else if (strstr(got, why) == NULL) {
    tlFail("gcommGdrOpen(%s): \"%s\" does not say \"%s\"", library, got, why);
  }
}

static void testGdrMap(gcommGdr_t* g, int (*pinned)(void)) {
  enum { PAGES = 2 };
  char why[512] = "";
  uint64_t* gpu = aligned_alloc(GCOMM_GDR_PAGE, PAGES * GCOMM_GDR_PAGE);
  memset(gpu, 0, PAGES * GCOMM_GDR_PAGE);
  if (gcommGdrMap(g, (uint64_t)(uintptr_t)gpu + 256, GCOMM_GDR_PAGE, why, sizeof(why)) != NULL ||
      strstr(why, "whole GPU pages") == NULL)
    tlFail("a range off a GPU page: mapped, or \"%s\"", why);
  if (gcommGdrMap(g, (uint64_t)(uintptr_t)gpu, 100, why, sizeof(why)) != NULL)
    tlFail("a range of 100 bytes was mapped");
  gcommGdrMapping_t* m =
      gcommGdrMap(g, (uint64_t)(uintptr_t)gpu, PAGES * GCOMM_GDR_PAGE, why, sizeof(why));
  if (m == NULL) {
    tlFail("gcommGdrMap: %s", why);
  } else {
    volatile uint64_t* cpu = gcommGdrCpu(m);
    size_t words = PAGES * GCOMM_GDR_PAGE / sizeof(uint64_t);
    uint64_t seed = tlHash3(tlSeed, tlRank, 3);
    cpu[0] = seed;
    cpu[words - 1] = ~seed;
    if (gpu[0] != seed || gpu[words - 1] != ~seed) tlFail("writes through the mapping are lost");
    gcommGdrUnmap(g, m);
  }
  if (pinned != NULL && pinned() != 1) tlFail("%d pins or opens left after unmap", pinned() - 1);
  free(gpu);
}

static void testGdr(const char* fake) {
  char why[512] = "";
  expectOpenFails("/nonexistent/libgdrapi.so.2", "could not be loaded");
  expectOpenFails("libm.so.6", "lacks a gdr_* function");
  setenv("FAKE_GDRAPI_OPEN_FAILS", "1", 1);
  expectOpenFails(fake, "gdr_open failed");
  unsetenv("FAKE_GDRAPI_OPEN_FAILS");
  void* lib = dlopen(fake, RTLD_NOW | RTLD_LOCAL); /* the same copy gcommGdrOpen gets */
  int (*pinned)(void) = lib ? (int (*)(void))dlsym(lib, "fake_gdr_pinned") : NULL;
  if (pinned == NULL) tlFail("%s: %s", fake, dlerror());
  gcommGdr_t* g = gcommGdrOpen(fake, why, sizeof(why));
  if (g == NULL) {
    tlFail("gcommGdrOpen(%s): %s", fake, why);
  } else {
    testGdrMap(g, pinned);
    gcommGdrClose(g);
    if (pinned != NULL && pinned() != 0) tlFail("%d pins or opens left after close", pinned());
  }
  if (lib != NULL) dlclose(lib);
  tlReport(
      "knobs: gdrcopy over a stand-in library: mapped writes land, all undone at close; no "
      "library, no gdr_*, gdr_open failing and partial GPU pages each say why");
}

int main(int argc, char** argv) {
  tlInit(&argc, &argv);
  char dir[4096], fake[4200];
  snprintf(dir, sizeof(dir), "%s", argv[0]);
  snprintf(fake, sizeof(fake), "%s/gdr/libgdrapi-fake.so", dirname(dir)); /* built beside it */
  testParse();
  testLocalDiffer();
  testGdr(fake);
  return tlFinish("test_knobs");
}
