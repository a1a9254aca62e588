// A TrainingJob's spec read into plain values with the CRD's defaults, and the checks the schema cannot express: the
// one reader of the API, used by the operator (which holds a spec to it), railyard-monitor (the failure policy's
// thresholds) and the CLI (railyard convert).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/worker_config.h"

namespace railyard::api {

using Json = nlohmann::json;

struct ModelShape {
  int layers = 0, hidden = 0, heads = 0, seq_len = 0, vocab = 0;
};

// spec.model.moe: a mixture-of-experts MLP in every layer (the worker's --moe-*); experts 0 = the dense MLP.
struct MoeSpec {
  int experts = 0;
  int top_k = 1;
  double capacity_factor = 1.25;
  double aux_loss_coef = 0.01;
};

// spec.training's optimisation recipe beyond the batch: passed to the worker as written (unset: the worker's default,
// which is the CRD's; the API server fills the CRD's defaults in anyway).
struct Recipe {
  std::optional<double> learning_rate, min_lr_fraction, weight_decay, grad_clip;
  std::optional<int64_t> warmup_steps, seed, val_every, sample_every, sample_tokens;
};

// Bounds the operator holds a spec to, the CRD's maxima too (tests/unit/operator/limits_test.cc compares every
// integer field's maximum with what parse_job accepts). Why these: replicas, the gangs the informers and slow-start
// creation were measured with (docs/benchmarks.md: 1,000 replicas, an informer of 10,000 pods); steps and seconds, what
// an int and a nanosecond clock hold (a deadline of 2^40 s overflowed the time_point it was added to); strings, a
// path's PATH_MAX.
inline constexpr int kMaxReplicas = 10000;
inline constexpr int64_t kMaxSteps = 2147483647;    // spec.training.steps, spec.program.totalSteps (an int)
inline constexpr int64_t kMaxSeconds = 2147483647;  // runPolicy.activeDeadlineSeconds, ttlSecondsAfterFinished
inline constexpr size_t kMaxStringLength = 4096;    // every string field parse_job reads (image, paths, ...)
// spec.training.seed: 2^53 - 1. The API server keeps a schema's maximum as a float64, and INT64_MAX rounds to 2^63,
// which it turned into INT64_MIN: the CRD with that maximum refused every seed, its own default 1337 included, and
// could not be installed. Every integer below 2^53 is an exact double.
inline constexpr int64_t kMaxSeed = 9007199254740991;

// spec.checkpoint.intervalSteps' default (the CRD's): what a spec.checkpoint without it saves at.
inline constexpr int64_t kDefaultCheckpointIntervalSteps = 100;

// spec.placement.scheduler's default: Railyard's own rail-aware gang placement and binding.
inline constexpr const char* kRailyardScheduler = "railyard";

// How long after a job ends a pod may still run before cleanPodPolicy Running deletes it: the agent learns of the end
// at its next status poll (RAILYARD_AGENT_POLL_MS, 0.5 s) and gives its workers RAILYARD_AGENT_GRACE_SECONDS (10 s).
inline constexpr std::chrono::seconds kPodStopWait{20};

// spec.storage: a volume the job owns (docs/storage.md). The operator makes the PersistentVolumeClaim
// storage_claim_name(job) before the first pod and mounts it in every worker container at mount_path.
struct StorageSpec {
  std::string size;                          // a Kubernetes quantity ("10Gi"), the claim's requested storage
  std::optional<std::string> storage_class;  // absent: the cluster's default class; "": no class (a static volume)
  std::string access_mode = "ReadWriteMany";
  std::string mount_path = "/shared";
  bool retain = false;  // whenDeleted Retain: the claim outlives the job, and a later job of the name reuses it
};
inline constexpr const char* kStorageVolumeName = "railyard-storage";
inline std::string storage_claim_name(const std::string& job) { return job + "-storage"; }
// A Kubernetes quantity of bytes as the API server reads one: a decimal number, then an SI or binary suffix or an
// exponent ("10Gi", "500M", "1e9", "1.5Ti"); greater than zero.
bool is_storage_quantity(const std::string& q);

// spec.initializer: what the job's initializer pod prepares before the gang's first pod (docs/storage.md
// "Initializer"): `railyard data prepare --reuse` over the data sources into `output`, and the initial model.
struct InitializerSpec {
  // spec.initializer.model.source: an llm.c model file (URL or path in the pod) fetched into spec.model.initFrom by
  // `railyard model fetch`; "" = none.
  std::string model_source;
  std::vector<std::string> sources;  // data: http(s) URLs, or absolute paths of files in the pod
  // spec.initializer.data.image: a directory of an image (a corpus shipped as an image) whose files are data too,
  // after the sources; "" = none. Copied out by an init container of that image (docs/storage.md).
  std::string image, image_path, image_pull_policy;  // reference, absolute path in it, "" = the cluster's default
  std::string tokenizer = "bytes";                   // bytes | gpt2
  double val_fraction = 0.1;
  std::string output;  // given, or <spec.storage.mountPath>/data
  bool has_data() const { return !sources.empty() || !image.empty(); }
};
// The emptyDir the image's files are copied into, and where the initializer's containers mount it.
inline constexpr const char* kImageDataVolumeName = "railyard-image-data";
inline constexpr const char* kImageDataMountPath = "/railyard-image-data";
inline constexpr size_t kMaxInitializerSources = 64;

struct JobSpec {
  std::string name, ns;
  int replicas = 1;
  std::optional<int> min_replicas, max_replicas;
  int procs_per_replica = 1;
  std::string device = "auto";
  std::string image;
  std::string preset;
  ModelShape model;
  // spec.model.initFrom: the llm.c GPT-2 model file the workers start from ("" = random init). The resolved config
  // carries it as model.initFrom; the worker checks the file's shape against spec.model and loads it unless a
  // checkpoint is restored (a restore wins).
  std::string init_from;
  // spec.program: the job runs this command (in spec.image) once per local rank under Railyard's launcher instead of
  // the built-in GPT trainer; then no model/data/training/parallelism/memory fields apply (docs/programs.md).
  bool program = false;
  std::vector<std::string> program_command, program_args;
  // spec.program.launcher resolved (auto: torchrun when the command starts torchrun, common/torchrun.h): true = the
  // agent starts the command once per pod and hands torchrun the world through PET_* (docs/programs.md "torchrun in
  // the container"); false = once per local rank with torchrun's per-worker variables.
  bool program_torchrun = false;
  int steps = 0;  // spec.training.steps, or spec.program.totalSteps (0 = not known) for a program
  // spec.program.addresses: DNS (true, the default) gives a program's ranks MASTER_ADDR and the hostfile as the pods'
  // DNS names through the job's headless Service; IP, their pod IPs (common/stable_names.h).
  bool dns_addresses = true;
  int global_batch = 8;
  int micro_batch = 1;
  int seq_len = 0;  // training sequence length (model's when not given)
  Recipe recipe;
  bool auto_parallel = false;
  int tensor = 1, pipeline = 1;
  std::optional<int> data;  // explicit data-parallel degree
  int zero = 0;
  // spec.parallelism.deterministic: the fixed-order gradient reduction (docs/parallel.md), so results do not depend
  // on the data-parallel degree; the worker gets it in the resolved config's parallelism object.
  bool deterministic = false;
  MoeSpec moe;
  // spec.parallelism.expert / expertAllToAll: expert-parallel degree (groups of consecutive data-parallel ranks) and
  // the dispatch all-to-all; expert_all_to_all "" = not given (flat, or the planner's choice with auto).
  int expert = 1;
  bool expert_given = false;  // spec.parallelism.expert written (with auto the planner picks it otherwise)
  std::string expert_all_to_all;
  // spec.parallelism.sequenceParallel / context: Megatron sequence parallelism over the tensor group; context
  // parallelism (each sequence split over `context` ranks, ring attention). world = data x context x tensor x pipeline.
  bool sequence_parallel = false;
  int context = 1;
  // spec.memory: activation recomputation (none, selective, full; recompute_layers -1 = all layers) and optimizer
  // offload (none, optimizer). "" = not given (none, or the planner's choice with auto).
  std::string recompute, offload;
  int recompute_layers = -1;
  int max_restarts = 3;
  std::vector<int> permanent_exit_codes, retryable_exit_codes;
  // spec.failurePolicy's detection settings, acted on by railyard-monitor's rules (monitor/rules.h Policy) and, for
  // exclude_failed_nodes, by the operator's placement too.
  int64_t hang_timeout_seconds = 300;
  double straggler_factor = 2.0;
  bool exclude_failed_nodes = true;
  std::optional<int64_t> active_deadline_seconds, ttl_seconds_after_finished;
  bool suspend = false;
  // runPolicy.cleanPodPolicy: All (delete every pod at the end), Running (keep the pods that ended; delete those still
  // running kPodStopWait after the end), None (keep every pod).
  std::string clean_pod_policy = "Running";
  std::map<std::string, std::string> node_selector;
  // spec.placement.scheduler: kRailyardScheduler (the operator places and binds the gang itself) or the name of the
  // cluster's scheduler that binds the pods (docs/scheduler.md "Another scheduler").
  std::string scheduler = kRailyardScheduler;
  // spec.checkpoint.memoryIntervalSteps: in-memory snapshot every N steps (0 = off); the worker gets it in the
  // resolved config's checkpoint object.
  int64_t memory_interval_steps = 0;
  // spec.checkpoint.intervalSteps (0 = not given): the worker's save interval; a program gets it as
  // RAILYARD_CHECKPOINT_INTERVAL_STEPS. keep and async: the built-in trainer's (unset: its defaults, the CRD's).
  int64_t checkpoint_interval_steps = 0;
  bool checkpoint = false;  // spec.checkpoint given (railyard-monitor's checkpoint-age rule applies)
  std::optional<int64_t> checkpoint_keep;
  std::optional<bool> checkpoint_async;
  // spec.data.train / spec.data.val / spec.checkpoint.path as written ("" when absent); checked against the
  // operator's --data-root / --checkpoint-root. train and val are globs (a directory means its train_*.bin /
  // val_*.bin); val "" = val_*.bin beside the training shards. The resolved config carries them as data.train/val.
  std::string data_train, data_val, checkpoint_path;
  std::optional<StorageSpec> storage;          // spec.storage
  std::optional<InitializerSpec> initializer;  // spec.initializer.data
};

// What is wrong and how to fix it. `reason` is a CamelCase condition reason naming the field
// (InvalidParallelismTensor); `message` starts with the field path and ends with the fix.
struct Violation {
  std::string field, reason, message;
};

struct ParsedJob {
  JobSpec spec;
  std::optional<Violation> violation;
};

// Reads a whole TrainingJob object. Wrong types, out-of-range values and cross-field inconsistencies come back as
// the first violation found; nothing throws.
ParsedJob parse_job(const Json& job);

// The platform's roots for job paths (operator flags --data-root, --checkpoint-root); "" = no restriction.
struct PathRoots {
  std::string data, checkpoint;
};
// A violation (reason PathOutsideRoot, the field path first) when spec.data.train/val or spec.checkpoint.path lies
// outside its root after lexical normalisation ("/data/../etc" is outside "/data"), or spec.model.initFrom outside
// both roots (a model file is input data or an earlier job's export). The operator cannot see the pods'
// filesystems, so symlinks and whether a glob matches are the worker's checks (RAILYARD_DATA_ROOT /
// RAILYARD_CHECKPOINT_ROOT).
std::optional<Violation> check_path_roots(const JobSpec& spec, const PathRoots& roots);

struct WorldLayout {
  int size = 0, data = 0, tensor = 1, pipeline = 1, context = 1, expert = 1;
  bool operator==(const WorldLayout&) const = default;
};

// The layout of `replicas` pods (tensor fastest-varying; data fills the rest: size / (tensor x pipeline x context)).
// Assumes a validated spec (with auto: after apply_plan in plan_glue.h).
WorldLayout world_layout(const JobSpec& spec, int replicas);

// The largest world (in replicas) an elastic job can run with `available` healthy pods: within
// elastic.minReplicas..replicas, with tensor*pipeline dividing the world and globalBatch divisible by
// microBatch*data, and the expert-parallel degree dividing the data-parallel ranks (the worker exits 2 otherwise).
// 0 when no size fits (or the job is not elastic, or gives an explicit data degree).
int elastic_world_replicas(const JobSpec& spec, int available);

// What the worker refuses among the parallelism family (MoE, expert, sequence and context parallelism, recompute,
// offload, ZeRO) for the world of `replicas` pods with the spec's degrees; nullopt when the worker runs it.
std::optional<Violation> check_family(const JobSpec& spec, int replicas);

// The worker configuration of a world of `replicas` pods (common/worker_config.h), handed to every agent through the
// rendezvous service. The generation's own fields (restore, generation, dpSplit) are the caller's.
WorkerConfig resolved_config(const JobSpec& spec, int replicas);

// Longest job name whose pod names (`<job>-worker-<index>`, up to index 999) and label values still fit in 63
// characters. A job of more than 1,000 replicas (spec.replicas or spec.elastic.maxReplicas) needs a name as many
// characters shorter as its highest index has more digits: pod hostnames are DNS labels (worker_hostname_length).
inline constexpr size_t kMaxJobNameLength = 52;
// Length of the hostname `<job>-worker-<replicas - 1>` of a job's last pod.
size_t worker_hostname_length(size_t job_name_length, int replicas);
// spec.program.command and args: items per list and characters per item (the CRD's maxItems and maxLength).
inline constexpr size_t kMaxProgramArgs = 1024;
inline constexpr size_t kMaxProgramArgLength = 65536;

// status.progress: "step/total", or just "step" for a program that gave no spec.program.totalSteps.
std::string progress_text(int64_t step, int total_steps);

}  // namespace railyard::api
