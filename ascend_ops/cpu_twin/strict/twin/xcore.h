// Cross-core publication: the fences one AIV's GM writes need before another AIV may rely on them.
// On the chip an AIV's MTE3 copies to GM complete asynchronously and may become visible to other
// AIVs and dies out of order (a later copy first) unless an ordering point of its MTE3 pipe lies
// between them: PipeBarrier<PIPE_MTE3> or <PIPE_ALL>, a SetFlag whose source is MTE3, SyncAll
// (hard or soft), the end of the kernel. The twin applies every copy at once, in program order, so
// a missing fence cannot show up in the data; this check finds it deterministically instead.
//
// - Writers: every AIV has a writer id (its die, its block index), an issue number s for its MTE3
//   GM writes and a fence generation g, raised at each ordering point of its MTE3 pipe and at the
//   start and end of the launch. Both carry the process's launch number in their high bits, so
//   what an earlier launch left never compares as this launch's. Every MTE3 write (DataCopy and
//   DataCopyPad UB->GM, plain or atomic) stamps each 32-byte granule it touches with (writer, s, g,
//   call site): in a window, in the stamp table beside it in the same shared mapping (windows.h);
//   elsewhere in GM (the die's own memory: scratch, counters, outputs), in a table of the process.
//   A granule keeps its last XCORE_STAMPS writers in a window and every writer in process memory
//   (up to kLocalStamps): an atomic add or a partial write adds a writer, a write of the whole
//   granule replaces them.
// - Readers: every MTE2 read of GM (DataCopy and DataCopyPad GM->UB) first CHECKS, then OBSERVES.
//   For each granule it reads, written by another AIV w with stamp (w, s_d, g_d): if an EARLIER read
//   of this AIV in this launch saw a write of w with s > s_d and the same generation g_d (w issued
//   the data, then that write, with no fence between them: the chip may have shown this AIV the
//   later write while the data was still in flight), the twin aborts with "cross-core race", unless
//   this AIV already read the same 512-byte transaction of that very write (it landed whole,
//   windows.h: a tff row re-read, a flag re-polled). Then it observes: its record of w becomes the
//   newest write of w it has seen (the largest s; a write of a later generation proves w passed a
//   fence after everything of the earlier ones), and the transactions it read are remembered.
// - Skipped: an AIV's reads of its own writes (the race checker's business); writes of an earlier
//   launch of this process; writes of another die's launch that had ended when this launch started
//   (each die records its ended launches in every window's table at the end of a launch).
// The check depends only on the order of one reader's operations and the stamps it reads, so a
// report does not depend on timing: it fires when the protocol lets a reader see a later write
// before an earlier one, whether or not this run showed it. (One exception: whether another die's
// launch had ended when the reader's started. Where a writer die can run its whole launch before the
// reader's starts, which no ubep kernel allows (each die waits for every peer's count message), a
// run where it did is not checked.)
//
// Not checked: scalar GM accesses (GetValue/SetValue through the DCache, raw __gm__ dereferences);
// ordering learnt through a third AIV (w's data, read after v's flag that v raised after seeing
// w's counter: only pairs of writes of one writer are compared); a read that takes the flag and
// the data in one operation; a reader that first reads a self-validating write (its own flag
// inside, as a tff row) of w after a later one of w, which is no race (it would re-poll) but is
// reported as one.
#pragma once

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdint>
#include <cstring>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "report.h"
#include "windows.h"

namespace AscendC {
namespace twin {

struct Stamp {
  uint64_t s = 0;       // the writer's MTE3 write number (launch << kLaunchShift | n); 0: no write
  uint64_t g = 0;       // its fence generation at that write (launch << kLaunchShift | n)
  uint32_t writer = 0;  // WriterId(die, block)
  uint32_t site = 0;    // window: index in the window's site table; other GM: Sites id in its process
  bool SameWrite(const Stamp& o) const { return s == o.s && writer == o.writer && g == o.g && site == o.site; }
};
static_assert(sizeof(Stamp) == XCORE_STAMP_BYTES, "windows.h sizes the stamp table with XCORE_STAMP_BYTES");

constexpr int kLaunchShift = 40;
constexpr uint32_t kNoSite = 0xFFFFFFFFu;
constexpr size_t kLocalStamps = 64;  // writers a granule of process memory remembers (atomic counters)

inline uint64_t LaunchOf(uint64_t v) { return v >> kLaunchShift; }
inline uint32_t WriterId(int64_t die, int64_t block) {
  return static_cast<uint32_t>((die + 1) & 0xFFFF) << 16 | static_cast<uint32_t>(block & 0xFFFF);
}
inline int64_t DieOf(uint32_t writer) { return static_cast<int64_t>(writer >> 16) - 1; }
inline std::string WriterName(uint32_t writer) {
  const int64_t die = DieOf(writer), block = writer & 0xFFFF;
  return die < 0 ? Format("AIV %" PRId64 " of die ?", block) : Format("AIV %" PRId64 " of die %" PRId64, block, die);
}

// This process's launches so far (twin::launch numbers them from 1).
inline uint64_t launch_serial = 0;

// ---- the tables beside a window (windows.h gives their place and size) ----

struct WindowTable {
  uint32_t lock;
  uint32_t sites;  // entries of `site` in use
  uint8_t pad[56];
  uint64_t ended[XCORE_DIES];             // the last launch of die d (its process's number) that ended
  char site[XCORE_SITES][XCORE_SITE_CHARS];  // "API at file:line" of the writes stamped in this window
};
static_assert(sizeof(WindowTable) == XCORE_TABLE_BYTES, "windows.h sizes the table with XCORE_TABLE_BYTES");

inline int RegionOf(const uint8_t* p) {
  for (size_t i = 0; i < shared_regions.size(); ++i) {
    const Region& r = shared_regions[i];
    if (p >= r.base && p < r.base + r.bytes) return static_cast<int>(i);
  }
  return -1;
}
inline Stamp* WindowStamps(const Region& r, const uint8_t* granule) {
  return reinterpret_cast<Stamp*>(r.base + stamp_table_offset(r.bytes)) + (granule - r.base) / XCORE_GRANULE * XCORE_STAMPS;
}
inline WindowTable& TableOf(const Region& r) {
  return *reinterpret_cast<WindowTable*>(r.base + stamp_table_offset(r.bytes) + stamp_table_bytes(r.bytes));
}

// The index of `name` in the window's site table (shared by every die that maps the window).
inline uint32_t RegisterSite(const Region& r, const std::string& full) {
  const std::string name = full.size() < XCORE_SITE_CHARS ? full : "..." + full.substr(full.size() - (XCORE_SITE_CHARS - 4));
  WindowTable& t = TableOf(r);
  lock(&t.lock);
  uint32_t i = 0;
  const uint32_t n = std::min<uint32_t>(t.sites, XCORE_SITES);
  while (i < n && std::strncmp(t.site[i], name.c_str(), XCORE_SITE_CHARS) != 0) ++i;
  if (i == n) {
    if (n < XCORE_SITES) {
      std::memcpy(t.site[n], name.c_str(), name.size() + 1);
      t.sites = n + 1;
    } else {
      i = kNoSite;
    }
  }
  unlock(&t.lock);
  return i;
}

inline std::string SiteName(int region, uint32_t site) {
  if (region < 0) return Sites::Describe(site);
  if (site == kNoSite || static_cast<size_t>(region) >= shared_regions.size()) return "(a call site the window's table had no room for)";
  const WindowTable& t = TableOf(shared_regions[static_cast<size_t>(region)]);
  return std::string(t.site[site], strnlen(t.site[site], XCORE_SITE_CHARS));
}

// The launches of every die that had ended (by the windows' tables) when this launch starts.
inline std::vector<uint64_t> EndedLaunches() {
  std::vector<uint64_t> ended(XCORE_DIES, 0);
  for (const Region& r : shared_regions) {
    const WindowTable& t = TableOf(r);
    for (int64_t d = 0; d < XCORE_DIES; ++d) ended[d] = std::max(ended[d], __atomic_load_n(&t.ended[d], __ATOMIC_ACQUIRE));
  }
  return ended;
}
// At the end of a launch: every window's table records it as this die's last ended launch.
inline void PublishEnded(int64_t die, uint64_t launch) {
  if (die < 0 || die >= XCORE_DIES) return;
  std::atomic_thread_fence(std::memory_order_seq_cst);
  for (const Region& r : shared_regions) __atomic_store_n(&TableOf(r).ended[die], launch, __ATOMIC_RELEASE);
}

// ---- the table of process memory (GM outside windows) ----

class LocalStamps {
 public:
  static LocalStamps& Get() {
    static LocalStamps t;
    return t;
  }
  // The lock of the 512-byte chunk at p, held while a copy moves its bytes and their stamps.
  uint32_t* Lock(const uint8_t* p) { return &stripes_[Index(p)].lock; }
  // The writers of the granule at p; the caller holds Lock(p).
  std::vector<Stamp>& At(const uint8_t* p) { return stripes_[Index(p)].map[Key(p)]; }
  const std::vector<Stamp>* Find(const uint8_t* p) const {
    const auto& m = stripes_[Index(p)].map;
    auto it = m.find(Key(p));
    return it == m.end() ? nullptr : &it->second;
  }
  // At the start of a launch (no AIV runs): an earlier launch's stamps would be skipped anyway.
  void Clear() {
    for (Stripe& s : stripes_) s.map.clear();
  }

 private:
  static constexpr size_t kStripes = 1024;
  struct Stripe {
    uint32_t lock = 0;
    std::unordered_map<uint64_t, std::vector<Stamp>> map;
  };
  static uint64_t Key(const uint8_t* p) { return reinterpret_cast<uintptr_t>(p) / XCORE_GRANULE; }
  static size_t Index(const uint8_t* p) { return reinterpret_cast<uintptr_t>(p) / GM_TRANSACTION % kStripes; }
  std::vector<Stripe> stripes_ = std::vector<Stripe>(kStripes);
};

// A granule's writers after `st`: `replace` (a plain write of the whole granule) leaves st alone;
// otherwise st comes first and the other writers' latest stamps follow, up to cap.
inline void PushStamp(Stamp* c, size_t cap, const Stamp& st, bool replace) {
  size_t n = 1;
  Stamp keep[XCORE_STAMPS];
  keep[0] = st;
  for (size_t i = 0; i < cap && !replace && n < cap; ++i) {
    if (c[i].s != 0 && c[i].writer != st.writer) keep[n++] = c[i];
  }
  for (size_t i = 0; i < cap; ++i) c[i] = i < n ? keep[i] : Stamp{};
}
inline void PushStamp(std::vector<Stamp>& c, const Stamp& st, bool replace) {
  if (replace) {
    c.assign(1, st);
    return;
  }
  c.erase(std::remove_if(c.begin(), c.end(), [&](const Stamp& o) { return o.writer == st.writer; }), c.end());
  c.insert(c.begin(), st);
  if (c.size() > kLocalStamps) c.resize(kLocalStamps);
}

// GM [lo, hi) that a read took from granules stamped `st` (in window `region`, -1: process memory).
struct Seen {
  uint64_t lo, hi;
  int region;
  Stamp st;
};

// ---- one AIV's side ----

class Publication {
 public:
  // Called as the AIV starts: `ended` is the launch's snapshot of EndedLaunches().
  void Start(int64_t die, int64_t block, uint64_t launch, const std::vector<uint64_t>* ended) {
    die_ = die;
    me_ = WriterId(die, block);
    launch_ = launch;
    ended_ = ended;
    s_ = launch << kLaunchShift;
    g_ = (launch << kLaunchShift) + 1;  // the start of the launch is an ordering point
  }
  // An ordering point of the MTE3 pipe: every earlier MTE3 write lands before any later one.
  void Fence() { ++g_; }
  // The stamp of the next MTE3 write (one per operation, whatever its blocks).
  Stamp NextWrite(uint32_t site) { return Stamp{++s_, g_, me_, site}; }
  // The stamp's site as the window `region` names it (registered once per launch).
  uint32_t WindowSite(int region, uint32_t site) {
    const uint64_t key = static_cast<uint64_t>(region) << 32 | site;
    auto it = window_sites_.find(key);
    if (it != window_sites_.end()) return it->second;
    const uint32_t i = RegisterSite(shared_regions[static_cast<size_t>(region)], Sites::Describe(site));
    window_sites_.emplace(key, i);
    return i;
  }
  std::vector<Seen>& Scratch() {
    seen_.clear();
    return seen_;
  }

  // A read (MTE2, at `read_site`) took the bytes `seen` describes: check, then observe.
  void CheckRead(uint32_t read_site, const std::vector<Seen>& seen) {
    for (const Seen& x : seen) {
      if (Skip(x.st)) continue;
      auto it = observed_.find(x.st.writer);
      if (it == observed_.end() || it->second.s <= x.st.s || it->second.g != x.st.g) continue;
      // A 512-byte transaction of the write that this AIV already saw has landed whole (windows.h):
      // a tff row re-read after later rows, a flag re-polled. Any other one may still be in flight.
      for (uint64_t c = x.lo / GM_TRANSACTION; c * GM_TRANSACTION < x.hi; ++c) {
        if (chunks_.count(Chunk{x.st.writer, x.st.s, c})) continue;
        Seen part = x;
        part.lo = std::max<uint64_t>(x.lo, c * GM_TRANSACTION);
        part.hi = std::min<uint64_t>(x.hi, (c + 1) * GM_TRANSACTION);
        Report(read_site, part, it->second);
      }
    }
    for (const Seen& x : seen) {
      if (Skip(x.st)) continue;
      Observed& o = observed_[x.st.writer];
      if (x.st.s > o.s) o = Observed{x.st.s, x.st.g, x.region, x.st.site, read_site, x.lo, x.hi};
      for (uint64_t c = x.lo / GM_TRANSACTION; c * GM_TRANSACTION < x.hi; ++c) chunks_.insert(Chunk{x.st.writer, x.st.s, c});
    }
  }

 private:
  struct Observed {
    uint64_t s = 0, g = 0;
    int region = -1;
    uint32_t write_site = 0, read_site = 0;
    uint64_t lo = 0, hi = 0;
  };
  // A 512-byte transaction (GM address / 512) of one write (writer, s) that this AIV has read.
  struct Chunk {
    uint32_t writer;
    uint64_t s, chunk;
    bool operator==(const Chunk& o) const { return writer == o.writer && s == o.s && chunk == o.chunk; }
  };
  struct ChunkHash {
    size_t operator()(const Chunk& k) const {
      return std::hash<uint64_t>()((k.s * 0x9E3779B97F4A7C15ull) ^ (k.chunk * 0xC2B2AE3D27D4EB4Full) ^ k.writer);
    }
  };

  bool Skip(const Stamp& st) const {
    if (st.s == 0 || st.writer == me_) return true;
    const int64_t die = DieOf(st.writer);
    if (die == die_) return LaunchOf(st.s) < launch_;  // this process's earlier launches ended
    return ended_ && die >= 0 && die < XCORE_DIES && LaunchOf(st.s) <= (*ended_)[static_cast<size_t>(die)];
  }

  static std::string Bytes(uint64_t lo, uint64_t hi, int region) {
    std::string b = Format("[0x%" PRIx64 ", 0x%" PRIx64 ")", lo, hi);
    if (region >= 0) {
      const Region& r = shared_regions[static_cast<size_t>(region)];
      const uint64_t base = reinterpret_cast<uintptr_t>(r.base);
      b += Format(" (window %d + [0x%" PRIx64 ", 0x%" PRIx64 "))", region, lo - base, hi - base);
    }
    return b;
  }

  [[noreturn]] void Report(uint32_t read_site, const Seen& x, const Observed& o) const {
    const std::string writer = WriterName(x.st.writer);
    const std::string data_site = SiteName(x.region, x.st.site), flag_site = SiteName(o.region, o.write_site);
    const uint64_t mask = (uint64_t{1} << kLaunchShift) - 1;
    Fail("cross-core race: " + WriterName(me_) + " read bytes " + Bytes(x.lo, x.hi, x.region) + " that " + writer +
         " wrote at " + data_site + " before " + flag_site +
         ", which it let become visible with no fence between them (PipeBarrier<PIPE_MTE3> / PIPE_ALL / "
         "SetFlag<MTE3_*> / SyncAll)\n  now:     " + Sites::Describe(read_site) + " reads the bytes of " + writer +
         Format("'s MTE3 write #%" PRIu64, x.st.s & mask) + " (" + data_site + ")\n  earlier: " +
         Sites::Describe(o.read_site) + " read bytes " + Bytes(o.lo, o.hi, o.region) + " of its later write " +
         Format("#%" PRIu64, o.s & mask) + " (" + flag_site + "), issued after #" +
         Format("%" PRIu64 " with no ordering point of its MTE3 pipe in between (fence generation %" PRIu64 ")",
                x.st.s & mask, x.st.g & mask) +
         "\n  on the chip the later write may land first, so this read may return the bytes from before " +
         data_site + "; put PipeBarrier<PIPE_MTE3>() between the two writes on " + writer);
  }

  int64_t die_ = -1;
  uint32_t me_ = 0;
  uint64_t launch_ = 0, s_ = 0, g_ = 0;
  const std::vector<uint64_t>* ended_ = nullptr;
  std::unordered_map<uint64_t, uint32_t> window_sites_;
  std::unordered_map<uint32_t, Observed> observed_;  // per writer: the newest write this AIV read
  std::unordered_set<Chunk, ChunkHash> chunks_;       // every transaction of another AIV's write it read
  std::vector<Seen> seen_;
};

// ---- GM copies that stamp and collect ----

// body(i, len, region) for each piece of GM [gm, gm + n) (piece_bytes: inside one 512-byte chunk),
// in address order, under the chunk's lock (a window's, or the process table's stripe).
template <class Body>
void GmPieces(const uint8_t* gm, int64_t n, Body body) {
  before_window_copy(gm);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  for (int64_t i = 0; i < n;) {
    const int region = RegionOf(gm + i);
    const int64_t len = piece_bytes(gm + i, n - i, region >= 0, i);
    uint32_t* l = region >= 0 ? chunk_lock(gm + i) : LocalStamps::Get().Lock(gm + i);
    lock(l);
    body(i, len, region);
    unlock(l);
    i += len;
  }
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

inline uint8_t* GranuleOf(const uint8_t* p) {
  return reinterpret_cast<uint8_t*>(reinterpret_cast<uintptr_t>(p) / XCORE_GRANULE * XCORE_GRANULE);
}

// Stamps the granules of GM [p, p + len) (one chunk's piece) with `st`; `add`: an atomic add.
inline void StampPiece(Publication& pub, const uint8_t* p, int64_t len, int region, const Stamp& st, bool add) {
  Stamp w = st;
  if (region >= 0) w.site = pub.WindowSite(region, st.site);
  for (uint8_t* gr = GranuleOf(p); gr < p + len; gr += XCORE_GRANULE) {
    const bool whole = !add && gr >= p && gr + XCORE_GRANULE <= p + len;
    if (region >= 0) {
      PushStamp(WindowStamps(shared_regions[static_cast<size_t>(region)], gr), XCORE_STAMPS, w, whole);
    } else {
      PushStamp(LocalStamps::Get().At(gr), w, whole);
    }
  }
}

inline void AddSeen(std::vector<Seen>& out, const Seen& s) {
  for (size_t k = out.size(), back = 0; k > 0 && back < 4; --k, ++back) {
    Seen& o = out[k - 1];
    if (o.hi == s.lo && o.region == s.region && o.st.SameWrite(s.st)) {
      o.hi = s.hi;
      return;
    }
  }
  out.push_back(s);
}

// Appends the stamps of the granules of GM [p, p + len) (one chunk's piece) to `out`.
inline void CollectPiece(const uint8_t* p, int64_t len, int region, std::vector<Seen>& out) {
  const uint64_t lo = reinterpret_cast<uintptr_t>(p), hi = lo + static_cast<uint64_t>(len);
  for (uint8_t* gr = GranuleOf(p); gr < p + len; gr += XCORE_GRANULE) {
    const uint64_t a = std::max<uint64_t>(lo, reinterpret_cast<uintptr_t>(gr));
    const uint64_t b = std::min<uint64_t>(hi, reinterpret_cast<uintptr_t>(gr) + XCORE_GRANULE);
    if (region >= 0) {
      const Stamp* c = WindowStamps(shared_regions[static_cast<size_t>(region)], gr);
      for (int64_t k = 0; k < XCORE_STAMPS; ++k) {
        if (c[k].s != 0) AddSeen(out, Seen{a, b, region, c[k]});
      }
    } else if (const std::vector<Stamp>* c = LocalStamps::Get().Find(gr)) {
      for (const Stamp& st : *c) AddSeen(out, Seen{a, b, region, st});
    }
  }
}

// MTE3: n bytes from UB `ub` to GM `gm`, stamped; `add` (atomic mode) adds elements of elem bytes.
inline void GmWrite(Publication& pub, const Stamp& st, uint8_t* gm, const uint8_t* ub, int64_t n,
                    void (*add)(uint8_t*, const uint8_t*, int64_t), int64_t elem) {
  GmPieces(gm, n, [&](int64_t i, int64_t len, int region) {
    if (add) {
      add(gm + i, ub + i, len / elem);
    } else {
      std::memcpy(gm + i, ub + i, static_cast<size_t>(len));
    }
    StampPiece(pub, gm + i, len, region, st, add != nullptr);
  });
}

// MTE2: n bytes from GM `gm` to UB `ub`, the stamps of what it read appended to `seen`.
inline void GmRead(uint8_t* ub, const uint8_t* gm, int64_t n, std::vector<Seen>& seen) {
  GmPieces(gm, n, [&](int64_t i, int64_t len, int region) {
    std::memcpy(ub + i, gm + i, static_cast<size_t>(len));
    CollectPiece(gm + i, len, region, seen);
  });
}

}  // namespace twin
}  // namespace AscendC
