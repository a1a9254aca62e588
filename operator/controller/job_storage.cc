#include "operator/controller/job_storage.h"

#include "common/kube/client.h"
#include "common/wellknown.h"
#include "operator/controller/pod_builder.h"
#include "operator/controller/pod_state.h"

namespace railyard::op {

namespace {

Json storage_labels(const std::string& job_name) { return {{wellknown::kJobLabel, job_name}, {kStorageLabel, "true"}}; }

}  // namespace

Json build_storage_claim(const Json& job, const api::StorageSpec& st) {
  const std::string name = kube::name_of(job);
  Json meta = {{"name", api::storage_claim_name(name)},
               {"namespace", kube::namespace_of(job)},
               {"labels", storage_labels(name)}};
  if (!st.retain) meta["ownerReferences"] = Json::array({owner_reference(job)});
  Json spec = {{"accessModes", Json::array({st.access_mode})}, {"resources", {{"requests", {{"storage", st.size}}}}}};
  if (st.storage_class) spec["storageClassName"] = *st.storage_class;
  return {{"apiVersion", "v1"}, {"kind", "PersistentVolumeClaim"}, {"metadata", meta}, {"spec", spec}};
}

StorageOwner storage_owner(const Json& claim, const Json& job) {
  const Json& meta = kube::field(claim, "metadata");
  if (meta.contains("deletionTimestamp")) return StorageOwner::kGoing;
  switch (claim_of(claim, job["metadata"].value("uid", ""))) {
    case Claim::kOurs:
      return StorageOwner::kThisJob;
    case Claim::kEarlierJob:
      return StorageOwner::kGoing;  // the garbage collector takes it with its job
    case Claim::kForeign:
      break;  // retained by a job of this name (its labels), or someone else's
  }
  const Json& labels = kube::field(meta, "labels");
  const Json want = storage_labels(kube::name_of(job));
  bool labelled = labels.is_object();
  for (auto it = want.begin(); labelled && it != want.end(); ++it)
    labelled = labels.contains(it.key()) && labels[it.key()] == it.value();
  return labelled ? StorageOwner::kRetained : StorageOwner::kForeign;
}

std::optional<Json> storage_owner_patch(const Json& claim, const Json& job, bool retain) {
  const Json& meta = kube::field(claim, "metadata");
  const Json& refs = kube::field(meta, "ownerReferences");
  Json kept = Json::array();
  bool ours = false;
  if (refs.is_array())
    for (const Json& r : refs) {
      if (!is_training_job_ref(r)) {
        kept.push_back(r);
        continue;
      }
      if (!retain && r.value("uid", Json()) == job["metadata"].value("uid", Json()) && !ours) {
        kept.push_back(r);
        ours = true;
      }
    }
  if (!retain && !ours) kept.push_back(owner_reference(job));
  Json patch = Json::object();
  if (kept != (refs.is_array() ? refs : Json::array()))
    patch["metadata"]["ownerReferences"] = kept.empty() ? Json(nullptr) : kept;
  const Json& labels = kube::field(meta, "labels");
  const Json want = storage_labels(kube::name_of(job));
  for (auto it = want.begin(); it != want.end(); ++it)
    if (!labels.is_object() || labels.value(it.key(), Json()) != it.value())
      patch["metadata"]["labels"][it.key()] = it.value();
  if (patch.empty()) return std::nullopt;
  // Against the version read: a claim changed meanwhile is compared again (409) instead of overwritten.
  patch["metadata"]["resourceVersion"] = meta.value("resourceVersion", "");
  return patch;
}

bool waits_for_selected_node(const Json& claim, const Json* storage_class) {
  if (!storage_class || kube::field(*storage_class, "volumeBindingMode") != "WaitForFirstConsumer") return false;
  const Json& spec = kube::field(claim, "spec");
  const Json& volume = kube::field(spec, "volumeName");
  if (volume.is_string() && !volume.get<std::string>().empty()) return false;
  if (kube::field(kube::field(claim, "status"), "phase") == "Bound") return false;
  const Json& annotations = kube::field(kube::field(claim, "metadata"), "annotations");
  return !(annotations.is_object() && annotations.contains(kSelectedNodeAnnotation));
}

std::string describe_storage(const api::StorageSpec& st) {
  return st.size + ", " +
         (!st.storage_class           ? std::string("the default class")
          : st.storage_class->empty() ? std::string("no class")
                                      : "class " + *st.storage_class) +
         ", " + st.access_mode + ", mounted at " + st.mount_path + (st.retain ? ", retained after the job" : "");
}

}  // namespace railyard::op
