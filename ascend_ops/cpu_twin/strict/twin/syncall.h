// SyncAll across the AIVs of a launch (docs/ASCEND.md, "Pipes and synchronization on A2/A3").
// - Hard SyncAll<true>(): PipeBarrier<PIPE_ALL>, then the cross-core barrier. It needs a MIX
//   kernel type: with KERNEL_TYPE_AIV_ONLY (or AIC_ONLY) "the hardware does not enable the
//   scheduling module", so the chip hangs; the twin aborts. No macro (compiler inference) is
//   fine. It does not touch the DCache: scalar GM writes before it are not published by it.
// - Soft SyncAll(gmWorkspace, ubWorkspace, usedCores): the library's DataCopy/flag handshake
//   (SoftSyncAllImpl) run through the twin's own API, so its races are checked too. Contract:
//   gmWorkspace holds >= 8 int32 per core and is zeroed before the launch (each call raises the
//   core's slot by one, so call n finds n - 1 there); ubWorkspace holds >= 8 int32 per core; a
//   TPipe is alive (the library takes its event ids from it).
#pragma once

#include <thread>

#include "data_copy.h"
#include "tpipe.h"

namespace AscendC {

template <bool isAIVOnly = true>
inline void SyncAll(twin::Loc loc = twin::Loc::current()) {
  static_assert(isAIVOnly, "SyncAll<false> in a vector-only kernel hangs (SyncAll doc): use SyncAll<true>");
  twin::Core& c = twin::Me();
  const int type = c.launch->kernel_type.load();
  const bool mix = type == KERNEL_TYPE_MIX_AIV_1_0 || type == KERNEL_TYPE_MIX_AIC_1_0 ||
                   type == KERNEL_TYPE_MIX_AIC_1_1 || type == KERNEL_TYPE_MIX_AIC_1_2;
  if (type >= 0 && !mix) {
    twin::Fail(twin::Format("SyncAll (%s) hangs on the chip: KERNEL_TASK_TYPE_DEFAULT(%s) kernels have no inter-core "
                            "scheduling; use KERNEL_TYPE_MIX_AIV_1_0 or let the compiler infer the type",
                            twin::Where(loc).c_str(),
                            type == KERNEL_TYPE_AIV_ONLY   ? "KERNEL_TYPE_AIV_ONLY"
                            : type == KERNEL_TYPE_AIC_ONLY ? "KERNEL_TYPE_AIC_ONLY"
                                                           : "a non-MIX type"));
  }
  c.BarrierAll();
  c.launch->Barrier("SyncAll at " + twin::Where(loc));
}

template <bool isAIVOnly = true>
inline void SyncAll(const GlobalTensor<int32_t>& gmWorkspace, const LocalTensor<int32_t>& ubWorkspace,
                    const int32_t usedCores = 0, twin::Loc loc = twin::Loc::current()) {
  static_assert(isAIVOnly, "SyncAll<false> in a vector-only kernel hangs (SyncAll doc): use SyncAll<true>");
  twin::Core& c = twin::Me();
  const int64_t total = usedCores != 0 ? usedCores : c.launch->block_num, me = c.block_idx;
  const std::string at = twin::Where(loc);
  if (gmWorkspace.GetSize() < static_cast<uint64_t>(total * DEFAULT_BLK_NUM)) {
    twin::Fail(twin::Format("soft SyncAll (%s): gmWorkspace needs %" PRId64 " int32 (32 bytes per core), its "
                            "GlobalTensor has %" PRIu64 " (give SetGlobalBuffer the size)",
                            at.c_str(), total * DEFAULT_BLK_NUM, gmWorkspace.GetSize()));
  }
  if (ubWorkspace.GetSize() < static_cast<uint64_t>(total * DEFAULT_BLK_NUM)) {
    twin::Fail(twin::Format("soft SyncAll (%s): ubWorkspace needs %" PRId64 " int32, it has %u", at.c_str(),
                            total * DEFAULT_BLK_NUM, ubWorkspace.GetSize()));
  }
  TPipe& pipe = twin::CurrentPipe();
  PipeBarrier<PIPE_ALL>(loc);
  GlobalTensor<int32_t> slot = gmWorkspace[me * DEFAULT_BLK_NUM];
  const LocalTensor<int32_t> mine = ubWorkspace[me * DEFAULT_BLK_NUM];
  auto sync = [&](auto event) {
    constexpr HardEvent e = decltype(event)::value;
    const TEventID id = pipe.FetchEventID(e);
    SetFlag<e>(id, loc);
    WaitFlag<e>(id, loc);
  };
  using MTE2_S = std::integral_constant<HardEvent, HardEvent::MTE2_S>;
  using S_MTE3 = std::integral_constant<HardEvent, HardEvent::S_MTE3>;
  using MTE3_MTE2 = std::integral_constant<HardEvent, HardEvent::MTE3_MTE2>;
  using S_MTE2 = std::integral_constant<HardEvent, HardEvent::S_MTE2>;

  DataCopy(mine, slot, DEFAULT_BLK_NUM, loc);
  sync(MTE2_S{});
  const int32_t cur = mine.GetValue(0, loc) + 1;
  if (cur - 1 != c.soft_syncs) {
    twin::Fail(twin::Format("soft SyncAll (%s): this AIV's workspace slot holds %d at its call %" PRId64 "; the GM "
                            "workspace must be zeroed before the launch", at.c_str(), cur - 1, c.soft_syncs + 1));
  }
  mine.SetValue(0, cur, loc);
  sync(S_MTE3{});
  DataCopy(slot, mine, DEFAULT_BLK_NUM, loc);
  sync(MTE3_MTE2{});
  ++c.soft_syncs;
  c.launch->spinning.fetch_add(1);
  while (true) {
    const bool stuck = usedCores == 0 && c.launch->ended.load() > 0 &&
                       c.launch->ended.load() + c.launch->spinning.load() == total;
    DataCopy(ubWorkspace, gmWorkspace, static_cast<uint32_t>(total * DEFAULT_BLK_NUM), loc);
    sync(MTE2_S{});
    int64_t count = 0;
    for (int64_t i = 0; i < total; ++i) count += ubWorkspace.GetValue(static_cast<uint32_t>(i * DEFAULT_BLK_NUM), loc);
    sync(S_MTE2{});
    if (count >= total * cur) break;
    if (stuck) {
      twin::Fail(twin::Format("soft SyncAll (%s) hangs on the chip: %" PRId64 " AIV(s) ended the kernel without "
                              "reaching it", at.c_str(), c.launch->ended.load()));
    }
    std::this_thread::yield();
  }
  c.launch->spinning.fetch_sub(1);
  c.pub.Fence();  // an ordering point of MTE3 for the cross-core check (xcore.h), as the hard one
}

}  // namespace AscendC
