// Where the rendezvous certificate comes from: the names it carries and a mounted cert-manager Secret (files mode).
// The CA Secret of auto mode is exercised against the real API server by e2e_operator_tiny.
#include "operator/controller/serving_tls.h"

#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>

#include "common/atomic_file.h"
#include "common/error.h"

using namespace railyard::op;
namespace tls = railyard::tls;
namespace fs = std::filesystem;

namespace {

struct Dir {
  fs::path path = fs::temp_directory_path() / ("serving-tls-" + std::to_string(getpid()));
  Dir() { fs::create_directories(path); }
  ~Dir() { fs::remove_all(path); }
  void put(const std::string& name, const std::string& text) const { railyard::write_file_atomic(path / name, text); }
};

}  // namespace

TEST_CASE("the certificate names the host pods dial first, skips wildcards and duplicates") {
  CHECK(certificate_names("railyard-rendezvous.railyard-system.svc", "0.0.0.0", {"10.0.0.5"}) ==
        std::vector<std::string>{"railyard-rendezvous.railyard-system.svc", "10.0.0.5"});
  CHECK(certificate_names("127.0.0.1", "127.0.0.1", {"127.0.0.1", "a.b"}) ==
        std::vector<std::string>{"127.0.0.1", "a.b"});
  CHECK(certificate_names("", "::", {}).empty());
  CHECK(rendezvous_tls_mode_from_string("auto") == RendezvousTlsMode::kAuto);
  CHECK(rendezvous_tls_mode_from_string("files") == RendezvousTlsMode::kFiles);
  CHECK(rendezvous_tls_mode_from_string("off") == RendezvousTlsMode::kOff);
  CHECK_FALSE(rendezvous_tls_mode_from_string("on"));
}

TEST_CASE("files mode reads a cert-manager Secret's layout and refuses a certificate its CA did not sign") {
  const tls::CertKey ca = tls::make_ca("ca", std::chrono::hours(72));
  const tls::CertKey leaf = tls::issue_server_cert(ca, {"rdzv.svc"}, std::chrono::hours(72));
  Dir d;
  try {
    serving_tls_from_dir(d.path.string());
    FAIL("read an empty directory");
  } catch (const railyard::ConfigError& e) {
    CHECK(std::string(e.what()).find("tls.crt") != std::string::npos);  // names the missing file
  }
  d.put("tls.crt", leaf.cert_pem);
  d.put("tls.key", leaf.key_pem);
  d.put("ca.crt", ca.cert_pem);
  ServingTls t = serving_tls_from_dir(d.path.string());
  CHECK(t.ca_pem == ca.cert_pem);
  CHECK(t.serving.cert_pem == leaf.cert_pem);
  d.put("ca.crt", tls::make_ca("ca", std::chrono::hours(72)).cert_pem);  // another CA
  CHECK_THROWS_AS(serving_tls_from_dir(d.path.string()), railyard::ConfigError);
  d.put("ca.crt", ca.cert_pem);
  d.put("tls.key", "garbage");
  try {
    serving_tls_from_dir(d.path.string());
    FAIL("read a key that is not PEM");
  } catch (const railyard::ConfigError& e) {
    CHECK(std::string(e.what()).find("tls.key") != std::string::npos);
  }
}
