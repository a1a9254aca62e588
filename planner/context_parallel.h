// Context parallelism in the planner's cost model (docs/planner.md "Context parallelism"): each sequence split along
// its positions over cp GPUs, attention by a ring exchange of keys and values (worker/parallel/ring_attention.h).
// Kept beside cost_model.h as separate functions: search() does not choose cp; search_context() below does, for a job
// that fits no layout without it.
#pragma once

#include <optional>

#include "planner/cost_model.h"
#include "planner/search.h"  // SearchOptions

namespace railyard::plan {

// Activation bytes per GPU under context parallelism cp (>= 1) on top of `layout`: every per-token activation of
// the estimate at sequence s/cp (the embedding output and logits too), the attention probabilities never stored (the
// ring recomputes them block by block, as FlashAttention does: s x s scores would be s/cp x s per GPU) and one fp32
// log-sum-exp per (sequence, local head, local position) per layer instead. cp = 1 is estimate()'s number.
double cp_activation_bytes(const Job& job, const Cluster& cluster, const Layout& layout, int cp);

// Seconds of ring traffic per micro-batch per layer on one GPU (not hidden behind compute): forward cp-1 hops of the
// local key/value block (2 b (s/cp) (h/t) e bytes), backward cp-1 hops of it plus cp hops of its gradient; each hop
// bytes / (bandwidth x efficiency) + latency, the cp group inside a node (NVLink) when tp * cp fits one, else on the
// NIC rail. `exposed` subtracts the attention compute of the block each hop overlaps.
struct RingTime {
  double forward = 0, backward = 0;                  // whole transfer
  double forward_exposed = 0, backward_exposed = 0;  // what the block's attention compute does not hide
  double bytes_per_hop = 0;
};
RingTime cp_ring_time(const ModelShape& m, const Cluster& cluster, const Layout& layout, int cp);

// A layout with context parallelism: the estimate (its layout's dp counts replicas: world = dp x cp x tp x pp; its
// activations are cp_activation_bytes'), cp, and the ring seconds per step the attention does not hide.
struct ContextPlan {
  Estimate estimate;
  int context = 1;
  double ring_seconds = 0;
};

// The fastest layout with context parallelism cp > 1 (the smallest cp that fits first; ZeRO 0-2 tried at each;
// nullopt when no cp makes the job fit): each rank holds s/cp positions of every sequence. Searched as the job at
// sequence s/cp on world/cp devices with no stored probabilities (what cp_activation_bytes does), then checked with
// cp_activation_bytes and charged the exposed ring time of every layer and micro-batch (cp_ring_time). The attention
// FLOPs of the s/cp x s blocks beyond the local s/cp x s/cp block are not counted (docs/planner.md).
std::optional<ContextPlan> search_context(const Job& job, const Cluster& cluster, SearchOptions o);

}  // namespace railyard::plan
