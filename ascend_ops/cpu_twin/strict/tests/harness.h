// The strict twin's test harness: every case runs in a forked child (the twin aborts the process
// on the first violation), and the parent checks how the child ended and what it printed.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>

#include "kernel_operator.h"

namespace strict_test {

struct Outcome {
  int status = 0;
  std::string err;
  bool ok() const { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }
  bool signaled(int sig) const { return WIFSIGNALED(status) && WTERMSIG(status) == sig; }
};

// Runs body in a child process; its stderr is captured.
inline Outcome RunChild(const std::function<void()>& body) {
  int fds[2];
  if (pipe(fds) != 0) std::abort();
  std::fflush(stdout);
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    dup2(fds[1], 2);
    body();
    std::fflush(stderr);
    _exit(0);
  }
  close(fds[1]);
  Outcome o;
  char buf[4096];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof buf)) > 0) o.err.append(buf, static_cast<size_t>(n));
  close(fds[0]);
  waitpid(pid, &o.status, 0);
  return o;
}

class Suite {
 public:
  explicit Suite(const char* name) : name_(name) {}

  // The kernel must run to the end without a report.
  void Passes(const std::string& what, const std::function<void()>& body) {
    const Outcome o = RunChild(body);
    Record(what, o.ok() && o.err.find("ascend twin (strict),") == std::string::npos, o);
  }
  // The twin must abort, and its report must contain every one of `needles`.
  void Aborts(const std::string& what, const std::function<void()>& body, std::initializer_list<const char*> needles) {
    const Outcome o = RunChild(body);
    bool ok = o.signaled(SIGABRT);
    for (const char* n : needles) ok = ok && o.err.find(n) != std::string::npos;
    Record(what, ok, o);
  }
  // The child must die of `sig` (e.g. SIGSEGV for a UB offset used as a pointer).
  void Dies(const std::string& what, int sig, const std::function<void()>& body) {
    const Outcome o = RunChild(body);
    Record(what, o.signaled(sig), o);
  }
  void Check(const std::string& what, bool ok) {
    Record(what, ok, Outcome{});
  }
  int Report() const {
    std::printf("%s: %d passed, %d failed\n", name_, passed_, failed_);
    return failed_ ? 1 : 0;
  }

 private:
  void Record(const std::string& what, bool ok, const Outcome& o) {
    if (ok) {
      ++passed_;
      std::printf("ok   %s\n", what.c_str());
      return;
    }
    ++failed_;
    std::printf("FAIL %s (exit status 0x%x)\n  child stderr: %s\n", what.c_str(), o.status, o.err.c_str());
  }
  const char* name_;
  int passed_ = 0, failed_ = 0;
};

// GM for a test: 64-byte aligned, as HBM allocations are.
template <typename T, size_t N>
struct alignas(64) Gm {
  T v[N] = {};
  __gm__ T* ptr() { return (__gm__ T*)v; }
  __gm__ uint8_t* bytes() { return (__gm__ uint8_t*)v; }
};

}  // namespace strict_test
