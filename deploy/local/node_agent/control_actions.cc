#include "deploy/local/node_agent/control_actions.h"

#include <signal.h>

#include "common/log.h"
#include "deploy/local/node_agent/control.h"
#include "deploy/local/node_agent/signals.h"

namespace railyard::node_agent {
namespace {

using Json = nlohmann::json;
constexpr const char* kComp = "node-agent";

}  // namespace

Json ControlActions::handle(const std::string& action, const Json& args) {
  if (action == "kill" || action == "freeze" || action == "thaw") return signal_pod(action, args);
  if (action == "node-down") return node_down(args);
  if (action == "node-up") return node_up(args);
  if (action == "status") return status();
  throw ControlError(400, "unknown action '" + action + "': use kill, freeze, thaw, node-down, node-up or status");
}

PodRec& ControlActions::find_running_pod(const Json& args) {
  std::string key = args.value("pod", "");
  auto slash = key.find('/');
  if (slash == std::string::npos) throw ControlError(400, "pod '" + key + "': use NAMESPACE/NAME");
  std::string ns = key.substr(0, slash), name = key.substr(slash + 1);
  PodRec* found = nullptr;
  for (auto& [uid, rec] : pods_) {
    if (rec.ns == ns && rec.name == name) found = &rec;
  }
  if (!found) throw ControlError(404, "no pod " + key + " on this agent's nodes");
  if (found->state != PodRec::State::Running) {
    throw ControlError(409, "pod " + key + " has no running process (state " + state_name(found->state) + ", phase " +
                                (found->phase.empty() ? "Pending" : found->phase) + ")");
  }
  return *found;
}

std::string ControlActions::find_node(const Json& args) const {
  std::string node = args.value("node", "");
  if (!nodes_.has(node)) {
    std::string all;
    for (const auto& n : nodes_.names()) all += (all.empty() ? "" : ", ") + n;
    throw ControlError(404, "no node '" + node + "' on this agent (its nodes: " + all + ")");
  }
  return node;
}

// kill (SIGKILL or args.signal), freeze (SIGSTOP), thaw (SIGCONT) to the pod's whole process group.
Json ControlActions::signal_pod(const std::string& action, const Json& args) {
  PodRec& rec = find_running_pod(args);
  int sig = action == "freeze" ? SIGSTOP : action == "thaw" ? SIGCONT : SIGKILL;
  if (action == "kill" && args.contains("signal")) {
    try {
      sig = parse_signal(args["signal"].is_string() ? args["signal"].get<std::string>() : args["signal"].dump());
    } catch (const ConfigError& e) {
      throw ControlError(400, e.what());
    }
  }
  if (!supervisor_.signal(rec.uid, sig)) throw ControlError(409, "pod " + rec.key() + " has no running process");
  if (action != "kill") rec.frozen = action == "freeze";
  std::string what = action == "freeze" ? "froze" : action == "thaw" ? "thawed" : "sent " + signal_name(sig) + " to";
  log::info(kComp, "fault injected", {{"action", action}, {"pod", rec.key()}, {"signal", signal_name(sig)}});
  return {{"message", what + " pod " + rec.key() + " (process group " + std::to_string(rec.pid) + ")"},
          {"pid", rec.pid}};
}

// The machine is lost: heartbeats stop and its processes die; a lost machine reports nothing, so the pods stay
// as the API server last saw them until the node controller acts (or node-up).
Json ControlActions::node_down(const Json& args) {
  std::string node = find_node(args);
  if (!nodes_.mark_down(node)) return {{"message", "node " + node + " is already down"}};
  int killed = 0;
  for (auto& [uid, rec] : pods_) {
    if (rec.node != node) continue;
    if (rec.state == PodRec::State::Running) {
      supervisor_.signal(uid, SIGKILL);
      ++killed;
    } else if (rec.state == PodRec::State::Waiting) {
      rec.state = PodRec::State::Lost;
    }
  }
  log::info(kComp, "node down (fault injected)", {{"node", node}, {"killed", std::to_string(killed)}});
  return {{"message",
           "node " + node + " is down: heartbeats stopped, " + std::to_string(killed) + " pod process(es) killed"}};
}

Json ControlActions::node_up(const Json& args) {
  std::string node = find_node(args);
  if (!nodes_.mark_up(node)) return {{"message", "node " + node + " is already up"}};
  // Pods that survived (e.g. tolerating the unreachable taint) lost their process with the machine.
  for (auto& [uid, rec] : pods_) {
    if (rec.node != node || rec.deleting()) continue;
    if (rec.state == PodRec::State::Lost) {
      ExitStatus s;
      s.signaled = true;
      s.signal = SIGKILL;
      s.code = 137;
      s.finished_at = std::chrono::system_clock::now();
      rec.state = PodRec::State::Running;
      hooks_.terminated(rec, s, "Error", "node " + node + " was down (node-down); the process was killed");
    } else if (rec.state == PodRec::State::New) {
      hooks_.start(rec);
    }
  }
  log::info(kComp, "node up (fault injected)", {{"node", node}});
  return {{"message", "node " + node + " is up: heartbeats resumed, Ready=True"}};
}

Json ControlActions::status() const {
  Json ns = Json::array(), ps = Json::array();
  for (const auto& n : nodes_.nodes()) {
    Json o = {{"name", n.name}, {"up", !nodes_.is_down(n.name)}};
    ns.push_back(o);
  }
  for (const auto& [uid, rec] : pods_) {
    ps.push_back({{"namespace", rec.ns},
                  {"name", rec.name},
                  {"uid", uid},
                  {"node", rec.node},
                  {"ip", rec.ip},
                  {"pid", rec.state == PodRec::State::Running ? rec.pid : 0},
                  {"state", state_name(rec.state)},
                  {"phase", rec.phase.empty() ? "Pending" : rec.phase},
                  {"restarts", rec.restart_count},
                  {"frozen", rec.frozen}});
  }
  return {{"message", std::to_string(ns.size()) + " node(s), " + std::to_string(ps.size()) + " pod(s)"},
          {"nodes", ns},
          {"pods", ps}};
}

}  // namespace railyard::node_agent
