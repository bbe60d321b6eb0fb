// Force-included into the kernels when they build in CANN's CPU-debug mode (UBEP_ASC_CPU_DEBUG in
// ascend_ops/CMakeLists.txt). An op-project build generates GET_TILING_DATA_WITH_STRUCT per op; a plain
// ASC-language build does not, so it is defined here as the MC2 kernel tests define it
// (ops-transformer mc2/moe_distribute_dispatch/tests/ut/op_kernel/moe_distribute_dispatch_tiling_def.h):
// a copy of the tiling bytes into a local struct.
#pragma once

#include <cstring>

#ifndef GET_TILING_DATA_WITH_STRUCT
#define GET_TILING_DATA_WITH_STRUCT(tiling_struct, tiling_data, tiling_arg) \
  tiling_struct tiling_data;                                                \
  std::memcpy(&tiling_data, tiling_arg, sizeof(tiling_struct))
#endif
