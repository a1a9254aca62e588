// The command lines of `railyard-worker train` and `gemm-rate`: every flag, how its value is read, and the layering
// of the command line over the worker configuration (config_file.h), the environment and the defaults
// (train_options.h) into the typed options.
#pragma once

#include <string>
#include <vector>

#include "worker/cmd/train_options.h"

namespace railyard::worker {

// Builds the options of `train` from argv[first..] (--help prints the usage and exits 0; a syntax error or an
// unknown flag prints it and exits 2), the --config file and `env`. Throws ConfigError naming the flag, the
// configuration's field or the variable, and the fix.
TrainOptions parse_train_options(int argc, char** argv, int first, const LauncherEnv& env);

// Every flag `train` takes (without "--"), sorted; usage.cc documents each.
std::vector<std::string> train_flag_names();

// The options of `railyard-worker gemm-rate`.
struct GemmRateOptions {
  std::string model = "gpt2-124m";
  int batch = 4, seq = 64, threads = 0;
  cpu::GemmThreading split = cpu::GemmThreading::kPool;
};
GemmRateOptions parse_gemm_rate_options(int argc, char** argv, int first);

}  // namespace railyard::worker
