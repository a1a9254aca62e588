// common/kube against the real local API server (KUBECONFIG, RAILYARD_E2E_STATE_DIR, RAILYARD_SOURCE_DIR).
#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "common/kube/client.h"
#include "common/kube/event_recorder.h"
#include "common/kube/informer.h"
#include "common/kube/leader_elector.h"
#include "tests/ctest_env.h"
#include "tests/recording_proxy.h"
#include "tests/unit/kube/kube_test_util.h"

namespace fs = std::filesystem;
using namespace railyard::kube;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

std::string env(const char* name) { return railyard::test::fixture_env(name, "e2e_cluster"); }

// KEY=value pairs of $RAILYARD_E2E_STATE_DIR/cluster.env ("export KEY=value" lines).
std::map<std::string, std::string> cluster_env() {
  std::map<std::string, std::string> out;
  std::ifstream in(env("RAILYARD_E2E_STATE_DIR") + "/cluster.env");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("export ", 0) != 0) continue;
    line = line.substr(7);
    auto eq = line.find('=');
    if (eq == std::string::npos) continue;
    std::string v = line.substr(eq + 1);
    if (v.size() >= 2 && (v.front() == '\'' || v.front() == '"')) v = v.substr(1, v.size() - 2);
    out[line.substr(0, eq)] = v;
  }
  return out;
}

Config admin_config() { return load_kubeconfig(env("KUBECONFIG")); }

Client& admin() {
  static Client c([] {
    Config cfg = admin_config();
    cfg.qps = 500;  // the pagination test creates 1,000 objects
    cfg.burst = 1000;
    return cfg;
  }());
  return c;
}

std::string random_suffix() {
  static std::mt19937 rng(std::random_device{}());
  static const char* chars = "abcdefghijklmnopqrstuvwxyz0123456789";
  std::string s;
  for (int i = 0; i < 6; ++i) s += chars[rng() % 36];
  return s;
}

// A fresh namespace, deleted (with everything in it) when the test ends.
struct TestNamespace {
  std::string name;
  explicit TestNamespace(const std::string& prefix) : name(prefix + "-" + random_suffix()) {
    admin().create(resources::namespaces, "", {{"metadata", {{"name", name}}}});
  }
  ~TestNamespace() {
    try {
      admin().remove(resources::namespaces, "", name);
    } catch (const std::exception& e) {
      MESSAGE("could not delete namespace " << name << ": " << e.what());
    }
  }
};

Json configmap(const std::string& name, const std::string& value, const std::string& label = "kube-e2e") {
  return {{"apiVersion", "v1"},
          {"kind", "ConfigMap"},
          {"metadata", {{"name", name}, {"labels", {{"test", label}}}}},
          {"data", {{"value", value}}}};
}

template <typename Pred>
bool eventually(Pred pred, std::chrono::milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(20ms);
  }
  return pred();
}

int closed_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);  // nothing listens there now
  return ntohs(a.sin_port);
}

bool port_open(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  ::close(fd);
  return ok;
}

using railyard::kube::testing::b64;

// POST to etcd's v3 HTTP gateway.
Json etcd_post(const std::string& path, const Json& body) {
  auto ce = cluster_env();
  httplib::Client c("127.0.0.1", std::stoi(ce.at("ETCD_CLIENT_PORT")));
  auto r = c.Post(path, body.dump(), "application/json");
  REQUIRE_MESSAGE(r, "etcd gateway " << path << " unreachable");
  REQUIRE_MESSAGE(r->status == 200, "etcd gateway " << path << ": " << r->status << " " << r->body);
  return Json::parse(r->body);
}

}  // namespace

TEST_CASE("ConfigMap CRUD, AlreadyExists and Conflict on a stale resourceVersion") {
  TestNamespace ns("kube-crud");
  Client& c = admin();
  Json created = c.create(resources::configmaps, ns.name, configmap("cm1", "a"));
  CHECK(name_of(created) == "cm1");
  CHECK_FALSE(resource_version_of(created).empty());
  CHECK_THROWS_AS(c.create(resources::configmaps, ns.name, configmap("cm1", "a")), AlreadyExists);

  Json got = c.get(resources::configmaps, ns.name, "cm1");
  CHECK(got["data"]["value"] == "a");

  Json upd = got;
  upd["data"]["value"] = "b";
  Json updated = c.update(resources::configmaps, ns.name, upd);
  CHECK(updated["data"]["value"] == "b");
  CHECK(resource_version_of(updated) != resource_version_of(got));

  // The stale copy (old resourceVersion) must be refused: the caller re-reads.
  Json stale = got;
  stale["data"]["value"] = "c";
  try {
    c.update(resources::configmaps, ns.name, stale);
    FAIL("update with a stale resourceVersion succeeded");
  } catch (const Conflict& e) {
    CHECK(e.code() == 409);
    CHECK(std::string(e.what()).find("modified") != std::string::npos);
  }

  Json merged = c.patch(resources::configmaps, ns.name, "cm1", {{"data", {{"extra", "x"}}}}, PatchType::Merge);
  CHECK(merged["data"]["extra"] == "x");
  CHECK(merged["data"]["value"] == "b");
  Json jp = c.patch(resources::configmaps, ns.name, "cm1",
                    Json::array({{{"op", "replace"}, {"path", "/data/value"}, {"value", "j"}}}), PatchType::Json);
  CHECK(jp["data"]["value"] == "j");
  Json sp = c.patch(resources::configmaps, ns.name, "cm1", {{"metadata", {{"labels", {{"more", "yes"}}}}}},
                    PatchType::StrategicMerge);
  CHECK(sp["metadata"]["labels"]["more"] == "yes");
  CHECK(sp["metadata"]["labels"]["test"] == "kube-e2e");

  c.create(resources::configmaps, ns.name, configmap("cm2", "z", "other"));
  ListOptions lo;
  lo.label_selector = "test=kube-e2e";
  Json l = c.list(resources::configmaps, ns.name, lo);
  REQUIRE(l["items"].size() == 1);
  CHECK(l["items"][0]["metadata"]["name"] == "cm1");

  // A bad object is Invalid (422) with the server's field message.
  Json bad = configmap("Bad_Name!", "x");
  CHECK_THROWS_AS(c.create(resources::configmaps, ns.name, bad), Invalid);

  // A delete fenced by identity: the UID precondition of an object that no longer holds the name is a Conflict and
  // deletes nothing (the operator's pod deletions rely on it: controller.cc delete_pod).
  const std::string cm1_uid = c.get(resources::configmaps, ns.name, "cm1")["metadata"]["uid"].get<std::string>();
  DeleteOptions gone;
  gone.precondition_uid = "00000000-0000-0000-0000-000000000000";
  CHECK_THROWS_AS(c.remove(resources::configmaps, ns.name, "cm1", gone), Conflict);
  CHECK(c.try_get(resources::configmaps, ns.name, "cm1").has_value());
  DeleteOptions same;
  same.precondition_uid = cm1_uid;
  c.remove(resources::configmaps, ns.name, "cm1", same);
  CHECK_THROWS_AS(c.get(resources::configmaps, ns.name, "cm1"), NotFound);
  CHECK_FALSE(c.try_get(resources::configmaps, ns.name, "cm1").has_value());
  CHECK_THROWS_AS(c.remove(resources::configmaps, ns.name, "cm1"), NotFound);

  // raw() for anything else.
  Json version = c.raw("GET", "/version");
  CHECK(version["gitVersion"].get<std::string>().find("v1.20") == 0);
}

TEST_CASE("watch delivers add, update, delete in order; stop() ends it promptly") {
  TestNamespace ns("kube-watch");
  Client& c = admin();
  std::string rv;
  c.list_all(resources::configmaps, ns.name, {}, &rv);
  std::vector<std::pair<WatchEvent::Type, std::string>> seen;
  std::mutex mu;
  WatchEnd end = WatchEnd::ServerClosed;
  std::exception_ptr err;
  std::thread t([&] {
    try {
      WatchOptions wo;
      wo.resource_version = rv;
      wo.timeout_seconds = 60;
      end = c.watch(resources::configmaps, ns.name, wo, [&](const WatchEvent& ev) {
        if (ev.type == WatchEvent::Type::Bookmark || name_of(ev.object) != "w1") return true;
        std::lock_guard<std::mutex> lock(mu);
        seen.emplace_back(ev.type, ev.object["data"].value("value", ""));
        return ev.type != WatchEvent::Type::Deleted;
      });
    } catch (...) {
      err = std::current_exception();
    }
  });
  c.create(resources::configmaps, ns.name, configmap("w1", "1"));
  c.patch(resources::configmaps, ns.name, "w1", {{"data", {{"value", "2"}}}});
  c.remove(resources::configmaps, ns.name, "w1");
  t.join();
  if (err) std::rethrow_exception(err);
  CHECK(end == WatchEnd::HandlerStopped);
  REQUIRE(seen.size() == 3);
  CHECK(seen[0] == std::make_pair(WatchEvent::Type::Added, std::string("1")));
  CHECK(seen[1] == std::make_pair(WatchEvent::Type::Modified, std::string("2")));
  CHECK(seen[2].first == WatchEvent::Type::Deleted);

  // A quiet watch is interrupted by its stop token within a moment.
  auto token = std::make_shared<StopToken>();
  WatchEnd end2 = WatchEnd::ServerClosed;
  auto t0 = Clock::now();
  std::thread t2([&] {
    WatchOptions wo;
    wo.timeout_seconds = 120;
    wo.stop = token;
    end2 = c.watch(resources::configmaps, ns.name, wo, [](const WatchEvent&) { return true; });
  });
  std::this_thread::sleep_for(500ms);
  token->stop();
  t2.join();
  CHECK(end2 == WatchEnd::Stopped);
  CHECK(Clock::now() - t0 < 3s);

  // Once etcd has been compacted past it, an exact list at an old resourceVersion is HTTP 410 Gone. (The watch
  // stream's 410 ERROR event is checked after the API-server restart below.)
  c.create(resources::configmaps, ns.name, configmap("w2", "1"));
  c.patch(resources::configmaps, ns.name, "w2", {{"data", {{"value", "2"}}}});
  Json rev = etcd_post("/v3/kv/range", {{"key", "AA=="}});
  etcd_post("/v3/kv/compaction", {{"revision", rev["header"]["revision"]}, {"physical", true}});

  CHECK_THROWS_AS(
      c.raw("GET", resource_path(resources::configmaps, ns.name) + "?resourceVersionMatch=Exact&resourceVersion=" + rv),
      Gone);
}

TEST_CASE("subresources: pods/binding, pods/status, update_status") {
  TestNamespace ns("kube-sub");
  Client& c = admin();
  const std::string node = "kube-e2e-node-" + random_suffix();
  c.create(resources::nodes, "", {{"metadata", {{"name", node}}}});
  struct NodeCleanup {
    std::string name;
    ~NodeCleanup() {
      try {
        admin().remove(resources::nodes, "", name);
      } catch (const std::exception&) {
      }
    }
  } cleanup{node};
  Json pod = {
      {"metadata", {{"name", "p"}}},
      {"spec",
       {{"schedulerName", "kube-e2e-none"}, {"containers", Json::array({{{"name", "c"}, {"image", "busybox"}}})}}}};
  c.create(resources::pods, ns.name, pod);
  Json binding = {{"apiVersion", "v1"},
                  {"kind", "Binding"},
                  {"metadata", {{"name", "p"}}},
                  {"target", {{"apiVersion", "v1"}, {"kind", "Node"}, {"name", node}}}};
  c.create_subresource(resources::pods, ns.name, "p", "binding", binding);
  CHECK(c.get(resources::pods, ns.name, "p")["spec"]["nodeName"] == node);
  CHECK_THROWS_AS(c.create_subresource(resources::pods, ns.name, "p", "binding", binding), Conflict);  // bound once

  Json st = c.patch(resources::pods, ns.name, "p", {{"status", {{"phase", "Running"}, {"podIP", "127.0.9.9"}}}},
                    PatchType::Merge, "status");
  CHECK(st["status"]["phase"] == "Running");
  Json got = c.get(resources::pods, ns.name, "p");
  got["status"]["phase"] = "Succeeded";
  got["spec"]["activeDeadlineSeconds"] = 5;  // ignored by the status endpoint
  Json after = c.update_status(resources::pods, ns.name, got);
  CHECK(after["status"]["phase"] == "Succeeded");
  CHECK_FALSE(after["spec"].contains("activeDeadlineSeconds"));

  DeleteOptions now;
  now.grace_period_seconds = 0;
  c.remove(resources::pods, ns.name, "p", now);
  CHECK(eventually([&] { return !c.try_get(resources::pods, ns.name, "p").has_value(); }, 5s));
}

TEST_CASE("1,000 ConfigMaps listed through pagination") {
  TestNamespace ns("kube-page");
  Client& c = admin();
  std::atomic<int> next{0};
  std::vector<std::thread> ts;
  std::exception_ptr err;
  std::mutex err_mu;
  for (int w = 0; w < 4; ++w) {
    ts.emplace_back([&] {
      for (int i = next++; i < 1000; i = next++) {
        try {
          c.create(resources::configmaps, ns.name, configmap("page-" + std::to_string(i), std::to_string(i), "page"));
        } catch (...) {
          std::lock_guard<std::mutex> lock(err_mu);
          err = std::current_exception();
        }
      }
    });
  }
  for (auto& t : ts) t.join();
  if (err) std::rethrow_exception(err);

  ListOptions lo;
  lo.label_selector = "test=page";
  lo.limit = 100;
  std::set<std::string> names;
  int pages = 0;
  size_t total = 0;
  while (true) {
    Json l = c.list(resources::configmaps, ns.name, lo);
    ++pages;
    CHECK(l["items"].size() <= 100);
    for (const auto& it : l["items"]) {
      names.insert(name_of(it));
      ++total;
    }
    std::string cont = l["metadata"].value("continue", "");
    if (cont.empty()) break;
    lo.continue_token = cont;
  }
  CHECK(pages >= 10);
  CHECK(total == 1000);
  CHECK(names.size() == 1000);

  ListOptions all;
  all.label_selector = "test=page";
  all.limit = 100;
  std::string rv;
  auto items = c.list_all(resources::configmaps, ns.name, all, &rv);
  std::set<std::string> names2;
  for (const auto& it : items) names2.insert(name_of(it));
  CHECK(items.size() == 1000);
  CHECK(names2 == names);
  CHECK_FALSE(rv.empty());
}

TEST_CASE("credentials and transport failures give clear, bounded errors") {
  SUBCASE("wrong token: Unauthorized") {
    Config cfg = admin_config();
    cfg.token = "not-a-valid-token";
    Client c(cfg);
    try {
      c.list(resources::namespaces, "");
      FAIL("a wrong token was accepted");
    } catch (const Unauthorized& e) {
      CHECK(e.code() == 401);
      CHECK(std::string(e.what()).find("credentials") != std::string::npos);
    }
  }
  SUBCASE("unreachable server: TransportError after bounded retries") {
    Config cfg = admin_config();
    int port = closed_port();
    cfg.server = "https://127.0.0.1:" + std::to_string(port);
    Client c(cfg);
    auto t0 = Clock::now();
    try {
      c.get(resources::namespaces, "", "default");
      FAIL("a closed port answered");
    } catch (const TransportError& e) {
      std::string what = e.what();
      INFO(what);
      CHECK(what.find(cfg.server) != std::string::npos);
      CHECK(what.find("5 attempt") != std::string::npos);
    }
    auto took = Clock::now() - t0;
    CHECK(took > 1s);   // it did back off
    CHECK(took < 35s);  // and it did not hang
  }
  SUBCASE("a CA that did not sign the server certificate: TLS verification error") {
    char tmpl[] = "/tmp/kube-e2e-ca-XXXXXX";
    std::string dir = mkdtemp(tmpl);
    std::string cmd = "openssl req -x509 -newkey rsa:2048 -nodes -subj /CN=wrong-ca -days 1 -keyout " + dir +
                      "/ca.key -out " + dir + "/ca.crt >/dev/null 2>&1";
    REQUIRE(std::system(cmd.c_str()) == 0);
    Config real = admin_config();
    std::string kc =
        "apiVersion: v1\nkind: Config\ncurrent-context: c\nclusters:\n- name: k\n  cluster:\n    server: " +
        real.server +
        "\n    certificate-authority: ca.crt\ncontexts:\n- name: c\n  context:\n    cluster: k\n"
        "    user: u\nusers:\n- name: u\n  user:\n    token: " +
        real.token + "\n";
    std::ofstream(dir + "/kubeconfig") << kc;
    Client c(load_kubeconfig(dir + "/kubeconfig"));
    auto t0 = Clock::now();
    try {
      c.list(resources::namespaces, "");
      FAIL("TLS verification passed with the wrong CA");
    } catch (const TransportError& e) {
      std::string what = e.what();
      INFO(what);
      CHECK(what.find("TLS verification failed") != std::string::npos);
      CHECK(what.find(real.server) != std::string::npos);
    }
    CHECK(Clock::now() - t0 < 5s);  // not retried
    fs::remove_all(dir);
  }
}

TEST_CASE("a service account without RBAC is Forbidden, for requests and for watches") {
  TestNamespace ns("kube-rbac");
  Client& c = admin();
  c.create(resources::serviceaccounts, ns.name, {{"metadata", {{"name", "nobody"}}}});
  // The controller manager's token controller writes the account's token secret.
  std::string token;
  REQUIRE(eventually(
      [&] {
        for (const auto& sec : c.list_all(resources::secrets, ns.name)) {
          if (sec.value("type", "") == "kubernetes.io/service-account-token" &&
              sec["metadata"]["annotations"].value("kubernetes.io/service-account.name", "") == "nobody" &&
              sec.contains("data") && sec["data"].contains("token")) {
            token = base64_decode(sec["data"]["token"].get<std::string>());
            return true;
          }
        }
        return false;
      },
      30s));
  Config cfg = admin_config();
  cfg.token = token;
  Client sa(cfg);
  try {
    sa.list(resources::namespaces, "");
    FAIL("an account without RBAC could list namespaces");
  } catch (const Forbidden& e) {
    CHECK(e.code() == 403);
    CHECK(std::string(e.what()).find("system:serviceaccount:" + ns.name + ":nobody") != std::string::npos);
  }
  WatchOptions wo;
  wo.timeout_seconds = 5;
  CHECK_THROWS_AS(sa.watch(resources::configmaps, ns.name, wo, [](const WatchEvent&) { return true; }), Forbidden);
}

TEST_CASE("events are recorded and repeats aggregated") {
  TestNamespace ns("kube-events");
  Client& c = admin();
  Json cm = c.create(resources::configmaps, ns.name, configmap("subject", "1"));
  cm["apiVersion"] = "v1";
  cm["kind"] = "ConfigMap";
  EventRecorderOptions ro;
  ro.component = "kube-e2e";
  EventRecorder rec(c, ro);
  Json e1 = rec.warning(cm, "Failing", "something broke");
  REQUIRE_FALSE(e1.is_null());
  Json e2 = rec.warning(cm, "Failing", "something broke");
  Json e3 = rec.normal(cm, "Recovered", "all good");
  CHECK(name_of(e1) == name_of(e2));
  CHECK(e2["count"] == 2);
  CHECK(name_of(e3) != name_of(e1));
  Json stored = c.get(resources::events, ns.name, name_of(e1));
  CHECK(stored["count"] == 2);
  CHECK(stored["type"] == "Warning");
  CHECK(stored["involvedObject"]["uid"] == cm["metadata"]["uid"]);
  CHECK(stored["involvedObject"]["kind"] == "ConfigMap");
  CHECK(stored["source"]["component"] == "kube-e2e");
}

TEST_CASE("leader election hands over when the holder stops") {
  TestNamespace ns("kube-lease");
  Client& c = admin();
  LeaderElectorOptions base;
  base.lease_namespace = ns.name;
  base.lease_name = "railyard-test";
  base.lease_duration = 3000ms;
  base.renew_deadline = 2000ms;
  base.retry_period = 250ms;

  LeaderElectorOptions oa = base, ob = base, oc = base;
  oa.identity = "a";
  ob.identity = "b";
  ob.release_on_stop = false;  // b "crashes": c must wait for the lease to expire
  oc.identity = "c";
  std::atomic<int> a_started{0}, a_stopped{0}, b_started{0};  // declared first: outlive the electors' threads
  LeaderElector a(c, oa), b(c, ob), cc(c, oc);
  a.on_started_leading([&] { ++a_started; });
  a.on_stopped_leading([&] { ++a_stopped; });
  b.on_started_leading([&] { ++b_started; });

  a.start();
  REQUIRE(eventually([&] { return a.is_leader(); }, 5s));
  b.start();
  std::this_thread::sleep_for(1500ms);
  CHECK_FALSE(b.is_leader());  // a keeps renewing
  CHECK(b.observed_leader() == "a");
  Json lease = c.get(resources::leases, ns.name, "railyard-test");
  CHECK(lease["spec"]["holderIdentity"] == "a");
  CHECK(lease["spec"]["renewTime"].get<std::string>().size() == 27);  // microseconds

  auto t0 = Clock::now();
  a.stop();  // releases the lease
  CHECK(a_stopped.load() == 1);
  REQUIRE(eventually([&] { return b.is_leader(); }, 3000ms));  // within one lease duration
  MESSAGE("handover after release took " << std::chrono::duration<double>(Clock::now() - t0).count() << " s");
  // is_leader() turns true just before the elector's thread runs the callback, as in client-go: wait for it.
  CHECK(eventually([&] { return b_started.load() == 1; }, 2000ms));
  CHECK(a_started.load() == 1);

  cc.start();
  std::this_thread::sleep_for(500ms);
  CHECK_FALSE(cc.is_leader());
  t0 = Clock::now();
  b.stop();  // no release
  REQUIRE(eventually([&] { return cc.is_leader(); }, 8000ms));
  auto took = Clock::now() - t0;
  MESSAGE("handover after expiry took " << std::chrono::duration<double>(took).count() << " s");
  CHECK(took >= 2000ms);  // not before the lease could have expired
  CHECK(took <= 3000ms + 2 * base.retry_period + 1000ms);
  lease = c.get(resources::leases, ns.name, "railyard-test");
  CHECK(lease["spec"]["holderIdentity"] == "c");
  CHECK(lease["spec"]["leaseTransitions"].get<int>() >= 2);
  cc.stop();
}

TEST_CASE("a leader whose API connection stalls steps down before a standby takes over; never two leaders") {
  TestNamespace ns("kube-lease-stall");
  LeaderElectorOptions base;
  base.lease_namespace = ns.name;
  base.lease_name = "railyard-stall";
  base.lease_duration = 3000ms;
  base.renew_deadline = 2000ms;
  base.retry_period = 250ms;
  // The leader reaches the API server through a forwarder that will stop delivering, with a request timeout longer
  // than its renew deadline: only the elector's own deadline can end its leadership in time.
  const Config real = admin_config();
  const std::string port = real.server.substr(real.server.rfind(':') + 1);
  railyard::test::RecordingProxy path(std::stoi(port));
  Config via = real;
  via.server = "https://127.0.0.1:" + std::to_string(path.port());
  via.retry.max_attempts = 1;
  via.request_timeout = 4s;
  Client stalled_client(via);
  LeaderElectorOptions oa = base, ob = base;
  oa.identity = "a";
  ob.identity = "b";
  // The log outlives the electors: their threads call back into it until they are destroyed (a failed REQUIRE below
  // unwinds this scope while they still run).
  std::mutex mu;
  std::vector<std::pair<std::string, Clock::time_point>> log;  // who started or stopped leading, when
  LeaderElector a(stalled_client, oa), b(admin(), ob);
  auto note = [&](const char* what) {
    std::lock_guard<std::mutex> l(mu);
    log.emplace_back(what, Clock::now());
  };
  a.on_started_leading([&] { note("a+"); });
  a.on_stopped_leading([&] { note("a-"); });
  b.on_started_leading([&] { note("b+"); });
  a.start();
  REQUIRE(eventually([&] { return a.is_leader(); }, 5s));
  b.start();
  std::this_thread::sleep_for(1000ms);
  REQUIRE_FALSE(b.is_leader());

  const auto t_stall = Clock::now();
  path.stall(true);
  REQUIRE(eventually([&] { return b.is_leader(); }, 8s));
  // The started-leading callback runs just after is_leader() turns true.
  REQUIRE(eventually(
      [&] {
        std::lock_guard<std::mutex> l(mu);
        return log.size() >= 3;
      },
      2s));
  {
    std::lock_guard<std::mutex> l(mu);
    std::string order;
    for (const auto& [what, at] : log) order += what;
    CHECK(order == "a+a-b+");  // a stopped before b started: never two leaders
    REQUIRE(log.size() == 3);
    const auto a_stop = log[1].second;
    // a stepped down within its renew deadline (plus one retry period) of the stall, while its renew still hung.
    CHECK(a_stop - t_stall <= base.renew_deadline + base.retry_period + 300ms);
    MESSAGE("a stepped down " << std::chrono::duration<double>(a_stop - t_stall).count() << " s after the stall; b led "
                              << std::chrono::duration<double>(log[2].second - a_stop).count() << " s later");
  }
  CHECK_FALSE(a.is_leader());
  path.stall(false);
  b.stop();
  a.stop();
}

TEST_CASE("informer survives an API-server restart and relists after 410 without loss or duplicates") {
  TestNamespace ns("kube-informer");
  Client& c = admin();
  for (int i = 0; i < 10; ++i) c.create(resources::configmaps, ns.name, configmap("inf-" + std::to_string(i), "v0"));

  std::mutex mu;
  std::map<std::string, int> adds, deletes;
  std::map<std::string, std::vector<std::string>> values;  // every value each handler saw, in order
  Config cfg = admin_config();
  cfg.retry.max_attempts = 3;
  Client ic(cfg);
  InformerOptions io;
  io.ns = ns.name;
  io.label_selector = "test=kube-e2e";
  io.page_size = 4;  // exercise pagination in the informer's list too
  io.max_backoff = 1000ms;
  Informer inf(ic, resources::configmaps, io);
  inf.on_add([&](const Json& o) {
    std::lock_guard<std::mutex> lock(mu);
    ++adds[name_of(o)];
    values[name_of(o)].push_back(o["data"].value("value", ""));
  });
  inf.on_update([&](const Json& old_obj, const Json& o) {
    std::lock_guard<std::mutex> lock(mu);
    CHECK(resource_version_of(old_obj) != resource_version_of(o));
    values[name_of(o)].push_back(o["data"].value("value", ""));
  });
  inf.on_delete([&](const Json& o) {
    std::lock_guard<std::mutex> lock(mu);
    ++deletes[name_of(o)];
  });
  inf.start();
  REQUIRE(inf.wait_for_sync(10s));
  CHECK(inf.list().size() == 10);
  CHECK(inf.relists() == 1);

  // A change seen through the watch.
  c.patch(resources::configmaps, ns.name, "inf-1", {{"data", {{"value", "v1"}}}});
  REQUIRE(eventually([&] { return inf.get(ns.name + "/inf-1").value()["data"]["value"] == "v1"; }, 5s));
  // Objects handed out are copies.
  Json copy = *inf.get(ns.name + "/inf-1");
  copy["data"]["value"] = "mutated";
  CHECK(inf.get(ns.name + "/inf-1").value()["data"]["value"] == "v1");

  // Restart the API server. While it is down, delete inf-2 directly in etcd: no watch can report that, only
  // the relist after 410 Gone can.
  const std::string rv_before_restart = inf.last_resource_version();
  auto ce = cluster_env();
  int api_port = std::stoi(ce.at("APISERVER_PORT"));
  // The old process must be gone, not just its port closed: while it drains it still forwards etcd's changes
  // to open watches.
  std::string old_pid;
  std::ifstream(env("RAILYARD_E2E_STATE_DIR") + "/pids/kube-apiserver.pid") >> old_pid;
  REQUIRE_FALSE(old_pid.empty());
  auto old_alive = [&] {
    std::ifstream st("/proc/" + old_pid + "/stat");
    std::string pid, comm, state;
    return static_cast<bool>(st >> pid >> comm >> state) && state != "Z";
  };
  std::atomic<bool> deleted_while_down{false};
  std::thread watcher([&] {
    auto deadline = Clock::now() + 90s;
    while (Clock::now() < deadline && (old_alive() || port_open(api_port))) std::this_thread::sleep_for(10ms);
    if (Clock::now() >= deadline) return;
    etcd_post("/v3/kv/deleterange", {{"key", b64("/registry/configmaps/" + ns.name + "/inf-2")}});
    deleted_while_down = true;
  });
  std::string cmd = "bash " + env("RAILYARD_SOURCE_DIR") + "/deploy/local/cluster.sh restart-apiserver --state-dir " +
                    env("RAILYARD_E2E_STATE_DIR");
  int rc = std::system(cmd.c_str());
  watcher.join();
  REQUIRE_MESSAGE(rc == 0, "cluster.sh restart-apiserver failed (exit status " << rc << "); see its output above");
  REQUIRE_MESSAGE(deleted_while_down.load(),
                  "never saw the old API server (pid " << old_pid << ") gone with the port closed within 90 s");

  // The restarted server's watch cache starts after every old resourceVersion: a watch from one is Gone.
  Client& a = admin();
  WatchOptions old;
  old.resource_version = rv_before_restart;
  old.timeout_seconds = 10;
  CHECK_THROWS_AS(a.watch(resources::configmaps, ns.name, old, [](const WatchEvent&) { return true; }), Gone);

  // More changes right after the restart: create, update, delete.
  a.create(resources::configmaps, ns.name, configmap("inf-new", "n0"));
  a.patch(resources::configmaps, ns.name, "inf-3", {{"data", {{"value", "v3"}}}});
  a.remove(resources::configmaps, ns.name, "inf-4");

  auto expected_names = [&] {
    ListOptions lo;
    lo.label_selector = "test=kube-e2e";
    std::set<std::string> s;
    for (const auto& it : a.list_all(resources::configmaps, ns.name, lo)) s.insert(key_of(it));
    return s;
  };
  std::set<std::string> expected = expected_names();
  CHECK(expected.size() == 9);  // 10 - inf-2 - inf-4 + inf-new
  bool converged = eventually(
      [&] {
        auto k = inf.keys();
        return std::set<std::string>(k.begin(), k.end()) == expected &&
               inf.get(ns.name + "/inf-3").value()["data"]["value"] == "v3";
      },
      30s);
  CHECK(converged);
  CHECK(inf.relists() >= 2);  // the old resourceVersion was Gone after the restart

  std::lock_guard<std::mutex> lock(mu);
  for (int i = 0; i < 10; ++i) CHECK(adds["inf-" + std::to_string(i)] == 1);  // no duplicate adds
  CHECK(adds["inf-new"] == 1);
  CHECK(deletes["inf-2"] == 1);  // the synthetic delete from the relist
  CHECK(deletes["inf-4"] == 1);
  CHECK(deletes.size() == 2);
  CHECK(values["inf-1"] == std::vector<std::string>{"v0", "v1"});  // no repeated update
  CHECK(values["inf-3"] == std::vector<std::string>{"v0", "v3"});

  auto t0 = Clock::now();
  inf.stop();
  CHECK(Clock::now() - t0 < 3s);
}
