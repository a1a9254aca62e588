// railyard report: the command line of the HTML run report (report.h; docs/observability.md "Report").
#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>

#include "checkpoint/reader.h"
#include "cli/cli.h"
#include "cli/report.h"
#include "common/atomic_file.h"
#include "common/error.h"

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
                      conditions, last restart, last checkpoint, and where the job's time went (status.goodput:
                      a table on the page, and the same lines printed here)
  --checkpoints DIR   the job's checkpoint directory (spec.checkpoint.path): the checkpoints kept
  --prometheus URL    read the job's worker series from this Prometheus (http://HOST:PORT[/PREFIX]) with range
                      queries, instead of or besides logs: needs NAMESPACE/JOB
  --since DURATION    how far back to query, e.g. 90m, 6h, 2d (default 6h)
  --title TEXT        page title (default: the job's namespace/name from --status, else "Training run")
  --output FILE       where to write (default railyard-report.html); the path is printed
)";

// A report command line: the inputs it names and where the page goes.
struct ReportRequest {
  report::Inputs in;  // checkpoint_dir and title from the flags
  std::vector<std::string> logs;
  std::string status_path, output = "railyard-report.html", target, prometheus;
  long long since = 6 * 3600;
};

// --since DURATION: a positive number with s, m, h or d, in seconds.
long long parse_since(const std::string& v) {
  const char unit = v.empty() ? '?' : v.back();
  const long long mult = unit == 's' ? 1 : unit == 'm' ? 60 : unit == 'h' ? 3600 : unit == 'd' ? 86400 : 0;
  const unsigned long long n = mult == 0 ? 0 : parse_count("--since", v.substr(0, v.size() - 1));
  if (mult == 0 || n == 0) throw UsageError{"--since '" + v + "': use a positive number with s, m, h or d (e.g. 6h)"};
  return static_cast<long long>(n) * mult;
}

// nullopt for --help.
std::optional<ReportRequest> parse_report_flags(const Args& args) {
  ReportRequest q;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") return std::nullopt;
    auto value = [&]() -> std::string {
      if (i + 1 >= args.size()) throw UsageError{"report: " + a + " needs a value"};
      return args[++i];
    };
    if (a == "--log") {
      q.logs.push_back(value());
    } else if (a == "--status") {
      q.status_path = value();
    } else if (a == "--checkpoints") {
      q.in.checkpoint_dir = value();
    } else if (a == "--prometheus") {
      q.prometheus = value();
    } else if (a == "--since") {
      q.since = parse_since(value());
    } else if (a == "--title") {
      q.in.title = value();
    } else if (a == "--output") {
      q.output = value();
    } else if (!a.empty() && a[0] == '-') {
      throw UsageError{"report: unknown flag '" + a + "' (railyard report --help)"};
    } else if (q.target.empty() && a.find('/') != std::string::npos) {
      q.target = a;
    } else {
      throw UsageError{"report: unexpected argument '" + a + "': give the run's data with --log, --status and " +
                       "--checkpoints, or NAMESPACE/JOB with --prometheus (railyard report --help)"};
    }
  }
  if (q.target.empty() != q.prometheus.empty()) {
    throw UsageError{"report: NAMESPACE/JOB and --prometheus URL go together"};
  }
  if (q.logs.empty() && q.prometheus.empty()) {
    throw UsageError{
        "report: --log FILE is required (the trainer's --log-json or text log), or NAMESPACE/JOB with "
        "--prometheus URL"};
  }
  return q;
}

// NAMESPACE/JOB's worker series from --prometheus over the last --since, as the first log.
void add_prometheus_log(ReportRequest& q) {
  const size_t slash = q.target.find('/');
  const std::string ns = q.target.substr(0, slash), job = q.target.substr(slash + 1);
  if (ns.empty() || job.empty() || job.find('/') != std::string::npos) {
    throw UsageError{"report: '" + q.target + "' is not NAMESPACE/JOB"};
  }
  const long long now =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  q.in.logs.push_back(report::from_prometheus(q.prometheus, ns, job, q.since, now));
  if (q.in.title.empty()) q.in.title = "TrainingJob " + q.target;
}

// --status FILE: one TrainingJob (a list of exactly one is unwrapped).
nlohmann::json read_training_job(const std::string& status_path) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_file(status_path, "--status"));
  } catch (const nlohmann::json::exception& e) {
    throw Error("--status " + status_path + ": not JSON (" + e.what() + "); write it with kubectl get tj NAME -o json");
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
  return j;
}

// The checkpoints of --checkpoints DIR, temporary ones (a write in progress) left out.
std::vector<report::CheckpointRow> checkpoint_rows(const std::string& dir) {
  if (!std::filesystem::is_directory(dir)) {
    throw Error("--checkpoints " + dir + ": not a directory (give spec.checkpoint.path)");
  }
  std::vector<report::CheckpointRow> rows;
  for (const auto& c : ckpt::list_checkpoints(dir)) {
    if (c.temporary) continue;
    rows.push_back({c.step, c.complete, c.bytes, c.modified, c.problem});
  }
  return rows;
}

std::string utc_now_iso8601() {
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&now, &tm);
  char ts[32];
  std::strftime(ts, sizeof ts, "%FT%TZ", &tm);
  return ts;
}

}  // namespace

int run_report(const Args& args) {
  std::optional<ReportRequest> parsed = parse_report_flags(args);
  if (!parsed) {
    std::cout << kReportUsage;
    return kExitOk;
  }
  ReportRequest& q = *parsed;
  report::Inputs& in = q.in;
  if (!q.target.empty()) add_prometheus_log(q);
  for (const auto& path : q.logs) {
    std::ifstream f(path);
    if (!f) throw Error("--log " + path + ": cannot open");
    in.logs.push_back(report::parse_run_log(f, path));
  }
  if (!q.status_path.empty()) {
    in.status = read_training_job(q.status_path);
    if (in.title.empty()) {
      const auto meta = in.status->value("metadata", nlohmann::json::object());
      in.title = "TrainingJob " + meta.value("namespace", "") + "/" + meta.value("name", "");
    }
  }
  if (in.title.empty()) in.title = "Training run";
  if (!in.checkpoint_dir.empty()) in.checkpoints = checkpoint_rows(in.checkpoint_dir);
  in.generated_at = utc_now_iso8601();
  write_file_atomic(q.output, report::render_html(in));
  std::cout << "report: wrote " << std::filesystem::absolute(q.output).string() << "\n";
  if (in.status)
    for (const std::string& line : report::time_summary(*in.status)) std::cout << line << "\n";
  return kExitOk;
}

}  // namespace railyard::cli
