// Railyard's GPT against PyTorch (tests/reference/gpt_reference.py, run with Debian's /usr/bin/python3 and its
// python3-torch): logits, loss, all gradients after one forward/backward, and the losses of 10 AdamW steps with the
// same schedule, clipping and weight-decay groups. Fails (never skips) when torch is missing.
#include <doctest/doctest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "tests/ctest_env.h"
#include "tests/unit/worker/worker_test_util.h"
#include "worker/train/trainer.h"

using namespace railyard::worker;
using namespace railyard::worker::testing;

namespace {

double rel_err(const float* a, const float* b, size_t n) {
  double d = 0, na = 0, nb = 0;
  for (size_t i = 0; i < n; ++i) {
    d += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    na += double(a[i]) * a[i];
    nb += double(b[i]) * b[i];
  }
  const double den = std::max(std::sqrt(na), std::sqrt(nb));
  return den == 0 ? 0 : std::sqrt(d) / den;
}

}  // namespace

TEST_CASE("forward, backward and 10 AdamW steps match PyTorch") {
  const GptConfig cfg = make_gpt_config(/*L=*/2, /*C=*/64, /*NH=*/4, /*maxT=*/32, /*V=*/200);  // Vp = 256: padding
  TrainConfig tc;
  tc.batch = 4;
  tc.seq_len = 16;
  tc.steps = 10;
  tc.lr = 3e-3;
  tc.warmup_steps = 3;
  tc.min_lr_frac = 0.1;
  tc.weight_decay = 0.1;
  tc.grad_clip = 1.0;
  tc.seed = 5;
  tc.peak_flops = 1;
  tc.quiet = true;
  const int N = tc.batch * tc.seq_len;
  std::vector<int32_t> inputs(N), targets(N);
  std::mt19937 rng(3);
  for (int i = 0; i < N; ++i) {
    inputs[i] = static_cast<int32_t>(rng() % cfg.vocab_size);
    targets[i] = static_cast<int32_t>(rng() % cfg.vocab_size);
  }
  FixedBatch batches(inputs, targets);
  ThreadPool pool(2);
  Trainer trainer(cfg, tc, pool, batches);
  Gpt<float>& m = trainer.model();

  TempDir dir;
  const std::string d = dir.path();
  nlohmann::json jc = {{"L", cfg.num_layers},
                       {"C", cfg.channels},
                       {"NH", cfg.num_heads},
                       {"maxT", cfg.max_seq_len},
                       {"V", cfg.vocab_size},
                       {"Vp", cfg.padded_vocab_size},
                       {"B", tc.batch},
                       {"T", tc.seq_len},
                       {"lr", tc.lr},
                       {"warmup", tc.warmup_steps},
                       {"steps", tc.steps},
                       {"min_lr_frac", tc.min_lr_frac},
                       {"weight_decay", tc.weight_decay},
                       {"grad_clip", tc.grad_clip},
                       {"beta1", tc.beta1},
                       {"beta2", tc.beta2},
                       {"eps", tc.eps}};
  std::ofstream(d + "/config.json") << jc.dump();
  write_binary(d + "/params.bin", m.params(), m.num_params());
  write_binary(d + "/inputs.bin", inputs.data(), inputs.size());
  write_binary(d + "/targets.bin", targets.data(), targets.size());

  const std::string script = railyard::test::source_path("tests/reference/gpt_reference.py");
  const std::string cmd = "/usr/bin/python3 " + script + " " + d + " 2> " + d + "/stderr.txt";
  const int rc = std::system(cmd.c_str());
  std::string err;
  {
    std::ifstream f(d + "/stderr.txt");
    err.assign(std::istreambuf_iterator<char>(f), {});
  }
  {
    INFO("command: " << cmd << "\nstderr: " << err);
    // 77 = torch or numpy missing (the script says how to install them); any other failure is a bug.
    REQUIRE_MESSAGE(WIFEXITED(rc), "the reference script did not exit normally");
    REQUIRE_MESSAGE(WEXITSTATUS(rc) == 0,
                    "reference script failed (77 means: install python3-torch via "
                    "scripts/install-deps.sh --with-torch)");
  }

  const auto result = nlohmann::json::parse(std::ifstream(d + "/result.json"));
  const auto ref_logits = read_binary<float>(d + "/logits.bin");
  const auto ref_grads = read_binary<float>(d + "/grads.bin");
  REQUIRE(ref_logits.size() == static_cast<size_t>(N) * cfg.vocab_size);
  REQUIRE(ref_grads.size() == m.num_params());

  // Logits and loss (evaluation forward keeps the logits).
  const float loss_eval = m.forward(inputs.data(), targets.data(), Gpt<float>::Mode::kEval);
  std::vector<float> logits(ref_logits.size());
  for (int r = 0; r < N; ++r) {
    for (int v = 0; v < cfg.vocab_size; ++v) {
      logits[static_cast<size_t>(r) * cfg.vocab_size + v] =
          m.logits()[static_cast<size_t>(r) * cfg.padded_vocab_size + v];
    }
  }
  const double logit_err = rel_err(logits.data(), ref_logits.data(), logits.size());
  MESSAGE("logits rel err " << logit_err << ", loss " << loss_eval << " vs torch " << result["loss"].get<double>());
  CHECK(logit_err < 1e-5);
  CHECK(std::abs(loss_eval - result["loss"].get<double>()) / result["loss"].get<double>() < 1e-5);

  // Gradients: norm-wise relative error per tensor, ||ours - torch|| / max(||ours||, ||torch||) < 1e-4.
  m.zero_grad();
  const float loss_train = m.forward(inputs.data(), targets.data(), Gpt<float>::Mode::kTrain);
  CHECK(loss_train == doctest::Approx(loss_eval).epsilon(1e-6));
  m.backward();
  auto sizes = param_sizes(cfg);
  size_t off = 0;
  for (int i = 0; i < kNumParamTensors; ++i) {
    const double e = rel_err(m.grads() + off, ref_grads.data() + off, sizes[i]);
    MESSAGE("grad " << kParamNames[i] << " rel err " << e);
    CHECK(e < 1e-4);
    off += sizes[i];
  }

  // 10 AdamW steps on the same batch: warmup + cosine, clipping at 1.0, decay on 2-D weights only.
  const auto ref_losses = result["losses"].get<std::vector<double>>();
  REQUIRE(ref_losses.size() == 10);
  for (int s = 0; s < 10; ++s) {
    const StepResult r = trainer.step();
    const double rel = std::abs(r.loss - ref_losses[s]) / ref_losses[s];
    MESSAGE("step " << s << " loss " << r.loss << " torch " << ref_losses[s] << " rel " << rel);
    CHECK(!r.skipped);
    CHECK(rel < 1e-4);  // fp32 rounding differences compound over steps; measured ~1e-6
  }
  CHECK(ref_losses.back() < ref_losses.front() - 0.5);  // the run actually trains
}
