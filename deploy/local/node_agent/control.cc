#include "deploy/local/node_agent/control.h"

#include <httplib.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "common/atomic_file.h"
#include "common/log.h"

namespace railyard::node_agent {

struct ControlServer::Impl {
  httplib::Server server;
  std::thread thread;
};

ControlServer::ControlServer(const std::string& state_dir, ControlHandler handler) : impl_(std::make_unique<Impl>()) {
  impl_->server.Post(R"(/v1/([a-z-]+))", [handler](const httplib::Request& req, httplib::Response& res) {
    nlohmann::json reply;
    int status = 200;
    try {
      nlohmann::json args = req.body.empty() ? nlohmann::json::object() : nlohmann::json::parse(req.body);
      if (!args.is_object()) throw ControlError(400, "request body must be a JSON object");
      reply = handler(req.matches[1].str(), args);
      if (!reply.is_object()) reply = nlohmann::json{{"message", reply}};
      reply["ok"] = true;
    } catch (const ControlError& e) {
      status = e.status();
      reply = {{"ok", false}, {"message", e.what()}};
    } catch (const nlohmann::json::exception& e) {
      status = 400;
      reply = {{"ok", false}, {"message", std::string("request body is not valid JSON: ") + e.what()}};
    } catch (const std::exception& e) {
      status = 500;
      reply = {{"ok", false}, {"message", e.what()}};
    }
    res.status = status;
    res.set_content(reply.dump() + "\n", "application/json");
  });
  port_ = impl_->server.bind_to_any_port("127.0.0.1");
  if (port_ <= 0) throw Error("control endpoint: cannot bind a port on 127.0.0.1");
  impl_->thread = std::thread([this] { impl_->server.listen_after_bind(); });
  port_file_ = state_dir + "/control.port";
  write_file_atomic(port_file_, std::to_string(port_) + "\n");
}

ControlServer::~ControlServer() {
  std::error_code ec;
  std::filesystem::remove(port_file_, ec);
  impl_->server.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

nlohmann::json control_call(const std::string& state_dir, const std::string& action, const nlohmann::json& args) {
  std::string port_file = state_dir + "/control.port";
  if (!std::filesystem::exists(port_file)) {
    throw Error("no running railyard-node-agent for --state-dir " + state_dir + " (" + port_file +
                " is missing): start it with `railyard-node-agent run`");
  }
  int port = 0;
  try {
    port = std::stoi(read_file(port_file, "control port file"));
  } catch (const std::invalid_argument&) {
    throw Error("control port file " + port_file + ": not a port number");
  }
  httplib::Client cli("127.0.0.1", port);
  cli.set_connection_timeout(std::chrono::seconds(3));
  cli.set_read_timeout(std::chrono::seconds(30));
  auto res = cli.Post(("/v1/" + action).c_str(), args.dump(), "application/json");
  if (!res) {
    throw Error("cannot reach railyard-node-agent at 127.0.0.1:" + std::to_string(port) + " (from " + port_file +
                "): " + httplib::to_string(res.error()) + ": is the agent running?");
  }
  nlohmann::json reply;
  try {
    reply = nlohmann::json::parse(res->body);
  } catch (const nlohmann::json::exception&) {
    throw Error("railyard-node-agent answered HTTP " + std::to_string(res->status) + " with a non-JSON body");
  }
  if (!reply.value("ok", false)) throw Error(reply.value("message", "request failed"));
  return reply;
}

}  // namespace railyard::node_agent
