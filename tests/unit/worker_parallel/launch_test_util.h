// Shared by the tests that run `railyard-worker train` as a user does (test_launch.cc, test_ep_launch.cc, the CUDA
// ones test_dp_cuda.cc and test_dp_tp_cuda.cc).
#pragma once

#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tests/ctest_env.h"

namespace railyard::worker::testing {

inline std::string bin_dir() { return railyard::test::ctest_env("RAILYARD_BIN_DIR"); }

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

// `railyard data prepare` of the license texts `licenses` (under /usr/share/common-licenses) into `d`/data, its
// output in `d`/prep.txt: the small corpus the training tests run on.
inline void prepare_data(const std::string& d, std::initializer_list<const char*> licenses = {"GPL-3", "Apache-2.0"}) {
  std::string inputs;
  for (const char* l : licenses) inputs += std::string(" /usr/share/common-licenses/") + l;
  REQUIRE(sh(bin_dir() + "/railyard data prepare --input" + inputs + " --output " + d + "/data > " + d +
             "/prep.txt 2>&1") == 0);
}

// A fresh directory under the temp dir (`prefix` + pid) with `data/` prepared from two license texts (prepare_data):
// the small corpus of the CUDA-vs-CPU training tests.
inline std::string prepared_data_dir(const std::string& prefix) {
  const std::string d = (std::filesystem::temp_directory_path() / (prefix + std::to_string(getpid()))).string();
  std::filesystem::create_directories(d);
  prepare_data(d);
  return d;
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
