#include "worker/parallel/ring_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>

#include "common/error.h"

namespace railyard::worker::parallel {

RingAttention::RingAttention(comm::Communicator* cp, int B, int Tc, int C, int NH, ThreadPool& pool)
    : cp_(cp),
      B_(B),
      Tc_(Tc),
      C_(C),
      NH_(NH),
      size_(cp == nullptr ? 1 : cp->size()),
      rank_(cp == nullptr ? 0 : cp->rank()),
      pool_(pool) {
  if (B <= 0 || Tc <= 0 || NH <= 0 || C % NH != 0) {
    throw ConfigError(
        "ring attention: B, Tc and heads must be positive and heads must divide C (B=" + std::to_string(B) +
        " Tc=" + std::to_string(Tc) + " C=" + std::to_string(C) + " NH=" + std::to_string(NH) + ")");
  }
  const size_t kv = static_cast<size_t>(B) * Tc * 2 * C, rows = static_cast<size_t>(B) * NH * Tc;
  kv_.resize(kv);
  kv_next_.resize(kv);
  dkv_.resize(kv);
  dkv_next_.resize(kv);
  m_.resize(rows);
  l_.resize(rows);
  d_.resize(rows);
}

void RingAttention::pack_kv(const float* qkv, float* kv) const {
  const size_t C = C_;
  for (size_t bt = 0; bt < static_cast<size_t>(B_) * Tc_; ++bt)
    std::memcpy(kv + bt * 2 * C, qkv + bt * 3 * C + C, 2 * C * sizeof(float));
}

void RingAttention::shift(const float* send, float* recv, size_t count, uint32_t tag) {
  const int right = (rank_ + 1) % size_, left = (rank_ - 1 + size_) % size_;
  auto r = cp_->irecv(recv, count, comm::DType::kFloat32, left, tag);
  auto s = cp_->isend(send, count, comm::DType::kFloat32, right, tag);
  r->wait();
  s->wait();
}

void RingAttention::forward(const float* qkv, float* out, float* lse) {
  const int P = size_, r = rank_, Tc = Tc_, C = C_, NH = NH_, hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const size_t kvn = kv_.size();
  const uint32_t call = (calls_++ & 0x7fffu) << 9;
  pack_kv(qkv, kv_.data());
  std::fill(m_.begin(), m_.end(), -std::numeric_limits<float>::infinity());
  std::fill(l_.begin(), l_.end(), 0.0f);
  std::memset(out, 0, static_cast<size_t>(B_) * Tc * C * sizeof(float));
  fwd_bytes_ = 0;
  for (int s = 0; s < P; ++s) {
    const int j = ((r - s) % P + P) % P;
    // Post the hand-over of this block first, so that the transfer overlaps the block's compute.
    std::unique_ptr<comm::Request> rq, sq;
    if (s < P - 1) {
      const uint32_t tag = call | static_cast<uint32_t>(s);
      rq = cp_->irecv(kv_next_.data(), kvn, comm::DType::kFloat32, (r - 1 + P) % P, tag);
      sq = cp_->isend(kv_.data(), kvn, comm::DType::kFloat32, (r + 1) % P, tag);
      fwd_bytes_ += kvn * sizeof(float);
    }
    if (j <= r) {
      const float* kv = kv_.data();
      pool_.parallel_for(static_cast<size_t>(B_) * NH, [&](size_t begin, size_t end) {
        std::vector<float> sc(Tc);
        for (size_t bh = begin; bh < end; ++bh) {
          const size_t b = bh / NH, h = bh % NH;
          for (int i = 0; i < Tc; ++i) {
            const float* q = qkv + (b * Tc + i) * 3 * C + h * hs;
            const int visible = j < r ? Tc : i + 1;  // causal: block j < r fully, the diagonal block up to i
            float bm = -std::numeric_limits<float>::infinity();
            for (int t = 0; t < visible; ++t) {
              const float* k = kv + (b * Tc + t) * 2 * C + h * hs;
              float dot = 0;
              for (int c = 0; c < hs; ++c) dot += q[c] * k[c];
              sc[t] = dot * scale;
              bm = std::max(bm, sc[t]);
            }
            const size_t row = bh * Tc + i;
            const float mnew = std::max(m_[row], bm);
            const float a = std::exp(m_[row] - mnew);  // 0 on the first visible block (m = -inf)
            float* o = out + (b * Tc + i) * C + h * hs;
            float l = l_[row] * a;
            for (int c = 0; c < hs; ++c) o[c] *= a;
            for (int t = 0; t < visible; ++t) {
              const float p = std::exp(sc[t] - mnew);
              const float* v = kv + (b * Tc + t) * 2 * C + C + h * hs;
              l += p;
              for (int c = 0; c < hs; ++c) o[c] += p * v[c];
            }
            m_[row] = mnew;
            l_[row] = l;
          }
        }
      });
    }
    if (s < P - 1) {
      rq->wait();
      sq->wait();
      std::swap(kv_, kv_next_);
    }
  }
  pool_.parallel_for(static_cast<size_t>(B_) * NH, [&](size_t begin, size_t end) {
    for (size_t bh = begin; bh < end; ++bh) {
      const size_t b = bh / NH, h = bh % NH;
      for (int i = 0; i < Tc; ++i) {
        const size_t row = bh * Tc + i;
        const float inv = 1.0f / l_[row];
        float* o = out + (b * Tc + i) * C + h * hs;
        for (int c = 0; c < hs; ++c) o[c] *= inv;
        lse[row] = m_[row] + std::log(l_[row]);
      }
    }
  });
}

void RingAttention::backward(const float* dout, const float* qkv, const float* out, const float* lse, float* dqkv) {
  const int P = size_, r = rank_, Tc = Tc_, C = C_, NH = NH_, hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const size_t kvn = kv_.size();
  const uint32_t call = (calls_++ & 0x7fffu) << 9;
  pack_kv(qkv, kv_.data());
  std::fill(dkv_.begin(), dkv_.end(), 0.0f);
  std::memset(dqkv, 0, static_cast<size_t>(B_) * Tc * 3 * C * sizeof(float));
  bwd_bytes_ = 0;
  // D (b,h,i) = dout_i . out_i over the head's channels (the softmax backward's row term)
  pool_.parallel_for(static_cast<size_t>(B_) * NH, [&](size_t begin, size_t end) {
    for (size_t bh = begin; bh < end; ++bh) {
      const size_t b = bh / NH, h = bh % NH;
      for (int i = 0; i < Tc; ++i) {
        const float *o = out + (b * Tc + i) * C + h * hs, *d = dout + (b * Tc + i) * C + h * hs;
        float sum = 0;
        for (int c = 0; c < hs; ++c) sum += o[c] * d[c];
        d_[bh * Tc + i] = sum;
      }
    }
  });
  for (int s = 0; s < P; ++s) {
    const int j = ((r - s) % P + P) % P;
    std::unique_ptr<comm::Request> rq, sq;
    const uint32_t tag = call | (static_cast<uint32_t>(s) << 1);
    if (s < P - 1) {
      rq = cp_->irecv(kv_next_.data(), kvn, comm::DType::kFloat32, (r - 1 + P) % P, tag);
      sq = cp_->isend(kv_.data(), kvn, comm::DType::kFloat32, (r + 1) % P, tag);
      bwd_bytes_ += kvn * sizeof(float);
    }
    if (j <= r) {
      const float* kv = kv_.data();
      float* dkv = dkv_.data();
      pool_.parallel_for(static_cast<size_t>(B_) * NH, [&](size_t begin, size_t end) {
        for (size_t bh = begin; bh < end; ++bh) {
          const size_t b = bh / NH, h = bh % NH;
          for (int i = 0; i < Tc; ++i) {
            const float* q = qkv + (b * Tc + i) * 3 * C + h * hs;
            const float* d = dout + (b * Tc + i) * C + h * hs;
            float* dq = dqkv + (b * Tc + i) * 3 * C + h * hs;
            const size_t row = bh * Tc + i;
            const int visible = j < r ? Tc : i + 1;
            for (int t = 0; t < visible; ++t) {
              const float* k = kv + (b * Tc + t) * 2 * C + h * hs;
              const float* v = k + C;
              float* dk = dkv + (b * Tc + t) * 2 * C + h * hs;
              float* dv = dk + C;
              float dot = 0, dp = 0;
              for (int c = 0; c < hs; ++c) {
                dot += q[c] * k[c];
                dp += d[c] * v[c];
              }
              const float p = std::exp(dot * scale - lse[row]);
              const float ds = p * (dp - d_[row]) * scale;
              for (int c = 0; c < hs; ++c) {
                dv[c] += p * d[c];
                dq[c] += ds * k[c];
                dk[c] += ds * q[c];
              }
            }
          }
        }
      });
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
  for (size_t bt = 0; bt < static_cast<size_t>(B_) * Tc; ++bt) {
    float* dst = dqkv + bt * 3 * C + C;
    const float* src = dkv_.data() + bt * 2 * C;
    for (int c = 0; c < 2 * C; ++c) dst[c] = src[c];
  }
}

}  // namespace railyard::worker::parallel
