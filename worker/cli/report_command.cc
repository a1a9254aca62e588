// railyard report: the command line of the HTML run report (report.h; docs/observability.md "Report").
#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "checkpoint/reader.h"
#include "common/error.h"
#include "worker/cli/cli.h"
#include "worker/cli/report.h"

namespace railyard::cli {

namespace {

constexpr const char* kReportUsage =
    R"(usage: railyard report --log FILE [--log FILE...] [--status FILE] [--checkpoints DIR]
                       [--title TEXT] [--output FILE.html]
Writes one self-contained HTML page (inline SVG charts, no scripts, nothing fetched) about a training run:
loss and validation loss, tokens/s, step time, MFU, the step-time split, restarts and generations, checkpoints.
  --log FILE          the trainer's log: the JSON lines of `railyard-worker train --log-json FILE`, or the worker
                      pod's text log (`kubectl logs POD > FILE`); repeat for several ranks (the first is the summary)
  --status FILE       the TrainingJob as JSON (`kubectl get tj NAME -o json > FILE`): phase, restarts, generation,
                      conditions, last restart, last checkpoint
  --checkpoints DIR   the job's checkpoint directory (spec.checkpoint.path): the checkpoints kept
  --title TEXT        page title (default: the job's namespace/name from --status, else "Training run")
  --output FILE       where to write (default railyard-report.html); the path is printed
)";

}  // namespace

int run_report(const Args& args) {
  report::Inputs in;
  std::vector<std::string> logs;
  std::string status_path, output = "railyard-report.html";
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
    } else if (a == "--title") {
      in.title = value();
    } else if (a == "--output") {
      output = value();
    } else if (!a.empty() && a[0] == '-') {
      throw UsageError{"report: unknown flag '" + a + "' (railyard report --help)"};
    } else {
      throw UsageError{"report: unexpected argument '" + a + "': give the run's data with --log, --status and " +
                       "--checkpoints (railyard report --help)"};
    }
  }
  if (logs.empty()) throw UsageError{"report: --log FILE is required (the trainer's --log-json or text log)"};

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
      in.title = "TrainingJob " + j["metadata"].value("namespace", "") + "/" + j["metadata"].value("name", "");
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
