// Optimizer offload (docs/worker.md "Optimizer offload"): AdamW's moments live in host memory and the update runs on
// a CPU thread, overlapped with the next step's forward, as ZeRO-Offload does.
//
// The device/host split on a machine without a GPU: the model's buffers (params, grads, activations) are the
// "device arena"; the offloaded state (m, v) and the copy staging are the "host arena" (pinned memory in a CUDA
// build, plain here). Both are the same RAM on this machine; what is measured is which arena holds how many bytes.
//
// The overlap: the parameters are cut into groups in the order the forward reads them (0: wte + wpe for the
// encoder, 1 + l: layer l's 12 slices of the stacked tensors and its router slice, L + 1: lnfw, lnfb). After step
// k's gradients are final (and their norm known, so clipping works), start() returns at once and a CPU thread takes
// the groups in that order: copy the group's gradients and parameters down into the staging buffer, AdamW on the host
// moments, copy the parameters back up. The next forward waits, before each group it reads, only for that group
// (Gpt::set_params_needed_hook), so the update of layer l hides behind the forward of layers < l. Each element gets
// exactly the in-memory AdamW's arithmetic (worker/optim/adamw.h): the results are bitwise the same.
//
// On a device that is not the host (CUDA), the copies are the device's side copies (Kernels::side_to_host/
// side_to_device: their own stream, callable from this thread while the main thread launches the forward's kernels):
// per group the gradients and parameters come down, the parameters go back up (which also re-rounds the device's bf16
// weight copy of the group). The device's fp32 parameters stay the master copy: no host copy of them is kept between
// steps, so nothing else that writes the parameters (restore, --init-from, reinit) has to keep one in step, at the
// price of downloading them every step (12 bytes per parameter over the host link per step instead of 8).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "worker/device/kernels.h"
#include "worker/kernels/cpu/adamw.h"
#include "worker/kernels/cpu/thread_pool.h"
#include "worker/model/gpt.h"
#include "worker/model/gpt_config.h"
#include "worker/optim/adamw.h"

namespace railyard::worker {

enum class OffloadMode { kNone, kOptimizer };
// "none" or "optimizer". "optimizer,params" (parameters streamed from the host too) is refused with a ConfigError
// saying it is not implemented; anything else names the flag and the choices.
OffloadMode parse_offload(const std::string& value);
const char* to_string(OffloadMode m);

// One group of the forward order: [offset, offset + count) ranges of the flat buffer with AdamW's decay flag.
struct OffloadRun {
  size_t offset = 0, count = 0;
  bool decay = false;
};
using OffloadGroup = std::vector<OffloadRun>;
// The L + 2 groups of a config, in forward order; every element of the flat buffer is in exactly one run.
std::vector<OffloadGroup> offload_groups(const GptConfig& c);

// Host-arena bytes of the offloaded optimizer of a config: m and v (8 bytes per parameter) plus the staging buffer
// for one group's gradients and parameters (2 x 4 bytes x the largest group).
size_t offload_host_bytes(const GptConfig& c);

class OffloadAdamW {
 public:
  // threads: the CPU threads of the update (their own pool: the compute pool is busy with the forward meanwhile).
  // device: where params and grads live; null or a host-accessible device: they are host memory (memcpy), else the
  // update thread copies through device->side_to_host/side_to_device, and the caller makes the gradients final on
  // the device (synchronize()) before start().
  OffloadAdamW(const GptConfig& config, const AdamWHyper& hyper, int threads = 1, Kernels<float>* device = nullptr);
  ~OffloadAdamW();  // waits for a running update
  OffloadAdamW(const OffloadAdamW&) = delete;
  OffloadAdamW& operator=(const OffloadAdamW&) = delete;

  // Starts update t+1 of every group in forward order in the background; params and grads must stay valid (and
  // grads unchanged) until wait_all(). Waits for an update still running first.
  void start(float* params, const float* grads, float lr, float grad_scale);
  // Blocks until group g of the running update has been written back (returns at once when none runs). If the update
  // failed (a copy threw), this and every later wait or start() rethrows it: the parameters are partly updated, so
  // nothing may read them as a step's result (no checkpoint of them).
  void wait_group(int g);
  void wait_all();

  // The host-arena moments, flat-buffer order (the same layout as AdamW's, so checkpoints are interchangeable). Only
  // meaningful while no update runs (callers wait_all() first).
  float* m() { return m_.data(); }
  float* v() { return v_.data(); }
  size_t size() const { return m_.size(); }
  int64_t t() const { return t_; }
  void set_t(int64_t t) { t_ = t; }
  size_t host_bytes() const;
  size_t num_groups() const { return groups_.size(); }

  // Seconds callers spent blocked in wait_group/wait_all since the last call (the update time the overlap did not
  // hide), and the background thread's time of the last finished update.
  double take_wait_seconds();
  double last_update_seconds();

 private:
  void loop();
  void run_group(const OffloadGroup& g);

  GptConfig config_;
  AdamWHyper hyper_;
  Kernels<float>* device_ = nullptr;  // null: params and grads are host memory
  std::vector<OffloadGroup> groups_;
  ThreadPool pool_;
  AlignedBuffer<float> m_, v_;
  AlignedBuffer<float> stage_g_, stage_p_;  // one group's gradients and parameters on the host

  // The running update; written under mu_ by start() and the thread.
  float* params_ = nullptr;
  const float* grads_ = nullptr;
  float lr_ = 0, scale_ = 0;
  cpu::AdamWStep step_;  // this update's scalars (cpu/adamw.h)
  int64_t t_ = 0;
  bool pending_ = false;  // an update was started and not all groups are done
  size_t done_ = 0;       // groups of the running update written back
  bool stop_ = false;
  std::exception_ptr error_;  // the update thread's failure, sticky
  double wait_seconds_ = 0, update_seconds_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  std::thread thread_;
};

}  // namespace railyard::worker
