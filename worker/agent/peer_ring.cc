#include "worker/agent/peer_ring.h"

#include <chrono>

#include "common/log.h"

namespace railyard::worker {
namespace {

using Clock = std::chrono::steady_clock;
constexpr const char* kComponent = "agent";

}  // namespace

PeerRing::PeerRing(const AgentConfig& cfg, std::string shm_prefix, AgentMetrics& metrics)
    : shm_prefix_(std::move(shm_prefix)),
      auth_{cfg.ns + "/" + cfg.job, peer_copy_token(cfg.token, cfg.ns, cfg.job), cfg.identity,
            std::make_shared<std::atomic<int64_t>>(0)},
      metrics_(metrics) {
  try {
    server_ = std::make_unique<peer::PeerServer>(cfg.pod_ip, cfg.peer_port, auth_, shm_prefix_);
    log::info(kComponent, "serving peer copies of the in-memory checkpoint tier",
              {{"address", cfg.pod_ip + ":" + std::to_string(server_->port())}, {"tls", cfg.identity ? "on" : "off"}});
  } catch (const std::exception& e) {
    // Not fatal: the job trains without the peer copy (a lost node then restores from storage).
    log::warn(kComponent, std::string("no peer copy: ") + e.what());
  }
  sender_ = std::make_unique<peer::PeerSender>(
      auth_, std::chrono::milliseconds(5),
      [this](const peer::CopyResult& r, const std::string& error) { on_copy(r, error); });
}

PeerRing::~PeerRing() { stop(); }

int PeerRing::port() const { return server_ ? server_->port() : 0; }

// Runs on the sender's thread.
void PeerRing::on_copy(const peer::CopyResult& r, const std::string& error) {
  if (!error.empty()) {
    metrics_.peer_copy_errors.increment();
    return;
  }
  metrics_.peer_copy_seconds.observe(r.seconds);
  metrics_.peer_copy_bytes.increment(static_cast<double>(r.bytes));
  copies_.fetch_add(1);
  copy_seconds_sum_.store(copy_seconds_sum_.load() + r.seconds);  // only this thread writes
  if (copy_seconds_max_.load() < r.seconds) copy_seconds_max_.store(r.seconds);
  log::write(first_logged_.exchange(true) ? log::Level::Debug : log::Level::Info, kComponent, "peer copy sent",
             {{"rank", std::to_string(r.rank)},
              {"step", std::to_string(r.step)},
              {"bytes", std::to_string(r.bytes)},
              {"seconds", std::to_string(r.seconds)}});
}

void PeerRing::set_up(const rdzv::Assignment& a, bool replacement) {
  steps_.clear();
  copying_ = false;
  if (!sender_) return;  // stopped
  // From now on this agent's server refuses copies of older generations, and its sender labels its own.
  auth_.generation->store(a.generation);
  const bool on = a.config.memory_tier_on() && a.num_pods > 1 && static_cast<int>(a.peers.size()) == a.num_pods;
  copying_ = on;
  if (!on) {
    sender_->set({}, "");
    return;
  }
  if (replacement && !a.restore.empty()) {
    const auto t0 = Clock::now();
    for (int rank : a.ranks) {
      const std::string base = shm_prefix_ + "-r" + std::to_string(rank);
      std::string why_all;
      for (int k = 1; k < a.num_pods; ++k) {
        const int i = (a.pod_index + k) % a.num_pods;
        if (a.peers[i].empty()) continue;
        std::string why;
        auto steps = peer::fetch(a.peers[i], auth_, rank, base, &why);
        if (!steps.empty()) {
          steps_[rank] = steps;
          std::string list;
          for (int64_t st : steps) {
            if (!list.empty()) list += ',';
            list += std::to_string(st);
          }
          log::info(kComponent, "fetched the peer copies of a rank",
                    {{"rank", std::to_string(rank)},
                     {"from", a.pods[i]},
                     {"steps", list},
                     {"seconds", std::to_string(std::chrono::duration<double>(Clock::now() - t0).count())}});
          break;
        }
        if (!why_all.empty()) why_all += "; ";
        why_all += a.pods[i] + ": " + why;
      }
      if (!steps_.count(rank)) {
        log::info(kComponent, "no peer copy of a rank: its workers restore from storage",
                  {{"rank", std::to_string(rank)}, {"why", why_all}});
      }
    }
  }
  first_logged_ = false;
  std::map<int, std::string> ranks;
  for (int rank : a.ranks) ranks[rank] = shm_prefix_ + "-r" + std::to_string(rank);
  sender_->set(std::move(ranks), a.peers[(a.pod_index + 1) % a.num_pods]);
}

std::vector<int64_t> PeerRing::fetched_steps(int rank) const {
  auto it = steps_.find(rank);
  return it == steps_.end() ? std::vector<int64_t>{} : it->second;
}

void PeerRing::stop() {
  sender_.reset();
  server_.reset();
  if (const uint64_t n = copies_.exchange(0); n > 0) {
    log::info(kComponent, "peer copies sent",
              {{"count", std::to_string(n)},
               {"mean_seconds", std::to_string(copy_seconds_sum_.load() / static_cast<double>(n))},
               {"max_seconds", std::to_string(copy_seconds_max_.load())}});
  }
}

}  // namespace railyard::worker
