// Window preparation: makes this die's window ready for a layer's calls and meets every
// die of the group, before a Buffer's first call and again whenever the window last held another
// layer's layout. HCCL's window outlives Buffers and starts with whatever HCCL or an earlier layer
// left in it, so a layer cannot trust it unprepared. The meeting goes through the windows, not an
// HCCL collective, which may stage data in the very window (docs/ASCEND.md).
//
// 0. reset this AIV's call counter (the next call is number 1 on every die: the fill leaves no flag
//    of any number, and HCCL's window starts with whatever was there).
// 1. arrive: the token (nonce, epoch) into every die's arrival entry for this die, then wait for
//    every die's token here. A die arrives only after its earlier calls ended, so no write of theirs
//    lands here after the fill: a call that completed on this die saw every write addressed to it,
//    and after a timeout the late writer arrives only once its own call ended.
// 2. fill: both slots of this layer's window: zeros (zeroed flags, records and count messages match
//    no epoch) and, in sp, the sentinel in the marker bytes of every block of every row area. The
//    header, where the tokens and the call counters live, is left alone.
// 3. ready: once every AIV's share is filled (a fence, SyncAll), the token into every die's ready
//    entry for this die; wait for every die's. A die's next call starts after this op ended, so no
//    die writes into a peer's slots before the peer filled them.
//
// Input: token [2] int64 (the group's nonce, this preparation's number on the group); output:
// scratch (status words and counters).
#include "ep_common.h"
#include "op_tiling.h"

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

  __aicore__ inline void Process() {
    const int64_t me = GetBlockIdx(), n = GetBlockNum();
    const bool ok = Meet(AREA_ARRIVE, PHASE_ARRIVE, me, n);
    SyncAll();  // no AIV fills before every die has arrived: a die that timed out on its last call
                // may still be writing here until it arrives (test_preparation_waits_for_a_late_die)
    if (ok && !c_.Aborted()) Fill(me, n);
    SyncAll();  // begins with PipeBarrier<PIPE_ALL>: this AIV's fill lands before any ready token
    if (ok && !c_.Aborted()) Meet(AREA_READY, PHASE_READY, me, n);
  }

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

// The UbepPrepare op's kernel (op_host/mc2/ubep_prepare_def.cpp): its input, its output (`scratch`,
// zeroed by the caller), the framework's workspace (unused) and the tiling. The windows come from
// the op's HCCL group. A MIX kernel type: its hard SyncAll needs the inter-core scheduling an
// AIV_ONLY kernel does not get (A2/A3, SyncAll doc).
extern "C" __global__ __aicore__ void ubep_prepare(GM_ADDR token, GM_ADDR scratch, GM_ADDR, GM_ADDR tiling) {
  KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIV_1_0);
  REGISTER_TILING_DEFAULT(ubep_ascend::EpOpTiling);
  GET_TILING_DATA_WITH_STRUCT(ubep_ascend::EpOpTiling, op_tiling, tiling);
  AscendC::TPipe pipe;
  ubep_ascend::PrepareKernel op;
  op.Init(token, scratch, &op_tiling.ep, &pipe);
  op.Process();
}
