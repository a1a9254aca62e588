#include "worker/agent/torchrun_launch.h"

#include <dirent.h>

#include <cctype>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <set>

namespace railyard::worker {
namespace {

// The integer that starts at text[pos] (after spaces), or nullopt.
std::optional<long> integer_at(const std::string& text, size_t pos) {
  while (pos < text.size() && text[pos] == ' ') ++pos;
  if (pos >= text.size()) return std::nullopt;
  const char* start = text.c_str() + pos;
  char* end = nullptr;
  const long v = std::strtol(start, &end, 10);
  if (end == start) return std::nullopt;
  return v;
}

// The value after "key" and the next ':' on the same line ("exitcode  : -9 (pid: 1)" -> -9).
std::optional<long> field_after(const std::string& text, size_t from, const std::string& key) {
  const size_t k = text.find(key, from);
  if (k == std::string::npos) return std::nullopt;
  const size_t colon = text.find(':', k + key.size());
  const size_t eol = text.find('\n', k);
  if (colon == std::string::npos || (eol != std::string::npos && colon > eol)) return std::nullopt;
  return integer_at(text, colon + 1);
}

}  // namespace

std::optional<TorchrunFailure> parse_torchrun_failure(const std::string& text) {
  // The summary (torch.distributed.elastic ChildFailedError, 1.9 to 2.x):
  //   Root Cause (first observed failure):
  //   [0]:
  //     time      : 2026-12-05_07:10:11
  //     host      : pod-0
  //     rank      : 3 (local_rank: 1)
  //     exitcode  : -9 (pid: 4242)
  //     error_file: <N/A>
  //     traceback : Signal 9 (SIGKILL) received by PID 4242
  // "Failures:" before it lists the others. When the tail starts inside the root cause, the header is cut off, and
  // the first rank line left is the root cause's.
  const size_t header = text.rfind("Root Cause");
  const size_t from = header == std::string::npos ? 0 : header;
  const size_t rank_line = text.find("local_rank:", from);
  if (rank_line == std::string::npos) return std::nullopt;
  const auto local = integer_at(text, rank_line + std::string("local_rank:").size());
  const auto code = field_after(text, rank_line, "exitcode");
  if (!local || !code || *local < 0 || *local > 4095 || *code < -128 || *code > 255) return std::nullopt;
  TorchrunFailure f;
  f.local_rank = static_cast<int>(*local);
  if (*code < 0) {
    f.exit_code = -1;
    f.signal = static_cast<int>(-*code);
  } else {
    f.exit_code = static_cast<int>(*code);
  }
  return f;
}

std::optional<TorchrunFailure> parse_torchrun_failed_line(const std::string& line) {
  const size_t m = line.find(kTorchrunFailedMarker);
  if (m == std::string::npos) return std::nullopt;
  const auto code = integer_at(line, m + std::string(kTorchrunFailedMarker).size());
  const size_t lr = line.find("local_rank:", m);
  if (!code || lr == std::string::npos) return std::nullopt;
  const auto local = integer_at(line, lr + std::string("local_rank:").size());
  if (!local || *local < 0 || *local > 4095 || *code < -128 || *code > 255) return std::nullopt;
  TorchrunFailure f;
  f.local_rank = static_cast<int>(*local);
  f.exit_code = *code < 0 ? -1 : static_cast<int>(*code);
  f.signal = *code < 0 ? static_cast<int>(-*code) : 0;
  return f;
}

std::vector<ProcessEntry> list_processes() {
  std::vector<ProcessEntry> out;
  DIR* d = ::opendir("/proc");
  if (d == nullptr) return out;
  while (dirent* e = ::readdir(d)) {
    if (!std::isdigit(static_cast<unsigned char>(e->d_name[0]))) continue;
    std::ifstream in(std::string("/proc/") + e->d_name + "/stat");
    std::string stat((std::istreambuf_iterator<char>(in)), {});
    // "pid (comm) S ppid ...": comm may hold spaces and parentheses, so the fields follow the last ')'.
    const size_t close = stat.rfind(')');
    if (close == std::string::npos || close + 4 >= stat.size()) continue;
    const auto ppid = integer_at(stat, close + 4);
    if (!ppid) continue;
    out.push_back({static_cast<pid_t>(std::atol(e->d_name)), static_cast<pid_t>(*ppid)});
  }
  ::closedir(d);
  return out;
}

std::vector<pid_t> descendants(const std::vector<ProcessEntry>& table, pid_t root) {
  std::multimap<pid_t, pid_t> children;
  for (const auto& p : table) children.emplace(p.ppid, p.pid);
  std::vector<pid_t> out;
  std::vector<pid_t> todo = {root};
  std::set<pid_t> seen = {root};
  while (!todo.empty()) {
    const pid_t p = todo.back();
    todo.pop_back();
    auto [lo, hi] = children.equal_range(p);
    for (auto it = lo; it != hi; ++it) {
      if (!seen.insert(it->second).second) continue;  // a table read while processes came and went may loop
      out.push_back(it->second);
      todo.push_back(it->second);
    }
  }
  return out;
}

int local_rank_of(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/environ");
  if (!in) return -1;
  const std::string env((std::istreambuf_iterator<char>(in)), {});
  static const std::string key = "LOCAL_RANK=";
  for (size_t pos = 0; pos < env.size();) {
    const size_t end = env.find('\0', pos);
    const size_t len = (end == std::string::npos ? env.size() : end) - pos;
    if (len > key.size() && env.compare(pos, key.size(), key) == 0) {
      const auto v = integer_at(env.substr(pos + key.size(), len - key.size()), 0);
      return v && *v >= 0 && *v <= 4095 ? static_cast<int>(*v) : -1;
    }
    if (end == std::string::npos) break;
    pos = end + 1;
  }
  return -1;
}

std::vector<pid_t> find_rank_processes(pid_t root, int local_ranks) {
  std::vector<pid_t> ranks(static_cast<size_t>(local_ranks), -1);
  const auto table = list_processes();
  std::map<pid_t, pid_t> parent;
  for (const auto& p : table) parent[p.pid] = p.ppid;
  std::map<pid_t, int> rank_of;
  const auto tree = descendants(table, root);
  for (pid_t p : tree) rank_of[p] = local_rank_of(p);
  for (pid_t p : tree) {
    const int l = rank_of[p];
    if (l < 0 || l >= local_ranks) continue;
    // The topmost process of the rank: its parent is not of the same rank (torchrun, or a shell between).
    const auto up = rank_of.find(parent[p]);
    if (up != rank_of.end() && up->second == l) continue;
    ranks[static_cast<size_t>(l)] = p;
  }
  return ranks;
}

}  // namespace railyard::worker
