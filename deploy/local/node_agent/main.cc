// railyard-node-agent: simulated GPU nodes for the local cluster, and the fault-injection CLI that talks to it.
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "common/kube/client.h"
#include "common/log.h"
#include "deploy/local/node_agent/control.h"
#include "deploy/local/node_agent/node_agent.h"
#include "deploy/local/node_agent/signals.h"
#include "deploy/local/node_agent/topology.h"

namespace na = railyard::node_agent;
using railyard::ConfigError;

namespace {

constexpr const char* kUsage = R"(usage:
  railyard-node-agent run --kubeconfig FILE --state-dir DIR (--nodes N | --topology FILE)
                          [--lease-interval S] [--node-status-interval S] [--no-pods]
      --lease-interval S        renew each node's lease every S seconds (default 1: the local cluster's
                                node-monitor grace is 4 s; a kubelet renews every 10 s for the default 40 s)
      --node-status-interval S  re-assert each up node's Ready=True every S seconds (default 10)
      --no-pods                 nodes only: pods bound to them are left alone (no process, no status), for
                                benchmarks of pod creation and binding at thousands of nodes
  railyard-node-agent nodes (--nodes N | --topology FILE)          print the node names a topology gives
  railyard-node-agent kill NAMESPACE/POD [--signal KILL|TERM|INT|9|15...] --state-dir DIR
  railyard-node-agent freeze NAMESPACE/POD --state-dir DIR             SIGSTOP the pod's process group
  railyard-node-agent thaw NAMESPACE/POD --state-dir DIR               SIGCONT it
  railyard-node-agent node-down NODE --state-dir DIR                   lose a machine: no heartbeats, pods killed
  railyard-node-agent node-up NODE --state-dir DIR                     bring it back (Ready=True)
  railyard-node-agent status [--json] --state-dir DIR                  nodes (up/down) and pods (pid, ip, phase)
See docs/node-agent.md.
)";

struct Args {
  std::string command;
  std::vector<std::string> positional;
  std::map<std::string, std::string> flags;
};

Args parse_args(int argc, char** argv) {
  static const std::map<std::string, bool> known = {
      {"--kubeconfig", true}, {"--state-dir", true},      {"--nodes", true},
      {"--topology", true},   {"--signal", true},         {"--json", false},
      {"--log-level", true},  {"--lease-interval", true}, {"--node-status-interval", true},
      {"--no-pods", false}};
  Args a;
  if (argc < 2) throw ConfigError("no command given");
  a.command = argv[1];
  for (int i = 2; i < argc; ++i) {
    std::string s = argv[i];
    if (s.rfind("--", 0) != 0) {
      a.positional.push_back(s);
      continue;
    }
    std::string value;
    auto eq = s.find('=');
    if (eq != std::string::npos) {
      value = s.substr(eq + 1);
      s = s.substr(0, eq);
    }
    auto it = known.find(s);
    if (it == known.end()) throw ConfigError("unknown option " + s);
    if (it->second && eq == std::string::npos) {
      if (i + 1 >= argc) throw ConfigError(s + " needs a value");
      value = argv[++i];
    }
    a.flags[s] = value;
  }
  return a;
}

std::string need(const Args& a, const std::string& flag) {
  auto it = a.flags.find(flag);
  if (it == a.flags.end() || it->second.empty()) throw ConfigError(a.command + ": " + flag + " is required");
  return it->second;
}

std::string one_positional(const Args& a, const char* what) {
  if (a.positional.size() != 1) throw ConfigError(a.command + ": expected exactly one " + what);
  return a.positional[0];
}

na::Topology topology_from(const Args& a) {
  bool has_nodes = a.flags.count("--nodes"), has_topo = a.flags.count("--topology");
  if (has_nodes == has_topo) throw ConfigError(a.command + ": give exactly one of --nodes N or --topology FILE");
  if (has_topo) return na::load_topology_file(a.flags.at("--topology"));
  int n = 0;
  try {
    size_t used = 0;
    n = std::stoi(a.flags.at("--nodes"), &used);
    if (used != a.flags.at("--nodes").size()) throw std::invalid_argument("trailing");
  } catch (const std::exception&) {
    throw ConfigError("--nodes '" + a.flags.at("--nodes") + "': must be a number of nodes (1-10000)");
  }
  return na::default_topology(n);
}

int run_agent(const Args& a) {
  std::string state_dir = need(a, "--state-dir");
  std::string kubeconfig = need(a, "--kubeconfig");
  na::AgentOptions opts;
  opts.topology = topology_from(a);
  std::error_code ec;
  std::filesystem::create_directories(state_dir, ec);
  if (ec) throw ConfigError("--state-dir " + state_dir + ": cannot create: " + ec.message());
  opts.state_dir = std::filesystem::absolute(state_dir).string();
  auto seconds_flag = [&](const char* flag, double def, double min) {
    if (!a.flags.count(flag)) return def;
    const std::string& v = a.flags.at(flag);
    try {
      size_t used = 0;
      double d = std::stod(v, &used);
      if (used == v.size() && d >= min && d <= 3600) return d;
    } catch (const std::exception&) {
    }
    throw ConfigError(std::string(flag) + " '" + v + "': expected seconds from " + std::to_string(min).substr(0, 3) +
                      " to 3600");
  };
  opts.lease_interval =
      std::chrono::milliseconds(static_cast<int64_t>(seconds_flag("--lease-interval", 1, 0.1) * 1000));
  opts.node_status_interval = std::chrono::seconds(static_cast<int64_t>(seconds_flag("--node-status-interval", 10, 1)));
  opts.run_pods = !a.flags.count("--no-pods");

  // One agent per state dir: a second one would fight over the same nodes, processes and addresses.
  std::string lock_path = opts.state_dir + "/agent.lock";
  // A predecessor that is still shutting down gets 15 s to let go.
  int lock_fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  bool locked = false;
  for (int i = 0; lock_fd >= 0 && i < 150 && !(locked = ::flock(lock_fd, LOCK_EX | LOCK_NB) == 0); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (!locked) {
    throw ConfigError("--state-dir " + opts.state_dir + ": another railyard-node-agent is running with it (" +
                      lock_path + " stayed locked for 15 s): stop it first");
  }

  // Signals are taken by a dedicated thread; every other thread (and, via the supervisor, no pod) blocks them.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
  std::atomic<bool> stop{false};
  std::thread signal_thread([&] {
    int sig = 0;
    sigwait(&set, &sig);
    railyard::log::info("node-agent", "signal received, stopping", {{"signal", na::signal_name(sig)}});
    stop = true;
  });

  int rc = 0;
  try {
    railyard::kube::Config cfg = railyard::kube::load_kubeconfig(kubeconfig);
    // The agent stands in for one kubelet per node, each with its own client limits: the budget grows with the
    // nodes (leases and Ready re-assertions twice over, plus the pods' status traffic), not one kubelet's 50/s
    // for 1,000 nodes, which could never renew their leases in time.
    const double nodes = static_cast<double>(na::expand_nodes(opts.topology).size());
    const double steady = nodes / std::chrono::duration<double>(opts.lease_interval).count() +
                          nodes / static_cast<double>(opts.node_status_interval.count());
    cfg.qps = std::max(cfg.qps, 50 + 2 * steady);
    cfg.burst = std::max(cfg.burst, static_cast<int>(cfg.qps));
    cfg.max_connections = std::max(cfg.max_connections, opts.heartbeat_workers + 2);
    railyard::log::info("node-agent", "client limits",
                        {{"qps", std::to_string(static_cast<int>(cfg.qps))}, {"burst", std::to_string(cfg.burst)}});
    railyard::kube::Client client(cfg);
    na::Agent agent(opts, client);
    agent.run(stop);
  } catch (const std::exception& e) {
    railyard::log::error("node-agent", "fatal", {{"error", e.what()}});
    std::cerr << "railyard-node-agent: " << e.what() << "\n";
    rc = 1;
  }
  if (!stop) pthread_kill(signal_thread.native_handle(), SIGTERM);  // wake sigwait so the thread can be joined
  signal_thread.join();
  ::close(lock_fd);
  return rc;
}

int run_control(const Args& a) {
  std::string state_dir = need(a, "--state-dir");
  nlohmann::json args = nlohmann::json::object();
  std::string action = a.command;
  if (action == "kill" || action == "freeze" || action == "thaw") {
    args["pod"] = one_positional(a, "NAMESPACE/POD");
    if (args["pod"].get<std::string>().find('/') == std::string::npos) {
      throw ConfigError(action + ": pod '" + args["pod"].get<std::string>() + "' must be NAMESPACE/NAME");
    }
    if (action == "kill" && a.flags.count("--signal")) {
      args["signal"] = std::to_string(na::parse_signal(a.flags.at("--signal")));
    } else if (a.flags.count("--signal")) {
      throw ConfigError(action + ": --signal only applies to kill");
    }
  } else if (action == "node-down" || action == "node-up") {
    args["node"] = one_positional(a, "NODE");
  } else if (!a.positional.empty()) {
    throw ConfigError("status takes no arguments");
  }
  nlohmann::json reply = na::control_call(state_dir, action, args);
  if (action != "status") {
    std::cout << reply.value("message", "ok") << "\n";
    return 0;
  }
  if (a.flags.count("--json")) {
    reply.erase("ok");
    std::cout << reply.dump(2) << "\n";
    return 0;
  }
  std::cout << "NODE                 STATE\n";
  for (const auto& n : reply["nodes"]) {
    std::printf("%-20s %s\n", n.value("name", "").c_str(), n.value("up", false) ? "up" : "down");
  }
  std::cout << "\nPOD                                      NODE                 IP               PID      PHASE\n";
  for (const auto& p : reply["pods"]) {
    std::string key = p.value("namespace", "") + "/" + p.value("name", "");
    std::string phase = p.value("phase", "");
    if (p.value("frozen", false)) phase += " (frozen)";
    std::printf("%-40s %-20s %-16s %-8d %s\n", key.c_str(), p.value("node", "").c_str(), p.value("ip", "").c_str(),
                p.value("pid", 0), phase.c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Args a = parse_args(argc, argv);
    if (a.flags.count("--log-level")) railyard::log::set_level(railyard::log::parse_level(a.flags.at("--log-level")));
    if (a.command == "-h" || a.command == "--help" || a.command == "help") {
      std::cout << kUsage;
      return 0;
    }
    if (a.command == "run") return run_agent(a);
    if (a.command == "nodes") {
      for (const auto& n : na::expand_nodes(topology_from(a))) std::cout << n.name << "\n";
      return 0;
    }
    static const std::vector<std::string> control = {"kill", "freeze", "thaw", "node-down", "node-up", "status"};
    for (const auto& c : control) {
      if (a.command == c) return run_control(a);
    }
    throw ConfigError("unknown command '" + a.command + "'");
  } catch (const ConfigError& e) {
    std::cerr << "railyard-node-agent: " << e.what() << "\n" << kUsage;
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "railyard-node-agent: " << e.what() << "\n";
    return 1;
  }
}
