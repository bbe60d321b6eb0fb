// Compile-only check: the twin's functions are callable from CUDA device code (built when CMake
// finds a CUDA compiler; nothing runs).
#include "ubep/layout.h"
#include "ubep/mapping.h"
#include "ubep/protocol.h"

__global__ void use_twin(const int64_t* topk_idx, int64_t* counts, const int64_t* cumsum,
                         const uint8_t* rows, uint8_t* wire, uint8_t* record) {
  ubep::expert_counts(topk_idx, 16, 8, counts);
  counts[0] += ubep::quaternary_search(cumsum, 8, 3).position;
  const ubep::WireFormat f{ubep::Mode::TFF, 2, 8, 16, 8, 0xFFA5u};
  ubep::encode_batch(f, rows, 1, 5, wire, record);
}
