#include "operator/controller/slow_start.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>

namespace railyard::op {

std::vector<int> slow_start_batches(int count, int initial) {
  std::vector<int> out;
  int size = std::max(1, initial);
  for (int left = std::max(0, count); left > 0;) {
    int b = std::min(size, left);
    out.push_back(b);
    left -= b;
    // Doubling stops growing once it passes what any caller could want; avoids overflow for huge counts.
    if (size < (1 << 20)) size *= 2;
  }
  return out;
}

SlowStartResult run_slow_start(int count, int parallelism, const std::function<void(int)>& fn, int initial) {
  SlowStartResult r;
  int base = 0;
  for (int size : slow_start_batches(count, initial)) {
    r.batches.push_back(size);
    std::atomic<int> next{0};
    std::mutex mu;
    int failed_index = -1;
    std::exception_ptr failed;
    int ok = 0;
    auto work = [&] {
      for (int k; (k = next.fetch_add(1)) < size;) {
        try {
          fn(base + k);
          std::lock_guard<std::mutex> l(mu);
          ok++;
        } catch (...) {
          std::lock_guard<std::mutex> l(mu);
          if (failed_index < 0 || base + k < failed_index) {
            failed_index = base + k;
            failed = std::current_exception();
          }
        }
      }
    };
    const int threads = std::clamp(parallelism, 1, size);
    if (threads == 1) {
      work();  // a batch of one (the first probe) needs no thread
    } else {
      std::vector<std::thread> pool;
      pool.reserve(threads - 1);
      for (int t = 1; t < threads; ++t) pool.emplace_back(work);
      work();
      for (auto& t : pool) t.join();
    }
    r.attempted += size;
    r.succeeded += ok;
    base += size;
    if (failed) {
      r.first_error = failed;
      break;
    }
  }
  return r;
}

}  // namespace railyard::op
