// The launcher's overhead on a program's step time (issue #25): the PyTorch example (deploy/examples/pytorch,
// two ranks over gloo on this machine) started three ways, in alternating order per round:
//   railyard  `railyard-worker agent -- python3 train_gpt.py` against a rendezvous service in this process, as a
//             program's pod runs it (RAILYARD_AGENT_RANK_METRICS=1: output through the agent's pipes, the ranks'
//             series served from their progress files);
//   torchrun  torch.distributed.run --standalone --nproc_per_node 2 (deploy/examples/pytorch/torchrun: Debian
//             12's torch 1.13 with its Python 3.11 start-up bug worked around, nothing else changed);
//   bare      two python3 processes started with the same variables by hand (no launcher at all);
//   railyard-noprogress  railyard with the script's --no-progress: the launcher alone, without the progress files
//             the script writes only under Railyard (torchrun and bare give it no RAILYARD_PROGRESS_FILE).
// The measure is the script's own: rank 0's "trained steps A..B in X s (Y ms/step)", steady-state training without
// the interpreter's start-up and the rendezvous. Prints per-round times, medians, and the ratios with their spread.
// Usage: bench_program_launcher [--rounds N] [--steps S] [--python PY] [--modes a,b,..]  (docs/benchmarks.md)
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "operator/rendezvous/rendezvous.h"

namespace fs = std::filesystem;

namespace {

const std::string kToken = "bench-launcher-token-0123456789abcdef";

struct Env {
  std::map<std::string, std::string> vars;
  std::vector<std::string> flat() const {
    std::vector<std::string> out;
    for (const auto& [k, v] : vars) out.push_back(k + "=" + v);
    return out;
  }
};

Env base_env(const fs::path& dir) {
  Env e;
  for (const char* k : {"PATH", "HOME", "LANG"})
    if (const char* v = std::getenv(k)) e.vars[k] = v;
  e.vars["OMP_NUM_THREADS"] = "1";
  e.vars["RAILYARD_CHECKPOINT_DIR"] = (dir / "ckpt").string();
  e.vars["RAILYARD_CHECKPOINT_INTERVAL_STEPS"] = "20";
  return e;
}

pid_t spawn(const std::vector<std::string>& argv_s, const Env& env, const fs::path& out) {
  std::vector<std::string> envs = env.flat();
  std::vector<char*> argv, envp;
  for (const auto& a : argv_s) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (auto& e : envs) envp.push_back(e.data());
  envp.push_back(nullptr);
  const std::string out_s = out.string();
  pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    int fd = ::open(out_s.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      if (fd > 2) ::close(fd);
    }
    ::execvpe(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  return pid;
}

int wait_exit(pid_t pid, double seconds) {
  auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < until) {
    int st = 0;
    if (::waitpid(pid, &st, WNOHANG) == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  return -1;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// ms/step from rank 0's last line; throws with the log's tail when it is missing.
double ms_per_step(const fs::path& log, const std::string& mode) {
  const std::string text = slurp(log);
  std::smatch m;
  static const std::regex line(R"(trained steps \d+\.\.\d+ in [0-9.]+ s \(([0-9.]+) ms/step\))");
  if (!std::regex_search(text, m, line))
    throw std::runtime_error(mode + ": no 'trained steps' line in " + log.string() + ":\n" +
                             text.substr(text.size() > 1500 ? text.size() - 1500 : 0));
  return std::stod(m[1]);
}

struct Setup {
  std::string python = "/usr/bin/python3";  // Debian's, with python3-torch (scripts/install-deps.sh --with-torch)
  std::string script, torchrun, worker;
  int steps = 1000;
};

std::vector<std::string> script_args(const Setup& s) { return {s.script, "--steps", std::to_string(s.steps)}; }

double run_bare(const Setup& s, const fs::path& dir, int port) {
  std::vector<pid_t> pids;
  for (int r = 0; r < 2; ++r) {
    Env e = base_env(dir);
    e.vars["MASTER_ADDR"] = "127.0.0.1";
    e.vars["MASTER_PORT"] = std::to_string(port);
    e.vars["RANK"] = e.vars["LOCAL_RANK"] = std::to_string(r);
    e.vars["WORLD_SIZE"] = e.vars["LOCAL_WORLD_SIZE"] = "2";
    std::vector<std::string> argv = {s.python};
    for (const auto& a : script_args(s)) argv.push_back(a);
    pids.push_back(spawn(argv, e, dir / ("bare-" + std::to_string(r) + ".log")));
  }
  for (pid_t p : pids)
    if (wait_exit(p, 600) != 0) throw std::runtime_error("bare: a rank failed; see " + dir.string());
  return ms_per_step(dir / "bare-0.log", "bare");
}

double run_torchrun(const Setup& s, const fs::path& dir, int port) {
  std::vector<std::string> argv = {s.python, s.torchrun,      "--standalone",      "--nproc_per_node",
                                   "2",      "--master_port", std::to_string(port)};
  for (const auto& a : script_args(s)) argv.push_back(a);
  pid_t p = spawn(argv, base_env(dir), dir / "torchrun.log");
  if (wait_exit(p, 600) != 0) throw std::runtime_error("torchrun failed; see " + (dir / "torchrun.log").string());
  return ms_per_step(dir / "torchrun.log", "torchrun");
}

double run_railyard(const Setup& s, const fs::path& dir, int metrics_port, int round, bool progress) {
  railyard::op::RendezvousService svc("127.0.0.1", 0);
  railyard::op::GenerationSpec g;
  g.job_key = "bench/launcher-" + std::to_string(round);
  g.generation = 1;
  g.pods = {"pod0"};
  g.procs_per_pod = 2;
  g.token = kToken;
  svc.open_generation(g);
  Env e = base_env(dir);
  e.vars["RAILYARD_JOB_NAMESPACE"] = "bench";
  e.vars["RAILYARD_JOB_NAME"] = "launcher-" + std::to_string(round);
  e.vars["RAILYARD_POD_NAME"] = "pod0";
  e.vars["RAILYARD_POD_IP"] = "127.0.0.1";
  e.vars["RAILYARD_RENDEZVOUS_ADDR"] = "127.0.0.1:" + std::to_string(svc.port());
  e.vars["RAILYARD_RENDEZVOUS_TOKEN"] = kToken;
  e.vars["RAILYARD_PROCS_PER_POD"] = "2";
  e.vars["RAILYARD_AGENT_DIR"] = (dir / "agent").string();
  e.vars["RAILYARD_AGENT_PEER_PORT"] = "-1";
  e.vars["RAILYARD_AGENT_RANK_METRICS"] = "1";
  e.vars["RAILYARD_METRICS_PORT"] = std::to_string(metrics_port);
  std::vector<std::string> argv = {s.worker, "agent", "--", s.python};
  for (const auto& a : script_args(s)) argv.push_back(a);
  if (!progress) argv.push_back("--no-progress");
  pid_t p = spawn(argv, e, dir / "railyard.log");
  if (wait_exit(p, 600) != 0) throw std::runtime_error("railyard agent failed; see " + (dir / "railyard.log").string());
  return ms_per_step(dir / "railyard.log", "railyard");
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace

int main(int argc, char** argv) {
  Setup s;
  int rounds = 5;
  std::vector<std::string> modes = {"railyard", "railyard-noprogress", "torchrun", "bare"};
  const fs::path exe = fs::read_symlink("/proc/self/exe");
  const fs::path src = RAILYARD_SOURCE_DIR;
  s.script = (src / "deploy/examples/pytorch/train_gpt.py").string();
  s.torchrun = (src / "deploy/examples/pytorch/torchrun").string();
  s.worker = (exe.parent_path() / "railyard-worker").string();
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--rounds")
      rounds = std::stoi(value());
    else if (a == "--steps")
      s.steps = std::stoi(value());
    else if (a == "--python")
      s.python = value();
    else if (a == "--modes") {
      modes.clear();
      std::stringstream in(value());
      for (std::string m; std::getline(in, m, ',');) modes.push_back(m);
    } else {
      std::fprintf(stderr, "usage: bench_program_launcher [--rounds N] [--steps S] [--python PY] [--modes a,b,..]\n");
      return 2;
    }
  }
  char tmpl[] = "/tmp/bench-launcher-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) return 1;
  const fs::path root = tmpl;
  std::printf("bench_program_launcher: %d rounds, %d steps, 2 ranks (gloo, OMP_NUM_THREADS=1), %s\n", rounds, s.steps,
              s.script.c_str());
  std::map<std::string, std::vector<double>> ms;
  std::map<std::string, std::vector<double>> ratios;
  const int port0 = 29600 + (::getpid() % 200) * 3;
  try {
    for (int r = 0; r < rounds; ++r) {
      std::map<std::string, double> this_round;
      for (size_t k = 0; k < modes.size(); ++k) {
        const std::string& mode = modes[(k + r) % modes.size()];  // rotate the order: no mode always runs first
        const fs::path dir = root / (mode + "-" + std::to_string(r));
        fs::create_directories(dir);
        double v;
        if (mode == "bare")
          v = run_bare(s, dir, port0 + r % 3);
        else if (mode == "torchrun")
          v = run_torchrun(s, dir, port0 + 3 + r % 3);
        else if (mode == "railyard" || mode == "railyard-noprogress")
          v = run_railyard(s, dir, port0 + 600 + 2 * (r % 3), static_cast<int>(r * modes.size() + k),
                           mode == "railyard");
        else
          throw std::runtime_error("unknown mode '" + mode + "' (railyard, railyard-noprogress, torchrun, bare)");
        this_round[mode] = v;
        ms[mode].push_back(v);
        std::printf("round %d %-19s %.2f ms/step\n", r + 1, mode.c_str(), v);
        std::fflush(stdout);
      }
      for (const auto& m : modes)
        for (const auto& base : {"torchrun", "bare"})
          if (m.rfind("railyard", 0) == 0 && this_round.count(base))
            ratios[m + " / " + base].push_back(this_round[m] / this_round[base]);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_program_launcher: %s\n", e.what());
    return 1;
  }
  for (const auto& m : modes) {
    auto v = ms[m];
    std::printf("%-19s median %.2f ms/step (min %.2f, max %.2f)\n", m.c_str(), median(v),
                *std::min_element(v.begin(), v.end()), *std::max_element(v.begin(), v.end()));
  }
  for (const auto& [what, v] : ratios)
    std::printf("%-30s median %.4f (per-round %.4f .. %.4f)\n", what.c_str(), median(v),
                *std::min_element(v.begin(), v.end()), *std::max_element(v.begin(), v.end()));
  std::error_code ec;
  fs::remove_all(root, ec);
  return 0;
}
