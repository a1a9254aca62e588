#include "worker/model/gpt_decode.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/error.h"
#include "worker/kernels/cpu/kernels.h"

namespace railyard::worker {

GptDecoder::GptDecoder(const GptConfig& config, const float* params, ThreadPool& pool) : c_(config), pool_(pool) {
  if (c_.moe.experts > 0) throw ConfigError("generation supports dense models only (this one has experts)");
  const auto sizes = param_sizes(c_);
  std::array<const float**, kNumParamTensors> ptrs = {&wte_,      &wpe_,      &ln1w_, &ln1b_, &qkvw_, &qkvb_,
                                                      &attprojw_, &attprojb_, &ln2w_, &ln2b_, &fcw_,  &fcb_,
                                                      &fcprojw_,  &fcprojb_,  &lnfw_, &lnfb_};
  const float* p = params;
  for (int i = 0; i < kNumParamTensors; ++i) {
    *ptrs[static_cast<size_t>(i)] = p;
    p += sizes[static_cast<size_t>(i)];
  }
  const size_t C = c_.channels;
  kv_.assign(static_cast<size_t>(c_.num_layers) * c_.max_seq_len * 2 * C, 0.0f);
  x_.resize(C);
  ln_.resize(C);
  qkv_.resize(3 * C);
  att_.resize(C);
  proj_.resize(C);
  fc_.resize(4 * C);
  gelu_.resize(4 * C);
  mean_.resize(1);
  rstd_.resize(1);
  logits_.resize(static_cast<size_t>(c_.padded_vocab_size));
}

const float* GptDecoder::append(int32_t token) {
  if (pos_ >= c_.max_seq_len) {
    throw ConfigError("generation reached the model's maxT of " + std::to_string(c_.max_seq_len) +
                      " positions: use a shorter prompt or fewer new tokens");
  }
  if (token < 0 || token >= c_.vocab_size) {
    throw ConfigError("token " + std::to_string(token) + " is outside the model's vocabulary [0, " +
                      std::to_string(c_.vocab_size) + ")");
  }
  const int C = c_.channels, t = pos_;
  const size_t c = static_cast<size_t>(C);
  // x (C) = wte[token] + wpe[t]
  for (size_t i = 0; i < c; ++i)
    x_[i] = wte_[static_cast<size_t>(token) * c + i] + wpe_[static_cast<size_t>(t) * c + i];
  for (int l = 0; l < c_.num_layers; ++l) {
    const size_t L = static_cast<size_t>(l);
    cpu::layernorm_forward(pool_, ln_.data(), mean_.data(), rstd_.data(), x_.data(), ln1w_ + L * c, ln1b_ + L * c, 1,
                           C);
    // qkv (3C) = ln @ qkvw[l]^T + qkvb[l]; k and v go to the cache at position t
    cpu::matmul_forward(pool_, qkv_.data(), ln_.data(), qkvw_ + L * 3 * c * c, qkvb_ + L * 3 * c, 1, C, 3 * C);
    float* kv = kv_.data() + L * c_.max_seq_len * 2 * c;
    std::copy(qkv_.begin() + C, qkv_.end(), kv + static_cast<size_t>(t) * 2 * c);
    cpu::attention_decode_forward(pool_, att_.data(), qkv_.data(), kv, t, C, c_.num_heads);
    cpu::matmul_forward(pool_, proj_.data(), att_.data(), attprojw_ + L * c * c, attprojb_ + L * c, 1, C, C);
    for (size_t i = 0; i < c; ++i) x_[i] += proj_[i];
    cpu::layernorm_forward(pool_, ln_.data(), mean_.data(), rstd_.data(), x_.data(), ln2w_ + L * c, ln2b_ + L * c, 1,
                           C);
    cpu::matmul_forward(pool_, fc_.data(), ln_.data(), fcw_ + L * 4 * c * c, fcb_ + L * 4 * c, 1, C, 4 * C);
    cpu::gelu_forward(pool_, gelu_.data(), fc_.data(), 4 * c);
    cpu::matmul_forward(pool_, proj_.data(), gelu_.data(), fcprojw_ + L * 4 * c * c, fcprojb_ + L * c, 1, 4 * C, C);
    for (size_t i = 0; i < c; ++i) x_[i] += proj_[i];
  }
  cpu::layernorm_forward(pool_, ln_.data(), mean_.data(), rstd_.data(), x_.data(), lnfw_, lnfb_, 1, C);
  // logits (Vp) = ln @ wte^T: the LM head is tied to the token embedding
  cpu::matmul_forward<float>(pool_, logits_.data(), ln_.data(), wte_, nullptr, 1, C, c_.padded_vocab_size);
  ++pos_;
  return logits_.data();
}

double SampleRng::uniform() {
  uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1.0p-53;
}

int32_t sample_token(const float* logits, int V, const SamplingOptions& opt, SampleRng& rng) {
  if (opt.temperature <= 0) return static_cast<int32_t>(std::max_element(logits, logits + V) - logits);
  // Candidates by probability, highest first (ties: lower id first, so the order is deterministic).
  std::vector<int32_t> ids(static_cast<size_t>(V));
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  size_t keep = opt.top_k > 0 ? std::min(static_cast<size_t>(opt.top_k), ids.size()) : ids.size();
  const double mx = logits[ids[0]];
  std::vector<double> p(keep);
  double sum = 0;
  for (size_t i = 0; i < keep; ++i) sum += p[i] = std::exp((logits[ids[i]] - mx) / opt.temperature);
  if (opt.top_p < 1.0) {  // the smallest prefix whose probability reaches top_p
    double acc = 0;
    for (size_t i = 0; i < keep; ++i) {
      acc += p[i] / sum;
      if (acc >= opt.top_p) {
        keep = i + 1;
        break;
      }
    }
    sum = std::accumulate(p.begin(), p.begin() + static_cast<std::ptrdiff_t>(keep), 0.0);
  }
  double r = rng.uniform() * sum;
  for (size_t i = 0; i < keep; ++i) {
    r -= p[i];
    if (r < 0) return ids[i];
  }
  return ids[keep - 1];  // rounding left r at or above 0 after the last candidate
}

}  // namespace railyard::worker
