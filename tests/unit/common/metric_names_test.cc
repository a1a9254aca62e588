// common/metrics/names.h: one name, one type. The list is checked here (unique, the naming rules), the type at
// compile time (a registry takes a name only as its own type) and against the consumers by contracts_check.
#include <doctest/doctest.h>

#include <set>
#include <stdexcept>
#include <string>

#include "common/metrics/metrics.h"
#include "common/metrics/names.h"

using namespace railyard::metrics;

namespace {

template <typename N>
concept CounterTakes = requires(Registry& r, N n) {
  r.counter(n, std::string());
};
template <typename N>
concept GaugeTakes = requires(Registry& r, N n) {
  r.gauge(n, std::string());
};
template <typename N>
concept HistogramTakes = requires(Registry& r, N n) {
  r.histogram(n, std::string(), std::vector<double>{1});
};

// A name can be registered only as the type it is defined with.
static_assert(CounterTakes<CounterName> && !CounterTakes<GaugeName> && !CounterTakes<HistogramName>);
static_assert(GaugeTakes<GaugeName> && !GaugeTakes<CounterName> && !GaugeTakes<HistogramName>);
static_assert(HistogramTakes<HistogramName> && !HistogramTakes<CounterName> && !HistogramTakes<GaugeName>);

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

TEST_CASE("every metric name is defined once, valid, and follows the naming rules of its type") {
  std::set<std::string> seen;
  for (const AnyName& n : names::kAll) {
    const std::string name = n.name;
    CAPTURE(name);
    CHECK(seen.insert(name).second);
    CHECK_NOTHROW(validate_metric_name(name));
    if (n.type == Type::Counter) {
      CHECK(ends_with(name, "_total"));
    } else {
      CHECK_FALSE(ends_with(name, "_total"));
    }
    for (const char* suffix : {"_sum", "_count", "_bucket"}) CHECK_FALSE(ends_with(name, suffix));
  }
  // No name is another's histogram series.
  for (const AnyName& n : names::kAll)
    if (n.type == Type::Histogram)
      for (const std::string& s : {sum_series(HistogramName{n.name}), count_series(HistogramName{n.name}),
                                   bucket_series(HistogramName{n.name})})
        CHECK(seen.count(s) == 0);
  CHECK(seen.size() > 50);
}

TEST_CASE("a typed name registers as its type, and the same name as another type is refused") {
  Registry r;
  auto& steps = r.counter(names::kWorkerStepsTotal, "steps");
  CHECK(&r.counter(names::kWorkerStepsTotal, "steps") == &steps);  // the same family again
  CHECK_THROWS_AS(r.gauge(names::kWorkerStepsTotal.name, "as a gauge"), std::invalid_argument);
  r.histogram(names::kWorkerStepDuration, "step time", names::worker_step_duration_buckets()).add({}).observe(0.5);
  const std::string text = r.serialize();
  CHECK(text.find("# TYPE railyard_worker_steps_total counter") != std::string::npos);
  CHECK(text.find("# TYPE railyard_worker_step_duration_seconds histogram") != std::string::npos);
  CHECK(text.find(sum_series(names::kWorkerStepDuration) + " 0.5") != std::string::npos);
}
