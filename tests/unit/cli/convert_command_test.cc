// The `railyard convert` command (cli/convert_command.cc) as a user runs it: files in, YAML with the notes on top out,
// and an output that the operator's own parser would refuse refused before it is written. Runs the built binary, so
// it stays out of the ASan set, which builds only cli_convert (tests/fuzz/CMakeLists.txt).
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "cli/manifest_yaml.h"
#include "tests/unit/worker_data/test_util.h"

using nlohmann::json;
using railyard::cli::parse_manifests;

namespace {

std::vector<json> manifests(const std::string& name) {
  const std::string path = railyard::test::source_path("tests/unit/cli/manifests/" + name);
  return parse_manifests(railyard::test::slurp(path), path);
}

std::string railyard_bin() {
  const std::string path = railyard::test::bin_path("railyard");
  REQUIRE_MESSAGE(std::filesystem::exists(path), (path + " is missing: build it"));
  return path;
}

}  // namespace

TEST_CASE("railyard convert refuses what the operator's parser would refuse, naming the field") {
  railyard::test::TempDir dir;
  auto docs = manifests("pytorchjob-ddp.yaml");
  docs[0]["spec"]["runPolicy"]["backoffLimit"] = -1;
  { std::ofstream(dir.file("bad.json")) << docs[0].dump(); }
  const auto bad = railyard::test::run_command(railyard_bin() + " convert " + dir.file("bad.json"));
  CHECK(bad.code == 1);
  CHECK_MESSAGE(bad.output.find("would be refused by Railyard: spec.failurePolicy.maxRestarts") != std::string::npos,
                bad.output);
  // The same file, fixed, converts: notes on stderr and as comments above the YAML.
  docs[0]["spec"]["runPolicy"]["backoffLimit"] = 2;
  { std::ofstream(dir.file("good.json")) << docs[0].dump(); }
  const auto good =
      railyard::test::run_command(railyard_bin() + " convert " + dir.file("good.json") + " -o " + dir.file("out.yaml"));
  CHECK_MESSAGE(good.code == 0, good.output);
  CHECK(good.output.find("railyard convert: note: ") != std::string::npos);
  const std::string yaml = railyard::test::slurp(dir.file("out.yaml"));
  CHECK(yaml.rfind("# Converted by railyard convert from kubeflow.org/v1 PyTorchJob team-a/mnist-ddp", 0) == 0);
  const auto back = parse_manifests(yaml, "out.yaml");
  REQUIRE(back.size() == 1);
  CHECK(back[0]["spec"]["failurePolicy"]["maxRestarts"] == 2);
}
