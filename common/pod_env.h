// The environment variables that cross a process boundary: the operator writes them into a worker pod's spec, the
// pod agent into each rank's process, a platform into a component's Deployment; the worker, the agent and programs read
// them. Each name is defined once in common/ (here, or beside the contract it belongs to: flash_checkpoint.h,
// stable_names.h, torchrun.h, rendezvous_protocol.h, tls/job_identity.h) and both sides use the constant;
// tools/contracts_check (ctest `contracts_check`) fails on a RAILYARD_* literal anywhere else in the C++ sources and
// on a RAILYARD_* name in the docs, charts, examples or Python helpers that is not defined in common/.
// docs/programs.md lists what a program sees.
#pragma once

namespace railyard::pod_env {

// --- Set by the operator on every worker pod (operator/controller/pod_builder.cc).
inline constexpr const char* kJobName = "RAILYARD_JOB_NAME";
inline constexpr const char* kJobNamespace = "RAILYARD_JOB_NAMESPACE";
inline constexpr const char* kJobUid = "RAILYARD_JOB_UID";  // fences checkpoints to this job (worker/cmd)
inline constexpr const char* kPodName = "RAILYARD_POD_NAME";
inline constexpr const char* kPodNamespace = "RAILYARD_POD_NAMESPACE";
inline constexpr const char* kPodIp = "RAILYARD_POD_IP";
inline constexpr const char* kNodeName = "RAILYARD_NODE_NAME";
inline constexpr const char* kReplicaIndex = "RAILYARD_REPLICA_INDEX";
inline constexpr const char* kProcsPerReplica = "RAILYARD_PROCS_PER_REPLICA";
inline constexpr const char* kProcsPerPod = "RAILYARD_PROCS_PER_POD";  // local ranks the agent starts
inline constexpr const char* kDevice = "RAILYARD_DEVICE";              // spec.device
inline constexpr const char* kMaxRestarts = "RAILYARD_MAX_RESTARTS";   // spec.failurePolicy.maxRestarts
inline constexpr const char* kTotalSteps = "RAILYARD_TOTAL_STEPS";     // spec.program.totalSteps, when given
inline constexpr const char* kMetricsPort = "RAILYARD_METRICS_PORT";   // the trainer's /metrics (first rank's)
inline constexpr const char* kAgentMetricsPort = "RAILYARD_AGENT_METRICS_PORT";
inline constexpr const char* kAgentRankMetrics = "RAILYARD_AGENT_RANK_METRICS";  // the agent serves ranks' series
inline constexpr const char* kRendezvousAddr = "RAILYARD_RENDEZVOUS_ADDR";
inline constexpr const char* kRendezvousCa = "RAILYARD_RENDEZVOUS_CA";
inline constexpr const char* kRendezvousToken = "RAILYARD_RENDEZVOUS_TOKEN";
// The platform's roots for job paths (operator --data-root / --checkpoint-root): the worker checks the paths it opens
// against them after resolving symlinks, which the operator cannot see.
inline constexpr const char* kDataRoot = "RAILYARD_DATA_ROOT";
inline constexpr const char* kCheckpointRoot = "RAILYARD_CHECKPOINT_ROOT";

// --- The pod agent's own tuning (worker/agent/pod_agent.cc; defaults there, docs/operator.md).
inline constexpr const char* kAgentDir = "RAILYARD_AGENT_DIR";
inline constexpr const char* kAgentGraceSeconds = "RAILYARD_AGENT_GRACE_SECONDS";
inline constexpr const char* kAgentPeerPort = "RAILYARD_AGENT_PEER_PORT";
inline constexpr const char* kAgentPollMs = "RAILYARD_AGENT_POLL_MS";
inline constexpr const char* kAgentUnreachableSeconds = "RAILYARD_AGENT_UNREACHABLE_SECONDS";
// The agent's hang detection (worker/agent/hang_watch.h): seconds a rank's process may stay stopped, and the floor of
// the stall threshold; decimal seconds, 0 turns the rule off. Set them in the job's pod template to tune one job.
inline constexpr const char* kHangStoppedSeconds = "RAILYARD_HANG_STOPPED_SECONDS";
inline constexpr const char* kHangStallSeconds = "RAILYARD_HANG_STALL_SECONDS";

// --- Set by the agent on each rank's process (worker/agent/rank_env.cc) and read by the worker or a program.
inline constexpr const char* kConfig = "RAILYARD_CONFIG";  // the resolved worker configuration's file
inline constexpr const char* kNumPods = "RAILYARD_NUM_PODS";
inline constexpr const char* kPodIndex = "RAILYARD_POD_INDEX";
inline constexpr const char* kDp = "RAILYARD_DP";
inline constexpr const char* kTp = "RAILYARD_TP";
inline constexpr const char* kPp = "RAILYARD_PP";
inline constexpr const char* kRestore = "RAILYARD_RESTORE";         // the step to restore ("" = newest)
inline constexpr const char* kStoreToken = "RAILYARD_STORE_TOKEN";  // the rendezvous store's per-generation secret
// "1" while the agent copies this rank's in-memory snapshots to a peer pod: the built-in trainer then reads what the
// peer holds (checkpoint/peer_held.h) before each put and keeps the snapshot the peer holds. Not set: no peer copy.
inline constexpr const char* kShmPeerCopy = "RAILYARD_SHM_PEER_COPY";

// --- The world in torch.distributed's names (env:// initialisation): the agent (worker/agent/rank_env.cc) and
// `railyard-worker train --nproc` (worker/parallel/dist_launcher.cc) set them on every rank; the worker, Gloo's
// store (worker/comm) and programs read them; `railyard convert` recognises them in a PyTorchJob.
inline constexpr const char* kRank = "RANK";
inline constexpr const char* kLocalRank = "LOCAL_RANK";
inline constexpr const char* kWorldSize = "WORLD_SIZE";
inline constexpr const char* kLocalWorldSize = "LOCAL_WORLD_SIZE";
inline constexpr const char* kMasterAddr = "MASTER_ADDR";
inline constexpr const char* kMasterPort = "MASTER_PORT";
inline constexpr const char* kGroupRank = "GROUP_RANK";  // the pod's index (torchrun's node rank)
inline constexpr const char* kRoleRank = "ROLE_RANK";

// --- The worker process's own settings (any launcher).
inline constexpr const char* kCommTimeoutMs = "RAILYARD_COMM_TIMEOUT_MS";  // Gloo collectives' timeout
inline constexpr const char* kNumThreads = "RAILYARD_NUM_THREADS";         // CPU kernels' threads
inline constexpr const char* kDataDir = "RAILYARD_DATA_DIR";               // default --data
inline constexpr const char* kGpt2Dir = "RAILYARD_GPT2_DIR";               // GPT-2 vocabulary files
inline constexpr const char* kCudaModule = "RAILYARD_CUDA_MODULE";         // path of librailyard_cuda.so
inline constexpr const char* kLogLevel = "RAILYARD_LOG_LEVEL";             // every component

// --- railyard-monitor's Deployment.
inline constexpr const char* kMonitorWebhookToken = "RAILYARD_MONITOR_WEBHOOK_TOKEN";

// --- Fault injection for the checkpoint tests (checkpoint/fs_util.cc; tests/unit/checkpoint/commit_test.cc): crash
// at a named point of the commit, or take the path of file systems without renameat2(RENAME_EXCHANGE).
inline constexpr const char* kCkptCrashAt = "RAILYARD_CKPT_CRASH_AT";
inline constexpr const char* kCkptNoExchange = "RAILYARD_CKPT_NO_EXCHANGE";

}  // namespace railyard::pod_env
