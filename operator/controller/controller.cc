#include "operator/controller/controller.h"

#include <openssl/evp.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <set>

#include "common/log.h"
#include "common/rendezvous_protocol.h"
#include "operator/controller/failure_policy.h"
#include "operator/controller/lifecycle.h"
#include "operator/controller/nccl_env.h"
#include "operator/controller/plan_glue.h"
#include "operator/controller/pod_state.h"
#include "operator/controller/restart_triggers.h"
#include "operator/controller/slow_start.h"
#include "operator/controller/status.h"

namespace railyard::op {

namespace {

constexpr const char* kLog = "controller";
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

const std::vector<std::string> kPhases = {"Pending",  "Created",   "Scheduled", "Running", "Restarting",
                                          "Resizing", "Suspended", "Succeeded", "Failed",  "Invalid"};

// "a, b, c" for a short list; the first 20 and a count for a gang of hundreds (an event message stays readable).
std::string name_summary(const std::vector<std::string>& items) {
  constexpr size_t kShown = 20;
  std::string out;
  for (size_t i = 0; i < items.size() && i < kShown; ++i) out += (i ? ", " : "") + items[i];
  if (items.size() > kShown) out += ", ... (" + std::to_string(items.size()) + " in all)";
  return out;
}

std::pair<std::string, std::string> split_key(const std::string& key) {
  auto slash = key.find('/');
  if (slash == std::string::npos) return {"", key};
  return {key.substr(0, slash), key.substr(slash + 1)};
}

std::string base64_decode(const std::string& in) {
  if (in.empty()) return "";
  std::string out(in.size() / 4 * 3 + 3, '\0');
  int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(in.data()), static_cast<int>(in.size()));
  if (n < 0) throw Error("rendezvous Secret: data.token is not valid base64");
  size_t pad = 0;
  if (in.size() >= 1 && in[in.size() - 1] == '=') pad++;
  if (in.size() >= 2 && in[in.size() - 2] == '=') pad++;
  out.resize(static_cast<size_t>(n) - pad);
  return out;
}

// A job whose template sets its own command runs no agent, so nobody joins the rendezvous: pod phases decide.
bool uses_agent(const Json& job) {
  const Json& spec = job["spec"];
  if (!spec.contains("template") || !spec["template"].is_object()) return true;
  const Json tspec = spec["template"].value("spec", Json::object());
  const Json cs = tspec.value("containers", Json::array());
  return !(cs.is_array() && !cs.empty() && cs[0].is_object() && cs[0].contains("command"));
}

FinishedFacts finished_facts(const Json& job) {
  FinishedFacts f;
  const Json status = job.contains("status") && job["status"].is_object() ? job["status"] : Json::object();
  f.phase = status.value("phase", "");
  f.succeeded_condition = condition_true(status, "Succeeded");
  f.failed_condition = condition_true(status, "Failed");
  f.generation = job["metadata"].value("generation", int64_t{0});
  const Json observed = status.value("observedGeneration", Json());
  if (observed.is_number_integer()) f.observed_generation = observed.get<int64_t>();
  const Json ann = job["metadata"].value("annotations", Json::object());
  f.restart_request = ann.value(kRestartRequestAnnotation, "");
  f.restart_handled = ann.value(kRestartHandledAnnotation, "");
  const Json handled = status.value("restartRequestHandled", Json());
  if (handled.is_string()) f.request_handled = handled.get<std::string>();
  return f;
}

}  // namespace

Controller::Controller(kube::Client& client, metrics::Registry& registry, ControllerOptions opts,
                       std::unique_ptr<Placement> placement)
    : client_(client),
      registry_(registry),
      opts_(std::move(opts)),
      placement_(placement ? std::move(placement) : std::make_unique<SimplePlacement>()),
      recorder_(client, kube::EventRecorderOptions{"railyard-operator", "", std::chrono::seconds(600)}),
      jobs_by_phase_(registry.gauge("railyard_operator_jobs", "TrainingJobs by phase, from the informer cache.")),
      restarts_(registry.counter("railyard_operator_restarts_total", "Restarts (new generations) by reason.")),
      errors_(registry.counter("railyard_operator_reconcile_errors_total", "Reconciles that ended in an error.")),
      placement_seconds_(registry.histogram("railyard_operator_placement_seconds",
                                            "Time to compute one gang placement.",
                                            metrics::exponential_buckets(0.0001, 4, 10))),
      recovery_seconds_(registry.histogram(
          "railyard_operator_recovery_seconds",
          "From a restart decision to the first training step of the new generation, by restart reason.",
          metrics::exponential_buckets(0.5, 2, 12))),
      detection_seconds_(registry.histogram(
          "railyard_operator_detection_seconds",
          "From a symptom's onset to the restart request that reported it (monitor requests), by symptom.",
          metrics::exponential_buckets(0.5, 2, 12))),
      wq_depth_(registry.gauge("workqueue_depth", "Current depth of the work queue.")),
      wq_adds_(registry.counter("workqueue_adds_total", "Adds handled by the work queue.")),
      wq_retries_(registry.counter("workqueue_retries_total", "Rate-limited retries handled by the work queue.")),
      cr_total_(registry.counter("controller_runtime_reconcile_total", "Reconciles per controller and result.")),
      cr_errors_(registry.counter("controller_runtime_reconcile_errors_total", "Reconcile errors per controller.")),
      cr_time_(registry.histogram("controller_runtime_reconcile_time_seconds", "Length of reconciles per controller.",
                                  metrics::exponential_buckets(0.001, 2, 16))) {
  for (const auto& p : kPhases) jobs_by_phase_.add({{"phase", p}}).set(0);
  const metrics::Labels c{{"controller", opts_.controller_name}};
  errors_.add(c);
  cr_errors_.add(c);
  for (const char* r : {"success", "error", "requeue", "requeue_after"})
    cr_total_.add({{"controller", opts_.controller_name}, {"result", r}});
  wq_depth_.add({{"name", opts_.controller_name}});
  wq_adds_.add({{"name", opts_.controller_name}});
  wq_retries_.add({{"name", opts_.controller_name}});

  kube::InformerOptions jo;
  jo.ns = opts_.ns;
  jo.resync_period = opts_.resync;
  jobs_ = std::make_unique<kube::Informer>(client_, kube::resources::trainingjobs, jo);
  kube::InformerOptions po;
  po.ns = opts_.ns;
  po.label_selector = kJobLabel;
  pods_ = std::make_unique<kube::Informer>(client_, kube::resources::pods, po);
  nodes_ = std::make_unique<kube::Informer>(client_, kube::resources::nodes, kube::InformerOptions{});

  jobs_->on_add([this](const Json& j) { enqueue(kube::key_of(j)); });
  jobs_->on_update([this](const Json&, const Json& j) { enqueue(kube::key_of(j)); });
  jobs_->on_delete([this](const Json& j) { enqueue(kube::key_of(j)); });
  auto pod_key = [this](const Json& p) {
    const Json labels = p["metadata"].value("labels", Json::object());
    if (labels.contains(kJobLabel) && labels[kJobLabel].is_string())
      enqueue(kube::namespace_of(p) + "/" + labels[kJobLabel].get<std::string>());
  };
  pods_->on_add(pod_key);
  pods_->on_update([pod_key](const Json&, const Json& p) { pod_key(p); });
  pods_->on_delete(pod_key);
  // Nodes change often (conditions' heartbeat times); only readiness, cordons and taints matter to jobs.
  auto node_shape = [](const Json& n) {
    return Json{node_ready(n), n.value("spec", Json::object()).value("unschedulable", false),
                n.value("spec", Json::object()).value("taints", Json::array())};
  };
  nodes_->on_add([this](const Json&) { enqueue_all_jobs(); });
  nodes_->on_delete([this](const Json&) { enqueue_all_jobs(); });
  nodes_->on_update([this, node_shape](const Json& a, const Json& b) {
    if (node_shape(a) != node_shape(b)) enqueue_all_jobs();
  });
}

Controller::~Controller() { stop(); }

void Controller::start_informers() {
  nodes_->start();
  pods_->start();
  jobs_->start();
}

bool Controller::wait_for_sync(milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  for (kube::Informer* inf : {nodes_.get(), pods_.get(), jobs_.get()}) {
    auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    if (left.count() <= 0 || !inf->wait_for_sync(left)) return false;
  }
  synced_ = true;
  return true;
}

void Controller::set_rendezvous(RendezvousService* rdzv, const std::string& advertised_addr) {
  {
    std::lock_guard lock(mu_);
    if (!advertised_addr.empty()) opts_.pod.rendezvous_addr = advertised_addr;
    rdzv_ = rdzv;
    opened_.clear();
  }
  if (rdzv) {
    rdzv->set_exit_handler([this](const WorkerExit& e) { report_exit(e); });
    rdzv->set_join_timeout_handler([this](const JoinTimeout& t) { report_join_timeout(t); });
  }
}

void Controller::start_workers() {
  for (int i = 0; i < std::max(1, opts_.workers); ++i) workers_.emplace_back([this] { worker_loop(); });
}

void Controller::stop() {
  if (stopping_.exchange(true)) return;
  queue_.shut_down();
  for (auto& t : workers_)
    if (t.joinable()) t.join();
  workers_.clear();
  jobs_->stop();
  pods_->stop();
  nodes_->stop();
}

void Controller::report_exit(const WorkerExit& exit) {
  {
    std::lock_guard lock(mu_);
    WorkerExit e = exit;
    if (e.received == std::chrono::steady_clock::time_point{}) e.received = std::chrono::steady_clock::now();
    exits_[e.job_key].push_back(std::move(e));
  }
  enqueue(exit.job_key);
}

void Controller::report_join_timeout(const JoinTimeout& timeout) {
  {
    std::lock_guard lock(mu_);
    timeouts_[timeout.job_key].push_back(timeout);
  }
  enqueue(timeout.job_key);
}

void Controller::enqueue(const std::string& key) {
  queue_.add(key);
  wq_adds_.add({{"name", opts_.controller_name}}).increment();
  wq_depth_.add({{"name", opts_.controller_name}}).set(static_cast<double>(queue_.size()));
}

void Controller::enqueue_all_jobs() {
  for (const auto& key : jobs_->keys()) enqueue(key);
}

void Controller::worker_loop() {
  const metrics::Labels c{{"controller", opts_.controller_name}};
  std::string key;
  while (queue_.get(key)) {
    wq_depth_.add({{"name", opts_.controller_name}}).set(static_cast<double>(queue_.size()));
    auto t0 = Clock::now();
    std::string result = "success";
    try {
      milliseconds after = reconcile(key);
      queue_.forget(key);
      if (after.count() > 0) {
        queue_.add_after(key, after);
        result = "requeue_after";
      }
    } catch (const kube::Conflict& e) {
      // Someone else changed the job or a pod since we read it: read again, promptly.
      log::info(kLog, "conflict, re-reading", {{"job", key}, {"error", e.what()}});
      queue_.add_rate_limited(key);
      wq_retries_.add({{"name", opts_.controller_name}}).increment();
      result = "requeue";
    } catch (const std::exception& e) {
      log::warn(kLog, "reconcile failed", {{"job", key}, {"error", e.what()}});
      errors_.add(c).increment();
      cr_errors_.add(c).increment();
      queue_.add_rate_limited(key);
      wq_retries_.add({{"name", opts_.controller_name}}).increment();
      result = "error";
    }
    queue_.done(key);
    cr_total_.add({{"controller", opts_.controller_name}, {"result", result}}).increment();
    cr_time_.add(c).observe(std::chrono::duration<double>(Clock::now() - t0).count());
    update_phase_gauge();
  }
}

void Controller::update_phase_gauge() {
  std::map<std::string, int> counts;
  for (const Json& j : jobs_->list()) {
    std::string phase = j.contains("status") ? j["status"].value("phase", "") : "";
    counts[phase.empty() ? "Pending" : phase]++;
  }
  for (const auto& p : kPhases) jobs_by_phase_.add({{"phase", p}}).set(counts[p]);
}

std::vector<Json> Controller::pods_of(const std::string& ns, const std::string& name) {
  std::vector<Json> out;
  for (Json& p : pods_->list()) {
    if (kube::namespace_of(p) != ns) continue;
    const Json labels = p["metadata"].value("labels", Json::object());
    if (labels.value(kJobLabel, "") == name) out.push_back(std::move(p));
  }
  return out;
}

void Controller::forget_job(const std::string& key) {
  RendezvousService* rdzv = nullptr;
  {
    std::lock_guard lock(mu_);
    rdzv = rdzv_;
    exits_.erase(key);
    timeouts_.erase(key);
    tokens_.erase(key);
    if (opened_.erase(key) == 0) rdzv = nullptr;
  }
  if (rdzv) rdzv->close_job(key);
  // The job is gone: its per-job series would otherwise stay in /metrics (and in memory) for the operator's life.
  if (auto slash = key.find('/'); slash != std::string::npos)
    restarts_.remove_matching({{"namespace", key.substr(0, slash)}, {"job", key.substr(slash + 1)}});
}

std::string Controller::ensure_token(const Json& job) {
  const std::string key = kube::key_of(job), uid = uid_of(job);
  {
    std::lock_guard lock(mu_);
    auto it = tokens_.find(key);
    if (it != tokens_.end() && it->second.first == uid) return it->second.second;
  }
  const std::string ns = kube::namespace_of(job), name = token_secret_name(kube::name_of(job));
  auto secret = client_.try_get(kube::resources::secrets, ns, name);
  if (secret) {
    bool ours = false;
    for (const Json& o : secret->at("metadata").value("ownerReferences", Json::array()))
      if (o.value("uid", "") == uid) ours = true;
    if (!ours) {
      // Left over from an earlier job of the same name (the garbage collector has not caught up): replace it.
      client_.remove(kube::resources::secrets, ns, name);
      throw kube::Conflict(409, "Conflict", "Secret " + ns + "/" + name + " belongs to an older job; replacing it");
    }
  } else {
    try {
      secret = client_.create(kube::resources::secrets, ns, build_token_secret(job, random_token()));
    } catch (const kube::AlreadyExists&) {
      secret = client_.get(kube::resources::secrets, ns, name);
    }
  }
  const Json data = secret->value("data", Json::object());
  if (!data.contains(kTokenKey)) throw Error("Secret " + ns + "/" + name + " has no data.token: delete it");
  std::string token = base64_decode(data[kTokenKey].get<std::string>());
  std::lock_guard lock(mu_);
  tokens_[key] = {uid, token};
  return token;
}

Json Controller::write_status(const Json& job, const Json& status) {
  Json obj = job;
  obj["status"] = status;
  return client_.update_status(kube::resources::trainingjobs, kube::namespace_of(job), obj);
}

void Controller::emit(const Json& job, const std::vector<PendingEvent>& events) {
  for (const auto& e : events) {
    if (e.warning)
      recorder_.warning(job, e.reason, e.message);
    else
      recorder_.normal(job, e.reason, e.message);
  }
}

void Controller::delete_pod(const std::string& ns, const std::string& name, bool force) {
  kube::DeleteOptions o;
  if (force) o.grace_period_seconds = 0;
  try {
    client_.remove(kube::resources::pods, ns, name, o);
  } catch (const kube::NotFound&) {
  }
}

std::chrono::milliseconds Controller::finish(const Json& job, const JobSpec& spec, Json& status, const Json& orig,
                                             std::vector<PendingEvent>& events, const std::vector<Json>& pods) {
  const std::string ns = kube::namespace_of(job), key = kube::key_of(job);
  // Persist the outcome before cleaning up, so a crash in between cannot lose it.
  Json current = job;
  if (status_differs(orig, status)) current = write_status(job, status);
  emit(job, events);
  for (const Json& p : pods) {
    if (terminating(p)) continue;
    const std::string phase = phase_of(p);
    bool active = phase != "Succeeded" && phase != "Failed";
    if (spec.clean_pod_policy == "All" || (spec.clean_pod_policy == "Running" && active))
      delete_pod(ns, kube::name_of(p), false);
  }
  {
    std::lock_guard lock(mu_);
    exits_.erase(key);
    timeouts_.erase(key);
  }
  RendezvousService* rdzv = nullptr;
  {
    std::lock_guard lock(mu_);
    if (opened_.erase(key)) rdzv = rdzv_;
  }
  if (rdzv) rdzv->close_job(key);
  if (spec.ttl_seconds_after_finished && status.contains("completionTime")) {
    auto done = kube::parse_rfc3339(status["completionTime"].get<std::string>());
    auto expire = done + std::chrono::seconds(*spec.ttl_seconds_after_finished);
    auto now = std::chrono::system_clock::now();
    if (now >= expire) {
      log::info(kLog, "deleting finished job after ttlSecondsAfterFinished", {{"job", key}});
      kube::DeleteOptions o;
      o.propagation_policy = "Background";
      try {
        client_.remove(kube::resources::trainingjobs, ns, kube::name_of(job), o);
      } catch (const kube::NotFound&) {
      }
      return milliseconds(0);
    }
    return std::chrono::duration_cast<milliseconds>(expire - now) + milliseconds(100);
  }
  return milliseconds(0);
}

std::chrono::milliseconds Controller::keep_finished(const Json& job, const FinishedJob& done) {
  const std::string ns = kube::namespace_of(job), name = kube::name_of(job);
  const Json orig = job.contains("status") && job["status"].is_object() ? job["status"] : Json::object();
  Json status = orig;
  const std::vector<Json> pods = pods_of(ns, name);
  // Only the acknowledgements change: the spec version seen and the live pod count (cleanPodPolicy deletes pods).
  status["observedGeneration"] = job["metadata"].value("generation", 0);
  status["replicas"] =
      static_cast<int>(std::count_if(pods.begin(), pods.end(), [](const Json& p) { return !terminating(p); }));
  std::vector<PendingEvent> events;
  for (const std::string& m : done.ignored) events.push_back({true, "IgnoredAfterFinish", m});
  // cleanPodPolicy and ttlSecondsAfterFinished as the spec says now (defaults where it no longer parses).
  const ParsedJob parsed = parse_job(job);
  const milliseconds after = finish(job, parsed.spec, status, orig, events, pods);
  if (done.restart_ignored) {
    const std::string req = job["metadata"].value("annotations", Json::object()).value(kRestartRequestAnnotation, "");
    try {
      client_.patch(kube::resources::trainingjobs, ns, name,
                    {{"metadata", {{"annotations", {{kRestartHandledAnnotation, req}}}}}});
    } catch (const kube::NotFound&) {
      // Deleted after ttlSecondsAfterFinished meanwhile.
    }
  }
  return after;
}

std::chrono::milliseconds Controller::reconcile(const std::string& key) {
  // Plain variables, not a structured binding: lambdas below capture them, which clang before 16 refuses.
  const auto key_parts = split_key(key);
  const std::string& ns = key_parts.first;
  const std::string& name = key_parts.second;
  // Read the job from the server, not the cache: a status we just wrote must be seen, or a restart is counted twice.
  auto fetched = client_.try_get(kube::resources::trainingjobs, ns, name);
  if (!fetched || (*fetched)["metadata"].contains("deletionTimestamp")) {
    forget_job(key);
    return milliseconds(0);
  }
  Json job = *fetched;
  // Succeeded and Failed are terminal: nothing below may reopen a finished job (lifecycle.h finished_job).
  if (const FinishedJob done = finished_job(finished_facts(job)); done.finished) return keep_finished(job, done);
  const auto now = std::chrono::system_clock::now();
  const std::string now_s = kube::format_rfc3339(now);
  Json status = job.contains("status") && job["status"].is_object() ? job["status"] : Json::object();
  Json orig = status;
  std::vector<PendingEvent> events;
  milliseconds requeue{0};
  auto keep_min = [&requeue](milliseconds d) {
    if (d.count() > 0 && (requeue.count() == 0 || d < requeue)) requeue = d;
  };

  status["observedGeneration"] = job["metadata"].value("generation", 0);
  status["selector"] = job_selector(name);
  std::vector<Json> pods = pods_of(ns, name);
  int existing = 0;
  for (const Json& p : pods)
    if (!terminating(p)) existing++;

  ParsedJob parsed = parse_job(job);
  // spec.parallelism.auto: the planner picks the layout for spec.replicas on the nodes the job can use.
  std::optional<AutoPlan> auto_plan;
  if (!parsed.violation && parsed.spec.auto_parallel) {
    AutoPlanOutcome planned =
        plan_parallelism(parsed.spec, parsed.spec.replicas, build_inventory(nodes_->list(), pods_->list()));
    parsed.violation = planned.violation;
    if (planned.plan) {
      auto_plan = planned.plan;
      apply_plan(parsed.spec, *auto_plan);
    }
  }
  if (!parsed.violation) parsed.violation = check_path_roots(parsed.spec, opts_.pod.roots);
  if (parsed.violation) {
    const Violation& v = *parsed.violation;
    if (set_condition(status, "Invalid", true, v.reason, v.message, now_s))
      events.push_back({true, "Invalid", v.message});
    status["phase"] = "Invalid";
    status["replicas"] = existing;
    if (status_differs(orig, status)) write_status(job, status);
    emit(job, events);
    return milliseconds(0);
  }
  if (find_condition(orig, "Invalid"))
    set_condition(status, "Invalid", false, "Valid", "the spec passed validation", now_s);
  const JobSpec& spec = parsed.spec;
  const int n = spec.replicas;
  status["totalSteps"] = spec.steps;
  if (!status.contains("restarts")) status["restarts"] = 0;
  if (!status.contains("generation")) status["generation"] = 0;
  if (!status.contains("step")) status["step"] = 0;
  status["progress"] = std::to_string(status["step"].get<int64_t>()) + "/" + std::to_string(spec.steps);

  // Suspend: no pods, keep the job; resuming starts a new generation.
  if (spec.suspend) {
    for (const Json& p : pods)
      if (!terminating(p)) delete_pod(ns, kube::name_of(p), false);
    if (set_condition(status, "Suspended", true, "Suspended", "runPolicy.suspend is true: pods deleted", now_s))
      events.push_back({false, "Suspended", "runPolicy.suspend is true: deleting the job's pods"});
    if (find_condition(status, "Running"))
      set_condition(status, "Running", false, "Suspended", "the job is suspended", now_s);
    status["phase"] = "Suspended";
    status["replicas"] = 0;
    if (status_differs(orig, status)) write_status(job, status);
    emit(job, events);
    RendezvousService* rdzv = nullptr;
    {
      std::lock_guard lock(mu_);
      if (opened_.erase(key)) rdzv = rdzv_;
    }
    if (rdzv) rdzv->close_job(key);
    return milliseconds(0);
  }
  bool resumed = false;
  if (condition_true(orig, "Suspended")) {
    set_condition(status, "Suspended", false, "Resumed", "runPolicy.suspend is false: pods recreated", now_s);
    events.push_back({false, "Resumed", "runPolicy.suspend is false: recreating pods in a new generation"});
    resumed = true;
  }

  int64_t gen = status["generation"].get<int64_t>();
  int restarts = status["restarts"].get<int>();

  // Deadline.
  if (spec.active_deadline_seconds && status.contains("startTime")) {
    auto start = kube::parse_rfc3339(status["startTime"].get<std::string>());
    auto deadline = start + std::chrono::seconds(*spec.active_deadline_seconds);
    if (now >= deadline) {
      std::string msg = "runPolicy.activeDeadlineSeconds=" + std::to_string(*spec.active_deadline_seconds) +
                        " passed since the job started";
      status["phase"] = "Failed";
      status["completionTime"] = now_s;
      set_condition(status, "Failed", true, "DeadlineExceeded", msg, now_s);
      set_condition(status, "Running", false, "DeadlineExceeded", msg, now_s);
      events.push_back({true, "Failed", "DeadlineExceeded: " + msg});
      status["replicas"] = existing;
      return finish(job, spec, status, orig, events, pods);
    }
    keep_min(std::chrono::duration_cast<milliseconds>(deadline - now) + milliseconds(100));
  }

  // What the rendezvous service saw.
  RendezvousService* rdzv = nullptr;
  std::vector<WorkerExit> exits;
  std::vector<JoinTimeout> timeouts;
  {
    std::lock_guard lock(mu_);
    rdzv = rdzv_;
    if (auto it = exits_.find(key); it != exits_.end()) {
      exits = std::move(it->second);
      exits_.erase(it);
    }
    if (auto it = timeouts_.find(key); it != timeouts_.end()) {
      timeouts = std::move(it->second);
      timeouts_.erase(it);
    }
  }
  std::optional<RendezvousService::Progress> progress;
  if (rdzv && gen > 0) {
    progress = rdzv->progress(key);
    if (progress && progress->generation != gen) progress.reset();
  }
  std::string join_timeout;  // why the world is incomplete, for the Running condition
  for (const JoinTimeout& t : timeouts) {
    if (t.generation != gen) continue;
    std::string missing;
    for (const auto& m : t.missing) missing += (missing.empty() ? "" : ", ") + m;
    join_timeout = "generation " + std::to_string(gen) + ": pods never joined the rendezvous: " + missing;
    events.push_back({true, "JoinTimeout", join_timeout});
  }
  if (join_timeout.empty()) {
    // A timeout seen by an earlier reconcile stays visible until the world completes or the generation moves on.
    auto c = find_condition(orig, "Running");
    if (c && c->value("reason", "") == "JoinTimeout" &&
        c->value("message", "").rfind("generation " + std::to_string(gen) + ":", 0) == 0)
      join_timeout = c->value("message", "");
  }

  // The pods of the current generation's world (status.world.pods; older statuses only have world.size).
  std::vector<std::string> old_members;
  if (status.contains("world") && status["world"].is_object()) {
    if (status["world"].contains("pods") && status["world"]["pods"].is_array()) {
      for (const Json& p : status["world"]["pods"])
        if (p.is_string()) old_members.push_back(p.get<std::string>());
    } else if (status["world"].contains("size")) {
      int size = status["world"]["size"].get<int>() / std::max(1, spec.procs_per_replica);
      for (int i = 0; i < size; ++i) old_members.push_back(worker_pod_name(name, i));
    }
  }

  std::map<int, Json> by_index;
  std::vector<Json> extra;
  for (const Json& p : pods) {
    int i = replica_index_of(p);
    if (i >= 0 && i < n && !by_index.count(i))
      by_index[i] = p;
    else
      extra.push_back(p);
  }

  // Completion: every rank reported exit 0, every world pod Succeeded, or (agent jobs) a world pod Succeeded.
  // Checked again, on fresh state, before a restart or a resize opens a generation: a rank that exits 0 on the last
  // step while a node comes back or goes away must end the job, not leave a generation waiting for agents that
  // have exited (lifecycle.h).
  const bool agent = uses_agent(job);
  auto completion_now = [&](const std::vector<Json>& job_pods, const std::optional<RendezvousService::Progress>& prog) {
    CompletionSignals sig;
    sig.generation = gen;
    sig.agent = agent;
    if (old_members.empty())
      for (int i = 0; i < n; ++i) sig.world.push_back(worker_pod_name(name, i));
    else
      sig.world = old_members;
    for (const Json& p : job_pods) {
      const int i = replica_index_of(p);
      // A terminating pod counts too: an agent stopped by a deletion exits 128+15, never 0.
      if (i >= 0 && i < n) sig.pod_phase.emplace(kube::name_of(p), phase_of(p));
    }
    sig.rendezvous_all_succeeded = prog && prog->generation == gen && prog->all_succeeded;
    return job_completion(sig);
  };
  auto complete = [&](const Completion& c, const std::optional<RendezvousService::Progress>& prog,
                      const std::vector<Json>& job_pods) {
    status["phase"] = "Succeeded";
    status["completionTime"] = now_s;
    // The agents forward each worker's last progress before its exit, so this is the final step's loss.
    if (c.by_rendezvous && prog->step > 0) status["loss"] = prog->loss;
    status["step"] = spec.steps;
    status["progress"] = std::to_string(status["step"].get<int64_t>()) + "/" + std::to_string(spec.steps);
    set_condition(status, "Succeeded", true, c.reason, c.message, now_s);
    set_condition(status, "Running", false, "Completed", c.message, now_s);
    for (const char* t : {"Restarting", "Resizing"})
      if (find_condition(status, t)) set_condition(status, t, false, "Completed", "the job finished", now_s);
    events.push_back({false, "Succeeded", c.message});
    int live = 0;
    for (const Json& p : job_pods)
      if (!terminating(p)) live++;
    status["replicas"] = live;
    return finish(job, spec, status, orig, events, job_pods);
  };
  // The current generation's record at the rendezvous service, read now (not at the start of this reconcile).
  auto fresh_progress = [&]() -> std::optional<RendezvousService::Progress> {
    if (!rdzv || gen <= 0) return std::nullopt;
    std::optional<RendezvousService::Progress> p = rdzv->progress(key);
    if (!p || p->generation != gen) return std::nullopt;
    return p;
  };
  if (Completion c = completion_now(pods, progress); c.done) return complete(c, progress, pods);

  // Restart triggers.
  PlacementRequest job_placement;  // spec.placement and the failure exclusions (excludeFailedNodes)
  apply_job_options(job, job_placement);
  std::set<std::string> handled;
  if (status.contains("lastRestart") && status["lastRestart"].contains("podUIDs"))
    for (const Json& u : status["lastRestart"]["podUIDs"])
      if (u.is_string()) handled.insert(u.get<std::string>());
  TriggerInputs trig_in;
  trig_in.name = name;
  trig_in.generation = gen;
  trig_in.pods_by_index = by_index;
  trig_in.world = old_members;
  trig_in.handled_uids = handled;
  trig_in.was_running = condition_true(orig, "Running");
  trig_in.in_transition = condition_true(orig, "Restarting") || condition_true(orig, "Resizing");
  for (const auto& [i, p] : by_index)
    if (const std::string node = node_of(p); !node.empty())
      if (auto n_obj = nodes_->get(node)) trig_in.node_ready[node] = node_ready(*n_obj);
  trig_in.excluded_nodes = job_placement.excluded_nodes;
  trig_in.exits = exits;
  trig_in.now = std::chrono::steady_clock::now();
  {
    const Json ann = job["metadata"].value("annotations", Json::object());
    trig_in.restart_request = ann.value(kRestartRequestAnnotation, "");
    trig_in.restart_detector = ann.value(kRestartDetectorAnnotation, "annotation");
    trig_in.request_handled = status.value("restartRequestHandled", "");
  }
  TriggerScan scan = scan_triggers(spec, trig_in);
  std::vector<Trigger>& triggers = scan.triggers;
  const std::vector<std::pair<std::string, bool>>& to_delete = scan.to_delete;  // (pod, force)
  std::map<std::string, std::string>& node_by_pod = scan.node_by_pod;
  const std::string restart_request = scan.restart_request;
  if (!restart_request.empty()) status["restartRequestHandled"] = restart_request;

  {
    // Only survivors' peer-lost exits so far: the culprit's own report is usually a moment behind. Put the exits back
    // and look again when the grace is over or sooner, when another report wakes the job (report_exit enqueues it).
    std::vector<TriggerFacts> facts;
    for (const Trigger& t : triggers) facts.push_back({t.reason, t.pod, t.permanent, t.peer_lost, t.age});
    if (milliseconds hold = hold_for_culprit(facts, opts_.culprit_grace); hold.count() > 0) {
      {
        std::lock_guard lock(mu_);
        auto& pending = exits_[key];
        for (const WorkerExit& e : exits)
          if (e.generation == gen) pending.push_back(e);
      }
      triggers.clear();
      keep_min(hold);
    }
  }
  if (!triggers.empty()) {
    // A lost node or pod after the last step is not a failure of the job: re-read the end of the generation.
    const std::vector<Json> now_pods = pods_of(ns, name);
    const auto now_progress = fresh_progress();
    if (Completion c = completion_now(now_pods, now_progress); c.done) return complete(c, now_progress, now_pods);
  }
  // A pod lost before it joined the generation a restart opened (the survivor's exit 200 opened it, then the node
  // went NotReady) is replaced into that generation: one fault, one generation, one restart (lifecycle.h).
  bool replaced_now = false;
  if (!triggers.empty() && agent && rdzv) {
    FormingGeneration forming;
    // The current generation is the one the last restart opened (the rendezvous record says whether it formed).
    forming.restarting = true;
    forming.rendezvous_known = progress.has_value();
    if (progress) {
      forming.world_complete = progress->world_complete;
      forming.missing = progress->missing;
    }
    Json last = status.value("lastRestart", Json::object());
    if (!last.is_object()) last = Json::object();
    if (last.value("generation", Json(-1)) != Json(gen)) forming.restarting = false;  // not this generation's restart
    for (const Json& p : last.value("replacedPods", Json::array()))
      if (p.is_string()) forming.replaced.push_back(p.get<std::string>());
    std::vector<TriggerFacts> facts;
    for (const Trigger& t : triggers) facts.push_back({t.reason, t.pod, t.permanent});
    if (replace_into_forming_generation(forming, facts)) {
      Json uids = last.value("podUIDs", Json::array());
      Json replaced = last.value("replacedPods", Json::array());
      for (const Trigger& t : triggers) {
        if (!t.uid.empty()) uids.push_back(t.uid);
        replaced.push_back(t.pod);
        events.push_back({true, "ReplacingPod",
                          "generation " + std::to_string(gen) + ": " + t.reason + ": " + t.detail + " [detector " +
                              t.detector + "]; the pod never joined this generation, so its replacement joins it " +
                              "(no new generation, restart " + std::to_string(restarts) + " continues)"});
      }
      while (uids.size() > 32) uids.erase(uids.begin());
      last["podUIDs"] = uids;
      last["replacedPods"] = replaced;
      status["lastRestart"] = last;
      triggers.clear();
      replaced_now = true;
    }
  }
  bool restarted_now = false;
  if (!triggers.empty()) {
    // The cause wins the attribution (lifecycle.h attribution): a monitor's request that also blamed a node
    // (excludeFailedNodes) shows up as NodeExcluded of that node's pod in the same pass; the restart is recorded as the
    // request (symptom, detector, time to detect) while the pod is still moved off the node below. A killed rank's
    // report beats its survivors' peer-lost exits even when theirs arrived first.
    std::vector<TriggerFacts> facts;
    for (const Trigger& x : triggers) facts.push_back({x.reason, x.pod, x.permanent, x.peer_lost, x.age});
    const Trigger* t = &triggers[attribution(facts)];
    RestartDecision d = decide_restart(spec, restarts, gen, t->reason, t->detail, t->permanent);
    Json uids = Json::array();
    for (const auto& u : handled) uids.push_back(u);
    for (const Trigger& x : triggers)
      if (!x.uid.empty()) uids.push_back(x.uid);
    while (uids.size() > 32) uids.erase(uids.begin());
    Json last = {
        {"reason", t->reason}, {"detector", t->detector}, {"time", now_s}, {"podUIDs", uids}, {"message", t->detail}};
    if (t->rank >= 0) last["rank"] = t->rank;
    // What recovery is measured against (see the progress block below): the step the job had reached.
    last["stepAtRestart"] = status.value("step", Json(0));
    if (t->reason == "RestartRequested" && !restart_request.empty()) {
      // The monitor's request carries the symptom, its onset and when it was requested: time to detect.
      if (const std::optional<RestartRequest> r = parse_restart_request(restart_request)) {
        if (!r->reason.empty()) {
          // A label value: only a short word (the monitor's rules: Hang, Straggler, NaN, ...), else "other".
          const bool word = r->reason.size() <= 32 && std::all_of(r->reason.begin(), r->reason.end(),
                                                                  [](unsigned char c) { return std::isalnum(c); });
          last["symptom"] = word ? r->reason : "other";
        }
        if (!r->onset.empty() && !r->time.empty()) {
          try {
            const double secs =
                std::chrono::duration<double>(kube::parse_rfc3339(r->time) - kube::parse_rfc3339(r->onset)).count();
            last["detectSeconds"] = std::round(std::max(0.0, secs) * 10) / 10;
            detection_seconds_.add({{"symptom", last.value("symptom", "unknown")}}).observe(std::max(0.0, secs));
          } catch (const std::exception&) {
            // Not RFC 3339 (a hand-written request): nothing to measure.
          }
        }
      }
    }
    if (!t->pod.empty()) last["pod"] = t->pod;
    if (!t->node.empty()) last["node"] = t->node;
    if (d.fail) {
      status["phase"] = "Failed";
      status["completionTime"] = now_s;
      status["lastFailure"] = last;
      set_condition(status, "Failed", true, d.reason, d.message, now_s);
      set_condition(status, "Running", false, d.reason, d.message, now_s);
      if (find_condition(status, "Restarting"))
        set_condition(status, "Restarting", false, d.reason, "the job failed", now_s);
      events.push_back({true, "Failed", d.reason + ": " + d.message});
      status["replicas"] = existing;
      milliseconds after = finish(job, spec, status, orig, events, pods);
      if (!restart_request.empty())
        client_.patch(kube::resources::trainingjobs, ns, name,
                      {{"metadata", {{"annotations", {{kRestartHandledAnnotation, restart_request}}}}}});
      return after;
    }
    restarted_now = true;
    gen = d.next_generation;
    last["generation"] = gen;
    restarts = d.restarts;
    status["generation"] = gen;
    status["restarts"] = restarts;
    status["lastRestart"] = last;
    set_condition(status, "Restarting", true, t->reason, d.message, now_s);
    restarts_.add({{"namespace", ns}, {"job", name}, {"reason", t->reason}}).increment();
    std::string where = "detector " + t->detector;
    if (!t->pod.empty()) where += ", pod " + t->pod;
    if (!t->node.empty()) where += ", node " + t->node;
    if (t->rank >= 0) where += ", rank " + std::to_string(t->rank);
    events.push_back({true, "Restarting",
                      "generation " + std::to_string(gen) + ": " + t->reason + ": " + d.message + " [" + where +
                          "] (restart " + std::to_string(restarts) + " of at most " +
                          std::to_string(spec.max_restarts) + ")"});
  }

  if (gen == 0 || resumed) {
    gen++;
    status["generation"] = gen;
  }
  if (!status.contains("startTime")) status["startTime"] = now_s;
  // A change of the world (kubectl scale, or an elastic job losing or regaining capacity) opens a new generation
  // below, once the pods are placed; pods created for a scale-up carry that coming generation.
  const bool started_now = gen != orig.value("generation", Json(0)).get<int64_t>() && !restarted_now;
  const int64_t label_gen =
      gen + ((!restarted_now && !started_now && static_cast<int>(old_members.size()) != n) ? 1 : 0);

  // A restart or failure decision is made durable before acting on it, so a crash cannot count it twice or lose it.
  if (restarted_now || replaced_now || status["generation"] != orig.value("generation", Json(0))) {
    Json written = write_status(job, status);
    job["metadata"]["resourceVersion"] = written["metadata"]["resourceVersion"];
    orig = status;  // what we just wrote is the baseline for the final comparison
  }
  if (!restart_request.empty())
    client_.patch(kube::resources::trainingjobs, ns, name,
                  {{"metadata", {{"annotations", {{kRestartHandledAnnotation, restart_request}}}}}});

  // Pods: delete lost/failed and surplus ones, create missing ones, bind the unbound part of the gang.
  const std::string token = ensure_token(job);
  for (const auto& [pod_name, force] : to_delete) {
    delete_pod(ns, pod_name, force);
    for (auto it = by_index.begin(); it != by_index.end(); ++it)
      if (kube::name_of(it->second) == pod_name) {
        by_index.erase(it);
        break;
      }
  }
  for (const Json& p : extra)
    if (!terminating(p)) delete_pod(ns, kube::name_of(p), false);
  if (!extra.empty() && std::any_of(extra.begin(), extra.end(), [](const Json& p) { return !terminating(p); }))
    events.push_back(
        {false, "DeletedPods",
         "deleted " + std::to_string(extra.size()) + " surplus pods (replicas " + std::to_string(n) + ")"});
  std::vector<std::string> created, unbound;
  const bool deleting = !to_delete.empty();
  bool exists_uncached = false;  // a create found the pod already there although the cache does not have it
  std::vector<Json> to_create;   // built from `job` (our own copy read from the server), never from the cache
  for (int i = 0; i < n; ++i) {
    auto it = by_index.find(i);
    if (it != by_index.end()) {
      const Json& p = it->second;
      if (!terminating(p) && node_of(p).empty() && phase_of(p) != "Failed") unbound.push_back(kube::name_of(p));
      continue;
    }
    if (deleting && std::any_of(to_delete.begin(), to_delete.end(),
                                [&](const auto& d) { return d.first == worker_pod_name(name, i); }))
      continue;  // the old pod of this name is still going; its deletion event brings us back
    to_create.push_back(build_worker_pod(job, spec, i, label_gen, opts_.pod));
  }
  if (!to_create.empty()) {
    // Slow-start batches (1, 2, 4, ...; docs/operator.md): a gang of 1,000 is created at the API server's pace,
    // a template the server refuses costs one request. Names are fixed per replica index, so a pod that already
    // exists (ours, not yet in the cache, or one still terminating) counts as done and a rerun after a crash
    // creates only what is missing.
    std::vector<char> made(to_create.size(), 0);
    std::atomic<bool> already{false};
    SlowStartResult r = run_slow_start(static_cast<int>(to_create.size()), opts_.api_parallelism, [&](int k) {
      try {
        client_.create(kube::resources::pods, ns, to_create[k]);
        made[k] = 1;
      } catch (const kube::AlreadyExists&) {
        already = true;
      }
    });
    exists_uncached = already;
    for (size_t k = 0; k < to_create.size(); ++k)
      if (made[k]) {
        created.push_back(kube::name_of(to_create[k]));
        unbound.push_back(kube::name_of(to_create[k]));
      }
    if (r.first_error) {
      log::warn(kLog, "pod creation stopped at the first failure",
                {{"job", key},
                 {"created", std::to_string(created.size())},
                 {"left", std::to_string(to_create.size() - r.attempted)}});
      std::rethrow_exception(r.first_error);
    }
  }
  if (!created.empty())
    events.push_back(
        {false, "CreatedPods", "created " + name_summary(created) + " (generation " + std::to_string(gen) + ")"});

  int bound_now = 0;
  int placed_hops = -1;  // the gang's worst same-rail hops, when placed now
  bool capacity_short = false;
  if (exists_uncached && !unbound.empty()) {
    // Some of the gang exist at the server but not yet in the cache (our own creates of an earlier reconcile):
    // binding now would place part of the gang. Their watch events bring us back; the requeue is a safety net.
    keep_min(milliseconds(1000));
  } else if (!unbound.empty()) {
    PlacementRequest req = job_placement;
    req.job_key = key;
    req.pods = static_cast<int>(unbound.size());
    req.gpus_per_pod = pod_resource(build_worker_pod(job, spec, 0, gen, opts_.pod), kGpuResource);
    req.node_selector = spec.node_selector;
    if (job["spec"].contains("template") && job["spec"]["template"].is_object())
      req.tolerations = job["spec"]["template"].value("spec", Json::object()).value("tolerations", Json::array());
    for (int i = 0; i < n; ++i) {
      const std::string pod_name = worker_pod_name(name, i);
      if (std::find(unbound.begin(), unbound.end(), pod_name) != unbound.end())
        req.pod_indices.push_back(i);
      else if (auto it = by_index.find(i); it != by_index.end() && !node_of(it->second).empty())
        req.bound[i] = node_of(it->second);
    }
    req.procs_per_pod = spec.procs_per_replica;
    const WorldLayout layout = world_layout(spec, n);
    req.tensor = layout.tensor;
    req.pipeline = layout.pipeline;
    auto t0 = Clock::now();
    const auto inventory = build_inventory(nodes_->list(), pods_->list());
    req.step_model = placement_step_model(spec, layout, n, inventory);
    PlacementResult r = placement_->place(req, inventory);
    if (!r.ok && spec.min_replicas) {
      // Elastic: bind the part that fits now; the world shrinks to the pods placed (never below minReplicas) and
      // grows back when the rest fit.
      capacity_short = true;
      std::string why = r.message;
      for (int k = req.pods - 1; k >= 1 && !r.ok; --k) {
        PlacementRequest part = req;
        part.pods = k;
        part.pod_indices.resize(k);
        r = placement_->place(part, inventory);
      }
      if (r.ok) {
        unbound.resize(r.nodes.size());
        set_condition(status, "Scheduled", false, "Unschedulable",
                      why + "; elastic: bound " + std::to_string(r.nodes.size()) + " of them", now_s);
      } else {
        r.message = why;
      }
    }
    placement_seconds_.add({}).observe(std::chrono::duration<double>(Clock::now() - t0).count());
    if (r.ok) {
      // GPU pods: the node's NCCL settings ride on the Binding as pod annotations (the API server sets them with
      // spec.nodeName, in one write), where the pod's env reads them at container start (nccl_env.h).
      std::vector<Json> binding_annotations(unbound.size(), Json::object());
      if (req.gpus_per_pod > 0) {
        std::set<std::string> warned;
        for (size_t i = 0; i < unbound.size(); ++i) {
          auto node = std::find_if(inventory.begin(), inventory.end(),
                                   [&](const NodeInfo& info) { return info.name == r.nodes[i]; });
          if (node == inventory.end()) continue;
          std::string warning;
          binding_annotations[i] = nccl_binding_annotations(*node, &warning);
          if (!warning.empty() && warned.insert(node->name).second)
            events.push_back({true, "NodeRailHcas", warning + "; NCCL_IB_HCA left empty (NCCL's own choice)"});
        }
      }
      // Bound in slow-start batches like the creates. A failure leaves part of the gang bound; the next
      // reconcile places the rest around it (req.bound).
      SlowStartResult b = run_slow_start(static_cast<int>(unbound.size()), opts_.api_parallelism, [&](int i) {
        Json binding = {{"apiVersion", "v1"},
                        {"kind", "Binding"},
                        {"metadata", {{"name", unbound[i]}}},
                        {"target", {{"apiVersion", "v1"}, {"kind", "Node"}, {"name", r.nodes[i]}}}};
        if (!binding_annotations[i].empty()) binding["metadata"]["annotations"] = binding_annotations[i];
        try {
          client_.create_subresource(kube::resources::pods, ns, unbound[i], "binding", binding);
        } catch (const kube::Conflict&) {
          // Already bound (an earlier attempt whose answer we did not see).
        }
      });
      if (b.first_error) std::rethrow_exception(b.first_error);
      std::vector<std::string> pairs;
      for (size_t i = 0; i < unbound.size(); ++i) {
        node_by_pod[unbound[i]] = r.nodes[i];
        pairs.push_back(unbound[i] + " -> " + r.nodes[i]);
        bound_now++;
      }
      events.push_back({false, "Bound",
                        "bound " + std::to_string(unbound.size()) + " pods: " + name_summary(pairs) +
                            (r.message.empty() ? "" : " (" + r.message + ")")});
      if (r.worst_hops >= 0) {
        placement_hops(registry_).add({}).observe(r.worst_hops);
        placed_hops = r.worst_hops;
      }
    } else {
      capacity_short = true;
      if (set_condition(status, "Scheduled", false, "Unschedulable", r.message, now_s) || created.size())
        events.push_back({true, "Unschedulable", r.message});
      keep_min(opts_.unschedulable_retry);
    }
  }

  // Observed state -> conditions and phase.
  // Bound pods -> their nodes (the mixed-GPU split reads the nodes' GPU types).
  std::map<std::string, std::string> node_of_pod_name;
  int exist = 0, bound = 0;
  Json placed = Json::array();
  std::vector<std::string> healthy;  // bound, not terminating, not failed; index order
  std::map<std::string, bool> up;    // pod -> running (or already finished)
  for (int i = 0; i < n; ++i) {
    const std::string pod_name = worker_pod_name(name, i);
    auto it = by_index.find(i);
    bool just_created = std::find(created.begin(), created.end(), pod_name) != created.end();
    if (it == by_index.end() && !just_created) continue;
    if (it != by_index.end() && terminating(it->second)) continue;
    exist++;
    std::string node = it != by_index.end() ? node_of(it->second) : "";
    if (node.empty() && node_by_pod.count(pod_name)) node = node_by_pod[pod_name];
    if (!node.empty()) {
      bound++;
      node_of_pod_name[pod_name] = node;
      placed.push_back(node);
    }
    if (!node.empty() && (it == by_index.end() || phase_of(it->second) != "Failed")) healthy.push_back(pod_name);
    // A pod whose worker already finished still counts: the job runs until every pod is done.
    up[pod_name] = it != by_index.end() && (phase_of(it->second) == "Running" || phase_of(it->second) == "Succeeded");
  }
  // The world: every replica, or for an elastic job short of capacity the healthy pods it can run with.
  std::vector<std::string> members;
  if (capacity_short) {
    int k = elastic_world_replicas(spec, static_cast<int>(healthy.size()));
    if (k > 0) members.assign(healthy.begin(), healthy.begin() + k);
  }
  if (members.empty())
    for (int i = 0; i < n; ++i) members.push_back(worker_pod_name(name, i));
  const int m = static_cast<int>(members.size());
  if (gen > 0 && !old_members.empty() && members != old_members && !resumed) {
    if (!restarted_now) {
      // The creates and binds above took a while: the world may have trained its last step meanwhile (a grow that
      // meets the end of the job). Opening the grow would leave it waiting for agents that have exited.
      const std::vector<Json> now_pods = pods_of(ns, name);
      const auto now_progress = fresh_progress();
      if (Completion c = completion_now(now_pods, now_progress); c.done) return complete(c, now_progress, now_pods);
      gen++;
      status["generation"] = gen;
      // The restart's world shrank before it formed (its lost pod's replacement found no room): the fault's
      // recovery ends with the first step of this generation.
      if (condition_true(status, "Restarting") && status.contains("lastRestart") && status["lastRestart"].is_object() &&
          status["lastRestart"].value("generation", Json(-1)) == Json(gen - 1) &&
          !status["lastRestart"].contains("recoveredTime"))
        status["lastRestart"]["generation"] = gen;
    }
    std::string msg = "replicas " + std::to_string(old_members.size()) + " -> " + std::to_string(m) +
                      " in generation " + std::to_string(gen);
    if (m < n)
      msg += " (capacity for " + std::to_string(m) + " of " + std::to_string(n) + " pods, elastic.minReplicas " +
             std::to_string(spec.min_replicas.value_or(n)) + ")";
    set_condition(status, "Resizing", true, m > static_cast<int>(old_members.size()) ? "ScaledUp" : "ScaledDown", msg,
                  now_s);
    events.push_back({false, "Resizing", msg});
  }
  JobSpec world_spec = spec;  // with auto, an elastic world of m < n replicas gets its own plan
  if (auto_plan && m != n) {
    AutoPlanOutcome resized = plan_parallelism(spec, m, build_inventory(nodes_->list(), pods_->list()));
    if (resized.plan) {
      apply_plan(world_spec, *resized.plan);
      auto_plan = resized.plan;
    }
  }
  // Mixed GPU types under auto: the batch split by the speed of the nodes the world's pods are bound to (the plan's
  // split assumed a proportional share of each type), passed to the workers as parallelism.dpSplit.
  std::vector<int> dp_split;
  if (auto_plan && auto_plan->mixed) {
    const auto inventory = build_inventory(nodes_->list(), pods_->list());
    std::vector<std::string> pod_types;
    for (const auto& pod_name : members) {
      auto it = node_of_pod_name.find(pod_name);
      if (it == node_of_pod_name.end()) break;
      for (const NodeInfo& ni : inventory)
        if (ni.name == it->second) {
          auto label = ni.labels.find("railyard.dev/gpu-type");
          pod_types.push_back(label == ni.labels.end() ? "" : label->second);
        }
    }
    if (pod_types.size() == members.size()) {
      std::optional<MixedSplit> placed_split = mixed_split(world_spec, pod_types);
      if (placed_split) {
        auto_plan->status["mixed"] = placed_split->status;
        dp_split = placed_split->dp_split;
      } else {
        auto_plan->status["mixed"] = {{"split", "even"}, {"why", "the pods are bound to nodes of one GPU type"}};
      }
    }
  }
  if (auto_plan) {
    status["plan"] = auto_plan->status;
    if (!orig.contains("plan") || orig["plan"].value("data", 0) != auto_plan->layout.dp ||
        orig["plan"].value("tensor", 0) != auto_plan->layout.tp ||
        orig["plan"].value("pipeline", 0) != auto_plan->layout.pp ||
        orig["plan"].value("zero", -1) != auto_plan->layout.zero ||
        orig["plan"].value("microBatch", 0) != auto_plan->layout.micro_batch ||
        orig["plan"].value("recompute", "") != auto_plan->status.value("recompute", "") ||
        orig["plan"].value("offload", "") != auto_plan->status.value("offload", "") ||
        orig["plan"].value("expert", 0) != auto_plan->status.value("expert", 0) ||
        orig["plan"].value("context", 1) != auto_plan->status.value("context", 1))
      events.push_back({false, "Planned", auto_plan->message});
  }
  WorldLayout w = world_layout(world_spec, m);
  status["world"] = {
      {"size", w.size}, {"data", w.data}, {"tensor", w.tensor}, {"pipeline", w.pipeline}, {"pods", members}};
  if (w.context > 1) status["world"]["context"] = w.context;
  if (w.expert > 1) status["world"]["expert"] = w.expert;
  int running = 0;
  for (const auto& pod_name : members)
    if (up[pod_name]) running++;
  status["replicas"] = exist;
  if (bound == n) {
    Json pl = {{"nodes", placed}};
    if (placed_hops >= 0)
      pl["hops"] = placed_hops;
    else if (orig.contains("placement") && orig["placement"].value("nodes", Json()) == placed &&
             orig["placement"].contains("hops"))
      pl["hops"] = orig["placement"]["hops"];
    status["placement"] = pl;
  }
  set_condition(status, "Created", exist == n, exist == n ? "PodsCreated" : "CreatingPods",
                std::to_string(exist) + " of " + std::to_string(n) + " worker pods exist", now_s);
  if (bound == n)
    set_condition(status, "Scheduled", true, "Bound", "all " + std::to_string(n) + " pods are bound to nodes", now_s);
  bool world_up = running == m;
  // `progress` is the generation this reconcile started with: a generation opened above has not formed yet.
  if (world_up && agent && rdzv) world_up = progress && progress->generation == gen && progress->world_complete;
  if (world_up) {
    set_condition(status, "Running", true, "AllPodsRunning",
                  agent && rdzv ? "every pod joined generation " + std::to_string(gen)
                                : std::to_string(m) + " of " + std::to_string(n) + " worker pods are running",
                  now_s);
    if (condition_true(status, "Restarting"))
      set_condition(status, "Restarting", false, "Recovered", "generation " + std::to_string(gen) + " is running",
                    now_s);
    if (condition_true(status, "Resizing"))
      set_condition(status, "Resizing", false, "Resized",
                    "generation " + std::to_string(gen) + " runs " + std::to_string(m) + " replicas", now_s);
  } else {
    if (!join_timeout.empty() && running == m)
      set_condition(status, "Running", false, "JoinTimeout", join_timeout, now_s);
    else
      set_condition(status, "Running", false, "PodsNotRunning",
                    std::to_string(running) + " of " + std::to_string(m) + " worker pods of the world running", now_s);
  }
  if (condition_true(status, "Restarting"))
    status["phase"] = "Restarting";
  else if (condition_true(status, "Resizing"))
    status["phase"] = "Resizing";
  else if (world_up)
    status["phase"] = "Running";
  else if (bound == n)
    status["phase"] = "Scheduled";
  else if (exist == n)
    status["phase"] = "Created";
  else
    status["phase"] = "Pending";
  // `progress` was fetched for the generation this reconcile started with; a restart above moved `gen` on, and the
  // old generation's first step must not count as the new one's recovery.
  if (progress && progress->generation == gen && progress->first_step > 0 && status.contains("lastRestart") &&
      status["lastRestart"].is_object()) {
    // Recovered: the new generation reported its first step (progress files are per generation, so any step seen
    // here was trained after the restart). Time and work lost are kept in status and observed once.
    Json& last = status["lastRestart"];
    if (last.value("generation", Json(-1)) == Json(gen) && !last.contains("recoveredTime") && last.contains("time") &&
        last["time"].is_string()) {
      // Timed by when the rendezvous service received the first step, not by this (polling) reconcile.
      const double secs =
          std::chrono::duration<double>(progress->first_step_at - kube::parse_rfc3339(last["time"].get<std::string>()))
              .count();
      last["recoveredTime"] = kube::format_rfc3339(progress->first_step_at);
      last["recoverySeconds"] = std::round(std::max(0.0, secs) * 10) / 10;
      // The first step the service received: within one agent poll period of the first step trained, so not the
      // step after the restored checkpoint (the worker logs that one).
      last["resumedStep"] = progress->first_step;
      bool first_time = false;
      {
        std::lock_guard lock(mu_);
        auto [it, inserted] = recovery_observed_.emplace(key, gen);
        first_time = inserted || it->second != gen;
        it->second = gen;
      }
      if (first_time) recovery_seconds_.add({{"reason", last.value("reason", "")}}).observe(std::max(0.0, secs));
    }
  }
  if (progress) {
    status["step"] = progress->step;
    status["loss"] = progress->loss;
    status["tokensPerSecond"] = progress->tokens_per_second;
    status["progress"] = std::to_string(progress->step) + "/" + std::to_string(spec.steps);
  }
  // The rendezvous service has no callback for a completed world or progress: poll it while the job runs.
  if (agent && rdzv) keep_min(world_up ? milliseconds(5000) : milliseconds(500));
  if (status_differs(orig, status)) write_status(job, status);
  emit(job, events);

  // Open the (durable) generation at the rendezvous service once per generation and leader.
  if (rdzv && agent) {
    bool open = false;
    {
      std::lock_guard lock(mu_);
      auto it = opened_.find(key);
      open = it == opened_.end() || it->second != gen;
    }
    if (open) {
      GenerationSpec g;
      g.job_key = key;
      g.generation = gen;
      g.pods = members;
      g.procs_per_pod = spec.procs_per_replica;
      g.config = resolved_config(world_spec, m);
      g.config["spec"] = job["spec"];
      g.config["generation"] = gen;
      if (!dp_split.empty()) g.config["parallelism"]["dpSplit"] = dp_split;
      if (gen > 1 && job["spec"].contains("checkpoint") && job["spec"]["checkpoint"].contains("path"))
        g.config["restore"] = job["spec"]["checkpoint"]["path"];
      else if (gen > 1 && world_spec.memory_interval_steps > 0)
        g.config["restore"] = "auto";  // the in-memory tier alone (no path): the worker falls back to a fresh start
      g.token = token;
      rdzv->open_generation(g);
      std::lock_guard lock(mu_);
      opened_[key] = gen;
    }
  }
  return requeue;
}

}  // namespace railyard::op
