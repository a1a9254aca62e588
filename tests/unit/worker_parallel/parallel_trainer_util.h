// Shared by the tensor/pipeline-parallel trainer tests: a layout of ParallelGpt ranks (threads over real Gloo sockets)
// trained through the Trainer, returning every step's result and the parameters gathered into the full buffer.
#pragma once

#include <doctest/doctest.h>

#include <memory>
#include <mutex>
#include <vector>

#include "tests/unit/worker_parallel/trainer_test_util.h"
#include "worker/comm/local_world.h"
#include "worker/comm/process_groups.h"
#include "worker/parallel/data_parallel.h"
#include "worker/parallel/dist_model.h"
#include "worker/train/trainer.h"

namespace railyard::worker::testing {

// tc.steps steps on `layout` (dp x tp x pp ranks, micro-batches split over dp, 16 KiB dp buckets: several and a padded
// last one on every stage) from StreamSource data, with ZeRO `zero_stage` or the deterministic tree (every replica
// then reads the job's whole sequence and keeps its own leaves). Every rank must log the same loss bits each step.
inline LayoutRun run_parallel_trainer(const GptConfig& cfg, const TrainConfig& tc, comm::Layout layout,
                                      int zero_stage = 0, bool deterministic = false) {
  LayoutRun out;
  out.params.assign(num_parameters(cfg), 0.0f);
  std::mutex mu;
  std::vector<std::vector<StepResult>> steps(static_cast<size_t>(layout.world()));
  comm::run_local_world(layout.world(), [&](comm::Communicator& world) {
    comm::ProcessGroups pg(world, layout);
    ThreadPool pool(1);
    StreamSource src(deterministic ? 0 : pg.coord().dp, deterministic ? 1 : layout.dp, tc.batch, tc.seq_len,
                     cfg.vocab_size);
    const parallel::ModelGroups groups{&pg.tp(), &pg.pp(), pg.embedding()};
    parallel::ParallelGpt model(cfg, tc, tc.micro_steps() / layout.dp, pool, world, groups);
    std::unique_ptr<parallel::DataParallel> sync;
    if (layout.dp > 1 || zero_stage > 0 || deterministic) {
      parallel::DataParallelOptions o;
      o.zero_stage = zero_stage;
      o.deterministic = deterministic;
      o.bucket_bytes = 16 << 10;
      sync = parallel::parallel_gpt_data_parallel(&pg.dp(), model, groups, tc, pool, o);
    }
    Trainer tr(cfg, tc, pool, src, nullptr, sync.get(), &model);
    auto& mine = steps[static_cast<size_t>(world.rank())];
    for (int s = 0; s < tc.steps; ++s) mine.push_back(tr.step());
    if (pg.coord().dp == 0) {
      std::lock_guard<std::mutex> lk(mu);
      model.model().gather_into_full(model.params(), out.params.data());
    }
  });
  for (const auto& s : steps) {
    for (size_t i = 0; i < s.size(); ++i) CHECK(s[i].loss == steps[0][i].loss);
  }
  out.steps = steps[0];
  return out;
}

}  // namespace railyard::worker::testing
