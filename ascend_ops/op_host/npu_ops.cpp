// The NPU (PrivateUse1) implementation of torch.ops.ubep_ascend, built only with CANN and torch_npu:
// the same op bodies as the CPU twin, running the MC2 ops UbepDispatch / UbepCombine / UbepPrepare
// (op_host/mc2/) through their aclnn API on the current NPU stream. The ops' host tiling computes the
// same tiling as the op body; HCCL hands the kernels the windows of `group`. Never compiled or run
// here (no CANN).
#include <torch/library.h>

#include <string>
#include <vector>

#include "acl/acl.h"
#include "aclnn/acl_meta.h"
#include "aclnn_ubep_combine.h"
#include "aclnn_ubep_dispatch.h"
#include "aclnn_ubep_prepare.h"
#include "ep_ops.h"
#include "torch_npu/csrc/core/npu/NPUStream.h"

namespace ubep_ascend {
namespace {

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

// An aclTensor over a contiguous NPU tensor, for the duration of one call.
class AclTensor {
 public:
  explicit AclTensor(const at::Tensor& t) : sizes_(t.sizes().vec()), strides_(t.strides().vec()) {
    tensor_ = aclCreateTensor(sizes_.data(), sizes_.size(), AclDtype(t.scalar_type()), strides_.data(), 0,
                              ACL_FORMAT_ND, sizes_.data(), sizes_.size(), t.data_ptr());
    TORCH_CHECK(tensor_ != nullptr, "ubep_ascend: aclCreateTensor failed");
  }
  ~AclTensor() { aclDestroyTensor(tensor_); }
  AclTensor(const AclTensor&) = delete;
  AclTensor& operator=(const AclTensor&) = delete;
  operator aclTensor*() const { return tensor_; }

 private:
  std::vector<int64_t> sizes_, strides_;
  aclTensor* tensor_;
};

// aclnn's two phases: size the workspace (get_size), then run on the current stream (run).
template <class GetSize, class Run>
void RunAclnn(const char* op, const at::Tensor& any, GetSize get_size, Run run) {
  uint64_t workspace_bytes = 0;
  aclOpExecutor* executor = nullptr;
  TORCH_CHECK(get_size(&workspace_bytes, &executor) == ACL_SUCCESS, "ubep_ascend: ", op,
              "GetWorkspaceSize failed (its host tiling rejected the call; see the log above)");
  at::Tensor workspace = at::empty({static_cast<int64_t>(workspace_bytes)}, any.options().dtype(at::kByte));
  auto stream = c10_npu::getCurrentNPUStream().stream(false);
  TORCH_CHECK(run(workspace_bytes ? workspace.data_ptr() : nullptr, workspace_bytes, executor, stream) == ACL_SUCCESS,
              "ubep_ascend: ", op, " failed to launch");
}

void NoWindows(at::TensorList windows) {
  TORCH_CHECK(windows.empty(), "ubep_ascend on an NPU: the windows are the HCCL group's; pass windows=[]");
}

struct NpuLaunch {
  static void Dispatch(const DispatchArgs& a, at::TensorList windows, const EpTiling&) {
    NoWindows(windows);
    const AclTensor x(a.x), idx(a.topk_idx), w(a.topk_weights), recv_x(a.recv_x), recv_w(a.recv_weights),
        tpe(a.tokens_per_expert), rows(a.recv_rows), pair_w(a.recv_pair_weights), pair_base(a.recv_pair_base),
        counts(a.recv_counts), scratch(a.scratch);
    std::string group = a.group, sync = a.call.sync;
    const CallAttrs& c = a.call;
    RunAclnn("aclnnUbepDispatch", a.x, [&](uint64_t* bytes, aclOpExecutor** executor) {
      return aclnnUbepDispatchGetWorkspaceSize(x, idx, w, group.data(), c.world, c.rank, c.num_experts, c.max_tokens,
                                               a.padded, sync.data(), c.epoch, c.n_workers, c.timeout_s, recv_x,
                                               recv_w, tpe, rows, pair_w, pair_base, counts, scratch, bytes, executor);
    }, aclnnUbepDispatch);
  }

  static void Combine(const CombineArgs& a, at::TensorList windows, const EpTiling&) {
    NoWindows(windows);
    const AclTensor rows(a.rows), idx(a.topk_idx), w(a.topk_weights), recv_rows(a.recv_rows),
        pair_w(a.recv_pair_weights), pair_base(a.recv_pair_base), counts(a.recv_counts), y(a.y), scratch(a.scratch);
    std::string group = a.group, sync = a.call.sync, reduce = a.reduce;
    const CallAttrs& c = a.call;
    RunAclnn("aclnnUbepCombine", a.rows, [&](uint64_t* bytes, aclOpExecutor** executor) {
      return aclnnUbepCombineGetWorkspaceSize(rows, idx, w, recv_rows, pair_w, pair_base, counts, group.data(),
                                              c.world, c.rank, c.num_experts, a.hidden, static_cast<int64_t>(a.dtype),
                                              reduce.data(), a.weighted, sync.data(), c.epoch, c.n_workers,
                                              c.timeout_s, y, scratch, bytes, executor);
    }, aclnnUbepCombine);
  }

  static void Prepare(const PrepareArgs& a, at::TensorList windows, const EpTiling&) {
    NoWindows(windows);
    const AclTensor token(a.token), scratch(a.scratch);
    std::string group = a.group, sync = a.attrs.sync;
    const PrepareAttrs& p = a.attrs;
    RunAclnn("aclnnUbepPrepare", a.token, [&](uint64_t* bytes, aclOpExecutor** executor) {
      return aclnnUbepPrepareGetWorkspaceSize(token, group.data(), p.world, p.rank, p.hidden, p.num_experts, p.top_k,
                                              p.max_tokens, static_cast<int64_t>(p.dtype), sync.data(), p.n_workers,
                                              p.timeout_s, scratch, bytes, executor);
    }, aclnnUbepPrepare);
  }
};

auto DispatchNpu(const at::Tensor& x, const at::Tensor& topk_idx, const at::Tensor& topk_weights,
                 at::TensorList windows, std::string_view group, int64_t world, int64_t rank, int64_t num_experts,
                 int64_t max_tokens, bool padded, std::string_view sync, int64_t epoch, int64_t n_workers,
                 double timeout_s) {
  return Dispatch<NpuLaunch>(x, topk_idx, topk_weights, windows, std::string(group), world, rank, num_experts,
                             max_tokens, padded, std::string(sync), epoch, n_workers, timeout_s);
}

at::Tensor CombineNpu(const at::Tensor& rows, const at::Tensor& topk_idx, const at::Tensor& topk_weights,
                      const at::Tensor& recv_rows, const at::Tensor& recv_pair_weights,
                      const at::Tensor& recv_pair_base, const at::Tensor& recv_counts, at::TensorList windows,
                      std::string_view group, int64_t world, int64_t rank, int64_t num_experts, int64_t hidden,
                      at::ScalarType dtype, std::string_view reduce, bool weighted, std::string_view sync,
                      int64_t epoch, int64_t n_workers, double timeout_s) {
  return Combine<NpuLaunch>(rows, topk_idx, topk_weights, recv_rows, recv_pair_weights, recv_pair_base, recv_counts,
                            windows, std::string(group), world, rank, num_experts, hidden, dtype, std::string(reduce),
                            weighted, std::string(sync), epoch, n_workers, timeout_s);
}

void PrepareNpu(const at::Tensor& token, at::TensorList windows, std::string_view group, int64_t world, int64_t rank,
                int64_t hidden, int64_t num_experts, int64_t top_k, int64_t max_tokens, at::ScalarType dtype,
                std::string_view sync, int64_t n_workers, double timeout_s) {
  Prepare<NpuLaunch>(token, windows, std::string(group), world, rank, hidden, num_experts, top_k, max_tokens, dtype,
                     std::string(sync), n_workers, timeout_s);
}

}  // namespace
}  // namespace ubep_ascend

TORCH_LIBRARY_IMPL(ubep_ascend, PrivateUse1, m) {
  m.impl("dispatch", &ubep_ascend::DispatchNpu);
  m.impl("combine", &ubep_ascend::CombineNpu);
  m.impl("prepare", &ubep_ascend::PrepareNpu);
}
