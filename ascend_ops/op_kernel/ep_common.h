// What the dispatch and combine kernels share: the call's context (status, group counters, bounded
// waits, window addressing), count messages, batch records, and sending and taking one wire row.
//
// Memory rules (A2/A3; docs/ASCEND.md, "The scalar data cache"):
// - The scalar unit neither reads nor writes GM that another AIV, die or DMA also touches: each
//   AIV's DCache is private and write-back per 64-byte line, and DMA bypasses it. Such GM moves by
//   DataCopy through UB (MTE2 in, then MTE2 -> S before GetValue; S -> MTE3 after SetValue, then
//   MTE3 out), as the MC2 kernels poll and publish. The only scalar GM reads are of the HCCL
//   context, which the runtime writes before the launch.
// - Every UB buffer handed from one pipe to another is ordered by Sync<E> (ep_sync.h); each
//   function states what it hands over and what its caller must have ordered before.
// - A DataCopy into a window lands in 512-byte transactions seen whole; PipeBarrier<PIPE_MTE3>, or
//   a SetFlag whose source is MTE3, between two copies of one AIV makes the first land before the
//   second (data before flag): the SetFlag fires once MTE3's earlier copies completed.
#pragma once

#include "ep_sync.h"
#include "ep_tiling.h"
#include "ep_wire.h"
#include "hccl_windows.h"

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

// How Ctx::Post writes its 32 bytes.
enum PostFlags : uint32_t {
  POST_PLAIN = 0,
  POST_ATOMIC_ADD = 1,  // SetAtomicAdd: int32 lanes added into GM
  POST_READ_BACK = 2,   // this AIV reads the words back later: its MTE2 waits for the write
};

// The call's state on one AIV: its tiling, the die's scratch (the op's zeroed `scratch` output:
// status words, counters, then the ws_* areas of the tiling), every die's window (the HCCL
// group's), and three 32-byte UB buffers for single words.
struct Ctx {
  const EpTiling* t;
  uint64_t epoch;  // this call's number | its code (TakeCallNumber); every word of the call carries it
  GlobalTensor<int64_t> status;    // [error, phase, peer, 0]: one 32-byte record, moved by DMA only
  GlobalTensor<int32_t> counters;  // raised by atomic DMA adds, read by DMA
  HcclWindows windows;
  GM_ADDR ws;
  int64_t deadline;
  AscendC::TBuf<AscendC::TPosition::VECCALC> probe_buf, tx_buf, sentinel_buf;
  LocalTensor<uint8_t> probe;     // MTE2 in -> S reads
  LocalTensor<uint8_t> tx;        // S writes -> MTE3 out
  LocalTensor<uint8_t> sentinel;  // sp: a block's marker bytes of the sentinel; S writes once, MTE3 reads

  __aicore__ inline void Init(const EpTiling* tiling, GM_ADDR scratch) {
    t = tiling;
    ws = scratch;
    status.SetGlobalBuffer(reinterpret_cast<__gm__ int64_t*>(scratch), 4);
    counters.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(scratch + t->ws_counters), 8 * COUNTER_STRIDE / 4);
    windows.Init(t->rank);
    deadline = AscendC::GetSystemCycle() + t->timeout_cycles;
  }

  __aicore__ inline void InitBuffers(AscendC::TPipe* pipe) {
    pipe->InitBuffer(probe_buf, 32);
    pipe->InitBuffer(tx_buf, 32);
    probe = probe_buf.Get<uint8_t>();
    tx = tx_buf.Get<uint8_t>();
  }

  // sp receivers put the sentinel back into consumed rows' markers from this buffer.
  __aicore__ inline void InitSentinel(AscendC::TPipe* pipe, const ubep::WireFormat& f) {
    if (f.mode != ubep::Mode::SP) return;
    pipe->InitBuffer(sentinel_buf, static_cast<uint32_t>(f.flag_bytes));
    sentinel = sentinel_buf.Get<uint8_t>();
    const LocalTensor<uint32_t> w = sentinel.ReinterpretCast<uint32_t>();
    for (int64_t j = 0; j < f.flag_bytes / 4; ++j) w.SetValue(static_cast<uint32_t>(j), SentinelWord(f));
    // Copied out only by TakeRow, after this AIV's Bump(CNT_SENT), whose Post orders S -> MTE3.
  }

  // Base of this call's slot in die r's window.
  __aicore__ inline GM_ADDR Slot(int64_t r) const {
    return windows.Base(r) + t->slots_off + (epoch & 1) * t->slot_bytes;
  }

  // This AIV's call counter in its die's window header. Only this AIV touches it, and the next
  // launch on the stream starts after this one ended.
  __aicore__ inline GlobalTensor<uint64_t> CallCounter() const {
    return Gm<uint64_t>(windows.Base(t->rank) + (2 * t->world + AscendC::GetBlockIdx()) * TOKEN_STRIDE,
                        TOKEN_STRIDE);
  }

  // The call's number: the counter + 1, written back. Every die runs the group's calls in one order
  // with the same AIVs since the last preparation reset the counters, so every AIV of every die
  // takes the same number, and a launch replayed from a graph takes a new one. After InitBuffers.
  __aicore__ inline void TakeCallNumber() {
    uint64_t last[4];
    Peek(CallCounter(), last);
    uint64_t number = (last[0] + 1) & CALL_NUMBER_MASK;
    if (number == 0) number = 2;  // after 2^40 - 1 calls; 2 keeps the slot parity alternating
    const uint64_t words[4] = {number, 0, 0, 0};
    Post(CallCounter(), words, POST_PLAIN);
    epoch = number | static_cast<uint64_t>(t->call_code);
  }

  // A preparation's: the next call is number 1 (the fill leaves no flag of an earlier number).
  __aicore__ inline void ResetCallNumber() {
    const uint64_t words[4] = {0, 0, 0, 0};
    Post(CallCounter(), words, POST_PLAIN);
  }

  // The 32 bytes at `src` (32-byte aligned) into out[0, 32 / sizeof(T)).
  template <typename T>
  __aicore__ inline void Peek(const GlobalTensor<T>& src, T* out) {
    const LocalTensor<T> ub = probe.ReinterpretCast<T>();
    AscendC::DataCopy(ub, src, 32 / sizeof(T));
    Sync<HardEvent::MTE2_S>();
    for (uint32_t i = 0; i < 32 / sizeof(T); ++i) out[i] = ub.GetValue(i);
    Sync<HardEvent::S_MTE2>();  // the next copy into the probe waits for these reads
  }

  // words[0, 32 / sizeof(T)) into the 32 bytes at `dst` (32-byte aligned), by MTE3, after every
  // earlier copy of this AIV has landed (what a counter or record publishes).
  template <typename T>
  __aicore__ inline void Post(const GlobalTensor<T>& dst, const T* words, uint32_t flags) {
    const LocalTensor<T> ub = tx.ReinterpretCast<T>();
    // The previous post has read tx; and, fired once MTE3's earlier copies completed, this flag
    // makes them (rows, keeps, atomic adds, which complete out of order) land before this word.
    Sync<HardEvent::MTE3_S>();
    for (uint32_t i = 0; i < 32 / sizeof(T); ++i) ub.SetValue(i, words[i]);
    Sync<HardEvent::S_MTE3>();
    if (flags & POST_ATOMIC_ADD) AscendC::SetAtomicAdd<int32_t>();
    AscendC::DataCopy(dst, ub, 32 / sizeof(T));
    if (flags & POST_ATOMIC_ADD) AscendC::SetAtomicNone();  // ordered against MTE3 by the hardware
    if (flags & POST_READ_BACK) Sync<HardEvent::MTE3_MTE2>();
  }

  __aicore__ inline bool Aborted() {
    int64_t s[4];
    Peek(status, s);
    return s[0] != 0;
  }

  // The timeout record; several AIVs may write it, each a whole record.
  __aicore__ inline void Report(int64_t phase, int64_t peer) {
    const int64_t s[4] = {1, phase, peer, 0};
    Post(status, s, POST_READ_BACK);
  }

  __aicore__ inline int32_t Counter(int64_t c) {
    int32_t v[8];
    Peek(counters[c * COUNTER_STRIDE / 4], v);
    return v[0];
  }

  // Atomic += v[0..7] on the 8 int32 at `at`.
  __aicore__ inline void Add(GlobalTensor<int32_t> at, const int32_t* v, uint32_t flags) {
    Post(at, v, flags | POST_ATOMIC_ADD);
  }

  // Counter c += 1, after every earlier copy of this AIV has landed (the counter publishes them).
  __aicore__ inline void Bump(int64_t c) {
    const int32_t one[8] = {1, 0, 0, 0, 0, 0, 0, 0};
    Add(counters[c * COUNTER_STRIDE / 4], one, POST_READ_BACK);
  }

  // Spin until ready(); false if the deadline passes (recorded with phase and peer) or another
  // AIV already gave up. Waits on this die's own AIVs (peer < 0) get twice the deadline, so the
  // AIV waiting on the missing peer is the one that reports.
  template <class Ready>
  __aicore__ inline bool Poll(int64_t phase, int64_t peer, Ready ready) {
    const int64_t limit = peer >= 0 ? deadline : deadline + t->timeout_cycles;
    while (true) {
      if (ready()) return true;
      if (Aborted()) return false;
      if (AscendC::GetSystemCycle() > limit) {
        Report(phase, peer);
        return false;
      }
    }
  }
};

// Ready once the 32 bytes at `at` start with w0 (and w1, for n == 2).
struct WordsAre {
  Ctx* c;
  GlobalTensor<uint64_t> at;
  uint64_t w0, w1;
  int64_t n;
  __aicore__ inline bool operator()() const {
    uint64_t v[4];
    c->Peek(at, v);
    return v[0] == w0 && (n < 2 || v[1] == w1);
  }
};

// Ready once counter `counter` reads `want`.
struct CounterIs {
  Ctx* c;
  int64_t counter;
  int32_t want;
  __aicore__ inline bool operator()() const { return c->Counter(counter) == want; }
};

// A count message: payload words (u64, from byte 32 of the entry), then the epoch word. ub holds
// cnt_stride bytes: words 1-3 zero, the payload at words 4 .. 4 + num_words written by the scalar
// (the caller ordered any vector fill of ub before those writes). The caller orders MTE3 -> ub's
// next writer.
__aicore__ inline void SendCountMessage(const Ctx& c, int64_t dest, const LocalTensor<uint64_t>& ub,
                                        int64_t num_words) {
  const int64_t bytes = (num_words * 8 + 31) / 32 * 32;
  const GlobalTensor<uint64_t> entry =
      Gm<uint64_t>(c.Slot(dest) + c.t->cnt_off + c.t->rank * c.t->cnt_stride, c.t->cnt_stride);
  ub.SetValue(0, c.epoch);
  Sync<HardEvent::S_MTE3>();
  AscendC::DataCopy(entry[4], ub[4], static_cast<uint32_t>(bytes / 8));
  AscendC::PipeBarrier<PIPE_MTE3>();  // the payload lands before the epoch word
  AscendC::DataCopy(entry, ub, 4);
}

// This die's count entry from source s.
__aicore__ inline GlobalTensor<uint64_t> CountEntry(const Ctx& c, int64_t s) {
  return Gm<uint64_t>(c.Slot(c.t->rank) + c.t->cnt_off + s * c.t->cnt_stride, c.t->cnt_stride);
}

// Where a sender accumulates its shares of the batch to `peer` (8 int32 in its workspace at
// `acc_base`: any row collided with the sp sentinel, dc lanes A and B), since several AIVs send
// rows of one batch.
__aicore__ inline GlobalTensor<int32_t> BatchAccumulator(GM_ADDR acc_base, int64_t peer) {
  return Gm<int32_t>(acc_base + peer * 32, 32);
}

// The batch record (epoch, value) into `rec_gm`, after every earlier copy of this AIV (its rows;
// the other senders' rows landed before they raised CNT_SENT).
__aicore__ inline void SendRecord(Ctx& c, GM_ADDR rec_gm, uint64_t epoch, uint64_t value) {
  const uint64_t words[4] = {epoch, value, 0, 0};
  c.Post(Gm<uint64_t>(rec_gm, 32), words, POST_PLAIN);
}

// The record of a finished batch of `num_rows` rows into `rec_gm`, from its accumulator: sw (epoch,
// N); dc (epoch, checksum of the summed lanes); sp (epoch, N) only if a row collided, else none.
__aicore__ inline void SendBatchRecord(Ctx& c, const ubep::WireFormat& f, const GlobalTensor<int32_t>& acc,
                                       GM_ADDR rec_gm, int64_t num_rows, uint64_t epoch) {
  int32_t share[8];
  c.Peek(acc, share);
  uint64_t value = static_cast<uint64_t>(num_rows);
  if (f.mode == ubep::Mode::SP && share[0] == 0) return;
  if (f.mode == ubep::Mode::DC) {
    const uint32_t lanes[2] = {static_cast<uint32_t>(share[1]), static_cast<uint32_t>(share[2])};
    value = ChecksumOf(f, lanes, num_rows, epoch);
  }
  SendRecord(c, rec_gm, epoch, value);
}

// Whether the batch record in this die's window reads (epoch, value).
__aicore__ inline bool RecordIs(Ctx& c, GM_ADDR rec_gm, uint64_t epoch, uint64_t value) {
  uint64_t v[4];
  c.Peek(Gm<uint64_t>(rec_gm, 32), v);
  return v[0] == epoch && v[1] == value;
}

// `bytes` of GM at `src` into `wire` for the scalar: S -> MTE2 (the scalar is done with the wire's
// previous contents), the copy, MTE2 -> S. The caller ordered any copy out of the wire before.
__aicore__ inline void LoadWire(const LocalTensor<uint8_t>& wire, GM_ADDR src, int64_t bytes) {
  Sync<HardEvent::S_MTE2>();
  AscendC::DataCopy(wire, Gm<uint8_t>(src, bytes), static_cast<uint32_t>(bytes));
  Sync<HardEvent::MTE2_S>();
}

// Row r of a batch: `row` (UB, row_bytes; the caller ordered its writers before the scalar, or a
// vector writer before V) encoded into `wire` and copied to `dst` in a peer's window; its record
// share added at `acc` when the batch will need one (dc always, sp on a collision). The encode's
// V -> S leaves `row` free for the scalar and, after it, for MTE2.
__aicore__ inline void SendRow(Ctx& c, const ubep::WireFormat& f, const LocalTensor<uint8_t>& row, int64_t r,
                               const LocalTensor<uint8_t>& wire, GM_ADDR dst, const GlobalTensor<int32_t>& acc) {
  Sync<HardEvent::S_V>();     // the scalar's writes of `row` are done
  Sync<HardEvent::MTE3_V>();  // the previous row's copy out of the wire has finished
  uint32_t lanes[2] = {0, 0};
  const bool collide = EncodeRow(f, row, r, c.epoch, wire, lanes);
  Sync<HardEvent::S_MTE3>();
  AscendC::DataCopy(Gm<uint8_t>(dst, f.row_stride()), wire, static_cast<uint32_t>(f.row_stride()));
  if (collide || f.mode == ubep::Mode::DC) {
    const int32_t share[8] = {collide ? 1 : 0, static_cast<int32_t>(lanes[0]), static_cast<int32_t>(lanes[1]), 0, 0, 0,
                              0, 0};
    c.Add(acc, share, POST_PLAIN);
  }
}

// Ready once a batch of `num_rows` rows at `batch` (this die's window) is complete for `epoch`, for
// the modes with a record: sw, the record reads (epoch, N); dc, (epoch, checksum of the rows as
// they sit here, each copied into `wire` in turn).
struct BatchIn {
  Ctx* c;
  const ubep::WireFormat* f;
  GM_ADDR batch;
  GM_ADDR record;
  int64_t num_rows;
  uint64_t epoch;
  LocalTensor<uint8_t> wire;
  __aicore__ inline bool operator()() const {
    if (f->mode == ubep::Mode::SW) return RecordIs(*c, record, epoch, static_cast<uint64_t>(num_rows));
    uint64_t head[4];
    c->Peek(Gm<uint64_t>(record, 32), head);
    if (head[0] != epoch) return false;
    uint32_t lanes[2] = {0, 0};
    for (int64_t r = 0; r < num_rows; ++r) {
      LoadWire(wire, batch + r * f->row_stride(), f->row_stride());
      AddRowLanes(*f, wire, r, lanes);
    }
    return RecordIs(*c, record, epoch, ChecksumOf(*f, lanes, num_rows, epoch));
  }
};

// tff / sp: ready once every block of the row at `gm_row` has arrived (copied into `wire`), or for
// sp once the batch's fallback record reads (epoch, N).
struct RowIn {
  Ctx* c;
  const ubep::WireFormat* f;
  GM_ADDR gm_row;
  GM_ADDR record;
  int64_t num_rows;
  uint64_t epoch;
  LocalTensor<uint8_t> wire;
  __aicore__ inline bool operator()() const {
    LoadWire(wire, gm_row, f->row_stride());
    return RowArrived(*f, wire, epoch) ||
           (f->mode == ubep::Mode::SP && RecordIs(*c, record, epoch, static_cast<uint64_t>(num_rows)));
  }
};

// Row r of a batch from `peer` (this die's window at `batch`) decoded into `row` (UB) through
// `wire` (UB): tff / sp wait for every block of the row (sp also takes the fallback record), sw /
// dc rows are there once BatchIn said so; sp then puts the sentinel back into the row's markers.
// False if the wait timed out (recorded under `phase`). The caller ordered every copy out of the
// wire and of `row` before this (MTE3 -> MTE2, MTE3 -> S); the row is left to the scalar.
__aicore__ inline bool TakeRow(Ctx& c, int64_t phase, int64_t peer, const ubep::WireFormat& f, GM_ADDR batch,
                               GM_ADDR record, int64_t num_rows, int64_t r, uint64_t epoch,
                               const LocalTensor<uint8_t>& wire, const LocalTensor<uint8_t>& row) {
  GM_ADDR gm_row = batch + r * f.row_stride();
  if (f.mode == ubep::Mode::TFF || f.mode == ubep::Mode::SP) {
    if (!c.Poll(phase, peer, RowIn{&c, &f, gm_row, record, num_rows, epoch, wire})) return false;
  } else {
    LoadWire(wire, gm_row, f.row_stride());
  }
  DecodeRow(f, wire, r, epoch, row);
  if (f.mode == ubep::Mode::SP) {
    Sync<HardEvent::MTE2_MTE3>();  // the copy-in has read the row's markers before they are overwritten
    for (int64_t b = 0; b < f.blocks_per_row(); ++b) {
      AscendC::DataCopy(Gm<uint8_t>(gm_row + b * f.block_bytes, f.flag_bytes), c.sentinel,
                        static_cast<uint32_t>(f.flag_bytes));
    }
  }
  return true;
}

}  // namespace ubep_ascend
