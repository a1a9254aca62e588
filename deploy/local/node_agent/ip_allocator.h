// Gives each pod its own loopback address (127.x.y.z, never 127.0.0.1) and remembers it in a file, so a restarted
// agent reports the same podIP for pods it already knew.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>

#include "common/error.h"

namespace railyard::node_agent {

class IpExhausted : public Error {
 public:
  using Error::Error;
};

std::optional<uint32_t> parse_ipv4(const std::string& s);
std::string format_ipv4(uint32_t ip);

class IpAllocator {
 public:
  // Default pool: 127.16.0.1 - 127.31.255.254 (a /12 inside 127/8), skipping .0 and .255 host bytes.
  static constexpr uint32_t kDefaultFirst = (127u << 24) | (16u << 16) | 1u;
  static constexpr uint32_t kDefaultLast = (127u << 24) | (31u << 16) | (255u << 8) | 254u;

  // Loads `path` if it exists (empty path: in memory only). Throws ConfigError on a corrupt file or a bad range.
  explicit IpAllocator(std::string path, uint32_t first = kDefaultFirst, uint32_t last = kDefaultLast);

  // The address for `owner` (a pod uid): the existing one, or a new one persisted before returning.
  // Throws IpExhausted when no address is free.
  std::string allocate(const std::string& owner);
  std::optional<std::string> lookup(const std::string& owner) const;
  void release(const std::string& owner);
  // Releases every owner not in `keep` (after a restart, pods that disappeared while the agent was down).
  void retain_only(const std::set<std::string>& keep);
  size_t size() const;

 private:
  void save_locked();
  static bool usable(uint32_t ip);

  std::string path_;
  uint32_t first_, last_, next_;
  mutable std::mutex mu_;
  std::map<std::string, uint32_t> by_owner_;
  std::set<uint32_t> used_;
};

}  // namespace railyard::node_agent
