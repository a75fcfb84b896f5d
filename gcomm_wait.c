/*
 * gcomm_wait.c - clocks and waiting: the monotonic clock, the one back-off loop every wait of
 * the host uses, deadlines for condition waits, and whether a local process is dead.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gcomm_core.h"

uint64_t gcommNowNs(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t gcommBackoff(uint64_t* idleSince, uint64_t spinUs, uint64_t maxNapUs) {
  uint64_t now = gcommNowNs();
  if (*idleSince == 0) *idleSince = now;
  uint64_t us = (now - *idleSince) / 1000;
  if (us < spinUs) {
    gcommCpuRelax();
  } else if (us < 2000 || maxNapUs == 0) {
    sched_yield();
  } else {
    struct timespec ts = {0, (long)(us / 16 < maxNapUs ? us / 16 : maxNapUs) * 1000};
    nanosleep(&ts, NULL);
  }
  return us;
}

/* Whether process pid is gone or a zombie: a killed rank stays a zombie until its parent reaps
 * it, and launchers (MPICH's hydra, Open MPI's prted) may not do so before the job ends, while
 * kill(pid, 0) still finds it. /proc/<pid>/stat's state ("pid (comm) S ...") says Z or X then. */
int gcommProcessIsDead(pid_t pid) {
  if (kill(pid, 0) != 0 && errno == ESRCH) return 1;
  char path[64], buf[512];
  snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
  FILE* f = fopen(path, "r");
  if (f == NULL) return 0; /* no /proc: kill's answer stands */
  size_t len = fread(buf, 1, sizeof(buf) - 1, f);
  fclose(f);
  buf[len] = 0;
  const char* paren = strrchr(buf, ')'); /* the command name may hold spaces and parentheses */
  return paren != NULL && paren[1] == ' ' && (paren[2] == 'Z' || paren[2] == 'X');
}

/* A relative deadline for pthread_cond_timedwait. */
struct timespec gcommDeadlineIn(long ns) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_nsec += ns;
  ts.tv_sec += ts.tv_nsec / 1000000000;
  ts.tv_nsec %= 1000000000;
  return ts;
}
