// railyard plan: the planner's front end (planner), and `plan --calibrate`, which measures this machine's
// CPU kernels into a calibration file. docs/planner.md.
#include <sys/utsname.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cli/cli.h"
#include "common/atomic_file.h"
#include "common/error.h"
#include "common/model_presets.h"
#include "planner/calibration.h"
#include "planner/cost_model.h"
#include "planner/hetero.h"
#include "planner/moe_cost.h"
#include "planner/search.h"
#include "worker/comm/local_world.h"
#include "worker/kernels/cpu/kernels.h"
#include "worker/kernels/cpu/thread_pool.h"
#include "worker/model/gpt_config.h"
#include "worker/train/perf.h"

namespace railyard::cli {

namespace {

constexpr const char* kPlanUsage =
    R"(usage: railyard plan (--model NAME | --layers L --hidden H --heads A --seq S --vocab V)
                     --global-batch B [--gpus N] [--gpu TYPE|FILE] [--topology FILE] [--tokens T]
                     [--top N] [--json] [--tp N] [--pp N] [--dp N] [--micro-batch N] [--zero 0-3]
                     [--recompute none|selective|full] [--sp on|off] [--interleave V] [--dropout on|off]
                     [--offload on|off]
                     [--moe-experts E [--moe-top-k K] [--moe-capacity-factor F] --ep N]
       railyard plan ... --mixed TYPE:GPUS,TYPE:GPUS [--tp N] [--pp N] ...
       railyard plan --calibrate [--output FILE] [--threads N] [--clock cpu|wall]

Ranks the data/tensor/pipeline layouts that fit in memory by predicted step time and prints the best --top (5)
with the memory and time breakdown, tokens/s, TFLOP/s per GPU, MFU and days to the --tokens budget.
  --model        a preset: gpt3-175b, gpt3-13b, gpt3-6.7b, gpt3-2.7b, gpt3-1.3b, or one of the worker's presets
                 (tiny, gpt2-124m, gpt2-350m, gpt2-774m, gpt2-1.5b); --layers/--hidden/... override its fields
  --global-batch sequences per step
  --gpus         GPU count (default: every GPU of --topology)
  --gpu          a100, h100, h200, cpu (built-in calibration files, deploy/planner/) or a calibration file path;
                 default: the topology's gpuType
  --topology     a cluster description (deploy/local/topologies/*.yaml); default: 8 GPUs per node, 20 nodes per
                 unit, 20 units per leaf (the rail-optimised layout of the Baidu article)
  --tokens       token budget, e.g. 300e9 (for "days")
  --tp/--pp/...  pin a choice instead of searching it
  --dropout      off (default): activations as Railyard's worker stores them (it trains without dropout); on: with
                 the dropout masks of Megatron/GPT-3 recipes (use it to compare with their published runs)
  --offload      on: AdamW state in host memory, updated on the CPU (docs/planner.md "Optimizer offload"); off:
                 never; default: only for a layout whose state does not fit in device memory
  --mixed        TYPE:GPUS,TYPE:GPUS... a cluster of several GPU types (replaces --gpu/--gpus): plans the layout
                 on the smallest-memory type, then compares the even batch split with the speed-balanced one
  --calibrate    measure this machine's GEMM rate, memory bandwidth and attention kernel into a CPU profile
                 (stdout, or --output FILE); --clock cpu (default) times kernels by process CPU time per thread,
                 which other load on a shared machine disturbs much less than wall time
Exit codes: 0 ok, 1 nothing fits / operation failed, 2 bad command line.
)";

// GPT-3 paper (Brown et al. 2020, Table 2.1) shapes, sequence 2048, GPT-2 vocabulary.
struct Preset {
  const char* name;
  int layers, hidden, heads, seq, vocab;
};
constexpr Preset kGpt3Presets[] = {{"gpt3-1.3b", 24, 2048, 16, 2048, 50257},
                                   {"gpt3-2.7b", 32, 2560, 32, 2048, 50257},
                                   {"gpt3-6.7b", 32, 4096, 32, 2048, 50257},
                                   {"gpt3-13b", 40, 5120, 40, 2048, 50257},
                                   {"gpt3-175b", 96, 12288, 96, 2048, 50257}};

std::optional<plan::ModelShape> find_preset(const std::string& name) {
  for (const auto& p : kGpt3Presets)
    if (name == p.name) return plan::ModelShape{p.name, p.layers, p.hidden, p.heads, p.seq, p.vocab};
  if (auto p = find_model_preset(name)) {
    return plan::ModelShape{std::string(p->name), p->layers, p->hidden, p->heads, p->seq_len, p->vocab};
  }
  return std::nullopt;
}

std::string preset_names() {
  std::string out;
  for (const auto& p : kGpt3Presets) out += std::string(out.empty() ? "" : ", ") + p.name;
  return out + ", " + model_preset_names();
}

int positive_int(const std::string& flag, const std::string& text, long long max = 1LL << 30) {
  const unsigned long long v = parse_count(flag, text);
  if (v == 0 || v > static_cast<unsigned long long>(max)) {
    throw UsageError{flag + " '" + text + "' must be in 1.." + std::to_string(max)};
  }
  return static_cast<int>(v);
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), f, v);
  return buf;
}
std::string params_text(double n) { return n >= 1e9 ? fmt("%.4gB", n / 1e9) : fmt("%.4gM", n / 1e6); }
std::string gb(double bytes) { return fmt("%.1f", bytes / 1e9); }
std::string secs(double s) { return s >= 1 ? fmt("%.2f s", s) : fmt("%.1f ms", s * 1e3); }

nlohmann::json to_json(const plan::Estimate& e, const std::string& why) {
  const auto& l = e.layout;
  nlohmann::json j = {{"layout",
                       {{"dp", l.dp},
                        {"tp", l.tp},
                        {"pp", l.pp},
                        {"microBatch", l.micro_batch},
                        {"microBatches", e.micro_batches},
                        {"zero", l.zero},
                        {"recompute", railyard::to_string(l.recompute)},
                        {"sequenceParallel", l.sequence_parallel},
                        {"interleave", l.interleave},
                        {"offload", l.offload}}},
                      {"stepSeconds", e.time.step},
                      {"time",
                       {{"compute", e.time.compute},
                        {"tensorParallel", e.time.tp_comm},
                        {"pipelineSendRecv", e.time.pp_comm},
                        {"bubble", e.time.bubble},
                        {"dataParallel", e.time.dp_comm},
                        {"dataParallelExposed", e.time.dp_exposed},
                        {"optimizer", e.time.optimizer},
                        {"offloadUpdate", e.time.offload}}},
                      {"bubbleFraction", e.bubble_fraction},
                      {"memoryBytes",
                       {{"params", e.memory.params},
                        {"grads", e.memory.grads},
                        {"optimizer", e.memory.optimizer},
                        {"activations", e.memory.activations},
                        {"workspace", e.memory.workspace},
                        {"total", e.memory.total()},
                        {"host", e.memory.host},
                        {"capacity", e.memory_capacity}}},
                      {"dataParallelTier", e.dp_tier},
                      {"tokensPerSecond", e.tokens_per_s},
                      {"modelFlopsPerGpu", e.model_flops_per_gpu},
                      {"hardwareFlopsPerGpu", e.hardware_flops_per_gpu},
                      {"mfu", e.mfu},
                      {"days", e.days}};
  if (!why.empty()) j["slowerBecause"] = why;
  return j;
}

void print_plan(std::ostream& out, int rank, const plan::Estimate& e, const std::string& why, double tokens) {
  const auto& t = e.time;
  const auto& m = e.memory;
  out << "#" << rank << " " << plan::describe(e.layout) << "  (" << e.micro_batches << " micro-batches)\n";
  out << "   step " << secs(t.step) << " = compute " << secs(t.compute) << " + tp " << secs(t.tp_comm) << " + pp "
      << secs(t.pp_comm) << " + bubble " << secs(t.bubble) << " (" << fmt("%.1f", 100 * e.bubble_fraction) << "%) + dp "
      << secs(t.dp_exposed) << " exposed of " << secs(t.dp_comm) << " (ring: " << e.dp_tier << ") + optimizer "
      << secs(t.optimizer) << (e.layout.offload ? " exposed of a host update of " + secs(t.offload) : "") << "\n";
  out << "   memory/GPU " << gb(m.total()) << " GB of " << gb(e.memory_capacity) << " usable: params " << gb(m.params)
      << " + grads " << gb(m.grads) << " + optimizer " << gb(m.optimizer) << " + activations " << gb(m.activations)
      << " + workspace " << gb(m.workspace);
  if (e.layout.offload) out << "; host " << gb(m.host) << " GB (optimizer state + gradient copy)";
  out << "\n";
  out << "   " << fmt("%.0f", e.tokens_per_s) << " tokens/s, " << fmt("%.4g", e.hardware_flops_per_gpu / 1e12)
      << " TFLOP/s per GPU incl. recomputation (model " << fmt("%.4g", e.model_flops_per_gpu / 1e12) << "), MFU "
      << fmt("%.1f", 100 * e.mfu) << "%";
  if (tokens > 0) out << ", " << fmt("%.1f", e.days) << " days for " << fmt("%.3g", tokens) << " tokens";
  out << "\n";
  if (!why.empty()) out << "   slower than #1: " << why << "\n";
}

// --- calibrate: measure this machine's kernels ---

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

double process_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

// Best of `reps` timed runs after a warm-up. With per_thread_cpu, a run's time is the process CPU time divided by the
// threads (what the run takes on an otherwise idle machine, assuming all threads are busy); on a machine shared
// with other load, wall time measures the load as much as the kernels.
template <typename F>
double best_time(int reps, bool per_thread_cpu, int threads, F&& fn) {
  fn();  // warm-up
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const double t0 = per_thread_cpu ? process_cpu_s() : now_s();
    fn();
    const double t = per_thread_cpu ? (process_cpu_s() - t0) / threads : now_s() - t0;
    best = std::min(best, t);
  }
  return best;
}

// One calibration run: the profile it fills, how it times kernels, and where each measured field came from.
struct Calibration {
  worker::ThreadPool& pool;
  int threads;
  bool cpu_clock;
  std::string where;  // " on HOST, N threads, CLOCK, DATE", the end of every measured field's source
  plan::DeviceProfile p;

  template <typename F>
  double best_of_3(F&& fn) const {
    return best_time(3, cpu_clock, threads, std::forward<F>(fn));
  }
  void measured(const std::string& key, const std::string& how) {
    p.sources[key] = "measured by railyard plan --calibrate (" + how + ")" + where;
  }
};

std::string calibration_where(int threads, bool cpu_clock) {
  const std::string when = [] {
    char buf[32];
    const time_t t = time(nullptr);
    tm utc{};
    gmtime_r(&t, &utc);
    std::strftime(buf, sizeof(buf), "%Y-%m-%d", &utc);
    return std::string(buf);
  }();
  utsname u{};
  uname(&u);
  return " on " + std::string(u.nodename) + ", " + std::to_string(threads) + " threads, " +
         (cpu_clock ? "per-thread CPU time" : "wall time") + ", " + when;
}

void measure_gemms(Calibration& c) {
  using namespace railyard::worker;
  plan::DeviceProfile& p = c.p;
  // GEMMs: the worker's own GEMM path on gpt2-124m's shapes at B*T = 256 rows (railyard-worker gemm-rate).
  const GptConfig cfg = model_preset("gpt2-124m");
  double per_cpu_second = 0;
  p.peak_flops = measure_gemm_rate(c.pool, cfg, 4, 64, 5, nullptr, 0, &per_cpu_second);
  if (c.cpu_clock) p.peak_flops = per_cpu_second * c.threads;
  c.measured("peak_flops", "our GEMM path on gpt2-124m's layer and LM-head shapes, 256 rows");
  p.gemm_efficiency = 1.0;
  p.sources["gemm_efficiency"] = "definition (peak_flops is the measured GEMM rate)";
  // Small GEMMs: the rate of the smallest GEMM we train (tiny's 128 x 128 projection at 256 rows) against the rate
  // above gives the half-efficiency size. (An 8-row GEMM was used first: it measures the packing overhead of a
  // degenerate panel, a shape training never runs, and made the model charge tiny's 256-row GEMMs half the peak
  // although they run at the full rate, per CPU second, here.)
  const int M = 256, N = 128, K = 128;
  std::vector<float> a(size_t(M) * K, 0.01f), b(size_t(N) * K, 0.02f), out(size_t(M) * N);
  const int inner = 100;
  const double t = c.best_of_3([&] {
    for (int i = 0; i < inner; ++i)
      cpu::gemm<float>(c.pool, false, true, M, N, K, 1.0f, a.data(), K, b.data(), K, 0.0f, out.data(), N);
  });
  const double flops = 2.0 * M * N * K;
  const double eff = std::min(0.99, flops * inner / t / p.peak_flops);
  p.gemm_half_flops = flops * (1 - eff) / eff;  // eff = W / (W + half)
  c.measured("gemm_half_flops", "rate of a 256x128x128 GEMM against peak_flops");
}

void measure_bandwidth(Calibration& c) {
  using namespace railyard::worker;
  plan::DeviceProfile& p = c.p;
  // Memory bandwidth: the residual add (reads 2, writes 1) over 3 x 128 MiB.
  const size_t n = size_t(32) << 20;
  std::vector<float> x(n, 1.0f), y(n, 2.0f), z(n);
  const double t = c.best_of_3([&] { cpu::residual_forward<float>(c.pool, z.data(), x.data(), y.data(), n); });
  p.memory_bandwidth = 3.0 * n * sizeof(float) / t;
  p.memory_efficiency = 1.0;
  c.measured("memory_bandwidth", "our residual-add kernel over 3 x 128 MiB");
  p.sources["memory_efficiency"] = "definition (memory_bandwidth is what our kernels reach)";
  // Optimizer offload on a CPU: the "host" is the same RAM, so its copies and update run at this bandwidth too.
  p.host_link_bandwidth = p.host_memory_bandwidth = p.memory_bandwidth;
  p.sources["host_link_bandwidth"] = p.sources["host_memory_bandwidth"] = "assumed (the same RAM: memory_bandwidth)";
}

// Kernel overhead: one pool dispatch of a tiny kernel.
void measure_kernel_overhead(Calibration& c) {
  std::vector<float> x(64, 1.0f), y(64, 2.0f), z(64);
  const int inner = 2000;
  const double t = c.best_of_3([&] {
    for (int i = 0; i < inner; ++i) worker::cpu::residual_forward<float>(c.pool, z.data(), x.data(), y.data(), 64);
  });
  c.p.kernel_overhead_s = t / inner;
  c.measured("kernel_overhead_s", "a 64-element kernel through the thread pool");
}

void measure_attention(Calibration& c) {
  using namespace railyard::worker;
  plan::DeviceProfile& p = c.p;
  // Attention core: our fused causal attention forward + backward at gpt2-124m's width, T = 256.
  const int B = 2, T = 256, C = 768, NH = 12;
  std::vector<float> qkv(size_t(B) * T * 3 * C), att(size_t(B) * NH * T * T), out(size_t(B) * T * C);
  std::vector<float> dout(out.size(), 1e-3f), dqkv(qkv.size()), scratch(size_t(c.pool.size()) * T * T);
  for (size_t i = 0; i < qkv.size(); ++i) qkv[i] = float((i * 2654435761u) % 1000) * 1e-4f;
  const double t = c.best_of_3([&] {
    cpu::attention_forward<float>(c.pool, out.data(), att.data(), qkv.data(), B, T, C, NH);
    cpu::attention_backward<float>(c.pool, dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(), B, T, C,
                                   NH);
  });
  // The cost model charges 4*b*s^2*h FLOPs forward and twice that backward at attention_efficiency, plus the
  // softmax's memory passes; fit the efficiency so the model reproduces this time.
  const double flops = 3 * 4.0 * B * double(T) * T * C;
  const double scores = double(B) * NH * T * T;
  const double softmax = 3 * (scores * (4 * p.activation_bytes + 1)) / p.memory_bandwidth;
  const double compute = std::max(t - softmax, 0.25 * t);
  p.attention_efficiency = std::min(1.0, flops / compute / p.peak_flops);
  c.measured("attention_efficiency", "our attention forward + backward, B2 T256 C768 NH12");
}

// One all-reduce of the first n floats of buf between barriers, by the calibration's clock.
double timed_all_reduce(worker::comm::Communicator& c, std::vector<float>& buf, size_t n, bool cpu_clock) {
  c.barrier();
  const double t0 = now_s(), c0 = process_cpu_s();
  c.all_reduce(buf.data(), n, worker::comm::DType::kFloat32, worker::comm::ReduceOp::kSum);
  c.barrier();
  // By the CPU clock: the process's CPU time over both ranks (and Gloo's threads), per rank; the copies through
  // loopback TCP are CPU work, the waiting is not.
  return cpu_clock ? (process_cpu_s() - c0) / 2 : now_s() - t0;
}

struct AllReduceTimes {
  double big = 1e30;    // best of 3 of `count` floats
  double small = 1e30;  // median of 20 of `mid` floats
};

AllReduceTimes time_loopback_all_reduce(size_t count, size_t mid, bool cpu_clock) {
  AllReduceTimes times;
  worker::comm::run_local_world(2, [&](worker::comm::Communicator& c) {
    std::vector<float> buf(count, 1.0f);
    for (int r = 0; r < 4; ++r) {
      const double t = timed_all_reduce(c, buf, count, cpu_clock);
      if (c.rank() == 0 && r > 0) times.big = std::min(times.big, t);
    }
    // The fixed cost per call from a 256 KiB all-reduce, the size of tiny's tensor-parallel all-reduces, by the same
    // clock and as the median of 20 (a 1-float all-reduce's best wall time, used first, was 30 us and missed that
    // each of the hundreds of small collectives of a tensor-parallel step costs the processes far more).
    std::vector<double> mids;
    for (int r = 0; r < 21; ++r) {
      const double t = timed_all_reduce(c, buf, mid, cpu_clock);
      if (c.rank() == 0 && r > 0) mids.push_back(t);
    }
    if (c.rank() == 0) {
      std::sort(mids.begin(), mids.end());
      times.small = mids[mids.size() / 2];
    }
  });
  return times;
}

// Collectives between processes of this machine: a 2-rank Gloo world over loopback TCP (what `railyard-worker
// train --nproc` uses). Bus bandwidth from a 64 MiB all-reduce, latency per ring step from a 1-element one.
void measure_collectives(Calibration& c) {
  plan::DeviceProfile& p = c.p;
  const size_t count = size_t(16) << 20, kMid = size_t(64) << 10;
  const auto [big, small] = time_loopback_all_reduce(count, kMid, c.cpu_clock);
  // Ring model on n = 2: time = 2 (n-1)/n S / busbw + 2 (n-1) latency; two points (64 MiB, 256 KiB).
  const double big_bytes = double(count) * sizeof(float), mid_bytes = double(kMid) * sizeof(float);
  p.nvlink_bandwidth = (big_bytes - mid_bytes) / std::max(big - small, 1e-9);
  p.collective_latency_s = std::max(1e-7, (small - mid_bytes / p.nvlink_bandwidth) / 2);
  p.nic_bandwidth = p.nvlink_bandwidth;
  p.nvlink_efficiency = p.nic_efficiency = 1.0;
  const std::string how =
      std::string("2-rank Gloo all-reduce over loopback TCP, 64 MiB") + (c.cpu_clock ? ", CPU time per rank" : "");
  c.measured("nvlink_bandwidth", how + " (between processes of one machine)");
  c.measured("nic_bandwidth", how + " (the same loopback path; a real NIC is not modelled)");
  c.measured("collective_latency_s", std::string("2-rank Gloo all-reduce of 256 KiB over loopback TCP, median of 20") +
                                         (c.cpu_clock ? ", CPU time per rank" : "") +
                                         ", less its bytes at that bandwidth");
  p.sources["nvlink_efficiency"] = p.sources["nic_efficiency"] =
      "definition (the bandwidths are measured bus bandwidths)";
}

void read_memory_size(Calibration& c) {
  plan::DeviceProfile& p = c.p;
  p.memory_bytes = 0;
  std::ifstream mi("/proc/meminfo");
  std::string key;
  double kb = 0;
  std::string unit;
  while (mi >> key >> kb >> unit) {
    if (key == "MemTotal:") {
      p.memory_bytes = kb * 1024;
      break;
    }
  }
  if (p.memory_bytes <= 0) p.memory_bytes = 8e9;
  c.measured("memory_bytes", "/proc/meminfo MemTotal");
}

plan::DeviceProfile calibrate_cpu(int threads, bool cpu_clock) {
  worker::cpu::init_blas_single_threaded();
  worker::ThreadPool pool(threads);
  // The built-in cpu profile keeps the assumed fields.
  Calibration c{pool, threads, cpu_clock, calibration_where(threads, cpu_clock), plan::builtin_profile("cpu")};
  measure_gemms(c);
  measure_bandwidth(c);
  measure_kernel_overhead(c);
  measure_attention(c);
  measure_collectives(c);
  read_memory_size(c);
  return c.p;
}

int run_calibrate(const std::map<std::string, std::string>& f) {
  const int threads =
      f.count("threads") ? positive_int("--threads", f.at("threads"), 4096) : railyard::worker::default_num_threads();
  std::string clock = f.count("clock") ? f.at("clock") : "cpu";
  if (clock != "cpu" && clock != "wall") throw UsageError{"--clock must be cpu or wall"};
  const plan::DeviceProfile p = calibrate_cpu(threads, clock == "cpu");
  const std::string text = plan::profile_to_yaml(
      p,
      "CPU profile of one railyard-worker process, written by `railyard plan --calibrate`.\n"
      "Fields not marked \"measured\" keep the values of the built-in cpu profile. Format: docs/planner.md.");
  plan::parse_profile(text, "generated profile");  // what we write must load
  if (f.count("output")) {
    write_file_atomic(f.at("output"), text);
    std::cerr << "railyard plan: wrote " << f.at("output") << "\n";
  } else {
    std::cout << text;
  }
  return kExitOk;
}

plan::DeviceProfile profile_arg(const std::string& flag, const std::string& gpu) {
  const bool is_file = gpu.find('/') != std::string::npos || gpu.find(".yaml") != std::string::npos ||
                       gpu.find(".json") != std::string::npos;
  if (is_file) return plan::load_profile(gpu);
  try {
    return plan::builtin_profile(gpu);
  } catch (const ConfigError& e) {
    throw UsageError{flag + ": " + e.what()};
  }
}

// One TYPE:GPUS group of --mixed.
struct MixedPart {
  plan::DeviceProfile device;
  int gpus;
};

std::vector<MixedPart> parse_mixed(const std::string& spec) {
  std::vector<MixedPart> parts;
  size_t start = 0;
  while (start <= spec.size()) {
    size_t end = spec.find(',', start);
    if (end == std::string::npos) end = spec.size();
    const std::string item = spec.substr(start, end - start);
    const size_t colon = item.rfind(':');
    if (colon == std::string::npos || colon == 0) {
      throw UsageError{"--mixed '" + item + "' is not TYPE:GPUS (e.g. --mixed a100:64,h100:64)"};
    }
    parts.push_back({profile_arg("--mixed", item.substr(0, colon)), positive_int("--mixed", item.substr(colon + 1))});
    start = end + 1;
  }
  if (parts.size() < 2) throw UsageError{"--mixed needs at least two TYPE:GPUS groups"};
  return parts;
}

// The layout must fit on every type: search it on the smallest-memory one with all the GPUs.
plan::Cluster smallest_type_cluster(const std::vector<MixedPart>& parts) {
  const MixedPart* smallest = &parts[0];
  int total = 0;
  for (const auto& p : parts) {
    total += p.gpus;
    if (p.device.memory_bytes * p.device.usable_memory_fraction <
        smallest->device.memory_bytes * smallest->device.usable_memory_fraction)
      smallest = &p;
  }
  plan::Cluster cluster;
  cluster.device = smallest->device;
  cluster.topology.origin = "default";
  cluster.topology.gpus_per_node = cluster.device.gpus_per_node;
  cluster.gpus = total;
  return cluster;
}

// Each type's GPUs as whole replicas of the layout.
std::vector<plan::ReplicaGroup> replica_groups(const std::vector<MixedPart>& parts, const plan::Layout& layout) {
  const int replica_gpus = layout.tp * layout.pp;
  std::vector<plan::ReplicaGroup> groups;
  for (const auto& p : parts) {
    if (p.gpus % replica_gpus != 0) {
      throw UsageError{"--mixed: " + std::to_string(p.gpus) + " " + p.device.name + " GPUs do not hold whole " +
                       std::to_string(replica_gpus) + "-GPU replicas (tp " + std::to_string(layout.tp) + " x pp " +
                       std::to_string(layout.pp) + "); pin --tp/--pp or change the counts"};
    }
    groups.push_back({p.device, p.gpus / replica_gpus});
  }
  return groups;
}

// What --mixed compares: the even and the speed-balanced batch split over the replica groups, and (where the types
// hold whole stages) the even and the speed-proportional cut of a pipeline that spans the types.
struct MixedResult {
  plan::Layout layout;
  std::vector<plan::ReplicaGroup> groups;
  plan::HeteroEstimate even, balanced;
  std::optional<plan::MixedPipelineEstimate> pipe_even, pipe_bal;
};

// Whale's other option: every pipeline spans the types (stages per type in proportion to its GPUs), cut in
// proportion to speed with the larger-memory GPUs on the early stages, against the even cut.
void estimate_mixed_pipelines(const plan::Job& job, const plan::Cluster& cluster, const std::vector<MixedPart>& parts,
                              MixedResult& m) {
  const plan::Layout& layout = m.layout;
  if (layout.pp < 2) return;
  const int total = cluster.gpus;
  std::vector<plan::DeviceProfile> stage_devices;
  bool whole = true;
  for (const auto& p : parts) {
    whole = whole && (static_cast<long long>(p.gpus) * layout.pp) % total == 0;
    for (long long k = 0; whole && k < static_cast<long long>(p.gpus) * layout.pp / total; ++k)
      stage_devices.push_back(p.device);
  }
  if (whole && static_cast<int>(stage_devices.size()) == layout.pp && layout.zero <= 1) {
    m.pipe_even = plan::estimate_mixed_pipeline(job, cluster.topology, stage_devices, layout, false);
    m.pipe_bal = plan::estimate_mixed_pipeline(job, cluster.topology, stage_devices, layout, true);
  }
}

nlohmann::json mixed_to_json(const plan::Job& job, const MixedResult& m) {
  const double tokens_per_step = double(job.global_batch) * job.model.seq;
  nlohmann::json j;
  j["layout"] = plan::describe(m.layout);
  j["evenStepSeconds"] = m.even.step;
  j["balancedStepSeconds"] = m.balanced.step;
  j["speedup"] = m.even.step / m.balanced.step;
  j["balancedMicroBatchesPerReplica"] = m.balanced.micro_batches;
  j["balancedTokensPerSecond"] = tokens_per_step / m.balanced.step;
  if (job.tokens > 0) j["balancedDays"] = job.tokens / (tokens_per_step / m.balanced.step) / 86400;
  if (m.pipe_bal) {
    j["mixedPipeline"] = {{"evenStepSeconds", m.pipe_even->step},
                          {"balancedStepSeconds", m.pipe_bal->step},
                          {"speedup", m.pipe_even->step / m.pipe_bal->step},
                          {"stageDevices", m.pipe_bal->device},
                          {"stageLayers", m.pipe_bal->cut.layers},
                          {"evenStageLayers", m.pipe_even->cut.layers},
                          {"fits", m.pipe_bal->fits},
                          {"stageMemoryBytes", m.pipe_bal->stage_memory}};
  }
  return j;
}

void print_mixed(std::ostream& out, const std::vector<MixedPart>& parts, const plan::Cluster& cluster,
                 const MixedResult& m) {
  const plan::Layout& layout = m.layout;
  out << "mixed cluster: ";
  for (size_t i = 0; i < parts.size(); ++i) out << (i ? " + " : "") << parts[i].gpus << " x " << parts[i].device.name;
  out << "; replica layout " << plan::describe(layout) << " (planned on " << cluster.device.name << ")\n";
  out << "even split:     step " << secs(m.even.step) << "\n";
  out << "balanced split: step " << secs(m.balanced.step) << " (" << fmt("%.2f", m.even.step / m.balanced.step)
      << "x); micro-batches per replica by group:";
  size_t k = 0;
  for (const auto& g : m.groups) {
    out << " " << g.device.name << " " << m.balanced.micro_batches[k];
    k += g.replicas;
  }
  out << "\n";
  if (m.pipe_bal) {
    out << "mixed pipeline (every replica's " << layout.pp << " stages span the types):\n";
    out << "  even cut:               step " << secs(m.pipe_even->step) << "\n";
    out << "  speed-proportional cut: step " << secs(m.pipe_bal->step) << " ("
        << fmt("%.2f", m.pipe_even->step / m.pipe_bal->step) << "x); stages:";
    for (size_t s = 0; s < m.pipe_bal->device.size(); ++s)
      out << " " << m.pipe_bal->device[s] << " " << m.pipe_bal->cut.layers[s] << "L "
          << fmt("%.1f", m.pipe_bal->stage_memory[s] / 1e9) << "GB";
    out << (m.pipe_bal->fits ? "" : " (does NOT fit)") << "\n";
  } else if (layout.pp >= 2) {
    out << "mixed pipeline: not evaluated (each type's GPUs must hold a whole number of the " << layout.pp
        << " stages of every replica, ZeRO <= 1)\n";
  }
}

// --mixed a100:64,h100:64: Whale-style data parallelism over replicas of different GPU types.
int run_mixed(const plan::Job& job, std::map<std::string, std::string>& f) {
  for (const char* clash : {"gpu", "gpus", "topology", "dp"}) {
    if (f.count(clash)) throw UsageError{std::string("--mixed replaces --") + clash + ": give one or the other"};
  }
  const std::vector<MixedPart> parts = parse_mixed(f["mixed"]);
  const plan::Cluster cluster = smallest_type_cluster(parts);
  plan::SearchOptions o;
  o.top = 1;
  if (f.count("tp")) o.tp = positive_int("--tp", f["tp"]);
  if (f.count("pp")) o.pp = positive_int("--pp", f["pp"]);
  if (f.count("micro-batch")) o.micro_batch = positive_int("--micro-batch", f["micro-batch"]);
  o.interleave = 1;
  o.interleaves = {1};
  const plan::SearchResult r = plan::search(job, cluster, o);
  if (r.plans.empty()) {
    std::cerr << "railyard plan: no layout fits on " << cluster.device.name << " with " << cluster.gpus << " GPUs\n";
    return kExitFailed;
  }
  MixedResult m;
  m.layout = r.plans[0].estimate.layout;
  m.groups = replica_groups(parts, m.layout);
  m.even = plan::estimate_mixed_dp(job, cluster.topology, m.groups, m.layout, false);
  m.balanced = plan::estimate_mixed_dp(job, cluster.topology, m.groups, m.layout, true);
  estimate_mixed_pipelines(job, cluster, parts, m);
  if (f.count("json")) {
    std::cout << mixed_to_json(job, m).dump(2) << "\n";
    return kExitOk;
  }
  print_mixed(std::cout, parts, cluster, m);
  return kExitOk;
}

}  // namespace

// --moe-experts: the MoE terms of docs/planner.md "Mixture of experts" for the best dense plan's micro-batches (the
// search itself plans the dense model): parameters, states per GPU, and the dispatch all-to-all, flat vs hierarchical.
void print_moe(std::ostream& os, std::map<std::string, std::string>& f, const plan::Job& job,
               const plan::Cluster& cluster, const plan::Estimate& best) {
  plan::MoeShape moe;
  moe.experts = positive_int("--moe-experts", f["moe-experts"], 1 << 16);
  if (f.count("moe-top-k")) moe.top_k = positive_int("--moe-top-k", f["moe-top-k"], moe.experts);
  if (f.count("moe-capacity-factor"))
    moe.capacity_factor = parse_fraction("--moe-capacity-factor", f["moe-capacity-factor"]);
  const int ep = f.count("ep") ? positive_int("--ep", f["ep"]) : 1;
  if (moe.experts % ep != 0 || best.layout.dp % ep != 0) {
    throw UsageError{"--ep " + std::to_string(ep) + " must divide --moe-experts " + std::to_string(moe.experts) +
                     " and the plan's dp " + std::to_string(best.layout.dp)};
  }
  const plan::MoeStateBytes st =
      plan::moe_state_bytes(job.model, moe, cluster.device, best.layout.dp, ep, best.layout.zero);
  const plan::MoeCommEstimate c =
      plan::moe_comm_estimate(job.model, moe, cluster, ep, best.layout.micro_batch, best.micro_batches);
  os << "experts (E" << moe.experts << " top-" << moe.top_k << " capacity factor " << fmt("%.3g", moe.capacity_factor)
     << ", ep " << ep
     << ", on plan #1's layout; not part of the search): " << params_text(plan::moe_parameter_count(job.model, moe))
     << " parameters, " << params_text(plan::moe_parameters_per_gpu(job.model, moe, ep)) << " per GPU, states "
     << gb(st.total()) << " GB per GPU\n";
  if (ep > 1) {
    os << "  all-to-all of " << fmt("%.3g", c.bytes_per_all_to_all / 1048576.0) << " MiB per rank over "
       << c.per_all_to_all.nodes << " node(s) x " << c.per_all_to_all.local << ": flat "
       << fmt("%.1f", c.per_all_to_all.flat * 1e6) << " us, hierarchical "
       << fmt("%.1f", c.per_all_to_all.hierarchical * 1e6) << " us -> "
       << (c.per_all_to_all.use_hierarchical ? "hierarchical" : "flat") << "; " << c.all_to_alls
       << " per step = " << fmt("%.3g", c.seconds) << " s per step\n";
  }
}

namespace {

// The flags of a plan command line by name (a switch maps to "1"); nullopt for --help.
std::optional<std::map<std::string, std::string>> parse_plan_flags(const Args& args) {
  static const std::vector<std::string> kValueFlags = {
      "model",    "layers",     "hidden",  "heads",  "seq",     "vocab", "global-batch", "gpus",   "gpu",
      "topology", "tokens",     "top",     "tp",     "pp",      "dp",    "micro-batch",  "zero",   "recompute",
      "sp",       "interleave", "offload", "output", "threads", "clock", "mixed",        "dropout"};
  static const std::vector<std::string> kMoeFlags = {"moe-experts", "moe-top-k", "moe-capacity-factor", "ep"};
  static const std::vector<std::string> kSwitches = {"json", "calibrate"};
  std::map<std::string, std::string> f;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h" || a == "help") return std::nullopt;
    if (a.rfind("--", 0) != 0) throw UsageError{"plan: unexpected argument '" + a + "'"};
    std::string name = a.substr(2), value;
    const size_t eq = name.find('=');
    const bool has_eq = eq != std::string::npos;
    if (has_eq) {
      value = name.substr(eq + 1);
      name.resize(eq);
    }
    if (std::find(kSwitches.begin(), kSwitches.end(), name) != kSwitches.end()) {
      if (has_eq) throw UsageError{"plan: --" + name + " takes no value"};
      f[name] = "1";
      continue;
    }
    if (std::find(kValueFlags.begin(), kValueFlags.end(), name) == kValueFlags.end() &&
        std::find(kMoeFlags.begin(), kMoeFlags.end(), name) == kMoeFlags.end()) {
      throw UsageError{"plan: unknown flag '--" + name + "' (railyard plan --help)"};
    }
    if (!has_eq) {
      if (i + 1 >= args.size()) throw UsageError{"plan: --" + name + " needs a value"};
      value = args[++i];
    }
    if (f.count(name)) throw UsageError{"plan: --" + name + " given twice"};
    f[name] = value;
  }
  return f;
}

// Model: preset, then field overrides.
plan::ModelShape model_from_flags(std::map<std::string, std::string>& f) {
  plan::ModelShape model;
  if (f.count("model")) {
    auto p = find_preset(f["model"]);
    if (!p) throw UsageError{"--model '" + f["model"] + "' is not a preset (" + preset_names() + ")"};
    model = *p;
  } else {
    model.name = "custom";
  }
  const std::pair<const char*, int plan::ModelShape::*> fields[] = {{"layers", &plan::ModelShape::layers},
                                                                    {"hidden", &plan::ModelShape::hidden},
                                                                    {"heads", &plan::ModelShape::heads},
                                                                    {"seq", &plan::ModelShape::seq},
                                                                    {"vocab", &plan::ModelShape::vocab}};
  for (const auto& [flag, member] : fields) {
    if (f.count(flag)) {
      model.*member = positive_int(std::string("--") + flag, f[flag]);
      if (model.name != "custom") model.name += "*";
    } else if (!f.count("model")) {
      throw UsageError{std::string("--") + flag + " is required without --model (or give --model " + preset_names() +
                       ")"};
    }
  }
  if (model.hidden % model.heads != 0) {
    throw UsageError{"--hidden " + std::to_string(model.hidden) + " is not divisible by --heads " +
                     std::to_string(model.heads)};
  }
  return model;
}

plan::Job job_from_flags(std::map<std::string, std::string>& f) {
  plan::Job job;
  job.model = model_from_flags(f);
  if (!f.count("global-batch")) throw UsageError{"--global-batch (sequences per step) is required"};
  job.model.dropout = false;  // what Railyard's worker runs
  if (f.count("dropout")) {
    if (f["dropout"] != "on" && f["dropout"] != "off") throw UsageError{"--dropout must be on or off"};
    job.model.dropout = f["dropout"] == "on";
  }
  job.global_batch = positive_int("--global-batch", f["global-batch"]);
  if (f.count("tokens")) {
    job.tokens = parse_fraction("--tokens", f["tokens"]);
    if (!(job.tokens > 0) || !std::isfinite(job.tokens)) throw UsageError{"--tokens must be a positive number"};
  }
  return job;
}

// Cluster: topology (optional), device profile, GPU count.
plan::Cluster cluster_from_flags(std::map<std::string, std::string>& f) {
  plan::Cluster cluster;
  if (f.count("topology")) {
    cluster.topology = plan::load_topology(f["topology"]);
  } else {
    cluster.topology.origin = "default";
  }
  std::string gpu = f.count("gpu") ? f["gpu"] : cluster.topology.gpu_type;
  if (gpu.empty()) throw UsageError{"--gpu is required (a100, h100, h200, cpu or a calibration file)"};
  cluster.device = profile_arg("--gpu", gpu);
  if (!f.count("topology")) cluster.topology.gpus_per_node = cluster.device.gpus_per_node;
  if (f.count("gpus")) {
    cluster.gpus = positive_int("--gpus", f["gpus"], 1 << 24);
  } else if (f.count("topology")) {
    cluster.gpus = cluster.topology.nodes * cluster.topology.gpus_per_node;
  } else {
    throw UsageError{"--gpus is required without --topology"};
  }
  return cluster;
}

// The choices pinned by --tp, --pp, ... (the search tries every value of the others).
plan::SearchOptions search_options_from_flags(std::map<std::string, std::string>& f) {
  plan::SearchOptions o;
  if (f.count("top")) o.top = positive_int("--top", f["top"], 1000);
  if (f.count("tp")) o.tp = positive_int("--tp", f["tp"]);
  if (f.count("pp")) o.pp = positive_int("--pp", f["pp"]);
  if (f.count("dp")) o.dp = positive_int("--dp", f["dp"]);
  if (f.count("micro-batch")) {
    o.micro_batch = positive_int("--micro-batch", f["micro-batch"]);
    o.max_micro_batch = std::max(o.max_micro_batch, *o.micro_batch);
  }
  if (f.count("interleave")) {
    o.interleave = positive_int("--interleave", f["interleave"], 64);
    o.interleaves = {*o.interleave};
  }
  if (f.count("zero")) {
    const unsigned long long z = parse_count("--zero", f["zero"]);
    if (z > 3) throw UsageError{"--zero must be 0, 1, 2 or 3"};
    o.zero = static_cast<int>(z);
  }
  if (f.count("recompute")) {
    const auto r = recompute_from_string(f["recompute"]);
    if (!r) throw UsageError{"--recompute must be none, selective or full"};
    o.recompute = *r;
  }
  if (f.count("sp")) {
    if (f["sp"] != "on" && f["sp"] != "off") throw UsageError{"--sp must be on or off"};
    o.sequence_parallel = f["sp"] == "on";
  }
  if (f.count("offload")) {
    if (f["offload"] != "on" && f["offload"] != "off") throw UsageError{"--offload must be on or off"};
    o.offload = f["offload"] == "on";
  }
  return o;
}

void print_search_json(std::ostream& out, const plan::Job& job, const plan::Cluster& cluster,
                       const plan::SearchResult& r) {
  const plan::ModelShape& model = job.model;
  nlohmann::json j;
  j["model"] = {{"name", model.name},       {"layers", model.layers},
                {"hidden", model.hidden},   {"heads", model.heads},
                {"seq", model.seq},         {"vocab", model.vocab},
                {"dropout", model.dropout}, {"parameters", plan::parameter_count(model)}};
  j["cluster"] = {{"gpus", cluster.gpus},
                  {"gpu", cluster.device.name},
                  {"gpusPerNode", cluster.topology.gpus_per_node},
                  {"topology", cluster.topology.origin}};
  j["globalBatch"] = job.global_batch;
  j["tokens"] = job.tokens;
  j["evaluated"] = r.evaluated;
  j["rejectedMemory"] = r.rejected_memory;
  j["invalid"] = r.invalid;
  j["plans"] = nlohmann::json::array();
  for (const auto& p : r.plans) j["plans"].push_back(to_json(p.estimate, p.why));
  out << j.dump(2) << "\n";
}

void print_search_text(std::ostream& out, std::map<std::string, std::string>& f, const plan::Job& job,
                       const plan::Cluster& cluster, const plan::SearchResult& r) {
  const plan::ModelShape& model = job.model;
  out << "model " << model.name << ": L" << model.layers << " h" << model.hidden << " a" << model.heads << " s"
      << model.seq << " V" << model.vocab << ", " << params_text(plan::parameter_count(model))
      << " parameters; global batch " << job.global_batch << " sequences ("
      << fmt("%.3g", double(job.global_batch) * model.seq) << " tokens) per step\n";
  out << "cluster: " << cluster.gpus << " x " << cluster.device.name << " (" << cluster.topology.gpus_per_node
      << " per node, " << cluster.topology.nodes_per_unit << " nodes per unit, topology " << cluster.topology.origin
      << ")\n";
  long long invalid = 0;
  for (const auto& kv : r.invalid) invalid += kv.second;
  out << "searched " << r.evaluated + invalid << " layouts: " << r.evaluated - r.rejected_memory << " fit, "
      << r.rejected_memory << " over memory, " << invalid << " invalid\n\n";
  int rank = 0;
  for (const auto& p : r.plans) print_plan(out, ++rank, p.estimate, p.why, job.tokens);
  if (f.count("moe-experts") && !r.plans.empty()) print_moe(out, f, job, cluster, r.plans.front().estimate);
}

// Why a search found no plan: the smallest layout's memory against the usable, or what made every layout invalid.
std::string no_fit_reason(const plan::SearchResult& r) {
  std::string msg = "no layout fits: ";
  if (r.smallest_nonfitting) {
    msg += "the smallest needs " + gb(r.smallest_nonfitting->memory.total()) + " GB per GPU (" +
           plan::describe(r.smallest_nonfitting->layout) + ") but " + gb(r.smallest_nonfitting->memory_capacity) +
           " GB are usable; add GPUs or use larger ones";
  } else {
    msg += "no valid layout (";
    for (const auto& kv : r.invalid) msg += kv.first + ": " + std::to_string(kv.second) + "; ";
    msg += "check --gpus against heads, layers and --global-batch)";
  }
  return msg;
}

}  // namespace

int run_plan(const Args& args) {
  auto parsed = parse_plan_flags(args);
  if (!parsed) {
    std::cout << kPlanUsage;
    return kExitOk;
  }
  std::map<std::string, std::string>& f = *parsed;
  if (f.count("calibrate")) return run_calibrate(f);
  const plan::Job job = job_from_flags(f);
  if (f.count("mixed")) return run_mixed(job, f);
  const plan::Cluster cluster = cluster_from_flags(f);
  const plan::SearchResult r = plan::search(job, cluster, search_options_from_flags(f));
  if (f.count("json")) {
    print_search_json(std::cout, job, cluster, r);
  } else {
    print_search_text(std::cout, f, job, cluster, r);
  }
  if (r.plans.empty()) {
    std::cerr << "railyard plan: " << no_fit_reason(r) << "\n";
    return kExitFailed;
  }
  return kExitOk;
}

}  // namespace railyard::cli
