// TQueBind<src, dst, depth, mask>, TQue<pos, depth, mask> and TBuf<pos> (asc-devkit
// include/basic_api/kernel_tpipe.h); the events each queue operation issues are listed in tpipe.h.
#pragma once

#include <cstdint>

#include "tpipe.h"

namespace AscendC {

template <TPosition src, TPosition dst, int32_t depth, auto mask = 0>
class TQueBind {
  static_assert(depth >= 1, "the twin models queues of depth >= 1 (not the depth-0 in-place API)");
  static constexpr HardEvent enQueEvt = twin::QueEvt(src, dst, true);
  static constexpr HardEvent freeBufEvt = twin::QueEvt(src, dst, false);
  static_assert(enQueEvt != HardEvent::MAX, "an AIV queue moves GM->UB, UB->GM or UB->UB");
  static constexpr TPosition kPos = dst == TPosition::GM ? src : dst;

 public:
  template <typename T>
  LocalTensor<T> AllocTensor(twin::Loc loc = twin::Loc::current()) {
    twin::Core& c = twin::Me();
    for (uint32_t k = 0; k < num_; ++k) {
      twin::QueBuffer& b = Buf((cursor_ + k) % num_);
      if (b.state != twin::BufState::FREE) continue;
      const uint32_t i = (cursor_ + k) % num_;
      cursor_ = (i + 1) % num_;
      b.state = twin::BufState::OCCUPIED;
      if (b.free_id >= 0) {  // blocks freeBufEvt's destination pipe, not the scalar unit
        twin::WaitFlagAt(c, b.free_evt, b.free_id, twin::Sites::Intern("TQue::AllocTensor", loc));
        ReleaseFree(b);
      }
      return Tensor<T>(b);
    }
    twin::Fail(twin::Format("TQue::AllocTensor (%s): all %u buffers of the queue are allocated; the chip spins "
                            "forever waiting for a free one",
                            twin::Where(loc).c_str(), num_));
  }

  template <typename T>
  bool EnQue(const LocalTensor<T>& tensor, twin::Loc loc = twin::Loc::current()) {
    twin::QueBuffer& b = Owner(tensor, "TQue::EnQue", loc);
    if (b.state != twin::BufState::OCCUPIED && b.state != twin::BufState::DEQUE) {
      twin::Fail(twin::Format("TQue::EnQue (%s): the buffer is not allocated", twin::Where(loc).c_str()));
    }
    if (used_ >= depth) {
      twin::Fail(twin::Format("TQue::EnQue (%s): the queue of depth %d is full", twin::Where(loc).c_str(), depth));
    }
    b.enque_id = pipe_->template AllocEventID<enQueEvt>();
    twin::SetFlagAt(twin::Me(), enQueEvt, b.enque_id, twin::Sites::Intern("TQue::EnQue", loc));
    b.state = twin::BufState::ENQUE;
    que_[tail_] = static_cast<uint32_t>(&b - &pipe_->Buffer(first_));
    tail_ = (tail_ + 1) % depth;
    ++used_;
    return true;
  }

  template <typename T>
  LocalTensor<T> DeQue(twin::Loc loc = twin::Loc::current()) {
    if (used_ == 0) twin::Fail(twin::Format("TQue::DeQue (%s): the queue is empty", twin::Where(loc).c_str()));
    twin::QueBuffer& b = Buf(que_[head_]);
    head_ = (head_ + 1) % depth;
    --used_;
    twin::WaitFlagAt(twin::Me(), enQueEvt, b.enque_id, twin::Sites::Intern("TQue::DeQue", loc));
    pipe_->template ReleaseEventID<enQueEvt>(b.enque_id);
    b.enque_id = -1;
    b.state = twin::BufState::DEQUE;
    return Tensor<T>(b);
  }

  template <typename T>
  void FreeTensor(LocalTensor<T>& tensor, twin::Loc loc = twin::Loc::current()) {
    twin::QueBuffer& b = Owner(tensor, "TQue::FreeTensor", loc);
    if (b.state == twin::BufState::FREE) {
      twin::Fail(twin::Format("TQue::FreeTensor (%s): the buffer is already free", twin::Where(loc).c_str()));
    }
    b.free_evt = freeBufEvt;
    b.free_id = pipe_->template AllocEventID<freeBufEvt>();
    twin::SetFlagAt(twin::Me(), freeBufEvt, b.free_id, twin::Sites::Intern("TQue::FreeTensor", loc));
    b.state = twin::BufState::FREE;
  }

  bool VacantInQue() const { return used_ < depth; }
  bool HasTensorInQue() const { return used_ > 0; }
  int32_t GetTensorCountInQue() const { return static_cast<int32_t>(used_); }

  // The twin's: TPipe::InitBuffer hands the queue buffers first .. first + num - 1.
  void Bind(TPipe* pipe, uint32_t first, uint32_t num) {
    if (pipe_) twin::Fail("TPipe::InitBuffer: the queue already has buffers");
    pipe_ = pipe;
    first_ = first;
    num_ = num;
  }

 private:
  twin::QueBuffer& Buf(uint32_t i) {
    if (!pipe_) twin::Fail("a TQue used before TPipe::InitBuffer gave it buffers");
    return pipe_->Buffer(first_ + i);
  }
  template <typename T>
  LocalTensor<T> Tensor(const twin::QueBuffer& b) const {
    return LocalTensor<T>(twin::UbTag{}, kPos, b.offset, static_cast<uint32_t>(b.bytes / sizeof(T)));
  }
  template <typename T>
  twin::QueBuffer& Owner(const LocalTensor<T>& t, const char* api, const twin::Loc& loc) {
    const uint64_t off = t.UbOffset(api);
    for (uint32_t i = 0; i < num_; ++i) {
      twin::QueBuffer& b = Buf(i);
      if (off >= b.offset && off < uint64_t{b.offset} + b.bytes) return b;
    }
    twin::Fail(twin::Format("%s (%s): the tensor is not a buffer of this queue", api, twin::Where(loc).c_str()));
  }
  void ReleaseFree(twin::QueBuffer& b) {
    pipe_->template ReleaseEventID<freeBufEvt>(b.free_id);
    b.free_id = -1;
  }

  TPipe* pipe_ = nullptr;
  uint32_t first_ = 0, num_ = 0, cursor_ = 0;
  uint32_t que_[depth] = {};
  uint32_t head_ = 0, tail_ = 0, used_ = 0;
};

template <TPosition pos, int32_t depth, auto mask = 0>
class TQue : public TQueBind<twin::LogicPos(pos, true), twin::LogicPos(pos, false), depth, mask> {
  static_assert(pos != TPosition::VECCALC, "TQue<VECCALC> is invalid (GetBufferLogicPos asserts): use TBuf");
  static_assert(pos == TPosition::VECIN || pos == TPosition::VECOUT, "an AIV TQue is VECIN or VECOUT");
};

// A UB buffer with no synchronization: every hazard on it is the kernel's to order.
template <TPosition pos>
class TBuf {
 public:
  template <typename T>
  LocalTensor<T> Get() {
    return Get<T>(bytes_ / sizeof(T));
  }
  template <typename T>
  LocalTensor<T> Get(uint32_t len) {
    Check(uint64_t{len} * sizeof(T));
    return LocalTensor<T>(twin::UbTag{}, pos, offset_, len);
  }
  // size elements from byte bufOffset of the buffer.
  template <typename T>
  LocalTensor<T> GetWithOffset(uint32_t size, uint32_t bufOffset) {
    Check(uint64_t{bufOffset} + uint64_t{size} * sizeof(T));
    return LocalTensor<T>(twin::UbTag{}, pos, offset_ + bufOffset, size);
  }

  void Bind(uint32_t offset, uint32_t bytes) {
    if (bound_) twin::Fail("TPipe::InitBuffer: the TBuf already has a buffer");
    bound_ = true;
    offset_ = offset;
    bytes_ = bytes;
  }

 private:
  void Check(uint64_t end) const {
    if (!bound_) twin::Fail("TBuf::Get before TPipe::InitBuffer");
    if (end > bytes_) twin::Fail(twin::Format("TBuf::Get: %" PRIu64 " bytes of a %u-byte buffer", end, bytes_));
  }
  bool bound_ = false;
  uint32_t offset_ = 0, bytes_ = 0;
};

}  // namespace AscendC
