// What the MC2 ops UbepDispatch, UbepCombine and UbepPrepare share (CANN only, never compiled here):
// their dtype columns, and for their host tiling functions: read the attributes, refuse a window
// that HCCL_BUFFSIZE does not hold, and save the op's tiling (EpOpTiling: HCCL's Mc2InitTiling /
// Mc2CcTiling for the op's group, then the EpTiling of op_host/tiling.h), AIV count and workspace.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "ep_op_tiling.h"
#include "hccl_buffer.h"
#include "register/op_def_registry.h"
#include "tiling/platform/platform_ascendc.h"
#include "tiling/tiling_api.h"
#include "tiling.h"

namespace ubep_ascend::mc2 {

// The ops' dtype columns: one per row dtype (bf16, fp16, fp32); other tensors keep one dtype.
inline std::vector<ge::DataType> RowColumns() { return {ge::DT_BF16, ge::DT_FLOAT16, ge::DT_FLOAT}; }
inline std::vector<ge::DataType> Columns(ge::DataType t) { return std::vector<ge::DataType>(3, t); }
inline std::vector<ge::Format> NdColumns() { return std::vector<ge::Format>(3, ge::FORMAT_ND); }

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

  static_assert(sizeof(::Mc2InitTiling) == MC2_INIT_TILING_BYTES && sizeof(::Mc2CcTiling) == MC2_CC_TILING_BYTES,
                "EpOpTiling's HCCL parts must have the toolkit's sizes");
  // GUESS: ubep issues no HCCL task; an all-to-all on the full mesh is what makes HCCL set up the
  // group's windows for the op, as for the MC2 MoE ops.
  AscendC::Mc2CcTilingConfig hccl(group, HCCL_CMD_ALLTOALL, "AlltoAll=level0:fullmesh;level1:pairwise");
  ::Mc2InitTiling init{};
  ::Mc2CcTiling cc{};
  if (hccl.GetTiling(init) != 0 || hccl.GetTiling(cc) != 0) {
    return Fail(op, std::string("HCCL tiling failed for group '") + group + "'");
  }
  EpOpTiling data{};
  std::memcpy(data.mc2InitTiling, &init, sizeof(init));
  std::memcpy(data.mc2CcTiling, &cc, sizeof(cc));
  data.ep = t;
  gert::TilingData* raw = ctx->GetRawTilingData();
  if (raw->GetCapacity() < sizeof(data)) return Fail(op, "tiling data does not fit");
  std::memcpy(raw->GetData(), &data, sizeof(data));
  raw->SetDataSize(sizeof(data));

  ctx->SetBlockDim(static_cast<uint32_t>(n_workers));
  ctx->SetScheduleMode(1);
  // ubep's scratch is an output; the workspace is the system part the kernel library needs.
  platform_ascendc::PlatformAscendC platform(ctx->GetPlatformInfo());
  ctx->GetWorkspaceSizes(1)[0] = platform.GetLibApiWorkSpaceSize();
  return ge::GRAPH_SUCCESS;
}

}  // namespace ubep_ascend::mc2
