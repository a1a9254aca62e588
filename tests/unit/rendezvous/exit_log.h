// The worker exits a RendezvousService delivers, kept for a test to wait on and check: what the rendezvous and the
// agent tests each collected by hand under a mutex of their own.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

#include "operator/rendezvous/rendezvous.h"

namespace railyard::op::testing {

class ExitLog {
 public:
  // Becomes the service's exit handler (called from its threads). The handler shares the log's state, so the log and
  // the service may go in either order.
  explicit ExitLog(RendezvousService& svc) : state_(std::make_shared<State>()) {
    svc.set_exit_handler([state = state_](const WorkerExit& e) {
      std::lock_guard<std::mutex> l(state->mu);
      state->exits.push_back(e);
    });
  }

  // The exits so far, in delivery order (a copy: later exits do not change it).
  std::vector<WorkerExit> all() const {
    std::lock_guard<std::mutex> l(state_->mu);
    return state_->exits;
  }
  size_t size() const {
    std::lock_guard<std::mutex> l(state_->mu);
    return state_->exits.size();
  }

 private:
  struct State {
    std::mutex mu;
    std::vector<WorkerExit> exits;
  };
  std::shared_ptr<State> state_;
};

}  // namespace railyard::op::testing
