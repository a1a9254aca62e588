// Data parallelism on CUDA over NCCL as a user runs it (label gpu; tests/gpu/run.sh): `railyard-worker train --nproc 2
// --device cuda` (gradient buckets all-reduced over NCCL on a communication stream, overlapping backward) trains to
// the losses of the same job on the CPU over Gloo within bf16 tolerance. Needs 2 GPUs; otherwise it says so and exits
// 77, which CTest reports as Skipped. NCCL's bootstrap stays on 127.0.0.1 (NCCL_COMM_ID, NCCL_SOCKET_IFNAME=lo).
// `--deterministic --device cuda` (the fixed tree on device leaves, all_to_all/all_gather over NCCL): 2 ranks, also
// with ZeRO-2, are bitwise the single process on one GPU. A model with experts (MoE layers on the device) follows the
// CPU run with and without ZeRO-1, and so does expert parallelism (--ep 2: sharded storage, ZeRO-1, deterministic).
#include <doctest/doctest.h>

#include <filesystem>
#include <initializer_list>
#include <string>
#include <vector>

#include "tests/unit/worker_parallel/cuda_launch_test_util.h"

using namespace railyard::worker::testing;

namespace {

void require_two_gpus() { require_gpus("worker_train_dp_cuda", 2, "data parallelism over NCCL"); }

// The MoE runs: `common` + each of `flags`, the first on the CPU, the others on CUDA (each printing `cuda_expect`),
// logged as `name`0, `name`1, ... The first CUDA run learns, and every CUDA run follows the CPU run within 3%: the
// dense case's bf16 GEMMs plus the router's, which moves near-tied tokens to another expert (set a priori).
void check_moe_runs_follow_cpu(const std::string& common, const std::string& name,
                               std::initializer_list<const char*> flags, const std::vector<std::string>& cuda_expect) {
  std::vector<std::vector<double>> runs;
  for (const char* f : flags) {
    runs.push_back(run_losses(common + f, name + std::to_string(runs.size()), 8,
                              runs.empty() ? std::vector<std::string>{} : cuda_expect));
  }
  CHECK(runs[1].back() < runs[1].front());
  for (size_t r = 1; r < runs.size(); ++r) {
    INFO("run " << r);
    check_within(runs[0], runs[r], 3e-2);
  }
}

}  // namespace

TEST_CASE("train --nproc 2 --device cuda (NCCL, overlapped buckets) equals the CPU/Gloo run within bf16 tolerance") {
  require_two_gpus();
  const std::string d = prepared_data_dir("railyard-dp-cuda-");
  nccl_on_loopback();
  // 4 micro-batches per step (2 per rank), buckets of 50 KiB: several buckets overlap every backward.
  const std::string common = train_command(d, 8, "--bucket-mb 0.05 --nproc 2 ");
  const auto cpu = run_losses(common + "--device cpu ", d + "/cpu", 8);
  const auto cuda = run_losses(common + "--device cuda ", d + "/cuda", 8, {"device buffers"});  // NCCL, not Gloo
  CHECK(cuda.back() < cuda.front());
  // bf16 GEMM operands (fp32 accumulate) against fp32 on the CPU, compounded over 8 AdamW steps: 2% of the loss.
  check_within(cpu, cuda, 2e-2);
  std::filesystem::remove_all(d);
}

TEST_CASE("train --deterministic --device cuda: --nproc 2 (also with --zero 2) is bitwise the single process") {
  require_two_gpus();
  const std::string d = prepared_data_dir("railyard-det-cuda-");
  nccl_on_loopback();
  // 4 virtual micro-batches per step: 2 leaves per rank at dp=2, 4 in one process.
  const std::string common = train_command(d, 6, "--device cuda --deterministic ");
  std::vector<std::vector<double>> runs;
  for (const char* flags : {"", "--nproc 2 ", "--nproc 2 --zero 2 ", "--zero 2 "}) {
    runs.push_back(
        run_losses(common + flags, d + "/det" + std::to_string(runs.size()), 6, {"deterministic, device buffers"}));
  }
  CHECK(runs[0].back() < runs[0].front());
  CHECK(runs[1] == runs[0]);  // bitwise: the same tree of the same leaves on the same GPU model
  CHECK(runs[2] == runs[3]);  // ZeRO-2's block norm: the same sums whatever D is
  std::filesystem::remove_all(d);
}

TEST_CASE("train --nproc 2 --device cuda with experts (MoE layers on the device) follows the CPU/Gloo run") {
  require_two_gpus();
  const std::string d = prepared_data_dir("railyard-moe-cuda-");
  nccl_on_loopback();
  const std::string common = train_command(d, 8, "--nproc 2 --moe-experts 4 --moe-top-k 2 --moe-capacity-factor 1.25 ");
  check_moe_runs_follow_cpu(common, d + "/moe", {"--device cpu ", "--device cuda ", "--device cuda --zero 1 "}, {});
  std::filesystem::remove_all(d);
}

TEST_CASE("train --nproc 2 --ep 2 --device cuda (expert parallelism over NCCL) follows the CPU/Gloo run") {
  require_two_gpus();
  const std::string d = prepared_data_dir("railyard-ep-cuda-");
  nccl_on_loopback();
  const std::string common =
      train_command(d, 8, "--nproc 2 --ep 2 --moe-experts 4 --moe-top-k 2 --moe-capacity-factor 1.25 ");
  // expert-parallel storage (group spans over NCCL), then the full layout under ZeRO-1 and the deterministic tree
  check_moe_runs_follow_cpu(
      common, d + "/ep",
      {"--device cpu ", "--device cuda ", "--device cuda --zero 1 ", "--device cuda --deterministic "},
      {"(device memory)"});
  std::filesystem::remove_all(d);
}
