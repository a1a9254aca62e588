// `railyard report`: a self-contained HTML page about one training run (inline SVG charts, no scripts, no external
// assets), from what a user has after the run: the trainer's log (JSON lines of `--log-json`, or the text log that
// `kubectl logs` shows), the TrainingJob's status (`kubectl get tj NAME -o json`) and the checkpoint directory.
#pragma once

#include <cstdint>
#include <ctime>
#include <istream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace railyard::cli::report {

// One optimizer step as the trainer logged it; NaN where the log has no value (null loss, a text log without MFU).
struct StepPoint {
  int64_t step = 0;  // 1-based, as logged
  double loss = 0, tokens_per_s = 0, step_ms = 0, mfu = 0, lr = 0, grad_norm = 0;
  // compute / tensor-parallel comm / pipeline wait / data-parallel comm / optimizer, milliseconds (NaN if not logged)
  double split_ms[5] = {0, 0, 0, 0, 0};
};

struct ValPoint {
  int64_t step = 0;
  double val_loss = 0;
};

// A text sample the trainer drew (--sample-every, spec.training.sampleEvery).
struct SamplePoint {
  int64_t step = 0;
  std::string text;
};

// One uninterrupted stretch of training. A new one starts when the log's step goes back or does not advance (the
// run restarted from a checkpoint and replays steps) or when the text log shows a new generation or a restore.
struct Segment {
  int64_t first_step = 0, last_step = 0;
  size_t steps = 0;   // steps logged in this segment
  std::string start;  // why it started: "start", "restart (step went back from 12 to 9)", "generation 3", ...
};

struct RunLog {
  std::string name;  // the file it came from
  std::vector<StepPoint> steps;
  std::vector<ValPoint> val;
  std::vector<SamplePoint> samples;
  std::vector<Segment> segments;
  int64_t total_steps = 0;  // from a text log's step=N/TOTAL (0 if unknown)
};

// Parses a trainer log: each line is a --log-json object, a text log line of the trainer ("worker: step",
// "worker: validation", "worker: sample", "checkpoint: restored") or of the agent ("agent: joined generation=N"), or anything else
// (ignored). Throws railyard::Error naming name:line for a malformed JSON line or a log without a single step.
RunLog parse_run_log(std::istream& in, const std::string& name);

// Appends one step to log, opening a new segment (started by `start`) when start is non-empty, when the log has none
// yet, or when the step does not advance (named "restart (step went back ...)").
void append_step(RunLog& log, const StepPoint& p, std::string start = "");

// The same from Prometheus: range queries over [now - since_seconds, now] of the job's worker series (the Grafana
// training dashboard's expressions), one point per new value of the step gauge; a change of railyard_agent_generation
// opens a segment. Throws railyard::Error naming the URL (unreachable, not Prometheus, no series for the job).
RunLog from_prometheus(const std::string& url, const std::string& ns, const std::string& job, long long since_seconds,
                       long long now);

struct CheckpointRow {
  int64_t step = 0;
  bool complete = false;
  uint64_t bytes = 0;
  std::time_t modified = 0;
  std::string problem;
};

struct Inputs {
  std::string title;
  std::vector<RunLog> logs;
  std::optional<nlohmann::json> status;  // a TrainingJob object (metadata, spec, status)
  std::string checkpoint_dir;
  std::vector<CheckpointRow> checkpoints;
  std::string generated_at;  // UTC, ISO 8601
};

// One row of a TrainingJob's goodput ledger (status.goodput, common/goodput.h): the seconds of one cause up to the
// ledger's last update and its share of the wall time.
struct TimeRow {
  std::string cause, what;
  double seconds = 0, share = 0;
};
// The ledger's rows in common/goodput.h's order (causes with no time left out), and its wall time; empty when the
// object has no status.goodput.
std::vector<TimeRow> time_rows(const nlohmann::json& training_job, double* wall_seconds = nullptr);
// The ledger as lines for a terminal: "where the time went (status.goodput, as of SINCE): W s", then one line per
// cause; empty without a ledger.
std::vector<std::string> time_summary(const nlohmann::json& training_job);

// The whole page. Deterministic for given inputs.
std::string render_html(const Inputs& in);

}  // namespace railyard::cli::report
