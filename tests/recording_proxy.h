// A TCP forwarder for tests that must show what crosses the network: it listens on 127.0.0.1 (port()), forwards
// every connection to a target port, and records every byte of both directions (capture()). Real sockets, no mocks:
// a test asserts that a secret is absent from the capture with TLS and present without it (the capture works).
#pragma once

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace railyard::test {

class RecordingProxy {
 public:
  explicit RecordingProxy(int target_port) : target_(target_port) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr = loopback(0);
    if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(listen_fd_, 16) != 0)
      throw std::runtime_error("RecordingProxy: cannot listen");
    socklen_t len = sizeof addr;
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    acceptor_ = std::thread([this] { accept_loop(); });
  }
  ~RecordingProxy() {
    stop_ = true;
    acceptor_.join();
    for (auto& t : pumps_) t.join();
    ::close(listen_fd_);
  }
  RecordingProxy(const RecordingProxy&) = delete;
  RecordingProxy& operator=(const RecordingProxy&) = delete;

  int port() const { return port_; }
  std::string capture() const {
    std::lock_guard<std::mutex> lock(mu_);
    return bytes_;
  }
  bool saw(const std::string& needle) const { return capture().find(needle) != std::string::npos; }
  // Stalled: nothing is forwarded either way (connections stay open, bytes wait in the kernel's buffers), as over a
  // network path that silently stopped delivering. Un-stalled: forwarding resumes.
  void stall(bool on) { stalled_ = on; }

 private:
  static sockaddr_in loopback(int port) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    return addr;
  }

  void accept_loop() {
    while (!stop_) {
      pollfd p{listen_fd_, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      int in = ::accept(listen_fd_, nullptr, nullptr);
      if (in < 0) continue;
      int out = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_in addr = loopback(target_);
      if (::connect(out, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
        ::close(in);
        ::close(out);
        continue;
      }
      pumps_.emplace_back([this, in, out] { pump(in, out); });
    }
  }

  // Copies both ways until either side ends (or the proxy stops), recording everything.
  void pump(int a, int b) {
    char buf[65536];
    for (bool open = true; open && !stop_;) {
      if (stalled_) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        continue;
      }
      pollfd p[2] = {{a, POLLIN, 0}, {b, POLLIN, 0}};
      if (::poll(p, 2, 20) <= 0) continue;
      for (int i = 0; i < 2 && open; ++i) {
        if (!(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        ssize_t n = ::recv(p[i].fd, buf, sizeof buf, 0);
        if (n <= 0) {
          open = false;
          break;
        }
        {
          std::lock_guard<std::mutex> lock(mu_);
          bytes_.append(buf, static_cast<size_t>(n));
        }
        if (::send(p[1 - i].fd, buf, static_cast<size_t>(n), MSG_NOSIGNAL) != n) open = false;
      }
    }
    ::shutdown(a, SHUT_RDWR);
    ::shutdown(b, SHUT_RDWR);
    ::close(a);
    ::close(b);
  }

  int target_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<bool> stalled_{false};
  std::thread acceptor_;
  std::vector<std::thread> pumps_;  // only the acceptor adds; joined after it
  mutable std::mutex mu_;
  std::string bytes_;
};

}  // namespace railyard::test
