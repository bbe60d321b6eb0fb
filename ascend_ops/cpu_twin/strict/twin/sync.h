// Synchronization inside one AIV (docs/ASCEND.md, "Pipes and synchronization on A2/A3" and "The
// scalar data cache"): SetFlag/WaitFlag<HardEvent>, TQueSync, PipeBarrier<pipe_t>, DataSyncBarrier,
// the scalar cache's DataCacheCleanAndInvalid (PIPE_S), and the DMA atomic mode. SyncAll is in
// syncall.h.
#pragma once

#include <set>
#include <thread>
#include <type_traits>

#include "tensor.h"

namespace AscendC {

namespace twin {

template <typename T>
constexpr const char* TypeName() {
  return std::is_same_v<T, int8_t> ? "int8_t" : std::is_same_v<T, uint8_t> ? "uint8_t"
       : std::is_same_v<T, int16_t> ? "int16_t" : std::is_same_v<T, uint16_t> ? "uint16_t"
       : std::is_same_v<T, half> ? "half" : std::is_same_v<T, bfloat16_t> ? "bfloat16_t"
       : std::is_same_v<T, int32_t> ? "int32_t" : std::is_same_v<T, uint32_t> ? "uint32_t"
       : std::is_same_v<T, float> ? "float" : std::is_same_v<T, int64_t> ? "int64_t"
       : std::is_same_v<T, uint64_t> ? "uint64_t" : std::is_same_v<T, double> ? "double" : "(other)";
}

inline void SetFlagAt(Core& c, HardEvent e, int32_t id, uint32_t site) {
  c.flags.Set(e, id, site, c.clocks);
  if (Info(e).src == kMte3) c.pub.Fence();  // it fires once MTE3's earlier copies completed (xcore.h)
}
inline void WaitFlagAt(Core& c, HardEvent e, int32_t id, uint32_t site) { c.flags.Wait(e, id, site, c.clocks); }

// Ids 6-7 are reserved on A2/A3, 7 for TPipe's automatic sync; manual code should use 0-5.
inline void WarnReservedId(HardEvent e, int32_t id, uint32_t site) {
  if (id != 6 && id != 7) return;
  thread_local std::set<uint32_t> warned;
  if (!warned.insert(site).second) return;
  Warn(Format("%s uses event id %d of HardEvent::%s; ids 6-7 are reserved on A2/A3 (7 for TPipe's automatic "
              "sync), manual code should use 0-5",
              Sites::Describe(site).c_str(), id, Info(e).name));
}

constexpr HardEvent EventOf(pipe_t src, pipe_t dst) {
  for (int e = 0; e < static_cast<int>(HardEvent::MAX); ++e) {
    const EventInfo i = Info(static_cast<HardEvent>(e));
    if (i.src != kNoPipe && i.src == PipeOf(src) && i.dst == PipeOf(dst)) return static_cast<HardEvent>(e);
  }
  return HardEvent::MAX;
}

}  // namespace twin

template <HardEvent event>
inline void SetFlag(int32_t eventID, twin::Loc loc = twin::Loc::current()) {
  static_assert(twin::IsAivEvent(event), "not an AIV event: an AIV build filters it out, so it orders nothing");
  twin::Core& c = twin::Me();
  const uint32_t site = twin::Sites::Intern("SetFlag", loc);
  twin::WarnReservedId(event, eventID, site);
  twin::SetFlagAt(c, event, eventID, site);
}

template <HardEvent event>
inline void WaitFlag(int32_t eventID, twin::Loc loc = twin::Loc::current()) {
  static_assert(twin::IsAivEvent(event), "not an AIV event: an AIV build filters it out, so it orders nothing");
  twin::Core& c = twin::Me();
  const uint32_t site = twin::Sites::Intern("WaitFlag", loc);
  twin::WarnReservedId(event, eventID, site);
  twin::WaitFlagAt(c, event, eventID, site);
}

// The portable spelling of SetFlag/WaitFlag by pipes.
template <pipe_t src, pipe_t dst>
class TQueSync {
  static constexpr HardEvent kEvent = twin::EventOf(src, dst);
  static_assert(kEvent != HardEvent::MAX, "no AIV HardEvent for this pair of pipes");

 public:
  void SetFlag(TEventID id, twin::Loc loc = twin::Loc::current()) { AscendC::SetFlag<kEvent>(id, loc); }
  void WaitFlag(TEventID id, twin::Loc loc = twin::Loc::current()) { AscendC::WaitFlag<kEvent>(id, loc); }
};

// Orders the pipe's later operations after its earlier ones; PIPE_ALL waits for every pipe.
template <pipe_t pipe>
inline void PipeBarrier(twin::Loc loc = twin::Loc::current()) {
  static_assert(pipe != PIPE_S, "PipeBarrier<PIPE_S> is not allowed: the scalar unit is in order (A2/A3)");
  (void)loc;
  twin::Core& c = twin::Me();
  if constexpr (pipe == PIPE_ALL) {
    c.BarrierAll();
  } else if constexpr (twin::PipeOf(pipe) != twin::kNoPipe) {
    c.clocks.Barrier(twin::PipeOf(pipe));
    if constexpr (twin::PipeOf(pipe) == twin::kMte3) c.pub.Fence();  // (xcore.h)
  }
}

// Every memory access issued before completes; the twin's accesses are immediate.
template <MemDsbT arg0>
inline void DataSyncBarrier() {}

// Cleans (writes back, whole) and invalidates the line of dst's address, or every line.
// CACHELINE_OUT and CACHELINE_ALL act alike on GM (DataCacheCleanAndInvalid doc).
template <typename T, CacheLine entireType, DcciDst dcciDst>
inline void DataCacheCleanAndInvalid(const GlobalTensor<T>& dst, twin::Loc loc = twin::Loc::current()) {
  static_assert(dcciDst != DcciDst::CACHELINE_ATOMIC, "CACHELINE_ATOMIC is not supported on A2/A3");
  static_assert(dcciDst != DcciDst::CACHELINE_UB, "CACHELINE_UB does not clean GM lines: use CACHELINE_OUT");
  twin::Core& c = twin::Me();
  const twin::Op op = c.Begin(twin::kS, "DataCacheCleanAndInvalid", loc);
  if constexpr (entireType == CacheLine::SINGLE_CACHE_LINE) {
    c.dcache.CleanInvalidate((uint64_t)dst.GetPhyAddr(), op.site, c);
  } else {
    c.dcache.CleanInvalidateAll(op.site, c);
  }
  std::this_thread::yield();  // polls call it: lets the AIV threads of several dies share a few CPUs
}
template <typename T, CacheLine entireType>
inline void DataCacheCleanAndInvalid(const GlobalTensor<T>& dst, twin::Loc loc = twin::Loc::current()) {
  DataCacheCleanAndInvalid<T, entireType, DcciDst::CACHELINE_ALL>(dst, loc);
}
// The LocalTensor form cleans the DCache's copies of UB; scalar UB access is not cached here.
template <typename T, CacheLine entireType, DcciDst dcciDst>
inline void DataCacheCleanAndInvalid(const LocalTensor<T>&) {}

// Every following UB->GM copy (MTE3) adds into GM until SetAtomicNone (A2/A3 types below).
template <typename T>
inline void SetAtomicAdd() {
  static_assert(std::is_same_v<T, int8_t> || std::is_same_v<T, int16_t> || std::is_same_v<T, half> ||
                    std::is_same_v<T, bfloat16_t> || std::is_same_v<T, int32_t> || std::is_same_v<T, float>,
                "SetAtomicAdd: A2/A3 support int8_t, int16_t, half, bfloat16_t, int32_t, float");
  twin::Core& c = twin::Me();
  c.atomic_bytes = sizeof(T);
  c.atomic_float = !std::is_integral_v<T>;
  c.atomic_type = twin::TypeName<T>();
  c.atomic_add = [](uint8_t* gm, const uint8_t* ub, int64_t count) {
    twin::gm_atomic_add(reinterpret_cast<T*>(gm), reinterpret_cast<const T*>(ub), count);
  };
}
inline void SetAtomicNone() { twin::Me().atomic_bytes = 0; }
inline void DisableDmaAtomic() { SetAtomicNone(); }

}  // namespace AscendC
