#include "worker/model/gpt.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <random>

#include "common/error.h"
#include "worker/device/cpu_kernels.h"
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
// 15NC + 4N, plus attention's saved state (the CPU's probabilities (B,NH,T,T), CUDA's row lse (B,NH,T)). Fully
// recomputed layers keep none of it, selectively recomputed ones all but the probabilities; the working set holds one
// recomputed layer's share during backward.
// One layer's activations in one process: every width is C; with experts fch, fch_gelu hold R = E x capacity rows
// instead of N, plus probs (N,E) and the experts' outputs (R,C).
LayerActShape layer_act_shape(const GptConfig& c, size_t N) {
  const size_t C = c.channels, E = c.moe.experts;
  return {N, N, C, C, E > 0 ? E * moe_capacity(c.moe, N) : N, E};
}

struct ActLayout {
  size_t N, C, layer, att;      // N = B*T; layer = 15NC + 4N (dense); att = the device's attention_saved_elems
  size_t stored, stored_att;    // layers keeping `layer`, layers keeping `att`
  size_t work_layer, work_att;  // 0 or 1: the working set's share
  size_t encoded, residual3, lnf, lnf_stats, logits, losses;
  size_t dres, dc, d4c, dqkv, att_scratch, ln_scratch, proj;
  size_t moe_scratch;  // MoE: x, dx, dy (R,C), dh (R,4C), dprobs (N,E); R = E * capacity
  size_t routing;      // int32 per layer (MoE): choice, row (N*k), count (E), token (R)
  size_t total() const {
    return encoded + (stored + work_layer) * layer + (stored_att + work_att) * att + residual3 + lnf + lnf_stats +
           logits + losses + dres + dc + d4c + dqkv + att_scratch + ln_scratch + proj + moe_scratch;
  }
};

// What the device needs for attention and layernorm (Kernels' *_elems); cpu_sizes gives the CPU kernels' values.
struct KernelSizes {
  size_t att_saved, att_scratch, ln_scratch;
};

KernelSizes cpu_sizes(const GptConfig& c, int B, int T, int threads) {
  return {static_cast<size_t>(B) * c.num_heads * T * T, static_cast<size_t>(threads) * T * T, 0};
}

template <typename T>
KernelSizes device_sizes(const Kernels<T>& d, const GptConfig& c, int B, int Tn) {
  return {d.attention_saved_elems(B, Tn, c.channels, c.num_heads),
          d.attention_scratch_elems(B, Tn, c.channels, c.num_heads),
          d.layernorm_scratch_elems(static_cast<size_t>(B) * Tn, c.channels)};
}

ActLayout act_layout(const GptConfig& c, int B, int T, const KernelSizes& ks, const RecomputeSpec& r) {
  const size_t L = c.num_layers, C = c.channels, Vp = c.padded_vocab_size;
  const size_t N = static_cast<size_t>(B) * T;
  ActLayout a{};
  a.N = N;
  a.C = C;
  a.layer = layer_act_shape(c, N).elements();  // 15NC + 4N dense
  if (c.moe.experts > 0) {
    const size_t E = c.moe.experts, R = E * moe_capacity(c.moe, N), k = c.moe.top_k;
    a.moe_scratch = 3 * R * C + 4 * R * C + N * E;
    a.routing = L * (2 * N * k + E + R);
  }
  a.att = ks.att_saved;
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
  a.att_scratch = ks.att_scratch;
  a.ln_scratch = ks.ln_scratch;
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

constexpr size_t kInitChunk = 1 << 16;

// The stream of chunk k of tensor i: splitmix64 of (seed, tensor, chunk), independent and well mixed per chunk.
NormalRng init_chunk_rng(uint64_t seed, int i, size_t k) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * (1 + (static_cast<uint64_t>(i) << 32) + k);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return NormalRng(z ^ (z >> 31));
}

// Expert tensor i of an expert-parallel shard (n local elements): the values the global tensor (L, E, ...) gets at
// this shard's experts, so a shard holds exactly its slice of the single-process initialisation. The global chunks
// overlapping the shard are drawn whole (a chunk's stream is sequential) and their overlap copied.
template <typename T>
void init_expert_shard(T* t, const GptConfig& c, int i, size_t n, double stddev, uint64_t seed, ThreadPool* pool) {
  const size_t L = c.num_layers, E = c.moe.experts, el = local_experts(c), per = n / (L * el);
  const size_t first = static_cast<size_t>(c.moe.expert_shard) * el, global_n = L * E * per;
  auto fill = [&](size_t c0, size_t c1) {
    std::vector<T> draw(kInitChunk);
    for (size_t k = c0; k < c1; ++k) {
      const size_t b = k * kInitChunk, e = std::min(global_n, b + kInitChunk);
      bool drawn = false;
      for (size_t l = 0; l < L; ++l) {
        const size_t ob = (l * E + first) * per, oe = ob + el * per;  // this shard's run of layer l
        const size_t s0 = std::max(ob, b), s1 = std::min(oe, e);
        if (s0 >= s1) continue;
        if (!drawn) {
          NormalRng rng = init_chunk_rng(seed, i, k);
          for (size_t j = b; j < e; ++j) draw[j - b] = static_cast<T>(stddev * rng.next());
          drawn = true;
        }
        std::copy(draw.begin() + (s0 - b), draw.begin() + (s1 - b), t + l * el * per + (s0 - ob));
      }
    }
  };
  const size_t chunks = (global_n + kInitChunk - 1) / kInitChunk;
  if (pool != nullptr) {
    pool->parallel_for(chunks, fill);
  } else {
    fill(0, chunks);
  }
}

}  // namespace

size_t activation_bytes(const GptConfig& c, int B, int T, int threads, const RecomputeSpec& recompute) {
  const ActLayout a = act_layout(c, B, T, cpu_sizes(c, B, T, threads), recompute);
  return a.total() * sizeof(float) + (static_cast<size_t>(B) * T + a.routing) * sizeof(int32_t);
}

template <typename T>
void init_gpt2_weights(T* params, const GptConfig& c, uint64_t seed, ThreadPool* pool) {
  constexpr size_t kChunk = kInitChunk;
  auto p = split_tensors(params, c);
  auto sizes = param_sizes(c);
  const double std_w = 0.02, std_proj = 0.02 / std::sqrt(2.0 * c.num_layers);
  const size_t real_wte = static_cast<size_t>(c.vocab_size) * c.channels;
  // Tensor kNumParamTensors is the MoE router (L, E, C) after the 16 llm.c tensors: N(0, 0.02) like the others.
  const int tensors = kNumParamTensors + (router_size(c) > 0 ? 1 : 0);
  for (int i = 0; i < tensors; ++i) {
    const std::string_view name = i < kNumParamTensors ? kParamNames[i] : "routerw";
    T* t = i < kNumParamTensors ? p[i] : params + router_offset(c);
    const size_t n = i < kNumParamTensors ? sizes[i] : router_size(c);
    double stddev = 0, constant = 0;
    if (name == "wte" || name == "wpe" || name == "qkvw" || name == "fcw" || name == "routerw") {
      stddev = std_w;
    } else if (name == "attprojw" || name == "fcprojw") {
      stddev = std_proj;
    } else if (name == "ln1w" || name == "ln2w" || name == "lnfw") {
      constant = 1;
    }
    const size_t limit = name == "wte" ? real_wte : n;  // padded vocabulary rows stay 0
    if (c.moe.expert_shards > 1 && i >= 10 && i <= 13 && (stddev != 0 || constant != 0)) {
      init_expert_shard(t, c, i, sizes[i], stddev, seed, pool);
      continue;
    }
    auto fill = [&](size_t c0, size_t c1) {
      for (size_t k = c0; k < c1; ++k) {
        const size_t b = k * kChunk, e = std::min(n, b + kChunk);
        if (stddev == 0) {
          for (size_t j = b; j < e; ++j) t[j] = static_cast<T>(constant);
          continue;
        }
        NormalRng rng = init_chunk_rng(seed, i, k);
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
Gpt<T>::Gpt(const GptConfig& config, int B, int Tn, ThreadPool& pool, const RecomputeSpec& recompute,
            Kernels<T>* device)
    : config_(config),
      recompute_(recompute),
      B_(B),
      T_(Tn),
      pool_(pool),
      own_device_(device == nullptr ? std::make_unique<CpuKernels<T>>(pool) : nullptr),
      dev_(device == nullptr ? own_device_.get() : device) {
  validate(config_);
  if (B <= 0) throw ConfigError("batch (B) must be positive, got " + std::to_string(B));
  if (Tn <= 0 || Tn > config.max_seq_len) {
    throw ConfigError("sequence length T=" + std::to_string(Tn) + " must be in 1.." +
                      std::to_string(config.max_seq_len) + " (the model's maxT)");
  }
  cpu::init_blas_single_threaded();
  params_ = DeviceBuffer<T>(*dev_, num_parameters(config_));
  // The device may keep a bf16 copy for its GEMMs (CUDA); it follows init/restore (to_device) and AdamW by itself.
  dev_->set_weights(params_.data(), params_.size());
  grads_ = DeviceBuffer<T>(*dev_, num_parameters(config_));
  const ActLayout a = act_layout(config_, B, Tn, device_sizes(*dev_, config_, B, Tn), recompute_);
  acts_ = DeviceBuffer<T>(*dev_, a.total());
  inputs_ = DeviceBuffer<int32_t>(*dev_, static_cast<size_t>(B) * Tn);
  if (!dev_->host_accessible()) {
    // The CPU reads the caller's targets and the losses in place.
    targets_ = DeviceBuffer<int32_t>(*dev_, static_cast<size_t>(B) * Tn);
    losses_host_.resize(static_cast<size_t>(B) * Tn);
  }
  T* p = acts_.data();
  auto take = [&p](size_t n) {
    T* r = p;
    p += n;
    return r;
  };
  const size_t N = a.N, C = a.C;
  const size_t E = config_.moe.experts, k = config_.moe.top_k;
  moe_cap_ = moe_capacity(config_.moe, N);
  const size_t R = E > 0 ? E * moe_cap_ : N;  // rows of the MLP hidden activations
  // One layer's share (a.layer elements, layer_acts.h's table); then att.
  const LayerActShape layer_shape = layer_act_shape(config_, N);
  auto take_layer = [&](LayerActs& la) { take_layer_acts(la, layer_shape, take); };
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
  ln_scratch_ = take(a.ln_scratch);
  proj_ = take(a.proj);
  if (E > 0) {
    moe_x_ = take(R * C);
    moe_dx_ = take(R * C);
    moe_dy_ = take(R * C);
    moe_dh_ = take(R * 4 * C);
    moe_dp_ = take(N * E);
    routing_buf_ = AlignedBuffer<int32_t>(a.routing);
    moe_f_.assign(E, 0.0);
    moe_aux_ = DeviceBuffer<T>(*dev_, E);
    if (!dev_->host_accessible()) {
      routing_dev_ = DeviceBuffer<int32_t>(*dev_, a.routing);
      probs_host_.resize(N * E);
    }
    int32_t* q = routing_buf_.data();
    int32_t* dq = dev_->host_accessible() ? q : routing_dev_.data();
    routing_.resize(config_.num_layers);
    for (Routing& r : routing_) {
      r.choice = q;
      r.row = q + N * k;
      r.count = q + 2 * N * k;
      r.token = q + 2 * N * k + E;
      r.d_choice = dq;
      r.d_row = dq + N * k;
      r.d_token = dq + 2 * N * k + E;
      q += 2 * N * k + E + R;
      dq += 2 * N * k + E + R;
    }
  }
  if (p != acts_.data() + a.total()) throw Error("Gpt: activation layout does not add up (a bug)");
}

template <typename T>
size_t Gpt<T>::activation_bytes() const {
  return (acts_.size() + moe_aux_.size()) * sizeof(T) +
         (inputs_.size() + targets_.size() + routing_buf_.size() + routing_dev_.size()) * sizeof(int32_t);
}

template <typename T>
void Gpt<T>::init_weights(uint64_t seed) {
  if (dev_->host_accessible()) {
    init_gpt2_weights(params_.data(), config_, seed, &pool_);
    return;
  }
  AlignedBuffer<T> host(params_.size());
  init_gpt2_weights(host.data(), config_, seed, &pool_);
  dev_->to_device(params_.data(), host.data(), host.size() * sizeof(T));
}

template <typename T>
void Gpt<T>::copy_params_to_host(T* host) const {
  dev_->to_host(host, params_.data(), params_.size() * sizeof(T));
}

template <typename T>
void Gpt<T>::copy_params_from_host(const T* host) {
  dev_->to_device(params_.data(), host, params_.size() * sizeof(T));
}

template <typename T>
void Gpt<T>::zero_grad() {
  if (!dev_->host_accessible()) {
    dev_->zero(grads_.data(), grads_.size() * sizeof(T));
    return;
  }
  pool_.parallel_for(grads_.size(),
                     [&](size_t b, size_t e) { std::memset(grads_.data() + b, 0, (e - b) * sizeof(T)); });
}

template <typename T>
const T* Gpt<T>::layer_input(size_t l) const {
  return l == 0 ? encoded_ : residual3_ + (l - 1) * static_cast<size_t>(B_) * T_ * config_.channels;
}

template <typename T>
void Gpt<T>::layer_forward(size_t l, const T* residual, const LayerActs& a, T* residual3, MoeStats* stats) {
  Kernels<T>& d = *dev_;
  const int B = B_, Tn = T_, C = config_.channels, NH = config_.num_heads;
  const size_t N = static_cast<size_t>(B) * Tn, lc = l * C;
  auto w = split_tensors(params_.data(), config_);
  T *ln1w = w[2], *ln1b = w[3], *qkvw = w[4], *qkvb = w[5], *attprojw = w[6], *attprojb = w[7], *ln2w = w[8],
    *ln2b = w[9], *fcw = w[10], *fcb = w[11], *fcprojw = w[12], *fcprojb = w[13];
  // attention block: residual2 = residual + attproj(attn(qkv(ln1(residual))))
  d.layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, residual, ln1w + lc, ln1b + lc, N, C);
  d.matmul_forward(a.qkv, a.ln1, qkvw + l * 3 * C * C, qkvb + 3 * lc, N, C, 3 * C);  // (B,T,3C)
  d.attention_forward(a.atty, a.att, a.qkv, B, Tn, C, NH);                           // (B,T,C), (B,NH,T,T)
  d.matmul_forward(proj_, a.atty, attprojw + l * C * C, attprojb + lc, N, C, C);     // (B,T,C)
  // MLP block: residual3 = residual2 + fcproj(gelu(fc(ln2(residual2)))); residual2 and ln2 in one fused call (the
  // CPU runs residual_forward then layernorm_forward)
  d.residual_layernorm_forward(a.res2, a.ln2, a.ln2_mean, a.ln2_rstd, residual, proj_, ln2w + lc, ln2b + lc, N, C);
  if (config_.moe.experts > 0) {
    moe_forward(l, a, proj_, stats);  // (B,T,C): the gated sum of the token's kept experts
  } else {
    // fch (B,T,4C) is the pre-activation gelu_backward needs; CUDA: one GEMM with the GELU epilogue
    d.matmul_gelu_forward(a.fch_gelu, a.fch, a.ln2, fcw + l * 4 * C * C, fcb + 4 * lc, N, C, 4 * C);
    d.matmul_forward(proj_, a.fch_gelu, fcprojw + l * 4 * C * C, fcprojb + lc, N, 4 * C, C);  // (B,T,C)
  }
  d.residual_forward(residual3, a.res2, proj_, N * C);
}

// Mixture of experts (docs/worker.md, "Mixture of experts"). Every loop has a fixed order and each output element
// one owner, so the layer is deterministic and a recomputation reproduces it bitwise.
template <typename T>
void Gpt<T>::moe_forward(size_t l, const LayerActs& a, T* out, MoeStats* stats) {
  Kernels<T>& d = *dev_;
  const size_t N = static_cast<size_t>(B_) * T_, C = config_.channels, E = config_.moe.experts;
  const size_t k = config_.moe.top_k, cap = moe_cap_, H = 4 * C;
  if (config_.moe.expert_shards != 1 && config_.moe.expert_shards != ep_.size) {
    // A buffer of E/P experts runs only inside its expert-parallel group (set_expert_exchange).
    throw Error("Gpt: the model holds " + std::to_string(local_experts(config_)) + " of " + std::to_string(E) +
                " experts per layer but no expert-parallel group of " + std::to_string(config_.moe.expert_shards) +
                " ranks is attached");
  }
  const Routing& r = routing_[l];
  auto w = split_tensors(params_.data(), config_);
  const T* router = params_.data() + router_offset(config_) + l * E * C;
  // router: probs (N,E) = softmax(ln2 @ router^T); top-k per token by probability, ties to the lower index
  d.matmul_forward(a.probs, a.ln2, router, static_cast<const T*>(nullptr), N, static_cast<int>(C), static_cast<int>(E));
  d.moe_route(a.probs, r.d_choice, N, E, k);
  // dispatch with capacity on the host: all first choices in token order, then all second choices, ... (GShard's
  // priority); a device gets the rows and tokens back (on the CPU d_* are the host arrays)
  const bool host = d.host_accessible();
  if (!host) d.to_host(r.choice, r.d_choice, N * k * sizeof(int32_t));
  const size_t dropped = moe::dispatch(r.choice, N, k, E, cap, nullptr, r.row, r.count, r.token);
  if (!host) {
    d.to_device(r.d_row, r.row, N * k * sizeof(int32_t));
    d.to_device(r.d_token, r.token, E * cap * sizeof(int32_t));
  }
  // experts: gather the rows, fc -> gelu -> fcproj on (count, C)
  for (size_t e = 0; e < E; ++e) {
    const size_t n = r.count[e], le = l * E + e;
    if (n == 0) continue;
    T* xe = moe_x_ + e * cap * C;
    d.moe_gather_rows(xe, a.ln2, r.d_token + e * cap, n, C);
    if (ep_.size > 1) continue;  // the expert runs on its rank: moe_experts_forward_ep below
    d.matmul_gelu_forward(a.fch_gelu + e * cap * H, a.fch + e * cap * H, xe, w[10] + le * H * C, w[11] + le * H, n,
                          static_cast<int>(C), static_cast<int>(H));
    d.matmul_forward(a.moe_y + e * cap * C, a.fch_gelu + e * cap * H, w[12] + le * C * H, w[13] + le * C, n,
                     static_cast<int>(H), static_cast<int>(C));
  }
  if (ep_.size > 1) moe_experts_forward_ep(l, a);
  // combine: out[t] = sum over kept choices (in choice order) of probs[t, e] * y[row]; dropped choices add nothing
  d.moe_combine(out, a.probs, r.d_choice, r.d_row, a.moe_y, N, E, k, C);
  if (stats == nullptr) return;
  // load balancing (Switch/GShard): aux = alpha * E * sum_e f_e P_e (alpha at perfect balance)
  const T* probs = a.probs;
  if (!host) {
    d.to_host(probs_host_.data(), a.probs, N * E * sizeof(T));
    probs = probs_host_.data();
  }
  stats->aux_loss += moe::aux_loss(moe::balance(probs, r.choice, N, E, k), config_.moe);
  stats->assignments += N * k;
  stats->dropped += dropped;
  stats->tokens_dropped += moe::tokens_dropped(r.row, N, k);
}

template <typename T>
void Gpt<T>::moe_backward(size_t l, const LayerActs& a, const T* dout, T* dx) {
  Kernels<T>& d = *dev_;
  const size_t N = static_cast<size_t>(B_) * T_, C = config_.channels, E = config_.moe.experts;
  const size_t k = config_.moe.top_k, cap = moe_cap_, H = 4 * C;
  const Routing& r = routing_[l];
  auto w = split_tensors(params_.data(), config_);
  auto g = split_tensors(grads_.data(), config_);
  const T* router = params_.data() + router_offset(config_) + l * E * C;
  T* drouter = grads_.data() + router_offset(config_) + l * E * C;
  // d probs: from the gates and the load-balancing loss (times the objective's dloss), through the softmax. The
  // shares f_e come from the choices alone (kept on the host).
  moe_f_ = moe::choice_shares(r.choice, N, k, E);
  const std::vector<T> aux = moe::aux_grads<T>(moe_f_, static_cast<double>(N), config_.moe);
  d.to_device(moe_aux_.data(), aux.data(), E * sizeof(T));
  d.moe_router_backward(moe_dp_, a.probs, r.d_choice, r.d_row, a.moe_y, dout, moe_aux_.data(), dloss_, N, E, k, C);
  // experts: dy[row] = gate * dout[token]; fcproj, gelu, fc backward on the expert's rows
  if (ep_.size > 1) moe_experts_backward_ep(l, a, dout);
  for (size_t e = 0; e < (ep_.size > 1 ? 0 : E); ++e) {
    const size_t n = r.count[e], le = l * E + e;
    if (n == 0) continue;
    T* xe = moe_x_ + e * cap * C;
    T* dy = moe_dy_ + e * cap * C;
    d.moe_gather_rows(xe, a.ln2, r.d_token + e * cap, n, C);
    d.moe_gate_rows(dy, dout, a.probs, r.d_token + e * cap, e, E, n, C);
    T* dh = moe_dh_ + e * cap * H;
    // the experts' weight gradients accumulate (zeroed at the start of a non-accumulating backward)
    d.matmul_backward(dh, false, g[12] + le * C * H, g[13] + le * C, dy, a.fch_gelu + e * cap * H, w[12] + le * C * H,
                      n, static_cast<int>(H), static_cast<int>(C), true);  // d fch_gelu (n,4C)
    d.gelu_backward(dh, a.fch + e * cap * H, dh, n * H);                   // d fch (n,4C)
    d.matmul_backward(moe_dx_ + e * cap * C, false, g[10] + le * H * C, g[11] + le * H, dh, xe, w[10] + le * H * C, n,
                      static_cast<int>(C), static_cast<int>(H), true);  // d x_e (n,C)
  }
  // dx[t] = sum over kept choices (choice order) of the expert input gradients, then + the router's dz @ router
  d.moe_combine_input_grads(dx, r.d_row, moe_dx_, N, k, C);
  d.matmul_backward(dx, true, drouter, static_cast<T*>(nullptr), moe_dp_, a.ln2, router, N, static_cast<int>(C),
                    static_cast<int>(E), true);
}

template <typename T>
T Gpt<T>::forward(const int32_t* inputs, const int32_t* targets, Mode mode, T dloss) {
  Kernels<T>& d = *dev_;
  const int B = B_, Tn = T_, C = config_.channels, V = config_.vocab_size, Vp = config_.padded_vocab_size;
  const size_t L = config_.num_layers, N = static_cast<size_t>(B) * Tn;
  for (size_t i = 0; i < N; ++i) {
    if (inputs[i] < 0 || inputs[i] >= V || targets[i] < 0 || targets[i] >= V) {
      throw Error("forward: token " + std::to_string(inputs[i] < 0 || inputs[i] >= V ? inputs[i] : targets[i]) +
                  " at position " + std::to_string(i) + " is outside the vocabulary [0, " + std::to_string(V) +
                  "): the data was tokenized for another vocabulary");
    }
  }
  d.to_device(inputs_.data(), inputs, N * sizeof(int32_t));
  // The CPU reads the caller's targets in place; other devices get a copy.
  const int32_t* tgt = targets;
  if (!d.host_accessible()) {
    d.to_device(targets_.data(), targets, N * sizeof(int32_t));
    tgt = targets_.data();
  }
  auto w = split_tensors(params_.data(), config_);
  T *wte = w[0], *wpe = w[1], *lnfw = w[14], *lnfb = w[15];

  if (params_needed_) params_needed_(0);
  d.encoder_forward(encoded_, inputs_.data(), wte, wpe, B, Tn, C);  // (B,T,C)
  moe_stats_ = MoeStats{};
  for (size_t l = 0; l < L; ++l) {
    if (params_needed_) params_needed_(static_cast<int>(1 + l));
    layer_forward(l, layer_input(l), layer_[l], residual3_ + l * N * C, &moe_stats_);
  }
  if (params_needed_) params_needed_(static_cast<int>(L + 1));
  d.layernorm_forward(lnf_, lnf_mean_, lnf_rstd_, residual3_ + (L - 1) * N * C, lnfw, lnfb, N, C);
  d.matmul_forward(logits_, lnf_, wte, static_cast<const T*>(nullptr), N, C, Vp);  // (B,T,Vp), tied head
  if (mode == Mode::kTrain) {
    d.crossentropy_fused_backward(losses_, logits_, tgt, N, V, Vp, dloss / static_cast<T>(N));
    dloss_ = dloss;
    have_dlogits_ = true;
  } else {
    d.crossentropy_forward(losses_, logits_, tgt, N, V, Vp);
    have_dlogits_ = false;
  }
  const T* losses = losses_;
  if (!d.host_accessible()) {
    d.to_host(losses_host_.data(), losses_, N * sizeof(T));  // waits for the forward
    losses = losses_host_.data();
  }
  T sum = 0;
  for (size_t i = 0; i < N; ++i) sum += losses[i];
  return sum / static_cast<T>(N) + static_cast<T>(moe_stats_.aux_loss);
}

template <typename T>
void Gpt<T>::backward(bool accumulate) {
  Kernels<T>& d = *dev_;
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
      // MoE experts accumulate (an expert without tokens has no GEMM to assign its gradient), so they start at 0
      const bool moe_matrix = config_.moe.experts > 0 && (name == "fcw" || name == "fcprojw");
      if (!moe_matrix &&
          (name == "wte" || name == "qkvw" || name == "attprojw" || name == "fcw" || name == "fcprojw")) {
        continue;
      }
      d.zero(g[i], sizes[i] * sizeof(T));
    }
    d.zero(grads_.data() + router_offset(config_), router_size(config_) * sizeof(T));
  }
  const bool acc = accumulate;

  // LM head (tied): dlnf (B,T,C) = dlogits (B,T,Vp) @ wte (Vp,C); dwte += dlogits^T @ lnf
  d.matmul_backward(dc_, false, g[0], static_cast<T*>(nullptr), logits_, lnf_, w[0], N, C, Vp, acc);
  d.zero(dres_, N * C * sizeof(T));
  d.layernorm_backward(dres_, g[14], g[15], ln_scratch_, dc_, residual3_ + (L - 1) * N * C, w[14], lnf_mean_, lnf_rstd_,
                       N, C);
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
      layer_forward(l, residual, a, proj_, nullptr);  // residual3 is kept; proj_ takes the throwaway copy
    } else if (recompute_.selective(static_cast<int>(l))) {
      d.attention_forward(a.atty, a.att, a.qkv, B, Tn, C, NH);  // atty rewritten with identical values
    }
    // MLP block
    if (config_.moe.experts > 0) {
      moe_backward(l, a, dres_, dc_);  // d ln2 (B,T,C)
    } else {
      d.matmul_backward(d4c_, false, g[12] + l * 4 * C * C, g[13] + lc, dres_, a.fch_gelu, w[12] + l * 4 * C * C, N,
                        4 * C, C, acc);               // d fch_gelu (B,T,4C)
      d.gelu_backward(d4c_, a.fch, d4c_, N * 4 * C);  // d fch (B,T,4C)
      d.matmul_backward(dc_, false, g[10] + l * 4 * C * C, g[11] + 4 * lc, d4c_, a.ln2, w[10] + l * 4 * C * C, N, C,
                        4 * C, acc);  // d ln2 (B,T,C)
    }
    d.layernorm_backward(dres_, g[8] + lc, g[9] + lc, ln_scratch_, dc_, a.res2, w[8] + lc, a.ln2_mean, a.ln2_rstd, N,
                         C);  // += d residual2
    // attention block
    d.matmul_backward(dc_, false, g[6] + l * C * C, g[7] + lc, dres_, a.atty, w[6] + l * C * C, N, C, C,
                      acc);                                                              // d atty (B,T,C)
    d.attention_backward(dqkv_, att_scratch_, dc_, a.qkv, a.atty, a.att, B, Tn, C, NH);  // d qkv (B,T,3C)
    d.matmul_backward(dc_, false, g[4] + l * 3 * C * C, g[5] + 3 * lc, dqkv_, a.ln1, w[4] + l * 3 * C * C, N, C, 3 * C,
                      acc);  // d ln1 (B,T,C)
    d.layernorm_backward(dres_, g[2] + lc, g[3] + lc, ln_scratch_, dc_, residual, w[2] + lc, a.ln1_mean, a.ln1_rstd, N,
                         C);  // += d residual
    if (grad_ready_) {
      // Layer l's slices of the 12 stacked tensors (ln1w .. fcprojb) are final now.
      const auto sizes = param_sizes(config_);
      for (int i = 2; i < 14; ++i) ready(i, l * (sizes[i] / L), sizes[i] / L);
      const size_t router_layer = router_size(config_) / L;
      if (router_layer > 0) grad_ready_(router_offset(config_) + l * router_layer, router_layer);
    }
  }
  d.encoder_backward(g[0], g[1], dres_, inputs_.data(), B, Tn, C);
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
