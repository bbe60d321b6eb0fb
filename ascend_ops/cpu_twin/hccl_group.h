// The twin's HCCL group: what the runtime hands an MC2 op on an NPU, built from the dies' /dev/shm
// windows, which like HCCL's live as long as the process group (the Python side keeps them; every
// Buffer on the group uses them). While it lives (one launch), GetHcclContext<0>() returns its context
// (op_kernel/hccl_context.h): the group's name, this die's rank, the group's size, the window size,
// localWindowsIn = this die's window and remoteRes[r].nextDevicePtr -> a record whose windowsIn is
// die r's window. remoteRes of the die's own rank stays empty, so a kernel must take its own window
// from localWindowsIn (as MC2 kernels do); there are no Out or Exp windows (ubep uses neither), their
// addresses are 0. The windows are also registered as shared GM, which gives them the twin's
// 512-byte transactions.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "hccl_context.h"
#include "kernel_operator.h"

namespace ubep_ascend {

class TwinHcclGroup {
 public:
  // windows[r]: die r's window of window_bytes, the group's window size, which may exceed the
  // layer's (its lock table follows, see twin::shared_regions).
  TwinHcclGroup(const std::string& name, int64_t rank, const std::vector<uint8_t*>& windows, int64_t window_bytes)
      : context_(std::make_unique<hccl::HcclOpResParam>()), peers_(windows.size()) {
    hccl::HcclOpResParam& c = *context_;
    std::strncpy(c.hcomId, name.c_str(), sizeof(c.hcomId) - 1);
    c.localUsrRankId = static_cast<uint32_t>(rank);
    c.rankSize = static_cast<uint32_t>(windows.size());
    c.remoteResNum = c.rankSize;
    c.winSize = static_cast<uint64_t>(window_bytes);
    c.localWindowsIn = Address(windows[rank]);
    for (size_t r = 0; r < windows.size(); ++r) {
      AscendC::twin::shared_regions.push_back({windows[r], window_bytes});
      if (static_cast<int64_t>(r) == rank) continue;
      peers_[r].remoteUsrRankId = static_cast<uint32_t>(r);
      peers_[r].remoteWorldRank = static_cast<uint32_t>(r);
      peers_[r].windowsIn = Address(windows[r]);
      c.remoteRes[r].nextDevicePtr = Address(&peers_[r]);
    }
    AscendC::twin::hccl_contexts[0] = reinterpret_cast<GM_ADDR>(context_.get());
  }
  ~TwinHcclGroup() {
    AscendC::twin::hccl_contexts[0] = nullptr;
    AscendC::twin::shared_regions.clear();
  }
  TwinHcclGroup(const TwinHcclGroup&) = delete;
  TwinHcclGroup& operator=(const TwinHcclGroup&) = delete;

 private:
  static uint64_t Address(const void* p) { return reinterpret_cast<uint64_t>(p); }

  std::unique_ptr<hccl::HcclOpResParam> context_;
  std::vector<hccl::HcclRankRelationResV2> peers_;
};

}  // namespace ubep_ascend
