/*
 * transports/shm.c - connections between the processes of one node through POSIX shared memory.
 *
 * Each rank owns one segment holding the FIFOs that it receives on: one per local sender (itself
 * included, for self sends) and lane, then those FIFOs' slot lines (gcommLine_t: what the receiver
 * polls). Senders map the receiver's segment and write into it. The segment's pages are all
 * reserved at creation (posix_fallocate), so that a /dev/shm too small for them is an error at
 * init, not a SIGBUS in the middle of a collective. Names are unlinked as soon as every rank has
 * mapped them: the memory then lives exactly as long as the processes that map it, even after a
 * crash. The segment's last page holds the rank's gcommStatus_t (its error, its current
 * collectives). A caller may reserve an area before it (gcommShmArea): a GPU communicator's FIFO
 * region when it is staged through host memory (transports/p2p.c).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "gcomm_internal.h"

struct gcommShm {
  void** maps;     /* [rank]: that local rank's segment, NULL for remote ranks */
  size_t segBytes; /* every rank's segment has the same layout and size */
  size_t fifoBytes;
  size_t linesOff;           /* the FIFOs' slot lines, GCOMM_STEPS a FIFO, in the FIFOs' order */
  size_t areaOff, areaBytes; /* the caller's area (gcommShmCreate's areaBytes), 0 bytes: none */
  int unlinked;
  char name[64]; /* this rank's segment */
};

#define STATUS_BYTES 8192 /* the segment's last two pages: gcommStatus_t */
_Static_assert(sizeof(gcommStatus_t) <= STATUS_BYTES, "gcommStatus_t fits its pages");

static size_t pageRound(size_t bytes) {
  return (bytes + 4095) & ~(size_t)4095;
}

static size_t linesBytes(int nLanes, int nLocal) {
  return pageRound(sizeof(gcommLine_t) * GCOMM_STEPS * (size_t)nLanes * (size_t)nLocal);
}

size_t gcommShmSegmentBytes(size_t slotBytes, int nLanes, int nLocal, size_t areaBytes) {
  return gcommFifoBytes(slotBytes) * nLanes * nLocal + linesBytes(nLanes, nLocal) +
         pageRound(areaBytes) + STATUS_BYTES;
}

/* Why a segment could not be reserved, with what it takes: every local rank reserves one. */
static gcommResult_t noRoom(gcommComm_t comm, int err) {
  struct gcommShm* shm = comm->shm;
  struct statvfs fs;
  unsigned long long freeMb =
      statvfs("/dev/shm", &fs) == 0 ? (unsigned long long)fs.f_bavail * fs.f_frsize >> 20 : 0;
  unsigned long long needMb =
      ((unsigned long long)shm->segBytes * comm->nLocal + (1 << 20) - 1) >> 20;
  return gcommSetError(comm, gcommSystemError, -1, "gcommShmCreate",
                       "cannot reserve %zu bytes in /dev/shm for this rank's FIFOs (%s): the %d "
                       "ranks of this node need %llu MB, /dev/shm has %llu MB free. Give it more "
                       "(docker run --shm-size=%lluM or more), or lower GCOMM_BUFFSIZE (%zu bytes "
                       "a FIFO now) or GCOMM_NCHANNELS (%d now)",
                       shm->segBytes, strerror(err), comm->nLocal, needMb, freeMb, needMb + 64,
                       (size_t)GCOMM_STEPS * comm->slotBytes, comm->nChannels);
}

/* The inode of this process's pid namespace (0: unknown): segment names carry it, so that a pid
 * in a name is only ever judged in the namespace it belongs to. */
static unsigned long pidNamespace(void) {
  struct stat st;
  return stat("/proc/self/ns/pid", &st) == 0 ? (unsigned long)st.st_ino : 0;
}

/* A job killed between creating its segments and unlinking them (an init takes a few ms) leaves
 * them in /dev/shm. Removes those of this user whose creator, by the pid and namespace in the
 * name, no longer exists; never another live job's, nor a name gcomm did not make. */
static void removeStaleSegments(unsigned long ns) {
  DIR* dir = ns ? opendir("/dev/shm") : NULL;
  if (dir == NULL) return;
  for (struct dirent* e; (e = readdir(dir)) != NULL;) {
    int pid, end = 0;
    unsigned long segNs;
    struct stat st;
    if (sscanf(e->d_name, "gcomm-%d-%lu-%*u-%*d-%*x%n", &pid, &segNs, &end) != 2 ||
        e->d_name[end] != 0 || segNs != ns || pid <= 0 || !gcommProcessIsDead(pid) ||
        fstatat(dirfd(dir), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || st.st_uid != geteuid() ||
        !S_ISREG(st.st_mode))
      continue;
    char name[300];
    snprintf(name, sizeof(name), "/%s", e->d_name);
    if (shm_unlink(name) == 0)
      GCOMM_INFO(GCOMM_SUBSYS_SHM, NULL, "removed %s, left by process %d, which is gone", name,
                 pid);
  }
  closedir(dir);
}

gcommResult_t gcommShmCreate(gcommComm_t comm, gcommCard_t* card, size_t areaBytes) {
  static unsigned counter;
  struct gcommShm* shm = calloc(1, sizeof(*shm));
  if (shm == NULL) return GCOMM_ERROR(comm, gcommSystemError, -1, "out of memory");
  comm->shm = shm;
  shm->maps = calloc(comm->nranks, sizeof(void*));
  if (shm->maps == NULL) return GCOMM_ERROR(comm, gcommSystemError, -1, "out of memory");
  shm->fifoBytes = gcommFifoBytes(comm->slotBytes);
  shm->linesOff = shm->fifoBytes * comm->nLanes * comm->nLocal; /* page-aligned: so is fifoBytes */
  shm->areaOff = shm->linesOff + linesBytes(comm->nLanes, comm->nLocal);
  shm->areaBytes = pageRound(areaBytes);
  shm->segBytes = gcommShmSegmentBytes(comm->slotBytes, comm->nLanes, comm->nLocal, areaBytes);
  /* pid, pid namespace, a counter, the rank and the clock: a segment left by a dead process that
   * had this pid (killed between create and unlink; pids wrap) cannot collide with this one (CI
   * met one such), and the next init on this machine removes it (removeStaleSegments) */
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  unsigned long ns = pidNamespace();
  removeStaleSegments(ns);
  snprintf(card->shmName, sizeof(card->shmName), "/gcomm-%d-%lu-%u-%d-%lx", (int)getpid(), ns,
           __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED), comm->rank,
           (unsigned long)now.tv_sec * 1000000000ul + (unsigned long)now.tv_nsec);
  snprintf(shm->name, sizeof(shm->name), "%s", card->shmName);
  int fd = shm_open(card->shmName, O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0)
    return GCOMM_ERROR(comm, gcommSystemError, -1, "shm_open(%s): %s", card->shmName,
                       strerror(errno));
  if (ftruncate(fd, (off_t)shm->segBytes) != 0) {
    int err = errno;
    close(fd);
    gcommShmUnlink(comm);
    return GCOMM_ERROR(comm, gcommSystemError, -1, "ftruncate(%s, %zu): %s", card->shmName,
                       shm->segBytes, strerror(err));
  }
  /* take every page now: a full /dev/shm is then an error here, naming the remedy, rather than
   * a SIGBUS at the first touch of a page tmpfs cannot provide (Docker gives 64 MB by default) */
  int err = posix_fallocate(fd, 0, (off_t)shm->segBytes);
  if (err != 0 && err != EOPNOTSUPP && err != EINVAL) {
    close(fd);
    gcommShmUnlink(comm);
    return noRoom(comm, err);
  }
  void* p = mmap(NULL, shm->segBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  err = errno;
  close(fd);
  if (p == MAP_FAILED) {
    gcommShmUnlink(comm);
    return GCOMM_ERROR(comm, gcommSystemError, -1, "mmap(%s, %zu): %s", card->shmName,
                       shm->segBytes, strerror(err));
  }
  shm->maps[comm->rank] = p;
  GCOMM_INFO(GCOMM_SUBSYS_SHM, comm, "segment %s: %zu bytes (%d local ranks x %d lanes x %zu)",
             card->shmName, shm->segBytes, comm->nLocal, comm->nLanes, shm->fifoBytes);
  return gcommSuccess;
}

static gcommConn_t makeConn(struct gcommShm* shm, void* seg, int senderIdx, int lane, int nLanes,
                            size_t slotBytes, int peer) {
  gcommConn_t c;
  memset(&c, 0, sizeof(c)); /* fields for other transports (refs) stay empty */
  size_t fifoIdx = (size_t)senderIdx * nLanes + lane;
  char* base = (char*)seg + fifoIdx * shm->fifoBytes;
  c.fifo = (gcommFifo_t*)base;
  c.lines = (gcommLine_t*)((char*)seg + shm->linesOff) + fifoIdx * GCOMM_STEPS;
  c.slots = base + sizeof(gcommFifo_t);
  c.step = 0;
  c.slotBytes = slotBytes;
  c.peer = peer;
  return c;
}

gcommResult_t gcommShmConnect(gcommComm_t comm) {
  struct gcommShm* shm = comm->shm;
  int me = comm->rank, myIdx = gcommLocalIndex(comm, me);
  for (int p = 0; p < comm->nranks; p++) {
    if (comm->cards[p].hostId != comm->cards[me].hostId) continue;
    if (p != me) {
      int fd = shm_open(comm->cards[p].shmName, O_RDWR, 0600);
      if (fd < 0)
        return GCOMM_ERROR(comm, gcommSystemError, p, "shm_open(%s): %s", comm->cards[p].shmName,
                           strerror(errno));
      void* m = mmap(NULL, shm->segBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      int err = errno;
      close(fd);
      if (m == MAP_FAILED)
        return GCOMM_ERROR(comm, gcommSystemError, p, "mmap(%s): %s", comm->cards[p].shmName,
                           strerror(err));
      shm->maps[p] = m;
    }
    int peerIdx = gcommLocalIndex(comm, p);
    for (int lane = 0; lane < comm->nLanes; lane++) {
      comm->sendConns[lane * comm->nranks + p] =
          makeConn(shm, shm->maps[p], myIdx, lane, comm->nLanes, comm->slotBytes, p);
      comm->recvConns[lane * comm->nranks + p] =
          makeConn(shm, shm->maps[me], peerIdx, lane, comm->nLanes, comm->slotBytes, p);
    }
  }
  return gcommSuccess;
}

gcommStatus_t* gcommShmStatus(gcommComm_t comm, int rank) {
  struct gcommShm* shm = comm->shm;
  if (shm == NULL || shm->maps[rank] == NULL) return NULL;
  return (gcommStatus_t*)((char*)shm->maps[rank] + shm->segBytes - STATUS_BYTES);
}

void* gcommShmArea(gcommComm_t comm, int rank) {
  struct gcommShm* shm = comm->shm;
  if (shm == NULL || shm->areaBytes == 0 || shm->maps[rank] == NULL) return NULL;
  return (char*)shm->maps[rank] + shm->areaOff;
}

void gcommShmUnlink(gcommComm_t comm) {
  struct gcommShm* shm = comm->shm;
  if (shm == NULL || shm->unlinked || shm->name[0] == 0) return;
  shm_unlink(shm->name);
  shm->unlinked = 1;
}

void gcommShmFree(gcommComm_t comm) {
  struct gcommShm* shm = comm->shm;
  if (shm == NULL) return;
  gcommShmUnlink(comm);
  for (int p = 0; p < comm->nranks; p++)
    if (shm->maps[p] != NULL) munmap(shm->maps[p], shm->segBytes);
  free(shm->maps);
  free(shm);
  comm->shm = NULL;
}

/* gcommShmCreate comes before the cards are exchanged (a card names the segment); the rest of
 * the setup is this transport's connect. */
const gcommTransport_t gcommShmTransport = {
    .name = "shared memory",
    .connect = gcommShmConnect,
    .connectWhat = "shared-memory connection",
    .connected = gcommShmUnlink, /* every rank has mapped every segment it needs */
    .status = gcommShmStatus,
    .free = gcommShmFree,
};
