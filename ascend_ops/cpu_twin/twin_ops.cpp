// The CPU implementation of torch.ops.ubep_ascend: the Ascend C kernels compiled by g++ against the
// twin (cpu_twin/include/kernel_operator.h) and launched with one thread per AIV. Each rank
// process is one die; the windows are shared mappings every die process maps.
#include <torch/library.h>

#include "ep_ops.h"
#include "kernel_operator.h"

extern "C" void ubep_dispatch(GM_ADDR x, GM_ADDR topk_idx, GM_ADDR topk_weights, GM_ADDR windows, GM_ADDR recv_x,
                              GM_ADDR recv_weights, GM_ADDR tokens_per_expert, GM_ADDR recv_rows,
                              GM_ADDR recv_pair_weights, GM_ADDR recv_pair_base, GM_ADDR recv_counts,
                              GM_ADDR workspace, GM_ADDR tiling);
extern "C" void ubep_combine(GM_ADDR rows, GM_ADDR topk_idx, GM_ADDR topk_weights, GM_ADDR recv_rows,
                             GM_ADDR recv_pair_weights, GM_ADDR recv_pair_base, GM_ADDR recv_counts,
                             GM_ADDR windows, GM_ADDR y, GM_ADDR workspace, GM_ADDR tiling, int64_t dtype_code);

namespace ubep_ascend {
namespace {

GM_ADDR Gm(const at::Tensor& t) { return static_cast<GM_ADDR>(t.data_ptr()); }

// Registers the call's windows (addresses in `table`, sizes from the tiling) for the launch.
struct SharedWindows {
  SharedWindows(const at::Tensor& table, const at::Tensor& tiling) {
    const auto* t = reinterpret_cast<const EpTiling*>(tiling.data_ptr());
    const auto* addr = table.data_ptr<int64_t>();
    for (int64_t r = 0; r < t->world; ++r) {
      AscendC::twin::shared_regions.push_back({reinterpret_cast<uint8_t*>(addr[r]), t->window_bytes});
    }
  }
  ~SharedWindows() { AscendC::twin::shared_regions.clear(); }
};

struct TwinLaunch {
  static void Dispatch(int64_t blocks, const at::Tensor& x, const at::Tensor& idx, const at::Tensor& w,
                       const at::Tensor& table, const at::Tensor& recv_x, const at::Tensor& recv_w,
                       const at::Tensor& tpe, const at::Tensor& recv_rows, const at::Tensor& pair_w,
                       const at::Tensor& pair_base, const at::Tensor& counts, const at::Tensor& ws,
                       const at::Tensor& tiling) {
    SharedWindows shared(table, tiling);
    AscendC::twin::launch(blocks, [&] {
      ubep_dispatch(Gm(x), Gm(idx), Gm(w), Gm(table), Gm(recv_x), Gm(recv_w), Gm(tpe), Gm(recv_rows), Gm(pair_w),
                    Gm(pair_base), Gm(counts), Gm(ws), Gm(tiling));
    });
  }
  static void Combine(int64_t blocks, const at::Tensor& rows, const at::Tensor& idx, const at::Tensor& w,
                      const at::Tensor& recv_rows, const at::Tensor& pair_w, const at::Tensor& pair_base,
                      const at::Tensor& counts, const at::Tensor& table, const at::Tensor& y, const at::Tensor& ws,
                      const at::Tensor& tiling, int64_t dtype_code) {
    SharedWindows shared(table, tiling);
    AscendC::twin::launch(blocks, [&] {
      ubep_combine(Gm(rows), Gm(idx), Gm(w), Gm(recv_rows), Gm(pair_w), Gm(pair_base), Gm(counts), Gm(table),
                   Gm(y), Gm(ws), Gm(tiling), dtype_code);
    });
  }
};

auto DispatchCpu(const at::Tensor& x, const at::Tensor& topk_idx, const at::Tensor& topk_weights,
                 at::TensorList windows, int64_t rank, int64_t num_experts, int64_t max_tokens, bool padded,
                 std::string_view sync, int64_t epoch, int64_t n_workers, double timeout_s) {
  return ubep_ascend::Dispatch<TwinLaunch>(x, topk_idx, topk_weights, windows, rank, num_experts, max_tokens,
                                           padded, std::string(sync), epoch, n_workers, timeout_s);
}

at::Tensor CombineCpu(const at::Tensor& rows, const at::Tensor& topk_idx, const at::Tensor& topk_weights,
                      const at::Tensor& recv_rows, const at::Tensor& recv_pair_weights,
                      const at::Tensor& recv_pair_base, const at::Tensor& recv_counts, at::TensorList windows,
                      int64_t rank, int64_t num_experts, int64_t hidden, at::ScalarType dtype,
                      std::string_view reduce, bool weighted, std::string_view sync, int64_t epoch,
                      int64_t n_workers, double timeout_s) {
  return ubep_ascend::Combine<TwinLaunch>(rows, topk_idx, topk_weights, recv_rows, recv_pair_weights,
                                          recv_pair_base, recv_counts, windows, rank, num_experts, hidden, dtype,
                                          std::string(reduce), weighted, std::string(sync), epoch, n_workers,
                                          timeout_s);
}

}  // namespace
}  // namespace ubep_ascend

TORCH_LIBRARY_IMPL(ubep_ascend, CPU, m) {
  m.impl("dispatch", &ubep_ascend::DispatchCpu);
  m.impl("combine", &ubep_ascend::CombineCpu);
}
