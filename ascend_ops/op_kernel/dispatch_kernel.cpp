// Dispatch, AIV-only, in two worker groups that run at once (no SyncAll on the path):
//
// count group, AIVs [0, n_count): per destination d, count this die's pairs for d's experts and
//   its tokens and pairs for d; write the count message into d's window. Then per source s, wait
//   for s's message, copy it to the workspace, bump CNT_COUNTS_IN. AIV 0 waits for all W, runs
//   CalCumSum (ubep::row_base: the deterministic receive rows) and raises CNT_BASES_READY.
// token group, AIVs [n_count, n_count + n_token): the hop-aware mapper (ubep::hop_aware) cuts the
//   per-destination token sequences into equal slices, one per AIV; each AIV sends its tokens once
//   per destination die (relay) into staging rows indexed by the token's ordinal among this die's
//   tokens for that destination, so no global offset is needed to send. Each row carries its route
//   (pair base, local expert, per-(source, expert) order and gate weight of each k). Then, per
//   source s, the AIV waits for the row offsets and for each row's arrival (tff / sp per row, sw /
//   dc per batch record) and copies it into every receive row of its local experts.
//
// Inputs: x [T, H], topk_idx [T, K] int64, topk_weights [T, K] fp32. Outputs: recv_x [R, H],
// recv_weights [R] fp32, tokens_per_expert [E_local] int64, recv_rows [W, T_max, K] int32 (-1 =
// pair not here), recv_pair_weights [W, T_max, K] fp32, recv_pair_base [W, T_max] int32,
// recv_counts [W, 2] int32 (tokens, pairs from each source).
#include "ep_common.h"
#include "ep_op_tiling.h"
#include "ubep/layout.h"
#include "ubep/mapping.h"

namespace ubep_ascend {

using namespace AscendC;

// Where the per-expert counters start in the token group's scratch (see TokenGroup).
#define SEEN_AT(W, n) (6 * (W) + 6 * ((n) + 1))

class DispatchKernel {
 public:
  __aicore__ inline void Init(GM_ADDR x, GM_ADDR topk_idx, GM_ADDR topk_weights, GM_ADDR recv_x,
                              GM_ADDR recv_weights, GM_ADDR tokens_per_expert, GM_ADDR recv_rows,
                              GM_ADDR recv_pair_weights, GM_ADDR recv_pair_base, GM_ADDR recv_counts,
                              GM_ADDR scratch, const EpTiling* tiling) {
    t_ = tiling;
    c_.Init(tiling, scratch);
    f_ = dispatch_format(*t_);
    x_ = x;
    recv_x_ = recv_x;
    idx_.SetGlobalBuffer(reinterpret_cast<__gm__ int64_t*>(topk_idx), t_->num_tokens * t_->top_k);
    w_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(topk_weights), t_->num_tokens * t_->top_k);
    recv_w_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(recv_weights));
    tpe_ = tokens_per_expert;
    rows_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(recv_rows));
    pair_w_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(recv_pair_weights));
    pair_base_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(recv_pair_base));
    counts_out_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(recv_counts));
    row_bytes_ = t_->hidden * t_->elem_bytes;
    const int64_t stride = f_.row_stride();
    pipe_.InitBuffer(wire_q_, 1, stride);
    pipe_.InitBuffer(row_buf_, f_.row_bytes());
    pipe_.InitBuffer(small_buf_, t_->cnt_stride);
    pipe_.InitBuffer(scratch_buf_, 8 * (SEEN_AT(t_->world, t_->n_token) + 2 * t_->num_experts));
  }

  __aicore__ inline void Process() {
    if (GetBlockIdx() < t_->n_count) {
      CountGroup(GetBlockIdx());
    } else {
      TokenGroup(GetBlockIdx() - t_->n_count);
    }
  }

 private:
  __aicore__ inline int64_t Dest(int64_t p) const {
    const int64_t e = idx_.GetValue(p);
    return e >= 0 ? e / t_->local_experts : -1;
  }

  // ---- count group --------------------------------------------------------------------------

  __aicore__ inline void CountGroup(int64_t me) {
    const int64_t W = t_->world, L = t_->local_experts, K = t_->top_k;
    LocalTensor<uint64_t> msg = small_buf_.Get<uint64_t>();
    for (int64_t d = me; d < W; d += t_->n_count) {
      Duplicate<uint64_t>(msg, 0, t_->cnt_stride / 8);
      for (int64_t tok = 0; tok < t_->num_tokens; ++tok) {
        bool any = false;
        for (int64_t k = 0; k < K; ++k) {
          if (Dest(tok * K + k) != d) continue;
          any = true;
          msg.SetValue(6 + idx_.GetValue(tok * K + k) % L, msg.GetValue(6 + idx_.GetValue(tok * K + k) % L) + 1);
          msg.SetValue(5, msg.GetValue(5) + 1);
        }
        if (any) msg.SetValue(4, msg.GetValue(4) + 1);
      }
      SendCountMessage(c_, d, msg, 2 + L);
    }
    const int64_t row_words = (2 + L + 3) / 4 * 4;
    for (int64_t s = me; s < W; s += t_->n_count) {
      GlobalTensor<uint64_t> entry = CountEntry(c_, s);
      if (!c_.Poll(PHASE_COUNTS, s, [&] { return entry.GetValue(0) == static_cast<uint64_t>(t_->epoch); })) return;
      DataCopy(msg, entry[4], row_words);
      GlobalTensor<uint64_t> keep;
      keep.SetGlobalBuffer(reinterpret_cast<__gm__ uint64_t*>(c_.ws + t_->ws_data) + s * row_words);
      DataCopy(keep, msg, row_words);
      c_.Bump(CNT_COUNTS_IN, msg.ReinterpretCast<int32_t>());
    }
    if (me == 0) CalCumSum(row_words);
  }

  // Row bases of every (source, local expert) from the gathered counts; tokens_per_expert.
  __aicore__ inline void CalCumSum(int64_t row_words) {
    const int64_t W = t_->world, L = t_->local_experts;
    if (!c_.Poll(PHASE_COUNTS, -1, [&] { return c_.Counter(CNT_COUNTS_IN) == W; })) return;
    LocalTensor<int64_t> s = scratch_buf_.Get<int64_t>();
    int64_t* counts_WL = s.GetPhyAddr();
    int64_t* base_WL = counts_WL + W * L;
    GlobalTensor<int64_t> kept;
    kept.SetGlobalBuffer(reinterpret_cast<__gm__ int64_t*>(c_.ws + t_->ws_data));
    for (int64_t src = 0; src < W; ++src) {
      for (int64_t l = 0; l < L; ++l) counts_WL[src * L + l] = kept.GetValue(src * row_words + 2 + l);
    }
    ubep::row_base(counts_WL, W, L, L, t_->capacity, base_WL);
    GlobalTensor<int64_t> bases, tpe;
    bases.SetGlobalBuffer(reinterpret_cast<__gm__ int64_t*>(c_.ws + t_->ws_bases));
    tpe.SetGlobalBuffer(reinterpret_cast<__gm__ int64_t*>(tpe_));
    for (int64_t i = 0; i < W * L; ++i) bases.SetValue(i, base_WL[i]);
    for (int64_t l = 0; l < L; ++l) {
      int64_t n = 0;
      for (int64_t src = 0; src < W; ++src) n += counts_WL[src * L + l];
      tpe.SetValue(l, n);
    }
    c_.Bump(CNT_BASES_READY, small_buf_.Get<int32_t>());
  }

  // ---- token group: send --------------------------------------------------------------------

  __aicore__ inline void TokenGroup(int64_t me) {
    const int64_t W = t_->world, n = t_->n_token;
    LocalTensor<int64_t> s = scratch_buf_.Get<int64_t>();
    int64_t* counts_D = s.GetPhyAddr();
    // Scratch, int64: counts [W], order [W], cumsum [W], lo, hi, worker_ptr [n + 1] each, then
    // dest, start, length [W + n] each; SendSlice's per-expert counters follow (SEEN_AT).
    ubep::Scratch sc{counts_D + W, counts_D + 2 * W, counts_D + 3 * W, counts_D + 3 * W + n + 1};
    int64_t* ptr = counts_D + 3 * W + 2 * (n + 1);
    ubep::Pieces pieces{ptr, ptr + n + 1, ptr + n + 1 + W + n, ptr + n + 1 + 2 * (W + n)};
    for (int64_t d = 0; d < W; ++d) counts_D[d] = 0;
    for (int64_t tok = 0; tok < t_->num_tokens; ++tok) {
      for (int64_t d = 0; d < W; ++d) counts_D[d] += TokenGoesTo(tok, d) ? 1 : 0;
    }
    ubep::hop_aware(counts_D, W, n, sc, pieces);
    for (int64_t p = pieces.worker_ptr[me]; p < pieces.worker_ptr[me + 1]; ++p) {
      SendSlice(pieces.dest[p], pieces.start[p], pieces.length[p]);
    }
    c_.Bump(CNT_SENT, small_buf_.Get<int32_t>());
    if (f_.mode != ubep::Mode::TFF) {
      for (int64_t d = me; d < W; d += n) {
        if (!c_.Poll(PHASE_SENT, -1, [&] { return c_.Counter(CNT_SENT) == n; })) return;
        SendBatchRecord(d, counts_D[d]);
      }
    }
    for (int64_t src = me; src < W; src += n) {
      if (!Receive(src)) return;
    }
  }

  __aicore__ inline bool TokenGoesTo(int64_t tok, int64_t d) const {
    for (int64_t k = 0; k < t_->top_k; ++k) {
      if (Dest(tok * t_->top_k + k) == d) return true;
    }
    return false;
  }

  // Tokens with ordinals [start, start + len) among this die's tokens for d. The route of each is
  // found by one local scan: pairs for d of earlier tokens (pair base) and, per expert, earlier
  // pairs (the order inside (this source, expert)).
  __aicore__ inline void SendSlice(int64_t d, int64_t start, int64_t len) {
    const int64_t K = t_->top_k, L = t_->local_experts;
    int64_t* seen_L = scratch_buf_.Get<int64_t>().GetPhyAddr() + SEEN_AT(t_->world, t_->n_token);
    for (int64_t l = 0; l < L; ++l) seen_L[l] = 0;
    int64_t ordinal = 0, pairs = 0;
    LocalTensor<uint8_t> row = row_buf_.Get<uint8_t>();
    for (int64_t tok = 0; tok < t_->num_tokens && ordinal < start + len; ++tok) {
      if (!TokenGoesTo(tok, d)) continue;
      if (ordinal >= start) {
        DataCopyExtParams one{1, static_cast<uint32_t>(row_bytes_), 0, 0, 0};
        GlobalTensor<uint8_t> src;
        src.SetGlobalBuffer(x_ + tok * row_bytes_, row_bytes_);
        DataCopyPad(row, src, one, DataCopyPadExtParams<uint8_t>{});
        for (int64_t i = row_bytes_; i < f_.row_bytes(); ++i) row.SetValue(i, 0);
        int32_t* route = reinterpret_cast<int32_t*>(row.GetPhyAddr() + row_bytes_);
        route[0] = static_cast<int32_t>(pairs);
        for (int64_t k = 0; k < K; ++k) {
          const int64_t e = idx_.GetValue(tok * K + k);
          const bool here = e >= 0 && e / L == d;
          route[1 + k] = here ? static_cast<int32_t>(e % L) : -1;
          route[1 + K + k] = here ? static_cast<int32_t>(seen_L[e % L]) : -1;
          const float w = w_.GetValue(tok * K + k);
          route[1 + 2 * K + k] = FloatBits(w);
        }
        SendRow(d, ordinal);
      }
      for (int64_t k = 0; k < K; ++k) {
        const int64_t e = idx_.GetValue(tok * K + k);
        if (e >= 0 && e / L == d) {
          ++seen_L[e % L];
          ++pairs;
        }
      }
      ++ordinal;
    }
  }

  __aicore__ inline void SendRow(int64_t d, int64_t ordinal) {
    uint8_t* dst = c_.Slot(d) + t_->disp_off + (t_->rank * t_->disp_rows + ordinal) * f_.row_stride();
    ubep_ascend::SendRow(f_, row_buf_.Get<uint8_t>().GetPhyAddr(), ordinal, static_cast<uint64_t>(t_->epoch),
                         wire_q_, dst, Accumulator(d), small_buf_.Get<int32_t>());
  }

  __aicore__ inline __gm__ int32_t* Accumulator(int64_t peer) {
    return BatchAccumulator(c_.ws + t_->ws_collide, peer);
  }

  __aicore__ inline void SendBatchRecord(int64_t d, int64_t num_rows) {
    ubep_ascend::SendBatchRecord(f_, Accumulator(d), c_.Slot(d) + t_->disp_rec_off + t_->rank * RECORD_STRIDE,
                                 num_rows, static_cast<uint64_t>(t_->epoch), small_buf_.Get<uint64_t>());
  }

  // ---- token group: receive -----------------------------------------------------------------

  __aicore__ inline bool Receive(int64_t src) {
    const int64_t L = t_->local_experts;
    const uint64_t epoch = static_cast<uint64_t>(t_->epoch);
    if (!c_.Poll(PHASE_OFFSETS, -1, [&] { return c_.Counter(CNT_BASES_READY) == 1; })) return false;
    const int64_t row_words = (2 + L + 3) / 4 * 4;
    GlobalTensor<int64_t> kept, bases;
    kept.SetGlobalBuffer(reinterpret_cast<__gm__ int64_t*>(c_.ws + t_->ws_data) + src * row_words);
    bases.SetGlobalBuffer(reinterpret_cast<__gm__ int64_t*>(c_.ws + t_->ws_bases) + src * L);
    const int64_t num_rows = kept.GetValue(0);
    counts_out_.SetValue(2 * src, static_cast<int32_t>(num_rows));
    counts_out_.SetValue(2 * src + 1, static_cast<int32_t>(kept.GetValue(1)));
    uint8_t* batch = c_.Slot(t_->rank) + t_->disp_off + src * t_->disp_rows * f_.row_stride();
    uint8_t* record = c_.Slot(t_->rank) + t_->disp_rec_off + src * RECORD_STRIDE;
    LocalTensor<uint64_t> rec = small_buf_.Get<uint64_t>();
    LocalTensor<uint8_t> wire = wire_q_.AllocTensor<uint8_t>();
    if (f_.mode == ubep::Mode::SW || f_.mode == ubep::Mode::DC) {
      if (!c_.Poll(PHASE_TOKENS, src, [&] { return BatchComplete(batch, record, num_rows, wire, rec); })) return false;
    }
    LocalTensor<uint8_t> row = row_buf_.Get<uint8_t>();
    for (int64_t r = 0; r < num_rows; ++r) {
      if (!TakeRow(c_, PHASE_TOKENS, src, f_, batch, record, num_rows, r, epoch, wire, rec, row.GetPhyAddr())) {
        return false;
      }
      Replicate(src, r, row, bases);
    }
    wire_q_.FreeTensor(wire);
    return true;
  }

  __aicore__ inline bool BatchComplete(uint8_t* batch, uint8_t* record, int64_t num_rows,
                                       const LocalTensor<uint8_t>& wire, const LocalTensor<uint64_t>& rec) {
    return ubep_ascend::BatchComplete(f_, batch, record, num_rows, static_cast<uint64_t>(t_->epoch), wire,
                                      rec);
  }

  // Row r from src into the receive row of each of its pairs held here.
  __aicore__ inline void Replicate(int64_t src, int64_t r, const LocalTensor<uint8_t>& row,
                                   const GlobalTensor<int64_t>& bases) {
    const int64_t K = t_->top_k;
    const int32_t* route = reinterpret_cast<const int32_t*>(row.GetPhyAddr() + row_bytes_);
    const int64_t slot = src * t_->max_tokens + r;
    pair_base_.SetValue(slot, route[0]);
    for (int64_t k = 0; k < K; ++k) {
      const int32_t local = route[1 + k];
      const float w = BitsFloat(route[1 + 2 * K + k]);
      int64_t dest_row = -1;
      if (local >= 0) {
        dest_row = bases.GetValue(local) + route[1 + K + k];
        GlobalTensor<uint8_t> out;
        out.SetGlobalBuffer(recv_x_ + dest_row * row_bytes_, row_bytes_);
        DataCopyPad(out, row, DataCopyExtParams{1, static_cast<uint32_t>(row_bytes_), 0, 0, 0});
        recv_w_.SetValue(dest_row, w);
      }
      rows_.SetValue(slot * K + k, static_cast<int32_t>(dest_row));
      pair_w_.SetValue(slot * K + k, local >= 0 ? w : 0.0f);
    }
  }

  const EpTiling* t_;
  Ctx c_;
  ubep::WireFormat f_;
  GM_ADDR x_, recv_x_, tpe_;
  GlobalTensor<int64_t> idx_;
  GlobalTensor<float> w_, recv_w_, pair_w_;
  GlobalTensor<int32_t> rows_, pair_base_, counts_out_;
  int64_t row_bytes_;
  TPipe pipe_;
  TQue<TPosition::VECOUT, 1> wire_q_;
  TBuf<TPosition::VECCALC> row_buf_, small_buf_, scratch_buf_;
};

}  // namespace ubep_ascend

// The UbepDispatch op's kernel (op_host/mc2/ubep_dispatch_def.cpp): its inputs, its outputs (the
// last, `scratch`, zeroed by the caller), the framework's workspace (ubep keeps nothing there) and
// the tiling. The windows come from the op's HCCL group.
extern "C" __global__ __aicore__ void ubep_dispatch(GM_ADDR x, GM_ADDR topk_idx, GM_ADDR topk_weights,
                                                    GM_ADDR recv_x, GM_ADDR recv_weights,
                                                    GM_ADDR tokens_per_expert, GM_ADDR recv_rows,
                                                    GM_ADDR recv_pair_weights, GM_ADDR recv_pair_base,
                                                    GM_ADDR recv_counts, GM_ADDR scratch, GM_ADDR,
                                                    GM_ADDR tiling) {
  KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_AIV_ONLY);
  REGISTER_TILING_DEFAULT(ubep_ascend::EpOpTiling);
  GET_TILING_DATA_WITH_STRUCT(ubep_ascend::EpOpTiling, op_tiling, tiling);
  ubep_ascend::DispatchKernel op;
  op.Init(x, topk_idx, topk_weights, recv_x, recv_weights, tokens_per_expert, recv_rows, recv_pair_weights,
          recv_pair_base, recv_counts, scratch, &op_tiling.ep);
  op.Process();
}
