// Shared by the tests that run a ParallelModel's forward and backward per rank and gather its gradients on the host
// (worker_parallel/test_stage_device.cc, worker_parallel/test_moe_device.cc, worker_cuda/test_stage_nccl_gpu.cc).
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>

#include "worker/comm/communicator.h"
#include "worker/comm/process_groups.h"
#include "worker/parallel/parallel_model.h"
#include "worker/parallel/stage_plan.h"

namespace railyard::worker::testing {

// Context parallelism over the layout's dp ranks (ring attention): with cp > 1, their group, set as mg.cp (the caller
// keeps it alive as long as the model); null otherwise.
inline std::unique_ptr<comm::Communicator> attach_cp_group(comm::ProcessGroups& groups, parallel::ModelGroups& mg,
                                                           int cp) {
  if (cp <= 1) return nullptr;
  std::vector<int> all(static_cast<size_t>(cp));
  for (int i = 0; i < cp; ++i) all[static_cast<size_t>(i)] = i;
  std::unique_ptr<comm::Communicator> group = groups.dp().split(all, "cp");
  mg.cp = group.get();
  return group;
}

// forward_backward's next_micro_batch over `data`, which holds each micro-batch's N inputs followed by its N targets.
inline std::function<void(int32_t*, int32_t*)> interleaved_micro_batches(const std::vector<int32_t>& data, size_t N) {
  return [&data, N, next = size_t{0}](int32_t* in, int32_t* tgt) mutable {
    std::memcpy(in, data.data() + next * 2 * N, N * sizeof(int32_t));
    std::memcpy(tgt, data.data() + next * 2 * N + N, N * sizeof(int32_t));
    ++next;
  };
}

// This rank's gradients copied off its device, with the slices of the full llm.c buffer it holds the primary of (the
// last stage's tied copy of wte is not one).
struct HostGrads {
  std::vector<parallel::ShardSlice> primary;
  std::vector<float> local;
  // Writes them into `full` (the caller serialises the ranks).
  void copy_to_full(const GptConfig& cfg, float* full) const {
    parallel::copy_local_to_full(primary, cfg, local.data(), full);
  }
};

inline HostGrads host_grads(parallel::ParallelModel& model) {
  HostGrads g;
  for (const parallel::ShardSlice& s : model.shard_map())
    if (!s.tied_copy) g.primary.push_back(s);
  g.local.resize(model.num_params());
  model.stage().device().to_host(g.local.data(), model.grads(), g.local.size() * sizeof(float));
  return g;
}

}  // namespace railyard::worker::testing
