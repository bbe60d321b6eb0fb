// The twin's HCCL group: what the runtime hands an MC2 op on an NPU, built from the dies' /dev/shm
// windows, which like HCCL's live as long as the process group (the Python side keeps them; every
// Buffer on the group uses them). While it lives (one launch), GetHcclContext<0>() returns its context
// (op_kernel/hccl_context.h): the group's name, this die's rank, the group's size, the window size,
// localWindowsIn = this die's window and, in the table at rWinStart, entry r's nextDevicePtr -> a
// record whose windowsIn is die r's window. The table may be put elsewhere than the struct's own
// remoteRes field (remote_offset), as another CANN version lays the context out, so a kernel that
// reads the field instead of following rWinStart fails. The entry of the die's own rank stays
// empty, so a kernel must take its own window
// from localWindowsIn (as MC2 kernels do); there are no Out or Exp windows (ubep uses neither), their
// addresses are 0. The windows are also registered as shared GM, which gives them the twin's
// 512-byte transactions.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "hccl_context.h"
#include "kernel_operator.h"

namespace ubep_ascend {

class TwinHcclGroup {
 public:
  // windows[r]: die r's window of window_bytes, the group's window size, which may exceed the
  // layer's (its lock table follows, see twin::shared_regions). remote_offset: where the table of
  // peer records starts (rWinStart), a multiple of 8 past the head.
  TwinHcclGroup(const std::string& name, int64_t rank, const std::vector<uint8_t*>& windows, int64_t window_bytes,
                size_t remote_offset = hccl::kRemoteResOffset)
      : context_(std::max(sizeof(hccl::HcclOpResParam), remote_offset + windows.size() * sizeof(hccl::RemoteResPtr)) /
                 sizeof(uint64_t)),
        peers_(windows.size()) {
    auto& c = *reinterpret_cast<hccl::HcclOpResParam*>(context_.data());
    auto* remote = reinterpret_cast<hccl::RemoteResPtr*>(reinterpret_cast<uint8_t*>(context_.data()) + remote_offset);
    c.rWinStart = static_cast<uint32_t>(remote_offset);
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
      remote[r].nextDevicePtr = Address(&peers_[r]);
    }
    AscendC::twin::hccl_contexts[0] = reinterpret_cast<GM_ADDR>(context_.data());
  }
  ~TwinHcclGroup() {
    AscendC::twin::hccl_contexts[0] = nullptr;
    AscendC::twin::shared_regions.clear();
  }
  TwinHcclGroup(const TwinHcclGroup&) = delete;
  TwinHcclGroup& operator=(const TwinHcclGroup&) = delete;

 private:
  static uint64_t Address(const void* p) { return reinterpret_cast<uint64_t>(p); }

  std::vector<uint64_t> context_;  // zeroed, 8-byte aligned: the HcclOpResParam and its table
  std::vector<hccl::HcclRankRelationResV2> peers_;
};

}  // namespace ubep_ascend
