// A small fork-join pool for the CPU kernels.
//
// Why our own pool and not OpenMP or OpenBLAS's threads: the GEMMs and our loops take turns many times per step,
// and two pools that spin after each region steal the cores from each other (notes/dependencies.md, section 4).
// Here OpenBLAS runs single-threaded inside our regions and our workers block on a condition variable between
// regions, so exactly one thread per core is ever runnable. Work is split statically by task index, so results
// do not depend on scheduling (bitwise reproducible for a given thread count).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace railyard::worker {

// A non-owning reference to a callable (like C++26 std::function_ref): unlike std::function it never allocates,
// so a kernel launch costs no heap traffic. The callable must outlive the call it is passed to.
template <typename Sig>
class FunctionRef;
template <typename R, typename... Args>
class FunctionRef<R(Args...)> {
 public:
  template <typename F>
  requires(!std::is_same_v<std::remove_cvref_t<F>, FunctionRef>)
      FunctionRef(F&& f)  // NOLINT(google-explicit-constructor): implicit, as std::function
      : obj_(const_cast<void*>(static_cast<const void*>(&f))), call_([](void* o, Args... a) -> R {
          return (*static_cast<std::remove_reference_t<F>*>(o))(std::forward<Args>(a)...);
        }) {}
  R operator()(Args... a) const { return call_(obj_, std::forward<Args>(a)...); }

 private:
  void* obj_;
  R (*call_)(void*, Args...);
};

// Threads the worker should use: RAILYARD_NUM_THREADS if set (must be a positive integer), else the number of
// CPUs in this process's affinity mask (sched_getaffinity), which respects cgroup cpusets and taskset.
int default_num_threads();

class ThreadPool {
 public:
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return num_threads_; }

  // Calls fn(thread_index) once on each of the pool's threads (the caller is thread 0) and returns when all are
  // done. Not reentrant: fn must not call run() again.
  void run(FunctionRef<void(int)> fn);

  // Splits [0, n) into size() contiguous chunks (chunk i goes to thread i) and calls fn(begin, end) for the
  // non-empty ones. The split depends only on n and size().
  void parallel_for(size_t n, FunctionRef<void(size_t, size_t)> fn);
  // Same split, and fn also gets the thread index (for per-thread scratch buffers).
  void parallel_for_indexed(size_t n, FunctionRef<void(size_t, size_t, int)> fn);

 private:
  void worker_loop(int index);

  int num_threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable start_cv_;
  std::condition_variable done_cv_;
  const FunctionRef<void(int)>* job_ = nullptr;
  unsigned long generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
};

}  // namespace railyard::worker
