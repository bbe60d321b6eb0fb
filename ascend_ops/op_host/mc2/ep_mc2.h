// What the MC2 ops UbepDispatch, UbepCombine, UbepPrepare and UbepProbe share (CANN only, never
// compiled): their dtype columns, AI Core configuration and shape inference, and for their host
// tiling functions: read the attributes, refuse a window that HCCL_BUFFSIZE does not hold, and save
// the op's tiling (EpOpTiling, op_tiling.h: HCCL's Mc2InitTiling / Mc2CcTiling for the op's group, then the
// EpTiling of tiling.h), AIV count and workspace.
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "hccl_buffer.h"
#include "op_shapes.h"
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

// What every OpDef ends with: its host tiling and shape inference, vllm-ascend's AI Core config on
// A3, and the HCCL group of its "group" attribute.
inline void FinishOpDef(ops::OpDef& def, gert::OpImplRegisterV2::TilingKernelFunc tiling,
                        gert::OpImplRegisterV2::InferShapeKernelFunc infer_shape,
                        gert::OpImplRegisterV2::InferDataTypeKernelFunc infer_dtype) {
  def.AICore().SetTiling(tiling);
  def.SetInferShape(infer_shape).SetInferDataType(infer_dtype);
  ops::OpAICoreConfig config = AiCoreConfig();  // AddConfig takes it by non-const reference
  def.AICore().AddConfig("ascend910_93", config);
  def.MC2().HcclGroup("group");
}

// Attribute i of the op, in the order its OpDef declares them (tiling and shape inference alike).
template <typename T, class Context>
inline T Attr(const Context* ctx, size_t i) {
  return *ctx->GetAttrs()->template GetAttrPointer<T>(i);
}
template <class Context>
inline const char* StrAttr(const Context* ctx, size_t i) {
  return ctx->GetAttrs()->template GetAttrPointer<char>(i);
}
inline int64_t InputDim(const gert::TilingContext* ctx, size_t input, size_t dim) {
  return ctx->GetInputShape(input)->GetStorageShape().GetDim(dim);
}
inline int64_t InputDim(const gert::InferShapeContext* ctx, size_t input, size_t dim) {
  return ctx->GetInputShape(input)->GetDim(dim);
}

inline RowDtype RowDtypeOf(ge::DataType t) {
  if (t == ge::DT_FLOAT) return ROW_FP32;
  return t == ge::DT_FLOAT16 ? ROW_FP16 : ROW_BF16;
}

inline ge::graphStatus Fail(const char* op, const std::string& why) {
  std::fprintf(stderr, "ubep_ascend %s: %s\n", op, why.c_str());
  return ge::GRAPH_FAILED;
}

// Shape inference, for GE graphs (torchair): the outputs' shapes (op_shapes.h) of the call's tiling,
// as the torch ops allocate them; make_shapes() may throw std::invalid_argument, as the tiling.
template <class MakeShapes>
ge::graphStatus InferShapes(gert::InferShapeContext* ctx, const char* op, MakeShapes make_shapes) {
  std::vector<Dims> shapes;
  try {
    shapes = make_shapes();
  } catch (const std::exception& e) {
    return Fail(op, e.what());
  }
  for (size_t i = 0; i < shapes.size(); ++i) {
    gert::Shape* out = ctx->GetOutputShape(i);
    if (out == nullptr) return Fail(op, "no output shape " + std::to_string(i));
    out->SetDimNum(shapes[i].size());
    for (size_t d = 0; d < shapes[i].size(); ++d) out->SetDim(d, shapes[i][d]);
  }
  return ge::GRAPH_SUCCESS;
}

// Output dtypes: `dtypes` in output order, where ge::DT_UNDEFINED means "that of input `like`".
inline ge::graphStatus InferDataTypes(gert::InferDataTypeContext* ctx, size_t like,
                                      const std::vector<ge::DataType>& dtypes) {
  for (size_t i = 0; i < dtypes.size(); ++i) {
    const ge::DataType t = dtypes[i] == ge::DT_UNDEFINED ? ctx->GetInputDataType(like) : dtypes[i];
    if (ctx->SetOutputDataType(i, t) != ge::GRAPH_SUCCESS) return ge::GRAPH_FAILED;
  }
  return ge::GRAPH_SUCCESS;
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
