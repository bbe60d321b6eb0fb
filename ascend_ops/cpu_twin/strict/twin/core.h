// One AIV of the twin (a thread) and the launch it belongs to. The AIV owns its UB, its pipes'
// clocks and flags, the race checker's shadows and its DCache; every API operation goes through
// Core: it is numbered on its pipe (Begin), its UB and GM bytes are checked and recorded (Ub, Gm),
// and its data effect then happens at once, in program order. Only the ordering is checked
// against the asynchronous chip, so runs stay deterministic.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>

#include "clocks.h"
#include "dcache.h"
#include "shadow.h"
#include "xcore.h"

namespace AscendC {
namespace twin {

// What all AIVs of one launch share: the hard SyncAll barrier and the kernel type.
struct Launch {
  explicit Launch(int64_t n) : block_num(n) {}
  const int64_t block_num;
  std::mutex m;
  std::condition_variable cv;
  int64_t arrived = 0, generation = 0, finished = 0;
  bool hang = false;
  std::atomic<int> kernel_type{-1};  // -1: no KERNEL_TASK_TYPE_DEFAULT, the compiler infers it
  std::atomic<int64_t> ended{0};      // AIVs past the end of the kernel
  std::atomic<int64_t> spinning{0};   // AIVs polling in a soft SyncAll
  uint64_t serial = 0;                // this process's launch number (xcore.h)
  std::vector<uint64_t> dies_ended;   // every die's last ended launch as this one started (xcore.h)

  // A hard SyncAll: every AIV of the launch must come; one that ends the kernel instead would
  // leave the others waiting forever on the chip.
  void Barrier(const std::string& site) {
    std::unique_lock<std::mutex> lk(m);
    const int64_t gen = generation;
    if (++arrived + finished == block_num) {
      if (finished == 0) {
        arrived = 0;
        ++generation;
        cv.notify_all();
        return;
      }
      hang = true;
      cv.notify_all();
    }
    cv.wait(lk, [&] { return generation != gen || hang; });
    if (hang && generation == gen) {
      lk.unlock();
      Fail(Format("SyncAll (%s) hangs on the chip: %" PRId64 " AIV(s) ended the kernel without reaching it",
                  site.c_str(), finished));
    }
  }
  void Finish() {
    std::lock_guard<std::mutex> g(m);
    ++finished;
    ended.fetch_add(1);
    if (arrived > 0 && arrived + finished == block_num) {
      hang = true;
      cv.notify_all();
    }
  }
};

class Core final : public DCacheHooks {
 public:
  Core(int64_t idx, Launch* l) : block_idx(idx), launch(l), ub_(new uint8_t[TOTAL_UB_SIZE]), ub_shadow_(TOTAL_UB_SIZE) {
    std::memset(ub_.get(), 0xA5, TOTAL_UB_SIZE);  // UB starts with garbage on the chip, not zeros
    pub.Start(die_rank, idx, l->serial, &l->dies_ended);
  }

  const int64_t block_idx;
  Launch* const launch;
  Clocks clocks;
  Flags flags;
  DCache dcache;
  void* tpipe = nullptr;       // the live TPipe (one per kernel)
  int atomic_bytes = 0;        // SetAtomicAdd<T>: sizeof(T), 0 when off
  bool atomic_float = false;
  const char* atomic_type = "";
  void (*atomic_add)(uint8_t* gm, const uint8_t* ub, int64_t count) = nullptr;
  int64_t soft_syncs = 0;      // soft SyncAll calls so far
  Publication pub;             // its MTE3 writes' stamps and what its MTE2 reads saw (xcore.h)

  Op Begin(int pipe, const char* api, const Loc& loc) { return Begin(pipe, Sites::Intern(api, loc)); }
  Op Begin(int pipe, uint32_t site) {
    if (pipe == kV && AutoSync()) clocks.Barrier(kV);  // auto-sync inserts V->V barriers on 2201
    return Op{pipe, clocks.Issue(pipe), site};
  }

  uint8_t* UbPtr(uint64_t off) { return ub_.get() + off; }

  // op reads (write == false) or writes UB [off, off + n).
  void Ub(const Op& op, uint64_t off, uint64_t n, bool write) {
    if (off + n > TOTAL_UB_SIZE) {
      Fail(Format("%s: UB bytes [%" PRIu64 ", %" PRIu64 ") are past the usable UB (%u bytes on A2/A3)",
                  Sites::Describe(op.site).c_str(), off, off + n, TOTAL_UB_SIZE));
    }
    CheckRange<UbShadow::kBlock>([this](uint64_t k) -> auto& { return ub_shadow_.Block(k); },
               [](uint64_t lo, uint64_t hi) { return Format("UB bytes [0x%" PRIx64 ", 0x%" PRIx64 ")", lo, hi); },
               off, n, op, write, clocks);
  }

  // op reads or writes GM [addr, addr + n); a DMA (MTE2/MTE3) also meets the DCache's rules.
  void Gm(const Op& op, uint64_t addr, uint64_t n, bool write) {
    CheckRange<GmShadow::kBlock>([this](uint64_t k) -> auto& { return gm_shadow_.Block(k); },
               [](uint64_t lo, uint64_t hi) { return Format("GM bytes [0x%" PRIx64 ", 0x%" PRIx64 ")", lo, hi); },
               addr, n, op, write, clocks);
    if (op.pipe == kMte2 || op.pipe == kMte3) dcache.Dma(addr, n, write, op.site);
  }

  void BarrierAll() {
    pub.Fence();
    clocks.BarrierAll();
    gm_shadow_.Clear();
  }

  // A scalar access through a Local/GlobalTensor accessor: with auto-sync on, the compiler orders
  // it against V/MTE2/MTE3 on both sides.
  template <class F>
  void ScalarAccessor(F&& f) {
    if (AutoSync()) {
      clocks.AutoSyncBefore();
      pub.Fence();  // the compiler's wait of S for MTE3 is an MTE3-sourced flag
    }
    f();
    if (AutoSync()) clocks.AutoSyncAfter();
  }

  uint64_t UnorderedDmaBytes(uint64_t line) override {
    uint64_t m = 0;
    for (uint64_t i = 0; i < kLineBytes; ++i) {
      const ShadowByte* b = gm_shadow_.Find(line + i);
      if (b && b->w.epoch && b->w.pipe() == kMte3 && !clocks.Ordered(kMte3, b->w.epoch, kS)) m |= 1ull << i;
    }
    return m;
  }
  void WroteBack(uint64_t line, uint64_t mask, uint32_t site) override {
    const Op op = Begin(kS, site);
    for (uint64_t i = 0; i < kLineBytes; ++i) {
      if (mask >> i & 1) Gm(op, line + i, 1, true);
    }
  }

  void EndKernel() {
    flags.CheckIdle();
    dcache.CheckClean();
  }

 private:
  std::unique_ptr<uint8_t[]> ub_;
  UbShadow ub_shadow_;
  GmShadow gm_shadow_;
};

inline thread_local Core* tl_core = nullptr;

inline Core& Me() {
  if (!tl_core) Fail("an Ascend C API was called outside a kernel launch (twin::launch)");
  return *tl_core;
}

}  // namespace twin
}  // namespace AscendC
