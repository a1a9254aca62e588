// The loop that both the victim process (comm_peer_main.cc) and the surviving threads (test_failures.cc) run, so that
// they issue the same collectives in the same order.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "worker/comm/communicator.h"
#include "worker/comm/process_groups.h"

namespace railyard::worker::comm::testing {

// "all_reduce": world all-reduces. "groups": a dp=2 x tp=2 grid (world of 4), each step a tp all-reduce then a dp
// all-reduce, so that a rank which shares no group with the victim only learns of its death through others.
class FaultWorkload {
 public:
  FaultWorkload(Communicator& world, const std::string& mode) : world_(world), buf_(1 << 16, 1.0f) {
    if (mode == "groups") groups_ = std::make_unique<ProcessGroups>(world, Layout{2, 2, 1});
  }
  void step() {
    if (groups_) {
      groups_->tp().all_reduce(buf_.data(), buf_.size(), DType::kFloat32, ReduceOp::kAvg);
      groups_->dp().all_reduce(buf_.data(), buf_.size(), DType::kFloat32, ReduceOp::kAvg);
    } else {
      world_.all_reduce(buf_.data(), buf_.size(), DType::kFloat32, ReduceOp::kAvg);
    }
  }

 private:
  Communicator& world_;
  std::vector<float> buf_;
  std::unique_ptr<ProcessGroups> groups_;
};

}  // namespace railyard::worker::comm::testing
