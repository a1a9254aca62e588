// `railyard-worker train --moe-experts ... --ep N` as a user runs it (processes over real Gloo sockets, shards from
// `railyard data prepare`): a checkpoint saved at --ep 2 (2 ranks) resumes at --ep 1 (one process), --ep 4 (4 ranks)
// and --ep 2 over 4 ranks with the hierarchical all_to_all, each continuing with the uninterrupted run's losses;
// what expert parallelism does not compose with exits 2 naming the flag.
#include <doctest/doctest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tests/unit/worker/worker_test_util.h"
#include "tests/unit/worker_parallel/launch_test_util.h"

using namespace railyard::worker::testing;

TEST_CASE("MoE checkpoints reshard across expert-parallel degrees; unsupported combinations exit 2") {
  const std::string bin = bin_dir();
  TempDir dir;
  const std::string d = dir.path();
  REQUIRE(sh(bin + "/railyard data prepare --input /usr/share/common-licenses/GPL-3 " +
             "/usr/share/common-licenses/Apache-2.0 --output " + d + "/data > " + d + "/prep.txt 2>&1") == 0);
  // 4 micro-batches of B2 T32 per step: 1 process accumulates 4, 2 ranks 2 each, 4 ranks 1 each.
  const std::string common = bin +
                             "/railyard-worker train --model l=2,c=32,nh=4,t=32,v=256 --moe-experts 4 --moe-top-k 2 "
                             "--batch 2 --seq 32 --global-batch 256 --threads 1 --peak-flops 1e11 --data " +
                             d + "/data --steps 6 ";
  REQUIRE(sh(common + "--nproc 2 --ep 2 --ckpt-dir " + d + "/ck --ckpt-every 3 --log-json " + d + "/full.jsonl > " + d +
             "/full.out 2> " + d + "/full.err") == 0);
  CHECK(slurp(d + "/full.err").find("ep=2 group [0,1] flat all_to_all over 2") != std::string::npos);
  const auto full = losses(d + "/full.jsonl");
  REQUIRE(full.size() == 6);
  REQUIRE(std::filesystem::exists(d + "/ck/step-00000003"));
  struct Case {
    std::string name, flags;
  };
  // Resumes a copy of `src`'s step-3 checkpoint with `c.flags`: the last 3 steps must be the uninterrupted run's.
  const auto resume_from = [&](const std::string& src, const Case& c) {
    CAPTURE(c.name);
    const std::string ck = d + "/ck_" + c.name;
    std::filesystem::create_directories(ck);
    std::filesystem::copy(src + "/step-00000003", ck + "/step-00000003", std::filesystem::copy_options::recursive);
    REQUIRE(sh(common + c.flags + " --ckpt-dir " + ck + " --resume " + ck + "/step-00000003 --log-json " + d + "/" +
               c.name + ".jsonl > " + d + "/" + c.name + ".out 2> " + d + "/" + c.name + ".err") == 0);
    CHECK(slurp(d + "/" + c.name + ".err").find("restored step=3") != std::string::npos);
    const auto resumed = losses(d + "/" + c.name + ".jsonl");
    REQUIRE(resumed.size() == 3);
    // Same global batch and data order; only the data-parallel summation order differs (measured <= 2e-8).
    for (size_t i = 0; i < 3; ++i) CHECK(std::abs(resumed[i] - full[3 + i]) <= 1e-6 * full[3 + i]);
  };
  for (const Case& c : {Case{"ep1", ""}, Case{"ep4", "--nproc 4 --ep 4"},
                        Case{"ep2h", "--nproc 4 --ep 2 --ep-a2a hierarchical --ep-node-size 1"},
                        Case{"ep2z", "--nproc 4 --ep 2 --zero 1"}}) {
    resume_from(d + "/ck", c);
  }
  // Expert-parallel storage (no ZeRO, not deterministic): each rank holds E/ep experts and says so; the run above
  // saved its experts' slices of the global tensors. The other way round too: a checkpoint of --ep 4 (one expert per
  // rank) restores at --ep 2 on 2 ranks and at --ep 2 on 4 ranks (2 ranks per expert shard).
  CHECK(slurp(d + "/full.err").find("holds experts 2-3") != std::string::npos);
  {
    // The ep 2 checkpoint stores fcw as two expert boxes, one per rank: experts [0, 2) and [2, 4) of (L, E, 4C, C).
    const auto m = nlohmann::json::parse(slurp(d + "/ck/step-00000003/manifest.json"));
    std::vector<std::pair<int64_t, int64_t>> fcw;  // (expert offset, expert count)
    for (const auto& sl : m["slices"]) {
      if (sl["tensor"] == "fcw")
        fcw.emplace_back(sl["box"]["offset"][1].get<int64_t>(), sl["box"]["size"][1].get<int64_t>());
    }
    std::sort(fcw.begin(), fcw.end());
    CHECK(fcw == std::vector<std::pair<int64_t, int64_t>>{{0, 2}, {2, 2}});
  }
  REQUIRE(sh(common + "--nproc 4 --ep 4 --ckpt-dir " + d + "/ck4 --ckpt-every 3 --log-json " + d + "/four.jsonl > " +
             d + "/four.out 2> " + d + "/four.err") == 0);
  const auto four = losses(d + "/four.jsonl");
  REQUIRE(four.size() == 6);
  for (size_t i = 0; i < 6; ++i) CHECK(std::abs(four[i] - full[i]) <= 1e-6 * full[i]);
  for (const Case& c :
       {Case{"from4_ep2", "--nproc 2 --ep 2"}, Case{"from4_ep2x2", "--nproc 4 --ep 2"}, Case{"from4_ep1", ""}}) {
    resume_from(d + "/ck4", c);
  }
  // Refusals name the flag (exit 2 from every rank, before any step).
  struct Bad {
    std::string flags, text;
  };
  for (const Bad& b : {Bad{"--nproc 2 --ep 3", "--ep 3"}, Bad{"--nproc 2 --ep 2 --dp-split 3,1", "uneven"},
                       Bad{"--nproc 2 --tp 2", "--tp/--pp"}, Bad{"--ep 2", "data-parallel degree 1"},
                       Bad{"--nproc 2 --ep 2 --ep-a2a ring", "--ep-a2a ring"}}) {
    CAPTURE(b.flags);
    const int rc = sh(common + b.flags + " > " + d + "/bad.out 2> " + d + "/bad.err");
    CHECK(rc == 2);
    CHECK(slurp(d + "/bad.err").find(b.text) != std::string::npos);
  }
}
