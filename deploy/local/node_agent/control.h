// The agent's control endpoint for fault injection: a small HTTP server on 127.0.0.1 whose port is written to
// <state-dir>/control.port, and the client side used by the CLI subcommands.
//
// Protocol: POST /v1/<action> with a JSON object body; the answer is JSON {"ok": bool, "message": "one line", ...}
// with HTTP 200 on success, 404 for an unknown pod/node, 400 for bad arguments, 500 otherwise.
// Actions: kill {pod, signal}, freeze {pod}, thaw {pod}, node-down {node}, node-up {node}, status {}.
#pragma once

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "common/error.h"

namespace railyard::node_agent {

// Thrown by a handler: becomes {"ok": false, "message": what()} with this HTTP status.
class ControlError : public Error {
 public:
  ControlError(int status, const std::string& message) : Error(message), status_(status) {}
  int status() const { return status_; }

 private:
  int status_;
};

using ControlHandler = std::function<nlohmann::json(const std::string& action, const nlohmann::json& args)>;

class ControlServer {
 public:
  // Binds 127.0.0.1 on a free port, serves in a thread, writes <state_dir>/control.port. Throws Error.
  ControlServer(const std::string& state_dir, ControlHandler handler);
  ~ControlServer();
  int port() const { return port_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
  std::string port_file_;
};

// Reads <state_dir>/control.port and calls the action. Returns the response object when ok; throws Error with
// the agent's one-line message otherwise (or a message saying the agent is not running).
nlohmann::json control_call(const std::string& state_dir, const std::string& action, const nlohmann::json& args);

}  // namespace railyard::node_agent
