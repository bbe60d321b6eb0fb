// The public aclnn API of the operator package (CANN only): one GetWorkspaceSize / run pair per MC2 op,
// with the arguments of the op's OpDef in the generated order (inputs, attributes, outputs). The
// package generates the inner API (aclnnInnerUbep*, OPS_PROJECT_NAME aclnnInner in
// ascend_ops/CMakeLists.txt); aclnn_ubep.cpp wraps it as ops-transformer wraps aclnnInnerMoeDistribute*
// (mc2/moe_distribute_dispatch/op_host/op_api/aclnn_moe_distribute_dispatch.cpp). Plain C types only,
// so the torch_npu binding may use another C++ ABI than the package.
#pragma once

#include <cstdint>

#include "aclnn/aclnn_base.h"

#ifndef ACLNN_API
#define ACLNN_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

ACLNN_API aclnnStatus aclnnUbepDispatchGetWorkspaceSize(
    const aclTensor* x, const aclTensor* topk_idx, const aclTensor* topk_weights, const char* group, int64_t world,
    int64_t rank, int64_t num_experts, int64_t max_tokens, bool padded, const char* sync, int64_t call_code,
    int64_t n_workers, double timeout_s, aclTensor* recv_x, aclTensor* recv_weights, aclTensor* tokens_per_expert,
    aclTensor* recv_rows, aclTensor* recv_pair_weights, aclTensor* recv_pair_base, aclTensor* recv_counts,
    aclTensor* scratch, uint64_t* workspace_size, aclOpExecutor** executor);
ACLNN_API aclnnStatus aclnnUbepDispatch(void* workspace, uint64_t workspace_size, aclOpExecutor* executor,
                                       aclrtStream stream);

ACLNN_API aclnnStatus aclnnUbepCombineGetWorkspaceSize(
    const aclTensor* rows, const aclTensor* topk_idx, const aclTensor* topk_weights, const aclTensor* recv_rows,
    const aclTensor* recv_pair_weights, const aclTensor* recv_pair_base, const aclTensor* recv_counts,
    const char* group, int64_t world, int64_t rank, int64_t num_experts, int64_t hidden, int64_t dtype,
    const char* reduce, bool weighted, const char* sync, int64_t call_code, int64_t n_workers, double timeout_s,
    aclTensor* y, aclTensor* scratch, uint64_t* workspace_size, aclOpExecutor** executor);
ACLNN_API aclnnStatus aclnnUbepCombine(void* workspace, uint64_t workspace_size, aclOpExecutor* executor,
                                      aclrtStream stream);

ACLNN_API aclnnStatus aclnnUbepPrepareGetWorkspaceSize(
    const aclTensor* token, const char* group, int64_t world, int64_t rank, int64_t hidden, int64_t num_experts,
    int64_t top_k, int64_t max_tokens, int64_t dtype, const char* sync, int64_t n_workers, double timeout_s,
    aclTensor* scratch, uint64_t* workspace_size, aclOpExecutor** executor);
ACLNN_API aclnnStatus aclnnUbepPrepare(void* workspace, uint64_t workspace_size, aclOpExecutor* executor,
                                      aclrtStream stream);

ACLNN_API aclnnStatus aclnnUbepProbeGetWorkspaceSize(
    const aclTensor* token, const char* group, int64_t world, int64_t rank, int64_t hidden, int64_t num_experts,
    int64_t top_k, int64_t max_tokens, int64_t dtype, int64_t n_workers, double timeout_s, int64_t rounds,
    int64_t blocks, aclTensor* counts, aclTensor* scratch, uint64_t* workspace_size, aclOpExecutor** executor);
ACLNN_API aclnnStatus aclnnUbepProbe(void* workspace, uint64_t workspace_size, aclOpExecutor* executor,
                                    aclrtStream stream);

#ifdef __cplusplus
}
#endif
