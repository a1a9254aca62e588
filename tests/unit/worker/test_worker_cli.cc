// railyard-worker as a user runs it: prepare shards with `railyard data prepare`, train, export an llm.c model,
// resume from it, and get exit code 2 with a message naming the flag for bad input.
#include <doctest/doctest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/unit/worker/worker_test_util.h"
#include "worker/device/cuda_module.h"

using namespace railyard::worker::testing;
using railyard::worker::gpu_device_nodes;
using railyard::worker::library_mapped;

namespace {

std::string bin_dir() {
  const char* b = std::getenv("RAILYARD_BIN_DIR");
  return b && *b ? b : RAILYARD_BIN_DIR_FALLBACK;
}

struct Run {
  int code;
  std::string err;
};

// env: "NAME=value " prefixes for the command (empty: the test's environment).
Run run(const std::string& args, const std::string& dir, const std::string& env = "") {
  const std::string cmd = env + bin_dir() + "/" + args + " > " + dir + "/out.txt 2> " + dir + "/err.txt";
  const int rc = std::system(cmd.c_str());
  std::ifstream f(dir + "/err.txt");
  std::string err((std::istreambuf_iterator<char>(f)), {});
  return {WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, err};
}

}  // namespace

TEST_CASE("railyard-worker train: prepare, train with validation, export, resume, and bad flags") {
  REQUIRE_MESSAGE(std::filesystem::exists(bin_dir() + "/railyard-worker"),
                  "build railyard-worker and railyard first (cmake --build <dir> --target railyard-worker railyard)");
  REQUIRE(std::filesystem::exists(bin_dir() + "/railyard"));
  TempDir dir;
  const std::string d = dir.path();
  Run r =
      run("railyard data prepare --input /usr/share/common-licenses/GPL-3 /usr/share/common-licenses/Apache-2.0 "
          "--output " +
              d + "/data",
          d);
  REQUIRE_MESSAGE(r.code == 0, r.err);

  const std::string model = "--model l=2,c=64,nh=4,t=64,v=256";
  r = run("railyard-worker train " + model + " --data " + d + "/data --steps 12 --batch 4 --seq 32 " +
              "--global-batch 256 --lr 3e-3 --warmup 2 --val-every 6 --val-steps 2 --threads 2 --peak-flops 1e11 " +
              "--log-json " + d + "/log.jsonl --export " + d + "/model.bin",
          d);
  REQUIRE_MESSAGE(r.code == 0, r.err);
  CHECK(r.err.find("memory budget") != std::string::npos);
  CHECK(r.err.find("micro_steps=2") != std::string::npos);  // 256 tokens / (4 x 32)
  // A model that cannot fit is refused before anything is allocated, naming the fields and the room it had: the
  // machine's memory, or the container's limit (spec.resources.limits.memory) where the test runs under one.
  {
    const Run big = run("railyard-worker train --model l=48,c=6400,nh=50,t=1024,v=50304 --data " + d +
                            "/data --steps 1 --batch 4 --seq 1024 --threads 1",
                        d);
    CHECK(big.code == 2);
    CHECK_MESSAGE(
        big.err.find("spec.model/spec.training (--model/--batch/--seq): training needs ") != std::string::npos,
        big.err);
    CHECK_MESSAGE(big.err.find(" GiB per rank") != std::string::npos, big.err);
    CHECK_MESSAGE((big.err.find("the machine's ") != std::string::npos ||
                   big.err.find("raise spec.resources.limits.memory") != std::string::npos),
                  big.err);
    // The pod's memory is shared by its local ranks: the small model does not fit in 1/100000 of it.
    const Run shared = run("railyard-worker train " + model + " --data " + d + "/data --steps 1 --batch 4 --seq 32", d,
                           "LOCAL_WORLD_SIZE=100000 ");
    CHECK(shared.code == 2);
    CHECK_MESSAGE(shared.err.find("shared by 100000 local ranks") != std::string::npos, shared.err);
  }
  std::ifstream log(d + "/log.jsonl");
  int steps = 0, vals = 0;
  double first = 0, last = 0;
  for (std::string line; std::getline(log, line);) {
    auto j = nlohmann::json::parse(line);
    if (j["event"] == "step") {
      ++steps;
      CHECK(j["mfu"].get<double>() > 0);
      CHECK(j["tokens_per_s"].get<double>() > 0);
    } else if (j["event"] == "validation") {
      (vals++ == 0 ? first : last) = j["val_loss"].get<double>();
    }
  }
  CHECK(steps == 12);
  CHECK(vals == 3);  // steps 0, 6, 12
  CHECK(last < first);
  REQUIRE(std::filesystem::exists(d + "/model.bin"));

  // Resume from the exported weights: the first validation must match where the last run ended.
  r = run("railyard-worker train --init-from " + d + "/model.bin --data " + d + "/data --steps 1 --batch 4 " +
              "--seq 32 --val-every 1 --val-steps 2 --threads 2 --peak-flops 1e11 --log-json " + d + "/log2.jsonl",
          d);
  REQUIRE_MESSAGE(r.code == 0, r.err);
  std::ifstream log2(d + "/log2.jsonl");
  std::string line;
  std::getline(log2, line);
  CHECK(nlohmann::json::parse(line)["val_loss"].get<double>() == doctest::Approx(last).epsilon(1e-6));

  // The agent's way: a JSON config (operator's resolved config: globalBatch in sequences) plus RAILYARD_PROGRESS_FILE.
  std::ofstream(d + "/config.json") << nlohmann::json{
      {"model", {{"preset", "custom"}, {"layers", 1}, {"hidden", 32}, {"heads", 2}, {"seqLen", 32}, {"vocab", 256}}},
      {"training", {{"steps", 3}, {"globalBatch", 4}, {"microBatch", 2}, {"seqLen", 16}}},
      {"layout", {{"world", 1}, {"dp", 1}, {"tp", 1}, {"pp", 1}}},
      {"data", {{"train", d + "/data"}}}}.dump();
  r = run("railyard-worker train --config " + d + "/config.json --threads 1 --peak-flops 1e11", d);
  REQUIRE_MESSAGE(r.code == 0, r.err);  // (no progress file without the variable)
  CHECK(r.err.find("L1 C32 NH2 maxT32 V256") != std::string::npos);
  CHECK(r.err.find("micro_steps=2") != std::string::npos);  // 4 sequences / 2 per micro-batch
  CHECK(r.err.find("step=3/3") != std::string::npos);
  // with the agent's progress file variable set
  const std::string cmd = "RAILYARD_PROGRESS_FILE=" + d + "/progress.json " + bin_dir() +
                          "/railyard-worker train --config " + d + "/config.json --steps 2 --threads 1 " +
                          "--peak-flops 1e11 2> " + d + "/err2.txt";
  REQUIRE(std::system(cmd.c_str()) == 0);
  const auto progress = nlohmann::json::parse(std::ifstream(d + "/progress.json"));
  CHECK(progress["step"] == 2);
  CHECK(progress["loss"].get<double>() > 0);
  CHECK(progress["tokens_per_second"].get<double>() > 0);
  std::ofstream(d + "/world2.json") << nlohmann::json{
      {"model", {{"preset", "tiny"}}},
      {"layout", {{"world", 2}}},
      {"data", {{"train", d + "/data"}}}}.dump();
  r = run("railyard-worker train --config " + d + "/world2.json", d);
  CHECK(r.code == 2);
  CHECK(r.err.find("world size 2") != std::string::npos);
  // The agent's form: world_size at the top, layout without "world", data as a train glob.
  std::ofstream(d + "/agent_world2.json") << nlohmann::json{
      {"world_size", 2},
      {"layout", {{"dp", 2}, {"tp", 1}, {"pp", 1}}},
      {"data", {{"train", d + "/data/train_*.bin"}}},
      {"training", {{"steps", 1}}}}.dump();
  r = run("railyard-worker train --config " + d + "/agent_world2.json", d);
  CHECK(r.code == 2);
  CHECK(r.err.find("world size 2") != std::string::npos);
  // A field of the wrong type: exit 2 naming the file and the field (common/worker_config.h parses it).
  std::ofstream(d + "/bad_type.json") << nlohmann::json{{"training", {{"steps", "ten"}}}}.dump();
  r = run("railyard-worker train --config " + d + "/bad_type.json", d);
  CHECK(r.code == 2);
  CHECK_MESSAGE(r.err.find("--config " + d + "/bad_type.json: training.steps must be an integer") != std::string::npos,
                r.err);

  // Bad input: exit 2 and a message that names the problem.
  r = run("railyard-worker train --data " + d + "/data --model gpt9", d);
  CHECK(r.code == 2);
  CHECK(r.err.find("unknown preset 'gpt9'") != std::string::npos);
  r = run("railyard-worker train --data " + d + "/data " + model + " --batch 4 --seq 32 --global-batch 100", d);
  CHECK(r.code == 2);
  CHECK(r.err.find("--global-batch 100") != std::string::npos);
  r = run("railyard-worker train --data " + d + "/nope", d);
  CHECK(r.code == 2);
  CHECK(r.err.find("--data") != std::string::npos);
  r = run("railyard-worker train --data " + d + "/data --init-from " + d + "/model.bin --model tiny", d);
  CHECK(r.code == 2);
  CHECK(r.err.find("drop --model") != std::string::npos);
  r = run("railyard-worker train --data " + d + "/data --stpes 3", d);
  CHECK(r.code == 2);
  CHECK(r.err.find("unknown flag --stpes") != std::string::npos);
}

TEST_CASE("railyard-worker train refuses data and checkpoint paths that resolve outside the configured roots") {
  TempDir dir;
  const std::string d = dir.path();
  std::filesystem::create_directories(d + "/root/data");
  std::filesystem::create_directories(d + "/outside");
  std::filesystem::create_directory_symlink(d + "/outside", d + "/root/escape");
  const std::string env = "RAILYARD_DATA_ROOT=" + d + "/root RAILYARD_CHECKPOINT_ROOT=" + d + "/root ";
  const std::string worker = "railyard-worker train ";
  auto with_env = [&](const std::string& args) { return run(worker + args, d); };
  // The env is set by prefixing the command (run() passes the string to the shell).
  auto run_env = [&](const std::string& args) {
    const std::string cmd =
        "env " + env + bin_dir() + "/" + worker + args + " > " + d + "/out.txt 2> " + d + "/err.txt";
    const int rc = std::system(cmd.c_str());
    std::ifstream f(d + "/err.txt");
    return Run{WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, std::string((std::istreambuf_iterator<char>(f)), {})};
  };
  Run r = run_env("--data " + d + "/outside");
  CHECK(r.code == 2);
  CHECK_MESSAGE(
      r.err.find("--data '" + d + "/outside' is outside RAILYARD_DATA_ROOT " + d + "/root") != std::string::npos,
      r.err);
  // A symlink inside the root that points out of it.
  r = run_env("--data " + d + "/root/escape");
  CHECK(r.code == 2);
  CHECK_MESSAGE(r.err.find("resolves to " + d + "/outside") != std::string::npos, r.err);
  // '..' out of the checkpoint root; the flag overrides the env.
  r = run_env("--data " + d + "/root/data --ckpt-dir " + d + "/root/../outside/ck");
  CHECK(r.code == 2);
  CHECK_MESSAGE(r.err.find("--ckpt-dir '" + d + "/root/../outside/ck'") != std::string::npos, r.err);
  r = with_env("--data " + d + "/root/data --data-root " + d + "/outside");
  CHECK(r.code == 2);
  CHECK_MESSAGE(r.err.find("outside --data-root " + d + "/outside") != std::string::npos, r.err);
  // From the agent's config: the message names the config field.
  std::ofstream(d + "/cfg.json") << nlohmann::json{{"data", {{"train", d + "/outside"}}}}.dump();
  r = run_env("--config " + d + "/cfg.json");
  CHECK(r.code == 2);
  CHECK_MESSAGE(r.err.find("data.train of --config") != std::string::npos, r.err);
  // --init-from (read: under either root) and --export (written: under the checkpoint root).
  r = run_env("--data " + d + "/root/data --init-from " + d + "/outside/gpt2.bin");
  CHECK(r.code == 2);
  CHECK_MESSAGE(r.err.find("--init-from '" + d + "/outside/gpt2.bin' is outside both RAILYARD_DATA_ROOT " + d +
                           "/root and RAILYARD_CHECKPOINT_ROOT " + d + "/root") != std::string::npos,
                r.err);
  r = run_env("--data " + d + "/root/data --init-from " + d + "/root/escape/gpt2.bin");
  CHECK(r.code == 2);
  CHECK_MESSAGE(r.err.find("--init-from '" + d + "/root/escape/gpt2.bin' (resolves to " + d + "/outside/gpt2.bin)") !=
                    std::string::npos,
                r.err);
  r = run_env("--data " + d + "/root/data --init-from gpt2.bin");
  CHECK(r.code == 2);
  CHECK_MESSAGE(r.err.find("--init-from 'gpt2.bin' must be an absolute path") != std::string::npos, r.err);
  r = with_env("--data " + d + "/root/data --data-root " + d + "/root --init-from " + d + "/outside/gpt2.bin");
  CHECK(r.code == 2);
  CHECK_MESSAGE(
      r.err.find("--init-from '" + d + "/outside/gpt2.bin' is outside --data-root " + d + "/root") != std::string::npos,
      r.err);
  r = run_env("--data " + d + "/root/data --export " + d + "/root/../outside/final.bin");
  CHECK(r.code == 2);
  CHECK_MESSAGE(
      r.err.find("--export '" + d + "/root/../outside/final.bin' (resolves to " + d +
                 "/outside/final.bin) is outside RAILYARD_CHECKPOINT_ROOT " + d + "/root") != std::string::npos,
      r.err);
  CHECK_FALSE(std::filesystem::exists(d + "/outside/final.bin"));
  // Inside the roots, the check passes and the worker goes on to its next complaint (no shards there).
  r = run_env("--data " + d + "/root/data --ckpt-dir " + d + "/root/ck --init-from " + d + "/root/data/gpt2.bin" +
              " --export " + d + "/root/final.bin");
  CHECK(r.err.find("is outside") == std::string::npos);
  CHECK(r.err.find("absolute path") == std::string::npos);
  // Globs: every shard a pattern matches is checked too (a symlink out of the root), for training, an explicit
  // --val-data and the default validation shards beside the training ones. (Quoted: the worker expands the glob.)
  std::filesystem::create_directories(d + "/root/globbed");
  std::ofstream(d + "/outside/train_000000.bin") << "x";
  std::ofstream(d + "/outside/val_000000.bin") << "x";
  std::filesystem::create_symlink(d + "/outside/train_000000.bin", d + "/root/globbed/train_000000.bin");
  r = run_env("--data '" + d + "/root/globbed/train_*.bin'");
  CHECK(r.code == 2);
  CHECK_MESSAGE(r.err.find("--data shard '" + d + "/root/globbed/train_000000.bin' (resolves to " + d +
                           "/outside/train_000000.bin) is outside RAILYARD_DATA_ROOT") != std::string::npos,
                r.err);
  std::filesystem::create_directories(d + "/root/v");
  std::ofstream(d + "/root/v/train_000000.bin") << "x";
  std::filesystem::create_symlink(d + "/outside/val_000000.bin", d + "/root/v/val_000000.bin");
  r = run_env("--data " + d + "/root/v");
  CHECK(r.code == 2);
  CHECK_MESSAGE(r.err.find("--val-data (the default, beside --data) shard '" + d + "/root/v/val_000000.bin'") !=
                    std::string::npos,
                r.err);
  r = run_env("--data " + d + "/root/data --val-data " + d + "/outside");
  CHECK(r.code == 2);
  CHECK_MESSAGE(
      r.err.find("--val-data '" + d + "/outside/val_*.bin' is outside RAILYARD_DATA_ROOT") != std::string::npos, r.err);
}

TEST_CASE("railyard-worker train --device: auto trains on the CPU without a GPU, cuda without one is refused") {
  REQUIRE(std::filesystem::exists(bin_dir() + "/railyard-worker"));
  TempDir dir;
  const std::string d = dir.path();
  Run r = run("railyard data prepare --input /usr/share/common-licenses/GPL-3 --output " + d + "/data", d);
  REQUIRE_MESSAGE(r.code == 0, r.err);
  const std::string train = "railyard-worker train --model l=1,c=32,nh=2,t=32,v=256 --data " + d +
                            "/data --steps 2 --batch 2 --seq 16 --threads 1 --peak-flops 1e11 ";
  r = run(train + "--device auto", d);
  REQUIRE_MESSAGE(r.code == 0, r.err);
  CHECK(r.err.find("requested=auto") != std::string::npos);
  CHECK(r.err.find("step=2/2") != std::string::npos);
  const bool gpu_visible = r.err.find("visible_gpus=0") == std::string::npos;
  if (!gpu_visible) {
    // The device line and the model line both say where the run went.
    CHECK(r.err.find("device=cpu") != std::string::npos);
    CHECK(r.err.find("device=cuda") == std::string::npos);
    // A CPU run does not map the CUDA runtime, in CUDA builds too: the CUDA device is a module loaded only for CUDA
    // runs (the worker reads /proc/self/maps for this field).
    CHECK(r.err.find("cudart_mapped=false") != std::string::npos);
    CHECK(r.err.find("not loaded") != std::string::npos);
    if (r.err.find("built_with_cuda=true") != std::string::npos) {
      // --device cuda loads the module first: one that is not there is a clear error naming its path and the fix.
      const std::string bad = d + "/nowhere/librailyard_cuda.so";
      Run m = run(train + "--device cuda", d, "RAILYARD_CUDA_MODULE=" + bad + " ");
      CHECK(m.code == 2);
      CHECK(m.err.find("cannot load the CUDA module " + bad) != std::string::npos);
      CHECK(m.err.find("RAILYARD_CUDA_MODULE") != std::string::npos);
      CHECK(m.err.find("--device cpu") != std::string::npos);
      // A loadable library that is not a railyard CUDA module (this process's libc) is refused by name too.
      std::ifstream maps("/proc/self/maps");
      std::string line, libc;
      while (libc.empty() && std::getline(maps, line)) {
        if (line.find("/libc.so") != std::string::npos) libc = line.substr(line.find('/'));
      }
      REQUIRE(!libc.empty());
      m = run(train + "--device cuda", d, "RAILYARD_CUDA_MODULE=" + libc + " ");
      CHECK(m.code == 2);
      CHECK(m.err.find("the CUDA module " + libc + " has no entry point railyard_cuda_module_abi") !=
            std::string::npos);
    }
    // cuda without a GPU: exit 2 before any training, naming spec.device and the flag, and the ways out. In a CUDA
    // build this loads the real module (lib/librailyard_cuda.so) and asks its CUDA runtime for the GPUs.
    r = run(train + "--device cuda", d);
    CHECK(r.code == 2);
    CHECK(r.err.find("spec.device: cuda") != std::string::npos);
    CHECK(r.err.find("--device cuda") != std::string::npos);
    CHECK(r.err.find("set spec.device: ") != std::string::npos);
    CHECK(r.err.find("step=") == std::string::npos);
    // The same from a config file's "device" (the operator's resolved config carries spec.device there).
    std::ofstream(d + "/config.json") << nlohmann::json{{"device", "cuda"}}.dump();
    r = run(train + "--config " + d + "/config.json", d);
    CHECK(r.code == 2);
    CHECK(r.err.find("spec.device: cuda") != std::string::npos);
    // and --device cpu is honoured whatever the config says
    r = run(train + "--config " + d + "/config.json --device cpu", d);
    CHECK_MESSAGE(r.code == 0, r.err);
    CHECK(r.err.find("device=cpu") != std::string::npos);
  }
  r = run(train + "--device tpu", d);
  CHECK(r.code == 2);
  CHECK(r.err.find("unknown value \"tpu\"") != std::string::npos);
}

TEST_CASE("railyard-worker train --config: the parallelism family from the operator's resolved config; flags win") {
  TempDir dir;
  const std::string d = dir.path();
  Run r = run("railyard data prepare --input /usr/share/common-licenses/Apache-2.0 --output " + d + "/data", d);
  REQUIRE_MESSAGE(r.code == 0, r.err);
  // The keys common/job_spec.cc resolved_config writes for a MoE job with expert parallelism 2.
  nlohmann::json cfg = {
      {"model",
       {{"preset", "custom"},
        {"layers", 2},
        {"hidden", 32},
        {"heads", 2},
        {"seqLen", 32},
        {"vocab", 256},
        {"moe", {{"experts", 4}, {"topK", 2}, {"capacityFactor", 2.0}, {"auxLossCoef", 0.01}}}}},
      {"training", {{"steps", 2}, {"globalBatch", 4}, {"microBatch", 1}, {"seqLen", 16}}},
      {"layout", {{"world", 2}, {"dp", 2}, {"tp", 1}, {"pp", 1}}},
      {"parallelism", {{"zero", 0}, {"expert", 2}, {"expertAllToAll", "hierarchical"}, {"context", 1}}},
      {"memory", {{"recompute", "full"}, {"offload", "none"}}},
      {"data", {{"train", d + "/data"}}}};
  std::ofstream(d + "/moe.json") << cfg.dump();
  r = run("railyard-worker train --nproc 2 --config " + d + "/moe.json --threads 1 --ep-node-size 1", d);
  REQUIRE_MESSAGE(r.code == 0, r.err);
  CHECK_MESSAGE(r.err.find("ep=2") != std::string::npos, r.err);
  CHECK(r.err.find("hierarchical all_to_all over 2") != std::string::npos);
  CHECK(r.err.find("full (all layers)") != std::string::npos);
  CHECK(r.err.find("aux_loss=") != std::string::npos);  // the MoE model trained
  // An explicit flag wins over the config's key.
  r = run("railyard-worker train --nproc 2 --config " + d + "/moe.json --threads 1 --ep-a2a flat --recompute none", d);
  REQUIRE_MESSAGE(r.code == 0, r.err);
  CHECK(r.err.find("flat all_to_all over 2") != std::string::npos);
  CHECK(r.err.find("hierarchical all_to_all") == std::string::npos);
  CHECK(r.err.find("full (all layers)") == std::string::npos);
  // context and offload reach the worker too: context 2 in one process is refused naming --cp (a dense model: experts
  // are refused with --cp before that).
  cfg["model"].erase("moe");
  cfg["layout"] = {{"world", 1}, {"dp", 1}, {"tp", 1}, {"pp", 1}};
  cfg["parallelism"] = {{"context", 2}};
  std::ofstream(d + "/cp.json") << cfg.dump();
  r = run("railyard-worker train --config " + d + "/cp.json --threads 1", d);
  CHECK(r.code == 2);
  CHECK_MESSAGE(r.err.find("--cp 2") != std::string::npos, r.err);
  // ... and over two ranks it runs the context-parallel stage.
  cfg["layout"] = {{"world", 2}, {"dp", 2}, {"tp", 1}, {"pp", 1}, {"cp", 2}};
  std::ofstream(d + "/cp2.json") << cfg.dump();
  r = run("railyard-worker train --nproc 2 --config " + d + "/cp2.json --threads 1", d);
  CHECK_MESSAGE(r.code == 0, r.err);
  CHECK(r.err.find("context parallel 2") != std::string::npos);
  cfg["layout"] = {{"world", 1}, {"dp", 1}, {"tp", 1}, {"pp", 1}};
  cfg["parallelism"] = nlohmann::json::object();
  cfg["memory"] = {{"offload", "params"}};
  std::ofstream(d + "/off.json") << cfg.dump();
  r = run("railyard-worker train --config " + d + "/off.json --threads 1", d);
  CHECK(r.code == 2);
  CHECK_MESSAGE(r.err.find("--offload params") != std::string::npos, r.err);
}

namespace {

// The validation losses of a --log-json file, in order.
std::vector<double> val_losses(const std::string& path) {
  std::vector<double> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    if (j["event"] == "validation") out.push_back(j["val_loss"].get<double>());
  }
  return out;
}

}  // namespace

TEST_CASE("railyard-worker train --config: spec.model.initFrom, and spec.data.train / spec.data.val as globs") {
  TempDir dir;
  const std::string d = dir.path();
  Run r = run("railyard data prepare --input /usr/share/common-licenses/GPL-3 --output " + d + "/data", d);
  REQUIRE_MESSAGE(r.code == 0, r.err);
  // The llm.c file to start from, and the validation loss its weights give on the default validation shards.
  r = run("railyard-worker train --model l=1,c=32,nh=2,t=32,v=256 --data " + d +
              "/data --steps 3 --batch 2 --seq 16 --lr 3e-3 --val-every 3 --val-steps 2 --threads 1 "
              "--peak-flops 1e11 --log-json " +
              d + "/a.jsonl --export " + d + "/model.bin",
          d);
  REQUIRE_MESSAGE(r.code == 0, r.err);
  const std::vector<double> exported = val_losses(d + "/a.jsonl");
  REQUIRE(exported.size() == 2);  // steps 0 and 3

  // The operator's resolved config (common/job_spec.cc resolved_config) for a custom model of the
  // file's shape with spec.model.initFrom, validation every step.
  const nlohmann::json base = {
      {"model",
       {{"preset", "custom"},
        {"layers", 1},
        {"hidden", 32},
        {"heads", 2},
        {"seqLen", 32},
        {"vocab", 256},
        {"initFrom", d + "/model.bin"}}},
      {"training",
       {{"steps", 1}, {"globalBatch", 2}, {"microBatch", 2}, {"seqLen", 16}, {"valEvery", 1}, {"valSteps", 2}}},
      {"layout", {{"world", 1}, {"dp", 1}, {"tp", 1}, {"pp", 1}}},
      {"data", {{"train", d + "/data/train_*.bin"}}}};
  auto train = [&](const nlohmann::json& cfg, const std::string& name) {
    std::ofstream(d + "/" + name + ".json") << cfg.dump();
    std::filesystem::remove(d + "/" + name + ".jsonl");
    return run("railyard-worker train --config " + d + "/" + name + ".json --threads 1 --peak-flops 1e11 --log-json " +
                   d + "/" + name + ".jsonl",
               d);
  };

  // initFrom: the first validation (before any step) sees exactly the file's weights.
  r = train(base, "init");
  REQUIRE_MESSAGE(r.code == 0, r.err);
  CHECK(r.err.find("initialised from llm.c model") != std::string::npos);
  CHECK(r.err.find("val=" + d + "/data/val_*.bin") != std::string::npos);  // spec.data.val absent: the default
  const std::vector<double> init = val_losses(d + "/init.jsonl");
  REQUIRE(init.size() == 2);
  CHECK(init[0] == doctest::Approx(exported[1]).epsilon(1e-6));
  // Without it a random start, far from the file.
  nlohmann::json cfg = base;
  cfg["model"].erase("initFrom");
  r = train(cfg, "random");
  REQUIRE_MESSAGE(r.code == 0, r.err);
  CHECK(r.err.find("initialised from llm.c model") == std::string::npos);
  CHECK(val_losses(d + "/random.jsonl").at(0) == doctest::Approx(exported[0]).epsilon(1e-6));  // seed 1337's init

  // A spec.model that is not the file's shape is refused, naming the field and the dimension.
  cfg = base;
  cfg["model"]["layers"] = 2;
  r = train(cfg, "mismatch");
  CHECK(r.code == 2);
  CHECK_MESSAGE(r.err.find("spec.model.initFrom (--config " + d + "/mismatch.json) '" + d + "/model.bin' holds") !=
                    std::string::npos,
                r.err);
  CHECK_MESSAGE(r.err.find("spec.model.layers is 2 where the file has 1") != std::string::npos, r.err);
  cfg = base;
  cfg["model"]["hidden"] = 64;
  r = train(cfg, "mismatch");
  CHECK(r.code == 2);
  CHECK_MESSAGE(r.err.find("spec.model.hidden is 64 where the file has 32") != std::string::npos, r.err);
  cfg = base;
  cfg["model"]["initFrom"] = d + "/missing.bin";
  r = train(cfg, "missing");
  CHECK(r.code == 2);
  CHECK_MESSAGE(
      r.err.find("spec.model.initFrom (--config " + d + "/missing.json): " + d + "/missing.bin") != std::string::npos,
      r.err);

  // A restore wins over initFrom: a restarted job continues from its checkpoint.
  cfg = base;
  cfg["model"].erase("initFrom");
  cfg["checkpoint"] = {{"path", d + "/ck"}, {"intervalSteps", 1}};
  r = train(cfg, "first");
  REQUIRE_MESSAGE(r.code == 0, r.err);
  cfg = base;
  cfg["checkpoint"] = {{"path", d + "/ck"}, {"intervalSteps", 1}};
  cfg["restore"] = d + "/ck";
  cfg["training"]["steps"] = 2;
  r = train(cfg, "restart");
  REQUIRE_MESSAGE(r.code == 0, r.err);
  CHECK(r.err.find("restored a checkpoint: not initialising from the llm.c model") != std::string::npos);
  CHECK(r.err.find("initialised from llm.c model") == std::string::npos);

  // spec.data.train is a glob: any pattern, not only DIR/train_*.bin; nothing matching is refused naming the field.
  std::filesystem::create_directory(d + "/mixed");
  for (const auto& e : std::filesystem::directory_iterator(d + "/data"))
    if (e.path().extension() == ".bin")
      std::filesystem::copy_file(e.path(), d + "/mixed/web-" + e.path().filename().string());
  cfg = base;
  cfg["data"] = {{"train", d + "/mixed/web-train_*.bin"}};
  cfg["training"]["valEvery"] = 0;  // mixed/ has no val_*.bin, the default validation glob
  r = train(cfg, "glob");
  REQUIRE_MESSAGE(r.code == 0, r.err);
  CHECK(r.err.find("train=" + d + "/mixed/web-train_*.bin") != std::string::npos);
  CHECK(r.err.find("val=" + d + "/mixed/val_*.bin") != std::string::npos);  // the default: val_*.bin beside it
  cfg["data"] = {{"train", d + "/mixed/nothing_*.bin"}};
  r = train(cfg, "nomatch");
  CHECK(r.code == 2);
  CHECK_MESSAGE(r.err.find("spec.data.train (--config " + d + "/nomatch.json): data path " + d +
                           "/mixed/nothing_*.bin: no shard matches") != std::string::npos,
                r.err);

  // spec.data.val is the validation glob: validating on the training shards gives another loss than val_*.bin.
  cfg = base;
  cfg["data"] = {{"train", d + "/mixed/web-train_*.bin"}, {"val", d + "/mixed/web-val_*.bin"}};
  r = train(cfg, "val");
  REQUIRE_MESSAGE(r.code == 0, r.err);
  CHECK(r.err.find("val=" + d + "/mixed/web-val_*.bin") != std::string::npos);
  CHECK(val_losses(d + "/val.jsonl").at(0) == doctest::Approx(init[0]).epsilon(1e-6));  // same shards, same loss
  cfg["data"]["val"] = d + "/mixed/web-train_*.bin";
  r = train(cfg, "valtrain");
  REQUIRE_MESSAGE(r.code == 0, r.err);
  CHECK(r.err.find("val=" + d + "/mixed/web-train_*.bin") != std::string::npos);
  CHECK(val_losses(d + "/valtrain.jsonl").at(0) != doctest::Approx(init[0]).epsilon(1e-6));
  cfg["data"]["val"] = d + "/mixed/none_*.bin";
  r = train(cfg, "noval");
  CHECK(r.code == 2);
  CHECK_MESSAGE(r.err.find("spec.data.val (--config " + d + "/noval.json): data path " + d +
                           "/mixed/none_*.bin: no shard matches") != std::string::npos,
                r.err);
  // The command line wins field by field: --val-data over spec.data.val.
  r = run("railyard-worker train --config " + d + "/noval.json --val-data " + d + "/data --threads 1 --peak-flops 1e11",
          d);
  REQUIRE_MESSAGE(r.code == 0, r.err);
  CHECK(r.err.find("val=" + d + "/data/val_*.bin") != std::string::npos);
}

TEST_CASE("--device auto: GPUs counted from the driver's device nodes, without loading CUDA") {
  TempDir dir;
  const std::string d = dir.path();
  CHECK(gpu_device_nodes(d) == 0);
  for (const char* f : {"nvidiactl", "nvidia-uvm", "nvidia-modeset", "nvidia", "nvidia0x"}) std::ofstream(d + "/" + f);
  CHECK(gpu_device_nodes(d) == 0);  // control nodes are not GPUs
  std::ofstream(d + "/nvidia0");
  std::ofstream(d + "/nvidia1");
  CHECK(gpu_device_nodes(d) == 2);
  ::setenv("CUDA_VISIBLE_DEVICES", "", 1);  // hides every GPU from CUDA
  CHECK(gpu_device_nodes(d) == 0);
  ::setenv("CUDA_VISIBLE_DEVICES", "1", 1);
  CHECK(gpu_device_nodes(d) == 2);
  ::unsetenv("CUDA_VISIBLE_DEVICES");
  CHECK(gpu_device_nodes(d + "/missing") == 0);
  // and this process (a test that never asked for CUDA) has not mapped the CUDA runtime
  CHECK_FALSE(library_mapped("libcudart"));
  CHECK(library_mapped("libc.so"));  // the scan itself works
  // In a CUDA build, loading the module is what maps the runtime (so the start-up log's field can turn true).
  const std::string module = bin_dir() + "/../lib/librailyard_cuda.so";
  if (std::filesystem::exists(module)) {
    const railyard::worker::CudaModule& m = railyard::worker::CudaModule::load(module);
    CHECK(m.path() == module);
    CHECK(library_mapped("libcudart"));
    CHECK(m.device_count() >= 0);  // 0 here (no driver), the GPU count on a GPU host
  }
}
