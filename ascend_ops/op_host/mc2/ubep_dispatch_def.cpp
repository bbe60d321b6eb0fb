// The MC2 op UbepDispatch (CANN only, never compiled): its definition, whose HCCL group is the
// "group" attribute, and its host tiling. The kernel is op_kernel/dispatch_kernel.cpp (ubep_dispatch);
// op_build generates aclnnInnerUbepDispatch from it, which aclnn_ubep.cpp wraps as aclnnUbepDispatch (MTE
// server type); npu_ops.cpp calls that with the same arguments as the torch op.
#include "ep_mc2.h"

namespace ubep_ascend::mc2 {
namespace {

enum DispatchAttr : size_t { GROUP, WORLD, RANK, NUM_EXPERTS, MAX_TOKENS, PADDED, SYNC, EPOCH, N_WORKERS, TIMEOUT_S };
enum DispatchInput : size_t { X, TOPK_IDX };

template <class Context>
EpTiling TilingOf(const Context* ctx) {
  const CallAttrs c{Attr<int64_t>(ctx, WORLD),      Attr<int64_t>(ctx, RANK),      Attr<int64_t>(ctx, NUM_EXPERTS),
                    Attr<int64_t>(ctx, MAX_TOKENS), StrAttr(ctx, SYNC),            Attr<int64_t>(ctx, EPOCH),
                    Attr<int64_t>(ctx, N_WORKERS),  Attr<float>(ctx, TIMEOUT_S)};
  return DispatchTiling(c, Attr<bool>(ctx, PADDED), InputDim(ctx, X, 1), InputDim(ctx, TOPK_IDX, 1),
                        RowDtypeOf(ctx->GetInputDesc(X)->GetDataType()), InputDim(ctx, X, 0));
}

ge::graphStatus DispatchTilingFunc(gert::TilingContext* ctx) {
  return SaveTiling(ctx, "UbepDispatch", StrAttr(ctx, GROUP), Attr<int64_t>(ctx, N_WORKERS),
                    [&] { return TilingOf(ctx); });
}

ge::graphStatus DispatchInferShape(gert::InferShapeContext* ctx) {
  return InferShapes(ctx, "UbepDispatch", [&] { return DispatchShapes(TilingOf(ctx), Attr<bool>(ctx, PADDED)); });
}

// recv_x as x; the routing outputs' own dtypes.
ge::graphStatus DispatchInferDataType(gert::InferDataTypeContext* ctx) {
  return InferDataTypes(ctx, X, {ge::DT_UNDEFINED, ge::DT_FLOAT, ge::DT_INT64, ge::DT_INT32, ge::DT_FLOAT,
                                 ge::DT_INT32, ge::DT_INT32, ge::DT_UINT8});
}

}  // namespace
}  // namespace ubep_ascend::mc2

namespace ops {

class UbepDispatch : public OpDef {
 public:
  explicit UbepDispatch(const char* name) : OpDef(name) {
    using ubep_ascend::mc2::Columns;
    const auto rows = ubep_ascend::mc2::RowColumns();
    const auto nd = ubep_ascend::mc2::NdColumns();
    this->Input("x").ParamType(REQUIRED).DataType(rows).Format(nd);
    this->Input("topk_idx").ParamType(REQUIRED).DataType(Columns(ge::DT_INT64)).Format(nd);
    this->Input("topk_weights").ParamType(REQUIRED).DataType(Columns(ge::DT_FLOAT)).Format(nd);
    this->Output("recv_x").ParamType(REQUIRED).DataType(rows).Format(nd);
    this->Output("recv_weights").ParamType(REQUIRED).DataType(Columns(ge::DT_FLOAT)).Format(nd);
    this->Output("tokens_per_expert").ParamType(REQUIRED).DataType(Columns(ge::DT_INT64)).Format(nd);
    this->Output("recv_rows").ParamType(REQUIRED).DataType(Columns(ge::DT_INT32)).Format(nd);
    this->Output("recv_pair_weights").ParamType(REQUIRED).DataType(Columns(ge::DT_FLOAT)).Format(nd);
    this->Output("recv_pair_base").ParamType(REQUIRED).DataType(Columns(ge::DT_INT32)).Format(nd);
    this->Output("recv_counts").ParamType(REQUIRED).DataType(Columns(ge::DT_INT32)).Format(nd);
    this->Output("scratch").ParamType(REQUIRED).DataType(Columns(ge::DT_UINT8)).Format(nd);
    this->Attr("group").AttrType(REQUIRED).String();
    this->Attr("world").AttrType(REQUIRED).Int();
    this->Attr("rank").AttrType(REQUIRED).Int();
    this->Attr("num_experts").AttrType(REQUIRED).Int();
    this->Attr("max_tokens").AttrType(REQUIRED).Int();
    this->Attr("padded").AttrType(REQUIRED).Bool();
    this->Attr("sync").AttrType(REQUIRED).String();
    this->Attr("call_code").AttrType(REQUIRED).Int();
    this->Attr("n_workers").AttrType(REQUIRED).Int();
    this->Attr("timeout_s").AttrType(REQUIRED).Float();
    ubep_ascend::mc2::FinishOpDef(*this, ubep_ascend::mc2::DispatchTilingFunc,
                                  ubep_ascend::mc2::DispatchInferShape,
                                  ubep_ascend::mc2::DispatchInferDataType);
  }
};

OP_ADD(UbepDispatch);

}  // namespace ops
