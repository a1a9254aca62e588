// Shared by the agent's process-level tests (agent_process_test, agent_train_test, torchrun_launch_test): a scratch
// directory and reading back what the processes wrote.
#pragma once

#include <doctest/doctest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "tests/temp_dir.h"

namespace railyard::agent_testing {

// A fresh directory /tmp/PREFIX-XXXXXX, removed with everything in it at the end of the scope.
struct TempDir : railyard::test::ScopedTempDir {
  explicit TempDir(const std::string& prefix) : ScopedTempDir(prefix, "/tmp"), path(dir()) {}
  const std::filesystem::path path;
};

// The whole file (empty when it cannot be read).
inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace railyard::agent_testing
