// TQue / TQueBind / TBuf: a queue's events order exactly its own pair of pipes (docs/ASCEND.md,
// "Pipes and synchronization on A2/A3"), and the TPipe's buffer and event bookkeeping fails where
// the chip would hang or misbehave.
#include <cstdlib>

#include "harness.h"

using namespace AscendC;
using strict_test::Gm;
using strict_test::Suite;

namespace {

Gm<int32_t, 256> in_gm, out_gm;

// in -> VECIN queue -> Muls by 2 -> VECOUT queue -> out, `rounds` times over 8-int32 pieces,
// with only the queues' own events.
void RoundTrip(int rounds) {
  twin::launch(1, [&] {
    TPipe pipe;
    TQue<TPosition::VECIN, 1> qin;
    TQue<TPosition::VECOUT, 1> qout;
    pipe.InitBuffer(qin, 2, 32);
    pipe.InitBuffer(qout, 2, 32);
    GlobalTensor<int32_t> in, out;
    in.SetGlobalBuffer(in_gm.ptr(), 256);
    out.SetGlobalBuffer(out_gm.ptr(), 256);
    for (int r = 0; r < rounds; ++r) {
      LocalTensor<int32_t> a = qin.AllocTensor<int32_t>();
      DataCopy(a, in[r * 8], 8);
      qin.EnQue(a);
      LocalTensor<int32_t> b = qin.DeQue<int32_t>();
      LocalTensor<int32_t> c = qout.AllocTensor<int32_t>();
      Muls(c, b, 2, 8);
      qout.EnQue(c);
      qin.FreeTensor(b);
      LocalTensor<int32_t> d = qout.DeQue<int32_t>();
      DataCopy(out[r * 8], d, 8);
      qout.FreeTensor(d);
    }
  });
}

void Queues(Suite& s) {
  for (int i = 0; i < 256; ++i) in_gm.v[i] = i;
  s.Passes("TQue VECIN -> V -> TQue VECOUT round trips need no explicit flags (5 rounds, 2 buffers each)", [] {
    RoundTrip(5);
    for (int i = 0; i < 40; ++i) {
      if (out_gm.v[i] != 2 * i) std::exit(3);
    }
  });
  s.Aborts("a VECIN tensor used without DeQue (the MTE2 -> V event is never waited)", [] {
    twin::launch(1, [] {
      TPipe pipe;
      TQue<TPosition::VECIN, 1> q;
      pipe.InitBuffer(q, 1, 32);
      GlobalTensor<int32_t> in;
      in.SetGlobalBuffer(in_gm.ptr(), 256);
      LocalTensor<int32_t> a = q.AllocTensor<int32_t>();
      DataCopy(a, in, 8);
      q.EnQue(a);
      Muls(a, a, 2, 8);
    });
  }, {"data race", "HardEvent::MTE2_V"});
  s.Aborts("a VECOUT queue does not order a scalar producer before MTE3", [] {
    twin::launch(1, [] {
      TPipe pipe;
      TQue<TPosition::VECOUT, 1> q;
      pipe.InitBuffer(q, 1, 32);
      GlobalTensor<int32_t> out;
      out.SetGlobalBuffer(out_gm.ptr(), 256);
      LocalTensor<int32_t> a = q.AllocTensor<int32_t>();
      a.SetValue(0, 5);
      q.EnQue(a);
      LocalTensor<int32_t> b = q.DeQue<int32_t>();
      DataCopy(out, b, 8);
      q.FreeTensor(b);
    });
  }, {"LocalTensor::SetValue", "DataCopy(UB->GM)", "HardEvent::S_MTE3"});
  auto copy_through = [](bool queue) {
    twin::launch(1, [&] {
      TPipe pipe;
      TQueBind<TPosition::VECIN, TPosition::VECOUT, 1> q;
      TBuf<TPosition::VECCALC> buf;
      pipe.InitBuffer(q, 1, 64);
      pipe.InitBuffer(buf, 64);
      GlobalTensor<int32_t> in, out;
      in.SetGlobalBuffer(in_gm.ptr(), 256);
      out.SetGlobalBuffer(out_gm.ptr(), 256);
      if (queue) {
        LocalTensor<int32_t> a = q.AllocTensor<int32_t>();
        DataCopy(a, in, 16);
        q.EnQue(a);
        LocalTensor<int32_t> b = q.DeQue<int32_t>();
        DataCopy(out, b, 16);
        q.FreeTensor(b);
      } else {
        LocalTensor<int32_t> a = buf.Get<int32_t>();
        DataCopy(a, in, 16);
        DataCopy(out, a, 16);
      }
    });
  };
  s.Passes("TQueBind<VECIN, VECOUT> copies GM -> UB -> GM with its MTE2_MTE3 events", [&] { copy_through(true); });
  s.Aborts("the same copy through a TBuf needs MTE2_MTE3 by hand", [&] { copy_through(false); },
           {"DataCopy(GM->UB)", "DataCopy(UB->GM)", "HardEvent::MTE2_MTE3"});
}

void Bookkeeping(Suite& s) {
  s.Aborts("AllocTensor with every buffer allocated hangs on the chip", [] {
    twin::launch(1, [] {
      TPipe pipe;
      TQue<TPosition::VECIN, 1> q;
      pipe.InitBuffer(q, 1, 32);
      q.AllocTensor<int32_t>();
      q.AllocTensor<int32_t>();
    });
  }, {"all 1 buffers of the queue are allocated"});
  s.Aborts("EnQue past the queue's depth", [] {
    twin::launch(1, [] {
      TPipe pipe;
      TQue<TPosition::VECOUT, 1> q;
      pipe.InitBuffer(q, 2, 32);
      q.EnQue(q.AllocTensor<int32_t>());
      q.EnQue(q.AllocTensor<int32_t>());
    });
  }, {"the queue of depth 1 is full"});
  s.Aborts("an EnQue never dequeued leaves its event set at the end", [] {
    twin::launch(1, [] {
      TPipe pipe;
      TQue<TPosition::VECIN, 1> q;
      pipe.InitBuffer(q, 1, 32);
      q.EnQue(q.AllocTensor<int32_t>());
    });
  }, {"ended with SetFlag<HardEvent::MTE2_V>", "TQue::EnQue"});
  s.Aborts("a second TPipe", [] {
    twin::launch(1, [] {
      TPipe a;
      TPipe b;
    });
  }, {"a second TPipe"});
  s.Aborts("InitBuffer past the usable UB (188160 bytes)", [] {
    twin::launch(1, [] {
      TPipe pipe;
      TBuf<TPosition::VECCALC> a, b;
      pipe.InitBuffer(a, 188160 - 32);
      pipe.InitBuffer(b, 33);
    });
  }, {"does not fit", "188128 of the 188160 usable UB bytes"});
  s.Passes("InitBuffer of exactly the usable UB; buffers are 32-byte rounded and aligned", [] {
    twin::launch(1, [] {
      TPipe pipe;
      TBuf<TPosition::VECCALC> a, b, c;
      pipe.InitBuffer(a, 33);
      pipe.InitBuffer(b, 100);
      pipe.InitBuffer(c, 188160 - 64 - 128);
      if (a.Get<uint8_t>().GetPhyAddr() != 0 || b.Get<uint8_t>().GetPhyAddr() != 64 ||
          c.Get<uint8_t>().GetPhyAddr() != 192 || b.Get<uint8_t>().GetSize() != 128) {
        std::exit(3);
      }
    });
  });
  s.Aborts("FetchEventID when all 8 ids of an event are allocated", [] {
    twin::launch(1, [] {
      TPipe pipe;
      for (int i = 0; i < 8; ++i) pipe.AllocEventID<HardEvent::V_S>();
      pipe.FetchEventID(HardEvent::V_S);
    });
  }, {"all 8 ids of HardEvent::V_S are allocated"});
  s.Passes("the MC2 SyncFunc idiom: FetchEventID, SetFlag, WaitFlag", [] {
    twin::launch(1, [] {
      TPipe pipe;
      const TEventID id = GetTPipePtr()->FetchEventID(HardEvent::MTE3_S);
      SetFlag<HardEvent::MTE3_S>(id);
      WaitFlag<HardEvent::MTE3_S>(id);
    });
  });
}

}  // namespace

int main() {
  Suite s("ascend strict twin: queues");
  Queues(s);
  Bookkeeping(s);
  return s.Report();
}
