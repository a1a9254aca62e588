// Pure layout math of the tensor- and pipeline-parallel GPT (docs/parallel.md): how layers are split into pipeline
// stages, and which slice of every llm.c parameter tensor a (tp rank, pp stage) holds in its local flat buffer.
// No communication here, so all of it is unit-tested without a world.
#pragma once

#include <array>
#include <cstddef>
#include <vector>

#include "worker/model/gpt_config.h"

namespace railyard::worker::parallel {

// Forward+backward FLOPs per token of the pieces a stage can hold (the balancing weights).
struct StageCosts {
  double layer = 0;      // one transformer block: 3 * (24 C^2 + 4 T C)
  double embedding = 0;  // first stage: wte row + wpe lookups and their scatter-add, 3 * C (tiny, but counted)
  double head = 0;       // last stage: final layernorm, tied LM head and cross entropy, 3 * (2 C Vp + 5 Vp + 10 C)
};
StageCosts stage_costs(const GptConfig& c, int seq_len);

// Splits the L layers into `pp` contiguous stages, every stage at least one layer, so that the most expensive stage
// (layers * layer cost, + embedding on stage 0, + head on stage pp-1) is as cheap as possible; among those splits,
// the most even one (smallest sum of squared stage costs; on a tie, fewer layers on earlier stages, which hold more
// in-flight micro-batches in 1F1B). Returns b[0] = 0 < b[1] < ... < b[pp] = L: stage s owns layers [b[s], b[s+1]).
// Throws ConfigError when pp < 1 or pp > L.
std::vector<int> balance_stages(const GptConfig& c, int seq_len, int pp);
// The cost of stage s under boundaries b (the quantity balance_stages minimises the maximum of).
double stage_cost(const StageCosts& k, const std::vector<int>& b, int s);

// Where one rank sits: its tensor-parallel rank, its pipeline stage and that stage's layers.
struct StageShape {
  GptConfig config;
  int tp_size = 1, tp_rank = 0;
  int pp_size = 1, pp_rank = 0;
  int layer_begin = 0, layer_end = 0;  // [l0, l1) of the global layers

  bool first() const { return pp_rank == 0; }
  bool last() const { return pp_rank == pp_size - 1; }
  int layers() const { return layer_end - layer_begin; }
  int local_channels() const { return config.channels / tp_size; }        // Cl: this rank's share of C
  int local_heads() const { return config.num_heads / tp_size; }          // NHl
  int local_vocab() const { return config.padded_vocab_size / tp_size; }  // Vl: wte rows held here
  int vocab_begin() const { return tp_rank * local_vocab(); }             // first global wte row held here
  int valid_local_vocab() const;  // rows of [vocab_begin, +Vl) below the real V (the rest are padding)
};

// Throws ConfigError naming the degree that does not divide the model (heads by tp, padded vocab by tp, pp by L).
void validate_layout(const GptConfig& c, int tp, int pp);
// The shape of rank (tp_rank, pp_rank) with balance_stages' boundaries, or `boundaries` when given.
StageShape make_stage_shape(const GptConfig& c, int seq_len, int tp_size, int tp_rank, int pp_size, int pp_rank,
                            const std::vector<int>& boundaries = {});

// Element counts of the 16 local tensors, in llm.c order (0 for tensors this stage does not hold). With tp = pp = 1
// these are exactly param_sizes(config): the local buffer is then the llm.c buffer.
std::array<size_t, kNumParamTensors> local_param_sizes(const StageShape& s);

// Mixture of experts: the stage's router weights (Ls, E, C), stored after lnfb (0 for a dense model); the local
// buffer then holds local_num_params = the 16 sizes + the router.
size_t local_router_size(const StageShape& s);
size_t local_num_params(const StageShape& s);

// One local piece as a box of a global llm.c tensor. The piece is stored in the local flat buffer at local_offset as
// a dense row-major array of shape `extent`.
struct ShardSlice {
  int tensor = 0;                    // index into kParamNames, or kRouterTensor (the MoE router)
  std::vector<size_t> global_shape;  // the llm.c shape of the whole tensor, e.g. (L, 3C, C) for qkvw
  std::vector<size_t> offset;        // first global index per dim
  std::vector<size_t> extent;        // length per dim
  size_t local_offset = 0;           // element offset in the local params/grads buffer
  bool tp_replicated = false;        // identical on every tp rank (layernorms, wpe, row-parallel biases)
  bool tied_copy = false;            // the last stage's copy of wte when pp > 1 (stage 0 holds the primary)
  size_t numel() const;
};
std::vector<ShardSlice> make_shard_map(const StageShape& s);

// Copies between the full llm.c buffer (num_parameters(c) elements, e.g. params, grads or AdamW moments) and a
// local buffer of the same kind.
void copy_full_to_local(const std::vector<ShardSlice>& map, const GptConfig& c, const float* full, float* local);
void copy_local_to_full(const std::vector<ShardSlice>& map, const GptConfig& c, const float* local, float* full);

// Local [begin, end) element ranges this rank counts in a global sum over all parameters (grad norm): sharded
// slices always, tp-replicated slices on tp rank 0 only, a tied wte copy never. Summing over those ranges on every
// rank of one data-parallel replica counts each llm.c element exactly once.
struct ElementRange {
  size_t begin = 0, end = 0;
};
std::vector<ElementRange> count_once_ranges(const std::vector<ShardSlice>& map, int tp_rank);

}  // namespace railyard::worker::parallel
