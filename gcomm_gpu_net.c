/*
 * gcomm_gpu_net.c - a GPU communicator's FIFOs to ranks on other nodes (make OFI=1): pinned host
 * memory mapped for the GPU, or GPU memory the provider takes (FI_HMEM, GCOMM_NET_GDR), which the
 * network's proxy moves (transports/net_ofi.c) while the kernels fill and drain them.
 */
#include <stdio.h>
#include <string.h>

#include "gcomm_gpu_engine.h"

#ifdef GCOMM_OFI
/* The network FIFO slots in GPU memory, one cudaMalloc of bytes registered with FI_HMEM: 1, or 0
 * (staged) with *why saying why. A registration that fails stages with GCOMM_NET_GDR=auto (its
 * error logged), and is an error with GCOMM_NET_GDR=1. */
static gcommResult_t netSlotsOnGpu(gcommComm_t comm, size_t bytes, int* onGpu, const char** why) {
  struct gcommDev* d = comm->dev;
  *onGpu = gcommNetDeviceMemory(comm, why);
  if (!*onGpu) return gcommSuccess;
  CUDA_CHECK(comm, -1, cudaMalloc((void**)&d->netSlots, bytes));
  gcommResult_t res = gcommNetRegister(comm, d->netSlots, bytes, comm->device);
  if (res == gcommSuccess || comm->params.netGdr == GCOMM_NET_GDR_ON) return res;
  cudaFree(d->netSlots);
  d->netSlots = NULL;
  *onGpu = 0;
  *why = "the provider could not register GPU memory (the error above)";
  return gcommSuccess;
}

gcommResult_t gcommDeviceNetFence(gcommComm_t comm, int providerCopies) {
  if (providerCopies) CUDA_CHECK(comm, -1, cudaStreamSynchronize(NULL)); /* legacy stream */
  gcommGpuFlush(comm->dev);
  return gcommSuccess;
}

/* Each rank on another node gets, per lane, a send and a receive FIFO: its counters (gcommFifo_t)
 * in pinned host memory mapped for the GPU, one allocation for all of them, where the proxy reads
 * them without CUDA calls; its GCOMM_STEPS slots right after them there (staged: 2 x nLanes x
 * (GCOMM_STEPS x slotBytes + a page) per remote rank), or, when the provider takes GPU memory
 * (FI_HMEM, netSlotsOnGpu), in one cudaMalloc registered with it, the messages going from and into
 * the GPU's memory directly. The host view goes to comm->sendConns / recvConns and
 * gcommNetConnect (the progress thread moves the slots); the device aliases of the same tail,
 * head, bytes[] and slots go to the kernels' connections hc (send to p at [lane * n + p], receive
 * at nc + that), which work the same either way. Both count steps from 0: the send FIFO's tail is
 * the kernel's (slots filled) and its head the network's (sends completed); the receive FIFO's
 * tail is the network's (receives completed, bytes[] written first) and its head the kernel's
 * (slots drained). */
gcommResult_t gcommGpuNetConnect(gcommComm_t comm, gcommDevConn_t* hc, uint64_t* steps) {
  struct gcommDev* d = comm->dev;
  int n = comm->nranks, me = comm->rank, nRemote = 0;
  for (int p = 0; p < n; p++) nRemote += comm->cards[p].hostId != comm->cards[me].hostId;
  if (nRemote == 0) return gcommSuccess;
  size_t nFifos = (size_t)nRemote * comm->nLanes * 2, nc = (size_t)comm->nLanes * n;
  size_t slotsBytes = GCOMM_STEPS * comm->slotBytes;
  int onGpu = 0;
  const char* why = NULL;
  GCOMM_CHECK(netSlotsOnGpu(comm, nFifos * slotsBytes, &onGpu, &why));
  _Static_assert(sizeof(gcommFifo_t) <= GCOMM_DEV_FIFO_HDR, "a FIFO header holds gcommFifo_t");
  size_t fifoBytes = onGpu ? GCOMM_DEV_FIFO_HDR : gcommFifoBytes(comm->slotBytes);
  size_t bytes = fifoBytes * nFifos;
  CUDA_CHECK(comm, -1, cudaHostAlloc((void**)&d->netFifos, bytes, cudaHostAllocMapped));
  memset(d->netFifos, 0, bytes); /* counters start at 0 */
  if (!onGpu) GCOMM_CHECK(gcommNetRegister(comm, d->netFifos, bytes, -1));
  char* dev = NULL;
  CUDA_CHECK(comm, -1, cudaHostGetDevicePointer((void**)&dev, d->netFifos, 0));
  size_t k = 0;
  for (int p = 0; p < n; p++) {
    if (comm->cards[p].hostId == comm->cards[me].hostId) continue;
    for (int lane = 0; lane < comm->nLanes; lane++) {
      for (int isSend = 1; isSend >= 0; isSend--, k++) {
        size_t i = (size_t)lane * n + p, at = isSend ? i : nc + i;
        gcommConn_t* c = isSend ? &comm->sendConns[i] : &comm->recvConns[i];
        gcommFifo_t* f = (gcommFifo_t*)(dev + k * fifoBytes); /* the device's alias */
        c->fifo = (gcommFifo_t*)(d->netFifos + k * fifoBytes);
        c->slots = onGpu ? d->netSlots + k * slotsBytes : (char*)(c->fifo + 1);
        c->step = 0;
        c->slotBytes = comm->slotBytes;
        c->peer = p;
        GCOMM_CHECK(gcommNetConnect(comm, c, p, lane, isSend));
        hc[at].tail = &f->tail;
        hc[at].head = &f->head;
        hc[at].bytes = f->bytes;
        hc[at].slots = onGpu ? c->slots : (char*)(f + 1);
        hc[at].llSlots = NULL; /* LL is never chosen between nodes */
        hc[at].step = steps + at;
      }
    }
  }
  if (onGpu) gcommGpuFlushMap(comm);
  if (!onGpu && comm->params.gdrFlush)
    GCOMM_INFO(GCOMM_SUBSYS_INIT | GCOMM_SUBSYS_NET, comm,
               "GCOMM_GDRCOPY_FLUSH_ENABLE=1: the network FIFOs are in host memory: no flush");
  if (onGpu)
    GCOMM_INFO(GCOMM_SUBSYS_INIT | GCOMM_SUBSYS_NET, comm,
               "GPU %d: %d remote ranks, %zu network FIFOs: slots in GPU memory registered with "
               "FI_HMEM (%zu bytes), counters in pinned host memory (%zu bytes)",
               comm->device, nRemote, k, nFifos * slotsBytes, bytes);
  else
    GCOMM_INFO(GCOMM_SUBSYS_INIT | GCOMM_SUBSYS_NET, comm,
               "GPU %d: %d remote ranks, %zu network FIFOs of %zu bytes staged in pinned host "
               "memory (%zu bytes): no FI_HMEM: %s",
               comm->device, nRemote, k, fifoBytes, bytes, why);
  return gcommSuccess;
}
#endif
