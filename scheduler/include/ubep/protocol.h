// Data-as-Flag wire formats: the twin of ubep/protocol (docs/PROTOCOL.md is the specification).
//
// A batch is N rows one source sends to one destination in one call e (epoch, u64, never 0). A row
// of row_bytes is cut into blocks_per_row blocks of block_bytes; each carries payload_bytes of the
// row at payload_offset; the first flag_bytes of every block are what synchronization reads:
//   sw  payload only, then the 16-byte record (epoch, N) after a fence;
//   tff [epoch LE repeated flag_bytes / 8 times | payload]; no record;
//   dc  marker words xored with fmix32(k ^ digest(e)); then the record (epoch, checksum);
//   sp  raw payload into blocks whose markers hold the sentinel; the record (epoch, N) only if a row
//       would arrive with a sentinel marker.
// Example, hidden 7168 bf16 (14336 B), tff 512 / 32: 30 blocks of 480 payload bytes, stride 15360.
#pragma once

#include "ubep/qualifiers.h"

namespace ubep {

enum class Mode { SW, TFF, DC, SP };

constexpr int RECORD_BYTES = 16;

struct WireFormat {
  Mode mode;
  int64_t element_bytes;
  int64_t hidden;
  int64_t block_bytes;
  int64_t flag_bytes;
  uint32_t sentinel;  // sp: the sentinel element's bit pattern (element_bytes wide)

  UBEP_FN int64_t row_bytes() const { return hidden * element_bytes; }
  UBEP_FN int64_t payload_bytes() const { return mode == Mode::TFF ? block_bytes - flag_bytes : block_bytes; }
  UBEP_FN int64_t payload_offset() const { return block_bytes - payload_bytes(); }
  UBEP_FN int64_t blocks_per_row() const { return (row_bytes() + payload_bytes() - 1) / payload_bytes(); }
  UBEP_FN int64_t row_stride() const { return blocks_per_row() * block_bytes; }
};

// MurmurHash3's 32-bit finalizer (a bijection). fmix32(1) == 0x514E28B7.
UBEP_FN uint32_t fmix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x85EBCA6Bu;
  x ^= x >> 13;
  x *= 0xC2B2AE35u;
  return x ^ (x >> 16);
}

UBEP_FN uint32_t epoch_digest(uint64_t epoch) {
  return fmix32(static_cast<uint32_t>(epoch) ^ fmix32(static_cast<uint32_t>(epoch >> 32)));
}

UBEP_FN uint32_t load_u32(const uint8_t* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}

UBEP_FN void store_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

UBEP_FN void store_u64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

UBEP_FN uint64_t load_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = v << 8 | p[i];
  return v;
}

// The marker byte m (0 <= m < flag_bytes) a sentinel-filled sp block holds.
UBEP_FN uint8_t sentinel_byte(const WireFormat& f, int64_t m) {
  return static_cast<uint8_t>(f.sentinel >> (8 * (m % f.element_bytes)));
}

// True if the block's marker bytes all equal the sentinel's.
UBEP_FN bool marker_is_sentinel(const WireFormat& f, const uint8_t* block) {
  for (int64_t m = 0; m < f.flag_bytes; ++m) {
    if (block[m] != sentinel_byte(f, m)) return false;
  }
  return true;
}

// dc: xor every marker word of the batch with its epoch mask fmix32(k ^ digest); encodes and
// decodes (k numbers the marker words over the batch).
UBEP_FN void xor_markers(const WireFormat& f, uint8_t* wire, int64_t num_rows, uint64_t epoch) {
  const uint32_t digest = epoch_digest(epoch);
  const int64_t words_per_block = f.flag_bytes / 4, blocks = num_rows * f.blocks_per_row();
  for (int64_t blk = 0; blk < blocks; ++blk) {
    for (int64_t j = 0; j < words_per_block; ++j) {
      uint8_t* p = wire + blk * f.block_bytes + 4 * j;
      store_u32(p, load_u32(p) ^ fmix32(static_cast<uint32_t>(blk * words_per_block + j) ^ digest));
    }
  }
}

// The blocks of N rows (row_bytes each, back to back) into wire (N * row_stride bytes); returns
// true if an sp row would arrive with a sentinel marker (the batch then needs its record).
UBEP_FN bool encode_blocks(const WireFormat& f, const uint8_t* rows, int64_t num_rows,
                           uint64_t epoch, uint8_t* wire) {
  const int64_t nb = f.blocks_per_row(), bb = f.block_bytes, pb = f.payload_bytes();
  const int64_t off = f.payload_offset(), rb = f.row_bytes();
  bool collision = false;
  for (int64_t r = 0; r < num_rows; ++r) {
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* block = wire + (r * nb + b) * bb;
      for (int64_t i = 0; i < bb; ++i) block[i] = 0;
      for (int64_t i = 0; i < pb && b * pb + i < rb; ++i) block[off + i] = rows[r * rb + b * pb + i];
      if (f.mode == Mode::TFF) {
        for (int64_t i = 0; i < f.flag_bytes; i += 8) store_u64(block + i, epoch);
      } else if (f.mode == Mode::SP && marker_is_sentinel(f, block)) {
        collision = true;
      }
    }
  }
  if (f.mode == Mode::DC) xor_markers(f, wire, num_rows, epoch);
  return collision;
}

// u64 checksum of a dc batch as it sits on the wire (markers already masked).
UBEP_FN uint64_t checksum(const WireFormat& f, const uint8_t* wire, int64_t num_rows, uint64_t epoch) {
  const int64_t words_per_block = f.flag_bytes / 4, blocks = num_rows * f.blocks_per_row();
  uint32_t lane_a = 0, lane_b = 0;
  for (int64_t blk = 0; blk < blocks; ++blk) {
    for (int64_t j = 0; j < words_per_block; ++j) {
      const uint32_t w = load_u32(wire + blk * f.block_bytes + 4 * j);
      const uint32_t k2 = static_cast<uint32_t>(2 * (blk * words_per_block + j));
      lane_a += fmix32(w ^ fmix32(k2));
      lane_b += fmix32(w ^ fmix32(k2 + 1));
    }
  }
  return uint64_t(fmix32(lane_b ^ fmix32(static_cast<uint32_t>(blocks)))) << 32 |
         fmix32(lane_a ^ epoch_digest(epoch));
}

// Encode a batch: the wire, and the 16-byte record (epoch, value) where the mode writes one
// (returns true then): sw and colliding sp value N, dc value the checksum.
UBEP_FN bool encode_batch(const WireFormat& f, const uint8_t* rows, int64_t num_rows, uint64_t epoch,
                          uint8_t* wire, uint8_t* record) {
  const bool collision = encode_blocks(f, rows, num_rows, epoch, wire);
  store_u64(record, epoch);
  if (f.mode == Mode::SW || (f.mode == Mode::SP && collision)) {
    store_u64(record + 8, static_cast<uint64_t>(num_rows));
    return true;
  }
  if (f.mode == Mode::DC) {
    store_u64(record + 8, checksum(f, wire, num_rows, epoch));
    return true;
  }
  return false;
}

// The rows of an arrived batch back from the wire (scratch: a copy of the wire for dc unmasking).
UBEP_FN void decode(const WireFormat& f, const uint8_t* wire, int64_t num_rows, uint64_t epoch,
                    uint8_t* scratch, uint8_t* rows) {
  const int64_t total = num_rows * f.row_stride();
  for (int64_t i = 0; i < total; ++i) scratch[i] = wire[i];
  if (f.mode == Mode::DC) xor_markers(f, scratch, num_rows, epoch);
  const int64_t nb = f.blocks_per_row(), pb = f.payload_bytes(), rb = f.row_bytes();
  for (int64_t r = 0; r < num_rows; ++r) {
    for (int64_t i = 0; i < rb; ++i) {
      rows[r * rb + i] = scratch[(r * nb + i / pb) * f.block_bytes + f.payload_offset() + i % pb];
    }
  }
}

// Per-block predicate of tff (the flag holds this epoch) and sp (the marker left the sentinel).
UBEP_FN bool block_arrived(const WireFormat& f, const uint8_t* block, uint64_t epoch) {
  if (f.mode == Mode::TFF) {
    for (int64_t i = 0; i < f.flag_bytes; i += 8) {
      if (load_u64(block + i) != epoch) return false;
    }
    return true;
  }
  return !marker_is_sentinel(f, block);
}

// arrived[r] for every row of the batch (record may be null for tff).
UBEP_FN void arrived_rows(const WireFormat& f, const uint8_t* wire, int64_t num_rows,
                          const uint8_t* record, uint64_t epoch, bool* arrived) {
  bool complete = false;
  if (f.mode != Mode::TFF) {
    const uint64_t want = f.mode == Mode::DC ? checksum(f, wire, num_rows, epoch)
                                             : static_cast<uint64_t>(num_rows);
    complete = load_u64(record) == epoch && load_u64(record + 8) == want;
  }
  for (int64_t r = 0; r < num_rows; ++r) {
    bool blocks_in = f.mode == Mode::TFF || f.mode == Mode::SP;
    for (int64_t b = 0; blocks_in && b < f.blocks_per_row(); ++b) {
      blocks_in = block_arrived(f, wire + r * f.row_stride() + b * f.block_bytes, epoch);
    }
    arrived[r] = f.mode == Mode::TFF ? blocks_in : (complete || (f.mode == Mode::SP && blocks_in));
  }
}

}  // namespace ubep
