// `railyard-worker train`'s options (worker/cmd/train_options.h): built once from the command line, the worker
// configuration (--config), the environment and the defaults, in that precedence; a bad value is refused naming the
// flag, the configuration's field or the variable.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/worker_config.h"
#include "worker/cmd/command_line.h"
#include "worker/cmd/flags.h"

using namespace railyard;
using namespace railyard::worker;

namespace {

TrainOptions parse(std::vector<std::string> args, const LauncherEnv& env = {}) {
  args.insert(args.begin(), {"railyard-worker", "train"});
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  return parse_train_options(static_cast<int>(argv.size()), argv.data(), 2, env);
}

// The message the options are refused with ("" when they are accepted).
std::string refusal(const std::vector<std::string>& args, const LauncherEnv& env = {}) {
  try {
    (void)parse(args, env);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

// A worker configuration file as the agent writes it; removed with the object.
struct ConfigFile {
  std::string path;
  explicit ConfigFile(const WorkerConfig& c) {
    char tmpl[] = "/tmp/train-options-XXXXXX";
    const int fd = mkstemp(tmpl);
    REQUIRE(fd >= 0);
    close(fd);
    path = tmpl;
    std::ofstream(path) << to_json(c).dump();
  }
  ~ConfigFile() { std::remove(path.c_str()); }
};

}  // namespace

TEST_CASE("train options: the defaults live in one place and need no flag") {
  const TrainOptions o = parse({});
  CHECK(o.device == "auto");
  CHECK(o.steps == 10);
  CHECK(o.batch == 4);
  CHECK(o.seq == 64);
  CHECK(o.lr == doctest::Approx(6e-4));
  CHECK(o.seed == 1337);
  CHECK(o.zero == 0);
  CHECK(o.tp == 1);
  CHECK(o.ep_a2a == "flat");
  CHECK(o.ckpt_keep == 3);
  CHECK(o.ckpt_async);
  CHECK(o.ckpt_term_budget == 8);
  CHECK(o.threads > 0);         // resolved: the CPUs this process may use
  CHECK(o.resume == "never");   // auto with nothing to restore from
  CHECK_FALSE(o.metrics_port);  // off without the flag or RAILYARD_METRICS_PORT
  CHECK(o.metrics_host == "127.0.0.1");
  CHECK_FALSE(o.data);
  CHECK(o.gemm_split == cpu::GemmThreading::kPool);
}

TEST_CASE("train options: each kind of flag sets its typed field") {
  const TrainOptions o = parse({"--steps",
                                "7",
                                "--lr=0.001",
                                "--dp-split",
                                "3,1",
                                "--deterministic",
                                "--tp",
                                "2",
                                "--sequence-parallel",
                                "--offload",
                                "optimizer",
                                "--ckpt-async",
                                "off",
                                "--gemm-split",
                                "openblas",
                                "--ckpt-dir",
                                "/ck",
                                "--global-batch",
                                "1024",
                                "--moe-experts",
                                "4",
                                "--moe-top-k",
                                "2",
                                "--init-from",
                                "/m.bin",
                                "--metrics-port",
                                "9400",
                                "--seed",
                                "42"});
  CHECK(o.steps == 7);
  CHECK(o.lr == doctest::Approx(0.001));
  CHECK(o.dp_split == std::vector<int>{3, 1});
  CHECK(o.deterministic);
  CHECK(o.tp == 2);
  CHECK(o.sequence_parallel);
  CHECK(o.offload == OffloadMode::kOptimizer);
  CHECK_FALSE(o.ckpt_async);
  CHECK(o.gemm_split == cpu::GemmThreading::kOpenBlas);
  CHECK(o.global_batch_tokens == 1024);
  CHECK(o.moe_experts == 4);
  CHECK(o.moe_top_k == 2);
  CHECK(o.moe_tuning_given);
  CHECK(o.init_from == "/m.bin");
  CHECK(o.metrics_port == 9400);
  CHECK(o.seed == 42);
  CHECK(o.resume == "auto");  // a checkpoint directory to restore from
  CHECK(o.has("steps"));
  CHECK_FALSE(o.has("batch"));
}

TEST_CASE("train options: every flag is in the usage text") {
  const std::string usage = kUsage;
  for (const std::string& f : train_flag_names()) {
    INFO("--" << f);
    CHECK(usage.find("--" + f + " ") != std::string::npos);
  }
  CHECK(train_flag_names().size() > 50);
}

TEST_CASE("train options: the command line wins over the configuration, which wins over the environment") {
  WorkerConfig c;
  c.training = WorkerConfig::Training{};
  c.training->steps = 30;
  c.training->micro_batch = 2;
  c.training->seq_len = 16;
  c.training->global_batch = 8;  // sequences: the option counts tokens
  c.data = WorkerConfig::Data{"/data/train_*.bin", std::nullopt};
  c.checkpoint = WorkerConfig::Checkpoint{};
  c.checkpoint->path = "/ck";
  c.restore = "";
  const ConfigFile file(c);
  // Moved in, not assigned from literals: GCC 12 reports a false -Wrestrict for the latter.
  LauncherEnv env;
  env.local_rank = std::string("1");
  env.data_dir = std::string("/env-data");
  env.metrics_port = std::string("9400");
  env.pod_ip = std::string("10.0.0.7");
  env.restore = std::string("/ck/step-5");

  const TrainOptions o = parse({"--config", file.path, "--steps", "3"}, env);
  CHECK(o.steps == 3);                     // the command line
  CHECK(o.batch == 2);                     // the configuration
  CHECK(o.global_batch_tokens == 8 * 16);  // sequences x seqLen
  CHECK(o.data == "/data/train_*.bin");    // the configuration, not RAILYARD_DATA_DIR
  CHECK(o.origins.data == "spec.data.train");
  CHECK(o.name_of("data", o.origins.data) == "spec.data.train (--config " + file.path + ")");
  CHECK(o.ckpt_dir == "/ck");
  CHECK(o.origins.ckpt_dir == "spec.checkpoint.path");
  CHECK(o.resume == "never");  // the configuration's empty restore: a fresh start, not RAILYARD_RESTORE
  CHECK(o.configured.count("batch"));
  CHECK_FALSE(o.configured.count("steps"));
  CHECK(o.metrics_port == 9401);        // RAILYARD_METRICS_PORT + LOCAL_RANK
  CHECK(o.metrics_host == "10.0.0.7");  // RAILYARD_POD_IP

  // Without a configuration the environment fills in.
  const TrainOptions e = parse({"--metrics-port", "9500", "--ckpt-dir", "/ck"}, env);
  CHECK(e.data == "/env-data");
  CHECK(e.resume == "/ck/step-5");
  CHECK(e.metrics_port == 9501);  // one flag for a --nproc world: P + LOCAL_RANK
}

TEST_CASE("train options: bad values are refused naming the flag, the field or the variable") {
  CHECK(refusal({"--steps", "ten"}) == "--steps 'ten' is not an integer");
  CHECK(refusal({"--lr", "fast"}) == "--lr 'fast' is not a number");
  CHECK(refusal({"--dp-split", "3,x"}).find("--dp-split '3,x' is not a comma-separated list") == 0);
  CHECK(refusal({"--zero", "3"}) == "--zero 3: must be 0, 1 or 2");
  CHECK(refusal({"--tp", "0"}) == "--tp and --pp must be >= 1");
  CHECK(refusal({"--sequence-parallel"}).find("--sequence-parallel needs tensor parallelism") == 0);
  CHECK(refusal({"--deterministic=maybe"}).find("--deterministic=maybe: give it without a value") == 0);
  CHECK(refusal({"--ckpt-async", "sometimes"}) == "--ckpt-async must be on or off");
  CHECK(refusal({"--gemm-split", "magic"}) == "--gemm-split must be pool or openblas");
  CHECK(refusal({"--ep-a2a", "hierarchical"}) == "--ep-a2a/--ep-node-size need --ep N > 1");
  CHECK(refusal({"--slow-ranks", "1"}).find("--slow-ranks and --slow-factor go together") == 0);
  CHECK(refusal({"--slow-ranks", "1", "--slow-factor", "0.5"}) == "--slow-factor must be a number >= 1");
  CHECK(refusal({"--metrics-port", "70000"}) == "--metrics-port must be in 0..65535");
  CHECK(refusal({"--metrics-port", "4294976696"}) == "--metrics-port '4294976696' is out of range");  // not 9400
  CHECK(refusal({"--steps", "99999999999"}) == "--steps '99999999999' is out of range");
  CHECK(refusal({"--nproc", "0"}) == "--nproc must be in 1..256");
  LauncherEnv env;
  env.metrics_port = std::string("http");
  CHECK(refusal({}, env) == "RAILYARD_METRICS_PORT 'http' is not a port");

  // The configuration describes a world the environment must match.
  WorkerConfig c;
  c.world_size = 2;
  const ConfigFile file(c);
  CHECK(refusal({"--config", file.path}).find("--config " + file.path + ": world size 2, but WORLD_SIZE is ''") == 0);
  // A configuration's number the option cannot hold is refused, not wrapped (2^32 + 10 steps is not 10).
  WorkerConfig big;
  big.training = WorkerConfig::Training{};
  big.training->steps = (int64_t{1} << 32) + 10;
  const ConfigFile big_file(big);
  CHECK(refusal({"--config", big_file.path}) ==
        "--config " + big_file.path + ": 4294967306 is out of range for --steps");
  LauncherEnv two;
  two.world_size = std::string("2");
  CHECK(refusal({"--config", file.path}, two).empty());
}

TEST_CASE("train options: --nproc reads only the launcher's flags") {
  // The configuration names a world of 2 that only the ranks join: the launcher must not check it.
  WorkerConfig c;
  c.world_size = 2;
  const ConfigFile file(c);
  const TrainOptions o = parse({"--nproc", "2", "--config", file.path});
  CHECK(o.nproc == 2);
  CHECK(o.configured.empty());
}
