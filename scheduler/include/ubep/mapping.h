// Hierarchical token-level scheduler: the twin of ubep/scheduler (search.py, mapping.py).
//
// A source has counts_D[d] tokens for destination d and n workers. Each variant cuts the token
// sequence into per-worker pieces (destination, first token, length), exactly as the Python code
// does; tests/vectors/scheduler.json holds the cases both must reproduce. hop_balanced is UBEP's
// mapper, the only variant that meets the per-hop bound v[j][h] <= ceil(V[h] / n); a kernel's
// worker finds its own slices with hop_balanced_slice. hop_aware (the paper's transposition read
// literally) stays as a baseline. Running example: counts = [3, 1, 2, 0, 1, 0],
// hops = [0, 0, 1, 1, 2, 2], n = 2: hop_balanced gives worker 0 pieces (0, 0, 2), (2, 0, 1),
// (4, 0, 1) and worker 1 (0, 2, 1), (1, 0, 1), (2, 1, 1).
#pragma once

#include "ubep/qualifiers.h"

namespace ubep {

struct Located {
  int64_t position;  // #{i : cumsum[i] <= t}: the destination holding token t (D for t = M)
  int64_t offset;    // t minus the first token of that destination
  int64_t steps;     // narrowing steps the search took
};

UBEP_FN int64_t ends_at_or_before(const int64_t* cumsum_D, int64_t num_dests, int64_t pivot,
                                  int64_t target) {
  const int64_t i = pivot < num_dests - 1 ? pivot : (num_dests > 0 ? num_dests - 1 : 0);
  return cumsum_D[i] <= target ? 1 : 0;
}

UBEP_FN Located located(const int64_t* cumsum_D, int64_t position, int64_t target, int64_t steps) {
  return Located{position, target - (position > 0 ? cumsum_D[position - 1] : 0), steps};
}

// Three pivots per step: w = hi - lo, p_k = lo + k * w / 4; c = pivots ending at or before t picks
// the quarter [lo, p1], [p1 + 1, p2], [p2 + 1, p3] or [p3 + 1, hi].
UBEP_FN Located quaternary_search(const int64_t* cumsum_D, int64_t num_dests, int64_t target) {
  int64_t lo = 0, hi = num_dests, steps = 0;
  while (lo < hi) {
    const int64_t w = hi - lo;
    const int64_t p1 = lo + w / 4, p2 = lo + w / 2, p3 = lo + 3 * w / 4;
    const int64_t c = ends_at_or_before(cumsum_D, num_dests, p1, target) +
                      ends_at_or_before(cumsum_D, num_dests, p2, target) +
                      ends_at_or_before(cumsum_D, num_dests, p3, target);
    if (c == 0) { hi = p1; }
    else if (c == 1) { lo = p1 + 1; hi = p2; }
    else if (c == 2) { lo = p2 + 1; hi = p3; }
    else { lo = p3 + 1; }
    ++steps;
  }
  return located(cumsum_D, lo, target, steps);
}

UBEP_FN Located binary_search(const int64_t* cumsum_D, int64_t num_dests, int64_t target) {
  int64_t lo = 0, hi = num_dests, steps = 0;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (ends_at_or_before(cumsum_D, num_dests, mid, target)) lo = mid + 1; else hi = mid;
    ++steps;
  }
  return located(cumsum_D, lo, target, steps);
}

// order_D: destinations laid row-major in rows of n columns, read column-major.
// D = 10, n = 4 -> [0, 4, 8, 1, 5, 9, 2, 6, 3, 7].
UBEP_FN void transpose_order(int64_t num_dests, int64_t num_workers, int64_t* order_D) {
  int64_t i = 0;
  for (int64_t column = 0; column < num_workers; ++column) {
    for (int64_t d = column; d < num_dests; d += num_workers) order_D[i++] = d;
  }
}

// bounds_N1[j] = j * (total / n) + min(j, total % n), j = 0..n.
UBEP_FN void slice_bounds(int64_t total, int64_t num_workers, int64_t* bounds_N1) {
  const int64_t q = total / num_workers, r = total % num_workers;
  for (int64_t j = 0; j <= num_workers; ++j) bounds_N1[j] = j * q + (j < r ? j : r);
}

// bound_C[h] = ceil(V[h] / n), V[h] the tokens of hop class h.
UBEP_FN void per_hop_bound(const int64_t* counts_D, const int64_t* hop_D, int64_t num_dests,
                           int64_t num_classes, int64_t num_workers, int64_t* bound_C) {
  for (int64_t h = 0; h < num_classes; ++h) bound_C[h] = 0;
  for (int64_t d = 0; d < num_dests; ++d) bound_C[hop_D[d]] += counts_D[d];
  for (int64_t h = 0; h < num_classes; ++h) bound_C[h] = (bound_C[h] + num_workers - 1) / num_workers;
}

// Pieces, CSR by worker; the caller sizes dest/start/length (D + slices entries always suffice).
struct Pieces {
  int64_t* worker_ptr;  // [n + 1]
  int64_t* dest;
  int64_t* start;
  int64_t* length;
};

// Cut the token sequence laid out in order_D into slices [lo_S[i], hi_S[i]), slices_per_worker
// consecutive slices per worker. cumsum_P is caller scratch of D entries.
UBEP_FN void cut(const int64_t* order_D, const int64_t* counts_D, int64_t num_dests,
                 const int64_t* lo_S, const int64_t* hi_S, int64_t num_slices,
                 int64_t slices_per_worker, int64_t* cumsum_P, Pieces out) {
  int64_t total = 0;
  for (int64_t p = 0; p < num_dests; ++p) cumsum_P[p] = total += counts_D[order_D[p]];
  int64_t n_pieces = 0;
  out.worker_ptr[0] = 0;
  for (int64_t s = 0; s < num_slices; ++s) {
    const Located a = quaternary_search(cumsum_P, num_dests, lo_S[s]);
    const Located b = quaternary_search(cumsum_P, num_dests, hi_S[s]);
    const int64_t last = b.position - (b.offset == 0 ? 1 : 0);
    for (int64_t pos = a.position; pos <= last; ++pos) {
      const int64_t first = pos == a.position ? a.offset : 0;
      const int64_t end = pos == b.position ? b.offset : counts_D[order_D[pos]];
      if (end > first) {
        out.dest[n_pieces] = order_D[pos];
        out.start[n_pieces] = first;
        out.length[n_pieces] = end - first;
        ++n_pieces;
      }
    }
    if ((s + 1) % slices_per_worker == 0) out.worker_ptr[(s + 1) / slices_per_worker] = n_pieces;
  }
}

// Scratch each variant needs: order_D [D], cumsum [D], and lo/hi of the slices.
struct Scratch {
  int64_t* order_D;
  int64_t* cumsum_D;
  int64_t* lo;  // [n * C] for hop_balanced, else [n]
  int64_t* hi;
};

UBEP_FN void natural_order(int64_t num_dests, int64_t* order_D) {
  for (int64_t d = 0; d < num_dests; ++d) order_D[d] = d;
}

// Worker j takes whole destinations [j k, (j + 1) k), k = ceil(D / n).
UBEP_FN void expert_contiguous(const int64_t* counts_D, int64_t num_dests, int64_t num_workers,
                               Scratch s, Pieces out) {
  natural_order(num_dests, s.order_D);
  const int64_t k = (num_dests + num_workers - 1) / num_workers;
  for (int64_t j = 0; j < num_workers; ++j) {
    int64_t lo = 0, hi = 0;
    for (int64_t d = 0; d < num_dests; ++d) {
      if (d < j * k) lo += counts_D[d];
      if (d < (j + 1) * k) hi += counts_D[d];
    }
    s.lo[j] = lo;
    s.hi[j] = hi;
  }
  cut(s.order_D, counts_D, num_dests, s.lo, s.hi, num_workers, 1, s.cumsum_D, out);
}

UBEP_FN void equal_slices(const int64_t* counts_D, int64_t num_dests, int64_t num_workers,
                          Scratch s, Pieces out) {
  int64_t total = 0;
  for (int64_t d = 0; d < num_dests; ++d) total += counts_D[d];
  for (int64_t j = 0; j < num_workers; ++j) {
    s.lo[j] = j * (total / num_workers) + (j < total % num_workers ? j : total % num_workers);
    const int64_t j1 = j + 1;
    s.hi[j] = j1 * (total / num_workers) + (j1 < total % num_workers ? j1 : total % num_workers);
  }
  cut(s.order_D, counts_D, num_dests, s.lo, s.hi, num_workers, 1, s.cumsum_D, out);
}

// Equal slices in the natural order (topology-agnostic).
UBEP_FN void load_balanced(const int64_t* counts_D, int64_t num_dests, int64_t num_workers,
                           Scratch s, Pieces out) {
  natural_order(num_dests, s.order_D);
  equal_slices(counts_D, num_dests, num_workers, s, out);
}

// The paper's transposition read literally: transpose order, then equal slices. It never
// reads the hop classes, so the per-hop bound can fail (mapping.py has a counterexample).
UBEP_FN void hop_aware(const int64_t* counts_D, int64_t num_dests, int64_t num_workers, Scratch s,
                       Pieces out) {
  transpose_order(num_dests, num_workers, s.order_D);
  equal_slices(counts_D, num_dests, num_workers, s, out);
}

// Worker j's slice of hop class h under hop_balanced: tokens [lo, hi) of the sequence laid out
// class by class (the class-sorted destination order). Closed form in the class totals, so each
// worker finds its slices alone. Class h gets V[h] / n tokens per worker, and its r = V[h] % n
// spares go to workers o, o + 1, ..., o + r - 1 (mod n), o being the spares dealt before it
// (mod n), in the order 0, C-1, ..., 1: the farthest class is dealt second, so that when the
// spares wrap round, the workers holding two get those of the nearest classes.
// V = [2, 3, 1], n = 4: class 0 -> workers 0, 1; class 2 -> worker 2; class 1 -> workers 3, 0, 1.
UBEP_FN void hop_balanced_slice(const int64_t* totals_C, int64_t num_classes, int64_t num_workers,
                                int64_t worker, int64_t h, int64_t* lo, int64_t* hi) {
  const int64_t n = num_workers;
  int64_t base = 0, dealt = 0;
  for (int64_t g = 0; g < num_classes; ++g) {
    if (g < h) base += totals_C[g];
    if (h != 0 && (g == 0 || g > h)) dealt += totals_C[g] % n;  // classes dealt before h
  }
  const int64_t o = dealt % n, r = totals_C[h] % n, q = totals_C[h] / n;
  // Spares of the workers before this one: the cyclic run [o, o + r) met with [0, worker); a run
  // that passes worker n - 1 goes on at [0, wrap).
  const int64_t wrap = o + r > n ? o + r - n : 0, after_o = worker - o;
  const int64_t before = (after_o < 0 ? 0 : (after_o < r - wrap ? after_o : r - wrap)) +
                         (worker < wrap ? worker : wrap);
  const int64_t mine = (after_o % n + n) % n < r ? 1 : 0;
  *lo = base + worker * q + before;
  *hi = *lo + q + mine;
}

// UBEP's mapper: each hop class cut into n slices (hop_balanced_slice), the destinations taken
// class by class, natural order inside a class. classes_C is caller scratch of num_classes entries.
UBEP_FN void hop_balanced(const int64_t* counts_D, const int64_t* hop_D, int64_t num_dests,
                          int64_t num_classes, int64_t num_workers, Scratch s, int64_t* classes_C,
                          Pieces out) {
  int64_t* totals = classes_C;
  int64_t i = 0;
  for (int64_t h = 0; h < num_classes; ++h) {
    totals[h] = 0;
    for (int64_t d = 0; d < num_dests; ++d) {
      if (hop_D[d] == h) {
        s.order_D[i++] = d;
        totals[h] += counts_D[d];
      }
    }
  }
  for (int64_t j = 0; j < num_workers; ++j) {
    for (int64_t h = 0; h < num_classes; ++h) {
      hop_balanced_slice(totals, num_classes, num_workers, j, h, &s.lo[j * num_classes + h],
                         &s.hi[j * num_classes + h]);
    }
  }
  cut(s.order_D, counts_D, num_dests, s.lo, s.hi, num_workers * num_classes, num_classes,
      s.cumsum_D, out);
}

}  // namespace ubep
