// torchrun's command line as Railyard reads it (common/torchrun.h): which commands are torchrun (launcher auto), its
// options as its argparse reads them, and the flags that would override what the agent sets through PET_*.
#include "common/torchrun.h"

#include <doctest/doctest.h>

#include <string>
#include <vector>

namespace tr = railyard::torchrun;
using Argv = std::vector<std::string>;

TEST_CASE("torchrun is recognised conservatively") {
  CHECK(tr::is_torchrun({"torchrun", "train.py"}));
  CHECK(tr::is_torchrun({"/usr/local/bin/torchrun", "--nproc-per-node=2", "train.py"}));
  CHECK(tr::is_torchrun({"python3", "-m", "torch.distributed.run", "train.py"}));
  CHECK(tr::is_torchrun({"python", "-m", "torch.distributed.run", "train.py"}));
  CHECK(tr::is_torchrun({"/usr/bin/python3.11", "-m", "torch.distributed.run", "train.py"}));
  CHECK(tr::is_torchrun({"torchrun"}));  // torchrun without a script fails in torchrun, the way the user wrote it
  // Not torchrun, or not surely: a script, a shell, env, the deprecated launcher, python flags before -m.
  CHECK_FALSE(tr::is_torchrun({"python3", "/app/train.py"}));
  CHECK_FALSE(tr::is_torchrun({"python3", "/app/torchrun.py"}));
  CHECK_FALSE(tr::is_torchrun({"sh", "-c", "torchrun train.py"}));
  CHECK_FALSE(tr::is_torchrun({"env", "torchrun", "train.py"}));
  CHECK_FALSE(tr::is_torchrun({"python3", "-m", "torch.distributed.launch", "train.py"}));
  CHECK_FALSE(tr::is_torchrun({"python3", "-u", "-m", "torch.distributed.run", "train.py"}));
  CHECK_FALSE(tr::is_torchrun({"python3-config", "-m", "torch.distributed.run", "train.py"}));
  CHECK_FALSE(tr::is_torchrun({"my-torchrun", "train.py"}));
  CHECK_FALSE(tr::is_torchrun({}));
}

TEST_CASE("torchrun's options are read as its argparse reads them") {
  const Argv argv = {"torchrun",    "--nproc_per_node", "4",        "--log-dir=/logs", "-r",       "3", "-t3",
                     "--no-python", "--standalone",     "--nnod=2", "bin/train",       "--nnodes", "9"};
  const auto c = tr::parse_command(argv);
  REQUIRE(c);
  CHECK(c->first_option == 1);
  CHECK(c->interpreter == "python");
  CHECK(c->no_python);
  CHECK_FALSE(c->module);
  CHECK(c->script == 10);  // bin/train: what follows is the script's (its --nnodes is not torchrun's)
  REQUIRE(c->options.size() == 7);
  CHECK(c->options[0].dest == "nproc_per_node");
  CHECK(c->options[0].value == "4");
  CHECK(c->options[0].count == 2);
  CHECK(c->options[0].text == "--nproc_per_node 4");
  CHECK(c->options[1].dest == "log_dir");
  CHECK(c->options[1].value == "/logs");
  CHECK(c->options[2].dest == "redirects");
  CHECK(c->options[2].value == "3");
  CHECK(c->options[3].dest == "tee");  // -t3: a short option's attached value
  CHECK(c->options[3].value == "3");
  CHECK(c->options[4].dest == "no_python");
  CHECK(c->options[5].dest == "standalone");
  CHECK(c->options[6].dest == "nnodes");  // an abbreviation argparse accepts
  CHECK(c->options[6].index == 9);

  const auto m = tr::parse_command({"python3", "-m", "torch.distributed.run", "-m", "--", "pkg.train", "--lr", "1"});
  REQUIRE(m);
  CHECK(m->first_option == 3);
  CHECK(m->interpreter == "python3");
  CHECK(m->module);
  CHECK(m->script == 5);  // after "--"

  const auto none = tr::parse_command({"torchrun", "--nproc-per-node", "2"});
  REQUIRE(none);
  CHECK(none->script == 3);  // no script
  CHECK_FALSE(tr::parse_command({"python3", "train.py"}));
}

TEST_CASE("flags that would override Railyard's PET_* are refused with the fix; others are kept") {
  auto conflict = [](const Argv& argv, int procs) { return tr::check_options(*tr::parse_command(argv), procs); };
  // Kept: torchrun's own settings, and the flags that agree with what Railyard sets.
  CHECK_FALSE(conflict({"torchrun", "--log-dir", "/l", "--redirects=3", "--monitor-interval=1", "-m", "pkg"}, 2));
  CHECK_FALSE(conflict({"torchrun", "--nproc-per-node=2", "--max-restarts=0", "train.py"}, 2));
  CHECK_FALSE(conflict({"torchrun", "train.py", "--nnodes=4", "--master-port", "1"}, 1));  // the script's own
  for (const Argv& argv :
       {Argv{"torchrun", "--nnodes=1:4", "train.py"}, Argv{"torchrun", "--node_rank", "0", "t.py"},
        Argv{"torchrun", "--master-addr=h", "t.py"}, Argv{"torchrun", "--master_port=1", "t.py"},
        Argv{"torchrun", "--rdzv-backend=c10d", "t.py"}, Argv{"torchrun", "--rdzv_endpoint", "h:1", "t.py"},
        Argv{"torchrun", "--rdzv-id=x", "t.py"}, Argv{"torchrun", "--rdzv-conf=a=b", "t.py"},
        Argv{"torchrun", "--standalone", "t.py"}, Argv{"torchrun", "--nno", "2", "t.py"}}) {
    INFO(argv[1]);
    const auto c = conflict(argv, 1);
    REQUIRE(c);
    CHECK(c->index == 1);
    CHECK(c->problem.find(argv[1]) != std::string::npos);
    CHECK(c->fix.find("remove it") != std::string::npos);
  }
  const auto restarts = conflict({"python3", "-m", "torch.distributed.run", "--max-restarts", "3", "t.py"}, 1);
  REQUIRE(restarts);
  CHECK(restarts->index == 3);
  CHECK(restarts->fix.find("spec.failurePolicy.maxRestarts") != std::string::npos);
  const auto nproc = conflict({"torchrun", "--log-dir=/l", "--nproc-per-node=8", "t.py"}, 2);
  REQUIRE(nproc);
  CHECK(nproc->index == 2);
  CHECK(nproc->problem.find("spec.procsPerReplica (2)") != std::string::npos);
  CHECK(nproc->fix == "remove it, or set spec.procsPerReplica: 8");
  const auto gpu = conflict({"torchrun", "--nproc-per-node", "gpu", "t.py"}, 2);
  REQUIRE(gpu);
  CHECK(gpu->fix.find("set spec.procsPerReplica to the processes per pod") != std::string::npos);
}

TEST_CASE("the progress file of a local rank, in both launch modes") {
  CHECK(tr::progress_file_name(0) == "progress-0.json");
  CHECK(tr::progress_file_name(13) == "progress-13.json");
}
