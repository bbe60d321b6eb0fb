// The window preparation as a class, for the UbepPrepare kernel (prepare_kernel.cpp) and for kernels
// that prepare the window before their own work (probe_kernel.cpp). What it does and why:
// prepare_kernel.cpp.
#pragma once

#include "ep_common.h"

namespace ubep_ascend {

using namespace AscendC;

constexpr int64_t FILL_BYTES = 32 * 1024;  // one DataCopy of the fill; a multiple of BLOCK_BYTES

class PrepareKernel {
 public:
  __aicore__ inline void Init(GM_ADDR token, GM_ADDR scratch, const EpTiling* tiling, TPipe* pipe) {
    t_ = tiling;
    c_.Init(tiling, scratch);
    c_.InitBuffers(pipe);
    pipe->InitBuffer(fill_buf_, FILL_BYTES);
    pipe->InitBuffer(token_buf_, TOKEN_STRIDE);
    // The token (16 bytes) through UB, as every GM word the scalar reads.
    const LocalTensor<uint64_t> ub = token_buf_.Get<uint64_t>();
    CopyIn(ub, Gm<uint64_t>(token, 16), 16);
    Sync<HardEvent::MTE2_S>();
    nonce_ = ub.GetValue(0);
    epoch_ = ub.GetValue(1);
    c_.ResetCallNumber();
  }

  // Whether every die's window is ready (no wait of this AIV timed out, no AIV of the die gave up).
  __aicore__ inline bool Process() {
    const int64_t me = GetBlockIdx(), n = GetBlockNum();
    const bool ok = Meet(AREA_ARRIVE, PHASE_ARRIVE, me, n);
    SyncAll();  // no AIV fills before every die has arrived: a die that timed out on its last call
                // may still be writing here until it arrives (test_preparation_waits_for_a_late_die)
    if (ok && !c_.Aborted()) Fill(me, n);
    SyncAll();  // begins with PipeBarrier<PIPE_ALL>: this AIV's fill lands before any ready token
    return ok && !c_.Aborted() && Meet(AREA_READY, PHASE_READY, me, n);
  }

  // The call's context (status, windows, waits), for a kernel that goes on after the preparation.
  __aicore__ inline Ctx& Context() { return c_; }

 private:
  // Die d's header entry written by die s, in `area`.
  __aicore__ inline GlobalTensor<uint64_t> Entry(int64_t d, int64_t area, int64_t s) const {
    return Gm<uint64_t>(c_.windows.Base(d) + (area * t_->world + s) * TOKEN_STRIDE, TOKEN_STRIDE);
  }

  // The token into `area` of this AIV's share of dies, then wait for theirs in this window.
  // token_buf: the scalar writes, MTE3 sends.
  __aicore__ inline bool Meet(int64_t area, int64_t phase, int64_t me, int64_t n) {
    const LocalTensor<uint64_t> token = token_buf_.Get<uint64_t>();
    // (The SyncAlls between the two meetings ordered the arrival's copies of the token before this.)
    token.SetValue(0, nonce_);
    token.SetValue(1, epoch_);
    token.SetValue(2, static_cast<uint64_t>(0));
    token.SetValue(3, static_cast<uint64_t>(0));
    Sync<HardEvent::S_MTE3>();
    for (int64_t d = me; d < t_->world; d += n) DataCopy(Entry(d, area, t_->rank), token, TOKEN_STRIDE / 8);
    Sync<HardEvent::MTE3_MTE2>();  // the token to this die's own window has landed before it is polled
    for (int64_t s = me; s < t_->world; s += n) {
      if (!c_.Poll(phase, s, WordsAre{&c_, Entry(t_->rank, area, s), nonce_, epoch_, 2})) return false;
    }
    return true;
  }

  // Both slots, as runs of one block pattern each, cut into FILL_BYTES pieces dealt round robin.
  __aicore__ inline void Fill(int64_t me, int64_t n) {
    const bool sp = t_->mode == static_cast<int64_t>(ubep::Mode::SP);
    const ubep::WireFormat rows = dispatch_format(*t_), comb = combine_format(*t_), pairs = pair_format(*t_);
    const int64_t ends[] = {t_->disp_off, t_->disp_rec_off, t_->comb_off, t_->comb_rec_off,
                            t_->pair_off, t_->pair_rec_off, t_->slot_bytes};
    const ubep::WireFormat* marked[] = {nullptr, &rows, nullptr, &comb, nullptr, &pairs, nullptr};
    const LocalTensor<uint8_t> ub = fill_buf_.Get<uint8_t>();
    int64_t piece = 0;
    for (int64_t run = 0; run < 7; ++run) {
      const int64_t begin = run == 0 ? 0 : ends[run - 1];
      bool pattern_ready = false;
      for (int64_t slot = 0; slot < 2; ++slot) {
        GM_ADDR base = c_.windows.Base(t_->rank) + t_->slots_off + slot * t_->slot_bytes;
        for (int64_t off = begin; off < ends[run]; off += FILL_BYTES, ++piece) {
          if (piece % n != me) continue;
          if (!pattern_ready) Pattern(ub, sp ? marked[run] : nullptr);
          pattern_ready = true;
          const int64_t bytes = ends[run] - off < FILL_BYTES ? ends[run] - off : FILL_BYTES;
          DataCopy(Gm<uint8_t>(base + off, bytes), ub, static_cast<uint32_t>(bytes));
        }
      }
    }
  }

  // FILL_BYTES of zeros; with a format, its sentinel in the marker bytes of every block. ub: V
  // fills, the scalar marks, MTE3 copies out (MTE3 -> V before the next pattern).
  __aicore__ inline void Pattern(const LocalTensor<uint8_t>& ub, const ubep::WireFormat* marked) {
    Sync<HardEvent::MTE3_V>();  // the previous run's copies have read ub
    Duplicate<int32_t>(ub.ReinterpretCast<int32_t>(), 0, FILL_BYTES / 4);
    if (marked == nullptr) {
      Sync<HardEvent::V_MTE3>();
      return;
    }
    Sync<HardEvent::V_S>();
    const LocalTensor<uint32_t> w = ub.ReinterpretCast<uint32_t>();
    const uint32_t s = SentinelWord(*marked);
    for (int64_t b = 0; b < FILL_BYTES; b += BLOCK_BYTES) {
      for (int64_t m = 0; m < marked->flag_bytes; m += 4) w.SetValue(static_cast<uint32_t>((b + m) / 4), s);
    }
    Sync<HardEvent::S_MTE3>();
  }

  const EpTiling* t_;
  Ctx c_;
  uint64_t nonce_, epoch_;
  TBuf<TPosition::VECCALC> fill_buf_, token_buf_;
};

}  // namespace ubep_ascend
