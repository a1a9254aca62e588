// ShadowCpu, the test device of the trainer's off-host paths (issue #11): the CPU kernels behind addresses in a
// PROT_NONE region, so any host code that reads or writes device memory (a memcpy, a loop over the losses, a host-side
// reduction) dies with SIGSEGV instead of passing, and any host pointer given to a device kernel is refused. It also
// keeps two CUDA semantics the code must respect on a GPU: kernels run later, in order, as on one stream (at
// synchronize(), a copy or global_norm), and GEMMs read an exact emulation of CudaKernels' persistent weight copy.
// Shared by the worker tests (test_worker_training) and the worker/parallel ones (shadow_device.h there adds the
// device-memory communicator).
#pragma once

#include <doctest/doctest.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <mutex>
#include <new>
#include <stdexcept>
#include <vector>

#include "worker/device/cpu_kernels.h"
#include "worker/device/kernels.h"

namespace railyard::worker::testing {

// Device memory: a bump allocator over `arena_`; the addresses it gives out are the same offsets in `shadow_`, which
// is mapped PROT_NONE. Only the device (its kernels and copies) and the communicator wrapper translate them.
class ShadowCpu final : public Kernels<float> {
 public:
  // arena_bytes: the device's capacity (address space; pages are touched only as they are used).
  explicit ShadowCpu(ThreadPool& pool, size_t arena_bytes = size_t{256} << 20) : c_(pool), kArena(arena_bytes) {
    arena_ = static_cast<char*>(mmap(nullptr, kArena, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    shadow_ = static_cast<char*>(mmap(nullptr, kArena, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    REQUIRE(arena_ != MAP_FAILED);
    REQUIRE(shadow_ != MAP_FAILED);
  }
  ~ShadowCpu() override {
    munmap(arena_, kArena);
    munmap(shadow_, kArena);
  }
  bool owns(const void* p) const {
    const char* q = static_cast<const char*>(p);
    return q >= shadow_ && q < shadow_ + kArena;
  }
  // The host view of a device address (what a device-memory communicator reads); other pointers pass through.
  template <typename P>
  P* view(P* p) const {
    if (!owns(p)) return p;
    return reinterpret_cast<P*>(arena_ + (reinterpret_cast<const char*>(p) - shadow_));
  }
  // Kernel arguments must be device memory (or null).
  template <typename P>
  P* d(P* p) const {
    if (p != nullptr && !owns(p)) throw std::logic_error("a host pointer was passed to a device kernel");
    return view(p);
  }
  size_t copies = 0;
  size_t embedding_backwards = 0;  // vocab_embedding_backward calls: the first stage's last kernel of a backward
  size_t encoder_backwards = 0;    // encoder_backward calls: the last kernel of every Gpt backward
  size_t norms = 0;                // global_norm calls: one per optimizer step of the plain trainer
  size_t state_bytes = 0;          // params * 4: a download of params, m or v ...
  std::vector<size_t> state_copies_after;  // ... per such download: the optimizer steps (norms) before it
  std::vector<size_t> downloads;           // bytes of every to_host, in order (which copies the state took, and when)
  size_t used() const { return used_; }    // bytes handed out by alloc

  DeviceKind kind() const override { return DeviceKind::kCpu; }
  bool host_accessible() const override { return false; }
  void* alloc(size_t bytes) override {
    if (bytes == 0) return nullptr;
    const size_t at = used_;
    used_ += (bytes + 63) / 64 * 64;
    if (used_ > kArena) throw std::bad_alloc();
    return shadow_ + at;  // zero: fresh anonymous pages, never reused
  }
  void free(void*) noexcept override {}
  void zero(void* p, size_t bytes) override {
    later([=, this] { std::memset(d(p), 0, bytes); });
  }
  // Copies are ordered after every kernel enqueued before them, as on CUDA's one stream (and wait for them).
  void to_host(void* dst, const void* src, size_t bytes) override {
    ++copies;
    downloads.push_back(bytes);
    if (bytes == state_bytes) state_copies_after.push_back(norms);
    REQUIRE_FALSE(owns(dst));
    drain();
    std::memcpy(dst, d(src), bytes);
  }
  void to_device(void* dst, const void* src, size_t bytes) override {
    ++copies;
    REQUIRE_FALSE(owns(src));
    drain();
    std::memcpy(d(dst), src, bytes);
    refresh(static_cast<const float*>(dst), bytes / sizeof(float));
  }
  void synchronize() override { drain(); }
  // Runs the kernels enqueued so far, in order: what a host-side wait for the stream (or an event another stream
  // waits on: comm::StreamReducer) makes visible. Communicators given device memory (DeviceComm) do not call it, so
  // a caller that hands a buffer to a collective without synchronize() sends what the buffer held before the
  // kernels that were meant to fill it, as it would on CUDA.
  void drain() {
    std::lock_guard<std::mutex> lock(run_mu_);
    for (;;) {
      std::vector<std::function<void()>> batch;
      {
        std::lock_guard<std::mutex> q(queue_mu_);
        batch.swap(queue_);
      }
      if (batch.empty()) return;
      for (auto& f : batch) f();
    }
  }
  size_t enqueued = 0;  // kernels (and memsets, weight-copy refreshes) deferred so far
  // CUDA's copy-stream copies (the offloaded optimizer's thread, concurrent with the main thread's kernels): not
  // ordered after the deferred kernels (no drain: the caller orders them, as on CUDA), counted apart from `copies` in
  // atomics (the only members that thread writes), the weight copy of the range refreshed as to_device does. No
  // doctest assertion here: this runs off the test's thread.
  void side_to_host(void* dst, const void* src, size_t bytes) override {
    if (owns(dst) || !owns(src)) throw std::logic_error("side_to_host: not a device -> host copy");
    side_copies += 1;
    std::memcpy(dst, view(src), bytes);
    side_downloaded += bytes;
  }
  void side_to_device(void* dst, const void* src, size_t bytes) override {
    if (fail_side_uploads) throw std::runtime_error("side_to_device failed (test)");
    if (owns(src) || !owns(dst)) throw std::logic_error("side_to_device: not a host -> device copy");
    side_copies += 1;
    std::memcpy(view(dst), src, bytes);
    refresh(static_cast<const float*>(dst), bytes / sizeof(float));
    side_uploaded += bytes;
  }
  std::atomic<size_t> side_downloaded{0}, side_uploaded{0};  // bytes
  std::atomic<size_t> side_copies{0};
  std::atomic<bool> fail_side_uploads{false};  // a failing copy on the offload thread
  size_t attention_saved_elems(int B, int T, int C, int NH) const override {
    return c_.attention_saved_elems(B, T, C, NH);
  }
  size_t attention_scratch_elems(int B, int T, int C, int NH) const override {
    return c_.attention_scratch_elems(B, T, C, NH);
  }
  size_t layernorm_scratch_elems(size_t N, int C) const override { return c_.layernorm_scratch_elems(N, C); }
  void encoder_forward(float* o, const int32_t* i, const float* a, const float* b, int B, int T, int C) override {
    later([=, this] { c_.encoder_forward(d(o), d(i), d(a), d(b), B, T, C); });
  }
  void encoder_backward(float* a, float* b, const float* g, const int32_t* i, int B, int T, int C) override {
    ++encoder_backwards;
    later([=, this] { c_.encoder_backward(d(a), d(b), d(g), d(i), B, T, C); });
  }
  void layernorm_forward(float* o, float* m, float* r, const float* i, const float* w, const float* b, size_t N,
                         int C) override {
    later([=, this] { c_.layernorm_forward(d(o), d(m), d(r), d(i), d(w), d(b), N, C); });
  }
  void layernorm_backward(float* di, float* dw, float* db, float* s, const float* g, const float* i, const float* w,
                          const float* m, const float* r, size_t N, int C) override {
    later([=, this] { c_.layernorm_backward(d(di), d(dw), d(db), d(s), d(g), d(i), d(w), d(m), d(r), N, C); });
  }
  void matmul_forward(float* o, const float* i, const float* w, const float* b, size_t N, int IC, int OC) override {
    later([=, this] { c_.matmul_forward(d(o), d(i), weight(w), d(b), N, IC, OC); });
  }
  void matmul_backward(float* di, bool ai, float* dw, float* db, const float* g, const float* i, const float* w,
                       size_t N, int IC, int OC, bool aw) override {
    later([=, this] { c_.matmul_backward(d(di), ai, d(dw), d(db), d(g), d(i), weight(w), N, IC, OC, aw); });
  }
  // CudaKernels' persistent weight copy, emulated exactly (no rounding): GEMM weight operands inside the range given
  // to set_weights are read from a copy that only set_weights, adamw_update and to_device into the range, and
  // weights_changed() refresh. A path that writes the parameters another way (a collective receiving into them, a
  // copy kernel) without weights_changed() then trains on stale weights here, as it would on CUDA.
  void set_weights(const float* p, size_t n) override {
    drain();  // CUDA synchronizes before replacing the copy
    weights_ = p;
    weights_copy_.assign(n, 0.0f);
    refresh(p, n);
  }
  void weights_changed() override {
    ++weight_refreshes;
    later([this] { refresh(weights_, weights_copy_.size()); });  // a conversion kernel on the stream
  }
  size_t weight_refreshes = 0;
  void attention_forward(float* o, float* s, const float* q, int B, int T, int C, int NH) override {
    later([=, this] { c_.attention_forward(d(o), d(s), d(q), B, T, C, NH); });
  }
  void attention_backward(float* dq, float* s, const float* g, const float* q, const float* o, const float* sv, int B,
                          int T, int C, int NH) override {
    later([=, this] { c_.attention_backward(d(dq), d(s), d(g), d(q), d(o), d(sv), B, T, C, NH); });
  }
  void gelu_forward(float* o, const float* i, size_t n) override {
    later([=, this] { c_.gelu_forward(d(o), d(i), n); });
  }
  void gelu_backward(float* di, const float* i, const float* g, size_t n) override {
    later([=, this] { c_.gelu_backward(d(di), d(i), d(g), n); });
  }
  void residual_forward(float* o, const float* a, const float* b, size_t n) override {
    later([=, this] { c_.residual_forward(d(o), d(a), d(b), n); });
  }
  void crossentropy_forward(float* l, const float* z, const int32_t* t, size_t N, int V, int Vp) override {
    later([=, this] { c_.crossentropy_forward(d(l), d(z), d(t), N, V, Vp); });
  }
  void crossentropy_fused_backward(float* l, float* z, const int32_t* t, size_t N, int V, int Vp, float k) override {
    later([=, this] { c_.crossentropy_fused_backward(d(l), d(z), d(t), N, V, Vp, k); });
  }
  void adamw_update(float* p, const float* g, float* m, float* v, size_t n, float lr, float b1, float b2, float eps,
                    float wd, int64_t t, float s) override {
    later([=, this] {
      c_.adamw_update(d(p), d(g), d(m), d(v), n, lr, b1, b2, eps, wd, t, s);
      refresh(p, n);  // CUDA's AdamW pass writes the copy too
    });
  }
  double global_norm(const float* x, size_t n) override {
    ++norms;
    drain();  // CUDA reads the partial sums back: a wait for the stream
    return c_.global_norm(d(x), n);
  }
  void vocab_embedding_forward(float* o, const int32_t* i, const float* w, int v0, int Vl, size_t N, int C) override {
    later([=, this] { c_.vocab_embedding_forward(d(o), d(i), d(w), v0, Vl, N, C); });
  }
  void add_positions_rows(float* o, const float* w, size_t r0, size_t rows, int T, int C) override {
    later([=, this] { c_.add_positions_rows(d(o), d(w), r0, rows, T, C); });
  }
  void vocab_embedding_backward(float* dw, float* dp, const float* g, const int32_t* i, int v0, int Vl, int B, int T,
                                int C) override {
    ++embedding_backwards;  // the first stage's last kernel of a backward
    later([=, this] { c_.vocab_embedding_backward(d(dw), d(dp), d(g), d(i), v0, Vl, B, T, C); });
  }
  void vocab_ce_local_max(float* m, const float* z, size_t N, int Vl, int Vr) override {
    later([=, this] { c_.vocab_ce_local_max(d(m), d(z), N, Vl, Vr); });
  }
  void vocab_ce_local_sums(float* s, float* z, const float* m, const int32_t* t, int v0, size_t N, int Vl,
                           int Vr) override {
    later([=, this] { c_.vocab_ce_local_sums(d(s), d(z), d(m), d(t), v0, N, Vl, Vr); });
  }
  void vocab_ce_finish(float* l, float* z, const float* s, const float* m, const int32_t* t, int v0, size_t N, int Vl,
                       int Vr, float k) override {
    later([=, this] { c_.vocab_ce_finish(d(l), d(z), d(s), d(m), d(t), v0, N, Vl, Vr, k); });
  }
  void accumulate(float* o, const float* i, size_t n) override {
    later([=, this] { c_.accumulate(d(o), d(i), n); });
  }
  void copy(float* dst, const float* src, size_t n) override {
    later([=, this] { c_.copy(d(dst), d(src), n); });
  }
  void ring_forward_begin(float* kv, float* o, float* m, float* l, const float* q, int B, int T, int C,
                          int NH) override {
    later([=, this] { c_.ring_forward_begin(d(kv), d(o), d(m), d(l), d(q), B, T, C, NH); });
  }
  void ring_forward_block(float* o, float* m, float* l, const float* q, const float* kv, int B, int T, int C, int NH,
                          bool diag) override {
    later([=, this] { c_.ring_forward_block(d(o), d(m), d(l), d(q), d(kv), B, T, C, NH, diag); });
  }
  void ring_forward_end(float* o, float* lse, const float* m, const float* l, int B, int T, int C, int NH) override {
    later([=, this] { c_.ring_forward_end(d(o), d(lse), d(m), d(l), B, T, C, NH); });
  }
  void ring_backward_begin(float* kv, float* dkv, float* dq, float* D, const float* g, const float* q, const float* o,
                           int B, int T, int C, int NH) override {
    later([=, this] { c_.ring_backward_begin(d(kv), d(dkv), d(dq), d(D), d(g), d(q), d(o), B, T, C, NH); });
  }
  void ring_backward_block(float* dq, float* dkv, const float* g, const float* q, const float* kv, const float* lse,
                           const float* D, int B, int T, int C, int NH, bool diag) override {
    later([=, this] { c_.ring_backward_block(d(dq), d(dkv), d(g), d(q), d(kv), d(lse), d(D), B, T, C, NH, diag); });
  }
  void ring_backward_end(float* dq, const float* dkv, int B, int T, int C) override {
    later([=, this] { c_.ring_backward_end(d(dq), d(dkv), B, T, C); });
  }
  void moe_route(float* p, int32_t* ch, size_t N, size_t E, size_t k) override {
    later([=, this] { c_.moe_route(d(p), d(ch), N, E, k); });
  }
  void moe_gather_rows(float* o, const float* s, const int32_t* i, size_t n, size_t C) override {
    later([=, this] { c_.moe_gather_rows(d(o), d(s), d(i), n, C); });
  }
  void moe_gate_rows(float* o, const float* s, const float* p, const int32_t* i, size_t e, size_t E, size_t n,
                     size_t C) override {
    later([=, this] { c_.moe_gate_rows(d(o), d(s), d(p), d(i), e, E, n, C); });
  }
  void moe_combine(float* o, const float* p, const int32_t* ch, const int32_t* r, const float* y, size_t N, size_t E,
                   size_t k, size_t C) override {
    later([=, this] { c_.moe_combine(d(o), d(p), d(ch), d(r), d(y), N, E, k, C); });
  }
  void moe_router_backward(float* dp, const float* p, const int32_t* ch, const int32_t* r, const float* y,
                           const float* g, const float* aux, float dl, size_t N, size_t E, size_t k,
                           size_t C) override {
    later([=, this] { c_.moe_router_backward(d(dp), d(p), d(ch), d(r), d(y), d(g), d(aux), dl, N, E, k, C); });
  }
  void moe_combine_input_grads(float* dx, const int32_t* r, const float* dxe, size_t N, size_t k, size_t C) override {
    later([=, this] { c_.moe_combine_input_grads(d(dx), d(r), d(dxe), N, k, C); });
  }
  void divide(float* x, float s, size_t n) override {
    later([=, this] { c_.divide(d(x), s, n); });
  }

 private:
  // Kernels run later, in order, as on one CUDA stream: at the next synchronize(), copy or global_norm.
  void later(std::function<void()> f) {
    std::lock_guard<std::mutex> q(queue_mu_);
    ++enqueued;
    queue_.push_back(std::move(f));
  }
  std::mutex run_mu_, queue_mu_;
  std::vector<std::function<void()>> queue_;
  // A GEMM weight operand: from the weight copy when it lies in the registered range.
  const float* weight(const float* w) const {
    if (weights_ != nullptr && w >= weights_ && w < weights_ + weights_copy_.size()) {
      return weights_copy_.data() + (w - weights_);
    }
    return d(w);
  }
  // The copy of [p, p + n) ∩ the registered range from the device memory. Also called from the offload thread for
  // the group it uploaded, while the main thread's GEMMs read the copy of other groups: disjoint elements.
  void refresh(const float* p, size_t n) {
    if (weights_ == nullptr || !owns(p)) return;
    const float* b = std::max(p, weights_);
    const float* e = std::min(p + n, weights_ + weights_copy_.size());
    if (e > b) std::memcpy(weights_copy_.data() + (b - weights_), view(b), (e - b) * sizeof(float));
  }
  const float* weights_ = nullptr;
  std::vector<float> weights_copy_;
  CpuKernels<float> c_;
  const size_t kArena;
  char* arena_ = nullptr;
  char* shadow_ = nullptr;
  size_t used_ = 0;
};

}  // namespace railyard::worker::testing
