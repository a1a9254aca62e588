// Shared by the node agent's unit tests: a fresh directory under /tmp, removed with everything in it at the end of
// the scope.
#pragma once

#include <string>

#include "tests/temp_dir.h"

namespace railyard::node_agent::testing {

struct TempDir : railyard::test::ScopedTempDir {
  // prefix: names the test in the directory's name (/tmp/PREFIX-XXXXXX).
  explicit TempDir(const std::string& prefix) : ScopedTempDir(prefix, "/tmp"), path(dir().string()) {}
  const std::string path;
};

}  // namespace railyard::node_agent::testing
