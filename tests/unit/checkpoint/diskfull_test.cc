// Disk full during a save: the save fails cleanly (status Failed with the errno text, no `latest` move, no partial
// files), the previous checkpoint stays loadable, and the writer saves again afterwards.
//
// Mechanism: a 4 MiB tmpfs mounted on a temp directory (ENOSPC) when mount(2) is permitted (root, as here);
// otherwise a child process with RLIMIT_FSIZE = 2 MiB and SIGXFSZ ignored, so writes fail with EFBIG. The test
// prints which one ran.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <sstream>

#include "checkpoint/reader.h"
#include "checkpoint/writer.h"
#include "test_util.h"

using namespace railyard::ckpt;
using namespace railyard::ckpt::test;

namespace {

// Runs the scenario under root; returns "" when every expectation held, else what went wrong.
// With tight=true (tmpfs only) it also fills the disk so that the shard fits but the commit records do not.
std::string disk_full_scenario(const std::string& root, const std::string& expect_error, bool tight) {
  std::ostringstream bad;
  const auto small = small_gpt(true);                        // ~0.65 MiB
  const auto large = gpt_tensor_defs(4, 80, 64, 512, true);  // ~4.3 MiB: cannot fit
  WriterOptions o;
  o.root = root;
  o.keep = 2;
  Writer w(o);
  auto save = [&](int64_t step, const std::vector<TensorDef>& defs) {
    GlobalState g = GlobalState::make(defs, static_cast<uint64_t>(step));
    RankState rs = rank_state(g, Layout{}, 0);
    w.snapshot(step, rs.shards);
    return w.wait(step, Clock::now() + std::chrono::seconds(30));
  };
  auto load_is = [&](int64_t step, const std::vector<TensorDef>& defs) {
    FullTargets full(defs);
    LoadResult r = Reader(root).load_latest(full.targets);
    if (r.step != step) bad << "loaded step " << r.step << ", expected " << step << "; ";
    if (count_mismatches(GlobalState::make(defs, static_cast<uint64_t>(step)), full.data) != 0) {
      bad << "step " << step << " data differs; ";
    }
  };
  SaveStatus s1 = save(1, small);
  if (s1.state != SaveState::Committed) bad << "step 1 not committed: " << s1.error << "; ";
  SaveStatus s2 = save(2, large);
  if (s2.state != SaveState::Failed) bad << "step 2 did not fail; ";
  if (s2.error.find(expect_error) == std::string::npos)
    bad << "step 2 error lacks '" << expect_error << "': " << s2.error << "; ";
  for (const auto& e : std::filesystem::directory_iterator(root)) {
    const std::string name = e.path().filename().string();
    if (name != "latest" && name != kCommitLockName && name != step_dir_name(1)) bad << "left behind: " << name << "; ";
  }
  if (Reader(root).latest_pointer() != 1) bad << "latest moved; ";
  load_is(1, small);
  SaveStatus s3 = save(3, small);
  if (s3.state != SaveState::Committed) bad << "step 3 not committed after the failure: " << s3.error << "; ";
  load_is(3, small);
  if (!tight) return bad.str();
  // Leave room for the shard file plus two pages: the done record or the manifest is what hits ENOSPC.
  const std::string filler = root + "/../filler";
  {
    const uint64_t shard = std::filesystem::file_size(root + "/" + step_dir_name(3) + "/" + rank_file_name(0));
    const uint64_t free_bytes = std::filesystem::space(root).available;
    const uint64_t keep_free = (shard + 4095) / 4096 * 4096 + 8192;
    if (free_bytes <= keep_free) return bad.str() + "tmpfs too small for the tight case; ";
    std::vector<char> zeros(free_bytes - keep_free, 1);
    FILE* f = std::fopen(filler.c_str(), "wb");
    if (f == nullptr || std::fwrite(zeros.data(), 1, zeros.size(), f) != zeros.size() || std::fclose(f) != 0) {
      return bad.str() + "cannot write the filler; ";
    }
  }
  SaveStatus s4 = save(4, small);
  if (s4.state != SaveState::Failed) bad << "step 4 (commit records do not fit) did not fail; ";
  if (s4.error.find(expect_error) == std::string::npos) bad << "step 4 error: " << s4.error << "; ";
  for (const auto& e : std::filesystem::directory_iterator(root)) {
    const std::string name = e.path().filename().string();
    if (name != "latest" && name != kCommitLockName && name != step_dir_name(1) && name != step_dir_name(3))
      bad << "left behind: " << name << "; ";
  }
  if (Reader(root).latest_pointer() != 3) bad << "latest moved on step 4; ";
  load_is(3, small);
  std::filesystem::remove(filler);
  SaveStatus s5 = save(5, small);
  if (s5.state != SaveState::Committed) bad << "step 5 not committed after freeing space: " << s5.error << "; ";
  load_is(5, small);
  return bad.str();
}

}  // namespace

TEST_CASE("disk full during save fails cleanly and keeps the previous checkpoint") {
  TempDir dir("ckpt-full");
  const std::string mnt = dir / "mnt";
  std::filesystem::create_directory(mnt);
  // RAILYARD_CKPT_TEST_NO_MOUNT=1 exercises the fallback on a machine where mounting works.
  const bool no_mount = std::getenv("RAILYARD_CKPT_TEST_NO_MOUNT") != nullptr;
  if (no_mount) errno = EPERM;
  if (!no_mount && ::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=4m,mode=0700") == 0) {
    MESSAGE("disk-full mechanism: 4 MiB tmpfs (ENOSPC)");
    std::string problems;
    try {
      problems = disk_full_scenario(mnt + "/ckpt", "No space left on device", true);
    } catch (const std::exception& e) {
      problems = std::string("exception: ") + e.what();
    }
    ::umount2(mnt.c_str(), MNT_DETACH);
    CHECK_MESSAGE(problems.empty(), problems);
    return;
  }
  MESSAGE("disk-full mechanism: RLIMIT_FSIZE 2 MiB in a child, SIGXFSZ ignored (EFBIG); mount failed: "
          << std::string(std::strerror(errno)));
  const auto [pid, fd] = fork_child([&](int out) {
    ::signal(SIGXFSZ, SIG_IGN);
    struct rlimit lim {
      2u << 20, 2u << 20
    };
    ::setrlimit(RLIMIT_FSIZE, &lim);
    std::string problems;
    try {
      problems = disk_full_scenario(mnt + "/ckpt", "File too large", false);
    } catch (const std::exception& e) {
      problems = std::string("exception: ") + e.what();
    }
    if (!problems.empty() && ::write(out, problems.data(), problems.size()) < 0) ::_exit(3);
    return problems.empty() ? 0 : 1;
  });
  std::string problems;
  char buf[512];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0) problems.append(buf, static_cast<size_t>(n));
  ::close(fd);
  int st = 0;
  ::waitpid(pid, &st, 0);
  CHECK_MESSAGE((WIFEXITED(st) && WEXITSTATUS(st) == 0), problems);
}
