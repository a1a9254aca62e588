// The device interface of the trainer (issue #11): memory and the kernel set that Gpt's dense forward/backward and the
// AdamW step call, so the model code is one code path and device-specific code lives only in the implementations:
//   CpuKernels<T>  (worker/device/cpu_kernels.h): worker/kernels/cpu on the ThreadPool; float trains, double is the
//                  gradient check's reference.
//   CudaKernels    (worker/kernels/cuda/cuda_device.h, CUDA builds only): worker/kernels/cuda on one stream, GEMMs
//                  through cuBLASLt on bf16 copies of their operands.
// The signatures are the CPU kernels' (worker/kernels/cpu/kernels.h) without the pool; where the two devices keep
// different state the implementation sizes it (attention_saved_elems: the CPU keeps the (B,NH,T,T) probabilities,
// CUDA the (B,NH,T) row log-sum-exp; scratch sizes come from each kernel family's own plan). Pointers passed to
// kernels are device memory from alloc(); on the CPU that is ordinary host memory (host_accessible()).
// Errors throw (CudaError on CUDA); no kernel allocates, except CUDA's bf16 GEMM staging, which grows to the largest
// GEMM on first use, and CUDA's embedding backward, which keeps a buffer of the rows grouped by token (grown likewise).
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>

#include "worker/device/device.h"

namespace railyard::worker {

// Memory of one device. alloc() returns zero-filled memory (64-byte aligned on the CPU); copies wait for completion.
class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  virtual DeviceKind kind() const = 0;
  // True when device pointers are host pointers (the CPU): callers may then read results in place. Virtual so a test
  // can run the off-host code paths (copies, host mirrors) with CPU kernels on a machine without a GPU.
  virtual bool host_accessible() const { return kind() == DeviceKind::kCpu; }
  virtual void* alloc(size_t bytes) = 0;
  virtual void free(void* p) noexcept = 0;
  virtual void zero(void* p, size_t bytes) = 0;
  virtual void to_host(void* host_dst, const void* src, size_t bytes) = 0;
  virtual void to_device(void* dst, const void* host_src, size_t bytes) = 0;
  // Waits for all enqueued work (a no-op on the CPU, whose kernels return when done).
  virtual void synchronize() = 0;
};

// An owning array of n elements of U on a device; zero-filled, never resized.
template <typename U>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(DeviceMemory& dev, size_t n)
      : dev_(&dev), data_(static_cast<U*>(n > 0 ? dev.alloc(n * sizeof(U)) : nullptr)), size_(n) {}
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      std::swap(dev_, o.dev_);
      std::swap(data_, o.data_);
      std::swap(size_, o.size_);
    }
    return *this;
  }
  U* data() { return data_; }
  const U* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  void reset() noexcept {
    if (data_ != nullptr) dev_->free(data_);
    data_ = nullptr;
    size_ = 0;
  }
  DeviceMemory* dev_ = nullptr;
  U* data_ = nullptr;
  size_t size_ = 0;
};

// Shapes as in worker/kernels/cpu/kernels.h: B batch, Tn time, C channels, NH heads, V vocab, Vp padded vocab,
// N = B*Tn rows. Backward kernels accumulate (+=) into parameter gradients as the CPU kernels do.
template <typename T>
class Kernels : public DeviceMemory {
 public:
  // Elements of the state attention_forward saves for backward (`saved`) and of attention_backward's scratch.
  virtual size_t attention_saved_elems(int B, int Tn, int C, int NH) const = 0;
  virtual size_t attention_scratch_elems(int B, int Tn, int C, int NH) const = 0;
  // Elements of layernorm_backward's scratch (0 on the CPU).
  virtual size_t layernorm_scratch_elems(size_t N, int C) const = 0;

  virtual void encoder_forward(T* out, const int32_t* inp, const T* wte, const T* wpe, int B, int Tn, int C) = 0;
  virtual void encoder_backward(T* dwte, T* dwpe, const T* dout, const int32_t* inp, int B, int Tn, int C) = 0;
  virtual void layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* w, const T* b, size_t N, int C) = 0;
  virtual void layernorm_backward(T* dinp, T* dw, T* db, T* scratch, const T* dout, const T* inp, const T* w,
                                  const T* mean, const T* rstd, size_t N, int C) = 0;
  virtual void matmul_forward(T* out, const T* inp, const T* w, const T* bias, size_t N, int IC, int OC) = 0;
  virtual void matmul_backward(T* dinp, bool accumulate_dinp, T* dw, T* dbias, const T* dout, const T* inp, const T* w,
                               size_t N, int IC, int OC, bool accumulate_dw) = 0;
  // out (B,T,C); saved: attention_saved_elems() elements.
  virtual void attention_forward(T* out, T* saved, const T* qkv, int B, int Tn, int C, int NH) = 0;
  // dqkv (B,T,3C) overwritten; out is attention_forward's output (CUDA recomputes from it, the CPU ignores it).
  virtual void attention_backward(T* dqkv, T* scratch, const T* dout, const T* qkv, const T* out, const T* saved, int B,
                                  int Tn, int C, int NH) = 0;
  virtual void gelu_forward(T* out, const T* inp, size_t n) = 0;
  virtual void gelu_backward(T* dinp, const T* inp, const T* dout, size_t n) = 0;
  virtual void residual_forward(T* out, const T* a, const T* b, size_t n) = 0;
  virtual void crossentropy_forward(T* losses, const T* logits, const int32_t* targets, size_t N, int V, int Vp) = 0;
  virtual void crossentropy_fused_backward(T* losses, T* logits, const int32_t* targets, size_t N, int V, int Vp,
                                           T dloss) = 0;

  // The optimizer (fp32 whatever T is; worker/optim/adamw.h's arithmetic). One tensor: with g = grads * grad_scale,
  // p = p * (1 - lr * weight_decay) - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps) after the moment updates.
  virtual void adamw_update(float* params, const float* grads, float* m, float* v, size_t n, float lr, float beta1,
                            float beta2, float eps, float weight_decay, int64_t t, float grad_scale) = 0;
  // sqrt(sum x^2) in double, over fixed chunks summed in order (reproducible; not the same bits on both devices).
  virtual double global_norm(const float* x, size_t n) = 0;

  // ---- Fused forms and persistent weight copies (issue #11). Defaults are the unfused compositions above, which is
  // what CpuKernels runs, so the CPU trainer computes bit for bit what it computed before; CudaKernels overrides them.
  // pre (N,OC) = inp @ w^T + bias (kept for gelu_backward); out (N,OC) = gelu(pre). CUDA: one cuBLASLt GEMM with the
  // GELU_AUX_BIAS epilogue.
  virtual void matmul_gelu_forward(T* out, T* pre, const T* inp, const T* w, const T* bias, size_t N, int IC, int OC) {
    matmul_forward(pre, inp, w, bias, N, IC, OC);
    gelu_forward(out, pre, N * static_cast<size_t>(OC));
  }
  // residual (N,C) = a + b; out = layernorm(residual) with mean/rstd saved as layernorm_forward does. CUDA: one kernel.
  virtual void residual_layernorm_forward(T* residual, T* out, T* mean, T* rstd, const T* a, const T* b, const T* w,
                                          const T* bias, size_t N, int C) {
    residual_forward(residual, a, b, N * static_cast<size_t>(C));
    layernorm_forward(out, mean, rstd, residual, w, bias, N, C);
  }
  // The model's parameter buffer [params, params + n) (device memory from alloc()). A device may keep a low-precision
  // copy of it that GEMMs read as their weight operand instead of converting the weight before every GEMM (CUDA: bf16).
  // The device keeps the copy current for the writes it sees: adamw_update and to_device into the range. Whoever
  // writes the range any other way (a collective receiving into it, a kernel) calls weights_changed() afterwards.
  // The CPU keeps no copy (no-ops).
  virtual void set_weights(const T* /*params*/, size_t /*n*/) {}
  virtual void weights_changed() {}
  // The tensor/pipeline-parallel stage (worker/parallel/gpt_stage.h, vocab_parallel.h; appended, issue #11). wte is
  // split by vocabulary rows: this rank holds rows [v0, v0 + Vl), the first Vr of them real tokens. None of these
  // communicates; the stage all-reduces between the vocab-parallel phases.
  // out (N,C) = wte_local[inp - v0] for the tokens held here, 0 for the others.
  virtual void vocab_embedding_forward(T* out, const int32_t* inp, const T* wte_local, int v0, int Vl, size_t N,
                                       int C) = 0;
  // out (rows,C) += wpe[(row0 + i) mod Tn] for rows i of a (B,T) row-major micro-batch starting at row row0.
  virtual void add_positions_rows(T* out, const T* wpe, size_t row0, size_t rows, int Tn, int C) = 0;
  // dwte_local (Vl,C) += dout rows of the tokens held here; dwpe (Tn,C) += the sum over b (when not null).
  virtual void vocab_embedding_backward(T* dwte_local, T* dwpe, const T* dout, const int32_t* inp, int v0, int Vl,
                                        int B, int Tn, int C) = 0;
  // Vocab-parallel cross entropy, phase 1: mx (N) = max of the Vr real local logits of each row (-inf if Vr = 0).
  virtual void vocab_ce_local_max(T* mx, const T* logits, size_t N, int Vl, int Vr) = 0;
  // Phase 2: logits[:, :Vr] <- exp(logits - mx); sums (2N) = [row sums | the target's raw logit if held here, else 0].
  virtual void vocab_ce_local_sums(T* sums, T* logits, const T* mx, const int32_t* targets, int v0, size_t N, int Vl,
                                   int Vr) = 0;
  // Phase 3: losses (N) = log(S) + mx - z_target; logits <- scale * (softmax - onehot), padding columns 0.
  virtual void vocab_ce_finish(T* losses, T* logits, const T* sums, const T* mx, const int32_t* targets, int v0,
                               size_t N, int Vl, int Vr, T scale) = 0;
  // out (n) += in (n): the sequence-parallel layernorm weight gradients joining grads() after their tp all-reduce.
  virtual void accumulate(T* out, const T* in, size_t n) = 0;
  // dst (n) = src (n), both device memory (a stage's d(input) leaving for the previous pipeline stage).
  virtual void copy(T* dst, const T* src, size_t n) = 0;

  // ---- Communication ordered after the kernels (issue #11, data parallelism on CUDA). The stream this device
  // enqueues its kernels on (a cudaStream_t on CUDA), so a communicator can order its work after them
  // (comm::nccl_stream_reducer); null on devices whose kernels have finished when they return (the CPU).
  virtual void* compute_stream() { return nullptr; }

  // ---- Context parallelism's ring attention (worker/parallel/ring_attention.h; appended, issue #11): the blockwise
  // online softmax of causal attention over key/value blocks that the ring passes around; none of these communicates.
  // Layouts: qkv (B,Tc,3C) this rank's positions, out (B,Tc,C), kv a key/value block (B,Tc,2C) [k | v] per token,
  // dkv its gradient; rows m, l (running max and sum), lse, D: (B,NH,Tc). `diagonal`: the block holds the queries' own
  // positions (causal mask: key t visible to query i iff t <= i); otherwise the block precedes them (all visible).
  // Forward start: kv = qkv's keys/values, out = 0, m = -inf, l = 0.
  virtual void ring_forward_begin(T* kv, T* out, T* m, T* l, const T* qkv, int B, int Tc, int C, int NH) = 0;
  // Merges one block into (m, l, unnormalised out): out = out e^(m - m') + sum_t e^(s_t - m') v_t, m' = max(m, s).
  virtual void ring_forward_block(T* out, T* m, T* l, const T* qkv, const T* kv, int B, int Tc, int C, int NH,
                                  bool diagonal) = 0;
  // out /= l; lse = m + log l.
  virtual void ring_forward_end(T* out, T* lse, const T* m, const T* l, int B, int Tc, int C, int NH) = 0;
  // Backward start: kv as above, dkv = 0, dqkv = 0, D = rowsum(dout * out) over each head's channels.
  virtual void ring_backward_begin(T* kv, T* dkv, T* dqkv, T* D, const T* dout, const T* qkv, const T* out, int B,
                                   int Tc, int C, int NH) = 0;
  // One block pair from the merged lse: dqkv's query part += dS k, dkv += (dS^T q | P^T dout), P = e^(s - lse),
  // dS = P (dout v^T - D) / sqrt(hs).
  virtual void ring_backward_block(T* dqkv, T* dkv, const T* dout, const T* qkv, const T* kv, const T* lse, const T* D,
                                   int B, int Tc, int C, int NH, bool diagonal) = 0;
  // dqkv's key/value part = dkv (the block's gradient back at its owner).
  virtual void ring_backward_end(T* dqkv, const T* dkv, int B, int Tc, int C) = 0;

  // ---- Mixture of experts (worker/model/moe_math.h; appended, issue #11): the per-token math of an MoE layer. The
  // dispatch under capacity (a sequential scan over the choices) stays on the host: the model copies `choice` out and
  // `row`/`token` back in. Shapes: N tokens, E experts, k choices per token, C channels; choice, row (N,k); probs
  // (N,E); y, dxe (E*cap, C) expert rows; idx the tokens of one expert's n rows. Each output element has one owner
  // and a fixed summation order (deterministic, recomputation reproduces it).
  // probs (N,E): router logits in, softmax out (in place); choice (N,k): the k largest, ties to the lower index.
  virtual void moe_route(T* probs, int32_t* choice, size_t N, size_t E, size_t k) = 0;
  // dst (n,C): row i = src[idx[i]] (an expert's input rows).
  virtual void moe_gather_rows(T* dst, const T* src, const int32_t* idx, size_t n, size_t C) = 0;
  // dst (n,C): row i = probs[idx[i], e] * src[idx[i]] (the gradient of expert e's output rows).
  virtual void moe_gate_rows(T* dst, const T* src, const T* probs, const int32_t* idx, size_t e, size_t E, size_t n,
                             size_t C) = 0;
  // out (N,C) = sum over the token's kept choices (row >= 0, choice order) of probs[t, choice] * y[row]; 0 if none.
  virtual void moe_combine(T* out, const T* probs, const int32_t* choice, const int32_t* row, const T* y, size_t N,
                           size_t E, size_t k, size_t C) = 0;
  // dprobs (N,E) = d objective / d router logits: aux[e] * dloss (the load-balancing loss; aux (E) device memory)
  // plus dout[t] . y[row] at each kept choice, then through the softmax: p * (dp - sum_e p dp).
  virtual void moe_router_backward(T* dprobs, const T* probs, const int32_t* choice, const int32_t* row, const T* y,
                                   const T* dout, const T* aux, T dloss, size_t N, size_t E, size_t k, size_t C) = 0;
  // dx (N,C) = sum over the token's kept choices (choice order) of dxe[row].
  virtual void moe_combine_input_grads(T* dx, const int32_t* row, const T* dxe, size_t N, size_t k, size_t C) = 0;

  // ---- Side copies (appended, ABI 7): the offloaded optimizer's thread (worker/optim/offload.h) moves parameter
  // groups down and up while the main thread's next forward runs kernels. to_host/to_device are ordered after every
  // kernel queued before them (CUDA: the compute stream), so from that thread each copy would wait for the forward
  // kernels the main thread queued meanwhile and the update could not overlap them. These run on a path of their own
  // (CUDA: a copy stream) and are safe to call from a second thread while the main thread launches kernels. The
  // caller orders them: what they read was finished (synchronize() after its writers), and no queued kernel reads or
  // writes what they write before they return. They wait for their own completion, and side_to_device keeps the
  // device's weight copy current like to_device (set_weights). Defaults: to_host/to_device (the CPU's memcpy).
  virtual void side_to_host(void* host_dst, const void* src, size_t bytes) { to_host(host_dst, src, bytes); }
  virtual void side_to_device(void* dst, const void* host_src, size_t bytes) { to_device(dst, host_src, bytes); }

  // ---- Expert parallelism on device buffers (appended, ABI 8). x (n) = x / divisor, element-wise (a true division,
  // not a multiplication by the reciprocal, so the bits are the host's): the data-parallel mean of a gradient span
  // summed over a sub-group of the dp ranks (expert-parallel storage, DataParallelOptions::group_spans).
  virtual void divide(T* x, T divisor, size_t n) = 0;
};

}  // namespace railyard::worker
