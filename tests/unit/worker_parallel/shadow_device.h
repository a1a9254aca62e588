// The device-memory communicator of the worker/parallel device tests (issue #11): DeviceComm is a real (Gloo)
// communicator that takes the addresses of a ShadowCpu (tests/unit/worker/shadow_cpu.h), as NCCL takes CUDA memory, on
// its own "stream": it does not wait for the device's deferred kernels, so a collective handed a buffer without
// synchronize() first sends stale values (checked by removing GptStage::all_reduce's synchronize(): 9 of 17
// stage-device test cases fail). take_device_memory puts a model's groups behind such wrappers.
#pragma once

#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "tests/unit/worker/shadow_cpu.h"
#include "tests/unit/worker_parallel/trainer_test_util.h"
#include "worker/comm/communicator.h"
#include "worker/parallel/data_parallel.h"
#include "worker/parallel/parallel_model.h"
#include "worker/train/trainer.h"

namespace railyard::worker::testing {

// A real (Gloo) communicator that takes device addresses of one ShadowCpu, as NCCL takes CUDA memory.
class DeviceComm final : public comm::Communicator {
 public:
  DeviceComm(comm::Communicator& c, const ShadowCpu& dev) : c_(c), dev_(dev) {}
  // A group split from a wrapper (expert parallelism's ep and expert-dp groups): it takes device addresses too, and
  // its device operations count in the wrapper it was split from as well (subtree_calls).
  DeviceComm(std::unique_ptr<comm::Communicator> owned, const ShadowCpu& dev, DeviceComm* parent)
      : owned_(std::move(owned)), c_(*owned_), dev_(dev), parent_(parent) {}
  int rank() const override { return c_.rank(); }
  int size() const override { return c_.size(); }
  const std::string& name() const override { return c_.name(); }
  std::chrono::milliseconds timeout() const override { return c_.timeout(); }
  void all_reduce(void* b, size_t n, comm::DType t, comm::ReduceOp op) override {
    ++device_calls_if(b);
    c_.all_reduce(dev_.view(b), n, t, op);
  }
  void reduce_scatter(const void* i, void* o, size_t n, comm::DType t, comm::ReduceOp op) override {
    ++device_calls_if(i);
    c_.reduce_scatter(dev_.view(i), dev_.view(o), n, t, op);
  }
  void all_gather(const void* i, void* o, size_t n, comm::DType t) override {
    ++device_calls_if(i);
    c_.all_gather(dev_.view(i), dev_.view(o), n, t);
  }
  void broadcast(void* b, size_t n, comm::DType t, int root) override { c_.broadcast(dev_.view(b), n, t, root); }
  void all_to_all(const void* i, void* o, size_t n, comm::DType t) override {
    ++device_calls_if(i);
    c_.all_to_all(dev_.view(i), dev_.view(o), n, t);
  }
  std::unique_ptr<comm::Request> isend(const void* b, size_t n, comm::DType t, int peer, uint32_t tag) override {
    ++device_calls_if(b);
    return c_.isend(dev_.view(b), n, t, peer, tag);
  }
  std::unique_ptr<comm::Request> irecv(void* b, size_t n, comm::DType t, int peer, uint32_t tag) override {
    ++device_calls_if(b);
    return c_.irecv(dev_.view(b), n, t, peer, tag);
  }
  void barrier() override { c_.barrier(); }
  std::unique_ptr<Communicator> split(const std::vector<int>& r, const std::string& n) override {
    return std::make_unique<DeviceComm>(c_.split(r, n), dev_, this);
  }
  void abort() override { c_.abort(); }
  size_t device_calls = 0;   // operations on device memory
  size_t subtree_calls = 0;  // the same, here and in every group split from this one

 private:
  size_t& device_calls_if(const void* p) {
    static thread_local size_t sink = 0;
    if (!dev_.owns(p)) return sink;
    for (DeviceComm* c = this; c != nullptr; c = c->parent_) ++c->subtree_calls;
    return device_calls;
  }
  std::unique_ptr<comm::Communicator> owned_;
  comm::Communicator& c_;
  const ShadowCpu& dev_;
  DeviceComm* parent_ = nullptr;  // must outlive this group
};

// Puts the model's groups behind DeviceComm wrappers (the groups then take the device's addresses).
inline std::vector<std::unique_ptr<DeviceComm>> take_device_memory(parallel::ModelGroups& mg, const ShadowCpu& dev) {
  std::vector<std::unique_ptr<DeviceComm>> wrapped;
  for (comm::Communicator** c : {&mg.tp, &mg.pp, &mg.embedding, &mg.cp}) {
    if (*c == nullptr) continue;
    wrapped.push_back(std::make_unique<DeviceComm>(**c, dev));
    *c = wrapped.back().get();
  }
  return wrapped;
}

// Data-parallel options with these buckets, ZeRO stage and tree, and on the device the data-parallel state on `dev`'s
// buffers with the gradients reduced over `grad_dev`, as railyard-worker wires NCCL on CUDA.
inline parallel::DataParallelOptions device_dp_options(size_t bucket_bytes, int zero_stage, bool deterministic,
                                                       bool device, Kernels<float>& dev, comm::Communicator* grad_dev) {
  parallel::DataParallelOptions o;
  o.bucket_bytes = bucket_bytes;
  o.zero_stage = zero_stage;
  o.deterministic = deterministic;
  if (device) {
    o.device = &dev;
    o.device_dp = grad_dev;
  }
  return o;
}

// One rank of the plain Gpt trainer at dp = c.size() on StreamSource data (its share of the job's micro-batches), with
// device_dp_options' data-parallel state: on the CPU, or with `device` on ShadowCpu, the gradients over a DeviceComm of
// a group of its own, as railyard-worker wires NCCL on CUDA. `first_batch`: the batches its loader has already read (a
// restore).
struct DeviceDpTrainer {
  DeviceDpTrainer(comm::Communicator& c, ThreadPool& pool, const GptConfig& cfg, const TrainConfig& tc,
                  size_t bucket_bytes, int zero_stage, bool deterministic, bool device, uint64_t first_batch = 0)
      : dev(pool),
        src(c.rank(), c.size(), tc.batch, tc.seq_len, cfg.vocab_size, first_batch),
        grad(c.dup("dp-grad")),
        grad_dev(*grad, dev),
        sync(parallel::gpt_data_parallel(
            &c, cfg, tc, pool, device_dp_options(bucket_bytes, zero_stage, deterministic, device, dev, &grad_dev))),
        trainer(cfg, tc, pool, src, nullptr, sync.get(), nullptr, device ? &dev : nullptr) {}
  ShadowCpu dev;
  StreamSource src;
  std::unique_ptr<comm::Communicator> grad;
  DeviceComm grad_dev;
  std::unique_ptr<parallel::DataParallel> sync;
  Trainer trainer;
};

// `a` equals `b` (the CPU's) up to `rel` of b's largest magnitude, and neither is empty: ZeRO on the device sums the
// grad norm per tensor run (the CPU element by element), so the clip factor may differ in the last bit.
inline bool close_to(const std::vector<float>& a, const std::vector<float>& b, double rel = 1e-6) {
  return a.size() == b.size() && !a.empty() && max_abs_diff(a, b) <= rel * max_abs(b);
}

// Each step's loss on the device within `rel` of the CPU's (same number of steps required by the caller).
inline void check_losses_close(const std::vector<double>& dev, const std::vector<double>& cpu, double rel = 1e-6) {
  for (size_t s = 0; s < cpu.size(); ++s) {
    CAPTURE(s);
    CHECK(std::fabs(dev[s] - cpu[s]) <= rel * cpu[s]);
  }
}

}  // namespace railyard::worker::testing
