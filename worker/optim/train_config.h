// The training recipe: batch geometry, the learning-rate schedule, AdamW's hyperparameters, validation and samples,
// and the switches the parallel layouts read (recomputation, sequence and context parallelism, offload). Below
// worker/parallel/ and worker/train/ so that both read it without reaching up (the trainer runs it, the parallel
// models size their micro-batches and reductions from it); built from the command line in worker/cmd/train_setup.cc.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "worker/model/gpt_config.h"
#include "worker/optim/offload.h"

namespace railyard::worker {

struct TrainConfig {
  int steps = 10;
  int batch = 4;                    // micro-batch B (sequences)
  int seq_len = 64;                 // T
  int64_t global_batch_tokens = 0;  // tokens per optimizer step; 0 = one micro-batch (B*T). Must be a multiple of B*T
  double lr = 6e-4;
  int warmup_steps = 0;
  double min_lr_frac = 0.1;
  double weight_decay = 0.1;
  double grad_clip = 1.0;  // max global grad norm; <= 0 disables
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
  uint64_t seed = 1337;
  int val_every = 0;  // validate every N steps (and after the last); 0 = never
  int val_steps = 10;
  // Text samples while training (--sample-every, spec.training.sampleEvery): every N steps (and after the last) this
  // process draws sample_tokens tokens from its model (temperature 1, seeded by --seed and the step) and logs them
  // ("worker: sample", the JSON log's "sample" event; `railyard report` shows them). 0 = never. Needs the whole model
  // in the process (no --tp/--pp/--ep) and a dense one.
  int sample_every = 0;
  int sample_tokens = 64;
  int max_bad_steps = 3;      // consecutive non-finite steps before run() fails
  double peak_flops = 0;      // FLOP/s for MFU; 0 = measure the GEMM rate at start
  int world_size = 1;         // processes whose step this is: MFU divides by world_size x peak (per-process peak)
  std::string log_json;       // optional JSON-lines log file
  std::string progress_file;  // optional: {"step", "loss", "tokens_per_second"} rewritten atomically each step
  bool quiet = false;         // no per-step log lines (tests)
  // Uneven data parallelism (mixed-speed replicas, docs/planner.md "Mixed GPU types"): micro-batches of each global
  // step per dp rank, in rank order, summing to micro_steps(); empty = micro_steps()/dp each. Every replica then reads
  // the job's whole sequence of micro-batches and keeps its own run, and gradients are weighted by micro-batches
  // (= tokens), so any split gives the single-process step's math. Plain data parallelism only (no tp/pp, not
  // deterministic).
  std::vector<int> dp_split;
  // Test knob (`--slow-ranks/--slow-factor`): this rank sleeps (slow_factor - 1) x the wall time of each micro-batch's
  // forward + backward, as a device slow_factor times slower would take. 1 = off. Not applied to tp/pp models.
  double slow_factor = 1;
  RecomputeSpec recompute;  // activation recomputation (--recompute, --recompute-layers); results are unchanged
  // Megatron sequence parallelism over the tp group (--sequence-parallel; tp > 1 only, applied by ParallelGpt).
  bool sequence_parallel = false;
  // Context parallelism degree (--cp): the data-parallel group (GradSync) is dp x cp ranks, cp consecutive ones
  // sharing each replica's sequences (positions split, ring attention); a replica runs micro_steps() / (D / cp)
  // micro-batches. tp/pp model (ParallelGpt) only.
  int cp = 1;
  // --offload optimizer: AdamW's moments on the host, the update on offload_threads CPU threads overlapped with the
  // next forward (worker/optim/offload.h); results are unchanged. Plain or data-parallel Gpt only (no ZeRO, tp, pp).
  OffloadMode offload = OffloadMode::kNone;
  int offload_threads = 1;

  int micro_steps() const;                      // global batch / (B*T)
  void validate(const GptConfig& model) const;  // throws ConfigError naming the flag
};

}  // namespace railyard::worker
