#include "common/torchrun.h"

#include <algorithm>
#include <cctype>
#include <string_view>

namespace railyard::torchrun {
namespace {

struct Known {
  const char* dest;
  bool takes_value;
  const char* short_name;  // "r" for -r, nullptr when none
};

// torch.distributed.run's options (1.13 and 2.x): each long one is spelled with dashes and with underscores.
constexpr Known kKnown[] = {
    {"nnodes", true, nullptr},
    {"nproc_per_node", true, nullptr},
    {"rdzv_backend", true, nullptr},
    {"rdzv_endpoint", true, nullptr},
    {"rdzv_id", true, nullptr},
    {"rdzv_conf", true, nullptr},
    {"standalone", false, nullptr},
    {"max_restarts", true, nullptr},
    {"monitor_interval", true, nullptr},
    {"start_method", true, nullptr},
    {"role", true, nullptr},
    {"module", false, "m"},
    {"no_python", false, nullptr},
    {"run_path", false, nullptr},
    {"log_dir", true, nullptr},
    {"redirects", true, "r"},
    {"tee", true, "t"},
    {"local_ranks_filter", true, nullptr},
    {"node_rank", true, nullptr},
    {"master_addr", true, nullptr},
    {"master_port", true, nullptr},
    {"local_addr", true, nullptr},
    {"logs_specs", true, nullptr},
    {"event_log_handler", true, nullptr},
};

std::string underscores(std::string s) {
  std::replace(s.begin(), s.end(), '-', '_');
  return s;
}

std::string base_name(const std::string& p) {
  const size_t slash = p.rfind('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

// A long option's name (without "--") as argparse resolves it: an exact name, else a prefix of exactly one option
// (argparse's allow_abbrev). nullptr when unknown or ambiguous.
const Known* resolve_long(const std::string& name) {
  const std::string n = underscores(name);
  for (const Known& k : kKnown)
    if (n == k.dest) return &k;
  const Known* found = nullptr;
  for (const Known& k : kKnown) {
    if (std::string_view(k.dest).substr(0, n.size()) != n) continue;
    if (found != nullptr) return nullptr;
    found = &k;
  }
  return n.empty() ? nullptr : found;
}

const Known* resolve_short(char c) {
  for (const Known& k : kKnown)
    if (k.short_name != nullptr && k.short_name[0] == c) return &k;
  return nullptr;
}

bool is_python(const std::string& word) {
  const std::string b = base_name(word);
  if (b.rfind("python", 0) != 0) return false;
  // python, python3, python3.11: nothing but digits and dots after "python".
  return std::all_of(b.begin() + 6, b.end(),
                     [](char c) { return std::isdigit(static_cast<unsigned char>(c)) || c == '.'; });
}

}  // namespace

std::optional<Command> parse_command(const std::vector<std::string>& argv) {
  Command c;
  if (!argv.empty() && base_name(argv[0]) == "torchrun") {
    c.first_option = 1;
    c.interpreter = "python";
  } else if (argv.size() >= 3 && is_python(argv[0]) && argv[1] == "-m" &&
             (argv[2] == "torch.distributed.run" || argv[2] == "torch.distributed.launch")) {
    c.first_option = 3;
    c.interpreter = argv[0];
    c.deprecated_launch = argv[2] == "torch.distributed.launch";
  } else {
    return std::nullopt;
  }
  size_t i = c.first_option;
  for (; i < argv.size() && argv[i].size() > 1 && argv[i][0] == '-'; ++i) {
    const std::string& a = argv[i];
    if (a == "--") {  // the script follows
      ++i;
      break;
    }
    Option o;
    o.index = i;
    o.text = a;
    const Known* k = nullptr;
    bool inline_value = false;
    if (a[1] == '-') {
      std::string name = a.substr(2);
      if (const size_t eq = name.find('='); eq != std::string::npos) {
        o.value = name.substr(eq + 1);
        name.resize(eq);
        inline_value = true;
      }
      k = resolve_long(name);
      o.dest = k != nullptr ? k->dest : underscores(name);
    } else {
      k = resolve_short(a[1]);
      o.dest = k != nullptr ? k->dest : a.substr(1);
      if (k != nullptr && k->takes_value && a.size() > 2) {  // -r3: argparse's attached value
        o.value = a.substr(a[2] == '=' ? 3 : 2);
        inline_value = true;
      }
    }
    if (k != nullptr && k->takes_value && !inline_value && i + 1 < argv.size()) {
      o.value = argv[++i];
      o.count = 2;
      o.text += " " + o.value;
    }
    if (o.dest == "no_python") c.no_python = true;
    if (o.dest == "module") c.module = true;
    c.options.push_back(std::move(o));
  }
  c.script = std::min(i, argv.size());
  return c;
}

bool is_torchrun(const std::vector<std::string>& argv) {
  const auto c = parse_command(argv);
  return c && !c->deprecated_launch;
}

std::optional<Conflict> check_options(const Command& command, int procs_per_node) {
  for (const Option& o : command.options) {
    const std::string& d = o.dest;
    if (d == "nnodes" || d == "node_rank" || d == "master_addr" || d == "master_port" || d == "rdzv_backend" ||
        d == "rdzv_endpoint" || d == "rdzv_id" || d == "rdzv_conf" || d == "standalone") {
      return Conflict{o.index,
                      "'" + o.text +
                          "' would override what Railyard gives torchrun (PET_NNODES, PET_NODE_RANK, "
                          "PET_MASTER_ADDR/PORT: static rendezvous in the world Railyard's rendezvous formed, which "
                          "changes with restarts and resizes)",
                      "remove it (the node count comes from spec.replicas and spec.elastic)"};
    }
    if (d == "max_restarts" && o.value != "0") {
      return Conflict{o.index, "'" + o.text + "' would make torchrun restart its ranks itself",
                      "remove it: Railyard restarts the whole generation (spec.failurePolicy.maxRestarts) and keeps "
                      "torchrun's own restarts off"};
    }
    if (d == "nproc_per_node" && o.value != std::to_string(procs_per_node)) {
      return Conflict{o.index,
                      "'" + o.text + "' disagrees with spec.procsPerReplica (" + std::to_string(procs_per_node) +
                          "), from which Railyard counts the ranks and sets PET_NPROC_PER_NODE",
                      std::all_of(o.value.begin(), o.value.end(),
                                  [](char ch) { return std::isdigit(static_cast<unsigned char>(ch)); }) &&
                              !o.value.empty()
                          ? "remove it, or set spec.procsPerReplica: " + o.value
                          : "remove it and set spec.procsPerReplica to the processes per pod (e.g. the GPUs per node)"};
    }
  }
  return std::nullopt;
}

}  // namespace railyard::torchrun
