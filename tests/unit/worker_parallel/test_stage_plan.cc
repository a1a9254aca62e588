// Pure layout math of the tensor/pipeline-parallel GPT: stage balancing against brute force, and shard maps that
// cover the llm.c buffer exactly once and round-trip.
#include <doctest/doctest.h>

#include <algorithm>
#include <functional>
#include <random>
#include <vector>

#include "common/error.h"
#include "worker/parallel/stage_plan.h"

using namespace railyard::worker;
using namespace railyard::worker::parallel;

namespace {

// Every way to cut L layers into pp non-empty contiguous stages; returns the smallest possible bottleneck.
double brute_force_bottleneck(const StageCosts& k, int L, int pp) {
  double best = 1e300;
  std::vector<int> b(pp + 1, 0);
  b[pp] = L;
  std::function<void(int)> rec = [&](int s) {
    if (s == pp) {
      double worst = 0;
      for (int i = 0; i < pp; ++i) worst = std::max(worst, stage_cost(k, b, i));
      best = std::min(best, worst);
      return;
    }
    for (int x = b[s - 1] + 1; x <= L - (pp - s); ++x) {
      b[s] = x;
      rec(s + 1);
    }
  };
  if (pp == 1) {
    return stage_cost(k, b, 0);
  }
  rec(1);
  return best;
}

}  // namespace

TEST_CASE("balance_stages is optimal, contiguous and covers every layer") {
  for (const char* name : {"tiny", "gpt2-124m", "gpt2-350m"}) {
    const GptConfig c = model_preset(name);
    const StageCosts k = stage_costs(c, c.max_seq_len);
    for (int pp = 1; pp <= std::min(c.num_layers, 8); ++pp) {
      CAPTURE(name);
      CAPTURE(pp);
      const auto b = balance_stages(c, c.max_seq_len, pp);
      REQUIRE(b.size() == static_cast<size_t>(pp + 1));
      CHECK(b.front() == 0);
      CHECK(b.back() == c.num_layers);
      double worst = 0;
      for (int s = 0; s < pp; ++s) {
        CHECK(b[s + 1] > b[s]);
        worst = std::max(worst, stage_cost(k, b, s));
      }
      if (c.num_layers <= 12) CHECK(worst <= brute_force_bottleneck(k, c.num_layers, pp) * (1 + 1e-12));
    }
  }
}

TEST_CASE("the LM head is accounted for: GPT-2's last stage gets fewer layers") {
  const GptConfig c = model_preset("gpt2-124m");  // head 2*C*Vp ~ 4.5 layers of 24*C^2 + 4*T*C
  const auto b = balance_stages(c, 1024, 4);
  CHECK(b == std::vector<int>{0, 3, 7, 11, 12});
  // the tiny model's head is cheap: an even split
  CHECK(balance_stages(model_preset("tiny"), 256, 2) == std::vector<int>{0, 2, 4});
  CHECK(balance_stages(model_preset("tiny"), 256, 4) == std::vector<int>{0, 1, 2, 3, 4});
}

TEST_CASE("layouts the model cannot take are refused naming the degree") {
  const GptConfig c = make_gpt_config(4, 32, 4, 16, 100);
  CHECK_THROWS_WITH_AS(validate_layout(c, 3, 1), doctest::Contains("tp=3 must divide the model's heads NH=4"),
                       railyard::ConfigError);
  CHECK_THROWS_WITH_AS(validate_layout(c, 1, 5), doctest::Contains("pp=5 must be in 1..4"), railyard::ConfigError);
  CHECK_THROWS_AS(make_stage_shape(c, 8, 2, 0, 2, 0, {0, 4, 4}), railyard::ConfigError);
  const GptConfig odd = make_gpt_config(2, 24, 3, 8, 100);  // Vp 128 is not divisible by 3
  CHECK_THROWS_WITH_AS(validate_layout(odd, 3, 1), doctest::Contains("padded vocabulary Vp=128"),
                       railyard::ConfigError);
}

TEST_CASE("tp=1 pp=1: the local buffer is the llm.c buffer") {
  const GptConfig c = make_gpt_config(4, 32, 4, 16, 100);
  const StageShape s = make_stage_shape(c, 8, 1, 0, 1, 0);
  const auto local = local_param_sizes(s);
  const auto full = param_sizes(c);
  for (int i = 0; i < kNumParamTensors; ++i) CHECK(local[i] == full[i]);
  const size_t n = num_parameters(c);
  std::vector<float> a(n), b(n, -1);
  for (size_t i = 0; i < n; ++i) a[i] = static_cast<float>(i);
  copy_full_to_local(make_shard_map(s), c, a.data(), b.data());
  CHECK(a == b);
}

TEST_CASE("shard maps of every (tp, pp) rank cover the buffer, count once and round-trip") {
  // dense, and with 4 experts (expert tensors and the router after lnfb: tp-replicated global slices of the layers)
  for (const int experts : {0, 4}) {
    CAPTURE(experts);
    GptConfig c = make_gpt_config(4, 32, 4, 16, 100);  // Vp 128: tp=4 ranks hold 32 wte rows, the last 4 real
    if (experts > 0) c.moe = make_moe_config(experts, 2, 1.0, 0.01);
    const size_t n = num_parameters(c);
    std::vector<float> full(n);
    std::mt19937 rng(3);
    std::uniform_real_distribution<float> u(-1, 1);
    for (float& x : full) x = u(rng);
    for (int tp : {1, 2, 4}) {
      for (int pp : {1, 2, 4}) {
        CAPTURE(tp);
        CAPTURE(pp);
        std::vector<int> covered(n, 0), counted(n, 0);
        std::vector<float> back(n, 0);
        for (int p = 0; p < pp; ++p) {
          for (int r = 0; r < tp; ++r) {
            const StageShape s = make_stage_shape(c, 8, tp, r, pp, p);
            const auto map = make_shard_map(s);
            const size_t local_n = local_num_params(s);
            // the slices tile the local buffer exactly
            size_t next = 0;
            for (const ShardSlice& sl : map) {
              CHECK(sl.local_offset == next);
              next += sl.numel();
            }
            CHECK(next == local_n);
            std::vector<float> local(local_n, 0);
            copy_full_to_local(map, c, full.data(), local.data());
            // mark what this rank covers: a local buffer of ones mapped back into a counter
            std::vector<float> ones(local_n, 1), mark(n, 0);
            copy_local_to_full(map, c, ones.data(), mark.data());
            std::vector<float> once(local_n, 0), mark_once(n, 0);
            for (const ElementRange& e : count_once_ranges(map, r))
              std::fill(once.begin() + e.begin, once.begin() + e.end, 1);
            copy_local_to_full(map, c, once.data(), mark_once.data());
            for (size_t i = 0; i < n; ++i) {
              covered[i] += mark[i] != 0;
              counted[i] += mark_once[i] != 0;
            }
            copy_local_to_full(map, c, local.data(), back.data());
            CHECK(s.layers() >= 1);
          }
        }
        CHECK(back == full);
        CHECK(std::all_of(covered.begin(), covered.end(), [](int x) { return x >= 1; }));
        CHECK(std::all_of(counted.begin(), counted.end(), [](int x) { return x == 1; }));
        // wte is held twice when pp > 1 (first and last stage), once otherwise
        CHECK(covered[0] == (pp > 1 ? 2 : 1));
        // experts and router: every tp rank of the layer's stage holds them
        if (experts > 0) CHECK(covered[router_offset(c)] == tp);
      }
    }
  }
}

TEST_CASE("tensor-parallel slices: rank r holds the q, k and v rows of its heads and the matching columns") {
  const GptConfig c = make_gpt_config(4, 32, 4, 16, 100);
  const StageShape s = make_stage_shape(c, 8, 2, 1, 2, 1);  // tp rank 1, last stage: layers 2..3
  CHECK(s.layer_begin == 2);
  CHECK(s.layer_end == 4);
  CHECK(s.valid_local_vocab() == 36);  // rows 64..127, of which 64..99 are real
  int qkv = 0;
  for (const ShardSlice& sl : make_shard_map(s)) {
    if (sl.tensor == 4) {
      CHECK(sl.extent == std::vector<size_t>{1, 16, 32});
      CHECK((sl.offset[1] == 16 || sl.offset[1] == 48 || sl.offset[1] == 80));  // j*C + r*Cl for q, k, v
      ++qkv;
    }
    if (sl.tensor == 6) {
      CHECK(sl.offset == std::vector<size_t>{2, 0, 16});
      CHECK(sl.extent == std::vector<size_t>{2, 32, 16});
    }
    if (sl.tensor == 0) {
      CHECK(sl.tied_copy);
      CHECK(sl.offset == std::vector<size_t>{64, 0});
    }
    if (sl.tensor == 7 || sl.tensor == 14) CHECK(sl.tp_replicated);
    CHECK(sl.tensor != 1);  // wpe lives on the first stage only
  }
  CHECK(qkv == 6);  // 2 layers x (q, k, v)
}
