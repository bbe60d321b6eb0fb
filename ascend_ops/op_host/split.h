// Host tiling: the count/token AIV split of a dispatch, by exact search over the cost model of
// docs/ALGORITHMS.md (one rank's dispatch on a CM384-like two-tier fabric, uniform routing).
// Plain C++, no torch; the op calls BestSplit with the layer shape. tests/vectors/split.json holds
// the model's answers, which test_ascend_split replays.
//
//   T_count(n_c) = b_count + L + ceil(E / n_c) * beta + ceil(T * K / n_c) * pair + chain * n_c
//                  + cumsum * W * ceil(E_local / n_c)
//   T_token(n_t) = b_token + L + ceil(T * d / min(n_t, n_sat)) * (alpha + B * n_sat * nu / eff)
//   T_tail       = ceil(T * K / n) * B / reorder_gbps
//   T_total      = max(T_count, T_token) + T_tail
//
// Worked example, the paper's point: W = 256 dies, T = 64, E = 256, K = 8, B = 14336, n = 48 AIVs.
// E_local = 1, d = 8 copies per token, nu = 0.00254106 ns/byte, L = 1700 ns; one copy costs
// 100 + 14336 * 24 * 0.00254106 = 974.29 ns; T_token = 1000 + 1700 + ceil(512 / 24) * 974.29 =
// 24134.3 for any n_c <= 24, T_count(11) = 24320 > it, T_count(12) = 23970 < it: n_c = 12,
// n_t = 36, T_total = 24134.3 + ceil(512 / 48) * 14336 / 30 = 29390.8.
#pragma once

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace ubep_ascend {

// Per-worker costs of one die (cm384_ascend: 48 AIVs, 392 GB/s links); see CostParams in Python.
struct CostParams {
  double alpha_ns;              // software cost of one token copy on a token worker
  double beta_ns;               // one expert's count on a count worker
  double pair_ns;               // per pair where count workers split the pairs (0: per expert)
  double chain_ns;              // per count worker that adds the counts of those before it
  double b_count_ns;            // start-up of the count group
  double b_token_ns;            // start-up of the token group
  double cumsum_ns_per_source;  // CalCumSum per source rank and local expert
  int64_t max_token_workers;    // token workers that saturate the link
  double link_efficiency;       // achieved over the stated bandwidth
  double reorder_gbps;          // one worker's local copy rate for the reorder tail
};

inline constexpr CostParams kCm384Ascend{100.0, 175.0, 0.0, 0.0, 500.0, 1000.0, 70.0, 24, 1.0, 30.0};

// One rank per die: class 0 the same NPU (2 dies), class 1 the same board (8 NPUs, 16 dies),
// class 2 across the second switch tier.
struct Cm384Fabric {
  int64_t dies_per_npu;
  int64_t dies_per_board;
  double latency_ns[3];
  double bandwidth_gbps[3];
};

inline constexpr Cm384Fabric kCm384{2, 16, {150.0, 600.0, 1700.0}, {784.0, 392.0, 392.0}};

// What a source rank puts on the fabric per token. copies_per_token = copies_num / copies_den
// exactly (so 8 copies never round up to an extra one per worker); ns_per_byte is the mean of
// 1 / bandwidth over the copies and latency_ns the farthest class, each the worst over sources.
struct Traffic {
  int64_t world;
  __int128 copies_num, copies_den;
  double ns_per_byte;
  double latency_ns;
};

// a * b, throwing instead of wrapping.
inline __int128 CheckedMul(__int128 a, __int128 b) {
  __int128 out;
  if (__builtin_mul_overflow(a, b, &out)) throw std::overflow_error("ubep_ascend: split model overflows");
  return out;
}

inline __int128 Gcd(__int128 a, __int128 b) {
  while (b) {
    const __int128 r = a % b;
    a = b;
    b = r;
  }
  return a;
}

// A destination rank holds E_local = E / W experts and is reached with probability
// p = 1 - C(E - E_local, K) / C(E, K) = 1 - prod_{i<K} (E - E_local - i) / (E - i); every class
// gets p times its rank count, so p cancels from ns_per_byte.
// Example: W = 256, E = 256, K = 8: p = 1 - 255/256 * ... * 248/249 = 1/32, 8 copies per token;
// source 0 sees (2, 14, 240) ranks at (784, 392, 392) GB/s: ns_per_byte = (2/784 + 254/392) / 256
// = 0.00254106, latency 1700 ns. W = 8: one board, classes (2, 6, 0): latency 600 ns.
inline Traffic Cm384Traffic(int64_t experts, int64_t topk, int64_t world, const Cm384Fabric& f = kCm384) {
  if (world < 1 || world > 768 || experts < 1 || topk < 1 || topk > experts || experts % world) {
    throw std::invalid_argument("ubep_ascend: split needs 1 <= world <= 768, 1 <= topk <= experts and experts a "
                                "multiple of world; got world " + std::to_string(world) + ", experts " +
                                std::to_string(experts) + ", topk " + std::to_string(topk));
  }
  const int64_t local = experts / world;
  __int128 miss_num = 1, miss_den = 1;  // C(E - E_local, K) / C(E, K), reduced at each step
  for (int64_t i = 0; i < topk; ++i) {
    miss_num = CheckedMul(miss_num, experts - local - i);
    miss_den = CheckedMul(miss_den, experts - i);
    const __int128 g = Gcd(miss_num, miss_den);
    if (g > 1) miss_num /= g, miss_den /= g;
  }
  __int128 num = CheckedMul(world, miss_den - miss_num), den = miss_den;
  const __int128 g = Gcd(num, den);
  if (g > 1) num /= g, den /= g;
  const double inv_bw[3] = {1.0 / f.bandwidth_gbps[0], 1.0 / f.bandwidth_gbps[1], 1.0 / f.bandwidth_gbps[2]};
  double worst = 0.0, latency = 0.0;
  for (int64_t s = 0; s < world; ++s) {
    const int64_t npu = s / f.dies_per_npu * f.dies_per_npu, board = s / f.dies_per_board * f.dies_per_board;
    const int64_t c0 = std::min(world, npu + f.dies_per_npu) - npu;
    const int64_t c1 = std::min(world, board + f.dies_per_board) - board - c0;
    const int64_t c2 = world - c0 - c1;
    worst = std::max(worst, c0 * inv_bw[0] + c1 * inv_bw[1] + c2 * inv_bw[2]);
    latency = std::max(latency, c2 ? f.latency_ns[2] : c1 ? f.latency_ns[1] : f.latency_ns[0]);
  }
  return {world, num, den, worst / world, latency};
}

inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Example: W = 256, E = 256, n_c = 12: 500 + 1700 + 175 * 22 + 70 * 256 * 1 = 23970.
inline double CountGroupNs(int64_t tokens, int64_t experts, int64_t topk, int64_t n_count, const Traffic& tr,
                           const CostParams& p) {
  const int64_t local = experts / tr.world;
  return p.b_count_ns + tr.latency_ns + CeilDiv(experts, n_count) * p.beta_ns +
         CeilDiv(tokens * topk, n_count) * p.pair_ns + p.chain_ns * n_count +
         p.cumsum_ns_per_source * tr.world * CeilDiv(local, n_count);
}

// Example: B = 14336, nu = 0.00254106: 100 + 14336 * 24 * 0.00254106 / 1.0 = 974.29.
inline double PerCopyNs(int64_t bytes_per_token, const Traffic& tr, const CostParams& p) {
  return p.alpha_ns +
         static_cast<double>(bytes_per_token * p.max_token_workers) * tr.ns_per_byte / p.link_efficiency;
}

// Example: T = 64, 8 copies per token, n_t = 36 counts as 24: ceil(512 / 24) = 22 copies each,
// 1000 + 1700 + 22 * 974.29 = 24134.3.
inline double TokenGroupNs(int64_t tokens, int64_t bytes_per_token, int64_t n_token, const Traffic& tr,
                           const CostParams& p) {
  const int64_t workers = std::min(n_token, p.max_token_workers);
  const __int128 num = CheckedMul(tokens, tr.copies_num), den = CheckedMul(tr.copies_den, workers);
  const int64_t copies = static_cast<int64_t>((num + den - 1) / den);
  return p.b_token_ns + tr.latency_ns + copies * PerCopyNs(bytes_per_token, tr, p);
}

// Example: T = 64, K = 8, B = 14336, n = 48: ceil(512 / 48) = 11 rows, 11 * 14336 / 30 = 5256.5.
inline double ReorderTailNs(int64_t tokens, int64_t topk, int64_t bytes_per_token, int64_t n_workers,
                            const CostParams& p) {
  return static_cast<double>(CeilDiv(tokens * topk, n_workers) * bytes_per_token) / p.reorder_gbps;
}

struct Split {
  int64_t n_count, n_token;
  double count_ns, token_ns, tail_ns, total_ns;
};

// The n_count in [1, n_workers - 1] with the least T_total; ties go to fewer count workers.
// Example: the header's paper point gives {12, 36, 23970, 24134.3, 5256.5, 29390.8}.
inline Split BestSplit(int64_t tokens, int64_t experts, int64_t topk, int64_t bytes_per_token, int64_t n_workers,
                       int64_t world, const CostParams& p = kCm384Ascend) {
  if (tokens < 0 || bytes_per_token < 1 || n_workers < 2) {
    throw std::invalid_argument("ubep_ascend: split needs tokens >= 0, bytes_per_token >= 1 and n_workers >= 2; "
                                "got " + std::to_string(tokens) + ", " + std::to_string(bytes_per_token) + ", " +
                                std::to_string(n_workers));
  }
  const Traffic tr = Cm384Traffic(experts, topk, world);
  Split best{0, 0, 0.0, 0.0, 0.0, 0.0};
  for (int64_t n_count = 1; n_count < n_workers; ++n_count) {
    const double t_count = CountGroupNs(tokens, experts, topk, n_count, tr, p);
    const double t_token = TokenGroupNs(tokens, bytes_per_token, n_workers - n_count, tr, p);
    const double total = std::max(t_count, t_token);
    if (n_count == 1 || total < best.total_ns) best = {n_count, n_workers - n_count, t_count, t_token, 0.0, total};
  }
  best.tail_ns = ReorderTailNs(tokens, topk, bytes_per_token, n_workers, p);
  best.total_ns += best.tail_ns;
  return best;
}

}  // namespace ubep_ascend
