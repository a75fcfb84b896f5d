/*
 * test/gpu/gpucheck.h - the GPU tests' checks of gcomm and CUDA calls: a failed call prints where,
 * what it returned and gcomm's last error, then aborts the job (the peers would wait for it).
 * The including file defines `static int rank;`.
 */
#ifndef GCOMM_TEST_GPUCHECK_H
#define GCOMM_TEST_GPUCHECK_H

#include <cuda_runtime_api.h>
#include <mpi.h>
#include <stdio.h>

#include "gcomm.h"

#define CK(call)                                                                             \
  do {                                                                                       \
    gcommResult_t r_ = (call);                                                               \
    if (r_ != gcommSuccess) {                                                                \
      fprintf(stderr, "FAIL rank %d: %s:%d %s -> %s: %s\n", rank, __FILE__, __LINE__, #call, \
              gcommGetErrorString(r_), gcommGetLastError(NULL));                             \
      MPI_Abort(MPI_COMM_WORLD, 1);                                                          \
    }                                                                                        \
  } while (0)
#define CU(call)                                                                         \
  do {                                                                                   \
    cudaError_t e_ = (call);                                                             \
    if (e_ != cudaSuccess) {                                                             \
      fprintf(stderr, "FAIL rank %d: %s:%d %s -> %s\n", rank, __FILE__, __LINE__, #call, \
              cudaGetErrorString(e_));                                                   \
      MPI_Abort(MPI_COMM_WORLD, 1);                                                      \
    }                                                                                    \
  } while (0)

#endif
