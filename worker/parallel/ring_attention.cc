#include "worker/parallel/ring_attention.h"

#include <memory>
#include <string>
#include <utility>

#include "common/error.h"
#include "worker/device/cpu_kernels.h"

namespace railyard::worker::parallel {

RingAttention::RingAttention(comm::Communicator* cp, int B, int Tc, int C, int NH, Kernels<float>& dev)
    : RingAttention(cp, B, Tc, C, NH, nullptr, &dev) {}

RingAttention::RingAttention(comm::Communicator* cp, int B, int Tc, int C, int NH, ThreadPool& pool)
    : RingAttention(cp, B, Tc, C, NH, std::make_unique<CpuKernels<float>>(pool), nullptr) {}

RingAttention::RingAttention(comm::Communicator* cp, int B, int Tc, int C, int NH, std::unique_ptr<Kernels<float>> own,
                             Kernels<float>* dev)
    : own_dev_(std::move(own)),
      cp_(cp),
      B_(B),
      Tc_(Tc),
      C_(C),
      NH_(NH),
      size_(cp == nullptr ? 1 : cp->size()),
      rank_(cp == nullptr ? 0 : cp->rank()),
      dev_(dev != nullptr ? *dev : *own_dev_) {
  if (B <= 0 || Tc <= 0 || NH <= 0 || C % NH != 0) {
    throw ConfigError(
        "ring attention: B, Tc and heads must be positive and heads must divide C (B=" + std::to_string(B) +
        " Tc=" + std::to_string(Tc) + " C=" + std::to_string(C) + " NH=" + std::to_string(NH) + ")");
  }
  const size_t kv = static_cast<size_t>(B) * Tc * 2 * C, rows = static_cast<size_t>(B) * NH * Tc;
  kv_ = DeviceBuffer<float>(dev_, kv);
  kv_next_ = DeviceBuffer<float>(dev_, kv);
  dkv_ = DeviceBuffer<float>(dev_, kv);
  dkv_next_ = DeviceBuffer<float>(dev_, kv);
  m_ = DeviceBuffer<float>(dev_, rows);
  l_ = DeviceBuffer<float>(dev_, rows);
  d_ = DeviceBuffer<float>(dev_, rows);
}

void RingAttention::shift(const float* send, float* recv, size_t count, uint32_t tag) {
  const int right = (rank_ + 1) % size_, left = (rank_ - 1 + size_) % size_;
  dev_.synchronize();  // `send` was written by kernels; the communicator reads device memory on its own
  auto r = cp_->irecv(recv, count, comm::DType::kFloat32, left, tag);
  auto s = cp_->isend(send, count, comm::DType::kFloat32, right, tag);
  r->wait();
  s->wait();
}

void RingAttention::forward(const float* qkv, float* out, float* lse) {
  const int P = size_, r = rank_;
  const size_t kvn = kv_.size();
  const uint32_t call = (calls_++ & 0x7fffu) << 9;
  dev_.ring_forward_begin(kv_.data(), out, m_.data(), l_.data(), qkv, B_, Tc_, C_, NH_);
  fwd_bytes_ = 0;
  for (int s = 0; s < P; ++s) {
    const int j = ((r - s) % P + P) % P;
    // Post the hand-over of this block first, so that the transfer overlaps the block's compute.
    std::unique_ptr<comm::Request> rq, sq;
    if (s < P - 1) {
      const uint32_t tag = call | static_cast<uint32_t>(s);
      // kv_ is packed by a kernel at s = 0; kv_next_ was read by the previous block's kernels (queued on a GPU)
      dev_.synchronize();
      rq = cp_->irecv(kv_next_.data(), kvn, comm::DType::kFloat32, (r - 1 + P) % P, tag);
      sq = cp_->isend(kv_.data(), kvn, comm::DType::kFloat32, (r + 1) % P, tag);
      fwd_bytes_ += kvn * sizeof(float);
    }
    // causal: block j > r is all masked (skipped), j = r the diagonal, j < r all visible
    if (j <= r) dev_.ring_forward_block(out, m_.data(), l_.data(), qkv, kv_.data(), B_, Tc_, C_, NH_, j == r);
    if (s < P - 1) {
      rq->wait();
      sq->wait();
      std::swap(kv_, kv_next_);
    }
  }
  dev_.ring_forward_end(out, lse, m_.data(), l_.data(), B_, Tc_, C_, NH_);
}

void RingAttention::backward(const float* dout, const float* qkv, const float* out, const float* lse, float* dqkv) {
  const int P = size_, r = rank_;
  const size_t kvn = kv_.size();
  const uint32_t call = (calls_++ & 0x7fffu) << 9;
  dev_.ring_backward_begin(kv_.data(), dkv_.data(), dqkv, d_.data(), dout, qkv, out, B_, Tc_, C_, NH_);
  bwd_bytes_ = 0;
  for (int s = 0; s < P; ++s) {
    const int j = ((r - s) % P + P) % P;
    std::unique_ptr<comm::Request> rq, sq;
    const uint32_t tag = call | (static_cast<uint32_t>(s) << 1);
    if (s < P - 1) {
      // kv_ is packed by a kernel at s = 0; kv_next_ was read by the previous block's kernels (queued on a GPU)
      dev_.synchronize();
      rq = cp_->irecv(kv_next_.data(), kvn, comm::DType::kFloat32, (r - 1 + P) % P, tag);
      sq = cp_->isend(kv_.data(), kvn, comm::DType::kFloat32, (r + 1) % P, tag);
      bwd_bytes_ += kvn * sizeof(float);
    }
    if (j <= r) {
      dev_.ring_backward_block(dqkv, dkv_.data(), dout, qkv, kv_.data(), lse, d_.data(), B_, Tc_, C_, NH_, j == r);
    }
    if (s < P - 1) {
      rq->wait();
      sq->wait();
      std::swap(kv_, kv_next_);
    }
    // The block's gradient travels with it; the last hop brings every block's back to its owner.
    if (P > 1) {
      shift(dkv_.data(), dkv_next_.data(), kvn, tag | 1u);
      bwd_bytes_ += kvn * sizeof(float);
      std::swap(dkv_, dkv_next_);
    }
  }
  dev_.ring_backward_end(dqkv, dkv_.data(), B_, Tc_, C_);
}

}  // namespace railyard::worker::parallel
