// Path confinement (common/path_roots.h): lexical normalisation and symlink resolution against a root.
#include "common/path_roots.h"

#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace fs = std::filesystem;
using namespace railyard::paths;

TEST_CASE("lexically_within compares components after normalising '..' and '.'") {
  CHECK(lexically_within("/data", "/data"));
  CHECK(lexically_within("/data/", "/data"));
  CHECK(lexically_within("/data/a/train_*.bin", "/data/"));
  CHECK(lexically_within("/data/a/../b", "/data"));
  CHECK(lexically_within("/data/./x", "/data"));
  CHECK(lexically_within("/anything", "/"));
  CHECK_FALSE(lexically_within("/data2/x", "/data"));  // a prefix of the name is not a parent
  CHECK_FALSE(lexically_within("/data/../etc/passwd", "/data"));
  CHECK_FALSE(lexically_within("/data/a/../../etc", "/data"));
  CHECK_FALSE(lexically_within("/", "/data"));
  CHECK_FALSE(lexically_within("data/x", "/data"));  // relative: outside
  CHECK_FALSE(lexically_within("", "/data"));
  CHECK(lexically_normal("/a/b/../c/") == "/a/c");
  CHECK(lexically_normal("/..") == "/");
}

TEST_CASE("check_within names the field, the resolved path and the root; empty root allows everything") {
  CHECK_FALSE(check_within("spec.data.train", "/etc/x", "", "--data-root", false));
  CHECK_FALSE(check_within("spec.data.train", "/data/t/train_*.bin", "/data", "--data-root", false));
  auto m = check_within("spec.checkpoint.path", "/ckpt/../etc", "/ckpt", "--checkpoint-root", false);
  REQUIRE(m);
  CHECK(m->find("spec.checkpoint.path '/ckpt/../etc' (resolves to /etc) is outside --checkpoint-root /ckpt") == 0);
  auto rel = check_within("--data", "data/x", "/data", "RAILYARD_DATA_ROOT", true);
  REQUIRE(rel);
  CHECK(rel->find("must be an absolute path") != std::string::npos);
}

TEST_CASE("resolve follows symlinks of the existing prefix, so a link out of the root is outside") {
  char tmpl[] = "/tmp/path-roots-XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  const fs::path base = tmpl;
  fs::create_directories(base / "root" / "in");
  fs::create_directories(base / "outside");
  fs::create_directory_symlink(base / "outside", base / "root" / "escape");
  fs::create_directory_symlink(base / "root" / "in", base / "root" / "alias");
  const std::string root = (base / "root").string();
  // Lexically inside, really outside.
  CHECK(lexically_within((base / "root" / "escape" / "ck").string(), root));
  auto m =
      check_within("--ckpt-dir", (base / "root" / "escape" / "ck").string(), root, "RAILYARD_CHECKPOINT_ROOT", true);
  REQUIRE(m);
  CHECK(m->find("resolves to " + (base / "outside" / "ck").string()) != std::string::npos);
  // A link that stays inside, and a path not created yet, are fine.
  CHECK_FALSE(check_within("--data", (base / "root" / "alias" / "new" / "deeper").string(), root, "R", true));
  CHECK(resolve((base / "root" / "alias" / "x").string()) == (base / "root" / "in" / "x").string());
  // A root that is itself a symlink is resolved too.
  fs::create_directory_symlink(base / "root", base / "root-link");
  CHECK_FALSE(check_within("--data", (base / "root" / "in").string(), (base / "root-link").string(), "R", true));
  fs::remove_all(base);
}
