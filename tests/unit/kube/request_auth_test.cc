// The pure parts of RequestAuthorizer (common/kube/request_auth.h): the bearer token, the review requests and how
// their answers are read. The reviews themselves run against the local API server in e2e_install_chart.
#include "common/kube/request_auth.h"

#include <doctest/doctest.h>

using namespace railyard::kube;

TEST_CASE("the bearer token: RFC 6750's scheme, any case, nothing else") {
  CHECK(bearer_token("Bearer abc.def") == "abc.def");
  CHECK(bearer_token("bearer abc") == "abc");
  CHECK(bearer_token("BEARER  abc ") == "abc");
  CHECK_FALSE(bearer_token(""));
  CHECK_FALSE(bearer_token("Bearer "));
  CHECK_FALSE(bearer_token("Bearer    "));
  CHECK_FALSE(bearer_token("Basic dXNlcjpwYXNz"));
  CHECK_FALSE(bearer_token("Bearerabc"));
  CHECK_FALSE(bearer_token("Bearer a b"));  // one token, not a list
  CHECK_FALSE(bearer_token("Bearer a\nb"));
}

TEST_CASE("a TokenReview: the request carries the token; the answer names the user, or why not") {
  const Json req = token_review_request("t0k");
  CHECK(req["apiVersion"] == "authentication.k8s.io/v1");
  CHECK(req["kind"] == "TokenReview");
  CHECK(req["spec"]["token"] == "t0k");

  const Json ok = {{"status",
                    {{"authenticated", true},
                     {"user",
                      {{"username", "system:serviceaccount:mon:prometheus"},
                       {"uid", "u-1"},
                       {"groups", {"system:serviceaccounts", "system:authenticated", 7}},
                       {"extra", {{"authentication.kubernetes.io/pod-name", {"p-0"}}, {"bad", "notalist"}}}}}}}};
  const ReviewedUser u = parse_token_review(ok);
  CHECK(u.authenticated);
  CHECK(u.user == "system:serviceaccount:mon:prometheus");
  CHECK(u.uid == "u-1");
  CHECK(u.groups == std::vector<std::string>{"system:serviceaccounts", "system:authenticated"});
  CHECK(u.extra.size() == 1);
  CHECK(u.extra.at("authentication.kubernetes.io/pod-name") == std::vector<std::string>{"p-0"});

  const ReviewedUser no =
      parse_token_review({{"status", {{"authenticated", false}, {"error", "invalid bearer token"}}}});
  CHECK_FALSE(no.authenticated);
  CHECK(no.error == "invalid bearer token");
  // Malformed answers authenticate nobody.
  CHECK_FALSE(parse_token_review(Json::object()).authenticated);
  CHECK_FALSE(parse_token_review({{"status", {{"authenticated", "true"}}}}).authenticated);
  CHECK_FALSE(parse_token_review({{"status", {{"authenticated", true}, {"user", {{"username", ""}}}}}}).authenticated);
  CHECK_FALSE(parse_token_review(Json::array()).authenticated);
}

TEST_CASE("a SubjectAccessReview: the user's identity and the non-resource URL; allowed only when it says so") {
  ReviewedUser u;
  u.authenticated = true;
  u.user = "alice";
  u.groups = {"team-a"};
  const Json req = subject_access_review_request(u, "/metrics", "get");
  CHECK(req["apiVersion"] == "authorization.k8s.io/v1");
  CHECK(req["kind"] == "SubjectAccessReview");
  CHECK(req["spec"]["user"] == "alice");
  CHECK(req["spec"]["groups"] == Json{"team-a"});
  CHECK(req["spec"]["nonResourceAttributes"] == Json{{"path", "/metrics"}, {"verb", "get"}});
  CHECK_FALSE(req["spec"].contains("uid"));
  CHECK_FALSE(req["spec"].contains("resourceAttributes"));

  std::string why;
  CHECK(parse_subject_access_review(
      {{"status", {{"allowed", true}, {"reason", "RBAC: allowed by ClusterRoleBinding"}}}}, &why));
  CHECK(why == "RBAC: allowed by ClusterRoleBinding");
  CHECK_FALSE(parse_subject_access_review({{"status", {{"allowed", false}}}}, &why));
  CHECK(why.empty());
  CHECK_FALSE(parse_subject_access_review({{"status", {{"allowed", false}, {"evaluationError", "boom"}}}}, &why));
  CHECK(why == "boom");
  CHECK_FALSE(parse_subject_access_review({{"status", {{"allowed", true}, {"denied", true}}}}));
  CHECK_FALSE(parse_subject_access_review(Json::object()));
  CHECK_FALSE(parse_subject_access_review({{"status", {{"allowed", "yes"}}}}));
}
