// What the dispatch and combine kernels share: bounded waits, window addressing, the per-row
// Data-as-Flag encoding of docs/PROTOCOL.md, count messages, batch records and group counters.
//
// Visibility rules the kernels rely on (the CPU twin implements them, kernel_operator.h):
// a DataCopy into GM lands in 512-byte transactions seen whole; PipeBarrier<PIPE_ALL> orders
// earlier copies before later ones (the sw fence); a scalar read of a word another AIV or die
// writes is preceded by DataCacheCleanAndInvalid.
#pragma once

#include "ep_tiling.h"
#include "hccl_windows.h"
#include "kernel_operator.h"

namespace ubep_ascend {

using AscendC::GlobalTensor;
using AscendC::LocalTensor;

// fp32 gate weights travel as int32 words of the route (a union: no library call in device code).
__aicore__ inline int32_t FloatBits(float v) {
  union { float f; int32_t i; } u;
  u.f = v;
  return u.i;
}
__aicore__ inline float BitsFloat(int32_t v) {
  union { float f; int32_t i; } u;
  u.i = v;
  return u.f;
}

// Workspace counters (int32, one per 32-byte unit).
enum Counter : int64_t { CNT_COUNTS_IN = 0, CNT_BASES_READY = 1, CNT_SENT = 2 };

// The call's state on one AIV: its tiling, the die's scratch (the op's zeroed `scratch` output: status
// words, counters, then the ws_* areas of the tiling) and every die's window (the HCCL group's).
struct Ctx {
  const EpTiling* t;
  GlobalTensor<int64_t> status;   // [error, phase, peer]
  GlobalTensor<int32_t> counters;
  HcclWindows windows;
  uint8_t* ws;
  int64_t deadline;

  __aicore__ inline void Init(const EpTiling* tiling, GM_ADDR scratch) {
    t = tiling;
    ws = scratch;
    status.SetGlobalBuffer(reinterpret_cast<__gm__ int64_t*>(scratch), 4);
    counters.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(scratch + t->ws_counters),
                             8 * COUNTER_STRIDE / 4);
    windows.Init(t->rank);
    deadline = AscendC::GetSystemCycle() + t->timeout_cycles;
  }

  // Base of this call's slot in die r's window.
  __aicore__ inline GM_ADDR Slot(int64_t r) const {
    return windows.Base(r) + t->slots_off + (static_cast<uint64_t>(t->epoch) & 1) * t->slot_bytes;
  }

  __aicore__ inline bool Aborted() const { return status.GetValue(0) != 0; }

  // Spin until ready(); false if the deadline passes (recorded with phase and peer) or another
  // AIV already gave up. Waits on this die's own AIVs (peer < 0) get twice the deadline, so the
  // AIV waiting on the missing peer is the one that reports.
  template <typename Ready>
  __aicore__ inline bool Poll(int64_t phase, int64_t peer, Ready ready) {
    const int64_t limit = peer >= 0 ? deadline : deadline + t->timeout_cycles;
    while (true) {
      AscendC::DataCacheCleanAndInvalid<int64_t, AscendC::CacheLine::ENTIRE_DATA_CACHE,
                                        AscendC::DcciDst::CACHELINE_OUT>(status);
      if (ready()) return true;
      if (Aborted()) return false;
      if (AscendC::GetSystemCycle() > limit) {
        status.SetValue(1, phase);
        status.SetValue(2, peer);
        status.SetValue(0, 1);
        return false;
      }
    }
  }

  __aicore__ inline int32_t Counter(int64_t c) const { return counters.GetValue(c * COUNTER_STRIDE / 4); }

  // Atomic += v on a workspace int32 (SetAtomicAdd + a 32-byte DataCopy whose other lanes are 0).
  __aicore__ inline void AddCounter(GlobalTensor<int32_t> at, const LocalTensor<int32_t>& ub, int32_t v) {
    AscendC::Duplicate<int32_t>(ub, 0, 8);
    ub.SetValue(0, v);
    AscendC::PipeBarrier<PIPE_ALL>();  // earlier copies of this AIV land before the count
    AscendC::SetAtomicAdd<int32_t>();
    AscendC::DataCopy(at, ub, 8);
    AscendC::SetAtomicNone();
  }
  __aicore__ inline void Bump(int64_t c, const LocalTensor<int32_t>& ub) {
    AddCounter(counters[c * COUNTER_STRIDE / 4], ub, 1);
  }
};

// A count message: payload words (u64, from byte 32 of the entry), a fence, then the epoch word.
// ub holds at least cnt_stride bytes.
__aicore__ inline void SendCountMessage(const Ctx& c, int64_t dest, const LocalTensor<uint64_t>& ub,
                                        int64_t num_words) {
  const int64_t bytes = (num_words * 8 + 31) / 32 * 32;
  GlobalTensor<uint64_t> entry;
  entry.SetGlobalBuffer(reinterpret_cast<__gm__ uint64_t*>(c.Slot(dest) + c.t->cnt_off +
                                                           c.t->rank * c.t->cnt_stride));
  AscendC::DataCopy(entry[4], ub[4], bytes / 8);
  AscendC::PipeBarrier<PIPE_ALL>();
  AscendC::Duplicate<uint64_t>(ub, 0, 4);
  ub.SetValue(0, static_cast<uint64_t>(c.t->epoch));
  AscendC::DataCopy(entry, ub, 4);
}

// This die's count entry from source s.
__aicore__ inline GlobalTensor<uint64_t> CountEntry(const Ctx& c, int64_t s) {
  GlobalTensor<uint64_t> entry;
  entry.SetGlobalBuffer(reinterpret_cast<__gm__ uint64_t*>(c.Slot(c.t->rank) + c.t->cnt_off +
                                                           s * c.t->cnt_stride));
  return entry;
}

// dc: xor every marker word of row r (UB, in place) with its mask, the batch-wide marker index k
// mixed with the epoch digest (docs/PROTOCOL.md); applying it twice restores the row.
__aicore__ inline void XorMarkers(const ubep::WireFormat& f, uint8_t* wire, int64_t r, uint64_t epoch) {
  const uint32_t digest = ubep::epoch_digest(epoch);
  const int64_t words = f.flag_bytes / 4, nb = f.blocks_per_row();
  for (int64_t b = 0; b < nb; ++b) {
    for (int64_t j = 0; j < words; ++j) {
      uint8_t* p = wire + b * f.block_bytes + 4 * j;
      const uint32_t k = static_cast<uint32_t>((r * nb + b) * words + j);
      ubep::store_u32(p, ubep::load_u32(p) ^ ubep::fmix32(k ^ digest));
    }
  }
}

// dc lanes of row r as it sits on the wire (receiver side), added to lanes[0..1].
__aicore__ inline void AddRowLanes(const ubep::WireFormat& f, const uint8_t* wire, int64_t r, uint32_t* lanes) {
  const int64_t words = f.flag_bytes / 4, nb = f.blocks_per_row();
  for (int64_t b = 0; b < nb; ++b) {
    for (int64_t j = 0; j < words; ++j) {
      const uint32_t w = ubep::load_u32(wire + b * f.block_bytes + 4 * j);
      const uint32_t k = static_cast<uint32_t>((r * nb + b) * words + j);
      lanes[0] += ubep::fmix32(w ^ ubep::fmix32(2 * k));
      lanes[1] += ubep::fmix32(w ^ ubep::fmix32(2 * k + 1));
    }
  }
}

// One row of a batch, encoded in UB: `row` (row_bytes) -> `wire` (row_stride). dc masks with the
// batch-wide marker index of row r and adds the row's checksum lanes to lanes[0..1]; returns true
// for an sp row whose marker equals the sentinel (the batch then needs its record).
__aicore__ inline bool EncodeRow(const ubep::WireFormat& f, const uint8_t* row, int64_t r,
                                 uint64_t epoch, uint8_t* wire, uint32_t* lanes) {
  ubep::WireFormat raw = f;
  if (f.mode == ubep::Mode::DC) raw.mode = ubep::Mode::SW;  // blocks only; masked below
  const bool collide = ubep::encode_blocks(raw, row, 1, epoch, wire);
  if (f.mode == ubep::Mode::DC) {
    XorMarkers(f, wire, r, epoch);
    AddRowLanes(f, wire, r, lanes);
  }
  return collide;
}

// The dc checksum of a batch of n rows from its lanes (docs/PROTOCOL.md).
__aicore__ inline uint64_t ChecksumOf(const ubep::WireFormat& f, const uint32_t* lanes, int64_t n,
                                      uint64_t epoch) {
  const uint32_t blocks = static_cast<uint32_t>(n * f.blocks_per_row());
  return uint64_t(ubep::fmix32(lanes[1] ^ ubep::fmix32(blocks))) << 32 |
         ubep::fmix32(lanes[0] ^ ubep::epoch_digest(epoch));
}

// Row r of an arrived batch, decoded from `wire` (UB, unmasked in place for dc) into `row`.
__aicore__ inline void DecodeRow(const ubep::WireFormat& f, uint8_t* wire, int64_t r, uint64_t epoch,
                                 uint8_t* row) {
  if (f.mode == ubep::Mode::DC) XorMarkers(f, wire, r, epoch);
  const int64_t pb = f.payload_bytes(), off = f.payload_offset();
  for (int64_t i = 0; i < f.row_bytes(); ++i) row[i] = wire[(i / pb) * f.block_bytes + off + i % pb];
}

// tff / sp: every block of the row in UB has arrived.
__aicore__ inline bool RowArrived(const ubep::WireFormat& f, const uint8_t* wire, uint64_t epoch) {
  for (int64_t b = 0; b < f.blocks_per_row(); ++b) {
    if (!ubep::block_arrived(f, wire + b * f.block_bytes, epoch)) return false;
  }
  return true;
}

// sp: put the sentinel back into the markers of a consumed row (ub: FLAG_BYTES of scratch).
__aicore__ inline void ResetMarkers(const ubep::WireFormat& f, uint8_t* row_gm, const LocalTensor<uint8_t>& ub) {
  for (int64_t m = 0; m < f.flag_bytes; ++m) ub.SetValue(m, ubep::sentinel_byte(f, m));
  GlobalTensor<uint8_t> g;
  for (int64_t b = 0; b < f.blocks_per_row(); ++b) {
    g.SetGlobalBuffer(row_gm + b * f.block_bytes, f.flag_bytes);
    AscendC::DataCopy(g, ub, f.flag_bytes);
  }
}

// The batch record (epoch, value) into `rec_gm`, after a fence so the rows land first.
__aicore__ inline void SendRecord(uint8_t* rec_gm, uint64_t epoch, uint64_t value, const LocalTensor<uint64_t>& ub) {
  AscendC::PipeBarrier<PIPE_ALL>();
  AscendC::Duplicate<uint64_t>(ub, 0, 4);
  ub.SetValue(0, epoch);
  ub.SetValue(1, value);
  GlobalTensor<uint64_t> g;
  g.SetGlobalBuffer(reinterpret_cast<__gm__ uint64_t*>(rec_gm), 4);
  AscendC::DataCopy(g, ub, 4);
}

// A sender's share of a batch's record state, added atomically into `acc_gm` (8 int32 in this die's
// workspace per peer: any row collided with the sp sentinel, dc lanes A and B), since several AIVs
// send rows of one batch. ub: 8 int32 of scratch.
__aicore__ inline void AddBatchShare(__gm__ int32_t* acc_gm, bool collide, const uint32_t* lanes,
                                     const LocalTensor<int32_t>& ub) {
  AscendC::Duplicate<int32_t>(ub, 0, 8);
  ub.SetValue(0, collide ? 1 : 0);
  ub.SetValue(1, static_cast<int32_t>(lanes[0]));
  ub.SetValue(2, static_cast<int32_t>(lanes[1]));
  GlobalTensor<int32_t> g;
  g.SetGlobalBuffer(acc_gm, 8);
  AscendC::SetAtomicAdd<int32_t>();
  AscendC::DataCopy(g, ub, 8);
  AscendC::SetAtomicNone();
}

// Where a sender accumulates its shares of the batch to `peer`, in its workspace at `acc_base`.
__aicore__ inline __gm__ int32_t* BatchAccumulator(uint8_t* acc_base, int64_t peer) {
  return reinterpret_cast<__gm__ int32_t*>(acc_base) + peer * 8;
}

// Row r of a batch (`row`, UB) encoded and copied to `dst_gm` in a peer's window, its record share
// added to `acc_gm` when the batch will need one (dc always, sp on a collision).
template <typename WireQueue>
__aicore__ inline void SendRow(const ubep::WireFormat& f, const uint8_t* row, int64_t r, uint64_t epoch,
                               WireQueue& wire_q, uint8_t* dst_gm, __gm__ int32_t* acc_gm,
                               const LocalTensor<int32_t>& ub) {
  LocalTensor<uint8_t> wire = wire_q.template AllocTensor<uint8_t>();
  uint32_t lanes[2] = {0, 0};
  const bool collide = EncodeRow(f, row, r, epoch, wire.GetPhyAddr(), lanes);
  wire_q.EnQue(wire);
  wire = wire_q.template DeQue<uint8_t>();
  GlobalTensor<uint8_t> dst;
  dst.SetGlobalBuffer(dst_gm);
  AscendC::DataCopy(dst, wire, f.row_stride());
  wire_q.FreeTensor(wire);
  if (collide || f.mode == ubep::Mode::DC) AddBatchShare(acc_gm, collide, lanes, ub);
}

// The record of a finished batch of `num_rows` rows into `rec_gm`, from its accumulator: sw (epoch,
// N); dc (epoch, checksum of the summed lanes); sp (epoch, N) only if a row collided, else none.
__aicore__ inline void SendBatchRecord(const ubep::WireFormat& f, __gm__ int32_t* acc_gm, uint8_t* rec_gm,
                                       int64_t num_rows, uint64_t epoch, const LocalTensor<uint64_t>& ub) {
  GlobalTensor<int32_t> acc;
  acc.SetGlobalBuffer(acc_gm, 8);
  uint64_t value = static_cast<uint64_t>(num_rows);
  if (f.mode == ubep::Mode::SP && acc.GetValue(0) == 0) return;
  if (f.mode == ubep::Mode::DC) {
    const uint32_t lanes[2] = {static_cast<uint32_t>(acc.GetValue(1)), static_cast<uint32_t>(acc.GetValue(2))};
    value = ChecksumOf(f, lanes, num_rows, epoch);
  }
  SendRecord(rec_gm, epoch, value, ub);
}

// Whether the batch record in this die's window reads (epoch, value).
__aicore__ inline bool RecordIs(uint8_t* rec_gm, uint64_t epoch, uint64_t value, const LocalTensor<uint64_t>& ub) {
  GlobalTensor<uint64_t> g;
  g.SetGlobalBuffer(reinterpret_cast<__gm__ uint64_t*>(rec_gm), 4);
  AscendC::DataCopy(ub, g, 4);
  return ub.GetValue(0) == epoch && ub.GetValue(1) == value;
}

// Whether a batch of `num_rows` rows at `batch` (this die's window) is complete for `epoch`, for the
// modes with a record: sw, the record reads (epoch, N); dc, (epoch, checksum of the rows as they sit
// here). wire: UB for one row; rec: 4 u64 of UB.
__aicore__ inline bool BatchComplete(const ubep::WireFormat& f, uint8_t* batch, uint8_t* record, int64_t num_rows,
                                     uint64_t epoch, const LocalTensor<uint8_t>& wire,
                                     const LocalTensor<uint64_t>& rec) {
  if (f.mode == ubep::Mode::SW) return RecordIs(record, epoch, num_rows, rec);
  GlobalTensor<uint64_t> g;
  g.SetGlobalBuffer(reinterpret_cast<__gm__ uint64_t*>(record), 4);
  if (g.GetValue(0) != epoch) return false;
  uint32_t lanes[2] = {0, 0};
  GlobalTensor<uint8_t> gm_row;
  for (int64_t r = 0; r < num_rows; ++r) {
    gm_row.SetGlobalBuffer(batch + r * f.row_stride());
    AscendC::DataCopy(wire, gm_row, f.row_stride());
    AddRowLanes(f, wire.GetPhyAddr(), r, lanes);
  }
  return RecordIs(record, epoch, ChecksumOf(f, lanes, num_rows, epoch), rec);
}

// Row r of a batch from `peer` (this die's window at `batch`) into `row` (UB), through `wire` (UB):
// tff / sp wait for every block of the row (sp also takes the fallback record), sw / dc rows are
// there once BatchComplete said so; then decode, and for sp put the sentinel back. False if the wait
// timed out (recorded under `phase`).
__aicore__ inline bool TakeRow(Ctx& c, int64_t phase, int64_t peer, const ubep::WireFormat& f, uint8_t* batch,
                               uint8_t* record, int64_t num_rows, int64_t r, uint64_t epoch,
                               const LocalTensor<uint8_t>& wire, const LocalTensor<uint64_t>& rec, uint8_t* row) {
  GlobalTensor<uint8_t> gm_row;
  gm_row.SetGlobalBuffer(batch + r * f.row_stride());
  if (f.mode == ubep::Mode::TFF || f.mode == ubep::Mode::SP) {
    const bool ok = c.Poll(phase, peer, [&] {
      AscendC::DataCopy(wire, gm_row, f.row_stride());
      return RowArrived(f, wire.GetPhyAddr(), epoch) ||
             (f.mode == ubep::Mode::SP && RecordIs(record, epoch, num_rows, rec));
    });
    if (!ok) return false;
  } else {
    AscendC::DataCopy(wire, gm_row, f.row_stride());
  }
  DecodeRow(f, wire.GetPhyAddr(), r, epoch, row);
  if (f.mode == ubep::Mode::SP) ResetMarkers(f, batch + r * f.row_stride(), wire);
  return true;
}

}  // namespace ubep_ascend
