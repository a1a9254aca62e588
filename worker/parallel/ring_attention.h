// Context parallelism's attention (docs/parallel.md "Context parallelism"): causal self-attention of sequences split
// along the sequence over a cp group, with a ring exchange of keys and values (Liu et al., Ring Attention; the
// blockwise online softmax of FlashAttention). Rank r holds positions [r Tc, (r+1) Tc) of every sequence, Tc = T/cp.
//
// Forward: cp steps; at step s rank r holds the keys/values of block j = (r - s) mod cp (its own first), attends to
// them with causal masking (block j > r: all masked, skipped; j = r: the diagonal; j < r: all visible), merges the
// partial result into a running (max, sum, unnormalised output) per query row, and passes the block to rank r+1
// while receiving block j-1 from rank r-1. Keeps only the output and one log-sum-exp per (b, head, row): the (T, T)
// probabilities are never stored (backward recomputes them block by block).
// Backward: the same ring carries each block's keys/values together with the accumulated d(keys)/d(values) of that
// block; after cp hops the gradients are back at their owner. d(queries) accumulate locally.
//
// Layouts as the CPU attention kernel (kernels.h): qkv (B,Tc,3C) with q, k, v per token, head h in channels
// [h hs, (h+1) hs); out (B,Tc,C); lse (B,NH,Tc).
// The math runs through the device interface (Kernels<float>::ring_*; CPU twins in CpuKernels, CUDA in
// worker/kernels/cuda/ring_kernels.cu), so every pointer here is device memory and the communicator must take it
// (Gloo on the CPU, NCCL on CUDA); the device is synchronized before each communicator call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "worker/comm/communicator.h"
#include "worker/device/kernels.h"
#include "worker/kernels/cpu/thread_pool.h"

namespace railyard::worker::parallel {

class RingAttention {
 public:
  // cp: the context-parallel group (size = cp degree; nullptr = 1). Tc: local sequence length.
  RingAttention(comm::Communicator* cp, int B, int Tc, int C, int NH, Kernels<float>& dev);
  // The same on host memory with the CPU kernels on `pool`.
  RingAttention(comm::Communicator* cp, int B, int Tc, int C, int NH, ThreadPool& pool);

  void forward(const float* qkv, float* out, float* lse);
  // dqkv (B,Tc,3C) is overwritten with d(loss)/d(qkv) of this rank's positions.
  void backward(const float* dout, const float* qkv, const float* out, const float* lse, float* dqkv);

  // Bytes sent by this rank per forward / backward (what the planner's ring model counts).
  size_t forward_bytes_sent() const { return fwd_bytes_; }
  size_t backward_bytes_sent() const { return bwd_bytes_; }
  // Bytes of its buffers: the key/value block in hand and in flight, their gradients, and three floats per row.
  size_t workspace_bytes() const {
    return (kv_.size() + kv_next_.size() + dkv_.size() + dkv_next_.size() + m_.size() + l_.size() + d_.size()) *
           sizeof(float);
  }

 private:
  // Sends `send` (count floats) to rank+1 and receives `recv` from rank-1, tags unique per call.
  void shift(const float* send, float* recv, size_t count, uint32_t tag);

  RingAttention(comm::Communicator* cp, int B, int Tc, int C, int NH, std::unique_ptr<Kernels<float>> own,
                Kernels<float>* dev);

  std::unique_ptr<Kernels<float>> own_dev_;  // the host constructor's CpuKernels
  comm::Communicator* cp_;
  int B_, Tc_, C_, NH_, size_, rank_;
  Kernels<float>& dev_;
  uint32_t calls_ = 0;
  size_t fwd_bytes_ = 0, bwd_bytes_ = 0;
  DeviceBuffer<float> kv_, kv_next_, dkv_, dkv_next_, m_, l_, d_;
};

}  // namespace railyard::worker::parallel
