// The TrainingJob controller: informers on TrainingJobs, worker Pods and Nodes feed a work queue of job keys;
// reconcile(key) converges one job (validate, secret, pods, gang binding, generations, restarts, status, events).
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/kube/client.h"
#include "common/kube/event_recorder.h"
#include "common/kube/informer.h"
#include "common/kube/work_queue.h"
#include "common/metrics/metrics.h"
#include "common/restart_request.h"
#include "operator/api.h"
#include "operator/controller/gang_order.h"
#include "operator/controller/lifecycle.h"
#include "operator/controller/network_policy.h"
#include "operator/controller/pending_event.h"
#include "operator/controller/pod_builder.h"
#include "operator/controller/pod_state.h"
#include "operator/controller/poison.h"
#include "operator/controller/suspect_nodes.h"
#include "operator/rendezvous/rendezvous.h"
#include "operator/scheduler/placement.h"

namespace railyard::op {

// The restart request annotations (railyard.dev/restart-request, -detector, -handled) and the monitor's request JSON
// are the contract in common/restart_request.h.

struct Sync;  // one reconcile's state through the stages (sync.h)

struct ControllerOptions {
  std::string ns;  // "" watches every namespace
  int workers = 2;
  // Concurrent create/bind requests of one reconcile (slow-start batches; the client's qps/burst still apply).
  int api_parallelism = 16;
  PodOptions pod;
  std::chrono::milliseconds unschedulable_retry{5000};
  // How long a restart caused only by survivors' peer-lost exits waits for the culprit's report (hold_for_culprit).
  std::chrono::milliseconds culprit_grace{1500};
  std::chrono::seconds resync{30};
  std::string controller_name = "trainingjob";
  // The per-job NetworkPolicy (operator/controller/network_policy.h; --network-policy).
  NetworkPolicyMode network_policy = NetworkPolicyMode::kIngress;
};

class Controller {
 public:
  Controller(kube::Client& client, metrics::Registry& registry, ControllerOptions opts,
             std::unique_ptr<Placement> placement = nullptr);
  ~Controller();
  Controller(const Controller&) = delete;
  Controller& operator=(const Controller&) = delete;

  void start_informers();
  bool wait_for_sync(std::chrono::milliseconds timeout);
  bool synced() const { return synced_.load(); }
  // The leader's rendezvous service (null when none): generations are opened there, exits come back from it.
  // `advertised_addr` (host:port) goes into new pods' RAILYARD_RENDEZVOUS_ADDR when not empty. `ca_pem` (the CA of
  // the service's certificate; empty when it speaks plain HTTP) goes into each job's Secret, key ca.crt, and new pods
  // read it as RAILYARD_RENDEZVOUS_CA. Call before start_workers().
  void set_rendezvous(RendezvousService* rdzv, const std::string& advertised_addr = "", const std::string& ca_pem = "");
  void start_workers();
  void stop();

  // Thread-safe entry points for the rendezvous service's callbacks.
  void report_exit(const WorkerExit& exit);
  void report_join_timeout(const JoinTimeout& timeout);

  // Converges one job. Returns a requeue delay (zero: none). Throws kube::ApiError / Error on failures the caller
  // retries with backoff (kube::Conflict: state changed under us, re-read at once).
  std::chrono::milliseconds reconcile(const std::string& key);

  kube::WorkQueue& queue() { return queue_; }

 private:
  // The stages of reconcile (README.md in this folder). A stage returning a value has settled the job for this
  // reconcile (Invalid, Suspended, Failed, Succeeded): reconcile returns that requeue delay.
  Sync observe(const std::string& key, Json job);                                // sync_observe.cc
  std::optional<std::chrono::milliseconds> validate(Sync& s);                    // sync_decide.cc
  std::optional<std::chrono::milliseconds> suspend_or_resume(Sync& s);           // sync_decide.cc
  std::optional<std::chrono::milliseconds> check_deadline(Sync& s);              // sync_decide.cc
  std::optional<std::chrono::milliseconds> initialize(Sync& s);                  // sync_initialize.cc
  std::chrono::milliseconds fail_initializer(Sync& s, Json init, const std::string& cause);
  PodPtr initializer_pod_of(const Json& job);  // the job's initializer pod in the informer, or null
  void observe_generation(Sync& s);                                              // sync_observe.cc
  Completion completion_now(const Sync& s, const std::vector<PodPtr>& job_pods,  // sync_decide.cc
                            const std::optional<RendezvousService::Progress>& prog);
  std::chrono::milliseconds complete(Sync& s, const Completion& c,
                                     const std::optional<RendezvousService::Progress>& prog,
                                     const std::vector<PodPtr>& job_pods);
  std::optional<RendezvousService::Progress> fresh_progress(const Sync& s);
  std::optional<std::chrono::milliseconds> collect_triggers(Sync& s);        // sync_decide.cc
  void replace_into_forming(Sync& s);                                        // sync_decide.cc
  std::optional<std::chrono::milliseconds> restart_or_fail(Sync& s);         // sync_decide.cc
  void start_generation(Sync& s);                                            // sync_act.cc
  void create_pods(Sync& s);                                                 // sync_act.cc
  void delete_pods(Sync& s);                                                 // sync_act.cc
  // Creates the pods of `indices` from `builder`, in slow-start batches, each on its placed node when it has one.
  void send_creates(Sync& s, const WorkerPodBuilder& builder, const std::vector<int>& indices);  // sync_act.cc
  void bind_gang(Sync& s);                                                   // sync_act.cc
  void place_gang(Sync& s, const std::vector<int>& indices, bool creating);  // sync_place.cc
  // The gangs waiting for nodes that go before s's job (gang_order.h), as placement requests, first first.
  std::vector<PlacementRequest> gangs_ahead(const Sync& s);        // sync_place.cc
  std::optional<std::chrono::milliseconds> resize_world(Sync& s);  // sync_status.cc
  void plan_world(Sync& s);                                        // sync_status.cc
  void write_observed_status(Sync& s);                             // sync_status.cc
  void open_generation(Sync& s);                                   // sync_act.cc

  void enqueue(const std::string& key);
  void enqueue_all_jobs();
  void worker_loop();
  // A reconcile of `key` threw `cause` (poison.h): the job is held Invalid for its spec version and tried again after
  // the returned delay. Throws what reading or writing the job throws (the caller then backs off as for any error).
  std::chrono::milliseconds hold_invalid(const std::string& key, const std::string& cause);
  // The job's pods: labelled railyard.dev/job=<name> in its namespace and controlled by it (ownerReference with
  // controller true, the job's uid, group railyard.dev and kind TrainingJob). A pod that only carries the label (made
  // by someone else, or by an earlier job of the same name) is never counted, adopted or acted on.
  std::vector<PodPtr> pods_of(const Json& job);
  // Nodes with every pod bound to them (node_pods_) and the jobs' own pods, for placement and planning.
  std::vector<NodeInfo> node_inventory();
  std::string ensure_token(const Json& job);
  // The job's headless Service <job> exists (job_service.h): created when missing (level-triggered: the Service
  // informer brings the job back when one is deleted), one of an earlier job of the same name deleted (Conflict,
  // retried), one that exists as this job's left as it is, someone else's never touched (Warning event
  // ServiceConflict and an Error: no pods until the name is free).
  void ensure_service(const Json& job);
  // The job's NetworkPolicy exists, is the job's and matches the mode (created or replaced otherwise).
  void ensure_network_policy(const Json& job, const JobSpec& spec);
  // A per-job object the pods depend on (NetworkPolicy, the env ConfigMap) exists as `want`: created, or brought to
  // it (update); one of an earlier job of the same name deleted (Conflict, retried); someone else's never touched
  // (Warning event `conflict_reason`, an Error that ends with `fix`). Remembered per job uid and content, so that a
  // reconcile costs no request once it is in place.
  void ensure_job_object(const Json& job, const kube::Resource& res, const Json& want,
                         const std::string& conflict_reason, const std::string& fix);
  // spec.storage (job_storage.h, docs/storage.md): the job's claim exists and follows whenDeleted. Created when
  // missing (event StorageCreated); one a job of this name retained is reused (StorageReused); one being deleted or
  // an earlier job's that the garbage collector takes is waited for (Conflict, retried); someone else's is never
  // touched (Warning StorageConflict and an Error: no pods until the name is free). Returns the claim when it was
  // read or made now; once it is Bound and follows the spec, later passes make no request (nullopt).
  std::optional<Json> ensure_storage(const Json& job, const JobSpec& spec, std::vector<PendingEvent>& events);
  // A claim whose class binds WaitForFirstConsumer gets the node of the gang's first placed pod (what kube-scheduler
  // does for the pods it binds), so that its provisioner makes the volume where the pods run.
  void select_storage_node(const Json& job, const Json& claim, const std::map<int, std::string>& placed);
  // The one way status is written: conditions stamped, the goodput ledger brought up to now (goodput.h), then PUT.
  Json write_status(const Json& job, const Json& status);
  void account_goodput(Json& obj);
  std::chrono::milliseconds finish(const Json& job, const JobSpec& spec, Json& status, const Json& orig,
                                   std::vector<PendingEvent>& events, const std::vector<PodPtr>& pods);
  // A Succeeded or Failed job: clean up and expire it, report what was asked of it since, change nothing else.
  std::chrono::milliseconds keep_finished(const Json& job, const FinishedJob& done);
  void emit(const Json& job, const std::vector<PendingEvent>& events);
  // Deletes pod `name` only while `uid` holds the name (a UID precondition; "" = any): a delete decided on a stale
  // view never removes the replacement that took the name since. force: grace period 0.
  void delete_pod(const std::string& ns, const std::string& name, const std::string& uid, bool force);
  void delete_pod(const std::string& ns, const Json& pod);  // gracefully, the pod observed (its name and UID)
  void forget_job(const std::string& key);
  void update_phase_gauge();

  kube::Client& client_;
  metrics::Registry& registry_;
  ControllerOptions opts_;
  std::unique_ptr<Placement> placement_;
  kube::EventRecorder recorder_;
  kube::WorkQueue queue_;
  std::unique_ptr<kube::Informer> jobs_, pods_, nodes_, node_pods_, services_;
  std::unique_ptr<kube::Informer> priority_classes_;  // scheduling.k8s.io PriorityClasses: the order of waiting gangs
  std::atomic<bool> synced_{false};
  std::atomic<bool> stopping_{false};
  std::vector<std::thread> workers_;

  std::mutex mu_;  // the maps below
  RendezvousService* rdzv_ = nullptr;
  std::map<std::string, std::vector<WorkerExit>> exits_;
  std::map<std::string, std::vector<JoinTimeout>> timeouts_;
  std::map<std::string, int64_t> opened_;  // job key -> generation opened
  // job key -> generation whose recovery was observed: the cache may show the old status for a reconcile or two.
  std::map<std::string, int64_t> recovery_observed_;
  std::map<std::string, std::pair<std::string, std::string>> tokens_;  // job key -> (uid, token)
  std::string rendezvous_ca_;  // PEM the jobs' Secrets carry as ca.crt; empty: plain HTTP
  // "<plural>/<job key>" -> uid and content of the per-job object in place (ensure_job_object)
  std::map<std::string, std::string> job_objects_;
  PoisonedJobs poisoned_;  // jobs held Invalid after their reconcile threw (thread-safe itself)
  SuspectNodes suspects_;  // nodes of pods that fell silent, kept off a while per job (thread-safe itself)

  // Metrics.
  metrics::Family<metrics::Gauge>& jobs_by_phase_;
  metrics::Family<metrics::Counter>& restarts_;
  metrics::Family<metrics::Counter>& errors_;
  metrics::Family<metrics::Histogram>& placement_seconds_;
  metrics::Family<metrics::Histogram>& recovery_seconds_;
  metrics::Family<metrics::Histogram>& detection_seconds_;
  metrics::Family<metrics::Gauge>& job_seconds_;  // the goodput ledger, by cause
  metrics::Family<metrics::Gauge>& wq_depth_;
  metrics::Family<metrics::Counter>& wq_adds_;
  metrics::Family<metrics::Counter>& wq_retries_;
  metrics::Family<metrics::Counter>& cr_total_;
  metrics::Family<metrics::Counter>& cr_errors_;
  metrics::Family<metrics::Histogram>& cr_time_;
};

}  // namespace railyard::op
