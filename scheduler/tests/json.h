// A small JSON reader for the shared test vectors: objects, arrays, strings without escapes,
// integers (int64, or uint64 when positive), numbers with a fraction or exponent (double), true,
// false, null. Host-only test code.
#pragma once

#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace json {

struct Value {
  enum Kind { Null, Bool, Int, Double, String, Array, Object } kind = Null;
  bool b = false;
  int64_t i = 0;
  uint64_t u = 0;
  double d = 0.0;
  std::string s;
  std::vector<Value> a;
  std::map<std::string, Value> o;

  const Value& operator[](const std::string& key) const {
    auto it = o.find(key);
    if (it == o.end()) throw std::runtime_error("missing key " + key);
    return it->second;
  }
  const Value& operator[](size_t index) const { return a.at(index); }
  std::vector<int64_t> ints() const {
    std::vector<int64_t> out;
    for (const auto& v : a) out.push_back(v.i);
    return out;
  }
  std::vector<int64_t> flat_ints() const {  // a nested array of integers, row-major
    std::vector<int64_t> out;
    for (const auto& v : a) {
      if (v.kind == Array) {
        auto inner = v.flat_ints();
        out.insert(out.end(), inner.begin(), inner.end());
      } else {
        out.push_back(v.i);
      }
    }
    return out;
  }
};

class Parser {
 public:
  explicit Parser(std::string text) : t_(std::move(text)) {}
  Value parse() {
    Value v = value();
    space();
    if (p_ != t_.size()) fail("trailing characters");
    return v;
  }

 private:
  std::string t_;
  size_t p_ = 0;

  [[noreturn]] void fail(const std::string& what) {
    throw std::runtime_error("json: " + what + " at byte " + std::to_string(p_));
  }
  void space() {
    while (p_ < t_.size() && (t_[p_] == ' ' || t_[p_] == '\n' || t_[p_] == '\t' || t_[p_] == '\r')) ++p_;
  }
  bool eat(char c) {
    space();
    if (p_ < t_.size() && t_[p_] == c) { ++p_; return true; }
    return false;
  }
  std::string string() {
    if (!eat('"')) fail("expected a string");
    size_t end = t_.find('"', p_);
    if (end == std::string::npos) fail("unterminated string");
    std::string s = t_.substr(p_, end - p_);
    if (s.find('\\') != std::string::npos) fail("escapes are not supported");
    p_ = end + 1;
    return s;
  }
  Value value() {
    space();
    Value v;
    if (p_ >= t_.size()) fail("unexpected end");
    char c = t_[p_];
    if (c == '{') {
      ++p_;
      v.kind = Value::Object;
      if (eat('}')) return v;
      do {
        std::string key = string();
        if (!eat(':')) fail("expected ':'");
        v.o[key] = value();
      } while (eat(','));
      if (!eat('}')) fail("expected '}'");
    } else if (c == '[') {
      ++p_;
      v.kind = Value::Array;
      if (eat(']')) return v;
      do { v.a.push_back(value()); } while (eat(','));
      if (!eat(']')) fail("expected ']'");
    } else if (c == '"') {
      v.kind = Value::String;
      v.s = string();
    } else if (t_.compare(p_, 4, "true") == 0) {
      v.kind = Value::Bool; v.b = true; p_ += 4;
    } else if (t_.compare(p_, 5, "false") == 0) {
      v.kind = Value::Bool; p_ += 5;
    } else if (t_.compare(p_, 4, "null") == 0) {
      p_ += 4;
    } else if (const size_t end = t_.find_first_of(",]} \n\t\r", p_);
               t_.substr(p_, end - p_).find_first_of(".eE") != std::string::npos) {
      size_t used = 0;
      v.kind = Value::Double;
      v.d = std::stod(t_.substr(p_, end - p_), &used);  // correctly rounded: Python's repr round-trips
      if (used != end - p_) fail("bad number");
      p_ = end;
    } else {
      size_t used = 0;
      v.kind = Value::Int;
      if (c == '-') {
        v.i = std::stoll(t_.substr(p_, 24), &used);
        v.u = static_cast<uint64_t>(v.i);
      } else {
        v.u = std::stoull(t_.substr(p_, 24), &used);
        v.i = static_cast<int64_t>(v.u);
      }
      p_ += used;
    }
    return v;
  }
};

inline Value load(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw std::runtime_error("cannot open " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  return Parser(ss.str()).parse();
}

}  // namespace json
