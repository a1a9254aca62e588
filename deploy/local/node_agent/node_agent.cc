#include "deploy/local/node_agent/node_agent.h"

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "common/kube/event_recorder.h"
#include "common/log.h"
#include "deploy/local/node_agent/control.h"
#include "deploy/local/node_agent/ip_allocator.h"
#include "deploy/local/node_agent/pod_spec.h"
#include "deploy/local/node_agent/signals.h"
#include "deploy/local/node_agent/supervisor.h"

namespace railyard::node_agent {
namespace {

using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using SysClock = std::chrono::system_clock;
constexpr const char* kComp = "node-agent";
constexpr auto kTick = std::chrono::milliseconds(200);
constexpr auto kConfigRetry = std::chrono::seconds(2);

std::string rfc3339(SysClock::time_point t) { return kube::format_rfc3339(t); }
std::string now3339() { return rfc3339(SysClock::now()); }

std::string str_at(const Json& j, const char* key) {
  auto it = j.find(key);
  return (it != j.end() && it->is_string()) ? it->get<std::string>() : std::string();
}

// Field 22 of /proc/<pid>/stat (start time in clock ticks): tells a recorded process from a later one with the
// same pid.
std::string proc_start_time(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string all;
  if (!std::getline(in, all)) return "";
  auto close = all.rfind(')');
  if (close == std::string::npos) return "";
  std::istringstream rest(all.substr(close + 2));
  std::string field;
  for (int i = 3; i <= 22 && rest >> field; ++i) {
  }
  return field;
}

// What the agent knows about one pod bound to one of its nodes. Touched by the loop thread only.
struct PodRec {
  enum class State { New, Waiting, Running, Lost, Done };
  std::string uid, ns, name, node, container, image;
  Json pod;
  std::string ip;
  State state = State::New;
  int restart_count = 0;
  int backoff_step = 0;
  bool restart_pending = false;  // Waiting for a restart (not for a missing secret)
  pid_t pid = 0;
  SysClock::time_point started_at;
  Clock::time_point started_steady;
  std::string start_time;  // status.startTime, set once
  Json last_terminated;    // lastState.terminated after a restart
  std::string waiting_reason, waiting_message;
  Clock::time_point retry_at;
  std::optional<int64_t> grace_sent;  // deletion grace already applied
  bool delete_sent = false;
  bool frozen = false;
  std::string phase;  // last phase reported
  // A status patch the API server did not take (down, starting, or its authorizer not yet synced after a restart,
  // which answers 403 for a moment): resent by tick() until it lands or a newer patch replaces it. Without this a
  // pod whose process ended during an API-server restart stayed Running forever.
  Json unsent_status;
  std::string unsent_phase;
  Clock::time_point status_retry_at;
  std::string key() const { return ns + "/" + name; }
  bool deleting() const { return pod["metadata"].contains("deletionTimestamp"); }
};

const char* state_name(PodRec::State s) {
  switch (s) {
    case PodRec::State::New:
      return "New";
    case PodRec::State::Waiting:
      return "Waiting";
    case PodRec::State::Running:
      return "Running";
    case PodRec::State::Lost:
      return "Lost";
    case PodRec::State::Done:
      return "Done";
  }
  return "?";
}

}  // namespace

struct Agent::Impl {
  AgentOptions opts;
  kube::Client& client;
  std::vector<SimNode> nodes;
  std::set<std::string> node_names;
  // Lease renewals run on several heartbeat workers and (node-up) the loop thread; the lock covers the maps below,
  // never an API call, so renewals of different nodes overlap.
  std::mutex lease_mu;
  std::map<std::string, std::string> node_uids;  // guarded by lease_mu

  std::mutex nodes_mu;
  std::set<std::string> down;            // guarded by nodes_mu
  std::set<std::string> ready_asap;      // nodes whose Ready=True must be patched now; guarded by nodes_mu
  std::map<std::string, bool> lease_ok;  // last lease renewal result per node (for log-on-change); lease_mu

  std::unique_ptr<IpAllocator> ips;
  std::unique_ptr<kube::EventRecorder> events;
  std::unique_ptr<Supervisor> supervisor;
  std::unique_ptr<ControlServer> control;

  std::mutex q_mu;
  std::condition_variable q_cv;
  std::mutex sleep_mu;  // interruptible sleeps of the heartbeat and watch threads
  std::condition_variable sleep_cv;
  std::deque<std::function<void()>> queue;

  std::map<std::string, PodRec> pods;  // by uid; loop thread only
  std::atomic<bool> stopping{false};
  std::atomic<bool> shutting_down{false};
  std::shared_ptr<kube::StopToken> watch_stop = std::make_shared<kube::StopToken>();
  std::string processes_file;

  Impl(AgentOptions o, kube::Client& c) : opts(std::move(o)), client(c) {
    nodes = expand_nodes(opts.topology);
    for (const auto& n : nodes) node_names.insert(n.name);
    processes_file = opts.state_dir + "/processes.json";
  }

  bool node_down(const std::string& node) {
    std::lock_guard<std::mutex> l(nodes_mu);
    return down.count(node) > 0;
  }

  void post(std::function<void()> fn) {
    {
      std::lock_guard<std::mutex> l(q_mu);
      queue.push_back(std::move(fn));
    }
    q_cv.notify_one();
  }

  // ------------------------------------------------------------------------------------------------------------
  // Nodes and heartbeats
  // ------------------------------------------------------------------------------------------------------------

  // Runs fn(i) for i in [0, count) on up to opts.heartbeat_workers threads (the calling one included).
  void parallel_for(size_t count, const std::function<void(size_t)>& fn) {
    std::atomic<size_t> next{0};
    auto work = [&] {
      for (size_t i; (i = next.fetch_add(1)) < count;) fn(i);
    };
    std::vector<std::thread> extra;
    const size_t threads = std::min<size_t>(std::max(1, opts.heartbeat_workers), count);
    for (size_t t = 1; t < threads; ++t) extra.emplace_back(work);
    work();
    for (auto& t : extra) t.join();
  }

  void register_nodes() {
    // Concurrently: one at a time, 1,000 simulated nodes took minutes to register.
    std::mutex mu;
    std::exception_ptr first;
    parallel_for(nodes.size(), [&](size_t i) {
      try {
        register_node(nodes[i]);
      } catch (...) {
        std::lock_guard<std::mutex> l(mu);
        if (!first) first = std::current_exception();
      }
    });
    if (first) std::rethrow_exception(first);
  }

  void register_node(const SimNode& n) {
    {
      Json obj = node_object(opts.topology, n, now3339());
      Json stored;
      try {
        stored = client.create(kube::resources::nodes, "", obj);
        log::info(kComp, "node registered", {{"node", n.name}});
      } catch (const kube::Conflict&) {
        // Already there from an earlier run: bring labels and status in line with the topology (idempotent).
        client.patch(kube::resources::nodes, "", n.name, {{"metadata", {{"labels", obj["metadata"]["labels"]}}}});
        stored = client.patch(kube::resources::nodes, "", n.name, {{"status", obj["status"]}},
                              kube::PatchType::StrategicMerge, "status");
        log::info(kComp, "node updated", {{"node", n.name}});
      }
      {
        std::lock_guard<std::mutex> l(lease_mu);
        node_uids[n.name] = str_at(stored["metadata"], "uid");
      }
      renew_lease(n.name);
    }
  }

  void renew_lease(const std::string& node) {
    std::string now = kube::format_rfc3339_micro(SysClock::now());
    bool ok = true;
    std::string error;
    try {
      try {
        client.patch(kube::resources::leases, "kube-node-lease", node,
                     {{"spec", {{"renewTime", now}, {"holderIdentity", node}}}});
      } catch (const kube::NotFound&) {
        Json lease = {
            {"apiVersion", "coordination.k8s.io/v1"},
            {"kind", "Lease"},
            {"metadata", {{"name", node}, {"namespace", "kube-node-lease"}}},
            {"spec",
             {{"holderIdentity", node}, {"leaseDurationSeconds", opts.lease_duration_seconds}, {"renewTime", now}}}};
        std::string uid;
        {
          std::lock_guard<std::mutex> l(lease_mu);
          if (auto it = node_uids.find(node); it != node_uids.end()) uid = it->second;
        }
        // Owned by the Node, so deleting the node removes its lease (as with a kubelet's).
        if (!uid.empty())
          lease["metadata"]["ownerReferences"] =
              Json::array({{{"apiVersion", "v1"}, {"kind", "Node"}, {"name", node}, {"uid", uid}}});
        client.create(kube::resources::leases, "kube-node-lease", lease);
      }
    } catch (const std::exception& e) {
      ok = false;
      error = e.what();
    }
    std::lock_guard<std::mutex> l(lease_mu);
    auto it = lease_ok.find(node);
    if (ok && (it == lease_ok.end() || !it->second)) log::info(kComp, "lease renewed", {{"node", node}});
    if (!ok && (it == lease_ok.end() || it->second))
      log::warn(kComp, "lease renewal failed", {{"node", node}, {"error", error}});
    lease_ok[node] = ok;
  }

  // `transition`: the node comes (back) up, so lastTransitionTime moves too; otherwise only the heartbeat time.
  void patch_ready(const std::string& node, bool transition) {
    Json conditions = node_conditions(now3339());
    if (!transition) {
      for (auto& cond : conditions) cond.erase("lastTransitionTime");
    }
    client.patch(kube::resources::nodes, "", node, {{"status", {{"conditions", conditions}}}},
                 kube::PatchType::StrategicMerge, "status");
  }

  void heartbeat_loop() {
    auto next_status = Clock::now() + opts.node_status_interval;
    while (!stopping) {
      auto t0 = Clock::now();
      std::set<std::string> up, ready_now;
      {
        std::lock_guard<std::mutex> l(nodes_mu);
        for (const auto& n : node_names) {
          if (!down.count(n)) up.insert(n);
        }
        ready_now.swap(ready_asap);
      }
      bool status_due = t0 >= next_status;
      if (status_due) next_status = t0 + opts.node_status_interval;
      // Renewals are spread over the interval (node k of N is due at t0 + k/N of it) and run on several workers,
      // so 1,000 simulated nodes cost a steady trickle of requests rather than one long serial round.
      const std::vector<std::string> order(up.begin(), up.end());
      const auto spread = opts.lease_interval / std::max<size_t>(1, order.size());
      parallel_for(order.size(), [&](size_t k) {
        const std::string& n = order[k];
        if (stopping) return;
        {
          std::unique_lock<std::mutex> l(sleep_mu);
          sleep_cv.wait_until(l, t0 + spread * k, [&] { return stopping.load(); });
        }
        if (stopping) return;
        renew_lease(n);
        if (status_due || ready_now.count(n)) {
          try {
            patch_ready(n, ready_now.count(n) > 0);
          } catch (const kube::NotFound&) {
            // Someone deleted the Node: register it again, as a kubelet would.
            log::warn(kComp, "node object is gone, registering it again", {{"node", n}});
            try {
              for (const auto& sn : nodes) {
                if (sn.name == n) register_node(sn);
              }
            } catch (const std::exception& e) {
              log::warn(kComp, "node registration failed", {{"node", n}, {"error", e.what()}});
            }
          } catch (const std::exception& e) {
            log::warn(kComp, "node status update failed", {{"node", n}, {"error", e.what()}});
          }
        }
      });
      if (stopping) return;
      auto elapsed = Clock::now() - t0;
      auto wait = opts.lease_interval - std::chrono::duration_cast<std::chrono::milliseconds>(elapsed);
      std::unique_lock<std::mutex> l(sleep_mu);
      if (wait.count() > 0) sleep_cv.wait_for(l, wait, [&] { return stopping.load(); });
    }
  }

  // ------------------------------------------------------------------------------------------------------------
  // Pod watch
  // ------------------------------------------------------------------------------------------------------------

  void watch_loop() {
    while (!stopping) {
      try {
        std::string rv;
        auto items = client.list_all(kube::resources::pods, "", {}, &rv);
        post([this, items = std::move(items)] { resync(items); });
        while (!stopping) {
          kube::WatchOptions wo;
          wo.resource_version = rv;
          wo.timeout_seconds = 300;
          wo.stop = watch_stop;
          auto end = client.watch(kube::resources::pods, "", wo, [&](const kube::WatchEvent& ev) {
            std::string new_rv = kube::resource_version_of(ev.object);
            if (!new_rv.empty()) rv = new_rv;
            if (ev.type == kube::WatchEvent::Type::Bookmark) return true;
            Json obj = ev.object;
            if (ev.type == kube::WatchEvent::Type::Deleted) {
              post([this, obj] { on_pod_deleted(str_at(obj["metadata"], "uid")); });
            } else {
              post([this, obj] { on_pod(obj); });
            }
            return !stopping.load();
          });
          if (end == kube::WatchEnd::Stopped || end == kube::WatchEnd::HandlerStopped) break;
        }
      } catch (const kube::Gone&) {
        log::info(kComp, "pod watch expired, relisting");
      } catch (const std::exception& e) {
        if (stopping) break;
        log::warn(kComp, "pod watch failed, relisting in 1 s", {{"error", e.what()}});
        std::unique_lock<std::mutex> l(sleep_mu);
        sleep_cv.wait_for(l, std::chrono::seconds(1), [&] { return stopping.load(); });
      }
    }
  }

  void resync(const std::vector<Json>& items) {
    std::set<std::string> seen;
    for (const auto& pod : items) {
      if (!node_names.count(str_at(pod["spec"], "nodeName"))) continue;
      seen.insert(str_at(pod["metadata"], "uid"));
      on_pod(pod);
    }
    std::vector<std::string> gone;
    for (const auto& [uid, rec] : pods) {
      if (!seen.count(uid)) gone.push_back(uid);
    }
    for (const auto& uid : gone) on_pod_deleted(uid);
    ips->retain_only(seen);
  }

  // ------------------------------------------------------------------------------------------------------------
  // Pod lifecycle (loop thread)
  // ------------------------------------------------------------------------------------------------------------

  void on_pod(const Json& pod) {
    const Json& md = pod["metadata"];
    std::string node = str_at(pod["spec"], "nodeName");
    if (!node_names.count(node)) return;
    std::string uid = str_at(md, "uid");
    auto it = pods.find(uid);
    if (it == pods.end()) {
      PodRec rec;
      rec.uid = uid;
      rec.ns = str_at(md, "namespace");
      rec.name = str_at(md, "name");
      rec.node = node;
      rec.pod = pod;
      const Json& c0 = pod["spec"].value("containers", Json::array());
      rec.container = c0.empty() ? "main" : str_at(c0[0], "name");
      rec.image = c0.empty() ? "" : str_at(c0[0], "image");
      const Json& st = pod.value("status", Json::object());
      std::string phase = str_at(st, "phase");
      rec.phase = phase;
      rec.start_time = str_at(st, "startTime");
      if (auto ip = ips->lookup(uid)) rec.ip = *ip;
      bool terminal = phase == "Succeeded" || phase == "Failed";
      bool started_before = phase == "Running" || !rec.start_time.empty();
      it = pods.emplace(uid, std::move(rec)).first;
      PodRec& r = it->second;
      if (terminal) {
        r.state = PodRec::State::Done;
      } else if (started_before) {
        // Started by an earlier agent run; its process died with that agent (see docs/node-agent.md).
        r.state = PodRec::State::Done;
        if (!r.deleting()) report_agent_restarted(r);
      }
    }
    PodRec& rec = it->second;
    rec.pod = pod;
    if (rec.deleting()) {
      on_deletion(rec);
      return;
    }
    if (rec.state == PodRec::State::New && !node_down(rec.node)) try_start(rec);
  }

  void on_pod_deleted(const std::string& uid) {
    auto it = pods.find(uid);
    if (it == pods.end()) return;
    PodRec& rec = it->second;
    // Deleted outright (grace 0 by us or someone else): nothing may keep running.
    if (rec.state == PodRec::State::Running) supervisor->signal(uid, SIGKILL);
    log::info(kComp, "pod removed", {{"pod", rec.key()}, {"node", rec.node}});
    ips->release(uid);
    pods.erase(it);
  }

  void on_deletion(PodRec& rec) {
    if (rec.delete_sent) return;
    if (rec.state != PodRec::State::Running || node_down(rec.node)) {
      finish_delete(rec);
      return;
    }
    int64_t grace = 30;
    if (auto g = rec.pod["metadata"].find("deletionGracePeriodSeconds");
        g != rec.pod["metadata"].end() && g->is_number_integer()) {
      grace = g->get<int64_t>();
    }
    if (rec.grace_sent && *rec.grace_sent <= grace) return;
    rec.grace_sent = grace;
    supervisor->terminate(rec.uid, std::chrono::seconds(grace));
    log::info(kComp, "stopping pod", {{"pod", rec.key()}, {"grace_seconds", std::to_string(grace)}});
    event(rec, "Normal", "Killing",
          "Stopping container " + rec.container + " (SIGTERM, grace " + std::to_string(grace) + "s)");
  }

  // The pod is gone from our side; finish the API server's graceful delete, which otherwise never completes
  // without a kubelet.
  void finish_delete(PodRec& rec) {
    rec.delete_sent = true;
    kube::DeleteOptions o;
    o.grace_period_seconds = 0;
    o.precondition_uid = rec.uid;
    try {
      client.remove(kube::resources::pods, rec.ns, rec.name, o);
      log::info(kComp, "pod deletion finished", {{"pod", rec.key()}});
    } catch (const kube::NotFound&) {
    } catch (const kube::Conflict&) {
    } catch (const std::exception& e) {
      rec.delete_sent = false;  // the tick retries
      rec.retry_at = Clock::now() + std::chrono::seconds(1);
      log::warn(kComp, "finishing pod deletion failed", {{"pod", rec.key()}, {"error", e.what()}});
    }
  }

  std::optional<std::map<std::string, std::string>> lookup(RefKind kind, const std::string& ns,
                                                           const std::string& name) {
    const auto& res = kind == RefKind::Secret ? kube::resources::secrets : kube::resources::configmaps;
    auto obj = client.try_get(res, ns, name);
    if (!obj) return std::nullopt;
    std::map<std::string, std::string> out;
    const Json data = obj->value("data", Json::object());  // named: items() of a temporary would dangle
    for (const auto& [k, v] : data.items()) {
      if (!v.is_string()) continue;
      out[k] = kind == RefKind::Secret ? kube::base64_decode(v.get<std::string>()) : v.get<std::string>();
    }
    return out;
  }

  void try_start(PodRec& rec) {
    if (rec.ip.empty()) {
      try {
        rec.ip = ips->allocate(rec.uid);
      } catch (const IpExhausted& e) {
        set_waiting(rec, "PodIPExhausted", e.what(), false);
        return;
      }
    }
    LaunchPlan plan;
    try {
      PodContext ctx{rec.node, rec.ip, "127.0.0.1", opts.state_dir};
      plan = build_launch_plan(
          rec.pod, ctx, [this](RefKind k, const std::string& ns, const std::string& n) { return lookup(k, ns, n); },
          inherited_env());
    } catch (const PlanError& e) {
      if (e.permanent()) {
        report_start_failed(rec, e.reason(), e.what());
      } else {
        set_waiting(rec, e.reason(), e.what(), false);
      }
      return;
    }
    rec.container = plan.container_name;
    if (rec.restart_pending) ++rec.restart_count;
    rec.restart_pending = false;
    rec.started_at = SysClock::now();
    rec.started_steady = Clock::now();
    if (rec.start_time.empty()) rec.start_time = rfc3339(rec.started_at);
    try {
      rec.pid = supervisor->start(rec.uid, SpawnSpec{plan.argv, plan.env, plan.working_dir, plan.log_path});
    } catch (const SpawnError& e) {
      log::warn(kComp, "pod process failed to start", {{"pod", rec.key()}, {"error", e.what()}});
      ExitStatus s;
      s.code = 128;
      s.finished_at = SysClock::now();
      rec.state = PodRec::State::Running;  // so that on_terminated applies the restart policy
      on_terminated(rec, s, "StartError", e.what());
      return;
    }
    rec.state = PodRec::State::Running;
    rec.frozen = false;
    rec.waiting_reason.clear();
    save_processes();
    log::info(kComp, "pod started",
              {{"pod", rec.key()},
               {"node", rec.node},
               {"pid", std::to_string(rec.pid)},
               {"ip", rec.ip},
               {"restarts", std::to_string(rec.restart_count)},
               {"log", plan.log_path}});
    Json cs = container_status(rec, {{"running", {{"startedAt", rfc3339(rec.started_at)}}}}, true);
    patch_status(rec, "Running", true, cs);
    event(rec, "Normal", "Started",
          "Started container " + rec.container + " (pid " + std::to_string(rec.pid) + ", ip " + rec.ip + ")");
  }

  void set_waiting(PodRec& rec, const std::string& reason, const std::string& message, bool restart) {
    rec.state = PodRec::State::Waiting;
    rec.retry_at = Clock::now() + kConfigRetry;
    rec.restart_pending = restart;
    if (rec.waiting_reason == reason && rec.waiting_message == message) return;  // already reported
    rec.waiting_reason = reason;
    rec.waiting_message = message;
    log::warn(kComp, "pod cannot start yet", {{"pod", rec.key()}, {"reason", reason}, {"message", message}});
    Json cs = container_status(rec, {{"waiting", {{"reason", reason}, {"message", message}}}}, false);
    patch_status(rec, rec.phase == "Running" ? "Running" : "Pending", false, cs);
    event(rec, "Warning", "Failed", message);
  }

  void report_start_failed(PodRec& rec, const std::string& reason, const std::string& message) {
    rec.state = PodRec::State::Done;
    log::warn(kComp, "pod cannot run", {{"pod", rec.key()}, {"reason", reason}, {"message", message}});
    Json term = {{"exitCode", 128}, {"reason", reason}, {"message", message}, {"finishedAt", now3339()}};
    Json cs = container_status(rec, {{"terminated", term}}, false);
    patch_status(rec, "Failed", false, cs, reason, message);
    event(rec, "Warning", reason, message);
  }

  void report_agent_restarted(PodRec& rec) {
    std::string msg = "railyard-node-agent restarted; the pod's process from the previous agent run is gone";
    log::info(kComp, "marking pod of an earlier agent run failed", {{"pod", rec.key()}});
    Json term = {{"exitCode", 137}, {"reason", "NodeAgentRestarted"}, {"message", msg}, {"finishedAt", now3339()}};
    auto old = rec.pod.value("status", Json::object()).value("containerStatuses", Json::array());
    if (!old.empty()) {
      auto started = old[0].value("state", Json::object()).value("running", Json::object()).value("startedAt", "");
      if (!started.empty()) term["startedAt"] = started;
      rec.restart_count = old[0].value("restartCount", 0);
    }
    Json cs = container_status(rec, {{"terminated", term}}, false);
    patch_status(rec, "Failed", false, cs, "NodeAgentRestarted", msg);
  }

  void on_exit(const std::string& uid, pid_t pid, const ExitStatus& s) {
    auto it = pods.find(uid);
    if (it == pods.end()) return;
    PodRec& rec = it->second;
    if (rec.pid != pid || rec.state != PodRec::State::Running) return;
    save_processes();
    log::info(kComp, "pod process ended", {{"pod", rec.key()}, {"pid", std::to_string(pid)}, {"how", describe(s)}});
    if (node_down(rec.node)) {
      rec.state = PodRec::State::Lost;  // a lost machine reports nothing
      return;
    }
    std::string reason = s.code == 0 ? "Completed" : "Error";
    std::string message = s.signaled ? describe(s) : "";
    on_terminated(rec, s, reason, message);
  }

  void on_terminated(PodRec& rec, const ExitStatus& s, const std::string& reason, const std::string& message) {
    Json term = {{"exitCode", s.code},
                 {"reason", reason},
                 {"startedAt", rfc3339(rec.started_at)},
                 {"finishedAt", rfc3339(s.finished_at)},
                 {"containerID", container_id(rec)}};
    if (!message.empty()) term["message"] = message;
    if (s.signaled) term["signal"] = s.signal;
    rec.pid = 0;
    rec.frozen = false;
    if (rec.deleting()) {
      rec.state = PodRec::State::Done;
      patch_status(rec, s.code == 0 ? "Succeeded" : "Failed", false,
                   container_status(rec, {{"terminated", term}}, false));
      finish_delete(rec);
      return;
    }
    std::string policy = rec.pod["spec"].value("restartPolicy", "Always");
    bool restart = policy == "Always" || (policy == "OnFailure" && s.code != 0);
    if (!restart) {
      rec.state = PodRec::State::Done;
      std::string phase = s.code == 0 ? "Succeeded" : "Failed";
      patch_status(rec, phase, false, container_status(rec, {{"terminated", term}}, false));
      if (s.code != 0) {
        event(rec, "Warning", "Failed",
              "Container " + rec.container + " failed: " + (message.empty() ? describe(s) : message));
      }
      return;
    }
    // Restart with a short exponential backoff (1 s doubling to 10 s), reset after 10 s of healthy running.
    if (Clock::now() - rec.started_steady > std::chrono::seconds(10)) rec.backoff_step = 0;
    auto backoff = std::chrono::seconds(std::min(10, 1 << std::min(rec.backoff_step, 4)));
    ++rec.backoff_step;
    rec.last_terminated = term;
    rec.state = PodRec::State::Waiting;
    rec.restart_pending = true;
    rec.retry_at = Clock::now() + backoff;
    rec.waiting_reason = "CrashLoopBackOff";
    std::string msg = "back-off " + std::to_string(backoff.count()) + "s restarting failed container " + rec.container;
    rec.waiting_message = msg;
    patch_status(rec, "Running", false,
                 container_status(rec, {{"waiting", {{"reason", "CrashLoopBackOff"}, {"message", msg}}}}, false));
    event(rec, "Warning", "BackOff", msg);
  }

  std::string container_id(const PodRec& rec) {
    return "railyard://" + rec.uid + "/" + std::to_string(rec.restart_count);
  }

  Json container_status(const PodRec& rec, const Json& state, bool ready) {
    Json cs = {
        {"name", rec.container},
        {"state", state},
        {"lastState", rec.last_terminated.is_null() ? Json::object() : Json{{"terminated", rec.last_terminated}}},
        {"ready", ready},
        {"restartCount", rec.restart_count},
        {"image", rec.image.empty() ? std::string("railyard-node-agent/command") : rec.image},
        {"imageID", ""},
        {"started", state.contains("running")}};
    if (state.contains("running") || state.contains("terminated")) cs["containerID"] = container_id(rec);
    return cs;
  }

  // Merge patch of pods/status with full lists (a merge patch replaces lists, so send them whole).
  void patch_status(PodRec& rec, const std::string& phase, bool ready, const Json& cs, const std::string& reason = "",
                    const std::string& message = "") {
    std::string now = now3339();
    auto cond = [&](const char* type, bool ok, const std::string& why) {
      Json c = {
          {"type", type}, {"status", ok ? "True" : "False"}, {"lastProbeTime", nullptr}, {"lastTransitionTime", now}};
      if (!ok && !why.empty()) c["reason"] = why;
      return c;
    };
    std::string why = (phase == "Succeeded" || phase == "Failed") ? "PodCompleted" : "ContainersNotReady";
    Json status = {{"phase", phase},
                   {"hostIP", "127.0.0.1"},
                   {"conditions", Json::array({cond("Initialized", true, ""), cond("Ready", ready, why),
                                               cond("ContainersReady", ready, why), cond("PodScheduled", true, "")})},
                   {"containerStatuses", Json::array({cs})},
                   {"qosClass", rec.pod.value("status", Json::object()).value("qosClass", "BestEffort")}};
    if (!rec.ip.empty()) {
      status["podIP"] = rec.ip;
      status["podIPs"] = Json::array({{{"ip", rec.ip}}});
    }
    if (!rec.start_time.empty()) status["startTime"] = rec.start_time;
    status["reason"] = reason.empty() ? Json(nullptr) : Json(reason);
    status["message"] = message.empty() ? Json(nullptr) : Json(message);
    rec.unsent_status = Json{{"status", status}};
    rec.unsent_phase = phase;
    send_status(rec);
  }

  void send_status(PodRec& rec) {
    try {
      client.patch(kube::resources::pods, rec.ns, rec.name, rec.unsent_status, kube::PatchType::Merge, "status");
      rec.phase = rec.unsent_phase;
      rec.unsent_status = nullptr;
    } catch (const kube::NotFound&) {
      rec.unsent_status = nullptr;
    } catch (const std::exception& e) {
      log::warn(kComp, "pod status update failed, retrying in 1 s",
                {{"pod", rec.key()}, {"phase", rec.unsent_phase}, {"error", e.what()}});
      rec.status_retry_at = Clock::now() + std::chrono::seconds(1);
    }
  }

  void event(const PodRec& rec, const std::string& type, const std::string& reason, const std::string& message) {
    Json obj = {{"apiVersion", "v1"},
                {"kind", "Pod"},
                {"metadata", {{"name", rec.name}, {"namespace", rec.ns}, {"uid", rec.uid}}}};
    events->record(obj, type, reason, message);
  }

  void tick() {
    auto now = Clock::now();
    for (auto& [uid, rec] : pods) {
      if (!rec.unsent_status.is_null() && now >= rec.status_retry_at) send_status(rec);
      if (rec.deleting()) {
        if (!rec.delete_sent && rec.state != PodRec::State::Running && now >= rec.retry_at) finish_delete(rec);
        continue;
      }
      if (rec.state == PodRec::State::Waiting && now >= rec.retry_at && !node_down(rec.node)) try_start(rec);
    }
  }

  // Pids of running pods, so that a restarted agent can kill process groups an earlier run left behind.
  void save_processes() {
    Json j = Json::object();
    for (const auto& key : supervisor->keys()) {
      if (auto pid = supervisor->pid(key)) j[key] = {{"pid", *pid}, {"start", proc_start_time(*pid)}};
    }
    try {
      write_file_atomic(processes_file, j.dump() + "\n");
    } catch (const std::exception& e) {
      log::warn(kComp, "cannot save process list", {{"error", e.what()}});
    }
  }

  void kill_leftovers() {
    if (!std::filesystem::exists(processes_file)) return;
    Json j;
    try {
      j = Json::parse(read_file(processes_file, "process list"));
    } catch (const std::exception&) {
      return;
    }
    for (const auto& [uid, v] : j.items()) {
      pid_t pid = v.value("pid", 0);
      if (pid <= 1) continue;
      std::string start = proc_start_time(pid);
      // A live leader with another start time is an unrelated process that got the pid; leave it alone.
      if (!start.empty() && start != v.value("start", "")) continue;
      if (::kill(-pid, SIGKILL) == 0) {
        log::info(kComp, "killed process group left by an earlier agent run",
                  {{"uid", uid}, {"pgid", std::to_string(pid)}});
      }
    }
    std::filesystem::remove(processes_file);
  }

  // ------------------------------------------------------------------------------------------------------------
  // Control endpoint
  // ------------------------------------------------------------------------------------------------------------

  Json control_action(const std::string& action, const Json& args) {
    auto task = std::make_shared<std::packaged_task<Json()>>([this, action, args] { return do_control(action, args); });
    auto fut = task->get_future();
    post([task] { (*task)(); });
    if (fut.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
      throw ControlError(503, "railyard-node-agent is busy (request queued for 20 s): try again");
    }
    return fut.get();
  }

  PodRec& find_pod(const Json& args) {
    std::string key = args.value("pod", "");
    auto slash = key.find('/');
    if (slash == std::string::npos) throw ControlError(400, "pod '" + key + "': use NAMESPACE/NAME");
    std::string ns = key.substr(0, slash), name = key.substr(slash + 1);
    PodRec* found = nullptr;
    for (auto& [uid, rec] : pods) {
      if (rec.ns == ns && rec.name == name) found = &rec;
    }
    if (!found) throw ControlError(404, "no pod " + key + " on this agent's nodes");
    if (found->state != PodRec::State::Running) {
      throw ControlError(409, "pod " + key + " has no running process (state " + state_name(found->state) + ", phase " +
                                  (found->phase.empty() ? "Pending" : found->phase) + ")");
    }
    return *found;
  }

  std::string find_node(const Json& args) {
    std::string node = args.value("node", "");
    if (!node_names.count(node)) {
      std::string all;
      for (const auto& n : node_names) all += (all.empty() ? "" : ", ") + n;
      throw ControlError(404, "no node '" + node + "' on this agent (its nodes: " + all + ")");
    }
    return node;
  }

  Json do_control(const std::string& action, const Json& args) {
    if (action == "kill" || action == "freeze" || action == "thaw") {
      PodRec& rec = find_pod(args);
      int sig = action == "freeze" ? SIGSTOP : action == "thaw" ? SIGCONT : SIGKILL;
      if (action == "kill" && args.contains("signal")) {
        try {
          sig = parse_signal(args["signal"].is_string() ? args["signal"].get<std::string>() : args["signal"].dump());
        } catch (const ConfigError& e) {
          throw ControlError(400, e.what());
        }
      }
      if (!supervisor->signal(rec.uid, sig)) throw ControlError(409, "pod " + rec.key() + " has no running process");
      if (action != "kill") rec.frozen = action == "freeze";
      std::string what = action == "freeze" ? "froze"
                         : action == "thaw" ? "thawed"
                                            : "sent " + signal_name(sig) + " to";
      log::info(kComp, "fault injected", {{"action", action}, {"pod", rec.key()}, {"signal", signal_name(sig)}});
      return {{"message", what + " pod " + rec.key() + " (process group " + std::to_string(rec.pid) + ")"},
              {"pid", rec.pid}};
    }
    if (action == "node-down") {
      std::string node = find_node(args);
      int killed = 0;
      {
        std::lock_guard<std::mutex> l(nodes_mu);
        if (down.count(node)) return {{"message", "node " + node + " is already down"}};
        down.insert(node);
        if (down.size() == node_names.size()) {
          log::warn(kComp,
                    "every node of this agent is down: the node controller stops evicting when no node is Ready");
        }
      }
      for (auto& [uid, rec] : pods) {
        if (rec.node != node) continue;
        if (rec.state == PodRec::State::Running) {
          supervisor->signal(uid, SIGKILL);
          ++killed;
        } else if (rec.state == PodRec::State::Waiting) {
          rec.state = PodRec::State::Lost;
        }
      }
      log::info(kComp, "node down (fault injected)", {{"node", node}, {"killed", std::to_string(killed)}});
      return {{"message",
               "node " + node + " is down: heartbeats stopped, " + std::to_string(killed) + " pod process(es) killed"}};
    }
    if (action == "node-up") {
      std::string node = find_node(args);
      {
        std::lock_guard<std::mutex> l(nodes_mu);
        if (!down.count(node)) return {{"message", "node " + node + " is already up"}};
        down.erase(node);
      }
      renew_lease(node);
      try {
        patch_ready(node, true);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> l(nodes_mu);
        ready_asap.insert(node);  // the heartbeat thread retries
        log::warn(kComp, "node status update failed", {{"node", node}, {"error", e.what()}});
      }
      // Pods that survived (e.g. tolerating the unreachable taint) lost their process with the machine.
      for (auto& [uid, rec] : pods) {
        if (rec.node != node || rec.deleting()) continue;
        if (rec.state == PodRec::State::Lost) {
          ExitStatus s;
          s.signaled = true;
          s.signal = SIGKILL;
          s.code = 137;
          s.finished_at = SysClock::now();
          rec.state = PodRec::State::Running;
          on_terminated(rec, s, "Error", "node " + node + " was down (node-down); the process was killed");
        } else if (rec.state == PodRec::State::New) {
          try_start(rec);
        }
      }
      log::info(kComp, "node up (fault injected)", {{"node", node}});
      return {{"message", "node " + node + " is up: heartbeats resumed, Ready=True"}};
    }
    if (action == "status") {
      Json ns = Json::array(), ps = Json::array();
      for (const auto& n : nodes) {
        Json o = {{"name", n.name}, {"up", !node_down(n.name)}};
        ns.push_back(o);
      }
      for (const auto& [uid, rec] : pods) {
        ps.push_back({{"namespace", rec.ns},
                      {"name", rec.name},
                      {"uid", uid},
                      {"node", rec.node},
                      {"ip", rec.ip},
                      {"pid", rec.state == PodRec::State::Running ? rec.pid : 0},
                      {"state", state_name(rec.state)},
                      {"phase", rec.phase.empty() ? "Pending" : rec.phase},
                      {"restarts", rec.restart_count},
                      {"frozen", rec.frozen}});
      }
      return {{"message", std::to_string(ns.size()) + " node(s), " + std::to_string(ps.size()) + " pod(s)"},
              {"nodes", ns},
              {"pods", ps}};
    }
    throw ControlError(400, "unknown action '" + action + "': use kill, freeze, thaw, node-down, node-up or status");
  }

  // ------------------------------------------------------------------------------------------------------------

  void loop(const std::atomic<bool>& stop) {
    while (!stop && !stopping) {
      std::deque<std::function<void()>> batch;
      {
        std::unique_lock<std::mutex> l(q_mu);
        q_cv.wait_for(l, kTick, [&] { return !queue.empty(); });
        batch.swap(queue);
      }
      for (auto& fn : batch) {
        try {
          fn();
        } catch (const std::exception& e) {
          log::error(kComp, "internal error handling an event", {{"error", e.what()}});
        }
      }
      try {
        tick();
      } catch (const std::exception& e) {
        log::error(kComp, "internal error in periodic work", {{"error", e.what()}});
      }
    }
  }

  // Runs tasks that are still queued (exit reports during shutdown) without starting anything new.
  void drain() {
    std::deque<std::function<void()>> batch;
    {
      std::lock_guard<std::mutex> l(q_mu);
      batch.swap(queue);
    }
    for (auto& fn : batch) {
      try {
        fn();
      } catch (const std::exception&) {
      }
    }
  }
};

Agent::Agent(AgentOptions opts, kube::Client& client) : impl_(std::make_unique<Impl>(std::move(opts), client)) {}
Agent::~Agent() = default;

void Agent::run(const std::atomic<bool>& stop) {
  Impl& d = *impl_;
  std::filesystem::create_directories(d.opts.state_dir + "/pods");
  d.kill_leftovers();
  d.ips = std::make_unique<IpAllocator>(d.opts.state_dir + "/pod-ips.json");
  d.events = std::make_unique<kube::EventRecorder>(
      d.client, kube::EventRecorderOptions{"railyard-node-agent", "", std::chrono::seconds(600)});
  d.supervisor = std::make_unique<Supervisor>([&d](const std::string& key, pid_t pid, const ExitStatus& s) {
    if (d.shutting_down) return;
    d.post([&d, key, pid, s] { d.on_exit(key, pid, s); });
  });
  // The control endpoint comes first so that control.port appears as early as possible; requests wait in the
  // queue until the loop below runs.
  d.control = std::make_unique<ControlServer>(
      d.opts.state_dir, [&d](const std::string& action, const Json& args) { return d.control_action(action, args); });
  log::info(kComp, "control endpoint listening", {{"address", "127.0.0.1:" + std::to_string(d.control->port())}});
  d.register_nodes();
  log::info(kComp, "nodes ready", {{"count", std::to_string(d.nodes.size())}, {"state_dir", d.opts.state_dir}});

  std::thread heartbeat([&d] { d.heartbeat_loop(); });
  std::thread watcher([&d] { d.watch_loop(); });

  // The loop thread is the one that forks pod processes; their PDEATHSIG is tied to it, so it must outlive them.
  d.loop(stop);

  log::info(kComp, "shutting down: stopping pod processes");
  d.control.reset();
  d.shutting_down = true;
  d.stopping = true;
  d.watch_stop->stop();
  { std::lock_guard<std::mutex> l(d.sleep_mu); }
  d.sleep_cv.notify_all();
  d.supervisor->stop_all(std::chrono::duration_cast<std::chrono::milliseconds>(d.opts.shutdown_grace));
  d.save_processes();
  heartbeat.join();
  watcher.join();
  d.drain();
  d.supervisor.reset();
  log::info(kComp, "stopped");
}

}  // namespace railyard::node_agent
