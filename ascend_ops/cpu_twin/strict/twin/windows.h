// GM as the twin moves it: host memory, where a die's HBM window is a shared /dev/shm mapping that
// every die process maps (as HCCL windows are reachable on an A3). The model the multi-die tests
// rely on:
// - A DataCopy into or out of a window is delivered as 512-byte aligned transactions, each seen
//   whole: every 512-byte chunk of a window has a lock in a table after the window, held while a
//   copy writes or reads the chunk. Chunks of one copy land in address order. This is an
//   assumption (MC2's 480+32 B blocks rely on it too; A2/A3 documents only "moves are split into
//   128/256/512 B pieces"), not a documented guarantee: docs/ASCEND.md, "What each mode assumes".
// - A scalar cache line (64 B) lies inside one chunk; filling or writing one back takes the
//   chunk's lock, or for non-window GM a striped lock, so a line is read and written whole.
// - UBEP_TWIN_JITTER_US=N makes every window copy first sleep 0..N us (per-AIV random), which
//   reorders AIVs and dies far more than scheduling alone does.
// - UBEP_TWIN_SLOW_AIV=die:aiv:us makes every window copy of that one AIV of that die sleep us
//   first: one AIV far behind the others of its die, which even jitter rarely produces.
// - UBEP_TWIN_PIECE=bytes:us breaks the 512-byte assumption on purpose: window copies move in
//   pieces of `bytes` (64, 128 or 256: the documented 128 / 256-byte moves, or a cache line), each
//   seen whole, pieces in address order with `us` microseconds between them, so that a reader may see
//   a block's head before its tail (`ubep probe` then finds older words; sw must stay exact).
// - Beside the lock table, each mapping holds the tables of the cross-core publication check
//   (xcore.h): who last wrote each 32-byte granule of the window, by MTE3, and under which fence.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <type_traits>
#include <vector>

#include "report.h"
#include "types.h"

namespace AscendC {

constexpr int64_t GM_TRANSACTION = 512;  // bytes a DataCopy delivers whole

namespace twin {

// Windows registered for the duration of a launch (cpu_twin/hccl_group.h fills this).
struct Region {
  uint8_t* base;
  int64_t bytes;
};
inline std::vector<Region> shared_regions;

// The cross-core publication check's tables beside each window (xcore.h): XCORE_STAMPS stamps of
// XCORE_STAMP_BYTES per 32-byte granule, then one table of call sites and of every die's ended
// launches.
constexpr int64_t XCORE_GRANULE = 32, XCORE_STAMPS = 2, XCORE_STAMP_BYTES = 24;
constexpr int64_t XCORE_SITES = 2048, XCORE_SITE_CHARS = 192, XCORE_DIES = 1024;
constexpr int64_t XCORE_TABLE_BYTES = 64 + 8 * XCORE_DIES + XCORE_SITES * XCORE_SITE_CHARS;

inline int64_t lock_table_bytes(int64_t window_bytes) { return window_bytes / GM_TRANSACTION * 4; }
inline int64_t stamp_table_offset(int64_t window_bytes) {
  return (window_bytes + lock_table_bytes(window_bytes) + 63) / 64 * 64;
}
inline int64_t stamp_table_bytes(int64_t window_bytes) {
  return window_bytes / XCORE_GRANULE * XCORE_STAMPS * XCORE_STAMP_BYTES;
}
// A die's mapping: its window (a multiple of GM_TRANSACTION bytes), the window's lock table, then
// (64-byte aligned) its stamp table and its site and launch table. The one size the Python side
// asks for (twin_mapping_bytes); window_of_mapping inverts it.
inline int64_t mapping_bytes(int64_t window_bytes) {
  return stamp_table_offset(window_bytes) + stamp_table_bytes(window_bytes) + XCORE_TABLE_BYTES;
}
inline int64_t window_of_mapping(int64_t mapping_bytes) {
  constexpr int64_t per_chunk = GM_TRANSACTION + 4 + GM_TRANSACTION / XCORE_GRANULE * XCORE_STAMPS * XCORE_STAMP_BYTES;
  return mapping_bytes < XCORE_TABLE_BYTES ? 0 : (mapping_bytes - XCORE_TABLE_BYTES) / per_chunk * GM_TRANSACTION;
}

inline uint32_t* chunk_lock(const uint8_t* p) {
  for (const Region& r : shared_regions) {
    if (p >= r.base && p < r.base + r.bytes) {
      return reinterpret_cast<uint32_t*>(r.base + r.bytes) + (p - r.base) / GM_TRANSACTION;
    }
  }
  return nullptr;
}

inline void lock(uint32_t* l) {
  while (__atomic_exchange_n(l, 1u, __ATOMIC_ACQUIRE)) std::this_thread::yield();
}
inline void unlock(uint32_t* l) { __atomic_store_n(l, 0u, __ATOMIC_RELEASE); }

// The colon-separated integers of environment variable `name` ("a:b:c") into out[0, n); a field
// not given keeps its value. Whether the variable is set.
inline bool env_ints(const char* name, int64_t* out, int n) {
  const char* v = std::getenv(name);
  if (!v) return false;
  for (int i = 0; i < n; ++i) {
    char* end = nullptr;
    out[i] = std::strtoll(v, &end, 10);
    if (*end != ':') break;
    v = end + 1;
  }
  return true;
}

inline int64_t jitter_us() {
  static const int64_t us = [] {
    int64_t v = 0;
    env_ints("UBEP_TWIN_JITTER_US", &v, 1);
    return v;
  }();
  return us;
}

inline void jitter() {
  thread_local std::minstd_rand rng(std::random_device{}());
  std::this_thread::sleep_for(std::chrono::microseconds(rng() % (jitter_us() + 1)));
}

struct SlowAiv {
  int64_t die = -1, aiv = -1, us = 0;
};

inline const SlowAiv& slow_aiv() {
  static const SlowAiv slow = [] {
    int64_t f[3] = {-1, -1, 0};
    env_ints("UBEP_TWIN_SLOW_AIV", f, 3);
    return SlowAiv{f[0], f[1], f[2]};
  }();
  return slow;
}

struct Piece {
  int64_t bytes = GM_TRANSACTION, us = 0;
};

inline const Piece& piece() {
  static const Piece p = [] {
    int64_t f[2] = {GM_TRANSACTION, 0};
    const bool set = env_ints("UBEP_TWIN_PIECE", f, 2);
    if (set && f[0] != 64 && f[0] != 128 && f[0] != 256 && f[0] != GM_TRANSACTION) {
      Fail("UBEP_TWIN_PIECE: the piece must be 64, 128, 256 or 512 bytes, got '" +
           std::string(std::getenv("UBEP_TWIN_PIECE")) + "'");
    }
    return Piece{f[0], f[1]};
  }();
  return p;
}

// The length of the piece at `p` of a copy with `left` bytes to go (`done` already moved): to the end
// of its 512-byte chunk, or of UBEP_TWIN_PIECE's piece in a window, after that knob's gap.
inline int64_t piece_bytes(const uint8_t* p, int64_t left, bool window, int64_t done) {
  const Piece& cut = piece();
  const int64_t step = window ? cut.bytes : GM_TRANSACTION;
  if (window && done > 0 && cut.us > 0) std::this_thread::sleep_for(std::chrono::microseconds(cut.us));
  return std::min<int64_t>(left, step - static_cast<int64_t>(reinterpret_cast<uintptr_t>(p) % step));
}

// The delays a copy of GM at `gm` takes before it starts, where it touches a window (the knobs above).
inline void before_window_copy(const uint8_t* gm) {
  if (!chunk_lock(gm)) return;
  if (jitter_us()) jitter();
  const SlowAiv& slow = slow_aiv();
  if (slow.us > 0 && slow.die == die_rank && slow.aiv == tl_block) {
    std::this_thread::sleep_for(std::chrono::microseconds(slow.us));
  }
}

// Copies piece by piece (piece_bytes: 512-byte aligned chunks of the GM side `gm`), each under its
// chunk's lock.
inline void gm_copy(uint8_t* dst, const uint8_t* src, int64_t n, const uint8_t* gm) {
  before_window_copy(gm);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  for (int64_t i = 0; i < n;) {
    uint32_t* l = chunk_lock(gm + i);
    const int64_t len = piece_bytes(gm + i, n - i, l != nullptr, i);
    if (l) lock(l);
    std::memcpy(dst + i, src + i, len);
    if (l) unlock(l);
    i += len;
  }
  std::atomic_thread_fence(std::memory_order_seq_cst);
}
inline void gm_store(uint8_t* dst, const uint8_t* src, int64_t n) { gm_copy(dst, src, n, dst); }
inline void gm_load(uint8_t* dst, const uint8_t* src, int64_t n) { gm_copy(dst, src, n, src); }

// Element-wise atomic dst[i] += src[i] (SetAtomicAdd + an MTE3 copy). 16-bit floats add in float
// and round to nearest even, under a compare-and-swap of the element.
template <typename T>
void gm_atomic_add(T* dst, const T* src, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    if constexpr (std::is_integral_v<T>) {
      __atomic_fetch_add(dst + i, src[i], __ATOMIC_ACQ_REL);
    } else if constexpr (std::is_same_v<T, float>) {
      T old, next;
      __atomic_load(dst + i, &old, __ATOMIC_ACQUIRE);
      do {
        next = old + src[i];
      } while (!__atomic_compare_exchange(dst + i, &old, &next, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE));
    } else {
      static_assert(sizeof(T) == 2);
      uint16_t* word = reinterpret_cast<uint16_t*>(dst + i);
      uint16_t old = __atomic_load_n(word, __ATOMIC_ACQUIRE), next;
      do {
        T a, r;
        std::memcpy(&a, &old, 2);
        r = T(static_cast<float>(a) + static_cast<float>(src[i]));
        std::memcpy(&next, &r, 2);
      } while (!__atomic_compare_exchange_n(word, &old, next, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE));
    }
  }
}

// The lock a scalar cache line takes to be filled or written back whole.
class LineLock {
 public:
  explicit LineLock(const uint8_t* line) : l_(chunk_lock(line)) {
    if (!l_) l_ = &Stripes()[(reinterpret_cast<uintptr_t>(line) >> 6) % kStripes];
    lock(l_);
  }
  ~LineLock() { unlock(l_); }
  LineLock(const LineLock&) = delete;
  LineLock& operator=(const LineLock&) = delete;

 private:
  static constexpr size_t kStripes = 4096;
  static uint32_t* Stripes() {
    static uint32_t s[kStripes] = {};
    return s;
  }
  uint32_t* l_;
};

}  // namespace twin
}  // namespace AscendC
