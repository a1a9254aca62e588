// The scratch directory under the tests' own TempDir helpers (tests/unit/checkpoint/test_util.h,
// tests/unit/worker_data/test_util.h, tests/unit/node_agent/temp_dir.h, tests/e2e/agent/agent_test_util.h): a fresh
// directory PARENT/PREFIX-XXXXXX from mkdtemp, removed with everything in it at the end of the scope.
#pragma once

#include <stdlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <system_error>

namespace railyard::test {

class ScopedTempDir {
 public:
  // Throws naming the template when mkdtemp fails (the test then fails before it uses the directory).
  explicit ScopedTempDir(const std::string& prefix,
                         const std::filesystem::path& parent = std::filesystem::temp_directory_path()) {
    std::string tmpl = (parent / (prefix + "-XXXXXX")).string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp " + tmpl + ": " + std::strerror(errno));
    dir_ = tmpl;
  }
  // Errors ignored: a destructor must not throw, and whatever failed is the test's to report.
  ~ScopedTempDir() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  ScopedTempDir(const ScopedTempDir&) = delete;
  ScopedTempDir& operator=(const ScopedTempDir&) = delete;
  const std::filesystem::path& dir() const { return dir_; }

 private:
  std::filesystem::path dir_;
};

}  // namespace railyard::test
