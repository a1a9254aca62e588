// Mixture-of-experts terms of the planner (docs/planner.md "Mixture of experts"): expert parameters and memory under
// expert parallelism, and the all-to-all of the dispatch/combine on the rail topology, flat vs hierarchical, with
// the cheaper one chosen. Kept beside cost_model.h (new functions only) so the dense model's formulas stay as they are.
#pragma once

#include <optional>
#include <string>

#include "planner/cost_model.h"

namespace railyard::plan {

struct MoeShape {
  int experts = 0;  // E experts per layer (0: dense)
  int top_k = 1;
  double capacity_factor = 1.25;  // expert capacity ceil(F k N / E) tokens per micro-batch of N tokens
};

// Parameters of the MoE model: the dense count with each layer's MLP (8h^2 + 5h) taken E times, plus the router
// (E h per layer, no bias).
double moe_parameter_count(const ModelShape& m, const MoeShape& moe);
// Parameters one GPU holds with the experts split over `ep` ranks (E/ep experts per layer) and the rest replicated.
double moe_parameters_per_gpu(const ModelShape& m, const MoeShape& moe, int ep);
// Bytes one rank sends in one dispatch (or combine) all-to-all of one MoE layer for a micro-batch of
// `tokens` tokens: E * capacity rows of h activations (the capacity padding makes it fixed).
double moe_dispatch_bytes(const ModelShape& m, const MoeShape& moe, const DeviceProfile& d, double tokens);

// Activation bytes of one MoE layer for one micro-batch on one GPU (tp = 1): layer_activation_bytes() with the MLP's
// two hidden tensors (n x 4h each) replaced by the experts' rows (R x 4h each, R = E cap: the capacity padding is
// allocated), plus the router probabilities (n x E) and the experts' outputs (R x h):
//   dense + e (8 h (R - n) + R h + n E),  n = s b tokens, e = activation_bytes.
// Full recomputation keeps only the layer input (the dense value). Throws ConfigError for tp > 1 (not modelled).
double moe_layer_activation_bytes(const ModelShape& m, const MoeShape& moe, const DeviceProfile& d, const Layout& l);

// Model states per GPU with experts split over ep ranks: the non-expert parameters P_d (ZeRO over the d data-parallel
// ranks) and this GPU's experts P_e / ep (ZeRO over the d / ep ranks holding the same experts, DeepSpeed-MoE's
// expert-data-parallel group): weights P weight_bytes / (ZeRO 3 ? group : 1), gradients P grad_bytes / (ZeRO >= 2 ?
// group : 1), optimizer P optimizer_bytes / (ZeRO >= 1 ? group : 1), each summed over the two parts.
struct MoeStateBytes {
  double params = 0, grads = 0, optimizer = 0;
  double total() const { return params + grads + optimizer; }
};
MoeStateBytes moe_state_bytes(const ModelShape& m, const MoeShape& moe, const DeviceProfile& d, int dp, int ep,
                              int zero);

// The cost of one all-to-all over `ranks` GPUs (packed onto whole nodes from a unit boundary, gpus_per_node a node,
// or fewer when ranks < gpus_per_node) in which every rank holds `bytes` (ranks equal chunks).
struct AllToAllCost {
  double flat = 0;          // seconds: every pair exchanges directly
  double hierarchical = 0;  // seconds: node-local exchange by rail over NVLink, then same-rail exchange across nodes
  bool use_hierarchical = false;  // hierarchical < flat
  int nodes = 0, local = 0;       // the layout assumed
  std::string tier;               // tier of the same-rail traffic ("node", "unit", "leaf", "spine")
  double best() const { return use_hierarchical ? hierarchical : flat; }
};
// Flat (pairwise exchange, P-1 steps): per rank (G-1) NVLink messages of bytes/P and P-G network messages of bytes/P,
// of which (G-1)/G change rail: they cross the leaf layer (3 hops, leaf bandwidth factor; 5 hops and the spine's
// factor when the nodes span leaves) while same-rail ones stay on the rail switch (the tier's hops).
//   flat = (G-1) (bytes/P / B_nvl + lat) + (N-1) [(bytes/P / B_rail + lat + hops_rail h) + (G-1) (bytes/P / B_x +
//          lat + hops_x h)]
// Hierarchical: an all-to-all of G ranks over NVLink, then one of N nodes on the rail with G times larger messages:
//   hier = (G-1) (bytes/G / B_nvl + lat) + (N-1) (bytes/N / B_rail + lat + hops_rail h)
// (B = link bandwidth x efficiency, lat = collective_latency_s, h = hop_latency_s). The network bytes per rank are
// the same, (N-1)/N bytes; the hierarchical scheme pays one more NVLink pass to send only same-rail messages, N-1
// instead of (N-1) G of them.
AllToAllCost all_to_all_cost(const Cluster& c, int ranks, double bytes);

// All-to-all time of one training step's MoE layers on one GPU: per MoE layer and micro-batch 2 all-to-alls forward
// (dispatch, combine) and 3 backward (the inputs again, the output gradients, the input gradients back: Railyard's
// worker keeps no copy of the dispatched inputs), micro_batches micro-batches of micro_batch sequences.
struct MoeCommEstimate {
  AllToAllCost per_all_to_all;
  double bytes_per_all_to_all = 0;
  int all_to_alls = 0;  // per step
  double seconds = 0;   // all_to_alls x the chosen algorithm's time
};
MoeCommEstimate moe_comm_estimate(const ModelShape& m, const MoeShape& moe, const Cluster& c, int ep, int micro_batch,
                                  int micro_batches);

// The expert-parallel degree for a MoE model on a planned dense layout (what parallelism.auto runs for experts): per
// device, the estimate `e` with its dense states and layer activations replaced by the MoE ones (moe_state_bytes over
// the degree, moe_layer_activation_bytes; one micro-batch in flight per layer with pp 1, the only pipeline degree
// experts run with). The smallest degree dividing both the experts and e.layout.dp that fits wins (the fewest
// all-to-all peers), or the pinned one; then the all-to-all: the request's, else hierarchical when moe_comm_estimate
// prefers it and the request allows it, else flat.
struct ExpertRequest {
  MoeShape moe;
  int pinned = 0;                    // a degree the job fixes (0: choose)
  std::string all_to_all;            // "flat" or "hierarchical" as the job fixes it ("": choose)
  bool hierarchical_allowed = true;  // the worker can run the hierarchical exchange (its pods tile the group, ...)
};
struct ExpertPlan {
  int expert = 1;
  std::string all_to_all = "flat";  // flat or hierarchical
  double all_to_all_seconds = 0;    // per step, the chosen algorithm (0 with expert 1: no exchange)
  double flat_seconds = 0, hierarchical_seconds = 0;
  double memory_bytes = 0;  // per device with the experts split over `expert` ranks
};
struct ExpertSearch {
  std::optional<ExpertPlan> plan;
  bool pinned_does_not_divide = false;  // the pinned degree divides not both the experts and e.layout.dp
  double smallest_memory = -1;          // per device, the least any degree needed (when none fits)
};
ExpertSearch search_experts(const Job& job, const Cluster& cluster, const Estimate& e, const ExpertRequest& r);

}  // namespace railyard::plan
