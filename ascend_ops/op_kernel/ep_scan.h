// Vector counts over a window of the routing (ep_routing.h): the pairs of an expert and the tokens
// with a pair on a die, which the count message and the token group's mapper need. MC2 counts
// expert ids with vector arithmetic instead of a scalar loop per pair (ops-transformer
// moe_distribute_dispatch_v2.h, CalTokenSendExpertCnt); so does this, in fp32, exact because every
// value is a small integer (ids < 2^24, sums < 2^24). Per window of Tw tokens, in UB, K columns of
// Tp = Tw rounded up to 8 (32-byte aligned columns), tokens past the window's holding -1:
//   ids   [K][Tp]  pair k of token t (Gather from the window's [t][k] order), -1 for none
//   dest  [K][Tp]  the die of the pair, floor((id + 0.5) * fl(1 / L)): exact while E < 2^22, as
//                  the product's error (under W 2^-23) stays below the 0.5 / L to the nearest
//                  integer; -1 for none
//   first [K][Tp]  1 where the pair is the first of its token on its die, else 0
// With ne(x, v) = min(|x - v|, 1), 0 where x == v and 1 elsewhere:
//   pairs of expert e      = K Tp - sum ne(ids, e)
//   tokens with a pair on d = sum first - sum first * ne(dest, d)   (a -1 pair adds 1 - 1 = 0).
// Each count is one ReduceSum into its own 32-byte result slot; Collect hands them to the scalar.
// Pipes: the window's ids come from MTE2 through the scalar (Routing: MTE2 -> S); Prepare begins
// with S -> V, which also orders the scalar's reads of the previous window's results; V -> V by
// PipeBarrier; Collect ends with V -> S, which orders the vector's reads of the ids before the
// next window's copy in (Routing: S -> MTE2).
#pragma once

#include "ep_sync.h"

namespace ubep_ascend {

using AscendC::LocalTensor;

class RouteScan {
 public:
  // K pairs per token, L experts per die, windows of up to `window_tokens` tokens, `slots` results
  // per window.
  __aicore__ inline void Init(int64_t K, int64_t L, int64_t window_tokens, int64_t slots, AscendC::TPipe* pipe) {
    K_ = K;
    L_ = L;
    tp_ = (window_tokens + 7) / 8 * 8;
    n_ = K * tp_;
    pipe->InitBuffer(ids_buf_, static_cast<uint32_t>(4 * n_));
    pipe->InitBuffer(dest_buf_, static_cast<uint32_t>(4 * n_));
    pipe->InitBuffer(first_buf_, static_cast<uint32_t>(4 * n_));
    pipe->InitBuffer(tmp_buf_, static_cast<uint32_t>(4 * n_));
    pipe->InitBuffer(off_buf_, static_cast<uint32_t>(4 * tp_));
    pipe->InitBuffer(out_buf_, static_cast<uint32_t>(32 * (slots + 1)));
  }

  // The columns of a window of `pairs` pairs (whole tokens) whose ids are `window` (UB, int64).
  __aicore__ inline void Prepare(const LocalTensor<int64_t>& window, int64_t pairs) {
    const LocalTensor<int32_t> ids = ids_buf_.Get<int32_t>(), tmp = tmp_buf_.Get<int32_t>(),
                               off = off_buf_.Get<int32_t>(), dest_i = dest_buf_.Get<int32_t>();
    const LocalTensor<float> idf = ids_buf_.Get<float>(), dest = dest_buf_.Get<float>(),
                             first = first_buf_.Get<float>(), t = tmp_buf_.Get<float>();
    const int32_t n = static_cast<int32_t>(n_), tp = static_cast<int32_t>(tp_);
    Sync<HardEvent::S_V>();
    AscendC::Cast(tmp, window, AscendC::RoundMode::CAST_NONE, static_cast<uint32_t>(pairs));
    AscendC::Duplicate<int32_t>(ids, -1, n);
    AscendC::Duplicate<float>(first, 1.0f, n);
    AscendC::CreateVecIndex<int32_t>(off, 0, static_cast<uint32_t>(tp));
    AscendC::PipeBarrier<PIPE_V>();
    AscendC::Muls<int32_t>(off, off, static_cast<int32_t>(4 * K_), tp);
    AscendC::PipeBarrier<PIPE_V>();
    for (int64_t k = 0; k < K_; ++k) {
      AscendC::Gather(ids[static_cast<uint32_t>(k * tp_)], tmp, off.ReinterpretCast<uint32_t>(),
                      static_cast<uint32_t>(4 * k), static_cast<uint32_t>(pairs / K_));
    }
    AscendC::PipeBarrier<PIPE_V>();
    AscendC::Cast(idf, ids, AscendC::RoundMode::CAST_NONE, static_cast<uint32_t>(n));
    AscendC::PipeBarrier<PIPE_V>();
    AscendC::Adds<float>(t, idf, 0.5f, n);
    AscendC::PipeBarrier<PIPE_V>();
    AscendC::Muls<float>(t, t, 1.0f / static_cast<float>(L_), n);
    AscendC::PipeBarrier<PIPE_V>();
    AscendC::Cast(dest_i, t, AscendC::RoundMode::CAST_FLOOR, static_cast<uint32_t>(n));
    AscendC::PipeBarrier<PIPE_V>();
    AscendC::Cast(dest, dest_i, AscendC::RoundMode::CAST_NONE, static_cast<uint32_t>(n));
    for (int64_t k = 1; k < K_; ++k) {
      const LocalTensor<float> fk = first[static_cast<uint32_t>(k * tp_)], dk = dest[static_cast<uint32_t>(k * tp_)];
      for (int64_t j = 0; j < k; ++j) {
        AscendC::PipeBarrier<PIPE_V>();
        AscendC::Sub<float>(t, dk, dest[static_cast<uint32_t>(j * tp_)], tp);
        AscendC::PipeBarrier<PIPE_V>();
        AscendC::Abs<float>(t, t, tp);
        AscendC::PipeBarrier<PIPE_V>();
        AscendC::Mins<float>(t, t, 1.0f, tp);
        AscendC::PipeBarrier<PIPE_V>();
        AscendC::Mul<float>(fk, fk, t, tp);
      }
    }
    AscendC::PipeBarrier<PIPE_V>();
    AscendC::ReduceSum<float>(Slot(-1), first, t, n);
  }

  // Result slot `slot` gets the pairs of expert e of the prepared window.
  __aicore__ inline void PairsOf(int64_t e, int64_t slot) {
    NotEqual(ids_buf_.Get<float>(), static_cast<float>(e));
    AscendC::PipeBarrier<PIPE_V>();
    AscendC::ReduceSum<float>(Slot(slot), tmp_buf_.Get<float>(), tmp_buf_.Get<float>(), static_cast<int32_t>(n_));
  }

  // Result slot `slot` gets the tokens of the prepared window with a pair on die d.
  __aicore__ inline void TokensOn(int64_t d, int64_t slot) {
    const LocalTensor<float> t = tmp_buf_.Get<float>();
    NotEqual(dest_buf_.Get<float>(), static_cast<float>(d));
    AscendC::PipeBarrier<PIPE_V>();
    AscendC::Mul<float>(t, t, first_buf_.Get<float>(), static_cast<int32_t>(n_));
    AscendC::PipeBarrier<PIPE_V>();
    AscendC::ReduceSum<float>(Slot(slot), t, t, static_cast<int32_t>(n_));
  }

  // The results, for the scalar: V -> S.
  __aicore__ inline void Collect() {
    Sync<HardEvent::V_S>();
    first_ = Value(-1);
  }
  __aicore__ inline int64_t Pairs(int64_t slot) { return n_ - Value(slot); }
  __aicore__ inline int64_t Tokens(int64_t slot) { return first_ - Value(slot); }

 private:
  // tmp = ne(src, v), after the previous operation's reads of tmp.
  __aicore__ inline void NotEqual(const LocalTensor<float>& src, float v) {
    const LocalTensor<float> t = tmp_buf_.Get<float>();
    const int32_t n = static_cast<int32_t>(n_);
    AscendC::PipeBarrier<PIPE_V>();
    AscendC::Adds<float>(t, src, -v, n);
    AscendC::PipeBarrier<PIPE_V>();
    AscendC::Abs<float>(t, t, n);
    AscendC::PipeBarrier<PIPE_V>();
    AscendC::Mins<float>(t, t, 1.0f, n);
  }
  // Slot -1 holds sum(first).
  __aicore__ inline LocalTensor<float> Slot(int64_t slot) {
    return out_buf_.Get<float>()[static_cast<uint32_t>(8 * (slot + 1))];
  }
  __aicore__ inline int64_t Value(int64_t slot) {
    return static_cast<int64_t>(out_buf_.Get<float>().GetValue(static_cast<uint32_t>(8 * (slot + 1))));
  }

  int64_t K_, L_, tp_, n_, first_;  // first_: sum(first) of the collected window
  AscendC::TBuf<AscendC::TPosition::VECCALC> ids_buf_, dest_buf_, first_buf_, tmp_buf_, off_buf_, out_buf_;
};

}  // namespace ubep_ascend
