// A small certificate authority for Railyard's own TLS endpoints (the rendezvous service): make a CA, issue a
// server certificate under it, and read PEM back into OpenSSL objects. EC P-256 keys, SHA-256 signatures.
#pragma once

#include <openssl/evp.h>
#include <openssl/x509.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace railyard::tls {

struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct PkeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using X509Ptr = std::unique_ptr<X509, X509Free>;
using PkeyPtr = std::unique_ptr<EVP_PKEY, PkeyFree>;

// A certificate and its private key, both PEM.
struct CertKey {
  std::string cert_pem;
  std::string key_pem;
};

// A self-signed CA (basicConstraints CA:TRUE, pathlen 0, keyCertSign) valid from an hour ago for `validity`.
CertKey make_ca(const std::string& common_name, std::chrono::hours validity);

// A server certificate signed by `ca` for `names` (each a DNS name or an IPv4/IPv6 address, placed in
// subjectAltName accordingly; the first is also the CN), extendedKeyUsage serverAuth. Throws ConfigError when
// `names` is empty or `ca` cannot be read.
CertKey issue_server_cert(const CertKey& ca, const std::vector<std::string>& names, std::chrono::hours validity);

// The same, with extendedKeyUsage serverAuth and clientAuth: a job's pod identity (common/tls/job_identity.h), which
// serves and dials with one certificate.
CertKey issue_peer_cert(const CertKey& ca, const std::vector<std::string>& names, std::chrono::hours validity);

// PEM -> OpenSSL objects; `where` names the source in the ConfigError thrown for anything unreadable.
X509Ptr read_cert(const std::string& pem, const std::string& where);
PkeyPtr read_key(const std::string& pem, const std::string& where);

// True when `cert_pem` was signed by `ca_pem`'s key and `key_pem` is its key, and it stays valid for at least
// `margin` more: what a loaded certificate must satisfy before it is served.
bool usable(const CertKey& leaf, const std::string& ca_pem, std::chrono::hours margin);

// The most recent OpenSSL error as text (and clears the queue).
std::string openssl_error();

}  // namespace railyard::tls
