// Generation (worker/model/gpt_decode.h): the key/value-cache decoder gives the logits of Gpt's full forward at every
// position (so the same tokens), and the sampler draws from the distribution it says (greedy, temperature, top-k,
// top-p, seeded).
#include <doctest/doctest.h>

#include <cmath>
#include <map>
#include <vector>

#include "common/error.h"
#include "worker/model/gpt.h"
#include "worker/model/gpt_decode.h"

using namespace railyard::worker;

TEST_CASE("the key/value cache gives the full forward's logits at every position") {
  // V=100 pads to Vp=128, so the padded rows' exclusion is exercised; maxT=24, 3 layers.
  const GptConfig cfg = make_gpt_config(/*L=*/3, /*C=*/32, /*NH=*/4, /*maxT=*/24, /*V=*/100);
  ThreadPool pool(2);
  Gpt<float> full(cfg, 1, cfg.max_seq_len, pool);
  full.init_weights(7);
  std::vector<float> params(full.num_params());
  full.copy_params_to_host(params.data());

  std::vector<int32_t> tokens(static_cast<size_t>(cfg.max_seq_len));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 37 + 11) % cfg.vocab_size);
  std::vector<int32_t> targets(tokens.size(), 0);
  full.forward(tokens.data(), targets.data(), Gpt<float>::Mode::kEval);

  GptDecoder dec(cfg, params.data(), pool);
  double worst = 0;
  for (int t = 0; t < cfg.max_seq_len; ++t) {
    const float* got = dec.append(tokens[static_cast<size_t>(t)]);
    const float* want = full.logits() + static_cast<size_t>(t) * cfg.padded_vocab_size;
    for (int v = 0; v < cfg.vocab_size; ++v) worst = std::max(worst, std::fabs(double(got[v]) - want[v]));
    CHECK(std::max_element(got, got + cfg.vocab_size) - got == std::max_element(want, want + cfg.vocab_size) - want);
  }
  // The same kernels on one row instead of 24: float32 rounding only.
  CHECK(worst < 1e-4);
  CHECK(dec.position() == cfg.max_seq_len);
  CHECK_THROWS_AS(dec.append(1), railyard::ConfigError);  // past maxT
  dec.reset();
  CHECK(dec.position() == 0);
  CHECK_THROWS_AS(dec.append(cfg.vocab_size), railyard::ConfigError);  // outside the vocabulary
}

TEST_CASE("sampling: greedy, seeded, and the distribution temperature, top-k and top-p say") {
  const std::vector<float> logits = {0.0f, 2.0f, 1.0f, 2.0f, -1.0f};  // ids 1 and 3 tie for the most likely
  SampleRng rng(1);
  SamplingOptions greedy;
  greedy.temperature = 0;
  CHECK(sample_token(logits.data(), 5, greedy, rng) == 1);  // the lowest id on a tie

  auto frequencies = [&](SamplingOptions o, int n, uint64_t seed) {
    SampleRng r(seed);
    std::map<int, double> f;
    for (int i = 0; i < n; ++i) f[sample_token(logits.data(), 5, o, r)] += 1.0 / n;
    return f;
  };
  // Temperature 1: softmax. 40000 draws: each frequency within 0.01 of its probability (about 4 standard deviations).
  double z = 0;
  for (float l : logits) z += std::exp(double(l));
  const auto f = frequencies({}, 40000, 3);
  for (int v = 0; v < 5; ++v) {
    CAPTURE(v);
    CHECK(std::fabs((f.count(v) ? f.at(v) : 0.0) - std::exp(double(logits[v])) / z) < 0.01);
  }
  // top-k 2: only the two most likely (1 and 3, equally often).
  SamplingOptions k2;
  k2.top_k = 2;
  const auto fk = frequencies(k2, 20000, 4);
  CHECK(fk.size() == 2);
  CHECK(std::fabs(fk.at(1) - 0.5) < 0.02);
  // top-p: 1 and 3 hold 2 e^2 / z = 0.78 of the mass; p = 0.7 keeps exactly them, p = 0.8 adds id 2.
  SamplingOptions p7, p8;
  p7.top_p = 0.7;
  p8.top_p = 0.8;
  CHECK(frequencies(p7, 5000, 5).size() == 2);
  const auto f8 = frequencies(p8, 20000, 6);
  CHECK(f8.size() == 3);
  CHECK(f8.count(2) == 1);
  // A low temperature concentrates on the most likely; the same seed repeats itself.
  SamplingOptions cold;
  cold.temperature = 0.05;
  const auto fc = frequencies(cold, 2000, 7);
  CHECK(fc.at(1) + fc.at(3) > 0.999);
  CHECK(frequencies({}, 100, 9) == frequencies({}, 100, 9));
  CHECK(frequencies({}, 100, 9) != frequencies({}, 100, 10));
}
