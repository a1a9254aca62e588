// Who may read an HTTP endpoint of ours (the operator's /metrics), decided by the API server: the request's bearer
// token is reviewed (authentication.k8s.io/v1 TokenReview), then the user it names is checked for the request's
// non-resource URL and verb (authorization.k8s.io/v1 SubjectAccessReview), as kube-rbac-proxy and controller-runtime's
// metrics filter do. Prometheus then needs a ServiceAccount token and a ClusterRole granting `get` on the path
// (nonResourceURLs: ["/metrics"]).
//
// Data flow: HTTP handler -> RequestAuthorizer::check(Authorization header, path, verb) -> cache (SHA-256 of the
// token, path, verb; ttl) or TokenReview + SubjectAccessReview through the Client -> 200 / 401 / 403 / 503.
#pragma once

#include <chrono>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/kube/client.h"

namespace railyard::kube {

using Json = nlohmann::json;

// "Bearer <token>" (scheme case-insensitive, RFC 6750) -> the token; nullopt for anything else or an empty token.
std::optional<std::string> bearer_token(const std::string& authorization);

// What a TokenReview said about a token.
struct ReviewedUser {
  bool authenticated = false;
  std::string user, uid, error;
  std::vector<std::string> groups;
  std::map<std::string, std::vector<std::string>> extra;
};
Json token_review_request(const std::string& token);
// The API server's answer (the whole TokenReview): status.authenticated, status.user, status.error.
ReviewedUser parse_token_review(const Json& review);

Json subject_access_review_request(const ReviewedUser& user, const std::string& path, const std::string& verb);
// status.allowed (false when missing); `reason` gets status.reason (or evaluationError) when given.
bool parse_subject_access_review(const Json& review, std::string* reason = nullptr);

struct AccessDecision {
  int status = 500;    // 200 allowed, 401 no or unknown token, 403 known but not allowed, 503 the API failed
  std::string reason;  // for the response body and the log (never the token)
  std::string user;
};

class RequestAuthorizer {
 public:
  // `ttl`: how long a decision is reused for the same token, path and verb (Prometheus scrapes every few seconds;
  // two reviews per scrape otherwise). A failed review is never cached.
  explicit RequestAuthorizer(Client& client, std::chrono::seconds ttl = std::chrono::seconds(10),
                             size_t max_entries = 1024);
  AccessDecision check(const std::string& authorization, const std::string& path, const std::string& verb = "get");

 private:
  Client& client_;
  std::chrono::seconds ttl_;
  size_t max_entries_;
  std::mutex mu_;
  struct Entry {
    AccessDecision decision;
    std::chrono::steady_clock::time_point until;
  };
  std::map<std::string, Entry> cache_;
};

}  // namespace railyard::kube
