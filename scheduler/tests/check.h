// Minimal checks for the twin's tests: compare, count, report, exit non-zero on any failure.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

struct Checks {
  int passed = 0, failed = 0;
  void equal(const std::vector<int64_t>& got, const std::vector<int64_t>& want, const std::string& what) {
    if (got == want) { ++passed; return; }
    ++failed;
    std::printf("FAIL %s: got", what.c_str());
    for (auto v : got) std::printf(" %lld", (long long)v);
    std::printf(" | want");
    for (auto v : want) std::printf(" %lld", (long long)v);
    std::printf("\n");
  }
  void equal(int64_t got, int64_t want, const std::string& what) {
    equal(std::vector<int64_t>{got}, std::vector<int64_t>{want}, what);
  }
  int report(const char* suite) const {
    std::printf("%s: %d passed, %d failed\n", suite, passed, failed);
    return failed ? 1 : 0;
  }
};
