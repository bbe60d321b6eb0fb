// The probe of the tear-free 512-byte write (`ubep probe`). tff and sp take a block of a row once
// its head 32 bytes show the call's flag, trusting that a block one DataCopy wrote into a peer's
// window is seen whole; no CANN document states it (docs/ASCEND.md, "What each mode assumes"). This
// kernel measures what the hardware does, as a tff sender and receiver move rows:
//
// 0. a window preparation for the probe's layer (prepare.h): slot 0 zeroed, every die met (each AIV
//    meets its share of the dies, then a SyncAll: every die filled before any writer starts);
// 1. AIVs [0, n/2) write: writer a of die d copies its row (`blocks` blocks of 512 bytes) into row
//    a of slot 0 of die (d + 1) % W, `rounds` times, every int32 word of round i holding i; one
//    DataCopy per round, back to back, as a sender's rows leave;
// 2. AIVs [n/2, 2 (n/2)) read: reader a of die d loads row a of its own window whole, again and
//    again, as a tff receiver loads a row, until every block reads the last round. For each block
//    whose head word shows a round it had not seen before, it counts the read, the block's other
//    words that are older than the head (what would make tff take stale data: a violation) and
//    those that are newer (the load itself was not whole: harmless to a head flag).
//
// Input: token [2] int64, as the preparation's. Outputs: counts [n, 4] int64 (a reader's row:
// reads, older words, newer words, 0; writers' rows stay 0) and scratch (status words).
#include "op_tiling.h"
#include "prepare.h"

namespace ubep_ascend {

using namespace AscendC;

constexpr int64_t PROBE_WORDS = BLOCK_BYTES / 4;  // int32 words of a block

class ProbeKernel {
 public:
  __aicore__ inline void Init(GM_ADDR token, GM_ADDR counts, GM_ADDR scratch, const EpTiling* tiling, TPipe* pipe) {
    t_ = tiling;
    counts_ = counts;
    row_bytes_ = t_->probe_blocks * BLOCK_BYTES;
    prepare_.Init(token, scratch, tiling, pipe);
    pipe->InitBuffer(row_buf_, static_cast<uint32_t>(row_bytes_));
    pipe->InitBuffer(tally_buf_, 32);
  }

  __aicore__ inline void Process() {
    const bool ready = prepare_.Process();
    SyncAll();  // each AIV met only its share of the dies: no writer starts before every die is ready
    if (!ready || prepare_.Context().Aborted()) return;
    const int64_t me = GetBlockIdx(), half = GetBlockNum() / 2;
    if (me < half) {
      Write(me);
    } else if (me < 2 * half) {
      Read(me - half, me);
    }
  }

 private:
  // Row `row` of the probe in die d's window (slot 0).
  __aicore__ inline GM_ADDR Row(int64_t d, int64_t row) {
    return prepare_.Context().windows.Base(d) + t_->slots_off + row * row_bytes_;
  }

  // row_buf: V fills, MTE3 copies out; the copies of one AIV leave in order.
  __aicore__ inline void Write(int64_t row) {
    const LocalTensor<int32_t> ub = row_buf_.Get<int32_t>();
    const GlobalTensor<int32_t> dst = Gm<int32_t>(Row((t_->rank + 1) % t_->world, row), row_bytes_);
    for (int64_t round = 1; round <= t_->probe_rounds; ++round) {
      Sync<HardEvent::MTE3_V>();  // the previous round's copy has read ub
      Duplicate<int32_t>(ub, static_cast<int32_t>(round), static_cast<int32_t>(row_bytes_ / 4));
      Sync<HardEvent::V_MTE3>();
      DataCopy(dst, ub, static_cast<uint32_t>(row_bytes_ / 4));
    }
  }

  // Polls the row until every block shows the last round, then writes its tally into counts row
  // `aiv`. row_buf: MTE2 loads, the scalar reads (LoadWire orders both ways); tally_buf: the scalar
  // writes, MTE3 copies out.
  __aicore__ inline void Read(int64_t row, int64_t aiv) {
    const int64_t source = (t_->rank + t_->world - 1) % t_->world;
    int32_t seen[PROBE_MAX_BLOCKS] = {};
    int64_t tally[4] = {0, 0, 0, 0};
    prepare_.Context().Poll(PHASE_PROBE, source, RowScan{this, Row(t_->rank, row), seen, tally});
    const LocalTensor<int64_t> out = tally_buf_.Get<int64_t>();
    for (uint32_t i = 0; i < 4; ++i) out.SetValue(i, tally[i]);
    Sync<HardEvent::S_MTE3>();
    DataCopy(Gm<int64_t>(counts_ + aiv * 32, 32), out, 4);
  }

  // One load of the row, tallied (see the top) into `tally`, with the last round each block showed
  // in `seen`; ready once every block shows the last round.
  struct RowScan {
    ProbeKernel* k;
    GM_ADDR at;
    int32_t* seen;
    int64_t* tally;
    __aicore__ inline bool operator()() const {
      const LocalTensor<uint8_t> wire = k->row_buf_.Get<uint8_t>();
      LoadWire(wire, at, k->row_bytes_);
      const LocalTensor<int32_t> w = wire.ReinterpretCast<int32_t>();
      bool done = true;
      for (int64_t b = 0; b < k->t_->probe_blocks; ++b) {
        const uint32_t first = static_cast<uint32_t>(b * PROBE_WORDS);
        const int32_t head = w.GetValue(first);
        if (head > seen[b]) {
          ++tally[0];
          for (uint32_t i = 1; i < PROBE_WORDS; ++i) {
            const int32_t v = w.GetValue(first + i);
            tally[1] += v < head ? 1 : 0;
            tally[2] += v > head ? 1 : 0;
          }
          seen[b] = head;
        }
        done = done && seen[b] == k->t_->probe_rounds;
      }
      return done;
    }
  };

  const EpTiling* t_;
  GM_ADDR counts_;
  int64_t row_bytes_;
  PrepareKernel prepare_;
  TBuf<TPosition::VECCALC> row_buf_, tally_buf_;
};

}  // namespace ubep_ascend

// The UbepProbe op's kernel (op_host/mc2/ubep_probe_def.cpp): its input, its outputs (`counts` and
// `scratch`, zeroed by the caller), the framework's workspace (unused) and the tiling. A MIX kernel
// type for the preparation's hard SyncAll, as UbepPrepare.
extern "C" __global__ __aicore__ void ubep_probe(GM_ADDR token, GM_ADDR counts, GM_ADDR scratch, GM_ADDR,
                                                 GM_ADDR tiling) {
  KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIV_1_0);
  REGISTER_TILING_DEFAULT(ubep_ascend::EpOpTiling);
  GET_TILING_DATA_WITH_STRUCT(ubep_ascend::EpOpTiling, op_tiling, tiling);
  AscendC::TPipe pipe;
  ubep_ascend::ProbeKernel op;
  op.Init(token, counts, scratch, &op_tiling.ep, &pipe);
  op.Process();
}
