// railyard-monitor: every interval, reads the workers' series (from Prometheus's query API, or by scraping the pods
// itself when no Prometheus is configured), evaluates the health rules per TrainingJob and turns a verdict into a
// checkpoint-restart request on the job. Also receives Alertmanager webhooks. See monitor/README.md.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "common/kube/client.h"
#include "common/kube/event_recorder.h"
#include "common/metrics/metrics.h"
#include "monitor/attribution.h"
#include "monitor/rules.h"
#include "monitor/samples.h"

namespace railyard::monitor {

struct Options {
  std::string prometheus_url;  // empty: embedded mode (scrape the pods directly)
  double interval_s = 1;
  std::string listen = "127.0.0.1:9402";  // webhook + /metrics + /healthz; port 0 picks one
  std::string webhook_token;              // empty: the webhook answers 503
  std::string ns;                         // "" watches every namespace
  int metrics_port = 9400;                // embedded mode, when a pod has no railyard.dev/metrics-port
  double scrape_timeout_s = 2;
  Policy defaults;
};

// "127.0.0.1:9402" -> host, port; throws ConfigError naming the flag.
std::pair<std::string, int> parse_listen(const std::string& listen);

class Monitor {
 public:
  Monitor(kube::Client& client, Options opts);
  ~Monitor();
  Monitor(const Monitor&) = delete;
  Monitor& operator=(const Monitor&) = delete;

  // Starts the HTTP server (webhook, /metrics, /healthz) in a background thread; returns the bound port.
  int start_server();
  // Evaluates every interval until `stop` becomes true.
  void run(const std::atomic<bool>& stop);
  // One round over every job; returns the verdicts acted on (restart requests and warnings). `now` in unix seconds.
  std::vector<Verdict> evaluate_once(double now);
  // The Alertmanager receiver: HTTP status and a JSON body. A standby (set_leading(false)) answers 503, which
  // Alertmanager retries, so only the leader turns alerts into restart requests.
  std::pair<int, std::string> handle_webhook(const std::string& authorization, const std::string& body);
  // With leader election (--leader-elect): false on a standby until it leads; railyard_monitor_leader follows it.
  void set_leading(bool leading);

  // For the benchmark: the rules over samples already in memory, without Kubernetes.
  size_t last_series() const { return last_series_; }
  metrics::Registry& registry() { return registry_; }

 private:
  std::vector<Sample> collect_prometheus();
  std::vector<Sample> collect_embedded(const std::vector<kube::Json>& jobs);
  bool request_restart(const kube::Json& job, const RestartRequest& req, bool node_suspect, bool exclude);
  // A verdict that asks for no restart (v.restart false): a Warning event on the job, the log and the verdict count.
  void warn(const kube::Json& job, const Verdict& v);

  kube::Client& client_;
  Options opts_;
  kube::EventRecorder recorder_;
  metrics::Registry registry_;
  metrics::Counter* evaluations_;
  metrics::Family<metrics::Counter>* verdicts_;
  metrics::Family<metrics::Counter>* errors_;
  metrics::Family<metrics::Counter>* webhook_requests_;
  metrics::Histogram* detection_latency_;
  metrics::Histogram* evaluation_duration_;
  metrics::Gauge* series_;
  metrics::Gauge* leader_;
  std::atomic<bool> leading_{true};
  std::mutex mu_;  // evaluator_ and the restart path (the webhook runs on the server thread)
  Evaluator evaluator_;
  Attributor attributor_;  // which series may speak for which job and rank (both modes)
  metrics::Counter* rejected_;
  std::set<std::string> warned_;  // rejection notes already logged
  size_t last_series_ = 0;
  struct Server;
  std::unique_ptr<Server> server_;
};

}  // namespace railyard::monitor
