// Shared by the node agent's unit tests: a fresh directory under /tmp, removed with everything in it at the end of
// the scope.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <string>

namespace railyard::node_agent::testing {

struct TempDir {
  std::string path;
  // prefix: names the test in the directory's name (/tmp/PREFIX-XXXXXX).
  explicit TempDir(const std::string& prefix) {
    std::string tmpl = "/tmp/" + prefix + "-XXXXXX";
    path = ::mkdtemp(tmpl.data());
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

}  // namespace railyard::node_agent::testing
