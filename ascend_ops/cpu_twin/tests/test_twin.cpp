// Checks of the kernels' per-row Data-as-Flag code (op_kernel/ep_common.h) against
// tests/vectors/protocol.json, and of the twin's own rules: atomic adds, SyncAll, Cast rounding.
#include <cstring>
#include <string>
#include <vector>

#include "../../../scheduler/tests/check.h"
#include "../../../scheduler/tests/json.h"
#include "ep_common.h"

namespace {

std::vector<uint8_t> hex(const std::string& s) {
  std::vector<uint8_t> out;
  for (size_t i = 0; i + 1 < s.size(); i += 2) out.push_back(static_cast<uint8_t>(std::stoi(s.substr(i, 2), nullptr, 16)));
  return out;
}

std::vector<int64_t> ints(const std::vector<uint8_t>& v) { return std::vector<int64_t>(v.begin(), v.end()); }

ubep::WireFormat format_of(const json::Value& f, const json::Value& sentinels) {
  const std::string mode = f["mode"].s, dtype = f["dtype"].s;
  ubep::WireFormat out{};
  out.mode = mode == "sw" ? ubep::Mode::SW : mode == "tff" ? ubep::Mode::TFF : mode == "dc" ? ubep::Mode::DC : ubep::Mode::SP;
  out.element_bytes = dtype == "float32" ? 4 : 2;
  out.hidden = f["hidden"].i;
  out.block_bytes = f["block_bytes"].i;
  out.flag_bytes = f["flag_bytes"].i;
  out.sentinel = static_cast<uint32_t>(std::stoul(sentinels[dtype][f["sentinel_index"].i].s, nullptr, 16));
  return out;
}

// Row by row, as the token AIVs encode: the wire, the sp record decision and the dc checksum.
void check_encode(const json::Value& c, const json::Value& sentinels, Checks& checks) {
  const ubep::WireFormat f = format_of(c["format"], sentinels);
  const uint64_t epoch = c["epoch"].u;
  std::vector<uint8_t> wire, block(f.row_stride());
  uint32_t lanes[2] = {0, 0};
  bool collide = false;
  for (size_t r = 0; r < c["rows"].a.size(); ++r) {
    const std::vector<uint8_t> row = hex(c["rows"][r].s);
    collide |= ubep_ascend::EncodeRow(f, row.data(), static_cast<int64_t>(r), epoch, block.data(), lanes);
    wire.insert(wire.end(), block.begin(), block.end());
  }
  std::vector<uint8_t> want;
  for (const auto& r : c["wire"].a) {
    const auto b = hex(r.s);
    want.insert(want.end(), b.begin(), b.end());
  }
  checks.equal(ints(wire), ints(want), c["name"].s + " wire");
  const bool has_record = c["record"].kind != json::Value::Null;
  if (f.mode == ubep::Mode::SP) checks.equal(collide, has_record, c["name"].s + " sp record needed");
  if (f.mode == ubep::Mode::DC) {
    const uint64_t sum = ubep_ascend::ChecksumOf(f, lanes, static_cast<int64_t>(c["rows"].a.size()), epoch);
    checks.equal(static_cast<int64_t>(sum), static_cast<int64_t>(ubep::load_u64(hex(c["record"].s).data() + 8)),
                 c["name"].s + " dc checksum from lanes");
  }
}

// Receiver side: per-row arrival (tff, sp without a record) and row decoding.
void check_verify(const json::Value& c, const json::Value& sentinels, Checks& checks) {
  const ubep::WireFormat f = format_of(c["format"], sentinels);
  const uint64_t epoch = c["epoch"].u;
  const bool complete = c["decoded"].kind == json::Value::Array;
  const bool per_row = f.mode == ubep::Mode::TFF || (f.mode == ubep::Mode::SP && c["record"].kind == json::Value::Null);
  for (size_t r = 0; r < c["wire"].a.size(); ++r) {
    std::vector<uint8_t> wire = hex(c["wire"][r].s), row(f.row_bytes());
    if (per_row) {
      checks.equal(ubep_ascend::RowArrived(f, wire.data(), epoch), c["arrived_rows"][r].b,
                   c["name"].s + " row arrived");
    }
    if (complete) {
      ubep_ascend::DecodeRow(f, wire.data(), static_cast<int64_t>(r), epoch, row.data());
      checks.equal(ints(row), ints(hex(c["decoded"][r].s)), c["name"].s + " decoded row");
    }
  }
}

void check_twin(Checks& checks) {
  int32_t counter[8] = {0};
  std::atomic<int> after_barrier{0};
  bool barrier_held = true;
  AscendC::twin::launch(6, [&] {
    AscendC::TPipe pipe;
    AscendC::TBuf<AscendC::TPosition::VECCALC> buf;
    pipe.InitBuffer(buf, 32);
    AscendC::GlobalTensor<int32_t> g;
    g.SetGlobalBuffer(counter, 8);
    AscendC::LocalTensor<int32_t> one = buf.Get<int32_t>();
    AscendC::Duplicate<int32_t>(one, 0, 8);
    one.SetValue(0, 1);
    AscendC::SetAtomicAdd<int32_t>();
    for (int i = 0; i < 500; ++i) AscendC::DataCopy(g, one, 8);
    AscendC::SetAtomicNone();
    AscendC::SyncAll();
    if (g.GetValue(0) != 6 * 500) barrier_held = false;
    ++after_barrier;
  });
  checks.equal(counter[0], 3000, "SetAtomicAdd DataCopy from 6 AIVs");
  checks.equal(barrier_held && after_barrier == 6, true, "SyncAll waits for every AIV");
  const uint32_t in[] = {0x3F800000u, 0x3F808000u, 0x3F818000u, 0x3F818001u, 0x7FC00001u};
  const int64_t want[] = {0x3F80, 0x3F80, 0x3F82, 0x3F82, 0x7FC0};
  for (int i = 0; i < 5; ++i) {
    float f;
    std::memcpy(&f, &in[i], 4);
    checks.equal(AscendC::twin::from_float<bfloat16_t>(f).bits, want[i], "bf16 round to nearest even " + std::to_string(i));
  }
}

}  // namespace

int main(int argc, char** argv) {
  const json::Value root = json::load(argc > 1 ? argv[1] : "tests/vectors/protocol.json");
  Checks checks;
  for (const auto& c : root["encode"].a) check_encode(c, root["sentinels"], checks);
  for (const auto& c : root["verify"].a) check_verify(c, root["sentinels"], checks);
  check_twin(checks);
  return checks.report("ascend twin");
}
