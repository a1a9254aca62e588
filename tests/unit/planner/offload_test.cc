// Optimizer offload in the planner (docs/planner.md "Optimizer offload"): the memory that moves to the host, the
// host update's time and how much of it the next forward hides, against hand-computed values; the layouts it is
// allowed with; and the search choosing it only when the state does not fit in device memory.
#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include "common/error.h"
#include "planner/calibration.h"
#include "planner/cost_model.h"
#include "planner/search.h"

using namespace railyard::plan;

namespace {

// gpt2-1.5b, no dropout (the CPU worker's model), on one process of the cpu profile.
Job gpt2_xl() { return Job{ModelShape{"gpt2-1.5b", 48, 1600, 25, 1024, 50257, false}, 1, 0}; }

Cluster one_cpu(double memory_bytes = 0) {
  Cluster c;
  c.device = builtin_profile("cpu");
  if (memory_bytes > 0) c.device.memory_bytes = memory_bytes;
  c.gpus = 1;
  c.topology.gpus_per_node = 1;
  return c;
}

}  // namespace

TEST_CASE("offload update time: copies over the host link, then AdamW at host memory bandwidth") {
  DeviceProfile d;
  d.origin = "test";
  d.weight_bytes = 2;
  d.grad_bytes = 4;
  d.optimizer_step_bytes = 30;
  d.host_link_bandwidth = 2e10;
  d.host_memory_bandwidth = 5e10;
  // 1e9 parameters: (4 + 2) GB over 20 GB/s = 0.3 s; 30 GB at 50 GB/s = 0.6 s.
  CHECK(offload_update_seconds(d, 1e9) == doctest::Approx(0.9));
  // A quarter (the embedding) is waited for whole: 0.225 s; the other 0.675 s overlap a forward of 0.5 s.
  CHECK(offload_exposed_seconds(0.9, 0.25, 0.5) == doctest::Approx(0.225 + 0.175));
  CHECK(offload_exposed_seconds(0.9, 0.25, 2.0) == doctest::Approx(0.225));  // all but the first group hidden
  d.host_link_bandwidth = 0;
  CHECK_THROWS_WITH_AS(offload_update_seconds(d, 1e9), doctest::Contains("host_link_bandwidth"), railyard::ConfigError);
}

TEST_CASE("offload moves the optimizer state off the device; the step pays the exposed host update") {
  const Job job = gpt2_xl();
  const Cluster c = one_cpu();
  Layout in_memory;
  Layout offload;
  offload.offload = true;
  const Estimate a = estimate(job, c, in_memory), b = estimate(job, c, offload);
  const double P = a.params_per_gpu;
  CHECK(P == doctest::Approx(parameter_count(job.model)));
  // cpu profile: weights 4, gradients 4, AdamW m + v 8 bytes per parameter.
  CHECK(a.memory.optimizer == doctest::Approx(8 * P));
  CHECK(b.memory.optimizer == 0);
  CHECK(b.memory.host == doctest::Approx(8 * P + 4 * P));  // state + the gradient copy it updates from
  CHECK(a.memory.host == 0);
  CHECK(b.memory.params == a.memory.params);
  CHECK(b.memory.grads == a.memory.grads);
  CHECK(b.memory.activations == a.memory.activations);
  CHECK(a.memory.total() - b.memory.total() == doctest::Approx(8 * P));
  // Time: the whole host update (cpu profile: link and host memory both 27.6 GB/s): P * (8 + 32) / 27.6e9.
  CHECK(b.time.offload == doctest::Approx(P * 40 / 2.76148e10));
  const double share = (50257.0 * 1600 + 1024.0 * 1600) / P;
  CHECK(b.time.optimizer >= share * b.time.offload * (1 - 1e-9));
  CHECK(b.time.optimizer <= b.time.offload);
  CHECK(b.time.compute == a.time.compute);
  CHECK(b.time.step == doctest::Approx(a.time.step - a.time.optimizer + b.time.optimizer));
  CHECK(describe(b.layout).find("offload") != std::string::npos);
}

TEST_CASE("offload is refused with ZeRO, tensor and pipeline parallelism (what the worker runs)") {
  Job job = gpt2_xl();
  job.global_batch = 8;
  Cluster c = one_cpu();
  c.gpus = 8;
  c.topology.gpus_per_node = 8;
  Layout l{8, 1, 1, 1, 1};
  l.offload = true;
  CHECK(check_layout(job, c, l).find("offload runs with zero 0") != std::string::npos);
  l = Layout{4, 1, 2, 1, 0};
  l.offload = true;
  CHECK(check_layout(job, c, l).find("offload") != std::string::npos);
  l = Layout{8, 1, 1, 1, 0};
  l.offload = true;
  CHECK(check_layout(job, c, l) == "");
}

TEST_CASE("the search offloads only a layout whose state does not fit") {
  const Job job = gpt2_xl();
  Layout in_memory, off;
  off.offload = true;
  const double need_in = estimate(job, one_cpu(), in_memory).memory.total();
  const double need_off = estimate(job, one_cpu(), off).memory.total();
  REQUIRE(need_off < need_in);
  const double usable = builtin_profile("cpu").usable_memory_fraction;
  SearchOptions o;
  o.recompute = Recompute::kNone;  // recomputation would be another way to fit
  // Between the two: only the offloaded layout fits, and the search picks it.
  const Cluster tight = one_cpu((need_in + need_off) / 2 / usable);
  SearchResult r = search(job, tight, o);
  REQUIRE(r.plans.size() == 1);
  CHECK(r.plans[0].estimate.layout.offload);
  CHECK(r.plans[0].estimate.fits);
  // Pinned off: nothing fits.
  o.offload = false;
  r = search(job, tight, o);
  CHECK(r.plans.empty());
  REQUIRE(r.smallest_nonfitting);
  CHECK_FALSE(r.smallest_nonfitting->layout.offload);
  // Enough memory: no offload (it only adds the host update).
  o.offload.reset();
  r = search(job, one_cpu(2 * need_in / usable), o);
  REQUIRE(!r.plans.empty());
  CHECK_FALSE(r.plans[0].estimate.layout.offload);
  // Pinned on with enough memory: offloaded all the same.
  o.offload = true;
  r = search(job, one_cpu(2 * need_in / usable), o);
  REQUIRE(!r.plans.empty());
  CHECK(r.plans[0].estimate.layout.offload);
}
