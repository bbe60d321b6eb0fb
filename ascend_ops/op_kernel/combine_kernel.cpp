// Combine; every AIV sends, then receives, then (after the one SyncAll: the reduction of a token
// needs the rows of every peer) reduces its share of tokens.
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
// The fp32 sums: Cast(CAST_NONE) widens fp16 / bf16 rows and Cast(CAST_RINT) rounds the sum back;
// fp32 rows are used as they are (A2/A3 have no float -> float Cast but round-to-integral).
//
// Inputs: rows [R, H] (PAIRS: [R] fp32), topk_idx [T, K] int64, topk_weights [T, K] fp32, and the
// dispatch's recv_rows, recv_pair_weights, recv_pair_base, recv_counts. Output y [T, H] (PAIRS:
// [T, K] fp32).
#include "ep_common.h"
#include "op_tiling.h"
#include "ep_routing.h"

namespace ubep_ascend {

using namespace AscendC;

template <typename T>
class CombineKernel {
  static constexpr bool kF32 = std::is_same_v<T, float>;

 public:
  __aicore__ inline void Init(GM_ADDR rows, GM_ADDR topk_idx, GM_ADDR topk_weights, GM_ADDR recv_rows,
                              GM_ADDR recv_pair_weights, GM_ADDR recv_pair_base, GM_ADDR recv_counts, GM_ADDR y,
                              GM_ADDR scratch, const EpTiling* tiling, TPipe* pipe) {
    t_ = tiling;
    c_.Init(tiling, scratch);
    pairs_mode_ = t_->reduce == REDUCE_PAIRS;
    f_ = pairs_mode_ ? pair_format(*t_) : combine_format(*t_);
    area_ = pairs_mode_ ? t_->pair_off : t_->comb_off;
    rec_area_ = pairs_mode_ ? t_->pair_rec_off : t_->comb_rec_off;
    H_ = pairs_mode_ ? 1 : t_->hidden;
    const int64_t W = t_->world, K = t_->top_k;
    rows_in_ = rows;
    y_ = y;
    kept_ = scratch + t_->ws_data;  // received rows, [T * max(K, W), H]
    rows_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(recv_rows));
    pair_w_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(recv_pair_weights));
    pair_base_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(recv_pair_base));
    c_.InitBuffers(pipe);
    c_.TakeCallNumber();
    c_.InitSentinel(pipe, f_);
    route_.Init(topk_idx, topk_weights, t_->num_tokens, K, pipe);
    pipe->InitBuffer(wire_buf_, static_cast<uint32_t>(f_.row_stride()));
    pipe->InitBuffer(row_buf_, static_cast<uint32_t>(RoundUp32(f_.row_bytes())));
    pipe->InitBuffer(acc_buf_, static_cast<uint32_t>(4 * H_));
    if (!kF32) pipe->InitBuffer(term_buf_, static_cast<uint32_t>(4 * H_));
    pipe->InitBuffer(msg_buf_, 64);
    // recv_counts [W, 2], read once; a slot's recv_rows [K], recv_pair_weights [K] and
    // recv_pair_base; PAIRS: a token's kept values [K] and its y [K].
    pipe->InitBuffer(counts_buf_, static_cast<uint32_t>(RoundUp32(8 * W)));
    pipe->InitBuffer(slot_buf_, static_cast<uint32_t>(2 * RoundUp32(4 * K) + 32));
    pipe->InitBuffer(pairs_buf_, static_cast<uint32_t>(2 * RoundUp32(4 * K)));
    CopyIn(counts_buf_.Get<int32_t>(), Gm<int32_t>(recv_counts, 8 * W), 8 * W);
    Sync<HardEvent::MTE2_S>();  // read by the scalar from here on, never written again
  }

  __aicore__ inline void Process() {
    const int64_t me = GetBlockIdx(), n = GetBlockNum();
    const bool ok = Send(me, n) && ReceiveAll(me, n);
    SyncAll();  // begins with PipeBarrier<PIPE_ALL> (2201 SyncAllImpl): this AIV's kept rows have
                // landed before any AIV reduces them
    if (ok && !c_.Aborted()) Reduce(me, n);
  }

 private:
  __aicore__ inline int64_t Dest(int64_t p) { return route_.Dest(p, t_->local_experts); }
  __aicore__ inline int64_t Count(int64_t i) { return counts_buf_.Get<int32_t>().GetValue(static_cast<uint32_t>(i)); }
  __aicore__ inline int64_t RowsFor(int64_t s) {
    return t_->reduce == REDUCE_EXPERT_RANK ? Count(2 * s) : Count(2 * s + 1);
  }

  // ---- send -----------------------------------------------------------------------------------

  __aicore__ inline bool Send(int64_t me, int64_t n) {
    const int64_t W = t_->world, K = t_->top_k;
    const LocalTensor<uint64_t> msg = msg_buf_.Get<uint64_t>();
    for (int64_t s = me; s < W; s += n) {
      Sync<HardEvent::MTE3_S>();  // the previous hello's copies have read msg
      for (uint32_t i = 0; i < 8; ++i) msg.SetValue(i, static_cast<uint64_t>(0));
      msg.SetValue(4, static_cast<uint64_t>(RowsFor(s)));
      SendCountMessage(c_, s, msg, 1);
    }
    const LocalTensor<uint8_t> row = row_buf_.Get<uint8_t>();
    int64_t item = 0;
    for (int64_t s = 0; s < W; ++s) {
      const int64_t tokens = Count(2 * s);
      for (int64_t j = 0; j < tokens; ++j, ++item) {
        if (item % n != me) continue;
        LoadSlot(s * t_->max_tokens + j);
        if (t_->reduce == REDUCE_EXPERT_RANK) {
          const LocalTensor<uint8_t> sum = SumLocalPairs();
          SendRow(c_, f_, sum, j, wire_buf_.Get<uint8_t>(), RowAt(s, j), Accumulator(s));
          continue;
        }
        int64_t p = SlotBase();
        for (int64_t k = 0; k < K; ++k) {
          const int32_t r = SlotRow(k);
          if (r < 0) continue;
          Sync<HardEvent::S_MTE2>();  // the previous row's encode has read `row`
          LoadRow(r);
          Sync<HardEvent::MTE2_S>();
          SendRow(c_, f_, row, p, wire_buf_.Get<uint8_t>(), RowAt(s, p), Accumulator(s));
          ++p;
        }
      }
    }
    c_.Bump(CNT_SENT);
    if (f_.mode == ubep::Mode::TFF) return true;
    for (int64_t s = me; s < W; s += n) {
      if (!c_.Poll(PHASE_SENT, -1, CounterIs{&c_, CNT_SENT, static_cast<int32_t>(n)})) return false;
      SendBatchRecord(c_, f_, Accumulator(s), c_.Slot(s) + rec_area_ + t_->rank * RECORD_STRIDE, RowsFor(s),
                      c_.epoch);
    }
    return true;
  }

  // The slot's recv_rows [K], recv_pair_weights [K] and recv_pair_base into slot_buf, for the scalar.
  __aicore__ inline void LoadSlot(int64_t slot) {
    const int64_t K = t_->top_k;
    Sync<HardEvent::S_MTE2>();  // the scalar has read the previous slot
    CopyIn(SlotPart<int32_t>(0), rows_[slot * K], 4 * K);
    CopyIn(SlotPart<float>(1), pair_w_[slot * K], 4 * K);
    CopyIn(SlotPart<int32_t>(2), pair_base_[slot], 4);
    Sync<HardEvent::MTE2_S>();
  }
  template <typename U>
  __aicore__ inline LocalTensor<U> SlotPart(int64_t i) {
    return slot_buf_.Get<uint8_t>()[static_cast<uint32_t>(i * RoundUp32(4 * t_->top_k))].template ReinterpretCast<U>();
  }
  __aicore__ inline int32_t SlotRow(int64_t k) { return SlotPart<int32_t>(0).GetValue(static_cast<uint32_t>(k)); }
  __aicore__ inline float SlotWeight(int64_t k) { return SlotPart<float>(1).GetValue(static_cast<uint32_t>(k)); }
  __aicore__ inline int64_t SlotBase() { return SlotPart<int32_t>(2).GetValue(0); }

  __aicore__ inline GM_ADDR RowAt(int64_t s, int64_t r) {
    return c_.Slot(s) + area_ + (t_->rank * t_->comb_rows + r) * f_.row_stride();
  }

  // Row `row` of `rows` into row_buf (MTE2); the caller orders its readers around it.
  __aicore__ inline void LoadRow(int64_t row) {
    CopyIn(row_buf_.Get<uint8_t>(), Gm<uint8_t>(rows_in_ + row * f_.row_bytes(), f_.row_bytes()), f_.row_bytes());
  }

  // acc = sum over k ascending of w * o for the loaded slot's pairs here, rounded to T; returns the
  // bytes to send (fp32: acc itself; else row_buf), their last vector write ordered before
  // SendRow's vector reads (V -> V). acc and term: V only; row_buf: MTE2 in, V reads, V writes the
  // rounded sum, SendRow encodes it.
  __aicore__ inline LocalTensor<uint8_t> SumLocalPairs() {
    const int64_t K = t_->top_k;
    const LocalTensor<float> acc = acc_buf_.Get<float>();
    Sync<HardEvent::S_V>();  // the previous token's encode has read acc (fp32) or row_buf
    Duplicate<float>(acc, 0.0f, static_cast<int32_t>(H_));
    // Every token received here has a pair here: its first pair's V_MTE2 and MTE2_V also order
    // the Duplicate before the Add (V -> V).
    for (int64_t k = 0; k < K; ++k) {
      const int32_t r = SlotRow(k);
      if (r < 0) continue;
      Sync<HardEvent::V_MTE2>();  // the previous term (and, after S_V above, the encode) has read row_buf
      LoadRow(r);
      Sync<HardEvent::MTE2_V>();
      AddTerm(acc, t_->weighted != 0, SlotWeight(k));
    }
    if constexpr (kF32) {
      return acc.template ReinterpretCast<uint8_t>();  // (AddTerm ends with PipeBarrier<PIPE_V>)
    } else {
      Cast(row_buf_.Get<T>(), acc, RoundMode::CAST_RINT, static_cast<int32_t>(H_));
      PipeBarrier<PIPE_V>();
      return row_buf_.Get<uint8_t>();
    }
  }

  // acc += (weighted ? w * o : o) for the row o in row_buf, in fp32, each product and sum rounded.
  // The caller ordered row_buf's copy-in before (MTE2 -> V); V -> V here.
  __aicore__ inline void AddTerm(const LocalTensor<float>& acc, bool weighted, float w) {
    if constexpr (kF32) {
      const LocalTensor<float> o = row_buf_.Get<float>();
      if (weighted) {
        Muls(o, o, w, static_cast<int32_t>(H_));
        PipeBarrier<PIPE_V>();
      }
      Add(acc, acc, o, static_cast<int32_t>(H_));
    } else {
      const LocalTensor<float> term = term_buf_.Get<float>();
      Cast(term, row_buf_.Get<T>(), RoundMode::CAST_NONE, static_cast<int32_t>(H_));
      PipeBarrier<PIPE_V>();
      if (weighted) {
        Muls(term, term, w, static_cast<int32_t>(H_));
        PipeBarrier<PIPE_V>();
      }
      Add(acc, acc, term, static_cast<int32_t>(H_));
    }
    PipeBarrier<PIPE_V>();
  }

  __aicore__ inline GlobalTensor<int32_t> Accumulator(int64_t peer) {
    return BatchAccumulator(c_.ws + t_->ws_collide, peer);
  }

  // ---- receive --------------------------------------------------------------------------------

  __aicore__ inline bool ReceiveAll(int64_t me, int64_t n) {
    // Copies out of the wire have finished before copies into it, and this AIV's hellos, rows and
    // records to its own window have landed before it reads them.
    Sync<HardEvent::MTE3_MTE2>();
    for (int64_t d = me; d < t_->world; d += n) {
      if (!ReceiveFrom(d)) return false;
    }
    return true;
  }

  // Rows from peer d, in the order d sent them: this die's pairs (or tokens) for d in (t, k) order.
  // row_buf: the decode writes it (V, then V -> S), MTE3 keeps it in the workspace (MTE3 -> S
  // before the next decode).
  __aicore__ inline bool ReceiveFrom(int64_t d) {
    const int64_t K = t_->top_k;
    const uint64_t epoch = c_.epoch;
    const GlobalTensor<uint64_t> hello = CountEntry(c_, d);
    if (!c_.Poll(PHASE_HELLO, d, WordsAre{&c_, hello, epoch, 0, 1})) return false;
    uint64_t payload[4];
    c_.Peek(hello[4], payload);
    const int64_t num_rows = static_cast<int64_t>(payload[0]);
    GM_ADDR batch = c_.Slot(t_->rank) + area_ + d * t_->comb_rows * f_.row_stride();
    GM_ADDR record = c_.Slot(t_->rank) + rec_area_ + d * RECORD_STRIDE;
    const LocalTensor<uint8_t> wire = wire_buf_.Get<uint8_t>(), row = row_buf_.Get<uint8_t>();
    if (f_.mode == ubep::Mode::SW || f_.mode == ubep::Mode::DC) {
      if (!c_.Poll(PHASE_RETURN, d, BatchIn{&c_, &f_, batch, record, num_rows, epoch, wire})) return false;
    }
    int64_t r = 0;
    for (int64_t tok = 0; tok < t_->num_tokens; ++tok) {
      for (int64_t k = 0; k < K; ++k) {
        if (Dest(tok * K + k) != d) continue;
        if (t_->reduce == REDUCE_EXPERT_RANK && !FirstPairOn(tok, k, d)) continue;
        Sync<HardEvent::MTE3_S>();  // the previous row's copy out of row_buf has finished
        if (!TakeRow(c_, PHASE_RETURN, d, f_, batch, record, num_rows, r, epoch, wire, row)) return false;
        Sync<HardEvent::S_MTE3>();
        const int64_t at = t_->reduce == REDUCE_EXPERT_RANK ? tok * t_->world + d : tok * K + k;
        CopyOut(Gm<uint8_t>(kept_ + at * f_.row_bytes(), f_.row_bytes()), row, f_.row_bytes());
        ++r;
      }
    }
    return true;
  }

  __aicore__ inline bool FirstPairOn(int64_t tok, int64_t k, int64_t d) {
    for (int64_t j = 0; j < k; ++j) {
      if (Dest(tok * t_->top_k + j) == d) return false;
    }
    return true;
  }

  __aicore__ inline bool TokenGoesTo(int64_t tok, int64_t d) {
    for (int64_t k = 0; k < t_->top_k; ++k) {
      if (Dest(tok * t_->top_k + k) == d) return true;
    }
    return false;
  }

  // ---- reduce ---------------------------------------------------------------------------------

  // Per token: row_buf MTE2 in, V reads; acc V only, then (fp32) MTE3 out or (else) V rounds it
  // into row_buf for MTE3.
  __aicore__ inline void Reduce(int64_t me, int64_t n) {
    const int64_t K = t_->top_k, W = t_->world;
    const bool by_rank = t_->reduce == REDUCE_EXPERT_RANK;
    const LocalTensor<float> acc = acc_buf_.Get<float>();
    // (The SyncAll's PipeBarrier<PIPE_ALL> ordered every earlier operation of this AIV.)
    for (int64_t tok = me; tok < t_->num_tokens; tok += n) {
      if (pairs_mode_) {
        ReducePairs(tok);
        continue;
      }
      // The previous token's copy out of acc or row_buf has finished. Through V this also orders
      // its rounding's reads of acc (V_MTE3 before that copy) before the Duplicate, and the copy
      // before this token's copies into row_buf (V_MTE2 below).
      Sync<HardEvent::MTE3_V>();
      Duplicate<float>(acc, 0.0f, static_cast<int32_t>(H_));
      PipeBarrier<PIPE_V>();
      for (int64_t i = 0; i < (by_rank ? W : K); ++i) {
        const bool valid = by_rank ? TokenGoesTo(tok, i) : route_.Expert(tok * K + i) >= 0;
        if (!valid) continue;
        Sync<HardEvent::V_MTE2>();  // the previous term has read row_buf
        CopyIn(row_buf_.Get<uint8_t>(),
               Gm<uint8_t>(kept_ + (tok * (by_rank ? W : K) + i) * f_.row_bytes(), f_.row_bytes()), f_.row_bytes());
        Sync<HardEvent::MTE2_V>();
        AddTerm(acc, !by_rank && t_->weighted != 0, by_rank ? 0.0f : route_.Weight(tok * K + i));
      }
      GlobalTensor<uint8_t> out = Gm<uint8_t>(y_ + tok * f_.row_bytes(), f_.row_bytes());
      if constexpr (kF32) {
        Sync<HardEvent::V_MTE3>();
        CopyOut(out, acc.template ReinterpretCast<uint8_t>(), f_.row_bytes());
      } else {
        Cast(row_buf_.Get<T>(), acc, RoundMode::CAST_RINT, static_cast<int32_t>(H_));
        Sync<HardEvent::V_MTE3>();
        CopyOut(out, row_buf_.Get<uint8_t>(), f_.row_bytes());
      }
    }
  }

  // PAIRS: y[tok, k] = the kept value of pair (tok, k), 0 at -1 slots. pairs_buf: MTE2 takes the
  // kept values in, the scalar writes y's, MTE3 sends them.
  __aicore__ inline void ReducePairs(int64_t tok) {
    const int64_t K = t_->top_k;
    const LocalTensor<float> in = pairs_buf_.Get<float>();
    const LocalTensor<float> y = pairs_buf_.Get<uint8_t>()[static_cast<uint32_t>(RoundUp32(4 * K))].ReinterpretCast<float>();
    Sync<HardEvent::S_MTE2>();  // the scalar has read the previous token's values
    CopyIn(in, Gm<float>(kept_ + tok * K * 4, 4 * K), 4 * K);
    Sync<HardEvent::MTE2_S>();
    Sync<HardEvent::MTE3_S>();  // the previous token's y has been copied out
    for (int64_t k = 0; k < K; ++k) {
      y.SetValue(static_cast<uint32_t>(k), route_.Expert(tok * K + k) >= 0 ? in.GetValue(static_cast<uint32_t>(k)) : 0.0f);
    }
    Sync<HardEvent::S_MTE3>();
    CopyOut(Gm<float>(y_ + tok * K * 4, 4 * K), y, 4 * K);
  }

  const EpTiling* t_;
  Ctx c_;
  ubep::WireFormat f_;
  Routing route_;
  bool pairs_mode_;
  int64_t area_, rec_area_, H_;
  GM_ADDR rows_in_;
  GM_ADDR y_;
  GM_ADDR kept_;
  GlobalTensor<float> pair_w_;
  GlobalTensor<int32_t> rows_, pair_base_;
  TBuf<TPosition::VECCALC> wire_buf_, row_buf_, acc_buf_, term_buf_, msg_buf_, counts_buf_, slot_buf_, pairs_buf_;
};

template <typename T>
__aicore__ inline void RunCombine(GM_ADDR rows, GM_ADDR topk_idx, GM_ADDR topk_weights, GM_ADDR recv_rows,
                                  GM_ADDR recv_pair_weights, GM_ADDR recv_pair_base, GM_ADDR recv_counts, GM_ADDR y,
                                  GM_ADDR scratch, const EpTiling* tiling, TPipe* pipe) {
  CombineKernel<T> op;
  op.Init(rows, topk_idx, topk_weights, recv_rows, recv_pair_weights, recv_pair_base, recv_counts, y, scratch,
          tiling, pipe);
  op.Process();
}

}  // namespace ubep_ascend

// The UbepCombine op's kernel (op_host/mc2/ubep_combine_def.cpp), laid out as ubep_dispatch's; the
// tiling's rows_dtype picks the instantiation: fp32 (and every PAIRS call), fp16 or bf16. A MIX
// kernel type: its hard SyncAll needs the inter-core scheduling an AIV_ONLY kernel does not get
// (A2/A3, SyncAll doc).
extern "C" __global__ __aicore__ void ubep_combine(GM_ADDR rows, GM_ADDR topk_idx, GM_ADDR topk_weights,
                                                   GM_ADDR recv_rows, GM_ADDR recv_pair_weights,
                                                   GM_ADDR recv_pair_base, GM_ADDR recv_counts, GM_ADDR y,
                                                   GM_ADDR scratch, GM_ADDR, GM_ADDR tiling) {
  KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIV_1_0);
  REGISTER_TILING_DEFAULT(ubep_ascend::EpOpTiling);
  GET_TILING_DATA_WITH_STRUCT(ubep_ascend::EpOpTiling, op_tiling, tiling);
  const ubep_ascend::EpTiling* t = &op_tiling.ep;
  AscendC::TPipe pipe;
  if (t->rows_dtype == ubep_ascend::ROW_FP32) {
    ubep_ascend::RunCombine<float>(rows, topk_idx, topk_weights, recv_rows, recv_pair_weights, recv_pair_base,
                                   recv_counts, y, scratch, t, &pipe);
  } else if (t->rows_dtype == ubep_ascend::ROW_FP16) {
    ubep_ascend::RunCombine<half>(rows, topk_idx, topk_weights, recv_rows, recv_pair_weights, recv_pair_base,
                                  recv_counts, y, scratch, t, &pipe);
  } else {
    ubep_ascend::RunCombine<bfloat16_t>(rows, topk_idx, topk_weights, recv_rows, recv_pair_weights,
                                        recv_pair_base, recv_counts, y, scratch, t, &pipe);
  }
}
