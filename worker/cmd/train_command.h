// The commands of the `railyard-worker` binary besides `agent` (worker/agent): `train` and `gemm-rate`.
#pragma once

namespace railyard::worker {

// `railyard-worker train [flags]` (docs/worker.md): argv[1] is "train". The exit code of the run (0 done, 3 too many
// non-finite steps); throws ConfigError (exit 2) for bad flags or input.
int cmd_train(int argc, char** argv);

// `railyard-worker gemm-rate [--model SPEC] [--batch B] [--seq T] [--threads N] [--split pool|openblas]`: prints the
// GEMM rate MFU is measured against, as JSON.
int cmd_gemm_rate(int argc, char** argv);

}  // namespace railyard::worker
