// The tiling data every ubep kernel entry receives, declared as the MC2 MoE ops declare theirs
// (ops-transformer mc2/moe_distribute_dispatch/op_kernel/moe_distribute_dispatch_tiling.h): HCCL's
// Mc2InitTiling first (an MC2 op's tiling must start with it), then the Mc2CcTiling of its one
// communication task, then ubep's EpTiling. The host tiling (op_host/mc2/ep_mc2.h) fills the HCCL
// parts through Mc2CcTilingConfig::GetTiling; the kernels read only `ep`.
//
// With CANN the two HCCL structs are the toolkit's (kernel_tiling/kernel_tiling.h, generated from
// asc-devkit include/adv_api/hccl/hccl_tilingdata.h: 64 and 512 bytes; the 280-byte struct there is
// the deprecated Mc2HcommCfg). The CPU twin (UBEP_CPU_TWIN) has no toolkit and gets byte arrays of
// the same sizes; the static_asserts pin both to the offsets the kernels depend on.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ep_tiling.h"

#if defined(UBEP_CPU_TWIN)
struct Mc2InitTiling {
  uint8_t reserved[64];
};
struct Mc2CcTiling {
  uint8_t reserved[512];
};
#else
#include "kernel_tiling/kernel_tiling.h"
#endif

namespace ubep_ascend {

struct EpOpTiling {
  Mc2InitTiling mc2InitTiling;
  Mc2CcTiling mc2CcTiling;
  EpTiling ep;
};

static_assert(sizeof(Mc2InitTiling) == 64 && sizeof(Mc2CcTiling) == 512,
              "HCCL's tiling structs: 64 and 512 bytes (asc-devkit hccl_tilingdata.h)");
static_assert(offsetof(EpOpTiling, mc2CcTiling) == 64 && offsetof(EpOpTiling, ep) == 576,
              "the kernels read EpTiling at byte 576 of the op's tiling");

}  // namespace ubep_ascend
