// railyard report: the command line of the HTML run report (report.h; docs/observability.md "Report").
#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "checkpoint/reader.h"
#include "common/error.h"
#include "cli/cli.h"
#include "cli/report.h"

namespace railyard::cli {

namespace {

constexpr const char* kReportUsage =
    R"(usage: railyard report --log FILE [--log FILE...] [--status FILE] [--checkpoints DIR]
                       [--title TEXT] [--output FILE.html]
       railyard report NAMESPACE/JOB --prometheus URL [--since DURATION] [--status FILE] [--checkpoints DIR] ...
Writes one self-contained HTML page (inline SVG charts, no scripts, nothing fetched) about a training run:
loss and validation loss, tokens/s, step time, MFU, the step-time split, restarts and generations, checkpoints.
  --log FILE          the trainer's log: the JSON lines of `railyard-worker train --log-json FILE`, or the worker
                      pod's text log (`kubectl logs POD > FILE`); repeat for several ranks (the first is the summary)
  --status FILE       the TrainingJob as JSON (`kubectl get tj NAME -o json > FILE`): phase, restarts, generation,
                      conditions, last restart, last checkpoint
  --checkpoints DIR   the job's checkpoint directory (spec.checkpoint.path): the checkpoints kept
  --prometheus URL    read the job's worker series from this Prometheus (http://HOST:PORT[/PREFIX]) with range
                      queries, instead of or besides logs: needs NAMESPACE/JOB
  --since DURATION    how far back to query, e.g. 90m, 6h, 2d (default 6h)
  --title TEXT        page title (default: the job's namespace/name from --status, else "Training run")
  --output FILE       where to write (default railyard-report.html); the path is printed
)";

}  // namespace

int run_report(const Args& args) {
  report::Inputs in;
  std::vector<std::string> logs;
  std::string status_path, output = "railyard-report.html", target, prometheus;
  long long since = 6 * 3600;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      std::cout << kReportUsage;
      return kExitOk;
    }
    auto value = [&]() -> std::string {
      if (i + 1 >= args.size()) throw UsageError{"report: " + a + " needs a value"};
      return args[++i];
    };
    if (a == "--log") {
      logs.push_back(value());
    } else if (a == "--status") {
      status_path = value();
    } else if (a == "--checkpoints") {
      in.checkpoint_dir = value();
    } else if (a == "--prometheus") {
      prometheus = value();
    } else if (a == "--since") {
      const std::string v = value();
      const char unit = v.empty() ? '?' : v.back();
      const long long mult = unit == 's' ? 1 : unit == 'm' ? 60 : unit == 'h' ? 3600 : unit == 'd' ? 86400 : 0;
      const unsigned long long n = mult == 0 ? 0 : parse_count("--since", v.substr(0, v.size() - 1));
      if (mult == 0 || n == 0)
        throw UsageError{"--since '" + v + "': use a positive number with s, m, h or d (e.g. 6h)"};
      since = static_cast<long long>(n) * mult;
    } else if (a == "--title") {
      in.title = value();
    } else if (a == "--output") {
      output = value();
    } else if (!a.empty() && a[0] == '-') {
      throw UsageError{"report: unknown flag '" + a + "' (railyard report --help)"};
    } else if (target.empty() && a.find('/') != std::string::npos) {
      target = a;
    } else {
      throw UsageError{"report: unexpected argument '" + a + "': give the run's data with --log, --status and " +
                       "--checkpoints, or NAMESPACE/JOB with --prometheus (railyard report --help)"};
    }
  }
  if (target.empty() != prometheus.empty()) throw UsageError{"report: NAMESPACE/JOB and --prometheus URL go together"};
  if (logs.empty() && prometheus.empty()) {
    throw UsageError{
        "report: --log FILE is required (the trainer's --log-json or text log), or NAMESPACE/JOB with "
        "--prometheus URL"};
  }
  if (!target.empty()) {
    const size_t slash = target.find('/');
    const std::string ns = target.substr(0, slash), job = target.substr(slash + 1);
    if (ns.empty() || job.empty() || job.find('/') != std::string::npos) {
      throw UsageError{"report: '" + target + "' is not NAMESPACE/JOB"};
    }
    const long long now =
        std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
    in.logs.push_back(report::from_prometheus(prometheus, ns, job, since, now));
    if (in.title.empty()) in.title = "TrainingJob " + target;
  }

  for (const auto& path : logs) {
    std::ifstream f(path);
    if (!f) throw Error("--log " + path + ": cannot open");
    in.logs.push_back(report::parse_run_log(f, path));
  }
  if (!status_path.empty()) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(read_file(status_path, "--status"));
    } catch (const nlohmann::json::exception& e) {
      throw Error("--status " + status_path + ": not JSON (" + e.what() +
                  "); write it with kubectl get tj NAME -o json");
    }
    if (j.value("kind", "") == "List" || j.value("kind", "") == "TrainingJobList") {
      if (!j.contains("items") || j["items"].size() != 1) {
        throw Error("--status " + status_path + ": a list of " +
                    std::to_string(j.value("items", nlohmann::json::array()).size()) +
                    " objects; give exactly one TrainingJob (kubectl get tj NAME -o json)");
      }
      j = j["items"][0];
    }
    if (j.value("kind", "") != "TrainingJob") {
      throw Error("--status " + status_path + ": kind is '" + j.value("kind", "") +
                  "', expected a TrainingJob (kubectl get tj NAME -o json)");
    }
    in.status = j;
    if (in.title.empty()) {
      const auto meta = j.value("metadata", nlohmann::json::object());
      in.title = "TrainingJob " + meta.value("namespace", "") + "/" + meta.value("name", "");
    }
  }
  if (in.title.empty()) in.title = "Training run";
  if (!in.checkpoint_dir.empty()) {
    if (!std::filesystem::is_directory(in.checkpoint_dir)) {
      throw Error("--checkpoints " + in.checkpoint_dir + ": not a directory (give spec.checkpoint.path)");
    }
    for (const auto& c : ckpt::list_checkpoints(in.checkpoint_dir)) {
      if (c.temporary) continue;
      in.checkpoints.push_back({c.step, c.complete, c.bytes, c.modified, c.problem});
    }
  }
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&now, &tm);
  char ts[32];
  std::strftime(ts, sizeof ts, "%FT%TZ", &tm);
  in.generated_at = ts;
  write_file_atomic(output, report::render_html(in));
  std::cout << "report: wrote " << std::filesystem::absolute(output).string() << "\n";
  return kExitOk;
}

}  // namespace railyard::cli
