// The plan search: enumerate the layouts a job can run with on a cluster, keep those that fit in memory, rank them
// by predicted step time. Deterministic: the same inputs give the same ranking.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "planner/cost_model.h"

namespace railyard::plan {

struct SearchOptions {
  int top = 5;
  // Pin a degree or a choice (from the CLI's --tp/--pp/... or a partly given spec.parallelism).
  std::optional<int> dp, tp, pp, micro_batch, zero, interleave;
  std::optional<Recompute> recompute;
  std::optional<bool> sequence_parallel;
  // Optimizer offload: pinned on or off, or (unset) tried for a layout only when it does not fit without.
  std::optional<bool> offload;
  int max_micro_batch = 64;
  std::vector<int> interleaves = {1, 2, 4};
  // Keep one entry per (dp, tp, pp, micro-batch, interleave): the runners-up then show different shapes rather
  // than the same shape with another ZeRO stage.
  bool distinct_shapes = true;
  // The worker's deterministic data-parallel mode (docs/parallel.md) folds each rank's micro-batches in a fixed
  // pairwise tree: with dp > 1 the accumulation per rank, global batch / (dp x micro-batch), must be a power of two.
  bool power_of_two_accumulation = false;
};

struct RankedPlan {
  Estimate estimate;
  std::string why;  // for runners-up: what makes it slower than the best ("" for the best)
};

struct SearchResult {
  std::vector<RankedPlan> plans;                // best first, at most `top`
  long long evaluated = 0;                      // valid layouts estimated
  long long rejected_memory = 0;                // valid but did not fit
  std::map<std::string, long long> invalid;     // rejection reason kind -> count
  std::optional<Estimate> smallest_nonfitting;  // when nothing fits: the layout that came closest
};

SearchResult search(const Job& job, const Cluster& cluster, const SearchOptions& options = {});

// "bubble 9.1 s vs 2.0 s (+7.1 s)": the component that differs most from the best plan's.
std::string why_slower(const Estimate& candidate, const Estimate& best);

}  // namespace railyard::plan
