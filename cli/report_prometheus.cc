// `railyard report NAMESPACE/JOB --prometheus URL`: the run's series read back from Prometheus with range queries (the
// same expressions as the Grafana training dashboard) and turned into the steps the page draws.
#include <httplib.h>

#include <cmath>
#include <limits>
#include <map>

#include "cli/report.h"
#include "common/error.h"
#include "common/kube/client.h"
#include "common/metrics/job_labels.h"
#include "common/metrics/names.h"

namespace railyard::cli::report {

namespace {

using Samples = std::map<long long, double>;  // unix time (s) -> value

// One range query; its result must be at most one series (every expression below aggregates).
Samples query_range(httplib::Client& cli, const std::string& prefix, const std::string& url, const std::string& q,
                    long long start, long long end, long long step) {
  const std::string path = prefix + "/api/v1/query_range?query=" + kube::url_encode(q) +
                           "&start=" + std::to_string(start) + "&end=" + std::to_string(end) +
                           "&step=" + std::to_string(step);
  auto res = cli.Get(path);
  if (!res) {
    throw Error("--prometheus " + url + ": cannot reach it (" + httplib::to_string(res.error()) + ")");
  }
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(res->body);
  } catch (const std::exception&) {
    throw Error("--prometheus " + url + ": HTTP " + std::to_string(res->status) +
                ", not a Prometheus API answer (is this the Prometheus base URL?)");
  }
  if (j.value("status", "") != "success") {
    throw Error("--prometheus " + url + ": query '" + q +
                "' failed: " + j.value("error", "HTTP " + std::to_string(res->status)));
  }
  Samples out;
  const auto& result = j["data"]["result"];
  if (result.empty()) return out;
  for (const auto& v : result[0]["values"]) {
    const std::string s = v[1].get<std::string>();
    out[static_cast<long long>(v[0].get<double>())] = std::strtod(s.c_str(), nullptr);
  }
  return out;
}

double at(const Samples& s, long long t) {
  auto it = s.find(t);
  return it == s.end() ? std::numeric_limits<double>::quiet_NaN() : it->second;
}

}  // namespace

RunLog from_prometheus(const std::string& url, const std::string& ns, const std::string& job, long long since_seconds,
                       long long now) {
  // URL = scheme://host[:port][/prefix]
  const size_t scheme = url.find("://");
  if (scheme == std::string::npos || (url.compare(0, scheme, "http") != 0 && url.compare(0, scheme, "https") != 0)) {
    throw Error("--prometheus " + url + ": expected http://HOST:PORT or https://HOST:PORT[/PREFIX]");
  }
  const size_t slash = url.find('/', scheme + 3);
  const std::string base = url.substr(0, slash), prefix = slash == std::string::npos ? "" : url.substr(slash);
  httplib::Client cli(base);
  cli.set_connection_timeout(5);
  cli.set_read_timeout(30);
  const long long start = now - since_seconds, step = std::max(1LL, since_seconds / 1000);
  const std::string sel = std::string("{") + metrics::kNamespaceLabel + "=\"" + ns + "\", " +
                          metrics::kTrainingJobLabel + "=\"" + job + "\"}";
  auto q = [&](const std::string& expr) { return query_range(cli, prefix, url, expr, start, now, step); };
  // agg(NAME{sel}) for a gauge of names.h.
  auto of = [&](const char* agg, metrics::GaugeName g) { return q(std::string(agg) + "(" + g.name + sel + ")"); };
  namespace n = metrics::names;
  const Samples steps = of("max", n::kWorkerStep);
  if (steps.empty()) {
    throw Error("--prometheus " + url + ": no " + n::kWorkerStep.name + " for namespace=\"" + ns +
                "\", trainingjob=\"" + job + "\" in the last " + std::to_string(since_seconds) +
                " s (wrong job, or a longer --since?)");
  }
  const Samples total = of("max", n::kWorkerTotalSteps), loss = of("avg", n::kWorkerLoss),
                val = of("avg", n::kWorkerValidationLoss), tokens = of("max", n::kWorkerTokensPerSecond),
                step_ms = q("1000 * max(rate(" + metrics::sum_series(n::kWorkerStepDuration) + sel + "[1m]) / rate(" +
                            metrics::count_series(n::kWorkerStepDuration) + sel + "[1m]))"),
                mfu = of("avg", n::kWorkerMfuRatio), lr = of("max", n::kWorkerLearningRate),
                grad = of("max", n::kWorkerGradNorm), generation = of("max", n::kAgentGeneration);
  RunLog log;
  log.name = "Prometheus " + url + " " + ns + "/" + job;
  int64_t last_step = -1;
  double last_gen = std::numeric_limits<double>::quiet_NaN(), last_val = last_gen;
  std::string opens;  // what opens the next segment: a new generation
  for (const auto& [t, v] : steps) {
    const double g = at(generation, t);
    if (std::isfinite(g) && g != last_gen) {
      if (std::isfinite(last_gen)) opens = "generation " + std::to_string(static_cast<long long>(g));
      last_gen = g;
    }
    const double vl = at(val, t);
    if (std::isfinite(vl) && vl != last_val) {
      log.val.push_back({static_cast<int64_t>(v), vl});
      last_val = vl;
    }
    // Prometheus samples the gauge every scrape: one point per new step value (a restart's step going back counts).
    const auto s = static_cast<int64_t>(v);
    if (s == last_step || s <= 0) continue;
    last_step = s;
    StepPoint p;
    p.step = s;
    p.loss = at(loss, t);
    p.tokens_per_s = at(tokens, t);
    p.step_ms = at(step_ms, t);
    p.mfu = at(mfu, t);
    p.lr = at(lr, t);
    p.grad_norm = at(grad, t);
    for (double& x : p.split_ms) x = std::numeric_limits<double>::quiet_NaN();  // not exported as metrics
    append_step(log, p, opens);
    opens.clear();
  }
  if (!total.empty()) log.total_steps = static_cast<int64_t>(total.rbegin()->second);
  return log;
}

}  // namespace railyard::cli::report
