// The dispatch kernel's mapper (op_kernel/ep_map.h, HopBalancedPieces, on UB tensors inside a launch
// of the strict twin) against the shared one (scheduler/include/ubep/mapping.h, ubep::hop_balanced):
// for random per-destination counts, group sizes up to 64 dies, every source die and 1-24 token
// AIVs, each AIV's pieces must be the shared mapper's pieces of that worker, in the same order.
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "../../../scheduler/tests/check.h"
#include "ep_map.h"

namespace {

using AscendC::LocalTensor;

struct Piece {
  int64_t dest, start, length;
};

std::vector<int64_t> flat(const std::vector<Piece>& pieces) {
  std::vector<int64_t> out;
  for (const Piece& p : pieces) out.insert(out.end(), {p.dest, p.start, p.length});
  return out;
}

std::vector<std::vector<Piece>> shared_pieces(const std::vector<int64_t>& counts, int64_t rank, int64_t n) {
  const int64_t D = static_cast<int64_t>(counts.size());
  std::vector<int64_t> hops(D), order(D), cumsum(D), lo(n * 3), hi(n * 3), classes(3), ptr(n + 1);
  std::vector<int64_t> dest(D + n * 3), start(D + n * 3), length(D + n * 3);
  for (int64_t d = 0; d < D; ++d) hops[d] = ubep_ascend::HopClass(rank, d, 2, 16);
  ubep::hop_balanced(counts.data(), hops.data(), D, 3, n, ubep::Scratch{order.data(), cumsum.data(), lo.data(),
                                                                        hi.data()},
                     classes.data(), ubep::Pieces{ptr.data(), dest.data(), start.data(), length.data()});
  std::vector<std::vector<Piece>> out(n);
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t p = ptr[j]; p < ptr[j + 1]; ++p) out[j].push_back({dest[p], start[p], length[p]});
  }
  return out;
}

// Worker me's pieces as the kernel computes them, on one twin AIV.
std::vector<Piece> kernel_pieces(const std::vector<int64_t>& counts, int64_t rank, int64_t n, int64_t me) {
  const int64_t D = static_cast<int64_t>(counts.size()), w4 = (D + 3) / 4 * 4;
  std::vector<Piece> out;
  AscendC::twin::launch(1, [&] {
    AscendC::TPipe pipe;
    AscendC::TBuf<AscendC::TPosition::VECCALC> buf;
    pipe.InitBuffer(buf, static_cast<uint32_t>(6 * w4 * 8));
    const LocalTensor<int64_t> s = buf.Get<int64_t>();
    const LocalTensor<int64_t> ub_counts = s, order = s[static_cast<uint32_t>(w4)],
                               cumsum = s[static_cast<uint32_t>(2 * w4)], pieces = s[static_cast<uint32_t>(3 * w4)];
    for (int64_t d = 0; d < D; ++d) ub_counts.SetValue(static_cast<uint32_t>(d), counts[d]);
    const int64_t num = ubep_ascend::HopBalancedPieces(ub_counts, D, rank, 2, 16, n, me, order, cumsum, pieces);
    for (int64_t p = 0; p < num; ++p) {
      out.push_back({pieces.GetValue(static_cast<uint32_t>(3 * p)), pieces.GetValue(static_cast<uint32_t>(3 * p + 1)),
                     pieces.GetValue(static_cast<uint32_t>(3 * p + 2))});
    }
  });
  return out;
}

}  // namespace

int main() {
  Checks checks;
  std::mt19937_64 rng(20261205);
  for (int trial = 0; trial < 60; ++trial) {
    const int64_t D = 1 + static_cast<int64_t>(rng() % 64), n = 1 + static_cast<int64_t>(rng() % 24);
    const int64_t hot = static_cast<int64_t>(rng() % D), rank = static_cast<int64_t>(rng() % D);
    std::vector<int64_t> counts(D);
    for (int64_t d = 0; d < D; ++d) counts[d] = trial % 5 == 0 ? 0 : static_cast<int64_t>(rng() % 40);
    if (trial % 3 == 0) counts[hot] += 500;  // one hot destination
    const auto want = shared_pieces(counts, rank, n);
    for (int64_t me = 0; me < n; ++me) {
      const std::string seen = "D=" + std::to_string(D) + " n=" + std::to_string(n) + " rank " +
                               std::to_string(rank) + " worker " + std::to_string(me);
      checks.equal(flat(kernel_pieces(counts, rank, n, me)), flat(want[me]), seen + ": (dest, start, length)");
    }
  }
  return checks.report("ascend map");
}
