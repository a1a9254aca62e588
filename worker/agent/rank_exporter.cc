#include "worker/agent/rank_exporter.h"

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <regex>

#include "common/error.h"
#include "common/metrics/names.h"
#include "common/rendezvous_protocol.h"

namespace railyard::worker {

std::optional<ProgressRecord> parse_progress(const std::string& text) {
  // Python's json.dump writes a NaN or infinite float as a bare NaN / Infinity / -Infinity, which JSON lacks: read
  // them as strings first (outside strings only; the record has no string values of its own).
  static const std::regex bare(R"((-?Infinity|NaN)(?=\s*[,}\]]))");
  nlohmann::json j = nlohmann::json::parse(std::regex_replace(text, bare, "\"$1\""), nullptr, false);
  if (!j.is_object() || !j.contains("step") || !j["step"].is_number_integer()) return std::nullopt;
  ProgressRecord r;
  r.step = j["step"].get<int64_t>();
  if (j.contains("loss")) {
    const auto& l = j["loss"];
    constexpr double inf = std::numeric_limits<double>::infinity();
    if (l.is_number()) {
      r.has_loss = true;
      r.loss = l.get<double>();
    } else if (l.is_null() || l == "NaN") {
      r.has_loss = true;
      r.loss = std::numeric_limits<double>::quiet_NaN();
    } else if (l == "Infinity" || l == "-Infinity") {
      r.has_loss = true;
      r.loss = l == "Infinity" ? inf : -inf;
    }
  }
  if (j.contains("tokens_per_second") && j["tokens_per_second"].is_number())
    r.tokens_per_second = j["tokens_per_second"].get<double>();
  if (j.contains("compute_seconds") && j["compute_seconds"].is_number() && j["compute_seconds"].get<double>() >= 0)
    r.compute_seconds = j["compute_seconds"].get<double>();
  // Seconds a job's ledger can use: finite, not negative, below the protocol's bound (else left out, not fatal).
  auto seconds = [&j](const char* key) -> std::optional<double> {
    if (!j.contains(key) || !j[key].is_number()) return std::nullopt;
    const double v = j[key].get<double>();
    if (!std::isfinite(v) || v < 0 || v > rdzv::kMaxReportedSeconds) return std::nullopt;
    return v;
  };
  r.checkpoint_stall_seconds = seconds("checkpoint_stall_seconds");
  r.restore_seconds = seconds("restore_seconds");
  if (j.contains("paused") && j["paused"].is_boolean()) r.paused = j["paused"].get<bool>();
  return r;
}

// One local rank: its registry and endpoint (for the agent's lifetime) and its series (for one generation).
struct RankExporter::Rank {
  metrics::Registry registry;
  metrics::Family<metrics::Gauge>& step_f =
      registry.gauge(metrics::names::kWorkerStep, "Last completed training step.");
  metrics::Family<metrics::Counter>& steps_total_f =
      registry.counter(metrics::names::kWorkerStepsTotal, "Steps this rank reported in this generation.");
  metrics::Family<metrics::Gauge>& last_step_ts_f =
      registry.gauge(metrics::names::kWorkerLastStepTimestamp, "When the last step's progress record was written.");
  // A histogram, as the trainer serves it (common/metrics/names.h): the rules read its _sum and _count.
  metrics::Family<metrics::Histogram>& duration_f = registry.histogram(
      metrics::names::kWorkerStepDuration, "Wall time per step, from the times of the rank's progress records.",
      metrics::names::worker_step_duration_buckets());
  metrics::Family<metrics::Gauge>& loss_f =
      registry.gauge(metrics::names::kWorkerLoss, "Training loss of the last step (NaN when non-finite).");
  metrics::Family<metrics::Gauge>& tps_f =
      registry.gauge(metrics::names::kWorkerTokensPerSecond, "Training throughput of the last step.");
  metrics::Family<metrics::Counter>& nonfinite_f =
      registry.counter(metrics::names::kWorkerNonfiniteTotal, "Progress records with a non-finite loss.");
  metrics::Family<metrics::Counter>& phase_f = registry.counter(
      metrics::names::kWorkerStepPhaseSecondsTotal, "Seconds per phase; compute: the program's compute_seconds.");
  metrics::Family<metrics::Gauge>& stopped_f =
      registry.gauge(metrics::names::kWorkerProcessStoppedSince,
                     "When the rank's process was first seen stopped (SIGSTOP, a debugger); 0 while it runs.");
  metrics::Family<metrics::Gauge>& idle_f = registry.gauge(
      metrics::names::kWorkerCpuIdleSince, "Since when the rank's process has used no CPU time; 0 while it computes.");
  metrics::Family<metrics::Gauge>& output_f =
      registry.gauge(metrics::names::kWorkerLastOutputTimestamp,
                     "When the rank last wrote to its stdout or stderr (its start, before it wrote).");
  std::unique_ptr<metrics::Exposer> exposer;

  metrics::Labels labels;  // this generation's; empty before the first
  metrics::Gauge* output = nullptr;
  metrics::Gauge* stopped = nullptr;
  metrics::Gauge* idle = nullptr;
  double cpu_prev = -1;       // the process's CPU seconds at the previous sample (-1: none yet)
  double cpu_sampled_at = 0;  // when
  double cpu_busy_at = 0;     // the last sample at which it had advanced (or the first sample)
  bool stepped = false;       // the step series exist (a first record arrived in this generation)
  int64_t prev_step = 0;
  double prev_written = 0;
  double prev_compute = 0;

  void clear() {
    if (labels.empty()) return;
    step_f.remove_matching(labels);
    steps_total_f.remove_matching(labels);
    last_step_ts_f.remove_matching(labels);
    duration_f.remove_matching(labels);
    loss_f.remove_matching(labels);
    tps_f.remove_matching(labels);
    nonfinite_f.remove_matching(labels);
    phase_f.remove_matching(labels);
    output_f.remove_matching(labels);
    stopped_f.remove_matching(labels);
    idle_f.remove_matching(labels);
    output = nullptr;
    stopped = nullptr;
    idle = nullptr;
    cpu_prev = -1;
    stepped = false;
  }
};

RankExporter::RankExporter(const std::string& pod_ip, int base_port, int local_ranks, const metrics::Labels& labels)
    : labels_(labels) {
  for (int l = 0; l < local_ranks; ++l) {
    auto r = std::make_unique<Rank>();
    const int port = base_port + l;
    try {
      r->exposer = std::make_unique<metrics::Exposer>(r->registry, pod_ip, port);
    } catch (const std::exception& e) {
      throw Error("agent: cannot serve local rank " + std::to_string(l) + "'s metrics on " + pod_ip + ":" +
                  std::to_string(port) + " (RAILYARD_METRICS_PORT + local rank): " + e.what() +
                  "; the program must not listen there");
    }
    ranks_.push_back(std::move(r));
  }
}

RankExporter::~RankExporter() = default;

int RankExporter::port(int local_rank) const { return ranks_.at(local_rank)->exposer->port(); }

void RankExporter::start_generation(int64_t generation, const std::vector<int>& global_ranks, double now) {
  for (size_t l = 0; l < ranks_.size(); ++l) {
    Rank& r = *ranks_[l];
    r.clear();
    if (l >= global_ranks.size()) {
      r.labels.clear();
      continue;
    }
    r.labels = labels_;
    r.labels["rank"] = std::to_string(global_ranks[l]);
    r.labels["generation"] = std::to_string(generation);
    r.output = &r.output_f.add(r.labels);
    r.output->set(now);
    r.stopped = &r.stopped_f.add(r.labels);
    r.stopped->set(0);
    r.idle = &r.idle_f.add(r.labels);
    r.idle->set(0);
  }
}

void RankExporter::on_progress(int local_rank, const ProgressRecord& p, double written) {
  Rank& r = *ranks_.at(local_rank);
  if (r.labels.empty()) return;
  const bool first = !r.stepped;
  r.stepped = true;
  auto& steps_total = r.steps_total_f.add(r.labels);
  if (!first && p.step > r.prev_step) {
    steps_total.increment(static_cast<double>(p.step - r.prev_step));
    // A record may cover several steps (a program writes its progress at most every so often): their mean, once
    // per step, keeps _sum/_count the true mean step time.
    if (written > r.prev_written) {
      const auto steps = static_cast<uint64_t>(p.step - r.prev_step);
      r.duration_f.add(r.labels).observe((written - r.prev_written) / static_cast<double>(steps), steps);
    }
  }
  r.step_f.add(r.labels).set(static_cast<double>(p.step));
  r.last_step_ts_f.add(r.labels).set(written);
  auto& nonfinite = r.nonfinite_f.add(r.labels);
  if (p.has_loss) {
    r.loss_f.add(r.labels).set(p.loss);
    if (!std::isfinite(p.loss)) nonfinite.increment();
  }
  if (p.tokens_per_second > 0) r.tps_f.add(r.labels).set(p.tokens_per_second);
  if (p.compute_seconds) {
    metrics::Labels l = r.labels;
    l["phase"] = "compute";
    auto& compute = r.phase_f.add(l);
    // Cumulative in the program; a smaller value is a restarted count (the generation's first record) and starts over.
    if (!first && *p.compute_seconds >= r.prev_compute) compute.increment(*p.compute_seconds - r.prev_compute);
    r.prev_compute = *p.compute_seconds;
  }
  r.prev_step = p.step;
  r.prev_written = written;
}

void RankExporter::on_process_state(int local_rank, bool stopped, double now) {
  Rank& r = *ranks_.at(local_rank);
  if (r.stopped == nullptr) return;
  if (!stopped)
    r.stopped->set(0);
  else if (r.stopped->value() == 0)
    r.stopped->set(now);  // the first sight; later polls keep it
}

void RankExporter::on_process_cpu(int local_rank, double cpu_seconds, double now) {
  Rank& r = *ranks_.at(local_rank);
  if (r.idle == nullptr) return;
  if (cpu_seconds < 0) {  // the process is gone
    r.cpu_prev = -1;
    r.idle->set(0);
    return;
  }
  // A new process (a restart in place) starts over; so does a sample after a long gap (the agent was busy elsewhere).
  if (r.cpu_prev < 0 || cpu_seconds < r.cpu_prev) {
    r.cpu_prev = cpu_seconds;
    r.cpu_sampled_at = r.cpu_busy_at = now;
    r.idle->set(0);
    return;
  }
  const double wall = now - r.cpu_sampled_at;
  if (wall <= 0) return;
  // Less than 1 % of one core over the interval: a process blocked in a receive, a lock or a sleep uses none; one
  // that computes or spins (a busy-wait, a GPU synchronisation by default) uses far more.
  if (cpu_seconds - r.cpu_prev > 0.01 * wall) {
    r.cpu_busy_at = now;
    r.idle->set(0);
  } else {
    r.idle->set(r.cpu_busy_at);
  }
  r.cpu_prev = cpu_seconds;
  r.cpu_sampled_at = now;
}

void RankExporter::on_output(int local_rank, double when) {
  Rank& r = *ranks_.at(local_rank);
  if (r.output != nullptr && when > r.output->value()) r.output->set(when);
}

}  // namespace railyard::worker
