// Function qualifiers so the same index math compiles as host C++, in CUDA kernels and in Ascend C
// kernels. Functions use only fixed-width integers and caller-provided arrays: no allocation, no
// standard library, no exceptions.
#pragma once

#include <stdint.h>

#if defined(__CUDACC__)
#define UBEP_FN __host__ __device__ inline
#elif defined(__CCE_KT_TEST__) || defined(__CCE__)
#define UBEP_FN __aicore__ inline
#else
#define UBEP_FN inline
#endif
