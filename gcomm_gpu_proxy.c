/*
 * gcomm_gpu_proxy.c - where the progress thread's CUDA work runs and what it reads GPU memory
 * through: a CUDA context of its own (GCOMM_CREATE_THREAD_CONTEXT=1: cuCtxCreate through the
 * driver's entry points, no link to libcuda) instead of the GPU's primary context, which the
 * application's work shares; and gdrcopy's CPU mappings of GPU memory (gcomm_gdr.c) for the copy
 * engines' staging words (GCOMM_GDRCOPY_SYNC_ENABLE) and the network's flush of GPUDirect RDMA
 * writes (GCOMM_GDRCOPY_FLUSH_ENABLE). Every one of them falls back, said at INFO, where it is
 * not available.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "gcomm_gpu_engine.h"

/* ---- The proxy's own context ---- */

#ifndef GCOMM_HIP
/* The driver calls used, as the CUDA 12.0 ABI has them (CUresult, CUcontext and CUdevice as the
 * plain types they are), found with cudaGetDriverEntryPointByVersion: cuCtxCreate is then its
 * 11.4 form (execution-affinity parameters, none passed). */
#define CU_CTX_MAP_HOST 0x08
static struct {
  int (*ctxCreate)(void** ctx, const void* affinity, int nAffinity, unsigned flags, int dev);
  int (*ctxDestroy)(void* ctx);
  int (*ctxPush)(void* ctx);
  int (*ctxPop)(void** ctx);
  int (*ctxSetCurrent)(void* ctx);
  int (*deviceGet)(int* dev, int ordinal);
  const char* missing; /* the first call not found, or NULL */
} drv;
static pthread_once_t drvOnce = PTHREAD_ONCE_INIT;

static void drvEntry(const char* name, void** fn) {
  enum cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion(name, fn, 12000, cudaEnableDefault, &found) != cudaSuccess ||
      found != cudaDriverEntryPointSuccess) {
    cudaGetLastError();
    *fn = NULL;
    if (drv.missing == NULL) drv.missing = name;
  }
}

static void drvLoad(void) {
  drvEntry("cuCtxCreate", (void**)&drv.ctxCreate);
  drvEntry("cuCtxDestroy", (void**)&drv.ctxDestroy);
  drvEntry("cuCtxPushCurrent", (void**)&drv.ctxPush);
  drvEntry("cuCtxPopCurrent", (void**)&drv.ctxPop);
  drvEntry("cuCtxSetCurrent", (void**)&drv.ctxSetCurrent);
  drvEntry("cuDeviceGet", (void**)&drv.deviceGet);
}

/* A context of its own on comm's GPU, left current nowhere; NULL (said why at INFO) when the
 * driver cannot make one: the primary context then. */
static void* createContext(gcommComm_t comm) {
  pthread_once(&drvOnce, drvLoad);
  if (drv.missing != NULL) {
    GCOMM_INFO(GCOMM_SUBSYS_INIT, comm,
               "GCOMM_CREATE_THREAD_CONTEXT=1: the driver has no %s: the proxy works in the "
               "primary context",
               drv.missing);
    return NULL;
  }
  int dev = 0, rc = drv.deviceGet(&dev, comm->device);
  void *ctx = NULL, *popped = NULL;
  if (rc == 0) rc = drv.ctxCreate(&ctx, NULL, 0, CU_CTX_MAP_HOST, dev);
  if (rc == 0) drv.ctxPop(&popped); /* cuCtxCreate made it current: the caller's comes back */
  if (rc != 0)
    GCOMM_INFO(GCOMM_SUBSYS_INIT, comm,
               "GCOMM_CREATE_THREAD_CONTEXT=1: cuCtxCreate on GPU %d failed (CUresult %d): the "
               "proxy works in the primary context",
               comm->device, rc);
  return rc == 0 ? ctx : NULL;
}
#endif

gcommResult_t gcommGpuProxySetup(gcommComm_t comm) {
  int netFifos = 0;
#ifdef GCOMM_OFI
  netFifos = comm->net != NULL;
#endif
  if (comm->params.gdrFlush && !netFifos)
    GCOMM_INFO(GCOMM_SUBSYS_INIT, comm,
               "GCOMM_GDRCOPY_FLUSH_ENABLE=1: no network FIFOs here, so nothing to flush");
  if (!comm->params.threadContext) return gcommSuccess;
#ifdef GCOMM_HIP
  GCOMM_INFO(GCOMM_SUBSYS_INIT, comm,
             "GCOMM_CREATE_THREAD_CONTEXT=1 is ignored on ROCm: the proxy works in the device's "
             "primary context");
#else
  comm->dev->proxyCtx = createContext(comm);
  if (comm->dev->proxyCtx != NULL)
    GCOMM_INFO(GCOMM_SUBSYS_INIT, comm,
               "GCOMM_CREATE_THREAD_CONTEXT=1: the proxy's CUDA work (copy engines, network "
               "fences) runs in a context of its own on GPU %d (cuCtxCreate)",
               comm->device);
#endif
  return gcommSuccess;
}

gcommResult_t gcommGpuProxyEnter(gcommComm_t comm, gcommProxyCtx_t* saved) {
  struct gcommDev* d = comm->dev;
  saved->device = -1;
#ifndef GCOMM_HIP
  if (d->proxyCtx != NULL) {
    int rc = drv.ctxPush(d->proxyCtx);
    if (rc != 0)
      return GCOMM_ERROR(comm, gcommDeviceError, -1,
                         "GPU %d: cuCtxPushCurrent of the proxy's context failed (CUresult %d)",
                         comm->device, rc);
  }
#endif
  if (d->proxyCtx == NULL) {
    cudaGetDevice(&saved->device);
    if (saved->device != comm->device) cudaSetDevice(comm->device);
  }
  /* relaxed: these calls must not invalidate a graph the user captures meanwhile in global mode */
  saved->mode = cudaStreamCaptureModeRelaxed;
  cudaThreadExchangeStreamCaptureMode(&saved->mode);
  return gcommSuccess;
}

void gcommGpuProxyLeave(gcommComm_t comm, gcommProxyCtx_t saved) {
  cudaThreadExchangeStreamCaptureMode(&saved.mode);
#ifndef GCOMM_HIP
  void* popped = NULL;
  if (comm->dev->proxyCtx != NULL) drv.ctxPop(&popped);
#endif
  if (comm->dev->proxyCtx == NULL && saved.device >= 0 && saved.device != comm->device)
    cudaSetDevice(saved.device);
}

int gcommGpuProxyBind(gcommComm_t comm) {
#ifndef GCOMM_HIP
  if (comm->dev != NULL && comm->dev->proxyCtx != NULL) {
    int rc = drv.ctxSetCurrent(comm->dev->proxyCtx);
    if (rc != 0)
      GCOMM_WARN(comm, "progress thread: cuCtxSetCurrent of the proxy's context failed (%d)", rc);
    return rc == 0;
  }
#endif
  (void)comm;
  return 0;
}

/* ---- gdrcopy ---- */

/* gdrcopy, opened at the first knob that asks for it; NULL (said once at INFO) where absent. */
static gcommGdr_t* proxyGdr(gcommComm_t comm, const char* knob) {
  struct gcommDev* d = comm->dev;
  if (d->gdr != NULL || d->gdrMissing) return d->gdr;
  char why[512];
  d->gdr = gcommGdrOpen(comm->params.gdrLib, why, sizeof(why));
  d->gdrMissing = d->gdr == NULL;
  if (d->gdr == NULL)
    GCOMM_INFO(GCOMM_SUBSYS_INIT, comm, "%s=1: no gdrcopy (%s): falling back to %s", knob, why,
               comm->params.gdrSync && comm->params.gdrFlush
                   ? "staging words in host memory and no flush"
               : comm->params.gdrSync ? "staging words in mapped host memory"
                                      : "no flush");
  return d->gdr;
}

/* bytes (and more, to whole GPU pages) of zeroed GPU memory mapped for the CPU by gdrcopy: m, with
 * *gpu its first page (within *alloc, the cudaMalloc'd block); 0 with why[] when not. */
static int gdrGpuMemory(gcommComm_t comm, gcommGdr_t* g, size_t bytes, gpuMapping_t* m, char* why,
                        size_t len) {
  size_t mapped = (bytes + GCOMM_GDR_PAGE - 1) & ~(size_t)(GCOMM_GDR_PAGE - 1);
  cudaError_t e = cudaMalloc(&m->alloc, mapped + GCOMM_GDR_PAGE);
  if (e == cudaSuccess) {
    uintptr_t a = ((uintptr_t)m->alloc + GCOMM_GDR_PAGE - 1) & ~(uintptr_t)(GCOMM_GDR_PAGE - 1);
    m->gpu = (char*)a;
    e = cudaMemset(m->gpu, 0, mapped);
  }
  if (e != cudaSuccess) {
    snprintf(why, len, "cudaMalloc/cudaMemset of %zu bytes: %s", mapped, cudaGetErrorString(e));
    if (m->alloc) cudaFree(m->alloc);
    m->alloc = NULL;
    return 0;
  }
  m->map = gcommGdrMap(g, (uint64_t)(uintptr_t)m->gpu, mapped, why, len);
  if (m->map == NULL) {
    cudaFree(m->alloc);
    m->alloc = NULL;
    return 0;
  }
  (void)comm;
  return 1;
}

static void gdrGpuMemoryFree(struct gcommDev* d, gpuMapping_t* m) {
  if (m->map != NULL) gcommGdrUnmap(d->gdr, m->map);
  if (m->alloc != NULL && !d->keepMemory) cudaFree(m->alloc);
  m->map = NULL;
  m->alloc = NULL;
}

void gcommGpuSyncMap(gcommComm_t comm, size_t bytes) {
  struct gcommDev* d = comm->dev;
  gcommGdr_t* g = comm->params.gdrSync ? proxyGdr(comm, "GCOMM_GDRCOPY_SYNC_ENABLE") : NULL;
  char why[512];
  if (g == NULL) return;
  if (gdrGpuMemory(comm, g, bytes, &d->syncMem, why, sizeof(why))) {
    d->ceSync = d->syncMem.gpu;
    d->ceSyncMap = d->syncMem.map;
  } else {
    GCOMM_INFO(GCOMM_SUBSYS_INIT, comm,
               "GCOMM_GDRCOPY_SYNC_ENABLE=1: %s: staging words in mapped host memory", why);
  }
}

void gcommGpuFlushMap(gcommComm_t comm) {
  struct gcommDev* d = comm->dev;
  gcommGdr_t* g = comm->params.gdrFlush ? proxyGdr(comm, "GCOMM_GDRCOPY_FLUSH_ENABLE") : NULL;
  char why[512];
  if (g == NULL) return;
  if (gdrGpuMemory(comm, g, sizeof(uint64_t), &d->flushMem, why, sizeof(why))) {
    d->flushWord = (volatile uint64_t*)gcommGdrCpu(d->flushMem.map);
    GCOMM_INFO(GCOMM_SUBSYS_INIT | GCOMM_SUBSYS_NET, comm,
               "GCOMM_GDRCOPY_FLUSH_ENABLE=1: network receives into GPU %d's memory are flushed "
               "by a PCIe read through gdrcopy before their tail moves",
               comm->device);
  } else {
    GCOMM_INFO(GCOMM_SUBSYS_INIT, comm, "GCOMM_GDRCOPY_FLUSH_ENABLE=1: %s: no flush", why);
  }
}

void gcommGpuFlush(struct gcommDev* d) {
  if (d->flushWord != NULL) (void)*d->flushWord; /* completes after the NIC's earlier writes */
}

void gcommGpuProxyFree(gcommComm_t comm) {
  struct gcommDev* d = comm->dev;
  gdrGpuMemoryFree(d, &d->syncMem);
  gdrGpuMemoryFree(d, &d->flushMem);
  d->ceSync = NULL;
  d->ceSyncMap = NULL;
  d->flushWord = NULL;
  gcommGdrClose(d->gdr);
  d->gdr = NULL;
#ifndef GCOMM_HIP
  if (d->proxyCtx != NULL) drv.ctxDestroy(d->proxyCtx);
#endif
  d->proxyCtx = NULL;
}
