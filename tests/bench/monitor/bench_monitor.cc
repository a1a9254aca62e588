// bench_monitor: the monitor's CPU cost per 1,000 worker series and evaluation (docs/benchmarks.md). Both input
// paths are measured end to end in process CPU time: the text exposition (embedded mode: parse + group + rules)
// and the Prometheus query answer (JSON parse + group + rules). No server involved: the inputs are generated.
#include <time.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "monitor/rules.h"
#include "monitor/samples.h"

namespace {

using namespace railyard::monitor;

double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// The series one rank exports that the rules read (10 per rank, histogram buckets excluded).
const char* kNames[] = {"railyard_worker_step",
                        "railyard_worker_last_step_timestamp_seconds",
                        "railyard_worker_step_duration_seconds_sum",
                        "railyard_worker_step_duration_seconds_count",
                        "railyard_worker_loss",
                        "railyard_worker_nonfinite_total",
                        "railyard_checkpoint_last_step",
                        "railyard_checkpoint_last_timestamp_seconds",
                        "up",
                        "railyard_worker_tokens_per_second"};

std::string labels(int job, int rank) {
  return "namespace=\"team-a\",trainingjob=\"job-" + std::to_string(job) + "\",generation=\"3\",rank=\"" +
         std::to_string(rank) + "\",node=\"gpu-node-" + std::to_string(rank / 8) + "\"";
}

double value(int i, int round, int rank) {
  switch (i) {
    case 0:
      return 1000 + round;
    case 1:
      return 1.7e9 + round;
    case 2:
      return 0.5 * (1000 + round) + rank * 1e-3;
    case 3:
      return 1000 + round;
    case 4:
      return 2.5;
    case 8:
      return 1;
    default:
      return 0;
  }
}

std::string text_input(int jobs, int ranks, int round) {
  std::string s;
  for (int j = 0; j < jobs; ++j)
    for (int r = 0; r < ranks; ++r)
      for (int i = 0; i < 10; ++i)
        s += std::string(kNames[i]) + "{" + labels(j, r) + "} " + std::to_string(value(i, round, r)) + "\n";
  return s;
}

std::string json_input(int jobs, int ranks, int round) {
  std::string s = R"({"status":"success","data":{"resultType":"vector","result":[)";
  bool first = true;
  for (int j = 0; j < jobs; ++j)
    for (int r = 0; r < ranks; ++r)
      for (int i = 0; i < 10; ++i) {
        if (!first) s += ",";
        first = false;
        s += R"({"metric":{"__name__":")" + std::string(kNames[i]) + R"(","namespace":"team-a","trainingjob":"job-)" +
             std::to_string(j) + R"(","generation":"3","rank":")" + std::to_string(r) + R"(","node":"gpu-node-)" +
             std::to_string(r / 8) + R"("},"value":[1700000000.123,")" + std::to_string(value(i, round, r)) + R"("]})";
      }
  return s + "]}}";
}

}  // namespace

int main(int argc, char** argv) {
  int jobs = argc > 1 ? std::atoi(argv[1]) : 4;
  int ranks = argc > 2 ? std::atoi(argv[2]) : 256;
  int rounds = argc > 3 ? std::atoi(argv[3]) : 50;
  const double series = 10.0 * jobs * ranks;
  std::printf("bench_monitor: %d jobs x %d ranks x 10 series = %.0f series, %d evaluations per path\n", jobs, ranks,
              series, rounds);
  for (int path = 0; path < 2; ++path) {
    std::vector<std::string> inputs;
    for (int i = 0; i < rounds; ++i)
      inputs.push_back(path == 0 ? text_input(jobs, ranks, i) : json_input(jobs, ranks, i));
    Evaluator ev;
    Policy p;
    size_t verdicts = 0, parsed = 0;
    double parse_cpu = 0, rules_cpu = 0;
    auto wall0 = std::chrono::steady_clock::now();
    for (int i = 0; i < rounds; ++i) {
      double c0 = cpu_seconds();
      auto samples = path == 0 ? parse_text_format(inputs[i], "bench") : parse_query_response(inputs[i], "bench");
      double c1 = cpu_seconds();
      auto grouped = group_samples(samples);
      for (const auto& [key, rs] : grouped)
        if (ev.evaluate(key, 3, rs, p, 1.7e9 + i)) ++verdicts;
      double c2 = cpu_seconds();
      parse_cpu += c1 - c0;
      rules_cpu += c2 - c1;
      parsed += samples.size();
    }
    double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
    double per_k = 1000.0 / series / rounds;
    std::printf(
        "%-22s parse %.3f ms + group/rules %.3f ms = %.3f ms CPU per 1,000 series per evaluation "
        "(input %.1f KiB per 1,000 series; %zu samples parsed, %zu verdicts, wall %.2f s)\n",
        path == 0 ? "text format (embedded)" : "query JSON (prometheus)", parse_cpu * 1e3 * per_k,
        rules_cpu * 1e3 * per_k, (parse_cpu + rules_cpu) * 1e3 * per_k, inputs[0].size() / 1024.0 * 1000.0 / series,
        parsed, verdicts, wall);
    if (parsed != static_cast<size_t>(series) * rounds || verdicts != 0) {
      std::fprintf(stderr, "bench_monitor: unexpected result (parsed %zu, verdicts %zu)\n", parsed, verdicts);
      return 1;
    }
  }
  return 0;
}
