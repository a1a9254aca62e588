// Kubeconfig parsing and configuration discovery (no server).
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "common/kube/client.h"
#include "tests/unit/kube/kube_test_util.h"

namespace fs = std::filesystem;
using namespace railyard::kube;

namespace {

const char* kCa = "-----BEGIN CERTIFICATE-----\nMIIBfakeCA\n-----END CERTIFICATE-----\n";
const char* kCert = "-----BEGIN CERTIFICATE-----\nMIIBfakeCLIENT\n-----END CERTIFICATE-----\n";
const char* kKey = "-----BEGIN PRIVATE KEY-----\nMIIBfakeKEY\n-----END PRIVATE KEY-----\n";

using railyard::kube::testing::b64;

struct TempDir {
  fs::path path;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "kube-config-test-XXXXXX").string();
    path = mkdtemp(tmpl.data());
  }
  ~TempDir() { fs::remove_all(path); }
  std::string write(const std::string& name, const std::string& text) const {
    fs::create_directories((path / name).parent_path());
    std::ofstream(path / name) << text;
    return (path / name).string();
  }
};

std::string kubeconfig(const std::string& cluster_extra, const std::string& user_body,
                       const std::string& current = "main") {
  return "apiVersion: v1\nkind: Config\ncurrent-context: " + current +
         "\n"
         "clusters:\n- name: local\n  cluster:\n    server: https://127.0.0.1:6443\n" +
         cluster_extra +
         "contexts:\n- name: main\n  context:\n    cluster: local\n    user: admin\n    namespace: team-a\n"
         "- name: other\n  context:\n    cluster: local\n    user: admin\n"
         "users:\n- name: admin\n  user:\n" +
         user_body;
}

void require_error(const std::function<void()>& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    FAIL("expected a ConfigError");
  } catch (const railyard::ConfigError& e) {
    std::string what = e.what();
    for (const auto& p : parts) {
      INFO("message: " << what);
      CHECK(what.find(p) != std::string::npos);
    }
  }
}

}  // namespace

TEST_CASE("kubeconfig with file paths relative to its directory and a token") {
  TempDir d;
  d.write("pki/ca.crt", kCa);
  std::string p = d.write("kc/config", kubeconfig("    certificate-authority: ../pki/ca.crt\n", "    token: abc123\n"));
  Config c = load_kubeconfig(p);
  CHECK(c.server == "https://127.0.0.1:6443");
  CHECK(c.ca_pem == kCa);
  CHECK(c.token == "abc123");
  CHECK(c.client_cert_pem.empty());
  CHECK(c.default_namespace == "team-a");
  CHECK(c.source.find(p) != std::string::npos);

  Config other = load_kubeconfig(p, "other");
  CHECK(other.default_namespace == "default");
}

TEST_CASE("kubeconfig with inline base64 data and a client certificate") {
  TempDir d;
  std::string p = d.write("config", kubeconfig("    certificate-authority-data: " + b64(kCa) + "\n",
                                               "    client-certificate-data: " + b64(kCert) +
                                                   "\n    client-key-data: " + b64(kKey) + "\n"));
  Config c = load_kubeconfig(p);
  CHECK(c.ca_pem == kCa);
  CHECK(c.client_cert_pem == kCert);
  CHECK(c.client_key_pem == kKey);
  CHECK(c.token.empty());
}

TEST_CASE("kubeconfig client certificate from files, token from tokenFile") {
  TempDir d;
  d.write("ca.crt", kCa);
  d.write("user.crt", kCert);
  d.write("user.key", kKey);
  d.write("token", "tok-from-file\n");
  std::string p = d.write("config", kubeconfig("    certificate-authority: ca.crt\n",
                                               "    client-certificate: user.crt\n    client-key: user.key\n"
                                               "    tokenFile: token\n"));
  Config c = load_kubeconfig(p);
  CHECK(c.client_cert_pem == kCert);
  CHECK(c.client_key_pem == kKey);
  CHECK(c.token == "tok-from-file");  // trailing newline trimmed
  CHECK(c.token_file == (d.path / "token").string());
}

TEST_CASE("kubeconfig errors name the file and the field") {
  TempDir d;
  d.write("ca.crt", kCa);
  std::string missing_ca = d.write("no-ca", kubeconfig("", "    token: x\n"));
  require_error([&] { load_kubeconfig(missing_ca); }, {missing_ca, "clusters[0].cluster", "certificate-authority"});

  std::string no_cred = d.write("no-cred", kubeconfig("    certificate-authority: ca.crt\n", "    username: bob\n"));
  require_error([&] { load_kubeconfig(no_cred); }, {no_cred, "users[0].user: no token or client certificate"});

  std::string bad_yaml = d.write("bad-yaml", "clusters: [\n  - name: x\n  foo: : :\n");
  require_error([&] { load_kubeconfig(bad_yaml); }, {"kubeconfig " + bad_yaml, "malformed YAML"});

  std::string good = d.write("good", kubeconfig("    certificate-authority: ca.crt\n", "    token: x\n"));
  require_error([&] { load_kubeconfig(good, "nope"); }, {good, "no context named 'nope'"});

  std::string no_current =
      d.write("no-current", kubeconfig("    certificate-authority: ca.crt\n", "    token: x\n", "''"));
  require_error([&] { load_kubeconfig(no_current); }, {"current-context"});

  std::string missing_file =
      d.write("missing-file", kubeconfig("    certificate-authority: nowhere.crt\n", "    token: x\n"));
  require_error([&] { load_kubeconfig(missing_file); }, {"certificate-authority", "nowhere.crt"});

  std::string skip = d.write("skip", kubeconfig("    insecure-skip-tls-verify: true\n", "    token: x\n"));
  require_error([&] { load_kubeconfig(skip); }, {"insecure-skip-tls-verify"});

  std::string bad_b64 = d.write("bad-b64", kubeconfig("    certificate-authority-data: '!!!'\n", "    token: x\n"));
  require_error([&] { load_kubeconfig(bad_b64); }, {"certificate-authority-data", "base64"});

  std::string not_pem =
      d.write("not-pem", kubeconfig("    certificate-authority-data: " + b64("hello") + "\n", "    token: x\n"));
  require_error([&] { load_kubeconfig(not_pem); }, {"certificate-authority-data", "PEM"});

  std::string http = d.write("http",
                             "current-context: c\nclusters:\n- name: k\n  cluster:\n    server: http://x:1\n"
                             "contexts:\n- name: c\n  context:\n    cluster: k\n    user: u\n"
                             "users:\n- name: u\n  user:\n    token: t\n");
  require_error([&] { load_kubeconfig(http); }, {"clusters[0].cluster.server", "https"});

  require_error([&] { load_kubeconfig((d.path / "does-not-exist").string()); }, {"does-not-exist"});
}

TEST_CASE("default_config prefers $KUBECONFIG and lists what it tried") {
  TempDir d;
  d.write("ca.crt", kCa);
  std::string p = d.write("config", kubeconfig("    certificate-authority: ca.crt\n", "    token: from-env\n"));
  const char* old_kc = std::getenv("KUBECONFIG");
  const char* old_home = std::getenv("HOME");
  std::string saved_kc = old_kc ? old_kc : "", saved_home = old_home ? old_home : "";

  setenv("KUBECONFIG", p.c_str(), 1);
  CHECK(default_config().token == "from-env");

  unsetenv("KUBECONFIG");
  setenv("HOME", d.path.c_str(), 1);  // no .kube/config there
  unsetenv("KUBERNETES_SERVICE_HOST");
  require_error([] { default_config(); }, {"$KUBECONFIG", ".kube/config", "KUBERNETES_SERVICE_HOST"});

  if (!saved_kc.empty()) setenv("KUBECONFIG", saved_kc.c_str(), 1);
  if (!saved_home.empty()) setenv("HOME", saved_home.c_str(), 1);
}

TEST_CASE("Client refuses a config without a CA or with a non-PEM CA") {
  Config c;
  c.server = "https://127.0.0.1:1";
  c.token = "x";
  c.source = "test config";
  require_error([&] { Client client(c); }, {"certificate", "always verified"});
  c.ca_pem = "not a cert";
  require_error([&] { Client client(c); }, {"test config", "PEM"});
  c.ca_pem = kCa;
  c.server = "http://127.0.0.1:1";
  require_error([&] { Client client(c); }, {"https"});
}
