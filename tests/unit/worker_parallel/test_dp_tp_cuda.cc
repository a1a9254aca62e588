// Data parallelism across tensor/pipeline-parallel replicas on CUDA as a user runs it (label gpu; tests/gpu/run.sh):
// `railyard-worker train --nproc 4 --device cuda` with `--tp 2` (dp=2 x tp=2), `--pp 2` (dp=2 x pp=2) and
// `--tp 2 --zero 1` (ZeRO-1 on device buffers): the stage on the GPU, tp/pp/embedding collectives over NCCL, the
// replica's gradient buckets all-reduced over NCCL on a communication stream as the stage's backward reports them
// (ZeRO-1: reduce-scattered into device pieces, AdamW there, parameters all-gathered). Trains to the losses of the same
// layout on the CPU over Gloo within bf16 tolerance. Needs 4 GPUs (one per rank); otherwise it says so and exits 77,
// which CTest reports as Skipped. NCCL's bootstrap stays on 127.0.0.1 (NCCL_COMM_ID, NCCL_SOCKET_IFNAME=lo).
#include <doctest/doctest.h>

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "tests/unit/worker_parallel/cuda_launch_test_util.h"

using namespace railyard::worker::testing;

TEST_CASE("train --nproc 4 --tp 2 / --pp 2 --device cuda (dp=2 replicas over NCCL) equals the CPU/Gloo layout") {
  require_gpus("worker_train_dp_tp_cuda", 4, "dp=2 x tp=2 (and dp=2 x pp=2) over NCCL");
  const std::string d = prepared_data_dir("railyard-dp-tp-cuda-");
  // 4 micro-batches per step (2 per replica through the pipeline), buckets of 20 KiB: several per stage.
  const std::string common = train_command(d, 8, "--bucket-mb 0.02 --nproc 4 ");
  // The third: ZeRO-1 on device buffers (reduce-scatter of device pieces, AdamW there, all-gather over NCCL).
  const std::vector<std::pair<std::string, std::string>> layouts = {
      {"--tp 2", "tp"}, {"--pp 2", "pp"}, {"--tp 2 --zero 1", "tp-zero1"}};
  for (const auto& [layout, tag] : layouts) {
    INFO(layout);
    nccl_on_loopback();
    const auto cpu = run_losses(common + layout + " --device cpu ", d + "/cpu-" + tag, 8);
    // "device buffers": the NCCL reducer/pieces, not Gloo's host thread
    const auto cuda = run_losses(common + layout + " --device cuda ", d + "/cuda-" + tag, 8,
                                 {"model-parallel stage", "device buffers"});
    CHECK(cuda.back() < cuda.front());
    // bf16 GEMM operands (fp32 accumulate) against fp32 on the CPU, compounded over 8 AdamW steps: 2% of the loss.
    check_within(cpu, cuda, 2e-2);
  }
  std::filesystem::remove_all(d);
}
