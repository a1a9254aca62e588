// The trainer publishes each step as Prometheus series that promtool accepts and that match the step results.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "tests/unit/worker/worker_test_util.h"
#include "worker/train/train_metrics.h"
#include "worker/train/trainer.h"

using namespace railyard;
using namespace railyard::worker;
using namespace railyard::worker::testing;

namespace {

// The value of the one sample whose line starts with `prefix` (name plus labels).
double sample(const std::string& text, const std::string& prefix) {
  std::string needle(1, '\n');  // (built in steps: GCC 12 warns falsely on "\n" + string)
  needle.append(prefix);
  size_t at = text.find(needle);
  REQUIRE_MESSAGE(at != std::string::npos, "no sample " << prefix << " in\n" << text);
  size_t sp = text.find(' ', at + 1 + prefix.size());
  return std::stod(text.substr(sp + 1, text.find('\n', sp) - sp - 1));
}

}  // namespace

TEST_CASE("each step is published as metrics that match the step results and pass promtool") {
  const GptConfig g = make_gpt_config(/*L=*/1, /*C=*/32, /*NH=*/2, /*maxT=*/16, /*V=*/64);
  TrainConfig tc;
  tc.batch = 2;
  tc.seq_len = 16;
  tc.steps = 3;
  tc.peak_flops = 1e9;
  tc.quiet = true;
  std::vector<int32_t> tokens(4096);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 7 + i / 13) % 64);
  WindowSource train(tokens, tc.batch, tc.seq_len, 5);
  ThreadPool pool(1);
  Trainer trainer(g, tc, pool, train);

  metrics::Registry registry;
  TrainMetrics tm(registry,
                  {{"namespace", "ns"}, {"trainingjob", "j"}, {"generation", "2"}, {"rank", "1"}, {"node", "n"}});
  trainer.set_metrics(&tm);
  REQUIRE(trainer.run() == 0);
  std::string text(1, '\n');
  text.append(registry.serialize());
  const std::string l = "{generation=\"2\",namespace=\"ns\",node=\"n\",rank=\"1\",trainingjob=\"j\"}";
  CHECK(sample(text, "railyard_worker_step" + l) == 3);
  CHECK(sample(text, "railyard_worker_steps_total" + l) == 3);
  CHECK(sample(text, "railyard_worker_total_steps" + l) == 3);
  CHECK(sample(text, "railyard_worker_step_duration_seconds_count" + l) == 3);
  CHECK(sample(text, "railyard_worker_nonfinite_total" + l) == 0);
  const double loss = sample(text, "railyard_worker_loss" + l);
  CHECK(loss > 0);
  CHECK(loss < 5.0);  // ~ln(64) = 4.16 for an untrained model
  CHECK(sample(text, "railyard_worker_mfu_ratio" + l) > 0);
  CHECK(sample(text, "railyard_worker_last_step_timestamp_seconds" + l) > 1.7e9);

  // A NaN weight makes the next step non-finite: the counter moves and the loss gauge shows NaN.
  trainer.model().params()[0] = std::nanf("");
  const StepResult bad = trainer.step();
  tm.on_step(bad, tc.steps);
  CHECK(bad.skipped);
  std::string text2(1, '\n');
  text2.append(registry.serialize());
  CHECK(sample(text2, "railyard_worker_nonfinite_total" + l) == 1);
  CHECK(text2.find("railyard_worker_loss" + l + " NaN") != std::string::npos);

  auto path = std::filesystem::temp_directory_path() / ("railyard-worker-metrics-" + std::to_string(::getpid()));
  std::ofstream(path) << registry.serialize();
  FILE* p = ::popen(("promtool check metrics < " + path.string() + " 2>&1").c_str(), "r");
  REQUIRE(p != nullptr);
  std::string out;
  char buf[512];
  while (std::fgets(buf, sizeof buf, p)) out += buf;
  CHECK_MESSAGE(WEXITSTATUS(::pclose(p)) == 0, out);
  std::filesystem::remove(path);
}

TEST_CASE("MFU is per process and never exceeds 1 against a measured GEMM rate") {
  const GptConfig g = make_gpt_config(/*L=*/1, /*C=*/32, /*NH=*/2, /*maxT=*/16, /*V=*/64);
  std::vector<int32_t> tokens(4096);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 7 + i / 13) % 64);
  const std::string l = "{generation=\"0\",namespace=\"ns\",node=\"n\",rank=\"0\",trainingjob=\"j\"}";
  for (const double peak : {0.0, 1e9}) {
    CAPTURE(peak);
    TrainConfig tc;
    tc.batch = 2;
    tc.seq_len = 16;
    tc.steps = 5;
    tc.peak_flops = peak;  // 0: measured at start, and raised if a step beats it
    tc.world_size = 2;     // as if this process were one of two ranks of the step
    tc.quiet = true;
    WindowSource train(tokens, tc.batch, tc.seq_len, 5);
    ThreadPool pool(1);
    Trainer trainer(g, tc, pool, train);
    metrics::Registry registry;
    TrainMetrics tm(registry,
                    {{"namespace", "ns"}, {"trainingjob", "j"}, {"generation", "0"}, {"rank", "0"}, {"node", "n"}});
    trainer.set_metrics(&tm);
    REQUIRE(trainer.run() == 0);
    std::string text(1, '\n');
    text.append(registry.serialize());
    const double mfu = sample(text, "railyard_worker_mfu_ratio" + l);
    const double flops = sample(text, "railyard_worker_flops_per_second" + l);
    CHECK(mfu > 0);
    if (peak > 0) {
      CHECK(mfu == doctest::Approx(flops / (2 * peak)));
    } else {
      CHECK(mfu <= 1.0 + 1e-12);
      CHECK(mfu == doctest::Approx(flops / 2 / trainer.peak_flops()));
    }
  }
}

namespace {

// A batch source that reads the registry while it is asked for a batch: what a scrape during validation sees.
class ScrapingSource : public BatchSource {
 public:
  ScrapingSource(BatchSource& inner, metrics::Registry& r, std::string progress = "")
      : inner_(inner), r_(r), progress_(std::move(progress)) {}
  void next_batch(int32_t* inputs, int32_t* targets) override {
    seen.push_back(r_.serialize());
    if (!progress_.empty()) marks.push_back(pause_mark(progress_));
    inner_.next_batch(inputs, targets);
  }
  // The progress file's "paused" as the pod agent reads it: "true", "false", "none" (no such field) or "absent".
  static std::string pause_mark(const std::string& path) {
    std::ifstream in(path);
    if (!in) return "absent";
    const std::string text((std::istreambuf_iterator<char>(in)), {});
    if (text.find("\"paused\":true") != std::string::npos) return "true";
    if (text.find("\"paused\":false") != std::string::npos) return "false";
    return "none";
  }
  std::vector<std::string> seen;
  std::vector<std::string> marks;

 private:
  BatchSource& inner_;
  metrics::Registry& r_;
  std::string progress_;
};

std::string lines(const std::string& text) {
  std::string t(1, '\n');
  t.append(text);
  return t;
}

}  // namespace

TEST_CASE("railyard_worker_paused is 1 during validation and a pause scope, 0 while stepping and in the step hook") {
  const GptConfig g = make_gpt_config(/*L=*/1, /*C=*/32, /*NH=*/2, /*maxT=*/16, /*V=*/64);
  std::vector<int32_t> tokens(4096);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 7 + i / 13) % 64);
  TrainConfig tc;
  tc.batch = 2;
  tc.seq_len = 16;
  tc.steps = 4;
  tc.val_every = 2;
  tc.val_steps = 2;
  tc.quiet = true;
  // The progress file the pod agent reads: the trainer marks its pauses there too ("paused"), for the agent's hang
  // watch (worker/agent/hang_watch.h).
  const std::string progress =
      (std::filesystem::temp_directory_path() / ("railyard-pause-marks-" + std::to_string(::getpid()) + ".json"))
          .string();
  std::filesystem::remove(progress);
  tc.progress_file = progress;
  metrics::Registry registry;
  WindowSource train_inner(tokens, tc.batch, tc.seq_len, 5), val_inner(tokens, tc.batch, tc.seq_len, 6);
  ScrapingSource train(train_inner, registry, progress), val(val_inner, registry, progress);
  ThreadPool pool(1);
  Trainer trainer(g, tc, pool, train, &val);
  TrainMetrics tm(registry, {{"rank", "0"}});
  trainer.set_metrics(&tm);
  std::vector<std::string> in_hook, hook_marks, save_marks, nested_marks;
  TrainerHooks hooks;
  std::vector<std::string> in_save;
  hooks.after_step = [&](const StepResult&) -> std::optional<int> {
    // The hook itself is not a pause (the checkpointer's per-step agreement is a collective where a hung peer must
    // show as a stall); a synchronous save inside it is (Checkpointer::after_step opens a Pause around it).
    in_hook.push_back(registry.serialize());
    hook_marks.push_back(ScrapingSource::pause_mark(progress));
    TrainMetrics::Pause save(trainer.metrics());
    in_save.push_back(registry.serialize());
    save_marks.push_back(ScrapingSource::pause_mark(progress));
    {
      TrainMetrics::Pause inner(trainer.metrics());  // nested: its end does not end the outer pause
    }
    nested_marks.push_back(ScrapingSource::pause_mark(progress));
    return std::nullopt;
  };
  trainer.set_hooks(hooks);
  REQUIRE(trainer.run() == 0);
  const std::string l = "{rank=\"0\"}";
  auto paused = [&](const std::string& text) { return sample(lines(text), "railyard_worker_paused" + l); };
  REQUIRE(val.seen.size() == 6);  // validation at steps 0, 2 and 4, 2 batches each
  for (const auto& t : val.seen) CHECK(paused(t) == 1);
  REQUIRE(in_hook.size() == 4);
  for (const auto& t : in_hook) CHECK(paused(t) == 0);
  REQUIRE(in_save.size() == 4);
  for (const auto& t : in_save) CHECK(paused(t) == 1);
  REQUIRE_FALSE(train.seen.empty());
  for (const auto& t : train.seen) CHECK(paused(t) == 0);
  // The last pause's end is the progress the stall rules count from.
  const std::string after = lines(registry.serialize());
  CHECK(sample(after, "railyard_worker_paused" + l) == 0);
  CHECK(sample(after, "railyard_worker_pause_end_timestamp_seconds" + l) > 1.7e9);
  // The same in the progress file, from the first step's record on (before it, the agent counts no stall anyway):
  // validation at step 0 before any record, at steps 2 and 4 marked; each step's own record says false; the hook's
  // save marked, and still marked after a nested pause ended inside it.
  REQUIRE(val.marks.size() == 6);
  CHECK(val.marks[0] == "absent");
  CHECK(val.marks[1] == "absent");
  for (size_t i = 2; i < 6; ++i) CHECK(val.marks[i] == "true");
  REQUIRE(hook_marks.size() == 4);
  CHECK(hook_marks[0] == "absent");  // the hook runs before step 1's record is written
  for (size_t i = 1; i < 4; ++i) CHECK(hook_marks[i] == "false");
  CHECK(save_marks[0] == "absent");
  for (size_t i = 1; i < 4; ++i) CHECK(save_marks[i] == "true");
  for (size_t i = 1; i < 4; ++i) CHECK(nested_marks[i] == "true");
  for (size_t i = 1; i < train.marks.size(); ++i) CHECK(train.marks[i] != "true");
  CHECK(ScrapingSource::pause_mark(progress) == "false");
  std::filesystem::remove(progress);
}
