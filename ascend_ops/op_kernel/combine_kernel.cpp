// Combine, AIV-only; every AIV sends, then receives, then (after the one SyncAll: the reduction
// of a token needs the rows of every peer) reduces its share of tokens.
//
// 1. hello: each die writes a count message (the number of rows it returns) into every peer's
//    window; every call thus receives a message from every peer, which is what lets two window
//    slots alternate without a barrier (docs/PROTOCOL.md, "Epochs and slots").
// 2. send: each pair row (reduce SOURCE, or PAIRS: one fp32 per row) goes back to its source as
//    row p of the batch, p = the pair's index among the source's pairs for this die in (t, k)
//    order (recv_pair_base + its rank among the token's pairs here); for EXPERT_RANK each received
//    token's pairs here are summed in fp32 in ascending k (w * o, each product and sum rounded),
//    rounded to the row dtype and sent as row j, the token's ordinal.
// 3. receive: per peer d, wait for its hello and rows and keep them in the workspace, by (t, k)
//    (SOURCE, PAIRS) or by (t, d) (EXPERT_RANK); sp markers are reset as rows are consumed.
// 4. reduce: y[t] = sum over k ascending of w * o (SOURCE) or over d ascending of the partials
//    (EXPERT_RANK), in fp32, rounded to the dtype; PAIRS: the value, 0 at -1 slots.
//
// Inputs: rows [R, H] (PAIRS: [R] fp32), topk_idx [T, K] int64, topk_weights [T, K] fp32, and the
// dispatch's recv_rows, recv_pair_weights, recv_pair_base, recv_counts. Output y [T, H] (PAIRS:
// [T, K] fp32).
#include "ep_common.h"
#include "ep_op_tiling.h"

namespace ubep_ascend {

using namespace AscendC;

template <typename T>
class CombineKernel {
 public:
  __aicore__ inline void Init(GM_ADDR rows, GM_ADDR topk_idx, GM_ADDR topk_weights, GM_ADDR recv_rows,
                              GM_ADDR recv_pair_weights, GM_ADDR recv_pair_base, GM_ADDR recv_counts, GM_ADDR y,
                              GM_ADDR scratch, const EpTiling* tiling) {
    t_ = tiling;
    c_.Init(tiling, scratch);
    pairs_mode_ = t_->reduce == REDUCE_PAIRS;
    f_ = pairs_mode_ ? pair_format(*t_) : combine_format(*t_);
    area_ = pairs_mode_ ? t_->pair_off : t_->comb_off;
    rec_area_ = pairs_mode_ ? t_->pair_rec_off : t_->comb_rec_off;
    H_ = pairs_mode_ ? 1 : t_->hidden;
    rows_in_ = rows;
    y_ = y;
    idx_.SetGlobalBuffer(reinterpret_cast<__gm__ int64_t*>(topk_idx));
    w_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(topk_weights));
    rows_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(recv_rows));
    pair_w_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(recv_pair_weights));
    pair_base_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(recv_pair_base));
    counts_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(recv_counts));
    kept_ = scratch + t_->ws_data;  // received rows, [T * max(K, W), H]
    pipe_.InitBuffer(wire_q_, 1, f_.row_stride());
    pipe_.InitBuffer(row_buf_, (f_.row_bytes() + 31) / 32 * 32);
    pipe_.InitBuffer(acc_buf_, 4 * H_);
    pipe_.InitBuffer(term_buf_, 4 * H_);
    pipe_.InitBuffer(small_buf_, t_->cnt_stride);
  }

  __aicore__ inline void Process() {
    const int64_t me = GetBlockIdx(), n = GetBlockNum();
    const bool ok = Send(me, n) && ReceiveAll(me, n);
    SyncAll();
    if (ok && !c_.Aborted()) Reduce(me, n);
  }

 private:
  __aicore__ inline int64_t Dest(int64_t p) const {
    const int64_t e = idx_.GetValue(p);
    return e >= 0 ? e / t_->local_experts : -1;
  }
  __aicore__ inline int64_t RowsFor(int64_t peer_tokens, int64_t peer_pairs) const {
    return t_->reduce == REDUCE_EXPERT_RANK ? peer_tokens : peer_pairs;
  }

  // ---- send -----------------------------------------------------------------------------------

  __aicore__ inline bool Send(int64_t me, int64_t n) {
    const int64_t W = t_->world, K = t_->top_k;
    LocalTensor<uint64_t> msg = small_buf_.Get<uint64_t>();
    for (int64_t s = me; s < W; s += n) {
      Duplicate<uint64_t>(msg, 0, 8);
      msg.SetValue(4, static_cast<uint64_t>(RowsFor(counts_.GetValue(2 * s), counts_.GetValue(2 * s + 1))));
      SendCountMessage(c_, s, msg, 1);
    }
    int64_t item = 0;
    for (int64_t s = 0; s < W; ++s) {
      const int64_t tokens = counts_.GetValue(2 * s);
      for (int64_t j = 0; j < tokens; ++j, ++item) {
        if (item % n != me) continue;
        const int64_t slot = s * t_->max_tokens + j;
        if (t_->reduce == REDUCE_EXPERT_RANK) {
          SumLocalPairs(slot);
          SendRow(s, j);
          continue;
        }
        int64_t p = pair_base_.GetValue(slot);
        for (int64_t k = 0; k < K; ++k) {
          const int32_t row = rows_.GetValue(slot * K + k);
          if (row < 0) continue;
          LoadRow(row);
          SendRow(s, p++);
        }
      }
    }
    c_.Bump(CNT_SENT, small_buf_.Get<int32_t>());
    if (f_.mode == ubep::Mode::TFF) return true;
    for (int64_t s = me; s < W; s += n) {
      if (!c_.Poll(PHASE_SENT, -1, [&] { return c_.Counter(CNT_SENT) == n; })) return false;
      SendBatchRecord(s, RowsFor(counts_.GetValue(2 * s), counts_.GetValue(2 * s + 1)));
    }
    return true;
  }

  __aicore__ inline void LoadRow(int64_t row) {
    GlobalTensor<uint8_t> src;
    src.SetGlobalBuffer(rows_in_ + row * f_.row_bytes(), f_.row_bytes());
    DataCopyPad(row_buf_.Get<uint8_t>(), src, DataCopyExtParams{1, static_cast<uint32_t>(f_.row_bytes()), 0, 0, 0},
                DataCopyPadExtParams<uint8_t>{});
  }

  // acc = sum over k ascending of w * o for the token's pairs here; rounded into the row buffer.
  __aicore__ inline void SumLocalPairs(int64_t slot) {
    const int64_t K = t_->top_k;
    LocalTensor<float> acc = acc_buf_.Get<float>(), term = term_buf_.Get<float>();
    LocalTensor<T> row = row_buf_.Get<T>();
    Duplicate<float>(acc, 0.0f, H_);
    for (int64_t k = 0; k < K; ++k) {
      const int32_t r = rows_.GetValue(slot * K + k);
      if (r < 0) continue;
      LoadRow(r);
      Cast(term, row, RoundMode::CAST_NONE, H_);
      if (t_->weighted) Muls(term, term, pair_w_.GetValue(slot * K + k), H_);
      Add(acc, acc, term, H_);
    }
    Cast(row, acc, RoundMode::CAST_RINT, H_);
  }

  __aicore__ inline void SendRow(int64_t s, int64_t r) {
    uint8_t* dst = c_.Slot(s) + area_ + (t_->rank * t_->comb_rows + r) * f_.row_stride();
    ubep_ascend::SendRow(f_, row_buf_.Get<uint8_t>().GetPhyAddr(), r, static_cast<uint64_t>(t_->epoch),
                         wire_q_, dst, Accumulator(s), small_buf_.Get<int32_t>());
  }

  __aicore__ inline __gm__ int32_t* Accumulator(int64_t peer) {
    return BatchAccumulator(c_.ws + t_->ws_collide, peer);
  }

  __aicore__ inline void SendBatchRecord(int64_t s, int64_t num_rows) {
    ubep_ascend::SendBatchRecord(f_, Accumulator(s), c_.Slot(s) + rec_area_ + t_->rank * RECORD_STRIDE,
                                 num_rows, static_cast<uint64_t>(t_->epoch), small_buf_.Get<uint64_t>());
  }

  // ---- receive --------------------------------------------------------------------------------

  __aicore__ inline bool ReceiveAll(int64_t me, int64_t n) {
    for (int64_t d = me; d < t_->world; d += n) {
      if (!ReceiveFrom(d)) return false;
    }
    return true;
  }

  // Rows from peer d, in the order d sent them: this die's pairs (or tokens) for d in (t, k) order.
  __aicore__ inline bool ReceiveFrom(int64_t d) {
    const int64_t K = t_->top_k;
    const uint64_t epoch = static_cast<uint64_t>(t_->epoch);
    GlobalTensor<uint64_t> hello = CountEntry(c_, d);
    if (!c_.Poll(PHASE_HELLO, d, [&] { return hello.GetValue(0) == epoch; })) return false;
    const int64_t num_rows = static_cast<int64_t>(hello.GetValue(4));
    uint8_t* batch = c_.Slot(t_->rank) + area_ + d * t_->comb_rows * f_.row_stride();
    uint8_t* record = c_.Slot(t_->rank) + rec_area_ + d * RECORD_STRIDE;
    LocalTensor<uint64_t> rec = small_buf_.Get<uint64_t>();
    LocalTensor<uint8_t> wire = wire_q_.AllocTensor<uint8_t>();
    if (f_.mode == ubep::Mode::SW || f_.mode == ubep::Mode::DC) {
      if (!c_.Poll(PHASE_RETURN, d, [&] { return BatchComplete(batch, record, num_rows, wire, rec); })) return false;
    }
    int64_t r = 0;
    for (int64_t tok = 0; tok < t_->num_tokens; ++tok) {
      for (int64_t k = 0; k < K; ++k) {
        if (Dest(tok * K + k) != d) continue;
        const bool first_here = t_->reduce != REDUCE_EXPERT_RANK || FirstPairOn(tok, k, d);
        if (!first_here) continue;
        LocalTensor<uint8_t> row = row_buf_.Get<uint8_t>();
        if (!TakeRow(c_, PHASE_RETURN, d, f_, batch, record, num_rows, r, epoch, wire, rec, row.GetPhyAddr())) {
          return false;
        }
        const int64_t at = t_->reduce == REDUCE_EXPERT_RANK ? tok * t_->world + d : tok * K + k;
        GlobalTensor<uint8_t> keep;
        keep.SetGlobalBuffer(kept_ + at * f_.row_bytes(), f_.row_bytes());
        DataCopyPad(keep, row, DataCopyExtParams{1, static_cast<uint32_t>(f_.row_bytes()), 0, 0, 0});
        ++r;
      }
    }
    wire_q_.FreeTensor(wire);
    return true;
  }

  __aicore__ inline bool FirstPairOn(int64_t tok, int64_t k, int64_t d) const {
    for (int64_t j = 0; j < k; ++j) {
      if (Dest(tok * t_->top_k + j) == d) return false;
    }
    return true;
  }

  __aicore__ inline bool BatchComplete(uint8_t* batch, uint8_t* record, int64_t num_rows,
                                       const LocalTensor<uint8_t>& wire, const LocalTensor<uint64_t>& rec) {
    return ubep_ascend::BatchComplete(f_, batch, record, num_rows, static_cast<uint64_t>(t_->epoch), wire,
                                      rec);
  }

  // ---- reduce ---------------------------------------------------------------------------------

  __aicore__ inline void Reduce(int64_t me, int64_t n) {
    const int64_t K = t_->top_k, W = t_->world;
    LocalTensor<float> acc = acc_buf_.Get<float>(), term = term_buf_.Get<float>();
    LocalTensor<T> row = row_buf_.Get<T>();
    GlobalTensor<float> y_pairs;
    y_pairs.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(y_));
    GlobalTensor<float> kept_f32;
    kept_f32.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(kept_));
    for (int64_t tok = me; tok < t_->num_tokens; tok += n) {
      if (pairs_mode_) {
        for (int64_t k = 0; k < K; ++k) {
          y_pairs.SetValue(tok * K + k, idx_.GetValue(tok * K + k) >= 0 ? kept_f32.GetValue(tok * K + k) : 0.0f);
        }
        continue;
      }
      Duplicate<float>(acc, 0.0f, H_);
      const bool by_rank = t_->reduce == REDUCE_EXPERT_RANK;
      for (int64_t i = 0; i < (by_rank ? W : K); ++i) {
        const bool valid = by_rank ? TokenGoesTo(tok, i) : idx_.GetValue(tok * K + i) >= 0;
        if (!valid) continue;
        GlobalTensor<uint8_t> src;
        src.SetGlobalBuffer(kept_ + (tok * (by_rank ? W : K) + i) * f_.row_bytes(), f_.row_bytes());
        DataCopyPad(row.template ReinterpretCast<uint8_t>(), src,
                    DataCopyExtParams{1, static_cast<uint32_t>(f_.row_bytes()), 0, 0, 0},
                    DataCopyPadExtParams<uint8_t>{});
        Cast(term, row, RoundMode::CAST_NONE, H_);
        if (!by_rank && t_->weighted) Muls(term, term, w_.GetValue(tok * K + i), H_);
        Add(acc, acc, term, H_);
      }
      Cast(row, acc, RoundMode::CAST_RINT, H_);
      GlobalTensor<uint8_t> out;
      out.SetGlobalBuffer(y_ + tok * f_.row_bytes(), f_.row_bytes());
      DataCopyPad(out, row.template ReinterpretCast<uint8_t>(),
                  DataCopyExtParams{1, static_cast<uint32_t>(f_.row_bytes()), 0, 0, 0});
    }
  }

  __aicore__ inline bool TokenGoesTo(int64_t tok, int64_t d) const {
    for (int64_t k = 0; k < t_->top_k; ++k) {
      if (Dest(tok * t_->top_k + k) == d) return true;
    }
    return false;
  }

  const EpTiling* t_;
  Ctx c_;
  ubep::WireFormat f_;
  bool pairs_mode_;
  int64_t area_, rec_area_, H_;
  GM_ADDR rows_in_, y_, kept_;
  GlobalTensor<int64_t> idx_;
  GlobalTensor<float> w_, pair_w_;
  GlobalTensor<int32_t> rows_, pair_base_, counts_;
  TPipe pipe_;
  TQue<TPosition::VECOUT, 1> wire_q_;
  TBuf<TPosition::VECCALC> row_buf_, acc_buf_, term_buf_, small_buf_;
};

template <typename T>
__aicore__ inline void RunCombine(GM_ADDR rows, GM_ADDR topk_idx, GM_ADDR topk_weights, GM_ADDR recv_rows,
                                  GM_ADDR recv_pair_weights, GM_ADDR recv_pair_base, GM_ADDR recv_counts, GM_ADDR y,
                                  GM_ADDR scratch, const EpTiling* tiling) {
  CombineKernel<T> op;
  op.Init(rows, topk_idx, topk_weights, recv_rows, recv_pair_weights, recv_pair_base, recv_counts, y, scratch,
          tiling);
  op.Process();
}

}  // namespace ubep_ascend

// The UbepCombine op's kernel (op_host/mc2/ubep_combine_def.cpp), laid out as ubep_dispatch's; the
// tiling's rows_dtype picks the instantiation: fp32 (and every PAIRS call), fp16 or bf16.
extern "C" __global__ __aicore__ void ubep_combine(GM_ADDR rows, GM_ADDR topk_idx, GM_ADDR topk_weights,
                                                   GM_ADDR recv_rows, GM_ADDR recv_pair_weights,
                                                   GM_ADDR recv_pair_base, GM_ADDR recv_counts, GM_ADDR y,
                                                   GM_ADDR scratch, GM_ADDR, GM_ADDR tiling) {
  KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_AIV_ONLY);
  REGISTER_TILING_DEFAULT(ubep_ascend::EpOpTiling);
  GET_TILING_DATA_WITH_STRUCT(ubep_ascend::EpOpTiling, op_tiling, tiling);
  const ubep_ascend::EpTiling* t = &op_tiling.ep;
  if (t->rows_dtype == ubep_ascend::ROW_FP32) {
    ubep_ascend::RunCombine<float>(rows, topk_idx, topk_weights, recv_rows, recv_pair_weights, recv_pair_base,
                                   recv_counts, y, scratch, t);
  } else if (t->rows_dtype == ubep_ascend::ROW_FP16) {
    ubep_ascend::RunCombine<half>(rows, topk_idx, topk_weights, recv_rows, recv_pair_weights, recv_pair_base,
                                  recv_counts, y, scratch, t);
  } else {
    ubep_ascend::RunCombine<bfloat16_t>(rows, topk_idx, topk_weights, recv_rows, recv_pair_weights,
                                        recv_pair_base, recv_counts, y, scratch, t);
  }
}
