// The per-AIV scalar data cache (docs/ASCEND.md, "The scalar data cache"): write-back, whole-line
// clean, no coherence, and the checks that turn its silent failures on the chip into reports.
#include <cstdlib>

#include "harness.h"

using namespace AscendC;
using strict_test::Gm;
using strict_test::Suite;

namespace {

template <typename T>
void Dcci(const GlobalTensor<T>& g) {
  DataCacheCleanAndInvalid<T, CacheLine::SINGLE_CACHE_LINE, DcciDst::CACHELINE_OUT>(g);
}

void WriteBack(Suite& s) {
  static Gm<int32_t, 64> gm;
  s.Aborts("a scalar GM write never cleaned", [] {
    twin::launch(1, [] {
      GlobalTensor<int32_t> g;
      g.SetGlobalBuffer(gm.ptr(), 64);
      g.SetValue(3, 5);
    });
  }, {"scalar GM writes never cleaned", "bytes [0x", "GlobalTensor::SetValue at"});
  s.Passes("SetValue reaches GM only at DataCacheCleanAndInvalid (SINGLE_CACHE_LINE)", [] {
    twin::launch(1, [] {
      GlobalTensor<int32_t> g;
      g.SetGlobalBuffer(gm.ptr(), 64);
      g.SetValue(3, 5);
      g(4) = 6;
      if (gm.v[3] != 0 || g.GetValue(3) != 5 || static_cast<int32_t>(g(4)) != 6) std::exit(3);
      Dcci(g);
      if (gm.v[3] != 5 || gm.v[4] != 6) std::exit(4);
    });
  });
  s.Passes("ENTIRE_DATA_CACHE cleans every line", [] {
    twin::launch(1, [] {
      GlobalTensor<int32_t> g;
      g.SetGlobalBuffer(gm.ptr(), 64);
      g.SetValue(0, 1);
      g.SetValue(40, 2);
      DataCacheCleanAndInvalid<int32_t, CacheLine::ENTIRE_DATA_CACHE, DcciDst::CACHELINE_OUT>(g);
      if (gm.v[0] != 1 || gm.v[40] != 2) std::exit(3);
    });
  });
  static Gm<int32_t, 16 * 600> big;
  s.Passes("LRU eviction writes back the least recently used line once 512 lines are cached", [] {
    twin::launch(1, [] {
      GlobalTensor<int32_t> g;
      g.SetGlobalBuffer(big.ptr(), 16 * 600);
      for (int line = 0; line < 512; ++line) g.SetValue(line * 16, line + 1);
      if (big.v[0] != 0) std::exit(3);
      g.SetValue(512 * 16, 513);  // evicts line 0, the oldest
      if (big.v[0] != 1 || big.v[16] != 0) std::exit(4);
      DataCacheCleanAndInvalid<int32_t, CacheLine::ENTIRE_DATA_CACHE, DcciDst::CACHELINE_OUT>(g);
      for (int line = 0; line <= 512; ++line) {
        if (big.v[line * 16] != line + 1) std::exit(5);
      }
    });
  });
}

void FalseSharing(Suite& s) {
  static Gm<int32_t, 64> gm;
  auto two_writers = [](int stride) {
    twin::launch(2, [&] {
      GlobalTensor<int32_t> g;
      g.SetGlobalBuffer(gm.ptr(), 64);
      g.SetValue(GetBlockIdx() * stride, 10 + GetBlockIdx());
      SyncAll();
      if (GetBlockIdx() == 0) Dcci(g);
      SyncAll();
      if (GetBlockIdx() == 1) Dcci(g[stride]);
    });
  };
  s.Aborts("two AIVs SetValue into one 64-byte line, then clean: false sharing", [&] { two_writers(2); },
           {"AIV 1 of 2", "false sharing", "bytes [0x", "changed in GM since this AIV filled the line",
            "this AIV's scalar writes in the line"});
  s.Passes("two AIVs SetValue 64 bytes apart, then clean: both land", [&] {
    two_writers(16);
    if (gm.v[0] != 10 || gm.v[16] != 11) std::exit(3);
  });
}

void Staleness(Suite& s) {
  static Gm<int32_t, 64> gm;
  // Scalar read of a line, then this AIV's own DMA into it, then (ordered) a scalar read again.
  auto own_dma = [](bool invalidate) {
    twin::launch(1, [&] {
      TPipe pipe;
      TBuf<TPosition::VECCALC> buf;
      pipe.InitBuffer(buf, 32);
      GlobalTensor<int32_t> g;
      g.SetGlobalBuffer(gm.ptr(), 64);
      LocalTensor<int32_t> t = buf.Get<int32_t>();
      if (g.GetValue(0) != 0) std::exit(3);
      Duplicate(t, 7, 8);
      SetFlag<HardEvent::V_MTE3>(0);
      WaitFlag<HardEvent::V_MTE3>(0);
      SetFlag<HardEvent::S_MTE3>(0);
      WaitFlag<HardEvent::S_MTE3>(0);
      DataCopy(g, t, 8);
      SetFlag<HardEvent::MTE3_S>(0);
      WaitFlag<HardEvent::MTE3_S>(0);
      if (invalidate) Dcci(g);
      if (g.GetValue(0) != 7) std::exit(4);
    });
  };
  s.Aborts("scalar read of a line this AIV's DMA wrote after the fill", [&] { own_dma(false); },
           {"stale scalar read", "GlobalTensor::GetValue", "DataCacheCleanAndInvalid"});
  s.Passes("the same read after DataCacheCleanAndInvalid sees the DMA's data", [&] { own_dma(true); });
  s.Aborts("a fill unordered with this AIV's DMA into the line marks the DMA's bytes stale", [] {
    twin::launch(1, [] {
      TPipe pipe;
      TBuf<TPosition::VECCALC> buf;
      pipe.InitBuffer(buf, 32);
      GlobalTensor<int32_t> g;
      g.SetGlobalBuffer(gm.ptr(), 64);
      LocalTensor<int32_t> t = buf.Get<int32_t>();
      Duplicate(t, 7, 8);
      SetFlag<HardEvent::V_MTE3>(0);
      WaitFlag<HardEvent::V_MTE3>(0);
      DataCopy(g, t, 8);      // bytes [0, 32)
      (void)g.GetValue(12);   // fills the line, maybe before the DMA lands
      SetFlag<HardEvent::MTE3_S>(0);
      WaitFlag<HardEvent::MTE3_S>(0);
      (void)g.GetValue(0);
    });
  }, {"stale scalar read"});
  s.Passes("another AIV's DMA is invisible to a cached line until DataCacheCleanAndInvalid", [] {
    gm.v[0] = 0;
    twin::launch(2, [] {
      TPipe pipe;
      TBuf<TPosition::VECCALC> buf;
      pipe.InitBuffer(buf, 32);
      GlobalTensor<int32_t> g;
      g.SetGlobalBuffer(gm.ptr(), 64);
      if (GetBlockIdx() == 0 && g.GetValue(0) != 0) std::exit(3);
      SyncAll();
      if (GetBlockIdx() == 1) {
        Duplicate(buf.Get<int32_t>(), 1, 8);
        SetFlag<HardEvent::V_MTE3>(0);
        WaitFlag<HardEvent::V_MTE3>(0);
        DataCopy(g, buf.Get<int32_t>(), 8);
      }
      SyncAll();
      if (GetBlockIdx() == 0) {
        if (g.GetValue(0) != 0) std::exit(4);  // stale, as on the chip
        Dcci(g);
        if (g.GetValue(0) != 1) std::exit(5);
      }
    });
  });
}

void DmaOverDirty(Suite& s) {
  static Gm<int32_t, 64> gm;
  auto kernel = [](bool read) {
    twin::launch(1, [&] {
      TPipe pipe;
      TBuf<TPosition::VECCALC> buf;
      pipe.InitBuffer(buf, 32);
      GlobalTensor<int32_t> g;
      g.SetGlobalBuffer(gm.ptr(), 64);
      g.SetValue(0, 3);
      SetFlag<HardEvent::S_MTE2>(0);
      WaitFlag<HardEvent::S_MTE2>(0);
      SetFlag<HardEvent::S_MTE3>(0);
      WaitFlag<HardEvent::S_MTE3>(0);
      if (read) DataCopy(buf.Get<int32_t>(), g, 8);
      else DataCopy(g, buf.Get<int32_t>(), 8);
    });
  };
  s.Aborts("a DMA reads GM bytes still dirty in this AIV's DCache", [&] { kernel(true); },
           {"DataCopy(GM->UB)", "reads GM", "still hold dirty", "reads the old bytes"});
  s.Aborts("a DMA writes GM bytes still dirty in this AIV's DCache", [&] { kernel(false); },
           {"DataCopy(UB->GM)", "writes GM", "still hold dirty", "write-back would undo it"});
}

}  // namespace

int main() {
  Suite s("ascend strict twin: dcache");
  WriteBack(s);
  FalseSharing(s);
  Staleness(s);
  DmaOverDirty(s);
  return s.Report();
}
