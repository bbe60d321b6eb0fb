// The dispatch kernel's vector counts (op_kernel/ep_scan.h, on UB tensors inside a launch of the
// strict twin) against a plain count of the same routing: for random routings (dropped pairs
// included, experts repeated within a token), 1-9 pairs per token, 1-16 experts per die and 1-24
// dies, every expert's pairs and every die's tokens (those with at least one pair on it).
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "../../../scheduler/tests/check.h"
#include "ep_scan.h"

namespace {

using AscendC::HardEvent;
using AscendC::LocalTensor;

struct Counts {
  std::vector<int64_t> pairs, tokens;  // per expert, per die
};

Counts plain(const std::vector<int64_t>& ids, int64_t K, int64_t L, int64_t W) {
  Counts c{std::vector<int64_t>(W * L, 0), std::vector<int64_t>(W, 0)};
  for (size_t t = 0; t * K < ids.size(); ++t) {
    std::vector<bool> on(W, false);
    for (int64_t k = 0; k < K; ++k) {
      const int64_t e = ids[t * K + k];
      if (e < 0) continue;
      ++c.pairs[e];
      on[e / L] = true;
    }
    for (int64_t d = 0; d < W; ++d) c.tokens[d] += on[d] ? 1 : 0;
  }
  return c;
}

// The counts as the kernel takes them: the ids copied into UB in windows of `window_tokens`.
Counts scanned(const std::vector<int64_t>& ids, int64_t K, int64_t L, int64_t W, int64_t window_tokens) {
  Counts c{std::vector<int64_t>(W * L, 0), std::vector<int64_t>(W, 0)};
  const int64_t E = W * L, pairs = static_cast<int64_t>(ids.size()), window = window_tokens * K;
  AscendC::twin::launch(1, [&] {
    AscendC::TPipe pipe;
    AscendC::TBuf<AscendC::TPosition::VECCALC> buf;
    pipe.InitBuffer(buf, static_cast<uint32_t>(ubep_ascend::RoundUp32(8 * window)));
    ubep_ascend::RouteScan scan;
    scan.Init(K, L, window_tokens, E + W, &pipe);
    const LocalTensor<int64_t> ub = buf.Get<int64_t>();
    for (int64_t lo = 0; lo < pairs; lo += window) {
      const int64_t n = lo + window < pairs ? window : pairs - lo;
      if (lo > 0) ubep_ascend::Sync<HardEvent::S_MTE2>();
      ubep_ascend::CopyIn(ub, ubep_ascend::Gm<int64_t>(reinterpret_cast<uint8_t*>(const_cast<int64_t*>(ids.data()) + lo), n * 8), n * 8);
      ubep_ascend::Sync<HardEvent::MTE2_S>();
      scan.Prepare(ub, n);
      for (int64_t e = 0; e < E; ++e) scan.PairsOf(e, e);
      for (int64_t d = 0; d < W; ++d) scan.TokensOn(d, E + d);
      scan.Collect();
      for (int64_t e = 0; e < E; ++e) c.pairs[e] += scan.Pairs(e);
      for (int64_t d = 0; d < W; ++d) c.tokens[d] += scan.Tokens(E + d);
    }
  });
  return c;
}

}  // namespace

int main() {
  Checks checks;
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 60; ++trial) {
    const int64_t K = 1 + static_cast<int64_t>(rng() % 9), L = 1 + static_cast<int64_t>(rng() % 16);
    const int64_t W = 1 + static_cast<int64_t>(rng() % 24), T = static_cast<int64_t>(rng() % 300);
    const int64_t window_tokens = 1 + static_cast<int64_t>(rng() % 130);
    std::vector<int64_t> ids(T * K);
    const bool hot = trial % 4 == 0;  // every pair on one die
    for (int64_t& e : ids) {
      e = rng() % 10 == 0 ? -1 : static_cast<int64_t>(rng() % (hot ? L : W * L));
    }
    const Counts want = plain(ids, K, L, W), got = scanned(ids, K, L, W, window_tokens);
    const std::string what = "K " + std::to_string(K) + ", L " + std::to_string(L) + ", W " + std::to_string(W) +
                             ", T " + std::to_string(T) + ", window " + std::to_string(window_tokens);
    checks.equal(got.pairs, want.pairs, what + ": pairs per expert");
    checks.equal(got.tokens, want.tokens, what + ": tokens per die");
  }
  return checks.report("dispatch routing counts on the strict twin");
}
