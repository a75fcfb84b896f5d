/*
 * test/plugins/check.h - what the test profiler plugin (check.c, built as
 * $(BUILD)/test/plugins/libgcomm-profiler-check.so) records, and the functions test_profiler.c
 * finds in it with dlsym to read the records back.
 */
#ifndef GCOMM_TEST_CHECK_H
#define GCOMM_TEST_CHECK_H

#include <stdint.h>

#include "gcomm_profiler.h"

typedef struct checkRec {
  int index;                      /* in the record list */
  int parent;                     /* the parent's index, -1 without one */
  int context;                    /* the init call's number (0, 1, ...) */
  gcommProfilerEventDescr_v1_t d; /* as started (strings are gcomm's static names) */
  uint64_t startNs, stopNs;       /* stopNs 0: never stopped */
  int nStates, lastState, lastStateArg;
} checkRec_t;

typedef struct {
  int inits, failedInits, finalizes, badHandles;
  int nRecs;
  checkRec_t** recs;
} checkLog_t;

/* the plugin's exports besides gcommProfiler_v1 */
typedef const checkLog_t* (*checkGetLog_t)(void);
typedef void (*checkReset_t)(void);
#define CHECK_GET_LOG "checkGetLog"
#define CHECK_RESET "checkReset"

#endif
