// This die's routing, topk_idx [T, K] int64 and topk_weights [T, K] fp32, as the kernels read it:
// from UB, a window of whole tokens (up to CHUNK pairs) copied in at once (DataCopyPad, then
// MTE2 -> S), as MC2 loads expert_ids once per AIV, instead of one scalar GM load per pair. The
// kernels scan the pairs in (t, k) order, so a window is copied once per scan; CHUNK bounds the UB
// for prefill batches. The vector counts (ep_scan.h) take a window whole (LoadWindow).
#pragma once

#include "ep_sync.h"

namespace ubep_ascend {

class Routing {
 public:
  static constexpr int64_t CHUNK = 1024;  // pairs per window at most: 8 KiB of ids, 4 KiB of weights

  __aicore__ inline void Init(GM_ADDR topk_idx, GM_ADDR topk_weights, int64_t num_tokens, int64_t top_k,
                              AscendC::TPipe* pipe) {
    const int64_t num_pairs = num_tokens * top_k;
    idx_gm_ = Gm<int64_t>(topk_idx, num_pairs * 8);
    w_gm_ = Gm<float>(topk_weights, num_pairs * 4);
    num_pairs_ = num_pairs;
    window_ = (CHUNK / top_k > 0 ? CHUNK / top_k : 1) * top_k;
    const int64_t n = num_pairs < window_ ? (num_pairs > 0 ? num_pairs : 1) : window_;
    pipe->InitBuffer(idx_buf_, static_cast<uint32_t>(RoundUp32(n * 8)));
    pipe->InitBuffer(w_buf_, static_cast<uint32_t>(RoundUp32(n * 4)));
    idx_ = idx_buf_.Get<int64_t>();
    w_ = w_buf_.Get<float>();
    lo_ = hi_ = 0;
  }

  // Tokens per window, and windows.
  __aicore__ inline int64_t WindowTokens(int64_t top_k) const { return window_ / top_k; }
  __aicore__ inline int64_t Windows() const { return (num_pairs_ + window_ - 1) / window_; }
  // Window w's ids in UB, for the scalar (a vector reader takes them after an S -> V), and its
  // number of pairs.
  __aicore__ inline AscendC::LocalTensor<int64_t> LoadWindow(int64_t w, int64_t* pairs) {
    Cover(w * window_);
    *pairs = hi_ - lo_;
    return idx_;
  }

  __aicore__ inline int64_t Expert(int64_t p) {
    Cover(p);
    return idx_.GetValue(static_cast<uint32_t>(p - lo_));
  }
  __aicore__ inline float Weight(int64_t p) {
    Cover(p);
    return w_.GetValue(static_cast<uint32_t>(p - lo_));
  }
  // The die pair p goes to (-1 for none), with L experts per die.
  __aicore__ inline int64_t Dest(int64_t p, int64_t L) {
    const int64_t e = Expert(p);
    return e >= 0 ? e / L : -1;
  }

 private:
  __aicore__ inline void Cover(int64_t p) {
    if (p >= lo_ && p < hi_) return;
    lo_ = p / window_ * window_;
    hi_ = lo_ + window_ < num_pairs_ ? lo_ + window_ : num_pairs_;
    Sync<HardEvent::S_MTE2>();  // the scalar (and, before it, a vector scan) has read the previous window
    CopyIn(idx_, idx_gm_[lo_], (hi_ - lo_) * 8);
    CopyIn(w_, w_gm_[lo_], (hi_ - lo_) * 4);
    Sync<HardEvent::MTE2_S>();
  }

  AscendC::GlobalTensor<int64_t> idx_gm_;
  AscendC::GlobalTensor<float> w_gm_;
  AscendC::TBuf<AscendC::TPosition::VECCALC> idx_buf_, w_buf_;
  AscendC::LocalTensor<int64_t> idx_;
  AscendC::LocalTensor<float> w_;
  int64_t num_pairs_, window_, lo_, hi_;
};

}  // namespace ubep_ascend
