// A test device: the CPU kernels behind memory the trainer must treat as a device's (host_accessible() false), so
// the off-host paths of Gpt, AdamW, the Trainer and the data-parallel reducer run on every CI machine. Used by
// test_worker_training and worker_parallel_dp.
#pragma once

#include <atomic>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "worker/device/cpu_kernels.h"
#include "worker/device/kernels.h"

namespace railyard::worker::testing {

// The CPU kernels behind a device that says its memory is not the host's: Gpt, AdamW and the Trainer then take the
// paths a GPU takes (targets and losses copied, state() served from host copies refreshed when asked for, restore
// uploading them), with real kernels, so those paths run on every CI machine. Its buffers are separate allocations,
// so a missing copy shows up as stale values.
class OffHostCpu final : public Kernels<float> {
 public:
  explicit OffHostCpu(ThreadPool& pool) : c_(pool) {}
  DeviceKind kind() const override { return DeviceKind::kCpu; }
  bool host_accessible() const override { return false; }
  void* alloc(size_t bytes) override { return c_.alloc(bytes); }
  void free(void* p) noexcept override { c_.free(p); }
  void zero(void* p, size_t bytes) override { c_.zero(p, bytes); }
  void to_host(void* dst, const void* src, size_t bytes) override {
    ++copies;
    if (bytes == state_bytes) state_copies_after.push_back(norms);
    std::memcpy(dst, src, bytes);
  }
  void to_device(void* dst, const void* src, size_t bytes) override {
    ++copies;
    std::memcpy(dst, src, bytes);
  }
  void synchronize() override {}
  // CUDA's copy-stream copies (the offloaded optimizer's thread, while the main thread runs kernels): counted in
  // atomics, apart from the main thread's `copies`.
  void side_to_host(void* dst, const void* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
    side_copies += 1;
  }
  void side_to_device(void* dst, const void* src, size_t bytes) override {
    if (fail_side_uploads) throw std::runtime_error("side_to_device failed (test)");
    std::memcpy(dst, src, bytes);
    side_copies += 1;
  }
  size_t attention_saved_elems(int B, int T, int C, int NH) const override {
    return c_.attention_saved_elems(B, T, C, NH);
  }
  size_t attention_scratch_elems(int B, int T, int C, int NH) const override {
    return c_.attention_scratch_elems(B, T, C, NH);
  }
  size_t layernorm_scratch_elems(size_t N, int C) const override { return c_.layernorm_scratch_elems(N, C); }
  void encoder_forward(float* o, const int32_t* i, const float* a, const float* b, int B, int T, int C) override {
    c_.encoder_forward(o, i, a, b, B, T, C);
  }
  void encoder_backward(float* a, float* b, const float* d, const int32_t* i, int B, int T, int C) override {
    ++encoder_backwards;  // the last kernel of every backward
    c_.encoder_backward(a, b, d, i, B, T, C);
  }
  void layernorm_forward(float* o, float* m, float* r, const float* i, const float* w, const float* b, size_t N,
                         int C) override {
    c_.layernorm_forward(o, m, r, i, w, b, N, C);
  }
  void layernorm_backward(float* di, float* dw, float* db, float* s, const float* d, const float* i, const float* w,
                          const float* m, const float* r, size_t N, int C) override {
    c_.layernorm_backward(di, dw, db, s, d, i, w, m, r, N, C);
  }
  void matmul_forward(float* o, const float* i, const float* w, const float* b, size_t N, int IC, int OC) override {
    c_.matmul_forward(o, i, w, b, N, IC, OC);
  }
  void matmul_backward(float* di, bool ai, float* dw, float* db, const float* d, const float* i, const float* w,
                       size_t N, int IC, int OC, bool aw) override {
    c_.matmul_backward(di, ai, dw, db, d, i, w, N, IC, OC, aw);
  }
  void attention_forward(float* o, float* s, const float* q, int B, int T, int C, int NH) override {
    c_.attention_forward(o, s, q, B, T, C, NH);
  }
  void attention_backward(float* dq, float* s, const float* d, const float* q, const float* o, const float* sv, int B,
                          int T, int C, int NH) override {
    c_.attention_backward(dq, s, d, q, o, sv, B, T, C, NH);
  }
  void gelu_forward(float* o, const float* i, size_t n) override { c_.gelu_forward(o, i, n); }
  void gelu_backward(float* di, const float* i, const float* d, size_t n) override { c_.gelu_backward(di, i, d, n); }
  void residual_forward(float* o, const float* a, const float* b, size_t n) override {
    c_.residual_forward(o, a, b, n);
  }
  void crossentropy_forward(float* l, const float* g, const int32_t* t, size_t N, int V, int Vp) override {
    c_.crossentropy_forward(l, g, t, N, V, Vp);
  }
  void crossentropy_fused_backward(float* l, float* g, const int32_t* t, size_t N, int V, int Vp, float d) override {
    c_.crossentropy_fused_backward(l, g, t, N, V, Vp, d);
  }
  void adamw_update(float* p, const float* g, float* m, float* v, size_t n, float lr, float b1, float b2, float eps,
                    float wd, int64_t t, float s) override {
    c_.adamw_update(p, g, m, v, n, lr, b1, b2, eps, wd, t, s);
  }
  double global_norm(const float* x, size_t n) override {
    ++norms;  // one per optimizer step: marks which step a copy followed
    return c_.global_norm(x, n);
  }
  void vocab_embedding_forward(float* o, const int32_t* i, const float* w, int v0, int Vl, size_t N, int C) override {
    c_.vocab_embedding_forward(o, i, w, v0, Vl, N, C);
  }
  void add_positions_rows(float* o, const float* w, size_t r0, size_t rows, int T, int C) override {
    c_.add_positions_rows(o, w, r0, rows, T, C);
  }
  void vocab_embedding_backward(float* dw, float* dp, const float* d, const int32_t* i, int v0, int Vl, int B, int T,
                                int C) override {
    c_.vocab_embedding_backward(dw, dp, d, i, v0, Vl, B, T, C);
  }
  void vocab_ce_local_max(float* m, const float* z, size_t N, int Vl, int Vr) override {
    c_.vocab_ce_local_max(m, z, N, Vl, Vr);
  }
  void vocab_ce_local_sums(float* s, float* z, const float* m, const int32_t* t, int v0, size_t N, int Vl,
                           int Vr) override {
    c_.vocab_ce_local_sums(s, z, m, t, v0, N, Vl, Vr);
  }
  void vocab_ce_finish(float* l, float* z, const float* s, const float* m, const int32_t* t, int v0, size_t N, int Vl,
                       int Vr, float k) override {
    c_.vocab_ce_finish(l, z, s, m, t, v0, N, Vl, Vr, k);
  }
  void accumulate(float* o, const float* i, size_t n) override { c_.accumulate(o, i, n); }
  void copy(float* d, const float* s, size_t n) override { c_.copy(d, s, n); }
  void ring_forward_begin(float* kv, float* o, float* m, float* l, const float* q, int B, int T, int C,
                          int NH) override {
    c_.ring_forward_begin(kv, o, m, l, q, B, T, C, NH);
  }
  void ring_forward_block(float* o, float* m, float* l, const float* q, const float* kv, int B, int T, int C, int NH,
                          bool diag) override {
    c_.ring_forward_block(o, m, l, q, kv, B, T, C, NH, diag);
  }
  void ring_forward_end(float* o, float* lse, const float* m, const float* l, int B, int T, int C, int NH) override {
    c_.ring_forward_end(o, lse, m, l, B, T, C, NH);
  }
  void ring_backward_begin(float* kv, float* dkv, float* dq, float* D, const float* g, const float* q, const float* o,
                           int B, int T, int C, int NH) override {
    c_.ring_backward_begin(kv, dkv, dq, D, g, q, o, B, T, C, NH);
  }
  void ring_backward_block(float* dq, float* dkv, const float* g, const float* q, const float* kv, const float* lse,
                           const float* D, int B, int T, int C, int NH, bool diag) override {
    c_.ring_backward_block(dq, dkv, g, q, kv, lse, D, B, T, C, NH, diag);
  }
  void ring_backward_end(float* dq, const float* dkv, int B, int T, int C) override {
    c_.ring_backward_end(dq, dkv, B, T, C);
  }
  void moe_route(float* p, int32_t* ch, size_t N, size_t E, size_t k) override { c_.moe_route(p, ch, N, E, k); }
  void moe_gather_rows(float* o, const float* s, const int32_t* i, size_t n, size_t C) override {
    c_.moe_gather_rows(o, s, i, n, C);
  }
  void moe_gate_rows(float* o, const float* s, const float* p, const int32_t* i, size_t e, size_t E, size_t n,
                     size_t C) override {
    c_.moe_gate_rows(o, s, p, i, e, E, n, C);
  }
  void moe_combine(float* o, const float* p, const int32_t* ch, const int32_t* r, const float* y, size_t N, size_t E,
                   size_t k, size_t C) override {
    c_.moe_combine(o, p, ch, r, y, N, E, k, C);
  }
  void moe_router_backward(float* dp, const float* p, const int32_t* ch, const int32_t* r, const float* y,
                           const float* g, const float* aux, float dl, size_t N, size_t E, size_t k,
                           size_t C) override {
    c_.moe_router_backward(dp, p, ch, r, y, g, aux, dl, N, E, k, C);
  }
  void moe_combine_input_grads(float* dx, const int32_t* r, const float* dxe, size_t N, size_t k, size_t C) override {
    c_.moe_combine_input_grads(dx, r, dxe, N, k, C);
  }
  void divide(float* x, float s, size_t n) override { c_.divide(x, s, n); }
  size_t copies = 0;  // to_host/to_device: the main thread's
  std::atomic<size_t> side_copies{0};
  std::atomic<bool> fail_side_uploads{false};  // a failing copy on the offload thread
  size_t encoder_backwards = 0;
  size_t norms = 0;
  size_t state_bytes = 0;                  // params * 4: a download of params, m or v
  std::vector<size_t> state_copies_after;  // per such download: the optimizer steps taken before it

 private:
  CpuKernels<float> c_;
};

}  // namespace railyard::worker::testing
