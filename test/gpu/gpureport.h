/*
 * test/gpu/gpureport.h - what the GPU failure tests share: a monotonic clock in seconds and a
 * check reported once for all ranks (PASS only when no rank failed it). The including file
 * defines `static int rank, failed;`.
 */
#ifndef GCOMM_TEST_GPUREPORT_H
#define GCOMM_TEST_GPUREPORT_H

#include <mpi.h>
#include <stdio.h>
#include <time.h>

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Every rank: PASS when no rank failed the check. */
static void report(int ok, const char* what) {
  int all = 0;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (rank == 0) printf("%s %s\n", all ? "PASS" : "FAIL", what);
  failed += !all;
}

#endif
