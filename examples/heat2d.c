/*
 * heat2d.c - an MPI simulation code on gcomm: the 2-D heat equation's steady state by Jacobi
 * iteration, the shape of many MPI codes.
 *
 *   mpiexec -n 4 build/heat2d --backend gcomm [--n 1024] [--iters 2000] [--tol 0] [--gpu]
 *
 * The N x N grid (the edge above the first row held at 1, the other edges at 0) is cut into a
 * 2-D grid of blocks, one per rank (MPI_Dims_create). Each iteration exchanges the one-point halo
 * with the four neighbours (rows straight from the field, columns packed), by send/recv in one
 * group with gcomm or Isend/Irecv with MPI, updates every point from its neighbours and
 * all-reduces the sum of squared changes (the residual). It stops after --iters iterations or
 * when the residual's square root falls below --tol.
 *
 * Both backends compute every point by the same expression from the same neighbours, so the
 * field is bitwise the same with either backend and any number of ranks (the field's digest says
 * so: a sum over points of a hash of the point's index and bits, independent of the order); the
 * residual is a sum whose order the all-reduce chooses, so it may differ in the last bits.
 * Prints the iterations, the residual, the digest and the time to solution (the slowest rank's).
 *
 * --gpu (a CUDA build): the field lives in GPU memory and the stencil runs there
 * (examples/heat2d_gpu.cu); gcomm then sends and receives GPU memory on the stream, while the MPI
 * backend copies the halo through host memory (MPI without CUDA support).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gcomm.h"
#include "heat2d.h"

enum { HEAT_MPI, HEAT_GCOMM }; /* --backend */
enum { NORTH, SOUTH, WEST, EAST };

typedef struct {
  int backend, onGpu;
  MPI_Comm mpi;
  gcommComm_t comm;                 /* the gcomm backend's */
  void* stream;                     /* a GPU run's */
  int rank, nranks, px, py, cx, cy; /* the px x py process grid; this rank at column cx, row cy */
  int nbr[4];                       /* the neighbour in each direction, or -1 at the edge */
  int n, nx, ny, x0, y0;            /* N; this rank's block: nx x ny points from global (x0, y0) */
  double* field[2];                /* u and the next u, (nx+2) x (ny+2) row by row, with the halo */
  int cur;                         /* which field holds the current u */
  double *sendBuf[4], *recvBuf[4]; /* the packed west and east columns (rows need none) */
  double* hostLine[4];             /* a GPU run's MPI backend: the lines in host memory */
  double* gpuRes;                  /* a GPU run: the local and the global residual sums */
  double res;                      /* the last residual */
} Heat;

#define HEAT_CHECK(h, call)                                                            \
  do {                                                                                 \
    gcommResult_t r_ = (call);                                                         \
    if (r_ != gcommSuccess) {                                                          \
      fprintf(stderr, "heat2d: %s failed: %s\n", #call, gcommGetLastError((h)->comm)); \
      MPI_Abort(MPI_COMM_WORLD, 1);                                                    \
    }                                                                                  \
  } while (0)

/* The field's index of local point (i, j): row j, column i; halo at 0 and nx+1 / ny+1. */
static size_t at(const Heat* h, int i, int j) {
  return (size_t)j * (size_t)(h->nx + 2) + (size_t)i;
}

/* Splits n points into parts: part k's first point and size (the first n % parts get one more). */
static void split(int n, int parts, int k, int* first, int* size) {
  *size = n / parts + (k < n % parts);
  *first = k * (n / parts) + (k < n % parts ? k : n % parts);
}

/* Host buffers, or GPU memory on a GPU run (heat2d_gpu.cu). */
static double* heatAlloc(const Heat* h, size_t count) {
  if (h->onGpu) return heatGpuAlloc(count);
  double* p = calloc(count ? count : 1, sizeof(double)); /* a rank may have no column */
  if (p == NULL) {
    fprintf(stderr, "heat2d: out of memory\n");
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  return p;
}
static void heatFree(const Heat* h, double* p) {
  if (h->onGpu)
    heatGpuFree(p);
  else
    free(p);
}

/* The process grid, this rank's block and neighbours, the fields with their fixed edges. */
static void heatSetup(Heat* h, MPI_Comm mpi, int n) {
  int dims[2] = {0, 0};
  MPI_Comm_rank(mpi, &h->rank);
  MPI_Comm_size(mpi, &h->nranks);
  MPI_Dims_create(h->nranks, 2, dims);
  h->mpi = mpi;
  h->n = n;
  h->py = dims[0], h->px = dims[1];
  h->cy = h->rank / h->px, h->cx = h->rank % h->px;
  split(n, h->px, h->cx, &h->x0, &h->nx);
  split(n, h->py, h->cy, &h->y0, &h->ny);
  h->nbr[NORTH] = h->cy > 0 ? h->rank - h->px : -1;
  h->nbr[SOUTH] = h->cy < h->py - 1 ? h->rank + h->px : -1;
  h->nbr[WEST] = h->cx > 0 ? h->rank - 1 : -1;
  h->nbr[EAST] = h->cx < h->px - 1 ? h->rank + 1 : -1;
  size_t points = (size_t)(h->nx + 2) * (size_t)(h->ny + 2);
  double* init = calloc(points, sizeof(double));
  if (h->cy == 0) /* the hot edge: the row above the grid */
    for (int i = 1; i <= h->nx; i++) init[at(h, i, 0)] = 1.0;
  for (int f = 0; f < 2; f++) {
    h->field[f] = heatAlloc(h, points);
    if (h->onGpu)
      heatGpuCopy(h->field[f], init, points);
    else
      memcpy(h->field[f], init, points * sizeof(double));
  }
  free(init);
  if (h->onGpu) h->gpuRes = heatAlloc(h, 2);
  for (int d = 0; d < 4; d++) {
    size_t line = d < WEST ? (size_t)h->nx : (size_t)h->ny;
    h->sendBuf[d] = heatAlloc(h, line);
    h->recvBuf[d] = heatAlloc(h, line);
    h->hostLine[d] = calloc(2 * line, sizeof(double)); /* the MPI backend's staging on a GPU */
  }
}

static void heatFreeAll(Heat* h) {
  for (int f = 0; f < 2; f++) heatFree(h, h->field[f]);
  for (int d = 0; d < 4; d++) {
    heatFree(h, h->sendBuf[d]);
    heatFree(h, h->recvBuf[d]);
    free(h->hostLine[d]);
  }
  heatFree(h, h->gpuRes);
}

/* The halo lines this rank sends: rows are contiguous in the field, columns are packed. */
static const double* sendLine(Heat* h, double* u, int d) {
  if (d == NORTH) return u + at(h, 1, 1);
  if (d == SOUTH) return u + at(h, 1, h->ny);
  return h->sendBuf[d];
}
static double* recvLine(Heat* h, double* u, int d) {
  if (d == NORTH) return u + at(h, 1, 0);
  if (d == SOUTH) return u + at(h, 1, h->ny + 1);
  return h->recvBuf[d];
}
static size_t lineCount(const Heat* h, int d) {
  return d < WEST ? (size_t)h->nx : (size_t)h->ny;
}

static void haloGcomm(Heat* h, double* u) {
  HEAT_CHECK(h, gcommGroupStart());
  for (int d = 0; d < 4; d++) {
    if (h->nbr[d] < 0) continue;
    HEAT_CHECK(h, gcommRecv(recvLine(h, u, d), lineCount(h, d), gcommFloat64, h->nbr[d], h->comm,
                            h->stream));
    HEAT_CHECK(h, gcommSend(sendLine(h, u, d), lineCount(h, d), gcommFloat64, h->nbr[d], h->comm,
                            h->stream));
  }
  HEAT_CHECK(h, gcommGroupEnd());
  if (!h->onGpu) HEAT_CHECK(h, gcommWait(h->comm, NULL)); /* a GPU run: ordered on the stream */
}

/* MPI: Irecv/Isend of every line; on a GPU run through host copies of the lines. */
static void haloMpi(Heat* h, double* u) {
  MPI_Request req[8];
  MPI_Status status[8]; /* not MPI_STATUSES_IGNORE: GCC takes MPICH's for an empty array */
  int nreq = 0;
  for (int d = 0; d < 4; d++) {
    if (h->nbr[d] < 0) continue;
    size_t c = lineCount(h, d);
    double* in = h->onGpu ? h->hostLine[d] : recvLine(h, u, d);
    const double* out = sendLine(h, u, d);
    if (h->onGpu) { /* heatGpuCopy waits for the packing on the stream (a blocking stream) */
      heatGpuCopy(h->hostLine[d] + c, out, c);
      out = h->hostLine[d] + c;
    }
    /* d ^ 1 is the opposite direction: the tag says which line of the receiver this is */
    MPI_Irecv(in, (int)c, MPI_DOUBLE, h->nbr[d], d, h->mpi, &req[nreq++]);
    MPI_Isend(out, (int)c, MPI_DOUBLE, h->nbr[d], d ^ 1, h->mpi, &req[nreq++]);
  }
  MPI_Waitall(nreq, req, status);
  if (h->onGpu)
    for (int d = 0; d < 4; d++)
      if (h->nbr[d] >= 0) heatGpuCopy(recvLine(h, u, d), h->hostLine[d], lineCount(h, d));
}

/* One Jacobi sweep from u into v; returns this rank's sum of squared changes. */
static double sweepHost(Heat* h, const double* u, double* v) {
  double sum = 0;
  int w = h->nx + 2;
  for (int j = 1; j <= h->ny; j++)
    for (int i = 1; i <= h->nx; i++) {
      size_t k = at(h, i, j);
      v[k] = 0.25 * ((u[k - w] + u[k + w]) + (u[k - 1] + u[k + 1]));
      sum += (v[k] - u[k]) * (v[k] - u[k]);
    }
  return sum;
}

static void packHost(Heat* h, const double* u) {
  for (int j = 1; j <= h->ny; j++) {
    h->sendBuf[WEST][j - 1] = u[at(h, 1, j)];
    h->sendBuf[EAST][j - 1] = u[at(h, h->nx, j)];
  }
}
static void unpackHost(Heat* h, double* u) {
  for (int j = 1; j <= h->ny; j++) {
    if (h->nbr[WEST] >= 0) u[at(h, 0, j)] = h->recvBuf[WEST][j - 1];
    if (h->nbr[EAST] >= 0) u[at(h, h->nx + 1, j)] = h->recvBuf[EAST][j - 1];
  }
}

/* The global residual (the square root of the all-reduced sum). */
static double residual(Heat* h, double local) {
  double global;
  if (h->backend == HEAT_MPI) {
    if (h->onGpu) heatGpuCopy(&local, h->gpuRes, 1);
    MPI_Allreduce(&local, &global, 1, MPI_DOUBLE, MPI_SUM, h->mpi);
  } else if (h->onGpu) { /* GPU memory to GPU memory on the stream */
    HEAT_CHECK(
        h, gcommAllReduce(h->gpuRes, h->gpuRes + 1, 1, gcommFloat64, gcommSum, h->comm, h->stream));
    heatGpuSync(h->stream);
    heatGpuCopy(&global, h->gpuRes + 1, 1);
  } else {
    HEAT_CHECK(h, gcommAllReduce(&local, &global, 1, gcommFloat64, gcommSum, h->comm, NULL));
    HEAT_CHECK(h, gcommWait(h->comm, NULL));
  }
  return sqrt(global);
}

/* Iterates until maxIters or the residual is below tol; returns the iterations done. */
static int heatSolve(Heat* h, int maxIters, double tol) {
  int it = 0, cur = 0;
  h->res = INFINITY;
  while (it < maxIters && !(h->res < tol)) {
    double *u = h->field[cur], *v = h->field[cur ^ 1], local = 0;
    if (h->onGpu)
      heatGpuPack(h->stream, u, h->nx, h->ny, h->sendBuf[WEST], h->sendBuf[EAST]);
    else
      packHost(h, u);
    if (h->backend == HEAT_GCOMM)
      haloGcomm(h, u);
    else
      haloMpi(h, u);
    if (h->onGpu) /* unpacks the columns first; the local residual stays on the GPU */
      heatGpuSweep(h->stream, u, v, h->nx, h->ny, h->nbr[WEST] >= 0 ? h->recvBuf[WEST] : NULL,
                   h->nbr[EAST] >= 0 ? h->recvBuf[EAST] : NULL, h->gpuRes);
    else {
      unpackHost(h, u);
      local = sweepHost(h, u, v);
    }
    h->res = residual(h, local);
    cur ^= 1;
    it++;
  }
  h->cur = cur;
  return it;
}

/* Collective: the GPU (a GPU run), the blocks and fields, the backend's communicator. */
static void heatStart(Heat* h, MPI_Comm mpi, int n) {
  if (h->onGpu) {
    MPI_Comm node;
    int localRank;
    MPI_Comm_split_type(mpi, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &localRank);
    MPI_Comm_free(&node);
    heatGpuSelect(localRank);
    h->stream = heatGpuStreamCreate();
  }
  heatSetup(h, mpi, n);
  if (h->backend == HEAT_GCOMM) {
    gcommConfig_t config = GCOMM_CONFIG_INITIALIZER;
    config.device = h->onGpu ? heatGpuDevice() : GCOMM_DEVICE_HOST;
    HEAT_CHECK(h, gcommCommInitMPI(&h->comm, mpi, &config));
  }
}

static void heatEnd(Heat* h) {
  if (h->comm) HEAT_CHECK(h, gcommCommDestroy(h->comm));
  heatFreeAll(h);
  if (h->onGpu) heatGpuStreamDestroy(h->stream);
}

static uint64_t mix64(uint64_t x) { /* splitmix64's finaliser */
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* Collective: the field's digest, the same for the same bits whatever the decomposition. */
static uint64_t heatDigest(Heat* h) {
  size_t points = (size_t)(h->nx + 2) * (size_t)(h->ny + 2);
  double* u = malloc(points * sizeof(double));
  uint64_t local = 0, global = 0;
  if (h->onGpu)
    heatGpuCopy(u, h->field[h->cur], points);
  else
    memcpy(u, h->field[h->cur], points * sizeof(double));
  for (int j = 1; j <= h->ny; j++)
    for (int i = 1; i <= h->nx; i++) {
      uint64_t bits, index = (uint64_t)(h->y0 + j - 1) * (uint64_t)h->n + (uint64_t)(h->x0 + i - 1);
      memcpy(&bits, &u[at(h, i, j)], sizeof(bits));
      local += mix64(bits ^ mix64(index));
    }
  free(u);
  MPI_Allreduce(&local, &global, 1, MPI_UINT64_T, MPI_SUM, h->mpi);
  return global;
}

#ifndef HEAT2D_NO_MAIN
static void usage(void) {
  fprintf(
      stderr,
      "usage: heat2d [--backend mpi|gcomm] [--n N] [--iters I] [--tol T] [--gpu]\n"
      "  N x N points (default 1024), at most I iterations (default 2000), stop when the\n"
      "  residual is below T (default 0: run all I); --gpu: fields in GPU memory (CUDA build)\n");
  MPI_Abort(MPI_COMM_WORLD, 2);
}

int main(int argc, char** argv) {
  Heat h = {0};
  int n = 1024, iters = 2000;
  double tol = 0;
  MPI_Init(&argc, &argv);
  h.backend = HEAT_GCOMM;
  for (int a = 1; a < argc; a++) {
    if (!strcmp(argv[a], "--gpu"))
      h.onGpu = 1;
    else if (a + 1 >= argc)
      usage();
    else if (!strcmp(argv[a], "--backend") &&
             (!strcmp(argv[a + 1], "mpi") || !strcmp(argv[a + 1], "gcomm")))
      h.backend = !strcmp(argv[++a], "mpi") ? HEAT_MPI : HEAT_GCOMM;
    else if (!strcmp(argv[a], "--n") && (n = atoi(argv[a + 1])) > 0)
      a++;
    else if (!strcmp(argv[a], "--iters") && (iters = atoi(argv[a + 1])) >= 0)
      a++;
    else if (!strcmp(argv[a], "--tol"))
      tol = atof(argv[++a]);
    else
      usage();
  }
  heatStart(&h, MPI_COMM_WORLD, n);
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = MPI_Wtime();
  int done = heatSolve(&h, iters, tol);
  double t = MPI_Wtime() - t0, tmax;
  MPI_Reduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  uint64_t digest = heatDigest(&h);
  if (h.rank == 0)
    printf(
        "heat2d backend %s%s ranks %d (%dx%d) grid %dx%d iterations %d residual %.17g "
        "digest 0x%016llx time-to-solution %.3f s (%.1f us/iteration)\n",
        h.backend == HEAT_MPI ? "mpi" : "gcomm", h.onGpu ? " gpu" : "", h.nranks, h.px, h.py, n, n,
        done, h.res, (unsigned long long)digest, tmax, done ? 1e6 * tmax / done : 0.0);
  heatEnd(&h);
  MPI_Finalize();
  return 0;
}
#endif
