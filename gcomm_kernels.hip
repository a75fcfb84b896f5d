/*
 * gcomm_kernels.hip - the HIP (ROCm) build of the GPU executor: the same kernels as
 * gcomm_kernels.cu, from that one source, through the portability layer of gcomm_gpu.h
 * (make HIP=1 compiles this file with hipcc for HIP_ARCH).
 */
#define GCOMM_HIP 1
#include "gcomm_gpu.h"
#include "gcomm_kernels.cu"
