// The tiling data the kernel entries receive: HCCL's tiling first (an MC2 op's tiling must start with
// Mc2InitTiling; Mc2CcTiling describes its one communication task), then ubep's layout. The kernels
// read only `ep`; HCCL's parts are opaque bytes of the documented sizes, which the host tiling
// (op_host/mc2/ep_mc2.h) fills through the toolkit's Mc2InitTiling / Mc2CcTiling types and
// checks against their sizes.
#pragma once

#include "ep_tiling.h"

namespace ubep_ascend {

constexpr int64_t MC2_INIT_TILING_BYTES = 64;
constexpr int64_t MC2_CC_TILING_BYTES = 280;

struct EpOpTiling {
  uint8_t mc2InitTiling[MC2_INIT_TILING_BYTES];
  uint8_t mc2CcTiling[MC2_CC_TILING_BYTES];
  EpTiling ep;
};

}  // namespace ubep_ascend
