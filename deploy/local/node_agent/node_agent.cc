// The coordinator: owns the loop thread and the pod records, watches the pods bound to the agent's nodes, and
// starts and stops their processes. The nodes' registration and heartbeats (node_lease), the status patches and
// events (pod_status), the fault-injection actions (control_actions) and the leftover-process list (process_list)
// are parts of their own; see README.md for which thread runs what.
#include "deploy/local/node_agent/node_agent.h"

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "common/log.h"
#include "deploy/local/node_agent/control.h"
#include "deploy/local/node_agent/control_actions.h"
#include "deploy/local/node_agent/ip_allocator.h"
#include "deploy/local/node_agent/node_lease.h"
#include "deploy/local/node_agent/pod_record.h"
#include "deploy/local/node_agent/pod_spec.h"
#include "deploy/local/node_agent/pod_status.h"
#include "deploy/local/node_agent/process_list.h"
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

}  // namespace

struct Agent::Impl {
  AgentOptions opts;
  kube::Client& client;
  NodeLeases nodes;  // registration, leases, Ready, down/up: its own heartbeat thread
  ProcessList processes;

  std::unique_ptr<IpAllocator> ips;
  std::unique_ptr<StatusReporter> reporter;
  std::unique_ptr<Supervisor> supervisor;
  std::unique_ptr<ControlActions> actions;
  std::unique_ptr<ControlServer> control;

  std::mutex q_mu;
  std::condition_variable q_cv;
  std::mutex sleep_mu;  // interruptible sleeps of the watch thread
  std::condition_variable sleep_cv;
  std::deque<std::function<void()>> queue;

  std::map<std::string, PodRec> pods;  // by uid; loop thread only
  std::atomic<bool> stopping{false};
  std::atomic<bool> shutting_down{false};
  std::shared_ptr<kube::StopToken> watch_stop = std::make_shared<kube::StopToken>();

  Impl(AgentOptions o, kube::Client& c)
      : opts(std::move(o)), client(c), nodes(opts, client), processes(opts.state_dir + "/processes.json") {}

  void post(std::function<void()> fn) {
    {
      std::lock_guard<std::mutex> l(q_mu);
      queue.push_back(std::move(fn));
    }
    q_cv.notify_one();
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
      if (!nodes.has(str_at(pod["spec"], "nodeName"))) continue;
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
    if (!nodes.has(node)) return;
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
    if (rec.state == PodRec::State::New && !nodes.is_down(rec.node)) try_start(rec);
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
    if (rec.state != PodRec::State::Running || nodes.is_down(rec.node)) {
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
    reporter->event(rec, "Normal", "Killing",
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

  // The pod's address and launch plan; nullopt (and the reason reported) when it cannot start now or ever.
  std::optional<LaunchPlan> plan_launch(PodRec& rec) {
    if (rec.ip.empty()) {
      try {
        rec.ip = ips->allocate(rec.uid);
      } catch (const IpExhausted& e) {
        set_waiting(rec, "PodIPExhausted", e.what(), false);
        return std::nullopt;
      }
    }
    try {
      PodContext ctx{rec.node, rec.ip, "127.0.0.1", opts.state_dir};
      return build_launch_plan(
          rec.pod, ctx, [this](RefKind k, const std::string& ns, const std::string& n) { return lookup(k, ns, n); },
          inherited_env());
    } catch (const PlanError& e) {
      if (e.permanent()) {
        report_start_failed(rec, e.reason(), e.what());
      } else {
        set_waiting(rec, e.reason(), e.what(), false);
      }
      return std::nullopt;
    }
  }

  // Forks the pod's process: called on the loop thread only, whose exit PR_SET_PDEATHSIG ties the pods to.
  void try_start(PodRec& rec) {
    std::optional<LaunchPlan> planned = plan_launch(rec);
    if (!planned) return;
    const LaunchPlan& plan = *planned;
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
    processes.save(*supervisor);
    log::info(kComp, "pod started",
              {{"pod", rec.key()},
               {"node", rec.node},
               {"pid", std::to_string(rec.pid)},
               {"ip", rec.ip},
               {"restarts", std::to_string(rec.restart_count)},
               {"log", plan.log_path}});
    Json cs = container_status(rec, {{"running", {{"startedAt", rfc3339(rec.started_at)}}}}, true);
    reporter->report(rec, "Running", true, cs);
    reporter->event(rec, "Normal", "Started",
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
    reporter->report(rec, rec.phase == "Running" ? "Running" : "Pending", false, cs);
    reporter->event(rec, "Warning", "Failed", message);
  }

  void report_start_failed(PodRec& rec, const std::string& reason, const std::string& message) {
    rec.state = PodRec::State::Done;
    log::warn(kComp, "pod cannot run", {{"pod", rec.key()}, {"reason", reason}, {"message", message}});
    Json term = {{"exitCode", 128}, {"reason", reason}, {"message", message}, {"finishedAt", now3339()}};
    Json cs = container_status(rec, {{"terminated", term}}, false);
    reporter->report(rec, "Failed", false, cs, reason, message);
    reporter->event(rec, "Warning", reason, message);
  }

  void report_agent_restarted(PodRec& rec) {
    std::string msg = "railyard-node-agent restarted; the pod's process from the previous agent run is gone";
    log::info(kComp, "marking pod of an earlier agent run failed", {{"pod", rec.key()}});
    Json term = agent_restarted_state(rec.pod, msg, now3339());
    auto old = rec.pod.value("status", Json::object()).value("containerStatuses", Json::array());
    if (!old.empty()) rec.restart_count = old[0].value("restartCount", 0);
    Json cs = container_status(rec, {{"terminated", term}}, false);
    reporter->report(rec, "Failed", false, cs, "NodeAgentRestarted", msg);
  }

  void on_exit(const std::string& uid, pid_t pid, const ExitStatus& s) {
    auto it = pods.find(uid);
    if (it == pods.end()) return;
    PodRec& rec = it->second;
    if (rec.pid != pid || rec.state != PodRec::State::Running) return;
    processes.save(*supervisor);
    log::info(kComp, "pod process ended", {{"pod", rec.key()}, {"pid", std::to_string(pid)}, {"how", describe(s)}});
    if (nodes.is_down(rec.node)) {
      rec.state = PodRec::State::Lost;  // a lost machine reports nothing
      return;
    }
    std::string reason = s.code == 0 ? "Completed" : "Error";
    std::string message = s.signaled ? describe(s) : "";
    on_terminated(rec, s, reason, message);
  }

  void on_terminated(PodRec& rec, const ExitStatus& s, const std::string& reason, const std::string& message) {
    Json term = terminated_state(rec, s, reason, message);
    rec.pid = 0;
    rec.frozen = false;
    if (rec.deleting()) {
      rec.state = PodRec::State::Done;
      reporter->report(rec, s.code == 0 ? "Succeeded" : "Failed", false,
                       container_status(rec, {{"terminated", term}}, false));
      finish_delete(rec);
      return;
    }
    std::string policy = rec.pod["spec"].value("restartPolicy", "Always");
    bool restart = policy == "Always" || (policy == "OnFailure" && s.code != 0);
    if (!restart) {
      rec.state = PodRec::State::Done;
      std::string phase = s.code == 0 ? "Succeeded" : "Failed";
      reporter->report(rec, phase, false, container_status(rec, {{"terminated", term}}, false));
      if (s.code != 0) {
        reporter->event(rec, "Warning", "Failed",
                        "Container " + rec.container + " failed: " + (message.empty() ? describe(s) : message));
      }
      return;
    }
    schedule_restart(rec, term);
  }

  // Restart with a short exponential backoff (1 s doubling to 10 s), reset after 10 s of healthy running.
  void schedule_restart(PodRec& rec, const Json& term) {
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
    reporter->report(rec, "Running", false,
                     container_status(rec, {{"waiting", {{"reason", "CrashLoopBackOff"}, {"message", msg}}}}, false));
    reporter->event(rec, "Warning", "BackOff", msg);
  }

  void tick() {
    auto now = Clock::now();
    for (auto& [uid, rec] : pods) {
      reporter->resend_due(rec, now);
      if (rec.deleting()) {
        if (!rec.delete_sent && rec.state != PodRec::State::Running && now >= rec.retry_at) finish_delete(rec);
        continue;
      }
      if (rec.state == PodRec::State::Waiting && now >= rec.retry_at && !nodes.is_down(rec.node)) try_start(rec);
    }
  }

  // ------------------------------------------------------------------------------------------------------------
  // Loop thread
  // ------------------------------------------------------------------------------------------------------------

  // Called on the control server's thread: the action runs on the loop thread, which owns the pods.
  Json control_action(const std::string& action, const Json& args) {
    auto task =
        std::make_shared<std::packaged_task<Json()>>([this, action, args] { return actions->handle(action, args); });
    auto fut = task->get_future();
    post([task] { (*task)(); });
    if (fut.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
      throw ControlError(503, "railyard-node-agent is busy (request queued for 20 s): try again");
    }
    return fut.get();
  }

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

  // Everything but the nodes' registration, in the order the threads that call back into the agent need it.
  void start_parts() {
    std::filesystem::create_directories(opts.state_dir + "/pods");
    processes.kill_leftovers();
    ips = std::make_unique<IpAllocator>(opts.state_dir + "/pod-ips.json");
    reporter = std::make_unique<StatusReporter>(client);
    supervisor = std::make_unique<Supervisor>([this](const std::string& key, pid_t pid, const ExitStatus& s) {
      if (shutting_down) return;
      post([this, key, pid, s] { on_exit(key, pid, s); });
    });
    actions = std::make_unique<ControlActions>(
        pods, nodes, *supervisor,
        PodLifecycleHooks{[this](PodRec& rec) { try_start(rec); },
                          [this](PodRec& rec, const ExitStatus& s, const std::string& reason,
                                 const std::string& message) { on_terminated(rec, s, reason, message); }});
    // The control endpoint comes first so that control.port appears as early as possible; requests wait in the
    // queue until the loop runs.
    control = std::make_unique<ControlServer>(
        opts.state_dir, [this](const std::string& action, const Json& args) { return control_action(action, args); });
    log::info(kComp, "control endpoint listening", {{"address", "127.0.0.1:" + std::to_string(control->port())}});
  }

  // After the loop returned: pods get their grace, the other threads stop, and exits still queued are handled.
  void shut_down(std::thread& watcher) {
    log::info(kComp, "shutting down: stopping pod processes");
    control.reset();
    shutting_down = true;
    stopping = true;
    nodes.stop();
    watch_stop->stop();
    { std::lock_guard<std::mutex> l(sleep_mu); }
    sleep_cv.notify_all();
    supervisor->stop_all(std::chrono::duration_cast<std::chrono::milliseconds>(opts.shutdown_grace));
    processes.save(*supervisor);
    nodes.join();
    watcher.join();
    drain();
    supervisor.reset();
    log::info(kComp, "stopped");
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
  d.start_parts();
  d.nodes.register_all();
  log::info(kComp, "nodes ready", {{"count", std::to_string(d.nodes.nodes().size())}, {"state_dir", d.opts.state_dir}});

  d.nodes.start_heartbeats();
  if (!d.opts.run_pods) log::info(kComp, "pods are left alone (--no-pods): nodes only");
  std::thread watcher([&d] {
    if (d.opts.run_pods) d.watch_loop();
  });

  // The loop thread is the one that forks pod processes; their PDEATHSIG is tied to it, so it must outlive them.
  d.loop(stop);

  d.shut_down(watcher);
}

}  // namespace railyard::node_agent
