// The worker configuration contract (common/worker_config.h): what the operator writes is what the agent and the
// worker read, field by field, and a wrong field is refused by name.
#include "common/worker_config.h"

#include <doctest/doctest.h>

using railyard::parse_worker_config;
using railyard::to_json;
using railyard::WorkerConfig;
using Json = nlohmann::json;

namespace {

// Every field set, none at its default: a field the writer or the reader forgets breaks equality.
WorkerConfig full() {
  WorkerConfig c;
  c.model = WorkerConfig::Model{"custom", 4, 64, 4, 128, 512, "/data/gpt2.bin", WorkerConfig::Moe{8, 2, 1.5, 0.02}};
  WorkerConfig::Training t;
  t.steps = 1000;
  t.global_batch = 64;
  t.micro_batch = 4;
  t.seq_len = 96;
  t.grad_accumulation = 2;
  t.learning_rate = 3e-4;
  t.min_lr_fraction = 0.05;
  t.weight_decay = 0.01;
  t.grad_clip = 0.5;
  t.warmup_steps = 10;
  t.seed = 42;
  t.val_every = 50;
  t.val_steps = 3;
  t.sample_every = 100;
  t.sample_tokens = 32;
  c.training = t;
  c.layout = WorkerConfig::Layout{16, 8, 2, 1, 4, 4};
  c.data = WorkerConfig::Data{"/data/train_*.bin", "/data/val_*.bin"};
  c.checkpoint = WorkerConfig::Checkpoint{"/ckpt/job", 100, 5, 2, false};
  c.parallelism = WorkerConfig::Parallelism{1, 2, 2, true, false, "hierarchical", {3, 5, 4, 4}};
  c.memory = WorkerConfig::Memory{"selective", "none", 3};
  c.device = "cpu";
  c.generation = 7;
  c.world_size = 16;
  c.restore = "/ckpt/job";
  return c;
}

}  // namespace

TEST_CASE("every field of the worker configuration survives the wire, under the TrainingJob's names") {
  const WorkerConfig c = full();
  const Json j = to_json(c);
  CHECK(parse_worker_config(Json::parse(j.dump())) == c);
  // The names a person reading RAILYARD_CONFIG (or a program) sees: the TrainingJob's.
  CHECK(j["training"]["learningRate"].get<double>() == 3e-4);
  CHECK(j["training"]["globalBatch"] == 64);
  CHECK(j["model"]["moe"]["topK"] == 2);
  CHECK(j["layout"]["procsPerReplica"] == 4);
  CHECK(j["checkpoint"]["memoryIntervalSteps"] == 2);
  CHECK(j["checkpoint"]["async"] == false);
  CHECK(j["parallelism"]["dpSplit"] == Json::array({3, 5, 4, 4}));
  CHECK(j["parallelism"]["expertAllToAll"] == "hierarchical");
  CHECK(j["world_size"] == 16);
  CHECK(c.memory_tier_on());
}

TEST_CASE("unset fields are left out and read back unset; the empty config is valid") {
  CHECK(to_json(WorkerConfig{}) == Json::object());
  CHECK(parse_worker_config(Json::object()) == WorkerConfig{});
  WorkerConfig c;
  c.training.emplace().steps = 3;
  c.checkpoint.emplace().memory_interval_steps = 0;
  const Json j = to_json(c);
  CHECK(j == Json::parse(R"({"training": {"steps": 3}, "checkpoint": {"memoryIntervalSteps": 0}})"));
  CHECK(parse_worker_config(j) == c);
  CHECK_FALSE(c.memory_tier_on());
  // Keys it does not know (a newer writer) and nulls are ignored.
  CHECK(parse_worker_config(Json::parse(R"({"training": {"steps": 3, "later": 1}, "spec": {}, "device": null,
      "checkpoint": {"memoryIntervalSteps": 0}})")) == c);
}

TEST_CASE("a field of the wrong type or range is refused by its path") {
  const auto refused = [](const char* text) -> std::string {
    try {
      (void)parse_worker_config(Json::parse(text));
    } catch (const railyard::WorkerConfigError& e) {
      return e.what();
    }
    return "accepted";
  };
  CHECK(refused(R"({"training": {"steps": "ten"}})").find("training.steps must be an integer >= 1") == 0);
  CHECK(refused(R"({"training": {"steps": 0}})").find("training.steps must be an integer >= 1, got 0") == 0);
  CHECK(refused(R"({"model": {"moe": {"topK": 1.5}}})").find("model.moe.topK must be an integer") == 0);
  CHECK(refused(R"({"layout": {"tp": 1e20}})").find("layout.tp must be an integer") == 0);
  CHECK(refused(R"({"layout": {"dp": 4294967296}})").find("layout.dp must be an integer") == 0);
  CHECK(refused(R"({"checkpoint": {"async": "on"}})").find("checkpoint.async must be true or false") == 0);
  CHECK(refused(R"({"data": {"train": 7}})").find("data.train must be a string") == 0);
  CHECK(refused(R"({"parallelism": {"dpSplit": [2, 0]}})").find("parallelism.dpSplit must be an array") == 0);
  CHECK(refused(R"({"memory": []})").find("memory must be an object") == 0);
  CHECK(refused(R"([1])").find("the worker config must be an object") == 0);
  CHECK(refused(R"({"training": {"learningRate": "fast"}})").find("training.learningRate must be a number") == 0);
}
