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

// GPU tests: exits 77 (CTest reports Skipped, never Passed) with a message naming the test when fewer than `need`
// GPUs are usable (`have`: the caller's cudaGetDeviceCount, 0 on error).
inline void skip_without_gpus(const char* test, int have, int need, const char* what) {
  if (have >= need) return;
  std::fprintf(stderr, "%s: SKIPPED: %d usable CUDA device(s); %s needs %d or more (one GPU per rank)\n", test, have,
               what, need);
  std::exit(77);
}

// A fresh directory under the temp dir (`prefix` + pid) with `data/` prepared by `railyard data prepare` from two
// license texts: the small corpus of the CUDA-vs-CPU training tests.
inline std::string prepared_data_dir(const std::string& prefix) {
  const std::string d = (std::filesystem::temp_directory_path() / (prefix + std::to_string(getpid()))).string();
  std::filesystem::create_directories(d);
  REQUIRE(sh(bin_dir() + "/railyard data prepare --input /usr/share/common-licenses/GPL-3 " +
             "/usr/share/common-licenses/Apache-2.0 --output " + d + "/data > " + d + "/prep.txt 2>&1") == 0);
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
