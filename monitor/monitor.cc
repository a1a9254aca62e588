#include "monitor/monitor.h"

#include <httplib.h>

#include <chrono>
#include <cmath>
#include <thread>

#include "common/error.h"
#include "common/http_server_bounds.h"
#include "common/job_spec.h"
#include "common/log.h"
#include "common/metrics/job_labels.h"
#include "common/pod_env.h"
#include "common/wellknown.h"
#include "monitor/alertmanager.h"
#include "monitor/attribution.h"

namespace railyard::monitor {
namespace {

constexpr const char* kLog = "monitor";
// One query for every worker series the rules read (rules.h read_series, but `up`), one for the targets' health.
std::string worker_query() {
  std::string alternatives;
  for (const std::string& name : read_series())
    if (name != metrics::names::kUp.name) alternatives += (alternatives.empty() ? "" : "|") + name;
  return "{__name__=~\"" + alternatives + "\"}";
}
// Every worker target's health; the target labels (namespace, trainingjob, pod, node) come from the pod's metadata.
std::string up_query() { return std::string(metrics::names::kUp.name) + "{trainingjob!=\"\"}"; }

double unix_now() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

int64_t generation_of(const kube::Json& job) {
  if (job.contains("status") && job["status"].is_object() && job["status"].contains("generation") &&
      job["status"]["generation"].is_number_integer())
    return job["status"]["generation"].get<int64_t>();
  return 0;
}

std::string phase_of(const kube::Json& job) {
  if (job.contains("status") && job["status"].is_object() && job["status"].contains("phase") &&
      job["status"]["phase"].is_string())
    return job["status"]["phase"];
  return "";
}

std::string annotation(const kube::Json& obj, const std::string& key) {
  const auto& md = obj.value("metadata", kube::Json::object());
  if (!md.contains("annotations") || !md["annotations"].is_object()) return "";
  return md["annotations"].value(key, std::string());
}

// Splits "http://host:port/prefix" into the origin httplib wants and a path prefix.
std::pair<std::string, std::string> split_url(const std::string& url) {
  auto scheme = url.find("://");
  if (scheme == std::string::npos || (url.rfind("http://", 0) != 0 && url.rfind("https://", 0) != 0))
    throw ConfigError("--prometheus-url '" + url + "' is not an http(s) URL (e.g. http://127.0.0.1:9090)");
  auto slash = url.find('/', scheme + 3);
  if (slash == std::string::npos) return {url, ""};
  std::string prefix = url.substr(slash);
  while (!prefix.empty() && prefix.back() == '/') prefix.pop_back();
  return {url.substr(0, slash), prefix};
}

bool constant_time_equal(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace

std::pair<std::string, int> parse_listen(const std::string& listen) {
  auto colon = listen.rfind(':');
  if (colon == std::string::npos || colon == 0)
    throw ConfigError("--listen '" + listen + "' is not HOST:PORT (e.g. 127.0.0.1:9402)");
  std::string host = listen.substr(0, colon), port_s = listen.substr(colon + 1);
  if (port_s.empty() || port_s.size() > 5 || port_s.find_first_not_of("0123456789") != std::string::npos ||
      std::stoi(port_s) > 65535)
    throw ConfigError("--listen '" + listen + "': port '" + port_s + "' is not a number in 0..65535");
  return {host, std::stoi(port_s)};
}

struct Monitor::Server {
  httplib::Server http;
  std::thread thread;
};

Monitor::Monitor(kube::Client& client, Options opts)
    : client_(client), opts_(std::move(opts)), recorder_(client, {"railyard-monitor", "", std::chrono::seconds(600)}) {
  evaluations_ =
      &registry_.counter(metrics::names::kMonitorEvaluationsTotal, "Evaluation rounds over all jobs.").add({});
  verdicts_ = &registry_.counter(metrics::names::kMonitorVerdictsTotal,
                                 "Restart requests made, by rule (alertmanager for the webhook path).");
  errors_ = &registry_.counter(metrics::names::kMonitorQueryErrorsTotal,
                               "Failed reads, by source (prometheus, scrape, kube).");
  webhook_requests_ =
      &registry_.counter(metrics::names::kMonitorWebhookRequestsTotal, "Alertmanager webhook requests, by HTTP code.");
  detection_latency_ = &registry_
                            .histogram(metrics::names::kMonitorDetectionLatencySeconds,
                                       "From the onset of a condition (e.g. the last step progress) to the verdict.",
                                       metrics::exponential_buckets(1, 2, 12))
                            .add({});
  evaluation_duration_ =
      &registry_
           .histogram(metrics::names::kMonitorEvaluationDurationSeconds,
                      "Wall time of one evaluation round (reads included).", metrics::exponential_buckets(0.001, 2, 14))
           .add({});
  rejected_ = &registry_
                   .counter(metrics::names::kMonitorRejectedSeriesTotal,
                            "Worker series dropped because their target may not speak for the job or rank they name.")
                   .add({});
  series_ = &registry_.gauge(metrics::names::kMonitorSeries, "Worker series read in the last evaluation.").add({});
  leader_ = &registry_.gauge(metrics::names::kMonitorLeader, "1 while this replica evaluates (leads, or runs alone).")
                 .add({});
  leader_->set(1);
  if (!opts_.prometheus_url.empty()) split_url(opts_.prometheus_url);  // validate early
  if (opts_.interval_s <= 0) throw ConfigError("--interval must be > 0 seconds");
}

Monitor::~Monitor() {
  if (server_) {
    server_->http.stop();
    if (server_->thread.joinable()) server_->thread.join();
  }
}

int Monitor::start_server() {
  auto [host, port] = parse_listen(opts_.listen);
  server_ = std::make_unique<Server>();
  auto& http = server_->http;
  // The webhook takes Alertmanager's batches (a few KiB each; 1 MiB is far above any real one).
  railyard::http::ServerBounds bounds;
  bounds.max_body = 1 << 20;
  railyard::http::apply(http, bounds);
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(registry_.serialize(), "text/plain; version=0.0.4; charset=utf-8");
  });
  http.Get("/healthz", [](const httplib::Request&, httplib::Response& res) { res.set_content("ok\n", "text/plain"); });
  http.Post("/webhook/alertmanager", [this](const httplib::Request& req, httplib::Response& res) {
    auto [code, body] = handle_webhook(req.get_header_value("Authorization"), req.body);
    res.status = code;
    res.set_content(body, "application/json");
  });
  int bound = port == 0 ? http.bind_to_any_port(host) : (http.bind_to_port(host, port) ? port : -1);
  if (bound <= 0) throw Error("--listen " + opts_.listen + ": cannot bind (port in use or address not local)");
  server_->thread = std::thread([this] { server_->http.listen_after_bind(); });
  return bound;
}

void Monitor::run(const std::atomic<bool>& stop) {
  auto period = std::chrono::duration<double>(opts_.interval_s);
  auto next = std::chrono::steady_clock::now();
  while (!stop.load()) {
    try {
      evaluate_once(unix_now());
    } catch (const std::exception& e) {
      log::error(kLog, "evaluation failed", {{"error", e.what()}});
    }
    next += std::chrono::duration_cast<std::chrono::steady_clock::duration>(period);
    auto now = std::chrono::steady_clock::now();
    if (next < now) next = now;
    while (!stop.load() && std::chrono::steady_clock::now() < next)
      std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(next - std::chrono::steady_clock::now(),
                                                                                std::chrono::milliseconds(100)));
  }
}

std::vector<Sample> Monitor::collect_prometheus() {
  auto [origin, prefix] = split_url(opts_.prometheus_url);
  httplib::Client cli(origin);
  cli.set_connection_timeout(std::chrono::milliseconds(static_cast<int64_t>(opts_.scrape_timeout_s * 1000)));
  cli.set_read_timeout(std::chrono::milliseconds(static_cast<int64_t>(opts_.scrape_timeout_s * 1000)));
  std::vector<Sample> out;
  static const std::string worker = worker_query(), up = up_query();
  for (const std::string* q : {&worker, &up}) {
    std::string path = prefix + "/api/v1/query?query=" + kube::url_encode(*q);
    auto res = cli.Get(path);
    std::string where = opts_.prometheus_url + "/api/v1/query";
    if (!res) throw Error(where + ": " + httplib::to_string(res.error()));
    if (res->status != 200 && res->status != 400 && res->status != 422)
      throw Error(where + ": HTTP " + std::to_string(res->status));
    auto part = parse_query_response(res->body, where);
    out.insert(out.end(), part.begin(), part.end());
  }
  return out;
}

std::vector<Sample> Monitor::collect_embedded(const std::vector<kube::Json>& jobs) {
  std::vector<Sample> out;
  for (const auto& job : jobs) {
    std::string ns = kube::namespace_of(job), name = kube::name_of(job);
    // The spec through the operator's reader (common/job_spec.h); a spec it refuses runs no pods.
    const api::ParsedJob parsed = api::parse_job(job);
    if (parsed.violation) continue;
    const int procs = parsed.spec.procs_per_replica;
    kube::ListOptions lo;
    lo.label_selector = std::string(wellknown::kJobLabel) + "=" + name;
    std::vector<kube::Json> pods;
    try {
      pods = client_.list_all(kube::resources::pods, ns, lo);
    } catch (const std::exception& e) {
      errors_->add({{"source", "kube"}}).increment();
      log::warn(kLog, "cannot list pods", {{"job", ns + "/" + name}, {"error", e.what()}});
      continue;
    }
    for (const auto& pod : pods) {
      std::string ip = pod.value("status", kube::Json::object()).value("podIP", std::string());
      if (ip.empty() || pod["status"].value("phase", std::string()) != "Running") continue;
      std::string node = pod.value("spec", kube::Json::object()).value("nodeName", std::string());
      int port = opts_.metrics_port;
      std::string ann = annotation(pod, wellknown::kMetricsPortAnnotation);
      if (!ann.empty()) {
        try {
          port = std::stoi(ann);
        } catch (const std::exception&) {
          log::warn(kLog, "bad metrics-port annotation", {{"pod", kube::key_of(pod)}, {"value", ann}});
          continue;
        }
      }
      for (int i = 0; i < procs; ++i) {
        std::string target = ip + ":" + std::to_string(port + i);
        httplib::Client cli("http://" + target);
        cli.set_connection_timeout(std::chrono::milliseconds(static_cast<int64_t>(opts_.scrape_timeout_s * 1000)));
        cli.set_read_timeout(std::chrono::milliseconds(static_cast<int64_t>(opts_.scrape_timeout_s * 1000)));
        std::vector<Sample> got;
        std::string err;
        if (auto res = cli.Get("/metrics"); !res) {
          err = httplib::to_string(res.error());
        } else if (res->status != 200) {
          err = "HTTP " + std::to_string(res->status);
        } else {
          try {
            got = parse_text_format(res->body, "http://" + target + "/metrics");
          } catch (const std::exception& e) {
            err = e.what();
          }
        }
        // The job, pod and node are the Pod object's, never what the process serves (docs/monitor.md "Who may
        // speak for a job"): a served label of those names is overwritten; only rank and generation are the
        // process's, and the Attributor checks the rank against the pod's place in the world.
        const metrics::Labels identity = {{metrics::kNamespaceLabel, ns},
                                          {metrics::kTrainingJobLabel, name},
                                          {kPodLabel, kube::name_of(pod)},
                                          {"node", node},
                                          {"instance", target}};
        Sample up;
        up.name = metrics::names::kUp.name;
        up.labels = identity;
        if (err.empty()) {
          for (auto& s : got) {
            for (const auto& [k, v] : identity) s.labels[k] = v;
            out.push_back(std::move(s));
          }
          up.value = 1;
        } else {
          errors_->add({{"source", "scrape"}}).increment();
          log::debug(kLog, "scrape failed", {{"target", target}, {"error", err}});
          up.value = 0;
        }
        out.push_back(up);
      }
    }
  }
  return out;
}

std::vector<Verdict> Monitor::evaluate_once(double now) {
  auto t0 = std::chrono::steady_clock::now();
  std::vector<Verdict> acted;
  std::vector<kube::Json> jobs;
  try {
    jobs = client_.list_all(kube::resources::trainingjobs, opts_.ns);
  } catch (const std::exception& e) {
    errors_->add({{"source", "kube"}}).increment();
    throw Error(std::string("cannot list TrainingJobs: ") + e.what());
  }
  std::vector<kube::Json> active;
  for (auto& job : jobs) {
    std::string phase = phase_of(job);
    // Jobs without a status have no operator yet (or a test drives them); Running is the only phase with workers
    // that must make progress.
    if (phase.empty() || phase == "Running") active.push_back(job);
  }
  std::vector<Sample> samples;
  if (!active.empty()) {
    if (opts_.prometheus_url.empty()) {
      samples = collect_embedded(active);
    } else {
      try {
        samples = collect_prometheus();
      } catch (const std::exception& e) {
        errors_->add({{"source", "prometheus"}}).increment();
        log::warn(kLog, "prometheus query failed; skipping this round", {{"error", e.what()}});
        evaluations_->increment();
        return acted;
      }
    }
  }
  if (!samples.empty()) {
    std::map<JobKey, JobWorld> worlds;
    for (const auto& job : active) worlds[{kube::namespace_of(job), kube::name_of(job)}] = world_of(job);
    auto attributed = attributor_.attribute(samples, worlds);
    if (attributed.rejected > 0) {
      rejected_->increment(static_cast<double>(attributed.rejected));
      // Once per target and reason: a pod that keeps serving another job's series would fill the log every round.
      for (const auto& note : attributed.notes)
        if (warned_.size() < 1000 && warned_.insert(note).second)
          log::warn(kLog, "series rejected: the target may not speak for the job or rank it names", {{"why", note}});
    }
    samples = std::move(attributed.kept);
  }
  last_series_ = samples.size();
  series_->set(static_cast<double>(samples.size()));
  auto grouped = group_samples(samples);
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& job : jobs) {
    JobKey key{kube::namespace_of(job), kube::name_of(job)};
    std::string phase = phase_of(job);
    if (!(phase.empty() || phase == "Running")) {
      evaluator_.forget(key);
      continue;
    }
    int64_t gen = generation_of(job);
    if (auto prev = parse_restart_request(annotation(job, kRestartRequestAnnotation)); prev && prev->generation == gen)
      evaluator_.mark_fired(key, gen);
    Policy policy = policy_for_job(job, opts_.defaults);
    static const std::map<int, RankObs> kNone;
    auto it = grouped.find(key);
    auto verdict = evaluator_.evaluate(key, gen, it == grouped.end() ? kNone : it->second, policy, now);
    if (!verdict) continue;
    if (!verdict->restart) {
      warn(job, *verdict);
      acted.push_back(*verdict);
      continue;
    }
    auto req = request_from_verdict(*verdict, kube::format_rfc3339(std::chrono::system_clock::now()));
    if (request_restart(job, req, verdict->node_suspect, policy.exclude_failed_nodes)) {
      verdicts_->add({{"rule", verdict->rule}}).increment();
      detection_latency_->observe(std::max(0.0, verdict->at - verdict->onset));
      acted.push_back(*verdict);
    } else {
      evaluator_.forget(key);  // not requested: evaluate again next round
    }
  }
  evaluations_->increment();
  evaluation_duration_->observe(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return acted;
}

void Monitor::warn(const kube::Json& job, const Verdict& v) {
  verdicts_->add({{"rule", v.rule}}).increment();
  kube::Json ref = job;  // items of a list carry no apiVersion/kind, which the Event's involvedObject needs
  ref["apiVersion"] = kube::resources::trainingjobs.api_version();
  ref["kind"] = kube::resources::trainingjobs.kind;
  recorder_.warning(ref, v.reason, v.reason + ": " + v.evidence + "; no restart (it would restore that checkpoint)");
  log::warn(kLog, "warning", {{"job", kube::key_of(job)}, {"reason", v.reason}, {"evidence", v.evidence}});
}

bool Monitor::request_restart(const kube::Json& job, const RestartRequest& req, bool node_suspect, bool exclude) {
  std::string value = format_restart_request(req);
  kube::Json ann = {{kRestartRequestAnnotation, value}, {kRestartDetectorAnnotation, req.detector}};
  bool excluding = node_suspect && exclude && !req.node.empty();
  if (excluding) ann[kExcludeNodesAnnotation] = add_to_node_list(annotation(job, kExcludeNodesAnnotation), req.node);
  std::string key = kube::key_of(job);
  try {
    client_.patch(kube::resources::trainingjobs, kube::namespace_of(job), kube::name_of(job),
                  {{"metadata", {{"annotations", ann}}}});
  } catch (const std::exception& e) {
    errors_->add({{"source", "kube"}}).increment();
    log::error(kLog, "cannot annotate the job", {{"job", key}, {"error", e.what()}});
    return false;
  }
  std::string msg = req.reason + (req.rank >= 0 ? " on rank " + std::to_string(req.rank) : std::string()) +
                    (req.node.empty() ? "" : " (node " + req.node + ")") + ": " + req.evidence +
                    "; checkpoint-restart requested" + (excluding ? ", node marked for exclusion" : "");
  // Items of a list carry no apiVersion/kind, which the Event's involvedObject needs.
  kube::Json ref = job;
  ref["apiVersion"] = kube::resources::trainingjobs.api_version();
  ref["kind"] = kube::resources::trainingjobs.kind;
  recorder_.warning(ref, req.reason, msg);
  log::warn(kLog, "restart requested",
            {{"job", key},
             {"reason", req.reason},
             {"rank", std::to_string(req.rank)},
             {"node", req.node},
             {"generation", std::to_string(req.generation.value_or(-1))},
             {"evidence", req.evidence}});
  return true;
}

void Monitor::set_leading(bool leading) {
  leading_ = leading;
  leader_->set(leading ? 1 : 0);
}

std::pair<int, std::string> Monitor::handle_webhook(const std::string& authorization, const std::string& body) {
  auto reply = [this](int code, kube::Json j) {
    webhook_requests_->add({{"code", std::to_string(code)}}).increment();
    return std::make_pair(code, j.dump());
  };
  if (!leading_)
    return reply(503, {{"error", "this railyard-monitor replica is a standby; the leader takes the webhook (retry)"}});
  if (opts_.webhook_token.empty())
    return reply(503, {{"error", std::string("webhook disabled: start railyard-monitor with --webhook-token-file or ") +
                                     pod_env::kMonitorWebhookToken}});
  const std::string bearer = "Bearer ";
  if (authorization.rfind(bearer, 0) != 0 ||
      !constant_time_equal(authorization.substr(bearer.size()), opts_.webhook_token))
    return reply(401, {{"error", "missing or wrong bearer token (Authorization: Bearer <token>)"}});
  AlertmanagerPayload payload;
  try {
    payload = parse_alertmanager_payload(body);
  } catch (const std::exception& e) {
    return reply(400, {{"error", e.what()}});
  }
  int accepted = 0, duplicates = 0, ignored = 0;
  kube::Json notes = kube::Json::array();
  for (const auto& alert : payload.alerts) {
    std::string ns = alert.label(metrics::kNamespaceLabel), name = alert.label(metrics::kTrainingJobLabel);
    if (alert.status != "firing" || ns.empty() || name.empty()) {
      ++ignored;
      continue;
    }
    kube::Json job;
    try {
      auto got = client_.try_get(kube::resources::trainingjobs, ns, name);
      if (!got) {
        ++ignored;
        notes.push_back("TrainingJob " + ns + "/" + name + " not found");
        continue;
      }
      job = *got;
    } catch (const std::exception& e) {
      errors_->add({{"source", "kube"}}).increment();
      return reply(503, {{"error", std::string("cannot read the TrainingJob: ") + e.what()}});
    }
    int64_t gen = generation_of(job);
    JobKey key{ns, name};
    std::lock_guard<std::mutex> lock(mu_);
    auto prev = parse_restart_request(annotation(job, kRestartRequestAnnotation));
    if (evaluator_.fired(key, gen) || (prev && prev->generation == gen)) {
      evaluator_.mark_fired(key, gen);
      ++duplicates;
      continue;
    }
    RestartRequest req;
    req.reason = alert.label("alertname");
    req.rule = "alertmanager";
    req.source = "alertmanager";
    req.generation = gen;
    req.node = alert.label("node");
    std::string rank = alert.label("rank");
    if (!rank.empty() && rank.size() < 9 && rank.find_first_not_of("0123456789") == std::string::npos)
      req.rank = std::stoi(rank);
    auto ann = alert.annotations;
    req.evidence = ann.count("summary") ? ann["summary"] : ann.count("description") ? ann["description"] : "";
    if (req.evidence.empty()) req.evidence = "alert " + req.reason + " firing since " + alert.starts_at;
    req.time = kube::format_rfc3339(std::chrono::system_clock::now());
    req.onset = alert.starts_at;
    Policy policy = policy_for_job(job, opts_.defaults);
    if (!request_restart(job, req, !req.node.empty(), policy.exclude_failed_nodes))
      return reply(503, {{"error", "cannot annotate TrainingJob " + ns + "/" + name}});
    evaluator_.mark_fired(key, gen);
    verdicts_->add({{"rule", "alertmanager"}}).increment();
    ++accepted;
  }
  return reply(200, {{"accepted", accepted}, {"duplicates", duplicates}, {"ignored", ignored}, {"notes", notes}});
}

}  // namespace railyard::monitor
