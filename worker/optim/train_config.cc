#include "worker/optim/train_config.h"

#include <cmath>
#include <string>

#include "common/error.h"

namespace railyard::worker {

int TrainConfig::micro_steps() const {
  const int64_t per = static_cast<int64_t>(batch) * seq_len;
  return global_batch_tokens <= 0 ? 1 : static_cast<int>(global_batch_tokens / per);
}

void TrainConfig::validate(const GptConfig& model) const {
  auto bad = [](const std::string& m) { throw ConfigError(m); };
  if (steps < 0) bad("--steps must be >= 0");
  if (batch <= 0) bad("--batch must be positive (sequences per micro-batch)");
  if (seq_len <= 0 || seq_len > model.max_seq_len) {
    bad("--seq " + std::to_string(seq_len) + " must be in 1.." + std::to_string(model.max_seq_len) +
        " (the model's maxT)");
  }
  const int64_t per = static_cast<int64_t>(batch) * seq_len;
  if (global_batch_tokens < 0 || (global_batch_tokens > 0 && global_batch_tokens % per != 0)) {
    bad("--global-batch " + std::to_string(global_batch_tokens) + " (tokens) must be a positive multiple of " +
        "batch*seq = " + std::to_string(per));
  }
  if (!(lr > 0) || !std::isfinite(lr)) bad("--lr must be a positive number");
  if (warmup_steps < 0) bad("--warmup must be >= 0");
  if (min_lr_frac < 0 || min_lr_frac > 1) bad("--min-lr-frac must be in [0, 1]");
  if (weight_decay < 0) bad("--weight-decay must be >= 0");
  if (val_every < 0 || val_steps <= 0) bad("--val-every must be >= 0 and --val-steps positive");
  if (max_bad_steps <= 0) bad("--max-bad-steps must be positive");
  if (!(slow_factor >= 1) || !std::isfinite(slow_factor)) bad("--slow-factor must be a number >= 1");
  if (cp < 1 || seq_len % cp != 0) {
    bad("--cp " + std::to_string(cp) + " must be >= 1 and divide --seq " + std::to_string(seq_len) +
        " (each rank holds seq/cp positions)");
  }
  if (offload_threads < 1) bad("--offload-threads must be positive");
  if (sample_every < 0) bad("--sample-every must be >= 0");
  if (sample_every > 0 && (sample_tokens < 1 || sample_tokens >= model.max_seq_len)) {
    bad("--sample-tokens " + std::to_string(sample_tokens) + " must be in 1.." + std::to_string(model.max_seq_len - 1) +
        " (the model's maxT - 1)");
  }
  if (sample_every > 0 && model.moe.experts > 0) bad("--sample-every: samples are drawn from dense models only");
}

}  // namespace railyard::worker
