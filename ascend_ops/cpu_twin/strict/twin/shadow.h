// The race checker's shadow memory. Every byte one AIV touches remembers the last operation that
// wrote it and, per pipe, the last that read it (site, pipe, number). An access races with an
// earlier one when they conflict (write/write or read/write on the byte) and the clocks give no
// happens-before edge between them: the chip may run them in either order. Keeping only the last
// write and the last read per pipe suffices: a later write is checked against all of them and
// orders after them, and clocks only grow, so being ordered after a pipe's newest access means
// being ordered after its older ones.
//
// UB: one shadow per UB byte, kept per 32-byte block while the block's bytes agree. GM: per AIV,
// only its own accesses, in a hash map of 64-byte granules; accesses by other AIVs and dies are
// never compared (the Data-as-Flag protocols poll peers' memory on purpose). Two unordered
// atomic-add copies of integers do not conflict (the sum does not depend on their order); of
// floats they do (the rounding does; atomic copies complete out of order).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "clocks.h"
#include "report.h"

namespace AscendC {
namespace twin {

// An operation as the checker sees it: its pipe, its number there, its call site.
struct Op {
  int pipe;
  uint32_t epoch;
  uint32_t site;
  bool int_atomic = false;  // an atomic-add copy of an integer type
};

struct Access {
  uint32_t epoch = 0;  // 0: none
  uint32_t tag = 0;    // site << 3 | int_atomic << 2 | pipe
  int pipe() const { return static_cast<int>(tag & 3); }
  bool int_atomic() const { return tag & 4; }
  uint32_t site() const { return tag >> 3; }
  bool Same(const Access& o) const { return epoch == o.epoch && (tag & 3) == (o.tag & 3); }
};

struct ShadowByte {
  Access w;
  Access r[kPipes];
};

inline Access AccessOf(const Op& op) {
  return {op.epoch, op.site << 3 | (op.int_atomic ? 4u : 0u) | static_cast<uint32_t>(op.pipe)};
}

// The earlier access `op` races with on this byte, or nullptr.
inline const Access* Conflict(const ShadowByte& b, const Op& op, bool write, const Clocks& c) {
  auto unordered = [&](const Access& a) {
    return a.epoch != 0 && !(a.pipe() == op.pipe && a.epoch == op.epoch) && !c.Ordered(a.pipe(), a.epoch, op.pipe);
  };
  if (write) {  // reads since the last write are newer than it: report them first
    for (const Access& r : b.r) {
      if (unordered(r)) return &r;
    }
  }
  if (unordered(b.w) && !(write && op.int_atomic && b.w.int_atomic())) return &b.w;
  return nullptr;
}

inline void Record(ShadowByte& b, const Op& op, bool write) {
  if (write) {
    b.w = AccessOf(op);
    for (Access& r : b.r) r = Access{};
  } else {
    b.r[op.pipe] = AccessOf(op);
  }
}

inline std::string RaceReport(const std::string& range, const Access& first, bool first_writes, const Op& second,
                              bool second_writes, const Clocks& c) {
  const int a = first.pipe(), b = second.pipe;
  std::string fix;
  if (a == b) {
    fix = Format("%s has passed a PipeBarrier<%s> only up to its op #%u; put PipeBarrier<%s>() between them",
                 PipeName(b), PipeName(b), c.K[b][b], PipeName(b));
  } else {
    const char* names[] = {"S", "V", "MTE2", "MTE3"};
    fix = Format("%s has synchronized with %s only up to its op #%u; put SetFlag/WaitFlag<HardEvent::%s_%s> "
                 "between them (or a TQue whose events cover this pair)",
                 PipeName(b), PipeName(a), c.K[b][a], names[a], names[b]);
  }
  return Format("data race on %s:\n  first : %s %s them on %s (op #%u of that pipe)\n  second: %s %s them on %s "
                "(op #%u of that pipe)\n  nothing orders them: %s",
                range.c_str(), Sites::Describe(first.site()).c_str(), first_writes ? "writes" : "reads",
                PipeName(a), first.epoch, Sites::Describe(second.site).c_str(), second_writes ? "writes" : "reads",
                PipeName(b), second.epoch, fix.c_str());
}

// A block of B bytes' shadow: one ShadowByte while every byte has the same history (the common
// case: DMA and vector operands are whole 32-byte blocks), split per byte when an access covers
// only part of it, merged again once a write covers it whole.
template <uint64_t B>
struct ShadowBlock {
  ShadowByte whole;
  std::unique_ptr<ShadowByte[]> bytes;
  const ShadowByte& At(uint64_t i) const { return bytes ? bytes[i] : whole; }
};

// Checks and records [begin, begin + n) for `op`; `block(k)` gives the k-th ShadowBlock<B>,
// `name(lo, hi)` describes a byte range. Aborts at the first race, naming the largest run of
// bytes that races with the same earlier access.
template <uint64_t B, class Get, class Name>
void CheckRange(Get block, Name name, uint64_t begin, uint64_t n, const Op& op, bool write, const Clocks& c) {
  const uint64_t end = begin + n;
  auto report = [&](uint64_t at, const Access* hit, bool first_writes) {
    const Access first = *hit;
    uint64_t stop = at + 1;
    for (; stop < end; ++stop) {
      const Access* next = Conflict(block(stop / B).At(stop % B), op, write, c);
      if (!next || !next->Same(first)) break;
    }
    Fail(RaceReport(name(at, stop), first, first_writes, op, write, c));
  };
  for (uint64_t lo = begin; lo < end;) {
    ShadowBlock<B>& blk = block(lo / B);
    const uint64_t base = lo / B * B, hi = std::min(end, base + B);
    const bool full = lo == base && hi == base + B;
    if (full && !blk.bytes) {
      if (const Access* hit = Conflict(blk.whole, op, write, c)) report(lo, hit, hit == &blk.whole.w);
      Record(blk.whole, op, write);
    } else {
      if (!blk.bytes) {
        blk.bytes.reset(new ShadowByte[B]);
        for (uint64_t i = 0; i < B; ++i) blk.bytes[i] = blk.whole;
      }
      for (uint64_t a = lo; a < hi; ++a) {
        ShadowByte& b = blk.bytes[a - base];
        if (const Access* hit = Conflict(b, op, write, c)) report(a, hit, hit == &b.w);
        Record(b, op, write);
      }
      bool same = full;
      for (uint64_t i = 1; same && i < B; ++i) {
        same = std::memcmp(&blk.bytes[i], &blk.bytes[0], sizeof(ShadowByte)) == 0;
      }
      if (same) {
        blk.whole = blk.bytes[0];
        blk.bytes.reset();
      }
    }
    lo = hi;
  }
}

// UB: 32-byte blocks over the usable UB.
class UbShadow {
 public:
  static constexpr uint64_t kBlock = 32;
  explicit UbShadow(uint32_t bytes) : blocks_((bytes + kBlock - 1) / kBlock) {}
  ShadowBlock<kBlock>& Block(uint64_t k) { return blocks_[k]; }

 private:
  std::vector<ShadowBlock<kBlock>> blocks_;
};

// GM: this AIV's own accesses, in 64-byte granules of a hash map.
class GmShadow {
 public:
  static constexpr uint64_t kBlock = 64;
  ShadowBlock<kBlock>& Block(uint64_t k) {
    if (k != last_key_ || !last_) {  // map nodes stay put: the pointer lives until Clear
      last_key_ = k;
      last_ = &granules_[k];
    }
    return *last_;
  }
  const ShadowByte* Find(uint64_t addr) const {
    auto it = granules_.find(addr / kBlock);
    return it == granules_.end() ? nullptr : &it->second.At(addr % kBlock);
  }
  // After PipeBarrier<PIPE_ALL> every earlier access is ordered before every later one.
  void Clear() {
    granules_.clear();
    last_ = nullptr;
  }

 private:
  uint64_t last_key_ = 0;
  ShadowBlock<kBlock>* last_ = nullptr;
  std::unordered_map<uint64_t, ShadowBlock<kBlock>> granules_;
};

}  // namespace twin
}  // namespace AscendC
