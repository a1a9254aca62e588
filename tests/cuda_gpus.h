// The GPU gate of the tests that need several CUDA devices (label gpu; tests/gpu/run.sh runs them): without enough
// they say why and exit 77, which CTest reports as Skipped, never Passed.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>

namespace railyard::test {

// The CUDA devices this process can use (0 when the runtime reports an error: no driver, no device).
inline int usable_gpus() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

// Exits 77 with a message naming `test` and `what` needs unless `need` devices are usable; returns how many are.
inline int require_gpus(const char* test, int need, const char* what) {
  const int have = usable_gpus();
  if (have >= need) return have;
  std::fprintf(
      stderr,
      "%s: SKIPPED: %d usable CUDA device(s); %s needs %d or more (one GPU per rank: run tests/gpu/run.sh on a "
      "multi-GPU machine)\n",
      test, have, what, need);
  std::exit(77);
}

}  // namespace railyard::test
