// Data parallelism across tensor/pipeline-parallel replicas on CUDA as a user runs it (label gpu; tests/gpu/run.sh):
// `railyard-worker train --nproc 4 --device cuda` with `--tp 2` (dp=2 x tp=2), `--pp 2` (dp=2 x pp=2) and
// `--tp 2 --zero 1` (ZeRO-1 on device buffers): the stage on the GPU, tp/pp/embedding collectives over NCCL, the
// replica's gradient buckets all-reduced over NCCL on a communication stream as the stage's backward reports them
// (ZeRO-1: reduce-scattered into device pieces, AdamW there, parameters all-gathered). Trains to the losses of the same
// layout on the CPU over Gloo within bf16 tolerance. Needs 4 GPUs (one per rank); otherwise it says so and exits 77,
// which CTest reports as Skipped. NCCL's bootstrap stays on 127.0.0.1 (NCCL_COMM_ID, NCCL_SOCKET_IFNAME=lo).
#include <cuda_runtime_api.h>
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "tests/unit/worker_parallel/launch_test_util.h"
#include "worker/parallel/dist_launcher.h"

using namespace railyard::worker::testing;

namespace {

void require_four_gpus() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
  skip_without_gpus("worker_train_dp_tp_cuda", n, 4, "dp=2 x tp=2 (and dp=2 x pp=2) over NCCL");
}

}  // namespace

TEST_CASE("train --nproc 4 --tp 2 / --pp 2 --device cuda (dp=2 replicas over NCCL) equals the CPU/Gloo layout") {
  require_four_gpus();
  const std::string bin = bin_dir();
  const std::string d = prepared_data_dir("railyard-dp-tp-cuda-");
  ::setenv("NCCL_SOCKET_IFNAME", "lo", 0);
  // 4 micro-batches per step (2 per replica through the pipeline), buckets of 20 KiB: several per stage.
  const std::string common = bin + "/railyard-worker train --model l=2,c=64,nh=4,t=64,v=256 --data " + d +
                             "/data --steps 8 --batch 4 --seq 64 --global-batch 1024 --lr 3e-3 --warmup 2 "
                             "--bucket-mb 0.02 --peak-flops 1e12 --nproc 4 ";
  // The third: ZeRO-1 on device buffers (reduce-scatter of device pieces, AdamW there, all-gather over NCCL).
  const std::vector<std::pair<std::string, std::string>> layouts = {
      {"--tp 2", "tp"}, {"--pp 2", "pp"}, {"--tp 2 --zero 1", "tp-zero1"}};
  for (const auto& [layout, tag] : layouts) {
    INFO(layout);
    const int port = railyard::worker::parallel::free_port("127.0.0.1");
    ::setenv("NCCL_COMM_ID", ("127.0.0.1:" + std::to_string(port)).c_str(), 1);
    REQUIRE(sh(common + layout + " --device cpu --log-json " + d + "/cpu-" + tag + ".jsonl 2> " + d + "/cpu-" + tag +
               ".txt") == 0);
    const int rc = sh(common + layout + " --device cuda --log-json " + d + "/cuda-" + tag + ".jsonl 2> " + d +
                      "/cuda-" + tag + ".txt");
    const std::string log = slurp(d + "/cuda-" + tag + ".txt");
    INFO(log);
    REQUIRE(rc == 0);
    CHECK(log.find("model-parallel stage") != std::string::npos);
    CHECK(log.find("device buffers") != std::string::npos);  // the NCCL reducer/pieces, not Gloo's host thread
    const auto cpu = losses(d + "/cpu-" + tag + ".jsonl"), cuda = losses(d + "/cuda-" + tag + ".jsonl");
    REQUIRE(cpu.size() == 8);
    REQUIRE(cuda.size() == 8);
    CHECK(cuda.back() < cuda.front());
    for (size_t s = 0; s < cpu.size(); ++s) {
      INFO("step " << s + 1 << ": cuda " << cuda[s] << " cpu " << cpu[s]);
      // bf16 GEMM operands (fp32 accumulate) against fp32 on the CPU, compounded over 8 AdamW steps: 2% of the loss.
      CHECK(std::abs(cuda[s] - cpu[s]) <= 2e-2 * std::abs(cpu[s]));
    }
  }
  std::filesystem::remove_all(d);
}
