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
 *
 * One copy (GCOMM_CMA, host communicators): the line of a slot whose payload does not fit in it
 * carries a reference: where in the sender's memory the slot's data is, when the sender handed a
 * large step over by reference instead of copying it into the slot (NULL: it is in the slot). The
 * receiver copies it from there once (process_vm_readv), and its head then tells the sender that
 * the memory is free. That takes the right to read another process's memory (ptrace's access
 * check: the same user and Yama's ptrace_scope 0, or CAP_SYS_PTRACE; a container's seccomp
 * profile may refuse the call), so each rank reads a word of every other rank of its node at
 * setup, and the ranks use references only when every such read succeeded, every rank deciding
 * alike. A reference into a buffer of gcommHostAlloc names that buffer's file too: the receiver
 * maps the file once (peerFile) and reads with plain loads (gcomm_hostmem.c).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "gcomm_internal.h"

/* Another rank's buffer from gcommHostAlloc as this rank maps it: its allocation number there
 * (0: an unused entry), where it is mapped here (NULL: it could not be, and is read with
 * process_vm_readv), its size, and when it was last used. PEER_FILES a peer (a send buffer and a
 * receive buffer or two, as a rule): the least recently used of that peer's is let go when a new
 * one comes, so that a lookup scans a few entries at any rank count. */
#define PEER_FILES 8
typedef struct {
  uint64_t id;
  const char* at;
  size_t bytes;
  uint64_t used;
} peerFile_t;

struct gcommShm {
  void** maps;     /* [rank]: that local rank's segment, NULL for remote ranks */
  size_t segBytes; /* every rank's segment has the same layout and size */
  size_t fifoBytes;
  size_t linesOff;           /* the FIFOs' lines, GCOMM_LINES a FIFO, in the FIFOs' order */
  size_t areaOff, areaBytes; /* the caller's area (gcommShmCreate's areaBytes), 0 bytes: none */
  int unlinked;
  char name[64];    /* this rank's segment */
  uint64_t cmaWord; /* the word the ranks of the node read at setup (card.cmaWord, cmaAt) */
  /* what this rank's send FIFOs to the ranks of its node handed over by reference, GCOMM_STEPS a
   * FIFO (gcommConn_t.refs; GCOMM_CMA): the sender's own record, which its receiver never reads */
  const char** sentRefs;
  peerFile_t* files; /* [rank * PEER_FILES], made at the first reference into such a buffer */
  uint64_t filesUsed;
};

#define STATUS_BYTES 8192 /* the segment's last two pages: gcommStatus_t */
_Static_assert(sizeof(gcommStatus_t) <= STATUS_BYTES, "gcommStatus_t fits its pages");

static size_t pageRound(size_t bytes) {
  return (bytes + 4095) & ~(size_t)4095;
}

static size_t linesBytes(int nLanes, int nLocal) {
  return pageRound(sizeof(gcommLine_t) * GCOMM_LINES * (size_t)nLanes * (size_t)nLocal);
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
  shm->cmaWord = ((uint64_t)getpid() << 32 ^ (uint64_t)now.tv_nsec ^ (uint64_t)comm->rank) | 1;
  card->cmaWord = shm->cmaWord;
  card->cmaAt = (uint64_t)(uintptr_t)&shm->cmaWord;
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
  card->shmAt = (uint64_t)(uintptr_t)p;
  GCOMM_INFO(GCOMM_SUBSYS_SHM, comm, "segment %s: %zu bytes (%d local ranks x %d lanes x %zu)",
             card->shmName, shm->segBytes, comm->nLocal, comm->nLanes, shm->fifoBytes);
  return gcommSuccess;
}

/* Where in a segment the FIFO from local sender senderIdx on lane is, among the FIFOs and among
 * their lines alike. */
static size_t fifoIndex(int senderIdx, int lane, int nLanes) {
  return (size_t)senderIdx * nLanes + lane;
}

static gcommConn_t makeConn(struct gcommShm* shm, void* seg, int senderIdx, int lane, int nLanes,
                            size_t slotBytes, int peer) {
  gcommConn_t c;
  memset(&c, 0, sizeof(c)); /* references stay off until the ranks agree (shmConnected) */
  size_t fifoIdx = fifoIndex(senderIdx, lane, nLanes);
  char* base = (char*)seg + fifoIdx * shm->fifoBytes;
  c.fifo = (gcommFifo_t*)base;
  c.lines = (gcommLine_t*)((char*)seg + shm->linesOff) + fifoIdx * GCOMM_LINES;
  c.slots = base + sizeof(gcommFifo_t);
  /* map the first page of each slot now, which every payload too large for a line writes or
   * reads: else the first trip through each slot pays a page fault on both sides (2 ranks on a
   * 2-vCPU VM, the first 20 send/recv of 64 B: 1.2-1.5 us each, 0.7 once mapped) */
  for (int s = 0; s < GCOMM_STEPS; s++) (void)*(volatile char*)(c.slots + (size_t)s * slotBytes);
  c.step = 0;
  c.slotBytes = slotBytes;
  c.peer = peer;
  return c;
}

gcommResult_t gcommShmConnect(gcommComm_t comm) {
  struct gcommShm* shm = comm->shm;
  int me = comm->rank, myIdx = gcommLocalIndex(comm, me);
  if (comm->device < 0 && comm->params.cma != GCOMM_CMA_OFF) { /* should the ranks use one copy */
    shm->sentRefs = calloc((size_t)comm->nLocal * comm->nLanes * GCOMM_STEPS, sizeof(char*));
    if (shm->sentRefs == NULL) return GCOMM_ERROR(comm, gcommSystemError, -1, "out of memory");
  }
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

/* Whether this rank may read the memory of every other rank of its node: it reads each one's
 * word (card.cmaAt) and finds its value. 0 with *err (an errno, or 0 for a wrong value: another
 * process by that pid, of another pid namespace) and *peer saying whose read failed. */
static int mayReadPeers(gcommComm_t comm, int* err, int* peer) {
  for (int i = 0; i < comm->nLocal; i++) {
    int p = comm->localRanks[i];
    uint64_t got = 0;
    struct iovec local = {&got, sizeof(got)};
    struct iovec remote = {(void*)(uintptr_t)comm->cards[p].cmaAt, sizeof(got)};
    if (p == comm->rank) continue;
    ssize_t n = process_vm_readv(comm->cards[p].pid, &local, 1, &remote, 1, 0);
    if (n != (ssize_t)sizeof(got) || got != comm->cards[p].cmaWord) {
      *err = n < 0 ? errno : 0;
      *peer = p;
      return 0;
    }
  }
  return 1;
}

/* How fast this rank reads another's memory against a copy of memory it maps (GCOMM_CMA=auto):
 * the same pages of the next local rank's segment (the FIFO this rank sends it on), read with
 * process_vm_readv and copied from this rank's mapping, each once to warm, then the best of 3: a
 * read's speed in per mille of a copy's (0: the read failed), or -1 (no other local rank, or out
 * of memory). Under some hypervisors a read pins every page at great cost (the 2 vCPUs of a
 * microVM: 5-10% of a copy's speed). */
static int readSpeed(gcommComm_t comm) {
  struct gcommShm* shm = comm->shm;
  int me = gcommLocalIndex(comm, comm->rank);
  int p = comm->localRanks[(me + 1) % comm->nLocal];
  size_t len = gcommMinSize(256 << 10, GCOMM_STEPS * comm->slotBytes);
  size_t off = fifoIndex(me, 0, comm->nLanes) * shm->fifoBytes + sizeof(gcommFifo_t);
  char* to = p == comm->rank ? NULL : malloc(len);
  if (to == NULL) return -1;
  uint64_t readNs = UINT64_MAX, copyNs = UINT64_MAX;
  for (int k = 0; k < 4; k++) {
    struct iovec local = {to, len}, remote = {(char*)(uintptr_t)comm->cards[p].shmAt + off, len};
    uint64_t t0 = gcommNowNs();
    ssize_t n = process_vm_readv(comm->cards[p].pid, &local, 1, &remote, 1, 0);
    uint64_t t1 = gcommNowNs();
    memcpy(to, (char*)shm->maps[p] + off, len);
    uint64_t t2 = gcommNowNs();
    if (n != (ssize_t)len) {
      readNs = 0;
      break;
    }
    if (k == 0) continue; /* the first warms page tables and caches */
    if (t1 - t0 < readNs) readNs = t1 - t0;
    if (t2 - t1 < copyNs) copyNs = t2 - t1;
  }
  free(to);
  return readNs == 0 ? 0 : (int)gcommMinSize(1000000, copyNs * 1000 / readNs);
}

/* The smallest step handed over by reference: GCOMM_CMA_MIN_BYTES from plain memory, a quarter
 * of it from a buffer of gcommHostAlloc (whose receiver reads with plain loads, no page pinning:
 * 32 cores, 8-16 ranks, 256 KB-1 MB all-to-all(v), scatter(v) and all-gatherv, from 16 KB
 * 1.1-7x faster than from 64 KB, from 8 KB no faster again), and more than a slot's line carries
 * (such a payload goes in one line already, and the line has no room for a reference). */
static size_t refMinBytes(gcommComm_t comm, int fromFile) {
  size_t min = (size_t)comm->params.cmaMinBytes / (fromFile ? 4 : 1);
  return min > GCOMM_LINE_PAYLOAD ? min : GCOMM_LINE_PAYLOAD + 1;
}

/* Points every send connection to a rank of this node at its record of references, and both
 * sides at the peer's process (comm->cma). */
static void useReferences(gcommComm_t comm) {
  struct gcommShm* shm = comm->shm;
  for (int i = 0; i < comm->nLocal; i++) {
    int p = comm->localRanks[i];
    for (int lane = 0; lane < comm->nLanes; lane++) {
      gcommConn_t* s = &comm->sendConns[lane * comm->nranks + p];
      gcommConn_t* r = &comm->recvConns[lane * comm->nranks + p];
      s->refs = shm->sentRefs + fifoIndex(i, lane, comm->nLanes) * GCOMM_STEPS;
      s->refMinBytes = refMinBytes(comm, 0);
      s->refMinFileBytes = refMinBytes(comm, 1);
      s->refPid = r->refPid = comm->cards[p].pid;
    }
  }
}

/* What each rank tells the others at setup about one copy (GCOMM_CMA). */
enum { CMA_MODE, CMA_READS, CMA_ERR, CMA_PEER, CMA_SPEED, CMA_FIELDS };

/* The one decision of every rank from what all told (all[rank * CMA_FIELDS + field]): off where
 * any rank says GCOMM_CMA=0 or cannot read a local peer (*refused: the first such rank), else on,
 * with *speed the median speed the ranks measured (per mille of a copy's; -1: none measured), and
 * the speed the executor weighs each send by (comm->cmaSpeed: GCOMM_CMA_ALWAYS where every rank
 * says 1; a copy's where none measured). */
static int decideCma(gcommComm_t comm, const int* all, int* refused, int* speed) {
  int n = comm->nranks, forced = 1, nSpeeds = 0;
  int* speeds = malloc(sizeof(int) * (size_t)n);
  *refused = -1, *speed = -1;
  for (int r = 0; r < n; r++) {
    const int* f = all + (size_t)r * CMA_FIELDS;
    if (f[CMA_MODE] == GCOMM_CMA_OFF) forced = 0, *refused = -2;
    if (f[CMA_MODE] != GCOMM_CMA_ON) forced = 0;
    if (!f[CMA_READS] && *refused == -1) *refused = r;
    if (f[CMA_SPEED] >= 0 && speeds != NULL) speeds[nSpeeds++] = f[CMA_SPEED];
  }
  for (int i = 1; i < nSpeeds; i++) /* a few ranks: insertion sort */
    for (int j = i; j > 0 && speeds[j - 1] > speeds[j]; j--) {
      int t = speeds[j];
      speeds[j] = speeds[j - 1], speeds[j - 1] = t;
    }
  if (nSpeeds > 0) *speed = speeds[nSpeeds / 2];
  free(speeds);
  comm->cmaSpeed = forced ? GCOMM_CMA_ALWAYS : *speed >= 0 ? *speed : 1000;
  return *refused == -1;
}

/* Rank 0 says at GCOMM_DEBUG=INFO what the ranks decided about one copy, and why. */
static void sayCma(gcommComm_t comm, const int* all, int refused, int speed) {
  char fast[256] = "";
  if (comm->rank != 0 || comm->nLocal < 2 || comm->device >= 0) return;
  if (speed >= 0)
    snprintf(fast, sizeof(fast),
             "; such a read runs at %d%% of a copy's speed (the median rank's): used by "
             "exchanges from 35%%, a root's sends to every rank from %d%%, a ring's or tree's "
             "from 100%%",
             speed / 10, comm->nLocal > 1 ? 100 / (comm->nLocal - 1) : 100);
  if (comm->cma) {
    GCOMM_INFO(GCOMM_SUBSYS_SHM, comm,
               "one copy between local ranks for steps of %zu bytes or more from buffers of "
               "gcommHostAlloc (read where they lie), %zu from other memory (process_vm_readv)%s",
               refMinBytes(comm, 1), refMinBytes(comm, 0), fast);
  } else if (refused >= 0) {
    const int* f = all + (size_t)refused * CMA_FIELDS;
    GCOMM_INFO(GCOMM_SUBSYS_SHM, comm,
               "no one copy between local ranks: rank %d cannot read rank %d's memory (%s: "
               "ptrace's access check, Yama's ptrace_scope or a container's seccomp profile "
               "refuses process_vm_readv); every step goes through the FIFO slots",
               refused, f[CMA_PEER],
               f[CMA_ERR] ? strerror(f[CMA_ERR]) : "another process has that pid");
  } else {
    GCOMM_INFO(GCOMM_SUBSYS_SHM, comm, "no one copy between local ranks: GCOMM_CMA=0");
  }
}

/* Every rank has mapped every segment it needs: the names go, and the ranks decide alike on one
 * copy between local ranks (a host communicator; GCOMM_CMA; every local read allowed), and, where
 * auto, how fast such a read runs (where it pays is the executor's choice a send). */
static gcommResult_t shmConnected(gcommComm_t comm) {
  int mine[CMA_FIELDS] = {comm->device < 0 ? comm->params.cma : GCOMM_CMA_OFF, 0, 0, -1, -1};
  gcommShmUnlink(comm);
  mine[CMA_READS] =
      mine[CMA_MODE] != GCOMM_CMA_OFF && mayReadPeers(comm, &mine[CMA_ERR], &mine[CMA_PEER]);
  if (mine[CMA_READS] && mine[CMA_MODE] == GCOMM_CMA_AUTO) mine[CMA_SPEED] = readSpeed(comm);
  if (mine[CMA_MODE] == GCOMM_CMA_OFF) mine[CMA_READS] = 1; /* not tried: refuses nothing */
  int* all = malloc(sizeof(mine) * (size_t)comm->nranks);
  if (all == NULL) return GCOMM_ERROR(comm, gcommSystemError, -1, "out of memory");
  gcommResult_t res = comm->allgather(comm, mine, sizeof(mine), all);
  int refused, speed;
  comm->cma = res == gcommSuccess && decideCma(comm, all, &refused, &speed);
  if (comm->cma) useReferences(comm);
  if (res == gcommSuccess) sayCma(comm, all, refused, speed);
  free(all);
  return res;
}

/* Maps the file of the sender's buffer that ref names: read-only, shared, through the sender's
 * descriptor (/proc/<pid>/fd/<fd>, which the sender keeps open while the buffer lives, as it does
 * while a step from it is in flight). NULL, said in the log, where that is refused (once a
 * buffer: peerFile keeps the answer). */
static const char* mapPeerFile(gcommComm_t comm, const gcommConn_t* c, const gcommRef_t* ref) {
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)c->refPid, (int)ref->fileFd);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  struct stat st;
  void* at = MAP_FAILED;
  const char* why = NULL;
  if (fd < 0)
    why = strerror(errno);
  else if (fstat(fd, &st) != 0 || (uint64_t)st.st_size < ref->fileBytes)
    why = "smaller than the sender said";
  else if ((at = mmap(NULL, ref->fileBytes, PROT_READ, MAP_SHARED, fd, 0)) == MAP_FAILED)
    why = strerror(errno);
  if (fd >= 0) close(fd);
  if (at != MAP_FAILED) return at;
  GCOMM_INFO(GCOMM_SUBSYS_SHM, comm,
             "cannot map rank %d's buffer of %llu bytes from gcommHostAlloc (%s: %s): reading it "
             "with process_vm_readv",
             c->peer, (unsigned long long)ref->fileBytes, path, why);
  return NULL;
}

/* This rank's mapping of the sender's buffer that ref names (NULL: not mappable), mapped at its
 * first use and kept: buffers are allocated once and used again and again. */
static const char* peerFile(gcommComm_t comm, const gcommConn_t* c, const gcommRef_t* ref) {
  struct gcommShm* shm = comm->shm;
  if (shm->files == NULL &&
      (shm->files = calloc((size_t)comm->nranks * PEER_FILES, sizeof(peerFile_t))) == NULL)
    return NULL;
  peerFile_t *mine = &shm->files[(size_t)c->peer * PEER_FILES], *oldest = mine;
  for (int i = 0; i < PEER_FILES; i++) {
    peerFile_t* f = &mine[i];
    if (f->id == ref->fileId) {
      f->used = ++shm->filesUsed;
      return f->at;
    }
    if (f->used < oldest->used) oldest = f;
  }
  if (oldest->at != NULL) munmap((void*)oldest->at, oldest->bytes);
  *oldest = (peerFile_t){ref->fileId, mapPeerFile(comm, c, ref), ref->fileBytes, ++shm->filesUsed};
  return oldest->at;
}

gcommResult_t gcommShmReadRef(gcommComm_t comm, const gcommConn_t* c, const gcommRef_t* ref,
                              char* to, size_t bytes, char** at) {
  const char* from = ref->at;
  *at = to;
  /* a send to itself: its own memory (a send and a receive of one buffer may meet) */
  if (c->peer == comm->rank) {
    memmove(to, from, bytes);
    return gcommSuccess;
  }
  const char* file = ref->fileId != 0 ? peerFile(comm, c, ref) : NULL;
  if (file != NULL) {
    *at = (char*)file + (from - (const char*)(uintptr_t)ref->fileBase);
    return gcommSuccess;
  }
  for (size_t done = 0; done < bytes;) {
    struct iovec local = {(char*)to + done, bytes - done};
    struct iovec remote = {(void*)(from + done), bytes - done};
    ssize_t n = process_vm_readv(c->refPid, &local, 1, &remote, 1, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      return GCOMM_ERROR(comm, errno == ESRCH ? gcommRemoteError : gcommSystemError, c->peer,
                         "reading %zu bytes at %p of rank %d's memory (process_vm_readv, pid %d): "
                         "%s",
                         bytes - done, (const void*)(from + done), c->peer, (int)c->refPid,
                         n < 0 ? strerror(errno) : "nothing read");
    done += (size_t)n;
  }
  return gcommSuccess;
}

/* Whether a slot handed over by reference to a rank of this node is not read yet: the sender's
 * memory must not change until it is (gcommWait waits), and its engine polls rather than naps. A
 * rank that stopped (an error: a call that differs, say) or left reads nothing more. */
static int refsPending(gcommComm_t comm, int withCredits) {
  (void)withCredits;
  if (!comm->cma || !__atomic_load_n(&comm->refsUsed, __ATOMIC_ACQUIRE) ||
      __atomic_load_n(&comm->asyncError, __ATOMIC_ACQUIRE) != gcommSuccess)
    return 0;
  for (int lane = 0; lane < comm->nLanes; lane++)
    for (int i = 0; i < comm->nLocal; i++) {
      int p = comm->localRanks[i];
      gcommConn_t* c = &comm->sendConns[lane * comm->nranks + p];
      uint64_t until = __atomic_load_n(&c->refUntil, __ATOMIC_RELAXED);
      gcommStatus_t* st = gcommShmStatus(comm, p);
      if (until > 0 && __atomic_load_n(&c->fifo->head, __ATOMIC_ACQUIRE) < until &&
          __atomic_load_n(&st->code, __ATOMIC_ACQUIRE) == 0 && !st->finished)
        return 1;
    }
  return 0;
}

static int refsMustPoll(gcommComm_t comm) {
  return refsPending(comm, 0);
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
  for (size_t i = 0; shm->files != NULL && i < (size_t)comm->nranks * PEER_FILES; i++)
    if (shm->files[i].at != NULL) munmap((void*)shm->files[i].at, shm->files[i].bytes);
  free(shm->files);
  free(shm->maps);
  free(shm->sentRefs);
  free(shm);
  comm->shm = NULL;
}

/* gcommShmCreate comes before the cards are exchanged (a card names the segment); the rest of
 * the setup is this transport's connect. */
const gcommTransport_t gcommShmTransport = {
    .name = "shared memory",
    .connect = gcommShmConnect,
    .connectWhat = "shared-memory connection",
    .connected = shmConnected,
    .pending = refsPending,
    .mustPoll = refsMustPoll,
    .status = gcommShmStatus,
    .free = gcommShmFree,
};
