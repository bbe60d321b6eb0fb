// How the strict twin names what went wrong: the AIV (die and block), call sites captured with
// std::source_location on every API function, and an abort with the message on stderr.
#pragma once

#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <source_location>
#include <string>
#include <tuple>
#include <vector>

namespace AscendC {
namespace twin {

using Loc = std::source_location;

// This process's die (its rank in the HCCL group), -1 when the launcher did not say.
inline int64_t die_rank = -1;
// The AIV this thread runs, -1 outside a launch.
inline thread_local int64_t tl_block = -1;
inline thread_local int64_t tl_blocks = 0;

inline std::string Who() {
  char b[96];
  if (tl_block < 0) return "host thread (outside a launch)";
  if (die_rank >= 0) {
    std::snprintf(b, sizeof b, "die %" PRId64 ", AIV %" PRId64 " of %" PRId64, die_rank, tl_block, tl_blocks);
  } else {
    std::snprintf(b, sizeof b, "die ?, AIV %" PRId64 " of %" PRId64, tl_block, tl_blocks);
  }
  return b;
}

inline std::string Format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
inline std::string Format(const char* fmt, ...) {
  char b[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(b, sizeof b, fmt, ap);
  va_end(ap);
  return b;
}

inline std::string Where(const Loc& l) { return Format("%s:%u", l.file_name(), static_cast<unsigned>(l.line())); }

// One line per problem on stderr, then abort: a strict twin stops at the first thing the chip
// would get wrong. Serialized so that two AIVs failing at once do not interleave.
inline std::mutex& ReportMutex() {
  static std::mutex m;
  return m;
}
[[noreturn]] inline void Fail(const std::string& what) {
  {
    std::lock_guard<std::mutex> g(ReportMutex());
    std::fprintf(stderr, "ascend twin (strict), %s: %s\n", Who().c_str(), what.c_str());
    std::fflush(stderr);
  }
  std::abort();
}
inline void Warn(const std::string& what) {
  std::lock_guard<std::mutex> g(ReportMutex());
  std::fprintf(stderr, "ascend twin (strict) warning, %s: %s\n", Who().c_str(), what.c_str());
}

// A call site: the API and where the kernel called it. Sites are interned process-wide so that
// the race checker's shadow memory stores 4 bytes per access instead of the strings.
struct Site {
  const char* api;
  const char* file;
  uint32_t line;
};

class Sites {
 public:
  static uint32_t Intern(const char* api, const Loc& l) {
    thread_local std::map<std::tuple<const char*, const char*, uint32_t>, uint32_t> cache;
    const auto key = std::make_tuple(api, l.file_name(), static_cast<uint32_t>(l.line()));
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
    Sites& s = Get();
    std::lock_guard<std::mutex> g(s.mutex_);
    auto [pos, added] = s.ids_.emplace(key, static_cast<uint32_t>(s.sites_.size()));
    if (added) s.sites_.push_back({api, l.file_name(), static_cast<uint32_t>(l.line())});
    cache.emplace(key, pos->second);
    return pos->second;
  }
  static Site At(uint32_t id) {
    Sites& s = Get();
    std::lock_guard<std::mutex> g(s.mutex_);
    return id < s.sites_.size() ? s.sites_[id] : Site{"?", "?", 0};
  }
  static std::string Describe(uint32_t id) {
    const Site s = At(id);
    return Format("%s at %s:%u", s.api, s.file, s.line);
  }

 private:
  static Sites& Get() {
    static Sites s;
    return s;
  }
  std::mutex mutex_;
  std::map<std::tuple<const char*, const char*, uint32_t>, uint32_t> ids_;
  std::vector<Site> sites_;
};

}  // namespace twin
}  // namespace AscendC
