// Writes the seed corpora under <out>/<fuzzer>/: valid inputs produced by Railyard's own writers (shards, llm.c
// models, checkpoint manifests, rendezvous messages, metrics exposition) and by the unit tests' fixtures, so every
// fuzzer starts from inputs that reach deep into its parser. Usage: railyard_fuzz_seeds <out-dir> <source-dir>.
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "checkpoint/format.h"
#include "checkpoint/shm_store.h"
#include "common/metrics/metrics.h"
#include "common/rendezvous_protocol.h"
#include "tests/unit/monitor/sample_payloads.h"
#include "tests/unit/operator/job_fixture.h"
#include "worker/data/shard.h"
#include "worker/interop/llmc_model.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

fs::path g_out;

void seed(const std::string& fuzzer, const std::string& name, const std::string& bytes) {
  fs::create_directories(g_out / fuzzer);
  std::ofstream(g_out / fuzzer / name, std::ios::binary) << bytes;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// YAML as the API server would hand it over in JSON: scalars that read as numbers or booleans become those.
json yaml_to_json(const YAML::Node& n) {
  if (n.IsMap()) {
    json j = json::object();
    for (const auto& kv : n) j[kv.first.as<std::string>()] = yaml_to_json(kv.second);
    return j;
  }
  if (n.IsSequence()) {
    json j = json::array();
    for (const auto& v : n) j.push_back(yaml_to_json(v));
    return j;
  }
  if (n.IsNull()) return nullptr;
  const std::string s = n.as<std::string>();
  if (n.Tag() == "!") return s;  // quoted in the source
  if (s == "true" || s == "false") return s == "true";
  json num = json::parse(s, nullptr, false);
  return !num.is_discarded() && num.is_number() ? num : json(s);
}

void job_spec_seeds(const fs::path& source) {
  using railyard::op::testing::job_with;
  using railyard::op::testing::valid_job;
  seed("job_spec", "fixture.json", valid_job().dump());
  seed("job_spec", "elastic.json",
       job_with(json::parse(R"({"spec": {"replicas": 4, "elastic": {"minReplicas": 2, "maxReplicas": 4},
                                         "parallelism": {"data": null, "tensor": 1}}})"))
           .dump());
  seed("job_spec", "auto.json",
       job_with(json::parse(R"({"spec": {"parallelism": {"auto": true, "data": null}, "runPolicy":
                {"activeDeadlineSeconds": 600, "ttlSecondsAfterFinished": 60, "suspend": false,
                 "cleanPodPolicy": "All"}, "failurePolicy": {"maxRestarts": 2, "permanentExitCodes": [2],
                 "retryableExitCodes": [137]}, "placement": {"nodeSelector": {"gpu": "h100"}}}})"))
           .dump());
  seed("job_spec", "model-shape.json",
       job_with(json::parse(R"({"spec": {"model": {"preset": null, "layers": 2, "hidden": 64, "heads": 4,
                                "seqLen": 64, "vocab": 256}, "parallelism": {"tensor": 2, "data": 1},
                                "procsPerReplica": 2, "replicas": 1}})"))
           .dump());
  for (const auto& e : fs::directory_iterator(source / "deploy/examples")) {
    if (e.path().extension() != ".yaml") continue;
    for (const auto& doc : YAML::LoadAllFromFile(e.path().string())) {
      json j = yaml_to_json(doc);
      if (j.value("kind", "") == "TrainingJob") seed("job_spec", e.path().stem().string() + ".json", j.dump());
    }
  }
}

void kubeconfig_seeds() {
  const std::string head =
      "apiVersion: v1\nkind: Config\ncurrent-context: main\n"
      "clusters:\n- name: local\n  cluster:\n    server: https://127.0.0.1:6443\n"
      "    certificate-authority-data: "
      "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUJmYWtlQ0EKLS0tLS1FTkQgQ0VSVElGSUNBVEUtLS0tLQo=\n"
      "contexts:\n- name: main\n  context:\n    cluster: local\n    user: admin\n    namespace: team-a\n"
      "users:\n- name: admin\n  user:\n";
  seed("kubeconfig", "token.yaml", head + "    token: abc123\n");
  seed("kubeconfig", "token-file.yaml", head + "    tokenFile: token\n");
  seed("kubeconfig", "client-cert.yaml",
       head +
           "    client-certificate-data: "
           "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUJmYWtlQ0xJRU5UCi0tLS0tRU5EIENFUlRJRklDQVRFLS0tLS0K\n"
           "    client-key-data: "
           "LS0tLS1CRUdJTiBQUklWQVRFIEtFWS0tLS0tCk1JSUJmYWtlS0VZCi0tLS0tRU5EIFBSSVZBVEUgS0VZLS0tLS0K\n");
  seed("kubeconfig", "ca-file.yaml",
       "apiVersion: v1\nkind: Config\ncurrent-context: c\nclusters:\n- name: k\n  cluster:\n"
       "    server: https://127.0.0.1:6443\n    certificate-authority: ca.crt\n"
       "contexts:\n- name: c\n  context:\n    cluster: k\n    user: u\nusers:\n- name: u\n  user:\n"
       "    token: t\n");
}

void watch_seeds() {
  auto event = [](const char* type, const json& obj) { return json{{"type", type}, {"object", obj}}.dump() + "\n"; };
  json pod = {{"apiVersion", "v1"},
              {"kind", "Pod"},
              {"metadata", {{"name", "j-worker-0"}, {"namespace", "team-a"}, {"resourceVersion", "42"}}},
              {"status", {{"phase", "Running"}}}};
  json bookmark = {{"kind", "Pod"}, {"metadata", {{"resourceVersion", "43"}}}};
  json gone = {{"kind", "Status"},
               {"status", "Failure"},
               {"reason", "Expired"},
               {"code", 410},
               {"message", "too old resource version: 1 (42)"}};
  std::string stream =
      event("ADDED", pod) + event("MODIFIED", pod) + event("BOOKMARK", bookmark) + event("DELETED", pod);
  // First byte: chunk length selector (see watch_stream_fuzzer.cc).
  seed("watch_stream", "events", std::string(1, '\x07') + stream);
  seed("watch_stream", "events-crlf", std::string(1, '\x00') + event("ADDED", pod).insert(0, "\r\n"));
  seed("watch_stream", "gone", std::string(1, '\x3f') + event("ADDED", pod) + event("ERROR", gone));
  seed("watch_stream", "truncated", std::string(1, '\x10') + stream.substr(0, stream.size() / 2));
}

void checkpoint_seeds() {
  namespace ckpt = railyard::ckpt;
  ckpt::Manifest m;
  m.step = 100;
  m.run_id = "run-1";
  m.created = "2026-11-22T05:00:00Z";
  m.world_size = 2;
  m.layout = {{"dp", 2}, {"tp", 1}, {"pp", 1}, {"zero", 0}};
  m.tensors = {{"wte", ckpt::DType::F32, {4, 8}}, {"step", ckpt::DType::I64, {1}}};
  m.slices = {{"wte", {{0, 0}, {2, 8}}, "rank-00000.bin", 0, 64, 0},
              {"wte", {{2, 0}, {2, 8}}, "rank-00001.bin", 0, 64, 0},
              {"step", {{0}, {1}}, "rank-00000.bin", 64, 8, 0}};
  m.files = {{"rank-00000.bin", 72}, {"rank-00001.bin", 64}};
  m.rank_state = {{0, {{"rng", 1}}}, {1, {{"rng", 2}}}};
  seed("checkpoint_manifest", "manifest.json", ckpt::serialize_manifest(m));
  ckpt::RankRecord r;
  r.rank = 1;
  r.step = 100;
  r.run_id = "run-1";
  r.file = "rank-00001.bin";
  r.file_bytes = 64;
  r.tensors = {m.tensors[0]};
  r.slices = {m.slices[1]};
  seed("checkpoint_manifest", "rank-record.json", ckpt::to_json(r).dump());
}

// A segment as ShmStore::put writes it (tensors "a" (4,8) and "b" (8), what shm_image_fuzzer.cc asks for), read
// back from /dev/shm; byte 0 of each seed is the target's flags (bit 0 re-seal, bit 1 check the contents' CRC).
void shm_seeds() {
  namespace ckpt = railyard::ckpt;
  const std::string name = "/railyard-fuzz-seed-" + std::to_string(::getpid());
  std::vector<float> a(32), b(8);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i);
  for (size_t i = 0; i < b.size(); ++i) b[i] = -static_cast<float>(i);
  {
    ckpt::ShmStore store(name);
    store.put(7,
              {{"a", ckpt::DType::F32, {4, 8}, {{0, 0}, {4, 8}}, a.data()},
               {"b", ckpt::DType::F32, {8}, {{0}, {8}}, b.data()}},
              {{"rng", 1}});
  }
  const std::string image = slurp("/dev/shm" + name);
  ckpt::ShmStore::remove(name);
  seed("shm_image", "put-verified", std::string(1, '\x02') + image);
  seed("shm_image", "put-resealed", std::string(1, '\x01') + image);
}

void annotation_seeds() {
  seed("restart_annotations", "monitor.json",
       R"({"detector":"monitor","evidence":"no progress for 120 s","generation":3,"node":"gpu-7","rank":5,)"
       R"("reason":"Hang","rule":"RailyardHang","source":"rules","time":"2026-11-22T05:00:00Z"})");
  seed("restart_annotations", "by-hand", "now");
  seed("restart_annotations", "nodes", "gpu-1, gpu-2,,gpu-3 ,");
  seed("quantity", "milli", "250m");
  seed("quantity", "binary", "512Mi");
  seed("quantity", "decimal", "1.5");
  seed("quantity", "exponent", "1e9");
  seed("quantity", "integer", "8");
}

void binary_seeds(const fs::path& tmp) {
  std::vector<uint16_t> tokens = {1, 2, 3, 50256, 0, 7, 7, 7};
  railyard::worker::write_shard((tmp / "shard.bin").string(), tokens.data(), tokens.size());
  seed("token_shard", "shard.bin", slurp(tmp / "shard.bin"));
  railyard::worker::write_shard((tmp / "empty.bin").string(), tokens.data(), 0);
  seed("token_shard", "empty.bin", slurp(tmp / "empty.bin"));

  const railyard::worker::GptConfig cfg =
      railyard::worker::make_gpt_config(/*L=*/1, /*C=*/8, /*NH=*/2, /*maxT=*/8, /*V=*/16);  // Vp 128
  std::vector<float> params(railyard::worker::num_parameters(cfg), 0.5f);
  railyard::worker::save_llmc_model((tmp / "model.bin").string(), cfg, params.data());
  seed("llmc_model", "tiny-fp32.bin", slurp(tmp / "model.bin"));
}

void rendezvous_seeds() {
  namespace rdzv = railyard::rdzv;
  rdzv::JobRef ref{"team-a", "tiny", "tiny-worker-0"};
  rdzv::JoinRequest join;
  join.ref = ref;
  join.pod_ip = "127.0.1.2";
  join.store_port = 29500;
  join.agent_id = "a1b2";
  join.wait_ms = 1000;
  seed("rendezvous", "join.json", rdzv::to_json(join).dump());
  seed("rendezvous", "status.json", rdzv::to_json(rdzv::StatusRequest{ref, 3, 500}).dump());
  rdzv::ExitReport exit;
  exit.ref = ref;
  exit.generation = 3;
  exit.exit_code = 137;
  seed("rendezvous", "exit.json", rdzv::to_json(exit).dump());
  rdzv::ProgressReport progress;
  progress.ref = ref;
  progress.generation = 3;
  progress.step = 20;
  progress.loss = 3.5;
  progress.tokens_per_second = 1200;
  seed("rendezvous", "progress.json", rdzv::to_json(progress).dump());
  rdzv::Assignment a;
  a.generation = 3;
  a.world_size = 2;
  a.num_pods = 2;
  a.pod_index = 1;
  a.local_world_size = 1;
  a.ranks = {1};
  a.layout = {2, 1, 1};
  a.master_addr = "127.0.1.1";
  a.master_port = 29500;
  a.pods = {"tiny-worker-0", "tiny-worker-1"};
  seed("rendezvous", "assignment.json", rdzv::to_json(a).dump());
}

void monitor_seeds() {
  seed("alertmanager", "firing.json", railyard::monitor::testing::kAlertmanagerFiring);
  seed("prometheus_query", "vector.json", railyard::monitor::testing::kQueryVector);
  seed("prometheus_query", "scalar.json", R"({"status":"success","data":{"resultType":"scalar","result":[1,"2"]}})");
  seed("prometheus_query", "error.json",
       R"({"status":"error","errorType":"bad_data","error":"parse error at char 3"})");

  railyard::metrics::Registry reg;
  reg.counter("railyard_worker_steps_total", "Steps.").add({{"job", "j"}, {"rank", "0"}}).increment(3);
  reg.gauge("railyard_worker_loss", "Loss.").add({{"job", "j"}, {"rank", "0"}}).set(2.5);
  reg.histogram("railyard_worker_step_seconds", "Step time.", {0.1, 1, 10}).add({{"job", "j"}}).observe(0.5);
  seed("prometheus_text", "registry.txt", reg.serialize());
  seed("prometheus_text", "special.txt",
       "# HELP x A metric.\n# TYPE x gauge\nx{a=\"b\\\"c\\n\"} NaN 1700000000000\ny +Inf\nz -Inf\n\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: railyard_fuzz_seeds <out-dir (tests/fuzz/corpus)> <source-dir>\n";
    return 2;
  }
  g_out = argv[1];
  const fs::path source = argv[2];
  const fs::path tmp = fs::temp_directory_path() / "railyard-fuzz-seeds";
  fs::create_directories(tmp);
  job_spec_seeds(source);
  kubeconfig_seeds();
  watch_seeds();
  checkpoint_seeds();
  shm_seeds();
  annotation_seeds();
  binary_seeds(tmp);
  rendezvous_seeds();
  monitor_seeds();
  fs::remove_all(tmp);
  std::cout << "seeds written under " << g_out.string() << "\n";
  return 0;
}
