// The MC2 op UbepCombine (CANN only, never compiled), laid out as UbepDispatch: its definition,
// whose HCCL group is the "group" attribute, and its host tiling. The kernel is
// op_kernel/combine_kernel.cpp (ubep_combine). `dtype` is the layer's RowDtype (it fixes the window
// geometry); the rows' own dtype picks the column (fp32 rows: also every "pairs" call).
#include "ep_mc2.h"

namespace ubep_ascend::mc2 {
namespace {

enum CombineAttr : size_t {
  GROUP, WORLD, RANK, NUM_EXPERTS, HIDDEN, DTYPE, REDUCE, WEIGHTED, SYNC, EPOCH, N_WORKERS, TIMEOUT_S
};
enum CombineInput : size_t { ROWS, TOPK_IDX, TOPK_WEIGHTS, RECV_ROWS };

template <class Context>
EpTiling TilingOf(const Context* ctx) {
  const CallAttrs c{Attr<int64_t>(ctx, WORLD),        Attr<int64_t>(ctx, RANK),  Attr<int64_t>(ctx, NUM_EXPERTS),
                    InputDim(ctx, RECV_ROWS, 1),      StrAttr(ctx, SYNC),        Attr<int64_t>(ctx, EPOCH),
                    Attr<int64_t>(ctx, N_WORKERS),    Attr<float>(ctx, TIMEOUT_S)};
  return CombineTiling(c, Attr<int64_t>(ctx, HIDDEN), InputDim(ctx, TOPK_IDX, 1),
                       static_cast<RowDtype>(Attr<int64_t>(ctx, DTYPE)), InputDim(ctx, TOPK_IDX, 0),
                       ReduceOf(StrAttr(ctx, REDUCE)), Attr<bool>(ctx, WEIGHTED));
}

ge::graphStatus CombineTilingFunc(gert::TilingContext* ctx) {
  return SaveTiling(ctx, "UbepCombine", StrAttr(ctx, GROUP), Attr<int64_t>(ctx, N_WORKERS),
                    [&] { return TilingOf(ctx); });
}

ge::graphStatus CombineInferShape(gert::InferShapeContext* ctx) {
  return InferShapes(ctx, "UbepCombine", [&] { return CombineShapes(TilingOf(ctx)); });
}

// y as the rows.
ge::graphStatus CombineInferDataType(gert::InferDataTypeContext* ctx) {
  return InferDataTypes(ctx, ROWS, {ge::DT_UNDEFINED, ge::DT_UINT8});
}

}  // namespace
}  // namespace ubep_ascend::mc2

namespace ops {

class UbepCombine : public OpDef {
 public:
  explicit UbepCombine(const char* name) : OpDef(name) {
    using ubep_ascend::mc2::Columns;
    const auto rows = ubep_ascend::mc2::RowColumns();
    const auto nd = ubep_ascend::mc2::NdColumns();
    this->Input("rows").ParamType(REQUIRED).DataType(rows).Format(nd);
    this->Input("topk_idx").ParamType(REQUIRED).DataType(Columns(ge::DT_INT64)).Format(nd);
    this->Input("topk_weights").ParamType(REQUIRED).DataType(Columns(ge::DT_FLOAT)).Format(nd);
    this->Input("recv_rows").ParamType(REQUIRED).DataType(Columns(ge::DT_INT32)).Format(nd);
    this->Input("recv_pair_weights").ParamType(REQUIRED).DataType(Columns(ge::DT_FLOAT)).Format(nd);
    this->Input("recv_pair_base").ParamType(REQUIRED).DataType(Columns(ge::DT_INT32)).Format(nd);
    this->Input("recv_counts").ParamType(REQUIRED).DataType(Columns(ge::DT_INT32)).Format(nd);
    this->Output("y").ParamType(REQUIRED).DataType(rows).Format(nd);
    this->Output("scratch").ParamType(REQUIRED).DataType(Columns(ge::DT_UINT8)).Format(nd);
    this->Attr("group").AttrType(REQUIRED).String();
    this->Attr("world").AttrType(REQUIRED).Int();
    this->Attr("rank").AttrType(REQUIRED).Int();
    this->Attr("num_experts").AttrType(REQUIRED).Int();
    this->Attr("hidden").AttrType(REQUIRED).Int();
    this->Attr("dtype").AttrType(REQUIRED).Int();
    this->Attr("reduce").AttrType(REQUIRED).String();
    this->Attr("weighted").AttrType(REQUIRED).Bool();
    this->Attr("sync").AttrType(REQUIRED).String();
    this->Attr("call_code").AttrType(REQUIRED).Int();
    this->Attr("n_workers").AttrType(REQUIRED).Int();
    this->Attr("timeout_s").AttrType(REQUIRED).Float();
    ubep_ascend::mc2::FinishOpDef(*this, ubep_ascend::mc2::CombineTilingFunc,
                                  ubep_ascend::mc2::CombineInferShape,
                                  ubep_ascend::mc2::CombineInferDataType);
  }
};

OP_ADD(UbepCombine);

}  // namespace ops
