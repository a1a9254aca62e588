#include "common/kube/request_auth.h"

#include <openssl/evp.h>

#include <algorithm>
#include <cctype>

namespace railyard::kube {

namespace {

const Resource kTokenReviews{"authentication.k8s.io", "v1", "tokenreviews", "TokenReview", false};
const Resource kSubjectAccessReviews{"authorization.k8s.io", "v1", "subjectaccessreviews", "SubjectAccessReview",
                                     false};

std::string text(const Json& j) { return j.is_string() ? j.get<std::string>() : std::string(); }

// The cache key: never the token itself (a heap dump or a debugger must not find live tokens in a map).
std::string digest(const std::string& token, const std::string& path, const std::string& verb) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(token.data(), token.size(), md, &len, EVP_sha256(), nullptr);
  return std::string(reinterpret_cast<const char*>(md), len) + '\0' + verb + '\0' + path;
}

}  // namespace

std::optional<std::string> bearer_token(const std::string& authorization) {
  constexpr std::string_view kScheme = "bearer ";
  if (authorization.size() <= kScheme.size()) return std::nullopt;
  for (size_t i = 0; i < kScheme.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(authorization[i])) != kScheme[i]) return std::nullopt;
  std::string token = authorization.substr(kScheme.size());
  token.erase(0, token.find_first_not_of(' '));
  while (!token.empty() && token.back() == ' ') token.pop_back();
  if (token.empty() || token.find_first_of(" \t\r\n") != std::string::npos) return std::nullopt;
  return token;
}

Json token_review_request(const std::string& token) {
  return {{"apiVersion", "authentication.k8s.io/v1"}, {"kind", "TokenReview"}, {"spec", {{"token", token}}}};
}

ReviewedUser parse_token_review(const Json& review) {
  ReviewedUser u;
  const Json& status = field(review, "status");
  u.error = text(field(status, "error"));
  if (field(status, "authenticated") != true) return u;
  const Json& user = field(status, "user");
  u.user = text(field(user, "username"));
  u.uid = text(field(user, "uid"));
  if (const Json& groups = field(user, "groups"); groups.is_array())
    for (const Json& g : groups)
      if (g.is_string()) u.groups.push_back(g.get<std::string>());
  if (const Json& extra = field(user, "extra"); extra.is_object())
    for (const auto& [k, values] : extra.items())
      if (values.is_array())
        for (const Json& v : values)
          if (v.is_string()) u.extra[k].push_back(v.get<std::string>());
  u.authenticated = !u.user.empty();  // an authenticated answer without a user name is no identity to authorize
  return u;
}

Json subject_access_review_request(const ReviewedUser& user, const std::string& path, const std::string& verb) {
  Json spec = {{"user", user.user}, {"nonResourceAttributes", {{"path", path}, {"verb", verb}}}};
  if (!user.uid.empty()) spec["uid"] = user.uid;
  if (!user.groups.empty()) spec["groups"] = user.groups;
  if (!user.extra.empty()) spec["extra"] = user.extra;
  return {{"apiVersion", "authorization.k8s.io/v1"}, {"kind", "SubjectAccessReview"}, {"spec", spec}};
}

bool parse_subject_access_review(const Json& review, std::string* reason) {
  const Json& status = field(review, "status");
  if (reason) {
    *reason = text(field(status, "reason"));
    if (reason->empty()) *reason = text(field(status, "evaluationError"));
  }
  return field(status, "allowed") == true && field(status, "denied") != true;
}

RequestAuthorizer::RequestAuthorizer(Client& client, std::chrono::seconds ttl, size_t max_entries)
    : client_(client), ttl_(ttl), max_entries_(std::max<size_t>(1, max_entries)) {}

AccessDecision RequestAuthorizer::check(const std::string& authorization, const std::string& path,
                                        const std::string& verb) {
  const auto token = bearer_token(authorization);
  if (!token) return {401, "no bearer token (Authorization: Bearer <ServiceAccount token>)", ""};
  const std::string key = digest(*token, path, verb);
  const auto now = std::chrono::steady_clock::now();
  {
    std::lock_guard lock(mu_);
    if (auto it = cache_.find(key); it != cache_.end()) {
      if (it->second.until > now) return it->second.decision;
      cache_.erase(it);
    }
  }
  AccessDecision d;
  try {
    const ReviewedUser u = parse_token_review(client_.create(kTokenReviews, "", token_review_request(*token)));
    if (!u.authenticated) {
      d = {401, "token not authenticated" + (u.error.empty() ? std::string() : ": " + u.error), ""};
    } else {
      std::string why;
      const bool allowed = parse_subject_access_review(
          client_.create(kSubjectAccessReviews, "", subject_access_review_request(u, path, verb)), &why);
      d = allowed ? AccessDecision{200, "", u.user}
                  : AccessDecision{403,
                                   "user " + u.user + " may not " + verb + " " + path +
                                       (why.empty() ? std::string() : " (" + why + ")") +
                                       ": bind a ClusterRole with nonResourceURLs [\"" + path + "\"], verbs [\"" +
                                       verb + "\"]",
                                   u.user};
    }
  } catch (const std::exception& e) {
    return {503, std::string("could not review the request with the API server: ") + e.what(), ""};
  }
  std::lock_guard lock(mu_);
  if (cache_.size() >= max_entries_) {
    // Expired entries first; a full cache of live ones is dropped whole (a flood of distinct tokens costs reviews, not
    // memory).
    for (auto it = cache_.begin(); it != cache_.end();) it = it->second.until <= now ? cache_.erase(it) : std::next(it);
    if (cache_.size() >= max_entries_) cache_.clear();
  }
  cache_[key] = {d, now + ttl_};
  return d;
}

}  // namespace railyard::kube
