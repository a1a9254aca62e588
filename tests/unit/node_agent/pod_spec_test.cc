#include "deploy/local/node_agent/pod_spec.h"

#include <doctest/doctest.h>

#include <map>

namespace na = railyard::node_agent;
using nlohmann::json;

namespace {

json make_pod(json container) {
  return json{{"metadata",
               {{"name", "w-0"},
                {"namespace", "team"},
                {"uid", "uid-123"},
                {"labels", {{"app", "train"}}},
                {"annotations", {{"railyard.dev/rank", "3"}}}}},
              {"spec", {{"nodeName", "rynode-u0-n1"}, {"containers", json::array({container})}}}};
}

// Objects a test namespace holds; anything else does not exist.
na::RefLookup lookup_from(std::map<std::string, std::map<std::string, std::string>> secrets,
                          std::map<std::string, std::map<std::string, std::string>> configmaps) {
  return [secrets, configmaps](na::RefKind kind, const std::string& ns,
                               const std::string& name) -> std::optional<std::map<std::string, std::string>> {
    if (ns != "team") return std::nullopt;
    const auto& m = kind == na::RefKind::Secret ? secrets : configmaps;
    auto it = m.find(name);
    if (it == m.end()) return std::nullopt;
    return it->second;
  };
}

std::string env_of(const na::LaunchPlan& p, const std::string& name) {
  for (const auto& [k, v] : p.env) {
    if (k == name) return v;
  }
  return "<unset>";
}

na::PodContext ctx() { return na::PodContext{"rynode-u0-n1", "127.16.0.7", "127.0.0.1", "/state"}; }

}  // namespace

TEST_CASE("launch plan: command, args, literal env, fieldRefs, dirs") {
  auto pod = make_pod({{"name", "worker"},
                       {"command", {"sh", "-c"}},
                       {"args", {"echo $(MY_NAME) $$HOME"}},
                       {"env",
                        {{{"name", "LIT"}, {"value", "x"}},
                         {{"name", "MY_NAME"}, {"valueFrom", {{"fieldRef", {{"fieldPath", "metadata.name"}}}}}},
                         {{"name", "NS"}, {"valueFrom", {{"fieldRef", {{"fieldPath", "metadata.namespace"}}}}}},
                         {{"name", "UID"}, {"valueFrom", {{"fieldRef", {{"fieldPath", "metadata.uid"}}}}}},
                         {{"name", "IP"}, {"valueFrom", {{"fieldRef", {{"fieldPath", "status.podIP"}}}}}},
                         {{"name", "NODE"}, {"valueFrom", {{"fieldRef", {{"fieldPath", "spec.nodeName"}}}}}},
                         {{"name", "APP"}, {"valueFrom", {{"fieldRef", {{"fieldPath", "metadata.labels['app']"}}}}}},
                         {{"name", "RANK"},
                          {"valueFrom", {{"fieldRef", {{"fieldPath", "metadata.annotations['railyard.dev/rank']"}}}}}},
                         {{"name", "COMBO"}, {"value", "$(MY_NAME)@$(NODE)"}}}}});
  auto plan = na::build_launch_plan(pod, ctx(), lookup_from({}, {}), {{"PATH", "/bin"}});
  REQUIRE(plan.argv.size() == 3);
  CHECK(plan.argv[0] == "sh");
  CHECK(plan.argv[2] == "echo w-0 $HOME");
  CHECK(env_of(plan, "PATH") == "/bin");
  CHECK(env_of(plan, "LIT") == "x");
  CHECK(env_of(plan, "MY_NAME") == "w-0");
  CHECK(env_of(plan, "NS") == "team");
  CHECK(env_of(plan, "UID") == "uid-123");
  CHECK(env_of(plan, "IP") == "127.16.0.7");
  CHECK(env_of(plan, "RAILYARD_POD_IP") == "127.16.0.7");
  CHECK(env_of(plan, "NODE") == "rynode-u0-n1");
  CHECK(env_of(plan, "APP") == "train");
  CHECK(env_of(plan, "RANK") == "3");
  CHECK(env_of(plan, "COMBO") == "w-0@rynode-u0-n1");
  CHECK(env_of(plan, "HOSTNAME") == "w-0");
  CHECK(plan.container_name == "worker");
  CHECK(plan.pod_dir == "/state/pods/team_w-0");
  CHECK(plan.log_path == "/state/pods/team_w-0/worker.log");
  CHECK(plan.working_dir == "/state/pods/team_w-0/work");
}

TEST_CASE("launch plan: secretKeyRef, configMapKeyRef, envFrom and optional") {
  auto lookup = lookup_from({{"creds", {{"token", "s3cret"}}}}, {{"cfg", {{"lr", "0.1"}, {"steps", "10"}}}});
  auto pod = make_pod(
      {{"command", {"true"}},
       {"workingDir", "/tmp/wd"},
       {"envFrom", {{{"configMapRef", {{"name", "cfg"}}}, {"prefix", "CFG_"}}}},
       {"env",
        {{{"name", "TOKEN"}, {"valueFrom", {{"secretKeyRef", {{"name", "creds"}, {"key", "token"}}}}}},
         {{"name", "LR"}, {"valueFrom", {{"configMapKeyRef", {{"name", "cfg"}, {"key", "lr"}}}}}},
         {{"name", "OPT1"}, {"valueFrom", {{"secretKeyRef", {{"name", "absent"}, {"key", "k"}, {"optional", true}}}}}},
         {{"name", "OPT2"},
          {"valueFrom", {{"configMapKeyRef", {{"name", "cfg"}, {"key", "nokey"}, {"optional", true}}}}}}}}});
  auto plan = na::build_launch_plan(pod, ctx(), lookup, {});
  CHECK(env_of(plan, "TOKEN") == "s3cret");
  CHECK(env_of(plan, "LR") == "0.1");
  CHECK(env_of(plan, "CFG_steps") == "10");
  CHECK(env_of(plan, "OPT1") == "<unset>");
  CHECK(env_of(plan, "OPT2") == "<unset>");
  CHECK(plan.working_dir == "/tmp/wd");
}

TEST_CASE("launch plan errors carry a reason and name the field") {
  auto lookup = lookup_from({{"creds", {{"token", "s3cret"}}}}, {});
  SUBCASE("no command") {
    auto pod = make_pod({{"name", "c"}, {"image", "busybox"}});
    try {
      na::build_launch_plan(pod, ctx(), lookup, {});
      FAIL("expected PlanError");
    } catch (const na::PlanError& e) {
      CHECK(e.reason() == "NoCommand");
      CHECK(e.permanent());
      CHECK(std::string(e.what()).find("team/w-0") != std::string::npos);
    }
  }
  SUBCASE("missing secret is retryable") {
    auto pod =
        make_pod({{"command", {"true"}},
                  {"env", {{{"name", "T"}, {"valueFrom", {{"secretKeyRef", {{"name", "nope"}, {"key", "token"}}}}}}}}});
    try {
      na::build_launch_plan(pod, ctx(), lookup, {});
      FAIL("expected PlanError");
    } catch (const na::PlanError& e) {
      CHECK(e.reason() == "CreateContainerConfigError");
      CHECK_FALSE(e.permanent());
      CHECK(std::string(e.what()).find("secret \"nope\" not found") != std::string::npos);
      CHECK(std::string(e.what()).find("env[0] (T)") != std::string::npos);
    }
  }
  SUBCASE("missing key") {
    auto pod = make_pod(
        {{"command", {"true"}},
         {"env", {{{"name", "T"}, {"valueFrom", {{"secretKeyRef", {{"name", "creds"}, {"key", "other"}}}}}}}}});
    CHECK_THROWS_WITH_AS(na::build_launch_plan(pod, ctx(), lookup, {}), doctest::Contains("key \"other\" not found"),
                         na::PlanError);
  }
  SUBCASE("unsupported fieldPath") {
    auto pod = make_pod({{"command", {"true"}},
                         {"env", {{{"name", "T"}, {"valueFrom", {{"fieldRef", {{"fieldPath", "status.phase"}}}}}}}}});
    CHECK_THROWS_WITH_AS(na::build_launch_plan(pod, ctx(), lookup, {}), doctest::Contains("status.phase"),
                         na::PlanError);
  }
  SUBCASE("lookup failure is retryable") {
    na::RefLookup broken = [](na::RefKind, const std::string&,
                              const std::string&) -> std::optional<std::map<std::string, std::string>> {
      throw std::runtime_error("connection refused");
    };
    auto pod = make_pod(
        {{"command", {"true"}},
         {"env", {{{"name", "T"}, {"valueFrom", {{"secretKeyRef", {{"name", "creds"}, {"key", "token"}}}}}}}}});
    try {
      na::build_launch_plan(pod, ctx(), broken, {});
      FAIL("expected PlanError");
    } catch (const na::PlanError& e) {
      CHECK_FALSE(e.permanent());
      CHECK(std::string(e.what()).find("connection refused") != std::string::npos);
    }
  }
}

TEST_CASE("$(VAR) expansion") {
  std::map<std::string, std::string> vars{{"A", "1"}, {"B", "two"}};
  CHECK(na::expand_vars("$(A)-$(B)", vars) == "1-two");
  CHECK(na::expand_vars("$(C)", vars) == "$(C)");
  CHECK(na::expand_vars("$$(A)", vars) == "$(A)");
  CHECK(na::expand_vars("cost $5", vars) == "cost $5");
  CHECK(na::expand_vars("$(A", vars) == "$(A");
}
