// The NPU (PrivateUse1) implementation of torch.ops.ubep_ascend, built only with CANN and torch_npu:
// the op bodies of ep_ops.h running the MC2 ops UbepDispatch / UbepCombine / UbepPrepare / UbepProbe
// through the package's public aclnn API (mc2/aclnn_ubep.h), the way vllm-ascend's EXEC_NPU_CMD runs aclnn ops
// (csrc/aclnn_torch_adapter/op_api_common.h): the functions found in the installed package's
// libcust_opapi.so, GetWorkspaceSize (the op's host tiling) on the calling thread, the launch an
// at_npu::native::OpCommand custom handler in torch_npu's task queue, never on the raw stream (the
// outputs' at::zeros are queued there too, and a launch beside the queue may overtake them). No host
// synchronization: the status words go back as a tensor (ep_ops.h). Never compiled or run here (no
// CANN).
#include <dlfcn.h>
#include <torch/library.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "acl/acl.h"
#include "aclnn_ubep.h"
#include "ep_ops.h"
#include "torch_npu/csrc/core/npu/NPUStream.h"
#include "torch_npu/csrc/framework/OpCommand.h"

namespace ubep_ascend {
namespace {

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  std::stringstream in(s);
  for (std::string part; std::getline(in, part, sep);) {
    if (!part.empty()) parts.push_back(part);
  }
  return parts;
}

// Where an installed operator package keeps its op API library, in EXEC_NPU_CMD's order: each
// $ASCEND_CUSTOM_OPP_PATH entry (what the package's set_env.bash sets), then the vendors that
// $ASCEND_OPP_PATH/vendors/config.ini lists as load_priority.
std::vector<std::string> OpApiLibraries() {
  std::vector<std::string> libs;
  if (const char* custom = std::getenv("ASCEND_CUSTOM_OPP_PATH")) {
    for (const auto& dir : Split(custom, ':')) libs.push_back(dir + "/op_api/lib/libcust_opapi.so");
  }
  if (const char* opp = std::getenv("ASCEND_OPP_PATH")) {
    std::ifstream config(std::string(opp) + "/vendors/config.ini");
    const std::string key = "load_priority=";
    for (std::string line; std::getline(config, line);) {
      if (line.rfind(key, 0) != 0) continue;
      for (const auto& vendor : Split(line.substr(key.size()), ',')) {
        libs.push_back(std::string(opp) + "/vendors/" + vendor + "/op_api/lib/libcust_opapi.so");
      }
    }
  }
  return libs;
}

void* OpApiSymbol(const char* name) {
  static const std::vector<void*> handles = [] {
    std::vector<void*> found;
    for (const auto& lib : OpApiLibraries()) {
      if (void* handle = dlopen(lib.c_str(), RTLD_LAZY)) found.push_back(handle);
    }
    return found;
  }();
  for (void* handle : handles) {
    if (void* fn = dlsym(handle, name)) return fn;
  }
  TORCH_CHECK(false, "ubep_ascend: ", name, " is in no installed operator package: install ",
              "build-npu/ascend_ops/package/custom_opp_*.run and source its set_env.bash (ASCEND_CUSTOM_OPP_PATH)");
  return nullptr;
}

template <class Fn>
Fn OpApi(const char* name) {
  return reinterpret_cast<Fn>(OpApiSymbol(name));
}

aclDataType AclDtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return ACL_FLOAT;
    case at::kHalf: return ACL_FLOAT16;
    case at::kBFloat16: return ACL_BF16;
    case at::kLong: return ACL_INT64;
    case at::kInt: return ACL_INT32;
    case at::kByte: return ACL_UINT8;
    default: TORCH_CHECK(false, "ubep_ascend: no aclDataType for ", t);
  }
}

// One launch's aclTensors and the tensors they point into. The handler may run on torch_npu's queue
// thread after the op returned, so they live as long as it (EXEC_NPU_CMD releases its converted
// arguments inside the handler for the same reason).
class AclArgs {
 public:
  explicit AclArgs(std::vector<at::Tensor> tensors) : tensors_(std::move(tensors)) {
    for (const at::Tensor& t : tensors_) {
      std::vector<int64_t> sizes = t.sizes().vec(), strides = t.strides().vec();
      aclTensor* acl = aclCreateTensor(sizes.data(), sizes.size(), AclDtype(t.scalar_type()), strides.data(), 0,
                                       ACL_FORMAT_ND, sizes.data(), sizes.size(), t.data_ptr());
      TORCH_CHECK(acl != nullptr, "ubep_ascend: aclCreateTensor failed");
      acl_.push_back(acl);
    }
  }
  ~AclArgs() {
    for (aclTensor* t : acl_) aclDestroyTensor(t);
  }
  AclArgs(const AclArgs&) = delete;
  AclArgs& operator=(const AclArgs&) = delete;
  aclTensor* operator[](size_t i) const { return acl_[i]; }

 private:
  std::vector<at::Tensor> tensors_;
  std::vector<aclTensor*> acl_;
};

using AclnnRun = aclnnStatus (*)(void*, uint64_t, aclOpExecutor*, aclrtStream);

// aclnn's two phases: size the workspace (get_size: the op's host tiling), then queue the launch.
template <class GetSize>
void Launch(const char* op, const at::Tensor& any, std::shared_ptr<AclArgs> args, GetSize get_size, AclnnRun run) {
  uint64_t ws_bytes = 0;
  aclOpExecutor* executor = nullptr;
  TORCH_CHECK(get_size(*args, &ws_bytes, &executor) == ACL_SUCCESS, "ubep_ascend: ", op,
              "GetWorkspaceSize failed (its host tiling rejected the call): ", aclGetRecentErrMsg());
  const at::Tensor workspace = at::empty({static_cast<int64_t>(ws_bytes)}, any.options().dtype(at::kByte));
  void* ws = ws_bytes ? workspace.data_ptr() : nullptr;
  const aclrtStream stream = c10_npu::getCurrentNPUStream().stream(false);
  at_npu::native::OpCommand cmd;
  cmd.Name(op);
  cmd.SetCustomHandler([op, args, workspace, ws, ws_bytes, executor, stream, run]() -> int {
    const aclnnStatus launched = run(ws, ws_bytes, executor, stream);
    TORCH_CHECK(launched == ACL_SUCCESS, "ubep_ascend: ", op, " failed to launch: ", aclGetRecentErrMsg());
    return 0;
  });
  cmd.Run();
}

void NoWindows(at::TensorList windows) {
  TORCH_CHECK(windows.empty(), "ubep_ascend on an NPU: the windows are the HCCL group's; pass windows=[]");
}

struct NpuLaunch {
  static void Dispatch(const DispatchArgs& a, at::TensorList windows, const EpTiling&) {
    NoWindows(windows);
    static const auto get_size = OpApi<decltype(&aclnnUbepDispatchGetWorkspaceSize)>(
        "aclnnUbepDispatchGetWorkspaceSize");
    static const auto run = OpApi<AclnnRun>("aclnnUbepDispatch");
    auto args = std::make_shared<AclArgs>(std::vector<at::Tensor>{
        a.x, a.topk_idx, a.topk_weights, a.recv_x, a.recv_weights, a.tokens_per_expert, a.recv_rows,
        a.recv_pair_weights, a.recv_pair_base, a.recv_counts, a.scratch});
    const CallAttrs& c = a.call;
    Launch("aclnnUbepDispatch", a.x, args, [&](const AclArgs& t, uint64_t* bytes, aclOpExecutor** executor) {
      return get_size(t[0], t[1], t[2], a.group.c_str(), c.world, c.rank, c.num_experts, c.max_tokens, a.padded,
                      c.sync.c_str(), c.call_code, c.n_workers, c.timeout_s, t[3], t[4], t[5], t[6], t[7], t[8], t[9],
                      t[10], bytes, executor);
    }, run);
  }

  static void Combine(const CombineArgs& a, at::TensorList windows, const EpTiling&) {
    NoWindows(windows);
    static const auto get_size = OpApi<decltype(&aclnnUbepCombineGetWorkspaceSize)>(
        "aclnnUbepCombineGetWorkspaceSize");
    static const auto run = OpApi<AclnnRun>("aclnnUbepCombine");
    auto args = std::make_shared<AclArgs>(std::vector<at::Tensor>{
        a.rows, a.topk_idx, a.topk_weights, a.recv_rows, a.recv_pair_weights, a.recv_pair_base, a.recv_counts, a.y,
        a.scratch});
    const CallAttrs& c = a.call;
    Launch("aclnnUbepCombine", a.rows, args, [&](const AclArgs& t, uint64_t* bytes, aclOpExecutor** executor) {
      return get_size(t[0], t[1], t[2], t[3], t[4], t[5], t[6], a.group.c_str(), c.world, c.rank, c.num_experts,
                      a.hidden, static_cast<int64_t>(a.dtype), a.reduce.c_str(), a.weighted, c.sync.c_str(), c.call_code,
                      c.n_workers, c.timeout_s, t[7], t[8], bytes, executor);
    }, run);
  }

  static void Prepare(const PrepareArgs& a, at::TensorList windows, const EpTiling&) {
    NoWindows(windows);
    static const auto get_size = OpApi<decltype(&aclnnUbepPrepareGetWorkspaceSize)>(
        "aclnnUbepPrepareGetWorkspaceSize");
    static const auto run = OpApi<AclnnRun>("aclnnUbepPrepare");
    auto args = std::make_shared<AclArgs>(std::vector<at::Tensor>{a.token, a.scratch});
    const PrepareAttrs& p = a.attrs;
    Launch("aclnnUbepPrepare", a.token, args, [&](const AclArgs& t, uint64_t* bytes, aclOpExecutor** executor) {
      return get_size(t[0], a.group.c_str(), p.world, p.rank, p.hidden, p.num_experts, p.top_k, p.max_tokens,
                      static_cast<int64_t>(p.dtype), p.sync.c_str(), p.n_workers, p.timeout_s, t[1], bytes,
                      executor);
    }, run);
  }

  static void Probe(const ProbeArgs& a, at::TensorList windows, const EpTiling&) {
    NoWindows(windows);
    static const auto get_size = OpApi<decltype(&aclnnUbepProbeGetWorkspaceSize)>("aclnnUbepProbeGetWorkspaceSize");
    static const auto run = OpApi<AclnnRun>("aclnnUbepProbe");
    auto args = std::make_shared<AclArgs>(std::vector<at::Tensor>{a.token, a.counts, a.scratch});
    const PrepareAttrs& p = a.attrs;
    Launch("aclnnUbepProbe", a.token, args, [&](const AclArgs& t, uint64_t* bytes, aclOpExecutor** executor) {
      return get_size(t[0], a.group.c_str(), p.world, p.rank, p.hidden, p.num_experts, p.top_k, p.max_tokens,
                      static_cast<int64_t>(p.dtype), p.n_workers, p.timeout_s, a.rounds, a.blocks, t[1], t[2], bytes,
                      executor);
    }, run);
  }
};

// Outputs and the stream on the inputs' NPU (ops-transformer torch_extension moe_init_routing.cpp).
auto DispatchNpu(const at::Tensor& x, const at::Tensor& topk_idx, const at::Tensor& topk_weights,
                 at::TensorList windows, std::string_view group, int64_t world, int64_t rank, int64_t num_experts,
                 int64_t max_tokens, bool padded, std::string_view sync, int64_t call_code, int64_t n_workers,
                 double timeout_s) {
  const c10::OptionalDeviceGuard guard(x.device());
  return Dispatch<NpuLaunch>(x, topk_idx, topk_weights, windows, std::string(group), world, rank, num_experts,
                             max_tokens, padded, std::string(sync), call_code, n_workers, timeout_s);
}

auto CombineNpu(const at::Tensor& rows, const at::Tensor& topk_idx, const at::Tensor& topk_weights,
                const at::Tensor& recv_rows, const at::Tensor& recv_pair_weights, const at::Tensor& recv_pair_base,
                const at::Tensor& recv_counts, at::TensorList windows, std::string_view group, int64_t world,
                int64_t rank, int64_t num_experts, int64_t hidden, at::ScalarType dtype, std::string_view reduce,
                bool weighted, std::string_view sync, int64_t call_code, int64_t n_workers, double timeout_s) {
  const c10::OptionalDeviceGuard guard(rows.device());
  return Combine<NpuLaunch>(rows, topk_idx, topk_weights, recv_rows, recv_pair_weights, recv_pair_base, recv_counts,
                            windows, std::string(group), world, rank, num_experts, hidden, dtype, std::string(reduce),
                            weighted, std::string(sync), call_code, n_workers, timeout_s);
}

at::Tensor PrepareNpu(const at::Tensor& token, at::TensorList windows, std::string_view group, int64_t world,
                      int64_t rank, int64_t hidden, int64_t num_experts, int64_t top_k, int64_t max_tokens,
                      at::ScalarType dtype, std::string_view sync, int64_t n_workers, double timeout_s) {
  const c10::OptionalDeviceGuard guard(token.device());
  return Prepare<NpuLaunch>(token, windows, std::string(group), world, rank, hidden, num_experts, top_k, max_tokens,
                            dtype, std::string(sync), n_workers, timeout_s);
}

std::tuple<at::Tensor, at::Tensor> ProbeNpu(const at::Tensor& token, at::TensorList windows, std::string_view group,
                                            int64_t world, int64_t rank, int64_t hidden, int64_t num_experts,
                                            int64_t top_k, int64_t max_tokens, at::ScalarType dtype, int64_t n_workers,
                                            double timeout_s, int64_t rounds, int64_t blocks) {
  const c10::OptionalDeviceGuard guard(token.device());
  return Probe<NpuLaunch>(token, windows, std::string(group), world, rank, hidden, num_experts, top_k, max_tokens,
                          dtype, n_workers, timeout_s, rounds, blocks);
}

}  // namespace
}  // namespace ubep_ascend

TORCH_LIBRARY_IMPL(ubep_ascend, PrivateUse1, m) {
  m.impl("dispatch", &ubep_ascend::DispatchNpu);
  m.impl("combine", &ubep_ascend::CombineNpu);
  m.impl("prepare", &ubep_ascend::PrepareNpu);
  m.impl("probe", &ubep_ascend::ProbeNpu);
}
