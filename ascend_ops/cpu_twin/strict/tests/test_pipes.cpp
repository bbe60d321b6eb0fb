// The race checker: each ordering rule of one AIV's pipes fires without its sync and passes with it
// (docs/ASCEND.md, "Pipes and synchronization on A2/A3"): flags, PipeBarrier, TQue events,
// auto-sync, atomics, soft SyncAll.
#include <cstdlib>

#include "harness.h"

using namespace AscendC;
using strict_test::Gm;
using strict_test::Suite;

namespace {

// One AIV with a 1 KiB TBuf of int32 and a GM tensor of 256 int32 on `gm`.
template <class F>
void OneAiv(Gm<int32_t, 256>& gm, F body) {
  twin::launch(1, [&] {
    TPipe pipe;
    TBuf<TPosition::VECCALC> buf;
    pipe.InitBuffer(buf, 1024);
    GlobalTensor<int32_t> g;
    g.SetGlobalBuffer(gm.ptr(), 256);
    body(buf.Get<int32_t>(), g);
  });
}

void McpyThenScalar(Suite& s) {
  static Gm<int32_t, 256> gm;
  gm.v[0] = 41;
  s.Aborts("MTE2 copy then LocalTensor::GetValue without MTE2_S", [] {
    OneAiv(gm, [](LocalTensor<int32_t> t, GlobalTensor<int32_t> g) {
      DataCopy(t, g, 8);
      (void)t.GetValue(0);
    });
  }, {"data race on UB bytes [0x0, 0x4)", "DataCopy(GM->UB)", "LocalTensor::GetValue", "PIPE_MTE2", "PIPE_S",
      "SetFlag/WaitFlag<HardEvent::MTE2_S>", "die ?, AIV 0 of 1", "test_pipes.cpp:"});
  s.Passes("MTE2 copy, SetFlag/WaitFlag<MTE2_S>, GetValue", [] {
    OneAiv(gm, [](LocalTensor<int32_t> t, GlobalTensor<int32_t> g) {
      DataCopy(t, g, 8);
      SetFlag<HardEvent::MTE2_S>(0);
      WaitFlag<HardEvent::MTE2_S>(0);
      if (t.GetValue(0) != 41) std::exit(3);
    });
  });
  s.Passes("MTE2 copy, PipeBarrier<PIPE_ALL>, GetValue", [] {
    OneAiv(gm, [](LocalTensor<int32_t> t, GlobalTensor<int32_t> g) {
      DataCopy(t, g, 8);
      PipeBarrier<PIPE_ALL>();
      (void)t.GetValue(0);
    });
  });
  s.Aborts("the report names the die when the launcher sets it", [] {
    twin::die_rank = 3;
    OneAiv(gm, [](LocalTensor<int32_t> t, GlobalTensor<int32_t> g) {
      DataCopy(t, g, 8);
      (void)t.GetValue(0);
    });
  }, {"die 3, AIV 0 of 1"});
}

void VectorChain(Suite& s) {
  auto chain = [](bool barrier) {
    twin::launch(1, [&] {
      TPipe pipe;
      TBuf<TPosition::VECCALC> h, f, m;
      pipe.InitBuffer(h, 64);
      pipe.InitBuffer(f, 128);
      pipe.InitBuffer(m, 128);
      Duplicate(h.Get<half>(), half(1.5), 32);
      PipeBarrier<PIPE_V>();
      Cast(f.Get<float>(), h.Get<half>(), RoundMode::CAST_NONE, 32);
      if (barrier) PipeBarrier<PIPE_V>();
      Muls(m.Get<float>(), f.Get<float>(), 2.0f, 32);
      PipeBarrier<PIPE_V>();
    });
  };
  s.Aborts("Cast -> Muls without PipeBarrier<PIPE_V>", [&] { chain(false); },
           {"data race", "Cast at", "Muls at", "put PipeBarrier<PIPE_V>() between them"});
  s.Passes("Cast, PipeBarrier<PIPE_V>, Muls", [&] { chain(true); });
  s.Passes("Cast -> Muls with UBEP_TWIN_AUTO_SYNC=1 (V->V inserted)", [&] {
    setenv("UBEP_TWIN_AUTO_SYNC", "1", 1);
    chain(false);
  });
}

void VectorAndMte3(Suite& s) {
  static Gm<int32_t, 256> gm;
  s.Aborts("Duplicate then DataCopy UB->GM without V_MTE3", [] {
    OneAiv(gm, [](LocalTensor<int32_t> t, GlobalTensor<int32_t> g) {
      Duplicate(t, 7, 8);
      DataCopy(g, t, 8);
    });
  }, {"data race on UB", "Duplicate at", "DataCopy(UB->GM)", "HardEvent::V_MTE3"});
  s.Aborts("V_MTE3 is not inserted by auto-sync", [] {
    setenv("UBEP_TWIN_AUTO_SYNC", "1", 1);
    OneAiv(gm, [](LocalTensor<int32_t> t, GlobalTensor<int32_t> g) {
      Duplicate(t, 7, 8);
      DataCopy(g, t, 8);
    });
  }, {"HardEvent::V_MTE3"});
  s.Passes("Duplicate, V_MTE3, DataCopy UB->GM", [] {
    OneAiv(gm, [](LocalTensor<int32_t> t, GlobalTensor<int32_t> g) {
      Duplicate(t, 7, 8);
      SetFlag<HardEvent::V_MTE3>(0);
      WaitFlag<HardEvent::V_MTE3>(0);
      DataCopy(g, t, 8);
    });
    if (gm.v[7] != 7) std::exit(3);
  });
  auto rewrite = [](bool sync) {
    OneAiv(gm, [&](LocalTensor<int32_t> t, GlobalTensor<int32_t> g) {
      Duplicate(t, 7, 8);
      SetFlag<HardEvent::V_MTE3>(0);
      WaitFlag<HardEvent::V_MTE3>(0);
      DataCopy(g, t, 8);
      if (sync) {
        SetFlag<HardEvent::MTE3_V>(0);
        WaitFlag<HardEvent::MTE3_V>(0);
      }
      Duplicate(t, 9, 8);
    });
  };
  s.Aborts("DataCopy UB->GM then Duplicate into its source without MTE3_V", [&] { rewrite(false); },
           {"DataCopy(UB->GM)", "reads them on PIPE_MTE3", "Duplicate at", "writes them on PIPE_V",
            "HardEvent::MTE3_V"});
  s.Passes("DataCopy UB->GM, MTE3_V, Duplicate", [&] { rewrite(true); });
  auto two_out = [](bool barrier, int second_at) {
    OneAiv(gm, [&](LocalTensor<int32_t> t, GlobalTensor<int32_t> g) {
      Duplicate(t, 1, 16);
      SetFlag<HardEvent::V_MTE3>(0);
      WaitFlag<HardEvent::V_MTE3>(0);
      DataCopy(g, t, 8);
      if (barrier) PipeBarrier<PIPE_MTE3>();
      DataCopy(g[second_at], t[8], 8);
    });
  };
  s.Aborts("two MTE3 copies to overlapping GM without PipeBarrier<PIPE_MTE3>", [&] { two_out(false, 4); },
           {"data race on GM bytes", "writes them on PIPE_MTE3", "put PipeBarrier<PIPE_MTE3>() between them"});
  s.Passes("two MTE3 copies to overlapping GM with PipeBarrier<PIPE_MTE3>", [&] { two_out(true, 4); });
  s.Passes("two MTE3 copies to disjoint GM need no barrier", [&] { two_out(false, 8); });
}

void Mte2Mte2AndMte3Mte2(Suite& s) {
  static Gm<int32_t, 256> gm;
  s.Aborts("two MTE2 copies into overlapping UB without PipeBarrier<PIPE_MTE2>", [] {
    OneAiv(gm, [](LocalTensor<int32_t> t, GlobalTensor<int32_t> g) {
      DataCopy(t, g, 16);
      DataCopy(t[8], g[64], 8);
    });
  }, {"data race on UB bytes [0x20, 0x40)", "PipeBarrier<PIPE_MTE2>"});
  auto out_then_in = [](bool sync) {
    OneAiv(gm, [&](LocalTensor<int32_t> t, GlobalTensor<int32_t> g) {
      Duplicate(t, 5, 8);
      SetFlag<HardEvent::V_MTE3>(0);
      WaitFlag<HardEvent::V_MTE3>(0);
      DataCopy(g, t, 8);
      if (sync) {
        SetFlag<HardEvent::MTE3_MTE2>(0);
        WaitFlag<HardEvent::MTE3_MTE2>(0);
      }
      DataCopy(t[8], g, 8);
    });
  };
  s.Aborts("MTE3 writes GM, MTE2 reads it back without MTE3_MTE2", [&] { out_then_in(false); },
           {"data race on GM bytes", "HardEvent::MTE3_MTE2"});
  s.Passes("MTE3 writes GM, MTE3_MTE2, MTE2 reads it back", [&] { out_then_in(true); });
  auto scalar_then_out = [](bool sync) {
    OneAiv(gm, [&](LocalTensor<int32_t> t, GlobalTensor<int32_t> g) {
      t.SetValue(0, 1);
      if (sync) {
        SetFlag<HardEvent::S_MTE3>(0);
        WaitFlag<HardEvent::S_MTE3>(0);
      }
      DataCopy(g, t, 8);
    });
  };
  s.Aborts("LocalTensor::SetValue then DataCopy UB->GM without S_MTE3", [&] { scalar_then_out(false); },
           {"LocalTensor::SetValue", "HardEvent::S_MTE3"});
  s.Passes("SetValue, S_MTE3, DataCopy UB->GM", [&] { scalar_then_out(true); });
  s.Passes("SetValue then DataCopy with UBEP_TWIN_AUTO_SYNC=1 (S->MTE3 inserted)", [&] {
    setenv("UBEP_TWIN_AUTO_SYNC", "1", 1);
    scalar_then_out(false);
  });
}

void Atomics(Suite& s) {
  static Gm<int32_t, 256> gi;
  static Gm<float, 64> gf;
  s.Passes("two unordered atomic int32 adds to one GM word", [] {
    OneAiv(gi, [](LocalTensor<int32_t> t, GlobalTensor<int32_t> g) {
      Duplicate(t, 3, 8);
      SetFlag<HardEvent::V_MTE3>(0);
      WaitFlag<HardEvent::V_MTE3>(0);
      SetAtomicAdd<int32_t>();
      DataCopy(g, t, 8);
      DataCopy(g, t, 8);
      SetAtomicNone();
    });
    if (gi.v[0] != 6) std::exit(3);
  });
  s.Aborts("two unordered atomic float adds to one GM word (the sum's rounding depends on the order)", [] {
    twin::launch(1, [] {
      TPipe pipe;
      TBuf<TPosition::VECCALC> buf;
      pipe.InitBuffer(buf, 32);
      GlobalTensor<float> g;
      g.SetGlobalBuffer(gf.ptr(), 64);
      Duplicate(buf.Get<float>(), 0.1f, 8);
      SetFlag<HardEvent::V_MTE3>(0);
      WaitFlag<HardEvent::V_MTE3>(0);
      SetAtomicAdd<float>();
      DataCopy(g, buf.Get<float>(), 8);
      DataCopy(g, buf.Get<float>(), 8);
    });
  }, {"data race on GM", "PipeBarrier<PIPE_MTE3>"});
}

void Flags(Suite& s) {
  auto kernel = [](auto body) { twin::launch(1, [&] { body(); }); };
  s.Aborts("SetFlag twice on one (event, id)", [&] {
    kernel([] {
      SetFlag<HardEvent::MTE2_S>(0);
      SetFlag<HardEvent::MTE2_S>(0);
    });
  }, {"SetFlag<HardEvent::MTE2_S>(0)", "already set"});
  s.Aborts("WaitFlag with no SetFlag", [&] { kernel([] { WaitFlag<HardEvent::V_MTE3>(1); }); },
           {"WaitFlag<HardEvent::V_MTE3>(1)", "no SetFlag is pending", "would wait forever"});
  s.Aborts("SetFlag still pending at the end of the kernel", [&] { kernel([] { SetFlag<HardEvent::S_V>(2); }); },
           {"ended with SetFlag<HardEvent::S_V>(2)", "never waited"});
  s.Aborts("event id 8", [&] { kernel([] { SetFlag<HardEvent::S_V>(8); }); }, {"event ids are 0-7"});
  const strict_test::Outcome o = strict_test::RunChild([&] {
    kernel([] {
      SetFlag<HardEvent::S_V>(7);
      WaitFlag<HardEvent::S_V>(7);
    });
  });
  s.Check("event id 7 works but warns that 6-7 are reserved", o.ok() && o.err.find("reserved") != std::string::npos);
  s.Passes("TQueSync<PIPE_MTE2, PIPE_S> is SetFlag/WaitFlag<MTE2_S>", [&] {
    kernel([] {
      TQueSync<PIPE_MTE2, PIPE_S> sync;
      sync.SetFlag(0);
      sync.WaitFlag(0);
    });
  });
}

void SoftSyncAll(Suite& s) {
  static Gm<int32_t, 64> ws;
  auto run = [](int calls) {
    twin::launch(4, [&] {
      TPipe pipe;
      TBuf<TPosition::VECCALC> ub;
      pipe.InitBuffer(ub, 4 * 32);
      GlobalTensor<int32_t> g;
      g.SetGlobalBuffer(ws.ptr(), 32);
      for (int i = 0; i < calls; ++i) SyncAll(g, ub.Get<int32_t>());
    });
  };
  s.Passes("soft SyncAll twice on a zeroed workspace (4 AIVs)", [&] {
    run(2);
    for (int b = 0; b < 4; ++b) {
      if (ws.v[b * 8] != 2) std::exit(3);
    }
  });
  s.Aborts("soft SyncAll on a workspace that is not zeroed", [&] {
    ws.v[0] = 5;
    run(1);
  }, {"must be zeroed"});
}

}  // namespace

int main() {
  Suite s("ascend strict twin: pipes");
  McpyThenScalar(s);
  VectorChain(s);
  VectorAndMte3(s);
  Mte2Mte2AndMte3Mte2(s);
  Atomics(s);
  Flags(s);
  SoftSyncAll(s);
  return s.Report();
}
