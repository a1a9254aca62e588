// spec.storage (docs/storage.md): what the spec accepts and refuses, the claim the operator makes, whose a claim found
// under the job's claim name is, the patch that makes it follow whenDeleted, and the pod's mount.
#include <doctest/doctest.h>

#include "operator/controller/job_storage.h"
#include "operator/controller/pod_builder.h"
#include "tests/unit/operator/job_fixture.h"

using namespace railyard::op;
using railyard::op::testing::job_with;
using Json = nlohmann::json;

namespace {
Json storage_job(const Json& storage) { return job_with({{"spec", {{"storage", storage}}}}); }
}  // namespace

TEST_CASE("quantities: what the API server reads as a size greater than zero") {
  for (const char* q : {"10Gi", "1", "500M", "1.5Ti", ".5Gi", "1e9", "1E", "100k", "2Ki"})
    CHECK_MESSAGE(is_storage_quantity(q), q);
  for (const char* q : {"", "0", "0Gi", "0.0", "-1Gi", "10GB", "10 Gi", "Gi", "1e", "1.2.3", "10gi", "+1Gi"})
    CHECK_MESSAGE(!is_storage_quantity(q), q);
}

TEST_CASE("spec.storage: defaults, and each field read") {
  ParsedJob p = parse_job(storage_job({{"size", "10Gi"}}));
  REQUIRE_FALSE(p.violation);
  REQUIRE(p.spec.storage);
  CHECK(p.spec.storage->size == "10Gi");
  CHECK_FALSE(p.spec.storage->storage_class);
  CHECK(p.spec.storage->access_mode == "ReadWriteMany");
  CHECK(p.spec.storage->mount_path == "/shared");
  CHECK_FALSE(p.spec.storage->retain);
  CHECK_FALSE(parse_job(railyard::op::testing::valid_job()).spec.storage);

  p = parse_job(storage_job({{"size", "1Ti"},
                             {"storageClassName", ""},
                             {"accessMode", "ReadWriteOnce"},
                             {"mountPath", "/mnt/job/"},
                             {"whenDeleted", "Retain"}}));
  REQUIRE_FALSE(p.violation);
  CHECK(p.spec.storage->storage_class == std::optional<std::string>(""));
  CHECK(p.spec.storage->access_mode == "ReadWriteOnce");
  CHECK(p.spec.storage->mount_path == "/mnt/job");  // trailing '/' dropped, as the kubelet reads it
  CHECK(p.spec.storage->retain);
}

TEST_CASE("spec.storage: each bad value names its field and the fix") {
  struct Case {
    Json storage;
    const char* field;
  } cases[] = {
      {"10Gi", "spec.storage"},
      {Json::object(), "spec.storage.size"},
      {{{"size", "0"}}, "spec.storage.size"},
      {{{"size", 10}}, "spec.storage.size"},
      {{{"size", "1Gi"}, {"accessMode", "ReadOnlyMany"}}, "spec.storage.accessMode"},
      {{{"size", "1Gi"}, {"mountPath", "relative"}}, "spec.storage.mountPath"},
      {{{"size", "1Gi"}, {"mountPath", "/"}}, "spec.storage.mountPath"},
      {{{"size", "1Gi"}, {"mountPath", "/data/../etc"}}, "spec.storage.mountPath"},
      {{{"size", "1Gi"}, {"whenDeleted", "Orphan"}}, "spec.storage.whenDeleted"},
      {{{"size", "1Gi"}, {"storageClassName", 3}}, "spec.storage.storageClassName"},
  };
  for (const auto& c : cases) {
    ParsedJob p = parse_job(storage_job(c.storage));
    REQUIRE_MESSAGE(p.violation, c.storage.dump());
    CHECK_MESSAGE(p.violation->field == c.field, c.storage.dump());
    CHECK(p.violation->message.rfind(c.field, 0) == 0);
  }
}

TEST_CASE("spec.storage: a template volume of the same name or a mount at the same path is refused") {
  Json job = storage_job({{"size", "1Gi"}});
  job["spec"]["template"] = {
      {"spec", {{"volumes", Json::array({{{"name", "railyard-storage"}, {"emptyDir", Json::object()}}})}}}};
  ParsedJob p = parse_job(job);
  REQUIRE(p.violation);
  CHECK(p.violation->field == "spec.template.spec.volumes");

  job = storage_job({{"size", "1Gi"}});
  job["spec"]["template"] = {
      {"spec",
       {{"containers", Json::array({{{"name", "worker"},
                                     {"volumeMounts", Json::array({{{"name", "x"}, {"mountPath", "/shared/"}}})}}})}}}};
  p = parse_job(job);
  REQUIRE(p.violation);
  CHECK(p.violation->field == "spec.storage.mountPath");
  CHECK(p.violation->message.find("already mounts /shared") != std::string::npos);
  // Elsewhere it is fine.
  job["spec"]["storage"]["mountPath"] = "/ckpt";
  CHECK_FALSE(parse_job(job).violation);
}

TEST_CASE("the claim: named after the job, labelled, owned unless retained, the class only when given") {
  Json job = storage_job({{"size", "10Gi"}});
  const StorageSpec st = *parse_job(job).spec.storage;
  Json c = build_storage_claim(job, st);
  CHECK(c["kind"] == "PersistentVolumeClaim");
  CHECK(c["metadata"]["name"] == "tiny-storage");
  CHECK(c["metadata"]["namespace"] == "team-a");
  CHECK(c["metadata"]["labels"] == Json{{"railyard.dev/job", "tiny"}, {"railyard.dev/storage", "true"}});
  REQUIRE(c["metadata"]["ownerReferences"].size() == 1);
  CHECK(c["metadata"]["ownerReferences"][0]["uid"] == "uid-1");
  CHECK(c["metadata"]["ownerReferences"][0]["controller"] == true);
  CHECK(c["spec"]["accessModes"] == Json::array({"ReadWriteMany"}));
  CHECK(c["spec"]["resources"]["requests"]["storage"] == "10Gi");
  CHECK_FALSE(c["spec"].contains("storageClassName"));  // the default class, by the API server's admission

  StorageSpec kept = st;
  kept.retain = true;
  kept.storage_class = "";
  c = build_storage_claim(job, kept);
  CHECK_FALSE(c["metadata"].contains("ownerReferences"));
  CHECK(c["spec"]["storageClassName"] == "");
}

TEST_CASE("whose a claim is, and the patch that makes it follow whenDeleted") {
  Json job = storage_job({{"size", "10Gi"}});
  const StorageSpec st = *parse_job(job).spec.storage;
  Json ours = build_storage_claim(job, st);
  ours["metadata"]["resourceVersion"] = "7";
  CHECK(storage_owner(ours, job) == StorageOwner::kThisJob);
  CHECK_FALSE(storage_owner_patch(ours, job, false));

  // Retain on a running job: the job's ownership goes, other owners stay.
  Json shared = ours;
  shared["metadata"]["ownerReferences"].push_back(
      {{"apiVersion", "v1"}, {"kind", "ConfigMap"}, {"name", "x"}, {"uid", "u"}});
  auto patch = storage_owner_patch(shared, job, true);
  REQUIRE(patch);
  CHECK((*patch)["metadata"]["ownerReferences"] == Json::array({shared["metadata"]["ownerReferences"][1]}));
  CHECK((*patch)["metadata"]["resourceVersion"] == "7");
  patch = storage_owner_patch(ours, job, true);
  REQUIRE(patch);
  CHECK((*patch)["metadata"]["ownerReferences"].is_null());  // the merge patch removes the list

  // Left behind by a job of this name (no owner, its labels): reused, and owned again under Delete.
  Json retained = ours;
  retained["metadata"].erase("ownerReferences");
  CHECK(storage_owner(retained, job) == StorageOwner::kRetained);
  CHECK_FALSE(storage_owner_patch(retained, job, true));
  patch = storage_owner_patch(retained, job, false);
  REQUIRE(patch);
  CHECK((*patch)["metadata"]["ownerReferences"][0]["uid"] == "uid-1");

  // Another job of this name (an earlier uid) owns it: the garbage collector takes it; being deleted: the same.
  Json earlier = ours;
  earlier["metadata"]["ownerReferences"][0]["uid"] = "uid-0";
  CHECK(storage_owner(earlier, job) == StorageOwner::kGoing);
  Json deleting = ours;
  deleting["metadata"]["deletionTimestamp"] = "2026-12-06T00:00:00Z";
  CHECK(storage_owner(deleting, job) == StorageOwner::kGoing);

  // Someone else's: another job's labels, no labels, or a uid copied without being the controller.
  Json foreign = retained;
  foreign["metadata"]["labels"]["railyard.dev/job"] = "other";
  CHECK(storage_owner(foreign, job) == StorageOwner::kForeign);
  foreign["metadata"].erase("labels");
  CHECK(storage_owner(foreign, job) == StorageOwner::kForeign);
  Json copied = ours;
  copied["metadata"]["ownerReferences"][0]["controller"] = false;
  copied["metadata"]["ownerReferences"][0]["kind"] = "ConfigMap";
  copied["metadata"].erase("labels");
  CHECK(storage_owner(copied, job) == StorageOwner::kForeign);
}

TEST_CASE("a class that waits for its first consumer gets a node, once, while the claim is unbound") {
  const Json wffc = {{"volumeBindingMode", "WaitForFirstConsumer"}};
  const Json immediate = {{"volumeBindingMode", "Immediate"}};
  Json claim = {{"metadata", {{"name", "tiny-storage"}}}, {"spec", Json::object()}, {"status", {{"phase", "Pending"}}}};
  CHECK(waits_for_selected_node(claim, &wffc));
  CHECK_FALSE(waits_for_selected_node(claim, &immediate));
  CHECK_FALSE(waits_for_selected_node(claim, nullptr));
  Json selected = claim;
  selected["metadata"]["annotations"] = {{"volume.kubernetes.io/selected-node", "n1"}};
  CHECK_FALSE(waits_for_selected_node(selected, &wffc));
  Json bound = claim;
  bound["spec"]["volumeName"] = "pv-1";
  CHECK_FALSE(waits_for_selected_node(bound, &wffc));
}

TEST_CASE("worker pods mount the claim at mountPath, beside the template's own volumes") {
  Json job = storage_job({{"size", "1Gi"}, {"mountPath", "/ckpt"}});
  job["spec"]["template"] = {{"spec", {{"volumes", Json::array({{{"name", "data"}, {"emptyDir", Json::object()}}})}}}};
  ParsedJob p = parse_job(job);
  REQUIRE_FALSE(p.violation);
  Json pod = WorkerPodBuilder(job, p.spec, 1, railyard::op::testing::pod_options()).pod(1);
  const Json& volumes = pod["spec"]["volumes"];
  auto volume =
      std::find_if(volumes.begin(), volumes.end(), [](const Json& v) { return v["name"] == "railyard-storage"; });
  REQUIRE(volume != volumes.end());
  CHECK((*volume)["persistentVolumeClaim"]["claimName"] == "tiny-storage");
  CHECK(std::any_of(volumes.begin(), volumes.end(), [](const Json& v) { return v["name"] == "data"; }));
  const Json& mounts = pod["spec"]["containers"][0]["volumeMounts"];
  CHECK(std::any_of(mounts.begin(), mounts.end(),
                    [](const Json& m) { return m["name"] == "railyard-storage" && m["mountPath"] == "/ckpt"; }));
  // No spec.storage, no such volume.
  Json plain = railyard::op::testing::valid_job();
  Json plain_pod = WorkerPodBuilder(plain, parse_job(plain).spec, 1, railyard::op::testing::pod_options()).pod(0);
  for (const Json& v : plain_pod["spec"]["volumes"]) CHECK(v["name"] != "railyard-storage");
}
