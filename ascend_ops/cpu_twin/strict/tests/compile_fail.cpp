// Code the A2/A3 toolchain rejects must not compile against the strict twin either. Each
// UBEP_CASE_* is one such line; ctest compiles the file once per case and matches the diagnostic
// (ascend_ops/CMakeLists.txt). With no case defined the file compiles: the control.
#include "kernel_operator.h"

using namespace AscendC;

void Kernel(GM_ADDR gm) {
  TPipe pipe;
  TBuf<TPosition::VECCALC> buf;
  pipe.InitBuffer(buf, 256);
  LocalTensor<int32_t> i32 = buf.Get<int32_t>();
  GlobalTensor<int32_t> g;
  g.SetGlobalBuffer((__gm__ int32_t*)gm, 64);
  Duplicate(i32, 0, 64);  // the control: an A2/A3 type
#ifdef UBEP_CASE_DUPLICATE_U64
  Duplicate(buf.Get<uint64_t>(), uint64_t{0}, 32);
#endif
#ifdef UBEP_CASE_DUPLICATE_I8
  Duplicate(buf.Get<int8_t>(), int8_t{0}, 256);
#endif
#ifdef UBEP_CASE_ADD_BF16
  Add(buf.Get<bfloat16_t>(), buf.Get<bfloat16_t>(), buf.Get<bfloat16_t>(), 128);
#endif
#ifdef UBEP_CASE_ABS_I32
  Abs(i32, i32, 64);
#endif
#ifdef UBEP_CASE_REDUCESUM_I32
  ReduceSum(i32, i32, i32, 64);
#endif
#ifdef UBEP_CASE_GATHER_I8
  Gather(buf.Get<int8_t>(), buf.Get<int8_t>(), buf.Get<uint32_t>(), 0, 32);
#endif
#ifdef UBEP_CASE_CAST_PAIR
  Cast(i32, buf.Get<uint8_t>(), RoundMode::CAST_NONE, 64);
#endif
#ifdef UBEP_CASE_TQUE_VECCALC
  TQue<TPosition::VECCALC, 1> q;
#endif
#ifdef UBEP_CASE_PIPE_BARRIER_S
  PipeBarrier<PIPE_S>();
#endif
#ifdef UBEP_CASE_ATOMIC_I64
  SetAtomicAdd<int64_t>();
#endif
#ifdef UBEP_CASE_AIC_EVENT
  SetFlag<HardEvent::M_V>(0);
#endif
#ifdef UBEP_CASE_PHYADDR_AS_POINTER
  int32_t* p = i32.GetPhyAddr();
  (void)p;
#endif
#ifdef UBEP_CASE_CONST_SETVALUE
  const GlobalTensor<int32_t> c = g;
  c.SetValue(0, 1);
#endif
#ifdef UBEP_CASE_DATACOPY_BOOL
  DataCopy(buf.Get<bool>(), GlobalTensor<bool>(), 32);
#endif
}

int main() { return 0; }
