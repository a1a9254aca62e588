// `railyard-worker train --moe-experts ... --ep N` as a user runs it (processes over real Gloo sockets, shards from
// `railyard data prepare`): a checkpoint saved at --ep 2 (2 ranks) resumes at --ep 1 (one process), --ep 4 (4 ranks)
// and --ep 2 over 4 ranks with the hierarchical all_to_all, and in the tensor/pipeline stage path (--pp 2, --tp 2
// --sequence-parallel), each continuing with the uninterrupted run's losses; a checkpoint saved at --pp 2 resumes in
// one process and at --ep 2; what expert parallelism does not compose with exits 2 naming the flag.
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

namespace {

// The MoE job every case trains on `d`/data, 6 steps; the layout's flags follow.
std::string moe_train_command(const std::string& d) {
  return bin_dir() +
         "/railyard-worker train --model l=2,c=32,nh=4,t=32,v=256 --moe-experts 4 --moe-top-k 2 --batch 2 --seq 32 "
         "--global-batch 256 --threads 1 --peak-flops 1e11 --data " +
         d + "/data --steps 6 ";
}

// The uninterrupted run of `cmd`, checkpointing every 3 steps into `d`/`ck`, its log in `d`/`name`.{jsonl,out,err}:
// it must exit 0, log 6 losses (returned) and leave the step-3 checkpoint.
std::vector<double> checkpointed_run(const std::string& cmd, const std::string& d, const std::string& name,
                                     const std::string& ck) {
  REQUIRE(sh(cmd + " --ckpt-dir " + d + "/" + ck + " --ckpt-every 3 --log-json " + d + "/" + name + ".jsonl > " + d +
             "/" + name + ".out 2> " + d + "/" + name + ".err") == 0);
  const auto out = losses(d + "/" + name + ".jsonl");
  REQUIRE(out.size() == 6);
  REQUIRE(std::filesystem::exists(d + "/" + ck + "/step-00000003"));
  return out;
}

}  // namespace

TEST_CASE("MoE checkpoints reshard across expert-parallel degrees; unsupported combinations exit 2") {
  TempDir dir;
  const std::string d = dir.path();
  prepare_data(d);
  // 4 micro-batches of B2 T32 per step: 1 process accumulates 4, 2 ranks 2 each, 4 ranks 1 each.
  const std::string common = moe_train_command(d);
  const auto full = checkpointed_run(common + "--nproc 2 --ep 2", d, "full", "ck");
  CHECK(slurp(d + "/full.err").find("ep=2 group [0,1] flat all_to_all over 2") != std::string::npos);
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
    if (c.name == "pp2ep2") CHECK(slurp(d + "/" + c.name + ".err").find("ep=2 group [0,1]") != std::string::npos);
    const auto resumed = losses(d + "/" + c.name + ".jsonl");
    REQUIRE(resumed.size() == 3);
    // Same global batch and data order; only the data-parallel summation order differs (measured <= 2e-8).
    for (size_t i = 0; i < 3; ++i) CHECK(std::abs(resumed[i] - full[3 + i]) <= 1e-6 * full[3 + i]);
  };
  for (const Case& c : {Case{"ep1", ""}, Case{"ep4", "--nproc 4 --ep 4"},
                        Case{"ep2h", "--nproc 4 --ep 2 --ep-a2a hierarchical --ep-node-size 1"},
                        Case{"ep2z", "--nproc 4 --ep 2 --zero 1"},
                        // the tensor/pipeline stage path (gpt_stage_moe.cc) reads the same global expert tensors
                        Case{"pp2", "--nproc 2 --pp 2"}, Case{"tp2sp", "--nproc 2 --tp 2 --sequence-parallel"},
                        Case{"pp2ep2", "--nproc 4 --pp 2 --ep 2"}, Case{"pp2z", "--nproc 4 --pp 2 --zero 1"}}) {
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
  const auto four = checkpointed_run(common + "--nproc 4 --ep 4", d, "four", "ck4");
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
                       Bad{"--nproc 4 --tp 2 --ep 2 --deterministic", "--deterministic and --tp/--pp"},
                       Bad{"--nproc 2 --cp 2", "--cp"}, Bad{"--ep 2", "data-parallel degree 1"},
                       Bad{"--nproc 2 --ep 2 --ep-a2a ring", "--ep-a2a ring"}}) {
    CAPTURE(b.flags);
    const int rc = sh(common + b.flags + " > " + d + "/bad.out 2> " + d + "/bad.err");
    CHECK(rc == 2);
    CHECK(slurp(d + "/bad.err").find(b.text) != std::string::npos);
  }
}

TEST_CASE("MoE checkpoints saved by the pipeline stage path resume in one process and at --ep 2") {
  TempDir dir;
  const std::string d = dir.path();
  prepare_data(d, {"GPL-3"});
  const std::string common = moe_train_command(d);
  const auto full = checkpointed_run(common + "--nproc 2 --pp 2", d, "full", "ck");
  const std::string err = slurp(d + "/full.err");
  CHECK(err.find("stage 1/2") != std::string::npos);
  CHECK(err.find("dropped_fraction") != std::string::npos);  // the moe line, with the stages' statistics summed
  for (const std::string& flags : {std::string(""), std::string("--nproc 2 --ep 2")}) {
    CAPTURE(flags);
    const std::string ck = d + "/ck_" + std::to_string(flags.size());
    std::filesystem::create_directories(ck);
    std::filesystem::copy(d + "/ck/step-00000003", ck + "/step-00000003", std::filesystem::copy_options::recursive);
    REQUIRE(sh(common + flags + " --ckpt-dir " + ck + " --resume " + ck + "/step-00000003 --log-json " + ck +
               "/r.jsonl > " + ck + "/r.out 2> " + ck + "/r.err") == 0);
    CHECK(slurp(ck + "/r.err").find("restored step=3") != std::string::npos);
    const auto resumed = losses(ck + "/r.jsonl");
    REQUIRE(resumed.size() == 3);
    for (size_t i = 0; i < 3; ++i) CHECK(std::abs(resumed[i] - full[3 + i]) <= 1e-6 * full[3 + i]);
  }
}
