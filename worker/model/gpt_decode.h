// Text generation from a trained GPT: incremental decoding with a key/value cache, and sampling.
//
// GptDecoder runs one token at a time. Each layer keeps the keys and values of every position seen so far
// (kv_ (L, maxT, 2C)), so position t costs the matmuls of one row plus attention over t + 1 cached positions,
// instead of a forward over the whole sequence. The math is Gpt's forward restricted to the last row (the same CPU
// kernels; attention through cpu::attention_decode_forward); tests/unit/worker/test_gpt_decode.cc checks its logits
// and tokens against Gpt's full forward.
#pragma once

#include <cstdint>
#include <vector>

#include "worker/kernels/cpu/thread_pool.h"
#include "worker/model/gpt_config.h"

namespace railyard::worker {

class GptDecoder {
 public:
  // params: num_parameters(config) floats (llm.c order), read in place (not copied): they must outlive the decoder.
  // Dense models only (throws ConfigError for mixture-of-experts configs).
  GptDecoder(const GptConfig& config, const float* params, ThreadPool& pool);

  // Appends `token` at the next position and returns the logits (V, the padded rows left out) predicting the one
  // after it, valid until the next call. Throws ConfigError once maxT positions are used.
  const float* append(int32_t token);
  void reset() { pos_ = 0; }
  int position() const { return pos_; }  // tokens appended so far

 private:
  GptConfig c_;
  ThreadPool& pool_;
  // Pointers to the 16 parameter tensors in the caller's buffer ("sizes, then point into one buffer").
  const float *wte_, *wpe_, *ln1w_, *ln1b_, *qkvw_, *qkvb_, *attprojw_, *attprojb_, *ln2w_, *ln2b_, *fcw_, *fcb_,
      *fcprojw_, *fcprojb_, *lnfw_, *lnfb_;
  std::vector<float> kv_;  // (L, maxT, 2C): k | v of every position, per layer
  // One row's activations: x (C) residual stream, ln (C), qkv (3C), att (C), proj (C), fc (4C), gelu (4C),
  // mean/rstd (1), logits (Vp).
  std::vector<float> x_, ln_, qkv_, att_, proj_, fc_, gelu_, mean_, rstd_, logits_;
  int pos_ = 0;
};

// How the next token is drawn from the logits. temperature 0 = greedy (argmax, lowest id on ties); otherwise
// softmax(logits / temperature) restricted to the top_k most likely tokens (0 = all), then to the smallest set whose
// probability reaches top_p (1 = all), renormalised.
struct SamplingOptions {
  double temperature = 1.0;
  int top_k = 0;
  double top_p = 1.0;
};

// A small deterministic generator (splitmix64): the same seed gives the same tokens on every machine and library,
// which std:: distributions do not promise.
class SampleRng {
 public:
  explicit SampleRng(uint64_t seed) : state_(seed) {}
  double uniform();  // [0, 1)

 private:
  uint64_t state_;
};

int32_t sample_token(const float* logits, int V, const SamplingOptions& opt, SampleRng& rng);

}  // namespace railyard::worker
