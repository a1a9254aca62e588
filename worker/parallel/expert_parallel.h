// Expert parallelism (docs/parallel.md "Expert parallelism"): the E experts of every MoE layer split over groups of
// `ep` consecutive data-parallel ranks, dispatch and combine by all_to_all. This file builds the groups and wires a
// Gpt's ExpertExchange to a flat or hierarchical all_to_all; the model side is worker/model/gpt_expert_parallel.cc.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "worker/comm/all_to_all.h"
#include "worker/comm/communicator.h"
#include "worker/model/gpt.h"
#include "worker/parallel/gpt_stage.h"

namespace railyard::worker::parallel {

struct ExpertParallelOptions {
  int ep = 1;                      // --ep: ranks sharing one copy of the experts' work (divides E and dp)
  std::string algorithm = "flat";  // --ep-a2a: flat | hierarchical
  int node_size = 0;               // --ep-node-size: ranks per node for hierarchical (0: LOCAL_WORLD_SIZE)
  bool deterministic = false;      // --deterministic: expert gradients go back to their tokens' ranks (gpt.h)
};

// Data-parallel ranks of dp_rank's expert-parallel group: the `ep` consecutive ranks [ep * (r / ep), ... + ep).
std::vector<int> ep_group_ranks(int dp_size, int ep, int dp_rank);
// Data-parallel ranks holding the same experts as dp_rank: {r % ep, r % ep + ep, ...} (dp / ep ranks).
std::vector<int> expert_dp_ranks(int dp_size, int ep, int dp_rank);

// The combinations expert parallelism supports; throws ConfigError naming the flag and the fix otherwise.
void validate_expert_parallel(const GptConfig& model, const ExpertParallelOptions& o, int dp, int tp, int pp, int zero,
                              bool deterministic, bool uneven_dp_split);

// Collective over `dp`: splits it into expert-parallel groups ("ep") and builds the all_to_all of the group.
// device_dp: the same dp ranks over a communicator that takes device memory (NCCL on CUDA), for a model whose buffers
// are not the host's: the exchange's all_to_all and the expert-data-parallel gradient reduction then run over splits
// of it (collective over it too), while group() and expert_data_parallel() stay host groups (host values: the grad
// norm's sums). Only the flat all_to_all takes device memory (the hierarchical one stages chunks on the host).
class ExpertParallel {
 public:
  ExpertParallel(comm::Communicator& dp, const ExpertParallelOptions& options, comm::Communicator* device_dp = nullptr);
  comm::Communicator& group() { return *group_; }
  // Expert-parallel storage (docs/parallel.md "Expert parallelism"): this rank's layout, E/ep experts per layer
  // (the experts it runs), for the model, the optimizer and the data-parallel reducer.
  GptConfig local_config(const GptConfig& global) const;
  // The dp ranks holding the same experts (position r % ep of every ep group: dp/ep ranks), over which expert
  // gradients are reduced. Split from dp on the first call: collective over dp, every rank calls it or none.
  comm::Communicator& expert_data_parallel();
  // The ranks of expert_data_parallel() over device_dp (device gradients; that group itself without device_dp).
  // Split on the first call: collective over device_dp.
  comm::Communicator& device_expert_data_parallel();
  comm::AllToAll& all_to_all() { return *a2a_; }
  bool device_exchange() const { return device_dp_ != nullptr; }
  // Installs the exchange in `model` (which must outlive neither this object nor its group).
  template <typename T>
  void attach(Gpt<T>& model);
  // The same exchange in a tensor/pipeline stage (the dp group this was built on is its (tp, pp) coordinate's).
  void attach(GptStage& stage);
  // "ep=2 group [0,1] flat all_to_all over 2" for the layout line.
  std::string describe() const;

 private:
  ExpertParallelOptions options_;
  std::vector<int> ranks_;
  comm::Communicator& dp_;
  comm::Communicator* device_dp_;
  std::unique_ptr<comm::Communicator> group_;
  std::unique_ptr<comm::Communicator> edp_;
  std::unique_ptr<comm::Communicator> device_group_;  // the ep group over device_dp: what the exchange runs on
  std::unique_ptr<comm::Communicator> device_edp_;
  std::unique_ptr<comm::AllToAll> a2a_;
};

}  // namespace railyard::worker::parallel
