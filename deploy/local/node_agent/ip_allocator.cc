#include "deploy/local/node_agent/ip_allocator.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/atomic_file.h"

namespace railyard::node_agent {

std::optional<uint32_t> parse_ipv4(const std::string& s) {
  uint32_t out = 0;
  int parts = 0;
  size_t i = 0;
  while (parts < 4) {
    if (i >= s.size() || s[i] < '0' || s[i] > '9') return std::nullopt;
    uint32_t v = 0;
    size_t start = i;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9' && i - start < 3)
      v = v * 10 + static_cast<uint32_t>(s[i++] - '0');
    if (v > 255) return std::nullopt;
    out = (out << 8) | v;
    ++parts;
    if (parts < 4) {
      if (i >= s.size() || s[i] != '.') return std::nullopt;
      ++i;
    }
  }
  if (i != s.size()) return std::nullopt;
  return out;
}

std::string format_ipv4(uint32_t ip) {
  return std::to_string(ip >> 24) + "." + std::to_string((ip >> 16) & 255) + "." + std::to_string((ip >> 8) & 255) +
         "." + std::to_string(ip & 255);
}

bool IpAllocator::usable(uint32_t ip) {
  uint32_t host = ip & 255;
  return host != 0 && host != 255 && ip != ((127u << 24) | 1u) && (ip >> 24) == 127;
}

IpAllocator::IpAllocator(std::string path, uint32_t first, uint32_t last)
    : path_(std::move(path)), first_(first), last_(last), next_(first) {
  if ((first >> 24) != 127 || (last >> 24) != 127 || first > last) {
    throw ConfigError("ip pool " + format_ipv4(first) + "-" + format_ipv4(last) +
                      ": must be an ascending range in 127/8");
  }
  if (path_.empty() || !std::filesystem::exists(path_)) return;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_file(path_, "ip allocation file"));
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError("ip allocation file " + path_ + ": not valid JSON (" + e.what() + "): delete it to start over");
  }
  if (!j.is_object() || !j.contains("pods") || !j["pods"].is_object()) {
    throw ConfigError("ip allocation file " + path_ + ": expected {\"pods\": {uid: ip}}: delete it to start over");
  }
  for (const auto& [owner, v] : j["pods"].items()) {
    auto ip = v.is_string() ? parse_ipv4(v.get<std::string>()) : std::nullopt;
    if (!ip || *ip < first_ || *ip > last_ || used_.count(*ip)) {
      throw ConfigError("ip allocation file " + path_ + ": pods." + owner + " = " + v.dump() +
                        " is not a unique address in the pool: delete the file to start over");
    }
    by_owner_[owner] = *ip;
    used_.insert(*ip);
  }
  if (auto n = j.find("next"); n != j.end() && n->is_string()) {
    auto ip = parse_ipv4(n->get<std::string>());
    if (ip && *ip >= first_ && *ip <= last_) next_ = *ip;
  }
}

std::string IpAllocator::allocate(const std::string& owner) {
  std::lock_guard<std::mutex> l(mu_);
  if (auto it = by_owner_.find(owner); it != by_owner_.end()) return format_ipv4(it->second);
  // Next-fit, so an address just released (a deleted pod) is not handed out again at once.
  uint64_t span = static_cast<uint64_t>(last_) - first_ + 1;
  uint32_t ip = next_;
  for (uint64_t tried = 0; tried < span; ++tried) {
    uint32_t candidate = ip;
    ip = (ip == last_) ? first_ : ip + 1;
    if (usable(candidate) && !used_.count(candidate)) {
      by_owner_[owner] = candidate;
      used_.insert(candidate);
      next_ = ip;
      save_locked();
      return format_ipv4(candidate);
    }
  }
  throw IpExhausted("no free pod address in " + format_ipv4(first_) + "-" + format_ipv4(last_) + " (" +
                    std::to_string(used_.size()) + " in use): delete pods or restart the agent with a new state dir");
}

std::optional<std::string> IpAllocator::lookup(const std::string& owner) const {
  std::lock_guard<std::mutex> l(mu_);
  auto it = by_owner_.find(owner);
  if (it == by_owner_.end()) return std::nullopt;
  return format_ipv4(it->second);
}

void IpAllocator::release(const std::string& owner) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = by_owner_.find(owner);
  if (it == by_owner_.end()) return;
  used_.erase(it->second);
  by_owner_.erase(it);
  save_locked();
}

void IpAllocator::retain_only(const std::set<std::string>& keep) {
  std::lock_guard<std::mutex> l(mu_);
  bool changed = false;
  for (auto it = by_owner_.begin(); it != by_owner_.end();) {
    if (keep.count(it->first)) {
      ++it;
      continue;
    }
    used_.erase(it->second);
    it = by_owner_.erase(it);
    changed = true;
  }
  if (changed) save_locked();
}

size_t IpAllocator::size() const {
  std::lock_guard<std::mutex> l(mu_);
  return by_owner_.size();
}

void IpAllocator::save_locked() {
  if (path_.empty()) return;
  nlohmann::json pods = nlohmann::json::object();
  for (const auto& [owner, ip] : by_owner_) pods[owner] = format_ipv4(ip);
  // Only the agent's own crash matters here (a machine crash ends every pod too), hence no fsync: with two per save, at
  // every pod start and removal, 1,000 pods took the agent a minute (docs/benchmarks.md, "1,000 replicas").
  write_file_atomic(path_, nlohmann::json{{"next", format_ipv4(next_)}, {"pods", pods}}.dump(1) + "\n",
                    Durability::ProcessCrash);
}

}  // namespace railyard::node_agent
