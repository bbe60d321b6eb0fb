// The torch ops' bodies, shared by every device: check arguments, compute the call's tiling
// (DispatchTiling / CombineTiling / PrepareTiling / ProbeTiling, which the CANN ops' tiling functions
// compute too), allocate the outputs (op_shapes.h) and the zeroed scratch, launch (Launch::Dispatch /
// Combine / Prepare / Probe: the CPU twin or the NPU's MC2 op), and return a copy of the kernel's
// status words with the outputs.
//
// Nothing here waits for the device: every output has a size the host knows (the compact dispatch
// its worst case, which the backend narrows), and a kernel's timeout is reported through the status
// words, which the backend reads when they are known to be final (ubep/backends/ascend_status.py).
//
// Windows belong to the HCCL group `group`: on an NPU, HCCL's windows (pass windows=[]); on the CPU
// twin, `windows[r]` is die r's shared mapping, from which the twin builds the group's context.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <optional>
#include <sstream>
#include <string>
#include <tuple>

#include "hccl_buffer.h"
#include "op_shapes.h"
#include "tiling.h"

namespace ubep_ascend {

inline RowDtype RowDtypeOf(at::ScalarType t) {
  TORCH_CHECK(t == at::kBFloat16 || t == at::kHalf || t == at::kFloat,
              "ubep_ascend: rows must be bf16, fp16 or fp32, got ", t);
  return t == at::kFloat ? ROW_FP32 : (t == at::kHalf ? ROW_FP16 : ROW_BF16);
}

// One dispatch call: the kernel's tensors in its parameter order (inputs, then outputs, `scratch`
// last) and the op's attributes.
struct DispatchArgs {
  at::Tensor x, topk_idx, topk_weights;
  at::Tensor recv_x, recv_weights, tokens_per_expert, recv_rows, recv_pair_weights, recv_pair_base, recv_counts;
  at::Tensor scratch;
  std::string group;
  CallAttrs call;
  bool padded;
};

// One combine call, as DispatchArgs.
struct CombineArgs {
  at::Tensor rows, topk_idx, topk_weights, recv_rows, recv_pair_weights, recv_pair_base, recv_counts;
  at::Tensor y, scratch;
  std::string group;
  CallAttrs call;
  int64_t hidden;
  RowDtype dtype;  // the layer's
  std::string reduce;
  bool weighted;
};

// The kernels' status words at the start of `scratch` (op_kernel/ep_common.h, Ctx::status): error,
// phase, peer and one unused word. An op returns a copy instead of reading them, which would make
// the host wait for the kernel after every call; a copy, so that the scratch is freed with the call.
constexpr int64_t STATUS_WORDS = 4;

inline at::Tensor StatusOf(const at::Tensor& scratch) {
  return scratch.narrow(0, 0, STATUS_WORDS * 8).view(at::kLong).clone();
}

// "" for the status words of a call that completed, else what timed out. status: on the host.
inline std::string StatusMessage(const at::Tensor& status, int64_t rank, double timeout_s) {
  TORCH_CHECK(status.device().is_cpu() && status.scalar_type() == at::kLong && status.numel() == STATUS_WORDS,
              "ubep_ascend.status_message: status must be the [", STATUS_WORDS, "] int64 words an op returned, "
              "copied to the host");
  const at::Tensor words = status.contiguous();
  const int64_t* s = words.data_ptr<int64_t>();
  if (s[0] == 0) return "";
  std::ostringstream out;
  out << "ubep rank " << rank << ": phase '" << PhaseName(s[1], s[2]) << "' did not complete within " << timeout_s
      << " s; a peer may have failed, skipped this call or rejected its input";
  return out.str();
}

// recv_x, recv_weights, tokens_per_expert, recv_rows, recv_pair_weights, recv_pair_base, recv_counts,
// status.
using DispatchOut = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor,
                               at::Tensor>;

template <class Launch>
DispatchOut Dispatch(
    const at::Tensor& x, const at::Tensor& topk_idx, const at::Tensor& topk_weights, at::TensorList windows,
    const std::string& group, int64_t world, int64_t rank, int64_t num_experts, int64_t max_tokens, bool padded,
    const std::string& sync, int64_t call_code, int64_t n_workers, double timeout_s) {
  TORCH_CHECK(x.dim() == 2 && topk_idx.dim() == 2 && topk_idx.size(0) == x.size(0) &&
                  topk_weights.sizes() == topk_idx.sizes() && topk_weights.scalar_type() == at::kFloat,
              "ubep_ascend.dispatch: x [T, H], topk_idx [T, K], topk_weights [T, K] fp32 expected");
  DispatchArgs a;
  a.group = group;
  a.call = CallAttrs{world, rank, num_experts, max_tokens, sync, call_code, n_workers, timeout_s};
  a.padded = padded;
  const int64_t K = topk_idx.size(1), H = x.size(1);
  const EpTiling t = DispatchTiling(a.call, padded, H, K, RowDtypeOf(x.scalar_type()), x.size(0));
  const auto i32 = x.options().dtype(at::kInt), f32 = x.options().dtype(at::kFloat);
  const std::vector<Dims> shape = DispatchShapes(t, padded);
  a.x = x.contiguous();
  a.topk_idx = topk_idx.to(at::kLong).contiguous();
  a.topk_weights = topk_weights.contiguous();
  a.recv_x = at::zeros(shape[0], x.options());
  a.recv_weights = at::zeros(shape[1], f32);
  a.tokens_per_expert = at::zeros(shape[2], x.options().dtype(at::kLong));
  a.recv_rows = at::full(shape[3], -1, i32);
  a.recv_pair_weights = at::zeros(shape[4], f32);
  a.recv_pair_base = at::zeros(shape[5], i32);
  a.recv_counts = at::zeros(shape[6], i32);
  a.scratch = at::zeros(shape[7], x.options().dtype(at::kByte));
  Launch::Dispatch(a, windows, t);
  return {a.recv_x,         a.recv_weights, a.tokens_per_expert, a.recv_rows, a.recv_pair_weights,
          a.recv_pair_base, a.recv_counts,  StatusOf(a.scratch)};
}

// reduce: "source", "expert_rank" or "pairs" (rows [R] fp32 back to their (t, k) slots: [T, K]).
// Returns (y, status).
template <class Launch>
std::tuple<at::Tensor, at::Tensor> Combine(
    const at::Tensor& rows, const at::Tensor& topk_idx, const at::Tensor& topk_weights, const at::Tensor& recv_rows,
    const at::Tensor& recv_pair_weights, const at::Tensor& recv_pair_base, const at::Tensor& recv_counts,
    at::TensorList windows, const std::string& group, int64_t world, int64_t rank, int64_t num_experts, int64_t hidden,
    at::ScalarType dtype, const std::string& reduce, bool weighted, const std::string& sync, int64_t call_code,
    int64_t n_workers, double timeout_s) {
  TORCH_CHECK(recv_rows.dim() == 3, "ubep_ascend.combine: recv_rows must be [W, T_max, K]");
  const Reduce how = ReduceOf(reduce);
  const bool pairs = how == REDUCE_PAIRS;
  // The layer's dtype fixes the window geometry; PAIRS rows are fp32 whatever it is.
  TORCH_CHECK(pairs || rows.scalar_type() == dtype, "ubep_ascend.combine: rows must be ", dtype);
  TORCH_CHECK(!pairs || rows.scalar_type() == at::kFloat, "ubep_ascend.combine: pairs rows must be fp32");
  TORCH_CHECK(pairs || rows.size(-1) == hidden, "ubep_ascend.combine: rows must have ", hidden, " columns");
  CombineArgs a;
  a.group = group;
  a.call = CallAttrs{world, rank, num_experts, recv_rows.size(1), sync, call_code, n_workers, timeout_s};
  a.hidden = hidden;
  a.dtype = RowDtypeOf(dtype);
  a.reduce = reduce;
  a.weighted = weighted;
  const int64_t K = topk_idx.size(1), T = topk_idx.size(0);
  const EpTiling t = CombineTiling(a.call, hidden, K, a.dtype, T, how, weighted);
  a.rows = rows.contiguous();
  a.topk_idx = topk_idx.to(at::kLong).contiguous();
  a.topk_weights = topk_weights.contiguous();
  a.recv_rows = recv_rows.contiguous();
  a.recv_pair_weights = recv_pair_weights.contiguous();
  a.recv_pair_base = recv_pair_base.contiguous();
  a.recv_counts = recv_counts.contiguous();
  const std::vector<Dims> shape = CombineShapes(t);
  a.y = at::zeros(shape[0], rows.options());
  a.scratch = at::zeros(shape[1], rows.options().dtype(at::kByte));
  Launch::Combine(a, windows, t);
  return {a.y, StatusOf(a.scratch)};
}

// A window preparation (prepare_kernel.cpp): the kernel's tensors (the token, then `scratch`) and
// the op's attributes.
struct PrepareArgs {
  at::Tensor token, scratch;
  std::string group;
  PrepareAttrs attrs;
};

// token: [2] int64 on the op's device, the group's nonce and this preparation's number on the group
// (>= 1; the host counts preparations, which are never captured). Returns the status words.
template <class Launch>
at::Tensor Prepare(const at::Tensor& token, at::TensorList windows, const std::string& group, int64_t world,
                   int64_t rank, int64_t hidden, int64_t num_experts, int64_t top_k, int64_t max_tokens,
                   at::ScalarType dtype, const std::string& sync, int64_t n_workers, double timeout_s) {
  TORCH_CHECK(token.scalar_type() == at::kLong && token.dim() == 1 && token.size(0) == 2,
              "ubep_ascend.prepare: token must be [2] int64 (nonce, preparation number)");
  PrepareArgs a;
  a.group = group;
  a.attrs = PrepareAttrs{world, rank, hidden, num_experts, top_k, max_tokens, RowDtypeOf(dtype), sync, n_workers,
                         timeout_s};
  const EpTiling t = PrepareTiling(a.attrs);
  a.token = token.contiguous();
  a.scratch = at::zeros(PrepareShapes(t)[0], token.options().dtype(at::kByte));
  Launch::Prepare(a, windows, t);
  return StatusOf(a.scratch);
}

// The tear-free write probe (probe_kernel.cpp): a preparation for the probe's layer (`attrs`, with its
// token as in Prepare), then `rounds` writes of rows of `blocks` 512-byte blocks. Returns (counts
// [n_workers, 4] int64, status): per reading AIV reads, older words, newer words, 0.
struct ProbeArgs {
  at::Tensor token, counts, scratch;
  std::string group;
  PrepareAttrs attrs;
  int64_t rounds, blocks;
};

template <class Launch>
std::tuple<at::Tensor, at::Tensor> Probe(const at::Tensor& token, at::TensorList windows, const std::string& group,
                                         int64_t world, int64_t rank, int64_t hidden, int64_t num_experts,
                                         int64_t top_k, int64_t max_tokens, at::ScalarType dtype, int64_t n_workers,
                                         double timeout_s, int64_t rounds, int64_t blocks) {
  TORCH_CHECK(token.scalar_type() == at::kLong && token.dim() == 1 && token.size(0) == 2,
              "ubep_ascend.probe: token must be [2] int64 (nonce, preparation number)");
  ProbeArgs a;
  a.group = group;
  a.attrs = PrepareAttrs{world, rank, hidden, num_experts, top_k, max_tokens, RowDtypeOf(dtype), "sw", n_workers,
                         timeout_s};
  a.rounds = rounds;
  a.blocks = blocks;
  const EpTiling t = ProbeTiling(a.attrs, rounds, blocks);
  const std::vector<Dims> shape = ProbeShapes(t, n_workers);
  a.token = token.contiguous();
  a.counts = at::zeros(shape[0], token.options());
  a.scratch = at::zeros(shape[1], token.options().dtype(at::kByte));
  Launch::Probe(a, windows, t);
  return {a.counts, StatusOf(a.scratch)};
}

inline std::tuple<int64_t, int64_t> WorkerSplit(int64_t world, int64_t hidden, int64_t num_experts, int64_t top_k,
                                                int64_t max_tokens, at::ScalarType dtype, int64_t n_workers) {
  const Split s = LayerSplit(world, hidden, num_experts, top_k, max_tokens, ElemBytes(RowDtypeOf(dtype)), n_workers);
  return {s.n_count, s.n_token};
}

// Bytes of one die's window for the layer (what HCCL's windowsIn must hold).
inline int64_t WindowBytes(int64_t world, int64_t hidden, int64_t num_experts, int64_t top_k, int64_t max_tokens,
                           at::ScalarType dtype, const std::string& sync) {
  return MakeTiling(world, 0, hidden, num_experts, top_k, max_tokens, RowDtypeOf(dtype), sync).window_bytes;
}

// "" if HCCL's window (HCCL_BUFFSIZE MB; hccl_buffsize: the variable's value, absent when unset)
// holds the layer's window, else what to set.
inline std::string HcclWindowProblem(int64_t world, int64_t hidden, int64_t num_experts, int64_t top_k,
                                     int64_t max_tokens, at::ScalarType dtype, const std::string& sync,
                                     const std::optional<std::string>& hccl_buffsize) {
  const EpTiling t = MakeTiling(world, 0, hidden, num_experts, top_k, max_tokens, RowDtypeOf(dtype), sync);
  return HcclBufferProblem(t.window_bytes, hccl_buffsize ? hccl_buffsize->c_str() : nullptr);
}

}  // namespace ubep_ascend
