// Pure helpers of the client: errors from Status bodies, paths, options, line framing, rate limiting, time.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <thread>

#include "common/kube/client.h"

namespace railyard::kube {

// ------------------------------------------------------------------------------------------------ errors

void throw_api_error(int http_status, const std::string& body, const std::string& context) {
  std::string reason;
  std::string message;
  int code = http_status;
  Json status = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  // Type-checked: Json::value() throws on a non-string "kind" (found by fuzz_watch_stream).
  auto field = [&status](const char* key) {
    return status.contains(key) && status[key].is_string() ? status[key].get<std::string>() : std::string();
  };
  if (status.is_object() && field("kind") == "Status") {
    reason = field("reason");
    message = field("message");
    if (status.contains("code") && status["code"].is_number_integer()) code = status["code"].get<int>();
  } else {
    message = body.size() > 300 ? body.substr(0, 300) + "..." : body;
  }
  if (message.empty()) message = "HTTP " + std::to_string(code);
  std::string what = context + ": " + message;
  if (!reason.empty()) what += " (" + reason + ")";
  switch (code) {
    case 401:
      throw Unauthorized(code, reason, what + ": the token or client certificate was rejected; check the credentials");
    case 403:
      throw Forbidden(code, reason, what);
    case 404:
      throw NotFound(code, reason, what);
    case 409:
      if (reason == "AlreadyExists") throw AlreadyExists(code, reason, what);
      throw Conflict(code, reason, what);
    case 410:
      throw Gone(code, reason, what);
    case 422:
      throw Invalid(code, reason, what);
    case 429:
      throw TooManyRequests(code, reason, what);
    default:
      break;
  }
  if (code >= 500) throw ServerError(code, reason, what);
  throw BadRequest(code, reason, what);
}

// ------------------------------------------------------------------------------------------------ resources

namespace resources {
const Resource pods{"", "v1", "pods", "Pod", true};
const Resource nodes{"", "v1", "nodes", "Node", false};
const Resource namespaces{"", "v1", "namespaces", "Namespace", false};
const Resource events{"", "v1", "events", "Event", true};
const Resource leases{"coordination.k8s.io", "v1", "leases", "Lease", true};
const Resource secrets{"", "v1", "secrets", "Secret", true};
const Resource configmaps{"", "v1", "configmaps", "ConfigMap", true};
const Resource services{"", "v1", "services", "Service", true};
const Resource endpoints{"", "v1", "endpoints", "Endpoints", true};
const Resource serviceaccounts{"", "v1", "serviceaccounts", "ServiceAccount", true};
const Resource customresourcedefinitions{"apiextensions.k8s.io", "v1", "customresourcedefinitions",
                                         "CustomResourceDefinition", false};
const Resource networkpolicies{"networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy", true};
const Resource priorityclasses{"scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", false};
const Resource persistentvolumeclaims{"", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", true};
const Resource storageclasses{"storage.k8s.io", "v1", "storageclasses", "StorageClass", false};
const Resource trainingjobs{"railyard.dev", "v1alpha1", "trainingjobs", "TrainingJob", true};
}  // namespace resources

std::string url_encode(const std::string& s) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

std::string resource_path(const Resource& res, const std::string& ns, const std::string& name,
                          const std::string& subresource) {
  if (res.version.empty() || res.plural.empty()) {
    throw Error("resource_path: resource with empty version or plural (kind '" + res.kind + "')");
  }
  // Built by appends only (GCC 12 reports a false -Wrestrict for `"/" + str` here).
  std::string p;
  if (res.group.empty()) {
    p.append("/api/");
  } else {
    p.append("/apis/").append(res.group).append("/");
  }
  p.append(res.version);
  if (res.namespaced && !ns.empty()) p.append("/namespaces/").append(url_encode(ns));
  p.append("/").append(res.plural);
  if (!name.empty()) {
    p.append("/").append(url_encode(name));
    if (!subresource.empty()) p.append("/").append(subresource);
  } else if (!subresource.empty()) {
    throw Error("resource_path: subresource '" + subresource + "' of " + res.plural + " needs an object name");
  }
  return p;
}

namespace {
void add_param(std::string& q, const char* key, const std::string& value) {
  if (value.empty()) return;
  q += q.empty() ? '?' : '&';
  q += key;
  q += '=';
  q += url_encode(value);
}
}  // namespace

std::string ListOptions::query() const {
  std::string q;
  add_param(q, "labelSelector", label_selector);
  add_param(q, "fieldSelector", field_selector);
  if (limit > 0) add_param(q, "limit", std::to_string(limit));
  add_param(q, "continue", continue_token);
  add_param(q, "resourceVersion", resource_version);
  return q;
}

// ------------------------------------------------------------------------------------------------ watch

void StopToken::stop() {
  stopped_.store(true);
  std::vector<std::function<void()>> fns;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [id, fn] : cancellers_) fns.push_back(fn);
  }
  for (auto& fn : fns) fn();
}

int StopToken::add_canceller(std::function<void()> fn) {
  std::lock_guard<std::mutex> lock(mu_);
  int id = ++next_id_;
  cancellers_.emplace_back(id, std::move(fn));
  return id;
}

void StopToken::remove_canceller(int id) {
  std::lock_guard<std::mutex> lock(mu_);
  std::erase_if(cancellers_, [id](const auto& p) { return p.first == id; });
}

const char* to_string(WatchEvent::Type t) {
  switch (t) {
    case WatchEvent::Type::Added:
      return "ADDED";
    case WatchEvent::Type::Modified:
      return "MODIFIED";
    case WatchEvent::Type::Deleted:
      return "DELETED";
    case WatchEvent::Type::Bookmark:
      return "BOOKMARK";
  }
  return "?";
}

bool LineFramer::feed(std::string_view chunk, const std::function<bool(std::string_view)>& on_line) {
  size_t start = 0;
  while (true) {
    size_t nl = chunk.find('\n', start);
    if (nl == std::string_view::npos) {
      buf_.append(chunk.substr(start));
      return true;
    }
    std::string_view piece = chunk.substr(start, nl - start);
    start = nl + 1;
    std::string_view line;
    if (!buf_.empty()) {
      buf_.append(piece);
      line = buf_;
    } else {
      line = piece;
    }
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    bool keep_going = line.empty() ? true : on_line(line);
    buf_.clear();
    if (!keep_going) return false;
  }
}

std::optional<WatchEvent> parse_watch_line(std::string_view line, const std::string& context,
                                           bool drop_managed_fields) {
  // Depth 1: type, object; 2: the object's fields; 3: metadata's fields. The parser never builds a dropped value.
  std::string level2;
  Json::parser_callback_t drop = [&level2](int depth, Json::parse_event_t event, Json& parsed) {
    if (event != Json::parse_event_t::key) return true;
    if (depth == 2) level2 = parsed.is_string() ? parsed.get<std::string>() : "";
    return !(depth == 3 && level2 == "metadata" && parsed == "managedFields");
  };
  Json j = Json::parse(line, drop_managed_fields ? drop : nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) {
    throw Error(context + ": malformed watch event: " + std::string(line.substr(0, 200)));
  }
  const std::string type = j["type"].get<std::string>();
  WatchEvent ev;
  if (type == "ADDED") {
    ev.type = WatchEvent::Type::Added;
  } else if (type == "MODIFIED") {
    ev.type = WatchEvent::Type::Modified;
  } else if (type == "DELETED") {
    ev.type = WatchEvent::Type::Deleted;
  } else if (type == "BOOKMARK") {
    ev.type = WatchEvent::Type::Bookmark;
  } else if (type == "ERROR") {
    const Json& st = j.contains("object") ? j["object"] : Json();
    int code = st.is_object() && st.contains("code") && st["code"].is_number_integer() ? st["code"].get<int>() : 500;
    throw_api_error(code, st.is_object() ? st.dump() : std::string(), context + " (watch)");
  } else {
    throw Error(context + ": unknown watch event type '" + type + "'");
  }
  // ADDED/MODIFIED/DELETED without an object would reach the informer's cache under an empty key.
  if (ev.type != WatchEvent::Type::Bookmark && !(j.contains("object") && j["object"].is_object())) {
    throw Error(context + ": malformed watch event: " + type +
                " without an object: " + std::string(line.substr(0, 200)));
  }
  if (j.contains("object")) ev.object = std::move(j["object"]);
  return ev;
}

// ------------------------------------------------------------------------------------------------ rate limiting

TokenBucket::TokenBucket(double qps, int burst)
    : qps_(qps), burst_(std::max(1, burst)), tokens_(std::max(1, burst)), last_(Clock::now()) {}

TokenBucket::Clock::duration TokenBucket::reserve(Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mu_);
  if (qps_ <= 0) return Clock::duration::zero();  // unlimited
  if (now > last_) {
    double elapsed = std::chrono::duration<double>(now - last_).count();
    tokens_ = std::min(burst_, tokens_ + elapsed * qps_);
    last_ = now;
  }
  // Tokens may go negative: each waiter reserves its own future slot, so waiters are spaced 1/qps apart.
  tokens_ -= 1.0;
  if (tokens_ >= 0) return Clock::duration::zero();
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(-tokens_ / qps_));
}

void TokenBucket::acquire() {
  auto wait = reserve(Clock::now());
  if (wait > Clock::duration::zero()) std::this_thread::sleep_for(wait);
}

std::chrono::milliseconds backoff_delay(const RetryPolicy& p, int attempt, double jitter01) {
  double base = static_cast<double>(p.initial_backoff.count()) * std::pow(2.0, std::min(attempt, 30));
  base = std::min(base, static_cast<double>(p.max_backoff.count()));
  double scaled = base * (0.5 + std::clamp(jitter01, 0.0, 1.0));
  return std::chrono::milliseconds(static_cast<int64_t>(scaled));
}

// ------------------------------------------------------------------------------------------------ time

namespace {
std::string format_time(std::chrono::system_clock::time_point t, bool micro) {
  auto secs = std::chrono::time_point_cast<std::chrono::seconds>(t);
  if (secs > t) secs -= std::chrono::seconds(1);  // floor for times before the epoch
  std::time_t tt = std::chrono::system_clock::to_time_t(secs);
  std::tm tm{};
  gmtime_r(&tt, &tm);
  char buf[64];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S", &tm);
  std::string out = buf;
  if (micro) {
    auto us = std::chrono::duration_cast<std::chrono::microseconds>(t - secs).count();
    char frac[32];
    std::snprintf(frac, sizeof(frac), ".%06lld", static_cast<long long>(us));
    out += frac;
  }
  return out + "Z";
}
}  // namespace

std::string format_rfc3339_micro(std::chrono::system_clock::time_point t) { return format_time(t, true); }
std::string format_rfc3339(std::chrono::system_clock::time_point t) { return format_time(t, false); }

std::chrono::system_clock::time_point parse_rfc3339(const std::string& text) {
  std::tm tm{};
  int consumed = 0;
  if (std::sscanf(text.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d%n", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour,
                  &tm.tm_min, &tm.tm_sec, &consumed) != 6) {
    throw Error("invalid RFC 3339 time '" + text + "': expected e.g. 2026-11-22T02:40:00.123456Z");
  }
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  std::time_t secs = timegm(&tm);
  auto t = std::chrono::system_clock::from_time_t(secs);
  size_t i = static_cast<size_t>(consumed);
  if (i < text.size() && (text[i] == '.' || text[i] == ',')) {
    ++i;
    int64_t frac = 0;
    int digits = 0;
    while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
      if (digits < 9) {
        frac = frac * 10 + (text[i] - '0');
        ++digits;
      }
      ++i;
    }
    while (digits < 9) {
      frac *= 10;
      ++digits;
    }
    t += std::chrono::duration_cast<std::chrono::system_clock::duration>(std::chrono::nanoseconds(frac));
  }
  if (i < text.size() && (text[i] == 'Z' || text[i] == 'z') && i + 1 == text.size()) return t;
  int oh = 0, om = 0;
  if (i < text.size() && (text[i] == '+' || text[i] == '-') &&
      std::sscanf(text.c_str() + i + 1, "%2d:%2d", &oh, &om) == 2 && i + 6 == text.size()) {
    auto off = std::chrono::hours(oh) + std::chrono::minutes(om);
    return text[i] == '+' ? t - off : t + off;
  }
  throw Error("invalid RFC 3339 time '" + text + "': expected a 'Z' or +hh:mm offset at the end");
}

// ------------------------------------------------------------------------------------------------ objects

const Json& field(const Json& obj, std::string_view key) {
  static const Json null;
  if (!obj.is_object()) return null;
  auto it = obj.find(key);
  return it == obj.end() ? null : *it;
}
std::string name_of(const Json& obj) {
  if (!obj.is_object() || !obj.contains("metadata")) return "";
  return obj["metadata"].value("name", "");
}
std::string namespace_of(const Json& obj) {
  if (!obj.is_object() || !obj.contains("metadata")) return "";
  return obj["metadata"].value("namespace", "");
}
std::string resource_version_of(const Json& obj) {
  if (!obj.is_object() || !obj.contains("metadata")) return "";
  return obj["metadata"].value("resourceVersion", "");
}
std::string key_of(const Json& obj) {
  std::string ns = namespace_of(obj);
  return ns.empty() ? name_of(obj) : ns + "/" + name_of(obj);
}

// ------------------------------------------------------------------------------------------------ base64

std::string base64_decode(const std::string& in) {
  auto val = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  std::string out;
  unsigned buf = 0;
  int bits = 0;
  size_t i = 0;
  for (; i < in.size() && in[i] != '='; ++i) {
    int v = val(in[i]);
    if (v < 0) throw Error("malformed base64 at character " + std::to_string(i));
    buf = (buf << 6) | static_cast<unsigned>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((buf >> bits) & 0xff);
    }
  }
  for (; i < in.size(); ++i) {
    if (in[i] != '=') throw Error("malformed base64: data after padding");
  }
  return out;
}

}  // namespace railyard::kube
