// Launching a kernel on the twin and what a kernel asks about its launch: one std::thread per AIV
// (GetBlockIdx/GetBlockNum), the 50 MHz system counter, the HCCL contexts, the kernel type and the
// op-project tiling macros. At the end of each AIV's kernel the twin checks that no flag is still
// set and no scalar GM write is still dirty in its DCache.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "data_copy.h"

namespace AscendC {
namespace twin {

// The contexts of the launch's two communication domains, set by the twin's HCCL group
// (cpu_twin/hccl_group.h) while it lives.
inline GM_ADDR hccl_contexts[2] = {nullptr, nullptr};

inline void DeclareKernelType(KernelMetaType t) { Me().launch->kernel_type.store(t); }

// (A2/A3: InitTilingData, get_op_tiling.py:1451-1513) the tiling goes GM -> UB address 0 on MTE2,
// MTE2 -> S, then to the stack, then PipeBarrier<PIPE_ALL>: it overwrites whatever UB held there.
inline void LoadTiling(void* dst, size_t n, GM_ADDR gm, Loc loc) {
  Core& c = Me();
  const uint64_t ub_bytes = (n + 31) / 32 * 32;
  if (ub_bytes > TOTAL_UB_SIZE) Fail("GET_TILING_DATA_WITH_STRUCT: the tiling does not fit in UB");
  const Op in = c.Begin(kMte2, "GET_TILING_DATA_WITH_STRUCT", loc);
  c.Gm(in, (uint64_t)gm, n, false);
  c.Ub(in, 0, ub_bytes, true);
  gm_load(c.UbPtr(0), (const uint8_t*)gm, static_cast<int64_t>(n));
  c.BarrierAll();
  const Op read = c.Begin(kS, "GET_TILING_DATA_WITH_STRUCT", loc);
  c.Ub(read, 0, n, false);
  std::memcpy(dst, c.UbPtr(0), n);
  c.BarrierAll();
}

// Runs fn once per AIV, each on its own thread with its block index; returns when all finish.
// `die` (this process's rank in the HCCL group, if the launcher knows it) names the die in reports.
inline void launch(int64_t block_dim, const std::function<void()>& fn, int64_t die = die_rank) {
  die_rank = die;
  Launch l(block_dim);
  l.serial = ++launch_serial;  // the cross-core check's launch number (xcore.h)
  l.dies_ended = EndedLaunches();
  LocalStamps::Get().Clear();
  std::vector<std::thread> threads;
  for (int64_t b = 0; b < block_dim; ++b) {
    threads.emplace_back([&, b] {
      auto core = std::make_unique<Core>(b, &l);
      tl_core = core.get();
      tl_block = b;
      tl_blocks = block_dim;
      fn();
      core->pub.Fence();  // the end of the kernel orders every copy
      core->EndKernel();
      l.Finish();
      tl_core = nullptr;
      tl_block = -1;
    });
  }
  for (auto& t : threads) t.join();
  PublishEnded(die, l.serial);
}

}  // namespace twin

// Returns the context registered for domain index, nullptr for index > 1 (no static_assert).
template <uint32_t index>
inline __gm__ uint8_t* __gm__ GetHcclContext(void) {
  if constexpr (index < 2) {
    return twin::hccl_contexts[index];
  } else {
    return nullptr;
  }
}

inline int64_t GetBlockIdx() { return twin::Me().block_idx; }
inline int64_t GetBlockNum() { return twin::Me().launch->block_num; }

// 50 MHz on A2/A3: time_us = cycles / 50 (GetSystemCycle doc). Every poll of the kernels reads it,
// so the twin yields here: W dies of AIV threads then share a few CPU cores instead of spinning.
inline int64_t GetSystemCycle() {
  using namespace std::chrono;
  std::this_thread::yield();
  return duration_cast<nanoseconds>(steady_clock::now().time_since_epoch()).count() / 20;
}

}  // namespace AscendC

#define KERNEL_TASK_TYPE_DEFAULT(value) ::AscendC::twin::DeclareKernelType(value)
#define KERNEL_TASK_TYPE(key, value) ::AscendC::twin::DeclareKernelType(value)
#define REGISTER_TILING_DEFAULT(tiling_struct) static_assert(sizeof(tiling_struct) > 0, "a tiling struct")
#define GET_TILING_DATA_WITH_STRUCT(tiling_struct, name, tiling_gm) \
  tiling_struct name;                                               \
  ::AscendC::twin::LoadTiling(&name, sizeof(tiling_struct), tiling_gm, ::AscendC::twin::Loc::current())
