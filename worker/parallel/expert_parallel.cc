#include "worker/parallel/expert_parallel.h"

#include <cstdlib>

#include "common/error.h"
#include "common/pod_env.h"

namespace railyard::worker::parallel {

std::vector<int> ep_group_ranks(int dp_size, int ep, int dp_rank) {
  std::vector<int> out;
  const int first = dp_rank / ep * ep;
  for (int i = 0; i < ep && first + i < dp_size; ++i) out.push_back(first + i);
  return out;
}

std::vector<int> expert_dp_ranks(int dp_size, int ep, int dp_rank) {
  std::vector<int> out;
  for (int r = dp_rank % ep; r < dp_size; r += ep) out.push_back(r);
  return out;
}

void validate_expert_parallel(const GptConfig& m, const ExpertParallelOptions& o, int dp, int tp, int pp,
                              int /*zero: composes (the experts' gradients reduce-scatter like the rest)*/,
                              bool deterministic /*composes without --tp/--pp (ExpertParallelOptions)*/,
                              bool uneven_dp_split) {
  const std::string ep = "--ep " + std::to_string(o.ep);
  if (o.ep < 1) throw ConfigError(ep + ": must be >= 1");
  if (o.algorithm != "flat" && o.algorithm != "hierarchical") {
    throw ConfigError("--ep-a2a " + o.algorithm + ": must be flat or hierarchical");
  }
  if (o.ep == 1) return;
  if (m.moe.experts <= 0) throw ConfigError(ep + " needs a mixture-of-experts model: add --moe-experts E");
  if (m.moe.experts % o.ep != 0) {
    throw ConfigError(ep + ": --moe-experts " + std::to_string(m.moe.experts) +
                      " is not divisible by it; pick an expert-parallel degree that divides the experts");
  }
  if (dp % o.ep != 0) {
    throw ConfigError(ep + ": the data-parallel degree " + std::to_string(dp) +
                      " is not divisible by it (expert-parallel groups are made of data-parallel ranks); use --nproc "
                      "or WORLD_SIZE a multiple of --ep");
  }
  if ((tp > 1 || pp > 1) && deterministic) {
    throw ConfigError(ep +
                      " with --deterministic and --tp/--pp: the stage path does not return expert gradients to their "
                      "tokens' ranks (the deterministic tree needs it); drop --deterministic or --ep");
  }
  if (uneven_dp_split) {
    throw ConfigError(ep +
                      " with an uneven data-parallel split: every rank of a group must run the same number of "
                      "micro-batches (each forward is collective); drop the split");
  }
}

ExpertParallel::ExpertParallel(comm::Communicator& dp, const ExpertParallelOptions& o, comm::Communicator* device_dp)
    : options_(o), dp_(dp), device_dp_(device_dp) {
  ranks_ = ep_group_ranks(dp.size(), o.ep, dp.rank());
  if (device_dp != nullptr && o.algorithm != "flat") {
    throw ConfigError("--ep-a2a " + o.algorithm +
                      " with spec.device / --device cuda: the hierarchical all_to_all stages its chunks in host "
                      "memory; use --ep-a2a flat (NCCL's all_to_all) or --device cpu");
  }
  if (device_dp != nullptr && (device_dp->size() != dp.size() || device_dp->rank() != dp.rank())) {
    throw Error("expert parallelism: the device dp group does not match the dp group");
  }
  group_ = dp.split(ranks_, "ep");
  if (device_dp != nullptr) {
    device_group_ = device_dp->split(ranks_, "ep");
    a2a_ = comm::make_all_to_all(*device_group_, "flat", 0);
    return;
  }
  int node = o.node_size;
  if (node == 0 && o.algorithm == "hierarchical") {
    const char* env = std::getenv(pod_env::kLocalWorldSize);
    node = env != nullptr ? std::atoi(env) : 0;
    // A node holding more ranks than the group: the whole group is node-local.
    if (node > group_->size()) node = group_->size();
  }
  a2a_ = comm::make_all_to_all(*group_, o.algorithm, node);
}

GptConfig ExpertParallel::local_config(const GptConfig& global) const {
  return expert_shard_config(global, group_->size(), group_->rank());
}

comm::Communicator& ExpertParallel::expert_data_parallel() {
  if (!edp_) edp_ = dp_.split(expert_dp_ranks(dp_.size(), group_->size(), dp_.rank()), "ep-dp");
  return *edp_;
}

comm::Communicator& ExpertParallel::device_expert_data_parallel() {
  comm::Communicator& host = expert_data_parallel();  // split first, so every rank splits in the same order
  if (device_dp_ == nullptr) return host;
  if (!device_edp_) {
    device_edp_ = device_dp_->split(expert_dp_ranks(dp_.size(), group_->size(), dp_.rank()), "ep-dp");
  }
  return *device_edp_;
}

namespace {

// The exchange a Gpt<T> or a GptStage installs: this rank's place in the group and its all_to_all.
template <typename Exchange>
Exchange make_exchange(comm::Communicator& group, comm::AllToAll* a2a, bool deterministic) {
  Exchange x;
  x.size = group.size();
  x.rank = group.rank();
  x.return_expert_grads = deterministic;
  // Bytes as int32 elements: all_to_all only moves data, and every chunk here is a multiple of 4 bytes.
  x.all_to_all = [a2a](const void* in, void* out, size_t bytes) {
    a2a->run(in, out, bytes / sizeof(int32_t), comm::DType::kInt32);
  };
  return x;
}

}  // namespace

template <typename T>
void ExpertParallel::attach(Gpt<T>& model) {
  model.set_expert_exchange(
      make_exchange<typename Gpt<T>::ExpertExchange>(*group_, a2a_.get(), options_.deterministic));
}

void ExpertParallel::attach(GptStage& stage) {
  stage.set_expert_exchange(make_exchange<Gpt<float>::ExpertExchange>(*group_, a2a_.get(), options_.deterministic));
}

std::string ExpertParallel::describe() const {
  return "ep=" + std::to_string(options_.ep) + " group " + comm::rank_list(ranks_) + " " + a2a_->describe() +
         (device_dp_ != nullptr ? " (device memory)" : "");
}

template void ExpertParallel::attach(Gpt<float>&);
template void ExpertParallel::attach(Gpt<double>&);

}  // namespace railyard::worker::parallel
