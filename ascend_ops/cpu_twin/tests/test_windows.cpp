// Checks that the kernels find every die's window through the HCCL context: for groups of 1, 2 and 5
// dies, with the table of peer records where this struct puts it (byte 2984) and where another CANN
// version does (3320, found only through rWinStart), seen from each die, every AIV's
// HcclWindows::Base(r) (op_kernel/hccl_windows.h) and the
// kernels' Ctx::Slot(r) (op_kernel/ep_common.h) must be die r's window, as the twin's HCCL group
// (cpu_twin/hccl_group.h) laid it out, past the header, for both slot parities.
#include <cstdint>
#include <string>
#include <vector>

#include "../../../scheduler/tests/check.h"
#include "ep_common.h"
#include "hccl_group.h"

namespace {

constexpr int64_t kHeaderBytes = 4096, kSlotBytes = 4096, kWindowBytes = kHeaderBytes + 2 * kSlotBytes, kAivs = 3;

int64_t Address(const uint8_t* p) { return static_cast<int64_t>(reinterpret_cast<uintptr_t>(p)); }

void check_group(int64_t world, size_t remote_offset, Checks& checks) {
  std::vector<std::vector<uint8_t>> memory(world);
  std::vector<uint8_t*> bases;
  for (auto& m : memory) {
    m.resize(kWindowBytes + AscendC::twin::lock_table_bytes(kWindowBytes));
    bases.push_back(m.data());
  }
  for (int64_t rank = 0; rank < world; ++rank) {
    const ubep_ascend::TwinHcclGroup group("test-group", rank, bases, kWindowBytes, remote_offset);
    for (int64_t epoch = 1; epoch <= 2; ++epoch) {
      ubep_ascend::EpTiling t{};
      t.world = world;
      t.rank = rank;
      t.slots_off = kHeaderBytes;
      t.slot_bytes = kSlotBytes;
      t.ws_counters = 64;
      std::vector<uint8_t> scratch(1024);
      std::vector<uint8_t*> got_base(kAivs * world), got_slot(kAivs * world);
      AscendC::twin::launch(kAivs, [&] {
        ubep_ascend::Ctx c;
        c.Init(&t, scratch.data());
        c.epoch = static_cast<uint64_t>(epoch);  // as TakeCallNumber sets it
        for (int64_t r = 0; r < world; ++r) {
          got_base[AscendC::GetBlockIdx() * world + r] = c.windows.Base(r);
          got_slot[AscendC::GetBlockIdx() * world + r] = c.Slot(r);
        }
      });
      for (int64_t i = 0; i < kAivs * world; ++i) {
        const int64_t r = i % world;
        const std::string seen = "W=" + std::to_string(world) + " table at " + std::to_string(remote_offset) +
                                 " rank " + std::to_string(rank) + " epoch " +
                                 std::to_string(epoch) + ": window of rank " + std::to_string(r);
        checks.equal(Address(got_base[i]), Address(bases[r]), seen + " (Base)");
        checks.equal(Address(got_slot[i]), Address(bases[r] + kHeaderBytes + (epoch & 1) * kSlotBytes),
                     seen + " (Slot)");
      }
    }
  }
}

}  // namespace

int main() {
  Checks checks;
  for (const int64_t world : {1, 2, 5}) {
    for (const size_t remote_offset : {ubep_ascend::hccl::kRemoteResOffset, size_t{3320}}) {
      check_group(world, remote_offset, checks);
    }
  }
  return checks.report("ascend windows");
}
