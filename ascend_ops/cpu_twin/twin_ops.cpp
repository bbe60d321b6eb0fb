// The CPU implementation of torch.ops.ubep_ascend: the Ascend C kernels compiled by g++ against the
// strict twin (cpu_twin/strict/kernel_operator.h) and launched with one thread per AIV. Each rank
// process is one die; the windows are shared mappings every die process maps, one per die for the
// life of the process group and of HCCL_BUFFSIZE MB, as HCCL's windowsIn; each launch builds the
// twin's HCCL group over them (hccl_group.h) so that the kernels find them as they do on an NPU,
// through GetHcclContext.
#include <torch/library.h>

#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "op_tiling.h"
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
extern "C" void ubep_prepare(GM_ADDR token, GM_ADDR scratch, GM_ADDR workspace, GM_ADDR tiling);
extern "C" void ubep_probe(GM_ADDR token, GM_ADDR counts, GM_ADDR scratch, GM_ADDR workspace, GM_ADDR tiling);

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

// The group's windows as the twin's HCCL group needs them: every die's base and the window size,
// which the mappings give (each one window of the group's size and the twin's tables after it).
// The layer's window must fit, as HCCL's windowsIn must hold it on an NPU.
struct GroupWindows {
  std::vector<uint8_t*> bases;
  int64_t bytes;
};

GroupWindows WindowsOf(at::TensorList windows, const EpTiling& t) {
  TORCH_CHECK(static_cast<int64_t>(windows.size()) == t.world, "ubep_ascend: on the CPU twin windows must have ",
              t.world, " tensors (one per rank), got ", windows.size());
  GroupWindows g{{}, AscendC::twin::window_of_mapping(windows[0].numel())};
  TORCH_CHECK(g.bytes >= t.window_bytes, "ubep_ascend: the layer's window needs ", t.window_bytes,
              " bytes, the group's windows have ", g.bytes);
  for (int64_t r = 0; r < t.world; ++r) {
    const at::Tensor& w = windows[r];
    TORCH_CHECK(w.device().is_cpu() && w.scalar_type() == at::kByte && w.is_contiguous() &&
                    w.numel() == AscendC::twin::mapping_bytes(g.bytes),
                "ubep_ascend: windows[", r, "] must be a contiguous uint8 CPU tensor of twin_mapping_bytes(...)");
    g.bases.push_back(static_cast<uint8_t*>(w.data_ptr()));
  }
  return g;
}

// Where the twin's HCCL contexts put their table of peer records: not the struct's own remoteRes
// offset but the one another CANN version uses, so every launch checks that the kernels follow
// rWinStart.
constexpr size_t kTwinRemoteOffset = 3320;

// Runs kernel(tiling) on n_workers AIV threads while the twin's HCCL group over `windows` is this
// die's context.
template <class Kernel>
void LaunchInGroup(const std::string& group, at::TensorList windows, const EpTiling& t, int64_t n_workers,
                   Kernel kernel) {
  const GroupWindows w = WindowsOf(windows, t);
  TwinHcclGroup hccl(group, t.rank, w.bases, w.bytes, kTwinRemoteOffset);
  const at::Tensor tiling = OpTiling(t);
  AscendC::twin::launch(n_workers, [&] { kernel(Gm(tiling)); }, t.rank);
}

struct TwinLaunch {
  static void Dispatch(const DispatchArgs& a, at::TensorList windows, const EpTiling& t) {
    LaunchInGroup(a.group, windows, t, a.call.n_workers, [&](GM_ADDR tiling) {
      ubep_dispatch(Gm(a.x), Gm(a.topk_idx), Gm(a.topk_weights), Gm(a.recv_x), Gm(a.recv_weights),
                    Gm(a.tokens_per_expert), Gm(a.recv_rows), Gm(a.recv_pair_weights), Gm(a.recv_pair_base),
                    Gm(a.recv_counts), Gm(a.scratch), nullptr, tiling);
    });
  }
  static void Combine(const CombineArgs& a, at::TensorList windows, const EpTiling& t) {
    LaunchInGroup(a.group, windows, t, a.call.n_workers, [&](GM_ADDR tiling) {
      ubep_combine(Gm(a.rows), Gm(a.topk_idx), Gm(a.topk_weights), Gm(a.recv_rows), Gm(a.recv_pair_weights),
                   Gm(a.recv_pair_base), Gm(a.recv_counts), Gm(a.y), Gm(a.scratch), nullptr, tiling);
    });
  }
  static void Prepare(const PrepareArgs& a, at::TensorList windows, const EpTiling& t) {
    LaunchInGroup(a.group, windows, t, a.attrs.n_workers,
                  [&](GM_ADDR tiling) { ubep_prepare(Gm(a.token), Gm(a.scratch), nullptr, tiling); });
  }
  static void Probe(const ProbeArgs& a, at::TensorList windows, const EpTiling& t) {
    LaunchInGroup(a.group, windows, t, a.attrs.n_workers, [&](GM_ADDR tiling) {
      ubep_probe(Gm(a.token), Gm(a.counts), Gm(a.scratch), nullptr, tiling);
    });
  }
};

auto DispatchCpu(const at::Tensor& x, const at::Tensor& topk_idx, const at::Tensor& topk_weights,
                 at::TensorList windows, std::string_view group, int64_t world, int64_t rank, int64_t num_experts,
                 int64_t max_tokens, bool padded, std::string_view sync, int64_t call_code, int64_t n_workers,
                 double timeout_s) {
  return Dispatch<TwinLaunch>(x, topk_idx, topk_weights, windows, std::string(group), world, rank, num_experts,
                              max_tokens, padded, std::string(sync), call_code, n_workers, timeout_s);
}

auto CombineCpu(const at::Tensor& rows, const at::Tensor& topk_idx, const at::Tensor& topk_weights,
                const at::Tensor& recv_rows, const at::Tensor& recv_pair_weights, const at::Tensor& recv_pair_base,
                const at::Tensor& recv_counts, at::TensorList windows, std::string_view group, int64_t world,
                int64_t rank, int64_t num_experts, int64_t hidden, at::ScalarType dtype, std::string_view reduce,
                bool weighted, std::string_view sync, int64_t call_code, int64_t n_workers, double timeout_s) {
  return Combine<TwinLaunch>(rows, topk_idx, topk_weights, recv_rows, recv_pair_weights, recv_pair_base,
                             recv_counts, windows, std::string(group), world, rank, num_experts, hidden, dtype,
                             std::string(reduce), weighted, std::string(sync), call_code, n_workers, timeout_s);
}

at::Tensor PrepareCpu(const at::Tensor& token, at::TensorList windows, std::string_view group, int64_t world,
                      int64_t rank, int64_t hidden, int64_t num_experts, int64_t top_k, int64_t max_tokens,
                      at::ScalarType dtype, std::string_view sync, int64_t n_workers, double timeout_s) {
  return Prepare<TwinLaunch>(token, windows, std::string(group), world, rank, hidden, num_experts, top_k, max_tokens,
                             dtype, std::string(sync), n_workers, timeout_s);
}

std::tuple<at::Tensor, at::Tensor> ProbeCpu(const at::Tensor& token, at::TensorList windows, std::string_view group,
                                            int64_t world, int64_t rank, int64_t hidden, int64_t num_experts,
                                            int64_t top_k, int64_t max_tokens, at::ScalarType dtype, int64_t n_workers,
                                            double timeout_s, int64_t rounds, int64_t blocks) {
  return Probe<TwinLaunch>(token, windows, std::string(group), world, rank, hidden, num_experts, top_k, max_tokens,
                           dtype, n_workers, timeout_s, rounds, blocks);
}

// Bytes of one die's mapping: a window of HCCL_BUFFSIZE MB (hccl_buffsize: the variable's value,
// absent when unset), the size HCCL gives every window of a group on an NPU, and the twin's tables
// after it (chunk locks, the cross-core publication stamps: cpu_twin/strict/twin/windows.h).
int64_t TwinMappingBytes(std::optional<std::string_view> hccl_buffsize) {
  const std::string value(hccl_buffsize.value_or(""));
  const int64_t mb = HcclBuffsizeMb(hccl_buffsize ? value.c_str() : nullptr);
  TORCH_CHECK(mb > 0, "HCCL_BUFFSIZE must be a whole number of MB >= 1, got '", value, "'");
  return AscendC::twin::mapping_bytes(mb << 20);
}

}  // namespace
}  // namespace ubep_ascend

TORCH_LIBRARY_FRAGMENT(ubep_ascend, m) {
  m.def("twin_mapping_bytes(str? hccl_buffsize) -> int", &ubep_ascend::TwinMappingBytes);
}

TORCH_LIBRARY_IMPL(ubep_ascend, CPU, m) {
  m.impl("dispatch", &ubep_ascend::DispatchCpu);
  m.impl("combine", &ubep_ascend::CombineCpu);
  m.impl("prepare", &ubep_ascend::PrepareCpu);
  m.impl("probe", &ubep_ascend::ProbeCpu);
}
