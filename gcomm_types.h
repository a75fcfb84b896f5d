/*
 * gcomm_types.h - the result codes, datatypes and reduction operators of gcomm's API.
 *
 * Part of the public API (gcomm.h includes it; users include gcomm.h). On its own, without
 * <mpi.h> or any GPU header, so that the GPU kernels, compiled by nvcc or hipcc, share these
 * values with the host instead of redeclaring them. C99 and C++.
 */
#ifndef GCOMM_TYPES_H
#define GCOMM_TYPES_H

typedef enum {
  gcommSuccess = 0,
  gcommInvalidArgument = 1, /* a bad argument: which one and why is in gcommGetLastError */
  gcommInvalidUsage = 2,    /* a call out of order, or ranks that disagree */
  gcommSystemError = 3,     /* the OS or MPI failed */
  gcommInternalError = 4,   /* a bug in gcomm */
  gcommDeviceError = 5,     /* the CUDA/HIP runtime failed */
  gcommRemoteError = 6,     /* another rank failed or died: the message names it */
  gcommTimeout = 7,         /* a wait passed GCOMM_TIMEOUT_MS */
  gcommAborted = 8,         /* gcommCommAbort was called */
  gcommInProgress = 9,      /* the operation has not completed yet */
  gcommRevoked = 10,        /* gcommCommRevoke was called on this communicator, here or by a peer */
  gcommNumResults = 11
} gcommResult_t;

typedef enum {
  gcommInt8 = 0,
  gcommChar = 0,
  gcommUint8 = 1,
  gcommInt32 = 2,
  gcommInt = 2,
  gcommUint32 = 3,
  gcommInt64 = 4,
  gcommUint64 = 5,
  gcommFloat16 = 6,
  gcommHalf = 6,
  gcommFloat32 = 7,
  gcommFloat = 7,
  gcommFloat64 = 8,
  gcommDouble = 8,
  gcommBfloat16 = 9,
  gcommFloat8e4m3 = 10, /* OCP fp8 E4M3 (as CUDA's __nv_fp8_e4m3): max 448, no infinity */
  gcommFloat8e5m2 = 11, /* OCP fp8 E5M2 (as CUDA's __nv_fp8_e5m2): max 57344 */
  gcommNumTypes = 12
} gcommDataType_t;

/* Float16, Bfloat16 and the fp8 types are reduced in float and rounded once per reduction (to
 * nearest even; fp8 saturates to its largest finite value, NaN stays NaN, as CUDA's conversions
 * with __NV_SATFINITE). Avg divides the sum by the number of ranks (integer division for integer
 * types). Values from gcommNumOps up are operators made by gcommRedOpCreatePreMulSum. */
typedef enum {
  gcommSum = 0,
  gcommProd = 1,
  gcommMax = 2,
  gcommMin = 3,
  gcommAvg = 4,
  gcommNumOps = 5,
  gcommMaxRedOp = 0x7fffffff /* the operator type holds any int, for created operators */
} gcommRedOp_t;

#endif /* GCOMM_TYPES_H */
