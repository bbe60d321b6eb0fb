// The MC2 op UbepPrepare (CANN only, never compiled), laid out as UbepDispatch: its definition,
// whose HCCL group is the "group" attribute, and its host tiling. The kernel is
// op_kernel/prepare_kernel.cpp (ubep_prepare). `dtype` is the layer's RowDtype (it fixes the window
// geometry); the input `token` is [2] int64, the group's nonce and the preparation's number on the
// group.
#include "ep_mc2.h"

namespace ubep_ascend::mc2 {
namespace {

enum PrepareAttr : size_t {
  GROUP, WORLD, RANK, HIDDEN, NUM_EXPERTS, TOP_K, MAX_TOKENS, DTYPE, SYNC, N_WORKERS, TIMEOUT_S
};

template <class Context>
EpTiling TilingOf(const Context* ctx) {
  const PrepareAttrs p{Attr<int64_t>(ctx, WORLD),       Attr<int64_t>(ctx, RANK),
                       Attr<int64_t>(ctx, HIDDEN),      Attr<int64_t>(ctx, NUM_EXPERTS),
                       Attr<int64_t>(ctx, TOP_K),       Attr<int64_t>(ctx, MAX_TOKENS),
                       static_cast<RowDtype>(Attr<int64_t>(ctx, DTYPE)), StrAttr(ctx, SYNC),
                       Attr<int64_t>(ctx, N_WORKERS),   Attr<float>(ctx, TIMEOUT_S)};
  return PrepareTiling(p);
}

ge::graphStatus PrepareTilingFunc(gert::TilingContext* ctx) {
  return SaveTiling(ctx, "UbepPrepare", StrAttr(ctx, GROUP), Attr<int64_t>(ctx, N_WORKERS),
                    [&] { return TilingOf(ctx); });
}

ge::graphStatus PrepareInferShape(gert::InferShapeContext* ctx) {
  return InferShapes(ctx, "UbepPrepare", [&] { return PrepareShapes(TilingOf(ctx)); });
}

ge::graphStatus PrepareInferDataType(gert::InferDataTypeContext* ctx) {
  return InferDataTypes(ctx, 0, {ge::DT_UINT8});
}

}  // namespace
}  // namespace ubep_ascend::mc2

namespace ops {

class UbepPrepare : public OpDef {
 public:
  explicit UbepPrepare(const char* name) : OpDef(name) {
    using ubep_ascend::mc2::Columns;
    const auto nd = ubep_ascend::mc2::NdColumns();
    this->Input("token").ParamType(REQUIRED).DataType(Columns(ge::DT_INT64)).Format(nd);
    this->Output("scratch").ParamType(REQUIRED).DataType(Columns(ge::DT_UINT8)).Format(nd);
    this->Attr("group").AttrType(REQUIRED).String();
    this->Attr("world").AttrType(REQUIRED).Int();
    this->Attr("rank").AttrType(REQUIRED).Int();
    this->Attr("hidden").AttrType(REQUIRED).Int();
    this->Attr("num_experts").AttrType(REQUIRED).Int();
    this->Attr("top_k").AttrType(REQUIRED).Int();
    this->Attr("max_tokens").AttrType(REQUIRED).Int();
    this->Attr("dtype").AttrType(REQUIRED).Int();
    this->Attr("sync").AttrType(REQUIRED).String();
    this->Attr("n_workers").AttrType(REQUIRED).Int();
    this->Attr("timeout_s").AttrType(REQUIRED).Float();
    ubep_ascend::mc2::FinishOpDef(*this, ubep_ascend::mc2::PrepareTilingFunc,
                                  ubep_ascend::mc2::PrepareInferShape,
                                  ubep_ascend::mc2::PrepareInferDataType);
  }
};

OP_ADD(UbepPrepare);

}  // namespace ops
