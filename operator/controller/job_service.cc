#include "operator/controller/job_service.h"

#include "common/wellknown.h"

namespace railyard::op {

Json build_job_service(const Json& job) {
  const std::string job_name = job["metadata"].value("name", "");
  return {
      {"apiVersion", "v1"},
      {"kind", "Service"},
      {"metadata",
       {{"name", job_service_name(job_name)},
        {"namespace", job["metadata"].value("namespace", "")},
        {"labels", {{wellknown::kJobLabel, job_name}}},
        {"ownerReferences", Json::array({owner_reference(job)})}}},
      {"spec",
       {{"clusterIP", "None"}, {"selector", {{wellknown::kJobLabel, job_name}}}, {"publishNotReadyAddresses", true}}}};
}

}  // namespace railyard::op
