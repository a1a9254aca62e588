#include "worker/agent/worker_reports.h"

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <string_view>

#include "common/log.h"
#include "common/log_tail.h"
#include "worker/agent/torchrun_launch.h"

namespace railyard::worker {
namespace {

using Outcome = RendezvousClient::Outcome;
constexpr const char* kComponent = "agent";
// How long a failed rank's exit report waits for its last output to pass through the pipes (they close at once unless
// something the rank started still holds them).
constexpr std::chrono::milliseconds kLastWordsWait{500};

double unix_now() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

}  // namespace

std::optional<ProcessStat> process_stat(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  if (!in) return std::nullopt;
  std::string stat((std::istreambuf_iterator<char>(in)), {});
  // "pid (comm) S ppid ...": comm may hold spaces and parentheses, so the fields follow the last ')'. After it: state
  // (field 3), then fields 4..; utime and stime are fields 14 and 15, in clock ticks.
  const size_t close = stat.rfind(')');
  if (close == std::string::npos || close + 2 >= stat.size()) return std::nullopt;
  ProcessStat ps;
  const char state = stat[close + 2];
  ps.stopped = state == 'T' || state == 't';
  std::istringstream fields(stat.substr(close + 2));
  std::string f;
  unsigned long long used = 0;  // utime, stime, cutime, cstime: fields 14-17
  for (int field = 3; field <= 17 && (fields >> f); ++field)
    if (field >= 14) used += std::strtoull(f.c_str(), nullptr, 10);
  static const long ticks = ::sysconf(_SC_CLK_TCK) > 0 ? ::sysconf(_SC_CLK_TCK) : 100;
  ps.cpu_seconds = static_cast<double>(used) / static_cast<double>(ticks);
  return ps;
}

std::optional<double> tree_cpu_seconds(pid_t pid, const std::vector<ProcessEntry>& table) {
  auto own = process_stat(pid);
  if (!own) return std::nullopt;
  double total = own->cpu_seconds;
  for (pid_t d : descendants(table, pid))
    if (auto c = process_stat(d)) total += c->cpu_seconds;
  return total;
}

std::optional<bool> process_stopped(pid_t pid) {
  auto ps = process_stat(pid);
  return ps ? std::optional<bool>(ps->stopped) : std::nullopt;
}

WorkerReports::WorkerReports(RendezvousClient& client, rdzv::JobRef ref, RankExporter* ranks_out, OutputWatch* output)
    : client_(client), ref_(std::move(ref)), ranks_out_(ranks_out), output_(output) {}

void WorkerReports::start_generation(int64_t generation) {
  generation_ = generation;
  pending_.clear();
  if (hangs_) hangs_->start_generation();
}

void WorkerReports::exited(const Worker& w, const char* reason) {
  rdzv::ExitReport rep{ref_, generation_, w.local_rank, w.exit_code, w.signal, reason};
  // Why it failed, in its own words: the operator puts them into the job's status (the pod's log may be gone by the
  // time someone looks). A stopped rank was stopped by the agent: its output says nothing about the job.
  const bool failed = w.exit_code != 0 || w.signal != 0;
  if (torchrun_ranks_ > 0) {
    if (!failed || std::string_view(reason) != rdzv::kExitExited) {
      for (int l = 0; l < torchrun_ranks_; ++l) {
        rep.local_rank = l;
        pending_.push_back(rep);
      }
      return;
    }
    // torchrun's tail is longer than a rank's (its summary is about ten lines); the report carries its end.
    const std::string words = output_ ? output_->last_words(0, kLastWordsWait) : std::string();
    if (auto f = parse_torchrun_failure(words); f && f->local_rank < torchrun_ranks_) {
      rep.local_rank = f->local_rank;
      rep.exit_code = f->exit_code;
      rep.signal = f->signal;
    }
    rep.message = sanitize_message(words, LogTail::kDefaultBytes, true);
    pending_.push_back(std::move(rep));
    return;
  }
  if (output_ && failed && std::string_view(reason) == rdzv::kExitExited)
    rep.message = output_->last_words(w.local_rank, kLastWordsWait);
  pending_.push_back(std::move(rep));
}

void WorkerReports::rank_failed(int local_rank, int exit_code, int signal, std::string message) {
  rdzv::ExitReport rep{ref_, generation_, local_rank, exit_code, signal, rdzv::kExitExited};
  rep.message = std::move(message);
  pending_.push_back(std::move(rep));
}

void WorkerReports::hung(const Worker& w, const HangVerdict& v) {
  log::error(kComponent, "rank hung",
             {{"local_rank", std::to_string(w.local_rank)},
              {"rank", std::to_string(w.global_rank)},
              {"rule", v.rule},
              {"evidence", v.message}});
  rdzv::ExitReport rep{ref_, generation_, w.local_rank, 0, 0, rdzv::kExitHung};
  rep.message = v.message;
  rep.onset = v.onset;
  pending_.push_back(std::move(rep));
}

void WorkerReports::flush() {
  std::vector<rdzv::ExitReport> keep;
  bool reachable = true;
  for (const auto& rep : pending_) {
    if (!reachable) {
      keep.push_back(rep);
      continue;
    }
    try {
      auto r = client_.report_exit(rep);
      if (r.outcome == Outcome::UnknownJob) keep.push_back(rep);  // delivered once the job is re-opened
    } catch (const RendezvousUnavailable& e) {
      log::warn(kComponent, "exit report not delivered yet", {{"error", e.what()}});
      keep.push_back(rep);
      reachable = false;
    } catch (const ConfigError& e) {
      log::error(kComponent, std::string("exit report refused: ") + e.what());
    }
  }
  pending_ = std::move(keep);
}

void WorkerReports::forward_progress(std::vector<Worker>& workers) {
  // One process table per poll for every rank's CPU time (a pod's is small: the agent and its ranks' trees).
  const std::vector<ProcessEntry> table = ranks_out_ ? list_processes() : std::vector<ProcessEntry>{};
  for (auto& w : workers) {
    if (output_ && ranks_out_)
      ranks_out_->on_output(w.local_rank, output_->last_output(torchrun_ranks_ > 0 ? 0 : w.local_rank));
    // A rank that exited is not hung (its exit is reported as such): it never counts as idle.
    if (ranks_out_ && !w.running) ranks_out_->on_process_cpu(w.local_rank, -1, unix_now());
    RankSight sight;
    sight.now = unix_now();
    sight.running = w.running && w.pid > 0;
    if (sight.running) {
      if (auto ps = process_stat(w.pid)) {
        sight.stopped = ps->stopped;
        // A program's rank may compute in children (a shell, DataLoader workers): its tree's CPU time; a trainer's
        // threads are its own.
        sight.cpu_seconds = ranks_out_ ? tree_cpu_seconds(w.pid, table) : std::optional<double>(ps->cpu_seconds);
        if (ranks_out_) {
          ranks_out_->on_process_state(w.local_rank, ps->stopped, sight.now);
          if (sight.cpu_seconds) ranks_out_->on_process_cpu(w.local_rank, *sight.cpu_seconds, sight.now);
        }
      }
    }
    std::optional<ProgressRecord> p;
    double written = 0;
    if (std::ifstream in(w.progress_file); in) {
      p = parse_progress(std::string(std::istreambuf_iterator<char>(in), {}));
      struct stat st {};
      written = ::stat(w.progress_file.c_str(), &st) == 0
                    ? static_cast<double>(st.st_mtim.tv_sec) + st.st_mtim.tv_nsec * 1e-9
                    : sight.now;
    }
    if (p) {
      sight.step = p->step;
      sight.paused = p->paused;
      sight.written = written;
    }
    if (hangs_) {
      if (auto v = hangs_->observe(w.local_rank, sight)) hung(w, *v);
    }
    if (!p || p->step == w.last_step) continue;
    if (ranks_out_) ranks_out_->on_progress(w.local_rank, *p, written);
    if (p->has_loss && !std::isfinite(p->loss)) {
      // Not a number the job's status can show: the monitor's non-finite rule acts on it (from the series above).
      w.last_step = p->step;
      continue;
    }
    rdzv::ProgressReport rep;
    rep.ref = ref_;
    rep.generation = generation_;
    rep.local_rank = w.local_rank;
    rep.step = p->step;
    rep.loss = p->has_loss ? p->loss : 0.0;
    rep.tokens_per_second = p->tokens_per_second;
    rep.checkpoint_stall_seconds = p->checkpoint_stall_seconds;
    rep.restore_seconds = p->restore_seconds;
    try {
      client_.report_progress(rep);
      w.last_step = p->step;
    } catch (const std::exception& e) {
      log::debug(kComponent, "progress report failed", {{"error", e.what()}});
    }
  }
}

}  // namespace railyard::worker
