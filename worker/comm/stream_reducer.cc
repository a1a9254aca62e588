#include "worker/comm/stream_reducer.h"

namespace railyard::worker::comm {
namespace {

class HostStreamReducer final : public StreamReducer {
 public:
  explicit HostStreamReducer(Communicator& comm) : comm_(comm) {}
  void all_reduce(void* buf, size_t count, DType dtype, ReduceOp op) override {
    comm_.all_reduce(buf, count, dtype, op);
    ++pending_;
  }
  void wait() override { pending_ = 0; }
  size_t pending() const override { return pending_; }

 private:
  Communicator& comm_;
  size_t pending_ = 0;
};

}  // namespace

std::unique_ptr<StreamReducer> host_stream_reducer(Communicator& comm) {
  return std::make_unique<HostStreamReducer>(comm);
}

}  // namespace railyard::worker::comm
