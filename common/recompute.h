// Activation recomputation modes, one contract for every side that names them: the TrainingJob's
// spec.memory.recompute (operator), the planner's memory and time model, and the trainer's --recompute (worker).
// kSelective drops a layer's attention probabilities after forward and recomputes them in backward; kFull keeps only
// the layer's input and reruns its whole forward (docs/worker.md "Activation recomputation").
#pragma once

#include <optional>
#include <string_view>

namespace railyard {

enum class Recompute { kNone, kSelective, kFull };

// "none", "selective", "full": the spellings of spec.memory.recompute and --recompute.
constexpr const char* to_string(Recompute r) {
  switch (r) {
    case Recompute::kSelective:
      return "selective";
    case Recompute::kFull:
      return "full";
    case Recompute::kNone:
      break;
  }
  return "none";
}

// The mode a spelling names; nullopt for anything else.
constexpr std::optional<Recompute> recompute_from_string(std::string_view s) {
  if (s == "none") return Recompute::kNone;
  if (s == "selective") return Recompute::kSelective;
  if (s == "full") return Recompute::kFull;
  return std::nullopt;
}

}  // namespace railyard
