// Prometheus metrics: registry, labelled families, counter/gauge/histogram, text exposition 0.0.4.
// Same shape as prometheus-cpp (which Debian does not package): a Registry owns Families, a Family owns one
// metric per label set, and references handed out stay valid for the registry's lifetime, so hot paths keep a
// Counter& and update it with one atomic operation.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/metrics/names.h"

namespace httplib {
class Server;
}

namespace railyard::metrics {

using Labels = std::map<std::string, std::string>;

class Counter {
 public:
  void increment(double by = 1.0);  // by < 0 throws: counters only go up
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

class Gauge {
 public:
  void set(double v) { value_.store(v, std::memory_order_relaxed); }
  void increment(double by = 1.0) { value_.fetch_add(by, std::memory_order_relaxed); }
  void decrement(double by = 1.0) { value_.fetch_sub(by, std::memory_order_relaxed); }
  void set_to_current_time();  // seconds since the Unix epoch
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

class Histogram {
 public:
  // Upper bounds, strictly increasing and finite; +Inf is implicit.
  explicit Histogram(std::vector<double> bounds);
  void observe(double v);
  // `times` observations of the same value (a source that learns of several equal observations at once).
  void observe(double v, uint64_t times);

  struct Snapshot {
    std::vector<double> bounds;
    std::vector<uint64_t> cumulative;  // one per bound, then +Inf (== count)
    double sum = 0;
    uint64_t count = 0;
  };
  Snapshot snapshot() const;

 private:
  std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;  // per bucket (not cumulative), last is +Inf
  std::atomic<double> sum_{0.0};
};

// Bucket helpers.
std::vector<double> exponential_buckets(double start, double factor, int count);
std::vector<double> linear_buckets(double start, double width, int count);

template <typename T>
class Family {
 public:
  Family(std::string name, std::string help, Labels const_labels, std::vector<double> bounds = {})
      : name_(std::move(name)),
        help_(std::move(help)),
        const_labels_(std::move(const_labels)),
        bounds_(std::move(bounds)) {}
  // Returns the metric for these labels, creating it on first use. Label names are validated.
  T& add(const Labels& labels);
  void remove(const Labels& labels);
  // Removes every child whose labels include all of `subset` (e.g. a deleted job's series, whatever their reason).
  void remove_matching(const Labels& subset);
  const std::string& name() const { return name_; }
  const std::string& help() const { return help_; }

  // For the serializer: the children with their full label sets. Shared, so that a child removed while a scrape
  // renders it stays alive until the scrape is done.
  std::vector<std::pair<Labels, std::shared_ptr<const T>>> children() const;

 private:
  std::string name_, help_;
  Labels const_labels_;
  std::vector<double> bounds_;
  mutable std::mutex mu_;
  std::map<Labels, std::shared_ptr<T>> children_;
};

class Registry {
 public:
  // Names follow railyard_<area>_<what>_<unit>; counters must end in _total. Registering an existing name with the
  // same type returns the existing family; with another type it throws std::invalid_argument.
  Family<Counter>& counter(const std::string& name, const std::string& help, const Labels& const_labels = {});
  Family<Gauge>& gauge(const std::string& name, const std::string& help, const Labels& const_labels = {});
  Family<Histogram>& histogram(const std::string& name, const std::string& help, std::vector<double> bounds,
                               const Labels& const_labels = {});
  // The same with a name from names.h, whose type decides which of the three can take it.
  Family<Counter>& counter(CounterName name, const std::string& help, const Labels& const_labels = {}) {
    return counter(std::string(name.name), help, const_labels);
  }
  Family<Gauge>& gauge(GaugeName name, const std::string& help, const Labels& const_labels = {}) {
    return gauge(std::string(name.name), help, const_labels);
  }
  Family<Histogram>& histogram(HistogramName name, const std::string& help, std::vector<double> bounds,
                               const Labels& const_labels = {}) {
    return histogram(std::string(name.name), help, std::move(bounds), const_labels);
  }

  // Text exposition format 0.0.4, families in registration order, ending with a newline.
  std::string serialize() const;

 private:
  struct Entry {
    Type type;
    std::unique_ptr<Family<Counter>> counter;
    std::unique_ptr<Family<Gauge>> gauge;
    std::unique_ptr<Family<Histogram>> histogram;
  };
  Entry* find_or_null(const std::string& name, Type type);
  mutable std::mutex mu_;
  std::vector<std::string> order_;
  std::map<std::string, Entry> families_;
};

// The text format's escaping and number rendering, exposed for tests.
std::string escape_help(const std::string& s);
std::string escape_label_value(const std::string& s);
std::string format_value(double v);
void validate_metric_name(const std::string& name);  // throws std::invalid_argument naming the rule
void validate_label_name(const std::string& name);

// What may read an Exposer: called with the request's Authorization header and path before anything is served;
// returns 200 to serve it, else the status to answer with and a body saying why.
using Authorize = std::function<std::pair<int, std::string>(const std::string& authorization, const std::string& path)>;

// Serves GET /metrics (and /healthz) from a registry on host:port in a background thread; port 0 picks a free
// port. Stops in the destructor.
class Exposer {
 public:
  Exposer(const Registry& registry, const std::string& host, int port);
  // Over `server` (an httplib::SSLServer for HTTPS; null: plain HTTP), every request first through `authorize`
  // (null: everyone).
  Exposer(const Registry& registry, const std::string& host, int port, std::unique_ptr<httplib::Server> server,
          Authorize authorize);
  ~Exposer();
  Exposer(const Exposer&) = delete;
  Exposer& operator=(const Exposer&) = delete;
  int port() const { return port_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
};

}  // namespace railyard::metrics
