// Dispatch, AIV-only, in two worker groups that run at once (no SyncAll on the path):
//
// count group, AIVs [0, n_count): per destination d, count this die's pairs for d's experts and
//   its tokens and pairs for d (vector counts over the routing, ep_scan.h); write the count
//   message into d's window. Then per source s, wait for s's message, copy it to the workspace,
//   bump CNT_COUNTS_IN. AIV 0 waits for all W, runs CalCumSum (RowBase: the deterministic receive
//   rows of ubep::row_base) and raises CNT_BASES_READY.
// token group, AIVs [n_count, n_count + n_token): each AIV counts this die's tokens per destination
//   (ep_scan.h); UBEP's mapper (HopBalancedPieces, ubep::hop_balanced) cuts each hop class's
//   token sequence into equal slices, one per AIV; each AIV sends its tokens once per
//   destination die (relay) into staging rows indexed by the token's ordinal among this die's
//   tokens for that destination, so no global offset is needed to send.
//   Each row carries its route (pair base, local expert, per-(source, expert) order and gate weight
//   of each k). Then, per source s, the AIV waits for the row offsets and for each row's arrival
//   (tff / sp per row, sw / dc per batch record) and copies it into every receive row of its local
//   experts.
//
// Every output is written by DMA (MTE3 writes exactly the bytes asked), never by scalar GM stores:
// AIVs write neighbouring elements of recv_counts, recv_rows, recv_weights, ... (A2/A3: a scalar
// store dirties a private 64-byte DCache line, whose write-back would erase the neighbours').
//
// Inputs: x [T, H], topk_idx [T, K] int64, topk_weights [T, K] fp32. Outputs: recv_x [R, H],
// recv_weights [R] fp32, tokens_per_expert [E_local] int64, recv_rows [W, T_max, K] int32 (-1 =
// pair not here), recv_pair_weights [W, T_max, K] fp32, recv_pair_base [W, T_max] int32,
// recv_counts [W, 2] int32 (tokens, pairs from each source).
#include "ep_common.h"
#include "ep_map.h"
#include "op_tiling.h"
#include "ep_routing.h"
#include "ep_scan.h"

namespace ubep_ascend {

using namespace AscendC;

class DispatchKernel {
 public:
  __aicore__ inline void Init(GM_ADDR x, GM_ADDR topk_idx, GM_ADDR topk_weights, GM_ADDR recv_x,
                              GM_ADDR recv_weights, GM_ADDR tokens_per_expert, GM_ADDR recv_rows,
                              GM_ADDR recv_pair_weights, GM_ADDR recv_pair_base, GM_ADDR recv_counts,
                              GM_ADDR scratch, const EpTiling* tiling, TPipe* pipe) {
    t_ = tiling;
    c_.Init(tiling, scratch);
    f_ = dispatch_format(*t_);
    const int64_t W = t_->world, L = t_->local_experts, K = t_->top_k;
    x_ = x;
    recv_x_ = recv_x;
    recv_w_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(recv_weights));
    tpe_.SetGlobalBuffer(reinterpret_cast<__gm__ int64_t*>(tokens_per_expert), L);
    rows_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(recv_rows));
    pair_w_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(recv_pair_weights));
    pair_base_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(recv_pair_base));
    counts_out_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(recv_counts), 2 * W);
    row_bytes_ = t_->hidden * t_->elem_bytes;
    row_words_ = (2 + L + 3) / 4 * 4;
    c_.InitBuffers(pipe);
    c_.TakeCallNumber();
    c_.InitSentinel(pipe, f_);
    route_.Init(topk_idx, topk_weights, t_->num_tokens, K, pipe);
    pipe->InitBuffer(wire_buf_, static_cast<uint32_t>(f_.row_stride()));
    pipe->InitBuffer(row_buf_, static_cast<uint32_t>(RoundUp32(f_.row_bytes())));
    pipe->InitBuffer(msg_buf_, static_cast<uint32_t>(t_->cnt_stride));
    // int64 scratch: CalCumSum's gathered counts [W * row_words], bases [W * L], tokens_per_expert
    // [L]; or the token group's counts, order, cumsum [W each], pieces [3 W], per-expert orders [L].
    const int64_t w4 = (W + 3) / 4 * 4, l4 = (L + 3) / 4 * 4;
    const int64_t cum = W * row_words_ + (W * L + 3) / 4 * 4 + l4, tok = 6 * w4 + l4;
    pipe->InitBuffer(sched_buf_, static_cast<uint32_t>(8 * (cum > tok ? cum : tok)));
    // Per received row, staged for the DMA: recv_rows [K] int32, recv_pair_weights [K] fp32,
    // recv_pair_base, recv_counts, then recv_weights one per 32-byte block (a DMA source is 32-byte
    // aligned in UB).
    o_pw_ = RoundUp32(4 * K);
    o_base_ = o_pw_ + RoundUp32(4 * K);
    o_counts_ = o_base_ + 32;
    o_w_ = o_counts_ + 32;
    pipe->InitBuffer(out_buf_, static_cast<uint32_t>(o_w_ + 32 * K));
    pipe->InitBuffer(bases_buf_, static_cast<uint32_t>(RoundUp32(8 * L)));
    // Per window of the routing, the count group counts its destinations' L experts and tokens
    // (tallied per destination: L pair counts, then tokens), the token group the tokens for every
    // die.
    const bool counting = GetBlockIdx() < t_->n_count;
    const int64_t mine = counting ? (W - GetBlockIdx() + t_->n_count - 1) / t_->n_count : 0;
    scan_.Init(K, L, route_.WindowTokens(K), counting ? mine * (L + 1) : W, pipe);
    pipe->InitBuffer(tally_buf_, static_cast<uint32_t>(RoundUp32(8 * (counting ? mine * (L + 1) : 1))));
  }

  __aicore__ inline void Process() {
    if (GetBlockIdx() < t_->n_count) {
      CountGroup(GetBlockIdx());
    } else {
      TokenGroup(GetBlockIdx() - t_->n_count);
    }
  }

 private:
  __aicore__ inline int64_t Dest(int64_t p) { return route_.Dest(p, t_->local_experts); }

  // ---- count group --------------------------------------------------------------------------

  // tally (scalar): the vector counts of the routing, window by window, per destination of this
  // AIV. msg: V fills zeros, the scalar writes the tally, MTE3 sends; then MTE2 takes a source's
  // entry in and MTE3 keeps it in the workspace.
  __aicore__ inline void CountGroup(int64_t me) {
    const int64_t W = t_->world, L = t_->local_experts, n = t_->n_count;
    const int64_t mine = (W - me + n - 1) / n, stride = L + 1;  // tally and result slots alike
    const LocalTensor<int64_t> tally = tally_buf_.Get<int64_t>();
    for (int64_t i = 0; i < mine * stride; ++i) tally.SetValue(static_cast<uint32_t>(i), 0);
    for (int64_t w = 0; w < route_.Windows(); ++w) {
      ScanWindow(w);
      for (int64_t j = 0; j < mine; ++j) {
        const int64_t d = me + j * n;
        for (int64_t l = 0; l < L; ++l) scan_.PairsOf(d * L + l, j * stride + l);
        scan_.TokensOn(d, j * stride + L);
      }
      scan_.Collect();
      for (int64_t j = 0; j < mine; ++j) {
        for (int64_t l = 0; l < L; ++l) Tally(tally, j * stride + l, scan_.Pairs(j * stride + l));
        Tally(tally, j * stride + L, scan_.Tokens(j * stride + L));
      }
    }
    const LocalTensor<uint64_t> msg = msg_buf_.Get<uint64_t>();
    for (int64_t j = 0; j < mine; ++j) {
      Sync<HardEvent::MTE3_V>();  // the previous message's copies have read msg
      Duplicate<int32_t>(msg.ReinterpretCast<int32_t>(), 0, static_cast<int32_t>(t_->cnt_stride / 4));
      Sync<HardEvent::V_S>();
      int64_t pairs = 0;
      for (int64_t l = 0; l < L; ++l) {
        const int64_t c = tally.GetValue(static_cast<uint32_t>(j * stride + l));
        msg.SetValue(static_cast<uint32_t>(6 + l), static_cast<uint64_t>(c));
        pairs += c;
      }
      msg.SetValue(5, static_cast<uint64_t>(pairs));
      msg.SetValue(4, static_cast<uint64_t>(tally.GetValue(static_cast<uint32_t>(j * stride + L))));
      SendCountMessage(c_, me + j * n, msg, 2 + L);
    }
    // msg's copies out have finished before copies into it; the message to this die's own window,
    // which this AIV may poll below, has landed.
    Sync<HardEvent::MTE3_MTE2>();
    for (int64_t s = me; s < W; s += n) {
      const GlobalTensor<uint64_t> entry = CountEntry(c_, s);
      if (!c_.Poll(PHASE_COUNTS, s, WordsAre{&c_, entry, c_.epoch, 0, 1})) return;
      DataCopy(msg, entry[4], static_cast<uint32_t>(row_words_));
      Sync<HardEvent::MTE2_MTE3>();
      DataCopy(Gm<uint64_t>(c_.ws + t_->ws_data + s * row_words_ * 8, row_words_ * 8), msg,
               static_cast<uint32_t>(row_words_));
      c_.Bump(CNT_COUNTS_IN);  // its read-back MTE3_MTE2 also makes the next entry wait for this copy
    }
    if (me == 0) CalCumSum();
  }

  // Routing window w, loaded and prepared for the vector counts.
  __aicore__ inline void ScanWindow(int64_t w) {
    int64_t pairs = 0;
    const LocalTensor<int64_t> ids = route_.LoadWindow(w, &pairs);
    scan_.Prepare(ids, pairs);
  }

  __aicore__ inline void Tally(const LocalTensor<int64_t>& tally, int64_t i, int64_t add) {
    tally.SetValue(static_cast<uint32_t>(i), tally.GetValue(static_cast<uint32_t>(i)) + add);
  }

  // Row bases of every (source, local expert) from the gathered counts, and tokens_per_expert.
  // sched: MTE2 takes the counts in, the scalar reads them and writes bases and totals, MTE3 sends.
  __aicore__ inline void CalCumSum() {
    const int64_t W = t_->world, L = t_->local_experts;
    if (!c_.Poll(PHASE_COUNTS, -1, CounterIs{&c_, CNT_COUNTS_IN, static_cast<int32_t>(W)})) return;
    const LocalTensor<int64_t> s = sched_buf_.Get<int64_t>();
    const int64_t nb = W * row_words_, nt = nb + (W * L + 3) / 4 * 4;
    const LocalTensor<int64_t> counts = s, bases = s[static_cast<uint32_t>(nb)], tpe = s[static_cast<uint32_t>(nt)];
    DataCopy(counts, Gm<int64_t>(c_.ws + t_->ws_data, nb * 8), static_cast<uint32_t>(nb));
    Sync<HardEvent::MTE2_S>();
    RowBase(counts, row_words_, 2, W, L, t_->capacity, bases, tpe);
    Sync<HardEvent::S_MTE3>();
    CopyOut(Gm<int64_t>(c_.ws + t_->ws_bases, W * L * 8), bases, W * L * 8);
    CopyOut(tpe_, tpe, L * 8);
    c_.Bump(CNT_BASES_READY);  // after both copies have landed
  }

  // ---- token group: send --------------------------------------------------------------------

  // sched (scalar only): tokens per destination (from the vector counts), the mapper's order,
  // cumsum and pieces, per-expert orders.
  __aicore__ inline void TokenGroup(int64_t me) {
    const int64_t W = t_->world, n = t_->n_token, w4 = (W + 3) / 4 * 4;
    const LocalTensor<int64_t> s = sched_buf_.Get<int64_t>();
    const LocalTensor<int64_t> counts = s, order = s[static_cast<uint32_t>(w4)],
                               cumsum = s[static_cast<uint32_t>(2 * w4)], pieces = s[static_cast<uint32_t>(3 * w4)];
    seen_ = s[static_cast<uint32_t>(6 * w4)];
    for (int64_t d = 0; d < W; ++d) counts.SetValue(static_cast<uint32_t>(d), 0);
    for (int64_t w = 0; w < route_.Windows(); ++w) {
      ScanWindow(w);
      for (int64_t d = 0; d < W; ++d) scan_.TokensOn(d, d);
      scan_.Collect();
      for (int64_t d = 0; d < W; ++d) Tally(counts, d, scan_.Tokens(d));
    }
    const int64_t num = HopBalancedPieces(counts, W, t_->rank, t_->dies_per_npu, t_->dies_per_board, n, me, order,
                                          cumsum, pieces);
    for (int64_t p = 0; p < num; ++p) {
      SendSlice(pieces.GetValue(static_cast<uint32_t>(3 * p)), pieces.GetValue(static_cast<uint32_t>(3 * p + 1)),
                pieces.GetValue(static_cast<uint32_t>(3 * p + 2)));
    }
    c_.Bump(CNT_SENT);
    if (f_.mode != ubep::Mode::TFF) {
      for (int64_t d = me; d < W; d += n) {
        if (!c_.Poll(PHASE_SENT, -1, CounterIs{&c_, CNT_SENT, static_cast<int32_t>(n)})) return;
        SendBatchRecord(c_, f_, Accumulator(d), c_.Slot(d) + t_->disp_rec_off + t_->rank * RECORD_STRIDE,
                        counts.GetValue(static_cast<uint32_t>(d)), c_.epoch);
      }
    }
    // Copies out of the wire (rows) and of out_buf have finished before this AIV's copies into
    // UB, and its rows and records to its own window have landed before it reads them.
    Sync<HardEvent::MTE3_MTE2>();
    for (int64_t src = me; src < W; src += n) {
      if (!Receive(src)) return;
    }
  }

  __aicore__ inline bool TokenGoesTo(int64_t tok, int64_t d) {
    for (int64_t k = 0; k < t_->top_k; ++k) {
      if (Dest(tok * t_->top_k + k) == d) return true;
    }
    return false;
  }

  // Tokens with ordinals [start, start + len) among this die's tokens for d. The route of each is
  // found by one local scan: pairs for d of earlier tokens (pair base) and, per expert, earlier
  // pairs (the order inside (this source, expert)). row: MTE2 takes the token in, the scalar
  // appends the route and encodes it (SendRow).
  __aicore__ inline void SendSlice(int64_t d, int64_t start, int64_t len) {
    const int64_t K = t_->top_k, L = t_->local_experts;
    for (int64_t l = 0; l < L; ++l) seen_.SetValue(static_cast<uint32_t>(l), 0);
    int64_t ordinal = 0, pairs = 0;
    const LocalTensor<uint8_t> row = row_buf_.Get<uint8_t>();
    for (int64_t tok = 0; tok < t_->num_tokens && ordinal < start + len; ++tok) {
      if (!TokenGoesTo(tok, d)) continue;
      if (ordinal >= start) {
        Sync<HardEvent::S_MTE2>();  // the previous row's encode has read `row`
        CopyIn(row, Gm<uint8_t>(x_ + tok * row_bytes_, row_bytes_), row_bytes_);
        Sync<HardEvent::MTE2_S>();  // (the copy also pads the row's last 32-byte block: the route comes after it)
        ZeroBytes(row, row_bytes_, f_.row_bytes());
        PutU32(row, row_bytes_, static_cast<uint32_t>(pairs));
        for (int64_t k = 0; k < K; ++k) {
          const int64_t e = route_.Expert(tok * K + k);
          const bool here = e >= 0 && e / L == d;
          const int64_t at = row_bytes_ + 4 * (1 + k);
          PutU32(row, at, static_cast<uint32_t>(here ? e % L : -1));
          PutU32(row, at + 4 * K,
                 static_cast<uint32_t>(here ? seen_.GetValue(static_cast<uint32_t>(e % L)) : -1));
          PutU32(row, at + 8 * K, static_cast<uint32_t>(FloatBits(route_.Weight(tok * K + k))));
        }
        GM_ADDR dst = c_.Slot(d) + t_->disp_off + (t_->rank * t_->disp_rows + ordinal) * f_.row_stride();
        SendRow(c_, f_, row, ordinal, wire_buf_.Get<uint8_t>(), dst, Accumulator(d));
      }
      for (int64_t k = 0; k < K; ++k) {
        const int64_t e = route_.Expert(tok * K + k);
        if (e >= 0 && e / L == d) {
          seen_.SetValue(static_cast<uint32_t>(e % L), seen_.GetValue(static_cast<uint32_t>(e % L)) + 1);
          ++pairs;
        }
      }
      ++ordinal;
    }
  }

  __aicore__ inline GlobalTensor<int32_t> Accumulator(int64_t peer) {
    return BatchAccumulator(c_.ws + t_->ws_collide, peer);
  }

  // ---- token group: receive -----------------------------------------------------------------

  // out_buf: the scalar stages, MTE3 sends (MTE3 -> S before it is staged again). bases: MTE2 in,
  // the scalar reads. The caller ordered the send phase's copies out of the wire before.
  __aicore__ inline bool Receive(int64_t src) {
    const int64_t L = t_->local_experts;
    const uint64_t epoch = c_.epoch;
    if (!c_.Poll(PHASE_OFFSETS, -1, CounterIs{&c_, CNT_BASES_READY, 1})) return false;
    uint64_t kept[4];
    c_.Peek(Gm<uint64_t>(c_.ws + t_->ws_data + src * row_words_ * 8, 32), kept);
    const int64_t num_rows = static_cast<int64_t>(kept[0]);
    // The Peek's S_MTE2 has ordered the previous source's reads of bases before this copy; the
    // scalar reads them only in Replicate, after TakeRow's copy-in and its MTE2_S.
    const LocalTensor<int64_t> bases = bases_buf_.Get<int64_t>();
    CopyIn(bases, Gm<int64_t>(c_.ws + t_->ws_bases + src * L * 8, L * 8), L * 8);
    const LocalTensor<uint8_t> out = out_buf_.Get<uint8_t>(), row = row_buf_.Get<uint8_t>();
    const LocalTensor<int32_t> counts = out[static_cast<uint32_t>(o_counts_)].ReinterpretCast<int32_t>();
    Sync<HardEvent::MTE3_S>();  // the previous source's copies out of out_buf and row have finished
    counts.SetValue(0, static_cast<int32_t>(num_rows));
    counts.SetValue(1, static_cast<int32_t>(kept[1]));
    Sync<HardEvent::S_MTE3>();
    CopyOut(counts_out_[2 * src], counts, 8);
    GM_ADDR batch = c_.Slot(t_->rank) + t_->disp_off + src * t_->disp_rows * f_.row_stride();
    GM_ADDR record = c_.Slot(t_->rank) + t_->disp_rec_off + src * RECORD_STRIDE;
    const LocalTensor<uint8_t> wire = wire_buf_.Get<uint8_t>();
    if (f_.mode == ubep::Mode::SW || f_.mode == ubep::Mode::DC) {
      if (!c_.Poll(PHASE_TOKENS, src, BatchIn{&c_, &f_, batch, record, num_rows, epoch, wire})) return false;
    }
    for (int64_t r = 0; r < num_rows; ++r) {
      Sync<HardEvent::MTE3_S>();  // the previous row's copies out of row and out_buf have finished
      if (!TakeRow(c_, PHASE_TOKENS, src, f_, batch, record, num_rows, r, epoch, wire, row)) return false;
      Replicate(src, r, row, bases, out);
    }
    return true;
  }

  // Row r from src into the receive row of each of its pairs held here, with its outputs: recv_x
  // and recv_weights per pair here; recv_rows, recv_pair_weights, recv_pair_base of the slot.
  __aicore__ inline void Replicate(int64_t src, int64_t r, const LocalTensor<uint8_t>& row,
                                   const LocalTensor<int64_t>& bases, const LocalTensor<uint8_t>& out) {
    const int64_t K = t_->top_k, slot = src * t_->max_tokens + r;
    const LocalTensor<int32_t> dest = out.ReinterpretCast<int32_t>();
    const LocalTensor<float> pw = out[static_cast<uint32_t>(o_pw_)].ReinterpretCast<float>();
    const LocalTensor<int32_t> base = out[static_cast<uint32_t>(o_base_)].ReinterpretCast<int32_t>();
    base.SetValue(0, static_cast<int32_t>(GetU32(row, row_bytes_)));
    for (int64_t k = 0; k < K; ++k) {
      const int64_t at = row_bytes_ + 4 * (1 + k);
      const int32_t local = static_cast<int32_t>(GetU32(row, at));
      const float w = BitsFloat(static_cast<int32_t>(GetU32(row, at + 8 * K)));
      int64_t dest_row = -1;
      if (local >= 0) dest_row = bases.GetValue(static_cast<uint32_t>(local)) + static_cast<int32_t>(GetU32(row, at + 4 * K));
      dest.SetValue(static_cast<uint32_t>(k), static_cast<int32_t>(dest_row));
      pw.SetValue(static_cast<uint32_t>(k), local >= 0 ? w : 0.0f);
      out[static_cast<uint32_t>(o_w_ + 32 * k)].ReinterpretCast<float>().SetValue(0, w);
    }
    Sync<HardEvent::S_MTE3>();
    for (int64_t k = 0; k < K; ++k) {
      const int64_t dest_row = dest.GetValue(static_cast<uint32_t>(k));
      if (dest_row < 0) continue;
      CopyOut(Gm<uint8_t>(recv_x_ + dest_row * row_bytes_, row_bytes_), row, row_bytes_);
      CopyOut(recv_w_[dest_row], out[static_cast<uint32_t>(o_w_ + 32 * k)].ReinterpretCast<float>(), 4);
    }
    CopyOut(rows_[slot * K], dest, 4 * K);
    CopyOut(pair_w_[slot * K], pw, 4 * K);
    CopyOut(pair_base_[slot], base, 4);
  }

  const EpTiling* t_;
  Ctx c_;
  ubep::WireFormat f_;
  Routing route_;
  RouteScan scan_;
  GM_ADDR x_;
  GM_ADDR recv_x_;
  GlobalTensor<int64_t> tpe_;
  GlobalTensor<float> recv_w_, pair_w_;
  GlobalTensor<int32_t> rows_, pair_base_, counts_out_;
  int64_t row_bytes_, row_words_, o_pw_, o_base_, o_counts_, o_w_;
  LocalTensor<int64_t> seen_;
  TBuf<TPosition::VECCALC> wire_buf_, row_buf_, msg_buf_, sched_buf_, out_buf_, bases_buf_, tally_buf_;
};

}  // namespace ubep_ascend

// The UbepDispatch op's kernel (op_host/mc2/ubep_dispatch_def.cpp): its inputs, its outputs (the
// last, `scratch`, zeroed by the caller), the framework's workspace (ubep keeps nothing there) and
// the tiling. The windows come from the op's HCCL group. AIV-only: dispatch has no SyncAll.
extern "C" __global__ __aicore__ void ubep_dispatch(GM_ADDR x, GM_ADDR topk_idx, GM_ADDR topk_weights,
                                                    GM_ADDR recv_x, GM_ADDR recv_weights,
                                                    GM_ADDR tokens_per_expert, GM_ADDR recv_rows,
                                                    GM_ADDR recv_pair_weights, GM_ADDR recv_pair_base,
                                                    GM_ADDR recv_counts, GM_ADDR scratch, GM_ADDR,
                                                    GM_ADDR tiling) {
  KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_AIV_ONLY);
  REGISTER_TILING_DEFAULT(ubep_ascend::EpOpTiling);
  GET_TILING_DATA_WITH_STRUCT(ubep_ascend::EpOpTiling, op_tiling, tiling);
  AscendC::TPipe pipe;
  ubep_ascend::DispatchKernel op;
  op.Init(x, topk_idx, topk_weights, recv_x, recv_weights, tokens_per_expert, recv_rows, recv_pair_weights,
          recv_pair_base, recv_counts, scratch, &op_tiling.ep, &pipe);
  op.Process();
}
