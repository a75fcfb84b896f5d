/*
 * shrink_solver.c - an iterative solver that survives the death of a rank: Jacobi iterations of
 * the 1-D Laplace equation (u = 1 at the left end, 0 at the right) on a field split in blocks
 * over the ranks, halos exchanged by send/recv in a group, the largest change all-reduced (max)
 * every iteration.
 *
 * Every --checkpoint iterations each rank keeps a copy of its block and sends one to its buddy
 * (the next rank), which keeps it: the state of every rank lives on two ranks. When a call fails
 * (a rank died: gcommRemoteError), the survivors shrink the communicator (GCOMM_SHRINK_ABORT,
 * the dead rank found, none listed), learn who is left (an all-gather of their old ranks), agree
 * on the last checkpoint that every survivor holds (an all-reduce min), rebuild the whole field
 * from their own copies and the dead rank's copy on its buddy (an all-reduce sum where every point
 * comes from exactly one rank), split it over the survivors and go on. MPI is used to start only:
 * after a death it may be stuck.
 *
 * Each point's update reads only its neighbours, so the field is bitwise the same whatever the
 * ranks and however they were split: rank 0 checks it against a serial run at the end.
 *
 *   mpiexec -n 4 build/shrink_solver --n 128 --iters 4000 --kill-rank 2 --kill-iter 2345
 *
 * MPICH's hydra ends the whole job when it reaps a rank killed by a signal (docs/RELIABILITY.md):
 * test/test_fault.sh runs the victim under a parent that reaps it late, as other launchers do.
 */
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gcomm.h"

typedef struct {
  long n, iters, every, killRank, killIter;
} options_t;

typedef struct { /* a checkpoint: this rank's block and the block of the rank it is buddy of */
  long iter, lo, hi, blo, bhi; /* iteration; [lo, hi) own; [blo, bhi) buddy's (of rank `of`) */
  int of;
  double *own, *buddy;
} ckpt_t;

typedef struct {
  gcommComm_t comm;
  int rank, size;
  int* world; /* world[r]: rank r's rank in the first communicator */
  long lo, hi;
  double* u; /* [lo - 1, hi + 1): the block and its halos */
  ckpt_t ck[2];
} solver_t;

static void blockOf(long n, int rank, int size, long* lo, long* hi) {
  *lo = 1 + n * rank / size;
  *hi = 1 + n * (rank + 1) / size;
}

/* One Jacobi sweep of the block; returns the largest change. u holds halos at both ends. */
static double sweep(double* u, long len) {
  double* next = malloc((size_t)len * sizeof(double));
  double most = 0;
  for (long i = 1; i <= len; i++) next[i - 1] = 0.5 * (u[i - 1] + u[i + 1]);
  for (long i = 1; i <= len; i++) {
    double d = next[i - 1] > u[i] ? next[i - 1] - u[i] : u[i] - next[i - 1];
    if (d > most) most = d;
    u[i] = next[i - 1];
  }
  free(next);
  return most;
}

static gcommResult_t exchangeHalos(solver_t* s) {
  long len = s->hi - s->lo;
  gcommGroupStart();
  if (s->rank > 0) {
    gcommSend(&s->u[1], 1, gcommFloat64, s->rank - 1, s->comm, NULL);
    gcommRecv(&s->u[0], 1, gcommFloat64, s->rank - 1, s->comm, NULL);
  }
  if (s->rank < s->size - 1) {
    gcommSend(&s->u[len], 1, gcommFloat64, s->rank + 1, s->comm, NULL);
    gcommRecv(&s->u[len + 1], 1, gcommFloat64, s->rank + 1, s->comm, NULL);
  }
  gcommResult_t res = gcommGroupEnd();
  return res == gcommSuccess ? gcommWait(s->comm, NULL) : res;
}

/* Keeps this rank's block, and sends it to the next rank, which keeps it beside its own. */
static gcommResult_t checkpoint(solver_t* s, long n, long iter) {
  /* the older one (or an invalid one, iter -1) goes: the newer may be the only one every rank
   * holds, if this exchange fails on some ranks only */
  ckpt_t* c = s->ck[0].iter <= s->ck[1].iter ? &s->ck[0] : &s->ck[1];
  int from = (s->rank + s->size - 1) % s->size, to = (s->rank + 1) % s->size;
  long blo, bhi, len = s->hi - s->lo;
  blockOf(n, from, s->size, &blo, &bhi);
  c->iter = -1; /* not valid until the exchange is done */
  free(c->own), free(c->buddy);
  c->own = malloc((size_t)len * sizeof(double));
  c->buddy = malloc((size_t)(bhi - blo) * sizeof(double));
  memcpy(c->own, &s->u[1], (size_t)len * sizeof(double));
  gcommResult_t res = gcommSuccess;
  if (s->size > 1) {
    gcommGroupStart();
    gcommSend(c->own, (size_t)len, gcommFloat64, to, s->comm, NULL);
    gcommRecv(c->buddy, (size_t)(bhi - blo), gcommFloat64, from, s->comm, NULL);
    res = gcommGroupEnd();
    if (res == gcommSuccess) res = gcommWait(s->comm, NULL);
  }
  if (res != gcommSuccess) return res;
  c->lo = s->lo, c->hi = s->hi, c->blo = blo, c->bhi = bhi, c->of = s->world[from];
  c->iter = iter;
  return gcommSuccess;
}

/* Splits the whole field full[0, n + 2) over the communicator. */
static void distribute(solver_t* s, long n, const double* full) {
  blockOf(n, s->rank, s->size, &s->lo, &s->hi);
  free(s->u);
  s->u = malloc((size_t)(s->hi - s->lo + 2) * sizeof(double));
  memcpy(s->u, &full[s->lo - 1], (size_t)(s->hi - s->lo + 2) * sizeof(double));
}

/* The whole field from every survivor's checkpoint of iteration iter: each point from the one
 * rank holding it (its owner, or the dead owner's buddy). Returns the points nobody held. */
static long assemble(solver_t* s, long n, long iter, const int* alive, double* full) {
  double* held = calloc((size_t)n + 2, sizeof(double));
  for (int g = 0; g < 2; g++) {
    ckpt_t* c = &s->ck[g];
    if (c->iter != iter) continue;
    for (long i = c->lo; i < c->hi; i++) full[i] = c->own[i - c->lo], held[i] = 1;
    if (!alive[c->of])
      for (long i = c->blo; i < c->bhi; i++) full[i] = c->buddy[i - c->blo], held[i] = 1;
  }
  full[0] = 1.0, full[n + 1] = 0.0;
  gcommAllReduce(full, full, (size_t)n + 2, gcommFloat64, gcommSum, s->comm, NULL);
  gcommAllReduce(held, held, (size_t)n + 2, gcommFloat64, gcommSum, s->comm, NULL);
  gcommResult_t res = gcommWait(s->comm, NULL);
  long missing = res == gcommSuccess ? 0 : n;
  for (long i = 1; i <= n && res == gcommSuccess; i++) missing += held[i] != 1.0;
  full[0] = 1.0, full[n + 1] = 0.0; /* every rank added its boundary values */
  free(held);
  return missing;
}

/* After a failure: the survivors' communicator, who they are, the last common checkpoint, the
 * field rebuilt and split over them. Returns the iteration to go on from, or -1. */
static long recover(solver_t* s, long n, int worldSize) {
  gcommComm_t small = NULL;
  if (gcommCommShrink(s->comm, NULL, 0, &small, NULL, GCOMM_SHRINK_ABORT) != gcommSuccess) {
    fprintf(stderr, "shrink failed: %s\n", gcommGetLastError(s->comm));
    return -1;
  }
  gcommCommDestroy(s->comm);
  int me = s->world[s->rank];
  s->comm = small;
  gcommCommUserRank(small, &s->rank);
  gcommCommCount(small, &s->size);
  int32_t mine = me, *who = malloc((size_t)s->size * sizeof(int32_t));
  int64_t iter = s->ck[0].iter > s->ck[1].iter ? s->ck[0].iter : s->ck[1].iter;
  gcommAllGather(&mine, who, 1, gcommInt32, small, NULL);
  gcommAllReduce(&iter, &iter, 1, gcommInt64, gcommMin, small, NULL);
  if (gcommWait(small, NULL) != gcommSuccess) return -1;
  int* alive = calloc((size_t)worldSize, sizeof(int));
  for (int r = 0; r < s->size; r++) s->world[r] = who[r], alive[who[r]] = 1;
  free(who);
  double* full = calloc((size_t)n + 2, sizeof(double));
  long missing = assemble(s, n, iter, alive, full);
  free(alive);
  for (int g = 0; g < 2; g++) s->ck[g].iter = -1; /* the old split's: the loop takes a new one */
  if (missing == 0) distribute(s, n, full);
  free(full);
  if (s->rank == 0)
    printf("shrink_solver: %d ranks left; back to the checkpoint of iteration %ld%s\n", s->size,
           (long)iter, missing ? " (but points are lost: two neighbours died)" : "");
  return missing ? -1 : iter;
}

static int parse(int argc, char** argv, options_t* o) {
  *o = (options_t){128, 4000, 200, -1, -1};
  for (int i = 1; i + 1 < argc; i += 2) {
    long v = atol(argv[i + 1]);
    if (!strcmp(argv[i], "--n"))
      o->n = v;
    else if (!strcmp(argv[i], "--iters"))
      o->iters = v;
    else if (!strcmp(argv[i], "--checkpoint"))
      o->every = v;
    else if (!strcmp(argv[i], "--kill-rank"))
      o->killRank = v;
    else if (!strcmp(argv[i], "--kill-iter"))
      o->killIter = v;
    else
      return 0;
  }
  return o->n > 0 && o->iters > 0 && o->every > 0;
}

/* The serial run: the reference for the final field. */
static double* serial(long n, long iters) {
  double* u = calloc((size_t)n + 2, sizeof(double));
  u[0] = 1.0;
  for (long it = 0; it < iters; it++) sweep(u, n);
  return u;
}

/* Iterations from..iters-1; a failed call recovers and goes on. Returns 0 when done. */
static int run(solver_t* s, const options_t* o, int worldSize, long from) {
  for (long it = from; it < o->iters;) {
    if (it % o->every == 0 && checkpoint(s, o->n, it) != gcommSuccess) goto failed;
    if (s->world[s->rank] == o->killRank && it == o->killIter) raise(SIGKILL);
    if (exchangeHalos(s) != gcommSuccess) goto failed;
    double change = sweep(s->u, s->hi - s->lo);
    if (gcommAllReduce(&change, &change, 1, gcommFloat64, gcommMax, s->comm, NULL) ||
        gcommWait(s->comm, NULL))
      goto failed;
    it++;
    continue;
  failed:
    if (s->rank == 0 || s->world[s->rank] != o->killRank)
      fprintf(stderr, "shrink_solver: iteration %ld: %s\n", it, gcommGetLastError(s->comm));
    if ((it = recover(s, o->n, worldSize)) < 0) return 1;
  }
  return 0;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  signal(SIGUSR1, SIG_IGN); /* MPICH's hydra tells survivors of a death with it */
  options_t o;
  solver_t s;
  memset(&s, 0, sizeof(s));
  MPI_Comm_rank(MPI_COMM_WORLD, &s.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &s.size);
  if (!parse(argc, argv, &o) || o.n < s.size) {
    if (s.rank == 0)
      fprintf(stderr,
              "usage: shrink_solver [--n N >= ranks] [--iters I] [--checkpoint K] "
              "[--kill-rank R --kill-iter I]\n");
    MPI_Finalize();
    return 2;
  }
  int worldSize = s.size;
  s.world = malloc((size_t)worldSize * sizeof(int));
  for (int r = 0; r < worldSize; r++) s.world[r] = r;
  s.ck[0].iter = s.ck[1].iter = -1;
  if (gcommCommInitMPI(&s.comm, MPI_COMM_WORLD, NULL) != gcommSuccess) {
    fprintf(stderr, "init: %s\n", gcommGetLastError(NULL));
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  double* full = calloc((size_t)o.n + 2, sizeof(double));
  full[0] = 1.0;
  distribute(&s, o.n, full);
  int failed = run(&s, &o, worldSize, 0);
  /* the final field on every rank (as assemble does, from the live blocks), checked on rank 0 */
  memset(full, 0, ((size_t)o.n + 2) * sizeof(double));
  memcpy(&full[s.lo], &s.u[1], (size_t)(s.hi - s.lo) * sizeof(double));
  if (!failed) {
    gcommAllReduce(full, full, (size_t)o.n + 2, gcommFloat64, gcommSum, s.comm, NULL);
    failed = gcommWait(s.comm, NULL) != gcommSuccess;
  }
  int same = 0;
  if (!failed && s.rank == 0) {
    double* ref = serial(o.n, o.iters);
    same = memcmp(&full[1], &ref[1], (size_t)o.n * sizeof(double)) == 0;
    printf(
        "%s shrink_solver: %ld points, %ld iterations on %d of %d ranks: u[n/2] = %.17g, %s "
        "the serial run\n",
        same ? "PASS" : "FAIL", o.n, o.iters, s.size, worldSize, full[o.n / 2],
        same ? "bitwise equal to" : "DIFFERENT from");
    free(ref);
    fflush(stdout);
  }
  int lostRank = s.size < worldSize;
  gcommCommDestroy(s.comm);
  for (int g = 0; g < 2; g++) free(s.ck[g].own), free(s.ck[g].buddy);
  free(full), free(s.u), free(s.world);
  if (lostRank) _exit(failed || (s.rank == 0 && !same)); /* MPI cannot finalise without it */
  MPI_Finalize();
  return failed || (s.rank == 0 && !same);
}
