// Checks the host tiling's worker split (op_host/split.h) against tests/vectors/split.json, written by
// ubep.tuning.vectors from ubep.tuning.best_split: the same n_count and n_token, the same times to 1e-6
// relative, and the same cost parameters and fabric constants.
#include <cmath>
#include <cstdio>
#include <string>

#include "../../../scheduler/tests/check.h"
#include "../../../scheduler/tests/json.h"
#include "split.h"

namespace {

void close(double got, double want, const std::string& what, Checks& checks) {
  if (std::fabs(got - want) <= 1e-6 * std::fabs(want)) { ++checks.passed; return; }
  ++checks.failed;
  std::printf("FAIL %s: got %.17g | want %.17g\n", what.c_str(), got, want);
}

void check_constants(const json::Value& v, Checks& checks) {
  const auto& p = v["params"];
  const ubep_ascend::CostParams& c = ubep_ascend::kCm384Ascend;
  close(c.alpha_ns, p["alpha_ns"].d, "alpha_ns", checks);
  close(c.beta_ns, p["beta_ns"].d, "beta_ns", checks);
  close(c.pair_ns, p["pair_ns"].d, "pair_ns", checks);
  close(c.chain_ns, p["chain_ns"].d, "chain_ns", checks);
  close(c.b_count_ns, p["b_count_ns"].d, "b_count_ns", checks);
  close(c.b_token_ns, p["b_token_ns"].d, "b_token_ns", checks);
  close(c.cumsum_ns_per_source, p["cumsum_ns_per_source"].d, "cumsum_ns_per_source", checks);
  checks.equal(c.max_token_workers, p["max_token_workers"].i, "max_token_workers");
  close(c.link_efficiency, p["link_efficiency"].d, "link_efficiency", checks);
  close(c.reorder_gbps, p["reorder_gbps"].d, "reorder_gbps", checks);
  for (size_t h = 0; h < 3; ++h) {
    close(ubep_ascend::kCm384.latency_ns[h], v["fabric"]["latency_ns"][h].d, "latency_ns", checks);
    close(ubep_ascend::kCm384.bandwidth_gbps[h], v["fabric"]["bandwidth_gbps"][h].d, "bandwidth_gbps", checks);
  }
}

void check_case(const json::Value& c, Checks& checks) {
  const std::string name = "W=" + std::to_string(c["world"].i) + " T=" + std::to_string(c["tokens"].i) +
                           " E=" + std::to_string(c["experts"].i) + " K=" + std::to_string(c["topk"].i) +
                           " B=" + std::to_string(c["bytes_per_token"].i) + " n=" + std::to_string(c["n_workers"].i);
  const ubep_ascend::Split s = ubep_ascend::BestSplit(c["tokens"].i, c["experts"].i, c["topk"].i,
                                                      c["bytes_per_token"].i, c["n_workers"].i, c["world"].i);
  checks.equal({s.n_count, s.n_token}, {c["n_count"].i, c["n_token"].i}, name + " split");
  close(s.count_ns, c["count_ns"].d, name + " count_ns", checks);
  close(s.token_ns, c["token_ns"].d, name + " token_ns", checks);
  close(s.tail_ns, c["tail_ns"].d, name + " tail_ns", checks);
  close(s.total_ns, c["total_ns"].d, name + " total_ns", checks);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::printf("usage: %s tests/vectors/split.json\n", argv[0]);
    return 2;
  }
  const json::Value v = json::load(argv[1]);
  Checks checks;
  check_constants(v, checks);
  for (const auto& c : v["cases"].a) check_case(c, checks);
  return checks.report("ascend split");
}
