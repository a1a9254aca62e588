#include "cli/convert.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <set>
#include <string_view>

#include "common/error.h"
#include "common/pod_env.h"
#include "common/torchrun.h"

namespace railyard::cli {
namespace {

using nlohmann::json;

const json& at(const json& j, const char* key) {
  static const json null_value;
  return j.is_object() && j.contains(key) ? j[key] : null_value;
}

std::string str(const json& j, const char* key) {
  const json& v = at(j, key);
  return v.is_string() ? v.get<std::string>() : std::string();
}

std::vector<std::string> strings(const json& v, const std::string& field) {
  std::vector<std::string> out;
  if (v.is_null()) return out;
  if (!v.is_array()) throw Error(field + ": not a list of strings");
  for (const json& x : v) {
    if (!x.is_string()) throw Error(field + ": " + x.dump() + " is not a string");
    out.push_back(x.get<std::string>());
  }
  return out;
}

// A count as PyTorchJob and TrainJob write it: an integer, or a string of one.
std::optional<int64_t> count_of(const json& v) {
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    if (!s.empty() && s.size() < 10 && std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c); }))
      return std::stoll(s);
  }
  return std::nullopt;
}

int64_t gpus_of(const json& resources) {
  for (const char* part : {"limits", "requests"})
    if (auto n = count_of(at(at(resources, part), "nvidia.com/gpu"))) return *n;
  return 0;
}

// The container that runs the training (the one of this name, else the first), moved to the front: Railyard's pod
// builder makes the template's first container the worker and keeps the others beside it as they are, so a sidecar
// listed first would otherwise take the program's place.
json* main_container(json& pod_spec, const std::string& name, const std::string& field) {
  json& cs = pod_spec["containers"];
  if (!cs.is_array() || cs.empty()) throw Error(field + ".containers: no container to convert");
  for (size_t i = 1; i < cs.size(); ++i)
    if (str(cs[i], "name") == name && str(cs[0], "name") != name) {
      json c = cs[i];
      cs.erase(cs.begin() + static_cast<std::ptrdiff_t>(i));
      cs.insert(cs.begin(), c);
      break;
    }
  return &cs[0];
}

// Processes per pod from torchrun's flag or the operator's setting ("auto", "gpu", "cpu" or a number).
int64_t procs_from(const std::string& value, const std::string& field, int64_t gpus, std::vector<std::string>& notes) {
  if (auto n = count_of(json(value))) {
    if (*n < 1 || *n > 64) throw Error(field + " '" + value + "': Railyard runs 1 to 64 processes per pod");
    return *n;
  }
  if ((value == "auto" || value == "gpu") && gpus > 0) return gpus;
  notes.push_back(
      field + " '" + value + "': one process per pod (" +
      (value == "cpu" || value == "auto" ? "torchrun would start one per CPU core; " : "no GPUs requested; ") +
      "set spec.procsPerReplica to change it)");
  return 1;
}

// The variables Railyard sets for every rank (worker/agent/rank_env.cc): a template's value of them is overridden.
bool railyard_sets(const std::string& name) {
  static const std::set<std::string> names = {pod_env::kMasterAddr, pod_env::kMasterPort, pod_env::kWorldSize,
                                              pod_env::kRank,       pod_env::kLocalRank,  pod_env::kLocalWorldSize,
                                              pod_env::kGroupRank,  "NODE_RANK"};
  return names.count(name) || name.rfind("PET_", 0) == 0;
}

// The parts of a worker container Railyard takes elsewhere (spec.image, spec.program, spec.resources) leave the
// template; env entries Railyard sets per rank are dropped with a note.
json template_container(json c, const std::string& field, std::vector<std::string>& notes) {
  for (const char* k : {"image", "command", "args", "resources"}) c.erase(k);
  if (c.contains("env") && c["env"].is_array()) {
    json kept = json::array();
    for (const json& e : c["env"]) {
      const std::string n = str(e, "name");
      if (railyard_sets(n))
        notes.push_back(field + ".env " + n + ": dropped (Railyard sets it for every rank; docs/migrating.md)");
      else
        kept.push_back(e);
    }
    c["env"] = kept;
    if (kept.empty()) c.erase("env");
  }
  return c;
}

// What Railyard's pod builder does differently from a Kubeflow pod with the same template (pod_builder.cc): say so
// where the template leaves it to the default.
void pod_notes(const json& pod, const json& c, const std::string& field, std::vector<std::string>& notes) {
  if (!str(pod, "serviceAccountName").empty() && at(pod, "automountServiceAccountToken").is_null())
    notes.push_back(field + ".serviceAccountName " + str(pod, "serviceAccountName") +
                    ": kept, but Railyard's pods mount no service account token unless the template says "
                    "automountServiceAccountToken: true (Kubeflow's pods mounted it): add that if the program calls "
                    "the Kubernetes API with it");
  const json& sc = at(c, "securityContext");
  const json& psc = at(pod, "securityContext");
  auto unset = [&](const char* k) { return at(sc, k).is_null() && at(psc, k).is_null(); };
  std::vector<std::string> applied;
  if (unset("runAsUser")) applied.push_back("uid 65532 (not the image's user)");
  if (at(sc, "readOnlyRootFilesystem").is_null()) applied.push_back("a read-only root filesystem");
  if (!applied.empty()) {
    std::string list;
    for (size_t i = 0; i < applied.size(); ++i) list += (i ? " and " : "") + applied[i];
    notes.push_back(field + ".securityContext: not set, so the program runs with Railyard's secure defaults, " + list +
                    ", and HOME and the pip, Hugging Face, torch and Triton caches under /home/railyard; an image "
                    "that needs root or writes beside its files: set securityContext in spec.template "
                    "(docs/programs.md \"Images that just work\")");
  }
}

// training-operator sets PYTHONUNBUFFERED in every PyTorchJob container (any non-empty value, its "0" included, makes
// Python write its output at once); Railyard does not, and a Python program's output to a pipe would then arrive in
// 8 KiB blocks, late in `kubectl logs` and in the agent's output-silence clock. The template keeps it.
void keep_unbuffered(json& c, std::vector<std::string>& notes) {
  json env = at(c, "env").is_array() ? c["env"] : json::array();
  if (std::any_of(env.begin(), env.end(), [](const json& e) { return str(e, "name") == "PYTHONUNBUFFERED"; })) return;
  env.push_back({{"name", "PYTHONUNBUFFERED"}, {"value", "1"}});
  c["env"] = env;
  notes.push_back(
      "PYTHONUNBUFFERED=1 added to the template's env: the PyTorchJob operator set it in every container "
      "(Python's output reaches the log at once)");
}

// metadata of the output: name, namespace, labels and annotations of the input (without kubectl's own).
json metadata_from(const json& in, const std::string& from) {
  json md = json::object();
  for (const char* k : {"name", "namespace", "labels", "annotations"})
    if (at(at(in, "metadata"), k).is_string() || at(at(in, "metadata"), k).is_object()) md[k] = in["metadata"][k];
  if (str(md, "name").empty()) throw Error("metadata.name: the " + from + " has no name");
  if (md.contains("annotations")) md["annotations"].erase("kubectl.kubernetes.io/last-applied-configuration");
  md["annotations"]["railyard.dev/converted-from"] =
      from + " " + (md.contains("namespace") ? str(md, "namespace") + "/" : "") + str(md, "name");
  return md;
}

// command + args, with a torchrun launcher turned into the program it runs; procs from its --nproc-per-node.
struct Program {
  std::vector<std::string> command, args;
  std::string nproc;             // "" when no torchrun flag said
  bool torchrun = false;         // torchrun's processes per pod apply (nproc)
  bool direct_torchrun = false;  // the command is torchrun, kept (torchrun mode)
  std::string shell_torchrun;    // a shell script (sh -c) that starts torchrun itself: not rewritten (see below)
};

bool is_shell(const std::string& path) {
  const std::string b = path.substr(path.rfind('/') == std::string::npos ? 0 : path.rfind('/') + 1);
  return b == "sh" || b == "bash" || b == "dash" || b == "zsh" || b == "ash" || b == "ksh";
}

// The script of `sh -c SCRIPT` (also -lc, -ec, -c after other flags); "" when the command is not that shape.
std::string shell_script(const std::vector<std::string>& all) {
  if (all.empty() || !is_shell(all[0])) return "";
  for (size_t i = 1; i + 1 < all.size() && all[i].size() > 1 && all[i][0] == '-'; ++i)
    if (all[i][1] != '-' && all[i].find('c') != std::string::npos) return all[i + 1];
  return "";
}

// torchrun (or python -m torch.distributed.run/launch) as a word of a shell script. Words split at blanks, quotes
// and the shell's separators by hand (no std::regex: libstdc++'s recurses per character, and a script may be
// long).
// Also reads the script's --nproc-per-node (either spelling, "=N" or " N") into *nproc when it gives one.
bool script_starts_torchrun(const std::string& script, std::string* nproc) {
  std::vector<std::string> words(1);
  for (const char ch : script) {
    if (std::string_view(" \t\n\r;&|()`'\"<>").find(ch) != std::string_view::npos) {
      if (!words.back().empty()) words.emplace_back();
    } else {
      words.back() += ch;
    }
  }
  bool found = false;
  for (size_t i = 0; i < words.size(); ++i) {
    const std::string& w = words[i];
    if (w.substr(w.rfind('/') == std::string::npos ? 0 : w.rfind('/') + 1) == "torchrun") found = true;
    if (w == "-m" && i + 1 < words.size() &&
        (words[i + 1] == "torch.distributed.run" || words[i + 1] == "torch.distributed.launch"))
      found = true;
    if (!found) continue;
    for (const char* flag : {"--nproc-per-node", "--nproc_per_node"}) {
      const std::string f = flag;
      if (w.rfind(f + "=", 0) == 0) *nproc = w.substr(f.size() + 1);
      if (w == f && i + 1 < words.size()) *nproc = words[i + 1];
    }
  }
  return found;
}

std::string excerpt(const std::string& s) {
  std::string one = s;
  std::replace(one.begin(), one.end(), '\n', ' ');
  return one.size() > 80 ? one.substr(0, 77) + "..." : one;
}
Program program_of(const std::vector<std::string>& command, const std::vector<std::string>& args,
                   const std::string& field, std::vector<std::string>& notes) {
  if (command.empty())
    throw Error(field +
                ".command: not given, so the image's entrypoint would run, which the manifest does not show; "
                "give the command (for example [torchrun, /app/train.py] or [python3, /app/train.py])");
  std::vector<std::string> all = command;
  all.insert(all.end(), args.begin(), args.end());
  Program p;
  const std::optional<torchrun::Command> tc = torchrun::parse_command(all);
  if (tc && tc->script < all.size() && !tc->deprecated_launch) {
    // torchrun itself, kept: Railyard's torchrun mode starts it once per pod and hands it the world through PET_*,
    // as the Kubeflow operators do. Its flags that would fight those variables go (the operator would refuse them);
    // --nproc-per-node becomes procsPerReplica (PET_NPROC_PER_NODE). No guess at the interpreter that torchrun runs.
    p.torchrun = p.direct_torchrun = true;
    std::set<size_t> drop;
    std::string dropped;
    for (const torchrun::Option& o : tc->options) {
      torchrun::Command one = *tc;
      one.options = {o};
      if (o.dest == "nproc_per_node") {
        p.nproc = o.value;
      } else if (!torchrun::check_options(one, 1)) {
        continue;
      } else {
        dropped += (dropped.empty() ? "" : " ") + o.text;
      }
      for (size_t k = 0; k < o.count; ++k) drop.insert(o.index + k);
    }
    for (size_t i = 0; i < all.size(); ++i)
      if (!drop.count(i)) (i <= tc->script ? p.command : p.args).push_back(all[i]);
    notes.push_back(field + ".command: torchrun kept, in Railyard's torchrun mode (spec.program.launcher torchrun): " +
                    "one torchrun per pod, given PET_NNODES, PET_NODE_RANK, PET_MASTER_ADDR/PORT and " +
                    "PET_NPROC_PER_NODE (procsPerReplica) by Railyard" +
                    (dropped.empty() ? std::string() : "; its flags that set those left out: " + dropped));
  } else if (auto t = split_torchrun(all)) {  // python -m torch.distributed.launch: run the script per rank
    p.torchrun = true;
    p.nproc = t->nproc_per_node;
    // One list: the interpreter and script as command, the script's own arguments as args.
    const size_t head = std::min<size_t>(t->program.size(), t->program.size() > 1 && t->program[1] == "-m" ? 3 : 2);
    p.command.assign(t->program.begin(), t->program.begin() + static_cast<std::ptrdiff_t>(head));
    p.args.assign(t->program.begin() + static_cast<std::ptrdiff_t>(head), t->program.end());
    std::string dropped;
    for (const auto& d : t->dropped) dropped += (dropped.empty() ? "" : " ") + d;
    notes.push_back(field + ".command: torchrun replaced by Railyard's launcher, which starts procsPerReplica " +
                    "processes per pod with torchrun's environment" +
                    (dropped.empty() ? std::string() : "; launcher flags left out: " + dropped));
  } else {
    p.command = command;
    p.args = args;
    if (const std::string script = shell_script(all); !script.empty() && script_starts_torchrun(script, &p.nproc)) {
      p.shell_torchrun = script;  // kept as written, run in torchrun mode (apply_shell_torchrun)
    } else {
      for (const std::string& a : all)
        if (a.find("torchrun") != std::string::npos || a.find("torch.distributed.run") != std::string::npos) {
          notes.push_back(field + ".command: mentions torchrun in '" + excerpt(a) +
                          "', which was not rewritten: Railyard starts the command once per local rank; if it "
                          "starts torchrun, make it run the script directly");
          break;
        }
    }
  }
  return p;
}

// torchrun started by a shell script reads its node count, node rank and master from PET_* variables, which the
// Kubeflow operators set. Railyard sets them in its torchrun launch mode (spec.program.launcher torchrun, one process
// per pod), which auto-detection does not pick for a shell: the converted job names it. The script's own torchrun
// flags cannot be checked by the operator there, so a note says which ones would fight Railyard's.
void apply_shell_torchrun(const Program& p, json& spec, const std::string& field, std::vector<std::string>& notes) {
  if (p.direct_torchrun) spec["program"]["launcher"] = "torchrun";  // what auto picks too: said, for the reader
  if (p.shell_torchrun.empty()) return;
  spec["program"]["launcher"] = "torchrun";
  notes.push_back(field + ".command: the shell script '" + excerpt(p.shell_torchrun) +
                  "' starts torchrun itself: kept as written, with spec.program.launcher torchrun, so each pod runs "
                  "it once and its torchrun gets PET_NNODES, PET_NODE_RANK, PET_MASTER_ADDR/PORT and "
                  "PET_NPROC_PER_NODE (procsPerReplica) from Railyard; the script's torchrun must not set --nnodes, "
                  "--node-rank, --master-*, --rdzv-* or --standalone, nor an --nproc-per-node other than "
                  "procsPerReplica (the operator cannot read them inside a script)");
}

void apply_elastic(json& spec, const json& min, const json& max, const std::string& field) {
  auto lo = count_of(min), hi = count_of(max);
  if (!lo && !hi) return;
  const int64_t replicas = spec["replicas"].get<int64_t>();
  if (lo) spec["elastic"]["minReplicas"] = *lo;
  if (hi) spec["elastic"]["maxReplicas"] = *hi;
  if ((lo && *lo > replicas) || (hi && *hi < replicas))
    throw Error(field + ": the range " + (lo ? std::to_string(*lo) : "") + ".." + (hi ? std::to_string(*hi) : "") +
                " does not hold the job's " + std::to_string(replicas) + " pods");
}

// The spec fields a converted job takes from its main container: device, image, program and resources.
void set_program(json& s, const std::string& image, const Program& prog, const json& resources, int64_t gpus) {
  s["device"] = gpus > 0 ? "cuda" : "cpu";
  s["image"] = image;
  s["program"] = {{"command", prog.command}};
  if (!prog.args.empty()) s["program"]["args"] = prog.args;
  if (resources.is_object() && !resources.empty()) s["resources"] = resources;
}

// A PyTorchJob's roles: Master and Worker only, with one template between them; `main` is the Worker, else the Master.
struct PyTorchRoles {
  const json& master;
  const json& worker;
  const json& main;
  std::string field;  // the main role's pod spec, for notes and errors
  int64_t pods = 0;   // of both roles
};

PyTorchRoles pytorch_roles(const json& roles) {
  if (!roles.is_object() || roles.empty()) throw Error("spec.pytorchReplicaSpecs: missing; nothing to convert");
  for (const auto& [role, _] : roles.items())
    if (role != "Master" && role != "Worker")
      throw Error("spec.pytorchReplicaSpecs." + role +
                  ": only Master and Worker convert (every Railyard pod runs "
                  "the same template)");
  const json& master = at(roles, "Master");
  const json& worker = at(roles, "Worker");
  int64_t pods = 0;
  for (const json* r : {&master, &worker})
    if (r->is_object()) pods += count_of(at(*r, "replicas")).value_or(1);
  if (master.is_object() && worker.is_object() && at(master, "template") != at(worker, "template"))
    throw Error(
        "spec.pytorchReplicaSpecs: Master and Worker have different templates; Railyard runs one template "
        "for every pod (its pod 0 plays the master): make them equal first");
  const std::string role = worker.is_object() ? "Worker" : "Master";
  return {master, worker, worker.is_object() ? worker : master, "spec.pytorchReplicaSpecs." + role + ".template.spec",
          pods};
}

// procsPerReplica: torchrun's --nproc-per-node, else spec.nprocPerNode or elasticPolicy.nProcPerNode; a command that
// is not torchrun runs once per pod whatever they say.
int64_t pytorch_procs(const json& spec, const PyTorchRoles& r, const Program& prog, const std::string& cfield,
                      int64_t gpus, std::vector<std::string>& notes) {
  std::string nproc = prog.nproc;
  std::string nproc_field = cfield + ".command --nproc-per-node";
  if (nproc.empty() && at(spec, "nprocPerNode").is_string()) {
    nproc = spec["nprocPerNode"].get<std::string>(), nproc_field = "spec.nprocPerNode";
  } else if (nproc.empty() && count_of(at(at(spec, "elasticPolicy"), "nProcPerNode"))) {
    nproc = std::to_string(*count_of(spec["elasticPolicy"]["nProcPerNode"]));
    nproc_field = "spec.elasticPolicy.nProcPerNode";
  }
  const bool torchrun = prog.torchrun || !prog.shell_torchrun.empty();
  if (!torchrun && !nproc.empty() && nproc != "1") {
    // training-operator (1.7 on) sets WORLD_SIZE to pods x nprocPerNode when that is a number, whatever the command.
    const auto n = nproc_field == "spec.nprocPerNode" ? count_of(json(nproc)) : std::nullopt;
    notes.push_back(nproc_field + " '" + nproc +
                    "': the command is not torchrun, so the PyTorchJob ran it once per pod; Railyard does the same "
                    "(procsPerReplica 1)" +
                    (n && r.master.is_object()
                         ? "; WORLD_SIZE is the pod count " + std::to_string(r.pods) +
                               ", where the PyTorchJob set pods x nprocPerNode = " + std::to_string(r.pods * *n)
                         : std::string()));
  }
  return torchrun && !nproc.empty() ? procs_from(nproc, nproc_field, gpus, notes) : 1;
}

// spec.runPolicy.schedulingPolicy: the queue becomes Kueue's label, the priority class the pod's.
void apply_scheduling_policy(const json& run, json& job, json& pod, std::vector<std::string>& notes) {
  const json& sched = at(run, "schedulingPolicy");
  if (!str(sched, "queue").empty()) {
    job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = str(sched, "queue");
    notes.push_back(
        "spec.runPolicy.schedulingPolicy.queue: became the label kueue.x-k8s.io/queue-name (Kueue's "
        "plain-pod groups; docs/scheduler.md)");
  }
  if (!str(sched, "priorityClass").empty()) pod["priorityClassName"] = str(sched, "priorityClass");
  for (const char* k : {"minAvailable", "scheduleTimeoutSeconds"})
    if (!at(sched, k).is_null())
      notes.push_back(std::string("spec.runPolicy.schedulingPolicy.") + k +
                      ": not carried over (Railyard binds the whole gang or none)");
}

// A PyTorchJob's elasticPolicy and runPolicy in Railyard's terms, with notes on what has no equivalent.
void apply_pytorch_policies(const json& spec, const Program& prog, const std::string& cfield, json& job, json& pod,
                            std::vector<std::string>& notes) {
  json& s = job["spec"];
  const json& elastic = at(spec, "elasticPolicy");
  apply_elastic(s, at(elastic, "minReplicas"), at(elastic, "maxReplicas"), "spec.elasticPolicy");
  apply_shell_torchrun(prog, s, cfield, notes);
  const json& run = at(spec, "runPolicy");
  if (auto n = count_of(at(elastic, "maxRestarts")))
    s["failurePolicy"]["maxRestarts"] = *n;
  else if (auto b = count_of(at(run, "backoffLimit")))
    s["failurePolicy"]["maxRestarts"] = *b;
  for (const char* k : {"rdzvBackend", "rdzvHost", "rdzvPort", "rdzvId", "rdzvConf", "standalone", "metrics"})
    if (!at(elastic, k).is_null())
      notes.push_back(std::string("spec.elasticPolicy.") + k + ": not carried over (" +
                      (std::string(k) == "metrics" ? "Railyard resizes on lost or returned capacity and kubectl scale, "
                                                     "not on metrics"
                                                   : "Railyard's own rendezvous replaces torch's") +
                      ")");
  for (const char* k : {"cleanPodPolicy", "ttlSecondsAfterFinished", "activeDeadlineSeconds", "suspend"})
    if (!at(run, k).is_null()) s["runPolicy"][k] = run[k];
  if (at(run, "cleanPodPolicy").is_null())
    notes.push_back(
        "spec.runPolicy.cleanPodPolicy: not given; Railyard's default is Running (pods that ended are "
        "kept, running ones deleted when the job ends)");
  apply_scheduling_policy(run, job, pod, notes);
  for (const auto& [r, rs] : at(spec, "pytorchReplicaSpecs").items())
    if (!str(rs, "restartPolicy").empty() && str(rs, "restartPolicy") != "Never")
      notes.push_back("spec.pytorchReplicaSpecs." + r + ".restartPolicy " + str(rs, "restartPolicy") +
                      ": Railyard restarts the whole gang in place from its checkpoint instead (failurePolicy; a "
                      "program's every exit is retryable by default)");
}

Conversion from_pytorchjob(const json& pj) {
  Conversion out;
  auto& notes = out.notes;
  const json& spec = at(pj, "spec");
  const PyTorchRoles r = pytorch_roles(at(spec, "pytorchReplicaSpecs"));
  json pod = at(at(r.main, "template"), "spec");
  if (!pod.is_object()) throw Error(r.field + ": missing");
  json& c = *main_container(pod, "pytorch", r.field);
  const std::string cfield = r.field + ".containers[" + str(c, "name") + "]";
  const std::string image = str(c, "image");
  if (image.empty()) throw Error(cfield + ".image: missing");
  Program prog = program_of(strings(at(c, "command"), cfield + ".command"), strings(at(c, "args"), cfield + ".args"),
                            cfield, notes);
  const json resources = at(c, "resources");
  const int64_t gpus = gpus_of(resources);

  json job = {{"apiVersion", "railyard.dev/v1alpha1"}, {"kind", "TrainingJob"}};
  job["metadata"] = metadata_from(pj, "kubeflow.org/v1 PyTorchJob");
  json& s = job["spec"];
  s["replicas"] = r.pods;
  s["procsPerReplica"] = pytorch_procs(spec, r, prog, cfield, gpus, notes);
  set_program(s, image, prog, resources, gpus);
  if (s["procsPerReplica"].get<int64_t>() > 1)
    notes.push_back("WORLD_SIZE and RANK count processes (pods x procsPerReplica), as under torchrun");
  apply_pytorch_policies(spec, prog, cfield, job, pod, notes);

  pod_notes(pod, c, r.field, notes);
  c = template_container(c, cfield, notes);
  keep_unbuffered(c, notes);
  pod.erase("restartPolicy");
  s["template"] = {{"spec", pod}};
  const json& tmeta = at(at(r.main, "template"), "metadata");
  if (tmeta.is_object() && !tmeta.empty()) s["template"]["metadata"] = tmeta;
  out.job = job;
  return out;
}

// The TrainingRuntime or ClusterTrainingRuntime a TrainJob runs on, found among the input documents.
struct Runtime {
  const json* doc = nullptr;
  std::string kind, name;
  std::string label() const { return kind + " '" + name + "'"; }  // for notes and errors
};

Runtime find_runtime(const json& spec, const std::vector<json>& docs) {
  const json& ref = at(spec, "runtimeRef");
  Runtime rt;
  rt.name = str(ref, "name");
  rt.kind = str(ref, "kind").empty() ? "ClusterTrainingRuntime" : str(ref, "kind");
  if (rt.name.empty()) throw Error("spec.runtimeRef.name: missing; a TrainJob names its runtime");
  for (const json& d : docs)
    if (str(d, "kind") == rt.kind && str(at(d, "metadata"), "name") == rt.name) rt.doc = &d;
  if (rt.doc == nullptr) {
    const std::string lower = rt.kind == "TrainingRuntime" ? "trainingruntime" : "clustertrainingruntime";
    throw Error("spec.runtimeRef: the TrainJob runs on " + rt.kind + " '" + rt.name +
                "', which is not in the input; its image, command, processes per node and pod template come from "
                "there: add it (kubectl get " +
                lower + " " + rt.name + " -o yaml) as another document or file");
  }
  return rt;
}

// The runtime's trainer replicatedJob ("node", or the one labelled the trainer step); the others (initializers) are
// noted as not carried over.
const json& trainer_node(const Runtime& rt, const json& rspec, std::vector<std::string>& notes) {
  const json& rjobs = at(at(at(rspec, "template"), "spec"), "replicatedJobs");
  if (!rjobs.is_array() || rjobs.empty()) throw Error(rt.label() + " spec.template.spec.replicatedJobs: none");
  const json* node = nullptr;
  for (const json& rj : rjobs) {
    const std::string step =
        str(at(at(at(rj, "template"), "metadata"), "labels"), "trainer.kubeflow.org/trainjob-ancestor-step");
    if (str(rj, "name") == "node" || step == "trainer") node = &rj;
  }
  for (const json& rj : rjobs)
    if (&rj != node)
      notes.push_back(
          rt.label() + " replicatedJob '" + str(rj, "name") +
          "': not carried over (its initializer image does not run here: give the job spec.initializer.data with the "
          "dataset's http(s) URLs or files, and spec.storage for its volume: docs/storage.md)");
  if (node == nullptr) throw Error(rt.label() + ": no replicatedJob named node (the trainer)");
  return *node;
}

// A TrainJob's command: spec.trainer's, else the runtime container's (args too, unless the trainer gives them).
struct TrainerCommand {
  std::vector<std::string> command, args;
  std::string field;  // where the command came from
};

TrainerCommand trainer_command(const json& trainer, const json& c, const std::string& cfield) {
  TrainerCommand t;
  t.command = strings(at(trainer, "command"), "spec.trainer.command");
  t.args = strings(at(trainer, "args"), "spec.trainer.args");
  t.field = "spec.trainer";
  if (t.command.empty()) {
    t.command = strings(at(c, "command"), cfield + ".command");
    if (t.args.empty()) t.args = strings(at(c, "args"), cfield + ".args");
    t.field = cfield;
  }
  return t;
}

// Processes per node as the TrainJob or its runtime sets them, and the field that set them; torchrun's own
// --nproc-per-node wins.
std::pair<std::string, std::string> trainjob_nproc(const json& trainer, const json& torch, const Runtime& rt,
                                                   const Program& prog, const std::string& cmd_field) {
  const json& nproc_v =
      !at(trainer, "numProcPerNode").is_null() ? at(trainer, "numProcPerNode") : at(torch, "numProcPerNode");
  std::string nproc = nproc_v.is_string()           ? nproc_v.get<std::string>()
                      : nproc_v.is_number_integer() ? nproc_v.dump()
                                                    : "auto";
  std::string nproc_field = !at(trainer, "numProcPerNode").is_null() ? "spec.trainer.numProcPerNode"
                                                                     : rt.label() + " mlPolicy.torch.numProcPerNode";
  if (!prog.nproc.empty()) nproc = prog.nproc, nproc_field = cmd_field + ".command --nproc-per-node";
  return {nproc, nproc_field};
}

// The trainer's env over the runtime container's, by name.
void merge_trainer_env(const json& trainer, json& c) {
  if (!at(trainer, "env").is_array()) return;
  json env = at(c, "env").is_array() ? c["env"] : json::array();
  for (const json& e : trainer["env"]) {
    auto it = std::find_if(env.begin(), env.end(), [&](const json& x) { return str(x, "name") == str(e, "name"); });
    if (it != env.end())
      *it = e;
    else
      env.push_back(e);
  }
  c["env"] = env;
}

Conversion from_trainjob(const json& tj, const std::vector<json>& docs) {
  Conversion out;
  auto& notes = out.notes;
  const json& spec = at(tj, "spec");
  const Runtime rt = find_runtime(spec, docs);
  const json& rspec = at(*rt.doc, "spec");
  const json& ml = at(rspec, "mlPolicy");
  const json& torch = at(ml, "torch");
  if (!torch.is_object())
    throw Error(rt.label() +
                " spec.mlPolicy: no torch policy; only torch runtimes convert (Railyard "
                "starts PyTorch programs; MPI and DeepSpeed runtimes have no equivalent)");
  const std::string field = rt.label() + " replicatedJob node";
  json pod = at(at(at(at(trainer_node(rt, rspec, notes), "template"), "spec"), "template"), "spec");
  if (!pod.is_object()) throw Error(field + ": no pod template");
  json& c = *main_container(pod, "node", field);
  const std::string cfield = field + " container " + str(c, "name");
  const json& trainer = at(spec, "trainer");

  const std::string image = !str(trainer, "image").empty() ? str(trainer, "image") : str(c, "image");
  if (image.empty()) throw Error("spec.trainer.image: missing here and in " + cfield);
  const TrainerCommand cmd = trainer_command(trainer, c, cfield);
  Program prog = program_of(cmd.command, cmd.args, cmd.field, notes);
  json resources = at(trainer, "resourcesPerNode").is_object() ? trainer["resourcesPerNode"] : at(c, "resources");
  const int64_t gpus = gpus_of(resources);
  const int64_t nodes = count_of(at(trainer, "numNodes")).value_or(count_of(at(ml, "numNodes")).value_or(1));
  const auto [nproc, nproc_field] = trainjob_nproc(trainer, torch, rt, prog, cmd.field);

  json job = {{"apiVersion", "railyard.dev/v1alpha1"}, {"kind", "TrainingJob"}};
  job["metadata"] = metadata_from(tj, "trainer.kubeflow.org/v1alpha1 TrainJob");
  json& s = job["spec"];
  s["replicas"] = nodes;
  if (prog.torchrun || !prog.shell_torchrun.empty()) {
    s["procsPerReplica"] = procs_from(nproc, nproc_field, gpus, notes);
  } else {
    s["procsPerReplica"] = 1;
    notes.push_back(cmd.field +
                    ".command: not torchrun, so Trainer ran it once per node; Railyard does the same "
                    "(procsPerReplica 1)");
  }
  set_program(s, image, prog, resources, gpus);
  const json& elastic = at(torch, "elasticPolicy");
  apply_elastic(s, at(elastic, "minNodes"), at(elastic, "maxNodes"), rt.label() + " mlPolicy.torch.elasticPolicy");
  apply_shell_torchrun(prog, s, cmd.field, notes);
  if (auto n = count_of(at(elastic, "maxRestarts"))) s["failurePolicy"]["maxRestarts"] = *n;
  if (at(spec, "suspend") == true) s["runPolicy"]["suspend"] = true;
  if (!at(rspec, "podGroupPolicy").is_null())
    notes.push_back(rt.label() + " podGroupPolicy: not carried over (Railyard binds the whole gang or none)");
  for (const char* k : {"initializer", "podSpecOverrides", "labels", "annotations", "managedBy"})
    if (!at(spec, k).is_null()) notes.push_back(std::string("spec.") + k + ": not carried over (no equivalent yet)");

  merge_trainer_env(trainer, c);
  pod_notes(pod, c, field, notes);
  c = template_container(c, cfield, notes);
  pod.erase("restartPolicy");
  s["template"] = {{"spec", pod}};
  out.job = job;
  return out;
}

}  // namespace

std::optional<TorchrunCommand> split_torchrun(const std::vector<std::string>& cmd) {
  const std::optional<torchrun::Command> c = torchrun::parse_command(cmd);
  if (!c || c->script >= cmd.size()) return std::nullopt;  // no script: not something to convert
  TorchrunCommand t;
  for (const torchrun::Option& o : c->options) {
    if (o.dest == "nproc_per_node") {
      t.nproc_per_node = o.value;
      continue;  // carried over as procsPerReplica
    }
    t.dropped.push_back(o.text);
  }
  if (c->no_python) {
    t.program.assign(cmd.begin() + static_cast<std::ptrdiff_t>(c->script), cmd.end());
  } else {
    t.program = {c->interpreter};
    if (c->module) t.program.push_back("-m");
    t.program.insert(t.program.end(), cmd.begin() + static_cast<std::ptrdiff_t>(c->script), cmd.end());
  }
  return t;
}

Conversion convert_manifests(const std::vector<json>& input) {
  // `kubectl get ... -o yaml` of several objects writes one List (kind List, or <Kind>List) with them as items.
  std::vector<json> docs;
  for (const json& d : input) {
    const std::string kind = str(d, "kind");
    if (kind.size() >= 4 && kind.compare(kind.size() - 4, 4, "List") == 0 && at(d, "items").is_array()) {
      for (const json& item : d["items"]) docs.push_back(item);
    } else {
      docs.push_back(d);
    }
  }
  const json* job = nullptr;
  for (const json& d : docs) {
    const std::string kind = str(d, "kind");
    if (kind == "PyTorchJob" || kind == "TrainJob") {
      if (job != nullptr) throw Error("the input holds more than one PyTorchJob or TrainJob: convert one at a time");
      job = &d;
    }
  }
  if (job == nullptr) throw Error("the input holds no PyTorchJob (kubeflow.org/v1) or TrainJob (trainer.kubeflow.org)");
  const std::string api = str(*job, "apiVersion");
  if (str(*job, "kind") == "PyTorchJob") {
    if (api != "kubeflow.org/v1") throw Error("apiVersion '" + api + "': only kubeflow.org/v1 PyTorchJobs convert");
    return from_pytorchjob(*job);
  }
  if (api.rfind("trainer.kubeflow.org/", 0) != 0)
    throw Error("apiVersion '" + api + "': only trainer.kubeflow.org TrainJobs convert");
  return from_trainjob(*job, docs);
}

}  // namespace railyard::cli
