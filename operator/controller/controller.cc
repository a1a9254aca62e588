#include "operator/controller/controller.h"

#include <openssl/evp.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <set>

#include "common/log.h"
#include "common/log_tail.h"
#include "common/metrics/job_labels.h"
#include "common/rendezvous_protocol.h"
#include "common/tls/job_identity.h"
#include "common/wellknown.h"
#include "operator/controller/failure_policy.h"
#include "operator/controller/goodput.h"
#include "operator/controller/initializer.h"
#include "operator/controller/job_service.h"
#include "operator/controller/job_storage.h"
#include "operator/controller/lifecycle.h"
#include "operator/controller/plan_glue.h"
#include "operator/controller/pod_state.h"
#include "operator/controller/restart_triggers.h"
#include "operator/controller/slow_start.h"
#include "operator/controller/status.h"
#include "operator/controller/sync.h"
#include "operator/scheduler/nccl_env.h"

namespace railyard::op {

namespace {

constexpr const char* kLog = "controller";
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

const std::vector<std::string> kPhases = {"Pending",  "Created",   "Scheduled", "Running", "Restarting",
                                          "Resizing", "Suspended", "Succeeded", "Failed",  "Invalid"};

std::pair<std::string, std::string> split_key(const std::string& key) {
  auto slash = key.find('/');
  if (slash == std::string::npos) return {"", key};
  return {key.substr(0, slash), key.substr(slash + 1)};
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
      jobs_by_phase_(registry.gauge(metrics::names::kOperatorJobs, "TrainingJobs by phase, from the informer cache.")),
      restarts_(registry.counter(metrics::names::kOperatorRestartsTotal, "Restarts (new generations) by reason.")),
      errors_(registry.counter(metrics::names::kOperatorReconcileErrorsTotal, "Reconciles that ended in an error.")),
      placement_seconds_(registry.histogram(metrics::names::kOperatorPlacementSeconds,
                                            "Time to compute one gang placement.",
                                            metrics::exponential_buckets(0.0001, 4, 10))),
      recovery_seconds_(registry.histogram(
          metrics::names::kOperatorRecoverySeconds,
          "From a restart decision to the first training step of the new generation, by restart reason.",
          metrics::exponential_buckets(0.5, 2, 12))),
      detection_seconds_(
          registry.histogram(metrics::names::kOperatorDetectionSeconds,
                             "From a symptom's onset to the restart request that reported it (monitor requests; an "
                             "agent's hang report: to the operator's decision), by symptom.",
                             metrics::exponential_buckets(0.5, 2, 12))),
      job_seconds_(registry.gauge(metrics::names::kOperatorJobSeconds,
                                  "A job's wall time since its creation by where it went (status.goodput): training "
                                  "kept, or the cause it was lost to; as of the job's last status write.")),
      wq_depth_(registry.gauge(metrics::names::kWorkqueueDepth, "Current depth of the work queue.")),
      wq_adds_(registry.counter(metrics::names::kWorkqueueAddsTotal, "Adds handled by the work queue.")),
      wq_retries_(
          registry.counter(metrics::names::kWorkqueueRetriesTotal, "Rate-limited retries handled by the work queue.")),
      cr_total_(
          registry.counter(metrics::names::kControllerRuntimeReconcileTotal, "Reconciles per controller and result.")),
      cr_errors_(
          registry.counter(metrics::names::kControllerRuntimeReconcileErrorsTotal, "Reconcile errors per controller.")),
      cr_time_(registry.histogram(metrics::names::kControllerRuntimeReconcileTimeSeconds,
                                  "Length of reconciles per controller.", metrics::exponential_buckets(0.001, 2, 16))) {
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
  // Railyard's worker pods of every namespace (a namespace-scoped operator reconciles only its own, but placement
  // counts every job's pods against the nodes).
  kube::InformerOptions po;
  po.label_selector = wellknown::kJobLabel;
  pods_ = std::make_unique<kube::Informer>(client_, kube::resources::pods, po);
  nodes_ = std::make_unique<kube::Informer>(client_, kube::resources::nodes, kube::InformerOptions{});
  priority_classes_ =
      std::make_unique<kube::Informer>(client_, kube::resources::priorityclasses, kube::InformerOptions{});
  // Every pod bound to a node, in any namespace and Railyard's or not: placement counts their requests against the
  // nodes' allocatable (NodeResourcesFit), so a node shared with other workloads is not over-committed.
  // Railyard's own are in pods_ already: each pod is watched (and parsed) once.
  kube::InformerOptions bo;
  bo.field_selector = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed";
  bo.label_selector = std::string("!") + wellknown::kJobLabel;
  node_pods_ = std::make_unique<kube::Informer>(client_, kube::resources::pods, bo);

  // The jobs' headless Services (ensure_service), labelled with their job like the pods: one deleted by hand brings
  // its job back, whose reconcile creates it again. Only where the operator runs jobs (its namespace, or all).
  kube::InformerOptions so;
  so.ns = opts_.ns;
  so.label_selector = wellknown::kJobLabel;
  services_ = std::make_unique<kube::Informer>(client_, kube::resources::services, so);

  jobs_->on_add([this](const Json& j) { enqueue(kube::key_of(j)); });
  jobs_->on_update([this](const Json&, const Json& j) { enqueue(kube::key_of(j)); });
  jobs_->on_delete([this](const Json& j) { enqueue(kube::key_of(j)); });
  auto pod_key = [this](const Json& p) {
    const Json& meta = kube::field(p, "metadata");
    const Json& job = kube::field(kube::field(meta, "labels"), wellknown::kJobLabel);
    const Json& ns = kube::field(meta, "namespace");
    if (job.is_string() && ns.is_string() && (opts_.ns.empty() || ns == opts_.ns))
      enqueue(ns.get<std::string>() + "/" + job.get<std::string>());
  };
  pods_->on_add(pod_key);
  pods_->on_update([pod_key](const Json&, const Json& p) { pod_key(p); });
  pods_->on_delete(pod_key);
  services_->on_delete(pod_key);
  // Nodes change often (conditions' heartbeat times); what matters to jobs is readiness, cordons, taints, labels
  // (affinity, topology) and allocatable: a device plugin that registers its GPUs or RDMA devices after the node is
  // Ready, or an admin advertising an extended resource, must wake the gangs waiting for them.
  auto node_shape = [](const Json& n) {
    const Json& spec = kube::field(n, "spec");
    const Json& status = kube::field(n, "status");
    const Json& meta = kube::field(n, "metadata");
    return Json{node_ready(n), spec.is_object() ? spec.value("unschedulable", false) : false,
                spec.is_object() ? spec.value("taints", Json::array()) : Json::array(), kube::field(meta, "labels"),
                kube::field(status, "allocatable")};
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
  priority_classes_->start();
  node_pods_->start();
  pods_->start();
  services_->start();
  jobs_->start();
}

bool Controller::wait_for_sync(milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  for (kube::Informer* inf :
       {nodes_.get(), priority_classes_.get(), node_pods_.get(), pods_.get(), services_.get(), jobs_.get()}) {
    auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    if (left.count() <= 0 || !inf->wait_for_sync(left)) return false;
  }
  synced_ = true;
  return true;
}

void Controller::set_rendezvous(RendezvousService* rdzv, const std::string& advertised_addr,
                                const std::string& ca_pem) {
  {
    std::lock_guard lock(mu_);
    if (!advertised_addr.empty()) opts_.pod.rendezvous_addr = advertised_addr;
    opts_.pod.rendezvous_tls = !ca_pem.empty();
    rendezvous_ca_ = ca_pem;
    tokens_.clear();  // a new leader's CA may differ: every job's Secret is checked again
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
  services_->stop();
  node_pods_->stop();
  priority_classes_->stop();
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
    } catch (...) {
      // Whatever one job's reconcile throws stays with that job: the worker goes on to the next key (an exception
      // leaving this thread would terminate the operator and every job would stop being managed: issue #40).
      // Operational errors (railyard::Error: the API server, the transport) are retried with the queue's backoff; the
      // rest says the spec met a value the code cannot handle, and the job is held Invalid naming the cause.
      const std::optional<std::string> cause = poison_cause(std::current_exception());
      std::string error = cause.value_or("");
      if (!cause) {
        try {
          throw;
        } catch (const std::exception& e) {
          error = e.what();
        }
      }
      errors_.add(c).increment();
      cr_errors_.add(c).increment();
      result = "error";
      bool held = false;
      if (cause) {
        log::error(kLog, "reconcile threw: holding the job Invalid", {{"job", key}, {"error", *cause}});
        try {
          const milliseconds delay = hold_invalid(key, *cause);
          queue_.forget(key);  // only once held: if marking fails, the queue's backoff goes on growing
          queue_.add_after(key, delay);
          held = true;
        } catch (const std::exception& e) {
          log::warn(kLog, "could not mark the job Invalid", {{"job", key}, {"error", e.what()}});
        } catch (...) {
          log::warn(kLog, "could not mark the job Invalid", {{"job", key}});
        }
      } else {
        log::warn(kLog, "reconcile failed", {{"job", key}, {"error", error}});
      }
      if (!held) {
        queue_.add_rate_limited(key);
        wq_retries_.add({{"name", opts_.controller_name}}).increment();
      }
    }
    queue_.done(key);
    cr_total_.add({{"controller", opts_.controller_name}, {"result", result}}).increment();
    cr_time_.add(c).observe(std::chrono::duration<double>(Clock::now() - t0).count());
    update_phase_gauge();
  }
}

std::chrono::milliseconds Controller::hold_invalid(const std::string& key, const std::string& cause) {
  const auto [ns, name] = split_key(key);
  // The job as the server has it now (never the informer's object: it is shared and read-only).
  auto job = client_.try_get(kube::resources::trainingjobs, ns, name);
  if (!job || (*job)["metadata"].contains("deletionTimestamp")) {
    forget_job(key);
    return milliseconds(0);
  }
  const int64_t generation = (*job)["metadata"].value("generation", int64_t{0});
  const auto delay = poisoned_.record(key, uid_of(*job), generation, cause, Clock::now());
  const Json orig = job->contains("status") && (*job)["status"].is_object() ? (*job)["status"] : Json::object();
  const Json status = poisoned_status(orig, cause, generation, kube::format_rfc3339(std::chrono::system_clock::now()));
  if (status_differs(orig, status)) {
    write_status(*job, status);  // the one status write
    recorder_.warning(*job, "Invalid", find_condition(status, "Invalid")->value("message", ""));
  }
  return std::chrono::duration_cast<milliseconds>(delay);
}

void Controller::update_phase_gauge() {
  std::map<std::string, int> counts;
  for (const Json& j : jobs_->list()) {
    std::string phase = j.contains("status") ? j["status"].value("phase", "") : "";
    counts[phase.empty() ? "Pending" : phase]++;
  }
  for (const auto& p : kPhases) jobs_by_phase_.add({{"phase", p}}).set(counts[p]);
}

std::vector<NodeInfo> Controller::node_inventory() {
  // Other workloads' bound pods (node_pods_) and every Railyard pod (pods_: build_inventory skips the unbound and
  // finished ones), read in place from the informers' immutable objects.
  const auto nodes = nodes_->snapshot(), others = node_pods_->snapshot(), ours = pods_->snapshot();
  std::vector<const Json*> node_ptrs, pod_ptrs;
  node_ptrs.reserve(nodes.size());
  pod_ptrs.reserve(others.size() + ours.size());
  for (const auto& n : nodes) node_ptrs.push_back(n.get());
  for (const auto& p : others) pod_ptrs.push_back(p.get());
  for (const auto& p : ours) pod_ptrs.push_back(p.get());
  return build_inventory_of(node_ptrs, pod_ptrs);
}

std::vector<PodPtr> Controller::pods_of(const Json& job) {
  const std::string ns = kube::namespace_of(job), name = kube::name_of(job), uid = uid_of(job);
  std::vector<PodPtr> out;
  for (PodPtr& p : pods_->snapshot()) {
    const Json& meta = kube::field(*p, "metadata");
    if (kube::field(meta, "namespace") == ns &&
        kube::field(kube::field(meta, "labels"), wellknown::kJobLabel) == name && controlled_by(*p, uid) &&
        !is_initializer_pod(*p))
      out.push_back(std::move(p));
  }
  return out;
}

void Controller::forget_job(const std::string& key) {
  poisoned_.forget(key);
  suspects_.forget(key);
  RendezvousService* rdzv = nullptr;
  {
    std::lock_guard lock(mu_);
    rdzv = rdzv_;
    exits_.erase(key);
    timeouts_.erase(key);
    tokens_.erase(key);
    for (const kube::Resource* r :
         {&kube::resources::networkpolicies, &kube::resources::configmaps, &kube::resources::persistentvolumeclaims})
      job_objects_.erase(r->plural + "/" + key);
    if (opened_.erase(key) == 0) rdzv = nullptr;
  }
  if (rdzv) rdzv->close_job(key);
  // The job is gone: its per-job series would otherwise stay in /metrics (and in memory) for the operator's life.
  if (auto slash = key.find('/'); slash != std::string::npos) {
    const metrics::Labels of_job = {{metrics::kNamespaceLabel, key.substr(0, slash)},
                                    {metrics::kTrainingJobLabel, key.substr(slash + 1)}};
    restarts_.remove_matching(of_job);
    job_seconds_.remove_matching(of_job);
  }
}

std::string Controller::ensure_token(const Json& job) {
  const std::string key = kube::key_of(job), uid = uid_of(job);
  std::string ca;
  {
    std::lock_guard lock(mu_);
    auto it = tokens_.find(key);
    if (it != tokens_.end() && it->second.first == uid) return it->second.second;
    ca = rendezvous_ca_;
  }
  const std::string ns = kube::namespace_of(job), name = token_secret_name(kube::name_of(job));
  auto secret = client_.try_get(kube::resources::secrets, ns, name);
  if (secret) {
    switch (claim_of(*secret, uid)) {
      case Claim::kOurs:
        break;
      case Claim::kEarlierJob:
        // Left over from an earlier job of the same name (the garbage collector has not caught up): replace it.
        client_.remove(kube::resources::secrets, ns, name);
        throw kube::Conflict(409, "Conflict", "Secret " + ns + "/" + name + " belongs to an older job; replacing it");
      case Claim::kForeign: {
        // Someone else's Secret under the name this job's token takes: never delete it.
        const std::string msg = "Secret " + ns + "/" + name +
                                " exists and is not this job's: rename or delete it (each job's rendezvous token is "
                                "kept in <job>-rendezvous); no pods until then";
        recorder_.warning(job, "RendezvousSecretConflict", msg);
        throw Error(msg);
      }
    }
  } else {
    try {
      secret = client_.create(kube::resources::secrets, ns,
                              build_token_secret(job, random_token(), ca, tls::make_job_ca(ns, kube::name_of(job))));
    } catch (const kube::AlreadyExists&) {
      secret = client_.get(kube::resources::secrets, ns, name);
    }
  }
  const Json data = secret->value("data", Json::object());
  if (!data.contains(kTokenKey)) throw Error("Secret " + ns + "/" + name + " has no data.token: delete it");
  std::string token = kube::base64_decode(data[kTokenKey].get<std::string>());
  // A Secret made before jobs had their own CA (or with a broken pair) gets one; the pods' env refers to it.
  if (auto patch = job_ca_patch(*secret, job)) client_.patch(kube::resources::secrets, ns, name, *patch);
  if (!ca.empty() && (!data.contains(kRendezvousCaKey) || !data[kRendezvousCaKey].is_string() ||
                      kube::base64_decode(data[kRendezvousCaKey].get<std::string>()) != ca)) {
    // Made before TLS was on, or under another CA (the CA Secret was replaced): new pods must trust the current one.
    // The token stays, so pods still running keep their rendezvous.
    client_.patch(kube::resources::secrets, ns, name, {{"stringData", {{kRendezvousCaKey, ca}}}});
  }
  std::lock_guard lock(mu_);
  tokens_[key] = {uid, token};
  return token;
}

void Controller::ensure_network_policy(const Json& job, const JobSpec& spec) {
  if (opts_.network_policy == NetworkPolicyMode::kNone) return;
  ensure_job_object(job, kube::resources::networkpolicies,
                    build_network_policy(job, spec, opts_.network_policy, opts_.pod), "NetworkPolicyConflict",
                    "rename or delete it (each job's policy is named <job>-workers), or run the operator with "
                    "--network-policy none");
}

void Controller::ensure_service(const Json& job) {
  const std::string ns = kube::namespace_of(job), name = job_service_name(kube::name_of(job)), uid = uid_of(job);
  // In the informer as this job's: nothing to do (no request). Its spec is left as it is: the Service is created once
  // and never rewritten, so what someone changed there stays changed (delete it to get the operator's back).
  if (auto cached = services_->get_shared(ns + "/" + name); cached && controlled_by(*cached, uid)) return;
  const std::string what = "Service " + ns + "/" + name;
  auto have = client_.try_get(kube::resources::services, ns, name);
  if (!have) {
    try {
      client_.create(kube::resources::services, ns, build_job_service(job));
    } catch (const kube::AlreadyExists&) {
      throw kube::Conflict(409, "Conflict", what + " appeared meanwhile; comparing it on the next pass");
    }
    return;
  }
  switch (claim_of(*have, uid)) {
    case Claim::kOurs:
      return;  // the informer has not caught up yet (or the label was taken off): it exists, left as it is
    case Claim::kEarlierJob:
      // Left over from an earlier job of the same name (the garbage collector has not caught up): replace it.
      client_.remove(kube::resources::services, ns, name);
      throw kube::Conflict(409, "Conflict", what + " belongs to an older job; replacing it");
    case Claim::kForeign: {
      // Someone else's Service under the job's name: never adopted, changed or deleted. The pods would get names
      // that Service does not serve (it is not headless over them), so none are made until the name is free.
      const std::string msg = what +
                              " exists and is not this job's: rename or delete it (each job's headless Service, which "
                              "gives its pods their DNS names, is named after the job), or rename the job; no pods "
                              "until then";
      recorder_.warning(job, "ServiceConflict", msg);
      throw Error(msg);
    }
  }
}

std::optional<Json> Controller::ensure_storage(const Json& job, const JobSpec& spec,
                                               std::vector<PendingEvent>& events) {
  if (!spec.storage) return std::nullopt;
  const api::StorageSpec& st = *spec.storage;
  const std::string ns = kube::namespace_of(job), name = api::storage_claim_name(kube::name_of(job));
  const std::string cache_key = "persistentvolumeclaims/" + kube::key_of(job),
                    stamp = uid_of(job) + (st.retain ? "\nRetain" : "\nDelete");
  {
    std::lock_guard lock(mu_);
    auto it = job_objects_.find(cache_key);
    if (it != job_objects_.end() && it->second == stamp) return std::nullopt;
  }
  const std::string what = "PersistentVolumeClaim " + ns + "/" + name;
  std::optional<Json> have = client_.try_get(kube::resources::persistentvolumeclaims, ns, name);
  if (!have) {
    try {
      have = client_.create(kube::resources::persistentvolumeclaims, ns, build_storage_claim(job, st));
    } catch (const kube::AlreadyExists&) {
      throw kube::Conflict(409, "Conflict", what + " appeared meanwhile; comparing it on the next pass");
    } catch (const kube::Invalid& e) {
      recorder_.warning(job, "StorageInvalid", what + " was refused: " + e.what() + "; fix spec.storage");
      throw;
    }
    events.push_back({false, "StorageCreated",
                      sanitize_message("created " + what + " (" + describe_storage(st) + ")", kMaxEventMessageBytes)});
  } else {
    switch (storage_owner(*have, job)) {
      case StorageOwner::kThisJob:
        break;
      case StorageOwner::kRetained:
        events.push_back({false, "StorageReused",
                          "reusing " + what + ", which an earlier job of this name retained (whenDeleted Retain)"});
        break;
      case StorageOwner::kGoing:
        // An earlier job's claim on its way out (the garbage collector, or its pods still using it): its data goes
        // with it, and this job gets a new one once the name is free.
        throw kube::Conflict(409, "Conflict", what + " belongs to an earlier job and is being deleted; waiting for it");
      case StorageOwner::kForeign: {
        const std::string msg = what +
                                " exists and is not this job's: rename or delete it (spec.storage's claim is named "
                                "<job>-storage), label it railyard.dev/job=" +
                                kube::name_of(job) +
                                " and railyard.dev/storage=true to give it to this job, or "
                                "remove spec.storage; no pods until then";
        recorder_.warning(job, "StorageConflict", msg);
        throw Error(msg);
      }
    }
    if (auto patch = storage_owner_patch(*have, job, st.retain))
      have = client_.patch(kube::resources::persistentvolumeclaims, ns, name, *patch);
  }
  // Cached once Bound: until then every pass reads it again, so that a gang placed later still names its node.
  if (kube::field(kube::field(*have, "status"), "phase") == "Bound") {
    std::lock_guard lock(mu_);
    job_objects_[cache_key] = stamp;
  }
  return have;
}

void Controller::select_storage_node(const Json& job, const Json& claim, const std::map<int, std::string>& placed) {
  if (placed.empty()) return;
  const Json& cls = kube::field(kube::field(claim, "spec"), "storageClassName");
  if (!cls.is_string() || cls.get<std::string>().empty()) return;
  std::optional<Json> storage_class;
  try {
    storage_class = client_.try_get(kube::resources::storageclasses, "", cls.get<std::string>());
  } catch (const kube::Forbidden& e) {
    log::warn(kLog, "cannot read the claim's StorageClass (RBAC: storageclasses get)",
              {{"job", kube::key_of(job)}, {"error", e.what()}});
    return;
  }
  if (!waits_for_selected_node(claim, storage_class ? &*storage_class : nullptr)) return;
  const std::string& node = placed.begin()->second;
  Json patch = {{"metadata", {{"annotations", {{kSelectedNodeAnnotation, node}}}}}};
  client_.patch(kube::resources::persistentvolumeclaims, kube::namespace_of(job), kube::name_of(claim), patch);
  log::info(kLog, "claim waits for its first consumer: selected the gang's first node",
            {{"job", kube::key_of(job)}, {"claim", kube::name_of(claim)}, {"node", node}});
}

void Controller::ensure_job_object(const Json& job, const kube::Resource& res, const Json& want,
                                   const std::string& conflict_reason, const std::string& fix) {
  const std::string ns = kube::namespace_of(job), name = kube::name_of(want), uid = uid_of(job);
  const std::string cache_key = res.plural + "/" + kube::key_of(job), stamp = uid + "\n" + want.dump();
  {
    std::lock_guard lock(mu_);
    auto it = job_objects_.find(cache_key);
    if (it != job_objects_.end() && it->second == stamp) return;
  }
  const std::string what = res.kind + " " + ns + "/" + name;
  auto have = client_.try_get(res, ns, name);
  if (!have) {
    try {
      client_.create(res, ns, want);
    } catch (const kube::AlreadyExists&) {
      throw kube::Conflict(409, "Conflict", what + " appeared meanwhile; comparing it on the next pass");
    }
  } else {
    const Claim claim = claim_of(*have, uid);
    if (claim == Claim::kEarlierJob) {
      // Left over from an earlier job of the same name (the garbage collector has not caught up): replace it.
      client_.remove(res, ns, name);
      throw kube::Conflict(409, "Conflict", what + " belongs to an older job; replacing it");
    }
    if (claim == Claim::kForeign) {
      // Someone else's object under the name this job's would take: never delete or take it over, and never run the
      // job without what the operator was told to give it.
      const std::string msg = what + " exists and is not this job's: " + fix + "; no pods until then";
      recorder_.warning(job, conflict_reason, msg);
      throw Error(msg);
    }
    // Built differently (the operator's flags or the job's spec changed): bring it to what this operator builds.
    bool differs = have->at("metadata").value("annotations", Json::object()) !=
                   want["metadata"].value("annotations", Json::object());
    for (auto it = want.begin(); it != want.end(); ++it)
      if (it.key() != "metadata" && it.key() != "apiVersion" && it.key() != "kind")
        differs = differs || have->value(it.key(), Json()) != it.value();
    if (differs) {
      Json update = want;
      update["metadata"]["resourceVersion"] = have->at("metadata").value("resourceVersion", "");
      client_.update(res, ns, update);
    }
  }
  std::lock_guard lock(mu_);
  job_objects_[cache_key] = stamp;
}

Json Controller::write_status(const Json& job, const Json& status) {
  Json obj = job;
  obj["status"] = status;
  stamp_conditions(obj["status"]);
  account_goodput(obj);
  return client_.update_status(kube::resources::trainingjobs, kube::namespace_of(job), obj);
}

void Controller::account_goodput(Json& obj) {
  const auto now = std::chrono::system_clock::now();
  auto created = now;
  try {
    created = kube::parse_rfc3339(obj["metadata"].value("creationTimestamp", ""));
  } catch (const std::exception&) {
    // A job object without its creation time (not one the API server returned): the ledger starts now.
  }
  Json& status = obj["status"];
  Json ledger = goodput::account(status.contains("goodput") ? status["goodput"] : Json(), status, created, now);
  if (ledger.is_null()) {
    status.erase("goodput");
    return;
  }
  status["goodput"] = ledger;
  const metrics::Labels job_labels = {{metrics::kNamespaceLabel, kube::namespace_of(obj)},
                                      {metrics::kTrainingJobLabel, kube::name_of(obj)}};
  for (const auto& cause : goodput::kCauses) {
    metrics::Labels l = job_labels;
    l["cause"] = std::string(cause.name);
    job_seconds_.add(l).set(ledger["seconds"].value(std::string(cause.name), 0.0));
  }
}

void Controller::emit(const Json& job, const std::vector<PendingEvent>& events) {
  for (const auto& e : events) {
    if (e.warning)
      recorder_.warning(job, e.reason, e.message);
    else
      recorder_.normal(job, e.reason, e.message);
  }
}

void Controller::delete_pod(const std::string& ns, const std::string& name, const std::string& uid, bool force) {
  kube::DeleteOptions o;
  if (force) o.grace_period_seconds = 0;
  o.precondition_uid = uid;
  try {
    client_.remove(kube::resources::pods, ns, name, o);
  } catch (const kube::NotFound&) {
  } catch (const kube::Conflict& e) {
    // The UID precondition failed: another pod holds the name now (the view this delete was decided on is stale, or
    // the name was replaced meanwhile). That pod is not the one meant; the next reconcile sees it as it is.
    log::info(kLog, "pod not deleted: its name is held by another pod now",
              {{"namespace", ns}, {"pod", name}, {"uid", uid}, {"error", e.what()}});
  }
}

void Controller::delete_pod(const std::string& ns, const Json& pod) {
  delete_pod(ns, kube::name_of(pod), uid_of(pod), false);
}

std::chrono::milliseconds Controller::finish(const Json& job, const JobSpec& spec, Json& status, const Json& orig,
                                             std::vector<PendingEvent>& events, const std::vector<PodPtr>& pods) {
  const std::string ns = kube::namespace_of(job), key = kube::key_of(job);
  // Persist the outcome before cleaning up, so a crash in between cannot lose it.
  Json current = job;
  if (status_differs(orig, status)) current = write_status(job, status);
  emit(job, events);
  // cleanPodPolicy Running keeps the pods that ended (their logs and last state, for inspection: a failed job's pods
  // first of all) and deletes those still running kPodStopWait after the job ended. Closing the job's rendezvous
  // (below) makes every agent stop its workers and exit, so an agent's pod ends within that wait; what still runs then
  // (no agent, or one that cannot stop) is deleted rather than left holding its node's GPUs.
  milliseconds recheck{0};
  const auto now = std::chrono::system_clock::now();
  std::optional<std::chrono::system_clock::time_point> ended;
  if (status.contains("completionTime") && status["completionTime"].is_string()) {
    try {
      ended = kube::parse_rfc3339(status["completionTime"].get<std::string>());
    } catch (const std::exception&) {
    }
  }
  for (const PodPtr& p : pods) {
    if (terminating(*p)) continue;
    const std::string phase = phase_of(*p);
    bool active = phase != "Succeeded" && phase != "Failed";
    if (spec.clean_pod_policy == "All") {
      delete_pod(ns, *p);
    } else if (spec.clean_pod_policy == "Running" && active) {
      if (!ended || now >= *ended + kPodStopWait) {
        delete_pod(ns, *p);
      } else {
        const auto left = std::chrono::duration_cast<milliseconds>(*ended + kPodStopWait - now) + milliseconds(100);
        recheck = recheck.count() == 0 ? left : std::min(recheck, left);
      }
    }
  }
  // The initializer pod (not among `pods`): one still at work when the job ended (it ended another way meanwhile) has
  // no agent to stop it, so it goes at once unless cleanPodPolicy is None; All deletes it in any state. Looked for only
  // where one ran (status.initializer): the look is a scan of the pod cache.
  if (const PodPtr init = status.contains("initializer") ? initializer_pod_of(job) : nullptr;
      init && !terminating(*init)) {
    const std::string phase = phase_of(*init);
    const bool active = phase != "Succeeded" && phase != "Failed";
    if (spec.clean_pod_policy == "All" || (spec.clean_pod_policy == "Running" && active)) delete_pod(ns, *init);
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
    const milliseconds ttl = std::chrono::duration_cast<milliseconds>(expire - now) + milliseconds(100);
    return recheck.count() > 0 ? std::min(recheck, ttl) : ttl;
  }
  return recheck;
}

std::chrono::milliseconds Controller::keep_finished(const Json& job, const FinishedJob& done) {
  const std::string ns = kube::namespace_of(job), name = kube::name_of(job);
  const Json orig = job.contains("status") && job["status"].is_object() ? job["status"] : Json::object();
  Json status = orig;
  const std::vector<PodPtr> pods = pods_of(job);
  // Only the acknowledgements change: the spec version seen and the live pod count (cleanPodPolicy deletes pods).
  status["observedGeneration"] = job["metadata"].value("generation", 0);
  status["replicas"] =
      static_cast<int>(std::count_if(pods.begin(), pods.end(), [](const PodPtr& p) { return !terminating(*p); }));
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
  const auto [ns, name] = split_key(key);
  log::debug("controller", "reconcile", {{"job", key}});
  // Read the job from the server, not the cache: a status we just wrote must be seen, or a restart is counted twice.
  auto fetched = client_.try_get(kube::resources::trainingjobs, ns, name);
  if (!fetched || (*fetched)["metadata"].contains("deletionTimestamp")) {
    forget_job(key);
    return milliseconds(0);
  }
  // Succeeded and Failed are terminal: nothing below may reopen a finished job (lifecycle.h finished_job).
  if (const FinishedJob done = finished_job(finished_facts(*fetched)); done.finished)
    return keep_finished(*fetched, done);
  // A spec version whose reconcile threw stays Invalid until its next try (poison.h), kept so as written then.
  const int64_t spec_generation = (*fetched)["metadata"].value("generation", int64_t{0});
  if (auto hold = poisoned_.held(key, uid_of(*fetched), spec_generation, Clock::now())) {
    const Json orig = fetched->contains("status") && (*fetched)["status"].is_object() ? (*fetched)["status"] : Json();
    const Json status =
        poisoned_status(orig, hold->cause, spec_generation, kube::format_rfc3339(std::chrono::system_clock::now()));
    if (status_differs(orig, status)) write_status(*fetched, status);
    return std::chrono::duration_cast<milliseconds>(hold->retry_in) + milliseconds(1);
  }

  // Observe and decide. A stage that settles the job for now (Invalid, Suspended, Failed, Succeeded) returns the
  // requeue delay.
  Sync s = observe(key, std::move(*fetched));
  if (auto r = validate(s)) return *r;
  if (auto r = suspend_or_resume(s)) return *r;
  if (auto r = check_deadline(s)) return *r;
  if (auto r = initialize(s)) return *r;
  observe_generation(s);
  if (Completion c = completion_now(s, s.pods, s.progress); c.done) return complete(s, c, s.progress, s.pods);
  if (auto r = collect_triggers(s)) return *r;
  replace_into_forming(s);
  if (auto r = restart_or_fail(s)) return *r;

  // Act: the generation made durable, pods deleted, created and bound.
  log::debug("controller", "decided", {{"job", key}});
  start_generation(s);
  create_pods(s);
  bind_gang(s);

  // Status: the world (a resize opens a generation), conditions and phase; then the generation is opened.
  if (auto r = resize_world(s)) return *r;
  plan_world(s);
  write_observed_status(s);
  open_generation(s);
  poisoned_.forget(key);  // this spec version reconciles again
  return s.requeue;
}

}  // namespace railyard::op
