// One AIV's scalar data cache (A2/A3: 32 KB, 64-byte lines, private, write-back, no coherence;
// docs/ASCEND.md, "The scalar data cache"). GlobalTensor GetValue/SetValue/operator() go through
// it; DMA bypasses it.
// - A scalar access fills the whole line from GM if it is absent (writes allocate too) and then
//   uses the cached bytes, stale if GM changed since. Capacity eviction is LRU (deterministic).
// - DataCacheCleanAndInvalid writes a dirty line back WHOLE, as the hardware does, and drops it.
//   Before writing back, the bytes this AIV did not write are compared with GM: if another AIV or
//   die, or a DMA, changed them since the fill, the write-back would put the stale copy over their
//   write; the twin aborts ("false sharing") instead of losing it.
// - A DMA of this AIV into a cached line marks those bytes stale; so do bytes whose last DMA
//   write was not ordered before the fill (the fill may have read them before the DMA landed). A
//   scalar read of stale bytes aborts ("stale scalar read") until the line is invalidated.
// - A DMA that reads or overwrites bytes still dirty here aborts: it reads GM, not the cache, and
//   the later write-back would undo it.
// - Dirty lines at the end of the kernel abort ("scalar GM writes never cleaned").
// Not modelled: hardware prefetch, raw __gm__ pointer dereferences (they bypass the twin).
#pragma once

#include <cstdint>
#include <cstring>
#include <list>
#include <string>
#include <unordered_map>

#include "report.h"
#include "windows.h"

namespace AscendC {
namespace twin {

constexpr uint64_t kLineBytes = 64;
constexpr size_t kCacheLines = 32 * 1024 / kLineBytes;

// Byte ranges of a 64-bit per-byte mask over the line at `line`, as "[0x..., 0x...)" pieces.
inline std::string MaskRanges(uint64_t mask, uint64_t line) {
  std::string s;
  for (int i = 0; i < 64;) {
    if (!(mask >> i & 1)) {
      ++i;
      continue;
    }
    int j = i;
    while (j < 64 && (mask >> j & 1)) ++j;
    s += Format("%s[0x%" PRIx64 ", 0x%" PRIx64 ")", s.empty() ? "" : ", ", line + i, line + j);
    i = j;
  }
  return s.empty() ? "none" : s;
}

inline uint64_t ByteMask(uint64_t first, uint64_t n) {
  return n >= 64 ? ~0ull : ((1ull << n) - 1) << first;
}

// What the cache needs from the race checker of its AIV.
struct DCacheHooks {
  virtual ~DCacheHooks() = default;
  virtual uint64_t UnorderedDmaBytes(uint64_t line) = 0;               // at a fill
  virtual void WroteBack(uint64_t line, uint64_t mask, uint32_t site) = 0;  // S writes GM
};

class DCache {
 public:
  void Read(uint64_t addr, void* out, uint64_t n, uint32_t site, DCacheHooks& h) {
    Line& l = Get(addr, site, h);
    const uint64_t m = ByteMask(addr - l.addr, n);
    if (l.stale & m) {
      Fail(Format("stale scalar read: %s reads GM [0x%" PRIx64 ", 0x%" PRIx64 ") through the DCache, but a DMA "
                  "of this AIV wrote %s after the line was filled (or unordered with the fill) and the line was "
                  "not invalidated since; call DataCacheCleanAndInvalid<T, CacheLine::SINGLE_CACHE_LINE, "
                  "DcciDst::CACHELINE_OUT> on it first",
                  Sites::Describe(site).c_str(), addr, addr + n, MaskRanges(l.stale & m, l.addr).c_str()));
    }
    std::memcpy(out, l.data + (addr - l.addr), n);
  }
  void Write(uint64_t addr, const void* in, uint64_t n, uint32_t site, DCacheHooks& h) {
    Line& l = Get(addr, site, h);
    const uint64_t m = ByteMask(addr - l.addr, n);
    std::memcpy(l.data + (addr - l.addr), in, n);
    l.dirty |= m;
    l.stale &= ~m;
    l.write_site = site;
  }
  void CleanInvalidate(uint64_t addr, uint32_t site, DCacheHooks& h) {
    auto it = index_.find(addr & ~(kLineBytes - 1));
    if (it == index_.end()) return;
    WriteBack(*it->second, site, "", h);
    lru_.erase(it->second);
    index_.erase(it);
  }
  void CleanInvalidateAll(uint32_t site, DCacheHooks& h) {
    for (Line& l : lru_) WriteBack(l, site, "", h);
    lru_.clear();
    index_.clear();
  }
  // A DMA of this AIV reads (write == false) or writes GM [addr, addr + n).
  void Dma(uint64_t addr, uint64_t n, bool write, uint32_t site) {
    if (index_.empty()) return;
    for (uint64_t line = addr & ~(kLineBytes - 1); line < addr + n; line += kLineBytes) {
      auto it = index_.find(line);
      if (it == index_.end()) continue;
      Line& l = *it->second;
      const uint64_t lo = addr > line ? addr - line : 0, hi = addr + n < line + 64 ? addr + n - line : 64;
      const uint64_t m = ByteMask(lo, hi - lo);
      if (l.dirty & m) {
        Fail(Format("%s %s GM %s, which this AIV's scalar writes (last %s) still hold dirty in its DCache: the "
                    "DMA bypasses the cache%s; clean the line (DataCacheCleanAndInvalid) and order S before the "
                    "DMA first",
                    Sites::Describe(site).c_str(), write ? "writes" : "reads", MaskRanges(l.dirty & m, line).c_str(),
                    Sites::Describe(l.write_site).c_str(),
                    write ? " and the line's later write-back would undo it" : " and reads the old bytes"));
      }
      if (write) l.stale |= m;
    }
  }
  void CheckClean() const {
    std::string lines;
    for (const Line& l : lru_) {
      if (l.dirty) lines += Format("\n  line 0x%" PRIx64 ": bytes %s (last write %s)", l.addr,
                                   MaskRanges(l.dirty, l.addr).c_str(), Sites::Describe(l.write_site).c_str());
    }
    if (!lines.empty()) {
      Fail("scalar GM writes never cleaned: the kernel ended with dirty DCache lines; on the chip other AIVs, "
           "dies and the host may never see them (DataCacheCleanAndInvalid each line after writing it):" + lines);
    }
  }

 private:
  struct Line {
    uint64_t addr = 0;
    uint8_t data[kLineBytes];
    uint8_t orig[kLineBytes];  // GM as filled
    uint64_t dirty = 0, stale = 0;
    uint32_t write_site = 0;
  };

  Line& Get(uint64_t addr, uint32_t site, DCacheHooks& h) {
    const uint64_t line = addr & ~(kLineBytes - 1);
    auto it = index_.find(line);
    if (it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      return lru_.front();
    }
    if (lru_.size() == kCacheLines) {
      WriteBack(lru_.back(), site, "capacity eviction caused by ", h);
      index_.erase(lru_.back().addr);
      lru_.pop_back();
    }
    lru_.emplace_front();
    Line& l = lru_.front();
    l.addr = line;
    {
      LineLock g(reinterpret_cast<const uint8_t*>(line));
      std::memcpy(l.data, reinterpret_cast<const uint8_t*>(line), kLineBytes);
    }
    std::memcpy(l.orig, l.data, kLineBytes);
    l.stale = h.UnorderedDmaBytes(line);
    index_[line] = lru_.begin();
    return l;
  }

  void WriteBack(Line& l, uint32_t site, const char* why, DCacheHooks& h) {
    if (!l.dirty) return;
    uint8_t* gm = reinterpret_cast<uint8_t*>(l.addr);
    LineLock g(gm);
    uint64_t changed = 0;
    for (uint64_t i = 0; i < kLineBytes; ++i) {
      if (!(l.dirty >> i & 1) && gm[i] != l.orig[i]) changed |= 1ull << i;
    }
    const uint64_t own_dma = l.stale & ~l.dirty;
    if (changed | own_dma) {
      Fail(Format("false sharing: the write-back of GM line 0x%" PRIx64 " (%s%s) writes all 64 bytes, but bytes %s "
                  "changed in GM since this AIV filled the line (another AIV or die, or a DMA, wrote them)%s%s; this "
                  "AIV's scalar writes in the line: %s (last %s); on the chip the stale copy overwrites the other "
                  "writer. Keep words that different writers write by scalar 64 bytes apart, or write them by DMA",
                  l.addr, why, Sites::Describe(site).c_str(), MaskRanges(changed, l.addr).c_str(),
                  own_dma ? " and bytes " : "", own_dma ? (MaskRanges(own_dma, l.addr) +
                  " were written by a DMA of this AIV after, or unordered with, the fill").c_str() : "",
                  MaskRanges(l.dirty, l.addr).c_str(), Sites::Describe(l.write_site).c_str()));
    }
    // The other bytes equal GM (checked above), so writing only the dirty ones has the effect of
    // the whole-line write-back without touching host bytes outside the kernel's objects.
    for (uint64_t i = 0; i < kLineBytes; ++i) {
      if (l.dirty >> i & 1) gm[i] = l.data[i];
    }
    h.WroteBack(l.addr, l.dirty, site);
    l.dirty = 0;
  }

  std::list<Line> lru_;  // most recently used first
  std::unordered_map<uint64_t, std::list<Line>::iterator> index_;
};

}  // namespace twin
}  // namespace AscendC
