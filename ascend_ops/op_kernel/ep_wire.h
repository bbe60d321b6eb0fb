// One row's Data-as-Flag wire blocks (docs/PROTOCOL.md; ubep/protocol.h is the specification and
// tests/vectors/protocol.json its check), encoded and decoded in UB. A row of row_bytes is cut into
// blocks of block_bytes, each carrying payload_bytes of the row at payload_offset; the first
// flag_bytes of a block are what synchronization reads.
//
// The payload moves on the vector unit (UB -> UB DataCopy, whole 32-byte units): the kernels'
// formats (ep_tiling.h, VectorFormat below) start every payload 32-byte aligned in its block and in
// the row. The scalar unit (LocalTensor GetValue/SetValue; A2/A3: GetPhyAddr() is a UB offset, not
// a pointer) writes and reads the flag words and the last block's sub-32-byte tail. Rows are whole
// 16- or 32-bit elements and every flag size is a multiple of 4, so the scalar moves 32-bit words
// and at most one 16-bit tail (scalar UB accesses must be aligned to their size).
#pragma once

#include "ep_sync.h"
#include "ubep/protocol.h"

namespace ubep_ascend {

using AscendC::LocalTensor;

// Bytes [from, to) of `buf` (both even) set to zero.
__aicore__ inline void ZeroBytes(const LocalTensor<uint8_t>& buf, int64_t from, int64_t to) {
  const LocalTensor<uint16_t> h = buf.ReinterpretCast<uint16_t>();
  const LocalTensor<uint32_t> w = buf.ReinterpretCast<uint32_t>();
  if (from < to && from % 4 != 0) {
    h.SetValue(static_cast<uint32_t>(from / 2), static_cast<uint16_t>(0));
    from += 2;
  }
  for (; from + 4 <= to; from += 4) w.SetValue(static_cast<uint32_t>(from / 4), 0u);
  if (from < to) h.SetValue(static_cast<uint32_t>(from / 2), static_cast<uint16_t>(0));
}

// n bytes (n even; both offsets multiples of 4) from `src` at src_off to `dst` at dst_off.
__aicore__ inline void CopyBytes(const LocalTensor<uint8_t>& dst, int64_t dst_off, const LocalTensor<uint8_t>& src,
                                 int64_t src_off, int64_t n) {
  const LocalTensor<uint32_t> d = dst.ReinterpretCast<uint32_t>(), s = src.ReinterpretCast<uint32_t>();
  const int64_t words = n / 4;
  for (int64_t i = 0; i < words; ++i) {
    d.SetValue(static_cast<uint32_t>(dst_off / 4 + i), s.GetValue(static_cast<uint32_t>(src_off / 4 + i)));
  }
  if (n % 4 != 0) {
    const uint32_t at = static_cast<uint32_t>((dst_off + 4 * words) / 2), from = static_cast<uint32_t>((src_off + 4 * words) / 2);
    dst.ReinterpretCast<uint16_t>().SetValue(at, src.ReinterpretCast<uint16_t>().GetValue(from));
  }
}

// A 32-bit word at an even byte offset (a dispatch row's route follows a row of 16-bit elements).
__aicore__ inline void PutU32(const LocalTensor<uint8_t>& buf, int64_t off, uint32_t v) {
  if (off % 4 == 0) {
    buf.ReinterpretCast<uint32_t>().SetValue(static_cast<uint32_t>(off / 4), v);
    return;
  }
  const LocalTensor<uint16_t> h = buf.ReinterpretCast<uint16_t>();
  h.SetValue(static_cast<uint32_t>(off / 2), static_cast<uint16_t>(v));
  h.SetValue(static_cast<uint32_t>(off / 2 + 1), static_cast<uint16_t>(v >> 16));
}
__aicore__ inline uint32_t GetU32(const LocalTensor<uint8_t>& buf, int64_t off) {
  if (off % 4 == 0) return buf.ReinterpretCast<uint32_t>().GetValue(static_cast<uint32_t>(off / 4));
  const LocalTensor<uint16_t> h = buf.ReinterpretCast<uint16_t>();
  return static_cast<uint32_t>(h.GetValue(static_cast<uint32_t>(off / 2))) |
         static_cast<uint32_t>(h.GetValue(static_cast<uint32_t>(off / 2 + 1))) << 16;
}

// The sp sentinel's marker bytes as a 32-bit word (the element size, 2 or 4, divides 4).
__aicore__ inline uint32_t SentinelWord(const ubep::WireFormat& f) {
  uint32_t w = 0;
  for (int64_t m = 0; m < 4; ++m) w |= static_cast<uint32_t>(ubep::sentinel_byte(f, m)) << (8 * m);
  return w;
}

// Whether the marker words of the block at byte `at` all hold the sentinel.
__aicore__ inline bool MarkerIsSentinel(const ubep::WireFormat& f, const LocalTensor<uint32_t>& wire, int64_t at) {
  const uint32_t s = SentinelWord(f);
  for (int64_t j = 0; j < f.flag_bytes / 4; ++j) {
    if (wire.GetValue(static_cast<uint32_t>(at / 4 + j)) != s) return false;
  }
  return true;
}

// dc: xor every marker word of row r with its mask, fmix32(k ^ digest(epoch)), k the batch-wide
// marker index; applying it twice restores the row.
__aicore__ inline void XorMarkers(const ubep::WireFormat& f, const LocalTensor<uint8_t>& wire, int64_t r,
                                  uint64_t epoch) {
  const LocalTensor<uint32_t> w = wire.ReinterpretCast<uint32_t>();
  const uint32_t digest = ubep::epoch_digest(epoch);
  const int64_t words = f.flag_bytes / 4, nb = f.blocks_per_row();
  for (int64_t b = 0; b < nb; ++b) {
    for (int64_t j = 0; j < words; ++j) {
      const uint32_t at = static_cast<uint32_t>(b * f.block_bytes / 4 + j);
      const uint32_t k = static_cast<uint32_t>((r * nb + b) * words + j);
      w.SetValue(at, w.GetValue(at) ^ ubep::fmix32(k ^ digest));
    }
  }
}

// dc lanes of row r as it sits on the wire, added to lanes[0..1].
__aicore__ inline void AddRowLanes(const ubep::WireFormat& f, const LocalTensor<uint8_t>& wire, int64_t r,
                                   uint32_t* lanes) {
  const LocalTensor<uint32_t> w = wire.ReinterpretCast<uint32_t>();
  const int64_t words = f.flag_bytes / 4, nb = f.blocks_per_row();
  for (int64_t b = 0; b < nb; ++b) {
    for (int64_t j = 0; j < words; ++j) {
      const uint32_t v = w.GetValue(static_cast<uint32_t>(b * f.block_bytes / 4 + j));
      const uint32_t k = static_cast<uint32_t>((r * nb + b) * words + j);
      lanes[0] += ubep::fmix32(v ^ ubep::fmix32(2 * k));
      lanes[1] += ubep::fmix32(v ^ ubep::fmix32(2 * k + 1));
    }
  }
}

// Whether the vector unit can carry f's payloads: 32-byte aligned in the block and in the row.
__aicore__ inline bool VectorFormat(const ubep::WireFormat& f) {
  return f.block_bytes % 32 == 0 && f.payload_offset() % 32 == 0 && f.payload_bytes() % 32 == 0;
}

// The blocks of a row: `full` carry a whole payload; the last may carry a partial one of `tail`
// bytes, `whole` of them in 32-byte units the vector moves.
struct RowBlocks {
  int64_t full, tail, whole;
  __aicore__ inline explicit RowBlocks(const ubep::WireFormat& f)
      : full(f.row_bytes() / f.payload_bytes()),
        tail(f.row_bytes() - full * f.payload_bytes()),
        whole(tail / 32 * 32) {}
};

// Row r (row_bytes of `row`) as its wire blocks (row_stride of `wire`): ubep::encode_blocks for one
// row; dc masks with the batch-wide marker index of row r and adds the row's checksum lanes to
// lanes[0..1]. True for an sp row with a marker equal to the sentinel (its batch needs a record).
// V copies the payloads and zeroes the last block's whole units past its payload; V -> S; the
// scalar writes the tail and the flags (tff), or masks and reads the markers (dc, sp). The caller
// ordered the writers of `row` and the readers of `wire` before V; `wire` is left to the scalar.
__aicore__ inline bool EncodeRow(const ubep::WireFormat& f, const LocalTensor<uint8_t>& row, int64_t r,
                                 uint64_t epoch, const LocalTensor<uint8_t>& wire, uint32_t* lanes) {
  const int64_t bb = f.block_bytes, pb = f.payload_bytes(), off = f.payload_offset();
  const RowBlocks rb(f);
  if (rb.full > 0) {
    AscendC::DataCopy(wire[static_cast<uint32_t>(off)], row,
                      AscendC::DataCopyParams(static_cast<uint16_t>(rb.full), static_cast<uint16_t>(pb / 32), 0,
                                              static_cast<uint16_t>((bb - pb) / 32)));
  }
  const int64_t at = rb.full * bb + off;  // the partial block's payload
  const int64_t zeros = rb.tail > 0 ? (at + rb.tail + 31) / 32 * 32 : 0;
  if (rb.whole > 0) {
    AscendC::DataCopy(wire[static_cast<uint32_t>(at)], row[static_cast<uint32_t>(rb.full * pb)],
                      static_cast<uint32_t>(rb.whole));
  }
  if (rb.tail > 0 && zeros < (rb.full + 1) * bb) {
    AscendC::Duplicate<int32_t>(wire[static_cast<uint32_t>(zeros)].ReinterpretCast<int32_t>(), 0,
                                static_cast<int32_t>(((rb.full + 1) * bb - zeros) / 4));
  }
  Sync<HardEvent::V_S>();
  if (rb.tail > rb.whole) {
    CopyBytes(wire, at + rb.whole, row, rb.full * pb + rb.whole, rb.tail - rb.whole);
    ZeroBytes(wire, at + rb.tail, zeros);
  }
  const LocalTensor<uint32_t> w = wire.ReinterpretCast<uint32_t>();
  const uint32_t lo = static_cast<uint32_t>(epoch), hi = static_cast<uint32_t>(epoch >> 32);
  bool collide = false;
  for (int64_t b = 0; b < f.blocks_per_row(); ++b) {
    if (f.mode == ubep::Mode::TFF) {  // the flag bytes precede the payload: the epoch, little-endian, repeated
      for (int64_t j = 0; j < f.flag_bytes / 4; ++j) w.SetValue(static_cast<uint32_t>(b * bb / 4 + j), j % 2 ? hi : lo);
    }
    if (f.mode == ubep::Mode::SP && MarkerIsSentinel(f, w, b * bb)) collide = true;
  }
  if (f.mode == ubep::Mode::DC) {
    XorMarkers(f, wire, r, epoch);
    AddRowLanes(f, wire, r, lanes);
  }
  return collide;
}

// The dc checksum of a batch of n rows from its lanes (docs/PROTOCOL.md).
__aicore__ inline uint64_t ChecksumOf(const ubep::WireFormat& f, const uint32_t* lanes, int64_t n, uint64_t epoch) {
  const uint32_t blocks = static_cast<uint32_t>(n * f.blocks_per_row());
  return uint64_t(ubep::fmix32(lanes[1] ^ ubep::fmix32(blocks))) << 32 |
         ubep::fmix32(lanes[0] ^ ubep::epoch_digest(epoch));
}

// Row r of an arrived batch from `wire` (dc: unmasked in place) into `row`, whose UB holds
// row_bytes rounded up to 32 (the last block's payload moves in whole 32-byte units). The scalar
// unmasks, S -> V, V copies the payloads, V -> S. The caller ordered the copy into `wire` and the
// readers of `row` before the scalar; `row` and `wire` are left to the scalar.
__aicore__ inline void DecodeRow(const ubep::WireFormat& f, const LocalTensor<uint8_t>& wire, int64_t r,
                                 uint64_t epoch, const LocalTensor<uint8_t>& row) {
  if (f.mode == ubep::Mode::DC) XorMarkers(f, wire, r, epoch);
  Sync<HardEvent::S_V>();
  const int64_t bb = f.block_bytes, pb = f.payload_bytes(), off = f.payload_offset();
  const RowBlocks rb(f);
  if (rb.full > 0) {
    AscendC::DataCopy(row, wire[static_cast<uint32_t>(off)],
                      AscendC::DataCopyParams(static_cast<uint16_t>(rb.full), static_cast<uint16_t>(pb / 32),
                                              static_cast<uint16_t>((bb - pb) / 32), 0));
  }
  if (rb.tail > 0) {
    AscendC::DataCopy(row[static_cast<uint32_t>(rb.full * pb)], wire[static_cast<uint32_t>(rb.full * bb + off)],
                      static_cast<uint32_t>((rb.tail + 31) / 32 * 32));
  }
  Sync<HardEvent::V_S>();
}

// tff / sp: every block of the row in `wire` has arrived (tff: its flag holds the epoch; sp: its
// marker left the sentinel).
__aicore__ inline bool RowArrived(const ubep::WireFormat& f, const LocalTensor<uint8_t>& wire, uint64_t epoch) {
  const LocalTensor<uint32_t> w = wire.ReinterpretCast<uint32_t>();
  const uint32_t lo = static_cast<uint32_t>(epoch), hi = static_cast<uint32_t>(epoch >> 32);
  for (int64_t b = 0; b < f.blocks_per_row(); ++b) {
    const int64_t at = b * f.block_bytes;
    if (f.mode != ubep::Mode::TFF) {
      if (MarkerIsSentinel(f, w, at)) return false;
      continue;
    }
    for (int64_t j = 0; j < f.flag_bytes / 4; ++j) {
      if (w.GetValue(static_cast<uint32_t>(at / 4 + j)) != (j % 2 ? hi : lo)) return false;
    }
  }
  return true;
}

}  // namespace ubep_ascend
