#include "common/metrics/metrics.h"

#include <httplib.h>

#include <charconv>
#include <chrono>
#include <cmath>
#include <stdexcept>
#include <thread>
#include <type_traits>

#include "common/http_server_bounds.h"

namespace railyard::metrics {

void Counter::increment(double by) {
  if (by < 0) throw std::invalid_argument("counter increment must not be negative");
  value_.fetch_add(by, std::memory_order_relaxed);
}

void Gauge::set_to_current_time() {
  using namespace std::chrono;
  set(duration<double>(system_clock::now().time_since_epoch()).count());
}

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)) {
  for (size_t i = 0; i < bounds_.size(); ++i) {
    if (!std::isfinite(bounds_[i]))
      throw std::invalid_argument("histogram bucket bounds must be finite (+Inf is implicit)");
    if (i > 0 && !(bounds_[i] > bounds_[i - 1]))
      throw std::invalid_argument("histogram bucket bounds must be strictly increasing");
  }
  buckets_ = std::make_unique<std::atomic<uint64_t>[]>(bounds_.size() + 1);
  for (size_t i = 0; i <= bounds_.size(); ++i) buckets_[i].store(0);
}

void Histogram::observe(double v) { observe(v, 1); }

void Histogram::observe(double v, uint64_t times) {
  if (times == 0) return;
  // Bucket i counts le=bounds[i] observations (v <= bound); the last bucket is +Inf.
  size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin();
  buckets_[i].fetch_add(times, std::memory_order_relaxed);
  sum_.fetch_add(v * static_cast<double>(times), std::memory_order_relaxed);
}

Histogram::Snapshot Histogram::snapshot() const {
  Snapshot s;
  s.bounds = bounds_;
  s.cumulative.resize(bounds_.size() + 1);
  uint64_t acc = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    acc += buckets_[i].load(std::memory_order_relaxed);
    s.cumulative[i] = acc;
  }
  // _count is derived from the buckets so that +Inf == _count holds even while other threads observe.
  s.count = acc;
  s.sum = sum_.load(std::memory_order_relaxed);
  return s;
}

std::vector<double> exponential_buckets(double start, double factor, int count) {
  if (start <= 0 || factor <= 1 || count < 1)
    throw std::invalid_argument("exponential_buckets needs start > 0, factor > 1, count >= 1");
  std::vector<double> b;
  for (int i = 0; i < count; ++i, start *= factor) b.push_back(start);
  return b;
}

std::vector<double> linear_buckets(double start, double width, int count) {
  if (width <= 0 || count < 1) throw std::invalid_argument("linear_buckets needs width > 0, count >= 1");
  std::vector<double> b;
  for (int i = 0; i < count; ++i) b.push_back(start + width * i);
  return b;
}

namespace {

bool name_char(char c, bool first, bool allow_colon) {
  bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (allow_colon && c == ':');
  return first ? alpha : (alpha || (c >= '0' && c <= '9'));
}

void render_labels(std::string& out, const Labels& labels, const char* extra_name = nullptr,
                   const std::string& extra_value = {}) {
  if (labels.empty() && extra_name == nullptr) return;
  out += '{';
  bool first = true;
  for (const auto& [k, v] : labels) {
    if (!first) out += ',';
    first = false;
    out += k;
    out += "=\"";
    out += escape_label_value(v);
    out += '"';
  }
  if (extra_name != nullptr) {
    if (!first) out += ',';
    out += extra_name;
    out += "=\"";
    out += extra_value;
    out += '"';
  }
  out += '}';
}

void header(std::string& out, const std::string& name, const std::string& help, const char* type) {
  out += "# HELP " + name + ' ' + escape_help(help) + '\n';
  out += "# TYPE " + name + ' ' + type + '\n';
}

}  // namespace

void validate_metric_name(const std::string& name) {
  bool ok = !name.empty();
  for (size_t i = 0; ok && i < name.size(); ++i) ok = name_char(name[i], i == 0, true);
  if (!ok) throw std::invalid_argument("metric name '" + name + "' must match [a-zA-Z_:][a-zA-Z0-9_:]*");
}

void validate_label_name(const std::string& name) {
  bool ok = !name.empty();
  for (size_t i = 0; ok && i < name.size(); ++i) ok = name_char(name[i], i == 0, false);
  if (!ok) throw std::invalid_argument("label name '" + name + "' must match [a-zA-Z_][a-zA-Z0-9_]*");
  if (name.rfind("__", 0) == 0) throw std::invalid_argument("label name '" + name + "' must not start with __");
  if (name == "le" || name == "quantile")
    throw std::invalid_argument("label name '" + name + "' is reserved for histograms and summaries");
}

std::string escape_help(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

std::string escape_label_value(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

std::string format_value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);  // shortest round-trip form
  return std::string(buf, end);
}

template <typename T>
T& Family<T>::add(const Labels& labels) {
  std::lock_guard lock(mu_);
  auto it = children_.find(labels);
  if (it != children_.end()) return *it->second;
  for (const auto& [k, v] : labels) {
    validate_label_name(k);
    if (const_labels_.count(k)) throw std::invalid_argument("label '" + k + "' of " + name_ + " is already constant");
  }
  std::unique_ptr<T> m;
  if constexpr (std::is_same_v<T, Histogram>) {
    m = std::make_unique<T>(bounds_);
  } else {
    m = std::make_unique<T>();
  }
  T& ref = *m;
  children_.emplace(labels, std::move(m));
  return ref;
}

template <typename T>
void Family<T>::remove(const Labels& labels) {
  std::lock_guard lock(mu_);
  children_.erase(labels);
}

template <typename T>
void Family<T>::remove_matching(const Labels& subset) {
  std::lock_guard lock(mu_);
  std::erase_if(children_, [&](const auto& child) {
    for (const auto& [k, v] : subset)
      if (auto it = child.first.find(k); it == child.first.end() || it->second != v) return false;
    return true;
  });
}

template <typename T>
std::vector<std::pair<Labels, std::shared_ptr<const T>>> Family<T>::children() const {
  std::lock_guard lock(mu_);
  std::vector<std::pair<Labels, std::shared_ptr<const T>>> out;
  for (const auto& [labels, m] : children_) {
    Labels all = const_labels_;
    all.insert(labels.begin(), labels.end());
    out.emplace_back(std::move(all), m);
  }
  return out;
}

template class Family<Counter>;
template class Family<Gauge>;
template class Family<Histogram>;

Registry::Entry* Registry::find_or_null(const std::string& name, Type type) {
  auto it = families_.find(name);
  if (it == families_.end()) return nullptr;
  if (it->second.type != type)
    throw std::invalid_argument("metric " + name + " is already registered with another type");
  return &it->second;
}

Family<Counter>& Registry::counter(const std::string& name, const std::string& help, const Labels& const_labels) {
  validate_metric_name(name);
  if (name.size() < 6 || name.compare(name.size() - 6, 6, "_total") != 0)
    throw std::invalid_argument("counter " + name + " must end in _total");
  std::lock_guard lock(mu_);
  if (auto* e = find_or_null(name, Type::Counter)) return *e->counter;
  for (const auto& [k, v] : const_labels) validate_label_name(k);
  Entry e{Type::Counter, std::make_unique<Family<Counter>>(name, help, const_labels), nullptr, nullptr};
  auto& ref = *e.counter;
  families_.emplace(name, std::move(e));
  order_.push_back(name);
  return ref;
}

Family<Gauge>& Registry::gauge(const std::string& name, const std::string& help, const Labels& const_labels) {
  validate_metric_name(name);
  std::lock_guard lock(mu_);
  if (auto* e = find_or_null(name, Type::Gauge)) return *e->gauge;
  for (const auto& [k, v] : const_labels) validate_label_name(k);
  Entry e{Type::Gauge, nullptr, std::make_unique<Family<Gauge>>(name, help, const_labels), nullptr};
  auto& ref = *e.gauge;
  families_.emplace(name, std::move(e));
  order_.push_back(name);
  return ref;
}

Family<Histogram>& Registry::histogram(const std::string& name, const std::string& help, std::vector<double> bounds,
                                       const Labels& const_labels) {
  validate_metric_name(name);
  Histogram probe(bounds);  // validates the bounds before anything is registered
  std::lock_guard lock(mu_);
  if (auto* e = find_or_null(name, Type::Histogram)) return *e->histogram;
  for (const auto& [k, v] : const_labels) validate_label_name(k);
  Entry e{Type::Histogram, nullptr, nullptr,
          std::make_unique<Family<Histogram>>(name, help, const_labels, std::move(bounds))};
  auto& ref = *e.histogram;
  families_.emplace(name, std::move(e));
  order_.push_back(name);
  return ref;
}

std::string Registry::serialize() const {
  std::lock_guard lock(mu_);
  std::string out;
  for (const auto& name : order_) {
    const Entry& e = families_.at(name);
    switch (e.type) {
      case Type::Counter:
        header(out, name, e.counter->help(), "counter");
        for (const auto& [labels, c] : e.counter->children()) {
          out += name;
          render_labels(out, labels);
          out += ' ' + format_value(c->value()) + '\n';
        }
        break;
      case Type::Gauge:
        header(out, name, e.gauge->help(), "gauge");
        for (const auto& [labels, g] : e.gauge->children()) {
          out += name;
          render_labels(out, labels);
          out += ' ' + format_value(g->value()) + '\n';
        }
        break;
      case Type::Histogram:
        header(out, name, e.histogram->help(), "histogram");
        for (const auto& [labels, h] : e.histogram->children()) {
          auto s = h->snapshot();
          for (size_t i = 0; i <= s.bounds.size(); ++i) {
            out += name + "_bucket";
            render_labels(out, labels, "le", i < s.bounds.size() ? format_value(s.bounds[i]) : "+Inf");
            out += ' ' + std::to_string(s.cumulative[i]) + '\n';
          }
          out += name + "_sum";
          render_labels(out, labels);
          out += ' ' + format_value(s.sum) + '\n';
          out += name + "_count";
          render_labels(out, labels);
          out += ' ' + std::to_string(s.count) + '\n';
        }
        break;
    }
  }
  return out;
}

struct Exposer::Impl {
  std::unique_ptr<httplib::Server> server;
  std::thread thread;
};

Exposer::Exposer(const Registry& registry, const std::string& host, int port)
    : Exposer(registry, host, port, nullptr, nullptr) {}

Exposer::Exposer(const Registry& registry, const std::string& host, int port, std::unique_ptr<httplib::Server> server,
                 Authorize authorize)
    : impl_(std::make_unique<Impl>()) {
  impl_->server = server ? std::move(server) : std::make_unique<httplib::Server>();
  httplib::Server& srv = *impl_->server;
  railyard::http::apply(srv, railyard::http::kSmallRequests);  // a scrape is a GET: no body, a few threads
  if (authorize)
    srv.set_pre_routing_handler(
        [authorize = std::move(authorize)](const httplib::Request& req, httplib::Response& res) {
          auto [status, why] = authorize(req.get_header_value("Authorization"), req.path);
          if (status == 200) return httplib::Server::HandlerResponse::Unhandled;
          res.status = status;
          if (status == 401) res.set_header("WWW-Authenticate", "Bearer");
          res.set_content(why + "\n", "text/plain");
          return httplib::Server::HandlerResponse::Handled;
        });
  srv.Get("/metrics", [&registry](const httplib::Request&, httplib::Response& res) {
    res.set_content(registry.serialize(), "text/plain; version=0.0.4; charset=utf-8");
  });
  srv.Get("/healthz", [](const httplib::Request&, httplib::Response& res) { res.set_content("ok\n", "text/plain"); });
  if (port == 0) {
    port_ = srv.bind_to_any_port(host);
  } else {
    port_ = srv.bind_to_port(host, port) ? port : -1;
  }
  if (port_ <= 0) throw std::runtime_error("metrics: cannot listen on " + host + ":" + std::to_string(port));
  impl_->thread = std::thread([this] { impl_->server->listen_after_bind(); });
}

Exposer::~Exposer() {
  impl_->server->stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

}  // namespace railyard::metrics
