// Client: connection pool, rate limit, retries, verbs and streaming watches over cpp-httplib (OpenSSL).
#include "common/kube/client.h"

#include <httplib.h>

#include <condition_variable>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <thread>

#include "common/log.h"
#include "common/tls/ca_file.h"
#include "common/tls/pki.h"

namespace railyard::kube {

namespace {

struct ServerUrl {
  std::string host;
  int port = 443;
  std::string prefix;  // path prefix, e.g. behind a proxy; usually empty
};

ServerUrl parse_server(const Config& cfg) {
  const std::string& s = cfg.server;
  const std::string where = cfg.source.empty() ? "kube config" : cfg.source;
  if (s.rfind("https://", 0) != 0) {
    throw ConfigError(where + ": server '" + s + "' is not an https:// URL (TLS is required)");
  }
  std::string rest = s.substr(8);
  ServerUrl u;
  size_t slash = rest.find('/');
  if (slash != std::string::npos) {
    u.prefix = rest.substr(slash);
    while (!u.prefix.empty() && u.prefix.back() == '/') u.prefix.pop_back();
    rest = rest.substr(0, slash);
  }
  if (!rest.empty() && rest[0] == '[') {
    size_t end = rest.find(']');
    if (end == std::string::npos) throw ConfigError(where + ": server '" + s + "': unterminated IPv6 address");
    u.host = rest.substr(1, end - 1);
    rest = rest.substr(end + 1);
    if (!rest.empty() && rest[0] == ':') u.port = std::atoi(rest.c_str() + 1);
  } else {
    size_t colon = rest.find(':');
    u.host = rest.substr(0, colon);
    if (colon != std::string::npos) u.port = std::atoi(rest.c_str() + colon + 1);
  }
  if (u.host.empty() || u.port <= 0 || u.port > 65535) {
    throw ConfigError(where + ": server '" + s + "': cannot parse host and port");
  }
  return u;
}

bool is_connect_error(httplib::Error e) {
  return e == httplib::Error::Connection || e == httplib::Error::ConnectionTimeout ||
         e == httplib::Error::SSLConnection;
}

std::string describe(httplib::Error e) {
  switch (e) {
    case httplib::Error::Connection:
      return "connection failed (refused or unreachable)";
    case httplib::Error::ConnectionTimeout:
      return "connection timed out";
    case httplib::Error::Read:
      return "read failed or timed out (connection lost)";
    case httplib::Error::Write:
      return "write failed (connection lost)";
    case httplib::Error::SSLConnection:
      return "TLS handshake failed";
    case httplib::Error::SSLServerVerification:
      return "TLS verification failed: the server's certificate is not signed by the configured "
             "certificate-authority (or does not name this host); fix certificate-authority(-data) in the kubeconfig";
    case httplib::Error::SSLLoadingCerts:
      return "could not load the CA certificates";
    case httplib::Error::Canceled:
      return "canceled";
    default:
      return httplib::to_string(e);
  }
}

const char* content_type_of(PatchType t) {
  switch (t) {
    case PatchType::Merge:
      return "application/merge-patch+json";
    case PatchType::Json:
      return "application/json-patch+json";
    case PatchType::StrategicMerge:
      return "application/strategic-merge-patch+json";
    case PatchType::Apply:
      return "application/apply-patch+yaml";
  }
  return "application/merge-patch+json";
}

}  // namespace

struct Client::Impl {
  Config cfg;
  ServerUrl url;
  std::unique_ptr<tls::CaFile> ca;  // cpp-httplib then trusts exactly it, no system roots
  // Owned through unique_ptrs so that a constructor failing half-way frees what it had.
  tls::X509Ptr cert;
  tls::PkeyPtr key;
  TokenBucket bucket;
  std::shared_ptr<StopToken> stop_all = std::make_shared<StopToken>();

  std::mutex pool_mu;
  std::condition_variable pool_cv;
  std::vector<std::unique_ptr<httplib::SSLClient>> idle;
  int created = 0;

  std::mutex token_mu;
  std::string token;
  std::chrono::steady_clock::time_point token_read{};

  std::mutex rng_mu;
  std::mt19937_64 rng{std::random_device{}()};

  explicit Impl(Config c) : cfg(std::move(c)), url(parse_server(cfg)), bucket(cfg.qps, cfg.burst) {
    const std::string where = cfg.source.empty() ? "kube config" : cfg.source;
    if (cfg.ca_pem.empty()) {
      throw ConfigError(where + ": no certificate authority (ca_pem) for " + cfg.server +
                        "; TLS is always verified, set certificate-authority(-data)");
    }
    // Validated now so a bad bundle is a clear ConfigError instead of a TLS failure later.
    ca = std::make_unique<tls::CaFile>(cfg.ca_pem, where + ": certificate authority");
    if (!cfg.client_cert_pem.empty()) {
      cert = tls::read_cert(cfg.client_cert_pem, where + ": client certificate");
      key = tls::read_key(cfg.client_key_pem, where + ": client key");
    }
    token = cfg.token;
    token_read = std::chrono::steady_clock::now();
    // cpp-httplib's client does not guard against SIGPIPE; an interrupted TLS write would kill the process.
    std::signal(SIGPIPE, SIG_IGN);
  }

  ~Impl() { idle.clear(); }

  std::unique_ptr<httplib::SSLClient> make_conn(std::chrono::seconds read_timeout) {
    std::unique_ptr<httplib::SSLClient> c =
        cert ? std::make_unique<httplib::SSLClient>(url.host, url.port, cert.get(), key.get())
             : std::make_unique<httplib::SSLClient>(url.host, url.port);
    if (!c->is_valid()) throw ConfigError(cfg.source + ": client certificate and key do not match or are unusable");
    c->set_ca_cert_path(ca->path().c_str());
    c->enable_server_certificate_verification(true);
    c->set_connection_timeout(cfg.connect_timeout);
    c->set_read_timeout(read_timeout);
    c->set_write_timeout(cfg.request_timeout);
    c->set_keep_alive(true);
    return c;
  }

  std::unique_ptr<httplib::SSLClient> checkout() {
    std::unique_lock<std::mutex> lock(pool_mu);
    while (true) {
      if (!idle.empty()) {
        auto c = std::move(idle.back());
        idle.pop_back();
        return c;
      }
      if (created < std::max(1, cfg.max_connections)) {
        ++created;
        lock.unlock();
        try {
          return make_conn(cfg.request_timeout);
        } catch (...) {
          lock.lock();
          --created;
          throw;
        }
      }
      pool_cv.wait(lock);
    }
  }

  void checkin(std::unique_ptr<httplib::SSLClient> c) {
    {
      std::lock_guard<std::mutex> lock(pool_mu);
      idle.push_back(std::move(c));
    }
    pool_cv.notify_one();
  }

  std::string bearer() {
    std::lock_guard<std::mutex> lock(token_mu);
    if (!cfg.token_file.empty() && std::chrono::steady_clock::now() - token_read > std::chrono::seconds(60)) {
      try {
        std::string t = read_file(cfg.token_file, "token file");
        while (!t.empty() && std::isspace(static_cast<unsigned char>(t.back()))) t.pop_back();
        if (!t.empty()) token = t;
      } catch (const ConfigError& e) {
        log::warn("kube", "cannot re-read the token file, keeping the old token", {{"error", e.what()}});
      }
      token_read = std::chrono::steady_clock::now();
    }
    return token;
  }

  httplib::Headers headers(const std::string& content_type) {
    httplib::Headers h{{"Accept", "application/json"}, {"User-Agent", cfg.user_agent}};
    std::string t = bearer();
    if (!t.empty()) h.emplace("Authorization", "Bearer " + t);
    if (!content_type.empty()) h.emplace("Content-Type", content_type);
    return h;
  }

  double jitter() {
    std::lock_guard<std::mutex> lock(rng_mu);
    return std::uniform_real_distribution<double>(0.0, 1.0)(rng);
  }

  // Sleeps unless stop() is called meanwhile; returns false if stopped.
  bool sleep_for(std::chrono::milliseconds d) {
    auto until = std::chrono::steady_clock::now() + d;
    while (std::chrono::steady_clock::now() < until) {
      if (stop_all->stopped()) return false;
      std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(
          std::chrono::milliseconds(50), until - std::chrono::steady_clock::now()));
    }
    return !stop_all->stopped();
  }

  // One request with rate limiting and bounded retries. Returns the response body of a 2xx.
  std::string request(const std::string& method, const std::string& path, const std::string& body,
                      const std::string& content_type) {
    const std::string full_path = url.prefix + path;
    const std::string context = method + " " + path;
    const auto start = std::chrono::steady_clock::now();
    const RetryPolicy& rp = cfg.retry;
    std::string last_failure;
    for (int attempt = 0;; ++attempt) {
      bucket.acquire();
      auto conn = checkout();
      httplib::Request req;
      req.method = method;
      req.path = full_path;
      req.headers = headers(body.empty() ? "" : (content_type.empty() ? "application/json" : content_type));
      req.body = body;
      httplib::Response res;
      httplib::Error err = httplib::Error::Success;
      bool ok = conn->send(req, res, err);
      checkin(std::move(conn));

      std::chrono::milliseconds wait{0};
      bool retryable = false;
      if (!ok) {
        last_failure = describe(err);
        if (err == httplib::Error::SSLServerVerification || err == httplib::Error::SSLLoadingCerts) {
          throw TransportError(cfg.server + ": " + context + ": " + last_failure);
        }
        // A request that may have reached the server is only repeated when repeating is harmless: a failed
        // connect or write (e.g. a keep-alive connection the server closed while restarting) never delivered
        // it; after a failed read, only idempotent verbs are sent again.
        retryable = is_connect_error(err) || err == httplib::Error::Write || method == "GET" || method == "PUT" ||
                    method == "DELETE";
        wait = backoff_delay(rp, attempt, jitter());
      } else if (res.status == 429 || res.status >= 500) {
        retryable = true;
        last_failure = "HTTP " + std::to_string(res.status);
        wait = backoff_delay(rp, attempt, jitter());
        if (res.has_header("Retry-After")) {
          int secs = std::atoi(res.get_header_value("Retry-After").c_str());
          if (secs > 0) wait = std::chrono::seconds(std::min(secs, 30));
        }
      } else if (res.status >= 400) {
        throw_api_error(res.status, res.body, context);
      } else {
        return res.body;
      }

      auto elapsed = std::chrono::steady_clock::now() - start;
      bool out_of_budget = attempt + 1 >= rp.max_attempts || elapsed + wait > rp.max_total;
      if (!retryable || out_of_budget || stop_all->stopped()) {
        if (ok) throw_api_error(res.status, res.body, context);
        double secs = std::chrono::duration<double>(elapsed).count();
        char took[32];
        std::snprintf(took, sizeof(took), "%.1f", secs);
        throw TransportError("cannot reach the API server " + cfg.server + " (" + context + "): " + last_failure +
                             " after " + std::to_string(attempt + 1) + " attempt(s) in " + took + " s");
      }
      log::debug("kube", "retrying request",
                 {{"request", context}, {"cause", last_failure}, {"wait_ms", std::to_string(wait.count())}});
      if (!sleep_for(wait)) {
        throw TransportError(cfg.server + ": " + context + ": client stopped while retrying after " + last_failure);
      }
    }
  }

  Json request_json(const std::string& method, const std::string& path, const std::string& body,
                    const std::string& content_type) {
    std::string out = request(method, path, body, content_type);
    if (out.empty()) return Json();
    Json j = Json::parse(out, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) throw Error(method + " " + path + ": the API server's response is not JSON");
    return j;
  }
};

Client::Client(Config config) : impl_(std::make_unique<Impl>(std::move(config))) {}
Client::~Client() = default;

const Config& Client::config() const { return impl_->cfg; }

Json Client::get(const Resource& res, const std::string& ns, const std::string& name) {
  return impl_->request_json("GET", resource_path(res, ns, name), "", "");
}

std::optional<Json> Client::try_get(const Resource& res, const std::string& ns, const std::string& name) {
  try {
    return get(res, ns, name);
  } catch (const NotFound&) {
    return std::nullopt;
  }
}

Json Client::list(const Resource& res, const std::string& ns, const ListOptions& opts) {
  return impl_->request_json("GET", resource_path(res, ns) + opts.query(), "", "");
}

std::vector<Json> Client::list_all(const Resource& res, const std::string& ns, const ListOptions& opts,
                                   std::string* list_rv) {
  std::vector<Json> items;
  ListOptions page = opts;
  if (page.limit <= 0) page.limit = 500;
  while (true) {
    Json l = list(res, ns, page);
    if (l.contains("items") && l["items"].is_array()) {
      for (auto& it : l["items"]) items.push_back(std::move(it));
    }
    const Json& meta = l.contains("metadata") ? l["metadata"] : Json::object();
    std::string cont = meta.is_object() ? meta.value("continue", "") : "";
    if (cont.empty()) {
      if (list_rv) *list_rv = meta.is_object() ? meta.value("resourceVersion", "") : "";
      return items;
    }
    page.continue_token = cont;
    page.resource_version.clear();  // the server refuses resourceVersion together with continue
  }
}

Json Client::create(const Resource& res, const std::string& ns, const Json& obj) {
  return impl_->request_json("POST", resource_path(res, ns), obj.dump(), "");
}

void Client::create_only(const Resource& res, const std::string& ns, const Json& obj) {
  impl_->request("POST", resource_path(res, ns), obj.dump(), "");
}

Json Client::update(const Resource& res, const std::string& ns, const Json& obj) {
  std::string name = name_of(obj);
  if (name.empty()) throw Error("update " + res.plural + ": the object has no metadata.name");
  return impl_->request_json("PUT", resource_path(res, ns, name), obj.dump(), "");
}

Json Client::update_status(const Resource& res, const std::string& ns, const Json& obj) {
  std::string name = name_of(obj);
  if (name.empty()) throw Error("update_status " + res.plural + ": the object has no metadata.name");
  return impl_->request_json("PUT", resource_path(res, ns, name, "status"), obj.dump(), "");
}

Json Client::patch(const Resource& res, const std::string& ns, const std::string& name, const Json& patch,
                   PatchType type, const std::string& subresource) {
  std::string path = resource_path(res, ns, name, subresource);
  if (type == PatchType::Apply) path += "?fieldManager=railyard&force=true";
  return impl_->request_json("PATCH", path, patch.dump(), content_type_of(type));
}

void Client::remove(const Resource& res, const std::string& ns, const std::string& name, const DeleteOptions& opts) {
  Json body = {{"apiVersion", "v1"}, {"kind", "DeleteOptions"}};
  if (opts.grace_period_seconds) body["gracePeriodSeconds"] = *opts.grace_period_seconds;
  if (!opts.propagation_policy.empty()) body["propagationPolicy"] = opts.propagation_policy;
  if (!opts.precondition_uid.empty()) body["preconditions"]["uid"] = opts.precondition_uid;
  if (!opts.precondition_resource_version.empty()) {
    body["preconditions"]["resourceVersion"] = opts.precondition_resource_version;
  }
  impl_->request("DELETE", resource_path(res, ns, name), body.dump(), "");
}

Json Client::create_subresource(const Resource& res, const std::string& ns, const std::string& name,
                                const std::string& subresource, const Json& body) {
  return impl_->request_json("POST", resource_path(res, ns, name, subresource), body.dump(), "");
}

Json Client::raw(const std::string& method, const std::string& path, const std::string& body,
                 const std::string& content_type) {
  return impl_->request_json(method, path, body, content_type);
}

void Client::stop() { impl_->stop_all->stop(); }

WatchEnd Client::watch(const Resource& res, const std::string& ns, const WatchOptions& opts,
                       const std::function<bool(WatchEvent&)>& on_event) {
  std::string path = resource_path(res, ns) + "?watch=1";
  if (!opts.resource_version.empty()) path += "&resourceVersion=" + url_encode(opts.resource_version);
  if (!opts.label_selector.empty()) path += "&labelSelector=" + url_encode(opts.label_selector);
  if (!opts.field_selector.empty()) path += "&fieldSelector=" + url_encode(opts.field_selector);
  if (opts.allow_bookmarks) path += "&allowWatchBookmarks=true";
  if (opts.timeout_seconds > 0) path += "&timeoutSeconds=" + std::to_string(opts.timeout_seconds);
  const std::string context = "WATCH " + resource_path(res, ns);

  impl_->bucket.acquire();
  // Its own connection: a watch can last minutes. Reads may wait up to the server-side timeout plus slack
  // (the server ends the stream itself at timeoutSeconds).
  auto read_timeout = std::chrono::seconds(opts.timeout_seconds > 0 ? opts.timeout_seconds + 30 : 600);
  std::shared_ptr<httplib::SSLClient> conn = impl_->make_conn(read_timeout);
  // Shared with the canceller, which StopToken::stop may still run after this function has returned.
  auto cancelled = std::make_shared<std::atomic<bool>>(false);
  auto canceller = [conn, cancelled] {
    cancelled->store(true);
    conn->stop();
  };
  int id_all = impl_->stop_all->add_canceller(canceller);
  int id_own = opts.stop ? opts.stop->add_canceller(canceller) : 0;
  struct Unregister {
    std::shared_ptr<StopToken> a, b;
    int ia, ib;
    ~Unregister() {
      a->remove_canceller(ia);
      if (b) b->remove_canceller(ib);
    }
  } unregister{impl_->stop_all, opts.stop, id_all, id_own};
  auto is_stopped = [&] {
    return cancelled->load() || impl_->stop_all->stopped() || (opts.stop && opts.stop->stopped());
  };
  if (is_stopped()) return WatchEnd::Stopped;

  int status = 0;
  std::string error_body;
  LineFramer framer;
  std::exception_ptr failure;
  bool handler_stopped = false;

  httplib::Request req;
  req.method = "GET";
  req.path = impl_->url.prefix + path;
  req.headers = impl_->headers("");
  req.response_handler = [&](const httplib::Response& r) {
    status = r.status;
    return !is_stopped();
  };
  req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
    if (is_stopped()) return false;
    if (status != 200) {
      if (error_body.size() < 65536) error_body.append(data, len);
      return true;
    }
    return framer.feed(std::string_view(data, len), [&](std::string_view line) {
      try {
        auto ev = parse_watch_line(line, context, opts.drop_managed_fields);
        if (ev && !on_event(*ev)) {
          handler_stopped = true;
          return false;
        }
        return !is_stopped();
      } catch (...) {
        failure = std::current_exception();
        return false;
      }
    });
  };
  httplib::Response resp;
  httplib::Error err = httplib::Error::Success;
  bool ok = conn->send(req, resp, err);
  if (failure) std::rethrow_exception(failure);
  if (handler_stopped) return WatchEnd::HandlerStopped;
  if (is_stopped()) return WatchEnd::Stopped;
  if (!ok) {
    if (status != 0 && status != 200) throw_api_error(status, error_body, context);
    throw TransportError(impl_->cfg.server + ": " + context + ": " + describe(err));
  }
  if (resp.status != 200) throw_api_error(resp.status, error_body.empty() ? resp.body : error_body, context);
  return WatchEnd::ServerClosed;
}

}  // namespace railyard::kube
