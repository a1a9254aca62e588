#include "worker/model/gpt.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <random>

#include "common/error.h"
#include "worker/kernels/cpu/kernels.h"

namespace railyard::worker {

template <typename T>
AlignedBuffer<T>::AlignedBuffer(size_t n) : size_(n) {
  void* p = nullptr;
  const size_t bytes = (n * sizeof(T) + 63) / 64 * 64;
  if (n > 0 && posix_memalign(&p, 64, bytes) != 0) throw std::bad_alloc();
  if (p != nullptr) std::memset(p, 0, bytes);
  data_.reset(static_cast<T*>(p));
}

template <typename T>
void AlignedBuffer<T>::Free::operator()(T* p) const {
  std::free(p);
}

template <typename T>
std::array<T*, kNumParamTensors> split_tensors(T* flat, const GptConfig& c) {
  std::array<T*, kNumParamTensors> out{};
  auto sizes = param_sizes(c);
  for (int i = 0; i < kNumParamTensors; ++i) {
    out[i] = flat;
    flat += sizes[i];
  }
  return out;
}

namespace {

// Element counts of the activation buffer. Per layer (not counting its output residual3, always kept): ln1 (N,C),
// ln1 mean/rstd (N), qkv (N,3C), atty (N,C), res2 (N,C), ln2 (N,C), ln2 mean/rstd (N), fch and fch_gelu (N,4C) =
// 15NC + 4N, plus the attention probabilities (B,NH,T,T). Fully recomputed layers keep none of it, selectively
// recomputed ones all but the probabilities; the working set holds one recomputed layer's share during backward.
struct ActLayout {
  size_t N, C, layer, att;      // N = B*T; layer = 15NC + 4N; att = B*NH*T*T
  size_t stored, stored_att;    // layers keeping `layer`, layers keeping `att`
  size_t work_layer, work_att;  // 0 or 1: the working set's share
  size_t encoded, residual3, lnf, lnf_stats, logits, losses;
  size_t dres, dc, d4c, dqkv, att_scratch, proj;
  size_t total() const {
    return encoded + (stored + work_layer) * layer + (stored_att + work_att) * att + residual3 + lnf + lnf_stats +
           logits + losses + dres + dc + d4c + dqkv + att_scratch + proj;
  }
};

ActLayout act_layout(const GptConfig& c, int B, int T, int threads, const RecomputeSpec& r) {
  const size_t L = c.num_layers, C = c.channels, NH = c.num_heads, Vp = c.padded_vocab_size;
  const size_t N = static_cast<size_t>(B) * T;
  ActLayout a{};
  a.N = N;
  a.C = C;
  a.layer = 15 * N * C + 4 * N;
  a.att = B * NH * static_cast<size_t>(T) * T;
  for (size_t l = 0; l < L; ++l) {
    const bool full = r.full(static_cast<int>(l)), sel = r.selective(static_cast<int>(l));
    if (!full) ++a.stored;
    if (!full && !sel) ++a.stored_att;
    if (full) a.work_layer = 1;
    if (full || sel) a.work_att = 1;
  }
  a.encoded = N * C;        // (B, T, C)
  a.residual3 = L * N * C;  // (L, B, T, C)
  a.lnf = N * C;
  a.lnf_stats = 2 * N;
  a.logits = N * Vp;  // (B, T, Vp); dlogits in place after a kTrain forward
  a.losses = N;
  a.dres = a.dc = N * C;
  a.d4c = N * 4 * C;
  a.dqkv = N * 3 * C;
  a.att_scratch = static_cast<size_t>(threads) * T * T;
  a.proj = N * C;
  return a;
}

// Standard normal from two uniforms (Box-Muller); written out so the stream is the same on every platform
// (std::normal_distribution's algorithm is implementation-defined).
struct NormalRng {
  explicit NormalRng(uint64_t seed) : gen(seed) {}
  double uniform() { return (static_cast<double>(gen() >> 11) + 0.5) * (1.0 / 9007199254740992.0); }
  double next() {
    if (have_spare) {
      have_spare = false;
      return spare;
    }
    const double u1 = uniform(), u2 = uniform();
    const double r = std::sqrt(-2.0 * std::log(u1)), th = 2.0 * M_PI * u2;
    spare = r * std::sin(th);
    have_spare = true;
    return r * std::cos(th);
  }
  std::mt19937_64 gen;
  double spare = 0;
  bool have_spare = false;
};

}  // namespace

size_t activation_bytes(const GptConfig& c, int B, int T, int threads, const RecomputeSpec& recompute) {
  return act_layout(c, B, T, threads, recompute).total() * sizeof(float) + static_cast<size_t>(B) * T * sizeof(int32_t);
}

template <typename T>
void init_gpt2_weights(T* params, const GptConfig& c, uint64_t seed, ThreadPool* pool) {
  constexpr size_t kChunk = 1 << 16;
  auto p = split_tensors(params, c);
  auto sizes = param_sizes(c);
  const double std_w = 0.02, std_proj = 0.02 / std::sqrt(2.0 * c.num_layers);
  const size_t real_wte = static_cast<size_t>(c.vocab_size) * c.channels;
  for (int i = 0; i < kNumParamTensors; ++i) {
    const std::string_view name = kParamNames[i];
    T* t = p[i];
    const size_t n = sizes[i];
    double stddev = 0, constant = 0;
    if (name == "wte" || name == "wpe" || name == "qkvw" || name == "fcw") {
      stddev = std_w;
    } else if (name == "attprojw" || name == "fcprojw") {
      stddev = std_proj;
    } else if (name == "ln1w" || name == "ln2w" || name == "lnfw") {
      constant = 1;
    }
    const size_t limit = name == "wte" ? real_wte : n;  // padded vocabulary rows stay 0
    auto fill = [&](size_t c0, size_t c1) {
      for (size_t k = c0; k < c1; ++k) {
        const size_t b = k * kChunk, e = std::min(n, b + kChunk);
        if (stddev == 0) {
          for (size_t j = b; j < e; ++j) t[j] = static_cast<T>(constant);
          continue;
        }
        // splitmix64 of (seed, tensor, chunk): independent, well-mixed streams per chunk
        uint64_t z = seed + 0x9E3779B97F4A7C15ull * (1 + (static_cast<uint64_t>(i) << 32) + k);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        NormalRng rng(z ^ (z >> 31));
        for (size_t j = b; j < e; ++j) t[j] = j < limit ? static_cast<T>(stddev * rng.next()) : T(0);
      }
    };
    const size_t chunks = (n + kChunk - 1) / kChunk;
    if (pool != nullptr) {
      pool->parallel_for(chunks, fill);
    } else {
      fill(0, chunks);
    }
  }
}

template <typename T>
Gpt<T>::Gpt(const GptConfig& config, int B, int Tn, ThreadPool& pool, const RecomputeSpec& recompute)
    : config_(config), recompute_(recompute), B_(B), T_(Tn), pool_(pool) {
  validate(config_);
  if (B <= 0) throw ConfigError("batch (B) must be positive, got " + std::to_string(B));
  if (Tn <= 0 || Tn > config.max_seq_len) {
    throw ConfigError("sequence length T=" + std::to_string(Tn) + " must be in 1.." +
                      std::to_string(config.max_seq_len) + " (the model's maxT)");
  }
  cpu::init_blas_single_threaded();
  params_ = AlignedBuffer<T>(num_parameters(config_));
  grads_ = AlignedBuffer<T>(num_parameters(config_));
  const ActLayout a = act_layout(config_, B, Tn, pool.size(), recompute_);
  acts_ = AlignedBuffer<T>(a.total());
  inputs_ = AlignedBuffer<int32_t>(static_cast<size_t>(B) * Tn);
  T* p = acts_.data();
  auto take = [&p](size_t n) {
    T* r = p;
    p += n;
    return r;
  };
  const size_t N = a.N, C = a.C;
  // One layer's share: ln1, stats, qkv, atty, res2, ln2, stats, fch, fch_gelu (a.layer elements), then att.
  auto take_layer = [&](LayerActs& la) {
    la.ln1 = take(N * C);
    la.ln1_mean = take(N);
    la.ln1_rstd = take(N);
    la.qkv = take(N * 3 * C);
    la.atty = take(N * C);
    la.res2 = take(N * C);
    la.ln2 = take(N * C);
    la.ln2_mean = take(N);
    la.ln2_rstd = take(N);
    la.fch = take(N * 4 * C);
    la.fch_gelu = take(N * 4 * C);
  };
  encoded_ = take(a.encoded);
  residual3_ = take(a.residual3);
  LayerActs work{};
  if (a.work_layer) take_layer(work);
  if (a.work_att) work.att = take(a.att);
  layer_.resize(config_.num_layers);
  for (int l = 0; l < config_.num_layers; ++l) {
    LayerActs& la = layer_[l];
    if (recompute_.full(l)) {
      la = work;
    } else {
      take_layer(la);
      la.att = recompute_.selective(l) ? work.att : take(a.att);
    }
  }
  lnf_ = take(a.lnf);
  lnf_mean_ = take(N);
  lnf_rstd_ = take(N);
  logits_ = take(a.logits);
  losses_ = take(a.losses);
  dres_ = take(a.dres);
  dc_ = take(a.dc);
  d4c_ = take(a.d4c);
  dqkv_ = take(a.dqkv);
  att_scratch_ = take(a.att_scratch);
  proj_ = take(a.proj);
  if (p != acts_.data() + a.total()) throw Error("Gpt: activation layout does not add up (a bug)");
}

template <typename T>
size_t Gpt<T>::activation_bytes() const {
  return acts_.size() * sizeof(T) + inputs_.size() * sizeof(int32_t);
}

template <typename T>
void Gpt<T>::zero_grad() {
  pool_.parallel_for(grads_.size(),
                     [&](size_t b, size_t e) { std::memset(grads_.data() + b, 0, (e - b) * sizeof(T)); });
}

template <typename T>
const T* Gpt<T>::layer_input(size_t l) const {
  return l == 0 ? encoded_ : residual3_ + (l - 1) * static_cast<size_t>(B_) * T_ * config_.channels;
}

template <typename T>
void Gpt<T>::layer_forward(size_t l, const T* residual, const LayerActs& a, T* residual3) {
  using namespace cpu;
  const int B = B_, Tn = T_, C = config_.channels, NH = config_.num_heads;
  const size_t N = static_cast<size_t>(B) * Tn, lc = l * C;
  auto w = split_tensors(params_.data(), config_);
  T *ln1w = w[2], *ln1b = w[3], *qkvw = w[4], *qkvb = w[5], *attprojw = w[6], *attprojb = w[7], *ln2w = w[8],
    *ln2b = w[9], *fcw = w[10], *fcb = w[11], *fcprojw = w[12], *fcprojb = w[13];
  // attention block: residual2 = residual + attproj(attn(qkv(ln1(residual))))
  layernorm_forward(pool_, a.ln1, a.ln1_mean, a.ln1_rstd, residual, ln1w + lc, ln1b + lc, N, C);
  matmul_forward(pool_, a.qkv, a.ln1, qkvw + l * 3 * C * C, qkvb + 3 * lc, N, C, 3 * C);  // (B,T,3C)
  attention_forward(pool_, a.atty, a.att, a.qkv, B, Tn, C, NH);                           // (B,T,C), (B,NH,T,T)
  matmul_forward(pool_, proj_, a.atty, attprojw + l * C * C, attprojb + lc, N, C, C);     // (B,T,C)
  residual_forward(pool_, a.res2, residual, proj_, N * C);
  // MLP block: residual3 = residual2 + fcproj(gelu(fc(ln2(residual2))))
  layernorm_forward(pool_, a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, ln2w + lc, ln2b + lc, N, C);
  matmul_forward(pool_, a.fch, a.ln2, fcw + l * 4 * C * C, fcb + 4 * lc, N, C, 4 * C);  // (B,T,4C)
  gelu_forward(pool_, a.fch_gelu, a.fch, N * 4 * C);
  matmul_forward(pool_, proj_, a.fch_gelu, fcprojw + l * 4 * C * C, fcprojb + lc, N, 4 * C, C);  // (B,T,C)
  residual_forward(pool_, residual3, a.res2, proj_, N * C);
}

template <typename T>
T Gpt<T>::forward(const int32_t* inputs, const int32_t* targets, Mode mode, T dloss) {
  using namespace cpu;
  const int B = B_, Tn = T_, C = config_.channels, V = config_.vocab_size, Vp = config_.padded_vocab_size;
  const size_t L = config_.num_layers, N = static_cast<size_t>(B) * Tn;
  for (size_t i = 0; i < N; ++i) {
    if (inputs[i] < 0 || inputs[i] >= V || targets[i] < 0 || targets[i] >= V) {
      throw Error("forward: token " + std::to_string(inputs[i] < 0 || inputs[i] >= V ? inputs[i] : targets[i]) +
                  " at position " + std::to_string(i) + " is outside the vocabulary [0, " + std::to_string(V) +
                  "): the data was tokenized for another vocabulary");
    }
  }
  std::memcpy(inputs_.data(), inputs, N * sizeof(int32_t));
  auto w = split_tensors(params_.data(), config_);
  T *wte = w[0], *wpe = w[1], *lnfw = w[14], *lnfb = w[15];

  encoder_forward(pool_, encoded_, inputs, wte, wpe, B, Tn, C);  // (B,T,C)
  for (size_t l = 0; l < L; ++l) layer_forward(l, layer_input(l), layer_[l], residual3_ + l * N * C);
  layernorm_forward(pool_, lnf_, lnf_mean_, lnf_rstd_, residual3_ + (L - 1) * N * C, lnfw, lnfb, N, C);
  matmul_forward(pool_, logits_, lnf_, wte, static_cast<const T*>(nullptr), N, C, Vp);  // (B,T,Vp), tied head
  if (mode == Mode::kTrain) {
    crossentropy_fused_backward(pool_, losses_, logits_, targets, N, V, Vp, dloss / static_cast<T>(N));
    have_dlogits_ = true;
  } else {
    crossentropy_forward(pool_, losses_, logits_, targets, N, V, Vp);
    have_dlogits_ = false;
  }
  T sum = 0;
  for (size_t i = 0; i < N; ++i) sum += losses_[i];
  return sum / static_cast<T>(N);
}

template <typename T>
void Gpt<T>::backward(bool accumulate) {
  using namespace cpu;
  if (!have_dlogits_) throw Error("Gpt::backward() needs a forward() in kTrain mode first");
  have_dlogits_ = false;
  const int B = B_, Tn = T_, C = config_.channels, NH = config_.num_heads, Vp = config_.padded_vocab_size;
  const size_t L = config_.num_layers, N = static_cast<size_t>(B) * Tn;
  auto w = split_tensors(params_.data(), config_);
  auto g = split_tensors(grads_.data(), config_);
  if (!accumulate) {
    // Everything that only += (embeddings' position table, LayerNorm parameters, biases) starts from 0; the matrices
    // (wte through the LM head, qkvw, attprojw, fcw, fcprojw) are assigned by their dW GEMMs below.
    auto sizes = param_sizes(config_);
    for (int i = 0; i < kNumParamTensors; ++i) {
      const auto name = kParamNames[i];
      if (name == "wte" || name == "qkvw" || name == "attprojw" || name == "fcw" || name == "fcprojw") continue;
      std::memset(g[i], 0, sizes[i] * sizeof(T));
    }
  }
  const bool acc = accumulate;

  // LM head (tied): dlnf (B,T,C) = dlogits (B,T,Vp) @ wte (Vp,C); dwte += dlogits^T @ lnf
  matmul_backward(pool_, dc_, false, g[0], static_cast<T*>(nullptr), logits_, lnf_, w[0], N, C, Vp, acc);
  std::memset(dres_, 0, N * C * sizeof(T));
  layernorm_backward(pool_, dres_, g[14], g[15], dc_, residual3_ + (L - 1) * N * C, w[14], lnf_mean_, lnf_rstd_, N, C);
  // Flat offset of tensor i (+ element e) in grads_, for the ready hook.
  auto ready = [&](int i, size_t e, size_t n) {
    if (grad_ready_) grad_ready_(static_cast<size_t>(g[i] - grads_.data()) + e, n);
  };
  ready(14, 0, C);
  ready(15, 0, C);
  // dres_ now holds d(loss)/d(residual stream) and flows down through the layers.
  for (size_t li = L; li-- > 0;) {
    const size_t l = li;
    const T* residual = layer_input(l);
    const LayerActs& a = layer_[l];
    const size_t lc = l * C;
    if (recompute_.full(static_cast<int>(l))) {
      // The same kernels on the same input and weights: the working set gets the bits forward computed.
      layer_forward(l, residual, a, proj_);  // the output (residual3) is kept; proj_ takes the throwaway copy
    } else if (recompute_.selective(static_cast<int>(l))) {
      attention_forward(pool_, a.atty, a.att, a.qkv, B, Tn, C, NH);  // atty rewritten with identical values
    }
    // MLP block
    matmul_backward(pool_, d4c_, false, g[12] + l * 4 * C * C, g[13] + lc, dres_, a.fch_gelu, w[12] + l * 4 * C * C, N,
                    4 * C, C, acc);                      // d fch_gelu (B,T,4C)
    gelu_backward(pool_, d4c_, a.fch, d4c_, N * 4 * C);  // d fch (B,T,4C)
    matmul_backward(pool_, dc_, false, g[10] + l * 4 * C * C, g[11] + 4 * lc, d4c_, a.ln2, w[10] + l * 4 * C * C, N, C,
                    4 * C, acc);  // d ln2 (B,T,C)
    layernorm_backward(pool_, dres_, g[8] + lc, g[9] + lc, dc_, a.res2, w[8] + lc, a.ln2_mean, a.ln2_rstd, N,
                       C);  // += d residual2
    // attention block
    matmul_backward(pool_, dc_, false, g[6] + l * C * C, g[7] + lc, dres_, a.atty, w[6] + l * C * C, N, C, C,
                    acc);                                                             // d atty (B,T,C)
    attention_backward(pool_, dqkv_, att_scratch_, dc_, a.qkv, a.att, B, Tn, C, NH);  // d qkv (B,T,3C)
    matmul_backward(pool_, dc_, false, g[4] + l * 3 * C * C, g[5] + 3 * lc, dqkv_, a.ln1, w[4] + l * 3 * C * C, N, C,
                    3 * C, acc);  // d ln1 (B,T,C)
    layernorm_backward(pool_, dres_, g[2] + lc, g[3] + lc, dc_, residual, w[2] + lc, a.ln1_mean, a.ln1_rstd, N,
                       C);  // += d residual
    if (grad_ready_) {
      // Layer l's slices of the 12 stacked tensors (ln1w .. fcprojb) are final now.
      const auto sizes = param_sizes(config_);
      for (int i = 2; i < 14; ++i) ready(i, l * (sizes[i] / L), sizes[i] / L);
    }
  }
  encoder_backward(pool_, g[0], g[1], dres_, inputs_.data(), B, Tn, C);
  ready(0, 0, static_cast<size_t>(config_.padded_vocab_size) * C);
  ready(1, 0, static_cast<size_t>(config_.max_seq_len) * C);
}

template class AlignedBuffer<float>;
template class AlignedBuffer<double>;
template class AlignedBuffer<int32_t>;
template std::array<float*, kNumParamTensors> split_tensors(float*, const GptConfig&);
template std::array<double*, kNumParamTensors> split_tensors(double*, const GptConfig&);
template std::array<const float*, kNumParamTensors> split_tensors(const float*, const GptConfig&);
template void init_gpt2_weights(float*, const GptConfig&, uint64_t, ThreadPool*);
template void init_gpt2_weights(double*, const GptConfig&, uint64_t, ThreadPool*);
template class Gpt<float>;
template class Gpt<double>;

}  // namespace railyard::worker
