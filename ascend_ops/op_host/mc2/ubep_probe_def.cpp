// The MC2 op UbepProbe (CANN only, never compiled), laid out as UbepPrepare: the tear-free write
// probe (op_kernel/probe_kernel.cpp, ubep_probe) on the windows of the "group" attribute's HCCL
// group. Its attributes are the preparation's for the probe's layer (ubep/backends/ascend_probe.py)
// and the probe's rounds and blocks; the input `token` is the preparation's.
#include "ep_mc2.h"

namespace ubep_ascend::mc2 {
namespace {

enum ProbeAttr : size_t {
  GROUP, WORLD, RANK, HIDDEN, NUM_EXPERTS, TOP_K, MAX_TOKENS, DTYPE, N_WORKERS, TIMEOUT_S, ROUNDS, BLOCKS
};

template <class Context>
EpTiling TilingOf(const Context* ctx) {
  const PrepareAttrs p{Attr<int64_t>(ctx, WORLD),       Attr<int64_t>(ctx, RANK),
                       Attr<int64_t>(ctx, HIDDEN),      Attr<int64_t>(ctx, NUM_EXPERTS),
                       Attr<int64_t>(ctx, TOP_K),       Attr<int64_t>(ctx, MAX_TOKENS),
                       static_cast<RowDtype>(Attr<int64_t>(ctx, DTYPE)), "sw",
                       Attr<int64_t>(ctx, N_WORKERS),   Attr<float>(ctx, TIMEOUT_S)};
  return ProbeTiling(p, Attr<int64_t>(ctx, ROUNDS), Attr<int64_t>(ctx, BLOCKS));
}

ge::graphStatus ProbeTilingFunc(gert::TilingContext* ctx) {
  return SaveTiling(ctx, "UbepProbe", StrAttr(ctx, GROUP), Attr<int64_t>(ctx, N_WORKERS),
                    [&] { return TilingOf(ctx); });
}

ge::graphStatus ProbeInferShape(gert::InferShapeContext* ctx) {
  return InferShapes(ctx, "UbepProbe", [&] { return ProbeShapes(TilingOf(ctx), Attr<int64_t>(ctx, N_WORKERS)); });
}

ge::graphStatus ProbeInferDataType(gert::InferDataTypeContext* ctx) {
  return InferDataTypes(ctx, 0, {ge::DT_INT64, ge::DT_UINT8});
}

}  // namespace
}  // namespace ubep_ascend::mc2

namespace ops {

class UbepProbe : public OpDef {
 public:
  explicit UbepProbe(const char* name) : OpDef(name) {
    using ubep_ascend::mc2::Columns;
    const auto nd = ubep_ascend::mc2::NdColumns();
    this->Input("token").ParamType(REQUIRED).DataType(Columns(ge::DT_INT64)).Format(nd);
    this->Output("counts").ParamType(REQUIRED).DataType(Columns(ge::DT_INT64)).Format(nd);
    this->Output("scratch").ParamType(REQUIRED).DataType(Columns(ge::DT_UINT8)).Format(nd);
    this->Attr("group").AttrType(REQUIRED).String();
    this->Attr("world").AttrType(REQUIRED).Int();
    this->Attr("rank").AttrType(REQUIRED).Int();
    this->Attr("hidden").AttrType(REQUIRED).Int();
    this->Attr("num_experts").AttrType(REQUIRED).Int();
    this->Attr("top_k").AttrType(REQUIRED).Int();
    this->Attr("max_tokens").AttrType(REQUIRED).Int();
    this->Attr("dtype").AttrType(REQUIRED).Int();
    this->Attr("n_workers").AttrType(REQUIRED).Int();
    this->Attr("timeout_s").AttrType(REQUIRED).Float();
    this->Attr("rounds").AttrType(REQUIRED).Int();
    this->Attr("blocks").AttrType(REQUIRED).Int();
    ubep_ascend::mc2::FinishOpDef(*this, ubep_ascend::mc2::ProbeTilingFunc,
                                  ubep_ascend::mc2::ProbeInferShape,
                                  ubep_ascend::mc2::ProbeInferDataType);
  }
};

OP_ADD(UbepProbe);

}  // namespace ops
