// The C++ layout twin reproduces tests/vectors/layout.json (made by ubep.layout).
#include <string>
#include <vector>

#include "check.h"
#include "json.h"
#include "ubep/layout.h"

int main(int argc, char** argv) {
  const json::Value root = json::load(argc > 1 ? argv[1] : "tests/vectors/layout.json");
  Checks checks;
  for (const auto& c : root["cases"].a) {
    const std::string name = c["name"].s;
    const int64_t experts = c["num_experts"].i, world = c["world_size"].i;
    const std::vector<int64_t> matrix = c["count_matrix"].flat_ints();
    for (int padded = 0; padded < 2; ++padded) {
      std::vector<int64_t> base(world * experts);
      ubep::row_base(matrix.data(), world, experts, experts / world,
                     padded ? c["expert_capacity"].i : 0, base.data());
      checks.equal(base, c[padded ? "row_base_padded" : "row_base_compact"].flat_ints(),
                   name + (padded ? " row_base padded" : " row_base compact"));
    }
    for (int64_t s = 0; s < world; ++s) {
      const auto& src = c["sources"][s];
      const std::vector<int64_t> idx = src["topk_idx"].flat_ints();
      const int64_t pairs = idx.size();
      std::vector<int64_t> counts(experts), seen(experts), order(pairs), rows(pairs), base(world * experts);
      ubep::expert_counts(idx.data(), pairs, experts, counts.data());
      checks.equal(counts, std::vector<int64_t>(matrix.begin() + s * experts,
                                                matrix.begin() + (s + 1) * experts),
                   name + " expert_counts of source " + std::to_string(s));
      ubep::local_order(idx.data(), pairs, experts, seen.data(), order.data());
      checks.equal(order, src["local_order"].flat_ints(), name + " local_order");
      for (int padded = 0; padded < 2; ++padded) {
        ubep::row_base(matrix.data(), world, experts, experts / world,
                       padded ? c["expert_capacity"].i : 0, base.data());
        ubep::pair_rows(idx.data(), pairs, experts, base.data() + s * experts, seen.data(), rows.data());
        checks.equal(rows, src[padded ? "pair_rows_padded" : "pair_rows_compact"].flat_ints(),
                     name + " pair_rows source " + std::to_string(s));
      }
    }
  }
  return checks.report("layout twin");
}
