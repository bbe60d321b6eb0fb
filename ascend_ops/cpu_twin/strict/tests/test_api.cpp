// The API's types, data rules and kernel-level rules on A2/A3 (docs/ASCEND.md, "The Ascend C API
// the kernels use"): GetPhyAddr as a UB offset, DataCopy/DataCopyPad alignment and layout, Cast
// rounding, vector operand rules, the kernel type and SyncAll, the tiling macro and the launch
// queries.
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <thread>
#include <type_traits>

#include "harness.h"

using namespace AscendC;
using strict_test::Gm;
using strict_test::Suite;

namespace {

static_assert(std::is_same_v<decltype(std::declval<LocalTensor<int32_t>>().GetPhyAddr()), uint64_t>);
static_assert(std::is_same_v<decltype(std::declval<GlobalTensor<int32_t>>().GetPhyAddr()), const __gm__ int32_t*>);
static_assert(std::is_same_v<decltype(GetBlockIdx()), int64_t> && std::is_same_v<decltype(GetSystemCycle()), int64_t>);
static_assert(std::is_same_v<std::underlying_type_t<KernelMetaType>, uint8_t> && KERNEL_TYPE_MIX_AIV_1_0 == 2);
static_assert(static_cast<int>(HardEvent::MTE2_S) == 24 && static_cast<int>(HardEvent::MAX) == 35);

// One AIV with a TBuf of `bytes`; body(buffer, pipe).
template <class F>
void Kernel(uint32_t bytes, F body) {
  twin::launch(1, [&] {
    TPipe pipe;
    TBuf<TPosition::VECCALC> buf;
    pipe.InitBuffer(buf, bytes);
    body(buf);
  });
}

void VS() {
  SetFlag<HardEvent::V_S>(0);
  WaitFlag<HardEvent::V_S>(0);
}

// Cast float -> float with `m` on `in`, returned through a V_S sync.
std::vector<float> CastFloat(const std::vector<float>& in, RoundMode m) {
  std::vector<float> out(in.size());
  Kernel(256, [&](TBuf<TPosition::VECCALC>& buf) {
    LocalTensor<float> src = buf.Get<float>(32), dst = buf.GetWithOffset<float>(32, 128);
    for (size_t i = 0; i < in.size(); ++i) src.SetValue(i, in[i]);
    SetFlag<HardEvent::S_V>(0);
    WaitFlag<HardEvent::S_V>(0);
    Cast(dst, src, m, 8);
    VS();
    for (size_t i = 0; i < in.size(); ++i) out[i] = dst.GetValue(i);
  });
  return out;
}

void Casts(Suite& s) {
  s.Passes("Cast<float, float> rounds to integral values: RINT, FLOOR, CEIL, ROUND, TRUNC", [] {
    const std::vector<float> in = {0.5f, 1.5f, 2.5f, -0.5f, 3.7f, -1.5f, 1.2f, -2.5f};
    const std::vector<float> rint = {0, 2, 2, -0.0f, 4, -2, 1, -2}, floor = {0, 1, 2, -1, 3, -2, 1, -3},
                             ceil = {1, 2, 3, -0.0f, 4, -1, 2, -2}, round = {1, 2, 3, -1, 4, -2, 1, -3},
                             trunc = {0, 1, 2, -0.0f, 3, -1, 1, -2};
    if (CastFloat(in, RoundMode::CAST_RINT) != rint || CastFloat(in, RoundMode::CAST_FLOOR) != floor ||
        CastFloat(in, RoundMode::CAST_CEIL) != ceil || CastFloat(in, RoundMode::CAST_ROUND) != round ||
        CastFloat(in, RoundMode::CAST_TRUNC) != trunc || !std::signbit(CastFloat(in, RoundMode::CAST_RINT)[3])) {
      std::exit(3);
    }
  });
  s.Aborts("Cast<float, float> with CAST_NONE is not supported", [] { CastFloat({1.0f}, RoundMode::CAST_NONE); },
           {"Cast<float, float> with CAST_NONE", "not supported on A2/A3"});
  s.Passes("Cast float -> bf16 (RINT), -> half (saturating), -> int32; half -> float (NONE)", [] {
    Kernel(512, [](TBuf<TPosition::VECCALC>& buf) {
      LocalTensor<float> f = buf.Get<float>(32);
      const uint32_t bits[] = {0x3F800000u, 0x3F808000u, 0x3F818000u, 0x3F818001u, 0x7FC00001u, 0x47AAE000u,
                               0x40200000u, 0xC0200000u};  // 1, 1+2^-8, ..., NaN, 87488, 2.5, -2.5
      for (int i = 0; i < 8; ++i) {
        float v;
        std::memcpy(&v, &bits[i], 4);
        f.SetValue(i, v);
      }
      SetFlag<HardEvent::S_V>(0);
      WaitFlag<HardEvent::S_V>(0);
      LocalTensor<bfloat16_t> b = buf.GetWithOffset<bfloat16_t>(16, 128);
      LocalTensor<half> h = buf.GetWithOffset<half>(16, 160);
      LocalTensor<int32_t> n = buf.GetWithOffset<int32_t>(8, 192);
      LocalTensor<float> back = buf.GetWithOffset<float>(16, 256);
      Cast(b, f, RoundMode::CAST_RINT, 8);
      Cast(h, f, RoundMode::CAST_RINT, 8);
      Cast(n, f, RoundMode::CAST_RINT, 8);
      PipeBarrier<PIPE_V>();
      Cast(back, h, RoundMode::CAST_NONE, 8);
      VS();
      const uint16_t want[] = {0x3F80, 0x3F80, 0x3F82, 0x3F82, 0x7FC0};
      for (int i = 0; i < 5; ++i) {
        if (b.GetValue(i).bits != want[i]) std::exit(3);
      }
      if (static_cast<float>(h.GetValue(5)) != 65504.0f || n.GetValue(6) != 2 || n.GetValue(7) != -2 ||
          back.GetValue(6) != 2.5f) {
        std::exit(4);
      }
    });
  });
  s.Aborts("Cast half -> float takes CAST_NONE only", [] {
    Kernel(256, [](TBuf<TPosition::VECCALC>& buf) {
      Cast(buf.Get<float>(16), buf.GetWithOffset<half>(16, 128), RoundMode::CAST_RINT, 16);
    });
  }, {"round mode 1 is not supported for this pair"});
  s.Aborts("Cast between partly overlapping operands", [] {
    Kernel(256, [](TBuf<TPosition::VECCALC>& buf) {
      Cast(buf.Get<float>(16), buf.Get<half>(16), RoundMode::CAST_NONE, 16);
    });
  }, {"partly overlaps"});
}

void Copies(Suite& s) {
  static Gm<int32_t, 64> gm;
  for (int i = 0; i < 64; ++i) gm.v[i] = i;
  s.Aborts("DataCopy of 7 int32 (28 bytes, not a multiple of 32)", [] {
    Kernel(64, [](TBuf<TPosition::VECCALC>& buf) {
      GlobalTensor<int32_t> g;
      g.SetGlobalBuffer(gm.ptr(), 64);
      DataCopy(buf.Get<int32_t>(), g, 7);
    });
  }, {"not a multiple of 32 bytes", "use DataCopyPad"});
  s.Aborts("DataCopy into a UB address that is not 32-byte aligned", [] {
    Kernel(64, [](TBuf<TPosition::VECCALC>& buf) {
      GlobalTensor<int32_t> g;
      g.SetGlobalBuffer(gm.ptr(), 64);
      DataCopy(buf.Get<int32_t>()[1], g, 8);
    });
  }, {"not 32-byte aligned"});
  s.Aborts("DataCopy from a GM address not aligned to sizeof(T)", [] {
    Kernel(64, [](TBuf<TPosition::VECCALC>& buf) {
      GlobalTensor<int32_t> g;
      g.SetGlobalBuffer((__gm__ int32_t*)(gm.bytes() + 2), 8);
      DataCopy(buf.Get<int32_t>(), g, 8);
    });
  }, {"not aligned to the element size 4"});
  s.Aborts("DataCopy past the end of its LocalTensor", [] {
    Kernel(64, [](TBuf<TPosition::VECCALC>& buf) {
      GlobalTensor<int32_t> g;
      g.SetGlobalBuffer(gm.ptr(), 64);
      DataCopy(buf.Get<int32_t>(8), g, 16);
    });
  }, {"past the end of its LocalTensor"});
  s.Passes("DataCopyPad GM -> UB: padding, dummy and strides; UB -> GM: only blockLen bytes", [] {
    static Gm<int32_t, 32> out;
    for (int i = 0; i < 32; ++i) out.v[i] = -7;
    Kernel(256, [](TBuf<TPosition::VECCALC>& buf) {
      GlobalTensor<int32_t> g, o;
      g.SetGlobalBuffer((__gm__ int32_t*)(gm.bytes() + 4), 60);  // GM needs no alignment
      o.SetGlobalBuffer(out.ptr(), 32);
      LocalTensor<int32_t> a = buf.Get<int32_t>(8), b = buf.GetWithOffset<int32_t>(48, 64);
      DataCopyPad(a, g, DataCopyExtParams{1, 20, 0, 0, 0}, DataCopyPadExtParams<int32_t>{});
      DataCopyPad(b, g, DataCopyExtParams{2, 20, 4, 1, 0}, DataCopyPadExtParams<int32_t>{true, 1, 2, -1});
      SetFlag<HardEvent::MTE2_S>(0);
      WaitFlag<HardEvent::MTE2_S>(0);
      const int32_t want_a[] = {1, 2, 3, 4, 5, 1, 1, 1};  // dummy: the block's first element
      const int32_t want_b[] = {-1, 1, 2, 3, 4, 5, -1, -1};
      for (int i = 0; i < 8; ++i) {
        const int32_t want_b1 = i == 0 || i > 5 ? -1 : i + 6;  // block 2: GM bytes 28.., 64 B on in UB
        if (a.GetValue(i) != want_a[i] || b.GetValue(i) != want_b[i] || b.GetValue(16 + i) != want_b1) {
          std::exit(3);
        }
      }
      SetFlag<HardEvent::S_MTE3>(0);
      WaitFlag<HardEvent::S_MTE3>(0);
      DataCopyPad(o[1], b, DataCopyExtParams{2, 12, 1, 8, 0});  // UB blocks 64 B apart, GM 8 B gaps
    });
    const int32_t want[] = {-7, -1, 1, 2, -7, -7, -1, 7, 8, -7};
    for (int i = 0; i < 10; ++i) {
      if (out.v[i] != want[i]) std::exit(4);
    }
  });
}

void Tensors(Suite& s) {
  s.Dies("a UB offset from GetPhyAddr used as a pointer crashes", SIGSEGV, [] {
    Kernel(128, [](TBuf<TPosition::VECCALC>& buf) {
      LocalTensor<int32_t> t = buf.GetWithOffset<int32_t>(8, 64);
      if (t.GetPhyAddr() != 64 || t.GetPhyAddr(2) != 72) std::exit(3);
      uint64_t offset = t.GetPhyAddr();
      asm volatile("" : "+r"(offset));  // as opaque as a kernel's address arithmetic
      *(volatile __ubuf__ int32_t*)offset = 1;
    });
  });
  s.Aborts("LocalTensor index past its size", [] {
    Kernel(32, [](TBuf<TPosition::VECCALC>& buf) { (void)buf.Get<int32_t>()[4].GetValue(4); });
  }, {"index 4 of a LocalTensor of 4 elements"});
  s.Aborts("an unallocated LocalTensor", [] {
    Kernel(32, [](TBuf<TPosition::VECCALC>&) { Duplicate(LocalTensor<int32_t>(), 0, 8); });
  }, {"never allocated"});
  s.Aborts("a misaligned scalar GM access", [] {
    static Gm<int32_t, 16> gm;
    Kernel(32, [](TBuf<TPosition::VECCALC>&) {
      GlobalTensor<int32_t> g;
      g.SetGlobalBuffer((__gm__ int32_t*)(gm.bytes() + 2));
      (void)g.GetValue(0);
    });
  }, {"is not aligned to its size"});
  s.Aborts("vector count past the operand", [] {
    Kernel(32, [](TBuf<TPosition::VECCALC>& buf) { Duplicate(buf.Get<int32_t>(), 0, 16); });
  }, {"count 16 for an operand of 8 elements"});
  s.Aborts("SetAtomicAdd<float> then a DataCopy of int32", [] {
    static Gm<int32_t, 16> gm;
    Kernel(32, [](TBuf<TPosition::VECCALC>& buf) {
      GlobalTensor<int32_t> g;
      g.SetGlobalBuffer(gm.ptr(), 16);
      SetAtomicAdd<float>();
      DataCopy(g, buf.Get<int32_t>(), 8);
    });
  }, {"SetAtomicAdd<float> is on but the copy moves int32_t"});
}

void SV() {
  SetFlag<HardEvent::S_V>(0);
  WaitFlag<HardEvent::S_V>(0);
}

// The count-scan operations (vector_index.h and vector.h) on small tensors.
void Vectors(Suite& s) {
  s.Passes("CreateVecIndex, Muls, Gather, Cast, Adds, Abs, Mins, Sub, Mul and ReduceSum compute what Ascend C says", [] {
    Kernel(1024, [](TBuf<TPosition::VECCALC>& buf) {
      LocalTensor<int32_t> src = buf.Get<int32_t>(16), idx = buf.GetWithOffset<int32_t>(8, 64),
                           col = buf.GetWithOffset<int32_t>(8, 96);
      LocalTensor<float> f = buf.GetWithOffset<float>(8, 128), g = buf.GetWithOffset<float>(8, 160),
                         sum = buf.GetWithOffset<float>(8, 192), tmp = buf.GetWithOffset<float>(8, 224);
      for (int i = 0; i < 16; ++i) src.SetValue(i, i % 2 ? 100 + i : -i);  // [t][2]: column 1 is 101, 103, ...
      SV();
      CreateVecIndex(idx, 0, 8);
      PipeBarrier<PIPE_V>();
      Muls(idx, idx, 8, 8);  // byte offsets of element 2t
      PipeBarrier<PIPE_V>();
      Gather(col, src, idx.ReinterpretCast<uint32_t>(), 4, 8);  // element 2t + 1
      PipeBarrier<PIPE_V>();
      Cast(f, col, RoundMode::CAST_NONE, 8);
      PipeBarrier<PIPE_V>();
      Adds(g, f, -105.0f, 8);  // -4, -2, 0, 2, ...
      PipeBarrier<PIPE_V>();
      Abs(g, g, 8);
      PipeBarrier<PIPE_V>();
      Mins(g, g, 1.0f, 8);  // 1, 1, 0, 1, ...
      PipeBarrier<PIPE_V>();
      Sub(tmp, f, g, 8);
      PipeBarrier<PIPE_V>();
      Mul(tmp, tmp, g, 8);
      PipeBarrier<PIPE_V>();
      ReduceSum(sum, g, tmp, 8);
      VS();
      if (sum.GetValue(0) != 7.0f || g.GetValue(2) != 0.0f || tmp.GetValue(0) != 100.0f || tmp.GetValue(2) != 0.0f ||
          col.GetValue(7) != 115) {
        std::exit(3);
      }
    });
  });
  s.Aborts("ReduceSum of a value whose sum would depend on the order", [] {
    Kernel(256, [](TBuf<TPosition::VECCALC>& buf) {
      LocalTensor<float> a = buf.Get<float>(8), b = buf.GetWithOffset<float>(8, 32);
      Duplicate(a, 0.5f, 8);
      PipeBarrier<PIPE_V>();
      ReduceSum(b, a, b, 8);
    });
  }, {"sums integer values only"});
  s.Aborts("Gather with an offset that is not an element of src", [] {
    Kernel(256, [](TBuf<TPosition::VECCALC>& buf) {
      LocalTensor<int32_t> a = buf.Get<int32_t>(8), o = buf.GetWithOffset<int32_t>(8, 32), d = buf.GetWithOffset<int32_t>(8, 64);
      Duplicate(o, 2, 8);
      PipeBarrier<PIPE_V>();
      Gather(d, a, o.ReinterpretCast<uint32_t>(), 0, 8);
    });
  }, {"is not a 4-byte-aligned element of src"});
  s.Aborts("Gather into its own source", [] {
    Kernel(256, [](TBuf<TPosition::VECCALC>& buf) {
      LocalTensor<int32_t> a = buf.Get<int32_t>(16), o = buf.GetWithOffset<int32_t>(8, 32);
      Duplicate(o, 0, 8);
      PipeBarrier<PIPE_V>();
      Gather(a, a, o.ReinterpretCast<uint32_t>(), 0, 8);
    });
  }, {"dst and src share UB"});
  s.Passes("DataCopy UB -> UB with DataCopyParams: blocks, gaps on both sides", [] {
    Kernel(512, [](TBuf<TPosition::VECCALC>& buf) {
      LocalTensor<int32_t> a = buf.Get<int32_t>(32), b = buf.GetWithOffset<int32_t>(64, 128);
      for (int i = 0; i < 32; ++i) a.SetValue(i, i);
      Duplicate(b, -1, 64);
      SV();
      PipeBarrier<PIPE_V>();
      DataCopy(b, a, DataCopyParams(2, 1, 1, 2));  // a's blocks 0 and 2 to b's blocks 0 and 3
      VS();
      if (b.GetValue(0) != 0 || b.GetValue(7) != 7 || b.GetValue(8) != -1 || b.GetValue(24) != 16 ||
          b.GetValue(31) != 23 || b.GetValue(32) != -1) {
        std::exit(3);
      }
    });
  });
  s.Aborts("DataCopy UB -> UB between overlapping ranges", [] {
    Kernel(256, [](TBuf<TPosition::VECCALC>& buf) {
      LocalTensor<int32_t> a = buf.Get<int32_t>(32);
      DataCopy(a[8], a, DataCopyParams(2, 1, 1, 1));
    });
  }, {"ranges overlap"});
}

void KernelLevel(Suite& s) {
  auto sync_all = [](int type) {
    twin::launch(2, [&] {
      if (type == 0) KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_AIV_ONLY);
      if (type == 1) KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIV_1_0);
      SyncAll();
    });
  };
  s.Aborts("KERNEL_TYPE_AIV_ONLY + hard SyncAll", [&] { sync_all(0); },
           {"hangs on the chip", "KERNEL_TYPE_AIV_ONLY", "no inter-core scheduling"});
  s.Passes("KERNEL_TYPE_MIX_AIV_1_0 + hard SyncAll", [&] { sync_all(1); });
  s.Passes("no kernel type (compiler inference) + hard SyncAll", [&] { sync_all(2); });
  s.Aborts("an AIV that ends without the SyncAll the others wait in", [] {
    twin::launch(3, [] {
      if (GetBlockIdx() != 2) SyncAll();
    });
  }, {"hangs on the chip", "1 AIV(s) ended the kernel without reaching it"});
  s.Passes("GET_TILING_DATA_WITH_STRUCT copies the tiling (through UB address 0)", [] {
    struct Tiling {
      int64_t a;
      int32_t b[3];
    };
    static Tiling t{42, {1, 2, 3}};
    twin::launch(1, [] {
      REGISTER_TILING_DEFAULT(Tiling);
      GET_TILING_DATA_WITH_STRUCT(Tiling, tiling, (GM_ADDR)&t);
      if (tiling.a != 42 || tiling.b[2] != 3) std::exit(3);
    });
  });
  s.Passes("GetBlockIdx/GetBlockNum, GetHcclContext<2> is nullptr, GetSystemCycle counts at 50 MHz", [] {
    twin::launch(3, [] {
      if (GetBlockNum() != 3 || GetBlockIdx() < 0 || GetBlockIdx() > 2) std::exit(3);
      if (GetHcclContext<2>() != nullptr) std::exit(4);
      const int64_t t0 = GetSystemCycle();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      const int64_t us = (GetSystemCycle() - t0) / 50;
      if (us < 19000 || us > 200000) std::exit(5);
    });
  });
}

}  // namespace

int main() {
  Suite s("ascend strict twin: api");
  Casts(s);
  Copies(s);
  Tensors(s);
  Vectors(s);
  KernelLevel(s);
  return s.Report();
}
