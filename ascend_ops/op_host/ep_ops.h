// The torch ops' bodies, shared by every device: check arguments, fill the tiling, allocate
// outputs and workspace, launch (Launch::Dispatch / Launch::Combine: the CPU twin or the NPU), and
// turn a kernel's timeout into an error naming the rank and phase.
//
// Windows: `windows[r]` is die r's window, a uint8 tensor of window_bytes (on the CPU twin a shared
// mapping; on an NPU the peer-mapped window), passed to the kernel as a table of GM addresses.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "tiling.h"
#ifdef UBEP_CPU_TWIN
#include "kernel_operator.h"  // the twin's lock table size
#endif

namespace ubep_ascend {

constexpr double CYCLES_PER_SECOND = 50e6;  // GetSystemCycle rate

inline int64_t ElemBytes(at::ScalarType t) {
  TORCH_CHECK(t == at::kBFloat16 || t == at::kHalf || t == at::kFloat,
              "ubep_ascend: rows must be bf16, fp16 or fp32, got ", t);
  return t == at::kFloat ? 4 : 2;
}

inline int64_t DtypeCode(at::ScalarType t) { return t == at::kFloat ? 0 : (t == at::kHalf ? 1 : 2); }

inline int64_t MaxRecvRows(int64_t world, int64_t num_experts, int64_t top_k, int64_t max_tokens, bool padded) {
  const int64_t local = num_experts / world;
  return padded ? local * world * max_tokens : world * max_tokens * (top_k < local ? top_k : local);
}

// Tiling as a byte tensor on `device`, and the window address table.
inline at::Tensor TilingTensor(const EpTiling& t, const at::Device& device) {
  at::Tensor cpu = at::empty({static_cast<int64_t>(sizeof(EpTiling))}, at::kByte);
  std::memcpy(cpu.data_ptr(), &t, sizeof(EpTiling));
  return cpu.to(device);
}

inline at::Tensor WindowTable(const std::vector<at::Tensor>& windows, const EpTiling& t, const at::Device& device) {
  TORCH_CHECK(static_cast<int64_t>(windows.size()) == t.world, "ubep_ascend: windows must have ", t.world,
              " tensors (one per rank), got ", windows.size());
  at::Tensor table = at::empty({t.world}, at::kLong);
  for (int64_t r = 0; r < t.world; ++r) {
    const at::Tensor& w = windows[r];
    TORCH_CHECK(w.scalar_type() == at::kByte && w.is_contiguous() && w.numel() >= t.window_bytes,
                "ubep_ascend: windows[", r, "] must be a contiguous uint8 tensor of at least ", t.window_bytes,
                " bytes");
    table[r] = reinterpret_cast<int64_t>(w.data_ptr());
  }
  return table.to(device);
}

inline void CheckStatus(const at::Tensor& workspace, const EpTiling& t, double timeout_s) {
  at::Tensor status = workspace.narrow(0, 0, 24).cpu();
  const auto* s = reinterpret_cast<const int64_t*>(status.data_ptr());
  TORCH_CHECK(s[0] == 0, "ubep rank ", t.rank, ": phase '", PhaseName(s[1], s[2]), "' did not complete within ",
              timeout_s, " s; a peer may have failed, skipped this call or rejected its input");
}

inline void FillCall(EpTiling& t, int64_t epoch, double timeout_s) {
  TORCH_CHECK(epoch > 0, "ubep_ascend: epoch must be >= 1, got ", epoch);
  TORCH_CHECK(timeout_s > 0, "ubep_ascend: timeout_s must be > 0, got ", timeout_s);
  t.epoch = epoch;
  t.timeout_cycles = static_cast<int64_t>(timeout_s * CYCLES_PER_SECOND);
}

template <class Launch>
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> Dispatch(
    const at::Tensor& x, const at::Tensor& topk_idx, const at::Tensor& topk_weights, at::TensorList windows,
    int64_t rank, int64_t num_experts, int64_t max_tokens, bool padded, const std::string& sync, int64_t epoch,
    int64_t n_workers, double timeout_s) {
  TORCH_CHECK(x.dim() == 2 && topk_idx.dim() == 2 && topk_idx.size(0) == x.size(0) &&
                  topk_weights.sizes() == topk_idx.sizes() && topk_weights.scalar_type() == at::kFloat,
              "ubep_ascend.dispatch: x [T, H], topk_idx [T, K], topk_weights [T, K] fp32 expected");
  TORCH_CHECK(x.size(0) <= max_tokens, "ubep_ascend.dispatch: more tokens than max_tokens");
  TORCH_CHECK(n_workers >= 2, "ubep_ascend.dispatch: n_workers must be >= 2 (a count and a token group)");
  const int64_t world = static_cast<int64_t>(windows.size()), K = topk_idx.size(1), H = x.size(1);
  EpTiling t = MakeTiling(world, rank, H, num_experts, K, max_tokens, ElemBytes(x.scalar_type()),
                          x.scalar_type() == at::kBFloat16, sync);
  FillCall(t, epoch, timeout_s);
  t.num_tokens = x.size(0);
  t.capacity = padded ? world * max_tokens : 0;
  const Split split = LayerSplit(world, H, num_experts, K, max_tokens, t.elem_bytes, n_workers);
  t.n_count = split.n_count;
  t.n_token = split.n_token;
  const auto dev = x.device();
  const auto i32 = x.options().dtype(at::kInt), f32 = x.options().dtype(at::kFloat);
  const int64_t rows = MaxRecvRows(world, num_experts, K, max_tokens, padded);
  at::Tensor recv_x = at::zeros({rows, H}, x.options());
  at::Tensor recv_w = at::zeros({rows}, f32);
  at::Tensor tpe = at::zeros({t.local_experts}, x.options().dtype(at::kLong));
  at::Tensor recv_rows = at::full({world, max_tokens, K}, -1, i32);
  at::Tensor pair_w = at::zeros({world, max_tokens, K}, f32);
  at::Tensor pair_base = at::zeros({world, max_tokens}, i32);
  at::Tensor counts = at::zeros({world, 2}, i32);
  at::Tensor ws = at::zeros({t.ws_bytes}, x.options().dtype(at::kByte));
  at::Tensor idx = topk_idx.to(at::kLong).contiguous(), w = topk_weights.contiguous(), xc = x.contiguous();
  at::Tensor table = WindowTable(windows.vec(), t, dev), tiling = TilingTensor(t, dev);
  Launch::Dispatch(n_workers, xc, idx, w, table, recv_x, recv_w, tpe, recv_rows, pair_w, pair_base,
                   counts, ws, tiling);
  CheckStatus(ws, t, timeout_s);
  return {recv_x, recv_w, tpe, recv_rows, pair_w, pair_base, counts};
}

// reduce: "source", "expert_rank" or "pairs" (rows [R] fp32 back to their (t, k) slots: [T, K]).
template <class Launch>
at::Tensor Combine(const at::Tensor& rows, const at::Tensor& topk_idx, const at::Tensor& topk_weights,
                   const at::Tensor& recv_rows, const at::Tensor& recv_pair_weights, const at::Tensor& recv_pair_base,
                   const at::Tensor& recv_counts, at::TensorList windows, int64_t rank, int64_t num_experts,
                   int64_t hidden, at::ScalarType dtype, const std::string& reduce, bool weighted,
                   const std::string& sync, int64_t epoch, int64_t n_workers, double timeout_s) {
  const bool pairs = reduce == "pairs";
  TORCH_CHECK(pairs || reduce == "source" || reduce == "expert_rank",
              "ubep_ascend.combine: reduce must be source, expert_rank or pairs, got '", reduce, "'");
  TORCH_CHECK(n_workers >= 1, "ubep_ascend.combine: n_workers must be >= 1");
  TORCH_CHECK(recv_rows.dim() == 3, "ubep_ascend.combine: recv_rows must be [W, T_max, K]");
  const int64_t world = static_cast<int64_t>(windows.size()), K = topk_idx.size(1);
  const int64_t max_tokens = recv_rows.size(1), T = topk_idx.size(0);
  // The layer's dtype fixes the window geometry; PAIRS rows are fp32 whatever it is.
  TORCH_CHECK(pairs || rows.scalar_type() == dtype, "ubep_ascend.combine: rows must be ", dtype);
  EpTiling t = MakeTiling(world, rank, hidden, num_experts, K, max_tokens, ElemBytes(dtype),
                          dtype == at::kBFloat16, sync);
  FillCall(t, epoch, timeout_s);
  t.num_tokens = T;
  t.reduce = pairs ? REDUCE_PAIRS : (reduce == "source" ? REDUCE_SOURCE : REDUCE_EXPERT_RANK);
  t.weighted = weighted ? 1 : 0;
  TORCH_CHECK(!pairs || rows.scalar_type() == at::kFloat, "ubep_ascend.combine: pairs rows must be fp32");
  TORCH_CHECK(pairs || rows.size(-1) == hidden, "ubep_ascend.combine: rows must have ", hidden, " columns");
  const auto dev = rows.device();
  at::Tensor y = pairs ? at::zeros({T, K}, rows.options()) : at::zeros({T, hidden}, rows.options());
  at::Tensor ws = at::zeros({t.ws_bytes}, rows.options().dtype(at::kByte));
  at::Tensor rc = rows.contiguous(), idx = topk_idx.to(at::kLong).contiguous(), w = topk_weights.contiguous();
  at::Tensor table = WindowTable(windows.vec(), t, dev), tiling = TilingTensor(t, dev);
  Launch::Combine(n_workers, rc, idx, w, recv_rows.contiguous(), recv_pair_weights.contiguous(),
                  recv_pair_base.contiguous(), recv_counts.contiguous(), table, y, ws, tiling,
                  DtypeCode(rows.scalar_type()));
  CheckStatus(ws, t, timeout_s);
  return y;
}

// sp: the sentinel into the marker bytes of every row of every batch of both slots; other modes:
// zeros (no epoch matches zeroed flags and records).
inline void PrepareWindow(const at::Tensor& window, int64_t world, int64_t rank, int64_t hidden, int64_t num_experts,
                          int64_t top_k, int64_t max_tokens, at::ScalarType dtype, const std::string& sync) {
  const EpTiling t = MakeTiling(world, rank, hidden, num_experts, top_k, max_tokens, ElemBytes(dtype),
                                dtype == at::kBFloat16, sync);
  TORCH_CHECK(window.scalar_type() == at::kByte && window.numel() >= t.window_bytes,
              "ubep_ascend.prepare_window: window must be uint8 of at least ", t.window_bytes, " bytes");
  at::Tensor host = at::zeros({t.window_bytes}, at::kByte);
  if (t.mode == static_cast<int64_t>(ubep::Mode::SP)) {
    auto* base = host.data_ptr<uint8_t>();
    const struct { ubep::WireFormat f; int64_t off, rows; } areas[] = {
        {dispatch_format(t), t.disp_off, t.disp_rows}, {combine_format(t), t.comb_off, t.comb_rows},
        {pair_format(t), t.pair_off, t.comb_rows}};
    for (int64_t slot = 0; slot < 2; ++slot) {
      for (const auto& a : areas) {
        const int64_t blocks = t.world * a.rows * a.f.blocks_per_row();
        for (int64_t b = 0; b < blocks; ++b) {
          uint8_t* block = base + slot * t.slot_bytes + a.off + b * a.f.block_bytes;
          for (int64_t m = 0; m < a.f.flag_bytes; ++m) block[m] = ubep::sentinel_byte(a.f, m);
        }
      }
    }
  }
  window.zero_();
  window.narrow(0, 0, t.window_bytes).copy_(host);
}

inline std::tuple<int64_t, int64_t> WorkerSplit(int64_t world, int64_t hidden, int64_t num_experts, int64_t top_k,
                                                int64_t max_tokens, at::ScalarType dtype, int64_t n_workers) {
  const Split s = LayerSplit(world, hidden, num_experts, top_k, max_tokens, ElemBytes(dtype), n_workers);
  return {s.n_count, s.n_token};
}

inline int64_t WindowBytes(int64_t world, int64_t hidden, int64_t num_experts, int64_t top_k, int64_t max_tokens,
                           at::ScalarType dtype, const std::string& sync) {
  const int64_t bytes = MakeTiling(world, 0, hidden, num_experts, top_k, max_tokens, ElemBytes(dtype),
                                   dtype == at::kBFloat16, sync).window_bytes;
#ifdef UBEP_CPU_TWIN
  return bytes + AscendC::twin::lock_table_bytes(bytes);  // the twin's per-transaction locks
#else
  return bytes;
#endif
}

}  // namespace ubep_ascend
