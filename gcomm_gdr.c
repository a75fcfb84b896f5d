/*
 * gcomm_gdr.c - gdrcopy, loaded with dlopen when present (GCOMM_GDRCOPY_LIBRARY, libgdrapi.so.2 by
 * default): a CPU mapping of GPU memory (gdr_pin_buffer, gdr_map through the gdrdrv kernel module),
 * which the proxy reads and writes with plain loads and stores instead of CUDA calls. Used by the
 * GPU engine for the copy engines' staging words (GCOMM_GDRCOPY_SYNC_ENABLE) and the network's
 * flush of GPUDirect RDMA writes (GCOMM_GDRCOPY_FLUSH_ENABLE).
 *
 * No header of gdrcopy is needed to build: the few functions called are declared below as
 * gdrapi.h (gdrcopy 2.x) declares them. The code does not depend on CUDA, so every build compiles
 * it and the host tests exercise it with a stand-in library (test/fake_gdrapi.c).
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "gcomm_internal.h"

/* gdrapi.h, 2.x: an opaque handle, a pinned buffer's handle, and the calls used here */
typedef struct gdrHandle* gdr_t;
typedef struct {
  unsigned long h;
} gdr_mh_t;
typedef gdr_t (*gdrOpenFn)(void);
typedef int (*gdrCloseFn)(gdr_t g);
typedef int (*gdrPinFn)(gdr_t g, unsigned long addr, size_t size, uint64_t p2pToken,
                        uint32_t vaSpace, gdr_mh_t* handle);
typedef int (*gdrUnpinFn)(gdr_t g, gdr_mh_t handle);
typedef int (*gdrMapFn)(gdr_t g, gdr_mh_t handle, void** va, size_t size);
typedef int (*gdrUnmapFn)(gdr_t g, gdr_mh_t handle, void* va, size_t size);

struct gcommGdr {
  void* lib;
  gdr_t g;
  gdrCloseFn close;
  gdrPinFn pin;
  gdrUnpinFn unpin;
  gdrMapFn map;
  gdrUnmapFn unmap;
};

struct gcommGdrMapping {
  gdr_mh_t mh;
  void* cpu;
  size_t bytes;
};

gcommGdr_t* gcommGdrOpen(const char* library, char* why, size_t len) {
  const char* name = library != NULL ? library : "libgdrapi.so.2";
  void* lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    snprintf(why, len, "%s could not be loaded (%s)", name, dlerror());
    return NULL;
  }
  gcommGdr_t* g = calloc(1, sizeof(*g));
  gdrOpenFn open = (gdrOpenFn)dlsym(lib, "gdr_open");
  if (g != NULL) {
    g->close = (gdrCloseFn)dlsym(lib, "gdr_close");
    g->pin = (gdrPinFn)dlsym(lib, "gdr_pin_buffer");
    g->unpin = (gdrUnpinFn)dlsym(lib, "gdr_unpin_buffer");
    g->map = (gdrMapFn)dlsym(lib, "gdr_map");
    g->unmap = (gdrUnmapFn)dlsym(lib, "gdr_unmap");
  }
  if (g == NULL || !open || !g->close || !g->pin || !g->unpin || !g->map || !g->unmap) {
    if (g == NULL)
      snprintf(why, len, "out of memory");
    else
      snprintf(why, len, "%s lacks a gdr_* function of gdrcopy 2.x", name);
    free(g);
    dlclose(lib);
    return NULL;
  }
  g->lib = lib;
  g->g = open();
  if (g->g == NULL) {
    snprintf(why, len, "%s: gdr_open failed (is the gdrdrv kernel module loaded?)", name);
    free(g);
    dlclose(lib);
    return NULL;
  }
  return g;
}

gcommGdrMapping_t* gcommGdrMap(gcommGdr_t* g, uint64_t gpuAddr, size_t bytes, char* why,
                               size_t len) {
  if (gpuAddr % GCOMM_GDR_PAGE != 0 || bytes % GCOMM_GDR_PAGE != 0 || bytes == 0) {
    snprintf(why, len, "gdrcopy maps whole GPU pages of %d bytes: 0x%llx + %zu is not",
             GCOMM_GDR_PAGE, (unsigned long long)gpuAddr, bytes);
    return NULL;
  }
  gcommGdrMapping_t* m = calloc(1, sizeof(*m));
  if (m == NULL) {
    snprintf(why, len, "out of memory");
    return NULL;
  }
  int rc = g->pin(g->g, (unsigned long)gpuAddr, bytes, 0, 0, &m->mh);
  if (rc != 0) {
    snprintf(why, len, "gdr_pin_buffer(0x%llx, %zu) failed (%d)", (unsigned long long)gpuAddr,
             bytes, rc);
    free(m);
    return NULL;
  }
  rc = g->map(g->g, m->mh, &m->cpu, bytes);
  if (rc != 0) {
    snprintf(why, len, "gdr_map(0x%llx, %zu) failed (%d)", (unsigned long long)gpuAddr, bytes, rc);
    g->unpin(g->g, m->mh);
    free(m);
    return NULL;
  }
  m->bytes = bytes;
  return m;
}

void* gcommGdrCpu(const gcommGdrMapping_t* m) {
  return m->cpu;
}

void gcommGdrUnmap(gcommGdr_t* g, gcommGdrMapping_t* m) {
  if (m == NULL) return;
  g->unmap(g->g, m->mh, m->cpu, m->bytes);
  g->unpin(g->g, m->mh);
  free(m);
}

void gcommGdrClose(gcommGdr_t* g) {
  if (g == NULL) return;
  g->close(g->g);
  dlclose(g->lib);
  free(g);
}
