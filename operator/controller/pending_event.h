// An event a reconcile records once its status is written (Controller::emit): what the stages (sync.h) collect and
// the controller sends, in a header of its own so that the stages' state does not include the controller.
#pragma once

#include <string>

namespace railyard::op {

struct PendingEvent {
  bool warning;
  std::string reason, message;
};

}  // namespace railyard::op
