// The CUDA implementation of the device interface (worker/device/kernels.h): the kernels of kernels.h on one stream,
// GEMMs through cuBLASLt (gemm.h) on bf16 operands: weights from a persistent bf16 copy of the model's parameters
// (set_weights) that AdamW writes in its update pass, activations and gradients converted just before each GEMM
// into a staging buffer that grows to the largest GEMM on first use. Float only (Gpt<double>, the gradient-check
// reference, is CPU-only). Compiled in CUDA builds only; never run on a GPU yet (docs/gpu.md).
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <vector>

#include "worker/device/kernels.h"
#include "worker/kernels/cuda/kernels.h"
#include "worker/kernels/cuda/launch.h"

namespace railyard::worker::cuda {

class BlasLt;

class CudaKernels final : public Kernels<float> {
 public:
  // On the current CUDA device; throws CudaError ("no CUDA device ...") without a usable GPU.
  CudaKernels();
  ~CudaKernels() override;
  CudaKernels(const CudaKernels&) = delete;
  CudaKernels& operator=(const CudaKernels&) = delete;
  cudaStream_t stream() const { return stream_; }
  void* compute_stream() override { return stream_; }

  DeviceKind kind() const override { return DeviceKind::kCuda; }
  void* alloc(size_t bytes) override;
  void free(void* p) noexcept override;
  void zero(void* p, size_t bytes) override;
  void to_host(void* host_dst, const void* src, size_t bytes) override;
  void to_device(void* dst, const void* host_src, size_t bytes) override;
  void synchronize() override;
  // On copy_stream_, not ordered after the compute stream (kernels.h): the offloaded optimizer's thread.
  void side_to_host(void* host_dst, const void* src, size_t bytes) override;
  void side_to_device(void* dst, const void* host_src, size_t bytes) override;

  size_t attention_saved_elems(int B, int Tn, int C, int NH) const override;    // lse (B,NH,T)
  size_t attention_scratch_elems(int B, int Tn, int C, int NH) const override;  // D (B,NH,T)
  size_t layernorm_scratch_elems(size_t N, int C) const override;

  void encoder_forward(float* out, const int32_t* inp, const float* wte, const float* wpe, int B, int Tn,
                       int C) override;
  void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* inp, int B, int Tn, int C) override;
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b,
                         size_t N, int C) override;
  void layernorm_backward(float* dinp, float* dw, float* db, float* scratch, const float* dout, const float* inp,
                          const float* w, const float* mean, const float* rstd, size_t N, int C) override;
  void matmul_forward(float* out, const float* inp, const float* w, const float* bias, size_t N, int IC,
                      int OC) override;
  void matmul_backward(float* dinp, bool accumulate_dinp, float* dw, float* dbias, const float* dout, const float* inp,
                       const float* w, size_t N, int IC, int OC, bool accumulate_dw) override;
  void attention_forward(float* out, float* saved, const float* qkv, int B, int Tn, int C, int NH) override;
  void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv, const float* out,
                          const float* saved, int B, int Tn, int C, int NH) override;
  void gelu_forward(float* out, const float* inp, size_t n) override;
  void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) override;
  void residual_forward(float* out, const float* a, const float* b, size_t n) override;
  void crossentropy_forward(float* losses, const float* logits, const int32_t* targets, size_t N, int V,
                            int Vp) override;
  void crossentropy_fused_backward(float* losses, float* logits, const int32_t* targets, size_t N, int V, int Vp,
                                   float dloss) override;

  void adamw_update(float* params, const float* grads, float* m, float* v, size_t n, float lr, float beta1, float beta2,
                    float eps, float weight_decay, int64_t t, float grad_scale) override;
  double global_norm(const float* x, size_t n) override;

  // Fused forms: GELU_AUX_BIAS cuBLASLt epilogue (falls back to GEMM + gelu_forward when OC is not a multiple of 8 or
  // there is no bias), and the residual+layernorm kernel.
  void matmul_gelu_forward(float* out, float* pre, const float* inp, const float* w, const float* bias, size_t N,
                           int IC, int OC) override;
  void residual_layernorm_forward(float* residual, float* out, float* mean, float* rstd, const float* a, const float* b,
                                  const float* w, const float* bias, size_t N, int C) override;
  // Persistent bf16 copy of the weights: GEMM weight operands inside [params, params + n) are read from it (when
  // their offset keeps cuBLASLt's 16-byte alignment) instead of being converted per GEMM; adamw_update writes it in
  // its pass, to_device into the range refreshes the part written, free(params) drops it.
  void set_weights(const float* params, size_t n) override;
  void weights_changed() override;
  // The bf16 copy of w[0, n) if it lies in the weights and is aligned, else null (host logic, for the tests too).
  const bf16* weight_copy(const float* w, size_t n) const;
  // The tensor/pipeline-parallel stage (stage_kernels.h; copy is a device-to-device cudaMemcpyAsync).
  void vocab_embedding_forward(float* out, const int32_t* inp, const float* wte_local, int v0, int Vl, size_t N,
                               int C) override;
  void add_positions_rows(float* out, const float* wpe, size_t row0, size_t rows, int Tn, int C) override;
  void vocab_embedding_backward(float* dwte_local, float* dwpe, const float* dout, const int32_t* inp, int v0, int Vl,
                                int B, int Tn, int C) override;
  void vocab_ce_local_max(float* mx, const float* logits, size_t N, int Vl, int Vr) override;
  void vocab_ce_local_sums(float* sums, float* logits, const float* mx, const int32_t* targets, int v0, size_t N,
                           int Vl, int Vr) override;
  void vocab_ce_finish(float* losses, float* logits, const float* sums, const float* mx, const int32_t* targets, int v0,
                       size_t N, int Vl, int Vr, float scale) override;
  void accumulate(float* out, const float* in, size_t n) override;
  void copy(float* dst, const float* src, size_t n) override;
  // Ring attention (ring_kernels.h).
  void ring_forward_begin(float* kv, float* out, float* m, float* l, const float* qkv, int B, int Tc, int C,
                          int NH) override;
  void ring_forward_block(float* out, float* m, float* l, const float* qkv, const float* kv, int B, int Tc, int C,
                          int NH, bool diagonal) override;
  void ring_forward_end(float* out, float* lse, const float* m, const float* l, int B, int Tc, int C, int NH) override;
  void ring_backward_begin(float* kv, float* dkv, float* dqkv, float* D, const float* dout, const float* qkv,
                           const float* out, int B, int Tc, int C, int NH) override;
  void ring_backward_block(float* dqkv, float* dkv, const float* dout, const float* qkv, const float* kv,
                           const float* lse, const float* D, int B, int Tc, int C, int NH, bool diagonal) override;
  void ring_backward_end(float* dqkv, const float* dkv, int B, int Tc, int C) override;
  // Mixture of experts (moe_kernels.h); the dispatch stays on the host.
  void moe_route(float* probs, int32_t* choice, size_t N, size_t E, size_t k) override;
  void moe_gather_rows(float* dst, const float* src, const int32_t* idx, size_t n, size_t C) override;
  void moe_gate_rows(float* dst, const float* src, const float* probs, const int32_t* idx, size_t e, size_t E, size_t n,
                     size_t C) override;
  void moe_combine(float* out, const float* probs, const int32_t* choice, const int32_t* row, const float* y, size_t N,
                   size_t E, size_t k, size_t C) override;
  void moe_router_backward(float* dprobs, const float* probs, const int32_t* choice, const int32_t* row, const float* y,
                           const float* dout, const float* aux, float dloss, size_t N, size_t E, size_t k,
                           size_t C) override;
  void moe_combine_input_grads(float* dx, const int32_t* row, const float* dxe, size_t N, size_t k, size_t C) override;
  void divide(float* x, float divisor, size_t n) override;

 private:
  // encoder_backward / vocab_embedding_backward: the rows of `inp` whose id is in [lo, hi) grouped by token
  // (launch.h token_rows) in device memory.
  struct DeviceTokenRows {
    int32_t *rows, *tokens, *starts;
    size_t distinct;
  };
  DeviceTokenRows upload_token_rows(const int32_t* inp, size_t N, int32_t lo, int32_t hi);
  // bf16 staging for `elems` GEMM operand elements (grown, never shrunk).
  bf16* staging(size_t elems);
  // A GEMM's weight operand in bf16: the persistent copy, or converted into `slot` (staging).
  const bf16* weight16(const float* w, size_t n, bf16* slot);
  // Re-rounds the part of the bf16 weight copy that [dst, dst + bytes) overlaps, on `stream` (after the copy into it).
  void refresh_weight_copy(const void* dst, size_t bytes, cudaStream_t stream);

  // encoder_backward's rows grouped by token: built on the host from a copy of the token ids, uploaded into
  // token_rows_dev_ ([rows | tokens | starts], grown, never shrunk).
  TokenRows token_rows_;
  std::vector<int32_t> token_ids_;
  int32_t* token_rows_dev_ = nullptr;
  size_t token_rows_dev_elems_ = 0;
  cudaStream_t stream_ = nullptr;
  // The side copies' stream (non-blocking): the offload thread's copies overlap the compute stream's kernels.
  cudaStream_t copy_stream_ = nullptr;
  std::unique_ptr<BlasLt> lt_;
  bf16* staging_ = nullptr;
  size_t staging_elems_ = 0;
  double* partials_ = nullptr;
  size_t partials_elems_ = 0;
  std::vector<double> host_partials_;
  const float* weights_ = nullptr;  // set_weights' range and its bf16 copy
  size_t weights_elems_ = 0;
  bf16* weights16_ = nullptr;
};

}  // namespace railyard::worker::cuda
