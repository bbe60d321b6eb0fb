// The op's tiling as the twin build declares it (op_host/op_tiling.h with UBEP_CPU_TWIN): compiling
// this file is the check (its static_asserts pin Mc2InitTiling / Mc2CcTiling to 64 / 512 bytes and
// EpTiling to byte 576, the MC2 layout); at run time it also checks that the struct is the three parts
// and nothing else.
#include <cstdio>

#include "op_tiling.h"

int main() {
  const bool ok = sizeof(ubep_ascend::EpOpTiling) == 576 + sizeof(ubep_ascend::EpTiling);
  std::printf("%s EpOpTiling: %zu bytes, EpTiling at 576\n", ok ? "PASS" : "FAIL", sizeof(ubep_ascend::EpOpTiling));
  return ok ? 0 : 1;
}
