#include "common/tls/job_identity.h"

#include <openssl/err.h>
#include <openssl/x509v3.h>

#include <cstdlib>
#include <ctime>

#include "common/error.h"

namespace railyard::tls {
namespace {

constexpr std::chrono::hours kJobCaValidity{24 * 365 * 10};
constexpr std::chrono::hours kLeafValidity{24 * 365};

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

// Certificate and key of the leaf, and the one trust anchor; TLS 1.3 only.
SslCtxPtr base_context(const SSL_METHOD* method, const PodIdentity& id) {
  SslCtxPtr ctx(SSL_CTX_new(method));
  if (!ctx) throw Error("cannot create a TLS context: " + openssl_error());
  SSL_CTX_set_min_proto_version(ctx.get(), TLS1_3_VERSION);
  X509Ptr cert = read_cert(id.leaf.cert_pem, kPeerCertEnv);
  PkeyPtr key = read_key(id.leaf.key_pem, kPeerKeyEnv);
  if (SSL_CTX_use_certificate(ctx.get(), cert.get()) != 1 || SSL_CTX_use_PrivateKey(ctx.get(), key.get()) != 1 ||
      SSL_CTX_check_private_key(ctx.get()) != 1)
    throw ConfigError(std::string(kPeerCertEnv) + " does not match " + kPeerKeyEnv + " (" + openssl_error() + ")");
  SSL_CTX_set_cert_store(ctx.get(), new_store(id.ca_pem, kPeerCaEnv));  // the context owns it
  return ctx;
}

}  // namespace

CertKey make_job_ca(const std::string& ns, const std::string& name) {
  return make_ca("railyard-job/" + ns + "/" + name, kJobCaValidity);
}

void check_job_ca(const CertKey& ca, const std::string& where_cert, const std::string& where_key) {
  X509Ptr cert = read_cert(ca.cert_pem, where_cert);
  PkeyPtr key = read_key(ca.key_pem, where_key);
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    ERR_clear_error();
    throw ConfigError(where_key + " is not the key of " + where_cert);
  }
  if (X509_check_ca(cert.get()) == 0) throw ConfigError(where_cert + " is not a CA certificate");
}

bool usable_job_ca(const CertKey& ca) {
  try {
    check_job_ca(ca, "job CA", "job CA key");
    time_t until = std::time(nullptr) + 24 * 3600;
    return X509_cmp_time(X509_get0_notAfter(read_cert(ca.cert_pem, "job CA").get()), &until) > 0;
  } catch (const ConfigError&) {
    return false;
  }
}

PodIdentity issue_pod_identity(const CertKey& job_ca, const std::vector<std::string>& names) {
  return {job_ca.cert_pem, issue_peer_cert(job_ca, names, kLeafValidity)};
}

void check_pod_identity(const PodIdentity& id, const std::string& where_ca, const std::string& where_cert,
                        const std::string& where_key) {
  read_cert(id.ca_pem, where_ca);
  read_cert(id.leaf.cert_pem, where_cert);
  read_key(id.leaf.key_pem, where_key);
  if (!usable(id.leaf, id.ca_pem, std::chrono::hours(0)))
    throw ConfigError(where_cert + " is not signed by " + where_ca + ", does not match " + where_key +
                      ", or has expired");
}

std::shared_ptr<const PodIdentity> pod_identity_from_env() {
  auto id = std::make_shared<PodIdentity>(PodIdentity{env(kPeerCaEnv), {env(kPeerCertEnv), env(kPeerKeyEnv)}});
  const int set = !id->ca_pem.empty() + !id->leaf.cert_pem.empty() + !id->leaf.key_pem.empty();
  if (set == 0) return nullptr;
  if (set != 3)
    throw ConfigError(std::string(kPeerCaEnv) + ", " + kPeerCertEnv + " and " + kPeerKeyEnv +
                      " go together (the agent sets all three): only some are set");
  check_pod_identity(*id, kPeerCaEnv, kPeerCertEnv, kPeerKeyEnv);
  return id;
}

X509_STORE* new_store(const std::string& ca_pem, const std::string& where) {
  X509Ptr ca = read_cert(ca_pem, where);
  X509_STORE* store = X509_STORE_new();
  if (store == nullptr || X509_STORE_add_cert(store, ca.get()) != 1) {
    X509_STORE_free(store);
    throw Error("cannot build a certificate store for " + where + ": " + openssl_error());
  }
  return store;
}

SslCtxPtr server_context(const PodIdentity& id) {
  SslCtxPtr ctx = base_context(TLS_server_method(), id);
  SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  return ctx;
}

SslCtxPtr client_context(const PodIdentity& id) {
  SslCtxPtr ctx = base_context(TLS_client_method(), id);
  SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER, nullptr);  // no host name set: the chain to the job CA decides
  return ctx;
}

}  // namespace railyard::tls
