// Happens-before among one AIV's four pipes, as vector clocks (docs/ASCEND.md, "Pipes and
// synchronization on A2/A3").
//
// Every operation is issued to one pipe and numbered there (C[p], from 1). K[p][q] says that the
// pipe p's next operations start only after q's operations 1..K[p][q] completed. Ordering comes
// only from:
// - SetFlag<SRC_DST>(id): runs on SRC once SRC's earlier operations completed, so the flag carries
//   K[SRC] with SRC's own entry at C[SRC]; WaitFlag<SRC_DST>(id) merges it into K[DST].
// - PipeBarrier<p>: p's later operations start after its earlier ones (K[p][p] = C[p]). Operations
//   of one pipe run in order but may overlap (A2/A3: "the previous one has not necessarily
//   finished"), so V, MTE2 and MTE3 need it between dependent operations; S is in order.
// - PipeBarrier<PIPE_ALL> (and SyncAll): everything issued before completes first.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "report.h"
#include "types.h"

namespace AscendC {
namespace twin {

struct Clocks {
  uint32_t C[kPipes] = {};
  uint32_t K[kPipes][kPipes] = {};

  uint32_t Issue(int p) { return ++C[p]; }
  // Did operation `epoch` of pipe `pa` complete before pipe p's next operation starts?
  bool Ordered(int pa, uint32_t epoch, int p) const { return (pa == kS && p == kS) || epoch <= K[p][pa]; }
  void Snapshot(int src, uint32_t out[kPipes]) const {
    std::memcpy(out, K[src], sizeof K[src]);
    out[src] = C[src];
  }
  void Merge(int dst, const uint32_t snap[kPipes]) {
    for (int q = 0; q < kPipes; ++q) K[dst][q] = K[dst][q] > snap[q] ? K[dst][q] : snap[q];
  }
  void Barrier(int p) { K[p][p] = C[p]; }
  void BarrierAll() {
    for (int p = 0; p < kPipes; ++p) std::memcpy(K[p], C, sizeof C);
  }
  // --cce-auto-sync=on around a tensor accessor on S: S waits for V/MTE2/MTE3 before it and they
  // wait for S after it (docs/ASCEND.md, "Pipes and synchronization on A2/A3").
  void AutoSyncBefore() {
    for (int q = kV; q < kPipes; ++q) K[kS][q] = C[q];
  }
  void AutoSyncAfter() {
    for (int q = kV; q < kPipes; ++q) K[q][kS] = C[kS];
  }
};

// UBEP_TWIN_AUTO_SYNC=1 emulates --cce-auto-sync=on; default off, so every sync must be written.
inline bool AutoSync() {
  static const bool on = [] {
    const char* v = std::getenv("UBEP_TWIN_AUTO_SYNC");
    return v && v[0] == '1';
  }();
  return on;
}

// The hardware flags of one AIV: one per (HardEvent, id), ids 0-7 (A2/A3).
class Flags {
 public:
  void Set(HardEvent e, int32_t id, uint32_t site, const Clocks& c) {
    Flag& f = At(e, id, site, "SetFlag");
    if (f.pending) {
      Fail(Format("SetFlag<HardEvent::%s>(%d) (%s): the flag is already set (%s) and no WaitFlag took it; two "
                  "SetFlags on one (event, id) are undefined on the chip and a later PipeBarrier<PIPE_ALL> hangs",
                  Info(e).name, id, Sites::Describe(site).c_str(), Sites::Describe(f.site).c_str()));
    }
    f.pending = true;
    f.site = site;
    c.Snapshot(Info(e).src, f.snap);
  }
  void Wait(HardEvent e, int32_t id, uint32_t site, Clocks& c) {
    Flag& f = At(e, id, site, "WaitFlag");
    if (!f.pending) {
      Fail(Format("WaitFlag<HardEvent::%s>(%d) (%s): no SetFlag is pending on this (event, id); on the chip %s "
                  "would wait forever",
                  Info(e).name, id, Sites::Describe(site).c_str(), PipeName(Info(e).dst)));
    }
    f.pending = false;
    c.Merge(Info(e).dst, f.snap);
  }
  bool Pending(HardEvent e, int32_t id) const { return flags_[static_cast<int>(e)][id].pending; }
  // A flag still set when the kernel ends was never consumed: the code that meant to wait for it
  // does not, or the SetFlag is a leftover.
  void CheckIdle() const {
    for (int e = 0; e < kEvents; ++e) {
      for (int id = 0; id < QUE_MAX_EVENT; ++id) {
        if (!flags_[e][id].pending) continue;
        Fail(Format("the kernel ended with SetFlag<HardEvent::%s>(%d) (%s) never waited for",
                    Info(static_cast<HardEvent>(e)).name, id, Sites::Describe(flags_[e][id].site).c_str()));
      }
    }
  }

 private:
  static constexpr int kEvents = static_cast<int>(HardEvent::MAX);
  struct Flag {
    bool pending = false;
    uint32_t site = 0;
    uint32_t snap[kPipes] = {};
  };
  Flag& At(HardEvent e, int32_t id, uint32_t site, const char* api) {
    if (!IsAivEvent(e)) Fail(Format("%s (%s): not an AIV event", api, Sites::Describe(site).c_str()));
    if (id < 0 || id >= QUE_MAX_EVENT) {
      Fail(Format("%s<HardEvent::%s>(%d) (%s): event ids are 0-7 on A2/A3", api, Info(e).name, id,
                  Sites::Describe(site).c_str()));
    }
    return flags_[static_cast<int>(e)][id];
  }
  Flag flags_[kEvents][QUE_MAX_EVENT];
};

}  // namespace twin
}  // namespace AscendC
