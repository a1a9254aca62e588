#include "deploy/local/node_agent/node_lease.h"

#include <algorithm>
#include <exception>

#include "common/log.h"

namespace railyard::node_agent {
namespace {

using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;
constexpr const char* kComp = "node-agent";

std::string now3339() { return kube::format_rfc3339(std::chrono::system_clock::now()); }

std::string str_at(const Json& j, const char* key) {
  auto it = j.find(key);
  return (it != j.end() && it->is_string()) ? it->get<std::string>() : std::string();
}

}  // namespace

NodeLeases::NodeLeases(const AgentOptions& opts, kube::Client& client)
    : opts_(opts), client_(client), nodes_(expand_nodes(opts.topology)) {
  for (const auto& n : nodes_) names_.insert(n.name);
}

NodeLeases::~NodeLeases() {
  stop();
  join();
}

// Runs fn(i) for i in [0, count) on up to opts.heartbeat_workers threads (the calling one included).
void NodeLeases::parallel_for(size_t count, const std::function<void(size_t)>& fn) {
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < count;) fn(i);
  };
  std::vector<std::thread> extra;
  const size_t threads = std::min<size_t>(std::max(1, opts_.heartbeat_workers), count);
  for (size_t t = 1; t < threads; ++t) extra.emplace_back(work);
  work();
  for (auto& t : extra) t.join();
}

void NodeLeases::register_all() {
  // Concurrently: one at a time, 1,000 simulated nodes took minutes to register.
  std::mutex mu;
  std::exception_ptr first;
  parallel_for(nodes_.size(), [&](size_t i) {
    try {
      register_node(nodes_[i]);
    } catch (...) {
      std::lock_guard<std::mutex> l(mu);
      if (!first) first = std::current_exception();
    }
  });
  if (first) std::rethrow_exception(first);
}

void NodeLeases::register_node(const SimNode& n) {
  Json obj = node_object(opts_.topology, n, now3339());
  Json stored;
  try {
    stored = client_.create(kube::resources::nodes, "", obj);
    log::info(kComp, "node registered", {{"node", n.name}});
  } catch (const kube::Conflict&) {
    // Already there from an earlier run: bring labels and status in line with the topology (idempotent).
    client_.patch(kube::resources::nodes, "", n.name, {{"metadata", {{"labels", obj["metadata"]["labels"]}}}});
    stored = client_.patch(kube::resources::nodes, "", n.name, {{"status", obj["status"]}},
                           kube::PatchType::StrategicMerge, "status");
    log::info(kComp, "node updated", {{"node", n.name}});
  }
  {
    std::lock_guard<std::mutex> l(lease_mu_);
    node_uids_[n.name] = str_at(stored["metadata"], "uid");
  }
  renew_lease(n.name);
}

void NodeLeases::renew_lease(const std::string& node) {
  std::string now = kube::format_rfc3339_micro(std::chrono::system_clock::now());
  bool ok = true;
  std::string error;
  try {
    try {
      client_.patch(kube::resources::leases, "kube-node-lease", node,
                    {{"spec", {{"renewTime", now}, {"holderIdentity", node}}}});
    } catch (const kube::NotFound&) {
      Json lease = {
          {"apiVersion", "coordination.k8s.io/v1"},
          {"kind", "Lease"},
          {"metadata", {{"name", node}, {"namespace", "kube-node-lease"}}},
          {"spec",
           {{"holderIdentity", node}, {"leaseDurationSeconds", opts_.lease_duration_seconds}, {"renewTime", now}}}};
      std::string uid;
      {
        std::lock_guard<std::mutex> l(lease_mu_);
        if (auto it = node_uids_.find(node); it != node_uids_.end()) uid = it->second;
      }
      // Owned by the Node, so deleting the node removes its lease (as with a kubelet's).
      if (!uid.empty())
        lease["metadata"]["ownerReferences"] =
            Json::array({{{"apiVersion", "v1"}, {"kind", "Node"}, {"name", node}, {"uid", uid}}});
      client_.create(kube::resources::leases, "kube-node-lease", lease);
    }
  } catch (const std::exception& e) {
    ok = false;
    error = e.what();
  }
  std::lock_guard<std::mutex> l(lease_mu_);
  auto it = lease_ok_.find(node);
  if (ok && (it == lease_ok_.end() || !it->second)) log::info(kComp, "lease renewed", {{"node", node}});
  if (!ok && (it == lease_ok_.end() || it->second))
    log::warn(kComp, "lease renewal failed", {{"node", node}, {"error", error}});
  lease_ok_[node] = ok;
}

// `transition`: the node comes (back) up, so lastTransitionTime moves too; otherwise only the heartbeat time.
void NodeLeases::patch_ready(const std::string& node, bool transition) {
  Json conditions = node_conditions(now3339());
  if (!transition) {
    for (auto& cond : conditions) cond.erase("lastTransitionTime");
  }
  client_.patch(kube::resources::nodes, "", node, {{"status", {{"conditions", conditions}}}},
                kube::PatchType::StrategicMerge, "status");
}

void NodeLeases::start_heartbeats() {
  heartbeat_ = std::thread([this] { heartbeat_loop(); });
}

void NodeLeases::stop() {
  stopping_ = true;
  { std::lock_guard<std::mutex> l(sleep_mu_); }
  sleep_cv_.notify_all();
}

void NodeLeases::join() {
  if (heartbeat_.joinable()) heartbeat_.join();
}

void NodeLeases::heartbeat_loop() {
  auto next_status = Clock::now() + opts_.node_status_interval;
  while (!stopping_) {
    auto t0 = Clock::now();
    std::set<std::string> up, ready_now;
    {
      std::lock_guard<std::mutex> l(nodes_mu_);
      for (const auto& n : names_) {
        if (!down_.count(n)) up.insert(n);
      }
      ready_now.swap(ready_asap_);
    }
    bool status_due = t0 >= next_status;
    if (status_due) next_status = t0 + opts_.node_status_interval;
    // Renewals are spread over the interval (node k of N is due at t0 + k/N of it) and run on several workers,
    // so 1,000 simulated nodes cost a steady trickle of requests rather than one long serial round.
    const std::vector<std::string> order(up.begin(), up.end());
    const auto spread = opts_.lease_interval / std::max<size_t>(1, order.size());
    parallel_for(order.size(), [&](size_t k) {
      if (stopping_) return;
      {
        std::unique_lock<std::mutex> l(sleep_mu_);
        sleep_cv_.wait_until(l, t0 + spread * k, [&] { return stopping_.load(); });
      }
      if (stopping_) return;
      heartbeat(order[k], status_due, ready_now.count(order[k]) > 0);
    });
    if (stopping_) return;
    auto elapsed = Clock::now() - t0;
    auto wait = opts_.lease_interval - std::chrono::duration_cast<std::chrono::milliseconds>(elapsed);
    std::unique_lock<std::mutex> l(sleep_mu_);
    if (wait.count() > 0) sleep_cv_.wait_for(l, wait, [&] { return stopping_.load(); });
  }
}

// One node's turn in a heartbeat round; `transition`: Ready=True is due now because the node came back up.
void NodeLeases::heartbeat(const std::string& n, bool status_due, bool transition) {
  renew_lease(n);
  if (!status_due && !transition) return;
  try {
    patch_ready(n, transition);
  } catch (const kube::NotFound&) {
    // Someone deleted the Node: register it again, as a kubelet would.
    log::warn(kComp, "node object is gone, registering it again", {{"node", n}});
    try {
      for (const auto& sn : nodes_) {
        if (sn.name == n) register_node(sn);
      }
    } catch (const std::exception& e) {
      log::warn(kComp, "node registration failed", {{"node", n}, {"error", e.what()}});
    }
  } catch (const std::exception& e) {
    log::warn(kComp, "node status update failed", {{"node", n}, {"error", e.what()}});
  }
}

bool NodeLeases::is_down(const std::string& node) const {
  std::lock_guard<std::mutex> l(nodes_mu_);
  return down_.count(node) > 0;
}

bool NodeLeases::mark_down(const std::string& node) {
  std::lock_guard<std::mutex> l(nodes_mu_);
  if (!down_.insert(node).second) return false;
  if (down_.size() == names_.size()) {
    log::warn(kComp, "every node of this agent is down: the node controller stops evicting when no node is Ready");
  }
  return true;
}

bool NodeLeases::mark_up(const std::string& node) {
  {
    std::lock_guard<std::mutex> l(nodes_mu_);
    if (!down_.erase(node)) return false;
  }
  renew_lease(node);
  try {
    patch_ready(node, true);
  } catch (const std::exception& e) {
    std::lock_guard<std::mutex> l(nodes_mu_);
    ready_asap_.insert(node);  // the heartbeat thread retries
    log::warn(kComp, "node status update failed", {{"node", node}, {"error", e.what()}});
  }
  return true;
}

}  // namespace railyard::node_agent
