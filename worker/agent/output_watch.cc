#include "worker/agent/output_watch.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <utility>

#include "common/error.h"

namespace railyard::worker {
namespace {

double unix_now() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

void write_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;  // the agent's own stdout is gone: drop, never block the ranks on it
    p += w;
    n -= static_cast<size_t>(w);
  }
}

}  // namespace

OutputWatch::OutputWatch(int local_ranks, size_t tail_lines, size_t tail_bytes)
    : last_(static_cast<size_t>(local_ranks)),
      tails_(static_cast<size_t>(local_ranks),
             Tail{LogTail(tail_lines, tail_bytes), LogTail(tail_lines, tail_bytes), 0, 0, {}, {}, {}}) {
  for (auto& t : last_) t.store(0);
  if (::pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0)
    throw Error(std::string("agent: pipe for the output watch failed: ") + std::strerror(errno));
  thread_ = std::thread([this] { loop(); });
}

OutputWatch::~OutputWatch() {
  stop_.store(true);
  (void)!::write(wake_[1], "x", 1);
  thread_.join();
  for (const Source& s : sources_) ::close(s.fd);
  ::close(wake_[0]);
  ::close(wake_[1]);
}

OutputWatch::ChildEnds OutputWatch::open(int local_rank) {
  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0) throw Error(std::string("agent: pipe failed: ") + std::strerror(errno));
  if (::pipe2(err, O_CLOEXEC) != 0) {
    ::close(out[0]);
    ::close(out[1]);
    throw Error(std::string("agent: pipe failed: ") + std::strerror(errno));
  }
  int serial = 0;
  {
    std::lock_guard lock(tail_mu_);
    Tail& t = tails_.at(static_cast<size_t>(local_rank));
    t.out.clear();
    t.err.clear();
    t.partial_out.clear();
    t.partial_err.clear();
    t.marked.clear();
    serial = ++t.serial;
    t.open = 2;
  }
  {
    std::lock_guard lock(mu_);
    sources_.push_back({out[0], local_rank, 1, serial});
    sources_.push_back({err[0], local_rank, 2, serial});
  }
  (void)!::write(wake_[1], "x", 1);
  return {out[1], err[1]};
}

void OutputWatch::set_marker(std::string marker) {
  std::lock_guard lock(tail_mu_);
  marker_ = std::move(marker);
}

std::vector<std::string> OutputWatch::take_marked(int local_rank) {
  std::lock_guard lock(tail_mu_);
  return std::exchange(tails_.at(static_cast<size_t>(local_rank)).marked, {});
}

double OutputWatch::last_output(int local_rank) const { return last_.at(static_cast<size_t>(local_rank)).load(); }

std::string OutputWatch::last_words(int local_rank, std::chrono::milliseconds wait) {
  std::unique_lock lock(tail_mu_);
  Tail& t = tails_.at(static_cast<size_t>(local_rank));
  tail_cv_.wait_for(lock, wait, [&t] { return t.open <= 0; });
  std::string err = t.err.text();
  return err.empty() ? t.out.text() : err;
}

void OutputWatch::tail(const Source& s, const char* data, size_t n, bool eof) {
  std::lock_guard lock(tail_mu_);
  Tail& t = tails_[static_cast<size_t>(s.local_rank)];
  if (t.serial != s.serial) return;  // an earlier process of the rank (or what it left running)
  (s.to == 2 ? t.err : t.out).append(std::string_view(data, n));
  if (!marker_.empty()) {
    std::string& partial = s.to == 2 ? t.partial_err : t.partial_out;
    partial.append(data, n);
    size_t start = 0;
    for (size_t nl; (nl = partial.find('\n', start)) != std::string::npos; start = nl + 1) {
      const std::string_view line(partial.data() + start, nl - start);
      if (line.find(marker_) != std::string_view::npos && t.marked.size() < 16)
        t.marked.push_back(sanitize_message(line, 1024));
    }
    partial.erase(0, start);
    if (partial.size() > 65536) partial.erase(0, partial.size() - 4096);  // a line without end: keep its tail
  }
  if (eof && --t.open <= 0) tail_cv_.notify_all();
}

void OutputWatch::loop() {
  char buf[65536];
  while (true) {
    std::vector<Source> srcs;
    {
      std::lock_guard lock(mu_);
      srcs = sources_;
    }
    std::vector<pollfd> fds{{wake_[0], POLLIN, 0}};
    for (const Source& s : srcs) fds.push_back({s.fd, POLLIN, 0});
    // After stop, drain what the pipes hold without waiting for writers that may never close them.
    const bool stopping = stop_.load();
    int n = ::poll(fds.data(), fds.size(), stopping ? 0 : -1);
    if (n < 0 && errno != EINTR) return;
    if (fds[0].revents & POLLIN)
      while (::read(wake_[0], buf, sizeof buf) > 0) {
      }
    bool any = false;
    std::vector<int> closed;
    for (size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      const Source& s = srcs[i - 1];
      ssize_t r = ::read(s.fd, buf, sizeof buf);
      if (r > 0) {
        any = true;
        last_[static_cast<size_t>(s.local_rank)].store(unix_now());
        write_all(s.to, buf, static_cast<size_t>(r));
        tail(s, buf, static_cast<size_t>(r), false);
      } else if (r == 0 || (errno != EINTR && errno != EAGAIN)) {
        closed.push_back(s.fd);  // every writer is gone (the rank and what it started)
        tail(s, buf, 0, true);
      }
    }
    if (!closed.empty()) {
      std::lock_guard lock(mu_);
      std::erase_if(sources_, [&](const Source& s) {
        for (int fd : closed)
          if (fd == s.fd) {
            ::close(fd);
            return true;
          }
        return false;
      });
    }
    if (stopping && !any) return;
  }
}

}  // namespace railyard::worker
