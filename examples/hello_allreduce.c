/*
 * hello_allreduce.c - the smallest gcomm program: an MPI code that sums a vector across ranks
 * with gcomm on host memory, overlapping the reduction with its own work.
 *
 *   mpiexec -n 4 build/hello_allreduce
 */
#include <stdio.h>
#include <stdlib.h>

#include "gcomm.h"

#define CHECK(call)                                                       \
  do {                                                                    \
    gcommResult_t r_ = (call);                                            \
    if (r_ != gcommSuccess) {                                             \
      fprintf(stderr, "%s failed: %s\n", #call, gcommGetLastError(comm)); \
      MPI_Abort(MPI_COMM_WORLD, 1);                                       \
    }                                                                     \
  } while (0)

int main(int argc, char** argv) {
  gcommComm_t comm = NULL;
  int rank, nranks;
  MPI_Init(&argc, &argv);
  CHECK(gcommCommInitMPI(&comm, MPI_COMM_WORLD,
                         NULL)); /* MPI bootstraps; then it is off the data path */
  CHECK(gcommCommUserRank(comm, &rank));
  CHECK(gcommCommCount(comm, &nranks));

  enum { N = 1 << 20 };
  float* x = malloc(N * sizeof(float));
  for (int i = 0; i < N; i++) x[i] = (float)rank;

  CHECK(
      gcommAllReduce(x, x, N, gcommFloat32, gcommSum, comm, NULL)); /* in place, returns at once */
  /* ... the application's own work overlaps the reduction here ... */
  CHECK(gcommWait(comm, NULL)); /* complete */

  if (rank == 0)
    printf("x[0] = %g (expected %g) on %d ranks\n", x[0], nranks * (nranks - 1) / 2.0, nranks);
  free(x);
  CHECK(gcommCommDestroy(comm));
  MPI_Finalize();
  return 0;
}
