// Shared by the tests that run `railyard-worker train` as a user does (test_launch.cc, test_ep_launch.cc).
#pragma once

#include <doctest/doctest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

namespace railyard::worker::testing {

inline std::string bin_dir() {
  const char* b = std::getenv("RAILYARD_BIN_DIR");
  REQUIRE_MESSAGE((b && *b), "RAILYARD_BIN_DIR is not set (run through ctest)");
  return b;
}

inline std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline int sh(const std::string& cmd) {
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

inline std::vector<double> losses(const std::string& log_json) {
  std::vector<double> out;
  std::ifstream f(log_json);
  for (std::string line; std::getline(f, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j["event"] == "step") out.push_back(j["loss"].get<double>());
  }
  return out;
}

}  // namespace railyard::worker::testing
