// Multi-die on the strict twin: one process per die, every die's window in one shared mapping
// (as the /dev/shm windows are), the twin's HCCL group (cpu_twin/hccl_group.h) as the context.
// Every AIV of every die writes a 512-byte block (480 B payload, 32 B flag) into every die's
// window with one DataCopy, then polls its own window the MC2 way: DataCopy to UB, MTE2_S,
// GetValue, S_MTE2. Cross-die and cross-AIV GM accesses are not compared by the race checker;
// an AIV's own pipes still are: without S_MTE2 the next poll's DataCopy races with the read.
#include <sys/mman.h>

#include <cstdlib>
#include <vector>

#include "harness.h"
#include "hccl_group.h"

using namespace AscendC;
using strict_test::Suite;

namespace {

constexpr int64_t kDies = 3, kAivs = 2, kBlock = 512, kWindow = 4096;
static_assert(kDies * kAivs * kBlock <= kWindow);

int32_t Token(int64_t die, int64_t aiv) { return static_cast<int32_t>(1000 * (die + 1) + aiv); }

// GM base of die d's window, read from the HCCL context as the kernels do.
__gm__ uint8_t* Window(int64_t d, int64_t me) {
  const auto* ctx = (const ubep_ascend::hccl::HcclOpResParam*)GetHcclContext<0>();
  if (d == me) return (__gm__ uint8_t*)ctx->localWindowsIn;
  const auto* peer = (const ubep_ascend::hccl::HcclRankRelationResV2*)ctx->remoteRes[d].nextDevicePtr;
  return (__gm__ uint8_t*)peer->windowsIn;
}

void Kernel(int64_t rank, bool sync_before_repoll) {
  TPipe pipe;
  TBuf<TPosition::VECCALC> out_buf, in_buf;
  pipe.InitBuffer(out_buf, kBlock);
  pipe.InitBuffer(in_buf, kBlock);
  const int64_t me = GetBlockIdx();
  LocalTensor<int32_t> out = out_buf.Get<int32_t>(), in = in_buf.Get<int32_t>();
  Duplicate(out, Token(rank, me), kBlock / 4);
  SetFlag<HardEvent::V_MTE3>(0);
  WaitFlag<HardEvent::V_MTE3>(0);
  GlobalTensor<int32_t> slot;
  for (int64_t d = 0; d < kDies; ++d) {
    slot.SetGlobalBuffer((__gm__ int32_t*)(Window(d, rank) + (rank * kAivs + me) * kBlock), kBlock / 4);
    DataCopy(slot, out, kBlock / 4);
  }
  PipeBarrier<PIPE_ALL>();
  const int64_t deadline = GetSystemCycle() + 50LL * 1000 * 1000 * 5;  // 5 s at 50 MHz
  for (int64_t s = 0; s < kDies * kAivs; ++s) {
    slot.SetGlobalBuffer((__gm__ int32_t*)(Window(rank, rank) + s * kBlock), kBlock / 4);
    while (true) {
      DataCopy(in, slot, kBlock / 4);
      SetFlag<HardEvent::MTE2_S>(0);
      WaitFlag<HardEvent::MTE2_S>(0);
      const int32_t flag = in.GetValue(kBlock / 4 - 1), first = in.GetValue(0);
      if (sync_before_repoll) {
        SetFlag<HardEvent::S_MTE2>(0);
        WaitFlag<HardEvent::S_MTE2>(0);
      }
      if (flag == Token(s / kAivs, s % kAivs)) {
        if (first != flag) std::exit(4);  // a block is seen whole
        break;
      }
      if (GetSystemCycle() > deadline) std::exit(5);
    }
  }
}

// Runs kDies die processes over one shared mapping; returns normally only if all succeed, and
// aborts like a failed die otherwise (its report is already on stderr).
void Group(bool sync_before_repoll) {
  const int64_t map = twin::mapping_bytes(kWindow);
  void* shared = mmap(nullptr, kDies * map, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  auto* mem = static_cast<uint8_t*>(shared);
  if (mem == MAP_FAILED) std::exit(6);
  std::vector<uint8_t*> windows;
  for (int64_t d = 0; d < kDies; ++d) windows.push_back(mem + d * map);
  std::vector<pid_t> dies;
  for (int64_t r = 0; r < kDies; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      twin::die_rank = r;
      ubep_ascend::TwinHcclGroup group("strict-test", r, windows, kWindow);
      twin::launch(kAivs, [&] { Kernel(r, sync_before_repoll); });
      _exit(0);
    }
    dies.push_back(pid);
  }
  bool ok = true;
  for (pid_t pid : dies) {
    int status = 0;
    waitpid(pid, &status, 0);
    ok = ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  if (!ok) std::abort();
}

}  // namespace

int main() {
  Suite s("ascend strict twin: windows");
  s.Passes("3 dies x 2 AIVs exchange 512-byte blocks through the HCCL context's windows", [] { Group(true); });
  s.Aborts("a poll that re-copies into UB before S_MTE2 races on that die", [] { Group(false); },
           {"AIV", "data race on UB bytes", "LocalTensor::GetValue", "DataCopy(GM->UB)", "HardEvent::S_MTE2"});
  s.Check("the report names the die (die 0, 1 or 2)", [] {
    const strict_test::Outcome o = strict_test::RunChild([] { Group(false); });
    return o.err.find("die 0, AIV") != std::string::npos || o.err.find("die 1, AIV") != std::string::npos ||
           o.err.find("die 2, AIV") != std::string::npos;
  }());
  return s.Report();
}
