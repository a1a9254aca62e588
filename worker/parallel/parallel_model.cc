#include "worker/parallel/parallel_model.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

#include "common/error.h"

namespace railyard::worker::parallel {

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

int size_of(const comm::Communicator* c) { return c == nullptr ? 1 : c->size(); }
int rank_of(const comm::Communicator* c) { return c == nullptr ? 0 : c->rank(); }

// Distinct tags per (call, micro-batch, direction), so a late message can never match another one.
uint32_t tag(uint32_t step, int m, int dir) {
  return ((step & 0x3fffu) << 18) | (static_cast<uint32_t>(m) << 1) | static_cast<uint32_t>(dir);
}

}  // namespace

ParallelModel::ParallelModel(const GptConfig& config, int B, int seq_len, int max_micro_batches, ThreadPool& pool,
                             const ModelGroups& groups, const std::vector<int>& boundaries,
                             const RecomputeSpec& recompute, bool sequence_parallel, Kernels<float>* device)
    : config_(config), B_(B), T_(seq_len), max_m_(max_micro_batches), pool_(pool), groups_(groups) {
  if (max_micro_batches < 1 || max_micro_batches >= (1 << 17)) {
    throw ConfigError("micro-batches per step must be in 1..131071, got " + std::to_string(max_micro_batches));
  }
  const int pp = size_of(groups.pp), stage = rank_of(groups.pp);
  const StageShape shape =
      make_stage_shape(config, seq_len, size_of(groups.tp), rank_of(groups.tp), pp, stage, boundaries);
  const int slots = std::min(max_micro_batches, pp - stage);
  stage_ = std::make_unique<GptStage>(shape, B, seq_len, slots, pool, groups.tp, recompute, sequence_parallel,
                                      groups.cp, device);
  count_once_ = count_once_ranges(stage_->shard_map(), shape.tp_rank);
  send_fwd_.resize(slots);
  send_bwd_.resize(slots);
  if (pp > 1 && (shape.first() || shape.last()) && (groups.embedding == nullptr || groups.embedding->size() != 2)) {
    throw ConfigError("pipeline degree " + std::to_string(pp) +
                      " needs the embedding group (first and last stage, 2 ranks) on stage " + std::to_string(stage));
  }
}

void ParallelModel::init_weights(uint64_t seed) {
  AlignedBuffer<float> full(num_parameters(config_));
  init_gpt2_weights(full.data(), config_, seed, &pool_);
  stage_->scatter_from_full(full.data());
}

void ParallelModel::wait(std::unique_ptr<comm::Request>& r, double* waited) {
  if (!r) return;
  const auto t0 = Clock::now();
  r->wait();
  r.reset();
  *waited += since(t0);
}

double ParallelModel::forward_backward(int M, const std::function<void(int32_t*, int32_t*)>& next_micro_batch,
                                       float dloss, StepTimes* times) {
  return run(M, next_micro_batch, dloss, true, times);
}

double ParallelModel::evaluate(int M, const std::function<void(int32_t*, int32_t*)>& next_micro_batch,
                               StepTimes* times) {
  if (M < 1) throw ConfigError("validation needs at least 1 batch, got " + std::to_string(M));
  // Validation asks for --val-steps batches, often more than a training step's micro-batches, which sized the
  // model's buffers: run them in rounds of at most max_m_, weighting each round's mean by its batches.
  double sum = 0;
  for (int done = 0; done < M;) {
    const int m = std::min(max_m_, M - done);
    sum += run(m, next_micro_batch, 0.0f, false, times) * m;
    done += m;
  }
  return sum / M;
}

double ParallelModel::run(int M, const std::function<void(int32_t*, int32_t*)>& next, float dloss, bool backward,
                          StepTimes* times) {
  if (M < 1 || M > max_m_) {
    throw ConfigError("micro-batches M=" + std::to_string(M) + " must be in 1.." + std::to_string(max_m_) +
                      " (the model was built for at most that many)");
  }
  const auto t_start = Clock::now();
  const size_t N = static_cast<size_t>(B_) * T_, C = config_.channels;
  load_batch(M, N, next);

  GptStage& st = *stage_;
  const StageShape& sh = st.shape();
  const int P = sh.pp_size, s = sh.pp_rank, K = st.slots();
  comm::Communicator* pp = groups_.pp;
  const uint32_t step = step_++;
  const size_t R = st.rows() * C;  // what crosses a stage boundary: the residual stream's rows held here
  double waited = 0, loss_sum = 0;
  st.take_tp_comm_seconds();
  st.take_moe_stats();

  auto fwd = [&](int m) {
    const int k = m % K;
    wait(send_fwd_[k], &waited);  // the slot's previous output has left
    if (!sh.first()) {
      auto r = pp->irecv(st.input(k), R, comm::DType::kFloat32, s - 1, tag(step, m, 0));
      wait(r, &waited);
    }
    const int32_t* in = batch_.data() + m * 2 * N;
    loss_sum += st.forward(k, in, in + N, dloss);
    st.device().synchronize();  // the message is read on the communicator's stream (a no-op on the CPU)
    if (!sh.last()) send_fwd_[k] = pp->isend(st.output(k), R, comm::DType::kFloat32, s + 1, tag(step, m, 0));
  };
  auto bwd = [&](int m) {
    const int k = m % K;
    if (!sh.last()) {
      auto r = pp->irecv(st.grad_output(), R, comm::DType::kFloat32, s + 1, tag(step, m, 1));
      wait(r, &waited);
    }
    wait(send_bwd_[k], &waited);                               // the slot's previous d(input) has left
    st.backward(k, ready_ && m == M - 1 ? &ready_ : nullptr);  // 1F1B ends every stage with micro-batch M-1
    st.device().synchronize();
    if (!sh.first()) send_bwd_[k] = pp->isend(st.grad_input(k), R, comm::DType::kFloat32, s - 1, tag(step, m, 1));
  };

  if (backward) {
    // 1F1B: stage s runs P-s-1 warm-up forwards, then alternates one forward and one backward, then drains the
    // remaining backwards. At most P-s micro-batches are in flight here, hence K = min(M, P-s) activation slots.
    const int warmup = std::min(P - s - 1, M);
    for (int m = 0; m < warmup; ++m) fwd(m);
    for (int i = 0; i < M - warmup; ++i) {
      fwd(warmup + i);
      bwd(i);
    }
    for (int i = M - warmup; i < M; ++i) bwd(i);
  } else {
    for (int m = 0; m < M; ++m) fwd(m);  // slot reuse waits for the previous send of that slot
  }
  for (auto& r : send_fwd_) wait(r, &waited);
  for (auto& r : send_bwd_) wait(r, &waited);

  double loss = pipeline_loss(loss_sum / M, backward, &waited);
  if (st.cp_size() > 1) loss = mean_over_cp(loss, &waited);
  if (times != nullptr) {
    const double tp = st.take_tp_comm_seconds();
    times->tp_comm += tp;
    times->pp_wait += waited;
    times->compute += std::max(0.0, since(t_start) - tp - waited);
  }
  return loss;
}

void ParallelModel::load_batch(int M, size_t N, const std::function<void(int32_t*, int32_t*)>& next) {
  batch_.resize(static_cast<size_t>(M) * 2 * N);
  for (int m = 0; m < M; ++m) next(batch_.data() + m * 2 * N, batch_.data() + m * 2 * N + N);
  // Every rank checks every token (all hold the batch), so bad data fails all ranks alike instead of one stage
  // throwing while its peers wait for it until the deadline.
  const int V = config_.vocab_size;
  for (size_t i = 0; i < batch_.size(); ++i) {
    if (batch_[i] < 0 || batch_[i] >= V) {
      const size_t m = i / (2 * N), within = i % (2 * N);
      throw Error(std::string("micro-batch ") + std::to_string(m) + ": " + (within < N ? "input" : "target") +
                  " token " + std::to_string(batch_[i]) + " at position " + std::to_string(within % N) +
                  " is outside the vocabulary [0, " + std::to_string(V) +
                  "): the data was tokenized for another vocabulary");
    }
  }
}

double ParallelModel::pipeline_loss(double loss, bool backward, double* waited) {
  GptStage& st = *stage_;
  const int P = st.shape().pp_size;
  const bool moe = config_.moe.experts > 0;
  if (moe) {
    // Every stage's forward returned its layers' load-balancing loss (the last one also the cross entropy): the
    // objective is their sum over stages, and so are the statistics (rank order, the same bits on every stage).
    const MoeStats ms = st.take_moe_stats();
    const std::vector<double> sums =
        sum_over_pp({loss, ms.aux_loss, static_cast<double>(ms.assignments), static_cast<double>(ms.dropped)}, waited);
    loss = sums[0];
    if (backward) {
      moe_stats_.aux_loss = sums[1];
      moe_stats_.assignments = static_cast<size_t>(sums[2]);
      moe_stats_.dropped = static_cast<size_t>(sums[3]);
    }
  } else if (P > 1) {
    // the mean loss lives on the last stage (identical on its tp ranks); 8 bytes broadcast as one int64
    const auto t0 = Clock::now();
    int64_t bits = 0;
    std::memcpy(&bits, &loss, sizeof bits);
    groups_.pp->broadcast(&bits, 1, comm::DType::kInt64, P - 1);
    std::memcpy(&loss, &bits, sizeof bits);
    *waited += since(t0);
  }
  return loss;
}

double ParallelModel::mean_over_cp(double loss, double* waited) {
  // each cp rank's loss is the mean over its positions (equally many): the sequence's mean is their mean, summed
  // in rank order so every rank has the same bits
  const int cp = stage_->cp_size();
  const auto t0 = Clock::now();
  int64_t bits = 0;
  std::memcpy(&bits, &loss, sizeof bits);
  std::vector<int64_t> all(static_cast<size_t>(cp));
  groups_.cp->all_gather(&bits, all.data(), 1, comm::DType::kInt64);
  double sum = 0;
  for (int64_t b : all) {
    double v = 0;
    std::memcpy(&v, &b, sizeof v);
    sum += v;
  }
  loss = sum / cp;
  *waited += since(t0);
  return loss;
}

std::vector<double> ParallelModel::sum_over_pp(const std::vector<double>& local, double* waited) {
  comm::Communicator* pp = groups_.pp;
  if (pp == nullptr || pp->size() == 1) return local;
  const auto t0 = Clock::now();
  const size_t n = local.size();
  std::vector<int64_t> mine(n), all(n * pp->size());
  std::memcpy(mine.data(), local.data(), n * sizeof(double));
  pp->all_gather(mine.data(), all.data(), n, comm::DType::kInt64);
  std::vector<double> out(n, 0.0);
  for (int r = 0; r < pp->size(); ++r) {
    for (size_t i = 0; i < n; ++i) {
      double v = 0;
      std::memcpy(&v, &all[r * n + i], sizeof v);
      out[i] += v;
    }
  }
  *waited += since(t0);
  return out;
}

void ParallelModel::finish_grads(StepTimes* times) {
  stage_->finish_moe_grads(ready_ ? &ready_ : nullptr);  // sequence parallel experts: summed over tp
  const StageShape& sh = stage_->shape();
  if (sh.pp_size == 1 || !(sh.first() || sh.last())) return;
  const auto t0 = Clock::now();
  // wte is the first local tensor on both stages
  const size_t n = static_cast<size_t>(sh.local_vocab()) * sh.config.channels;
  stage_->device().synchronize();
  groups_.embedding->all_reduce(stage_->grads(), n, comm::DType::kFloat32, comm::ReduceOp::kSum);
  if (times != nullptr) times->pp_wait += since(t0);
  if (ready_) ready_(0, n);
}

double ParallelModel::sum_squares_once(const float* buf) {
  double local = 0;
  Kernels<float>& dev = stage_->device();
  for (const ElementRange& r : count_once_) {
    if (!dev.host_accessible()) {
      const double norm = dev.global_norm(buf + r.begin, r.end - r.begin);
      local += norm * norm;
      continue;
    }
    for (size_t i = r.begin; i < r.end; ++i) local += static_cast<double>(buf[i]) * buf[i];
  }
  // Communicator has no fp64: the doubles travel as int64 bit patterns and are summed here in rank order.
  auto sum_over = [](comm::Communicator* g, double x) {
    if (g == nullptr || g->size() == 1) return x;
    int64_t bits = 0;
    std::memcpy(&bits, &x, sizeof bits);
    std::vector<int64_t> all(g->size());
    g->all_gather(&bits, all.data(), 1, comm::DType::kInt64);
    double sum = 0;
    for (int64_t b : all) {
      double v = 0;
      std::memcpy(&v, &b, sizeof v);
      sum += v;
    }
    return sum;
  };
  return sum_over(groups_.pp, sum_over(groups_.tp, local));
}

std::string ParallelModel::describe() const {
  const StageShape& sh = stage_->shape();
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "stage %d/%d layers [%d,%d) tp %d/%d (heads %d-%d, vocab rows %d-%d): %.2fM params, activations %.1f "
                "MiB in %d slot(s)%s",
                sh.pp_rank, sh.pp_size, sh.layer_begin, sh.layer_end, sh.tp_rank, sh.tp_size,
                sh.tp_rank * sh.local_heads(), (sh.tp_rank + 1) * sh.local_heads() - 1, sh.vocab_begin(),
                sh.vocab_begin() + sh.local_vocab() - 1, stage_->num_params() / 1e6,
                stage_->activation_bytes() / (1024.0 * 1024.0), stage_->slots(),
                stage_->sequence_parallel() ? ", sequence parallel" : "");
  return buf;
}

}  // namespace railyard::worker::parallel
