// The CPU implementation of the device interface (kernels.h): worker/kernels/cpu on a ThreadPool. These are the CPU
// twins of the CUDA kernels that the CPU trainer runs, so every CI run tests them (the worker_* tests) and the CUDA
// parity test compares against exactly this class.
#pragma once

#include <vector>

#include "worker/device/kernels.h"
#include "worker/kernels/cpu/thread_pool.h"

namespace railyard::worker {

template <typename T>
class CpuKernels final : public Kernels<T> {
 public:
  explicit CpuKernels(ThreadPool& pool);
  ThreadPool& pool() const { return pool_; }

  DeviceKind kind() const override { return DeviceKind::kCpu; }
  void* alloc(size_t bytes) override;
  void free(void* p) noexcept override;
  void zero(void* p, size_t bytes) override;
  void to_host(void* host_dst, const void* src, size_t bytes) override;
  void to_device(void* dst, const void* host_src, size_t bytes) override;
  void synchronize() override {}

  size_t attention_saved_elems(int B, int Tn, int C, int NH) const override;
  size_t attention_scratch_elems(int B, int Tn, int C, int NH) const override;
  size_t layernorm_scratch_elems(size_t, int) const override { return 0; }

  void encoder_forward(T* out, const int32_t* inp, const T* wte, const T* wpe, int B, int Tn, int C) override;
  void encoder_backward(T* dwte, T* dwpe, const T* dout, const int32_t* inp, int B, int Tn, int C) override;
  void layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* w, const T* b, size_t N, int C) override;
  void layernorm_backward(T* dinp, T* dw, T* db, T* scratch, const T* dout, const T* inp, const T* w, const T* mean,
                          const T* rstd, size_t N, int C) override;
  void matmul_forward(T* out, const T* inp, const T* w, const T* bias, size_t N, int IC, int OC) override;
  void matmul_backward(T* dinp, bool accumulate_dinp, T* dw, T* dbias, const T* dout, const T* inp, const T* w,
                       size_t N, int IC, int OC, bool accumulate_dw) override;
  void attention_forward(T* out, T* saved, const T* qkv, int B, int Tn, int C, int NH) override;
  void attention_backward(T* dqkv, T* scratch, const T* dout, const T* qkv, const T* out, const T* saved, int B, int Tn,
                          int C, int NH) override;
  void gelu_forward(T* out, const T* inp, size_t n) override;
  void gelu_backward(T* dinp, const T* inp, const T* dout, size_t n) override;
  void residual_forward(T* out, const T* a, const T* b, size_t n) override;
  void crossentropy_forward(T* losses, const T* logits, const int32_t* targets, size_t N, int V, int Vp) override;
  void crossentropy_fused_backward(T* losses, T* logits, const int32_t* targets, size_t N, int V, int Vp,
                                   T dloss) override;

  void adamw_update(float* params, const float* grads, float* m, float* v, size_t n, float lr, float beta1, float beta2,
                    float eps, float weight_decay, int64_t t, float grad_scale) override;
  double global_norm(const float* x, size_t n) override;

  // worker/parallel/vocab_parallel.cc for float; CpuKernels<double> throws (no parallel stage in double).
  void vocab_embedding_forward(T* out, const int32_t* inp, const T* wte_local, int v0, int Vl, size_t N,
                               int C) override;
  void add_positions_rows(T* out, const T* wpe, size_t row0, size_t rows, int Tn, int C) override;
  void vocab_embedding_backward(T* dwte_local, T* dwpe, const T* dout, const int32_t* inp, int v0, int Vl, int B,
                                int Tn, int C) override;
  void vocab_ce_local_max(T* mx, const T* logits, size_t N, int Vl, int Vr) override;
  void vocab_ce_local_sums(T* sums, T* logits, const T* mx, const int32_t* targets, int v0, size_t N, int Vl,
                           int Vr) override;
  void vocab_ce_finish(T* losses, T* logits, const T* sums, const T* mx, const int32_t* targets, int v0, size_t N,
                       int Vl, int Vr, T scale) override;
  void accumulate(T* out, const T* in, size_t n) override;
  void copy(T* dst, const T* src, size_t n) override;
  void ring_forward_begin(T* kv, T* out, T* m, T* l, const T* qkv, int B, int Tc, int C, int NH) override;
  void ring_forward_block(T* out, T* m, T* l, const T* qkv, const T* kv, int B, int Tc, int C, int NH,
                          bool diagonal) override;
  void ring_forward_end(T* out, T* lse, const T* m, const T* l, int B, int Tc, int C, int NH) override;
  void ring_backward_begin(T* kv, T* dkv, T* dqkv, T* D, const T* dout, const T* qkv, const T* out, int B, int Tc,
                           int C, int NH) override;
  void ring_backward_block(T* dqkv, T* dkv, const T* dout, const T* qkv, const T* kv, const T* lse, const T* D, int B,
                           int Tc, int C, int NH, bool diagonal) override;
  void ring_backward_end(T* dqkv, const T* dkv, int B, int Tc, int C) override;
  // worker/model/moe_math.h (the MoE math Gpt and GptStage ran on the host before).
  void moe_route(T* probs, int32_t* choice, size_t N, size_t E, size_t k) override;
  void moe_gather_rows(T* dst, const T* src, const int32_t* idx, size_t n, size_t C) override;
  void moe_gate_rows(T* dst, const T* src, const T* probs, const int32_t* idx, size_t e, size_t E, size_t n,
                     size_t C) override;
  void moe_combine(T* out, const T* probs, const int32_t* choice, const int32_t* row, const T* y, size_t N, size_t E,
                   size_t k, size_t C) override;
  void moe_router_backward(T* dprobs, const T* probs, const int32_t* choice, const int32_t* row, const T* y,
                           const T* dout, const T* aux, T dloss, size_t N, size_t E, size_t k, size_t C) override;
  void moe_combine_input_grads(T* dx, const int32_t* row, const T* dxe, size_t N, size_t k, size_t C) override;
  void divide(T* x, T divisor, size_t n) override;

 private:
  ThreadPool& pool_;
  std::vector<double> partials_;  // global_norm's per-chunk sums
};

extern template class CpuKernels<float>;
extern template class CpuKernels<double>;

}  // namespace railyard::worker
