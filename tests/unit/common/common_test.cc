#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "common/atomic_file.h"
#include "common/error.h"
#include "common/log.h"

namespace fs = std::filesystem;
using namespace railyard;

TEST_CASE("log lines carry level, component, message and quoted fields") {
  std::string line = log::format_line(log::Level::Warn, "kube", "watch ended",
                                      {{"resource", "pods"}, {"reason", "server closed stream"}, {"empty", ""}});
  CHECK(line.back() == '\n');
  CHECK(line.find(" WARN  kube: watch ended ") != std::string::npos);
  CHECK(line.find("resource=pods") != std::string::npos);
  CHECK(line.find("reason=\"server closed stream\"") != std::string::npos);
  CHECK(line.find("empty=\"\"") != std::string::npos);
  // A value with a newline must not break the one-line-per-record contract.
  std::string multi = log::format_line(log::Level::Info, "c", "m", {{"k", "a\nb"}});
  CHECK(multi.find('\n') == multi.size() - 1);
}

TEST_CASE("log level names parse and unknown names are refused with the accepted list") {
  CHECK(log::parse_level("debug") == log::Level::Debug);
  CHECK(log::parse_level("warning") == log::Level::Warn);
  try {
    log::parse_level("loud");
    FAIL("expected an error");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()).find("debug, info, warn or error") != std::string::npos);
  }
}

TEST_CASE("write_file_atomic replaces content and read_file names missing files") {
  fs::path dir = fs::temp_directory_path() / ("railyard-common-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::string path = (dir / "f.txt").string();
  write_file_atomic(path, "one");
  write_file_atomic(path, "two");
  CHECK(read_file(path) == "two");
  // No temporaries are left behind.
  int entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir)) ++entries;
  CHECK(entries == 1);
  try {
    read_file((dir / "missing").string(), "kubeconfig");
    FAIL("expected an error");
  } catch (const ConfigError& e) {
    std::string msg = e.what();
    CHECK(msg.find("kubeconfig") == 0);
    CHECK(msg.find("missing") != std::string::npos);
  }
  CHECK_THROWS_AS(write_file_atomic((dir / "no-such-dir" / "x").string(), "x"), Error);
  fs::remove_all(dir);
}

TEST_CASE("env_or falls back on unset and empty variables") {
  ::setenv("RAILYARD_TEST_ENV", "", 1);
  CHECK(env_or("RAILYARD_TEST_ENV", "fb") == "fb");
  ::setenv("RAILYARD_TEST_ENV", "v", 1);
  CHECK(env_or("RAILYARD_TEST_ENV", "fb") == "v");
  ::unsetenv("RAILYARD_TEST_ENV");
  CHECK(env_or("RAILYARD_TEST_ENV", "fb") == "fb");
}
