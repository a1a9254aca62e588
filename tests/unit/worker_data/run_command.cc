#include <stdio.h>
#include <sys/wait.h>

#include <array>

#include "tests/unit/worker_data/test_util.h"

namespace railyard::test {

RunResult run_command(const std::string& command_line) {
  RunResult r;
  FILE* p = ::popen((command_line + " 2>&1").c_str(), "r");
  if (p == nullptr) throw std::runtime_error("popen failed: " + command_line);
  std::array<char, 4096> buf{};
  size_t n = 0;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
  const int status = ::pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

}  // namespace railyard::test
