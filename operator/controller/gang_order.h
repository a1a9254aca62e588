// Which waiting gang goes first when the operator places (spec.placement.scheduler railyard): kube-scheduler's
// PrioritySort for whole gangs. A gang's priority is what the Priority admission plugin gives its pods (the template's
// priorityClassName, else the cluster's global default class, else 0); equal priorities go in creation order.
//
// Data flow: the controller reads the PriorityClass and TrainingJob informers, keeps the jobs that wait for nodes
// (waiting_gang) and go before the job it places (goes_before), and hands them to the placement as
// PlacementRequest::ahead; ReservingPlacement books each one that fits before it places the job (placement.h).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace railyard::op {

using Json = nlohmann::json;

struct GangOrder {
  int64_t priority = 0;
  std::string created;  // metadata.creationTimestamp (RFC 3339, UTC: compares as text)
  std::string key;      // "ns/name": the last tie-break, so the order is total
};

// Higher priority first, then the older job, then the key.
bool goes_before(const GangOrder& a, const GangOrder& b);

// The priority of the pods a TrainingJob's template makes: the value of the PriorityClass named by
// spec.template.spec.priorityClassName; without a name, the globalDefault class's (the lowest value if several are,
// as the admission plugin picks), else 0. A name no class has gives 0 (the API server refuses such pods anyway).
// `classes`: scheduling.k8s.io/v1 PriorityClass objects.
int64_t job_priority(const Json& job, const std::vector<const Json*>& classes);

GangOrder gang_order(const Json& job, const std::vector<const Json*>& classes);

// True when the job (as the cache holds it) still wants its gang placed by Railyard and could take nodes now: not
// being deleted, not finished, not suspended, not held Invalid. Whether it already has pods is the caller's check.
bool waiting_gang(const Json& job);

}  // namespace railyard::op
