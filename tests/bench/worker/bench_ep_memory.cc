// Expert-parallel storage (docs/parallel.md "Expert parallelism"): per-rank parameter + gradient + AdamW bytes of a
// gpt2-124m-shaped MoE model (E experts, top-k) at ep 1, 2, 4, measured two ways on one rank's real buffers (a Gpt and
// its AdamW built on the rank's layout, expert_shard_config): the buffers' element counts and the RSS growth while
// they are allocated (AlignedBuffer zero-fills, so every page is touched), against the planner's moe_state_bytes
// (fp32 CPU profile, ZeRO 0). Usage: bench_ep_memory [--experts 8] [--top-k 2] [--dp 4] [--eps 1,2,4]
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "planner/calibration.h"
#include "planner/moe_cost.h"
#include "tests/bench/process_stats.h"
#include "worker/kernels/cpu/thread_pool.h"
#include "worker/model/gpt.h"
#include "worker/model/gpt_config.h"
#include "worker/optim/adamw.h"

using namespace railyard;
using namespace railyard::worker;

using bench::rss_bytes;

int main(int argc, char** argv) {
  int experts = 8, top_k = 2, dp = 4;
  std::vector<int> eps = {4, 2, 1};  // the smallest first: the largest needs the most memory
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--experts") experts = std::atoi(v.c_str());
    if (k == "--top-k") top_k = std::atoi(v.c_str());
    if (k == "--dp") dp = std::atoi(v.c_str());
    if (k == "--eps") {
      eps.clear();
      for (size_t p = 0; p < v.size();) {
        eps.push_back(std::atoi(v.c_str() + p));
        const size_t c = v.find(',', p);
        p = c == std::string::npos ? v.size() : c + 1;
      }
    }
  }
  GptConfig global = model_preset("gpt2-124m");
  global.moe = make_moe_config(experts, top_k, 1.25, 0.01);
  const plan::DeviceProfile cpu = plan::builtin_profile("cpu");
  const plan::ModelShape shape{
      "gpt2-124m", global.num_layers, global.channels, global.num_heads, global.max_seq_len, global.vocab_size, false};
  const plan::MoeShape moe{experts, top_k, 1.25};
  std::printf("gpt2-124m E%d top-%d, dp %d, fp32 params + grads + AdamW m, v per rank\n", experts, top_k, dp);
  std::printf("%3s %14s %12s %12s %12s %8s\n", "ep", "params/rank", "buffers GB", "RSS +GB", "planner GB", "diff");
  ThreadPool pool(1);
  for (const int ep : eps) {
    const GptConfig local = expert_shard_config(global, ep, 0);
    const double before = rss_bytes();
    double buffers = 0, grown = 0;
    {
      Gpt<float> model(local, 1, 64, pool);  // a small micro-batch: the activations are not the point
      AdamW opt(local, AdamWHyper{}, pool);
      const double acts = static_cast<double>(model.activation_bytes());
      buffers = 4.0 * (2.0 * static_cast<double>(model.num_params()) + 2.0 * static_cast<double>(opt.size()));
      grown = rss_bytes() - before - acts;
    }
    const plan::MoeStateBytes p = plan::moe_state_bytes(shape, moe, cpu, dp, ep, 0);
    std::printf("%3d %14zu %12.3f %12.3f %12.3f %7.2f%%\n", ep, num_parameters(local), buffers / 1e9, grown / 1e9,
                p.total() / 1e9, 100.0 * (p.total() / buffers - 1));
  }
  return 0;
}
