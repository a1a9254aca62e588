// Slow-start batches for creating many objects (the Kubernetes Job controller's slowStartBatch): calls run in
// batches of 1, 2, 4, ... whose calls go concurrently, and the first batch with a failure ends the run, so a
// template the API server refuses costs one request instead of a thousand while a good one reaches full speed
// after a few round trips.
#pragma once

#include <exception>
#include <functional>
#include <vector>

namespace railyard::op {

// Batch sizes for `count` calls starting at `initial`: initial, 2*initial, ... the last one cut to what is left.
std::vector<int> slow_start_batches(int count, int initial = 1);

struct SlowStartResult {
  int succeeded = 0;               // calls that returned normally
  int attempted = 0;               // calls made, failed ones included
  std::exception_ptr first_error;  // the failure of the lowest index in the failing batch; null if none
  std::vector<int> batches;        // sizes of the batches that ran
};

// Calls fn(i) once for each i in [0, count), batch by batch (slow_start_batches), a batch's calls on up to
// `parallelism` threads at once. A batch in which a call throws is finished (its other calls still run: they are
// in flight) and no later batch starts. fn must be thread-safe; it is never called twice for one index.
SlowStartResult run_slow_start(int count, int parallelism, const std::function<void(int)>& fn, int initial = 1);

}  // namespace railyard::op
