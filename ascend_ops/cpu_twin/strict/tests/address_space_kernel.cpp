// A small kernel in the ubep style for the address-space parse (tests/test_ascend_address_spaces.py):
// clang parses it against the strict twin with __gm__ and __ubuf__ as distinct address spaces. As
// written it has no error and touches most of the twin's API, so the twin's own headers are
// checked in that mode too; each UBEP_BAD_* adds one address-space error.
#include "kernel_operator.h"

using namespace AscendC;

__aicore__ inline int64_t Checksum(const uint8_t* bytes, int64_t n) {  // a private-pointer helper
  int64_t s = 0;
  for (int64_t i = 0; i < n; ++i) s += bytes[i];
  return s;
}

class Copier {
 public:
  __aicore__ inline void Init(GM_ADDR src, GM_ADDR dst, GM_ADDR ws) {
    src_ = src;
    in_.SetGlobalBuffer((__gm__ int32_t*)src, 64);
    out_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(dst), 64);
    ws_.SetGlobalBuffer((__gm__ int32_t*)ws, 8 * GetBlockNum());
    pipe_.InitBuffer(q_, 2, 256);
    pipe_.InitBuffer(bind_, 1, 256);
    pipe_.InitBuffer(calc_, 1024);
  }

  __aicore__ inline void Process() {
    LocalTensor<int32_t> a = q_.AllocTensor<int32_t>();
    DataCopy(a, in_, 64);
    q_.EnQue(a);
    LocalTensor<int32_t> b = q_.DeQue<int32_t>();
    LocalTensor<float> f = calc_.Get<float>(64), g = calc_.GetWithOffset<float>(64, 256);
    Cast(f, b, RoundMode::CAST_RINT, 64);
    PipeBarrier<PIPE_V>();
    Muls(g, f, 0.5f, 64);
    PipeBarrier<PIPE_V>();
    Add(f, f, g, 64);
    Duplicate(g, 1.0f, 64);
    q_.FreeTensor(b);
    SetFlag<HardEvent::V_S>(0);
    WaitFlag<HardEvent::V_S>(0);
    const float first = f.GetValue(0);
    f(1) = first;

    LocalTensor<int32_t> c = bind_.AllocTensor<int32_t>();
    DataCopyPad(c, in_, DataCopyExtParams{1, 20, 0, 0, 0}, DataCopyPadExtParams<int32_t>{false, 0, 0, 0});
    bind_.EnQue(c);
    LocalTensor<int32_t> d = bind_.DeQue<int32_t>();
    SetAtomicAdd<int32_t>();
    DataCopyPad(out_, d, DataCopyExtParams{1, 20, 0, 0, 0});
    SetAtomicNone();
    bind_.FreeTensor(d);

    out_(8) = in_.GetValue(3);
    DataCacheCleanAndInvalid<int32_t, CacheLine::SINGLE_CACHE_LINE, DcciDst::CACHELINE_OUT>(out_[8]);
    const __gm__ int32_t* at = in_.GetPhyAddr();
    __gm__ int32_t* third = in_.GetPhyAddr(3);
    __ubuf__ int32_t* raw = (__ubuf__ int32_t*)c.GetPhyAddr();  // the chip's spelling; never dereferenced here
    (void)at;
    (void)third;
    (void)raw;
    SyncAll(ws_, calc_.Get<int32_t>(8 * GetBlockNum()));
    if (GetHcclContext<0>() == nullptr) return;

#ifdef UBEP_BAD_GM_AS_PLAIN
    (void)Checksum(src_, 64);  // a __gm__ pointer where a private pointer is expected
#endif
#ifdef UBEP_BAD_PLAIN_TO_SET_GLOBAL_BUFFER
    int32_t local[8] = {};
    in_.SetGlobalBuffer(local, 8);  // a private pointer where SetGlobalBuffer takes __gm__
#endif
#ifdef UBEP_BAD_UB_AS_GM
    out_.SetGlobalBuffer((__ubuf__ int32_t*)c.GetPhyAddr(), 8);  // UB is not GM
#endif
  }

 private:
  GM_ADDR src_;
  TPipe pipe_;
  TQue<TPosition::VECIN, 1> q_;
  TQueBind<TPosition::VECIN, TPosition::VECOUT, 1> bind_;
  TBuf<TPosition::VECCALC> calc_;
  GlobalTensor<int32_t> in_, out_, ws_;
};

extern "C" __global__ __aicore__ void copier(GM_ADDR src, GM_ADDR dst, GM_ADDR ws, GM_ADDR tiling) {
  KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIV_1_0);
  REGISTER_TILING_DEFAULT(int64_t);
  GET_TILING_DATA_WITH_STRUCT(int64_t, t, tiling);
  (void)t;
  Copier op;
  op.Init(src, dst, ws);
  op.Process();
}
