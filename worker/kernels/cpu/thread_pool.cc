#include "worker/kernels/cpu/thread_pool.h"

#include <sched.h>

#include <cstdlib>
#include <string>

#include "common/error.h"
#include "common/pod_env.h"

namespace railyard::worker {

int default_num_threads() {
  if (const char* env = std::getenv(pod_env::kNumThreads); env != nullptr && *env != '\0') {
    char* end = nullptr;
    long n = std::strtol(env, &end, 10);
    if (*end != '\0' || n <= 0 || n > 4096) {
      throw ConfigError(std::string("RAILYARD_NUM_THREADS='") + env + "' is not a positive integer: set it to the " +
                        "number of cores to use, or unset it to use the process's CPU affinity");
    }
    return static_cast<int>(n);
  }
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  unsigned hw = std::thread::hardware_concurrency();
  return hw > 0 ? static_cast<int>(hw) : 1;
}

ThreadPool::ThreadPool(int num_threads) : num_threads_(num_threads < 1 ? 1 : num_threads) {
  workers_.reserve(num_threads_ - 1);
  for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::worker_loop(int index) {
  unsigned long seen = 0;
  for (;;) {
    const FunctionRef<void(int)>* job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      start_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
    }
    (*job)(index);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0) done_cv_.notify_one();
    }
  }
}

void ThreadPool::run(FunctionRef<void(int)> fn) {
  if (num_threads_ == 1) {
    fn(0);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &fn;
    pending_ = num_threads_ - 1;
    ++generation_;
  }
  start_cv_.notify_all();
  fn(0);
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return pending_ == 0; });
  job_ = nullptr;
}

void ThreadPool::parallel_for(size_t n, FunctionRef<void(size_t, size_t)> fn) {
  parallel_for_indexed(n, [&](size_t begin, size_t end, int) { fn(begin, end); });
}

void ThreadPool::parallel_for_indexed(size_t n, FunctionRef<void(size_t, size_t, int)> fn) {
  if (n == 0) return;
  const size_t nt = static_cast<size_t>(num_threads_);
  if (nt == 1 || n == 1) {
    fn(0, n, 0);
    return;
  }
  run([&](int t) {
    size_t begin = n * static_cast<size_t>(t) / nt, end = n * (static_cast<size_t>(t) + 1) / nt;
    if (begin < end) fn(begin, end, t);
  });
}

}  // namespace railyard::worker
