/*
 * gcomm_shrink.c - carrying on after a failure: gcommCommRevoke stops a communicator on every
 * rank of the node, gcommCommShrink makes a communicator of the ranks that are left.
 *
 * Neither uses MPI, which a dead rank may leave stuck. A revoke is one word of the node, on its
 * first rank's status page, that every rank of the node reads at its next call or wait
 * (gcommRevokeSeen). A shrink first stops or finishes the old communicator's work, then the
 * survivors meet on the old communicator's status pages (gcomm_agree.c: who arrived, who died,
 * the same set everywhere), and the new communicator sets itself up through those pages instead
 * of MPI. What it reuses: the old communicator's status pages (for the meeting and the setup's
 * exchanges), its parameters and (config NULL) its config, its knowledge of the nodes. What it
 * makes afresh, as any new communicator does: its shared-memory segments and FIFOs, a GPU's FIFO
 * region and its IPC mappings, its progress thread. Fresh FIFOs cost a few milliseconds and keep
 * the two communicators apart: a slot the dead rank half-wrote, or a kernel of the old one still
 * winding down, cannot reach the new one, and the old one stays usable after a DEFAULT shrink.
 */
#include <stdlib.h>
#include <string.h>

#include "gcomm_core.h"

gcommResult_t gcommCommRevoke(gcommComm_t comm) {
  GCOMM_CHECK(gcommCheckComm(comm, __func__));
  gcommRevokeBy(comm, comm->rank);
  /* a pass now sends the revoke to the other nodes (the engine may have no thread, or poll) */
  if (pthread_mutex_trylock(&comm->progressLock) == 0) {
    (void)gcommProgressPass(comm);
    pthread_mutex_unlock(&comm->progressLock);
  }
  return gcommSuccess;
}

/* excludeRanks as a set (excl[q] = 1), refusing what no rank could mean. */
static gcommResult_t readExcluded(gcommComm_t comm, const int* excludeRanks, int nExclude,
                                  unsigned char* excl) {
  if (nExclude < 0 || nExclude >= comm->nranks)
    return GCOMM_ERROR(comm, gcommInvalidArgument, -1,
                       "nExclude %d is not in 0..%d (at least this rank stays)", nExclude,
                       comm->nranks - 1);
  if (nExclude > 0 && excludeRanks == NULL)
    return GCOMM_ERROR(comm, gcommInvalidArgument, -1, "excludeRanks is NULL and nExclude is %d",
                       nExclude);
  for (int i = 0; i < nExclude; i++) {
    int q = excludeRanks[i];
    if (q < 0 || q >= comm->nranks)
      return GCOMM_ERROR(comm, gcommInvalidArgument, -1,
                         "excludeRanks[%d] = %d is not a rank of comm (0..%d)", i, q,
                         comm->nranks - 1);
    if (q == comm->rank)
      return GCOMM_ERROR(comm, gcommInvalidArgument, -1,
                         "excludeRanks[%d] = %d is this rank: an excluded rank does not call "
                         "gcommCommShrink",
                         i, q);
    if (excl[q])
      return GCOMM_ERROR(comm, gcommInvalidArgument, -1, "excludeRanks lists rank %d twice", q);
    excl[q] = 1;
  }
  return gcommSuccess;
}

static gcommResult_t checkShrinkArgs(gcommComm_t comm, const int* excludeRanks, int nExclude,
                                     gcommComm_t* newcomm, const gcommConfig_t* config, int flags,
                                     unsigned char* excl) {
  if (newcomm == NULL) return GCOMM_ERROR(comm, gcommInvalidArgument, -1, "newcomm is NULL");
  *newcomm = NULL;
  if (flags != GCOMM_SHRINK_DEFAULT && flags != GCOMM_SHRINK_ABORT)
    return GCOMM_ERROR(comm, gcommInvalidArgument, -1,
                       "flags %d is neither GCOMM_SHRINK_DEFAULT (0) nor GCOMM_SHRINK_ABORT (1)",
                       flags);
  GCOMM_CHECK(gcommCheckConfig(config));
  if (__atomic_load_n(&comm->inGroup, __ATOMIC_ACQUIRE))
    return GCOMM_ERROR(comm, gcommInvalidUsage, -1,
                       "a group is open with work on this communicator: call gcommGroupEnd first");
  if (gcommShmStatus(comm, comm->rank) == NULL)
    return GCOMM_ERROR(comm, gcommInternalError, -1, "this rank has no status page");
  return readExcluded(comm, excludeRanks, nExclude, excl);
}

/* The old communicator's work: aborted (ABORT), or finished (DEFAULT, which needs a healthy
 * communicator: after an error only ABORT is safe). */
static gcommResult_t settleWork(gcommComm_t comm, int flags) {
  if (flags == GCOMM_SHRINK_ABORT) {
    gcommStop(comm, gcommAborted); /* keeps an earlier error; the engine drains at its next pass */
    return gcommSuccess;
  }
  gcommResult_t async = gcommAsyncError(comm, "gcommCommShrink");
  if (async != gcommSuccess)
    return GCOMM_ERROR(comm, gcommInvalidUsage, -1,
                       "comm has stopped (%s): shrink it with GCOMM_SHRINK_ABORT",
                       gcommGetErrorString(async));
  return comm->device < 0 ? gcommHostWait(comm) : gcommSuccess;
}

gcommResult_t gcommCommShrink(gcommComm_t comm, const int* excludeRanks, int nExclude,
                              gcommComm_t* newcomm, const gcommConfig_t* config, int flags) {
  GCOMM_CHECK(gcommCheckComm(comm, __func__));
  unsigned char* excl = calloc((size_t)comm->nranks, 1);
  int* survivors = calloc((size_t)comm->nranks, sizeof(int));
  gcommResult_t res = excl && survivors ? checkShrinkArgs(comm, excludeRanks, nExclude, newcomm,
                                                          config, flags, excl)
                                        : GCOMM_ERROR(comm, gcommSystemError, -1, "out of memory");
  if (res == gcommSuccess) res = settleWork(comm, flags);
  int n = 0;
  if (res == gcommSuccess) res = gcommAgreeSurvivors(comm, excl, survivors, &n);
  gcommConfig_t inherited = GCOMM_CONFIG_INITIALIZER;
  if (config == NULL) gcommInheritConfig(comm, &inherited);
  int me = 0;
  while (me < n && survivors[me] != comm->rank) me++;
  if (res == gcommSuccess) {
    GCOMM_INFO(GCOMM_SUBSYS_INIT, comm, "gcommCommShrink: %d of %d ranks go on; this one as %d", n,
               comm->nranks, me);
    res = gcommCommCreate(newcomm, MPI_COMM_NULL, config ? config : &inherited, comm, survivors, me,
                          n);
  }
  free(excl);
  free(survivors);
  return res;
}
