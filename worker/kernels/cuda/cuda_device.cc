#include "worker/kernels/cuda/cuda_device.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "worker/kernels/cuda/cuda_check.h"
#include "worker/kernels/cuda/gemm.h"
#include "worker/kernels/cuda/launch.h"
#include "worker/kernels/cuda/moe_kernels.h"
#include "worker/kernels/cuda/ring_kernels.h"
#include "worker/kernels/cuda/stage_kernels.h"

namespace railyard::worker::cuda {

namespace {
// global_norm's chunk (the CPU's too): partials are summed in chunk order on the host.
constexpr size_t kNormChunk = 1 << 16;
// GEMM operands start on 128-byte boundaries inside the staging buffer (cuBLASLt wants at least 16).
constexpr size_t kStagingAlign = 64;  // elements of bf16
size_t aligned(size_t elems) { return ceil_div(elems, kStagingAlign) * kStagingAlign; }

// A scratch buffer of at least `need` elements of U: grown (never shrunk) after the stream's work that may still read
// the old one has finished.
template <typename U>
U* grow(U*& buf, size_t& elems, size_t need, cudaStream_t stream) {
  if (need > elems) {
    RAILYARD_CUDA_CHECK(cudaStreamSynchronize(stream));
    if (buf != nullptr) RAILYARD_CUDA_CHECK(cudaFree(buf));
    buf = nullptr;
    elems = 0;
    void* p = nullptr;
    RAILYARD_CUDA_CHECK(cudaMalloc(&p, need * sizeof(U)));
    buf = static_cast<U*>(p);
    elems = need;
  }
  return buf;
}
}  // namespace

CudaKernels::CudaKernels() {
  require_device("CudaKernels (spec.device: cuda)");
  RAILYARD_CUDA_CHECK(cudaStreamCreate(&stream_));
  RAILYARD_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
  lt_ = std::make_unique<BlasLt>();
}

CudaKernels::~CudaKernels() {
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  if (copy_stream_ != nullptr) cudaStreamSynchronize(copy_stream_);
  if (staging_ != nullptr) cudaFree(staging_);
  if (partials_ != nullptr) cudaFree(partials_);
  if (weights16_ != nullptr) cudaFree(weights16_);
  if (token_rows_dev_ != nullptr) cudaFree(token_rows_dev_);
  lt_.reset();
  if (copy_stream_ != nullptr) cudaStreamDestroy(copy_stream_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

void* CudaKernels::alloc(size_t bytes) {
  if (bytes == 0) return nullptr;
  void* p = nullptr;
  RAILYARD_CUDA_CHECK(cudaMalloc(&p, bytes));
  RAILYARD_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream_));
  RAILYARD_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return p;
}

void CudaKernels::free(void* p) noexcept {
  if (p == nullptr) return;
  cudaStreamSynchronize(stream_);  // kernels still using it must finish first
  cudaStreamSynchronize(copy_stream_);
  if (p == weights_) {
    // The model's parameters go away: so does their copy (a later alloc at the same address is not the weights).
    cudaFree(weights16_);
    weights_ = nullptr;
    weights_elems_ = 0;
    weights16_ = nullptr;
  }
  cudaFree(p);
}

void CudaKernels::zero(void* p, size_t bytes) { RAILYARD_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream_)); }

void CudaKernels::to_host(void* host_dst, const void* src, size_t bytes) {
  RAILYARD_CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
  RAILYARD_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaKernels::refresh_weight_copy(const void* dst, size_t bytes, cudaStream_t stream) {
  if (weights16_ == nullptr) return;
  const auto lo = std::max(reinterpret_cast<uintptr_t>(dst), reinterpret_cast<uintptr_t>(weights_));
  const auto hi =
      std::min(reinterpret_cast<uintptr_t>(dst) + bytes, reinterpret_cast<uintptr_t>(weights_ + weights_elems_));
  if (lo < hi) {
    const size_t first = (lo - reinterpret_cast<uintptr_t>(weights_)) / sizeof(float);
    const size_t last = ceil_div(hi - reinterpret_cast<uintptr_t>(weights_), sizeof(float));
    to_bf16(weights16_ + first, weights_ + first, last - first, stream);
  }
}

void CudaKernels::to_device(void* dst, const void* host_src, size_t bytes) {
  RAILYARD_CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream_));
  // Init, restore and --init-from write the parameters this way: refresh the part of the bf16 copy written.
  refresh_weight_copy(dst, bytes, stream_);
  // The caller may reuse its host buffer at once (pageable memory): wait.
  RAILYARD_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

// The side copies touch only copy_stream_ and read weights_/weights16_, which change only in set_weights and free (the
// main thread, never while an offloaded update runs), so a second thread may call them while this one launches
// kernels on stream_ (the CUDA runtime is thread-safe per call). Ordering against stream_ is the caller's (kernels.h).
void CudaKernels::side_to_host(void* host_dst, const void* src, size_t bytes) {
  RAILYARD_CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, copy_stream_));
  RAILYARD_CUDA_CHECK(cudaStreamSynchronize(copy_stream_));
}

void CudaKernels::side_to_device(void* dst, const void* host_src, size_t bytes) {
  RAILYARD_CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, copy_stream_));
  // The updated group's bf16 copy, re-rounded after the copy on the same stream: the next forward's GEMMs read it
  // once this returns (they are queued on stream_ only after the offload thread reports the group done).
  refresh_weight_copy(dst, bytes, copy_stream_);
  RAILYARD_CUDA_CHECK(cudaStreamSynchronize(copy_stream_));
}

void CudaKernels::synchronize() { RAILYARD_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

size_t CudaKernels::attention_saved_elems(int B, int Tn, int C, int NH) const {
  return attention_plan(B, Tn, C, NH).lse_floats;
}

size_t CudaKernels::attention_scratch_elems(int B, int Tn, int C, int NH) const {
  return attention_plan(B, Tn, C, NH).scratch_floats;
}

size_t CudaKernels::layernorm_scratch_elems(size_t N, int C) const {
  return layernorm_backward_plan(N, C).scratch_floats;
}

bf16* CudaKernels::staging(size_t elems) { return grow(staging_, staging_elems_, elems, stream_); }

void CudaKernels::encoder_forward(float* out, const int32_t* inp, const float* wte, const float* wpe, int B, int Tn,
                                  int C) {
  cuda::encoder_forward(out, inp, wte, wpe, B, Tn, C, stream_);
}

CudaKernels::DeviceTokenRows CudaKernels::upload_token_rows(const int32_t* inp, size_t N, int32_t lo, int32_t hi) {
  // The grouping needs the token ids on the host: N int32 down (waiting for the backward so far: the embedding's is
  // its last kernel), about 2 N int32 up. Far less than one thread per channel walking all N rows.
  token_ids_.resize(N);
  to_host(token_ids_.data(), inp, N * sizeof(int32_t));
  token_rows(token_ids_.data(), N, token_rows_, lo, hi);
  const size_t kept = token_rows_.rows.size(), distinct = token_rows_.tokens.size(), need = kept + 2 * distinct + 1;
  int32_t* buf = grow(token_rows_dev_, token_rows_dev_elems_, need, stream_);
  DeviceTokenRows d{buf, buf + kept, buf + kept + distinct, distinct};
  to_device(d.rows, token_rows_.rows.data(), kept * sizeof(int32_t));
  to_device(d.tokens, token_rows_.tokens.data(), distinct * sizeof(int32_t));
  to_device(d.starts, token_rows_.starts.data(), (distinct + 1) * sizeof(int32_t));
  return d;
}

void CudaKernels::encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* inp, int B, int Tn,
                                   int C) {
  const size_t N = static_cast<size_t>(B) * Tn;
  if (N == 0) return;
  const DeviceTokenRows d = upload_token_rows(inp, N, 0, std::numeric_limits<int32_t>::max());
  cuda::encoder_backward(dwte, dwpe, dout, d.rows, d.tokens, d.starts, d.distinct, B, Tn, C, stream_);
}

void CudaKernels::layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                                    const float* b, size_t N, int C) {
  cuda::layernorm_forward(out, mean, rstd, inp, w, b, N, C, stream_);
}

void CudaKernels::layernorm_backward(float* dinp, float* dw, float* db, float* scratch, const float* dout,
                                     const float* inp, const float* w, const float* mean, const float* rstd, size_t N,
                                     int C) {
  cuda::layernorm_backward(dinp, dw, db, scratch, dout, inp, w, mean, rstd, N, C, stream_);
}

const bf16* CudaKernels::weight_copy(const float* w, size_t n) const {
  if (weights16_ == nullptr) return nullptr;
  const int64_t off =
      weight_copy_offset(reinterpret_cast<uintptr_t>(weights_), weights_elems_, reinterpret_cast<uintptr_t>(w), n);
  return off < 0 ? nullptr : weights16_ + off;
}

const bf16* CudaKernels::weight16(const float* w, size_t n, bf16* slot) {
  if (const bf16* copy = weight_copy(w, n)) return copy;
  to_bf16(slot, w, n, stream_);
  return slot;
}

void CudaKernels::set_weights(const float* params, size_t n) {
  if (weights16_ != nullptr) {
    RAILYARD_CUDA_CHECK(cudaStreamSynchronize(stream_));
    RAILYARD_CUDA_CHECK(cudaFree(weights16_));
  }
  weights_ = nullptr;
  weights_elems_ = 0;
  weights16_ = nullptr;
  if (params == nullptr || n == 0) return;
  void* p = nullptr;
  RAILYARD_CUDA_CHECK(cudaMalloc(&p, n * sizeof(bf16)));  // 256-byte aligned
  weights16_ = static_cast<bf16*>(p);
  weights_ = params;
  weights_elems_ = n;
  weights_changed();
}

void CudaKernels::weights_changed() {
  if (weights16_ != nullptr) to_bf16(weights16_, weights_, weights_elems_, stream_);
}

void CudaKernels::matmul_forward(float* out, const float* inp, const float* w, const float* bias, size_t N, int IC,
                                 int OC) {
  const size_t n_inp = N * static_cast<size_t>(IC), n_w = static_cast<size_t>(OC) * IC;
  bf16* inp16 = staging(aligned(n_inp) + aligned(n_w));
  to_bf16(inp16, inp, n_inp, stream_);
  const bf16* w16 = weight16(w, n_w, inp16 + aligned(n_inp));
  cuda::matmul_forward(*lt_, out, inp16, w16, bias, N, IC, OC, /*gelu=*/false, stream_);
}

void CudaKernels::matmul_gelu_forward(float* out, float* pre, const float* inp, const float* w, const float* bias,
                                      size_t N, int IC, int OC) {
  if (!gelu_aux_epilogue_ok(OC, bias != nullptr)) {
    Kernels<float>::matmul_gelu_forward(out, pre, inp, w, bias, N, IC, OC);
    return;
  }
  const size_t n_inp = N * static_cast<size_t>(IC), n_w = static_cast<size_t>(OC) * IC;
  bf16* inp16 = staging(aligned(n_inp) + aligned(n_w));
  to_bf16(inp16, inp, n_inp, stream_);
  const bf16* w16 = weight16(w, n_w, inp16 + aligned(n_inp));
  cuda::matmul_forward(*lt_, out, inp16, w16, bias, N, IC, OC, /*gelu=*/true, stream_, pre);
}

void CudaKernels::residual_layernorm_forward(float* residual, float* out, float* mean, float* rstd, const float* a,
                                             const float* b, const float* w, const float* bias, size_t N, int C) {
  cuda::residual_layernorm_forward(residual, out, mean, rstd, a, b, w, bias, N, C, stream_);
}

void CudaKernels::matmul_backward(float* dinp, bool accumulate_dinp, float* dw, float* dbias, const float* dout,
                                  const float* inp, const float* w, size_t N, int IC, int OC, bool accumulate_dw) {
  const size_t n_dout = N * static_cast<size_t>(OC), n_inp = N * static_cast<size_t>(IC),
               n_w = static_cast<size_t>(OC) * IC;
  bf16* dout16 = staging(aligned(n_dout) + aligned(n_inp) + aligned(n_w));
  bf16* inp16 = dout16 + aligned(n_dout);
  to_bf16(dout16, dout, n_dout, stream_);
  to_bf16(inp16, inp, n_inp, stream_);
  const bf16* w16 = weight16(w, n_w, inp16 + aligned(n_inp));
  cuda::matmul_backward(*lt_, dinp, accumulate_dinp, dw, dbias, dout16, dout, inp16, w16, N, IC, OC, accumulate_dw,
                        stream_);
}

void CudaKernels::attention_forward(float* out, float* saved, const float* qkv, int B, int Tn, int C, int NH) {
  cuda::attention_forward(out, saved, qkv, B, Tn, C, NH, stream_);
}

void CudaKernels::attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv, const float* out,
                                     const float* saved, int B, int Tn, int C, int NH) {
  cuda::attention_backward(dqkv, scratch, dout, qkv, out, saved, B, Tn, C, NH, stream_);
}

void CudaKernels::gelu_forward(float* out, const float* inp, size_t n) { cuda::gelu_forward(out, inp, n, stream_); }

void CudaKernels::gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) {
  cuda::gelu_backward(dinp, inp, dout, n, stream_);
}

void CudaKernels::residual_forward(float* out, const float* a, const float* b, size_t n) {
  cuda::residual_forward(out, a, b, n, stream_);
}

void CudaKernels::crossentropy_forward(float* losses, const float* logits, const int32_t* targets, size_t N, int V,
                                       int Vp) {
  cuda::crossentropy_forward(losses, logits, targets, N, V, Vp, stream_);
}

void CudaKernels::crossentropy_fused_backward(float* losses, float* logits, const int32_t* targets, size_t N, int V,
                                              int Vp, float dloss) {
  cuda::crossentropy_fused_backward(losses, logits, targets, N, V, Vp, dloss, stream_);
}

void CudaKernels::adamw_update(float* params, const float* grads, float* m, float* v, size_t n, float lr, float beta1,
                               float beta2, float eps, float weight_decay, int64_t t, float grad_scale) {
  // Inside the weights: the bf16 copy is written in the same pass (any offset: the kernel writes elements).
  bf16* params16 = nullptr;
  if (weights16_ != nullptr && params >= weights_ && params + n <= weights_ + weights_elems_) {
    params16 = weights16_ + (params - weights_);
  }
  cuda::adamw_update(params, params16, grads, m, v, n, lr, beta1, beta2, eps, weight_decay, t, grad_scale, stream_);
}

double CudaKernels::global_norm(const float* x, size_t n) {
  const size_t chunks = ceil_div(n, kNormChunk);
  if (chunks == 0) return 0;
  grow(partials_, partials_elems_, chunks, stream_);
  if (host_partials_.size() < chunks) host_partials_.resize(chunks);
  sum_squares_partials(partials_, x, n, kNormChunk, stream_);
  to_host(host_partials_.data(), partials_, chunks * sizeof(double));
  double total = 0;
  for (size_t c = 0; c < chunks; ++c) total += host_partials_[c];  // chunk order: reproducible
  return std::sqrt(total);
}

void CudaKernels::vocab_embedding_forward(float* out, const int32_t* inp, const float* wte_local, int v0, int Vl,
                                          size_t N, int C) {
  cuda::vocab_embedding_forward(out, inp, wte_local, v0, Vl, N, C, stream_);
}

void CudaKernels::add_positions_rows(float* out, const float* wpe, size_t row0, size_t rows, int Tn, int C) {
  cuda::add_positions_rows(out, wpe, row0, rows, Tn, C, stream_);
}

void CudaKernels::vocab_embedding_backward(float* dwte_local, float* dwpe, const float* dout, const int32_t* inp,
                                           int v0, int Vl, int B, int Tn, int C) {
  const size_t N = static_cast<size_t>(B) * Tn;
  if (N == 0 || Vl <= 0) return;
  const DeviceTokenRows d = upload_token_rows(inp, N, v0, v0 + Vl);
  cuda::vocab_embedding_backward(dwte_local, dwpe, dout, d.rows, d.tokens, d.starts, d.distinct, B, Tn, C, stream_);
}

void CudaKernels::vocab_ce_local_max(float* mx, const float* logits, size_t N, int Vl, int Vr) {
  cuda::vocab_ce_local_max(mx, logits, N, Vl, Vr, stream_);
}

void CudaKernels::vocab_ce_local_sums(float* sums, float* logits, const float* mx, const int32_t* targets, int v0,
                                      size_t N, int Vl, int Vr) {
  cuda::vocab_ce_local_sums(sums, logits, mx, targets, v0, N, Vl, Vr, stream_);
}

void CudaKernels::vocab_ce_finish(float* losses, float* logits, const float* sums, const float* mx,
                                  const int32_t* targets, int v0, size_t N, int Vl, int Vr, float scale) {
  cuda::vocab_ce_finish(losses, logits, sums, mx, targets, v0, N, Vl, Vr, scale, stream_);
}

void CudaKernels::accumulate(float* out, const float* in, size_t n) { cuda::accumulate(out, in, n, stream_); }

void CudaKernels::copy(float* dst, const float* src, size_t n) {
  if (dst == src || n == 0) return;
  RAILYARD_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, stream_));
}

void CudaKernels::ring_forward_begin(float* kv, float* out, float* m, float* l, const float* qkv, int B, int Tc, int C,
                                     int NH) {
  cuda::ring_forward_begin(kv, out, m, l, qkv, B, Tc, C, NH, stream_);
}

void CudaKernels::ring_forward_block(float* out, float* m, float* l, const float* qkv, const float* kv, int B, int Tc,
                                     int C, int NH, bool diagonal) {
  cuda::ring_forward_block(out, m, l, qkv, kv, B, Tc, C, NH, diagonal, stream_);
}

void CudaKernels::ring_forward_end(float* out, float* lse, const float* m, const float* l, int B, int Tc, int C,
                                   int NH) {
  cuda::ring_forward_end(out, lse, m, l, B, Tc, C, NH, stream_);
}

void CudaKernels::ring_backward_begin(float* kv, float* dkv, float* dqkv, float* D, const float* dout, const float* qkv,
                                      const float* out, int B, int Tc, int C, int NH) {
  cuda::ring_backward_begin(kv, dkv, dqkv, D, dout, qkv, out, B, Tc, C, NH, stream_);
}

void CudaKernels::ring_backward_block(float* dqkv, float* dkv, const float* dout, const float* qkv, const float* kv,
                                      const float* lse, const float* D, int B, int Tc, int C, int NH, bool diagonal) {
  cuda::ring_backward_block(dqkv, dkv, dout, qkv, kv, lse, D, B, Tc, C, NH, diagonal, stream_);
}

void CudaKernels::ring_backward_end(float* dqkv, const float* dkv, int B, int Tc, int C) {
  cuda::ring_backward_end(dqkv, dkv, B, Tc, C, stream_);
}

void CudaKernels::moe_route(float* probs, int32_t* choice, size_t N, size_t E, size_t k) {
  cuda::moe_route(probs, choice, N, E, k, stream_);
}

void CudaKernels::moe_gather_rows(float* dst, const float* src, const int32_t* idx, size_t n, size_t C) {
  cuda::moe_gather_rows(dst, src, idx, n, C, stream_);
}

void CudaKernels::moe_gate_rows(float* dst, const float* src, const float* probs, const int32_t* idx, size_t e,
                                size_t E, size_t n, size_t C) {
  cuda::moe_gate_rows(dst, src, probs, idx, e, E, n, C, stream_);
}

void CudaKernels::moe_combine(float* out, const float* probs, const int32_t* choice, const int32_t* row, const float* y,
                              size_t N, size_t E, size_t k, size_t C) {
  cuda::moe_combine(out, probs, choice, row, y, N, E, k, C, stream_);
}

void CudaKernels::moe_router_backward(float* dprobs, const float* probs, const int32_t* choice, const int32_t* row,
                                      const float* y, const float* dout, const float* aux, float dloss, size_t N,
                                      size_t E, size_t k, size_t C) {
  cuda::moe_router_backward(dprobs, probs, choice, row, y, dout, aux, dloss, N, E, k, C, stream_);
}

void CudaKernels::moe_combine_input_grads(float* dx, const int32_t* row, const float* dxe, size_t N, size_t k,
                                          size_t C) {
  cuda::moe_combine_input_grads(dx, row, dxe, N, k, C, stream_);
}

void CudaKernels::divide(float* x, float divisor, size_t n) { cuda::divide(x, divisor, n, stream_); }

}  // namespace railyard::worker::cuda
