// CPU twin of the Ascend C API subset the ubep kernels use (ascend_ops/op_kernel). With CANN the
// kernels include the toolkit's kernel_operator.h instead; this file lets g++ compile the same
// sources and run them on a CPU, one std::thread per AIV (see docs/ASCEND.md, "The CPU twin").
//
// Model and assumptions (guesses about Ascend C are marked GUESS):
// - GM is host memory. A die's HBM window is a shared mapping of /dev/shm that every die process
//   maps, so peers' windows are ordinary pointers, as HCCL windows are on an A3.
// - UB is a per-AIV 192 KiB arena (A3 AIV); TPipe::InitBuffer fails loudly beyond it.
// - Visibility. A DataCopy into a window is delivered in 512-byte transactions aligned to 512
//   bytes, each seen whole (the UB fabric's guarantee on CM384 that tff, sp and dc rely on). The
//   twin makes that exact: every 512-byte chunk of a window has a lock (a table after the window,
//   see shared_regions), held while a DataCopy writes or reads that chunk. Chunks of one copy land
//   in address order; the twin promises no more order than that (kernels fence with
//   PipeBarrier<PIPE_ALL> where they need it).
// - DataCacheCleanAndInvalid is a full fence here. GUESS: on hardware it is needed before a scalar
//   GetValue of a word another die writes; the twin cannot detect a missing one (host caches are
//   coherent), so the kernels call it wherever the documentation asks for it.
// - GetValue/SetValue on GM are acquire loads / release stores of the element (<= 8 bytes).
// - SetAtomicAdd<T>() makes the following UB->GM DataCopy add element-wise, atomically.
// - GetSystemCycle counts at 50 MHz (50 cycles per microsecond, GUESS from CANN kernels).
// - GetHcclContext<i>() has the documented signature and returns the context the launch's twin HCCL
//   group registered (cpu_twin/hccl_group.h); the runtime fills it on an NPU.
// - The op-project macros (KERNEL_TASK_TYPE_DEFAULT, REGISTER_TILING_DEFAULT,
//   GET_TILING_DATA_WITH_STRUCT) declare nothing here; the last copies the tiling from GM into a
//   local struct, as on the AIV. KERNEL_TASK_TYPE_DEFAULT records the kernel type: a hard SyncAll
//   in a KERNEL_TYPE_AIV_ONLY kernel aborts (A2/A3: no inter-core scheduling for AIV_ONLY).
// - Cast with RoundMode::CAST_RINT rounds to nearest even; CAST_NONE is for exact widenings. A2/A3
//   have no float -> float conversion but round-to-integral, so Cast<float, float> does not compile.
// - Pipes are not modelled: the twin runs every operation at once, in program order. SetFlag /
//   WaitFlag<HardEvent> and PipeBarrier are fences; the strict twin (cpu_twin/strict/) checks them.
// - LocalTensor::GetPhyAddr() is an integer, as on the chip (a UB offset there, the address here):
//   kernels reach UB only through GetValue/SetValue and the vector and DMA operations.
#pragma once

#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <thread>
#include <type_traits>
#include <vector>

#define __aicore__
#define __global__
#define __gm__
// A macro, as in the toolkit: `GM_ADDR a, b;` declares one pointer, as it would on the chip.
#define GM_ADDR __gm__ uint8_t*

// The toolkit's kernel types (A2/A3: kernel_utils_macros.h:88-100).
enum KernelMetaType : uint8_t {
  KERNEL_TYPE_AIV_ONLY,
  KERNEL_TYPE_AIC_ONLY,
  KERNEL_TYPE_MIX_AIV_1_0,
  KERNEL_TYPE_MIX_AIC_1_0,
  KERNEL_TYPE_MIX_AIC_1_1,
  KERNEL_TYPE_MIX_AIC_1_2,
  KERNEL_TYPE_AICORE,
  KERNEL_TYPE_VECTORCORE,
  KERNEL_TYPE_MIX_AICORE,
  KERNEL_TYPE_MIX_VECTOR_CORE,
  KERNEL_TYPE_MAX,
};
#define KERNEL_TASK_TYPE_DEFAULT(type) (AscendC::twin::core.kernel_type = (type))
#define REGISTER_TILING_DEFAULT(tiling_struct) static_assert(sizeof(tiling_struct) > 0)
#define GET_TILING_DATA_WITH_STRUCT(tiling_struct, name, tiling_gm) \
  tiling_struct name;                                             \
  std::memcpy(&name, tiling_gm, sizeof(tiling_struct))
using half = _Float16;

// bf16 as its bit pattern; conversions go through Cast.
struct bfloat16_t {
  uint16_t bits;
};

enum pipe_t { PIPE_S, PIPE_V, PIPE_MTE2, PIPE_MTE3, PIPE_ALL };
enum event_t : int32_t { EVENT_ID0 = 0, EVENT_ID1, EVENT_ID2, EVENT_ID3, EVENT_ID4, EVENT_ID5, EVENT_ID6, EVENT_ID7 };

namespace AscendC {

constexpr int64_t UB_BYTES = 192 * 1024;
constexpr int64_t GM_TRANSACTION = 512;  // bytes a DataCopy delivers whole

namespace twin {
struct Core {
  int64_t block_idx = 0;
  int64_t block_num = 1;
  std::barrier<>* all = nullptr;
  int atomic_add = 0;  // 0 none, else sizeof of the element type being added
  bool atomic_float = false;
  std::unique_ptr<uint8_t[]> ub{new uint8_t[UB_BYTES]};
  int64_t ub_used = 0;
  int kernel_type = KERNEL_TYPE_MAX;  // KERNEL_TYPE_MAX: none declared (the compiler infers it)
};
inline thread_local Core core;

[[noreturn]] inline void fail(const char* what) {
  std::fprintf(stderr, "ascend twin: %s\n", what);
  std::abort();
}

// Windows (GM that other dies read and write) are registered for the duration of a launch. Each
// has a lock table after its last byte: one u32 per 512-byte chunk, so that every chunk of a
// DataCopy is written and read whole, as one fabric transaction. Other GM (workspace, inputs,
// outputs) is private to the die and copied plainly.
struct Region {
  uint8_t* base;
  int64_t bytes;
};
inline std::vector<Region> shared_regions;

inline int64_t lock_table_bytes(int64_t window_bytes) { return window_bytes / GM_TRANSACTION * 4; }
// A die's mapping: its window (a multiple of GM_TRANSACTION bytes), then the window's lock table.
inline int64_t mapping_bytes(int64_t window_bytes) { return window_bytes + lock_table_bytes(window_bytes); }
inline int64_t window_of_mapping(int64_t mapping_bytes) {
  return mapping_bytes / (GM_TRANSACTION + 4) * GM_TRANSACTION;
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

// Stress testing: with UBEP_TWIN_JITTER_US=N every window copy first sleeps 0..N µs (per-AIV
// random), which reorders AIVs and dies far more than scheduling alone does.
inline int64_t jitter_us() {
  static const int64_t us = [] {
    const char* v = std::getenv("UBEP_TWIN_JITTER_US");
    return v ? std::atoll(v) : 0;
  }();
  return us;
}

inline void jitter() {
  thread_local std::minstd_rand rng(std::random_device{}());
  std::this_thread::sleep_for(std::chrono::microseconds(rng() % (jitter_us() + 1)));
}

// Copies chunk by chunk (512-byte aligned pieces of the GM side `gm`), each under its lock.
inline void gm_copy(uint8_t* dst, const uint8_t* src, int64_t n, const uint8_t* gm) {
  if (jitter_us() && chunk_lock(gm)) jitter();
  std::atomic_thread_fence(std::memory_order_seq_cst);
  for (int64_t i = 0; i < n;) {
    const int64_t in_chunk = static_cast<int64_t>(reinterpret_cast<uintptr_t>(gm + i) % GM_TRANSACTION);
    const int64_t len = std::min<int64_t>(n - i, GM_TRANSACTION - in_chunk);
    uint32_t* l = chunk_lock(gm + i);
    if (l) lock(l);
    std::memcpy(dst + i, src + i, len);
    if (l) unlock(l);
    i += len;
  }
  std::atomic_thread_fence(std::memory_order_seq_cst);
}
inline void gm_store(uint8_t* dst, const uint8_t* src, int64_t n) { gm_copy(dst, src, n, dst); }
inline void gm_load(uint8_t* dst, const uint8_t* src, int64_t n) { gm_copy(dst, src, n, src); }

template <typename T>
void gm_atomic_add(T* dst, const T* src, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    if constexpr (std::is_integral_v<T>) {
      __atomic_fetch_add(dst + i, src[i], __ATOMIC_ACQ_REL);
    } else {
      T old = __atomic_load_n(dst + i, __ATOMIC_ACQUIRE), next;
      do { next = old + src[i]; } while (!__atomic_compare_exchange(dst + i, &old, &next, false,
                                                                    __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE));
    }
  }
}

// Runs fn once per AIV, each on its own thread with its block index; returns when all finish.
inline void launch(int64_t block_dim, const std::function<void()>& fn) {
  std::barrier<> all(block_dim);
  std::vector<std::thread> threads;
  for (int64_t b = 0; b < block_dim; ++b) {
    threads.emplace_back([&, b] {
      core.block_idx = b;
      core.block_num = block_dim;
      core.all = &all;
      core.ub_used = 0;
      core.atomic_add = 0;
      core.kernel_type = KERNEL_TYPE_MAX;
      fn();
    });
  }
  for (auto& t : threads) t.join();
}
}  // namespace twin

// The contexts of the launch's two communication domains (index 0 and 1), set by the twin's HCCL group.
namespace twin {
inline GM_ADDR hccl_contexts[2] = {nullptr, nullptr};
}

template <uint32_t index>
__aicore__ inline __gm__ uint8_t* __gm__ GetHcclContext(void) {
  static_assert(index < 2, "GetHcclContext: only communication domains 0 and 1");
  if (twin::hccl_contexts[index] == nullptr) twin::fail("GetHcclContext: no HCCL group for this launch");
  return twin::hccl_contexts[index];
}

inline int64_t GetBlockIdx() { return twin::core.block_idx; }
inline int64_t GetBlockNum() { return twin::core.block_num; }

// Kernels read it once per unsuccessful poll; the twin yields there so that the AIV threads of W
// dies can share a few CPUs.
inline int64_t GetSystemCycle() {
  using namespace std::chrono;
  std::this_thread::yield();
  return duration_cast<nanoseconds>(steady_clock::now().time_since_epoch()).count() / 20;
}

// Barrier across every AIV of the launch (isAIVOnly: the kernels are AIV-only).
template <bool isAIVOnly = true>
inline void SyncAll() {
  if (twin::core.kernel_type == KERNEL_TYPE_AIV_ONLY) {
    twin::fail("SyncAll in a KERNEL_TYPE_AIV_ONLY kernel: inter-core sync needs a MIX kernel type (A2/A3)");
  }
  twin::core.all->arrive_and_wait();
}

// <src>_<dst>: dst waits for src (A2/A3: kernel_event.h:38-80); the values are the toolkit's order.
enum class HardEvent : uint8_t {
  MTE2_MTE1, MTE1_MTE2, MTE1_M, M_MTE1, MTE2_V, V_MTE2, MTE3_V, V_MTE3, M_V, V_M, V_V, MTE3_MTE1, MTE1_MTE3,
  MTE1_V, MTE2_M, M_MTE2, V_MTE1, M_FIX, FIX_M, MTE3_MTE2, MTE2_MTE3, S_V, V_S, S_MTE2, MTE2_S, S_MTE3, MTE3_S,
  MTE2_FIX, FIX_MTE2, FIX_S, M_S, FIX_MTE3, MTE1_FIX, FIX_MTE1, FIX_FIX, MAX,
};

// Fences here (operations run at once); ids 0-7 as on A2/A3.
template <HardEvent event>
inline void SetFlag(int32_t eventID) {
  if (eventID < 0 || eventID > 7) twin::fail("SetFlag: event ids are 0-7");
  std::atomic_thread_fence(std::memory_order_seq_cst);
}
template <HardEvent event>
inline void WaitFlag(int32_t eventID) {
  if (eventID < 0 || eventID > 7) twin::fail("WaitFlag: event ids are 0-7");
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

template <pipe_t pipe>
inline void PipeBarrier() {
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

template <typename T>
class GlobalTensor {
 public:
  void SetGlobalBuffer(__gm__ T* buffer, uint64_t size = 0) {
    addr_ = buffer;
    size_ = size;
  }
  T GetValue(uint64_t i) const {
    static_assert(sizeof(T) <= 8);
    T v;
    __atomic_load(addr_ + i, &v, __ATOMIC_ACQUIRE);
    return v;
  }
  void SetValue(uint64_t i, T v) const { __atomic_store(addr_ + i, &v, __ATOMIC_RELEASE); }
  GlobalTensor operator[](uint64_t off) const {
    GlobalTensor g;
    g.SetGlobalBuffer(addr_ + off, size_ > off ? size_ - off : 0);
    return g;
  }
  __gm__ T* GetPhyAddr() const { return addr_; }
  uint64_t GetSize() const { return size_; }

 private:
  T* addr_ = nullptr;
  uint64_t size_ = 0;
};

template <typename T>
class LocalTensor {
 public:
  LocalTensor() = default;
  LocalTensor(T* addr, uint32_t size) : addr_(addr), size_(size) {}
  T GetValue(uint32_t i) const { return addr_[i]; }
  template <typename S>
  void SetValue(uint32_t i, S v) const { addr_[i] = static_cast<T>(v); }
  LocalTensor operator[](uint32_t off) const { return LocalTensor(addr_ + off, size_ - off); }
  template <typename U>
  LocalTensor<U> ReinterpretCast() const {
    return LocalTensor<U>(reinterpret_cast<U*>(addr_), size_ * sizeof(T) / sizeof(U));
  }
  uint64_t GetPhyAddr() const { return reinterpret_cast<uintptr_t>(addr_); }
  uint64_t GetPhyAddr(uint32_t offset) const { return reinterpret_cast<uintptr_t>(addr_ + offset); }
  uint32_t GetSize() const { return size_; }
  T* TwinAddr() const { return addr_; }  // the twin's own access to the bytes

 private:
  T* addr_ = nullptr;
  uint32_t size_ = 0;
};

enum class TPosition { GM, VECIN, VECOUT, VECCALC };

// A queue of `num` equal UB buffers; AllocTensor hands them out round-robin.
template <TPosition pos, int depth>
class TQue {
 public:
  template <typename T>
  LocalTensor<T> AllocTensor() {
    uint8_t* p = base_ + (next_++ % num_) * len_;
    return LocalTensor<T>(reinterpret_cast<T*>(p), static_cast<uint32_t>(len_ / sizeof(T)));
  }
  template <typename T>
  void EnQue(const LocalTensor<T>& t) { held_ = t.TwinAddr(); }
  template <typename T>
  LocalTensor<T> DeQue() {
    return LocalTensor<T>(reinterpret_cast<T*>(held_), static_cast<uint32_t>(len_ / sizeof(T)));
  }
  template <typename T>
  void FreeTensor(const LocalTensor<T>&) {}
  void Bind(uint8_t* base, int64_t num, int64_t len) { base_ = base; num_ = num; len_ = len; }

 private:
  uint8_t* base_ = nullptr;
  void* held_ = nullptr;
  int64_t num_ = 1, len_ = 0, next_ = 0;
};

template <TPosition pos>
class TBuf {
 public:
  template <typename T>
  LocalTensor<T> Get() { return LocalTensor<T>(reinterpret_cast<T*>(base_), static_cast<uint32_t>(len_ / sizeof(T))); }
  void Bind(uint8_t* base, int64_t len) { base_ = base; len_ = len; }

 private:
  uint8_t* base_ = nullptr;
  int64_t len_ = 0;
};

// Carves UB for queues and buffers; UB buffers are 32-byte aligned, as on the AIV.
class TPipe {
 public:
  template <class Q>
  void InitBuffer(Q& que, uint32_t num, uint32_t len) {
    const int64_t aligned = (static_cast<int64_t>(len) + 31) / 32 * 32;
    que.Bind(take(num * aligned), num, aligned);
  }
  template <TPosition pos>
  void InitBuffer(TBuf<pos>& buf, uint32_t len) {
    const int64_t aligned = (static_cast<int64_t>(len) + 31) / 32 * 32;
    buf.Bind(take(aligned), aligned);
  }

 private:
  uint8_t* take(int64_t bytes) {
    auto& c = twin::core;
    if (c.ub_used + bytes > UB_BYTES) twin::fail("TPipe::InitBuffer: UB (192 KiB) exhausted");
    uint8_t* p = c.ub.get() + c.ub_used;
    c.ub_used += bytes;
    return p;
  }
};

// DataCopy moves whole 32-byte units (the twin enforces the documented alignment rule).
template <typename T>
void DataCopy(const LocalTensor<T>& dst, const GlobalTensor<T>& src, uint32_t count) {
  if ((count * sizeof(T)) % 32) twin::fail("DataCopy GM->UB: length not a multiple of 32 bytes");
  twin::gm_load(reinterpret_cast<uint8_t*>(dst.TwinAddr()),
                reinterpret_cast<const uint8_t*>(src.GetPhyAddr()), count * sizeof(T));
}

template <typename T>
void DataCopy(const GlobalTensor<T>& dst, const LocalTensor<T>& src, uint32_t count) {
  if ((count * sizeof(T)) % 32) twin::fail("DataCopy UB->GM: length not a multiple of 32 bytes");
  if (twin::core.atomic_add) {
    if (twin::core.atomic_add != sizeof(T)) twin::fail("SetAtomicAdd type differs from DataCopy's");
    twin::gm_atomic_add(dst.GetPhyAddr(), src.TwinAddr(), count);
    return;
  }
  twin::gm_store(reinterpret_cast<uint8_t*>(dst.GetPhyAddr()),
                 reinterpret_cast<const uint8_t*>(src.TwinAddr()), count * sizeof(T));
}

template <typename T>
void DataCopy(const LocalTensor<T>& dst, const LocalTensor<T>& src, uint32_t count) {
  std::memmove(dst.TwinAddr(), src.TwinAddr(), count * sizeof(T));
}

struct DataCopyExtParams {
  uint16_t blockCount = 1;
  uint32_t blockLen = 0;  // bytes
  uint32_t srcStride = 0;
  uint32_t dstStride = 0;
  uint32_t rsv = 0;
};

template <typename T>
struct DataCopyPadExtParams {
  bool isPad = false;
  uint8_t leftPadding = 0;
  uint8_t rightPadding = 0;
  T paddingValue{};
};

// Unaligned copies of blockCount blocks of blockLen bytes. GUESS: strides are in bytes on the GM
// side and in 32-byte units on the UB side; the kernels only use blockCount = 1.
template <typename T>
void DataCopyPad(const GlobalTensor<T>& dst, const LocalTensor<T>& src, const DataCopyExtParams& p) {
  for (uint16_t b = 0; b < p.blockCount; ++b) {
    const auto* s = reinterpret_cast<const uint8_t*>(src.TwinAddr()) + b * ((p.blockLen + 31) / 32 * 32 + 32 * p.srcStride);
    auto* d = reinterpret_cast<uint8_t*>(dst.GetPhyAddr()) + b * (p.blockLen + p.dstStride);
    twin::gm_store(d, s, p.blockLen);
  }
}

template <typename T>
void DataCopyPad(const LocalTensor<T>& dst, const GlobalTensor<T>& src, const DataCopyExtParams& p,
                 const DataCopyPadExtParams<T>&) {
  for (uint16_t b = 0; b < p.blockCount; ++b) {
    const auto* s = reinterpret_cast<const uint8_t*>(src.GetPhyAddr()) + b * (p.blockLen + p.srcStride);
    auto* d = reinterpret_cast<uint8_t*>(dst.TwinAddr()) + b * ((p.blockLen + 31) / 32 * 32 + 32 * p.dstStride);
    twin::gm_load(d, s, p.blockLen);
  }
}

enum class CacheLine { SINGLE_CACHE_LINE, ENTIRE_DATA_CACHE };
enum class DcciDst { CACHELINE_ALL, CACHELINE_UB, CACHELINE_OUT, CACHELINE_ATOMIC };

// A fence; and since kernels call it in every poll, the twin yields the CPU here so that W dies
// of AIV threads can share a few cores.
template <typename T, CacheLine line, DcciDst dst>
void DataCacheCleanAndInvalid(const GlobalTensor<T>&) {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  std::this_thread::yield();
}

template <typename T>
void SetAtomicAdd() {
  static_assert(std::is_same_v<T, int32_t> || std::is_same_v<T, float>, "twin: int32 or float");
  twin::core.atomic_add = sizeof(T);
}
inline void SetAtomicNone() { twin::core.atomic_add = 0; }

enum class RoundMode { CAST_NONE, CAST_RINT };

namespace twin {
inline float to_float(float v) { return v; }
inline float to_float(half v) { return static_cast<float>(v); }
inline float to_float(bfloat16_t v) {
  const uint32_t bits = static_cast<uint32_t>(v.bits) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
template <typename T>
T from_float(float v);
template <> inline float from_float<float>(float v) { return v; }
template <> inline half from_float<half>(float v) { return static_cast<half>(v); }  // nearest even
template <> inline bfloat16_t from_float<bfloat16_t>(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  if ((bits & 0x7F800000u) == 0x7F800000u && (bits & 0x7FFFFFu)) {
    return bfloat16_t{static_cast<uint16_t>((bits >> 16) | 0x40)};  // NaN stays NaN, quieted
  }
  bits += 0x7FFFu + ((bits >> 16) & 1u);  // round to nearest even
  return bfloat16_t{static_cast<uint16_t>(bits >> 16)};
}
}  // namespace twin

template <typename D, typename S>
void Cast(const LocalTensor<D>& dst, const LocalTensor<S>& src, RoundMode, uint32_t count) {
  static_assert(!(std::is_same_v<D, float> && std::is_same_v<S, float>),
                "Cast<float, float> rounds to an integer on A2/A3 (CAST_NONE issues nothing): use the rows as they are");
  for (uint32_t i = 0; i < count; ++i) {
    dst.TwinAddr()[i] = twin::from_float<D>(twin::to_float(src.TwinAddr()[i]));
  }
}

// Vector float ops: each result rounds separately (no fused multiply-add; build with
// -ffp-contract=off).
inline void Muls(const LocalTensor<float>& dst, const LocalTensor<float>& src, float s, uint32_t count) {
  for (uint32_t i = 0; i < count; ++i) dst.TwinAddr()[i] = src.TwinAddr()[i] * s;
}
inline void Add(const LocalTensor<float>& dst, const LocalTensor<float>& a, const LocalTensor<float>& b,
                uint32_t count) {
  for (uint32_t i = 0; i < count; ++i) dst.TwinAddr()[i] = a.TwinAddr()[i] + b.TwinAddr()[i];
}
// A2/A3 Duplicate types only (dav_c220 static_assert): no 8-bit or 64-bit forms.
template <typename T>
void Duplicate(const LocalTensor<T>& dst, T v, uint32_t count) {
  static_assert(std::is_same_v<T, half> || std::is_same_v<T, bfloat16_t> || std::is_same_v<T, int16_t> ||
                    std::is_same_v<T, uint16_t> || std::is_same_v<T, int32_t> || std::is_same_v<T, uint32_t> ||
                    std::is_same_v<T, float>,
                "Duplicate: A2/A3 support half, bfloat16_t, int16_t, uint16_t, int32_t, uint32_t, float");
  for (uint32_t i = 0; i < count; ++i) dst.TwinAddr()[i] = v;
}

}  // namespace AscendC
