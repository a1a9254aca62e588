#include "planner/search.h"

#include <algorithm>
#include <cstdio>
#include <tuple>

#include "common/error.h"

namespace railyard::plan {

namespace {

std::vector<int> divisors(long long n, long long limit) {
  std::vector<int> out;
  for (long long d = 1; d <= n && d <= limit; ++d)
    if (n % d == 0) out.push_back(static_cast<int>(d));
  return out;
}

// A short kind for the rejection counts ("tp does not divide heads" etc.): the reason's text without numbers.
std::string reason_kind(const std::string& why) {
  std::string out;
  bool last_space = false;
  for (char c : why) {
    if ((c >= '0' && c <= '9') || c == '*') continue;
    if (c == ' ' && last_space) continue;
    last_space = c == ' ';
    out += c;
  }
  const size_t paren = out.find(" (");
  if (paren != std::string::npos) out.resize(paren);
  return out;
}

auto order_key(const Estimate& e) {
  const Layout& l = e.layout;
  return std::make_tuple(e.time.step, e.memory.total(), l.pp, l.tp, l.dp, l.micro_batch, l.interleave, l.zero,
                         static_cast<int>(l.recompute), l.sequence_parallel, l.offload);
}

std::string seconds(double s) {
  char buf[32];
  if (s >= 1)
    std::snprintf(buf, sizeof(buf), "%.2f s", s);
  else
    std::snprintf(buf, sizeof(buf), "%.1f ms", s * 1e3);
  return buf;
}

// A layout whose device memory is too small may still run with its optimizer state on the host: the offloaded
// estimate when that layout is valid and fits, else `e` unchanged.
Estimate with_offload_if_it_fits(const Job& job, const Cluster& cluster, Estimate e, SearchResult& r) {
  Layout off = e.layout;
  off.offload = true;
  const DeviceProfile& d = cluster.device;
  if (d.host_link_bandwidth <= 0 || d.host_memory_bandwidth <= 0) return e;  // the profile has no host path
  if (!check_layout(job, cluster, off).empty()) return e;
  Estimate o = estimate(job, cluster, off);
  ++r.evaluated;
  return o.fits ? o : e;
}

}  // namespace

std::string why_slower(const Estimate& c, const Estimate& b) {
  struct Part {
    const char* name;
    double cand, best;
  };
  const Part parts[] = {{"compute", c.time.compute, b.time.compute},
                        {"tensor-parallel communication", c.time.tp_comm, b.time.tp_comm},
                        {"pipeline send/recv", c.time.pp_comm, b.time.pp_comm},
                        {"pipeline bubble", c.time.bubble, b.time.bubble},
                        {"exposed data-parallel communication", c.time.dp_exposed, b.time.dp_exposed},
                        {"optimizer step", c.time.optimizer, b.time.optimizer}};
  const Part* worst = &parts[0];
  for (const auto& p : parts)
    if (p.cand - p.best > worst->cand - worst->best) worst = &p;
  char buf[200];
  std::snprintf(buf, sizeof(buf), "%s %s vs %s (step +%.1f%%)", worst->name, seconds(worst->cand).c_str(),
                seconds(worst->best).c_str(), 100.0 * (c.time.step / b.time.step - 1));
  return buf;
}

SearchResult search(const Job& job, const Cluster& cluster, const SearchOptions& o) {
  validate(job.model);
  if (job.global_batch <= 0) throw ConfigError("global batch must be positive");
  if (cluster.gpus <= 0) throw ConfigError("the cluster needs at least one GPU");
  if (o.top < 1) throw ConfigError("top must be at least 1");
  SearchResult r;
  std::vector<Estimate> fitting;
  const int gpn = cluster.topology.gpus_per_node;
  const std::vector<Recompute> recomputes =
      o.recompute ? std::vector<Recompute>{*o.recompute}
                  : std::vector<Recompute>{Recompute::kNone, Recompute::kSelective, Recompute::kFull};
  for (int tp : divisors(gpn, gpn)) {
    if (o.tp && tp != *o.tp) continue;
    for (int pp : divisors(cluster.gpus / tp, job.model.layers)) {
      if (o.pp && pp != *o.pp) continue;
      if (cluster.gpus % (static_cast<long long>(tp) * pp) != 0) continue;
      const int dp = static_cast<int>(cluster.gpus / (static_cast<long long>(tp) * pp));
      if (o.dp && dp != *o.dp) continue;
      if (job.global_batch % dp != 0) {
        ++r.invalid["global batch is not divisible by dp"];
        continue;
      }
      for (int mb : divisors(job.global_batch / dp, o.max_micro_batch)) {
        if (o.micro_batch && mb != *o.micro_batch) continue;
        if (const long long a = job.global_batch / (static_cast<long long>(dp) * mb);
            o.power_of_two_accumulation && dp > 1 && (a & (a - 1)) != 0) {
          ++r.invalid["deterministic mode needs a power-of-two accumulation per rank"];
          continue;
        }
        for (int v : o.interleaves) {
          if (o.interleave && v != *o.interleave) continue;
          std::optional<Estimate> best_of_shape;
          for (int zero = 0; zero <= 3; ++zero) {
            if (o.zero && zero != *o.zero) continue;
            for (Recompute rc : recomputes) {
              for (int sp = 0; sp <= 1; ++sp) {
                if (o.sequence_parallel && bool(sp) != *o.sequence_parallel) continue;
                Layout l{dp, tp, pp, mb, zero, rc, bool(sp), v};
                l.offload = o.offload.value_or(false);
                const std::string why = check_layout(job, cluster, l);
                if (!why.empty()) {
                  ++r.invalid[reason_kind(why)];
                  continue;
                }
                Estimate e = estimate(job, cluster, l);
                ++r.evaluated;
                if (!e.fits && !o.offload) e = with_offload_if_it_fits(job, cluster, std::move(e), r);
                if (!e.fits) {
                  ++r.rejected_memory;
                  if (!r.smallest_nonfitting || e.memory.total() < r.smallest_nonfitting->memory.total())
                    r.smallest_nonfitting = e;
                  continue;
                }
                if (!o.distinct_shapes) {
                  fitting.push_back(std::move(e));
                } else if (!best_of_shape || order_key(e) < order_key(*best_of_shape)) {
                  best_of_shape = std::move(e);
                }
              }
            }
          }
          if (best_of_shape) fitting.push_back(std::move(*best_of_shape));
        }
      }
    }
  }
  std::sort(fitting.begin(), fitting.end(),
            [](const Estimate& a, const Estimate& b) { return order_key(a) < order_key(b); });
  for (size_t i = 0; i < fitting.size() && static_cast<int>(i) < o.top; ++i) {
    r.plans.push_back({fitting[i], i == 0 ? "" : why_slower(fitting[i], fitting[0])});
  }
  return r;
}

}  // namespace railyard::plan
