#include "deploy/local/node_agent/supervisor.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "common/log.h"

namespace railyard::node_agent {
namespace {

constexpr auto kPollInterval = std::chrono::milliseconds(20);

void make_dirs(const std::string& dir, const char* what) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw SpawnError(std::string("cannot create ") + what + " " + dir + ": " + ec.message());
}

// Child side of fork: only async-signal-safe calls from here on.
[[noreturn]] void child_exec(int log_fd, int err_fd, const char* cwd, char* const argv[], char* const envp[],
                             pid_t parent) {
  auto report = [&](int code) {
    int e = errno;
    (void)code;
    ssize_t n = ::write(err_fd, &e, sizeof e);
    (void)n;
    ::_exit(127);
  };
  ::setsid();
  // If the agent dies (even by SIGKILL), the pod's main process goes with it instead of running unsupervised.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(127);
  // Undo what the agent may have changed so the pod starts with default signal handling.
  sigset_t all;
  sigemptyset(&all);
  ::sigprocmask(SIG_SETMASK, &all, nullptr);
  for (int s = 1; s < NSIG; ++s) ::signal(s, SIG_DFL);
  int devnull = ::open("/dev/null", O_RDONLY);
  if (devnull < 0 || ::dup2(devnull, 0) < 0 || ::dup2(log_fd, 1) < 0 || ::dup2(log_fd, 2) < 0) report(1);
  if (::chdir(cwd) != 0) report(2);
  // Close everything else except the error pipe (close-on-exec) so pods don't inherit the agent's sockets.
  for (int fd = 3; fd < 1024; ++fd) {
    if (fd != err_fd) ::close(fd);
  }
  ::execvpe(argv[0], argv, envp);
  report(3);
  ::_exit(127);
}

}  // namespace

std::string describe(const ExitStatus& s) {
  if (!s.signaled) return "exited with code " + std::to_string(s.code);
  const char* abbrev = sigabbrev_np(s.signal);
  return "killed by signal " + std::to_string(s.signal) + (abbrev ? std::string(" (SIG") + abbrev + ")" : "");
}

Supervisor::Supervisor(ExitCallback on_exit) : on_exit_(std::move(on_exit)) {
  monitor_ = std::thread([this] { monitor_loop(); });
}

Supervisor::~Supervisor() {
  stop_all(std::chrono::seconds(2));
  {
    std::lock_guard<std::mutex> l(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  monitor_.join();
}

pid_t Supervisor::start(const std::string& key, const SpawnSpec& spec) {
  if (spec.argv.empty()) throw SpawnError("empty command");
  {
    std::lock_guard<std::mutex> l(mu_);
    if (procs_.count(key)) throw SpawnError("a process for " + key + " is still running");
  }
  make_dirs(spec.working_dir, "working directory");
  make_dirs(std::filesystem::path(spec.log_path).parent_path().string(), "log directory");
  int log_fd = ::open(spec.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) throw SpawnError("cannot open log file " + spec.log_path + ": " + std::strerror(errno));
  int pipefd[2];
  if (::pipe2(pipefd, O_CLOEXEC) != 0) {
    int e = errno;
    ::close(log_fd);
    throw SpawnError(std::string("pipe: ") + std::strerror(e));
  }
  // Everything the child needs is prepared before fork: the child may only make async-signal-safe calls.
  std::vector<std::string> env_strings;
  for (const auto& [k, v] : spec.env) env_strings.push_back(k + "=" + v);
  std::vector<char*> argv, envp;
  for (const auto& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);

  pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) {
    int e = errno;
    ::close(log_fd);
    ::close(pipefd[0]);
    ::close(pipefd[1]);
    throw SpawnError(std::string("fork: ") + std::strerror(e));
  }
  if (pid == 0) child_exec(log_fd, pipefd[1], spec.working_dir.c_str(), argv.data(), envp.data(), parent);
  ::close(log_fd);
  ::close(pipefd[1]);
  // The pipe closes on a successful exec (EOF) or carries the child's errno.
  int child_errno = 0;
  ssize_t n;
  do {
    n = ::read(pipefd[0], &child_errno, sizeof child_errno);
  } while (n < 0 && errno == EINTR);
  ::close(pipefd[0]);
  if (n == static_cast<ssize_t>(sizeof child_errno)) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    throw SpawnError("cannot run " + spec.argv[0] + " (in " + spec.working_dir + "): " + std::strerror(child_errno));
  }
  std::lock_guard<std::mutex> l(mu_);
  procs_[key] = Proc{pid, std::nullopt};
  return pid;
}

bool Supervisor::signal(const std::string& key, int sig) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = procs_.find(key);
  if (it == procs_.end()) return false;
  return ::kill(-it->second.pid, sig) == 0;
}

bool Supervisor::terminate(const std::string& key, std::chrono::milliseconds grace) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = procs_.find(key);
  if (it == procs_.end()) return false;
  ::kill(-it->second.pid, SIGTERM);
  ::kill(-it->second.pid, SIGCONT);
  auto deadline = std::chrono::steady_clock::now() + grace;
  if (!it->second.kill_at || *it->second.kill_at > deadline) it->second.kill_at = deadline;
  return true;
}

std::optional<pid_t> Supervisor::pid(const std::string& key) const {
  std::lock_guard<std::mutex> l(mu_);
  auto it = procs_.find(key);
  if (it == procs_.end()) return std::nullopt;
  return it->second.pid;
}

bool Supervisor::running(const std::string& key) const { return pid(key).has_value(); }

std::vector<std::string> Supervisor::keys() const {
  std::lock_guard<std::mutex> l(mu_);
  std::vector<std::string> out;
  for (const auto& [k, p] : procs_) out.push_back(k);
  return out;
}

bool Supervisor::wait(const std::string& key, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> l(mu_);
  return cv_.wait_for(l, timeout, [&] { return procs_.count(key) == 0; });
}

void Supervisor::stop_all(std::chrono::milliseconds grace) {
  for (const auto& k : keys()) terminate(k, grace);
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait_for(l, grace + std::chrono::seconds(2), [&] { return procs_.empty(); });
}

void Supervisor::monitor_loop() {
  std::unique_lock<std::mutex> l(mu_);
  while (!stopping_) {
    std::vector<std::tuple<std::string, pid_t, ExitStatus>> ended;
    auto now = std::chrono::steady_clock::now();
    for (auto it = procs_.begin(); it != procs_.end();) {
      Proc& p = it->second;
      if (p.kill_at && now >= *p.kill_at) {
        ::kill(-p.pid, SIGKILL);
        p.kill_at.reset();
      }
      // Peek without reaping, so the group id cannot be reused before the rest of the group is killed.
      siginfo_t info{};
      if (::waitid(P_PID, static_cast<id_t>(p.pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == p.pid) {
        ::kill(-p.pid, SIGKILL);
        int status = 0;
        ::waitpid(p.pid, &status, 0);
        ExitStatus s;
        s.finished_at = std::chrono::system_clock::now();
        if (WIFSIGNALED(status)) {
          s.signaled = true;
          s.signal = WTERMSIG(status);
          s.code = 128 + s.signal;
        } else {
          s.code = WEXITSTATUS(status);
        }
        ended.emplace_back(it->first, p.pid, s);
        it = procs_.erase(it);
      } else {
        ++it;
      }
    }
    if (!ended.empty()) {
      cv_.notify_all();
      if (on_exit_) {
        l.unlock();
        for (const auto& [key, pid, s] : ended) {
          try {
            on_exit_(key, pid, s);
          } catch (const std::exception& e) {
            log::error("supervisor", "exit handler failed", {{"key", key}, {"error", e.what()}});
          }
        }
        l.lock();
      }
    }
    cv_.wait_for(l, kPollInterval, [&] { return stopping_; });
  }
}

}  // namespace railyard::node_agent
