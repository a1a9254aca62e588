// What ctest hands every test (cmake/railyard.cmake's railyard_test: RAILYARD_BIN_DIR, RAILYARD_SOURCE_DIR), read
// in one place. A test run by hand without them fails with a message naming the variable.
#pragma once

#include <cstdlib>
#include <stdexcept>
#include <string>

namespace railyard::test {

// $name as ctest sets it; throws naming it otherwise.
inline std::string ctest_env(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == 0) throw std::runtime_error(std::string(name) + " is not set: run this test through ctest");
  return v;
}

// $name as an e2e test's fixture sets it (ctest runs the fixture first); throws naming it and the fixture otherwise.
inline std::string fixture_env(const char* name, const char* fixture) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == 0) {
    throw std::runtime_error(std::string(name) + " is not set: run through ctest (the " + fixture +
                             " fixture sets it)");
  }
  return v;
}

// A built binary: $RAILYARD_BIN_DIR/name.
inline std::string bin_path(const char* name) { return ctest_env("RAILYARD_BIN_DIR") + "/" + name; }

// A file of the source tree: $RAILYARD_SOURCE_DIR/rel.
inline std::string source_path(const std::string& rel) { return ctest_env("RAILYARD_SOURCE_DIR") + "/" + rel; }

}  // namespace railyard::test
