// Where every die's window is, read from the HCCL context of the op's group (communication domain
// 0), as MC2 kernels find peer HBM: this rank's own window is localWindowsIn; a peer's is the
// windowsIn of its HcclRankRelationResV2, reached through remoteRes[peer].nextDevicePtr. The table
// remoteRes is found at ctx + rWinStart, as the toolkit's own Hccl accessor finds it, not at a fixed
// offset: the blocks before it differ between CANN versions (hccl_context.h). The same
// code runs on the NPU (the runtime fills the context) and on the CPU twin (the twin's HCCL group,
// cpu_twin/hccl_group.h, fills it from the /dev/shm windows).
#pragma once

#include "hccl_context.h"
#include "kernel_operator.h"

namespace ubep_ascend {

class HcclWindows {
 public:
  __aicore__ inline void Init(int64_t rank) {
    context_ = reinterpret_cast<__gm__ hccl::HcclOpResParam*>(AscendC::GetHcclContext<0>());
    rank_ = rank;
  }

  // GM base of rank r's window (r == this rank: its own).
  __aicore__ inline __gm__ uint8_t* Base(int64_t r) const {
    if (r == rank_) return reinterpret_cast<__gm__ uint8_t*>(context_->localWindowsIn);
    const __gm__ hccl::RemoteResPtr* remote = reinterpret_cast<__gm__ hccl::RemoteResPtr*>(
        reinterpret_cast<__gm__ uint8_t*>(context_) + context_->rWinStart);
    const __gm__ hccl::HcclRankRelationResV2* peer =
        reinterpret_cast<__gm__ hccl::HcclRankRelationResV2*>(remote[r].nextDevicePtr);
    return reinterpret_cast<__gm__ uint8_t*>(peer->windowsIn);
  }

 private:
  __gm__ hccl::HcclOpResParam* context_;
  int64_t rank_;
};

}  // namespace ubep_ascend
