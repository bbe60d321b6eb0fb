// The kernels' per-row Data-as-Flag code (op_kernel/ep_wire.h) against tests/vectors/protocol.json,
// run as it runs on an AIV: inside a launch of the strict twin (cpu_twin/strict), the rows copied
// into UB, encoded or decoded there (payloads by the vector unit, flags by the scalar), and copied
// out, with every pipe hand-off synchronized (the twin aborts on a missing one). Encoding and
// decoding take the formats the vector can carry (the kernels' 512-byte blocks); the arrival
// checks take every format.
#include <cstring>
#include <string>
#include <vector>

#include "../../../scheduler/tests/check.h"
#include "../../../scheduler/tests/json.h"
#include "ep_sync.h"
#include "ep_wire.h"

namespace {

using AscendC::HardEvent;
using AscendC::LocalTensor;
using ubep_ascend::RoundUp32;
using ubep_ascend::Sync;

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

// One AIV with two UB buffers: `in` (in_bytes) and `out` (out_bytes).
struct Ub {
  AscendC::TPipe pipe;
  AscendC::TBuf<AscendC::TPosition::VECCALC> in_buf, out_buf;
  LocalTensor<uint8_t> in, out;
  Ub(int64_t in_bytes, int64_t out_bytes) {
    pipe.InitBuffer(in_buf, static_cast<uint32_t>(RoundUp32(in_bytes)));
    pipe.InitBuffer(out_buf, static_cast<uint32_t>(RoundUp32(out_bytes)));
    in = in_buf.Get<uint8_t>();
    out = out_buf.Get<uint8_t>();
  }
};

// Every row through EncodeRow, as a token AIV sends them: the wire, the sp record decision and the
// dc lanes (returned through `lanes`).
bool encode(const ubep::WireFormat& f, std::vector<uint8_t>& rows, uint64_t epoch, std::vector<uint8_t>& wire,
            uint32_t* lanes) {
  const int64_t n = static_cast<int64_t>(rows.size()) / f.row_bytes();
  wire.assign(n * f.row_stride(), 0);
  bool collide = false;
  AscendC::twin::launch(1, [&] {
    Ub ub(f.row_bytes(), f.row_stride());
    for (int64_t r = 0; r < n; ++r) {
      if (r > 0) Sync<HardEvent::S_MTE2>();  // the last row's encode (V, then the scalar) has read `in`
      ubep_ascend::CopyIn(ub.in, ubep_ascend::Gm<uint8_t>(rows.data() + r * f.row_bytes(), f.row_bytes()),
                          f.row_bytes());
      Sync<HardEvent::MTE2_V>();
      if (r > 0) Sync<HardEvent::MTE3_V>();  // the last row's copy-out has read `out`
      collide |= ubep_ascend::EncodeRow(f, ub.in, r, epoch, ub.out, lanes);
      Sync<HardEvent::S_MTE3>();
      ubep_ascend::CopyOut(ubep_ascend::Gm<uint8_t>(wire.data() + r * f.row_stride(), f.row_stride()), ub.out,
                           f.row_stride());
    }
  });
  return collide;
}

// Row r of the wire: whether it has arrived (tff, sp) and, when `decode`, the row it carries.
bool take(const ubep::WireFormat& f, std::vector<uint8_t>& wire, int64_t r, uint64_t epoch, bool decode,
          std::vector<uint8_t>& row) {
  row.assign(f.row_bytes(), 0);
  bool arrived = false;
  AscendC::twin::launch(1, [&] {
    Ub ub(f.row_stride(), f.row_bytes());
    ubep_ascend::CopyIn(ub.in, ubep_ascend::Gm<uint8_t>(wire.data(), f.row_stride()), f.row_stride());
    Sync<HardEvent::MTE2_S>();
    arrived = ubep_ascend::RowArrived(f, ub.in, epoch);
    if (!decode) return;
    ubep_ascend::DecodeRow(f, ub.in, r, epoch, ub.out);
    Sync<HardEvent::S_MTE3>();
    ubep_ascend::CopyOut(ubep_ascend::Gm<uint8_t>(row.data(), f.row_bytes()), ub.out, f.row_bytes());
  });
  return arrived;
}

// Encodes the case's rows and decodes them back; false (nothing checked) for a format the kernels'
// vector copies cannot carry.
bool check_encode(const json::Value& c, const json::Value& sentinels, Checks& checks) {
  const ubep::WireFormat f = format_of(c["format"], sentinels);
  const uint64_t epoch = c["epoch"].u;
  std::vector<uint8_t> rows, wire, want;
  for (const auto& r : c["rows"].a) {
    const auto b = hex(r.s);
    rows.insert(rows.end(), b.begin(), b.end());
  }
  for (const auto& r : c["wire"].a) {
    const auto b = hex(r.s);
    want.insert(want.end(), b.begin(), b.end());
  }
  if (!ubep_ascend::VectorFormat(f)) return false;
  uint32_t lanes[2] = {0, 0};
  const bool collide = encode(f, rows, epoch, wire, lanes);
  checks.equal(ints(wire), ints(want), c["name"].s + " wire");
  const bool has_record = c["record"].kind != json::Value::Null;
  if (f.mode == ubep::Mode::SP) checks.equal(collide, has_record, c["name"].s + " sp record needed");
  if (f.mode == ubep::Mode::DC) {
    const uint64_t sum = ubep_ascend::ChecksumOf(f, lanes, static_cast<int64_t>(c["rows"].a.size()), epoch);
    checks.equal(static_cast<int64_t>(sum), static_cast<int64_t>(ubep::load_u64(hex(c["record"].s).data() + 8)),
                 c["name"].s + " dc checksum from lanes");
  }
  for (size_t r = 0; r < c["rows"].a.size(); ++r) {
    std::vector<uint8_t> one(want.begin() + r * f.row_stride(), want.begin() + (r + 1) * f.row_stride()), row;
    const bool arrived = take(f, one, static_cast<int64_t>(r), epoch, true, row);
    if (f.mode == ubep::Mode::TFF) checks.equal(arrived, true, c["name"].s + " row arrived");
    checks.equal(ints(row), ints(hex(c["rows"][r].s)), c["name"].s + " decoded row");
  }
  return true;
}

// Receiver side: per-row arrival (tff, sp without a record) and row decoding.
void check_verify(const json::Value& c, const json::Value& sentinels, Checks& checks) {
  const ubep::WireFormat f = format_of(c["format"], sentinels);
  const uint64_t epoch = c["epoch"].u;
  const bool complete = c["decoded"].kind == json::Value::Array;
  const bool per_row = f.mode == ubep::Mode::TFF || (f.mode == ubep::Mode::SP && c["record"].kind == json::Value::Null);
  for (size_t r = 0; r < c["wire"].a.size(); ++r) {
    std::vector<uint8_t> wire = hex(c["wire"][r].s), row;
    const bool arrived = take(f, wire, static_cast<int64_t>(r), epoch, complete && ubep_ascend::VectorFormat(f), row);
    if (per_row) checks.equal(arrived, c["arrived_rows"][r].b, c["name"].s + " row arrived");
    if (complete && ubep_ascend::VectorFormat(f)) {
      checks.equal(ints(row), ints(hex(c["decoded"][r].s)), c["name"].s + " decoded row");
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const json::Value root = json::load(argc > 1 ? argv[1] : "tests/vectors/protocol.json");
  Checks checks;
  int64_t encoded = 0;
  for (const auto& c : root["encode"].a) encoded += check_encode(c, root["sentinels"], checks) ? 1 : 0;
  checks.equal(encoded >= 15, true, "cases in the kernels' geometry (4 modes and sp collisions, 3 dtypes)");
  for (const auto& c : root["verify"].a) check_verify(c, root["sentinels"], checks);
  return checks.report("ascend wire code on the strict twin");
}
