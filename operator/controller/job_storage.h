// spec.storage: the PersistentVolumeClaim a job owns (docs/storage.md). Pure builders and decisions; the controller
// (Controller::ensure_storage) makes the requests.
#pragma once

#include <optional>
#include <string>

#include "operator/api.h"

namespace railyard::op {

// On the job's claim beside railyard.dev/job: a claim whose job is gone (whenDeleted Retain: it has no owner) is known
// by these two labels as the storage of the job of that name, which reuses it.
inline constexpr const char* kStorageLabel = "railyard.dev/storage";
// What kube-scheduler writes on a claim that waits for its first consumer (volumeBindingMode WaitForFirstConsumer):
// the node the provisioner makes the volume reachable from. The operator writes it when it places the gang itself.
inline constexpr const char* kSelectedNodeAnnotation = "volume.kubernetes.io/selected-node";

// The claim spec.storage asks for: storage_claim_name(job), the job its controller unless whenDeleted is Retain.
Json build_storage_claim(const Json& job, const api::StorageSpec& st);

enum class StorageOwner {
  kThisJob,   // controlled by this job
  kRetained,  // no TrainingJob owner and this job's labels: left by an earlier job of the name (whenDeleted Retain)
  kGoing,     // being deleted, or owned by an earlier job of the name that the garbage collector is taking
  kForeign,   // anything else: never adopted, changed or deleted
};
StorageOwner storage_owner(const Json& claim, const Json& job);

// The merge patch that makes a claim of this job's (kThisJob or kRetained) follow whenDeleted: the job its controller
// (Delete) or no TrainingJob owner (Retain), and the job's labels; nullopt when it already does. Other owners stay.
std::optional<Json> storage_owner_patch(const Json& claim, const Json& job, bool retain);

// Whether a claim waits for the node of its first consumer, which nobody but the operator will name when the operator
// binds the pods itself: unbound, no node selected yet, and its class (nullptr: unknown) binds WaitForFirstConsumer.
bool waits_for_selected_node(const Json& claim, const Json* storage_class);

// "10Gi, class fast-rwx, ReadWriteMany" (or "the default class") for events.
std::string describe_storage(const api::StorageSpec& st);

}  // namespace railyard::op
