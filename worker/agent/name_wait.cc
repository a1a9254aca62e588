#include "worker/agent/name_wait.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <thread>

namespace railyard::worker {

std::vector<std::string> resolve_addresses(const std::string& name) {
  std::vector<std::string> out;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (name.empty() || getaddrinfo(name.c_str(), nullptr, &hints, &res) != 0) return out;
  for (addrinfo* p = res; p != nullptr; p = p->ai_next) {
    char buf[INET6_ADDRSTRLEN] = {};
    const void* addr = nullptr;
    if (p->ai_family == AF_INET) addr = &reinterpret_cast<const sockaddr_in*>(p->ai_addr)->sin_addr;
    if (p->ai_family == AF_INET6) addr = &reinterpret_cast<const sockaddr_in6*>(p->ai_addr)->sin6_addr;
    if (addr != nullptr && inet_ntop(p->ai_family, addr, buf, sizeof buf) != nullptr &&
        std::find(out.begin(), out.end(), buf) == out.end())
      out.emplace_back(buf);
  }
  freeaddrinfo(res);
  return out;
}

namespace {
bool resolves(const NameWant& w) {
  const auto got = resolve_addresses(w.name);
  return w.ip.empty() ? !got.empty() : std::find(got.begin(), got.end(), w.ip) != got.end();
}
}  // namespace

bool wait_for_names(const std::vector<NameWant>& want, std::chrono::milliseconds limit,
                    const std::function<bool()>& stopped) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (true) {
    if (std::all_of(want.begin(), want.end(), resolves)) return true;
    if ((stopped && stopped()) || std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
}

std::vector<std::string> unresolved(const std::vector<NameWant>& want) {
  std::vector<std::string> out;
  for (const NameWant& w : want) {
    const auto got = resolve_addresses(w.name);
    if (w.ip.empty() ? !got.empty() : std::find(got.begin(), got.end(), w.ip) != got.end()) continue;
    std::string seen;
    for (const auto& g : got) seen += (seen.empty() ? "" : ", ") + g;
    out.push_back(w.name + " (got " + (seen.empty() ? std::string("none") : seen) + ", want " +
                  (w.ip.empty() ? std::string("any") : w.ip) + ")");
  }
  return out;
}

}  // namespace railyard::worker
