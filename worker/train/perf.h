// Throughput accounting: FLOPs per token, the memory budget, and the machine's measured GEMM rate.
#pragma once

#include <cstddef>
#include <string>

#include "worker/kernels/cpu/thread_pool.h"
#include "worker/model/gpt_config.h"

namespace railyard::worker {

// Training FLOPs per token (forward + backward) of the model at sequence length T:
//   6 * N  +  12 * L * C * T
// N = all parameters except wpe (the position table is a lookup, no FLOPs; wte counts because it is the LM head's
// matrix, computed over the padded Vp rows). The attention term is QK^T and AV at full T (2 * 2 * T * C per layer
// forward, times 3 for forward + backward), as in the PaLM appendix and nanoGPT. With experts, N counts the router
// and top_k of the E experts per layer (the active parameters; capacity drops are not subtracted).
double flops_per_token(const GptConfig& c, int T);

struct MemoryBudget {
  size_t params = 0, grads = 0, adam = 0, activations = 0;  // bytes; adam = m + v
  size_t host = 0;  // offloaded optimizer state and its staging (--offload), not in total()
  size_t total() const { return params + grads + adam + activations; }
  std::string describe() const;
};
MemoryBudget memory_budget(const GptConfig& c, int B, int T, int threads, const RecomputeSpec& recompute = {});

// FLOP/s that our GEMM path (OpenBLAS single-threaded per pool thread, output split across the pool) reaches on
// the step's own GEMM shapes: one layer's four linear layers and the LM head, forward and both backward GEMMs, for
// B*T rows. Best of `reps` timed passes after a warm-up. This is the floor a step can approach; MFU is reported
// against it unless a peak is given.
// scratch (optional, scratch_len floats): operand memory to reuse, e.g. the gradient buffer before the first step,
// so the measurement adds nothing to the process's peak memory. When the B*T rows' operands do not fit in it (the
// LM head's output is B*T x Vp: at B=16, T=64 it alone is larger than gpt2-124m's gradients), each GEMM is timed
// over blocks of gemm_rate_rows() rows instead (the same FLOPs); only when not even one row fits does it allocate.
// per_cpu_second (optional) receives the same FLOPs divided by the process CPU time of the best pass: a rate per
// busy core-second that other load on a shared machine disturbs much less than wall time.
// Floats the measurement's operands take for `rows` rows (weights, their gradient, inputs, outputs, input gradients).
size_t gemm_rate_scratch(const GptConfig& c, size_t rows);
// Rows per block for a measurement of B*T rows in scratch_len floats: B*T when they fit, else the largest of
// B*T/2, B*T/4, ... (rounded up) that fits; 0 when not even one row fits.
size_t gemm_rate_rows(const GptConfig& c, size_t rows, size_t scratch_len);
double measure_gemm_rate(ThreadPool& pool, const GptConfig& c, int B, int T, int reps = 3, float* scratch = nullptr,
                         size_t scratch_len = 0, double* per_cpu_second = nullptr);

}  // namespace railyard::worker
