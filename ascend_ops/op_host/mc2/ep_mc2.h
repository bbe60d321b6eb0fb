// What the MC2 ops UbepDispatch, UbepCombine and UbepPrepare share (CANN only, never compiled):
// their dtype columns, AI Core configuration and (empty) shape inference, and for their host tiling
// functions: read the attributes, refuse a window that HCCL_BUFFSIZE does not hold, and save the op's
// tiling (EpOpTiling, op_tiling.h: HCCL's Mc2InitTiling / Mc2CcTiling for the op's group, then the
// EpTiling of tiling.h), AIV count and workspace.
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "hccl_buffer.h"
#include "op_tiling.h"
#include "register/op_def_registry.h"
#include "tiling/platform/platform_ascendc.h"
#include "tiling/tiling_api.h"
#include "tiling.h"

namespace ubep_ascend::mc2 {

constexpr uint32_t OP_TYPE_ALL_TO_ALL = 8;
constexpr size_t MC2_SYSTEM_WORKSPACE = 16 << 20;

// The ops' dtype columns: one per row dtype (bf16, fp16, fp32); other tensors keep one dtype.
inline std::vector<ge::DataType> RowColumns() { return {ge::DT_BF16, ge::DT_FLOAT16, ge::DT_FLOAT}; }
inline std::vector<ge::DataType> Columns(ge::DataType t) { return std::vector<ge::DataType>(3, t); }
inline std::vector<ge::Format> NdColumns() { return std::vector<ge::Format>(3, ge::FORMAT_ND); }

// The AI Core configuration of vllm-ascend's MC2 op DispatchFFNCombine, which reaches torch through its
// aclnn API as ours do (dispatch_ffn_combine_def.cpp:82-91).
inline ops::OpAICoreConfig AiCoreConfig() {
  ops::OpAICoreConfig config;
  config.DynamicCompileStaticFlag(true)
      .DynamicFormatFlag(true)
      .DynamicRankSupportFlag(true)
      .DynamicShapeSupportFlag(true)
      .NeedCheckSupportFlag(false)
      .PrecisionReduceFlag(true)
      .ExtendCfgInfo("aclnnSupport.value", "support_aclnn")
      .ExtendCfgInfo("jitCompile.flag", "static_false")
      .ExtendCfgInfo("multiKernelSupportDynamicGraph.value", "multi_kernel");
  return config;
}

// Empty shape and dtype inference, as vllm-ascend registers for its MC2 op (dispatch_ffn_combine_proto.cpp,
// there with IMPL_OP_INFERSHAPE; here through the OpDef, as the CANN custom-op samples do): eager aclnn
// calls get their outputs from the caller; a GE graph would need real ones (docs/ASCEND.md,
// "Communication the MC2 way").
inline ge::graphStatus InferShapeNone(gert::InferShapeContext*) { return ge::GRAPH_SUCCESS; }
inline ge::graphStatus InferDataTypeNone(gert::InferDataTypeContext*) { return ge::GRAPH_SUCCESS; }

// Attribute i of the op, in the order its OpDef declares them.
template <typename T>
inline T Attr(const gert::TilingContext* ctx, size_t i) {
  return *ctx->GetAttrs()->GetAttrPointer<T>(i);
}
inline const char* StrAttr(const gert::TilingContext* ctx, size_t i) {
  return ctx->GetAttrs()->GetAttrPointer<char>(i);
}
inline int64_t InputDim(const gert::TilingContext* ctx, size_t input, size_t dim) {
  return ctx->GetInputShape(input)->GetStorageShape().GetDim(dim);
}

inline RowDtype RowDtypeOf(ge::DataType t) {
  if (t == ge::DT_FLOAT) return ROW_FP32;
  return t == ge::DT_FLOAT16 ? ROW_FP16 : ROW_BF16;
}

inline ge::graphStatus Fail(const char* op, const std::string& why) {
  std::fprintf(stderr, "ubep_ascend %s: %s\n", op, why.c_str());
  return ge::GRAPH_FAILED;
}

// The tiling of the call (make_tiling() may throw std::invalid_argument), checked against
// HCCL_BUFFSIZE, then saved with HCCL's tiling for `group`; the op runs on n_workers AIVs at once
// (batch mode: the worker groups wait on each other).
template <class MakeTiling>
ge::graphStatus SaveTiling(gert::TilingContext* ctx, const char* op, const char* group, int64_t n_workers,
                           MakeTiling make_tiling) {
  EpTiling t;
  try {
    t = make_tiling();
  } catch (const std::exception& e) {
    return Fail(op, e.what());
  }
  const std::string problem = HcclBufferProblem(t.window_bytes, std::getenv("HCCL_BUFFSIZE"));
  if (!problem.empty()) return Fail(op, problem);

  // ubep issues no HCCL task. GUESS: an all-to-all on the full mesh is what makes HCCL set up the
  // group's windows for the op, as for the MC2 MoE ops, whose tilings pass op type 8 for it
  // (OP_TYPE_ALL_TO_ALL, moe_distribute_dispatch_tiling.cpp:64; asc-devkit's HcclCMDType says 10).
  EpOpTiling* data = ctx->GetTilingData<EpOpTiling>();
  if (data == nullptr) return Fail(op, "tiling data does not fit");
  AscendC::Mc2CcTilingConfig hccl(group, OP_TYPE_ALL_TO_ALL, "AlltoAll=level0:fullmesh;level1:pairwise");
  if (hccl.GetTiling(data->mc2InitTiling) != 0 || hccl.GetTiling(data->mc2CcTiling) != 0) {
    return Fail(op, std::string("HCCL tiling failed for group '") + group + "'");
  }
  data->ep = t;

  ctx->SetBlockDim(static_cast<uint32_t>(n_workers));
  ctx->SetScheduleMode(1);
  // ubep's scratch is an output; the workspace is the system part, at least the 16 MB every MC2 op
  // reserves (SYSTEM_NEED_WORKSPACE, moe_distribute_dispatch_tiling.cpp), which SyncAll needs too.
  platform_ascendc::PlatformAscendC platform(ctx->GetPlatformInfo());
  ctx->GetWorkspaceSizes(1)[0] = std::max<size_t>(platform.GetLibApiWorkSpaceSize(), MC2_SYSTEM_WORKSPACE);
  return ge::GRAPH_SUCCESS;
}

}  // namespace ubep_ascend::mc2
