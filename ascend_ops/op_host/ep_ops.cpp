// torch.ops.ubep_ascend: schemas (window tensors marked as mutated), the helpers every device
// shares, and the Meta (fake) implementations torch.compile traces with. prepare, dispatch and
// combine (and probe) return the kernel's status words last (ep_ops.h, StatusOf); status_message turns a host copy
// of them into the timeout's message, "" when the call completed. The device implementations
// register elsewhere: CPU (the twin, cpu_twin/twin_ops.cpp) and PrivateUse1 (the NPU, through the
// MC2 ops of op_host/mc2/, op_host/npu_ops.cpp, built with CANN only).
//
// prepare, dispatch and combine take `windows` and `group`: on an NPU the windows are the HCCL
// group's (`group` is its communicator name, `windows` empty); on the CPU twin `windows` are the
// dies' shared mappings and `group` names the twin's HCCL group built over them.
#include <torch/library.h>

#include "ep_ops.h"

namespace ubep_ascend {
namespace {

// The fake implementations: output shapes from the arguments alone, symbolic where the inputs' are
// (T and H), so that torch.compile and graph capture trace the ops without running them; dispatch
// gives its worst-case rows (the compact layout's real count is data dependent).
DispatchOut DispatchMeta(const at::Tensor& x, const at::Tensor& topk_idx, const at::Tensor&, at::TensorList,
                         std::string_view, int64_t world, int64_t, int64_t num_experts, int64_t max_tokens,
                         bool padded, std::string_view, int64_t, int64_t, double) {
  const int64_t K = topk_idx.sym_size(1).guard_int(__FILE__, __LINE__);
  const int64_t rows = MaxRecvRows(world, num_experts, K, max_tokens, padded);
  const auto i32 = x.options().dtype(at::kInt), f32 = x.options().dtype(at::kFloat);
  const auto i64 = x.options().dtype(at::kLong);
  return {at::empty_symint({rows, x.sym_size(1)}, x.options()),
          at::empty({rows}, f32),
          at::empty({num_experts / world}, i64),
          at::empty({world, max_tokens, K}, i32),
          at::empty({world, max_tokens, K}, f32),
          at::empty({world, max_tokens}, i32),
          at::empty({world, 2}, i32),
          at::empty({STATUS_WORDS}, i64)};
}

std::tuple<at::Tensor, at::Tensor> CombineMeta(const at::Tensor& rows, const at::Tensor& topk_idx, const at::Tensor&,
                                               const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                               const at::Tensor&, at::TensorList, std::string_view, int64_t, int64_t,
                                               int64_t, int64_t hidden, at::ScalarType, std::string_view reduce, bool,
                                               std::string_view, int64_t, int64_t, double) {
  const c10::SymInt T = topk_idx.sym_size(0);
  const at::Tensor y = reduce == "pairs" ? at::empty_symint({T, topk_idx.sym_size(1)}, rows.options())
                                         : at::empty_symint({T, c10::SymInt(hidden)}, rows.options());
  return {y, at::empty({STATUS_WORDS}, rows.options().dtype(at::kLong))};
}

at::Tensor PrepareMeta(const at::Tensor& token, at::TensorList, std::string_view, int64_t, int64_t, int64_t, int64_t,
                       int64_t, int64_t, at::ScalarType, std::string_view, int64_t, double) {
  return at::empty({STATUS_WORDS}, token.options().dtype(at::kLong));
}

std::tuple<at::Tensor, at::Tensor> ProbeMeta(const at::Tensor& token, at::TensorList, std::string_view, int64_t,
                                             int64_t, int64_t, int64_t, int64_t, int64_t, at::ScalarType,
                                             int64_t n_workers, double, int64_t, int64_t) {
  return {at::empty({n_workers, 4}, token.options()), at::empty({STATUS_WORDS}, token.options())};
}

std::tuple<int64_t, int64_t> WorkerSplitOp(int64_t world, int64_t hidden, int64_t num_experts, int64_t top_k,
                                           int64_t max_tokens, at::ScalarType dtype, int64_t n_workers) {
  return WorkerSplit(world, hidden, num_experts, top_k, max_tokens, dtype, n_workers);
}

int64_t WindowBytesOp(int64_t world, int64_t hidden, int64_t num_experts, int64_t top_k, int64_t max_tokens,
                      at::ScalarType dtype, std::string_view sync) {
  return WindowBytes(world, hidden, num_experts, top_k, max_tokens, dtype, std::string(sync));
}

std::string StatusMessageOp(const at::Tensor& status, int64_t rank, double timeout_s) {
  return StatusMessage(status, rank, timeout_s);
}

std::string HcclWindowProblemOp(int64_t world, int64_t hidden, int64_t num_experts, int64_t top_k,
                                int64_t max_tokens, at::ScalarType dtype, std::string_view sync,
                                std::optional<std::string_view> hccl_buffsize) {
  return HcclWindowProblem(world, hidden, num_experts, top_k, max_tokens, dtype, std::string(sync),
                           hccl_buffsize ? std::optional<std::string>(std::string(*hccl_buffsize)) : std::nullopt);
}

}  // namespace
}  // namespace ubep_ascend

TORCH_LIBRARY(ubep_ascend, m) {
  m.def("window_bytes(int world, int hidden, int num_experts, int top_k, int max_tokens, ScalarType dtype, "
        "str sync) -> int",
        &ubep_ascend::WindowBytesOp);
  m.def("hccl_window_problem(int world, int hidden, int num_experts, int top_k, int max_tokens, "
        "ScalarType dtype, str sync, str? hccl_buffsize) -> str",
        &ubep_ascend::HcclWindowProblemOp);
  m.def("worker_split(int world, int hidden, int num_experts, int top_k, int max_tokens, ScalarType dtype, "
        "int n_workers) -> (int n_count, int n_token)",
        &ubep_ascend::WorkerSplitOp);
  m.def("status_message(Tensor status, int rank, float timeout_s) -> str", &ubep_ascend::StatusMessageOp);
  m.def("prepare(Tensor token, Tensor(a!)[] windows, str group, int world, int rank, int hidden, int num_experts, "
        "int top_k, int max_tokens, ScalarType dtype, str sync, int n_workers, float timeout_s) -> Tensor status");
  m.def("probe(Tensor token, Tensor(a!)[] windows, str group, int world, int rank, int hidden, int num_experts, "
        "int top_k, int max_tokens, ScalarType dtype, int n_workers, float timeout_s, int rounds, int blocks) -> "
        "(Tensor counts, Tensor status)");
  m.def("dispatch(Tensor x, Tensor topk_idx, Tensor topk_weights, Tensor(a!)[] windows, str group, int world, "
        "int rank, int num_experts, int max_tokens, bool padded, str sync, int call_code, int n_workers, "
        "float timeout_s) -> (Tensor recv_x, Tensor recv_weights, Tensor tokens_per_expert, Tensor recv_rows, "
        "Tensor recv_pair_weights, Tensor recv_pair_base, Tensor recv_counts, Tensor status)");
  m.def("combine(Tensor rows, Tensor topk_idx, Tensor topk_weights, Tensor recv_rows, Tensor recv_pair_weights, "
        "Tensor recv_pair_base, Tensor recv_counts, Tensor(a!)[] windows, str group, int world, int rank, "
        "int num_experts, int hidden, ScalarType dtype, str reduce, bool weighted, str sync, int call_code, "
        "int n_workers, float timeout_s) -> (Tensor y, Tensor status)");
}

TORCH_LIBRARY_IMPL(ubep_ascend, Meta, m) {
  m.impl("prepare", &ubep_ascend::PrepareMeta);
  m.impl("probe", &ubep_ascend::ProbeMeta);
  m.impl("dispatch", &ubep_ascend::DispatchMeta);
  m.impl("combine", &ubep_ascend::CombineMeta);
}
