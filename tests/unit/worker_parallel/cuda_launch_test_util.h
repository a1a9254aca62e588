// Shared by the CUDA-vs-CPU training tests that run `railyard-worker train` as a user does (test_dp_cuda.cc,
// test_dp_tp_cuda.cc): the GPU count gate, NCCL's bootstrap on loopback, the common command line, one logged run and
// the step-by-step loss comparison.
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "tests/cuda_gpus.h"
#include "tests/unit/worker_parallel/launch_test_util.h"
#include "worker/parallel/dist_launcher.h"

namespace railyard::worker::testing {

using railyard::test::require_gpus;

// NCCL's bootstrap stays on 127.0.0.1: a fresh free port for NCCL_COMM_ID (call it before each launch), sockets on lo.
inline void nccl_on_loopback() {
  const int port = railyard::worker::parallel::free_port("127.0.0.1");
  ::setenv("NCCL_COMM_ID", ("127.0.0.1:" + std::to_string(port)).c_str(), 1);
  ::setenv("NCCL_SOCKET_IFNAME", "lo", 0);
}

// The small model and schedule the CUDA-vs-CPU tests train on `d`/data for `steps` steps, then `extra` (flags, each
// followed by a space).
inline std::string train_command(const std::string& d, int steps, const std::string& extra) {
  return bin_dir() + "/railyard-worker train --model l=2,c=64,nh=4,t=64,v=256 --data " + d + "/data --steps " +
         std::to_string(steps) + " --batch 4 --seq 64 --global-batch 1024 --lr 3e-3 --warmup 2 --peak-flops 1e12 " +
         extra;
}

// Runs `cmd` with its step log in `name`.jsonl and stderr in `name`.txt: it must exit 0, print each of `expect` and
// log `steps` losses, which it returns.
inline std::vector<double> run_losses(const std::string& cmd, const std::string& name, size_t steps,
                                      const std::vector<std::string>& expect = {}) {
  const int rc = sh(cmd + "--log-json " + name + ".jsonl 2> " + name + ".txt");
  const std::string log = slurp(name + ".txt");
  INFO(cmd << "\n" << log);
  REQUIRE(rc == 0);
  for (const std::string& e : expect) CHECK(log.find(e) != std::string::npos);
  std::vector<double> out = losses(name + ".jsonl");
  REQUIRE(out.size() == steps);
  return out;
}

// Step by step, the CUDA run's loss within `rel_tol` of the CPU run's.
inline void check_within(const std::vector<double>& cpu, const std::vector<double>& cuda, double rel_tol) {
  for (size_t s = 0; s < cpu.size(); ++s) {
    INFO("step " << s + 1 << ": cuda " << cuda[s] << " cpu " << cpu[s]);
    CHECK(std::abs(cuda[s] - cpu[s]) <= rel_tol * std::abs(cpu[s]));
  }
}

}  // namespace railyard::worker::testing
