// Shared by the worker tests that hold the planner's memory model (planner/cost_model.h) against the bytes the worker
// allocates (test_recompute.cc; worker_parallel's test_offload.cc, test_ring_attention.cc, test_sequence_parallel.cc):
// the planner's view of the worker's model and of the CPU processes it runs on.
#pragma once

#include <string>

#include "planner/calibration.h"
#include "planner/cost_model.h"
#include "worker/model/gpt_config.h"

namespace railyard::worker::testing {

// `gpus` processes of the builtin cpu profile.
inline plan::Cluster cpu_cluster(int gpus = 1) {
  plan::Cluster c;
  c.device = plan::builtin_profile("cpu");
  c.gpus = gpus;
  return c;
}

// The planner's job for `g` (named `name`, at its full sequence g.max_seq_len), `global_batch` sequences per step,
// without dropout: the worker has none.
inline plan::Job planner_job(const std::string& name, const GptConfig& g, long long global_batch) {
  return plan::Job{plan::ModelShape{name, g.num_layers, g.channels, g.num_heads, g.max_seq_len, g.vocab_size,
                                    /*dropout=*/false},
                   global_batch, 0};
}

}  // namespace railyard::worker::testing
