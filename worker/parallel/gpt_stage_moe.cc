// Mixture-of-experts layers inside a tensor/pipeline stage (docs/parallel.md "Expert parallelism", "MoE with tensor
// and pipeline parallelism"). The math is worker/model/moe_math.h, the same functions Gpt<T> calls; what is here is
// where the tokens and the gradients live:
// - The experts and the router are not tensor-sharded: every tp rank holds all E experts of its stage's layers whole.
// - Without sequence parallelism every tp rank holds the same layernorm output (rows_ = B*T rows), routes it and runs
//   the experts redundantly, with identical results: no communication, and the expert/router gradients are
//   identical on the tp ranks.
// - With sequence parallelism tp rank r holds and routes its N/tp rows only. Dispatch stays that of one process over
//   the whole micro-batch: the ranks all-gather their per-(round, expert) choice counts (k E int32), so each knows
//   how many choices of the other ranks are ahead of its own in an expert's queue (moe::dispatch_base), and the
//   load-balancing statistics are summed over tp. The expert/router gradients are partial sums per rank until
//   finish_moe_grads adds them over tp once per step.
// - Pipeline: an MoE layer lives on the stage that holds the layer; its load-balancing loss and its gradient are
//   local to it; ParallelModel sums the stages' losses and statistics.
// - On a device (issue #11) the per-token math runs in the device's moe_* kernels on device buffers; the routing
//   decisions (dispatch under capacity, the load-balancing statistics, the sequence-parallel count exchange) stay on
//   the host from copies of the choices and probabilities, and the rows and tokens go back to the device. On the CPU
//   the device pointers are the host arrays and nothing is copied (bitwise the former host code).
#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>

#include "common/error.h"
#include "worker/kernels/cpu/kernels.h"
#include "worker/model/moe_math.h"
#include "worker/parallel/gpt_stage.h"

namespace railyard::worker::parallel {

namespace {

// What the MoE part of a stage allocates (floats and int32s): per slot and local layer the router probabilities
// (NL,E), the experts' hidden rows before and after gelu (R,4C) and outputs (R,C), the routing ints (choice and row
// per (token, choice), count per expert, token per row); once: gathered inputs, their gradient, d outputs (R,C),
// d hidden (R,4C), d router logits (NL,E), and the tp exchange of round counts (tp+2) k E. R = E * capacity. With
// expert parallelism count per expert is also received (E per slot and layer: rows each source sends this rank's
// experts), and the expert rows of the R-row buffers are those of this rank's experts for every source.
struct MoeSizes {
  size_t acts = 0, ints = 0, scratch = 0;
};

MoeSizes moe_sizes(const StageShape& sh, size_t N, size_t NL, int slots) {
  const MoeConfig& m = sh.config.moe;
  if (m.experts <= 0) return {};
  const size_t E = m.experts, k = m.top_k, C = sh.config.channels, R = E * moe_capacity(m, N), Ls = sh.layers();
  MoeSizes z;
  z.acts = slots * Ls * (NL * E + 2 * R * 4 * C + R * C);
  z.ints = slots * Ls * (2 * NL * k + 2 * E + R) + (sh.tp_size + 2) * k * E;
  z.scratch = 3 * R * C + R * 4 * C + NL * E;
  return z;
}

size_t bytes_of(const MoeSizes& z) { return (z.acts + z.scratch) * sizeof(float) + z.ints * sizeof(int32_t); }

}  // namespace

size_t stage_moe_activation_bytes(const StageShape& shape, int B, int seq_len, int slots, bool sequence_parallel) {
  const size_t N = static_cast<size_t>(B) * seq_len;
  return bytes_of(moe_sizes(shape, N, sequence_parallel ? N / shape.tp_size : N, slots));
}

struct GptStage::Moe {
  struct Layer {
    float *probs, *fch, *fch_gelu, *y;  // device memory
    int32_t *choice, *row, *count, *token;
    int32_t* rcount;                      // expert parallelism: rows source s sends local expert j, at s * E/P + j
    int32_t *d_choice, *d_row, *d_token;  // the device's copies (the host arrays on the CPU)
    std::vector<double> f;  // the layer's choice shares (whole micro-batch), for the load-balancing gradient
  };
  size_t E = 0, k = 0, cap = 0, N = 0;
  MoeSizes sizes;
  DeviceBuffer<float> acts, scratch;
  AlignedBuffer<int32_t> ints;  // host: the routing decisions
  // Off the host only: the device's routing copies (per slot and layer: choice, row, token), the load-balancing
  // gradient per expert, the probabilities copied out for the balance statistics, and (sequence parallelism) the
  // tp exchange's send/receive buffers on the device (NCCL takes device memory), (tp + 1) k E 8-byte slots.
  DeviceBuffer<int32_t> dints;
  DeviceBuffer<float> aux;
  std::vector<float> probs_host;
  DeviceBuffer<int64_t> exchange;
  std::vector<std::vector<Layer>> layer;  // [slot][local layer]
  float *x = nullptr, *dx = nullptr, *dy = nullptr, *dh = nullptr, *dprobs = nullptr;
  int32_t *mine = nullptr, *all = nullptr, *base = nullptr;  // sequence parallel: round counts, k E per rank
  MoeStats stats;
  Gpt<float>::ExpertExchange ep;
};

void GptStage::MoeDelete::operator()(Moe* m) const { delete m; }

void GptStage::moe_init() {
  const MoeConfig& mc = shape_.config.moe;
  if (cp_size_ > 1) {
    throw ConfigError(
        "--moe-experts with --cp: mixture-of-experts layers are not built for context parallelism (routing and "
        "capacity are per micro-batch, which cp splits); drop --cp or --moe-experts");
  }
  std::unique_ptr<Moe, MoeDelete> m(new Moe());
  const size_t C = shape_.config.channels, Ls = shape_.layers();
  m->E = mc.experts;
  m->k = mc.top_k;
  m->N = static_cast<size_t>(B_) * T_;
  m->cap = moe_capacity(mc, m->N);
  const size_t E = m->E, k = m->k, R = E * m->cap, NL = rows_;
  m->sizes = moe_sizes(shape_, m->N, NL, slots_);
  m->acts = DeviceBuffer<float>(*dev_, m->sizes.acts);
  m->scratch = DeviceBuffer<float>(*dev_, m->sizes.scratch);
  m->ints = AlignedBuffer<int32_t>(m->sizes.ints);
  m->aux = DeviceBuffer<float>(*dev_, E);
  const bool host = dev_->host_accessible();
  if (!host) {
    m->dints = DeviceBuffer<int32_t>(*dev_, static_cast<size_t>(slots_) * Ls * (2 * NL * k + R));
    m->probs_host.resize(NL * E);
    if (sp_) m->exchange = DeviceBuffer<int64_t>(*dev_, (shape_.tp_size + 1) * k * E);
  }
  int32_t* dq = m->dints.data();
  float* p = m->acts.data();
  int32_t* q = m->ints.data();
  auto take = [&p](size_t n) {
    float* r = p;
    p += n;
    return r;
  };
  auto take_i = [&q](size_t n) {
    int32_t* r = q;
    q += n;
    return r;
  };
  m->layer.resize(slots_);
  for (auto& slot : m->layer) {
    slot.resize(Ls);
    for (Moe::Layer& la : slot) {
      la.probs = take(NL * E);
      la.fch = take(R * 4 * C);
      la.fch_gelu = take(R * 4 * C);
      la.y = take(R * C);
      la.choice = take_i(NL * k);
      la.row = take_i(NL * k);
      la.count = take_i(E);
      la.token = take_i(R);
      la.rcount = take_i(E);
      if (host) {
        la.d_choice = la.choice;
        la.d_row = la.row;
        la.d_token = la.token;
      } else {
        la.d_choice = dq;
        la.d_row = dq + NL * k;
        la.d_token = dq + 2 * NL * k;
        dq += 2 * NL * k + R;
      }
    }
  }
  m->mine = take_i(k * E);
  m->all = take_i(shape_.tp_size * k * E);
  m->base = take_i(k * E);
  p = m->scratch.data();
  m->x = take(R * C);
  m->dx = take(R * C);
  m->dy = take(R * C);
  m->dh = take(R * 4 * C);
  m->dprobs = take(NL * E);
  if (p != m->scratch.data() + m->scratch.size() || q != m->ints.data() + m->ints.size()) {
    throw Error("GptStage: MoE layout does not add up (a bug)");
  }
  moe_ = std::move(m);
}

size_t GptStage::moe_bytes() const { return moe_ ? bytes_of(moe_->sizes) : 0; }

MoeStats GptStage::take_moe_stats() {
  if (!moe_) return {};
  const MoeStats s = moe_->stats;
  moe_->stats = MoeStats{};
  return s;
}

namespace {

// Local tensor i's offset in the stage's flat buffer (the 16 tensors, then the router).
struct LocalTensors {
  float *fcw, *fcb, *fcprojw, *fcprojb, *router;
};
LocalTensors local_tensors(float* flat, const std::array<size_t, kNumParamTensors>& sizes) {
  std::array<float*, kNumParamTensors + 1> t{};
  for (int i = 0; i < kNumParamTensors; ++i) {
    t[i] = flat;
    flat += sizes[i];
  }
  return {t[10], t[11], t[12], t[13], flat};
}

}  // namespace

void GptStage::moe_forward(size_t l, const LayerActs& a, float* out) {
  Kernels<float>& d = *dev_;
  Moe& m = *moe_;
  Moe::Layer& L = m.layer.at(cur_slot_)[l];
  const MoeConfig& mc = shape_.config.moe;
  const size_t C = shape_.config.channels, H = 4 * C, E = m.E, k = m.k, cap = m.cap, NL = rows_;
  const LocalTensors w = local_tensors(params_.data(), sizes_);
  const float* router = w.router + l * E * C;
  const bool host = d.host_accessible();
  // router: probs (NL,E) = softmax(ln2 @ router^T), top-k per token
  d.matmul_forward(L.probs, a.ln2, router, static_cast<const float*>(nullptr), NL, static_cast<int>(C),
                   static_cast<int>(E));
  d.moe_route(L.probs, L.d_choice, NL, E, k);
  // the routing decisions on the host (on the CPU in place)
  const float* probs = L.probs;
  if (!host) {
    d.to_host(L.choice, L.d_choice, NL * k * sizeof(int32_t));
    d.to_host(m.probs_host.data(), L.probs, NL * E * sizeof(float));
    probs = m.probs_host.data();
  }
  moe::Balance bal = moe::balance(probs, L.choice, NL, E, k);
  size_t dropped = 0;
  if (sp_) {
    // The whole micro-batch's dispatch order: every rank's round counts, then this rank's base in each queue.
    const int P = shape_.tp_size;
    moe::round_counts(L.choice, NL, k, E, m.mine);
    const auto t0 = std::chrono::steady_clock::now();
    moe_tp_all_gather(m.mine, m.all, k * E, comm::DType::kInt32);
    // the load-balancing sums over the tp ranks, in rank order (fp64 as int64 bit patterns)
    std::vector<int64_t> mine(E), all(E * P);
    std::memcpy(mine.data(), bal.psum.data(), E * sizeof(double));
    moe_tp_all_gather(mine.data(), all.data(), E, comm::DType::kInt64);
    tp_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    moe::dispatch_base(m.all, P, shape_.tp_rank, k, E, m.base);
    moe::dispatch(L.choice, NL, k, E, cap, m.base, L.row, L.count, L.token);
    bal.tokens = static_cast<double>(m.N);
    for (size_t e = 0; e < E; ++e) {
      double picked = 0, psum = 0;
      for (int r = 0; r < P; ++r) {
        for (size_t j = 0; j < k; ++j) picked += m.all[r * k * E + j * E + e];
        double v = 0;
        std::memcpy(&v, &all[r * E + e], sizeof v);
        psum += v;
      }
      bal.picked[e] = picked;
      bal.psum[e] = psum;
      dropped += picked > static_cast<double>(cap) ? static_cast<size_t>(picked) - cap : 0;  // kept: min(cap, picked)
    }
  } else {
    dropped = moe::dispatch(L.choice, NL, k, E, cap, nullptr, L.row, L.count, L.token);
  }
  if (!host) {
    d.to_device(L.d_row, L.row, NL * k * sizeof(int32_t));
    d.to_device(L.d_token, L.token, E * cap * sizeof(int32_t));
  }
  L.f = moe::choice_shares(bal, k);
  // experts: gather the rows, fc -> gelu -> fcproj on (count, C)
  for (size_t e = 0; e < E; ++e) {
    const size_t n = L.count[e], le = l * E + e;
    if (n == 0) continue;
    float* xe = m.x + e * cap * C;
    d.moe_gather_rows(xe, a.ln2, L.d_token + e * cap, n, C);
    if (m.ep.size > 1) continue;  // the expert runs on its rank: moe_experts_forward_ep below (host only)
    d.matmul_gelu_forward(L.fch_gelu + e * cap * H, L.fch + e * cap * H, xe, w.fcw + le * H * C, w.fcb + le * H, n,
                          static_cast<int>(C), static_cast<int>(H));
    d.matmul_forward(L.y + e * cap * C, L.fch_gelu + e * cap * H, w.fcprojw + le * C * H, w.fcprojb + le * C, n,
                     static_cast<int>(H), static_cast<int>(C));
  }
  if (m.ep.size > 1) moe_experts_forward_ep(l);
  d.moe_combine(out, L.probs, L.d_choice, L.d_row, L.y, NL, E, k, C);
  if (recomputing_) return;
  const double aux = moe::aux_loss(bal, mc);
  moe_aux_ += aux;
  m.stats.aux_loss += aux;
  m.stats.assignments += m.N * k;
  m.stats.dropped += dropped;
  if (!sp_) m.stats.tokens_dropped += moe::tokens_dropped(L.row, NL, k);  // not summed over tp with sp
}

void GptStage::moe_tp_all_gather(const void* mine, void* all, size_t n, comm::DType t) {
  if (dev_->host_accessible()) {
    tp_->all_gather(mine, all, n, t);
    return;
  }
  // The tp communicator takes device memory (NCCL): through the exchange buffer, n <= k E elements of <= 8 bytes.
  Moe& m = *moe_;
  const size_t bytes = n * comm::dtype_size(t), P = shape_.tp_size;
  int64_t* in = m.exchange.data();
  int64_t* out = in + m.k * m.E;
  dev_->to_device(in, mine, bytes);
  dev_->synchronize();
  tp_->all_gather(in, out, n, t);
  dev_->to_host(all, out, P * bytes);
}

void GptStage::moe_backward(size_t l, const LayerActs& a, const float* dout, float* dx, const GradReadyHook* ready) {
  Kernels<float>& d = *dev_;
  Moe& m = *moe_;
  const Moe::Layer& L = m.layer.at(cur_slot_)[l];
  const size_t C = shape_.config.channels, H = 4 * C, E = m.E, k = m.k, cap = m.cap, NL = rows_;
  const LocalTensors w = local_tensors(params_.data(), sizes_);
  const LocalTensors g = local_tensors(grads_.data(), sizes_);
  // d router logits: the gates and the load-balancing loss (global shares and token count), through the softmax
  const std::vector<float> aux = moe::aux_grads<float>(L.f, static_cast<double>(m.N), shape_.config.moe);
  d.to_device(m.aux.data(), aux.data(), E * sizeof(float));
  d.moe_router_backward(m.dprobs, L.probs, L.d_choice, L.d_row, L.y, dout, m.aux.data(), dloss_, NL, E, k, C);
  // experts: dy[row] = gate * dout[token]; fcproj, gelu, fc backward on the expert's rows
  if (m.ep.size > 1) moe_experts_backward_ep(l, a, dout);
  for (size_t e = 0; e < (m.ep.size > 1 ? 0 : E); ++e) {
    const size_t n = L.count[e], le = l * E + e;
    if (n == 0) continue;
    float* xe = m.x + e * cap * C;
    float* dy = m.dy + e * cap * C;
    d.moe_gather_rows(xe, a.ln2, L.d_token + e * cap, n, C);
    d.moe_gate_rows(dy, dout, L.probs, L.d_token + e * cap, e, E, n, C);
    float* dh = m.dh + e * cap * H;
    // the experts' weight gradients accumulate over the micro-batches and the routed rows
    d.matmul_backward(dh, false, g.fcprojw + le * C * H, g.fcprojb + le * C, dy, L.fch_gelu + e * cap * H,
                      w.fcprojw + le * C * H, n, static_cast<int>(H), static_cast<int>(C), true);  // d fch_gelu (n,4C)
    d.gelu_backward(dh, L.fch + e * cap * H, dh, n * H);                                           // d fch (n,4C)
    d.matmul_backward(m.dx + e * cap * C, false, g.fcw + le * H * C, g.fcb + le * H, dh, xe, w.fcw + le * H * C, n,
                      static_cast<int>(C), static_cast<int>(H), true);  // d x_e (n,C)
  }
  // dx = the kept choices' input gradients, + the router's dz @ router
  d.moe_combine_input_grads(dx, L.d_row, m.dx, NL, k, C);
  d.matmul_backward(dx, true, g.router + l * E * C, static_cast<float*>(nullptr), m.dprobs, a.ln2, w.router + l * E * C,
                    NL, static_cast<int>(C), static_cast<int>(E), true);
  if (!sp_ && ready != nullptr) (*ready)(static_cast<size_t>(g.router - grads_.data()) + l * E * C, E * C);
}

void GptStage::set_expert_exchange(Gpt<float>::ExpertExchange x) {
  const int E = shape_.config.moe.experts;
  if (!moe_) throw ConfigError("expert parallelism (--ep) needs a mixture-of-experts model: add --moe-experts E");
  if (x.size < 1 || x.rank < 0 || x.rank >= x.size || E % x.size != 0 || (x.size > 1 && !x.all_to_all)) {
    throw ConfigError("--ep " + std::to_string(x.size) + ": needs --moe-experts divisible by it (the model has " +
                      std::to_string(E) + " experts per layer)");
  }
  if (x.size > 1 && !dev_->host_accessible()) {
    // The stage's exchange and its experts' loops read the dispatched rows on the host (Gpt's run on the device).
    throw ConfigError(std::string("--ep ") + std::to_string(x.size) +
                      " with --tp/--pp/--cp and spec.device / --device " + device_name(dev_->kind()) +
                      ": expert parallelism inside a tensor/pipeline stage runs on the CPU only so far: use --device "
                      "cpu, drop --tp/--pp/--cp (plain data parallelism runs --ep on the device), or --ep 1");
  }
  if (x.return_expert_grads) {
    throw ConfigError(
        "--ep with --deterministic and --tp/--pp: the stage path does not return expert gradients to their tokens' "
        "ranks (the deterministic tree needs it); drop --deterministic or --ep");
  }
  moe_->ep = std::move(x);
}

// As Gpt<T>::moe_experts_forward_ep (worker/model/gpt_expert_parallel.cc): the gathered rows (m.x, routing order
// e * cap + i) go to their expert's rank, which runs them in received order ((s * E/P + j) * cap + i; hidden rows kept
// in the slot's fch, fch_gelu), and the outputs come back into the slot's y in routing order.
void GptStage::moe_experts_forward_ep(size_t l) {
  using namespace cpu;
  Moe& m = *moe_;
  Moe::Layer& L = m.layer.at(cur_slot_)[l];
  const size_t C = shape_.config.channels, H = 4 * C, E = m.E, cap = m.cap, P = m.ep.size, El = E / P;
  const LocalTensors w = local_tensors(params_.data(), sizes_);
  m.ep.all_to_all(L.count, L.rcount, El * sizeof(int32_t));
  m.ep.all_to_all(m.x, m.dx, El * cap * C * sizeof(float));  // dispatch: m.dx in received order
  for (size_t s = 0; s < P; ++s) {
    for (size_t j = 0; j < El; ++j) {
      const size_t n = L.rcount[s * El + j], base = (s * El + j) * cap, le = l * E + m.ep.rank * El + j;
      if (n == 0) continue;
      matmul_forward(pool_, L.fch + base * H, m.dx + base * C, w.fcw + le * H * C, w.fcb + le * H, n,
                     static_cast<int>(C), static_cast<int>(H));
      gelu_forward(pool_, L.fch_gelu + base * H, L.fch + base * H, n * H);
      matmul_forward(pool_, m.dy + base * C, L.fch_gelu + base * H, w.fcprojw + le * C * H, w.fcprojb + le * C, n,
                     static_cast<int>(H), static_cast<int>(C));
    }
  }
  m.ep.all_to_all(m.dy, L.y, El * cap * C * sizeof(float));  // combine: outputs back in routing order
}

// The inputs again and dy = gate * dout (routing order) to the experts' ranks, their backward in received order
// (weight gradients into this rank's experts), the input gradients back into m.dx in routing order.
void GptStage::moe_experts_backward_ep(size_t l, const LayerActs& a, const float* dout) {
  using namespace cpu;
  Moe& m = *moe_;
  const Moe::Layer& L = m.layer.at(cur_slot_)[l];
  const size_t C = shape_.config.channels, H = 4 * C, E = m.E, cap = m.cap, P = m.ep.size, El = E / P;
  const LocalTensors w = local_tensors(params_.data(), sizes_);
  const LocalTensors g = local_tensors(grads_.data(), sizes_);
  const size_t bytes = El * cap * C * sizeof(float);
  for (size_t pass = 0; pass < 2; ++pass) {
    for (size_t e = 0; e < E; ++e) {
      pool_.parallel_for(L.count[e], [&](size_t i0, size_t i1) {
        for (size_t i = i0; i < i1; ++i) {
          const size_t t = L.token[e * cap + i];
          float* row = m.x + (e * cap + i) * C;
          if (pass == 0) {
            std::memcpy(row, a.ln2 + t * C, C * sizeof(float));
          } else {
            const float gate = L.probs[t * E + e];
            for (size_t c = 0; c < C; ++c) row[c] = gate * dout[t * C + c];
          }
        }
      });
    }
    m.ep.all_to_all(m.x, pass == 0 ? m.dx : m.dy, bytes);
  }
  for (size_t s = 0; s < P; ++s) {
    for (size_t j = 0; j < El; ++j) {
      const size_t n = L.rcount[s * El + j], base = (s * El + j) * cap, le = l * E + m.ep.rank * El + j;
      if (n == 0) continue;
      float* dh = m.dh + base * H;
      matmul_backward(pool_, dh, false, g.fcprojw + le * C * H, g.fcprojb + le * C, m.dy + base * C,
                      L.fch_gelu + base * H, w.fcprojw + le * C * H, n, static_cast<int>(H), static_cast<int>(C));
      gelu_backward(pool_, dh, L.fch + base * H, dh, n * H);
      matmul_backward(pool_, m.x + base * C, false, g.fcw + le * H * C, g.fcb + le * H, dh, m.dx + base * C,
                      w.fcw + le * H * C, n, static_cast<int>(C), static_cast<int>(H));
    }
  }
  m.ep.all_to_all(m.x, m.dx, bytes);  // input gradients back in routing order
}

void GptStage::finish_moe_grads(const GradReadyHook* ready) {
  if (!moe_ || !sp_) return;
  // The experts (fcw, fcb, fcprojw, fcprojb: adjacent local tensors) and the router (after lnfb): each rank's
  // gradients are of its own rows; their sum over tp is the micro-batches' gradient, then identical everywhere.
  const LocalTensors g = local_tensors(grads_.data(), sizes_);
  const size_t experts = sizes_[10] + sizes_[11] + sizes_[12] + sizes_[13], router = local_router_size(shape_);
  all_reduce(g.fcw, experts, comm::ReduceOp::kSum);
  all_reduce(g.router, router, comm::ReduceOp::kSum);
  if (ready != nullptr) {
    (*ready)(static_cast<size_t>(g.fcw - grads_.data()), experts);
    (*ready)(static_cast<size_t>(g.router - grads_.data()), router);
  }
}

}  // namespace railyard::worker::parallel
