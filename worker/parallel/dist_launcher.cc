#include "worker/parallel/dist_launcher.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/log.h"
#include "common/pod_env.h"

extern char** environ;

namespace railyard::worker::parallel {

namespace {

volatile sig_atomic_t g_signal = 0;
int g_signal_pipe[2] = {-1, -1};

void on_signal(int sig) {
  g_signal = sig;
  const int saved = errno;
  [[maybe_unused]] ssize_t n = write(g_signal_pipe[1], "s", 1);
  errno = saved;
}

void write_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t n = write(fd, s.data() + off, s.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // our own stdout is gone: nothing sensible left to do with the text
    off += static_cast<size_t>(n);
  }
}

struct Stream {
  int fd = -1;
  int out = 1;  // where the prefixed lines go
  std::string buf;
};

struct Child {
  int rank = 0;
  pid_t pid = -1;
  bool exited = false;
  int code = 0;
  Stream streams[2];
};

// Emits the complete lines of s.buf (all of it at EOF) with the rank prefix.
void flush_lines(Stream& s, const std::string& prefix, bool eof) {
  size_t start = 0;
  for (size_t nl; (nl = s.buf.find('\n', start)) != std::string::npos; start = nl + 1) {
    write_all(s.out, prefix + s.buf.substr(start, nl + 1 - start));
  }
  s.buf.erase(0, start);
  if (eof && !s.buf.empty()) {
    write_all(s.out, prefix + s.buf + "\n");
    s.buf.clear();
  }
}

int exit_code(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

int default_grace_ms() {
  long ms = 30000;
  if (const char* t = std::getenv(pod_env::kCommTimeoutMs); t != nullptr && *t != '\0') ms = std::atol(t);
  return static_cast<int>(std::max(0L, ms) + 5000);
}

}  // namespace

int free_port(const std::string& host) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw Error(std::string("free_port: socket: ") + std::strerror(errno));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = 0;
  if (inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1) {
    close(fd);
    throw ConfigError("MASTER_ADDR '" + host + "' is not an IPv4 address");
  }
  socklen_t len = sizeof(a);
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    const std::string err = std::strerror(errno);
    close(fd);
    throw Error("free_port: cannot bind " + host + ":0: " + err);
  }
  close(fd);
  return ntohs(a.sin_port);
}

namespace {

// The launcher's environment less the variables that place a rank in the world (each rank gets its own).
std::vector<std::string> inherited_env() {
  std::vector<std::string> base_env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv = *e;
    const std::string key = kv.substr(0, kv.find('='));
    if (key == pod_env::kRank || key == pod_env::kLocalRank || key == pod_env::kWorldSize ||
        key == pod_env::kLocalWorldSize || key == pod_env::kMasterAddr || key == pod_env::kMasterPort) {
      continue;
    }
    base_env.push_back(kv);
  }
  return base_env;
}

// The null-terminated array execve takes; it points into `strings`, which must outlive it unchanged.
std::vector<char*> exec_array(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (auto& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

// The handlers that SIGINT and SIGTERM had before the launcher's, put back by restore_signals.
struct SavedSignals {
  struct sigaction old_int {};
  struct sigaction old_term {};
};

// SIGINT and SIGTERM write to g_signal_pipe, which the wait loop polls, to be forwarded to every rank.
SavedSignals catch_signals() {
  if (pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) throw Error(std::string("pipe: ") + std::strerror(errno));
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  SavedSignals saved;
  sigaction(SIGINT, &sa, &saved.old_int);
  sigaction(SIGTERM, &sa, &saved.old_term);
  return saved;
}

void restore_signals(const SavedSignals& saved) {
  sigaction(SIGINT, &saved.old_int, nullptr);
  sigaction(SIGTERM, &saved.old_term, nullptr);
  close(g_signal_pipe[0]);
  close(g_signal_pipe[1]);
  g_signal_pipe[0] = g_signal_pipe[1] = -1;
}

// What the exec of every rank shares.
struct ExecBase {
  const LaunchOptions& o;
  int port = 0;
  std::vector<std::string> env;  // inherited_env()
  std::vector<char*> argv;       // exec_array of the executable and its arguments
};

// Forks rank r of the world with its stdout and stderr on pipes to the launcher.
Child start_rank(const ExecBase& x, int r) {
  const LaunchOptions& o = x.o;
  std::vector<std::string> env_s = x.env;
  env_s.push_back("RANK=" + std::to_string(r));
  env_s.push_back("LOCAL_RANK=" + std::to_string(r));
  env_s.push_back("WORLD_SIZE=" + std::to_string(o.nproc));
  env_s.push_back("LOCAL_WORLD_SIZE=" + std::to_string(o.nproc));
  env_s.push_back("MASTER_ADDR=" + o.master_addr);
  env_s.push_back("MASTER_PORT=" + std::to_string(x.port));
  std::vector<char*> envp = exec_array(env_s);
  int out[2], err[2];
  if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
    throw Error(std::string("pipe: ") + std::strerror(errno));
  }
  const pid_t pid = fork();
  if (pid < 0) throw Error(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    // Own process group: a Ctrl-C at the terminal reaches the ranks once, through the launcher's forwarding.
    setpgid(0, 0);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    dup2(out[1], 1);
    dup2(err[1], 2);
    execve(x.argv[0], x.argv.data(), envp.data());
    _exit(127);
  }
  close(out[1]);
  close(err[1]);
  Child c;
  c.rank = r;
  c.pid = pid;
  c.streams[0] = {out[0], 1, {}};
  c.streams[1] = {err[0], 2, {}};
  return c;
}

using Clock = std::chrono::steady_clock;

// The running world as the wait loop sees it.
struct World {
  std::vector<Child> children;
  int grace_ms = 0;
  int first_failure = 0;
  Clock::time_point failed_at{};
  int escalation = 0;  // 1: SIGTERM sent after the grace period, 2: SIGKILL sent
};

void forward_signal(World& w) {
  char drain[64];
  while (read(g_signal_pipe[0], drain, sizeof(drain)) > 0) {
  }
  const int sig = g_signal;
  log::warn("launcher", "forwarding signal to every rank", {{"signal", std::to_string(sig)}});
  for (auto& c : w.children) {
    if (!c.exited) kill(c.pid, sig);
  }
}

// Reads what a rank wrote to one of its streams and passes on its complete lines; closes the stream at its end.
void read_stream(Stream& s, int rank) {
  const std::string prefix = "[rank " + std::to_string(rank) + "] ";
  char buf[65536];
  const ssize_t got = read(s.fd, buf, sizeof(buf));
  if (got > 0) {
    s.buf.append(buf, static_cast<size_t>(got));
    flush_lines(s, prefix, false);
  } else if (got == 0 || (errno != EINTR && errno != EAGAIN)) {
    flush_lines(s, prefix, true);
    close(s.fd);
    s.fd = -1;
  }
}

void reap_exited(World& w) {
  for (auto& c : w.children) {
    if (c.exited) continue;
    int status = 0;
    if (waitpid(c.pid, &status, WNOHANG) != c.pid) continue;
    c.exited = true;
    c.code = exit_code(status);
    if (c.code != 0 && w.first_failure == 0) {
      w.first_failure = c.code;
      w.failed_at = Clock::now();
      log::error("launcher", "a rank failed: the others stop at their next collective's deadline",
                 {{"rank", std::to_string(c.rank)},
                  {"exit_code", std::to_string(c.code)},
                  {"grace_ms", std::to_string(w.grace_ms)}});
    } else if (c.code != 0) {
      log::info("launcher", "rank exited", {{"rank", std::to_string(c.rank)}, {"exit_code", std::to_string(c.code)}});
    }
  }
}

// After a failure: SIGTERM to the ranks still running once the grace period is over, SIGKILL 5 s later.
void escalate(World& w) {
  if (w.first_failure == 0) return;
  const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - w.failed_at).count();
  const int want = waited > w.grace_ms + 5000 ? 2 : waited > w.grace_ms ? 1 : 0;
  if (want > w.escalation) {
    w.escalation = want;
    for (auto& c : w.children) {
      if (!c.exited) kill(c.pid, want == 1 ? SIGTERM : SIGKILL);
    }
  }
}

// Polls the signal pipe and the ranks' open streams until every rank has exited and every stream is closed.
void wait_for_world(World& w) {
  for (;;) {
    std::vector<pollfd> fds = {{g_signal_pipe[0], POLLIN, 0}};
    std::vector<std::pair<Stream*, int>> owners = {{nullptr, 0}};  // the stream of fds[i] and its rank
    for (auto& c : w.children) {
      for (auto& s : c.streams) {
        if (s.fd >= 0) {
          fds.push_back({s.fd, POLLIN, 0});
          owners.emplace_back(&s, c.rank);
        }
      }
    }
    bool all_exited = true;
    for (auto& c : w.children) all_exited = all_exited && c.exited;
    if (all_exited && fds.size() == 1) break;
    const int n = poll(fds.data(), fds.size(), 200);
    if (n < 0 && errno != EINTR) throw Error(std::string("poll: ") + std::strerror(errno));
    if (fds[0].revents & POLLIN) forward_signal(w);
    for (size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) read_stream(*owners[i].first, owners[i].second);
    }
    reap_exited(w);
    escalate(w);
  }
}

}  // namespace

int launch_local_world(const LaunchOptions& o) {
  if (o.nproc < 1 || o.nproc > 256) throw ConfigError("--nproc must be in 1..256");
  const int port = o.master_port > 0 ? o.master_port : free_port(o.master_addr);
  World w;
  w.grace_ms = o.grace_ms > 0 ? o.grace_ms : default_grace_ms();

  // Everything exec needs is built before fork: the parent has threads (OpenBLAS), so the child may only make
  // async-signal-safe calls.
  std::vector<std::string> argv_s = {o.exe};
  argv_s.insert(argv_s.end(), o.args.begin(), o.args.end());
  const ExecBase exec{o, port, inherited_env(), exec_array(argv_s)};

  const SavedSignals saved = catch_signals();
  w.children.resize(static_cast<size_t>(o.nproc));
  for (int r = 0; r < o.nproc; ++r) w.children[static_cast<size_t>(r)] = start_rank(exec, r);
  log::info("launcher", "started a local world",
            {{"nproc", std::to_string(o.nproc)}, {"master", o.master_addr + ":" + std::to_string(port)}});
  wait_for_world(w);
  restore_signals(saved);
  if (w.first_failure == 0) log::info("launcher", "every rank finished", {{"nproc", std::to_string(o.nproc)}});
  return w.first_failure;
}

}  // namespace railyard::worker::parallel
