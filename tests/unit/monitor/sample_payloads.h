// Sample inputs of the monitor's parsers: what parsers_test.cc checks field by field, and what the fuzz targets start
// from (tests/fuzz/make_seeds.cc writes them into the seed corpora).
#pragma once

namespace railyard::monitor::testing {

// An Alertmanager v4 webhook body: rank 1 of job j firing RailyardJobStalled, and another alert resolved.
inline constexpr const char* kAlertmanagerFiring =
    R"({"version":"4","groupKey":"{}:{alertname=\"X\"}","status":"firing",
    "receiver":"railyard","groupLabels":{},"commonLabels":{},"commonAnnotations":{},"externalURL":"http://am",
    "truncatedAlerts":0,"alerts":[
      {"status":"firing","labels":{"alertname":"RailyardJobStalled","namespace":"ns","trainingjob":"j","rank":"1"},
       "annotations":{"summary":"stalled"},"startsAt":"2026-11-22T03:00:00Z","endsAt":"0001-01-01T00:00:00Z",
       "generatorURL":"http://p","fingerprint":"abc"},
      {"status":"resolved","labels":{"alertname":"Other"}}]})";

// A Prometheus instant-query response: a vector with labels, a NaN loss and an +Inf without a name.
inline constexpr const char* kQueryVector = R"({"status":"success","data":{"resultType":"vector","result":[
        {"metric":{"__name__":"railyard_worker_step","job":"j","rank":"0"},"value":[1700000000.5,"12"]},
        {"metric":{"__name__":"railyard_worker_loss","rank":"1"},"value":[1700000000.5,"NaN"]},
        {"metric":{},"value":[1,"+Inf"]}]}})";

}  // namespace railyard::monitor::testing
