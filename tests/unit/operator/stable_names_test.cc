// Stable names (docs/programs.md "Stable names", common/stable_names.h): every job's headless Service, every pod's
// hostname and subdomain, a program's RAILYARD_POD_DOMAIN (spec.program.addresses), and the job names that cannot
// name a Service or a hostname refused naming metadata.name.
#include <doctest/doctest.h>

#include <string>

#include "common/wellknown.h"
#include "operator/api.h"
#include "operator/controller/job_service.h"
#include "operator/controller/pod_builder.h"
#include "tests/unit/operator/job_fixture.h"

using namespace railyard::op;
namespace wellknown = railyard::wellknown;
using railyard::op::testing::job_with;
using railyard::op::testing::resolved_env;
using Json = nlohmann::json;

namespace {

// The fixture's program job with 4 processes a replica, then `patch`.
Json program_job(const Json& patch = Json::object()) {
  return testing::program_job_with({{"spec", {{"procsPerReplica", 4}}}}, patch);
}

std::string violation_of(const Json& job) {
  ParsedJob p = parse_job(job);
  return p.violation ? p.violation->message : "";
}

}  // namespace

TEST_CASE("the job's headless Service: named after the job, over its pods, owned by it, names before readiness") {
  const Json svc = build_job_service(program_job());
  CHECK(svc["apiVersion"] == "v1");
  CHECK(svc["kind"] == "Service");
  CHECK(svc["metadata"]["name"] == "ddp");
  CHECK(svc["metadata"]["namespace"] == "team-a");
  CHECK(svc["metadata"]["labels"][wellknown::kJobLabel] == "ddp");  // the operator's Service informer selects on it
  const Json& owner = svc["metadata"]["ownerReferences"][0];
  CHECK(owner["kind"] == "TrainingJob");
  CHECK(owner["uid"] == "uid-9");
  CHECK(owner["controller"] == true);  // garbage-collected with the job; claim_of tells it from someone else's
  CHECK(svc["spec"]["clusterIP"] == "None");
  CHECK(svc["spec"]["selector"] == Json{{wellknown::kJobLabel, "ddp"}});
  CHECK(svc["spec"]["publishNotReadyAddresses"] == true);
  CHECK_FALSE(svc["spec"].contains("ports"));  // a headless Service needs none; the DNS answers with the pods
}

TEST_CASE("every worker pod: hostname its own name, subdomain the job's Service, whatever the template says") {
  Json job = program_job({{"spec", {{"template", {{"spec", {{"hostname", "mine"}, {"subdomain", "elsewhere"}}}}}}}});
  const JobSpec spec = parse_job(job).spec;
  WorkerPodBuilder b(job, spec, 1, PodOptions{});
  for (int i : {0, 1}) {
    const Json pod = b.pod(i);
    CHECK(pod["spec"]["hostname"] == "ddp-worker-" + std::to_string(i));
    CHECK(pod["spec"]["subdomain"] == "ddp");
  }
  // The built-in trainer's pods too: the Service and the names are every job's.
  Json trainer = job_with(Json::object());
  const Json tpod = build_worker_pod(trainer, parse_job(trainer).spec, 1, 1, PodOptions{});
  CHECK(tpod["spec"]["hostname"] == "tiny-worker-1");
  CHECK(tpod["spec"]["subdomain"] == job_service_name("tiny"));
}

TEST_CASE("a program's pods learn their DNS domain unless spec.program.addresses is IP; the trainer's never") {
  Json job = program_job();
  JobSpec spec = parse_job(job).spec;
  CHECK(spec.dns_addresses);  // the default
  Json cm = build_env_configmap(job, spec, PodOptions{});
  CHECK(cm["data"][railyard::names::kPodDomainEnv] == "ddp.team-a.svc.cluster.local");
  // As the pod's container resolves it (envFrom of the ConfigMap).
  const Json pod = build_worker_pod(job, spec, 0, 1, PodOptions{});
  CHECK(resolved_env(pod, cm, railyard::names::kPodDomainEnv) ==
        std::optional<std::string>("ddp.team-a.svc.cluster.local"));
  // --cluster-domain.
  PodOptions opts;
  opts.cluster_domain = "corp.example";
  CHECK(build_env_configmap(job, spec, opts)["data"][railyard::names::kPodDomainEnv] == "ddp.team-a.svc.corp.example");
  // IP: no domain, so the agent uses pod IPs; the pods keep their names all the same.
  Json ip = program_job({{"spec", {{"program", {{"addresses", "IP"}}}}}});
  const JobSpec ip_spec = parse_job(ip).spec;
  CHECK_FALSE(ip_spec.dns_addresses);
  CHECK_FALSE(build_env_configmap(ip, ip_spec, PodOptions{})["data"].contains(railyard::names::kPodDomainEnv));
  CHECK(build_worker_pod(ip, ip_spec, 0, 1, PodOptions{})["spec"]["subdomain"] == "ddp");
  CHECK(violation_of(program_job({{"spec", {{"program", {{"addresses", "dns"}}}}}})) ==
        "spec.program.addresses: 'dns' is not one of DNS, IP: use one of DNS, IP");
  Json trainer = job_with(Json::object());
  CHECK_FALSE(build_env_configmap(trainer, parse_job(trainer).spec, PodOptions{})["data"].contains(
      railyard::names::kPodDomainEnv));
}

TEST_CASE("a job name that cannot name a Service or a hostname is refused naming metadata.name and the fix") {
  for (const char* bad : {"1job", "my.job", "Job", "job-", "a_b"}) {
    INFO(bad);
    const std::string v = violation_of(job_with({{"metadata", {{"name", bad}}}}));
    CHECK(v.rfind("metadata.name: '" + std::string(bad) + "' is not a DNS-1035 label", 0) == 0);
    CHECK(v.find("starting with a letter") != std::string::npos);
  }
  for (const char* good : {"a", "tiny", "gpt2-124m", "x9"}) {
    INFO(good);
    CHECK(violation_of(job_with({{"metadata", {{"name", good}}}})) == "");
  }
}

TEST_CASE("pod hostnames fit in 63 characters: a job of more than 1,000 replicas needs a shorter name") {
  const std::string n52(52, 'a'), n51(51, 'a');
  CHECK(worker_hostname_length(52, 1000) == 63);  // <52>-worker-999
  CHECK(worker_hostname_length(52, 1001) == 64);  // <52>-worker-1000
  CHECK(worker_hostname_length(5, 1) == 14);      // <5>-worker-0
  // 1,000 replicas: the longest name is fine.
  CHECK(violation_of(program_job({{"metadata", {{"name", n52}}}, {"spec", {{"replicas", 1000}}}})) == "");
  // 1,001 (or an elastic maximum of 1,001) is not, and the message says how long the name may be.
  Json big =
      program_job({{"metadata", {{"name", n52}}}, {"spec", {{"replicas", 2}, {"elastic", {{"maxReplicas", 1001}}}}}});
  ParsedJob p = parse_job(big);
  REQUIRE(p.violation);
  CHECK(p.violation->field == "metadata.name");
  CHECK(p.violation->message.find("-worker-1000 would be 64 (at most 63): use at most 51 characters for a job of 1001 "
                                  "replicas") != std::string::npos);
  CHECK(violation_of(program_job({{"metadata", {{"name", n51}}}, {"spec", {{"replicas", 10000}}}})) == "");
}
