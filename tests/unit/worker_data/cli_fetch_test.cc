// `railyard data prepare` with URL inputs and --reuse (what a job's initializer pod runs: docs/storage.md
// "Initializer"), against a real HTTP server on a loopback socket.
#include <doctest/doctest.h>
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "tests/unit/worker_data/test_util.h"
#include "worker/interop/llmc_model.h"

using railyard::test::run_command;
using railyard::test::slurp;
using railyard::test::TempDir;

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Serves /corpus.txt (what `body` holds at the time of the request) and counts its requests; 404 for anything else.
struct CorpusServer {
  httplib::Server server;
  std::thread thread;
  int port = 0;
  std::mutex mu;
  std::string body;
  std::atomic<int> gets{0};
  CorpusServer() {
    server.Get("/corpus.txt", [this](const httplib::Request&, httplib::Response& res) {
      ++gets;
      std::lock_guard lock(mu);
      res.set_content(body, "text/plain");
    });
    server.Get("/moved", [](const httplib::Request&, httplib::Response& res) { res.set_redirect("/corpus.txt"); });
    port = server.bind_to_any_port("127.0.0.1");
    thread = std::thread([this] { server.listen_after_bind(); });
    while (!server.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~CorpusServer() {
    server.stop();
    thread.join();
  }
  std::string url(const std::string& path) const { return "http://127.0.0.1:" + std::to_string(port) + path; }
  void set(const std::string& b) {
    std::lock_guard lock(mu);
    body = b;
  }
};

}  // namespace

TEST_CASE("data prepare fetches URL inputs, records their digests, and --reuse keeps shards of the same content") {
  const std::string bin = railyard::test::bin_path("railyard");
  CorpusServer srv;
  srv.set(slurp("/usr/share/common-licenses/GPL-3"));
  TempDir dir;
  const std::string out = dir.file("data");
  const std::string cmd = bin + " data prepare --input " + srv.url("/corpus.txt") + " --output " + out + " --reuse";

  auto r = run_command(cmd);
  REQUIRE_MESSAGE(r.code == 0, r.output);
  CHECK(contains(r.output, "fetching " + srv.url("/corpus.txt")));
  CHECK(std::filesystem::exists(out + "/train_000000.bin"));
  CHECK_FALSE(std::filesystem::exists(out + "/.railyard-fetch"));  // the fetched text does not stay
  nlohmann::json m = nlohmann::json::parse(slurp(out + "/prepare.json"));
  CHECK(m["inputs"][0]["source"] == srv.url("/corpus.txt"));
  CHECK(m["inputs"][0]["sha256"].get<std::string>().size() == 64);
  CHECK(m["inputs"][0]["bytes"] == std::filesystem::file_size("/usr/share/common-licenses/GPL-3"));
  const auto first_write = std::filesystem::last_write_time(out + "/train_000000.bin");

  // Same content again (a restarted initializer): fetched, found prepared, shards kept.
  r = run_command(cmd);
  REQUIRE_MESSAGE(r.code == 0, r.output);
  CHECK(contains(r.output, "up to date"));
  CHECK(std::filesystem::last_write_time(out + "/train_000000.bin") == first_write);
  // Through a redirect it is the same content: still up to date.
  r = run_command(bin + " data prepare --input " + srv.url("/moved") + " --output " + out + " --reuse");
  REQUIRE_MESSAGE(r.code == 0, r.output);
  CHECK(contains(r.output, "up to date"));

  // Other content: the shards are replaced (no --force needed with --reuse), and the manifest says so.
  srv.set(slurp("/usr/share/common-licenses/GPL-2"));
  r = run_command(cmd);
  REQUIRE_MESSAGE(r.code == 0, r.output);
  CHECK_FALSE(contains(r.output, "up to date"));
  m = nlohmann::json::parse(slurp(out + "/prepare.json"));
  CHECK(m["inputs"][0]["bytes"] == std::filesystem::file_size("/usr/share/common-licenses/GPL-2"));
  // Other options (validation fraction) over the same content: prepared again.
  r = run_command(cmd + " --val-fraction 0.2");
  REQUIRE_MESSAGE(r.code == 0, r.output);
  CHECK_FALSE(contains(r.output, "up to date"));
  CHECK(srv.gets.load() == 5);

  // Without --reuse, shards already there are refused as before.
  r = run_command(bin + " data prepare --input " + srv.url("/corpus.txt") + " --output " + out);
  CHECK(r.code == 1);
  CHECK(contains(r.output, "already holds shards"));
}

TEST_CASE("data prepare names the URL and the cause when a fetch fails") {
  const std::string bin = railyard::test::bin_path("railyard");
  CorpusServer srv;
  TempDir dir;
  auto r = run_command(bin + " data prepare --input " + srv.url("/missing.txt") + " --output " + dir.file("d"));
  CHECK(r.code == 1);
  CHECK(contains(r.output, srv.url("/missing.txt") + ": the server answered HTTP 404"));
  CHECK_FALSE(std::filesystem::exists(dir.file("d/train_000000.bin")));
  // Nothing listens on the server's port once it is stopped: the connection fails, named.
  const std::string gone = srv.url("/corpus.txt");
  srv.server.stop();
  r = run_command(bin + " data prepare --input " + gone + " --output " + dir.file("e"));
  CHECK(r.code == 1);
  CHECK(contains(r.output, gone + ": the request failed"));
}

TEST_CASE("model fetch: an llm.c file from a URL into place, checked first; the same content left as it is") {
  const std::string bin = railyard::test::bin_path("railyard");
  TempDir dir;
  const railyard::worker::GptConfig c = railyard::test::small_byte_gpt();
  std::vector<float> params(railyard::worker::num_parameters(c), 0.5f);
  railyard::worker::save_llmc_model(dir.file("served.bin"), c, params.data());
  CorpusServer srv;
  srv.set(slurp(dir.file("served.bin")));
  const std::string out = dir.file("model/initial.bin");
  const std::string cmd = bin + " model fetch " + srv.url("/corpus.txt") + " --output " + out;

  auto r = run_command(cmd);
  REQUIRE_MESSAGE(r.code == 0, r.output);
  CHECK(contains(r.output, "wrote " + out + ": llm.c GPT-2, 2 layers, 16 channels, vocab 256"));
  CHECK(slurp(out) == slurp(dir.file("served.bin")));
  CHECK_FALSE(std::filesystem::exists(out + ".part"));
  const auto written = std::filesystem::last_write_time(out);
  r = run_command(cmd);
  REQUIRE_MESSAGE(r.code == 0, r.output);
  CHECK(contains(r.output, "up to date"));
  CHECK(std::filesystem::last_write_time(out) == written);

  // Not a model (a text where the model was expected): refused, naming why, and the model in place stays.
  srv.set(slurp("/usr/share/common-licenses/GPL-3"));
  r = run_command(cmd);
  CHECK(r.code == 1);
  CHECK(contains(r.output, "initial.bin.part"));
  CHECK(slurp(out) == slurp(dir.file("served.bin")));
  CHECK_FALSE(std::filesystem::exists(out + ".part"));
  // A file in the pod is copied the same way.
  r = run_command(bin + " model fetch " + dir.file("served.bin") + " --output " + dir.file("copy.bin"));
  REQUIRE_MESSAGE(r.code == 0, r.output);
  CHECK(slurp(dir.file("copy.bin")) == slurp(dir.file("served.bin")));
}

TEST_CASE("data prepare: a directory input stands for the files under it, in path order (data.image's copy)") {
  const std::string bin = railyard::test::bin_path("railyard");
  TempDir dir;
  const std::string in = dir.file("image-data");
  std::filesystem::create_directories(in + "/b");
  std::filesystem::copy_file("/usr/share/common-licenses/GPL-3", in + "/b/gpl-3.txt");
  std::filesystem::copy_file("/usr/share/common-licenses/Apache-2.0", in + "/a.txt");
  std::filesystem::copy_file("/usr/share/common-licenses/MPL-2.0", in + "/c.txt");
  const std::string out = dir.file("data");
  auto r = run_command(bin + " data prepare --input " + in + " --output " + out + " --val-fraction 0 --reuse");
  REQUIRE_MESSAGE(r.code == 0, r.output);
  nlohmann::json m = nlohmann::json::parse(slurp(out + "/prepare.json"));
  REQUIRE(m["inputs"].size() == 3);
  CHECK(m["inputs"][0]["path"] == in + "/a.txt");
  CHECK(m["inputs"][1]["path"] == in + "/b/gpl-3.txt");
  CHECK(m["inputs"][2]["path"] == in + "/c.txt");
  CHECK(m["inputs"][1]["sha256"].get<std::string>().size() == 64);
  // The byte tokens are the three files' bytes in that order.
  const std::string want = slurp("/usr/share/common-licenses/Apache-2.0") + slurp("/usr/share/common-licenses/GPL-3") +
                           slurp("/usr/share/common-licenses/MPL-2.0");
  CHECK(m["total_tokens"] == want.size());
  const std::string shard = slurp(out + "/train_000000.bin");
  REQUIRE(shard.size() == 1024 + 2 * want.size());
  CHECK(shard[1024] == want[0]);
  CHECK(shard[1024 + 2 * (want.size() - 1)] == want.back());
  // The same files again: up to date (a retried initializer pod copies the image out again).
  r = run_command(bin + " data prepare --input " + in + " --output " + out + " --val-fraction 0 --reuse");
  REQUIRE_MESSAGE(r.code == 0, r.output);
  CHECK(contains(r.output, "up to date"));
  // A directory with no file in it is refused naming it.
  std::filesystem::create_directories(dir.file("empty/sub"));
  r = run_command(bin + " data prepare --input " + dir.file("empty") + " --output " + dir.file("out2"));
  CHECK(r.code == 1);
  CHECK(contains(r.output, "input directory " + dir.file("empty") + " holds no files"));
}
