/*
 * test_heat2d.c - examples/heat2d.c, the MPI heat-equation code, checked: on this run's ranks,
 * with the MPI backend and with gcomm (send/recv halo exchanges in groups, a residual all-reduce
 * each iteration), against a serial run of the same grid on rank 0 alone.
 *
 * The field must have the serial run's bits exactly (its digest) with either backend and any
 * decomposition: every point is the same expression of the same neighbours. The residual is an
 * all-reduced sum whose order differs between decompositions and libraries: it must agree to
 * 1e-12 relative. Odd grid sizes (uneven blocks) and a grid smaller than the process grid in
 * one direction (ranks with no points). A CUDA build on a machine with GPUs runs both backends
 * with the field in GPU memory as well.
 */
#define HEAT2D_NO_MAIN
#include "../examples/heat2d.c"
#include "testlib.h"

typedef struct {
  uint64_t digest;
  double res;
  int iters;
} HeatResult;

/* Collective over mpi: a solve of an n x n grid for iters iterations. */
static HeatResult runHeat(MPI_Comm mpi, int backend, int onGpu, int n, int iters) {
  Heat h = {0};
  HeatResult r;
  h.backend = backend;
  h.onGpu = onGpu;
  heatStart(&h, mpi, n);
  r.iters = heatSolve(&h, iters, 0);
  r.res = h.res;
  r.digest = heatDigest(&h);
  heatEnd(&h);
  return r;
}

static void checkAgainst(const HeatResult* got, const HeatResult* want, const char* what) {
  if (got->iters != want->iters)
    tlFail("%s: %d iterations, the serial run %d", what, got->iters, want->iters);
  else if (got->digest != want->digest)
    tlFail("%s: field digest 0x%016llx, the serial run's 0x%016llx (the fields differ)", what,
           (unsigned long long)got->digest, (unsigned long long)want->digest);
  else if (!(fabs(got->res - want->res) <= 1e-12 * fabs(want->res)))
    tlFail("%s: residual %.17g, the serial run's %.17g", what, got->res, want->res);
}

static void testGrid(int n, int iters, int onGpu) {
  HeatResult serial;
  if (tlRank == 0) serial = runHeat(MPI_COMM_SELF, HEAT_MPI, 0, n, iters);
  MPI_Bcast(&serial, sizeof(serial), MPI_BYTE, 0, MPI_COMM_WORLD);
  for (int backend = HEAT_MPI; backend <= HEAT_GCOMM; backend++) {
    const char* name = backend == HEAT_MPI ? "mpi" : "gcomm";
    HeatResult got = runHeat(MPI_COMM_WORLD, backend, onGpu, n, iters);
    checkAgainst(&got, &serial, name);
    tlReport(
        "heat2d %dx%d, %d iterations, backend %s%s = the serial run (field bits, residual "
        "to 1e-12)",
        n, n, iters, name, onGpu ? " on GPUs" : "");
  }
}

int main(int argc, char** argv) {
  tlInit(&argc, &argv);
  testGrid(67, 150, 0);
  testGrid(3, 20, 0); /* 8 ranks: a 4 x 2 process grid, one row of ranks with no points */
  int gpus = heatGpuCount(), all;
  MPI_Allreduce(&gpus, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (all > 0) testGrid(130, 100, 1);
  return tlFinish("test_heat2d");
}
