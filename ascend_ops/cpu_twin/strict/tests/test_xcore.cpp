// The cross-core publication check (twin/xcore.h): a writer AIV publishes data, then a flag (or an
// atomic counter bump); a reader on another AIV, of the same die or another, polls the flag and then
// reads the data. Every MTE3 ordering point between the two writes passes (PipeBarrier<PIPE_MTE3>,
// PipeBarrier<PIPE_ALL>, SetFlag/WaitFlag<MTE3_S>, hard and soft SyncAll); without one the reader
// aborts with "cross-core race", deterministically: the twin applies every copy at once, so the
// data is always there, and only the stamps say that the chip might not have delivered it yet.
// Flag and data in one copy, re-polls, data a previous launch left (same die or another) pass.
// Cross-die cases run one process per die over one shared mapping of both windows, as
// test_windows.cpp does.
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <functional>
#include <vector>

#include "harness.h"
#include "hccl_group.h"

using namespace AscendC;
using strict_test::Suite;

namespace {

constexpr int64_t kWindow = 4096;
constexpr int64_t kData = 0, kFlag = 1024, kHello = 2048, kCounter = 3072;  // offsets in a window
constexpr int32_t kToken = 0x5eed;
const char* const kNoFence =
    "which it let become visible with no fence between them (PipeBarrier<PIPE_MTE3> / PIPE_ALL / SetFlag<MTE3_*> / "
    "SyncAll)";

enum class Fence { kNone, kMte3, kAll, kMte3S, kSyncAll, kSoftSyncAll };

// GM base of die d's window, from the HCCL context as the kernels find it.
__gm__ uint8_t* Window(int64_t d) {
  const auto* ctx = (const ubep_ascend::hccl::HcclOpResParam*)GetHcclContext<0>();
  if (d == ctx->localUsrRankId) return (__gm__ uint8_t*)ctx->localWindowsIn;
  const auto* peer = (const ubep_ascend::hccl::HcclRankRelationResV2*)ctx->remoteRes[d].nextDevicePtr;
  return (__gm__ uint8_t*)peer->windowsIn;
}

template <typename T = int32_t>
GlobalTensor<T> At(__gm__ uint8_t* p, int64_t bytes) {
  GlobalTensor<T> g;
  g.SetGlobalBuffer((__gm__ T*)p, static_cast<uint64_t>(bytes) / sizeof(T));
  return g;
}

// One AIV's UB: 256 bytes of data, a 32-byte flag, a 32-byte probe, a soft SyncAll's workspace.
struct Ub {
  TPipe pipe;
  TBuf<TPosition::VECCALC> data_buf, flag_buf, probe_buf, ws_buf;
  LocalTensor<int32_t> data, flag, probe, ws;
  Ub() {
    pipe.InitBuffer(data_buf, 256);
    pipe.InitBuffer(flag_buf, 32);
    pipe.InitBuffer(probe_buf, 32);
    pipe.InitBuffer(ws_buf, 32 * 8);
    data = data_buf.Get<int32_t>();
    flag = flag_buf.Get<int32_t>();
    probe = probe_buf.Get<int32_t>();
    ws = ws_buf.Get<int32_t>();
  }
  // data and flag hold `token` for MTE3.
  void Fill(int32_t token) {
    Duplicate(data, token, 64);
    Duplicate(flag, token, 8);
    SetFlag<HardEvent::V_MTE3>(0);
    WaitFlag<HardEvent::V_MTE3>(0);
  }
};

// The workspace of the soft SyncAll (zeroed: each test runs in a fresh child process).
strict_test::Gm<int32_t, 8 * 8> soft_ws;

void Sync(Fence f, Ub& ub) {
  switch (f) {
    case Fence::kNone: break;
    case Fence::kMte3: PipeBarrier<PIPE_MTE3>(); break;
    case Fence::kAll: PipeBarrier<PIPE_ALL>(); break;
    case Fence::kMte3S:
      SetFlag<HardEvent::MTE3_S>(1);
      WaitFlag<HardEvent::MTE3_S>(1);
      break;
    case Fence::kSyncAll: SyncAll(); break;
    case Fence::kSoftSyncAll: SyncAll(At(soft_ws.bytes(), sizeof soft_ws.v), ub.ws); break;
  }
}

// The data (256 bytes, or 200 by DataCopyPad), then the flag, at `base`.
void Publish(Ub& ub, __gm__ uint8_t* base, Fence f, bool pad) {
  if (pad) {
    DataCopyPad(At(base + kData, 200), ub.data, DataCopyExtParams{1, 200, 0, 0, 0});
  } else {
    DataCopy(At(base + kData, 256), ub.data, 64);
  }
  Sync(f, ub);
  DataCopy(At(base + kFlag, 32), ub.flag, 8);
}

// Polls the 32 bytes at p until their first int32 is `want` (a re-poll reads the same write again).
void WaitFor(Ub& ub, __gm__ uint8_t* p, int32_t want) {
  const int64_t deadline = GetSystemCycle() + 50LL * 1000 * 1000 * 5;  // 5 s at 50 MHz
  while (true) {
    DataCopy(ub.probe, At(p, 32), 8);
    SetFlag<HardEvent::MTE2_S>(0);
    WaitFlag<HardEvent::MTE2_S>(0);
    const int32_t v = ub.probe.GetValue(0);
    SetFlag<HardEvent::S_MTE2>(0);
    WaitFlag<HardEvent::S_MTE2>(0);
    if (v == want) return;
    if (GetSystemCycle() > deadline) std::exit(5);
  }
}

// The flag, then the data it publishes.
void Consume(Ub& ub, __gm__ uint8_t* base, bool pad, int32_t token = kToken) {
  WaitFor(ub, base + kFlag, token);
  if (pad) {
    DataCopyPad(ub.data, At(base + kData, 200), DataCopyExtParams{1, 200, 0, 0, 0}, DataCopyPadExtParams<int32_t>{});
  } else {
    DataCopy(ub.data, At(base + kData, 256), 64);
  }
  SetFlag<HardEvent::MTE2_S>(0);
  WaitFlag<HardEvent::MTE2_S>(0);
  if (ub.data.GetValue(0) != token || ub.data.GetValue(49) != token) std::exit(4);
}

// ---- one die: AIV 1 writes, AIV 0 reads, in process memory or in a window of its own ----

strict_test::Gm<uint8_t, 4096> plain;

// The die's window (one mapping per test process, made on first use).
uint8_t* OwnWindow() {
  static uint8_t* w = [] {
    void* m = mmap(nullptr, twin::mapping_bytes(kWindow), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) std::exit(6);
    return static_cast<uint8_t*>(m);
  }();
  return w;
}

template <class Kernel>
void OneDie(bool window, int64_t aivs, Kernel kernel) {
  if (!window) {
    twin::launch(aivs, [&] { kernel(plain.bytes()); });
    return;
  }
  ubep_ascend::TwinHcclGroup group("xcore-one", 0, {OwnWindow()}, kWindow);
  twin::launch(aivs, [&] { kernel(Window(0)); }, 0);
}

void OneDieFlag(bool window, Fence f, bool pad = false) {
  OneDie(window, 2, [&](__gm__ uint8_t* base) {
    Ub ub;
    if (GetBlockIdx() == 1) {
      ub.Fill(kToken);
      Publish(ub, base, f, pad);
    } else {
      if (f == Fence::kSyncAll || f == Fence::kSoftSyncAll) Sync(f, ub);
      Consume(ub, base, pad);
    }
  });
}

// AIVs 1..n: their data, [PIPE_ALL,] counter += 1 by an atomic add; AIV 0 waits for n, reads all.
void Counter(bool window, int64_t n, bool fence) {
  OneDie(window, n + 1, [&](__gm__ uint8_t* base) {
    Ub ub;
    const int64_t me = GetBlockIdx();
    if (me > 0) {
      ub.Fill(kToken + static_cast<int32_t>(me));
      DataCopy(At(base + kData + 256 * (me - 1), 256), ub.data, 64);
      if (fence) PipeBarrier<PIPE_ALL>();
      for (uint32_t i = 0; i < 8; ++i) ub.ws.SetValue(i, i == 0 ? 1 : 0);
      SetFlag<HardEvent::S_MTE3>(0);
      WaitFlag<HardEvent::S_MTE3>(0);
      SetAtomicAdd<int32_t>();
      DataCopy(At(base + kCounter, 32), ub.ws, 8);
      SetAtomicNone();
      return;
    }
    WaitFor(ub, base + kCounter, static_cast<int32_t>(n));
    for (int64_t b = 1; b <= n; ++b) {
      SetFlag<HardEvent::S_MTE2>(0);
      WaitFlag<HardEvent::S_MTE2>(0);
      DataCopy(ub.data, At(base + kData + 256 * (b - 1), 256), 64);
      SetFlag<HardEvent::MTE2_S>(0);
      WaitFlag<HardEvent::MTE2_S>(0);
      if (ub.data.GetValue(0) != kToken + b) std::exit(4);
    }
  });
}

// ---- two dies: die 1 writes into die 0's window, die 0 reads ----

// Runs die 0 (reader) and die 1 (writer) as processes over one shared mapping of both windows.
// `sequential`: die 1 runs to its end (and its process exits) before die 0 starts.
void TwoDies(const std::function<void()>& reader, const std::function<void()>& writer, bool sequential = false) {
  const int64_t map = twin::mapping_bytes(kWindow);
  void* shared = mmap(nullptr, 2 * map, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (shared == MAP_FAILED) std::exit(6);
  auto* mem = static_cast<uint8_t*>(shared);
  const std::vector<uint8_t*> windows = {mem, mem + map};
  auto die = [&](int64_t r) {
    const pid_t pid = fork();
    if (pid == 0) {
      ubep_ascend::TwinHcclGroup group("xcore", r, windows, kWindow);
      twin::launch(1, r == 0 ? reader : writer, r);
      _exit(0);
    }
    return pid;
  };
  bool ok = true;
  auto join = [&](pid_t pid) {
    int status = 0;
    waitpid(pid, &status, 0);
    ok = ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  };
  if (sequential) {
    join(die(1));
    join(die(0));
  } else {
    const pid_t a = die(0), b = die(1);
    join(a);
    join(b);
  }
  if (!ok) std::abort();
}

// Die 0 says hello in die 1's window first, so that die 1's launch cannot end before die 0's starts
// (a launch that ended before the reader's started is a previous launch: its writes all landed).
void Hello(Ub& ub) {
  Duplicate(ub.flag, kToken, 8);
  SetFlag<HardEvent::V_MTE3>(0);
  WaitFlag<HardEvent::V_MTE3>(0);
  DataCopy(At(Window(1) + kHello, 32), ub.flag, 8);
  SetFlag<HardEvent::MTE3_V>(0);
  WaitFlag<HardEvent::MTE3_V>(0);
}

void CrossDie(Fence f, bool pad = false) {
  TwoDies(
      [&] {
        Ub ub;
        Hello(ub);
        Consume(ub, Window(0), pad);
      },
      [&] {
        Ub ub;
        ub.Fill(kToken);
        WaitFor(ub, Window(1) + kHello, kToken);
        Publish(ub, Window(0), f, pad);
      });
}

// Die 1 writes a whole 512-byte row, payload and flag (its last int32), in one copy, then a second
// row, with no fence at all; die 0 polls each row whole, then re-reads the first row's payload.
void RowsInOneCopy() {
  TwoDies(
      [] {
        Ub ub;
        Hello(ub);
        for (int64_t row = 0; row < 2; ++row) WaitFor(ub, Window(0) + kData + 512 * row + 480, kToken + 7);
        SetFlag<HardEvent::S_MTE2>(1);
        WaitFlag<HardEvent::S_MTE2>(1);
        DataCopy(ub.data, At(Window(0) + kData, 256), 64);
        SetFlag<HardEvent::MTE2_S>(0);
        WaitFlag<HardEvent::MTE2_S>(0);
        if (ub.data.GetValue(0) != kToken) std::exit(4);
      },
      [] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> row_buf, probe_buf;
        pipe.InitBuffer(row_buf, 512);
        pipe.InitBuffer(probe_buf, 32);
        const LocalTensor<int32_t> row = row_buf.Get<int32_t>(), probe = probe_buf.Get<int32_t>();
        Duplicate(row, kToken, 120);
        Duplicate(row[120], kToken + 7, 8);
        // wait for the hello (as WaitFor, with this kernel's buffers)
        while (true) {
          DataCopy(probe, At(Window(1) + kHello, 32), 8);
          SetFlag<HardEvent::MTE2_S>(0);
          WaitFlag<HardEvent::MTE2_S>(0);
          const int32_t v = probe.GetValue(0);
          SetFlag<HardEvent::S_MTE2>(0);
          WaitFlag<HardEvent::S_MTE2>(0);
          if (v == kToken) break;
        }
        SetFlag<HardEvent::V_MTE3>(0);
        WaitFlag<HardEvent::V_MTE3>(0);
        for (int64_t r = 0; r < 2; ++r) DataCopy(At(Window(0) + kData + 512 * r, 512), row, 128);
      });
}

}  // namespace

int main() {
  Suite s("ascend strict twin: cross-core publication");

  s.Check("window_of_mapping inverts mapping_bytes", [] {
    for (int64_t w : {int64_t{512}, int64_t{4096}, int64_t{12288}, int64_t{200} << 20, int64_t{4096} << 20}) {
      if (twin::window_of_mapping(twin::mapping_bytes(w)) != w || twin::mapping_bytes(w) % 8) return false;
    }
    return true;
  }());

  // Two dies.
  s.Passes("two dies: data, PipeBarrier<PIPE_MTE3>, flag; the reader polls the flag, then reads the data",
           [] { CrossDie(Fence::kMte3); });
  s.Aborts("two dies: data then flag with no fence: the reader of the data aborts", [] { CrossDie(Fence::kNone); },
           {"die 0, AIV 0 of 1: cross-core race: AIV 0 of die 0 read bytes [0x", "(window 0 + [0x0, 0x100))",
            "that AIV 0 of die 1 wrote at DataCopy(UB->GM) at ", "test_xcore.cpp:", " before DataCopy(UB->GM) at ",
            kNoFence, "earlier: DataCopy(GM->UB) at ", "(window 0 + [0x400, 0x420))",
            "put PipeBarrier<PIPE_MTE3>() between the two writes on AIV 0 of die 1"});
  s.Passes("two dies: data, PipeBarrier<PIPE_ALL>, flag", [] { CrossDie(Fence::kAll); });
  s.Passes("two dies: data, SetFlag/WaitFlag<MTE3_S>, flag", [] { CrossDie(Fence::kMte3S); });
  s.Passes("two dies, DataCopyPad: data, PipeBarrier<PIPE_MTE3>, flag", [] { CrossDie(Fence::kMte3, true); });
  s.Aborts("two dies, DataCopyPad: data then flag with no fence", [] { CrossDie(Fence::kNone, true); },
           {"cross-core race", "(window 0 + [0x0, 0xc8))", "wrote at DataCopyPad(UB->GM) at", kNoFence});
  s.Passes("two dies: flag and payload in one copy per row, two rows with no fence, re-read", [] { RowsInOneCopy(); });
  s.Passes("two dies: a launch reads what another die's ended launch left with no fence", [] {
    TwoDies([] {
      Ub ub;
      Consume(ub, Window(0), false);
    },
            [] {
              Ub ub;
              ub.Fill(kToken);
              Publish(ub, Window(0), Fence::kNone, false);
            },
            true);
  });

  // One die, two AIVs, in a window and in process memory (scratch, counters).
  for (const bool window : {true, false}) {
    const std::string where = window ? " (window)" : " (process memory)";
    s.Passes("one die: data, PipeBarrier<PIPE_MTE3>, flag" + where, [=] { OneDieFlag(window, Fence::kMte3); });
    s.Aborts("one die: data then flag with no fence" + where, [=] { OneDieFlag(window, Fence::kNone); },
             {"cross-core race: AIV 0 of die", "that AIV 1 of die", kNoFence});
    s.Passes("one die: data, PipeBarrier<PIPE_ALL>, flag" + where, [=] { OneDieFlag(window, Fence::kAll); });
    s.Passes("one die: data, SetFlag/WaitFlag<MTE3_S>, flag" + where, [=] { OneDieFlag(window, Fence::kMte3S); });
    s.Passes("one die: data, SyncAll, flag" + where, [=] { OneDieFlag(window, Fence::kSyncAll); });
    s.Passes("one die: data, soft SyncAll, flag" + where, [=] { OneDieFlag(window, Fence::kSoftSyncAll); });
    s.Aborts("one die, DataCopyPad: data then flag with no fence" + where,
             [=] { OneDieFlag(window, Fence::kNone, true); }, {"cross-core race", "DataCopyPad(UB->GM)", kNoFence});
    s.Passes("one die: counter bumps after PIPE_ALL, the reader reads every bumper's data" + where,
             [=] { Counter(window, 2, true); });
    s.Aborts("one die: counter bumps with no fence after the data: the reader of a bumper's data aborts" + where,
             [=] { Counter(window, 2, false); }, {"cross-core race", "that AIV 1 of die", kNoFence});
    s.Passes("one die: a second launch reads the first's data (written with no fence)" + where, [=] {
      OneDie(window, 1, [](__gm__ uint8_t* base) {
        Ub ub;
        ub.Fill(kToken);
        Publish(ub, base, Fence::kNone, false);
      });
      OneDie(window, 2, [](__gm__ uint8_t* base) {
        Ub ub;
        if (GetBlockIdx() == 1) Consume(ub, base, false);
      });
    });
  }
  // Process memory keeps every writer of a granule: the reader of a counter observes all bumpers.
  s.Aborts("one die: 5 bumpers with no fence: the reader of the first one's data aborts",
           [] { Counter(false, 5, false); }, {"cross-core race", "that AIV 1 of die ?", kNoFence});
  s.Passes("one die: 5 bumpers after PIPE_ALL", [] { Counter(false, 5, true); });
  return s.Report();
}
