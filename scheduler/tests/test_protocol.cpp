// The C++ Data-as-Flag twin reproduces tests/vectors/protocol.json (made by ubep.protocol).
#include <cstdint>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "check.h"
#include "json.h"
#include "ubep/protocol.h"

namespace {

std::vector<int64_t> hex(const std::string& s) {
  std::vector<int64_t> out;
  for (size_t i = 0; i + 1 < s.size(); i += 2) out.push_back(std::stoi(s.substr(i, 2), nullptr, 16));
  return out;
}

std::vector<uint8_t> bytes_of(const json::Value& rows) {
  std::vector<uint8_t> out;
  for (const auto& r : rows.a) {
    for (auto b : hex(r.s)) out.push_back(static_cast<uint8_t>(b));
  }
  return out;
}

std::vector<int64_t> ints(const uint8_t* p, size_t n) { return std::vector<int64_t>(p, p + n); }

ubep::WireFormat format_of(const json::Value& f, const json::Value& sentinels) {
  const std::string mode = f["mode"].s, dtype = f["dtype"].s;
  ubep::WireFormat out{};
  out.mode = mode == "sw" ? ubep::Mode::SW : mode == "tff" ? ubep::Mode::TFF
             : mode == "dc" ? ubep::Mode::DC : ubep::Mode::SP;
  out.element_bytes = dtype == "float32" ? 4 : 2;
  out.hidden = f["hidden"].i;
  out.block_bytes = f["block_bytes"].i;
  out.flag_bytes = f["flag_bytes"].i;
  out.sentinel = static_cast<uint32_t>(std::stoul(sentinels[dtype][f["sentinel_index"].i].s, nullptr, 16));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const json::Value root = json::load(argc > 1 ? argv[1] : "tests/vectors/protocol.json");
  const json::Value& sentinels = root["sentinels"];
  Checks checks;
  for (const auto& pair : root["fmix32"].a) {
    checks.equal(ubep::fmix32(static_cast<uint32_t>(pair[0].u)), static_cast<int64_t>(pair[1].u),
                 "fmix32 " + std::to_string(pair[0].u));
  }
  for (const auto& c : root["encode"].a) {
    const ubep::WireFormat f = format_of(c["format"], sentinels);
    const std::vector<uint8_t> rows = bytes_of(c["rows"]);
    const int64_t n = c["rows"].a.size();
    std::vector<uint8_t> wire(n * f.row_stride()), record(ubep::RECORD_BYTES);
    const bool has_record = ubep::encode_batch(f, rows.data(), n, c["epoch"].u, wire.data(), record.data());
    const std::vector<uint8_t> want = bytes_of(c["wire"]);
    checks.equal(ints(wire.data(), wire.size()), ints(want.data(), want.size()), c["name"].s + " wire");
    const bool want_record = c["record"].kind != json::Value::Null;
    checks.equal(has_record, want_record, c["name"].s + " has record");
    if (want_record) {
      checks.equal(ints(record.data(), record.size()), hex(c["record"].s), c["name"].s + " record");
    }
  }
  for (const auto& c : root["verify"].a) {
    const ubep::WireFormat f = format_of(c["format"], sentinels);
    const std::vector<uint8_t> wire = bytes_of(c["wire"]);
    const int64_t n = c["wire"].a.size();
    std::vector<uint8_t> record(ubep::RECORD_BYTES, 0);
    if (c["record"].kind != json::Value::Null) {
      const auto r = hex(c["record"].s);
      for (size_t i = 0; i < r.size(); ++i) record[i] = static_cast<uint8_t>(r[i]);
    }
    std::unique_ptr<bool[]> arrived(new bool[n]);
    ubep::arrived_rows(f, wire.data(), n, record.data(), c["epoch"].u, arrived.get());
    std::vector<int64_t> got, want;
    for (int64_t r = 0; r < n; ++r) {
      got.push_back(arrived[r]);
      want.push_back(c["arrived_rows"][r].b);
    }
    checks.equal(got, want, c["name"].s + " arrived_rows");
    if (c["decoded"].kind == json::Value::Array) {
      std::vector<uint8_t> scratch(wire.size()), rows(n * f.row_bytes());
      ubep::decode(f, wire.data(), n, c["epoch"].u, scratch.data(), rows.data());
      const std::vector<uint8_t> want_rows = bytes_of(c["decoded"]);
      checks.equal(ints(rows.data(), rows.size()), ints(want_rows.data(), want_rows.size()),
                   c["name"].s + " decoded");
    }
  }
  for (const auto& c : root["efficiency"].a) {
    const ubep::WireFormat f = format_of(c["format"], sentinels);
    const int64_t rows = c["rows_per_batch"].i;
    const int64_t record = (f.mode == ubep::Mode::SW || f.mode == ubep::Mode::DC) ? ubep::RECORD_BYTES : 0;
    int64_t num = rows * f.row_bytes(), den = rows * f.row_stride() + record;
    const int64_t g = std::gcd(num, den);
    checks.equal({num / g, den / g}, c["ratio"].ints(), "efficiency " + c["format"]["mode"].s);
  }
  return checks.report("protocol twin");
}
