// The Kubernetes API client: kubeconfig loading, typed errors, REST verbs, streaming watches.
// See common/kube/README.md for how the pieces (Client, Informer, WorkQueue, LeaderElector, EventRecorder) fit.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/error.h"

namespace railyard::kube {

using Json = nlohmann::json;

// ---------------------------------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------------------------------

// The API server answered with an error status. what() carries the server's message (Status.message) prefixed by
// the verb and path, so a log line alone tells what failed.
class ApiError : public railyard::Error {
 public:
  ApiError(int code, std::string reason, const std::string& message)
      : railyard::Error(message), code_(code), reason_(std::move(reason)) {}
  int code() const { return code_; }
  const std::string& reason() const { return reason_; }

 private:
  int code_;
  std::string reason_;
};

#define RAILYARD_KUBE_API_ERROR(Name) \
  class Name : public ApiError {      \
   public:                            \
    using ApiError::ApiError;         \
  }
RAILYARD_KUBE_API_ERROR(NotFound);         // 404
RAILYARD_KUBE_API_ERROR(Conflict);         // 409 (stale resourceVersion and other conflicts)
RAILYARD_KUBE_API_ERROR(Gone);             // 410 (resourceVersion too old: relist)
RAILYARD_KUBE_API_ERROR(Unauthorized);     // 401 (bad or expired credentials)
RAILYARD_KUBE_API_ERROR(Forbidden);        // 403 (RBAC)
RAILYARD_KUBE_API_ERROR(Invalid);          // 422 (the object failed validation)
RAILYARD_KUBE_API_ERROR(TooManyRequests);  // 429
RAILYARD_KUBE_API_ERROR(ServerError);      // 5xx
RAILYARD_KUBE_API_ERROR(BadRequest);       // 400 and other 4xx not listed above
#undef RAILYARD_KUBE_API_ERROR

// 409 with reason AlreadyExists: a Conflict too, so `catch (Conflict&)` sees both.
class AlreadyExists : public Conflict {
 public:
  using Conflict::Conflict;
};

// The server could not be reached or spoken to: refused connection, TLS failure, timeout. The message names the
// server URL and the cause.
class TransportError : public railyard::Error {
 public:
  using railyard::Error::Error;
};

// Raises the ApiError subclass matching an HTTP status and a (possibly non-JSON) Status body. `context` is put in
// front of the server's message ("GET /api/v1/namespaces/x/pods/y").
[[noreturn]] void throw_api_error(int http_status, const std::string& body, const std::string& context);

// ---------------------------------------------------------------------------------------------------------------
// Configuration
// ---------------------------------------------------------------------------------------------------------------

struct RetryPolicy {
  int max_attempts = 5;                            // total tries, first one included
  std::chrono::milliseconds initial_backoff{200};  // doubled each retry, with +-50% jitter
  std::chrono::milliseconds max_backoff{5000};     // per wait
  std::chrono::milliseconds max_total{30000};      // no retry starts after this much time
};

struct Config {
  std::string server{};  // https://host:port (TLS only; an http:// server is refused)
  std::string ca_pem{};  // trusted CA bundle, PEM; required (TLS is always verified)
  std::string client_cert_pem{}, client_key_pem{};
  std::string token{};
  std::string token_file{};  // re-read about once a minute, so rotated service-account tokens keep working
  std::string default_namespace = "default";
  std::string source{};  // where this came from ("kubeconfig /path context x"), for messages
  double qps = 50;
  int burst = 100;
  RetryPolicy retry{};
  std::chrono::seconds connect_timeout{5};
  std::chrono::seconds request_timeout{30};  // per read of a non-watch request
  int max_connections = 8;                   // pooled connections for non-watch requests
  std::string user_agent = "railyard/0.1";
};

// Loads a kubeconfig (YAML). `context` empty means current-context. Relative file paths are relative to the
// kubeconfig's directory. Throws ConfigError naming the file and the field.
Config load_kubeconfig(const std::string& path, const std::string& context = "");
// Same, from text already in memory; `path` is used for messages and relative paths.
Config parse_kubeconfig(const std::string& yaml_text, const std::string& path, const std::string& context = "");
// KUBERNETES_SERVICE_HOST/PORT and /var/run/secrets/kubernetes.io/serviceaccount/{token,ca.crt,namespace}.
Config in_cluster_config();
// $KUBECONFIG, then ~/.kube/config, then in-cluster; the error lists what was tried.
Config default_config();

// ---------------------------------------------------------------------------------------------------------------
// Resources and paths
// ---------------------------------------------------------------------------------------------------------------

struct Resource {
  std::string group{};  // "" for the core group
  std::string version{};
  std::string plural{};
  std::string kind{};
  bool namespaced = true;

  std::string api_version() const { return group.empty() ? version : group + "/" + version; }
};

namespace resources {
extern const Resource pods, nodes, namespaces, events, leases, secrets, configmaps, services, endpoints,
    serviceaccounts, customresourcedefinitions, networkpolicies, priorityclasses, persistentvolumeclaims,
    storageclasses, trainingjobs;
}

// "/api/v1/namespaces/ns/pods/name/status" or "/apis/g/v/plural". `ns` is ignored for cluster-scoped resources;
// an empty ns for a namespaced resource means all namespaces (valid for list/watch only).
std::string resource_path(const Resource& res, const std::string& ns, const std::string& name = "",
                          const std::string& subresource = "");
std::string url_encode(const std::string& s);

// ---------------------------------------------------------------------------------------------------------------
// Options
// ---------------------------------------------------------------------------------------------------------------

struct ListOptions {
  std::string label_selector{};
  std::string field_selector{};
  int64_t limit = 0;  // 0: no limit
  std::string continue_token{};
  std::string resource_version{};
  std::string query() const;  // "?labelSelector=...&limit=..." or ""
};

enum class PatchType { Merge, Json, StrategicMerge, Apply };

struct DeleteOptions {
  std::optional<int64_t> grace_period_seconds{};
  std::string propagation_policy{};  // "", "Foreground", "Background", "Orphan"
  std::string precondition_uid{};
  std::string precondition_resource_version{};
};

// Cancels a running watch (or several) from another thread: the blocking read returns at once.
class StopToken {
 public:
  void stop();
  bool stopped() const { return stopped_.load(); }
  // Internal: a watch registers the function that interrupts its connection for as long as it runs.
  int add_canceller(std::function<void()> fn);
  void remove_canceller(int id);

 private:
  std::atomic<bool> stopped_{false};
  std::mutex mu_;
  int next_id_ = 0;
  std::vector<std::pair<int, std::function<void()>>> cancellers_;
};

struct WatchOptions {
  std::string label_selector{};
  std::string field_selector{};
  std::string resource_version{};
  bool allow_bookmarks = true;
  int timeout_seconds = 300;          // the server ends the stream after this; callers re-watch from the last RV
  std::shared_ptr<StopToken> stop{};  // optional
  // Leave out metadata.managedFields while parsing (server-side apply's bookkeeping: half of a worker pod's bytes,
  // read by nothing here).
  bool drop_managed_fields = false;
};

struct WatchEvent {
  enum class Type { Added, Modified, Deleted, Bookmark };
  Type type = Type::Added;
  Json object{};
};
const char* to_string(WatchEvent::Type t);

enum class WatchEnd { ServerClosed, HandlerStopped, Stopped };

// Splits a byte stream into lines as chunks arrive (a line may span chunks; \r\n and \n both end a line).
class LineFramer {
 public:
  // Calls on_line for every complete, non-empty line in `chunk`; returns false as soon as on_line does.
  bool feed(std::string_view chunk, const std::function<bool(std::string_view)>& on_line);
  const std::string& pending() const { return buf_; }

 private:
  std::string buf_;
};

// Parses one watch line. Returns nullopt for nothing-to-deliver, throws Gone for an ERROR event with code 410,
// the matching ApiError for other ERROR events, and Error for malformed lines.
std::optional<WatchEvent> parse_watch_line(std::string_view line, const std::string& context,
                                           bool drop_managed_fields = false);

// Token bucket: `reserve` returns how long the caller must wait before going ahead (and consumes a token).
class TokenBucket {
 public:
  using Clock = std::chrono::steady_clock;
  TokenBucket(double qps, int burst);
  Clock::duration reserve(Clock::time_point now);
  void acquire();  // blocks as long as reserve() says

 private:
  std::mutex mu_;
  double qps_;
  double burst_;
  double tokens_;
  Clock::time_point last_;
};

// Backoff with jitter for retry `attempt` (0-based): initial*2^attempt capped at max, scaled by [0.5, 1.5).
std::chrono::milliseconds backoff_delay(const RetryPolicy& p, int attempt, double jitter01);

// ---------------------------------------------------------------------------------------------------------------
// Client
// ---------------------------------------------------------------------------------------------------------------

// Thread-safe. Requests share a small pool of keep-alive connections; every watch gets its own connection so a
// long watch never blocks a request. Rate-limited (qps/burst) and retried with backoff on transport errors, 429 and
// 5xx; other 4xx are never retried; a 409 Conflict is the caller's to handle (re-read and try again).
class Client {
 public:
  explicit Client(Config config);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  const Config& config() const;

  Json get(const Resource& res, const std::string& ns, const std::string& name);
  // Like get, but nullopt for NotFound.
  std::optional<Json> try_get(const Resource& res, const std::string& ns, const std::string& name);
  Json list(const Resource& res, const std::string& ns, const ListOptions& opts = {});
  // Every item across pages (limit/continue). `list_rv` receives the list's resourceVersion (to watch from).
  std::vector<Json> list_all(const Resource& res, const std::string& ns, const ListOptions& opts = {},
                             std::string* list_rv = nullptr);
  Json create(const Resource& res, const std::string& ns, const Json& obj);
  // create() without parsing the server's reply (the object as stored), for callers that only need it to exist: the
  // operator's 1,000 worker pods of a gang.
  void create_only(const Resource& res, const std::string& ns, const Json& obj);
  Json update(const Resource& res, const std::string& ns, const Json& obj);
  Json update_status(const Resource& res, const std::string& ns, const Json& obj);
  Json patch(const Resource& res, const std::string& ns, const std::string& name, const Json& patch,
             PatchType type = PatchType::Merge, const std::string& subresource = "");
  void remove(const Resource& res, const std::string& ns, const std::string& name, const DeleteOptions& opts = {});
  Json create_subresource(const Resource& res, const std::string& ns, const std::string& name,
                          const std::string& subresource, const Json& body);
  // Any other call: method "GET"/"POST"/..., path with query. Body empty means none. Returns the parsed response
  // (null for an empty body). `content_type` defaults to application/json.
  Json raw(const std::string& method, const std::string& path, const std::string& body = "",
           const std::string& content_type = "");

  // One streaming watch. Returns when the server ends the stream, on_event returns false, or opts.stop / stop()
  // fires. Throws Gone (410: relist), other ApiErrors, or TransportError (connection lost mid-stream too). The event
  // is the handler's to keep: it may move the object out (the informer does, rather than copy every pod).
  WatchEnd watch(const Resource& res, const std::string& ns, const WatchOptions& opts,
                 const std::function<bool(WatchEvent&)>& on_event);

  // Interrupts every running watch and makes retry loops give up; requests started after stop() still run.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// ---------------------------------------------------------------------------------------------------------------
// Time
// ---------------------------------------------------------------------------------------------------------------

// "2026-11-22T02:40:00.123456Z" (Lease times need 6 fractional digits).
std::string format_rfc3339_micro(std::chrono::system_clock::time_point t);
// "2026-11-22T02:40:00Z" (metav1.Time, e.g. Event timestamps).
std::string format_rfc3339(std::chrono::system_clock::time_point t);
// Accepts both forms above and a numeric offset; throws Error naming the text.
std::chrono::system_clock::time_point parse_rfc3339(const std::string& text);

// Small helpers for object fields that may be missing.
// obj[key] without a copy (Json::value copies the member): the member itself, or a null when obj is not an object or
// has no such key. A null's contains() is false and it iterates as empty, so lookups chain: field(field(p, "spec"),
// ..).
const Json& field(const Json& obj, std::string_view key);
std::string name_of(const Json& obj);
std::string namespace_of(const Json& obj);
std::string resource_version_of(const Json& obj);
std::string key_of(const Json& obj);  // "namespace/name", or "name" for cluster-scoped objects

// Standard base64 (a Secret's data values); throws Error naming the position of malformed input.
std::string base64_decode(const std::string& in);

}  // namespace railyard::kube
