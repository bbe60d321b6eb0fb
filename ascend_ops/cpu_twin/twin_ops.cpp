// The CPU implementation of torch.ops.ubep_ascend: the Ascend C kernels compiled by g++ against the
// twin (cpu_twin/include/kernel_operator.h) and launched with one thread per AIV. Each rank
// process is one die; the windows are shared mappings every die process maps, and each launch
// builds the twin's HCCL group over them (hccl_group.h) so that the kernels find them as they do
// on an NPU, through GetHcclContext.
#include <torch/library.h>

#include <cstring>
#include <vector>

#include "ep_op_tiling.h"
#include "ep_ops.h"
#include "hccl_group.h"
#include "kernel_operator.h"

extern "C" void ubep_dispatch(GM_ADDR x, GM_ADDR topk_idx, GM_ADDR topk_weights, GM_ADDR recv_x,
                              GM_ADDR recv_weights, GM_ADDR tokens_per_expert, GM_ADDR recv_rows,
                              GM_ADDR recv_pair_weights, GM_ADDR recv_pair_base, GM_ADDR recv_counts,
                              GM_ADDR scratch, GM_ADDR workspace, GM_ADDR tiling);
extern "C" void ubep_combine(GM_ADDR rows, GM_ADDR topk_idx, GM_ADDR topk_weights, GM_ADDR recv_rows,
                             GM_ADDR recv_pair_weights, GM_ADDR recv_pair_base, GM_ADDR recv_counts, GM_ADDR y,
                             GM_ADDR scratch, GM_ADDR workspace, GM_ADDR tiling);

namespace ubep_ascend {
namespace {

GM_ADDR Gm(const at::Tensor& t) { return static_cast<GM_ADDR>(t.data_ptr()); }

// The op's tiling data as the kernel receives it; HCCL's part stays zero (the twin reads none of it).
at::Tensor OpTiling(const EpTiling& t) {
  at::Tensor bytes = at::zeros({static_cast<int64_t>(sizeof(EpOpTiling))}, at::kByte);
  EpOpTiling op{};
  op.ep = t;
  std::memcpy(bytes.data_ptr(), &op, sizeof(EpOpTiling));
  return bytes;
}

// The dies' window bases, checked against the layer's window size.
std::vector<uint8_t*> WindowBases(at::TensorList windows, const EpTiling& t) {
  TORCH_CHECK(static_cast<int64_t>(windows.size()) == t.world, "ubep_ascend: on the CPU twin windows must have ",
              t.world, " tensors (one per rank), got ", windows.size());
  std::vector<uint8_t*> bases;
  for (int64_t r = 0; r < t.world; ++r) {
    const at::Tensor& w = windows[r];
    TORCH_CHECK(w.device().is_cpu() && w.scalar_type() == at::kByte && w.is_contiguous() &&
                    w.numel() >= t.window_bytes + AscendC::twin::lock_table_bytes(t.window_bytes),
                "ubep_ascend: windows[", r, "] must be a contiguous uint8 CPU tensor of window_bytes(...)");
    bases.push_back(static_cast<uint8_t*>(w.data_ptr()));
  }
  return bases;
}

struct TwinLaunch {
  static void Dispatch(const DispatchArgs& a, at::TensorList windows, const EpTiling& t) {
    TwinHcclGroup group(a.group, t.rank, WindowBases(windows, t), t.window_bytes);
    const at::Tensor tiling = OpTiling(t);
    AscendC::twin::launch(a.call.n_workers, [&] {
      ubep_dispatch(Gm(a.x), Gm(a.topk_idx), Gm(a.topk_weights), Gm(a.recv_x), Gm(a.recv_weights),
                    Gm(a.tokens_per_expert), Gm(a.recv_rows), Gm(a.recv_pair_weights), Gm(a.recv_pair_base),
                    Gm(a.recv_counts), Gm(a.scratch), nullptr, Gm(tiling));
    });
  }
  static void Combine(const CombineArgs& a, at::TensorList windows, const EpTiling& t) {
    TwinHcclGroup group(a.group, t.rank, WindowBases(windows, t), t.window_bytes);
    const at::Tensor tiling = OpTiling(t);
    AscendC::twin::launch(a.call.n_workers, [&] {
      ubep_combine(Gm(a.rows), Gm(a.topk_idx), Gm(a.topk_weights), Gm(a.recv_rows), Gm(a.recv_pair_weights),
                   Gm(a.recv_pair_base), Gm(a.recv_counts), Gm(a.y), Gm(a.scratch), nullptr, Gm(tiling));
    });
  }
};

auto DispatchCpu(const at::Tensor& x, const at::Tensor& topk_idx, const at::Tensor& topk_weights,
                 at::TensorList windows, std::string_view group, int64_t world, int64_t rank, int64_t num_experts,
                 int64_t max_tokens, bool padded, std::string_view sync, int64_t epoch, int64_t n_workers,
                 double timeout_s) {
  return Dispatch<TwinLaunch>(x, topk_idx, topk_weights, windows, std::string(group), world, rank, num_experts,
                              max_tokens, padded, std::string(sync), epoch, n_workers, timeout_s);
}

at::Tensor CombineCpu(const at::Tensor& rows, const at::Tensor& topk_idx, const at::Tensor& topk_weights,
                      const at::Tensor& recv_rows, const at::Tensor& recv_pair_weights,
                      const at::Tensor& recv_pair_base, const at::Tensor& recv_counts, at::TensorList windows,
                      std::string_view group, int64_t world, int64_t rank, int64_t num_experts, int64_t hidden,
                      at::ScalarType dtype, std::string_view reduce, bool weighted, std::string_view sync,
                      int64_t epoch, int64_t n_workers, double timeout_s) {
  return Combine<TwinLaunch>(rows, topk_idx, topk_weights, recv_rows, recv_pair_weights, recv_pair_base,
                             recv_counts, windows, std::string(group), world, rank, num_experts, hidden, dtype,
                             std::string(reduce), weighted, std::string(sync), epoch, n_workers, timeout_s);
}

}  // namespace
}  // namespace ubep_ascend

TORCH_LIBRARY_IMPL(ubep_ascend, CPU, m) {
  m.impl("dispatch", &ubep_ascend::DispatchCpu);
  m.impl("combine", &ubep_ascend::CombineCpu);
}
