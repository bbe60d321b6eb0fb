// GlobalTensor and LocalTensor with the A2/A3 signatures (asc-devkit
// include/basic_api/kernel_tensor.h), their scalar accessors on PIPE_S: GlobalTensor's through the
// AIV's DCache, LocalTensor's on UB.
// - LocalTensor::GetPhyAddr() is a UB OFFSET (uint64_t, 0 .. UB size), as on the chip: a kernel
//   that casts it to a pointer, (__ubuf__ T*)t.GetPhyAddr(), dereferences a small integer and
//   crashes here instead of silently reaching the stack or heap.
// - GlobalTensor::GetPhyAddr() is a const __gm__ pointer; SetGlobalBuffer takes a __gm__ pointer.
// - operator() returns a proxy, not the chip's __gm__/__ubuf__ reference, so that its reads and
//   writes reach the race checker and the DCache: `t(i) = v`, `v = t(i)`, `t(i) += v` work,
//   binding `T& r = t(i)` does not.
// - Element indices past a LocalTensor's size abort (the chip would read or write its neighbours).
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core.h"

namespace AscendC {

namespace twin {
struct UbTag {};  // the twin's own constructor of LocalTensor (TPipe, TQue, TBuf use it)

inline void CheckAligned(uint64_t a, uint64_t size, const Op& op) {
  if (a % size) Fail(Format("%s: scalar access of %" PRIu64 " bytes at 0x%" PRIx64 " is not aligned to its size",
                            Sites::Describe(op.site).c_str(), size, a));
}
}  // namespace twin

template <typename T>
class GlobalTensor;

template <typename T>
class GmRef {
 public:
  GmRef(const GlobalTensor<T>& t, uint64_t i, const twin::Loc& loc) : t_(t), i_(i), loc_(loc) {}
  operator T() const { return t_.GetValue(i_, loc_); }
  GmRef& operator=(const T& v) {
    Set(v);
    return *this;
  }
  GmRef& operator=(const GmRef& o) {
    Set(static_cast<T>(o));
    return *this;
  }
  GmRef& operator+=(const T& v) { Set(static_cast<T>(*this) + v); return *this; }
  GmRef& operator-=(const T& v) { Set(static_cast<T>(*this) - v); return *this; }
  GmRef& operator|=(const T& v) { Set(static_cast<T>(*this) | v); return *this; }
  GmRef& operator&=(const T& v) { Set(static_cast<T>(*this) & v); return *this; }

 private:
  void Set(const T& v) { GlobalTensor<T>(t_).SetValue(i_, v, loc_); }
  GlobalTensor<T> t_;
  uint64_t i_;
  twin::Loc loc_;
};

template <typename T>
class GlobalTensor {
 public:
  using PrimType = T;

  GlobalTensor() = default;
  void SetGlobalBuffer(__gm__ T* buffer, uint64_t bufferSize) {
    addr_ = buffer;
    bufferSize_ = bufferSize;
  }
  // The one-argument form leaves GetSize() at 0 (A2/A3).
  void SetGlobalBuffer(__gm__ T* buffer) {
    addr_ = buffer;
    bufferSize_ = 0;
  }
  const __gm__ T* GetPhyAddr() const { return addr_; }
  __gm__ T* GetPhyAddr(const uint64_t offset) const { return addr_ + offset; }
  uint64_t GetSize() const { return bufferSize_; }
  // Advances the address; does not shrink bufferSize_ on 2201 (kernel_tensor_impl.h).
  GlobalTensor operator[](const uint64_t offset) const {
    GlobalTensor g = *this;
    g.addr_ = addr_ + offset;
    return g;
  }

  T GetValue(const uint64_t offset, twin::Loc loc = twin::Loc::current()) const {
    static_assert(sizeof(T) <= 8 && (sizeof(T) & (sizeof(T) - 1)) == 0, "a scalar GM access is 1, 2, 4 or 8 bytes");
    twin::Core& c = twin::Me();
    T v;
    c.ScalarAccessor([&] {
      const twin::Op op = c.Begin(twin::kS, "GlobalTensor::GetValue", loc);
      const uint64_t a = Address(offset);
      twin::CheckAligned(a, sizeof(T), op);
      c.Gm(op, a, sizeof(T), false);
      c.dcache.Read(a, &v, sizeof(T), op.site, c);
    });
    return v;
  }
  // Not const, as on the chip (kernel_tensor.h: `void SetValue(const uint64_t, PrimType)`).
  void SetValue(const uint64_t offset, T value, twin::Loc loc = twin::Loc::current()) {
    static_assert(sizeof(T) <= 8 && (sizeof(T) & (sizeof(T) - 1)) == 0, "a scalar GM access is 1, 2, 4 or 8 bytes");
    twin::Core& c = twin::Me();
    c.ScalarAccessor([&] {
      const twin::Op op = c.Begin(twin::kS, "GlobalTensor::SetValue", loc);
      const uint64_t a = Address(offset);
      twin::CheckAligned(a, sizeof(T), op);
      c.Gm(op, a, sizeof(T), true);
      c.dcache.Write(a, &value, sizeof(T), op.site, c);
    });
  }
  GmRef<T> operator()(const uint64_t offset, twin::Loc loc = twin::Loc::current()) const {
    return GmRef<T>(*this, offset, loc);
  }

  uint64_t bufferSize_ = 0;  // element count, public as in the toolkit

 private:
  uint64_t Address(uint64_t offset) const {
    if (addr_ == nullptr) twin::Fail("a GlobalTensor used before SetGlobalBuffer");
    return (uint64_t)(addr_ + offset);
  }
  __gm__ T* addr_ = nullptr;
};

template <typename T>
class LocalTensor;

template <typename T>
class UbRef {
 public:
  UbRef(const LocalTensor<T>& t, uint32_t i, const twin::Loc& loc) : t_(t), i_(i), loc_(loc) {}
  operator T() const { return t_.GetValue(i_, loc_); }
  UbRef& operator=(const T& v) {
    t_.SetValue(i_, v, loc_);
    return *this;
  }
  UbRef& operator=(const UbRef& o) {
    t_.SetValue(i_, static_cast<T>(o), loc_);
    return *this;
  }
  UbRef& operator+=(const T& v) { t_.SetValue(i_, static_cast<T>(*this) + v, loc_); return *this; }
  UbRef& operator-=(const T& v) { t_.SetValue(i_, static_cast<T>(*this) - v, loc_); return *this; }
  UbRef& operator|=(const T& v) { t_.SetValue(i_, static_cast<T>(*this) | v, loc_); return *this; }
  UbRef& operator&=(const T& v) { t_.SetValue(i_, static_cast<T>(*this) & v, loc_); return *this; }

 private:
  LocalTensor<T> t_;
  uint32_t i_;
  twin::Loc loc_;
};

template <typename T>
class LocalTensor {
 public:
  using PrimType = T;

  LocalTensor() = default;
  LocalTensor(twin::UbTag, TPosition pos, uint32_t byte_offset, uint32_t size)
      : off_(byte_offset), size_(size), pos_(pos), valid_(true) {}

  uint64_t GetPhyAddr() const { return off_; }
  uint64_t GetPhyAddr(const uint32_t offset) const { return off_ + static_cast<uint64_t>(offset) * sizeof(T); }
  uint32_t GetSize() const { return size_; }
  void SetSize(const uint32_t size) { size_ = size; }
  uint32_t GetLength() const { return size_ * sizeof(T); }
  int32_t GetPosition() const { return static_cast<int32_t>(pos_); }

  T GetValue(const uint32_t index, twin::Loc loc = twin::Loc::current()) const {
    twin::Core& c = twin::Me();
    T v;
    c.ScalarAccessor([&] {
      const twin::Op op = c.Begin(twin::kS, "LocalTensor::GetValue", loc);
      const uint64_t a = Element(index, op);
      c.Ub(op, a, sizeof(T), false);
      std::memcpy(&v, c.UbPtr(a), sizeof(T));
    });
    return v;
  }
  template <typename S>
  void SetValue(const uint32_t index, const S value, twin::Loc loc = twin::Loc::current()) const {
    twin::Core& c = twin::Me();
    const T v = static_cast<T>(value);
    c.ScalarAccessor([&] {
      const twin::Op op = c.Begin(twin::kS, "LocalTensor::SetValue", loc);
      const uint64_t a = Element(index, op);
      c.Ub(op, a, sizeof(T), true);
      std::memcpy(c.UbPtr(a), &v, sizeof(T));
    });
  }
  UbRef<T> operator()(const uint32_t offset, twin::Loc loc = twin::Loc::current()) const {
    return UbRef<T>(*this, offset, loc);
  }
  // Shrinks the size, as the NPU build does (kernel_tensor_impl.h:917).
  LocalTensor operator[](const uint32_t offset) const {
    UbOffset("LocalTensor::operator[]");
    if (offset > size_) twin::Fail(twin::Format("LocalTensor[%u] of a tensor of %u elements", offset, size_));
    return LocalTensor(twin::UbTag{}, pos_, off_ + offset * static_cast<uint32_t>(sizeof(T)), size_ - offset);
  }
  template <typename U>
  LocalTensor<U> ReinterpretCast() const {
    UbOffset("LocalTensor::ReinterpretCast");
    return LocalTensor<U>(twin::UbTag{}, pos_, off_, static_cast<uint32_t>(uint64_t{size_} * sizeof(T) / sizeof(U)));
  }

  // The twin's view: the tensor's UB bytes, checked to be an allocated tensor.
  uint64_t UbOffset(const char* api) const {
    if (!valid_) twin::Fail(twin::Format("%s: LocalTensor was never allocated (AllocTensor, DeQue or Get)", api));
    return off_;
  }
  uint64_t UbOffset(const twin::Op& op) const {
    return valid_ ? off_ : UbOffset(twin::Sites::Describe(op.site).c_str());
  }

 private:
  uint64_t Element(uint32_t index, const twin::Op& op) const {
    UbOffset(op);
    if (index >= size_) {
      twin::Fail(twin::Format("%s: index %u of a LocalTensor of %u elements", twin::Sites::Describe(op.site).c_str(),
                              index, size_));
    }
    const uint64_t a = off_ + uint64_t{index} * sizeof(T);
    twin::CheckAligned(a, sizeof(T), op);
    return a;
  }

  uint32_t off_ = 0, size_ = 0;
  TPosition pos_ = TPosition::VECCALC;
  bool valid_ = false;
};

}  // namespace AscendC
