// The NPU (PrivateUse1) implementation of torch.ops.ubep_ascend, built only with CANN and torch_npu:
// the same op bodies as the CPU twin, launching the Ascend C kernels on the current NPU stream
// through the launchers ascendc_library() generates. Not yet compiled or run (no CANN here).
//
// `windows` must be uint8 NPU tensors over memory every die can address, e.g. views of the HCCL
// windows or of Ascend SHMEM symmetric allocations; the kernels take their GM addresses as is.
#include <torch/library.h>

#include "aclrtlaunch_ubep_combine.h"
#include "aclrtlaunch_ubep_dispatch.h"
#include "ep_ops.h"
#include "torch_npu/csrc/core/npu/NPUStream.h"

namespace ubep_ascend {
namespace {

void* Gm(const at::Tensor& t) { return t.data_ptr(); }

struct NpuLaunch {
  static void Dispatch(int64_t blocks, const at::Tensor& x, const at::Tensor& idx, const at::Tensor& w,
                       const at::Tensor& table, const at::Tensor& recv_x, const at::Tensor& recv_w,
                       const at::Tensor& tpe, const at::Tensor& recv_rows, const at::Tensor& pair_w,
                       const at::Tensor& pair_base, const at::Tensor& counts, const at::Tensor& ws,
                       const at::Tensor& tiling) {
    auto stream = c10_npu::getCurrentNPUStream().stream(false);
    ACLRT_LAUNCH_KERNEL(ubep_dispatch)(static_cast<uint32_t>(blocks), stream, Gm(x), Gm(idx), Gm(w), Gm(table),
                                       Gm(recv_x), Gm(recv_w), Gm(tpe), Gm(recv_rows), Gm(pair_w), Gm(pair_base),
                                       Gm(counts), Gm(ws), Gm(tiling));
  }
  static void Combine(int64_t blocks, const at::Tensor& rows, const at::Tensor& idx, const at::Tensor& w,
                      const at::Tensor& recv_rows, const at::Tensor& pair_w, const at::Tensor& pair_base,
                      const at::Tensor& counts, const at::Tensor& table, const at::Tensor& y, const at::Tensor& ws,
                      const at::Tensor& tiling, int64_t dtype_code) {
    auto stream = c10_npu::getCurrentNPUStream().stream(false);
    ACLRT_LAUNCH_KERNEL(ubep_combine)(static_cast<uint32_t>(blocks), stream, Gm(rows), Gm(idx), Gm(w),
                                      Gm(recv_rows), Gm(pair_w), Gm(pair_base), Gm(counts), Gm(table), Gm(y), Gm(ws),
                                      Gm(tiling), dtype_code);
  }
};

auto DispatchNpu(const at::Tensor& x, const at::Tensor& topk_idx, const at::Tensor& topk_weights,
                 at::TensorList windows, int64_t rank, int64_t num_experts, int64_t max_tokens, bool padded,
                 std::string_view sync, int64_t epoch, int64_t n_workers, double timeout_s) {
  return Dispatch<NpuLaunch>(x, topk_idx, topk_weights, windows, rank, num_experts, max_tokens, padded,
                             std::string(sync), epoch, n_workers, timeout_s);
}

at::Tensor CombineNpu(const at::Tensor& rows, const at::Tensor& topk_idx, const at::Tensor& topk_weights,
                      const at::Tensor& recv_rows, const at::Tensor& recv_pair_weights,
                      const at::Tensor& recv_pair_base, const at::Tensor& recv_counts, at::TensorList windows,
                      int64_t rank, int64_t num_experts, int64_t hidden, at::ScalarType dtype,
                      std::string_view reduce, bool weighted, std::string_view sync, int64_t epoch,
                      int64_t n_workers, double timeout_s) {
  return Combine<NpuLaunch>(rows, topk_idx, topk_weights, recv_rows, recv_pair_weights, recv_pair_base,
                            recv_counts, windows, rank, num_experts, hidden, dtype, std::string(reduce), weighted,
                            std::string(sync), epoch, n_workers, timeout_s);
}

}  // namespace
}  // namespace ubep_ascend

TORCH_LIBRARY_IMPL(ubep_ascend, PrivateUse1, m) {
  m.impl("dispatch", &ubep_ascend::DispatchNpu);
  m.impl("combine", &ubep_ascend::CombineNpu);
}
