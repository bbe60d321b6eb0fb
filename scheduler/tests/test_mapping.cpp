// The C++ scheduler twin reproduces tests/vectors/scheduler.json (made by ubep.scheduler).
#include <algorithm>
#include <string>
#include <vector>

#include "check.h"
#include "json.h"
#include "ubep/mapping.h"

namespace {

struct Result {
  std::vector<int64_t> worker_ptr, dest, start, length;
};

Result run(const std::string& variant, const std::vector<int64_t>& counts,
           const std::vector<int64_t>& hops, int64_t n) {
  const int64_t d = counts.size();
  const int64_t classes = hops.empty() ? 1 : *std::max_element(hops.begin(), hops.end()) + 1;
  std::vector<int64_t> order(d), cumsum(d), lo(n * classes), hi(n * classes), scratch(classes);
  const size_t cap = d + n * classes + 1;
  Result r{std::vector<int64_t>(n + 1), std::vector<int64_t>(cap), std::vector<int64_t>(cap),
           std::vector<int64_t>(cap)};
  ubep::Scratch s{order.data(), cumsum.data(), lo.data(), hi.data()};
  ubep::Pieces p{r.worker_ptr.data(), r.dest.data(), r.start.data(), r.length.data()};
  if (variant == "expert_contiguous") ubep::expert_contiguous(counts.data(), d, n, s, p);
  else if (variant == "load_balanced") ubep::load_balanced(counts.data(), d, n, s, p);
  else if (variant == "hop_aware") ubep::hop_aware(counts.data(), d, n, s, p);
  else ubep::hop_balanced(counts.data(), hops.data(), d, classes, n, s, scratch.data(), p);
  const int64_t pieces = r.worker_ptr[n];
  for (auto* v : {&r.dest, &r.start, &r.length}) v->resize(pieces);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  const json::Value root = json::load(argc > 1 ? argv[1] : "tests/vectors/scheduler.json");
  Checks checks;
  for (const auto& c : root["cases"].a) {
    const std::string name = c["name"].s;
    const std::vector<int64_t> counts = c["counts"].ints(), hops = c["hops"].ints();
    const int64_t n = c["num_workers"].i, d = counts.size();
    std::vector<int64_t> order(d), bounds(n + 1);
    ubep::transpose_order(d, n, order.data());
    checks.equal(order, c["transpose_order"].ints(), name + " transpose_order");
    int64_t total = 0;
    for (auto v : counts) total += v;
    ubep::slice_bounds(total, n, bounds.data());
    checks.equal(bounds, c["slice_bounds"].ints(), name + " slice_bounds");
    const auto want_bound = c["per_hop_bound"].ints();
    std::vector<int64_t> bound(want_bound.size());
    ubep::per_hop_bound(counts.data(), hops.data(), d, want_bound.size(), n, bound.data());
    checks.equal(bound, want_bound, name + " per_hop_bound");

    const auto& search = c["search"];
    const std::vector<int64_t> cumsum = search["cumsum"].ints();
    std::vector<int64_t> pos, off, qsteps, bsteps;
    for (int64_t t = 0; t <= (cumsum.empty() ? 0 : cumsum.back()); ++t) {
      const ubep::Located q = ubep::quaternary_search(cumsum.data(), d, t);
      const ubep::Located b = ubep::binary_search(cumsum.data(), d, t);
      pos.push_back(q.position);
      off.push_back(q.offset);
      qsteps.push_back(q.steps);
      bsteps.push_back(b.steps);
      checks.equal({b.position, b.offset}, {q.position, q.offset}, name + " binary = quaternary");
    }
    checks.equal(pos, search["position"].ints(), name + " search position");
    checks.equal(off, search["offset"].ints(), name + " search offset");
    checks.equal(qsteps, search["quaternary_steps"].ints(), name + " quaternary steps");
    checks.equal(bsteps, search["binary_steps"].ints(), name + " binary steps");

    for (const auto& [variant, want] : c["variants"].o) {
      const Result r = run(variant, counts, hops, n);
      const std::string what = name + " " + variant;
      checks.equal(r.worker_ptr, want["worker_ptr"].ints(), what + " worker_ptr");
      checks.equal(r.dest, want["dest"].ints(), what + " dest");
      checks.equal(r.start, want["start"].ints(), what + " start");
      checks.equal(r.length, want["length"].ints(), what + " length");
    }
  }
  return checks.report("scheduler twin");
}
