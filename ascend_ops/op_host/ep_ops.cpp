// torch.ops.ubep_ascend: schemas (window tensors marked as mutated), the helpers every device
// shares, and the Meta (fake) implementations torch.compile traces with. The device implementations
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

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> DispatchMeta(
    const at::Tensor& x, const at::Tensor& topk_idx, const at::Tensor&, at::TensorList, std::string_view,
    int64_t world, int64_t, int64_t num_experts, int64_t max_tokens, bool padded, std::string_view, int64_t,
    int64_t, double) {
  const int64_t K = topk_idx.size(1);
  const int64_t rows = MaxRecvRows(world, num_experts, K, max_tokens, padded);
  const auto i32 = x.options().dtype(at::kInt), f32 = x.options().dtype(at::kFloat);
  return {at::empty({rows, x.size(1)}, x.options()), at::empty({rows}, f32),
          at::empty({num_experts / world}, x.options().dtype(at::kLong)), at::empty({world, max_tokens, K}, i32),
          at::empty({world, max_tokens, K}, f32), at::empty({world, max_tokens}, i32), at::empty({world, 2}, i32)};
}

at::Tensor CombineMeta(const at::Tensor& rows, const at::Tensor& topk_idx, const at::Tensor&, const at::Tensor&,
                       const at::Tensor&, const at::Tensor&, const at::Tensor&, at::TensorList, std::string_view,
                       int64_t, int64_t, int64_t, int64_t hidden, at::ScalarType, std::string_view reduce, bool,
                       std::string_view, int64_t, int64_t, double) {
  const int64_t T = topk_idx.size(0);
  return reduce == "pairs" ? at::empty({T, topk_idx.size(1)}, rows.options())
                           : at::empty({T, hidden}, rows.options());
}

void PrepareMeta(const at::Tensor&, at::TensorList, std::string_view, int64_t, int64_t, int64_t, int64_t, int64_t,
                 int64_t, at::ScalarType, std::string_view, int64_t, double) {}

std::tuple<int64_t, int64_t> WorkerSplitOp(int64_t world, int64_t hidden, int64_t num_experts, int64_t top_k,
                                           int64_t max_tokens, at::ScalarType dtype, int64_t n_workers) {
  return WorkerSplit(world, hidden, num_experts, top_k, max_tokens, dtype, n_workers);
}

int64_t WindowBytesOp(int64_t world, int64_t hidden, int64_t num_experts, int64_t top_k, int64_t max_tokens,
                      at::ScalarType dtype, std::string_view sync) {
  return WindowBytes(world, hidden, num_experts, top_k, max_tokens, dtype, std::string(sync));
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
  m.def("prepare(Tensor token, Tensor(a!)[] windows, str group, int world, int rank, int hidden, int num_experts, "
        "int top_k, int max_tokens, ScalarType dtype, str sync, int n_workers, float timeout_s) -> ()");
  m.def("dispatch(Tensor x, Tensor topk_idx, Tensor topk_weights, Tensor(a!)[] windows, str group, int world, "
        "int rank, int num_experts, int max_tokens, bool padded, str sync, int epoch, int n_workers, "
        "float timeout_s) -> (Tensor recv_x, Tensor recv_weights, Tensor tokens_per_expert, Tensor recv_rows, "
        "Tensor recv_pair_weights, Tensor recv_pair_base, Tensor recv_counts)");
  m.def("combine(Tensor rows, Tensor topk_idx, Tensor topk_weights, Tensor recv_rows, Tensor recv_pair_weights, "
        "Tensor recv_pair_base, Tensor recv_counts, Tensor(a!)[] windows, str group, int world, int rank, "
        "int num_experts, int hidden, ScalarType dtype, str reduce, bool weighted, str sync, int epoch, "
        "int n_workers, float timeout_s) -> Tensor");
}

TORCH_LIBRARY_IMPL(ubep_ascend, Meta, m) {
  m.impl("prepare", &ubep_ascend::PrepareMeta);
  m.impl("dispatch", &ubep_ascend::DispatchMeta);
  m.impl("combine", &ubep_ascend::CombineMeta);
}
