// spec.device resolution (worker/device/device.h): pure logic, plus the real device count of this host.
#include <doctest/doctest.h>

#include "worker/device/device.h"
#include "worker/kernels/cuda/cuda_check.h"

using railyard::ConfigError;
using railyard::worker::DeviceKind;
using railyard::worker::resolve_device;

TEST_CASE("auto picks CUDA only when a GPU is visible and the build has CUDA") {
  CHECK(resolve_device("auto", 0, true) == DeviceKind::kCpu);
  CHECK(resolve_device("auto", 2, true) == DeviceKind::kCuda);
  CHECK(resolve_device("auto", 2, false) == DeviceKind::kCpu);
  CHECK(resolve_device("", 1, true) == DeviceKind::kCuda);
  CHECK(resolve_device("cpu", 8, true) == DeviceKind::kCpu);
  CHECK(resolve_device("cuda", 1, true) == DeviceKind::kCuda);
}

TEST_CASE("cuda without a GPU, and unknown values, are refused naming spec.device") {
  CHECK_THROWS_WITH_AS(resolve_device("cuda", 0, true), doctest::Contains("no CUDA device is visible"), ConfigError);
  CHECK_THROWS_WITH_AS(resolve_device("cuda", 4, false), doctest::Contains("built without CUDA"), ConfigError);
  CHECK_THROWS_WITH_AS(resolve_device("gpu", 1, true), doctest::Contains("spec.device: unknown value \"gpu\""),
                       ConfigError);
}

TEST_CASE("this host: auto resolves from the real device count") {
  const int n = railyard::worker::cuda::device_count();
  CHECK(resolve_device("auto", n, true) == (n > 0 ? DeviceKind::kCuda : DeviceKind::kCpu));
}
