// The planner's cost model: per-GPU memory and time per training step of a GPT-style model under a given
// data/tensor/pipeline layout on a described cluster. Pure arithmetic, no Kubernetes: the CLI (`railyard plan`) and
// the operator (`spec.parallelism.auto`) link the same code. Every formula is written out in docs/planner.md.
#pragma once

#include <map>
#include <string>

#include "common/recompute.h"

namespace railyard::plan {

// A GPT-2/3 style decoder: L layers of hidden h with a heads, sequence s, vocabulary V (tied LM head).
struct ModelShape {
  std::string name;  // preset name or "custom"
  int layers = 0;
  int hidden = 0;
  int heads = 0;
  int seq = 0;
  int vocab = 0;
  // Dropout after attention probabilities, attention output and MLP (Megatron/GPT-3 recipes): its masks and the
  // dropped probabilities are stored activations. Railyard's CPU worker trains without dropout (false).
  bool dropout = true;
};

// One device type (a GPU, or one CPU process) and the runtime's habits on it. Loaded from a calibration file
// (deploy/planner/*.yaml); units are base units (FLOP/s, bytes, bytes/s, seconds).
struct DeviceProfile {
  std::string name;
  std::string origin;                          // file it came from, for messages
  std::map<std::string, std::string> sources;  // field -> "vendor datasheet value ..." / "assumed ..." / "measured ..."
  double peak_flops = 0;                       // dense 16-bit (GPU) or measured fp32 GEMM rate (CPU)
  double memory_bytes = 0;                     // device memory
  double usable_memory_fraction = 0;
  double workspace_bytes = 0;       // context, library workspaces, communication buffers
  double memory_bandwidth = 0;      // HBM (or DRAM) bytes/s
  double nvlink_bandwidth = 0;      // per GPU, one direction, bytes/s
  double nic_bandwidth = 0;         // per GPU (one rail NIC each), one direction, bytes/s
  double gemm_efficiency = 0;       // fraction of peak the largest GEMMs reach
  double gemm_half_flops = 0;       // a GEMM of this many FLOPs reaches half of gemm_efficiency
  double attention_efficiency = 0;  // fraction of peak of the attention core (QK^T, softmax, AV)
  double memory_efficiency = 0;     // fraction of memory_bandwidth elementwise kernels reach
  double nvlink_efficiency = 0;     // all-reduce bus bandwidth / nvlink_bandwidth
  double nic_efficiency = 0;        // all-reduce bus bandwidth / nic_bandwidth
  double kernel_overhead_s = 0;     // per kernel (launch, tail), seconds
  double collective_latency_s = 0;  // per ring step inside a node
  double hop_latency_s = 0;         // per switch hop per ring step across nodes
  int gpus_per_node = 0;            // default when no topology is given
  double weight_bytes = 0;          // per parameter: working weights
  double grad_bytes = 0;            // per parameter: gradients (also the bytes the data-parallel reduction moves)
  double optimizer_bytes = 0;       // per parameter: optimizer state (ZeRO's K: fp32 master + Adam m, v = 12)
  double activation_bytes = 0;      // per activation element (2 for bf16)
  double optimizer_step_bytes = 0;  // bytes the optimizer reads + writes per parameter it updates
  bool flash_attention = false;     // the attention core never materialises the (s x s) scores
  bool overlap_dp = false;          // data-parallel reduction overlaps the last micro-batch's backward
  // Optimizer offload (Layout::offload): the device-host link per GPU, one direction (PCIe), and the host memory
  // bandwidth one GPU's CPU-side AdamW gets, bytes/s.
  double host_link_bandwidth = 0;
  double host_memory_bandwidth = 0;
};

// Where the GPUs sit: nodes of gpus_per_node GPUs (one NIC per GPU, GPU i of every node on rail i), nodes_per_unit
// nodes behind one set of rail ToR switches, units_per_leaf units per leaf group, leaves joined by the spine.
// Same-rail traffic takes 1 hop inside a unit, 3 across units of a leaf, 5 across the spine.
struct Topology {
  std::string origin;  // file, or "default"
  std::string gpu_type;
  int gpus_per_node = 8;
  int nodes_per_unit = 20;
  int units_per_leaf = 20;
  int leaves_per_spine = 1;
  int nodes = 0;                     // nodes that exist (0: as many as the job needs)
  double leaf_bandwidth_factor = 1;  // rail bandwidth across units, relative to inside one unit
  double spine_bandwidth_factor = 1;
};

// Where a placement actually put the groups (the rail-aware scheduler scores its candidates with this): the tier of
// the narrowest switch domain holding the worst data-parallel group and the worst pair of adjacent pipeline stages,
// 0 node (NVLink), 1 unit, 2 leaf, 3 spine. -1: the packed placement estimate() assumes.
struct PlacedTiers {
  int dp = -1;
  int pp = -1;
};

struct Cluster {
  DeviceProfile device;
  Topology topology;
  int gpus = 0;
};

// The recompute modes (common/recompute.h, shared with the worker and the operator).
using railyard::Recompute;

struct Layout {
  int dp = 1, tp = 1, pp = 1;
  int micro_batch = 1;  // sequences per micro-batch
  int zero = 0;         // ZeRO stage 0..3 over the data-parallel group
  Recompute recompute = Recompute::kNone;
  bool sequence_parallel = false;
  int interleave = 1;  // virtual pipeline chunks per stage (1 = plain 1F1B)
  // AdamW state on the host, the update on the CPU overlapped with the next forward (docs/planner.md "Optimizer
  // offload"). Last, so the aggregate initialisations above keep their meaning.
  bool offload = false;
};
std::string describe(const Layout& l);  // "dp8 tp8 pp16 mb1 zero1 recompute=full sp v1"

struct Job {
  ModelShape model;
  long long global_batch = 0;  // sequences per step
  double tokens = 0;           // token budget for "days to train" (0: not asked)
};

// Bytes per GPU, for the most loaded pipeline stage.
struct MemoryBreakdown {
  double params = 0, grads = 0, optimizer = 0, activations = 0, workspace = 0;
  double host = 0;  // offloaded optimizer state and the gradient staging in host memory (not in total())
  double total() const { return params + grads + optimizer + activations + workspace; }
};

// Seconds per step. step = pipeline (compute + tp + pp, with the bubble) + dp_exposed + zero3 + optimizer.
struct TimeBreakdown {
  double compute = 0;     // m micro-batches of the bottleneck stage's kernels (incl. recomputation)
  double tp_comm = 0;     // tensor-parallel collectives of those m micro-batches
  double pp_comm = 0;     // pipeline send/recv of those m micro-batches
  double bubble = 0;      // pipeline fill/drain: (p-1)/v micro-batch times
  double dp_comm = 0;     // the data-parallel reduction (all-reduce or reduce-scatter + all-gather), whole
  double dp_exposed = 0;  // the part of dp_comm not hidden behind the backward
  double optimizer = 0;   // with offload: the part of the host update the next forward does not hide
  double offload = 0;     // with offload: the whole host update (gradients down, CPU AdamW, parameters up)
  double step = 0;
};

struct Estimate {
  Layout layout;
  int micro_batches = 0;  // per pipeline per step (m)
  double params_total = 0;
  double params_per_gpu = 0;
  MemoryBreakdown memory;
  double memory_capacity = 0;  // usable bytes per GPU
  bool fits = false;
  TimeBreakdown time;
  double bubble_fraction = 0;  // bubble / pipeline time
  std::string dp_tier;         // "node", "unit", "leaf", "spine" or "none": where the dp ring runs
  double tokens_per_s = 0;
  double model_flops_per_gpu = 0;     // 6N-style model FLOPs (no recomputation) per GPU per second
  double hardware_flops_per_gpu = 0;  // incl. recomputation
  double mfu = 0;                     // model_flops_per_gpu / peak
  double days = 0;                    // to the job's token budget
};

// Parameters of the model (tied embedding counted once): L(12h^2 + 13h) + Vh + sh + 2h.
double parameter_count(const ModelShape& m);
// Model FLOPs per token, forward + backward, no recomputation: 72 L h^2 (1 + s/(6h) + V/(12 L h)).
double model_flops_per_token(const ModelShape& m);

// Why a layout cannot run this job on this cluster (divisibility, node size, ...), or "" when it can. Memory is not
// checked here (see Estimate::fits).
std::string check_layout(const Job& job, const Cluster& cluster, const Layout& layout);

// The estimate of one layout; throws railyard::ConfigError with check_layout's reason when the layout is invalid.
Estimate estimate(const Job& job, const Cluster& cluster, const Layout& layout);
// The same for a placement whose groups sit at the given tiers (the rail-aware scheduler's candidates).
Estimate estimate(const Job& job, const Cluster& cluster, const Layout& layout, const PlacedTiers& placed);

// The 1F1B pipeline bubble as a fraction of the pipeline's time: (p-1)/(v*m + p-1).
double bubble_fraction(int pp, int micro_batches, int interleave);

// Activation bytes of one transformer layer for one micro-batch (Korthikanti et al.), on one GPU.
double layer_activation_bytes(const ModelShape& m, const DeviceProfile& d, const Layout& l);

// The host side of optimizer offload for `params` parameters on one GPU: gradients down and weights up over the host
// link plus AdamW at host memory bandwidth, one after the other (the worker's CPU thread does them in turn).
double offload_update_seconds(const DeviceProfile& d, double params);
// What the next step's forward does not hide of an update of `update` seconds: the first group (the embedding, a
// `first_share` of the parameters) is waited for whole; the rest overlaps a forward of `forward` seconds.
double offload_exposed_seconds(double update, double first_share, double forward);

// Validates a shape (positive, hidden divisible by heads); throws ConfigError naming the field.
void validate(const ModelShape& m);

}  // namespace railyard::plan
