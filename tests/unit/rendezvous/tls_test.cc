// The rendezvous service over TLS (--rendezvous-tls): a certificate from Railyard's own CA (common/tls), served by
// RendezvousService and verified by the agent's RendezvousClient against exactly that CA and the dialled host.
#include <doctest/doctest.h>
#include <httplib.h>
#include <openssl/bio.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <memory>

#include "common/error.h"
#include "common/tls/ca_file.h"
#include "common/tls/pki.h"
#include "operator/rendezvous/rendezvous.h"
#include "worker/agent/rendezvous_client.h"

namespace tls = railyard::tls;
namespace rdzv = railyard::rdzv;
using railyard::op::GenerationSpec;
using railyard::op::RendezvousOptions;
using railyard::op::RendezvousService;
using railyard::worker::RendezvousClient;
using railyard::worker::RendezvousClientOptions;
using railyard::worker::RendezvousTlsError;
using Outcome = RendezvousClient::Outcome;

namespace {

const std::string kToken = "tls-token-bbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

struct Pki {
  tls::CertKey ca = tls::make_ca("test-ca", std::chrono::hours(48));
  tls::CertKey other_ca = tls::make_ca("test-ca", std::chrono::hours(48));  // same name, another key
  tls::CertKey serving = tls::issue_server_cert(ca, {"127.0.0.1", "rendezvous.test.svc"}, std::chrono::hours(48));
};

const Pki& pki() {
  static const Pki p;
  return p;
}

std::unique_ptr<RendezvousService> tls_service() {
  RendezvousOptions o;
  o.serving = pki().serving;
  auto svc = std::make_unique<RendezvousService>("127.0.0.1", 0, o);
  GenerationSpec g;
  g.job_key = "ns1/job1";
  g.generation = 1;
  g.pods = {"p0"};
  g.token = kToken;
  svc->open_generation(g);
  return svc;
}

RendezvousClient client(int port, const std::string& ca_pem, const std::string& host = "127.0.0.1") {
  RendezvousClientOptions o;
  o.max_attempts = 2;
  o.backoff_initial = std::chrono::milliseconds(20);
  o.ca_pem = ca_pem;
  return RendezvousClient(host + ":" + std::to_string(port), kToken, o);
}

rdzv::JoinRequest join_p0() {
  rdzv::JoinRequest r;
  r.ref = {"ns1", "job1", "p0"};
  r.local_procs = 1;
  r.pod_ip = "127.0.0.1";
  r.agent_id = "agent-p0";
  r.wait_ms = 1000;
  return r;
}

}  // namespace

TEST_CASE("the issued certificate chains to its CA and names exactly what it was issued for") {
  const Pki& p = pki();
  CHECK(tls::usable(p.serving, p.ca.cert_pem, std::chrono::hours(24)));
  CHECK_FALSE(tls::usable(p.serving, p.other_ca.cert_pem, std::chrono::hours(24)));  // another CA's key
  CHECK_FALSE(tls::usable(p.serving, p.ca.cert_pem, std::chrono::hours(24 * 3)));    // expires within 3 days
  CHECK_FALSE(tls::usable({p.serving.cert_pem, p.ca.key_pem}, p.ca.cert_pem, std::chrono::hours(1)));  // wrong key
  tls::X509Ptr leaf = tls::read_cert(p.serving.cert_pem, "leaf");
  CHECK(X509_check_ip_asc(leaf.get(), "127.0.0.1", 0) == 1);
  CHECK(X509_check_host(leaf.get(), "rendezvous.test.svc", 0, 0, nullptr) == 1);
  CHECK(X509_check_host(leaf.get(), "localhost", 0, 0, nullptr) == 0);
  CHECK(X509_check_ip_asc(leaf.get(), "127.0.0.2", 0) == 0);
  CHECK(X509_check_ca(leaf.get()) == 0);  // a leaf cannot sign
  tls::X509Ptr ca = tls::read_cert(p.ca.cert_pem, "ca");
  CHECK(X509_check_ca(ca.get()) != 0);
  CHECK_THROWS_AS(tls::issue_server_cert(p.ca, {}, std::chrono::hours(1)), railyard::ConfigError);
  CHECK_THROWS_AS(tls::issue_server_cert(p.ca, {"a,b"}, std::chrono::hours(1)), railyard::ConfigError);
}

TEST_CASE("a CA bundle that is not PEM is refused, naming where it came from") {
  try {
    tls::CaFile f("not a certificate", "RAILYARD_RENDEZVOUS_CA");
    FAIL("accepted a bundle that is not PEM");
  } catch (const railyard::ConfigError& e) {
    CHECK(std::string(e.what()).find("RAILYARD_RENDEZVOUS_CA") != std::string::npos);
  }
  tls::CaFile f(pki().ca.cert_pem, "ca");
  CHECK(railyard::read_file(f.path()) == pki().ca.cert_pem);  // httplib reads it back by path
}

TEST_CASE("an agent with the CA joins over TLS") {
  auto svc = tls_service();
  CHECK(svc->tls());
  auto c = client(svc->port(), pki().ca.cert_pem);
  CHECK(c.tls());
  auto r = c.join(join_p0());
  REQUIRE(r.outcome == Outcome::Ready);
  CHECK(r.assignment.world_size == 1);
}

TEST_CASE("a client without the CA, with another CA, or dialling a name the certificate lacks is refused") {
  auto svc = tls_service();
  // Another CA (same subject name, different key): the handshake fails before any request is sent.
  CHECK_THROWS_AS(client(svc->port(), pki().other_ca.cert_pem).join(join_p0()), RendezvousTlsError);
  // The right CA, but "localhost" is not among the certificate's names.
  try {
    client(svc->port(), pki().ca.cert_pem, "localhost").join(join_p0());
    FAIL("joined through a name the certificate does not carry");
  } catch (const RendezvousTlsError& e) {
    CHECK(std::string(e.what()).find("does not name localhost") != std::string::npos);
    CHECK(std::string(e.what()).find(kToken) == std::string::npos);
  }
  // An HTTPS client trusting only the system roots (no CA given): refused as well.
  httplib::SSLClient sys("127.0.0.1", svc->port());
  sys.enable_server_certificate_verification(true);
  auto res = sys.Post("/v1/status", {{"Authorization", "Bearer " + kToken}}, "{}", "application/json");
  CHECK_FALSE(res);
  CHECK(res.error() == httplib::Error::SSLServerVerification);
  // Plain HTTP to the TLS port: no answer at all (the bytes are not a TLS ClientHello).
  httplib::Client plain("127.0.0.1", svc->port());
  plain.set_read_timeout(std::chrono::seconds(2));
  auto p = plain.Post("/v1/status", {{"Authorization", "Bearer " + kToken}}, "{}", "application/json");
  CHECK_FALSE((p && p->status == 200));
  // The agent that trusts no CA speaks plain HTTP, which the TLS service never answers: unavailable, not joined.
  CHECK_THROWS_AS(client(svc->port(), "").join(join_p0()), railyard::worker::RendezvousUnavailable);
}

TEST_CASE("a server certificate that does not match its key is a clear error, not a silent plain-HTTP server") {
  RendezvousOptions o;
  o.serving = {pki().serving.cert_pem, pki().ca.key_pem};
  try {
    RendezvousService svc("127.0.0.1", 0, o);
    FAIL("served a certificate with someone else's key");
  } catch (const railyard::ConfigError& e) {
    CHECK(std::string(e.what()).find("do not match") != std::string::npos);
  }
}

// A handshake offering at most `max_version` to the service on 127.0.0.1:port: whether it completed.
static bool handshake_with_at_most(int port, int max_version) {
  std::unique_ptr<SSL_CTX, decltype(&SSL_CTX_free)> ctx(SSL_CTX_new(TLS_client_method()), SSL_CTX_free);
  REQUIRE(ctx);
  SSL_CTX_set_max_proto_version(ctx.get(), max_version);
  SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_NONE, nullptr);  // the version is under test, not the chain
  BIO* bio = BIO_new_connect(("127.0.0.1:" + std::to_string(port)).c_str());
  REQUIRE(bio != nullptr);
  if (BIO_do_connect(bio) != 1) {
    BIO_free_all(bio);
    FAIL("cannot connect to the service");
  }
  SSL* ssl = SSL_new(ctx.get());
  SSL_set_bio(ssl, bio, bio);
  const bool ok = SSL_connect(ssl) == 1;
  SSL_free(ssl);
  return ok;
}

TEST_CASE("the service speaks TLS 1.3 only: a client that offers at most TLS 1.2 is refused at the handshake") {
  auto svc = tls_service();
  CHECK(handshake_with_at_most(svc->port(), TLS1_3_VERSION));
  CHECK_FALSE(handshake_with_at_most(svc->port(), TLS1_2_VERSION));
}
