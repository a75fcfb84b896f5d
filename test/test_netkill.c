/*
 * test_netkill.c - a rank killed (SIGKILL) in the middle of a large all-reduce.
 *
 * TEST_KILL_RANK=k (run under `mpiexec -disable-auto-cleanup` by test/test_net.sh, with
 * GCOMM_HOSTID pretend nodes, and by test/test_fault.sh, all ranks on one node over shm): rank k
 * posts a large all-reduce, lets it run TEST_KILL_AFTER_MS (default 3: well inside even a 2-rank
 * shared-memory all-reduce of 32 MiB) and kills itself (TEST_KILL_MOMENT=before: it dies right
 * before the call instead). Every other rank checks that gcommWait returns an error (not success,
 * no hang, no crash) within GCOMM_TIMEOUT_MS + 5 s (or TEST_KILL_MAX_S) and that gcommGetLastError
 * names "rank k"; then, once every survivor has seen its error, that gcommCommAbort and
 * gcommCommDestroy succeed. Each survivor prints its own PASS/FAIL line (and writes it to
 * TEST_NETKILL_DIR/rankR). Without TEST_KILL_RANK (as test/run.sh runs it) it checks the same
 * all-reduce completes. TEST_POLL=1 uses a polled communicator.
 */
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "test/testlib.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Waits (at most maxS seconds) until dir holds the files <prefix>R of `want` ranks R < n. */

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  /* hydra with -disable-auto-cleanup tells the survivors of a dead rank with SIGUSR1, whose
   * default action would end them too; and mpiexec may leave at once, so that their output
   * then goes to a closed pipe (the results are written to files too) */
  signal(SIGUSR1, SIG_IGN);
  signal(SIGPIPE, SIG_IGN);
  int rank, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  const char* k = getenv("TEST_KILL_RANK");
  int victim = k ? atoi(k) : -1;
  int afterMs = getenv("TEST_KILL_AFTER_MS") ? atoi(getenv("TEST_KILL_AFTER_MS")) : 3;
  int poll = getenv("TEST_POLL") && atoi(getenv("TEST_POLL"));
  int before = getenv("TEST_KILL_MOMENT") && strcmp(getenv("TEST_KILL_MOMENT"), "before") == 0;
  const char* dir = getenv("TEST_NETKILL_DIR");
  double timeoutS = (getenv("GCOMM_TIMEOUT_MS") ? atof(getenv("GCOMM_TIMEOUT_MS")) : 300000) / 1e3;
  double maxS = getenv("TEST_KILL_MAX_S") ? atof(getenv("TEST_KILL_MAX_S")) : timeoutS + 5;
  gcommConfig_t cfg = GCOMM_CONFIG_INITIALIZER;
  cfg.proxyMode = poll ? GCOMM_PROXY_POLL : GCOMM_PROXY_THREAD;
  gcommComm_t comm;
  if (gcommCommInitMPI(&comm, MPI_COMM_WORLD, &cfg) != gcommSuccess) {
    printf("FAIL netkill: init on rank %d: %s\n", rank, gcommGetLastError(NULL));
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  size_t count = (size_t)8 << 20; /* 32 MiB of float32 */
  float* buf = malloc(count * sizeof(float));
  for (size_t i = 0; i < count; i++) buf[i] = 1.0f;
  /* a small one first: every connection is up before anyone dies */
  gcommAllReduce(buf, buf, 1024, gcommFloat32, gcommSum, comm, NULL);
  gcommResult_t res = gcommWait(comm, NULL);
  for (size_t i = 0; i < 1024; i++) buf[i] = 1.0f;
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == victim && dir != NULL) { /* test/test_fault.sh checks /dev/shm for its pid */
    char path[512];
    snprintf(path, sizeof(path), "%s/victim", dir);
    FILE* f = fopen(path, "w");
    if (f) fprintf(f, "%d\n", (int)getpid()), fclose(f);
  }
  if (rank == victim && before) {
    printf("netkill: rank %d kills itself before the all-reduce\n", rank);
    fflush(stdout);
    raise(SIGKILL);
  }
  double t0 = now();
  res = gcommAllReduce(buf, buf, count, gcommFloat32, gcommSum, comm, NULL);
  if (rank == victim) {
    while (now() - t0 < afterMs * 1e-3) {
      if (poll)
        gcommProgress(comm);
      else
        usleep(1000);
    }
    printf("netkill: rank %d kills itself %.0f ms into the all-reduce\n", rank, (now() - t0) * 1e3);
    fflush(stdout);
    raise(SIGKILL);
  }
  if (res == gcommSuccess) res = gcommWait(comm, NULL);
  double dt = now() - t0;
  if (victim < 0) {
    int ok = res == gcommSuccess && buf[0] == (float)n && buf[count - 1] == (float)n;
    int all;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (rank == 0)
      printf("%s netkill: 32 MiB all-reduce without a kill (TEST_KILL_RANK unset) %s\n",
             all ? "PASS" : "FAIL", all ? "" : gcommGetLastError(comm));
    gcommCommDestroy(comm);
    free(buf);
    MPI_Finalize();
    return all ? 0 : 1;
  }
  char want[32], line[1400];
  snprintf(want, sizeof(want), "rank %d", victim);
  const char* err = gcommGetLastError(comm);
  int ok = res != gcommSuccess && dt < maxS && strstr(err, want) != NULL;
  snprintf(line, sizeof(line), "rank %d got \"%s\" after %.2f s: %s", rank,
           gcommGetErrorString(res), dt, err);
  printf("netkill: %s\n", line);
  fflush(stdout);
  /* stay alive until every survivor has seen the error: a survivor that left early would be
   * one more dead rank for the others to name (a marker file each, or else the deadline) */
  if (dir != NULL) {
    char path[512];
    snprintf(path, sizeof(path), "%s/seen%d", dir, rank);
    FILE* f = fopen(path, "w");
    if (f) fprintf(f, "%d\n", (int)getpid()), fclose(f);
    tlAwaitFiles(dir, "seen", n, n - 1, timeoutS + 5);
  } else {
    usleep((useconds_t)((timeoutS + 2) * 1e6));
  }
  gcommResult_t aborted = gcommCommAbort(comm);
  gcommResult_t destroyed = gcommCommDestroy(comm);
  if (aborted != gcommSuccess || destroyed != gcommSuccess) ok = 0;
  char result[1600];
  snprintf(result, sizeof(result), "%s netkill: %s; then abort: %s, destroy: %s\n",
           ok ? "PASS" : "FAIL", line, gcommGetErrorString(aborted),
           gcommGetErrorString(destroyed));
  fputs(result, stdout);
  fflush(stdout);
  if (dir != NULL) { /* mpiexec may lose the output of a job that lost a rank */
    char path[512];
    snprintf(path, sizeof(path), "%s/rank%d", dir, rank);
    FILE* f = fopen(path, "w");
    if (f) fputs(result, f), fclose(f);
    /* Open MPI's mpirun ends the whole job once a rank leaves without MPI_Finalize: the
     * survivors leave together, after every one has written its result */
    tlAwaitFiles(dir, "rank", n, n - 1, timeoutS + 5);
  }
  free(buf);
  /* MPI cannot finalise with a dead rank; leave without it */
  _exit(ok ? 0 : 1);
}
