// Whether HCCL's window holds ubep's: on an NPU each die's window is the windowsIn of the op's HCCL
// group, which HCCL sizes from the HCCL_BUFFSIZE environment variable (MB, default 200) when the
// process group is created. The torch op (before any communication) and the CANN ops' tiling
// functions both ask this; the CPU twin sizes its windows by it too. Plain C++.
#pragma once

#include <climits>
#include <cstdint>
#include <cstdlib>
#include <string>

namespace ubep_ascend {

constexpr int64_t HCCL_BUFFSIZE_DEFAULT_MB = 200;

// HCCL_BUFFSIZE in MB: hccl_buffsize is the variable's value, null when unset (HCCL's default, 200);
// -1 when it is not a whole number of MB >= 1.
inline int64_t HcclBuffsizeMb(const char* hccl_buffsize) {
  if (hccl_buffsize == nullptr) return HCCL_BUFFSIZE_DEFAULT_MB;
  char* end = nullptr;
  const long long parsed = std::strtoll(hccl_buffsize, &end, 10);
  if (end == hccl_buffsize || *end != '\0' || parsed < 1 || parsed > (INT64_MAX >> 20)) return -1;
  return parsed;
}

// "" when an HCCL window of HCCL_BUFFSIZE MB holds `window_bytes`, else what to set. GUESS: the op may
// use all of windowsIn, which HCCL sizes to HCCL_BUFFSIZE MB.
// Example: a 300 MiB window with HCCL_BUFFSIZE unset asks for HCCL_BUFFSIZE=300.
inline std::string HcclBufferProblem(int64_t window_bytes, const char* hccl_buffsize) {
  const int64_t mb = HcclBuffsizeMb(hccl_buffsize);
  if (mb < 0) return "HCCL_BUFFSIZE must be a whole number of MB >= 1, got '" + std::string(hccl_buffsize) + "'";
  const int64_t have = mb << 20;
  if (window_bytes <= have) return "";
  return "ubep's window needs " + std::to_string(window_bytes) + " bytes per rank, but HCCL_BUFFSIZE is " +
         std::to_string(mb) + " MB" + (hccl_buffsize ? "" : " (unset: HCCL's default)") + ", which gives " +
         std::to_string(have) + " bytes: set HCCL_BUFFSIZE=" + std::to_string((window_bytes + (1 << 20) - 1) >> 20) +
         " (MB) or more on every rank before the process group is created";
}

}  // namespace ubep_ascend
