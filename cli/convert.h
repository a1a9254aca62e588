// `railyard convert`: a Kubeflow PyTorchJob (kubeflow.org/v1) or Trainer v2 TrainJob (trainer.kubeflow.org/v1alpha1,
// with its torch ClusterTrainingRuntime or TrainingRuntime) as the equivalent TrainingJob with spec.program. Pure: JSON
// in, JSON and notes out (cli/convert_command.cc reads and writes the files). docs/migrating.md has the mapping.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace railyard::cli {

struct Conversion {
  nlohmann::json job;              // the TrainingJob
  std::vector<std::string> notes;  // each: a setting not carried over, or carried over with another meaning, and why
};

// The documents of the input (any order): exactly one PyTorchJob or TrainJob, and for a TrainJob the runtime it
// names. Throws railyard::Error naming the field and the fix for what cannot be converted without changing its
// meaning silently (no command, Master and Worker templates that differ, a runtime that is not torch, a runtime
// missing).
Conversion convert_manifests(const std::vector<nlohmann::json>& docs);

// The part of a command that torchrun (or `python -m torch.distributed.run`) would run, and its per-node process
// count: ["torchrun", "--nproc_per_node=4", "train.py", "--lr", "1"] -> program ["python", "train.py", "--lr", "1"],
// nproc "4". Not torchrun: nullopt.
struct TorchrunCommand {
  std::vector<std::string> program;
  std::string nproc_per_node;        // "" when not given
  std::vector<std::string> dropped;  // the launcher flags left out (Railyard's rendezvous replaces them)
};
std::optional<TorchrunCommand> split_torchrun(const std::vector<std::string>& command);

}  // namespace railyard::cli
