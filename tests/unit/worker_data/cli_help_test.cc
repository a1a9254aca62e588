// Every `railyard` command and subcommand answers --help and -h with its usage on stdout and exit 0, and every flag
// a usage names is one the command parses. The commands are read from `railyard --help` itself, so a command added
// to the overview is walked without touching this test.
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <regex>
#include <set>
#include <sstream>

#include "tests/unit/worker_data/test_util.h"

using railyard::test::run_command;

namespace {

std::string bin_path(const char* name) {
  const std::string path = railyard::test::bin_path(name);
  REQUIRE_MESSAGE(std::filesystem::exists(path), (path + " is missing: build it"));
  return path;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// The overview's command lines: "  data prepare --input ..." -> "data prepare"; "  plan --model ..." -> "plan";
// "  ckpt ls|inspect|verify|reshard DIR" -> "ckpt ls", "ckpt inspect", ...; the groups themselves too.
std::set<std::string> commands_of(const std::string& overview) {
  std::set<std::string> out;
  std::istringstream in(overview);
  const std::regex line(R"(^  ([a-z]+)(?: ([a-z|]+))?(?: |$).*)");
  for (std::string l; std::getline(in, l);) {
    std::smatch m;
    if (!std::regex_match(l, m, line) || m[1] == "help") continue;
    out.insert(m[1]);
    std::string subs = m[2];
    for (size_t at = 0; !subs.empty() && at != std::string::npos;) {
      const size_t bar = subs.find('|', at);
      out.insert(m[1].str() + " " + subs.substr(at, bar == std::string::npos ? bar : bar - at));
      at = bar == std::string::npos ? bar : bar + 1;
    }
  }
  return out;
}

// --flag words in a usage text.
std::set<std::string> flags_of(const std::string& usage) {
  std::set<std::string> out;
  const std::regex flag(R"((^|[\s\[|(])(--[a-z][a-z0-9-]*))");
  for (auto it = std::sregex_iterator(usage.begin(), usage.end(), flag); it != std::sregex_iterator(); ++it)
    out.insert((*it)[2]);
  out.erase("--help");
  return out;
}

}  // namespace

TEST_CASE("every railyard command and subcommand prints its usage for --help and -h and exits 0") {
  const std::string bin = bin_path("railyard");
  const auto overview = run_command(bin + " --help 2>/dev/null");
  REQUIRE(overview.code == 0);
  const std::set<std::string> commands = commands_of(overview.output);
  // The walk covers what the overview lists today; a parse that found nothing would pass vacuously.
  for (const char* c :
       {"data", "data prepare", "data inspect", "data sample", "model", "model inspect", "model export", "plan", "eval",
        "generate", "convert", "report", "ckpt", "ckpt ls", "ckpt inspect", "ckpt verify", "ckpt reshard"})
    CHECK_MESSAGE(commands.count(c) == 1, "the overview does not list '" << c << "'");
  for (const std::string& c : commands) {
    for (const char* h : {"--help", "-h"}) {
      // stdout only: help is output, not an error.
      const auto r = run_command(bin + " " + c + " " + h + " 2>/dev/null");
      CAPTURE(c);
      CAPTURE(h);
      CHECK(r.code == 0);
      CHECK(r.output.rfind("usage: railyard " + c.substr(0, c.find(' ')), 0) == 0);
    }
  }
  // A subcommand's own help names it and its flags; --help wins wherever it stands on the line.
  auto r = run_command(bin + " data prepare --input a.txt --help 2>/dev/null");
  CHECK(r.code == 0);
  CHECK(r.output.rfind("usage: railyard data prepare --input FILE|URL...", 0) == 0);
  CHECK(contains(r.output, "--shard-tokens"));
  CHECK_FALSE(contains(r.output, "data inspect"));
  r = run_command(bin + " data --help 2>/dev/null");
  CHECK(contains(r.output, "data prepare"));
  CHECK(contains(r.output, "data sample"));
  CHECK_FALSE(contains(r.output, "model inspect"));
  r = run_command(bin + " ckpt ls --help 2>/dev/null");
  CHECK(contains(r.output, "reshard DIR --to-dp"));
  // Without --help the usage errors stay errors (exit 2).
  CHECK(run_command(bin + " data").code == 2);
  CHECK(run_command(bin + " data prepare --frob").code == 2);
}

TEST_CASE("every flag a data or model usage names is one the command parses") {
  const std::string bin = bin_path("railyard");
  for (const char* c : {"data prepare", "data inspect", "data sample", "model inspect", "model export"}) {
    const auto help = run_command(bin + " " + c + " --help 2>/dev/null");
    REQUIRE(help.code == 0);
    for (const std::string& f : flags_of(help.output)) {
      // A known flag fails later (missing value, missing input: exit 2 or 1), never as "unknown flag".
      const auto r = run_command(bin + " " + c + " " + f);
      CAPTURE(c);
      CAPTURE(f);
      CHECK_FALSE(contains(r.output, "unknown flag"));
    }
  }
}

TEST_CASE("railyard-worker's commands print their usage for --help and -h and exit 0") {
  const std::string bin = bin_path("railyard-worker");
  for (const char* c : {"", "train ", "agent ", "gemm-rate "}) {
    for (const char* h : {"--help", "-h"}) {
      const auto r = run_command(bin + " " + c + h + " 2>/dev/null");
      CAPTURE(c);
      CAPTURE(h);
      CHECK(r.code == 0);
      CHECK(contains(r.output, "usage"));
    }
  }
}
