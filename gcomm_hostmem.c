/*
 * gcomm_hostmem.c - host memory that the ranks of a node read directly (gcommHostAlloc).
 *
 * A send between two ranks of a node moves its data in one of three ways: through the FIFO slots
 * (two copies: the sender's into the slot, the receiver's out of it), by reference into plain
 * memory (one copy with process_vm_readv, which pins every page of the sender's range again at
 * each read: on the machines measured it ran at 45-80% of a memcpy's speed), or by reference into
 * a buffer of this file: one plain copy, at a memcpy's speed, or none at all where the receiver
 * reduces the peer's data straight into its own result.
 *
 * Each buffer is its own memory file (memfd_create), mapped shared into the allocating process.
 * A reference into it names the file: the allocation's number (unique in its process for the
 * process's life), the sender's descriptor of it, its address and size there. The receiver maps
 * the file once by opening /proc/<pid>/fd/<fd> (the same permission as reading the sender's
 * memory: its GCOMM_CMA check) and keeps the mapping (transports/shm.c); a number it has not seen
 * means a new buffer, even at an address and descriptor that an earlier one had.
 *
 * The list of buffers is the process's, under one lock: gcommHostAlloc and gcommHostFree from any
 * thread, and gcommHostFind from the executor, once per step that may go by reference.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "gcomm_internal.h"

typedef struct {
  char* base;
  size_t bytes;
  int fd;
  uint64_t id;
} hostBuffer_t;

static pthread_mutex_t buffersLock = PTHREAD_MUTEX_INITIALIZER;
static hostBuffer_t* buffers;
static int nBuffers, capBuffers;
static uint64_t lastId;

static gcommResult_t remember(char* base, size_t bytes, int fd) {
  gcommResult_t res = gcommSuccess;
  pthread_mutex_lock(&buffersLock);
  if (nBuffers == capBuffers) {
    int cap = capBuffers ? 2 * capBuffers : 16;
    hostBuffer_t* more = realloc(buffers, (size_t)cap * sizeof(*more));
    if (more == NULL)
      res = GCOMM_ERROR(NULL, gcommSystemError, -1, "out of memory");
    else
      buffers = more, capBuffers = cap;
  }
  if (res == gcommSuccess) buffers[nBuffers++] = (hostBuffer_t){base, bytes, fd, ++lastId};
  pthread_mutex_unlock(&buffersLock);
  return res;
}

gcommResult_t gcommHostAlloc(void** ptr, size_t bytes) {
  if (ptr == NULL) return GCOMM_ERROR(NULL, gcommInvalidArgument, -1, "ptr is NULL");
  *ptr = NULL;
  size_t page = (size_t)sysconf(_SC_PAGESIZE),
         size = bytes ? (bytes + page - 1) / page * page : page;
  if (size < bytes)
    return GCOMM_ERROR(NULL, gcommInvalidArgument, -1, "%zu bytes cannot be mapped", bytes);
  int fd = memfd_create("gcomm-host", MFD_CLOEXEC);
  if (fd < 0)
    return GCOMM_ERROR(NULL, gcommSystemError, -1, "memfd_create for %zu bytes: %s", bytes,
                       strerror(errno));
  char* base = MAP_FAILED;
  if (ftruncate(fd, (off_t)size) == 0)
    base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    int err = errno;
    close(fd);
    return GCOMM_ERROR(NULL, gcommSystemError, -1, "mapping %zu bytes of host memory: %s", bytes,
                       strerror(err));
  }
  gcommResult_t res = remember(base, size, fd);
  if (res != gcommSuccess) {
    munmap(base, size);
    close(fd);
    return res;
  }
  *ptr = base;
  return gcommSuccess;
}

gcommResult_t gcommHostFree(void* ptr) {
  if (ptr == NULL) return gcommSuccess;
  pthread_mutex_lock(&buffersLock);
  int i = 0;
  while (i < nBuffers && buffers[i].base != ptr) i++;
  hostBuffer_t b = i < nBuffers ? buffers[i] : (hostBuffer_t){NULL, 0, -1, 0};
  if (i < nBuffers) buffers[i] = buffers[--nBuffers];
  if (nBuffers == 0) free(buffers), buffers = NULL, capBuffers = 0;
  pthread_mutex_unlock(&buffersLock);
  if (b.base == NULL)
    return GCOMM_ERROR(NULL, gcommInvalidArgument, -1,
                       "%p is not the start of a buffer from gcommHostAlloc (or was freed)", ptr);
  munmap(b.base, b.bytes);
  close(b.fd);
  return gcommSuccess;
}

int gcommHostFind(const void* at, size_t bytes, gcommRef_t* ref) {
  const char* p = at;
  int found = 0;
  pthread_mutex_lock(&buffersLock);
  for (int i = 0; i < nBuffers && !found; i++) {
    const hostBuffer_t* b = &buffers[i];
    if (p >= b->base && bytes <= b->bytes && (size_t)(p - b->base) <= b->bytes - bytes) {
      ref->fileId = b->id, ref->fileBase = (uint64_t)(uintptr_t)b->base;
      ref->fileBytes = b->bytes, ref->fileFd = b->fd;
      found = 1;
    }
  }
  pthread_mutex_unlock(&buffersLock);
  return found;
}
